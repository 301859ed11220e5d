/* quant — block-quantized weights, byte-compatible with GGUF's Q8_0 and Q4_0.
 *
 * Formats (blocks of 32 consecutive values of a row; a row of K values is K/32
 * blocks, so K must be a multiple of 32):
 *   Q8_0: f16 scale d, then 32 int8 q[i]        (34 bytes);  value i = q[i] * d
 *   Q4_0: f16 scale d, then 16 bytes qs[j]      (18 bytes);  value j      = ((qs[j] & 15) - 8) * d,
 *                                                             value j + 16 = ((qs[j] >> 4) - 8) * d
 *   Q5_0: f16 scale d, 4 bytes qh (little-endian bit i = bit 4 of value i), then qs as
 *         Q4_0's                                (22 bytes);  value i = (q_i - 16) * d
 *   Q4_1: f16 d, f16 m, then qs as Q4_0's       (20 bytes);  value = q * d + m (q = the nibble)
 *   Q5_1: f16 d, f16 m, qh, qs as Q5_0's         (24 bytes);  value = q * d + m (q = the 5 bits)
 *   IQ4_NL: as Q4_0, but value = td_iq4_values[nibble] * d (18 bytes; the table below)
 * Quantization (td_quantize_row) follows llama.cpp's reference quantizers:
 * Q8_0 d = amax/127, q = roundf(x/d); Q4_0 d = (the value of largest magnitude)/-8,
 * nibble = min(15, trunc(x/d + 8.5)); Q5_0 likewise with -16, 31 and 16.5; Q4_1 / Q5_1
 * d = (max - min) / 15 (31), m = min, q = min(15 (31), trunc((x - min) / d + 0.5)). Non-finite or NaN inputs give a defined
 * (clamped) result instead of undefined behaviour.
 *
 * Matrix products (td_quant_matmul, reached through td_matmul) follow llama.cpp:
 * each activation row is quantized to Q8 blocks of 32 (below), every block pair
 * is multiplied in exact integer arithmetic, and the block results are scaled
 * and summed in f32 in ONE fixed order ("Q16", below) on every kernel path
 * (portable C, AVX2, AVX-512 VNNI), for every M, output range, tile shape and
 * thread count: a row's logits do not depend on how many rows share the call
 * (batch invariance), and TD_KERNELS=portable|avx2|avx512 give the same bits.
 *
 * Activation quantization (td_quant_act_row; per row, per block of 32 values):
 *   amax = max |x_i| (exact); amax non-finite (a NaN or inf in the block):
 *   d = NaN, q_i = 0 (so the product's outputs are NaN, never a number);
 *   amax < 2^-100: d = 0, q_i = 0; else d = amax / 127, id = 1 / d (f32
 *   divisions), q_i = rint(x_i * id) (round to nearest even; |q_i| <= 127).
 *   d stays f32 (llama.cpp rounds it to f16).
 * The Q16 order of an output y[m][n] = sum_k x[m][k] W[n][k] (blocks b = 0 ..
 * K/32 - 1; w = the block's int8 values, Q4_0 nibble - 8; dw its f16 scale in f32):
 *   P_b[l] = sum_{i<4} w[4l+i] * q[32b+4l+i]   (l = 0..7, exact int32)
 *   c_b    = dw_b * d_b                        (f32 multiply)
 *   acc[8 (b & 1) + l] = fma(c_b, (float)P_b[l], acc[8 (b & 1) + l])  (b ascending;
 *   16 f32 lanes from 0; even blocks in lanes 0-7, odd blocks in 8-15 — with an
 *   odd number of blocks, lanes 8-15 are simply not touched by the last one)
 *   s = the D16 fold of acc (kernels.h); y = s, or y + s when add.
 * Q4_1 / Q5_1 (w = the unsigned q) add their minimums: with S_b the exact sum of
 * block b's 32 q and m_b the block's f16 minimum as f32,
 *   macc[b % 8] = fma(m_b * d_b, (float)S_b, macc[b % 8])   (8 lanes, b ascending)
 *   s = (D16 fold of acc) + (D8 fold of macc: s4[i] = v[i] + v[i+4], s2[i] = s4[i] +
 *   s4[i+2], s2[0] + s2[1]).
 * Error against the f32 product over the dequantized weights wd (stated bound,
 * tests/test_quant.c checks it on random and ragged inputs): per block, the
 * activation rounding is at most d_b/2 (+ the rounding of d and id, < 2^-15 d_b)
 * per value, so |y - sum wd x| <= sum_b (0.5001 d_b) sum_{k in b} |wd_k|
 * + (K/32 + 6) 2^-23 sum_b |c_b| sum_l |P_b[l]|   (the f32 additions; Q4_1 / Q5_1
 * add |m_b d_b| |S_b| to each block's term).
 * Measured relative rms error of a product vs the unquantized weights: q8_0
 * ~1e-2 (weights and activations each ~0.6% rms), q4_0 ~0.1.
 * Kernels: AVX-512 VNNI for Q8_0, Q4_0, Q5_0 and IQ4_NL (vpdpbusd on u8 = w + 128
 * against s8 activations, with -128 * sum q precomputed per activation lane as the
 * accumulator's start: so weight bytes of -128 in a GGUF file are exact too), 1 x 8
 * register tiles for decode; for M >= 2 (q8_0; the others: M >= 8) "strips": 8 weight rows transposed
 * once per call so that one vector holds lane (h, l) of 8 outputs, tiles of 3
 * tokens x 8 outputs (quant.c); AVX2 (quant_avx2.c: vpmaddubsw of |w|
 * with sign(q, w), then vpmaddwd); portable C. CPUs with AVX-512 but without
 * VNNI run the AVX2 kernels for quantized weights (same bits). Under act_type
 * bf16 and amx, Q8_0, Q4_0, IQ4_NL and Q5_0 matrices multiply in q8r.h's R16
 * order instead (over repacked copies), Q4_1 and Q5_1 in Q16.
 *
 * K-quants (GGUF's Q4_K, Q5_K, Q6_K; super-blocks of TD_QKK = 256 values, so K
 * must be a multiple of 256; values exactly as llama.cpp's dequantize_row_q*_K
 * compute them, which tests/kquant_oracle.sh checks bit for bit against ggml's
 * own prebuilt library when node-llama-cpp is installed):
 *   Q4_K: f16 d, f16 dmin, 12 bytes of 6-bit (sc, m) for 8 sub-blocks of 32, then
 *         128 bytes: byte l of 32-byte group g holds value l of sub-block 2g (low
 *         nibble) and of sub-block 2g+1 (high nibble). value = (d*sc) * q - dmin*m.
 *         Sub-block j < 4: sc = s[j] & 63, m = s[j+4] & 63; j >= 4: sc = (s[j+4] & 15)
 *         | (s[j-4] >> 6) << 4, m = (s[j+4] >> 4) | (s[j] >> 6) << 4.   (144 bytes)
 *   Q5_K: as Q4_K with 32 bytes qh after the scales (bit j of qh[l] is bit 4 of
 *         value l of sub-block j), then the 128 nibble bytes.            (176 bytes)
 *   IQ4_XS: f16 d, u16 scales_h, 4 bytes scales_l, 128 bytes qs; sub-block j (32 values):
 *         sc = ((scales_l[j/2] >> 4(j%2)) & 15 | ((scales_h >> 2j) & 3) << 4) - 32, its 16
 *         bytes qs[16j..] as IQ4_NL's; value = (d * sc) * td_iq4_values[nibble]. (136 bytes)
 *   Q2_K: 16 bytes scales (low nibble sc, high nibble m, one per 16 values), 64 bytes qs,
 *         f16 d, f16 dmin. Value v: h, j, l as Q3_K's; q = (qs[32h + l] >> 2j) & 3;
 *         value = (d * sc[v / 16]) * q - dmin * m[v / 16].                   (84 bytes)
 *   Q3_K: 32 bytes hmask, 64 bytes qs, 12 bytes of 16 6-bit scales, f16 d. Value v: h = v / 128,
 *         j = (v % 128) / 32, l = v % 32: low 2 bits (qs[32h + l] >> 2j) & 3, minus 4 unless
 *         bit 4h + j of hmask[l] is set; scale sc[v / 16] - 32, the 16 scales packed as low
 *         nibbles (words 0, 1: s0-7; their high nibbles s8-15) and 2 high bits (word 2,
 *         shifted by 0, 2, 4, 6 for s0-3, s4-7, s8-11, s12-15); value = (d * sc) * w.  (110 bytes)
 *   Q6_K: 128 bytes ql, 64 bytes qh, 16 int8 scales (one per 16 values), f16 d.
 *         Value v: h = v / 128, g = (v % 128) / 32, l = v % 32: low 4 bits from
 *         ql[64h + 32(g & 1) + l] (low nibble for g < 2, high for g >= 2), bits 4-5
 *         from qh[32h + l] >> 2g; value = (d * sc[v / 16]) * (q - 32).     (210 bytes)
 * Their products quantize each activation row in super-blocks of 256 as llama.cpp
 * does for these formats (its Q8_K): td_quant_act_row's rule over 256 values
 * instead of 32 (amax, d = amax / 127, q = rint(x / d); non-finite: d = NaN, q = 0;
 * tiny: d = 0, q = 0), plus the exact sums S_j of each 32 q. The weights are
 * integers w (Q2_K/Q4_K/Q5_K: the unsigned q; Q6_K: q - 32; Q3_K: -4..3; IQ4_XS: the
 * table's value) with integer sub-block scales sc (Q6_K, Q3_K, Q2_K: one per 16 values),
 * so a whole super-block s sums exactly:
 *   P_s[l] = sum_{j<8} sc_{j,l} * sum_{i<4} w[32j+4l+i] * q[256s+32j+4l+i]   (l = 0..7;
 *            sc_{j,l} = sc_j for Q4_K/Q5_K/IQ4_XS, sc[2j] for l < 4 and sc[2j+1] for
 *            l >= 4 for Q6_K/Q3_K/Q2_K; |P| < 2^24, so (float)P is exact)
 *   acc[8 (s & 1) + l] = fma(d_w * d_s, (float)P_s[l], acc[8 (s & 1) + l])
 *                      (d_w the super-block's f16 d as f32, d_s the activation scale)
 *   Q4_K/Q5_K/Q2_K also: macc[j] = fma(dmin_w * d_s, (float)(m_{2j} * S'_{2j} + m_{2j+1} *
 *   S'_{2j+1}), macc[j]) (8 lanes; S' the exact sums of each 16 q, m_i the minimum of
 *   values 16i..16i+15: for Q4_K/Q5_K m_{2j} = m_{2j+1} = m_j, so this is m_j * S_j)
 *   s = D16 fold of acc, minus (Q4_K/Q5_K/Q2_K) the D8 fold of macc (s4[i] = v[i] + v[i+4],
 *   s2[i] = s4[i] + s4[i+2], s2[0] + s2[1]); y = s, or y + s when add.
 * Kernels: AVX-512 BW + VNNI for Q2_K / Q3_K / Q4_K / Q5_K / Q6_K / IQ4_XS (kq512.c:
 * two super-blocks a register, tiles of up to 8 tokens), AVX2 (quant_avx2.c: every
 * k-quant on AVX-512 CPUs without VNNI) and portable C. The
 * quantizers (td_quantize_row) are tandem's own, simpler than llama.cpp's
 * iterative ones (files differ in bytes, not in format): per sub-block the
 * range (Q4_K/Q5_K: min(0, min x) .. max x; Q6_K: the largest |x|) sets its
 * scale, the sub-block scales and mins are rounded to 6 (Q6_K: 8) bits against
 * the super-block's d / dmin, and every value is then rounded against the
 * stored scales it will be decoded with. */
