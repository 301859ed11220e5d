/* kquant — Q4_K, Q5_K and Q6_K: quantizers, dequantizers, the portable product.
 *
 * Formats and the product's order: quant.h. Decoding follows the format's
 * definition literally (one value at a time), so it is the reference the AVX2
 * tiles (quant_avx2.c) and the ggml oracle (tests/kquant_oracle.sh) are held to.
 * The quantizers are tandem's own (quant.h says how they choose scales); every
 * float-to-integer conversion goes through qround, which clamps first, so NaN
 * and infinite inputs give defined bytes, never undefined behaviour. */
#include "nn/kquant.h"
#include "util/util.h"

#include <math.h>
#include <stddef.h>
#include <string.h>

size_t td_kq_block_bytes(int dt) {
    switch (dt) {
    case TD_DTYPE_Q4_K: return sizeof(td_block_q4_k);
    case TD_DTYPE_Q5_K: return sizeof(td_block_q5_k);
    case TD_DTYPE_Q6_K: return sizeof(td_block_q6_k);
    case TD_DTYPE_IQ4_XS: return sizeof(td_block_iq4_xs);
    case TD_DTYPE_Q3_K: return sizeof(td_block_q3_k);
    case TD_DTYPE_Q2_K: return sizeof(td_block_q2_k);
    default: return 0;
    }
}

_Static_assert(sizeof(td_block_q4_k) == 144, "Q4_K block is 144 bytes");
_Static_assert(sizeof(td_block_q5_k) == 176, "Q5_K block is 176 bytes");
_Static_assert(sizeof(td_block_q6_k) == 210, "Q6_K block is 210 bytes");
_Static_assert(sizeof(td_block_iq4_xs) == 136, "IQ4_XS block is 136 bytes");
_Static_assert(sizeof(td_block_q3_k) == 110, "Q3_K block is 110 bytes");
_Static_assert(sizeof(td_block_q2_k) == 84, "Q2_K block is 84 bytes");

/* 1 when dt's values carry a sub-block minimum (Q4_K, Q5_K, Q2_K) */
static int has_min(int dt) { return dt == TD_DTYPE_Q4_K || dt == TD_DTYPE_Q5_K || dt == TD_DTYPE_Q2_K; }

/* round(v) clamped to [lo, hi]; NaN gives 0 clamped into the range */
static int qround(float v, int lo, int hi) {
    if (!(v == v)) v = 0.0f;
    if (v <= (float)lo) return lo;
    if (v >= (float)hi) return hi;
    return (int)lrintf(v);
}

static float f16r(float v, uint16_t *out) { /* v rounded to f16 (stored in *out), as f32 */
    *out = td_f32_to_f16(v);
    return td_f16_to_f32(*out);
}

/* ---- group scales shared by the quantizers ------------------------------------- */

/* ng groups of gs values: the range min(0, min x) .. max x over nmax steps sets
 * scale[g], and -min(0, min x) mins[g] (an infinite range gives 0: the group
 * decodes to 0); *smax / *mmax their largest */
static void group_ranges(const float *x, int ng, int gs, int nmax, float *scale, float *mins, float *smax, float *mmax) {
    *smax = *mmax = 0.0f;
    for (int g = 0; g < ng; g++) {
        float lo = 0.0f, hi = 0.0f;
        for (int i = 0; i < gs; i++) {
            lo = fminf(lo, x[gs * g + i]);
            hi = fmaxf(hi, x[gs * g + i]);
        }
        scale[g] = (hi - lo) / (float)nmax;
        mins[g] = -lo;
        if (!(scale[g] < INFINITY)) scale[g] = 0.0f;
        if (!(mins[g] < INFINITY)) mins[g] = 0.0f;
        *smax = fmaxf(*smax, scale[g]);
        *mmax = fmaxf(*mmax, mins[g]);
    }
}

/* ng groups of gs values: scale[g] maps the group's value of largest magnitude onto
 * -bottom (it then decodes exactly); returns the largest |scale| */
static float group_peaks(const float *x, int ng, int gs, float bottom, float *scale) {
    float smax = 0.0f;
    for (int g = 0; g < ng; g++) {
        float big = 0.0f;
        for (int i = 0; i < gs; i++)
            if (fabsf(x[gs * g + i]) > fabsf(big)) big = x[gs * g + i];
        scale[g] = big / -bottom;
        if (!(fabsf(scale[g]) < INFINITY)) scale[g] = 0.0f;
        smax = fmaxf(smax, fabsf(scale[g]));
    }
    return smax;
}

/* ---- Q4_K / Q5_K ------------------------------------------------------------ */

