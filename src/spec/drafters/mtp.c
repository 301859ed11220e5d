/* mtp — a multi-token-prediction head over the target's own last hidden state
 * (DeepSeek-V3 / Qwen3-Next style).
 *
 * For position p the head reads the target's residual stream after its last
 * layer, h_p (a tap, before the final norm), and the embedding of the next
 * token x_{p+1}:
 *     u = fc([ norm_emb(E[x_{p+1}]) ; norm_hid(h_p) ])        (Qwen3-Next order)
 *     y = one Qwen3 decoder layer over u (its own KV, RoPE at position p)
 *     logits = lm_head(norm_out(y))                            (target's head)
 * and predicts x_{p+2}. Deeper drafts recurse on (y, drafted token).
 * The layer runs through the ordinary forward (td_ctx) of a one-layer model
 * view that borrows the target's embeddings and LM head, fed input vectors.
 *
 * Row state: the committed stream S and the target's true h for every
 * committed position. The head's KV is valid for positions built from true
 * h; drafting first builds the backlog (positions kv_len..|S|-1, the last one
 * pairing h_{|S|-1} with the pending token), then recurses; commit stores the
 * accepted window's taps and trims the recursive entries away.
 *
 * A draft vocabulary (",vocab=N") cuts the shared LM head — the largest
 * matrix a step reads, as big as the head's layer several times over — to ids
 * 0..N-1 (byte-level BPE ids follow merge order, so these are the most frequent
 * tokens); proposals then come from them only, which verification makes
 * harmless to the output. The head's KV cache has the target context's kv_type.
 * ",quant=q8_0|q4_0" quantizes the head's own matrices (its layer and fc) in
 * memory, and with ",vocab=N" its copy of the N kept LM-head rows; the shared
 * embedding and the target's LM head stay as they are. ",lookup=N":
 * prompt lookup first, as the draft model's (td_draft_lookup); a row a copy
 * serves sits the head out that round and its backlog waits for the next.
 *
 * Files: config.json ("architectures": ["TandemMTP"], target_* fields checked
 * against the target) and model.safetensors with Qwen3-Next-style names
 * (mtp.fc, mtp.pre_fc_norm_embedding, mtp.pre_fc_norm_hidden, mtp.layers.0.*,
 * mtp.norm). */
#define _POSIX_C_SOURCE 200809L
#include "spec/draft.h"
#include "spec/vocab.h"
#include "io/safetensors.h"
#include "model/model.h"
#include "nn/kernels.h"
#include "nn/mmx.h"
#include "nn/pool.h"
#include "nn/q8r.h"
#include "nn/quant.h"
#include "util/util.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MTP_CHUNK 64

typedef struct {
    const td_model *target;   /* borrowed */
    td_st_file *file;         /* owned mapping */
    td_model head;            /* one-layer view; layers owned, rest borrowed */
    td_tensor fc;             /* [D][2D] */
    td_tensor norm_emb, norm_hid; /* [D] */
    int tap;                  /* target layer tapped (= n_layer) */
    int lookup;               /* option lookup=N (prompt lookup first, td_draft_lookup); 0 = off */
    void *qarena;             /* owned: the quantized matrices (quant=), or NULL */
    void *farena;             /* owned: fc's R16 repack (quant=q8_0 under act_type bf16 or amx, made by the
                                 first such group), or NULL */
    int frepacked;            /* 1: td_draft_repack_q8r made it (or found nothing to repack) */
    td_draft_vocab voc;       /* the draft vocabulary (spec/vocab.h) */
    int n_sub;                /* = voc.n_sub */
} mtp_provider;

typedef struct {
    int32_t *stream;          /* [cap] committed tokens */
    float *h;                 /* [cap][D] true target taps by position */
    int len, kv_len, cap;
    int kv_row;
    td_draft_ctxids cx;       /* context ids outside the draft vocabulary (spec/vocab.h) */
} mtp_row;

