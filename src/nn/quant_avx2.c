/* quant_avx2 — the Q16 and k-quant orders (quant.h) on 256-bit registers.
 *
 * Blocks of 32 (Q8_0, Q4_0, Q5_0, Q4_1, Q5_1, IQ4_NL), one block per step: its
 * 32 int8 weights w (Q4_0: nibble - 8; see wvals) against the
 * block's 32 activation q: vpmaddubsw(|w|, sign(q, w)) gives 16 exact int16 pair
 * sums (|w| <= 128 and |q| <= 127, so a pair is at most 32512: never saturated,
 * even for a weight byte of -128), vpmaddwd with ones the 8 lanes P_b[l] (4
 * consecutive products each, as quant.h defines them). Then c = dw * d and one
 * fma per lane into the accumulator of the block's parity: lo (lanes 0-7) for
 * even blocks, hi (lanes 8-15) for odd ones; the fold is kernels_avx2.c's.
 * Q4_1 / Q5_1 add their minimums' 8-lane sum after the main loop (qmins).
 * Tiles: 1 token x 1 output (decode: one weight stream), 2 tokens x 2 outputs.
 * The k-quants (Q2_K .. Q6_K, IQ4_XS) have their own tiles below (ktile: int32
 * super-block sums, then one fma per super-block), 4 tokens x 2 outputs too.
 * Last, the R16 order of Q8_0 (q8r.h) over its repacked records. */
#include "nn/quant_avx2.h"
#include "nn/kernels_avx2.h"

#ifdef TD_HAVE_QUANT_AVX2
#if !defined(__AVX2__) || !defined(__FMA__) || !defined(__F16C__)
#error "quant_avx2.c needs -mavx2 -mfma -mf16c (the Makefile adds them on x86-64)"
#endif
#include "nn/kquant.h"
#include "nn/q8r.h"
#include "nn/quant.h"
#include "tandem.h"

#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#define AI static inline __attribute__((always_inline))
#ifndef QPF1
/* the decode (1 x 1) tile: 64 blocks ahead, across row ends into the next row (16 blocks,
 * within the row, was 12-19% slower on the 0.6B shape's q8_0 decode on Zen 3) */
#define QPF1 64
#endif
#ifndef QPF2
/* the M >= 2 tiles: 4 KiB ahead of each weight row, so through the row's end into
 * the rows of the next output tiles. It was 16 blocks ahead within the row only
 * (none at all for K = 384): T = 2 forwards of the 0.6B shape's q8_0 took 69 ms
 * (median) that way and 46 ms this way, T = 8 142 and 124 ms (forward-notes.md) */
#define QPF2 4096
#endif

AI float fold16(__m256 lo, __m256 hi) {
    __m256 a = _mm256_add_ps(lo, hi);                                              /* s8 */
    __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1)); /* s4 */
    __m128 c = _mm_add_ps(b, _mm_movehl_ps(b, b));                                 /* s2 in lanes 0,1 */
    __m128 d = _mm_add_ss(c, _mm_movehdup_ps(c));                                  /* s2[0] + s2[1] */
    return _mm_cvtss_f32(d);
}

/* IQ4_NL / IQ4_XS: 32 nibbles (v, low 4 bits of each byte) to the table's values */
AI __m256i iq4_lookup(__m256i v) {
    const __m256i t = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)td_iq4_values));
    return _mm256_shuffle_epi8(t, v);
}

AI float fold8(__m256 a) {
    __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1)); /* s4 */
    __m128 c = _mm_add_ps(b, _mm_movehl_ps(b, b));
    __m128 d = _mm_add_ss(c, _mm_movehdup_ps(c));
    return _mm_cvtss_f32(d);
}

/* the 32 int8 weights of the block at blk (Q4_0: nibble - 8; Q5_0: 5 bits - 16;
 * Q4_1 / Q5_1: the unsigned q; IQ4_NL: the table's value of the nibble) */
AI __m256i wvals(const char *blk, int dt) {
    if (dt == TD_DTYPE_Q8_0) return _mm256_loadu_si256((const __m256i *)(blk + 2));
    const int q5 = dt == TD_DTYPE_Q5_0 || dt == TD_DTYPE_Q5_1, hoff = dt == TD_DTYPE_Q5_1 ? 4 : 2;
    __m128i q = _mm_loadu_si128((const __m128i *)(blk + (q5 ? hoff + 4 : dt == TD_DTYPE_Q4_1 ? 4 : 2)));
    __m256i v = _mm256_and_si256(_mm256_inserti128_si256(_mm256_castsi128_si256(q), _mm_srli_epi16(q, 4), 1),
                                 _mm256_set1_epi8(15));
    if (dt == TD_DTYPE_IQ4_NL) return iq4_lookup(v);
    if (dt == TD_DTYPE_Q4_1) return v;
    if (!q5) return _mm256_sub_epi8(v, _mm256_set1_epi8(8));
    /* bit i of the 32-bit qh -> 16 in byte i: byte i takes qh's byte i / 8, keeps bit i % 8 */
    uint32_t qh;
    memcpy(&qh, blk + hoff, 4);
    const __m256i sel = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3,
                                         3, 3, 3, 3, 3, 3);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ull);
    __m256i b = _mm256_and_si256(_mm256_shuffle_epi8(_mm256_set1_epi32((int)qh), sel), bit);
    __m256i h = _mm256_and_si256(_mm256_cmpeq_epi8(b, bit), _mm256_set1_epi8(16));
    return dt == TD_DTYPE_Q5_1 ? _mm256_or_si256(v, h) : _mm256_sub_epi8(_mm256_or_si256(v, h), _mm256_set1_epi8(16));
}

