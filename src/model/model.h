/* model — a loaded model: its config, its tokenizer and views of its weights.
 *
 * Design: the loader (model.c, with io/safetensors.c) parses config.json, maps
 * every safetensors shard read-only, validates each tensor's dtype, shape and
 * byte range against the config, and fills td_weights with typed views into the
 * mappings. Then, unless td_model_params.use_mmap says to map (small models by
 * default), the bound weights are copied into anonymous 2 MiB pages.
 * The forward (nn/forward.c) reads only td_model.cfg and td_model.w. */
#ifndef TD_MODEL_H
#define TD_MODEL_H

#include "tandem.h"
#include <stddef.h>
#include <stdint.h>

/* A typed, read-only view of one weight tensor inside a mapping. */
typedef struct td_tensor {
    const void *data;   /* borrowed from the mapping; NULL if absent */
    int dtype;          /* TD_DTYPE_* */
    int n_dims;
    int64_t shape[4];   /* row-major, as stored (PyTorch [out, in] for linear) */
    const void *rp;     /* Q8_0 (and Q4_0, IQ4_NL, Q5_0: td_q8r_dtype_ok) matrices under act_type amx
                           or bf16: the R16 repack (nn/q8r.h), owned by whoever
                           made it (the model's q8r_arena, a drafter's arena); else NULL. Written
                           once, before any amx context reads it; other modes never read it */
    const void *ip;     /* a drafter's Q8_0 matrices under act_type amx, width a multiple of 64: the
                           same values requantized to int8 rows with one f32 scale a row (nn/i8t.h:
                           [N][K] int8, then [N] f32), owned by the drafter's arena; else NULL.
                           Written once like rp; products of TD_MM_I8T_MIN_M tokens or more use it */
    const void *pk;     /* bf16 matrices under act_type bf16 where td_kernels_p24(): the same values in
                           the P24 layout (nn/kernels.h: td_bf16p_*, its own header says which [N][K]),
                           owned by the model's p24_arena; else NULL. Written once, before any context
                           reads it; data stays the plain matrix for every other reader */
    const void *file;   /* where data's bytes lie in the model's GGUF mapping (data itself, or the
                           source of the load's copy); NULL when they came from anywhere else. Whoever
                           rebinds data clears it. td_model_repack_q8r hands the pages of repacked
                           originals back to the file through it */
} td_tensor;

/* Row r of a 2-D tensor of n values per row, any dtype (quantized ones too),
 * converted to f32 into out[n] — an embedding lookup. r must be in range. */
void td_tensor_row_f32(const td_tensor *t, int64_t r, int n, float *out);

/* Rope scaling kinds. */
enum { TD_ROPE_NONE = 0, TD_ROPE_LLAMA3 = 1 };

typedef struct td_config {
    td_arch arch;
    char arch_name[64];
    int n_vocab, n_embd, n_layer, n_head, n_kv_head, head_dim, n_ff, n_ctx_train;
    float rms_eps;
    double rope_theta;
    int rope_scaling;          /* TD_ROPE_* */
    double rope_factor, rope_low_freq_factor, rope_high_freq_factor;
    int rope_orig_ctx;         /* original_max_position_embeddings */
    int tied;                  /* lm_head shares embed_tokens */
    int qk_norm;               /* Qwen3: RMSNorm on q and k per head */
    int attn_bias;             /* q/k/v/o have biases (attention_bias) */
    int32_t eos_ids[8];
    int n_eos;
    int32_t bos_id;            /* -1 if none */
} td_config;

typedef struct td_layer_w {
    td_tensor attn_norm;  /* [n_embd] input_layernorm */
    td_tensor wq;         /* [n_head*head_dim][n_embd] */
    td_tensor wk;         /* [n_kv_head*head_dim][n_embd] */
    td_tensor wv;         /* [n_kv_head*head_dim][n_embd] */
    td_tensor wo;         /* [n_embd][n_head*head_dim] */
    td_tensor bq, bk, bv, bo; /* biases, when attn_bias */
    td_tensor q_norm;     /* [head_dim] (qk_norm) */
    td_tensor k_norm;     /* [head_dim] (qk_norm) */
    td_tensor ffn_norm;   /* [n_embd] post_attention_layernorm */
    td_tensor w_gate;     /* [n_ff][n_embd] */
    td_tensor w_up;       /* [n_ff][n_embd] */
    td_tensor w_down;     /* [n_embd][n_ff] */
} td_layer_w;

typedef struct td_weights {
    td_tensor tok_embd;   /* [n_vocab][n_embd] */
    td_tensor out_norm;   /* [n_embd] */
    td_tensor lm_head;    /* [n_vocab][n_embd]; == tok_embd when tied */
    td_layer_w *layers;   /* [n_layer], owned */
} td_weights;

