/* test_kernels — every kernel of src/nn/kernels.c against a plain scalar
 * reference (double accumulation) on random inputs with ragged sizes, and the
 * invariance properties the forward pass relies on:
 *   - a matrix product's row m has the same bits whether computed with M = 1,
 *     M = 7 (or any M), over any split of the output range, with 1 or 2 threads;
 *   - an attention query's output has the same bits alone or among others;
 *   - every vector path the CPU supports (AVX-512, AVX2) produces the same bits
 *     as the portable path (memcmp, ragged sizes), and passes the reference
 *     comparison itself. TD_KERNELS picks the path of the first round.
 * Tolerances (relative to the sum of |terms|, the scale a float sum's rounding
 * error is proportional to): dot/matmul (n/16 + 6) * 2^-23; exp 3 ulp over
 * [-87, 88]; norms and swiglu 1e-6 relative. */
#define _GNU_SOURCE
#include "t.h"
#include "nn/amx.h"
#include "nn/hwsel.h"
#include "nn/i8t.h"
#include "nn/kernels.h"
#include "nn/mmx.h"
#include "nn/pool.h"
#include "nn/q8r.h"
#include "tandem.h"
#include "util/util.h"

#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/mman.h>
#include <unistd.h>

static const char *g_suffix = "";
static char g_name[160];
static void tb(const char *base) { snprintf(g_name, sizeof g_name, "%s%s", base, g_suffix); t_begin(g_name); }

static uint64_t rng_s = 0x9E3779B97F4A7C15ull;
static uint32_t rnd32(void) {
    rng_s ^= rng_s << 13; rng_s ^= rng_s >> 7; rng_s ^= rng_s << 17;
    return (uint32_t)(rng_s >> 11);
}
static float frand(void) { return (float)((rnd32() & 0xFFFFFF) / 8388608.0 - 1.0); } /* [-1, 1) */

static uint16_t f2bf(float f) { uint32_t u; memcpy(&u, &f, 4); return (uint16_t)(u >> 16); }
/* a random finite f16 of magnitude 2^-6 .. 2^3 */
static uint16_t rand_f16(void) {
    uint32_t r = rnd32();
    return (uint16_t)(((r & 1) << 15) | ((9 + (r >> 1) % 10) << 10) | ((r >> 8) & 0x3FF));
}
static double wv(const void *w, size_t i, int dt) {
    return dt == TD_DTYPE_F32    ? ((const float *)w)[i]
           : dt == TD_DTYPE_BF16 ? td_bf16_to_f32(((const uint16_t *)w)[i])
                                 : td_f16_to_f32(((const uint16_t *)w)[i]);
}
/* random weights [n] of dtype */
static void *rand_w(size_t n, int dt) {
    if (dt == TD_DTYPE_F32) { float *w = malloc(4 * n); for (size_t i = 0; i < n; i++) w[i] = frand(); return w; }
    uint16_t *w = malloc(2 * n);
    for (size_t i = 0; i < n; i++) w[i] = dt == TD_DTYPE_BF16 ? f2bf(frand()) : rand_f16();
    return w;
}
static float *rand_f(size_t n) { float *x = malloc(4 * n + 4); for (size_t i = 0; i < n; i++) x[i] = frand(); return x; }

static const char *dtn(int dt) {
    return dt == TD_DTYPE_F32 ? "f32" : dt == TD_DTYPE_BF16 ? "bf16" : dt == TD_DTYPE_Q8_0 ? "q8_0" : "f16";
}
/* n (a multiple of 32) random values as a q8_0 KV row array (td_from_f32's blocks) */
static void *rand_q8(size_t n) {
    float *x = rand_f(n);
    void *q = malloc(n / 32 * 34);
    td_from_f32(q, x, TD_DTYPE_Q8_0, n);
    free(x);
    return q;
}

/* reference dot: value and sum of |terms| */
static double ref_dot(const float *a, const void *w, int dt, int n, double *mag) {
    double s = 0, m = 0;
    for (int k = 0; k < n; k++) { double t = (double)a[k] * wv(w, (size_t)k, dt); s += t; m += fabs(t); }
    *mag = m;
    return s;
}
static double dot_tol(int n, double mag) { return ((double)n / 16 + 6) * ldexp(1.0, -23) * mag + 1e-30; }

static const int SIZES[] = {1, 2, 7, 15, 16, 17, 31, 32, 33, 47, 64, 100, 127, 128, 129, 255, 384, 389, 1000, 1283};
#define NSIZES ((int)(sizeof SIZES / sizeof SIZES[0]))

static void test_dot(void) {
    tb("kernels_dot_vs_reference");
    for (int dt = 0; dt < 3; dt++)
        for (int si = 0; si < NSIZES; si++) {
            int n = SIZES[si];
            float *a = rand_f((size_t)n);
            void *w = rand_w((size_t)n, dt);
            double mag, r = ref_dot(a, w, dt, n, &mag);
            float got = dt == TD_DTYPE_F32 ? td_dot(a, w, n) : dt == TD_DTYPE_BF16 ? td_dot_bf16(a, w, n) : td_dot_f16(a, w, n);
            T_CHECK(fabs(got - r) <= dot_tol(n, mag), "%s n=%d: %.9g vs %.9g (tol %.3g)", dtn(dt), n, got, r, dot_tol(n, mag));
            free(a); free(w);
        }
    t_end();
}

/* y for a full [M][N] product with the given split of [0, N) into parts */
static void mm_split(float *y, const float *x, int M, const void *W, int dt, int K, int N, int split) {
    if (split <= 0 || split >= N) { td_matmul(y, N, x, K, M, W, dt, K, 0, N, 0); return; }
    td_matmul(y, N, x, K, M, W, dt, K, 0, split, 0);
    td_matmul(y, N, x, K, M, W, dt, K, split, N, 0);
}

static void test_matmul(void) {
    tb("kernels_matmul_vs_reference_and_invariance");
    static const int KS[] = {1, 5, 16, 33, 100, 129, 389};
    static const int NS[] = {1, 3, 8, 13, 37};
    for (int dt = 0; dt < 3; dt++)
        for (int ki = 0; ki < 7; ki++)
            for (int ni = 0; ni < 5; ni++) {
                int K = KS[ki], N = NS[ni], MMAX = 17; /* 1..7: MR_MAIN x NR_MAIN tiles; 8..17: 8 x NR_WIDE plus every remainder */
                float *x = rand_f((size_t)MMAX * K);
                void *W = rand_w((size_t)N * K, dt);
                float *yall = malloc(sizeof(float) * MMAX * N), *y1 = malloc(sizeof(float) * N);
                for (int M = 1; M <= MMAX; M++) {
                    mm_split(yall, x, M, W, dt, K, N, M % 3 ? N / 2 + 1 : 0);
                    for (int m = 0; m < M; m++) {
                        /* reference */
                        for (int n = 0; n < N; n++) {
                            double mag, r = ref_dot(x + (size_t)m * K, (const char *)W + (size_t)n * K * (dt ? 2 : 4), dt, K, &mag);
                            float g = yall[(size_t)m * N + n];
                            if (!(fabs(g - r) <= dot_tol(K, mag))) {
                                T_CHECK(0, "%s K=%d N=%d M=%d m=%d n=%d: %.9g vs %.9g", dtn(dt), K, N, M, m, n, g, r);
                                goto next;
                            }
                        }
                        /* the same row alone (M = 1), unsplit: same bits */
                        td_matmul(y1, N, x + (size_t)m * K, K, 1, W, dt, K, 0, N, 0);
                        if (memcmp(y1, yall + (size_t)m * N, sizeof(float) * N) != 0) {
                            T_CHECK(0, "%s K=%d N=%d: row %d differs between M=1 and M=%d", dtn(dt), K, N, m, M);
                            goto next;
                        }
                        /* and the canonical dot */
                        for (int n = 0; n < N; n++) {
                            const char *wr = (const char *)W + (size_t)n * K * (dt ? 2 : 4);
                            float d = dt == TD_DTYPE_F32 ? td_dot(x + (size_t)m * K, (const float *)wr, K)
                                      : dt == TD_DTYPE_BF16 ? td_dot_bf16(x + (size_t)m * K, (const uint16_t *)wr, K)
                                                            : td_dot_f16(x + (size_t)m * K, (const uint16_t *)wr, K);
                            if (memcmp(&d, yall + (size_t)m * N + n, 4) != 0) {
                                T_CHECK(0, "%s K=%d N=%d M=%d: element (%d,%d) differs from td_dot", dtn(dt), K, N, M, m, n);
                                goto next;
                            }
                        }
                    }
                }
                /* add = 1 fuses y += x W^T with the same bits as computing then adding */
                {
                    int M = 5;
                    float *base = rand_f((size_t)M * N), *ya = malloc(sizeof(float) * M * N);
                    memcpy(ya, base, sizeof(float) * M * N);
                    td_matmul(ya, N, x, K, M, W, dt, K, 0, N, 1);
                    td_matmul(yall, N, x, K, M, W, dt, K, 0, N, 0);
                    for (int i = 0; i < M * N; i++) {
                        float e = base[i] + yall[i];
                        if (memcmp(&e, ya + i, 4) != 0) { T_CHECK(0, "%s K=%d N=%d: add=1 differs at %d", dtn(dt), K, N, i); break; }
                    }
                    free(base); free(ya);
                }
            next:
                free(x); free(W); free(yall); free(y1);
            }
    t_end();
}

/* Prefill-sized products: many 8-token tiles, outputs in several weight panels,
 * K long enough to be taken in blocks (with a ragged tail): every row equals the
 * same row computed alone (M = 1), with add = 0 and add = 1. */
static void test_matmul_large(void) {
    tb("kernels_matmul_large_m_panels_and_k_blocks");
    static const int SH[][3] = {{37, 2085, 301}, {21, 1000, 600}, {12, 3072, 40}};
    for (int dt = 0; dt < 3; dt++)
        for (int si = 0; si < 3; si++) {
            int M = SH[si][0], K = SH[si][1], N = SH[si][2];
            float *x = rand_f((size_t)M * K), *base = rand_f((size_t)M * N);
            void *W = rand_w((size_t)N * K, dt);
            float *y = malloc(sizeof(float) * M * N), *ya = malloc(sizeof(float) * M * N), *y1 = malloc(sizeof(float) * N);
            memcpy(ya, base, sizeof(float) * M * N);
            td_matmul(y, N, x, K, M, W, dt, K, 0, N, 0);
            td_matmul(ya, N, x, K, M, W, dt, K, 0, N, 1);
            for (int m = 0; m < M; m++) {
                td_matmul(y1, N, x + (size_t)m * K, K, 1, W, dt, K, 0, N, 0);
                if (memcmp(y1, y + (size_t)m * N, sizeof(float) * N) != 0) {
                    T_CHECK(0, "%s M=%d K=%d N=%d: row %d differs from M=1", dtn(dt), M, K, N, m);
                    break;
                }
                int bad = 0;
                for (int n = 0; n < N && !bad; n++) {
                    float e = base[(size_t)m * N + n] + y1[n];
                    bad = memcmp(&e, ya + (size_t)m * N + n, 4) != 0;
                }
                if (bad) { T_CHECK(0, "%s M=%d K=%d N=%d: add=1 differs in row %d", dtn(dt), M, K, N, m); break; }
            }
            free(x); free(base); free(W); free(y); free(ya); free(y1);
        }
    t_end();
}

/* 1 vs 2 threads through the pool, split over N as the forward splits it */
typedef struct { float *y; const float *x; int M; const void *W; int dt; int K; int N; } pj;
static void pj_run(void *arg, int ith, int nth) {
    pj *j = arg;
    int blocks = (j->N + 7) / 8;
    int b0 = blocks * ith / nth, b1 = blocks * (ith + 1) / nth;
    int n0 = b0 * 8, n1 = b1 * 8 < j->N ? b1 * 8 : j->N;
    if (n0 < n1) td_matmul(j->y, j->N, j->x, j->K, j->M, j->W, j->dt, j->K, n0, n1, 0);
}
static void test_threads(void) {
    tb("kernels_matmul_threads_invariance");
    td_pool *p1 = NULL, *p2 = NULL;
    T_REQUIRE(td_pool_open(&p1, 1) == 0 && td_pool_open(&p2, 2) == 0, "pool");
    for (int dt = 0; dt < 3; dt++) {
        int K = 389, N = 203;
        float *x = rand_f((size_t)9 * K);
        void *W = rand_w((size_t)N * K, dt);
        float *ya = malloc(sizeof(float) * 9 * N), *yb = malloc(sizeof(float) * 9 * N), *y1 = malloc(sizeof(float) * N);
        for (int M = 1; M <= 9; M += 6) {
            pj a = {ya, x, M, W, dt, K, N}, b = {yb, x, M, W, dt, K, N};
            td_pool_run(p1, pj_run, &a);
            td_pool_run(p2, pj_run, &b);
            T_CHECK(memcmp(ya, yb, sizeof(float) * M * N) == 0, "%s M=%d: 1 vs 2 threads differ", dtn(dt), M);
            for (int m = 0; m < M; m++) {
                pj c = {y1, x + (size_t)m * K, 1, W, dt, K, N};
                td_pool_run(p2, pj_run, &c);
                T_CHECK(memcmp(y1, yb + (size_t)m * N, sizeof(float) * N) == 0, "%s: row %d of M=%d differs from M=1", dtn(dt), m, M);
            }
        }
        free(x); free(W); free(ya); free(yb); free(y1);
    }
done:
    td_pool_free(p1);
    td_pool_free(p2);
    t_end();
}

/* td_pool_run_n: every chunk of every job runs exactly once with the job's
 * chunk count, for more chunks than threads and fewer, over thousands of
 * back-to-back jobs (claims and steals racing); and a product split into 13
 * chunks on 3 threads equals the one-thread product. */
typedef struct { atomic_int *cnt; int n; atomic_int bad; } cj;
static void cj_run(void *arg, int ith, int nth) {
    cj *j = arg;
    if (nth != j->n || ith < 0 || ith >= nth) atomic_fetch_add(&j->bad, 1);
    else atomic_fetch_add(&j->cnt[ith], 1);
}
static void test_pool_chunks(void) {
    tb("pool_chunks_each_once");
    td_pool *p[3] = {0};
    static const int nthr[3] = {2, 3, 5}, nch[] = {1, 2, 3, 4, 7, 13, 64, 1000};
    atomic_int *cnt = calloc(1000, sizeof *cnt);
    T_REQUIRE(cnt, "memory");
    for (int k = 0; k < 3; k++) T_REQUIRE(td_pool_open(&p[k], nthr[k]) == 0, "pool %d", nthr[k]);
    if (td_pool_size(p[0]) != nthr[0]) { /* TD_MAX_THREADS (an emulator run): one-thread pools take one chunk */
        printf("  (pools capped at %d threads by TD_MAX_THREADS: not tested)\n", td_pool_size(p[0]));
        goto done;
    }
    int wrong = 0;
    for (int it = 0; it < 3000; it++)
        for (int k = 0; k < 3; k++) {
            int n = nch[(it + k) % (int)(sizeof nch / sizeof nch[0])];
            for (int i = 0; i < n; i++) atomic_store(&cnt[i], 0);
            cj j = {cnt, n, 0};
            td_pool_run_n(p[k], cj_run, &j, n);
            int ok = atomic_load(&j.bad) == 0;
            for (int i = 0; i < n; i++) ok &= atomic_load(&cnt[i]) == 1;
            if (!ok && wrong++ < 3) printf("  %d threads, %d chunks: a chunk ran twice, never or with a wrong count\n", nthr[k], n);
        }
    T_CHECK(wrong == 0, "%d jobs ran wrong", wrong);
    {
        int K = 389, N = 203, M = 3;
        float *x = rand_f((size_t)M * K);
        void *W = rand_w((size_t)N * K, TD_DTYPE_BF16);
        float *ya = malloc(sizeof(float) * M * N), *yb = malloc(sizeof(float) * M * N);
        pj a = {ya, x, M, W, TD_DTYPE_BF16, K, N}, b = {yb, x, M, W, TD_DTYPE_BF16, K, N};
        pj_run(&a, 0, 1);
        td_pool_run_n(p[1], pj_run, &b, 13);
        T_CHECK(memcmp(ya, yb, sizeof(float) * M * N) == 0, "13 chunks on 3 threads differ from one thread");
        free(x); free(W); free(ya); free(yb);
    }
done:
    for (int k = 0; k < 3; k++) td_pool_free(p[k]);
    free(cnt);
    t_end();
}

/* The default thread count = physical cores this process may use, computed here
 * another way: distinct thread_siblings_list contents over the allowed CPUs
 * (when every sibling of an allowed CPU is allowed, as in an unrestricted run). */
static void test_default_threads(void) {
    tb("pool_default_size_is_physical_cores");
    cpu_set_t set;
    int n = td_pool_default_size();
    T_REQUIRE(sched_getaffinity(0, sizeof set, &set) == 0, "sched_getaffinity");
    T_CHECK(n >= 1 && n <= CPU_COUNT(&set), "default %d, %d CPUs allowed", n, CPU_COUNT(&set));
    T_CHECK(td_ctx_default_threads() == n, "td_ctx_default_threads %d vs %d", td_ctx_default_threads(), n);
    char seen[64][64];
    int ns = 0, ok = 1;
    for (int c = 0; c < CPU_SETSIZE && ok; c++) {
        if (!CPU_ISSET(c, &set)) continue;
        char path[96], buf[64] = {0};
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu%d/topology/thread_siblings_list", c);
        FILE *f = fopen(path, "r");
        if (!f) { ok = 0; break; }
        if (!fgets(buf, sizeof buf, f)) ok = 0;
        fclose(f);
        int k = 0;
        while (k < ns && strcmp(seen[k], buf)) k++;
        if (k == ns && ns < 64) snprintf(seen[ns++], 64, "%s", buf);
        else if (k == ns) ok = 0;
    }
    printf("  default threads %d (%d CPUs allowed, %d distinct sibling lists)\n", n, CPU_COUNT(&set), ok ? ns : -1);
    if (ok) T_CHECK(n == ns, "default %d threads but %d physical cores", n, ns);
done:
    t_end();
}

/* The last-level cache figure the stream choice compares a model with: AMD's
 * reported L3 is capped at 96 MiB (a CCX's most; a VM may report the socket's
 * sum), smaller figures and other vendors' pass unchanged; td_llc_bytes is
 * that cap applied to sysconf's figure, so never more than it. */
