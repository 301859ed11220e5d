/* block — a DFlash-style block drafter with DSpark's options: one forward
 * drafts a whole block, conditioned on tapped hidden states of a few target
 * layers (the arithmetic is defined in tools/train/block.py).
 *
 * Context: for every committed position p the target's taps of the layers in
 * config.json's tap_layers, concatenated, are projected once (fc, then the
 * hidden_norm RMSNorm) into c_p, and every drafter layer l stores
 *   K^l_p = RoPE_p(k_norm(Wk^l c_p)),  V^l_p = Wv^l c_p
 * in the row's context rows. Rows grow only at commit (the accepted window's
 * taps) and at append (the prompt's taps): rejected positions never enter.
 * The prompt is projected at append; committed windows wait as raw taps in the
 * row's bounded backlog (BLK_BACKLOG positions) and are projected, all rows
 * together, when the row next drafts (so a row the planner keeps at depth 0
 * costs a copy per round, and catching up is charged to drafting), when it is
 * captured, or when the backlog is full. Projection is per position, so the
 * values do not depend on when it happens.
 * Block: G = block_size entries at positions L..L+G-1 (L = committed length):
 * the anchor E[pending] and G-1 copies of E[mask_token_id]; each layer is a
 * Qwen3 decoder layer whose queries attend to all context rows and to all G
 * block entries (no causal mask inside the block). A row asked for k < G-1
 * drafts runs a shorter block, the anchor and k masks (g = k + 1 entries, its
 * own whatever the other rows ask): the cost follows the depth (the drafter
 * declares step_extra = 1, the anchor's entry), and its drafts differ from a
 * full block's only through the later masks they no longer attend to (on the
 * code prompts, acceptance by position measured the same; bench/forward-notes.md).
 * At k = G-1 it is the reference's block exactly. z_j = norm(x_j), j >= 1:
 *   confidence_j = sigmoid(w . z_j + b)           (P(drafts 1..j accepted))
 *   logits_j = lm_head(z_j) + markov.out @ markov.embed[prev_j]
 * with prev_1 = the anchor, prev_j = d_{j-1}; lm_head and E are the target's
 * (shared, never copied). A drafter with a chain head (config chain_hidden
 * C > 0) lets draft j see the draft before it — a block's positions are
 * otherwise drafted in parallel: s_0 = 0,
 *   s_j = silu(chain.inp([z_j ; enorm(E[prev_j])]) + chain.rec(s_{j-1}))
 *   u_j = z_j + chain.out(s_j)
 * and u_j takes z_j's place in the confidence and the LM head; its drafts
 * then run step by step, all rows' products together (chain_draft).
 * Pruning: the round keeps the leading drafts whose confidence reaches
 * config.json's prune_thresholds[j-1], so a row may draft fewer than asked
 * (spec option prune=off keeps them all). The LM head runs over the kept
 * positions only (without a chain once, with one a step at a time); the
 * Markov bias is added in order.
 * A draft vocabulary (spec option vocab=N, spec/vocab.h) keeps N ids of the
 * shared LM head and of the Markov output — the first N of DIR/draft_vocab.json's
 * ranking, else ids 0..N-1 — plus each row's context ids (ids of its prompt and
 * committed output outside those N, whose LM-head and markov.out rows it gathers
 * as they appear): a greedy draft is the argmax over both, every logit the
 * same two dots as the full head's; sampled drafts (q) come from the N kept ids
 * and are zero beyond. The target's verification keeps the output exact.
 * Option quant=q8_0|q4_0 quantizes the drafter's own matrices (fc, its
 * layers' and its chain's) in memory, and with vocab=N its copy of the N kept
 * LM-head rows; the target's LM head stays as it is. When the target's
 * context runs act_type amx, the products with bf16 weights run on the AMX
 * tiles too (nn/amx.h), Q8_0 and Q4_0 ones on their R16 repacks, and where the CPU has
 * AMX-INT8 those of 3 or more entries on int8 copies (td_tensor.ip, nn/i8t.h);
 * the block's attention runs on the tiles as well (att_amx_run: each row then
 * keeps its context keys and values also in bf16, in the tiles' pair layouts,
 * and a round's block entries go into a copy of the last chunk, so the
 * committed ones are written once). Under act_type bf16 the products follow
 * the target's too (bf16 weights in the B32 order on bf16 activations, Q8_0
 * ones on their R16 repacks), and so does the attention where head_dim is a
 * multiple of 32: the A32 order (td_attend_b32) over a bf16 mirror of each
 * row's keys and values, the block entries written into the mirror only
 * (fixed depth 7, 20 code prompts, Zen 5: 142 -> 99-107 us of attention a
 * round against the f32 td_attend; bench/forward-notes.md, "Stop 38"). Under an
 * f32 target the quantized matrices take their R16 repacks as well (the rest
 * stays f32): a block of entries costs less there than in the Q16 order. A checkpoint
 * holds projected K/V, so one taken under another quant= restores fine but
 * drafts slightly differently until its rows are re-projected (the output
 * stays exact either way).
 * Rows own their context K/V ([layer][kv head][position][head_dim], with room
 * for G block entries past the committed length, written during a draft and
 * overwritten by the next commit; always f32, whatever the target's kv_type —
 * they are small and their checkpoints are f32). Matrix products run on the target
 * context's thread pool (drafting and verifying never overlap; a second pool's
 * spinning workers would take the cores from the target's).
 * Prompt lookup (option lookup=N, greedy drafts), as the model and MTP
 * drafters have it: each row keeps its committed token stream; a row whose
 * last tokens (with the pending one) recurred earlier in it proposes what
 * followed them (td_draft_lookup) — offered before the group plans the round
 * (rows_vt.offer), and a row served so comes to draft() at depth 0 and skips
 * the block forward.
 * Checkpoints ("block-v3") hold a row's token stream, context K/V and context
 * ids, checked for size, finiteness and range on restore; "block-v2" ones (no
 * stream) still restore, with an empty stream (lookup finds nothing in it
 * until the row commits tokens). */
#define _POSIX_C_SOURCE 200809L
#include "spec/draft.h"
#include "spec/vocab.h"
#include "io/safetensors.h"
#include "model/model.h"
#include "nn/amx.h"
#include "nn/kernels.h"
#include "nn/mmx.h"
#include "nn/pool.h"
#include "nn/q8r.h"
#include "nn/quant.h"
#include "util/util.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BLK_CHUNK 64   /* context positions projected per pass */
#define BLK_MAX_TAPS 8
#define BLK_MAX_LAYERS 64 /* drafter layers */
#define BLK_MAX_G 17   /* anchor + TD_SPEC_MAX_DEPTH drafts */
#define BLK_TAIL 64    /* positions of the copied last chunk(s) amx attention writes block entries into:
                          31 committed ones and BLK_MAX_G entries, in whole 32-key chunks */
#define BLK_BACKLOG 128 /* committed positions a row keeps unprojected (raw taps) at most */

typedef struct {
    const td_model *target;   /* borrowed */
    td_draft_weights w;       /* owned mappings (one file or shards) */
    int D, V, n_layer, H, KVH, hd, F, G, mask_id, rank, n_taps, taps[BLK_MAX_TAPS];
    float eps;
    double theta;
    td_tensor fc, hidden_norm, norm;   /* fc [D][n_taps*D] */
    td_layer_w *L;                     /* [n_layer] owned array of views */
    td_tensor mk_embed, mk_out;        /* [V][rank], or absent (rank 0) */
    td_tensor conf_w, conf_b;          /* [1][D], [1], or absent */
    int C;                             /* chain_hidden: the chain head's width, 0 = none */
    td_tensor ch_enorm, ch_inp, ch_rec, ch_out; /* [D], [C][2D], [C][C], [D][C], or absent */
    float thr[BLK_MAX_G];              /* prune thresholds [G-1] */
    int n_thr, prune;
    void *qarena;                      /* owned: the quantized matrices, or NULL */
    void *rarena;                      /* owned: their R16 repacks (a target context of act_type amx or bf16), or NULL */
    void *iarena;                      /* owned: their int8 copies (td_tensor.ip, AMX-INT8), or NULL */
    int repacked;                      /* 1: td_draft_repack_q8r ran (the first group under act_type amx or bf16) */
    td_tensor head;                    /* the target's LM head cut to the draft vocabulary
                                          (a view, or voc's gathered rows) [n_sub][D] */
    td_draft_vocab voc;                /* the draft vocabulary over the LM head (spec/vocab.h) */
    td_draft_vocab mvoc;               /* the same ids over markov.out (mk_out cut likewise) */
    float *mkp;                        /* owned: mk_out's n_sub rows as f32 panels (td_panel16_pack) */
    int n_sub;                         /* = voc.n_sub (V when no vocab=N) */
    int lookup;                        /* option lookup=N: prompt lookup of n-grams of N..TD_LOOKUP_MAX tokens first; 0 = off */
} blk_provider;

typedef struct {
    float *K, *V;             /* [n_layer][KVH][cap][hd] context rows (+ block scratch) */
    uint16_t *Kh, *Vh;        /* A32 attention (g->b32_att): K and V rounded to bf16, rows as K's,
                                 capb of them per (layer, kv head); zeroed at first, so the pair
                                 partner an odd key count reads past the last key is finite */
    uint16_t *Kp, *Vp;        /* amx attention (g->amx_att): K and V rounded to bf16 in the tiles' pair
                                 layouts (td_amx_kp_at, td_amx_vp_at), [n_layer][KVH][capp*hd]; else NULL */
    int len, cap;             /* committed positions projected into K/V; capacity incl. G */
    float *raw;               /* [BLK_BACKLOG][n_taps*D] taps of committed positions len..len+n_raw-1,
                                 not projected yet (projected when the row drafts, is captured,
                                 or the backlog is full) */
    int n_raw;
    td_draft_ctxids cx;       /* context ids outside the draft vocabulary: LM-head rows */
    td_draft_ctxids mx;       /* the same ids' markov.out rows (rank > 0) */
    int32_t *stream;          /* [cap + 1] committed tokens (prompt, then each commit's), for lookup= */
    int slen;
} blk_row;

