/* model — a separate, smaller draft model with its own KV cache.
 *
 * The provider owns the draft model (any directory the loader reads) and checks
 * at open that its tokenizer is the target's, id for id. A row group owns one
 * draft context with a KV row per group row. Each row keeps its committed
 * stream and a copy of the tokens its draft KV holds; drafting first feeds the
 * backlog (committed tokens not yet in the draft KV, then the pending token) for
 * all rows in one ragged forward, then one batched step per further draft
 * position. Commit keeps the draft KV up to its longest prefix that agrees with
 * the committed stream (accepted drafts are exactly what the drafter fed
 * itself), so rollback is a trim. Greedy drafting under the match rule; under
 * the rejection rule each draft is sampled from the draft model's own
 * distribution (q) with a draw stream separate from the target's.
 * A draft vocabulary (",vocab=N", spec/vocab.h) cuts the draft's LM head, its
 * largest matrix, to N ids (ranked by DIR/draft_vocab.json, else 0..N-1);
 * proposals then come from them only (q is zero elsewhere), which the target's
 * verification makes harmless to the output.
 * The draft context's KV cache has the target context's kv_type (--kv-type
 * applies to both; a draft's storage changes proposals, never the output).
 * Prompt lookup (",lookup=N", greedy drafts): before the model runs, a row whose
 * last N..TD_LOOKUP_MAX tokens (pending included, longest first) occurred
 * earlier in its stream proposes what followed them (td_draft_lookup, over the
 * ngram drafter's search) and sits the model out that round; its draft KV catches up
 * at its next model round, with the backlog. */
#include "spec/draft.h"
#include "spec/vocab.h"
#include "model/model.h"
#include "nn/kernels.h"
#include "util/util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CATCHUP_CHUNK 64

typedef struct {
    td_model *m;     /* owned draft model */
    td_model view;   /* the model the draft context runs: m, with the LM head cut
                        to the draft vocabulary when one is set */
    td_draft_vocab voc; /* the draft vocabulary (n_sub ids; all when unset) */
    int n_sub;       /* = voc.n_sub */
    int lookup;      /* option lookup=N: prompt lookup of n-grams of N..TD_LOOKUP_MAX tokens first; 0 = off */
} dm_provider;

typedef struct {
    int32_t *stream;   /* [cap] committed tokens */
    int32_t *kv_tok;   /* [cap] tokens held in the draft KV */
    int len, kv_len, cap;
    int kv_row;        /* row in the draft context */
    td_draft_ctxids cx; /* context ids outside the draft vocabulary (spec/vocab.h) */
} dm_row;

typedef struct {
    const dm_provider *p;
    td_ctx *ctx;       /* owned */
    td_sampler *smp;   /* owned */
    dm_row *rows;      /* [max_rows] */
    int n_rows, max_rows, max_ctx, max_depth, n_vocab; /* n_vocab: full vocabulary */
    int n_sub;         /* logits per draft position (the draft vocabulary) */
    float *logits;     /* [max_rows][n_sub] */
    float *qsub;       /* [n_sub] q over the draft vocabulary, before it is spread */
    float *taps;       /* [max_rows][n_embd] final residual of each fed row (context ids) */
    float *hn;         /* [n_embd] its final norm */
    float *cxl;        /* [TD_DRAFT_CTXIDS] context ids' logits */
    float *embd;       /* [max_tokens][n_embd] input embeddings (any id, full table) */
    int32_t *btok;     /* [max_tokens] batch tokens */
    int *brow, *bn;    /* [max_rows] batch rows / counts */
    int *bidx;         /* [max_rows] group row of each batch row */
    int *mdepth;       /* [max_rows] this round's model depth per row (0 where a lookup served) */
    int max_tokens;
} dm_group;

static int feed(dm_group *g, int nb, td_err *err);
static void kv_push(dm_row *r, const int32_t *t, int n);

