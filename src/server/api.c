/* api — the OpenAI surface of `tandem serve`: request parsing and validation
 * (every field checked for type and range; errors are OpenAI-style JSON
 * {"error": {"message", "type", "param", "code"}} with an HTTP status), and
 * the JSON of responses, stream chunks, /v1/models and /metrics.
 *
 * Parsing runs on the HTTP thread: it renders the chat template, tokenizes
 * (the tokenizer is read-only and safe to share) and checks the prompt against
 * the context before the request is queued, so a bad request never reaches
 * the scheduler. Fields a client may send that tandem cannot honour exactly
 * (n > 1, best_of > 1, suffix, logit_bias, tools) get a 400 naming
 * the field rather than an approximation. */
#define _GNU_SOURCE
#include "server/srv.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- requests -------------------------------------------------------------- */

srv_req *srv_req_new(void) {
    srv_req *r = calloc(1, sizeof *r);
    if (!r) return NULL;
    r->refs = 1;
    pthread_cond_init(&r->cv, NULL);
    r->row = -1;
    return r;
}

void srv_req_unref(srv_req *r) {
    if (!r || --r->refs > 0) return;
    pthread_cond_destroy(&r->cv);
    free(r->prompt);
    free(r->echo);
    for (int i = 0; i < SRV_MAX_STOP; i++) free(r->stops[i]);
    free(r->text);
    free(r->ids);
    free(r->prov);
    free(r->lps);
    free(r);
}

void srv_req_fail(srv_req *r, int status, const char *type, const char *param, const char *code,
                  const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->err_msg, sizeof r->err_msg, fmt, ap);
    va_end(ap);
    r->err_status = status;
    r->err_type = type;
    r->err_param = param;
    r->err_code = code;
    r->state = REQ_FAILED;
    pthread_cond_broadcast(&r->cv);
}

static cJSON *text_item(const char *s, size_t n);

char *srv_api_error_json(const char *msg, const char *type, const char *param, const char *code) {
    cJSON *root = cJSON_CreateObject(), *e = cJSON_AddObjectToObject(root, "error");
    cJSON_AddItemToObject(e, "message", text_item(msg, strlen(msg))); /* may quote client bytes */
    cJSON_AddStringToObject(e, "type", type ? type : "invalid_request_error");
    if (param) cJSON_AddStringToObject(e, "param", param); else cJSON_AddNullToObject(e, "param");
    if (code) cJSON_AddStringToObject(e, "code", code); else cJSON_AddNullToObject(e, "code");
    char *s = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    return s;
}

/* ---- parsing --------------------------------------------------------------- */

typedef struct perr {
    int status;
    char msg[512];
    const char *type, *param, *code;
} perr;

static int bad(perr *pe, int status, const char *param, const char *code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(pe->msg, sizeof pe->msg, fmt, ap);
    va_end(ap);
    pe->status = status;
    pe->type = status == 404 ? "invalid_request_error" : status >= 500 ? "server_error" : "invalid_request_error";
    pe->param = param;
    pe->code = code;
    return status;
}

static int present(const cJSON *v) { return v && !cJSON_IsNull(v); }

/* Number field in [lo, hi]; integral when `integer`. 0 = absent/null. */
static int get_num(const cJSON *root, const char *k, double lo, double hi, int integer, double *out, perr *pe) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, k);
    if (!present(v)) return 0;
    if (!cJSON_IsNumber(v))
        return bad(pe, 400, k, "invalid_type", "'%s' must be %s", k, integer ? "an integer" : "a number");
    double d = v->valuedouble;
    if (!isfinite(d) || (integer && d != floor(d)))
        return bad(pe, 400, k, "invalid_type", "'%s' must be %s", k, integer ? "an integer" : "a finite number");
    if (d < lo || d > hi) return bad(pe, 400, k, "invalid_value", "'%s' is %g; it must be in [%g, %g]", k, d, lo, hi);
    *out = d;
    return -1;
}

static int get_bool(const cJSON *root, const char *k, int *out, perr *pe) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, k);
    if (!present(v)) return 0;
    if (!cJSON_IsBool(v)) return bad(pe, 400, k, "invalid_type", "'%s' must be a boolean", k);
    *out = cJSON_IsTrue(v);
    return -1;
}

#define NUM(k, lo, hi, integer, dst)                                         \
    do {                                                                      \
        double _d;                                                            \
        int _r = get_num(root, k, lo, hi, integer, &_d, pe);                  \
        if (_r > 0) goto fail;                                                \
        if (_r < 0) dst = _d;                                                 \
    } while (0)
#define BOOL(k, dst)                                                          \
    do {                                                                      \
        int _b, _r = get_bool(root, k, &_b, pe);                             \
        if (_r > 0) goto fail;                                                \
        if (_r < 0) dst = _b;                                                 \
    } while (0)
#define BAD(...) do { bad(pe, __VA_ARGS__); goto fail; } while (0)

static int tokenize_text(const char *text, int flags, int32_t **ids, int *n, const char *param, perr *pe) {
    size_t len = strlen(text);
    int need = td_tokenize(S.tok, text, len, flags, NULL, 0);
    if (need < 0) return bad(pe, 400, param, "invalid_prompt", "tokenizing the %s failed: %s", param, td_strerror(need));
    if (need == 0) return bad(pe, 400, param, "invalid_prompt", "the %s is empty: give at least one token of text", param);
    if (need >= S.n_ctx)
        return bad(pe, 400, param, "context_length_exceeded",
                   "the %s is %d tokens, longer than the context of %d positions (it must leave room for at least one new token)",
                   param, need, S.n_ctx);
    *ids = malloc(sizeof(int32_t) * (size_t)need);
    if (!*ids) return bad(pe, 500, NULL, "out_of_memory", "out of memory");
    td_tokenize(S.tok, text, len, flags, *ids, need);
    *n = need;
    return 0;
}

