/* bench/verify_layout.c — would a different bf16 weight layout let the 8-token
 * verify products keep up with the weight stream? The engine's T = 8 tile
 * (td_matmul_bf16a) reads 3 weight rows side by side (3 streams) against 8
 * activation rows of K bf16 (16 KiB at K = 1024: 8 more streams, and a block
 * L1 cannot keep beside the weights). This harness packs the same weights
 * "panel, k-block major": panels of PR rows; inside a panel, k-blocks of KB
 * elements; inside a k-block, groups of 3 rows; per 32-element step the 3
 * rows' 64 bytes side by side. A thread then reads one linear stream; the
 * activations of one k-block (8 x KB bf16, interleaved [step][token][32])
 * and the panel's accumulators (PR / 3 x 24 vectors) stay in L1 while it
 * passes; a software prefetch toward L2 runs PF bytes ahead.
 * Per pass, over the products of a forward of the Qwen3-0.6B shape (28 x
 * q/k/v, o, gate/up, down, then the LM head; N rounded down to whole panels):
 * the engine's T = 8 products (plain layout), the packed ones (this file's
 * tile), the engine's T = 1 products, and T = 1 over the packed layout (PR =
 * 30: a panel's 30 outputs stay in registers across its k-blocks; PF1 its
 * prefetch distance). This file's tiles reduce their sums with
 * _mm512_reduce_add_ps (a speed test: their bits are not the B32 order's; the
 * engine's would take the D16 fold). Medians of 8 passes after 2, the modes
 * alternating within each pass; one line of JSON.
 * On the project's 2-vCPU Zen 5 VM (bench/forward-notes.md, "Stop 57"),
 * PR 30, KB 512, PF 4096, PF1 0, runs at 46-52 GB/s: packed T = 8 0.80-0.93 of
 * the engine's T = 8 time, packed T = 1 0.88-0.95 of the engine's T = 1 (with
 * PF1 4096: 0.99-1.02). T8/T1 of the products: packed over packed 1.28-1.33,
 * packed T = 8 over the engine's T = 1 1.06-1.23, the engine's own 1.29-1.43.
 * KB 256: 0.96 of plain at T = 8; without PF 1.0-1.27.
 * Build and run (from the repository root, after make; AVX512_BF16):
 *   cc -std=c11 -O2 -march=native -Iinclude -Isrc bench/verify_layout.c build/libtandem.a -o /tmp/verify_layout \
 *      -lpcre2-8 -lutf8proc -lcjson -lmicrohttpd -lm -pthread
 *   /tmp/verify_layout [PR=30] [KB=512] [PF=4096] [PF1=0]  (PR a multiple of 3 up to 96, KB of 32 dividing 1024) */
#define _GNU_SOURCE
#include "nn/kernels.h"
#include "nn/pool.h"
#include "util/util.h"
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#ifndef __AVX512BF16__
int main(void) {
    fprintf(stderr, "verify_layout: needs AVX512_BF16 (-march=native on such a machine)\n");
    return 2;
}
#else
#include <immintrin.h>

#define NL 28
#define NSHAPE 5
#define PASSES 8
#define MAX_GROUPS 32

static int PR = 30, KB = 512, PF = 4096, PF1 = 0; /* PF1: the one-token tile's prefetch distance */

enum { M_PLAIN8, M_PACKED8, M_PLAIN1, M_PACKED1, N_MODES };
typedef struct {
    float *y;
    const uint16_t *x; /* plain: [M][K]; packed: [K / 32][8][32] */
    const uint16_t *W;
    int K, N, mode;
} job;

/* Panels [p0, p1) of a packed [N][K] matrix: y[8][N] = x W^T. */
static void packed_run(float *y, int N, const uint16_t *xil, const char *P, int K, int p0, int p1) {
    const int G = PR / 3, nkb = K / KB, S = KB / 32;
    __m512 accs[MAX_GROUPS][24];
    for (int p = p0; p < p1; p++) {
        const char *pw = P + (size_t)p * PR * K * 2;
        for (int kb = 0; kb < nkb; kb++) {
            const uint16_t *xb = xil + (size_t)kb * S * 256;
            for (int g = 0; g < G; g++) {
                __m512 acc[8][3];
#pragma GCC unroll 8
                for (int i = 0; i < 8; i++)
#pragma GCC unroll 3
                    for (int j = 0; j < 3; j++) acc[i][j] = kb ? accs[g][i * 3 + j] : _mm512_setzero_ps();
                const char *w = pw + ((size_t)kb * G + g) * S * 192;
                for (int s = 0; s < S; s++) {
                    const char *q = w + (size_t)s * 192;
                    if (PF) {
                        _mm_prefetch(q + PF, _MM_HINT_T1);
                        _mm_prefetch(q + PF + 64, _MM_HINT_T1);
                        _mm_prefetch(q + PF + 128, _MM_HINT_T1);
                    }
                    __m512i w0 = _mm512_load_si512(q), w1 = _mm512_load_si512(q + 64), w2 = _mm512_load_si512(q + 128);
#pragma GCC unroll 8
                    for (int i = 0; i < 8; i++) {
                        __m512i xv = _mm512_load_si512(xb + s * 256 + i * 32);
                        __asm__("" : "+v"(xv)); /* one load a token, as the engine's tile */
                        acc[i][0] = _mm512_dpbf16_ps(acc[i][0], (__m512bh)xv, (__m512bh)w0);
                        acc[i][1] = _mm512_dpbf16_ps(acc[i][1], (__m512bh)xv, (__m512bh)w1);
                        acc[i][2] = _mm512_dpbf16_ps(acc[i][2], (__m512bh)xv, (__m512bh)w2);
                    }
                }
                if (kb == nkb - 1) {
                    int n = p * PR + g * 3;
#pragma GCC unroll 8
                    for (int i = 0; i < 8; i++)
#pragma GCC unroll 3
                        for (int j = 0; j < 3; j++) y[(size_t)i * N + n + j] = _mm512_reduce_add_ps(acc[i][j]);
                } else {
#pragma GCC unroll 8
                    for (int i = 0; i < 8; i++)
#pragma GCC unroll 3
                        for (int j = 0; j < 3; j++) accs[g][i * 3 + j] = acc[i][j];
                }
            }
        }
    }
}

