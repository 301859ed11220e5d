/* tok_encode — helper for tests/tok_conformance.sh: encode strings with tandem's
 * tokenizer and print one line of space-separated ids per input string.
 *
 *   tok_encode TOKENIZER_JSON STRINGS [EXPECTED_DECODES] [--plain]
 *
 * STRINGS holds one JSON string literal per line (so any text survives). Escapes
 * are decoded here, not by cJSON, so a lone surrogate escape (\ud800) becomes its
 * 3-byte WTF-8 form — invalid UTF-8 the tokenizer must still round-trip.
 * Every string is checked for decode(encode(s)) == s; when EXPECTED_DECODES is
 * given (same format), the decode is compared with its line instead (for inputs
 * the NFC normalizer changes). Mismatches go to stderr; exit status 1 if any.
 * Special tokens are parsed (TD_TOK_PARSE_SPECIAL) unless --plain is given.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tandem.h"

static int hexval(int c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}
static int put_cp(unsigned char *o, unsigned cp) {
    if (cp < 0x80) { o[0] = (unsigned char)cp; return 1; }
    if (cp < 0x800) { o[0] = (unsigned char)(0xC0 | cp >> 6); o[1] = (unsigned char)(0x80 | (cp & 63)); return 2; }
    if (cp < 0x10000) {
        o[0] = (unsigned char)(0xE0 | cp >> 12); o[1] = (unsigned char)(0x80 | ((cp >> 6) & 63));
        o[2] = (unsigned char)(0x80 | (cp & 63)); return 3;
    }
    o[0] = (unsigned char)(0xF0 | cp >> 18); o[1] = (unsigned char)(0x80 | ((cp >> 12) & 63));
    o[2] = (unsigned char)(0x80 | ((cp >> 6) & 63)); o[3] = (unsigned char)(0x80 | (cp & 63)); return 4;
}
static int hex4(const char *p, unsigned *v) {
    *v = 0;
    for (int i = 0; i < 4; i++) { int h = hexval(p[i]); if (h < 0) return -1; *v = *v * 16 + (unsigned)h; }
    return 0;
}
/* Decode the JSON string literal in line (in place). Returns its length or -1. */
static long json_unquote(char *line) {
    char *p = line;
    while (*p == ' ' || *p == '\t') p++;
    if (*p++ != '"') return -1;
    unsigned char *o = (unsigned char *)line;
    long n = 0;
    for (;;) {
        char c = *p++;
        if (c == 0) return -1;
        if (c == '"') break;
        if (c != '\\') { o[n++] = (unsigned char)c; continue; }
        c = *p++;
        switch (c) {
        case '"': o[n++] = '"'; break;
        case '\\': o[n++] = '\\'; break;
        case '/': o[n++] = '/'; break;
        case 'b': o[n++] = '\b'; break;
        case 'f': o[n++] = '\f'; break;
        case 'n': o[n++] = '\n'; break;
        case 'r': o[n++] = '\r'; break;
        case 't': o[n++] = '\t'; break;
        case 'u': {
            unsigned v, w;
            if (hex4(p, &v)) return -1;
            p += 4;
            if (v >= 0xD800 && v < 0xDC00 && p[0] == '\\' && p[1] == 'u' && !hex4(p + 2, &w) && w >= 0xDC00 && w < 0xE000) {
                v = 0x10000 + ((v - 0xD800) << 10) + (w - 0xDC00);
                p += 6;
            }
            n += put_cp(o + n, v); /* a lone surrogate becomes WTF-8 */
            break;
        }
        default: return -1;
        }
    }
    return n;
}

static char *read_line(FILE *f, size_t *cap, char **buf) {
    size_t n = 0;
    int c;
    while ((c = fgetc(f)) != EOF && c != '\n') {
        if (n + 8 >= *cap) {
            *cap = *cap ? *cap * 2 : 4096;
            char *q = realloc(*buf, *cap);
            if (!q) return NULL;
            *buf = q;
        }
        (*buf)[n++] = (char)c;
    }
    if (c == EOF && n == 0) return NULL;
    if (!*buf) { *cap = 16; *buf = malloc(*cap); if (!*buf) return NULL; }
    (*buf)[n] = 0;
    return *buf;
}

int main(int argc, char **argv) {
    const char *paths[3] = { 0 };
    int np = 0, flags = TD_TOK_PARSE_SPECIAL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--plain")) flags = 0;
        else if (np < 3) paths[np++] = argv[i];
    }
    if (np < 2) {
        fprintf(stderr, "usage: tok_encode TOKENIZER_JSON STRINGS [EXPECTED_DECODES] [--plain]\n");
        return 2;
    }
    td_err err = { 0 };
    td_tokenizer *tok;
    if (td_tokenizer_open(&tok, paths[0], NULL, &err)) {
        fprintf(stderr, "tok_encode: %s\n", err.msg);
        return 2;
    }
    FILE *in = fopen(paths[1], "rb"), *exp = paths[2] ? fopen(paths[2], "rb") : NULL;
    if (!in || (paths[2] && !exp)) { fprintf(stderr, "tok_encode: cannot open input\n"); return 2; }
    char *line = NULL, *eline = NULL, *dec = NULL;
    size_t lcap = 0, ecap = 0, dcap = 0;
    int32_t *ids = NULL;
    int icap = 0, bad = 0;
    long lineno = 0;
    while (read_line(in, &lcap, &line)) {
        lineno++;
        long n = json_unquote(line);
        if (n < 0) { fprintf(stderr, "tok_encode: line %ld: not a JSON string\n", lineno); return 2; }
        int k = td_tokenize(tok, line, (size_t)n, flags, ids, icap);
        if (k > icap) {
            icap = k * 2;
            ids = realloc(ids, (size_t)icap * sizeof *ids);
            if (!ids) return 2;
            k = td_tokenize(tok, line, (size_t)n, flags, ids, icap);
        }
        if (k < 0) { fprintf(stderr, "tok_encode: line %ld: %s\n", lineno, td_strerror(k)); return 2; }
        for (int i = 0; i < k; i++) printf(i ? " %d" : "%d", ids[i]);
        printf("\n");
        int d = td_detokenize(tok, ids, k, dec, dcap);
        if (d > (int)dcap) {
            dcap = (size_t)d * 2;
            dec = realloc(dec, dcap);
            if (!dec) return 2;
            d = td_detokenize(tok, ids, k, dec, dcap);
        }
        const char *want = line;
        long wn = n;
        if (exp) {
            if (!read_line(exp, &ecap, &eline) || (wn = json_unquote(eline)) < 0) {
                fprintf(stderr, "tok_encode: expected-decodes line %ld missing\n", lineno);
                return 2;
            }
            want = eline;
        }
        if (d != wn || memcmp(dec, want, (size_t)wn) != 0) {
            if (bad < 5) fprintf(stderr, "tok_encode: line %ld: decode(encode(s)) != expected (%d vs %ld bytes)\n", lineno, d, wn);
            bad++;
        }
    }
    if (bad) fprintf(stderr, "tok_encode: %d round-trip mismatches\n", bad);
    free(line); free(eline); free(dec); free(ids);
    fclose(in);
    if (exp) fclose(exp);
    td_tokenizer_free(tok);
    return bad ? 1 : 0;
}
