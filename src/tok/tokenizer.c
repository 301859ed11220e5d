/* tokenizer — Hugging Face tokenizer.json byte-level BPE (Qwen2/3, Llama 3, DeepSeek).
 *
 * Design. At load the JSON is parsed once with cJSON and turned into flat tables:
 *   - every id's decoded bytes (model vocab through the inverse byte-level map;
 *     added tokens as their content) in one arena, with offsets;
 *   - an open-addressing hash from token bytes to id (model vocab only), used for
 *     the single-byte start symbols and for ignore_merges;
 *   - an open-addressing hash from (left id, right id) to (rank, merged id);
 *   - the added tokens, bucketed by first byte, longest first (leftmost-longest);
 *   - the pre-tokenizer as a list of compiled PCRE2 patterns (Split/ByteLevel).
 * BPE therefore runs on raw bytes and ids, never on byte-level strings.
 *
 * Encoding mirrors HF `encode(text)`:
 *   1. added tokens whose `normalized` is false are matched in the raw text,
 *      leftmost-longest (HF always does this, special or not; here special ones
 *      only with TD_TOK_PARSE_SPECIAL — without it they are plain text, as HF's
 *      split_special_tokens=True does); lstrip/rstrip eat neighbouring whitespace;
 *   2. each remaining segment is split into maximal valid-UTF-8 runs and runs of
 *      invalid bytes. Valid runs are NFC-normalized (when the normalizer says so),
 *      split again on `normalized` added tokens, pre-tokenized and BPE-encoded.
 *      A run of invalid bytes is one pre-token of its own: its bytes go through the
 *      byte-level map and BPE like any other, so decode(encode(s)) == s for any s
 *      (NFC input; otherwise == NFC of the valid runs). PCRE2 only sees valid UTF-8.
 *   3. BPE: a doubly linked symbol list plus a binary min-heap of candidate merges
 *      ordered by (rank, position), as in HF's Word::merge_all.
 * Scratch memory is allocated once per td_tokenize call and grown geometrically.
 *
 * Ownership: td_tokenizer owns everything it points to; td_tokenizer_free frees it.
 * A tokenizer is immutable after open, so concurrent td_tokenize calls are safe.
 */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <cjson/cJSON.h>
#include <pcre2.h>
#include <utf8proc.h>

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tandem.h"
#include "util/util.h"

#define TD_TOK_MAX_ID (1 << 24)
#define TD_TOK_MAX_PRE 8

typedef struct td_added {
    char *content;
    int len;
    int32_t id;
    int special, lstrip, rstrip, normalized, single_word;
} td_added;

typedef struct td_vocab_slot { uint32_t off, len; int32_t id; } td_vocab_slot;
typedef struct td_merge_slot { uint64_t key; int32_t rank, id; } td_merge_slot;

struct td_tokenizer {
    int n_vocab;
    uint32_t *tok_off;        /* [n_vocab + 1] offsets into bytes */
    char *bytes;              /* decoded bytes of every id */
    uint8_t *is_special;      /* [n_vocab] */
    int32_t byte_id[256];     /* id of the one-byte token, -1 when missing */

    td_vocab_slot *vmap;      /* bytes -> id over model vocab */
    size_t vmap_cap;
    td_merge_slot *mmap;      /* (a,b) -> rank, merged id */
    size_t mmap_cap;
    int ignore_merges;

    td_added *added;          /* sorted by (first byte, length desc): leftmost-longest */
    int n_added;
    int added_first[257];     /* bucket starts per first byte */

    int nfc;
    pcre2_code *pre[TD_TOK_MAX_PRE];
    int n_pre;

    int32_t eos, bos;
    td_chat_style chat;
};

/* ---- small helpers ---------------------------------------------------------- */

static uint64_t td_hash_bytes(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) { h ^= (unsigned char)s[i]; h *= 1099511628211ull; }
    return h ^ (h >> 29);
}
static uint64_t td_hash_u64(uint64_t x) {
    x ^= x >> 33; x *= 0xff51afd7ed558ccdull; x ^= x >> 33; x *= 0xc4ceb9fe1a85ec53ull; x ^= x >> 33;
    return x;
}

/* Length of the valid UTF-8 character at s[0..n), or 0 when it is invalid or truncated. */
static int td_utf8_valid_len(const unsigned char *s, size_t n) {
    unsigned c = s[0];
    if (c < 0x80) return 1;
    if (c < 0xC2 || c > 0xF4) return 0;
    int len = c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
    if (n < (size_t)len) return 0;
    unsigned lo = 0x80, hi = 0xBF;
    if (c == 0xE0) lo = 0xA0;
    else if (c == 0xED) hi = 0x9F;
    else if (c == 0xF0) lo = 0x90;
    else if (c == 0xF4) hi = 0x8F;
    if (s[1] < lo || s[1] > hi) return 0;
    for (int i = 2; i < len; i++) if ((s[i] & 0xC0) != 0x80) return 0;
    return len;
}

/* GPT-2 bytes_to_unicode: byte -> code point, and the inverse (-1 when none). */
static void td_byte_level_tables(int cp_of_byte[256], int16_t byte_of_cp[324]) {
    for (int i = 0; i < 324; i++) byte_of_cp[i] = -1;
    int n = 0;
    for (int b = 0; b < 256; b++) {
        int printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
        cp_of_byte[b] = printable ? b : 256 + n++;
        byte_of_cp[cp_of_byte[b]] = (int16_t)b;
    }
}

/* Convert a byte-level string to raw bytes in out (capacity >= strlen). Returns the
 * byte count, or -1 when a character is outside the byte-level alphabet. */
static int td_byte_level_decode(const int16_t byte_of_cp[324], const char *s, size_t n, char *out) {
    size_t i = 0; int o = 0;
    while (i < n) {
        utf8proc_int32_t cp;
        utf8proc_ssize_t k = utf8proc_iterate((const utf8proc_uint8_t *)s + i, (utf8proc_ssize_t)(n - i), &cp);
        if (k <= 0 || cp >= 324 || byte_of_cp[cp] < 0) return -1;
        out[o++] = (char)byte_of_cp[cp];
        i += (size_t)k;
    }
    return o;
}

/* ---- hash tables -------------------------------------------------------------- */

