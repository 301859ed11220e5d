/* quant_avx2 — the AVX2 kernels of quantized products (internal: quant.c
 * dispatches to them on the AVX2 path, and on AVX-512 CPUs without VNNI).
 *
 * Same bits as quant.c's portable product (the Q16 order of quant.h). Compiled
 * with -mavx2 -mfma -mf16c -mno-avx512f whatever the build's ARCH is (Makefile),
 * so it exists in every x86-64 build; call it only when td_avx2_cpu_ok()
 * (kernels_avx2.h) says the CPU has those instructions. */
#ifndef TD_QUANT_AVX2_H
#define TD_QUANT_AVX2_H

#include <stddef.h>
#include <stdint.h>

#if defined(__x86_64__) && defined(__GNUC__)
#define TD_HAVE_QUANT_AVX2 1
/* y[m][n] (+)= the Q16 product of activation row m, packed in quant.c's plain
 * layout at a + m * lda (q[K] int8, d[K/32] f32, then for the k-quants s[K/32]
 * f32, the blocks' sums of q), with weight row n of W (dt = TD_DTYPE_Q8_0 /
 * Q4_0 / Q5_0 with K % 32 == 0, or Q4_K / Q5_K / Q6_K with K % 256 == 0), for m < M,
 * n in [n0, n1). */
/* One block of n activations (n a multiple of 32) to q[n] and its scale *d: the
 * portable rule of quant.h (exact max of |x|, td_quant_act_scale, q = rint(x * id)
 * by vcvtps2dq under the default rounding mode), so the same bits. */
void td_avx2_quant_act(const float *x, int n, int8_t *q, float *d);
void td_avx2_qmatmul(float *y, int ldy, const char *a, size_t lda, int M, const void *W, int dt, int K, int n0,
                     int n1, int add);
/* td_q8r_matmul's contract (q8r.h: the R16 order over a repack Wr, activation
 * rows of td_q8r_row_bytes(K) at xq), on 256-bit registers. */
void td_avx2_q8r_matmul(float *y, int ldy, const void *xq, int M, const void *Wr, int K, int n0, int n1, int add,
                        int fmt);
#endif

#endif