static int token_array(const cJSON *arr, int32_t **ids, int *n, perr *pe) {
    int m = cJSON_GetArraySize(arr);
    if (m == 0) return bad(pe, 400, "prompt", "invalid_prompt", "the prompt is empty: give at least one token");
    if (m >= S.n_ctx)
        return bad(pe, 400, "prompt", "context_length_exceeded",
                   "the prompt is %d tokens, longer than the context of %d positions (it must leave room for at least one new token)",
                   m, S.n_ctx);
    *ids = malloc(sizeof(int32_t) * (size_t)m);
    if (!*ids) return bad(pe, 500, NULL, "out_of_memory", "out of memory");
    int i = 0;
    const cJSON *t;
    cJSON_ArrayForEach(t, arr) {
        double d = cJSON_IsNumber(t) ? t->valuedouble : -1;
        if (!cJSON_IsNumber(t) || d != floor(d) || d < 0 || d >= S.n_vocab)
            return bad(pe, 400, "prompt", "invalid_prompt",
                       "prompt token at index %d is not a token id in [0, %d)", i, S.n_vocab);
        (*ids)[i++] = (int32_t)d;
    }
    *n = m;
    return 0;
}

/* Chat message content: a string, or an array of {"type": "text", "text"} parts. */
static char *message_content(const cJSON *c, int idx, perr *pe) {
    if (cJSON_IsString(c)) return strdup(c->valuestring);
    if (cJSON_IsNull(c) || !c) return strdup("");
    if (!cJSON_IsArray(c)) {
        bad(pe, 400, "messages", "invalid_type", "messages[%d].content must be a string or an array of text parts", idx);
        return NULL;
    }
    size_t len = 0;
    const cJSON *p;
    cJSON_ArrayForEach(p, c) {
        const cJSON *ty = cJSON_GetObjectItemCaseSensitive(p, "type"), *tx = cJSON_GetObjectItemCaseSensitive(p, "text");
        if (!cJSON_IsObject(p) || !cJSON_IsString(ty) || strcmp(ty->valuestring, "text") || !cJSON_IsString(tx)) {
            bad(pe, 400, "messages", "unsupported_content",
                "messages[%d].content: only parts {\"type\": \"text\", \"text\": ...} are supported", idx);
            return NULL;
        }
        len += strlen(tx->valuestring);
    }
    char *s = malloc(len + 1);
    if (!s) { bad(pe, 500, NULL, "out_of_memory", "out of memory"); return NULL; }
    s[0] = 0;
    size_t at = 0;
    cJSON_ArrayForEach(p, c) {
        const char *t = cJSON_GetObjectItemCaseSensitive(p, "text")->valuestring;
        size_t n = strlen(t);
        memcpy(s + at, t, n);
        at += n;
    }
    s[at] = 0;
    return s;
}

static int chat_prompt(const cJSON *msgs, srv_req *r, perr *pe) {
    if (!msgs) return bad(pe, 400, "messages", "missing_required_parameter", "'messages' is required");
    if (!cJSON_IsArray(msgs)) return bad(pe, 400, "messages", "invalid_type", "'messages' must be an array");
    int n = cJSON_GetArraySize(msgs);
    if (n == 0) return bad(pe, 400, "messages", "invalid_value", "'messages' must not be empty");
    if (n > 4096) return bad(pe, 400, "messages", "invalid_value", "too many messages (%d, at most 4096)", n);
    if (S.chat_style == TD_CHAT_NONE)
        return bad(pe, 400, "messages", "unsupported", "the model's tokenizer_config.json has no chat template tandem knows; use /v1/completions");
    td_chat_msg *cm = calloc((size_t)n, sizeof *cm);
    char **contents = calloc((size_t)n, sizeof *contents);
    char *rendered = NULL;
    int rc = 0, i = 0;
    if (!cm || !contents) { rc = bad(pe, 500, NULL, "out_of_memory", "out of memory"); goto out; }
    const cJSON *m;
    cJSON_ArrayForEach(m, msgs) {
        if (!cJSON_IsObject(m)) { rc = bad(pe, 400, "messages", "invalid_type", "messages[%d] must be an object", i); goto out; }
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
        if (!cJSON_IsString(role)) { rc = bad(pe, 400, "messages", "invalid_type", "messages[%d].role must be a string", i); goto out; }
        const char *rs = role->valuestring;
        if (!strcmp(rs, "developer")) rs = "system";
        if (strcmp(rs, "system") && strcmp(rs, "user") && strcmp(rs, "assistant")) {
            rc = bad(pe, 400, "messages", "invalid_value",
                     "messages[%d].role '%.64s' is not supported (system, developer, user, assistant)", i, role->valuestring);
            goto out;
        }
        if (!(contents[i] = message_content(cJSON_GetObjectItemCaseSensitive(m, "content"), i, pe))) { rc = pe->status; goto out; }
        cm[i].role = rs;
        cm[i].content = contents[i];
        i++;
    }
    int need = td_chat_render(S.chat_style, cm, n, 1, NULL, 0);
    if (need < 0) { rc = bad(pe, 400, "messages", "invalid_value", "cannot render the chat template: %s", td_strerror(need)); goto out; }
    if (!(rendered = malloc((size_t)need + 1))) { rc = bad(pe, 500, NULL, "out_of_memory", "out of memory"); goto out; }
    td_chat_render(S.chat_style, cm, n, 1, rendered, (size_t)need + 1);
    rc = tokenize_text(rendered, TD_TOK_PARSE_SPECIAL, &r->prompt, &r->n_prompt, "messages", pe);
out:
    for (int j = 0; contents && j < n; j++) free(contents[j]);
    free(contents);
    free(cm);
    free(rendered);
    return rc;
}

