/* bench forward — `tandem bench forward`: how close the forward pass runs to the
 * machine's memory-bandwidth floor, in one process:
 *   1. read bandwidth: a STREAM-like sum over a 1 GiB buffer (2 MiB pages)
 *      with the same number of threads as the forward, best of several
 *      passes, the plain read's and one that also prefetches 4 KiB ahead
 *      (as the decode's products do) alternating: the faster kind sets the
 *      floor and is the kind of every later read;
 *   2. prefill tokens/s: one 512-token prompt in one forward (median of 3);
 *   3. decode tokens/s at batch 1: 128 tokens (greedy) after a 16-token prompt;
 *   4. the verify cost curve: the time of one forward of T = 1, 2, 4, 8, 16 new
 *      tokens (all wanting logits) on a row holding 512 positions, rolled back
 *      after each (median of 9 rounds that each time every T once, in rotating
 *      order).
 * floor_fraction = (weight_bytes / bandwidth) / (decode time per token).
 * A shared VM's bandwidth drifts (here 32-80 GB/s within minutes), so each
 * repetition also measures it right before and after its decode run and pairs
 * the two: floor_fraction_paired is the median over repetitions of the decode
 * run's fraction of the floor at the higher of those two bandwidths, and
 * verify_ratio_8_1_paired the median over rounds of T=8 / T=1 timed back to back.
 * floor_fraction_interleaved: the decode run again from its prompt (the row
 * trimmed back) with a read of the bandwidth buffer before every token, each
 * token paired with the bandwidth of the read just before it; the median of the
 * per-token fractions. A drift between minutes then moves both sides of each
 * pair, and (with a buffer larger than the caches) no token finds weights that
 * the one before left in cache. The run must choose the first run's tokens
 * (interleaved_tokens_equal; else an error).
 * Before measuring, the context chooses its schedule for every verify size
 * up to 8 (16 forwards each; the choice is made by time, nn/hwsel.h).
 * Also reported: the model's load time, whether its weights were copied
 * (--no-mmap) and how much of the process is in 2 MiB pages after the run
 * (AnonHugePages, FilePmdMapped of /proc/self/smaps_rollup).
 * Uses only include/tandem.h (and the CLI helpers). */
#define _GNU_SOURCE
#include "cli/cli.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

static void bf_help(void) {
    printf("usage: tandem bench forward [-m DIR] [-t N] [--quant TYPE] [--kv-type T] [--act-type T] [--no-mmap] [--json]\n"
           "Measure read bandwidth, prefill and decode speed and the verify cost curve\n"
           "(forward of T = 1, 2, 4, 8, 16 new tokens at context 512) in one process.\n"
           "The decode runs twice: once straight, once with a read of the bandwidth buffer\n"
           "before every token (floor_fraction_interleaved pairs each token with that read).\n\n"
           "  -m, --model DIR        model directory (default: the bundled target)\n"
           "  -t, --threads N        threads (default: physical cores)\n"
           "      --bw-mib N         bandwidth buffer size in MiB (default 1024)\n"
           "      --reps N           repeat every measurement N times and keep each one's best\n"
           "                         (for a machine shared with other work; default 1)\n"
           "      --quant TYPE       quantize the matmul weights at load: q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl, q2_k, q3_k, q4_k, q5_k, q6_k, iq4_xs\n"
           "      --kv-type T        KV cache storage: auto (default: bf16 under --act-type amx, and under\n"
           "                         bf16 on CPUs with AVX-512 BF16; else f32) | f32 | bf16 | f16 | q8_0\n"
           "      --act-type T       activations of bf16-weight products: f32 (default) | bf16 | amx\n"
           "                         | auto (bf16 and amx: Q8_0 weights in the R16 order; amx: bf16\n"
           "                         weights on AMX tiles; auto: amx where the CPU has the tiles,\n"
           "                         else bf16 where it has AVX-512 BF16, else f32)\n"
           CLI_MMAP_HELP
           "      --json             print one JSON object\n"
           "  -h, --help             this help\n");
}

/* ---- read bandwidth ------------------------------------------------------ */

typedef struct {
    const uint64_t *p;
    size_t n;       /* uint64 words */
    uint64_t sum;
    int touch;      /* 1 = first-touch initialise instead of summing */
    int pf;         /* 1 = prefetch BW_PF bytes ahead toward L2 while summing */
} bw_job;

