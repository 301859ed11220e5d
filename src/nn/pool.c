/* pool — see pool.h. One job at a time; the caller participates as thread 0. */
#define _GNU_SOURCE
#include "pool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>

struct td_pool {
    int n;
    pthread_t *threads;      /* [n-1] */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    atomic_uint gen;         /* bumped for each job */
    atomic_int pending;      /* workers still running the current job */
    atomic_int quit;
    td_pool_fn fn;
    void *arg;
    struct td_pool_worker { struct td_pool *p; int ith; } *workers;
};

#define SPIN_ITERS 200000

static void *worker_main(void *vp) {
    struct td_pool_worker *w = vp;
    td_pool *p = w->p;
    unsigned seen = 0;
    for (;;) {
        unsigned g;
        int spins = 0;
        while ((g = atomic_load_explicit(&p->gen, memory_order_acquire)) == seen &&
               !atomic_load(&p->quit)) {
            if (++spins < SPIN_ITERS) continue;
            pthread_mutex_lock(&p->mu);
            while (atomic_load(&p->gen) == seen && !atomic_load(&p->quit))
                pthread_cond_wait(&p->cv, &p->mu);
            pthread_mutex_unlock(&p->mu);
        }
        if (atomic_load(&p->quit)) return NULL;
        seen = g;
        p->fn(p->arg, w->ith, p->n);
        atomic_fetch_sub_explicit(&p->pending, 1, memory_order_release);
    }
}

int td_pool_open(td_pool **out, int n_threads) {
    *out = NULL;
    if (n_threads < 1) n_threads = 1;
    td_pool *p = calloc(1, sizeof *p);
    if (!p) return -2;
    p->n = n_threads;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    if (n_threads > 1) {
        p->threads = calloc((size_t)n_threads - 1, sizeof *p->threads);
        p->workers = calloc((size_t)n_threads - 1, sizeof *p->workers);
        if (!p->threads || !p->workers) { free(p->threads); free(p->workers); free(p); return -2; }
        for (int i = 1; i < n_threads; i++) {
            p->workers[i - 1] = (struct td_pool_worker){p, i};
            if (pthread_create(&p->threads[i - 1], NULL, worker_main, &p->workers[i - 1]) != 0) {
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
    free(p->workers);
    free(p);
}

int td_pool_size(const td_pool *p) { return p->n; }

void td_pool_run(td_pool *p, td_pool_fn fn, void *arg) {
    if (p->n == 1) { fn(arg, 0, 1); return; }
    p->fn = fn;
    p->arg = arg;
    atomic_store(&p->pending, p->n - 1);
    pthread_mutex_lock(&p->mu);
    atomic_fetch_add_explicit(&p->gen, 1, memory_order_release);
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    fn(arg, 0, p->n);
    int spins = 0;
    while (atomic_load_explicit(&p->pending, memory_order_acquire) > 0)
        if (++spins > 1000) { sched_yield(); spins = 0; }
}
