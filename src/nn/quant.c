/* quant — see quant.h for the formats, the quantizers, the activation
 * quantization and the Q16 order every quantized product follows.
 *
 * Three kernel paths, the same bits (chosen by td_kernels_path(), so
 * TD_KERNELS=portable|avx2|avx512 and td_kernels_set_path() switch them with the
 * rest): AVX-512 VNNI register tiles here (Q8_0, Q4_0, Q5_0, IQ4_NL; Q2_K-Q6_K
 * in kq512.c), AVX2 tiles in quant_avx2.c, and a portable C twin. Integer block
 * products are exact, so the paths agree as long
 * as each lane receives the same fmas in the same order; tests/test_quant.c
 * checks them against each other and against a scalar transcription of the Q16
 * order with memcmp.
 *
 * Activations are quantized once per call, up to QMB rows at a time, into a
 * per-thread scratch buffer: the "plain" layout (portable, AVX2) is per row
 * q[K] int8 then d[K/32] f32; the AVX-512 layout is per row and per pair of
 * blocks 192 bytes: the 64 q bytes, 16 int32 lanes of -128 * (sum of 4 q) (the
 * start of the vpdpbusd accumulator, see quant.h) and 16 f32 scales (d of the
 * even block in lanes 0-7, of the odd one in 8-15); the strip kernels (M >= 2,
 * below) use a 136-byte variant with the two blocks' dwords interleaved. */
#define _GNU_SOURCE
#include "nn/quant.h"
#include "nn/kernels.h"
#include "nn/kernels_neon.h"
#include "nn/kquant.h"
#include "nn/kq512.h"
#include "util/util.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512VNNI__)
#include <immintrin.h>
#define TQ_VNNI 1
#endif

#include "nn/quant_avx2.h"

#define AI static inline __attribute__((always_inline))

_Static_assert(sizeof(td_block_q8_0) == 34, "Q8_0 block is 34 bytes");
_Static_assert(sizeof(td_block_q4_0) == 18, "Q4_0 block is 18 bytes");

/* ---- dtype facts ---------------------------------------------------------- */

