/* test_model — the model loader (model/model.c, model/config.c, io/safetensors.c).
 *
 * Design: every case writes a tiny synthetic Hugging Face model directory into a
 * temp dir from C (config.json + safetensors built byte by byte: a Qwen3 config
 * with vocab 32, hidden 8, 1 layer, 2 heads, 1 kv head, head_dim 4, ffn 16 and
 * deterministic weights), opens it with td_model_open, and checks either the
 * loaded views (info fields, tensor data pointers, values) or, for corrupted
 * inputs, the error code and that the message names the culprit. Real fixtures
 * under tests/fixtures/{qwen3,llama}-rand are loaded when present. */
#define _POSIX_C_SOURCE 200809L
#include "t.h"
#include "io/gguf.h"
#include "io/safetensors.h"
#include "model/model.h"
#include "tandem.h"
#include "util/util.h"

#include <dirent.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- synthetic files ---------------------------------------------------- */

typedef struct tt {
    char name[96];
    char dtype[8];   /* "F32", "BF16", "F16", "I8" */
    int nd;
    int64_t shape[4];
    int bad_end;     /* added to the end offset in the header */
    int shard;       /* 0 or 1 when written sharded */
} tt;

typedef struct tmodel {
    tt t[64];
    int n;
} tmodel;

static char g_root[256];

static size_t dt_size(const char *d) {
    if (!strcmp(d, "F32")) return 4;
    if (!strcmp(d, "I8")) return 1;
    return 2;
}

static size_t tt_count(const tt *t) {
    size_t n = 1;
    for (int i = 0; i < t->nd; i++) n *= (size_t)t->shape[i];
    return n;
}

/* Deterministic value j of tensor i, exact in bf16 and f16. */
static float tval(const char *name, size_t j) {
    unsigned h = 5381;
    for (const char *p = name; *p; p++) h = h * 33 + (unsigned char)*p;
    return (float)((int)((h + j * 7) % 64) - 32) * 0.25f;
}

static uint16_t f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)(u >> 16); /* values are exact */
}

static uint16_t f32_to_f16(float f) { /* exact small values only */
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t sign = (u >> 16) & 0x8000;
    if ((u & 0x7fffffff) == 0) return (uint16_t)sign;
    int e = (int)((u >> 23) & 0xff) - 127 + 15;
    uint32_t man = (u >> 13) & 0x3ff;
    return (uint16_t)(sign | ((uint32_t)e << 10) | man);
}

static float read_val(const td_tensor *t, size_t j) {
    if (t->dtype == TD_DTYPE_F32) return ((const float *)t->data)[j];
    uint16_t h = ((const uint16_t *)t->data)[j];
    return t->dtype == TD_DTYPE_BF16 ? td_bf16_to_f32(h) : td_f16_to_f32(h);
}

/* Write the tensors with shard == which (or all when which < 0) to path.
 * header_override replaces the JSON header text when non-NULL. */
static void write_st(const char *path, const tmodel *tm, int which, const char *header_override) {
    char *hdr = malloc(65536);
    size_t hl = 0, off = 0;
    hl += (size_t)sprintf(hdr + hl, "{\"__metadata__\":{\"format\":\"pt\"}");
    for (int i = 0; i < tm->n; i++) {
        const tt *t = &tm->t[i];
        if (which >= 0 && t->shard != which) continue;
        size_t nb = tt_count(t) * dt_size(t->dtype);
        hl += (size_t)sprintf(hdr + hl, ",\"%s\":{\"dtype\":\"%s\",\"shape\":[", t->name, t->dtype);
        for (int d = 0; d < t->nd; d++) hl += (size_t)sprintf(hdr + hl, "%s%lld", d ? "," : "", (long long)t->shape[d]);
        hl += (size_t)sprintf(hdr + hl, "],\"data_offsets\":[%zu,%lld]}", off, (long long)(off + nb) + t->bad_end);
        off += nb;
    }
    hl += (size_t)sprintf(hdr + hl, "}");
    if (header_override) hl = (size_t)sprintf(hdr, "%s", header_override);
    while (hl % 8) hdr[hl++] = ' ';
    FILE *f = fopen(path, "wb");
    unsigned char len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (unsigned char)((uint64_t)hl >> (8 * i));
    fwrite(len8, 1, 8, f);
    fwrite(hdr, 1, hl, f);
    for (int i = 0; i < tm->n; i++) {
        const tt *t = &tm->t[i];
        if (which >= 0 && t->shard != which) continue;
        size_t n = tt_count(t);
        for (size_t j = 0; j < n; j++) {
            float v = tval(t->name, j);
            if (!strcmp(t->dtype, "F32")) fwrite(&v, 4, 1, f);
            else if (!strcmp(t->dtype, "BF16")) { uint16_t h = f32_to_bf16(v); fwrite(&h, 2, 1, f); }
            else if (!strcmp(t->dtype, "F16")) { uint16_t h = f32_to_f16(v); fwrite(&h, 2, 1, f); }
            else { int8_t b = (int8_t)v; fwrite(&b, 1, 1, f); }
        }
    }
    fclose(f);
    free(hdr);
}

static void add(tmodel *tm, const char *name, const char *dt, int nd, int64_t d0, int64_t d1) {
    tt *t = &tm->t[tm->n++];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    snprintf(t->dtype, sizeof t->dtype, "%s", dt);
    t->nd = nd;
    t->shape[0] = d0;
    t->shape[1] = d1;
}

static tt *find_tt(tmodel *tm, const char *name) {
    for (int i = 0; i < tm->n; i++)
        if (!strcmp(tm->t[i].name, name)) return &tm->t[i];
    return NULL;
}

static void remove_tt(tmodel *tm, const char *name) {
    for (int i = 0; i < tm->n; i++)
        if (!strcmp(tm->t[i].name, name)) {
            memmove(&tm->t[i], &tm->t[i + 1], (size_t)(tm->n - i - 1) * sizeof tm->t[0]);
            tm->n--;
            return;
        }
}

/* The tiny Qwen3: vocab 32, hidden 8, 1 layer, 2 heads x 4, 1 kv head, ffn 16, untied. */
static void tiny_tensors(tmodel *tm, const char *dt) {
    tm->n = 0;
    add(tm, "model.embed_tokens.weight", dt, 2, 32, 8);
    add(tm, "model.norm.weight", dt, 1, 8, 0);
    add(tm, "lm_head.weight", dt, 2, 32, 8);
    add(tm, "model.layers.0.input_layernorm.weight", dt, 1, 8, 0);
    add(tm, "model.layers.0.self_attn.q_proj.weight", dt, 2, 8, 8);
    add(tm, "model.layers.0.self_attn.k_proj.weight", dt, 2, 4, 8);
    add(tm, "model.layers.0.self_attn.v_proj.weight", dt, 2, 4, 8);
    add(tm, "model.layers.0.self_attn.o_proj.weight", dt, 2, 8, 8);
    add(tm, "model.layers.0.self_attn.q_norm.weight", dt, 1, 4, 0);
    add(tm, "model.layers.0.self_attn.k_norm.weight", dt, 1, 4, 0);
    add(tm, "model.layers.0.post_attention_layernorm.weight", dt, 1, 8, 0);
    add(tm, "model.layers.0.mlp.gate_proj.weight", dt, 2, 16, 8);
    add(tm, "model.layers.0.mlp.up_proj.weight", dt, 2, 16, 8);
    add(tm, "model.layers.0.mlp.down_proj.weight", dt, 2, 8, 16);
    for (int i = 0; i < tm->n; i++) tm->t[i].shard = i % 2;
}

static const char *TINY_CFG =
    "{\"architectures\":[\"Qwen3ForCausalLM\"],\"model_type\":\"qwen3\",\"vocab_size\":32,"
    "\"hidden_size\":8,\"num_hidden_layers\":1,\"num_attention_heads\":2,\"num_key_value_heads\":1,"
    "\"head_dim\":4,\"intermediate_size\":16,\"max_position_embeddings\":128,\"rms_norm_eps\":1e-6,"
    "\"tie_word_embeddings\":false,\"attention_bias\":false,\"rope_theta\":1000000,"
    "\"hidden_act\":\"silu\",\"eos_token_id\":2,\"bos_token_id\":1,\"rope_scaling\":null}";

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "wb");
    if (!f) return;
    fputs(text, f);
    fclose(f);
}

