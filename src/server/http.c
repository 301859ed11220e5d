/* http — libmicrohttpd glue of `tandem serve`.
 *
 * MHD runs one thread per connection, so a handler may block: a generation
 * request is parsed (api.c), queued (sched.c), and its handler then waits on
 * the request's condition variable — first for admission (to answer errors
 * found at admission with their status), then, without streaming, for the end;
 * with streaming, MHD pulls server-sent events from a content-reader callback
 * that waits for the scheduler's next piece. Every wait wakes at least every
 * 100 ms to check the client's socket: a hangup (POLLRDHUP, or a zero-byte
 * peek) cancels the request, and the scheduler frees its row.
 *
 * Bodies: at most SRV_BODY_LIMIT bytes are kept. A Content-Length over the
 * limit is answered 413 before the body is read; a chunked body that grows over
 * it is drained (up to 8x the limit, then the connection is dropped) and
 * answered 413. */
#define _GNU_SOURCE
#include "server/srv.h"

#include <microhttpd.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

typedef struct conn_ctx {
    char *body;
    size_t len, cap;
    size_t seen;              /* body bytes received in all */
    int too_large;
    int answered;             /* a response was queued early */
} conn_ctx;

typedef struct stream_ctx {
    srv_req *r;
    struct MHD_Connection *conn;
    char *pend;               /* formatted bytes not yet handed to MHD */
    size_t pend_len, pend_off;
    int first, ended;
} stream_ctx;

static int client_gone(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!ci) return 0;
    struct pollfd p = {.fd = ci->connect_fd, .events = POLLIN | POLLRDHUP};
    if (poll(&p, 1, 0) <= 0) return 0;
    if (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) return 1;
    if (p.revents & POLLIN) {
        char b;
        ssize_t n = recv(ci->connect_fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
        if (n == 0) return 1;
    }
    return 0;
}

/* Wait (S.mu held) up to 100 ms for the request's next change. */
static void wait_req(srv_req *r) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += 100 * 1000000L;
    if (ts.tv_nsec >= 1000000000L) { ts.tv_sec++; ts.tv_nsec -= 1000000000L; }
    pthread_cond_timedwait(&r->cv, &S.mu, &ts);
}

/* S.mu held. */
static void cancel_req(srv_req *r) {
    if (r->state == REQ_QUEUED || r->state == REQ_RUNNING) {
        r->cancel = 1;
        pthread_cond_signal(&S.cv);
    }
}

static enum MHD_Result send_text(struct MHD_Connection *c, unsigned status, const char *ctype, char *body,
                                 int retry_after) {
    if (!body) { status = 500; body = strdup("{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\",\"param\":null,\"code\":null}}"); }
    struct MHD_Response *resp = MHD_create_response_from_buffer(body ? strlen(body) : 0, body, MHD_RESPMEM_MUST_FREE);
    if (!resp) { free(body); return MHD_NO; }
    MHD_add_response_header(resp, "Content-Type", ctype);
    if (retry_after) MHD_add_response_header(resp, "Retry-After", "1");
    enum MHD_Result ret = MHD_queue_response(c, status, resp);
    MHD_destroy_response(resp);
    return ret;
}

static enum MHD_Result send_error(struct MHD_Connection *c, unsigned status, const char *msg, const char *type,
                                  const char *param, const char *code) {
    pthread_mutex_lock(&S.mu);
    if (status >= 400 && status < 500) S.mx.http_errors++;
    pthread_mutex_unlock(&S.mu);
    return send_text(c, status, "application/json", srv_api_error_json(msg, type, param, code), status == 503);
}

/* ---- streaming --------------------------------------------------------------- */

static int pend_add(stream_ctx *st, char *s) {
    if (!s) return -1;
    size_t n = strlen(s);
    char *nb = realloc(st->pend, st->pend_len + n + 1);
    if (!nb) { free(s); return -1; }
    st->pend = nb;
    memcpy(st->pend + st->pend_len, s, n + 1);
    st->pend_len += n;
    free(s);
    return 0;
}

