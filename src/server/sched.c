/* sched — the scheduler thread of `tandem serve` (continuous batching).
 *
 * One thread owns the model's contexts and speculative groups. Its loop:
 *   1. drop rows whose client went away (td_spec_remove) and queued requests
 *      that were cancelled; during shutdown, reject the queue (503) and, past
 *      the grace deadline, cancel the rows still running;
 *   2. admit waiting requests in FIFO order while fewer than --max-rows rows
 *      are live: td_spec_add into the group of the request's drafter/depth
 *      (the next td_spec_step prefills them: they join between rounds); the
 *      prompts admitted for one round total at most --prefill-budget tokens
 *      (at least one request), so joins do not stall running rows for long;
 *   3. one td_spec_step per group that has rows (S.mu released meanwhile);
 *   4. td_spec_take every row's new ids/provenance/text into its request's
 *      outbox, wake its HTTP thread; finished rows leave (td_spec_remove).
 *
 * Groups: the server's default group (--draft, --draft-depth) is opened at
 * start. A request asking for another drafter spec or depth
 * (`speculative: {"drafter", "depth"}`) is served by a group keyed by
 * (spec, depth), opened lazily with its own td_ctx of --max-rows rows; at most
 * --max-groups groups exist, idle ones (no rows) are closed to make room, and
 * a request whose group cannot be opened yet waits at the head of the queue.
 * Drafters are opened once per spec and shared by groups. Rows with
 * `speculative: false` (or depth 0) ride in the default group with draft = 0.
 * Live rows over all groups never exceed --max-rows. */
#define _GNU_SOURCE
#include "server/srv.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct srv_group {
    char spec[SRV_SPEC_LEN];
    int depth;                 /* requested max depth (0 when no drafter) */
    int is_default;
    td_drafter *d;             /* borrowed from the drafter cache, may be NULL */
    td_ctx *ctx;
    td_spec *g;
    srv_req **rows;            /* [max_rows] request of each group row id */
    int n_live;
    double last_used;
    td_spec_stats reported;    /* group totals already added to the metrics */
};

#define MAX_DRAFTERS 8
static struct { char spec[SRV_SPEC_LEN]; td_drafter *d; } drafters[MAX_DRAFTERS];
static int n_drafters;
static srv_group **groups;     /* [max_groups] */
static int n_groups;

double srv_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

void srv_hist_init(srv_hist *h, const double *le, int n) {
    memset(h, 0, sizeof *h);
    if (n > SRV_HIST_N) n = SRV_HIST_N;
    memcpy(h->le, le, sizeof(double) * (size_t)n);
    h->n_le = n;
}

void srv_hist_add(srv_hist *h, double v) {
    int i = 0;
    while (i < h->n_le && v > h->le[i]) i++;
    h->count[i]++;
    h->n++;
    h->sum += v;
}

/* ---- drafters and groups (scheduler thread only) ------------------------ */

static int drafter_get(const char *spec, td_drafter **out, td_err *err) {
    for (int i = 0; i < n_drafters; i++)
        if (!strcmp(drafters[i].spec, spec)) { *out = drafters[i].d; return 0; }
    if (n_drafters == MAX_DRAFTERS) {
        /* close a cached drafter no open group uses */
        for (int i = 0; i < n_drafters; i++) {
            int used = 0;
            for (int k = 0; k < n_groups; k++) used |= groups[k]->d == drafters[i].d;
            if (used) continue;
            td_drafter_free(drafters[i].d);
            drafters[i] = drafters[--n_drafters];
            break;
        }
    }
    if (n_drafters == MAX_DRAFTERS) {
        snprintf(err->msg, sizeof err->msg, "too many distinct drafters in use (at most %d)", MAX_DRAFTERS);
        return TD_EFULL;
    }
    td_drafter *d = NULL;
    int rc = td_drafter_open(&d, spec, S.model, err);
    if (rc != 0) return rc;
    snprintf(drafters[n_drafters].spec, SRV_SPEC_LEN, "%s", spec);
    drafters[n_drafters++].d = d;
    *out = d;
    return 0;
}

static void group_free(srv_group *gr) {
    if (!gr) return;
    td_spec_free(gr->g);
    td_ctx_free(gr->ctx);
    free(gr->rows);
    free(gr);
}

