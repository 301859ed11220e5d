/* drafter — opens a drafter from its spec string and frees providers.
 * "none" | "ngram[:MIN-MAX]" | "model:DIR[,vocab=N][,quant=q8_0|q4_0][,lookup=N]" | "mtp:DIR[,vocab=N][,quant=...][,lookup=N]"
 * | "block:DIR[,prune=on|off][,vocab=N][,quant=...][,lookup=N]".
 * Each kind lives in spec/drafters/. */
#include "spec/draft.h"
#include "io/safetensors.h"
#include "model/model.h"
#include "nn/i8t.h"
#include "nn/quant.h"
#include "util/util.h"

#include <cjson/cJSON.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int td_drafter_open(td_drafter **out, const char *spec, const td_model *target, td_err *err) {
    *out = NULL;
    if (!spec || !target) return td_seterr(err, TD_EINVAL, "td_drafter_open: NULL spec or target");
    if (!strcmp(spec, "none") || !*spec) return 0;
    if (!strcmp(spec, "ngram")) return td_drafter_ngram_open(out, NULL, target, err);
    if (!strncmp(spec, "ngram:", 6)) return td_drafter_ngram_open(out, spec + 6, target, err);
    if (!strncmp(spec, "model:", 6) || !strncmp(spec, "mtp:", 4)) {
        /* KIND:DIR[,vocab=N][,quant=q8_0|q4_0][,lookup=N] */
        int is_model = spec[1] == 'o';
        const char *kind = is_model ? "model" : "mtp";
        char dir[4096];
        snprintf(dir, sizeof dir, "%s", spec + (is_model ? 6 : 4));
        int n_sub = 0, quant = 0, lookup = 0;
        char *opt = strchr(dir, ',');
        if (opt) *opt++ = 0;
        while (opt && *opt) {
            char *next = strchr(opt, ',');
            if (next) *next++ = 0;
            if (!strncmp(opt, "vocab=", 6)) {
                char *end;
                long v = strtol(opt + 6, &end, 10);
                if (*end || end == opt + 6 || v < 1 || v > (1L << 24))
                    return td_seterr(err, TD_EINVAL, "draft vocabulary in '%s' must be a positive count, as %s:DIR,vocab=4096", spec, kind);
                n_sub = (int)v;
            } else if (!strncmp(opt, "lookup=", 7)) {
                char *end;
                long v = strtol(opt + 7, &end, 10);
                if (*end || end == opt + 7 || v < 1 || v > TD_LOOKUP_MAX)
                    return td_seterr(err, TD_EINVAL, "'%s': lookup= takes the shortest n-gram to look up, 1..%d", spec, TD_LOOKUP_MAX);
                lookup = (int)v;
            } else if (!strncmp(opt, "quant=", 6)) {
                if (!(quant = td_draft_quant_parse(opt + 6)))
                    return td_seterr(err, TD_EINVAL, "'%s': quant= takes q8_0 or q4_0", spec);
            } else {
                return td_seterr(err, TD_EINVAL, "'%s': unknown option '%s' (vocab=N, quant=q8_0|q4_0 or lookup=N)", spec, opt);
            }
            opt = next;
        }
        return is_model ? td_drafter_model_open(out, dir, n_sub, quant, lookup, target, err) : td_drafter_mtp_open(out, dir, n_sub, quant, lookup, target, err);
    }
    if (!strncmp(spec, "block:", 6)) return td_drafter_block_open(out, spec + 6, target, err);
    return td_seterr(err, TD_EINVAL, "unknown drafter '%s' (use none, ngram[:MIN-MAX], model:DIR, mtp:DIR or block:DIR)", spec);
}

int td_draft_lookup(int32_t *s, int len, int32_t pending, int n_min, int max_out, int32_t *out, int *matched) {
    s[len] = pending;
    int at = td_ngram_longest(s, len + 1, n_min, TD_LOOKUP_MAX, matched);
    if (at < 0) return 0;
    int m = len + 1 - at < max_out ? len + 1 - at : max_out;
    memcpy(out, s + at, sizeof(int32_t) * (size_t)m);
    return m;
}

