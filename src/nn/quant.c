/* quant — see quant.h for the formats, the quantizers and why the products are
 * bit-identical to f32 products over the dequantized weights.
 *
 * Three kernel paths, the same bits (chosen by td_kernels_path(), so
 * TD_KERNELS=portable|avx2|avx512 and td_kernels_set_path() switch them with the
 * rest): AVX-512 (F/BW/VL) register tiles here, AVX2 tiles in kernels_avx2.c, and
 * a portable C twin that emulates the 16 D16 lanes with fmaf. fold16 below repeats kernels.c's D16 fold (kernels.h);
 * tests/test_quant.c checks both paths against td_matmul on the dequantized
 * matrix with memcmp, so the two folds cannot drift apart unnoticed. */
#define _GNU_SOURCE
#include "nn/quant.h"
#include "nn/kernels.h"
#include "util/util.h"

#include <math.h>
#include <string.h>

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#include <immintrin.h>
#define TQ_AVX512 1
#endif

#include "nn/kernels_avx2.h" /* its tiles read Q8_0 / Q4_0 too (TD_HAVE_AVX2_PATH) */

#define AI static inline __attribute__((always_inline))

_Static_assert(sizeof(td_block_q8_0) == 34, "Q8_0 block is 34 bytes");
_Static_assert(sizeof(td_block_q4_0) == 18, "Q4_0 block is 18 bytes");

/* ---- dtype facts ---------------------------------------------------------- */

int td_dtype_is_quant(int dtype) { return dtype == TD_DTYPE_Q8_0 || dtype == TD_DTYPE_Q4_0; }

const char *td_dtype_name(int dtype) {
    switch (dtype) {
    case TD_DTYPE_F32: return "f32";
    case TD_DTYPE_F16: return "f16";
    case TD_DTYPE_BF16: return "bf16";
    case TD_DTYPE_Q8_0: return "q8_0";
    case TD_DTYPE_Q4_0: return "q4_0";
    default: return "?";
    }
}

static size_t block_bytes(int dtype) {
    return dtype == TD_DTYPE_Q8_0 ? sizeof(td_block_q8_0) : dtype == TD_DTYPE_Q4_0 ? sizeof(td_block_q4_0) : 0;
}

size_t td_dtype_row_bytes(int dtype, int64_t n) {
    if (n < 0) return 0;
    switch (dtype) {
    case TD_DTYPE_F32: return (size_t)n * 4;
    case TD_DTYPE_F16:
    case TD_DTYPE_BF16: return (size_t)n * 2;
    case TD_DTYPE_Q8_0:
    case TD_DTYPE_Q4_0: return n % TD_QK ? 0 : (size_t)(n / TD_QK) * block_bytes(dtype);
    default: return 0;
    }
}

int td_dtype_check_row(int dtype, int64_t n, const char *tensor, td_err *err) {
    if (dtype < 0 || dtype >= TD_DTYPE_COUNT)
        return td_seterr(err, TD_EFORMAT, "tensor %s: unknown dtype %d", tensor ? tensor : "?", dtype);
    if (td_dtype_is_quant(dtype) && (n <= 0 || n % TD_QK))
        return td_seterr(err, TD_EFORMAT,
                         "tensor %s: rows of %lld values cannot be stored as %s (needs a multiple of %d)",
                         tensor ? tensor : "?", (long long)n, td_dtype_name(dtype), TD_QK);
    return 0;
}

int td_dtype_check_tensor(int dtype, int64_t rows, int64_t k, uint64_t nbytes, const char *tensor, td_err *err) {
    int rc = td_dtype_check_row(dtype, k, tensor, err);
    if (rc) return rc;
    size_t rb = td_dtype_row_bytes(dtype, k), want;
    if (rows < 0 || td_mul_size(rb, (size_t)rows, &want))
        return td_seterr(err, TD_EFORMAT, "tensor %s: shape [%lld, %lld] is too large", tensor ? tensor : "?",
                         (long long)rows, (long long)k);
    if (nbytes != want)
        return td_seterr(err, TD_EFORMAT, "tensor %s: %s [%lld, %lld] needs %zu bytes but has %llu",
                         tensor ? tensor : "?", td_dtype_name(dtype), (long long)rows, (long long)k, want,
                         (unsigned long long)nbytes);
    return 0;
}

uint16_t td_f32_to_f16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
    uint32_t ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) return sign | 0x7e00 | (uint16_t)((ax >> 13) & 0x3ff); /* NaN stays NaN */
    if (ax >= 0x47800000u) return sign | 0x7c00;                                 /* >= 65536: inf */
    if (ax < 0x38800000u) {                                                      /* < 2^-14: subnormal */
        float a;
        memcpy(&a, &ax, 4);
        return sign | (uint16_t)rintf(a * 16777216.0f); /* exact scaling by 2^24, then RNE */
    }
    uint32_t h = ((ax >> 23) - 112) << 10 | ((ax >> 13) & 0x3ff); /* rebias 127 -> 15 */
    uint32_t rem = ax & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) h++; /* carries into the exponent correctly */
    return sign | (uint16_t)h;
}

