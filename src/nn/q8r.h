/* q8r — products of Q8_0 weights under act_type bf16 and amx, over a repacked
 * copy of the weights (the "R16" order). Q4_0, IQ4_NL and Q5_0 weights take it
 * too: a block of theirs is one f16 scale and 32 int8 values (nibble - 8, the
 * IQ4 table's value of the nibble, 5 bits - 16), so the products and their bits
 * are those of the Q8_0 matrix holding the same values and scales. Their
 * records keep the file's bytes (18 or 22 a block), which the kernels spread
 * into value bytes in registers (a 16-entry table; Q5_0's fifth bits by a
 * masked add). Their Q16 kernels (quant.h) unpack nibbles per output row, so
 * that a verify of 8 tokens cost ~1.9x one token and a prefill ran at a third
 * of Q8_0's (0.6B shape, Xeon, 2026-12-06, bench/forward-notes.md "Stop 46");
 * as bytes (34 a block) the records would have slowed their decode. Q4_K,
 * Q5_K and Q6_K take it as well, in records of their own (TD_Q8R_Q4_K,
 * TD_Q8R_Q5_K, TD_Q8R_Q6_K below): 32 values of a super-block are a block,
 * whose f32 step is two FMAs (Q4_K, Q5_K: its exact scale and minimum per
 * row; Q6_K: its two halves' exact scales); the kq512 order (kq512.h) they had in these modes
 * kept a verify of 8 tokens at 2.4-2.6x one token on the 0.6B shape's Q4_K_M
 * file and its prefill below llama.cpp's (bench/forward-notes.md, "Stop 47").
 * IQ4_XS too (TD_Q8R_IQ4_XS: IQ4_NL's values, an int8 scale a block and a d a
 * super-block; "Stop 48").
 *
 * Why a second Q8_0 order: the Q16 order (quant.h) keeps 8 partial sums per
 * block and output, which suits a vector of one output's 32 bytes, but makes
 * every extra token cost nearly as much as the first (T = 8 verify ~1.9x T = 1
 * on the Qwen3-0.6B shape, prefill below llama.cpp's). R16 sums a whole block
 * in exact integers first, so 16 outputs can share one vector, one lane each.
 * The bf16 and amx modes already trade f32 activations for speed, so R16 serves
 * there; the f32 mode keeps Q16 (no repack: the file's bytes only).
 *
 * The order of y[m][n] = sum_k x[m][k] W[n][k] (K/32 blocks b; w the block's
 * int8 values, dw its f16 scale as f32; x quantized per block exactly as
 * td_quant_act_row does, q the int8 values, d the f32 scale):
 *   P_b = sum_{i<32} w[i] q[32b+i]        (exact int32, |P_b| < 2^20)
 *   c_b = dw_b * d_b                       (f32 multiply)
 *   a_0 = +0;  a_{b+1} = fma(c_b, (float)P_b, a_b)   (b ascending)
 *   y = a_{K/32}, or y + a_{K/32} when add.
 * The integer sum is exact in any grouping, so the kernels may compute it in
 * any order; the f32 steps are one chain per output, the same on every path,
 * for every M, output range and thread count (batch invariance).
 *
 * Repacked layout (td_q8r_repack): output group g (rows 16g .. 16g+15; a last
 * group of fewer rows is padded with zero weights) takes td_q8r_group_bytes(K,
 * fmt) bytes at g times that: its blocks in pairs (2p, 2p + 1) of td_q8r_pair(fmt)
 * bytes each, [16 f16 scales dw[n] of block 2p][those of 2p + 1]
 * [block 2p's values][block 2p + 1's values] (an odd last block's partner is
 * zero bytes, never read). A block's values (byte records) are 8 x 64 bytes
 * where byte (j, n, i) = w[n][4j + i] + 128 (unsigned), so one aligned 64-byte
 * vector holds 4 consecutive values of each of the 16 rows — the unsigned
 * operand of VPDPBUSD. The +128 is taken back exactly through the activation
 * record's -128 * (sum of the block's q). Nibble records: 4 x 64 bytes, line i
 * holding byte lines i and i + 4 as nibbles (TD_Q8R_NIB_*, below). The copy of
 * a Q8_0, Q4_0, IQ4_NL or Q5_0 file has the file's bytes, padding aside.
 * Kernels (td_q8r_matmul picks by td_kernels_path(), the same bits on each):
 * AVX-512 VNNI, register tiles of up to 4 tokens x 3 groups (1 x 8 for a single
 * token), and with AMX-INT8, chunks of 16 tokens of a product of 16 or more on
 * the tiles (TDPBSUD per block, the record read as the B tile; nibble records
 * spread into a byte copy per group first); AVX2
 * (quant_avx2.c: the signed bytes by vpmaddubsw and vpmaddwd, 2 tokens x 1
 * group), also for AVX-512 CPUs without VNNI; portable C elsewhere. */
#ifndef TD_Q8R_H
#define TD_Q8R_H

#include <stddef.h>
#include <stdint.h>

