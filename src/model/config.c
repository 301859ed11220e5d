/* config — parse and validate a Hugging Face config.json into td_config.
 *
 * Design: the JSON is untrusted. Each field is read through a typed getter that
 * accepts only the JSON type it expects (an integer must be an exact integral
 * number in int range; JSON null counts as absent) and names the field in its
 * error. After reading, every value is range-checked against sane limits and
 * against the others (kv heads divide heads, head_dim even and <= 512, ...).
 * Architectures: Qwen3ForCausalLM (qk_norm = 1) and LlamaForCausalLM.
 * Rope: transformers >= 5 writes "rope_parameters" {rope_type, rope_theta, factor,
 * low_freq_factor, high_freq_factor, original_max_position_embeddings}; older
 * files write top-level "rope_theta" plus "rope_scaling" {"rope_type"|"type", ...}.
 * Both are read; only "default" and "llama3" are supported. Features the forward
 * does not implement (a non-SiLU activation, sliding-window attention, MLP
 * biases) are refused rather than silently computed wrong. */
#include "model/model.h"
#include "util/util.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#define CFG_MAX_VOCAB (4 * 1024 * 1024)
#define CFG_MAX_EMBD 65536
#define CFG_MAX_LAYER 1024
#define CFG_MAX_HEAD 1024
#define CFG_MAX_HEAD_DIM 512
#define CFG_MAX_FF (1024 * 1024)
#define CFG_MAX_CTX (1 << 28)

static const cJSON *cfg_item(const cJSON *o, const char *key) {
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(o, key);
    return (j && !cJSON_IsNull(j)) ? j : NULL;
}

/* 1 = found (stored), 0 = absent, <0 = error. */
static int cfg_int(const cJSON *o, const char *key, const char *where, int *out, td_err *err) {
    const cJSON *j = cfg_item(o, key);
    if (!j) return 0;
    if (!cJSON_IsNumber(j))
        return td_seterr(err, TD_EFORMAT, "%s: field %s is not a number", where, key);
    double d = j->valuedouble;
    if (!isfinite(d) || floor(d) != d || d < -2147483648.0 || d > 2147483647.0)
        return td_seterr(err, TD_ERANGE, "%s: field %s = %g is not an integer in int range", where, key, d);
    *out = (int)d;
    return 1;
}

static int cfg_num(const cJSON *o, const char *key, const char *where, double *out, td_err *err) {
    const cJSON *j = cfg_item(o, key);
    if (!j) return 0;
    if (!cJSON_IsNumber(j) || !isfinite(j->valuedouble))
        return td_seterr(err, TD_EFORMAT, "%s: field %s is not a finite number", where, key);
    *out = j->valuedouble;
    return 1;
}

static int cfg_bool(const cJSON *o, const char *key, const char *where, int *out, td_err *err) {
    const cJSON *j = cfg_item(o, key);
    if (!j) return 0;
    if (cJSON_IsBool(j)) {
        *out = cJSON_IsTrue(j) ? 1 : 0;
        return 1;
    }
    if (cJSON_IsNumber(j) && (j->valuedouble == 0 || j->valuedouble == 1)) {
        *out = j->valuedouble != 0;
        return 1;
    }
    return td_seterr(err, TD_EFORMAT, "%s: field %s is not a boolean", where, key);
}

/* A required integer in [lo, hi]. */
static int cfg_req_int(const cJSON *o, const char *key, int lo, int hi, int *out, td_err *err) {
    int rc = cfg_int(o, key, "config.json", out, err);
    if (rc < 0) return rc;
    if (rc == 0) return td_seterr(err, TD_EFORMAT, "config.json: required field %s is missing", key);
    if (*out < lo || *out > hi)
        return td_seterr(err, TD_ERANGE, "config.json: field %s = %d is out of range [%d, %d]", key,
                         *out, lo, hi);
    return 0;
}

/* Read eos_token_id (int or list of ints) from o into ids/n (appending, deduped). */
static int cfg_eos(const cJSON *o, const char *where, int n_vocab, int32_t *ids, int *n, td_err *err) {
    const cJSON *j = cfg_item(o, "eos_token_id");
    if (!j) return 0;
    const cJSON *single[1] = {j};
    int count = cJSON_IsArray(j) ? cJSON_GetArraySize(j) : 1;
    if (!cJSON_IsArray(j) && !cJSON_IsNumber(j))
        return td_seterr(err, TD_EFORMAT, "%s: field eos_token_id is not an integer or a list", where);
    for (int i = 0; i < count; i++) {
        const cJSON *e = cJSON_IsArray(j) ? cJSON_GetArrayItem(j, i) : single[0];
        double d = cJSON_IsNumber(e) ? e->valuedouble : -1;
        if (!cJSON_IsNumber(e) || !isfinite(d) || floor(d) != d)
            return td_seterr(err, TD_EFORMAT, "%s: field eos_token_id[%d] is not an integer", where, i);
        if (d < 0 || d >= n_vocab)
            return td_seterr(err, TD_ERANGE, "%s: field eos_token_id = %g is outside the vocabulary (%d)",
                             where, d, n_vocab);
        int32_t id = (int32_t)d;
        int dup = 0;
        for (int k = 0; k < *n; k++) dup |= ids[k] == id;
        if (dup) continue;
        if (*n >= 8)
            return td_seterr(err, TD_ERANGE, "%s: field eos_token_id lists more than 8 distinct ids", where);
        ids[(*n)++] = id;
    }
    return 0;
}

