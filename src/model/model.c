/* model — open a Hugging Face model directory and bind its weights.
 *
 * Design: td_model_open reads config.json (td_config_parse), then the optional
 * generation_config.json (its eos ids extend the config's; its bos overrides),
 * then maps the weights: model.safetensors when present, otherwise
 * model.safetensors.index.json whose weight_map names the shards. Each distinct
 * shard is opened once (td_st_open validates its header completely); shard names
 * must be plain file names inside the directory. Every tensor the forward needs
 * is then bound by its HF name, looked up in the shard the index names for it,
 * and checked: present, of a computable dtype (F32/F16/BF16; dtypes may differ
 * per tensor), and of exactly the shape the config implies. lm_head points at
 * embed_tokens when the embeddings are tied (an lm_head.weight in the files is
 * then ignored, as transformers does). Tensors the model does not use are
 * ignored but counted. Finally tokenizer.json (+ tokenizer_config.json) is
 * loaded when present; its vocabulary must fit in the model's.
 * Then (td_model_open_params: use_mmap = 0, or by default when the weights are
 * at least TD_MODEL_COPY_MIN bytes) every bound tensor is copied into one
 * anonymous 2 MiB-aligned MADV_HUGEPAGE arena and the files' pages are dropped
 * from the process: a decode streams all weights per token, and page-cache
 * pages are mapped 4 KiB at a time unless the cache happens to hold 2 MiB
 * folios (bench/forward-notes.md, "Weights copied at load"). The copy comes
 * after every check above, so an untrusted file is refused by the same checks,
 * with the same messages, before anything is copied.
 * A path to a file, or a directory without config.json holding one .gguf file,
 * is opened as GGUF by model_gguf.c.
 * All failures free everything, leave *out NULL and name the file/tensor/field. */
#define _GNU_SOURCE /* MADV_DONTNEED */
#include "model/model.h"
#include "io/gguf.h"
#include "io/safetensors.h"
#include "nn/kernels.h"
#include "nn/q8r.h"
#include "nn/quant.h"
#include "util/util.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define MD_PATH_MAX 4096
#define MD_MAX_SHARDS 65536

static const char *md_dtype_name(int dt) {
    switch (dt) {
    case TD_DTYPE_F32: return "F32";
    case TD_DTYPE_F16: return "F16";
    case TD_DTYPE_BF16: return "BF16";
    case TD_DTYPE_Q8_0: return "Q8_0";
    case TD_DTYPE_Q4_0: return "Q4_0";
    case TD_DTYPE_Q5_0: return "Q5_0";
    case TD_DTYPE_Q4_1: return "Q4_1";
    case TD_DTYPE_Q5_1: return "Q5_1";
    case TD_DTYPE_IQ4_NL: return "IQ4_NL";
    case TD_DTYPE_IQ4_XS: return "IQ4_XS";
    case TD_DTYPE_Q3_K: return "Q3_K";
    case TD_DTYPE_Q2_K: return "Q2_K";
    case TD_DTYPE_Q4_K: return "Q4_K";
    case TD_DTYPE_Q5_K: return "Q5_K";
    case TD_DTYPE_Q6_K: return "Q6_K";
    default: return "?";
    }
}

static int md_join(char *buf, const char *dir, const char *name, td_err *err) {
    int n = snprintf(buf, MD_PATH_MAX, "%s/%s", dir, name);
    if (n < 0 || n >= MD_PATH_MAX)
        return td_seterr(err, TD_ERANGE, "%s/%s: path too long", dir, name);
    return 0;
}

static int md_is_file(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISREG(sb.st_mode);
}

/* Loader state while binding. */
typedef struct md_loader {
    td_model *m;
    cJSON *index;        /* parsed index.json, or NULL for a single file */
    const cJSON *wmap;   /* its weight_map */
    char **shard_names;  /* [m->n_files] plain names, when sharded */
    td_err *err;
} md_loader;

