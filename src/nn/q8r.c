/* q8r — the R16 order of Q8_0 products over repacked weights (q8r.h).
 *
 * td_q8r_matmul runs the VNNI tiles below on the AVX-512 path where the CPU has
 * VNNI, quant_avx2.c's kernel on the AVX2 path (and AVX-512 without VNNI), and
 * matmul_p, the order written out in C, elsewhere.
 *
 * A register tile is T tokens x G groups of 16 outputs: per block it starts T x G
 * integer accumulators at -128 * (sum of the token's q), runs 8 VPDPBUSD steps
 * (one 64-byte vector of the group's values against 4 bytes of the token's q,
 * broadcast), and folds each accumulator into its f32 chain with one FMA (the
 * block's 16 f16 scales widened exactly by VCVTPH2PS). Records go in pairs of
 * blocks, [32 + 32 bytes of scales][512 + 512 of values], so every value vector
 * is a whole aligned line and the copy has the Q8_0 file's bytes (34 a block
 * of 32 weights), not more. Nibble records (Q4_0, IQ4_NL) hold 4 lines a block,
 * each spread into two value vectors by a shift, a mask and a VPSHUFB through
 * the format's table (vline), so they stream the file's 18 bytes a block;
 * Q5_0's add a line of fifth bits (22 bytes a block), which a shift, a VPSHUFB
 * and a VPTESTMB turn into a masked add of 16. Q4_K's records are nibble
 * records (its q through the table q + 128) whose block steps take two FMAs,
 * the scale's and the minimum's (k4_coefs: d * sc and dmin * m, exact), and
 * Q5_K's are Q4_K's plus Q5_0's line of fifth bits;
 * Q6_K's are nibble records of its low 4 bits plus a line of bit 4 and one of
 * bit 5 (two masked adds, as Q5_0's one), its halves of 16 summed apart and
 * stepped apart (kd_coef; on the tiles, two products of K = 16); IQ4_XS's are
 * IQ4_NL's nibble records stepped once a block with d * sc (kd_coef). The
 * weights of a group are read once per token tile, from cache after the first;
 * during the last token tile over a chunk of groups, the next chunk's records
 * are prefetched toward L2, so that DRAM keeps streaming while the tile
 * computes from cache (0.6B shape, Q8_0, T = 8: 31.2-31.4 against 32.1-33.5 ms
 * a forward). A decode's single token runs 8 groups side by side, unprefetched,
 * where the weights come from cache; where they stream from memory (pf_end > 0:
 * the model outgrows the last-level cache) it takes the verify path instead,
 * one tile of 1 token x 3 groups while the next 3 groups are prefetched toward
 * L2, past the end of the range up to pf_end (Xeon, 2026-12-06: the 0.6B shape's
 * product alone 0.86-0.89 of the time, its Q8_0 decode 0.91-0.94; but the tiny
 * target's decode from L3 1.06: hence the choice; bench/forward-notes.md,
 * "Stop 45"); on AMD's cores a streamed Q8_0, Q4_0 or IQ4_NL token keeps the 8
 * unprefetched groups, which their hardware prefetchers stream faster
 * (stream1_near, td_kernels_hw_stream; "Stop 50"). Tiles are 4 tokens x 3 groups (their 24 accumulators fit the
 * registers), except for a verify's M <= 16 tokens: one tile of M tokens, or two
 * of about M / 2 (up to 8 x 3, the f32 chains then partly in L1), so each chunk
 * is read in one or two passes that compute while the next chunk streams in,
 * instead of up to four (Zen 5, 0.6B shape, Q8_0, context 512, forwards
 * alternating in one process, ms: T = 5 25.1 -> 19.0, 7 27.6 -> 22.0, 8 28.9 ->
 * 24.4, 10 32.8 -> 26.4, 14 39.9 -> 34.3, 16 43.8 -> 41.0; the same tiles for
 * T = 24 or 32 lost 4-5% and T = 128, compute-bound, 19%: bench/forward-notes.md,
 * "Stop 38"). Tokens are taken in slabs of 128 so a slab's activations stay in
 * L2 while the thread's output range streams past. The tile shape never changes a bit
 * (the integer sums are exact; the f32 chain is per output). Where the CPU has
 * AMX-INT8, products of 16 tokens or more run their whole 16-token chunks on
 * the tiles instead (matmul_amx: a record is already a B tile), the same sums
 * and the same f32 steps; TD_Q8R_AMX=0 keeps them on VNNI (for A/B runs). */
#include "nn/q8r.h"
#include "nn/kernels.h"
#include "nn/kquant.h"
#include "nn/quant.h"
#include "nn/quant_avx2.h"
#include "util/util.h"

#include <math.h>
#include <stdatomic.h>
#ifdef __BMI2__
#include <immintrin.h>
#endif
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

size_t td_q8r_group_bytes(int64_t K, int fmt) {
    return td_q8r_super(fmt) ? (size_t)(K / 256) * td_q8r_ksb(fmt) : (size_t)((K / 32 + 1) / 2) * td_q8r_pair(fmt);
}
size_t td_q8r_bytes(int64_t N, int64_t K, int fmt) { return (size_t)((N + 15) / 16) * td_q8r_group_bytes(K, fmt); }

int td_q8r_format(int dtype) {
    switch (dtype) {
    case TD_DTYPE_Q8_0: return TD_Q8R_BYTES;
    case TD_DTYPE_Q4_0: return TD_Q8R_NIB_Q4_0;
    case TD_DTYPE_IQ4_NL: return TD_Q8R_NIB_IQ4_NL;
    case TD_DTYPE_Q5_0: return TD_Q8R_Q5_0;
    case TD_DTYPE_Q4_K: return TD_Q8R_Q4_K;
    case TD_DTYPE_Q5_K: return TD_Q8R_Q5_K;
    case TD_DTYPE_Q6_K: return TD_Q8R_Q6_K;
    case TD_DTYPE_IQ4_XS: return TD_Q8R_IQ4_XS;
    default: return -1;
    }
}

/* value + 128 of each index: Q4_0's nibble - 8, IQ4_NL's table (td_iq4_values),
 * Q5_0's low 4 bits - 16 (its fifth bit adds 16), Q4_K's q, Q6_K's low 4 bits - 32
 * (its bits 4 and 5 add 16 and 32) */
static const uint8_t TAB[5][16] __attribute__((aligned(16))) = {
    {120, 121, 122, 123, 124, 125, 126, 127, 128, 129, 130, 131, 132, 133, 134, 135},
    {1, 24, 45, 63, 79, 93, 106, 118, 129, 141, 153, 166, 181, 197, 217, 241},
    {112, 113, 114, 115, 116, 117, 118, 119, 120, 121, 122, 123, 124, 125, 126, 127},
    {128, 129, 130, 131, 132, 133, 134, 135, 136, 137, 138, 139, 140, 141, 142, 143},
    {96, 97, 98, 99, 100, 101, 102, 103, 104, 105, 106, 107, 108, 109, 110, 111}};
const uint8_t *td_q8r_table(int fmt) {
    return fmt == TD_Q8R_Q5_K     ? TAB[TD_Q8R_Q4_K - 1]
           : fmt == TD_Q8R_IQ4_XS ? TAB[TD_Q8R_NIB_IQ4_NL - 1]
           : fmt >= TD_Q8R_NIB_Q4_0 && fmt <= TD_Q8R_Q6_K ? TAB[fmt - 1]
                                                          : NULL;
}

#define rec_scales td_q8r_rec_scales
#define rec_values td_q8r_rec_values

/* one record: rows row0 .. row0 + 15 (those < N; the rest zero weights, or for a
 * nibble format any: their outputs are never stored) of block b, its scales at sc and
 * its values at v; src: [N] rows of rowb bytes of dtype's blocks (each opens with its
 * f16 scale, then Q8_0's 32 int8 values or a nibble format's 16 qs bytes) */
