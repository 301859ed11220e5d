/* amx — products of bf16 weights with bf16-rounded activations on Intel AMX
 * tiles (act_type TD_ACT_AMX).
 *
 * The order ("AMX"): each activation row is rounded once to bf16 (nearest even,
 * as td_from_f32); an output element y[m][n] starts from +0 in a tile
 * accumulator and, for k0 = 0, 32, 64, ..., K - 32 in that order, takes one
 * TDPBF16PS step over the 32 elements [k0, k0 + 32) of W's row n and x's row m.
 * How the instruction sums the 32 products inside one step is the CPU's (the
 * bits are those of this CPU's AMX unit, not portable); what fixes them is that
 * an element of the result tile depends only on its own A row, B column and
 * accumulator — test_kernels checks that a row's bits do not change with the
 * number of tokens (B columns), the output range or the tail shapes — and that
 * the sequence of steps depends only on K. So a position's logits are the same
 * bits alone, in a block of T tokens or among B rows, as in the other orders.
 *
 * Layout: W is the model's [N][K] bf16 matrix, read in place (each A tile is 16
 * rows x 64 bytes at a stride of K*2 bytes: the mmapped weights, no repacking).
 * The activations are packed once per product (td_amx_pack) into the pair-
 * interleaved B layout, in chunks of up to 16 tokens. A product runs only when
 * K is a multiple of 32 (td_amx_fits); forward.c sends other widths to the B32
 * order, a choice made by the shape alone. */
#ifndef TD_AMX_H
#define TD_AMX_H

#include <stddef.h>
#include <stdint.h>

/* A tile configuration (LDTILECFG's 64 bytes, palette 1), shared by the
 * modules that run tiles (amx.c, i8t.c). The loads and stores are inline asm
 * over the whole structure: GCC 12's _tile_loadconfig tells the compiler it
 * reads 8 bytes, so the stores of the rows and column widths may be dropped
 * as dead (they were, in a configuration function written like amx.c's
 * configure(): LDTILECFG then faulted on the zeros it found). */
typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16]; /* bytes per row of each tile */
    uint8_t rows[16];
} td_amx_tilecfg;
#if defined(__x86_64__)
static inline void td_amx_load_cfg(const td_amx_tilecfg *c) { __asm__ volatile("ldtilecfg %0" : : "m"(*c)); }
static inline void td_amx_store_cfg(td_amx_tilecfg *c) { __asm__ volatile("sttilecfg %0" : "=m"(*c)); }
#endif

/* 1 when this CPU has AMX-TILE and AMX-BF16 and the kernel granted this process
 * the tile state (arch_prctl ARCH_REQ_XCOMP_PERM, asked once, process-wide). */
int td_amx_available(void);
/* 1 when a product of width K can run on the tiles (K > 0, a multiple of 32). */
static inline int td_amx_fits(int K) { return K > 0 && K % 32 == 0; }
/* uint32 words td_amx_pack writes for M rows of width K (K a multiple of 32). */
static inline size_t td_amx_pack_words(int M, int K) { return (size_t)M * (size_t)K / 2; }
/* Round x[m*ldx .. +K) for m in [0, M) to bf16 and lay them out for the tiles:
 * token chunk c = m / 16 of Mc tokens (16, or the remainder) starts at word
 * c*8*K; inside it, step s = k / 32, pair r = (k % 32) / 2 and token m % 16 is
 * word s*16*Mc + r*Mc + m % 16, holding bf16(x[k]) | bf16(x[k+1]) << 16. */
void td_amx_pack(uint32_t *xp, const float *x, int ldx, int M, int K);
/* The same for input columns [k0, k1) only (multiples of 32): the words
 * td_amx_pack writes for those columns, so ranges covering [0, K) once, in any
 * order or on any threads, write what it writes. */
