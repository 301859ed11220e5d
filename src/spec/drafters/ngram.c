/* ngram — model-free prompt-lookup drafter.
 *
 * Each row keeps its committed token stream (prompt + output). To draft, it
 * takes the last n tokens ending at the pending token, for n from max down to
 * min, and looks for the most recent earlier occurrence of that n-gram in the
 * stream; the tokens that followed it are the proposal (longest n first, so the
 * most specific context wins). No probabilities: under the rejection rule the
 * group treats each proposal as a one-hot q. Streams grow by doubling. */
#include "spec/draft.h"
#include "model/model.h"
#include "util/util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    int32_t *tok;  /* owned stream [len]; capacity cap */
    int len, cap;
} ng_row;

typedef struct {
    int n_min, n_max;
    int n_vocab;   /* the target's: restored streams are checked against it */
} ng_provider;

typedef struct {
    const ng_provider *p;
    ng_row *rows;  /* [max_rows] */
    int n_rows, max_rows;
} ng_group;

static int row_push(ng_row *r, const int32_t *t, int n) {
    if (n <= 0) return 0; /* r->tok may still be NULL (an empty row) */
    if (r->len + n > r->cap) {
        int nc = r->cap ? r->cap : 256;
        while (nc < r->len + n) nc *= 2;
        int32_t *nt = realloc(r->tok, sizeof(int32_t) * (size_t)nc);
        if (!nt) return TD_ENOMEM;
        r->tok = nt;
        r->cap = nc;
    }
    memcpy(r->tok + r->len, t, sizeof(int32_t) * (size_t)n);
    r->len += n;
    return 0;
}

static int ng_append(void *gv, const int32_t *tokens, int n, const float *taps,
                     const td_draft_checkpoint *ck, td_err *err) {
    ng_group *g = gv;
    (void)taps;
    if (g->n_rows >= g->max_rows) return td_seterr(err, TD_EFULL, "ngram: row group is full (%d rows)", g->max_rows);
    ng_row *r = &g->rows[g->n_rows];
    memset(r, 0, sizeof *r);
    int rc;
    if (ck) {
        if (strcmp(ck->ns, "ngram-v1") != 0 || ck->size % sizeof(int32_t))
            return td_seterr(err, TD_EFORMAT, "ngram: checkpoint of namespace '%s' (%zu bytes) is not an ngram-v1 checkpoint",
                             ck->ns, ck->size);
        const int32_t *ct = (const int32_t *)ck->data;
        int cn = (int)(ck->size / sizeof(int32_t));
        for (int i = 0; i < cn; i++)
            if (ct[i] < 0 || ct[i] >= g->p->n_vocab)
                return td_seterr(err, TD_EFORMAT, "ngram: checkpoint token %d at position %d is outside the vocabulary", (int)ct[i], i);
        rc = row_push(r, ct, cn);
    } else {
        rc = n > 0 ? row_push(r, tokens, n) : 0;
    }
    if (rc) { free(r->tok); return td_seterr(err, rc, "ngram: out of memory"); }
    g->n_rows++;
    return 0;
}

int td_ngram_longest(const int32_t *s, int len, int n_min, int n_max, int *matched) {
    /* one backward pass over the ends e of earlier occurrences: L = how many
     * tokens before e agree with the stream's tail; the first e (from the
     * back) to reach a new longest L is the most recent occurrence of it */
    int best = 0, at = -1;
    if (n_max > len - 1) n_max = len - 1;
    for (int e = len - 1; e >= 1 && best < n_max; e--) {
        if (s[e - 1] != s[len - 1]) continue;
        int L = 1;
        while (L < n_max && L < e && s[e - 1 - L] == s[len - 1 - L]) L++;
        if (L > best) { best = L; at = e; }
    }
    if (best < n_min || best < 1) { if (matched) *matched = 0; return -1; }
    if (matched) *matched = best;
    return at;
}

int td_ngram_find(const int32_t *s, int len, int n) {
    if (len < n + 1) return -1;
    const int32_t *key = s + len - n;
    for (int i = len - n - 1; i >= 0; i--) {
        if (s[i] != key[0]) continue;
        if (memcmp(s + i, key, sizeof(int32_t) * (size_t)n) == 0) return i + n;
    }
    return -1;
}

/* Row i's proposals after `pending`: what followed the longest earlier
 * occurrence (n_max..n_min tokens) of the stream's tail, up to k tokens into
 * out; *matched: that occurrence's length (0: none). Returns how many, or -1
 * out of memory. */
static int ng_propose(ng_group *g, int i, int32_t pending, int k, int32_t *out, int *matched) {
    ng_row *r = &g->rows[i];
    /* the pending token ends the stream for the lookup */
    if (row_push(r, &pending, 1) != 0) return -1;
    int m = 0, at = td_ngram_longest(r->tok, r->len, g->p->n_min, g->p->n_max, matched);
    if (at >= 0) {
        int avail = r->len - at;
        m = avail < k ? avail : k;
        memcpy(out, r->tok + at, sizeof(int32_t) * (size_t)m);
    }
    r->len--; /* pending is committed by commit(), not here */
    return m;
}

static int ng_draft(void *gv, td_draft_req *q, td_err *err) {
    ng_group *g = gv;
    if (q->n_rows != g->n_rows) return td_seterr(err, TD_ESTATE, "ngram: draft for %d rows, group has %d", q->n_rows, g->n_rows);
    q->has_probs = 0;
    for (int i = 0; i < q->n_rows; i++) {
        q->n_tokens[i] = 0;
        if (q->depth[i] <= 0) continue;
        int matched;
        int m = ng_propose(g, i, q->pending[i], q->depth[i], q->tokens + (size_t)i * q->max_depth, &matched);
        if (m < 0) return td_seterr(err, TD_ENOMEM, "ngram: out of memory");
        q->n_tokens[i] = m;
    }
    return 0;
}