/* Q4_1 / Q5_1: the 8 lanes of the minimums' sum (quant.h) of one token (activation
 * row ar: q, d, then the blocks' exact sums S) and one weight row wr: 8 blocks a
 * step (their f16 minimums gathered by inserts), the tail lane by lane */
AI __m256 qmins(const char *ar, const char *wr, int K, size_t bs) {
    const int nb = K / 32;
    const float *d = (const float *)(ar + K);
    const int32_t *S = (const int32_t *)(d + nb);
    __m256 macc = _mm256_setzero_ps();
    int b = 0;
    for (; b + 8 <= nb; b += 8) {
        uint16_t m[8];
        for (int k = 0; k < 8; k++) memcpy(&m[k], wr + (size_t)(b + k) * bs + 2, 2);
        __m128i mh = _mm_setr_epi16((short)m[0], (short)m[1], (short)m[2], (short)m[3], (short)m[4], (short)m[5],
                                    (short)m[6], (short)m[7]);
        __m256 mv = _mm256_mul_ps(_mm256_cvtph_ps(mh), _mm256_loadu_ps(d + b));
        macc = _mm256_fmadd_ps(mv, _mm256_cvtepi32_ps(_mm256_loadu_si256((const __m256i *)(S + b))), macc);
    }
    if (b < nb) {
        float t[8];
        _mm256_storeu_ps(t, macc);
        for (; b < nb; b++) {
            uint16_t h;
            memcpy(&h, wr + (size_t)b * bs + 2, 2);
            t[b % 8] = fmaf(_cvtsh_ss(h) * d[b], (float)S[b], t[b % 8]);
        }
        macc = _mm256_loadu_ps(t);
    }
    return macc;
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
    const size_t bs = dt == TD_DTYPE_Q8_0 ? 34 : dt == TD_DTYPE_Q5_0 ? 22 : dt == TD_DTYPE_Q4_1 ? 20 : dt == TD_DTYPE_Q5_1 ? 24 : 18;
    const int nb = K / 32;
#pragma GCC unroll 2
    for (int i = 0; i < MR; i++)
#pragma GCC unroll 2
        for (int j = 0; j < NR; j++) lo[i][j] = hi[i][j] = _mm256_setzero_ps();
    int b = 0;
    for (; b + 2 <= nb; b += 2) {
        if (MR == 1 && NR == 1) /* decode: rows follow each other, so past the row's end lies the next row */
            _mm_prefetch(w + (size_t)(b + QPF1) * bs, _MM_HINT_T0);
        else /* M >= 2: a fixed distance ahead of each row, into the next tiles' rows */
#pragma GCC unroll 2
            for (int j = 0; j < NR; j++) _mm_prefetch(w + j * wrow + (size_t)b * bs + QPF2, _MM_HINT_T0);
        qstep(MR, NR, dt, lo, a, lda, w, wrow, K, b, bs);
        qstep(MR, NR, dt, hi, a, lda, w, wrow, K, b + 1, bs);
    }
    if (b < nb) qstep(MR, NR, dt, lo, a, lda, w, wrow, K, b, bs);
#pragma GCC unroll 2
    for (int i = 0; i < MR; i++)
#pragma GCC unroll 2
        for (int j = 0; j < NR; j++) {
            float s = fold16(lo[i][j], hi[i][j]);
            if (dt == TD_DTYPE_Q4_1 || dt == TD_DTYPE_Q5_1) s += fold8(qmins(a + (size_t)i * lda, w + j * wrow, K, bs));
            td_avx2_put(y, ldy, i, j, s, add);
        }
}

typedef void (*qtile_fn)(float *y, int ldy, const char *a, size_t lda, const char *w, size_t wrow, int K, int add);
#define QTX_INST(TILE, MR, NR, DT, SUF)                                                                  \
    static void qt_##MR##x##NR##_##SUF(float *y, int ldy, const char *a, size_t lda, const char *w,      \
                                       size_t wrow, int K, int add) {                                    \
        TILE(MR, NR, DT, y, ldy, a, lda, w, wrow, K, add);                                               \
    }
#define QT_SET(DT, SUF) QTX_INST(qtile, 1, 1, DT, SUF) QTX_INST(qtile, 2, 1, DT, SUF) QTX_INST(qtile, 2, 2, DT, SUF)
QT_SET(TD_DTYPE_Q8_0, q8)
QT_SET(TD_DTYPE_Q4_0, q4)
QT_SET(TD_DTYPE_Q5_0, q5)
QT_SET(TD_DTYPE_IQ4_NL, n4)
QT_SET(TD_DTYPE_Q4_1, p4)
QT_SET(TD_DTYPE_Q5_1, p5)

/* ---- k-quants (Q4_K, Q5_K, Q6_K): super-blocks summed in int32 ----------------
 * The activations come in super-blocks of 256 with one scale (quant.h), so the 8
 * sub-blocks of a super-block add up exactly: per sub-block one vpmaddubsw
 * (Q4_K/Q5_K weights are unsigned <= 31 and go in as they are; Q6_K's q - 32
 * through the sign trick), one vpmaddwd against the sub-block's integer scale
 * (replacing Q8_0's vpmaddwd with ones) and one vpaddd; then one conversion and
 * one fma per super-block, and for Q4_K/Q5_K one for the minimums. The block
 * index is a constant after unrolling, so every nibble / bit extraction uses
 * immediate shifts and every scale broadcast a constant vpshufb. */