struct td_model {
    td_config cfg;
    td_weights w;
    td_tokenizer *tok;     /* owned; NULL when the directory has none */
    td_chat_style chat;
    /* mappings of the safetensors shards (owned) */
    struct td_st_file **files;
    int n_files;
    struct td_gguf_file *gguf; /* the GGUF file, when opened from one (owned) */
    int n_tensors;         /* distinct weight tensors the model binds */
    size_t weight_bytes;
    size_t n_params;
    char dir[1024];
    int n_extra_tensors;   /* tensors in the files that the model does not use */
    int dtype;             /* TD_DTYPE_* holding the most weight bytes */
    int dtype_count[TD_DTYPE_COUNT];    /* bound tensors per TD_DTYPE_* */
    size_t dtype_bytes[TD_DTYPE_COUNT]; /* bound bytes per TD_DTYPE_* */
    void **owned;          /* [n_owned] weight buffers made in memory (td_model_quantize_weights,
                              the copy of td_model_params.use_mmap = 0), owned */
    int n_owned;
    int copied;            /* 1: the weights were copied out of the files (use_mmap = 0) */
    char *copy_map;        /* the copy: an anonymous mapping of copy_len bytes, owned (munmap); NULL when
                              the weights stay mapped. Pages of it may be file pages (td_model_repack_q8r) */
    size_t copy_len;
    int q8r_done;          /* 1: td_model_repack_q8r has run (guarded by its process-wide lock) */
    void *p24_arena;       /* owned: the P24 copies of td_model_repack_p24, or NULL. A drafter's view of
                              a model that gets its own frees it itself, as q8r_arena */
    size_t p24_bytes;
    int p24_done;          /* 1: td_model_repack_p24 has run (guarded by its process-wide lock) */
    int p24_not_head;      /* 1: lm_head is another model's (an MTP head's view of its target's): never
                              packed here, which would copy the whole of it */
    void *q8r_arena;       /* owned: the repacks it made (q8r_bytes), or NULL. A drafter's view of a model
                              (a struct copy) that gets its own frees it itself */
    size_t q8r_bytes;
};

/* Give every matrix the forward multiplies that R16 holds (td_q8r_dtype_ok) (layers'
 * projections, lm_head) its R16 repack (nn/q8r.h) in one arena, m->q8r_arena; the first call
 * does it, later ones return at once (a process-wide lock orders concurrent
 * callers, so contexts on one model may open from several threads). Called by
 * td_ctx_open for act_type amx and bf16: the model is otherwise read-only once open, and
 * a context in another mode never reads rp. The originals stay readable (the
 * embedding lookup and contexts in other modes read them), but right after each
 * matrix's repack its whole pages go back to a GGUF file it came from, every byte
 * kept: dropped from the file mapping (MADV_DONTNEED), or, in the load's copy,
 * replaced by a MAP_FIXED mapping of the same file bytes (md_copy_weights lays
 * such matrices out at their file offset modulo the page size); a range the
 * kernel refuses keeps its memory. */
int td_model_repack_q8r(td_model *m, td_err *err);
/* Give every bf16 layer matrix and the LM head that td_bf16p_packable allows
 * its P24 copy (td_tensor.pk), once per model, for contexts of act_type bf16
 * on CPUs where td_kernels_p24(); a mapped model's plain pages then go back
 * to its files (they fault in again where something reads them: the rows
 * outside whole panels, embedding lookups, other act types). In a model
 * copied into memory, a matrix md_copy_weights laid out at its GGUF file
 * offset modulo the page size (rows on cache lines in the file) has its plain
 * copy's pages replaced by the file's, as td_model_repack_q8r does; the
 * others keep their plain copy, so they are packed only while that costs at
 * most TD_P24_COPY_MAX bytes more in all. 0, or TD_ENOMEM (nothing changed). */
#define TD_P24_COPY_MAX ((size_t)64 << 20)
int td_model_repack_p24(td_model *m, td_err *err);
/* The seven matrices of a layer (q, k, v, o, gate, up, down) into out[TD_LAYER_MATRICES]. */
enum { TD_LAYER_MATRICES = 7 };
void td_layer_matrices(td_layer_w *L, td_tensor *out[TD_LAYER_MATRICES]);
/* 1 when one of the matrices the forward multiplies (layers' and lm_head) has an R16 repack. */
int td_model_has_repack(const td_model *m);
/* Give each Q8_0 matrix of ts[0 .. n) (2-D, rows a multiple of 32 values; others
 * and tensors already repacked are skipped) its R16 repack, in one 2 MiB-aligned
 * arena: *arena_out (owned by the caller, free(); NULL when there was nothing to
 * repack), *bytes_out (may be NULL) its size. On error no tensor has changed. */
