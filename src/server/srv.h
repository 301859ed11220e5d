/* srv — internal structure of `tandem serve`, shared by its files:
 *
 *   server.c  options, model loading, signals, startup and graceful shutdown
 *   http.c    libmicrohttpd glue: routing, body limits, blocking waits with
 *             client-hangup detection, SSE streaming
 *   api.c     OpenAI request parsing/validation and response/chunk JSON
 *   sched.c   the scheduler thread: the only thread that touches the td_ctx
 *             and td_spec groups; admission, rounds, outputs, metrics
 *
 * Threads: libmicrohttpd runs one thread per connection; a handler parses and
 * tokenizes (the tokenizer is read-only), then enqueues a srv_req and waits on
 * the request's condition variable. Everything shared (the queue, request
 * state and outboxes, metrics) is guarded by the one server mutex S.mu; the
 * groups themselves are touched only by the scheduler thread, without it. */
#ifndef TD_SRV_H
#define TD_SRV_H

#include "tandem.h"

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#define SRV_MAX_STOP 16
#define SRV_BODY_LIMIT (1u << 20)       /* request bodies over 1 MiB get 413 */
#define SRV_MAX_GROUPS_DEFAULT 4
#define SRV_SPEC_LEN 256

enum { REQ_QUEUED = 0, REQ_RUNNING, REQ_DONE, REQ_FAILED };

typedef struct srv_group srv_group;

/* One emitted token's log-probabilities (td_spec_logprobs), when requested. */
typedef struct srv_lp {
    float lp;
    int n_top;
    int32_t top_ids[TD_MAX_TOP_LOGPROBS];
    float top_lp[TD_MAX_TOP_LOGPROBS];
} srv_lp;

typedef struct srv_req {
    int refs;                       /* HTTP thread + scheduler (guarded by S.mu) */
    pthread_cond_t cv;              /* signalled on every state/outbox change */
    /* immutable once enqueued */
    uint64_t serial;
    char id[48];                    /* "cmpl-..." / "chatcmpl-..." */
    int chat, stream, provenance, include_usage;
    int lp_top;                     /* alternatives per token (gp.logprobs set) */
    int32_t *prompt;
    int n_prompt;
    char *echo;                     /* prompt text to echo (completions), or NULL */
    td_gen_params gp;
    char *stops[SRV_MAX_STOP];      /* owned; gp.stop points here */
    int spec_mode;                  /* 0 = off, 1 = server default, 2 = custom */
    char drafter[SRV_SPEC_LEN];     /* custom drafter spec (spec_mode 2) */
    int depth;                      /* custom depth (spec_mode 2) */
    double t_arrive;
    /* state (S.mu) */
    int state;
    int cancel;                     /* client went away / shutdown */
    int err_status;                 /* REQ_FAILED: HTTP status and error */
    char err_msg[512];
    const char *err_type, *err_param, *err_code;
    char *text;                     /* outbox: released text not yet consumed */
    size_t text_len, text_cap;
    int32_t *ids;                   /* outbox: ids (and provenance) not yet consumed */
    uint8_t *prov;
    srv_lp *lps;                    /* outbox: per id, when gp.logprobs (else NULL) */
    int n_ids, ids_cap;
    int n_out;                      /* completion tokens so far */
    int finish;                     /* TD_STOP_* when REQ_DONE */
    td_spec_stats st;               /* the row's statistics when done */
    char drafter_id[64];            /* drafter that served it ("none") */
    int eff_depth;
    /* HTTP-thread private */
    size_t lp_off;                  /* completions text_offset of the next token */
    /* scheduler-private */
    srv_group *grp;
    int row;
    double t_first, t_last;
    struct srv_req *next;           /* wait queue link */
} srv_req;

/* Histogram with fixed upper bounds (seconds). */
#define SRV_HIST_N 16
typedef struct srv_hist {
    double le[SRV_HIST_N];
    int n_le;
    unsigned long count[SRV_HIST_N + 1];
    unsigned long n;
    double sum;
} srv_hist;