typedef struct {
    const blk_provider *p;
    td_pool *pool;            /* the target context's (borrowed), or owned without one */
    int own_pool;
    td_sampler *smp;          /* owned */
    blk_row *rows;            /* [max_rows] */
    blk_row *spare;           /* [max_rows] buffers of rows that left (K, V, Kp, Vp, raw, stream; owned),
                                 which the next rows to join take instead of fresh allocations: their
                                 pages are already mapped, so a row's first positions cost no page
                                 faults (one fault per 16 positions of each layer and head's K and V
                                 otherwise, measured at ~0.2 ms a round with rows joining per prompt) */
    int n_spare;
    int n_rows, max_rows, max_ctx, max_depth, cap, max_tok;
    float *rcos, *rsin;       /* [cap][hd/2] RoPE table */
    float *x, *n, *q, *kb, *vb, *o, *g, *u; /* [max_tok][...] activations (see open_rows) */
    float *tb;                /* [max_tok][n_taps*D] gathered taps of committed positions */
    float *ckv;               /* [2*n_layer][max_tok][KVH*hd] their K and V, by layer */
    int act;                  /* the target context's act_type when it is TD_ACT_AMX or TD_DTYPE_BF16,
                                 else TD_DTYPE_F32 */
    uint16_t *xa;             /* act amx or bf16: [td_mm_xa_elems(max_tok, kmax)] a product's input
                                 packed for the AMX tiles or rounded to bf16, else NULL */
    uint8_t *xq;              /* act amx or bf16, quant=q8_0 or q4_0: [max_tok] rows of td_q8r_row_bytes(kmax), a
                                 product's input quantized for the R16 repacks, else NULL */
    blk_row **crow;           /* [max_rows] a commit's rows, */
    const float **ctap;       /* [max_rows] their taps */
    int *cn;                  /* [max_rows] and their position counts */
    float *lg;                /* [max_rows*(G-1)][n_sub] logits of kept positions */
    float *a;                 /* [rank] Markov input */
    float *qsub;              /* [n_sub] q over the draft vocabulary, before it is spread */
    float *cl;                /* [BLK_MAX_G][TD_DRAFT_CTXIDS] context ids' logits, per draft position */
    float *scratch;           /* [pool threads][sstride]: a thread's attention scores [TD_ATTEND_QMAX][cap],
                                 gathered queries and outputs [2][TD_ATTEND_QMAX][hd] */
    size_t sstride;           /* floats */
    int amx_att, capp;        /* 1: the block's attention runs on the AMX tiles (act amx, hd % 32 == 0);
                                 capp = cap rounded up to 32 */
    int b32_att, capb;        /* 1: the block's attention takes the A32 order (act bf16, hd % 32 == 0:
                                 td_attend_b32, as the target's does); capb = cap rounded up to even */
    uint16_t *bscr;           /* A32 attention: [pool threads][TD_ATTEND_QMAX*(capb + hd)] a call's
                                 probabilities and scaled queries in bf16 */
    float *ascr;              /* amx attention: [pool threads][nqm*hd + TD_AMX_ATTEND_QMAX*capp] a kv head's outputs
                                 and scores (nqm = (H/KVH)*G queries) */
    uint16_t *apk;            /* amx attention: [pool threads][nqm*hd + TD_AMX_ATTEND_QMAX*capp] its queries and
                                 probabilities in bf16 */
    int *brow;                /* [max_rows] rows drafting this round */
    int *bdepth;              /* [max_rows] this round's block depth per row (0 where a lookup served) */
    int *bg, *boff;           /* [max_rows] per drafting row b: its block entries (<= G) and the
                                 first of them in the round's stacked activations */
    float *cz;                /* chain (C > 0): [max_rows][2D] a step's inputs [z ; enorm(E[prev])] */
    float *ca, *cg, *cs;      /* [max_rows][C] a step's states and the previous ones (both in step
                                 order), and [max_rows][C] the states by row b */
    float *cu;                /* [max_rows][D] a step's u = z + out(s) */
    float *cone;              /* [C] ones: silu(a) = td_swiglu(a, ones), vectorized */
    int *cact;                /* [max_rows] the rows b still drafting, in step order */
    int32_t *cprev;           /* [max_rows] by row b: the token before the step's position */
} blk_group;

/* ---- matrix products on the group's pool (nn/mmx.h: outputs split in chunks
 * of 8, 16 on AMX tiles and R16). Under the target's act_type amx or bf16 the
 * products with bf16 weights take their input packed once (on the caller) for
 * the tiles or rounded to bf16, and Q8_0 / Q4_0 weights (quant=) their R16
 * repacks, as the target's do; drafts then move a little, the output stays
 * exact. */
/* y[M][N] (+)= x[M][K] W^T */
static void mm(blk_group *g, float *y, int ldy, const float *x, int ldx, int M, const td_tensor *w, int K, int N, int add) {
    td_mm_part part = {y, ldy, w, N};
    td_mm_parts(g->pool, g->act, x, ldx, M, K, &part, 1, add, g->xa, g->xq);
}

static size_t kv_at(const blk_group *g, int l, int h, int pos) {
    return (((size_t)l * g->p->KVH + h) * g->cap + pos) * g->p->hd;
}
/* the same position's bf16 mirror (b32_att) */
static size_t kvb_at(const blk_group *g, int l, int h, int pos) {
    return (((size_t)l * g->p->KVH + h) * g->capb + pos) * g->p->hd;
}

/* Store position pos's key k[hd] and value v[hd] of layer l, kv head h in row
 * r, and their bf16 mirrors where the attention takes the A32 order (Kh, Vh)
 * or runs on the tiles (Kp, Vp). */
static void kv_put(const blk_group *g, blk_row *r, int l, int h, int pos, const float *k, const float *v) {
    int hd = g->p->hd;
    size_t at = kv_at(g, l, h, pos);
    memcpy(r->K + at, k, sizeof(float) * (size_t)hd);
    memcpy(r->V + at, v, sizeof(float) * (size_t)hd);
    if (r->Kh) {
        size_t bt = kvb_at(g, l, h, pos);
        td_from_f32(r->Kh + bt, k, TD_DTYPE_BF16, (size_t)hd);
        td_from_f32(r->Vh + bt, v, TD_DTYPE_BF16, (size_t)hd);
    }
    if (!r->Kp) return;
    size_t lh = ((size_t)l * g->p->KVH + h) * g->capp * hd;
    td_amx_kv_put(r->Kp + lh, r->Vp + lh, pos, k, v, hd);
}

/* Append context positions to several rows at once: row rr[i] gets n[i]
 * positions whose taps are tp[i] ([n[i]][n_taps*D]), at its r->len; the sum of
 * n[i] is at most max_tok. The rows' taps are gathered so that the fc product
 * and all layers' K and V products run as two pool jobs whatever the row count
 * (a commit at batch 8 would otherwise cost 8 x (1 + 2 n_layer) small jobs). */
static void project_batch(blk_group *g, int nr, blk_row *const *rr, const float *const *tp, const int *n) {
    const blk_provider *p = g->p;
    int D = p->D, hd = p->hd, KW = p->KVH * hd, half = hd / 2, TW = p->n_taps * D, M = 0;
    for (int i = 0; i < nr; i++) {
        memcpy(g->tb + (size_t)M * TW, tp[i], sizeof(float) * (size_t)n[i] * TW);
        M += n[i];
    }
    if (!M) return;
    mm(g, g->x, D, g->tb, TW, M, &p->fc, TW, D, 0);
    for (int t = 0; t < M; t++)
        td_rmsnorm(g->x + (size_t)t * D, g->x + (size_t)t * D, p->hidden_norm.data, p->hidden_norm.dtype, D, p->eps);
    td_mm_part part[2 * BLK_MAX_LAYERS];
    size_t mt = (size_t)g->max_tok;
    for (int l = 0; l < p->n_layer; l++) {
        part[2 * l] = (td_mm_part){g->ckv + (size_t)(2 * l) * mt * KW, KW, &p->L[l].wk, KW};
        part[2 * l + 1] = (td_mm_part){g->ckv + (size_t)(2 * l + 1) * mt * KW, KW, &p->L[l].wv, KW};
    }
    td_mm_parts(g->pool, g->act, g->x, D, M, D, part, 2 * p->n_layer, 0, g->xa, g->xq);
    int t = 0;
    for (int i = 0; i < nr; i++) {
        blk_row *r = rr[i];
        for (int c = 0; c < n[i]; c++, t++) {
            int pos = r->len + c;
            for (int l = 0; l < p->n_layer; l++) {
                const td_layer_w *L = &p->L[l];
                float *kb = g->ckv + (size_t)(2 * l) * mt * KW + (size_t)t * KW;
                const float *vb = g->ckv + (size_t)(2 * l + 1) * mt * KW + (size_t)t * KW;
                for (int h = 0; h < p->KVH; h++) {
                    float *k = kb + (size_t)h * hd;
                    td_rmsnorm(k, k, L->k_norm.data, L->k_norm.dtype, hd, p->eps);
                    td_rope(k, g->rcos + (size_t)pos * half, g->rsin + (size_t)pos * half, hd);
                    kv_put(g, r, l, h, pos, k, vb + (size_t)h * hd);
                }
            }
        }
        r->len += n[i];
    }
}

/* Project n context positions (taps [n][n_taps*D]) of row r into its K/V at r->len.. */
static void project_context(blk_group *g, blk_row *r, const float *taps, int n) {
    for (int done = 0; done < n;) {
        int m = n - done < g->max_tok ? n - done : g->max_tok;
        const float *tp = taps + (size_t)done * g->p->n_taps * g->p->D;
        project_batch(g, 1, &r, &tp, &m);
        done += m;
    }
}

/* Project the backlogs of rows idx[0..n) (group row indices), all rows together
 * in batches of at most max_tok positions (a long backlog spans batches). The
 * values per position are those an immediate projection gives: every product
 * is batch invariant and RoPE reads the position's own angles. */
static void flush_backlogs(blk_group *g, const int *idx, int n) {
    int TW = g->p->n_taps * g->p->D, nr = 0, tot = 0;
    for (int i = 0; i < n; i++) {
        blk_row *r = &g->rows[idx[i]];
        for (int done = 0; done < r->n_raw;) {
            int m = r->n_raw - done;
            if (m > g->max_tok - tot) m = g->max_tok - tot;
            g->crow[nr] = r; g->ctap[nr] = r->raw + (size_t)done * TW; g->cn[nr] = m;
            nr++; tot += m; done += m;
            if (tot == g->max_tok || nr == g->max_rows) { project_batch(g, nr, g->crow, g->ctap, g->cn); nr = tot = 0; }
        }
        r->n_raw = 0;
    }
    if (nr) project_batch(g, nr, g->crow, g->ctap, g->cn);
}