/* A fresh case directory under the temp root. */
static const char *case_dir(const char *name, char *buf) {
    if (snprintf(buf, 512, "%s/%s", g_root, name) >= 512) buf[0] = 0;
    mkdir(buf, 0755);
    return buf;
}

static void file_in(char *out, const char *dir, const char *name) {
    if (snprintf(out, 512, "%s/%s", dir, name) >= 512) out[0] = 0;
}

/* Write a complete single-file model dir; cfg NULL = TINY_CFG. */
static const char *write_model(const char *name, const char *cfg, const tmodel *tm, char *dirbuf) {
    const char *d = case_dir(name, dirbuf);
    char p[512];
    file_in(p, d, "config.json");
    write_text(p, cfg ? cfg : TINY_CFG);
    file_in(p, d, "model.safetensors");
    write_st(p, tm, -1, NULL);
    return d;
}

static long file_size(const char *p) {
    struct stat sb;
    return stat(p, &sb) == 0 ? (long)sb.st_size : -1;
}

static void rm_tree(const char *path) {
    DIR *d = opendir(path);
    if (d) {
        struct dirent *e;
        while ((e = readdir(d))) {
            if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
            char p[1024];
            snprintf(p, sizeof p, "%s/%s", path, e->d_name);
            rm_tree(p);
        }
        closedir(d);
        rmdir(path);
    } else {
        unlink(path);
    }
}

/* Open expecting failure with code; the message must contain every needle. */
/* The open fails with code and a message naming n1 and n2 — mapped (the
 * default for small models) and with the weights copied (use_mmap = 0): every
 * check happens before any copy. */
static void expect_fail(const char *dir, int code, const char *n1, const char *n2) {
    for (int mode = 0; mode < 2; mode++) {
        td_err err = {0};
        td_model *m = (td_model *)1;
        td_model_params mp = td_model_default_params();
        mp.use_mmap = mode == 0 ? -1 : 0;
        int rc = mode == 0 ? td_model_open(&m, dir, &err) : td_model_open_params(&m, dir, &mp, &err);
        const char *mn = mode == 0 ? "mapped" : "copied";
        T_CHECK(rc == code, "%s: rc %d (%s), want %d; msg: %s", mn, rc, td_strerror(rc), code, err.msg);
        T_CHECK(m == NULL, "%s: out not NULL on failure", mn);
        T_CHECK(err.code == rc, "%s: err.code %d", mn, err.code);
        if (n1) T_CHECK(strstr(err.msg, n1), "%s: message lacks \"%s\": %s", mn, n1, err.msg);
        if (n2) T_CHECK(strstr(err.msg, n2), "%s: message lacks \"%s\": %s", mn, n2, err.msg);
        if (m && m != (td_model *)1) td_model_free(m);
    }
}

/* Every bound tensor's values match what was written. */
static int check_values(const td_model *m, tmodel *tm) {
    int bad = 0;
    const td_layer_w *l = &m->w.layers[0];
    struct { const td_tensor *t; const char *name; } c[] = {
        {&m->w.tok_embd, "model.embed_tokens.weight"},
        {&m->w.out_norm, "model.norm.weight"},
        {&m->w.lm_head, m->cfg.tied ? "model.embed_tokens.weight" : "lm_head.weight"},
        {&l->attn_norm, "model.layers.0.input_layernorm.weight"},
        {&l->wq, "model.layers.0.self_attn.q_proj.weight"},
        {&l->wk, "model.layers.0.self_attn.k_proj.weight"},
        {&l->wv, "model.layers.0.self_attn.v_proj.weight"},
        {&l->wo, "model.layers.0.self_attn.o_proj.weight"},
        {&l->q_norm, "model.layers.0.self_attn.q_norm.weight"},
        {&l->k_norm, "model.layers.0.self_attn.k_norm.weight"},
        {&l->ffn_norm, "model.layers.0.post_attention_layernorm.weight"},
        {&l->w_gate, "model.layers.0.mlp.gate_proj.weight"},
        {&l->w_up, "model.layers.0.mlp.up_proj.weight"},
        {&l->w_down, "model.layers.0.mlp.down_proj.weight"},
    };
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
        const td_tensor *t = c[i].t;
        tt *w = find_tt(tm, c[i].name);
        if (!t->data || !w) { printf("  %s: no data\n", c[i].name); bad++; continue; }
        if (t->n_dims != w->nd || t->shape[0] != w->shape[0] || (w->nd == 2 && t->shape[1] != w->shape[1])) {
            printf("  %s: shape differs\n", c[i].name);
            bad++;
        }
        size_t n = tt_count(w);
        for (size_t j = 0; j < n; j++) {
            if (read_val(t, j) != tval(w->name, j)) {
                printf("  %s[%zu] = %g, want %g\n", w->name, j, read_val(t, j), tval(w->name, j));
                bad++;
                break;
            }
        }
    }
    return bad;
}

/* ---- cases -------------------------------------------------------------- */

static void test_good(void) {
    t_begin("model: tiny qwen3 f32 loads; info and tensor views right");
    tmodel tm;
    tiny_tensors(&tm, "F32");
    add(&tm, "model.rotary_emb.inv_freq", "F32", 1, 2, 0); /* extra, ignored */
    char d[512];
    write_model("good", NULL, &tm, d);
    td_err err = {0};
    td_model *m = NULL;
    int rc = td_model_open(&m, d, &err);
    T_REQUIRE(rc == 0 && m, "open failed: %d %s", rc, err.msg);
    td_model_info in;
    td_model_get_info(m, &in);
    T_CHECK(in.arch == TD_ARCH_QWEN3, "arch %d", in.arch);
    T_CHECK(!strcmp(in.arch_name, "Qwen3ForCausalLM"), "arch_name %s", in.arch_name);
    T_CHECK(in.n_vocab == 32 && in.n_embd == 8 && in.n_layer == 1 && in.n_head == 2, "dims");
    T_CHECK(in.n_kv_head == 1 && in.head_dim == 4 && in.n_ff == 16 && in.n_ctx_train == 128, "dims2");
    T_CHECK(in.tied_embeddings == 0, "tied");
    T_CHECK(in.dtype == TD_DTYPE_F32, "dtype %d", in.dtype);
    T_CHECK(in.n_tensors == 14, "n_tensors %d", in.n_tensors);
    size_t params = 32 * 8 * 2 + 8 + 8 + 64 + 32 + 32 + 64 + 4 + 4 + 8 + 128 * 3;
    T_CHECK(in.n_params == params, "n_params %zu want %zu", in.n_params, params);
    T_CHECK(in.weight_bytes == params * 4, "weight_bytes %zu", in.weight_bytes);
    T_CHECK(in.n_eos == 1 && in.eos_ids[0] == 2, "eos %d %d", in.n_eos, in.eos_ids[0]);
    T_CHECK(m->cfg.bos_id == 1 && m->cfg.qk_norm == 1 && m->cfg.attn_bias == 0, "cfg flags");
    T_CHECK(m->cfg.rope_theta == 1000000.0 && m->cfg.rope_scaling == TD_ROPE_NONE, "rope");
    T_CHECK(m->cfg.rms_eps == 1e-6f, "eps %g", (double)m->cfg.rms_eps);
    T_CHECK(m->n_extra_tensors == 1, "extra %d", m->n_extra_tensors);
    T_CHECK(td_model_tokenizer(m) == NULL, "tokenizer should be absent");
    T_CHECK(check_values(m, &tm) == 0, "values differ");
    /* the view points into the mapping at header end + offset */
    const td_st_file *f = m->files[0];
    const td_st_tensor *st = td_st_find(f, "model.layers.0.mlp.up_proj.weight");
    T_CHECK(st && st->data == m->w.layers[0].w_up.data, "w_up view not at the file's bytes");
    T_CHECK((const char *)m->w.tok_embd.data > (const char *)f->map &&
                (const char *)m->w.tok_embd.data < (const char *)f->map + f->map_len, "embd outside map");
    T_CHECK(((const float *)m->w.layers[0].wk.data)[5] == tval("model.layers.0.self_attn.k_proj.weight", 5),
            "wk[5]");
    char *buf = NULL;
    size_t blen = 0;
    FILE *mf = open_memstream(&buf, &blen);
    td_model_describe(m, mf);
    fclose(mf);
    T_CHECK(buf && strstr(buf, "Qwen3ForCausalLM") && strstr(buf, "F32 x 14") && strstr(buf, "model.safetensors"),
            "describe:\n%s", buf ? buf : "");
    free(buf);
done:
    td_model_free(m);
    t_end();
}

