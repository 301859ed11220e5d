/* tok_gguf — tokenizer.ggml.* metadata <-> tokenizer.json (see tok_gguf.h).
 *
 * Design: reading validates every array (types, lengths, token strings
 * non-empty and without NUL bytes, token types known, special ids in range)
 * and builds cJSON documents equal in meaning to the tokenizer.json and
 * tokenizer_config.json that tandem would read, then hands their text to
 * td_tokenizer_open_mem, which validates the rest (merges naming known tokens,
 * ...). Writing reads tokenizer.json with cJSON, requires its normalizer and
 * pre-tokenizer to be one of the table's, and emits the arrays. A merge given
 * as a pair ["a", "b"] is written "a b" (byte-level tokens hold no spaces). */
#define _POSIX_C_SOURCE 200809L
#include "tok/tok_gguf.h"
#include "util/util.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TG_MAX_TOKENS (1 << 24)

enum { TG_NORMAL = 1, TG_UNKNOWN = 2, TG_CONTROL = 3, TG_USER = 4, TG_UNUSED = 5, TG_BYTE = 6 };

/* Pre-tokenizers GGUF names and tandem implements. */
static const struct tg_pre {
    const char *name;
    const char *regex;   /* the Split pattern of the tokenizer.json */
    int nfc;             /* normalizer NFC */
    int ignore_merges;   /* model.ignore_merges */
} tg_pres[] = {
    {"qwen2",
     "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
     1, 0},
    {"llama-bpe",
     "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
     0, 1},
};
#define TG_N_PRES (sizeof tg_pres / sizeof tg_pres[0])

/* ---- GGUF -> tokenizer ---------------------------------------------------- */

/* A string array key with n elements (n = 0: any count >= 1). */
static int tg_str_array(const td_gguf_file *f, const char *key, const td_gguf_kv **out, td_err *err) {
    const td_gguf_kv *kv = td_gguf_find_kv(f, key);
    *out = NULL;
    if (!kv) return 0;
    if (kv->type != TD_GGUF_ARRAY || kv->arr_type != TD_GGUF_STRING)
        return td_seterr(err, TD_EFORMAT, "%s: key %s is not an array of strings", f->path, key);
    *out = kv;
    return 1;
}

/* NUL-terminated copy of s into *buf (grown). */
static const char *tg_cstr(const td_gguf_str *s, char **buf, size_t *cap) {
    if (s->len + 1 > *cap) {
        size_t c = *cap ? *cap : 256;
        while (c < s->len + 1) c *= 2;
        char *nb = realloc(*buf, c);
        if (!nb) return NULL;
        *buf = nb;
        *cap = c;
    }
    memcpy(*buf, s->s, s->len);
    (*buf)[s->len] = 0;
    return *buf;
}

static cJSON *tg_pretok_json(const struct tg_pre *p) {
    cJSON *seq = cJSON_CreateObject(), *list = cJSON_CreateArray(), *split = cJSON_CreateObject(),
          *pat = cJSON_CreateObject(), *bl = cJSON_CreateObject();
    if (!seq || !list || !split || !pat || !bl) {
        cJSON_Delete(seq); cJSON_Delete(list); cJSON_Delete(split); cJSON_Delete(pat); cJSON_Delete(bl);
        return NULL;
    }
    cJSON_AddStringToObject(seq, "type", "Sequence");
    cJSON_AddStringToObject(pat, "Regex", p->regex);
    cJSON_AddStringToObject(split, "type", "Split");
    cJSON_AddItemToObject(split, "pattern", pat);
    cJSON_AddStringToObject(split, "behavior", "Isolated");
    cJSON_AddBoolToObject(split, "invert", 0);
    cJSON_AddStringToObject(bl, "type", "ByteLevel");
    cJSON_AddBoolToObject(bl, "add_prefix_space", 0);
    cJSON_AddBoolToObject(bl, "use_regex", 0);
    cJSON_AddItemToArray(list, split);
    cJSON_AddItemToArray(list, bl);
    cJSON_AddItemToObject(seq, "pretokenizers", list);
    return seq;
}

/* Token id from key (absent: -1); must be < n. */
static int tg_token_id(const td_gguf_file *f, const char *key, uint64_t n, int32_t *out, td_err *err) {
    uint32_t v;
    *out = -1;
    int rc = td_gguf_get_u32(f, key, &v, err);
    if (rc <= 0) return rc;
    if (v >= n) return td_seterr(err, TD_ERANGE, "%s: key %s = %u is outside the %llu tokens", f->path, key, v, (unsigned long long)n);
    *out = (int32_t)v;
    return 0;
}

