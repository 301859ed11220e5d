/* gguf_write — write a loaded model as a llama.cpp-compatible GGUF file.
 *
 * Design: the output types are one table (qz_types: name, TD_DTYPE_*, GGUF
 * general.file_type). Matrices (embeddings and projections) are stored in the
 * chosen type (the output matrix, attn_v and ffn_down as td_model_quant_type chooses,
 * as the in-memory quantizer does); 1-D tensors (norms, biases) in F32, as llama.cpp's
 * converter does. Each tensor is converted row by row through an f32 scratch
 * row (f16/bf16 round to nearest even; block formats by td_quantize_row) and
 * streamed to the writer, so memory stays at one row; a row already in the
 * output type is copied unchanged. Metadata follows llama.cpp's names (general.*,
 * <arch>.*, tokenizer.ggml.*); the llama architecture's q/k rows are permuted
 * to llama.cpp's interleaved rope layout (model_gguf.c undoes it), and Llama 3
 * rope scaling is written both as llama.cpp's rope_freqs.weight factors and as
 * its parameters (tandem.rope.llama3.*). The tokenizer comes from the model
 * directory's tokenizer.json, or is copied key by key from a GGUF input.
 * The output is written to PATH.tmp and renamed when complete. */
#define _POSIX_C_SOURCE 200809L
#include "io/gguf.h"
#include "model/model.h"
#include "nn/kernels.h"
#include "nn/quant.h"
#include "tok/tok_gguf.h"
#include "util/util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static const struct qz_type {
    const char *name;
    int dtype;       /* TD_DTYPE_* of the matrices, or a TD_QSCHEME_* mix (td_model_quant_type) */
    uint32_t ftype;  /* GGUF general.file_type (llama_ftype) */
} qz_types[] = {
    {"f32", TD_DTYPE_F32, 0},
    {"f16", TD_DTYPE_F16, 1},
    {"bf16", TD_DTYPE_BF16, 32},
    {"q8_0", TD_DTYPE_Q8_0, 7},
    {"q4_0", TD_DTYPE_Q4_0, 2},
    {"q4_1", TD_DTYPE_Q4_1, 3},
    {"q5_0", TD_DTYPE_Q5_0, 8},
    {"q5_1", TD_DTYPE_Q5_1, 9},
    {"iq4_nl", TD_DTYPE_IQ4_NL, 25},
    {"iq4_xs", TD_DTYPE_IQ4_XS, 30},
    {"q2_k", TD_DTYPE_Q2_K, 10},
    {"q3_k", TD_DTYPE_Q3_K, 11},     /* llama.cpp calls a file of mostly Q3_K "Q3_K_S" */
    {"q3_k_m", TD_QSCHEME_Q3_K_M, 12},
    {"q4_k", TD_DTYPE_Q4_K, 14},     /* llama.cpp calls a file of mostly Q4_K "Q4_K_S" */
    {"q4_k_m", TD_QSCHEME_Q4_K_M, 15},
    {"q5_k", TD_DTYPE_Q5_K, 16},
    {"q5_k_m", TD_QSCHEME_Q5_K_M, 17},
    {"q6_k", TD_DTYPE_Q6_K, 18},
};
#define QZ_N_TYPES (sizeof qz_types / sizeof qz_types[0])

/* One row of n values in dtype into out; returns its bytes. */
static size_t qz_row_from_f32(int dtype, const float *in, int64_t n, void *out) {
    switch (dtype) {
    case TD_DTYPE_F32: memcpy(out, in, (size_t)n * 4); break;
    case TD_DTYPE_F16: for (int64_t i = 0; i < n; i++) ((uint16_t *)out)[i] = td_f32_to_f16(in[i]); break;
    case TD_DTYPE_BF16: for (int64_t i = 0; i < n; i++) ((uint16_t *)out)[i] = td_f32_to_bf16(in[i]); break;
    default: td_quantize_row(dtype, in, out, n); break;
    }
    return td_dtype_row_bytes(dtype, n);
}

/* HF row r of a q/k projection goes to GGUF row qz_perm(r) (llama.cpp's permute). */
static int64_t qz_perm(int64_t r, int D) {
    int64_t h = r / D, w = r % D, half = w / (D / 2), i = w % (D / 2);
    return h * D + 2 * i + half;
}

typedef struct qz_item {
    const td_tensor *t;
    char name[96];
    int64_t d0, d1;       /* rows, row length (d1 = d0 for 1-D, rows = 1) */
    int nd, dtype, qk;
} qz_item;