static int32_t td_vmap_get(const td_tokenizer *t, const char *s, size_t n) {
    size_t mask = t->vmap_cap - 1, i = td_hash_bytes(s, n) & mask;
    for (;; i = (i + 1) & mask) {
        const td_vocab_slot *e = &t->vmap[i];
        if (e->id < 0) return -1;
        if (e->len == n && memcmp(t->bytes + e->off, s, n) == 0) return e->id;
    }
}
/* Insert; returns 0, or 1 when the bytes are already present (first one wins). */
static int td_vmap_put(td_tokenizer *t, uint32_t off, uint32_t len, int32_t id) {
    size_t mask = t->vmap_cap - 1, i = td_hash_bytes(t->bytes + off, len) & mask;
    for (;; i = (i + 1) & mask) {
        td_vocab_slot *e = &t->vmap[i];
        if (e->id < 0) { e->off = off; e->len = len; e->id = id; return 0; }
        if (e->len == len && memcmp(t->bytes + e->off, t->bytes + off, len) == 0) return 1;
    }
}
static const td_merge_slot *td_mmap_get(const td_tokenizer *t, int32_t a, int32_t b) {
    uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    size_t mask = t->mmap_cap - 1, i = td_hash_u64(key) & mask;
    for (;; i = (i + 1) & mask) {
        const td_merge_slot *e = &t->mmap[i];
        if (e->rank < 0) return NULL;
        if (e->key == key) return e;
    }
}
static void td_mmap_put(td_tokenizer *t, int32_t a, int32_t b, int32_t rank, int32_t id) {
    uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    size_t mask = t->mmap_cap - 1, i = td_hash_u64(key) & mask;
    for (;; i = (i + 1) & mask) {
        td_merge_slot *e = &t->mmap[i];
        if (e->rank < 0) { e->key = key; e->rank = rank; e->id = id; return; }
        if (e->key == key) return; /* duplicate merge: the first (lowest rank) wins */
    }
}
static size_t td_pow2_at_least(size_t n) { size_t c = 16; while (c < n) c <<= 1; return c; }

/* ---- loading ------------------------------------------------------------------ */

void td_tokenizer_free(td_tokenizer *t) {
    if (!t) return;
    free(t->tok_off); free(t->bytes); free(t->is_special);
    free(t->vmap); free(t->mmap);
    for (int i = 0; i < t->n_added; i++) free(t->added[i].content);
    free(t->added);
    for (int i = 0; i < t->n_pre; i++) pcre2_code_free(t->pre[i]);
    free(t);
}

/* Does the JSON text end inside an open string, object or array? */
static int td_json_truncated(const char *s, size_t n) {
    long depth = 0;
    int in_str = 0;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (in_str) {
            if (c == '\\') i++;
            else if (c == '"') in_str = 0;
        } else if (c == '"') in_str = 1;
        else if (c == '{' || c == '[') depth++;
        else if (c == '}' || c == ']') depth--;
    }
    return in_str || depth > 0;
}

static cJSON *td_json_parse(const char *json, size_t len, const char *what, td_err *err, int *rc) {
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(json, len, &end, 0);
    if (!root) {
        size_t off = end && end >= json && end <= json + len ? (size_t)(end - json) : 0;
        *rc = td_seterr(err, TD_EFORMAT, "%s: malformed JSON near byte %zu of %zu%s", what, off, len,
                        len == 0 ? " (empty)" : td_json_truncated(json, len) ? " (truncated: input ends inside a value)" : "");
    }
    return root;
}

/* Rewrite Oniguruma's \s / \S (Unicode White_Space) for PCRE2, whose \s also takes
 * U+180E. Returns an owned string or NULL. */
static char *td_regex_rewrite(const char *p) {
    size_t n = strlen(p);
    char *out = malloc(n * 8 + 1);
    if (!out) return NULL;
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        if (p[i] == '\\' && i + 1 < n) {
            char c = p[i + 1];
            if (c == 's' || c == 'S') {
                const char *r = c == 's' ? "\\p{White_Space}" : "\\P{White_Space}";
                memcpy(out + o, r, strlen(r)); o += strlen(r);
            } else { out[o++] = p[i]; out[o++] = c; }
            i++;
        } else out[o++] = p[i];
    }
    out[o] = 0;
    return out;
}

static int td_pre_add(td_tokenizer *t, const char *pattern, int literal, const char *where, td_err *err) {
    if (t->n_pre >= TD_TOK_MAX_PRE)
        return td_seterr(err, TD_EUNSUPPORTED, "tokenizer.json: %s: more than %d pre-tokenizer steps", where, TD_TOK_MAX_PRE);
    char *pat = literal ? NULL : td_regex_rewrite(pattern);
    if (!literal && !pat) return td_seterr(err, TD_ENOMEM, "tokenizer.json: out of memory");
    int ec; PCRE2_SIZE eo;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)(literal ? pattern : pat), PCRE2_ZERO_TERMINATED,
                                   PCRE2_UTF | PCRE2_UCP | (literal ? PCRE2_LITERAL : 0), &ec, &eo, NULL);
    free(pat);
    if (!re) {
        PCRE2_UCHAR msg[160];
        pcre2_get_error_message(ec, msg, sizeof msg);
        return td_seterr(err, TD_EFORMAT, "tokenizer.json: %s: bad regex at offset %zu: %s", where, (size_t)eo, (char *)msg);
    }
    pcre2_jit_compile(re, PCRE2_JIT_COMPLETE); /* optional: falls back to the interpreter */
    t->pre[t->n_pre++] = re;
    return 0;
}

static const char *GPT2_PATTERN =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

static int td_bool_field(const cJSON *o, const char *k, int dflt) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    if (cJSON_IsBool(v)) return cJSON_IsTrue(v);
    return dflt;
}

