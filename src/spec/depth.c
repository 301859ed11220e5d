/* depth — see depth.h. */
#include "spec/depth.h"

#define EMA 0.15
#define DRIFT 0.05 /* per round, of an undrafted position towards the drafted ones' highest */

void td_depth_init(td_depth_ctl *c, double prior) {
    for (int j = 0; j < TD_SPEC_MAX_DEPTH; j++) c->a[j] = prior;
    c->seen = 0;
    c->since_probe = 0;
    c->probe_every = TD_DEPTH_PROBE;
}

void td_depth_init_from(td_depth_ctl *c, const td_depth_ctl *from) {
    *c = *from;
    c->since_probe = 0;
    c->probe_every = TD_DEPTH_PROBE;
}

double td_cost_at(const td_cost_curve *c, int T) {
    if (c->n == 0) return (double)T;
    if (T <= c->T[0]) return c->s[0] * T / c->T[0];
    for (int i = 1; i < c->n; i++)
        if (T <= c->T[i]) {
            double f = (double)(T - c->T[i - 1]) / (c->T[i] - c->T[i - 1]);
            return c->s[i - 1] + f * (c->s[i] - c->s[i - 1]);
        }
    /* beyond the last point: extend the last slope */
    int l = c->n - 1;
    double slope = l > 0 ? (c->s[l] - c->s[l - 1]) / (c->T[l] - c->T[l - 1]) : c->s[l] / c->T[l];
    return c->s[l] + slope * (T - c->T[l]);
}

void td_cost_curve_fit(td_cost_curve *c, const int *T, const double *s, int n) {
    c->n = n < TD_COST_POINTS ? n : TD_COST_POINTS;
    for (int p = c->n - 1; p >= 0; p--) {
        double v = s[p];
        if (p + 1 < c->n && c->s[p + 1] < v) v = c->s[p + 1]; /* more tokens never cost less */
        c->T[p] = T[p];
        c->s[p] = v;
    }
}

void td_lsq_add(td_lsq *q, double decay, double x, double y) {
    q->w = decay * q->w + 1;
    q->sx = decay * q->sx + x;
    q->sy = decay * q->sy + y;
    q->sxx = decay * q->sxx + x * x;
    q->sxy = decay * q->sxy + x * y;
}

void td_cost_model_init(td_cost_model *m) {
    m->q = (td_lsq){0};
    m->pw = TD_COST_PRIOR;
    m->a = 0;
    m->b = 1;
}

void td_cost_model_update(td_cost_model *m, td_cost_curve *cv, const td_cost_curve *base, int T, double seen,
                          double floor_s) {
    if (base->n == 0) return;
    double pred = td_cost_at(cv, T), x = td_cost_at(base, T);
    if (seen > 2 * pred) seen = 2 * pred;
    if (seen < 0.5 * pred) seen = 0.5 * pred;
    td_lsq_add(&m->q, TD_COST_DECAY, x, seen);
    m->pw *= TD_COST_DECAY;
    double half = 0.5 * base->s[0], lam = TD_COST_PRIOR * half * half;
    double vxx = m->q.sxx - m->q.sx * m->q.sx / m->q.w, cxy = m->q.sxy - m->q.sx * m->q.sy / m->q.w;
    double b = vxx + lam > 0 ? (cxy + lam) / (vxx + lam) : 1.0;
    if (!(b >= 0.5)) b = 0.5; /* also a NaN */
    if (b > 4) b = 4;
    double a = (m->q.sy - b * m->q.sx) / (m->q.w + m->pw);
    if (a + b * base->s[0] < floor_s) a = floor_s - b * base->s[0];
    m->a = a;
    m->b = b;
    cv->n = base->n;
    for (int i = 0; i < base->n; i++) {
        cv->T[i] = base->T[i];
        cv->s[i] = a + b * base->s[i];
    }
}