/* Rope settings from a rope_parameters / rope_scaling object (may be NULL). */
static int cfg_rope(td_config *c, const cJSON *rp, const char *field, td_err *err) {
    if (!rp) return 0;
    char where[64];
    snprintf(where, sizeof where, "config.json: %s", field);
    if (!cJSON_IsObject(rp)) return td_seterr(err, TD_EFORMAT, "%s is not an object", where);
    const cJSON *t = cfg_item(rp, "rope_type");
    if (!t) t = cfg_item(rp, "type");
    const char *type = "default";
    if (t) {
        if (!cJSON_IsString(t) || !t->valuestring)
            return td_seterr(err, TD_EFORMAT, "%s: field rope_type is not a string", where);
        type = t->valuestring;
    }
    double theta;
    int rc = cfg_num(rp, "rope_theta", where, &theta, err);
    if (rc < 0) return rc;
    if (rc == 1) c->rope_theta = theta;
    if (strcmp(type, "default") == 0) {
        c->rope_scaling = TD_ROPE_NONE;
        return 0;
    }
    if (strcmp(type, "llama3") != 0)
        return td_seterr(err, TD_EUNSUPPORTED, "%s: rope_type \"%.40s\" is not supported (only default, llama3)",
                         where, type);
    c->rope_scaling = TD_ROPE_LLAMA3;
    static const char *keys[3] = {"factor", "low_freq_factor", "high_freq_factor"};
    double *vals[3] = {&c->rope_factor, &c->rope_low_freq_factor, &c->rope_high_freq_factor};
    for (int i = 0; i < 3; i++) {
        rc = cfg_num(rp, keys[i], where, vals[i], err);
        if (rc < 0) return rc;
        if (rc == 0) return td_seterr(err, TD_EFORMAT, "%s: llama3 rope needs field %s", where, keys[i]);
        if (!(*vals[i] > 0) || *vals[i] > 1e6)
            return td_seterr(err, TD_ERANGE, "%s: field %s = %g must be in (0, 1e6]", where, keys[i], *vals[i]);
    }
    if (!(c->rope_high_freq_factor > c->rope_low_freq_factor))
        return td_seterr(err, TD_ERANGE, "%s: high_freq_factor (%g) must exceed low_freq_factor (%g)", where,
                         c->rope_high_freq_factor, c->rope_low_freq_factor);
    rc = cfg_int(rp, "original_max_position_embeddings", where, &c->rope_orig_ctx, err);
    if (rc < 0) return rc;
    if (rc == 0)
        return td_seterr(err, TD_EFORMAT, "%s: llama3 rope needs field original_max_position_embeddings", where);
    if (c->rope_orig_ctx < 1 || c->rope_orig_ctx > CFG_MAX_CTX)
        return td_seterr(err, TD_ERANGE, "%s: field original_max_position_embeddings = %d is out of range",
                         where, c->rope_orig_ctx);
    return 0;
}

