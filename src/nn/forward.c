/* forward — the transformer forward pass over a ragged batch of rows (CPU).
 *
 * Design: a td_ctx owns, allocated once at open, the KV cache of max_rows rows
 * ([row][layer][kv head][position][head_dim] for K and for V, stored as
 * p.kv_type: f32, bf16, f16 or q8_0 — rows are rounded (q8_0: quantized in
 * blocks of 32) once by td_from_f32 when written and widened by td_attend_kv
 * when read, so a position's K/V bits do not depend on the forward that wrote
 * them; under act_type amx a
 * bf16 cache with head_dim a multiple of 32 keeps each head's K and V in the
 * AMX tiles' pair layouts instead, and attention runs on the tiles,
 * td_amx_attend_rows); under act_type bf16 a bf16 cache with such a head_dim
 * keeps the plain layout and attention takes the A32 order (td_attend_b32:
 * queries and probabilities rounded to bf16, vdpbf16ps lanes), a RoPE
 * table by absolute position, and activation buffers for max_tokens tokens.
 * td_ctx_forward lays every new token of every row side by side as one
 * [T][n_embd] activation matrix, so each weight matrix is streamed once per
 * forward whatever the number of rows. Per-token work (norms, RoPE, attention)
 * knows each token's row and absolute position.
 *
 * Batch invariance (../shared/design/exactness.md): matrix products go through
 * td_matmul, whose per-element dot order depends only on K (with p.act_type
 * bf16, products with bf16 weights take their input rounded to bf16 once per
 * row, into xa, and run td_matmul_bf16a: again one order per K; act_type amx
 * packs that input for td_amx_matmul's tiles, whose order is again one per K;
 * both quantize it once, into xq, for the R16 products of Q8_0, Q4_0, IQ4_NL,
 * Q5_0, Q4_K, Q5_K and Q6_K weights, nn/q8r.h);
 * attention for a query scores keys 0..pos in order, takes the max, sums
 * exponentials in order and accumulates values in key order — independent of
 * how many queries share the call; threads split outputs, tokens or heads,
 * never a reduction. So a position's logits are the same bits alone, in a
 * block of T, or among B rows.
 *
 * Pool jobs per layer (each costs a synchronisation of all threads): q/k/v;
 * attention; o_proj (+ residual); gate/up (+ SwiGLU); down_proj (+ residual).
 * Row norms of up to NORM_INLINE_T tokens run on the caller between jobs, with
 * the conversion of the next product's input; the o and down products' inputs
 * are instead converted by the jobs that compute them, each chunk its own
 * columns (td_mm_fill_cols: the same bytes), where the chunks split on blocks
 * of 32 columns — a verify's caller then has no pass there while the others wait.
 * A forward of 1 to 8 tokens (decode, verify) runs the schedule its token
 * count's selector picks (nn/hwsel.h: the prefetch choice of its products,
 * td_mm_in.hw, and one or SCHED_CHUNKS chunks a thread), timing itself for it.
 * Attention is one job of units (batch row, kv head) — q/k norm, RoPE and the
 * cache write of that head for the row's new tokens, then attention of the
 * group's queries of those tokens in one td_attend call (they share K/V loads) —
 * when those units keep every thread equally busy; otherwise (few rows and kv
 * heads, many threads) two jobs: post-processing per token, then attention
 * units of up to ATT_TC tokens. The schedule never changes a bit.
 * Llama-3 and Qwen3 use the "rotate half" RoPE layout of Hugging Face. */
#define _GNU_SOURCE
#include "tandem.h"
#include "model/model.h"
#include "nn/amx.h"
#include "nn/hwsel.h"
#include "nn/kernels.h"
#include "nn/mmx.h"
#include "nn/pool.h"
#include "nn/q8r.h"
#include "nn/quant.h"
#include "util/util.h"

#include <math.h>
#include <stdint.h>
#include <sys/mman.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define ATT_TC 8         /* tokens per attention call (queries share K/V loads) */
#define NORM_INLINE_T 32 /* row norms of up to this many tokens run on the caller */
#define MM_CHUNKS 1      /* matrix-product chunks per thread (more: finer balance; measured, see forward-notes) */
#define MM_CHUNK_MIN ((size_t)64 << 10) /* but at least this many weight bytes per chunk */
#define MM_CHUNKS_1 8    /* chunks per thread of a one-token product (decode) ... */
#define MM_TAPER_MIN ((size_t)2 << 20) /* ... of at least this many weight bytes (forward-notes, "Stop 44") */
#define HWSEL_T 8        /* forwards of up to this many tokens choose their schedule by time (decode, verify) */
#define SCHED_CHUNKS 8   /* chunks a thread of every product in the schedules that take more (sched_pick) */

struct td_ctx {
    const td_model *m;      /* borrowed */
    td_ctx_params p;
    td_pool *pool;          /* owned unless shared (share_threads) */
    int pool_owned;
    int kv_dim;             /* n_kv_head*head_dim */
    int q_dim;              /* n_head*head_dim */
    size_t row_stride;      /* elements per row of cache: n_layer*kv_cap*kv_dim */
    int kv_tile;            /* K/V in the AMX tiles' pair layouts (act amx, kv bf16, head_dim a multiple
                               of 32): written by td_amx_kv_put, read by td_amx_attend_rows */
    int kv_a32;             /* attention in the A32 order (act bf16, kv bf16, head_dim a multiple of 32):
                               td_attend_b32 over the plain layout */
    int kv_cap;             /* positions of one head's region: max_ctx (rounded up to 32 with kv_tile, to
                               even with kv_a32: td_attend_b32's scratch rows) */
    char *k_cache;          /* [max_rows][n_layer][n_kv_head][kv_cap][head_dim] of p.kv_type (kv_alloc);
                               with kv_tile each head's region in td_amx_kp_at's layout */
    char *v_cache;          /* same (td_amx_vp_at's layout with kv_tile) */
    size_t kv_bytes;        /* bytes of each of the two caches' mappings */
    int *row_len;           /* [max_rows] KV entries held */
    unsigned char *row_used;/* [max_rows] */
    float *rope_cos;        /* [max_ctx][head_dim/2] */
    float *rope_sin;        /* [max_ctx][head_dim/2] */
    /* activations, [max_tokens][...] */
    float *x;               /* [T][n_embd] residual stream */
    float *xb;              /* [T][n_embd] normed input / projection output */
    float *q;               /* [T][q_dim] */
    float *k;               /* [T][kv_dim] */
    float *v;               /* [T][kv_dim] */
    float *att;             /* [T][q_dim] attention output */
    float *hg;              /* [T][n_ff] gate */
    float *hu;              /* [T][n_ff] up */
    float *xo;              /* [max_logits][n_embd] final-normed wanted positions */
    uint16_t *xa;           /* act_type bf16: [max_tokens][wbuf_stride] a product's input rounded to bf16;
                               amx: the same bytes as uint32 words, packed by td_amx_pack */
    uint16_t *xa2;          /* the same as xa, for the input the gate/up job converts for the down
                               product while its own input in xa is still being read */
    uint8_t *xq2;           /* the same as xq, likewise */
    uint8_t *xq;            /* act_type amx or bf16 over R16 repacks: [max(max_tokens, max_logits)] rows of
                               td_q8r_row_bytes(wbuf_stride), a product's input quantized for
                               td_q8r_matmul; else NULL */
    int *tok_row;           /* [T] row id of each token */
    int *tok_pos;           /* [T] absolute position of each token */
    int *out_tok;           /* [max(max_tokens, max_logits)] token index of each wanted position (taps
                               alone, skip_logits, may want every token) */
    float *wbuf;            /* [n_threads][wbuf_stride] weight-row scratch */
    int wbuf_stride;        /* max(n_embd, n_ff, q_dim) */
    int att_qmax;           /* queries an attention call takes: TD_AMX_ATTEND_QMAX on the tiles
                               (kv_tile), else TD_ATTEND_QMAX */
    float *scores;          /* [n_threads][att_qmax * kv_cap] softmax scratch */
    uint16_t *probs;        /* kv_tile, kv_a32: [n_threads][att_qmax * kv_cap] bf16 probabilities */
    uint16_t *qt;           /* kv_tile, kv_a32: [n_threads][att_qmax * head_dim] scaled bf16 queries */
    float *qg;              /* [n_threads][ATT_TC * q_dim] gathered queries of one attention unit */
    float *og;              /* [n_threads][ATT_TC * q_dim] their outputs */
    int *nkg;               /* [n_threads][ATT_TC * n_head] their key counts */
    int *brow_t0;           /* [max_rows] first token of each batch row (this forward) */
    int *brow_n;            /* [max_rows] its number of new tokens */
    int serial;             /* this forward runs on the caller alone (p.serial_tokens) */
    int mm_chunks;          /* matrix-product chunks per thread (MM_CHUNKS, TD_MM_CHUNKS) */
    size_t mm_chunk_min;    /* bytes of weights a chunk gets at least (MM_CHUNK_MIN) */
    int mm_chunks_1;        /* chunks per thread of a one-token product (MM_CHUNKS_1, TD_MM_CHUNKS_1) ... */
    size_t mm_taper_min;    /* ... of at least this many bytes of weights (MM_TAPER_MIN) */
    int stream;             /* the weights stream from memory: the products prefetch further ahead
                               (td_mm_in.stream; td_ctx_set_stream) */
    int chunks_fixed;       /* mm_chunks was set (TD_MM_CHUNKS, td_ctx_set_mm_chunks): not chosen by time */
    int hw_adapt;           /* choose the schedule of forwards of up to HWSEL_T tokens by time (nn/hwsel.h;
                               TD_HW_ADAPT=0 and td_ctx_set_hw_adapt turn it off) */
    int hw;                 /* this forward's prefetch choice for its products (td_mm_in.hw; -1: the global one) */
    int chunks_now;         /* this forward's chunks a thread (mm_chunks, or SCHED_CHUNKS by its arm) */
    td_hwsel hwsel[HWSEL_T + 1]; /* [T] the selector of forwards of T tokens, 1 <= T <= HWSEL_T */
};

