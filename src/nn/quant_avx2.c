/* quant_avx2 — the Q16 order (quant.h) on 256-bit registers.
 *
 * One block per step: its 32 int8 weights w (Q4_0: nibble - 8) against the
 * block's 32 activation q: vpmaddubsw(|w|, sign(q, w)) gives 16 exact int16 pair
 * sums (|w| <= 128 and |q| <= 127, so a pair is at most 32512: never saturated,
 * even for a weight byte of -128), vpmaddwd with ones the 8 lanes P_b[l] (4
 * consecutive products each, as quant.h defines them). Then c = dw * d and one
 * fma per lane into the accumulator of the block's parity: lo (lanes 0-7) for
 * even blocks, hi (lanes 8-15) for odd ones; the fold is kernels_avx2.c's.
 * Tiles: 1 token x 1 output (decode: one weight stream), 2 tokens x 2 outputs. */
#include "nn/quant_avx2.h"
#include "nn/kernels_avx2.h"

#ifdef TD_HAVE_QUANT_AVX2
#if !defined(__AVX2__) || !defined(__FMA__) || !defined(__F16C__)
#error "quant_avx2.c needs -mavx2 -mfma -mf16c (the Makefile adds them on x86-64)"
#endif
#include "nn/quant.h"
#include "tandem.h"

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#define AI static inline __attribute__((always_inline))
#ifndef QPF1
/* the decode (1 x 1) tile: 64 blocks ahead, across row ends into the next row (16 blocks,
 * within the row, was 12-19% slower on the 0.6B shape's q8_0 decode on Zen 3) */
#define QPF1 64
#endif
#ifndef QPF
#define QPF 16 /* prefetch the weights this many blocks ahead (8 was 5-10% slower from memory on Zen 3) */
#endif

AI float fold16(__m256 lo, __m256 hi) {
    __m256 a = _mm256_add_ps(lo, hi);                                              /* s8 */
    __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1)); /* s4 */
    __m128 c = _mm_add_ps(b, _mm_movehl_ps(b, b));                                 /* s2 in lanes 0,1 */
    __m128 d = _mm_add_ss(c, _mm_movehdup_ps(c));                                  /* s2[0] + s2[1] */
    return _mm_cvtss_f32(d);
}

/* the 32 int8 weights of the block at blk */
AI __m256i wvals(const char *blk, int dt) {
    if (dt == TD_DTYPE_Q8_0) return _mm256_loadu_si256((const __m256i *)(blk + 2));
    __m128i q = _mm_loadu_si128((const __m128i *)(blk + 2));
    __m256i v = _mm256_inserti128_si256(_mm256_castsi128_si256(q), _mm_srli_epi16(q, 4), 1);
    return _mm256_sub_epi8(_mm256_and_si256(v, _mm256_set1_epi8(15)), _mm256_set1_epi8(8));
}
AI __m256 wscale(const char *blk) {
    uint16_t d;
    memcpy(&d, blk, 2);
    return _mm256_cvtph_ps(_mm_set1_epi16((short)d));
}

/* Block b of an MR x NR tile into acc (the accumulators of b's parity), output
 * by output: an output's weights, |weights| and scale, then every token's product
 * (at most 8 accumulators and 6 temporaries: all in registers). */
AI void qstep(int MR, int NR, int dt, __m256 (*acc)[2], const char *a, size_t lda, const char *w, size_t wrow, int K,
              int b, size_t bs) {
    const __m256i ones = _mm256_set1_epi16(1);
#pragma GCC unroll 2
    for (int j = 0; j < NR; j++) {
        const char *blk = w + j * wrow + (size_t)b * bs;
        __m256i wv = wvals(blk, dt), wa = _mm256_abs_epi8(wv);
        __m256 dw = wscale(blk);
#pragma GCC unroll 2
        for (int i = 0; i < MR; i++) {
            const char *ar = a + (size_t)i * lda;
            __m256i q = _mm256_loadu_si256((const __m256i *)(ar + 32 * b));
            __m256 dx = _mm256_broadcast_ss((const float *)(ar + K) + b);
            __m256i p16 = _mm256_maddubs_epi16(wa, _mm256_sign_epi8(q, wv));
            __m256 pv = _mm256_cvtepi32_ps(_mm256_madd_epi16(p16, ones));
            acc[i][j] = _mm256_fmadd_ps(_mm256_mul_ps(dw, dx), pv, acc[i][j]);
        }
    }
}

/* Blocks two at a time, the even one into lo and the odd one into hi: with the
 * parity known at compile time the accumulators stay in registers (picked at run
 * time, they lived on the stack, every block's fma waiting on a store and a reload). */