int td_tensors_repack_q8r(td_tensor *const *ts, int n, void **arena_out, size_t *bytes_out, td_err *err);

/* n bytes (rounded up to 2 MiB), 2 MiB-aligned and advised MADV_HUGEPAGE;
 * free() releases it. NULL when out of memory. */
void *td_model_alloc_huge(size_t n);
/* Quantize tensors ts[i] ([rows][K] matmul weights, K a multiple of TD_QK) to
 * dts[i] (Q8_0 / Q4_0) into one 2 MiB-aligned arena and rebind each to it;
 * tensors already quantized or absent are kept. *arena_out: the arena, owned
 * by the caller (free()), NULL when nothing was quantized; *bytes_out (may be
 * NULL): the quantized bytes. On error no tensor has been changed. */
int td_tensors_quantize(td_tensor *const *ts, const int *dts, int n, void **arena_out, size_t *bytes_out, td_err *err);
/* Set m->dtype to the dtype holding the most weight bytes. */
void td_model_main_dtype(td_model *m);
/* Quantization schemes beyond one dtype for all matrices: llama.cpp's "_M" mixes. */
enum { TD_QSCHEME_Q4_K_M = 100, TD_QSCHEME_Q5_K_M = 101, TD_QSCHEME_Q3_K_M = 102 };
/* What a matrix is, for the choice of its type. */
enum { TD_QROLE_MATRIX = 0, TD_QROLE_OUTPUT = 1 /* lm_head, or the embedding when tied */, TD_QROLE_ATTN_V = 2,
       TD_QROLE_FFN_DOWN = 3 };
/* The dtype a quantizer gives a matrix of role with rows of k values, asked for
 * scheme (a TD_DTYPE_* block format, or TD_QSCHEME_*), as llama.cpp's quantizer
 * chooses: the output matrix gets q8_0 for q4_0 and q6_k for q5_0 and the 4- and
 * 5-bit k-quants; the _M mixes give attn_v and ffn_down q6_k (q3_k_m: q4_k, a simplification of
 * llama.cpp's per-layer choice between q4_k and q5_k); a k-quant whose rows are
 * not a whole number of 256-value super-blocks falls back as in llama.cpp: q4_k to
 * q5_0, iq4_xs, q3_k and q2_k to iq4_nl, q6_k to q8_0, q5_k to q8_0 (llama.cpp: q5_1, which
 * tandem lacks). The output matrix of iq4_nl / iq4_xs is q6_k too. -1 for an unknown scheme. */
int td_model_quant_type(int scheme, int role, int64_t k);

/* One weight tensor the forward binds: where it goes, its names, its shape
 * (row-major [d0][d1], as Hugging Face stores it; GGUF lists [d1, d0]). */
enum { TD_WSPEC_Q = 1, TD_WSPEC_K = 2 }; /* q / k projection: rows rope-permuted in llama GGUFs */
#define TD_WSPEC_MAX 16
typedef struct td_wspec {
    td_tensor *t;       /* into m->w */
    const char *hf;     /* name ("model.layers.N." + hf for layers) */
    const char *gguf;   /* llama.cpp name ("blk.N." + gguf for layers) */
    int nd;
    int64_t d0, d1;
    int when;           /* 0 = this model has no such tensor */
    int qk;             /* TD_WSPEC_Q / TD_WSPEC_K / 0 */
} td_wspec;
/* The weights of layer `layer` (or the global ones when layer < 0) into
 * s[TD_WSPEC_MAX]; returns how many. m->cfg must be set and, for layer >= 0,
 * m->w.layers allocated. */
int td_weight_specs(td_model *m, int layer, td_wspec *s);

/* Open a GGUF file into m (model_gguf.c): config from its metadata, weights
 * bound by llama.cpp's names, the tokenizer from tokenizer.ggml.*. */
int td_model_open_gguf(td_model *m, const char *path, td_err *err);

/* Llama 3 rope frequency factors (llama.cpp's rope_freqs) of c into out[head_dim/2]. */
int td_llama3_rope_factors(const td_config *c, float *out);

/* Parse config.json text into cfg (validates every value; names the bad field). */
int td_config_parse(td_config *cfg, const char *json, size_t len, td_err *err);
/* Merge generation_config.json text (path names it in errors) into a parsed cfg:
 * its eos_token_id ids come first, then config.json's not repeated (at most 8);
 * its bos_token_id overrides. */
int td_config_merge_generation(td_config *cfg, const char *json, size_t len, const char *path,
                               td_err *err);

#endif