static void row_free(blk_row *r) {
    free(r->K);
    free(r->V);
    free(r->Kh);
    free(r->Vh);
    free(r->Kp);
    free(r->Vp);
    free(r->raw);
    free(r->stream);
    td_draft_ctxids_free(&r->cx);
    td_draft_ctxids_free(&r->mx);
    memset(r, 0, sizeof *r);
}

/* A row leaves: its context ids go, its buffers become a spare for the next
 * row to join (nothing in them is read before that row writes it: positions
 * past its length are never read, and the amx mirrors' stale values are
 * finite, as zeros were). */
static void row_release(blk_group *g, blk_row *r) {
    td_draft_ctxids_free(&r->cx);
    td_draft_ctxids_free(&r->mx);
    if (g->n_spare < g->max_rows) {
        g->spare[g->n_spare++] = *r;
        memset(r, 0, sizeof *r);
    } else {
        row_free(r);
    }
}

static int row_alloc(blk_group *g, blk_row *r) {
    const blk_provider *p = g->p;
    size_t n = (size_t)p->n_layer * p->KVH * g->cap * p->hd;
    td_err e;
    memset(r, 0, sizeof *r);
    if (g->n_spare > 0) { /* a spare's buffers, sized for this group */
        blk_row *s = &g->spare[--g->n_spare];
        r->K = s->K, r->V = s->V, r->Kh = s->Kh, r->Vh = s->Vh, r->Kp = s->Kp, r->Vp = s->Vp, r->raw = s->raw,
        r->stream = s->stream;
        memset(s, 0, sizeof *s);
        r->cap = g->cap;
        if (td_draft_ctxids_init(&r->cx, &p->voc, &e) != 0 || (p->rank && td_draft_ctxids_init(&r->mx, &p->mvoc, &e) != 0)) {
            row_free(r);
            return TD_ENOMEM;
        }
        return 0;
    }
    r->K = malloc(sizeof(float) * n);
    r->V = malloc(sizeof(float) * n);
    r->raw = malloc(sizeof(float) * BLK_BACKLOG * (size_t)p->n_taps * p->D);
    r->stream = malloc(sizeof(int32_t) * ((size_t)g->cap + 1));
    r->cap = g->cap;
    if (g->amx_att) { /* zeroed: values past a row's length in its last chunk meet probabilities of 0, finite */
        size_t na = (size_t)p->n_layer * p->KVH * p->hd * g->capp;
        r->Kp = calloc(na, sizeof(uint16_t));
        r->Vp = calloc(na, sizeof(uint16_t));
    }
    if (g->b32_att) { /* zeroed: an odd key count pairs its last key with the next row, times 0 */
        size_t na = (size_t)p->n_layer * p->KVH * p->hd * g->capb;
        r->Kh = calloc(na, sizeof(uint16_t));
        r->Vh = calloc(na, sizeof(uint16_t));
    }
    if ((g->amx_att && (!r->Kp || !r->Vp)) || (g->b32_att && (!r->Kh || !r->Vh)) || !r->K || !r->V || !r->raw || !r->stream || td_draft_ctxids_init(&r->cx, &p->voc, &e) != 0 ||
        (p->rank && td_draft_ctxids_init(&r->mx, &p->mvoc, &e) != 0)) {
        row_free(r);
        return TD_ENOMEM;
    }
    return 0;
}

/* Note stream tokens as context ids (LM-head and Markov rows alike, same order). */
static void row_note(const blk_provider *p, blk_row *r, const int32_t *t, int n) {
    td_draft_ctxids_note(&p->voc, &r->cx, t, n);
    if (p->rank) td_draft_ctxids_note(&p->mvoc, &r->mx, t, n);
}

/* checkpoint "block-v3": [int32 len][int32 n_layer][int32 KVH*hd][int32 n_ids]
 * [int32 n_stream], the row's token stream (int32 [n_stream]), then for each
 * position, layer, kv head: K[hd] then V[hd] (float32), then the row's context
 * ids (int32 [n_ids], in the order they were noted). "block-v2" is the same
 * without n_stream and the stream. */
static int blk_append(void *gv, const int32_t *tokens, int n, const float *taps,
                      const td_draft_checkpoint *ck, td_err *err) {
    blk_group *g = gv;
    const blk_provider *p = g->p;
    int hd = p->hd, KVH = p->KVH;
    if (g->n_rows >= g->max_rows) return td_seterr(err, TD_EFULL, "block: row group is full (%d rows)", g->max_rows);
    if (ck) {
        int32_t hdr[5] = {0, 0, 0, 0, 0};
        int v3 = !strcmp(ck->ns, "block-v3");
        size_t hb = (v3 ? 5 : 4) * sizeof(int32_t); /* header bytes */
        if ((!v3 && strcmp(ck->ns, "block-v2") != 0) || ck->size < hb)
            return td_seterr(err, TD_EFORMAT, "block: checkpoint of namespace '%s' is not a block-v3 (or -v2) checkpoint", ck->ns);
        memcpy(hdr, ck->data, hb);
        if (hdr[4] < 0 || hdr[4] > g->max_ctx + g->max_depth + 1)
            return td_seterr(err, TD_EFORMAT, "block: checkpoint stream of %d tokens does not fit the context %d", (int)hdr[4], g->max_ctx);
        const int32_t *stok = (const int32_t *)(ck->data + hb);
        hb += (size_t)hdr[4] * sizeof(int32_t);
        size_t per = (size_t)p->n_layer * KVH * hd * 2;
        if (hdr[1] != p->n_layer || hdr[2] != KVH * hd)
            return td_seterr(err, TD_EFORMAT, "block: checkpoint holds %d layers of width %d; this drafter has %d of %d",
                             (int)hdr[1], (int)hdr[2], p->n_layer, KVH * hd);
        if (hdr[0] < 0 || hdr[0] > g->max_ctx || hdr[3] < 0 || hdr[3] > TD_DRAFT_CTXIDS ||
            ck->size != hb + (size_t)hdr[0] * per * sizeof(float) + (size_t)hdr[3] * sizeof(int32_t))
            return td_seterr(err, TD_EFORMAT, "block: checkpoint of %zu bytes does not hold %d positions (context %d) and %d context ids",
                             ck->size, (int)hdr[0], g->max_ctx, (int)hdr[3]);
        for (int i = 0; i < hdr[4]; i++)
            if (stok[i] < 0 || stok[i] >= p->V)
                return td_seterr(err, TD_EFORMAT, "block: checkpoint stream token %d is outside the vocabulary", (int)stok[i]);
        const float *src = (const float *)(ck->data + hb);
        for (size_t i = 0; i < (size_t)hdr[0] * per; i++)
            if (!isfinite(src[i])) return td_seterr(err, TD_EFORMAT, "block: checkpoint value %zu is not finite", i);
        int32_t *cids = malloc(sizeof(int32_t) * (size_t)(hdr[3] ? hdr[3] : 1));
        if (!cids) return td_seterr(err, TD_ENOMEM, "out of memory");
        memcpy(cids, ck->data + hb + (size_t)hdr[0] * per * sizeof(float), sizeof(int32_t) * (size_t)hdr[3]);
        for (int i = 0; i < hdr[3]; i++)
            if (cids[i] < 0 || cids[i] >= p->V) {
                int bad = (int)cids[i];
                free(cids);
                return td_seterr(err, TD_EFORMAT, "block: checkpoint context id %d is outside the vocabulary", bad);
            }
        blk_row *r = &g->rows[g->n_rows];
        if (row_alloc(g, r)) { free(cids); return td_seterr(err, TD_ENOMEM, "block: no memory for a row"); }
        row_note(p, r, cids, hdr[3]);
        free(cids);
        memcpy(r->stream, stok, sizeof(int32_t) * (size_t)hdr[4]);
        r->slen = hdr[4];
        for (int pos = 0; pos < hdr[0]; pos++)
            for (int l = 0; l < p->n_layer; l++)
                for (int h = 0; h < KVH; h++) {
                    kv_put(g, r, l, h, pos, src, src + hd);
                    src += 2 * hd;
                }
        r->len = hdr[0];
        g->n_rows++;
        return 0;
    }
    if (n < 0 || n > g->max_ctx) return td_seterr(err, TD_ERANGE, "block: stream of %d tokens exceeds the context %d", n, g->max_ctx);
    if (n > 0 && !taps) return td_seterr(err, TD_EINVAL, "block: a row needs the target's taps of its prompt");
    for (int i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= p->V)
            return td_seterr(err, TD_ERANGE, "block: token %d at position %d is outside the vocabulary", (int)tokens[i], i);
    blk_row *r = &g->rows[g->n_rows];
    if (row_alloc(g, r)) return td_seterr(err, TD_ENOMEM, "block: no memory for a row");
    row_note(p, r, tokens, n);
    if (n) memcpy(r->stream, tokens, sizeof(int32_t) * (size_t)n);
    r->slen = n;
    if (n) project_context(g, r, taps, n);
    g->n_rows++;
    return 0;
}

static float w_at(const td_tensor *t, size_t i) {
    if (t->dtype == TD_DTYPE_F32) return ((const float *)t->data)[i];
    if (t->dtype == TD_DTYPE_BF16) return td_bf16_to_f32(((const uint16_t *)t->data)[i]);
    return td_f16_to_f32(((const uint16_t *)t->data)[i]);
}

/* Layer l's block entries and attention for the drafting rows, one pool job
 * of (row b, kv head kh) units dealt round-robin. A unit norms and ropes its kv
 * head's keys and its group's H/KVH query heads for the row's g entries, writes
 * the entries' K and V at positions len..len+g-1, then attends with the group's
 * queries gathered token-major (TD_ATTEND_QMAX a call), so they share each K/V
 * load. A unit reads only K/V it wrote or that commits wrote: no barrier is
 * needed between the two steps. A query's output does not depend on the others
 * in its call (nn/kernels.h), nor on who computes it. */
