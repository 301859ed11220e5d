/* pool — see pool.h. One job at a time; the caller participates.
 *
 * A job is n chunks (n = pool size, or the caller's count), dealt as one
 * contiguous range per thread (thread t: chunks [n t / T, n (t+1) / T), the
 * caller being thread 0), so with n = T each thread runs the chunk its
 * position gives it, and with more chunks the same weights go to the same
 * thread job after job (a core keeps its share in its caches). Each range is
 * one word (generation << 32 | lo << 16 | hi): its owner claims chunks from
 * the front (lo), and a thread whose own range is empty steals from the back
 * (hi) of the others', both with a compare-and-swap on that word. So a job
 * never waits for a worker that is asleep or descheduled (a shared machine):
 * the others simply run the chunks it has not claimed, and wait only for
 * chunks in progress. A chunk's result does not depend on which thread runs
 * it (chunks own their output ranges and their scratch, indexed by chunk), so
 * bits never change.
 *
 * Memory order: the caller publishes fn/arg/n, then every range word
 * (release), then the generation; a claim succeeds only with an acquire CAS on
 * a word of the job's own generation, after which fn/arg/n are that job's and
 * stay so until its last chunk is done (the caller starts the next job only
 * after counting every chunk done). */
#define _GNU_SOURCE
#include "pool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define CPU_RELAX() _mm_pause()
#else
#define CPU_RELAX() ((void)0)
#endif

#define MAX_CHUNKS 65535        /* a range word holds 16-bit chunk indices */

typedef struct {
    _Alignas(64) _Atomic uint64_t w; /* gen << 32 | lo << 16 | hi: chunks [lo, hi) unclaimed */
} range_slot;

typedef struct { struct td_pool *p; int t; } worker_arg;

struct td_pool {
    int n;
    pthread_t *threads;         /* [n-1] */
    worker_arg *wargs;          /* [n-1] */
    range_slot *rng;            /* [n], 64-byte aligned: one cache line per thread */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    _Atomic uint32_t gen;       /* bumped for each job */
    atomic_int done;            /* chunks finished in the current job */
    atomic_int sleepers;        /* workers blocked on cv */
    atomic_int quit;
    _Atomic(td_pool_fn) fn;
    _Atomic(void *) arg;
    atomic_int n_chunks;
};

#define SPIN_ITERS 20000        /* pause loops (~1 ms) before a worker sleeps */

/* Claim one chunk of job g from slot s: from the front when it is the
 * claimer's own slot (own), else from the back. -1 when s holds none of job g. */
static int claim(td_pool *p, int s, uint32_t g, int own) {
    _Atomic uint64_t *w = &p->rng[s].w;
    uint64_t v = atomic_load_explicit(w, memory_order_acquire);
    for (;;) {
        if ((uint32_t)(v >> 32) != g) return -1;
        uint32_t lo = (uint32_t)(v >> 16) & 0xffff, hi = (uint32_t)v & 0xffff;
        if (lo >= hi) return -1;
        uint64_t nv = own ? v + ((uint64_t)1 << 16) : v - 1;
        if (atomic_compare_exchange_weak_explicit(w, &v, nv, memory_order_acq_rel, memory_order_acquire))
            return (int)(own ? lo : hi - 1);
    }
}

/* Run chunks of job g as thread t: its own range first, then the others'
 * (from the back, nearest neighbour first) until none is left. */
static void run_chunks(td_pool *p, uint32_t g, int t) {
    int n = p->n;
    for (;;) {
        int i = claim(p, t, g, 1);
        for (int d = 1; i < 0 && d < n; d++) i = claim(p, (t + d) % n, g, 0);
        if (i < 0) return;
        /* chunk i of job g is ours: fn/arg/n are job g's until we count it done */
        td_pool_fn fn = atomic_load_explicit(&p->fn, memory_order_relaxed);
        void *arg = atomic_load_explicit(&p->arg, memory_order_relaxed);
        int nc = atomic_load_explicit(&p->n_chunks, memory_order_relaxed);
        fn(arg, i, nc);
        atomic_fetch_add_explicit(&p->done, 1, memory_order_release);
    }
}

static void *worker_main(void *vp) {
    worker_arg *wa = vp;
    td_pool *p = wa->p;
    uint32_t seen = atomic_load(&p->gen);
    for (;;) {
        uint32_t g;
        int spins = 0;
        while ((g = atomic_load_explicit(&p->gen, memory_order_acquire)) == seen && !atomic_load(&p->quit)) {
            if (++spins < SPIN_ITERS) { CPU_RELAX(); continue; }
            pthread_mutex_lock(&p->mu);
            atomic_fetch_add(&p->sleepers, 1);
            while (atomic_load(&p->gen) == seen && !atomic_load(&p->quit)) pthread_cond_wait(&p->cv, &p->mu);
            atomic_fetch_sub(&p->sleepers, 1);
            pthread_mutex_unlock(&p->mu);
            spins = 0;
        }
        if (atomic_load(&p->quit)) return NULL;
        seen = g;
        run_chunks(p, g, wa->t);
    }
}