/* Record formats (td_q8r_format): a block's values as 8 lines of bytes (Q8_0),
 * or, for the formats of 4-bit indices, as 4 lines of the file's own
 * nibble bytes (Q4_0, IQ4_NL: same bytes as the file). Nibble line i holds, at
 * byte 4n + c, byte c of dword i of row n's 16 qs bytes: its low nibble stands
 * for byte line i's byte, its high nibble for byte line i + 4's (values 4i + c
 * and 16 + 4i + c), each through the format's table (td_q8r_table: value + 128
 * of every index). Q5_0: the same 4 nibble lines (its values' low 4 bits), then
 * a fifth line of each row's 32-bit qh at byte 4n (bit k: bit 4 of value k,
 * worth 16 more), 22 bytes a block like the file. */
enum {
    TD_Q8R_BYTES = 0, TD_Q8R_NIB_Q4_0 = 1, TD_Q8R_NIB_IQ4_NL = 2, TD_Q8R_Q5_0 = 3, TD_Q8R_Q4_K = 4, TD_Q8R_Q6_K = 5,
    TD_Q8R_Q5_K = 6, TD_Q8R_IQ4_XS = 7
};
/* 1 for the formats whose blocks carry a minimum (Q4_K, Q5_K: two f32 steps, scale and minimum) */
static inline int td_q8r_kmin(int fmt) { return fmt == TD_Q8R_Q4_K || fmt == TD_Q8R_Q5_K; }
/* Q4_K (TD_Q8R_Q4_K): a sub-block of 32 is a block whose values are the
 * nibbles q (0..15, table q + 128), in the nibble records' lines (the repack
 * regroups the file's nibbles: a super-block's byte i holds value i of two
 * sub-blocks); its weight is d * sc * q - dmin * m, so a block's f32 step is
 * two (below). A block's 32 bytes of "scales" are [16 sc][16 m] (u8, 0..63,
 * the file's 6-bit codes unpacked), and each super-block of 8 blocks opens with
 * a line of its 16 rows' [16 f16 d][16 f16 dmin] (td_q8r_ksb bytes a super-block
 * of a group: 144 a row, as the file's, plus 4). For a Q4_K block:
 *   P_b = sum_i q[i] x_q[i],  S_b = sum_i x_q[i]     (exact int32)
 *   cs = d * sc,  cm = dmin * m                      (exact in f32)
 *   a = fma(cs * d_b, (float)P_b, a);  a = fma(cm * d_b, (float)(-S_b), a)
 * Q6_K (TD_Q8R_Q6_K): a block of 32 is two of its sub-blocks of 16 (int8
 * scales sc_lo, sc_hi), its values q6 - 32 (q6 0..63): the nibble lines of the
 * low 4 bits (table q + 96), then a line of each row's bit 4 of its 32 values
 * and one of bit 5 (as Q5_0's qh line), 24 bytes a row and block. Its 32 bytes
 * of "scales" are [16 sc_lo][16 sc_hi] (int8), and each super-block opens
 * with a line of its rows' [16 f16 d] (then 32 zero bytes): 212 bytes a row and
 * super-block (the file's 210, plus 2). Its halves' sums are apart:
 *   P_lo = sum_{i<16} w[i] x_q[i],  P_hi = sum_{16<=i<32} w[i] x_q[i]   (exact)
 *   a = fma(d * sc_lo * d_b, (float)P_lo, a);  a = fma(d * sc_hi * d_b, (float)P_hi, a)
 * (d * sc exact in f32).
 * Q5_K (TD_Q8R_Q5_K): Q4_K's records and steps, its values 0..31 (the fifth
 * bit, from the file's qh, in a line after the nibble lines as Q5_0's): 180
 * bytes a row and super-block (the file's 176, plus 4).
 * IQ4_XS (TD_Q8R_IQ4_XS): a sub-block of 32 is a block whose values are
 * IQ4_NL's (the file's nibbles through IQ4_NL's table, in nibble lines as
 * IQ4_NL's records), its 32 bytes of "scales" [16 sc][16 zero] (int8: the
 * file's 6-bit code ls - 32), and each super-block opens with a line of its
 * rows' [16 f16 d] (then 32 zero bytes), as Q6_K's: 148 bytes a row and
 * super-block (the file's 136, plus 12). A block's step, with P_b the sum of
 * value * x_q (exact): a = fma(d * sc * d_b, (float)P_b, a) (d * sc exact). */
/* The record format of dtype's R16 repack, or -1 where R16 does not hold it. */
int td_q8r_format(int dtype);
/* 1 for the dtypes whose blocks the R16 records hold exactly: Q8_0, the 4-
 * and 5-bit formats of one f16 scale a block of 32 and no minimum (Q4_0,
 * IQ4_NL, Q5_0), Q4_K, Q5_K, Q6_K and IQ4_XS. */
