/* sample — counter-based RNG and the token sampler. Semantics and order of the
 * pipeline are documented in sampler.h; everything here is a pure function of
 * (logits, history, params, pos): the sampler struct is scratch only. */
#include "sampler.h"
#include "util/util.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- defaults and parameter checks --------------------------------------- */

td_sampling td_sampling_default(void) {
    td_sampling p;
    memset(&p, 0, sizeof p);
    p.temperature = 0.0f; /* greedy; every filter off: callers opt in */
    p.top_k = 0;
    p.top_p = 1.0f;
    p.min_p = 0.0f;
    p.repeat_penalty = 1.0f;
    p.presence_penalty = 0.0f;
    p.frequency_penalty = 0.0f;
    p.penalty_last_n = 64;
    p.seed = 0;
    return p;
}

int td_sampling_check(const td_sampling *p, td_err *err) {
    if (!p) return td_seterr(err, TD_EINVAL, "sampling: NULL parameters");
    if (isnan(p->temperature)) return td_seterr(err, TD_EINVAL, "sampling: temperature is NaN");
    if (p->top_k < 0) return td_seterr(err, TD_EINVAL, "sampling: top_k %d < 0", p->top_k);
    if (!(p->top_p > 0.0f && p->top_p <= 1.0f))
        return td_seterr(err, TD_EINVAL, "sampling: top_p %g outside (0,1]", (double)p->top_p);
    if (!(p->min_p >= 0.0f && p->min_p <= 1.0f))
        return td_seterr(err, TD_EINVAL, "sampling: min_p %g outside [0,1]", (double)p->min_p);
    if (!(p->repeat_penalty > 0.0f) || isinf(p->repeat_penalty))
        return td_seterr(err, TD_EINVAL, "sampling: repeat_penalty %g must be finite and > 0",
                         (double)p->repeat_penalty);
    if (!isfinite(p->presence_penalty))
        return td_seterr(err, TD_EINVAL, "sampling: presence_penalty is not finite");
    if (!isfinite(p->frequency_penalty))
        return td_seterr(err, TD_EINVAL, "sampling: frequency_penalty is not finite");
    if (p->penalty_last_n < 0)
        return td_seterr(err, TD_EINVAL, "sampling: penalty_last_n %d < 0", p->penalty_last_n);
    return TD_OK;
}

/* ---- RNG ------------------------------------------------------------------ */

/* SplitMix64 / Stafford "mix13" finalizer: a bijection on 64 bits with full avalanche. */
static inline uint64_t mix64(uint64_t x) {
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebULL;
    x ^= x >> 31;
    return x;
}

/* Key the stream by the mixed seed, take the SplitMix64 output at counter pos,
 * then one more keyed round so different seeds are not shifts of one stream.
 * For a fixed seed the map pos -> 64-bit output is a bijection. */
double td_rng_uniform(uint64_t seed, uint64_t pos) {
    uint64_t k = mix64(seed ^ 0x243F6A8885A308D3ULL);
    uint64_t x = mix64(pos * 0x9E3779B97F4A7C15ULL + k);
    x = mix64(x ^ ((k << 32) | (k >> 32)));
    return (double)(x >> 11) * 0x1.0p-53;
}

/* ---- sampler scratch ----------------------------------------------------- */

/* w is in [0,1], so its float bits are <= 0x3F800000 and bits>>16 <= 0x3F80. */
#define NBUCKET 0x3F81

struct td_sampler {
    int n;
    float *z;          /* penalized logits (NaN -> -inf) */
    float *w;          /* unnormalized weights in [0,1] */
    int32_t *cnt;      /* per-token count in the penalty window; all zero between calls */
    int32_t *touched;  /* distinct tokens of the window */
    int32_t *cand;     /* members of one histogram bucket, in rank order */
    int32_t *cand2;    /* radix-sort temp */
    int32_t *keep;     /* kept tokens, id ascending */
    uint32_t *hcnt;    /* [NBUCKET] */
    double *hmass;     /* [NBUCKET] */
    int cand_bucket;   /* bucket currently in cand (-1: none) */
    int cand_n;
};

