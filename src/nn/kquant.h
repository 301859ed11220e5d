/* kquant — GGUF's k-quant formats Q4_K, Q5_K, Q6_K (internal to src/nn).
 *
 * quant.h defines the byte layouts, the decoded values and the order of their
 * products (the Q16 lanes with per-lane weight scales and, for Q4_K/Q5_K, a
 * separate 8-lane accumulator of the sub-block minimums). This module holds the
 * format code shared by every kernel path: the scale unpacking (inline, for the
 * AVX2 tiles too), the quantizers, the dequantizers and the portable product. */
#ifndef TD_KQUANT_H
#define TD_KQUANT_H

#include "nn/quant.h"

#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* Bytes of one super-block of dt (144, 176, 210), 0 for another dtype. */
size_t td_kq_block_bytes(int dt);

/* The 8 sub-block scales and minimums of a Q4_K / Q5_K super-block from its 12
 * packed bytes (6 bits each, layout in quant.h). */
static inline void td_kq_unpack_scales(const uint8_t *s, uint8_t sc[8], uint8_t m[8]) {
    for (int j = 0; j < 4; j++) {
        sc[j] = s[j] & 63;
        m[j] = s[j + 4] & 63;
        sc[j + 4] = (uint8_t)((s[j + 8] & 15) | (s[j] >> 6) << 4);
        m[j + 4] = (uint8_t)((s[j + 8] >> 4) | (s[j + 4] >> 6) << 4);
    }
}

/* The 16 scales of a Q3_K super-block (sc - 32, in [-32, 31]) from its 12 packed
 * bytes (layout in quant.h), four to a 32-bit word. */
static inline void td_kq_q3_scales(const uint8_t *s, int8_t sc[16]) {
    uint32_t w[3];
    memcpy(w, s, 12);
    const uint32_t k4 = 0x0f0f0f0f, k2 = 0x03030303;
    uint32_t o[4] = {(w[0] & k4) | (w[2] & k2) << 4, (w[1] & k4) | ((w[2] >> 2) & k2) << 4,
                     ((w[0] >> 4) & k4) | ((w[2] >> 4) & k2) << 4, ((w[1] >> 4) & k4) | ((w[2] >> 6) & k2) << 4};
    for (int i = 0; i < 16; i++) sc[i] = (int8_t)((int)((o[i / 4] >> (8 * (i % 4))) & 63) - 32);
}

/* n values (n % 256 == 0) of x into dst as dt; non-finite inputs give defined
 * (clamped) blocks. */
void td_kq_quantize_row(int dt, const float *x, void *dst, int64_t n);
/* n values (n % 256 == 0) of src, exactly as quant.h (and llama.cpp) define them. */
void td_kq_dequantize_row(int dt, const void *src, float *dst, int64_t n);

/* quant.h's D8 fold of 8 lanes: s4[i] = v[i] + v[i+4], s2[i] = s4[i] + s4[i+2], s2[0] + s2[1]. */
float td_fold8(const float *v);

/* Portable product in the order of quant.h: activation row m packed at a + m * lda
 * as q[K] int8, d[K/256] f32, S[K/32] int32, S'[K/16] int16 (td_quant_act_row_k); weight rows
 * [n0, n1) of W (dt a k-quant, K % 256 == 0). */
void td_kq_matmul_p(float *y, int ldy, const char *a, size_t lda, int M, const char *W, int dt, int K, int n0,
                    int n1, int add);

#if defined(__AVX2__)
#include <immintrin.h>
/* Q3_K's 16 scales (6 bits, minus 32) of the block at blk as int8 lanes, in
 * registers (the AVX2 and AVX-512 kernels; td_kq_q3_scales' rule) */
static inline __m128i td_kq_q3_scales_v(const char *blk) {
    uint32_t w[3];
    memcpy(w, blk + 96, 12);
    const uint32_t k4 = 0x0f0f0f0f, k2 = 0x03030303;
    __m128i s8 = _mm_setr_epi32((int)((w[0] & k4) | (w[2] & k2) << 4), (int)((w[1] & k4) | ((w[2] >> 2) & k2) << 4),
                                (int)(((w[0] >> 4) & k4) | ((w[2] >> 4) & k2) << 4),
                                (int)(((w[1] >> 4) & k4) | ((w[2] >> 6) & k2) << 4));
    return _mm_sub_epi8(s8, _mm_set1_epi8(32));
}
/* IQ4_XS's 8 sub-block scales of the block at blk as int32 lanes (the AVX2 and
 * AVX-512 kernels): nibble j of scales_l (the low and high nibbles interleaved)
 * | bits 2j of scales_h << 4 (one variable shift per lane), minus 32 */
static inline __m256i td_kq_iq4xs_scales(const char *blk) {
    uint16_t sh;
    uint32_t sl;
    memcpy(&sh, blk + 2, 2);
    memcpy(&sl, blk + 4, 4);
    __m128i a = _mm_cvtsi32_si128((int)sl), m4 = _mm_set1_epi8(15);
    __m128i nib = _mm_unpacklo_epi8(_mm_and_si128(a, m4), _mm_and_si128(_mm_srli_epi16(a, 4), m4));
    __m256i hb = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(sh), _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14)),
                                  _mm256_set1_epi32(3));
    return _mm256_sub_epi32(_mm256_or_si256(_mm256_cvtepu8_epi32(nib), _mm256_slli_epi32(hb, 4)), _mm256_set1_epi32(32));
}
#endif

#endif
