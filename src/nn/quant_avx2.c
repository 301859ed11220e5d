/* quant_avx2 — the AVX2+FMA(+F16C) path of td_quant_matmul (quant.c dispatches
 * to it when kernels.h's path is TD_KPATH_AVX2; nothing else calls it).
 *
 * The same bits as quant.c's portable path: each weight is dequantized exactly
 * (q * d, or (nibble - 8) * d) and multiplied in the D16 order of kernels.h, the
 * 16 lanes held in two ymm registers (lanes 0-7, 8-15), folded as s8 = lo + hi,
 * then s4, s2, s. The file is compiled with -mavx2 -mfma -mf16c whatever the
 * build's ARCH is (Makefile), like kernels_avx2.c. Tiles: 1 token x 4 outputs
 * for decode, up to 4 tokens x 1 output otherwise (16 ymm registers). */
#define _GNU_SOURCE
#include "nn/quant.h"

#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>

#define AI static inline __attribute__((always_inline))

AI float fold16(__m256 lo, __m256 hi) {
    __m256 a = _mm256_add_ps(lo, hi);                                                /* s8 */
    __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));   /* s4 */
    __m128 c = _mm_add_ps(b, _mm_movehl_ps(b, b));                                   /* s2 */
    __m128 d = _mm_add_ss(c, _mm_movehdup_ps(c));
    return _mm_cvtss_f32(d);
}

/* values 16h .. 16h+15 of the block at blk: lanes 0-7 in *lo, 8-15 in *hi */
AI void deq16(const char *blk, int h, int dt, __m256 *lo, __m256 *hi) {
    uint16_t d16;
    memcpy(&d16, blk, 2);
    __m256 d = _mm256_cvtph_ps(_mm_set1_epi16((short)d16));
    __m128i v;
    if (dt == TD_DTYPE_Q8_0) {
        v = _mm_loadu_si128((const __m128i *)(blk + 2 + 16 * h));
    } else {
        v = _mm_loadu_si128((const __m128i *)(blk + 2));
        if (h) v = _mm_srli_epi16(v, 4);
        v = _mm_sub_epi8(_mm_and_si128(v, _mm_set1_epi8(15)), _mm_set1_epi8(8));
    }
    *lo = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v)), d);
    *hi = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(v, 8))), d);
}

AI void qtile(int MR, int NR, int dt, float *y, int ldy, const float *x, int ldx, const char *w, size_t wrow,
              int K, int add) {
    __m256 acc[4][4][2];
    const size_t bs = dt == TD_DTYPE_Q8_0 ? 34 : 18;
    for (int i = 0; i < MR; i++)
        for (int j = 0; j < NR; j++) acc[i][j][0] = acc[i][j][1] = _mm256_setzero_ps();
    for (int b = 0; b < K / 32; b++)
        for (int h = 0; h < 2; h++) {
            const float *xb = x + 32 * b + 16 * h;
            for (int j = 0; j < NR; j++) {
                __m256 lo, hi;
                deq16(w + j * wrow + (size_t)b * bs, h, dt, &lo, &hi);
                for (int i = 0; i < MR; i++) {
                    acc[i][j][0] = _mm256_fmadd_ps(_mm256_loadu_ps(xb + (size_t)i * ldx), lo, acc[i][j][0]);
                    acc[i][j][1] = _mm256_fmadd_ps(_mm256_loadu_ps(xb + (size_t)i * ldx + 8), hi, acc[i][j][1]);
                }
            }
        }
    for (int i = 0; i < MR; i++)
        for (int j = 0; j < NR; j++) {
            float s = fold16(acc[i][j][0], acc[i][j][1]);
            float *yp = y + (size_t)i * ldy + j;
            *yp = add ? *yp + s : s;
        }
}

#define QT(MR, NR, DT, SUF)                                                                                \
    static void qt_##MR##x##NR##_##SUF(float *y, int ldy, const float *x, int ldx, const char *w,          \
                                       size_t wrow, int K, int add) {                                      \
        qtile(MR, NR, DT, y, ldy, x, ldx, w, wrow, K, add);                                                \
    }
QT(1, 4, TD_DTYPE_Q8_0, q8) QT(1, 1, TD_DTYPE_Q8_0, q8) QT(2, 1, TD_DTYPE_Q8_0, q8) QT(3, 1, TD_DTYPE_Q8_0, q8)
QT(4, 1, TD_DTYPE_Q8_0, q8)
QT(1, 4, TD_DTYPE_Q4_0, q4) QT(1, 1, TD_DTYPE_Q4_0, q4) QT(2, 1, TD_DTYPE_Q4_0, q4) QT(3, 1, TD_DTYPE_Q4_0, q4)
QT(4, 1, TD_DTYPE_Q4_0, q4)

typedef void (*qtile_fn)(float *, int, const float *, int, const char *, size_t, int, int);
static const qtile_fn TILES[2][5] = {
    {qt_1x4_q8, qt_1x1_q8, qt_2x1_q8, qt_3x1_q8, qt_4x1_q8},
    {qt_1x4_q4, qt_1x1_q4, qt_2x1_q4, qt_3x1_q4, qt_4x1_q4},
};

void td_quant_matmul_avx2(float *y, int ldy, const float *x, int ldx, int M, const void *W, int dt, int K, int n0,
                          int n1, int add);
void td_quant_matmul_avx2(float *y, int ldy, const float *x, int ldx, int M, const void *W, int dt, int K, int n0,
                          int n1, int add) {
    size_t wrow = td_dtype_row_bytes(dt, K);
    const qtile_fn *t = TILES[dt == TD_DTYPE_Q8_0 ? 0 : 1];
    const char *wb = W;
    if (M == 1) {
        int n = n0;
        for (; n + 4 <= n1; n += 4) t[0](y + n, ldy, x, ldx, wb + (size_t)n * wrow, wrow, K, add);
        for (; n < n1; n++) t[1](y + n, ldy, x, ldx, wb + (size_t)n * wrow, wrow, K, add);
        return;
    }
    for (int mb = 0; mb < M; mb += 64) { /* 64 tokens' activations stay in cache while rows stream */
        int me = mb + 64 < M ? mb + 64 : M;
        for (int n = n0; n < n1; n++)
            for (int m = mb; m < me; m += 4) {
                int mr = me - m < 4 ? me - m : 4;
                t[mr](y + (size_t)m * ldy + n, ldy, x + (size_t)m * ldx, ldx, wb + (size_t)n * wrow, wrow, K, add);
            }
    }
}
#endif
