/* vocab — draft vocabularies (see vocab.h): the ranking file is untrusted input,
 * so every id is checked (an integer in range, no repeats) before any row is
 * gathered. */
#include "spec/vocab.h"
#include "nn/kernels.h"
#include "nn/quant.h"
#include "util/util.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Read the first n_sub ids of path's "ranked_ids" into ids (n_vocab ids at most). */
static int read_ranking(const char *path, int n_sub, int n_vocab, int32_t *ids, td_err *err) {
    char *text = NULL;
    size_t len = 0;
    int rc = td_read_file(path, &text, &len, err);
    if (rc) return rc;
    cJSON *j = cJSON_ParseWithLength(text, len);
    free(text);
    if (!j) return td_seterr(err, TD_EFORMAT, "%s: not valid JSON", path);
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(j, "ranked_ids");
    unsigned char *seen = calloc((size_t)n_vocab, 1);
    if (!seen) { cJSON_Delete(j); return td_seterr(err, TD_ENOMEM, "out of memory"); }
    if (!cJSON_IsArray(a)) {
        rc = td_seterr(err, TD_EFORMAT, "%s: needs an array \"ranked_ids\"", path);
    } else if (cJSON_GetArraySize(a) < n_sub) {
        rc = td_seterr(err, TD_EINVAL, "%s: ranks %d ids, fewer than the %d asked for", path, cJSON_GetArraySize(a), n_sub);
    } else {
        int k = 0;
        const cJSON *e;
        cJSON_ArrayForEach(e, a) {
            if (k == n_sub) break;
            double d = cJSON_IsNumber(e) ? e->valuedouble : -1;
            if (d < 0 || d >= n_vocab || d != (double)(int32_t)d) {
                rc = td_seterr(err, TD_EFORMAT, "%s: ranked_ids[%d] is not a token id in [0, %d)", path, k, n_vocab);
                break;
            }
            if (seen[(int32_t)d]++) {
                rc = td_seterr(err, TD_EFORMAT, "%s: ranked_ids[%d] = %d repeats an earlier id", path, k, (int)d);
                break;
            }
            ids[k++] = (int32_t)d;
        }
    }
    free(seen);
    cJSON_Delete(j);
    return rc;
}

int td_draft_vocab_open(td_draft_vocab *v, const char *dir, int n_sub, td_tensor *head, td_err *err) {
    memset(v, 0, sizeof *v);
    if (head->n_dims != 2 || !head->data) return td_seterr(err, TD_EINVAL, "%s: the drafter's LM head is not a matrix", dir);
    int n_vocab = (int)head->shape[0];
    if (n_sub < 0 || n_sub > n_vocab)
        return td_seterr(err, TD_EINVAL, "%s: draft vocabulary %d outside [1, %d]", dir, n_sub, n_vocab);
    v->n_vocab = n_vocab;
    v->n_sub = n_sub ? n_sub : n_vocab;
    v->full = *head;
    if (!n_sub || n_sub == n_vocab) return 0;
    size_t rb = td_dtype_row_bytes(head->dtype, head->shape[1]);
    if (!rb) return td_seterr(err, TD_EINVAL, "%s: the LM head's dtype %d has no row size", dir, head->dtype);
    char path[4096];
    if (snprintf(path, sizeof path, "%s/draft_vocab.json", dir) >= (int)sizeof path)
        return td_seterr(err, TD_EINVAL, "%.64s...: directory name too long", dir);
    v->kept = calloc((size_t)n_vocab, 1);
    if (!v->kept) return td_seterr(err, TD_ENOMEM, "out of memory");
    FILE *f = fopen(path, "rb");
    if (!f) { /* no ranking: the id prefix, a view */
        memset(v->kept, 1, (size_t)n_sub);
        head->shape[0] = n_sub;
        return 0;
    }
    fclose(f);
    v->ids = malloc(sizeof(int32_t) * (size_t)n_sub);
    v->rows = malloc(rb * (size_t)n_sub);
    if (!v->ids || !v->rows) { td_draft_vocab_free(v); return td_seterr(err, TD_ENOMEM, "out of memory"); }
    int rc = read_ranking(path, n_sub, n_vocab, v->ids, err);
    if (rc) { td_draft_vocab_free(v); return rc; }
    for (int j = 0; j < n_sub; j++) {
        memcpy((char *)v->rows + rb * (size_t)j, (const char *)head->data + rb * (size_t)v->ids[j], rb);
        v->kept[v->ids[j]] = 1;
    }
    v->ranked = 1;
    head->data = v->rows;
    head->file = NULL; /* a gathered copy: neither the file's bytes */
    head->rp = NULL; /* nor the full matrix's repacks describe it */
    head->ip = NULL;
    head->shape[0] = n_sub;
    return 0;
}

