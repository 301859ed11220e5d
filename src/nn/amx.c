/* amx — bf16 products on Intel AMX tiles (the "AMX" order, amx.h).
 *
 * A block is 16 outputs x up to 16 tokens: tile C accumulates it (f32), tile A
 * takes the block's weights for one step (16 rows x 32 bf16, read in place
 * from W at a stride of K*2 bytes), tile B the packed activations of the step
 * (16 pairs x the tokens). Two sets of these three tiles (0-2, 3-5) serve
 * alternate blocks, so a block's first steps need not wait for the previous
 * block's result to leave its tile; while a range's block runs, the next
 * block's rows are prefetched toward L1, or, where the weights stream from
 * memory (pf_end > 0), the next two blocks' toward L2, past the end of the
 * range up to pf_end (0.6B shape, bf16 decode: 0.955-0.992 of the time, 150-300
 * alternated pairs; the product alone 0.86-0.92; but 1.15 for the tiny target's
 * from L3, which the near prefetch suits; bench/forward-notes.md, "Stop 45").
 * The result tile is stored and gathered back into y one token at a time. One block of 16 rows at a time: measured on a
 * Xeon with AMX (2026-12-04, bench/forward-notes.md "AMX tiles"), four blocks
 * in flight (64 rows, one B load each step) ran the same in L2 but streamed
 * weights from L3 and DRAM 15-20% slower. The last rows of a range (< 16) run
 * under a configuration whose A and C tiles have only that many rows, never
 * reading past row n1 - 1. A tile configuration is per thread (LDTILECFG);
 * each thread keeps the shape it last loaded and reloads only when it changes.
 * Which block, set or configuration computes an output never changes its bits:
 * an element of the result tile depends on its own row, column and
 * accumulator alone. Attention (td_amx_attend, td_amx_attend_rows) runs on the
 * same tiles, over K and V in pair layouts: a query is one row of the score
 * and output tiles, so its bits are its own. */
#define _GNU_SOURCE
#include "nn/amx.h"
#include "nn/exp512.h"
#include "nn/kernels.h"
#include "util/util.h"

#include <limits.h>
#include <string.h>

#if defined(__x86_64__) && (defined(__clang__) ? __clang_major__ >= 12 : __GNUC__ >= 11)
#include <cpuid.h>
#include <immintrin.h>
#include <stdatomic.h>
#include <sys/syscall.h>
#include <unistd.h>

#define TA __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw")))
#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18


/* x[0 .. 32) rounded to bf16 as td_f32_to_bf16 does (nearest even, a NaN
 * quieted): dword r = (x[2r], x[2r+1]). */
TA static inline __m512i pairs_of(const float *x) {
    const __m512i one = _mm512_set1_epi32(1), bias = _mm512_set1_epi32(0x7fff), quiet = _mm512_set1_epi32(0x40);
    const __m512i abs = _mm512_set1_epi32(0x7fffffff), inf = _mm512_set1_epi32(0x7f800000);
    __m256i h[2];
    for (int e = 0; e < 2; e++) {
        __m512i v = _mm512_loadu_si512(x + 16 * e), hi = _mm512_srli_epi32(v, 16);
        __m512i r = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(v, bias), _mm512_and_si512(hi, one)), 16);
        r = _mm512_mask_or_epi32(r, _mm512_cmpgt_epu32_mask(_mm512_and_si512(v, abs), inf), hi, quiet);
        h[e] = _mm512_cvtepi32_epi16(r);
    }
    return _mm512_inserti64x4(_mm512_castsi256_si512(h[0]), h[1], 1);
}

/* Round x[k .. k + 32) and store the 16 pairs at step[r * mc], r = 0..15. */
TA static void pack_step(uint32_t *step, const float *x, int mc) {
    __m512i pairs = pairs_of(x);
    if (mc == 1) _mm512_storeu_si512(step, pairs);
    else _mm512_i32scatter_epi32(step, _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0), _mm512_set1_epi32(mc)), pairs, 4);
}

/* pack_step for 16 rows at once (rows ldx apart): step[r * 16 + i] = pair r
 * of row i, a 16 x 16 transpose of dwords in registers instead of 16 scatters. */