typedef struct srv_metrics {
    unsigned long requests_total, requests_ok_stop, requests_ok_length, requests_failed,
        requests_cancelled, requests_rejected, http_errors;
    unsigned long prompt_tokens, generation_tokens;
    srv_hist ttft, itl, e2e;
    /* speculative totals over every group ever opened */
    unsigned long spec_rounds, spec_drafted, spec_accepted;
    unsigned long drafted_at[TD_SPEC_MAX_DEPTH], accepted_at[TD_SPEC_MAX_DEPTH];
    long kv_tokens;                 /* prompt + generated tokens of live rows */
    int groups_open;
} srv_metrics;

typedef struct srv_config {
    const char *model_dir;
    const char *draft;              /* server default drafter spec */
    int depth, fixed_depth;
    td_accept_rule accept;
    int threads, ctx;
    int kv_type;                    /* td_ctx_params.kv_type of every group's context */
    int act_type;                   /* td_ctx_params.act_type of every group's context */
    const char *host;
    int port;
    int max_rows, queue, max_groups;
    long prefill_budget;            /* prompt tokens admitted per round (at least one request) */
    double shutdown_grace;          /* seconds in-flight rows may finish after a signal */
    char model_id[128];
} srv_config;

typedef struct srv_state {
    srv_config cfg;
    td_model *model;
    const td_tokenizer *tok;
    td_chat_style chat_style;
    int n_vocab, n_ctx;             /* the rows' KV positions */
    int32_t eot_stop_ok;            /* the chat end-of-turn token exists */
    const char *eot_text;           /* "<|im_end|>" / "<|eot_id|>" or NULL */
    long created;                   /* unix time of start */
    pthread_mutex_t mu;
    pthread_cond_t cv;              /* scheduler wake-up */
    srv_req *q_head, *q_tail;       /* wait queue (S.mu) */
    int n_queued, n_running;
    int draining, quit;             /* shutdown phases */
    double drain_deadline;
    uint64_t serial;
    srv_metrics mx;
    pthread_t sched;
    int sched_started;
} srv_state;

extern srv_state S;

double srv_now(void);

/* sched.c */
int srv_sched_start(char *errbuf, size_t cap);   /* opens the default group */
void srv_sched_stop(void);                       /* joins; after draining */
/* Enqueue (takes one reference for the scheduler). Returns 0, or 503 when the
 * queue is full or the server is shutting down (message in msg). */
int srv_enqueue(srv_req *r, char *msg, size_t cap);
void srv_hist_init(srv_hist *h, const double *le, int n);
void srv_hist_add(srv_hist *h, double v);

/* requests (api.c) */
srv_req *srv_req_new(void);
void srv_req_unref(srv_req *r);               /* S.mu held */
void srv_req_fail(srv_req *r, int status, const char *type, const char *param,
                  const char *code, const char *fmt, ...);
/* Parse and validate a request body; on error returns the HTTP status and
 * fills *err_json (malloc'd JSON text). On success returns 0 and *out. */
int srv_api_parse(int chat, const char *body, size_t len, srv_req **out, char **err_json);
char *srv_api_error_json(const char *msg, const char *type, const char *param, const char *code);
/* The whole non-streaming response body for a finished request. */
char *srv_api_response(srv_req *r, const char *text, size_t n_text, const int32_t *ids,
                       const uint8_t *prov, const srv_lp *lps, int n_ids);
/* One SSE event ("data: {...}\n\n") for a stream piece; first = include the
 * assistant role; fin = include finish_reason and usage. */
char *srv_api_chunk(srv_req *r, const char *text, size_t n_text, const int32_t *ids,
                    const uint8_t *prov, const srv_lp *lps, int n_ids, int first, int fin);
char *srv_api_usage_chunk(srv_req *r);
char *srv_api_models(void);
char *srv_api_metrics(void);                  /* S.mu held */

/* http.c */
struct MHD_Daemon;
struct MHD_Daemon *srv_http_start(char *errbuf, size_t cap, int *port_out);

#endif
