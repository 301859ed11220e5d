/* tok_gguf — the tokenizer in GGUF metadata (tokenizer.ggml.*), both ways.
 *
 * GGUF stores a byte-level BPE as tokenizer.ggml.model = "gpt2" with arrays
 * tokens (byte-level strings; added tokens as their raw text), token_type
 * (1 normal, 3 control = special added, 4 user-defined = other added,
 * 5 unused = an id with no token, written "[PAD<id>]"), merges ("a b"), and
 * tokenizer.ggml.pre naming the pre-tokenizer (its regex is not stored). The
 * pre-tokenizers tandem knows are one table in tok_gguf.c (qwen2, llama-bpe):
 * regex, NFC normalisation, ignore_merges. Reading builds a tokenizer.json and
 * tokenizer_config.json in memory from the metadata and opens it with
 * td_tokenizer_open_mem, so a GGUF tokenizer is the tokenizer.json one. */
#ifndef TD_TOK_GGUF_H
#define TD_TOK_GGUF_H

#include "io/gguf.h"
#include "tandem.h"

/* The tokenizer in f's metadata. *out = NULL (and 0 returned) when the file
 * has no tokenizer.ggml.model. Errors name the file and the key. */
int td_tok_gguf_open(td_tokenizer **out, const td_gguf_file *f, td_err *err);

/* Write tokenizer.ggml.{model, pre, tokens, token_type, merges, add_bos_token}
 * and tokenizer.chat_template from a Hugging Face tokenizer.json
 * (+ tokenizer_config.json, may be NULL) to w; the arrays are padded to
 * n_vocab ids. The caller writes the bos/eos/padding ids. Refuses (naming it)
 * a tokenizer that GGUF cannot describe. */
int td_tok_gguf_write(td_gguf_writer *w, const char *json_path, const char *config_path, int n_vocab,
                      int add_bos, td_err *err);

#endif
