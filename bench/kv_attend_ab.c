/* bench/kv_attend_ab.c — td_attend_kv alone, f32 vs bf16 vs f16 K/V, interleaved in one process:
 * one "token step" = attention of T tokens (group queries each) over CTX keys for
 * every kv head of every layer, each layer's cache in its own memory (as the
 * forward's [layer][pos][kv_dim] layout), so a step streams the whole cache.
 * Build and run (from the repository root, after make):
 *   cc -std=c11 -O2 -Iinclude -Isrc bench/kv_attend_ab.c build/libtandem.a -o /tmp/kv_attend_ab \
 *      -lpcre2-8 -lutf8proc -lcjson -lmicrohttpd -lm -pthread
 *   /tmp/kv_attend_ab LAYERS KV_HEADS GROUP HEAD_DIM CTX REPS   (TD_KERNELS picks the path) */
#define _GNU_SOURCE
#include "tandem.h"
#include "nn/kernels.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
static double cpu(void) { struct timespec t; clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
int main(int argc, char **argv) {
    if (argc < 7) { fprintf(stderr, "usage: kv_attend_ab LAYERS KV_HEADS GROUP HEAD_DIM CTX REPS\n"); return 2; }
    int L = atoi(argv[1]), nkv = atoi(argv[2]), group = atoi(argv[3]), hd = atoi(argv[4]), CTX = atoi(argv[5]), reps = atoi(argv[6]);
    int kvd = nkv * hd;
    size_t ne = (size_t)L * CTX * kvd;
    float *src = malloc(4 * ne);
    for (size_t i = 0; i < ne; i++) src[i] = (float)((i * 2654435761u) % 2001) / 1000.0f - 1.0f;
    void *K[3], *Vv[3];
    int kvs[3] = {TD_DTYPE_F32, TD_DTYPE_BF16, TD_DTYPE_F16};
    for (int k = 0; k < 3; k++) {
        size_t es = kvs[k] == TD_DTYPE_F32 ? 4 : 2;
        K[k] = malloc(es * ne); Vv[k] = malloc(es * ne);
        td_from_f32(K[k], src, kvs[k], ne); td_from_f32(Vv[k], src, kvs[k], ne);
    }
    int Ts[2] = {1, 8};
    float *q = malloc(sizeof(float) * 8 * group * hd), *o = malloc(sizeof(float) * 8 * group * hd);
    for (int i = 0; i < 8 * group * hd; i++) q[i] = 0.01f * (float)(i % 97);
    float *sc = malloc(sizeof(float) * TD_ATTEND_QMAX * (CTX + 16));
    int nk[256];
    double best[3][2];
    for (int k = 0; k < 3; k++) best[k][0] = best[k][1] = 1e9;
    for (int r = 0; r < reps; r++)
        for (int ti = 0; ti < 2; ti++)
            for (int kk = 0; kk < 3; kk++) {
                int k = (kk + r) % 3, T = Ts[ti];
                for (int i = 0; i < T * group; i++) nk[i] = CTX - T + 1 + i / group;
                size_t es = kvs[k] == TD_DTYPE_F32 ? 4 : 2;
                double t0 = cpu();
                for (int l = 0; l < L; l++)
                    for (int h = 0; h < nkv; h++) {
                        size_t off = ((size_t)l * CTX * kvd + (size_t)h * hd) * es;
                        td_attend_kv(o, hd, q, hd, T * group, nk, (char *)K[k] + off, (char *)Vv[k] + off, kvs[k], kvd, hd, 0.088f, sc);
                    }
                double dt = cpu() - t0;
                if (dt < best[k][ti]) best[k][ti] = dt;
            }
    double la[1]; getloadavg(la, 1);
    printf("L=%d nkv=%d group=%d hd=%d ctx=%d path=%s reps=%d load=%.2f: thread-cpu min ms per step (all layers, heads)\n", L, nkv, group, hd, CTX, td_kernels_path_name(), reps, la[0]);
    for (int k = 0; k < 3; k++) printf("  %-5s T=1 %.3f  T=8 %.3f\n", td_kv_type_name(kvs[k]), best[k][0] * 1e3, best[k][1] * 1e3);
    return 0;
}