static void repack_rec(uint8_t *sc, uint8_t *v, const uint8_t *src, int dtype, size_t rowb, int64_t N, int64_t row0,
                       int64_t b) {
    size_t bs = td_dtype_row_bytes(dtype, 32);
    int fmt = td_q8r_format(dtype), nib = fmt != TD_Q8R_BYTES, q5 = fmt == TD_Q8R_Q5_0, qs = q5 ? 6 : 2;
    for (int n = 0; n < 16; n++) {
        int64_t row = row0 + n;
        if (row >= N) {
            memset(sc + 2 * n, 0, 2);
            for (int j = 0; j < (nib ? 4 : 8); j++) memset(v + 64 * j + 4 * n, nib ? 0x88 : 128, 4);
            if (q5) memset(v + 256 + 4 * n, 0, 4);
            continue;
        }
        const uint8_t *blk = src + (size_t)row * rowb + (size_t)b * bs;
        memcpy(sc + 2 * n, blk, 2); /* the f16 scale, as the file has it */
        if (nib) { /* dword j of the qs bytes (values 4j.. low, 16 + 4j.. high); Q5_0's qh */
            for (int j = 0; j < 4; j++) memcpy(v + 64 * j + 4 * n, blk + qs + 4 * j, 4);
            if (q5) memcpy(v + 256 + 4 * n, blk + 2, 4);
            continue;
        }
        for (int j = 0; j < 8; j++)
            for (int i = 0; i < 4; i++) v[64 * j + 4 * n + i] = blk[2 + 4 * j + i] ^ 0x80; /* int8 value + 128 */
    }
}

#if defined(__x86_64__) && (defined(__clang__) || __GNUC__ >= 9)
#include <immintrin.h>
/* a full record (16 rows in range) by dword gathers: dword j of row n is 4 bytes
 * at blk(n) + 2 + 4j, blk(n) = the row's block b, rowb bytes apart; Q8_0: 8
 * dwords, flipped to value + 128; a nibble format: its 4 qs dwords as they are
 * (Q5_0: at + 6 + 4j, then its qh dword at + 2) */
__attribute__((target("avx512f,avx512bw"))) static void repack_rec16(uint8_t *sc, uint8_t *v, const uint8_t *blk0,
                                                                      size_t rowb, int nib, int q5) {
    const __m512i rows = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                            _mm512_set1_epi32((int)rowb));
    const __m512i flip = _mm512_set1_epi32(nib ? 0 : (int)0x80808080u);
    __m512i h = _mm512_i32gather_epi32(rows, (const void *)blk0, 1);
    _mm256_store_si256((void *)sc, _mm512_cvtepi32_epi16(h)); /* the low 16 bits: the f16 scales */
    for (int j = 0; j < (nib ? 4 : 8); j++)
        _mm512_store_si512((void *)(v + 64 * j),
                           _mm512_xor_si512(_mm512_i32gather_epi32(rows, (const void *)(blk0 + (q5 ? 6 : 2) + 4 * j), 1), flip));
    if (q5) _mm512_store_si512((void *)(v + 256), _mm512_i32gather_epi32(rows, (const void *)(blk0 + 2), 1));
}
static int repack_fast(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw");
}
#else
static void repack_rec16(uint8_t *sc, uint8_t *v, const uint8_t *blk0, size_t rowb, int nib, int q5) {
    (void)sc; (void)v; (void)blk0; (void)rowb; (void)nib; (void)q5;
}
static int repack_fast(void) { return 0; }
#endif

/* Row n's 16 bytes of a block's nibble lines (at v = the lines + 4n; line i
 * holds bytes 4i .. 4i + 3): byte k = value k (low nibble) and value k + 16
 * (high), where value k is bits sh .. sh + 3 of a[k] and value k + 16 those
 * of b[k] (k < 16); all zero when a is NULL. Eight bytes at a time. */
static void nib_lines(uint8_t *v, const uint8_t *a, const uint8_t *b, int sh) {
    for (int h = 0; h < 2; h++) {
        uint64_t lo = 0, hi = 0;
        if (a) memcpy(&lo, a + 8 * h, 8), memcpy(&hi, b + 8 * h, 8);
        uint64_t o = (lo >> sh & 0x0f0f0f0f0f0f0f0full) | (hi >> sh & 0x0f0f0f0f0f0f0f0full) << 4;
        memcpy(v + 64 * (2 * h), &o, 4);
        memcpy(v + 64 * (2 * h + 1), (const uint8_t *)&o + 4, 4);
    }
}

/* Bit `bit` of each of the 32 bytes at q, as a word (bit l from byte l). */
static uint32_t bits_of(const uint8_t *q, int bit) {
    uint32_t w = 0;
    for (int c = 0; c < 4; c++) {
        uint64_t x;
        memcpy(&x, q + 8 * c, 8);
        x = x >> bit & 0x0101010101010101ull;
#ifdef __BMI2__
        w |= (uint32_t)_pext_u64(x, 0x0101010101010101ull) << 8 * c;
#else
        w |= (uint32_t)((x * 0x0102040810204080ull) >> 56) << 8 * c; /* byte i's bit 0 lands on bit 56 + i */
#endif
    }
    return w;
}

/* Q4_K (fmt; Q5_K alike): super-block s of the group at grp (rows row0 ..
 * row0 + 15; those past N zero) from the file's 144-byte blocks (d, dmin, 12
 * bytes of packed sc / m, 128 qs bytes: byte k of chunk c holds value k of
 * sub-block 2c (low nibble) and of 2c + 1 (high)): the d / dmin line, each
 * block's sc and m bytes, and its values regrouped into the nibble lines (low
 * nibble value 4i + c, high 16 + 4i + c). Q5_K's 176-byte blocks hold 32 qh
 * bytes before the qs (bit j of qh[k]: the fifth bit of value k of sub-block
 * j), which go to each block's line of fifth bits (row n's word at 4n). */
static void repack_k4(uint8_t *grp, const uint8_t *src, size_t rowb, int64_t N, int64_t row0, int64_t s, int fmt) {
    int five = fmt == TD_Q8R_Q5_K, bs = five ? 176 : 144, qo = five ? 48 : 16;
    uint8_t *hd = grp + td_q8r_rec_head(fmt, 8 * s);
    for (int n = 0; n < 16; n++) {
        const uint8_t *blk = row0 + n < N ? src + (size_t)(row0 + n) * rowb + (size_t)s * bs : NULL;
        uint8_t sc[8] = {0}, m[8] = {0};
        memset(hd + 2 * n, 0, 2);
        memset(hd + 32 + 2 * n, 0, 2);
        if (blk) {
            memcpy(hd + 2 * n, blk, 2);      /* d */
            memcpy(hd + 32 + 2 * n, blk + 2, 2); /* dmin */
            td_kq_unpack_scales(blk + 4, sc, m);
        }
        for (int j = 0; j < 8; j++) {
            uint8_t *scp = grp + rec_scales(fmt, 8 * s + j), *v = grp + rec_values(fmt, 8 * s + j);
            scp[n] = sc[j];
            scp[16 + n] = m[j];
            const uint8_t *qs = blk ? blk + qo + 32 * (j >> 1) : NULL;
            nib_lines(v + 4 * n, qs, qs ? qs + 16 : NULL, 4 * (j & 1));
            if (five) {
                uint32_t h = blk ? bits_of(blk + 16, j) : 0;
                memcpy(v + 256 + 4 * n, &h, 4);
            }
        }
    }
}

/* Row n of a 16-row group's super-block s in a format of one f16 d a row and
 * super-block (Q6_K, IQ4_XS): the file's block of bs bytes (NULL past N, the
 * row then zero), its d (at byte doff) written into the super-block's d line hd. */
static const uint8_t *ksb_row(uint8_t *hd, const uint8_t *src, size_t rowb, int64_t N, int64_t row0, int n, int64_t s,
                              int bs, int doff) {
    const uint8_t *blk = row0 + n < N ? src + (size_t)(row0 + n) * rowb + (size_t)s * (size_t)bs : NULL;
    memset(hd + 2 * n, 0, 2);
    if (blk) memcpy(hd + 2 * n, blk + doff, 2);
    return blk;
}

/* Q6_K: super-block s of the group at grp from the file's 210-byte blocks (ql
 * [128], qh [64], 16 int8 scales, f16 d): value l of block j (half h = j / 4,
 * quarter k = j % 4) has its low 4 bits in ql[64h + 32(k & 1) + l] (high
 * nibble for k >= 2) and bits 4-5 in qh[32h + l] >> 2k; its halves' scales are
 * scales[2j], scales[2j + 1]. Written: the d line, each block's two scale rows
 * and its nibble lines, then its lines of bit 4 and bit 5 (row n's word at 4n). */