static int completion_prompt(const cJSON *p, srv_req *r, int echo, perr *pe) {
    if (!p) return bad(pe, 400, "prompt", "missing_required_parameter", "'prompt' is required");
    if (cJSON_IsArray(p) && cJSON_GetArraySize(p) >= 1 && !cJSON_IsNumber(cJSON_GetArrayItem(p, 0))) {
        /* a batch of prompts: tandem takes one per request */
        if (cJSON_GetArraySize(p) > 1)
            return bad(pe, 400, "prompt", "unsupported", "only one prompt per request is supported (got %d)", cJSON_GetArraySize(p));
        p = cJSON_GetArrayItem(p, 0);
        if (!cJSON_IsString(p) && !cJSON_IsArray(p))
            return bad(pe, 400, "prompt", "invalid_type", "'prompt' must be a string, an array of token ids, or an array of one of those");
    }
    if (cJSON_IsString(p)) {
        int rc = tokenize_text(p->valuestring, 0, &r->prompt, &r->n_prompt, "prompt", pe);
        if (!rc && echo && !(r->echo = strdup(p->valuestring))) return bad(pe, 500, NULL, "out_of_memory", "out of memory");
        return rc;
    }
    if (cJSON_IsArray(p)) {
        int rc = token_array(p, &r->prompt, &r->n_prompt, pe);
        if (!rc && echo) {
            int need = td_detokenize(S.tok, r->prompt, r->n_prompt, NULL, 0);
            if (need < 0 || !(r->echo = malloc((size_t)need + 1))) return bad(pe, 500, NULL, "out_of_memory", "out of memory");
            td_detokenize(S.tok, r->prompt, r->n_prompt, r->echo, (size_t)need);
            r->echo[need] = 0; /* raw bytes; the response sanitizes through cJSON */
        }
        return rc;
    }
    return bad(pe, 400, "prompt", "invalid_type", "'prompt' must be a string, an array of token ids, or an array of one of those");
}

static int valid_drafter_spec(const char *s) {
    if (!strcmp(s, "none") || !strcmp(s, "ngram")) return 1;
    int a, b, n = 0;
    /* widths: no int overflow in %d (undefined); a longer number leaves digits behind s[n] */
    if (sscanf(s, "ngram:%3d-%3d%n", &a, &b, &n) == 2 && s[n] == 0 && a >= 1 && b >= a && b <= 16) return 1;
    return 0;
}

static int parse_speculative(const cJSON *v, srv_req *r, perr *pe) {
    r->spec_mode = 1;
    if (!present(v)) return 0;
    if (cJSON_IsBool(v)) { r->spec_mode = cJSON_IsTrue(v) ? 1 : 0; return 0; }
    if (!cJSON_IsObject(v))
        return bad(pe, 400, "speculative", "invalid_type", "'speculative' must be false, true or {\"drafter\": SPEC, \"depth\": N}");
    const cJSON *d = cJSON_GetObjectItemCaseSensitive(v, "drafter"), *k = cJSON_GetObjectItemCaseSensitive(v, "depth");
    const char *spec = S.cfg.draft;
    int depth = S.cfg.depth;
    if (present(d)) {
        if (!cJSON_IsString(d)) return bad(pe, 400, "speculative.drafter", "invalid_type", "'speculative.drafter' must be a string");
        const char *s = d->valuestring;
        if (!strcmp(s, "default") || !strcmp(s, S.cfg.draft)) spec = S.cfg.draft;
        else if (valid_drafter_spec(s)) spec = s;
        else
            return bad(pe, 400, "speculative.drafter", "unknown_drafter",
                       "unknown drafter '%.128s': use \"default\" (the server's, %s), \"none\", \"ngram\" or \"ngram:MIN-MAX\"",
                       s, S.cfg.draft);
    }
    if (present(k)) {
        if (!cJSON_IsNumber(k) || k->valuedouble != floor(k->valuedouble))
            return bad(pe, 400, "speculative.depth", "invalid_type", "'speculative.depth' must be an integer");
        if (k->valuedouble < 0 || k->valuedouble > TD_SPEC_MAX_DEPTH)
            return bad(pe, 400, "speculative.depth", "invalid_value", "'speculative.depth' must be in [0, %d]", TD_SPEC_MAX_DEPTH);
        depth = (int)k->valuedouble;
    }
    if (!strcmp(spec, "none") || depth == 0) { r->spec_mode = 0; return 0; }
    if (!strcmp(spec, S.cfg.draft) && depth == S.cfg.depth) { r->spec_mode = 1; return 0; }
    r->spec_mode = 2;
    snprintf(r->drafter, sizeof r->drafter, "%s", spec);
    r->depth = depth;
    return 0;
}

static uint64_t mix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