int td_depth_plan(td_depth_ctl *const *ctl, const int *maxk, int n, int n_other,
                  const td_cost_curve *cv, double step_s, double step_extra, const unsigned char *free_row,
                  int allow_probe, int stale_every, int *k) {
    /* the whole steps of a round's fixed part bound the broad moves' depth and
     * make a probe look for the depth that pays best (a fraction, such as an
     * MTP head's small fitted fixed part, prices rounds but does neither) */
    const int xi = step_extra < TD_SPEC_MAX_DEPTH ? (int)step_extra : TD_SPEC_MAX_DEPTH;
    double E = n + n_other;        /* tokens emitted this round */
    int T = n + n_other, kmax = 0; /* verified tokens; draft steps of the rows the drafter runs for */
    for (int i = 0; i < n; i++) k[i] = 0;
    double rate = E / td_cost_at(cv, T);
    const double E0 = E, rate0 = rate;
    const int T0 = T;
    double bgain[TD_DEPTH_BROAD_MAX]; /* broad moves: candidate rows' gains, best first */
    int bord[TD_DEPTH_BROAD_MAX], bsel[TD_DEPTH_BROAD_MAX];
    /* Each pass deepens one row by the number of positions d that raises the
     * rate most, or several rows together (broad moves, below) where that
     * raises it more. Looking d positions ahead, not one, matters when a draft's
     * fixed cost is only repaid by depth (step_extra, or verify steps).
     * A free row (proposals on offer, made without a forward) adds no step;
     * a drafting round costs its deepest row's depth plus step_extra steps. */
    for (;;) {
        int best = -1, best_d = 0;
        double best_rate = rate * 1.0001, best_gain = 0;
        for (int i = 0; i < n; i++) {
            int fr = free_row && free_row[i];
            double reach = 1.0; /* probability the row's position k[i] is reached and accepted */
            for (int j = 0; j < k[i]; j++) reach *= ctl[i]->a[j];
            double gain = 0;
            for (int d = 1; k[i] + d <= maxk[i]; d++) {
                reach *= ctl[i]->a[k[i] + d - 1];
                gain += reach;
                int deep = fr ? kmax : k[i] + d > kmax ? k[i] + d : kmax;
                double steps = deep > 0 ? deep + step_extra : 0;
                double r = (E + gain) / (td_cost_at(cv, T + d) + step_s * steps);
                if (r > best_rate) { best_rate = r; best = i; best_d = d; best_gain = gain; }
            }
        }
        /* Broad moves: the m rows whose next d positions gain most, deepened
         * together (d up to 1 + step_extra, the depth a round's fixed part asks
         * for). The drafter runs every row's step j at once, so a step that no
         * one row repays may pay for several: at batch 8 a single row's token
         * starts another register tile (T = 8 -> 9), all eight rows' together
         * fill it. m = 1 is a single move, weighed above. */
        int nb = n < TD_DEPTH_BROAD_MAX ? n : TD_DEPTH_BROAD_MAX, broad_m = 0;
        for (int d = 1; d <= 1 + xi; d++) {
            int no = 0;
            for (int i = 0; i < nb; i++) {
                if (k[i] + d > maxk[i]) continue;
                double reach = 1.0, g = 0;
                for (int j = 0; j < k[i]; j++) reach *= ctl[i]->a[j];
                for (int j = 0; j < d; j++) g += reach *= ctl[i]->a[k[i] + j];
                int at = no++; /* insertion: gain descending, row index ascending on ties */
                while (at > 0 && bgain[at - 1] < g) { bgain[at] = bgain[at - 1]; bord[at] = bord[at - 1]; at--; }
                bgain[at] = g;
                bord[at] = i;
            }
            double G = 0;
            int deep = kmax;
            for (int m = 0; m < no; m++) {
                int i = bord[m];
                G += bgain[m];
                if (!(free_row && free_row[i]) && k[i] + d > deep) deep = k[i] + d;
                if (m == 0) continue;
                double r = (E + G) / (td_cost_at(cv, T + (m + 1) * d) + step_s * (deep > 0 ? deep + step_extra : 0));
                if (r > best_rate) { best_rate = r; best = -1; broad_m = m + 1; best_d = d; best_gain = G; }
            }
            if (broad_m && best_d == d) /* keep this d's order for the move */
                for (int m = 0; m < broad_m; m++) bsel[m] = bord[m];
        }
        if (broad_m) {
            for (int m = 0; m < broad_m; m++) {
                int i = bsel[m];
                k[i] += best_d;
                if (!(free_row && free_row[i]) && k[i] > kmax) kmax = k[i];
            }
            E += best_gain;
            T += broad_m * best_d;
            rate = best_rate;
            continue;
        }
        if (best < 0) break;
        k[best] += best_d;
        if (!(free_row && free_row[best]) && k[best] > kmax) kmax = k[best];
        E += best_gain;
        T += best_d;
        rate = best_rate;
    }
    /* a plan must beat plain decoding by TD_DEPTH_MIN_GAIN, or the round is
     * plain: a drafting round has costs the prices leave out (accepting and
     * committing more tokens, a drafter's bookkeeping), and where drafting
     * breaks even on paper it lost in practice (bench/forward-notes.md,
     * "Stop 40": MTP at batch 8, paired 0.91-0.93 when it drafted) */
    if (rate < rate0 * (1.0 + TD_DEPTH_MIN_GAIN)) {
        for (int i = 0; i < n; i++) k[i] = 0;
        E = E0;
        T = T0;
        kmax = 0;
        rate = rate0;
    }
    /* probing is worth its catch-up only if a perfect draft could pay: one
     * token; where a round has a fixed part (step_extra), the depth at which
     * a perfect draft pays best, and the probe drafts that deep. A free row's
     * probe adds no step. */
    int kp = 1, kall = 0;
    for (int i = 0; i < n; i++)
        if (maxk[i] > kall) kall = maxk[i];
    double probe_rate = (E + 1) / (td_cost_at(cv, T + 1) + step_s * ((kmax > 0 ? kmax : 1) + step_extra));
    for (int d = 2; xi && d <= kall; d++) {
        double r = (E + d) / (td_cost_at(cv, T + d) + step_s * ((kmax > d ? kmax : d) + step_extra));
        if (r > probe_rate) { probe_rate = r; kp = d; }
    }
    int may_probe = probe_rate > rate;
    /* ... or if perfect drafts would pay for the n0 held rows probing together
     * (rows held alike probe in the same round: one step serves them all) */
    int n0 = 0;
    for (int i = 0; i < n; i++) n0 += k[i] == 0 && maxk[i] > 0 && !(free_row && free_row[i]);
    if (!may_probe && n0 > 1) { /* then they probe at the depth that pays best for them together */
        double jr = rate;
        for (int d = 1; d <= (xi ? kall : 1); d++) {
            double r = (E + (double)n0 * d) / (td_cost_at(cv, T + n0 * d) + step_s * ((kmax > d ? kmax : d) + step_extra));
            if (r > jr) { jr = r; kp = d; may_probe = 1; }
        }
    }
    int may_probe_free = (E + 1) / (td_cost_at(cv, T + 1) + step_s * (kmax > 0 ? kmax + step_extra : 0)) > rate;
    /* No perfect draft pays, but one would were its steps free: the step's
     * price alone holds such rows at 0, and that price is an estimate (a burst
     * of load on a shared machine inflates it, and only a drafting round can
     * bring it down), so they re-measure it every stale_every rounds: two
     * drafting rounds in a row, since the first, a catch-up over the tokens
     * the drafter missed, does not measure a step (td_draft_price_update),
     * and only the second does (the MTP head under act_type bf16: a first
     * round of 0.98 ms for 2 steps priced a step at 0.49 ms, each lone probe
     * then cost more than that as a catch-up and was not entered, and the
     * head stayed at depth 0 for the whole run). */
    int stale = !may_probe && step_s > 0 && (E + 1) / td_cost_at(cv, T + 1) > rate;
    int probes = 0;
    for (int i = 0; i < n; i++) {
        td_depth_ctl *c = ctl[i];
        int fr = free_row && free_row[i];
        if (k[i] == 0 && maxk[i] > 0 && !(fr ? may_probe_free : may_probe)) {
            if (fr || !stale) c->since_probe = 0;
            else if (c->since_probe == -1 && allow_probe) { /* a probe just ran: the round that measures */
                c->since_probe = -2;
                k[i] = kp < maxk[i] ? kp : maxk[i];
                probes++;
            } else if (c->since_probe < 0) c->since_probe = 1; /* count afresh */
            else if (++c->since_probe >= stale_every && allow_probe) {
                c->since_probe = -1;
                k[i] = kp < maxk[i] ? kp : maxk[i];
                probes++;
            }
        } else if (k[i] == 0 && maxk[i] > 0) {
            if (c->since_probe == -1 && c->probe_every < TD_DEPTH_PROBE_MAX) c->probe_every *= 2; /* the last probe did not pay */
            if (c->since_probe < 0) c->since_probe = 0;
            if (c->since_probe < c->probe_every) c->since_probe++;
            if (c->since_probe >= c->probe_every && allow_probe) {
                c->since_probe = -1;
                k[i] = fr ? 1 : kp < maxk[i] ? kp : maxk[i];
                probes++;
            }
        } else if (k[i] > 0) { /* drafting on its own again */
            c->probe_every = TD_DEPTH_PROBE;
            c->since_probe = 0;
        }
    }
    return probes;
}