static ssize_t stream_cb(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    stream_ctx *st = cls;
    srv_req *r = st->r;
    while (st->pend_off == st->pend_len) {
        free(st->pend);
        st->pend = NULL;
        st->pend_len = st->pend_off = 0;
        if (st->ended) return MHD_CONTENT_READER_END_OF_STREAM;
        char *text = NULL;
        int32_t *ids = NULL;
        uint8_t *prov = NULL;
        srv_lp *lps = NULL;
        size_t nt = 0;
        int ni = 0, state;
        pthread_mutex_lock(&S.mu);
        while (!st->first && r->text_len == 0 && r->n_ids == 0 && r->state == REQ_RUNNING) {
            wait_req(r);
            if (r->text_len == 0 && r->n_ids == 0 && r->state == REQ_RUNNING && client_gone(st->conn)) {
                cancel_req(r);
                pthread_mutex_unlock(&S.mu);
                return MHD_CONTENT_READER_END_WITH_ERROR;
            }
        }
        /* take the outbox */
        text = r->text; nt = r->text_len; r->text = NULL; r->text_len = r->text_cap = 0;
        ids = r->ids; prov = r->prov; ni = r->n_ids; r->ids = NULL; r->prov = NULL; r->n_ids = r->ids_cap = 0;
        lps = r->lps; r->lps = NULL;
        state = r->state;
        pthread_mutex_unlock(&S.mu);
        int rc = 0;
        if (st->first || nt || ni) rc = pend_add(st, srv_api_chunk(r, text, nt, ids, prov, lps, ni, st->first, 0));
        st->first = 0;
        if (state == REQ_DONE && !rc) {
            rc = pend_add(st, srv_api_chunk(r, "", 0, NULL, NULL, NULL, 0, 0, 1));
            if (!rc && r->include_usage) rc = pend_add(st, srv_api_usage_chunk(r));
            if (!rc) rc = pend_add(st, strdup("data: [DONE]\n\n"));
            st->ended = 1;
        } else if (state == REQ_FAILED && !rc) {
            char *e = srv_api_error_json(r->err_msg, r->err_type, r->err_param, r->err_code);
            size_t n = e ? strlen(e) : 0;
            char *ev = e ? malloc(n + 9) : NULL;
            if (ev) { memcpy(ev, "data: ", 6); memcpy(ev + 6, e, n); memcpy(ev + 6 + n, "\n\n", 3); }
            free(e);
            rc = pend_add(st, ev);
            if (!rc) rc = pend_add(st, strdup("data: [DONE]\n\n"));
            st->ended = 1;
        }
        free(text);
        free(ids);
        free(prov);
        free(lps);
        if (rc) {
            pthread_mutex_lock(&S.mu);
            cancel_req(r);
            pthread_mutex_unlock(&S.mu);
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
    }
    size_t n = st->pend_len - st->pend_off;
    if (n > max) n = max;
    memcpy(buf, st->pend + st->pend_off, n);
    st->pend_off += n;
    return (ssize_t)n;
}

static void stream_free(void *cls) {
    stream_ctx *st = cls;
    pthread_mutex_lock(&S.mu);
    cancel_req(st->r); /* no-op when it finished */
    srv_req_unref(st->r);
    pthread_mutex_unlock(&S.mu);
    free(st->pend);
    free(st);
}

/* ---- generation ---------------------------------------------------------------- */

static enum MHD_Result generate(struct MHD_Connection *c, int chat, conn_ctx *cc) {
    srv_req *r = NULL;
    char *ej = NULL;
    int status = srv_api_parse(chat, cc->body ? cc->body : "", cc->len, &r, &ej);
    if (status) {
        pthread_mutex_lock(&S.mu);
        if (status < 500) S.mx.http_errors++;
        pthread_mutex_unlock(&S.mu);
        return send_text(c, (unsigned)status, "application/json", ej, 0);
    }
    r->t_arrive = srv_now();
    char msg[256];
    if ((status = srv_enqueue(r, msg, sizeof msg)) != 0) {
        pthread_mutex_lock(&S.mu);
        srv_req_unref(r);
        pthread_mutex_unlock(&S.mu);
        return send_error(c, (unsigned)status, msg, "server_error", NULL,
                          strstr(msg, "shutting down") ? "shutting_down" : "server_busy");
    }
    pthread_mutex_lock(&S.mu);
    /* admission (or, without streaming, the end) */
    while (r->state == REQ_QUEUED || (!r->stream && r->state == REQ_RUNNING)) {
        wait_req(r);
        if ((r->state == REQ_QUEUED || (!r->stream && r->state == REQ_RUNNING)) && client_gone(c)) {
            cancel_req(r);
            srv_req_unref(r);
            pthread_mutex_unlock(&S.mu);
            return MHD_NO;
        }
    }
    if (r->state == REQ_FAILED) {
        int st = r->err_status;
        char *e = srv_api_error_json(r->err_msg, r->err_type, r->err_param, r->err_code);
        if (st < 500) S.mx.http_errors++;
        srv_req_unref(r);
        pthread_mutex_unlock(&S.mu);
        return send_text(c, (unsigned)st, "application/json", e, st == 503);
    }
    if (!r->stream) {
        if (r->cancel) { srv_req_unref(r); pthread_mutex_unlock(&S.mu); return MHD_NO; }
        pthread_mutex_unlock(&S.mu); /* DONE: the scheduler no longer touches it */
        char *body = srv_api_response(r, r->text ? r->text : "", r->text_len, r->ids, r->prov, r->lps, r->n_ids);
        pthread_mutex_lock(&S.mu);
        srv_req_unref(r);
        pthread_mutex_unlock(&S.mu);
        return send_text(c, 200, "application/json", body, 0);
    }
    pthread_mutex_unlock(&S.mu);
    stream_ctx *st = calloc(1, sizeof *st);
    struct MHD_Response *resp = st ? MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, stream_cb, st, stream_free) : NULL;
    if (!resp) {
        free(st);
        pthread_mutex_lock(&S.mu);
        cancel_req(r);
        srv_req_unref(r);
        pthread_mutex_unlock(&S.mu);
        return MHD_NO;
    }
    st->r = r;
    st->conn = c;
    st->first = chat || r->echo != NULL; /* the role delta, or the echoed prompt */
    MHD_add_response_header(resp, "Content-Type", "text/event-stream");
    MHD_add_response_header(resp, "Cache-Control", "no-cache");
    enum MHD_Result ret = MHD_queue_response(c, 200, resp);
    MHD_destroy_response(resp); /* stream_free runs when MHD is done with it */
    return ret;
}

