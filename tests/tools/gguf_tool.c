/* gguf_tool — helper for tests/gguf.sh and tests/gguf_llamacpp.sh.
 *
 *   gguf_tool dump FILE.gguf            one JSON object: version, alignment,
 *       data_offset, metadata {key: {"type", "value"}} (arrays as lists; 64-bit
 *       integers and floats, "%.17g", as strings), tensors [{name, n_dims, shape, type, offset}]
 *       in file order; compared with @huggingface/gguf by tests/gguf_oracle.mjs.
 *   gguf_tool greedy MODEL N PROMPTS    per line of PROMPTS (a JSON string):
 *       the prompt's ids and N greedy tokens (eos ignored), one JSON object
 *       {"prompt", "prompt_ids", "gen_ids"} per line; for the llama.cpp check. */
#include "io/gguf.h"
#include "tandem.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static cJSON *num_u64(uint64_t v) {
    char b[32];
    snprintf(b, sizeof b, "%llu", (unsigned long long)v);
    return cJSON_CreateString(b);
}

static cJSON *str_n(const td_gguf_str *s) {
    char *c = malloc(s->len + 1);
    memcpy(c, s->s, s->len);
    c[s->len] = 0;
    cJSON *j = cJSON_CreateString(c);
    free(c);
    return j;
}

static cJSON *scalar(int type, const void *p, const td_gguf_kv *kv) {
    /* p: an array element in the mapping, or NULL for kv's own scalar */
    uint64_t u = 0;
    int64_t i = 0;
    double f = 0;
    if (p) {
        const unsigned char *b = p;
        int n = type == TD_GGUF_U8 || type == TD_GGUF_I8 || type == TD_GGUF_BOOL ? 1
                : type == TD_GGUF_U16 || type == TD_GGUF_I16                     ? 2
                : type == TD_GGUF_U32 || type == TD_GGUF_I32 || type == TD_GGUF_F32 ? 4 : 8;
        for (int k = n - 1; k >= 0; k--) u = (u << 8) | b[k];
        i = n == 1 ? (int8_t)u : n == 2 ? (int16_t)u : n == 4 ? (int32_t)u : (int64_t)u;
        if (type == TD_GGUF_F32) { union { uint32_t u; float f; } x = {.u = (uint32_t)u}; f = x.f; }
        if (type == TD_GGUF_F64) { union { uint64_t u; double f; } x = {.u = u}; f = x.f; }
    } else {
        u = kv->v.u;
        i = kv->v.i;
        f = kv->v.f;
    }
    switch (type) {
    case TD_GGUF_F32: case TD_GGUF_F64: { char b[40]; snprintf(b, sizeof b, "%.17g", f); return cJSON_CreateString(b); }
    case TD_GGUF_BOOL: return cJSON_CreateBool(u != 0);
    case TD_GGUF_U64: return num_u64(u);
    case TD_GGUF_I64: { char b[32]; snprintf(b, sizeof b, "%lld", (long long)i); return cJSON_CreateString(b); }
    case TD_GGUF_I8: case TD_GGUF_I16: case TD_GGUF_I32: return cJSON_CreateNumber((double)i);
    default: return cJSON_CreateNumber((double)u);
    }
}