const int8_t td_iq4_values[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

int td_dtype_is_kquant(int dtype) {
    return dtype == TD_DTYPE_Q4_K || dtype == TD_DTYPE_Q5_K || dtype == TD_DTYPE_Q6_K || dtype == TD_DTYPE_IQ4_XS ||
           dtype == TD_DTYPE_Q3_K || dtype == TD_DTYPE_Q2_K;
}

int td_dtype_is_quant(int dtype) {
    return dtype == TD_DTYPE_Q8_0 || dtype == TD_DTYPE_Q4_0 || dtype == TD_DTYPE_Q5_0 || dtype == TD_DTYPE_IQ4_NL ||
           td_dtype_has_min32(dtype) || td_dtype_is_kquant(dtype);
}

int td_dtype_has_min32(int dtype) { return dtype == TD_DTYPE_Q4_1 || dtype == TD_DTYPE_Q5_1; }

int td_dtype_block(int dtype) { return td_dtype_is_kquant(dtype) ? TD_QKK : td_dtype_is_quant(dtype) ? TD_QK : 1; }

const char *td_dtype_name(int dtype) {
    switch (dtype) {
    case TD_DTYPE_F32: return "f32";
    case TD_DTYPE_F16: return "f16";
    case TD_DTYPE_BF16: return "bf16";
    case TD_DTYPE_Q8_0: return "q8_0";
    case TD_DTYPE_Q4_0: return "q4_0";
    case TD_DTYPE_Q5_0: return "q5_0";
    case TD_DTYPE_Q4_1: return "q4_1";
    case TD_DTYPE_Q5_1: return "q5_1";
    case TD_DTYPE_IQ4_NL: return "iq4_nl";
    case TD_DTYPE_IQ4_XS: return "iq4_xs";
    case TD_DTYPE_Q3_K: return "q3_k";
    case TD_DTYPE_Q2_K: return "q2_k";
    case TD_DTYPE_Q4_K: return "q4_k";
    case TD_DTYPE_Q5_K: return "q5_k";
    case TD_DTYPE_Q6_K: return "q6_k";
    default: return "?";
    }
}

int td_dtype_parse(const char *name) {
    for (int d = 0; name && d < TD_DTYPE_COUNT; d++)
        if (!strcmp(name, td_dtype_name(d))) return d;
    return -1;
}

/* bytes of one block (td_dtype_block values) of a block format; 0 otherwise */
static size_t block_bytes(int dtype) {
    return dtype == TD_DTYPE_Q8_0   ? sizeof(td_block_q8_0)
           : dtype == TD_DTYPE_Q4_0 || dtype == TD_DTYPE_IQ4_NL ? sizeof(td_block_q4_0)
           : dtype == TD_DTYPE_Q5_0 ? sizeof(td_block_q5_0)
           : dtype == TD_DTYPE_Q4_1 ? sizeof(td_block_q4_1)
           : dtype == TD_DTYPE_Q5_1 ? sizeof(td_block_q5_1)
                                    : td_kq_block_bytes(dtype);
}

size_t td_dtype_row_bytes(int dtype, int64_t n) {
    if (n < 0) return 0;
    switch (dtype) {
    case TD_DTYPE_F32: return (size_t)n * 4;
    case TD_DTYPE_F16:
    case TD_DTYPE_BF16: return (size_t)n * 2;
    case TD_DTYPE_Q8_0:
    case TD_DTYPE_Q4_0:
    case TD_DTYPE_Q5_0:
    case TD_DTYPE_Q4_1:
    case TD_DTYPE_Q5_1:
    case TD_DTYPE_IQ4_NL:
    case TD_DTYPE_IQ4_XS:
    case TD_DTYPE_Q3_K:
    case TD_DTYPE_Q2_K:
    case TD_DTYPE_Q4_K:
    case TD_DTYPE_Q5_K:
    case TD_DTYPE_Q6_K: {
        int qk = td_dtype_block(dtype);
        return n % qk ? 0 : (size_t)(n / qk) * block_bytes(dtype);
    }
    default: return 0;
    }
}

int td_dtype_check_row(int dtype, int64_t n, const char *tensor, td_err *err) {
    if (dtype < 0 || dtype >= TD_DTYPE_COUNT)
        return td_seterr(err, TD_EFORMAT, "tensor %s: unknown dtype %d", tensor ? tensor : "?", dtype);
    if (td_dtype_is_quant(dtype) && (n <= 0 || n % td_dtype_block(dtype)))
        return td_seterr(err, TD_EFORMAT,
                         "tensor %s: rows of %lld values cannot be stored as %s (needs a multiple of %d)",
                         tensor ? tensor : "?", (long long)n, td_dtype_name(dtype), td_dtype_block(dtype));
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

/* Q4_0 (half = 8) and Q5_0 (half = 16), as llama.cpp's quantize_row_q{4,5}_0_ref:
 * d = (the value of largest magnitude) / -half, q = min(2 half - 1, trunc(x/d + half
 * + 0.5)); the low 4 bits into qs (value j low nibble, value j + 16 high), bit 4
 * of value i into bit i of *qh (Q5_0) */
static void quant_q4_q5(const float *x, int half, uint16_t *d16, uint8_t *qs, uint32_t *qh) {
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < TD_QK; j++)
        if (amax < fabsf(x[j])) { amax = fabsf(x[j]); max = x[j]; }
    float d = max / -(float)half, id = d != 0.0f ? 1.0f / d : 0.0f, top = (float)(2 * half - 1);
    *d16 = td_f32_to_f16(d);
    if (qh) *qh = 0;
    for (int j = 0; j < TD_QK / 2; j++) {
        float v0 = x[j] * id + (float)half + 0.5f, v1 = x[TD_QK / 2 + j] * id + (float)half + 0.5f;
        v0 = v0 >= 0.0f ? (v0 < top ? v0 : top) : 0.0f; /* trunc(v) <= top, as min(top, (int8_t)v) */
        v1 = v1 >= 0.0f ? (v1 < top ? v1 : top) : 0.0f;
        int q0 = (int)v0, q1 = (int)v1;
        qs[j] = (uint8_t)((q0 & 15) | (q1 & 15) << 4);
        if (qh) *qh |= (uint32_t)(q0 >> 4) << j | (uint32_t)(q1 >> 4) << (j + TD_QK / 2);
    }
}

static void quant_q4_0(const float *x, td_block_q4_0 *y) { quant_q4_q5(x, 8, &y->d, y->qs, NULL); }

/* Q4_1 (top = 15) and Q5_1 (top = 31), as llama.cpp's quantize_row_q{4,5}_1_ref:
 * d = (max - min) / top, m = min, q = min(top, trunc((x - min) / d + 0.5)) (clamped
 * first, so non-finite input gives defined bytes) */
static void quant_q4_q5_1(const float *x, int top, uint16_t *d16, uint16_t *m16, uint8_t *qs, uint32_t *qh) {
    float lo = INFINITY, hi = -INFINITY;
    for (int j = 0; j < TD_QK; j++) {
        if (x[j] < lo) lo = x[j];
        if (x[j] > hi) hi = x[j];
    }
    float d = (hi - lo) / (float)top, id = d != 0.0f ? 1.0f / d : 0.0f, t = (float)top;
    *d16 = td_f32_to_f16(d);
    *m16 = td_f32_to_f16(lo);
    if (qh) *qh = 0;
    for (int j = 0; j < TD_QK / 2; j++) {
        float v0 = (x[j] - lo) * id + 0.5f, v1 = (x[TD_QK / 2 + j] - lo) * id + 0.5f;
        v0 = v0 >= 0.0f ? (v0 < t ? v0 : t) : 0.0f;
        v1 = v1 >= 0.0f ? (v1 < t ? v1 : t) : 0.0f;
        int q0 = (int)v0, q1 = (int)v1;
        qs[j] = (uint8_t)((q0 & 15) | (q1 & 15) << 4);
        if (qh) *qh |= (uint32_t)(q0 >> 4) << j | (uint32_t)(q1 >> 4) << (j + TD_QK / 2);
    }
}

static void quant_q4_1(const float *x, td_block_q4_1 *y) { quant_q4_q5_1(x, 15, &y->d, &y->m, y->qs, NULL); }

static void quant_q5_1(const float *x, td_block_q5_1 *y) {
    uint32_t qh;
    quant_q4_q5_1(x, 31, &y->d, &y->m, y->qs, &qh);
    for (int k = 0; k < 4; k++) y->qh[k] = (uint8_t)(qh >> (8 * k));
}

int td_iq4_nearest(float v) {
    if (!(v == v)) return 8; /* NaN: the value nearest 0 */
    int k = 0;
    while (k < 15 && (float)td_iq4_values[k + 1] <= v) k++;
    if (k < 15 && (float)td_iq4_values[k + 1] - v < v - (float)td_iq4_values[k]) k++;
    return k;
}

/* IQ4_NL (tandem's own quantizer): d maps the value of largest magnitude onto the
 * table's -127, every value to the nearest table entry */
static void quant_iq4_nl(const float *x, td_block_iq4_nl *y) {
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < TD_QK; j++)
        if (amax < fabsf(x[j])) { amax = fabsf(x[j]); max = x[j]; }
    float d = td_f16_to_f32(y->d = td_f32_to_f16(max / -127.0f)), id = d != 0.0f ? 1.0f / d : 0.0f;
    for (int j = 0; j < TD_QK / 2; j++)
        y->qs[j] = (uint8_t)(td_iq4_nearest(x[j] * id) | td_iq4_nearest(x[j + TD_QK / 2] * id) << 4);
}

static void quant_q5_0(const float *x, td_block_q5_0 *y) {
    uint32_t qh;
    quant_q4_q5(x, 16, &y->d, y->qs, &qh);
    for (int k = 0; k < 4; k++) y->qh[k] = (uint8_t)(qh >> (8 * k));
}

int td_quantize_row(int dtype, const float *x, void *dst, int64_t n) {
    if (!td_dtype_is_quant(dtype) || n < 0 || n % td_dtype_block(dtype)) return TD_EINVAL;
    if (td_dtype_is_kquant(dtype)) { td_kq_quantize_row(dtype, x, dst, n); return 0; }
    for (int64_t b = 0; b < n / TD_QK; b++) {
        if (dtype == TD_DTYPE_Q8_0) quant_q8_0(x + b * TD_QK, (td_block_q8_0 *)dst + b);
        else if (dtype == TD_DTYPE_Q5_0) quant_q5_0(x + b * TD_QK, (td_block_q5_0 *)dst + b);
        else if (dtype == TD_DTYPE_IQ4_NL) quant_iq4_nl(x + b * TD_QK, (td_block_iq4_nl *)dst + b);
        else if (dtype == TD_DTYPE_Q4_1) quant_q4_1(x + b * TD_QK, (td_block_q4_1 *)dst + b);
        else if (dtype == TD_DTYPE_Q5_1) quant_q5_1(x + b * TD_QK, (td_block_q5_1 *)dst + b);
        else quant_q4_0(x + b * TD_QK, (td_block_q4_0 *)dst + b);
    }
    return 0;
}

static float blk_scale(const void *blk) {
    uint16_t d;
    memcpy(&d, blk, 2);
    return td_f16_to_f32(d);
}

static void wvals_p(const unsigned char *blk, int dt, int8_t *w);
void td_block_i8(const void *blk, int dtype, int8_t w[32]) { wvals_p(blk, dtype, w); }

