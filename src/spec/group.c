/* group — the speculative group: the one served lane.
 *
 * Every request is a row. Each td_spec_step runs one round for all live rows:
 *   0. prefill rows added since the last step (target forward over the prompt
 *      but its last token, which becomes the row's pending token), and append
 *      drafting rows to the drafter's row group;
 *   1. choose each row's depth (depth controller, or fixed), draft for all
 *      drafting rows in one drafter call;
 *   2. verify every live row's [pending, d_1..d_k] in ONE ragged target forward
 *      (logits of every window position);
 *   3. accept (match or rejection rule), emit through emit.c, stopping at eos,
 *      stop strings and max_tokens exactly where plain decoding would;
 *   4. commit: trim each row's target KV to keep [pending, d_1..d_m], tell the
 *      drafter what was accepted; rows that finished leave the drafter group and
 *      give back their KV row.
 * All buffers are allocated at open or when a row is added; a round allocates
 * nothing. Row ids are slots; a finished row keeps its output until removed. */
#include "tandem.h"
#include "model/model.h"
#include "spec/accept.h"
#include "spec/depth.h"
#include "spec/draft.h"
#include "spec/emit.h"
#include "util/util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { ROW_FREE = 0, ROW_NEW, ROW_LIVE, ROW_DONE };

typedef struct sp_row {
    int state;
    int kv_row;                /* target ctx row, -1 when none */
    int drafting;              /* takes part in the drafter's row group */
    int dr;                    /* index in the drafter row group, -1 if none */
    const td_gen_params *gp;   /* borrowed until removed */
    int32_t *hist;             /* [cap] prompt then emitted tokens */
    uint8_t *prov;             /* [cap] per emitted token: 1 = accepted draft */
    int cap, n_prompt, n_emitted, n_taken;
    float *lp;                 /* [cap] log-probability of each emitted token (logprobs) */
    int32_t *top_ids;          /* [cap][TD_MAX_TOP_LOGPROBS] alternatives (top_logprobs) */
    float *top_lp;             /* [cap][TD_MAX_TOP_LOGPROBS] */
    int lp_cap;                /* entries the three arrays hold */
    td_emitter em;
    td_depth_ctl depth;        /* acceptance of the drafter's own proposals */
    td_depth_ctl depth_lk[2];  /* acceptance of proposals taken from the drafter's offer: [1]
                                  behind a context match of TD_OFFER_STRONG tokens or more */
    td_spec_stats st;
    int k;                     /* depth chosen this round */
    int n_draft;               /* proposals this round */
    int drafted_last;          /* the drafter drafted for the row in the previous round */
    int offered;               /* this round's drafts came from the drafter's offer: 0 no,
                                  1 a short match, 2 a strong one */
} sp_row;

struct td_spec {
    td_ctx *ctx;               /* borrowed */
    const td_model *m;         /* borrowed */
    td_drafter *drafter;       /* borrowed, may be NULL */
    td_spec_params p;
    td_draft_rows dr;          /* owned row group (vt NULL when no drafter) */
    int max_rows, max_ctx, n_vocab;
    sp_row *rows;              /* [max_rows] */
    td_sampler *smp;           /* owned */
    float *logits;             /* [max_rows*(max_depth+1)][n_vocab] */
    float *q;                  /* [max_rows][max_depth][n_vocab] drafter probs (rejection) */
    float *pbuf;               /* [n_vocab] */
    /* per-round scratch */
    int32_t *pending;          /* [max_rows] by drafter row */
    int *depth;                /* [max_rows] */
    int32_t *drafts;           /* [max_rows][max_depth] */
    int *n_drafts;             /* [max_rows] */
    const td_sampling **samp;  /* [max_rows] */
    uint64_t *out_pos;         /* [max_rows] */
    int *dr_slot;              /* [max_rows] slot of each drafter row */
    int *keep;                 /* [max_rows] */
    td_draft_commit *commits;  /* [max_rows] */
    int32_t *vtok;             /* [max_rows*(max_depth+1)] verify tokens */
    int *vrows, *vn, *vslot;   /* [max_rows] */
    uint8_t *want;             /* [ctx max_tokens] all ones */
    const int *taps;           /* [n_taps] target layers the drafter taps (borrowed) */
    int n_taps;
    float *vtaps;              /* [max_rows*(max_depth+1)][n_taps][n_embd] verify taps */
    float *ptaps;              /* [max_ctx][n_taps][n_embd] prefill taps of one row */
    int have_q;                /* the drafter returned q this round */
    int32_t *emitted;          /* [max_depth+1] */
    td_cost_curve cv;          /* verify forward seconds by tokens, now: cv0 through cvm */
    td_cost_curve cv0;         /* the same as measured at startup */
    td_cost_model cvm;         /* cv = cvm.a + cvm.b * cv0, fitted to the rounds */
    double cv_t1;              /* seconds: cv's first point as measured */
    td_depth_ctl **ctl;        /* [max_rows] by drafter row, for the planner */
    td_depth_ctl pool_depth;   /* every row's rounds pooled: where a joining row starts */
    td_depth_ctl pool_lk[2];   /* the same for proposals taken from offers, by strength */
    int *maxk;                 /* [max_rows] by drafter row */
    int32_t *offer;            /* [max_rows][max_depth] proposals on offer (draft.h), by drafter row */
    int *n_offer;              /* [max_rows] */
    int *match;                /* [max_rows] context match length behind each offer */
    unsigned char *free_row;   /* [max_rows] the row drafts from its offer this round */
    int *ddepth;               /* [max_rows] depth asked of draft(): 0 where the offer serves */
    unsigned char *own;        /* [max_rows] the row's weak offer was declined: its drafter drafts */
    td_draft_price price;      /* a drafting round's price: seconds a round + seconds a step (one
                                  position for all rows), fitted as rounds run */
    int debug;                 /* TD_SPEC_DEBUG set: trace costs to stderr */
    double probe_spent;        /* seconds drafting in probe-only rounds, and verifying in them
                                  beyond a plain round's estimate (decaying sum) */
    double verify_spent;       /* seconds verifying (the same decay): probes may cost
                                  TD_PROBE_BUDGET of it */
    double probe_cost;         /* seconds the last probe round cost (its drafting and its verify
                                  beyond a plain round's): the price of the next one */
    double probe_now;          /* the same for this round, while it runs */
    td_spec_stats total;
};

