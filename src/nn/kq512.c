/* kq512 — see kq512.h. The k-quant order on AVX-512 BW + VNNI, two
 * super-blocks per register.
 *
 * Activations: each row is quantized by td_quant_act_row_k (the portable rule)
 * and rearranged per pair p of super-blocks (2p, 2p + 1; a last odd one pairs
 * with zeros) into pair_bytes(dt) bytes:
 *   q    [8][64] int8:  chunk j = values 32j..32j+31 of super-block 2p, then of 2p + 1
 *   ds   [16]    f32:   d of 2p in lanes 0-7, of 2p + 1 in 8-15
 *   S    [16]    int32: the sums of each 32 q (sub-blocks 0-7 of 2p, then of 2p + 1);
 *                       Q2_K: [32] int16, the sums of each 16 q
 *   corr [8][32] int16: (Q6_K, Q3_K) c * (q[2k] + q[2k + 1]) of chunk j's byte pairs;
 *                       IQ4_XS: [8][16] int32, -128 * (sum of each 4 q)
 * Weights: chunk j of a pair is the 32 unsigned values (Q4_K / Q5_K / Q2_K: q;
 * Q6_K: q6 = w + 32; Q3_K: w + 4) of sub-block j of each super-block, in the
 * halves' order; one vpmaddubsw against the token's chunk gives exact int16 pair
 * sums (|pair| <= 2 * 63 * 127), for Q6_K / Q3_K minus corr (32 or 4 times the
 * pair sums of q, so w * q exactly), and one vpdpwssd with
 * the sub-block's scale in every word adds sc * (sum of 4 products) into lane
 * l (first half) or 8 + l (second half): after 8 chunks lanes 0-7 hold P_2p[l]
 * and 8-15 P_2p+1[l] (Q6_K's per-16 scales: words 0-7 of a half take sc[2j],
 * 8-15 sc[2j + 1], which are lanes l < 4 and l >= 4; Q3_K and Q2_K alike). IQ4_XS's
 * values (-127..113, as table + 128) would saturate vpmaddubsw's pair sums: it
 * takes one vpdpbusd from -128 * (sum of 4 q) (exact quads) and sc * quad by
 * vpmulld into the same lanes. Then,
 * per quant.h: acc = fma(d_w * d_s, (float)P, acc) on 16 lanes (both parities at
 * once), and for Q4_K / Q5_K / Q2_K the minimums, macc = fma(dmin_w * d_s,
 * (float)(m_j * S_j), macc) (Q2_K: m_2j * S'_2j + m_2j+1 * S'_2j+1 by one
 * vpmaddwd) on 8 lanes, 2p then 2p + 1. The end folds as the AVX2 kernels do.
 * Tiles: up to 8 tokens x one weight row; a decode (one token) takes two rows
 * side by side, so that their chains interleave. */
#include "nn/kq512.h"
#include "nn/kernels.h"
#include "nn/kquant.h"
#include "nn/quant.h"
#include "util/util.h"

#include <string.h>

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512VNNI__)
#include <immintrin.h>

#define KI static inline __attribute__((always_inline))
#define KMR 8      /* tokens per tile */
#define KPF_ROWS 4 /* the tile of the first tokens prefetches the row this many rows ahead */

/* the value offset whose pair sums a product subtracts (Q6_K's q6 = w + 32, Q3_K's w + 4; else 0) */
static int corr_of(int dt) { return dt == TD_DTYPE_Q6_K ? 32 : dt == TD_DTYPE_Q3_K ? 4 : 0; }
static size_t pair_bytes(int dt) { return corr_of(dt) || dt == TD_DTYPE_IQ4_XS ? 640 + 512 : 640; }
/* a super-block's bytes */
#define KBS(dt)                                                                                              \
    ((dt) == TD_DTYPE_Q4_K ? sizeof(td_block_q4_k) : (dt) == TD_DTYPE_Q5_K ? sizeof(td_block_q5_k)            \
     : (dt) == TD_DTYPE_Q6_K ? sizeof(td_block_q6_k) : (dt) == TD_DTYPE_IQ4_XS ? sizeof(td_block_iq4_xs)      \
     : (dt) == TD_DTYPE_Q3_K ? sizeof(td_block_q3_k) : sizeof(td_block_q2_k))