static int td_load_pretok(td_tokenizer *t, const cJSON *pt, td_err *err) {
    if (!pt || cJSON_IsNull(pt)) return 0;
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(pt, "type");
    if (!cJSON_IsString(type)) return td_seterr(err, TD_EFORMAT, "tokenizer.json: pre_tokenizer has no \"type\"");
    const char *ty = type->valuestring;
    if (!strcmp(ty, "Sequence")) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(pt, "pretokenizers");
        if (!cJSON_IsArray(list)) return td_seterr(err, TD_EFORMAT, "tokenizer.json: pre_tokenizer Sequence has no \"pretokenizers\" array");
        const cJSON *it;
        cJSON_ArrayForEach(it, list) {
            const cJSON *ity = cJSON_GetObjectItemCaseSensitive(it, "type");
            if (cJSON_IsString(ity) && !strcmp(ity->valuestring, "Sequence"))
                return td_seterr(err, TD_EUNSUPPORTED, "tokenizer.json: nested pre_tokenizer Sequence");
            int rc = td_load_pretok(t, it, err);
            if (rc) return rc;
        }
        return 0;
    }
    if (!strcmp(ty, "Split")) {
        const cJSON *beh = cJSON_GetObjectItemCaseSensitive(pt, "behavior");
        if (!cJSON_IsString(beh) || strcmp(beh->valuestring, "Isolated"))
            return td_seterr(err, TD_EUNSUPPORTED, "tokenizer.json: pre_tokenizer Split behavior \"%s\" (only Isolated)",
                             cJSON_IsString(beh) ? beh->valuestring : "?");
        if (td_bool_field(pt, "invert", 0))
            return td_seterr(err, TD_EUNSUPPORTED, "tokenizer.json: pre_tokenizer Split invert=true");
        const cJSON *pat = cJSON_GetObjectItemCaseSensitive(pt, "pattern");
        const cJSON *re = cJSON_GetObjectItemCaseSensitive(pat, "Regex");
        const cJSON *lit = cJSON_GetObjectItemCaseSensitive(pat, "String");
        if (cJSON_IsString(re)) return td_pre_add(t, re->valuestring, 0, "pre_tokenizer Split pattern.Regex", err);
        if (cJSON_IsString(lit)) return td_pre_add(t, lit->valuestring, 1, "pre_tokenizer Split pattern.String", err);
        return td_seterr(err, TD_EFORMAT, "tokenizer.json: pre_tokenizer Split has no pattern.Regex or pattern.String");
    }
    if (!strcmp(ty, "ByteLevel")) {
        if (td_bool_field(pt, "add_prefix_space", 0))
            return td_seterr(err, TD_EUNSUPPORTED, "tokenizer.json: pre_tokenizer ByteLevel add_prefix_space=true");
        if (td_bool_field(pt, "use_regex", 1)) return td_pre_add(t, GPT2_PATTERN, 0, "pre_tokenizer ByteLevel", err);
        return 0; /* the byte-level mapping itself is implicit */
    }
    return td_seterr(err, TD_EUNSUPPORTED, "tokenizer.json: pre_tokenizer type \"%s\"", ty);
}

static int td_load_normalizer(td_tokenizer *t, const cJSON *n, td_err *err) {
    if (!n || cJSON_IsNull(n)) return 0;
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(n, "type");
    if (!cJSON_IsString(type)) return td_seterr(err, TD_EFORMAT, "tokenizer.json: normalizer has no \"type\"");
    if (!strcmp(type->valuestring, "NFC")) { t->nfc = 1; return 0; }
    if (!strcmp(type->valuestring, "Sequence")) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(n, "normalizers"), *it;
        if (!cJSON_IsArray(list)) return td_seterr(err, TD_EFORMAT, "tokenizer.json: normalizer Sequence has no \"normalizers\" array");
        cJSON_ArrayForEach(it, list) {
            const cJSON *ity = cJSON_GetObjectItemCaseSensitive(it, "type");
            if (!cJSON_IsString(ity) || strcmp(ity->valuestring, "NFC"))
                return td_seterr(err, TD_EUNSUPPORTED, "tokenizer.json: normalizer \"%s\" in Sequence (only NFC)",
                                 cJSON_IsString(ity) ? ity->valuestring : "?");
            t->nfc = 1;
        }
        return 0;
    }
    return td_seterr(err, TD_EUNSUPPORTED, "tokenizer.json: normalizer type \"%s\" (only NFC)", type->valuestring);
}

static int td_load_decoder(const cJSON *d, td_err *err) {
    if (!d || cJSON_IsNull(d)) return 0;
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(d, "type");
    if (cJSON_IsString(type) && !strcmp(type->valuestring, "ByteLevel")) return 0;
    return td_seterr(err, TD_EUNSUPPORTED, "tokenizer.json: decoder type \"%s\" (only ByteLevel)",
                     cJSON_IsString(type) ? type->valuestring : "?");
}