static void repack_k6(uint8_t *grp, const uint8_t *src, size_t rowb, int64_t N, int64_t row0, int64_t s) {
    uint8_t *hd = grp + td_q8r_rec_head(TD_Q8R_Q6_K, 8 * s);
    memset(hd + 32, 0, 32);
    for (int n = 0; n < 16; n++) {
        const uint8_t *blk = ksb_row(hd, src, rowb, N, row0, n, s, 210, 208);
        for (int j = 0; j < 8; j++) {
            uint8_t *scp = grp + rec_scales(TD_Q8R_Q6_K, 8 * s + j), *v = grp + rec_values(TD_Q8R_Q6_K, 8 * s + j);
            int h = j >> 2, k = j & 3;
            const uint8_t *ql = blk ? blk + 64 * h + 32 * (k & 1) : NULL, *qh = blk ? blk + 128 + 32 * h : NULL;
            scp[n] = blk ? blk[192 + 2 * j] : 0;
            scp[16 + n] = blk ? blk[192 + 2 * j + 1] : 0;
            uint32_t b4 = qh ? bits_of(qh, 2 * k) : 0, b5 = qh ? bits_of(qh, 2 * k + 1) : 0;
            nib_lines(v + 4 * n, ql, ql ? ql + 16 : NULL, 4 * (k >> 1));
            memcpy(v + 256 + 4 * n, &b4, 4);
            memcpy(v + 320 + 4 * n, &b5, 4);
        }
    }
}

/* IQ4_XS: super-block s of the group at grp from the file's 136-byte blocks (f16
 * d, scales_h, 4 bytes scales_l, 128 qs bytes: sub-block j's 16 at 8 + 16j, byte
 * k its value k (low nibble) and k + 16 (high), as an IQ4_NL block's): the d line,
 * each block's sc (ls - 32, ls = scales_l's nibble j | scales_h's bits 2j, 2j + 1
 * << 4) and its nibble lines as IQ4_NL's (line i: the qs dword i). */
static void repack_xs(uint8_t *grp, const uint8_t *src, size_t rowb, int64_t N, int64_t row0, int64_t s) {
    uint8_t *hd = grp + td_q8r_rec_head(TD_Q8R_IQ4_XS, 8 * s);
    memset(hd + 32, 0, 32);
    for (int n = 0; n < 16; n++) {
        const uint8_t *blk = ksb_row(hd, src, rowb, N, row0, n, s, 136, 0);
        uint16_t sh = 0;
        if (blk) memcpy(&sh, blk + 2, 2); /* scales_h */
        for (int j = 0; j < 8; j++) {
            uint8_t *scp = grp + rec_scales(TD_Q8R_IQ4_XS, 8 * s + j), *v = grp + rec_values(TD_Q8R_IQ4_XS, 8 * s + j);
            int ls = blk ? (blk[4 + j / 2] >> 4 * (j & 1) & 15) | (sh >> 2 * j & 3) << 4 : 32;
            scp[n] = (uint8_t)(int8_t)(ls - 32);
            scp[16 + n] = 0;
            for (int i = 0; i < 4; i++) {
                if (blk) memcpy(v + 64 * i + 4 * n, blk + 8 + 16 * j + 4 * i, 4);
                else memset(v + 64 * i + 4 * n, 0, 4);
            }
        }
    }
}

void td_q8r_repack(void *dst, const void *W, int dtype, int64_t N, int64_t K, int64_t r0, int64_t r1) {
    int fmt = td_q8r_format(dtype);
    TD_ASSERT(fmt >= 0 && K % 32 == 0 && r0 % 16 == 0 && (!td_q8r_super(fmt) || K % 256 == 0));
    int64_t nb = K / 32;
    const uint8_t *src = W;
    size_t rowb = td_dtype_row_bytes(dtype, K), bs = td_dtype_row_bytes(dtype, 32);
    if (td_q8r_super(fmt)) {
        for (int64_t g = r0 / 16; g * 16 < r1; g++)
            for (int64_t sb = 0; sb < K / 256; sb++)
                if (fmt == TD_Q8R_Q6_K) repack_k6((uint8_t *)dst + (size_t)g * td_q8r_group_bytes(K, fmt), src, rowb, N, g * 16, sb);
                else if (fmt == TD_Q8R_IQ4_XS) repack_xs((uint8_t *)dst + (size_t)g * td_q8r_group_bytes(K, fmt), src, rowb, N, g * 16, sb);
                else repack_k4((uint8_t *)dst + (size_t)g * td_q8r_group_bytes(K, fmt), src, rowb, N, g * 16, sb, fmt);
        return;
    }
    /* by gathers (their offsets, 15 rows, must fit an int32) */
    int fast = repack_fast() && rowb * 15 < INT32_MAX;
    size_t gs = td_q8r_group_bytes(K, fmt);
    for (int64_t g = r0 / 16; g * 16 < r1; g++) {
        uint8_t *grp = (uint8_t *)dst + (size_t)g * gs;
        for (int64_t b = 0; b < nb; b++) {
            uint8_t *sc = grp + rec_scales(fmt, b), *v = grp + rec_values(fmt, b);
            if (fast && g * 16 + 16 <= N)
                repack_rec16(sc, v, src + (size_t)g * 16 * rowb + (size_t)b * bs, rowb, fmt != 0, fmt == TD_Q8R_Q5_0);
            else repack_rec(sc, v, src, dtype, rowb, N, g * 16, b);
        }
        if (nb & 1) { /* the last pair's missing block: zero bytes, never read */
            memset(grp + rec_scales(fmt, nb), 0, 32);
            memset(grp + rec_values(fmt, nb), 0, td_q8r_vbytes(fmt));
        }
    }
}

void td_q8r_act(void *xq, const float *x, int ldx, int M, int K) { td_q8r_act_cols(xq, x, ldx, M, K, 0, K); }

void td_q8r_act_cols(void *xq, const float *x, int ldx, int M, int K, int k0, int k1) {
    size_t rb = td_q8r_row_bytes(K);
    int nb = K / 32;
    for (int m = 0; m < M; m++) {
        uint8_t *row = (uint8_t *)xq + (size_t)m * rb;
        int8_t *q = (int8_t *)row;
        float *d = (float *)(void *)(row + K);
        int32_t *ns = (int32_t *)(void *)(row + K + 4 * nb), *hs = ns + nb;
        /* blocks of 32 quantize alone (td_quant_act_row) */
        td_quant_act_row(x + (size_t)m * ldx + k0, k1 - k0, q + k0, d + k0 / 32);
        for (int b = k0 / 32; b < k1 / 32; b++) {
            int32_t s = 0, s16 = 0;
            for (int i = 0; i < 16; i++) s16 += q[32 * b + i];
            for (int i = 16; i < 32; i++) s += q[32 * b + i];
            ns[b] = -128 * (s16 + s);
            hs[b] = -128 * s16;
        }
    }
}

#if defined(__x86_64__) && (defined(__clang__) || __GNUC__ >= 9)
#include <immintrin.h>

#define TV __attribute__((target("avx512f,avx512bw,avx512vnni")))

static int vnni_ok(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vnni");
}
#define HAVE_VNNI_TILES 1

/* 1 where a one-token product of Q8_0, Q4_0 or IQ4_NL records over weights
 * streamed from memory (pf_end > 0) runs the cached path all the same: 8 groups
 * side by side, no software prefetch, on CPUs whose hardware prefetchers follow
 * those 8 streams better alone (td_kernels_hw_stream: AMD's). Zen 5,
 * 2026-12-07, bench/q8r_bw.c, 0.6B shape: Q8_0's product alone 0.94 / 0.81 of
 * the read against 0.83 / 0.67, its decode 16.1-16.5 -> 13.4-14.3 ms; Q4_0 and
 * IQ4_NL 5-6% faster; Q5_0 (its fifth-bit line) 35% and Q4_K 5% slower, so they
 * keep the verify path. Intel's cores (Sapphire Rapids) stream faster on the
 * verify path (bench/forward-notes.md, "Stop 45", "Stop 50"). */
static int stream1_near(int fmt, int hw) { return fmt <= TD_Q8R_NIB_IQ4_NL && hw; }
/* 1 where a one-token product of Q5_0, Q4_K or Q6_K records in cache (pf_end
 * <= 0) runs the verify path's tiles of 1 token x 3 groups, with their
 * prefetch of the next groups in its range, instead of 8 groups side by side:
 * on AMD's cores (td_kernels_hw_stream). Zen 5, 2026-12-07, a decode step of
 * the tiny-code target quantized (19-26 MB, in L3), in-process A/B: all Q5_0
 * 0.79 of the time, Q5_0 with Q4_K down projections 0.77, Q8_0 with Q6_K ones
 * 0.91; Q5_K's and IQ4_XS's measured the same either way, so they keep 8 groups
 * (bench/forward-notes.md, "Stop 54"). The tile shape never changes a bit. */
