/* depth — choosing each row's draft depth so that the group emits the most
 * tokens per second.
 *
 * Model: a row keeps a running estimate a_j of P(draft j accepted | drafts
 * 1..j-1 accepted) (exponential moving average over rounds that reached j).
 * Positions deeper than a round drafted drift up (5% a round) towards the
 * highest estimate of the drafted ones, so that a low estimate left from long
 * ago does not keep the plan from ever drafting there again (the highest, not
 * the mean: a drafter's a_j tend to rise with j — MTP at fixed depth 7: 0.81,
 * 0.85, 0.89, 0.94 ... — so the mean held a shallow plan's deeper positions
 * below what they turn out to be).
 * At depth k a row emits E(k) = 1 + sum_{j<=k} prod_{i<=j} a_i tokens per
 * round. A round verifies T = sum over live rows of (1 + k_r) tokens in one
 * target forward, costing verify(T) from a curve measured when the group
 * opened (interpolated, then kept current), plus the drafter's max_r k_r
 * sequential steps (drafters run all rows' step j together) at step_s each,
 * measured as rounds run, and step_extra more where a round has a fixed part
 * (the block drafter's anchor entry: its one forward runs k + 1 entries; and
 * what td_draft_price learns a round costs whatever its steps, in steps).
 * The planner starts every row at depth 0 and repeatedly makes the move that
 * raises (sum E) / cost the most: one row deepened by d positions (looking
 * ahead, so a fixed draft cost that only depth repays is weighed), or the m
 * rows that gain most deepened together by d <= 1 + step_extra (a draft step
 * serves every row at once, so a step, or a verify tile, that no one row
 * repays may pay for several); it stops when no move helps: k = 0 everywhere
 * is plain decoding, so speculation that does not pay turns itself down. A
 * plan that promises less than TD_DEPTH_MIN_GAIN over plain decoding is not
 * taken either (a drafting round's bookkeeping is not priced).
 * A row held at depth 0 probes depth 1 (with a fixed part: the depth a
 * perfect draft would pay best at) after TD_DEPTH_PROBE rounds so that a
 * drafter that starts paying is noticed; each probe that does not bring
 * drafting back doubles the wait (a probe costs the drafter a catch-up over
 * the tokens it missed), and there is no probe at all while even a perfectly
 * accepted draft could not pay for its step — for the row alone, or for all
 * the rows held at 0 probing together (their schedules run alike), then at
 * the depth that pays best for them together; except that where only the
 * step's price stands in the way (a perfect draft would pay were its steps
 * free), the row re-measures that price every TD_DEPTH_PROBE_MAX rounds, in
 * two drafting rounds in a row (the first a catch-up, the second a steady
 * round that prices a step) —
 * nor while the caller says
 * probes have cost more than their budget (allow_probe = 0: the group keeps
 * the time spent in probe rounds, their drafting and their verify beyond a
 * plain round's, with the last probe's cost added as the next one's price,
 * under TD_PROBE_BUDGET of its verify time, so a drafter that never pays costs
 * at most that; pricing the next probe matters where one probe costs more than
 * the budget of a whole window: at batch 8 the block drafter's joint probe,
 * 8 rows 7 deep after a catch-up, took 12-16 ms against 1.3 ms plain rounds,
 * and probing whenever the spent sum had decayed under the budget gave paired
 * speedups of 0.87-0.99;
 * bench/forward-notes.md, "Stop 50"). */
#ifndef TD_DEPTH_H
#define TD_DEPTH_H

#include "tandem.h"

#define TD_DEPTH_MIN_GAIN 0.04 /* the least gain over plain decoding a plan must promise */
#define TD_DEPTH_PROBE 16
#define TD_DEPTH_PROBE_MAX 512
#define TD_DEPTH_BROAD_MAX 256 /* rows a broad move considers (the first ones of larger groups) */
#define TD_COST_POINTS 32
#define TD_PROBE_BUDGET 0.01 /* probe rounds' drafting and extra verify time / verify time, at most */
#define TD_PROBE_DECAY 0.999 /* per round, of both sums (a window of about a thousand rounds) */
#define TD_OFFER_STRONG 6    /* an offer behind a context match this long or longer is tracked apart
                                (measured on bench/prompts: copies behind an 8-token match were
                                accepted 98% of the time, behind a 1-3-token match 40-65% at the
                                first position) */

typedef struct td_depth_ctl {
    double a[TD_SPEC_MAX_DEPTH];  /* acceptance estimate by position */
    int seen;                     /* positions 0..seen-1 have been observed; a[j] for j >= seen
                                     follows a[seen-1] (the deepest estimate stands in for
                                     positions never drafted, rather than the prior) */
    int since_probe;              /* rounds at depth 0 since the last probe; -1: a probe ran
                                     last round, -2: a stale price's second probe round did */
    int probe_every;              /* rounds between probes: doubles after each probe that
                                     does not bring drafting back, up to TD_DEPTH_PROBE_MAX */
} td_depth_ctl;