void td_draft_offer_lookup(void *g, int n_rows, int32_t *(*stream_of)(void *g, int i, int *len), int n_min,
                           const int32_t *pending, int max_depth, int32_t *tokens, int *n_tokens, int *match) {
    for (int i = 0; i < n_rows; i++) {
        int len = 0;
        int32_t *s = n_min ? stream_of(g, i, &len) : NULL;
        match[i] = 0;
        n_tokens[i] = s ? td_draft_lookup(s, len, pending[i], n_min, max_depth, tokens + (size_t)i * max_depth, &match[i]) : 0;
    }
}

int td_draft_quant_parse(const char *s) {
    return !strcmp(s, "q8_0") ? TD_DTYPE_Q8_0 : !strcmp(s, "q4_0") ? TD_DTYPE_Q4_0 : 0;
}

/* the seven matrices of each layer of L, then extra[]: a malloc'd list of n (0: out of memory) */
static td_tensor **draft_matrices(td_layer_w *L, int n_layer, td_tensor **extra, int n_extra, int *n) {
    td_tensor **ts = malloc(sizeof *ts * (size_t)(TD_LAYER_MATRICES * n_layer + n_extra + 1));
    *n = 0;
    if (!ts) return NULL;
    for (int l = 0; l < n_layer; l++, *n += TD_LAYER_MATRICES) td_layer_matrices(&L[l], ts + *n);
    for (int i = 0; i < n_extra; i++) ts[(*n)++] = extra[i];
    return ts;
}

int td_draft_quantize(td_layer_w *L, int n_layer, td_tensor **extra, int n_extra, int dtype,
                      void **arena, long long *delta, td_err *err) {
    *arena = NULL;
    *delta = 0;
    int n;
    td_tensor **ts = draft_matrices(L, n_layer, extra, n_extra, &n);
    int *dts = malloc(sizeof *dts * (size_t)(n + 1));
    if (!ts || !dts) { free(ts); free(dts); return td_seterr(err, TD_ENOMEM, "out of memory quantizing the drafter"); }
    long long was = 0;
    for (int i = 0; i < n; i++) {
        dts[i] = dtype;
        if (ts[i]->data && !td_dtype_is_quant(ts[i]->dtype) && ts[i]->n_dims == 2)
            was += (long long)(td_dtype_row_bytes(ts[i]->dtype, ts[i]->shape[1]) * (size_t)ts[i]->shape[0]);
    }
    size_t now = 0;
    int rc = td_tensors_quantize(ts, dts, n, arena, &now, err);
    if (!rc) *delta = (long long)now - was;
    free(ts);
    free(dts);
    return rc;
}

/* bytes of one matrix's int8 copy: [N][K] int8, then [N] f32, in whole 64-byte lines */
static size_t i8t_bytes(const td_tensor *t) { return ((size_t)t->shape[0] * (size_t)(t->shape[1] + 4) + 63) / 64 * 64; }
static int i8t_wants(const td_tensor *t) {
    return t->data && !t->ip && t->dtype == TD_DTYPE_Q8_0 && t->n_dims == 2 && td_i8t_fits((int)t->shape[1]);
}

/* The int8 copies (td_tensor.ip) of ts' Q8_0 matrices of widths that fit the
 * tiles, from their dequantized rows, into one arena (*arena; NULL if none). */
static int repack_i8t(td_tensor **ts, int n, void **arena, td_err *err) {
    *arena = NULL;
    if (!td_i8t_available()) return 0;
    size_t total = 0;
    int kmax = 0;
    for (int i = 0; i < n; i++)
        if (i8t_wants(ts[i])) {
            total += i8t_bytes(ts[i]);
            if (ts[i]->shape[1] > kmax) kmax = (int)ts[i]->shape[1];
        }
    if (!total) return 0;
    char *a = td_model_alloc_huge(total);
    float *row = malloc(sizeof(float) * (size_t)kmax);
    if (!a || !row) {
        free(a);
        free(row);
        return td_seterr(err, TD_ENOMEM, "out of memory making the drafter's int8 copies (%zu bytes)", total);
    }
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        td_tensor *t = ts[i];
        if (!i8t_wants(t)) continue;
        int N = (int)t->shape[0], K = (int)t->shape[1];
        int8_t *q = (int8_t *)(a + off);
        float *s = (float *)(q + (size_t)N * K);
        for (int r = 0; r < N; r++) { /* row by row: Q8_0 -> f32 -> int8 with the row's own scale */
            td_tensor_row_f32(t, r, K, row);
            td_i8t_quantize(q + (size_t)r * K, s + r, row, TD_DTYPE_F32, 1, K);
        }
        t->ip = q;
        off += i8t_bytes(t);
    }
    free(row);
    *arena = a;
    return 0;
}

