/* kernels_avx2 — the AVX2+FMA(+F16C) path of kernels.c (internal: kernels.c
 * dispatches to it; nothing else calls it).
 *
 * Every function gives the same bits as its portable twin in kernels.c (the D16
 * order of kernels.h: 16 lanes = two ymm registers, lanes 0-7 and 8-15). The
 * file is compiled with -mavx2 -mfma -mf16c whatever the build's ARCH is (the
 * Makefile adds them on x86-64), so it exists in every x86-64 build; call it only
 * when td_avx2_cpu_ok() says the CPU has those instructions. Shapes and strides
 * are those of the td_* function of the same name in kernels.h; dt = TD_DTYPE_*. */
#ifndef TD_KERNELS_AVX2_H
#define TD_KERNELS_AVX2_H

#include <stddef.h>
#include <stdint.h>

/* td_exp's Cephes-style polynomial, shared by every path (kernels.c's exp_p is
 * the reference): clamp to [EXP_LO, EXP_HI], n = rint(x * log2 e), r = x - n ln 2
 * in two steps, p(r) by Horner, result p * 2^n. */
#define EXP_LO -104.0f
#define EXP_HI 89.0f
#define EXP_LOG2E 1.44269504088896341f
#define EXP_C1 0.693359375f
#define EXP_C2 -2.12194440e-4f
#define EXP_P0 1.9875691500e-4f
#define EXP_P1 1.3981999507e-3f
#define EXP_P2 8.3334519073e-3f
#define EXP_P3 4.1665795894e-2f
#define EXP_P4 1.6666665459e-1f
#define EXP_P5 5.0000001201e-1f

#if defined(__x86_64__) && defined(__GNUC__)
#define TD_HAVE_AVX2_PATH 1

/* A tile's output (i, j): y[i*ldy + j] = s, or += s when add. */
static inline void td_avx2_put(float *y, int ldy, int i, int j, float s, int add) {
    float *yp = y + (size_t)i * ldy + j;
    *yp = add ? *yp + s : s;
}

/* 1 when this CPU has AVX2, FMA and F16C. */
int td_avx2_cpu_ok(void);
/* D16 dot of a (f32) with w (n values of dtype dt). */
float td_avx2_dot(const float *a, const void *w, int dt, int n);
void td_avx2_to_f32(float *dst, const void *src, int dt, size_t n);
/* td_matmul for f32 / bf16 / f16 weights (quantized ones: quant_avx2.h). */
void td_avx2_matmul(float *y, int ldy, const float *x, int ldx, int M, const void *W, int dt,
                    int K, int n0, int n1, int add);
/* td_matmul_bf16a: bf16 activations x bf16 weights in the B32 order (vdpbf16ps's
 * lanes, emulated exactly as kernels.c's dp_lane). */
void td_avx2_matmul_bf16a(float *y, int ldy, const uint16_t *x, int ldx, int M, const uint16_t *W, int K, int n0,
                          int n1, int add);
/* The second half of td_rmsnorm: out[i] = w[i] * (x[i] * r). */
void td_avx2_norm_apply(float *out, const float *x, const void *w, int dt, int n, float r);
void td_avx2_rope(float *v, const float *cs, const float *sn, int hd);
void td_avx2_exp(float *out, const float *x, int n);
void td_avx2_swiglu(float *out, const float *g, const float *u, int n);
/* f32 -> f16 with F16C (td_from_f32's TD_DTYPE_F16). */
void td_avx2_to_f16(uint16_t *dst, const float *src, size_t n);
void td_avx2_attend(float *o, int ldo, const float *q, int ldq, int nq, const int *n_keys,
                    const void *K, const void *V, int dt, int ldkv, int hd, float scale, float *scratch);
#endif

#endif