/* The most tokens a second one row alone makes of proposals accepted as c
 * estimates: (1 + E(k)) / (verify(1 + k) + (k + extra) draft steps of step_s)
 * over k = 0..maxk (step_s 0: proposals already made). */
static double row_rate(const td_depth_ctl *c, int maxk, const td_cost_curve *cv, double step_s, double extra) {
    double best = 1.0 / td_cost_at(cv, 1), reach = 1.0, E = 1.0;
    for (int k = 1; k <= maxk && k <= TD_SPEC_MAX_DEPTH; k++) {
        reach *= c->a[k - 1];
        E += reach;
        double r = E / (td_cost_at(cv, 1 + k) + step_s * (k + extra));
        if (r > best) best = r;
    }
    return best;
}

td_spec_params td_spec_default_params(void) {
    td_spec_params p = {.max_depth = 8, .fixed_depth = 0, .accept = TD_ACCEPT_MATCH};
    return p;
}

double td_spec_stats_mean_accepted(const td_spec_stats *st) {
    return st->rounds ? (double)st->accepted / (double)st->rounds : 0.0;
}

static int is_eos(const td_model *m, int32_t t) {
    for (int e = 0; e < m->cfg.n_eos; e++)
        if (t == m->cfg.eos_ids[e]) return 1;
    return 0;
}

/* Time target forwards of T new tokens at a short context, for T from 1 up to
 * what a full round can verify, so the depth planner can weigh deeper drafts
 * (and more rows) against their verify cost. */
static int measure_verify(td_spec *g, int t_max, td_err *err) {
    /* every count up to 16, where a token more may start another register tile
     * (a step in the cost), then sparser */
    static const int pts[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 20, 24, 32, 48, 64, 96, 128, 192, 256};
    enum { N_PTS = sizeof pts / sizeof pts[0] };
    _Static_assert(N_PTS <= TD_COST_POINTS, "cost points");
    g->cv.n = g->cv0.n = 0;
    if (g->p.max_depth == 0) return 0;
    int row, rc = 0;
    if (td_ctx_row_add(g->ctx, &row) != 0) return 0; /* no spare row: linear fallback */
    int ctx_n = g->max_ctx / 2 < 256 ? g->max_ctx / 2 : 256;
    int32_t *toks = malloc(sizeof(int32_t) * (size_t)(ctx_n + t_max + 1));
    if (!toks) { td_ctx_row_remove(g->ctx, row); return td_seterr(err, TD_ENOMEM, "out of memory"); }
    for (int i = 0; i < ctx_n + t_max + 1; i++) toks[i] = (i * 7 + 3) % g->n_vocab;
    if (ctx_n >= 1) {
        td_batch b = {.n_rows = 1, .rows = &row, .n_tokens = &ctx_n, .tokens = toks};
        if ((rc = td_ctx_forward(g->ctx, &b, g->logits, NULL, err)) != 0) goto out;
    }
    int np = 0;
    while (np < N_PTS && pts[np] <= t_max && ctx_n + pts[np] <= g->max_ctx) np++;
    double best[TD_COST_POINTS];
    for (int p = 0; p < np; p++) best[p] = 1e30;
    /* sweeps over all sizes, best of 5 per size: a burst of load on a shared
     * machine then hits one sample of every size, not every sample of one */
    for (int rep = 0; rep < 5; rep++)
        for (int p = 0; p < np; p++)
            for (int again = pts[p] > 4; again < 2; again++) { /* up to 4 tokens (streaming weights) the
                                                                  second of two in a row: caches as in decoding */
                int T = pts[p];
                td_ctx_row_trim(g->ctx, row, ctx_n);
                /* every position's logits, as a verify computes them (the LM head is
                 * a large part of a token's cost: 26% of the 0.6B shape's products) */
                td_batch bt = {.n_rows = 1, .rows = &row, .n_tokens = &T, .tokens = toks + ctx_n, .want = g->want};
                double t0 = td_now();
                if ((rc = td_ctx_forward(g->ctx, &bt, g->logits, NULL, err)) != 0) goto out;
                double dt = td_now() - t0;
                if (again && dt < best[p]) best[p] = dt;
            }
    int T[TD_COST_POINTS];
    for (int p = 0; p < np; p++) T[p] = pts[p];
    if (g->debug) {
        fprintf(stderr, "tandem: verify cost measured (context %d):", ctx_n);
        for (int p = 0; p < np; p++) fprintf(stderr, " %d:%.3f", T[p], best[p] * 1e3);
        fprintf(stderr, "\n");
    }
    td_cost_curve_fit(&g->cv, T, best, np);
    g->cv0 = g->cv;
    td_cost_model_init(&g->cvm);
    g->cv_t1 = g->cv.s[0];
out:
    free(toks);
    td_ctx_row_remove(g->ctx, row);
    return rc;
}

