/* tctx.h — context helpers shared by the tests that compare logits across
 * batch shapes (test_forward, test_quant): a small context, feeding one row a
 * block of tokens with logits at every position, and the batch-invariance
 * check both run. */
#ifndef TD_TCTX_H
#define TD_TCTX_H
#include "tandem.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* td_ctx_params.act_type of the contexts tc_open_ctx opens (a test sets it
 * around the runs of another activation type). */
static int tc_act = TD_DTYPE_F32;

/* A context of `rows` rows x 64 positions, 64 tokens and logits per forward,
 * its KV cache stored as kv (TD_DTYPE_F32, BF16 or F16), activations tc_act. */
static inline td_ctx *tc_open_ctx(const td_model *m, int rows, int threads, int kv) {
    td_ctx_params p = td_ctx_default_params();
    p.max_rows = rows; p.max_ctx = 64; p.max_tokens = 64; p.max_logits = 64; p.n_threads = threads; p.kv_type = kv;
    p.act_type = tc_act;
    td_ctx *c = NULL;
    td_err err = {0};
    if (td_ctx_open(&c, m, &p, &err) != 0) printf("  ctx: %s\n", err.msg);
    return c;
}

/* Feed n (<= 64) tokens to row as one block; logits of every position into out. */
static inline int tc_feed(td_ctx *c, int row, const int32_t *toks, int n, float *out) {
    uint8_t want[64];
    memset(want, 1, sizeof want);
    td_batch b = {.n_rows = 1, .rows = &row, .n_tokens = &n, .tokens = toks, .want = want};
    td_err err = {0};
    int rc = td_ctx_forward(c, &b, out, NULL, &err);
    if (rc) printf("  forward: %s\n", err.msg);
    return rc;
}

/* Batch invariance of m's logits (vocabulary V): after a 5-token prefill of
 * seq[0..4], the 7 positions seq[5..11] computed as T=1 steps (one thread),
 * as one T=7 block, and inside a ragged batch of 5 rows (two threads; the
 * other rows have other histories and lengths) must be memcmp-equal.
 * ref [7][V] receives the T=1 logits. kv: the contexts' KV type. Returns NULL
 * when all agree, else what failed (a static string). */
static inline const char *tc_invariance(const td_model *m, int V, const int32_t seq[12], float *ref, int kv) {
    const char *bad = NULL;
    float *blk = malloc(sizeof(float) * 64 * (size_t)V), *bat = malloc(sizeof(float) * 64 * (size_t)V);
    td_ctx *c1 = tc_open_ctx(m, 1, 1, kv), *c5 = tc_open_ctx(m, 5, 2, kv);
    int r, rows[5], ntok[5] = {3, 7, 1, 9, 2};
    uint64_t st = 0x9e3779b97f4a7c15ull ^ (uint64_t)seq[0];
    if (!blk || !bat || !c1 || !c5) { bad = "no memory or context"; goto out; }
    td_ctx_row_add(c1, &r);
    if (tc_feed(c1, r, seq, 5, ref)) { bad = "prefill"; goto out; }
    for (int i = 5; i < 12; i++)
        if (tc_feed(c1, r, seq + i, 1, ref + (size_t)(i - 5) * V)) { bad = "T=1 step"; goto out; }
    if (td_ctx_row_trim(c1, r, 5) || tc_feed(c1, r, seq + 5, 7, blk)) { bad = "T=7 block"; goto out; }
    if (memcmp(ref, blk, sizeof(float) * 7 * (size_t)V)) { bad = "T=1 and T=7 logits differ"; goto out; }
    /* row 1 continues seq; the others get random histories of other lengths */
    for (int i = 0; i < 5; i++) {
        int32_t hist[16];
        for (int k = 0; k < 16; k++) { st = st * 6364136223846793005ull + 1442695040888963407ull; hist[k] = (int32_t)((st >> 33) % (uint64_t)V); }
        td_ctx_row_add(c5, &rows[i]);
        if (tc_feed(c5, rows[i], i == 1 ? seq : hist, i == 1 ? 5 : 2 + 3 * i, bat)) { bad = "batch prefill"; goto out; }
    }
    int32_t toks[32];
    uint8_t want[32];
    int t = 0, out_of_row1 = 0, nout = 0;
    for (int i = 0; i < 5; i++)
        for (int k = 0; k < ntok[i]; k++) {
            st = st * 6364136223846793005ull + 1442695040888963407ull;
            toks[t] = i == 1 ? seq[5 + k] : (int32_t)((st >> 33) % (uint64_t)V);
            want[t] = (uint8_t)(i == 1 || k == ntok[i] - 1);
            if (i == 1 && k == 0) out_of_row1 = nout;
            nout += want[t];
            t++;
        }
    td_batch b = {.n_rows = 5, .rows = rows, .n_tokens = ntok, .tokens = toks, .want = want};
    td_err err = {0};
    if (td_ctx_forward(c5, &b, bat, NULL, &err)) { printf("  batch forward: %s\n", err.msg); bad = "batch forward"; goto out; }
    if (memcmp(ref, bat + (size_t)out_of_row1 * V, sizeof(float) * 7 * (size_t)V)) { bad = "ragged B=5 logits differ from T=1"; goto out; }
    for (int i = 0; i < 5; i++)
        if (td_ctx_row_len(c5, rows[i]) != (i == 1 ? 12 : 2 + 3 * i + ntok[i])) { bad = "a batch row has the wrong length"; goto out; }
out:
    free(blk); free(bat);
    td_ctx_free(c1); td_ctx_free(c5);
    return bad;
}
#endif