/* Order added tokens by (first byte, length descending, id). */
static int td_cmp_added(const void *a, const void *b) {
    const td_added *x = a, *y = b;
    unsigned fx = (unsigned char)x->content[0], fy = (unsigned char)y->content[0];
    if (fx != fy) return fx < fy ? -1 : 1;
    if (x->len != y->len) return x->len > y->len ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

/* Special-token name from tokenizer_config.json: a string or {"content": ...}. */
static int32_t td_config_token(const td_tokenizer *t, const cJSON *cfg, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(cfg, key);
    if (cJSON_IsObject(v)) v = cJSON_GetObjectItemCaseSensitive(v, "content");
    if (!cJSON_IsString(v)) return -1;
    return td_tokenizer_find(t, v->valuestring);
}

static int td_load_config(td_tokenizer *t, const char *cj, size_t clen, td_err *err) {
    int rc = 0;
    cJSON *cfg = td_json_parse(cj, clen, "tokenizer_config.json", err, &rc);
    if (!cfg) return rc;
    if (!cJSON_IsObject(cfg)) { cJSON_Delete(cfg); return td_seterr(err, TD_EFORMAT, "tokenizer_config.json: not a JSON object"); }
    t->eos = td_config_token(t, cfg, "eos_token");
    t->bos = td_config_token(t, cfg, "bos_token");
    const cJSON *ct = cJSON_GetObjectItemCaseSensitive(cfg, "chat_template");
    const char *tmpl = NULL;
    if (cJSON_IsString(ct)) tmpl = ct->valuestring;
    else if (cJSON_IsArray(ct)) { /* [{"name": "default", "template": ...}, ...] */
        const cJSON *it;
        cJSON_ArrayForEach(it, ct) {
            const cJSON *nm = cJSON_GetObjectItemCaseSensitive(it, "name");
            const cJSON *tp = cJSON_GetObjectItemCaseSensitive(it, "template");
            if (cJSON_IsString(tp) && (!tmpl || (cJSON_IsString(nm) && !strcmp(nm->valuestring, "default"))))
                tmpl = tp->valuestring;
        }
    }
    if (tmpl) {
        if (strstr(tmpl, "<|im_start|>")) t->chat = TD_CHAT_CHATML;
        else if (strstr(tmpl, "<|start_header_id|>")) t->chat = TD_CHAT_LLAMA3;
    }
    cJSON_Delete(cfg);
    return 0;
}

static int td_load(td_tokenizer *t, const cJSON *root, td_err *err) {
    int rc;
    if (!cJSON_IsObject(root)) return td_seterr(err, TD_EFORMAT, "tokenizer.json: not a JSON object");
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    if (!cJSON_IsObject(model)) return td_seterr(err, TD_EFORMAT, "tokenizer.json: missing \"model\" object");
    const cJSON *mtype = cJSON_GetObjectItemCaseSensitive(model, "type");
    if (cJSON_IsString(mtype) && strcmp(mtype->valuestring, "BPE"))
        return td_seterr(err, TD_EUNSUPPORTED, "tokenizer.json: model.type \"%s\" (only BPE)", mtype->valuestring);
    if (mtype && !cJSON_IsString(mtype)) return td_seterr(err, TD_EFORMAT, "tokenizer.json: model.type is not a string");
    if (td_bool_field(model, "byte_fallback", 0))
        return td_seterr(err, TD_EUNSUPPORTED, "tokenizer.json: model.byte_fallback=true");
    const cJSON *dropout = cJSON_GetObjectItemCaseSensitive(model, "dropout");
    if (cJSON_IsNumber(dropout) && dropout->valuedouble > 0)
        return td_seterr(err, TD_EUNSUPPORTED, "tokenizer.json: model.dropout");
    const cJSON *csp = cJSON_GetObjectItemCaseSensitive(model, "continuing_subword_prefix");
    const cJSON *ews = cJSON_GetObjectItemCaseSensitive(model, "end_of_word_suffix");
    if ((cJSON_IsString(csp) && csp->valuestring[0]) || (cJSON_IsString(ews) && ews->valuestring[0]))
        return td_seterr(err, TD_EUNSUPPORTED, "tokenizer.json: model.continuing_subword_prefix/end_of_word_suffix");
    t->ignore_merges = td_bool_field(model, "ignore_merges", 0);
    if ((rc = td_load_normalizer(t, cJSON_GetObjectItemCaseSensitive(root, "normalizer"), err))) return rc;
    if ((rc = td_load_pretok(t, cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer"), err))) return rc;
    if ((rc = td_load_decoder(cJSON_GetObjectItemCaseSensitive(root, "decoder"), err))) return rc;

    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
    if (!cJSON_IsObject(vocab)) return td_seterr(err, TD_EFORMAT, "tokenizer.json: missing model.vocab object");
    const cJSON *added = cJSON_GetObjectItemCaseSensitive(root, "added_tokens");
    if (added && !cJSON_IsArray(added) && !cJSON_IsNull(added))
        return td_seterr(err, TD_EFORMAT, "tokenizer.json: added_tokens is not an array");

    /* pass 1: sizes and the id range */
    int max_id = -1, n_v = 0, n_a = 0;
    size_t total = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, vocab) {
        if (!cJSON_IsNumber(it) || it->valuedouble < 0 || it->valuedouble >= TD_TOK_MAX_ID ||
            it->valuedouble != (double)(int)it->valuedouble)
            return td_seterr(err, TD_EFORMAT, "tokenizer.json: model.vocab[\"%.60s\"] is not a valid id", it->string);
        if (it->valueint > max_id) max_id = it->valueint;
        total += strlen(it->string);
        n_v++;
    }
    cJSON_ArrayForEach(it, added) {
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(it, "id");
        const cJSON *ct = cJSON_GetObjectItemCaseSensitive(it, "content");
        if (!cJSON_IsNumber(id) || id->valuedouble < 0 || id->valuedouble >= TD_TOK_MAX_ID ||
            id->valuedouble != (double)(int)id->valuedouble)
            return td_seterr(err, TD_EFORMAT, "tokenizer.json: added_tokens[%d] has no valid \"id\"", n_a);
        if (!cJSON_IsString(ct) || !ct->valuestring[0])
            return td_seterr(err, TD_EFORMAT, "tokenizer.json: added_tokens[%d] has no \"content\"", n_a);
        if (id->valueint > max_id) max_id = id->valueint;
        total += strlen(ct->valuestring);
        n_a++;
    }
    if (n_v == 0) return td_seterr(err, TD_EFORMAT, "tokenizer.json: model.vocab is empty");
    if (total > (1u << 30)) return td_seterr(err, TD_ERANGE, "tokenizer.json: %zu bytes of token strings is too many", total);
    /* per-id tables are sized by the largest id: a few ids spread up to 2^24 would
     * cost hundreds of MB for nothing; gaps (reserved ranges) stay allowed */
    if ((int64_t)max_id + 1 > 4 * ((int64_t)n_v + n_a) + 1024)
        return td_seterr(err, TD_EFORMAT, "tokenizer.json: ids reach %d but only %d tokens are defined (too sparse)", max_id,
                         n_v + n_a);
    t->n_vocab = max_id + 1;
    t->tok_off = calloc((size_t)t->n_vocab + 1, sizeof *t->tok_off);
    t->is_special = calloc((size_t)t->n_vocab, 1);
    t->bytes = malloc(2 * total + 1); /* decode table, then keys of added ids also in vocab */
    t->vmap_cap = td_pow2_at_least((size_t)n_v * 2);
    t->vmap = malloc(t->vmap_cap * sizeof *t->vmap);
    t->added = calloc((size_t)n_a + 1, sizeof *t->added);
    /* per id: its string in the JSON (vocab or added), and whether decodable */
    const char **src = calloc((size_t)t->n_vocab, sizeof *src);
    uint8_t *from_added = calloc((size_t)t->n_vocab, 1);
    if (!t->tok_off || !t->is_special || !t->bytes || !t->vmap || !t->added || !src || !from_added) {
        free(src); free(from_added);
        return td_seterr(err, TD_ENOMEM, "tokenizer.json: out of memory for %d tokens", t->n_vocab);
    }
    for (size_t i = 0; i < t->vmap_cap; i++) t->vmap[i].id = -1;
    cJSON_ArrayForEach(it, vocab) {
        if (src[it->valueint]) {
            free(src); free(from_added);
            return td_seterr(err, TD_EFORMAT, "tokenizer.json: model.vocab id %d is used twice", it->valueint);
        }
        src[it->valueint] = it->string;
    }
    n_a = 0;
    cJSON_ArrayForEach(it, added) {
        td_added *a = &t->added[n_a];
        int id = cJSON_GetObjectItemCaseSensitive(it, "id")->valueint;
        const char *cs = cJSON_GetObjectItemCaseSensitive(it, "content")->valuestring;
        a->content = malloc(strlen(cs) + 1);
        if (a->content) memcpy(a->content, cs, strlen(cs) + 1);
        if (!a->content) { free(src); free(from_added); return td_seterr(err, TD_ENOMEM, "tokenizer.json: out of memory"); }
        t->n_added = ++n_a;
        a->len = (int)strlen(a->content);
        a->id = id;
        a->special = td_bool_field(it, "special", 0);
        a->lstrip = td_bool_field(it, "lstrip", 0);
        a->rstrip = td_bool_field(it, "rstrip", 0);
        a->single_word = td_bool_field(it, "single_word", 0);
        a->normalized = td_bool_field(it, "normalized", !a->special);
        src[id] = a->content;
        from_added[id] = 1;
        t->is_special[id] = (uint8_t)a->special;
    }

    /* decoded bytes of every id; model tokens through the inverse byte-level map */
    int cp_of_byte[256]; int16_t byte_of_cp[324];
    td_byte_level_tables(cp_of_byte, byte_of_cp);
    size_t off = 0;
    for (int id = 0; id < t->n_vocab; id++) {
        t->tok_off[id] = (uint32_t)off;
        if (!src[id]) continue;
        size_t n = strlen(src[id]);
        int k = from_added[id] ? -1 : td_byte_level_decode(byte_of_cp, src[id], n, t->bytes + off);
        if (k < 0) { memcpy(t->bytes + off, src[id], n); k = (int)n; } /* as HF: raw UTF-8 */
        off += (size_t)k;
    }
    t->tok_off[t->n_vocab] = (uint32_t)off;
    for (int b = 0; b < 256; b++) t->byte_id[b] = -1;
    cJSON_ArrayForEach(it, vocab) {
        int id = it->valueint;
        /* only tokens made of byte-level characters take part in BPE. The key is
           the decoded vocab string; for an id that is also an added token (whose
           decode is its content) it is kept past the decode table. */
        size_t xoff = off;
        int k = td_byte_level_decode(byte_of_cp, it->string, strlen(it->string), t->bytes + xoff);
        if (k < 0) continue;
        uint32_t koff = from_added[id] ? (uint32_t)xoff : t->tok_off[id];
        if (from_added[id]) off += (size_t)k;
        td_vmap_put(t, koff, (uint32_t)k, id);
        if (k == 1) t->byte_id[(unsigned char)t->bytes[koff]] = id;
    }
    free(from_added);

    /* merges */
    const cJSON *merges = cJSON_GetObjectItemCaseSensitive(model, "merges");
    if (merges && !cJSON_IsArray(merges)) { free(src); return td_seterr(err, TD_EFORMAT, "tokenizer.json: model.merges is not an array"); }
    int n_m = cJSON_GetArraySize(merges);
    t->mmap_cap = td_pow2_at_least((size_t)n_m * 2 + 1);
    t->mmap = malloc(t->mmap_cap * sizeof *t->mmap);
    char *scratch = malloc(total + 2);
    if (!t->mmap || !scratch) { free(src); free(scratch); return td_seterr(err, TD_ENOMEM, "tokenizer.json: out of memory for merges"); }
    for (size_t i = 0; i < t->mmap_cap; i++) t->mmap[i].rank = -1;
    int rank = 0;
    rc = 0;
    cJSON_ArrayForEach(it, merges) {
        const char *a = NULL, *b = NULL;
        size_t la = 0, lb = 0;
        if (cJSON_IsString(it)) {
            const char *sp = strchr(it->valuestring, ' ');
            if (!sp || strchr(sp + 1, ' ')) {
                rc = td_seterr(err, TD_EFORMAT, "tokenizer.json: model.merges[%d] \"%.60s\" is not \"a b\"", rank, it->valuestring);
                break;
            }
            a = it->valuestring; la = (size_t)(sp - a); b = sp + 1; lb = strlen(b);
        } else if (cJSON_IsArray(it) && cJSON_GetArraySize(it) == 2 && cJSON_IsString(it->child) &&
                   cJSON_IsString(it->child->next)) {
            a = it->child->valuestring; la = strlen(a); b = it->child->next->valuestring; lb = strlen(b);
        } else {
            rc = td_seterr(err, TD_EFORMAT, "tokenizer.json: model.merges[%d] is neither \"a b\" nor [a, b]", rank);
            break;
        }
        if (la + lb > total) { rc = td_seterr(err, TD_EFORMAT, "tokenizer.json: model.merges[%d] \"%.40s\" names an unknown token", rank, a); break; }
        int ka = td_byte_level_decode(byte_of_cp, a, la, scratch);
        int kb = ka < 0 ? -1 : td_byte_level_decode(byte_of_cp, b, lb, scratch + ka);
        int32_t ia = ka < 0 ? -1 : td_vmap_get(t, scratch, (size_t)ka);
        int32_t ib = kb < 0 ? -1 : td_vmap_get(t, scratch + ka, (size_t)kb);
        int32_t im = (ia < 0 || ib < 0) ? -1 : td_vmap_get(t, scratch, (size_t)(ka + kb));
        if (ia < 0 || ib < 0) {
            rc = td_seterr(err, TD_EFORMAT, "tokenizer.json: model.merges[%d] names unknown token \"%.*s\"", rank,
                           (int)(ia < 0 ? (la > 60 ? 60 : la) : (lb > 60 ? 60 : lb)), ia < 0 ? a : b);
            break;
        }
        if (im < 0) {
            rc = td_seterr(err, TD_EFORMAT, "tokenizer.json: model.merges[%d] makes \"%.*s%.*s\", which is not in model.vocab",
                           rank, (int)(la > 40 ? 40 : la), a, (int)(lb > 40 ? 40 : lb), b);
            break;
        }
        td_mmap_put(t, ia, ib, rank, im);
        rank++;
    }
    free(scratch);
    free(src);
    if (rc) return rc;

    /* added tokens: bucket by first byte, longest first */
    qsort(t->added, (size_t)t->n_added, sizeof *t->added, td_cmp_added);
    for (int c = 0, i = 0; c <= 256; c++) {
        while (i < t->n_added && (unsigned char)t->added[i].content[0] < c) i++;
        t->added_first[c] = i;
    }
    return 0;
}

int td_tokenizer_open_mem(td_tokenizer **out, const char *json, size_t json_len,
                          const char *config_json, size_t config_len, td_err *err) {
    if (!out) return td_seterr(err, TD_EINVAL, "td_tokenizer_open_mem: out is NULL");
    *out = NULL;
    if (!json) return td_seterr(err, TD_EINVAL, "td_tokenizer_open_mem: json is NULL");
    td_tokenizer *t = calloc(1, sizeof *t);
    if (!t) return td_seterr(err, TD_ENOMEM, "tokenizer: out of memory");
    t->eos = t->bos = -1;
    int rc = 0;
    cJSON *root = td_json_parse(json, json_len, "tokenizer.json", err, &rc);
    if (!root) { td_tokenizer_free(t); return rc; }
    rc = td_load(t, root, err);
    cJSON_Delete(root);
    if (!rc && config_json) rc = td_load_config(t, config_json, config_len, err);
    if (rc) { td_tokenizer_free(t); return rc; }
    *out = t;
    return 0;
}

int td_tokenizer_open(td_tokenizer **out, const char *json_path, const char *config_path, td_err *err) {
    if (!out) return td_seterr(err, TD_EINVAL, "td_tokenizer_open: out is NULL");
    *out = NULL;
    if (!json_path) return td_seterr(err, TD_EINVAL, "td_tokenizer_open: json_path is NULL");
    char *j = NULL, *c = NULL;
    size_t jl = 0, cl = 0;
    int rc = td_read_file(json_path, &j, &jl, err);
    if (!rc && config_path) rc = td_read_file(config_path, &c, &cl, err);
    if (!rc) rc = td_tokenizer_open_mem(out, j, jl, c, cl, err);
    if (rc && err && rc != TD_EIO && rc != TD_ENOMEM) {
        /* name the file: replace the message's generic file name with its path */
        char tmp[sizeof err->msg];
        snprintf(tmp, sizeof tmp, "%s", err->msg);
        const char *path = json_path, *rest = tmp;
        if (!strncmp(tmp, "tokenizer_config.json: ", 23)) { path = config_path; rest = tmp + 23; }
        else if (!strncmp(tmp, "tokenizer.json: ", 16)) rest = tmp + 16;
        snprintf(err->msg, sizeof err->msg, "%.200s: %.300s", path, rest);
    }
    free(j); free(c);
    return rc;
}

/* ---- queries -------------------------------------------------------------------- */

int td_tokenizer_n_vocab(const td_tokenizer *t) { return t ? t->n_vocab : 0; }
int32_t td_tokenizer_eos(const td_tokenizer *t) { return t ? t->eos : -1; }
int32_t td_tokenizer_bos(const td_tokenizer *t) { return t ? t->bos : -1; }
td_chat_style td_tokenizer_chat_style(const td_tokenizer *t) { return t ? t->chat : TD_CHAT_NONE; }
int td_tokenizer_is_special(const td_tokenizer *t, int32_t id) {
    return t && id >= 0 && id < t->n_vocab && t->is_special[id];
}

int32_t td_tokenizer_find(const td_tokenizer *t, const char *token) {
    if (!t || !token) return -1;
    size_t n = strlen(token);
    for (int i = 0; i < t->n_added; i++)
        if ((size_t)t->added[i].len == n && !memcmp(t->added[i].content, token, n)) return t->added[i].id;
    /* model vocab is keyed by decoded bytes: convert the byte-level spelling */
    int cp_of_byte[256]; int16_t byte_of_cp[324];
    td_byte_level_tables(cp_of_byte, byte_of_cp);
    char stackbuf[256];
    char *buf = n <= sizeof stackbuf ? stackbuf : malloc(n);
    if (!buf) return -1;
    int k = td_byte_level_decode(byte_of_cp, token, n, buf);
    int32_t id = k < 0 ? -1 : td_vmap_get(t, buf, (size_t)k);
    if (buf != stackbuf) free(buf);
    return id;
}

int td_token_bytes(const td_tokenizer *t, int32_t id, char *buf, int cap) {
    if (!t || id < 0 || id >= t->n_vocab) return TD_ERANGE;
    if (cap < 0 || (!buf && cap > 0)) return TD_EINVAL;
    uint32_t len = t->tok_off[id + 1] - t->tok_off[id];
    if (cap > 0) memcpy(buf, t->bytes + t->tok_off[id], len < (uint32_t)cap ? len : (size_t)cap); /* buf may be NULL */
    return (int)len;
}

int td_detokenize(const td_tokenizer *t, const int32_t *ids, int n, char *buf, size_t cap) {
    if (!t || n < 0 || (n > 0 && !ids) || (!buf && cap > 0)) return TD_EINVAL;
    size_t total = 0;
    for (int i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= t->n_vocab) return TD_ERANGE;
        uint32_t len = t->tok_off[ids[i] + 1] - t->tok_off[ids[i]];
        if (total < cap) memcpy(buf + total, t->bytes + t->tok_off[ids[i]], total + len <= cap ? len : cap - total);
        total += len;
        if (total > INT32_MAX) return TD_ERANGE;
    }
    return (int)total;
}

/* ---- encoding -------------------------------------------------------------------- */

typedef struct td_sym { int32_t id; int prev, next; } td_sym;
typedef struct td_cand { int32_t rank; int pos; int32_t left, right; } td_cand;

/* Per-call scratch, grown geometrically. */
typedef struct td_enc {
    const td_tokenizer *t;
    int flags;
    int32_t *ids; int cap; long n;   /* output (n counts past cap) */
    td_sym *sym; size_t sym_cap;
    td_cand *heap; size_t heap_cap;
    pcre2_match_data *md;
    int err;
} td_enc;

static void td_emit(td_enc *e, int32_t id) {
    if (e->n < e->cap) e->ids[e->n] = id;
    e->n++;
}

static int td_grow(void **p, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap) return 0;
    size_t c = *cap ? *cap : 64;
    while (c < need) c *= 2;
    void *q = realloc(*p, c * elem);
    if (!q) return TD_ENOMEM;
    *p = q; *cap = c;
    return 0;
}

static int td_cand_less(const td_cand *a, const td_cand *b) {
    return a->rank != b->rank ? a->rank < b->rank : a->pos < b->pos;
}
static void td_heap_push(td_enc *e, size_t *n, td_cand c) {
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!td_cand_less(&c, &e->heap[p])) break;
        e->heap[i] = e->heap[p]; i = p;
    }
    e->heap[i] = c;
}
static td_cand td_heap_pop(td_enc *e, size_t *n) {
    td_cand top = e->heap[0], last = e->heap[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        const td_cand *best = &last;
        if (l < *n && td_cand_less(&e->heap[l], best)) { m = l; best = &e->heap[l]; }
        if (r < *n && td_cand_less(&e->heap[r], best)) m = r;
        if (m == i) break;
        e->heap[i] = e->heap[m]; i = m;
    }
    if (*n) e->heap[i] = last;
    return top;
}
static void td_try_cand(td_enc *e, size_t *hn, int pos) {
    const td_sym *s = e->sym;
    int nx = s[pos].next;
    if (nx < 0) return;
    const td_merge_slot *m = td_mmap_get(e->t, s[pos].id, s[nx].id);
    if (!m) return;
    td_cand c = { m->rank, pos, s[pos].id, s[nx].id };
    td_heap_push(e, hn, c);
}