/* Verify cost: seconds of one target forward of T new tokens (piecewise linear). */
typedef struct td_cost_curve {
    int n;
    int T[TD_COST_POINTS];
    double s[TD_COST_POINTS];
} td_cost_curve;

/* Decayed least-squares sums of (x, y) pairs: td_lsq_add decays the earlier
 * pairs' weight by `decay`, then adds one pair of weight 1. */
typedef struct td_lsq {
    double w, sx, sy, sxx, sxy;
} td_lsq;
void td_lsq_add(td_lsq *q, double decay, double x, double y);

/* The price of a drafting round: f + s * steps seconds (steps: the draft steps
 * it ran, td_draft_req.steps, the drafter's step_extra included), fitted by
 * least squares over the rounds (their weight decaying by TD_PRICE_DECAY),
 * with a light ridge on f towards 0 (TD_PRICE_PRIOR rounds' worth) that only
 * decides what the rounds cannot: rounds of one size leave f at 0 and s their
 * decayed mean (the single price of earlier stops), rounds of several sizes
 * teach the part of a round that does not grow with its steps (a ridge of a
 * whole round halved it for two sizes 6 steps apart). A block drafter streams its layers'
 * weights once a round whatever its depth: on an Intel Xeon (amx, 20 code
 * prompts, fixed depths) 1, 2, 4 and 7 drafts cost 0.51, 0.49, 0.60 and
 * 0.88 ms a round, about 0.42 ms + 0.065 a step, where one price a step
 * learnt from deep rounds (0.11 ms) priced a one-draft round at 0.22 ms, and
 * one learnt from shallow rounds (0.26 ms) a full block at 2.0 ms (the MTP
 * head: 0.11 and 0.43 ms, nearly a price a step). Robustness as before: the
 * first measured round sets the price (f = 0) and counts as the rounds of a
 * steady state (1 / (1 - TD_PRICE_DECAY)), so a later round moves the fit
 * about a fifth of the way; a steady round's figure is clipped to between
 * half and 1.5 times the prediction (a burst of load lasting many rounds
 * inflates the price at most 1.1x a round); a catch-up round (a row first
 * catches its drafter up on tokens it missed) costs more than its steps, so
 * it enters only when it is cheaper than the prediction (it then lowers the
 * price; setting the price to a catch-up's own figure measured no better on
 * the Zen 5 VM: 1.98-2.28x against 2.12-2.47x for MTP, three alternations).
 * A first round that was a catch-up leaves the price provisional: it may
 * carry one-off costs many times a round's (the block drafter's first round,
 * f32 activations, Zen 5: 4.4-6.5 ms against 2.4 ms steady, which priced a
 * step at 1.9 ms and held every row at depth 0 for the rest of the run), so
 * until a steady round is entered any round cheaper than the prediction
 * replaces it outright (as a first round would), and the planner re-measures
 * it after TD_DEPTH_PROBE rounds instead of TD_DEPTH_PROBE_MAX. */
#define TD_PRICE_DECAY 0.8
#define TD_PRICE_PRIOR 0.05
typedef struct td_draft_price {
    td_lsq q;                   /* the rounds' (x = steps, y = seconds) sums, decayed */
    double f, s;                /* the fit: seconds a drafting round, seconds a step */
    int measured;               /* a round has been entered (else s is a hint and f = 0) */
    int provisional;            /* measured on catch-up rounds only: an upper bound, which a
                                   cheaper round replaces and the planner re-measures soon */
} td_draft_price;
/* No rounds yet: f = 0, s = hint_s (the drafter's estimate). */
void td_draft_price_init(td_draft_price *p, double hint_s);
/* Enter a round of `steps` steps (> 0) that took `seconds` (> 0: other
 * rounds are ignored); steady: every drafting row drafted the round before
 * (else a catch-up round). */
void td_draft_price_update(td_draft_price *p, int steps, double seconds, int steady);
/* What a round of `steps` steps costs by the fit (f + s * steps; 0 steps cost 0). */
double td_draft_price_at(const td_draft_price *p, double steps);
double td_cost_at(const td_cost_curve *c, int T);
/* Set c from n measured points (T increasing, s the fastest time seen at
 * each), made nondecreasing: a point dearer than one after it takes that
 * one's cost. A forward of more tokens never costs less, so every later
 * measurement bounds an earlier one from above, and load only ever inflates a
 * measurement: the suffix minimum is the tightest curve the figures allow.
 * (Raising a cheap later point to a dear earlier one instead let one burst of
 * load during the measurement price every verify of 2 or more tokens at 4.6x
 * one token for the group's life: on the Zen 5 VM, a run at depth 0 from the
 * start, 0.97x plain.) The steps stay: a forward's cost is flat while it streams
 * weights, then grows by steps where the token count starts another register
 * tile (T = 9 after 8 costs more than T = 10 after 9), and a plan that
 * smoothed them away would take the first token past a step for cheap. */