#ifndef TD_QUANT_H
#define TD_QUANT_H

#include "tandem.h"
#include <stddef.h>
#include <stdint.h>

#define TD_QK 32   /* values per block */
#define TD_QKK 256 /* values per k-quant super-block */

/* IQ4_NL / IQ4_XS: the 16 values a nibble stands for (the format's constants) */
extern const int8_t td_iq4_values[16];
/* The index of the table entry nearest v (ties to the smaller; NaN: the entry nearest 0). */
int td_iq4_nearest(float v);

typedef struct td_block_q8_0 {
    uint16_t d;      /* f16 scale */
    int8_t qs[32];
} td_block_q8_0;     /* 34 bytes */

typedef struct td_block_q4_0 {
    uint16_t d;      /* f16 scale */
    uint8_t qs[16];  /* low nibbles: values 0..15, high nibbles: values 16..31 */
} td_block_q4_0;     /* 18 bytes */

typedef struct td_block_q5_0 {
    uint16_t d;      /* f16 scale */
    uint8_t qh[4];   /* bit i (little-endian): bit 4 of value i */
    uint8_t qs[16];  /* low 4 bits, as Q4_0 */
} td_block_q5_0;     /* 22 bytes */

typedef struct td_block_q4_1 {
    uint16_t d, m;   /* f16 scale and minimum */
    uint8_t qs[16];  /* as Q4_0's */
} td_block_q4_1;     /* 20 bytes */

