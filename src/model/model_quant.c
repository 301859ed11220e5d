/* model_quant — turn a loaded model's matmul weights into Q8_0 / Q4_0 / k-quants in memory.
 *
 * Design: td_model_quantize_weights walks the 2-D matmul weights (q/k/v/o, gate/up/down,
 * the embedding and an untied lm_head), quantizes each row from its exact f32
 * value with td_quantize_row into its place in one arena (owned by the
 * model, freed with it) and rebinds the tensor to it. Norm weights and biases
 * stay as loaded. Tensor choice follows llama.cpp's quantizer: the embedding
 * gets the requested type; the output matrix (lm_head, or the embedding when
 * tied) gets Q8_0 for q4_0 and Q6_K for q5_0 / q4_k / q5_k (llama.cpp uses Q6_K for
 * q4_0 too where rows are a multiple of 256); rows that do not fill whole k-quant
 * super-blocks get Q8_0 (td_model_quant_type). Tensors already quantized are kept. Every matmul input
 * width must be a multiple of 32; otherwise nothing is changed and the error
 * names the dimension. The same per-tensor choice (td_model_quant_type) serves
 * the GGUF writer, so files and in-memory quantization agree. The arena is
 * 2 MiB-aligned and advised
 * MADV_HUGEPAGE: a decode streams every weight once per token, and with 4 KiB
 * pages the TLB misses cost bandwidth. */
#define _GNU_SOURCE
#include "model/model.h"
#include "nn/kernels.h"
#include "nn/quant.h"
#include "util/util.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define HUGE_ALIGN ((size_t)2 << 20)

void *td_model_alloc_huge(size_t n) {
    size_t sz = (n + HUGE_ALIGN - 1) & ~(HUGE_ALIGN - 1);
    void *p = aligned_alloc(HUGE_ALIGN, sz);
    if (p) madvise(p, sz, MADV_HUGEPAGE); /* advice only: without it the memory still works */
    return p;
}

void td_model_main_dtype(td_model *m) {
    int best = TD_DTYPE_F32;
    for (int d = 0; d < TD_DTYPE_COUNT; d++)
        if (m->dtype_bytes[d] > m->dtype_bytes[best]) best = d;
    m->dtype = best;
}

int td_model_quant_type(int scheme, int role, int64_t k) {
    int mixed = scheme == TD_QSCHEME_Q4_K_M || scheme == TD_QSCHEME_Q5_K_M || scheme == TD_QSCHEME_Q3_K_M;
    int t = scheme == TD_QSCHEME_Q4_K_M   ? TD_DTYPE_Q4_K
            : scheme == TD_QSCHEME_Q5_K_M ? TD_DTYPE_Q5_K
            : scheme == TD_QSCHEME_Q3_K_M ? TD_DTYPE_Q3_K
                                          : scheme;
    if (!td_dtype_is_quant(t)) return t >= 0 && t < TD_DTYPE_COUNT ? t : -1;
    if (role == TD_QROLE_OUTPUT) t = t == TD_DTYPE_Q4_0 ? TD_DTYPE_Q8_0 : t == TD_DTYPE_Q8_0 ? t : TD_DTYPE_Q6_K;
    else if (mixed && (role == TD_QROLE_ATTN_V || role == TD_QROLE_FFN_DOWN))
        t = t == TD_DTYPE_Q3_K ? TD_DTYPE_Q4_K : TD_DTYPE_Q6_K;
    if (td_dtype_is_kquant(t) && k % TD_QKK)
        t = t == TD_DTYPE_Q4_K ? TD_DTYPE_Q5_0 : t == TD_DTYPE_IQ4_XS || t == TD_DTYPE_Q3_K || t == TD_DTYPE_Q2_K ? TD_DTYPE_IQ4_NL
                                                                                                     : TD_DTYPE_Q8_0;
    return t;
}

