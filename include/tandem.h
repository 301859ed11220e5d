/* tandem — an LLM inference engine built around speculative decoding.
 *
 * This is the whole public API: the CLI and the server use nothing else.
 * Contracts, in the manner of llama.h:
 *   - Every fallible function returns int: 0 = ok, a negative TD_E* code on failure.
 *   - Constructors are `int td_x_open(td_x **out, ...)`; on failure *out is NULL.
 *     Every _open has a matching _free, which accepts NULL.
 *   - Functions that can fail on user input take a `td_err *` (may be NULL) and
 *     write a human-readable message naming what is wrong.
 *   - Ownership is stated at each declaration: "borrowed" pointers must stay valid
 *     for the call (or for the stated lifetime); "owned" results are freed by the
 *     caller with the named function.
 *   - The library never calls exit() and never prints, except where a function
 *     says it writes to a FILE*.
 */
#ifndef TANDEM_H
#define TANDEM_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- errors ------------------------------------------------------------ */

enum {
    TD_OK = 0,
    TD_EINVAL = -1,       /* bad argument from the caller */
    TD_ENOMEM = -2,       /* allocation failed */
    TD_EIO = -3,          /* file could not be opened/read/mapped */
    TD_EFORMAT = -4,      /* a file's contents are malformed or inconsistent */
    TD_EUNSUPPORTED = -5, /* valid input this build does not support */
    TD_ERANGE = -6,       /* a size/position/count is out of range */
    TD_EFULL = -7,        /* a fixed-capacity resource (rows, context) is exhausted */
    TD_ESTATE = -8,       /* call not valid in the object's current state */
};

/* An error buffer filled at API edges. */
typedef struct td_err {
    int code;        /* last TD_E* code, 0 if none */
    char msg[512];   /* NUL-terminated human message */
} td_err;

/* Static string for a TD_E* code. */
const char *td_strerror(int code);

/* ---- tokenizer --------------------------------------------------------- */

typedef struct td_tokenizer td_tokenizer;

/* Load a Hugging Face tokenizer.json (byte-level BPE: Qwen2/3, Llama 3, DeepSeek).
 * config_path: tokenizer_config.json for the chat template and special-token names,
 * or NULL. Both files are untrusted input. */
int td_tokenizer_open(td_tokenizer **out, const char *json_path, const char *config_path, td_err *err);
/* Same, from memory buffers (borrowed for the call; config_json may be NULL). */
int td_tokenizer_open_mem(td_tokenizer **out, const char *json, size_t json_len,
                          const char *config_json, size_t config_len, td_err *err);
void td_tokenizer_free(td_tokenizer *tok);

/* Number of ids (the largest id + 1, added tokens included). */
int td_tokenizer_n_vocab(const td_tokenizer *tok);
/* The id of a token's exact string (e.g. "<|im_end|>"), or -1. */
int32_t td_tokenizer_find(const td_tokenizer *tok, const char *token);
/* eos / bos ids from tokenizer_config.json, or -1 when not set. */
int32_t td_tokenizer_eos(const td_tokenizer *tok);
int32_t td_tokenizer_bos(const td_tokenizer *tok);
/* 1 when the id is a special added token (decode skips nothing; callers may). */
int td_tokenizer_is_special(const td_tokenizer *tok, int32_t id);

enum {
    TD_TOK_PARSE_SPECIAL = 1 << 0, /* match added/special tokens in the text */
    TD_TOK_ADD_BOS = 1 << 1,       /* prepend bos when the tokenizer has one */
};
/* Encode `len` bytes of text (need not be valid UTF-8). Writes at most `cap` ids
 * to `ids` (borrowed) and returns the total number of ids the text needs, which
 * may exceed cap (call again with a larger buffer); negative TD_E* on error. */
int td_tokenize(const td_tokenizer *tok, const char *text, size_t len, int flags,
                int32_t *ids, int cap);
/* The raw bytes of one token after byte-level decoding (may be a partial UTF-8
 * sequence). Writes at most cap bytes; returns the full length, or negative. */
int td_token_bytes(const td_tokenizer *tok, int32_t id, char *buf, int cap);
/* Decode ids to bytes (concatenated token bytes). Returns the full length
 * (may exceed cap; at most cap bytes written, no NUL added), or negative. */