/* The 32 values of block b of a row, exact. */
static void deq_block_p(const char *row, int64_t b, int dt, float *out) {
    const char *blk = row + (size_t)b * block_bytes(dt);
    float d = blk_scale(blk);
    const unsigned char *q = (const unsigned char *)blk + 2;
    if (dt == TD_DTYPE_Q8_0) {
        for (int j = 0; j < TD_QK; j++) out[j] = (float)(int8_t)q[j] * d;
    } else if (dt == TD_DTYPE_Q5_0 || dt == TD_DTYPE_IQ4_NL || td_dtype_has_min32(dt)) {
        int8_t w[TD_QK];
        wvals_p((const unsigned char *)blk, dt, w);
        float m = td_dtype_has_min32(dt) ? blk_scale(blk + 2) : 0.0f;
        for (int j = 0; j < TD_QK; j++) out[j] = td_dtype_has_min32(dt) ? (float)w[j] * d + m : (float)w[j] * d;
    } else {
        for (int j = 0; j < TD_QK / 2; j++) {
            out[j] = (float)((q[j] & 15) - 8) * d;
            out[j + TD_QK / 2] = (float)((q[j] >> 4) - 8) * d;
        }
    }
}

void td_dequantize_row(int dtype, const void *src, float *dst, int64_t n) {
    if (!td_dtype_is_quant(dtype)) return;
    if (td_dtype_is_kquant(dtype)) { td_kq_dequantize_row(dtype, src, dst, n); return; }
    for (int64_t b = 0; b < n / TD_QK; b++) deq_block_p(src, b, dtype, dst + b * TD_QK);
}

/* ---- activation quantization ------------------------------------------------ */

#define ACT_TINY 0x0d800000u /* 2^-100 as f32 bits: smaller blocks quantize to 0 */

/* Scale d and its inverse for a block whose largest |x| has the f32 bits ab;
 * returns 0 when the block's q are all 0 (non-finite or tiny block). */
int td_quant_act_scale(uint32_t ab, float *d, float *id) {
    if (ab >= 0x7f800000u) { *d = NAN; *id = 0.0f; return 0; }
    if (ab < ACT_TINY) { *d = 0.0f; *id = 0.0f; return 0; }
    float amax;
    memcpy(&amax, &ab, 4);
    *d = amax / 127.0f;
    *id = 1.0f / *d;
    return 1;
}

/* n activations (32, or 256 for the k-quants) -> n int8 q and their scale */
static void act_block_p(const float *x, int n, int8_t *q, float *d) {
    uint32_t ab = 0;
    for (int j = 0; j < n; j++) {
        uint32_t u;
        memcpy(&u, x + j, 4);
        u &= 0x7fffffffu;
        ab = u > ab ? u : ab;
    }
    float id;
    if (!td_quant_act_scale(ab, d, &id)) { memset(q, 0, (size_t)n); return; }
    for (int j = 0; j < n; j++) q[j] = (int8_t)(int)rintf(x[j] * id); /* |x * id| <= 127.0001 */
}

/* the row's blocks of n by the AVX2 path when the kernels take it (the same operations), else portably */
static void act_blocks(const float *x, int K, int n, int8_t *q, float *d) {
#ifdef TD_HAVE_QUANT_AVX2
    int path = td_kernels_path();
    if (path == TD_KPATH_AVX2 || path == TD_KPATH_AVX512) {
        for (int b = 0; b < K / n; b++) td_avx2_quant_act(x + b * n, n, q + b * n, d + b);
        return;
    }
#endif
    for (int b = 0; b < K / n; b++) act_block_p(x + b * n, n, q + b * n, d + b);
}

void td_quant_act_row(const float *x, int K, int8_t *q, float *d) { act_blocks(x, K, TD_QK, q, d); }

void td_quant_act_row_k(const float *x, int K, int8_t *q, float *d, int32_t *sums, int16_t *sums16) {
    act_blocks(x, K, TD_QKK, q, d);
    for (int b = 0; b < K / 16; b++) {
        int t = 0;
        for (int i = 0; i < 16; i++) t += q[16 * b + i];
        sums16[b] = (int16_t)t; /* |t| <= 16 * 127 */
    }
    for (int b = 0; b < K / TD_QK; b++) sums[b] = (int32_t)sums16[2 * b] + sums16[2 * b + 1];
}

#define QMB 64 /* rows quantized per pass: their packed activations stay in cache while a weight panel streams */

/* ---- portable products ---------------------------------------------------- */

static float fold16_p(const float *v) {
    float s8[8], s4[4], s2[2];
    for (int i = 0; i < 8; i++) s8[i] = v[i] + v[i + 8];
    for (int i = 0; i < 4; i++) s4[i] = s8[i] + s8[i + 4];
    for (int i = 0; i < 2; i++) s2[i] = s4[i] + s4[i + 2];
    return s2[0] + s2[1];
}

/* the 32 int8 values of a weight block (Q4_0: nibble - 8; Q5_0: 5 bits - 16;
 * Q4_1 / Q5_1: the unsigned q; IQ4_NL: the table's value of the nibble) */
static void wvals_p(const unsigned char *blk, int dt, int8_t *w) {
    if (dt == TD_DTYPE_Q8_0) {
        memcpy(w, blk + 2, TD_QK);
        return;
    }
    if (dt == TD_DTYPE_Q5_0 || dt == TD_DTYPE_Q5_1) {
        const unsigned char *h = blk + (dt == TD_DTYPE_Q5_1 ? 4 : 2), *qs = h + 4;
        uint32_t qh = (uint32_t)h[0] | (uint32_t)h[1] << 8 | (uint32_t)h[2] << 16 | (uint32_t)h[3] << 24;
        int bias = dt == TD_DTYPE_Q5_0 ? 16 : 0;
        for (int j = 0; j < TD_QK / 2; j++) {
            w[j] = (int8_t)(((qs[j] & 15) | ((qh >> j) & 1) << 4) - bias);
            w[j + TD_QK / 2] = (int8_t)(((qs[j] >> 4) | ((qh >> (j + TD_QK / 2)) & 1) << 4) - bias);
        }
        return;
    }
    if (dt == TD_DTYPE_Q4_1) {
        for (int j = 0; j < TD_QK / 2; j++) {
            w[j] = (int8_t)(blk[4 + j] & 15);
            w[j + TD_QK / 2] = (int8_t)(blk[4 + j] >> 4);
        }
        return;
    }
    if (dt == TD_DTYPE_IQ4_NL) {
        for (int j = 0; j < TD_QK / 2; j++) {
            w[j] = td_iq4_values[blk[2 + j] & 15];
            w[j + TD_QK / 2] = td_iq4_values[blk[2 + j] >> 4];
        }
        return;
    }
    for (int j = 0; j < TD_QK / 2; j++) {
        w[j] = (int8_t)((blk[2 + j] & 15) - 8);
        w[j + TD_QK / 2] = (int8_t)((blk[2 + j] >> 4) - 8);
    }
}