/* The prefetching read's distance: 2-8 KiB read alike on a Xeon (2026-12-06),
 * 12-15% faster than the hardware prefetchers alone; the decode's products
 * prefetch as far ahead, so a read without it would understate the floor. */
#define BW_PF 4096

static void *bw_thread(void *arg) {
    bw_job *j = arg;
    if (j->touch) {
        uint64_t *w = (uint64_t *)j->p;
        for (size_t i = 0; i < j->n; i++) w[i] = i * 0x9E3779B97F4A7C15ull;
        return NULL;
    }
    const uint64_t *p = j->p;
    size_t n = j->n, i = 0;
    uint64_t s = 0;
#if defined(__AVX512F__)
    __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
    for (; i + 32 <= n; i += 32) {
        if (j->pf && i + 32 + BW_PF / 8 <= n)
            for (int l = 0; l < 4; l++) _mm_prefetch((const char *)(p + i + BW_PF / 8 + 8 * l), _MM_HINT_T1);
        a0 = _mm512_add_epi64(a0, _mm512_load_si512((const void *)(p + i)));
        a1 = _mm512_add_epi64(a1, _mm512_load_si512((const void *)(p + i + 8)));
        a2 = _mm512_add_epi64(a2, _mm512_load_si512((const void *)(p + i + 16)));
        a3 = _mm512_add_epi64(a3, _mm512_load_si512((const void *)(p + i + 24)));
    }
    s = (uint64_t)_mm512_reduce_add_epi64(_mm512_add_epi64(_mm512_add_epi64(a0, a1), _mm512_add_epi64(a2, a3)));
#elif defined(__AVX2__)
    __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
    for (; i + 16 <= n; i += 16) {
        if (j->pf && i + 16 + BW_PF / 8 <= n)
            for (int l = 0; l < 2; l++) _mm_prefetch((const char *)(p + i + BW_PF / 8 + 8 * l), _MM_HINT_T1);
        a0 = _mm256_add_epi64(a0, _mm256_load_si256((const __m256i *)(p + i)));
        a1 = _mm256_add_epi64(a1, _mm256_load_si256((const __m256i *)(p + i + 4)));
        a2 = _mm256_add_epi64(a2, _mm256_load_si256((const __m256i *)(p + i + 8)));
        a3 = _mm256_add_epi64(a3, _mm256_load_si256((const __m256i *)(p + i + 12)));
    }
    uint64_t t[4];
    _mm256_storeu_si256((__m256i *)t, _mm256_add_epi64(_mm256_add_epi64(a0, a1), _mm256_add_epi64(a2, a3)));
    s = t[0] + t[1] + t[2] + t[3];
#else
    uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    for (; i + 4 <= n; i += 4) { s0 += p[i]; s1 += p[i + 1]; s2 += p[i + 2]; s3 += p[i + 3]; }
    s = s0 + s1 + s2 + s3;
#endif
    for (; i < n; i++) s += p[i];
    j->sum = s;
    return NULL;
}

static int bw_pass(uint64_t *buf, size_t words, int nth, int touch, int pf, uint64_t *sum) {
    pthread_t th[256];
    bw_job jobs[256];
    size_t per = (words / (size_t)nth) & ~(size_t)63;
    for (int i = 0; i < nth; i++) {
        size_t a = per * (size_t)i, b = i == nth - 1 ? words : per * (size_t)(i + 1);
        jobs[i] = (bw_job){buf + a, b - a, 0, touch, pf};
    }
    for (int i = 1; i < nth; i++)
        if (pthread_create(&th[i], NULL, bw_thread, &jobs[i]) != 0) return -1;
    bw_thread(&jobs[0]);
    for (int i = 1; i < nth; i++) pthread_join(th[i], NULL);
    uint64_t s = 0;
    for (int i = 0; i < nth; i++) s += jobs[i].sum;
    if (sum) *sum = s;
    return 0;
}

/* A read buffer of `bytes` in 2 MiB pages where the kernel grants them (as the
 * weights are), first-touched by the threads that will read it; NULL on failure. */
static uint64_t *bw_open(size_t bytes, int nth) {
    uint64_t *buf = NULL;
    if (posix_memalign((void **)&buf, (size_t)2 << 20, bytes) != 0) return NULL;
    madvise(buf, bytes, MADV_HUGEPAGE); /* advice only: 4 KiB pages if refused */
    if (bw_pass(buf, bytes / 8, nth, 1, 0, NULL) != 0) { free(buf); return NULL; }
    return buf;
}