static int qz_metadata(td_gguf_writer *w, const td_model *m, const struct qz_type *qt, const char *arch, td_err *err) {
    const td_config *c = &m->cfg;
    char k[128];
#define QZ_KEY(s) (snprintf(k, sizeof k, "%s.%s", arch, s), k)
    td_gguf_w_str(w, "general.architecture", arch);
    const char *base = strrchr(m->dir, '/');
    td_gguf_w_str(w, "general.name", base ? base + 1 : m->dir);
    td_gguf_w_u32(w, "general.file_type", qt->ftype);
    td_gguf_w_u32(w, "general.quantization_version", 2);
    td_gguf_w_u32(w, QZ_KEY("vocab_size"), (uint32_t)c->n_vocab);
    td_gguf_w_u32(w, QZ_KEY("context_length"), (uint32_t)c->n_ctx_train);
    td_gguf_w_u32(w, QZ_KEY("embedding_length"), (uint32_t)c->n_embd);
    td_gguf_w_u32(w, QZ_KEY("block_count"), (uint32_t)c->n_layer);
    td_gguf_w_u32(w, QZ_KEY("feed_forward_length"), (uint32_t)c->n_ff);
    td_gguf_w_u32(w, QZ_KEY("attention.head_count"), (uint32_t)c->n_head);
    td_gguf_w_u32(w, QZ_KEY("attention.head_count_kv"), (uint32_t)c->n_kv_head);
    td_gguf_w_u32(w, QZ_KEY("attention.key_length"), (uint32_t)c->head_dim);
    td_gguf_w_u32(w, QZ_KEY("attention.value_length"), (uint32_t)c->head_dim);
    td_gguf_w_u32(w, QZ_KEY("rope.dimension_count"), (uint32_t)c->head_dim);
    td_gguf_w_f32(w, QZ_KEY("rope.freq_base"), (float)c->rope_theta);
    td_gguf_w_f32(w, QZ_KEY("attention.layer_norm_rms_epsilon"), c->rms_eps);
    if (c->rope_scaling == TD_ROPE_LLAMA3) {
        td_gguf_w_u32(w, QZ_KEY("rope.scaling.original_context_length"), (uint32_t)c->rope_orig_ctx);
        td_gguf_w_f32(w, "tandem.rope.llama3.factor", (float)c->rope_factor);
        td_gguf_w_f32(w, "tandem.rope.llama3.low_freq_factor", (float)c->rope_low_freq_factor);
        td_gguf_w_f32(w, "tandem.rope.llama3.high_freq_factor", (float)c->rope_high_freq_factor);
    }
#undef QZ_KEY
    int32_t tok_bos = m->tok ? td_tokenizer_bos(m->tok) : -1;
    int rc = 0;
    if (m->gguf) { /* a GGUF input: its tokenizer keys as they are */
        for (int i = 0; i < m->gguf->n_kvs; i++)
            if (!strncmp(m->gguf->kvs[i].key, "tokenizer.", 10)) td_gguf_w_copy(w, &m->gguf->kvs[i]);
        return 0;
    }
    if (m->tok) {
        char tj[1200], tc[1200];
        snprintf(tj, sizeof tj, "%s/tokenizer.json", m->dir);
        snprintf(tc, sizeof tc, "%s/tokenizer_config.json", m->dir);
        struct stat sb;
        if ((rc = td_tok_gguf_write(w, tj, stat(tc, &sb) == 0 ? tc : NULL, c->n_vocab, tok_bos >= 0, err))) return rc;
    }
    int32_t bos = c->bos_id >= 0 ? c->bos_id : tok_bos;
    if (bos >= 0) td_gguf_w_u32(w, "tokenizer.ggml.bos_token_id", (uint32_t)bos);
    if (c->n_eos > 0) td_gguf_w_u32(w, "tokenizer.ggml.eos_token_id", (uint32_t)c->eos_ids[0]);
    if (c->n_eos > 1) td_gguf_w_u32(w, "tokenizer.ggml.eot_token_id", (uint32_t)c->eos_ids[1]);
    return 0;
}

