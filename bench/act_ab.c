/* bench/act_ab.c — in-process A/B of the activation types (td_ctx_params.act_type
 * f32 vs bf16). Part 1, one thread, kernel level: td_matmul over bf16 weights
 * (f32 activations, D16) vs td_from_f32 + td_matmul_bf16a (B32) for M tokens,
 * K x N weights streamed from memory (N x K x 2 bytes > L2); alternated, best
 * of ROUNDS, GFLOP/s. Part 2, forward level: one context per type on MODEL_DIR
 * (sharing one thread pool), the same CTX-token prefix; rounds alternate the
 * order; each times a verify of T = 1, 2, 4, 8, 16 new tokens (rolled back) and
 * a 512-token prefill; min and median per type.
 * Build and run (from the repository root, after make):
 *   cc -std=c11 -O2 -Iinclude -Isrc bench/act_ab.c build/libtandem.a -o /tmp/act_ab \
 *      -lpcre2-8 -lutf8proc -lcjson -lmicrohttpd -lm -pthread
 *   /tmp/act_ab MODEL_DIR THREADS ROUNDS [CTX]      (MODEL_DIR "-": the kernels only) */
#define _GNU_SOURCE
#include "tandem.h"
#include "nn/kernels.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
static int cmp(const void *a, const void *b) { double x = *(const double *)a, y = *(const double *)b; return x < y ? -1 : x > y; }
static double med(double *v, int n) { double *c = malloc(sizeof(double) * n); memcpy(c, v, sizeof(double) * n); qsort(c, n, sizeof(double), cmp); double m = c[n / 2]; free(c); return m; }
static double mn(const double *v, int n) { double m = v[0]; for (int i = 1; i < n; i++) m = v[i] < m ? v[i] : m; return m; }

enum { NT = 6, MAXR = 200 };
static const int TS[NT] = {1, 2, 4, 8, 16, 512};

static void kernels(int rounds, int N) {
    static const int MS[] = {1, 4, 8, 16, 64};
    const int K = 1024;
    uint16_t *W = malloc(2 * (size_t)N * K), *xa = malloc(2 * 64 * (size_t)K);
    float *x = malloc(4 * 64 * (size_t)K), *y = malloc(4 * 64 * (size_t)N);
    uint64_t s = 1;
    for (size_t i = 0; i < (size_t)N * K; i++) { s = s * 6364136223846793005ull + 1; W[i] = (uint16_t)(0x3c00 + ((s >> 40) & 0x7ff)) ^ (uint16_t)((s >> 20) & 0x8000); }
    for (size_t i = 0; i < 64 * (size_t)K; i++) { s = s * 6364136223846793005ull + 1; x[i] = (float)((s >> 40) & 0xffff) / 65536.0f - 0.5f; }
    printf("kernels, one thread, K=%d N=%d bf16 weights (%.1f MB), vdpbf16ps %s:\n", K, N, 2.0 * N * K / 1e6,
           td_kernels_bf16_native() ? "yes" : "no (emulated)");
    for (size_t mi = 0; mi < sizeof MS / sizeof *MS; mi++) {
        int M = MS[mi];
        double best[2] = {1e9, 1e9};
        for (int r = 0; r < rounds; r++)
            for (int k = 0; k < 2; k++) {
                int a = (r + k) & 1;
                double t0 = now();
                if (!a) td_matmul(y, N, x, K, M, W, TD_DTYPE_BF16, K, 0, N, 0);
                else { td_from_f32(xa, x, TD_DTYPE_BF16, (size_t)M * K); td_matmul_bf16a(y, N, xa, K, M, W, K, 0, N, 0); }
                double t = now() - t0;
                if (t < best[a]) best[a] = t;
            }
        double fl = 2.0 * M * N * K;
        printf("  M=%-3d f32 act %7.1f GFLOP/s (%.3f ms)   bf16 act %7.1f GFLOP/s (%.3f ms)   %.2fx\n", M, fl / best[0] / 1e9,
               best[0] * 1e3, fl / best[1] / 1e9, best[1] * 1e3, best[0] / best[1]);
    }
    free(W); free(xa); free(x); free(y);
}