static void test_llc_cap(void) {
    tb("pool_llc_cap");
    const size_t MiB = (size_t)1 << 20;
    T_CHECK(td_llc_cap(508 * MiB, 1) == 96 * MiB, "AMD 508 MiB -> %zu", td_llc_cap(508 * MiB, 1));
    T_CHECK(td_llc_cap(97 * MiB, 1) == 96 * MiB, "AMD 97 MiB -> %zu", td_llc_cap(97 * MiB, 1));
    T_CHECK(td_llc_cap(96 * MiB, 1) == 96 * MiB && td_llc_cap(32 * MiB, 1) == 32 * MiB, "AMD figures up to 96 MiB kept");
    T_CHECK(td_llc_cap(508 * MiB, 0) == 508 * MiB && td_llc_cap(260 * MiB, 0) == 260 * MiB, "other vendors' kept");
    long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
    size_t llc = td_llc_bytes();
    printf("  last-level cache: sysconf L3 %ld bytes, td_llc_bytes %zu\n", l3, llc);
    T_CHECK(llc > 0 && (l3 <= 0 || llc <= (size_t)l3), "td_llc_bytes %zu above sysconf's %ld", llc, l3);
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    __builtin_cpu_init();
    if (__builtin_cpu_is("amd")) T_CHECK(llc <= 96 * MiB, "AMD CPU: td_llc_bytes %zu over 96 MiB", llc);
#endif
    t_end();
}

/* The schedule selector (nn/hwsel.h): seeding tries every arm from the
 * default on; then it runs the fastest and gives every 32nd pick to another
 * arm in turn (an arm over 10% slower one turn in four); a slow outlier does
 * not flip it; when the times cross (a machine's phase changes) it follows
 * within a few turns; bad samples (zero, negative, NaN, an arm out of range)
 * are ignored. */
static void hwsel_run(td_hwsel *s, int n, const double *t, int *count) {
    for (int a = 0; a < TD_HWSEL_ARMS; a++) count[a] = 0;
    for (int i = 0; i < n; i++) {
        int v = td_hwsel_pick(s);
        count[v]++;
        td_hwsel_record(s, v, t[v]);
    }
}
static void test_hwsel(void) {
    tb("hwsel_choice");
    td_hwsel s;
    td_hwsel_init(&s, 2, 1);
    int seq[6], cnt[TD_HWSEL_ARMS];
    for (int i = 0; i < 6; i++) { seq[i] = td_hwsel_pick(&s); td_hwsel_record(&s, seq[i], seq[i] ? 2.0 : 1.0); }
    T_CHECK(seq[0] == 1 && seq[1] == 0 && seq[2] == 1 && seq[3] == 0 && seq[4] == 1 && seq[5] == 0,
            "seeding alternates from the default: %d %d %d %d %d %d", seq[0], seq[1], seq[2], seq[3], seq[4], seq[5]);
    T_CHECK(s.best == 0 && td_hwsel_chosen(&s) == 0, "arm 0 (1.0 against 2.0) chosen");
    hwsel_run(&s, 640, (const double[]){1.0, 2.0}, cnt);
    T_CHECK(cnt[1] == 5, "an arm twice as slow run every 128th pick: %d of 640", cnt[1]);
    td_hwsel_init(&s, 2, 0);
    hwsel_run(&s, 6, (const double[]){1.0, 1.05}, cnt);
    hwsel_run(&s, 640, (const double[]){1.0, 1.05}, cnt);
    T_CHECK(s.best == 0 && cnt[1] == 20, "an arm 5%% slower run every 32nd pick: %d of 640", cnt[1]);
    /* one descheduled sample of the best (100x) is clipped and does not flip it */
    td_hwsel_record(&s, 0, 100.0);
    T_CHECK(s.best == 0, "one outlier flips the choice (avg %g / %g)", s.avg[0], s.avg[1]);
    /* the phase changes: arm 1 now the faster by 20%; followed within a few turns */
    int flip = -1;
    for (int i = 0; i < 800 && flip < 0; i++) {
        int v = td_hwsel_pick(&s);
        td_hwsel_record(&s, v, v ? 1.0 : 1.2);
        if (s.best == 1) flip = i;
    }
    T_CHECK(flip >= 0 && flip < 400, "phase change followed after %d picks", flip);
    td_hwsel_record(&s, 2, 0.1);
    td_hwsel_record(&s, -1, 0.1);
    td_hwsel_record(&s, 0, 0.0);
    td_hwsel_record(&s, 0, -1.0);
    td_hwsel_record(&s, 0, NAN);
    T_CHECK(s.best == 1 && isfinite(s.avg[0]) && s.avg[0] > 0.5, "bad samples ignored (avg %g)", s.avg[0]);
    /* four arms from default 1: seeding 1 2 3 0 three times; arm 2 fastest; of
     * 1536 picks, the turns (48) go round robin to arms 3, 0, 1, where arm 0
     * (20% slower) takes one turn in four offered (the others pass on) and arms
     * 1, 3 (5%) every one */
    td_hwsel_init(&s, 4, 1);
    T_CHECK(td_hwsel_chosen(&s) == -1, "nothing chosen before seeding");
    const double t4[4] = {1.2, 1.05, 1.0, 1.05};
    int order_ok = 1;
    for (int i = 0; i < 12; i++) {
        int v = td_hwsel_pick(&s);
        order_ok &= v == (1 + i) % 4;
        td_hwsel_record(&s, v, t4[v]);
    }
    T_CHECK(order_ok && s.best == 2, "four arms: seeding in turn from the default, then the fastest (best %d)", s.best);
    hwsel_run(&s, 1536, t4, cnt);
    T_CHECK(cnt[2] == 1536 - 48 && cnt[0] >= 4 && cnt[0] <= 6 && cnt[1] >= 16 && cnt[3] >= 16,
            "four arms' turns: %d %d %d %d", cnt[0], cnt[1], cnt[2], cnt[3]);
    td_hwsel_init(&s, 9, 20); /* arms clamped to 4, the default taken modulo */
    T_CHECK(s.arms == TD_HWSEL_ARMS && s.best == 0, "arms %d, default %d", s.arms, s.best);
    t_end();
}

static double ulp_err(float got, double want) {
    if (want == 0) return got == 0 ? 0 : INFINITY;
    int e;
    frexp(want, &e);
    double ulp = ldexp(1.0, e - 24);
    if (ulp < ldexp(1.0, -149)) ulp = ldexp(1.0, -149);
    return fabs(got - want) / ulp;
}

static void test_exp(void) {
    tb("kernels_exp_accuracy");
    enum { N = 100003 };
    float *x = malloc(sizeof(float) * N), *y = malloc(sizeof(float) * N);
    for (int i = 0; i < N; i++) x[i] = -87.0f + 175.0f * (float)i / (N - 1);
    x[0] = 0.0f; x[1] = -0.0f; x[2] = 1.0f; x[3] = -1e-7f; x[4] = 88.0f;
    td_exp(y, x, N);
    double worst = 0;
    int wi = 0;
    for (int i = 0; i < N; i++) {
        double u = ulp_err(y[i], exp((double)x[i]));
        if (u > worst) { worst = u; wi = i; }
    }
    printf("  td_exp: worst %.2f ulp at x=%.9g\n", worst, x[wi]);
    T_CHECK(worst <= 3.0, "worst %.2f ulp at x=%.9g", worst, x[wi]);
    T_CHECK(y[0] == 1.0f && y[1] == 1.0f, "exp(+-0) = %g %g", y[0], y[1]);
    /* far tails: no NaN, saturating */
    float tails[4] = {-1000.0f, -104.5f, 200.0f, 89.5f}, ty[4];
    td_exp(ty, tails, 4);
    T_CHECK(ty[0] >= 0 && ty[0] < 1e-44f && ty[1] >= 0 && ty[1] < 1e-44f, "tiny tails %g %g", ty[0], ty[1]);
    T_CHECK(isinf(ty[2]) && isinf(ty[3]), "huge tails %g %g", ty[2], ty[3]);
    free(x); free(y);
    t_end();
}

static void test_norm_swiglu(void) {
    tb("kernels_rmsnorm_swiglu_to_f32");
    for (int dt = 0; dt < 3; dt++)
        for (int si = 0; si < NSIZES; si++) {
            int n = SIZES[si];
            float *x = rand_f((size_t)n), *o = malloc(sizeof(float) * n);
            void *w = rand_w((size_t)n, dt);
            td_rmsnorm(o, x, w, dt, n, 1e-6f);
            double ss = 0;
            for (int i = 0; i < n; i++) ss += (double)x[i] * x[i];
            double r = 1.0 / sqrt(ss / n + 1e-6);
            for (int i = 0; i < n; i++) {
                double want = wv(w, (size_t)i, dt) * x[i] * r;
                if (!(fabs(o[i] - want) <= 1e-6 * fabs(want) + 1e-30)) {
                    T_CHECK(0, "rmsnorm %s n=%d i=%d: %.9g vs %.9g", dtn(dt), n, i, o[i], want);
                    break;
                }
            }
            /* in place gives the same bits */
            float *xi = malloc(sizeof(float) * n);
            memcpy(xi, x, sizeof(float) * n);
            td_rmsnorm(xi, xi, w, dt, n, 1e-6f);
            T_CHECK(memcmp(xi, o, sizeof(float) * n) == 0, "rmsnorm in place differs (%s n=%d)", dtn(dt), n);
            /* to_f32 exact */
            float *c = malloc(sizeof(float) * n);
            td_to_f32(c, w, dt, (size_t)n);
            for (int i = 0; i < n; i++)
                if (c[i] != (float)wv(w, (size_t)i, dt)) { T_CHECK(0, "to_f32 %s n=%d i=%d", dtn(dt), n, i); break; }
            free(x); free(o); free(w); free(xi); free(c);
        }
    for (int si = 0; si < NSIZES; si++) {
        int n = SIZES[si];
        float *g = rand_f((size_t)n), *u = rand_f((size_t)n), *o = malloc(sizeof(float) * n);
        for (int i = 0; i < n; i++) g[i] *= 12.0f;
        td_swiglu(o, g, u, n);
        for (int i = 0; i < n; i++) {
            double want = g[i] / (1.0 + exp(-(double)g[i])) * u[i];
            if (!(fabs(o[i] - want) <= 1e-6 * fabs(want) + 1e-30)) {
                T_CHECK(0, "swiglu n=%d i=%d g=%g: %.9g vs %.9g", n, i, g[i], o[i], want);
                break;
            }
        }
        free(g); free(u); free(o);
    }
    t_end();
}

static void ref_attend(double *o, const float *q, int n, const float *K, const float *V, int ld, int hd, float scale) {
    double *s = malloc(sizeof(double) * n), mx = -INFINITY, sum = 0;
    for (int j = 0; j < n; j++) {
        double d = 0;
        for (int k = 0; k < hd; k++) d += (double)q[k] * K[(size_t)j * ld + k];
        s[j] = d * scale;
        if (s[j] > mx) mx = s[j];
    }
    for (int j = 0; j < n; j++) { s[j] = exp(s[j] - mx); sum += s[j]; }
    for (int d = 0; d < hd; d++) {
        double a = 0;
        for (int j = 0; j < n; j++) a += s[j] / sum * V[(size_t)j * ld + d];
        o[d] = a;
    }
    free(s);
}

static void test_attend(void) {
    tb("kernels_attend_vs_reference_and_invariance");
    static const int HDS[] = {8, 16, 24, 64, 80, 96, 128};
    for (int hi = 0; hi < 7; hi++) {
        int hd = HDS[hi], ld = 2 * hd + 3, nq = 7, maxn = 300;
        float *K = rand_f((size_t)maxn * ld), *V = rand_f((size_t)maxn * ld), *q = rand_f((size_t)nq * hd);
        for (int i = 0; i < nq * hd; i++) q[i] *= 3.0f;
        int nk[7] = {1, 2, 17, 33, 100, 257, 300};
        float *o = malloc(sizeof(float) * nq * hd), *o1 = malloc(sizeof(float) * hd), *o2 = malloc(sizeof(float) * 2 * hd);
        float *scr = malloc(sizeof(float) * (size_t)nq * (maxn + 16));
        double *r = malloc(sizeof(double) * hd);
        float scale = 1.0f / sqrtf((float)hd);
        td_attend(o, hd, q, hd, nq, nk, K, V, ld, hd, scale, scr);
        for (int i = 0; i < nq; i++) {
            ref_attend(r, q + (size_t)i * hd, nk[i], K, V, ld, hd, scale);
            for (int d = 0; d < hd; d++)
                if (!(fabs(o[(size_t)i * hd + d] - r[d]) <= 2e-6)) {
                    T_CHECK(0, "hd=%d query %d (n=%d) d=%d: %.9g vs %.9g", hd, i, nk[i], d, o[(size_t)i * hd + d], r[d]);
                    break;
                }
            td_attend(o1, hd, q + (size_t)i * hd, hd, 1, &nk[i], K, V, ld, hd, scale, scr);
            T_CHECK(memcmp(o1, o + (size_t)i * hd, sizeof(float) * hd) == 0, "hd=%d: query %d alone differs from among %d", hd, i, nq);
        }
        /* pairs (a decode's GQA pair: one block of two, the longer one's own keys after the shared ones) */
        for (int i = 0; i + 1 < nq; i++) {
            td_attend(o2, hd, q + (size_t)i * hd, hd, 2, &nk[i], K, V, ld, hd, scale, scr);
            T_CHECK(memcmp(o2, o + (size_t)i * hd, sizeof(float) * 2 * hd) == 0, "hd=%d: queries %d, %d as a pair differ", hd, i, i + 1);
        }
        /* K/V stored as bf16 / f16: the same bits as f32 attention over the
         * widened rows (the storage only changes what is loaded), alone or not */
        for (int kvt = TD_DTYPE_F16; kvt <= TD_DTYPE_BF16; kvt++) {
            size_t ne = (size_t)maxn * ld;
            uint16_t *Kh = malloc(2 * ne), *Vh = malloc(2 * ne);
            float *Kw = malloc(4 * ne), *Vw = malloc(4 * ne), *ow = malloc(sizeof(float) * nq * hd);
            td_from_f32(Kh, K, kvt, ne); td_from_f32(Vh, V, kvt, ne);
            td_to_f32(Kw, Kh, kvt, ne); td_to_f32(Vw, Vh, kvt, ne);
            td_attend(ow, hd, q, hd, nq, nk, Kw, Vw, ld, hd, scale, scr);
            td_attend_kv(o, hd, q, hd, nq, nk, Kh, Vh, kvt, ld, hd, scale, scr);
            T_CHECK(memcmp(o, ow, sizeof(float) * nq * hd) == 0, "hd=%d: %s K/V differ from f32 over the widened rows", hd, dtn(kvt));
            for (int i = 0; i < nq; i++) {
                td_attend_kv(o1, hd, q + (size_t)i * hd, hd, 1, &nk[i], Kh, Vh, kvt, ld, hd, scale, scr);
                T_CHECK(memcmp(o1, o + (size_t)i * hd, sizeof(float) * hd) == 0, "hd=%d %s: query %d alone differs", hd, dtn(kvt), i);
                if (i + 1 < nq) {
                    td_attend_kv(o2, hd, q + (size_t)i * hd, hd, 2, &nk[i], Kh, Vh, kvt, ld, hd, scale, scr);
                    T_CHECK(memcmp(o2, o + (size_t)i * hd, sizeof(float) * 2 * hd) == 0, "hd=%d %s: queries %d, %d as a pair differ", hd, dtn(kvt), i, i + 1);
                }
            }
            free(Kh); free(Vh); free(Kw); free(Vw); free(ow);
        }
        /* K/V stored as q8_0 (rows of whole blocks: hd and the stride multiples
         * of 32): the same bits as f32 attention over the dequantized rows */
        if (hd % 32 == 0) {
            int lq = hd; /* rows back to back, as in the cache: the last one ends the buffer */
            size_t ne = (size_t)maxn * lq;
            void *Kq = malloc(ne / 32 * 34), *Vq = malloc(ne / 32 * 34);
            float *Kw = malloc(4 * ne), *Vw = malloc(4 * ne), *ow = malloc(sizeof(float) * nq * hd);
            for (int j = 0; j < maxn; j++) /* K's rows of ld, restrided to lq */
                for (int d = 0; d < lq; d++) Kw[(size_t)j * lq + d] = K[(size_t)j * ld + d], Vw[(size_t)j * lq + d] = V[(size_t)j * ld + d];
            td_from_f32(Kq, Kw, TD_DTYPE_Q8_0, ne); td_from_f32(Vq, Vw, TD_DTYPE_Q8_0, ne);
            td_to_f32(Kw, Kq, TD_DTYPE_Q8_0, ne); td_to_f32(Vw, Vq, TD_DTYPE_Q8_0, ne);
            double qe = 0; /* the quantization moved the rows by at most half a step */
            for (size_t e = 0; e < ne; e++) {
                size_t j = e / lq, d = e % lq;
                double err = fabs((double)Kw[e] - K[j * ld + d]);
                qe = err > qe ? err : qe;
            }
            T_CHECK(qe > 0 && qe <= 0.6 / 127, "hd=%d: q8_0 rows moved by %.3g", hd, qe); /* d/2, d rounded to f16 */
            td_attend(ow, hd, q, hd, nq, nk, Kw, Vw, lq, hd, scale, scr);
            td_attend_kv(o, hd, q, hd, nq, nk, Kq, Vq, TD_DTYPE_Q8_0, lq, hd, scale, scr);
            T_CHECK(memcmp(o, ow, sizeof(float) * nq * hd) == 0, "hd=%d: q8_0 K/V differ from f32 over the dequantized rows", hd);
            for (int i = 0; i < nq; i++) {
                td_attend_kv(o1, hd, q + (size_t)i * hd, hd, 1, &nk[i], Kq, Vq, TD_DTYPE_Q8_0, lq, hd, scale, scr);
                T_CHECK(memcmp(o1, o + (size_t)i * hd, sizeof(float) * hd) == 0, "hd=%d q8_0: query %d alone differs", hd, i);
                if (i + 1 < nq) {
                    td_attend_kv(o2, hd, q + (size_t)i * hd, hd, 2, &nk[i], Kq, Vq, TD_DTYPE_Q8_0, lq, hd, scale, scr);
                    T_CHECK(memcmp(o2, o + (size_t)i * hd, sizeof(float) * 2 * hd) == 0, "hd=%d q8_0: queries %d, %d as a pair differ", hd, i, i + 1);
                }
            }
            free(Kq); free(Vq); free(Kw); free(Vw); free(ow);
        }
        free(K); free(V); free(q); free(o); free(o1); free(o2); free(scr); free(r);
    }
    t_end();
}