/* use_mmap = 0: the same values, now in one 2 MiB-aligned anonymous arena
 * outside every file mapping; use_mmap = 1 and the default (a small model)
 * keep views of the mapping; a bad use_mmap is refused. Sharded files too. */
static void test_copy(void) {
    t_begin("model: use_mmap = 0 copies the weights out of the files (same values, 2 MiB-aligned arena)");
    tmodel tm;
    tiny_tensors(&tm, "BF16");
    char d[512];
    write_model("copy", NULL, &tm, d);
    td_err err = {0};
    td_model *m = NULL, *mm = NULL;
    td_model_params mp = td_model_default_params();
    T_CHECK(mp.use_mmap == -1, "default use_mmap %d", mp.use_mmap);
    T_REQUIRE(td_model_open(&mm, d, &err) == 0, "open: %s", err.msg);
    td_model_info in;
    td_model_get_info(mm, &in);
    T_CHECK(in.copied == 0 && in.weight_bytes < TD_MODEL_COPY_MIN, "a small model is mapped by default");
    mp.use_mmap = 0;
    T_REQUIRE(td_model_open_params(&m, d, &mp, &err) == 0, "open copied: %s", err.msg);
    td_model_get_info(m, &in);
    T_CHECK(in.copied == 1 && m->copied == 1, "copied flag");
    T_CHECK(check_values(m, &tm) == 0, "copied values differ");
    T_CHECK(((uintptr_t)m->w.tok_embd.data & (((uintptr_t)2 << 20) - 1)) == 0, "arena not 2 MiB-aligned");
    const td_st_file *f = m->files[0];
    const td_tensor *ts[] = {&m->w.tok_embd, &m->w.lm_head, &m->w.out_norm, &m->w.layers[0].wq, &m->w.layers[0].w_down,
                             &m->w.layers[0].q_norm, &m->w.layers[0].attn_norm};
    int inside = 0;
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++)
        inside += (const char *)ts[i]->data >= (const char *)f->map && (const char *)ts[i]->data < (const char *)f->map + f->map_len;
    T_CHECK(inside == 0, "%d tensors still point into the file mapping", inside);
    T_CHECK(memcmp(m->w.layers[0].w_up.data, mm->w.layers[0].w_up.data, 16 * 8 * 2) == 0, "w_up bytes differ");
    td_model_free(m);
    m = NULL;
    mp.use_mmap = 1;
    T_REQUIRE(td_model_open_params(&m, d, &mp, &err) == 0, "open mapped: %s", err.msg);
    T_CHECK(m->copied == 0 && (const char *)m->w.tok_embd.data > (const char *)m->files[0]->map, "use_mmap = 1 maps");
    td_model_free(m);
    m = (td_model *)1;
    mp.use_mmap = 2;
    T_CHECK(td_model_open_params(&m, d, &mp, &err) == TD_EINVAL && m == NULL && strstr(err.msg, "use_mmap"),
            "use_mmap 2 refused: %s", err.msg);
    m = NULL;
done:
    td_model_free(m);
    td_model_free(mm);
    t_end();
}

static void test_sharded(void) {
    t_begin("model: sharded index.json layout loads identically");
    tmodel tm;
    tiny_tensors(&tm, "F32");
    char d[512], p[512];
    case_dir("sharded", d);
    file_in(p, d, "config.json");
    write_text(p, TINY_CFG);
    file_in(p, d, "model-00001-of-00002.safetensors");
    write_st(p, &tm, 0, NULL);
    file_in(p, d, "model-00002-of-00002.safetensors");
    write_st(p, &tm, 1, NULL);
    char idx[16384];
    int n = sprintf(idx, "{\"metadata\":{\"total_size\":1},\"weight_map\":{");
    for (int i = 0; i < tm.n; i++)
        n += snprintf(idx + n, sizeof idx - (size_t)n, "%s\"%s\":\"model-0000%d-of-00002.safetensors\"", i ? "," : "", tm.t[i].name,
                     tm.t[i].shard + 1);
    snprintf(idx + n, sizeof idx - (size_t)n, "}}");
    file_in(p, d, "model.safetensors.index.json");
    write_text(p, idx);
    td_err err = {0};
    td_model *m = NULL;
    int rc = td_model_open(&m, d, &err);
    T_REQUIRE(rc == 0, "open failed: %s", err.msg);
    T_CHECK(m->n_files == 2, "n_files %d", m->n_files);
    td_model_info in;
    td_model_get_info(m, &in);
    T_CHECK(in.n_tensors == 14 && in.weight_bytes == 1120 * 4, "n_tensors %d bytes %zu", in.n_tensors,
            in.weight_bytes);
    T_CHECK(check_values(m, &tm) == 0, "values differ");
    td_model_free(m);
    m = NULL;

    /* the index names a shard that does not hold the tensor */
    n = sprintf(idx, "{\"weight_map\":{");
    for (int i = 0; i < tm.n; i++)
        n += snprintf(idx + n, sizeof idx - (size_t)n, "%s\"%s\":\"model-0000%d-of-00002.safetensors\"", i ? "," : "", tm.t[i].name,
                     (i == 5 ? 1 - tm.t[i].shard : tm.t[i].shard) + 1);
    snprintf(idx + n, sizeof idx - (size_t)n, "}}");
    write_text(p, idx);
    expect_fail(d, TD_EFORMAT, "model.layers.0.self_attn.k_proj.weight", "index names shard");

    /* the index names a shard file that is absent */
    n = sprintf(idx, "{\"weight_map\":{");
    for (int i = 0; i < tm.n; i++)
        n += snprintf(idx + n, sizeof idx - (size_t)n, "%s\"%s\":\"%s\"", i ? "," : "", tm.t[i].name,
                     i == 3 ? "model-00003-of-00002.safetensors" : "model-00001-of-00002.safetensors");
    snprintf(idx + n, sizeof idx - (size_t)n, "}}");
    write_text(p, idx);
    expect_fail(d, TD_EIO, "model-00003-of-00002.safetensors", "does not exist");

    /* path traversal in a shard name */
    write_text(p, "{\"weight_map\":{\"model.norm.weight\":\"../x.safetensors\"}}");
    expect_fail(d, TD_EFORMAT, "model.norm.weight", "plain file name");
    write_text(p, "{\"weight_map\":[1]}");
    expect_fail(d, TD_EFORMAT, "weight_map", NULL);
done:
    td_model_free(m);
    t_end();
}

static void test_dtypes(void) {
    static const char *dts[3] = {"BF16", "F16", "F32"};
    static const int want[3] = {TD_DTYPE_BF16, TD_DTYPE_F16, TD_DTYPE_F32};
    for (int k = 0; k < 2; k++) {
        static char title[2][64];
        char name[64];
        snprintf(title[k], sizeof title[k], "model: %s weights load with exact values", dts[k]);
        t_begin(title[k]);
        tmodel tm;
        tiny_tensors(&tm, dts[k]);
        char d[512];
        snprintf(name, sizeof name, "dt_%s", dts[k]);
        write_model(name, NULL, &tm, d);
        td_err err = {0};
        td_model *m = NULL;
        int rc = td_model_open(&m, d, &err);
        T_REQUIRE(rc == 0, "open failed: %s", err.msg);
        td_model_info in;
        td_model_get_info(m, &in);
        T_CHECK(in.dtype == want[k], "dtype %d", in.dtype);
        T_CHECK(in.weight_bytes == in.n_params * 2, "bytes");
        T_CHECK(m->w.layers[0].wq.dtype == want[k], "wq dtype");
        T_CHECK(check_values(m, &tm) == 0, "values differ");
    done:
        td_model_free(m);
        t_end();
    }
}