/* Find, check and bind one tensor. dims: n_dims expected sizes. */
static int md_bind(md_loader *L, td_tensor *t, const char *name, int n_dims, int64_t d0, int64_t d1) {
    td_model *m = L->m;
    const td_st_tensor *st = NULL;
    if (L->wmap) {
        const cJSON *shard = cJSON_GetObjectItemCaseSensitive(L->wmap, name);
        if (!shard)
            return td_seterr(L->err, TD_EFORMAT, "tensor %s is missing (not in the weight_map of %s/%s)",
                             name, m->dir, "model.safetensors.index.json");
        int k;
        for (k = 0; k < m->n_files; k++)
            if (strcmp(L->shard_names[k], shard->valuestring) == 0) break;
        if (k == m->n_files) /* cannot happen: every weight_map value was opened */
            return td_seterr(L->err, TD_EFORMAT, "tensor %s: shard %s was not opened", name,
                             shard->valuestring);
        st = td_st_find(m->files[k], name);
        if (!st)
            return td_seterr(L->err, TD_EFORMAT,
                             "tensor %s is missing: the index names shard %s but that file has no such tensor",
                             name, m->files[k]->path);
    } else {
        st = td_st_find(m->files[0], name);
        if (!st) return td_seterr(L->err, TD_EFORMAT, "tensor %s is missing from %s", name, m->files[0]->path);
    }
    if (st->dtype < 0)
        return td_seterr(L->err, TD_EUNSUPPORTED,
                         "tensor %s has dtype %s, which tandem cannot compute with (F32, F16, BF16)", name,
                         st->dtype_name);
    int64_t want[2] = {d0, d1};
    int ok = st->n_dims == n_dims;
    for (int i = 0; ok && i < n_dims; i++) ok = st->shape[i] == want[i];
    if (!ok) {
        char got[160] = "", exp[64] = "";
        int p = 0;
        for (int i = 0; i < st->n_dims && p < (int)sizeof got - 24; i++)
            p += snprintf(got + p, sizeof got - (size_t)p, "%s%lld", i ? ", " : "", (long long)st->shape[i]);
        if (n_dims == 1) snprintf(exp, sizeof exp, "%lld", (long long)d0);
        else snprintf(exp, sizeof exp, "%lld, %lld", (long long)d0, (long long)d1);
        return td_seterr(L->err, TD_EFORMAT, "tensor %s: shape [%s] but config expects [%s]", name, got, exp);
    }
    memset(t, 0, sizeof *t);
    t->data = st->data;
    t->dtype = st->dtype;
    t->n_dims = n_dims;
    t->shape[0] = d0;
    if (n_dims == 2) t->shape[1] = d1;
    m->n_tensors++;
    m->weight_bytes += st->nbytes;
    m->n_params += (size_t)d0 * (size_t)(n_dims == 2 ? d1 : 1);
    m->dtype_count[st->dtype]++;
    m->dtype_bytes[st->dtype] += st->nbytes;
    return 0;
}

int td_weight_specs(td_model *m, int layer, td_wspec *s) {
    const td_config *c = &m->cfg;
    const int64_t E = c->n_embd, V = c->n_vocab, F = c->n_ff, D = c->head_dim;
    const int64_t Q = (int64_t)c->n_head * D, K = (int64_t)c->n_kv_head * D;
    if (layer < 0) {
        const td_wspec g[] = {
            {&m->w.tok_embd, "model.embed_tokens.weight", "token_embd.weight", 2, V, E, 1, 0},
            {&m->w.out_norm, "model.norm.weight", "output_norm.weight", 1, E, 0, 1, 0},
            {&m->w.lm_head, "lm_head.weight", "output.weight", 2, V, E, !c->tied, 0},
        };
        memcpy(s, g, sizeof g);
        return (int)(sizeof g / sizeof g[0]);
    }
    td_layer_w *l = &m->w.layers[layer];
    const td_wspec t[] = {
        {&l->attn_norm, "input_layernorm.weight", "attn_norm.weight", 1, E, 0, 1, 0},
        {&l->wq, "self_attn.q_proj.weight", "attn_q.weight", 2, Q, E, 1, TD_WSPEC_Q},
        {&l->wk, "self_attn.k_proj.weight", "attn_k.weight", 2, K, E, 1, TD_WSPEC_K},
        {&l->wv, "self_attn.v_proj.weight", "attn_v.weight", 2, K, E, 1, 0},
        {&l->wo, "self_attn.o_proj.weight", "attn_output.weight", 2, E, Q, 1, 0},
        {&l->bq, "self_attn.q_proj.bias", "attn_q.bias", 1, Q, 0, c->attn_bias, TD_WSPEC_Q},
        {&l->bk, "self_attn.k_proj.bias", "attn_k.bias", 1, K, 0, c->attn_bias, TD_WSPEC_K},
        {&l->bv, "self_attn.v_proj.bias", "attn_v.bias", 1, K, 0, c->attn_bias, 0},
        {&l->bo, "self_attn.o_proj.bias", "attn_output.bias", 1, E, 0, c->attn_bias, 0},
        {&l->q_norm, "self_attn.q_norm.weight", "attn_q_norm.weight", 1, D, 0, c->qk_norm, 0},
        {&l->k_norm, "self_attn.k_norm.weight", "attn_k_norm.weight", 1, D, 0, c->qk_norm, 0},
        {&l->ffn_norm, "post_attention_layernorm.weight", "ffn_norm.weight", 1, E, 0, 1, 0},
        {&l->w_gate, "mlp.gate_proj.weight", "ffn_gate.weight", 2, F, E, 1, 0},
        {&l->w_up, "mlp.up_proj.weight", "ffn_up.weight", 2, F, E, 1, 0},
        {&l->w_down, "mlp.down_proj.weight", "ffn_down.weight", 2, E, F, 1, 0},
    };
    memcpy(s, t, sizeof t);
    return (int)(sizeof t / sizeof t[0]);
}

static int md_bind_all(md_loader *L) {
    td_model *m = L->m;
    const td_config *c = &m->cfg;
    int rc;
    char nm[256];
    td_wspec s[TD_WSPEC_MAX];
    m->w.layers = calloc((size_t)c->n_layer, sizeof *m->w.layers);
    if (!m->w.layers) return td_seterr(L->err, TD_ENOMEM, "out of memory for %d layers", c->n_layer);
    for (int i = -1; i < c->n_layer; i++) {
        int n = td_weight_specs(m, i, s);
        for (int j = 0; j < n; j++) {
            if (!s[j].when) continue;
            if (i < 0) snprintf(nm, sizeof nm, "%s", s[j].hf);
            else snprintf(nm, sizeof nm, "model.layers.%d.%s", i, s[j].hf);
            if ((rc = md_bind(L, s[j].t, nm, s[j].nd, s[j].d0, s[j].d1))) return rc;
        }
    }
    if (c->tied) m->w.lm_head = m->w.tok_embd;
    return 0;
}