int td_detokenize(const td_tokenizer *tok, const int32_t *ids, int n, char *buf, size_t cap);

/* Streaming decoder: feeds token bytes, releases only complete UTF-8 characters,
 * holding back an incomplete tail (at most 3 bytes) until later tokens complete
 * it; bytes that can never form a character are released as U+FFFD. */
typedef struct td_utf8_stream {
    unsigned char hold[4];
    int n_hold;
} td_utf8_stream;
/* Appends the releasable text for `id` to out (cap bytes); returns bytes written
 * (buffer of 32 + longest token is always enough) or negative. */
int td_utf8_stream_push(td_utf8_stream *st, const td_tokenizer *tok, int32_t id, char *out, int cap);
/* Releases whatever is held (as U+FFFD for an incomplete sequence). */
int td_utf8_stream_flush(td_utf8_stream *st, char *out, int cap);

/* ---- chat templates ---------------------------------------------------- */

typedef struct td_chat_msg {
    const char *role;    /* "system" | "user" | "assistant" (borrowed) */
    const char *content; /* borrowed, NUL-terminated */
} td_chat_msg;

typedef enum td_chat_style {
    TD_CHAT_NONE = 0,   /* no template known */
    TD_CHAT_CHATML,     /* <|im_start|>role\n...<|im_end|>\n  (Qwen) */
    TD_CHAT_LLAMA3,     /* <|start_header_id|>role<|end_header_id|>\n\n...<|eot_id|> */
} td_chat_style;

/* Style detected from tokenizer_config.json's chat_template. */
td_chat_style td_tokenizer_chat_style(const td_tokenizer *tok);
/* Render messages; add_generation_prompt opens an assistant turn. Returns the
 * full length (may exceed cap; output NUL-terminated when it fits), or negative. */
int td_chat_render(td_chat_style style, const td_chat_msg *msgs, int n_msgs,
                   int add_generation_prompt, char *out, size_t cap);

/* ---- model ------------------------------------------------------------- */

typedef struct td_model td_model;

typedef enum td_arch { TD_ARCH_QWEN3 = 1, TD_ARCH_LLAMA = 2 } td_arch;

typedef struct td_model_info {
    td_arch arch;
    const char *arch_name;   /* e.g. "Qwen3ForCausalLM"; valid while the model lives */
    int n_vocab;
    int n_embd;              /* hidden size */
    int n_layer;
    int n_head;
    int n_kv_head;
    int head_dim;
    int n_ff;                /* intermediate size */
    int n_ctx_train;         /* max_position_embeddings */
    int tied_embeddings;
    int dtype;               /* TD_DTYPE_* of the weights (the most common one) */
    size_t n_params;
    size_t weight_bytes;     /* bytes of all weight tensors as stored */
    int n_tensors;
    int32_t eos_ids[8];      /* from generation_config.json / config.json */
    int n_eos;
    int copied;              /* 1: the weights were copied into anonymous memory at load
                                (td_model_params.use_mmap), 0: views of the mapped files */
} td_model_info;

/* Weight dtypes. Q8_0 / Q4_0 / Q5_0 / Q4_1 / Q5_1 / IQ4_NL are GGUF's block formats (32
 * values per block with an f16 scale, Q4_1 / Q5_1 an f16 minimum too), Q4_K / Q5_K / Q6_K / IQ4_XS its "k-quant" formats
 * (Q2_K / Q3_K too: super-blocks of 256 values with 6- or 8-bit sub-block scales; see src/nn/quant.h); only 2-D matmul weights
 * and embeddings use them. */
enum { TD_DTYPE_F32 = 0, TD_DTYPE_F16 = 1, TD_DTYPE_BF16 = 2, TD_DTYPE_Q8_0 = 3, TD_DTYPE_Q4_0 = 4,
       TD_DTYPE_Q4_K = 5, TD_DTYPE_Q5_K = 6, TD_DTYPE_Q6_K = 7, TD_DTYPE_Q5_0 = 8, TD_DTYPE_IQ4_NL = 9,
       TD_DTYPE_IQ4_XS = 10, TD_DTYPE_Q3_K = 11, TD_DTYPE_Q2_K = 12, TD_DTYPE_Q4_1 = 13, TD_DTYPE_Q5_1 = 14,
       TD_DTYPE_COUNT = 15 };