static int group_open(const char *spec, int depth, int is_default, srv_group **out, td_err *err) {
    *out = NULL;
    srv_group *gr = calloc(1, sizeof *gr);
    int R = S.cfg.max_rows;
    if (!gr || !(gr->rows = calloc((size_t)R, sizeof *gr->rows))) {
        free(gr);
        snprintf(err->msg, sizeof err->msg, "out of memory");
        return TD_ENOMEM;
    }
    snprintf(gr->spec, sizeof gr->spec, "%s", spec);
    gr->is_default = is_default;
    int rc = drafter_get(spec, &gr->d, err);
    if (rc != 0) { group_free(gr); return rc; }
    gr->depth = gr->d ? depth : 0;
    int W = R * (gr->depth + 1);
    td_ctx_params cp = td_ctx_default_params();
    cp.max_rows = R;
    cp.max_ctx = S.cfg.ctx;
    cp.n_threads = S.cfg.threads;
    cp.kv_type = S.cfg.kv_type;
    cp.act_type = S.cfg.act_type;
    if (cp.max_tokens < W) cp.max_tokens = W;
    if (cp.max_logits < W) cp.max_logits = W;
    if ((rc = td_ctx_open(&gr->ctx, S.model, &cp, err)) != 0) { group_free(gr); return rc; }
    td_spec_params sp = td_spec_default_params();
    sp.max_depth = gr->depth;
    sp.fixed_depth = S.cfg.fixed_depth;
    sp.accept = S.cfg.accept;
    if ((rc = td_spec_open(&gr->g, gr->ctx, S.model, gr->d, &sp, err)) != 0) { group_free(gr); return rc; }
    td_spec_stats_get(gr->g, -1, &gr->reported); /* open-time measurement is not traffic */
    gr->last_used = srv_now();
    *out = gr;
    return 0;
}

/* The group key of a request: its drafter spec and depth. */
static void req_key(const srv_req *r, const char **spec, int *depth) {
    if (r->spec_mode == 2) { *spec = r->drafter; *depth = r->depth; }
    else { *spec = S.cfg.draft; *depth = S.cfg.depth; }
}

static srv_group *group_find(const char *spec, int depth) {
    for (int i = 0; i < n_groups; i++) {
        srv_group *gr = groups[i];
        if (!strcmp(gr->spec, spec) && (gr->depth == depth || (!gr->d))) return gr;
    }
    return NULL;
}

/* Make room for one more group: close the least recently used idle
 * non-default group. Returns 1 when there is room. */
static int group_room(void) {
    if (n_groups < S.cfg.max_groups) return 1;
    int best = -1;
    for (int i = 0; i < n_groups; i++)
        if (!groups[i]->is_default && groups[i]->n_live == 0 &&
            (best < 0 || groups[i]->last_used < groups[best]->last_used)) best = i;
    if (best < 0) return 0;
    group_free(groups[best]);
    groups[best] = groups[--n_groups];
    S.mx.groups_open = n_groups;
    return 1;
}

/* ---- requests -------------------------------------------------------------- */

static void req_wake(srv_req *r) { pthread_cond_broadcast(&r->cv); }

static void row_leave(srv_req *r) {
    srv_group *gr = r->grp;
    if (!gr) return;
    td_spec_remove(gr->g, r->row);
    gr->rows[r->row] = NULL;
    gr->n_live--;
    gr->last_used = srv_now();
    r->grp = NULL;
    S.n_running--;
}

static int outbox_add(srv_req *r, const int32_t *ids, const uint8_t *prov, const srv_lp *lps, int k,
                      const char *text, size_t nt) {
    if (r->n_ids + k > r->ids_cap || (lps && !r->lps && k > 0)) {
        int nc = r->ids_cap ? r->ids_cap : 64;
        while (nc < r->n_ids + k) nc *= 2;
        int32_t *ni = realloc(r->ids, sizeof(int32_t) * (size_t)nc);
        if (!ni) return TD_ENOMEM;
        r->ids = ni;
        uint8_t *np = realloc(r->prov, (size_t)nc);
        if (!np) return TD_ENOMEM;
        r->prov = np;
        if (lps) {
            srv_lp *nl = realloc(r->lps, sizeof(srv_lp) * (size_t)nc);
            if (!nl) return TD_ENOMEM;
            r->lps = nl;
        }
        r->ids_cap = nc;
    }
    if (lps && k > 0) memcpy(r->lps + r->n_ids, lps, sizeof(srv_lp) * (size_t)k);
    memcpy(r->ids + r->n_ids, ids, sizeof(int32_t) * (size_t)k);
    memcpy(r->prov + r->n_ids, prov, (size_t)k);
    r->n_ids += k;
    if (r->text_len + nt + 1 > r->text_cap) {
        size_t nc = r->text_cap ? r->text_cap : 256;
        while (nc < r->text_len + nt + 1) nc *= 2;
        char *nb = realloc(r->text, nc);
        if (!nb) return TD_ENOMEM;
        r->text = nb;
        r->text_cap = nc;
    }
    memcpy(r->text + r->text_len, text, nt);
    r->text_len += nt;
    r->text[r->text_len] = 0;
    return 0;
}