typedef struct { blk_group *g; int l, nb; float scale; } att_job;
static void att_run(void *arg, int ith, int nth) {
    const att_job *j = arg;
    blk_group *g = j->g;
    const blk_provider *p = g->p;
    const td_layer_w *L = &p->L[j->l];
    int H = p->H, KVH = p->KVH, hd = p->hd, half = hd / 2, QW = H * hd, KW = KVH * hd, grp = H / KVH;
    int nk[TD_ATTEND_QMAX];
    float *scratch = g->scratch + (size_t)ith * g->sstride, *qg = scratch + (size_t)TD_ATTEND_QMAX * g->capb,
          *og = qg + (size_t)TD_ATTEND_QMAX * hd;
    for (int it = ith; it < j->nb * KVH; it += nth) {
        int b = it / KVH, kh = it % KVH, G = g->bg[b], t0 = g->boff[b];
        blk_row *r = &g->rows[g->brow[b]];
        for (int t = 0; t < G; t++) {
            int pos = r->len + t;
            const float *cs = g->rcos + (size_t)pos * half, *sn = g->rsin + (size_t)pos * half;
            for (int h = kh * grp; h < (kh + 1) * grp; h++) {
                float *qq = g->q + (size_t)(t0 + t) * QW + (size_t)h * hd;
                td_rmsnorm(qq, qq, L->q_norm.data, L->q_norm.dtype, hd, p->eps);
                td_rope(qq, cs, sn, hd);
            }
            float *k = g->kb + (size_t)(t0 + t) * KW + (size_t)kh * hd;
            td_rmsnorm(k, k, L->k_norm.data, L->k_norm.dtype, hd, p->eps);
            td_rope(k, cs, sn, hd);
            const float *v = g->vb + (size_t)(t0 + t) * KW + (size_t)kh * hd;
            if (g->b32_att) { /* only the mirror is read this round; a commit writes both */
                size_t bt = kvb_at(g, j->l, kh, pos);
                td_from_f32(r->Kh + bt, k, TD_DTYPE_BF16, (size_t)hd);
                td_from_f32(r->Vh + bt, v, TD_DTYPE_BF16, (size_t)hd);
            } else {
                memcpy(r->K + kv_at(g, j->l, kh, pos), k, sizeof(float) * (size_t)hd);
                memcpy(r->V + kv_at(g, j->l, kh, pos), v, sizeof(float) * (size_t)hd);
            }
        }
        for (int i0 = 0, nq = G * grp; i0 < nq; i0 += TD_ATTEND_QMAX) {
            int n = nq - i0 < TD_ATTEND_QMAX ? nq - i0 : TD_ATTEND_QMAX;
            for (int i = 0; i < n; i++) {
                int t = t0 + (i0 + i) / grp, h = kh * grp + (i0 + i) % grp;
                memcpy(qg + (size_t)i * hd, g->q + (size_t)t * QW + (size_t)h * hd, sizeof(float) * (size_t)hd);
                nk[i] = r->len + G;
            }
            if (g->b32_att) { /* the target's A32 order: q * scale rounded to bf16 once */
                uint16_t *pr = g->bscr + (size_t)ith * TD_ATTEND_QMAX * (g->capb + hd),
                         *qt = pr + (size_t)TD_ATTEND_QMAX * g->capb;
                for (int i = 0; i < n; i++) {
                    float *qi = qg + (size_t)i * hd;
                    for (int d = 0; d < hd; d++) qi[d] *= j->scale;
                    td_from_f32(qt + (size_t)i * hd, qi, TD_DTYPE_BF16, (size_t)hd);
                }
                size_t lh = kvb_at(g, j->l, kh, 0);
                td_attend_b32(og, hd, qt, hd, n, nk, r->Kh + lh, r->Vh + lh, hd, hd, scratch, pr);
            } else
                td_attend(og, hd, qg, hd, n, nk, r->K + kv_at(g, j->l, kh, 0), r->V + kv_at(g, j->l, kh, 0), hd, hd,
                          j->scale, scratch);
            for (int i = 0; i < n; i++) {
                int t = t0 + (i0 + i) / grp, h = kh * grp + (i0 + i) % grp;
                memcpy(g->o + (size_t)t * QW + (size_t)h * hd, og + (size_t)i * hd, sizeof(float) * (size_t)hd);
            }
        }
    }
}

/* The same on the AMX tiles (g->amx_att, td_amx_attend): (row, kv head)
 * items, the H/KVH heads' queries of a kv head together, TD_AMX_ATTEND_QMAX (32) a call, over the
 * row's bf16 keys and values. The drafts move a little against att_run's
 * (the target's verification keeps the output exact). */
static void att_amx_run(void *arg, int ith, int nth) {
    const att_job *j = arg;
    blk_group *g = j->g;
    const blk_provider *p = g->p;
    int KVH = p->KVH, hd = p->hd, QW = p->H * hd, grp = p->H / KVH;
    size_t capp = (size_t)g->capp, per = (size_t)grp * p->G * hd + TD_AMX_ATTEND_QMAX * capp, tmax = (size_t)BLK_TAIL * hd;
    float *ob = g->ascr + (size_t)ith * per, *sc = ob + (size_t)grp * p->G * hd;
    uint16_t *qb = g->apk + (size_t)ith * (per + 2 * tmax), *pb = qb + (size_t)grp * p->G * hd, *kt = pb + TD_AMX_ATTEND_QMAX * capp,
             *vt = kt + tmax;
    for (int it = ith; it < j->nb * KVH; it += nth) {
        int b = it / KVH, kh = it % KVH, G = g->bg[b], nq = grp * G;
        blk_row *r = &g->rows[g->brow[b]];
        for (int hh = 0; hh < grp; hh++)
            for (int t = 0; t < G; t++) {
                const float *sq = g->q + (size_t)(g->boff[b] + t) * QW + (size_t)(kh * grp + hh) * hd;
                uint16_t *dq = qb + (size_t)(hh * G + t) * hd;
                for (int d = 0; d < hd; d++) dq[d] = td_f32_to_bf16(sq[d] * j->scale);
            }
        size_t lh = ((size_t)j->l * KVH + kh) * capp * hd;
        /* the committed positions of the row's last 32-key chunk, copied, then
         * the block entries (qk_run stored them in f32) written into the copy.
         * Only what commits wrote is read: a read of pages never written would
         * map the zero page, and the commit's write then pays a copy fault. The
         * copy's stale values past nk are finite (they meet probabilities of 0). */
        int c0 = r->len / 32 * 32, nk = r->len + G;
        if (r->len > c0) {
            memcpy(kt, r->Kp + lh + (size_t)c0 * hd, sizeof(uint16_t) * (size_t)((r->len - c0 + 15) / 16) * 16 * hd);
            memcpy(vt, r->Vp + lh + (size_t)c0 * hd, sizeof(uint16_t) * 32 * (size_t)hd);
        }
        for (int t = 0; t < G; t++)
            td_amx_kv_put(kt, vt, r->len + t - c0, r->K + kv_at(g, j->l, kh, r->len + t), r->V + kv_at(g, j->l, kh, r->len + t), hd);
        for (int m0 = 0; m0 < nq; m0 += TD_AMX_ATTEND_QMAX)
            td_amx_attend(ob + (size_t)m0 * hd, hd, qb + (size_t)m0 * hd, nq - m0 < TD_AMX_ATTEND_QMAX ? nq - m0 : TD_AMX_ATTEND_QMAX, r->Kp + lh, r->Vp + lh,
                          c0, kt, vt, hd, nk, sc, pb);
        for (int hh = 0; hh < grp; hh++)
            for (int t = 0; t < G; t++)
                memcpy(g->o + (size_t)(g->boff[b] + t) * QW + (size_t)(kh * grp + hh) * hd, ob + (size_t)(hh * G + t) * hd,
                       sizeof(float) * (size_t)hd);
    }
}

/* Layer l's q/k norms and RoPE for every block entry of the drafting rows, and
 * the entries' K/V into their rows' context (positions len..len+g-1), on the
 * pool: entries dealt round-robin (each one's values are its own). */
static void qk_run(void *arg, int ith, int nth) {
    const att_job *j = arg;
    blk_group *g = j->g;
    const blk_provider *p = g->p;
    const td_layer_w *L = &p->L[j->l];
    int hd = p->hd, half = hd / 2, QW = p->H * hd, KW = p->KVH * hd, b = 0;
    for (int t = ith; b < j->nb; t += nth) {
        while (b < j->nb && t >= g->boff[b] + g->bg[b]) b++;
        if (b == j->nb) break;
        blk_row *r = &g->rows[g->brow[b]];
        int pos = r->len + t - g->boff[b];
        const float *cs = g->rcos + (size_t)pos * half, *sn = g->rsin + (size_t)pos * half;
        for (int h = 0; h < p->H; h++) {
            float *qq = g->q + (size_t)t * QW + (size_t)h * hd;
            td_rmsnorm(qq, qq, L->q_norm.data, L->q_norm.dtype, hd, p->eps);
            td_rope(qq, cs, sn, hd);
        }
        for (int h = 0; h < p->KVH; h++) {
            float *k = g->kb + (size_t)t * KW + (size_t)h * hd;
            td_rmsnorm(k, k, L->k_norm.data, L->k_norm.dtype, hd, p->eps);
            td_rope(k, cs, sn, hd);
            memcpy(r->K + kv_at(g, j->l, h, pos), k, sizeof(float) * (size_t)hd);
            memcpy(r->V + kv_at(g, j->l, h, pos), g->vb + (size_t)t * KW + (size_t)h * hd, sizeof(float) * (size_t)hd);
        }
    }
}

/* Draft j of row i from lg[n_sub], the kept ids' LM-head logits (the Markov
 * bias of prev is added here), and for a greedy draft cl[cx.n], the row's
 * context ids' LM-head logits (their Markov parts are added here too): the
 * draft id, or a negative TD_E* code when sampling fails. */
static int32_t pick(blk_group *g, td_draft_req *q, int i, int j, float *lg, float *cl, int32_t prev) {
    const blk_provider *p = g->p;
    const blk_row *r = &g->rows[i];
    int Vs = p->n_sub;
    if (p->rank) {
        td_to_f32(g->a, (const char *)p->mk_embed.data + (size_t)prev * p->rank * (p->mk_embed.dtype == TD_DTYPE_F32 ? 4 : 2),
                  p->mk_embed.dtype, (size_t)p->rank);
        td_panel16_addmv(lg, p->mkp, g->a, p->rank, Vs); /* rank-wide: on the caller */
    }
    if (q->probs) {
        td_sampling sp = *q->sampling[i];
        sp.seed ^= 0x3c6ef372fe94f82bull; /* the drafter's own draw stream */
        float *pr = q->probs + ((size_t)i * q->max_depth + j) * p->V;
        int32_t d = td_sampler_sample_probs(g->smp, &sp, lg, NULL, 0, q->out_pos[i] + (uint64_t)j, g->qsub);
        if (d < 0) return d;
        td_draft_vocab_scatter(&p->voc, g->qsub, pr); /* zero outside the draft vocabulary */
        return td_draft_vocab_id(&p->voc, d);
    }
    /* the best of the kept ids and the row's context ids, each logit = its
     * LM-head row . z + its markov.out row . a */
    if (r->cx.n && p->rank) td_draft_ctxids_logits(&p->mvoc, &r->mx, g->a, 1, cl, 1);
    return td_draft_vocab_best(&p->voc, lg, &r->cx, cl);
}