/* "f32", "f16", "bf16", "q8_0", "q4_0", "q4_k", "q5_k", "q6_k", "q5_0", "iq4_nl", "iq4_xs",
 * "q3_k", "q2_k", "q4_1", "q5_1"; "?" for another value. */
const char *td_dtype_name(int dtype);
/* The dtype of one of those names (case as above), or -1. */
int td_dtype_parse(const char *name);

/* Open a model directory in Hugging Face layout: config.json, model.safetensors or
 * sharded model-*.safetensors + model.safetensors.index.json, and, when present,
 * generation_config.json, tokenizer.json, tokenizer_config.json. Weights are
 * mmapped (large models: then copied, see td_model_params); every header
 * field, offset, shape and dtype is validated first.
 * dir may also be a llama.cpp GGUF file (architectures qwen3, llama; config and
 * tokenizer from its metadata), or a directory without config.json holding
 * exactly one .gguf file. */
int td_model_open(td_model **out, const char *dir, td_err *err);

/* How td_model_open_params loads the weights. */
typedef struct td_model_params {
    int use_mmap;    /* 1: the weights are views of the mmapped files (page-cache pages);
                        0: after every header, offset, shape and dtype check, the weights the
                        model uses are copied into anonymous memory, 2 MiB-aligned and advised
                        MADV_HUGEPAGE (as llama.cpp's --no-mmap), and the files' pages are
                        released: decode streams the weights through 2 MiB pages whatever the
                        page cache holds; -1 (the default): copy when the weights are at least
                        TD_MODEL_COPY_MIN bytes, map otherwise (small models start faster).
                        Either way, once a context repacks a GGUF file's block-quantized
                        matrices (act_type bf16 / amx, below) or packs its bf16 ones (P24, act_type
                        bf16, README), the originals' pages go back to the file (they fault back
                        in if a context in another mode reads them; a copied bf16 matrix only
                        where its rows start on cache lines in the file),
                        so such a model holds about one copy of its weights, not two. Then,
                        as with mapped weights, the file must not be changed in place while
                        the model is open (replacing it by a rename is safe). */
} td_model_params;
#define TD_MODEL_COPY_MIN ((size_t)256 << 20)
td_model_params td_model_default_params(void);
/* td_model_open with params (NULL: td_model_default_params()); td_model_open
 * uses the defaults. */
int td_model_open_params(td_model **out, const char *dir, const td_model_params *params, td_err *err);
void td_model_free(td_model *m);
void td_model_get_info(const td_model *m, td_model_info *info);
/* The tokenizer loaded from the directory, or NULL when it has none.
 * Owned by the model; valid while the model lives. */
const td_tokenizer *td_model_tokenizer(const td_model *m);
/* Quantize the model's matmul weights in memory to dtype (a block format:
 * TD_DTYPE_Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS); norms and biases
 * stay as loaded, the output matrix gets q8_0 for q4_0 and q6_k for the others
 * (q8_0 where its rows are not a multiple of 256), and k-quant matrices whose rows are not
 * a multiple of 256 values get q8_0 (see src/model/model_quant.c). Call before
 * opening contexts. TD_EUNSUPPORTED when a matmul input width is not a multiple of 32. */
int td_model_quantize_weights(td_model *m, int dtype, td_err *err);
/* Write a human description (config, tensor count, bytes, dtypes) to f. */
void td_model_describe(const td_model *m, FILE *f);
/* Write the model as a GGUF file that llama.cpp loads (llama.cpp's tensor names
 * and metadata, the tokenizer as tokenizer.ggml.*). type: "f32", "f16", "bf16",
 * "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl", "q2_k", "q3_k", "q4_k", "q5_k", "q6_k", "iq4_xs", or llama.cpp's mixes "q4_k_m" / "q5_k_m"
 * (attn_v and ffn_down q6_k) for the matrices (the output matrix as
 * td_model_quantize_weights chooses it; 1-D tensors are always f32). Written to path + ".tmp",
 * then renamed; nothing is left behind on failure. */
int td_model_quantize(const td_model *m, const char *path, const char *type, td_err *err);

/* ---- forward over batched rows ---------------------------------------- */

/* A context owns the KV cache and activations of up to max_rows rows, allocated
 * once at open; forwards allocate nothing. */