/* Run a job on the pool, or on the caller alone (chunk 0 of 1) in a serial
 * forward: chunks own their outputs, so the bits do not change. */
static void run_job(td_ctx *c, td_pool_fn fn, void *arg) {
    if (c->serial) fn(arg, 0, 1);
    else td_pool_run(c->pool, fn, arg);
}

td_ctx_params td_ctx_default_params(void) {
    td_ctx_params p = {.max_rows = 1, .max_ctx = 0, .max_tokens = 512, .max_logits = 256, .n_threads = 0};
    return p;
}

static void rope_table(td_ctx *c) {
    const td_config *cfg = &c->m->cfg;
    int half = cfg->head_dim / 2;
    double *inv = malloc(sizeof(double) * (size_t)half);
    if (!inv) return;
    for (int i = 0; i < half; i++) {
        double f = 1.0 / pow(cfg->rope_theta, (2.0 * i) / cfg->head_dim);
        if (cfg->rope_scaling == TD_ROPE_LLAMA3) {
            double lo_wl = cfg->rope_orig_ctx / cfg->rope_low_freq_factor;
            double hi_wl = cfg->rope_orig_ctx / cfg->rope_high_freq_factor;
            double wl = 2.0 * M_PI / f;
            if (wl > lo_wl) {
                f = f / cfg->rope_factor;
            } else if (wl >= hi_wl) {
                double s = (cfg->rope_orig_ctx / wl - cfg->rope_low_freq_factor) /
                           (cfg->rope_high_freq_factor - cfg->rope_low_freq_factor);
                f = (1.0 - s) * f / cfg->rope_factor + s * f;
            }
        }
        inv[i] = f;
    }
    for (int pos = 0; pos < c->p.max_ctx; pos++)
        for (int i = 0; i < half; i++) {
            double a = (double)pos * inv[i];
            c->rope_cos[(size_t)pos * half + i] = (float)cos(a);
            c->rope_sin[(size_t)pos * half + i] = (float)sin(a);
        }
    free(inv);
}

/* A KV cache: zero pages mapped lazily (only the pages of positions written
 * take memory), advised MADV_HUGEPAGE. Measured when a kv head's positions lay
 * kv_dim elements apart (before kv_head_off's layout), 2 MiB pages made the 0.6B
 * shape's verify T=8 3-8% and T=16 5-10% faster (bench/forward-notes.md); with
 * each head's positions contiguous they still save the TLB a miss per 4 KiB of
 * keys. Under AddressSanitizer: calloc, so overruns are caught. *bytes: the
 * length to hand kv_free. */
#define KV_HUGE ((size_t)2 << 20)
#if defined(__SANITIZE_ADDRESS__)
#define KV_HEAP 1 /* AddressSanitizer watches heap blocks' bounds, not mappings' */
#else
#define KV_HEAP 0
#endif
static char *kv_alloc(size_t n, size_t m, size_t esz, size_t *bytes, int *fail) {
    size_t b;
    if (td_mul_size(n, m, &b) || td_mul_size(b, esz, &b) || b > SIZE_MAX - KV_HUGE) { *fail = 1; return NULL; }
    if (KV_HEAP) {
        char *h = calloc(1, b ? b : 1);
        if (!h) *fail = 1;
        *bytes = b;
        return h;
    }
    b = (b + KV_HUGE - 1) & ~(KV_HUGE - 1);
    if (!b) b = KV_HUGE;
    void *p = mmap(NULL, b, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) { *fail = 1; return NULL; }
#ifdef MADV_HUGEPAGE
    madvise(p, b, MADV_HUGEPAGE); /* advice only */
#endif
    *bytes = b;
    return p;
}
static void kv_free(char *p, size_t bytes) {
    if (KV_HEAP) free(p);
    else if (p) munmap(p, bytes);
}

void td_ctx_free(td_ctx *c) {
    if (!c) return;
    if (c->pool_owned) td_pool_free(c->pool);
    kv_free(c->k_cache, c->kv_bytes); kv_free(c->v_cache, c->kv_bytes); free(c->row_len); free(c->row_used);
    free(c->rope_cos); free(c->rope_sin);
    free(c->x); free(c->xb); free(c->q); free(c->k); free(c->v); free(c->att);
    free(c->hg); free(c->hu); free(c->xo); free(c->tok_row); free(c->tok_pos);
    free(c->out_tok); free(c->wbuf); free(c->scores); free(c->probs); free(c->qt); free(c->qg); free(c->og); free(c->nkg);
    free(c->brow_t0); free(c->brow_n); free(c->xa); free(c->xq); free(c->xa2); free(c->xq2);
    free(c);
}

/* zeroed n x m elements of esz bytes */
static void *alloc_e(size_t n, size_t m, size_t esz, int *fail) {
    size_t bytes;
    if (td_mul_size(n, m, &bytes) || td_mul_size(bytes, esz, &bytes)) { *fail = 1; return NULL; }
    void *p = calloc(1, bytes ? bytes : 1);
    if (!p) *fail = 1;
    return p;
}
static void *alloc_f(size_t n, size_t m, int *fail) { return alloc_e(n, m, sizeof(float), fail); }

int td_kv_type_parse(const char *name) {
    if (!name) return -1;
    return !strcmp(name, "f32")    ? TD_DTYPE_F32
           : !strcmp(name, "bf16") ? TD_DTYPE_BF16
           : !strcmp(name, "f16")  ? TD_DTYPE_F16
           : !strcmp(name, "q8_0") ? TD_DTYPE_Q8_0
                                   : -1;
}
const char *td_kv_type_name(int kv_type) {
    return kv_type == TD_DTYPE_F32    ? "f32"
           : kv_type == TD_DTYPE_BF16 ? "bf16"
           : kv_type == TD_DTYPE_F16  ? "f16"
           : kv_type == TD_DTYPE_Q8_0 ? "q8_0"
                                      : NULL;
}

