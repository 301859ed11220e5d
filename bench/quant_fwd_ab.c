/* bench/quant_fwd_ab.c — in-process A/B of two builds of the library on whole
 * forwards of a quantized model: each build is a shared object (dlopen'ed
 * with its own symbols), opens the model, quantizes it (td_model_quantize_weights)
 * and runs, in alternating rounds: a 512-token prefill (one forward) and
 * verifies of T = 1, 2, 4, 8, 16 new tokens at context 512 (all wanting
 * logits, rolled back). Reports min and median wall ms and process CPU ms.
 * Build a shared object of a tree (without src/cli), e.g.:
 *   for each .c under src except src/cli and src/server: cc -std=c11 -O2 -march=native -fPIC -Iinclude -Isrc -c
 *     (the *_avx2.c files with -mavx2 -mfma -mf16c -mno-avx512f); cc -shared -o A.so *.o -l...
 *   cc -std=c11 -O2 -Iinclude bench/quant_fwd_ab.c -o /tmp/quant_fwd_ab -ldl -lm
 *   /tmp/quant_fwd_ab A.so B.so MODEL q8_0|q4_0|none THREADS ROUNDS [PREFILL(1|0)] [ACT]
 * (none: the model's weights as loaded, e.g. a GGUF file's; ACT: the activation type, default the context's)
 * With PREFILL 0 the prefill runs in the first round only (verify figures only). */