static int md_add_file(td_model *m, const char *path, td_err *err) {
    td_st_file *f = NULL;
    int rc = td_st_open(&f, path, err);
    if (rc) return rc;
    td_st_file **nf = realloc(m->files, (size_t)(m->n_files + 1) * sizeof *nf);
    if (!nf) {
        td_st_free(f);
        return td_seterr(err, TD_ENOMEM, "out of memory opening %s", path);
    }
    m->files = nf;
    m->files[m->n_files++] = f;
    return 0;
}

/* Open the shards an index names. */
static int md_open_sharded(md_loader *L, const char *ipath) {
    td_model *m = L->m;
    td_err *err = L->err;
    char *txt = NULL;
    size_t len = 0;
    int rc = td_read_file(ipath, &txt, &len, err);
    if (rc) return rc;
    L->index = cJSON_ParseWithLength(txt, len);
    free(txt);
    if (!L->index) return td_seterr(err, TD_EFORMAT, "%s: not valid JSON", ipath);
    L->wmap = cJSON_GetObjectItemCaseSensitive(L->index, "weight_map");
    if (!cJSON_IsObject(L->index) || !cJSON_IsObject(L->wmap)) {
        L->wmap = NULL;
        return td_seterr(err, TD_EFORMAT, "%s: field weight_map is missing or not an object", ipath);
    }
    const cJSON *e;
    cJSON_ArrayForEach(e, L->wmap) {
        const char *s = cJSON_IsString(e) ? e->valuestring : NULL;
        if (!s || !*s || strchr(s, '/') || strcmp(s, ".") == 0 || strcmp(s, "..") == 0 || strlen(s) > 255)
            return td_seterr(err, TD_EFORMAT, "%s: weight_map entry for %s is not a plain file name", ipath,
                             e->string ? e->string : "?");
        int k;
        for (k = 0; k < m->n_files; k++)
            if (strcmp(L->shard_names[k], s) == 0) break;
        if (k < m->n_files) continue;
        if (m->n_files >= MD_MAX_SHARDS) return td_seterr(err, TD_ERANGE, "%s: too many shards", ipath);
        char **nn = realloc(L->shard_names, (size_t)(m->n_files + 1) * sizeof *nn);
        if (!nn) return td_seterr(err, TD_ENOMEM, "out of memory reading %s", ipath);
        L->shard_names = nn;
        L->shard_names[m->n_files] = strdup(s);
        if (!L->shard_names[m->n_files]) return td_seterr(err, TD_ENOMEM, "out of memory reading %s", ipath);
        char path[MD_PATH_MAX];
        if ((rc = md_join(path, m->dir, s, err))) goto fail_name;
        if (!md_is_file(path)) {
            rc = td_seterr(err, TD_EIO, "%s: shard %s named in weight_map (for tensor %s) does not exist", ipath,
                           path, e->string ? e->string : "?");
            goto fail_name;
        }
        if ((rc = md_add_file(m, path, err))) goto fail_name;
        continue;
    fail_name:
        free(L->shard_names[m->n_files]);
        return rc;
    }
    if (m->n_files == 0) return td_seterr(err, TD_EFORMAT, "%s: weight_map names no shards", ipath);
    return 0;
}

static int md_load_tokenizer(td_model *m, td_err *err) {
    char tj[MD_PATH_MAX], tc[MD_PATH_MAX];
    int rc;
    if ((rc = md_join(tj, m->dir, "tokenizer.json", err))) return rc;
    if ((rc = md_join(tc, m->dir, "tokenizer_config.json", err))) return rc;
    if (!md_is_file(tj)) return 0;
    td_err e = {0};
    rc = td_tokenizer_open(&m->tok, tj, md_is_file(tc) ? tc : NULL, &e);
    if (rc) {
        m->tok = NULL;
        rc = rc < 0 ? rc : TD_EFORMAT;
        const char *msg = e.msg[0] ? e.msg : td_strerror(rc);
        /* the tokenizer names "tokenizer.json: ..." / "tokenizer_config.json: ...";
         * put the directory in front of such names, else the path of tokenizer.json */
        if (strncmp(msg, "tokenizer.json:", 15) == 0 || strncmp(msg, "tokenizer_config.json:", 22) == 0)
            return td_seterr(err, rc, "%s/%s", m->dir, msg);
        return td_seterr(err, rc, "%s: %s", tj, msg);
    }
    int nv = td_tokenizer_n_vocab(m->tok);
    if (nv > m->cfg.n_vocab)
        return td_seterr(err, TD_EFORMAT, "%s: tokenizer has %d ids but config.json vocab_size is %d", tj, nv,
                         m->cfg.n_vocab);
    m->chat = td_tokenizer_chat_style(m->tok);
    return 0;
}