static void test_mixed(void) {
    t_begin("model: mixed dtypes per tensor; tied lm_head; generation_config eos");
    {
        tmodel tm;
        tiny_tensors(&tm, "BF16");
        find_tt(&tm, "model.norm.weight")->dtype[0] = 0;
        strcpy(find_tt(&tm, "model.norm.weight")->dtype, "F32");
        strcpy(find_tt(&tm, "model.layers.0.self_attn.q_norm.weight")->dtype, "F16");
        /* lm_head.weight stays in the file but is ignored when tied */
        char cfg[2048], d[512], p[512];
        snprintf(cfg, sizeof cfg, "%s", TINY_CFG);
        char *tie = strstr(cfg, "\"tie_word_embeddings\":false");
        memcpy(tie, "\"tie_word_embeddings\":true ", 27);
        write_model("mixed", cfg, &tm, d);
        file_in(p, d, "generation_config.json");
        write_text(p, "{\"eos_token_id\":[7,2],\"bos_token_id\":3}");
        td_err err = {0};
        td_model *m = NULL;
        int rc = td_model_open(&m, d, &err);
        T_REQUIRE(rc == 0, "open failed: %s", err.msg);
        T_CHECK(m->w.out_norm.dtype == TD_DTYPE_F32 && m->w.layers[0].q_norm.dtype == TD_DTYPE_F16 &&
                    m->w.layers[0].wq.dtype == TD_DTYPE_BF16, "per-tensor dtypes");
        T_CHECK(m->cfg.tied && m->w.lm_head.data == m->w.tok_embd.data, "tied lm_head not embd");
        T_CHECK(m->n_tensors == 13 && m->n_extra_tensors == 1, "tensors %d extra %d", m->n_tensors,
                m->n_extra_tensors);
        T_CHECK(m->dtype == TD_DTYPE_BF16, "main dtype");
        T_CHECK(m->cfg.n_eos == 2 && m->cfg.eos_ids[0] == 7 && m->cfg.eos_ids[1] == 2, "eos %d", m->cfg.n_eos);
        T_CHECK(m->cfg.bos_id == 3, "bos %d", m->cfg.bos_id);
        T_CHECK(check_values(m, &tm) == 0, "values differ");
        td_model_free(m);
        m = NULL;
        write_text(p, "{\"eos_token_id\":[7,99]}");
        expect_fail(d, TD_ERANGE, "generation_config.json", "eos_token_id");
        write_text(p, "{\"eos_token_id\":");
        expect_fail(d, TD_EFORMAT, "generation_config.json", NULL);
    done:
        td_model_free(m);
        t_end();
    }
}

static void test_llama_bias(void) {
    t_begin("model: tiny llama (no qk-norm) and attention_bias biases bind");
    tmodel tm;
    tiny_tensors(&tm, "F32");
    remove_tt(&tm, "model.layers.0.self_attn.q_norm.weight");
    remove_tt(&tm, "model.layers.0.self_attn.k_norm.weight");
    add(&tm, "model.layers.0.self_attn.q_proj.bias", "F32", 1, 8, 0);
    add(&tm, "model.layers.0.self_attn.k_proj.bias", "F32", 1, 4, 0);
    add(&tm, "model.layers.0.self_attn.v_proj.bias", "F32", 1, 4, 0);
    add(&tm, "model.layers.0.self_attn.o_proj.bias", "F32", 1, 8, 0);
    char cfg[2048], d[512];
    snprintf(cfg, sizeof cfg, "%s", TINY_CFG);
    memcpy(strstr(cfg, "Qwen3ForCausalLM"), "LlamaForCausalLM", 16);
    memcpy(strstr(cfg, "\"attention_bias\":false"), "\"attention_bias\":true ", 22);
    write_model("llama_bias", cfg, &tm, d);
    td_err err = {0};
    td_model *m = NULL;
    int rc = td_model_open(&m, d, &err);
    T_REQUIRE(rc == 0, "open failed: %s", err.msg);
    const td_layer_w *l = &m->w.layers[0];
    T_CHECK(m->cfg.arch == TD_ARCH_LLAMA && !m->cfg.qk_norm && m->cfg.attn_bias, "cfg");
    T_CHECK(!l->q_norm.data && !l->k_norm.data, "llama has no q/k norm");
    T_CHECK(l->bq.data && l->bk.data && l->bv.data && l->bo.data, "biases unbound");
    T_CHECK(l->bk.n_dims == 1 && l->bk.shape[0] == 4, "bk shape");
    T_CHECK(read_val(&l->bv, 3) == tval("model.layers.0.self_attn.v_proj.bias", 3), "bv value");
    T_CHECK(m->n_tensors == 16 && m->n_extra_tensors == 0, "tensors %d", m->n_tensors);
    td_model_free(m);
    m = NULL;
    remove_tt(&tm, "model.layers.0.self_attn.o_proj.bias");
    write_model("llama_bias", cfg, &tm, d);
    expect_fail(d, TD_EFORMAT, "model.layers.0.self_attn.o_proj.bias", "missing");
done:
    td_model_free(m);
    t_end();
}

static void test_bad_files(void) {
    tmodel tm;
    char d[512], p[512];

    t_begin("model: truncated safetensors (cut in the data region)");
    tiny_tensors(&tm, "F32");
    write_model("trunc_data", NULL, &tm, d);
    file_in(p, d, "model.safetensors");
    T_CHECK(truncate(p, file_size(p) - 10) == 0, "truncate");
    expect_fail(d, TD_EFORMAT, "model.layers.0.mlp.down_proj.weight", "past the data region");
    t_end();

    t_begin("model: truncated safetensors (cut inside the header)");
    T_CHECK(truncate(p, 100) == 0, "truncate");
    expect_fail(d, TD_EFORMAT, "model.safetensors", "past the end of the file");
    T_CHECK(truncate(p, 5) == 0, "truncate");
    expect_fail(d, TD_EFORMAT, "model.safetensors", "too short");
    T_CHECK(truncate(p, 0) == 0, "truncate");
    expect_fail(d, TD_EFORMAT, "model.safetensors", "too short");
    t_end();

    t_begin("model: header length past end of file / over 100 MB");
    write_model("hdr_len", NULL, &tm, d);
    file_in(p, d, "model.safetensors");
    {
        FILE *f = fopen(p, "r+b");
        unsigned char big[8] = {0x00, 0x00, 0x10, 0, 0, 0, 0, 0}; /* 1 MiB */
        fwrite(big, 1, 8, f);
        fclose(f);
        expect_fail(d, TD_EFORMAT, "header length 1048576", "past the end");
        f = fopen(p, "r+b");
        unsigned char huge[8] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff};
        fwrite(huge, 1, 8, f);
        fclose(f);
        expect_fail(d, TD_EFORMAT, "model.safetensors", "100 MB");
    }
    t_end();

    t_begin("model: header offset past the end of the data");
    tiny_tensors(&tm, "F32");
    find_tt(&tm, "model.layers.0.mlp.down_proj.weight")->bad_end = 4000;
    write_model("off_past", NULL, &tm, d);
    expect_fail(d, TD_EFORMAT, "model.layers.0.mlp.down_proj.weight", "past the data region");
    t_end();

    t_begin("model: data_offsets not matching shape x dtype");
    tiny_tensors(&tm, "F32");
    find_tt(&tm, "model.layers.0.self_attn.v_proj.weight")->bad_end = -4;
    write_model("off_size", NULL, &tm, d);
    expect_fail(d, TD_EFORMAT, "model.layers.0.self_attn.v_proj.weight", "needs 128");
    t_end();

    t_begin("model: shape disagreeing with the config");
    tiny_tensors(&tm, "F32");
    find_tt(&tm, "model.layers.0.mlp.up_proj.weight")->shape[0] = 12;
    write_model("shape", NULL, &tm, d);
    expect_fail(d, TD_EFORMAT, "tensor model.layers.0.mlp.up_proj.weight: shape [12, 8] but config expects [16, 8]",
                NULL);
    tiny_tensors(&tm, "F32");
    find_tt(&tm, "model.norm.weight")->nd = 2;
    find_tt(&tm, "model.norm.weight")->shape[1] = 1;
    write_model("shape2", NULL, &tm, d);
    expect_fail(d, TD_EFORMAT, "tensor model.norm.weight: shape [8, 1] but config expects [8]", NULL);
    t_end();

    t_begin("model: missing tensor named");
    tiny_tensors(&tm, "F32");
    remove_tt(&tm, "model.layers.0.self_attn.k_norm.weight");
    write_model("missing", NULL, &tm, d);
    expect_fail(d, TD_EFORMAT, "model.layers.0.self_attn.k_norm.weight", "missing");
    tiny_tensors(&tm, "F32");
    remove_tt(&tm, "lm_head.weight");
    write_model("missing_head", NULL, &tm, d);
    expect_fail(d, TD_EFORMAT, "lm_head.weight", "missing");
    t_end();

    t_begin("model: unsupported dtype (I8) for a needed tensor");
    tiny_tensors(&tm, "F32");
    strcpy(find_tt(&tm, "model.layers.0.self_attn.q_proj.weight")->dtype, "I8");
    write_model("i8", NULL, &tm, d);
    expect_fail(d, TD_EUNSUPPORTED, "model.layers.0.self_attn.q_proj.weight", "I8");
    t_end();

    t_begin("model: malformed JSON headers");
    tiny_tensors(&tm, "F32");
    static const struct { const char *hdr; const char *needle; } bad[] = {
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],", "not valid JSON"},
        {"[1,2,3]", "not a JSON object"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}} xx", "trailing"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", "tensor a: shape[0]"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2.5],\"data_offsets\":[0,8]}}", "tensor a: shape[0]"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":\"2\",\"data_offsets\":[0,8]}}", "tensor a: missing or non-array \"shape\""},
        {"{\"a\":{\"dtype\":7,\"shape\":[2],\"data_offsets\":[0,8]}}", "tensor a: missing or non-string \"dtype\""},
        {"{\"a\":{\"dtype\":\"Q4\",\"shape\":[2],\"data_offsets\":[0,8]}}", "unknown dtype \"Q4\""},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]}}", "reversed"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0]}}", "[begin, end]"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2]}}", "data_offsets"},
        {"{\"a\":5}", "tensor a: header entry is not an object"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,4294967296],\"data_offsets\":[0,8]}}",
         "overflows"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}", "dimensions"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
         "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", "tensor a appears twice"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,1e300]}}", "not non-negative integers"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[2,6]}}", "aligned"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        write_model("hdr_bad", NULL, &tm, d);
        file_in(p, d, "model.safetensors");
        write_st(p, &tm, -1, bad[i].hdr);
        td_err err = {0};
        td_st_file *f = (td_st_file *)1;
        int rc = td_st_open(&f, p, &err);
        T_CHECK(rc < 0 && f == NULL, "case %zu: rc %d", i, rc);
        T_CHECK(strstr(err.msg, bad[i].needle) && strstr(err.msg, "model.safetensors"),
                "case %zu: message lacks \"%s\": %s", i, bad[i].needle, err.msg);
    }
    expect_fail(d, TD_EUNSUPPORTED, "aligned", NULL); /* the last header, through the loader */
    t_end();
}