static int cfg_from_json(td_config *c, const cJSON *root, td_err *err) {
    if (!cJSON_IsObject(root)) return td_seterr(err, TD_EFORMAT, "config.json: not a JSON object");
    const cJSON *archs = cfg_item(root, "architectures");
    const cJSON *a0 = cJSON_IsArray(archs) ? cJSON_GetArrayItem(archs, 0) : NULL;
    if (!a0 || !cJSON_IsString(a0) || !a0->valuestring)
        return td_seterr(err, TD_EFORMAT, "config.json: field architectures must be a list of strings");
    if (strcmp(a0->valuestring, "Qwen3ForCausalLM") == 0) {
        c->arch = TD_ARCH_QWEN3;
        c->qk_norm = 1;
    } else if (strcmp(a0->valuestring, "LlamaForCausalLM") == 0) {
        c->arch = TD_ARCH_LLAMA;
    } else {
        return td_seterr(err, TD_EUNSUPPORTED,
                         "config.json: architectures[0] \"%.64s\" is not supported "
                         "(Qwen3ForCausalLM, LlamaForCausalLM)",
                         a0->valuestring);
    }
    snprintf(c->arch_name, sizeof c->arch_name, "%s", a0->valuestring);

    int rc;
    if ((rc = cfg_req_int(root, "vocab_size", 1, CFG_MAX_VOCAB, &c->n_vocab, err))) return rc;
    if ((rc = cfg_req_int(root, "hidden_size", 1, CFG_MAX_EMBD, &c->n_embd, err))) return rc;
    if ((rc = cfg_req_int(root, "num_hidden_layers", 1, CFG_MAX_LAYER, &c->n_layer, err))) return rc;
    if ((rc = cfg_req_int(root, "num_attention_heads", 1, CFG_MAX_HEAD, &c->n_head, err))) return rc;
    if ((rc = cfg_req_int(root, "intermediate_size", 1, CFG_MAX_FF, &c->n_ff, err))) return rc;
    if ((rc = cfg_req_int(root, "max_position_embeddings", 1, CFG_MAX_CTX, &c->n_ctx_train, err))) return rc;

    c->n_kv_head = c->n_head;
    if ((rc = cfg_int(root, "num_key_value_heads", "config.json", &c->n_kv_head, err)) < 0) return rc;
    if (c->n_kv_head < 1 || c->n_kv_head > c->n_head)
        return td_seterr(err, TD_ERANGE, "config.json: field num_key_value_heads = %d must be in [1, %d]",
                         c->n_kv_head, c->n_head);
    if (c->n_head % c->n_kv_head != 0)
        return td_seterr(err, TD_ERANGE,
                         "config.json: num_key_value_heads = %d does not divide num_attention_heads = %d",
                         c->n_kv_head, c->n_head);

    if ((rc = cfg_int(root, "head_dim", "config.json", &c->head_dim, err)) < 0) return rc;
    if (rc == 0) {
        if (c->n_embd % c->n_head != 0)
            return td_seterr(err, TD_ERANGE,
                             "config.json: num_attention_heads = %d does not divide hidden_size = %d "
                             "(and head_dim is not given)",
                             c->n_head, c->n_embd);
        c->head_dim = c->n_embd / c->n_head;
    }
    if (c->head_dim < 2 || c->head_dim > CFG_MAX_HEAD_DIM || c->head_dim % 2 != 0)
        return td_seterr(err, TD_ERANGE, "config.json: field head_dim = %d must be even and in [2, %d]",
                         c->head_dim, CFG_MAX_HEAD_DIM);
    if ((long long)c->n_head * c->head_dim > CFG_MAX_EMBD * 4LL)
        return td_seterr(err, TD_ERANGE, "config.json: num_attention_heads x head_dim = %lld is too large",
                         (long long)c->n_head * c->head_dim);

    double eps = 1e-6;
    if ((rc = cfg_num(root, "rms_norm_eps", "config.json", &eps, err)) < 0) return rc;
    if (!(eps > 0) || eps > 1)
        return td_seterr(err, TD_ERANGE, "config.json: field rms_norm_eps = %g must be in (0, 1]", eps);
    c->rms_eps = (float)eps;
    if (!(c->rms_eps > 0)) /* underflowed as float */
        return td_seterr(err, TD_ERANGE, "config.json: field rms_norm_eps = %g underflows a float", eps);

    c->tied = 0;
    if ((rc = cfg_bool(root, "tie_word_embeddings", "config.json", &c->tied, err)) < 0) return rc;
    c->attn_bias = 0;
    if ((rc = cfg_bool(root, "attention_bias", "config.json", &c->attn_bias, err)) < 0) return rc;
    int mlp_bias = 0;
    if ((rc = cfg_bool(root, "mlp_bias", "config.json", &mlp_bias, err)) < 0) return rc;
    if (mlp_bias) return td_seterr(err, TD_EUNSUPPORTED, "config.json: field mlp_bias = true is not supported");
    /* Sliding-window attention takes effect (as in transformers) only with a numeric
     * sliding_window: with use_sliding_window = true, or on "sliding_attention" layers. */
    const cJSON *sw = cfg_item(root, "sliding_window");
    int has_window = sw && cJSON_IsNumber(sw);
    int swa = 0;
    if ((rc = cfg_bool(root, "use_sliding_window", "config.json", &swa, err)) < 0) return rc;
    if (swa && has_window)
        return td_seterr(err, TD_EUNSUPPORTED,
                         "config.json: field use_sliding_window = true (sliding-window attention) is not supported");
    const cJSON *lt = cfg_item(root, "layer_types"); /* newer transformers: per-layer attention kind */
    if (lt) {
        if (!cJSON_IsArray(lt))
            return td_seterr(err, TD_EFORMAT, "config.json: field layer_types is not a list");
        int i = 0;
        const cJSON *e;
        cJSON_ArrayForEach(e, lt) {
            if (!cJSON_IsString(e) || !e->valuestring)
                return td_seterr(err, TD_EFORMAT, "config.json: field layer_types[%d] is not a string", i);
            int full = strcmp(e->valuestring, "full_attention") == 0;
            int sliding = strcmp(e->valuestring, "sliding_attention") == 0;
            if (!full && !(sliding && !has_window))
                return td_seterr(err, TD_EUNSUPPORTED,
                                 "config.json: field layer_types[%d] = \"%.32s\" is not supported (full_attention)",
                                 i, e->valuestring);
            i++;
        }
    }
    const cJSON *act = cfg_item(root, "hidden_act");
    if (act) {
        if (!cJSON_IsString(act) || !act->valuestring)
            return td_seterr(err, TD_EFORMAT, "config.json: field hidden_act is not a string");
        if (strcmp(act->valuestring, "silu") != 0 && strcmp(act->valuestring, "swish") != 0)
            return td_seterr(err, TD_EUNSUPPORTED, "config.json: field hidden_act = \"%.32s\" is not supported (silu)",
                             act->valuestring);
    }

    /* rope: top-level rope_theta, then rope_scaling (old), then rope_parameters (new) */
    c->rope_theta = 10000.0;
    c->rope_scaling = TD_ROPE_NONE;
    if ((rc = cfg_num(root, "rope_theta", "config.json", &c->rope_theta, err)) < 0) return rc;
    const cJSON *rs = cfg_item(root, "rope_scaling");
    if ((rc = cfg_rope(c, rs, "rope_scaling", err))) return rc;
    const cJSON *rp = cfg_item(root, "rope_parameters");
    if ((rc = cfg_rope(c, rp, "rope_parameters", err))) return rc;
    if (!(c->rope_theta > 0) || c->rope_theta > 1e12)
        return td_seterr(err, TD_ERANGE, "config.json: field rope_theta = %g must be in (0, 1e12]", c->rope_theta);

    c->n_eos = 0;
    if ((rc = cfg_eos(root, "config.json", c->n_vocab, c->eos_ids, &c->n_eos, err))) return rc;
    c->bos_id = -1;
    int bos = -1;
    if ((rc = cfg_int(root, "bos_token_id", "config.json", &bos, err)) < 0) return rc;
    if (rc == 1) {
        if (bos < 0 || bos >= c->n_vocab)
            return td_seterr(err, TD_ERANGE, "config.json: field bos_token_id = %d is outside the vocabulary (%d)",
                             bos, c->n_vocab);
        c->bos_id = bos;
    }
    return 0;
}

