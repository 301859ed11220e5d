/* bench/quant_ab.c — in-process A/B of td_quant_matmul against another build of
 * src/nn/quant.c (e.g. main's) linked beside it under the name old_quant_matmul.
 * One thread; for each M, rounds alternate old/new; reports best and median
 * GMAC/s (thread CPU time). Weights: NW copies of an [N][K] matrix cycled, so
 * NW * N * K bytes above the caches measures streaming from DRAM.
 * Build (from the repository root, after make; OLD = the other quant.c):
 *   D="-Dtd_quant_matmul=old_quant_matmul -Dtd_dtype_is_quant=old_a -Dtd_dtype_name=old_b \
 *      -Dtd_dtype_row_bytes=old_c -Dtd_dtype_check_row=old_d -Dtd_dtype_check_tensor=old_e \
 *      -Dtd_f32_to_f16=old_f -Dtd_quantize_row=old_g -Dtd_dequantize_row=old_h -Dtd_quant_act_row=old_i"
 *   cc -std=c11 -O2 -march=native -Iinclude -Isrc $D -c OLD -o /tmp/old_quant.o
 *   cc -std=c11 -O2 -march=native -Iinclude -Isrc bench/quant_ab.c /tmp/old_quant.o build/libtandem.a \
 *      -o /tmp/quant_ab -lpcre2-8 -lutf8proc -lcjson -lmicrohttpd -lm -pthread
 *   /tmp/quant_ab K N NW ROUNDS q8_0|q4_0 M... */
#define _GNU_SOURCE
#include "nn/kernels.h"
#include "nn/quant.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

void old_quant_matmul(float *y, int ldy, const float *x, int ldx, int M, const void *W, int dtype, int K, int n0,
                      int n1, int add);

static double cpu(void) { struct timespec t; clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
static int cmp(const void *a, const void *b) { double x = *(const double *)a, y = *(const double *)b; return x < y ? -1 : x > y; }

int main(int argc, char **argv) {
    if (argc < 7) { fprintf(stderr, "usage: quant_ab K N NW ROUNDS q8_0|q4_0 M...\n"); return 2; }
    int K = atoi(argv[1]), N = atoi(argv[2]), NW = atoi(argv[3]), R = atoi(argv[4]);
    int dt = strcmp(argv[5], "q4_0") ? TD_DTYPE_Q8_0 : TD_DTYPE_Q4_0;
    size_t rb = td_dtype_row_bytes(dt, K), wb = rb * N;
    char *W = aligned_alloc(2 << 20, (wb * NW + (2 << 20)) & ~(size_t)((2 << 20) - 1));
    float *row = malloc(sizeof(float) * K);
    uint64_t s = 1;
    for (int n = 0; n < N; n++) {
        for (int k = 0; k < K; k++) { s = s * 6364136223846793005ull + 1442695040888963407ull; row[k] = (float)((int64_t)(s >> 11) % 2000) / 1000.0f; }
        td_quantize_row(dt, row, W + n * rb, K);
    }
    for (int c = 1; c < NW; c++) memcpy(W + c * wb, W, wb);
    int Mmax = 0;
    for (int i = 6; i < argc; i++) if (atoi(argv[i]) > Mmax) Mmax = atoi(argv[i]);
    float *x = malloc(sizeof(float) * (size_t)Mmax * K), *y0 = malloc(sizeof(float) * (size_t)Mmax * N), *y1 = malloc(sizeof(float) * (size_t)Mmax * N);
    for (size_t i = 0; i < (size_t)Mmax * K; i++) { s = s * 6364136223846793005ull + 1442695040888963407ull; x[i] = (float)((int64_t)(s >> 11) % 2000) / 1000.0f - 1.0f; }
    printf("K %d N %d %s, %d copies (%.1f MiB), kernels %s\n", K, N, argv[5], NW, wb * NW / 1048576.0, td_kernels_path_name());
    for (int i = 6; i < argc; i++) {
        int M = atoi(argv[i]);
        double t[2][400];
        int w = 0;
        for (int r = 0; r < R && r < 400; r++)
            for (int v = 0; v < 2; v++) {
                int which = (r & 1) ? 1 - v : v;
                double t0 = cpu();
                int reps = 0;
                do {
                    const char *Wc = W + (size_t)(w++ % NW) * wb;
                    if (which == 0) old_quant_matmul(y0, N, x, K, M, Wc, dt, K, 0, N, 0);
                    else td_quant_matmul(y1, N, x, K, M, Wc, dt, K, 0, N, 0);
                    reps++;
                } while (cpu() - t0 < 0.02);
                t[which][r] = (cpu() - t0) / reps;
            }
        int same = !memcmp(y0, y1, sizeof(float) * (size_t)M * N);
        double g[2][2];
        for (int v = 0; v < 2; v++) {
            qsort(t[v], R, sizeof(double), cmp);
            double mac = (double)M * N * K;
            g[v][0] = mac / t[v][0] * 1e-9;
            g[v][1] = mac / t[v][R / 2] * 1e-9;
        }
        printf("M %3d  old best %6.1f med %6.1f  new best %6.1f med %6.1f GMAC/s  new/old %.2f  %s\n", M, g[0][0], g[0][1],
               g[1][0], g[1][1], g[1][0] / g[0][0], same ? "same bits" : "BITS DIFFER");
    }
    return 0;
}
