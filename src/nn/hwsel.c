/* hwsel — an online choice between two equal-bits kernel variants (hwsel.h).
 * Small on purpose: two moving averages, a counter, and the rule in hwsel.h. */
#include "nn/hwsel.h"

#define HWSEL_ALPHA 0.125 /* weight of a new sample in its variant's average */
#define HWSEL_CLIP 1.25   /* a sample counts as at most this times its variant's average */

void td_hwsel_init(td_hwsel *s, int dflt) { *s = (td_hwsel){.best = dflt != 0}; }

int td_hwsel_pick(td_hwsel *s) {
    if (s->n[0] < TD_HWSEL_SEED || s->n[1] < TD_HWSEL_SEED) /* seeding: the one with fewer samples */
        return s->n[0] == s->n[1] ? s->best : s->n[1] < s->n[0];
    unsigned period = s->avg[!s->best] > TD_HWSEL_FAR * s->avg[s->best] ? TD_HWSEL_EXPLORE_FAR : TD_HWSEL_EXPLORE;
    return ++s->picks % period == 0 ? !s->best : s->best;
}

void td_hwsel_record(td_hwsel *s, int v, double t) {
    if ((v != 0 && v != 1) || !(t > 0)) return; /* also refuses NaN */
    if (s->n[v] == 0) s->avg[v] = t;
    else s->avg[v] += HWSEL_ALPHA * ((t > HWSEL_CLIP * s->avg[v] ? HWSEL_CLIP * s->avg[v] : t) - s->avg[v]);
    if (s->n[v] < 1 << 20) s->n[v]++;
    if (s->n[0] >= TD_HWSEL_SEED && s->n[1] >= TD_HWSEL_SEED) s->best = s->avg[1] < s->avg[0];
}