static float confidence(const blk_provider *p, const float *z) {
    const td_tensor *cw = &p->conf_w;
    float s = cw->dtype == TD_DTYPE_F32    ? td_dot(z, cw->data, p->D)
              : cw->dtype == TD_DTYPE_BF16 ? td_dot_bf16(z, cw->data, p->D)
                                           : td_dot_f16(z, cw->data, p->D);
    return 1.0f / (1.0f + expf(-(s + w_at(&p->conf_b, 0))));
}

/* The drafts of a drafter with a chain head, after the block's layers: step j
 * (draft j + 1) runs for every drafting row whose block reaches it and that
 * has not stopped, all rows' products together:
 *   s_j = silu(inp([z ; enorm(E[prev])]) + rec(s_{j-1})),  u = z + out(s_j),
 * then the confidence of u prunes, the LM head runs over the kept rows' u and
 * each row picks its draft, the next step's prev. */
static int chain_draft(blk_group *g, td_draft_req *q, int nb, td_err *err) {
    const blk_provider *p = g->p;
    const td_tensor *E = &p->target->w.tok_embd;
    int D = p->D, C = p->C, Vs = p->n_sub, na = 0;
    for (int b = 0; b < nb; b++) {
        g->cact[na++] = b;
        g->cprev[b] = q->pending[g->brow[b]];
        q->n_tokens[g->brow[b]] = 0;
    }
    for (int j = 0; na; j++) {
        int m = 0;
        for (int a = 0; a < na; a++)
            if (g->bg[g->cact[a]] - 1 > j) g->cact[m++] = g->cact[a];
        if (!(na = m)) break;
        for (int a = 0; a < na; a++) {
            int b = g->cact[a];
            float *in = g->cz + (size_t)a * 2 * D;
            td_rmsnorm(in, g->x + (size_t)(g->boff[b] + j + 1) * D, p->norm.data, p->norm.dtype, D, p->eps);
            td_tensor_row_f32(E, g->cprev[b], D, in + D);
            td_rmsnorm(in + D, in + D, p->ch_enorm.data, p->ch_enorm.dtype, D, p->eps);
            memcpy(g->cu + (size_t)a * D, in, sizeof(float) * (size_t)D);
            if (j) memcpy(g->cg + (size_t)a * C, g->cs + (size_t)b * C, sizeof(float) * (size_t)C);
        }
        /* pre-activation inp([z ; e]) + rec(s_{j-1}) (s_0 = 0: no rec term) */
        mm(g, g->ca, C, g->cz, 2 * D, na, &p->ch_inp, 2 * D, C, 0);
        if (j) mm(g, g->ca, C, g->cg, C, na, &p->ch_rec, C, C, 1);
        for (int a = 0; a < na; a++) {
            float *s = g->ca + (size_t)a * C;
            td_swiglu(s, s, g->cone, C); /* silu(s) * 1 */
            memcpy(g->cs + (size_t)g->cact[a] * C, s, sizeof(float) * (size_t)C);
        }
        mm(g, g->cu, D, g->ca, C, na, &p->ch_out, C, D, 1); /* u = z + out(s) */
        /* the confidence of u prunes: rows that stop leave the step order */
        m = 0;
        for (int a = 0; a < na; a++) {
            if (p->prune && p->n_thr && p->conf_w.data && !(confidence(p, g->cu + (size_t)a * D) >= p->thr[j])) continue;
            if (m != a) memmove(g->cu + (size_t)m * D, g->cu + (size_t)a * D, sizeof(float) * (size_t)D);
            g->cact[m++] = g->cact[a];
        }
        if (!(na = m)) break;
        mm(g, g->lg, Vs, g->cu, D, na, &p->head, D, Vs, 0);
        for (int a = 0; a < na; a++) {
            int b = g->cact[a], i = g->brow[b];
            const blk_row *r = &g->rows[i];
            if (!q->probs && r->cx.n) td_draft_ctxids_logits(&p->voc, &r->cx, g->cu + (size_t)a * D, 1, g->cl, 0);
            int32_t d = pick(g, q, i, j, g->lg + (size_t)a * Vs, g->cl, g->cprev[b]);
            if (d < 0) return td_seterr(err, d, "block: sampling failed");
            q->tokens[(size_t)i * q->max_depth + j] = d;
            q->n_tokens[i] = j + 1;
            g->cprev[b] = d;
        }
    }
    return 0;
}

static int blk_draft(void *gv, td_draft_req *q, td_err *err) {
    blk_group *g = gv;
    const blk_provider *p = g->p;
    int D = p->D, G = p->G, hd = p->hd, H = p->H, KVH = p->KVH, V = p->V, Vs = p->n_sub;
    int QW = H * hd, KW = KVH * hd;
    if (q->n_rows != g->n_rows) return td_seterr(err, TD_ESTATE, "block: draft for %d rows, group has %d", q->n_rows, g->n_rows);
    q->has_probs = q->probs != NULL;
    q->steps = 0; /* no block forward (yet): nothing to learn a step's cost from */
    int nb = 0, *depth = g->bdepth;
    for (int i = 0; i < q->n_rows; i++) {
        q->n_tokens[i] = 0;
        depth[i] = q->depth[i];
        /* prompt lookup first (lookup=N, greedy drafts only), as the draft model's */
        blk_row *r = &g->rows[i];
        if (p->lookup && !q->probs && depth[i] > 0 && !(q->own && q->own[i]) && r->slen <= r->cap - 1 &&
            (q->n_tokens[i] = td_draft_lookup(r->stream, r->slen, q->pending[i], p->lookup, depth[i],
                                              q->tokens + (size_t)i * q->max_depth, NULL)) > 0)
            depth[i] = 0;
        if (depth[i] > 0) {
            if (q->pending[i] < 0 || q->pending[i] >= V)
                return td_seterr(err, TD_ERANGE, "block: pending token %d is outside the vocabulary", (int)q->pending[i]);
            if (g->rows[i].len + g->rows[i].n_raw + G > g->cap) return td_seterr(err, TD_EFULL, "block: row %d context is full", i);
            g->brow[nb++] = i;
        }
    }
    if (!nb) return 0;
    /* the drafting rows' committed positions not projected yet (rows that sat
     * at depth 0): projected now, so the draft timer pays for them */
    flush_backlogs(g, g->brow, nb);
    /* each row's block: the anchor and as many masks as it drafts (G - 1 at most) */
    int T = 0, steps = 0;
    for (int b = 0; b < nb; b++) {
        int k = depth[g->brow[b]];
        g->bg[b] = k < G - 1 ? k + 1 : G;
        g->boff[b] = T;
        T += g->bg[b];
        if (g->bg[b] > steps) steps = g->bg[b];
    }
    q->steps = steps;
    /* block inputs: E[anchor], E[mask] x (g - 1) */
    const td_tensor *E = &p->target->w.tok_embd;
    for (int b = 0; b < nb; b++)
        for (int j = 0; j < g->bg[b]; j++) {
            int32_t id = j == 0 ? q->pending[g->brow[b]] : p->mask_id;
            td_tensor_row_f32(E, id, D, g->x + (size_t)(g->boff[b] + j) * D);
        }
    float scale = 1.0f / sqrtf((float)hd);
    for (int l = 0; l < p->n_layer; l++) {
        const td_layer_w *L = &p->L[l];
        for (int t = 0; t < T; t++)
            td_rmsnorm(g->n + (size_t)t * D, g->x + (size_t)t * D, L->attn_norm.data, L->attn_norm.dtype, D, p->eps);
        td_mm_part qkv[3] = {{g->q, QW, &L->wq, QW}, {g->kb, KW, &L->wk, KW}, {g->vb, KW, &L->wv, KW}};
        td_mm_parts(g->pool, g->act, g->n, D, T, D, qkv, 3, 0, g->xa, g->xq);
        att_job aj = {g, l, nb, scale};
        if (g->amx_att) {
            td_pool_run(g->pool, qk_run, &aj);
            td_pool_run(g->pool, att_amx_run, &aj);
        } else {
            td_pool_run(g->pool, att_run, &aj); /* entries' K/V and attention, one job */
        }
        mm(g, g->x, D, g->o, QW, T, &L->wo, QW, D, 1);
        for (int t = 0; t < T; t++)
            td_rmsnorm(g->n + (size_t)t * D, g->x + (size_t)t * D, L->ffn_norm.data, L->ffn_norm.dtype, D, p->eps);
        td_mm_part gu[2] = {{g->g, p->F, &L->w_gate, p->F}, {g->u, p->F, &L->w_up, p->F}};
        td_mm_parts(g->pool, g->act, g->n, D, T, D, gu, 2, 0, g->xa, g->xq);
        for (int t = 0; t < T; t++) td_swiglu(g->g + (size_t)t * p->F, g->g + (size_t)t * p->F, g->u + (size_t)t * p->F, p->F);
        mm(g, g->x, D, g->g, p->F, T, &L->w_down, p->F, D, 1);
    }
    if (p->C) return chain_draft(g, q, nb, err);
    /* z_j = norm(x_j), j >= 1, gathered (kept positions only) into g->n; confidence prunes */
    int nz = 0;
    for (int b = 0; b < nb; b++) {
        int i = g->brow[b];
        int want = g->bg[b] - 1; /* min(depth, G - 1) */
        int k = 0;
        for (; k < want; k++) {
            float *z = g->n + (size_t)(nz + k) * D;
            td_rmsnorm(z, g->x + (size_t)(g->boff[b] + k + 1) * D, p->norm.data, p->norm.dtype, D, p->eps);
            if (p->prune && p->n_thr && p->conf_w.data && !(confidence(p, z) >= p->thr[k])) break;
        }
        q->n_tokens[i] = k; /* provisional: the count of kept positions */
        nz += k;
    }
    if (nz) mm(g, g->lg, Vs, g->n, D, nz, &p->head, D, Vs, 0);
    size_t off = 0;
    for (int b = 0; b < nb; b++) {
        int i = g->brow[b], k = q->n_tokens[i];
        const blk_row *r = &g->rows[i];
        int32_t prev = q->pending[i];
        /* the context ids' head logits of all k positions as one product (their
         * markov parts follow each draft) */
        if (!q->probs && r->cx.n) td_draft_ctxids_logits(&p->voc, &r->cx, g->n + off * D, k, g->cl, 0);
        for (int j = 0; j < k; j++, off++) {
            int32_t d = pick(g, q, i, j, g->lg + off * Vs, g->cl + (size_t)j * r->cx.n, prev);
            if (d < 0) return td_seterr(err, d, "block: sampling failed");
            q->tokens[(size_t)i * q->max_depth + j] = d;
            prev = d;
        }
    }
    return 0;
}