int main(int argc, char **argv) {
    const char *dir = argc > 1 ? argv[1] : "models/tiny-code/target";
    int threads = argc > 2 ? atoi(argv[2]) : 2, rounds = argc > 3 ? atoi(argv[3]) : 10, CTX = argc > 4 ? atoi(argv[4]) : 512;
    if (rounds < 1 || rounds > MAXR) { fprintf(stderr, "act_ab: rounds 1..%d\n", MAXR); return 2; }
    kernels(rounds, 8192);
    kernels(rounds * 10, 192); /* 384 KiB of weights: in L2 */
    if (!strcmp(dir, "-")) return 0; /* kernels only */
    td_err err = {0};
    td_model *m = NULL;
    if (td_model_open(&m, dir, &err)) { fprintf(stderr, "%s\n", err.msg); return 1; }
    td_model_info info; td_model_get_info(m, &info);
    int V = info.n_vocab;
    td_ctx *c[2] = {0};
    int row[2];
    int32_t *toks = malloc(sizeof(int32_t) * (CTX + 512));
    for (int i = 0; i < CTX + 512; i++) toks[i] = (int32_t)((i * 7919 + 13) % V);
    float *lg = malloc(sizeof(float) * 16 * (size_t)V);
    uint8_t want[512] = {0};
    for (int k = 0; k < 2; k++) {
        td_ctx_params p = td_ctx_default_params();
        p.max_rows = 1; p.max_ctx = CTX + 520; p.max_tokens = 512; p.max_logits = 16;
        p.n_threads = threads; p.act_type = k ? TD_DTYPE_BF16 : TD_DTYPE_F32; p.share_threads = k ? c[0] : NULL;
        if (td_ctx_open(&c[k], m, &p, &err)) { fprintf(stderr, "%s\n", err.msg); return 1; }
        td_ctx_row_add(c[k], &row[k]);
        int n = CTX;
        td_batch b = {.n_rows = 1, .rows = &row[k], .n_tokens = &n, .tokens = toks, .want = want, .skip_logits = 1};
        if (td_ctx_forward(c[k], &b, NULL, NULL, &err)) { fprintf(stderr, "%s\n", err.msg); return 1; }
    }
    double *ts = malloc(sizeof(double) * 2 * NT * rounds);
    for (int r = 0; r < rounds; r++)
        for (int kk = 0; kk < 2; kk++) {
            int k = (r + kk) & 1;
            for (int ti = 0; ti < NT; ti++) {
                int n = TS[ti];
                memset(want, 0, sizeof want);
                for (int i = 0; i < n && i < 16; i++) want[n - 1 - i] = 1;
                td_batch b = {.n_rows = 1, .rows = &row[k], .n_tokens = &n, .tokens = toks + CTX, .want = want};
                double t0 = now();
                if (td_ctx_forward(c[k], &b, lg, NULL, &err)) { fprintf(stderr, "%s\n", err.msg); return 1; }
                ts[(k * NT + ti) * rounds + r] = now() - t0;
                td_ctx_row_trim(c[k], row[k], CTX);
            }
        }
    printf("forward, %s, %d threads, context %d, %d rounds (min / median ms; T=512 is a prefill at context %d):\n", dir,
           threads, CTX, rounds, CTX);
    for (int ti = 0; ti < NT; ti++) {
        double *a = ts + (0 * NT + ti) * rounds, *b = ts + (1 * NT + ti) * rounds;
        printf("  T=%-3d f32 act %8.2f / %8.2f   bf16 act %8.2f / %8.2f   min ratio %.2fx\n", TS[ti], mn(a, rounds) * 1e3,
               med(a, rounds) * 1e3, mn(b, rounds) * 1e3, med(b, rounds) * 1e3, mn(a, rounds) / mn(b, rounds));
    }
    double *a1 = ts + 0 * rounds, *a8 = ts + 3 * rounds, *b1 = ts + (NT + 0) * rounds, *b8 = ts + (NT + 3) * rounds;
    printf("  T8/T1 (min): f32 act %.2f, bf16 act %.2f\n", mn(a8, rounds) / mn(a1, rounds), mn(b8, rounds) / mn(b1, rounds));
    td_ctx_free(c[1]); td_ctx_free(c[0]); td_model_free(m);
    free(ts); free(lg); free(toks);
    return 0;
}