int srv_enqueue(srv_req *r, char *msg, size_t cap) {
    pthread_mutex_lock(&S.mu);
    S.mx.requests_total++;
    if (S.draining) {
        S.mx.requests_rejected++;
        pthread_mutex_unlock(&S.mu);
        snprintf(msg, cap, "the server is shutting down");
        return 503;
    }
    /* a request that can start at once does not count against the queue */
    int waiting_after = S.n_queued + 1 - (S.cfg.max_rows - S.n_running);
    if (waiting_after > S.cfg.queue) {
        S.mx.requests_rejected++;
        pthread_mutex_unlock(&S.mu);
        snprintf(msg, cap, "the server is busy: %d rows running and %d requests waiting (queue limit %d); retry later",
                 S.n_running, S.n_queued, S.cfg.queue);
        return 503;
    }
    r->refs++;
    r->state = REQ_QUEUED;
    r->next = NULL;
    if (S.q_tail) S.q_tail->next = r; else S.q_head = r;
    S.q_tail = r;
    S.n_queued++;
    S.mx.prompt_tokens += (unsigned long)r->n_prompt;
    pthread_cond_signal(&S.cv);
    pthread_mutex_unlock(&S.mu);
    return 0;
}

static srv_req *queue_pop(void) {
    srv_req *r = S.q_head;
    if (!r) return NULL;
    S.q_head = r->next;
    if (!S.q_head) S.q_tail = NULL;
    r->next = NULL;
    S.n_queued--;
    return r;
}

/* Remove cancelled requests from the queue; fail them all when draining. */
static void queue_sweep(void) {
    srv_req **pp = &S.q_head, *prev = NULL;
    while (*pp) {
        srv_req *r = *pp;
        if (r->cancel || S.draining) {
            *pp = r->next;
            if (S.q_tail == r) S.q_tail = prev;
            S.n_queued--;
            r->next = NULL;
            if (r->cancel) { S.mx.requests_cancelled++; r->state = REQ_DONE; req_wake(r); }
            else {
                S.mx.requests_rejected++;
                srv_req_fail(r, 503, "server_error", NULL, "shutting_down", "the server is shutting down");
            }
            srv_req_unref(r);
        } else {
            prev = r;
            pp = &r->next;
        }
    }
}

static void fail_running(srv_group *gr, int status, const char *code, const char *msg) {
    for (int i = 0; i < S.cfg.max_rows; i++) {
        srv_req *r = gr->rows[i];
        if (!r) continue;
        row_leave(r);
        S.mx.requests_failed++;
        srv_req_fail(r, status, "server_error", NULL, code, "%s", msg);
        srv_req_unref(r);
    }
}

/* Admit from the queue head while rows are free. S.mu held; released while a
 * group is opened. */
static void admit(void) {
    long prefill = 0; /* prompt tokens admitted this round */
    while (S.q_head && S.n_running < S.cfg.max_rows) {
        srv_req *r = S.q_head;
        if (r->cancel || S.draining) { queue_sweep(); continue; }
        /* bound the prefill work the next round adds for the running rows */
        if (prefill > 0 && prefill + r->n_prompt > S.cfg.prefill_budget) return;
        const char *spec;
        int depth;
        req_key(r, &spec, &depth);
        srv_group *gr = group_find(spec, depth);
        if (!gr) {
            if (!group_room()) return; /* wait for a group to go idle */
            queue_pop();
            char sp[SRV_SPEC_LEN];
            snprintf(sp, sizeof sp, "%s", spec);
            td_err err = {0};
            pthread_mutex_unlock(&S.mu);
            int rc = group_open(sp, depth, 0, &gr, &err);
            pthread_mutex_lock(&S.mu);
            if (rc != 0) {
                S.mx.requests_failed++;
                if (rc == TD_ENOMEM || rc == TD_EFULL)
                    srv_req_fail(r, 503, "server_error", "speculative", "drafter_unavailable",
                                 "cannot open a group for drafter '%s': %s", sp, err.msg);
                else
                    srv_req_fail(r, 400, "invalid_request_error", "speculative.drafter", "unknown_drafter",
                                 "cannot open drafter '%s': %s", sp, err.msg);
                srv_req_unref(r);
                continue;
            }
            groups[n_groups++] = gr;
            S.mx.groups_open = n_groups;
        } else {
            queue_pop();
        }
        int draft = r->spec_mode != 0 && gr->depth > 0;
        int id = -1;
        td_err err = {0};
        int rc = td_spec_add(gr->g, r->prompt, r->n_prompt, &r->gp, draft, &id, &err);
        if (rc != 0) {
            S.mx.requests_failed++;
            if (rc == TD_EINVAL || rc == TD_ERANGE)
                srv_req_fail(r, 400, "invalid_request_error", "prompt", "invalid_prompt", "%s", err.msg);
            else
                srv_req_fail(r, 503, "server_error", NULL, "no_capacity", "%s", err.msg);
            srv_req_unref(r);
            continue;
        }
        prefill += r->n_prompt;
        r->grp = gr;
        r->row = id;
        gr->rows[id] = r;
        gr->n_live++;
        gr->last_used = srv_now();
        S.n_running++;
        r->state = REQ_RUNNING;
        snprintf(r->drafter_id, sizeof r->drafter_id, "%s", draft && gr->d ? td_drafter_id(gr->d) : "none");
        r->eff_depth = draft ? gr->depth : 0;
        req_wake(r);
    }
}