int td_draft_repack_q8r(int *done, td_layer_w *L, int n_layer, td_tensor **extra, int n_extra, void **arena,
                        void **iarena, td_err *err) {
    /* one lock for every drafter: a repack happens once per drafter, and two
     * groups opened at once on two threads must not both make it (nor one read
     * a tensor's rp while the other writes it) */
    static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
    pthread_mutex_lock(&lock);
    int rc = 0;
    if (!*done) {
        int n;
        td_tensor **ts = draft_matrices(L, n_layer, extra, n_extra, &n);
        *arena = NULL;
        if (iarena) *iarena = NULL;
        if (!ts) rc = td_seterr(err, TD_ENOMEM, "out of memory repacking the drafter");
        else rc = td_tensors_repack_q8r(ts, n, arena, NULL, err);
        if (!rc && iarena && repack_i8t(ts, n, iarena, NULL) != 0) *iarena = NULL; /* an optimisation: without
                                                                                   memory for it, R16 serves */
        free(ts);
        *done = !rc;
    }
    pthread_mutex_unlock(&lock);
    return rc;
}

void td_drafter_free(td_drafter *d) {
    if (!d) return;
    d->vt->free(d->self);
    free(d);
}

const char *td_drafter_id(const td_drafter *d) { return d ? d->id : "none"; }
size_t td_drafter_weight_bytes(const td_drafter *d) { return d ? d->weight_bytes : 0; }

int td_draft_checkpoint_new(td_draft_checkpoint **out, const char *ns, size_t size, td_err *err) {
    td_draft_checkpoint *ck = calloc(1, sizeof *ck);
    if (!ck || !(ck->data = malloc(size ? size : 1))) {
        free(ck);
        *out = NULL;
        return td_seterr(err, TD_ENOMEM, "%s checkpoint of %zu bytes: out of memory", ns, size);
    }
    snprintf(ck->ns, sizeof ck->ns, "%s", ns);
    ck->size = size;
    *out = ck;
    return 0;
}

void td_draft_checkpoint_free(td_draft_checkpoint *ck) {
    if (!ck) return;
    free(ck->data);
    free(ck);
}

int td_draft_bind(const struct td_st_file *f, struct td_tensor *t, const char *name, int64_t d0, int64_t d1,
                  const char *path, td_err *err) {
    const td_st_tensor *st = td_st_find(f, name);
    if (!st) return td_seterr(err, TD_EFORMAT, "%s: tensor %s is missing", path, name);
    if (st->dtype < 0)
        return td_seterr(err, TD_EUNSUPPORTED, "%s: tensor %s has dtype %s, which tandem cannot compute with", path, name, st->dtype_name);
    int nd = d1 ? 2 : 1;
    if (st->n_dims != nd || st->shape[0] != d0 || (nd == 2 && st->shape[1] != d1)) {
        if (nd == 2)
            return td_seterr(err, TD_EFORMAT, "%s: tensor %s: shape does not match [%lld, %lld] (the drafter must be trained for this target)",
                             path, name, (long long)d0, (long long)d1);
        return td_seterr(err, TD_EFORMAT, "%s: tensor %s: shape does not match [%lld] (the drafter must be trained for this target)",
                         path, name, (long long)d0);
    }
    t->data = st->data;
    t->file = NULL; /* a safetensors view: nothing to hand back to a GGUF file */
    t->dtype = st->dtype;
    t->n_dims = nd;
    t->shape[0] = d0;
    t->shape[1] = d1;
    return 0;
}