int srv_api_parse(int chat, const char *body, size_t len, srv_req **out, char **err_json) {
    *out = NULL;
    *err_json = NULL;
    perr pe_ = {0}, *pe = &pe_;
    srv_req *r = NULL;
    cJSON *root = cJSON_ParseWithLength(body, len);
    if (!root) { bad(pe, 400, NULL, "invalid_json", "the request body is not valid JSON"); goto fail; }
    if (!cJSON_IsObject(root)) BAD(400, NULL, "invalid_json", "the request body must be a JSON object");
    if (!(r = srv_req_new())) BAD(500, NULL, "out_of_memory", "out of memory");
    r->chat = chat;
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, "model");
    if (present(v)) {
        if (!cJSON_IsString(v)) BAD(400, "model", "invalid_type", "'model' must be a string");
        if (strcmp(v->valuestring, S.cfg.model_id))
            BAD(404, "model", "model_not_found", "The model '%.200s' does not exist (this server serves '%s')",
                v->valuestring, S.cfg.model_id);
    }
    v = cJSON_GetObjectItemCaseSensitive(root, "user");
    if (present(v) && !cJSON_IsString(v)) BAD(400, "user", "invalid_type", "'user' must be a string");
    double n = 1;
    NUM("n", 1, 1e9, 1, n);
    if (n != 1) BAD(400, "n", "unsupported", "only n = 1 is supported (got %g)", n);
    double best_of = 1;
    NUM("best_of", 1, 1e9, 1, best_of);
    if (best_of != 1) BAD(400, "best_of", "unsupported", "only best_of = 1 is supported");
    /* logprobs: completions `logprobs: N` (0..20 alternatives; 0/false/null = off);
     * chat `logprobs: true` with `top_logprobs: 0..20` */
    v = cJSON_GetObjectItemCaseSensitive(root, "logprobs");
    if (chat) {
        if (present(v) && !cJSON_IsBool(v) && !(cJSON_IsNumber(v) && v->valuedouble == 0))
            BAD(400, "logprobs", "invalid_type", "'logprobs' must be a boolean");
        r->gp.logprobs = cJSON_IsTrue(v);
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(root, "top_logprobs");
        if (present(t)) {
            if (!cJSON_IsNumber(t) || t->valuedouble != floor(t->valuedouble))
                BAD(400, "top_logprobs", "invalid_type", "'top_logprobs' must be an integer");
            if (t->valuedouble < 0 || t->valuedouble > TD_MAX_TOP_LOGPROBS)
                BAD(400, "top_logprobs", "invalid_value", "'top_logprobs' must be in [0, %d]", TD_MAX_TOP_LOGPROBS);
            if (t->valuedouble > 0 && !r->gp.logprobs)
                BAD(400, "top_logprobs", "invalid_value", "'top_logprobs' requires 'logprobs': true");
            r->lp_top = (int)t->valuedouble;
        }
    } else {
        if (present(v) && !cJSON_IsFalse(v)) {
            if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble))
                BAD(400, "logprobs", "invalid_type", "'logprobs' must be an integer (the number of alternatives)");
            if (v->valuedouble < 0 || v->valuedouble > TD_MAX_TOP_LOGPROBS)
                BAD(400, "logprobs", "invalid_value", "'logprobs' must be in [0, %d]", TD_MAX_TOP_LOGPROBS);
            r->lp_top = (int)v->valuedouble;
            r->gp.logprobs = r->lp_top > 0;
        }
        v = cJSON_GetObjectItemCaseSensitive(root, "top_logprobs");
        if (present(v) && !(cJSON_IsNumber(v) && v->valuedouble == 0))
            BAD(400, "top_logprobs", "unsupported", "'top_logprobs' is a chat field; completions take 'logprobs': N");
    }
    if (!r->gp.logprobs) r->lp_top = 0;
    r->gp.top_logprobs = r->lp_top;
    v = cJSON_GetObjectItemCaseSensitive(root, "suffix");
    if (present(v) && !(cJSON_IsString(v) && !v->valuestring[0]))
        BAD(400, "suffix", "unsupported", "'suffix' is not supported");
    v = cJSON_GetObjectItemCaseSensitive(root, "logit_bias");
    if (present(v) && !(cJSON_IsObject(v) && !v->child))
        BAD(400, "logit_bias", "unsupported", "'logit_bias' is not supported");
    static const char *no_tools[] = {"tools", "functions"};
    for (int i = 0; i < 2; i++) {
        v = cJSON_GetObjectItemCaseSensitive(root, no_tools[i]);
        if (present(v) && !(cJSON_IsArray(v) && !v->child))
            BAD(400, no_tools[i], "unsupported", "'%s' (tool calling) is not supported", no_tools[i]);
    }
    v = cJSON_GetObjectItemCaseSensitive(root, "response_format");
    if (present(v)) {
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(v, "type");
        if (!cJSON_IsObject(v) || !cJSON_IsString(t) || strcmp(t->valuestring, "text"))
            BAD(400, "response_format", "unsupported", "only response_format {\"type\": \"text\"} is supported");
    }
    /* sampling: OpenAI defaults (temperature 1) */
    td_sampling *s = &r->gp.sampling;
    *s = td_sampling_default();
    s->temperature = 1.0f;
    double d;
    d = 1; NUM("temperature", 0, 2, 0, d); s->temperature = (float)d;
    d = 1; NUM("top_p", 0, 1, 0, d);
    if (d <= 0) BAD(400, "top_p", "invalid_value", "'top_p' must be in (0, 1]");
    s->top_p = (float)d;
    d = 0; NUM("top_k", -1, 1 << 24, 1, d); s->top_k = d < 0 ? 0 : (int)d;
    d = 0; NUM("min_p", 0, 1, 0, d); s->min_p = (float)d;
    d = 0; NUM("presence_penalty", -2, 2, 0, d); s->presence_penalty = (float)d;
    d = 0; NUM("frequency_penalty", -2, 2, 0, d); s->frequency_penalty = (float)d;
    d = 1; NUM("repetition_penalty", 0.01, 100, 0, d); s->repeat_penalty = (float)d;
    v = cJSON_GetObjectItemCaseSensitive(root, "seed");
    pthread_mutex_lock(&S.mu);
    r->serial = ++S.serial;
    pthread_mutex_unlock(&S.mu);
    if (present(v)) {
        d = 0;
        NUM("seed", -9223372036854775808.0, 18446744073709551615.0, 1, d);
        s->seed = d < 0 ? (uint64_t)(int64_t)d : d >= 18446744073709551615.0 ? UINT64_MAX : (uint64_t)d;
    } else {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        s->seed = mix64((uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 30) ^ mix64(r->serial));
    }
    int ignore_eos = 0;
    BOOL("ignore_eos", ignore_eos);
    r->gp.ignore_eos = ignore_eos;
    /* stop */
    v = cJSON_GetObjectItemCaseSensitive(root, "stop");
    int ns = 0;
    if (present(v)) {
        if (cJSON_IsString(v)) {
            if (v->valuestring[0] && !(r->stops[ns++] = strdup(v->valuestring))) BAD(500, NULL, "out_of_memory", "out of memory");
        } else if (cJSON_IsArray(v)) {
            if (cJSON_GetArraySize(v) > SRV_MAX_STOP - 1)
                BAD(400, "stop", "invalid_value", "at most %d stop strings", SRV_MAX_STOP - 1);
            const cJSON *e;
            cJSON_ArrayForEach(e, v) {
                if (!cJSON_IsString(e)) BAD(400, "stop", "invalid_type", "'stop' must be a string or an array of strings");
                if (e->valuestring[0] && !(r->stops[ns++] = strdup(e->valuestring))) BAD(500, NULL, "out_of_memory", "out of memory");
            }
        } else {
            BAD(400, "stop", "invalid_type", "'stop' must be a string or an array of strings");
        }
    }
    if (chat && S.eot_text && ns < SRV_MAX_STOP && !(r->stops[ns++] = strdup(S.eot_text)))
        BAD(500, NULL, "out_of_memory", "out of memory");
    r->gp.stop = (const char *const *)r->stops;
    r->gp.n_stop = ns;
    /* stream */
    int stream = 0, prov = 0, echo = 0;
    BOOL("stream", stream);
    r->stream = stream;
    v = cJSON_GetObjectItemCaseSensitive(root, "stream_options");
    if (present(v)) {
        if (!cJSON_IsObject(v)) BAD(400, "stream_options", "invalid_type", "'stream_options' must be an object");
        const cJSON *iu = cJSON_GetObjectItemCaseSensitive(v, "include_usage");
        if (present(iu) && !cJSON_IsBool(iu))
            BAD(400, "stream_options.include_usage", "invalid_type", "'stream_options.include_usage' must be a boolean");
        r->include_usage = cJSON_IsTrue(iu);
    }
    BOOL("provenance", prov);
    r->provenance = prov;
    if (!chat) BOOL("echo", echo);
    if (parse_speculative(cJSON_GetObjectItemCaseSensitive(root, "speculative"), r, pe)) goto fail;
    /* the prompt */
    if (chat) {
        if (chat_prompt(cJSON_GetObjectItemCaseSensitive(root, "messages"), r, pe)) goto fail;
    } else {
        if (completion_prompt(cJSON_GetObjectItemCaseSensitive(root, "prompt"), r, echo, pe)) goto fail;
    }
    /* max_tokens: completions default 16 (OpenAI), chat: up to the context */
    int room = S.n_ctx - r->n_prompt;
    double mt = chat ? room : 16;
    NUM("max_tokens", -1e18, 1e18, 1, mt);
    if (chat) NUM("max_completion_tokens", -1e18, 1e18, 1, mt);
    if (mt < 1) BAD(400, chat && present(cJSON_GetObjectItemCaseSensitive(root, "max_completion_tokens")) ? "max_completion_tokens" : "max_tokens",
                    "invalid_value", "max_tokens must be at least 1 (got %.0f)", mt);
    r->gp.max_tokens = mt > room ? room : (int)mt;
    snprintf(r->id, sizeof r->id, "%s-%llu", chat ? "chatcmpl" : "cmpl", (unsigned long long)r->serial);
    cJSON_Delete(root);
    *out = r;
    return 0;