static int tg_build(const td_gguf_file *f, cJSON *root, cJSON *cfg, td_err *err) {
    const char *path = f->path;
    td_gguf_str s;
    int rc = td_gguf_get_str(f, "tokenizer.ggml.pre", &s, err);
    if (rc < 0) return rc;
    const struct tg_pre *pre = NULL;
    for (size_t i = 0; rc == 1 && i < TG_N_PRES; i++)
        if (strlen(tg_pres[i].name) == s.len && memcmp(tg_pres[i].name, s.s, s.len) == 0) pre = &tg_pres[i];
    if (!pre)
        return td_seterr(err, TD_EUNSUPPORTED, "%s: tokenizer.ggml.pre = \"%.*s\" is not supported (qwen2, llama-bpe)", path,
                         rc == 1 ? (int)(s.len > 40 ? 40 : s.len) : 9, rc == 1 ? s.s : "(missing)");
    const td_gguf_kv *tokens, *merges, *types = td_gguf_find_kv(f, "tokenizer.ggml.token_type");
    if ((rc = tg_str_array(f, "tokenizer.ggml.tokens", &tokens, err)) < 0) return rc;
    if (!tokens) return td_seterr(err, TD_EFORMAT, "%s: key tokenizer.ggml.tokens is missing", path);
    if (tokens->n == 0 || tokens->n > TG_MAX_TOKENS)
        return td_seterr(err, TD_ERANGE, "%s: tokenizer.ggml.tokens has %llu tokens (1..%d)", path,
                         (unsigned long long)tokens->n, TG_MAX_TOKENS);
    if ((rc = tg_str_array(f, "tokenizer.ggml.merges", &merges, err)) < 0) return rc;
    if (types) {
        int at = types->arr_type;
        if (types->type != TD_GGUF_ARRAY || !(at == TD_GGUF_I32 || at == TD_GGUF_U32 || at == TD_GGUF_I8 || at == TD_GGUF_U8))
            return td_seterr(err, TD_EFORMAT, "%s: key tokenizer.ggml.token_type is not an array of integers", path);
        if (types->n != tokens->n)
            return td_seterr(err, TD_EFORMAT, "%s: tokenizer.ggml.token_type has %llu entries but tokens has %llu", path,
                             (unsigned long long)types->n, (unsigned long long)tokens->n);
    }
    cJSON *model = cJSON_AddObjectToObject(root, "model");
    cJSON *vocab = model ? cJSON_AddObjectToObject(model, "vocab") : NULL;
    cJSON *mj = model ? cJSON_AddArrayToObject(model, "merges") : NULL;
    cJSON *added = cJSON_AddArrayToObject(root, "added_tokens");
    if (!vocab || !mj || !added) return td_seterr(err, TD_ENOMEM, "%s: out of memory", path);
    cJSON_AddStringToObject(model, "type", "BPE");
    cJSON_AddBoolToObject(model, "ignore_merges", pre->ignore_merges);
    if (pre->nfc) cJSON_AddItemToObject(cJSON_AddObjectToObject(root, "normalizer"), "type", cJSON_CreateString("NFC"));
    cJSON *pt = tg_pretok_json(pre);
    if (!pt) return td_seterr(err, TD_ENOMEM, "%s: out of memory", path);
    cJSON_AddItemToObject(root, "pre_tokenizer", pt);
    cJSON_AddItemToObject(cJSON_AddObjectToObject(root, "decoder"), "type", cJSON_CreateString("ByteLevel"));

    char *buf = NULL;
    size_t cap = 0;
    rc = 0;
    for (uint64_t i = 0; i < tokens->n && !rc; i++) {
        const td_gguf_str *t = &tokens->strs[i];
        int64_t ty = types ? td_gguf_arr_int(types, i) : TG_NORMAL;
        if (ty < TG_NORMAL || ty > TG_BYTE) {
            rc = td_seterr(err, TD_EFORMAT, "%s: tokenizer.ggml.token_type[%llu] = %lld is not a token type (1..6)", path,
                           (unsigned long long)i, (long long)ty);
            break;
        }
        if (ty == TG_UNUSED) continue;
        if (t->len == 0 || memchr(t->s, 0, t->len)) {
            rc = td_seterr(err, TD_EFORMAT, "%s: tokenizer.ggml.tokens[%llu] is empty or contains a NUL byte", path,
                           (unsigned long long)i);
            break;
        }
        const char *c = tg_cstr(t, &buf, &cap);
        if (!c) { rc = td_seterr(err, TD_ENOMEM, "%s: out of memory", path); break; }
        if (ty == TG_CONTROL || ty == TG_USER) {
            cJSON *a = cJSON_CreateObject();
            if (!a) { rc = td_seterr(err, TD_ENOMEM, "%s: out of memory", path); break; }
            cJSON_AddItemToArray(added, a);
            cJSON_AddNumberToObject(a, "id", (double)i);
            cJSON_AddStringToObject(a, "content", c);
            cJSON_AddBoolToObject(a, "special", ty == TG_CONTROL);
            cJSON_AddBoolToObject(a, "normalized", 0);
        } else if (!cJSON_AddNumberToObject(vocab, c, (double)i)) {
            rc = td_seterr(err, TD_ENOMEM, "%s: out of memory", path);
        }
    }
    for (uint64_t i = 0; merges && i < merges->n && !rc; i++) {
        const td_gguf_str *m = &merges->strs[i];
        const char *c = memchr(m->s, 0, m->len) ? NULL : tg_cstr(m, &buf, &cap);
        if (!c) rc = td_seterr(err, TD_EFORMAT, "%s: tokenizer.ggml.merges[%llu] contains a NUL byte", path, (unsigned long long)i);
        else if (!cJSON_AddItemToArray(mj, cJSON_CreateString(c))) rc = td_seterr(err, TD_ENOMEM, "%s: out of memory", path);
    }
    int32_t bos, eos;
    int add_bos = 0;
    if (!rc) rc = tg_token_id(f, "tokenizer.ggml.bos_token_id", tokens->n, &bos, err);
    if (!rc) rc = tg_token_id(f, "tokenizer.ggml.eos_token_id", tokens->n, &eos, err);
    if (!rc && (rc = td_gguf_get_bool(f, "tokenizer.ggml.add_bos_token", &add_bos, err)) > 0) rc = 0;
    if (!rc && (rc = td_gguf_get_str(f, "tokenizer.chat_template", &s, err)) > 0) rc = 0;
    if (!rc) {
        const td_gguf_kv *ct = td_gguf_find_kv(f, "tokenizer.chat_template");
        if (ct && memchr(ct->str.s, 0, ct->str.len))
            rc = td_seterr(err, TD_EFORMAT, "%s: tokenizer.chat_template contains a NUL byte", path);
        else if (ct && !cJSON_AddStringToObject(cfg, "chat_template", tg_cstr(&ct->str, &buf, &cap) ? buf : ""))
            rc = td_seterr(err, TD_ENOMEM, "%s: out of memory", path);
    }
    if (!rc && eos >= 0 && tg_cstr(&tokens->strs[eos], &buf, &cap)) cJSON_AddStringToObject(cfg, "eos_token", buf);
    if (!rc && add_bos && bos >= 0 && tg_cstr(&tokens->strs[bos], &buf, &cap)) cJSON_AddStringToObject(cfg, "bos_token", buf);
    free(buf);
    return rc;
}