#ifndef KPF1
#define KPF1 2048 /* decode tile: prefetch distance in bytes */
#endif

/* block j (0..7, a constant after unrolling) of super-block blk: the 32 weight
 * integers (Q4_K/Q5_K: unsigned q; Q6_K: q - 32; IQ4_XS: the table's values) */
AI __m256i kvals(int dt, const char *blk, int j) {
    const __m256i m4 = _mm256_set1_epi8(15);
    if (dt == TD_DTYPE_Q2_K) { /* 2 bits, unsigned */
        int h = j / 4, g = j % 4;
        __m256i qs = _mm256_loadu_si256((const __m256i *)(blk + 16 + 32 * h));
        return _mm256_and_si256(g == 0 ? qs : g == 1 ? _mm256_srli_epi16(qs, 2) : g == 2 ? _mm256_srli_epi16(qs, 4)
                                                                                  : _mm256_srli_epi16(qs, 6),
                                _mm256_set1_epi8(3));
    }
    if (dt == TD_DTYPE_Q3_K) { /* 2 low bits, minus 4 where the hmask bit is clear */
        int h = j / 4, g = j % 4;
        __m256i qs = _mm256_loadu_si256((const __m256i *)(blk + 32 + 32 * h));
        __m256i hm = _mm256_loadu_si256((const __m256i *)blk);
        __m256i lo = _mm256_and_si256(g == 0 ? qs : g == 1 ? _mm256_srli_epi16(qs, 2) : g == 2 ? _mm256_srli_epi16(qs, 4)
                                                                                             : _mm256_srli_epi16(qs, 6),
                                      _mm256_set1_epi8(3));
        __m256i clear = _mm256_cmpeq_epi8(_mm256_and_si256(hm, _mm256_set1_epi8((char)(1 << (4 * h + g)))), _mm256_setzero_si256());
        return _mm256_sub_epi8(lo, _mm256_and_si256(clear, _mm256_set1_epi8(4)));
    }
    if (dt == TD_DTYPE_IQ4_XS) {
        __m128i q = _mm_loadu_si128((const __m128i *)(blk + 8 + 16 * j));
        __m256i v = _mm256_inserti128_si256(_mm256_castsi128_si256(q), _mm_srli_epi16(q, 4), 1);
        return iq4_lookup(_mm256_and_si256(v, m4));
    }
    if (dt == TD_DTYPE_Q6_K) {
        int h = j / 4, g = j % 4;
        __m256i ql = _mm256_loadu_si256((const __m256i *)(blk + 64 * h + 32 * (g & 1)));
        __m256i qh = _mm256_loadu_si256((const __m256i *)(blk + 128 + 32 * h));
        __m256i lo = g < 2 ? _mm256_and_si256(ql, m4) : _mm256_and_si256(_mm256_srli_epi16(ql, 4), m4);
        __m256i hb = g == 0 ? _mm256_slli_epi16(qh, 4) : g == 1 ? _mm256_slli_epi16(qh, 2) : g == 2 ? qh : _mm256_srli_epi16(qh, 2);
        __m256i u = _mm256_or_si256(lo, _mm256_and_si256(hb, _mm256_set1_epi8(0x30)));
        return _mm256_sub_epi8(u, _mm256_set1_epi8(32));
    }
    const char *qs = blk + (dt == TD_DTYPE_Q5_K ? 48 : 16);
    __m256i v = _mm256_loadu_si256((const __m256i *)(qs + 32 * (j / 2)));
    __m256i u = j & 1 ? _mm256_and_si256(_mm256_srli_epi16(v, 4), m4) : _mm256_and_si256(v, m4);
    if (dt == TD_DTYPE_Q5_K) { /* bit j of qh[l] -> bit 4 */
        __m256i qh = _mm256_loadu_si256((const __m256i *)(blk + 16));
        __m256i b = j <= 4 ? _mm256_slli_epi16(qh, 4 - j) : _mm256_srli_epi16(qh, j - 4);
        u = _mm256_or_si256(u, _mm256_and_si256(b, _mm256_set1_epi8(0x10)));
    }
    return u;
}

/* A super-block's header: the int16 scales (Q4_K/Q5_K: sc0..7 in both 128-bit
 * halves; per-16 scales (Q6_K, Q3_K, Q2_K): lo = sc0..7 and hi = sc8..15, each in
 * both halves), the minimums (Q4_K/Q5_K: 8 bytes in m; Q2_K: 16 int16 in m16), and
 * d / dmin as f32. */
typedef struct { __m256i lo, hi, m16; __m128i m; float d, dmin; } khead;