/* plain layout: row m at a + m * lda: q[K], then d[K/32] f32 (Q4_1 / Q5_1: then
 * S[K/32] int32, the blocks' exact sums of q); for the k-quants (kq) q[K],
 * d[K/256] f32, S[K/32] int32, S'[K/16] int16 (td_quant_act_row_k) */
static size_t plain_ld(int K) { return ((size_t)K + 12 * (size_t)(K / TD_QK) + 63) & ~(size_t)63; }

static void pack_plain(char *a, size_t lda, const float *x, int ldx, int M, int K, int dt) {
    for (int m = 0; m < M; m++) {
        char *r = a + (size_t)m * lda;
        if (td_dtype_is_kquant(dt)) {
            int32_t *S = (int32_t *)(r + K) + K / TD_QKK;
            td_quant_act_row_k(x + (size_t)m * ldx, K, (int8_t *)r, (float *)(r + K), S, (int16_t *)(S + K / TD_QK));
            continue;
        }
        td_quant_act_row(x + (size_t)m * ldx, K, (int8_t *)r, (float *)(r + K));
        int32_t *S = (int32_t *)(r + K) + K / TD_QK;
        for (int b = 0; td_dtype_has_min32(dt) && b < K / TD_QK; b++) {
            int32_t t = 0;
            for (int i = 0; i < TD_QK; i++) t += ((const int8_t *)r)[TD_QK * b + i];
            S[b] = t;
        }
    }
}

static void matmul_p(float *y, int ldy, const char *a, size_t lda, int M, const char *W, int dt, int K, int n0,
                     int n1, int add) {
    size_t wrow = td_dtype_row_bytes(dt, K), bs = block_bytes(dt);
    int nb = K / TD_QK;
    int8_t w[TD_QK];
    for (int n = n0; n < n1; n++)
        for (int m = 0; m < M; m++) {
            const int8_t *q = (const int8_t *)(a + (size_t)m * lda);
            const float *d = (const float *)(a + (size_t)m * lda + K);
            const int32_t *S = (const int32_t *)(d + nb);
            float acc[16] = {0}, macc[8] = {0};
            for (int b = 0; b < nb; b++) {
                const unsigned char *blk = (const unsigned char *)W + (size_t)n * wrow + (size_t)b * bs;
                wvals_p(blk, dt, w);
                float c = blk_scale(blk) * d[b];
                for (int l = 0; l < 8; l++) {
                    int32_t p = 0;
                    for (int i = 0; i < 4; i++) p += (int32_t)w[4 * l + i] * q[32 * b + 4 * l + i];
                    acc[8 * (b & 1) + l] = fmaf(c, (float)p, acc[8 * (b & 1) + l]);
                }
                if (td_dtype_has_min32(dt)) macc[b % 8] = fmaf(blk_scale(blk + 2) * d[b], (float)S[b], macc[b % 8]);
            }
            float s = fold16_p(acc), *yp = y + (size_t)m * ldy + n;
            if (td_dtype_has_min32(dt)) s += td_fold8(macc);
            *yp = add ? *yp + s : s;
        }
}

/* ---- AVX-512 VNNI products ------------------------------------------------- */
#ifdef TQ_VNNI

AI float fold16(__m512 v) {
    __m256 lo = _mm512_castps512_ps256(v);
    __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
    __m256 a = _mm256_add_ps(lo, hi);
    __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    __m128 c = _mm_add_ps(b, _mm_movehl_ps(b, b));
    __m128 d = _mm_add_ss(c, _mm_movehdup_ps(c));
    return _mm_cvtss_f32(d);
}

#define PAIR 192 /* packed bytes per row and pair of blocks */
#ifndef QPF
#define QPF 2
#endif
#ifndef QPFH
#define QPFH _MM_HINT_T0
#endif

/* 32 activations -> 32 int8 q (the portable act_block_p's operations: exact
 * max of |x| bits, rint by vcvtps2dq under the default rounding mode) */
AI void act_block_v(const float *x, int8_t *q, float *d) {
    __m512 v0 = _mm512_loadu_ps(x), v1 = _mm512_loadu_ps(x + 16);
    const __m512i abs = _mm512_set1_epi32(0x7fffffff);
    __m512i ab = _mm512_max_epu32(_mm512_and_si512(_mm512_castps_si512(v0), abs),
                                  _mm512_and_si512(_mm512_castps_si512(v1), abs));
    float id;
    if (!td_quant_act_scale((uint32_t)_mm512_reduce_max_epu32(ab), d, &id)) {
        memset(q, 0, TD_QK);
        return;
    }
    __m512 vid = _mm512_set1_ps(id);
    _mm_storeu_si128((__m128i *)q, _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(v0, vid))));
    _mm_storeu_si128((__m128i *)(q + 16), _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(v1, vid))));
}

/* Row layout (strip = 0; PAIR bytes per row and pair, see the top of the
 * file) or the strip kernels' layout (strip = 1; XAP bytes per pair: the q
 * dwords of the two blocks interleaved, 2l = dword l of block 2p, 2l + 1 =
 * dword l of block 2p + 1; the 16 int32 -128 * (sum of that dword's 4 q) in
 * the same order; then f32 d of 2p and of 2p + 1). */
#define XAP 136
static void pack_v(char *a, size_t lda, const float *x, int ldx, int M, int K, int strip) {
    int nb = K / TD_QK;
    const __m512i u128 = _mm512_set1_epi8((char)0x80);
    const __m512i idx = _mm512_set_epi32(15, 7, 14, 6, 13, 5, 12, 4, 11, 3, 10, 2, 9, 1, 8, 0);
    for (int m = 0; m < M; m++)
        for (int p = 0; 2 * p < nb; p++) {
            char *o = a + (size_t)m * lda + (size_t)p * (strip ? XAP : PAIR);
            float d[2] = {0.0f, 0.0f};
            for (int h = 0; h < 2; h++) {
                if (2 * p + h < nb) act_block_v(x + (size_t)m * ldx + (size_t)(2 * p + h) * TD_QK, (int8_t *)o + 32 * h, &d[h]);
                else memset(o + 32 * h, 0, TD_QK);
            }
            __m512i q = _mm512_loadu_si512(o);
            if (strip) {
                q = _mm512_permutexvar_epi32(idx, q);
                _mm512_storeu_si512(o, q);
            }
            __m512i s = _mm512_dpbusd_epi32(_mm512_setzero_si512(), u128, q); /* 128 * sum of 4 q per lane */
            _mm512_storeu_si512(o + 64, _mm512_sub_epi32(_mm512_setzero_si512(), s));
            if (strip) memcpy(o + 128, d, sizeof d);
            else _mm512_storeu_ps(o + 128, _mm512_insertf32x8(_mm512_set1_ps(d[0]), _mm256_set1_ps(d[1]), 1));
        }
}