/* One token over the packed layout (PR = 30 only): a panel's 30 outputs stay
 * in registers across all its k-blocks, so nothing is saved between them. */
#define G1 10
static void packed1_run(float *y, const uint16_t *x, const char *P, int K, int p0, int p1) {
    const int nkb = K / KB, S = KB / 32;
    for (int p = p0; p < p1; p++) {
        const char *pw = P + (size_t)p * 3 * G1 * K * 2;
        __m512 acc[G1][3];
#pragma GCC unroll 10
        for (int g = 0; g < G1; g++)
#pragma GCC unroll 3
            for (int j = 0; j < 3; j++) acc[g][j] = _mm512_setzero_ps();
        for (int kb = 0; kb < nkb; kb++) {
            const char *wk = pw + (size_t)kb * G1 * S * 192;
            for (int s = 0; s < S; s++) {
                __m512i xv = _mm512_loadu_si512(x + (size_t)kb * KB + (size_t)s * 32);
                __asm__("" : "+v"(xv));
#pragma GCC unroll 10
                for (int g = 0; g < G1; g++) {
                    const char *q = wk + ((size_t)g * S + s) * 192;
                    if (PF1) _mm_prefetch(q + PF1, _MM_HINT_T1);
#pragma GCC unroll 3
                    for (int j = 0; j < 3; j++)
                        acc[g][j] = _mm512_dpbf16_ps(acc[g][j], (__m512bh)xv, (__m512bh)_mm512_load_si512(q + j * 64));
                }
            }
        }
#pragma GCC unroll 10
        for (int g = 0; g < G1; g++)
#pragma GCC unroll 3
            for (int j = 0; j < 3; j++) y[p * 3 * G1 + g * 3 + j] = _mm512_reduce_add_ps(acc[g][j]);
    }
}

static void run(void *arg, int ith, int nth) {
    const job *j = arg;
    if (j->mode == M_PACKED1) {
        int np = j->N / PR;
        packed1_run(j->y, j->x, (const char *)j->W, j->K, np * ith / nth, np * (ith + 1) / nth);
        return;
    }
    if (j->mode == M_PACKED8) {
        int np = j->N / PR;
        packed_run(j->y, j->N, j->x, (const char *)j->W, j->K, np * ith / nth, np * (ith + 1) / nth);
        return;
    }
    int G = j->N / 16, n0 = 16 * (int)((long)G * ith / nth), n1 = ith == nth - 1 ? j->N : 16 * (int)((long)G * (ith + 1) / nth);
    td_matmul_bf16a_pf(j->y, j->N, j->x, j->K, j->mode == M_PLAIN1 ? 1 : 8, j->W, j->K, n0, n1, 0, 1, -1);
}