int td_tensors_quantize(td_tensor *const *ts, const int *dts, int n, void **arena_out, size_t *bytes_out, td_err *err) {
    *arena_out = NULL;
    if (bytes_out) *bytes_out = 0;
    size_t total = 0, kept = 0;
    for (int i = 0; i < n; i++) {
        const td_tensor *t = ts[i];
        if (!t->data || td_dtype_is_quant(t->dtype)) continue; /* kept as loaded */
        if (t->n_dims != 2 || !td_dtype_is_quant(dts[i]) || t->shape[1] % td_dtype_block(dts[i]))
            return td_seterr(err, TD_EUNSUPPORTED, "cannot quantize a [%lld, %lld] tensor to %s: rows must be a multiple of %d values",
                             (long long)t->shape[0], (long long)(t->n_dims == 2 ? t->shape[1] : 0), td_dtype_name(dts[i]),
                             td_dtype_block(dts[i]));
        total += (td_dtype_row_bytes(dts[i], t->shape[1]) * (size_t)t->shape[0] + 63) & ~(size_t)63;
    }
    if (!total) return 0;
    char *arena = td_model_alloc_huge(total);
    if (!arena) return td_seterr(err, TD_ENOMEM, "out of memory quantizing weights (%zu bytes)", total);
    int64_t maxk = 0;
    for (int i = 0; i < n; i++)
        if (ts[i]->n_dims == 2 && ts[i]->shape[1] > maxk) maxk = ts[i]->shape[1];
    float *row = malloc(sizeof(float) * (size_t)maxk);
    if (!row) { free(arena); return td_seterr(err, TD_ENOMEM, "out of memory quantizing weights"); }
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        td_tensor *t = ts[i];
        if (!t->data || td_dtype_is_quant(t->dtype)) continue;
        int64_t rows = t->shape[0], K = t->shape[1];
        size_t rb = td_dtype_row_bytes(dts[i], K), ib = td_dtype_row_bytes(t->dtype, K);
        for (int64_t r = 0; r < rows; r++) {
            td_to_f32(row, (const char *)t->data + (size_t)r * ib, t->dtype, (size_t)K);
            td_quantize_row(dts[i], row, arena + off + (size_t)r * rb, K);
        }
        t->data = arena + off;
        t->file = NULL;
        t->dtype = dts[i];
        kept += rb * (size_t)rows;
        off += (rb * (size_t)rows + 63) & ~(size_t)63;
    }
    free(row);
    *arena_out = arena;
    if (bytes_out) *bytes_out = kept;
    return 0;
}

int td_model_quantize_weights(td_model *m, int dtype, td_err *err) {
    int base = td_model_quant_type(dtype, TD_QROLE_MATRIX, TD_QKK);
    if (!m || base < 0 || !td_dtype_is_quant(base))
        return td_seterr(err, TD_EINVAL, "td_model_quantize_weights: no model or not a quantized dtype");
    const td_config *c = &m->cfg;
    struct { const char *name; int v; } dims[] = {
        {"hidden_size", c->n_embd}, {"num_attention_heads*head_dim", c->n_head * c->head_dim},
        {"intermediate_size", c->n_ff}};
    for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++)
        if (dims[i].v % TD_QK)
            return td_seterr(err, TD_EUNSUPPORTED, "cannot quantize to %s: %s = %d is not a multiple of %d",
                             td_dtype_name(base), dims[i].name, dims[i].v, TD_QK);
    /* the tensors (with their dtypes before and after), then one arena for all of them */
    int tied = m->w.lm_head.data == m->w.tok_embd.data, n = 0;
    int nmax = 2 + 7 * c->n_layer;
    td_tensor **ts = malloc(sizeof *ts * (size_t)nmax);
    int *dts = malloc(sizeof *dts * (size_t)nmax), *old = malloc(sizeof *old * (size_t)nmax);
    void **no = realloc(m->owned, (size_t)(m->n_owned + 1) * sizeof *no);
    if (no) m->owned = no;
    if (!ts || !dts || !old || !no) {
        free(ts); free(dts); free(old);
        return td_seterr(err, TD_ENOMEM, "out of memory quantizing the model");
    }
    ts[n] = &m->w.tok_embd; dts[n++] = td_model_quant_type(dtype, tied ? TD_QROLE_OUTPUT : TD_QROLE_MATRIX, c->n_embd);
    if (!tied) { ts[n] = &m->w.lm_head; dts[n++] = td_model_quant_type(dtype, TD_QROLE_OUTPUT, c->n_embd); }
    for (int l = 0; l < c->n_layer; l++) {
        td_layer_w *L = &m->w.layers[l];
        td_tensor *lt[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
        for (size_t i = 0; i < sizeof lt / sizeof lt[0]; i++) {
            int role = lt[i] == &L->wv ? TD_QROLE_ATTN_V : lt[i] == &L->w_down ? TD_QROLE_FFN_DOWN : TD_QROLE_MATRIX;
            ts[n] = lt[i];
            dts[n++] = td_model_quant_type(dtype, role, lt[i]->n_dims == 2 ? lt[i]->shape[1] : 0);
        }
    }
    for (int i = 0; i < n; i++) old[i] = ts[i]->data && !td_dtype_is_quant(ts[i]->dtype) ? ts[i]->dtype : -1;
    void *arena = NULL;
    int rc = td_tensors_quantize(ts, dts, n, &arena, NULL, err);
    if (arena) m->owned[m->n_owned++] = arena;
    for (int i = 0; !rc && i < n; i++) {
        if (old[i] < 0) continue;
        const td_tensor *t = ts[i];
        size_t was = td_dtype_row_bytes(old[i], t->shape[1]) * (size_t)t->shape[0];
        size_t now = td_dtype_row_bytes(t->dtype, t->shape[1]) * (size_t)t->shape[0];
        m->dtype_count[old[i]]--;
        m->dtype_bytes[old[i]] -= was;
        m->weight_bytes -= was;
        m->dtype_count[t->dtype]++;
        m->dtype_bytes[t->dtype] += now;
        m->weight_bytes += now;
    }
    free(ts); free(dts); free(old);
    if (tied) m->w.lm_head = m->w.tok_embd;
    if (rc) return rc;
    td_model_main_dtype(m);
    return 0;
}