/* One activation row (K values) into the pair layout at r (quantized in the
 * scratch tmp: K + K/256*4 + K/32*4 + K/16*2 < 3K/2 bytes). */
static void pack_row(char *r, const float *x, int K, int dt, char *tmp) {
    int nsb = K / TD_QKK, np = (nsb + 1) / 2;
    int8_t *q = (int8_t *)tmp;
    float *d = (float *)(tmp + K);
    int32_t *S = (int32_t *)(d + nsb);
    td_quant_act_row_k(x, K, q, d, S, (int16_t *)(S + K / TD_QK));
    const size_t pb = pair_bytes(dt);
    for (int p = 0; p < np; p++) {
        char *o = r + (size_t)p * pb;
        int two = 2 * p + 1 < nsb;
        for (int j = 0; j < 8; j++) {
            memcpy(o + 64 * j, q + TD_QKK * 2 * p + 32 * j, 32);
            if (two) memcpy(o + 64 * j + 32, q + TD_QKK * (2 * p + 1) + 32 * j, 32);
            else memset(o + 64 * j + 32, 0, 32);
        }
        float *ds = (float *)(o + 512);
        for (int l = 0; l < 8; l++) {
            ds[l] = d[2 * p];
            ds[8 + l] = two ? d[2 * p + 1] : 0.0f;
        }
        if (dt == TD_DTYPE_Q2_K) { /* its minimums go by 16 values: the 16-sums, as int16 */
            const int16_t *S16 = (const int16_t *)(S + K / TD_QK);
            int16_t *Sp = (int16_t *)(o + 576);
            for (int l = 0; l < 16; l++) {
                Sp[l] = S16[16 * (2 * p) + l];
                Sp[16 + l] = two ? S16[16 * (2 * p + 1) + l] : 0;
            }
        } else {
            int32_t *Sp = (int32_t *)(o + 576);
            for (int l = 0; l < 8; l++) {
                Sp[l] = S[8 * (2 * p) + l];
                Sp[8 + l] = two ? S[8 * (2 * p + 1) + l] : 0;
            }
        }
        if (corr_of(dt)) {
            int16_t *c = (int16_t *)(o + 640);
            const int8_t *qc = (const int8_t *)o;
            for (int k = 0; k < 256; k++) c[k] = (int16_t)(corr_of(dt) * (qc[2 * k] + qc[2 * k + 1]));
        }
        if (dt == TD_DTYPE_IQ4_XS) { /* vpdpbusd's start: -128 * (sum of each 4 q) */
            int32_t *c = (int32_t *)(o + 640);
            const int8_t *qc = (const int8_t *)o;
            for (int k = 0; k < 128; k++) c[k] = -128 * (qc[4 * k] + qc[4 * k + 1] + qc[4 * k + 2] + qc[4 * k + 3]);
        }
    }
}

/* 32 bytes at a in the low half, at b (or zeros) in the high half */
KI __m512i ld_pair(const char *a, const char *b) {
    __m512i v = _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)a));
    return _mm512_inserti64x4(v, b ? _mm256_loadu_si256((const __m256i *)b) : _mm256_setzero_si256(), 1);
}

/* The pair's header for one weight row: scales as 32 int16 words (2p's at words
 * 0.., 2p + 1's at 16..), minimums as 16 int32 (Q4_K / Q5_K), d and dmin as 16
 * f32 lanes (2p's in 0-7). TWO = 0: a lone last super-block (its half zero). */
typedef struct { __m512i sc, m; __m512 dw, dm; } khead;