/* ---- quantize / dequantize ---------------------------------------------- */

static void quant_q8_0(const float *x, td_block_q8_0 *y) {
    float amax = 0.0f;
    for (int j = 0; j < TD_QK; j++) amax = fmaxf(amax, fabsf(x[j]));
    float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    y->d = td_f32_to_f16(d);
    for (int j = 0; j < TD_QK; j++) {
        float v = roundf(x[j] * id);
        v = v > 127.0f ? 127.0f : v < -127.0f ? -127.0f : v == v ? v : 0.0f; /* only non-finite input clamps */
        y->qs[j] = (int8_t)v;
    }
}

static void quant_q4_0(const float *x, td_block_q4_0 *y) {
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < TD_QK; j++)
        if (amax < fabsf(x[j])) { amax = fabsf(x[j]); max = x[j]; }
    float d = max / -8.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    y->d = td_f32_to_f16(d);
    for (int j = 0; j < TD_QK / 2; j++) {
        float v0 = x[j] * id + 8.5f, v1 = x[TD_QK / 2 + j] * id + 8.5f;
        v0 = v0 >= 0.0f ? (v0 < 15.0f ? v0 : 15.0f) : 0.0f; /* trunc(v) <= 15, as min(15, (int8_t)v) */
        v1 = v1 >= 0.0f ? (v1 < 15.0f ? v1 : 15.0f) : 0.0f;
        y->qs[j] = (uint8_t)((int)v0 | (int)v1 << 4);
    }
}

int td_quantize_row(int dtype, const float *x, void *dst, int64_t n) {
    if (!td_dtype_is_quant(dtype) || n < 0 || n % TD_QK) return TD_EINVAL;
    for (int64_t b = 0; b < n / TD_QK; b++) {
        if (dtype == TD_DTYPE_Q8_0) quant_q8_0(x + b * TD_QK, (td_block_q8_0 *)dst + b);
        else quant_q4_0(x + b * TD_QK, (td_block_q4_0 *)dst + b);
    }
    return 0;
}

static float blk_scale(const void *blk) {
    uint16_t d;
    memcpy(&d, blk, 2);
    return td_f16_to_f32(d);
}

/* The 32 values of block b of a row, exact. */
static void deq_block_p(const char *row, int64_t b, int dt, float *out) {
    const char *blk = row + (size_t)b * block_bytes(dt);
    float d = blk_scale(blk);
    const unsigned char *q = (const unsigned char *)blk + 2;
    if (dt == TD_DTYPE_Q8_0) {
        for (int j = 0; j < TD_QK; j++) out[j] = (float)(int8_t)q[j] * d;
    } else {
        for (int j = 0; j < TD_QK / 2; j++) {
            out[j] = (float)((q[j] & 15) - 8) * d;
            out[j + TD_QK / 2] = (float)((q[j] >> 4) - 8) * d;
        }
    }
}

void td_dequantize_row(int dtype, const void *src, float *dst, int64_t n) {
    if (!td_dtype_is_quant(dtype)) return;
    for (int64_t b = 0; b < n / TD_QK; b++) deq_block_p(src, b, dtype, dst + b * TD_QK);
}

/* ---- portable products ---------------------------------------------------- */

static float fold16_p(const float *v) {
    float s8[8], s4[4], s2[2];
    for (int i = 0; i < 8; i++) s8[i] = v[i] + v[i + 8];
    for (int i = 0; i < 4; i++) s4[i] = s8[i] + s8[i + 4];
    for (int i = 0; i < 2; i++) s2[i] = s4[i] + s4[i + 2];
    return s2[0] + s2[1];
}

static void matmul_p(float *y, int ldy, const float *x, int ldx, int M, const char *W, int dt, int K,
                     int n0, int n1, int add) {
    size_t wrow = td_dtype_row_bytes(dt, K);
    float w[TD_QK];
    for (int n = n0; n < n1; n++)
        for (int m = 0; m < M; m++) {
            const float *a = x + (size_t)m * ldx;
            float acc[16] = {0};
            for (int b = 0; b < K / TD_QK; b++) {
                deq_block_p(W + (size_t)n * wrow, b, dt, w);
                for (int l = 0; l < TD_QK; l++) acc[l & 15] = fmaf(a[b * TD_QK + l], w[l], acc[l & 15]);
            }
            float s = fold16_p(acc), *yp = y + (size_t)m * ldy + n;
            *yp = add ? *yp + s : s;
        }
}