typedef struct td_ctx td_ctx;

/* act_type of products on Intel AMX tiles (td_ctx_params.act_type); not a storage type */
enum { TD_ACT_AMX = 64 };

typedef struct td_ctx_params {
    int max_rows;    /* rows that can be live at once (>= 1) */
    int max_ctx;     /* KV positions per row (<= model's n_ctx_train unless forced) */
    int max_tokens;  /* most new tokens in one forward, over all rows */
    int max_logits;  /* most positions with logits in one forward */
    int n_threads;   /* 0 = td_ctx_default_threads() */
    int kv_type;     /* storage of the KV cache: TD_DTYPE_F32 (the default, 0), TD_DTYPE_BF16 or
                        TD_DTYPE_F16 (half the bytes), or TD_DTYPE_Q8_0 (GGUF Q8_0 blocks: 32
                        int8 and an f16 scale, 34 bytes per 32 values; needs a head_dim that is a
                        multiple of 32, else TD_EUNSUPPORTED). Each K/V row is rounded (q8_0:
                        quantized) once when written and widened (q8_0: dequantized) when read,
                        the same way on every path, so batch invariance and speculative
                        exactness hold for every type; bf16/f16/q8_0 change the logits slightly
                        (tests/test_conformance.c states the tolerance). Other values: TD_EINVAL. */
    int act_type;    /* precision of the activations entering products with bf16 weights:
                        TD_DTYPE_F32 (the default, 0: weights widened exactly, f32 fmas) or
                        TD_DTYPE_BF16 (each activation row rounded once to bf16, nearest even;
                        bf16 dot products, AVX-512 BF16's vdpbf16ps where the CPU has it, a
                        bit-identical emulation elsewhere; src/nn/kernels.h, "B32"). Batch
                        invariance and speculative exactness hold in both; bf16 moves the
                        logits (tests/test_conformance.c states the tolerance). With kv_type
                        TD_DTYPE_BF16 and a head_dim that is a multiple of 32, attention takes
                        the bf16 order too (queries and probabilities rounded to bf16, each
                        product a vdpbf16ps lane or its emulation: src/nn/kernels.h, "A32";
                        each query's bits its own). Q8_0 weights
                        take the "R16" order under bf16 (src/nn/q8r.h: the same Q8 activations
                        as td_matmul's, each 32-value block's integer sum whole before its
                        scale; over a repacked copy of the weights the model builds at the
                        first such context, the Q8_0 bytes again, the originals' pages then
                        handed back to a GGUF file they came from; the same bits on every
                        kernel path), and so do Q4_0, IQ4_NL, Q5_0, Q4_K, Q5_K, Q6_K and IQ4_XS
                        weights (their own records of the file's bytes, each block's scale,
                        and Q4_K's minimum, exact); products with f32, f16 or other quantized weights are
                        unchanged. TD_ACT_AMX: bf16-rounded activations and R16 as with
                        TD_DTYPE_BF16, the bf16 products on Intel AMX tiles (TDPBF16PS,
                        src/nn/amx.h, "AMX"): batch invariant and exact like the others, but
                        the bits are this CPU's AMX unit's, not portable; products whose input
                        width is not a multiple of 32 take the bf16 order.
                        With kv_type TD_DTYPE_BF16 and a head_dim that is a multiple of 32, the
                        cache is kept in the tiles' layouts and attention runs on the tiles too
                        (queries and probabilities rounded to bf16; each query's bits its own,
                        so batch invariance and exactness hold).
                        TD_EUNSUPPORTED where the CPU or kernel offers no AMX-BF16 tiles.
                        Other values: TD_EINVAL. */
    const struct td_ctx *share_threads; /* borrowed, or NULL: run on this context's threads
                        instead of starting new ones (it must outlive this context, and the
                        two must not run forwards at the same time). Drafters share the
                        target's threads, so idle workers of one never compete with the other. */
    int serial_tokens;  /* a forward of at most this many new tokens runs on the calling thread
                        alone, without waking the pool (0 = never): for a small model, the
                        workers' hand-offs cost more than the work they take. The bits are the
                        same either way (every output is computed identically by any thread). */
} td_ctx_params;

