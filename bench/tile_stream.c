/* bench/tile_stream.c — how fast can weights stream while the 8-token bf16
 * tile computes on them? A synthetic stand-in for td_matmul_bf16a's T = 8
 * verify tile (8 tokens x 3 outputs, 24 vdpbf16ps per 32-element step, so 8
 * per 64-byte line of weights) that changes one thing at a time:
 *   layout  lin:  each thread reads its half of the buffer as one stream;
 *           rows: as the engine's tile does, 3 rows of RB bytes (K = RB / 2)
 *                 side by side, 64 bytes of each a step (3 streams);
 *   work    read: a plain read of the same lines (1 xor a step), or tile;
 *   tile    lin: a "tile" ends every S steps (its 24 accumulators reduced and
 *           stored, then zeroed); rows: every RB / 64 steps, as K dictates;
 *   x       fix: the 8 tokens' 64 bytes a step always come from one 512-byte
 *           block; rows: from 8 rows of K bf16 (2 KiB apart), advancing with
 *           the step, as the engine's activations are laid out (8 streams);
 *           il: interleaved, [step][token][32] (one stream);
 *   out     ring: the 24 sums go to one small contiguous ring (L1);
 *           rows: to 8 output rows 16 KiB apart, 3 floats each (the engine's
 *           y[8][N] of a layer product: N = 4096; 8 more streams);
 *   pf      none; lin: prefetcht1 8 KiB ahead; rows: the engine's pair, each
 *           row prefetcht0 2 tiles ahead and prefetcht1 4 tiles ahead.
 * XW (default 32) is how many steps an activation block spans before the tile
 * reuses it: 32 is the engine's 8 x 1024 bf16 (16 KiB), 8 is 4 KiB.
 * Two threads (pthreads), a 1 GiB buffer advised MADV_HUGEPAGE; per setting the
 * best of REPS passes, as GB/s, one JSON line each, the whole list ROUNDS times
 * (the project's VM drifts within minutes: compare lines of one round).
 * On the project's 2-vCPU Zen 5 VM (bench/forward-notes.md, "Stop 57"), in a
 * fast phase (a plain read at 58-66 GB/s): one weight stream with the tile's
 * arithmetic ran at 50-58 GB/s with x fix, 26-29 with the engine's activation
 * rows (36 with the prefetch, 36 interleaved), and the engine's own pattern at
 * 23 without software prefetch and 35-36 with it. With XW 8 (4 KiB of
 * activations) the engine's pattern ran at 40 and one stream at 44-48: the
 * 16 KiB activation block and the streaming weights do not share L1 well.
 * In a slow phase (a read at 33 GB/s) the same settings ran 35-38, 27-29 (34),
 * 23 and 29.
 * Build and run (x86-64 with AVX512_BF16):
 *   cc -std=c11 -O2 -march=native -pthread bench/tile_stream.c -o /tmp/tile_stream && /tmp/tile_stream [REPS] [ROUNDS] [XW] */
#define _GNU_SOURCE
#include <immintrin.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#if !defined(__AVX512BF16__)
int main(void) {
    fprintf(stderr, "tile_stream: needs AVX512_BF16 (-march=native on such a machine)\n");
    return 2;
}
#else
#define BUF ((size_t)1 << 30)
#define RB 2048                 /* bytes of a weight row: K = 1024 bf16 */
#define YROW (16 << 10)         /* bytes between output rows (out = rows) */
#define AI static inline __attribute__((always_inline))

enum { L_LIN, L_ROWS };
enum { O_RING, O_ROWS };
enum { X_FIX, X_ROWS, X_IL };
typedef struct {
    const char *name;
    int layout, tile, steps, xm, out, pf; /* steps: lin's S (rows: RB / 64) */
} setting;

typedef struct {
    const setting *s;
    const char *p, *e;
    float *y;               /* this thread's outputs: 8 rows of YROW bytes (or the ring) */
    const uint16_t *x;      /* 8 tokens x K bf16 (x rows), or the first 512 bytes (x fix), or [step][8][32] (x il) */
    float sink;             /* out: keeps the work from being optimised away */
} job;

static int g_xw = RB / 64; /* steps an activation block spans (XW): 32 = 8 x 1024 bf16, 16 KiB */
static char *g_buf;
static volatile float g_sink;

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

/* One tile: `steps` steps of 3 lines (w0 + j * rs + s * ss), 8 x 3 vdpbf16ps a
 * step (or one xor), then its 24 sums stored at y + i * ly + j. */
