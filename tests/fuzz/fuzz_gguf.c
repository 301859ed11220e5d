/* fuzz_gguf — libFuzzer harness for the GGUF reader (src/io/gguf.c) and the
 * GGUF model loader (src/model/model_gguf.c, src/tok/tok_gguf.c).
 *
 * Design: the input is written to one memfd, reused across runs, and opened by
 * its /proc/self/fd path, so the real open/fstat/mmap path of td_gguf_open is
 * taken. When it opens, every metadata key is read through the typed getters
 * and every array element touched, every tensor's bytes summed (reads the
 * whole claimed range, so a bad bound shows as an ASan error), and the lookups
 * run. Then the same path goes to td_model_open_params (a regular file path is
 * opened as GGUF): config from the metadata, weights bound, tokenizer from
 * tokenizer.ggml.*. A failure must come with a negative code and a message. */
#define _GNU_SOURCE
#include "io/gguf.h"
#include "tandem.h"
#include "memfile.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>


static volatile uint64_t sink;

static void walk(const td_gguf_file *f) {
    td_err err = {0};
    uint64_t acc = 0;
    for (int i = 0; i < f->n_kvs; i++) {
        const td_gguf_kv *kv = &f->kvs[i];
        uint32_t u; double d; int b; td_gguf_str s;
        td_gguf_get_u32(f, kv->key, &u, &err);
        td_gguf_get_f64(f, kv->key, &d, &err);
        td_gguf_get_bool(f, kv->key, &b, &err);
        if (td_gguf_get_str(f, kv->key, &s, &err) == 1 && s.len) acc += (unsigned char)s.s[s.len - 1];
        if (td_gguf_find_kv(f, kv->key) != kv) abort();
        if (kv->type == TD_GGUF_ARRAY) {
            if (kv->arr_type == TD_GGUF_STRING) {
                for (uint64_t j = 0; j < kv->n; j++)
                    if (kv->strs[j].len) acc += (unsigned char)kv->strs[j].s[kv->strs[j].len - 1];
            } else if (kv->arr_type != TD_GGUF_F32 && kv->arr_type != TD_GGUF_F64 && kv->arr_type != TD_GGUF_BOOL) {
                for (uint64_t j = 0; j < kv->n; j++) acc += (uint64_t)td_gguf_arr_int(kv, j);
            }
        }
    }
    for (int i = 0; i < f->n_tensors; i++) {
        const td_gguf_tensor *t = &f->tensors[i];
        if (td_gguf_find_tensor(f, t->name) != t) abort();
        const unsigned char *p = t->data;
        for (size_t j = 0; j < t->nbytes; j += 61) acc += p[j];
        if (t->nbytes) acc += p[t->nbytes - 1];
        td_gguf_row_bytes(t->type, t->ne[0]);
    }
    sink = acc;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = fuzz_memfile("fuzz.gguf", data, size);

    td_err err = {0};
    td_gguf_file *f = NULL;
    int rc = td_gguf_open(&f, path, &err);
    if (rc) {
        if (f || rc > 0 || !err.msg[0]) abort();
        return 0; /* the model loader would fail the same way */
    }
    walk(f);
    td_gguf_free(f);

    td_model *m = NULL;
    td_model_params mp = td_model_default_params();
    mp.use_mmap = (size & 1) ? 1 : 0; /* both binding paths */
    memset(&err, 0, sizeof err);
    rc = td_model_open_params(&m, path, &mp, &err);
    if (rc) {
        if (m || rc > 0 || !err.msg[0]) abort();
        return 0;
    }
    td_model_info info;
    td_model_get_info(m, &info);
    const td_tokenizer *tok = td_model_tokenizer(m);
    if (tok) {
        int32_t ids[64];
        int n = td_tokenize(tok, "hello world <|im_end|>", 22, TD_TOK_PARSE_SPECIAL, ids, 64);
        if (n > 0) {
            char buf[256];
            td_detokenize(tok, ids, n < 64 ? n : 64, buf, sizeof buf);
        }
    }
    FILE *devnull = fopen("/dev/null", "w");
    if (devnull) { td_model_describe(m, devnull); fclose(devnull); }
    td_model_free(m);
    return 0;
}