static int qz_write(td_gguf_writer *w, const td_model *m, const struct qz_type *qt, const char *arch, td_err *err) {
    const td_config *c = &m->cfg;
    int rc = qz_metadata(w, m, qt, arch, err);
    if (rc) return rc;
    /* the tensor list */
    int n_items = 0, cap = (c->n_layer + 1) * TD_WSPEC_MAX;
    qz_item *it = calloc((size_t)cap, sizeof *it);
    float *rope = NULL;
    if (!it) return td_seterr(err, TD_ENOMEM, "out of memory");
    td_wspec s[TD_WSPEC_MAX];
    int64_t maxrow = c->head_dim;
    for (int l = -1; l < c->n_layer; l++) {
        int n = td_weight_specs((td_model *)m, l, s);
        for (int j = 0; j < n; j++) {
            if (!s[j].when) continue;
            qz_item *q = &it[n_items++];
            q->t = s[j].t;
            if (l < 0) snprintf(q->name, sizeof q->name, "%s", s[j].gguf);
            else snprintf(q->name, sizeof q->name, "blk.%d.%s", l, s[j].gguf);
            q->nd = s[j].nd;
            q->d0 = s[j].nd == 2 ? s[j].d0 : 1;
            q->d1 = s[j].nd == 2 ? s[j].d1 : s[j].d0;
            int role = s[j].t == &m->w.lm_head || (c->tied && s[j].t == &m->w.tok_embd) ? TD_QROLE_OUTPUT
                       : l >= 0 && s[j].t == &m->w.layers[l].wv                             ? TD_QROLE_ATTN_V
                       : l >= 0 && s[j].t == &m->w.layers[l].w_down                         ? TD_QROLE_FFN_DOWN
                                                                                            : TD_QROLE_MATRIX;
            q->dtype = s[j].nd == 2 ? td_model_quant_type(qt->dtype, role, q->d1) : TD_DTYPE_F32;
            if (td_dtype_check_row(q->dtype, q->d1, q->name, err)) {
                free(it);
                return err ? err->code : TD_EFORMAT;
            }
            q->qk = c->arch == TD_ARCH_LLAMA ? s[j].qk : 0;
            if (q->d1 > maxrow) maxrow = q->d1;
            const td_gguf_type *gt = td_gguf_type_by_dtype(q->dtype);
            int64_t ne[2] = {q->d1, q->d0};
            td_gguf_w_tensor(w, q->name, gt, q->nd, ne);
        }
    }
    if (c->rope_scaling == TD_ROPE_LLAMA3) {
        int64_t ne[1] = {c->head_dim / 2};
        td_gguf_w_tensor(w, "rope_freqs.weight", td_gguf_type_by_dtype(TD_DTYPE_F32), 1, ne);
    }
    float *row = malloc((size_t)maxrow * sizeof *row);
    void *out = malloc((size_t)maxrow * 4);
    if (!row || !out) rc = td_seterr(err, TD_ENOMEM, "out of memory");
    if (!rc) rc = td_gguf_w_write_header(w, err);
    for (int i = 0; i < n_items && !rc; i++) {
        const qz_item *q = &it[i];
        size_t src_row = td_dtype_row_bytes(q->t->dtype, q->d1);
        for (int64_t r = 0; r < q->d0 && !rc; r++) {
            /* GGUF row r holds HF row p where qz_perm(p) = r; writing HF rows in
               the order of their destination: find p by inverting the permutation */
            int64_t p = r;
            if (q->qk) {
                int D = c->head_dim;
                int64_t h = r / D, w2 = r % D, i2 = w2 / 2, half = w2 % 2;
                p = h * D + half * (D / 2) + i2;
                TD_ASSERT(qz_perm(p, D) == r);
            }
            const unsigned char *src = (const unsigned char *)q->t->data + (size_t)p * src_row;
            if (q->t->dtype == q->dtype) { /* already in the output type: the bytes as they are */
                rc = td_gguf_w_write_data(w, src, src_row, err);
                continue;
            }
            td_to_f32(row, src, q->t->dtype, (size_t)q->d1);
            size_t nb = qz_row_from_f32(q->dtype, row, q->d1, out);
            rc = td_gguf_w_write_data(w, out, nb, err);
        }
    }
    if (!rc && c->rope_scaling == TD_ROPE_LLAMA3) {
        rope = malloc((size_t)(c->head_dim / 2) * sizeof *rope);
        if (!rope) rc = td_seterr(err, TD_ENOMEM, "out of memory");
        else {
            td_llama3_rope_factors(c, rope);
            rc = td_gguf_w_write_data(w, rope, (size_t)(c->head_dim / 2) * sizeof *rope, err);
        }
    }
    free(rope);
    free(row);
    free(out);
    free(it);
    return rc;
}

int td_model_quantize(const td_model *m, const char *path, const char *type, td_err *err) {
    if (!m || !path || !type) return td_seterr(err, TD_EINVAL, "td_model_quantize: NULL argument");
    const struct qz_type *qt = NULL;
    char names[160] = "";
    for (size_t i = 0; i < QZ_N_TYPES; i++) {
        if (!strcmp(qz_types[i].name, type)) qt = &qz_types[i];
        snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s", i ? ", " : "", qz_types[i].name);
    }
    if (!qt) return td_seterr(err, TD_EINVAL, "unknown type \"%.32s\" (%s)", type, names);
    const char *arch = m->cfg.arch == TD_ARCH_LLAMA ? "llama" : "qwen3";
    char tmp[4200];
    if (snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp) return td_seterr(err, TD_ERANGE, "%s: path too long", path);
    td_gguf_writer *w = NULL;
    int rc = td_gguf_w_open(&w, tmp, TD_GGUF_DEFAULT_ALIGNMENT, err);
    if (rc) return rc;
    rc = qz_write(w, m, qt, arch, err);
    td_err ce = {0};
    int crc = td_gguf_w_close(w, rc == 0, &ce);
    if (!rc && crc) rc = td_seterr(err, crc, "%s", ce.msg);
    if (!rc && rename(tmp, path) != 0) {
        remove(tmp);
        rc = td_seterr(err, TD_EIO, "%s: cannot rename %s into place", path, tmp);
    }
    return rc;
}
