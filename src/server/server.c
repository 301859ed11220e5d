/* server — `tandem serve`: options, startup and graceful shutdown.
 *
 * Startup: parse options (the model/drafter/depth/ctx/threads options are the
 * CLI's shared ones, cli_gen_opt), open the model, open the default group and
 * start the scheduler thread (sched.c), then the HTTP daemon (http.c), and
 * print "tandem serve: listening on http://HOST:PORT" to stderr.
 *
 * Signals: SIGINT/SIGTERM are blocked in every thread from option parsing on.
 * During startup (model and drafter load, the scheduler's start, which
 * measures the verify cost curve and can take over a minute under sanitizers,
 * or an open that never returns) a small watcher thread takes them with
 * sigtimedwait: one prints "tandem serve: SIGINT during startup: exiting" and
 * ends the process at once, exit status 128 + the signal number. Once the HTTP
 * daemon runs, the main thread marks startup done, joins the watcher (a signal
 * it took after the mark is handed over, not lost), prints the "listening"
 * line and takes the signals itself with sigwaitinfo. The first one stops
 * admitting (the listening socket is closed, queued requests get 503, new
 * requests on open connections get 503) and lets running rows finish for up
 * to --shutdown-grace seconds, then cancels what is left; a second signal
 * cancels at once. Then the HTTP daemon stops (joining its connection
 * threads), the scheduler exits, and everything is freed: exit status 0. */
#define _GNU_SOURCE
#include "server/server.h"
#include "server/srv.h"
#include "cli/cli.h"

#include <errno.h>
#include <libgen.h>
#include <limits.h>
#include <microhttpd.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

srv_state S;

static void serve_help(void) {
    printf("usage: tandem serve [-m DIR] [--draft SPEC] [--draft-depth N] [options]\n"
           "OpenAI-compatible HTTP server with continuous batching over the speculative group.\n"
           "Endpoints: POST /v1/completions, POST /v1/chat/completions (stream: true for SSE),\n"
           "GET /v1/models, GET /health, GET /metrics (Prometheus text).\n\n"
           "  -m, --model DIR        model directory; default: the bundled model with its default drafter\n"
           "      --draft SPEC       none | ngram[:MIN-MAX] | model:DIR[,vocab=N] | mtp:DIR[,vocab=N] | block:DIR\n"
           "                         (default as for tandem run; requests may pick \"default\", \"none\" or ngram)\n"
           "      --draft-depth N    most draft tokens per round, 0..16 (default 8)\n"
           "      --fixed-depth      always draft --draft-depth tokens (no depth controller)\n"
           "      --accept RULE      match (exact, default) | rejection\n"
           "      --ctx N            KV positions per row (default: the model's, at most 4096)\n"
           "      --kv-type T        KV cache storage: auto (default: bf16 under --act-type amx, and under\n"
           "                         bf16 on CPUs with AVX-512 BF16; else f32) | f32 | bf16 | f16 | q8_0\n"
           "      --act-type T       activations of bf16-weight products: f32 (default) | bf16 | amx\n"
           "  -t, --threads N        threads per context (default: physical cores)\n"
           CLI_MMAP_HELP
           "      --host ADDR        address to listen on (default 127.0.0.1)\n"
           "      --port N           port (default 8080; 0 = any free port)\n"
           "      --max-rows N       requests generating at once (default 8)\n"
           "      --queue N          requests waiting for a row before 503 (default 64)\n"
           "      --max-groups N     speculative groups (drafter, depth) open at once (default 4)\n"
           "      --prefill-budget N prompt tokens admitted per round, at least one request (default 512)\n"
           "      --served-model-name NAME   the model id clients use (default: from the directory)\n"
           "      --shutdown-grace S seconds running requests may finish after SIGINT/SIGTERM (default 30)\n"
           "  -h, --help             this help\n");
}

/* Model id: the directory's name, or its parent's when it is called "target". */
static void derive_model_id(const char *dir, char *out, size_t cap) {
    char tmp[PATH_MAX];
    snprintf(tmp, sizeof tmp, "%s", dir);
    size_t n = strlen(tmp);
    while (n > 1 && tmp[n - 1] == '/') tmp[--n] = 0;
    char a[PATH_MAX], b[PATH_MAX];
    snprintf(a, sizeof a, "%s", tmp);
    snprintf(b, sizeof b, "%s", tmp);
    const char *base = basename(a);
    if (!strcmp(base, "target")) base = basename(dirname(b));
    snprintf(out, cap, "%s", base);
}

/* The startup watcher: SIGINT/SIGTERM while the server starts. */
typedef struct {
    sigset_t sigs;
    pthread_t thread;
    int started;     /* the thread runs (0: it could not be started; signals wait for the main thread) */
    atomic_int done; /* set by the main thread once startup is over */
    int sig;         /* a signal taken after done was set: the main thread's to handle (read after the join) */
} startup_watch;

