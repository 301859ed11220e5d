/* bench/attend_bw.c — the attention kernels over a cold KV cache against the
 * machine's read bandwidth: how close a head's pass over its keys and values
 * comes to streaming them. One thread (the forward gives each thread whole kv
 * heads): HEADS heads of 512 keys (bf16 rows, head_dim HD; 224 heads of 128 is
 * a 0.6B shape's cache at context 512, 28 layers x 8 kv heads), the caches
 * evicted before each pass by reading 256 MiB. In alternating rounds:
 *   read — bench/bw.h's sum over the same K and V rows (one thread);
 *   a32  — td_attend_b32 of NQ queries a head (the A32 order; AVX-512 BF16 only);
 *   f32  — td_attend_kv of NQ f32 queries a head over the same bf16 rows;
 * NQ = 2 (a decode's GQA pair) and 16 (a T = 8 verify), and each kernel once
 * more with its rows already in cache ("hot", the arithmetic alone).
 * Prints one JSON object: median ms and GB/s per variant.
 * Build and run (from the repository root, after make):
 *   cc -std=c11 -O2 -march=native -Iinclude -Isrc bench/attend_bw.c build/libtandem.a -o /tmp/attend_bw \
 *      -lpcre2-8 -lutf8proc -lcjson -lmicrohttpd -lm -pthread
 *   /tmp/attend_bw [HEADS=224] [HD=128] [ROUNDS=7] [avx2]     (AVX-512 machines; avx2: that path's
 *   kernels, as an AVX2-only CPU runs them — the A32 attention is then not timed) */
#define _GNU_SOURCE
#include "tandem.h"
#include "nn/kernels.h"
#include "util/util.h"
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#ifndef __AVX512F__
int main(void) {
    fprintf(stderr, "attend_bw: needs an AVX-512 build (-march=native on an AVX-512 machine)\n");
    return 2;
}
#else
#include "bw.h"

enum { NK = 512, NQMAX = 16, ROUNDS_MAX = 64 };
static volatile uint64_t g_sink;

static void evict(const uint64_t *junk, size_t words) {
    uint64_t s = 0;
    for (size_t i = 0; i < words; i += 8) s += junk[i];
    g_sink += s;
}

