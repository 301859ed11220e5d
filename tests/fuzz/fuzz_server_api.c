/* fuzz_server_api — libFuzzer harness for the server's request parsing
 * (src/server/api.c: srv_api_parse for /v1/completions and
 * /v1/chat/completions, which renders the chat template with td_chat_render
 * and tokenizes) and the response/chunk JSON built from a parsed request.
 *
 * Design: srv_api_parse needs only the server state S's tokenizer, chat style,
 * context/vocab sizes and configured drafter, not a running model or the
 * scheduler, so S is filled once from the small fixture tokenizer
 * (tests/fixtures/tok, ChatML template). The first input byte picks the
 * endpoint (bit 0: chat), the chat style (bit 1: Llama 3 instead of ChatML)
 * and the context size (bit 2: 8 positions instead of 256); the rest is the
 * HTTP body. A rejection must come with a 4xx/5xx status and an error JSON;
 * an accepted request is turned into a full response, a first and a final
 * stream chunk and a usage chunk (text: the body bytes; ids: the prompt;
 * log-probabilities made up from the prompt ids), all of which must be
 * produced, then freed. Run from the repository root, or set TD_FUZZ_TOK_DIR. */
#define _GNU_SOURCE
#include "server/srv.h"
#include "tandem.h"
#include "../slurp.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static td_tokenizer *tok;

static void setup(void) {
    const char *d = getenv("TD_FUZZ_TOK_DIR");
    if (!d) d = "tests/fixtures/tok";
    char p[1024], q[1024];
    snprintf(p, sizeof p, "%s/tokenizer.json", d);
    snprintf(q, sizeof q, "%s/tokenizer_config.json", d);
    size_t n = 0, m = 0;
    char *j = t_slurp(p, &n), *c = t_slurp(q, &m);
    td_err err = {0};
    if (!j || !c || td_tokenizer_open_mem(&tok, j, n, c, m, &err)) {
        fprintf(stderr, "fuzz_server_api: cannot load the tokenizer in %s: %s\n", d, err.msg);
        abort();
    }
    free(j);
    free(c);
    pthread_mutex_init(&S.mu, NULL);
    S.tok = tok;
    S.n_vocab = td_tokenizer_n_vocab(tok);
    S.cfg.draft = "ngram";
    S.cfg.depth = 4;
    snprintf(S.cfg.model_id, sizeof S.cfg.model_id, "tiny");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!tok) setup();
    if (size < 1) return 0;
    int chat = data[0] & 1;
    S.chat_style = (data[0] & 2) ? TD_CHAT_LLAMA3 : TD_CHAT_CHATML;
    S.eot_text = (data[0] & 2) ? "<|eot_id|>" : "<|im_end|>";
    S.n_ctx = (data[0] & 4) ? 8 : 256;
    const char *body = (const char *)data + 1;
    size_t len = size - 1;

    srv_req *r = NULL;
    char *err_json = NULL;
    int st = srv_api_parse(chat, body, len, &r, &err_json);
    if (st) {
        if (r || !err_json || st < 400 || st > 599) abort();
        free(err_json);
        return 0;
    }
    if (!r || err_json) abort();
    if (r->n_prompt < 1 || r->n_prompt >= S.n_ctx || r->gp.max_tokens < 1 || r->gp.max_tokens > S.n_ctx - r->n_prompt) abort();
    for (int i = 0; i < r->n_prompt; i++)
        if (r->prompt[i] < 0 || r->prompt[i] >= S.n_vocab) abort();

    int n = r->n_prompt;
    uint8_t *prov = calloc((size_t)n, 1);
    srv_lp *lps = calloc((size_t)n, sizeof *lps);
    if (!prov || !lps) abort();
    for (int i = 0; i < n; i++) {
        prov[i] = (uint8_t)(i & 1);
        lps[i].lp = -(float)i;
        lps[i].n_top = r->lp_top;
        for (int k = 0; k < r->lp_top; k++) {
            lps[i].top_ids[k] = r->prompt[(i + k) % n];
            lps[i].top_lp[k] = -(float)k;
        }
    }
    r->n_out = n;
    char *a = srv_api_response(r, body, len, r->prompt, prov, lps, n);
    char *b = srv_api_chunk(r, body, len, r->prompt, prov, lps, n, 1, 0);
    char *c = srv_api_chunk(r, body, len / 2, r->prompt, prov, lps, n, 0, 1);
    char *d = srv_api_usage_chunk(r);
    if (!a || !b || !c || !d) abort();
    free(a); free(b); free(c); free(d);
    free(prov);
    free(lps);
    srv_req_unref(r);
    return 0;
}