/* Best GB/s of `reps` read passes over the buffer (pf: the prefetching read), or < 0 on failure. */
static double measure_bandwidth(const uint64_t *buf, size_t bytes, int nth, int reps, int pf) {
    double best = 0;
    volatile uint64_t sink = 0;
    for (int r = 0; r < reps; r++) {
        uint64_t s;
        double t0 = cli_now();
        if (bw_pass((uint64_t *)buf, bytes / 8, nth, 0, pf, &s) != 0) return -1;
        double dt = cli_now() - t0;
        sink += s;
        double gbs = (double)bytes / dt / 1e9;
        if (gbs > best) best = gbs;
    }
    (void)sink;
    return best;
}

/* ---- forward timings ----------------------------------------------------- */

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}
static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static uint64_t lcg(uint64_t *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return *s >> 33;
}

/* One forward of n tokens on `row`; want = all positions (want_all) or the last. */
static int fwd(td_ctx *c, int row, const int32_t *toks, int n, int want_all, float *logits, td_err *err) {
    uint8_t want[512];
    for (int i = 0; i < n; i++) want[i] = want_all || i == n - 1;
    td_batch b = {.n_rows = 1, .rows = &row, .n_tokens = &n, .tokens = toks, .want = want};
    return td_ctx_forward(c, &b, logits, NULL, err);
}

/* The 1-minute load average (other processes share the cores: a high value marks a noisy run). */
static double loadavg(void) {
    double l = -1;
    FILE *f = fopen("/proc/loadavg", "r");
    if (f) { if (fscanf(f, "%lf", &l) != 1) l = -1; fclose(f); }
    return l;
}

/* A "Key:   N kB" field of /proc/self/smaps_rollup in MiB; -1 when unreadable. */
static double smaps_mib(const char *key) {
    FILE *f = fopen("/proc/self/smaps_rollup", "r");
    if (!f) return -1;
    char line[256];
    double v = -1;
    size_t kl = strlen(key);
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, key, kl) && line[kl] == ':') { v = strtod(line + kl + 1, NULL) / 1024.0; break; }
    fclose(f);
    return v;
}

static int32_t argmax(const float *v, int n) {
    int32_t best = 0;
    for (int i = 1; i < n; i++)
        if (v[i] > v[best]) best = i;
    return best;
}