fail:
    cJSON_Delete(root);
    if (r) srv_req_unref(r);
    *err_json = srv_api_error_json(pe->msg, pe->type, pe->param, pe->code);
    return pe->status ? pe->status : 400;
}

/* ---- responses ------------------------------------------------------------- */

static const char *finish_name(int f) { return f == TD_STOP_LENGTH ? "length" : "stop"; }

static cJSON *usage_json(srv_req *r) {
    cJSON *u = cJSON_CreateObject();
    cJSON_AddNumberToObject(u, "prompt_tokens", r->n_prompt);
    cJSON_AddNumberToObject(u, "completion_tokens", r->n_out);
    cJSON_AddNumberToObject(u, "total_tokens", r->n_prompt + r->n_out);
    cJSON *sp = cJSON_AddObjectToObject(u, "speculative");
    const td_spec_stats *st = &r->st;
    cJSON_AddStringToObject(sp, "drafter", r->drafter_id[0] ? r->drafter_id : "none");
    cJSON_AddNumberToObject(sp, "depth", r->eff_depth);
    cJSON_AddNumberToObject(sp, "rounds", (double)st->rounds);
    cJSON_AddNumberToObject(sp, "drafted", (double)st->drafted);
    cJSON_AddNumberToObject(sp, "accepted", (double)st->accepted);
    cJSON_AddNumberToObject(sp, "acceptance_rate", st->drafted ? (double)st->accepted / (double)st->drafted : 0.0);
    cJSON_AddNumberToObject(sp, "mean_accepted_length", td_spec_stats_mean_accepted(st));
    cJSON_AddNumberToObject(sp, "tokens_per_round", st->rounds ? (double)st->emitted / (double)st->rounds : 0.0);
    return u;
}