static void cfg_case(const char *name, const char *from, const char *to, int code, const char *n1,
                     const char *n2) {
    char cfg[4096], d[512];
    const char *at = strstr(TINY_CFG, from);
    if (!at) {
        T_CHECK(0, "bad test: %s not in config", from);
        return;
    }
    int pre = (int)(at - TINY_CFG);
    snprintf(cfg, sizeof cfg, "%.*s%s%s", pre, TINY_CFG, to, at + strlen(from));
    tmodel tm;
    tiny_tensors(&tm, "F32");
    write_model(name, cfg, &tm, d);
    expect_fail(d, code, n1, n2);
}

static void test_bad_config(void) {
    t_begin("config: malformed config.json");
    cfg_case("cfg_json", "}", "", TD_EFORMAT, "config.json", "not valid JSON");
    cfg_case("cfg_type", "\"vocab_size\":32", "\"vocab_size\":\"32\"", TD_EFORMAT, "vocab_size", "not a number");
    cfg_case("cfg_frac", "\"vocab_size\":32", "\"vocab_size\":32.5", TD_ERANGE, "vocab_size", NULL);
    cfg_case("cfg_miss", "\"hidden_size\":8,", "", TD_EFORMAT, "hidden_size", "missing");
    cfg_case("cfg_neg", "\"intermediate_size\":16", "\"intermediate_size\":-16", TD_ERANGE, "intermediate_size", NULL);
    cfg_case("cfg_big", "\"vocab_size\":32", "\"vocab_size\":99999999999", TD_ERANGE, "vocab_size", NULL);
    cfg_case("cfg_eps", "\"rms_norm_eps\":1e-6", "\"rms_norm_eps\":0", TD_ERANGE, "rms_norm_eps", NULL);
    cfg_case("cfg_hd", "\"head_dim\":4", "\"head_dim\":1024", TD_ERANGE, "head_dim", NULL);
    cfg_case("cfg_eos", "\"eos_token_id\":2", "\"eos_token_id\":[2,32]", TD_ERANGE, "eos_token_id", NULL);
    cfg_case("cfg_tie", "\"tie_word_embeddings\":false", "\"tie_word_embeddings\":\"no\"", TD_EFORMAT,
             "tie_word_embeddings", NULL);
    cfg_case("cfg_act", "\"silu\"", "\"gelu\"", TD_EUNSUPPORTED, "hidden_act", "gelu");
    cfg_case("cfg_mlpb", "\"attention_bias\":false", "\"mlp_bias\":true", TD_EUNSUPPORTED, "mlp_bias", NULL);
    cfg_case("cfg_swa", "\"rope_scaling\":null", "\"use_sliding_window\":true,\"sliding_window\":4096",
             TD_EUNSUPPORTED, "use_sliding_window", NULL);
    cfg_case("cfg_lt", "\"rope_scaling\":null", "\"sliding_window\":64,\"layer_types\":[\"sliding_attention\"]",
             TD_EUNSUPPORTED, "layer_types[0]", "sliding_attention");
    cfg_case("cfg_lt2", "\"rope_scaling\":null", "\"layer_types\":\"full\"", TD_EFORMAT, "layer_types", NULL);
    t_end();

    t_begin("config: heads not dividing");
    cfg_case("cfg_heads", "\"num_attention_heads\":2,\"num_key_value_heads\":1",
             "\"num_attention_heads\":3,\"num_key_value_heads\":2", TD_ERANGE, "num_key_value_heads", "divide");
    cfg_case("cfg_heads2", "\"num_attention_heads\":2,\"num_key_value_heads\":1,\"head_dim\":4,",
             "\"num_attention_heads\":3,\"num_key_value_heads\":1,", TD_ERANGE, "hidden_size", "divide");
    cfg_case("cfg_heads3", "\"num_key_value_heads\":1", "\"num_key_value_heads\":0", TD_ERANGE,
             "num_key_value_heads", NULL);
    t_end();

    t_begin("config: unknown architecture");
    cfg_case("cfg_arch", "Qwen3ForCausalLM", "MistralForCausalLM", TD_EUNSUPPORTED, "MistralForCausalLM",
             "architectures");
    cfg_case("cfg_arch2", "[\"Qwen3ForCausalLM\"]", "[]", TD_EFORMAT, "architectures", NULL);
    t_end();

    t_begin("config: unsupported rope type");
    cfg_case("rope_yarn", "\"rope_scaling\":null", "\"rope_parameters\":{\"rope_type\":\"yarn\",\"factor\":4}",
             TD_EUNSUPPORTED, "rope_parameters", "yarn");
    cfg_case("rope_lin", "\"rope_scaling\":null", "\"rope_scaling\":{\"type\":\"linear\",\"factor\":2}",
             TD_EUNSUPPORTED, "rope_scaling", "linear");
    cfg_case("rope_l3bad", "\"rope_scaling\":null",
             "\"rope_parameters\":{\"rope_type\":\"llama3\",\"rope_theta\":500000,\"factor\":8}", TD_EFORMAT,
             "rope_parameters", "low_freq_factor");
    t_end();
}