/* BPE-encode one pre-token (raw bytes). */
static void td_bpe(td_enc *e, const unsigned char *p, size_t n) {
    const td_tokenizer *t = e->t;
    if (n == 0) return;
    if (t->ignore_merges || n == 1) {
        int32_t id = td_vmap_get(t, (const char *)p, n);
        if (id >= 0) { td_emit(e, id); return; }
    }
    if (td_grow((void **)&e->sym, &e->sym_cap, n, sizeof *e->sym) ||
        td_grow((void **)&e->heap, &e->heap_cap, n, sizeof *e->heap)) { e->err = TD_ENOMEM; return; }
    td_sym *s = e->sym;
    int m = 0;
    for (size_t i = 0; i < n; i++) {
        int32_t id = t->byte_id[p[i]];
        if (id < 0) continue; /* no unk token: HF drops the character */
        s[m].id = id; s[m].prev = m - 1; s[m].next = m + 1; m++;
    }
    if (m == 0) return;
    s[m - 1].next = -1;
    size_t hn = 0;
    for (int i = 0; i + 1 < m; i++) td_try_cand(e, &hn, i);
    /* each merge pops one candidate and pushes at most two: grow on demand */
    while (hn > 0) {
        td_cand c = td_heap_pop(e, &hn);
        int nx = s[c.pos].next;
        if (s[c.pos].id != c.left || nx < 0 || s[nx].id != c.right) continue; /* stale */
        const td_merge_slot *mg = td_mmap_get(t, c.left, c.right);
        s[c.pos].id = mg->id;
        s[c.pos].next = s[nx].next;
        if (s[nx].next >= 0) s[s[nx].next].prev = c.pos;
        s[nx].id = -1;
        if (td_grow((void **)&e->heap, &e->heap_cap, hn + 2, sizeof *e->heap)) { e->err = TD_ENOMEM; return; }
        if (s[c.pos].prev >= 0) td_try_cand(e, &hn, s[c.pos].prev);
        td_try_cand(e, &hn, c.pos);
    }
    for (int i = 0; i >= 0; i = s[i].next) td_emit(e, s[i].id);
}

