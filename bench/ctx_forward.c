/* bench/ctx_forward.c — the time of one forward of T new tokens on a row that
 * already holds CTX positions, for a chosen KV cache type and activation type:
 * what a decode step (T = 1) or a verify (T = 8) costs at a long context, where
 * the cache's bytes (bf16 against q8_0) weigh as much as the weights'.
 * `tandem bench forward` measures at context 512 only; this is its long-context
 * complement (bench/forward-notes.md, "Stop 34", took its q8_0 figures here).
 * In one process: the row is filled with CTX tokens (forwards of up to 512),
 * then N forwards of T tokens each (logits at every position, as a verify
 * wants them), the row trimmed back to CTX after each; prints one JSON object
 * with the median and the fastest forward in ms.
 * Build and run (from the repository root, after make):
 *   cc -std=c11 -O2 -march=native -Iinclude bench/ctx_forward.c build/libtandem.a -o /tmp/ctx_forward \
 *      -lpcre2-8 -lutf8proc -lcjson -lmicrohttpd -lm -pthread
 *   /tmp/ctx_forward MODEL ACT KV CTX T N     e.g. /tmp/ctx_forward /tmp/q06-q8.gguf bf16 q8_0 4096 1 30 */
#include "tandem.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}
static int cmpd(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    if (argc != 7) {
        fprintf(stderr, "usage: ctx_forward MODEL ACT(f32|bf16|amx|auto) KV(f32|bf16|f16|q8_0) CTX T N\n");
        return 2;
    }
    int act = td_act_type_parse(argv[2]), kv = td_kv_type_parse(argv[3]);
    int ctx = atoi(argv[4]), T = atoi(argv[5]), N = atoi(argv[6]);
    if (act < 0 || kv < 0 || ctx < 1 || ctx > (1 << 20) || T < 1 || T > 512 || N < 1 || N > 100000) {
        fprintf(stderr, "ctx_forward: bad argument (ACT, KV, 1 <= CTX <= 2^20, 1 <= T <= 512, 1 <= N <= 100000)\n");
        return 2;
    }
    td_err err = {0};
    td_model *m = NULL;
    td_ctx *c = NULL;
    if (td_model_open(&m, argv[1], &err) != 0) { fprintf(stderr, "ctx_forward: %s\n", err.msg); return 1; }
    td_model_info mi;
    td_model_get_info(m, &mi);
    td_ctx_params p = td_ctx_default_params();
    p.act_type = act;
    p.kv_type = kv;
    p.max_rows = 1;
    p.max_ctx = ctx + T;
    p.max_tokens = 512;
    p.max_logits = T;
    if (td_ctx_open(&c, m, &p, &err) != 0) { fprintf(stderr, "ctx_forward: %s\n", err.msg); td_model_free(m); return 1; }
    int32_t *tok = malloc(sizeof(int32_t) * (size_t)(ctx + T));
    float *lg = malloc(sizeof(float) * (size_t)mi.n_vocab * (size_t)T);
    double *ts = malloc(sizeof(double) * (size_t)N);
    int row = -1, rc = 1;
    if (!tok || !lg || !ts || td_ctx_row_add(c, &row) != 0) { fprintf(stderr, "ctx_forward: out of memory\n"); goto out; }
    uint64_t s = 88172645463325252ull;
    for (int i = 0; i < ctx + T; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        tok[i] = (int32_t)(s % (uint64_t)mi.n_vocab);
    }
    int n;
    td_batch b = {.n_rows = 1, .rows = &row, .n_tokens = &n};
    for (int done = 0; done < ctx; done += n) { /* fill the row, 512 positions a forward */
        n = ctx - done < 512 ? ctx - done : 512;
        b.tokens = tok + done;
        b.skip_logits = 1;
        if (td_ctx_forward(c, &b, NULL, NULL, &err) != 0) { fprintf(stderr, "ctx_forward: %s\n", err.msg); goto out; }
    }
    static uint8_t want[512]; /* the timed forwards want every position's logits, as a verify does */
    for (int i = 0; i < T; i++) want[i] = 1;
    n = T;
    b.tokens = tok + ctx;
    b.skip_logits = 0;
    b.want = want;
    for (int r = 0; r < N; r++) {
        double t0 = now_ms();
        if (td_ctx_forward(c, &b, lg, NULL, &err) != 0) { fprintf(stderr, "ctx_forward: %s\n", err.msg); goto out; }
        ts[r] = now_ms() - t0;
        td_ctx_row_trim(c, row, ctx);
    }
    qsort(ts, (size_t)N, sizeof(double), cmpd);
    printf("{\"model\": \"%s\", \"act_type\": \"%s\", \"kv_type\": \"%s\", \"ctx\": %d, \"T\": %d, \"n\": %d, "
           "\"median_ms\": %.3f, \"min_ms\": %.3f}\n",
           argv[1], td_act_type_name(act), td_kv_type_name(kv), ctx, T, N, ts[N / 2], ts[0]);
    rc = 0;
out:
    free(tok); free(lg); free(ts);
    td_ctx_free(c);
    td_model_free(m);
    return rc;
}