void td_spec_free(td_spec *g) {
    if (!g) return;
    for (int i = 0; i < g->max_rows; i++) {
        sp_row *r = &g->rows[i];
        if (r->state != ROW_FREE && r->kv_row >= 0) td_ctx_row_remove(g->ctx, r->kv_row);
        free(r->hist);
        free(r->prov);
        free(r->lp);
        free(r->top_ids);
        free(r->top_lp);
        td_emit_free(&r->em);
    }
    td_draft_rows_free(&g->dr);
    td_sampler_free(g->smp);
    free(g->rows); free(g->logits); free(g->q); free(g->pbuf); free(g->pending); free(g->depth);
    free(g->drafts); free(g->n_drafts); free(g->samp); free(g->out_pos); free(g->dr_slot);
    free(g->keep); free(g->commits); free(g->vtok); free(g->vrows); free(g->vn); free(g->vslot);
    free(g->emitted);
    free(g->want);
    free(g->ctl);
    free(g->vtaps);
    free(g->ptaps);
    free(g->maxk);
    free(g->offer);
    free(g->n_offer);
    free(g->match);
    free(g->free_row);
    free(g->ddepth);
    free(g->own);
    free(g);
}

int td_spec_open(td_spec **out, td_ctx *ctx, const td_model *m, td_drafter *drafter,
                 const td_spec_params *pp, td_err *err) {
    *out = NULL;
    if (!ctx || !m) return td_seterr(err, TD_EINVAL, "td_spec_open: NULL context or model");
    td_spec_params p = pp ? *pp : td_spec_default_params();
    if (p.max_depth < 0 || p.max_depth > TD_SPEC_MAX_DEPTH)
        return td_seterr(err, TD_EINVAL, "draft depth %d out of range [0, %d]", p.max_depth, TD_SPEC_MAX_DEPTH);
    if (p.accept != TD_ACCEPT_MATCH && p.accept != TD_ACCEPT_REJECTION)
        return td_seterr(err, TD_EINVAL, "unknown acceptance rule %d", (int)p.accept);
    if (!drafter) p.max_depth = 0;
    td_ctx_params cp = td_ctx_get_params(ctx);
    const int *taps = NULL;
    int n_taps = drafter ? td_drafter_taps(drafter, &taps) : 0;
    for (int i = 0; i < n_taps; i++)
        if (taps[i] < 0 || taps[i] > m->cfg.n_layer)
            return td_seterr(err, TD_EINVAL, "drafter %s taps layer %d; the target has %d layers", drafter->id, taps[i], m->cfg.n_layer);
    int D = p.max_depth, R = cp.max_rows;
    if (cp.max_logits < R * (D + 1) || cp.max_tokens < R * (D + 1))
        return td_seterr(err, TD_EINVAL,
                         "context too small for speculation: %d rows at depth %d need max_tokens and max_logits >= %d (have %d, %d)",
                         R, D, R * (D + 1), cp.max_tokens, cp.max_logits);
    if (D > 0 && cp.max_ctx < D + 2)
        return td_seterr(err, TD_EINVAL, "draft depth %d does not fit a context of %d positions", D, cp.max_ctx);
    td_spec *g = calloc(1, sizeof *g);
    if (!g) return td_seterr(err, TD_ENOMEM, "out of memory");
    g->ctx = ctx;
    g->m = m;
    g->drafter = drafter;
    g->p = p;
    g->max_rows = R;
    g->max_ctx = cp.max_ctx;
    g->n_vocab = m->cfg.n_vocab;
    size_t V = (size_t)g->n_vocab, W = (size_t)D + 1;
    g->rows = calloc((size_t)R, sizeof *g->rows);
    g->logits = malloc(sizeof(float) * (size_t)R * W * V);
    if (p.accept == TD_ACCEPT_REJECTION && D > 0) g->q = malloc(sizeof(float) * (size_t)R * (D ? (size_t)D : 1) * V);
    g->pbuf = malloc(sizeof(float) * V);
    g->pending = malloc(sizeof(int32_t) * (size_t)R);
    g->depth = malloc(sizeof(int) * (size_t)R);
    g->drafts = malloc(sizeof(int32_t) * (size_t)R * (D ? (size_t)D : 1));
    g->n_drafts = malloc(sizeof(int) * (size_t)R);
    g->samp = malloc(sizeof(*g->samp) * (size_t)R);
    g->out_pos = malloc(sizeof(uint64_t) * (size_t)R);
    g->dr_slot = malloc(sizeof(int) * (size_t)R);
    g->keep = malloc(sizeof(int) * (size_t)R);
    g->commits = malloc(sizeof(td_draft_commit) * (size_t)R);
    g->vtok = malloc(sizeof(int32_t) * (size_t)R * W);
    g->vrows = malloc(sizeof(int) * (size_t)R);
    g->vn = malloc(sizeof(int) * (size_t)R);
    g->vslot = malloc(sizeof(int) * (size_t)R);
    g->emitted = malloc(sizeof(int32_t) * W);
    g->ctl = malloc(sizeof(*g->ctl) * (size_t)R);
    g->taps = taps;
    g->n_taps = n_taps;
    size_t tap_row = (size_t)n_taps * (size_t)m->cfg.n_embd;
    if (n_taps) {
        g->vtaps = malloc(sizeof(float) * (size_t)R * W * tap_row);
        g->ptaps = malloc(sizeof(float) * (size_t)g->max_ctx * tap_row);
    }
    g->maxk = malloc(sizeof(int) * (size_t)R);
    g->offer = malloc(sizeof(int32_t) * (size_t)R * (D ? (size_t)D : 1));
    g->n_offer = malloc(sizeof(int) * (size_t)R);
    g->match = malloc(sizeof(int) * (size_t)R);
    g->free_row = malloc((size_t)R);
    g->ddepth = malloc(sizeof(int) * (size_t)R);
    g->own = malloc((size_t)R);
    /* all ones, for any forward of the context: verify windows (R x W) and
     * tapped prefill chunks (up to max_tokens, which is >= R x W) */
    g->want = malloc((size_t)cp.max_tokens);
    if (g->want) memset(g->want, 1, (size_t)cp.max_tokens);
    if (!g->rows || !g->logits || (p.accept == TD_ACCEPT_REJECTION && D > 0 && !g->q) || !g->pbuf || !g->pending ||
        !g->depth || !g->drafts || !g->n_drafts || !g->samp || !g->out_pos || !g->dr_slot || !g->keep ||
        !g->commits || !g->vtok || !g->vrows || !g->vn || !g->vslot || !g->emitted || !g->want || !g->ctl || !g->maxk || !g->offer || !g->n_offer || !g->match || !g->free_row || !g->ddepth || !g->own || (n_taps && (!g->vtaps || !g->ptaps)) ||
        td_sampler_open(&g->smp, g->n_vocab) != 0) {
        td_spec_free(g);
        return td_seterr(err, TD_ENOMEM, "out of memory opening a speculative group of %d rows", R);
    }
    for (int i = 0; i < R; i++) { g->rows[i].kv_row = -1; g->rows[i].dr = -1; }
    int rc;
    if (drafter && (rc = drafter->vt->open_rows(drafter->self, R, g->max_ctx, D, ctx, &g->dr, err)) != 0) {
        td_spec_free(g);
        return rc;
    }
    g->debug = getenv("TD_SPEC_DEBUG") != NULL;
    if ((rc = measure_verify(g, R * (D + 1), err)) != 0) {
        td_spec_free(g);
        return rc;
    }
    /* until a draft step is measured, assume the drafter's own estimate */
    td_draft_price_init(&g->price, drafter ? drafter->step_cost_hint * td_cost_at(&g->cv, 1) : 0.0);
    td_depth_init(&g->pool_depth, 0.7);
    for (int c = 0; c < 2; c++) td_depth_init(&g->pool_lk[c], 0.7);
    if (g->debug) {
        fprintf(stderr, "tandem: verify cost curve:");
        for (int i = 0; i < g->cv.n; i++) fprintf(stderr, " T=%d %.3fms", g->cv.T[i], g->cv.s[i] * 1e3);
        fprintf(stderr, "\n");
    }
    *out = g;
    return 0;
}