void td_draft_vocab_free(td_draft_vocab *v) {
    if (!v) return;
    free(v->ids);
    free(v->rows);
    free(v->kept);
    memset(v, 0, sizeof *v);
}

void td_draft_vocab_scatter(const td_draft_vocab *v, const float *q_sub, float *q) {
    if (!v->ids) {
        if (q != q_sub) memmove(q, q_sub, sizeof(float) * (size_t)v->n_sub);
        memset(q + v->n_sub, 0, sizeof(float) * (size_t)(v->n_vocab - v->n_sub));
        return;
    }
    memset(q, 0, sizeof(float) * (size_t)v->n_vocab);
    for (int j = 0; j < v->n_sub; j++) q[v->ids[j]] = q_sub[j];
}

int td_draft_ctxids_init(td_draft_ctxids *c, const td_draft_vocab *v, td_err *err) {
    memset(c, 0, sizeof *c);
    if (!v->kept) return 0;
    size_t rb = td_dtype_row_bytes(v->full.dtype, v->full.shape[1]);
    c->cap = TD_DRAFT_CTXIDS;
    c->ids = malloc(sizeof(int32_t) * (size_t)c->cap);
    c->seen = calloc((size_t)v->n_vocab, 1);
    c->rows = malloc(rb * (size_t)c->cap);
    if (!c->ids || !c->seen || !c->rows) { td_draft_ctxids_free(c); return td_seterr(err, TD_ENOMEM, "out of memory"); }
    return 0;
}

void td_draft_ctxids_free(td_draft_ctxids *c) {
    if (!c) return;
    free(c->ids);
    free(c->seen);
    free(c->rows);
    memset(c, 0, sizeof *c);
}

void td_draft_ctxids_note(const td_draft_vocab *v, td_draft_ctxids *c, const int32_t *t, int n) {
    if (!c->ids) return;
    size_t rb = td_dtype_row_bytes(v->full.dtype, v->full.shape[1]);
    for (int i = 0; i < n && c->n < c->cap; i++) {
        int32_t id = t[i];
        if (id < 0 || id >= v->n_vocab || v->kept[id] || c->seen[id]) continue;
        c->seen[id] = 1;
        memcpy((char *)c->rows + rb * (size_t)c->n, (const char *)v->full.data + rb * (size_t)id, rb);
        c->ids[c->n++] = id;
    }
}

void td_draft_ctxids_logits(const td_draft_vocab *v, const td_draft_ctxids *c, const float *x, int M, float *out, int add) {
    if (!c || !c->n || M <= 0) return;
    int K = (int)v->full.shape[1];
    td_matmul(out, c->n, x, K, M, c->rows, v->full.dtype, K, 0, c->n, add);
}

int32_t td_draft_vocab_best(const td_draft_vocab *v, const float *lg, const td_draft_ctxids *c, const float *cl) {
    int b = td_argmax(lg, v->n_sub);
    int32_t best = td_draft_vocab_id(v, b);
    if (!c || !c->n) return best;
    float bv = lg[b];
    for (int j = 0; j < c->n; j++)
        if (cl[j] > bv) { bv = cl[j]; best = c->ids[j]; }
    return best;
}

int32_t td_draft_vocab_pick(const td_draft_vocab *v, const float *lg, const td_draft_ctxids *c, const float *hn,
                            float *scratch) {
    if (!c || !c->n || !hn) return td_draft_vocab_best(v, lg, NULL, NULL);
    td_draft_ctxids_logits(v, c, hn, 1, scratch, 0);
    return td_draft_vocab_best(v, lg, c, scratch);
}