static void pack_scales(uint8_t s[12], const uint8_t sc[8], const uint8_t m[8]) {
    for (int j = 0; j < 4; j++) {
        s[j] = (uint8_t)(sc[j] | (sc[j + 4] >> 4) << 6);
        s[j + 4] = (uint8_t)(m[j] | (m[j + 4] >> 4) << 6);
        s[j + 8] = (uint8_t)((sc[j + 4] & 15) | (m[j + 4] & 15) << 4);
    }
}

/* one super-block of 256 values: d, dmin, scales and the quants q[256] in 0..nmax */
static void quant_k45(const float *x, int nmax, uint16_t *d16, uint16_t *dmin16, uint8_t s[12], uint8_t q[256]) {
    float scale[8], mins[8], smax, mmax;
    group_ranges(x, 8, 32, nmax, scale, mins, &smax, &mmax);
    float d = f16r(smax / 63.0f, d16), dmin = f16r(mmax / 63.0f, dmin16);
    uint8_t sc[8], m[8];
    for (int j = 0; j < 8; j++) {
        sc[j] = (uint8_t)(d > 0.0f ? qround(scale[j] / d, 0, 63) : 0);
        m[j] = (uint8_t)(dmin > 0.0f ? qround(mins[j] / dmin, 0, 63) : 0);
        float ws = d * (float)sc[j], wm = dmin * (float)m[j];
        for (int i = 0; i < 32; i++)
            q[32 * j + i] = (uint8_t)(ws > 0.0f ? qround((x[32 * j + i] + wm) / ws, 0, nmax) : 0);
    }
    pack_scales(s, sc, m);
}

static void quant_q4_k(const float *x, td_block_q4_k *y) {
    uint8_t q[256];
    quant_k45(x, 15, &y->d, &y->dmin, y->scales, q);
    for (int g = 0; g < 4; g++)
        for (int l = 0; l < 32; l++) y->qs[32 * g + l] = (uint8_t)(q[64 * g + l] | q[64 * g + 32 + l] << 4);
}

static void quant_q5_k(const float *x, td_block_q5_k *y) {
    uint8_t q[256];
    quant_k45(x, 31, &y->d, &y->dmin, y->scales, q);
    memset(y->qh, 0, sizeof y->qh);
    for (int j = 0; j < 8; j++)
        for (int l = 0; l < 32; l++) y->qh[l] |= (uint8_t)((q[32 * j + l] >> 4) << j);
    for (int g = 0; g < 4; g++)
        for (int l = 0; l < 32; l++)
            y->qs[32 * g + l] = (uint8_t)((q[64 * g + l] & 15) | (q[64 * g + 32 + l] & 15) << 4);
}

/* ---- Q6_K ------------------------------------------------------------------- */

/* position of value v's low nibble (ql index, shift) and high bits (qh index, shift) */
static void q6_pos(int v, int *qli, int *qls, int *qhi, int *qhs) {
    int h = v / 128, g = (v % 128) / 32, l = v % 32;
    *qli = 64 * h + 32 * (g & 1) + l;
    *qls = g < 2 ? 0 : 4;
    *qhi = 32 * h + l;
    *qhs = 2 * g;
}

static void quant_q6_k(const float *x, td_block_q6_k *y) {
    float scale[16], smax = group_peaks(x, 16, 16, 32.0f, scale); /* the peak decodes as q - 32 = -32 */
    float d = f16r(smax / 127.0f, &y->d);
    memset(y->ql, 0, sizeof y->ql);
    memset(y->qh, 0, sizeof y->qh);
    for (int g = 0; g < 16; g++) {
        int sc = d > 0.0f ? qround(scale[g] / d, -127, 127) : 0;
        y->scales[g] = (int8_t)sc;
        float ws = d * (float)sc;
        for (int i = 0; i < 16; i++) {
            int v = 16 * g + i, q = ws != 0.0f ? qround(x[v] / ws, -32, 31) + 32 : 32;
            int qli, qls, qhi, qhs;
            q6_pos(v, &qli, &qls, &qhi, &qhs);
            y->ql[qli] |= (uint8_t)((q & 15) << qls);
            y->qh[qhi] |= (uint8_t)((q >> 4) << qhs);
        }
    }
}

/* ---- IQ4_XS ------------------------------------------------------------------ */

/* tandem's own: each sub-block's scale maps its value of largest magnitude onto
 * the table's -127; d = the largest |scale| / 32, the 6-bit scales ls - 32 in
 * [-32, 31] rounded against the stored d, then every value to the nearest table
 * entry against the stored d * (ls - 32) */