static int cached1_tiles(int fmt, int hw) { return (fmt == TD_Q8R_Q5_0 || fmt == TD_Q8R_Q4_K || fmt == TD_Q8R_Q6_K) && hw; }

/* value line j (0..7) of a block's record at rec: the 64 bytes themselves, or
 * (NIB) from nibble line j % 4, the low nibbles for j < 4, the high ones after,
 * each index through tab (td_q8r_table in every 128-bit lane); NIB ==
 * TD_Q8R_Q5_0: plus 16 where bit 4j + c of the row's qh (line 4) is set */
TV static inline __attribute__((always_inline)) __m512i vline(const uint8_t *rec, int j, int NIB, __m512i tab) {
    if (!NIB) return _mm512_load_si512((const void *)(rec + 64 * j));
    __m512i v = _mm512_load_si512((const void *)(rec + 64 * (j & 3)));
    __m512i u = _mm512_shuffle_epi8(tab, _mm512_and_si512(j < 4 ? v : _mm512_srli_epi16(v, 4), _mm512_set1_epi8(15)));
    if (NIB != TD_Q8R_Q5_0 && NIB != TD_Q8R_Q6_K && NIB != TD_Q8R_Q5_K) return u;
    /* each row's bits 4j .. 4j + 3 into its 4 bytes: byte 0 of the shifted dword copied to all four, tested
       against 1, 2, 4, 8 */
    const __m512i rep = _mm512_set_epi64(0x0c0c0c0c08080808LL, 0x0404040400000000LL, 0x0c0c0c0c08080808LL,
                                         0x0404040400000000LL, 0x0c0c0c0c08080808LL, 0x0404040400000000LL,
                                         0x0c0c0c0c08080808LL, 0x0404040400000000LL);
    __m512i h = _mm512_shuffle_epi8(_mm512_srli_epi32(_mm512_load_si512((const void *)(rec + 256)), 4 * j), rep);
    u = _mm512_mask_add_epi8(u, _mm512_test_epi8_mask(h, _mm512_set1_epi32(0x08040201)), u, _mm512_set1_epi8(16));
    if (NIB != TD_Q8R_Q6_K) return u;
    /* Q6_K: bit 5 from the next line, worth 32 */
    h = _mm512_shuffle_epi8(_mm512_srli_epi32(_mm512_load_si512((const void *)(rec + 320)), 4 * j), rep);
    return _mm512_mask_add_epi8(u, _mm512_test_epi8_mask(h, _mm512_set1_epi32(0x08040201)), u, _mm512_set1_epi8(32));
}

/* Q4_K, Q5_K (fmt): block b's exact coefficients of the group at grp, cs = d *
 * sc and cm = dmin * m of its 16 rows (q8r.h) */
TV static inline __attribute__((always_inline)) void k4_coefs(const uint8_t *grp, int b, __m512 *cs, __m512 *cm, int fmt) {
    const uint8_t *h = grp + td_q8r_rec_head(fmt, b), *sm = grp + rec_scales(fmt, b);
    __m512 sc = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_load_si128((const __m128i *)(const void *)sm)));
    __m512 mn = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_load_si128((const __m128i *)(const void *)(sm + 16))));
    *cs = _mm512_mul_ps(_mm512_cvtph_ps(_mm256_load_si256((const void *)h)), sc);
    *cm = _mm512_mul_ps(_mm512_cvtph_ps(_mm256_load_si256((const void *)(h + 32))), mn);
}

/* Q6_K, IQ4_XS (fmt): block b's exact coefficients d * sc of the group at grp
 * (Q6_K: of its half hi, 0 for the first 16 values, 1 for the last) */
TV static inline __attribute__((always_inline)) __m512 kd_coef(const uint8_t *grp, int b, int hi, int fmt) {
    const uint8_t *sc = grp + rec_scales(fmt, b) + 16 * hi;
    return _mm512_mul_ps(_mm512_cvtph_ps(_mm256_load_si256((const void *)(grp + td_q8r_rec_head(fmt, b)))),
                         _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_load_si128((const __m128i *)(const void *)sc))));
}
/* a block's 16 f32 scale coefficients: the f16 scales widened, or IQ4_XS's d * sc */
#define BLK_COEF(grp, b, fmt)                                                                                  \
    ((fmt) == TD_Q8R_IQ4_XS ? kd_coef((grp), (b), 0, TD_Q8R_IQ4_XS)                                          \
                            : _mm512_cvtph_ps(_mm256_load_si256((const void *)((grp) + rec_scales((fmt), (b))))))
/* Q6_K: f[t][g] += (d sc * d_b) * P for the half just summed in a[t][g] */
#define K6_STEP(hi)                                                                                                \
    do {                                                                                                           \
        __m512 c6[8];                                                                                              \
        _Pragma("GCC unroll 8") for (int g = 0; g < G; g++) c6[g] = kd_coef(wr + g * gs, b, (hi), TD_Q8R_Q6_K);                \
        _Pragma("GCC unroll 8") for (int t = 0; t < T; t++) {                                                     \
            __m512 dx = _mm512_set1_ps(*(const float *)(const void *)(xq + t * rb + K + 4 * b));                  \
            _Pragma("GCC unroll 8") for (int g = 0; g < G; g++) f[t][g] =                                          \
                _mm512_fmadd_ps(_mm512_mul_ps(c6[g], dx), _mm512_cvtepi32_ps(a[t][g]), f[t][g]);                   \
        }                                                                                                          \
    } while (0)

/* T tokens (rows of xq, rb bytes apart) x G groups (records gs bytes apart,
 * from wr; NIB: nibble records, tab their table) over all nb blocks; writes
 * y[t * ldy + 16 g + lane] for lanes below nv[g]. T, G and NIB are constants
 * at every call, so the arrays live in registers. */
TV static inline __attribute__((always_inline)) void tile(float *y, int ldy, const uint8_t *xq, size_t rb, int T,
                                                            const uint8_t *wr, size_t gs, int G, int nb, int K,
                                                            const int *nv, int add, const uint8_t *pf, int pfg, int NIB,
                                                            __m512i tab) {
    __m512 f[8][8];
    __m512i a[8][8];
#pragma GCC unroll 8
    for (int t = 0; t < T; t++)
#pragma GCC unroll 8
        for (int g = 0; g < G; g++) f[t][g] = _mm512_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const uint8_t *rec = wr + rec_values(NIB, b);
        for (int g = 0; g < pfg; g++) { /* the next groups' block b, toward L2, while these compute */
            for (int i = 0; i < (int)td_q8r_vbytes(NIB) / 64; i++)
                _mm_prefetch((const char *)(pf + g * gs + rec_values(NIB, b) + 64 * i), _MM_HINT_T1);
            if (!(b & 1)) _mm_prefetch((const char *)(pf + g * gs + rec_scales(NIB, b)), _MM_HINT_T1);
            if (td_q8r_super(NIB) && !(b & 7)) _mm_prefetch((const char *)(pf + g * gs + td_q8r_rec_head(NIB, b)), _MM_HINT_T1);
        }
#pragma GCC unroll 8
        for (int t = 0; t < T; t++) { /* Q6_K: its first half's -128 * sum q */
            __m512i s = _mm512_set1_epi32(*(const int32_t *)(const void *)(xq + t * rb + K + 4 * nb * (NIB == TD_Q8R_Q6_K ? 2 : 1) + 4 * b));
#pragma GCC unroll 8
            for (int g = 0; g < G; g++) a[t][g] = s;
        }
#pragma GCC unroll 8
        for (int j = 0; j < 8; j++) {
            __m512i w[8];
#pragma GCC unroll 8
            for (int g = 0; g < G; g++) w[g] = vline(rec + g * gs, j, NIB, tab);
#pragma GCC unroll 8
            for (int t = 0; t < T; t++) {
                __m512i xb = _mm512_set1_epi32(*(const int32_t *)(const void *)(xq + t * rb + 32 * b + 4 * j));
#pragma GCC unroll 8
                for (int g = 0; g < G; g++) a[t][g] = _mm512_dpbusd_epi32(a[t][g], w[g], xb);
            }
            if (NIB == TD_Q8R_Q6_K && j == 3) { /* the first half's step; the second half from its -128 * sum q */
                K6_STEP(0);
#pragma GCC unroll 8
                for (int t = 0; t < T; t++) {
                    const int32_t *ns = (const int32_t *)(const void *)(xq + t * rb + K + 4 * nb + 4 * b);
                    __m512i s = _mm512_set1_epi32(ns[0] - ns[nb]);
#pragma GCC unroll 8
                    for (int g = 0; g < G; g++) a[t][g] = s;
                }
            }
        }
        if (NIB == TD_Q8R_Q6_K) {
            K6_STEP(1);
            continue;
        }
        if (td_q8r_kmin(NIB)) { /* two steps: the values' sum, then the minimums' */
            __m512 cs[8], cm[8];
#pragma GCC unroll 8
            for (int g = 0; g < G; g++) k4_coefs(wr + g * gs, b, &cs[g], &cm[g], NIB);
#pragma GCC unroll 8
            for (int t = 0; t < T; t++) {
                __m512 dx = _mm512_set1_ps(*(const float *)(const void *)(xq + t * rb + K + 4 * b));
                __m512 ns = _mm512_cvtepi32_ps(_mm512_srai_epi32(
                    _mm512_set1_epi32(*(const int32_t *)(const void *)(xq + t * rb + K + 4 * nb + 4 * b)), 7)); /* -S */
#pragma GCC unroll 8
                for (int g = 0; g < G; g++) {
                    f[t][g] = _mm512_fmadd_ps(_mm512_mul_ps(cs[g], dx), _mm512_cvtepi32_ps(a[t][g]), f[t][g]);
                    f[t][g] = _mm512_fmadd_ps(_mm512_mul_ps(cm[g], dx), ns, f[t][g]);
                }
            }
            continue;
        }
#pragma GCC unroll 8
        for (int t = 0; t < T; t++) {
            __m512 dx = _mm512_set1_ps(*(const float *)(const void *)(xq + t * rb + K + 4 * b));
#pragma GCC unroll 8
            for (int g = 0; g < G; g++) {
                __m512 c = _mm512_mul_ps(BLK_COEF(wr + g * gs, b, NIB), dx);
                f[t][g] = _mm512_fmadd_ps(c, _mm512_cvtepi32_ps(a[t][g]), f[t][g]);
            }
        }
    }
