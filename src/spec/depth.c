/* depth — see depth.h. */
#include "spec/depth.h"

#define EMA 0.15

void td_depth_init(td_depth_ctl *c, double prior) {
    for (int j = 0; j < TD_SPEC_MAX_DEPTH; j++) c->a[j] = prior;
    c->since_probe = 0;
}

int td_depth_choose(td_depth_ctl *c, const double *verify_s, double draft_s, int max_depth) {
    if (max_depth <= 0) return 0;
    double best_rate = 1.0 / verify_s[1], reach = 1.0, expect = 1.0;
    int best = 0;
    for (int k = 1; k <= max_depth; k++) {
        reach *= c->a[k - 1];
        expect += reach;
        double rate = expect / (verify_s[k + 1] + draft_s * k);
        if (rate > best_rate * 1.0001) { best_rate = rate; best = k; }
    }
    if (best == 0) {
        if (++c->since_probe >= TD_DEPTH_PROBE) { c->since_probe = 0; return 1; }
    } else {
        c->since_probe = 0;
    }
    return best;
}

void td_depth_update(td_depth_ctl *c, int n_drafted, int n_accepted) {
    for (int j = 0; j < n_drafted && j < TD_SPEC_MAX_DEPTH; j++) {
        double hit = j < n_accepted ? 1.0 : 0.0;
        c->a[j] += EMA * (hit - c->a[j]);
        if (j >= n_accepted) break; /* positions after the first rejection were not reached */
    }
}