int td_sampler_open(td_sampler **out, int n_vocab) {
    if (!out) return TD_EINVAL;
    *out = NULL;
    if (n_vocab <= 0) return TD_EINVAL;
    td_sampler *s = calloc(1, sizeof *s);
    if (!s) return TD_ENOMEM;
    size_t n = (size_t)n_vocab;
    s->n = n_vocab;
    s->z = malloc(n * sizeof *s->z);
    s->w = malloc(n * sizeof *s->w);
    s->cnt = calloc(n, sizeof *s->cnt);
    s->touched = malloc(n * sizeof *s->touched);
    s->cand = malloc(n * sizeof *s->cand);
    s->cand2 = malloc(n * sizeof *s->cand2);
    s->keep = malloc(n * sizeof *s->keep);
    s->hcnt = malloc(NBUCKET * sizeof *s->hcnt);
    s->hmass = malloc(NBUCKET * sizeof *s->hmass);
    if (!s->z || !s->w || !s->cnt || !s->touched || !s->cand || !s->cand2 || !s->keep ||
        !s->hcnt || !s->hmass) {
        td_sampler_free(s);
        return TD_ENOMEM;
    }
    *out = s;
    return TD_OK;
}

void td_sampler_free(td_sampler *s) {
    if (!s) return;
    free(s->z);
    free(s->w);
    free(s->cnt);
    free(s->touched);
    free(s->cand);
    free(s->cand2);
    free(s->keep);
    free(s->hcnt);
    free(s->hmass);
    free(s);
}

static inline uint32_t fbits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

/* ---- 8-lane float helpers (GCC/Clang vector extensions) ----------------- */
typedef float v8f __attribute__((vector_size(32)));
typedef int32_t v8i __attribute__((vector_size(32)));

static inline v8f v8_splat(float a) { return (v8f){a, a, a, a, a, a, a, a}; }
static inline v8f v8_load(const float *p) { v8f v; memcpy(&v, p, sizeof v); return v; }
static inline void v8_store(float *p, v8f v) { memcpy(p, &v, sizeof v); }
static inline v8f v8_sel(v8i m, v8f a, v8f b) { /* m ? a : b, lane-wise */
    return (v8f)(((v8i)a & m) | ((v8i)b & ~m));
}

/* exp(x) for x <= 0, in float: Cody-Waite range reduction and the Cephes expf
 * polynomial (about 1-2 ulp). Exactly 1 at x == 0, never above 1, 0 for
 * x <= -86 and for NaN (so results are normal floats, never subnormal). */
static inline v8f v8_exp_neg(v8f x) {
    const v8i live = x > v8_splat(-86.0f);
    x = v8_sel(live, x, v8_splat(-86.0f));
    const v8f magic = v8_splat(12582912.0f); /* 1.5 * 2^23: round to nearest integer */
    v8f n = (x * v8_splat(1.44269504088896341f) + magic) - magic;
    v8f r = (x - n * v8_splat(0.693359375f)) - n * v8_splat(-2.12194440e-4f);
    v8f q = v8_splat(1.9875691500e-4f);
    q = q * r + v8_splat(1.3981999507e-3f);
    q = q * r + v8_splat(8.3334519073e-3f);
    q = q * r + v8_splat(4.1665795894e-2f);
    q = q * r + v8_splat(1.6666665459e-1f);
    q = q * r + v8_splat(5.0000001201e-1f);
    v8f y = (q * r * r + r) + v8_splat(1.0f);
    v8i e = (__builtin_convertvector(n, v8i) + 127) << 23;
    y = y * (v8f)e;
    y = v8_sel(y > v8_splat(1.0f), v8_splat(1.0f), y);
    return (v8f)((v8i)y & live);
}

float td_sampler_expf(float x) {
    v8f v = v8_splat(x);
    return v8_exp_neg(v)[0];
}

/* w[i] = exp((z[i] - zmax) / T) over n entries, 8 lanes at a time; the tail goes
 * through the same vector code so every token is computed identically. */
static void weights(float *w, const float *z, int n, float zmax, float T) {
    const v8f vm = v8_splat(zmax), vt = v8_splat(T);
    int i = 0;
    for (; i + 8 <= n; i += 8) v8_store(w + i, v8_exp_neg((v8_load(z + i) - vm) / vt));
    if (i < n) {
        float buf[8] = {0};
        memcpy(buf, z + i, (size_t)(n - i) * sizeof *buf);
        v8_store(buf, v8_exp_neg((v8_load(buf) - vm) / vt));
        memcpy(w + i, buf, (size_t)(n - i) * sizeof *buf);
    }
}