/* td_attend_b32 (the A32 order, kernels.h): on the path in force, the bits of
 * the portable emulation, each query's alone or among others, also with values
 * scaled near FLT_MIN and probabilities down to subnormal bf16 (the flushes of
 * the A32 steps); rows from max
 * n_keys on hold NaN (never read: a last odd key pairs with zeros); and close to
 * attention in double over the same bf16 queries, keys and values (the
 * probabilities' rounding to bf16 moves outputs by ~2^-9 of max |v|). */
static void test_attend_b32(void) {
    tb("kernels_attend_b32");
    static const int HDS[] = {32, 64, 96, 128};
    static const int NK[16] = {1, 2, 3, 17, 33, 64, 100, 101, 257, 300, 299, 5, 8, 31, 200, 150};
    int path = td_kernels_path();
    for (int hi = 0; hi < 4; hi++)
        for (int nq = 1; nq <= TD_ATTEND_QMAX; nq += hi + 4) {
            int hd = HDS[hi], ld = hd + 32 * (nq & 1), maxn = 0, nk[TD_ATTEND_QMAX];
            for (int i = 0; i < nq; i++) {
                nk[i] = NK[(i + hi) % 16];
                maxn = nk[i] > maxn ? nk[i] : maxn;
            }
            size_t ne = (size_t)(maxn + 1) * ld, ps = (size_t)(maxn + 1) & ~(size_t)1;
            float *K = rand_f(ne), *V = rand_f(ne), *q = rand_f((size_t)nq * hd);
            uint16_t *Kh = malloc(2 * ne), *Vh = malloc(2 * ne), *qh = malloc(2 * (size_t)nq * hd);
            float scale = 1.0f / sqrtf((float)hd);
            for (int i = 0; i < nq * hd; i++) q[i] *= 3.0f * scale;
            td_from_f32(Kh, K, TD_DTYPE_BF16, ne); td_from_f32(Vh, V, TD_DTYPE_BF16, ne);
            td_from_f32(qh, q, TD_DTYPE_BF16, (size_t)nq * hd);
            for (int d = 0; d < ld; d++) Kh[(size_t)maxn * ld + d] = Vh[(size_t)maxn * ld + d] = 0x7fc0; /* NaN */
            float *o = malloc(sizeof(float) * nq * hd), *op = malloc(sizeof(float) * nq * hd), *o1 = malloc(sizeof(float) * hd);
            float *sc = malloc(sizeof(float) * nq * ps);
            uint16_t *pr = malloc(2 * nq * ps);
            td_kernels_set_path(TD_KPATH_PORTABLE);
            td_attend_b32(op, hd, qh, hd, nq, nk, Kh, Vh, ld, hd, sc, pr);
            td_kernels_set_path(path);
            td_attend_b32(o, hd, qh, hd, nq, nk, Kh, Vh, ld, hd, sc, pr);
            T_CHECK(memcmp(o, op, sizeof(float) * nq * hd) == 0, "hd=%d nq=%d: %s differs from portable", hd, nq, td_kernels_path_name());
            /* values near FLT_MIN and probabilities down to subnormal bf16 (every flush of the A32 steps in play) */
            uint16_t *Vs = malloc(2 * ne), *qs = malloc(2 * (size_t)nq * hd);
            memcpy(Vs, Vh, 2 * ne), memcpy(qs, qh, 2 * (size_t)nq * hd);
            for (size_t i = 0; i < ne; i++) { /* x 2^-120, exponents that would fall below 1 -> signed zero */
                int e = Vh[i] >> 7 & 0xff;
                if (e != 0xff) Vh[i] = (uint16_t)(e > 120 ? Vh[i] - (120 << 7) : Vh[i] & 0x8000);
            }
            for (int i = 0; i < nq * hd; i++) qh[i] = (uint16_t)(qh[i] + (qh[i] & 0x7f80 ? 0x0280 : 0)); /* x 32 */
            float *ot = malloc(sizeof(float) * nq * hd), *otp = malloc(sizeof(float) * nq * hd);
            td_kernels_set_path(TD_KPATH_PORTABLE);
            td_attend_b32(otp, hd, qh, hd, nq, nk, Kh, Vh, ld, hd, sc, pr);
            td_kernels_set_path(path);
            int tiny = 0;
            for (int i = 0; i < nq * hd; i++) tiny += fabsf(otp[i]) < 0x1p-120f;
            td_attend_b32(ot, hd, qh, hd, nq, nk, Kh, Vh, ld, hd, sc, pr);
            T_CHECK(memcmp(ot, otp, sizeof(float) * nq * hd) == 0, "hd=%d nq=%d, tiny values: %s differs from portable", hd, nq,
                    td_kernels_path_name());
            T_CHECK(tiny > 0, "hd=%d nq=%d: the tiny case reached no output under 2^-120", hd, nq);
            free(ot); free(otp);
            memcpy(Vh, Vs, 2 * ne), memcpy(qh, qs, 2 * (size_t)nq * hd);
            free(Vs); free(qs);
            td_attend_b32(o, hd, qh, hd, nq, nk, Kh, Vh, ld, hd, sc, pr);
            float *qw = malloc(sizeof(float) * hd), *Kw = malloc(4 * ne), *Vw = malloc(4 * ne);
            double *r = malloc(sizeof(double) * hd), worst = 0;
            td_to_f32(Kw, Kh, TD_DTYPE_BF16, ne); td_to_f32(Vw, Vh, TD_DTYPE_BF16, ne);
            for (int i = 0; i < nq; i++) {
                td_attend_b32(o1, hd, qh + (size_t)i * hd, hd, 1, &nk[i], Kh, Vh, ld, hd, sc, pr);
                T_CHECK(memcmp(o1, o + (size_t)i * hd, sizeof(float) * hd) == 0, "hd=%d nq=%d: query %d alone differs", hd, nq, i);
                td_to_f32(qw, qh + (size_t)i * hd, TD_DTYPE_BF16, (size_t)hd);
                ref_attend(r, qw, nk[i], Kw, Vw, ld, hd, 1.0f);
                for (int d = 0; d < hd; d++) {
                    double e = fabs(o[(size_t)i * hd + d] - r[d]);
                    worst = e > worst || e != e ? e : worst;
                }
            }
            T_CHECK(worst <= 1e-2, "hd=%d nq=%d: %.3g from attention in double", hd, nq, worst);
            free(K); free(V); free(q); free(Kh); free(Vh); free(qh); free(o); free(op); free(o1); free(sc); free(pr);
            free(qw); free(Kw); free(Vw); free(r);
        }
    t_end();
}

/* td_from_f32 (the KV cache's write): bf16 and f16 round to nearest even, checked
 * on ties, overflow, subnormals, signed zero and NaN. */
static void test_from_f32(void) {
    tb("kernels_from_f32_rounding");
    uint16_t h[4];
    float f[4] = {1.0f + 1.0f / 256, 1.0f + 3.0f / 256, -(1.0f + 1.0f / 512), 3.4e38f};
    td_from_f32(h, f, TD_DTYPE_BF16, 4); /* ties to even (down, up), below half, overflow to inf */
    T_CHECK(h[0] == 0x3f80 && h[1] == 0x3f82 && h[2] == 0xbf80 && h[3] == 0x7f80, "bf16 %04x %04x %04x %04x", h[0], h[1], h[2], h[3]);
    f[0] = NAN; f[1] = -0.0f; f[2] = 1e-40f; f[3] = -INFINITY;
    td_from_f32(h, f, TD_DTYPE_BF16, 4);
    T_CHECK((h[0] & 0x7fc0) == 0x7fc0 && h[1] == 0x8000 && h[3] == 0xff80, "bf16 nan/zero/inf %04x %04x %04x", h[0], h[1], h[3]);
    T_CHECK(h[2] != 0 && fabsf(td_bf16_to_f32(h[2]) - 1e-40f) <= ldexpf(1.0f, -134), "bf16 subnormal kept (%04x)", h[2]);
    f[0] = 1.0f + 1.0f / 2048; f[1] = 65520.0f; f[2] = ldexpf(1.5f, -25); f[3] = NAN;
    td_from_f32(h, f, TD_DTYPE_F16, 4);
    T_CHECK(h[0] == 0x3c00 && h[1] == 0x7c00 && h[2] == 1 && (h[3] & 0x7e00) == 0x7e00, "f16 %04x %04x %04x %04x", h[0], h[1], h[2], h[3]);
    t_end();
}

/* ---- bf16 activations (td_matmul_bf16a, the B32 order) ---- */

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define HAVE_DPBF16_TEST 1
/* 16 lanes of the instruction itself: lane l = vdpbf16ps(acc[l], (x[2l], x[2l+1]), (w[2l], w[2l+1])) */
__attribute__((target("avx512f,avx512bf16"))) static void hw_dp16(float *out, const float *acc, const uint16_t *x,
                                                                  const uint16_t *w) {
    __m512 r = _mm512_dpbf16_ps(_mm512_loadu_ps(acc), (__m512bh)_mm512_loadu_si512(x), (__m512bh)_mm512_loadu_si512(w));
    _mm512_storeu_ps(out, r);
}
#endif

static float u2f(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
/* a bf16 of random sign and mantissa, biased exponent in [e0, e1] */
static uint16_t rbf(int e0, int e1) {
    uint32_t r = rnd32();
    return (uint16_t)(((r & 1) << 15) | ((uint32_t)(e0 + (int)((r >> 1) % (uint32_t)(e1 - e0 + 1))) << 7) | ((r >> 9) & 127));
}

/* One lane's inputs in class cls (0..5): ordinary magnitudes; cancellation (acc
 * = -x1*w1 within a few ulp); products in and below f32's subnormal range;
 * subnormal bf16 inputs and subnormal or tiny accumulators; arbitrary bit
 * patterns (overflow to inf, inf - inf); an accumulator at or just above
 * FLT_MIN in magnitude with products of 2^-160 .. 2^-144 (where x86's FTZ rule,
 * tininess after rounding to 24 bits, differs from "the result is subnormal").
 * a, b: the pair of x and of w. */
static void edge_pair(int cls, uint16_t *a, uint16_t *b, float *accl) {
    if (cls == 0) {
        for (int k = 0; k < 2; k++) { a[k] = rbf(100, 150); b[k] = rbf(100, 150); }
        *accl = u2f((rnd32() & 0x80000000u) | ((80 + rnd32() % 100) << 23) | (rnd32() & 0x7fffff));
    } else if (cls == 1) {
        for (int k = 0; k < 2; k++) { a[k] = rbf(118, 136); b[k] = rbf(118, 136); }
        *accl = -(td_bf16_to_f32(a[1]) * td_bf16_to_f32(b[1])) * (1.0f + (float)((int)(rnd32() % 64) - 32) * 1e-7f);
    } else if (cls == 2) {
        for (int k = 0; k < 2; k++) { a[k] = rbf(0, 70); b[k] = rbf(0, 70); }
        *accl = rnd32() & 1 ? 0.0f : u2f(rnd32() & 0x80ffffffu);
    } else if (cls == 3) {
        a[0] = (uint16_t)(rnd32() & 0x807f); b[0] = rbf(60, 190);
        a[1] = rbf(60, 140); b[1] = (uint16_t)(rnd32() & 0x807f);
        if (rnd32() & 1) { uint16_t t = a[1]; a[1] = b[1]; b[1] = t; }
        *accl = rnd32() & 1 ? u2f(rnd32() & 0x807fffffu)
                             : u2f((rnd32() & 0x80000000u) | ((1 + rnd32() % 60) << 23) | (rnd32() & 0x7fffff));
    } else if (cls == 4) {
        for (int k = 0; k < 2; k++) { a[k] = (uint16_t)rnd32(); b[k] = (uint16_t)rnd32(); }
        *accl = u2f(rnd32());
    } else {
        for (int k = 0; k < 2; k++) { /* biased exponents summing to 94 .. 110: products 2^-160 .. 2^-143 */
            int sum = 94 + (int)(rnd32() % 17), ea = 20 + (int)(rnd32() % 60);
            a[k] = rbf(ea, ea);
            b[k] = rbf(sum - ea, sum - ea);
        }
        if (rnd32() % 4 == 0) a[0] = 0;
        *accl = u2f((rnd32() & 0x80000000u) | (1u << 23) | (rnd32() % 4 == 0 ? rnd32() % 4 : 0));
    }
}

/* td_bf16_dp_lane against vdpbf16ps on this CPU: 2^21 lanes in the five classes
 * of edge_pair. Finite results must be equal bits, NaN where the instruction
 * gives NaN. */
static void test_dp_lane(void) {
    tb("kernels_bf16_dp_lane_equals_vdpbf16ps");
#ifdef HAVE_DPBF16_TEST
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx512bf16")) { printf("  (no AVX512_BF16 here: not compared)\n"); t_end(); return; }
    long bad = 0, n = 0, nan = 0;
    for (int it = 0; it < (1 << 17); it++) {
        float acc[16], hw[16];
        uint16_t x[32], w[32];
        int cls = it % 6;
        for (int l = 0; l < 16; l++) edge_pair(cls, x + 2 * l, w + 2 * l, &acc[l]);
        hw_dp16(hw, acc, x, w);
        for (int l = 0; l < 16; l++, n++) {
            float e = td_bf16_dp_lane(acc[l], x[2 * l], x[2 * l + 1], w[2 * l], w[2 * l + 1]);
            if (isnan(hw[l]) || isnan(e)) { nan++; bad += !(isnan(hw[l]) && isnan(e)); continue; }
            if (memcmp(&e, &hw[l], 4) != 0) {
                if (bad++ < 3)
                    printf("  acc=%a x=(%a, %a) w=(%a, %a): hw %a emu %a\n", acc[l], td_bf16_to_f32(x[2 * l]),
                           td_bf16_to_f32(x[2 * l + 1]), td_bf16_to_f32(w[2 * l]), td_bf16_to_f32(w[2 * l + 1]), hw[l], e);
            }
        }
    }
    T_CHECK(bad == 0, "%ld of %ld lanes differ (%ld NaN)", bad, n, nan);
    { /* the lanes where CPUs differ (kernels.c): a deviating CPU must not run td_matmul_bf16a on the instruction */
        float acc[16], hw[16];
        uint16_t x[32], w[32];
        td_bf16_probe_lanes(acc, x, w);
        hw_dp16(hw, acc, x, w);
        int same = 1;
        for (int l = 0; l < TD_BF16_PROBES; l++) {
            float e = td_bf16_dp_lane(acc[l], x[2 * l], x[2 * l + 1], w[2 * l], w[2 * l + 1]);
            /* exact sums just under FLT_MIN in magnitude: flushed, with the sign of the step that flushed */
            T_CHECK(e == 0.0f && !signbit(e) == (l == 1), "probe %d: the definition flushes to %s0 (%a)", l,
                    l == 1 ? "+" : "-", e);
            same &= memcmp(&e, &hw[l], 4) == 0;
        }
        printf("  this CPU's vdpbf16ps %s the definition on the probe lanes%s\n", same ? "matches" : "differs from",
               same ? "" : ": td_matmul_bf16a emulates");
        T_CHECK(same || !td_kernels_bf16_native(), "vdpbf16ps deviates here, so td_matmul_bf16a must run the emulation");
    }
    /* the emulation's three flushes, each one observable */
    T_CHECK(td_bf16_dp_lane(1.0f, 0x0001, 0, 0x3f80, 0) == 1.0f, "a subnormal bf16 input reads as zero");
    float r = td_bf16_dp_lane(0.0f, 0x2000, 0, 0x9f00, 0); /* 2^-63 * -2^-65 = -2^-128: subnormal -> -0 */
    T_CHECK(r == 0.0f && signbit(r), "a subnormal result flushes to a signed zero (%a)", r);
    /* x86's tininess after rounding to 24 bits: FLT_MIN + p with p = -2^-160 or the tie -2^-151 keeps
     * FLT_MIN; p = -1.5 * 2^-151 (exact sum under FLT_MIN - 2^-151) flushes although fmaf gives FLT_MIN */
    T_CHECK(td_bf16_dp_lane(0x1p-126f, 0, 0x9780, 0, 0x1780) == 0x1p-126f, "FLT_MIN - 2^-160 keeps FLT_MIN");
    T_CHECK(td_bf16_dp_lane(0x1p-126f, 0, 0x9a00, 0, 0x1980) == 0x1p-126f, "FLT_MIN - 2^-151 (a tie) keeps FLT_MIN");
    r = td_bf16_dp_lane(0x1p-126f, 0, 0x9a40, 0, 0x1980);
    T_CHECK(r == 0.0f && !signbit(r), "FLT_MIN - 1.5 * 2^-151 flushes to +0 (%a)", r);
    r = td_bf16_dp_lane(-0x1p-126f, 0x1a40, 0, 0x1980, 0); /* the same on the second fma, negative */
    T_CHECK(r == 0.0f && signbit(r), "-FLT_MIN + 1.5 * 2^-151 flushes to -0 (%a)", r);
#else
    printf("  (not an x86-64 GCC build: not compared)\n");
#endif
    t_end();
}

/* The B32 dot from its definition: the lanes of td_bf16_dp_lane, K zero-padded
 * to 32, then the D16 fold. */
static float ref_b32(const uint16_t *a, const uint16_t *w, int n) {
    float acc[16] = {0}, s8[8], s4[4], s2[2];
    for (int k = 0; k < n; k += 32)
        for (int l = 0; l < 16; l++) {
            int i = k + 2 * l;
            acc[l] = td_bf16_dp_lane(acc[l], i < n ? a[i] : 0, i + 1 < n ? a[i + 1] : 0, i < n ? w[i] : 0,
                                     i + 1 < n ? w[i + 1] : 0);
        }
    for (int i = 0; i < 8; i++) s8[i] = acc[i] + acc[i + 8];
    for (int i = 0; i < 4; i++) s4[i] = s8[i] + s8[i + 4];
    for (int i = 0; i < 2; i++) s2[i] = s4[i] + s4[i + 2];
    return s2[0] + s2[1];
}

/* td_matmul_bf16a on the path in force against ref_b32 on edge_pair's classes:
 * K = 64, the first 32-step sets each lane's accumulator (x = (0, bf16(acc)),
 * w = (0, 1)), the second runs the lane's class — so every flush of dp_lane is
 * exercised inside the kernel. Finite results equal bits, NaN where ref_b32 is. */
static void test_matmul_bf16a_edges(void) {
    tb("kernels_matmul_bf16a_edge_values_equal_b32_definition");
    enum { M = 8, N = 3, K = 64 }; /* 8 tokens: the fma tiles where td_kernels_bf16_fma (M >= 5) */
    long bad = 0, nan = 0;
    for (int it = 0; it < 6000; it++) {
        td_kernels_set_bf16_fma(it & 1); /* both ways of computing the 5+ token tiles */
        uint16_t x[M][K], w[N][K];
        for (int r = 0; r < M || r < N; r++)
            for (int l = 0; l < 16; l++) {
                uint16_t a[2], b[2], h;
                float acc;
                edge_pair(it % 6, a, b, &acc); /* one class per dot: a large lane would hide a flush */
                td_from_f32(&h, &acc, TD_DTYPE_BF16, 1);
                if (r < M) { x[r][2 * l] = 0; x[r][2 * l + 1] = h; x[r][32 + 2 * l] = a[0]; x[r][33 + 2 * l] = a[1]; }
                if (r < N) { w[r][2 * l] = 0; w[r][2 * l + 1] = 0x3f80; w[r][32 + 2 * l] = b[0]; w[r][33 + 2 * l] = b[1]; }
            }
        float y[M * N];
        td_matmul_bf16a(y, N, &x[0][0], K, M, &w[0][0], K, 0, N, 0);
        for (int m = 0; m < M; m++)
            for (int n = 0; n < N; n++) {
                float e = ref_b32(x[m], w[n], K), g = y[m * N + n];
                if (isnan(e) || isnan(g)) { nan++; bad += !(isnan(e) && isnan(g)); continue; }
                if (memcmp(&e, &g, 4) != 0 && bad++ < 3) printf("  it %d (%d,%d): %a vs %a\n", it, m, n, g, e);
            }
    }
    td_kernels_set_bf16_fma(-1);
    T_CHECK(bad == 0, "%ld of %d dots differ (%ld NaN)", bad, 6000 * M * N, nan);
    t_end();
}

/* td_matmul_bf16a on the path in force: every element equals ref_b32 (memcmp)
 * for M = 1..17, K not a multiple of 32 (and K long enough to be blocked), odd
 * N, split output ranges, add = 0 / 1; and it stays within bf16 rounding of the
 * exact product of the f32 activations (relative 2^-8 of the sum of |terms|). */
/* 1 when every y[m][n] (m < M, n < N, row stride N) of a product with bf16
 * activations lies within bf16 rounding (2^-8 relative to the sum of |terms|,
 * plus f32 summation) of the exact product of the unrounded f32 inputs xf with
 * bf16 weights W; else a failed check naming the first element off. */
static int bf16_act_close(const float *y, const float *xf, const uint16_t *W, int M, int N, int K) {
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            double mag, d = ref_dot(xf + (size_t)m * K, W + (size_t)n * K, TD_DTYPE_BF16, K, &mag);
            double tol = ldexp(1.0, -8) * mag + dot_tol(K, mag);
            if (!(fabs(y[(size_t)m * N + n] - d) <= tol)) {
                T_CHECK(0, "K=%d N=%d (%d,%d): %.9g vs exact %.9g (tol %.3g)", K, N, m, n, y[(size_t)m * N + n], d, tol);
                return 0;
            }
        }
    return 1;
}