/* The one *.gguf file in dir, into path. */
static int md_find_gguf(const char *dir, char *path, td_err *err) {
    DIR *d = opendir(dir);
    if (!d) return td_seterr(err, TD_EIO, "%s: %s", dir, strerror(errno));
    int n = 0, rc = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        size_t l = strlen(e->d_name);
        if (l < 6 || strcmp(e->d_name + l - 5, ".gguf") != 0) continue;
        char p[MD_PATH_MAX];
        if (md_join(p, dir, e->d_name, err) || !md_is_file(p)) continue;
        if (n++ == 0) memcpy(path, p, strlen(p) + 1);
    }
    closedir(d);
    if (n == 0) rc = td_seterr(err, TD_EIO, "%s: no config.json (Hugging Face layout) and no .gguf file", dir);
    else if (n > 1) rc = td_seterr(err, TD_EINVAL, "%s: no config.json and %d .gguf files; name the one to open", dir, n);
    return rc;
}

static int md_open(td_model *m, const char *dir, td_err *err) {
    size_t dl = strlen(dir);
    while (dl > 1 && dir[dl - 1] == '/') dl--; /* "dir/" -> "dir" */
    if (dl == 0 || dl >= sizeof m->dir - 300)
        return td_seterr(err, TD_EINVAL, "model directory path is empty or too long");
    memcpy(m->dir, dir, dl);
    m->dir[dl] = 0;
    struct stat sb;
    if (stat(m->dir, &sb) != 0) return td_seterr(err, TD_EIO, "%s: %s", m->dir, strerror(errno));
    if (S_ISREG(sb.st_mode)) return td_model_open_gguf(m, m->dir, err);
    if (!S_ISDIR(sb.st_mode)) return td_seterr(err, TD_EIO, "%s: not a directory or a file", m->dir);

    char path[MD_PATH_MAX];
    int rc;
    if ((rc = md_join(path, m->dir, "config.json", err))) return rc;
    if (!md_is_file(path)) { /* a directory holding one .gguf file */
        if ((rc = md_find_gguf(m->dir, path, err))) return rc;
        return td_model_open_gguf(m, path, err);
    }
    char *txt = NULL;
    size_t len = 0;
    if ((rc = td_read_file(path, &txt, &len, err))) return rc;
    td_err ce = {0};
    rc = td_config_parse(&m->cfg, txt, len, &ce);
    free(txt);
    if (rc) return td_seterr(err, rc, "%s/%s", m->dir, ce.msg); /* ce.msg starts "config.json: " */

    if ((rc = md_join(path, m->dir, "generation_config.json", err))) return rc;
    if (md_is_file(path)) {
        if ((rc = td_read_file(path, &txt, &len, err))) return rc;
        rc = td_config_merge_generation(&m->cfg, txt, len, path, err);
        free(txt);
        if (rc) return rc;
    }

    md_loader L = {.m = m, .err = err};
    char ipath[MD_PATH_MAX];
    if ((rc = md_join(path, m->dir, "model.safetensors", err))) return rc;
    if ((rc = md_join(ipath, m->dir, "model.safetensors.index.json", err))) return rc;
    if (md_is_file(path)) {
        rc = md_add_file(m, path, err);
    } else if (md_is_file(ipath)) {
        rc = md_open_sharded(&L, ipath);
    } else {
        rc = td_seterr(err, TD_EIO, "%s: no model.safetensors or model.safetensors.index.json", m->dir);
    }
    if (rc == 0) rc = md_bind_all(&L);
    if (rc == 0) {
        long total = 0;
        for (int i = 0; i < m->n_files; i++) total += m->files[i]->n_tensors;
        m->n_extra_tensors = (int)(total - m->n_tensors);
        td_model_main_dtype(m);
    }
    if (L.shard_names)
        for (int i = 0; i < m->n_files; i++) free(L.shard_names[i]);
    free(L.shard_names);
    cJSON_Delete(L.index);
    if (rc) return rc;
    return md_load_tokenizer(m, err);
}

/* Bytes of a bound tensor (1-D: [d0]; 2-D: d0 rows of d1). */
static size_t md_tensor_bytes(const td_tensor *t) {
    return t->n_dims == 2 ? td_dtype_row_bytes(t->dtype, t->shape[1]) * (size_t)t->shape[0]
                          : td_dtype_row_bytes(t->dtype, t->shape[0]);
}

/* The whole pages of [p, p + nb) as [*a0, *a1); 0 when there is none. */
static int md_pages(const void *p, size_t nb, uintptr_t *a0, uintptr_t *a1) {
    uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE);
    *a0 = ((uintptr_t)p + pg - 1) & ~(pg - 1);
    *a1 = ((uintptr_t)p + nb) & ~(pg - 1);
    return *a1 > *a0;
}

/* 1 when [p, p + nb) lies in one of the model's file mappings (GGUF, safetensors shards) */
static int md_in_files(const td_model *m, const void *p, size_t nb) {
    const char *q = p;
    if (m->gguf && m->gguf->mapped && q >= (const char *)m->gguf->map && (size_t)(q - (const char *)m->gguf->map) <= m->gguf->map_len &&
        nb <= m->gguf->map_len - (size_t)(q - (const char *)m->gguf->map))
        return 1;
    for (int i = 0; i < m->n_files; i++) {
        const char *b = m->files[i]->map;
        if (b && q >= b && (size_t)(q - b) <= m->files[i]->map_len && nb <= m->files[i]->map_len - (size_t)(q - b)) return 1;
    }
    return 0;
}