/* 16 bytes at p, or zeros */
KI __m128i ld16(const char *p) { return p ? _mm_loadu_si128((const __m128i *)p) : _mm_setzero_si128(); }

/* f16 at b0 + off and b1 + off (or 0) as 16 f32 lanes, b0's in 0-7 */
KI __m512 two_d(const char *b0, const char *b1, size_t off) {
    uint16_t d0, d1 = 0;
    memcpy(&d0, b0 + off, 2);
    if (b1) memcpy(&d1, b1 + off, 2);
    __m128 d = _mm_cvtph_ps(_mm_set_epi16(0, 0, 0, 0, 0, 0, (short)d1, (short)d0));
    return _mm512_permutexvar_ps(_mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0), _mm512_castps128_ps512(d));
}

KI void head(int dt, const char *b0, const char *b1, khead *h) {
    if (dt == TD_DTYPE_IQ4_XS) { /* scales as 16 int32 lanes (2p's in 0-7) */
        h->sc = _mm512_inserti64x4(_mm512_castsi256_si512(td_kq_iq4xs_scales(b0)),
                                   b1 ? td_kq_iq4xs_scales(b1) : _mm256_setzero_si256(), 1);
        h->dw = two_d(b0, b1, 0);
        return;
    }
    if (dt == TD_DTYPE_Q3_K) {
        h->sc = _mm512_cvtepi8_epi16(_mm256_set_m128i(b1 ? td_kq_q3_scales_v(b1) : _mm_setzero_si128(), td_kq_q3_scales_v(b0)));
        h->dw = two_d(b0, b1, 108);
        return;
    }
    if (dt == TD_DTYPE_Q2_K) { /* 16 bytes: low nibble the scale, high the minimum, of each 16 values */
        const __m256i s = _mm256_set_m128i(ld16(b1), ld16(b0)), m4 = _mm256_set1_epi8(15);
        h->sc = _mm512_cvtepu8_epi16(_mm256_and_si256(s, m4));
        h->m = _mm512_cvtepu8_epi16(_mm256_and_si256(_mm256_srli_epi16(s, 4), m4));
        h->dw = two_d(b0, b1, 80);
        h->dm = two_d(b0, b1, 82);
        return;
    }
    if (dt == TD_DTYPE_Q6_K) {
        h->sc = _mm512_cvtepi8_epi16(_mm256_set_m128i(ld16(b1 ? b1 + 192 : NULL), ld16(b0 + 192)));
        h->dw = two_d(b0, b1, 208);
        return;
    }
    /* quant.h's 6-bit (sc, m) of 8 sub-blocks from the 12 bytes s at blk + 4, both
       super-blocks at once (one per 128-bit lane): j < 4: sc = s[j] & 63, m =
       s[j+4] & 63; j >= 4: sc = (s[j+4] & 15) | (s[j-4] >> 6) << 4, m = (s[j+4] >> 4)
       | (s[j] >> 6) << 4 (bytes 8-15 of each lane: zero) */
    const __m256i v = _mm256_set_m128i(ld16(b1 ? b1 + 4 : NULL), ld16(b0 + 4));
#define SH(a0, a1, a2, a3, a4, a5, a6, a7)                                                                       \
    _mm256_shuffle_epi8(v, _mm256_setr_epi8(a0, a1, a2, a3, a4, a5, a6, a7, -128, -128, -128, -128, -128, -128, \
                                            -128, -128, a0, a1, a2, a3, a4, a5, a6, a7, -128, -128, -128, -128,   \
                                            -128, -128, -128, -128))
    const __m256i A = SH(0, 1, 2, 3, 8, 9, 10, 11), C = SH(4, 5, 6, 7, 8, 9, 10, 11);
    const __m256i B = SH(-128, -128, -128, -128, 0, 1, 2, 3), D = SH(-128, -128, -128, -128, 4, 5, 6, 7);
#undef SH
    const __m256i lo4 = _mm256_set1_epi64x(0x00000000ffffffffLL); /* bytes j < 4 of each lane */
    const __m256i m63 = _mm256_set1_epi8(63), m15 = _mm256_set1_epi8(15), hi2 = _mm256_set1_epi8((char)0xc0);
    const __m256i bh = _mm256_srli_epi16(_mm256_and_si256(B, hi2), 2), dh = _mm256_srli_epi16(_mm256_and_si256(D, hi2), 2);
    const __m256i sc = _mm256_blendv_epi8(_mm256_or_si256(_mm256_and_si256(A, m15), bh), _mm256_and_si256(A, m63), lo4);
    const __m256i mn = _mm256_blendv_epi8(_mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(C, 4), m15), dh),
                                          _mm256_and_si256(C, m63), lo4);
    h->sc = _mm512_cvtepu8_epi16(sc);
    h->m = _mm512_cvtepu8_epi32(_mm256_castsi256_si128(_mm256_permute4x64_epi64(mn, 0x08)));
    uint32_t w0, w1 = 0;
    memcpy(&w0, b0, 4);
    if (b1) memcpy(&w1, b1, 4);
    __m128 d = _mm_cvtph_ps(_mm_set_epi32(0, 0, (int)w1, (int)w0)); /* d0, dmin0, d1, dmin1 */
    __m512 d4 = _mm512_castps128_ps512(d);
    h->dw = _mm512_permutexvar_ps(_mm512_set_epi32(2, 2, 2, 2, 2, 2, 2, 2, 0, 0, 0, 0, 0, 0, 0, 0), d4);
    h->dm = _mm512_permutexvar_ps(_mm512_set_epi32(3, 3, 3, 3, 3, 3, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1), d4);
}