/* the formats of these kernels: Q8_0, Q4_0, Q5_0, IQ4_NL (signed values, no minimum) */
#define VBS(dt) /* block bytes */ \
    ((dt) == TD_DTYPE_Q8_0 ? sizeof(td_block_q8_0) : (dt) == TD_DTYPE_Q5_0 ? sizeof(td_block_q5_0)   \
     : (dt) == TD_DTYPE_IQ4_NL ? sizeof(td_block_iq4_nl) : sizeof(td_block_q4_0))
static int vnni_dtype(int dt) {
    return dt == TD_DTYPE_Q8_0 || dt == TD_DTYPE_Q4_0 || dt == TD_DTYPE_Q5_0 || dt == TD_DTYPE_IQ4_NL;
}

/* Blocks 2p, 2p+1 of a weight row (blk = block 2p; one = only block 2p exists):
 * the 64 values as u8 = w + 128, and the scales (dw of block 2p in lanes 0-7). */
AI __m512i wpair(const char *blk, int dt, int one) {
    if (dt == TD_DTYPE_Q8_0) {
        __m256i lo = _mm256_loadu_si256((const __m256i *)(blk + 2));
        __m256i hi = one ? _mm256_setzero_si256() : _mm256_loadu_si256((const __m256i *)(blk + 36));
        return _mm512_xor_si512(_mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1), _mm512_set1_epi8((char)0x80));
    }
    /* the nibbles, byte i = value i of block 2p, byte 32 + i = value i of block 2p+1:
       128-bit lanes [qs0, qs0 >> 4, qs1, qs1 >> 4] & 15 */
    const size_t qo = dt == TD_DTYPE_Q5_0 ? 6 : 2, bs = VBS(dt);
    __m128i a = _mm_loadu_si128((const __m128i *)(blk + qo));
    __m128i b = one ? _mm_setzero_si128() : _mm_loadu_si128((const __m128i *)(blk + bs + qo));
    __m256i lo = _mm256_inserti128_si256(_mm256_castsi128_si256(a), _mm_srli_epi16(a, 4), 1);
    __m256i hi = _mm256_inserti128_si256(_mm256_castsi128_si256(b), _mm_srli_epi16(b, 4), 1);
    __m512i v = _mm512_and_si512(_mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1), _mm512_set1_epi8(15));
    if (dt == TD_DTYPE_IQ4_NL) { /* the table's value + 128 */
        const __m128i t = _mm_add_epi8(_mm_loadu_si128((const __m128i *)td_iq4_values), _mm_set1_epi8((char)0x80));
        return _mm512_shuffle_epi8(_mm512_broadcast_i32x4(t), v);
    }
    if (dt == TD_DTYPE_Q5_0) { /* bit i of qh: bit 4 of value i; w = value - 16, + 128 */
        uint32_t h0, h1 = 0;
        memcpy(&h0, blk + 2, 4);
        if (!one) memcpy(&h1, blk + bs + 2, 4);
        v = _mm512_add_epi8(v, _mm512_set1_epi8(112));
        return _mm512_mask_add_epi8(v, (__mmask64)((uint64_t)h1 << 32 | h0), v, _mm512_set1_epi8(16));
    }
    return _mm512_add_epi8(v, _mm512_set1_epi8(120)); /* Q4_0: nibble - 8 + 128 */
}
AI __m512 wscale(const char *blk, size_t bs, int one) {
    uint16_t d0, d1 = 0;
    memcpy(&d0, blk, 2);
    if (!one) memcpy(&d1, blk + bs, 2);
    __m256i h = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_set1_epi16((short)d0)), _mm_set1_epi16((short)d1), 1);
    return _mm512_cvtph_ps(h);
}

/* One pair of blocks (2p, 2p+1; one: only 2p exists, the last block of an odd
 * count) of an MR x NR tile. */
AI void istep(int MR, int NR, int dt, __m512 (*acc)[8], const char *a, size_t lda, const char *w, size_t wrow,
              int p, int one) {
    const size_t bs = VBS(dt);
    const char *blk = w + (size_t)(2 * p) * bs;
    __m512i wu[8];
    __m512 dw[8];
#pragma GCC unroll 8
    for (int j = 0; j < NR; j++) {
        wu[j] = wpair(blk + j * wrow, dt, one);
        dw[j] = wscale(blk + j * wrow, bs, one);
    }
#pragma GCC unroll 8
    for (int i = 0; i < MR; i++) {
        const char *ap = a + (size_t)i * lda + (size_t)p * PAIR;
        __m512i q = _mm512_loadu_si512(ap);
        __m512 dx = _mm512_loadu_ps(ap + 128);
        __asm__("" : "+v"(q), "+v"(dx)); /* one load each per token, not one per output */
#pragma GCC unroll 8
        for (int j = 0; j < NR; j++) {
            __m512 pv = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(_mm512_loadu_si512(ap + 64), wu[j], q));
            __m512 c = _mm512_mul_ps(dw[j], dx);
            acc[i][j] = one ? _mm512_mask3_fmadd_ps(c, pv, acc[i][j], 0x00FF) : _mm512_fmadd_ps(c, pv, acc[i][j]);
        }
    }
}

/* MR tokens x NR outputs in the Q16 order (nb blocks; a: packed rows at stride
 * lda; w: NR weight rows at stride wrow; pf: the rows to prefetch, or NULL). */
AI void itile(int MR, int NR, int dt, float *y, int ldy, const char *a, size_t lda, const char *w, size_t wrow,
              int nb, int add, const char *pf) {
    __m512 acc[8][8];
    const size_t bs = VBS(dt);
#pragma GCC unroll 8
    for (int i = 0; i < MR; i++)
#pragma GCC unroll 8
        for (int j = 0; j < NR; j++) acc[i][j] = _mm512_setzero_ps();
    int p = 0;
    for (; 2 * p + 1 < nb; p++) {
        if (pf) /* the pair's first and last byte: every line of each row (a pair spans at most two) */
#pragma GCC unroll 8
            for (int j = 0; j < NR; j++) {
                _mm_prefetch(pf + j * wrow + (size_t)(2 * p) * bs, QPFH);
                _mm_prefetch(pf + j * wrow + (size_t)(2 * p + 2) * bs - 1, QPFH);
            }
        istep(MR, NR, dt, acc, a, lda, w, wrow, p, 0);
    }
    if (2 * p < nb) istep(MR, NR, dt, acc, a, lda, w, wrow, p, 1);
#pragma GCC unroll 8
    for (int i = 0; i < MR; i++)
#pragma GCC unroll 8
        for (int j = 0; j < NR; j++) {
            float s = fold16(acc[i][j]);
            float *yp = y + (size_t)i * ldy + j;
            *yp = add ? *yp + s : s;
        }
}