typedef struct {
    const mtp_provider *p;
    td_ctx *ctx;              /* owned: the head's KV */
    td_sampler *smp;          /* owned */
    mtp_row *rows;            /* [max_rows] */
    int n_rows, max_rows, max_ctx, max_depth, D, max_tokens;
    mtp_row *spare;           /* [max_rows] stream and h buffers of rows that left (owned), for the next rows
                                 to join: their pages are already faulted in (a batch-8 run held at depth 0
                                 otherwise paid a fresh page every 2.7 committed positions of every row) */
    int n_spare;
    int V;                    /* logits per draft position (the draft vocabulary) */
    int n_vocab;              /* the target's full vocabulary */
    float *u;                 /* [max_tokens][D] head inputs */
    float *cat;               /* [max_tokens][2D] fc inputs */
    int act;                  /* the head context's act_type */
    td_pool *pool;            /* borrowed: the head context's (the target's) threads */
    uint16_t *xa;             /* [td_mm_xa_elems(max_tokens, 2D)] fc's input for bf16 products, or NULL */
    uint8_t *xq;              /* [max_tokens] rows of td_q8r_row_bytes(2D): fc's R16 input, or NULL */
    float *emb;               /* [D] scratch */
    float *logits;            /* [max_rows][V] */
    float *qsub;              /* [V] q over the draft vocabulary, before it is spread */
    float *hn;                /* [D] final norm of a row's head output (context ids) */
    float *cxl;               /* [TD_DRAFT_CTXIDS] context ids' logits */
    float *y;                 /* [max_rows][D] head outputs (tap) */
    int *brow, *bn, *bidx;    /* [max_rows] */
    int *mdepth;              /* [max_rows] this round's head depth per row (0 where a lookup served) */
} mtp_group;

/* fc's input row k: [norm_emb(E[x]); norm_hid(h)] for one position. */
static void head_cat(mtp_group *g, int k, int32_t x, const float *h) {
    const mtp_provider *p = g->p;
    int D = g->D;
    float *c = g->cat + (size_t)k * 2 * D;
    td_tensor_row_f32(&p->target->w.tok_embd, x, D, g->emb);
    td_rmsnorm(c, g->emb, p->norm_emb.data, p->norm_emb.dtype, D, p->head.cfg.rms_eps);
    td_rmsnorm(c + D, h, p->norm_hid.data, p->norm_hid.dtype, D, p->head.cfg.rms_eps);
}
/* u[0 .. n) = fc(cat rows 0 .. n): the head's inputs, one product on the pool
 * (R16 under act_type amx with quant=q8_0, as the head's layer) */
static void head_fc(mtp_group *g, int n, float *u) {
    td_mm_part part = {u, g->D, &g->p->fc, g->D};
    td_mm_parts(g->pool, g->act, g->cat, 2 * g->D, n, 2 * g->D, &part, 1, 0, g->xa, g->xq);
}

static int feed(mtp_group *g, int nb, td_err *err);

/* A row's buffers go to the spares (a whole pair; else freed) and its
 * context ids are freed; its KV row is the caller's to remove. */
static void row_release(mtp_group *g, mtp_row *r) {
    if (r->stream && r->h && g->n_spare < g->max_rows) {
        g->spare[g->n_spare].stream = r->stream;
        g->spare[g->n_spare].h = r->h;
        g->n_spare++;
    } else {
        free(r->stream);
        free(r->h);
    }
    r->stream = NULL;
    r->h = NULL;
    td_draft_ctxids_free(&r->cx);
}