#pragma GCC unroll 8
    for (int t = 0; t < T; t++)
#pragma GCC unroll 8
        for (int g = 0; g < G; g++) {
            __mmask16 k = nv[g] >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << nv[g]) - 1);
            float *yy = y + (size_t)t * ldy + 16 * g;
            __m512 v = add ? _mm512_add_ps(_mm512_maskz_loadu_ps(k, yy), f[t][g]) : f[t][g];
            _mm512_mask_storeu_ps(yy, k, v);
        }
}

/* A verify's M <= 16 tokens against 3 groups: one tile of M tokens, or two of
 * about M / 2, so each record is read in one or two passes while the next
 * chunk (pf, pfg groups) streams in during the last; T = 1 .. 8 tokens a tile. */
TV static inline __attribute__((always_inline)) void verify_tiles(float *yg, int ldy, const uint8_t *xs, size_t rb, int M,
                                                                    const uint8_t *wg, size_t gs, int nb, int K,
                                                                    const int *nv, int add, const uint8_t *pf, int pfg,
                                                                    int NIB, __m512i tab) {
    int nt = (M + 7) / 8;
    for (int i = 0; i < nt; i++) {
        int m0 = M * i / nt, T = M * (i + 1) / nt - m0;
        const uint8_t *p = i + 1 == nt ? pf : NULL;
        int pg = i + 1 == nt ? pfg : 0;
        float *y = yg + (size_t)m0 * ldy;
        const uint8_t *x = xs + (size_t)m0 * rb;
        switch (T) {
        case 1: tile(y, ldy, x, rb, 1, wg, gs, 3, nb, K, nv, add, p, pg, NIB, tab); break;
        case 2: tile(y, ldy, x, rb, 2, wg, gs, 3, nb, K, nv, add, p, pg, NIB, tab); break;
        case 3: tile(y, ldy, x, rb, 3, wg, gs, 3, nb, K, nv, add, p, pg, NIB, tab); break;
        case 4: tile(y, ldy, x, rb, 4, wg, gs, 3, nb, K, nv, add, p, pg, NIB, tab); break;
        case 5: tile(y, ldy, x, rb, 5, wg, gs, 3, nb, K, nv, add, p, pg, NIB, tab); break;
        case 6: tile(y, ldy, x, rb, 6, wg, gs, 3, nb, K, nv, add, p, pg, NIB, tab); break;
        case 7: tile(y, ldy, x, rb, 7, wg, gs, 3, nb, K, nv, add, p, pg, NIB, tab); break;
        default: tile(y, ldy, x, rb, 8, wg, gs, 3, nb, K, nv, add, p, pg, NIB, tab); break;
        }
    }
}
#define VERIFY_TILES(M, G) ((G) == 3 && (M) <= 16)

/* tokens [0, M) of a slab against the G groups at wg: VERIFY_TILES, else 4 at a
 * time (compute-bound prefill slabs keep their f32 chains in registers) */
#define TOK_TILES(G)                                                                                               \
    do {                                                                                                           \
        int m = 0;                                                                                                 \
        if (VERIFY_TILES(M, G)) {                                                                                  \
            verify_tiles(yg, ldy, xs, rb, M, wg, gs, nb, K, nv, add, pf, pfg, NIB, tab);                           \
            m = M;                                                                                                 \
        }                                                                                                          \
        for (; m + 4 <= M; m += 4)                                                                                 \
            tile(yg + (size_t)m * ldy, ldy, xs + m * rb, rb, 4, wg, gs, G, nb, K, nv, add, m + 4 == M ? pf : NULL,   \
                 m + 4 == M ? pfg : 0, NIB, tab);                                                                  \
        switch (M - m) {                                                                                           \
        case 3: tile(yg + (size_t)m * ldy, ldy, xs + m * rb, rb, 3, wg, gs, G, nb, K, nv, add, pf, pfg, NIB, tab); break; \
        case 2: tile(yg + (size_t)m * ldy, ldy, xs + m * rb, rb, 2, wg, gs, G, nb, K, nv, add, pf, pfg, NIB, tab); break; \
        case 1: tile(yg + (size_t)m * ldy, ldy, xs + m * rb, rb, 1, wg, gs, G, nb, K, nv, add, pf, pfg, NIB, tab); break; \
        }                                                                                                          \
    } while (0)

#if defined(__clang__) ? __clang_major__ >= 12 : __GNUC__ >= 11
#include "nn/amx.h"
#include "nn/i8t.h"
#include <stdatomic.h>
#include <stdlib.h>
#define TQ __attribute__((target("amx-tile,amx-int8,avx512f,avx512bw,avx512vnni")))

/* tile sets (C, A, B): 0, 1, 2 and 3, 4, 5 (even and odd blocks; a Q6_K block's halves) */
static void amx_cfg(td_amx_tilecfg *c, int kb) {
    memset(c, 0, sizeof *c);
    c->palette = 1;
    for (int s = 0; s < 6; s += 3) {
        c->rows[s] = 16;          /* C: 16 tokens x 16 int32 sums */
        c->colsb[s] = 64;
        c->rows[s + 1] = 16;      /* A: 16 tokens x kb int8 q (a block's 32, or a Q6_K half's 16) */
        c->colsb[s + 1] = kb;
        c->rows[s + 2] = kb / 4;  /* B: as many quads of the record x 16 outputs */
        c->colsb[s + 2] = 64;
    }
}