AI void khead_get(int dt, const char *blk, khead *k) {
    if (dt == TD_DTYPE_Q2_K) {
        uint16_t dh[2];
        memcpy(dh, blk + 80, 4);
        __m128i s = _mm_loadu_si128((const __m128i *)blk), m4 = _mm_set1_epi8(15);
        __m256i s16 = _mm256_cvtepu8_epi16(_mm_and_si128(s, m4));
        k->d = _cvtsh_ss(dh[0]);
        k->dmin = _cvtsh_ss(dh[1]);
        k->lo = _mm256_permute2x128_si256(s16, s16, 0x00);
        k->hi = _mm256_permute2x128_si256(s16, s16, 0x11);
        k->m16 = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(s, 4), m4));
        k->m = _mm_setzero_si128();
        return;
    }
    if (dt == TD_DTYPE_Q3_K) { /* kquant.h's td_kq_q3_scales, in registers */
        uint16_t dh;
        memcpy(&dh, blk + 108, 2);
        __m256i s16 = _mm256_cvtepi8_epi16(td_kq_q3_scales_v(blk));
        k->d = _cvtsh_ss(dh);
        k->dmin = 0.0f;
        k->lo = _mm256_permute2x128_si256(s16, s16, 0x00);
        k->hi = _mm256_permute2x128_si256(s16, s16, 0x11);
        k->m = _mm_setzero_si128();
        return;
    }
    if (dt == TD_DTYPE_IQ4_XS) { /* sc = ls - 32 (kquant.h; a scalar loop cost ~40 instructions
                                      per super-block, a third of a decode step) */
        uint16_t dh;
        memcpy(&dh, blk, 2);
        __m256i sc = td_kq_iq4xs_scales(blk);
        k->d = _cvtsh_ss(dh);
        k->dmin = 0.0f;
        __m128i s16 = _mm_packs_epi32(_mm256_castsi256_si128(sc), _mm256_extracti128_si256(sc, 1));
        k->lo = k->hi = _mm256_broadcastsi128_si256(s16);
        k->m = _mm_setzero_si128();
        return;
    }
    if (dt == TD_DTYPE_Q6_K) {
        uint16_t dh;
        memcpy(&dh, blk + 208, 2);
        k->d = _cvtsh_ss(dh);
        k->dmin = 0.0f;
        __m256i s16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(blk + 192)));
        k->lo = _mm256_permute2x128_si256(s16, s16, 0x00);
        k->hi = _mm256_permute2x128_si256(s16, s16, 0x11);
        k->m = _mm_setzero_si128();
        return;
    }
    /* the 6-bit scales and minimums (kquant.h's td_kq_unpack_scales), four bytes a
     * word in registers (bytes stored one by one and reloaded as a word stalled on
     * store forwarding) */
    uint16_t dh[2];
    uint32_t w[3];
    memcpy(dh, blk, 4);
    memcpy(w, blk + 4, 12);
    const uint32_t k6 = 0x3f3f3f3f, k4 = 0x0f0f0f0f, k2 = 0x03030303;
    uint64_t sv = (uint64_t)(w[0] & k6) | (uint64_t)((w[2] & k4) | ((w[0] >> 6) & k2) << 4) << 32;
    uint64_t mv = (uint64_t)(w[1] & k6) | (uint64_t)(((w[2] >> 4) & k4) | ((w[1] >> 6) & k2) << 4) << 32;
    k->d = _cvtsh_ss(dh[0]);
    k->dmin = _cvtsh_ss(dh[1]);
    k->lo = k->hi = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(_mm_cvtsi64_si128((long long)sv)));
    k->m = _mm_cvtsi64_si128((long long)mv);
}

/* the int16 scale vector of sub-block j: every lane sc_j (Q6_K: sc[2j] in the
 * low 128 bits, sc[2j+1] in the high) */
AI __m256i kscale(int dt, const khead *k, int j) {
    if (dt == TD_DTYPE_Q6_K || dt == TD_DTYPE_Q3_K || dt == TD_DTYPE_Q2_K) {
        int w = 2 * (j % 4);
        __m256i c = _mm256_set_m128i(_mm_set1_epi16((short)((2 * w + 3) << 8 | (2 * w + 2))),
                                     _mm_set1_epi16((short)((2 * w + 1) << 8 | (2 * w))));
        return _mm256_shuffle_epi8(j < 4 ? k->lo : k->hi, c);
    }
    return _mm256_shuffle_epi8(k->lo, _mm256_set1_epi16((short)((2 * j + 1) << 8 | (2 * j))));
}


/* MR tokens (rows of the k-quant plain layout: q[K], d[K/256], S[K/32]) x NR
 * outputs, super-block by super-block */