static int mtp_append(void *gv, const int32_t *tokens, int n, const float *taps,
                      const td_draft_checkpoint *ck, td_err *err) {
    mtp_group *g = gv;
    if (ck) { /* [int32 n][n tokens][n x D taps] */
        int32_t cn;
        if (strcmp(ck->ns, "mtp-v1") != 0 || ck->size < sizeof cn)
            return td_seterr(err, TD_EFORMAT, "mtp: checkpoint of namespace '%s' is not an mtp-v1 checkpoint", ck->ns);
        memcpy(&cn, ck->data, sizeof cn);
        if (cn < 0 || cn > g->max_ctx ||
            ck->size != sizeof cn + (size_t)cn * (sizeof(int32_t) + sizeof(float) * (size_t)g->D))
            return td_seterr(err, TD_EFORMAT, "mtp: checkpoint of %zu bytes does not hold %d positions of width %d",
                             ck->size, (int)cn, g->D);
        n = cn;
        tokens = (const int32_t *)(ck->data + sizeof cn);
        taps = (const float *)(ck->data + sizeof cn + (size_t)cn * sizeof(int32_t));
    }
    if (g->n_rows >= g->max_rows) return td_seterr(err, TD_EFULL, "mtp: row group is full (%d rows)", g->max_rows);
    if (n > 0 && !taps) return td_seterr(err, TD_EINVAL, "mtp: a row needs the target's taps of its prompt");
    if (n < 0 || n > g->max_ctx) return td_seterr(err, TD_ERANGE, "mtp: stream of %d tokens exceeds the context %d", n, g->max_ctx);
    for (int i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= g->n_vocab)
            return td_seterr(err, TD_ERANGE, "mtp: token %d at position %d is outside the vocabulary", (int)tokens[i], i);
    mtp_row *r = &g->rows[g->n_rows];
    memset(r, 0, sizeof *r);
    r->cap = g->max_ctx + g->max_depth + 2;
    if (g->n_spare > 0) { /* a spare's buffers (every row's are cap long) */
        g->n_spare--;
        r->stream = g->spare[g->n_spare].stream;
        r->h = g->spare[g->n_spare].h;
    } else {
        r->stream = malloc(sizeof(int32_t) * (size_t)r->cap);
        r->h = malloc(sizeof(float) * (size_t)r->cap * (size_t)g->D);
    }
    if (!r->stream || !r->h || td_draft_ctxids_init(&r->cx, &g->p->voc, err) != 0 ||
        td_ctx_row_add(g->ctx, &r->kv_row) != 0) {
        row_release(g, r);
        return td_seterr(err, TD_ENOMEM, "mtp: no memory or KV row for a new row");
    }
    if (n) {
        memcpy(r->stream, tokens, sizeof(int32_t) * (size_t)n);
        memcpy(r->h, taps, sizeof(float) * (size_t)n * g->D);
    }
    r->len = n;
    td_draft_ctxids_note(&g->p->voc, &r->cx, tokens, n);
    /* prefill: positions 0..n-2 (whose next token is known) enter the head's
     * KV now, with the target's prompt processing, not at the first draft */
    while (r->len - 1 - r->kv_len > 0) {
        int back = r->len - 1 - r->kv_len;
        if (back > MTP_CHUNK) back = MTP_CHUNK;
        if (back > g->max_tokens) back = g->max_tokens;
        for (int k = 0; k < back; k++) {
            int pos = r->kv_len + k;
            head_cat(g, k, r->stream[pos + 1], r->h + (size_t)pos * g->D);
        }
        head_fc(g, back, g->u);
        g->bidx[0] = g->n_rows;
        g->bn[0] = back;
        int rc = feed(g, 1, err);
        if (rc) {
            td_ctx_row_remove(g->ctx, r->kv_row);
            row_release(g, r);
            return rc;
        }
        r->kv_len += back;
    }
    g->n_rows++;
    return 0;
}

static int feed(mtp_group *g, int nb, td_err *err) {
    for (int i = 0; i < nb; i++) g->brow[i] = g->rows[g->bidx[i]].kv_row;
    int tap = 1;
    td_batch b = {.n_rows = nb, .rows = g->brow, .n_tokens = g->bn, .embd = g->u, .taps = &tap, .n_taps = 1};
    return td_ctx_forward(g->ctx, &b, g->logits, g->y, err);
}