/* n bytes (a multiple of 2 MiB) of anonymous memory at a 2 MiB-aligned address,
 * advised MADV_HUGEPAGE: the load's copy, a mapping of its own so that pages of
 * it can be replaced by file pages later (a heap block could not). NULL when out
 * of memory. */
static char *md_map_huge(size_t n) {
    size_t al = (size_t)2 << 20;
    if (n > SIZE_MAX - al) return NULL;
    char *r = mmap(NULL, n + al, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (r == MAP_FAILED) return NULL;
    char *a = (char *)(((uintptr_t)r + al - 1) & ~(uintptr_t)(al - 1));
    if (a > r) munmap(r, (size_t)(a - r));
    if (r + al > a) munmap(a + n, (size_t)(r + al - a));
#ifdef MADV_HUGEPAGE
    madvise(a, n, MADV_HUGEPAGE); /* advice only */
#endif
    return a;
}

/* 1 when md_copy_weights lays t, at file offset fo, out at fo modulo the page
 * size: a block-quantized matrix R16 takes, or a bf16 matrix P24 takes whose
 * rows start on cache lines in the file. */
static int md_file_placed(const td_tensor *t, size_t fo) {
    if (t->n_dims != 2) return 0;
    if (td_q8r_dtype_ok(t->dtype)) return 1;
    return t->dtype == TD_DTYPE_BF16 && fo % 64 == 0 && td_bf16p_packable(t->shape[0], t->shape[1]);
}

/* Copy every bound tensor into one anonymous 2 MiB-aligned MADV_HUGEPAGE
 * mapping (m->copy_map), rebind the tensors to it, then drop the files' pages
 * from this process (MADV_DONTNEED on a private read-only file mapping only
 * unmaps them; the mapping stays valid, so header views into it do too). A
 * block-quantized matrix from the GGUF mapping, and a bf16 matrix whose rows
 * start on cache lines there, lands at its file offset modulo the page size
 * (md_file_placed; t->file keeps where it came from), so td_model_repack_q8r
 * and td_model_repack_p24 can later put the file's pages in place of the
 * copy's (md_file_back).
 * Runs after md_open: every size and offset was checked against the files. */
static int md_copy_weights(td_model *m, td_err *err) {
    const td_config *c = &m->cfg;
    td_wspec s[TD_WSPEC_MAX];
    size_t total = 0, pg = (size_t)sysconf(_SC_PAGESIZE);
    const char *gmap = m->gguf && m->gguf->mapped ? m->gguf->map : NULL;
    for (int pass = 0; pass < 2; pass++) {
        char *arena = NULL;
        if (pass == 1) {
            size_t len = (total + ((size_t)2 << 20) - 1) & ~(((size_t)2 << 20) - 1);
            if (!(arena = md_map_huge(len)))
                return td_seterr(err, TD_ENOMEM, "out of memory copying %zu bytes of weights", total);
            m->copy_map = arena;
            m->copy_len = len;
        }
        size_t off = 0;
        for (int l = -1; l < c->n_layer; l++) {
            int n = td_weight_specs(m, l, s);
            for (int j = 0; j < n; j++) {
                td_tensor *t = s[j].t;
                if (!s[j].when || !t->data) continue;
                size_t nb = md_tensor_bytes(t);
                /* a matrix an R16 repack or a P24 copy may take: at its file offset modulo the page
                   size, so that its pages can go back to the file then (md_file_back). A bf16 matrix
                   only where that offset is 64-byte aligned: the plain tiles read its rows in place,
                   and rows 32 bytes off a cache line cost f32-activation contexts 13-16% (others keep
                   64-byte alignment) */
                if (gmap && t->file == t->data && md_file_placed(t, (size_t)((const char *)t->file - gmap)))
                    off += ((size_t)((const char *)t->file - gmap) - off) & (pg - 1);
                if (pass == 1) {
                    uintptr_t a0, a1;
                    memcpy(arena + off, t->data, nb);
                    if (md_in_files(m, t->data, nb) && md_pages(t->data, nb, &a0, &a1)) /* not needed now: peak RSS */
                        madvise((void *)a0, a1 - a0, MADV_DONTNEED);
                    t->data = arena + off;
                }
                off += (nb + 63) & ~(size_t)63;
            }
        }
        total = off ? off : 64;
    }
    if (c->tied) m->w.lm_head = m->w.tok_embd;
    for (int i = 0; i < m->n_files; i++) td_st_release(m->files[i]);
    if (gmap) madvise(m->gguf->map, m->gguf->map_len, MADV_DONTNEED);
    m->copied = 1;
    return 0;
}

/* 1 when t's bytes in the load's copy can go back to the GGUF file they came
 * from (md_file_back replaces them by the file's pages); 0 for a mapped model,
 * whose pages go back by MADV_DONTNEED. */
static int md_file_backable(const td_model *m, const td_tensor *t) {
    if (!m->gguf || !m->gguf->mapped || m->gguf->fd < 0 || !t->file || !t->data || !m->copy_map) return 0;
    const char *gmap = m->gguf->map, *d = t->data, *f = t->file;
    size_t glen = m->gguf->map_len, nb = md_tensor_bytes(t);
    if (f < gmap || (size_t)(f - gmap) > glen || nb > glen - (size_t)(f - gmap)) return 0;
    if (d < m->copy_map || (size_t)(d - m->copy_map) > m->copy_len || nb > m->copy_len - (size_t)(d - m->copy_map)) return 0;
    return ((uintptr_t)d - (uintptr_t)(f - gmap)) % (uintptr_t)sysconf(_SC_PAGESIZE) == 0;
}

/* See td_model_repack_q8r: t's original back to the GGUF file, once t has its
 * repack (t->rp) or its P24 copy (t->pk), every byte kept. */
static void md_file_back(td_model *m, const td_tensor *t) {
    if (!(t->rp || t->pk) || !t->data) return;
    const char *d = t->data;
    size_t nb = md_tensor_bytes(t);
    uintptr_t a0, a1;
    if (!md_pages(d, nb, &a0, &a1)) return;
    if (md_in_files(m, d, nb)) { /* a mapped model: its pages fault back in from the file */
        madvise((void *)a0, a1 - a0, MADV_DONTNEED);
        return;
    }
    if (!md_file_backable(m, t)) return; /* not laid out at its file offset (md_copy_weights), or not from one */
    const char *gmap = m->gguf->map, *f = t->file;
    size_t fo = (size_t)(f - gmap) + (size_t)(a0 - (uintptr_t)d);
    if (mmap((void *)a0, a1 - a0, PROT_READ, MAP_PRIVATE | MAP_FIXED, m->gguf->fd, (off_t)fo) != MAP_FAILED) return;
    /* the kernel may have unmapped the range before failing: put memory and the bytes back */
    if (mmap((void *)a0, a1 - a0, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) != MAP_FAILED)
        memcpy((void *)a0, f + (a0 - (uintptr_t)d), a1 - a0);
}

td_model_params td_model_default_params(void) {
    td_model_params p = {.use_mmap = -1};
    return p;
}

int td_model_open(td_model **out, const char *dir, td_err *err) { return td_model_open_params(out, dir, NULL, err); }

int td_model_open_params(td_model **out, const char *dir, const td_model_params *params, td_err *err) {
    if (!out) return td_seterr(err, TD_EINVAL, "td_model_open: out is NULL");
    *out = NULL;
    if (!dir) return td_seterr(err, TD_EINVAL, "td_model_open: dir is NULL");
    td_model_params p = params ? *params : td_model_default_params();
    if (p.use_mmap < -1 || p.use_mmap > 1)
        return td_seterr(err, TD_EINVAL, "td_model_params.use_mmap is %d (1 map, 0 copy, -1 by size)", p.use_mmap);
    td_model *m = calloc(1, sizeof *m);
    if (!m) return td_seterr(err, TD_ENOMEM, "out of memory opening model %s", dir);
    int rc = md_open(m, dir, err);
    if (rc == 0 && (p.use_mmap == 0 || (p.use_mmap < 0 && m->weight_bytes >= TD_MODEL_COPY_MIN)))
        rc = md_copy_weights(m, err);
    if (rc) {
        td_model_free(m);
        return rc;
    }
    *out = m;
    return 0;
}

/* td_tensors_repack_q8r; with m, each original goes back to m's file right after its repack */
static int md_repack(td_model *m, td_tensor *const *ts, int n, void **arena_out, size_t *bytes_out, td_err *err) {
    *arena_out = NULL;
    size_t total = 0;
    for (int i = 0; i < n; i++)
        if (ts[i]->data && !ts[i]->rp && td_q8r_dtype_ok(ts[i]->dtype) && ts[i]->n_dims == 2 &&
            ts[i]->shape[1] % td_dtype_block(ts[i]->dtype) == 0) /* whole blocks (k-quants: of 256) */
            total += td_q8r_bytes(ts[i]->shape[0], ts[i]->shape[1], td_q8r_format(ts[i]->dtype));
    if (bytes_out) *bytes_out = total;
    if (!total) return 0;
    char *arena = td_model_alloc_huge(total);
    if (!arena) return td_seterr(err, TD_ENOMEM, "out of memory repacking %zu bytes of block-quantized weights", total);
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        td_tensor *t = ts[i];
        if (!t->data || t->rp || !td_q8r_dtype_ok(t->dtype) || t->n_dims != 2 || t->shape[1] % td_dtype_block(t->dtype) != 0) continue;
        td_q8r_repack(arena + off, t->data, t->dtype, t->shape[0], t->shape[1], 0, t->shape[0]);
        t->rp = arena + off;
        if (m) md_file_back(m, t);
        off += td_q8r_bytes(t->shape[0], t->shape[1], td_q8r_format(t->dtype));
    }
    *arena_out = arena;
    return 0;
}

