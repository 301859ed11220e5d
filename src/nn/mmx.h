/* mmx — one matrix product's input prepared for the kernels of an activation
 * type, and the choice of kernel per weight tensor.
 *
 * A product y = x W^T under act_type (td_ctx_params) runs:
 *   a drafter's Q8_0 weights with an int8 copy (act amx, M >= TD_MM_I8T_MIN_M)
 *                                                   td_i8t_matmul (nn/i8t.h)
 *   Q8_0 (Q4_0, IQ4_NL, Q5_0) weights with an R16 repack (act bf16, amx)
 *                                                   td_q8r_matmul (nn/q8r.h)
 *   bf16 weights, act amx, K a multiple of 32       td_amx_matmul (nn/amx.h)
 *   bf16 weights, act bf16 (or amx, other K)        td_matmul_bf16a (B32)
 *   anything else                                   td_matmul on the f32 input
 * The input is converted once per product, before a pool job splits the
 * outputs, into the scratch the caller owns (td_mm_prepare on the caller; or
 * td_mm_plan, then td_mm_fill over 16-row ranges that threads may share out,
 * the same bytes either way); which kernel serves a
 * tensor depends only on the act type, its dtype and K — never on M or on how
 * the outputs are split — so each order's batch invariance carries over. The
 * one exception is a drafter's own int8 copies (td_tensor.ip, never the
 * target's): at batch 1 a one-token product reads its weights from L2 faster
 * through R16, a block of entries streams them faster through the AMX-INT8
 * tiles, and a draft needs no invariance (verification keeps the output exact).
 * Used by the target's forward (forward.c) and the block drafter (block.c). */
#ifndef TD_MMX_H
#define TD_MMX_H

#include "model/model.h"
#include "nn/kernels.h"

#include <stddef.h>
#include <stdint.h>

typedef struct td_mm_in {
    const float *x;     /* [M][ldx] the f32 input (borrowed) */
    int ldx;
    const uint16_t *xa; /* [M][K] x rounded to bf16 (B32 products), or NULL */
    const uint32_t *xp; /* x packed for the AMX tiles (td_amx_pack), or NULL */
    const uint8_t *xq;  /* x quantized for the R16 products (td_q8r_act), or NULL */
    const uint32_t *xi; /* x quantized per row and packed for the AMX-INT8 products (td_i8t_act), or NULL */
    const float *xs;    /* [M] their scales */
    int M, K;           /* the rows and width planned */
    uint16_t *xa_buf;   /* the caller's scratch behind xa / xp, writable (td_mm_fill) */
    uint8_t *xq_buf;    /* the caller's scratch behind xq / xi and xs, writable */
    int stream;         /* 1: the weights stream from memory (the model outgrows the last-level cache),
                           so the R16 and AMX products prefetch them further ahead; 0 (td_mm_plan's
                           default): they are expected in cache. Never changes a bit */
    int hw;             /* the products' td_kernels_hw_stream choice: 0 or 1, or -1 (td_mm_plan's
                           default) for td_kernels_hw_stream's. Never changes a bit */
    int p24;            /* 1: xa is set and every bf16 weight planned has its P24 copy (td_tensor.pk),
                           so ranges start on whole 24-row panels (td_mm_block); never changes a bit */
} td_mm_in;

/* Tokens from which a product with an int8 copy (td_tensor.ip) takes it
 * (nn/i8t.h; measured on a Xeon with AMX, bench/forward-notes.md: at 1 token R16
 * is faster from L2, at 3 or more the tiles are from L2 and L3 alike). */
#define TD_MM_I8T_MIN_M 3

/* Elements (uint16) of the xa scratch a product of M rows of width K needs. */
static inline size_t td_mm_xa_elems(int M, int K) { return (size_t)M * (size_t)K; }