typedef void (*itile_fn)(float *y, int ldy, const char *a, size_t lda, const char *w, size_t wrow, int nb, int add,
                         const char *pf);
/* Tiles (in L2, one core, K = 1024 and 3072, M = 2..64, in-process against
 * 8x2, 8x3 and 4x3: 4x4 was best or level everywhere; M = 1: 1x8 streamed
 * faster than 1x2, 1x4, 1x6): 4 tokens x 4 outputs keep 16 accumulators, the
 * 4 outputs' weights and scales and one token's activations in registers. */
#define QMR 4  /* tokens per tile for M >= 2 */
#define QNR 4  /* outputs per tile for M >= 2 */
#define QNR1 8 /* outputs per tile for M == 1 */
#define IT_INST(MR, NR, DT, SUF)                                                                          \
    static void it_##MR##x##NR##_##SUF(float *y, int ldy, const char *a, size_t lda, const char *w,       \
                                       size_t wrow, int nb, int add, const char *pf) {                    \
        itile(MR, NR, DT, y, ldy, a, lda, w, wrow, nb, add, pf);                                          \
    }
#define IT_SET(DT, SUF)                                                                                   \
    IT_INST(1, 1, DT, SUF) IT_INST(2, 1, DT, SUF) IT_INST(3, 1, DT, SUF) IT_INST(4, 1, DT, SUF)           \
    IT_INST(1, 4, DT, SUF) IT_INST(2, 4, DT, SUF) IT_INST(3, 4, DT, SUF) IT_INST(4, 4, DT, SUF)           \
    IT_INST(1, 8, DT, SUF)
IT_SET(TD_DTYPE_Q8_0, q8)
IT_SET(TD_DTYPE_Q4_0, q4)
IT_SET(TD_DTYPE_Q5_0, q5)
IT_SET(TD_DTYPE_IQ4_NL, n4)