static void test_matmul_bf16a(void) {
    tb("kernels_matmul_bf16a_equals_b32_definition");
    static const int KS[] = {1, 2, 31, 32, 33, 63, 100, 389, 2085};
    static const int NS[] = {1, 3, 8, 13, 37};
    for (int ki = 0; ki < (int)(sizeof KS / sizeof KS[0]); ki++)
        for (int ni = 0; ni < (int)(sizeof NS / sizeof NS[0]); ni++) {
            int K = KS[ki], N = NS[ni], MMAX = 17, ok = 1;
            if (K > 1000 && N > 13) continue;
            float *xf = rand_f((size_t)MMAX * K), *base = rand_f((size_t)MMAX * N);
            uint16_t *x = malloc(2 * (size_t)MMAX * K), *W = rand_w((size_t)N * K, TD_DTYPE_BF16);
            td_from_f32(x, xf, TD_DTYPE_BF16, (size_t)MMAX * K);
            float *y = malloc(sizeof(float) * MMAX * N), *r = malloc(sizeof(float) * MMAX * N);
            for (int m = 0; m < MMAX; m++)
                for (int n = 0; n < N; n++) r[(size_t)m * N + n] = ref_b32(x + (size_t)m * K, W + (size_t)n * K, K);
            for (int M = 1; M <= MMAX && ok; M++)
                for (int v = 0; v < 12 && ok; v++) { /* add 0 / 1; cached, streamed with and without
                                                         prefetch; vdpbf16ps or the fma tiles (bf16_fma) */
                    int add = v & 1, st = (v >> 1) % 3, fma = v / 6;
                    int sp = (M + add) % 3 ? N / 2 + 1 : 0;
                    memcpy(y, base, sizeof(float) * M * N);
                    td_kernels_set_bf16_fma(fma);
                    if (add) { /* the choice given per product (td_matmul_bf16a_pf), the global one the other */
                        td_kernels_set_hw_stream(st != 2);
                        td_matmul_bf16a_pf(y, N, x, K, M, W, K, 0, sp, add, st > 0, st == 2);
                        td_matmul_bf16a_pf(y, N, x, K, M, W, K, sp, N, add, st > 0, st == 2);
                    } else {
                        td_kernels_set_hw_stream(st == 2);
                        td_matmul_bf16a_stream(y, N, x, K, M, W, K, 0, sp, add, st > 0);
                        td_matmul_bf16a_stream(y, N, x, K, M, W, K, sp, N, add, st > 0);
                    }
                    td_kernels_set_hw_stream(-1);
                    td_kernels_set_bf16_fma(-1);
                    for (int i = 0; i < M * N && ok; i++) {
                        float e = add ? base[i] + r[i] : r[i];
                        if (memcmp(&e, y + i, 4) != 0) {
                            T_CHECK(0, "K=%d N=%d M=%d add=%d stream %d fma %d: element %d: %a vs %a", K, N, M, add, st, fma, i, y[i], e);
                            ok = 0;
                        }
                    }
                }
            if (ok) bf16_act_close(r, xf, W, MMAX, N, K);
            free(xf); free(base); free(x); free(W); free(y); free(r);
        }
    t_end();
}

/* The P24 layout (td_bf16p_*, nn/kernels.h): td_matmul_bf16p over a packed
 * copy gives exactly td_matmul_bf16a's bits for M = 1..17 (one token in
 * registers, blocks of up to 8 tokens, a block of 1 after 16), with add 0 and
 * 1, over output ranges that start and end inside panels (the plain tiles take
 * the rows outside whole panels), for K in one k-block, two, and a last short
 * one, and N with and without rows past the last panel. On a CPU where
 * td_kernels_p24() is 0 it must fall back to the plain tiles (same check).
 * The header: a copy for another shape, or no copy, is refused
 * (td_bf16p_check), and unpackable shapes have no size. */
static void test_matmul_bf16p(void) {
    tb("kernels_matmul_bf16p_equals_bf16a");
    static const int KS[] = {32, 96, 512, 544, 1056};
    static const int NS[] = {24, 47, 72, 100};
    T_CHECK(td_bf16p_bytes(24, 33) == 0 && td_bf16p_bytes(23, 64) == 0 && !td_bf16p_packable(24, 0), "unpackable shapes");
    T_CHECK(!td_bf16p_check(NULL, 24, 32), "no copy");
    for (int ki = 0; ki < (int)(sizeof KS / sizeof KS[0]); ki++)
        for (int ni = 0; ni < (int)(sizeof NS / sizeof NS[0]); ni++) {
            int K = KS[ki], N = NS[ni], MMAX = 17, ok = 1;
            float *xf = rand_f((size_t)MMAX * K), *base = rand_f((size_t)MMAX * N);
            uint16_t *x = malloc(2 * (size_t)MMAX * K), *W = rand_w((size_t)N * K, TD_DTYPE_BF16);
            td_from_f32(x, xf, TD_DTYPE_BF16, (size_t)MMAX * K);
            size_t pb = td_bf16p_bytes(N, K);
            void *pk = aligned_alloc(64, (pb + 63) & ~(size_t)63);
            float *y = malloc(sizeof(float) * MMAX * N), *r = malloc(sizeof(float) * MMAX * N);
            T_REQUIRE(pb > 0 && pk && y && r, "K=%d N=%d: size %zu", K, N, pb);
            td_bf16p_pack(pk, W, N, K);
            T_CHECK(td_bf16p_check(pk, N, K) && !td_bf16p_check(pk, N + 1, K) && !td_bf16p_check(pk, N, K + 32),
                    "K=%d N=%d: header", K, N);
            for (int M = 1; M <= MMAX && ok; M++)
                for (int v = 0; v < 6 && ok; v++) {
                    int add = v & 1, cut = v >> 1; /* ranges: whole; split at 8 / N-5; split in the middle */
                    int a = cut == 0 ? 0 : cut == 1 ? 8 : N / 2 + 1, b = cut == 1 ? N - 5 : N;
                    memcpy(r, base, sizeof(float) * M * N);
                    memcpy(y, base, sizeof(float) * M * N);
                    td_matmul_bf16a_pf(r, N, x, K, M, W, K, 0, N, add, 1, -1);
                    if (a) td_matmul_bf16p(y, N, x, K, M, pk, W, K, N, 0, a, add, 1, -1);
                    td_matmul_bf16p(y, N, x, K, M, pk, W, K, N, a, b, add, 1, -1);
                    if (b < N) td_matmul_bf16p(y, N, x, K, M, pk, W, K, N, b, N, add, 1, -1);
                    if (memcmp(r, y, sizeof(float) * M * N) != 0) {
                        T_CHECK(0, "K=%d N=%d M=%d add=%d cut=%d: bits differ (p24 %d)", K, N, M, add, cut, td_kernels_p24());
                        ok = 0;
                    }
                }
        done:
            free(xf); free(base); free(x); free(W); free(pk); free(y); free(r);
        }
    { /* a prefill's worth of tokens: more than one super-block of interleaved activations */
        int K = 96, N = 50, M = 530;
        float *xf = rand_f((size_t)M * K);
        uint16_t *x = malloc(2 * (size_t)M * K), *W = rand_w((size_t)N * K, TD_DTYPE_BF16);
        void *pk = aligned_alloc(64, (td_bf16p_bytes(N, K) + 63) & ~(size_t)63);
        float *y = calloc((size_t)M * N, sizeof(float)), *r = calloc((size_t)M * N, sizeof(float));
        if (xf && x && W && pk && y && r) {
            td_from_f32(x, xf, TD_DTYPE_BF16, (size_t)M * K);
            td_bf16p_pack(pk, W, N, K);
            td_matmul_bf16a_pf(r, N, x, K, M, W, K, 0, N, 0, 1, -1);
            td_matmul_bf16p(y, N, x, K, M, pk, W, K, N, 0, N, 0, 1, -1);
            T_CHECK(memcmp(r, y, sizeof(float) * (size_t)M * N) == 0, "M=%d: bits differ (p24 %d)", M, td_kernels_p24());
        } else T_CHECK(0, "out of memory");
        free(xf); free(x); free(W); free(pk); free(y); free(r);
    }
    t_end();
}

/* The AMX order (act_type amx), where this machine has AMX-BF16 tiles: the pack
 * layout is the one amx.h states; row m of a product has the same bits computed
 * with M = 1 or among M = 37 tokens (three token chunks: 2x2 blocks of 32 rows x
 * 32 tokens and single blocks), over any split of the output range (tails of
 * fewer than 16 rows, ranges not on a 16-row boundary), with add = 1 the bits
 * of base + the sum; and each element is within bf16
 * rounding of the exact product of the unrounded inputs. */
/* td_mm_fill_cols: a product's input filled column range by column range (the
 * gate/up job's chunks, each right after its swiglu) writes exactly the bytes a
 * fill by rows writes, in every layout that allows it: the AMX pairs (xp), the
 * R16 rows (xq), the bf16 rows (xa), and xq with xp together. Each range is
 * filled from a copy of x whose other columns are poisoned, in ascending order,
 * so a range that wrote outside its own columns would leave poison behind. */
static void test_mm_fill_cols(void) {
    tb("kernels_mm_fill_cols_equal_rows");
    static const int MS[] = {1, 3, 8, 16, 19};
    static const int KS[] = {32, 384, 1280};
    for (int lay = 0; lay < 4; lay++)
        for (int mi = 0; mi < 5 && (td_amx_available() || (lay != 0 && lay != 3)); mi++) /* xp: AMX pairs */
            for (int ki = 0; ki < 3; ki++) {
                int M = MS[mi], K = KS[ki], ldx = K + 7;
                float *x = rand_f((size_t)M * ldx), *xp = malloc(sizeof(float) * (size_t)M * ldx);
                size_t na = td_mm_xa_elems(M, K), nq = (size_t)M * td_q8r_row_bytes(K);
                uint16_t *a0 = aligned_alloc(64, (na * 2 + 63) / 64 * 64), *a1 = aligned_alloc(64, (na * 2 + 63) / 64 * 64);
                uint8_t *q0 = aligned_alloc(64, nq), *q1 = aligned_alloc(64, nq);
                memset(a0, 0xAB, na * 2); memset(a1, 0xCD, na * 2);
                memset(q0, 0xAB, nq); memset(q1, 0xAB, nq); /* the same padding past each row's K + K/4 bytes */
                td_mm_in r = {.x = x, .ldx = ldx, .M = M, .K = K, .xa_buf = a0, .xq_buf = q0};
                if (lay == 0 || lay == 3) r.xp = (const uint32_t *)(const void *)a0;
                if (lay == 1 || lay == 3) r.xq = q0;
                if (lay == 2) r.xa = a0;
                td_mm_fill(&r, 0, M);
                td_mm_in c = r;
                c.x = xp, c.xa_buf = a1, c.xq_buf = q1;
                if (c.xp) c.xp = (const uint32_t *)(const void *)a1;
                if (c.xq) c.xq = q1;
                if (c.xa) c.xa = a1;
                int rc = 0;
                for (int k0 = 0; k0 < K && !rc;) { /* ranges of 1..3 blocks of 32, ascending */
                    int k1 = k0 + 32 * (1 + (int)(rnd32() % 3));
                    if (k1 > K) k1 = K;
                    for (int m = 0; m < M; m++)
                        for (int k = 0; k < ldx; k++) xp[(size_t)m * ldx + k] = k >= k0 && k < k1 ? x[(size_t)m * ldx + k] : 1e30f;
                    rc = td_mm_fill_cols(&c, k0, k1);
                    k0 = k1;
                }
                T_CHECK(rc == 0, "fill_cols rc %d (layout %d)", rc, lay);
                T_CHECK(memcmp(a0, a1, na * 2) == 0 || !(r.xp || r.xa), "layout %d M %d K %d: the bf16 words differ", lay, M, K);
                T_CHECK(memcmp(q0, q1, nq) == 0 || !r.xq, "layout %d M %d K %d: the R16 rows differ", lay, M, K);
                free(x); free(xp); free(a0); free(a1); free(q0); free(q1);
            }
    { /* xi (one scale a row) refuses and writes nothing */
        uint8_t buf[64 * 4 + 64];
        memset(buf, 0x5A, sizeof buf);
        float xr[64] = {1};
        td_mm_in in = {.x = xr, .ldx = 64, .M = 1, .K = 64, .xi = (const uint32_t *)(const void *)buf, .xq_buf = buf};
        T_CHECK(td_mm_fill_cols(&in, 0, 32) == -1 && buf[0] == 0x5A && buf[sizeof buf - 1] == 0x5A, "xi: fill_cols must refuse");
    }
    t_end();
}