int td_tensors_repack_q8r(td_tensor *const *ts, int n, void **arena_out, size_t *bytes_out, td_err *err) {
    return md_repack(NULL, ts, n, arena_out, bytes_out, err);
}

void td_layer_matrices(td_layer_w *L, td_tensor *out[TD_LAYER_MATRICES]) {
    td_tensor *lt[TD_LAYER_MATRICES] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
    memcpy(out, lt, sizeof lt);
}

int td_model_has_repack(const td_model *m) {
    if (m->w.lm_head.rp) return 1;
    for (int l = 0; l < m->cfg.n_layer; l++) {
        td_tensor *lt[TD_LAYER_MATRICES];
        td_layer_matrices(&m->w.layers[l], lt);
        for (int i = 0; i < TD_LAYER_MATRICES; i++)
            if (lt[i]->rp) return 1;
    }
    return 0;
}

int td_model_repack_q8r(td_model *m, td_err *err) {
    static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
    pthread_mutex_lock(&lock);
    int rc = 0;
    if (!m->q8r_done) {
        /* the matrices: every layer's projections and lm_head (tok_embd is looked up, not multiplied) */
        int n = 0;
        td_tensor **ts = malloc(((size_t)m->cfg.n_layer * TD_LAYER_MATRICES + 1) * sizeof *ts);
        if (!ts) rc = td_seterr(err, TD_ENOMEM, "out of memory repacking Q8_0 weights");
        for (int l = 0; ts && l < m->cfg.n_layer; l++, n += TD_LAYER_MATRICES) td_layer_matrices(&m->w.layers[l], ts + n);
        if (ts) {
            ts[n++] = &m->w.lm_head;
            rc = md_repack(m, ts, n, &m->q8r_arena, &m->q8r_bytes, err);
        }
        free(ts);
        if (!rc) m->q8r_done = 1;
    }
    pthread_mutex_unlock(&lock);
    return rc;
}

