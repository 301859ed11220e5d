/* sample — the token sampler and the counter-based RNG (public API in tandem.h:
 * td_sampling, td_sampling_default, td_rng_uniform, td_sampler_*).
 *
 * Exactness (shared/design/exactness.md): a draw is a pure function of
 * (logits, history, sampling params, pos). Nothing is carried between calls;
 * the sampler object is scratch memory only (allocated once in td_sampler_open,
 * no allocation per call). One td_sampler must not be used by two threads at once.
 *
 * The pipeline, in this order:
 *  0. Validate: s, p, logits (and probs for _probs) non-NULL; n_history >= 0,
 *     history non-NULL when n_history > 0, every counted token in [0, n_vocab);
 *     temperature not NaN; top_k >= 0; top_p in (0,1]; min_p in [0,1];
 *     repeat_penalty finite and > 0; presence/frequency finite; penalty_last_n >= 0.
 *     Bad input returns TD_EINVAL. NaN logits count as -inf; if every logit is
 *     -inf/NaN (after penalties) the call returns TD_EINVAL.
 *  1. Penalties over the window = the last penalty_last_n history tokens (all if 0).
 *     For each DISTINCT token t in the window, with c = its count there:
 *       z = logit[t];  if repeat_penalty != 1: z = z > 0 ? z / rp : z * rp;
 *       z = z - (c * frequency_penalty + presence_penalty)      (float arithmetic)
 *  2. temperature <= 0 (negative included): greedy, argmax of z, ties to the lowest
 *     id; probs is one-hot. pos/seed are not used.
 *  3. Otherwise weights w_i = td_sampler_expf((z_i - zmax) / T) in float (max
 *     subtracted, so the top weight is exactly 1; 0 when the exponent is <= -86).
 *     If some z is +inf, the +inf tokens get w = 1 and all others 0.
 *  4. Truncation. Order tokens by w descending, ties by id ascending ("rank order").
 *     Every truncation keeps a prefix of that order:
 *       top-k: the first k (k = 0 or k >= n_vocab: off);
 *       top-p: (top_p < 1) the shortest prefix of the top-k set whose mass (double)
 *              is >= top_p * mass(top-k set); at least one token;
 *       min-p: (min_p > 0) tokens with w >= min_p * wmax (wmax = 1).
 *     The kept set is the shortest of the three prefixes. Found without a full sort:
 *     a 16-bit histogram of the float bits of w locates the boundary bucket, only that
 *     bucket is ordered (stable radix sort on the low bits, so ties stay by id).
 *     Prefix masses are sums of per-bucket masses (each summed in id order) taken
 *     from the top bucket down, plus the ordered members of the boundary bucket.
 *  5. Draw: u = td_rng_uniform(seed, pos). Walk the kept tokens in id ascending
 *     order (the fixed order, always, whether or not anything was truncated),
 *     accumulating w in double; the token is the first whose running sum exceeds
 *     u * total, total = sum of kept w in the same order. probs[i] = w_i / total for
 *     kept tokens, 0 elsewhere: exactly the distribution the draw uses (rounded to
 *     float). A kept token of weight 0 has probability 0 and is never drawn.
 *
 * td_rng_uniform(seed, pos): k = mix(seed ^ C1); x = mix(pos * golden + k);
 * x = mix(x ^ rot32(k)); u = (x >> 11) * 2^-53, with mix the SplitMix64 finalizer.
 * A bijection of pos for each seed; a pure function.
 *
 * td_sampling_default(): T 0.8, top_k 40, top_p 0.95, min_p 0.05, penalties off
 * (repeat 1, presence 0, frequency 0), penalty_last_n 64, seed 0.
 */
#ifndef TD_SAMPLE_SAMPLER_H
#define TD_SAMPLE_SAMPLER_H

#include "tandem.h"
#include <stdint.h>

/* Check sampling parameters; 0 or TD_EINVAL with a message in err (may be NULL). */
int td_sampling_check(const td_sampling *p, td_err *err);

/* The exp the sampler uses for weights, for x <= 0 (vectorised inside; this scalar
 * entry gives bit-identical results): ~1-2 ulp, exactly 1 at 0, never above 1,
 * 0 for x <= -86 or NaN. */
float td_sampler_expf(float x);

/* Draw from non-negative weights w[0..n) with a uniform u in [0,1) by the same rule
 * the sampler uses (walk in id order, double running sum, first to exceed u*total).
 * Usable for rejection-sampling residuals. Negative weights/NaN count as 0.
 * Returns the index, or TD_EINVAL (NULL, n <= 0, or no positive weight). */
int32_t td_draw_weights(const float *w, int n, double u);

#endif
