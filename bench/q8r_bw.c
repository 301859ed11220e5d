/* bench/q8r_bw.c — the R16 product of Q8_0 weights (or Q4_0, Q5_0, IQ4_NL, Q4_K:
 * the fourth argument; nn/q8r.h) alone against the
 * machine's read bandwidth: how far the kernel is from streaming its bytes, and
 * what extra tokens cost it, without the rest of a forward (attention, norms,
 * the pool's other jobs). In one process, rounds alternate (a td_pool of T
 * threads, outputs split in 16-row groups as the forward splits them):
 *   read — a STREAM-like sum over a buffer as large as the repacked weights;
 *   M    — td_q8r_matmul of M = 1, 2, 4, 8 activation rows over [N][1024]
 *          weights (random bytes, f16 scales 2^-15) in R16 records;
 *   q16  — td_quant_matmul (the f32 mode's Q16 order) of M = 1 and 8 over the
 *          same weights in the file's blocks (its own activation quantization
 *          included).
 * Prints one JSON object: the read bandwidth (median GB/s), the floor (bytes /
 * that bandwidth, ms) and the median ms of each M.
 * Build and run (from the repository root, after make):
 *   cc -std=c11 -O2 -march=native -Iinclude -Isrc bench/q8r_bw.c build/libtandem.a -o /tmp/q8r_bw \
 *      -lpcre2-8 -lutf8proc -lcjson -lmicrohttpd -lm -pthread
 *   /tmp/q8r_bw [N=585728] [THREADS=2] [ROUNDS=8] [DTYPE=q8_0]   (AVX2 or AVX-512 machines; the kernel path in force) */
#define _GNU_SOURCE
#include "nn/pool.h"
#include "nn/q8r.h"
#include "nn/quant.h"
#include "tandem.h"
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef __AVX2__
int main(void) {
    fprintf(stderr, "q8r_bw: needs an AVX2 or AVX-512 build (-march=native on such a machine)\n");
    return 2;
}
#else
#include "bw.h"

enum { K = 1024, MMAX = 8 };
typedef struct {
    const uint8_t *R, *xq; /* repack; MMAX activation rows */
    float *y;              /* [MMAX][N] */
    int N, M, fmt;
    const uint8_t *W; /* the file's blocks (Q16 rounds) */
    const float *x;   /* [MMAX][K] */
    int dt;
} job;

/* the Q16 order of the f32 mode (td_quant_matmul) over the file's blocks, split as q_run */
static void q16_run(void *arg, int i, int n) {
    job *j = arg;
    int g = (j->N + 15) / 16, g0 = g * i / n, g1 = g * (i + 1) / n;
    td_quant_matmul(j->y, j->N, j->x, K, j->M, j->W, j->dt, K, g0 * 16, g1 * 16 < j->N ? g1 * 16 : j->N, 0);
}

static void q_run(void *arg, int i, int n) {
    job *j = arg;
    int g = (j->N + 15) / 16, g0 = g * i / n, g1 = g * (i + 1) / n;
    td_q8r_matmul(j->y, j->N, j->xq, j->M, j->R, K, g0 * 16, g1 * 16 < j->N ? g1 * 16 : j->N, 0, getenv("NOSTREAM") ? 0 : j->N, j->fmt); /* streamed */
}