static int mtp_draft(void *gv, td_draft_req *q, td_err *err) {
    mtp_group *g = gv;
    int D = g->D, rc;
    if (q->n_rows != g->n_rows) return td_seterr(err, TD_ESTATE, "mtp: draft for %d rows, group has %d", q->n_rows, g->n_rows);
    q->has_probs = q->probs != NULL;
    int maxk = 0, *depth = g->mdepth; /* the depth the head drafts: 0 for rows a lookup served */
    for (int i = 0; i < q->n_rows; i++) {
        mtp_row *r = &g->rows[i];
        q->n_tokens[i] = 0;
        depth[i] = q->depth[i];
        if (r->len > 0 && r->kv_len > r->len - 1) { /* drafted again without a commit: drop the last round's entries */
            td_ctx_row_trim(g->ctx, r->kv_row, r->len - 1);
            r->kv_len = r->len - 1;
        }
        /* prompt lookup first (lookup=N, greedy drafts only), as the draft model's */
        if (g->p->lookup && !q->probs && depth[i] > 0 && !(q->own && q->own[i]) &&
            (q->n_tokens[i] = td_draft_lookup(r->stream, r->len, q->pending[i], g->p->lookup, depth[i],
                                              q->tokens + (size_t)i * q->max_depth, NULL)) > 0)
            depth[i] = 0;
        if (depth[i] > maxk) maxk = depth[i];
    }
    if (!maxk) return 0;
    /* 1. backlog: positions kv_len..len-2, whose next token is committed; all
     * but the last MTP_CHUNK of them in chunks here, the rest with step 0 */
    for (;;) {
        int nb = 0, nt = 0;
        for (int i = 0; i < q->n_rows; i++) {
            mtp_row *r = &g->rows[i];
            int back = r->len - 1 - r->kv_len;
            if (depth[i] <= 0 || back <= MTP_CHUNK) continue;
            int n = back - MTP_CHUNK < MTP_CHUNK ? back - MTP_CHUNK : MTP_CHUNK;
            if (nt + n > g->max_tokens) break;
            for (int k = 0; k < n; k++) {
                int pos = r->kv_len + k;
                head_cat(g, nt + k, r->stream[pos + 1], r->h + (size_t)pos * D);
            }
            g->bidx[nb] = i; g->bn[nb] = n; nb++; nt += n;
        }
        if (!nb) break;
        head_fc(g, nt, g->u);
        if ((rc = feed(g, nb, err)) != 0) return rc;
        for (int b = 0; b < nb; b++) g->rows[g->bidx[b]].kv_len += g->bn[b];
    }
    /* 2. step 0 feeds a row's remaining backlog and then position len-1, which
     * pairs h_{len-1} with the pending token: its output is d1; deeper drafts
     * recurse on (y, d_j). A row with no committed token yet (a one-token
     * prompt) has no hidden state to start from: it proposes nothing this
     * round. */
    for (int j = 0; j < maxk; j++) {
        int nb = 0, nt = 0;
        for (int i = 0; i < q->n_rows; i++) {
            mtp_row *r = &g->rows[i];
            if (depth[i] <= j || r->len == 0) continue;
            int back = j == 0 ? r->len - 1 - r->kv_len : 0;
            for (int k = 0; k < back; k++) {
                int pos = r->kv_len + k;
                head_cat(g, nt + k, r->stream[pos + 1], r->h + (size_t)pos * D);
            }
            if (j == 0)
                head_cat(g, nt + back, q->pending[i], r->h + (size_t)(r->len - 1) * D);
            else
                head_cat(g, nt + back, q->tokens[(size_t)i * q->max_depth + j - 1], g->y + (size_t)i * D);
            g->bidx[nb] = i; g->bn[nb] = back + 1; nb++; nt += back + 1;
        }
        if (!nb) break;
        head_fc(g, nt, g->u);
        if ((rc = feed(g, nb, err)) != 0) return rc;
        for (int b = nb - 1; b >= 0; b--) {
            int i = g->bidx[b];
            mtp_row *r = &g->rows[i];
            r->kv_len += g->bn[b];
            const float *lg = g->logits + (size_t)b * g->V;
            memmove(g->y + (size_t)i * D, g->y + (size_t)b * D, sizeof(float) * (size_t)D);
            int32_t d;
            if (q->probs) {
                td_sampling sp = *q->sampling[i];
                sp.seed ^= 0x6a09e667f3bcc908ull; /* the head's own draw stream */
                float *pr = q->probs + ((size_t)i * q->max_depth + j) * g->n_vocab;
                d = td_sampler_sample_probs(g->smp, &sp, lg, NULL, 0, q->out_pos[i] + (uint64_t)j, g->qsub);
                if (d < 0) return td_seterr(err, d, "mtp: sampling failed");
                td_draft_vocab_scatter(&g->p->voc, g->qsub, pr); /* q is zero outside the draft vocabulary */
                d = td_draft_vocab_id(&g->p->voc, d);
            } else {
                const float *hn = NULL;
                if (r->cx.n) {
                    const td_model *h = &g->p->head;
                    td_rmsnorm(g->hn, g->y + (size_t)i * D, h->w.out_norm.data, h->w.out_norm.dtype, D, h->cfg.rms_eps);
                    hn = g->hn;
                }
                d = td_draft_vocab_pick(&g->p->voc, lg, &r->cx, hn, g->cxl);
            }
            q->tokens[(size_t)i * q->max_depth + j] = d;
            q->n_tokens[i] = j + 1;
        }
    }
    return 0;
}

static int32_t *mtp_stream(void *gv, int i, int *len) {
    mtp_group *g = gv;
    *len = g->rows[i].len;
    return g->rows[i].stream;
}

/* lookup=N: the prompt lookup's proposals are on offer before the group plans
 * (draft.h); a row drafted from its offer comes to draft() at depth 0, so the
 * MTP head skips it that round. Without lookup= nothing is on offer. */