td_ctx_params td_ctx_default_params(void);
/* The KV type of a name: "f32", "bf16", "f16" or "q8_0" -> TD_DTYPE_*; -1 for any other. */
int td_kv_type_parse(const char *name);
/* The name of a KV type ("f32", "bf16", "f16", "q8_0"), or NULL when it is not one. */
const char *td_kv_type_name(int kv_type);
/* The activation type of a name: "f32" or "bf16" -> TD_DTYPE_*, "amx" -> TD_ACT_AMX, "auto" -> TD_ACT_AMX
 * where this CPU and kernel offer AMX tiles, else TD_DTYPE_BF16 where the CPU's vdpbf16ps computes the
 * B32 order natively, else TD_DTYPE_F32; -1 for any other. */
int td_act_type_parse(const char *name);
/* The name of an activation type ("f32", "bf16", "amx"), or NULL when it is not one. */
const char *td_act_type_name(int act_type);
/* The default thread count: physical cores among the CPUs this process may run
 * on (hyper-thread siblings count once); the CPU count where the kernel does not
 * describe its topology. */
int td_ctx_default_threads(void);
/* The model is borrowed and must outlive the context. */
int td_ctx_open(td_ctx **out, const td_model *m, const td_ctx_params *p, td_err *err);
void td_ctx_free(td_ctx *c);
/* The parameters in force (defaults resolved). */
td_ctx_params td_ctx_get_params(const td_ctx *c);

/* Rows: a row is one sequence with its own KV cache. */
int td_ctx_row_add(td_ctx *c, int *row_out);          /* TD_EFULL when none free */
int td_ctx_row_remove(td_ctx *c, int row);
int td_ctx_row_len(const td_ctx *c, int row);          /* KV entries held; negative if bad row */
/* Roll the row's KV back to its first `len` entries (len <= current length). */
int td_ctx_row_trim(td_ctx *c, int row, int len);

/* One ragged batch: row i appends n_tokens[i] new tokens at positions
 * row_len(rows[i]) .. +n_tokens[i]-1. */
typedef struct td_batch {
    int n_rows;
    const int *rows;           /* [n_rows] row ids, distinct (borrowed) */
    const int *n_tokens;       /* [n_rows] new tokens per row, >= 1 */
    const int32_t *tokens;     /* [sum n_tokens] rows' tokens, concatenated in row order */
    const uint8_t *want;       /* [sum n_tokens] 1 = return logits (and taps) for this
                                  position; NULL = the last position of each row */
    const int *taps;           /* [n_taps] layer indices in 0..n_layer: the residual
                                  stream after that many layers (0 = embeddings),
                                  before the final norm; may be NULL */
    int n_taps;
    const float *embd;         /* [sum n_tokens][n_embd] input vectors used instead of
                                  the token embeddings (tokens may then be NULL) */
    int skip_logits;           /* 1 = only taps are wanted; logits may be NULL, and the
                                  wanted positions are then bounded by max_tokens only
                                  (not max_logits) */
} td_batch;

/* Run the batch. logits: [n_out][n_vocab] float, one row per wanted position in
 * batch order (borrowed, caller-allocated; NULL with skip_logits).
 * taps: [n_out][n_taps][n_embd] or NULL.
 * A position's logits are bitwise identical whatever else shares the call.
 * On error no row's length changes. */
int td_ctx_forward(td_ctx *c, const td_batch *b, float *logits, float *taps, td_err *err);

/* ---- sampling ---------------------------------------------------------- */

typedef struct td_sampling {
    float temperature;        /* <= 0: greedy (argmax, ties to the lowest id) */
    int top_k;                /* 0 = off */
    float top_p;              /* 1 = off */
    float min_p;              /* 0 = off */
    float repeat_penalty;     /* 1 = off (CTRL-style: divide positive logits) */
    float presence_penalty;   /* 0 = off (OpenAI-style) */
    float frequency_penalty;  /* 0 = off */
    int penalty_last_n;       /* history window for penalties, 0 = all */
    uint64_t seed;
} td_sampling;

/* Greedy, every filter and penalty off, penalty window 64, seed 0. */
td_sampling td_sampling_default(void);

/* The uniform draw in [0,1) for output position `pos` under `seed`: a pure
 * function of (seed, pos), so a run is reproducible whatever shares the batch. */