static void quant_iq4_xs(const float *x, td_block_iq4_xs *y) {
    float scale[8], smax = group_peaks(x, 8, 32, 127.0f, scale);
    float d = f16r(smax / 32.0f, &y->d);
    y->scales_h = 0;
    memset(y->scales_l, 0, sizeof y->scales_l);
    for (int j = 0; j < 8; j++) {
        int sc = d > 0.0f ? qround(scale[j] / d, -32, 31) : 0, ls = sc + 32;
        y->scales_l[j / 2] |= (uint8_t)((ls & 15) << (4 * (j % 2)));
        y->scales_h |= (uint16_t)((ls >> 4) << (2 * j));
        float dl = d * (float)sc, id = dl != 0.0f ? 1.0f / dl : 0.0f;
        for (int i = 0; i < 16; i++)
            y->qs[16 * j + i] = (uint8_t)(td_iq4_nearest(x[32 * j + i] * id) | td_iq4_nearest(x[32 * j + 16 + i] * id) << 4);
    }
}

/* ---- Q2_K ---------------------------------------------------------------------- */

/* tandem's own, as Q4_K's per 16 values: min(0, min x) .. max x sets a 16-value
 * group's scale and minimum, both rounded to 4 bits against d / dmin */
static void quant_q2_k(const float *x, td_block_q2_k *y) {
    float scale[16], mins[16], smax, mmax;
    group_ranges(x, 16, 16, 3, scale, mins, &smax, &mmax);
    float d = f16r(smax / 15.0f, &y->d), dmin = f16r(mmax / 15.0f, &y->dmin);
    memset(y->qs, 0, sizeof y->qs);
    for (int g = 0; g < 16; g++) {
        int sc = d > 0.0f ? qround(scale[g] / d, 0, 15) : 0, m = dmin > 0.0f ? qround(mins[g] / dmin, 0, 15) : 0;
        y->scales[g] = (uint8_t)(sc | m << 4);
        float ws = d * (float)sc, wm = dmin * (float)m;
        for (int i = 0; i < 16; i++) {
            int v = 16 * g + i, h = v / 128, j = (v % 128) / 32, l = v % 32;
            int q = ws > 0.0f ? qround((x[v] + wm) / ws, 0, 3) : 0;
            y->qs[32 * h + l] |= (uint8_t)(q << (2 * j));
        }
    }
}

/* ---- Q3_K ---------------------------------------------------------------------- */

/* tandem's own: each 16 values' scale maps their value of largest magnitude onto
 * -4; d = the largest |scale| / 32, the scales rounded to [-32, 31] against the
 * stored d, the values to [-4, 3] against the stored d * sc */
static void quant_q3_k(const float *x, td_block_q3_k *y) {
    float scale[16], smax = group_peaks(x, 16, 16, 4.0f, scale);
    float d = f16r(smax / 32.0f, &y->d);
    memset(y, 0, offsetof(td_block_q3_k, d));
    uint8_t s6[16];
    for (int g = 0; g < 16; g++) {
        int sc = d > 0.0f ? qround(scale[g] / d, -32, 31) : 0;
        s6[g] = (uint8_t)(sc + 32);
        float ws = d * (float)sc;
        for (int i = 0; i < 16; i++) {
            int v = 16 * g + i, h = v / 128, j = (v % 128) / 32, l = v % 32;
            int q = ws != 0.0f ? qround(x[v] / ws, -4, 3) : 0;
            y->qs[32 * h + l] |= (uint8_t)(((q + 4) & 3) << (2 * j));
            if (q >= 0) y->hmask[l] |= (uint8_t)(1 << (4 * h + j));
        }
    }
    for (int i = 0; i < 4; i++) { /* low nibbles: s0-7 in bytes 0-7, s8-15 as their high nibbles; 2 high bits in 8-11 */
        y->scales[i] = (uint8_t)((s6[i] & 15) | (s6[i + 8] & 15) << 4);
        y->scales[i + 4] = (uint8_t)((s6[i + 4] & 15) | (s6[i + 12] & 15) << 4);
        y->scales[i + 8] = (uint8_t)((s6[i] >> 4) | (s6[i + 4] >> 4) << 2 | (s6[i + 8] >> 4) << 4 | (s6[i + 12] >> 4) << 6);
    }
}

