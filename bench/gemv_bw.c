/* bench/gemv_bw.c — how much of the machine's read bandwidth the batch-1
 * matrix-vector product (decode) reaches, and what the weight layout has to do
 * with it. In one process, rounds alternate (thread pool of T threads, the
 * engine's td_pool):
 *   read   — a STREAM-like sum over a buffer as large as the weights;
 *   gemv   — td_matmul with M = 1 over [N][K] bf16 weights (the engine's 1x8
 *            register tile: 8 rows read side by side, 8 streams per thread);
 *   packed — the same FMAs in the same order over a copy of the weights whose
 *            8-row groups are interleaved in 64-byte pieces (row r of a group,
 *            elements k..k+31, at (k/32)*512 + r*64), so a thread reads one
 *            linear stream; its outputs are checked equal (memcmp) to gemv's.
 * Prints one JSON object: median GB/s of each and the medians of gemv/read and
 * packed/read over the rounds (each round's ratios use that round's read).
 * On this project's 2-core EPYC VM (2026-12-03) gemv reached ~0.7-0.8 of read
 * when read measured 60-80 GB/s and ~1.0 when it measured ~35 GB/s; packed
 * ~0.86-0.91 and ~1.1 (bench/forward-notes.md).
 * Build and run (from the repository root, after make):
 *   cc -std=c11 -O2 -march=native -Iinclude -Isrc bench/gemv_bw.c build/libtandem.a -o /tmp/gemv_bw \
 *      -lpcre2-8 -lutf8proc -lcjson -lmicrohttpd -lm -pthread
 *   /tmp/gemv_bw [N=585728] [K=1024] [THREADS=2] [ROUNDS=10]     (AVX-512 machines) */
#define _GNU_SOURCE
#include "nn/kernels.h"
#include "nn/pool.h"
#include "tandem.h"
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef __AVX512F__
int main(void) {
    fprintf(stderr, "gemv_bw: needs an AVX-512 build (-march=native on an AVX-512 machine)\n");
    return 2;
}
#else
#include "bw.h"

typedef struct {
    const uint16_t *W, *P; /* [N][K] row-major; the same, 8-row groups interleaved */
    const float *x;        /* [K] */
    float *y, *yp;         /* [N]: gemv's, packed's */
    int K, N;
} job;

static void gemv_run(void *arg, int i, int n) {
    job *j = arg;
    int g = j->N / 8, g0 = g * i / n, g1 = g * (i + 1) / n;
    td_matmul(j->y, j->N, j->x, j->K, 1, j->W, TD_DTYPE_BF16, j->K, g0 * 8, g1 * 8, 0);
}

/* kernels.h's D16 fold */
static float fold16(__m512 v) {
    __m256 lo = _mm512_castps512_ps256(v), hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
    __m256 a = _mm256_add_ps(lo, hi);
    __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    __m128 c = _mm_add_ps(b, _mm_movehl_ps(b, b));
    return _mm_cvtss_f32(_mm_add_ss(c, _mm_movehdup_ps(c)));
}
static __m512 bf16x16(const uint16_t *p) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
}
/* 8 outputs per group, one 16-lane accumulator each, k ascending by 16: the D16
 * dot of td_matmul, reading the group's 8 x K values as one linear stream */
static void packed_run(void *arg, int i, int n) {
    job *j = arg;
    int g = j->N / 8, g0 = g * i / n, g1 = g * (i + 1) / n, K = j->K;
    for (int q = g0; q < g1; q++) {
        const uint16_t *w = j->P + (size_t)q * 8 * K;
        __m512 a[8];
        for (int r = 0; r < 8; r++) a[r] = _mm512_setzero_ps();
        for (int k = 0; k < K; k += 32, w += 256) {
            __m512 x0 = _mm512_loadu_ps(j->x + k), x1 = _mm512_loadu_ps(j->x + k + 16);
            for (int r = 0; r < 8; r++) a[r] = _mm512_fmadd_ps(x0, bf16x16(w + 32 * r), a[r]);
            for (int r = 0; r < 8; r++) a[r] = _mm512_fmadd_ps(x1, bf16x16(w + 32 * r + 16), a[r]);
        }
        for (int r = 0; r < 8; r++) j->yp[q * 8 + r] = fold16(a[r]);
    }
}