static void test_amx(void) {
    tb("kernels_amx_invariant_and_accurate");
    if (!td_amx_available()) {
        printf("  (no AMX-BF16 tiles here: the AMX order is not tested)\n");
        t_end();
        return;
    }
    static const int KS[] = {32, 96, 384, 1056};
    static const int NS[] = {1, 15, 16, 45, 77};
    enum { MMAX = 37 };
    uint32_t *xp = NULL, *x1 = NULL;
    float *xf = NULL, *y = NULL, *y1 = NULL, *base = NULL;
    uint16_t *W = NULL;
    {
        float v[2 * 32];
        uint32_t pk[32];
        for (int i = 0; i < 64; i++) v[i] = (float)(i + 1);
        td_amx_pack(pk, v, 32, 2, 32);
        /* token 1 of a chunk of 2, step 0, pair 5: elements 10 and 11 of row 1 */
        T_CHECK(pk[5 * 2 + 1] == ((uint32_t)f2bf(43.0f) | (uint32_t)f2bf(44.0f) << 16), "pack layout: %08x", pk[11]);
        T_CHECK(pk[0] == ((uint32_t)f2bf(1.0f) | (uint32_t)f2bf(2.0f) << 16), "pack layout: first word %08x", pk[0]);
    }
    { /* every word of 19 tokens (a chunk of 16 and one of 3) x 64, rounded as td_f32_to_bf16 rounds:
         ties, NaN (quieted), infinities, subnormals */
        enum { PM = 19, PK = 64 };
        float v[PM * PK];
        uint32_t pk[PM * PK / 2];
        static const uint32_t special[] = {0x3f808000u, 0x3f818000u, 0x7fc00001u, 0x7f800001u, 0xff800000u, 0x00000001u, 0x807fffffu, 0x7f7fffffu};
        for (int i = 0; i < PM * PK; i++) {
            uint32_t u = i % 7 == 0 ? special[(i / 7) % 8] : rnd32();
            memcpy(&v[i], &u, 4);
        }
        td_amx_pack(pk, v, PK, PM, PK);
        int bad = 0;
        for (int m = 0; m < PM; m++)
            for (int k = 0; k < PK; k += 2) {
                int c = m / 16, mc = c ? PM - 16 : 16;
                uint32_t want = td_f32_to_bf16(v[m * PK + k]) | (uint32_t)td_f32_to_bf16(v[m * PK + k + 1]) << 16;
                uint32_t got = pk[(size_t)c * 8 * PK + (size_t)(k / 32) * 16 * mc + (size_t)((k % 32) / 2) * mc + m % 16];
                bad += got != want;
            }
        T_CHECK(bad == 0, "pack: %d of %d words differ from td_f32_to_bf16's rounding in amx.h's layout", bad, PM * PK / 2);
    }
    for (int ki = 0; ki < (int)(sizeof KS / sizeof KS[0]); ki++)
        for (int ni = 0; ni < (int)(sizeof NS / sizeof NS[0]); ni++) {
            int K = KS[ki], N = NS[ni], ok = 1;
            xf = rand_f((size_t)MMAX * K);
            W = rand_w((size_t)N * K, TD_DTYPE_BF16);
            base = rand_f((size_t)MMAX * N);
            xp = malloc(4 * td_amx_pack_words(MMAX, K));
            x1 = malloc(4 * td_amx_pack_words(1, K));
            y = malloc(sizeof(float) * MMAX * N);
            y1 = malloc(sizeof(float) * N);
            T_REQUIRE(xf && W && base && xp && x1 && y && y1, "memory");
            td_amx_pack(xp, xf, K, MMAX, K);
            td_amx_matmul(y, N, xp, MMAX, W, K, 0, N, 0, 0);
            for (int m = 0; m < MMAX && ok; m++) {
                int sp = (m * 7) % (N + 1), pfe = m % 2 ? N : 0; /* two ranges split at any row; odd
                                                                     tokens prefetch as over streamed weights */
                td_amx_pack(x1, xf + (size_t)m * K, K, 1, K);
                td_amx_matmul(y1, N, x1, 1, W, K, 0, sp, 0, pfe);
                td_amx_matmul(y1, N, x1, 1, W, K, sp, N, 0, pfe);
                if (memcmp(y1, y + (size_t)m * N, sizeof(float) * N) != 0) {
                    T_CHECK(0, "K=%d N=%d: token %d alone (split at %d, pf_end %d) differs from among %d", K, N, m, sp, pfe, MMAX);
                    ok = 0;
                }
            }
            if (ok) ok = bf16_act_close(y, xf, W, MMAX, N, K);
            /* add = 1 over 20 tokens (a chunk and a tail chunk: one block at a time) and
             * over all 37 (32 of them in 2x2 blocks), a range from row 3 */
            float *ya = rand_f((size_t)MMAX * N);
            T_REQUIRE(ya != NULL, "memory");
            for (int M = 20; M <= MMAX && ok; M += MMAX - 20) {
                memcpy(ya, base, sizeof(float) * MMAX * N);
                int n0 = N > 3 ? 3 : 0;
                td_amx_pack(xp, xf, K, M, K); /* the layout depends on M: packed for M */
                td_amx_matmul(ya, N, xp, M, W, K, n0, N, 1, M == 20 ? N : 0);
                for (int i = 0; i < M * N && ok; i++) {
                    float e = i % N < n0 ? base[i] : base[i] + y[i];
                    if (memcmp(&e, ya + i, 4) != 0) {
                        T_CHECK(0, "K=%d N=%d M=%d add: element %d: %a vs %a", K, N, M, i, ya[i], e);
                        ok = 0;
                    }
                }
            }
            free(ya);
            free(xf); free(W); free(base); free(xp); free(x1); free(y); free(y1);
            xf = y = y1 = base = NULL; W = NULL; xp = x1 = NULL;
        }
done:
    free(xf); free(W); free(base); free(xp); free(x1); free(y); free(y1);
    t_end();
}

/* ---- td_amx_attend over the kv pair layouts (amx.h) ---- */

/* a standard normal deviate (Box-Muller) */
static double att_gauss(void) {
    double u1 = (rnd32() + 1.0) / 4294967296.0, u2 = rnd32() / 4294967296.0;
    return sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
}
/* n bf16 elements with fr elements of poison (bf16 NaN) on either side: a
 * tile load that strays past the interior by up to fr elements reads NaNs,
 * which reach the output (0 x NaN is NaN) and break its bits */
static uint16_t *att_framed(size_t n, size_t fr) {
    uint16_t *b = malloc(2 * (n + 2 * fr));
    if (!b) return NULL;
    for (size_t i = 0; i < n + 2 * fr; i++) b[i] = 0x7fc0;
    return b + fr;
}
static void att_unframe(uint16_t *b, size_t fr) { if (b) free(b - fr); }

/* sentinels: in o (the padding columns and a tail after the rows), and in the
 * scratch s and p (all of it, so that nothing may be read before written, and
 * a tail after them): NaN patterns that attend never writes */
enum { ATT_TAIL = 1024 }; /* elements after o, s, p: more than a row of either */
static const uint32_t ATT_FSENT = 0x7fa5a5a5u;
static const uint16_t ATT_HSENT = 0x7fa5;
/* td_amx_attend, after filling o, s and p with the sentinels; checks that o's
 * columns [hd, ldo) of its nq rows and the tails after o[nq*ldo], s[nq*np],
 * p[nq*np] still hold them (tile stores are invisible to ASan) */
static void att_call(float *o, int ldo, const uint16_t *q, int nq, const uint16_t *kp, const uint16_t *vp, int c0,
                     const uint16_t *kt, const uint16_t *vt, int hd, int nk, float *s, uint16_t *p) {
    size_t np = (size_t)(nk + 31) / 32 * 32, no = (size_t)nq * ldo, ns = (size_t)nq * np;
    for (size_t i = 0; i < no + ATT_TAIL; i++) memcpy(o + i, &ATT_FSENT, 4);
    for (size_t i = 0; i < ns + ATT_TAIL; i++) { memcpy(s + i, &ATT_FSENT, 4); p[i] = ATT_HSENT; }
    td_amx_attend(o, ldo, q, nq, kp, vp, c0, kt, vt, hd, nk, s, p);
    int bad = 0;
    for (size_t i = 0; i < no + ATT_TAIL; i++)
        if ((i >= no || i % (size_t)ldo >= (size_t)hd) && memcmp(o + i, &ATT_FSENT, 4) != 0) bad++;
    for (size_t i = ns; i < ns + ATT_TAIL; i++) bad += memcmp(s + i, &ATT_FSENT, 4) != 0 || p[i] != ATT_HSENT;
    T_CHECK(bad == 0, "hd=%d nk=%d nq=%d c0=%d: %d elements outside o's columns [0, hd) (ldo %d) or past s, p changed", hd,
            nk, nq, c0, bad, ldo);
}
/* rows [0, nq) of o (stride ldo) against rows [r0, r0 + nq) of want, bit for bit;
 * reports the first differing row */
static int att_same(const float *o, const float *want, int r0, int nq, int ldo, int hd, const char *what, int nk, int c0) {
    for (int i = 0; i < nq; i++)
        if (memcmp(o + (size_t)i * ldo, want + (size_t)(r0 + i) * ldo, sizeof(float) * hd) != 0) {
            int d = 0;
            while (memcmp(o + (size_t)i * ldo + d, want + (size_t)(r0 + i) * ldo + d, 4) == 0) d++;
            T_CHECK(0, "hd=%d nk=%d %s (c0=%d): query %d d=%d: %a, want %a", hd, nk, what, c0, r0 + i, d, o[(size_t)i * ldo + d],
                    want[(size_t)(r0 + i) * ldo + d]);
            return 0;
        }
    return 1;
}

/* td_amx_kv_put, td_amx_kp_at / td_amx_vp_at and td_amx_attend, where this
 * machine has AMX-BF16 tiles.
 *  1. Layout: kv_put stores bf16(k[d]) / bf16(v[d]) (td_f32_to_bf16: ties,
 *     signed zero, subnormals, overflow to inf) at kp_at / vp_at, positions at
 *     block and chunk edges, both lanes of a pair, written in either order and
 *     overwritten; every element of other positions keeps its sentinel. The
 *     index helpers are a bijection of (pos, d) onto the buffer and match
 *     amx.h's prose at a few points computed by hand.
 *  2. Accuracy against double-precision softmax attention over the same bf16
 *     q, k, v. Tolerance 2e-2 max_k |v_k[d]| + 1e-6: the probabilities are
 *     rounded to bf16 (8 significant bits: relative error <= 2^-8
 *     each, 2^-9 at the top of a binade), so o moves by at most 2^-8 sum_k p_k
 *     |v_k[d]| <= 2^-8 max_k |v_k[d]| (~3.9e-3); the scores are f32 sums of
 *     exact bf16 products (error <= hd 2^-24 sum |q_d k_d|: ~1e-6 relative in
 *     p for scores O(1), ~2e-3 at worst for the score-120 query at hd 256);
 *     exp, the f32 sum of up to 650 terms and 1/sum ~1e-5 relative, o's f32
 *     sums <= np 2^-24 sum p|v|. The whole stays under ~6e-3 max |v|, the
 *     tolerance three times that. Truncating p would also fit (2^-7): 6
 *     checks the rounding exactly. Some queries are aimed at one key (q a
 *     multiple of it: score ~12, one ~120 for exp's range) at the edges
 *     (first, last, the first position past the last whole chunk, the middle)
 *     so that one wrong position moves o by O(|v|), not O(|v| / nk).
 *  3. Split invariance: the same keys with the committed part [0, c0) in kp/vp
 *     and the rest in kt/vt, for every multiple of 32 below nk, give the bits
 *     of c0 = 0 (all in kt/vt). Every buffer is framed by NaN poison (the
 *     committed copy ends at c0, kp/vp of c0 = 0 are poison only), so a read
 *     of the wrong buffer or past its range breaks the bits.
 *  4. Query independence: each query's row alone (nq = 1) and among 3, 8,
 *     16, 21 or 32 (one tile group of queries or two) is the same bits.
 *  5. Keys and values of positions [nk, np) of the last chunk (large but
 *     finite: +-1e30) do not change a bit against zeros there.
 *  6. The probabilities are rounded to nearest even: n equal keys, values 1.
 * o rows are ldo = hd + 5 apart; its padding columns, the scratch's tails and
 * a tail after o must keep their sentinels. */
static void test_amx_attend(void) {
    tb("kernels_amx_attend");
    if (!td_amx_available()) {
        printf("  (no AMX-BF16 tiles here: td_amx_attend and td_amx_kv_put are not tested)\n");
        t_end();
        return;
    }
    /* 1. layout */
    {
        enum { CAP = 96, NPOS = 18 };
        static const int HDS[] = {32, 64, 128};
        /* pairs written in both orders (0 then 1, 15 then 14, ...), block / chunk edges, 16 and 95 twice */
        static const int POS[NPOS] = {0, 1, 15, 14, 16, 17, 31, 32, 47, 46, 95, 94, 50, 63, 64, 77, 16, 95};
        static const uint32_t special[] = {0x3f808000u, 0x3f818000u, 0x80000000u, 0x00000001u, 0x807fffffu, 0x7f7fffffu, 0xff7fffffu, 0x3f7fffffu};
        const uint16_t SENT = 0x7fbf; /* a NaN: never the rounding of a finite float */
        /* by hand from amx.h: key (pos 17, d 3, hd 64): block 1 (1024) + pair 1 (32) + key 1 (2) + lane 1;
           value (pos 33, d 5, hd 64): chunk 1 (2048) + pair 0 + dim 5 (10) + lane 1;
           value (pos 46, d 7, hd 64): chunk 1 (2048) + pair 7 (7 * 128) + dim 7 (14) + lane 0 */
        T_CHECK(td_amx_kp_at(17, 3, 64) == 1059 && td_amx_vp_at(33, 5, 64) == 2059 && td_amx_vp_at(46, 7, 64) == 2958 &&
                    td_amx_kp_at(95, 127, 128) == (size_t)CAP * 128 - 1 && td_amx_vp_at(95, 127, 128) == (size_t)CAP * 128 - 1,
                "index helpers: %zu %zu %zu %zu %zu", td_amx_kp_at(17, 3, 64), td_amx_vp_at(33, 5, 64), td_amx_vp_at(46, 7, 64),
                td_amx_kp_at(95, 127, 128), td_amx_vp_at(95, 127, 128));
        for (int hi = 0; hi < 3; hi++) {
            int hd = HDS[hi];
            size_t n = (size_t)CAP * hd;
            uint16_t *kp = malloc(2 * n), *vp = malloc(2 * n);
            float *kf = malloc(sizeof(float) * n), *vf = malloc(sizeof(float) * n); /* last written, by [pos][d] */
            int *kc = calloc(n, sizeof(int)), *vc = calloc(n, sizeof(int)), written[CAP] = {0};
            float k[128], v[128];
            T_REQUIRE(kp && vp && kf && vf && kc && vc, "memory");
            for (size_t i = 0; i < n; i++) kp[i] = vp[i] = SENT;
            for (int j = 0; j < NPOS; j++) {
                for (int d = 0; d < hd; d++)
                    for (int e = 0; e < 2; e++) {
                        uint32_t u;
                        do u = (d + 3 * j + e) % 5 == 0 ? special[(d + j + 4 * e) % 8] : rnd32();
                        while ((u & 0x7f800000u) == 0x7f800000u); /* finite */
                        memcpy(e ? &v[d] : &k[d], &u, 4);
                    }
                td_amx_kv_put(kp, vp, POS[j], k, v, hd);
                memcpy(kf + (size_t)POS[j] * hd, k, sizeof(float) * hd);
                memcpy(vf + (size_t)POS[j] * hd, v, sizeof(float) * hd);
                written[POS[j]] = 1;
            }
            int bad = 0, badk = 0, badv = 0;
            for (int pos = 0; pos < CAP; pos++)
                for (int d = 0; d < hd; d++) {
                    size_t ik = td_amx_kp_at(pos, d, hd), iv = td_amx_vp_at(pos, d, hd);
                    if (ik >= n || iv >= n) { bad++; continue; }
                    kc[ik]++;
                    vc[iv]++;
                    if (!written[pos]) continue;
                    uint16_t wk = td_f32_to_bf16(kf[(size_t)pos * hd + d]), wv_ = td_f32_to_bf16(vf[(size_t)pos * hd + d]);
                    if (kp[ik] != wk && badk++ < 3) T_CHECK(0, "hd=%d key pos %d d %d: %04x, want %04x", hd, pos, d, kp[ik], wk);
                    if (vp[iv] != wv_ && badv++ < 3) T_CHECK(0, "hd=%d value pos %d d %d: %04x, want %04x", hd, pos, d, vp[iv], wv_);
                }
            for (size_t i = 0; i < n; i++) bad += kc[i] != 1 || vc[i] != 1;
            T_CHECK(bad == 0, "hd=%d: td_amx_kp_at / td_amx_vp_at are not a bijection of %d positions x hd onto the buffer (%d)",
                    hd, CAP, bad);
            T_CHECK(badk == 0 && badv == 0, "hd=%d: %d keys, %d values differ from td_f32_to_bf16 at kp_at / vp_at", hd, badk, badv);
            /* elements of positions never written: the sentinel */
            int touched = 0;
            for (int pos = 0; pos < CAP; pos++)
                if (!written[pos])
                    for (int d = 0; d < hd; d++) {
                        size_t ik = td_amx_kp_at(pos, d, hd), iv = td_amx_vp_at(pos, d, hd);
                        if (ik < n && iv < n && (kp[ik] != SENT || vp[iv] != SENT) && touched++ < 3)
                            T_CHECK(0, "hd=%d: pos %d d %d (never written) changed: key %04x value %04x", hd, pos, d, kp[ik], vp[iv]);
                    }
            T_CHECK(touched == 0, "hd=%d: %d elements of positions never written changed", hd, touched);
            free(kp); free(vp); free(kf); free(vf); free(kc); free(vc);
        }
    }
    /* 2 - 5 */
    {
        /* QN = 32: two tile groups of queries (rows 0-15 and 16-31) sharing each K/V load */
        static const int HDS[] = {32, 64, 96, 128, 256}, NKS[] = {1, 16, 17, 31, 32, 33, 100, 650}, NQS[] = {1, 3, 8, 16, 21};
        enum { QN = 32 };
        double worst = 0, worst_rel = 0;
        long calls = 0;
        for (int hi = 0; hi < (int)(sizeof HDS / sizeof HDS[0]); hi++)
            for (int ni = 0; ni < (int)(sizeof NKS / sizeof NKS[0]); ni++) {
                int hd = HDS[hi], nk = NKS[ni], np = (nk + 31) / 32 * 32, ldo = hd + 5, cl = (nk - 1) / 32 * 32;
                size_t fr = (size_t)32 * hd, nl = (size_t)np * hd;
                int tg[4] = {nk - 1, 0, cl, nk / 2}; /* aimed-at keys of queries 3, 7, 11, 15 */
                uint16_t *K = att_framed(nl, fr), *V = att_framed(nl, fr), *P = att_framed(0, fr);
                uint16_t *kb = malloc(2 * nl), *vb = malloc(2 * nl), *q = malloc(2 * QN * (size_t)hd);
                float *kf = malloc(sizeof(float) * hd), *vf = malloc(sizeof(float) * hd);
                float *o16 = malloc(sizeof(float) * ((size_t)QN * ldo + ATT_TAIL)), *o = malloc(sizeof(float) * ((size_t)QN * ldo + ATT_TAIL));
                float *s = malloc(sizeof(float) * ((size_t)QN * np + ATT_TAIL));
                uint16_t *p = malloc(2 * ((size_t)QN * np + ATT_TAIL));
                double *sc = malloc(sizeof(double) * nk), *vmax = calloc((size_t)hd, sizeof(double));
                T_REQUIRE(K && V && P && kb && vb && q && kf && vf && o16 && o && s && p && sc && vmax, "memory");
                memset(K, 0, 2 * nl);
                memset(V, 0, 2 * nl);
                /* keys and values ~N(0, 1), stored last position first (a pair's odd lane before its even one) */
                for (int pos = nk - 1; pos >= 0; pos--) {
                    for (int d = 0; d < hd; d++) {
                        kf[d] = (float)att_gauss();
                        vf[d] = (float)att_gauss();
                        kb[(size_t)pos * hd + d] = td_f32_to_bf16(kf[d]);
                        vb[(size_t)pos * hd + d] = td_f32_to_bf16(vf[d]);
                        if (fabs(td_bf16_to_f32(vb[(size_t)pos * hd + d])) > vmax[d]) vmax[d] = fabs(td_bf16_to_f32(vb[(size_t)pos * hd + d]));
                    }
                    td_amx_kv_put(K, V, pos, kf, vf, hd);
                }
                /* queries ~N(0, 1) / sqrt(hd); 3, 7, 11: 12 / hd times a key (score ~12), 15: 120 / hd (~120) */
                for (int i = 0; i < QN; i++)
                    for (int d = 0; d < hd; d++) {
                        double x = i % 4 == 3 ? (i == 15 ? 120.0 : 12.0) / hd * td_bf16_to_f32(kb[(size_t)tg[i / 4 % 4] * hd + d])
                                              : att_gauss() / sqrt((double)hd);
                        q[(size_t)i * hd + d] = td_f32_to_bf16((float)x);
                    }
                /* all 32 queries, everything in kt / vt (c0 = 0; kp / vp poison): the baseline */
                att_call(o16, ldo, q, QN, P, P, 0, K, V, hd, nk, s, p);
                calls++;
                int bad = 0;
                for (int i = 0; i < QN; i++) {
                    const uint16_t *qi = q + (size_t)i * hd;
                    double mx = -INFINITY, sum = 0;
                    for (int k = 0; k < nk; k++) {
                        double t = 0;
                        for (int d = 0; d < hd; d++) t += (double)td_bf16_to_f32(qi[d]) * td_bf16_to_f32(kb[(size_t)k * hd + d]);
                        sc[k] = t;
                        if (t > mx) mx = t;
                    }
                    for (int k = 0; k < nk; k++) sum += (sc[k] = exp(sc[k] - mx));
                    for (int d = 0; d < hd; d++) {
                        double r = 0;
                        for (int k = 0; k < nk; k++) r += sc[k] * td_bf16_to_f32(vb[(size_t)k * hd + d]);
                        r /= sum;
                        double got = o16[(size_t)i * ldo + d], err = fabs(got - r), tol = 2e-2 * vmax[d] + 1e-6;
                        if (!(err <= tol) && bad++ < 3)
                            T_CHECK(0, "hd=%d nk=%d query %d d=%d: %.9g vs reference %.9g (error %.3g > %.3g)", hd, nk, i, d, got, r, err, tol);
                        if (err / tol > worst || err != err) worst = err != err ? INFINITY : err / tol;
                        if (vmax[d] > 0 && err / vmax[d] > worst_rel) worst_rel = err / vmax[d];
                    }
                }
                T_CHECK(bad == 0, "hd=%d nk=%d: %d elements past the tolerance", hd, nk, bad);
                /* 4. query independence: the first 1, 3, 8, 16, 21 queries, and each one alone */
                for (int j = 0; j < (int)(sizeof NQS / sizeof NQS[0]); j++) {
                    att_call(o, ldo, q, NQS[j], P, P, 0, K, V, hd, nk, s, p);
                    calls++;
                    att_same(o, o16, 0, NQS[j], ldo, hd, NQS[j] == 1 ? "first query alone" : "fewer queries", nk, 0);
                }
                for (int i = 0; i < QN; i++) {
                    att_call(o, ldo, q + (size_t)i * hd, 1, P, P, 0, K, V, hd, nk, s, p);
                    calls++;
                    if (!att_same(o, o16, i, 1, ldo, hd, "query alone", nk, 0)) break;
                }
                /* 3. split at every multiple of 32 below nk (the last one: cl), 32 queries and 3 */
                for (int pass = 0; pass < 2; pass++) {
                    /* 5. (pass 1) positions [nk, np): +-1e30 keys and values instead of zeros */
                    if (pass == 1) {
                        if (nk == np) break;
                        for (int d = 0; d < hd; d++) {
                            kf[d] = d % 3 ? 1e30f : -1e30f;
                            vf[d] = d % 5 ? -1e30f : 1e30f;
                        }
                        for (int pos = nk; pos < np; pos++) td_amx_kv_put(K, V, pos, kf, vf, hd);
                        att_call(o, ldo, q, QN, P, P, 0, K, V, hd, nk, s, p);
                        calls++;
                        att_same(o, o16, 0, QN, ldo, hd, "+-1e30 past nk", nk, 0);
                        att_call(o, ldo, q + 2 * (size_t)hd, 1, P, P, 0, K, V, hd, nk, s, p);
                        calls++;
                        att_same(o, o16, 2, 1, ldo, hd, "+-1e30 past nk, query alone", nk, 0);
                    }
                    for (int c0 = pass ? cl : 32; c0 > 0 && c0 < nk; c0 += 32) {
                        size_t nc = (size_t)c0 * hd, nt = nl - nc;
                        uint16_t *kc = att_framed(nc, fr), *vc = att_framed(nc, fr), *kt = att_framed(nt, fr), *vt = att_framed(nt, fr);
                        T_REQUIRE(kc && vc && kt && vt, "memory");
                        memcpy(kc, K, 2 * nc);
                        memcpy(vc, V, 2 * nc);
                        memcpy(kt, K + nc, 2 * nt); /* positions [c0, np): from element c0 * hd in both layouts */
                        memcpy(vt, V + nc, 2 * nt);
                        att_call(o, ldo, q, QN, kc, vc, c0, kt, vt, hd, nk, s, p);
                        calls++;
                        int ok = att_same(o, o16, 0, QN, ldo, hd, pass ? "split, +-1e30 past nk" : "split", nk, c0);
                        att_call(o, ldo, q + 5 * (size_t)hd, 3, kc, vc, c0, kt, vt, hd, nk, s, p);
                        calls++;
                        if (ok) att_same(o, o16, 5, 3, ldo, hd, pass ? "split, 3 queries, +-1e30 past nk" : "split, 3 queries", nk, c0);
                        att_unframe(kc, fr); att_unframe(vc, fr); att_unframe(kt, fr); att_unframe(vt, fr);
                        if (pass) break;
                    }
                }
                att_unframe(K, fr); att_unframe(V, fr); att_unframe(P, fr);
                free(kb); free(vb); free(q); free(kf); free(vf); free(o16); free(o); free(s); free(p); free(sc); free(vmax);
            }
        printf("  (%ld attend calls; largest error %.4f of the tolerance, %.2e of max |v|)\n", calls, worst, worst_rel);
    }
    /* 6. the probabilities are rounded to nearest, which the tolerance above cannot tell from truncation: n equal
     * keys and values all 1 give p = f32(1/n) for each, and o = n bf16(1/n) exactly (bf16 products, sums of n equal
     * terms exact here): n = 3: 1/3 ~ 0x3eaaaaab rounds up to 0x3eab = 171/512, o = 513/512 (truncated: 0x3eaa,
     * o = 510/512); n = 6: 0x3e2b = 171/1024, o = 513/512. */
    for (int n = 3; n <= 6; n += 3) {
        enum { HD = 64, NP = 32, LDO = HD + 5 };
        uint16_t K[NP * HD], V[NP * HD], q[3 * HD], p[3 * NP + ATT_TAIL], *P = att_framed(0, 32 * HD);
        float k[HD], v[HD], o[3 * LDO + ATT_TAIL], sc[3 * NP + ATT_TAIL];
        T_REQUIRE(P != NULL, "memory");
        memset(K, 0, sizeof K);
        memset(V, 0, sizeof V);
        for (int d = 0; d < HD; d++) { k[d] = (float)att_gauss(); v[d] = 1.0f; }
        for (int pos = 0; pos < n; pos++) td_amx_kv_put(K, V, pos, k, v, HD);
        for (int i = 0; i < 3 * HD; i++) q[i] = td_f32_to_bf16((float)(att_gauss() / 8));
        att_call(o, LDO, q, 3, P, P, 0, K, V, HD, n, sc, p);
        int bad = 0;
        for (int i = 0; i < 3; i++)
            for (int d = 0; d < HD; d++) bad += o[i * LDO + d] != 513.0f / 512;
        T_CHECK(bad == 0, "%d equal keys: %d outputs are not %d bf16(1/%d) = 513/512 (o[0] = %.9g)", n, bad, n, n, o[0]);
        att_unframe(P, 32 * HD);
    }
done:
    t_end();
}