AI void ktile(int MR, int NR, int dt, float *y, int ldy, const char *a, size_t lda, const char *w, size_t wrow, int K,
              int add) {
    __m256 acc[4][2][2], mac[4][2]; /* [token][output][super-block parity] */
    const size_t bs = dt == TD_DTYPE_Q4_K     ? 144
                      : dt == TD_DTYPE_Q5_K   ? 176
                      : dt == TD_DTYPE_IQ4_XS ? 136
                      : dt == TD_DTYPE_Q3_K   ? 110
                      : dt == TD_DTYPE_Q2_K   ? 84
                                              : 210;
    const int nsb = K / 256, mins = dt == TD_DTYPE_Q4_K || dt == TD_DTYPE_Q5_K || dt == TD_DTYPE_Q2_K, sgn = !mins;
#pragma GCC unroll 4
    for (int i = 0; i < MR; i++)
#pragma GCC unroll 2
        for (int o = 0; o < NR; o++) acc[i][o][0] = acc[i][o][1] = mac[i][o] = _mm256_setzero_ps();
    for (int s = 0; s < nsb; s++) {
        const char *sb[2];
        khead kh[2];
        __m256i P[4][2];
#pragma GCC unroll 2
        for (int o = 0; o < NR; o++) {
            sb[o] = w + o * wrow + (size_t)s * bs;
            if (MR == 1 && NR == 1) { /* decode: one stream, through row ends */
                _mm_prefetch(sb[o] + KPF1, _MM_HINT_T0);
                _mm_prefetch(sb[o] + KPF1 + 64, _MM_HINT_T0);
                _mm_prefetch(sb[o] + KPF1 + 128, _MM_HINT_T0);
                if (bs > 192) _mm_prefetch(sb[o] + KPF1 + 192, _MM_HINT_T0);
            } else { /* M >= 2: QPF2 ahead, through row ends (it was 2 super-blocks ahead within the row) */
                for (size_t c = 0; c < bs; c += 64) _mm_prefetch(sb[o] + QPF2 + c, _MM_HINT_T0);
            }
            khead_get(dt, sb[o], &kh[o]);
#pragma GCC unroll 4
            for (int i = 0; i < MR; i++) P[i][o] = _mm256_setzero_si256();
        }
#pragma GCC unroll 8
        for (int j = 0; j < 8; j++)
#pragma GCC unroll 2
            for (int o = 0; o < NR; o++) {
                __m256i wv = kvals(dt, sb[o], j), wa = sgn ? _mm256_abs_epi8(wv) : wv;
                __m256i s16 = kscale(dt, &kh[o], j);
#pragma GCC unroll 4
                for (int i = 0; i < MR; i++) {
                    __m256i q = _mm256_loadu_si256((const __m256i *)(a + (size_t)i * lda + 256 * (size_t)s + 32 * j));
                    __m256i p16 = _mm256_maddubs_epi16(wa, sgn ? _mm256_sign_epi8(q, wv) : q);
                    P[i][o] = _mm256_add_epi32(P[i][o], _mm256_madd_epi16(p16, s16));
                }
            }
#pragma GCC unroll 4
        for (int i = 0; i < MR; i++) {
            const float *dx = (const float *)(a + (size_t)i * lda + K);
            float ds = dx[s];
#pragma GCC unroll 2
            for (int o = 0; o < NR; o++) {
                acc[i][o][s & 1] = _mm256_fmadd_ps(_mm256_set1_ps(kh[o].d * ds), _mm256_cvtepi32_ps(P[i][o]), acc[i][o][s & 1]);
                if (mins) { /* Q2_K: minimums per 16, against the sums of each 16 q */
                    const int32_t *S32 = (const int32_t *)(dx + nsb);
                    __m256i mS = dt == TD_DTYPE_Q2_K
                                     ? _mm256_madd_epi16(kh[o].m16, _mm256_loadu_si256((const __m256i *)((const int16_t *)(S32 + K / 32) + 16 * s)))
                                     : _mm256_mullo_epi32(_mm256_cvtepu8_epi32(kh[o].m), _mm256_loadu_si256((const __m256i *)(S32 + 8 * s)));
                    mac[i][o] = _mm256_fmadd_ps(_mm256_set1_ps(kh[o].dmin * ds), _mm256_cvtepi32_ps(mS), mac[i][o]);
                }
            }
        }
    }
#pragma GCC unroll 4
    for (int i = 0; i < MR; i++)
#pragma GCC unroll 2
        for (int o = 0; o < NR; o++) {
            float v = fold16(acc[i][o][0], acc[i][o][1]);
            if (mins) v -= fold8(mac[i][o]);
            td_avx2_put(y, ldy, i, o, v, add);
        }
}

#define KT_SET(DT, SUF)                                                                                \
    QTX_INST(ktile, 1, 1, DT, SUF) QTX_INST(ktile, 2, 1, DT, SUF) QTX_INST(ktile, 2, 2, DT, SUF)       \
    QTX_INST(ktile, 4, 2, DT, SUF)
KT_SET(TD_DTYPE_Q4_K, k4)
KT_SET(TD_DTYPE_Q5_K, k5)
KT_SET(TD_DTYPE_Q6_K, k6)
KT_SET(TD_DTYPE_IQ4_XS, x4)
KT_SET(TD_DTYPE_Q3_K, k3)
KT_SET(TD_DTYPE_Q2_K, k2)

typedef struct { qtile_fn t1, t2, t22, t42; } qtile_set; /* 1x1, 2x1, 2x2, 4x2 (k-quants; else NULL) */
#define QTS(S) {qt_1x1_##S, qt_2x1_##S, qt_2x2_##S, NULL}
#ifndef KT42
#define KT42 1
#endif
#define KTS(S) {qt_1x1_##S, qt_2x1_##S, qt_2x2_##S, KT42 ? qt_4x2_##S : NULL}
static const qtile_set QTILES[12] = {QTS(q8), QTS(q4), KTS(k4), KTS(k5), KTS(k6), QTS(q5),
                                     QTS(n4), KTS(x4), KTS(k3), KTS(k2), QTS(p4), QTS(p5)};