typedef struct td_block_q5_1 {
    uint16_t d, m;
    uint8_t qh[4];   /* as Q5_0's */
    uint8_t qs[16];
} td_block_q5_1;     /* 24 bytes */

typedef struct td_block_iq4_nl {
    uint16_t d;      /* f16 scale */
    uint8_t qs[16];  /* table indices, as Q4_0's nibbles */
} td_block_iq4_nl;   /* 18 bytes */

typedef struct td_block_iq4_xs {
    uint16_t d;          /* f16 super-block scale */
    uint16_t scales_h;   /* bits 4-5 of the 8 sub-block scales, 2 bits each */
    uint8_t scales_l[4]; /* bits 0-3, a nibble each */
    uint8_t qs[128];     /* table indices: sub-block j at 16 j, as IQ4_NL's */
} td_block_iq4_xs;       /* 136 bytes per 256 values */

typedef struct td_block_q4_k {
    uint16_t d, dmin;     /* f16 super-block scales of the sub-block scales and mins */
    uint8_t scales[12];   /* 8 x (6-bit sc, 6-bit m), packed as described above */
    uint8_t qs[128];      /* nibbles: group g byte l = sub-block 2g (low), 2g+1 (high) */
} td_block_q4_k;          /* 144 bytes per 256 values */