static cJSON *prov_json(const int32_t *ids, const uint8_t *prov, int n) {
    cJSON *a = cJSON_CreateArray();
    for (int i = 0; i < n; i++) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "token", ids[i]);
        cJSON_AddStringToObject(o, "source", prov[i] ? "drafter" : "target");
        cJSON_AddItemToArray(a, o);
    }
    return a;
}

/* cJSON strings are C strings: text with NUL bytes is cut there; invalid
 * UTF-8 (only possible in an echoed token-id prompt) is replaced. */
static char *utf8_clean(const char *s, size_t n) {
    char *o = malloc(n * 3 + 1);
    if (!o) return NULL;
    size_t j = 0;
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        unsigned c = u[i];
        size_t L = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        int ok = L > 0 && i + L <= n && !(L == 2 && c < 0xc2);
        for (size_t k = 1; ok && k < L; k++) ok = (u[i + k] & 0xc0) == 0x80;
        if (ok && L == 3) {
            unsigned cp = ((c & 0x0f) << 12) | ((u[i + 1] & 0x3f) << 6);
            ok = cp >= 0x800 && !(cp >= 0xd800 && cp <= 0xdfff);
        }
        if (ok && L == 4) {
            unsigned cp = ((c & 0x07) << 18) | ((u[i + 1] & 0x3f) << 12);
            ok = cp >= 0x10000 && cp <= 0x10ffff;
        }
        if (ok && c == 0) ok = 0;
        if (ok) { memcpy(o + j, s + i, L); j += L; i += L; }
        else { memcpy(o + j, "\xef\xbf\xbd", 3); j += 3; i++; }
    }
    o[j] = 0;
    return o;
}

static cJSON *text_item(const char *s, size_t n) {
    char *c = utf8_clean(s, n);
    cJSON *it = cJSON_CreateString(c ? c : "");
    free(c);
    return it;
}

/* ---- log-probabilities ------------------------------------------------------ */

static int tok_bytes(int32_t id, char *buf, int cap) {
    int n = td_token_bytes(S.tok, id, buf, cap);
    return n < 0 ? 0 : n > cap ? cap : n;
}

static cJSON *bytes_json(const char *b, int n) {
    cJSON *a = cJSON_CreateArray();
    for (int i = 0; i < n; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber((unsigned char)b[i]));
    return a;
}

/* The choice's "logprobs" for n tokens (null when not requested or none). */
static cJSON *logprobs_json(srv_req *r, const int32_t *ids, const srv_lp *lps, int n) {
    if (!r->gp.logprobs || !lps || n <= 0) return cJSON_CreateNull();
    char b[512];
    cJSON *o = cJSON_CreateObject();
    if (r->chat) {
        cJSON *content = cJSON_AddArrayToObject(o, "content");
        for (int i = 0; i < n; i++) {
            cJSON *e = cJSON_CreateObject();
            int nb = tok_bytes(ids[i], b, sizeof b);
            cJSON_AddItemToObject(e, "token", text_item(b, (size_t)nb));
            cJSON_AddNumberToObject(e, "logprob", (double)lps[i].lp);
            cJSON_AddItemToObject(e, "bytes", bytes_json(b, nb));
            cJSON *tops = cJSON_AddArrayToObject(e, "top_logprobs");
            for (int j = 0; j < lps[i].n_top && j < r->lp_top; j++) {
                cJSON *t = cJSON_CreateObject();
                int tb = tok_bytes(lps[i].top_ids[j], b, sizeof b);
                cJSON_AddItemToObject(t, "token", text_item(b, (size_t)tb));
                cJSON_AddNumberToObject(t, "logprob", (double)lps[i].top_lp[j]);
                cJSON_AddItemToObject(t, "bytes", bytes_json(b, tb));
                cJSON_AddItemToArray(tops, t);
            }
            cJSON_AddItemToArray(content, e);
        }
        return o;
    }
    cJSON *toks = cJSON_AddArrayToObject(o, "tokens"), *tlp = cJSON_AddArrayToObject(o, "token_logprobs"),
          *tops = cJSON_AddArrayToObject(o, "top_logprobs"), *offs = cJSON_AddArrayToObject(o, "text_offset");
    for (int i = 0; i < n; i++) {
        int nb = tok_bytes(ids[i], b, sizeof b);
        cJSON_AddItemToArray(toks, text_item(b, (size_t)nb));
        cJSON_AddItemToArray(tlp, cJSON_CreateNumber((double)lps[i].lp));
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)r->lp_off));
        r->lp_off += (size_t)nb;
        cJSON *d = cJSON_CreateObject();
        for (int j = 0; j < lps[i].n_top && j < r->lp_top; j++) {
            int tb = tok_bytes(lps[i].top_ids[j], b, sizeof b);
            cJSON *k = text_item(b, (size_t)tb);
            /* two ids may render alike (lossy): keep the first, the more likely */
            if (!cJSON_GetObjectItemCaseSensitive(d, k->valuestring))
                cJSON_AddNumberToObject(d, k->valuestring, (double)lps[i].top_lp[j]);
            cJSON_Delete(k);
        }
        cJSON_AddItemToArray(tops, d);
    }
    return o;
}

