/* bench/kv_ab.c — in-process A/B of the KV cache types: one model, one context per type
 * (sharing one thread pool), each holding the same CTX-token prefix; rounds
 * rotate the order of the types; each round times a verify forward of T new
 * tokens (all with logits) at context CTX, rolled back, for T = 1, 2, 4, 8, 16,
 * and (optionally) a CTX-token prefill. Reports min and median per type, wall
 * clock and the calling thread's CPU time (with 1 thread, the whole forward).
 * Build and run (from the repository root, after make):
 *   cc -std=c11 -O2 -Iinclude bench/kv_ab.c build/libtandem.a -o /tmp/kv_ab \
 *      -lpcre2-8 -lutf8proc -lcjson -lmicrohttpd -lm -pthread
 *   /tmp/kv_ab MODEL_DIR THREADS ROUNDS CTX PREFILL(0|1) INNER */
#define _GNU_SOURCE
#include "tandem.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
static double cpu(void) { struct timespec t; clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
static int cmp(const void *a, const void *b) { double x = *(const double *)a, y = *(const double *)b; return x < y ? -1 : x > y; }
static double med(double *v, int n) { double *c = malloc(sizeof(double) * n); memcpy(c, v, sizeof(double) * n); qsort(c, n, sizeof(double), cmp); double m = c[n / 2]; free(c); return m; }

enum { NT = 5, MAXR = 400 };
static const int TS[NT] = {1, 2, 4, 8, 16};

int main(int argc, char **argv) {
    const char *dir = argc > 1 ? argv[1] : "models/tiny-code/target";
    int threads = argc > 2 ? atoi(argv[2]) : 2, rounds = argc > 3 ? atoi(argv[3]) : 20, CTX = argc > 4 ? atoi(argv[4]) : 512;
    int do_prefill = argc > 5 ? atoi(argv[5]) : 1, inner = argc > 6 ? atoi(argv[6]) : 3;
    if (rounds < 1 || inner < 1 || rounds > MAXR || rounds * inner > MAXR * 4) { fprintf(stderr, "kv_ab: rounds 1..%d, rounds x inner <= %d\n", MAXR, MAXR * 4); return 2; }
    td_err err = {0};
    td_model *m = NULL;
    if (td_model_open(&m, dir, &err)) { fprintf(stderr, "%s\n", err.msg); return 1; }
    td_model_info info; td_model_get_info(m, &info);
    int V = info.n_vocab;
    int kvs[3] = {TD_DTYPE_F32, TD_DTYPE_BF16, TD_DTYPE_F16};
    td_ctx *c[3] = {0};
    int row[3];
    for (int k = 0; k < 3; k++) {
        td_ctx_params p = td_ctx_default_params();
        p.max_rows = 1; p.max_ctx = CTX + 32 > 544 ? CTX + 32 : 544; p.max_tokens = CTX > 512 ? CTX : 512; p.max_logits = 16;
        p.n_threads = threads; p.kv_type = kvs[k]; p.share_threads = k ? c[0] : NULL;
        if (td_ctx_open(&c[k], m, &p, &err)) { fprintf(stderr, "%s\n", err.msg); return 1; }
        td_ctx_row_add(c[k], &row[k]);
    }
    int32_t *toks = malloc(sizeof(int32_t) * (CTX + 600));
    uint64_t s = 7;
    for (int i = 0; i < CTX + 600; i++) { s = s * 6364136223846793005ull + 1442695040888963407ull; toks[i] = (int32_t)((s >> 33) % (uint64_t)V); }
    float *lg = malloc(sizeof(float) * 16 * (size_t)V);
    uint8_t ones[600]; memset(ones, 1, sizeof ones);
    static double vw[3][NT][MAXR * 4], vc[3][NT][MAXR * 4], pw[3][MAXR];
    int nv = 0, np = 0;
    for (int r = 0; r < rounds; r++) {
        for (int kk = 0; kk < 3; kk++) {
            int k = (kk + r) % 3;
            if (do_prefill || r == 0) {
                td_ctx_row_trim(c[k], row[k], 0);
                int n = CTX;
                td_batch b = {.n_rows = 1, .rows = &row[k], .n_tokens = &n, .tokens = toks};
                double t0 = now();
                if (td_ctx_forward(c[k], &b, lg, NULL, &err)) { fprintf(stderr, "%s\n", err.msg); return 1; }
                pw[k][np] = now() - t0;
            }
            for (int ti = 0; ti < NT; ti++)
                for (int i = 0; i < inner; i++) {
                    td_ctx_row_trim(c[k], row[k], CTX);
                    int n = TS[ti];
                    td_batch b = {.n_rows = 1, .rows = &row[k], .n_tokens = &n, .tokens = toks + CTX, .want = ones};
                    double t0 = now(), c0 = cpu();
                    if (td_ctx_forward(c[k], &b, lg, NULL, &err)) { fprintf(stderr, "%s\n", err.msg); return 1; }
                    vc[k][ti][nv + i] = cpu() - c0;
                    vw[k][ti][nv + i] = now() - t0;
                }
        }
        nv += inner;
        if (do_prefill || r == 0) np++;
    }
    double la[3];
    if (getloadavg(la, 3) < 1) la[0] = -1;
    printf("model %s, %d threads, ctx %d, %d rounds x %d, loadavg(after) %.2f\n", dir, threads, CTX, rounds, inner, la[0]);
    for (int k = 0; k < 3; k++) {
        const char *nm = td_kv_type_name(kvs[k]);
        double mn = 1e9;
        for (int i = 0; i < np; i++) mn = pw[k][i] < mn ? pw[k][i] : mn;
        printf("%-5s prefill(%d) min %.2f ms med %.2f ms | verify wall min/med ms:", nm, CTX, mn * 1e3, med(pw[k], np) * 1e3);
        for (int ti = 0; ti < NT; ti++) {
            double a = 1e9; for (int i = 0; i < nv; i++) a = vw[k][ti][i] < a ? vw[k][ti][i] : a;
            printf(" T%d %.3f/%.3f", TS[ti], a * 1e3, med(vw[k][ti], nv) * 1e3);
        }
        printf(" | thread-cpu min ms:");
        for (int ti = 0; ti < NT; ti++) {
            double a = 1e9; for (int i = 0; i < nv; i++) a = vc[k][ti][i] < a ? vc[k][ti][i] : a;
            printf(" T%d %.3f", TS[ti], a * 1e3);
        }
        printf("\n");
    }
    printf("JSON {\"model\": \"%s\", \"threads\": %d, \"ctx\": %d, \"rounds\": %d, \"loadavg\": %.2f, \"results\": {", dir, threads, CTX, rounds, la[0]);
    for (int k = 0; k < 3; k++) {
        double mn = 1e9;
        for (int i = 0; i < np; i++) mn = pw[k][i] < mn ? pw[k][i] : mn;
        printf("%s\"%s\": {\"prefill_min_ms\": %.3f, \"verify_min_ms\": [", k ? ", " : "", td_kv_type_name(kvs[k]), mn * 1e3);
        for (int ti = 0; ti < NT; ti++) { double a = 1e9; for (int i = 0; i < nv; i++) a = vw[k][ti][i] < a ? vw[k][ti][i] : a; printf("%s%.4f", ti ? ", " : "", a * 1e3); }
        printf("], \"verify_med_ms\": [");
        for (int ti = 0; ti < NT; ti++) printf("%s%.4f", ti ? ", " : "", med(vw[k][ti], nv) * 1e3);
        printf("]}");
    }
    printf("}}\n");
    for (int k = 2; k >= 0; k--) td_ctx_free(c[k]);
    td_model_free(m);
    return 0;
}