int td_act_type_parse(const char *name) {
    if (!name) return -1;
    if (!strcmp(name, "auto")) /* the fastest mode this CPU runs natively */
        return td_amx_available() ? TD_ACT_AMX : td_kernels_bf16_native() ? TD_DTYPE_BF16 : TD_DTYPE_F32;
    return !strcmp(name, "f32") ? TD_DTYPE_F32 : !strcmp(name, "bf16") ? TD_DTYPE_BF16 : !strcmp(name, "amx") ? TD_ACT_AMX : -1;
}
const char *td_act_type_name(int act_type) {
    return act_type == TD_DTYPE_F32 ? "f32" : act_type == TD_DTYPE_BF16 ? "bf16" : act_type == TD_ACT_AMX ? "amx" : NULL;
}

int td_ctx_default_threads(void) { return td_pool_default_size(); }

int td_ctx_open(td_ctx **out, const td_model *m, const td_ctx_params *pp, td_err *err) {
    *out = NULL;
    if (!m) return td_seterr(err, TD_EINVAL, "td_ctx_open: no model");
    td_ctx_params p = pp ? *pp : td_ctx_default_params();
    const td_config *cfg = &m->cfg;
    if (p.max_ctx <= 0) p.max_ctx = cfg->n_ctx_train < 4096 ? cfg->n_ctx_train : 4096;
    if (p.max_rows < 1 || p.max_rows > 4096) return td_seterr(err, TD_EINVAL, "max_rows %d out of range [1, 4096]", p.max_rows);
    if (p.max_ctx < 1 || p.max_ctx > (1 << 22)) return td_seterr(err, TD_EINVAL, "max_ctx %d out of range", p.max_ctx);
    if (p.max_tokens < 1 || p.max_tokens > (1 << 20)) return td_seterr(err, TD_EINVAL, "max_tokens %d out of range", p.max_tokens);
    if (p.max_logits < 1 || p.max_logits > (1 << 20)) return td_seterr(err, TD_EINVAL, "max_logits %d out of range", p.max_logits);
    if (!td_kv_type_name(p.kv_type))
        return td_seterr(err, TD_EINVAL, "kv_type %d is not f32 (%d), bf16 (%d), f16 (%d) or q8_0 (%d)", p.kv_type,
                         TD_DTYPE_F32, TD_DTYPE_BF16, TD_DTYPE_F16, TD_DTYPE_Q8_0);
    if (p.kv_type == TD_DTYPE_Q8_0 && cfg->head_dim % 32 != 0)
        return td_seterr(err, TD_EUNSUPPORTED, "kv_type q8_0 needs a head_dim that is a multiple of 32 (the model's is %d)",
                         cfg->head_dim);
    if (!td_act_type_name(p.act_type))
        return td_seterr(err, TD_EINVAL, "act_type %d is not f32 (%d), bf16 (%d) or amx (%d)", p.act_type, TD_DTYPE_F32,
                         TD_DTYPE_BF16, TD_ACT_AMX);
    if (p.act_type == TD_ACT_AMX && !td_amx_available())
        return td_seterr(err, TD_EUNSUPPORTED, "act_type amx: this CPU or kernel offers no AMX-BF16 tiles");
    /* act_type bf16 and amx multiply Q8_0, Q4_0, IQ4_NL and Q5_0 matrices in the R16 order, over the
       model's repacks */
    int q8r = 0;
    if (p.act_type == TD_ACT_AMX || p.act_type == TD_DTYPE_BF16) {
        int rc = td_model_repack_q8r((td_model *)(uintptr_t)m, err); /* the model's one lazily built cache */
        if (rc) return rc;
        q8r = td_model_has_repack(m);
    }
    /* act_type bf16 multiplies bf16 matrices over their P24 copies where the CPU runs them (nn/kernels.h) */
    if (p.act_type == TD_DTYPE_BF16 && td_kernels_p24()) {
        int rc = td_model_repack_p24((td_model *)(uintptr_t)m, err);
        if (rc) return rc;
    }
    if (p.n_threads <= 0) p.n_threads = td_pool_default_size();
    if (p.n_threads > 256) p.n_threads = 256;
    if (p.share_threads) p.n_threads = p.share_threads->p.n_threads;
    td_ctx *c = calloc(1, sizeof *c);
    if (!c) return td_seterr(err, TD_ENOMEM, "out of memory");
    c->m = m;
    c->p = p;
    c->kv_dim = cfg->n_kv_head * cfg->head_dim;
    c->q_dim = cfg->n_head * cfg->head_dim;
    int fail = 0;
    c->kv_tile = p.act_type == TD_ACT_AMX && p.kv_type == TD_DTYPE_BF16 && cfg->head_dim % 32 == 0;
    c->kv_a32 = p.act_type == TD_DTYPE_BF16 && p.kv_type == TD_DTYPE_BF16 && cfg->head_dim % 32 == 0;
    c->kv_cap = c->kv_tile ? (p.max_ctx + 31) / 32 * 32 : c->kv_a32 ? (p.max_ctx + 1) / 2 * 2 : p.max_ctx;
    size_t per_row;
    if (td_mul_size((size_t)cfg->n_layer * c->kv_cap, (size_t)c->kv_dim, &per_row))
        fail = 1;
    c->row_stride = per_row;
    if (!fail && per_row > SIZE_MAX / 8) fail = 1;
    if (!fail) { /* per_row elements: a multiple of head_dim, so of 32 for q8_0 */
        size_t rowb = td_dtype_row_bytes(p.kv_type, (int64_t)per_row);
        c->k_cache = kv_alloc((size_t)p.max_rows, rowb, 1, &c->kv_bytes, &fail);
        if (!fail) c->v_cache = kv_alloc((size_t)p.max_rows, rowb, 1, &c->kv_bytes, &fail);
    }
    c->row_len = calloc((size_t)p.max_rows, sizeof(int));
    c->row_used = calloc((size_t)p.max_rows, 1);
    if (!c->row_len || !c->row_used) fail = 1;
    int half = cfg->head_dim / 2;
    c->rope_cos = alloc_f((size_t)p.max_ctx, (size_t)half, &fail);
    c->rope_sin = alloc_f((size_t)p.max_ctx, (size_t)half, &fail);
    size_t T = (size_t)p.max_tokens;
    c->x = alloc_f(T, (size_t)cfg->n_embd, &fail);
    c->xb = alloc_f(T, (size_t)cfg->n_embd, &fail);
    c->q = alloc_f(T, (size_t)c->q_dim, &fail);
    c->k = alloc_f(T, (size_t)c->kv_dim, &fail);
    c->v = alloc_f(T, (size_t)c->kv_dim, &fail);
    c->att = alloc_f(T, (size_t)c->q_dim, &fail);
    c->hg = alloc_f(T, (size_t)cfg->n_ff, &fail);
    c->hu = alloc_f(T, (size_t)cfg->n_ff, &fail);
    c->xo = alloc_f((size_t)p.max_logits, (size_t)cfg->n_embd, &fail);
    c->tok_row = calloc(T, sizeof(int));
    c->tok_pos = calloc(T, sizeof(int));
    c->out_tok = calloc(T > (size_t)p.max_logits ? T : (size_t)p.max_logits, sizeof(int));
    if (!c->tok_row || !c->tok_pos || !c->out_tok) fail = 1;
    int wmax = cfg->n_embd;
    if (cfg->n_ff > wmax) wmax = cfg->n_ff;
    if (c->q_dim > wmax) wmax = c->q_dim;
    c->wbuf_stride = wmax;
    c->wbuf = alloc_f((size_t)p.n_threads, (size_t)wmax, &fail);
    if (p.act_type != TD_DTYPE_F32) {
        c->xa = alloc_e(T, (size_t)wmax, sizeof(uint16_t), &fail);
        c->xa2 = alloc_e(T, (size_t)cfg->n_ff, sizeof(uint16_t), &fail);
    }
    if (q8r) {
        c->xq = alloc_e(T > (size_t)p.max_logits ? T : (size_t)p.max_logits, td_q8r_row_bytes(wmax), 1, &fail);
        c->xq2 = alloc_e(T, td_q8r_row_bytes(cfg->n_ff), 1, &fail);
    }
    c->att_qmax = c->kv_tile ? TD_AMX_ATTEND_QMAX : TD_ATTEND_QMAX;
    c->scores = alloc_f((size_t)p.n_threads * c->att_qmax, (size_t)c->kv_cap, &fail);
    if (c->kv_tile || c->kv_a32) {
        c->probs = alloc_e((size_t)p.n_threads * c->att_qmax, (size_t)c->kv_cap, sizeof(uint16_t), &fail);
        c->qt = alloc_e((size_t)p.n_threads * c->att_qmax, (size_t)cfg->head_dim, sizeof(uint16_t), &fail);
    }
    c->qg = alloc_f((size_t)p.n_threads * ATT_TC, (size_t)c->q_dim, &fail);
    c->og = alloc_f((size_t)p.n_threads * ATT_TC, (size_t)c->q_dim, &fail);
    c->nkg = calloc((size_t)p.n_threads * ATT_TC * (size_t)cfg->n_head, sizeof(int));
    c->brow_t0 = calloc((size_t)p.max_rows, sizeof(int));
    c->brow_n = calloc((size_t)p.max_rows, sizeof(int));
    if (!c->nkg || !c->brow_t0 || !c->brow_n) fail = 1;
    if (fail) {
        td_ctx_free(c);
        return td_seterr(err, TD_ENOMEM, "out of memory allocating a context of %d rows x %d positions",
                         p.max_rows, p.max_ctx);
    }
    if (p.share_threads) {
        c->pool = p.share_threads->pool;
    } else if (td_pool_open(&c->pool, p.n_threads) != 0) {
        td_ctx_free(c);
        return td_seterr(err, TD_ENOMEM, "cannot start %d threads", p.n_threads);
    } else {
        c->pool_owned = 1;
    }
    c->mm_chunks = MM_CHUNKS;
    c->mm_chunk_min = MM_CHUNK_MIN;
    c->mm_chunks_1 = MM_CHUNKS_1;
    c->mm_taper_min = MM_TAPER_MIN;
    /* a model larger than the last-level cache is read from memory every forward */
    c->stream = c->m->weight_bytes > td_llc_bytes();
    const char *st = getenv("TD_STREAM");
    if (st && *st) {
        if (strcmp(st, "0") && strcmp(st, "1")) {
            td_ctx_free(c);
            return td_seterr(err, TD_EINVAL, "TD_STREAM='%.32s' is not 0 or 1", st);
        }
        c->stream = *st == '1';
    }
    const char *ha = getenv("TD_HW_ADAPT");
    if (ha && *ha && strcmp(ha, "0") && strcmp(ha, "1")) {
        td_ctx_free(c);
        return td_seterr(err, TD_EINVAL, "TD_HW_ADAPT='%.32s' is not 0 or 1", ha);
    }
    c->hw_adapt = !(ha && *ha == '0');
    c->hw = -1;
    for (int t = 0; t <= HWSEL_T; t++) td_hwsel_init(&c->hwsel[t], 1, 0); /* arms set at the first forward */
    static const char *const knob[2] = {"TD_MM_CHUNKS", "TD_MM_CHUNKS_1"}; /* tuning knobs for A/B runs */
    for (int i = 0; i < 2; i++) {
        const char *mc = getenv(knob[i]);
        if (!mc || !*mc) continue;
        char *end;
        long v = strtol(mc, &end, 10);
        if (*end || v < 1 || v > 64) {
            td_ctx_free(c);
            return td_seterr(err, TD_EINVAL, "%s='%.32s' is not an integer in [1, 64]", knob[i], mc);
        }
        *(i ? &c->mm_chunks_1 : &c->mm_chunks) = (int)v;
        c->chunks_fixed |= !i;
    }
    c->chunks_now = c->mm_chunks;
    rope_table(c);
    *out = c;
    return 0;
}