static int dump(const char *path) {
    td_gguf_file *f = NULL;
    td_err err = {0};
    if (td_gguf_open(&f, path, &err)) { fprintf(stderr, "%s\n", err.msg); return 1; }
    cJSON *root = cJSON_CreateObject(), *md = cJSON_AddObjectToObject(root, "metadata");
    cJSON_AddNumberToObject(root, "version", f->version);
    cJSON_AddNumberToObject(root, "alignment", f->alignment);
    cJSON_AddItemToObject(root, "data_offset", num_u64(f->data_offset));
    for (int k = 0; k < f->n_kvs; k++) {
        const td_gguf_kv *kv = &f->kvs[k];
        cJSON *e = cJSON_AddObjectToObject(md, kv->key);
        cJSON_AddNumberToObject(e, "type", kv->type);
        cJSON *v;
        if (kv->type == TD_GGUF_STRING) v = str_n(&kv->str);
        else if (kv->type != TD_GGUF_ARRAY) v = scalar(kv->type, NULL, kv);
        else {
            v = cJSON_CreateArray();
            cJSON_AddNumberToObject(e, "arr_type", kv->arr_type);
            static const int size[] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
            for (uint64_t i = 0; i < kv->n; i++)
                cJSON_AddItemToArray(v, kv->arr_type == TD_GGUF_STRING ? str_n(&kv->strs[i])
                                                                      : scalar(kv->arr_type, (const unsigned char *)kv->arr + i * (uint64_t)size[kv->arr_type], kv));
        }
        cJSON_AddItemToObject(e, "value", v);
    }
    cJSON *ts = cJSON_AddArrayToObject(root, "tensors");
    for (int k = 0; k < f->n_tensors; k++) {
        const td_gguf_tensor *t = &f->tensors[k];
        cJSON *e = cJSON_CreateObject(), *sh = cJSON_CreateArray();
        cJSON_AddStringToObject(e, "name", t->name);
        cJSON_AddNumberToObject(e, "n_dims", t->n_dims);
        for (int d = 0; d < t->n_dims; d++) cJSON_AddItemToArray(sh, num_u64((uint64_t)t->ne[d]));
        cJSON_AddItemToObject(e, "shape", sh);
        cJSON_AddNumberToObject(e, "type", t->type->id);
        cJSON_AddItemToObject(e, "offset", num_u64(t->offset));
        cJSON_AddItemToArray(ts, e);
    }
    char *s = cJSON_PrintUnformatted(root);
    puts(s);
    free(s);
    cJSON_Delete(root);
    td_gguf_free(f);
    return 0;
}

static int greedy(const char *model, int n, const char *prompts) {
    td_err err = {0};
    td_model *m = NULL;
    td_ctx *c = NULL;
    FILE *fp = fopen(prompts, "r");
    if (!fp) { perror(prompts); return 1; }
    if (td_model_open(&m, model, &err)) { fprintf(stderr, "%s\n", err.msg); fclose(fp); return 1; }
    td_ctx_params p = td_ctx_default_params();
    p.max_rows = 1;
    p.max_ctx = 1024;
    p.max_tokens = 1024;
    p.n_threads = 2;
    if (td_ctx_open(&c, m, &p, &err)) { fprintf(stderr, "%s\n", err.msg); td_model_free(m); fclose(fp); return 1; }
    char line[65536];
    int rc = 0;
    while (!rc && fgets(line, sizeof line, fp)) {
        cJSON *j = cJSON_Parse(line);
        if (!cJSON_IsString(j)) { cJSON_Delete(j); continue; }
        int32_t ids[1024], out[1024];
        int np = td_tokenize(td_model_tokenizer(m), j->valuestring, strlen(j->valuestring), 0, ids, 1024);
        td_gen_params gp = {.sampling = td_sampling_default(), .max_tokens = n, .ignore_eos = 1};
        td_gen_stats st = {0};
        int ng = -1;
        if (np > 0 && np < 900 && n < 100 && td_generate(c, m, ids, np, &gp, NULL, NULL, out, 1024, &st, &err) == 0) ng = st.n_gen;
        if (ng < 0) { fprintf(stderr, "%s\n", err.msg[0] ? err.msg : "bad prompt"); rc = 1; }
        cJSON *o = cJSON_CreateObject(), *a = cJSON_CreateArray(), *b = cJSON_CreateArray();
        cJSON_AddItemToObject(o, "prompt", cJSON_CreateString(j->valuestring));
        for (int i = 0; i < np; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber(ids[i]));
        for (int i = 0; i < ng; i++) cJSON_AddItemToArray(b, cJSON_CreateNumber(out[i]));
        cJSON_AddItemToObject(o, "prompt_ids", a);
        cJSON_AddItemToObject(o, "gen_ids", b);
        char *s = cJSON_PrintUnformatted(o);
        puts(s);
        free(s);
        cJSON_Delete(o);
        cJSON_Delete(j);
    }
    fclose(fp);
    td_ctx_free(c);
    td_model_free(m);
    return rc;
}

int main(int argc, char **argv) {
    if (argc == 3 && !strcmp(argv[1], "dump")) return dump(argv[2]);
    if (argc == 5 && !strcmp(argv[1], "greedy")) return greedy(argv[2], atoi(argv[3]), argv[4]);
    fprintf(stderr, "usage: gguf_tool dump FILE.gguf | gguf_tool greedy MODEL N PROMPTS.jsonl\n");
    return 2;
}