/* td_amx_attend_rows: a target's causal attention over K/V in the pair
 * layouts, query i attending to keys [0, nk[i]). A verify block of 12 tokens of
 * a GQA-2 model (24 queries: two tile groups; nk = ctx + 1 + i / 2) over contexts across chunk
 * edges, positions from the last query's nk to the end of the buffer holding
 * +-1e30 (stale entries of rejected drafts: finite, never attended):
 *  1. each query's row equals, bit for bit, the query alone (nq = 1, its own
 *     nk) and td_amx_attend of it alone over [0, nk[i]) (the drafter's entry,
 *     c0 = its nk rounded up to 32): the other queries and their longer rows
 *     change nothing (batch invariance of the target's forward rests on it);
 *  2. against double-precision softmax attention over each query's own keys
 *     (the bf16 q, k, v), within td_amx_attend's tolerance (2e-2 max |v|): a
 *     query that saw a key past its nk (no causal mask) would take weight from
 *     a +-1e30 value. */
static void test_amx_attend_rows(void) {
    tb("kernels_amx_attend_rows");
    if (!td_amx_available()) {
        printf("  (no AMX-BF16 tiles here: td_amx_attend_rows is not tested)\n");
        t_end();
        return;
    }
    static const int HDS[] = {32, 64, 128}, CTX[] = {0, 9, 24, 31, 57, 300};
    enum { QN = 24 }; /* a GQA-3 verify block of 8: two tile groups of queries */
    int bad_inv = 0, bad_acc = 0;
    double worst = 0;
    for (int hi = 0; hi < 3; hi++)
        for (int ci = 0; ci < 6; ci++) {
            int hd = HDS[hi], ctx = CTX[ci], nk[QN], nmax = ctx + 1 + (QN - 1) / 2, np = (nmax + 31) / 32 * 32;
            int cap = np + 32, ldo = hd + 3;
            uint16_t *K = calloc((size_t)cap * hd, 2), *V = calloc((size_t)cap * hd, 2), *q = malloc(2 * (size_t)QN * hd);
            uint16_t *kb = malloc(2 * (size_t)cap * hd), *vb = malloc(2 * (size_t)cap * hd), *p = malloc(2 * (size_t)QN * cap);
            float *o = malloc(sizeof(float) * QN * ldo), *o1 = malloc(sizeof(float) * ldo), *o2 = malloc(sizeof(float) * ldo);
            float *s = malloc(sizeof(float) * (size_t)QN * cap), kf[128], vf[128];
            double *sc = malloc(sizeof(double) * cap), vmax = 0;
            T_REQUIRE(K && V && q && kb && vb && p && o && o1 && o2 && s && sc, "memory");
            for (int pos = 0; pos < cap; pos++) {
                for (int d = 0; d < hd; d++) {
                    int stale = pos >= nmax;
                    kf[d] = stale ? ((d + pos) % 2 ? 1e30f : -1e30f) : (float)att_gauss();
                    vf[d] = stale ? ((d + 3 * pos) % 2 ? 1e30f : -1e30f) : (float)att_gauss();
                    kb[(size_t)pos * hd + d] = td_f32_to_bf16(kf[d]);
                    vb[(size_t)pos * hd + d] = td_f32_to_bf16(vf[d]);
                    if (!stale && fabs(td_bf16_to_f32(vb[(size_t)pos * hd + d])) > vmax)
                        vmax = fabs(td_bf16_to_f32(vb[(size_t)pos * hd + d]));
                }
                td_amx_kv_put(K, V, pos, kf, vf, hd);
            }
            for (int i = 0; i < QN; i++) {
                nk[i] = ctx + 1 + i / 2;
                for (int d = 0; d < hd; d++) q[(size_t)i * hd + d] = td_f32_to_bf16((float)(att_gauss() * 2.0 / sqrt((double)hd)));
            }
            td_amx_attend_rows(o, ldo, q, QN, K, V, hd, nk, s, p);
            for (int i = 0; i < QN; i++) {
                const uint16_t *qi = q + (size_t)i * hd;
                td_amx_attend_rows(o1, ldo, qi, 1, K, V, hd, &nk[i], s, p);
                td_amx_attend(o2, ldo, qi, 1, K, V, (nk[i] + 31) / 32 * 32, NULL, NULL, hd, nk[i], s, p);
                if ((memcmp(o1, o + (size_t)i * ldo, sizeof(float) * hd) || memcmp(o2, o + (size_t)i * ldo, sizeof(float) * hd)) &&
                    bad_inv++ < 3)
                    T_CHECK(0, "hd=%d ctx=%d query %d (nk %d): among %d it differs from alone (%d) or from td_amx_attend (%d)", hd,
                            ctx, i, nk[i], QN, memcmp(o1, o + (size_t)i * ldo, sizeof(float) * hd) != 0,
                            memcmp(o2, o + (size_t)i * ldo, sizeof(float) * hd) != 0);
                double mx = -INFINITY, sum = 0;
                for (int k = 0; k < nk[i]; k++) {
                    double t = 0;
                    for (int d = 0; d < hd; d++) t += (double)td_bf16_to_f32(qi[d]) * td_bf16_to_f32(kb[(size_t)k * hd + d]);
                    sc[k] = t;
                    mx = t > mx ? t : mx;
                }
                for (int k = 0; k < nk[i]; k++) sum += (sc[k] = exp(sc[k] - mx));
                for (int d = 0; d < hd; d++) {
                    double r = 0;
                    for (int k = 0; k < nk[i]; k++) r += sc[k] * td_bf16_to_f32(vb[(size_t)k * hd + d]);
                    r /= sum;
                    double err = fabs(o[(size_t)i * ldo + d] - r), tol = 2e-2 * vmax + 1e-6;
                    if (!(err <= tol) && bad_acc++ < 3)
                        T_CHECK(0, "hd=%d ctx=%d query %d d=%d: %.9g vs reference %.9g", hd, ctx, i, d, o[(size_t)i * ldo + d], r);
                    if (err / tol > worst || err != err) worst = err != err ? INFINITY : err / tol;
                }
            }
            free(K); free(V); free(q); free(kb); free(vb); free(p); free(o); free(o1); free(o2); free(s); free(sc);
        }
done:
    T_CHECK(bad_inv == 0, "%d queries differ from themselves alone", bad_inv);
    T_CHECK(bad_acc == 0, "%d elements past the tolerance", bad_acc);
    printf("  (18 blocks of 16 queries; largest error %.3g of the tolerance)\n", worst);
    t_end();
}

/* ---- i8t: int8 weights and activations on AMX-INT8 tiles (nn/i8t.h) ---- */

/* the quantization rule of i8t.h, written out: q of x under scale s (s != 0) */
static int i8t_q(float x, float s) {
    float v = x / s;
    if (v > 127.0f) v = 127.0f;
    if (v < -127.0f) v = -127.0f;
    return (int)nearbyintf(v);
}
/* byte of token m, element k in the packed activations of M tokens of width K
 * (i8t.h's formula) */
static int8_t i8t_unpack(const uint32_t *xp, int M, int K, int m, int k) {
    int c = m / 16, mc = M - 16 * c < 16 ? M - 16 * c : 16;
    size_t w = (size_t)c * 16 * K / 4 + (size_t)(k / 64) * 16 * mc + (size_t)((k % 64) / 4) * mc + (size_t)(m % 16);
    int8_t b[4];
    memcpy(b, xp + w, 4);
    return b[k % 4];
}
/* q[k] / s of one row against the rule: scale amax / 127 (0 for a zero row,
 * or where that underflows: then q = 0), q by i8t_q, and |q s - x| <= s (0.5 +
 * 2^-16) (the half step, plus the f32 division's rounding of x / s) where s is
 * normal (a subnormal s is rounded coarsely: x / s may pass 127 and clamp);
 * returns the number of bad elements. */
static int i8t_row_ok(const char *what, int row, const float *x, int K, float s, int8_t (*qat)(const void *, int, int),
                      const void *ctx) {
    float amax = 0;
    for (int k = 0; k < K; k++) if (fabsf(x[k]) > amax) amax = fabsf(x[k]);
    float se = amax / 127.0f;
    if (memcmp(&s, &se, 4) != 0) {
        T_CHECK(0, "%s row %d: scale %a, want %a", what, row, s, se);
        return 1;
    }
    int bad = 0;
    for (int k = 0; k < K; k++) {
        int q = qat(ctx, row, k), want = s != 0.0f ? i8t_q(x[k], s) : 0;
        double err = fabs((double)q * s - x[k]);
        if (q != want || q < -127 || q > 127 || (s >= 0x1p-126f && err > s * (0.5 + ldexp(1.0, -16)))) {
            if (!bad) T_CHECK(0, "%s row %d k %d: x %a (s %a): q %d, want %d (error %.3g)", what, row, k, x[k], s, q, want, err);
            bad++;
        }
    }
    return bad;
}
typedef struct { const int8_t *q; int K; } i8t_wctx;
static int8_t i8t_wq(const void *c, int n, int k) { const i8t_wctx *w = c; return w->q[(size_t)n * w->K + k]; }
typedef struct { const uint32_t *xp; int M, K; } i8t_actx;
static int8_t i8t_aq(const void *c, int m, int k) { const i8t_actx *a = c; return i8t_unpack(a->xp, a->M, a->K, m, k); }

/* td_i8t_quantize (three dtypes, K across its 256-element chunks) and
 * td_i8t_act (19 tokens: a chunk of 16 and one of 3; rows ldx apart): scales,
 * values and ties (a row whose scale is exactly 1: x.5 rounds to even), zero
 * rows, and the packed layout read back by i8t.h's index formula. The act's
 * vector path multiplies by 1 / s and divides only near half-integers: a row
 * of values within ulps of them (scale ~0.3), a subnormal row (divided
 * throughout) and one whose scale underflows to 0 check that it rounds as
 * x / s does. On the vector path where the CPU has AMX-INT8, else the C one. */