void td_ctx_set_mm_chunks(td_ctx *c, int per_thread, size_t min_bytes) {
    c->mm_chunks = c->chunks_now = per_thread < 1 ? 1 : per_thread;
    c->chunks_fixed = 1;
    c->mm_chunk_min = min_bytes < 1 ? 1 : min_bytes;
}

void td_ctx_set_mm_chunks_1(td_ctx *c, int per_thread, size_t min_job_bytes) {
    c->mm_chunks_1 = per_thread < 1 ? 1 : per_thread;
    c->mm_taper_min = min_job_bytes;
}

void td_ctx_set_stream(td_ctx *c, int stream) { c->stream = stream != 0; }
void td_ctx_set_hw_adapt(td_ctx *c, int on) { c->hw_adapt = on != 0; }

/* The schedules a forward of up to HWSEL_T tokens chooses among (nn/hwsel.h):
 * the prefetch choice where td_kernels_hw_stream is not fixed (nh = 2: arm
 * bit 0), and one or SCHED_CHUNKS chunks a thread where mm_chunks is not
 * (nc = 2: the next bit). Returns the arm count, 1 when there is no choice. */
static int sched_arms(const td_ctx *c, int *nh, int *nc) {
    *nh = td_kernels_hw_stream_fixed() ? 1 : 2;
    *nc = c->chunks_fixed ? 1 : 2;
    return c->hw_adapt ? *nh * *nc : 1;
}
/* Arm a's prefetch choice and chunks a thread, for sched_arms' nh and nc. */
static void sched_arm(const td_ctx *c, int a, int nh, int nc, int *hw, int *chunks) {
    *hw = nh == 2 ? a & 1 : -1;
    *chunks = nc == 2 && (a >> (nh - 1)) & 1 ? SCHED_CHUNKS : c->mm_chunks;
}
/* Sets this forward's schedule; returns the selector to record its time in, or NULL. */
static td_hwsel *sched_pick(td_ctx *c, int T, int *arm) {
    int nh, nc, arms = sched_arms(c, &nh, &nc);
    c->hw = -1;
    c->chunks_now = c->mm_chunks;
    if (T < 1 || T > HWSEL_T || arms < 2) return NULL;
    td_hwsel *s = &c->hwsel[T];
    if (s->arms != arms) td_hwsel_init(s, arms, nh == 2 ? td_kernels_hw_stream() : 0);
    *arm = td_hwsel_pick(s);
    sched_arm(c, *arm, nh, nc, &c->hw, &c->chunks_now);
    return s;
}

int td_ctx_sched_choice(const td_ctx *c, int T, int *hw, int *chunks) {
    int nh, nc, arms = sched_arms(c, &nh, &nc);
    *hw = -1;
    *chunks = c->mm_chunks;
    if (T < 1 || T > HWSEL_T || arms < 2) return -1;
    const td_hwsel *s = &c->hwsel[T];
    int a = s->arms == arms ? td_hwsel_chosen(s) : -1;
    if (a < 0) return -1;
    sched_arm(c, a, nh, nc, hw, chunks);
    return 0;
}

td_ctx_params td_ctx_get_params(const td_ctx *c) { return c->p; }
td_pool *td_ctx_pool(const td_ctx *c) { return c->pool; }

int td_ctx_row_add(td_ctx *c, int *row_out) {
    for (int r = 0; r < c->p.max_rows; r++)
        if (!c->row_used[r]) {
            c->row_used[r] = 1;
            c->row_len[r] = 0;
            *row_out = r;
            return 0;
        }
    return TD_EFULL;
}

int td_ctx_row_remove(td_ctx *c, int row) {
    if (row < 0 || row >= c->p.max_rows || !c->row_used[row]) return TD_EINVAL;
    c->row_used[row] = 0;
    c->row_len[row] = 0;
    return 0;
}

int td_ctx_row_len(const td_ctx *c, int row) {
    if (row < 0 || row >= c->p.max_rows || !c->row_used[row]) return TD_EINVAL;
    return c->row_len[row];
}

int td_ctx_row_trim(td_ctx *c, int row, int len) {
    if (row < 0 || row >= c->p.max_rows || !c->row_used[row]) return TD_EINVAL;
    if (len < 0 || len > c->row_len[row]) return TD_ERANGE;
    c->row_len[row] = len;
    return 0;
}

