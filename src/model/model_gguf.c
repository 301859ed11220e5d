/* model_gguf — open a llama.cpp GGUF file (architectures qwen3, llama).
 *
 * Design: the file is mapped and validated by io/gguf.c. The config is read
 * from the metadata keys "<arch>.*" (table mg_keys: each GGUF key and the
 * config.json field it stands for), assembled as a config.json document and
 * parsed by td_config_parse, so both layouts share every range and
 * consistency check; errors name the GGUF key. Weights are bound by llama.cpp's
 * names (td_weight_specs gives both names of every tensor) with the dims
 * reversed (GGUF lists the innermost first) and must be of a computable type.
 * llama.cpp's converter permutes the rows of the q and k projections of the
 * llama architecture (not qwen3) from Hugging Face's rotate-half layout to
 * interleaved pairs; those rows are permuted back into one owned buffer
 * (one entry of m->owned), everything else stays a view of the mapping.
 * Llama 3 rope scaling: llama.cpp stores it only as a tensor of per-frequency
 * factors (rope_freqs.weight). tandem's writer also stores the parameters
 * (tandem.rope.llama3.*); without them the factors are matched against the
 * usual parameters (low 1, high 4, original context from
 * <arch>.rope.scaling.original_context_length or 8192) and refused otherwise.
 * The tokenizer comes from tokenizer.ggml.* (tok/tok_gguf.c). */
#include "model/model.h"
#include "io/gguf.h"
#include "tok/tok_gguf.h"
#include "util/util.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* GGUF key (after "<arch>.") -> config.json field. */
static const struct { const char *gguf, *hf; int is_float; } mg_keys[] = {
    {"vocab_size", "vocab_size", 0},
    {"embedding_length", "hidden_size", 0},
    {"block_count", "num_hidden_layers", 0},
    {"attention.head_count", "num_attention_heads", 0},
    {"attention.head_count_kv", "num_key_value_heads", 0},
    {"attention.key_length", "head_dim", 0},
    {"feed_forward_length", "intermediate_size", 0},
    {"context_length", "max_position_embeddings", 0},
    {"attention.layer_norm_rms_epsilon", "rms_norm_eps", 1},
    {"rope.freq_base", "rope_theta", 1},
};
#define MG_N_KEYS (sizeof mg_keys / sizeof mg_keys[0])

static const struct { const char *gguf, *hf; } mg_archs[] = {
    {"qwen3", "Qwen3ForCausalLM"},
    {"llama", "LlamaForCausalLM"},
};

/* Llama 3 frequency factor of pair i, as llama.cpp's converter computes it. */
static double mg_llama3_factor(const td_config *c, int i) {
    double freq = 1.0 / pow(c->rope_theta, (2.0 * i) / c->head_dim);
    double wl = 2 * 3.14159265358979323846 / freq, lo = c->rope_orig_ctx / c->rope_low_freq_factor;
    double hi = c->rope_orig_ctx / c->rope_high_freq_factor;
    if (wl < hi) return 1.0;
    if (wl > lo) return c->rope_factor;
    double s = (c->rope_orig_ctx / wl - c->rope_low_freq_factor) / (c->rope_high_freq_factor - c->rope_low_freq_factor);
    return 1.0 / ((1 - s) / c->rope_factor + s);
}

int td_llama3_rope_factors(const td_config *c, float *out) {
    for (int i = 0; i < c->head_dim / 2; i++) out[i] = (float)mg_llama3_factor(c, i);
    return c->head_dim / 2;
}