typedef struct td_block_q5_k {
    uint16_t d, dmin;
    uint8_t scales[12];
    uint8_t qh[32];       /* bit j of qh[l]: bit 4 of value l of sub-block j */
    uint8_t qs[128];
} td_block_q5_k;          /* 176 bytes */

typedef struct td_block_q6_k {
    uint8_t ql[128];      /* low 4 bits */
    uint8_t qh[64];       /* high 2 bits */
    int8_t scales[16];    /* one per 16 values */
    uint16_t d;           /* f16 super-block scale */
} td_block_q6_k;          /* 210 bytes */

typedef struct td_block_q2_k {
    uint8_t scales[16];   /* low nibble: scale, high nibble: minimum, per 16 values */
    uint8_t qs[64];       /* 2 bits per value, laid out as Q3_K's low bits */
    uint16_t d, dmin;     /* f16 super-block scales */
} td_block_q2_k;          /* 84 bytes */

typedef struct td_block_q3_k {
    uint8_t hmask[32];    /* bit 4h + j of byte l: value 128h + 32j + l is >= 0 (else minus 4) */
    uint8_t qs[64];       /* low 2 bits */
    uint8_t scales[12];   /* 16 6-bit scales (biased by 32), packed as described above */
    uint16_t d;           /* f16 super-block scale */
} td_block_q3_k;          /* 110 bytes */