#define _GNU_SOURCE
#include "tandem.h"
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
static double pcpu(void) { struct timespec t; clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
static int cmp(const void *a, const void *b) { double x = *(const double *)a, y = *(const double *)b; return x < y ? -1 : x > y; }
static double med(double *v, int n) { double c[256]; memcpy(c, v, sizeof(double) * n); qsort(c, n, sizeof(double), cmp); return c[n / 2]; }
static double mn(double *v, int n) { double m = 1e30; for (int i = 0; i < n; i++) m = v[i] < m ? v[i] : m; return m; }

static const char *g_act; /* the contexts' act_type by name, or NULL: the default */
typedef struct {
    void *h;
    int (*model_open)(td_model **, const char *, td_err *);
    int (*quantize)(td_model *, int, td_err *);
    void (*model_info)(const td_model *, td_model_info *);
    td_ctx_params (*defaults)(void);
    int (*ctx_open)(td_ctx **, td_model *, const td_ctx_params *, td_err *);
    int (*row_add)(td_ctx *, int *);
    int (*row_trim)(td_ctx *, int, int);
    int (*forward)(td_ctx *, const td_batch *, float *, void *, td_err *);
    td_model *m; td_ctx *c; int row;
} lib;

#define SYM(f, n) do { *(void **)&L->f = dlsym(L->h, n); if (!L->f) { fprintf(stderr, "%s: no %s\n", path, n); exit(1); } } while (0)
static void lib_open(lib *L, const char *path, const char *dir, int dt, int threads) {
    L->h = dlopen(path, RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
    if (!L->h) { fprintf(stderr, "%s\n", dlerror()); exit(1); }
    SYM(model_open, "td_model_open"); SYM(quantize, "td_model_quantize_weights"); SYM(model_info, "td_model_get_info");
    SYM(defaults, "td_ctx_default_params"); SYM(ctx_open, "td_ctx_open"); SYM(row_add, "td_ctx_row_add");
    SYM(row_trim, "td_ctx_row_trim"); SYM(forward, "td_ctx_forward");
    td_err err = {0};
    if (L->model_open(&L->m, dir, &err) || (dt >= 0 && L->quantize(L->m, dt, &err))) { fprintf(stderr, "%s\n", err.msg); exit(1); }
    td_ctx_params p = L->defaults();
    if (g_act) p.act_type = !strcmp(g_act, "amx") ? TD_ACT_AMX : !strcmp(g_act, "bf16") ? TD_DTYPE_BF16 : TD_DTYPE_F32;
    p.max_rows = 1; p.max_ctx = 600; p.max_tokens = 512; p.max_logits = 16; p.n_threads = threads;
    if (L->ctx_open(&L->c, L->m, &p, &err)) { fprintf(stderr, "%s\n", err.msg); exit(1); }
    L->row_add(L->c, &L->row);
}

enum { NT = 5, CTX = 512 };
static const int TS[NT] = {1, 2, 4, 8, 16};

int main(int argc, char **argv) {
    if (argc < 7) { fprintf(stderr, "usage: quant_fwd_ab A.so B.so MODEL q8_0|q4_0|none THREADS ROUNDS [PREFILL] [ACT]\n"); return 2; }
    int dt = !strcmp(argv[4], "none") ? -1 : strcmp(argv[4], "q4_0") ? TD_DTYPE_Q8_0 : TD_DTYPE_Q4_0, threads = atoi(argv[5]), R = atoi(argv[6]);
    g_act = argc > 8 ? argv[8] : NULL;
    int every = argc > 7 ? atoi(argv[7]) : 1, np = 0;
    if (R < 1 || R > 200) return 2;
    lib L[2] = {{0}};
    for (int k = 0; k < 2; k++) lib_open(&L[k], argv[1 + k], argv[3], dt, threads);
    td_model_info info; L[0].model_info(L[0].m, &info);
    int V = info.n_vocab;
    int32_t *toks = malloc(sizeof(int32_t) * (CTX + 32));
    uint64_t s = 7;
    for (int i = 0; i < CTX + 32; i++) { s = s * 6364136223846793005ull + 1442695040888963407ull; toks[i] = (int32_t)((s >> 33) % (uint64_t)V); }
    float *lg = malloc(sizeof(float) * 16 * (size_t)V);
    uint8_t ones[32]; memset(ones, 1, sizeof ones);
    static double pw[2][200], pc[2][200], vw[2][NT][200], vc[2][NT][200];
    td_err err = {0};
    for (int r = 0; r < R; r++)
        for (int kk = 0; kk < 2; kk++) {
            int k = (kk + r) & 1;
            lib *l = &L[k];
            double t0, c0;
            if (every || r == 0) {
                l->row_trim(l->c, l->row, 0);
                int n = CTX;
                td_batch b = {.n_rows = 1, .rows = &l->row, .n_tokens = &n, .tokens = toks};
                t0 = now(); c0 = pcpu();
                if (l->forward(l->c, &b, lg, NULL, &err)) { fprintf(stderr, "%s\n", err.msg); return 1; }
                pw[k][r] = now() - t0; pc[k][r] = pcpu() - c0;
                if (k == 1) np++;
            }
            for (int ti = 0; ti < NT; ti++) {
                l->row_trim(l->c, l->row, CTX);
                int nt = TS[ti];
                td_batch v = {.n_rows = 1, .rows = &l->row, .n_tokens = &nt, .tokens = toks + CTX, .want = ones};
                t0 = now(); c0 = pcpu();
                if (l->forward(l->c, &v, lg, NULL, &err)) { fprintf(stderr, "%s\n", err.msg); return 1; }
                vw[k][ti][r] = now() - t0; vc[k][ti][r] = pcpu() - c0;
            }
        }
    double la[3];
    if (getloadavg(la, 3) < 1) la[0] = -1;
    printf("%s %s, %d threads, %d rounds, loadavg(after) %.2f\n", argv[3], argv[4], threads, R, la[0]);
    for (int k = 0; k < 2; k++) {
        printf("%-28s prefill(512) wall min/med %.0f/%.0f ms (%.1f tok/s best) cpu %.0f | verify wall min/med ms:", argv[1 + k],
               mn(pw[k], np) * 1e3, med(pw[k], np) * 1e3, CTX / mn(pw[k], np), mn(pc[k], np) * 1e3);
        for (int ti = 0; ti < NT; ti++) printf(" T%d %.1f/%.1f", TS[ti], mn(vw[k][ti], R) * 1e3, med(vw[k][ti], R) * 1e3);
        printf(" | cpu min:");
        for (int ti = 0; ti < NT; ti++) printf(" T%d %.1f", TS[ti], mn(vc[k][ti], R) * 1e3);
        printf(" | T8/T1 (med) %.2f\n", med(vw[k][3], R) / med(vw[k][0], R));
    }
    return 0;
}