TA static void pack_step16(uint32_t *step, const float *x, int ldx) {
    __m512i a[16], b[16];
    for (int i = 0; i < 16; i++) a[i] = pairs_of(x + (size_t)i * ldx);
    for (int i = 0; i < 16; i += 2) { /* lane L of b[i]: rows i, i+1 at columns 4L, 4L+1 (lo) or 4L+2, 4L+3 (hi) */
        b[i] = _mm512_unpacklo_epi32(a[i], a[i + 1]);
        b[i + 1] = _mm512_unpackhi_epi32(a[i], a[i + 1]);
    }
    for (int j = 0; j < 16; j += 4) { /* lane L of a[j + c]: rows j .. j+3 at column 4L + c */
        a[j] = _mm512_unpacklo_epi64(b[j], b[j + 2]);
        a[j + 1] = _mm512_unpackhi_epi64(b[j], b[j + 2]);
        a[j + 2] = _mm512_unpacklo_epi64(b[j + 1], b[j + 3]);
        a[j + 3] = _mm512_unpackhi_epi64(b[j + 1], b[j + 3]);
    }
    for (int c = 0; c < 4; c++) { /* column 4L + c: lane L of a[c], a[4 + c], a[8 + c], a[12 + c] */
        __m512i d1 = _mm512_shuffle_i32x4(a[c], a[4 + c], 0x88), d2 = _mm512_shuffle_i32x4(a[c], a[4 + c], 0xdd);
        __m512i e1 = _mm512_shuffle_i32x4(a[8 + c], a[12 + c], 0x88), e2 = _mm512_shuffle_i32x4(a[8 + c], a[12 + c], 0xdd);
        _mm512_storeu_si512(step + 16 * c, _mm512_shuffle_i32x4(d1, e1, 0x88));
        _mm512_storeu_si512(step + 16 * (4 + c), _mm512_shuffle_i32x4(d2, e2, 0x88));
        _mm512_storeu_si512(step + 16 * (8 + c), _mm512_shuffle_i32x4(d1, e1, 0xdd));
        _mm512_storeu_si512(step + 16 * (12 + c), _mm512_shuffle_i32x4(d2, e2, 0xdd));
    }
}

void td_amx_pack_cols(uint32_t *xp, const float *x, int ldx, int M, int K, int k0, int k1) {
    for (int m0 = 0; m0 < M; m0 += 16) {
        int mc = M - m0 < 16 ? M - m0 : 16;
        uint32_t *chunk = xp + (size_t)m0 * (size_t)K / 2;
        if (mc == 16) {
            for (int k = k0; k < k1; k += 32) pack_step16(chunk + (size_t)(k / 32) * 256, x + (size_t)m0 * ldx + k, ldx);
            continue;
        }
        for (int i = 0; i < mc; i++)
            for (int k = k0; k < k1; k += 32) pack_step(chunk + (size_t)(k / 32) * 16 * mc + i, x + (size_t)(m0 + i) * ldx + k, mc);
    }
}

void td_amx_pack(uint32_t *xp, const float *x, int ldx, int M, int K) { td_amx_pack_cols(xp, x, ldx, M, K, 0, K); }

/* the shape this thread's tiles are configured for: tokens of the B and C
 * tiles of set 0 and of set 1, rows of the A and C tiles (cfg_mc 0: none yet) */
static _Thread_local int cfg_mc, cfg_mc1, cfg_rows;

/* Set 0 (tiles 0-2) for chunks of mc0 tokens, set 1 (3-5) for chunks of mc1:
 * a product whose tokens end in a shorter chunk keeps one configuration for
 * all its blocks (LDTILECFG per chunk cost ~1 ms a forward of 8 rows x 3
 * tokens, whose 24 tokens then ran as slow as 32). */
