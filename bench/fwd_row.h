/* bench/fwd_row.h — what the one-row forward harnesses (ctx_forward.c,
 * mm_chunks_ab.c) share: a monotonic clock in ms, a double comparison for
 * qsort, and a context of one row that holds CTX random tokens (filled by
 * forwards of up to 512), set up for timed forwards of T new tokens that want
 * every position's logits, as a verify does, each rolled back after it.
 * Header-only (static functions); uses include/tandem.h only. */
#ifndef TD_BENCH_FWD_ROW_H
#define TD_BENCH_FWD_ROW_H

#include "tandem.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double fr_now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}
static int fr_cmpd(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

typedef struct {
    td_model *m;     /* owned */
    td_ctx *c;       /* owned */
    int row, ctx, T, n;
    int32_t *tok;    /* [ctx + T] */
    float *lg;       /* [T][n_vocab] */
    uint8_t want[512];
    td_batch b;      /* the timed forward: T tokens after the ctx filled ones */
    const char *who; /* the program's name, for messages */
} fwd_row;

static void fwd_row_close(fwd_row *f) {
    free(f->tok);
    free(f->lg);
    td_ctx_free(f->c);
    td_model_free(f->m);
    memset(f, 0, sizeof *f);
}

/* 0, or 1 after a message to stderr (f closed) */
static int fwd_row_open(fwd_row *f, const char *model, int act, int kv, int ctx, int T, const char *who) {
    memset(f, 0, sizeof *f);
    f->who = who;
    f->ctx = ctx;
    f->T = T;
    td_err err = {0};
    td_model_params mp = td_model_default_params();
    const char *mm = getenv("FWD_MMAP"); /* 1: map the weights, 0: copy them; unset: by size */
    if (mm && *mm) mp.use_mmap = atoi(mm) ? 1 : 0;
    if (td_model_open_params(&f->m, model, &mp, &err) != 0) { fprintf(stderr, "%s: %s\n", who, err.msg); return 1; }
    td_model_info mi;
    td_model_get_info(f->m, &mi);
    td_ctx_params p = td_ctx_default_params();
    p.act_type = act;
    p.kv_type = kv;
    p.max_rows = 1;
    p.max_ctx = ctx + T;
    p.max_tokens = 512;
    p.max_logits = T;
    if (td_ctx_open(&f->c, f->m, &p, &err) != 0) { fprintf(stderr, "%s: %s\n", who, err.msg); fwd_row_close(f); return 1; }
    f->tok = malloc(sizeof(int32_t) * (size_t)(ctx + T));
    f->lg = malloc(sizeof(float) * (size_t)mi.n_vocab * (size_t)T);
    f->row = -1;
    if (!f->tok || !f->lg || td_ctx_row_add(f->c, &f->row) != 0) {
        fprintf(stderr, "%s: out of memory\n", who);
        fwd_row_close(f);
        return 1;
    }
    uint64_t s = 88172645463325252ull;
    for (int i = 0; i < ctx + T; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        f->tok[i] = (int32_t)(s % (uint64_t)mi.n_vocab);
    }
    f->b = (td_batch){.n_rows = 1, .rows = &f->row, .n_tokens = &f->n, .skip_logits = 1};
    for (int done = 0; done < ctx; done += f->n) { /* fill the row, 512 positions a forward */
        f->n = ctx - done < 512 ? ctx - done : 512;
        f->b.tokens = f->tok + done;
        if (td_ctx_forward(f->c, &f->b, NULL, NULL, &err) != 0) { fprintf(stderr, "%s: %s\n", who, err.msg); fwd_row_close(f); return 1; }
    }
    for (int i = 0; i < T; i++) f->want[i] = 1;
    f->n = T;
    f->b.tokens = f->tok + ctx;
    f->b.skip_logits = 0;
    f->b.want = f->want;
    return 0;
}

/* One forward of the T tokens, its time in ms in *ms, the row trimmed back to
 * ctx; 0, or 1 after a message to stderr */
static int fwd_row_step(fwd_row *f, double *ms) {
    td_err err = {0};
    double t0 = fr_now_ms();
    if (td_ctx_forward(f->c, &f->b, f->lg, NULL, &err) != 0) { fprintf(stderr, "%s: %s\n", f->who, err.msg); return 1; }
    *ms = fr_now_ms() - t0;
    td_ctx_row_trim(f->c, f->row, f->ctx);
    return 0;
}

#endif