void td_amx_pack_cols(uint32_t *xp, const float *x, int ldx, int M, int K, int k0, int k1);
/* y[m*ldy + n] (+)= the AMX dot of packed row m with W[n*K .. +K), for n in
 * [n0, n1), m in [0, M); add = 1 accumulates (the residual). Requires
 * td_amx_available() and td_amx_fits(K). Loads this thread's tile configuration
 * as needed (it is per thread; the pool's workers each keep their own).
 * pf_end: 0 where W is expected in cache; where it streams from memory, W's row
 * count (rows below it may be prefetched, past n1). A prefetch choice only: it
 * never changes a bit. */
void td_amx_matmul(float *y, int ldy, const uint32_t *xp, int M, const uint16_t *W, int K, int n0, int n1, int add,
                   int pf_end);

/* Queries one td_amx_attend call takes (two tile groups sharing each K and V load). */
#define TD_AMX_ATTEND_QMAX 32
/* Attention of nq (1..TD_AMX_ATTEND_QMAX) queries over the first nk keys of one kv head, on
 * the tiles: s = q k^T (q already scaled), softmax in f32 (td_exp), the
 * probabilities rounded to bf16, o = p v. Keys and values live in the tiles'
 * pair layouts (td_amx_kp_at, td_amx_vp_at) in whole 32-key chunks: positions
 * [0, c0) in kp / vp, positions [c0, nk) in kt / vt laid out from c0 (c0 a
 * multiple of 32; a drafter keeps its committed context in the first and
 * writes a round's block entries into a small copy of the last chunk, so
 * their stores stay in cache). Values of positions >= nk in the last chunk
 * must be finite (they meet probabilities of 0). hd: a multiple of 32. q:
 * [nq][hd] bf16; s: [nq][np] f32 and p: [nq][np] bf16 scratch, np = nk
 * rounded up to 32; o: nq rows of hd at a stride of ldo floats. A query's
 * bits are its own tile rows' (no batch invariance is promised beyond that:
 * it serves a drafter, spec/drafters/block.c). */
void td_amx_attend(float *o, int ldo, const uint16_t *q, int nq, const uint16_t *kp, const uint16_t *vp, int c0,
                   const uint16_t *kt, const uint16_t *vt, int hd, int nk, float *s, uint16_t *p);
/* The same with every key in kp / vp (no tail), each query i attending to
 * keys [0, nk[i]) (nk[i] >= 1; the values of all positions below the largest
 * nk[i], rounded up to 32, finite): a target's causal attention over its KV
 * cache in the pair layouts (nn/forward.c). Query i's bits depend on its q
 * row, nk[i] and the keys and values below nk[i] only, not on the other
 * queries or their counts, and equal td_amx_attend's of the query alone over
 * [0, nk[i]): batch invariant. s: [nq][np] f32, p: [nq][np] bf16, np the
 * largest nk rounded up to 32. */
void td_amx_attend_rows(float *o, int ldo, const uint16_t *q, int nq, const uint16_t *kp, const uint16_t *vp, int hd,
                        const int *nk, float *s, uint16_t *p);
/* Element d of key / value position pos in those layouts: keys in blocks of 16
 * positions, [hd/2 pairs][16 keys][2]; values in chunks of 32 positions,
 * [16 position pairs][hd][2]. */
static inline size_t td_amx_kp_at(int pos, int d, int hd) {
    return (size_t)(pos / 16) * hd * 16 + (size_t)(d / 2) * 32 + (size_t)(pos % 16) * 2 + (size_t)(d % 2);
}
static inline size_t td_amx_vp_at(int pos, int d, int hd) {
    return (size_t)(pos / 32) * hd * 32 + (size_t)((pos % 32) / 2) * hd * 2 + (size_t)d * 2 + (size_t)(pos % 2);
}
/* Store key k[hd] and value v[hd] (finite) at position pos of those layouts,
 * rounded to bf16 (nearest even); hd a multiple of 32. */
void td_amx_kv_put(uint16_t *kp, uint16_t *vp, int pos, const float *k, const float *v, int hd);

#endif