AI void qtile(int MR, int NR, int dt, float *y, int ldy, const char *a, size_t lda, const char *w, size_t wrow, int K,
              int add) {
    __m256 lo[2][2], hi[2][2]; /* [token][output] */
    const size_t bs = dt == TD_DTYPE_Q8_0 ? 34 : 18;
    const int nb = K / 32;
#pragma GCC unroll 2
    for (int i = 0; i < MR; i++)
#pragma GCC unroll 2
        for (int j = 0; j < NR; j++) lo[i][j] = hi[i][j] = _mm256_setzero_ps();
    int b = 0;
    for (; b + 2 <= nb; b += 2) {
        if (MR == 1 && NR == 1) /* decode: rows follow each other, so past the row's end lies the next row */
            _mm_prefetch(w + (size_t)(b + QPF1) * bs, _MM_HINT_T0);
        else if (b + QPF < nb)
#pragma GCC unroll 2
            for (int j = 0; j < NR; j++) _mm_prefetch(w + j * wrow + (size_t)(b + QPF) * bs, _MM_HINT_T0);
        qstep(MR, NR, dt, lo, a, lda, w, wrow, K, b, bs);
        qstep(MR, NR, dt, hi, a, lda, w, wrow, K, b + 1, bs);
    }
    if (b < nb) qstep(MR, NR, dt, lo, a, lda, w, wrow, K, b, bs);
#pragma GCC unroll 2
    for (int i = 0; i < MR; i++)
#pragma GCC unroll 2
        for (int j = 0; j < NR; j++) td_avx2_put(y, ldy, i, j, fold16(lo[i][j], hi[i][j]), add);
}

typedef void (*qtile_fn)(float *y, int ldy, const char *a, size_t lda, const char *w, size_t wrow, int K, int add);
#define QT_INST(MR, NR, DT, SUF)                                                                         \
    static void qt_##MR##x##NR##_##SUF(float *y, int ldy, const char *a, size_t lda, const char *w,      \
                                       size_t wrow, int K, int add) {                                    \
        qtile(MR, NR, DT, y, ldy, a, lda, w, wrow, K, add);                                              \
    }
#define QT_SET(DT, SUF) QT_INST(1, 1, DT, SUF) QT_INST(2, 1, DT, SUF) QT_INST(2, 2, DT, SUF)
QT_SET(TD_DTYPE_Q8_0, q8)
QT_SET(TD_DTYPE_Q4_0, q4)
typedef struct { qtile_fn t1, t2, t22; } qtile_set; /* 1x1, 2x1, 2x2 */
static const qtile_set QTILES[2] = {{qt_1x1_q8, qt_2x1_q8, qt_2x2_q8}, {qt_1x1_q4, qt_2x1_q4, qt_2x2_q4}};

void td_avx2_qmatmul(float *y, int ldy, const char *a, size_t lda, int M, const void *W, int dt, int K, int n0,
                     int n1, int add) {
    size_t wrow = td_dtype_row_bytes(dt, K);
    const char *wb = W;
    const qtile_set *ts = &QTILES[dt == TD_DTYPE_Q8_0 ? 0 : 1];
    if (M == 1) { /* one row at a time: a single stream from memory (1 x 4, four streams, was 20-25% slower) */
        for (int n = n0; n < n1; n++) ts->t1(y + n, ldy, a, lda, wb + n * wrow, wrow, K, add);
        return;
    }
    int n = n0;
    for (; n + 2 <= n1; n += 2)
        for (int m = 0; m < M; m += 2) {
            if (M - m >= 2) ts->t22(y + (size_t)m * ldy + n, ldy, a + (size_t)m * lda, lda, wb + n * wrow, wrow, K, add);
            else {
                ts->t1(y + (size_t)m * ldy + n, ldy, a + (size_t)m * lda, lda, wb + n * wrow, wrow, K, add);
                ts->t1(y + (size_t)m * ldy + n + 1, ldy, a + (size_t)m * lda, lda, wb + (n + 1) * wrow, wrow, K, add);
            }
        }
    for (; n < n1; n++)
        for (int m = 0; m < M; m += 2) {
            if (M - m >= 2) ts->t2(y + (size_t)m * ldy + n, ldy, a + (size_t)m * lda, lda, wb + n * wrow, wrow, K, add);
            else ts->t1(y + (size_t)m * ldy + n, ldy, a + (size_t)m * lda, lda, wb + n * wrow, wrow, K, add);
        }
}

#else
typedef int td_quant_avx2_empty; /* not an x86-64 build: no AVX2 path */
#endif
