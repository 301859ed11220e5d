/* accept — see accept.h. Random draws: the target's own sample at output
 * position i uses u(seed, i) exactly as plain decoding does; the rejection rule's
 * accept test and residual draw use the same position with the seed salted, so
 * they are reproducible and independent of batch composition. */
#include "spec/accept.h"

#include <stdint.h>

#define SALT_ACCEPT 0xa0761d6478bd642full
#define SALT_RESID 0xe7037ed1a0b428dbull

int td_accept_match(td_accept_io *io) {
    int m = 0;
    for (int j = 0; j <= io->k; j++) {
        int n = io->n_hist + j;
        const int32_t *h = io->hist;
        int32_t t = td_sampler_sample(io->smp, io->sp, io->logits + (size_t)j * io->n_vocab, h, n, io->pos0 + (uint64_t)j);
        if (t < 0) return t;
        io->out[j] = t;
        io->hist[io->n_hist + j] = t;
        m = j;
        if (j == io->k || t != io->drafts[j]) break;
    }
    return m;
}

int td_accept_rejection(td_accept_io *io) {
    int V = io->n_vocab;
    for (int j = 0; j <= io->k; j++) {
        int n = io->n_hist + j;
        const int32_t *h = io->hist;
        const float *lg = io->logits + (size_t)j * V;
        uint64_t pos = io->pos0 + (uint64_t)j;
        if (j == io->k) { /* every draft accepted: the bonus token is a plain sample */
            int32_t t = td_sampler_sample(io->smp, io->sp, lg, h, n, pos);
            if (t < 0) return t;
            io->out[j] = io->hist[io->n_hist + j] = t;
            return j;
        }
        int32_t t = td_sampler_sample_probs(io->smp, io->sp, lg, h, n, pos, io->p);
        if (t < 0) return t;
        int32_t d = io->drafts[j];
        const float *q = io->q ? io->q + (size_t)j * V : NULL;
        double qd = q ? q[d] : 1.0, pd = io->p[d];
        double u = td_rng_uniform(io->sp->seed ^ SALT_ACCEPT, pos);
        if (qd > 0 && u * qd < pd) { /* accept with probability min(1, p/q) */
            io->out[j] = io->hist[io->n_hist + j] = d;
            continue;
        }
        /* residual: max(0, p - q), renormalised, drawn in id order */
        double total = 0;
        for (int v = 0; v < V; v++) {
            double r = (double)io->p[v] - (q ? (double)q[v] : (v == d ? 1.0 : 0.0));
            total += r > 0 ? r : 0;
        }
        int32_t pick = -1;
        if (total > 0) {
            double x = td_rng_uniform(io->sp->seed ^ SALT_RESID, pos) * total, acc = 0;
            int32_t last = -1;
            for (int v = 0; v < V; v++) {
                double r = (double)io->p[v] - (q ? (double)q[v] : (v == d ? 1.0 : 0.0));
                if (r <= 0) continue;
                acc += r;
                last = v;
                if (x < acc) { pick = v; break; }
            }
            if (pick < 0) pick = last;
        } else {
            pick = t; /* p == q: cannot happen after a rejection except by rounding */
        }
        io->out[j] = io->hist[io->n_hist + j] = pick;
        return j;
    }
    return io->k;
}