void td_avx2_quant_act(const float *x, int n, int8_t *q, float *d) {
    const __m256i abs = _mm256_set1_epi32(0x7fffffff);
    __m256i m = _mm256_setzero_si256();
    for (int j = 0; j < n; j += 8) m = _mm256_max_epu32(m, _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(x + j)), abs));
    __m128i h = _mm_max_epu32(_mm256_castsi256_si128(m), _mm256_extracti128_si256(m, 1));
    h = _mm_max_epu32(h, _mm_shuffle_epi32(h, 0x4e));
    h = _mm_max_epu32(h, _mm_shuffle_epi32(h, 0xb1));
    float id;
    if (!td_quant_act_scale((uint32_t)_mm_cvtsi128_si32(h), d, &id)) { memset(q, 0, (size_t)n); return; }
    const __m256 vid = _mm256_set1_ps(id);
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (int j = 0; j < n; j += 32) {
        __m256i a = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + j), vid));
        __m256i b = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + j + 8), vid));
        __m256i c = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + j + 16), vid));
        __m256i e = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + j + 24), vid));
        /* |x * id| <= 127.0001, so the saturating packs are exact; they interleave 128-bit lanes */
        __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(a, b), _mm256_packs_epi32(c, e));
        _mm256_storeu_si256((__m256i *)(q + j), _mm256_permutevar8x32_epi32(p, order));
    }
}