TA static void configure(int mc0, int mc1, int rows) {
    if (cfg_mc == mc0 && cfg_mc1 == mc1 && cfg_rows == rows) return;
    td_amx_tilecfg c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int t = 0; t < 6; t += 3) { /* two sets: tiles 0-2 and 3-5 */
        int mc = t ? mc1 : mc0;
        c.rows[t] = (uint8_t)rows; /* C: rows outputs x mc tokens, f32 */
        c.colsb[t] = (uint16_t)(mc * 4);
        c.rows[t + 1] = (uint8_t)rows; /* A: rows outputs x 32 bf16 */
        c.colsb[t + 1] = 64;
        c.rows[t + 2] = 16; /* B: 16 pairs x mc tokens */
        c.colsb[t + 2] = (uint16_t)(mc * 4);
    }
    td_amx_load_cfg(&c);
    cfg_mc = mc0;
    cfg_mc1 = mc1;
    cfg_rows = rows;
}

/* acc[r][i] = the AMX dot of W's row n + r with the chunk's token i, for the
 * configured rows and mc tokens; xc: the chunk's packed activations, w: row n;
 * the npf rows from pf (row n + 16) prefetched along, toward L1 or (far) L2.
 * One copy per tile set (C, A, B = 0, 1, 2 or 3, 4, 5). */
#define AMX_BLOCK(NAME, TC, TA_, TB)                                                       \
    TA static void NAME(float *acc, const uint32_t *xc, int mc, const uint16_t *w, int K, const uint16_t *pf, int npf, \
                        int far) {                                                          \
        _tile_zero(TC);                                                                     \
        for (int k = 0; k < K; k += 32) {                                                   \
            if (!far) for (int r = 0; r < npf; r++) _mm_prefetch((const char *)(pf + (size_t)r * K + k), _MM_HINT_T0); \
            else for (int r = 0; r < npf; r++) _mm_prefetch((const char *)(pf + (size_t)r * K + k), _MM_HINT_T1); \
            _tile_loadd(TB, xc + (size_t)(k / 32) * 16 * mc, mc * 4);                        \
            _tile_loadd(TA_, w + k, (size_t)K * 2);                                         \
            _tile_dpbf16ps(TC, TA_, TB);                                                    \
        }                                                                                   \
        _tile_stored(TC, acc, mc * 4);                                                      \
    }
AMX_BLOCK(block0, 0, 1, 2)
AMX_BLOCK(block1, 3, 4, 5)

/* y[i][r] (+)= a[r][i] for tokens i < mc and rows r < rows: a column of the
 * stored tile gathered into one vector per token (a scalar loop cost 15-20% of
 * an 8-token product) */
TA static void scatter(float *y, int ldy, const float *a, int mc, int rows, int add) {
    const __m512i idx = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                           _mm512_set1_epi32(mc));
    const __mmask16 km = (__mmask16)(rows >= 16 ? 0xFFFFu : (1u << rows) - 1u);
    for (int i = 0; i < mc; i++) {
        __m512 v = _mm512_mask_i32gather_ps(_mm512_setzero_ps(), km, idx, a + i, 4);
        float *yr = y + (size_t)i * ldy;
        if (add) v = _mm512_add_ps(_mm512_maskz_loadu_ps(km, yr), v);
        _mm512_mask_storeu_ps(yr, km, v);
    }
}

/* Rows [n0, n1) x tokens [m0, M) (m0 on a chunk boundary), one block at a
 * time: full chunks on tile set 0, a last shorter one on set 1 (when every
 * chunk has one width, the sets alternate by chunk). */
static void blocks_1x1(float *y, int ldy, const uint32_t *xp, int m0, int M, const uint16_t *W, int K, int n0, int n1,
                       int add, int pf_end) {
    if (m0 >= M) return;
    float acc[2][16 * 16]; /* per tile set: [16 outputs][16 tokens] */
    int mc0 = M - m0 < 16 ? M - m0 : 16, mc1 = M - m0 <= 16 || (M - m0) % 16 == 0 ? mc0 : (M - m0) % 16;
    int set = 0;
    for (int n = n0; n < n1; n += 16) {
        int rows = n1 - n < 16 ? n1 - n : 16;
        configure(mc0, mc1, rows);
        for (int m = m0; m < M; m += 16) {
            int mc = M - m < 16 ? M - m : 16;
            int t = mc0 == mc1 ? (set ^= 1) : mc != 16; /* the tile set */
            float *a = acc[t];
            /* near: the next block's 16 rows when it is in the range; streamed: the next two
               blocks' rows below pf_end */
            int far = pf_end > 0, npf = m > m0 ? 0 : !far ? (n + 32 <= n1 ? 16 : 0) : pf_end - (n + 16);
            npf = npf < 0 ? 0 : npf > 32 ? 32 : npf;
            const uint16_t *pf = npf > 0 ? W + (size_t)(n + 16) * K : NULL; /* rows of W only */
            (t ? block1 : block0)(a, xp + (size_t)m * (size_t)K / 2, mc, W + (size_t)n * K, K, pf, npf, far);
            scatter(y + (size_t)m * ldy + n, ldy, a, mc, rows, add);
        }
    }
}