/* ---- routing ----------------------------------------------------------------- */

static enum MHD_Result handler(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                               const char *version, const char *upload_data, size_t *upload_data_size,
                               void **con_cls) {
    (void)cls;
    (void)version;
    conn_ctx *cc = *con_cls;
    if (!cc) {
        if (!(cc = calloc(1, sizeof *cc))) return MHD_NO;
        *con_cls = cc;
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
        if (cl && strtoull(cl, NULL, 10) > SRV_BODY_LIMIT) {
            cc->answered = 1;
            char m[128];
            snprintf(m, sizeof m, "the request body is larger than the limit of %u bytes", SRV_BODY_LIMIT);
            return send_error(c, 413, m, "invalid_request_error", NULL, "request_too_large");
        }
        return MHD_YES;
    }
    if (*upload_data_size) {
        size_t n = *upload_data_size;
        *upload_data_size = 0;
        if (cc->answered) return MHD_YES;
        cc->seen += n;
        if (cc->seen > 8u * SRV_BODY_LIMIT) return MHD_NO;
        if (cc->too_large || cc->len + n > SRV_BODY_LIMIT) {
            cc->too_large = 1;
            free(cc->body);
            cc->body = NULL;
            cc->len = cc->cap = 0;
            return MHD_YES;
        }
        if (cc->len + n + 1 > cc->cap) {
            size_t nc = cc->cap ? cc->cap : 4096;
            while (nc < cc->len + n + 1) nc *= 2;
            char *nb = realloc(cc->body, nc);
            if (!nb) return MHD_NO;
            cc->body = nb;
            cc->cap = nc;
        }
        memcpy(cc->body + cc->len, upload_data, n);
        cc->len += n;
        cc->body[cc->len] = 0;
        return MHD_YES;
    }
    if (cc->answered) return MHD_YES;
    if (cc->too_large) {
        char m[128];
        snprintf(m, sizeof m, "the request body is larger than the limit of %u bytes", SRV_BODY_LIMIT);
        return send_error(c, 413, m, "invalid_request_error", NULL, "request_too_large");
    }
    int get = !strcmp(method, MHD_HTTP_METHOD_GET), post = !strcmp(method, MHD_HTTP_METHOD_POST);
    if (!strcmp(url, "/v1/completions") || !strcmp(url, "/v1/chat/completions")) {
        if (!post) return send_error(c, 405, "use POST for this endpoint", "invalid_request_error", NULL, "method_not_allowed");
        return generate(c, url[4] == 'c' && url[5] == 'h', cc);
    }
    if (!strcmp(url, "/health")) {
        if (!get) return send_error(c, 405, "use GET for this endpoint", "invalid_request_error", NULL, "method_not_allowed");
        int dr;
        pthread_mutex_lock(&S.mu);
        dr = S.draining;
        pthread_mutex_unlock(&S.mu);
        return send_text(c, dr ? 503 : 200, "application/json",
                         strdup(dr ? "{\"status\":\"shutting_down\"}" : "{\"status\":\"ok\"}"), 0);
    }
    if (!strcmp(url, "/v1/models")) {
        if (!get) return send_error(c, 405, "use GET for this endpoint", "invalid_request_error", NULL, "method_not_allowed");
        return send_text(c, 200, "application/json", srv_api_models(), 0);
    }
    if (!strncmp(url, "/v1/models/", 11)) {
        if (!get) return send_error(c, 405, "use GET for this endpoint", "invalid_request_error", NULL, "method_not_allowed");
        if (strcmp(url + 11, S.cfg.model_id)) {
            char m[300];
            snprintf(m, sizeof m, "The model '%.200s' does not exist", url + 11);
            return send_error(c, 404, m, "invalid_request_error", "model", "model_not_found");
        }
        return send_text(c, 200, "application/json", srv_api_models(), 0);
    }
    if (!strcmp(url, "/metrics")) {
        if (!get) return send_error(c, 405, "use GET for this endpoint", "invalid_request_error", NULL, "method_not_allowed");
        pthread_mutex_lock(&S.mu);
        char *m = srv_api_metrics();
        pthread_mutex_unlock(&S.mu);
        return send_text(c, 200, "text/plain; version=0.0.4", m, 0);
    }
    char m[300];
    snprintf(m, sizeof m, "no endpoint %.200s %.32s", url, method);
    return send_error(c, 404, m, "invalid_request_error", NULL, "not_found");
}

