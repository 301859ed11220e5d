/* tmodel.h — writes small random-weight model directories (config.json +
 * model.safetensors) for tests that need a model of chosen shape without
 * fixtures: deterministic weights from a seed, f32 or bf16 storage. */
#ifndef TD_TMODEL_H
#define TD_TMODEL_H
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <math.h>

typedef struct tm_shape {
    int llama;          /* 0 = Qwen3ForCausalLM, 1 = LlamaForCausalLM */
    int vocab, hidden, layers, heads, kv_heads, head_dim, ffn, ctx;
    int tied;
    int bf16;           /* store weights as bf16 (else f32) */
    uint64_t seed;
} tm_shape;

static uint64_t tm_rng(uint64_t *s) {
    *s += 0x9e3779b97f4a7c15ull;
    uint64_t z = *s;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

typedef struct { char name[160]; int nd; long shape[2]; int norm; } tm_t;

/* Append one decoder layer's tensors named "<prefix>.<suffix>" to t[*n]. */
static void tm_layer_tensors(const tm_shape *s, const char *prefix, int qk_norm, tm_t *t, int *n) {
    struct { const char *sfx; long d0, d1; int norm; } L[] = {
        {"input_layernorm.weight", s->hidden, 0, 1},
        {"self_attn.q_proj.weight", (long)s->heads * s->head_dim, s->hidden, 0},
        {"self_attn.k_proj.weight", (long)s->kv_heads * s->head_dim, s->hidden, 0},
        {"self_attn.v_proj.weight", (long)s->kv_heads * s->head_dim, s->hidden, 0},
        {"self_attn.o_proj.weight", s->hidden, (long)s->heads * s->head_dim, 0},
        {"self_attn.q_norm.weight", s->head_dim, 0, 1},
        {"self_attn.k_norm.weight", s->head_dim, 0, 1},
        {"post_attention_layernorm.weight", s->hidden, 0, 1},
        {"mlp.gate_proj.weight", s->ffn, s->hidden, 0},
        {"mlp.up_proj.weight", s->ffn, s->hidden, 0},
        {"mlp.down_proj.weight", s->hidden, s->ffn, 0},
    };
    for (size_t i = 0; i < sizeof L / sizeof L[0]; i++) {
        if (!qk_norm && strstr(L[i].sfx, "_norm.weight") && strstr(L[i].sfx, "self_attn")) continue;
        tm_t *e = &t[(*n)++];
        snprintf(e->name, sizeof e->name, "%s.%s", prefix, L[i].sfx);
        e->nd = L[i].d1 ? 2 : 1;
        e->shape[0] = L[i].d0;
        e->shape[1] = L[i].d1;
        e->norm = L[i].norm;
    }
}

static int tm_tensors(const tm_shape *s, tm_t *t) {
    int n = 0;
#define ADD(nm, d0, d1, isnorm) do { snprintf(t[n].name, sizeof t[n].name, "%s", nm); t[n].nd = ((d1) != 0) ? 2 : 1; \
    t[n].shape[0] = d0; t[n].shape[1] = d1; t[n].norm = isnorm; n++; } while (0)
    char nm[96];
    ADD("model.embed_tokens.weight", s->vocab, s->hidden, 0);
    ADD("model.norm.weight", s->hidden, 0, 1);
    if (!s->tied) ADD("lm_head.weight", s->vocab, s->hidden, 0);
    for (int l = 0; l < s->layers; l++) {
        snprintf(nm, sizeof nm, "model.layers.%d", l);
        tm_layer_tensors(s, nm, !s->llama, t, &n);
    }
#undef ADD
    return n;
}