int main(int argc, char **argv) {
    int N = argc > 1 ? atoi(argv[1]) : 585728, T = argc > 2 ? atoi(argv[2]) : 2, R = argc > 3 ? atoi(argv[3]) : 8;
    int dt = argc > 4 ? td_dtype_parse(argv[4]) : TD_DTYPE_Q8_0, fmt = dt >= 0 ? td_q8r_format(dt) : -1;
    if (N < 16 || T < 1 || T > 64 || R < 1 || R > 1000 || fmt < 0) {
        fprintf(stderr, "q8r_bw: N >= 16, 1 <= THREADS <= 64, 1 <= ROUNDS <= 1000, DTYPE one R16 holds\n");
        return 2;
    }
    size_t rowb = td_dtype_row_bytes(dt, K), rbytes = td_q8r_bytes(N, K, fmt);
    size_t bsb = fmt == TD_Q8R_Q4_K ? 144 : rowb / (K / 32); /* bytes of a block (a super-block) */
    uint8_t *W = bw_big(rowb * (size_t)N), *Rp = bw_big(rbytes), *xq = aligned_alloc(64, td_q8r_row_bytes(K) * MMAX);
    uint64_t *buf = bw_big(rbytes);
    float *x = malloc(sizeof(float) * K * MMAX), *y = malloc(sizeof(float) * (size_t)N * MMAX);
    double *t = malloc(sizeof(double) * (size_t)R * 7);
    td_pool *pool = NULL;
    if (!W || !Rp || !xq || !buf || !x || !y || !t || td_pool_open(&pool, T) != 0) {
        fprintf(stderr, "q8r_bw: out of memory\n");
        return 1;
    }
    uint64_t s = 88172645463325252ull;
    for (size_t i = 0; i < rowb * (size_t)N; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        W[i] = (uint8_t)(s >> 24);
    }
    for (int n = 0; n < N; n++) /* finite f16 scales (Q4_K: d and dmin) */
        for (size_t b = 0; b < rowb / bsb; b++)
            for (int h = 0; h < (fmt == TD_Q8R_Q4_K ? 2 : 1); h++) memcpy(W + (size_t)n * rowb + b * bsb + 2 * h, &(uint16_t){0x0400}, 2);
    td_q8r_repack(Rp, W, dt, N, K, 0, N); /* every page written: no faults in the rounds */
    for (size_t i = 0; i < rbytes / 8; i++) buf[i] = i;
    for (int k = 0; k < K * MMAX; k++) x[k] = (float)((k * 37) % 101) / 101.0f - 0.5f;
    td_q8r_act(xq, x, K, MMAX, K);
    job j = {Rp, xq, y, N, 1, fmt, W, x, dt};
    bw_read rj = {buf, rbytes / 8, {0}};
    static const int Ms[4] = {1, 2, 4, 8};
    for (int r = 0; r < R; r++) {
        double t0 = bw_now();
        td_pool_run(pool, bw_read_run, &rj);
        t[r] = rbytes / (bw_now() - t0) / 1e9;
        for (int i = 0; i < 4; i++) {
            j.M = Ms[i];
            double t1 = bw_now();
            td_pool_run(pool, q_run, &j);
            t[(size_t)(i + 1) * R + r] = (bw_now() - t1) * 1e3;
        }
        for (int i = 0; i < 2; i++) { /* Q16, M = 1 and 8 */
            j.M = i ? 8 : 1;
            double t1 = bw_now();
            td_pool_run(pool, q16_run, &j);
            t[(size_t)(i + 5) * R + r] = (bw_now() - t1) * 1e3;
        }
    }
    double bw = bw_med(t, R);
    printf("{\"dtype\": \"%s\", \"N\": %d, \"K\": %d, \"threads\": %d, \"rounds\": %d, \"weight_mb\": %.1f, \"read_gbs\": %.2f, "
           "\"floor_ms\": %.2f, \"ms\": {\"1\": %.2f, \"2\": %.2f, \"4\": %.2f, \"8\": %.2f}, \"q16_ms\": {\"1\": %.2f, \"8\": %.2f}}\n",
           td_dtype_name(dt), N, K, T, R, rbytes / 1e6, bw, rbytes / bw / 1e6, bw_med(t + R, R), bw_med(t + 2 * R, R), bw_med(t + 3 * R, R),
           bw_med(t + 4 * R, R), bw_med(t + 5 * R, R), bw_med(t + 6 * R, R));
    td_pool_free(pool);
    free(W), free(Rp), free(xq), free(buf), free(x), free(y), free(t);
    return 0;
}
#endif
