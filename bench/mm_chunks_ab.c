/* bench/mm_chunks_ab.c — two product chunkings of the same forward, alternated
 * round by round in one process, so a shared machine's drift (its bandwidth
 * moves by a fifth within minutes) weighs on both alike. Rounds go A B B A ...;
 * each round times N forwards of T new tokens on a row holding CTX positions
 * (rolled back after each) and keeps their median; each A round is paired with
 * its B neighbour. Prints the median of the paired ratios B / A with its
 * quartiles, and each side's median forward.
 * WHICH picks what A and B set (neither changes a bit of the output):
 *   1   — td_ctx_set_mm_chunks_1: chunks a thread of a one-token product of
 *         2 MiB or more (the decode's products);
 *   all — td_ctx_set_mm_chunks: chunks a thread of every product.
 * Build and run (from the repository root, after make):
 *   cc -std=c11 -O2 -march=native -Iinclude -Isrc bench/mm_chunks_ab.c build/libtandem.a -o /tmp/mm_chunks_ab \
 *      -lpcre2-8 -lutf8proc -lcjson -lmicrohttpd -lm -pthread
 *   /tmp/mm_chunks_ab MODEL ACT KV CTX T N ROUNDS WHICH A B
 *   e.g. /tmp/mm_chunks_ab /tmp/q06-q8.gguf amx bf16 64 1 3 800 1 1 8 */
#include "nn/pool.h"
#include "tandem.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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
    if (argc != 11) {
        fprintf(stderr, "usage: mm_chunks_ab MODEL ACT KV CTX T N ROUNDS (1|all) A B\n");
        return 2;
    }
    int act = td_act_type_parse(argv[2]), kv = td_kv_type_parse(argv[3]);
    int ctx = atoi(argv[4]), T = atoi(argv[5]), N = atoi(argv[6]), R = atoi(argv[7]);
    int one = !strcmp(argv[8], "1"), A = atoi(argv[9]), B = atoi(argv[10]);
    if (act < 0 || kv < 0 || ctx < 0 || ctx > (1 << 20) || T < 1 || T > 512 || N < 1 || N > 100000 || R < 4 ||
        R > 100000 || (!one && strcmp(argv[8], "all")) || A < 1 || A > 64 || B < 1 || B > 64) {
        fprintf(stderr, "mm_chunks_ab: bad argument (0 <= CTX <= 2^20, 1 <= T <= 512, 4 <= ROUNDS, WHICH 1 or all, 1 <= A, B <= 64)\n");
        return 2;
    }
    td_err err = {0};
    td_model *m = NULL;
    td_ctx *c = NULL;
    if (td_model_open(&m, argv[1], &err) != 0) { fprintf(stderr, "mm_chunks_ab: %s\n", err.msg); return 1; }
    td_model_info mi;
    td_model_get_info(m, &mi);
    td_ctx_params p = td_ctx_default_params();
    p.act_type = act;
    p.kv_type = kv;
    p.max_rows = 1;
    p.max_ctx = ctx + T;
    p.max_tokens = 512;
    p.max_logits = T;
    if (td_ctx_open(&c, m, &p, &err) != 0) { fprintf(stderr, "mm_chunks_ab: %s\n", err.msg); td_model_free(m); return 1; }
    int32_t *tok = malloc(sizeof(int32_t) * (size_t)(ctx + T));
    float *lg = malloc(sizeof(float) * (size_t)mi.n_vocab * (size_t)T);
    double *ts = malloc(sizeof(double) * (size_t)N), *med[2], *rat = malloc(sizeof(double) * (size_t)R);
    med[0] = malloc(sizeof(double) * (size_t)R);
    med[1] = malloc(sizeof(double) * (size_t)R);
    int row = -1, rc = 1, cnt[2] = {0, 0};
    if (!tok || !lg || !ts || !rat || !med[0] || !med[1] || td_ctx_row_add(c, &row) != 0) {
        fprintf(stderr, "mm_chunks_ab: out of memory\n");
        goto out;
    }
    uint64_t s = 88172645463325252ull;
    for (int i = 0; i < ctx + T; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        tok[i] = (int32_t)(s % (uint64_t)mi.n_vocab);
    }
    int n;
    td_batch b = {.n_rows = 1, .rows = &row, .n_tokens = &n};
    for (int done = 0; done < ctx; done += n) {
        n = ctx - done < 512 ? ctx - done : 512;
        b.tokens = tok + done;
        b.skip_logits = 1;
        if (td_ctx_forward(c, &b, NULL, NULL, &err) != 0) { fprintf(stderr, "mm_chunks_ab: %s\n", err.msg); goto out; }
    }
    static uint8_t want[512];
    for (int i = 0; i < T; i++) want[i] = 1;
    n = T;
    b.tokens = tok + ctx;
    b.skip_logits = 0;
    b.want = want;
    for (int r = 0; r < R; r++) {
        int k = (r % 2) ^ ((r / 2) % 2); /* A B B A */
        if (one) td_ctx_set_mm_chunks_1(c, k ? B : A, (size_t)2 << 20);
        else td_ctx_set_mm_chunks(c, k ? B : A, (size_t)64 << 10);
        for (int i = 0; i < N; i++) {
            double t0 = now_ms();
            if (td_ctx_forward(c, &b, lg, NULL, &err) != 0) { fprintf(stderr, "mm_chunks_ab: %s\n", err.msg); goto out; }
            ts[i] = now_ms() - t0;
            td_ctx_row_trim(c, row, ctx);
        }
        qsort(ts, (size_t)N, sizeof(double), cmpd);
        med[k][cnt[k]++] = ts[N / 2];
    }
    int np = cnt[0] < cnt[1] ? cnt[0] : cnt[1];
    for (int i = 0; i < np; i++) rat[i] = med[1][i] / med[0][i];
    qsort(rat, (size_t)np, sizeof(double), cmpd);
    qsort(med[0], (size_t)cnt[0], sizeof(double), cmpd);
    qsort(med[1], (size_t)cnt[1], sizeof(double), cmpd);
    printf("{\"model\": \"%s\", \"T\": %d, \"ctx\": %d, \"which\": \"%s\", \"A\": %d, \"B\": %d, \"pairs\": %d, "
           "\"ratio_b_a\": %.4f, \"q1\": %.4f, \"q3\": %.4f, \"median_ms_a\": %.3f, \"median_ms_b\": %.3f}\n",
           argv[1], T, ctx, argv[8], A, B, np, rat[np / 2], rat[np / 4], rat[3 * np / 4], med[0][cnt[0] / 2],
           med[1][cnt[1] / 2]);
    rc = 0;
out:
    free(tok); free(lg); free(ts); free(rat); free(med[0]); free(med[1]);
    td_ctx_free(c);
    td_model_free(m);
    return rc;
}