void td_draft_price_init(td_draft_price *p, double hint_s) {
    *p = (td_draft_price){.s = hint_s};
}

double td_draft_price_at(const td_draft_price *p, double steps) { return steps > 0 ? p->f + p->s * steps : 0.0; }

void td_draft_price_update(td_draft_price *p, int steps, double seconds, int steady) {
    if (steps <= 0 || !(seconds > 0)) return; /* a price of 0 would stay 0: each later round is clipped to 1.5x it */
    double x = steps, y = seconds;
    double pred = td_draft_price_at(p, x);
    /* the first round sets it, as if seen in a steady state; so does a cheaper
     * round while it stands on catch-ups only (depth.h) */
    if (!p->measured || (p->provisional && y < pred)) {
        double w = 1.0 / (1.0 - TD_PRICE_DECAY);
        *p = (td_draft_price){.q = {w, w * x, w * y, w * x * x, w * x * y}, .f = 0, .s = y / x, .measured = 1,
                              .provisional = !steady};
        return;
    }
    if (!steady && !(y < pred)) return; /* a dearer catch-up: its steps' price is not in it */
    if (steady) p->provisional = 0;
    if (y > 1.5 * pred) y = 1.5 * pred;
    if (y < 0.5 * pred) y = 0.5 * pred;
    td_lsq_add(&p->q, TD_PRICE_DECAY, x, y);
    /* minimise the weighted squares + TD_PRICE_PRIOR f^2: with every round of
     * one size f = 0 and s = sy / sx; f < 0 is refitted through the origin, and
     * s stays at least a tenth of the mean price a step */
    double wl = p->q.w + TD_PRICE_PRIOR, det = wl * p->q.sxx - p->q.sx * p->q.sx;
    double f = det > 0 ? (p->q.sy * p->q.sxx - p->q.sx * p->q.sxy) / det : 0.0;
    double s = det > 0 ? (wl * p->q.sxy - p->q.sx * p->q.sy) / det : p->q.sy / p->q.sx;
    if (!(f >= 0)) { f = 0; s = p->q.sxy / p->q.sxx; }
    double smin = 0.1 * p->q.sy / p->q.sx;
    if (!(s >= smin)) {
        s = smin;
        f = (p->q.sy - s * p->q.sx) / wl;
        if (!(f >= 0)) f = 0;
    }
    p->f = f;
    p->s = s;
}