int td_draft_weights_open(td_draft_weights *w, const char *dir, td_err *err) {
    memset(w, 0, sizeof *w);
    char path[1024];
    if (snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir) >= (int)sizeof path)
        return td_seterr(err, TD_EINVAL, "%.64s...: directory name too long", dir);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    if (access(path, F_OK) == 0) {
        snprintf(w->path[0], sizeof w->path[0], "%s", path);
        int rc = td_st_open(&w->f[0], path, err);
        if (rc) return rc;
        w->n = 1;
        w->bytes = w->f[0]->map_len;
        return 0;
    }
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    char *text = NULL;
    size_t len = 0;
    int rc = td_read_file(path, &text, &len, err);
    if (rc) return td_seterr(err, rc, "%s: neither model.safetensors nor model.safetensors.index.json can be read", dir);
    cJSON *j = cJSON_ParseWithLength(text, len);
    free(text);
    const cJSON *map = j ? cJSON_GetObjectItemCaseSensitive(j, "weight_map") : NULL;
    if (!cJSON_IsObject(map)) { cJSON_Delete(j); return td_seterr(err, TD_EFORMAT, "%s: needs an object \"weight_map\"", path); }
    const cJSON *e;
    cJSON_ArrayForEach(e, map) {
        const char *s = cJSON_IsString(e) ? e->valuestring : NULL;
        if (!s || !*s || strchr(s, '/') || !strcmp(s, ".") || !strcmp(s, "..")) {
            rc = td_seterr(err, TD_EFORMAT, "%s: tensor %s: shard name is not a file name in the directory", path, e->string);
            break;
        }
        int k = 0;
        while (k < w->n && strcmp(strrchr(w->path[k], '/') + 1, s)) k++;
        if (k < w->n) continue;
        if (w->n == TD_DRAFT_MAX_SHARDS) { rc = td_seterr(err, TD_EFORMAT, "%s: more than %d shards", path, TD_DRAFT_MAX_SHARDS); break; }
        if (snprintf(w->path[w->n], sizeof w->path[0], "%s/%s", dir, s) >= (int)sizeof w->path[0]) {
            rc = td_seterr(err, TD_EINVAL, "%s: shard name %.64s... too long", path, s);
            break;
        }
        if ((rc = td_st_open(&w->f[w->n], w->path[w->n], err)) != 0) break;
        w->bytes += w->f[w->n]->map_len;
        w->n++;
    }
    cJSON_Delete(j);
    if (!rc && !w->n) rc = td_seterr(err, TD_EFORMAT, "%s: the weight map names no shard", path);
    if (rc) td_draft_weights_free(w);
    return rc;
}

void td_draft_weights_free(td_draft_weights *w) {
    if (!w) return;
    for (int k = 0; k < w->n; k++) td_st_free(w->f[k]);
    memset(w, 0, sizeof *w);
}

int td_draft_weights_bind(const td_draft_weights *w, struct td_tensor *t, const char *name, int64_t d0, int64_t d1,
                          td_err *err) {
    int at = -1;
    for (int k = 0; k < w->n; k++)
        if (td_st_find(w->f[k], name)) {
            if (at >= 0) return td_seterr(err, TD_EFORMAT, "tensor %s is in both %s and %s", name, w->path[at], w->path[k]);
            at = k;
        }
    if (at < 0) return td_seterr(err, TD_EFORMAT, "%s: tensor %s is missing", w->n ? w->path[0] : "drafter", name);
    return td_draft_bind(w->f[at], t, name, d0, d1, w->path[at], err);
}

int td_draft_serial_tokens(const td_model *v) {
    const td_config *c = &v->cfg;
    double qd = (double)c->n_head * c->head_dim, kvd = (double)c->n_kv_head * c->head_dim;
    double per_layer = c->n_embd * (2.0 * qd + 2.0 * kvd) + 3.0 * c->n_embd * (double)c->n_ff;
    double tok = c->n_layer * per_layer + (double)c->n_vocab * c->n_embd;
    return tok > 0 ? (int)(TD_DRAFT_SERIAL_MACS / tok) : 0;
}