static inline int td_q8r_dtype_ok(int dtype) { return td_q8r_format(dtype) >= 0; }
/* The 16 bytes (value + 128 of each index) of a nibble format; NULL for bytes. */
const uint8_t *td_q8r_table(int fmt);
/* Value bytes of one block of a group (fmt's), and of two blocks with their scales. */
static inline size_t td_q8r_vbytes(int fmt) {
    return fmt == TD_Q8R_Q6_K ? 384 : fmt == TD_Q8R_Q5_0 || fmt == TD_Q8R_Q5_K ? 320 : fmt ? 256 : 512;
}
static inline size_t td_q8r_pair(int fmt) { return 64 + 2 * td_q8r_vbytes(fmt); }
/* 1 for the formats of super-blocks of 256 (a line of their rows' d before each 8 blocks) */
static inline int td_q8r_super(int fmt) {
    return fmt == TD_Q8R_Q4_K || fmt == TD_Q8R_Q6_K || fmt == TD_Q8R_Q5_K || fmt == TD_Q8R_IQ4_XS;
}
/* a super-block's bytes in a group: its line of d (and dmin), then 4 pairs */
static inline size_t td_q8r_ksb(int fmt) { return 64 + 4 * td_q8r_pair(fmt); }
/* Offset, within a group, of block b's pair. */
static inline size_t td_q8r_rec_pair(int fmt, int64_t b) {
    return td_q8r_super(fmt) ? (size_t)(b >> 3) * td_q8r_ksb(fmt) + 64 + (size_t)((b & 7) >> 1) * td_q8r_pair(fmt)
                             : (size_t)(b >> 1) * td_q8r_pair(fmt);
}
/* Offsets, within a group, of block b's 16 f16 scales (Q4_K: its sc and m
 * bytes; Q6_K: its two halves' sc) and of its value lines; for the formats of
 * super-blocks, of its super-block's line of d (Q4_K: then dmin). */
static inline size_t td_q8r_rec_scales(int fmt, int64_t b) { return td_q8r_rec_pair(fmt, b) + (size_t)(b & 1) * 32; }
static inline size_t td_q8r_rec_values(int fmt, int64_t b) {
    return td_q8r_rec_pair(fmt, b) + 64 + (size_t)(b & 1) * td_q8r_vbytes(fmt);
}
static inline size_t td_q8r_rec_head(int fmt, int64_t b) { return (size_t)(b >> 3) * td_q8r_ksb(fmt); }

/* Bytes of one 16-row group of an [N][K] repack, and of the whole repack
 * (K a multiple of 32; of 256 for the k-quants), in format fmt: both multiples of 64. */
size_t td_q8r_group_bytes(int64_t K, int fmt);
size_t td_q8r_bytes(int64_t N, int64_t K, int fmt);
/* Repack rows [r0, r1) of W ([N][K] GGUF blocks of dtype, td_q8r_dtype_ok)
 * into dst (td_q8r_bytes in td_q8r_format(dtype), 64-byte aligned); r0 a
 * multiple of 16; a range ending at N pads the group. */
void td_q8r_repack(void *dst, const void *W, int dtype, int64_t N, int64_t K, int64_t r0, int64_t r1);
/* Bytes of one quantized activation row of width K: K int8 q, then K/32 f32 d,
 * then K/32 int32 -128 * (sum of the block's q), then K/32 int32 -128 * (sum
 * of its first 16 q: Q6_K's halves); rounded up to 64. */
static inline size_t td_q8r_row_bytes(int K) { return ((size_t)K + (size_t)K / 32 * 12 + 63) / 64 * 64; }
/* Quantize rows x[m * ldx .. + K), m in [0, M), into xq (M * td_q8r_row_bytes(K)). */
void td_q8r_act(void *xq, const float *x, int ldx, int M, int K);
/* The same for input columns [k0, k1) only (multiples of 32): those blocks'
 * bytes of every row, as td_q8r_act writes them. */
void td_q8r_act_cols(void *xq, const float *x, int ldx, int M, int K, int k0, int k1);
/* y[m * ldy + n] (+)= the R16 product of activation row m (xq) with row n of
 * the repack Wr (record format fmt), for n in [n0, n1), m in [0, M); n0 a
 * multiple of 16.
 * pf_end: 0 where Wr is expected in cache; where it streams from memory, the
 * repack's row count (rows below it may be prefetched, past n1; a one-token
 * product of Q8_0, Q4_0 or IQ4_NL records leaves that to the hardware where
 * td_kernels_hw_stream says so). A prefetch choice only: it never changes a bit. */
void td_q8r_matmul(float *y, int ldy, const void *xq, int M, const void *Wr, int K, int n0, int n1, int add, int pf_end,
                   int fmt);
/* The same with hw, td_kernels_hw_stream's choice given for this product: 0
 * or 1, or -1 for td_kernels_hw_stream's (nn/hwsel.h). The same bits. */
void td_q8r_matmul_hw(float *y, int ldy, const void *xq, int M, const void *Wr, int K, int n0, int n1, int add,
                      int pf_end, int fmt, int hw);

#endif