int main(int argc, char **argv) {
    int N = argc > 1 ? atoi(argv[1]) : 585728, K = argc > 2 ? atoi(argv[2]) : 1024;
    int T = argc > 3 ? atoi(argv[3]) : 2, R = argc > 4 ? atoi(argv[4]) : 10;
    if (N < 8 || N % 8 || K < 32 || K % 32 || T < 1 || T > 64 || R < 1 || R > 1000) {
        fprintf(stderr, "gemv_bw: N a multiple of 8, K a multiple of 32, 1 <= THREADS <= 64, 1 <= ROUNDS <= 1000\n");
        return 2;
    }
    size_t nw = (size_t)N * K, bytes = nw * 2;
    uint16_t *W = bw_big(bytes), *P = bw_big(bytes);
    uint64_t *buf = bw_big(bytes);
    float *x = malloc(sizeof(float) * (size_t)K), *y = malloc(sizeof(float) * (size_t)N), *yp = malloc(sizeof(float) * (size_t)N);
    double *rd = malloc(sizeof(double) * (size_t)R * 5);
    td_pool *pool = NULL;
    if (!W || !P || !buf || !x || !y || !yp || !rd || td_pool_open(&pool, T) != 0) {
        fprintf(stderr, "gemv_bw: out of memory\n");
        return 1;
    }
    uint64_t s = 88172645463325252ull;
    for (size_t i = 0; i < nw; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        W[i] = (uint16_t)(0x3c00 + (s & 0x3ff)) ^ (uint16_t)(s >> 48 & 0x8000); /* +-[1, 2) */
    }
    for (int q = 0; q < N / 8; q++) /* interleave each 8-row group in 32-value pieces */
        for (int r = 0; r < 8; r++)
            for (int k = 0; k < K; k += 32)
                memcpy(P + (size_t)q * 8 * K + (size_t)(k / 32) * 256 + r * 32, W + ((size_t)q * 8 + r) * K + k, 64);
    for (size_t i = 0; i < bytes / 8; i++) buf[i] = i;
    for (int k = 0; k < K; k++) x[k] = (float)((k * 37) % 101) / 101.0f - 0.5f;
    job j = {W, P, x, y, yp, K, N};
    bw_read rj = {buf, bytes / 8, {0}};
    double *r_rd = rd, *r_gv = rd + R, *r_pk = rd + 2 * R, *q_gv = rd + 3 * R, *q_pk = rd + 4 * R;
    for (int r = 0; r < R; r++) {
        double t0 = bw_now();
        td_pool_run(pool, bw_read_run, &rj);
        double t1 = bw_now();
        td_pool_run(pool, gemv_run, &j);
        double t2 = bw_now();
        td_pool_run(pool, packed_run, &j);
        double t3 = bw_now();
        r_rd[r] = bytes / (t1 - t0) / 1e9, r_gv[r] = bytes / (t2 - t1) / 1e9, r_pk[r] = bytes / (t3 - t2) / 1e9;
        q_gv[r] = r_gv[r] / r_rd[r], q_pk[r] = r_pk[r] / r_rd[r];
    }
    int same = memcmp(y, yp, sizeof(float) * (size_t)N) == 0;
    printf("{\"N\": %d, \"K\": %d, \"threads\": %d, \"rounds\": %d, \"weight_mb\": %.1f, \"read_gbs\": %.2f, "
           "\"gemv_gbs\": %.2f, \"packed_gbs\": %.2f, \"gemv_over_read\": %.3f, \"packed_over_read\": %.3f, "
           "\"packed_bits_equal\": %s}\n",
           N, K, T, R, bytes / 1e6, bw_med(r_rd, R), bw_med(r_gv, R), bw_med(r_pk, R), bw_med(q_gv, R), bw_med(q_pk, R),
           same ? "true" : "false");
    td_pool_free(pool);
    free(W), free(P), free(buf), free(x), free(y), free(yp), free(rd);
    return same ? 0 : 1;
}
#endif