/* ---- parallel jobs ----------------------------------------------------- */

/* One pool job runs up to three products that share the input x (q/k/v, or
 * gate/up): each thread takes its share of every output range, so the job costs
 * one synchronisation. add = 1 accumulates into y (the residual). swiglu = 1
 * (gate, up) applies hg = silu(hg) * hu to the thread's own range right after
 * its products, while that range is still in cache. */
typedef struct { float *y; int ldy; const td_tensor *w; int N; } mm_out;
typedef struct {
    td_ctx *c;
    const float *x; int M; int K; int add; int swiglu;
    int n_out; mm_out o[3];
    td_mm_in in;        /* x prepared for the act type's kernels (mm_pool_run) */
    int prefilled;      /* in is planned and filled already (a swiglu job's next): no plan, no fill */
    int nthreads;       /* the pool's threads (mm_pool_run; 1 when serial) */
    td_mm_in *next;     /* swiglu jobs: the next product's input, planned over o[0].y, or NULL; each
                           chunk converts its own columns of it after its swiglu (mm_pool_run clears
                           it where the chunks' columns are not whole blocks of 32) */
} mm_job;

/* Units [*u0, *u1) of U for chunk ith of nth in a pool of T threads. One
 * chunk a thread (nth = T): even shares. More: thread t's share (the pool deals
 * it chunks [nth t / T, nth (t + 1) / T)) is cut geometrically, the first chunk
 * half of it, the next a quarter, ..., the last two equal. The owner claims
 * front to back, so it streams its share in one pass as with one chunk, and a
 * thread that runs out steals the smallest pieces from the back of another's:
 * a job ends with at most a small piece in flight instead of a whole chunk. */
static void chunk_units(int U, int ith, int nth, int T, int *u0, int *u1) {
    if (nth <= T) { *u0 = (int)((long)U * ith / nth); *u1 = (int)((long)U * (ith + 1) / nth); return; }
    int t = 0;
    while (t + 1 < T && ith >= (int)((long)nth * (t + 1) / T)) t++;
    int lo = (int)((long)nth * t / T), c = (int)((long)nth * (t + 1) / T) - lo, q = ith - lo;
    int a = (int)((long)U * t / T), u = (int)((long)U * (t + 1) / T) - a;
    *u0 = a + (q == 0 ? 0 : u - (u >> (q < 30 ? q : 30)));
    *u1 = a + (q + 1 >= c ? u : u - (u >> (q + 1 < 30 ? q + 1 : 30)));
}

/* Outputs [*n0, *n1) of output i for chunk ith of nth. A swiglu job cuts each
 * output alike (gate and up must match), in units of whole blocks that are
 * also whole blocks of 32 outputs (so each chunk can convert its own columns
 * for the next product: 32 for blocks of 8 or 16, 96 for panels of 24), and
 * so does a job of several tokens; a one-token job with several outputs (q, k,
 * v) cuts them as one list of blocks laid end to end, so a thread streams whole
 * matrices and does not hop between them chunk by chunk. Empty ranges are
 * possible (n0 == n1). */
static void mm_chunk_range(const mm_job *j, int i, int blk, int ith, int nth, int *n0, int *n1) {
    int N = j->o[i].N, u0, u1;
    if (j->swiglu || j->n_out == 1 || j->M > 1) {
        int w = blk; /* a swiglu job's units: whole blocks of 32 columns too (lcm) */
        while (j->swiglu && w % 32) w += blk;
        chunk_units((N + w - 1) / w, ith, nth, j->nthreads, &u0, &u1);
        *n0 = (long)u0 * w < N ? u0 * w : N;
        *n1 = (long)u1 * w < N ? u1 * w : N;
        return;
    }
    int off = 0, total = 0;
    for (int k = 0; k < j->n_out; k++) {
        if (k == i) off = total;
        total += (j->o[k].N + blk - 1) / blk;
    }
    chunk_units(total, ith, nth, j->nthreads, &u0, &u1);
    u0 = u0 < off ? 0 : u0 - off;
    u1 = u1 < off ? 0 : u1 - off;
    *n0 = (long)u0 * blk < N ? u0 * blk : N;
    *n1 = (long)u1 * blk < N ? u1 * blk : N;
    if (*n1 < *n0) *n1 = *n0;
}

static void mm_run(void *arg, int ith, int nth) {
    mm_job *j = arg;
    int blk = td_mm_block(&j->in);
    for (int i = 0; i < j->n_out; i++) {
        const mm_out *o = &j->o[i];
        int n0, n1;
        mm_chunk_range(j, i, blk, ith, nth, &n0, &n1);
        if (n0 < n1) td_mm_run(&j->in, o->y, o->ldy, j->M, o->w, j->K, n0, n1, j->add);
    }
    if (j->swiglu) {
        int n0, n1;
        mm_chunk_range(j, 0, blk, ith, nth, &n0, &n1);
        if (n0 >= n1) return;
        for (int m = 0; n0 < n1 && m < j->M; m++) {
            float *g = j->o[0].y + (size_t)m * j->o[0].ldy + n0;
            td_swiglu(g, g, j->o[1].y + (size_t)m * j->o[1].ldy + n0, n1 - n0);
        }
        if (j->next) td_mm_fill_cols(j->next, n0, n1); /* this chunk's columns, still in cache */
    }
}

/* The input conversion of a product of many rows (prefill), shared out by
 * 16-row units: chunk ith of nth converts units [U ith / nth, U (ith + 1) / nth)
 * of the U = ceil(M / 16) (td_mm_fill writes the same bytes in any split). The
 * job asks for U chunks, but a pool of one thread runs it as chunk 0 of 1, which
 * then converts every row. A few rows stay on the caller: a job's hand-off
 * costs more than they do. */
#define FILL_PAR_MIN 32
static void fill_run(void *arg, int ith, int nth) {
    const td_mm_in *in = arg;
    int units = (in->M + 15) / 16, u0 = units * ith / nth, u1 = units * (ith + 1) / nth;
    td_mm_fill(in, 16 * u0, 16 * u1 < in->M ? 16 * u1 : in->M);
}

/* Run a product job as mm_chunks chunks per thread (each a whole number of
 * 8-output (AMX, R16: 16-output) blocks of every output, claimed dynamically, so a thread that falls
 * behind — descheduled, or sharing memory bandwidth unevenly — leaves its
 * chunks to the other; cut geometrically, see chunk_units), but no chunk under
 * mm_chunk_min weight bytes nor under one block. A one-token product of at
 * least mm_taper_min bytes (a decode step's, streamed from memory, where each
 * thread's stream has its own share of the bandwidth and a thread left waiting
 * wastes it) takes mm_chunks_1 a thread. Every output element is computed the
 * same way whatever chunk it falls in: the chunk count never changes a bit. */
/* Runs the job; returns 1 when its chunks also filled j->next (see mm_job). */
static int mm_pool_run(td_ctx *c, mm_job *j) {
    /* the input converted once for the act type's kernels: on the caller, or
       shared out by rows when there are many */
    const td_tensor *ws[3];
    for (int i = 0; i < j->n_out; i++) ws[i] = j->o[i].w;
    if (!j->prefilled) {
        td_mm_plan(&j->in, c->p.act_type, ws, j->n_out, j->x, j->K, j->M, j->K, c->xa, c->xq);
        if (c->serial || j->M < FILL_PAR_MIN) td_mm_fill(&j->in, 0, j->M);
        else if (td_mm_converts(&j->in)) td_pool_run_n(c->pool, fill_run, &j->in, (j->M + 15) / 16);
    }
    j->in.stream = c->stream;
    j->in.hw = c->hw;
    if (j->next && (!j->swiglu || !td_mm_converts(j->next) || !td_mm_fills_cols(j->next) || j->o[0].N % 32)) j->next = NULL;
    j->nthreads = 1;
    if (c->serial) { mm_run(j, 0, 1); return j->next != NULL; }
    int nth = j->nthreads = td_pool_size(c->pool);
    size_t bytes = 0;
    int blocks = 1, blk = td_mm_block(&j->in);
    for (int i = 0; i < j->n_out; i++) {
        bytes += td_dtype_row_bytes(j->o[i].w->dtype, j->K) * (size_t)j->o[i].N;
        if ((j->o[i].N + blk - 1) / blk > blocks) blocks = (j->o[i].N + blk - 1) / blk;
    }
    int per = c->chunks_now;
    if (j->M == 1 && bytes >= c->mm_taper_min && c->mm_chunks_1 > per) per = c->mm_chunks_1;
    size_t n = (size_t)nth * (size_t)per;
    if (n > bytes / c->mm_chunk_min) n = bytes / c->mm_chunk_min;
    if (n > (size_t)blocks) n = (size_t)blocks;
    if (n < (size_t)nth) n = (size_t)nth;
    for (size_t i = 1; j->next && i < n; i++) { /* each chunk's first column on a block of 32 */
        int n0, n1;
        mm_chunk_range(j, 0, blk, (int)i, (int)n, &n0, &n1);
        if (n0 >= n1) continue;
        if (n0 % 32) j->next = NULL;
    }
    td_pool_run_n(c->pool, mm_run, j, (int)n);
    return j->next != NULL;
}

