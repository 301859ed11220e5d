/* generate — plain (non-speculative) generation of one row: the reference that
 * speculative decoding must reproduce token for token.
 *
 * Prefill feeds the prompt in chunks of at most the context's max_tokens; each
 * decode step feeds the last sampled token and samples output position i with
 * the counter-based draw u(seed, i). Stop strings are matched on the emitted
 * text; text that could still become a stop string is held back from the
 * callback until it cannot. Buffers are allocated once per call. */
#include "tandem.h"
#include "model/model.h"
#include "util/util.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    char *buf;
    size_t len, cap, sent; /* bytes emitted so far, bytes already given to the callback */
} textbuf;

static int tb_append(textbuf *t, const char *s, size_t n) {
    if (t->len + n + 1 > t->cap) {
        size_t nc = t->cap ? t->cap : 4096;
        while (nc < t->len + n + 1) nc *= 2;
        char *nb = realloc(t->buf, nc);
        if (!nb) return TD_ENOMEM;
        t->buf = nb;
        t->cap = nc;
    }
    memcpy(t->buf + t->len, s, n);
    t->len += n;
    t->buf[t->len] = 0;
    return 0;
}

/* Find the first stop string in t->buf at or after `from`; returns its offset or -1. */
static long find_stop(const textbuf *t, const td_gen_params *gp, size_t from) {
    long best = -1;
    for (int i = 0; i < gp->n_stop; i++) {
        const char *s = gp->stop[i];
        size_t n = strlen(s);
        if (!n || n > t->len) continue;
        for (size_t p = from; p + n <= t->len; p++)
            if (memcmp(t->buf + p, s, n) == 0) {
                if (best < 0 || (long)p < best) best = (long)p;
                break;
            }
    }
    return best;
}

/* Bytes at the end of the buffer that are a proper prefix of some stop string. */
static size_t stop_prefix_tail(const textbuf *t, const td_gen_params *gp) {
    size_t hold = 0;
    for (int i = 0; i < gp->n_stop; i++) {
        size_t n = strlen(gp->stop[i]);
        for (size_t k = n > 1 ? n - 1 : 0; k > hold; k--)
            if (k <= t->len && memcmp(t->buf + t->len - k, gp->stop[i], k) == 0) { hold = k; break; }
    }
    return hold;
}

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
    textbuf tb = {0};
    char piece[1024];
    td_utf8_stream us = {0};
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
            int n = td_utf8_stream_push(&us, tok, id, piece, (int)sizeof piece);
            if (n > 0 && (rc = tb_append(&tb, piece, (size_t)n)) != 0) { td_seterr(err, rc, "out of memory"); goto out; }
            size_t from = tb.sent;
            long at = gp->n_stop ? find_stop(&tb, gp, from) : -1;
            size_t upto = at >= 0 ? (size_t)at : tb.len - stop_prefix_tail(&tb, gp);
            if (cb && upto > tb.sent && cb(tb.buf + tb.sent, upto - tb.sent, user)) {
                tb.sent = upto;
                st.stop_reason = TD_STOP_CALLBACK;
                break;
            }
            if (upto > tb.sent) tb.sent = upto;
            if (at >= 0) { st.stop_reason = TD_STOP_STRING; break; }
        }
        if (i + 1 == gp->max_tokens) break;
        int one = 1;
        td_batch b = {.n_rows = 1, .rows = &row, .n_tokens = &one, .tokens = &id};
        if ((rc = td_ctx_forward(c, &b, logits, NULL, err)) != 0) goto out;
    }
    if (tok && st.stop_reason != TD_STOP_STRING && st.stop_reason != TD_STOP_CALLBACK) {
        int n = td_utf8_stream_flush(&us, piece, (int)sizeof piece);
        if (n > 0) tb_append(&tb, piece, (size_t)n);
        if (cb && tb.len > tb.sent) cb(tb.buf + tb.sent, tb.len - tb.sent, user);
    }
    st.decode_s = td_now() - t0;
out:
    if (row >= 0) td_ctx_row_remove(c, row);
    free(logits);
    free(hist);
    free(tb.buf);
    td_sampler_free(smp);
    if (stats) *stats = st;
    return rc;
}