static void test_i8t_quant(void) {
    tb("kernels_i8t_quantize_and_pack");
    static const float ties[] = {2.5f, 3.5f, -2.5f, -0.5f, 0.5f, 126.5f, -126.5f, 127.0f, 1.5f, -1.5f};
    enum { NT = (int)(sizeof ties / sizeof ties[0]) };
    { /* weights */
        enum { N = 6, K = 300 };
        for (int dt = 0; dt < 3; dt++) {
            void *W = rand_w((size_t)N * K, dt);
            float *wf = malloc(sizeof(float) * N * K), *s = malloc(sizeof(float) * N);
            int8_t *q = malloc((size_t)N * K);
            T_REQUIRE(W && wf && s && q, "memory");
            if (dt == TD_DTYPE_F32) { /* row 2 zero, row 4 the ties at scale 1 */
                memset((float *)W + 2 * K, 0, sizeof(float) * K);
                for (int k = 0; k < K; k++) ((float *)W)[4 * K + k] = ties[k % NT];
            } else {
                memset((uint16_t *)W + 2 * K, 0, 2 * K);
            }
            td_to_f32(wf, W, dt, (size_t)N * K);
            td_i8t_quantize(q, s, W, dt, N, K);
            i8t_wctx c = {q, K};
            int bad = 0;
            for (int n = 0; n < N; n++) bad += i8t_row_ok(dtn(dt), n, wf + (size_t)n * K, K, s[n], i8t_wq, &c);
            T_CHECK(bad == 0, "quantize %s: %d bad elements", dtn(dt), bad);
            T_CHECK(s[2] == 0.0f, "zero row: scale %a", s[2]);
            if (dt == TD_DTYPE_F32)
                T_CHECK(s[4] == 1.0f && q[4 * K] == 2 && q[4 * K + 1] == 4 && q[4 * K + 2] == -2 && q[4 * K + 3] == 0 &&
                            q[4 * K + 5] == 126 && q[4 * K + 8] == 2,
                        "ties: s %a q %d %d %d %d %d %d", s[4], q[4 * K], q[4 * K + 1], q[4 * K + 2], q[4 * K + 3], q[4 * K + 5],
                        q[4 * K + 8]);
            free(W); free(wf); free(s); free(q);
        }
    }
    { /* activations */
        enum { M = 19, K = 192, LDX = K + 5 };
        float *x = rand_f((size_t)M * LDX), xs[M];
        uint32_t *xp = malloc(4 * td_i8t_act_words(M, K));
        T_REQUIRE(x && xp, "memory");
        for (int k = 0; k < K; k++) {
            x[1 * LDX + k] = 0.0f;                          /* a zero row */
            x[17 * LDX + k] = ties[k % NT];                  /* ties, in the remainder chunk */
            x[5 * LDX + k] = ldexpf(x[5 * LDX + k], -100);   /* tiny */
            x[9 * LDX + k] = (float)(k % 50 - 25) * 0.3f + 0.15f; /* x / s within ulps of half-integers */
            x[11 * LDX + k] = ldexpf(x[11 * LDX + k], -140); /* subnormal: a subnormal scale, 1 / s not used */
            x[12 * LDX + k] = (k % 2 ? 60 : -60) * 0x1p-149f; /* max / 127 underflows: scale 0 */
        }
        x[9 * LDX + 7] = 127 * 0.3f;
        for (int k = 0; k < 64; k++) x[3 * LDX + k] = (float)(k - 32); /* row 3: scale 32/127 */
        td_i8t_act(xp, xs, x, LDX, M, K);
        i8t_actx c = {xp, M, K};
        int bad = 0;
        for (int m = 0; m < M; m++) bad += i8t_row_ok("act", m, x + (size_t)m * LDX, K, xs[m], i8t_aq, &c);
        T_CHECK(bad == 0, "act: %d bad elements", bad);
        T_CHECK(xs[1] == 0.0f && xs[17] == 1.0f && xs[12] == 0.0f && xs[11] > 0.0f && xs[11] < 0x1p-126f,
                "scales of the zero, ties, underflowing and subnormal rows: %a %a %a %a", xs[1], xs[17], xs[12], xs[11]);
        /* one word by hand: token 17 is token 1 of the remainder chunk (mc = 3), k = 64 + 16 .. 19 is step 1,
           quad 4: word 16*K/4 + 1*16*3 + 4*3 + 1; ties[(80 .. 83) % 10] = 2.5, 3.5, -2.5, -0.5 */
        int8_t b[4];
        memcpy(b, xp + 16 * K / 4 + 48 + 12 + 1, 4);
        T_CHECK(b[0] == 2 && b[1] == 4 && b[2] == -2 && b[3] == 0, "layout: %d %d %d %d", b[0], b[1], b[2], b[3]);
        /* M = 1: the same values, the layout of one token */
        uint32_t one[K / 4];
        float s1;
        td_i8t_act(one, &s1, x + 3 * LDX, LDX, 1, K);
        int diff = 0;
        for (int k = 0; k < K; k++) diff += i8t_unpack(one, 1, K, 0, k) != i8t_unpack(xp, M, K, 3, k);
        T_CHECK(diff == 0 && s1 == xs[3], "token 3 packed alone: %d values differ", diff);
        free(x); free(xp);
    }
done:
    t_end();
}

/* bytes usable up to `end`, where an inaccessible page starts: a tile load
 * past it faults (ASan does not see AMX loads) */
