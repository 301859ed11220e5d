/* bench/bw.h — what the bandwidth harnesses (gemv_bw.c, q8r_bw.c) share: a
 * monotonic clock, the median of a sample, 2 MiB-aligned huge-page buffers,
 * and the STREAM-like read they measure the machine with (a td_pool job that
 * sums a buffer's 64-bit words, each thread its own contiguous part).
 * Header-only (static functions); AVX-512 or AVX2 builds. */
#ifndef TD_BENCH_BW_H
#define TD_BENCH_BW_H

#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

static double bw_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}
static int bw_cmpd(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}
/* the median of v[0 .. n) (sorts v) */
static double bw_med(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, bw_cmpd);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}
/* bytes at a 2 MiB boundary, advised MADV_HUGEPAGE, or NULL */
static void *bw_big(size_t bytes) {
    void *p = NULL;
    if (posix_memalign(&p, (size_t)1 << 21, bytes) != 0) return NULL;
    madvise(p, bytes, MADV_HUGEPAGE);
    return p;
}

typedef struct {
    const uint64_t *buf; /* 64-byte aligned, words long */
    size_t words;
    uint64_t sums[64];   /* each thread's sum (keeps the loads alive) */
} bw_read;
/* td_pool job over a bw_read: thread i of n sums its part of the buffer */
static void bw_read_run(void *arg, int i, int n) {
    bw_read *j = arg;
    size_t a = (j->words * (size_t)i / (size_t)n) & ~(size_t)31, b = (j->words * (size_t)(i + 1) / (size_t)n) & ~(size_t)31;
#ifdef __AVX512F__
    __m512i s0 = _mm512_setzero_si512(), s1 = s0, s2 = s0, s3 = s0;
    for (size_t k = a; k < b; k += 32) {
        s0 = _mm512_add_epi64(s0, _mm512_load_si512(j->buf + k));
        s1 = _mm512_add_epi64(s1, _mm512_load_si512(j->buf + k + 8));
        s2 = _mm512_add_epi64(s2, _mm512_load_si512(j->buf + k + 16));
        s3 = _mm512_add_epi64(s3, _mm512_load_si512(j->buf + k + 24));
    }
    j->sums[i & 63] = (uint64_t)_mm512_reduce_add_epi64(_mm512_add_epi64(_mm512_add_epi64(s0, s1), _mm512_add_epi64(s2, s3)));
#else /* AVX2: eight 32-byte loads a 256-byte step */
    __m256i s[8];
    for (int u = 0; u < 8; u++) s[u] = _mm256_setzero_si256();
    for (size_t k = a; k < b; k += 32)
        for (int u = 0; u < 8; u++) s[u] = _mm256_add_epi64(s[u], _mm256_load_si256((const __m256i *)(const void *)(j->buf + k + 4 * u)));
    uint64_t w[4], t = 0;
    for (int u = 1; u < 8; u++) s[0] = _mm256_add_epi64(s[0], s[u]);
    _mm256_storeu_si256((__m256i *)(void *)w, s[0]);
    for (int u = 0; u < 4; u++) t += w[u];
    j->sums[i & 63] = t;
#endif
}

#endif