/* Llama 3 rope parameters into the config document. */
static int mg_rope(const td_gguf_file *f, const char *arch, cJSON *cfg, td_err *err) {
    char key[128];
    double fac, lo, hi;
    uint32_t orig = 8192;
    snprintf(key, sizeof key, "%s.rope.scaling.type", arch);
    td_gguf_str st;
    int rc = td_gguf_get_str(f, key, &st, err);
    if (rc < 0) return rc;
    if (rc == 1 && !(st.len == 4 && !memcmp(st.s, "none", 4)))
        return td_seterr(err, TD_EUNSUPPORTED, "%s: %s = \"%.*s\" is not supported (none; Llama 3 scaling via rope_freqs)",
                         f->path, key, (int)(st.len > 32 ? 32 : st.len), st.s);
    snprintf(key, sizeof key, "%s.rope.scaling.original_context_length", arch);
    if ((rc = td_gguf_get_u32(f, key, &orig, err)) < 0) return rc;
    int has = td_gguf_get_f64(f, "tandem.rope.llama3.factor", &fac, err);
    if (has < 0) return has;
    const td_gguf_tensor *t = td_gguf_find_tensor(f, "rope_freqs.weight");
    if (has == 1) {
        if (td_gguf_get_f64(f, "tandem.rope.llama3.low_freq_factor", &lo, err) != 1 ||
            td_gguf_get_f64(f, "tandem.rope.llama3.high_freq_factor", &hi, err) != 1)
            return td_seterr(err, TD_EFORMAT, "%s: tandem.rope.llama3.factor without low_freq_factor/high_freq_factor (F32)", f->path);
    } else if (t) {
        if (t->type->dtype != TD_DTYPE_F32 || t->n_dims != 1)
            return td_seterr(err, TD_EFORMAT, "%s: tensor rope_freqs.weight must be a 1-D F32 tensor", f->path);
        fac = ((const float *)t->data)[t->ne[0] - 1];
        lo = 1;
        hi = 4;
    } else {
        return 0;
    }
    cJSON *rp = cJSON_AddObjectToObject(cfg, "rope_parameters");
    if (!rp) return td_seterr(err, TD_ENOMEM, "out of memory");
    cJSON_AddStringToObject(rp, "rope_type", "llama3");
    cJSON_AddNumberToObject(rp, "factor", fac);
    cJSON_AddNumberToObject(rp, "low_freq_factor", lo);
    cJSON_AddNumberToObject(rp, "high_freq_factor", hi);
    cJSON_AddNumberToObject(rp, "original_max_position_embeddings", orig);
    return has == 1 ? 0 : 1; /* 1: check the factors once the config is parsed */
}

/* rope_freqs.weight against the llama3 parameters in c. */
static int mg_check_factors(const td_gguf_file *f, const td_config *c, td_err *err) {
    const td_gguf_tensor *t = td_gguf_find_tensor(f, "rope_freqs.weight");
    if (t->ne[0] != c->head_dim / 2)
        return td_seterr(err, TD_EFORMAT, "%s: rope_freqs.weight has %lld factors, head_dim / 2 = %d", f->path,
                         (long long)t->ne[0], c->head_dim / 2);
    const float *v = t->data;
    for (int i = 0; i < c->head_dim / 2; i++) {
        double want = mg_llama3_factor(c, i);
        if (!(fabs(v[i] - want) <= 1e-5 * want))
            return td_seterr(err, TD_EUNSUPPORTED,
                             "%s: rope_freqs.weight[%d] = %g does not match Llama 3 scaling with factor %g, low_freq_factor 1, "
                             "high_freq_factor 4, original context %d (%g); other rope frequency factors are not supported",
                             f->path, i, (double)v[i], c->rope_factor, c->rope_orig_ctx, want);
    }
    return 0;
}

/* td_config_parse's message with each config.json field name replaced by
 * its GGUF key ("field hidden_size = 0" -> "key qwen3.embedding_length = 0"). */
static int mg_config_error(const td_gguf_file *f, const char *arch, const td_err *ce, td_err *err) {
    const char *msg = ce->msg;
    if (!strncmp(msg, "config.json: ", 13)) msg += 13;
    char out[sizeof ce->msg];
    size_t o = 0;
    while (*msg && o + 1 < sizeof out) {
        int done = 0;
        for (size_t i = 0; i < MG_N_KEYS && !done; i++) {
            size_t l = strlen(mg_keys[i].hf);
            char after = msg[l];
            if (strncmp(msg, mg_keys[i].hf, l) || after == '_' || (after >= 'a' && after <= 'z')) continue;
            int w = snprintf(out + o, sizeof out - o, "%s.%s", arch, mg_keys[i].gguf);
            o = w < 0 || (size_t)w >= sizeof out - o ? sizeof out - 1 : o + (size_t)w;
            msg += l;
            done = 1;
        }
        if (done) continue;
        if (!strncmp(msg, "field ", 6)) {
            memcpy(out + o, "key ", 4 < sizeof out - 1 - o ? 4 : 0);
            o += 4 < sizeof out - 1 - o ? 4 : 0;
            msg += 6;
            continue;
        }
        char c = *msg++;
        out[o++] = c;
        /* do not match names inside longer words */
        if ((c >= 'a' && c <= 'z') || c == '_') {
            while (*msg && ((*msg >= 'a' && *msg <= 'z') || *msg == '_') && o + 1 < sizeof out) out[o++] = *msg++;
        }
    }
    out[o] = 0;
    return td_seterr(err, ce->code, "%s: %s", f->path, out);
}