/* ---- AVX-512 products ------------------------------------------------------ */
#ifdef TQ_AVX512

AI float fold16(__m512 v) {
    __m256 lo = _mm512_castps512_ps256(v);
    __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
    __m256 a = _mm256_add_ps(lo, hi);
    __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    __m128 c = _mm_add_ps(b, _mm_movehl_ps(b, b));
    __m128 d = _mm_add_ss(c, _mm_movehdup_ps(c));
    return _mm_cvtss_f32(d);
}

/* 16 exact f32 weights: half h (values 16h .. 16h+15) of the block at blk. */
AI __m512 deq16(const char *blk, int h, int dt) {
    uint16_t d16;
    memcpy(&d16, blk, 2);
    __m512 d = _mm512_cvtph_ps(_mm256_set1_epi16((short)d16));
    __m128i q = _mm_loadu_si128((const __m128i *)(blk + 2 + (dt == TD_DTYPE_Q8_0 ? 16 * h : 0)));
    if (dt == TD_DTYPE_Q8_0) return _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q)), d);
    /* Q4_0: table[i] = (i - 8) * d, indexed by the nibble (vpermps reads index bits 0..3) */
    const __m512 tab = _mm512_setr_ps(-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7);
    __m512i idx = _mm512_cvtepu8_epi32(q);
    if (h) idx = _mm512_srli_epi32(idx, 4);
    return _mm512_permutexvar_ps(idx, _mm512_mul_ps(tab, d));
}

/* MR tokens x NR outputs, each a D16 dot over all of K (K % 32 == 0). */
AI void qtile(int MR, int NR, int dt, float *y, int ldy, const float *x, int ldx, const char *w, size_t wrow,
              int K, int add, const char *pf) {
    __m512 acc[8][8];
    const size_t bs = dt == TD_DTYPE_Q8_0 ? 34 : 18;
#pragma GCC unroll 8
    for (int i = 0; i < MR; i++)
#pragma GCC unroll 8
        for (int j = 0; j < NR; j++) acc[i][j] = _mm512_setzero_ps();
    for (int b = 0; b < K / 32; b++) {
        const char *blk = w + (size_t)b * bs;
        if (pf && (b & 1) == 0)
#pragma GCC unroll 8
            for (int j = 0; j < NR; j++) _mm_prefetch(pf + j * wrow + (size_t)b * bs, _MM_HINT_T0);
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            __m512 wv[8];
#pragma GCC unroll 8
            for (int j = 0; j < NR; j++) wv[j] = deq16(blk + j * wrow, h, dt);
#pragma GCC unroll 8
            for (int i = 0; i < MR; i++) {
                __m512 xv = _mm512_loadu_ps(x + (size_t)i * ldx + 32 * b + 16 * h);
                __asm__("" : "+v"(xv)); /* one load per token, not one per FMA */
#pragma GCC unroll 8
                for (int j = 0; j < NR; j++) acc[i][j] = _mm512_fmadd_ps(xv, wv[j], acc[i][j]);
            }
        }
    }
#pragma GCC unroll 8
    for (int i = 0; i < MR; i++)
#pragma GCC unroll 8
        for (int j = 0; j < NR; j++) {
            float s = fold16(acc[i][j]);
            float *yp = y + (size_t)i * ldy + j;
            *yp = add ? *yp + s : s;
        }
}

typedef void (*qtile_fn)(float *y, int ldy, const float *x, int ldx, const char *w, size_t wrow, int K, int add,
                         const char *pf);
#ifndef QMR
#define QMR 8 /* tokens per tile for M >= 2 */
#endif
#ifndef QNR
#define QNR 3 /* outputs per tile for M >= 2 */
#endif
#ifndef QNR1
#define QNR1 8 /* outputs per tile for M == 1 */
#endif
#define QT_INST(MR, NR, DT, SUF) QT_INST_(MR, NR, DT, SUF)
#define QT_INST_(MR, NR, DT, SUF)                                                                         \
    static void qt_##MR##x##NR##_##SUF(float *y, int ldy, const float *x, int ldx, const char *w,         \
                                       size_t wrow, int K, int add, const char *pf) {                     \
        qtile(MR, NR, DT, y, ldy, x, ldx, w, wrow, K, add, pf);                                           \
    }
#define QT_SET(DT, SUF)                                                                                   \
    QT_INST(1, 1, DT, SUF) QT_INST(2, 1, DT, SUF) QT_INST(3, 1, DT, SUF) QT_INST(4, 1, DT, SUF)           \
    QT_INST(5, 1, DT, SUF) QT_INST(6, 1, DT, SUF) QT_INST(7, 1, DT, SUF) QT_INST(8, 1, DT, SUF)           \
    QT_INST(1, QNR, DT, SUF) QT_INST(2, QNR, DT, SUF) QT_INST(3, QNR, DT, SUF) QT_INST(4, QNR, DT, SUF)   \
    QT_INST(5, QNR, DT, SUF) QT_INST(6, QNR, DT, SUF) QT_INST(7, QNR, DT, SUF) QT_INST(8, QNR, DT, SUF)   \
    QT_INST(1, QNR1, DT, SUF)