int td_spec_n_rows(const td_spec *g) {
    int n = 0;
    for (int i = 0; i < g->max_rows; i++) n += g->rows[i].state != ROW_FREE;
    return n;
}

int td_spec_add(td_spec *g, const int32_t *prompt, int n_prompt, const td_gen_params *gp,
                int draft, int *id_out, td_err *err) {
    if (!g || !prompt || !gp || !id_out) return td_seterr(err, TD_EINVAL, "td_spec_add: NULL argument");
    if (n_prompt < 1) return td_seterr(err, TD_EINVAL, "empty prompt: at least one token is needed");
    if (gp->max_tokens < 0) return td_seterr(err, TD_EINVAL, "max_tokens %d < 0", gp->max_tokens);
    if (n_prompt >= g->max_ctx)
        return td_seterr(err, TD_ERANGE, "prompt of %d tokens does not fit the context of %d positions", n_prompt, g->max_ctx);
    for (int i = 0; i < n_prompt; i++)
        if (prompt[i] < 0 || prompt[i] >= g->n_vocab)
            return td_seterr(err, TD_ERANGE, "prompt token %d at index %d is outside the vocabulary of %d", (int)prompt[i], i, g->n_vocab);
    int slot = -1;
    for (int i = 0; i < g->max_rows; i++)
        if (g->rows[i].state == ROW_FREE) { slot = i; break; }
    if (slot < 0) return td_seterr(err, TD_EFULL, "all %d rows are in use", g->max_rows);
    sp_row *r = &g->rows[slot];
    int cap = g->max_ctx + g->p.max_depth + 2;
    if (r->cap < cap) {
        int32_t *h = realloc(r->hist, sizeof(int32_t) * (size_t)cap);
        if (h) r->hist = h;
        uint8_t *pv = h ? realloc(r->prov, (size_t)cap) : NULL;
        if (pv) r->prov = pv;
        if (!h || !pv) return td_seterr(err, TD_ENOMEM, "out of memory adding a row");
        r->cap = cap;
    }
    if (gp->logprobs && (gp->top_logprobs < 0 || gp->top_logprobs > TD_MAX_TOP_LOGPROBS))
        return td_seterr(err, TD_EINVAL, "top_logprobs %d out of range [0, %d]", gp->top_logprobs, TD_MAX_TOP_LOGPROBS);
    if (gp->logprobs && r->lp_cap < cap) {
        float *a = realloc(r->lp, sizeof(float) * (size_t)cap);
        if (a) r->lp = a;
        int32_t *b = a ? realloc(r->top_ids, sizeof(int32_t) * (size_t)cap * TD_MAX_TOP_LOGPROBS) : NULL;
        if (b) r->top_ids = b;
        float *c = b ? realloc(r->top_lp, sizeof(float) * (size_t)cap * TD_MAX_TOP_LOGPROBS) : NULL;
        if (c) r->top_lp = c;
        if (!a || !b || !c) return td_seterr(err, TD_ENOMEM, "out of memory for log-probabilities");
        r->lp_cap = cap;
    }
    if (td_ctx_row_add(g->ctx, &r->kv_row) != 0) {
        r->kv_row = -1;
        return td_seterr(err, TD_EFULL, "no free KV row in the target context");
    }
    memcpy(r->hist, prompt, sizeof(int32_t) * (size_t)n_prompt);
    r->n_prompt = n_prompt;
    r->n_emitted = r->n_taken = 0;
    r->gp = gp;
    r->drafting = draft && g->drafter && g->p.max_depth > 0;
    r->drafted_last = 0;
    r->dr = -1;
    td_emit_free(&r->em);
    td_emit_init(&r->em, gp->stop, gp->n_stop);
    td_depth_init_from(&r->depth, &g->pool_depth);
    for (int c = 0; c < 2; c++) td_depth_init_from(&r->depth_lk[c], &g->pool_lk[c]);
    memset(&r->st, 0, sizeof r->st);
    r->state = ROW_NEW;
    *id_out = slot;
    return 0;
}

/* Mark a row finished: it leaves the drafter group (done by the caller in
 * batch) and gives back its KV row. */