static int mg_config(td_model *m, const td_gguf_file *f, td_err *err) {
    td_gguf_str s;
    int rc = td_gguf_get_str(f, "general.architecture", &s, err);
    if (rc < 0) return rc;
    if (rc == 0) return td_seterr(err, TD_EFORMAT, "%s: key general.architecture is missing", f->path);
    const char *arch = NULL, *hf = NULL;
    for (size_t i = 0; i < sizeof mg_archs / sizeof mg_archs[0]; i++)
        if (strlen(mg_archs[i].gguf) == s.len && !memcmp(mg_archs[i].gguf, s.s, s.len)) arch = mg_archs[i].gguf, hf = mg_archs[i].hf;
    if (!arch)
        return td_seterr(err, TD_EUNSUPPORTED, "%s: general.architecture = \"%.*s\" is not supported (qwen3, llama)", f->path,
                         (int)(s.len > 40 ? 40 : s.len), s.s);
    cJSON *cfg = cJSON_CreateObject();
    if (!cfg) return td_seterr(err, TD_ENOMEM, "out of memory");
    rc = 0;
    cJSON *archs = cJSON_AddArrayToObject(cfg, "architectures");
    cJSON_AddItemToArray(archs, cJSON_CreateString(hf));
    char key[128];
    for (size_t i = 0; i < MG_N_KEYS && !rc; i++) {
        snprintf(key, sizeof key, "%s.%s", arch, mg_keys[i].gguf);
        uint32_t u;
        double d;
        int got = mg_keys[i].is_float ? td_gguf_get_f64(f, key, &d, err) : td_gguf_get_u32(f, key, &u, err);
        if (got < 0) { rc = got; break; }
        if (got == 1) cJSON_AddNumberToObject(cfg, mg_keys[i].hf, mg_keys[i].is_float ? d : (double)u);
    }
    const td_gguf_tensor *embd = td_gguf_find_tensor(f, "token_embd.weight");
    if (!rc && !cJSON_GetObjectItem(cfg, "vocab_size") && embd && embd->n_dims == 2) /* not always written */
        cJSON_AddNumberToObject(cfg, "vocab_size", (double)embd->ne[1]);
    uint32_t vl, rd;
    snprintf(key, sizeof key, "%s.attention.value_length", arch);
    int got = rc ? 0 : td_gguf_get_u32(f, key, &vl, err);
    const cJSON *kl = cJSON_GetObjectItem(cfg, "head_dim");
    if (got < 0) rc = got;
    else if (got == 1 && (!kl || kl->valuedouble != vl))
        rc = td_seterr(err, TD_EUNSUPPORTED, "%s: %s = %u differs from %s.attention.key_length (not supported)", f->path, key, vl, arch);
    snprintf(key, sizeof key, "%s.rope.dimension_count", arch);
    got = rc ? 0 : td_gguf_get_u32(f, key, &rd, err);
    if (got < 0) rc = got;
    else if (got == 1) {
        const cJSON *e = cJSON_GetObjectItem(cfg, "hidden_size"), *h = cJSON_GetObjectItem(cfg, "num_attention_heads");
        double hd = kl ? kl->valuedouble : (e && h && h->valuedouble > 0 ? floor(e->valuedouble / h->valuedouble) : 0);
        if (rd != hd)
            rc = td_seterr(err, TD_EUNSUPPORTED, "%s: %s = %u is not the head size %g (partial rotary is not supported)", f->path, key, rd, hd);
    }
    snprintf(key, sizeof key, "%s.expert_count", arch);
    if (!rc && td_gguf_find_kv(f, key)) rc = td_seterr(err, TD_EUNSUPPORTED, "%s: %s: mixture-of-experts models are not supported", f->path, key);
    int check_factors = 0;
    if (!rc) {
        rc = mg_rope(f, arch, cfg, err);
        if (rc == 1) check_factors = 1, rc = 0;
    }
    if (!rc) {
        cJSON_AddBoolToObject(cfg, "tie_word_embeddings", td_gguf_find_tensor(f, "output.weight") == NULL);
        cJSON_AddBoolToObject(cfg, "attention_bias", td_gguf_find_tensor(f, "blk.0.attn_q.bias") != NULL);
        /* eos: eos, then end-of-turn / end-of-message ids (td_config_parse drops repeats) */
        static const char *eos_keys[] = {"tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"};
        cJSON *eos = cJSON_AddArrayToObject(cfg, "eos_token_id");
        for (int i = 0; i < 3 && !rc; i++) {
            uint32_t id;
            got = td_gguf_get_u32(f, eos_keys[i], &id, err);
            if (got < 0) rc = got;
            else if (got == 1) cJSON_AddItemToArray(eos, cJSON_CreateNumber(id));
        }
        uint32_t bos;
        got = rc ? 0 : td_gguf_get_u32(f, "tokenizer.ggml.bos_token_id", &bos, err);
        if (got < 0) rc = got;
        else if (got == 1) cJSON_AddNumberToObject(cfg, "bos_token_id", bos);
    }
    char *txt = rc ? NULL : cJSON_PrintUnformatted(cfg);
    cJSON_Delete(cfg);
    if (rc) return rc;
    if (!txt) return td_seterr(err, TD_ENOMEM, "out of memory");
    td_err ce = {0};
    rc = td_config_parse(&m->cfg, txt, strlen(txt), &ce);
    free(txt);
    if (rc) return mg_config_error(f, arch, &ce, err);
    if (check_factors) return mg_check_factors(f, &m->cfg, err);
    return 0;
}