static int mtp_offer(void *gv, const int32_t *pending, int max_depth, int32_t *tokens, int *n_tokens, int *match,
                       td_err *err) {
    mtp_group *g = gv;
    (void)err;
    td_draft_offer_lookup(g, g->n_rows, mtp_stream, g->p->lookup, pending, max_depth, tokens, n_tokens, match);
    return 0;
}

static int mtp_commit(void *gv, const td_draft_commit *cm, int n_rows, td_err *err) {
    mtp_group *g = gv;
    int D = g->D;
    for (int i = 0; i < n_rows; i++) {
        mtp_row *r = &g->rows[i];
        int n = r->len, m = cm[i].n_accepted;
        if (n + 1 + m > r->cap) return td_seterr(err, TD_EFULL, "mtp: row %d stream is full", i);
        r->stream[n] = cm[i].old_pending;
        if (m > 0) memcpy(r->stream + n + 1, cm[i].accepted, sizeof(int32_t) * (size_t)m);
        if (cm[i].taps) memcpy(r->h + (size_t)n * D, cm[i].taps, sizeof(float) * (size_t)(m + 1) * D);
        else memset(r->h + (size_t)n * D, 0, sizeof(float) * (size_t)(m + 1) * D);
        r->len = n + 1 + m;
        td_draft_ctxids_note(&g->p->voc, &r->cx, r->stream + n, m + 1);
        /* only positions built from true taps stay: 0..n-1 */
        int keep = r->kv_len < n ? r->kv_len : n;
        if (keep < r->kv_len) { td_ctx_row_trim(g->ctx, r->kv_row, keep); r->kv_len = keep; }
    }
    return 0;
}

static void mtp_filter(void *gv, const int *keep, int n_keep) {
    mtp_group *g = gv;
    int k = 0;
    for (int i = 0; i < g->n_rows; i++) {
        if (k < n_keep && keep[k] == i) { g->rows[k++] = g->rows[i]; continue; }
        td_ctx_row_remove(g->ctx, g->rows[i].kv_row);
        row_release(g, &g->rows[i]);
    }
    g->n_rows = n_keep;
}

static int mtp_capture(void *gv, int row, td_draft_checkpoint **out, td_err *err) {
    mtp_group *g = gv;
    *out = NULL;
    if (row < 0 || row >= g->n_rows) return td_seterr(err, TD_EINVAL, "mtp: no row %d", row);
    mtp_row *r = &g->rows[row];
    int32_t cn = r->len;
    size_t bytes = sizeof cn + (size_t)cn * (sizeof(int32_t) + sizeof(float) * (size_t)g->D);
    td_draft_checkpoint *ck;
    int rc = td_draft_checkpoint_new(&ck, "mtp-v1", bytes, err);
    if (rc) return rc;
    memcpy(ck->data, &cn, sizeof cn);
    memcpy(ck->data + sizeof cn, r->stream, sizeof(int32_t) * (size_t)cn);
    memcpy(ck->data + sizeof cn + sizeof(int32_t) * (size_t)cn, r->h, sizeof(float) * (size_t)cn * g->D);
    *out = ck;
    return 0;
}

static void mtp_free_group(void *gv) {
    mtp_group *g = gv;
    if (!g) return;
    for (int i = 0; i < g->n_rows; i++) { free(g->rows[i].stream); free(g->rows[i].h); td_draft_ctxids_free(&g->rows[i].cx); }
    for (int i = 0; i < g->n_spare; i++) { free(g->spare[i].stream); free(g->spare[i].h); }
    free(g->spare);
    td_ctx_free(g->ctx);
    td_sampler_free(g->smp);
    free(g->rows); free(g->u); free(g->cat); free(g->xa); free(g->xq); free(g->emb); free(g->logits); free(g->qsub); free(g->hn); free(g->cxl); free(g->y);
    free(g->brow); free(g->bn); free(g->bidx); free(g->mdepth);
    free(g);
}

static const td_draft_rows_vt mtp_rows_vt = {
    .append = mtp_append, .draft = mtp_draft, .offer = mtp_offer, .commit = mtp_commit,
    .filter = mtp_filter, .capture = mtp_capture, .free = mtp_free_group,
};