/* Pre-tokenizer step k over the valid UTF-8 piece p[0..n): Isolated split. */
static void td_pretok(td_enc *e, int k, const unsigned char *p, size_t n) {
    if (n == 0 || e->err) return;
    if (k == e->t->n_pre) { td_bpe(e, p, n); return; }
    pcre2_code *re = e->t->pre[k];
    size_t at = 0, last = 0;
    while (at <= n) {
        int rc = pcre2_match(re, p, n, at, PCRE2_NO_UTF_CHECK, e->md, NULL); /* validated */
        if (rc == PCRE2_ERROR_JIT_STACKLIMIT)
            rc = pcre2_match(re, p, n, at, PCRE2_NO_JIT | PCRE2_NO_UTF_CHECK, e->md, NULL);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) { e->err = TD_ERANGE; return; }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(e->md);
        size_t s = ov[0], f = ov[1];
        if (f == s) { /* empty match: step one character */
            if (s >= n) break;
            at = s + 1;
            while (at < n && (p[at] & 0xC0) == 0x80) at++;
            continue;
        }
        if (s > last) td_pretok(e, k + 1, p + last, s - last);
        td_pretok(e, k + 1, p + s, f - s);
        last = at = f;
    }
    if (last < n) td_pretok(e, k + 1, p + last, n - last);
}