int td_tok_gguf_open(td_tokenizer **out, const td_gguf_file *f, td_err *err) {
    if (!out) return td_seterr(err, TD_EINVAL, "td_tok_gguf_open: out is NULL");
    *out = NULL;
    td_gguf_str s;
    int rc = td_gguf_get_str(f, "tokenizer.ggml.model", &s, err);
    if (rc <= 0) return rc;
    if (s.len != 4 || memcmp(s.s, "gpt2", 4) != 0)
        return td_seterr(err, TD_EUNSUPPORTED, "%s: tokenizer.ggml.model = \"%.*s\" is not supported (gpt2: byte-level BPE)",
                         f->path, (int)(s.len > 40 ? 40 : s.len), s.s);
    cJSON *root = cJSON_CreateObject(), *cfg = cJSON_CreateObject();
    char *tj = NULL, *cj = NULL;
    if (!root || !cfg) rc = td_seterr(err, TD_ENOMEM, "%s: out of memory", f->path);
    else rc = tg_build(f, root, cfg, err);
    if (!rc) {
        tj = cJSON_PrintUnformatted(root);
        cj = cJSON_PrintUnformatted(cfg);
        if (!tj || !cj) rc = td_seterr(err, TD_ENOMEM, "%s: out of memory", f->path);
    }
    cJSON_Delete(root);
    cJSON_Delete(cfg);
    if (!rc) {
        td_err e = {0};
        rc = td_tokenizer_open_mem(out, tj, strlen(tj), cj, strlen(cj), &e);
        if (rc) rc = td_seterr(err, rc, "%s: tokenizer metadata: %s", f->path, e.msg);
    }
    free(tj);
    free(cj);
    return rc;
}