static int mtp_open_rows(void *self, int max_rows, int max_ctx, int max_depth, const td_ctx *target_ctx,
                         td_draft_rows *out, td_err *err) {
    mtp_provider *p = self;
    mtp_group *g = calloc(1, sizeof *g);
    if (!g) return td_seterr(err, TD_ENOMEM, "out of memory");
    g->p = p;
    g->max_rows = max_rows;
    g->max_ctx = max_ctx;
    g->max_depth = max_depth;
    g->D = p->head.cfg.n_embd;
    g->V = p->head.cfg.n_vocab; /* = p->n_sub */
    g->n_vocab = p->target->cfg.n_vocab;
    g->max_tokens = max_rows * (MTP_CHUNK + 2);
    td_ctx_params cp = td_ctx_default_params();
    cp.max_rows = max_rows;
    cp.share_threads = target_ctx;
    cp.serial_tokens = td_draft_serial_tokens(&p->head);
    cp.max_ctx = max_ctx + max_depth + 2;
    cp.max_tokens = g->max_tokens;
    cp.max_logits = g->max_tokens; /* a feed asks for each row's last position only */
    if (target_ctx) cp.kv_type = td_ctx_get_params(target_ctx).kv_type; /* the head's KV follows the target's */
    if (target_ctx) cp.act_type = td_ctx_get_params(target_ctx).act_type; /* and its activation type */
    int rc = td_ctx_open(&g->ctx, &p->head, &cp, err);
    if (rc) { free(g); return rc; }
    g->rows = calloc((size_t)max_rows, sizeof *g->rows);
    g->spare = calloc((size_t)max_rows, sizeof *g->spare);
    g->u = malloc(sizeof(float) * (size_t)g->max_tokens * g->D);
    g->cat = malloc(sizeof(float) * 2 * (size_t)g->max_tokens * g->D);
    g->emb = malloc(sizeof(float) * (size_t)g->D);
    g->logits = malloc(sizeof(float) * (size_t)max_rows * g->V);
    g->qsub = malloc(sizeof(float) * (size_t)g->V);
    g->hn = malloc(sizeof(float) * (size_t)g->D);
    g->cxl = malloc(sizeof(float) * TD_DRAFT_CTXIDS);
    g->y = malloc(sizeof(float) * (size_t)max_rows * g->D);
    g->brow = malloc(sizeof(int) * (size_t)max_rows);
    g->bn = malloc(sizeof(int) * (size_t)max_rows);
    g->bidx = malloc(sizeof(int) * (size_t)max_rows);
    g->mdepth = malloc(sizeof(int) * (size_t)max_rows);
    if (!g->rows || !g->spare || !g->u || !g->cat || !g->emb || !g->logits || !g->qsub || !g->hn || !g->cxl || !g->y || !g->brow || !g->bn || !g->bidx || !g->mdepth ||
        td_sampler_open(&g->smp, g->V) != 0) {
        mtp_free_group(g);
        return td_seterr(err, TD_ENOMEM, "out of memory");
    }
    g->pool = td_ctx_pool(g->ctx);
    g->act = td_ctx_get_params(g->ctx).act_type;
    if (g->act != TD_DTYPE_F32 && td_q8r_dtype_ok(p->fc.dtype)) { /* bf16, amx: fc in the R16 order too */
        td_tensor *fc = &p->fc; /* fc's R16 repack, made once (the head's layer has its own, made by td_ctx_open) */
        if ((rc = td_draft_repack_q8r(&p->frepacked, NULL, 0, &fc, 1, &p->farena, NULL, err)) != 0) { mtp_free_group(g); return rc; }
    }
    if ((g->act != TD_DTYPE_F32 && p->fc.dtype == TD_DTYPE_BF16 &&
         !(g->xa = malloc(sizeof(uint16_t) * td_mm_xa_elems(g->max_tokens, 2 * g->D)))) ||
        (g->act != TD_DTYPE_F32 && p->farena && !(g->xq = malloc(td_q8r_row_bytes(2 * g->D) * (size_t)g->max_tokens)))) {
        mtp_free_group(g);
        return td_seterr(err, TD_ENOMEM, "out of memory");
    }
    *out = (td_draft_rows){&mtp_rows_vt, g, 0};
    return 0;
}

static int mtp_tap_layers(void *self, const int **layers) {
    mtp_provider *p = self;
    *layers = &p->tap;
    return 1;
}

static void mtp_free(void *self) {
    mtp_provider *p = self;
    if (!p) return;
    free(p->head.w.layers);
    free(p->head.q8r_arena); /* the head's repacks (act_type bf16 or amx), made by td_ctx_open */
    free(p->head.p24_arena); /* its P24 copies (act_type bf16), likewise */
    free(p->qarena);
    free(p->farena);
    td_draft_vocab_free(&p->voc);
    td_st_free(p->file);
    free(p);
}