void td_depth_update(td_depth_ctl *c, int n_drafted, int n_accepted) {
    for (int j = 0; j < n_drafted && j < TD_SPEC_MAX_DEPTH; j++) {
        double hit = j < n_accepted ? 1.0 : 0.0;
        c->a[j] += EMA * (hit - c->a[j]);
        if (j + 1 > c->seen) c->seen = j + 1;
        if (j >= n_accepted) break; /* positions after the first rejection were not reached */
    }
    if (c->seen > 0)
        for (int j = c->seen; j < TD_SPEC_MAX_DEPTH; j++) c->a[j] = c->a[c->seen - 1];
    /* Positions deeper than the plan drafted learn nothing, so a low estimate
     * there would keep the plan from ever drafting them again: they drift up
     * towards the mean estimate of the positions drafted (never down — a
     * deep position that looks too good gets drafted and corrected). */
    if (n_drafted > 0 && n_drafted < TD_SPEC_MAX_DEPTH) {
        double ref = 0;
        for (int j = 0; j < n_drafted; j++)
            if (c->a[j] > ref) ref = c->a[j];
        for (int j = n_drafted; j < TD_SPEC_MAX_DEPTH; j++)
            if (c->a[j] < ref) c->a[j] += DRIFT * (ref - c->a[j]);
    }
}