/* Every proposal of this drafter is a lookup: all of them are on offer. */
static int ng_offer(void *gv, const int32_t *pending, int max_depth, int32_t *tokens, int *n_tokens, int *match,
                    td_err *err) {
    ng_group *g = gv;
    for (int i = 0; i < g->n_rows; i++)
        if ((n_tokens[i] = ng_propose(g, i, pending[i], max_depth, tokens + (size_t)i * max_depth, &match[i])) < 0)
            return td_seterr(err, TD_ENOMEM, "ngram: out of memory");
    return 0;
}

static int ng_commit(void *gv, const td_draft_commit *cm, int n_rows, td_err *err) {
    ng_group *g = gv;
    for (int i = 0; i < n_rows; i++) {
        ng_row *r = &g->rows[i];
        if (row_push(r, &cm[i].old_pending, 1) != 0 ||
            (cm[i].n_accepted > 0 && row_push(r, cm[i].accepted, cm[i].n_accepted) != 0))
            return td_seterr(err, TD_ENOMEM, "ngram: out of memory");
    }
    return 0;
}

static void ng_filter(void *gv, const int *keep, int n_keep) {
    ng_group *g = gv;
    unsigned char *kept = calloc((size_t)g->n_rows + 1, 1);
    for (int i = 0; i < n_keep; i++) if (kept) kept[keep[i]] = 1;
    for (int i = 0; i < g->n_rows; i++) if (!kept || !kept[i]) { free(g->rows[i].tok); g->rows[i].tok = NULL; }
    for (int i = 0; i < n_keep; i++) g->rows[i] = g->rows[keep[i]];
    g->n_rows = n_keep;
    free(kept);
}

static int ng_capture(void *gv, int row, td_draft_checkpoint **out, td_err *err) {
    ng_group *g = gv;
    *out = NULL;
    if (row < 0 || row >= g->n_rows) return td_seterr(err, TD_EINVAL, "ngram: no row %d", row);
    size_t bytes = sizeof(int32_t) * (size_t)g->rows[row].len;
    td_draft_checkpoint *ck;
    int rc = td_draft_checkpoint_new(&ck, "ngram-v1", bytes, err);
    if (rc) return rc;
    if (bytes) memcpy(ck->data, g->rows[row].tok, bytes); /* an empty row has no stream yet */
    *out = ck;
    return 0;
}

static void ng_free_group(void *gv) {
    ng_group *g = gv;
    if (!g) return;
    for (int i = 0; i < g->n_rows; i++) free(g->rows[i].tok);
    free(g->rows);
    free(g);
}

static const td_draft_rows_vt ng_rows_vt = {
    .append = ng_append, .draft = ng_draft, .offer = ng_offer, .commit = ng_commit,
    .filter = ng_filter, .capture = ng_capture, .free = ng_free_group,
};

static int ng_open_rows(void *self, int max_rows, int max_ctx, int max_depth, const td_ctx *target_ctx,
                        td_draft_rows *out, td_err *err) {
    (void)max_depth;
    (void)target_ctx;
    (void)max_ctx;
    ng_group *g = calloc(1, sizeof *g);
    if (g) g->rows = calloc((size_t)max_rows, sizeof *g->rows);
    if (!g || !g->rows) { free(g); return td_seterr(err, TD_ENOMEM, "ngram: out of memory"); }
    g->p = self;
    g->max_rows = max_rows;
    *out = (td_draft_rows){&ng_rows_vt, g, 0};
    return 0;
}

static void ng_free(void *self) { free(self); }

static const td_drafter_vt ng_vt = {.open_rows = ng_open_rows, .tap_layers = NULL, .free = ng_free};

int td_drafter_ngram_open(td_drafter **out, const char *args, const td_model *target, td_err *err) {
    *out = NULL;
    int lo = 1, hi = 8; /* up to 8: a copy behind a 6-token or longer match is near certain (and
                           planned apart, depth.h TD_OFFER_STRONG); 1-4 measured 1.02x at batch 8
                           against 1.13x for 1-8 (bench/results/spec-ngram8.jsonl) */
    if (args && *args) {
        char tail;
        /* at most 3 digits a size: no int overflow (undefined in sscanf); more digits fail the match */
        if (sscanf(args, "%3d-%3d%c", &lo, &hi, &tail) != 2 || lo < 1 || hi < lo || hi > 64)
            return td_seterr(err, TD_EINVAL, "ngram: sizes '%s' must be MIN-MAX with 1 <= MIN <= MAX <= 64", args);
    }
    td_drafter *d = calloc(1, sizeof *d);
    ng_provider *p = calloc(1, sizeof *p);
    if (!d || !p) { free(d); free(p); return td_seterr(err, TD_ENOMEM, "out of memory"); }
    p->n_min = lo;
    p->n_max = hi;
    p->n_vocab = target->cfg.n_vocab;
    d->vt = &ng_vt;
    d->self = p;
    d->target = target;
    d->offers_all = 1; /* a lookup costs no forward: all of it is on offer */
    snprintf(d->id, sizeof d->id, "ngram:%d-%d", lo, hi);
    snprintf(d->ns, sizeof d->ns, "ngram-v1");
    *out = d;
    return 0;
}
