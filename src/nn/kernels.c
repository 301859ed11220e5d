/* kernels — see kernels.h for the invariance rule. The AVX2+FMA path and the
 * portable path implement the same summation order; within one binary only one
 * is compiled, so results never depend on the data's shape or the batch. */
#include "kernels.h"
#include "tandem.h"
#include "util/util.h"

#include <math.h>
#include <string.h>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define TD_HAVE_AVX2 1
#endif

#ifdef TD_HAVE_AVX2
static inline float hsum8(__m256 v) {
    /* fixed fold: (lo128 + hi128), then pairwise within 128 */
    __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
    __m128 s = _mm_add_ps(lo, hi);
    __m128 sh = _mm_movehl_ps(s, s);
    s = _mm_add_ps(s, sh);
    sh = _mm_shuffle_ps(s, s, 1);
    s = _mm_add_ss(s, sh);
    return _mm_cvtss_f32(s);
}
static inline __m256 load_bf16x8(const uint16_t *p) {
    __m128i h = _mm_loadu_si128((const __m128i *)p);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
static inline __m256 load_f16x8(const uint16_t *p) {
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}
#define DOT_BODY(LOADW)                                                        \
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;                \
    int k = 0;                                                                 \
    for (; k + 32 <= n; k += 32) {                                             \
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + k), LOADW(k), a0);            \
        a1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + k + 8), LOADW(k + 8), a1);    \
        a2 = _mm256_fmadd_ps(_mm256_loadu_ps(a + k + 16), LOADW(k + 16), a2);  \
        a3 = _mm256_fmadd_ps(_mm256_loadu_ps(a + k + 24), LOADW(k + 24), a3);  \
    }                                                                          \
    for (; k + 8 <= n; k += 8)                                                 \
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + k), LOADW(k), a0);            \
    float s = hsum8(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));

float td_dot(const float *a, const float *b, int n) {
#define LW(i) _mm256_loadu_ps(b + (i))
    DOT_BODY(LW)
#undef LW
    for (; k < n; k++) s = fmaf(a[k], b[k], s);
    return s;
}
float td_dot_bf16(const float *a, const uint16_t *w, int n) {
#define LW(i) load_bf16x8(w + (i))
    DOT_BODY(LW)
#undef LW
    for (; k < n; k++) s = fmaf(a[k], td_bf16_to_f32(w[k]), s);
    return s;
}
float td_dot_f16(const float *a, const uint16_t *w, int n) {
#define LW(i) load_f16x8(w + (i))
    DOT_BODY(LW)
#undef LW
    for (; k < n; k++) s = fmaf(a[k], td_f16_to_f32(w[k]), s);
    return s;
}
#else
/* Portable path: 4 accumulators of 8 lanes, folded as the AVX2 path does. */
static float dot_generic(const float *a, const void *w, int dtype, int n) {
    float acc[4][8] = {{0}};
    int k = 0;
#define W(i) (dtype == TD_DTYPE_F32 ? ((const float *)w)[i] : dtype == TD_DTYPE_BF16 ? \
              td_bf16_to_f32(((const uint16_t *)w)[i]) : td_f16_to_f32(((const uint16_t *)w)[i]))
    for (; k + 32 <= n; k += 32)
        for (int j = 0; j < 4; j++)
            for (int l = 0; l < 8; l++) acc[j][l] = fmaf(a[k + 8 * j + l], W(k + 8 * j + l), acc[j][l]);
    for (; k + 8 <= n; k += 8)
        for (int l = 0; l < 8; l++) acc[0][l] = fmaf(a[k + l], W(k + l), acc[0][l]);
    float v[8];
    for (int l = 0; l < 8; l++) v[l] = (acc[0][l] + acc[1][l]) + (acc[2][l] + acc[3][l]);
    float s4[4];
    for (int l = 0; l < 4; l++) s4[l] = v[l] + v[l + 4];
    float s = (s4[0] + s4[2]) + (s4[1] + s4[3]);
    for (; k < n; k++) s = fmaf(a[k], W(k), s);
#undef W
    return s;
}
float td_dot(const float *a, const float *b, int n) { return dot_generic(a, b, TD_DTYPE_F32, n); }
float td_dot_bf16(const float *a, const uint16_t *w, int n) { return dot_generic(a, w, TD_DTYPE_BF16, n); }
float td_dot_f16(const float *a, const uint16_t *w, int n) { return dot_generic(a, w, TD_DTYPE_F16, n); }
#endif

void td_to_f32(float *dst, const void *src, int dtype, size_t n) {
    if (dtype == TD_DTYPE_F32) {
        memcpy(dst, src, n * sizeof(float));
    } else if (dtype == TD_DTYPE_BF16) {
        const uint16_t *s = src;
        for (size_t i = 0; i < n; i++) dst[i] = td_bf16_to_f32(s[i]);
    } else {
        const uint16_t *s = src;
        for (size_t i = 0; i < n; i++) dst[i] = td_f16_to_f32(s[i]);
    }
}

void td_matmul_rows(float *y, int ldy, const float *x, int M, const void *W, int dtype,
                    int K, int n0, int n1, float *wbuf) {
    size_t esz = dtype == TD_DTYPE_F32 ? 4 : 2;
    const char *wb = W;
    if (M == 1) { /* stream the weights once, no conversion pass */
        for (int n = n0; n < n1; n++) {
            const void *wr = wb + (size_t)n * K * esz;
            y[n] = dtype == TD_DTYPE_F32    ? td_dot(x, wr, K)
                   : dtype == TD_DTYPE_BF16 ? td_dot_bf16(x, wr, K)
                                            : td_dot_f16(x, wr, K);
        }
        return;
    }
    for (int n = n0; n < n1; n++) {
        const void *wr = wb + (size_t)n * K * esz;
        const float *wf = wr;
        if (dtype != TD_DTYPE_F32) { td_to_f32(wbuf, wr, dtype, (size_t)K); wf = wbuf; }
        for (int m = 0; m < M; m++) y[(size_t)m * ldy + n] = td_dot(x + (size_t)m * K, wf, K);
    }
}

void td_rmsnorm(float *out, const float *x, const void *w, int dtype, int n, float eps) {
    float ss = 0.0f;
    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    float r = 1.0f / sqrtf(ss / (float)n + eps);
    for (int i = 0; i < n; i++) {
        float wi = dtype == TD_DTYPE_F32    ? ((const float *)w)[i]
                   : dtype == TD_DTYPE_BF16 ? td_bf16_to_f32(((const uint16_t *)w)[i])
                                            : td_f16_to_f32(((const uint16_t *)w)[i]);
        out[i] = wi * (x[i] * r);
    }
}

void td_swiglu(float *out, const float *g, const float *u, int n) {
    for (int i = 0; i < n; i++) out[i] = (g[i] / (1.0f + expf(-g[i]))) * u[i];
}