static int cmpd(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    if (argc > 1) PR = atoi(argv[1]);
    if (argc > 2) KB = atoi(argv[2]);
    if (argc > 3) PF = atoi(argv[3]);
    if (argc > 4) PF1 = atoi(argv[4]);
    if (PF1 < 0 || PF1 > (1 << 20)) PF = -1; /* refused below */
    if (PR < 3 || PR % 3 || PR / 3 > MAX_GROUPS || KB < 32 || KB % 32 || 1024 % KB || PF < 0 || PF > (1 << 20)) {
        fprintf(stderr, "usage: verify_layout [PR: 3..%d, a multiple of 3] [KB: a multiple of 32 dividing 1024] [PF, PF1: 0..2^20]\n",
                3 * MAX_GROUPS);
        return 2;
    }
    int shp[NSHAPE][2] = {{4096, 1024}, {1024, 2048}, {6144, 1024}, {1024, 3072}, {151936, 1024}}; /* [N][K] */
    for (int i = 0; i < NSHAPE; i++) shp[i][0] = shp[i][0] / PR * PR;
    size_t all = (size_t)shp[NSHAPE - 1][0] * shp[NSHAPE - 1][1];
    for (int i = 0; i < NSHAPE - 1; i++) all += (size_t)shp[i][0] * shp[i][1] * NL;
    size_t bytes = (all * 2 + ((size_t)2 << 20) - 1) / ((size_t)2 << 20) * ((size_t)2 << 20);
    uint16_t *W = aligned_alloc((size_t)2 << 20, bytes), *P = aligned_alloc((size_t)2 << 20, bytes);
    uint16_t *x = aligned_alloc(64, 8 * 3072 * 2), *xil = aligned_alloc(64, 8 * 3072 * 2);
    float *y = aligned_alloc(64, (size_t)8 * 151936 * 4);
    td_pool *pool = NULL;
    if (!W || !P || !x || !xil || !y || td_pool_open(&pool, 2) != 0) {
        fprintf(stderr, "verify_layout: out of memory\n");
        return 1;
    }
    madvise(W, bytes, MADV_HUGEPAGE); /* advice only */
    madvise(P, bytes, MADV_HUGEPAGE);
    for (size_t i = 0; i < all; i++) W[i] = (uint16_t)(0x3c00 + (((uint32_t)i * 2654435761u) >> 26) - 32); /* ~1/128 */
    for (int i = 0; i < 8 * 3072; i++) x[i] = (uint16_t)(0x3c00 + (i & 63));
    /* the packed copy: matrices in the same order and at the same offsets */
    size_t off = 0;
    for (int l = 0; l <= NL; l++)
        for (int i = l == NL ? NSHAPE - 1 : 0; i < (l == NL ? NSHAPE : NSHAPE - 1); i++) {
            int N = shp[i][0], K = shp[i][1], G = PR / 3, S = KB / 32;
            const uint16_t *src = W + off;
            char *dst = (char *)(P + off);
            for (int p = 0; p < N / PR; p++)
                for (int kb = 0; kb < K / KB; kb++)
                    for (int g = 0; g < G; g++)
                        for (int s = 0; s < S; s++)
                            for (int j = 0; j < 3; j++)
                                memcpy(dst + (size_t)p * PR * K * 2 + (((size_t)kb * G + g) * S + s) * 192 + (size_t)j * 64,
                                       src + (size_t)(p * PR + g * 3 + j) * K + (size_t)kb * KB + (size_t)s * 32, 64);
            off += (size_t)N * K;
        }
    double t[N_MODES][PASSES];
    for (int pass = 0; pass < PASSES + 2; pass++)
        for (int mode = 0; mode < N_MODES; mode++) {
            if (mode == M_PACKED1 && PR != 3 * G1) {
                t[mode][pass < 2 ? 0 : pass - 2] = 0;
                continue;
            }
            double t0 = td_now();
            size_t o = 0;
            for (int l = 0; l <= NL; l++)
                for (int i = l == NL ? NSHAPE - 1 : 0; i < (l == NL ? NSHAPE : NSHAPE - 1); i++) {
                    int K = shp[i][1];
                    if (mode == M_PACKED8) /* this product's activations interleaved, as a real one would */
                        for (int r = 0; r < 8; r++)
                            for (int k = 0; k < K; k += 32) memcpy(xil + (size_t)(k / 32) * 256 + r * 32, x + (size_t)r * K + k, 64);
                    job j = {y, mode == M_PACKED8 ? xil : x, (mode == M_PACKED8 || mode == M_PACKED1 ? P : W) + o, K, shp[i][0], mode};
                    td_pool_run(pool, run, &j);
                    o += (size_t)shp[i][0] * shp[i][1];
                }
            if (pass >= 2) t[mode][pass - 2] = (td_now() - t0) * 1e3;
        }
    for (int m = 0; m < N_MODES; m++) qsort(t[m], PASSES, sizeof(double), cmpd);
    double p8 = t[M_PLAIN8][PASSES / 2], k8 = t[M_PACKED8][PASSES / 2], p1 = t[M_PLAIN1][PASSES / 2];
    double k1 = t[M_PACKED1][PASSES / 2];
    printf("{\"pr\": %d, \"kb\": %d, \"pf\": %d, \"pf1\": %d, \"plain8_ms\": %.2f, \"packed8_ms\": %.2f, \"plain1_ms\": %.2f, "
           "\"packed1_ms\": %.2f, \"packed8_over_plain8\": %.3f, \"packed1_over_plain1\": %.3f, \"t8_over_t1_plain\": %.3f, "
           "\"t8_over_t1_packed\": %.3f, \"t1_gbs\": %.1f, \"y0\": %g}\n",
           PR, KB, PF, PF1, p8, k8, p1, k1, k8 / p8, k1 > 0 ? k1 / p1 : 0.0, p8 / p1, k1 > 0 ? k8 / k1 : 0.0,
           (double)all * 2 / p1 / 1e6, (double)y[0]);
    td_pool_free(pool);
    return 0;
}
#endif