/* Many tokens (prefill): 32 outputs x 32 tokens at a time, four result tiles
 * (0-3) sharing two weight tiles (4, 5) and two activation tiles (6, 7), so
 * each step loads 4 KiB for four TDPBF16PS instead of 2 KiB for one. The
 * configuration is marked mc = -1 in the thread's cache. */
TA static void configure_2x2(void) {
    if (cfg_mc == -1) return;
    td_amx_tilecfg c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int t = 0; t < 8; t++) {
        c.rows[t] = 16;
        c.colsb[t] = 64;
    }
    td_amx_load_cfg(&c);
    cfg_mc = -1;
    cfg_rows = 16;
}
TA static void block_2x2(float *acc, const uint32_t *x0, const uint32_t *x1, const uint16_t *w, int K) {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (int k = 0; k < K; k += 32) {
        _tile_loadd(4, w + k, (size_t)K * 2);
        _tile_loadd(5, w + (size_t)16 * K + k, (size_t)K * 2);
        _tile_loadd(6, x0 + (size_t)(k / 32) * 256, 64);
        _tile_loadd(7, x1 + (size_t)(k / 32) * 256, 64);
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
    }
    _tile_stored(0, acc, 64);
    _tile_stored(1, acc + 256, 64);
    _tile_stored(2, acc + 512, 64);
    _tile_stored(3, acc + 768, 64);
}

void td_amx_matmul(float *y, int ldy, const uint32_t *xp, int M, const uint16_t *W, int K, int n0, int n1, int add,
                   int pf_end) {
    int m2 = M / 32 * 32, n2 = n0 + (n1 - n0) / 32 * 32; /* the part the 2x2 blocks cover */
    if (m2 && n2 > n0) { /* every 2x2 block, then the tokens past m2 (two configurations, not two a block) */
        float acc[4 * 256];
        configure_2x2();
        for (int n = n0; n < n2; n += 32)
            for (int m = 0; m < m2; m += 32) {
                const uint32_t *x0 = xp + (size_t)m * (size_t)K / 2;
                block_2x2(acc, x0, x0 + (size_t)8 * K, W + (size_t)n * K, K);
                for (int q = 0; q < 4; q++) /* tile q: rows n + 16 (q / 2), tokens m + 16 (q % 2) */
                    scatter(y + (size_t)(m + 16 * (q % 2)) * ldy + n + 16 * (q / 2), ldy, acc + 256 * q, 16, 16, add);
            }
        blocks_1x1(y, ldy, xp, m2, M, W, K, n0, n2, add, 0);
        n0 = n2;
    }
    blocks_1x1(y, ldy, xp, 0, M, W, K, n0, n1, add, m2 ? 0 : pf_end); /* far prefetch: verify and decode only */
}

/* ---- attention of a few queries over one kv head (td_amx_attend) ----
 * Up to 16 queries (one group): C = 0-3 (scores: tile 0 only), A = 4 (queries,
 * then probabilities), B = 5 (keys, then values); every tile has nq rows or 16
 * pair rows of 64 bytes. 17 to 32 queries (two groups, rows 0-15 and 16..nq-1,
 * sharing every K and V load): group 0 in C tiles 0 and 2 and A tile 4, group 1
 * in C tiles 1 and 3 and A tile 6 (nq - 16 rows), B = 5. The configuration is
 * marked mc = -2 - nq in the thread's cache. */