static void add_spec_totals(srv_group *gr) {
    td_spec_stats t;
    if (td_spec_stats_get(gr->g, -1, &t) != 0) return;
    S.mx.spec_rounds += (unsigned long)(t.rounds - gr->reported.rounds);
    S.mx.spec_drafted += (unsigned long)(t.drafted - gr->reported.drafted);
    S.mx.spec_accepted += (unsigned long)(t.accepted - gr->reported.accepted);
    for (int j = 0; j < TD_SPEC_MAX_DEPTH; j++) {
        S.mx.drafted_at[j] += (unsigned long)(t.drafted_at[j] - gr->reported.drafted_at[j]);
        S.mx.accepted_at[j] += (unsigned long)(t.accepted_at[j] - gr->reported.accepted_at[j]);
    }
    gr->reported = t;
}

/* Move a row's new output into its request; finish it when done. S.mu held. */
static void collect(srv_group *gr, int id, double now) {
    srv_req *r = gr->rows[id];
    int32_t ids[256];
    uint8_t prov[256];
    static srv_lp lps[256];         /* scheduler thread only */
    char text[8192];
    for (;;) {
        size_t nt = 0;
        int done = 0;
        int k = td_spec_take(gr->g, id, ids, prov, 256, text, sizeof text, &nt, &done);
        /* log-probabilities of the taken tokens: read before the row can be removed */
        for (int j = 0; k > 0 && r->gp.logprobs && j < k; j++) {
            srv_lp *l = &lps[j];
            int na = td_spec_logprobs(gr->g, id, r->n_out + j, &l->lp, l->top_ids, l->top_lp);
            if (na < 0) { k = na; break; }
            l->n_top = na;
        }
        if (k < 0) {
            row_leave(r);
            S.mx.requests_failed++;
            srv_req_fail(r, 500, "server_error", NULL, "internal_error", "reading the row's output failed: %s", td_strerror(k));
            srv_req_unref(r);
            return;
        }
        if (k > 0) {
            if (!r->t_first) {
                r->t_first = now;
                srv_hist_add(&S.mx.ttft, now - r->t_arrive);
            } else {
                double dt = (now - r->t_last) / k;
                for (int j = 0; j < k; j++) srv_hist_add(&S.mx.itl, dt);
            }
            r->t_last = now;
            r->n_out += k;
            S.mx.generation_tokens += (unsigned long)k;
        }
        if ((k > 0 || nt > 0) && outbox_add(r, ids, prov, r->gp.logprobs ? lps : NULL, k, text, nt) != 0) {
            row_leave(r);
            S.mx.requests_failed++;
            srv_req_fail(r, 500, "server_error", NULL, "out_of_memory", "out of memory buffering the output");
            srv_req_unref(r);
            return;
        }
        if (done) {
            td_spec_stats_get(gr->g, id, &r->st);
            r->finish = r->st.stop_reason;
            row_leave(r);
            if (r->finish == TD_STOP_LENGTH) S.mx.requests_ok_length++;
            else S.mx.requests_ok_stop++;
            srv_hist_add(&S.mx.e2e, now - r->t_arrive);
            r->state = REQ_DONE;
            req_wake(r);
            srv_req_unref(r);
            return;
        }
        if (k < 256 && nt < sizeof text) break;
    }
    if (r->n_ids || r->text_len) req_wake(r);
}

