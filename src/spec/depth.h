/* depth — per-row choice of the draft depth that maximises expected tokens/s.
 *
 * Model: a row keeps a running estimate a_j of P(draft j accepted | drafts
 * 1..j-1 accepted) (exponential moving average over rounds that reached j).
 * A round at depth k emits E(k) = 1 + sum_{j<=k} prod_{i<=j} a_i tokens and
 * costs verify(k+1) + k * draft_per_token, where verify(T) is the target
 * forward time of T new tokens measured when the group opened and the draft
 * cost is measured as rounds run. The controller picks the k maximising
 * E(k)/cost(k); k = 0 is plain decoding. A row at depth 0 probes depth 1 every
 * TD_DEPTH_PROBE rounds so that a drafter that starts paying is noticed. */
#ifndef TD_DEPTH_H
#define TD_DEPTH_H

#include "tandem.h"

#define TD_DEPTH_PROBE 16

typedef struct td_depth_ctl {
    double a[TD_SPEC_MAX_DEPTH];  /* acceptance estimate by position */
    int since_probe;              /* rounds at depth 0 since the last probe */
} td_depth_ctl;

void td_depth_init(td_depth_ctl *c, double prior);
/* verify_s[T] for T = 1..max_depth+1 (index 0 unused); draft_s: seconds per draft token. */
int td_depth_choose(td_depth_ctl *c, const double *verify_s, double draft_s, int max_depth);
/* After a round: n_drafted proposals were verified, the first n_accepted accepted. */
void td_depth_update(td_depth_ctl *c, int n_drafted, int n_accepted);

#endif