/* z = logits with NaN -> -inf (vectorised copy); returns the max of z. */
static float copy_max(float *z, const float *lg, int n) {
    const v8f ninf = v8_splat(-INFINITY);
    v8f m = ninf;
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        v8f v = v8_load(lg + i);
        v = v8_sel(v == v, v, ninf);
        v8_store(z + i, v);
        m = v8_sel(v > m, v, m);
    }
    float mx = -INFINITY;
    for (int j = 0; j < 8; j++) mx = m[j] > mx ? m[j] : mx;
    for (; i < n; i++) {
        float v = isnan(lg[i]) ? -INFINITY : lg[i];
        z[i] = v;
        mx = v > mx ? v : mx;
    }
    return mx;
}

static inline int v8_any(v8i m) {
    return (m[0] | m[1] | m[2] | m[3] | m[4] | m[5] | m[6] | m[7]) != 0;
}

/* number of w[i] >= t */
static int count_ge(const float *w, int n, float t) {
    const v8f vt = v8_splat(t);
    v8i acc = {0};
    int i = 0;
    for (; i + 8 <= n; i += 8) acc -= v8_load(w + i) >= vt;
    int c = 0;
    for (int j = 0; j < 8; j++) c += acc[j];
    for (; i < n; i++) c += w[i] >= t;
    return c;
}

static float max_of(const float *z, int n) {
    v8f m = v8_splat(-INFINITY);
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        v8f v = v8_load(z + i);
        m = v8_sel(v > m, v, m);
    }
    float mx = -INFINITY;
    for (int j = 0; j < 8; j++) mx = m[j] > mx ? m[j] : mx;
    for (; i < n; i++) mx = z[i] > mx ? z[i] : mx;
    return mx;
}

/* z = logits with NaN -> -inf, then penalties over the history window.
 * *zmax gets the max of z. */
static int prepare(td_sampler *s, const td_sampling *p, const float *logits,
                   const int32_t *history, int n_history, float *zmax) {
    const int n = s->n;
    float *z = s->z;
    if (n_history < 0 || (n_history > 0 && !history)) return TD_EINVAL;
    int start = 0;
    if (p->penalty_last_n > 0 && p->penalty_last_n < n_history) start = n_history - p->penalty_last_n;
    for (int i = start; i < n_history; i++)
        if (history[i] < 0 || history[i] >= n) return TD_EINVAL;

    *zmax = copy_max(z, logits, n);

    const float rp = p->repeat_penalty, pp = p->presence_penalty, fp = p->frequency_penalty;
    if (n_history == 0 || (rp == 1.0f && pp == 0.0f && fp == 0.0f)) return TD_OK;

    int32_t *cnt = s->cnt, *touched = s->touched;
    int nt = 0;
    for (int i = start; i < n_history; i++) {
        int32_t t = history[i];
        if (cnt[t]++ == 0) touched[nt++] = t;
    }
    for (int j = 0; j < nt; j++) {
        int32_t t = touched[j];
        float v = z[t];
        if (rp != 1.0f) v = v > 0.0f ? v / rp : v * rp;
        v = v - ((float)cnt[t] * fp + pp);
        z[t] = v;
        cnt[t] = 0; /* clear only what was touched */
    }
    if (nt) *zmax = max_of(z, n);
    return TD_OK;
}

/* Collect the members of bucket b (id ascending) into cand and order them by w
 * descending with a stable LSD radix sort on the low 16 bits: ties stay by id. */