static void completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe) {
    (void)cls;
    (void)c;
    (void)toe;
    conn_ctx *cc = *con_cls;
    if (!cc) return;
    free(cc->body);
    free(cc);
    *con_cls = NULL;
}

struct MHD_Daemon *srv_http_start(char *errbuf, size_t cap, int *port_out) {
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE}, *ai = NULL;
    char port[16];
    snprintf(port, sizeof port, "%d", S.cfg.port);
    int gr = getaddrinfo(S.cfg.host, port, &hints, &ai);
    if (gr != 0 || !ai) {
        snprintf(errbuf, cap, "--host %s: %s", S.cfg.host, gai_strerror(gr));
        return NULL;
    }
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ITC;
    if (ai->ai_family == AF_INET6) flags |= MHD_USE_IPv6;
    unsigned limit = (unsigned)(2 * (S.cfg.max_rows + S.cfg.queue) + 64);
    struct MHD_Daemon *d = MHD_start_daemon(flags, (uint16_t)S.cfg.port, NULL, NULL, handler, NULL,
                                            MHD_OPTION_SOCK_ADDR, ai->ai_addr,
                                            MHD_OPTION_NOTIFY_COMPLETED, completed, NULL,
                                            MHD_OPTION_CONNECTION_LIMIT, limit,
                                            MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)300,
                                            MHD_OPTION_LISTENING_ADDRESS_REUSE, (unsigned)1,
                                            MHD_OPTION_END);
    freeaddrinfo(ai);
    if (!d) {
        snprintf(errbuf, cap, "cannot listen on %s:%d (address in use or not available)", S.cfg.host, S.cfg.port);
        return NULL;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
    *port_out = di ? di->port : S.cfg.port;
    return d;
}