void td_kq_quantize_row(int dt, const float *x, void *dst, int64_t n) {
    for (int64_t b = 0; b < n / TD_QKK; b++) {
        const float *xb = x + b * TD_QKK;
        if (dt == TD_DTYPE_Q4_K) quant_q4_k(xb, (td_block_q4_k *)dst + b);
        else if (dt == TD_DTYPE_Q5_K) quant_q5_k(xb, (td_block_q5_k *)dst + b);
        else if (dt == TD_DTYPE_IQ4_XS) quant_iq4_xs(xb, (td_block_iq4_xs *)dst + b);
        else if (dt == TD_DTYPE_Q3_K) quant_q3_k(xb, (td_block_q3_k *)dst + b);
        else if (dt == TD_DTYPE_Q2_K) quant_q2_k(xb, (td_block_q2_k *)dst + b);
        else quant_q6_k(xb, (td_block_q6_k *)dst + b);
    }
}

/* ---- decoding: one 32-value block as integers and integer scales ------------- */

/* The super-block's f16 scales as f32: *d, and *dmin (0 for Q6_K). */
static void ksuper(int dt, const unsigned char *blk, float *d, float *dmin) {
    uint16_t h;
    if (dt == TD_DTYPE_Q2_K) { /* d, dmin last */
        memcpy(&h, blk + offsetof(td_block_q2_k, d), 2);
        *d = td_f16_to_f32(h);
        memcpy(&h, blk + offsetof(td_block_q2_k, dmin), 2);
        *dmin = td_f16_to_f32(h);
        return;
    }
    if (!has_min(dt)) { /* Q6_K, Q3_K: d last; IQ4_XS: d first */
        memcpy(&h, blk + (dt == TD_DTYPE_Q6_K ? 208 : dt == TD_DTYPE_Q3_K ? 108 : 0), 2);
        *d = td_f16_to_f32(h);
        *dmin = 0.0f;
        return;
    }
    memcpy(&h, blk, 2);
    *d = td_f16_to_f32(h);
    memcpy(&h, blk + 2, 2);
    *dmin = td_f16_to_f32(h);
}

/* Block j (0..7) of super-block blk: w[32] the integers of the product (Q2_K/Q4_K/
 * Q5_K: q; Q6_K: q - 32; ...), sc[2] / m[2] the integer scales and minimums of values
 * 0-15 and 16-31 (m 0 without minimums). value i = (d * sc[i/16]) * w[i] - dmin * m[i/16]. */
static void kblock(int dt, const unsigned char *blk, int j, int8_t w[32], int sc[2], int m[2]) {
    if (dt == TD_DTYPE_Q2_K) {
        const unsigned char *s = blk + offsetof(td_block_q2_k, scales), *qs = blk + offsetof(td_block_q2_k, qs);
        int h = j / 4, jj = j % 4;
        for (int i = 0; i < 32; i++) w[i] = (int8_t)((qs[32 * h + i] >> (2 * jj)) & 3);
        for (int k = 0; k < 2; k++) {
            sc[k] = s[2 * j + k] & 15;
            m[k] = s[2 * j + k] >> 4;
        }
        return;
    }
    if (dt == TD_DTYPE_Q6_K) {
        /* fields by their offsets (offsetof): the file's alignment may be 1, so no struct pointer */
        const unsigned char *ql = blk + offsetof(td_block_q6_k, ql), *qh = blk + offsetof(td_block_q6_k, qh);
        const int8_t *s6 = (const int8_t *)(blk + offsetof(td_block_q6_k, scales));
        for (int i = 0; i < 32; i++) {
            int qli, qls, qhi, qhs;
            q6_pos(32 * j + i, &qli, &qls, &qhi, &qhs);
            w[i] = (int8_t)((((ql[qli] >> qls) & 15) | ((qh[qhi] >> qhs) & 3) << 4) - 32);
        }
        sc[0] = s6[2 * j];
        sc[1] = s6[2 * j + 1];
        m[0] = m[1] = 0;
        return;
    }
    if (dt == TD_DTYPE_Q3_K) {
        const unsigned char *hm = blk + offsetof(td_block_q3_k, hmask), *qs = blk + offsetof(td_block_q3_k, qs);
        int8_t s16[16];
        td_kq_q3_scales(blk + offsetof(td_block_q3_k, scales), s16);
        int h = j / 4, jj = j % 4;
        for (int i = 0; i < 32; i++)
            w[i] = (int8_t)(((qs[32 * h + i] >> (2 * jj)) & 3) - ((hm[i] >> (4 * h + jj)) & 1 ? 0 : 4));
        sc[0] = s16[2 * j];
        sc[1] = s16[2 * j + 1];
        m[0] = m[1] = 0;
        return;
    }
    if (dt == TD_DTYPE_IQ4_XS) {
        const unsigned char *sl = blk + offsetof(td_block_iq4_xs, scales_l), *qs = blk + offsetof(td_block_iq4_xs, qs);
        uint16_t sh;
        memcpy(&sh, blk + offsetof(td_block_iq4_xs, scales_h), 2);
        for (int i = 0; i < 16; i++) {
            w[i] = td_iq4_values[qs[16 * j + i] & 15];
            w[i + 16] = td_iq4_values[qs[16 * j + i] >> 4];
        }
        sc[0] = sc[1] = (((sl[j / 2] >> (4 * (j % 2))) & 15) | ((sh >> (2 * j)) & 3) << 4) - 32;
        m[0] = m[1] = 0;
        return;
    }
    uint8_t s8[8], m8[8];
    td_kq_unpack_scales(blk + 4, s8, m8);
    const unsigned char *qs = blk + (dt == TD_DTYPE_Q5_K ? 48 : 16), *qh = blk + 16;
    for (int i = 0; i < 32; i++) {
        int v = (qs[32 * (j / 2) + i] >> (4 * (j & 1))) & 15;
        if (dt == TD_DTYPE_Q5_K) v |= ((qh[i] >> j) & 1) << 4;
        w[i] = (int8_t)v;
    }
    sc[0] = sc[1] = s8[j];
    m[0] = m[1] = m8[j];
}