#define W8(v) v, v, v, v, v, v, v, v
#define K45_IDX(j) {W8(j), W8(j), W8(16 + j), W8(16 + j)}
#define K6_IDX(j) {W8(2 * j), W8(2 * j + 1), W8(16 + 2 * j), W8(17 + 2 * j)}
static const int16_t SC_IDX[2][8][32] __attribute__((aligned(64))) = {
    {K45_IDX(0), K45_IDX(1), K45_IDX(2), K45_IDX(3), K45_IDX(4), K45_IDX(5), K45_IDX(6), K45_IDX(7)},
    {K6_IDX(0), K6_IDX(1), K6_IDX(2), K6_IDX(3), K6_IDX(4), K6_IDX(5), K6_IDX(6), K6_IDX(7)}};
KI __m512i chunk_scale(int dt, const khead *h, int j) {
    if (dt == TD_DTYPE_IQ4_XS) /* int32 lanes: sc_j of 2p in 0-7, of 2p + 1 in 8-15 */
        return _mm512_permutexvar_epi32(_mm512_inserti64x4(_mm512_set1_epi32(j), _mm256_set1_epi32(8 + j), 1), h->sc);
    return _mm512_permutexvar_epi16(_mm512_load_si512(SC_IDX[dt == TD_DTYPE_Q4_K || dt == TD_DTYPE_Q5_K ? 0 : 1][j]), h->sc);
}

