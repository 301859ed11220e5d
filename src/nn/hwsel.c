/* hwsel — an online choice among equal-bits schedules by measured time
 * (hwsel.h). Small on purpose: a moving average per arm, counters, and the
 * rule in hwsel.h. */
#include "nn/hwsel.h"

#define HWSEL_ALPHA 0.125 /* weight of a new sample in its arm's average */
#define HWSEL_CLIP 1.25   /* a sample counts as at most this times its arm's average */
#define HWSEL_FAR_TURNS 4 /* a far arm runs one of this many of its turns */
#define HWSEL_MARGIN 0.98 /* the fastest arm replaces the chosen one when under this times its time */

void td_hwsel_init(td_hwsel *s, int arms, int dflt) {
    arms = arms < 1 ? 1 : arms > TD_HWSEL_ARMS ? TD_HWSEL_ARMS : arms;
    dflt %= arms;
    *s = (td_hwsel){.arms = arms, .best = dflt < 0 ? dflt + arms : dflt};
    s->turn = s->best;
}

static int seeded(const td_hwsel *s) {
    for (int a = 0; a < s->arms; a++)
        if (s->n[a] < TD_HWSEL_SEED) return 0;
    return 1;
}

int td_hwsel_chosen(const td_hwsel *s) { return seeded(s) ? s->best : -1; }

int td_hwsel_pick(td_hwsel *s) {
    if (!seeded(s)) { /* the arm with the fewest samples, the first from best on */
        int pick = s->best;
        for (int i = 1; i < s->arms; i++) {
            int a = (s->best + i) % s->arms;
            if (s->n[a] < s->n[pick]) pick = a;
        }
        return pick;
    }
    if (++s->picks % TD_HWSEL_EXPLORE) return s->best;
    for (int i = 0; i < s->arms; i++) {
        int a = s->turn = (s->turn + 1) % s->arms;
        if (a == s->best) continue;
        if (s->avg[a] > TD_HWSEL_FAR * s->avg[s->best] && ++s->skip[a] % HWSEL_FAR_TURNS) continue;
        return a;
    }
    return s->best;
}

void td_hwsel_record(td_hwsel *s, int v, double t) {
    if (v < 0 || v >= s->arms || !(t > 0)) return; /* also refuses NaN */
    if (s->n[v] == 0) s->avg[v] = t;
    else s->avg[v] += HWSEL_ALPHA * ((t > HWSEL_CLIP * s->avg[v] ? HWSEL_CLIP * s->avg[v] : t) - s->avg[v]);
    if (s->n[v] < 1 << 20) s->n[v]++;
    if (!seeded(s)) return;
    int b = s->best; /* another arm takes over only when it is faster by HWSEL_MARGIN */
    for (int a = 0; a < s->arms; a++)
        if (s->avg[a] < s->avg[b]) b = a;
    if (s->avg[b] < HWSEL_MARGIN * s->avg[s->best]) s->best = b;
}