static void *startup_watch_main(void *arg) {
    startup_watch *w = arg;
    while (!atomic_load(&w->done)) {
        struct timespec ts = {0, 100 * 1000000L};
        int sig = sigtimedwait(&w->sigs, NULL, &ts);
        if (sig < 0) continue; /* timeout or EINTR: look at done again */
        if (atomic_load(&w->done)) { w->sig = sig; break; }
        /* _exit, not exit or a return: the main thread may be blocked in an open or a read,
         * or halfway through the model load or the scheduler's start, so it can neither be
         * joined nor have its state freed; atexit handlers and stdio flushing would run
         * alongside it. This is the program's front end, not the library (which never
         * exits): the kernel reclaims everything. No address has been announced yet. */
        fprintf(stderr, "tandem serve: %s during startup: exiting\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
        _exit(128 + sig);
    }
    return NULL;
}

/* Ends the watcher (startup is over, or failed) and joins it; returns the signal it
 * handed over, 0 if none. */
static int startup_watch_stop(startup_watch *w) {
    atomic_store(&w->done, 1);
    if (w->started) pthread_join(w->thread, NULL);
    w->started = 0;
    return w->sig;
}

int td_serve_main(int argc, char **argv) {
    cli_gen_opts o;
    cli_gen_opts_init(&o);
    memset(&S, 0, sizeof S);
    srv_config *cf = &S.cfg;
    cf->host = "127.0.0.1";
    cf->port = 8080;
    cf->max_rows = 8;
    cf->queue = 64;
    cf->max_groups = SRV_MAX_GROUPS_DEFAULT;
    cf->prefill_budget = 512;
    cf->shutdown_grace = 30;
    const char *name = NULL;
    static const char *shared[] = {"-m", "--model", "--draft", "--draft-depth", "--fixed-depth", "--accept",
                                   "--ctx", "--kv-type", "--act-type", "-t", "--threads", "--no-mmap", "--mmap"};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int is_shared = 0;
        for (size_t k = 0; k < sizeof shared / sizeof *shared; k++) is_shared |= !strcmp(a, shared[k]);
        if (is_shared) {
            if (cli_gen_opt(&o, argc, argv, &i) < 0) return 2;
            continue;
        }
        long lv;
        double dv;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { serve_help(); return 0; }
        else if (!strcmp(a, "--host")) { if (!cli_need_arg(i, argc, a)) return 2; cf->host = argv[++i]; }
        else if (!strcmp(a, "--port")) { if (!cli_need_arg(i, argc, a) || !cli_parse_int(argv[++i], a, 0, 65535, &lv)) return 2; cf->port = (int)lv; }
        else if (!strcmp(a, "--max-rows")) { if (!cli_need_arg(i, argc, a) || !cli_parse_int(argv[++i], a, 1, 256, &lv)) return 2; cf->max_rows = (int)lv; }
        else if (!strcmp(a, "--queue")) { if (!cli_need_arg(i, argc, a) || !cli_parse_int(argv[++i], a, 0, 100000, &lv)) return 2; cf->queue = (int)lv; }
        else if (!strcmp(a, "--max-groups")) { if (!cli_need_arg(i, argc, a) || !cli_parse_int(argv[++i], a, 1, 64, &lv)) return 2; cf->max_groups = (int)lv; }
        else if (!strcmp(a, "--prefill-budget")) { if (!cli_need_arg(i, argc, a) || !cli_parse_int(argv[++i], a, 1, 1 << 24, &lv)) return 2; cf->prefill_budget = lv; }
        else if (!strcmp(a, "--served-model-name")) { if (!cli_need_arg(i, argc, a)) return 2; name = argv[++i]; }
        else if (!strcmp(a, "--shutdown-grace")) { if (!cli_need_arg(i, argc, a) || !cli_parse_float(argv[++i], a, 0, 86400, &dv)) return 2; cf->shutdown_grace = dv; }
        else { fprintf(stderr, "tandem serve: unknown option '%s' (see --help)\n", a); return 2; }
    }
    int bundled = o.model_dir == NULL;
    if (!o.model_dir) o.model_dir = cli_default_model_dir();
    if (!o.draft) o.draft = bundled ? cli_default_drafter(o.model_dir) : "none";
    if (strlen(o.draft) >= SRV_SPEC_LEN) { fprintf(stderr, "tandem serve: --draft spec too long\n"); return 2; }
    cf->model_dir = o.model_dir;
    cf->draft = o.draft;
    cf->depth = o.depth;
    cf->fixed_depth = o.fixed_depth;
    cf->accept = o.accept;
    cf->threads = (int)o.threads;
    cf->ctx = (int)o.ctx;
    cf->kv_type = cli_kv_type(o.kv_type, o.act_type);
    cf->act_type = o.act_type;
    if (name) snprintf(cf->model_id, sizeof cf->model_id, "%s", name);
    else derive_model_id(o.model_dir, cf->model_id, sizeof cf->model_id);

    /* every thread started from here on inherits the blocked signals */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);
    startup_watch W; /* joined on every path below (startup_watch_stop) */
    memset(&W, 0, sizeof W);
    W.sigs = sigs;
    atomic_init(&W.done, 0);
    W.started = pthread_create(&W.thread, NULL, startup_watch_main, &W) == 0;
    if (!W.started) fprintf(stderr, "tandem serve: cannot start the startup signal watcher; signals wait until the server listens\n");

    pthread_mutex_init(&S.mu, NULL);
    pthread_cond_init(&S.cv, NULL);
    S.created = (long)time(NULL);
    double le_ttft[] = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10};
    double le_itl[] = {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1};
    double le_e2e[] = {0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 15, 20, 30, 40, 50, 60, 120};
    srv_hist_init(&S.mx.ttft, le_ttft, 16);
    srv_hist_init(&S.mx.itl, le_itl, 16);
    srv_hist_init(&S.mx.e2e, le_e2e, 16);

    td_err err = {0};
    int rc = 1;
    struct MHD_Daemon *d = NULL;
    if (td_model_open_params(&S.model, o.model_dir, &o.mp, &err) != 0) { cli_die(o.model_dir, &err); goto out; }
    if (!(S.tok = td_model_tokenizer(S.model))) { fprintf(stderr, "tandem serve: %s has no tokenizer.json\n", o.model_dir); goto out; }
    td_model_info info;
    td_model_get_info(S.model, &info);
    S.n_vocab = info.n_vocab;
    S.chat_style = td_tokenizer_chat_style(S.tok);
    const char *eot = S.chat_style == TD_CHAT_CHATML ? "<|im_end|>" : S.chat_style == TD_CHAT_LLAMA3 ? "<|eot_id|>" : NULL;
    if (eot && td_tokenizer_find(S.tok, eot) >= 0) S.eot_text = eot;
    char eb[768];
    if (srv_sched_start(eb, sizeof eb) != 0) { fprintf(stderr, "tandem serve: %s\n", eb); goto out; }
    int port = 0;
    if (!(d = srv_http_start(eb, sizeof eb, &port))) { fprintf(stderr, "tandem serve: %s\n", eb); goto out; }
    int sig = startup_watch_stop(&W); /* before the line: whoever waits for it gets the graceful drain */
    fprintf(stderr, "tandem serve: listening on http://%s:%d (model %s, drafter %s, depth %d, max rows %d, ctx %d, queue %d)\n",
            strchr(cf->host, ':') ? "[::]" : cf->host, port, cf->model_id, cf->draft, cf->depth, cf->max_rows, S.n_ctx, cf->queue);
    fflush(stderr);

    /* wait for a signal, unless the watcher handed one over */
    if (!sig)
        while ((sig = sigwaitinfo(&sigs, NULL)) < 0 && errno == EINTR) {}
    MHD_socket ls = MHD_quiesce_daemon(d);
    pthread_mutex_lock(&S.mu);
    fprintf(stderr, "tandem serve: %s: draining (%d running, %d waiting)\n", sig == SIGINT ? "SIGINT" : "SIGTERM",
            S.n_running, S.n_queued);
    S.draining = 1;
    S.drain_deadline = srv_now() + cf->shutdown_grace;
    pthread_cond_broadcast(&S.cv);
    while (S.n_running > 0 || S.n_queued > 0) {
        pthread_mutex_unlock(&S.mu);
        struct timespec ts = {0, 50 * 1000000L};
        if (sigtimedwait(&sigs, NULL, &ts) > 0) {
            pthread_mutex_lock(&S.mu);
            S.drain_deadline = 0; /* second signal: cancel now */
            pthread_cond_broadcast(&S.cv);
            pthread_mutex_unlock(&S.mu);
        }
        pthread_mutex_lock(&S.mu);
    }
    pthread_mutex_unlock(&S.mu);
    MHD_stop_daemon(d);
    d = NULL;
    if (ls != MHD_INVALID_SOCKET) close(ls);
    rc = 0;
    fprintf(stderr, "tandem serve: stopped\n");
out:
    startup_watch_stop(&W); /* after a failed startup; a no-op once joined */
    if (d) MHD_stop_daemon(d);
    srv_sched_stop();
    td_model_free(S.model);
    S.model = NULL;
    return rc;
}