typedef struct { itile_fn t[QMR + 1][2]; itile_fn gemv; } itile_set; /* t[mr][NR = 1 | QNR] */
#define ITS(S) {{{0, 0}, {it_1x1_##S, it_1x4_##S}, {it_2x1_##S, it_2x4_##S}, {it_3x1_##S, it_3x4_##S},         \
                 {it_4x1_##S, it_4x4_##S}}, it_1x8_##S}
static const itile_set ITILES[4] = {ITS(q8), ITS(q4), ITS(q5), ITS(n4)};
/* the index of dt's tiles in ITILES */
static int vnni_set(int dt) { return dt == TD_DTYPE_Q8_0 ? 0 : dt == TD_DTYPE_Q4_0 ? 1 : dt == TD_DTYPE_Q5_0 ? 2 : 3; }

static int vnni_ok(void) {
    static int ok = -1;
    if (ok < 0) {
        __builtin_cpu_init();
        ok = __builtin_cpu_supports("avx512vnni");
    }
    return ok;
}

/* rows [0, M) of the packed activations a against weight rows [n0, n1) */
static void matmul_v(float *y, int ldy, const char *a, size_t lda, int M, const char *W, int dt, int K, int n0,
                     int n1, int add) {
    size_t wrow = td_dtype_row_bytes(dt, K);
    int nb = K / TD_QK;
    const itile_set *ts = &ITILES[vnni_set(dt)];
    const char *wend = W + (size_t)n1 * wrow;
    if (M == 1) {
        int n = n0;
        for (; n + QNR1 <= n1; n += QNR1) {
            const char *pf = W + (size_t)(n + QPF * QNR1) * wrow; /* QPF panels ahead */
            ts->gemv(y + n, ldy, a, lda, W + (size_t)n * wrow, wrow, nb, add, pf + QNR1 * wrow <= wend ? pf : NULL);
        }
        for (; n < n1; n++) ts->t[1][0](y + n, ldy, a, lda, W + (size_t)n * wrow, wrow, nb, add, NULL);
        return;
    }
    int n = n0;
    for (; n + QNR <= n1; n += QNR) {
        const char *pf = W + (size_t)(n + 2 * QNR) * wrow;
        pf = pf + QNR * wrow <= wend ? pf : NULL;
        for (int m = 0; m < M; m += QMR) {
            int mr = M - m < QMR ? M - m : QMR;
            ts->t[mr][1](y + (size_t)m * ldy + n, ldy, a + (size_t)m * lda, lda, W + (size_t)n * wrow, wrow, nb, add,
                         m == 0 ? pf : NULL);
        }
    }
    for (; n < n1; n++)
        for (int m = 0; m < M; m += QMR) {
            int mr = M - m < QMR ? M - m : QMR;
            ts->t[mr][0](y + (size_t)m * ldy + n, ldy, a + (size_t)m * lda, lda, W + (size_t)n * wrow, wrow, nb, add,
                         NULL);
        }
}
/* ---- strips: 8 outputs per 512-bit vector, M >= QXM ------------------------
 * The same Q16 lanes, laid out across outputs: a strip of 8 weight rows is
 * transposed once per call (per QMB rows) into vectors whose dword lane 2j + h
 * holds the 4 weight bytes l of row j, block 2p + h (as u8 = w + 128). One
 * vpdpbusd against the token's 4 activation bytes l of blocks 2p and 2p + 1
 * (a broadcast qword) then gives P_b[l] of 8 outputs x 2 blocks, and
 * acc[l] = fma(c, P, acc[l]) updates Q16 lanes (h, l) of the 8 outputs: each
 * lane receives the fmas of the row layout in the same order, and the D16 fold
 * becomes vertical adds (lane 2j: even + odd, then l, l + 4, ...). The scale
 * product c = dw * d costs one multiply per token and pair for 8 outputs (the
 * row tiles: one per output), and the fold is shared by 8 outputs. */
#define XS 8              /* outputs per strip */
#define XPAIR (8 * 64 + 64) /* strip bytes per pair of blocks: 8 weight vectors, 16 f32 scales */
/* smallest M for the strip kernels (one core, weights streaming from DRAM,
 * K = 1024 / 3072, bench/quant_ab.c against the row tiles: q8_0 M = 2 1.22x,
 * M = 8 1.29x / 0.99x, M = 64 1.35x / 1.17x; q4_0 M = 4 0.94x, M = 8 1.36x / 1.09x) */
#define QXM_Q8 2
#define QXM_Q4 8
#ifndef QXPF
#define QXPF 1 /* strips prefetched ahead */
#endif
#ifndef QXR
#define QXR 3 /* tokens per strip tile */
#endif

/* Transpose nv (<= 8) weight rows (w, stride wrow; missing rows are zeros) of
 * nb blocks into s: per pair p, XPAIR bytes (8 vectors l, then the scales). */
AI void strip_xx(char *s, const char *w, size_t wrow, int nv, int dt, int nb, const char *pf) {
    const size_t bs = VBS(dt);
    const __m512i idx = _mm512_set_epi32(15, 7, 14, 6, 13, 5, 12, 4, 11, 3, 10, 2, 9, 1, 8, 0);
    for (int p = 0; 2 * p < nb; p++) {
        int one = 2 * p + 1 >= nb;
        __m512i r[8];
        uint16_t dh[16];
        if (pf)
#pragma GCC unroll 8
            for (int j = 0; j < XS; j++) {
                _mm_prefetch(pf + (size_t)j * wrow + (size_t)(2 * p) * bs, _MM_HINT_T0);
                if (dt == TD_DTYPE_Q8_0) _mm_prefetch(pf + (size_t)j * wrow + (size_t)(2 * p) * bs + 64, _MM_HINT_T0);
            }
#pragma GCC unroll 8
        for (int j = 0; j < XS; j++) {
            if (j < nv) {
                const char *blk = w + (size_t)j * wrow + (size_t)(2 * p) * bs;
                r[j] = _mm512_permutexvar_epi32(idx, wpair(blk, dt, one));
                memcpy(&dh[2 * j], blk, 2);
                if (one) dh[2 * j + 1] = 0;
                else memcpy(&dh[2 * j + 1], blk + bs, 2);
            } else {
                r[j] = _mm512_set1_epi8((char)0x80);
                dh[2 * j] = dh[2 * j + 1] = 0;
            }
        }
        /* 8 x 8 qwords: o[l] qword j = r[j] qword l */
        __m512i t[8], u[8];
#pragma GCC unroll 4
        for (int j = 0; j < 8; j += 2) {
            t[j] = _mm512_unpacklo_epi64(r[j], r[j + 1]);
            t[j + 1] = _mm512_unpackhi_epi64(r[j], r[j + 1]);
        }
        /* t[2i] 128-bit lane k = (r[2i] q2k, r[2i+1] q2k); t[2i+1]: q2k+1 */
#pragma GCC unroll 2
        for (int e = 0; e < 2; e++) {
            u[4 * e + 0] = _mm512_shuffle_i64x2(t[e], t[e + 2], 0x88);
            u[4 * e + 1] = _mm512_shuffle_i64x2(t[e], t[e + 2], 0xDD);
            u[4 * e + 2] = _mm512_shuffle_i64x2(t[e + 4], t[e + 6], 0x88);
            u[4 * e + 3] = _mm512_shuffle_i64x2(t[e + 4], t[e + 6], 0xDD);
        }
        char *o = s + (size_t)p * XPAIR;
#pragma GCC unroll 2
        for (int e = 0; e < 2; e++) {
            /* qword l = 2k + e */
            _mm512_storeu_si512(o + 64 * (0 + e), _mm512_shuffle_i64x2(u[4 * e], u[4 * e + 2], 0x88));
            _mm512_storeu_si512(o + 64 * (4 + e), _mm512_shuffle_i64x2(u[4 * e], u[4 * e + 2], 0xDD));
            _mm512_storeu_si512(o + 64 * (2 + e), _mm512_shuffle_i64x2(u[4 * e + 1], u[4 * e + 3], 0x88));
            _mm512_storeu_si512(o + 64 * (6 + e), _mm512_shuffle_i64x2(u[4 * e + 1], u[4 * e + 3], 0xDD));
        }
        _mm512_storeu_ps(o + 512, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)dh)));
    }
}
static void strip_full_q8(char *s, const char *w, size_t wrow, int nb, const char *pf) { strip_xx(s, w, wrow, XS, TD_DTYPE_Q8_0, nb, pf); }
static void strip_full_q4(char *s, const char *w, size_t wrow, int nb, const char *pf) { strip_xx(s, w, wrow, XS, TD_DTYPE_Q4_0, nb, pf); }
static void strip_full_q5(char *s, const char *w, size_t wrow, int nb, const char *pf) { strip_xx(s, w, wrow, XS, TD_DTYPE_Q5_0, nb, pf); }
static void strip_full_n4(char *s, const char *w, size_t wrow, int nb, const char *pf) { strip_xx(s, w, wrow, XS, TD_DTYPE_IQ4_NL, nb, pf); }
/* nv (<= 8) rows; a full strip of 8 through the specialized copies */
static void strip_x(char *s, const char *w, size_t wrow, int nv, int dt, int nb, const char *pf) {
    if (nv == XS) {
        if (dt == TD_DTYPE_Q8_0) strip_full_q8(s, w, wrow, nb, pf);
        else if (dt == TD_DTYPE_Q4_0) strip_full_q4(s, w, wrow, nb, pf);
        else if (dt == TD_DTYPE_Q5_0) strip_full_q5(s, w, wrow, nb, pf);
        else strip_full_n4(s, w, wrow, nb, pf);
    } else strip_xx(s, w, wrow, nv, dt, nb, NULL);
}

AI __m512i bcst64(const char *p) {
    int64_t v;
    memcpy(&v, p, 8);
    return _mm512_set1_epi64(v);
}

/* MR tokens (packed by pack_v(..., 1) at a, stride lda) x one strip s of nv outputs. */
AI void xtile(int MR, float *y, int ldy, const char *a, size_t lda, const char *s, int nb, int nv, int add) {
    __m512 acc[QXR][8];
#pragma GCC unroll 8
    for (int i = 0; i < MR; i++)
#pragma GCC unroll 8
        for (int l = 0; l < 8; l++) acc[i][l] = _mm512_setzero_ps();
    for (int p = 0; 2 * p < nb; p++) {
        const char *sp = s + (size_t)p * XPAIR;
        const int one = 2 * p + 1 >= nb;
        __m512 dw = _mm512_loadu_ps(sp + 512), c[QXR];
#pragma GCC unroll 8
        for (int i = 0; i < MR; i++)
            c[i] = _mm512_mul_ps(dw, _mm512_castsi512_ps(bcst64(a + (size_t)i * lda + (size_t)p * XAP + 128)));
#pragma GCC unroll 8
        for (int l = 0; l < 8; l++) {
            __m512i wv = _mm512_loadu_si512(sp + 64 * l);
#pragma GCC unroll 8
            for (int i = 0; i < MR; i++) {
                const char *ap = a + (size_t)i * lda + (size_t)p * XAP;
                __m512i ia = _mm512_dpbusd_epi32(bcst64(ap + 64 + 8 * l), wv, bcst64(ap + 8 * l));
                __m512 pv = _mm512_cvtepi32_ps(ia);
                acc[i][l] = one ? _mm512_mask3_fmadd_ps(c[i], pv, acc[i][l], 0x5555) : _mm512_fmadd_ps(c[i], pv, acc[i][l]);
            }
        }
    }
    const __mmask8 vm = (__mmask8)((1u << nv) - 1);
#pragma GCC unroll 8
    for (int i = 0; i < MR; i++) {
        __m512 t[8];
#pragma GCC unroll 8
        for (int l = 0; l < 8; l++) /* lane 2j: s8[l] of output j (even + odd block lanes) */
            t[l] = _mm512_add_ps(acc[i][l], _mm512_permute_ps(acc[i][l], 0xB1));
#pragma GCC unroll 4
        for (int l = 0; l < 4; l++) t[l] = _mm512_add_ps(t[l], t[l + 4]);
        t[0] = _mm512_add_ps(t[0], t[2]);
        t[1] = _mm512_add_ps(t[1], t[3]);
        __m512 sv = _mm512_add_ps(t[0], t[1]);
        __m256 r = _mm512_castps512_ps256(_mm512_maskz_compress_ps(0x5555, sv));
        float *yp = y + (size_t)i * ldy;
        if (add) r = _mm256_add_ps(_mm256_maskz_loadu_ps(vm, yp), r);
        _mm256_mask_storeu_ps(yp, vm, r);
    }
}

