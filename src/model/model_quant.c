/* model_quant — turn a loaded model's matmul weights into Q8_0 / Q4_0 in memory.
 *
 * Design: td_model_quantize_weights walks the 2-D matmul weights (q/k/v/o, gate/up/down,
 * the embedding and an untied lm_head), quantizes each row from its exact f32
 * value with td_quantize_row into its place in one arena (owned by the
 * model, freed with it) and rebinds the tensor to it. Norm weights and biases
 * stay as loaded. Tensor choice follows llama.cpp's quantizer: the embedding
 * gets the requested type; the output matrix (lm_head, or the embedding when
 * tied) gets Q8_0 for --type q4_0 — llama.cpp uses Q6_K there, which tandem
 * does not implement (llama.cpp itself falls back to Q8_0 when rows are not a
 * multiple of 256). Tensors already quantized are kept. Every matmul input
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

int td_model_quant_type(int dtype, int is_output) {
    return is_output && dtype == TD_DTYPE_Q4_0 ? TD_DTYPE_Q8_0 : dtype;
}

typedef struct { td_tensor *t; int dt; const char *what; } mq_item;

static size_t mq_bytes(const mq_item *it) {
    if (!it->t->data || td_dtype_is_quant(it->t->dtype)) return 0; /* kept as loaded */
    return (td_dtype_row_bytes(it->dt, it->t->shape[1]) * (size_t)it->t->shape[0] + 63) & ~(size_t)63;
}

/* Quantize it->t ([rows][K]) to it->dt into buf; rebind the tensor. */
static int mq_tensor(td_model *m, const mq_item *it, char *buf, td_err *err) {
    td_tensor *t = it->t;
    int dt = it->dt;
    int64_t rows = t->shape[0], K = t->shape[1];
    size_t rb = td_dtype_row_bytes(dt, K), old = td_dtype_row_bytes(t->dtype, K) * (size_t)rows;
    float *row = malloc(sizeof(float) * (size_t)K);
    if (!row) return td_seterr(err, TD_ENOMEM, "out of memory quantizing %s", it->what);
    for (int64_t r = 0; r < rows; r++) {
        td_to_f32(row, (const char *)t->data + (size_t)r * td_dtype_row_bytes(t->dtype, K), t->dtype, (size_t)K);
        td_quantize_row(dt, row, buf + (size_t)r * rb, K);
    }
    free(row);
    m->dtype_count[t->dtype]--;
    m->dtype_bytes[t->dtype] -= old;
    m->weight_bytes -= old;
    t->data = buf;
    t->dtype = dt;
    m->dtype_count[dt]++;
    m->dtype_bytes[dt] += rb * (size_t)rows;
    m->weight_bytes += rb * (size_t)rows;
    return 0;
}

int td_model_quantize_weights(td_model *m, int dtype, td_err *err) {
    if (!m || !td_dtype_is_quant(dtype)) return td_seterr(err, TD_EINVAL, "td_model_quantize_weights: no model or not a quantized dtype");
    const td_config *c = &m->cfg;
    struct { const char *name; int v; } dims[] = {
        {"hidden_size", c->n_embd}, {"num_attention_heads*head_dim", c->n_head * c->head_dim},
        {"intermediate_size", c->n_ff}};
    for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++)
        if (dims[i].v % TD_QK)
            return td_seterr(err, TD_EUNSUPPORTED, "cannot quantize to %s: %s = %d is not a multiple of %d",
                             td_dtype_name(dtype), dims[i].name, dims[i].v, TD_QK);
    /* the tensors, then one arena for all of them (one allocation, one huge-page region) */
    int tied = m->w.lm_head.data == m->w.tok_embd.data, n = 0;
    mq_item *items = malloc(sizeof *items * (size_t)(2 + 7 * c->n_layer));
    void **no = realloc(m->owned, (size_t)(m->n_owned + 1) * sizeof *no);
    if (no) m->owned = no;
    if (!items || !no) {
        free(items);
        return td_seterr(err, TD_ENOMEM, "out of memory quantizing the model");
    }
    items[n++] = (mq_item){&m->w.tok_embd, td_model_quant_type(dtype, tied), "embed_tokens"};
    if (!tied) items[n++] = (mq_item){&m->w.lm_head, td_model_quant_type(dtype, 1), "lm_head"};
    for (int l = 0; l < c->n_layer; l++) {
        td_layer_w *L = &m->w.layers[l];
        td_tensor *ts[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
        for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) items[n++] = (mq_item){ts[i], dtype, "a layer weight"};
    }
    size_t total = 0;
    for (int i = 0; i < n; i++) total += mq_bytes(&items[i]);
    char *arena = total ? td_model_alloc_huge(total) : NULL;
    int rc = 0;
    if (total && !arena) rc = td_seterr(err, TD_ENOMEM, "out of memory quantizing the model (%zu bytes)", total);
    size_t off = 0;
    for (int i = 0; !rc && i < n; i++) {
        size_t nb = mq_bytes(&items[i]);
        if (nb) rc = mq_tensor(m, &items[i], arena + off, err);
        off += nb;
    }
    free(items);
    if (arena) m->owned[m->n_owned++] = arena; /* owned even after an error: tensors may point into it */
    if (tied) m->w.lm_head = m->w.tok_embd;
    if (rc) return rc;
    td_model_main_dtype(m);
    return 0;
}