int td_config_parse(td_config *cfg, const char *json, size_t len, td_err *err) {
    if (!cfg || !json) return td_seterr(err, TD_EINVAL, "td_config_parse: NULL argument");
    memset(cfg, 0, sizeof *cfg);
    cfg->bos_id = -1;
    cJSON *root = cJSON_ParseWithLength(json, len);
    if (!root) return td_seterr(err, TD_EFORMAT, "config.json: not valid JSON");
    int rc = cfg_from_json(cfg, root, err);
    cJSON_Delete(root);
    if (rc) {
        memset(cfg, 0, sizeof *cfg);
        cfg->bos_id = -1;
    }
    return rc;
}

int td_config_merge_generation(td_config *cfg, const char *json, size_t len, const char *path, td_err *err) {
    cJSON *root = cJSON_ParseWithLength(json, len);
    if (!root) return td_seterr(err, TD_EFORMAT, "%s: not valid JSON", path);
    int rc = 0;
    if (!cJSON_IsObject(root)) {
        rc = td_seterr(err, TD_EFORMAT, "%s: not a JSON object", path);
        goto out;
    }
    int32_t ids[8] = {0};
    int n = 0;
    rc = cfg_eos(root, path, cfg->n_vocab, ids, &n, err);
    if (rc) goto out;
    /* generation_config's ids first, then the config's that it does not repeat */
    for (int i = 0; i < cfg->n_eos; i++) {
        int dup = 0;
        for (int k = 0; k < n; k++) dup |= ids[k] == cfg->eos_ids[i];
        if (dup) continue;
        if (n >= 8) {
            rc = td_seterr(err, TD_ERANGE, "%s: eos_token_id with config.json's gives more than 8 ids", path);
            goto out;
        }
        ids[n++] = cfg->eos_ids[i];
    }
    memcpy(cfg->eos_ids, ids, sizeof ids);
    cfg->n_eos = n;
    int bos;
    rc = cfg_int(root, "bos_token_id", path, &bos, err);
    if (rc < 0) goto out;
    if (rc == 1) {
        if (bos < 0 || bos >= cfg->n_vocab) {
            rc = td_seterr(err, TD_ERANGE, "%s: field bos_token_id = %d is outside the vocabulary (%d)", path,
                           bos, cfg->n_vocab);
            goto out;
        }
        cfg->bos_id = bos;
    }
    rc = 0;
out:
    cJSON_Delete(root);
    return rc;
}