static void finish(td_spec *g, sp_row *r, int reason) {
    r->state = ROW_DONE;
    r->st.stop_reason = reason;
    if (r->kv_row >= 0) td_ctx_row_remove(g->ctx, r->kv_row);
    r->kv_row = -1;
    td_emit_finish(&r->em);
}

/* Emit one token decided by the target; returns 1 if the row is now finished. */
/* Log-softmax of the raw logits at the token's position, and the top-N. */
static void record_logprobs(td_spec *g, sp_row *r, int32_t t, const float *lg) {
    int V = g->n_vocab, idx = r->n_emitted, N = r->gp->top_logprobs;
    float mx = lg[0];
    for (int v = 1; v < V; v++) if (lg[v] > mx) mx = lg[v];
    double s = 0;
    for (int v = 0; v < V; v++) s += exp((double)lg[v] - mx);
    double lse = mx + log(s);
    r->lp[idx] = (float)(lg[t] - lse);
    int32_t *ti = r->top_ids + (size_t)idx * TD_MAX_TOP_LOGPROBS;
    float *tl = r->top_lp + (size_t)idx * TD_MAX_TOP_LOGPROBS;
    int n = 0;
    for (int v = 0; v < V && N > 0; v++) { /* insertion into a sorted top-N: descending, ties by id */
        if (n == N && lg[v] <= lg[ti[n - 1]]) continue;
        int pos = n < N ? n++ : N - 1;
        while (pos > 0 && lg[ti[pos - 1]] < lg[v]) { ti[pos] = ti[pos - 1]; pos--; }
        ti[pos] = v;
    }
    for (int i = 0; i < n; i++) tl[i] = (float)(lg[ti[i]] - lse);
}

static int emit(td_spec *g, sp_row *r, int32_t t, int from_draft, const float *lg) {
    if (is_eos(g->m, t) && !r->gp->ignore_eos) { finish(g, r, TD_STOP_EOS); return 1; }
    if (r->gp->logprobs && r->lp) record_logprobs(g, r, t, lg);
    r->hist[r->n_prompt + r->n_emitted] = t;
    r->prov[r->n_prompt + r->n_emitted] = (uint8_t)from_draft;
    r->n_emitted++;
    r->st.emitted++;
    g->total.emitted++;
    int hit = td_emit_token(&r->em, g->m->tok, t);
    if (hit > 0) { finish(g, r, TD_STOP_STRING); return 1; }
    if (r->n_emitted >= r->gp->max_tokens) { finish(g, r, TD_STOP_LENGTH); return 1; }
    if (r->n_prompt + r->n_emitted >= g->max_ctx) { finish(g, r, TD_STOP_LENGTH); return 1; }
    return 0;
}

/* Prefill all prompt tokens but the last, which becomes the row's pending
 * token: every output token then comes out of a verify round (output position
 * 0 too), and the drafter's committed stream is prompt[0..n-1). */
static int prefill(td_spec *g, sp_row *r, td_err *err) {
    td_ctx_params cp = td_ctx_get_params(g->ctx);
    int chunk = cp.max_tokens, rc;
    /* a tapping drafter wants every position's taps and no logits: with
     * skip_logits max_logits does not bound them, so its chunks are as long
     * as the plain prefill's (chunks of max_logits read every weight again
     * every 34 positions in bench spec at batch 1) */
    int tapping = r->drafting && g->n_taps > 0;
    size_t tap_row = (size_t)g->n_taps * (size_t)g->m->cfg.n_embd;
    double t0 = td_now();
    for (int done = 0; done < r->n_prompt - 1;) {
        int n = r->n_prompt - 1 - done < chunk ? r->n_prompt - 1 - done : chunk;
        td_batch b = {.n_rows = 1, .rows = &r->kv_row, .n_tokens = &n, .tokens = r->hist + done};
        if (tapping) {
            b.want = g->want;
            b.taps = g->taps;
            b.n_taps = g->n_taps;
            b.skip_logits = 1;
        }
        if ((rc = td_ctx_forward(g->ctx, &b, tapping ? NULL : g->logits, tapping ? g->ptaps + (size_t)done * tap_row : NULL, err)) != 0)
            return rc;
        done += n;
    }
    r->state = ROW_LIVE;
    if (r->gp->max_tokens && r->drafting) {
        if ((rc = td_draft_rows_append(&g->dr, r->hist, r->n_prompt - 1, tapping ? g->ptaps : NULL, NULL, err)) != 0) return rc;
        r->dr = g->dr.n_rows - 1;
    }
    /* prompt processing: the target's and the drafter's (which may fill its
     * own cache from the prompt when the row joins) */
    double dt = td_now() - t0;
    r->st.t_prefill += dt;
    g->total.t_prefill += dt;
    if (r->gp->max_tokens == 0) { finish(g, r, TD_STOP_LENGTH); return 0; }
    return 0;
}

/* Drop finished rows from the drafter group, keeping order. */
static void compact_drafter(td_spec *g) {
    if (!g->dr.vt) return;
    int n = g->dr.n_rows, nk = 0;
    for (int i = 0; i < g->max_rows; i++) {
        sp_row *r = &g->rows[i];
        if (r->state != ROW_FREE && r->dr >= 0) g->dr_slot[r->dr] = i;
    }
    int changed = 0;
    for (int d = 0; d < n; d++) {
        sp_row *r = &g->rows[g->dr_slot[d]];
        if (r->state == ROW_LIVE) { g->keep[nk++] = d; r->dr = nk - 1; }
        else { r->dr = -1; changed = 1; }
    }
    if (changed) td_draft_rows_filter(&g->dr, g->keep, nk);
}