/* y[M][N] = x[M][K] W^T   (add: y += x W^T) */
static void matmul_add(td_ctx *c, float *y, int ldy, const float *x, int M, const td_tensor *w, int K, int N, int add) {
    mm_job j = {.c = c, .x = x, .M = M, .K = K, .add = add, .n_out = 1, .o = {{y, ldy, w, N}}};
    mm_pool_run(c, &j);
}
static void matmul(td_ctx *c, float *y, int ldy, const float *x, int M, const td_tensor *w, int K, int N) {
    matmul_add(c, y, ldy, x, M, w, K, N, 0);
}

static void add_bias(float *y, int ld, int M, const td_tensor *b, int N) {
    if (!b->data) return;
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            float bv = b->dtype == TD_DTYPE_F32    ? ((const float *)b->data)[n]
                       : b->dtype == TD_DTYPE_BF16 ? td_bf16_to_f32(((const uint16_t *)b->data)[n])
                                                   : td_f16_to_f32(((const uint16_t *)b->data)[n]);
            y[(size_t)m * ld + n] += bv;
        }
}

typedef struct {
    td_ctx *c; int T; int layer; int n_rows;
    td_mm_in *next;     /* fused schedule by contiguous kv heads: the o product's input, planned over
                           att; each chunk converts its heads' columns of it (attention()), or NULL */
} tok_job;

/* Bytes before cache element el (an offset of kv_head_off's, plus whole rows of
 * head_dim: a multiple of 32, which q8_0's blocks of 32 need): the cache type's
 * row bytes, as the allocation counts them */
static size_t kv_off(const td_ctx *c, size_t el) { return td_dtype_row_bytes(c->p.kv_type, (int64_t)el); }
/* Element offset of (row, layer, kv head)'s position 0 in the caches: a kv
 * head's positions are contiguous (head_dim apart), so attention streams them
 * sequentially. Laid out by position instead ([max_ctx][kv_dim]), one head's
 * keys lay kv_dim elements apart (4 KiB on the 0.6B shape): every key of a head
 * fell into the same few L1/L2 sets, and a pass over K and V of 512 keys missed
 * L2 (forward-notes: 4x slower from cache, 1.7x cold). */
static size_t kv_head_off(const td_ctx *c, int row, int layer, int h) {
    const td_config *cfg = &c->m->cfg;
    return (size_t)row * c->row_stride + ((size_t)layer * cfg->n_kv_head + (size_t)h) * c->kv_cap * cfg->head_dim;
}

/* Token t, kv heads [h0, h1): q/k norm (Qwen3) and RoPE of those kv heads and
 * of the query heads of their groups, then K/V of those heads into the cache. */
static void post_token(td_ctx *c, int layer, int t, int h0, int h1) {
    const td_config *cfg = &c->m->cfg;
    const td_layer_w *L = &c->m->w.layers[layer];
    int hd = cfg->head_dim, half = hd / 2, group = cfg->n_head / cfg->n_kv_head;
    int pos = c->tok_pos[t], row = c->tok_row[t];
    const float *cs = c->rope_cos + (size_t)pos * half, *sn = c->rope_sin + (size_t)pos * half;
    float *q = c->q + (size_t)t * c->q_dim, *k = c->k + (size_t)t * c->kv_dim;
    for (int h = h0 * group; h < h1 * group; h++) {
        if (cfg->qk_norm) td_rmsnorm(q + h * hd, q + h * hd, L->q_norm.data, L->q_norm.dtype, hd, cfg->rms_eps);
        td_rope(q + h * hd, cs, sn, hd);
    }
    for (int h = h0; h < h1; h++) {
        if (cfg->qk_norm) td_rmsnorm(k + h * hd, k + h * hd, L->k_norm.data, L->k_norm.dtype, hd, cfg->rms_eps);
        td_rope(k + h * hd, cs, sn, hd);
    }
    if (c->kv_tile) {
        for (int h = h0; h < h1; h++) {
            size_t lo = kv_head_off(c, row, layer, h);
            td_amx_kv_put((uint16_t *)c->k_cache + lo, (uint16_t *)c->v_cache + lo, pos, k + (size_t)h * hd,
                          c->v + (size_t)t * c->kv_dim + (size_t)h * hd, hd);
        }
        return;
    }
    for (int h = h0; h < h1; h++) {
        size_t off = kv_head_off(c, row, layer, h) + (size_t)pos * hd;
        td_from_f32(c->k_cache + kv_off(c, off), k + (size_t)h * hd, c->p.kv_type, (size_t)hd);
        td_from_f32(c->v_cache + kv_off(c, off), c->v + (size_t)t * c->kv_dim + (size_t)h * hd, c->p.kv_type, (size_t)hd);
    }
}

/* Per token, all heads (the split schedule's first job). With K/V in the tiles'
 * pair layouts two positions share each word of V (td_amx_kv_put writes its
 * half): then per kv head, all tokens, so that no two threads write one word. */
static void qkv_post_run(void *arg, int ith, int nth) {
    tok_job *j = arg;
    int nkv = j->c->m->cfg.n_kv_head;
    if (j->c->kv_tile) {
        int h0 = nkv * ith / nth, h1 = nkv * (ith + 1) / nth;
        if (h0 < h1)
            for (int t = 0; t < j->T; t++) post_token(j->c, j->layer, t, h0, h1);
        return;
    }
    int t0 = j->T * ith / nth, t1 = j->T * (ith + 1) / nth;
    for (int t = t0; t < t1; t++) post_token(j->c, j->layer, t, 0, nkv);
}

/* Attention of tokens [ta, tb) of batch row i for kv head kvh: the group's query
 * heads of those tokens are gathered (token-major) into one td_attend call so
 * they share the K/V loads; each query attends to keys 0..pos of its row. The
 * bits of a query's output do not depend on the others (kernels.h). Scratch is
 * chunk ith's. Tokens beyond ATT_TC are done ATT_TC at a time. */