double td_rng_uniform(uint64_t seed, uint64_t pos);

/* A sampler holds scratch for one vocabulary size (allocated once). */
typedef struct td_sampler td_sampler;
int td_sampler_open(td_sampler **out, int n_vocab);
void td_sampler_free(td_sampler *s);
/* Choose a token from logits (borrowed, [n_vocab], left unmodified) for output
 * position pos. history: tokens the penalties count (borrowed, may be NULL).
 * Returns the token id, or negative on error. */
int32_t td_sampler_sample(td_sampler *s, const td_sampling *p, const float *logits,
                          const int32_t *history, int n_history, uint64_t pos);
/* Same, also writing the probability of every token of the final distribution
 * (after penalties, temperature, truncation) into probs [n_vocab] (borrowed);
 * greedy yields a one-hot distribution. */
int32_t td_sampler_sample_probs(td_sampler *s, const td_sampling *p, const float *logits,
                                const int32_t *history, int n_history, uint64_t pos,
                                float *probs);

/* ---- generation -------------------------------------------------------- */

typedef struct td_gen_params {
    td_sampling sampling;
    int max_tokens;            /* new tokens at most */
    const char *const *stop;   /* stop strings (borrowed), n_stop of them */
    int n_stop;
    int ignore_eos;            /* 1 = do not stop at eos ids */
    int logprobs;              /* speculative group only: 1 = record each emitted token's
                                  log-probability (log-softmax of the target's raw logits) */
    int top_logprobs;          /* with logprobs: also the most likely alternatives,
                                  0..TD_MAX_TOP_LOGPROBS */
} td_gen_params;

#define TD_MAX_TOP_LOGPROBS 20

typedef struct td_gen_stats {
    int n_prompt;
    int n_gen;
    double prefill_s;
    double decode_s;
    int stop_reason;           /* TD_STOP_* */
} td_gen_stats;

enum { TD_STOP_LENGTH = 0, TD_STOP_EOS = 1, TD_STOP_STRING = 2, TD_STOP_CALLBACK = 3 };

/* Called with each piece of released text; return nonzero to stop. */
typedef int (*td_text_cb)(const char *text, size_t len, void *user);

/* Plain (non-speculative) generation of one row: prefill the prompt, then decode
 * until max_tokens, eos or a stop string. out_ids (may be NULL) receives up to
 * cap generated ids. The context must have a free row. */
int td_generate(td_ctx *c, const td_model *m, const int32_t *prompt, int n_prompt,
                const td_gen_params *gp, td_text_cb cb, void *user,
                int32_t *out_ids, int cap, td_gen_stats *stats, td_err *err);


/* ---- speculative decoding ---------------------------------------------- */

/* A drafter (draft provider) proposes tokens that the target verifies. It is
 * opened once for a target model and may serve many speculative groups. */
typedef struct td_drafter td_drafter;

/* spec: "none" (no drafter: *out = NULL, returns 0), "ngram" or
 * "ngram:MIN-MAX" (prompt lookup, n-gram sizes MIN..MAX, default 1-8),
 * "model:DIR[,vocab=N]" (a separate draft model; its tokenizer must be the target's;
 * vocab=N drafts over the N most frequent ids only, cutting its LM head),
 * "mtp:DIR[,vocab=N]" (a multi-token-prediction head over the target's last hidden
 * state; vocab=N cuts the shared LM head it reads each step to the N most frequent ids),
 * "block:DIR[,prune=on|off][,vocab=N]" (a DFlash/DSpark block drafter over tapped target layers;
 * prune=off ignores its confidence thresholds; vocab=N cuts the shared LM head and its Markov output
 * to the N most frequent ids).
 * model:, mtp: and block: also take ",quant=q8_0|q4_0" (their own matrices quantized at load;
 * with vocab=N, mtp: and block: quantize their copy of the N kept LM-head rows too) and ",lookup=N" (prompt
 * lookup of n-grams of N..8 tokens first, greedy drafts; a copy behind a short match is declined
 * for a row whose drafter's own drafts promise more).
 * target is borrowed and must outlive the drafter. */