TA static void configure_att(int nq) {
    if (cfg_mc == -2 - nq) return;
    td_amx_tilecfg c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    int two = nq > 16, n0 = two ? 16 : nq, n1 = nq - 16;
    for (int t = 0; t < (two ? 7 : 6); t++) {
        c.rows[t] = (uint8_t)(t == 5 ? 16 : two && (t == 1 || t == 3 || t == 6) ? n1 : n0);
        c.colsb[t] = 64;
    }
    td_amx_load_cfg(&c);
    cfg_mc = -2 - nq;
    cfg_rows = nq;
}

/* p[k] = bf16(e[k] * inv) for k < n, 0 for n <= k < np (np a multiple of 32) */
TA static void probs_bf16(uint16_t *p, const float *e, float inv, int n, int np) {
    const __m512 vi = _mm512_set1_ps(inv);
    const __m512i one = _mm512_set1_epi32(1), bias = _mm512_set1_epi32(0x7fff);
    for (int k = 0; k < np; k += 16) {
        __mmask16 m = n - k >= 16 ? 0xFFFF : n - k <= 0 ? 0 : (__mmask16)((1u << (n - k)) - 1u);
        __m512i v = _mm512_castps_si512(_mm512_mul_ps(_mm512_maskz_loadu_ps(m, e + k), vi)); /* finite, >= 0 */
        __m512i r = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(v, bias), _mm512_and_si512(_mm512_srli_epi32(v, 16), one)), 16);
        _mm256_storeu_si256((__m256i *)(p + k), _mm512_cvtepi32_epi16(r));
    }
}

TA void td_amx_kv_put(uint16_t *kp, uint16_t *vp, int pos, const float *k, const float *v, int hd) {
    const __m512i one = _mm512_set1_epi32(1), bias = _mm512_set1_epi32(0x7fff);
    const __m512i kidx = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0), _mm512_set1_epi32(16));
    uint32_t *kw = (uint32_t *)(kp + td_amx_kp_at(pos, 0, hd)); /* pair i of the key at word i*16 */
    uint16_t *vw = vp + td_amx_vp_at(pos, 0, hd) - pos % 2;    /* dimension d: the pair at element 2d */
    const __mmask32 lane = pos % 2 ? 0xAAAAAAAAu : 0x55555555u;
    for (int d = 0; d < hd; d += 32) {
        __m256i h[2][2];
        for (int e = 0; e < 2; e++) { /* k and v [d, d+32) rounded to bf16 (nearest even; finite inputs) */
            const float *src = e ? v : k;
            for (int c = 0; c < 2; c++) {
                __m512i x = _mm512_loadu_si512(src + d + 16 * c);
                __m512i r = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(x, bias), _mm512_and_si512(_mm512_srli_epi32(x, 16), one)), 16);
                h[e][c] = _mm512_cvtepi32_epi16(r);
            }
        }
        __m512i kk = _mm512_inserti64x4(_mm512_castsi256_si512(h[0][0]), h[0][1], 1); /* dword i = pair (d+2i, d+2i+1) */
        _mm512_i32scatter_epi32(kw + (size_t)d / 2 * 16, kidx, kk, 4);
        for (int c = 0; c < 2; c++) { /* 16 dimensions into lane pos % 2 of their pairs */
            __m512i vv = _mm512_cvtepu16_epi32(h[1][c]);
            if (pos % 2) vv = _mm512_slli_epi32(vv, 16);
            uint16_t *at = vw + (size_t)(d + 16 * c) * 2;
            _mm512_storeu_si512(at, _mm512_mask_blend_epi16(lane, _mm512_loadu_si512(at), vv));
        }
    }
}

#define ATT_PF_BLOCKS 8 /* key blocks (16 keys) the scores prefetch ahead */
/* _mm_prefetch of every line of [p, p + n) (the hint a constant) */
#define prefetch_bytes(p, n, hint)                                                  \
    do {                                                                             \
        const char *pb_ = (const char *)(p);                                         \
        for (size_t l_ = 0; l_ < (n); l_ += 64) _mm_prefetch(pb_ + l_, hint);         \
    } while (0)

/* the result tiles 0-3 zeroed */
TA static inline void zero_c4(void) {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
}
/* the values of the 32 keys from k, dimensions from d0 (pairs layout): in vp
 * below c0, else in the tail copy vt laid out from c0 */