static int blk_commit(void *gv, const td_draft_commit *cm, int n_rows, td_err *err) {
    blk_group *g = gv;
    int TW = g->p->n_taps * g->p->D;
    for (int i = 0; i < n_rows; i++) {
        int m = cm[i].n_accepted;
        if (m < 0 || m > g->max_depth) /* a block's drafts, or up to max_depth copied by lookup= */
            return td_seterr(err, TD_EINVAL, "block: row %d commits %d accepted drafts, more than the depth %d", i, m, g->max_depth);
        const blk_row *r = &g->rows[i];
        if (r->len + r->n_raw + m + 1 + g->p->G > g->cap || r->slen + m + 1 > g->cap)
            return td_seterr(err, TD_EFULL, "block: row %d context is full", i);
    }
    /* the accepted windows' taps join each row's backlog (projected lazily);
     * rows whose backlog would overflow are projected first, together */
    int nf = 0;
    for (int i = 0; i < n_rows; i++)
        if (cm[i].taps && g->rows[i].n_raw + cm[i].n_accepted + 1 > BLK_BACKLOG) g->brow[nf++] = i;
    if (nf) flush_backlogs(g, g->brow, nf);
    for (int i = 0; i < n_rows; i++) {
        blk_row *r = &g->rows[i];
        row_note(g->p, r, &cm[i].old_pending, 1);
        row_note(g->p, r, cm[i].accepted, cm[i].n_accepted);
        r->stream[r->slen++] = cm[i].old_pending;
        if (cm[i].n_accepted > 0) memcpy(r->stream + r->slen, cm[i].accepted, sizeof(int32_t) * (size_t)cm[i].n_accepted);
        r->slen += cm[i].n_accepted;
        if (!cm[i].taps) continue; /* no taps: a row that finished and leaves */
        int m = cm[i].n_accepted + 1;
        memcpy(r->raw + (size_t)r->n_raw * TW, cm[i].taps, sizeof(float) * (size_t)m * TW);
        r->n_raw += m;
    }
    return 0;
}

static void blk_filter(void *gv, const int *keep, int n_keep) {
    blk_group *g = gv;
    int k = 0;
    for (int i = 0; i < g->n_rows; i++) {
        if (k < n_keep && keep[k] == i) { g->rows[k++] = g->rows[i]; continue; }
        row_release(g, &g->rows[i]);
    }
    g->n_rows = n_keep;
}

static int blk_capture(void *gv, int row, td_draft_checkpoint **out, td_err *err) {
    blk_group *g = gv;
    const blk_provider *p = g->p;
    *out = NULL;
    if (row < 0 || row >= g->n_rows) return td_seterr(err, TD_EINVAL, "block: no row %d", row);
    flush_backlogs(g, &row, 1);
    blk_row *r = &g->rows[row];
    int hd = p->hd;
    int32_t hdr[5] = {r->len, p->n_layer, p->KVH * hd, r->cx.n, r->slen};
    size_t per = (size_t)p->n_layer * p->KVH * hd * 2, hb = sizeof hdr + sizeof(int32_t) * (size_t)r->slen;
    size_t bytes = hb + (size_t)r->len * per * sizeof(float) + sizeof(int32_t) * (size_t)r->cx.n;
    td_draft_checkpoint *ck;
    int rc = td_draft_checkpoint_new(&ck, "block-v3", bytes, err);
    if (rc) return rc;
    memcpy(ck->data, hdr, sizeof hdr);
    if (r->slen) memcpy(ck->data + sizeof hdr, r->stream, sizeof(int32_t) * (size_t)r->slen);
    float *dst = (float *)(ck->data + hb);
    for (int pos = 0; pos < r->len; pos++)
        for (int l = 0; l < p->n_layer; l++)
            for (int h = 0; h < p->KVH; h++) {
                memcpy(dst, r->K + kv_at(g, l, h, pos), sizeof(float) * (size_t)hd);
                memcpy(dst + hd, r->V + kv_at(g, l, h, pos), sizeof(float) * (size_t)hd);
                dst += 2 * hd;
            }
    if (r->cx.n) memcpy(dst, r->cx.ids, sizeof(int32_t) * (size_t)r->cx.n);
    *out = ck;
    return 0;
}

static void blk_free_group(void *gv) {
    blk_group *g = gv;
    if (!g) return;
    for (int i = 0; i < g->n_rows; i++) row_free(&g->rows[i]);
    for (int i = 0; i < g->n_spare; i++) row_free(&g->spare[i]);
    free(g->spare);
    if (g->own_pool) td_pool_free(g->pool);
    td_sampler_free(g->smp);
    free(g->rows); free(g->rcos); free(g->rsin);
    free(g->x); free(g->n); free(g->q); free(g->kb); free(g->vb); free(g->o); free(g->g); free(g->u);
    free(g->lg); free(g->tb); free(g->ckv); free(g->crow); free(g->ctap); free(g->cn); free(g->xa); free(g->xq);
    free(g->a); free(g->qsub); free(g->cl); free(g->scratch); free(g->bscr); free(g->ascr); free(g->apk); free(g->brow); free(g->bdepth); free(g->bg); free(g->boff);
    free(g->cz); free(g->ca); free(g->cg); free(g->cs); free(g->cu); free(g->cone); free(g->cact); free(g->cprev);
    free(g);
}

static int32_t *blk_stream(void *gv, int i, int *len) {
    blk_group *g = gv;
    *len = g->rows[i].slen;
    return g->rows[i].stream;
}

/* lookup=N: the prompt lookup's proposals are on offer before the group plans
 * (draft.h); a row drafted from its offer comes to draft() at depth 0. Without
 * lookup= nothing is on offer. */
static int blk_offer(void *gv, const int32_t *pending, int max_depth, int32_t *tokens, int *n_tokens, int *match,
                     td_err *err) {
    blk_group *g = gv;
    (void)err;
    td_draft_offer_lookup(g, g->n_rows, blk_stream, g->p->lookup, pending, max_depth, tokens, n_tokens, match);
    return 0;
}

static const td_draft_rows_vt blk_rows_vt = {
    .append = blk_append, .draft = blk_draft, .commit = blk_commit, .offer = blk_offer,
    .filter = blk_filter, .capture = blk_capture, .free = blk_free_group,
};

/* The matrices quant= quantizes besides the layers' (and under act_type amx or
 * bf16 repacks): fc, the chain's, and with a draft vocabulary the drafter's own copy
 * of the kept LM-head rows (the target's head stays as it is). Returns the count. */
static int own_matrices(blk_provider *p, td_tensor **extra) {
    int n = 0;
    extra[n++] = &p->fc;
    if (p->C) extra[n++] = &p->ch_inp, extra[n++] = &p->ch_rec, extra[n++] = &p->ch_out;
    if (p->n_sub < p->V) extra[n++] = &p->head;
    return n;
}