int td_model_repack_p24(td_model *m, td_err *err) {
    static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
    pthread_mutex_lock(&lock);
    int rc = 0;
    td_tensor **ts = NULL;
    if (m->p24_done) goto out;
    int n = 0;
    ts = malloc(((size_t)m->cfg.n_layer * TD_LAYER_MATRICES + 1) * sizeof *ts);
    if (!ts) {
        rc = td_seterr(err, TD_ENOMEM, "out of memory packing bf16 weights");
        goto out;
    }
    for (int l = 0; l < m->cfg.n_layer; l++, n += TD_LAYER_MATRICES) td_layer_matrices(&m->w.layers[l], ts + n);
    if (!m->p24_not_head) ts[n++] = &m->w.lm_head;
    /* which to pack: all of them in a mapped model; in a copy, those whose plain bytes can go back
       to the file (md_file_backable), and the others while they add at most TD_P24_COPY_MAX bytes
       (a GGUF file's bf16 tensors may lie 32 bytes off a cache line, where the plain tiles run slower,
       so the copy keeps them on one and cannot hand them back: both copies stay) */
    size_t total = 0, kept = 0;
    for (int i = 0; i < n; i++) {
        td_tensor *t = ts[i];
        size_t nb = (td_bf16p_bytes(t->shape[0], t->shape[1]) + 63) & ~(size_t)63;
        int ok = t->data && !t->pk && t->dtype == TD_DTYPE_BF16 && t->n_dims == 2 && td_bf16p_packable(t->shape[0], t->shape[1]);
        if (ok && m->copied && !md_file_backable(m, t)) {
            if (kept + nb > TD_P24_COPY_MAX) ok = 0;
            else kept += nb;
        }
        if (!ok) ts[i] = NULL;
        else total += nb;
    }
    if (!total) {
        m->p24_done = 1;
        goto out;
    }
    char *arena = td_model_alloc_huge(total);
    if (!arena) {
        rc = td_seterr(err, TD_ENOMEM, "out of memory packing %zu bytes of bf16 weights", total);
        goto out;
    }
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        td_tensor *t = ts[i];
        if (!t) continue;
        td_bf16p_pack(arena + off, t->data, t->shape[0], t->shape[1]);
        t->pk = arena + off;
        md_file_back(m, t); /* the plain pages back to the file (they fault in again if read) */
        off += (td_bf16p_bytes(t->shape[0], t->shape[1]) + 63) & ~(size_t)63;
    }
    m->p24_arena = arena;
    m->p24_bytes = total;
    m->p24_done = 1;
out:
    free(ts);
    pthread_mutex_unlock(&lock);
    return rc;
}

void td_model_free(td_model *m) {
    if (!m) return;
    if (m->tok) td_tokenizer_free(m->tok);
    for (int i = 0; i < m->n_files; i++) td_st_free(m->files[i]);
    free(m->files);
    td_gguf_free(m->gguf);
    free(m->w.layers);
    for (int i = 0; i < m->n_owned; i++) free(m->owned[i]);
    free(m->owned);
    if (m->copy_map) munmap(m->copy_map, m->copy_len);
    free(m->q8r_arena);
    free(m->p24_arena);
    free(m);
}

void td_model_get_info(const td_model *m, td_model_info *info) {
    if (!info) return;
    memset(info, 0, sizeof *info);
    if (!m) return;
    const td_config *c = &m->cfg;
    info->arch = c->arch;
    info->arch_name = c->arch_name;
    info->n_vocab = c->n_vocab;
    info->n_embd = c->n_embd;
    info->n_layer = c->n_layer;
    info->n_head = c->n_head;
    info->n_kv_head = c->n_kv_head;
    info->head_dim = c->head_dim;
    info->n_ff = c->n_ff;
    info->n_ctx_train = c->n_ctx_train;
    info->tied_embeddings = c->tied;
    info->dtype = m->dtype;
    info->n_params = m->n_params;
    info->weight_bytes = m->weight_bytes;
    info->n_tensors = m->n_tensors;
    info->n_eos = c->n_eos;
    info->copied = m->copied;
    memcpy(info->eos_ids, c->eos_ids, sizeof info->eos_ids);
}