static int collect_bucket(td_sampler *s, int b) {
    if (s->cand_bucket == b) return s->cand_n;
    const float *w = s->w;
    int32_t *a = s->cand, *t = s->cand2;
    int m = 0;
    const int32_t lo = (int32_t)((uint32_t)b << 16), hi = lo + 0x10000;
    const v8i vlo = {lo, lo, lo, lo, lo, lo, lo, lo}, vhi = {hi, hi, hi, hi, hi, hi, hi, hi};
    int i = 0;
    for (; i + 8 <= s->n; i += 8) { /* w bits are < 2^31: signed lane compares are fine */
        v8i bits = (v8i)v8_load(w + i);
        if (!v8_any((bits >= vlo) & (bits < vhi))) continue;
        for (int j = i; j < i + 8; j++)
            if ((int)(fbits(w[j]) >> 16) == b) a[m++] = j;
    }
    for (; i < s->n; i++)
        if ((int)(fbits(w[i]) >> 16) == b) a[m++] = i;
    if (m > 1) {
        for (int shift = 0; shift < 16; shift += 8) {
            uint32_t c[257];
            memset(c, 0, sizeof c);
            for (int j = 0; j < m; j++) {
                uint32_t key = (0xFFFFu - (fbits(w[a[j]]) & 0xFFFFu)) >> shift & 0xFFu;
                c[key + 1]++;
            }
            for (int d = 0; d < 256; d++) c[d + 1] += c[d];
            for (int j = 0; j < m; j++) {
                uint32_t key = (0xFFFFu - (fbits(w[a[j]]) & 0xFFFFu)) >> shift & 0xFFu;
                t[c[key]++] = a[j];
            }
            int32_t *x = a; a = t; t = x;
        }
        /* two passes: the result is back in s->cand */
    }
    s->cand_bucket = b;
    s->cand_n = m;
    return m;
}

/* Mass (double) of the first L tokens in rank order. */
static double prefix_mass(td_sampler *s, int L) {
    double cum = 0.0;
    int cc = 0;
    for (int b = NBUCKET - 1; b >= 0; b--) {
        uint32_t hc = s->hcnt[b];
        if (!hc) continue;
        if ((long)cc + hc >= L) {
            int m = collect_bucket(s, b);
            for (int j = 0; j < L - cc && j < m; j++) cum += s->w[s->cand[j]];
            return cum;
        }
        cc += (int)hc;
        cum += s->hmass[b];
    }
    return cum;
}

/* Length of the shortest rank-order prefix whose mass is >= target (n if none). */
static int prefix_len_for_mass(td_sampler *s, double target) {
    double cum = 0.0;
    int cc = 0;
    for (int b = NBUCKET - 1; b >= 0; b--) {
        uint32_t hc = s->hcnt[b];
        if (!hc) continue;
        if (cum + s->hmass[b] >= target) {
            int m = collect_bucket(s, b);
            for (int j = 0; j < m; j++) {
                cum += s->w[s->cand[j]];
                cc++;
                if (cum >= target) return cc;
            }
            continue; /* rounding: the ordered sum fell short; go on */
        }
        cc += (int)hc;
        cum += s->hmass[b];
    }
    return s->n;
}

/* The token at rank L-1 (0-based): its weight bits and id. */
static void rank_element(td_sampler *s, int L, uint32_t *kb, int32_t *kid) {
    int cc = 0;
    for (int b = NBUCKET - 1; b >= 0; b--) {
        uint32_t hc = s->hcnt[b];
        if (!hc) continue;
        if ((long)cc + hc >= L) {
            collect_bucket(s, b);
            int32_t id = s->cand[L - cc - 1];
            *kb = fbits(s->w[id]);
            *kid = id;
            return;
        }
        cc += (int)hc;
    }
    TD_ASSERT(0 && "rank beyond vocabulary");
}