int td_pool_open(td_pool **out, int n_threads) {
    *out = NULL;
    /* TD_MAX_THREADS caps every pool (for emulators such as qemu-user, where a
     * spinning thread starves the others: scripts/test-aarch64) */
    const char *ce = getenv("TD_MAX_THREADS");
    int cap = ce ? atoi(ce) : 0;
    if (cap >= 1 && n_threads > cap) n_threads = cap;
    if (n_threads < 1) n_threads = 1;
    td_pool *p = calloc(1, sizeof *p);
    if (!p) return -2;
    p->n = n_threads;
    p->rng = aligned_alloc(64, sizeof *p->rng * (size_t)n_threads);
    if (!p->rng) { free(p); return -2; }
    for (int i = 0; i < n_threads; i++) atomic_init(&p->rng[i].w, 0);
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    atomic_init(&p->gen, 0);
    atomic_init(&p->done, 0);
    atomic_init(&p->sleepers, 0);
    atomic_init(&p->quit, 0);
    atomic_init(&p->fn, NULL);
    atomic_init(&p->arg, NULL);
    atomic_init(&p->n_chunks, 0);
    if (n_threads > 1) {
        p->threads = calloc((size_t)n_threads - 1, sizeof *p->threads);
        p->wargs = calloc((size_t)n_threads - 1, sizeof *p->wargs);
        if (!p->threads || !p->wargs) { free(p->threads); free(p->wargs); free(p->rng); free(p); return -2; }
        for (int i = 1; i < n_threads; i++) {
            p->wargs[i - 1] = (worker_arg){p, i};
            if (pthread_create(&p->threads[i - 1], NULL, worker_main, &p->wargs[i - 1]) != 0) {
                p->n = i; /* keep those started */
                break;
            }
        }
    }
    *out = p;
    return 0;
}

void td_pool_free(td_pool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    atomic_store(&p->quit, 1);
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    for (int i = 1; i < p->n; i++) pthread_join(p->threads[i - 1], NULL);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    free(p->threads);
    free(p->wargs);
    free(p->rng);
    free(p);
}

int td_pool_size(const td_pool *p) { return p->n; }

void td_pool_run(td_pool *p, td_pool_fn fn, void *arg) { td_pool_run_n(p, fn, arg, p->n); }

void td_pool_run_n(td_pool *p, td_pool_fn fn, void *arg, int n) {
    if (n < 1) n = 1;
    if (n > MAX_CHUNKS) n = MAX_CHUNKS; /* callers split by chunk count, so any count is correct */
    if (p->n == 1) { fn(arg, 0, 1); return; } /* one thread: one chunk covers the job */
    atomic_store_explicit(&p->fn, fn, memory_order_relaxed);
    atomic_store_explicit(&p->arg, arg, memory_order_relaxed);
    atomic_store_explicit(&p->n_chunks, n, memory_order_relaxed);
    atomic_store_explicit(&p->done, 0, memory_order_relaxed);
    uint32_t g = atomic_load_explicit(&p->gen, memory_order_relaxed) + 1;
    for (int t = 0; t < p->n; t++) {
        uint64_t lo = (uint64_t)n * (uint64_t)t / (uint64_t)p->n, hi = (uint64_t)n * (uint64_t)(t + 1) / (uint64_t)p->n;
        atomic_store_explicit(&p->rng[t].w, (uint64_t)g << 32 | lo << 16 | hi, memory_order_release);
    }
    atomic_store(&p->gen, g); /* seq_cst: ordered before the sleepers check */
    if (atomic_load(&p->sleepers) > 0) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->cv);
        pthread_mutex_unlock(&p->mu);
    }
    run_chunks(p, g, 0);
    int spins = 0;
    while (atomic_load_explicit(&p->done, memory_order_acquire) < n) {
        if (++spins < 2000) CPU_RELAX();
        else { sched_yield(); spins = 0; }
    }
}

/* The lowest CPU of `cpu`'s thread_siblings_list ("0,64", "0-1", "2-3,66-67")
 * that is also in `set`; -2 when the file is missing or unreadable. */
static int first_sibling_in(int cpu, const cpu_set_t *set) {
    char path[96], buf[1024];
    snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu%d/topology/thread_siblings_list", cpu);
    FILE *f = fopen(path, "r");
    if (!f) return -2;
    size_t len = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[len] = 0;
    char *s = buf, *end;
    while (*s) {
        long a = strtol(s, &end, 10), b;
        if (end == s || a < 0) return -2;
        s = end;
        b = a;
        if (*s == '-') {
            b = strtol(s + 1, &end, 10);
            if (end == s + 1 || b < a) return -2;
            s = end;
        }
        for (long c = a; c <= b && c < CPU_SETSIZE; c++)
            if (CPU_ISSET((int)c, set)) return (int)c;
        if (*s == ',') s++;
        else break;
    }
    return -1;
}

size_t td_llc_cap(size_t reported, int amd) {
    const size_t amd_max = (size_t)96 << 20;
    return amd && reported > amd_max ? amd_max : reported;
}

size_t td_llc_bytes(void) {
    long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE), l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);
    size_t r = l3 > 0 ? (size_t)l3 : l2 > 0 ? (size_t)l2 : (size_t)32 << 20;
    int amd = 0;
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    __builtin_cpu_init();
    amd = __builtin_cpu_is("amd") != 0;
#endif
    return td_llc_cap(r, amd);
}

int td_pool_default_size(void) {
    cpu_set_t set;
    long onln = sysconf(_SC_NPROCESSORS_ONLN);
    if (sched_getaffinity(0, sizeof set, &set) != 0) return onln > 0 ? (int)onln : 1;
    int allowed = CPU_COUNT(&set), cores = 0;
    for (int c = 0; c < CPU_SETSIZE; c++) {
        if (!CPU_ISSET(c, &set)) continue;
        int f = first_sibling_in(c, &set);
        if (f == -2) return allowed > 0 ? allowed : 1; /* no topology: count CPUs */
        cores += f == c; /* one CPU per core counts: its lowest allowed sibling */
    }
    return cores > 0 ? cores : allowed > 0 ? allowed : 1;
}