/* Write tensors t[0..n) with deterministic random values to path. */
static int tm_write_tensors(const char *path, const tm_t *t, int n, int bf16, uint64_t seed) {
    size_t esz = bf16 ? 2 : 4;
    char *hdr = malloc(64 * 1024 + 256 * (size_t)n);
    size_t hl = 0, off = 0;
    hl += sprintf(hdr + hl, "{");
    for (int i = 0; i < n; i++) {
        size_t cnt = (size_t)t[i].shape[0] * (t[i].nd == 2 ? (size_t)t[i].shape[1] : 1);
        if (t[i].nd == 2)
            hl += sprintf(hdr + hl, "%s\"%s\":{\"dtype\":\"%s\",\"shape\":[%ld,%ld],\"data_offsets\":[%zu,%zu]}", i ? "," : "",
                          t[i].name, bf16 ? "BF16" : "F32", t[i].shape[0], t[i].shape[1], off, off + cnt * esz);
        else
            hl += sprintf(hdr + hl, "%s\"%s\":{\"dtype\":\"%s\",\"shape\":[%ld],\"data_offsets\":[%zu,%zu]}", i ? "," : "",
                          t[i].name, bf16 ? "BF16" : "F32", t[i].shape[0], off, off + cnt * esz);
        off += cnt * esz;
    }
    hl += sprintf(hdr + hl, "}");
    while (hl % 8) hdr[hl++] = ' ';
    FILE *f = fopen(path, "wb");
    if (!f) { free(hdr); return -1; }
    uint64_t hl64 = hl;
    fwrite(&hl64, 8, 1, f);
    fwrite(hdr, 1, hl, f);
    uint64_t st = seed;
    for (int i = 0; i < n; i++) {
        size_t cnt = (size_t)t[i].shape[0] * (t[i].nd == 2 ? (size_t)t[i].shape[1] : 1);
        float scale = t[i].norm ? 0.2f : 1.0f / sqrtf((float)(t[i].nd == 2 ? t[i].shape[1] : 1));
        for (size_t k = 0; k < cnt; k++) {
            float u = (float)((tm_rng(&st) >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
            float v = t[i].norm ? 1.0f + u * scale : u * scale * 1.7f;
            if (bf16) {
                union { float f; uint32_t u; } c = {v};
                uint16_t h = (uint16_t)(c.u >> 16);
                fwrite(&h, 2, 1, f);
            } else {
                fwrite(&v, 4, 1, f);
            }
        }
    }
    fclose(f);
    free(hdr);
    return 0;
}

/* Write dir/config.json and dir/model.safetensors. Returns 0 on success. */
static int tm_write(const char *dir, const tm_shape *s) {
    mkdir(dir, 0755);
    char path[1024];
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    if (!f) return -1;
    fprintf(f, "{\"architectures\": [\"%s\"], \"vocab_size\": %d, \"hidden_size\": %d, "
               "\"num_hidden_layers\": %d, \"num_attention_heads\": %d, \"num_key_value_heads\": %d, "
               "\"head_dim\": %d, \"intermediate_size\": %d, \"max_position_embeddings\": %d, "
               "\"rms_norm_eps\": 1e-06, \"rope_theta\": 10000.0, \"tie_word_embeddings\": %s, "
               "\"eos_token_id\": 1, \"bos_token_id\": 0, \"torch_dtype\": \"%s\"}\n",
            s->llama ? "LlamaForCausalLM" : "Qwen3ForCausalLM", s->vocab, s->hidden, s->layers, s->heads,
            s->kv_heads, s->head_dim, s->ffn, s->ctx, s->tied ? "true" : "false", s->bf16 ? "bfloat16" : "float32");
    fclose(f);
    tm_t *t = calloc(16 + 16 * (size_t)s->layers, sizeof *t);
    int n = tm_tensors(s, t);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    int rc = tm_write_tensors(path, t, n, s->bf16, s->seed);
    free(t);
    return rc;
}

/* An MTP head (TandemMTP) for a target of shape s; layers_claim is written as
 * target_num_hidden_layers (pass s->layers, or another value to make a head
 * "trained for another target"). */
static inline int tm_write_mtp(const char *dir, const tm_shape *s, int layers_claim, uint64_t seed) {
    mkdir(dir, 0755);
    char path[1024];
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    if (!f) return -1;
    fprintf(f, "{\"architectures\": [\"TandemMTP\"], \"target_hidden_size\": %d, \"target_num_hidden_layers\": %d, "
               "\"target_vocab_size\": %d, \"num_mtp_layers\": 1, \"tap_layer\": %d}\n",
            s->hidden, layers_claim, s->vocab, layers_claim);
    fclose(f);
    tm_t t[16];
    int n = 0;
#define ADD(NM_, d0, d1, isnorm) do { snprintf(t[n].name, sizeof t[n].name, "%s", NM_); t[n].nd = ((d1) != 0) ? 2 : 1; \
    t[n].shape[0] = d0; t[n].shape[1] = d1; t[n].norm = isnorm; n++; } while (0)
    ADD("mtp.fc.weight", s->hidden, 2 * s->hidden, 0);
    ADD("mtp.pre_fc_norm_embedding.weight", s->hidden, 0, 1);
    ADD("mtp.pre_fc_norm_hidden.weight", s->hidden, 0, 1);
    ADD("mtp.norm.weight", s->hidden, 0, 1);
    tm_layer_tensors(s, "mtp.layers.0", 1, t, &n);
#undef ADD
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    return tm_write_tensors(path, t, n, s->bf16, seed);
}

/* A block drafter (TandemBlockDrafter, 2 layers, block of 6, Markov rank 4,
 * confidence head, pruning thresholds `thr`: a JSON array or "[]") for a
 * target of shape s; layers_claim is written as target_num_hidden_layers;
 * taps: a JSON array of target layers. */
/* A random block drafter; chain > 0 adds a chain head of that width. */
static inline int tm_write_block(const char *dir, const tm_shape *s, int layers_claim, const char *taps, int n_taps,
                                 const char *thr, uint64_t seed, int chain) {
    mkdir(dir, 0755);
    char path[1024];
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    if (!f) return -1;
    fprintf(f, "{\"architectures\": [\"TandemBlockDrafter\"], \"target_hidden_size\": %d, \"target_num_hidden_layers\": %d, "
               "\"target_vocab_size\": %d, \"tap_layers\": %s, \"block_size\": 6, \"mask_token_id\": 3, "
               "\"num_hidden_layers\": 2, \"hidden_size\": %d, \"num_attention_heads\": %d, \"num_key_value_heads\": %d, "
               "\"head_dim\": %d, \"intermediate_size\": %d, \"rms_norm_eps\": 1e-06, \"rope_theta\": 10000.0, "
               "\"markov_rank\": 4, \"chain_hidden\": %d, \"confidence_head\": true, \"prune_thresholds\": %s}\n",
            s->hidden, layers_claim, s->vocab, taps, s->hidden, s->heads, s->kv_heads, s->head_dim, s->ffn, chain, thr);
    fclose(f);
    tm_t t[40];
    int n = 0;
#define ADD(NM_, d0, d1, isnorm) do { snprintf(t[n].name, sizeof t[n].name, "%s", NM_); t[n].nd = ((d1) != 0) ? 2 : 1; \
    t[n].shape[0] = d0; t[n].shape[1] = d1; t[n].norm = isnorm; n++; } while (0)
    ADD("fc.weight", s->hidden, (long)n_taps * s->hidden, 0);
    ADD("hidden_norm.weight", s->hidden, 0, 1);
    ADD("norm.weight", s->hidden, 0, 1);
    ADD("markov.embed.weight", s->vocab, 4, 0);
    ADD("markov.out.weight", s->vocab, 4, 0);
    ADD("confidence.weight", 1, s->hidden, 0);
    ADD("confidence.bias", 1, 0, 1);
    if (chain) {
        ADD("chain.enorm.weight", s->hidden, 0, 1);
        ADD("chain.inp.weight", chain, 2L * s->hidden, 0);
        ADD("chain.rec.weight", chain, chain, 0);
        ADD("chain.out.weight", s->hidden, chain, 0);
    }
    tm_layer_tensors(s, "layers.0", 1, t, &n);
    tm_layer_tensors(s, "layers.1", 1, t, &n);
#undef ADD
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    return tm_write_tensors(path, t, n, s->bf16, seed);
}
#endif