/* Load the tile shapes of kb (keeping the thread's in *found), and put them back */
TQ static inline void amx_enter(td_amx_tilecfg *found, td_amx_tilecfg *want, int kb) {
    td_amx_store_cfg(found);
    amx_cfg(want, kb);
    if (memcmp(want, found, sizeof *want) != 0) td_amx_load_cfg(want);
}
/* (amx.c and i8t.c rely on their cached shapes) */
TQ static inline void amx_leave(const td_amx_tilecfg *found, const td_amx_tilecfg *want) {
    if (found->palette != 0 && memcmp(found, want, sizeof *want) != 0) td_amx_load_cfg(found);
}
/* 16 tokens' outputs f (lanes of km) into ys (+= when add) */
TQ static inline __attribute__((always_inline)) void amx_out16(float *ys, int ldy, __mmask16 km, const __m512 *f, int add) {
#pragma GCC unroll 16
    for (int t = 0; t < 16; t++) {
        float *yy = ys + (size_t)t * ldy;
        __m512 v = add ? _mm512_add_ps(_mm512_maskz_loadu_ps(km, yy), f[t]) : f[t];
        _mm512_mask_storeu_ps(yy, km, v);
    }
}
/* A group's nibble records (fmt, a constant) spread into byte records at ub (512 bytes a block) */
TQ static inline __attribute__((always_inline)) void amx_spread(uint8_t *ub, const uint8_t *grp, int nb, int fmt, __m512i tab) {
    for (int b = 0; b < nb; b++)
        for (int j = 0; j < 8; j++)
            _mm512_storeu_si512((void *)(ub + 512 * (size_t)b + 64 * j),
                                fmt == TD_Q8R_Q5_0   ? vline(grp + rec_values(fmt, b), j, TD_Q8R_Q5_0, tab)
                                : fmt == TD_Q8R_Q5_K ? vline(grp + rec_values(fmt, b), j, TD_Q8R_Q5_K, tab)
                                : fmt == TD_Q8R_Q6_K ? vline(grp + rec_values(fmt, b), j, TD_Q8R_Q6_K, tab)
                                                     : vline(grp + rec_values(fmt, b), j, 1, tab));
}

/* 16 tokens' f32 steps for block bb of the group at grp, from its stored sums cb
 * (tile()'s: P = sums - 128 * sum q, c = dw * d, f = fma(c, P, f)) */
#define AMX_STEP(bb, cb)                                                                                             \
    do {                                                                                                             \
        if (fmt == TD_Q8R_Q6_K) { /* the halves' steps: sums cb[0], cb[1] from -128 * their sums of q */             \
            __m512 clo = kd_coef(grp, (bb), 0, TD_Q8R_Q6_K), chi = kd_coef(grp, (bb), 1, TD_Q8R_Q6_K);                                         \
            _Pragma("GCC unroll 16") for (int t = 0; t < 16; t++) {                                                 \
                const uint8_t *xr = xs + (size_t)t * rb;                                                             \
                const int32_t *ns = (const int32_t *)(const void *)(xr + K + 4 * nb + 4 * (bb));                     \
                __m512 dx = _mm512_set1_ps(*(const float *)(const void *)(xr + K + 4 * (bb)));                     \
                __m512i plo = _mm512_add_epi32(_mm512_load_si512((const void *)((cb)[0] + 16 * t)), _mm512_set1_epi32(ns[nb])); \
                __m512i phi = _mm512_add_epi32(_mm512_load_si512((const void *)((cb)[1] + 16 * t)),                \
                                               _mm512_set1_epi32(ns[0] - ns[nb]));                                   \
                f[t] = _mm512_fmadd_ps(_mm512_mul_ps(clo, dx), _mm512_cvtepi32_ps(plo), f[t]);                      \
                f[t] = _mm512_fmadd_ps(_mm512_mul_ps(chi, dx), _mm512_cvtepi32_ps(phi), f[t]);                      \
            }                                                                                                        \
            break;                                                                                                   \
        }                                                                                                            \
        if (td_q8r_kmin(fmt)) {                                                                                      \
            __m512 cs, cm;                                                                                           \
            k4_coefs(grp, (bb), &cs, &cm, fmt);                                                                      \
            _Pragma("GCC unroll 16") for (int t = 0; t < 16; t++) {                                                 \
                const uint8_t *xr = xs + (size_t)t * rb;                                                             \
                __m512i nsv = _mm512_set1_epi32(*(const int32_t *)(const void *)(xr + K + 4 * nb + 4 * (bb)));     \
                __m512i p = _mm512_add_epi32(_mm512_load_si512((const void *)((cb)[0] + 16 * t)), nsv);            \
                __m512 dx = _mm512_set1_ps(*(const float *)(const void *)(xr + K + 4 * (bb)));                     \
                f[t] = _mm512_fmadd_ps(_mm512_mul_ps(cs, dx), _mm512_cvtepi32_ps(p), f[t]);                          \
                f[t] = _mm512_fmadd_ps(_mm512_mul_ps(cm, dx), _mm512_cvtepi32_ps(_mm512_srai_epi32(nsv, 7)), f[t]); \
            }                                                                                                        \
            break;                                                                                                   \
        }                                                                                                            \
        __m512 sc = BLK_COEF(grp, (bb), fmt);                                                                        \
        _Pragma("GCC unroll 16") for (int t = 0; t < 16; t++) {                                                     \
            const uint8_t *xr = xs + (size_t)t * rb;                                                                 \
            __m512i p = _mm512_add_epi32(_mm512_load_si512((const void *)((cb)[0] + 16 * t)),                        \
                                         _mm512_set1_epi32(*(const int32_t *)(const void *)(xr + K + 4 * nb + 4 * (bb)))); \
            __m512 c = _mm512_mul_ps(sc, _mm512_set1_ps(*(const float *)(const void *)(xr + K + 4 * (bb))));       \
            f[t] = _mm512_fmadd_ps(c, _mm512_cvtepi32_ps(p), f[t]);                                                  \
        }                                                                                                            \
    } while (0)

/* The R16 order on AMX-INT8 tiles, for M a multiple of 16 tokens: per group of
 * 16 outputs and chunk of 16 tokens, each block b is one TDPBSUD of the tokens'
 * 32 q (tile A, read in place at the activation rows' stride) against the
 * block's record (tile B, read in place: the record is the B layout) into a
 * zeroed C tile; C leaves through a store, and each token's 16 sums take
 * tile()'s f32 step. The two tile sets alternate by block, and a block's sums
 * are read back after the next block's product is issued, so the store has
 * landed meanwhile. The integer sums are exact, so the bits are tile()'s.
 * Nibble records (fmt) are first spread into byte records in ub (nb * 512
 * bytes), one group at a time, which then serve all its token chunks. fmt is a
 * constant at each call (TD_Q8R_NIB_Q4_0 stands for Q4_0 and IQ4_NL: the
 * offsets are alike, tabp the format's own table). Q6_K's halves are two
 * products a block (A: the tokens' 16 q of a half; B: its 4 quads) into two C
 * tiles, whose sums take the halves' two f32 steps (q8r.h). */
