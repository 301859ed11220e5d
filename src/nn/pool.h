/* pool — a persistent thread pool for data-parallel kernels.
 *
 * td_pool_run(p, fn, arg) calls fn(arg, i, n) exactly once for each chunk
 * i = 0..n-1 (n = the pool size) and returns when all are done. Chunks are
 * claimed dynamically by whichever threads are running — the caller included —
 * so a worker that is asleep or descheduled never stalls a job: the caller runs
 * the chunks nobody claimed (i is a chunk index, not a thread id: index scratch
 * by it). Workers spin briefly (pause loops) after each job, since a forward
 * issues many short jobs, then sleep on a condition variable, so an idle pool
 * costs no CPU. Kernels split work over output elements or rows only, never
 * over a reduction axis, so neither the thread count nor which thread runs a
 * chunk changes a result's bits. One job at a time: td_pool_run must not be
 * called on the same pool from two threads at once, nor from inside a chunk
 * (contexts may share a pool only if they run forwards one after another). */
#ifndef TD_POOL_H
#define TD_POOL_H

#include <stddef.h>

typedef struct td_pool td_pool;
typedef void (*td_pool_fn)(void *arg, int ith, int nth);

/* A pool of n_threads (the caller counts as one; at most the environment's
 * TD_MAX_THREADS where that is set, for emulators). */
int td_pool_open(td_pool **out, int n_threads);
/* The pool a forward context runs on: borrowed, valid while the context lives.
 * For drafters that run their own products between the target's forwards on
 * the same threads (a second pool's spinning workers would steal the cores). */
struct td_ctx;
td_pool *td_ctx_pool(const struct td_ctx *c);
/* Matrix products of c's forwards run as per_thread chunks per thread (at
 * least 1; default MM_CHUNKS = 1 or the environment's TD_MM_CHUNKS, see forward.c;
 * forwards of up to 8 tokens choose between that and 8 by time unless it was
 * set so, td_ctx_set_hw_adapt) of at least min_bytes of weights each (default
 * 64 KiB). For tests and A/B runs: no count changes a bit. */
void td_ctx_set_mm_chunks(struct td_ctx *c, int per_thread, size_t min_bytes);
/* One-token products (a decode step's) of at least min_job_bytes of weights
 * run as per_thread chunks per thread where that is more than the above
 * (default MM_CHUNKS_1 = 8 from 2 MiB, or the environment's TD_MM_CHUNKS_1).
 * For tests and A/B runs: no count changes a bit. */
void td_ctx_set_mm_chunks_1(struct td_ctx *c, int per_thread, size_t min_job_bytes);
/* Whether c's products treat the weights as streamed from memory (1: prefetch
 * them further ahead, nn/mmx.h) or as cached (0). The default: 1 when the
 * model's weight bytes exceed td_llc_bytes(), or the environment's TD_STREAM
 * (0 or 1). For tests and A/B runs: neither changes a bit. */
void td_ctx_set_stream(struct td_ctx *c, int stream);
/* Whether c's forwards of 1 to 8 tokens choose their schedule by measured
 * time, one selector per token count (nn/hwsel.h): td_kernels_hw_stream's
 * prefetch choice (unless td_kernels_hw_stream_fixed) and one or 8 chunks a
 * thread for every product (unless td_ctx_set_mm_chunks or TD_MM_CHUNKS fixed
 * that). On by default unless the environment's TD_HW_ADAPT is 0. For tests
 * and A/B runs: no schedule changes a bit. */
void td_ctx_set_hw_adapt(struct td_ctx *c, int on);
/* The schedule c's forwards of T tokens now run: 0 with *hw (0 or 1, or -1
 * where that is not chosen) and *chunks (a thread); -1 where they do not
 * choose (adaptation off, nothing to choose, T outside 1..8, or not seeded). */
int td_ctx_sched_choice(const struct td_ctx *c, int T, int *hw, int *chunks);
void td_pool_free(td_pool *p);
int td_pool_size(const td_pool *p);
void td_pool_run(td_pool *p, td_pool_fn fn, void *arg);
/* The same with n_chunks chunks (fn(arg, i, n_chunks), i = 0..n_chunks-1; at
 * least 1) instead of one per thread: more chunks than threads balance a job
 * whose threads run at different speeds (a shared machine), at the price of a
 * claim per chunk. Scratch indexed by chunk must then have n_chunks slots. A
 * pool of one thread calls fn(arg, 0, 1), as td_pool_run does. */
void td_pool_run_n(td_pool *p, td_pool_fn fn, void *arg, int n_chunks);
/* The default pool size: physical cores among the CPUs this process may run on
 * (sched_getaffinity; hyper-threads of one core, from /sys/devices/system/cpu/
 * cpuN/topology/thread_siblings_list, count once). Without that topology: the
 * number of CPUs it may run on (or online). At least 1. */
int td_pool_default_size(void);
/* Bytes of the last-level cache (sysconf's L3, else L2), or 32 MiB where the
 * system does not say; on AMD's CPUs at most td_llc_cap's 96 MiB. Forward
 * contexts compare a model's weights with it (td_ctx_set_stream). */
size_t td_llc_bytes(void);
/* The reported last-level cache bytes as td_llc_bytes takes them: on AMD (amd
 * != 0) at most 96 MiB. An AMD core shares its L3 with the cores of its CCX
 * only (16 or 32 MiB; 96 with 3D V-Cache), but a hypervisor may report the
 * socket's sum through CPUID 0x80000006, which sysconf passes on: 508 MiB on
 * this project's 2-vCPU Zen 5 VMs, whose 0x8000001D leaf (the per-CCX sizes)
 * reads all zero. Taken at its word, models of 96-508 MiB ran the cached
 * products' prefetch there; streamed, a decode step of the 0.6B shape took
 * 0.59-0.89 of the time in Q5_K, Q6_K, Q5_0, IQ4_XS, Q4_K and bf16 (one layer),
 * 1.00 in Q4_0 (bench/forward-notes.md, "Stop 54"). 96 MiB keeps the tiny-code
 * target (50 MB of bf16, faster cached: stop 53) cached. */
size_t td_llc_cap(size_t reported, int amd);

#endif