int td_drafter_open(td_drafter **out, const char *spec, const td_model *target, td_err *err);
void td_drafter_free(td_drafter *d);
const char *td_drafter_id(const td_drafter *d);       /* e.g. "ngram:1-8" */
size_t td_drafter_weight_bytes(const td_drafter *d);  /* resident weights it adds (its files, and its own
                                                       copies: quant=, a gathered vocab=N head) */

typedef enum td_accept_rule {
    TD_ACCEPT_MATCH = 0,     /* accept while the draft equals the target's own sample: exact */
    TD_ACCEPT_REJECTION = 1, /* Leviathan/Chen speculative sampling: same distribution */
} td_accept_rule;

typedef struct td_spec_params {
    int max_depth;           /* most draft tokens per row and round (<= 16); 0 = plain decoding */
    int fixed_depth;         /* 1 = always draft max_depth; 0 = the depth controller chooses */
    td_accept_rule accept;
} td_spec_params;

td_spec_params td_spec_default_params(void);

/* The speculative group: the one served lane. It drafts, verifies (one batched,
 * ragged target forward per round), accepts and commits for all its rows. */
typedef struct td_spec td_spec;

/* ctx and target are borrowed and must outlive the group; drafter may be NULL
 * (plain decoding). The ctx's rows, max_tokens and max_logits bound the group.
 * Several groups may share one drafter (borrowed; it must outlive them), and
 * may be opened on several threads at once, each over its own ctx. */
int td_spec_open(td_spec **out, td_ctx *ctx, const td_model *target, td_drafter *drafter,
                 const td_spec_params *p, td_err *err);
void td_spec_free(td_spec *g);

/* Add a request; it is prefilled at the next td_spec_step. prompt is copied;
 * gp (and its stop strings) are borrowed until the row is removed. draft = 0
 * opts this row out of speculation. *id_out: the row's id. */
int td_spec_add(td_spec *g, const int32_t *prompt, int n_prompt, const td_gen_params *gp,
                int draft, int *id_out, td_err *err);
/* One round for every live row (prefill of new rows first). Returns the number
 * of rows still generating, or negative on error. */
int td_spec_step(td_spec *g, td_err *err);
/* Take what a row emitted since the last take: up to cap ids (and, when prov is
 * not NULL, per id 1 = an accepted draft token, 0 = sampled by the target), and
 * released text (written to text, at most tcap bytes; *n_text set; text NULL
 * discards it). *done = 1
 * once the row has finished and everything has been taken. Returns ids taken. */
int td_spec_take(td_spec *g, int id, int32_t *ids, uint8_t *prov, int cap,
                 char *text, size_t tcap, size_t *n_text, int *done);
/* Log-probabilities of a row's emitted token number `index` (0 = its first
 * output), when the row was added with gp->logprobs: *lp for the token, and
 * the gp->top_logprobs most likely tokens (ids descending by probability, ties
 * by id) in top_ids/top_lp (each [TD_MAX_TOP_LOGPROBS], may be NULL).
 * Returns the number of alternatives written, or negative (TD_EINVAL when the
 * row does not record log-probabilities or index is not emitted yet). */
int td_spec_logprobs(const td_spec *g, int id, int index, float *lp, int32_t *top_ids, float *top_lp);
/* Remove a row (finished or not); its id may be reused. */
int td_spec_remove(td_spec *g, int id);
int td_spec_n_rows(const td_spec *g);

#define TD_SPEC_MAX_DEPTH 16
typedef struct td_spec_stats {
    long rounds;              /* rounds in which the row was verified */
    long drafted;             /* draft tokens proposed */
    long accepted;            /* draft tokens accepted */
    long emitted;             /* tokens emitted */
    long drafted_at[TD_SPEC_MAX_DEPTH];  /* proposals at draft position j */
    long accepted_at[TD_SPEC_MAX_DEPTH]; /* of which accepted */
    double t_draft, t_verify, t_accept, t_prefill; /* seconds (group totals) */
    int stop_reason;          /* TD_STOP_* once done */
} td_spec_stats;
/* Statistics of one row (id >= 0) or of the whole group since open (id = -1). */
int td_spec_stats_get(const td_spec *g, int id, td_spec_stats *st);
/* Mean accepted drafts per round: accepted / rounds (0 when no rounds). */
double td_spec_stats_mean_accepted(const td_spec_stats *st);

#ifdef __cplusplus
}
#endif
#endif /* TANDEM_H */