/* Rows of a q/k projection (or bias) from llama.cpp's interleaved order back to
 * Hugging Face's: HF row h*D + half*D/2 + i is GGUF row h*D + 2*i + half. */
static void mg_unpermute(unsigned char *dst, const unsigned char *src, int n_heads, int D, size_t row) {
    for (int h = 0; h < n_heads; h++)
        for (int half = 0; half < 2; half++)
            for (int i = 0; i < D / 2; i++)
                memcpy(dst + ((size_t)h * D + (size_t)half * (D / 2) + i) * row, src + ((size_t)h * D + 2 * (size_t)i + half) * row, row);
}

static int mg_bind(td_model *m, const td_gguf_file *f, td_err *err) {
    const td_config *c = &m->cfg;
    m->w.layers = calloc((size_t)c->n_layer, sizeof *m->w.layers);
    if (!m->w.layers) return td_seterr(err, TD_ENOMEM, "out of memory for %d layers", c->n_layer);
    int permute = c->arch == TD_ARCH_LLAMA;
    size_t owned = 0, used = 0;
    td_wspec s[TD_WSPEC_MAX];
    char nm[256];
    /* pass 0 checks and binds, and sizes the q/k rows to rewrite; pass 1 rewrites them */
    for (int pass = 0; pass < 2; pass++) {
        for (int i = -1; i < c->n_layer; i++) {
            int n = td_weight_specs(m, i, s);
            for (int j = 0; j < n; j++) {
                if (!s[j].when) continue;
                if (i < 0) snprintf(nm, sizeof nm, "%s", s[j].gguf);
                else snprintf(nm, sizeof nm, "blk.%d.%s", i, s[j].gguf);
                const td_gguf_tensor *t = td_gguf_find_tensor(f, nm);
                if (pass == 1) {
                    if (!permute || !s[j].qk) continue;
                    unsigned char *dst = (unsigned char *)m->owned[m->n_owned - 1] + used;
                    size_t row = t->nbytes / (size_t)s[j].d0;
                    mg_unpermute(dst, t->data, s[j].qk == TD_WSPEC_Q ? c->n_head : c->n_kv_head, c->head_dim, row);
                    s[j].t->data = dst;
                    s[j].t->file = NULL; /* rewritten: no longer the file's bytes */
                    used += (t->nbytes + 63) / 64 * 64;
                    continue;
                }
                if (!t) return td_seterr(err, TD_EFORMAT, "%s: tensor %s is missing", f->path, nm);
                int64_t want0 = s[j].nd == 2 ? s[j].d1 : s[j].d0, want1 = s[j].nd == 2 ? s[j].d0 : 1;
                if (t->n_dims != s[j].nd || t->ne[0] != want0 || t->ne[1] != want1) {
                    char got[96] = "";
                    for (int k = 0, p = 0; k < t->n_dims; k++)
                        p += snprintf(got + p, sizeof got - (size_t)p, "%s%lld", k ? ", " : "", (long long)t->ne[k]);
                    if (s[j].nd == 2)
                        return td_seterr(err, TD_EFORMAT, "%s: tensor %s: ne [%s] but the metadata implies [%lld, %lld]", f->path,
                                         nm, got, (long long)want0, (long long)want1);
                    return td_seterr(err, TD_EFORMAT, "%s: tensor %s: ne [%s] but the metadata implies [%lld]", f->path, nm,
                                     got, (long long)want0);
                }
                if (t->type->dtype < 0 || (t->type->block > 1 && s[j].nd != 2))
                    return td_seterr(err, TD_EUNSUPPORTED, "%s: tensor %s has type %s, which tandem cannot compute with%s",
                                     f->path, nm, t->type->name, t->type->dtype >= 0 ? " in a 1-D tensor" : "");
                memset(s[j].t, 0, sizeof *s[j].t);
                s[j].t->data = t->data;
                s[j].t->file = f->mapped ? t->data : NULL;
                s[j].t->dtype = t->type->dtype;
                s[j].t->n_dims = s[j].nd;
                s[j].t->shape[0] = s[j].d0;
                s[j].t->shape[1] = s[j].nd == 2 ? s[j].d1 : 0;
                m->n_tensors++;
                m->weight_bytes += t->nbytes;
                m->n_params += (size_t)s[j].d0 * (size_t)(s[j].nd == 2 ? s[j].d1 : 1);
                m->dtype_count[t->type->dtype]++;
                m->dtype_bytes[t->type->dtype] += t->nbytes;
                if (permute && s[j].qk) owned += (t->nbytes + 63) / 64 * 64;
            }
        }
        if (pass == 0 && owned) {
            void **no = realloc(m->owned, (size_t)(m->n_owned + 1) * sizeof *no);
            if (no) m->owned = no;
            void *buf = no ? aligned_alloc(64, owned) : NULL;
            if (!buf) return td_seterr(err, TD_ENOMEM, "out of memory for %zu bytes of q/k weights", owned);
            m->owned[m->n_owned++] = buf;
        }
        if (!owned) break;
    }
    if (c->tied) m->w.lm_head = m->w.tok_embd;
    return 0;
}

int td_model_open_gguf(td_model *m, const char *path, td_err *err) {
    int rc = td_gguf_open(&m->gguf, path, err);
    if (rc) return rc;
    const td_gguf_file *f = m->gguf;
    if ((rc = mg_config(m, f, err))) return rc;
    if ((rc = mg_bind(m, f, err))) return rc;
    m->n_extra_tensors = f->n_tensors - m->n_tensors;
    td_model_main_dtype(m);
    if ((rc = td_tok_gguf_open(&m->tok, f, err))) return rc;
    if (m->tok) {
        int nv = td_tokenizer_n_vocab(m->tok);
        if (nv > m->cfg.n_vocab)
            return td_seterr(err, TD_EFORMAT, "%s: the tokenizer has %d ids but the model's vocabulary is %d", path, nv, m->cfg.n_vocab);
        m->chat = td_tokenizer_chat_style(m->tok);
    }
    return 0;
}