/* Is the code point at the start of s (valid UTF-8, n bytes) Unicode whitespace? */
static int td_is_space_at(const unsigned char *s, size_t n, int *len) {
    utf8proc_int32_t cp;
    utf8proc_ssize_t k = utf8proc_iterate(s, (utf8proc_ssize_t)n, &cp);
    if (k <= 0) { *len = 1; return 0; }
    *len = (int)k;
    if ((cp >= 9 && cp <= 13) || cp == 0x85) return 1;
    utf8proc_category_t c = utf8proc_category(cp);
    return c == UTF8PROC_CATEGORY_ZS || c == UTF8PROC_CATEGORY_ZL || c == UTF8PROC_CATEGORY_ZP;
}
static int td_is_word_cp(utf8proc_int32_t cp) {
    if (cp == '_') return 1;
    utf8proc_category_t c = utf8proc_category(cp);
    return (c >= UTF8PROC_CATEGORY_LU && c <= UTF8PROC_CATEGORY_LO) ||
           (c >= UTF8PROC_CATEGORY_ND && c <= UTF8PROC_CATEGORY_NO);
}

/* Find the leftmost-longest added token in p[0..n) among those with the given
 * `normalized` flag (and allowed by the flags). Returns its index or -1. */
static int td_find_added(const td_enc *e, const unsigned char *p, size_t n, int normalized, size_t *at) {
    const td_tokenizer *t = e->t;
    int parse_special = e->flags & TD_TOK_PARSE_SPECIAL;
    for (size_t i = 0; i < n; i++) {
        int lo = t->added_first[p[i]], hi = t->added_first[p[i] + 1];
        for (int j = lo; j < hi; j++) {
            const td_added *a = &t->added[j];
            if (a->normalized != normalized || (a->special && !parse_special)) continue;
            if ((size_t)a->len > n - i || memcmp(p + i, a->content, (size_t)a->len)) continue;
            if (a->single_word) {
                utf8proc_int32_t cp;
                if (i > 0) {
                    size_t b = i - 1;
                    while (b > 0 && (p[b] & 0xC0) == 0x80) b--;
                    if (utf8proc_iterate(p + b, (utf8proc_ssize_t)(i - b), &cp) > 0 && td_is_word_cp(cp)) continue;
                }
                size_t f = i + (size_t)a->len;
                if (f < n && utf8proc_iterate(p + f, (utf8proc_ssize_t)(n - f), &cp) > 0 && td_is_word_cp(cp)) continue;
            }
            *at = i;
            return j;
        }
    }
    return -1;
}