static inline const uint16_t *v_step(const uint16_t *vp, const uint16_t *vt, int c0, int k, int hd, int d0) {
    return (k < c0 ? vp + (size_t)k * hd : vt + (size_t)(k - c0) * hd) + (size_t)d0 * 2;
}

/* td_amx_attend and td_amx_attend_rows: query i attends to keys [0, nkq[i])
 * (nkq NULL: all to [0, nk)), nk the largest. A query's probabilities are
 * zero from its own nk on, so the chunks past its own (which the others
 * need) add exact zeros to its tile sums: its bits are those of the query
 * alone. */
TA static void attend_core(float *o, int ldo, const uint16_t *q, int nq, const uint16_t *kp, const uint16_t *vp,
                           int c0, const uint16_t *kt, const uint16_t *vt, int hd, int nk, const int *nkq, float *s,
                           uint16_t *p) {
    int np = (nk + 31) / 32 * 32, nb = (nk + 15) / 16;
    configure_att(nq);
    /* scores: 16 keys a tile, hd/32 steps. The tile loads stall on misses, so
     * the committed keys ATT_PF_BLOCKS blocks ahead, and each block's values
     * (for the output pass), are prefetched toward L2 (0.6B shape, Q8_0, a
     * one-token forward, alternated in one process: 2-4% faster at context
     * 512, 4% at 2048; toward L1 4 blocks ahead gained less: bench/forward-notes.md,
     * "Stop 41") */
    for (int b = 0; b < nb; b++) {
        const uint16_t *kb = b * 16 < c0 ? kp + (size_t)b * hd * 16 : kt + (size_t)(b * 16 - c0) * hd;
        if ((b + ATT_PF_BLOCKS) * 16 < c0 && b + ATT_PF_BLOCKS < nb)
            prefetch_bytes(kp + (size_t)(b + ATT_PF_BLOCKS) * hd * 16, (size_t)hd * 32, _MM_HINT_T1);
        if (b * 16 < c0) prefetch_bytes(vp + (size_t)b * hd * 16, (size_t)hd * 32, _MM_HINT_T1);
        _tile_zero(0);
        if (nq > 16) _tile_zero(1);
        for (int k = 0; k < hd; k += 32) {
            _tile_loadd(4, q + k, (size_t)hd * 2);
            _tile_loadd(5, kb + (size_t)k * 16, 64);
            _tile_dpbf16ps(0, 4, 5);
            if (nq > 16) {
                _tile_loadd(6, q + (size_t)16 * hd + k, (size_t)hd * 2);
                _tile_dpbf16ps(1, 6, 5);
            }
        }
        _tile_stored(0, s + (size_t)b * 16, (size_t)np * 4);
        if (nq > 16) _tile_stored(1, s + (size_t)16 * np + (size_t)b * 16, (size_t)np * 4);
    }
    /* softmax by query: exp(s - max), probabilities rounded to bf16, zero past nk.
     * Two passes over a query's scores: the maximum, then the exponentials
     * (td_exp's bits: exp512.h) summed as they are stored (16-lane partial sums
     * in key order, reduced, then the tail in order) — the arithmetic of a
     * subtraction pass, td_exp and a sum pass, in a third of the passes */
    const int nk_all = nk;
    for (int i = 0; i < nq; i++) {
        float *e = s + (size_t)i * np;
        int nk = nkq ? nkq[i] : nk_all, k = 0;
        __m512 vm = _mm512_set1_ps(e[0]), acc = _mm512_setzero_ps();
        for (; k + 16 <= nk; k += 16) vm = _mm512_max_ps(vm, _mm512_loadu_ps(e + k));
        float mx = _mm512_reduce_max_ps(vm);
        for (; k < nk; k++) mx = e[k] > mx ? e[k] : mx;
        vm = _mm512_set1_ps(mx);
        for (k = 0; k + 16 <= nk; k += 16) {
            __m512 x = td_exp512(_mm512_sub_ps(_mm512_loadu_ps(e + k), vm));
            _mm512_storeu_ps(e + k, x);
            acc = _mm512_add_ps(acc, x);
        }
        if (k < nk) {
            __mmask16 m = (__mmask16)((1u << (nk - k)) - 1u);
            _mm512_mask_storeu_ps(e + k, m, td_exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, e + k), vm)));
        }
        float sum = _mm512_reduce_add_ps(acc);
        for (; k < nk; k++) sum += e[k];
        probs_bf16(p + (size_t)i * np, e, 1.0f / sum, nk, np);
    }
    if (nq > 16) { /* outputs of two groups: 32 dimensions a pass, each V tile serving both */
        const uint16_t *p1 = p + (size_t)16 * np;
        float *o1 = o + (size_t)16 * ldo;
        for (int d0 = 0; d0 < hd; d0 += 32) {
            zero_c4();
            for (int k = 0; k < np; k += 32) {
                const uint16_t *vc = v_step(vp, vt, c0, k, hd, d0);
                _tile_loadd(4, p + k, (size_t)np * 2);
                _tile_loadd(6, p1 + k, (size_t)np * 2);
                _tile_loadd(5, vc, (size_t)hd * 4);
                _tile_dpbf16ps(0, 4, 5);
                _tile_dpbf16ps(1, 6, 5);
                _tile_loadd(5, vc + 32, (size_t)hd * 4);
                _tile_dpbf16ps(2, 4, 5);
                _tile_dpbf16ps(3, 6, 5);
            }
            _tile_stored(0, o + d0, (size_t)ldo * 4);
            _tile_stored(2, o + d0 + 16, (size_t)ldo * 4);
            _tile_stored(1, o1 + d0, (size_t)ldo * 4);
            _tile_stored(3, o1 + d0 + 16, (size_t)ldo * 4);
        }
        return;
    }
    /* outputs: 16 dimensions a tile, 32 keys a step; four result tiles at a time */
    for (int d0 = 0; d0 < hd; d0 += 64) {
        int nt = hd - d0 < 64 ? (hd - d0) / 16 : 4;
        zero_c4();
        for (int k = 0; k < np; k += 32) {
            const uint16_t *vc = v_step(vp, vt, c0, k, hd, d0);
            _tile_loadd(4, p + k, (size_t)np * 2);
            _tile_loadd(5, vc, (size_t)hd * 4);
            _tile_dpbf16ps(0, 4, 5);
            if (nt > 1) { _tile_loadd(5, vc + 32, (size_t)hd * 4); _tile_dpbf16ps(1, 4, 5); }
            if (nt > 2) { _tile_loadd(5, vc + 64, (size_t)hd * 4); _tile_dpbf16ps(2, 4, 5); }
            if (nt > 3) { _tile_loadd(5, vc + 96, (size_t)hd * 4); _tile_dpbf16ps(3, 4, 5); }
        }
        _tile_stored(0, o + d0, (size_t)ldo * 4);
        if (nt > 1) _tile_stored(1, o + d0 + 16, (size_t)ldo * 4);
        if (nt > 2) _tile_stored(2, o + d0 + 32, (size_t)ldo * 4);
        if (nt > 3) _tile_stored(3, o + d0 + 48, (size_t)ldo * 4);
    }
}

