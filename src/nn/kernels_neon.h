/* kernels_neon — the AArch64 Advanced SIMD (NEON) path of kernels.c and quant.c
 * (internal: they dispatch to it; nothing else calls it).
 *
 * Every function gives the same bits as its portable twin: a D16 accumulator
 * (kernels.h) is four float32x4 registers (lanes 0-3, 4-7, 8-11, 12-15), each
 * lane doing the portable path's fmaf steps with FMLA (fused, round to nearest
 * even), and the fold the same additions in the same order. NEON is part of
 * every AArch64 CPU, so the path exists in every AArch64 build; the Q8_0 / Q4_0
 * products also need the dot-product extension (SDOT: four int8 products summed
 * into one int32 lane — exactly one P_b[l] of the Q16 order, quant.h), asked
 * at run time (td_neon_dotprod_ok). What has no NEON twin here (bf16
 * activations, the other quantized formats) runs portably under this path. Shapes and strides are those of the td_* function
 * of the same name; dt = TD_DTYPE_*. */
#ifndef TD_KERNELS_NEON_H
#define TD_KERNELS_NEON_H

#include <stddef.h>
#include <stdint.h>

#if defined(__aarch64__) && defined(__ARM_NEON)
#define TD_HAVE_NEON_PATH 1

/* 1 when the CPU has SDOT (HWCAP_ASIMDDP): td_neon_qmatmul may run. */
int td_neon_dotprod_ok(void);
/* The D16 dot of a (f32) with w (f32, bf16 or f16). */
float td_neon_dot(const float *a, const void *w, int dt, int n);
/* td_matmul for f32, bf16 or f16 weights. */
void td_neon_matmul(float *y, int ldy, const float *x, int ldx, int M, const void *W, int dt, int K, int n0, int n1,
                    int add);
/* td_exp and td_swiglu (exp_p's operations lane by lane). */
void td_neon_exp(float *out, const float *x, int n);
void td_neon_swiglu(float *out, const float *g, const float *u, int n);
/* td_rmsnorm's scaling step: out[i] = w[i] * (x[i] * r). */
void td_neon_norm_apply(float *out, const float *x, const void *w, int dt, int n, float r);
/* td_attend_kv (K, V rows of dt, ldkv elements apart; sc: scratch of the most
 * keys): D16 scores, the softmax of the portable path, then each output
 * element's fma chain over the keys, four elements a register. */
void td_neon_attend(float *o, int ldo, const float *q, int ldq, int nq, const int *n_keys, const char *K, const char *V,
                    int dt, int ldkv, int hd, float scale, float *sc);
/* The Q16 order of quant.h for Q8_0 or Q4_0 weights (dt), over M activation
 * rows in quant.c's plain layout (row m at a + m * lda: K int8 q, then K/32 f32
 * d). Requires td_neon_dotprod_ok(). */
void td_neon_qmatmul(float *y, int ldy, const char *a, size_t lda, int M, const void *W, int dt, int K, int n0, int n1,
                     int add);
#endif

#endif
