/* accept — the two acceptance rules of a verified window.
 *
 * Both take the target's logits L_0..L_k for [pending, d_1..d_k] of one row and
 * return the emitted tokens t_0..t_m (m = drafts accepted), appending them to the
 * row's history as they are decided (penalties see exactly the emitted prefix).
 *   match:     t_j = sample(L_j, u(seed, pos0+j)); accept d_{j+1} while t_j == d_{j+1}.
 *              Emits what plain decoding would, at any temperature.
 *   rejection: Leviathan/Chen: accept d with probability min(1, p(d)/q(d)), else
 *              draw from the residual max(0, p-q); q is the drafter's
 *              distribution, or one-hot at d for drafters without one. Same
 *              output distribution as plain sampling, not the same stream. */
#ifndef TD_ACCEPT_H
#define TD_ACCEPT_H

#include "tandem.h"

typedef struct td_accept_io {
    td_sampler *smp;            /* borrowed scratch sampler */
    const td_sampling *sp;      /* the row's sampling */
    const float *logits;        /* [k+1][n_vocab] */
    int n_vocab;
    const int32_t *drafts;      /* [k] */
    int k;
    const float *q;             /* [k][n_vocab] drafter probabilities, or NULL (one-hot) */
    float *p;                   /* [n_vocab] scratch (rejection rule) */
    int32_t *hist;              /* history the penalties see (the sampler applies its
                                   penalty_last_n window); t_j is written at hist[n_hist + j] */
    int n_hist;
    uint64_t pos0;              /* output position of t_0 */
    int32_t *out;               /* [k+1] emitted tokens */
} td_accept_io;

/* Returns m >= 0 (t_0..t_m written to out and hist), or negative on error. */
int td_accept_match(td_accept_io *io);
int td_accept_rejection(td_accept_io *io);

#endif