static int blk_open_rows(void *self, int max_rows, int max_ctx, int max_depth, const td_ctx *target_ctx,
                         td_draft_rows *out, td_err *err) {
    blk_provider *p = self;
    if (max_rows < 1 || max_ctx < 1 || max_depth < 0) return td_seterr(err, TD_EINVAL, "block: bad row group geometry");
    blk_group *g = calloc(1, sizeof *g);
    if (!g) return td_seterr(err, TD_ENOMEM, "out of memory");
    g->p = p;
    g->max_rows = max_rows;
    g->max_ctx = max_ctx;
    g->max_depth = max_depth;
    g->cap = max_ctx + max_depth + 2 + p->G;
    g->capb = (g->cap + 1) / 2 * 2;
    int T = max_rows * p->G;
    g->max_tok = T > BLK_CHUNK ? T : BLK_CHUNK;
    int half = p->hd / 2, D = p->D, W = p->H * p->hd > D ? p->H * p->hd : D;
    size_t mt = (size_t)g->max_tok;
    g->rows = calloc((size_t)max_rows, sizeof *g->rows);
    g->spare = calloc((size_t)max_rows, sizeof *g->spare);
    g->rcos = malloc(sizeof(float) * (size_t)g->cap * half);
    g->rsin = malloc(sizeof(float) * (size_t)g->cap * half);
    g->x = malloc(sizeof(float) * mt * D);
    g->n = malloc(sizeof(float) * mt * D);
    g->q = malloc(sizeof(float) * mt * W);
    g->kb = malloc(sizeof(float) * mt * p->KVH * p->hd);
    g->vb = malloc(sizeof(float) * mt * p->KVH * p->hd);
    g->o = malloc(sizeof(float) * mt * W);
    g->g = malloc(sizeof(float) * mt * p->F);
    g->u = malloc(sizeof(float) * mt * p->F);
    g->lg = malloc(sizeof(float) * (size_t)max_rows * (p->G - 1) * p->n_sub);
    g->tb = malloc(sizeof(float) * mt * p->n_taps * D);
    g->ckv = malloc(sizeof(float) * mt * 2 * p->n_layer * p->KVH * p->hd);
    g->crow = malloc(sizeof(blk_row *) * (size_t)max_rows);
    g->ctap = malloc(sizeof(float *) * (size_t)max_rows);
    g->cn = malloc(sizeof(int) * (size_t)max_rows);
    g->a = malloc(sizeof(float) * (size_t)(p->rank ? p->rank : 1));
    g->qsub = malloc(sizeof(float) * (size_t)p->n_sub);
    g->cl = malloc(sizeof(float) * BLK_MAX_G * TD_DRAFT_CTXIDS);
    g->brow = malloc(sizeof(int) * (size_t)max_rows);
    g->bdepth = malloc(sizeof(int) * (size_t)max_rows);
    g->bg = malloc(sizeof(int) * (size_t)max_rows);
    g->boff = malloc(sizeof(int) * (size_t)max_rows);
    if (p->C) {
        size_t mr = (size_t)max_rows, C = (size_t)p->C;
        g->cz = malloc(sizeof(float) * mr * 2 * D);
        g->ca = malloc(sizeof(float) * mr * C);
        g->cg = malloc(sizeof(float) * mr * C);
        g->cs = malloc(sizeof(float) * mr * C);
        g->cu = malloc(sizeof(float) * mr * D);
        if ((g->cone = malloc(sizeof(float) * C)))
            for (size_t c = 0; c < C; c++) g->cone[c] = 1.0f;
        g->cact = malloc(sizeof(int) * mr);
        g->cprev = malloc(sizeof(int32_t) * mr);
    }
    if ((p->C && (!g->cz || !g->ca || !g->cg || !g->cs || !g->cu || !g->cone || !g->cact || !g->cprev)) || !g->bdepth || !g->bg || !g->boff || !g->rows || !g->spare || !g->rcos || !g->rsin || !g->x || !g->n || !g->q || !g->kb || !g->vb || !g->o || !g->g || !g->u ||
        !g->lg || !g->tb || !g->ckv || !g->crow || !g->ctap || !g->cn || !g->a || !g->qsub || !g->cl || !g->brow || td_sampler_open(&g->smp, p->n_sub) != 0 ||
        (target_ctx ? !(g->pool = td_ctx_pool(target_ctx)) : (g->own_pool = 1, td_pool_open(&g->pool, 1) != 0)) ||
        !(g->scratch = malloc(sizeof(float) * (g->sstride = (size_t)TD_ATTEND_QMAX * ((size_t)g->capb + 2 * (size_t)p->hd)) *
                              (size_t)td_pool_size(g->pool)))) {
        blk_free_group(g);
        return td_seterr(err, TD_ENOMEM, "out of memory");
    }
    int tact = target_ctx ? td_ctx_get_params(target_ctx).act_type : TD_DTYPE_F32;
    /* quant= under an f32 target: the drafter's own (quantized) matrices take the R16 order all the same, its
       bf16 ones (the target's LM head) the f32 kernels (no xa), attention f32. Its drafts need not match any
       other mode's, and R16 costs less than Q16 for a block of entries (Zen 3, bench/forward-notes.md "Stop 49") */
    int r16 = tact == TD_DTYPE_F32 && p->qarena;
    if (tact == TD_ACT_AMX || tact == TD_DTYPE_BF16 || r16) { /* the target's products run on AMX or bf16 (so do these), or r16 (above) */
        int kmax = p->n_taps * D;
        int ks[] = {W, p->F, p->rank, 2 * D, p->C};
        for (int i = 0; i < 5; i++) kmax = ks[i] > kmax ? ks[i] : kmax;
        g->act = r16 ? TD_DTYPE_BF16 : tact;
        g->amx_att = tact == TD_ACT_AMX && p->hd % 32 == 0;
        g->b32_att = tact == TD_DTYPE_BF16 && p->hd % 32 == 0;
        g->capp = (g->cap + 31) / 32 * 32;
        size_t nt = (size_t)td_pool_size(g->pool), nqm = (size_t)(p->H / p->KVH) * p->G;
        int rc = 0;
        { /* quant=q8_0 or q4_0: the R16 repacks, made once (under td_draft_repack_q8r's lock) */
            td_tensor *extra[5];
            int ne = own_matrices(p, extra);
            rc = td_draft_repack_q8r(&p->repacked, p->L, p->n_layer, extra, ne, &p->rarena, &p->iarena, err);
        }
        if (rc || (!r16 && !(g->xa = malloc(sizeof(uint16_t) * td_mm_xa_elems(g->max_tok, kmax)))) ||
            (g->b32_att && !(g->bscr = malloc(sizeof(uint16_t) * nt * TD_ATTEND_QMAX * ((size_t)g->capb + p->hd)))) ||
            (g->amx_att && (!(g->ascr = malloc(sizeof(float) * nt * (nqm * p->hd + TD_AMX_ATTEND_QMAX * (size_t)g->capp))) ||
                            !(g->apk = calloc(nt * (nqm * p->hd + TD_AMX_ATTEND_QMAX * (size_t)g->capp + 2 * (size_t)BLK_TAIL * p->hd),
                                              sizeof(uint16_t))))) ||
            (p->rarena && !(g->xq = aligned_alloc(64, td_q8r_row_bytes(kmax) * (size_t)g->max_tok)))) { /* 64-byte rows (nn/mmx.h) */
            blk_free_group(g);
            return rc ? rc : td_seterr(err, TD_ENOMEM, "out of memory");
        }
    }
    for (int pos = 0; pos < g->cap; pos++)
        for (int i = 0; i < half; i++) {
            double a = (double)pos / pow(p->theta, (2.0 * i) / p->hd);
            g->rcos[(size_t)pos * half + i] = (float)cos(a);
            g->rsin[(size_t)pos * half + i] = (float)sin(a);
        }
    *out = (td_draft_rows){&blk_rows_vt, g, 0};
    return 0;
}

static int blk_tap_layers(void *self, const int **layers) {
    blk_provider *p = self;
    *layers = p->taps;
    return p->n_taps;
}

static void blk_free(void *self) {
    blk_provider *p = self;
    if (!p) return;
    free(p->L);
    free(p->qarena);
    free(p->rarena);
    free(p->iarena);
    td_draft_vocab_free(&p->voc);
    td_draft_vocab_free(&p->mvoc);
    free(p->mkp);
    td_draft_weights_free(&p->w);
    free(p);
}

static const td_drafter_vt blk_vt = {.open_rows = blk_open_rows, .tap_layers = blk_tap_layers, .free = blk_free};

static int bind(blk_provider *p, td_tensor *t, const char *name, int64_t d0, int64_t d1, const char *path, td_err *err) {
    (void)path;
    return td_draft_weights_bind(&p->w, t, name, d0, d1, err);
}

/* An integer field in [lo, hi]; names the field when it is missing or wrong. */
static int cfg_int(const cJSON *j, const char *key, int lo, int hi, int *out, const char *path, td_err *err) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) || v->valuedouble < lo || v->valuedouble > hi)
        return td_seterr(err, TD_EFORMAT, "%s: %s must be an integer in [%d, %d]", path, key, lo, hi);
    *out = (int)v->valuedouble;
    return 0;
}

static int cfg_num(const cJSON *j, const char *key, double *out, const char *path, td_err *err) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble) || v->valuedouble <= 0)
        return td_seterr(err, TD_EFORMAT, "%s: %s must be a positive number", path, key);
    *out = v->valuedouble;
    return 0;
}

static int parse_config(blk_provider *p, const cJSON *j, const td_config *tc, const char *path, td_err *err) {
    const cJSON *arch = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(j, "architectures"), 0);
    if (!cJSON_IsString(arch) || strcmp(arch->valuestring, "TandemBlockDrafter") != 0)
        return td_seterr(err, TD_EUNSUPPORTED, "%s: architectures[0] must be \"TandemBlockDrafter\"", path);
    int th, tl, tv, hs, rc;
    if ((rc = cfg_int(j, "target_hidden_size", 1, 1 << 20, &th, path, err)) ||
        (rc = cfg_int(j, "target_num_hidden_layers", 1, 1 << 16, &tl, path, err)) ||
        (rc = cfg_int(j, "target_vocab_size", 1, 1 << 24, &tv, path, err)))
        return rc;
    if (th != tc->n_embd || tl != tc->n_layer || tv != tc->n_vocab)
        return td_seterr(err, TD_EINVAL, "%s: this drafter was trained for a target with hidden size %d, %d layers, vocabulary %d; "
                         "the target has %d, %d, %d", path, th, tl, tv, tc->n_embd, tc->n_layer, tc->n_vocab);
    const cJSON *taps = cJSON_GetObjectItemCaseSensitive(j, "tap_layers");
    int nt = cJSON_GetArraySize(taps);
    if (!cJSON_IsArray(taps) || nt < 1 || nt > BLK_MAX_TAPS)
        return td_seterr(err, TD_EFORMAT, "%s: tap_layers must be an array of 1..%d layer indices", path, BLK_MAX_TAPS);
    for (int i = 0; i < nt; i++) {
        const cJSON *v = cJSON_GetArrayItem(taps, i);
        if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) || v->valuedouble < 0 || v->valuedouble > tc->n_layer)
            return td_seterr(err, TD_EINVAL, "%s: tap_layers[%d] is not a layer of the target (0..%d)", path, i, tc->n_layer);
        p->taps[i] = (int)v->valuedouble;
    }
    p->n_taps = nt;
    double eps, theta;
    if ((rc = cfg_int(j, "hidden_size", 1, 1 << 20, &hs, path, err)) || (rc = cfg_int(j, "block_size", 2, BLK_MAX_G, &p->G, path, err)) ||
        (rc = cfg_int(j, "mask_token_id", 0, tc->n_vocab - 1, &p->mask_id, path, err)) ||
        (rc = cfg_int(j, "num_hidden_layers", 1, BLK_MAX_LAYERS, &p->n_layer, path, err)) ||
        (rc = cfg_int(j, "num_attention_heads", 1, 1024, &p->H, path, err)) ||
        (rc = cfg_int(j, "num_key_value_heads", 1, 1024, &p->KVH, path, err)) ||
        (rc = cfg_int(j, "head_dim", 2, 1024, &p->hd, path, err)) ||
        (rc = cfg_int(j, "intermediate_size", 1, 1 << 20, &p->F, path, err)) ||
        (rc = cfg_int(j, "markov_rank", 0, 4096, &p->rank, path, err)) ||
        (rc = cfg_num(j, "rms_norm_eps", &eps, path, err)) || (rc = cfg_num(j, "rope_theta", &theta, path, err)))
        return rc;
    if (hs != tc->n_embd) return td_seterr(err, TD_EINVAL, "%s: hidden_size %d differs from the target's %d (the embeddings are shared)", path, hs, tc->n_embd);
    if (p->H % p->KVH || p->hd % 2)
        return td_seterr(err, TD_EFORMAT, "%s: num_attention_heads must be a multiple of num_key_value_heads and head_dim even", path);
    p->eps = (float)eps;
    p->theta = theta;
    const cJSON *thr = cJSON_GetObjectItemCaseSensitive(j, "prune_thresholds");
    p->n_thr = 0;
    if (thr && !cJSON_IsNull(thr)) {
        int n = cJSON_GetArraySize(thr);
        if (!cJSON_IsArray(thr) || (n != 0 && n != p->G - 1))
            return td_seterr(err, TD_EFORMAT, "%s: prune_thresholds must be an array of block_size-1 = %d numbers (or empty)", path, p->G - 1);
        for (int i = 0; i < n; i++) {
            const cJSON *v = cJSON_GetArrayItem(thr, i);
            if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble) || v->valuedouble < 0 || v->valuedouble > 2)
                return td_seterr(err, TD_EFORMAT, "%s: prune_thresholds[%d] must be a number in [0, 2]", path, i);
            p->thr[i] = (float)v->valuedouble;
        }
        p->n_thr = n;
    }
    p->C = 0; /* chain_hidden: optional, absent = no chain head */
    if (cJSON_GetObjectItemCaseSensitive(j, "chain_hidden") && (rc = cfg_int(j, "chain_hidden", 0, 1 << 16, &p->C, path, err)))
        return rc;
    const cJSON *ch = cJSON_GetObjectItemCaseSensitive(j, "confidence_head");
    if (p->n_thr && !cJSON_IsTrue(ch))
        return td_seterr(err, TD_EFORMAT, "%s: prune_thresholds need a confidence head (confidence_head: true)", path);
    return 0;
}

