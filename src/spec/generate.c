/* generate — plain (non-speculative) generation of one row: the reference that
 * speculative decoding must reproduce token for token.
 *
 * Prefill feeds the prompt in chunks of at most the context's max_tokens; each
 * decode step feeds the last sampled token and samples output position i with
 * the counter-based draw u(seed, i). Stop strings are matched by emit.c, the
 * same code the speculative group uses. Buffers are allocated once per call. */
#include "tandem.h"
#include "model/model.h"
#include "spec/emit.h"
#include "util/util.h"

#include <stdlib.h>
#include <string.h>

int td_generate(td_ctx *c, const td_model *m, const int32_t *prompt, int n_prompt,
                const td_gen_params *gp, td_text_cb cb, void *user,
                int32_t *out_ids, int cap, td_gen_stats *stats, td_err *err) {
    if (!c || !m || !prompt || !gp) return td_seterr(err, TD_EINVAL, "td_generate: NULL argument");
    if (n_prompt < 1) return td_seterr(err, TD_EINVAL, "empty prompt: at least one token is needed");
    if (gp->max_tokens < 0) return td_seterr(err, TD_EINVAL, "max_tokens %d < 0", gp->max_tokens);
    const td_config *cfg = &m->cfg;
    td_gen_stats st = {0};
    st.n_prompt = n_prompt;
    int row = -1, rc = 0;
    float *logits = NULL;
    int32_t *hist = NULL;
    td_sampler *smp = NULL;
    td_emitter em;
    td_emit_init(&em, gp->stop, gp->n_stop);
    if ((rc = td_ctx_row_add(c, &row)) != 0) return td_seterr(err, rc, "no free row in the context");
    logits = malloc(sizeof(float) * (size_t)cfg->n_vocab);
    hist = malloc(sizeof(int32_t) * ((size_t)n_prompt + (size_t)gp->max_tokens + 1));
    if (!logits || !hist || td_sampler_open(&smp, cfg->n_vocab) != 0) {
        rc = td_seterr(err, TD_ENOMEM, "out of memory");
        goto out;
    }
    memcpy(hist, prompt, sizeof(int32_t) * (size_t)n_prompt);
    int n_hist = n_prompt;

    /* prefill in chunks */
    double t0 = td_now();
    int chunk = td_ctx_get_params(c).max_tokens;
    for (int done = 0; done < n_prompt;) {
        int n = n_prompt - done < chunk ? n_prompt - done : chunk;
        td_batch b = {.n_rows = 1, .rows = &row, .n_tokens = &n, .tokens = prompt + done};
        if ((rc = td_ctx_forward(c, &b, logits, NULL, err)) != 0) goto out;
        done += n;
    }
    st.prefill_s = td_now() - t0;
    t0 = td_now();
    const td_tokenizer *tok = m->tok;
    st.stop_reason = TD_STOP_LENGTH;
    for (int i = 0; i < gp->max_tokens; i++) {
        int32_t id = td_sampler_sample(smp, &gp->sampling, logits, hist, n_hist, (uint64_t)i);
        if (id < 0) { rc = td_seterr(err, id, "sampling failed at output position %d", i); goto out; }
        int is_eos = 0;
        for (int e = 0; e < cfg->n_eos; e++) is_eos |= (id == cfg->eos_ids[e]);
        if (is_eos && !gp->ignore_eos) { st.stop_reason = TD_STOP_EOS; break; }
        hist[n_hist++] = id;
        if (out_ids && st.n_gen < cap) out_ids[st.n_gen] = id;
        st.n_gen++;
        if (tok) {
            int hit = td_emit_token(&em, tok, id);
            if (hit < 0) { rc = td_seterr(err, hit, "decoding token %d failed", (int)id); goto out; }
            if (cb && em.upto > em.sent && cb(em.buf + em.sent, em.upto - em.sent, user)) {
                em.sent = em.upto;
                st.stop_reason = TD_STOP_CALLBACK;
                break;
            }
            em.sent = em.upto;
            if (hit) { st.stop_reason = TD_STOP_STRING; break; }
        }
        if (i + 1 == gp->max_tokens) break;
        int one = 1;
        td_batch b = {.n_rows = 1, .rows = &row, .n_tokens = &one, .tokens = &id};
        if ((rc = td_ctx_forward(c, &b, logits, NULL, err)) != 0) goto out;
    }
    if (tok && st.stop_reason != TD_STOP_STRING && st.stop_reason != TD_STOP_CALLBACK) {
        td_emit_finish(&em);
        if (cb && em.len > em.sent) cb(em.buf + em.sent, em.len - em.sent, user);
    }
    st.decode_s = td_now() - t0;
out:
    if (row >= 0) td_ctx_row_remove(c, row);
    free(logits);
    free(hist);
    td_emit_free(&em);
    td_sampler_free(smp);
    if (stats) *stats = st;
    return rc;
}