TA void td_amx_attend(float *o, int ldo, const uint16_t *q, int nq, const uint16_t *kp, const uint16_t *vp, int c0,
                      const uint16_t *kt, const uint16_t *vt, int hd, int nk, float *s, uint16_t *p) {
    attend_core(o, ldo, q, nq, kp, vp, c0, kt, vt, hd, nk, NULL, s, p);
}

TA void td_amx_attend_rows(float *o, int ldo, const uint16_t *q, int nq, const uint16_t *kp, const uint16_t *vp, int hd,
                           const int *nk, float *s, uint16_t *p) {
    int n = 0;
    for (int i = 0; i < nq; i++) n = nk[i] > n ? nk[i] : n;
    attend_core(o, ldo, q, nq, kp, vp, INT_MAX, NULL, NULL, hd, n, nk, s, p);
}

/* A product whose result is exact in any summation order: 32 ones times
 * (1, 2, ..., 32) per output, for 16 outputs of 3 tokens. */
TA static int amx_works(void) {
    uint16_t w[16 * 32];
    float x[3 * 32], y[3 * 16];
    uint32_t xp[3 * 16];
    for (int i = 0; i < 16 * 32; i++) w[i] = 0x3f80; /* 1.0 */
    for (int m = 0; m < 3; m++)
        for (int k = 0; k < 32; k++) x[m * 32 + k] = (float)(k + 1 + m);
    td_amx_pack(xp, x, 32, 3, 32);
    td_amx_matmul(y, 16, xp, 3, w, 32, 0, 16, 0, 0);
    for (int m = 0; m < 3; m++)
        for (int n = 0; n < 16; n++)
            if (y[m * 16 + n] != (float)(528 + 32 * m)) return 0;
    return 1;
}