static void test_config_parse(void) {
    t_begin("config: llama3 rope in both formats; defaults");
    td_config c;
    td_err err = {0};
    const char *v5 =
        "{\"architectures\":[\"LlamaForCausalLM\"],\"vocab_size\":128256,\"hidden_size\":2048,"
        "\"num_hidden_layers\":16,\"num_attention_heads\":32,\"num_key_value_heads\":8,"
        "\"intermediate_size\":8192,\"max_position_embeddings\":131072,\"rms_norm_eps\":1e-5,"
        "\"rope_parameters\":{\"rope_type\":\"llama3\",\"rope_theta\":500000.0,\"factor\":32.0,"
        "\"low_freq_factor\":1.0,\"high_freq_factor\":4.0,\"original_max_position_embeddings\":8192},"
        "\"eos_token_id\":[128001,128008,128009],\"bos_token_id\":128000}";
    int rc = td_config_parse(&c, v5, strlen(v5), &err);
    T_CHECK(rc == 0, "v5: %s", err.msg);
    T_CHECK(c.arch == TD_ARCH_LLAMA && c.qk_norm == 0 && c.tied == 0 && c.attn_bias == 0, "llama flags");
    T_CHECK(c.head_dim == 64 && c.n_kv_head == 8, "head_dim %d", c.head_dim);
    T_CHECK(c.rope_scaling == TD_ROPE_LLAMA3 && c.rope_theta == 500000.0 && c.rope_factor == 32.0 &&
                c.rope_low_freq_factor == 1.0 && c.rope_high_freq_factor == 4.0 && c.rope_orig_ctx == 8192,
            "llama3 rope v5");
    T_CHECK(c.n_eos == 3 && c.eos_ids[2] == 128009 && c.bos_id == 128000, "eos");
    const char *v4 =
        "{\"architectures\":[\"LlamaForCausalLM\"],\"vocab_size\":128256,\"hidden_size\":2048,"
        "\"num_hidden_layers\":16,\"num_attention_heads\":32,\"num_key_value_heads\":8,"
        "\"intermediate_size\":8192,\"max_position_embeddings\":131072,\"rms_norm_eps\":1e-5,"
        "\"rope_theta\":500000.0,\"tie_word_embeddings\":true,\"rope_scaling\":{\"rope_type\":\"llama3\","
        "\"factor\":32.0,\"low_freq_factor\":1.0,\"high_freq_factor\":4.0,"
        "\"original_max_position_embeddings\":8192},\"eos_token_id\":128001}";
    rc = td_config_parse(&c, v4, strlen(v4), &err);
    T_CHECK(rc == 0, "v4: %s", err.msg);
    T_CHECK(c.rope_scaling == TD_ROPE_LLAMA3 && c.rope_theta == 500000.0 && c.rope_factor == 32.0 &&
                c.rope_orig_ctx == 8192 && c.tied == 1, "llama3 rope v4");
    T_CHECK(c.n_eos == 1 && c.bos_id == -1, "eos/bos");
    const char *dflt =
        "{\"architectures\":[\"Qwen3ForCausalLM\"],\"vocab_size\":100,\"hidden_size\":64,"
        "\"num_hidden_layers\":2,\"num_attention_heads\":4,\"intermediate_size\":128,"
        "\"max_position_embeddings\":256,\"rope_parameters\":{\"rope_type\":\"default\",\"rope_theta\":5000}}";
    rc = td_config_parse(&c, dflt, strlen(dflt), &err);
    T_CHECK(rc == 0, "default: %s", err.msg);
    T_CHECK(c.n_kv_head == 4 && c.head_dim == 16 && c.qk_norm == 1 && c.rope_theta == 5000.0 &&
                c.rope_scaling == TD_ROPE_NONE && c.n_eos == 0,
            "defaults");
    /* real checkpoints' config.json (Qwen3-0.6B, transformers 4.51; Llama-3.2-1B) */
    const char *q06 =
        "{\"architectures\":[\"Qwen3ForCausalLM\"],\"attention_bias\":false,\"attention_dropout\":0.0,"
        "\"bos_token_id\":151643,\"eos_token_id\":151645,\"head_dim\":128,\"hidden_act\":\"silu\","
        "\"hidden_size\":1024,\"initializer_range\":0.02,\"intermediate_size\":3072,"
        "\"max_position_embeddings\":40960,\"max_window_layers\":28,\"model_type\":\"qwen3\","
        "\"num_attention_heads\":16,\"num_hidden_layers\":28,\"num_key_value_heads\":8,\"rms_norm_eps\":1e-06,"
        "\"rope_scaling\":null,\"rope_theta\":1000000,\"sliding_window\":null,\"tie_word_embeddings\":true,"
        "\"torch_dtype\":\"bfloat16\",\"transformers_version\":\"4.51.0\",\"use_cache\":true,"
        "\"use_sliding_window\":false,\"vocab_size\":151936}";
    rc = td_config_parse(&c, q06, strlen(q06), &err);
    T_CHECK(rc == 0, "qwen3-0.6b: %s", err.msg);
    T_CHECK(c.n_embd == 1024 && c.head_dim == 128 && c.n_head == 16 && c.n_kv_head == 8 && c.tied &&
                c.qk_norm && c.rope_theta == 1e6 && c.n_eos == 1 && c.eos_ids[0] == 151645 && c.bos_id == 151643,
            "qwen3-0.6b values");
    const char *l32 =
        "{\"architectures\":[\"LlamaForCausalLM\"],\"attention_bias\":false,\"attention_dropout\":0.0,"
        "\"bos_token_id\":128000,\"eos_token_id\":128001,\"head_dim\":64,\"hidden_act\":\"silu\","
        "\"hidden_size\":2048,\"initializer_range\":0.02,\"intermediate_size\":8192,"
        "\"max_position_embeddings\":131072,\"mlp_bias\":false,\"model_type\":\"llama\","
        "\"num_attention_heads\":32,\"num_hidden_layers\":16,\"num_key_value_heads\":8,\"pretraining_tp\":1,"
        "\"rms_norm_eps\":1e-05,\"rope_scaling\":{\"factor\":32.0,\"high_freq_factor\":4.0,"
        "\"low_freq_factor\":1.0,\"original_max_position_embeddings\":8192,\"rope_type\":\"llama3\"},"
        "\"rope_theta\":500000.0,\"tie_word_embeddings\":true,\"torch_dtype\":\"bfloat16\","
        "\"transformers_version\":\"4.45.0.dev0\",\"use_cache\":true,\"vocab_size\":128256}";
    rc = td_config_parse(&c, l32, strlen(l32), &err);
    T_CHECK(rc == 0, "llama-3.2-1b: %s", err.msg);
    T_CHECK(c.rope_scaling == TD_ROPE_LLAMA3 && c.rope_theta == 500000.0 && c.tied && c.head_dim == 64 &&
                c.rms_eps == 1e-5f,
            "llama-3.2-1b values");
    /* transformers 5 style: rope_parameters + layer_types */
    const char *v5q =
        "{\"architectures\":[\"Qwen3ForCausalLM\"],\"vocab_size\":512,\"hidden_size\":64,"
        "\"num_hidden_layers\":2,\"num_attention_heads\":4,\"num_key_value_heads\":2,\"head_dim\":16,"
        "\"intermediate_size\":128,\"max_position_embeddings\":256,\"rms_norm_eps\":1e-6,"
        "\"layer_types\":[\"full_attention\",\"full_attention\"],\"sliding_window\":null,"
        "\"use_sliding_window\":false,\"max_window_layers\":28,\"tie_word_embeddings\":true,"
        "\"rope_parameters\":{\"rope_theta\":10000.0,\"rope_type\":\"default\"},"
        "\"bos_token_id\":null,\"eos_token_id\":null,\"pad_token_id\":null}";
    rc = td_config_parse(&c, v5q, strlen(v5q), &err);
    T_CHECK(rc == 0, "v5 qwen3: %s", err.msg);
    T_CHECK(c.rope_theta == 10000.0 && c.n_eos == 0 && c.bos_id == -1 && c.tied, "v5 qwen3 values");
    rc = td_config_parse(&c, "", 0, &err);
    T_CHECK(rc == TD_EFORMAT, "empty config rc %d", rc);
    t_end();
}

static void test_tokenizer(void) {
    t_begin("model: tokenizer.json loaded with the model; bad tokenizer fails the open");
    tmodel tm;
    tiny_tensors(&tm, "F32");
    char d[512], p[512], pc[512];
    write_model("tok", NULL, &tm, d);
    file_in(p, d, "tokenizer.json");
    file_in(pc, d, "tokenizer_config.json");
    write_text(p, "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1,\"ab\":2},\"merges\":[\"a b\"]},"
                  "\"added_tokens\":[{\"id\":3,\"content\":\"<|im_end|>\",\"special\":true}]}");
    write_text(pc, "{\"chat_template\":\"{% for m in messages %}<|im_start|>{{m.role}}{% endfor %}\"}");
    td_err err = {0};
    td_model *m = NULL;
    int rc = td_model_open(&m, d, &err);
    T_CHECK(rc == 0, "open with tokenizer: %s", err.msg);
    if (rc == 0) {
        T_CHECK(td_model_tokenizer(m) != NULL, "no tokenizer");
        T_CHECK(td_model_tokenizer(m) && td_tokenizer_n_vocab(td_model_tokenizer(m)) == 4, "n_vocab");
        T_CHECK(m->chat == TD_CHAT_CHATML, "chat %d", m->chat);
        char *buf = NULL;
        size_t blen = 0;
        FILE *mf = open_memstream(&buf, &blen);
        td_model_describe(m, mf);
        fclose(mf);
        T_CHECK(buf && strstr(buf, "4 ids, chat style chatml"), "describe:\n%s", buf ? buf : "");
        free(buf);
    }
    td_model_free(m);
    /* a tokenizer with more ids than the model's vocabulary */
    write_text(p, "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":40},\"merges\":[]}}");
    expect_fail(d, TD_EFORMAT, "tokenizer.json", "vocab_size is 32");
    /* malformed tokenizer.json: the path is named */
    write_text(p, "{\"model\":");
    char want[600];
    snprintf(want, sizeof want, "%s/tokenizer.json", d);
    expect_fail(d, TD_EFORMAT, want, NULL);
    unlink(pc);
    write_text(p, "{\"model\":{\"type\":\"WordPiece\",\"vocab\":{\"a\":0}}}");
    expect_fail(d, TD_EUNSUPPORTED, want, "WordPiece");
    t_end();
}