static int dm_append(void *gv, const int32_t *tokens, int n, const float *taps,
                     const td_draft_checkpoint *ck, td_err *err) {
    dm_group *g = gv;
    (void)taps;
    if (g->n_rows >= g->max_rows) return td_seterr(err, TD_EFULL, "draft model: row group is full (%d rows)", g->max_rows);
    if (ck) {
        if (strcmp(ck->ns, "model-v1") != 0 || ck->size % sizeof(int32_t))
            return td_seterr(err, TD_EFORMAT, "draft model: checkpoint of namespace '%s' is not a model-v1 checkpoint", ck->ns);
        tokens = (const int32_t *)ck->data;
        n = (int)(ck->size / sizeof(int32_t));
    }
    if (n < 0 || n > g->max_ctx) return td_seterr(err, TD_ERANGE, "draft model: stream of %d tokens exceeds the context %d", n, g->max_ctx);
    dm_row *r = &g->rows[g->n_rows];
    memset(r, 0, sizeof *r);
    r->cap = g->max_ctx + g->max_depth + 2;
    r->stream = malloc(sizeof(int32_t) * (size_t)r->cap);
    r->kv_tok = malloc(sizeof(int32_t) * (size_t)r->cap);
    if (!r->stream || !r->kv_tok || td_draft_ctxids_init(&r->cx, &g->p->voc, err) != 0 ||
        td_ctx_row_add(g->ctx, &r->kv_row) != 0) {
        free(r->stream); free(r->kv_tok); td_draft_ctxids_free(&r->cx);
        return td_seterr(err, TD_ENOMEM, "draft model: no memory or KV row for a new row");
    }
    for (int i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= g->n_vocab) {
            td_ctx_row_remove(g->ctx, r->kv_row);
            free(r->stream); free(r->kv_tok); td_draft_ctxids_free(&r->cx);
            return td_seterr(err, TD_ERANGE, "draft model: token %d out of range", (int)tokens[i]);
        }
    if (n) memcpy(r->stream, tokens, sizeof(int32_t) * (size_t)n);
    r->len = n;
    td_draft_ctxids_note(&g->p->voc, &r->cx, tokens, n);
    /* prefill: the stream enters the draft KV now, with the target's prompt
     * processing, rather than as a backlog at the row's first draft */
    for (int done = 0; done < n;) {
        int c = n - done < g->max_tokens ? n - done : g->max_tokens;
        memcpy(g->btok, r->stream + done, sizeof(int32_t) * (size_t)c);
        g->bidx[0] = g->n_rows;
        g->bn[0] = c;
        int rc = feed(g, 1, err);
        if (rc) {
            td_ctx_row_remove(g->ctx, r->kv_row);
            free(r->stream); free(r->kv_tok); td_draft_ctxids_free(&r->cx);
            return rc;
        }
        kv_push(r, r->stream + done, c);
        done += c;
    }
    g->n_rows++;
    return 0;
}

/* Feed the rows listed in bidx[0..nb): tokens already laid out in btok/bn. */
static int feed(dm_group *g, int nb, td_err *err) {
    int nt = 0;
    for (int i = 0; i < nb; i++) { g->brow[i] = g->rows[g->bidx[i]].kv_row; nt += g->bn[i]; }
    /* embeddings looked up here: a cut LM head leaves the full input table */
    const td_tensor *E = &g->p->m->w.tok_embd;
    int D = g->p->m->cfg.n_embd;
    for (int t = 0; t < nt; t++) td_tensor_row_f32(E, g->btok[t], D, g->embd + (size_t)t * D);
    td_batch b = {.n_rows = nb, .rows = g->brow, .n_tokens = g->bn, .embd = g->embd};
    int last = g->p->m->cfg.n_layer;
    if (g->p->voc.kept) { b.taps = &last; b.n_taps = 1; } /* for the context ids' logits */
    return td_ctx_forward(g->ctx, &b, g->logits, g->p->voc.kept ? g->taps : NULL, err);
}

static void kv_push(dm_row *r, const int32_t *t, int n) {
    memcpy(r->kv_tok + r->kv_len, t, sizeof(int32_t) * (size_t)n);
    r->kv_len += n;
}