int td_amx_available(void) {
    static _Atomic int ok = -1;
    int v = atomic_load_explicit(&ok, memory_order_relaxed);
    if (v < 0) {
        unsigned a, b, c, d;
        v = 0;
        if (__get_cpuid_count(7, 0, &a, &b, &c, &d) && (d >> 22 & 1) && (d >> 24 & 1) &&
            syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0)
            v = amx_works();
        atomic_store_explicit(&ok, v, memory_order_relaxed);
    }
    return v;
}

#else /* no AMX in this build: the layout in C (nothing calls it without tiles) */

void td_amx_pack_cols(uint32_t *xp, const float *x, int ldx, int M, int K, int k0, int k1) {
    for (int m0 = 0; m0 < M; m0 += 16) {
        int mc = M - m0 < 16 ? M - m0 : 16;
        uint32_t *chunk = xp + (size_t)m0 * (size_t)K / 2;
        for (int i = 0; i < mc; i++) {
            const float *xr = x + (size_t)(m0 + i) * ldx;
            for (int k = k0; k < k1; k += 32) {
                uint32_t *step = chunk + (size_t)(k / 32) * 16 * mc + i;
                for (int r = 0; r < 16; r++)
                    step[r * mc] = td_f32_to_bf16(xr[k + 2 * r]) | (uint32_t)td_f32_to_bf16(xr[k + 2 * r + 1]) << 16;
            }
        }
    }
}

void td_amx_pack(uint32_t *xp, const float *x, int ldx, int M, int K) { td_amx_pack_cols(xp, x, ldx, M, K, 0, K); }

int td_amx_available(void) { return 0; }
void td_amx_matmul(float *y, int ldy, const uint32_t *xp, int M, const uint16_t *W, int K, int n0, int n1, int add,
                   int pf_end) {
    (void)y; (void)ldy; (void)xp; (void)M; (void)W; (void)K; (void)n0; (void)n1; (void)add; (void)pf_end;
    TD_ASSERT(!"td_amx_matmul without AMX");
}

void td_amx_kv_put(uint16_t *kp, uint16_t *vp, int pos, const float *k, const float *v, int hd) {
    for (int d = 0; d < hd; d++) {
        kp[td_amx_kp_at(pos, d, hd)] = td_f32_to_bf16(k[d]);
        vp[td_amx_vp_at(pos, d, hd)] = td_f32_to_bf16(v[d]);
    }
}
void td_amx_attend(float *o, int ldo, const uint16_t *q, int nq, const uint16_t *kp, const uint16_t *vp, int c0,
                   const uint16_t *kt, const uint16_t *vt, int hd, int nk, float *s, uint16_t *p) {
    (void)o; (void)ldo; (void)q; (void)nq; (void)kp; (void)vp; (void)c0; (void)kt; (void)vt; (void)hd; (void)nk; (void)s; (void)p;
    TD_ASSERT(!"td_amx_attend without AMX");
}
void td_amx_attend_rows(float *o, int ldo, const uint16_t *q, int nq, const uint16_t *kp, const uint16_t *vp, int hd,
                        const int *nk, float *s, uint16_t *p) {
    (void)o; (void)ldo; (void)q; (void)nq; (void)kp; (void)vp; (void)hd; (void)nk; (void)s; (void)p;
    TD_ASSERT(!"td_amx_attend_rows without AMX");
}

#endif
