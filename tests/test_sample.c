/* test_sample — the sampler and the counter-based RNG (src/sample). */
#include "t.h"
#include "tandem.h"
#include "sample/sampler.h"
#include "util/util.h"

#include <math.h>
#include <stdint.h>

/* ---- helpers -------------------------------------------------------------- */

static uint64_t trng_state = 12345;
static uint64_t trng(void) { /* test-only SplitMix64 stream, independent of the library */
    uint64_t z = (trng_state += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}
static double tunif(void) { return (double)(trng() >> 11) * 0x1.0p-53; }
static double tgauss(void) {
    double u1 = tunif(), u2 = tunif();
    if (u1 < 1e-300) u1 = 1e-300;
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

/* chi-square critical values at p = 0.001, index = degrees of freedom */
static const double chi2_crit[] = {0, 10.83, 13.82, 16.27, 18.47, 20.52, 22.46, 24.32, 26.12,
                                   27.88, 29.59, 31.26, 32.91, 34.53, 36.12, 37.70, 39.25,
                                   40.79, 42.31, 43.82, 45.31};

/* chi-square of counts against expected probabilities (cells with p > 0);
 * *df gets cells-1; returns the statistic, or INFINITY if a p == 0 cell was hit. */
static double chi2(const long *counts, const double *p, int n, long total, int *df) {
    double x = 0.0;
    int cells = 0;
    for (int i = 0; i < n; i++) {
        if (p[i] <= 0.0) {
            if (counts[i]) return INFINITY;
            continue;
        }
        double e = p[i] * (double)total;
        x += ((double)counts[i] - e) * ((double)counts[i] - e) / e;
        cells++;
    }
    *df = cells - 1;
    return x;
}

static td_sampling plain(float T) {
    td_sampling p = td_sampling_default();
    p.temperature = T;
    p.top_k = 0;
    p.top_p = 1.0f;
    p.min_p = 0.0f;
    p.repeat_penalty = 1.0f;
    p.presence_penalty = 0.0f;
    p.frequency_penalty = 0.0f;
    p.penalty_last_n = 0;
    p.seed = 42;
    return p;
}

static int count_nonzero(const float *p, int n) {
    int c = 0;
    for (int i = 0; i < n; i++) c += p[i] != 0.0f;
    return c;
}

static double sum_f(const float *p, int n) {
    double s = 0.0;
    for (int i = 0; i < n; i++) s += p[i];
    return s;
}

/* ---- cases ---------------------------------------------------------------- */

static void test_greedy(void) {
    t_begin("sample_greedy_argmax_ties_lowest_id");
    enum { N = 1000 };
    td_sampler *s = NULL;
    static float lg[N], pr[N];
    T_REQUIRE(td_sampler_open(&s, N) == TD_OK && s, "open");
    for (int i = 0; i < N; i++) lg[i] = (float)tgauss();
    lg[613] = 9.0f;
    td_sampling p = plain(0.0f);
    T_CHECK(td_sampler_sample(s, &p, lg, NULL, 0, 0) == 613, "argmax");
    p.temperature = -1.0f; /* negative is greedy too */
    T_CHECK(td_sampler_sample(s, &p, lg, NULL, 0, 7) == 613, "negative temperature greedy");
    /* ties: the lowest id among equal maxima */
    lg[900] = 9.0f;
    lg[17] = 9.0f;
    lg[5] = 9.0f;
    for (uint64_t pos = 0; pos < 20; pos++) {
        p.seed = pos * 31;
        T_CHECK(td_sampler_sample(s, &p, lg, NULL, 0, pos) == 5, "tie -> lowest id (pos %d)", (int)pos);
    }
    /* a maximum in the last, partial 8-lane block */
    {
        enum { M = 1003 };
        static float lt[M];
        td_sampler *s3 = NULL;
        T_REQUIRE(td_sampler_open(&s3, M) == TD_OK, "open %d", M);
        for (int i = 0; i < M; i++) lt[i] = (float)tgauss();
        lt[1001] = 50.0f;
        td_sampling g = plain(0.0f);
        T_CHECK(td_sampler_sample(s3, &g, lt, NULL, 0, 0) == 1001, "max in the tail");
        lt[3] = 50.0f;
        T_CHECK(td_sampler_sample(s3, &g, lt, NULL, 0, 0) == 3, "tie with the tail -> lowest id");
        td_sampler_free(s3);
    }
    p.temperature = 0.0f;
    int32_t t = td_sampler_sample_probs(s, &p, lg, NULL, 0, 3, pr);
    T_CHECK(t == 5, "probs variant argmax %d", t);
    T_CHECK(pr[5] == 1.0f && count_nonzero(pr, N) == 1, "one-hot probs");
    /* -inf / NaN never win; a single finite logit wins */
    for (int i = 0; i < N; i++) lg[i] = (i % 2) ? NAN : -INFINITY;
    lg[444] = -1e30f;
    T_CHECK(td_sampler_sample(s, &p, lg, NULL, 0, 0) == 444, "only finite logit");
done:
    td_sampler_free(s);
    t_end();
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void test_rng(void) {
    t_begin("rng_pure_uniform");
    enum { N = 100000 };
    double *v = malloc(N * sizeof *v);
    T_REQUIRE(v, "alloc");
    T_CHECK(td_rng_uniform(7, 123) == td_rng_uniform(7, 123), "same (seed,pos) same u");
    T_CHECK(td_rng_uniform(7, 123) != td_rng_uniform(7, 124), "different pos differs");
    T_CHECK(td_rng_uniform(7, 123) != td_rng_uniform(8, 123), "different seed differs");
    T_CHECK(td_rng_uniform(1, 0) != td_rng_uniform(0, 1), "seed/pos not symmetric");
    /* calls in between do not matter */
    double a = td_rng_uniform(99, 5);
    for (int i = 0; i < 1000; i++) (void)td_rng_uniform((uint64_t)i, (uint64_t)i * 3);
    T_CHECK(td_rng_uniform(99, 5) == a, "pure function");

    for (int pass = 0; pass < 2; pass++) {
        /* pass 0: one seed over positions; pass 1: one position over seeds */
        double mean = 0.0, var = 0.0, lag = 0.0;
        long bins[16] = {0};
        int bad = 0;
        for (int i = 0; i < N; i++) {
            double u = pass == 0 ? td_rng_uniform(2024, (uint64_t)i) : td_rng_uniform((uint64_t)i, 77);
            if (!(u >= 0.0 && u < 1.0)) bad++;
            v[i] = u;
            mean += u;
            bins[(int)(u * 16.0) & 15]++;
        }
        mean /= N;
        for (int i = 0; i < N; i++) var += (v[i] - mean) * (v[i] - mean);
        var /= N;
        for (int i = 1; i < N; i++) lag += (v[i] - mean) * (v[i - 1] - mean);
        lag /= (N - 1) * var;
        double p16[16];
        for (int i = 0; i < 16; i++) p16[i] = 1.0 / 16.0;
        int df = 0;
        double x = chi2(bins, p16, 16, N, &df);
        printf("  rng pass %d: mean %.5f var %.5f lag1 %.5f chi2(15) %.2f\n", pass, mean, var, lag, x);
        T_CHECK(bad == 0, "%d values outside [0,1)", bad);
        T_CHECK(fabs(mean - 0.5) < 0.005, "mean %f", mean);
        T_CHECK(fabs(var - 1.0 / 12.0) < 0.002, "variance %f", var);
        T_CHECK(fabs(lag) < 0.02, "lag-1 correlation %f", lag);
        T_CHECK(df == 15 && x < chi2_crit[15], "chi-square %f >= %f", x, chi2_crit[15]);
        qsort(v, N, sizeof *v, cmp_double);
        int dup = 0;
        for (int i = 1; i < N; i++) dup += v[i] == v[i - 1];
        T_CHECK(dup == 0, "%d duplicate draws", dup);
    }
done:
    free(v);
    t_end();
}

static void test_pure(void) {
    t_begin("sample_pure_function_of_inputs");
    enum { N = 5000, P = 64 };
    td_sampler *s = NULL, *s2 = NULL;
    float *lg = malloc(N * sizeof *lg), *lg2 = malloc(N * sizeof *lg2), *keep = malloc(N * sizeof *keep);
    float *pa = malloc(N * sizeof *pa), *pb = malloc(N * sizeof *pb);
    int32_t hist[40];
    int32_t first[P];
    T_REQUIRE(lg && lg2 && keep && pa && pb, "alloc");
    T_REQUIRE(td_sampler_open(&s, N) == TD_OK && td_sampler_open(&s2, N) == TD_OK, "open");
    for (int i = 0; i < N; i++) lg[i] = (float)(2.0 * tgauss()), lg2[i] = (float)tgauss();
    for (int i = 0; i < 40; i++) hist[i] = (int32_t)(trng() % 50);
    memcpy(keep, lg, N * sizeof *lg);
    td_sampling p = td_sampling_default();
    p.temperature = 0.8f;
    p.top_k = 200;
    p.top_p = 0.9f;
    p.min_p = 0.01f;
    p.repeat_penalty = 1.3f;
    p.presence_penalty = 0.2f;
    p.frequency_penalty = 0.1f;
    p.seed = 1234;
    int distinct = 0;
    for (int i = 0; i < P; i++) {
        first[i] = td_sampler_sample(s, &p, lg, hist, 40, (uint64_t)i);
        distinct += i > 0 && first[i] != first[i - 1];
    }
    T_CHECK(distinct > 5, "draws vary with pos (%d changes)", distinct);
    int32_t t0 = td_sampler_sample_probs(s, &p, lg, hist, 40, 5, pa);
    /* noise: other seeds, positions, logits, histories, params */
    td_sampling q = p;
    q.top_k = 0;
    q.top_p = 0.5f;
    q.penalty_last_n = 3;
    for (int i = 0; i < 50; i++) {
        q.seed = (uint64_t)i;
        (void)td_sampler_sample(s, &q, lg2, hist + i % 10, 30, (uint64_t)(1000 + i));
        (void)td_sampler_sample_probs(s, &p, lg2, NULL, 0, (uint64_t)i, pb);
    }
    int32_t t1 = td_sampler_sample_probs(s, &p, lg, hist, 40, 5, pb);
    T_CHECK(t0 == t1 && t0 == first[5], "same token %d %d %d", t0, t1, first[5]);
    T_CHECK(memcmp(pa, pb, N * sizeof *pa) == 0, "identical probs");
    T_CHECK(memcmp(keep, lg, N * sizeof *lg) == 0, "logits unmodified");
    /* a fresh sampler, positions in reverse order */
    int mism = 0;
    for (int i = P - 1; i >= 0; i--) mism += td_sampler_sample(s2, &p, lg, hist, 40, (uint64_t)i) != first[i];
    T_CHECK(mism == 0, "%d mismatches replaying in reverse on another sampler", mism);
    /* a different seed changes the stream */
    q = p;
    q.seed = 4321;
    int diff = 0;
    for (int i = 0; i < P; i++) diff += td_sampler_sample(s, &q, lg, hist, 40, (uint64_t)i) != first[i];
    T_CHECK(diff > 5, "seed changes draws (%d differ)", diff);
done:
    td_sampler_free(s);
    td_sampler_free(s2);
    free(lg), free(lg2), free(keep), free(pa), free(pb);
    t_end();
}

static void test_expf(void) {
    t_begin("sampler_expf_accuracy");
    double maxrel = 0.0;
    int above1 = 0, nonmono = 0;
    float prev = td_sampler_expf(-86.0f);
    for (int k = 0; k <= 2000000; k++) {
        float x = -86.0f + 86.0f * (float)k / 2000000.0f;
        float y = td_sampler_expf(x);
        if (y > 1.0f) above1++;
        if (x > -85.9f) {
            double rel = fabs((double)y - exp((double)x)) / exp((double)x);
            if (rel > maxrel) maxrel = rel;
        }
        if (y < prev) nonmono++;
        prev = y;
    }
    printf("  max relative error %.3g, non-monotone steps %d\n", maxrel, nonmono);
    T_CHECK(maxrel < 3.6e-7, "relative error %g (> 3 ulp)", maxrel);
    T_CHECK(above1 == 0, "%d values above 1", above1);
    T_CHECK(td_sampler_expf(0.0f) == 1.0f && td_sampler_expf(-0.0f) == 1.0f, "exp(0) == 1");
    T_CHECK(td_sampler_expf(-86.0f) == 0.0f && td_sampler_expf(-1e30f) == 0.0f &&
            td_sampler_expf(-INFINITY) == 0.0f && td_sampler_expf(NAN) == 0.0f, "flush to 0");
    T_CHECK(td_sampler_expf(-85.9f) >= 1.17549435e-38f, "no subnormal results");
    t_end();
}

static void test_softmax_freq(void) {
    t_begin("sample_frequencies_match_softmax");
    enum { N = 8, DRAWS = 200000 };
    const float lg[N] = {1.0f, 0.2f, -0.5f, 2.0f, 0.0f, 1.5f, -1.0f, 0.7f};
    const float T = 0.7f;
    td_sampler *s = NULL;
    float pr[N];
    double ref[N], z = 0.0;
    long cnt[N] = {0};
    T_REQUIRE(td_sampler_open(&s, N) == TD_OK, "open");
    for (int i = 0; i < N; i++) z += ref[i] = exp((double)lg[i] / T);
    for (int i = 0; i < N; i++) ref[i] /= z;
    td_sampling p = plain(T);
    p.seed = 99;
    T_REQUIRE(td_sampler_sample_probs(s, &p, lg, NULL, 0, 0, pr) >= 0, "sample");
    for (int i = 0; i < N; i++) T_CHECK(fabs(pr[i] - ref[i]) < 1e-6, "probs[%d] %g vs softmax %g", i, pr[i], ref[i]);
    for (long i = 0; i < DRAWS; i++) {
        int32_t t = td_sampler_sample(s, &p, lg, NULL, 0, (uint64_t)i);
        T_REQUIRE(t >= 0 && t < N, "token %d", t);
        cnt[t]++;
    }
    int df = 0;
    double x = chi2(cnt, ref, N, DRAWS, &df);
    printf("  softmax T=0.7, %d draws: chi2(%d) = %.2f (crit %.2f)\n", DRAWS, df, x, chi2_crit[df]);
    T_CHECK(df == 7 && x < chi2_crit[7], "chi-square %f", x);
    /* and a distribution that differs (T=1) must be rejected: the test has power */
    double ref1[N];
    z = 0.0;
    for (int i = 0; i < N; i++) z += ref1[i] = exp((double)lg[i]);
    for (int i = 0; i < N; i++) ref1[i] /= z;
    double x1 = chi2(cnt, ref1, N, DRAWS, &df);
    T_CHECK(x1 > chi2_crit[7], "T=1 reference not rejected (%f)", x1);
done:
    td_sampler_free(s);
    t_end();
}

static void test_top_k(void) {
    t_begin("sample_top_k_keeps_exactly_k");
    enum { N = 1000, K = 37 };
    td_sampler *s = NULL;
    static float lg[N], pr[N];
    T_REQUIRE(td_sampler_open(&s, N) == TD_OK, "open");
    for (int i = 0; i < N; i++) lg[i] = (float)tgauss();
    td_sampling p = plain(1.0f);
    p.top_k = K;
    T_REQUIRE(td_sampler_sample_probs(s, &p, lg, NULL, 0, 0, pr) >= 0, "sample");
    T_CHECK(count_nonzero(pr, N) == K, "kept %d, want %d", count_nonzero(pr, N), K);
    float minkept = INFINITY, maxdrop = -INFINITY;
    for (int i = 0; i < N; i++) {
        if (pr[i] > 0) minkept = fminf(minkept, lg[i]);
        else maxdrop = fmaxf(maxdrop, lg[i]);
    }
    T_CHECK(minkept > maxdrop, "kept the largest: min kept %f, max dropped %f", minkept, maxdrop);
    T_CHECK(fabs(sum_f(pr, N) - 1.0) < 1e-5, "sum %f", sum_f(pr, N));
    int outside = 0;
    for (uint64_t pos = 0; pos < 3000; pos++) {
        int32_t t = td_sampler_sample(s, &p, lg, NULL, 0, pos);
        outside += t < 0 || pr[t] == 0.0f;
    }
    T_CHECK(outside == 0, "%d draws outside the top-k", outside);
    /* ties: all equal -> ids 0..4, each 1/5 */
    for (int i = 0; i < N; i++) lg[i] = 0.5f;
    p.top_k = 5;
    T_REQUIRE(td_sampler_sample_probs(s, &p, lg, NULL, 0, 1, pr) >= 0, "sample");
    T_CHECK(count_nonzero(pr, N) == 5, "kept %d", count_nonzero(pr, N));
    for (int i = 0; i < 5; i++) T_CHECK(fabsf(pr[i] - 0.2f) < 1e-6f, "tie token %d prob %f", i, pr[i]);
    /* k >= vocab is off */
    p.top_k = N + 5;
    T_REQUIRE(td_sampler_sample_probs(s, &p, lg, NULL, 0, 1, pr) >= 0, "sample");
    T_CHECK(count_nonzero(pr, N) == N, "k > vocab keeps all (%d)", count_nonzero(pr, N));
    p.top_k = 1;
    lg[321] = 0.6f;
    for (uint64_t pos = 0; pos < 50; pos++)
        T_CHECK(td_sampler_sample(s, &p, lg, NULL, 0, pos) == 321, "top_k=1 is argmax");
done:
    td_sampler_free(s);
    t_end();
}

/* logits = log(prob) so T=1 probabilities are the given ones */
static void set_log(float *lg, const double *pr, int n) {
    for (int i = 0; i < n; i++) lg[i] = (float)log(pr[i]);
}

static void test_top_p(void) {
    t_begin("sample_top_p_hand_example");
    td_sampler *s = NULL;
    const double P4[4] = {0.1, 0.4, 0.2, 0.3};
    float lg[4], pr[4];
    T_REQUIRE(td_sampler_open(&s, 4) == TD_OK, "open");
    set_log(lg, P4, 4);
    td_sampling p = plain(1.0f);
    /* sorted: 1 (0.4), 3 (0.3), 2 (0.2), 0 (0.1); cumulative 0.4, 0.7, 0.9, 1.0 */
    p.top_p = 0.65f; /* -> {1,3} */
    T_REQUIRE(td_sampler_sample_probs(s, &p, lg, NULL, 0, 0, pr) >= 0, "sample");
    T_CHECK(pr[0] == 0 && pr[2] == 0 && fabsf(pr[1] - 4.f / 7) < 1e-6f && fabsf(pr[3] - 3.f / 7) < 1e-6f,
            "0.65: %f %f %f %f", pr[0], pr[1], pr[2], pr[3]);
    p.top_p = 0.75f; /* -> {1,3,2} */
    T_REQUIRE(td_sampler_sample_probs(s, &p, lg, NULL, 0, 0, pr) >= 0, "sample");
    T_CHECK(pr[0] == 0 && fabsf(pr[1] - 4.f / 9) < 1e-6f && fabsf(pr[2] - 2.f / 9) < 1e-6f &&
            fabsf(pr[3] - 3.f / 9) < 1e-6f, "0.75: %f %f %f %f", pr[0], pr[1], pr[2], pr[3]);
    p.top_p = 0.35f; /* -> {1} */
    T_REQUIRE(td_sampler_sample_probs(s, &p, lg, NULL, 0, 0, pr) >= 0, "sample");
    T_CHECK(pr[1] == 1.0f && count_nonzero(pr, 4) == 1, "0.35 keeps the top one");
    p.top_p = 0.95f; /* -> all four */
    T_REQUIRE(td_sampler_sample_probs(s, &p, lg, NULL, 0, 0, pr) >= 0, "sample");
    T_CHECK(count_nonzero(pr, 4) == 4, "0.95 keeps all");
    /* top-k first, then top-p on the renormalised top-k: k=2 -> {0.4,0.3}/0.7 = {.571,.429};
     * top_p 0.5 keeps only token 1 */
    p.top_k = 2;
    p.top_p = 0.5f;
    T_REQUIRE(td_sampler_sample_probs(s, &p, lg, NULL, 0, 0, pr) >= 0, "sample");
    T_CHECK(count_nonzero(pr, 4) == 1 && pr[1] == 1.0f, "top-p over the top-k mass");
    p.top_p = 0.6f; /* 0.571 < 0.6 -> {1,3} */
    T_REQUIRE(td_sampler_sample_probs(s, &p, lg, NULL, 0, 0, pr) >= 0, "sample");
    T_CHECK(count_nonzero(pr, 4) == 2 && pr[3] > 0, "top-p 0.6 after top-k 2");
    /* mass exactly at top_p: 4 equal tokens, top_p 0.5 -> cumulative 2/4 >= 0.5 keeps 2 */
    const float eq[4] = {0.25f, 0.25f, 0.25f, 0.25f};
    p.top_k = 0;
    p.top_p = 0.5f;
    T_REQUIRE(td_sampler_sample_probs(s, &p, eq, NULL, 0, 0, pr) >= 0, "sample");
    T_CHECK(pr[0] == 0.5f && pr[1] == 0.5f && pr[2] == 0 && pr[3] == 0, "boundary mass: %f %f %f %f", pr[0],
            pr[1], pr[2], pr[3]);
    p.top_p = 0.75f; /* 3/4 */
    T_REQUIRE(td_sampler_sample_probs(s, &p, eq, NULL, 0, 0, pr) >= 0, "sample");
    T_CHECK(count_nonzero(pr, 4) == 3 && pr[3] == 0, "boundary mass 0.75 keeps 3");
    /* ties at the cut: {0.2, 0.4, 0.2, 0.2}, top_p 0.5 -> token 1, then the lowest-id tie (0) */
    const double T4[4] = {0.2, 0.4, 0.2, 0.2};
    set_log(lg, T4, 4);
    p.top_k = 0;
    p.top_p = 0.5f;
    T_REQUIRE(td_sampler_sample_probs(s, &p, lg, NULL, 0, 0, pr) >= 0, "sample");
    T_CHECK(fabsf(pr[1] - 2.f / 3) < 1e-6f && fabsf(pr[0] - 1.f / 3) < 1e-6f && pr[2] == 0 && pr[3] == 0,
            "tie at cut by id: %f %f %f %f", pr[0], pr[1], pr[2], pr[3]);
done:
    td_sampler_free(s);
    t_end();
}

static void test_min_p(void) {
    t_begin("sample_min_p");
    td_sampler *s = NULL;
    const double P4[4] = {0.15, 0.5, 0.1, 0.25};
    float lg[4], pr[4];
    T_REQUIRE(td_sampler_open(&s, 4) == TD_OK, "open");
    set_log(lg, P4, 4);
    td_sampling p = plain(1.0f);
    p.min_p = 0.25f; /* keep p >= 0.125: {1,3,0} */
    T_REQUIRE(td_sampler_sample_probs(s, &p, lg, NULL, 0, 0, pr) >= 0, "sample");
    T_CHECK(pr[2] == 0 && fabsf(pr[1] - 0.5f / 0.9f) < 1e-6f && fabsf(pr[0] - 0.15f / 0.9f) < 1e-6f,
            "0.25: %f %f %f %f", pr[0], pr[1], pr[2], pr[3]);
    p.min_p = 0.4f; /* keep p >= 0.2: {1,3} */
    T_REQUIRE(td_sampler_sample_probs(s, &p, lg, NULL, 0, 0, pr) >= 0, "sample");
    T_CHECK(count_nonzero(pr, 4) == 2 && pr[1] > 0 && pr[3] > 0, "0.4 keeps two");
    p.min_p = 1.0f;
    T_REQUIRE(td_sampler_sample_probs(s, &p, lg, NULL, 0, 0, pr) >= 0, "sample");
    T_CHECK(count_nonzero(pr, 4) == 1 && pr[1] == 1.0f, "1.0 keeps the top");
    /* the comparison is >= on the weights: exactly at the threshold is kept */
    {
        const float lb[2] = {0.0f, -0.6931472f};
        float pb[2];
        float w1 = td_sampler_expf(lb[1]); /* the weight the sampler uses; the top one is 1 */
        td_sampler *s2 = NULL;
        T_REQUIRE(td_sampler_open(&s2, 2) == TD_OK, "open 2");
        td_sampling b = plain(1.0f);
        b.min_p = w1;
        T_CHECK(td_sampler_sample_probs(s2, &b, lb, NULL, 0, 0, pb) >= 0 && pb[1] > 0.0f,
                "min_p == ratio keeps the token");
        b.min_p = nextafterf(w1, 1.0f);
        T_CHECK(td_sampler_sample_probs(s2, &b, lb, NULL, 0, 0, pb) >= 0 && pb[1] == 0.0f && pb[0] == 1.0f,
                "min_p just above the ratio drops it");
        td_sampler_free(s2);
    }
    /* min-p is relative to the temperature-scaled distribution: at T=2 the ratios are
     * square roots: p0/p1 = sqrt(0.3) = .548, p2/p1 = sqrt(0.2) = .447, p3/p1 = .707 */
    p.temperature = 2.0f;
    p.min_p = 0.5f; /* keep {1,3,0} */
    T_REQUIRE(td_sampler_sample_probs(s, &p, lg, NULL, 0, 0, pr) >= 0, "sample");
    T_CHECK(count_nonzero(pr, 4) == 3 && pr[2] == 0, "T=2 min_p 0.5");
done:
    td_sampler_free(s);
    t_end();
}

/* ---- reference truncation for the large-vocabulary comparison --------------- */
static const float *ref_w;
static int cmp_rank(const void *a, const void *b) {
    int i = *(const int *)a, j = *(const int *)b;
    if (ref_w[i] != ref_w[j]) return ref_w[i] > ref_w[j] ? -1 : 1;
    return (i > j) - (i < j);
}

static void test_reference(void) {
    t_begin("sample_truncation_matches_sorting_reference");
    enum { N = 60003 }; /* not a multiple of 8: exercises the vector tails */
    td_sampler *s = NULL;
    float *lg = malloc(N * sizeof *lg), *pr = malloc(N * sizeof *pr), *w = malloc(N * sizeof *w);
    int *ord = malloc(N * sizeof *ord), *rank = malloc(N * sizeof *rank);
    T_REQUIRE(lg && pr && w && ord && rank, "alloc");
    T_REQUIRE(td_sampler_open(&s, N) == TD_OK, "open");
    struct { float T; int k; float tp, mp, sd, q; } cfg[] = {
        {0.8f, 0, 0.95f, 0.0f, 3.0f, 0.0f},   {0.8f, 0, 0.95f, 0.0f, 1.0f, 0.0f},
        {1.0f, 0, 0.5f, 0.0f, 1.0f, 0.05f},   {1.3f, 500, 0.9f, 0.0f, 1.0f, 0.1f},
        {0.7f, 40, 0.95f, 0.05f, 2.0f, 0.0f}, {1.0f, 20000, 0.99f, 0.001f, 0.5f, 0.02f},
        {2.0f, 0, 1.0f, 0.3f, 1.0f, 0.25f},   {0.5f, 3, 1.0f, 0.0f, 0.0f, 0.0f},
        {1.0f, 0, 0.3f, 0.0f, 0.0f, 0.0f},    {1.0f, 0, 0.999f, 0.0f, 20.0f, 0.0f},
    };
    for (size_t c = 0; c < sizeof cfg / sizeof cfg[0]; c++) {
        for (int i = 0; i < N; i++) {
            float v = (float)(cfg[c].sd * tgauss());
            if (cfg[c].q > 0) v = cfg[c].q * roundf(v / cfg[c].q); /* many exact ties */
            lg[i] = v;
        }
        td_sampling p = plain(cfg[c].T);
        p.top_k = cfg[c].k;
        p.top_p = cfg[c].tp;
        p.min_p = cfg[c].mp;
        T_REQUIRE(td_sampler_sample_probs(s, &p, lg, NULL, 0, c, pr) >= 0, "sample cfg %d", (int)c);
        /* reference: same weights, full sort */
        float zmax = -INFINITY;
        for (int i = 0; i < N; i++) zmax = fmaxf(zmax, lg[i]);
        for (int i = 0; i < N; i++) {
            w[i] = td_sampler_expf((lg[i] - zmax) / cfg[c].T);
            ord[i] = i;
        }
        ref_w = w;
        qsort(ord, N, sizeof *ord, cmp_rank);
        for (int r = 0; r < N; r++) rank[ord[r]] = r;
        int Lk = (p.top_k > 0 && p.top_k < N) ? p.top_k : N, L = Lk;
        double M = 0.0;
        for (int r = 0; r < Lk; r++) M += w[ord[r]];
        if (p.top_p < 1.0f) {
            double cum = 0.0;
            for (int r = 0; r < Lk; r++) {
                cum += w[ord[r]];
                if (cum >= (double)p.top_p * M) { L = r + 1; break; }
            }
        }
        int Lm = 0;
        for (int i = 0; i < N; i++) Lm += w[i] >= p.min_p;
        if (Lm < L) L = Lm;
        double tot = 0.0;
        for (int r = 0; r < L; r++) tot += w[ord[r]];
        int wrong = 0, nk = 0;
        double maxerr = 0.0;
        for (int i = 0; i < N; i++) {
            int kept = rank[i] < L && w[i] > 0.0f;
            nk += kept;
            if (kept != (pr[i] > 0.0f)) wrong++;
            double e = fabs(pr[i] - (kept ? w[i] / tot : 0.0));
            if (e > maxerr) maxerr = e;
        }
        printf("  cfg %d: T=%.1f k=%d top_p=%.3f min_p=%.3f -> kept %d\n", (int)c, (double)cfg[c].T,
               cfg[c].k, (double)cfg[c].tp, (double)cfg[c].mp, nk);
        T_CHECK(wrong == 0, "cfg %d: %d tokens differ from the reference", (int)c, wrong);
        T_CHECK(maxerr < 1e-7, "cfg %d: prob error %g", (int)c, maxerr);
        T_CHECK(fabs(sum_f(pr, N) - 1.0) < 1e-4, "cfg %d: sum %f", (int)c, sum_f(pr, N));
    }
done:
    td_sampler_free(s);
    free(lg), free(pr), free(w), free(ord), free(rank);
    t_end();
}

static void test_penalties(void) {
    t_begin("sample_penalties_change_the_right_logits");
    enum { N = 6 };
    const float lg[N] = {2.0f, -2.0f, 1.0f, 0.5f, 3.0f, -1.0f};
    const int32_t hist[] = {4, 1, 0, 1, 0, 3, 0}; /* counts: 0:3 1:2 3:1 4:1 */
    td_sampler *s = NULL;
    float pr[N], keep[N];
    memcpy(keep, lg, sizeof keep);
    T_REQUIRE(td_sampler_open(&s, N) == TD_OK, "open");
    struct { float rp, pp, fp; int last_n; float want[N]; } cs[] = {
        /* repeat 2: positive /2, negative *2, once per distinct token; 2 and 5 untouched */
        {2.0f, 0.0f, 0.0f, 0, {1.0f, -4.0f, 1.0f, 0.25f, 1.5f, -1.0f}},
        /* presence 0.5: once per distinct token present */
        {1.0f, 0.5f, 0.0f, 0, {1.5f, -2.5f, 1.0f, 0.0f, 2.5f, -1.0f}},
        /* frequency 0.25 x count */
        {1.0f, 0.0f, 0.25f, 0, {1.25f, -2.5f, 1.0f, 0.25f, 2.75f, -1.0f}},
        /* all three */
        {2.0f, 0.5f, 0.25f, 0, {-0.25f, -5.0f, 1.0f, -0.5f, 0.75f, -1.0f}},
        /* window = the last 3 tokens {0,3,0}: 0 twice, 3 once; 1 and 4 untouched */
        {1.0f, 0.0f, 0.5f, 3, {1.0f, -2.0f, 1.0f, 0.0f, 3.0f, -1.0f}},
    };
    for (size_t c = 0; c < sizeof cs / sizeof cs[0]; c++) {
        td_sampling p = plain(1.0f);
        p.repeat_penalty = cs[c].rp;
        p.presence_penalty = cs[c].pp;
        p.frequency_penalty = cs[c].fp;
        p.penalty_last_n = cs[c].last_n;
        T_REQUIRE(td_sampler_sample_probs(s, &p, lg, hist, 7, 0, pr) >= 0, "sample");
        double z = 0.0;
        for (int i = 0; i < N; i++) z += exp((double)cs[c].want[i]);
        for (int i = 0; i < N; i++) {
            double want = exp((double)cs[c].want[i]) / z;
            T_CHECK(fabs(pr[i] - want) < 1e-6, "case %d token %d prob %g want %g", (int)c, i, pr[i], want);
        }
    }
    T_CHECK(memcmp(keep, lg, sizeof keep) == 0, "logits unmodified");
    /* greedy sees the penalties too: presence 2.5 pushes 4 to 0.5 and 0 to -0.5,
     * so the untouched token 2 (1.0) wins */
    td_sampling g = plain(0.0f);
    T_CHECK(td_sampler_sample(s, &g, lg, hist, 7, 0) == 4, "no penalty argmax");
    g.presence_penalty = 2.5f;
    T_CHECK(td_sampler_sample(s, &g, lg, hist, 7, 0) == 2, "presence moves argmax");
    /* counters are cleared between calls: repeating the call gives the same result */
    T_CHECK(td_sampler_sample(s, &g, lg, hist, 7, 0) == 2, "repeat call");
    g.presence_penalty = 0.0f;
    T_CHECK(td_sampler_sample(s, &g, lg, hist, 7, 0) == 4, "no stale counts");
done:
    td_sampler_free(s);
    t_end();
}

static void test_probs_match_draws(void) {
    t_begin("sample_probs_is_the_draw_distribution");
    enum { N = 20, DRAWS = 100000 };
    td_sampler *s = NULL;
    float lg[N], pr[N], pr2[N];
    long cnt[N] = {0};
    double pd[N];
    const int32_t hist[] = {3, 3, 7, 11, 0};
    T_REQUIRE(td_sampler_open(&s, N) == TD_OK, "open");
    for (int i = 0; i < N; i++) lg[i] = (float)(1.5 * tgauss());
    lg[3] = 4.0f;
    lg[7] = 3.0f;
    td_sampling p = plain(0.9f);
    p.top_k = 12;
    p.top_p = 0.97f;
    p.min_p = 0.01f;
    p.repeat_penalty = 1.2f;
    p.frequency_penalty = 0.3f;
    p.seed = 777;
    int32_t t = td_sampler_sample_probs(s, &p, lg, hist, 5, 0, pr);
    T_REQUIRE(t >= 0, "sample");
    int nk = count_nonzero(pr, N);
    printf("  kept %d of %d\n", nk, N);
    T_CHECK(nk >= 3 && nk < N, "truncation active (%d kept)", nk);
    T_CHECK(fabs(sum_f(pr, N) - 1.0) < 1e-6, "sum %.9f", sum_f(pr, N));
    for (int i = 0; i < N; i++) pd[i] = pr[i];
    int mism = 0, zero_hit = 0, order_bad = 0, order_checked = 0;
    for (long i = 0; i < DRAWS; i++) {
        int32_t a = td_sampler_sample(s, &p, lg, hist, 5, (uint64_t)i);
        int32_t b = td_sampler_sample_probs(s, &p, lg, hist, 5, (uint64_t)i, pr2);
        T_REQUIRE(a >= 0 && a < N, "token");
        mism += a != b;
        zero_hit += pr[a] == 0.0f;
        cnt[a]++;
        /* the draw walks kept tokens in id order: token = first whose cumulative > u */
        if (i < 5000) {
            double u = td_rng_uniform(p.seed, (uint64_t)i), c = 0.0;
            int exp_t = -1, near = 0;
            for (int j = 0; j < N; j++) {
                c += pd[j];
                if (fabs(c - u) < 1e-6) near = 1;
                if (exp_t < 0 && c > u) exp_t = j;
            }
            if (!near) {
                order_checked++;
                order_bad += exp_t != a;
            }
        }
    }
    T_CHECK(mism == 0, "%d sample/sample_probs mismatches", mism);
    T_CHECK(zero_hit == 0, "%d draws of zero-probability tokens", zero_hit);
    T_CHECK(order_bad == 0 && order_checked > 4900, "%d of %d draws not the id-order inverse CDF", order_bad,
            order_checked);
    int df = 0;
    double x = chi2(cnt, pd, N, DRAWS, &df);
    printf("  draws vs probs: chi2(%d) = %.2f (crit %.2f)\n", df, x, df > 0 && df <= 20 ? chi2_crit[df] : 0);
    T_CHECK(df >= 2 && df <= 20 && x < chi2_crit[df], "chi-square %f df %d", x, df);
done:
    td_sampler_free(s);
    t_end();
}

static void test_nonfinite(void) {
    t_begin("sample_nan_inf_logits");
    enum { N = 6 };
    td_sampler *s = NULL;
    float lg[N] = {NAN, 1.0f, NAN, 0.0f, -INFINITY, NAN}, pr[N];
    T_REQUIRE(td_sampler_open(&s, N) == TD_OK, "open");
    td_sampling p = plain(1.0f);
    T_REQUIRE(td_sampler_sample_probs(s, &p, lg, NULL, 0, 0, pr) >= 0, "sample");
    double e = exp(1.0);
    T_CHECK(pr[0] == 0 && pr[2] == 0 && pr[4] == 0 && pr[5] == 0, "NaN/-inf get zero probability");
    T_CHECK(fabs(pr[1] - e / (e + 1)) < 1e-6, "finite ones renormalised %f", pr[1]);
    int bad = 0;
    for (uint64_t pos = 0; pos < 2000; pos++) {
        int32_t t = td_sampler_sample(s, &p, lg, NULL, 0, pos);
        bad += t != 1 && t != 3;
    }
    T_CHECK(bad == 0, "%d draws of NaN/-inf tokens", bad);
    /* +inf tokens share the mass */
    float li[N] = {0.0f, INFINITY, 5.0f, INFINITY, NAN, -1.0f};
    T_REQUIRE(td_sampler_sample_probs(s, &p, li, NULL, 0, 0, pr) >= 0, "sample inf");
    T_CHECK(pr[1] == 0.5f && pr[3] == 0.5f && count_nonzero(pr, N) == 2, "+inf tokens split the mass");
    float ln[N] = {NAN, NAN, -INFINITY, NAN, -INFINITY, NAN};
    T_CHECK(td_sampler_sample(s, &p, ln, NULL, 0, 0) == TD_EINVAL, "all NaN/-inf -> EINVAL");
    p.temperature = 0.0f;
    T_CHECK(td_sampler_sample_probs(s, &p, ln, NULL, 0, 0, pr) == TD_EINVAL, "greedy all NaN/-inf -> EINVAL");
done:
    td_sampler_free(s);
    t_end();
}

static void test_bad_input(void) {
    t_begin("sample_bad_input");
    enum { N = 10 };
    td_sampler *s = (td_sampler *)1;
    float lg[N] = {0}, pr[N];
    int32_t h[2] = {1, 2}, hbad[2] = {1, N};
    T_CHECK(td_sampler_open(&s, 0) == TD_EINVAL && s == NULL, "n_vocab 0");
    s = (td_sampler *)1;
    T_CHECK(td_sampler_open(&s, -5) == TD_EINVAL && s == NULL, "n_vocab < 0");
    T_CHECK(td_sampler_open(NULL, 10) == TD_EINVAL, "NULL out");
    td_sampler_free(NULL);
    T_REQUIRE(td_sampler_open(&s, N) == TD_OK, "open");
    td_sampling p = plain(1.0f), q;
    T_CHECK(td_sampler_sample(NULL, &p, lg, NULL, 0, 0) == TD_EINVAL, "NULL sampler");
    T_CHECK(td_sampler_sample(s, NULL, lg, NULL, 0, 0) == TD_EINVAL, "NULL params");
    T_CHECK(td_sampler_sample(s, &p, NULL, NULL, 0, 0) == TD_EINVAL, "NULL logits");
    T_CHECK(td_sampler_sample_probs(s, &p, lg, NULL, 0, 0, NULL) == TD_EINVAL, "NULL probs");
    T_CHECK(td_sampler_sample(s, &p, lg, NULL, 2, 0) == TD_EINVAL, "NULL history with n > 0");
    T_CHECK(td_sampler_sample(s, &p, lg, h, -1, 0) == TD_EINVAL, "n_history < 0");
    T_CHECK(td_sampler_sample(s, &p, lg, hbad, 2, 0) == TD_EINVAL, "history token out of range");
    q = p; q.top_k = -1;
    T_CHECK(td_sampler_sample(s, &q, lg, NULL, 0, 0) == TD_EINVAL, "top_k < 0");
    q = p; q.top_p = 0.0f;
    T_CHECK(td_sampler_sample(s, &q, lg, NULL, 0, 0) == TD_EINVAL, "top_p 0");
    q = p; q.top_p = 1.5f;
    T_CHECK(td_sampler_sample(s, &q, lg, NULL, 0, 0) == TD_EINVAL, "top_p > 1");
    q = p; q.top_p = NAN;
    T_CHECK(td_sampler_sample(s, &q, lg, NULL, 0, 0) == TD_EINVAL, "top_p NaN");
    q = p; q.min_p = -0.1f;
    T_CHECK(td_sampler_sample(s, &q, lg, NULL, 0, 0) == TD_EINVAL, "min_p < 0");
    q = p; q.temperature = NAN;
    T_CHECK(td_sampler_sample(s, &q, lg, NULL, 0, 0) == TD_EINVAL, "temperature NaN");
    q = p; q.repeat_penalty = 0.0f;
    T_CHECK(td_sampler_sample(s, &q, lg, h, 2, 0) == TD_EINVAL, "repeat_penalty 0");
    q = p; q.penalty_last_n = -1;
    T_CHECK(td_sampler_sample(s, &q, lg, h, 2, 0) == TD_EINVAL, "penalty_last_n < 0");
    q = p; q.presence_penalty = INFINITY;
    T_CHECK(td_sampler_sample(s, &q, lg, h, 2, 0) == TD_EINVAL, "presence inf");
    td_err err = {0};
    T_CHECK(td_sampling_check(&q, &err) == TD_EINVAL && err.code == TD_EINVAL && err.msg[0], "check message");
    q = td_sampling_default();
    T_CHECK(td_sampling_check(&q, NULL) == TD_OK, "defaults valid");
    /* an out-of-window history token is not looked at */
    q = p; q.penalty_last_n = 1; q.repeat_penalty = 1.5f;
    int32_t hwin[2] = {N + 3, 2};
    T_CHECK(td_sampler_sample(s, &q, lg, hwin, 2, 0) >= 0, "outside the window ignored");
    /* after errors the sampler still works and gives the same answer */
    int32_t a = td_sampler_sample_probs(s, &p, lg, h, 2, 9, pr);
    T_CHECK(a >= 0 && a < N && fabs(sum_f(pr, N) - 1.0) < 1e-6, "works after errors");
    /* td_draw_weights */
    float w[4] = {0.0f, 1.0f, -3.0f, 1.0f};
    T_CHECK(td_draw_weights(w, 4, 0.0) == 1 && td_draw_weights(w, 4, 0.49) == 1 &&
            td_draw_weights(w, 4, 0.51) == 3 && td_draw_weights(w, 4, 0.999999) == 3, "draw_weights");
    float wz[2] = {0.0f, -1.0f};
    T_CHECK(td_draw_weights(wz, 2, 0.5) == TD_EINVAL && td_draw_weights(NULL, 2, 0.5) == TD_EINVAL,
            "draw_weights bad input");
done:
    td_sampler_free(s);
    t_end();
}

static void test_speed(void) {
    t_begin("sample_speed_vocab_150k"); /* timing printed, not asserted */
    enum { N = 151936, REPS = 200 };
    td_sampler *s = NULL;
    float *lg = malloc(N * sizeof *lg), *pr = malloc(N * sizeof *pr);
    int32_t hist[64];
    T_REQUIRE(lg && pr && td_sampler_open(&s, N) == TD_OK, "setup");
    for (int i = 0; i < 64; i++) hist[i] = (int32_t)(trng() % N);
    struct { const char *name; float sd, T, tp, mp; int k; } cfg[] = {
        {"T=0.8 top_p=0.95, logits N(0,3)", 3.0f, 0.8f, 0.95f, 0.0f, 0},
        {"T=0.8 top_p=0.95, flat logits N(0,1)", 1.0f, 0.8f, 0.95f, 0.0f, 0},
        {"llama.cpp-like (k=40 p=0.95 min_p=0.05), N(0,3)", 3.0f, 0.8f, 0.95f, 0.05f, 40},
        {"T=0.8 no truncation, N(0,3)", 3.0f, 0.8f, 1.0f, 0.0f, 0},
        {"greedy", 3.0f, 0.0f, 1.0f, 0.0f, 0},
    };
    for (size_t c = 0; c < sizeof cfg / sizeof cfg[0]; c++) {
        for (int i = 0; i < N; i++) lg[i] = (float)(cfg[c].sd * tgauss());
        td_sampling p = plain(cfg[c].T);
        p.top_p = cfg[c].tp;
        p.min_p = cfg[c].mp;
        p.top_k = cfg[c].k;
        p.repeat_penalty = 1.1f;
        p.penalty_last_n = 64;
        long sink = 0;
        double t0 = td_now();
        for (int r = 0; r < REPS; r++) sink += td_sampler_sample(s, &p, lg, hist, 64, (uint64_t)r);
        double t1 = td_now();
        for (int r = 0; r < REPS / 4; r++) sink += td_sampler_sample_probs(s, &p, lg, hist, 64, (uint64_t)r, pr);
        double t2 = td_now();
        printf("  vocab %d, %-44s %7.1f us/sample, %7.1f us/sample_probs, kept %d (%ld)\n", N, cfg[c].name,
               (t1 - t0) / REPS * 1e6, (t2 - t1) / (REPS / 4) * 1e6, count_nonzero(pr, N), sink % 10);
        T_CHECK(sink >= 0, "samples succeeded");
    }
done:
    td_sampler_free(s);
    free(lg), free(pr);
    t_end();
}

int main(void) {
    test_greedy();
    test_rng();
    test_pure();
    test_expf();
    test_softmax_freq();
    test_top_k();
    test_top_p();
    test_min_p();
    test_reference();
    test_penalties();
    test_probs_match_draws();
    test_nonfinite();
    test_bad_input();
    test_speed();
    return t_exit();
}