/* The 32 integer values of one block of dtype (Q8_0, Q4_0, Q5_0, Q4_1, Q5_1 or
 * IQ4_NL; blk: its bytes): Q8_0 the int8 q, Q4_0 nibble - 8, Q5_0 the 5 bits - 16,
 * Q4_1 / Q5_1 the unsigned q, IQ4_NL the table's value of the nibble. */
void td_block_i8(const void *blk, int dtype, int8_t w[32]);
/* 1 for TD_DTYPE_Q4_1 / Q5_1 (blocks of 32 with a minimum). */
int td_dtype_has_min32(int dtype);
/* 1 for TD_DTYPE_Q2_K / Q3_K / Q4_K / Q5_K / Q6_K / IQ4_XS (super-blocks of 256). */
int td_dtype_is_kquant(int dtype);
/* Values per block of dtype: 256 for the k-quants, 32 for Q8_0 / Q4_0 / Q5_0 / Q4_1 / Q5_1 /
 * IQ4_NL, 1 otherwise. */
int td_dtype_block(int dtype);

/* 1 for the block formats: TD_DTYPE_Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS. */
int td_dtype_is_quant(int dtype);
/* Bytes of n consecutive values of one row of dtype (n a multiple of
 * td_dtype_block(dtype); 0 when dtype is unknown or n does not fit its blocks). */
size_t td_dtype_row_bytes(int dtype, int64_t n);
/* 0 when a row of n values can be stored as dtype; else TD_EFORMAT with a
 * message naming what (tensor names the tensor in the message). */
int td_dtype_check_row(int dtype, int64_t n, const char *tensor, td_err *err);

/* 0 when nbytes is exactly the size of a [rows][k] tensor of dtype (k a
 * multiple of 32 for the block formats); else TD_EFORMAT naming the tensor,
 * the dtype, the shape and both sizes. */
int td_dtype_check_tensor(int dtype, int64_t rows, int64_t k, uint64_t nbytes, const char *tensor, td_err *err);

/* f32 -> f16, round to nearest even (overflow to inf, NaN stays NaN). */
uint16_t td_f32_to_f16(float f);

/* Quantize n values (n a multiple of td_dtype_block(dtype)) of x into dst
 * (td_dtype_row_bytes(dtype, n) bytes). Returns 0, or TD_EINVAL for another
 * dtype or a bad n. */
int td_quantize_row(int dtype, const float *x, void *dst, int64_t n);
/* Dequantize n values (a multiple of the block) starting at a block boundary of src. */
void td_dequantize_row(int dtype, const void *src, float *dst, int64_t n);

/* The activation scale of a block whose largest |x| has the f32 bits ab (the rule
 * above): *d and *id = 1 / *d; returns 0 when the block's q are all 0 (a
 * non-finite or tiny block: *d NaN or 0). */
int td_quant_act_scale(uint32_t ab, float *d, float *id);
/* Quantize one activation row of K values (K % 32 == 0) as above: q[K] int8,
 * d[K/32] f32 scales (on the AVX2 path by td_avx2_quant_act: the same bits). */
void td_quant_act_row(const float *x, int K, int8_t *q, float *d);
/* The same over super-blocks of 256 values (K % 256 == 0; the k-quants' products):
 * q[K], d[K/256], sums[K/32] the exact sum of each 32 q, sums16[K/16] of each 16. */
void td_quant_act_row_k(const float *x, int K, int8_t *q, float *d, int32_t *sums, int16_t *sums16);

/* td_matmul for a quantized W ([N] rows of K values, row-major blocks; K must
 * be a multiple of td_dtype_block(dtype) — callers validate at load; with another K, or if this
 * thread's activation scratch cannot be allocated, the outputs [n0, n1) are set
 * to NaN). Each activation row is quantized (td_quant_act_row) and the outputs
 * are computed in the Q16 order above: the same bits on every kernel path and
 * for every M / [n0, n1). Scratch: a per-thread buffer that grows to the
 * largest call's packed activations (up to 64 rows; freed at thread exit). */
void td_quant_matmul(float *y, int ldy, const float *x, int ldx, int M, const void *W, int dtype,
                     int K, int n0, int n1, int add);

#endif