QT_SET(TD_DTYPE_Q8_0, q8)
QT_SET(TD_DTYPE_Q4_0, q4)

#define QN(MR, NR, SUF) qt_##MR##x##NR##_##SUF
#define QNX(MR, NR, SUF) QN(MR, NR, SUF)
typedef struct { qtile_fn t[9][2]; qtile_fn gemv; } qtile_set;
#define QTS(SUF) {{{0, 0}, {QN(1, 1, SUF), QNX(1, QNR, SUF)}, {QN(2, 1, SUF), QNX(2, QNR, SUF)},           \
                   {QN(3, 1, SUF), QNX(3, QNR, SUF)}, {QN(4, 1, SUF), QNX(4, QNR, SUF)},                   \
                   {QN(5, 1, SUF), QNX(5, QNR, SUF)}, {QN(6, 1, SUF), QNX(6, QNR, SUF)},                   \
                   {QN(7, 1, SUF), QNX(7, QNR, SUF)}, {QN(8, 1, SUF), QNX(8, QNR, SUF)}},                  \
                  QNX(1, QNR1, SUF)}
static const qtile_set QTILES[2] = {QTS(q8), QTS(q4)};

#define QMBLOCK 64 /* tokens whose activations stay in cache while a weight panel streams */

static void matmul_v(float *y, int ldy, const float *x, int ldx, int M, const char *W, int dt, int K, int n0,
                     int n1, int add) {
    size_t wrow = td_dtype_row_bytes(dt, K);
    const qtile_set *ts = &QTILES[dt == TD_DTYPE_Q8_0 ? 0 : 1];
    const char *wend = W + (size_t)n1 * wrow;
    if (M == 1) {
        int n = n0;
        for (; n + QNR1 <= n1; n += QNR1) {
            const char *pf = W + (size_t)(n + 2 * QNR1) * wrow; /* two panels ahead */
            ts->gemv(y + n, ldy, x, ldx, W + (size_t)n * wrow, wrow, K, add, pf + QNR1 * wrow <= wend ? pf : NULL);
        }
        for (; n < n1; n++) ts->t[1][0](y + n, ldy, x, ldx, W + (size_t)n * wrow, wrow, K, add, NULL);
        return;
    }
    for (int mb = 0; mb < M; mb += QMBLOCK) {
        int me = mb + QMBLOCK < M ? mb + QMBLOCK : M;
        int n = n0;
        for (; n + QNR <= n1; n += QNR) {
            const char *pf = W + (size_t)(n + 2 * QNR) * wrow;
            pf = pf + QNR * wrow <= wend ? pf : NULL;
            for (int m = mb; m < me; m += QMR) {
                int mr = me - m < QMR ? me - m : QMR;
                ts->t[mr][1](y + (size_t)m * ldy + n, ldy, x + (size_t)m * ldx, ldx, W + (size_t)n * wrow, wrow, K,
                             add, m == mb ? pf : NULL);
            }
        }
        for (; n < n1; n++)
            for (int m = mb; m < me; m += QMR) {
                int mr = me - m < QMR ? me - m : QMR;
                ts->t[mr][0](y + (size_t)m * ldy + n, ldy, x + (size_t)m * ldx, ldx, W + (size_t)n * wrow, wrow, K,
                             add, NULL);
            }
    }
}
#endif /* TQ_AVX512 */

void td_quant_matmul(float *y, int ldy, const float *x, int ldx, int M, const void *W, int dtype, int K, int n0,
                     int n1, int add) {
    if (M <= 0 || n0 >= n1) return;
    if (!td_dtype_is_quant(dtype) || K <= 0 || K % TD_QK) { /* callers validate; never silently wrong */
        for (int m = 0; m < M; m++)
            for (int n = n0; n < n1; n++) y[(size_t)m * ldy + n] = NAN;
        return;
    }
#ifdef TQ_AVX512
    if (td_kernels_path() == TD_KPATH_AVX512) {
        matmul_v(y, ldy, x, ldx, M, W, dtype, K, n0, n1, add);
        return;
    }
#endif
#ifdef TD_HAVE_AVX2_PATH
    if (td_kernels_path() == TD_KPATH_AVX2) {
        td_avx2_matmul(y, ldy, x, ldx, M, W, dtype, K, n0, n1, add);
        return;
    }
#endif
    matmul_p(y, ldy, x, ldx, M, W, dtype, K, n0, n1, add);
}