/* the unsigned values of chunk j (a constant after unrolling) of the pair */
KI __m512i chunk_vals(int dt, const char *b0, const char *b1, int j) {
    const __m512i m4 = _mm512_set1_epi8(15);
    if (dt == TD_DTYPE_IQ4_XS) { /* 16 bytes of sub-block j: values 0-15 low nibbles, 16-31 high; table + 128 */
        __m128i a = _mm_loadu_si128((const __m128i *)(b0 + 8 + 16 * j));
        __m128i b = b1 ? _mm_loadu_si128((const __m128i *)(b1 + 8 + 16 * j)) : _mm_setzero_si128();
        __m256i lo = _mm256_inserti128_si256(_mm256_castsi128_si256(a), _mm_srli_epi16(a, 4), 1);
        __m256i hi = _mm256_inserti128_si256(_mm256_castsi128_si256(b), _mm_srli_epi16(b, 4), 1);
        __m512i v = _mm512_and_si512(_mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1), m4);
        const __m128i t = _mm_add_epi8(_mm_loadu_si128((const __m128i *)td_iq4_values), _mm_set1_epi8((char)0x80));
        return _mm512_shuffle_epi8(_mm512_broadcast_i32x4(t), v);
    }
    if (dt == TD_DTYPE_Q2_K || dt == TD_DTYPE_Q3_K) { /* 2 bits at 2g of byte l of 32-byte group h */
        int hh = j / 4, g = j % 4;
        size_t off = (dt == TD_DTYPE_Q2_K ? 16 : 32) + 32 * (size_t)hh;
        __m512i qs = ld_pair(b0 + off, b1 ? b1 + off : NULL);
        __m512i lo = _mm512_and_si512(g ? _mm512_srli_epi16(qs, 2 * g) : qs, _mm512_set1_epi8(3));
        if (dt == TD_DTYPE_Q2_K) return lo;
        /* Q3_K: w = lo - 4 unless bit 4h + g of hmask[l] is set, so w + 4 = lo + 4 * bit */
        __mmask64 k = _mm512_test_epi8_mask(ld_pair(b0, b1), _mm512_set1_epi8((char)(1 << (4 * hh + g))));
        return _mm512_mask_add_epi8(lo, k, lo, _mm512_set1_epi8(4));
    }
    if (dt == TD_DTYPE_Q6_K) {
        int hh = j / 4, g = j % 4;
        size_t lo_off = 64 * (size_t)hh + 32 * (size_t)(g & 1), hi_off = 128 + 32 * (size_t)hh;
        __m512i ql = ld_pair(b0 + lo_off, b1 ? b1 + lo_off : NULL), qh = ld_pair(b0 + hi_off, b1 ? b1 + hi_off : NULL);
        __m512i lo = g < 2 ? _mm512_and_si512(ql, m4) : _mm512_and_si512(_mm512_srli_epi16(ql, 4), m4);
        __m512i hb = g == 0 ? _mm512_slli_epi16(qh, 4) : g == 1 ? _mm512_slli_epi16(qh, 2) : g == 2 ? qh : _mm512_srli_epi16(qh, 2);
        return _mm512_or_si512(lo, _mm512_and_si512(hb, _mm512_set1_epi8(0x30)));
    }
    size_t qs = dt == TD_DTYPE_Q5_K ? 48 : 16, off = qs + 32 * (size_t)(j / 2);
    __m512i v = ld_pair(b0 + off, b1 ? b1 + off : NULL);
    __m512i u = j & 1 ? _mm512_and_si512(_mm512_srli_epi16(v, 4), m4) : _mm512_and_si512(v, m4);
    if (dt == TD_DTYPE_Q5_K) { /* bit j of qh[l] -> bit 4 */
        __m512i qh = ld_pair(b0 + 16, b1 ? b1 + 16 : NULL);
        __m512i b = j <= 4 ? _mm512_slli_epi16(qh, 4 - j) : _mm512_srli_epi16(qh, j - 4);
        u = _mm512_or_si512(u, _mm512_and_si512(b, _mm512_set1_epi8(0x10)));
    }
    return u;
}

/* s8 = lo + hi, then the D8 fold (quant.h; quant_avx2.c's fold16 / fold8) */
KI float fold8(__m256 a) {
    __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    __m128 c = _mm_add_ps(b, _mm_movehl_ps(b, b));
    __m128 d = _mm_add_ss(c, _mm_movehdup_ps(c));
    return _mm_cvtss_f32(d);
}

/* One pair p of super-blocks (b0, and b1 = b0 + its bytes when TWO, else a lone
 * last one) for MR tokens: the integer sums, then acc and mac (kq512.h) */