int cmd_bench_forward(int argc, char **argv);
int cmd_bench_forward(int argc, char **argv) {
    const char *model_dir = NULL;
    long threads = 0, bw_mib = 1024, reps = 1;
    int json = 0, quant = -1, kv_type = CLI_KV_AUTO, act_type = td_ctx_default_params().act_type;
    td_model_params mp = td_model_default_params();
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { bf_help(); return 0; }
        else if (!strcmp(a, "-m") || !strcmp(a, "--model")) { if (!cli_need_arg(i, argc, a)) return 2; model_dir = argv[++i]; }
        else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) { if (!cli_need_arg(i, argc, a) || !cli_parse_int(argv[++i], a, 1, 256, &threads)) return 2; }
        else if (!strcmp(a, "--bw-mib")) { if (!cli_need_arg(i, argc, a) || !cli_parse_int(argv[++i], a, 16, 1 << 20, &bw_mib)) return 2; }
        else if (!strcmp(a, "--reps")) { if (!cli_need_arg(i, argc, a) || !cli_parse_int(argv[++i], a, 1, 100, &reps)) return 2; }
        else if (!strcmp(a, "--json")) json = 1;
        else if (!strcmp(a, "--no-mmap")) mp.use_mmap = 0;
        else if (!strcmp(a, "--mmap")) mp.use_mmap = 1;
        else if (!strcmp(a, "--kv-type")) { if (!cli_need_arg(i, argc, a) || !cli_parse_kv_type(argv[++i], a, &kv_type)) return 2; }
        else if (!strcmp(a, "--act-type")) { if (!cli_need_arg(i, argc, a) || !cli_parse_act_type(argv[++i], a, &act_type)) return 2; }
        else if (!strcmp(a, "--quant")) {
            if (!cli_need_arg(i, argc, a)) return 2;
            const char *q = argv[++i];
            quant = td_dtype_parse(q);
            if (quant < TD_DTYPE_Q8_0) {
                fprintf(stderr, "tandem bench forward: --quant: '%s' is not q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl, q2_k, q3_k, q4_k, q5_k, q6_k or iq4_xs\n", q);
                return 2;
            }
        }
        else { fprintf(stderr, "tandem bench forward: unknown option '%s' (see --help)\n", a); return 2; }
    }
    if (!model_dir) model_dir = cli_default_model_dir();
    if (threads <= 0) threads = td_ctx_default_threads() > 256 ? 256 : td_ctx_default_threads();
    td_err err = {0};
    td_model *m = NULL;
    /* a quantized model's matrices live in anonymous memory anyway: copying the
     * file's weights first would only cost time, unless asked for */
    if (quant >= 0 && mp.use_mmap < 0) mp.use_mmap = 1;
    double tl0 = cli_now();
    if (td_model_open_params(&m, model_dir, &mp, &err) != 0) return cli_die(model_dir, &err);
    if (quant >= 0 && td_model_quantize_weights(m, quant, &err) != 0) { td_model_free(m); return cli_die(model_dir, &err); }
    double load_s = cli_now() - tl0;
    td_model_info info;
    td_model_get_info(m, &info);

    enum { CTX = 512, PREFILL = 512, DEC_PROMPT = 16, DEC_N = 128, MAXT = 16 };
    static const int TS[] = {1, 2, 4, 8, 16};
    enum { NT = sizeof TS / sizeof TS[0], VREPS = 9 };
    td_ctx *c = NULL;
    float *logits = NULL;
    int32_t *toks = NULL;
    uint64_t *bwbuf = NULL;
    double *pair_ff = NULL, *pair_bw = NULL, *pair_vr = NULL, *il_ff = NULL;
    volatile uint64_t il_sink = 0;
    int il_same = 1; /* the interleaved decode (the row trimmed back to its prompt) chose the same tokens */
    int rc = 1, row = -1;
    td_ctx_params cp = td_ctx_default_params();
    cp.max_rows = 1;
    cp.max_ctx = CTX + DEC_N + MAXT + 8 > PREFILL ? CTX + DEC_N + MAXT + 8 : PREFILL;
    cp.max_tokens = PREFILL;
    cp.max_logits = MAXT;
    cp.n_threads = (int)threads;
    kv_type = cli_kv_type(kv_type, act_type);
    cp.kv_type = kv_type;
    cp.act_type = act_type;
    if (td_ctx_open(&c, m, &cp, &err) != 0) { cli_die("context", &err); goto out; }
    logits = malloc(sizeof(float) * (size_t)info.n_vocab * MAXT);
    toks = malloc(sizeof(int32_t) * (PREFILL + DEC_N + MAXT));
    pair_ff = malloc(sizeof(double) * (size_t)reps);
    pair_bw = malloc(sizeof(double) * (size_t)reps);
    pair_vr = malloc(sizeof(double) * (size_t)reps * VREPS);
    il_ff = malloc(sizeof(double) * (size_t)reps * DEC_N);
    if (!logits || !toks || !pair_ff || !pair_bw || !pair_vr || !il_ff) { fprintf(stderr, "tandem bench forward: out of memory\n"); goto out; }
    uint64_t seed = 12345;
    for (int i = 0; i < PREFILL + DEC_N + MAXT; i++) toks[i] = (int32_t)(lcg(&seed) % (uint64_t)info.n_vocab);

    /* 1. bandwidth (before the model's pages are hot: it does not matter, the buffer is 1 GiB) */
    double load0 = loadavg();
    size_t bw_bytes = (size_t)bw_mib << 20;
    bwbuf = bw_open(bw_bytes, (int)threads);
    /* the plain read and the prefetching one, alternated five times; the faster
       (its best pass) is the floor's bandwidth, and every later read is of its kind */
    double bw_plain = 0, bw_pref = 0;
    for (int r = 0; bwbuf && r < 5 && bw_plain >= 0 && bw_pref >= 0; r++) {
        double a = measure_bandwidth(bwbuf, bw_bytes, (int)threads, 1, 0), b = measure_bandwidth(bwbuf, bw_bytes, (int)threads, 1, 1);
        bw_plain = a < 0 ? -1 : a > bw_plain ? a : bw_plain;
        bw_pref = b < 0 ? -1 : b > bw_pref ? b : bw_pref;
    }
    int bw_pf = bw_pref > bw_plain;
    double bw = bw_pf ? bw_pref : bw_plain;
    if (!bwbuf || bw_plain <= 0 || bw_pref <= 0) { fprintf(stderr, "tandem bench forward: bandwidth measurement failed\n"); goto out; }

    if (td_ctx_row_add(c, &row) != 0) { fprintf(stderr, "tandem bench forward: no row\n"); goto out; }
    /* warm-up: touch every weight page once */
    if (fwd(c, row, toks, 8, 0, logits, &err) != 0) { cli_die("forward", &err); goto out; }
    td_ctx_row_trim(c, row, 0);
    /* and let the context choose its schedule for each verify size up to 8
     * (nn/hwsel.h: it tries each of up to 4 schedules 3 times first), as a
     * process that has been serving for a while has, so no measured forward
     * is a trial */
    for (int r = 0; r < 16; r++)
        for (int ti = 0; ti < NT && TS[ti] <= 8; ti++) {
            td_ctx_row_trim(c, row, 0);
            if (fwd(c, row, toks, TS[ti], 1, logits, &err) != 0) { cli_die("forward", &err); goto out; }
        }
    td_ctx_row_trim(c, row, 0);

    /* each metric keeps its best repetition; *_min are single-forward minima, the
     * least disturbed by other processes sharing the cores */
    double prefill_s = 1e30, decode_s = 1e30, decode_med_ms = 1e30, decode_min_ms = 1e30, prefill_min_s = 1e30;
    double verify_ms[NT], verify_min_ms[NT];
    for (int i = 0; i < NT; i++) verify_ms[i] = verify_min_ms[i] = 1e30;
    for (long rep = 0; rep < reps; rep++) {
        /* 2. prefill: 512 tokens in one forward, median of 3 */
        double pre[3];
        for (int r = 0; r < 3; r++) {
            td_ctx_row_trim(c, row, 0);
            double t0 = cli_now();
            if (fwd(c, row, toks, PREFILL, 0, logits, &err) != 0) { cli_die("forward", &err); goto out; }
            pre[r] = cli_now() - t0;
            if (pre[r] < prefill_min_s) prefill_min_s = pre[r];
        }
        double prefill_s1 = median(pre, 3);

        /* 4. verify curve at context 512 (the row holds the 512-token prefill):
         * VREPS rounds, each timing every T once, the round's first T rotating, so
         * T = 1 and T = 8 (TS[0], TS[3]) are timed moments apart and their ratio is paired */
        double verify_ms1[NT], v[NT][VREPS];
        for (int r = 0; r < VREPS; r++) {
            for (int q = 0; q < NT; q++) {
                int ti = (q + r) % NT;
                td_ctx_row_trim(c, row, CTX);
                double t0 = cli_now();
                if (fwd(c, row, toks + PREFILL, TS[ti], 1, logits, &err) != 0) { cli_die("forward", &err); goto out; }
                v[ti][r] = cli_now() - t0;
                if (v[ti][r] * 1e3 < verify_min_ms[ti]) verify_min_ms[ti] = v[ti][r] * 1e3;
            }
            pair_vr[rep * VREPS + r] = v[3][r] / v[0][r];
        }
        for (int ti = 0; ti < NT; ti++) verify_ms1[ti] = median(v[ti], VREPS) * 1e3;

        /* 3. decode at batch 1: a short prompt, then 128 greedy tokens, between two
         * bandwidth measurements (the machine's bandwidth drifts: this rep's floor
         * uses the higher of the two, the less favourable to the fraction) */
        td_ctx_row_trim(c, row, 0);
        if (fwd(c, row, toks, DEC_PROMPT, 0, logits, &err) != 0) { cli_die("forward", &err); goto out; }
        int32_t t = argmax(logits, info.n_vocab), t_first = t;
        double per[DEC_N];
        int32_t dec_toks[DEC_N];
        double bw_before = measure_bandwidth(bwbuf, bw_bytes, (int)threads, 3, bw_pf);
        double t0 = cli_now();
        for (int i = 0; i < DEC_N; i++) {
            double t1 = cli_now();
            if (fwd(c, row, &t, 1, 0, logits, &err) != 0) { cli_die("forward", &err); goto out; }
            per[i] = cli_now() - t1;
            if (per[i] * 1e3 < decode_min_ms) decode_min_ms = per[i] * 1e3;
            t = dec_toks[i] = argmax(logits, info.n_vocab);
        }
        double decode_s1 = cli_now() - t0;
        double bw_after = measure_bandwidth(bwbuf, bw_bytes, (int)threads, 3, bw_pf);
        pair_bw[rep] = bw_before > bw_after ? bw_before : bw_after;
        pair_ff[rep] = pair_bw[rep] > 0 ? (double)info.weight_bytes / (pair_bw[rep] * 1e9) / (decode_s1 / DEC_N) : 0;
        double decode_med_ms1 = median(per, DEC_N) * 1e3;

        /* 5. the same decode with a read of the whole bandwidth buffer before
         * every token: each token's time against the floor at the bandwidth
         * measured moments before it, so a drift of the machine's bandwidth
         * between minutes moves both sides of each pair; the median of the DEC_N
         * fractions. The read (1 GiB by default) also evicts the caches, so no
         * token finds weights left by the one before. */
        td_ctx_row_trim(c, row, DEC_PROMPT);
        t = t_first;
        for (int i = 0; i < DEC_N; i++) {
            uint64_t s;
            double t1 = cli_now();
            if (bw_pass(bwbuf, bw_bytes / 8, (int)threads, 0, bw_pf, &s) != 0) { fprintf(stderr, "tandem bench forward: read failed\n"); goto out; }
            double tr = cli_now() - t1;
            il_sink += s;
            t1 = cli_now();
            if (fwd(c, row, &t, 1, 0, logits, &err) != 0) { cli_die("forward", &err); goto out; }
            double td = cli_now() - t1;
            t = argmax(logits, info.n_vocab);
            if (t != dec_toks[i]) il_same = 0;
            il_ff[rep * DEC_N + i] = ((double)info.weight_bytes / ((double)bw_bytes / tr)) / td;
        }
        if (prefill_s1 < prefill_s) prefill_s = prefill_s1;
        if (decode_s1 < decode_s) decode_s = decode_s1;
        if (decode_med_ms1 < decode_med_ms) decode_med_ms = decode_med_ms1;
        for (int i = 0; i < NT; i++)
            if (verify_ms1[i] < verify_ms[i]) verify_ms[i] = verify_ms1[i];
    }
    double load = loadavg();
    double anon_huge = smaps_mib("AnonHugePages"), file_pmd = smaps_mib("FilePmdMapped");
    double prefill_tps = PREFILL / prefill_s;
    double decode_tps = DEC_N / decode_s;
    double floor_s = (double)info.weight_bytes / (bw * 1e9);
    double floor_fraction = floor_s / (decode_s / DEC_N);
    double ff_reps[100], bw_reps[100];
    memcpy(ff_reps, pair_ff, sizeof(double) * (size_t)reps);
    memcpy(bw_reps, pair_bw, sizeof(double) * (size_t)reps);
    double ff_paired = median(pair_ff, (int)reps), vr_paired = median(pair_vr, (int)reps * VREPS);
    double ff_il = median(il_ff, (int)reps * DEC_N);
    (void)il_sink;
    if (!il_same) {
        fprintf(stderr, "tandem bench forward: the decode repeated from the same prompt chose other tokens (a trimmed row must decode as before)\n");
        goto out;
    }
    if (json) {
        printf("{\"model\": \"%s\", \"dtype\": \"%s\", \"kv_type\": \"%s\", \"act_type\": \"%s\", \"threads\": %ld, \"reps\": %ld, \"weight_bytes\": %zu, \"n_params\": %zu, "
               "\"bandwidth_gbs\": %.3f, \"bandwidth_read\": \"%s\", \"bandwidth_plain_gbs\": %.3f, \"bandwidth_prefetch_gbs\": %.3f, "
               "\"floor_ms\": %.4f, \"prefill_tokens\": %d, \"prefill_tps\": %.2f, "
               "\"decode_tokens\": %d, \"decode_tps\": %.2f, \"decode_ms\": %.4f, \"decode_median_ms\": %.4f, \"floor_fraction\": %.4f, "
               "\"loadavg_before\": %.2f, \"loadavg_after\": %.2f, \"load_s\": %.3f, \"weights_copied\": %d, "
               "\"anon_huge_mib\": %.1f, \"file_pmd_mib\": %.1f, "
               "\"verify_ctx\": %d, \"verify_ms\": {",
               model_dir, td_dtype_name(info.dtype), td_kv_type_name(kv_type), td_act_type_name(act_type), threads, reps, info.weight_bytes, info.n_params, bw, bw_pf ? "prefetch" : "plain", bw_plain, bw_pref, floor_s * 1e3, PREFILL, prefill_tps,
               DEC_N, decode_tps, decode_s / DEC_N * 1e3, decode_med_ms, floor_fraction, load0, load, load_s, info.copied,
               anon_huge, file_pmd, CTX);
        for (int i = 0; i < NT; i++) printf("%s\"%d\": %.4f", i ? ", " : "", TS[i], verify_ms[i]);
        printf("}, \"verify_ratio_8_1\": %.4f, \"prefill_best_tps\": %.2f, \"decode_best_ms\": %.4f, "
               "\"floor_fraction_best\": %.4f, \"verify_best_ms\": {", verify_ms[3] / verify_ms[0], PREFILL / prefill_min_s,
               decode_min_ms, floor_s * 1e3 / decode_min_ms);
        for (int i = 0; i < NT; i++) printf("%s\"%d\": %.4f", i ? ", " : "", TS[i], verify_min_ms[i]);
        printf("}, \"floor_fraction_paired\": %.4f, \"verify_ratio_8_1_paired\": %.4f, \"paired_bandwidth_gbs\": [", ff_paired, vr_paired);
        for (long i = 0; i < reps; i++) printf("%s%.3f", i ? ", " : "", bw_reps[i]);
        printf("], \"paired_floor_fraction\": [");
        for (long i = 0; i < reps; i++) printf("%s%.4f", i ? ", " : "", ff_reps[i]);
        printf("], \"floor_fraction_interleaved\": %.4f, \"interleaved_tokens_equal\": %s}\n", ff_il, il_same ? "true" : "false");
    } else {
        printf("model %s: %.1f M params, %.1f MB of weights, %ld threads, KV cache %s, activations %s\n", model_dir,
               info.n_params / 1e6, info.weight_bytes / 1e6, threads, td_kv_type_name(kv_type), td_act_type_name(act_type));
        printf("read bandwidth   %8.2f GB/s  (floor %.3f ms/token = %.1f tok/s; the %s read: plain %.2f, prefetching %.2f GB/s)\n",
               bw, floor_s * 1e3, 1.0 / floor_s, bw_pf ? "prefetching" : "plain", bw_plain, bw_pref);
        printf("prefill          %8.1f tok/s (%d tokens in %.3f s)\n", prefill_tps, PREFILL, prefill_s);
        printf("decode (batch 1) %8.1f tok/s (%.3f ms/token, median %.3f ms, %.1f%% of the floor)\n", decode_tps,
               decode_s / DEC_N * 1e3, decode_med_ms, 100 * floor_fraction);
        printf("verify at context %d:", CTX);
        for (int i = 0; i < NT; i++) printf("  T=%d %.3f ms", TS[i], verify_ms[i]);
        printf("\n                      T=8 / T=1 = %.2fx\n", verify_ms[3] / verify_ms[0]);
        printf("best single forwards: prefill %.1f tok/s, decode %.3f ms (%.1f%% of the floor), verify", PREFILL / prefill_min_s,
               decode_min_ms, 100 * floor_s * 1e3 / decode_min_ms);
        for (int i = 0; i < NT; i++) printf("  T=%d %.3f", TS[i], verify_min_ms[i]);
        printf(" ms\n");
        printf("paired with the bandwidth measured around each decode run: %.1f%% of the floor (median of %ld);"
               " T=8 / T=1 timed back to back: %.2fx (median of %ld pairs)\n", 100 * ff_paired, reps, vr_paired, reps * VREPS);
        printf("interleaved with a read of the bandwidth buffer before every token: %.1f%% of the floor (median of %ld tokens;"
               " %s tokens as the first decode)\n", 100 * ff_il, reps * DEC_N, il_same ? "the same" : "NOT the same");
        printf("model loaded in %.3f s (%s); in 2 MiB pages: %.1f MiB anonymous, %.1f MiB of mapped files\n", load_s,
               info.copied ? "weights copied" : "weights mapped", anon_huge, file_pmd);
        printf("load average %.2f before, %.2f after (other processes on these cores make the numbers noisy)\n", load0, load);
    }
    rc = 0;
out:
    free(bwbuf);
    free(pair_ff);
    free(pair_bw);
    free(pair_vr);
    free(il_ff);
    free(logits);
    free(toks);
    td_ctx_free(c);
    td_model_free(m);
    return rc;
}