/* Split p[0..n) around added tokens of the given kind; `rest` handles the gaps. */
static void td_split_added(td_enc *e, const unsigned char *p, size_t n, int normalized,
                           void (*rest)(td_enc *, const unsigned char *, size_t)) {
    size_t pos = 0;
    while (pos < n && !e->err) {
        size_t at;
        int k = td_find_added(e, p + pos, n - pos, normalized, &at);
        if (k < 0) { rest(e, p + pos, n - pos); return; }
        const td_added *a = &e->t->added[k];
        size_t s = pos + at, f = s + (size_t)a->len;
        if (a->lstrip) { /* eat whitespace before the token */
            while (s > pos) {
                size_t b = s - 1; int l;
                while (b > pos && (p[b] & 0xC0) == 0x80) b--;
                if (!td_is_space_at(p + b, s - b, &l) || b + (size_t)l != s) break;
                s = b;
            }
        }
        if (a->rstrip) {
            int l;
            while (f < n && td_is_space_at(p + f, n - f, &l)) f += (size_t)l;
        }
        rest(e, p + pos, s - pos);
        td_emit(e, a->id);
        pos = f;
    }
}

static void td_pretok_top(td_enc *e, const unsigned char *p, size_t n) { td_pretok(e, 0, p, n); }

/* A valid UTF-8 run: NFC, then split on normalized added tokens, then pre-tokenize. */
static void td_encode_valid(td_enc *e, const unsigned char *p, size_t n) {
    if (n == 0) return;
    int ascii = 1;
    for (size_t i = 0; i < n && ascii; i++) ascii = p[i] < 0x80;
    if (e->t->nfc && !ascii) {
        utf8proc_uint8_t *dst = NULL;
        utf8proc_ssize_t m = utf8proc_map(p, (utf8proc_ssize_t)n, &dst, UTF8PROC_STABLE | UTF8PROC_COMPOSE);
        if (m < 0) { free(dst); e->err = TD_EFORMAT; return; }
        td_split_added(e, dst, (size_t)m, 1, td_pretok_top);
        free(dst);
        return;
    }
    td_split_added(e, p, n, 1, td_pretok_top);
}

/* A segment between raw added tokens: valid runs and invalid-byte runs. */
static void td_encode_segment(td_enc *e, const unsigned char *p, size_t n) {
    size_t i = 0;
    while (i < n && !e->err) {
        size_t s = i;
        int l;
        while (i < n && (l = td_utf8_valid_len(p + i, n - i)) > 0) i += (size_t)l;
        td_encode_valid(e, p + s, i - s);
        s = i;
        while (i < n && td_utf8_valid_len(p + i, n - i) == 0) i++;
        td_bpe(e, p + s, i - s);
    }
}

int td_tokenize(const td_tokenizer *t, const char *text, size_t len, int flags, int32_t *ids, int cap) {
    if (!t || (!text && len > 0) || cap < 0 || (!ids && cap > 0)) return TD_EINVAL;
    td_enc e = { .t = t, .flags = flags, .ids = ids, .cap = cap };
    if (t->n_pre > 0) {
        e.md = pcre2_match_data_create(4, NULL);
        if (!e.md) return TD_ENOMEM;
    }
    if ((flags & TD_TOK_ADD_BOS) && t->bos >= 0) td_emit(&e, t->bos);
    td_split_added(&e, (const unsigned char *)text, len, 0, td_encode_segment);
    free(e.sym); free(e.heap);
    pcre2_match_data_free(e.md);
    if (e.err) return e.err;
    if (e.n > INT32_MAX) return TD_ERANGE;
    return (int)e.n;
}

/* ---- streaming UTF-8 ------------------------------------------------------------ */

/* Walk hold ++ tok: write releasable text to out (when write), return its length,
 * and set *tail_at to where the incomplete tail starts. */
static int td_stream_walk(const unsigned char *in, int n, unsigned char *out, int write, int *tail_at) {
    int i = 0, o = 0;
    while (i < n) {
        unsigned c = in[i];
        if (c < 0x80) { if (write) out[o] = (unsigned char)c; o++; i++; continue; }
        int need = (c >= 0xC2 && c <= 0xDF) ? 2 : (c >= 0xE0 && c <= 0xEF) ? 3 : (c >= 0xF0 && c <= 0xF4) ? 4 : 0;
        if (!need) { if (write) memcpy(out + o, "\xEF\xBF\xBD", 3); o += 3; i++; continue; }
        unsigned lo = 0x80, hi = 0xBF;
        if (c == 0xE0) lo = 0xA0; else if (c == 0xED) hi = 0x9F; else if (c == 0xF0) lo = 0x90; else if (c == 0xF4) hi = 0x8F;
        int k = 1, bad = 0;
        for (; k < need && i + k < n; k++) {
            unsigned b = in[i + k];
            if (k == 1 ? (b < lo || b > hi) : (b & 0xC0) != 0x80) { bad = 1; break; }
        }
        if (bad) { if (write) memcpy(out + o, "\xEF\xBF\xBD", 3); o += 3; i += k; continue; }
        if (k < need) break; /* incomplete tail */
        if (write) memcpy(out + o, in + i, (size_t)need);
        o += need; i += need;
    }
    *tail_at = i;
    return o;
}

int td_utf8_stream_push(td_utf8_stream *st, const td_tokenizer *t, int32_t id, char *out, int cap) {
    if (!st || !t || cap < 0 || (!out && cap > 0) || st->n_hold < 0 || st->n_hold > 3) return TD_EINVAL;
    if (id < 0 || id >= t->n_vocab) return TD_ERANGE;
    uint32_t len = t->tok_off[id + 1] - t->tok_off[id];
    unsigned char stackbuf[256];
    size_t n = (size_t)st->n_hold + len;
    unsigned char *in = n <= sizeof stackbuf ? stackbuf : malloc(n);
    if (!in) return TD_ENOMEM;
    memcpy(in, st->hold, (size_t)st->n_hold);
    memcpy(in + st->n_hold, t->bytes + t->tok_off[id], len);
    int tail, need = td_stream_walk(in, (int)n, NULL, 0, &tail);
    int rc = need;
    if (need > cap) rc = TD_ERANGE;
    else {
        td_stream_walk(in, (int)n, (unsigned char *)out, 1, &tail);
        st->n_hold = (int)n - tail;
        memcpy(st->hold, in + tail, (size_t)st->n_hold);
    }
    if (in != stackbuf) free(in);
    return rc;
}

int td_utf8_stream_flush(td_utf8_stream *st, char *out, int cap) {
    if (!st || cap < 0 || (!out && cap > 0) || st->n_hold < 0 || st->n_hold > 3) return TD_EINVAL;
    if (st->n_hold == 0) return 0;
    if (cap < 3) return TD_ERANGE;
    memcpy(out, "\xEF\xBF\xBD", 3);
    st->n_hold = 0;
    return 3;
}