KI void pair_step(int MR, int dt, int TWO, const char *b0, const char *ap, size_t lda, __m512 *acc, __m256 *mac) {
    const int mins = dt == TD_DTYPE_Q4_K || dt == TD_DTYPE_Q5_K || dt == TD_DTYPE_Q2_K;
    const char *b1 = TWO ? b0 + KBS(dt) : NULL;
    khead h;
    head(dt, b0, b1, &h);
    /* NC independent integer sums per token (exact, so any grouping): with few
       tokens one chain of 8 vpdpwssd would wait on its own latency */
    const int NC = MR == 1 ? 4 : MR == 2 ? 2 : 1;
    __m512i P[KMR][4];
#pragma GCC unroll 8
    for (int i = 0; i < MR; i++)
#pragma GCC unroll 4
        for (int c = 0; c < NC; c++) P[i][c] = _mm512_setzero_si512();
#pragma GCC unroll 8
    for (int j = 0; j < 8; j++) {
        __m512i u = chunk_vals(dt, b0, b1, j), sc = chunk_scale(dt, &h, j);
#pragma GCC unroll 8
        for (int i = 0; i < MR; i++) {
            const char *ai = ap + (size_t)i * lda;
            if (dt == TD_DTYPE_IQ4_XS) { /* values to +-127 would saturate vpmaddubsw's pairs: exact quads,
                                           then sc * quad in int32 */
                __m512i R = _mm512_dpbusd_epi32(_mm512_loadu_si512(ai + 640 + 64 * j), u, _mm512_loadu_si512(ai + 64 * j));
                P[i][j % NC] = _mm512_add_epi32(P[i][j % NC], _mm512_mullo_epi32(R, sc));
                continue;
            }
            __m512i p16 = _mm512_maddubs_epi16(u, _mm512_loadu_si512(ai + 64 * j));
            if (corr_of(dt)) p16 = _mm512_sub_epi16(p16, _mm512_loadu_si512(ai + 640 + 64 * j));
            P[i][j % NC] = _mm512_dpwssd_epi32(P[i][j % NC], p16, sc);
        }
    }
#pragma GCC unroll 8
    for (int i = 0; i < MR; i++) {
#pragma GCC unroll 4
        for (int c = 1; c < NC; c++) P[i][0] = _mm512_add_epi32(P[i][0], P[i][c]);
        const char *ai = ap + (size_t)i * lda;
        __m512 ds = _mm512_loadu_ps(ai + 512), c = _mm512_mul_ps(h.dw, ds), x = _mm512_cvtepi32_ps(P[i][0]);
        /* a lone super-block leaves the odd lanes alone */
        acc[i] = TWO ? _mm512_fmadd_ps(c, x, acc[i]) : _mm512_mask3_fmadd_ps(c, x, acc[i], 0x00ff);
        if (mins) {
            /* Q4_K / Q5_K: m_j * S_j exactly (m <= 63 and |S| <= 32 * 127 are int16, the high
               word of m is 0); Q2_K: m_2j * S'_2j + m_2j+1 * S'_2j+1 over the 16-sums */
            __m512 xm = _mm512_cvtepi32_ps(_mm512_madd_epi16(h.m, _mm512_loadu_si512(ai + 576)));
            __m512 cm = _mm512_mul_ps(h.dm, ds);
            mac[i] = _mm256_fmadd_ps(_mm512_castps512_ps256(cm), _mm512_castps512_ps256(xm), mac[i]);
            if (TWO) mac[i] = _mm256_fmadd_ps(_mm512_extractf32x8_ps(cm, 1), _mm512_extractf32x8_ps(xm, 1), mac[i]);
        }
    }
}

/* MR tokens (pair-layout rows a + i * lda) x NR weight rows (w, wrow bytes
 * apart; NR = 2 only for MR = 1); pf: NR rows ahead to prefetch (their bytes in
 * one slice a pair), or NULL */
