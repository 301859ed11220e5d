/* tctx.h — context helpers shared by the tests that compare logits across
 * batch shapes (test_forward, test_quant): a small context, and feeding one
 * row a block of tokens with logits at every position. */
#ifndef TD_TCTX_H
#define TD_TCTX_H
#include "tandem.h"
#include <stdio.h>
#include <string.h>

/* A context of `rows` rows x 64 positions, 64 tokens and logits per forward. */
static inline td_ctx *tc_open_ctx(const td_model *m, int rows, int threads) {
    td_ctx_params p = td_ctx_default_params();
    p.max_rows = rows; p.max_ctx = 64; p.max_tokens = 64; p.max_logits = 64; p.n_threads = threads;
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
#endif