int main(int argc, char **argv) {
    int heads = argc > 1 ? atoi(argv[1]) : 224, hd = argc > 2 ? atoi(argv[2]) : 128, rounds = argc > 3 ? atoi(argv[3]) : 7;
    int avx2 = argc > 4 && !strcmp(argv[4], "avx2");
    if (avx2 && td_kernels_set_path(TD_KPATH_AVX2) != TD_KPATH_AVX2) {
        fprintf(stderr, "attend_bw: this build or CPU has no AVX2 path\n");
        return 2;
    }
    if (heads < 1 || heads > 4096 || hd < 32 || hd > 256 || hd % 32 || rounds < 1 || rounds > ROUNDS_MAX) {
        fprintf(stderr, "attend_bw: 1 <= HEADS <= 4096, HD a multiple of 32 in [32, 256], 1 <= ROUNDS <= %d\n", ROUNDS_MAX);
        return 2;
    }
    size_t per = (size_t)NK * hd, junk_words = ((size_t)256 << 20) / 8;
    uint16_t *K = bw_big(2 * per * heads), *V = bw_big(2 * per * heads), *qh = malloc(2 * (size_t)NQMAX * hd), *p = malloc(2 * (size_t)NQMAX * NK);
    float *qf = malloc(4 * (size_t)NQMAX * hd), *o = malloc(4 * (size_t)NQMAX * hd), *sc = malloc(4 * (size_t)NQMAX * NK);
    uint64_t *junk = bw_big(junk_words * 8);
    if (!K || !V || !qh || !p || !qf || !o || !sc || !junk) {
        fprintf(stderr, "attend_bw: out of memory\n");
        return 1;
    }
    uint32_t s = 12345;
    for (size_t i = 0; i < per * heads; i++) {
        s = s * 1664525u + 1013904223u;
        K[i] = td_f32_to_bf16((float)(s >> 8) / 16777216.0f - 0.5f);
        V[i] = td_f32_to_bf16((float)(s >> 9) / 8388608.0f - 0.5f);
    }
    for (int i = 0; i < NQMAX * hd; i++) {
        qf[i] = 0.01f * (float)(i % 17) - 0.08f;
        qh[i] = td_f32_to_bf16(qf[i] * 0.088f);
    }
    memset(junk, 1, junk_words * 8);
    int nk[NQMAX];
    for (int i = 0; i < NQMAX; i++) nk[i] = NK;
    int a32 = !avx2 && td_kernels_bf16_native();
    static const int NQS[2] = {2, 16};
    double t_read[ROUNDS_MAX], t_k[2][2][ROUNDS_MAX], t_hot[2][2];
    float scale = 1.0f / 11.3f;
    for (int r = 0; r < rounds; r++) {
        evict(junk, junk_words);
        double t0 = bw_now();
        bw_read rk = {(const uint64_t *)K, per * heads / 4, {0}}, rv = {(const uint64_t *)V, per * heads / 4, {0}};
        bw_read_run(&rk, 0, 1);
        bw_read_run(&rv, 0, 1);
        t_read[r] = bw_now() - t0;
        g_sink += rk.sums[0] + rv.sums[0];
        for (int v = 0; v < 2; v++)
            for (int kind = 0; kind < 2; kind++) {
                if (kind == 0 && !a32) { t_k[v][kind][r] = 0; continue; }
                evict(junk, junk_words);
                t0 = bw_now();
                for (int h = 0; h < heads; h++) {
                    if (kind == 0) td_attend_b32(o, hd, qh, hd, NQS[v], nk, K + (size_t)h * per, V + (size_t)h * per, hd, hd, sc, p);
                    else td_attend_kv(o, hd, qf, hd, NQS[v], nk, K + (size_t)h * per, V + (size_t)h * per, TD_DTYPE_BF16, hd, hd, scale, sc);
                }
                t_k[v][kind][r] = bw_now() - t0;
            }
    }
    for (int v = 0; v < 2; v++) /* hot: one head again and again, scaled to all heads */
        for (int kind = 0; kind < 2; kind++) {
            double best = 1e30;
            for (int r = 0; r < 3 && (kind || a32); r++) {
                double t0 = bw_now();
                for (int h = 0; h < 16; h++) {
                    if (kind == 0) td_attend_b32(o, hd, qh, hd, NQS[v], nk, K, V, hd, hd, sc, p);
                    else td_attend_kv(o, hd, qf, hd, NQS[v], nk, K, V, TD_DTYPE_BF16, hd, hd, scale, sc);
                }
                double t = (bw_now() - t0) / 16 * heads;
                best = t < best ? t : best;
            }
            t_hot[v][kind] = kind || a32 ? best : 0;
        }
    double bytes = 2.0 * (double)per * 2 * heads, tr = bw_med(t_read, rounds);
    printf("{\"path\": \"%s\", \"heads\": %d, \"hd\": %d, \"keys\": %d, \"rounds\": %d, \"kv_mb\": %.1f, \"read_ms\": %.3f, "
           "\"read_gbs\": %.2f", avx2 ? "avx2" : "avx512", heads, hd, NK, rounds, bytes / 1e6, tr * 1e3, bytes / tr / 1e9);
    static const char *KN[2] = {"a32", "f32"};
    for (int v = 0; v < 2; v++)
        for (int kind = 0; kind < 2; kind++) {
            if (kind == 0 && !a32) continue;
            double t = bw_med(t_k[v][kind], rounds);
            printf(", \"%s_nq%d_ms\": %.3f, \"%s_nq%d_gbs\": %.2f, \"%s_nq%d_hot_ms\": %.3f", KN[kind], NQS[v], t * 1e3, KN[kind],
                   NQS[v], bytes / t / 1e9, KN[kind], NQS[v], t_hot[v][kind] * 1e3);
        }
    printf("}\n");
    return 0;
}
#endif