TQ static inline __attribute__((always_inline)) void matmul_amx_f(float *y, int ldy, const uint8_t *xq, int M,
                                                                    const uint8_t *W, int K, int n0, int n1, int add,
                                                                    int fmt, const uint8_t *tabp, uint8_t *ub) {
    int nb = K / 32;
    size_t rb = td_q8r_row_bytes(K), gs = td_q8r_group_bytes(K, fmt);
    const __m512i tab = fmt ? _mm512_broadcast_i32x4(_mm_load_si128((const __m128i *)(const void *)tabp))
                            : _mm512_setzero_si512();
    _Alignas(64) int32_t buf[2][2][16 * 16]; /* [block parity][Q6_K's half] */
    td_amx_tilecfg found, want;
    amx_enter(&found, &want, fmt == TD_Q8R_Q6_K ? 16 : 32);
    for (int n = n0; n < n1; n += 16) {
        int nv = n1 - n < 16 ? n1 - n : 16;
        __mmask16 km = nv >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << nv) - 1);
        const uint8_t *grp = W + (size_t)(n / 16) * gs;
        if (fmt) amx_spread(ub, grp, nb, fmt, tab);
        for (int m0 = 0; m0 < M; m0 += 16) {
            const uint8_t *xs = xq + (size_t)m0 * rb;
            /* the next group's records toward L2 during the last chunk */
            const uint8_t *pf = m0 + 16 >= M && n + 16 < n1 ? grp + gs : NULL;
            __m512 f[16];
#pragma GCC unroll 16
            for (int t = 0; t < 16; t++) f[t] = _mm512_setzero_ps();
            for (int b = 0; b < nb; b++) {
                if (pf)
                    for (int i = 0; i < (int)td_q8r_vbytes(fmt) / 64; i++)
                        _mm_prefetch((const char *)(pf + rec_values(fmt, b) + 64 * i), _MM_HINT_T1);
                const uint8_t *rec = fmt ? ub + 512 * (size_t)b : grp + rec_values(fmt, b);
                if (fmt == TD_Q8R_Q6_K) { /* the halves: 16 q against 4 quads each */
                    _tile_zero(0);
                    _tile_zero(3);
                    _tile_loadd(1, xs + 32 * b, (int)rb);
                    _tile_loadd(2, rec, 64);
                    _tile_loadd(4, xs + 32 * b + 16, (int)rb);
                    _tile_loadd(5, rec + 256, 64);
                    _tile_dpbsud(0, 1, 2);
                    _tile_dpbsud(3, 4, 5);
                    _tile_stored(0, buf[b & 1][0], 64);
                    _tile_stored(3, buf[b & 1][1], 64);
                } else if (b & 1) {
                    _tile_zero(3);
                    _tile_loadd(4, xs + 32 * b, (int)rb);
                    _tile_loadd(5, rec, 64);
                    _tile_dpbsud(3, 4, 5);
                    _tile_stored(3, buf[1][0], 64);
                } else {
                    _tile_zero(0);
                    _tile_loadd(1, xs + 32 * b, (int)rb);
                    _tile_loadd(2, rec, 64);
                    _tile_dpbsud(0, 1, 2);
                    _tile_stored(0, buf[0][0], 64);
                }
                if (b > 0) AMX_STEP(b - 1, buf[(b - 1) & 1]);
            }
            AMX_STEP(nb - 1, buf[(nb - 1) & 1]);
            amx_out16(y + (size_t)m0 * ldy + n, ldy, km, f, add);
        }
    }
    amx_leave(&found, &want); /* put back what this thread had */
}
TQ static void matmul_amx(float *y, int ldy, const uint8_t *xq, int M, const uint8_t *W, int K, int n0, int n1, int add,
                          int fmt, uint8_t *ub) {
    if (fmt == TD_Q8R_BYTES) matmul_amx_f(y, ldy, xq, M, W, K, n0, n1, add, TD_Q8R_BYTES, NULL, NULL);
    else if (fmt == TD_Q8R_Q4_K) matmul_amx_f(y, ldy, xq, M, W, K, n0, n1, add, TD_Q8R_Q4_K, td_q8r_table(fmt), ub);
    else if (fmt == TD_Q8R_Q5_K) matmul_amx_f(y, ldy, xq, M, W, K, n0, n1, add, TD_Q8R_Q5_K, td_q8r_table(fmt), ub);
    else if (fmt == TD_Q8R_Q6_K) matmul_amx_f(y, ldy, xq, M, W, K, n0, n1, add, TD_Q8R_Q6_K, td_q8r_table(fmt), ub);
    else if (fmt == TD_Q8R_Q5_0) matmul_amx_f(y, ldy, xq, M, W, K, n0, n1, add, TD_Q8R_Q5_0, td_q8r_table(fmt), ub);
    else if (fmt == TD_Q8R_IQ4_XS) matmul_amx_f(y, ldy, xq, M, W, K, n0, n1, add, TD_Q8R_IQ4_XS, td_q8r_table(fmt), ub);
    else matmul_amx_f(y, ldy, xq, M, W, K, n0, n1, add, TD_Q8R_NIB_Q4_0, td_q8r_table(fmt), ub);
}

/* 1 when products of 16 tokens or more take the tiles: the CPU has AMX-INT8
 * and TD_Q8R_AMX (a knob for A/B runs) is not "0" */
static int amx_on(void) {
    static _Atomic int v = -1;
    int r = atomic_load_explicit(&v, memory_order_relaxed);
    if (r < 0) {
        const char *e = getenv("TD_Q8R_AMX");
        r = td_i8t_available() && !(e && !strcmp(e, "0"));
        atomic_store_explicit(&v, r, memory_order_relaxed);
    }
    return r;
}
#else
static void matmul_amx(float *y, int ldy, const uint8_t *xq, int M, const uint8_t *W, int K, int n0, int n1, int add,
                       int fmt, uint8_t *ub) {
    (void)y; (void)ldy; (void)xq; (void)M; (void)W; (void)K; (void)n0; (void)n1; (void)add; (void)fmt; (void)ub;
}
static int amx_on(void) { return 0; }
#endif

/* tokens [0, M) of a slab (M <= 128) on the VNNI register tiles; NIB: nibble
 * records of table tab (one copy of the code per NIB, below) */
TV static inline __attribute__((always_inline)) void slab_vnni_f(float *ys, int ldy, const uint8_t *xs, int M,
                                                                   const uint8_t *W, int K, int n0, int n1, int add,
                                                                   int pf_end, int NIB, __m512i tab) {
    int nb = K / 32, near1 = M == 1 && pf_end <= 0; /* a decode token over weights in cache */
    size_t rb = td_q8r_row_bytes(K), gs = td_q8r_group_bytes(K, NIB);
    for (int n = n0; n < n1;) {
        int left = (n1 - n + 15) / 16, G = near1 ? (left < 8 ? left : 8) : (left < 3 ? left : 3);
        int nv[8];
        for (int g = 0; g < G; g++) nv[g] = n1 - (n + 16 * g) < 16 ? n1 - (n + 16 * g) : 16;
        const uint8_t *wg = W + (size_t)(n / 16) * gs;
        float *yg = ys + n;
        /* the next chunk's groups, prefetched during the last token tile: in this range, or for
           a streamed decode token up to pf_end (past a chunk's end, into the next chunk) */
        int lim = M == 1 && pf_end > n1 ? pf_end : n1, nxt = (lim - (n + 16 * G) + 15) / 16;
        int pfg = near1 ? 0 : nxt < 3 ? nxt : 3;
        const uint8_t *pf = pfg > 0 ? wg + (size_t)G * gs : NULL;
        if (near1) {
            switch (G) {
            case 8: tile(yg, ldy, xs, rb, 1, wg, gs, 8, nb, K, nv, add, NULL, 0, NIB, tab); break;
            case 7: tile(yg, ldy, xs, rb, 1, wg, gs, 7, nb, K, nv, add, NULL, 0, NIB, tab); break;
            case 6: tile(yg, ldy, xs, rb, 1, wg, gs, 6, nb, K, nv, add, NULL, 0, NIB, tab); break;
            case 5: tile(yg, ldy, xs, rb, 1, wg, gs, 5, nb, K, nv, add, NULL, 0, NIB, tab); break;
            case 4: tile(yg, ldy, xs, rb, 1, wg, gs, 4, nb, K, nv, add, NULL, 0, NIB, tab); break;
            case 3: tile(yg, ldy, xs, rb, 1, wg, gs, 3, nb, K, nv, add, NULL, 0, NIB, tab); break;
            case 2: tile(yg, ldy, xs, rb, 1, wg, gs, 2, nb, K, nv, add, NULL, 0, NIB, tab); break;
            default: tile(yg, ldy, xs, rb, 1, wg, gs, 1, nb, K, nv, add, NULL, 0, NIB, tab); break;
            }
        } else if (G == 3) TOK_TILES(3);
        else if (G == 2) TOK_TILES(2);
        else TOK_TILES(1);
        n += 16 * G;
    }
}
TV static void slab_vnni_b(float *ys, int ldy, const uint8_t *xs, int M, const uint8_t *W, int K, int n0, int n1,
                           int add, int pf_end) {
    slab_vnni_f(ys, ldy, xs, M, W, K, n0, n1, add, pf_end, 0, _mm512_setzero_si512());
}
/* the nibble formats: one copy of the code per format */
TV static void slab_vnni_t(float *ys, int ldy, const uint8_t *xs, int M, const uint8_t *W, int K, int n0, int n1,
                           int add, int pf_end, int fmt) {
    __m512i tab = _mm512_broadcast_i32x4(_mm_load_si128((const __m128i *)(const void *)td_q8r_table(fmt)));
    switch (fmt) {
    case TD_Q8R_Q5_0: slab_vnni_f(ys, ldy, xs, M, W, K, n0, n1, add, pf_end, TD_Q8R_Q5_0, tab); break;
    case TD_Q8R_Q4_K: slab_vnni_f(ys, ldy, xs, M, W, K, n0, n1, add, pf_end, TD_Q8R_Q4_K, tab); break;
    case TD_Q8R_Q5_K: slab_vnni_f(ys, ldy, xs, M, W, K, n0, n1, add, pf_end, TD_Q8R_Q5_K, tab); break;
    case TD_Q8R_Q6_K: slab_vnni_f(ys, ldy, xs, M, W, K, n0, n1, add, pf_end, TD_Q8R_Q6_K, tab); break;
    case TD_Q8R_IQ4_XS: slab_vnni_f(ys, ldy, xs, M, W, K, n0, n1, add, pf_end, TD_Q8R_IQ4_XS, tab); break;
    default: slab_vnni_f(ys, ldy, xs, M, W, K, n0, n1, add, pf_end, 1, tab); break; /* Q4_0, IQ4_NL */
    }
}