int td_drafter_block_open(td_drafter **out, const char *spec, const td_model *target, td_err *err) {
    *out = NULL;
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", spec ? spec : "");
    int prune = 1;
    long n_sub = 0;
    int quant = 0, lookup = 0;
    char *opt = strchr(dir, ',');
    if (opt) {
        *opt = 0;
        for (char *o = opt + 1, *next; o; o = next) {
            next = strchr(o, ',');
            if (next) *next++ = 0;
            char *end = NULL;
            if (!strcmp(o, "prune=off")) prune = 0;
            else if (!strcmp(o, "prune=on")) prune = 1;
            else if (!strncmp(o, "quant=", 6)) {
                if (!(quant = td_draft_quant_parse(o + 6))) return td_seterr(err, TD_EINVAL, "block: quant= takes q8_0 or q4_0");
            } else if (!strncmp(o, "vocab=", 6) && (n_sub = strtol(o + 6, &end, 10), end != o + 6 && !*end)) {
                if (n_sub < 1 || n_sub > target->cfg.n_vocab)
                    return td_seterr(err, TD_EINVAL, "block: draft vocabulary %ld outside [1, %d]", n_sub, target->cfg.n_vocab);
            } else if (!strncmp(o, "lookup=", 7)) {
                long v = strtol(o + 7, &end, 10);
                if (end == o + 7 || *end || v < 1 || v > TD_LOOKUP_MAX)
                    return td_seterr(err, TD_EINVAL, "block: lookup= takes the shortest n-gram to look up, 1..%d", TD_LOOKUP_MAX);
                lookup = (int)v;
            } else
                return td_seterr(err, TD_EINVAL, "block: unknown option '%s' (use block:DIR[,prune=on|off][,vocab=N][,quant=q8_0|q4_0][,lookup=N])", o);
        }
    }
    if (!*dir) return td_seterr(err, TD_EINVAL, "block: give a directory, as block:DIR");
    char path[4200];
    snprintf(path, sizeof path, "%s/config.json", dir);
    char *txt = NULL;
    int rc = td_read_file(path, &txt, NULL, err);
    if (rc) return rc;
    cJSON *j = cJSON_Parse(txt);
    free(txt);
    blk_provider *p = calloc(1, sizeof *p);
    td_drafter *d = calloc(1, sizeof *d);
    if (!p || !d) rc = td_seterr(err, TD_ENOMEM, "out of memory");
    else if (!cJSON_IsObject(j)) rc = td_seterr(err, TD_EFORMAT, "%s: not a JSON object", path);
    else rc = parse_config(p, j, &target->cfg, path, err);
    int has_conf = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "confidence_head"));
    cJSON_Delete(j);
    if (rc) { free(p); free(d); return rc; }
    p->target = target;
    p->prune = prune;
    p->lookup = lookup;
    p->D = target->cfg.n_embd;
    p->V = target->cfg.n_vocab;
    snprintf(path, sizeof path, "%s", dir);
    if ((rc = td_draft_weights_open(&p->w, dir, err)) != 0) { free(p); free(d); return rc; }
    int D = p->D, Q = p->H * p->hd, KV = p->KVH * p->hd, F = p->F, hd = p->hd;
    p->L = calloc((size_t)p->n_layer, sizeof *p->L);
    if (!p->L) rc = td_seterr(err, TD_ENOMEM, "out of memory");
    if (!rc) rc = bind(p, &p->fc, "fc.weight", D, (int64_t)p->n_taps * D, path, err);
    if (!rc) rc = bind(p, &p->hidden_norm, "hidden_norm.weight", D, 0, path, err);
    if (!rc) rc = bind(p, &p->norm, "norm.weight", D, 0, path, err);
    for (int l = 0; !rc && l < p->n_layer; l++) {
        td_layer_w *L = &p->L[l];
        char nm[128];
#define B_(field, suffix, d0, d1) if (!rc) { snprintf(nm, sizeof nm, "layers.%d.%s", l, suffix); rc = bind(p, &L->field, nm, d0, d1, path, err); }
        B_(attn_norm, "input_layernorm.weight", D, 0)
        B_(wq, "self_attn.q_proj.weight", Q, D)
        B_(wk, "self_attn.k_proj.weight", KV, D)
        B_(wv, "self_attn.v_proj.weight", KV, D)
        B_(wo, "self_attn.o_proj.weight", D, Q)
        B_(q_norm, "self_attn.q_norm.weight", hd, 0)
        B_(k_norm, "self_attn.k_norm.weight", hd, 0)
        B_(ffn_norm, "post_attention_layernorm.weight", D, 0)
        B_(w_gate, "mlp.gate_proj.weight", F, D)
        B_(w_up, "mlp.up_proj.weight", F, D)
        B_(w_down, "mlp.down_proj.weight", D, F)
#undef B_
    }
    if (!rc && p->rank) rc = bind(p, &p->mk_embed, "markov.embed.weight", p->V, p->rank, path, err);
    if (!rc && p->rank) rc = bind(p, &p->mk_out, "markov.out.weight", p->V, p->rank, path, err);
    if (!rc && has_conf) rc = bind(p, &p->conf_w, "confidence.weight", 1, D, path, err);
    if (!rc && has_conf) rc = bind(p, &p->conf_b, "confidence.bias", 1, 0, path, err);
    if (!rc && p->C) rc = bind(p, &p->ch_enorm, "chain.enorm.weight", D, 0, path, err);
    if (!rc && p->C) rc = bind(p, &p->ch_inp, "chain.inp.weight", p->C, 2 * (int64_t)D, path, err);
    if (!rc && p->C) rc = bind(p, &p->ch_rec, "chain.rec.weight", p->C, p->C, path, err);
    if (!rc && p->C) rc = bind(p, &p->ch_out, "chain.out.weight", D, p->C, path, err);
    /* the draft vocabulary: the same ids (DIR/draft_vocab.json's ranking, else
     * 0..n_sub-1) over the shared LM head and over markov.out */
    p->head = target->w.lm_head;
    if (!rc) rc = td_draft_vocab_open(&p->voc, dir, (int)n_sub, &p->head, err);
    if (!rc && p->rank) rc = td_draft_vocab_open(&p->mvoc, dir, (int)n_sub, &p->mk_out, err);
    if (!rc) p->n_sub = p->voc.n_sub;
    if (!rc && p->rank) {
        if (!(p->mkp = malloc(sizeof(float) * td_panel16_elems(p->rank, p->n_sub))))
            rc = td_seterr(err, TD_ENOMEM, "block: out of memory for the Markov bias");
        else td_panel16_pack(p->mkp, p->mk_out.data, p->mk_out.dtype, p->rank, p->n_sub);
    }
    long long delta = 0;
    td_tensor *extra[5];
    int ne = own_matrices(p, extra);
    /* the draft head's bytes as they are now, before quant= (a view adds none; its
     * gathered or quantized copy is the drafter's own, which delta alone undercounts) */
    size_t head_was = p->n_sub < p->V ? td_dtype_row_bytes(p->head.dtype, D) * (size_t)p->n_sub : 0;
    int head_own = p->voc.rows != NULL || (quant && p->n_sub < p->V);
    if (!rc && quant) rc = td_draft_quantize(p->L, p->n_layer, extra, ne, quant, &p->qarena, &delta, err);
    if (rc) { blk_free(p); free(d); return rc; }
    d->vt = &blk_vt;
    d->self = p;
    d->target = target;
    d->weight_bytes = (size_t)((long long)p->w.bytes + delta) + (head_own ? head_was : 0);
    /* one forward drafts a row's block, the anchor's entry and one per draft:
     * a round of depth k costs k + 1 block steps */
    d->step_extra = 1;
    d->max_drafts = p->G - 1;
    /* a step is one entry of a forward that reads the weights once for all its
     * entries: a whole block (G steps) costs about 0.05 + 3x the drafter's share
     * of the target's bytes in one-token forwards (the tiny-code drafters, amx,
     * q8_0: 0.69 ms a block against a 1.0 ms forward) */
    d->step_cost_hint = (0.05 + 3.0 * ((double)d->weight_bytes + (double)p->n_sub * D * 2.0) /
                                    (double)(target->weight_bytes ? target->weight_bytes : 1)) / p->G;
    char vs[32] = "";
    if (n_sub) snprintf(vs, sizeof vs, ",vocab=%ld", n_sub);
    char ls[24] = "";
    if (lookup) snprintf(ls, sizeof ls, ",lookup=%d", lookup);
    snprintf(d->id, sizeof d->id, "block:%.96s%s%s%s%s%s", dir, prune ? "" : ",prune=off", vs, quant ? ",quant=" : "",
             quant ? td_dtype_name(quant) : "", ls);
    snprintf(d->ns, sizeof d->ns, "block-v3");
    *out = d;
    return 0;
}