typedef void (*xtile_fn)(float *y, int ldy, const char *a, size_t lda, const char *s, int nb, int nv, int add);
#define XT_INST(MR)                                                                                       \
    static void xt_##MR(float *y, int ldy, const char *a, size_t lda, const char *s, int nb, int nv, int add) { \
        xtile(MR, y, ldy, a, lda, s, nb, nv, add);                                                        \
    }
XT_INST(1) XT_INST(2) XT_INST(3)
static const xtile_fn XTILES[4] = {0, xt_1, xt_2, xt_3};

/* rows [0, M) of the strip-packed activations a against weight rows [n0, n1);
 * s: scratch for one strip */
static void matmul_x(float *y, int ldy, const char *a, size_t lda, int M, const char *W, int dt, int K, int n0,
                     int n1, int add, char *s) {
    size_t wrow = td_dtype_row_bytes(dt, K);
    int nb = K / TD_QK;
    for (int n = n0; n < n1; n += XS) {
        int nv = n1 - n < XS ? n1 - n : XS;
        const char *pf = n + (1 + QXPF) * XS <= n1 ? W + (size_t)(n + QXPF * XS) * wrow : NULL;
        strip_x(s, W + (size_t)n * wrow, wrow, nv, dt, nb, pf);
        for (int m = 0; m < M; m += QXR) {
            int mr = M - m < QXR ? M - m : QXR;
            XTILES[mr](y + (size_t)m * ldy + n, ldy, a + (size_t)m * lda, lda, s, nb, nv, add);
        }
    }
}
#endif /* TQ_VNNI */

static void set_nan(float *y, int ldy, int M, int n0, int n1) {
    for (int m = 0; m < M; m++)
        for (int n = n0; n < n1; n++) y[(size_t)m * ldy + n] = NAN;
}

void td_quant_matmul(float *y, int ldy, const float *x, int ldx, int M, const void *W, int dtype, int K, int n0,
                     int n1, int add) {
    if (M <= 0 || n0 >= n1) return;
    if (!td_dtype_is_quant(dtype) || K <= 0 || K % td_dtype_block(dtype)) { set_nan(y, ldy, M, n0, n1); return; } /* callers validate */
    int path = td_kernels_path(), mb = M < QMB ? M : QMB, kq = td_dtype_is_kquant(dtype);
    if (path == TD_KPATH_AVX512 && td_kq512_ok(dtype) && td_kq512_matmul(y, ldy, x, ldx, M, W, dtype, K, n0, n1, add) == 0)
        return; /* Q4_K / Q5_K / Q6_K on AVX-512 VNNI (kq512.h); the others, and a failed scratch, below */
#ifdef TQ_VNNI
    if (path == TD_KPATH_AVX512 && vnni_ok() && vnni_dtype(dtype)) { /* others: the AVX2 tiles below */
        size_t lda = (size_t)(K / TD_QK + 1) / 2 * PAIR;
        if (M >= (dtype == TD_DTYPE_Q8_0 ? QXM_Q8 : QXM_Q4)) {
            size_t sb = (size_t)(K / TD_QK + 1) / 2 * XPAIR;
            lda = ((size_t)(K / TD_QK + 1) / 2 * XAP + 63) & ~(size_t)63;
            char *a = td_thread_scratch(lda * (size_t)mb + sb);
            if (!a) { set_nan(y, ldy, M, n0, n1); return; }
            for (int m = 0; m < M; m += QMB) {
                int me = m + QMB < M ? m + QMB : M;
                pack_v(a, lda, x + (size_t)m * ldx, ldx, me - m, K, 1);
                matmul_x(y + (size_t)m * ldy, ldy, a, lda, me - m, W, dtype, K, n0, n1, add, a + lda * (size_t)mb);
            }
            return;
        }
        char *a = td_thread_scratch(lda * (size_t)mb);
        if (!a) { set_nan(y, ldy, M, n0, n1); return; }
        for (int m = 0; m < M; m += QMB) {
            int me = m + QMB < M ? m + QMB : M;
            pack_v(a, lda, x + (size_t)m * ldx, ldx, me - m, K, 0);
            matmul_v(y + (size_t)m * ldy, ldy, a, lda, me - m, W, dtype, K, n0, n1, add);
        }
        return;
    }
#endif
    size_t lda = plain_ld(K);
    char *a = td_thread_scratch(lda * (size_t)mb);
    if (!a) { set_nan(y, ldy, M, n0, n1); return; }
    for (int m = 0; m < M; m += QMB) {
        int me = m + QMB < M ? m + QMB : M;
        pack_plain(a, lda, x + (size_t)m * ldx, ldx, me - m, K, dtype);
#ifdef TD_HAVE_QUANT_AVX2
        if (path == TD_KPATH_AVX2 || path == TD_KPATH_AVX512) { /* AVX-512 without VNNI: the AVX2 kernels */
            td_avx2_qmatmul(y + (size_t)m * ldy, ldy, a, lda, me - m, W, dtype, K, n0, n1, add);
            continue;
        }
#endif
#ifdef TD_HAVE_NEON_PATH
        if (path == TD_KPATH_NEON && (dtype == TD_DTYPE_Q8_0 || dtype == TD_DTYPE_Q4_0) && td_neon_dotprod_ok()) {
            td_neon_qmatmul(y + (size_t)m * ldy, ldy, a, lda, me - m, W, dtype, K, n0, n1, add);
            continue;
        }
#endif
        if (kq) td_kq_matmul_p(y + (size_t)m * ldy, ldy, a, lda, me - m, W, dtype, K, n0, n1, add);
        else matmul_p(y + (size_t)m * ldy, ldy, a, lda, me - m, W, dtype, K, n0, n1, add);
    }
}