void td_kq_dequantize_row(int dt, const void *src, float *dst, int64_t n) {
    size_t bs = td_kq_block_bytes(dt);
    int8_t w[32];
    int sc[2], m[2];
    float d, dmin;
    for (int64_t b = 0; b < n / TD_QKK; b++) {
        const unsigned char *blk = (const unsigned char *)src + (size_t)b * bs;
        ksuper(dt, blk, &d, &dmin);
        for (int j = 0; j < 8; j++) {
            kblock(dt, blk, j, w, sc, m);
            float ws[2] = {d * (float)sc[0], d * (float)sc[1]}, wm[2] = {dmin * (float)m[0], dmin * (float)m[1]};
            for (int i = 0; i < 32; i++) dst[b * TD_QKK + 32 * j + i] = ws[i / 16] * (float)w[i] - wm[i / 16];
        }
    }
}

/* ---- the portable product ------------------------------------------------------ */

float td_fold8(const float *v) {
    float s4[4], s2[2];
    for (int i = 0; i < 4; i++) s4[i] = v[i] + v[i + 4];
    for (int i = 0; i < 2; i++) s2[i] = s4[i] + s4[i + 2];
    return s2[0] + s2[1];
}

void td_kq_matmul_p(float *y, int ldy, const char *a, size_t lda, int M, const char *W, int dt, int K, int n0,
                    int n1, int add) {
    size_t bs = td_kq_block_bytes(dt), wrow = (size_t)(K / TD_QKK) * bs;
    int nsb = K / TD_QKK;
    int8_t w[32];
    int sc[2], mj[2];
    float dw, dmin;
    for (int n = n0; n < n1; n++)
        for (int m = 0; m < M; m++) {
            const int8_t *q = (const int8_t *)(a + (size_t)m * lda);
            const float *d = (const float *)(a + (size_t)m * lda + K);
            const int16_t *S16 = (const int16_t *)((const int32_t *)(d + nsb) + K / TD_QK);
            float acc[16] = {0}, macc[8] = {0};
            for (int s = 0; s < nsb; s++) {
                const unsigned char *blk = (const unsigned char *)W + (size_t)n * wrow + (size_t)s * bs;
                int32_t P[8] = {0};
                ksuper(dt, blk, &dw, &dmin);
                for (int j = 0; j < 8; j++) {
                    kblock(dt, blk, j, w, sc, mj);
                    const int8_t *qj = q + TD_QKK * s + 32 * j;
                    for (int l = 0; l < 8; l++) {
                        int32_t p = 0;
                        for (int i = 0; i < 4; i++) p += (int32_t)w[4 * l + i] * qj[4 * l + i];
                        P[l] += sc[l / 4] * p;
                    }
                    if (has_min(dt))
                        macc[j] = fmaf(dmin * d[s], (float)(mj[0] * S16[16 * s + 2 * j] + mj[1] * S16[16 * s + 2 * j + 1]), macc[j]);
                }
                for (int l = 0; l < 8; l++) acc[8 * (s & 1) + l] = fmaf(dw * d[s], (float)P[l], acc[8 * (s & 1) + l]);
            }
            float s8[8], sum;
            for (int i = 0; i < 8; i++) s8[i] = acc[i] + acc[i + 8];
            sum = td_fold8(s8);
            if (has_min(dt)) sum -= td_fold8(macc);
            float *yp = y + (size_t)m * ldy + n;
            *yp = add ? *yp + sum : sum;
        }
}