/* Slabs of tokens: 128 on the VNNI tiles (a slab's activations stay in L2
 * while the thread's outputs stream past); with AMX-INT8, slabs of 48 whose
 * whole 16-token chunks take the tiles (measured: 48 beat 32, 64, 128 and 256
 * in a 512-token forward, bench/forward-notes.md) and whose remainder takes
 * VNNI. Either way each output's f32 chain is the same. */
TV static void matmul_vnni(float *y, int ldy, const void *xq, int Mall, const void *Wr, int K, int n0, int n1, int add,
                          int pf_end, int fmt) {
    size_t rb = td_q8r_row_bytes(K);
    const uint8_t *W = Wr;
    int amx = Mall >= 16 && amx_on(), slab = amx ? 48 : 128;
    uint8_t *ub = NULL; /* nibble records spread for the tiles (without it, VNNI serves: the same bits) */
    if (amx && fmt && !(ub = td_thread_scratch((size_t)(K / 32) * 512))) amx = 0, slab = 128;
    for (int s0 = 0; s0 < Mall; s0 += slab) {
        int M = Mall - s0 < slab ? Mall - s0 : slab, Mt = amx ? M / 16 * 16 : 0;
        const uint8_t *xs = (const uint8_t *)xq + (size_t)s0 * rb;
        float *ys = y + (size_t)s0 * ldy;
        if (Mt > 0) matmul_amx(ys, ldy, xs, Mt, W, K, n0, n1, add, fmt, ub);
        if (M > Mt && fmt) slab_vnni_t(ys + (size_t)Mt * ldy, ldy, xs + (size_t)Mt * rb, M - Mt, W, K, n0, n1, add, pf_end, fmt);
        else if (M > Mt) slab_vnni_b(ys + (size_t)Mt * ldy, ldy, xs + (size_t)Mt * rb, M - Mt, W, K, n0, n1, add, pf_end);
    }
}

#endif

/* The order in C: per token and output, each block's integer sum, then its f32 step. */
static void matmul_p(float *y, int ldy, const uint8_t *xq, int M, const uint8_t *W, int K, int n0, int n1, int add,
                     int fmt) {
    int nb = K / 32;
    size_t rb = td_q8r_row_bytes(K), gs = td_q8r_group_bytes(K, fmt);
    const uint8_t *tab = td_q8r_table(fmt);
    for (int m = 0; m < M; m++) {
        const uint8_t *xr = xq + (size_t)m * rb;
        const int8_t *q = (const int8_t *)xr;
        for (int n = n0; n < n1; n++) {
            const uint8_t *grp = W + (size_t)(n / 16) * gs;
            int l = n % 16;
            float a = 0.0f;
            for (int b = 0; b < nb; b++) {
                const uint8_t *v = grp + rec_values(fmt, b) + 4 * l;
                int32_t p, ns, hs, ph;
                memcpy(&ns, xr + K + 4 * nb + 4 * b, 4);
                memcpy(&hs, xr + K + 8 * nb + 4 * b, 4);
                p = fmt == TD_Q8R_Q6_K ? hs : ns; /* -128 * sum q: takes back the records' + 128 */
                ph = ns - hs;                     /* Q6_K's second half's */
                for (int j = 0; j < 8; j++)
                    for (int i = 0; i < 4; i++) {
                        /* value + 128: a byte line's byte, or a nibble line's nibble through the table
                           (Q5_0: + 16 where the row's qh has bit 4j + i; Q6_K: + 16 and + 32 by its two bit lines) */
                        int k = 4 * j + i, u = !tab ? v[64 * j + i] : tab[j < 4 ? v[64 * j + i] & 15 : v[64 * (j - 4) + i] >> 4];
                        if (fmt == TD_Q8R_Q5_0 || fmt == TD_Q8R_Q6_K || fmt == TD_Q8R_Q5_K) u += 16 * (v[256 + k / 8] >> (k % 8) & 1);
                        if (fmt == TD_Q8R_Q6_K) u += 32 * (v[320 + k / 8] >> (k % 8) & 1);
                        if (fmt == TD_Q8R_Q6_K && j >= 4) ph += (int32_t)u * (int32_t)q[32 * b + k];
                        else p += (int32_t)u * (int32_t)q[32 * b + k];
                    }
                uint16_t h;
                float d;
                memcpy(&d, xr + K + 4 * b, 4);
                if (fmt == TD_Q8R_Q6_K) { /* the halves' steps, d * sc exact */
                    const int8_t *sc = (const int8_t *)(grp + rec_scales(fmt, b));
                    memcpy(&h, grp + td_q8r_rec_head(fmt, b) + 2 * l, 2);
                    a = fmaf(td_f16_to_f32(h) * (float)sc[l] * d, (float)p, a);
                    a = fmaf(td_f16_to_f32(h) * (float)sc[16 + l] * d, (float)ph, a);
                    continue;
                }
                if (td_q8r_kmin(fmt)) { /* value d sc q - dmin m: P's step, then -S's (ns = -128 S) */
                    uint16_t hm;
                    const uint8_t *sm = grp + rec_scales(fmt, b);
                    memcpy(&h, grp + td_q8r_rec_head(fmt, b) + 2 * l, 2);
                    memcpy(&hm, grp + td_q8r_rec_head(fmt, b) + 32 + 2 * l, 2);
                    float cs = td_f16_to_f32(h) * (float)sm[l], cm = td_f16_to_f32(hm) * (float)sm[16 + l];
                    a = fmaf(cs * d, (float)p, a);
                    a = fmaf(cm * d, (float)(ns / 128), a);
                    continue;
                }
                if (fmt == TD_Q8R_IQ4_XS) { /* d * sc exact */
                    memcpy(&h, grp + td_q8r_rec_head(fmt, b) + 2 * l, 2);
                    a = fmaf(td_f16_to_f32(h) * (float)(int8_t)grp[rec_scales(fmt, b) + l] * d, (float)p, a);
                    continue;
                }
                memcpy(&h, grp + rec_scales(fmt, b) + 2 * l, 2);
                a = fmaf(td_f16_to_f32(h) * d, (float)p, a);
            }
            float *yy = y + (size_t)m * ldy + n;
            *yy = add ? *yy + a : a;
        }
    }
}

void td_q8r_matmul(float *y, int ldy, const void *xq, int M, const void *Wr, int K, int n0, int n1, int add, int pf_end,
                   int fmt) {
    td_q8r_matmul_hw(y, ldy, xq, M, Wr, K, n0, n1, add, pf_end, fmt, -1);
}

void td_q8r_matmul_hw(float *y, int ldy, const void *xq, int M, const void *Wr, int K, int n0, int n1, int add,
                      int pf_end, int fmt, int hw) {
    TD_ASSERT(n0 % 16 == 0 && K % 32 == 0 && fmt >= TD_Q8R_BYTES && fmt <= TD_Q8R_IQ4_XS && (!td_q8r_super(fmt) || K % 256 == 0));
    if (M <= 0 || n0 >= n1) return;
    int path = td_kernels_path();
    (void)path; /* read only by the x86-64 kernels */
    (void)pf_end; /* read only by the VNNI tiles */
    (void)hw;
#ifdef HAVE_VNNI_TILES
    static _Atomic int vnni = -1;
    int v = atomic_load_explicit(&vnni, memory_order_relaxed);
    if (v < 0) atomic_store_explicit(&vnni, v = vnni_ok(), memory_order_relaxed);
    if (path == TD_KPATH_AVX512 && v) {
        if (M == 1 && hw < 0) hw = td_kernels_hw_stream();
        if (M == 1 && pf_end > 0 && stream1_near(fmt, hw)) pf_end = 0;
        else if (M == 1 && pf_end <= 0 && cached1_tiles(fmt, hw)) pf_end = n1; /* the 3-group tiles, no prefetch past n1 */
        matmul_vnni(y, ldy, xq, M, Wr, K, n0, n1, add, pf_end, fmt);
        return;
    }
#endif
#ifdef TD_HAVE_QUANT_AVX2
    if (path == TD_KPATH_AVX2 || path == TD_KPATH_AVX512) {
        td_avx2_q8r_matmul(y, ldy, xq, M, Wr, K, n0, n1, add, fmt);
        return;
    }
#endif
    matmul_p(y, ldy, xq, M, Wr, K, n0, n1, add, fmt);
}
