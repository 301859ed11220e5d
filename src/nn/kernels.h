/* kernels — the numeric building blocks of the forward pass (CPU, f32 compute).
 *
 * Batch invariance is the rule every kernel here keeps: an output element is a
 * reduction over one axis accumulated in ONE fixed order that depends only on
 * the length of that axis — never on how many rows (tokens) are processed in the
 * same call or on the thread count. td_dot is the single dot-product order
 * (8-lane x 4-accumulator blocks, a fixed lane fold, then a sequential tail);
 * every matrix product and attention score goes through it or a variant that
 * produces the same bits (bf16/f16 rows are converted exactly to f32 first). */
#ifndef TD_KERNELS_H
#define TD_KERNELS_H

#include <stddef.h>
#include <stdint.h>

/* sum_k a[k]*b[k] in the fixed order described above. */
float td_dot(const float *a, const float *b, int n);
/* Same bits as td_dot(a, f32(w), n) for a bf16 / f16 vector w. */
float td_dot_bf16(const float *a, const uint16_t *w, int n);
float td_dot_f16(const float *a, const uint16_t *w, int n);

/* Convert n weights of dtype (TD_DTYPE_*) to f32. */
void td_to_f32(float *dst, const void *src, int dtype, size_t n);

/* y[m][n] = sum_k x[m][k] * W[n][k] for n in [n0, n1), m in [0, M).
 * W: [N][K] of dtype, row-major. x: [M][K] (row stride K), y: [M][N] (row stride
 * ldy). wbuf: scratch of K floats. Same bits for any M. */
void td_matmul_rows(float *y, int ldy, const float *x, int M, const void *W, int dtype,
                    int K, int n0, int n1, float *wbuf);

/* out = x * rsqrt(mean(x^2) + eps) * w  (w of dtype, length n); out may equal x. */
void td_rmsnorm(float *out, const float *x, const void *w, int dtype, int n, float eps);

/* out[i] = silu(g[i]) * u[i] */
void td_swiglu(float *out, const float *g, const float *u, int n);

#endif