KI void ktile(int MR, int NR, int dt, float *y, int ldy, const char *a, size_t lda, const char *w, size_t wrow,
              int K, int add, const char *pf) {
    const int nsb = K / TD_QKK, np = nsb / 2, mins = dt == TD_DTYPE_Q4_K || dt == TD_DTYPE_Q5_K || dt == TD_DTYPE_Q2_K;
    const size_t bs = KBS(dt), pb = pair_bytes(dt);
    /* the prefetched rows' bytes, a slice a pair */
    const size_t pfb = (size_t)NR * wrow, npf = (size_t)(np > 0 ? np : 1);
    const size_t pfs = ((pfb + npf - 1) / npf + 63) & ~(size_t)63;
    __m512 acc[2][KMR]; /* [row][token] */
    __m256 mac[2][KMR];
#pragma GCC unroll 8
    for (int i = 0; i < MR; i++)
#pragma GCC unroll 2
        for (int o = 0; o < NR; o++) {
            acc[o][i] = _mm512_setzero_ps();
            mac[o][i] = _mm256_setzero_ps();
        }
    int p = 0;
    for (; p < np; p++) {
        if (pf)
            for (size_t c = (size_t)p * pfs; c < (size_t)(p + 1) * pfs && c < pfb; c += 64) _mm_prefetch(pf + c, _MM_HINT_T0);
#pragma GCC unroll 2
        for (int o = 0; o < NR; o++) /* NR rows side by side: independent chains */
            pair_step(MR, dt, 1, w + (size_t)o * wrow + (size_t)(2 * p) * bs, a + (size_t)p * pb, lda, acc[o], mac[o]);
    }
    if (nsb & 1)
#pragma GCC unroll 2
        for (int o = 0; o < NR; o++)
            pair_step(MR, dt, 0, w + (size_t)o * wrow + (size_t)(2 * p) * bs, a + (size_t)p * pb, lda, acc[o], mac[o]);
#pragma GCC unroll 8
    for (int i = 0; i < MR; i++)
#pragma GCC unroll 2
        for (int o = 0; o < NR; o++) {
            float v = fold8(_mm256_add_ps(_mm512_castps512_ps256(acc[o][i]), _mm512_extractf32x8_ps(acc[o][i], 1)));
            if (mins) v -= fold8(mac[o][i]);
            float *yp = y + (size_t)i * ldy + o;
            *yp = add ? *yp + v : v;
        }
}

typedef void (*ktile_fn)(float *y, int ldy, const char *a, size_t lda, const char *w, size_t wrow, int K, int add,
                         const char *pf);
#define KT_INST(MR, NR, DT, SUF)                                                                                   \
    static void kt_##MR##x##NR##_##SUF(float *y, int ldy, const char *a, size_t lda, const char *w, size_t wrow,   \
                                       int K, int add, const char *pf) {                                           \
        ktile(MR, NR, DT, y, ldy, a, lda, w, wrow, K, add, pf);                                                     \
    }
#define KT_SET(DT, SUF)                                                                                            \
    KT_INST(1, 1, DT, SUF) KT_INST(2, 1, DT, SUF) KT_INST(3, 1, DT, SUF) KT_INST(4, 1, DT, SUF)                    \
    KT_INST(5, 1, DT, SUF) KT_INST(6, 1, DT, SUF) KT_INST(7, 1, DT, SUF) KT_INST(8, 1, DT, SUF) KT_INST(1, 2, DT, SUF)
KT_SET(TD_DTYPE_Q4_K, k4)
KT_SET(TD_DTYPE_Q5_K, k5)
KT_SET(TD_DTYPE_Q6_K, k6)
KT_SET(TD_DTYPE_Q3_K, k3)
KT_SET(TD_DTYPE_Q2_K, k2)
KT_SET(TD_DTYPE_IQ4_XS, x4)
/* t[mr]: mr tokens x 1 row; t[0]: 1 token x 2 rows (decode) */
#define KTS(S) {kt_1x2_##S, kt_1x1_##S, kt_2x1_##S, kt_3x1_##S, kt_4x1_##S, kt_5x1_##S, kt_6x1_##S, kt_7x1_##S, kt_8x1_##S}
static const ktile_fn KTILES[6][KMR + 1] = {KTS(k4), KTS(k5), KTS(k6), KTS(k3), KTS(k2), KTS(x4)};