static void test_missing_files(void) {
    t_begin("model: missing directory / config / weights");
    char d[512], p[512];
    expect_fail("/nonexistent/tandem/model", TD_EIO, "/nonexistent/tandem/model", NULL);
    case_dir("empty", d);
    expect_fail(d, TD_EIO, "config.json", NULL);
    file_in(p, d, "config.json");
    write_text(p, TINY_CFG);
    expect_fail(d, TD_EIO, "no model.safetensors", NULL);
    td_err err = {0};
    td_model *m = (td_model *)1;
    T_CHECK(td_model_open(&m, NULL, &err) == TD_EINVAL && m == NULL, "NULL dir");
    td_model_free(NULL);
    td_model_info in;
    td_model_get_info(NULL, &in);
    T_CHECK(in.n_vocab == 0, "info of NULL");
    T_CHECK(td_model_tokenizer(NULL) == NULL, "tokenizer of NULL");
    t_end();
}

/* The random-weight fixtures of tools/train/make_rand_fixtures.py: vocab 512, hidden 64,
 * 2 layers, 4 heads x 16, 2 kv heads; Qwen3 ffn 128, tied; Llama ffn 160, untied,
 * llama3 rope (theta 500000, factor 8, low 1, high 4, original ctx 64). */
typedef struct fixture {
    const char *dir;
    td_arch arch;
    int n_ff, tied, dtype, min_files;
} fixture;

static void test_fixture(const fixture *fx) {
    char name[256];
    struct stat sb;
    if (stat(fx->dir, &sb) != 0) {
        snprintf(name, sizeof name, "model: fixture %s (skipped: directory absent)", fx->dir);
        t_begin(name);
        t_end();
        return;
    }
    snprintf(name, sizeof name, "model: fixture %s loads", fx->dir);
    t_begin(name);
    td_err err = {0};
    td_model *m = NULL;
    int rc = td_model_open(&m, fx->dir, &err);
    T_REQUIRE(rc == 0, "open failed: %s", err.msg);
    td_model_info in;
    td_model_get_info(m, &in);
    const td_config *c = &m->cfg;
    T_CHECK(in.arch == fx->arch, "arch %d", in.arch);
    T_CHECK(in.n_vocab == 512 && in.n_embd == 64 && in.n_layer == 2 && in.n_head == 4 && in.n_kv_head == 2 &&
                in.head_dim == 16 && in.n_ff == fx->n_ff && in.n_ctx_train == 256,
            "dims %d %d %d %d %d %d %d %d", in.n_vocab, in.n_embd, in.n_layer, in.n_head, in.n_kv_head,
            in.head_dim, in.n_ff, in.n_ctx_train);
    T_CHECK(in.tied_embeddings == fx->tied, "tied %d", in.tied_embeddings);
    T_CHECK(in.dtype == fx->dtype, "dtype %d", in.dtype);
    T_CHECK(m->n_files >= fx->min_files, "files %d", m->n_files);
    int per_layer = 9 + (c->qk_norm ? 2 : 0) + (c->attn_bias ? 4 : 0);
    T_CHECK(in.n_tensors == 2 + (c->tied ? 0 : 1) + in.n_layer * per_layer, "n_tensors %d", in.n_tensors);
    size_t per = (size_t)64 * 4 * 16 * 2 + (size_t)64 * 2 * 16 * 2 + (size_t)3 * 64 * fx->n_ff + 2 * 64 +
                 (c->qk_norm ? 32 : 0);
    size_t params = (size_t)512 * 64 * (fx->tied ? 1 : 2) + 64 + 2 * per;
    T_CHECK(in.n_params == params, "params %zu want %zu", in.n_params, params);
    T_CHECK(in.weight_bytes == params * (fx->dtype == TD_DTYPE_F32 ? 4 : 2), "bytes %zu", in.weight_bytes);
    if (fx->arch == TD_ARCH_QWEN3) {
        T_CHECK(c->qk_norm && c->rope_scaling == TD_ROPE_NONE && c->rope_theta == 10000.0, "qwen3 cfg");
    } else {
        T_CHECK(!c->qk_norm && c->rope_scaling == TD_ROPE_LLAMA3 && c->rope_theta == 500000.0 &&
                    c->rope_factor == 8.0 && c->rope_low_freq_factor == 1.0 && c->rope_high_freq_factor == 4.0 &&
                    c->rope_orig_ctx == 64,
                "llama3 rope cfg");
    }
    T_CHECK(c->rms_eps == (fx->arch == TD_ARCH_QWEN3 ? 1e-6f : 1e-5f), "eps %g", (double)c->rms_eps);
    for (int i = 0; i < in.n_layer; i++)
        T_CHECK(m->w.layers[i].wq.data && m->w.layers[i].w_down.data && m->w.layers[i].attn_norm.data,
                "layer %d unbound", i);
    if (td_model_tokenizer(m))
        T_CHECK(td_tokenizer_n_vocab(td_model_tokenizer(m)) <= in.n_vocab, "tokenizer vocab");
    FILE *dn = fopen("/dev/null", "w");
    if (dn) {
        td_model_describe(m, dn);
        fclose(dn);
    }
done:
    td_model_free(m);
    t_end();
}

/* Deterministic robustness sweep: every truncation of a good file fails cleanly,
 * and random byte corruption of the header or of config.json never crashes. */
static void test_robust(void) {
    t_begin("model: every truncation fails cleanly; random header/config corruption never crashes");
    tmodel tm;
    tiny_tensors(&tm, "BF16");
    char d[512], p[512], pc[512];
    write_model("robust", NULL, &tm, d);
    file_in(p, d, "model.safetensors");
    file_in(pc, d, "config.json");
    char *orig = NULL, *cfg = NULL;
    size_t olen = 0, clen = 0;
    T_REQUIRE(td_read_file(p, &orig, &olen, NULL) == 0 && td_read_file(pc, &cfg, &clen, NULL) == 0, "read");
    int bad = 0;
    for (size_t cut = 0; cut < olen; cut += (cut < 1200 ? 1 : 7)) {
        FILE *f = fopen(p, "wb");
        fwrite(orig, 1, cut, f);
        fclose(f);
        for (int mode = 0; mode < 2; mode++) { /* mapped, then copied (use_mmap = 0) */
            td_err err = {0};
            td_model *m = NULL;
            td_model_params mp = {.use_mmap = mode ? 0 : 1};
            int rc = td_model_open_params(&m, d, &mp, &err);
            if (rc >= 0 || m || !err.msg[0] || !strstr(err.msg, "model.safetensors")) {
                if (bad++ < 3) printf("  cut %zu (%s): rc %d msg %s\n", cut, mode ? "copied" : "mapped", rc, err.msg);
            }
            td_model_free(m);
        }
    }
    T_CHECK(bad == 0, "%d truncations misreported", bad);
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--) hl = (hl << 8) | (unsigned char)orig[i];
    uint32_t seed = 12345;
    int opened = 0;
    char *buf = malloc(olen);
    for (int it = 0; it < 3000; it++) {
        memcpy(buf, orig, olen);
        int nflip = 1 + it % 4;
        for (int k = 0; k < nflip; k++) {
            seed = seed * 1103515245u + 12345u;
            size_t at = (seed >> 8) % (size_t)(8 + hl);
            seed = seed * 1103515245u + 12345u;
            static const char pool[] = "0123456789[]{}\",:-.eE \x00\xff";
            buf[at] = (it & 1) ? (char)(seed >> 16) : pool[(seed >> 16) % (sizeof pool - 1)];
        }
        FILE *f = fopen(p, "wb");
        fwrite(buf, 1, olen, f);
        fclose(f);
        td_err err = {0};
        td_model *m = NULL;
        int rc = td_model_open(&m, d, &err);
        if (rc == 0) opened++;
        else if (m || !err.msg[0]) bad++;
        td_model_free(m);
    }
    FILE *f = fopen(p, "wb");
    fwrite(orig, 1, olen, f);
    fclose(f);
    for (int it = 0; it < 2000; it++) {
        memcpy(buf, cfg, clen < olen ? clen : olen);
        for (int k = 0; k < 1 + it % 3; k++) {
            seed = seed * 1103515245u + 12345u;
            size_t at = (seed >> 8) % clen;
            seed = seed * 1103515245u + 12345u;
            static const char pool[] = "0123456789[]{}\",:-.eEn ";
            buf[at] = pool[(seed >> 16) % (sizeof pool - 1)];
        }
        f = fopen(pc, "wb");
        fwrite(buf, 1, clen, f);
        fclose(f);
        td_err err = {0};
        td_model *m = NULL;
        int rc = td_model_open(&m, d, &err);
        if (rc != 0 && (m || !err.msg[0] || (!strstr(err.msg, "config.json") && !strstr(err.msg, "tensor ")))) {
            if (bad++ < 3) printf("  config corruption: rc %d msg %s\n", rc, err.msg);
        }
        td_model_free(m);
    }
    T_CHECK(bad == 0, "%d corruptions misreported", bad);
    printf("  (%d of 3000 corrupted headers still valid)\n", opened);
    free(buf);