int td_spec_step(td_spec *g, td_err *err) {
    if (!g) return td_seterr(err, TD_EINVAL, "td_spec_step: NULL group");
    int rc;
    for (int i = 0; i < g->max_rows; i++)
        if (g->rows[i].state == ROW_NEW && (rc = prefill(g, &g->rows[i], err)) != 0) return rc;
    compact_drafter(g);
    int D = g->p.max_depth, V = g->n_vocab;
    /* 1. depth and draft */
    int n_dr = g->dr.vt ? g->dr.n_rows : 0, n_other = 0, n_probes = 0, probe_round = 0;
    g->have_q = 0;
    for (int i = 0; i < g->max_rows; i++) {
        sp_row *r = &g->rows[i];
        r->k = r->n_draft = 0;
        if (r->state != ROW_LIVE) continue;
        if (r->dr < 0) { n_other++; continue; }
        int room = g->max_ctx - (r->n_prompt + r->n_emitted) - 1;
        int left = r->gp->max_tokens - r->n_emitted - 1;
        int k = D;
        if (k > room) k = room;
        if (k > left) k = left;
        if (k < 0) k = 0;
        g->dr_slot[r->dr] = i;
        g->maxk[r->dr] = k;
        g->ctl[r->dr] = &r->depth;
        g->pending[r->dr] = r->hist[r->n_prompt + r->n_emitted - 1];
        g->samp[r->dr] = &r->gp->sampling;
        g->out_pos[r->dr] = (uint64_t)r->n_emitted;
    }
    /* a round's fixed part in steps: the drafter's own (step_extra) and the
     * part of its measured price that does not grow with the steps */
    double extra = g->drafter ? g->drafter->step_extra + (g->price.s > 0 ? g->price.f / g->price.s : 0.0) : 0.0;
    /* proposals on offer (a lookup in the row's stream): the plan weighs them
     * at their verify cost alone, with their own acceptance estimates, and a
     * row is drafted no deeper than its offer */
    int offers = n_dr > 0 && D > 0 && g->p.accept == TD_ACCEPT_MATCH && td_draft_rows_can_offer(&g->dr);
    if (offers && (rc = td_draft_rows_offer(&g->dr, g->pending, D, g->offer, g->n_offer, g->match, err)) != 0) return rc;
    for (int d = 0; d < n_dr; d++) {
        sp_row *r = &g->rows[g->dr_slot[d]];
        g->free_row[d] = offers && g->n_offer[d] > 0;
        r->offered = g->free_row[d] ? 1 + (g->match[d] >= TD_OFFER_STRONG) : 0;
        g->own[d] = 0;
        /* a weak offer (a short context match) is declined where the drafter's
         * own drafts, at their price, promise the row more tokens a second */
        if (r->offered == 1 && !g->drafter->offers_all) {
            int kd = g->drafter->max_drafts > 0 && g->maxk[d] > g->drafter->max_drafts ? g->drafter->max_drafts : g->maxk[d];
            int ko = g->maxk[d] < g->n_offer[d] ? g->maxk[d] : g->n_offer[d];
            if (row_rate(&r->depth, kd, &g->cv, g->price.s, extra) >
                row_rate(&r->depth_lk[0], ko, &g->cv, 0.0, 0)) {
                g->free_row[d] = 0;
                r->offered = 0;
                g->own[d] = 1;
            }
        }
        if (offers && !r->offered && g->drafter->offers_all) g->maxk[d] = 0;
        if (!r->offered && g->drafter->max_drafts > 0 && g->maxk[d] > g->drafter->max_drafts)
            g->maxk[d] = g->drafter->max_drafts;
        if (!r->offered) continue;
        if (g->maxk[d] > g->n_offer[d]) g->maxk[d] = g->n_offer[d];
        g->ctl[d] = &r->depth_lk[r->offered - 1];
    }
    if (n_dr > 0) {
        if (g->p.fixed_depth) memcpy(g->depth, g->maxk, sizeof(int) * (size_t)n_dr);
        else n_probes = td_depth_plan(g->ctl, g->maxk, n_dr, n_other, &g->cv, g->price.s, extra,
                                      g->free_row, g->probe_spent + g->probe_cost <= TD_PROBE_BUDGET * g->verify_spent,
                                      g->price.provisional ? TD_DEPTH_PROBE : TD_DEPTH_PROBE_MAX, g->depth);
        for (int d = 0; d < n_dr; d++) g->rows[g->dr_slot[d]].k = g->depth[d];
        if (g->debug)
            for (int d = 0; d < n_dr; d++)
                fprintf(stderr, "tandem: plan row %d: maxk %d%s -> depth %d (a1..4 %.2f %.2f %.2f %.2f, round %.3f + step %.3f ms, T1 %.3f ms)\n",
                        d, g->maxk[d], g->free_row[d] ? " offered" : "", g->depth[d], g->ctl[d]->a[0], g->ctl[d]->a[1],
                        g->ctl[d]->a[2], g->ctl[d]->a[3], g->price.f * 1e3, g->price.s * 1e3, td_cost_at(&g->cv, 1) * 1e3);
    }
    int any = 0; /* rows the drafter drafts for (not from an offer) */
    for (int d = 0; d < n_dr; d++) {
        g->ddepth[d] = g->free_row[d] ? 0 : g->depth[d];
        g->n_drafts[d] = 0;
        any |= g->ddepth[d] > 0;
    }
    if (any) {
        td_draft_req q = {.n_rows = n_dr, .pending = g->pending, .depth = g->ddepth, .max_depth = D,
                          .tokens = g->drafts, .n_tokens = g->n_drafts, .probs = g->q,
                          .sampling = g->samp, .out_pos = g->out_pos, .own = g->own, .steps = -1};
        double t0 = td_now();
        if ((rc = td_draft_rows_draft(&g->dr, &q, err)) != 0) return rc;
        double dt = td_now() - t0;
        g->total.t_draft += dt;
        int drafting = 0;
        for (int d = 0; d < n_dr; d++) drafting += g->ddepth[d] > 0;
        if (n_probes >= drafting) { /* a round of probes only */
            g->probe_spent += dt;
            g->probe_now = dt;
            probe_round = 1;
        }
        long nd = 0;
        for (int d = 0; d < n_dr; d++) {
            if (g->n_drafts[d] > g->ddepth[d]) g->n_drafts[d] = g->ddepth[d];
            nd += g->n_drafts[d];
        }
        g->have_q = q.has_probs; /* else accept treats each proposal as a one-hot q */
        /* The price is learnt from steady rounds: a row that did not draft
         * last round first catches its drafter up on the tokens it missed, a
         * one-off cost that is not a round's price; such a round only lowers
         * the price where it was cheaper than the prediction (else a planner
         * kept at depth 0 by a burst of load would see only catch-up rounds and
         * never correct it). Until a round is measured, any round sets it: a
         * catch-up round overstates the price (provisionally: depth.h), the safe side, where the
         * drafter's hint may understate it many times (a block drafter's hint
         * is one row's; at batch 8 its first rounds, catch-ups while the rows
         * take turns at depth 0, cost 6x that and kept drafting at a loss).
         * td_draft_price_update bounds what a slow round moves. */
        int steady = 1;
        for (int d = 0; d < n_dr; d++)
            if (g->ddepth[d] > 0 && !g->rows[g->dr_slot[d]].drafted_last) steady = 0;
        int steps = q.steps; /* the drafter's own count, else the deepest row's proposals */
        for (int d = 0; q.steps < 0 && d < n_dr; d++) if (g->n_drafts[d] > steps) steps = g->n_drafts[d];
        if (steps > 0) td_draft_price_update(&g->price, steps, dt, steady);
        if (g->debug)
            fprintf(stderr, "tandem: draft %ld tokens in %d steps, %.3f ms%s; round %.3f + step %.3f ms\n", nd, steps,
                    dt * 1e3, steady ? "" : " (catch-up)", g->price.f * 1e3, g->price.s * 1e3);
    }
    for (int d = 0; d < n_dr; d++) {
        sp_row *r = &g->rows[g->dr_slot[d]];
        if (g->free_row[d] && g->depth[d] > 0) { /* drafted from the offer */
            memcpy(g->drafts + (size_t)d * D, g->offer + (size_t)d * D, sizeof(int32_t) * (size_t)g->depth[d]);
            g->n_drafts[d] = g->depth[d];
        }
        r->n_draft = g->n_drafts[d];
        r->drafted_last = g->ddepth[d] > 0;
    }
    /* 2. verify every live row in one forward */
    int nb = 0, nt = 0;
    for (int i = 0; i < g->max_rows; i++) {
        sp_row *r = &g->rows[i];
        if (r->state != ROW_LIVE) continue;
        g->vtok[nt] = r->hist[r->n_prompt + r->n_emitted - 1];
        if (r->n_draft) memcpy(g->vtok + nt + 1, g->drafts + (size_t)r->dr * (D ? D : 1), sizeof(int32_t) * (size_t)r->n_draft);
        g->vrows[nb] = r->kv_row;
        g->vn[nb] = 1 + r->n_draft;
        g->vslot[nb] = i;
        nt += g->vn[nb];
        nb++;
    }
    if (nb == 0) return 0;
    double t0 = td_now();
    td_batch b = {.n_rows = nb, .rows = g->vrows, .n_tokens = g->vn, .tokens = g->vtok};
    b.want = g->want; /* every position of every window */
    b.taps = g->taps;
    b.n_taps = g->n_taps;
    if ((rc = td_ctx_forward(g->ctx, &b, g->logits, g->n_taps ? g->vtaps : NULL, err)) != 0) return rc;
    double vdt = td_now() - t0;
    g->total.t_verify += vdt;
    if (g->debug) fprintf(stderr, "tandem: verify%s %d rows %d tokens %.3f ms\n", g->dr.vt ? "" : " (plain)", nb, nt, vdt * 1e3);
    g->verify_spent = TD_PROBE_DECAY * g->verify_spent + vdt; /* a window of about a thousand rounds */
    /* a probe's verify tokens cost too (8 rows probing 7 deep verify 64 tokens
     * instead of 8): what the forward took beyond the plain round's estimate */
    if (probe_round) {
        double over = g->cv.n > 0 && vdt > td_cost_at(&g->cv, nb) ? vdt - td_cost_at(&g->cv, nb) : 0;
        g->probe_spent += over;
        g->probe_cost = g->probe_now + over;
    }
    g->probe_spent *= TD_PROBE_DECAY;
    /* keep the cost curve current: the startup measurement may have been taken
     * on a busier (or quieter) machine, at a shorter context and on one row,
     * unlike the forwards running now; the rounds fit an offset and a factor
     * to it (depth.h, td_cost_model) */
    td_cost_model_update(&g->cvm, &g->cv, &g->cv0, nt, vdt, 0.25 * g->cv_t1);
    if (g->debug && g->cv0.n) fprintf(stderr, "tandem: verify cost now %.3f ms + %.3f x measured\n", g->cvm.a * 1e3, g->cvm.b);
    /* 3. accept, emit, commit */
    t0 = td_now();
    size_t V_embd = (size_t)g->m->cfg.n_embd;
    int off = 0, live = 0;
    for (int v = 0; v < nb; v++) {
        sp_row *r = &g->rows[g->vslot[v]];
        int k = r->n_draft;
        int n_before = r->n_prompt + r->n_emitted; /* pending is hist[n_before-1] */
        const int32_t *dr = k ? g->drafts + (size_t)r->dr * (D ? D : 1) : NULL;
        td_accept_io io = {.smp = g->smp, .sp = &r->gp->sampling, .logits = g->logits + (size_t)off * V,
                           .n_vocab = V, .drafts = dr, .k = k,
                           .q = (g->q && g->have_q && k) ? g->q + (size_t)r->dr * D * V : NULL,
                           .p = g->pbuf, .hist = r->hist, .n_hist = n_before,
                           .pos0 = (uint64_t)r->n_emitted, .out = g->emitted};
        int m = g->p.accept == TD_ACCEPT_REJECTION && k ? td_accept_rejection(&io) : td_accept_match(&io);
        if (m < 0) return td_seterr(err, m, "acceptance failed");
        off += 1 + k;
        int32_t old_pending = r->hist[n_before - 1];
        r->st.rounds++;
        r->st.drafted += k;
        r->st.accepted += m;
        g->total.rounds++;
        g->total.drafted += k;
        g->total.accepted += m;
        for (int j = 0; j < k && j < TD_SPEC_MAX_DEPTH; j++) {
            r->st.drafted_at[j]++;
            g->total.drafted_at[j]++;
            if (j < m) { r->st.accepted_at[j]++; g->total.accepted_at[j]++; }
        }
        if (k) {
            td_depth_update(r->offered ? &r->depth_lk[r->offered - 1] : &r->depth, k, m);
            td_depth_update(r->offered ? &g->pool_lk[r->offered - 1] : &g->pool_depth, k, m);
        }
        /* emit t_0..t_m (t_j for j < m are accepted drafts) */
        int done = 0;
        const float *row_lg = g->logits + (size_t)(off - 1 - k) * V;
        for (int j = 0; j <= m && !done; j++) done = emit(g, r, g->emitted[j], j < m, row_lg + (size_t)j * V);
        if (done) continue;
        /* target KV: keep pending + accepted drafts */
        td_ctx_row_trim(g->ctx, r->kv_row, n_before + m);
        live++;
        if (r->dr >= 0) {
            g->commits[r->dr] = (td_draft_commit){.old_pending = old_pending, .accepted = r->hist + n_before,
                                                  .n_accepted = m, .new_pending = g->emitted[m],
                                                  .taps = g->n_taps ? g->vtaps + (size_t)(off - 1 - k) * g->n_taps * V_embd : NULL};
        }
    }
    if (g->dr.vt && g->dr.n_rows > 0) {
        /* rows that finished this round still receive a commit; they leave next */
        for (int v = 0; v < nb; v++) {
            sp_row *r = &g->rows[g->vslot[v]];
            if (r->dr >= 0 && r->state != ROW_LIVE)
                g->commits[r->dr] = (td_draft_commit){.old_pending = r->hist[r->n_prompt > 0 ? r->n_prompt - 1 : 0],
                                                      .accepted = NULL, .n_accepted = 0, .new_pending = 0};
        }
        if ((rc = td_draft_rows_commit(&g->dr, g->commits, err)) != 0) return rc;
    }
    g->total.t_accept += td_now() - t0;
    compact_drafter(g);
    for (int i = 0; i < g->max_rows; i++) live += g->rows[i].state == ROW_NEW;
    return live;
}