/* ---- tokenizer.json -> GGUF ----------------------------------------------- */

static const cJSON *tg_get(const cJSON *o, const char *k) { return cJSON_GetObjectItemCaseSensitive(o, k); }
static int tg_true(const cJSON *o, const char *k) { return cJSON_IsTrue(tg_get(o, k)); }

/* Which table entry the tokenizer.json's normalizer/pre-tokenizer/model match. */
static const struct tg_pre *tg_match_pre(const cJSON *root) {
    const cJSON *norm = tg_get(root, "normalizer"), *pt = tg_get(root, "pre_tokenizer"), *model = tg_get(root, "model");
    int nfc = 0;
    if (norm && !cJSON_IsNull(norm)) {
        const cJSON *ty = tg_get(norm, "type");
        if (!cJSON_IsString(ty) || strcmp(ty->valuestring, "NFC") != 0) return NULL;
        nfc = 1;
    }
    const cJSON *ty = tg_get(pt, "type"), *list = tg_get(pt, "pretokenizers");
    if (!cJSON_IsString(ty) || strcmp(ty->valuestring, "Sequence") || cJSON_GetArraySize(list) != 2) return NULL;
    const cJSON *split = cJSON_GetArrayItem(list, 0), *bl = cJSON_GetArrayItem(list, 1);
    const cJSON *sty = tg_get(split, "type"), *re = tg_get(tg_get(split, "pattern"), "Regex"), *beh = tg_get(split, "behavior");
    const cJSON *bty = tg_get(bl, "type");
    if (!cJSON_IsString(sty) || strcmp(sty->valuestring, "Split") || !cJSON_IsString(re) || !cJSON_IsString(beh) ||
        strcmp(beh->valuestring, "Isolated") || tg_true(split, "invert"))
        return NULL;
    if (!cJSON_IsString(bty) || strcmp(bty->valuestring, "ByteLevel") || tg_true(bl, "add_prefix_space") ||
        !cJSON_IsFalse(tg_get(bl, "use_regex")))
        return NULL;
    int ignore = tg_true(model, "ignore_merges");
    for (size_t i = 0; i < TG_N_PRES; i++)
        if (!strcmp(tg_pres[i].regex, re->valuestring) && tg_pres[i].nfc == nfc && tg_pres[i].ignore_merges == ignore)
            return &tg_pres[i];
    return NULL;
}