typedef struct { char *map, *end; size_t len; } guard_buf;
static int guard_open(guard_buf *g, size_t bytes) {
    size_t pg = (size_t)sysconf(_SC_PAGESIZE), body = (bytes + pg - 1) / pg * pg;
    g->len = body + pg;
    g->map = mmap(NULL, g->len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (g->map == MAP_FAILED) { g->map = NULL; return 0; }
    g->end = g->map + body;
    return mprotect(g->end, pg, PROT_NONE) == 0;
}
static void guard_close(guard_buf *g) { if (g->map) munmap(g->map, g->len); g->map = NULL; }

/* td_i8t_matmul against td_i8t_matmul_ref, bit for bit (memcmp of the whole
 * output, rows ldy = N + 3 apart, so nothing outside [n0, n1) may change):
 * ragged N (tails of rows), M (chunks and remainders), K, ranges not starting
 * at 0 or not on a 16-row boundary, add = 0 and 1; the weights include full-
 * scale rows so that dots pass 2^24 (their f32 conversion rounds). The tiles
 * read copies of the weights and activations that end at an inaccessible
 * page — weight row n1 - 1 the last readable one — so a load past either
 * faults. */
static void test_i8t_matmul(void) {
    tb("kernels_i8t_matmul_equals_reference");
    if (!td_i8t_available()) {
        printf("  (no AMX-INT8 tiles here: td_i8t_matmul is not tested)\n");
        t_end();
        return;
    }
    static const int NS[] = {1, 15, 16, 17, 40, 384}, MS[] = {1, 3, 8, 16, 17, 24, 40}, KS[] = {64, 384, 1280};
    enum { MMAX = 40 };
    long calls = 0;
    for (int ki = 0; ki < 3; ki++)
        for (int ni = 0; ni < 6; ni++) {
            int K = KS[ki], N = NS[ni], ldy = N + 3, bad = 0;
            float *wf = rand_f((size_t)N * K), *x = rand_f((size_t)MMAX * K), *ws = malloc(sizeof(float) * N), xs[MMAX];
            int8_t *qw = malloc((size_t)N * K);
            uint32_t *xp = malloc(4 * td_i8t_act_words(MMAX, K));
            float *base = rand_f((size_t)MMAX * ldy), *y = malloc(sizeof(float) * MMAX * ldy), *r = malloc(sizeof(float) * MMAX * ldy);
            guard_buf gq = {0}, gx = {0};
            T_REQUIRE(wf && x && ws && qw && xp && base && y && r, "memory");
            T_REQUIRE(guard_open(&gq, (size_t)N * K) && guard_open(&gx, 4 * td_i8t_act_words(MMAX, K)), "guarded memory");
            for (int k = 0; k < K; k++) { /* row 0 all +1, token 0 all +1: dot 127^2 K; token 2 alternating */
                wf[k] = 1.0f;
                x[k] = 1.0f;
                x[2 * K + k] = k % 3 ? 1.0f : -1.0f;
            }
            td_i8t_quantize(qw, ws, wf, TD_DTYPE_F32, N, K);
            for (int mi = 0; mi < 7; mi++) {
                int M = MS[mi];
                td_i8t_act(xp, xs, x, K, M, K);
                int rg[3][2] = {{0, N}, {N > 16 ? 16 : N / 2, N}, {N / 3, N - N / 5}};
                for (int g = 0; g < 3; g++)
                    for (int add = 0; add < 2; add++) {
                        int n0 = rg[g][0], n1 = rg[g][1];
                        int8_t *qg = (int8_t *)gq.end - (size_t)n1 * K;
                        uint32_t *xg = (uint32_t *)(void *)(gx.end - 4 * td_i8t_act_words(M, K));
                        memcpy(qg, qw, (size_t)n1 * K);
                        memcpy(xg, xp, 4 * td_i8t_act_words(M, K));
                        memcpy(y, base, sizeof(float) * MMAX * ldy);
                        memcpy(r, base, sizeof(float) * MMAX * ldy);
                        td_i8t_matmul(y, ldy, xg, xs, M, qg, ws, K, n0, n1, add);
                        td_i8t_matmul_ref(r, ldy, xp, xs, M, qw, ws, K, n0, n1, add);
                        calls++;
                        if (memcmp(y, r, sizeof(float) * MMAX * ldy) != 0) {
                            int i = 0;
                            while (memcmp(y + i, r + i, 4) == 0) i++;
                            if (bad++ < 3)
                                T_CHECK(0, "K=%d N=%d M=%d [%d,%d) add=%d: element (%d,%d) %a vs ref %a", K, N, M, n0, n1, add,
                                        i / ldy, i % ldy, y[i], r[i]);
                        }
                    }
            }
            T_CHECK(bad == 0, "K=%d N=%d: %d products differ from the reference", K, N, bad);
            guard_close(&gq);
            guard_close(&gx);
            free(wf); free(x); free(ws); free(qw); free(xp); free(base); free(y); free(r);
        }
    printf("  (%ld products compared)\n", calls);
done:
    t_end();
}

/* The quantized product against the exact product of the unquantized inputs
 * (double), element by element, within the worst case of i8t.h's rule: with
 * e = 0.5 + 2^-16 (half a step, plus the f32 division's rounding), each x[k]
 * and w[k] is off by at most e xs and e ws, so sum_k x w is off by at most
 *   e ws sum|x| + e xs sum|w| + K e^2 xs ws,
 * and the f32 conversion and two multiplies add at most 3 roundings of the
 * result's magnitude (<= sum (|x| + e xs)(|w| + e ws)): 4 * 2^-24 of that.
 * A bound, not an estimate: any element past it is a bug. Weights of three
 * dtypes (td_i8t_quantize's conversion); on the tiles where the CPU has them,
 * else td_i8t_matmul_ref. The largest error as a share of the bound is printed. */
static void test_i8t_accuracy(void) {
    tb("kernels_i8t_close_to_f32_product");
    static const int SH[][3] = {{8, 40, 384}, {17, 33, 1280}, {1, 16, 64}};
    int tiles = td_i8t_available();
    double worst = 0, rel_rms = 0;
    for (int dt = 0; dt < 3; dt++)
        for (int si = 0; si < 3; si++) {
            int M = SH[si][0], N = SH[si][1], K = SH[si][2], bad = 0;
            void *W = rand_w((size_t)N * K, dt);
            float *x = rand_f((size_t)M * K), *wf = malloc(sizeof(float) * N * K), *ws = malloc(sizeof(float) * N);
            float *xs = malloc(sizeof(float) * M), *y = malloc(sizeof(float) * M * N);
            int8_t *qw = malloc((size_t)N * K);
            uint32_t *xp = malloc(4 * td_i8t_act_words(M, K));
            T_REQUIRE(W && x && wf && ws && xs && y && qw && xp, "memory");
            td_to_f32(wf, W, dt, (size_t)N * K);
            td_i8t_quantize(qw, ws, W, dt, N, K);
            td_i8t_act(xp, xs, x, K, M, K);
            (tiles ? td_i8t_matmul : td_i8t_matmul_ref)(y, N, xp, xs, M, qw, ws, K, 0, N, 0);
            const double e = 0.5 + ldexp(1.0, -16);
            double se = 0, sy = 0;
            for (int m = 0; m < M; m++)
                for (int n = 0; n < N; n++) {
                    const float *xr = x + (size_t)m * K, *wr = wf + (size_t)n * K;
                    double ex = 0, ax = 0, aw = 0, mag = 0, dx = e * xs[m], dw = e * ws[n];
                    for (int k = 0; k < K; k++) {
                        ex += (double)xr[k] * wr[k];
                        ax += fabs(xr[k]);
                        aw += fabs(wr[k]);
                        mag += (fabs(xr[k]) + dx) * (fabs(wr[k]) + dw);
                    }
                    double tol = dw * ax + dx * aw + K * dx * dw + 4 * ldexp(1.0, -24) * mag;
                    double err = fabs(y[m * N + n] - ex);
                    if (err / tol > worst) worst = err / tol;
                    se += err * err;
                    sy += ex * ex;
                    if (!(err <= tol) && bad++ < 3)
                        T_CHECK(0, "%s M=%d N=%d K=%d (%d,%d): %.9g vs exact %.9g, error %.3g > bound %.3g", dtn(dt), M, N, K, m, n,
                                y[m * N + n], ex, err, tol);
                }
            if (sqrt(se / sy) > rel_rms) rel_rms = sqrt(se / sy);
            free(W); free(x); free(wf); free(ws); free(xs); free(y); free(qw); free(xp);
        }
    printf("  (%s: largest error %.3f of the bound; rms error / rms result up to %.4f)\n", tiles ? "tiles" : "reference",
           worst, rel_rms);
done:
    t_end();
}

/* Products of amx.c (bf16) and i8t.c (int8) interleaved on one thread, with
 * shapes that need different tile configurations (token counts 3, 5, 8, 24,
 * 32, 37; row tails; amx.c's 2x2 blocks, which use tiles 6 and 7 that i8t's
 * configuration leaves unconfigured): each output has the bits it has alone —
 * amx.c's computed first on a fresh thread, i8t's by td_i8t_matmul_ref.
 * amx.c keeps the shape it last loaded in thread-local statics and reloads
 * only when its own next shape differs, so each amx product runs twice with
 * an i8t product between (the second run finds its cached shape, valid only if
 * td_i8t_matmul put the thread's configuration back; for the 2x2 shape a
 * failure is a SIGILL), and each i8t shape runs again after an amx product
 * (i8t must not trust a cache of its own). The schedule runs on this thread
 * (both modules used before) and on a fresh thread that starts with i8t. */
enum { IA_N = 4, II_N = 4, IA_CALLS = 3 * IA_N * 4 };
/* one product shape, with two inputs (v = 0, 1) so that a run which leaves
 * part of y to stale scratch cannot match by reusing the previous run's */
typedef struct {
    int M, N, K;
    uint16_t *W;
    uint32_t *xp[2];
    float *y, *want[2];
} ia_amx;
typedef struct {
    int M, N, K, n0;
    int8_t *qw;
    float *ws, *xs[2], *y, *want[2];
    uint32_t *xp[2];
} ia_i8t;
typedef struct { ia_amx *a; ia_i8t *q; int bad; const char *last; } ia_job;
static void *ia_amx_alone(void *arg) {
    ia_job *j = arg;
    for (int i = 0; i < IA_N; i++)
        for (int v = 0; v < 2; v++) {
            ia_amx *a = &j->a[i];
            td_amx_matmul(a->want[v], a->N, a->xp[v], a->M, a->W, a->K, 0, a->N, 0, 0);
        }
    return NULL;
}
static void ia_run_i8t(ia_job *j, ia_i8t *q, int v) {
    memset(q->y, 0, sizeof(float) * q->M * q->N);
    td_i8t_matmul(q->y, q->N, q->xp[v], q->xs[v], q->M, q->qw, q->ws, q->K, q->n0, q->N, 0);
    if (memcmp(q->y, q->want[v], sizeof(float) * q->M * q->N) != 0 && j->bad++ < 4) {
        T_CHECK(0, "i8t M=%d N=%d K=%d after %s: differs from the reference", q->M, q->N, q->K, j->last);
        fflush(stdout);
    }
    j->last = "i8t";
}
static void ia_run_amx(ia_job *j, ia_amx *a, int v) {
    memset(a->y, 0, sizeof(float) * a->M * a->N);
    td_amx_matmul(a->y, a->N, a->xp[v], a->M, a->W, a->K, 0, a->N, 0, a->M % 2 ? a->N : 0);
    if (memcmp(a->y, a->want[v], sizeof(float) * a->M * a->N) != 0 && j->bad++ < 4) {
        T_CHECK(0, "amx M=%d N=%d K=%d after %s: differs from its bits alone", a->M, a->N, a->K, j->last);
        fflush(stdout); /* before a SIGILL, if a later 2x2 product meets an i8t configuration */
    }
    j->last = "amx";
}
static void *ia_schedule(void *arg) {
    ia_job *j = arg;
    for (int r = 0; r < 3; r++)
        for (int i = 0; i < IA_N; i++) {
            ia_run_i8t(j, &j->q[(i + r) % II_N], 0);
            ia_run_amx(j, &j->a[i], 0);
            ia_run_i8t(j, &j->q[(i + r + 1) % II_N], 1);
            ia_run_amx(j, &j->a[i], 1);
        }
    return NULL;
}
static void test_i8t_amx_interleaved(void) {
    tb("kernels_i8t_amx_interleaved_one_thread");
    if (!td_amx_available() || !td_i8t_available()) {
        printf("  (AMX-BF16 or AMX-INT8 tiles missing here: not tested)\n");
        t_end();
        return;
    }
    static const int AS[IA_N][3] = {{8, 32, 384}, {3, 48, 384}, {37, 64, 96}, {32, 64, 96}};
    static const int QS[II_N][4] = {{3, 17, 384, 0}, {8, 40, 384, 16}, {24, 33, 128, 5}, {8, 16, 1280, 0}};
    ia_amx a[IA_N];
    ia_i8t q[II_N];
    memset(a, 0, sizeof a);
    memset(q, 0, sizeof q);
    int ok = 1;
    for (int i = 0; i < IA_N; i++) {
        ia_amx *p = &a[i];
        p->M = AS[i][0]; p->N = AS[i][1]; p->K = AS[i][2];
        p->W = rand_w((size_t)p->N * p->K, TD_DTYPE_BF16);
        p->y = malloc(sizeof(float) * p->M * p->N);
        ok = ok && p->W && p->y;
        for (int v = 0; v < 2; v++) {
            float *x = rand_f((size_t)p->M * p->K);
            p->xp[v] = malloc(4 * td_amx_pack_words(p->M, p->K));
            p->want[v] = malloc(sizeof(float) * p->M * p->N);
            ok = ok && x && p->xp[v] && p->want[v];
            if (ok) td_amx_pack(p->xp[v], x, p->K, p->M, p->K);
            free(x);
        }
    }
    for (int i = 0; i < II_N; i++) {
        ia_i8t *p = &q[i];
        p->M = QS[i][0]; p->N = QS[i][1]; p->K = QS[i][2]; p->n0 = QS[i][3];
        float *wf = rand_f((size_t)p->N * p->K);
        p->qw = malloc((size_t)p->N * p->K);
        p->ws = malloc(sizeof(float) * p->N);
        p->y = malloc(sizeof(float) * p->M * p->N);
        ok = ok && wf && p->qw && p->ws && p->y;
        if (ok) td_i8t_quantize(p->qw, p->ws, wf, TD_DTYPE_F32, p->N, p->K);
        for (int v = 0; v < 2; v++) {
            float *x = rand_f((size_t)p->M * p->K);
            p->xs[v] = malloc(sizeof(float) * p->M);
            p->xp[v] = malloc(4 * td_i8t_act_words(p->M, p->K));
            p->want[v] = calloc((size_t)p->M * p->N, sizeof(float));
            ok = ok && x && p->xs[v] && p->xp[v] && p->want[v];
            if (ok) {
                td_i8t_act(p->xp[v], p->xs[v], x, p->K, p->M, p->K);
                td_i8t_matmul_ref(p->want[v], p->N, p->xp[v], p->xs[v], p->M, p->qw, p->ws, p->K, p->n0, p->N, 0);
            }
            free(x);
        }
        free(wf);
    }
    T_REQUIRE(ok, "memory");
    ia_job j = {a, q, 0, "nothing"};
    pthread_t th;
    T_REQUIRE(pthread_create(&th, NULL, ia_amx_alone, &j) == 0 && pthread_join(th, NULL) == 0, "thread");
    ia_schedule(&j);
    T_CHECK(j.bad == 0, "this thread: %d of %d products differ from their bits alone", j.bad, IA_CALLS);
    j.bad = 0;
    j.last = "nothing";
    T_REQUIRE(pthread_create(&th, NULL, ia_schedule, &j) == 0 && pthread_join(th, NULL) == 0, "thread");
    T_CHECK(j.bad == 0, "a fresh thread: %d of %d products differ from their bits alone", j.bad, IA_CALLS);
done:
    for (int i = 0; i < IA_N; i++) {
        free(a[i].W); free(a[i].y);
        for (int v = 0; v < 2; v++) { free(a[i].xp[v]); free(a[i].want[v]); }
    }
    for (int i = 0; i < II_N; i++) {
        free(q[i].qw); free(q[i].ws); free(q[i].y);
        for (int v = 0; v < 2; v++) { free(q[i].xs[v]); free(q[i].xp[v]); free(q[i].want[v]); }
    }
    t_end();
}

/* Every function on path `path` and on the portable path: the same bits, on
 * random inputs of ragged sizes (and exp over its whole clamped range, tails,
 * infinities and NaN). Leaves the portable path in force. */
#define ON(p, stmt) do { td_kernels_set_path(p); stmt; } while (0)
static const char *PNAME[TD_KPATH_COUNT] = {[TD_KPATH_PORTABLE] = "portable", [TD_KPATH_AVX512] = "avx512", [TD_KPATH_AVX2] = "avx2",
                                           [TD_KPATH_NEON] = "neon"};

static void test_path_equal(int path) {
    char nm[64];
    snprintf(nm, sizeof nm, "kernels_%s_equals_portable", PNAME[path]);
    t_begin(nm);
    const int P = TD_KPATH_PORTABLE;
    static const int KS[] = {1, 5, 8, 16, 23, 33, 100, 129, 389};
    static const int NS[] = {1, 2, 3, 4, 5, 8, 13, 37};
    for (int dt = 0; dt < 3; dt++) {
        /* dot, rmsnorm, to_f32 */
        for (int si = 0; si < NSIZES; si++) {
            int n = SIZES[si];
            float *a = rand_f((size_t)n), *oa = malloc(sizeof(float) * n), *op = malloc(sizeof(float) * n);
            void *w = rand_w((size_t)n, dt);
            float da, dp;
            ON(path, da = dt == TD_DTYPE_F32 ? td_dot(a, w, n) : dt == TD_DTYPE_BF16 ? td_dot_bf16(a, w, n) : td_dot_f16(a, w, n));
            ON(P, dp = dt == TD_DTYPE_F32 ? td_dot(a, w, n) : dt == TD_DTYPE_BF16 ? td_dot_bf16(a, w, n) : td_dot_f16(a, w, n));
            T_CHECK(memcmp(&da, &dp, 4) == 0, "dot %s n=%d: %.9g vs %.9g", dtn(dt), n, da, dp);
            ON(path, td_rmsnorm(oa, a, w, dt, n, 1e-5f));
            ON(P, td_rmsnorm(op, a, w, dt, n, 1e-5f));
            T_CHECK(memcmp(oa, op, sizeof(float) * n) == 0, "rmsnorm %s n=%d differs", dtn(dt), n);
            ON(path, td_to_f32(oa, w, dt, (size_t)n));
            ON(P, td_to_f32(op, w, dt, (size_t)n));
            T_CHECK(memcmp(oa, op, sizeof(float) * n) == 0, "to_f32 %s n=%d differs", dtn(dt), n);
            free(a); free(oa); free(op); free(w);
        }
        /* matmul: every M up to 9, split and unsplit output ranges, add = 0 and 1 */
        for (int ki = 0; ki < (int)(sizeof KS / sizeof KS[0]); ki++)
            for (int ni = 0; ni < (int)(sizeof NS / sizeof NS[0]); ni++) {
                int K = KS[ki], N = NS[ni];
                float *x = rand_f((size_t)9 * K), *base = rand_f((size_t)9 * N);
                void *W = rand_w((size_t)N * K, dt);
                float *ya = malloc(sizeof(float) * 9 * N), *yp = malloc(sizeof(float) * 9 * N);
                for (int M = 1; M <= 9; M++)
                    for (int add = 0; add < 2; add++) {
                        memcpy(ya, base, sizeof(float) * M * N);
                        memcpy(yp, base, sizeof(float) * M * N);
                        int sp = (M + add) % 3 ? N / 2 : 0;
                        ON(path, td_matmul(ya, N, x, K, M, W, dt, K, 0, sp, add); td_matmul(ya, N, x, K, M, W, dt, K, sp, N, add));
                        ON(P, td_matmul(yp, N, x, K, M, W, dt, K, 0, N, add));
                        if (memcmp(ya, yp, sizeof(float) * M * N) != 0) {
                            T_CHECK(0, "matmul %s K=%d N=%d M=%d add=%d differs", dtn(dt), K, N, M, add);
                            M = 10;
                            break;
                        }
                    }
                free(x); free(base); free(W); free(ya); free(yp);
            }
    }
    /* RoPE: every even length from 2 to 260 (vector bodies and scalar tails of
     * each path), against the portable path and, on it, against the definition
     * (each product rounded, then one subtraction or addition: no fma) */
    for (int hd = 2; hd <= 260; hd += 2) {
        int half = hd / 2;
        float *v = rand_f((size_t)hd), *cs = rand_f((size_t)half), *sn = rand_f((size_t)half);
        float *a = malloc(sizeof(float) * hd), *p = malloc(sizeof(float) * hd);
        memcpy(a, v, sizeof(float) * hd);
        memcpy(p, v, sizeof(float) * hd);
        ON(path, td_rope(a, cs, sn, hd));
        ON(P, td_rope(p, cs, sn, hd));
        T_CHECK(memcmp(a, p, sizeof(float) * hd) == 0, "rope hd=%d differs between paths", hd);
        for (int i = 0; i < half; i++) {
            volatile float xc = v[i] * cs[i], ys = v[i + half] * sn[i], yc = v[i + half] * cs[i], xs = v[i] * sn[i];
            float w0 = xc - ys, w1 = yc + xs;
            if (memcmp(&p[i], &w0, 4) != 0 || memcmp(&p[i + half], &w1, 4) != 0) {
                T_CHECK(0, "rope hd=%d i=%d: %a %a, want %a %a", hd, i, p[i], p[i + half], w0, w1);
                break;
            }
        }
        free(v); free(cs); free(sn); free(a); free(p);
    }
    /* exp (including the clamped tails, infinities, NaN) and swiglu */
    {
        enum { N = 4099 };
        float *x = malloc(sizeof(float) * N), *a = malloc(sizeof(float) * N), *p = malloc(sizeof(float) * N), *u = rand_f(N);
        for (int i = 0; i < N; i++) x[i] = -110.0f + 210.0f * (float)i / (N - 1);
        x[5] = INFINITY; x[6] = -INFINITY; x[7] = NAN; x[8] = -0.0f; x[9] = -103.9f; x[10] = 88.7f;
        for (int n = 1; n <= N; n += n < 40 ? 1 : 997) {
            ON(path, td_exp(a, x, n));
            ON(P, td_exp(p, x, n));
            T_CHECK(memcmp(a, p, sizeof(float) * n) == 0, "exp n=%d differs between paths", n);
        }
        for (int i = 0; i < N; i++) x[i] *= 0.2f;
        x[7] = 0.5f;
        for (int n = 1; n <= N; n += n < 40 ? 1 : 997) {
            ON(path, td_swiglu(a, x, u, n));
            ON(P, td_swiglu(p, x, u, n));
            T_CHECK(memcmp(a, p, sizeof(float) * n) == 0, "swiglu n=%d differs between paths", n);
        }
        free(x); free(a); free(p); free(u);
    }
    /* attention: head dims with and without a multiple of 16, ragged key counts */
    static const int HDS[] = {8, 16, 24, 40, 64, 80, 96, 128}; /* 96: a last 32 dimensions (q8_0: one block) */
    for (int hi = 0; hi < (int)(sizeof HDS / sizeof HDS[0]); hi++) {
        int hd = HDS[hi], ld = hd * 2 + 1, maxn = 200;
        enum { NQ = 21 }; /* more than one query block of every path, and a remainder */
        int nk[NQ] = {1, 5, 7, 8, 9, 16, 17, 33, 77, 200, 3, 64, 65, 150, 199, 2, 31, 32, 100, 128, 129};
        float *K = rand_f((size_t)maxn * ld), *V = rand_f((size_t)maxn * ld), *q = rand_f((size_t)NQ * hd);
        for (int i = 0; i < NQ * hd; i++) q[i] *= 3.0f;
        float *oa = malloc(sizeof(float) * NQ * hd), *op = malloc(sizeof(float) * NQ * hd);
        float *scr = malloc(sizeof(float) * TD_ATTEND_QMAX * (size_t)(maxn + 16)); /* kernels.h: min(nq, QMAX) x max n */
        ON(path, td_attend(oa, hd, q, hd, NQ, nk, K, V, ld, hd, 0.125f, scr));
        ON(P, td_attend(op, hd, q, hd, NQ, nk, K, V, ld, hd, 0.125f, scr));
        T_CHECK(memcmp(oa, op, sizeof(float) * NQ * hd) == 0, "attend hd=%d differs between paths", hd);
        for (int kvt = TD_DTYPE_F16; kvt <= TD_DTYPE_BF16; kvt++) { /* K/V stored as f16 / bf16 */
            void *Kh = rand_w((size_t)maxn * ld, kvt), *Vh = rand_w((size_t)maxn * ld, kvt);
            ON(path, td_attend_kv(oa, hd, q, hd, NQ, nk, Kh, Vh, kvt, ld, hd, 0.125f, scr));
            ON(P, td_attend_kv(op, hd, q, hd, NQ, nk, Kh, Vh, kvt, ld, hd, 0.125f, scr));
            T_CHECK(memcmp(oa, op, sizeof(float) * NQ * hd) == 0, "attend %s K/V hd=%d differs between paths", dtn(kvt), hd);
            free(Kh); free(Vh);
        }
        if (hd % 32 == 0) { /* q8_0 K/V: rows of whole blocks (a stride that is a multiple of 32) */
            int lq = 2 * hd;
            void *Kq = rand_q8((size_t)maxn * lq), *Vq = rand_q8((size_t)maxn * lq);
            ON(path, td_attend_kv(oa, hd, q, hd, NQ, nk, Kq, Vq, TD_DTYPE_Q8_0, lq, hd, 0.125f, scr));
            ON(P, td_attend_kv(op, hd, q, hd, NQ, nk, Kq, Vq, TD_DTYPE_Q8_0, lq, hd, 0.125f, scr));
            T_CHECK(memcmp(oa, op, sizeof(float) * NQ * hd) == 0, "attend q8_0 K/V hd=%d differs between paths", hd);
            free(Kq); free(Vq);
        }
        free(K); free(V); free(q); free(oa); free(op); free(scr);
    }
    /* the KV write's rounding, on ragged lengths; values of every magnitude
     * (random bit patterns: subnormals, overflow, NaN, inf) */
    for (int dt = 0; dt < 3; dt++)
        for (int n = 1; n <= 1100; n += n < 40 ? 1 : 353) {
            uint32_t *x = malloc(4 * (size_t)n);
            for (int i = 0; i < n; i++) {
                float v = ldexpf(frand(), (int)(rnd32() % 48) - 30); /* around f16's range */
                if (i % 3) memcpy(&x[i], &v, 4);
                else x[i] = rnd32();
            }
            uint16_t *ha = malloc(4 * (size_t)n), *hp = malloc(4 * (size_t)n);
            ON(path, td_from_f32(ha, (const float *)x, dt, (size_t)n));
            ON(P, td_from_f32(hp, (const float *)x, dt, (size_t)n));
            T_CHECK(memcmp(ha, hp, (dt == TD_DTYPE_F32 ? 4 : 2) * (size_t)n) == 0, "from_f32 %s n=%d differs between paths", dtn(dt), n);
            free(x); free(ha); free(hp);
        }
    td_kernels_set_path(P);
    t_end();
}

/* td_panel16_addmv against its definition (one fmaf per term, k ascending,
 * from y) and td_argmax against the scalar loop it replaces (ties to the first,
 * NaN never chosen past index 0, -0 and +0 equal), on every path the CPU has. */
static void test_panel_argmax(void) {
    t_begin("panel16_addmv_and_argmax_every_path");
    static const int KS[] = {1, 7, 32, 33};
    static const int NS[] = {1, 15, 16, 17, 100, 1024};
    for (int p = 0; p < TD_KPATH_COUNT; p++) {
        if (p != TD_KPATH_PORTABLE && !td_kernels_supported(p)) continue;
        td_kernels_set_path(p);
        for (int dt = 0; dt < 3; dt++)
            for (int ki = 0; ki < 4; ki++)
                for (int ni = 0; ni < 6; ni++) {
                    int K = KS[ki], N = NS[ni];
                    void *W = rand_w((size_t)N * K, dt);
                    float *x = rand_f((size_t)K), *y = rand_f((size_t)N), *ref = malloc(sizeof(float) * N);
                    float *wp = malloc(sizeof(float) * td_panel16_elems(K, N));
                    for (int n = 0; n < N; n++) {
                        float a = y[n];
                        for (int k = 0; k < K; k++) {
                            float w;
                            if (dt == TD_DTYPE_F32) w = ((float *)W)[(size_t)n * K + k];
                            else if (dt == TD_DTYPE_BF16) w = td_bf16_to_f32(((uint16_t *)W)[(size_t)n * K + k]);
                            else w = td_f16_to_f32(((uint16_t *)W)[(size_t)n * K + k]);
                            a = fmaf(x[k], w, a);
                        }
                        ref[n] = a;
                    }
                    td_panel16_pack(wp, W, dt, K, N);
                    td_panel16_addmv(y, wp, x, K, N);
                    T_CHECK(memcmp(y, ref, sizeof(float) * N) == 0, "panel16 %s path %s K=%d N=%d differs", dtn(dt), PNAME[p], K, N);
                    free(W); free(x); free(y); free(ref); free(wp);
                }
        for (int n = 1; n <= 200; n += n < 40 ? 1 : 37)
            for (int c = 0; c < 6; c++) {
                float *x = rand_f((size_t)n);
                if (c == 1) for (int i = 0; i < n; i++) x[i] = (float)(i % 3); /* ties: the first 2 */
                if (c == 2) { x[0] = NAN; }                                   /* NaN at 0: stays 0 */
                if (c == 3) for (int i = 1; i < n; i += 5) x[i] = NAN;        /* NaNs skipped */
                if (c == 4) { for (int i = 0; i < n; i++) x[i] = -1.0f; x[n / 2] = -0.0f; x[n - 1] = 0.0f; }
                if (c == 5) for (int i = 0; i < n; i++) x[i] = -INFINITY;
                int b = 0;
                for (int j = 1; j < n; j++) if (x[j] > x[b]) b = j;
                int got = td_argmax(x, n);
                T_CHECK(got == b, "argmax path %s n=%d case %d: %d, expected %d", PNAME[p], n, c, got, b);
                free(x);
            }
    }
    td_kernels_set_path(TD_KPATH_PORTABLE);
    t_end();
}

int main(void) {
    int best = td_kernels_path();
    printf("  kernel path: %s\n", td_kernels_path_name());
    test_dot();
    test_matmul();
    test_matmul_large();
    test_threads();
    test_pool_chunks();
    test_default_threads();
    test_llc_cap();
    test_hwsel();
    test_exp();
    test_norm_swiglu();
    test_attend();
    test_attend_b32();
    test_from_f32();
    test_dp_lane();
    test_matmul_bf16a();
    test_matmul_bf16a_edges();
    test_matmul_bf16p();
    test_mm_fill_cols();
    test_amx();
    test_amx_attend();
    test_amx_attend_rows();
    test_i8t_quant();
    test_i8t_matmul();
    test_i8t_accuracy();
    test_i8t_amx_interleaved();
    test_panel_argmax();
    /* every other path the CPU supports: the same bits as portable, and the
     * reference comparison again on it */
    for (int p = 0; p < TD_KPATH_COUNT; p++) {
        if (p != TD_KPATH_PORTABLE && !td_kernels_supported(p)) {
            printf("  (%s path not supported here: not compared)\n", PNAME[p]);
            continue;
        }
        if (p != TD_KPATH_PORTABLE) test_path_equal(p);
        if (p == best) continue;
        td_kernels_set_path(p);
        static char suf[32];
        snprintf(suf, sizeof suf, "_%s", PNAME[p]);
        g_suffix = suf;
        printf("  kernel path: %s\n", td_kernels_path_name());
        test_dot();
        test_matmul();
        test_matmul_large();
        test_attend();
        test_attend_b32();
        test_matmul_bf16a();
        test_matmul_bf16p();
    test_matmul_bf16a_edges();
    }
    td_kernels_set_path(best);
    return t_exit();
}