char *srv_api_response(srv_req *r, const char *text, size_t n_text, const int32_t *ids,
                       const uint8_t *prov, const srv_lp *lps, int n_ids) {
    r->lp_off = r->echo ? strlen(r->echo) : 0;
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "id", r->id);
    cJSON_AddStringToObject(root, "object", r->chat ? "chat.completion" : "text_completion");
    cJSON_AddNumberToObject(root, "created", (double)time(NULL));
    cJSON_AddStringToObject(root, "model", S.cfg.model_id);
    cJSON_AddStringToObject(root, "system_fingerprint", "tandem");
    cJSON *ch = cJSON_AddArrayToObject(root, "choices"), *c = cJSON_CreateObject();
    cJSON_AddItemToArray(ch, c);
    cJSON_AddNumberToObject(c, "index", 0);
    if (r->chat) {
        cJSON *m = cJSON_AddObjectToObject(c, "message");
        cJSON_AddStringToObject(m, "role", "assistant");
        cJSON_AddItemToObject(m, "content", text_item(text, n_text));
    } else {
        size_t ne = r->echo ? strlen(r->echo) : 0;
        char *full = malloc(ne + n_text + 1);
        if (full) {
            if (ne) memcpy(full, r->echo, ne);
            if (n_text) memcpy(full + ne, text, n_text);
            cJSON_AddItemToObject(c, "text", text_item(full, ne + n_text));
            free(full);
        } else {
            cJSON_AddItemToObject(c, "text", text_item(text, n_text));
        }
    }
    cJSON_AddItemToObject(c, "logprobs", logprobs_json(r, ids, lps, n_ids));
    cJSON_AddStringToObject(c, "finish_reason", finish_name(r->finish));
    if (r->provenance) cJSON_AddItemToObject(c, "provenance", prov_json(ids, prov, n_ids));
    cJSON_AddItemToObject(root, "usage", usage_json(r));
    char *s = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    return s;
}

static char *sse(cJSON *root) {
    char *j = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    if (!j) return NULL;
    size_t n = strlen(j);
    char *s = malloc(n + 9);
    if (s) { memcpy(s, "data: ", 6); memcpy(s + 6, j, n); memcpy(s + 6 + n, "\n\n", 3); }
    free(j);
    return s;
}

static cJSON *chunk_head(srv_req *r) {
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "id", r->id);
    cJSON_AddStringToObject(root, "object", r->chat ? "chat.completion.chunk" : "text_completion");
    cJSON_AddNumberToObject(root, "created", (double)time(NULL));
    cJSON_AddStringToObject(root, "model", S.cfg.model_id);
    cJSON_AddStringToObject(root, "system_fingerprint", "tandem");
    return root;
}

char *srv_api_chunk(srv_req *r, const char *text, size_t n_text, const int32_t *ids,
                    const uint8_t *prov, const srv_lp *lps, int n_ids, int first, int fin) {
    if (first) r->lp_off = r->echo ? strlen(r->echo) : 0;
    cJSON *root = chunk_head(r);
    cJSON *ch = cJSON_AddArrayToObject(root, "choices"), *c = cJSON_CreateObject();
    cJSON_AddItemToArray(ch, c);
    cJSON_AddNumberToObject(c, "index", 0);
    if (r->chat) {
        cJSON *dl = cJSON_AddObjectToObject(c, "delta");
        if (first) cJSON_AddStringToObject(dl, "role", "assistant");
        if (n_text || first) cJSON_AddItemToObject(dl, "content", text_item(text, n_text));
    } else {
        if (first && r->echo) {
            size_t ne = strlen(r->echo);
            char *full = malloc(ne + n_text + 1);
            if (full) {
                memcpy(full, r->echo, ne);
                if (n_text) memcpy(full + ne, text, n_text);
                cJSON_AddItemToObject(c, "text", text_item(full, ne + n_text));
                free(full);
            }
        } else {
            cJSON_AddItemToObject(c, "text", text_item(text, n_text));
        }
    }
    cJSON_AddItemToObject(c, "logprobs", logprobs_json(r, ids, lps, n_ids));
    if (fin) cJSON_AddStringToObject(c, "finish_reason", finish_name(r->finish));
    else cJSON_AddNullToObject(c, "finish_reason");
    if (r->provenance && n_ids) cJSON_AddItemToObject(c, "provenance", prov_json(ids, prov, n_ids));
    if (fin) cJSON_AddItemToObject(root, "usage", usage_json(r));
    return sse(root);
}

char *srv_api_usage_chunk(srv_req *r) {
    cJSON *root = chunk_head(r);
    cJSON_AddArrayToObject(root, "choices");
    cJSON_AddItemToObject(root, "usage", usage_json(r));
    return sse(root);
}

char *srv_api_models(void) {
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "object", "list");
    cJSON *a = cJSON_AddArrayToObject(root, "data"), *m = cJSON_CreateObject();
    cJSON_AddItemToArray(a, m);
    cJSON_AddStringToObject(m, "id", S.cfg.model_id);
    cJSON_AddStringToObject(m, "object", "model");
    cJSON_AddNumberToObject(m, "created", (double)S.created);
    cJSON_AddStringToObject(m, "owned_by", "tandem");
    cJSON_AddNumberToObject(m, "max_model_len", S.n_ctx);
    cJSON_AddStringToObject(m, "drafter", S.cfg.draft);
    cJSON_AddNumberToObject(m, "draft_depth", S.cfg.depth);
    char *s = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    return s;
}