static int dm_draft(void *gv, td_draft_req *q, td_err *err) {
    dm_group *g = gv;
    if (q->n_rows != g->n_rows) return td_seterr(err, TD_ESTATE, "draft model: draft for %d rows, group has %d", q->n_rows, g->n_rows);
    q->has_probs = q->probs != NULL;
    int maxk = 0, *depth = g->mdepth; /* the depth the model drafts: 0 for rows a lookup served */
    for (int i = 0; i < q->n_rows; i++) {
        q->n_tokens[i] = 0;
        depth[i] = q->depth[i];
        if (q->depth[i] > 0 && g->rows[i].len + 1 + q->depth[i] > g->max_ctx + g->max_depth)
            return td_seterr(err, TD_EFULL, "draft model: row %d is past its context", i);
        if (g->rows[i].kv_len > g->rows[i].len) { /* drafted again without a commit: drop the last round's drafts */
            td_ctx_row_trim(g->ctx, g->rows[i].kv_row, g->rows[i].len);
            g->rows[i].kv_len = g->rows[i].len;
        }
        /* prompt lookup first (lookup=N, greedy drafts only: a proposal copied from
         * the stream has no draft probabilities): the longest n-gram of at least N
         * tokens ending at the pending token that occurred before proposes what
         * followed it, and the model skips the row this round */
        dm_row *r = &g->rows[i];
        if (g->p->lookup && !q->probs && depth[i] > 0 && !(q->own && q->own[i]) &&
            (q->n_tokens[i] = td_draft_lookup(r->stream, r->len, q->pending[i], g->p->lookup, depth[i],
                                              q->tokens + (size_t)i * q->max_depth, NULL)) > 0)
            depth[i] = 0;
        if (depth[i] > maxk) maxk = depth[i];
    }
    if (!maxk) return 0;
    /* 1. catch up long backlogs in chunks */
    for (;;) {
        int nb = 0, nt = 0;
        for (int i = 0; i < q->n_rows; i++) {
            dm_row *r = &g->rows[i];
            int back = r->len - r->kv_len;
            if (depth[i] <= 0 || back <= CATCHUP_CHUNK) continue;
            int n = back - CATCHUP_CHUNK < CATCHUP_CHUNK ? back - CATCHUP_CHUNK : CATCHUP_CHUNK;
            if (nt + n > g->max_tokens) break;
            memcpy(g->btok + nt, r->stream + r->kv_len, sizeof(int32_t) * (size_t)n);
            g->bidx[nb] = i; g->bn[nb] = n; nb++; nt += n;
        }
        if (!nb) break;
        int rc = feed(g, nb, err);
        if (rc) return rc;
        for (int i = 0; i < nb; i++) {
            dm_row *r = &g->rows[g->bidx[i]];
            kv_push(r, r->stream + r->kv_len, g->bn[i]);
        }
    }
    /* 2. remaining backlog + pending, then one step per further position */
    for (int j = 0; j < maxk; j++) {
        int nb = 0, nt = 0;
        for (int i = 0; i < q->n_rows; i++) {
            if (depth[i] <= j) continue;
            dm_row *r = &g->rows[i];
            int n;
            if (j == 0) {
                int back = r->len - r->kv_len;
                memcpy(g->btok + nt, r->stream + r->kv_len, sizeof(int32_t) * (size_t)back);
                g->btok[nt + back] = q->pending[i];
                n = back + 1;
            } else {
                g->btok[nt] = q->tokens[(size_t)i * q->max_depth + j - 1];
                n = 1;
            }
            g->bidx[nb] = i; g->bn[nb] = n; nb++; nt += n;
        }
        int rc = feed(g, nb, err);
        if (rc) return rc;
        nt = 0;
        for (int b = 0; b < nb; b++) {
            int i = g->bidx[b];
            dm_row *r = &g->rows[i];
            kv_push(r, g->btok + nt, g->bn[b]);
            nt += g->bn[b];
            const float *lg = g->logits + (size_t)b * g->n_sub;
            int32_t d;
            if (q->probs) {
                td_sampling sp = *q->sampling[i];
                sp.seed ^= 0x5bd1e9955bd1e995ull; /* the draft's own draw stream */
                float *pr = q->probs + ((size_t)i * q->max_depth + j) * g->n_vocab;
                d = td_sampler_sample_probs(g->smp, &sp, lg, NULL, 0, q->out_pos[i] + (uint64_t)j, g->qsub);
                if (d < 0) return td_seterr(err, d, "draft model: sampling failed");
                td_draft_vocab_scatter(&g->p->voc, g->qsub, pr); /* q is zero outside the draft vocabulary */
                d = td_draft_vocab_id(&g->p->voc, d);
            } else {
                const float *hn = NULL;
                if (r->cx.n) {
                    const td_model *m = g->p->m;
                    td_rmsnorm(g->hn, g->taps + (size_t)b * m->cfg.n_embd, m->w.out_norm.data, m->w.out_norm.dtype,
                               m->cfg.n_embd, m->cfg.rms_eps);
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

static int32_t *dm_stream(void *gv, int i, int *len) {
    dm_group *g = gv;
    *len = g->rows[i].len;
    return g->rows[i].stream;
}

/* lookup=N: the prompt lookup's proposals are on offer before the group plans
 * (draft.h); a row drafted from its offer comes to draft() at depth 0, so the
 * draft model skips it that round. Without lookup= nothing is on offer. */
static int dm_offer(void *gv, const int32_t *pending, int max_depth, int32_t *tokens, int *n_tokens, int *match,
                       td_err *err) {
    dm_group *g = gv;
    (void)err;
    td_draft_offer_lookup(g, g->n_rows, dm_stream, g->p->lookup, pending, max_depth, tokens, n_tokens, match);
    return 0;
}

static int dm_commit(void *gv, const td_draft_commit *cm, int n_rows, td_err *err) {
    dm_group *g = gv;
    for (int i = 0; i < n_rows; i++) {
        dm_row *r = &g->rows[i];
        int old = r->len;
        if (r->len + 1 + cm[i].n_accepted > r->cap) return td_seterr(err, TD_EFULL, "draft model: row %d stream is full", i);
        r->stream[r->len++] = cm[i].old_pending;
        if (cm[i].n_accepted > 0)
            memcpy(r->stream + r->len, cm[i].accepted, sizeof(int32_t) * (size_t)cm[i].n_accepted);
        r->len += cm[i].n_accepted;
        td_draft_ctxids_note(&g->p->voc, &r->cx, r->stream + old, r->len - old);
        /* the KV agrees with the stream up to their first difference */
        int keep = old < r->kv_len ? old : r->kv_len;
        while (keep < r->kv_len && keep < r->len && r->kv_tok[keep] == r->stream[keep]) keep++;
        if (keep < r->kv_len) {
            td_ctx_row_trim(g->ctx, r->kv_row, keep);
            r->kv_len = keep;
        }
    }
    return 0;
}

static void dm_filter(void *gv, const int *keep, int n_keep) {
    dm_group *g = gv;
    int k = 0;
    for (int i = 0; i < g->n_rows; i++) {
        if (k < n_keep && keep[k] == i) { g->rows[k++] = g->rows[i]; continue; }
        td_ctx_row_remove(g->ctx, g->rows[i].kv_row);
        free(g->rows[i].stream);
        free(g->rows[i].kv_tok);
        td_draft_ctxids_free(&g->rows[i].cx);
    }
    g->n_rows = n_keep;
}

static int dm_capture(void *gv, int row, td_draft_checkpoint **out, td_err *err) {
    dm_group *g = gv;
    *out = NULL;
    if (row < 0 || row >= g->n_rows) return td_seterr(err, TD_EINVAL, "draft model: no row %d", row);
    size_t bytes = sizeof(int32_t) * (size_t)g->rows[row].len;
    td_draft_checkpoint *ck;
    int rc = td_draft_checkpoint_new(&ck, "model-v1", bytes, err);
    if (rc) return rc;
    memcpy(ck->data, g->rows[row].stream, bytes);
    *out = ck;
    return 0;
}

static void dm_free_group(void *gv) {
    dm_group *g = gv;
    if (!g) return;
    for (int i = 0; i < g->n_rows; i++) { free(g->rows[i].stream); free(g->rows[i].kv_tok); td_draft_ctxids_free(&g->rows[i].cx); }
    td_ctx_free(g->ctx);
    td_sampler_free(g->smp);
    free(g->rows); free(g->logits); free(g->qsub); free(g->taps); free(g->hn); free(g->cxl); free(g->embd); free(g->btok); free(g->brow); free(g->bn); free(g->bidx); free(g->mdepth);
    free(g);
}

static const td_draft_rows_vt dm_rows_vt = {
    .append = dm_append, .draft = dm_draft, .offer = dm_offer, .commit = dm_commit,
    .filter = dm_filter, .capture = dm_capture, .free = dm_free_group,
};

static int dm_open_rows(void *self, int max_rows, int max_ctx, int max_depth, const td_ctx *target_ctx,
                        td_draft_rows *out, td_err *err) {
    dm_provider *p = self;
    dm_group *g = calloc(1, sizeof *g);
    if (!g) return td_seterr(err, TD_ENOMEM, "out of memory");
    g->p = p;
    g->max_rows = max_rows;
    g->max_ctx = max_ctx;
    g->max_depth = max_depth;
    g->n_vocab = p->m->cfg.n_vocab;
    g->n_sub = p->n_sub;
    g->max_tokens = max_rows * (CATCHUP_CHUNK + 2);
    if (g->max_tokens < 256) g->max_tokens = 256;
    td_ctx_params cp = td_ctx_default_params();
    cp.max_rows = max_rows;
    cp.share_threads = target_ctx;
    cp.serial_tokens = td_draft_serial_tokens(&p->view);
    cp.max_ctx = max_ctx + max_depth + 2;
    cp.max_tokens = g->max_tokens;
    cp.max_logits = max_rows;
    if (target_ctx) cp.kv_type = td_ctx_get_params(target_ctx).kv_type; /* the draft KV follows the target's */
    if (target_ctx) cp.act_type = td_ctx_get_params(target_ctx).act_type; /* and its activation type */
    int rc = td_ctx_open(&g->ctx, &p->view, &cp, err);
    if (rc) { free(g); return rc; }
    g->rows = calloc((size_t)max_rows, sizeof *g->rows);
    g->logits = malloc(sizeof(float) * (size_t)max_rows * (size_t)g->n_sub);
    g->qsub = malloc(sizeof(float) * (size_t)g->n_sub);
    g->taps = malloc(sizeof(float) * (size_t)max_rows * (size_t)p->m->cfg.n_embd);
    g->hn = malloc(sizeof(float) * (size_t)p->m->cfg.n_embd);
    g->cxl = malloc(sizeof(float) * TD_DRAFT_CTXIDS);
    g->embd = malloc(sizeof(float) * (size_t)g->max_tokens * (size_t)p->m->cfg.n_embd);
    g->btok = malloc(sizeof(int32_t) * (size_t)g->max_tokens);
    g->brow = malloc(sizeof(int) * (size_t)max_rows);
    g->bn = malloc(sizeof(int) * (size_t)max_rows);
    g->bidx = malloc(sizeof(int) * (size_t)max_rows);
    g->mdepth = malloc(sizeof(int) * (size_t)max_rows);
    if (!g->rows || !g->logits || !g->qsub || !g->taps || !g->hn || !g->cxl || !g->embd || !g->btok || !g->brow || !g->bn || !g->bidx || !g->mdepth ||
        td_sampler_open(&g->smp, g->n_sub) != 0) {
        dm_free_group(g);
        return td_seterr(err, TD_ENOMEM, "out of memory");
    }
    *out = (td_draft_rows){&dm_rows_vt, g, 0};
    return 0;
}

static void dm_free(void *self) {
    dm_provider *p = self;
    if (!p) return;
    td_draft_vocab_free(&p->voc);
    if (!p->m || p->view.q8r_arena != p->m->q8r_arena) free(p->view.q8r_arena); /* the view's repacks (act_type bf16 or amx) */
    if (!p->m || p->view.p24_arena != p->m->p24_arena) free(p->view.p24_arena); /* its P24 copies (act_type bf16) */
    td_model_free(p->m);
    free(p);
}

static const td_drafter_vt dm_vt = {.open_rows = dm_open_rows, .tap_layers = NULL, .free = dm_free};

/* The draft model must read and write the same ids as the target. */
static int same_vocabulary(const td_model *t, const td_model *d, const char *dir, td_err *err) {
    if (!t->tok != !d->tok)
        return td_seterr(err, TD_EINVAL, "draft model %s: %s a tokenizer.json and the %s not, so they cannot be shown to share a vocabulary",
                         dir, t->tok ? "the target has" : "the draft model has", t->tok ? "draft model has" : "target has");
    if (!t->tok) { /* id-only models (tests, converted checkpoints): the logit widths must agree */
        if (t->cfg.n_vocab != d->cfg.n_vocab)
            return td_seterr(err, TD_EINVAL, "draft model %s: %d logits, the target has %d", dir, d->cfg.n_vocab, t->cfg.n_vocab);
        return 0;
    }
    int nt = td_tokenizer_n_vocab(t->tok), nd = td_tokenizer_n_vocab(d->tok);
    if (nt != nd || t->cfg.n_vocab != d->cfg.n_vocab)
        return td_seterr(err, TD_EINVAL, "draft model %s: its vocabulary (%d tokens, %d logits) is not the target's (%d tokens, %d logits)",
                         dir, nd, d->cfg.n_vocab, nt, t->cfg.n_vocab);
    char a[512], b[512];
    for (int i = 0; i < nt; i++) {
        int la = td_token_bytes(t->tok, i, a, sizeof a), lb = td_token_bytes(d->tok, i, b, sizeof b);
        if (la != lb || (la > 0 && memcmp(a, b, (size_t)(la < (int)sizeof a ? la : (int)sizeof a)) != 0))
            return td_seterr(err, TD_EINVAL, "draft model %s: its tokenizer differs from the target's at token id %d", dir, i);
    }
    return 0;
}

int td_drafter_model_open(td_drafter **out, const char *dir, int n_sub, int quant, int lookup, const td_model *target,
                          td_err *err) {
    *out = NULL;
    if (!dir || !*dir) return td_seterr(err, TD_EINVAL, "draft model: give a directory, as model:DIR");
    if (lookup < 0 || lookup > TD_LOOKUP_MAX)
        return td_seterr(err, TD_EINVAL, "draft model: lookup=%d outside [1, %d]", lookup, TD_LOOKUP_MAX);
    dm_provider *p = calloc(1, sizeof *p);
    td_drafter *d = calloc(1, sizeof *d);
    if (!p || !d) { free(p); free(d); return td_seterr(err, TD_ENOMEM, "out of memory"); }
    td_model_params mp = td_model_default_params();
    if (quant) mp.use_mmap = 1; /* the quantized matrices are anonymous memory anyway: no copy first */
    int rc = td_model_open_params(&p->m, dir, &mp, err);
    if (rc == 0) rc = same_vocabulary(target, p->m, dir, err);
    if (rc == 0 && quant) rc = td_model_quantize_weights(p->m, quant, err);
    if (rc) { dm_free(p); free(d); return rc; }
    p->view = *p->m;
    rc = td_draft_vocab_open(&p->voc, dir, n_sub, &p->view.w.lm_head, err);
    if (rc) { dm_free(p); free(d); return rc; }
    p->n_sub = p->voc.n_sub;
    p->view.cfg.n_vocab = p->n_sub;
    p->lookup = lookup;
    d->vt = &dm_vt;
    d->self = p;
    d->target = target;
    d->weight_bytes = p->m->weight_bytes;
    /* bytes a draft step reads against the target's: the layers plus the cut head */
    {
        const td_config *dc = &p->m->cfg;
        double head = (double)p->n_sub / dc->n_vocab * (double)dc->n_vocab * dc->n_embd * 2.0;
        double layers = (double)p->m->weight_bytes - (double)dc->n_vocab * dc->n_embd * 2.0 * (dc->tied ? 1 : 2);
        if (layers < 0) layers = 0;
        d->step_cost_hint = 0.1 + (layers + head) / (double)(target->weight_bytes ? target->weight_bytes : 1);
    }
    char vs[32] = "", ls[16] = "";
    if (n_sub) snprintf(vs, sizeof vs, ",vocab=%d", n_sub);
    if (lookup) snprintf(ls, sizeof ls, ",lookup=%d", lookup);
    snprintf(d->id, sizeof d->id, "model:%.96s%s%s%s", dir, vs, quant == TD_DTYPE_Q8_0 ? ",quant=q8_0" : quant ? ",quant=q4_0" : "", ls);
    snprintf(d->ns, sizeof d->ns, "model-v1");
    *out = d;
    return 0;
}