done:
    free(orig);
    free(cfg);
    t_end();
}

/* The bf16/f16 fixtures hold the f32 fixture's weights rounded: every bound tensor of
 * each must match the sharded f32 one within the format's rounding. */
static int cmp_tensor(const td_tensor *a, const td_tensor *b, double rel, const char *what) {
    if (!a->data && !b->data) return 0;
    if (!a->data || !b->data || a->n_dims != b->n_dims || a->shape[0] != b->shape[0] ||
        (a->n_dims == 2 && a->shape[1] != b->shape[1])) {
        printf("  %s: views differ\n", what);
        return 1;
    }
    size_t n = (size_t)a->shape[0] * (size_t)(a->n_dims == 2 ? a->shape[1] : 1);
    for (size_t j = 0; j < n; j++) {
        float x = read_val(a, j), y = read_val(b, j);
        double tol = rel * (x < 0 ? -x : x) + 1e-7;
        if ((x - y > tol) || (y - x > tol)) {
            printf("  %s[%zu]: %g vs %g\n", what, j, x, y);
            return 1;
        }
    }
    return 0;
}

static void test_fixture_rounding(void) {
    static const char *ref = "tests/fixtures/qwen3-rand";
    static const char *other[2] = {"tests/fixtures/qwen3-rand-bf16", "tests/fixtures/qwen3-rand-f16"};
    static const double rel[2] = {1.0 / 256, 1.0 / 2048};
    struct stat sb;
    if (stat(ref, &sb) != 0 || stat(other[0], &sb) != 0 || stat(other[1], &sb) != 0) {
        t_begin("model: fixture bf16/f16 weights equal rounded f32 weights (skipped: directory absent)");
        t_end();
        return;
    }
    t_begin("model: fixture bf16/f16 weights equal rounded f32 weights (sharded vs single-file views)");
    td_model *a = NULL, *b = NULL;
    td_err err = {0};
    T_REQUIRE(td_model_open(&a, ref, &err) == 0, "%s", err.msg);
    for (int k = 0; k < 2; k++) {
        T_REQUIRE(td_model_open(&b, other[k], &err) == 0, "%s", err.msg);
        int bad = 0;
        bad += cmp_tensor(&a->w.tok_embd, &b->w.tok_embd, rel[k], "tok_embd");
        bad += cmp_tensor(&a->w.out_norm, &b->w.out_norm, rel[k], "out_norm");
        bad += cmp_tensor(&a->w.lm_head, &b->w.lm_head, rel[k], "lm_head");
        for (int i = 0; i < a->cfg.n_layer && i < b->cfg.n_layer; i++) {
            const td_layer_w *la = &a->w.layers[i], *lb = &b->w.layers[i];
            const td_tensor *pa[] = {&la->attn_norm, &la->wq, &la->wk, &la->wv, &la->wo, &la->bq, &la->bk,
                                     &la->bv, &la->bo, &la->q_norm, &la->k_norm, &la->ffn_norm, &la->w_gate,
                                     &la->w_up, &la->w_down};
            const td_tensor *pb[] = {&lb->attn_norm, &lb->wq, &lb->wk, &lb->wv, &lb->wo, &lb->bq, &lb->bk,
                                     &lb->bv, &lb->bo, &lb->q_norm, &lb->k_norm, &lb->ffn_norm, &lb->w_gate,
                                     &lb->w_up, &lb->w_down};
            for (size_t j = 0; j < sizeof pa / sizeof pa[0]; j++) bad += cmp_tensor(pa[j], pb[j], rel[k], other[k]);
        }
        T_CHECK(bad == 0, "%s: %d tensors differ from %s", other[k], bad, ref);
        td_model_free(b);
        b = NULL;
    }
done:
    td_model_free(a);
    td_model_free(b);
    t_end();
}

/* A named pipe where a weights, GGUF or JSON file is expected: refused at once
 * with a message naming the path (an open of a FIFO for reading would otherwise
 * wait for a writer forever). The alarm turns a regression into a failure, not a
 * hung suite: its default action ends the program, which run.sh counts. */
static void test_fifo(void) {
    t_begin("io: a FIFO in place of a model file is refused without blocking");
    char p[512];
    snprintf(p, sizeof p, "%s/fifo.safetensors", g_root);
    T_REQUIRE(mkfifo(p, 0600) == 0, "mkfifo %s", p);
    alarm(20);
    td_err err = {0};
    td_st_file *f = (td_st_file *)1;
    int rc = td_st_open(&f, p, &err);
    T_CHECK(rc == TD_EIO && f == NULL && strstr(err.msg, "not a regular file") && strstr(err.msg, p), "st: %d %s", rc, err.msg);
    td_gguf_file *g = (td_gguf_file *)1;
    memset(&err, 0, sizeof err);
    rc = td_gguf_open(&g, p, &err);
    T_CHECK(rc == TD_EIO && g == NULL && strstr(err.msg, "not a regular file") && strstr(err.msg, p), "gguf: %d %s", rc, err.msg);
    char *data = (char *)1;
    size_t len = 7;
    memset(&err, 0, sizeof err);
    rc = td_read_file(p, &data, &len, &err);
    T_CHECK(rc == TD_EIO && data == NULL && len == 0 && strstr(err.msg, "not a regular file"), "read: %d %s", rc, err.msg);
    memset(&err, 0, sizeof err); /* a directory is not a file either */
    rc = td_read_file(g_root, &data, &len, &err);
    T_CHECK(rc == TD_EIO && data == NULL && strstr(err.msg, "not a regular file"), "dir: %d %s", rc, err.msg);
    alarm(0);
done:
    unlink(p);
    t_end();
}

int main(void) {
    snprintf(g_root, sizeof g_root, "%s/td_model_XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    if (!mkdtemp(g_root)) {
        printf("FAIL model: cannot create temp dir\n");
        return 1;
    }
    test_good();
    test_copy();
    test_sharded();
    test_dtypes();
    test_mixed();
    test_llama_bias();
    test_bad_files();
    test_bad_config();
    test_config_parse();
    test_missing_files();
    test_tokenizer();
    test_robust();
    test_fifo();
    static const fixture fx[] = {
        {"tests/fixtures/qwen3-rand", TD_ARCH_QWEN3, 128, 1, TD_DTYPE_F32, 2},
        {"tests/fixtures/qwen3-rand-bf16", TD_ARCH_QWEN3, 128, 1, TD_DTYPE_BF16, 1},
        {"tests/fixtures/qwen3-rand-f16", TD_ARCH_QWEN3, 128, 1, TD_DTYPE_F16, 1},
        {"tests/fixtures/llama-rand", TD_ARCH_LLAMA, 160, 0, TD_DTYPE_F32, 1},
    };
    for (size_t i = 0; i < sizeof fx / sizeof fx[0]; i++) test_fixture(&fx[i]);
    test_fixture_rounding();
    rm_tree(g_root);
    return t_exit();
}
