/* bench/l3_keep.c — does the last-level cache keep a small buffer while a large
 * one streams past? A speculative round reads the drafter's weights right after
 * the target's verify has streamed every target weight once; whether the
 * drafter's bytes can come from L3 then decides whether any cache trick can
 * cheapen its round. One thread, per mode, 30 times: read B (BIG MiB), then
 * time a read of A (SMALL MiB); the medians go out as one JSON line per mode:
 *   normal       B read with plain loads;
 *   clflushopt   each line of B flushed right after its load (it never reaches
 *                an L3 that is filled from L2 victims);
 *   prefetchnta  B read through non-temporal prefetches 4 KiB ahead;
 *   hot          A read again with nothing between (the L3 rate, or DRAM's
 *                where A does not fit what the machine leaves us).
 * On the project's 2-vCPU Zen 5 VM (bench/forward-notes.md, "Stop 56"), A = 10
 * MiB after B = 50 MiB: 35-47 GB/s after a plain stream, 35-64 after a flushed
 * one, 46-61 after a non-temporal one, 87-106 hot (runs minutes apart): a
 * stream kept out of L3 leaves A there in part only (the CCD's other tenants
 * evict the rest), and the flushes cost the stream 1.7-1.9x its time.
 * Build and run (x86-64 with AVX-512 and CLFLUSHOPT):
 *   cc -std=c11 -O2 -march=native bench/l3_keep.c -o /tmp/l3_keep && /tmp/l3_keep 10 50 */
#define _POSIX_C_SOURCE 200809L
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#if !defined(__AVX512F__) || !defined(__CLFLUSHOPT__)
int main(void) {
    fprintf(stderr, "l3_keep: needs AVX-512 and CLFLUSHOPT (-march=native on such a machine)\n");
    return 2;
}
#else
#define REPS 30

static volatile float g_sink;

static double now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

enum { M_NORMAL, M_FLUSH, M_NTA, M_HOT };

/* The sum of n bytes at p (n a multiple of 128), read as the mode says. */
static __m512 read_buf(const char *p, size_t n, int mode) {
    __m512 s0 = _mm512_setzero_ps(), s1 = s0;
    for (size_t i = 0; i < n; i += 128) {
        if (mode == M_NTA && i + 4096 + 128 <= n) {
            _mm_prefetch(p + i + 4096, _MM_HINT_NTA);
            _mm_prefetch(p + i + 4096 + 64, _MM_HINT_NTA);
        }
        s0 = _mm512_add_ps(s0, _mm512_load_ps((const float *)(const void *)(p + i)));
        s1 = _mm512_add_ps(s1, _mm512_load_ps((const float *)(const void *)(p + i + 64)));
        if (mode == M_FLUSH && i >= 1024) { /* a KiB behind the loads, so they have landed */
            _mm_clflushopt((void *)(p + i - 1024));
            _mm_clflushopt((void *)(p + i - 1024 + 64));
        }
    }
    return _mm512_add_ps(s0, s1);
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: l3_keep SMALL_MIB BIG_MIB   e.g. l3_keep 10 50\n");
        return 2;
    }
    long sa = atol(argv[1]), sb = atol(argv[2]);
    if (sa < 1 || sa > 4096 || sb < 1 || sb > 65536) {
        fprintf(stderr, "l3_keep: sizes in MiB, 1..4096 and 1..65536\n");
        return 2;
    }
    size_t na = (size_t)sa << 20, nb = (size_t)sb << 20;
    char *A = aligned_alloc(4096, na), *B = aligned_alloc(4096, nb);
    if (!A || !B) {
        fprintf(stderr, "l3_keep: out of memory\n");
        return 1;
    }
    memset(A, 1, na);
    memset(B, 1, nb);
    static const char *names[] = {"normal", "clflushopt", "prefetchnta", "hot"};
    __m512 acc = _mm512_setzero_ps();
    for (int mode = M_NORMAL; mode <= M_HOT; mode++) {
        double ta[REPS], tb[REPS];
        acc = _mm512_add_ps(acc, read_buf(A, na, M_NORMAL));
        for (int r = 0; r < REPS; r++) {
            double t0 = now_us();
            if (mode != M_HOT) acc = _mm512_add_ps(acc, read_buf(B, nb, mode));
            double t1 = now_us();
            acc = _mm512_add_ps(acc, read_buf(A, na, M_NORMAL));
            tb[r] = t1 - t0;
            ta[r] = now_us() - t1;
        }
        qsort(ta, REPS, sizeof(double), cmp_d);
        qsort(tb, REPS, sizeof(double), cmp_d);
        printf("{\"mode\": \"%s\", \"small_mib\": %ld, \"big_mib\": %ld, \"big_us\": %.1f, \"small_us\": %.1f, "
               "\"small_gbs\": %.2f}\n",
               names[mode], sa, sb, mode == M_HOT ? 0.0 : tb[REPS / 2], ta[REPS / 2], na / ta[REPS / 2] / 1e3);
    }
    float f[16];
    _mm512_storeu_ps(f, acc);
    g_sink = f[0]; /* keeps the reads from being optimised away */
    return 0;
}
#endif