AI void run_tile(int tile, int pf, int layout, int xm, const char *w, size_t rs, size_t ss, int steps, float *y, size_t ly,
                 const uint16_t *x, __m512 *rd) {
    __m512 acc[8][3];
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++)
#pragma GCC unroll 3
        for (int j = 0; j < 3; j++) acc[i][j] = _mm512_setzero_ps();
    for (int s = 0; s < steps; s++) {
        const char *q = w + (size_t)s * ss;
        if (pf && layout == L_LIN) {
            _mm_prefetch(q + 8192, _MM_HINT_T1);
            _mm_prefetch(q + 8192 + 64, _MM_HINT_T1);
            _mm_prefetch(q + 8192 + 128, _MM_HINT_T1);
        } else if (pf) {
#pragma GCC unroll 3
            for (int j = 0; j < 3; j++) _mm_prefetch(q + 12 * rs + j * rs, _MM_HINT_T1);
#pragma GCC unroll 3
            for (int j = 0; j < 3; j++) _mm_prefetch(q + 6 * rs + j * rs, _MM_HINT_T0);
        }
        __m512i w0 = _mm512_load_si512(q), w1 = _mm512_load_si512(q + rs), w2 = _mm512_load_si512(q + 2 * rs);
        if (!tile) {
            *rd = _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(*rd), _mm512_xor_si512(w0, _mm512_xor_si512(w1, w2))));
            continue;
        }
#pragma GCC unroll 8
        for (int i = 0; i < 8; i++) {
            int ks = s % g_xw; /* the step's place in the activations' K block */
            __m512i xv = _mm512_load_si512(xm == X_FIX    ? x + i * 32
                                           : xm == X_ROWS ? x + i * (RB / 2) + ks * 32
                                                          : x + ks * 256 + i * 32);
            __asm__("" : "+v"(xv)); /* one load a token, as the engine's tile */
            acc[i][0] = _mm512_dpbf16_ps(acc[i][0], (__m512bh)xv, (__m512bh)w0);
            acc[i][1] = _mm512_dpbf16_ps(acc[i][1], (__m512bh)xv, (__m512bh)w1);
            acc[i][2] = _mm512_dpbf16_ps(acc[i][2], (__m512bh)xv, (__m512bh)w2);
        }
    }
    if (tile)
#pragma GCC unroll 8
        for (int i = 0; i < 8; i++)
#pragma GCC unroll 3
            for (int j = 0; j < 3; j++) y[(size_t)i * ly + j] = _mm512_reduce_add_ps(acc[i][j]);
}

/* The pass over [p, e) for one setting; constants propagate into each
 * instance, so the accumulators stay in registers. */
AI void pass(job *jb, int layout, int tile, int steps, int xm, int out, int pf) {
    const char *p = jb->p;
    size_t tb = (size_t)steps * 192; /* bytes a tile covers: 3 rows x RB, or S steps of 192 */
    size_t ly = out == O_ROWS ? YROW / 4 : 3, yo = 0, ywrap = out == O_ROWS ? YROW / 4 - 3 : 1024 - 24;
    __m512 rd = _mm512_setzero_ps();
    for (; p + tb <= jb->e; p += tb) {
        if (layout == L_LIN)
            run_tile(tile, pf, layout, xm, p, 64, 192, steps, jb->y + yo, ly, jb->x, &rd);
        else
            run_tile(tile, pf, layout, xm, p, RB, 64, RB / 64, jb->y + yo, ly, jb->x, &rd);
        yo = out == O_ROWS ? (yo + 3 > ywrap ? 0 : yo + 3) : (yo + 24 > ywrap ? 0 : yo + 24);
    }
    jb->sink = _mm512_reduce_add_ps(rd) + jb->y[0];
}

static void *worker(void *arg) {
    job *jb = arg;
    const setting *s = jb->s;
#define CASE(L, T, S, X, O, P)                                                                                \
    if (s->layout == L && s->tile == T && s->steps == S && s->xm == X && s->out == O && s->pf == P) \
        return pass(jb, L, T, S, X, O, P), NULL;
    CASE(L_LIN, 0, 32, X_FIX, O_RING, 0)
    CASE(L_LIN, 1, 1024, X_FIX, O_RING, 0)
    CASE(L_LIN, 1, 32, X_FIX, O_RING, 0)
    CASE(L_LIN, 1, 32, X_FIX, O_ROWS, 0)
    CASE(L_LIN, 1, 32, X_ROWS, O_RING, 0)
    CASE(L_LIN, 1, 32, X_ROWS, O_ROWS, 0)
    CASE(L_LIN, 1, 32, X_ROWS, O_ROWS, 1)
    CASE(L_LIN, 1, 32, X_IL, O_ROWS, 0)
    CASE(L_ROWS, 0, RB / 64, X_FIX, O_RING, 0)
    CASE(L_ROWS, 1, RB / 64, X_ROWS, O_ROWS, 0)
    CASE(L_ROWS, 1, RB / 64, X_ROWS, O_ROWS, 1)
#undef CASE
    return NULL;
}

