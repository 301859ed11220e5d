/* model_quant — turn a loaded model's matmul weights into Q8_0 / Q4_0 in memory.
 *
 * Design: td_model_quantize_weights walks the 2-D matmul weights (q/k/v/o, gate/up/down,
 * the embedding and an untied lm_head), quantizes each row from its exact f32
 * value with td_quantize_row into one malloc'd buffer per tensor (owned by the
 * model, freed with it) and rebinds the tensor to it. Norm weights and biases
 * stay as loaded. Tensor choice follows llama.cpp's quantizer: the embedding
 * gets the requested type; the output matrix (lm_head, or the embedding when
 * tied) gets Q8_0 for --type q4_0 — llama.cpp uses Q6_K there, which tandem
 * does not implement (llama.cpp itself falls back to Q8_0 when rows are not a
 * multiple of 256). Tensors already quantized are kept. Every matmul input
 * width must be a multiple of 32; otherwise nothing is changed and the error
 * names the dimension. The same per-tensor choice (td_model_quant_type) serves
 * the GGUF writer, so files and in-memory quantization agree. */
#include "model/model.h"
#include "nn/kernels.h"
#include "nn/quant.h"
#include "util/util.h"

#include <stdlib.h>
#include <string.h>

void td_model_main_dtype(td_model *m) {
    int best = TD_DTYPE_F32;
    for (int d = 0; d < TD_DTYPE_COUNT; d++)
        if (m->dtype_bytes[d] > m->dtype_bytes[best]) best = d;
    m->dtype = best;
}

int td_model_quant_type(int dtype, int is_output) {
    return is_output && dtype == TD_DTYPE_Q4_0 ? TD_DTYPE_Q8_0 : dtype;
}

/* Quantize tensor t ([rows][K]) to dt into a new buffer; rebind t on success. */
static int mq_tensor(td_model *m, td_tensor *t, int dt, const char *what, td_err *err) {
    if (!t->data || td_dtype_is_quant(t->dtype)) return 0;
    int64_t rows = t->shape[0], K = t->shape[1];
    size_t rb = td_dtype_row_bytes(dt, K), old = td_dtype_row_bytes(t->dtype, K) * (size_t)rows;
    void **no = realloc(m->owned, (size_t)(m->n_owned + 1) * sizeof *no);
    if (!no) return td_seterr(err, TD_ENOMEM, "out of memory quantizing %s", what);
    m->owned = no;
    char *buf = malloc(rb * (size_t)rows + 1);
    float *row = malloc(sizeof(float) * (size_t)K);
    if (!buf || !row) {
        free(buf);
        free(row);
        return td_seterr(err, TD_ENOMEM, "out of memory quantizing %s (%lld x %lld)", what, (long long)rows,
                         (long long)K);
    }
    for (int64_t r = 0; r < rows; r++) {
        td_to_f32(row, (const char *)t->data + (size_t)r * td_dtype_row_bytes(t->dtype, K), t->dtype, (size_t)K);
        td_quantize_row(dt, row, buf + (size_t)r * rb, K);
    }
    free(row);
    m->owned[m->n_owned++] = buf;
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
    int rc;
    int tied = m->w.lm_head.data == m->w.tok_embd.data;
    if ((rc = mq_tensor(m, &m->w.tok_embd, td_model_quant_type(dtype, tied), "embed_tokens", err))) return rc;
    if (tied) m->w.lm_head = m->w.tok_embd;
    else if ((rc = mq_tensor(m, &m->w.lm_head, td_model_quant_type(dtype, 1), "lm_head", err))) return rc;
    for (int l = 0; l < c->n_layer; l++) {
        td_layer_w *L = &m->w.layers[l];
        td_tensor *ts[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
        for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++)
            if ((rc = mq_tensor(m, ts[i], dtype, "a layer weight", err))) return rc;
    }
    td_model_main_dtype(m);
    return 0;
}