void td_avx2_qmatmul(float *y, int ldy, const char *a, size_t lda, int M, const void *W, int dt, int K, int n0,
                     int n1, int add) {
    size_t wrow = td_dtype_row_bytes(dt, K);
    const char *wb = W;
    const qtile_set *ts = &QTILES[dt == TD_DTYPE_Q8_0   ? 0
                                  : dt == TD_DTYPE_Q4_0 ? 1
                                  : dt == TD_DTYPE_Q4_K ? 2
                                  : dt == TD_DTYPE_Q5_K ? 3
                                  : dt == TD_DTYPE_Q6_K ? 4
                                  : dt == TD_DTYPE_Q5_0 ? 5
                                  : dt == TD_DTYPE_IQ4_NL ? 6
                                  : dt == TD_DTYPE_IQ4_XS ? 7
                                  : dt == TD_DTYPE_Q3_K ? 8
                                  : dt == TD_DTYPE_Q2_K ? 9
                                  : dt == TD_DTYPE_Q4_1 ? 10
                                                        : 11];
    if (M == 1) { /* one row at a time: a single stream from memory (1 x 4, four streams, was 20-25% slower) */
        for (int n = n0; n < n1; n++) ts->t1(y + n, ldy, a, lda, wb + n * wrow, wrow, K, add);
        return;
    }
    int n = n0;
    for (; n + 2 <= n1; n += 2)
        for (int m = 0; m < M; m += 2) {
            if (ts->t42 && M - m >= 4) {
                ts->t42(y + (size_t)m * ldy + n, ldy, a + (size_t)m * lda, lda, wb + n * wrow, wrow, K, add);
                m += 2;
            } else if (M - m >= 2) ts->t22(y + (size_t)m * ldy + n, ldy, a + (size_t)m * lda, lda, wb + n * wrow, wrow, K, add);
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

/* ---- the R16 order (q8r.h) over repacked Q8_0 records ----------------------
 * One group of 16 outputs x T (1 or 2) tokens per tile. A record line of 64
 * bytes holds 4 values of each of the 16 rows; its two 32-byte halves (rows 0-7,
 * 8-15) are flipped back to signed bytes (xor 0x80), and vpmaddubsw(|w|, sign(q,
 * w)) then vpmaddwd with ones adds 4 exact products into each row's int32 lane
 * (|w| <= 128, |q| <= 127: no saturation). The 8 lines of a block give P_b exact
 * (no -128 * sum q needed: the bytes are signed again); then c = dw * d and one
 * fma per output, as q8r.c's other kernels. Nibble records (NIB, a constant at
 * every call: TD_Q8R_NIB_Q4_0 for Q4_0 and IQ4_NL, or the format's own; tab: the
 * format's table, q8r.h) give each line's halves from nibble line j % 4 through
 * the table, and Q5_0's add 16 where the row's qh (line 4) has bit 4j + c. */
/* Add w to the bytes of line j's halves (u0: rows 0-7, u1: 8-15) whose bit is
 * set in the line of bits at h (row n's word at 4n, bit 4j + c for byte c). */
AI void r16_bits(__m256i *u0, __m256i *u1, const uint8_t *h, int j, int w) {
    const __m256i rep = _mm256_set_epi64x(0x0c0c0c0c08080808LL, 0x0404040400000000LL, 0x0c0c0c0c08080808LL,
                                          0x0404040400000000LL),
                  bit4 = _mm256_set1_epi32(0x08040201), add = _mm256_set1_epi8((char)w);
    for (int i = 0; i < 2; i++) {
        __m256i x = _mm256_load_si256((const __m256i *)(const void *)(h + 32 * i));
        x = _mm256_and_si256(_mm256_shuffle_epi8(_mm256_srli_epi32(x, 4 * j), rep), bit4);
        __m256i *u = i ? u1 : u0;
        *u = _mm256_add_epi8(*u, _mm256_andnot_si256(_mm256_cmpeq_epi8(x, _mm256_setzero_si256()), add));
    }
}

/* How far ahead a tile's first token pair prefetches its group's bytes (into
 * the next groups). Zen 3, 0.6B shape Q8_0 under act bf16, old and new
 * alternating in one process (bench/forward-notes.md, "Stop 49"): none before;
 * 4096 bytes: T = 1 35.2 -> 33.3, T = 4 51.2 -> 43.9, T = 16 154 -> 130 ms
 * (medians); 2048 and 8192 measured alike in bench/q8r_bw.c. */
enum { R16_PF = 4096 };
AI void r16_tile(int T, float *y, int ldy, const uint8_t *xq, size_t rb, const uint8_t *grp, int nb, int K, int nv,
                 int add, int NIB, const uint8_t *tab, int pf_on) {
    const __m256i flip = _mm256_set1_epi8((char)0x80), ones = _mm256_set1_epi16(1), m4 = _mm256_set1_epi8(15);
    const __m256i tb = NIB ? _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(const void *)tab)) : flip;
    const int fmt = NIB, q5 = NIB == TD_Q8R_Q5_0 || NIB == TD_Q8R_Q6_K || NIB == TD_Q8R_Q5_K, q6 = NIB == TD_Q8R_Q6_K; /* the offsets depend
                                                                                                   only on the kind */
    __m256 f[2][2];
#pragma GCC unroll 2
    for (int t = 0; t < T; t++) f[t][0] = f[t][1] = _mm256_setzero_ps();
    const size_t gs = td_q8r_group_bytes(K, fmt), bpb = gs / (size_t)nb; /* bytes a block, on average */
    for (int b = 0; b < nb; b++) {
        const uint8_t *v = grp + td_q8r_rec_values(fmt, b);
        if (pf_on) { /* the group's bytes R16_PF ahead, into the next groups (prefetches never fault) */
            const uint8_t *pf = grp + (size_t)b * bpb + R16_PF;
            for (size_t o = 0; o < bpb; o += 64) _mm_prefetch((const char *)(pf + o), _MM_HINT_T0);
        }
        __m256i p[2][2];
#pragma GCC unroll 2
        for (int t = 0; t < T; t++) p[t][0] = p[t][1] = _mm256_setzero_si256();
#pragma GCC unroll 8
        for (int j = 0; j < 8; j++) {
            __m256i u0, u1;
            if (!NIB) {
                u0 = _mm256_load_si256((const __m256i *)(const void *)(v + 64 * j));
                u1 = _mm256_load_si256((const __m256i *)(const void *)(v + 64 * j + 32));
            } else {
                __m256i n0 = _mm256_load_si256((const __m256i *)(const void *)(v + 64 * (j & 3)));
                __m256i n1 = _mm256_load_si256((const __m256i *)(const void *)(v + 64 * (j & 3) + 32));
                if (j >= 4) n0 = _mm256_srli_epi16(n0, 4), n1 = _mm256_srli_epi16(n1, 4);
                u0 = _mm256_shuffle_epi8(tb, _mm256_and_si256(n0, m4));
                u1 = _mm256_shuffle_epi8(tb, _mm256_and_si256(n1, m4));
                if (q5) r16_bits(&u0, &u1, v + 256, j, 16); /* byte c of row n's dword: bit 4j + c of its qh */
                if (q6) r16_bits(&u0, &u1, v + 320, j, 32); /* Q6_K: bit 5 from the next line, worth 32 */
            }
            __m256i w0 = _mm256_xor_si256(u0, flip), w1 = _mm256_xor_si256(u1, flip);
            __m256i a0 = _mm256_abs_epi8(w0), a1 = _mm256_abs_epi8(w1);
#pragma GCC unroll 2
            for (int t = 0; t < T; t++) {
                int32_t q4;
                memcpy(&q4, xq + (size_t)t * rb + 32 * b + 4 * j, 4);
                __m256i x = _mm256_set1_epi32(q4);
                p[t][0] = _mm256_add_epi32(p[t][0], _mm256_madd_epi16(_mm256_maddubs_epi16(a0, _mm256_sign_epi8(x, w0)), ones));
                p[t][1] = _mm256_add_epi32(p[t][1], _mm256_madd_epi16(_mm256_maddubs_epi16(a1, _mm256_sign_epi8(x, w1)), ones));
            }
            if (q6 && (j == 3 || j == 7)) { /* Q6_K: a half's step (d * sc exact); the next half from zero */
                const uint8_t *h = grp + td_q8r_rec_head(fmt, b), *sc = grp + td_q8r_rec_scales(fmt, b) + (j == 7 ? 16 : 0);
                __m256 c[2];
#pragma GCC unroll 2
                for (int i = 0; i < 2; i++)
                    c[i] = _mm256_mul_ps(_mm256_cvtph_ps(_mm_load_si128((const __m128i *)(const void *)(h + 16 * i))),
                                         _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(const void *)(sc + 8 * i)))));
#pragma GCC unroll 2
                for (int t = 0; t < T; t++) {
                    float d;
                    memcpy(&d, xq + (size_t)t * rb + K + 4 * b, 4);
                    __m256 dx = _mm256_set1_ps(d);
#pragma GCC unroll 2
                    for (int i = 0; i < 2; i++) {
                        f[t][i] = _mm256_fmadd_ps(_mm256_mul_ps(c[i], dx), _mm256_cvtepi32_ps(p[t][i]), f[t][i]);
                        p[t][i] = _mm256_setzero_si256();
                    }
                }
            }
        }
        if (q6) continue;
        const uint8_t *sc = grp + td_q8r_rec_scales(fmt, b);
        if (td_q8r_kmin(NIB)) { /* cs = d sc, cm = dmin m (exact); P's step, then -S's (ns = -128 S) */
            const uint8_t *h = grp + td_q8r_rec_head(fmt, b);
            __m256 cs[2], cm[2];
#pragma GCC unroll 2
            for (int i = 0; i < 2; i++) {
                cs[i] = _mm256_mul_ps(_mm256_cvtph_ps(_mm_load_si128((const __m128i *)(const void *)(h + 16 * i))),
                                      _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(const void *)(sc + 8 * i)))));
                cm[i] = _mm256_mul_ps(_mm256_cvtph_ps(_mm_load_si128((const __m128i *)(const void *)(h + 32 + 16 * i))),
                                      _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(const void *)(sc + 16 + 8 * i)))));
            }