static int32_t sample_core(td_sampler *s, const td_sampling *p, const float *logits,
                           const int32_t *history, int n_history, uint64_t pos, float *probs) {
    if (!s || !p || !logits) return TD_EINVAL;
    if (td_sampling_check(p, NULL) != TD_OK) return TD_EINVAL;
    float zmax;
    int rc = prepare(s, p, logits, history, n_history, &zmax);
    if (rc != TD_OK) return rc;

    const int n = s->n;
    const float *z = s->z;
    float *w = s->w;

    if (zmax == -INFINITY) return TD_EINVAL; /* all -inf / NaN */
    int32_t am = 0;
    while (!(z[am] == zmax)) am++; /* the lowest id holding the max */

    if (!(p->temperature > 0.0f)) {
        if (probs) {
            memset(probs, 0, (size_t)n * sizeof *probs);
            probs[am] = 1.0f;
        }
        return am;
    }

    /* weights */
    const float T = p->temperature;
    if (isinf(zmax)) {
        for (int i = 0; i < n; i++) w[i] = z[i] == INFINITY ? 1.0f : 0.0f;
    } else {
        weights(w, z, n, zmax, T);
    }

    /* histogram over the high 16 bits of w, and the min-p count */
    uint32_t *hcnt = s->hcnt;
    double *hmass = s->hmass;
    memset(hcnt, 0, NBUCKET * sizeof *hcnt);
    memset(hmass, 0, NBUCKET * sizeof *hmass);
    s->cand_bucket = -1;
    const float minp = p->min_p; /* wmax == 1 */
    for (int i = 0; i < n; i++) {
        float v = w[i];
        uint32_t b = fbits(v) >> 16;
        hcnt[b]++;
        hmass[b] += v;
    }
    const int n_minp = minp > 0.0f ? count_ge(w, n, minp) : n;

    int Lk = (p->top_k > 0 && p->top_k < n) ? p->top_k : n;
    int L = Lk < n_minp ? Lk : n_minp;
    if (p->top_p < 1.0f) {
        double M = 0.0;
        if (Lk < n) {
            M = prefix_mass(s, Lk);
        } else {
            for (int b = NBUCKET - 1; b >= 0; b--) M += hmass[b];
        }
        int Lp = prefix_len_for_mass(s, (double)p->top_p * M);
        if (Lp < L) L = Lp;
    }
    if (L < 1) L = 1;

    /* kept set = first L in rank order; gather it in id order with its total */
    int32_t *keep = s->keep;
    int nk = 0;
    double tot = 0.0;
    if (L >= n) {
        for (int i = 0; i < n; i++) {
            keep[nk++] = i;
            tot += w[i];
        }
    } else {
        uint32_t kb = UINT32_MAX;
        int32_t kid = -1;
        rank_element(s, L, &kb, &kid);
        const int32_t k32 = (int32_t)kb; /* kb <= 0x3F800000 */
        const v8i vk = {k32, k32, k32, k32, k32, k32, k32, k32};
        int i = 0;
        for (;; i += 8) {
            int end = i + 8 <= n ? i + 8 : n;
            if (i + 8 <= n && !v8_any((v8i)v8_load(w + i) >= vk)) continue;
            for (int j = i; j < end; j++) {
                uint32_t b = fbits(w[j]);
                if (b > kb || (b == kb && j <= kid)) {
                    keep[nk++] = j;
                    tot += w[j];
                }
            }
            if (end == n) break;
        }
    }
    TD_ASSERT(nk == L && tot > 0.0);

    /* draw: walk kept tokens in id order */
    const double thr = td_rng_uniform(p->seed, pos) * tot;
    double c = 0.0;
    int32_t tok = -1, last = -1;
    for (int j = 0; j < nk; j++) {
        float v = w[keep[j]];
        if (v > 0.0f) {
            c += v;
            last = keep[j];
            if (c > thr) { tok = last; break; }
        }
    }
    if (tok < 0) tok = last; /* u*tot rounded up to tot */

    if (probs) {
        memset(probs, 0, (size_t)n * sizeof *probs);
        for (int j = 0; j < nk; j++) probs[keep[j]] = (float)(w[keep[j]] / tot);
    }
    return tok;
}

int32_t td_sampler_sample(td_sampler *s, const td_sampling *p, const float *logits,
                          const int32_t *history, int n_history, uint64_t pos) {
    return sample_core(s, p, logits, history, n_history, pos, NULL);
}

int32_t td_sampler_sample_probs(td_sampler *s, const td_sampling *p, const float *logits,
                                const int32_t *history, int n_history, uint64_t pos,
                                float *probs) {
    if (!probs) return TD_EINVAL;
    return sample_core(s, p, logits, history, n_history, pos, probs);
}

int32_t td_draw_weights(const float *w, int n, double u) {
    if (!w || n <= 0) return TD_EINVAL;
    double tot = 0.0;
    for (int i = 0; i < n; i++)
        if (w[i] > 0.0f) tot += w[i];
    if (!(tot > 0.0) || isinf(tot)) return TD_EINVAL;
    const double thr = u * tot;
    double c = 0.0;
    int32_t last = -1;
    for (int i = 0; i < n; i++) {
        if (w[i] > 0.0f) {
            c += w[i];
            last = i;
            if (c > thr) return i;
        }
    }
    return last;
}