static int tg_write(td_gguf_writer *w, const cJSON *root, const cJSON *cfg, const char *path, int n_vocab, int add_bos,
                    td_err *err) {
    const struct tg_pre *pre = tg_match_pre(root);
    if (!pre)
        return td_seterr(err, TD_EUNSUPPORTED,
                         "%s: the normalizer/pre-tokenizer is not one GGUF names (qwen2: Qwen2/3's regex with NFC; "
                         "llama-bpe: Llama 3's regex, ignore_merges)", path);
    const cJSON *model = tg_get(root, "model"), *vocab = tg_get(model, "vocab"), *merges = tg_get(model, "merges");
    const cJSON *added = tg_get(root, "added_tokens"), *it;
    char **tok = calloc((size_t)n_vocab, sizeof *tok);
    int32_t *type = calloc((size_t)n_vocab, sizeof *type);
    int n_m = cJSON_GetArraySize(merges);
    char **mg = calloc((size_t)n_m + 1, sizeof *mg);
    int rc = 0;
    if (!tok || !type || !mg) { rc = td_seterr(err, TD_ENOMEM, "out of memory"); goto out; }
    cJSON_ArrayForEach(it, vocab) {
        int id = it->valueint;
        if (id < 0 || id >= n_vocab) { rc = td_seterr(err, TD_ERANGE, "%s: token id %d is outside the model's %d", path, id, n_vocab); goto out; }
        tok[id] = it->string;
        type[id] = TG_NORMAL;
    }
    cJSON_ArrayForEach(it, added) {
        int id = tg_get(it, "id")->valueint;
        if (id < 0 || id >= n_vocab) { rc = td_seterr(err, TD_ERANGE, "%s: added token id %d is outside the model's %d", path, id, n_vocab); goto out; }
        tok[id] = tg_get(it, "content")->valuestring;
        type[id] = tg_true(it, "special") ? TG_CONTROL : TG_USER;
    }
    char **pads = calloc((size_t)n_vocab, sizeof *pads);
    if (!pads) { rc = td_seterr(err, TD_ENOMEM, "out of memory"); goto out; }
    for (int i = 0; i < n_vocab && !rc; i++) {
        if (tok[i]) continue;
        pads[i] = malloc(24);
        if (!pads[i]) { rc = td_seterr(err, TD_ENOMEM, "out of memory"); break; }
        snprintf(pads[i], 24, "[PAD%d]", i);
        tok[i] = pads[i];
        type[i] = TG_UNUSED;
    }
    int k = 0;
    cJSON_ArrayForEach(it, merges) {
        if (rc) break;
        if (cJSON_IsString(it)) mg[k] = strdup(it->valuestring);
        else {
            const char *a = it->child->valuestring, *b = it->child->next->valuestring;
            size_t la = strlen(a), lb = strlen(b);
            if ((mg[k] = malloc(la + lb + 2))) { memcpy(mg[k], a, la); mg[k][la] = ' '; memcpy(mg[k] + la + 1, b, lb + 1); }
        }
        if (!mg[k++]) rc = td_seterr(err, TD_ENOMEM, "out of memory");
    }
    if (!rc) {
        td_gguf_w_str(w, "tokenizer.ggml.model", "gpt2");
        td_gguf_w_str(w, "tokenizer.ggml.pre", pre->name);
        td_gguf_w_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)tok, NULL, (size_t)n_vocab);
        td_gguf_w_arr_i32(w, "tokenizer.ggml.token_type", type, (size_t)n_vocab);
        td_gguf_w_arr_str(w, "tokenizer.ggml.merges", (const char *const *)mg, NULL, (size_t)n_m);
        td_gguf_w_bool(w, "tokenizer.ggml.add_bos_token", add_bos);
        const cJSON *ct = tg_get(cfg, "chat_template");
        const char *tmpl = cJSON_IsString(ct) ? ct->valuestring : NULL;
        const cJSON *tlist = cJSON_IsArray(ct) ? ct : NULL;
        cJSON_ArrayForEach(it, tlist) { /* [{"name", "template"}]: the default one */
            const cJSON *nm = tg_get(it, "name"), *tp = tg_get(it, "template");
            if (cJSON_IsString(tp) && (!tmpl || (cJSON_IsString(nm) && !strcmp(nm->valuestring, "default")))) tmpl = tp->valuestring;
        }
        if (tmpl) td_gguf_w_str(w, "tokenizer.chat_template", tmpl);
    }
    for (int i = 0; i < n_vocab; i++) free(pads[i]);
    free(pads);
out:
    for (int i = 0; mg && i < n_m; i++) free(mg[i]);
    free(mg);
    free(tok);
    free(type);
    return rc;
}

int td_tok_gguf_write(td_gguf_writer *w, const char *json_path, const char *config_path, int n_vocab, int add_bos,
                      td_err *err) {
    char *j = NULL, *c = NULL;
    size_t jl = 0, cl = 0;
    int rc = td_read_file(json_path, &j, &jl, err);
    if (!rc && config_path) rc = td_read_file(config_path, &c, &cl, err);
    cJSON *root = rc ? NULL : cJSON_ParseWithLength(j, jl);
    cJSON *cfg = rc || !c ? NULL : cJSON_ParseWithLength(c, cl);
    free(j);
    free(c);
    if (rc) return rc;
    /* the model loaded these files already, so they are valid; check the shape we use */
    if (!root || !cJSON_IsObject(tg_get(root, "model")) || !cJSON_IsObject(tg_get(tg_get(root, "model"), "vocab")))
        rc = td_seterr(err, TD_EFORMAT, "%s: not a tokenizer.json with model.vocab", json_path);
    else
        rc = tg_write(w, root, cfg, json_path, n_vocab, add_bos, err);
    cJSON_Delete(root);
    cJSON_Delete(cfg);
    return rc;
}