int td_spec_take(td_spec *g, int id, int32_t *ids, uint8_t *prov, int cap,
                 char *text, size_t tcap, size_t *n_text, int *done) {
    if (!g || id < 0 || id >= g->max_rows || g->rows[id].state == ROW_FREE) return TD_EINVAL;
    sp_row *r = &g->rows[id];
    int n = 0;
    while (n < cap && r->n_taken < r->n_emitted) {
        if (ids) ids[n] = r->hist[r->n_prompt + r->n_taken];
        if (prov) prov[n] = r->prov[r->n_prompt + r->n_taken];
        n++;
        r->n_taken++;
    }
    size_t nt = 0, avail = r->em.upto - r->em.sent;
    if (text) { /* NULL: the caller does not want text; it is dropped */
        nt = avail < tcap ? avail : tcap;
        if (nt) memcpy(text, r->em.buf + r->em.sent, nt);
        r->em.sent += nt;
    } else {
        r->em.sent += avail;
    }
    if (n_text) *n_text = nt;
    if (done) *done = r->state == ROW_DONE && r->n_taken == r->n_emitted && r->em.sent == r->em.upto;
    return n;
}

int td_spec_logprobs(const td_spec *g, int id, int index, float *lp, int32_t *top_ids, float *top_lp) {
    if (!g || id < 0 || id >= g->max_rows || g->rows[id].state == ROW_FREE) return TD_EINVAL;
    const sp_row *r = &g->rows[id];
    if (!r->gp->logprobs || !r->lp || index < 0 || index >= r->n_emitted) return TD_EINVAL;
    if (lp) *lp = r->lp[index];
    int n = r->gp->top_logprobs;
    if (top_ids) memcpy(top_ids, r->top_ids + (size_t)index * TD_MAX_TOP_LOGPROBS, sizeof(int32_t) * (size_t)n);
    if (top_lp) memcpy(top_lp, r->top_lp + (size_t)index * TD_MAX_TOP_LOGPROBS, sizeof(float) * (size_t)n);
    return n;
}

int td_spec_remove(td_spec *g, int id) {
    if (!g || id < 0 || id >= g->max_rows || g->rows[id].state == ROW_FREE) return TD_EINVAL;
    sp_row *r = &g->rows[id];
    if (r->state != ROW_DONE) {
        r->state = ROW_DONE; /* leaves the drafter group below */
        if (r->kv_row >= 0) td_ctx_row_remove(g->ctx, r->kv_row);
        r->kv_row = -1;
    }
    compact_drafter(g);
    r->state = ROW_FREE;
    r->dr = -1;
    return 0;
}

int td_spec_stats_get(const td_spec *g, int id, td_spec_stats *st) {
    if (!g || !st) return TD_EINVAL;
    if (id == -1) {
        *st = g->total;
        return 0;
    }
    if (id < 0 || id >= g->max_rows || g->rows[id].state == ROW_FREE) return TD_EINVAL;
    *st = g->rows[id].st;
    st->t_draft = g->total.t_draft;
    st->t_verify = g->total.t_verify;
    st->t_accept = g->total.t_accept;
    return 0;
}