/* ---- /metrics (Prometheus text exposition) -------------------------------- */

static void hist_out(FILE *f, const char *name, const char *help, const srv_hist *h) {
    fprintf(f, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    unsigned long cum = 0;
    for (int i = 0; i < h->n_le; i++) {
        cum += h->count[i];
        fprintf(f, "%s_bucket{le=\"%g\"} %lu\n", name, h->le[i], cum);
    }
    fprintf(f, "%s_bucket{le=\"+Inf\"} %lu\n%s_sum %.6f\n%s_count %lu\n", name, h->n, name, h->sum, name, h->n);
}

static void metric(FILE *f, const char *name, const char *type, const char *help, double v) {
    fprintf(f, "# HELP %s %s\n# TYPE %s %s\n%s %.17g\n", name, help, name, type, name, v);
}

char *srv_api_metrics(void) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f) return NULL;
    const srv_metrics *m = &S.mx;
    fprintf(f, "# HELP tandem:request_success_total Finished requests by finish reason.\n"
               "# TYPE tandem:request_success_total counter\n"
               "tandem:request_success_total{finished_reason=\"stop\"} %lu\n"
               "tandem:request_success_total{finished_reason=\"length\"} %lu\n",
            m->requests_ok_stop, m->requests_ok_length);
    metric(f, "tandem:requests_total", "counter", "Generation requests received (valid ones that reached the queue).", (double)m->requests_total);
    metric(f, "tandem:request_failure_total", "counter", "Admitted requests that failed.", (double)m->requests_failed);
    metric(f, "tandem:request_cancelled_total", "counter", "Requests whose client went away before the end.", (double)m->requests_cancelled);
    metric(f, "tandem:request_rejected_total", "counter", "Requests refused with 503 (queue full or shutting down).", (double)m->requests_rejected);
    metric(f, "tandem:http_errors_total", "counter", "Requests answered with a 4xx error.", (double)m->http_errors);
    metric(f, "tandem:prompt_tokens_total", "counter", "Prompt tokens of queued requests.", (double)m->prompt_tokens);
    metric(f, "tandem:generation_tokens_total", "counter", "Generated tokens.", (double)m->generation_tokens);
    metric(f, "tandem:num_requests_running", "gauge", "Rows live in the speculative groups.", S.n_running);
    metric(f, "tandem:num_requests_waiting", "gauge", "Requests waiting in the queue.", S.n_queued);
    metric(f, "tandem:kv_rows_in_use", "gauge", "KV rows in use (one per running request).", S.n_running);
    metric(f, "tandem:kv_rows_total", "gauge", "KV rows the server admits at once (--max-rows).", S.cfg.max_rows);
    metric(f, "tandem:kv_cache_tokens", "gauge", "Prompt plus generated tokens of the running rows (KV positions held).", (double)m->kv_tokens);
    metric(f, "tandem:kv_cache_usage_perc", "gauge", "KV positions held over the positions of --max-rows rows (0..1).",
           (double)m->kv_tokens / ((double)S.cfg.max_rows * S.n_ctx));
    metric(f, "tandem:spec_groups_open", "gauge", "Speculative groups open (one per drafter and depth in use).", m->groups_open);
    hist_out(f, "tandem:time_to_first_token_seconds", "Time from arrival to the first generated token.", &m->ttft);
    hist_out(f, "tandem:inter_token_latency_seconds", "Time between generated tokens (a round's gap shared by its tokens).", &m->itl);
    hist_out(f, "tandem:e2e_request_latency_seconds", "Time from arrival to the last token.", &m->e2e);
    metric(f, "tandem:spec_decode_num_rounds_total", "counter", "Row-rounds verified by the target (with or without drafts).", (double)m->spec_rounds);
    metric(f, "tandem:spec_decode_num_draft_tokens_total", "counter", "Draft tokens proposed.", (double)m->spec_drafted);
    metric(f, "tandem:spec_decode_num_accepted_tokens_total", "counter", "Draft tokens accepted.", (double)m->spec_accepted);
    metric(f, "tandem:spec_decode_draft_acceptance_rate", "gauge", "Accepted over proposed draft tokens.",
           m->spec_drafted ? (double)m->spec_accepted / (double)m->spec_drafted : 0.0);
    fprintf(f, "# HELP tandem:spec_decode_num_accepted_tokens_per_pos Draft tokens accepted at each draft position (0-based).\n"
               "# TYPE tandem:spec_decode_num_accepted_tokens_per_pos counter\n");
    for (int j = 0; j < TD_SPEC_MAX_DEPTH; j++)
        fprintf(f, "tandem:spec_decode_num_accepted_tokens_per_pos{position=\"%d\"} %lu\n", j, m->accepted_at[j]);
    fprintf(f, "# HELP tandem:spec_decode_num_draft_tokens_per_pos Draft tokens proposed at each draft position (0-based).\n"
               "# TYPE tandem:spec_decode_num_draft_tokens_per_pos counter\n");
    for (int j = 0; j < TD_SPEC_MAX_DEPTH; j++)
        fprintf(f, "tandem:spec_decode_num_draft_tokens_per_pos{position=\"%d\"} %lu\n", j, m->drafted_at[j]);
    fclose(f);
    return buf;
}