#pragma GCC unroll 2
            for (int t = 0; t < T; t++) {
                float d;
                int32_t ns;
                memcpy(&d, xq + (size_t)t * rb + K + 4 * b, 4);
                memcpy(&ns, xq + (size_t)t * rb + K + 4 * nb + 4 * b, 4);
                __m256 dx = _mm256_set1_ps(d), mS = _mm256_set1_ps((float)(ns / 128));
#pragma GCC unroll 2
                for (int i = 0; i < 2; i++) {
                    f[t][i] = _mm256_fmadd_ps(_mm256_mul_ps(cs[i], dx), _mm256_cvtepi32_ps(p[t][i]), f[t][i]);
                    f[t][i] = _mm256_fmadd_ps(_mm256_mul_ps(cm[i], dx), mS, f[t][i]);
                }
            }
            continue;
        }
        __m256 s0, s1;
        if (NIB == TD_Q8R_IQ4_XS) { /* d * sc (exact) */
            const uint8_t *h = grp + td_q8r_rec_head(fmt, b);
            s0 = _mm256_mul_ps(_mm256_cvtph_ps(_mm_load_si128((const __m128i *)(const void *)h)),
                               _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(const void *)sc))));
            s1 = _mm256_mul_ps(_mm256_cvtph_ps(_mm_load_si128((const __m128i *)(const void *)(h + 16))),
                               _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(const void *)(sc + 8)))));
        } else {
            s0 = _mm256_cvtph_ps(_mm_load_si128((const __m128i *)(const void *)sc));
            s1 = _mm256_cvtph_ps(_mm_load_si128((const __m128i *)(const void *)(sc + 16)));
        }
#pragma GCC unroll 2
        for (int t = 0; t < T; t++) {
            float d;
            memcpy(&d, xq + (size_t)t * rb + K + 4 * b, 4);
            __m256 dx = _mm256_set1_ps(d);
            f[t][0] = _mm256_fmadd_ps(_mm256_mul_ps(s0, dx), _mm256_cvtepi32_ps(p[t][0]), f[t][0]);
            f[t][1] = _mm256_fmadd_ps(_mm256_mul_ps(s1, dx), _mm256_cvtepi32_ps(p[t][1]), f[t][1]);
        }
    }
#pragma GCC unroll 2
    for (int t = 0; t < T; t++) {
        float o[16], *yy = y + (size_t)t * ldy;
        _mm256_storeu_ps(o, f[t][0]);
        _mm256_storeu_ps(o + 8, f[t][1]);
        for (int l = 0; l < nv; l++) yy[l] = add ? yy[l] + o[l] : o[l];
    }
}

/* every 16-row group of [n0, n1), 2 tokens a tile; NIB a constant at every call */
AI void r16_run(float *y, int ldy, const uint8_t *xs, int M, const uint8_t *W, int K, int n0, int n1, int add, int NIB,
                const uint8_t *tab) {
    int nb = K / 32;
    size_t rb = td_q8r_row_bytes(K), gs = td_q8r_group_bytes(K, NIB);
    for (int n = n0; n < n1; n += 16) {
        int nv = n1 - n < 16 ? n1 - n : 16;
        const uint8_t *grp = W + (size_t)(n / 16) * gs;
        int m = 0;
        for (; m + 2 <= M; m += 2)
            r16_tile(2, y + (size_t)m * ldy + n, ldy, xs + (size_t)m * rb, rb, grp, nb, K, nv, add, NIB, tab, m == 0);
        if (m < M) r16_tile(1, y + (size_t)m * ldy + n, ldy, xs + (size_t)m * rb, rb, grp, nb, K, nv, add, NIB, tab, m == 0);
    }
}

void td_avx2_q8r_matmul(float *y, int ldy, const void *xq, int M, const void *Wr, int K, int n0, int n1, int add,
                        int fmt) {
    if (fmt == TD_Q8R_BYTES) r16_run(y, ldy, xq, M, Wr, K, n0, n1, add, TD_Q8R_BYTES, NULL);
    else if (fmt == TD_Q8R_Q4_K) r16_run(y, ldy, xq, M, Wr, K, n0, n1, add, TD_Q8R_Q4_K, td_q8r_table(fmt));
    else if (fmt == TD_Q8R_Q5_K) r16_run(y, ldy, xq, M, Wr, K, n0, n1, add, TD_Q8R_Q5_K, td_q8r_table(fmt));
    else if (fmt == TD_Q8R_Q6_K) r16_run(y, ldy, xq, M, Wr, K, n0, n1, add, TD_Q8R_Q6_K, td_q8r_table(fmt));
    else if (fmt == TD_Q8R_Q5_0) r16_run(y, ldy, xq, M, Wr, K, n0, n1, add, TD_Q8R_Q5_0, td_q8r_table(fmt));
    else if (fmt == TD_Q8R_IQ4_XS) r16_run(y, ldy, xq, M, Wr, K, n0, n1, add, TD_Q8R_IQ4_XS, td_q8r_table(fmt));
    else r16_run(y, ldy, xq, M, Wr, K, n0, n1, add, TD_Q8R_NIB_Q4_0, td_q8r_table(fmt));
}

#else
typedef int td_quant_avx2_empty; /* not an x86-64 build: no AVX2 path */
#endif