static void attn_tokens(td_ctx *c, int layer, int ith, int kvh, int ta, int tb) {
    const td_config *cfg = &c->m->cfg;
    int hd = cfg->head_dim, group = cfg->n_head / cfg->n_kv_head;
    float scale = 1.0f / sqrtf((float)hd);
    float *sc = c->scores + (size_t)ith * c->att_qmax * c->kv_cap;
    float *qg = c->qg + (size_t)ith * ATT_TC * c->q_dim, *og = c->og + (size_t)ith * ATT_TC * c->q_dim;
    int *nk = c->nkg + (size_t)ith * ATT_TC * cfg->n_head;
    int row = c->tok_row[ta];
    size_t lo = kv_head_off(c, row, layer, kvh);
    if (c->kv_tile || c->kv_a32) { /* the group's queries of the tokens, 16 (one tile of rows) at a time */
        uint16_t *qt = c->qt + (size_t)ith * c->att_qmax * hd, *pr = c->probs + (size_t)ith * c->att_qmax * c->kv_cap;
        const uint16_t *kp = (const uint16_t *)c->k_cache + lo, *vp = (const uint16_t *)c->v_cache + lo;
        int nq = (tb - ta) * group, qmax = ATT_TC * cfg->n_head < c->att_qmax ? ATT_TC * cfg->n_head : c->att_qmax;
        for (int i0 = 0; i0 < nq; i0 += qmax) { /* qmax: what og and nk hold */
            int n = nq - i0 < qmax ? nq - i0 : qmax;
            for (int i = 0; i < n; i++) {
                int t = ta + (i0 + i) / group, h = kvh * group + (i0 + i) % group;
                const float *qs = c->q + (size_t)t * c->q_dim + (size_t)h * hd;
                float *qf = c->wbuf + (size_t)ith * c->wbuf_stride; /* q_dim >= hd floats */
                for (int d = 0; d < hd; d++) qf[d] = qs[d] * scale;
                td_from_f32(qt + (size_t)i * hd, qf, TD_DTYPE_BF16, (size_t)hd);
                nk[i] = c->tok_pos[t] + 1;
            }
            if (c->kv_tile) td_amx_attend_rows(og, hd, qt, n, kp, vp, hd, nk, sc, pr);
            else td_attend_b32(og, hd, qt, hd, n, nk, kp, vp, hd, hd, sc, pr);
            for (int i = 0; i < n; i++) {
                int t = ta + (i0 + i) / group, h = kvh * group + (i0 + i) % group;
                memcpy(c->att + (size_t)t * c->q_dim + (size_t)h * hd, og + (size_t)i * hd, sizeof(float) * (size_t)hd);
            }
        }
        return;
    }
    for (int t0 = ta; t0 < tb; t0 += ATT_TC) {
        int nt = tb - t0 < ATT_TC ? tb - t0 : ATT_TC, nq = nt * group;
        for (int i = 0; i < nt; i++) {
            memcpy(qg + (size_t)i * group * hd, c->q + (size_t)(t0 + i) * c->q_dim + (size_t)kvh * group * hd,
                   sizeof(float) * (size_t)group * hd);
            for (int g = 0; g < group; g++) nk[i * group + g] = c->tok_pos[t0 + i] + 1;
        }
        td_attend_kv(og, hd, qg, hd, nq, nk, c->k_cache + kv_off(c, lo), c->v_cache + kv_off(c, lo), c->p.kv_type,
                     hd, hd, scale, sc);
        for (int i = 0; i < nt; i++)
            memcpy(c->att + (size_t)(t0 + i) * c->q_dim + (size_t)kvh * group * hd, og + (size_t)i * group * hd,
                   sizeof(float) * (size_t)group * hd);
    }
}

/* Split schedule, second job: units (batch row, kv head, block of ATT_TC tokens),
 * dealt round-robin (in a causal prefill later blocks have more keys). */
static void attn_run(void *arg, int ith, int nth) {
    tok_job *j = arg;
    td_ctx *c = j->c;
    int nkv = c->m->cfg.n_kv_head, u = 0;
    for (int i = 0; i < j->n_rows; i++)
        for (int b = 0; b < c->brow_n[i]; b += ATT_TC)
            for (int h = 0; h < nkv; h++, u++) {
                if (u % nth != ith) continue;
                int ta = c->brow_t0[i] + b, tb = ta + (c->brow_n[i] - b < ATT_TC ? c->brow_n[i] - b : ATT_TC);
                attn_tokens(c, j->layer, ith, h, ta, tb);
            }
}

/* One unit of the fused schedule: batch row i's new tokens, kv head h. */
static void attn_unit(td_ctx *c, int layer, int ith, int i, int h) {
    int ta = c->brow_t0[i], tb = ta + c->brow_n[i];
    for (int t = ta; t < tb; t++) post_token(c, layer, t, h, h + 1);
    attn_tokens(c, layer, ith, h, ta, tb);
}

/* Fused schedule, one job: units (batch row, kv head); a unit post-processes
 * its head for all the row's new tokens, then runs their attention — it reads
 * only K/V it wrote itself or that earlier forwards wrote, so no barrier is
 * needed between the two. When the kv heads divide evenly, chunk ith takes
 * kv heads [nkv ith / nth, nkv (ith + 1) / nth) of every row: the heads whose
 * q/k/v outputs the same chunk of the q/k/v product job computed (mm_run gives
 * chunk ith that share of every output range, exactly where its 8- or 16-output
 * blocks fall on head boundaries, as at head_dim 64 or 128), so they are read
 * from its own caches, and its K/V rows lie together (0.6B shape, 8 kv heads, 2 threads:
 * a T = 8 forward ~2% faster than with units dealt round-robin; the same bits).
 * Otherwise units are dealt round-robin. */
static void fused_attn_run(void *arg, int ith, int nth) {
    tok_job *j = arg;
    td_ctx *c = j->c;
    int nkv = c->m->cfg.n_kv_head;
    if (nkv % nth == 0) {
        int h0 = nkv * ith / nth, h1 = nkv * (ith + 1) / nth, qw = c->m->cfg.n_head / nkv * c->m->cfg.head_dim;
        for (int h = h0; h < h1; h++)
            for (int i = 0; i < j->n_rows; i++) attn_unit(c, j->layer, ith, i, h);
        if (j->next) td_mm_fill_cols(j->next, h0 * qw, h1 * qw); /* these heads' outputs, still in cache */
        return;
    }
    for (int u = ith; u < j->n_rows * nkv; u += nth) attn_unit(c, j->layer, ith, u / nkv, u % nkv);
}

/* Post-processing and attention of one layer. The fused schedule costs one pool
 * job instead of two, but has only (rows x kv heads) units: it is used when
 * those keep every thread equally busy. Both give the same bits. */
static int attention(td_ctx *c, int T, int layer, int n_rows, td_mm_in *next) {
    tok_job tj = {c, T, layer, n_rows, NULL};
    const td_config *cfg = &c->m->cfg;
    int nth = c->serial ? 1 : td_pool_size(c->pool), units = n_rows * cfg->n_kv_head;
    if (units % nth == 0 || units >= 4 * nth) {
        /* by contiguous kv heads, each chunk also converts its heads' columns of
           the o product's input (whole blocks of 32 where a group's width is) */
        if (next && cfg->n_kv_head % nth == 0 && cfg->n_head / cfg->n_kv_head * cfg->head_dim % 32 == 0 &&
            td_mm_converts(next) && td_mm_fills_cols(next))
            tj.next = next;
        run_job(c, fused_attn_run, &tj);
        return tj.next != NULL;
    } else {
        run_job(c, qkv_post_run, &tj);
        /* new K/V are in the cache: row lengths as seen by attention include them */
        run_job(c, attn_run, &tj);
    }
    return 0;
}

typedef struct { td_ctx *c; int T; const td_tensor *w; float *dst; const float *src; int n; } norm_job;

static void norm_run(void *arg, int ith, int nth) {
    norm_job *j = arg;
    const td_config *cfg = &j->c->m->cfg;
    int t0 = j->T * ith / nth, t1 = j->T * (ith + 1) / nth;
    for (int t = t0; t < t1; t++)
        td_rmsnorm(j->dst + (size_t)t * j->n, j->src + (size_t)t * j->n, j->w->data, j->w->dtype, j->n, cfg->rms_eps);
}

static void rmsnorm_rows(td_ctx *c, float *dst, const float *src, int T, const td_tensor *w, int n) {
    norm_job j = {c, T, w, dst, src, n};
    if (T <= NORM_INLINE_T) norm_run(&j, 0, 1); /* less work than a pool round trip */
    else run_job(c, norm_run, &j);
}

/* ---- forward ----------------------------------------------------------- */