/* Prepare `in` for products of x ([M][ldx], width K) with each of w[0 .. n_w)
 * under act_type: xa_buf (td_mm_xa_elems, or NULL where act_type is f32) and
 * xq_buf (M rows of td_q8r_row_bytes(K), 64-byte aligned, or NULL where no
 * weight has a repack; it also holds the int8 rows and their scales) are the
 * caller's scratch, valid while `in` is used. */
void td_mm_prepare(td_mm_in *in, int act_type, const td_tensor *const *w, int n_w, const float *x, int ldx, int M, int K,
                   uint16_t *xa_buf, uint8_t *xq_buf);
/* td_mm_prepare in two steps: td_mm_plan chooses the conversions (and sets
 * `in`'s pointers) without converting; td_mm_fill converts input rows
 * [m0, m1), m0 a multiple of 16 (the tile layouts' row chunks), m1 a multiple
 * of 16 or M. Ranges that cover [0, M) once, run in any order or on any
 * threads, write the bytes td_mm_prepare writes. */
void td_mm_plan(td_mm_in *in, int act_type, const td_tensor *const *w, int n_w, const float *x, int ldx, int M, int K,
                uint16_t *xa_buf, uint8_t *xq_buf);
void td_mm_fill(const td_mm_in *in, int m0, int m1);
/* td_mm_fill by input columns instead of rows: columns [k0, k1) of every row,
 * k0 and k1 multiples of 32. Ranges covering [0, K) once, in any order or on
 * any threads, write the bytes td_mm_fill(in, 0, M) writes, so the job that
 * computes x can convert its own columns of it for the next product. Returns
 * 0, or -1 (nothing written) where the plan's layout is not made column by
 * column (the int8 rows of xi take one scale a row): fill by rows then. */
int td_mm_fill_cols(const td_mm_in *in, int k0, int k1);
/* 1 when td_mm_fill_cols can fill `in` (see there). */
static inline int td_mm_fills_cols(const td_mm_in *in) { return !in->xi; }
/* 1 when a plan converts the input at all (else td_mm_fill does nothing). */
static inline int td_mm_converts(const td_mm_in *in) { return in->xa || in->xp || in->xq || in->xi; }
/* y[m*ldy + n] (+)= the product of input row m with W's row n, n in [n0, n1),
 * by the kernel above; [n0, n1) from td_mm_range with td_mm_block(in). */
void td_mm_run(const td_mm_in *in, float *y, int ldy, int M, const td_tensor *w, int K, int n0, int n1, int add);
/* Outputs per block of a thread's range: 16 for the tile and R16 kernels (a
 * range must start on a 16-output group), 24 over P24 copies (a range cut
 * inside a panel runs that panel's rows on the plain tiles, which read the
 * plain weights: a mapped model's pages handed back to the file), else 8. */
static inline int td_mm_block(const td_mm_in *in) { return in->xp || in->xq || in->xi ? 16 : in->p24 ? TD_P24_ROWS : 8; }
/* Outputs [n0, n1) of N for chunk ith of nth, in whole blocks of blk. */
static inline void td_mm_range(int N, int blk, int ith, int nth, int *n0, int *n1) {
    int blocks = (N + blk - 1) / blk;
    *n0 = blocks * ith / nth * blk;
    *n1 = blocks * (ith + 1) / nth * blk;
    if (*n1 > N) *n1 = N;
}

/* One weight of a group of products with the same input: y[M][ldy] (+)= x W^T
 * over W's N outputs. */
typedef struct td_mm_part {
    float *y;           /* borrowed */
    int ldy;
    const td_tensor *w; /* borrowed */
    int N;
} td_mm_part;
struct td_pool;
/* The products of x ([M][ldx], width K) with every part's weights as one job on
 * pool (its threads each take their share of every part's outputs): the input
 * prepared once (td_mm_prepare, scratch xa_buf / xq_buf as there). For drafters
 * that run their own products on the target's threads. */
void td_mm_parts(struct td_pool *pool, int act_type, const float *x, int ldx, int M, int K, const td_mm_part *parts,
                 int n, int add, uint16_t *xa_buf, uint8_t *xq_buf);

#endif