static void *sched_main(void *arg) {
    (void)arg;
    pthread_mutex_lock(&S.mu);
    for (;;) {
        double now = srv_now();
        /* 1. cancellations and shutdown */
        int past_deadline = S.draining && now > S.drain_deadline;
        for (int gi = 0; gi < n_groups; gi++) {
            srv_group *gr = groups[gi];
            for (int i = 0; i < S.cfg.max_rows; i++) {
                srv_req *r = gr->rows[i];
                if (!r || !(r->cancel || past_deadline)) continue;
                row_leave(r);
                if (r->cancel) { S.mx.requests_cancelled++; r->state = REQ_DONE; req_wake(r); }
                else {
                    S.mx.requests_cancelled++;
                    srv_req_fail(r, 503, "server_error", NULL, "shutting_down",
                                 "the server shut down before the request finished");
                }
                srv_req_unref(r);
            }
        }
        queue_sweep();
        /* 2. admission */
        admit();
        long kv = 0;
        for (int gi = 0; gi < n_groups; gi++)
            for (int i = 0; i < S.cfg.max_rows; i++)
                if (groups[gi]->rows[i]) kv += groups[gi]->rows[i]->n_prompt + groups[gi]->rows[i]->n_out;
        S.mx.kv_tokens = kv;
        if (S.n_running == 0) {
            if (S.quit) break;
            if (S.draining) {
                /* wake the main thread waiting for the drain */
                pthread_cond_broadcast(&S.cv);
                struct timespec ts;
                clock_gettime(CLOCK_REALTIME, &ts);
                ts.tv_nsec += 50 * 1000000L;
                if (ts.tv_nsec >= 1000000000L) { ts.tv_sec++; ts.tv_nsec -= 1000000000L; }
                pthread_cond_timedwait(&S.cv, &S.mu, &ts);
            } else {
                pthread_cond_wait(&S.cv, &S.mu);
            }
            continue;
        }
        /* 3. one round per group with rows (groups are ours alone) */
        int n = n_groups;
        int rcs[SRV_MAX_GROUPS_DEFAULT * 16];
        char emsg[512] = "";
        pthread_mutex_unlock(&S.mu);
        for (int gi = 0; gi < n && gi < (int)(sizeof rcs / sizeof *rcs); gi++) {
            rcs[gi] = 0;
            if (groups[gi]->n_live == 0) continue;
            td_err err = {0};
            int rc = td_spec_step(groups[gi]->g, &err);
            if (rc < 0) {
                rcs[gi] = rc;
                snprintf(emsg, sizeof emsg, "generation failed: %.400s", err.msg[0] ? err.msg : td_strerror(rc));
            }
        }
        pthread_mutex_lock(&S.mu);
        /* 4. outputs */
        now = srv_now();
        for (int gi = 0; gi < n && gi < (int)(sizeof rcs / sizeof *rcs); gi++) {
            srv_group *gr = groups[gi];
            if (rcs[gi] < 0) { fail_running(gr, 500, "internal_error", emsg); continue; }
            for (int i = 0; i < S.cfg.max_rows; i++)
                if (gr->rows[i]) collect(gr, i, now);
            add_spec_totals(gr);
        }
    }
    pthread_mutex_unlock(&S.mu);
    return NULL;
}

int srv_sched_start(char *errbuf, size_t cap) {
    if (S.cfg.max_groups > SRV_MAX_GROUPS_DEFAULT * 16) S.cfg.max_groups = SRV_MAX_GROUPS_DEFAULT * 16;
    groups = calloc((size_t)S.cfg.max_groups, sizeof *groups);
    if (!groups) { snprintf(errbuf, cap, "out of memory"); return 1; }
    td_err err = {0};
    srv_group *gr;
    if (group_open(S.cfg.draft, S.cfg.depth, 1, &gr, &err) != 0) {
        snprintf(errbuf, cap, "opening the default group (drafter '%s'): %s", S.cfg.draft, err.msg);
        return 1;
    }
    groups[n_groups++] = gr;
    S.mx.groups_open = n_groups;
    S.n_ctx = td_ctx_get_params(gr->ctx).max_ctx;
    if (pthread_create(&S.sched, NULL, sched_main, NULL) != 0) {
        snprintf(errbuf, cap, "cannot start the scheduler thread");
        return 1;
    }
    S.sched_started = 1;
    return 0;
}

void srv_sched_stop(void) {
    if (S.sched_started) {
        pthread_mutex_lock(&S.mu);
        S.quit = 1;
        pthread_cond_broadcast(&S.cv);
        pthread_mutex_unlock(&S.mu);
        pthread_join(S.sched, NULL);
        S.sched_started = 0;
    }
    for (int i = 0; i < n_groups; i++) group_free(groups[i]);
    n_groups = 0;
    free(groups);
    groups = NULL;
    for (int i = 0; i < n_drafters; i++) td_drafter_free(drafters[i].d);
    n_drafters = 0;
}