static const td_drafter_vt mtp_vt = {.open_rows = mtp_open_rows, .tap_layers = mtp_tap_layers, .free = mtp_free};

static int bind(mtp_provider *p, td_tensor *t, const char *name, int64_t d0, int64_t d1, const char *path, td_err *err) {
    return td_draft_bind(p->file, t, name, d0, d1, path, err);
}

static int cfg_int(const cJSON *j, const char *key, int *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
    if (!cJSON_IsNumber(v) || v->valuedouble != (double)(int)v->valuedouble) return 0;
    *out = (int)v->valuedouble;
    return 1;
}

int td_drafter_mtp_open(td_drafter **out, const char *dir, int n_sub, int quant, int lookup, const td_model *target,
                        td_err *err) {
    *out = NULL;
    if (!dir || !*dir) return td_seterr(err, TD_EINVAL, "mtp: give a directory, as mtp:DIR");
    if (lookup < 0 || lookup > TD_LOOKUP_MAX) return td_seterr(err, TD_EINVAL, "mtp: lookup=%d outside [1, %d]", lookup, TD_LOOKUP_MAX);
    if (n_sub < 0 || n_sub > target->cfg.n_vocab)
        return td_seterr(err, TD_EINVAL, "mtp %s: draft vocabulary %d outside [1, %d]", dir, n_sub, target->cfg.n_vocab);
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    char *txt = NULL;
    int rc = td_read_file(path, &txt, NULL, err);
    if (rc) return rc;
    cJSON *j = cJSON_Parse(txt);
    free(txt);
    if (!cJSON_IsObject(j)) { cJSON_Delete(j); return td_seterr(err, TD_EFORMAT, "%s: not a JSON object", path); }
    const td_config *tc = &target->cfg;
    int th = 0, tl = 0, tv = 0, nl = 0, tap = 0;
    const cJSON *arch = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(j, "architectures"), 0);
    if (!cJSON_IsString(arch) || strcmp(arch->valuestring, "TandemMTP") != 0) {
        rc = td_seterr(err, TD_EUNSUPPORTED, "%s: architectures[0] must be \"TandemMTP\"", path);
    } else if (!cfg_int(j, "target_hidden_size", &th) || !cfg_int(j, "target_num_hidden_layers", &tl) ||
               !cfg_int(j, "target_vocab_size", &tv) || !cfg_int(j, "num_mtp_layers", &nl) || !cfg_int(j, "tap_layer", &tap)) {
        rc = td_seterr(err, TD_EFORMAT, "%s: needs integer target_hidden_size, target_num_hidden_layers, target_vocab_size, num_mtp_layers, tap_layer", path);
    } else if (th != tc->n_embd || tl != tc->n_layer || tv != tc->n_vocab) {
        rc = td_seterr(err, TD_EINVAL, "%s: this head was trained for a target with hidden size %d, %d layers, vocabulary %d; "
                       "the target has %d, %d, %d", path, th, tl, tv, tc->n_embd, tc->n_layer, tc->n_vocab);
    } else if (nl != 1) {
        rc = td_seterr(err, TD_EUNSUPPORTED, "%s: num_mtp_layers %d (tandem supports 1)", path, nl);
    } else if (tap != tc->n_layer) {
        rc = td_seterr(err, TD_EUNSUPPORTED, "%s: tap_layer %d (the head reads the last layer, %d)", path, tap, tc->n_layer);
    }
    cJSON_Delete(j);
    if (rc) return rc;
    mtp_provider *p = calloc(1, sizeof *p);
    td_drafter *d = calloc(1, sizeof *d);
    if (!p || !d) { free(p); free(d); return td_seterr(err, TD_ENOMEM, "out of memory"); }
    p->target = target;
    p->tap = tc->n_layer;
    p->lookup = lookup;
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    if ((rc = td_st_open(&p->file, path, err)) != 0) { free(p); free(d); return rc; }
    /* the one-layer view: the target's config with one layer; its head and embeddings */
    td_model *h = &p->head;
    h->cfg = *tc;
    h->cfg.n_layer = 1;
    h->cfg.qk_norm = 1;
    h->cfg.attn_bias = 0;
    h->w.tok_embd = target->w.tok_embd;
    h->w.lm_head = target->w.lm_head;
    if ((rc = td_draft_vocab_open(&p->voc, dir, n_sub, &h->w.lm_head, err)) != 0) { td_st_free(p->file); free(p); free(d); return rc; }
    p->n_sub = p->voc.n_sub;
    h->cfg.n_vocab = p->n_sub;
    h->w.layers = calloc(1, sizeof(td_layer_w));
    int D = tc->n_embd, Q = tc->n_head * tc->head_dim, KV = tc->n_kv_head * tc->head_dim, F = tc->n_ff, hd = tc->head_dim;
    td_layer_w *L = h->w.layers;
    if (!L) rc = td_seterr(err, TD_ENOMEM, "out of memory");
    if (!rc) rc = bind(p, &p->fc, "mtp.fc.weight", D, 2 * D, path, err);
    if (!rc) rc = bind(p, &p->norm_emb, "mtp.pre_fc_norm_embedding.weight", D, 0, path, err);
    if (!rc) rc = bind(p, &p->norm_hid, "mtp.pre_fc_norm_hidden.weight", D, 0, path, err);
    if (!rc) rc = bind(p, &h->w.out_norm, "mtp.norm.weight", D, 0, path, err);
    if (!rc) rc = bind(p, &L->attn_norm, "mtp.layers.0.input_layernorm.weight", D, 0, path, err);
    if (!rc) rc = bind(p, &L->wq, "mtp.layers.0.self_attn.q_proj.weight", Q, D, path, err);
    if (!rc) rc = bind(p, &L->wk, "mtp.layers.0.self_attn.k_proj.weight", KV, D, path, err);
    if (!rc) rc = bind(p, &L->wv, "mtp.layers.0.self_attn.v_proj.weight", KV, D, path, err);
    if (!rc) rc = bind(p, &L->wo, "mtp.layers.0.self_attn.o_proj.weight", D, Q, path, err);
    if (!rc) rc = bind(p, &L->q_norm, "mtp.layers.0.self_attn.q_norm.weight", hd, 0, path, err);
    if (!rc) rc = bind(p, &L->k_norm, "mtp.layers.0.self_attn.k_norm.weight", hd, 0, path, err);
    if (!rc) rc = bind(p, &L->ffn_norm, "mtp.layers.0.post_attention_layernorm.weight", D, 0, path, err);
    if (!rc) rc = bind(p, &L->w_gate, "mtp.layers.0.mlp.gate_proj.weight", F, D, path, err);
    if (!rc) rc = bind(p, &L->w_up, "mtp.layers.0.mlp.up_proj.weight", F, D, path, err);
    if (!rc) rc = bind(p, &L->w_down, "mtp.layers.0.mlp.down_proj.weight", D, F, path, err);
    long long delta = 0;
    /* with a draft vocabulary the LM head a step reads is the head's own copy of
     * n_sub rows: quant= quantizes it with the layer (the target's stays as it is) */
    td_tensor *extra[] = {&p->fc, &h->w.lm_head};
    int n_extra = n_sub > 0 && p->n_sub < tc->n_vocab ? 2 : 1;
    /* the head copy's bytes before quant= (a view adds none; a gathered or
     * quantized copy is the drafter's own, which delta alone undercounts) */
    size_t head_was = n_extra == 2 ? td_dtype_row_bytes(h->w.lm_head.dtype, D) * (size_t)p->n_sub : 0;
    int head_own = p->voc.rows != NULL || (quant && n_extra == 2);
    h->p24_not_head = !head_own; /* a view of the target's LM head: its P24 copy is the target's business */
    if (!rc && quant) rc = td_draft_quantize(L, 1, extra, n_extra, quant, &p->qarena, &delta, err);
    if (rc) { mtp_free(p); free(d); return rc; }
    d->vt = &mtp_vt;
    d->self = p;
    d->target = target;
    d->weight_bytes = (size_t)((long long)p->file->map_len + delta) + (head_own ? head_was : 0);
    /* a step reads the head's layer and the target's LM head */
    d->step_cost_hint = 0.1 + ((double)d->weight_bytes + (double)p->n_sub * tc->n_embd * 2.0) /
                                  (double)(target->weight_bytes ? target->weight_bytes : 1);
    char vs[32] = "", ls[16] = "";
    if (n_sub) snprintf(vs, sizeof vs, ",vocab=%d", n_sub);
    if (lookup) snprintf(ls, sizeof ls, ",lookup=%d", lookup);
    snprintf(d->id, sizeof d->id, "mtp:%.96s%s%s%s%s", dir, vs, quant ? ",quant=" : "", quant ? td_dtype_name(quant) : "", ls);
    snprintf(d->ns, sizeof d->ns, "mtp-v1");
    *out = d;
    return 0;
}