int td_ctx_forward(td_ctx *c, const td_batch *b, float *logits, float *taps, td_err *err) {
    if (!c || !b || (!logits && !b->skip_logits)) return td_seterr(err, TD_EINVAL, "td_ctx_forward: NULL argument");
    const td_config *cfg = &c->m->cfg;
    const td_weights *W = &c->m->w;
    if (b->n_rows < 1 || b->n_rows > c->p.max_rows || !b->rows || !b->n_tokens || (!b->tokens && !b->embd))
        return td_seterr(err, TD_EINVAL, "batch: n_rows %d out of range [1, %d] or missing arrays", b->n_rows, c->p.max_rows);
    if (b->n_taps < 0 || (b->n_taps > 0 && (!b->taps || !taps)))
        return td_seterr(err, TD_EINVAL, "batch: taps requested without tap layers or output buffer");
    for (int i = 0; i < b->n_taps; i++)
        if (b->taps[i] < 0 || b->taps[i] > cfg->n_layer)
            return td_seterr(err, TD_ERANGE, "batch: tap layer %d out of range [0, %d]", b->taps[i], cfg->n_layer);
    int T = 0;
    for (int i = 0; i < b->n_rows; i++) {
        int r = b->rows[i], n = b->n_tokens[i];
        if (r < 0 || r >= c->p.max_rows || !c->row_used[r])
            return td_seterr(err, TD_EINVAL, "batch: row %d is not a live row", r);
        for (int k = 0; k < i; k++)
            if (b->rows[k] == r) return td_seterr(err, TD_EINVAL, "batch: row %d appears twice", r);
        if (n < 1) return td_seterr(err, TD_EINVAL, "batch: row %d has %d new tokens (need >= 1)", r, n);
        if (n > c->p.max_tokens - T)
            return td_seterr(err, TD_ERANGE, "batch: more than max_tokens=%d new tokens", c->p.max_tokens);
        if (n > c->p.max_ctx - c->row_len[r])
            return td_seterr(err, TD_EFULL, "batch: row %d would hold %d positions, context is %d",
                             r, c->row_len[r] + n, c->p.max_ctx);
        c->brow_t0[i] = T;
        c->brow_n[i] = n;
        for (int k = 0; k < n; k++) {
            c->tok_row[T + k] = r;
            c->tok_pos[T + k] = c->row_len[r] + k;
        }
        T += n;
    }
    c->serial = T <= c->p.serial_tokens;
    /* the products' schedule: chosen by measured time for decode and verify sizes */
    int arm = 0;
    td_hwsel *sel = sched_pick(c, T, &arm);
    double t_start = sel ? td_now() : 0;
    int n_out = 0;
    for (int t = 0; t < T && !b->embd; t++) {
        int32_t id = b->tokens[t];
        if (id < 0 || id >= cfg->n_vocab)
            return td_seterr(err, TD_ERANGE, "batch: token id %d out of range [0, %d)", (int)id, cfg->n_vocab);
    }
    if (b->want) {
        for (int t = 0; t < T; t++)
            if (b->want[t]) {
                if (n_out >= c->p.max_logits && !b->skip_logits)
                    return td_seterr(err, TD_ERANGE, "batch: more than max_logits=%d positions want logits", c->p.max_logits);
                c->out_tok[n_out++] = t;
            }
    } else {
        if (b->n_rows > c->p.max_logits && !b->skip_logits)
            return td_seterr(err, TD_ERANGE, "batch: more than max_logits=%d positions want logits", c->p.max_logits);
        int t = 0;
        for (int i = 0; i < b->n_rows; i++) { t += b->n_tokens[i]; c->out_tok[n_out++] = t - 1; }
    }

    int D = cfg->n_embd, F = cfg->n_ff;
    /* embeddings */
    size_t erow = td_dtype_row_bytes(W->tok_embd.dtype, D); /* bytes per embedding row */
    if (b->embd)
        memcpy(c->x, b->embd, sizeof(float) * (size_t)T * D);
    else
        for (int t = 0; t < T; t++)
            td_to_f32(c->x + (size_t)t * D, (const char *)W->tok_embd.data + (size_t)b->tokens[t] * erow,
                      W->tok_embd.dtype, (size_t)D);
    for (int ti = 0; ti < b->n_taps; ti++)
        if (b->taps[ti] == 0)
            for (int o = 0; o < n_out; o++)
                memcpy(taps + ((size_t)o * b->n_taps + ti) * D, c->x + (size_t)c->out_tok[o] * D, sizeof(float) * D);

    for (int l = 0; l < cfg->n_layer; l++) {
        const td_layer_w *L = &W->layers[l];
        rmsnorm_rows(c, c->xb, c->x, T, &L->attn_norm, D);
        {
            mm_job j = {.c = c, .x = c->xb, .M = T, .K = D, .n_out = 3,
                        .o = {{c->q, c->q_dim, &L->wq, c->q_dim}, {c->k, c->kv_dim, &L->wk, c->kv_dim},
                              {c->v, c->kv_dim, &L->wv, c->kv_dim}}};
            mm_pool_run(c, &j);
        }
        if (cfg->attn_bias) {
            add_bias(c->q, c->q_dim, T, &L->bq, c->q_dim);
            add_bias(c->k, c->kv_dim, T, &L->bk, c->kv_dim);
            add_bias(c->v, c->kv_dim, T, &L->bv, c->kv_dim);
        }
        {
            /* the o product's input is converted by the attention job's chunks, each
               its own heads' columns (no pass on the caller) where they split so */
            td_mm_in next;
            const td_tensor *wo = &L->wo;
            td_mm_plan(&next, c->p.act_type, &wo, 1, c->att, c->q_dim, T, c->q_dim, c->xa, c->xq);
            int filled = attention(c, T, l, b->n_rows, &next);
            int bo = cfg->attn_bias && L->bo.data;
            /* x += att Wo^T (the same bits as into xb and then added), or with o's bias */
            mm_job jo = {.c = c, .x = c->att, .M = T, .K = c->q_dim, .add = !bo, .n_out = 1,
                         .o = {{bo ? c->xb : c->x, D, &L->wo, D}}, .in = next, .prefilled = filled};
            mm_pool_run(c, &jo);
            if (bo) {
                add_bias(c->xb, D, T, &L->bo, D);
                for (size_t i = 0; i < (size_t)T * D; i++) c->x[i] += c->xb[i];
            }
        }
        rmsnorm_rows(c, c->xb, c->x, T, &L->ffn_norm, D);
        {
            /* the down product's input is converted by the gate/up job's chunks,
               each its own columns right after its swiglu (no pass on the caller) */
            td_mm_in next;
            const td_tensor *wd = &L->w_down;
            td_mm_plan(&next, c->p.act_type, &wd, 1, c->hg, F, T, F, c->xa2, c->xq2);
            mm_job j = {.c = c, .x = c->xb, .M = T, .K = D, .swiglu = 1, .n_out = 2, .next = &next,
                        .o = {{c->hg, F, &L->w_gate, F}, {c->hu, F, &L->w_up, F}}};
            int filled = mm_pool_run(c, &j);
            mm_job jd = {.c = c, .x = c->hg, .M = T, .K = F, .add = 1, .n_out = 1, .o = {{c->x, D, &L->w_down, D}},
                         .in = next, .prefilled = filled};
            mm_pool_run(c, &jd); /* x += h Wdown^T */
        }
        for (int ti = 0; ti < b->n_taps; ti++)
            if (b->taps[ti] == l + 1)
                for (int o = 0; o < n_out; o++)
                    memcpy(taps + ((size_t)o * b->n_taps + ti) * D, c->x + (size_t)c->out_tok[o] * D, sizeof(float) * D);
    }
    for (int o = 0; o < n_out && !b->skip_logits; o++)
        td_rmsnorm(c->xo + (size_t)o * D, c->x + (size_t)c->out_tok[o] * D, W->out_norm.data, W->out_norm.dtype, D, cfg->rms_eps);
    if (!b->skip_logits) matmul(c, logits, cfg->n_vocab, c->xo, n_out, &W->lm_head, D, cfg->n_vocab);
    for (int i = 0; i < b->n_rows; i++) c->row_len[b->rows[i]] += b->n_tokens[i];
    if (sel) td_hwsel_record(sel, arm, td_now() - t_start);
    return 0;
}