void td_cost_curve_fit(td_cost_curve *c, const int *T, const double *s, int n);
/* What verify forwards cost now, as an affine map of the startup curve:
 * seen = a + b * base(T), fitted by least squares over the recent rounds.
 * The startup measurement runs one row, at a short context, on a machine
 * whose speed drifts; what it misses is partly a cost per forward (rows' own
 * contexts and bookkeeping: the offset a) and partly a cost per token (b: at
 * batch 8 under amx on a Xeon, 8 rows x 8 tokens took 13.5 ms where the
 * curve said 7.3, and 8 x 1 took 2.8 against 1.9). A shift alone (b = 1)
 * priced the deep rounds' tokens at half their cost there, and the planner
 * drafted 5 a row at 0.80-0.93x plain; a ratio alone (a = 0) priced a
 * verify token 1.35x dear at batch 1 on the Zen 5 VM (bench/forward-notes.md,
 * "Stop 40", "Stop 41"). */
typedef struct td_cost_model {
    td_lsq q;                   /* the rounds' (x = base(T), y = seen) sums, seconds, decayed */
    double pw;                  /* the weight of the prior a = 0 (TD_COST_PRIOR, decayed) */
    double a, b;                /* the fit: a seconds, b a factor */
} td_cost_model;
/* a = 0, b = 1, no rounds yet. */
void td_cost_model_init(td_cost_model *m);
/* Enter a forward of T tokens that took `seen` seconds (clipped to between
 * half and twice what cv predicted, so one burst of load moves the fit by a
 * bounded step), after decaying the earlier rounds' weight by TD_COST_DECAY;
 * refit, and rewrite cv as a + b * base. b: the rounds' least-squares slope
 * of seen on x, with a ridge towards 1 worth TD_COST_PRIOR rounds half a
 * one-token forward (base's first point) either side of their mean, so
 * rounds of one size leave b at 1 and move a alone (a shift), while rounds of
 * several sizes teach the price of a token (plain rounds of 8 rows and
 * rounds drafting one token a row, 0.5 ms apart on the curve, do);
 * clamped to [0.5, 4]. a: through the rounds' weighted means, with a prior
 * a = 0 of TD_COST_PRIOR rounds that decays like a round (the first rounds
 * move it part of the way). cv's first point never below floor_s. cv gives
 * the prediction, then is rewritten with base's points. */
#define TD_COST_DECAY 0.97
#define TD_COST_PRIOR 2.0
void td_cost_model_update(td_cost_model *m, td_cost_curve *cv, const td_cost_curve *base, int T, double seen,
                          double floor_s);

void td_depth_init(td_depth_ctl *c, double prior);
/* A row joining a group starts from the group's pooled estimates (`from`,
 * borrowed): its acceptance by position and what has been seen, with a fresh
 * probe schedule. */
void td_depth_init_from(td_depth_ctl *c, const td_depth_ctl *from);
/* Plan depths for n drafting rows: ctl[i] (borrowed), maxk[i] the most row i may
 * draft; n_other: tokens other live rows add to the forward (1 each). Writes
 * k[i]. step_s: seconds per draft step (one position for all rows); a round
 * whose deepest row drafts k costs k + step_extra steps (td_drafter.step_extra,
 * plus a fitted fixed part in steps: td_draft_price's f / s);
 * free_row[i] (NULL: none): row i's proposals are already made (offered, see
 * draft.h) and cost no draft step, only their verify tokens; allow_probe:
 * 0 = no row at depth 0 probes this round; stale_every: the rounds a row held
 * at 0 by the step's price alone waits before re-measuring it
 * (TD_DEPTH_PROBE_MAX; TD_DEPTH_PROBE while that price is provisional).
 * Returns the number of rows set to
 * probe (depth 1, or with step_extra the depth a perfect draft pays best at,
 * from the probe schedule, not from the plan). */
int td_depth_plan(td_depth_ctl *const *ctl, const int *maxk, int n, int n_other,
                  const td_cost_curve *cv, double step_s, double step_extra, const unsigned char *free_row,
                  int allow_probe, int stale_every, int *k);
/* After a round: n_drafted proposals were verified, the first n_accepted accepted. */
void td_depth_update(td_depth_ctl *c, int n_drafted, int n_accepted);

#endif