static int cpu_ok(void) {
    static int ok = -1;
    if (ok < 0) {
        __builtin_cpu_init();
        ok = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
    }
    return ok;
}

int td_kq512_ok(int dt) {
    return (dt == TD_DTYPE_Q4_K || dt == TD_DTYPE_Q5_K || dt == TD_DTYPE_Q6_K || dt == TD_DTYPE_Q3_K ||
            dt == TD_DTYPE_Q2_K || dt == TD_DTYPE_IQ4_XS) && cpu_ok();
}

#define KQB 64 /* activation rows packed per pass (they stay in cache while the weights stream) */

int td_kq512_matmul(float *y, int ldy, const float *x, int ldx, int M, const void *W, int dt, int K, int n0, int n1,
                    int add) {
    const int nsb = K / TD_QKK, np = (nsb + 1) / 2, mb = M < KQB ? M : KQB;
    const size_t lda = (size_t)np * pair_bytes(dt), tmpb = (size_t)K + (size_t)K / 2, wrow = td_dtype_row_bytes(dt, K);
    char *a = td_thread_scratch(lda * (size_t)mb + tmpb + 64);
    if (!a) return TD_ENOMEM;
    char *tmp = a + lda * (size_t)mb;
    const ktile_fn *ts = KTILES[dt == TD_DTYPE_Q4_K   ? 0
                                : dt == TD_DTYPE_Q5_K ? 1
                                : dt == TD_DTYPE_Q6_K ? 2
                                : dt == TD_DTYPE_Q3_K ? 3
                                : dt == TD_DTYPE_Q2_K ? 4
                                                      : 5];
    const char *wb = W, *wend = wb + (size_t)n1 * wrow;
    for (int m0 = 0; m0 < M; m0 += KQB) {
        int me = m0 + KQB < M ? m0 + KQB : M;
        for (int m = m0; m < me; m++) pack_row(a + (size_t)(m - m0) * lda, x + (size_t)m * ldx, K, dt, tmp);
        int n = n0;
        if (me - m0 == 1) /* decode: two rows a tile, for independent chains */
            for (; n + 2 <= n1; n += 2) {
                const char *pf = wb + (size_t)(n + KPF_ROWS) * wrow;
                ts[0](y + (size_t)m0 * ldy + n, ldy, a, lda, wb + (size_t)n * wrow, wrow, K, add,
                      pf + 2 * wrow <= wend ? pf : NULL);
            }
        for (; n < n1; n++) {
            const char *pf = wb + (size_t)(n + KPF_ROWS) * wrow;
            if (pf + wrow > wend) pf = NULL;
            for (int m = m0; m < me; m += KMR) {
                int mr = me - m < KMR ? me - m : KMR;
                ts[mr](y + (size_t)m * ldy + n, ldy, a + (size_t)(m - m0) * lda, lda, wb + (size_t)n * wrow, wrow, K,
                       add, m == m0 ? pf : NULL);
            }
        }
    }
    return 0;
}

#else /* no AVX-512 VNNI in this build */

int td_kq512_ok(int dt) {
    (void)dt;
    return 0;
}

int td_kq512_matmul(float *y, int ldy, const float *x, int ldx, int M, const void *W, int dt, int K, int n0, int n1,
                    int add) {
    (void)y, (void)ldy, (void)x, (void)ldx, (void)M, (void)W, (void)dt, (void)K, (void)n0, (void)n1, (void)add;
    return TD_EINVAL;
}

#endif