const td_tokenizer *td_model_tokenizer(const td_model *m) { return m ? m->tok : NULL; }

static const char *md_chat_name(td_chat_style s) {
    switch (s) {
    case TD_CHAT_CHATML: return "chatml";
    case TD_CHAT_LLAMA3: return "llama3";
    default: return "none";
    }
}

#define MD_LABEL "%-26s "

void td_model_describe(const td_model *m, FILE *f) {
    if (!m || !f) return;
    const td_config *c = &m->cfg;
    fprintf(f, MD_LABEL "%s\n", "model:", m->dir);
    fprintf(f, MD_LABEL "%s\n", "architecture:", c->arch_name);
    fprintf(f, MD_LABEL "%d\n", "vocab_size:", c->n_vocab);
    fprintf(f, MD_LABEL "%d\n", "hidden_size:", c->n_embd);
    fprintf(f, MD_LABEL "%d\n", "num_hidden_layers:", c->n_layer);
    fprintf(f, MD_LABEL "%d\n", "num_attention_heads:", c->n_head);
    fprintf(f, MD_LABEL "%d\n", "num_key_value_heads:", c->n_kv_head);
    fprintf(f, MD_LABEL "%d\n", "head_dim:", c->head_dim);
    fprintf(f, MD_LABEL "%d\n", "intermediate_size:", c->n_ff);
    fprintf(f, MD_LABEL "%d\n", "max_position_embeddings:", c->n_ctx_train);
    fprintf(f, MD_LABEL "%g\n", "rms_norm_eps:", (double)c->rms_eps);
    fprintf(f, MD_LABEL "%g\n", "rope_theta:", c->rope_theta);
    if (c->rope_scaling == TD_ROPE_LLAMA3)
        fprintf(f, MD_LABEL "llama3 (factor %g, low_freq_factor %g, high_freq_factor %g, "
                   "original_max_position_embeddings %d)\n",
                "rope_type:", c->rope_factor, c->rope_low_freq_factor, c->rope_high_freq_factor, c->rope_orig_ctx);
    else
        fprintf(f, MD_LABEL "default\n", "rope_type:");
    fprintf(f, MD_LABEL "%s\n", "tie_word_embeddings:", c->tied ? "true" : "false");
    fprintf(f, MD_LABEL "%s\n", "attention_bias:", c->attn_bias ? "true" : "false");
    fprintf(f, MD_LABEL "%s\n", "qk_norm:", c->qk_norm ? "true" : "false");
    fprintf(f, MD_LABEL, "eos_token_id:");
    for (int i = 0; i < c->n_eos; i++) fprintf(f, "%s%d", i ? ", " : "", (int)c->eos_ids[i]);
    fprintf(f, "%s\n", c->n_eos ? "" : "(none)");
    if (c->bos_id >= 0) fprintf(f, MD_LABEL "%d\n", "bos_token_id:", (int)c->bos_id);
    else fprintf(f, MD_LABEL "(none)\n", "bos_token_id:");
    fprintf(f, MD_LABEL "%d used, %d ignored (unused by the model)\n", "tensors:", m->n_tensors, m->n_extra_tensors);
    fprintf(f, MD_LABEL "%zu (%.3f M)\n", "parameters:", m->n_params, (double)m->n_params / 1e6);
    fprintf(f, MD_LABEL "%zu (%.2f MiB)\n", "weight bytes:", m->weight_bytes, (double)m->weight_bytes / 1048576.0);
    fprintf(f, MD_LABEL, "dtypes:");
    int first = 1;
    for (int d = 0; d < TD_DTYPE_COUNT; d++) {
        if (!m->dtype_count[d]) continue;
        fprintf(f, "%s%s x %d (%zu bytes)", first ? "" : ", ", md_dtype_name(d), m->dtype_count[d], m->dtype_bytes[d]);
        first = 0;
    }
    fprintf(f, "\n");
    fprintf(f, MD_LABEL "%d\n", "files:", m->n_files + (m->gguf != NULL));
    for (int i = 0; i < m->n_files; i++)
        fprintf(f, "  %s (%d tensors, %zu bytes)\n", m->files[i]->path, m->files[i]->n_tensors, m->files[i]->map_len);
    if (m->gguf)
        fprintf(f, "  %s (GGUF v%u, %d tensors, %d metadata keys, %zu bytes)\n", m->gguf->path, m->gguf->version,
                m->gguf->n_tensors, m->gguf->n_kvs, m->gguf->map_len);
    if (m->tok)
        fprintf(f, MD_LABEL "%d ids, chat style %s\n", "tokenizer:", td_tokenizer_n_vocab(m->tok),
                md_chat_name(m->chat));
    else
        fprintf(f, MD_LABEL "(none)\n", "tokenizer:");
}

void td_tensor_row_f32(const td_tensor *t, int64_t r, int n, float *out) {
    td_to_f32(out, (const char *)t->data + (size_t)r * td_dtype_row_bytes(t->dtype, n), t->dtype, (size_t)n);
}