static const setting SETTINGS[] = {
    {"lin read", L_LIN, 0, 32, X_FIX, O_RING, 0},
    {"lin tile S=1024, x fix, out ring", L_LIN, 1, 1024, X_FIX, O_RING, 0},
    {"lin tile S=32, x fix, out ring", L_LIN, 1, 32, X_FIX, O_RING, 0},
    {"lin tile S=32, x fix, out rows", L_LIN, 1, 32, X_FIX, O_ROWS, 0},
    {"lin tile S=32, x rows, out ring", L_LIN, 1, 32, X_ROWS, O_RING, 0},
    {"lin tile S=32, x rows, out rows", L_LIN, 1, 32, X_ROWS, O_ROWS, 0},
    {"lin tile S=32, x rows, out rows, pf", L_LIN, 1, 32, X_ROWS, O_ROWS, 1},
    {"lin tile S=32, x il, out rows", L_LIN, 1, 32, X_IL, O_ROWS, 0},
    {"rows read", L_ROWS, 0, RB / 64, X_FIX, O_RING, 0},
    {"rows tile, x rows, out rows (the engine's, no prefetch)", L_ROWS, 1, RB / 64, X_ROWS, O_ROWS, 0},
    {"rows tile, x rows, out rows, pf (the engine's)", L_ROWS, 1, RB / 64, X_ROWS, O_ROWS, 1},
};

int main(int argc, char **argv) {
    int reps = argc > 1 ? atoi(argv[1]) : 3, rounds = argc > 2 ? atoi(argv[2]) : 2;
    if (argc > 3) g_xw = atoi(argv[3]);
    if (reps < 1 || reps > 100 || rounds < 1 || rounds > 100 || g_xw < 1 || g_xw > RB / 64) {
        fprintf(stderr, "usage: tile_stream [REPS 1..100] [ROUNDS 1..100] [XW 1..%d]\n", RB / 64);
        return 2;
    }
    g_buf = aligned_alloc((size_t)2 << 20, BUF);
    float *ys[2];
    uint16_t *xs[2];
    for (int t = 0; t < 2; t++) {
        ys[t] = aligned_alloc(64, (size_t)8 * YROW);
        xs[t] = aligned_alloc(64, 8 * 32 * sizeof(uint16_t));
    }
    if (!g_buf || !ys[0] || !ys[1] || !xs[0] || !xs[1]) {
        fprintf(stderr, "tile_stream: out of memory\n");
        return 1;
    }
    madvise(g_buf, BUF, MADV_HUGEPAGE); /* advice only */
    memset(g_buf, 0x3c, BUF);
    for (int t = 0; t < 2; t++) {
        memset(ys[t], 0, (size_t)8 * YROW);
        for (int i = 0; i < 8 * 32; i++) xs[t][i] = (uint16_t)(0x3c00 + (i & 7));
    }
    for (int r = 0; r < rounds; r++)
        for (size_t k = 0; k < sizeof SETTINGS / sizeof SETTINGS[0]; k++) {
            double best = 0;
            for (int rep = 0; rep < reps; rep++) {
                job jb[2];
                pthread_t th[2];
                double t0 = now_s();
                for (int t = 0; t < 2; t++) {
                    jb[t] = (job){&SETTINGS[k], g_buf + BUF / 2 * t, g_buf + BUF / 2 * (t + 1), ys[t], xs[t], 0};
                    if (pthread_create(&th[t], NULL, worker, &jb[t]) != 0) {
                        fprintf(stderr, "tile_stream: pthread_create failed\n");
                        return 1;
                    }
                }
                for (int t = 0; t < 2; t++) pthread_join(th[t], NULL);
                g_sink += jb[0].sink + jb[1].sink;
                double gbs = BUF / (now_s() - t0) / 1e9;
                if (gbs > best) best = gbs;
            }
            printf("{\"round\": %d, \"setting\": \"%s\", \"gbs\": %.1f}\n", r, SETTINGS[k].name, best);
            fflush(stdout);
        }
    return 0;
}
#endif
