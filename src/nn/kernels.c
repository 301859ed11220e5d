/* kernels — see kernels.h for the invariance rule and the D16 dot order.
 *
 * Three paths, the same bits: AVX-512 (16 lanes = one zmm register), AVX2
 * (kernels_avx2.c: two ymm registers) and portable C (16 lanes emulated with
 * fmaf). Every path-specific function has a portable twin that performs the
 * same IEEE operations in the same order; tests/test_kernels.c checks them
 * against each other with memcmp. The AVX2 path hooks into each entry point
 * with one AVX2_DO line.
 *
 * KV dtypes: td_attend_kv reads K and V rows stored as f32, bf16 or f16 and
 * widens each element exactly where it is loaded (the weights' ldw / wval), so
 * a stored dtype changes only what is loaded, never the order of operations.
 * td_from_f32 is the cache write's rounding (bf16: integer RNE on every path;
 * f16: F16C on the AVX paths, a bit-identical software twin in util.c).
 *
 * P24 (td_matmul_bf16p): the B32 order over a packed copy of a bf16 matrix
 * (td_bf16p_pack), AVX-512 BF16 only; the rows outside whole panels, and every
 * other path, go to the plain matrix's tiles. test_kernels compares its bits
 * with td_matmul_bf16a's. */
#define _GNU_SOURCE
#include "kernels.h"
#include "kernels_avx2.h"
#include "kernels_neon.h"
#include "quant.h"
#include "tandem.h"
#include "util/util.h"

#include <float.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#include <immintrin.h>
#define TD_HAVE_AVX512 1
#include "nn/exp512.h"
#endif

#define AI static inline __attribute__((always_inline))

/* ---- path selection ------------------------------------------------------ */

static _Atomic int g_path = -1;

static int best_path(void) {
    if (td_kernels_supported(TD_KPATH_NEON)) return TD_KPATH_NEON;
    if (td_kernels_supported(TD_KPATH_AVX512)) return TD_KPATH_AVX512;
    if (td_kernels_supported(TD_KPATH_AVX2)) return TD_KPATH_AVX2;
    return TD_KPATH_PORTABLE;
}

static int resolve_path(void) {
    int p = atomic_load_explicit(&g_path, memory_order_relaxed);
    if (p >= 0) return p;
    const char *e = getenv("TD_KERNELS");
    p = !e || !*e                  ? best_path()
        : !strcmp(e, "avx512")     ? TD_KPATH_AVX512
        : !strcmp(e, "avx2")       ? TD_KPATH_AVX2
        : !strcmp(e, "neon")       ? TD_KPATH_NEON
                                   : TD_KPATH_PORTABLE;
    if (!td_kernels_supported(p)) p = TD_KPATH_PORTABLE;
    atomic_store_explicit(&g_path, p, memory_order_relaxed);
    return p;
}

int td_kernels_supported(int path) {
    switch (path) {
    case TD_KPATH_PORTABLE: return 1;
#ifdef TD_HAVE_AVX512
    case TD_KPATH_AVX512:
        __builtin_cpu_init();
        return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512vl");
#endif
#ifdef TD_HAVE_AVX2_PATH
    case TD_KPATH_AVX2: return td_avx2_cpu_ok();
#endif
#ifdef TD_HAVE_NEON_PATH
    case TD_KPATH_NEON: return 1; /* Advanced SIMD is part of every AArch64 CPU */
#endif
    default: return 0;
    }
}

int td_kernels_set_path(int path) {
    if (!td_kernels_supported(path)) path = TD_KPATH_PORTABLE;
    atomic_store(&g_path, path);
    return path;
}
int td_kernels_path(void) { return resolve_path(); }
const char *td_kernels_path_name(void) {
    int p = resolve_path();
    return p == TD_KPATH_AVX512 ? "avx512" : p == TD_KPATH_AVX2 ? "avx2" : p == TD_KPATH_NEON ? "neon" : "portable";
}

/* The AVX2 hook of an entry point: AVX2_DO(stmt) runs stmt when that path is in force. */
#ifdef TD_HAVE_AVX2_PATH
#define AVX2_DO(stmt) do { if (resolve_path() == TD_KPATH_AVX2) { stmt; } } while (0)
#else
#define AVX2_DO(stmt) ((void)0)
#endif
/* and the NEON hook: NEON_DO(stmt) runs stmt when that path is in force */
#ifdef TD_HAVE_NEON_PATH
#define NEON_DO(stmt) do { if (resolve_path() == TD_KPATH_NEON) { stmt; } } while (0)
#else
#define NEON_DO(stmt) ((void)0)
#endif

/* ---- portable path: the reference implementation of every order ---------- */

/* Element i of a row of dtype dt, as f32: exact for f32, bf16 and f16; for a
 * Q8_0 row (the KV cache's q8_0: GGUF blocks of an f16 scale d and 32 int8 q)
 * the dequantized (float)q * d, one rounding — what td_dequantize_row gives. */
AI float wval(const void *w, size_t i, int dt) {
    if (dt == TD_DTYPE_Q8_0) {
        const uint8_t *b = (const uint8_t *)w + i / 32 * 34;
        return (float)(int8_t)b[2 + i % 32] * td_f16_to_f32((uint16_t)(b[0] | b[1] << 8));
    }
    return dt == TD_DTYPE_F32    ? ((const float *)w)[i]
           : dt == TD_DTYPE_BF16 ? td_bf16_to_f32(((const uint16_t *)w)[i])
                                 : td_f16_to_f32(((const uint16_t *)w)[i]);
}

/* Bytes before element k of a K/V row of dtype dt (k a multiple of 32 for Q8_0,
 * whose rows are self-locating blocks: a pointer to element k is a row of its own). */
AI size_t eoff(int dt, size_t k) {
    return dt == TD_DTYPE_F32 ? 4 * k : dt == TD_DTYPE_Q8_0 ? k / 32 * 34 : 2 * k;
}

static float fold16_p(const float *v) {
    float s8[8], s4[4], s2[2];
    for (int i = 0; i < 8; i++) s8[i] = v[i] + v[i + 8];
    for (int i = 0; i < 4; i++) s4[i] = s8[i] + s8[i + 4];
    for (int i = 0; i < 2; i++) s2[i] = s4[i] + s4[i + 2];
    return s2[0] + s2[1];
}

/* D16 dot of a (f32) with w (dtype dt). */
static float dot_p(const float *a, const void *w, int dt, int n) {
    float acc[16] = {0};
    int k = 0;
    for (; k + 16 <= n; k += 16)
        for (int l = 0; l < 16; l++) acc[l] = fmaf(a[k + l], wval(w, (size_t)k + l, dt), acc[l]);
    if (k < n)
        for (int l = 0; l < 16; l++) {
            float x = k + l < n ? a[k + l] : 0.0f, y = k + l < n ? wval(w, (size_t)k + l, dt) : 0.0f;
            acc[l] = fmaf(x, y, acc[l]);
        }
    return fold16_p(acc);
}

/* D16 sum (adds instead of fmas, zero-padded tail). */
static float sum_p(const float *a, int n) {
    float acc[16] = {0};
    int k = 0;
    for (; k + 16 <= n; k += 16)
        for (int l = 0; l < 16; l++) acc[l] = acc[l] + a[k + l];
    if (k < n)
        for (int l = 0; l < 16; l++) acc[l] = acc[l] + (k + l < n ? a[k + l] : 0.0f);
    return fold16_p(acc);
}

static float exp_p(float x) {
    x = x > EXP_LO ? x : EXP_LO;
    x = x < EXP_HI ? x : EXP_HI;
    float t = x * EXP_LOG2E;
    float n = rintf(t);
    float r = fmaf(-n, EXP_C1, x);
    r = fmaf(-n, EXP_C2, r);
    float p = EXP_P0;
    p = fmaf(p, r, EXP_P1);
    p = fmaf(p, r, EXP_P2);
    p = fmaf(p, r, EXP_P3);
    p = fmaf(p, r, EXP_P4);
    p = fmaf(p, r, EXP_P5);
    float z = r * r;
    p = fmaf(p, z, r);
    p = p + 1.0f;
    return ldexpf(p, (int)n);
}

static void matmul_p(float *y, int ldy, const float *x, int ldx, int M, const void *W, int dt,
                     int K, int n0, int n1, int add) {
    size_t esz = dt == TD_DTYPE_F32 ? 4 : 2;
    for (int m = 0; m < M; m++)
        for (int n = n0; n < n1; n++) {
            float s = dot_p(x + (size_t)m * ldx, (const char *)W + (size_t)n * K * esz, dt, K);
            float *yp = y + (size_t)m * ldy + n;
            *yp = add ? *yp + s : s;
        }
}

/* bf16 activations x bf16 weights (the "B32" order of kernels.h): one lane of
 * vdpbf16ps as x86 defines it: inputs with a zero exponent read as signed
 * zeros, then acc = fma(x1, w1, acc), acc = fma(x0, w0, acc) — the odd element
 * of the pair first, each fma rounded to nearest even and flushed to a zero of
 * its sign when tiny. "Tiny" is x86's MXCSR.FTZ rule: the exact result, rounded
 * to 24 bits with an unbounded exponent, is below FLT_MIN in magnitude. It
 * differs from "the rounded f32 is subnormal" only where fmaf gives +-FLT_MIN
 * from an exact value at or below FLT_MIN - 2^-151 (the 24-bit grid under
 * FLT_MIN is 2^-150, finer than the subnormal grid): those flush (fz24).
 * Measured on AMD Zen 5 (EPYC, 2026-12-05: 16.8M lanes near FLT_MIN, all equal)
 * and what Intel Sapphire Rapids did on the lanes of bf16_probe. */
AI float bfz(uint16_t h) { return td_bf16_to_f32((h & 0x7f80u) ? h : (uint16_t)(h & 0x8000u)); }
AI float ftz(float v) { return fabsf(v) < FLT_MIN ? copysignf(0.0f, v) : v; }
/* the exact c + a*b is below FLT_MIN - 2^-151 in magnitude (a, b bf16 values,
 * c an f32). a*b (16 significant bits) is exact in double. The sum is rounded
 * only when it is not representable, which needs a*b's lowest bit under 2^-179
 * (sum near 2^-126); then |a*b| < 2^-163 and c, a multiple of 2^-149 there,
 * keeps the sum at least 2^-152 away from the bound, so the comparison holds. */
AI int below24(float a, float b, float c) { return fabs((double)c + (double)a * (double)b) < 0x1.ffffffp-127; }
AI float fz24(float a, float b, float c) {
    float r = fmaf(a, b, c);
    if (fabsf(r) < FLT_MIN || (fabsf(r) == FLT_MIN && below24(a, b, c))) return copysignf(0.0f, r);
    return r;
}
float td_bf16_fz24(float a, float b, float c) { return fz24(a, b, c); }
AI float dp_lane(float acc, uint16_t x0, uint16_t x1, uint16_t w0, uint16_t w1) {
    acc = fz24(bfz(x1), bfz(w1), ftz(acc));
    return fz24(bfz(x0), bfz(w0), acc);
}
float td_bf16_dp_lane(float acc, uint16_t x0, uint16_t x1, uint16_t w0, uint16_t w1) {
    return dp_lane(acc, x0, x1, w0, w1);
}

/* Lanes on which vdpbf16ps implementations have been seen to differ from a
 * definition, as {acc bits, x0, x1, w0, w1}: an accumulator of -FLT_MIN and two
 * tiny products that bring the exact sum just under FLT_MIN in magnitude. The
 * definition flushes them (to -0, +0, -0), as Sapphire Rapids and Zen 5 EPYC
 * do; a CPU that kept -FLT_MIN (rounding first, then testing for subnormal)
 * would run the emulation. td_bf16_probe_lanes lays them out for the tests too. */
static const uint32_t bf16_probe[TD_BF16_PROBES][5] = {
    {0x80800000u, 0x938b, 0x9931, 0x1f39, 0x9ab2},
    {0x80800000u, 0x03ff, 0x946c, 0x22dc, 0x9f14},
    {0x80800000u, 0x150e, 0x8fe6, 0x1ed5, 0xa05e},
};

void td_bf16_probe_lanes(float acc[16], uint16_t x[32], uint16_t w[32]) {
    for (int l = 0; l < 16; l++) {
        acc[l] = 0.0f;
        x[2 * l] = x[2 * l + 1] = w[2 * l] = w[2 * l + 1] = 0;
        if (l >= TD_BF16_PROBES) continue;
        memcpy(&acc[l], &bf16_probe[l][0], 4);
        x[2 * l] = (uint16_t)bf16_probe[l][1], x[2 * l + 1] = (uint16_t)bf16_probe[l][2];
        w[2 * l] = (uint16_t)bf16_probe[l][3], w[2 * l + 1] = (uint16_t)bf16_probe[l][4];
    }
}

/* B32 dot of n bf16 activations with n bf16 weights (zero-padded to 32). */
static float dotb_p(const uint16_t *a, const uint16_t *w, int n) {
    float acc[16] = {0};
    for (int k = 0; k < n; k += 32)
        for (int l = 0; l < 16; l++) {
            int i = k + 2 * l;
            uint16_t x0 = i < n ? a[i] : 0, x1 = i + 1 < n ? a[i + 1] : 0;
            uint16_t w0 = i < n ? w[i] : 0, w1 = i + 1 < n ? w[i + 1] : 0;
            acc[l] = dp_lane(acc[l], x0, x1, w0, w1);
        }
    return fold16_p(acc);
}

static void matmul_bp(float *y, int ldy, const uint16_t *x, int ldx, int M, const uint16_t *W, int K, int n0,
                      int n1, int add) {
    for (int m = 0; m < M; m++)
        for (int n = n0; n < n1; n++) {
            float s = dotb_p(x + (size_t)m * ldx, W + (size_t)n * K, K);
            float *yp = y + (size_t)m * ldy + n;
            *yp = add ? *yp + s : s;
        }
}

/* The A32 order (kernels.h, td_attend_b32) for one query at a time. */
static void attend_b32_p(float *o, int ldo, const uint16_t *q, int ldq, int nq, const int *n_keys, const uint16_t *K,
                         const uint16_t *V, int ldkv, int hd, float *sc, uint16_t *p) {
    for (int i = 0; i < nq; i++) {
        const uint16_t *qi = q + (size_t)i * ldq;
        int n = n_keys[i];
        float *oi = o + (size_t)i * ldo;
        for (int j = 0; j < n; j++) sc[j] = dotb_p(qi, K + (size_t)j * ldkv, hd);
        float mx = -INFINITY;
        for (int j = 0; j < n; j++) mx = sc[j] > mx ? sc[j] : mx;
        for (int j = 0; j < n; j++) sc[j] = exp_p(sc[j] - mx);
        float inv = 1.0f / sum_p(sc, n);
        for (int j = 0; j < n; j++) p[j] = td_f32_to_bf16(sc[j] * inv);
        for (int d = 0; d < hd; d++) {
            float acc = 0.0f;
            for (int j = 0; j < n; j += 2) /* a last odd key pairs with a zero probability and value */
                acc = dp_lane(acc, p[j], j + 1 < n ? p[j + 1] : 0, V[(size_t)j * ldkv + d],
                              j + 1 < n ? V[(size_t)(j + 1) * ldkv + d] : 0);
            oi[d] = acc;
        }
    }
}

/* K, V: rows of dtype dt (ldkv elements apart), widened exactly by dot_p / wval. */
static void attend_p(float *o, int ldo, const float *q, int ldq, int nq, const int *n_keys,
                     const char *K, const char *V, int dt, int ldkv, int hd, float scale, float *sc) {
    const size_t rs = eoff(dt, (size_t)ldkv); /* bytes between rows */
    for (int i = 0; i < nq; i++) {
        const float *qi = q + (size_t)i * ldq;
        int n = n_keys[i];
        float *oi = o + (size_t)i * ldo;
        for (int j = 0; j < n; j++) sc[j] = dot_p(qi, K + (size_t)j * rs, dt, hd) * scale;
        float mx = -INFINITY;
        for (int j = 0; j < n; j++) mx = sc[j] > mx ? sc[j] : mx;
        for (int j = 0; j < n; j++) sc[j] = exp_p(sc[j] - mx);
        float inv = 1.0f / sum_p(sc, n);
        for (int d = 0; d < hd; d++) oi[d] = 0.0f;
        for (int j = 0; j < n; j++) {
            float pr = sc[j] * inv;
            const char *vj = V + (size_t)j * rs;
            for (int d = 0; d < hd; d++) oi[d] = fmaf(pr, wval(vj, (size_t)d, dt), oi[d]);
        }
    }
}

/* ---- AVX-512 path -------------------------------------------------------- */
#ifdef TD_HAVE_AVX512

AI float fold16(__m512 v) {
    __m256 lo = _mm512_castps512_ps256(v);
    __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
    __m256 a = _mm256_add_ps(lo, hi);                                          /* s8 */
    __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1)); /* s4 */
    __m128 c = _mm_add_ps(b, _mm_movehl_ps(b, b));                            /* s2 in lanes 0,1 */
    __m128 d = _mm_add_ss(c, _mm_movehdup_ps(c));                             /* s2[0] + s2[1] */
    return _mm_cvtss_f32(d);
}

/* fold16 of 16 vectors at once: lane u of the result = fold16(v[u]), the same
 * additions in the same tree (s8 = lo + hi halves, s4, s2, s), done on shuffled
 * registers; a final permutation puts key u in lane u. */
AI __m512 fold16x16(const __m512 *v) {
    __m512 b[8], d[4], f[2];
#pragma GCC unroll 8
    for (int k = 0; k < 8; k++) /* s8 of keys 2k (blocks 0,1) and 2k+1 (blocks 2,3) */
        b[k] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * k], v[2 * k + 1], 0x44),
                             _mm512_shuffle_f32x4(v[2 * k], v[2 * k + 1], 0xEE));
#pragma GCC unroll 4
    for (int k = 0; k < 4; k++) /* s4: block r = key 4k + r */
        d[k] = _mm512_add_ps(_mm512_shuffle_f32x4(b[2 * k], b[2 * k + 1], 0x88),
                             _mm512_shuffle_f32x4(b[2 * k], b[2 * k + 1], 0xDD));
#pragma GCC unroll 2
    for (int k = 0; k < 2; k++) /* s2: block r = [key 8k + r (2 lanes), key 8k + 4 + r (2 lanes)] */
        f[k] = _mm512_add_ps(_mm512_shuffle_ps(d[2 * k], d[2 * k + 1], 0x44),
                             _mm512_shuffle_ps(d[2 * k], d[2 * k + 1], 0xEE));
    /* s: lane 4r + c = key r + 4c */
    __m512 r = _mm512_add_ps(_mm512_shuffle_ps(f[0], f[1], 0x88), _mm512_shuffle_ps(f[0], f[1], 0xDD));
    const __m512i idx = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    return _mm512_permutexvar_ps(idx, r);
}

AI __mmask16 tailmask(int r) { return (__mmask16)((1u << r) - 1u); }

/* 16 int8 q (the Q8_0 row's values from element k, k a multiple of 16) times
 * their block's scale d: (float)q * d, as wval */
AI __m512 ldq8(const char *w, int k, __m128i q) {
    const char *b = w + (size_t)(k / 32) * 34;
    int16_t h;
    memcpy(&h, b, 2);
    __m512 d = _mm512_cvtph_ps(_mm256_set1_epi16(h)); /* exact, as td_f16_to_f32 */
    return _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q)), d);
}
/* 16 weights from element k of row w (bytes), exact f32 (Q8_0: dequantized). */
AI __m512 ldw(const char *w, int k, int dt) {
    if (dt == TD_DTYPE_Q8_0) return ldq8(w, k, _mm_loadu_si128((const __m128i *)(w + (size_t)(k / 32) * 34 + 2 + k % 32)));
    if (dt == TD_DTYPE_BF16)
        return _mm512_castsi512_ps(_mm512_slli_epi32(
            _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)((const uint16_t *)w + k))), 16));
    if (dt == TD_DTYPE_F16) return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)w + k)));
    return _mm512_loadu_ps((const float *)w + k);
}
AI __m512 ldwm(const char *w, int k, int dt, __mmask16 m) {
    if (dt == TD_DTYPE_Q8_0)
        return ldq8(w, k, _mm_maskz_loadu_epi8(m, (const void *)(w + (size_t)(k / 32) * 34 + 2 + k % 32)));
    if (dt == TD_DTYPE_BF16)
        return _mm512_castsi512_ps(_mm512_slli_epi32(
            _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, (const uint16_t *)w + k)), 16));
    if (dt == TD_DTYPE_F16) return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, (const uint16_t *)w + k));
    return _mm512_maskz_loadu_ps(m, (const float *)w + k);
}

AI float dot_v(const float *a, const char *w, int dt, int n) {
    __m512 acc = _mm512_setzero_ps();
    int k = 0;
    for (; k + 16 <= n; k += 16) acc = _mm512_fmadd_ps(_mm512_loadu_ps(a + k), ldw(w, k, dt), acc);
    if (k < n) {
        __mmask16 m = tailmask(n - k);
        acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + k), ldwm(w, k, dt, m), acc);
    }
    return fold16(acc);
}

#ifndef PF_HINT
#define PF_HINT _MM_HINT_T0
#endif
#ifndef PF_PANELS
#define PF_PANELS 2
#endif
#ifndef PF_MIN_BYTES
#define PF_MIN_BYTES 9216
#endif
/* Where a tile of NR weight rows (wrow bytes each) prefetches: the rows of the
 * tile PF_PANELS ahead, or further where that is under PF_MIN_BYTES ahead —
 * the 8-token tiles' 3 rows of K = 384 bf16 (the tiny-code target's and the
 * drafters' width) were 4.6 KB ahead, too close to hide DRAM's latency: tiles
 * 4 ahead (9.2 KB) made a T = 8 forward of that target 3-4% faster and 8 rows
 * x 1 token 7% (bench/forward-notes.md, "Stop 40"); wider rows keep 2. */
AI const char *pf_ahead(const char *w, int NR, size_t wrow) {
    size_t tb = (size_t)NR * wrow, n = (PF_MIN_BYTES + tb - 1) / tb;
    return w + tb * (n > PF_PANELS ? n : PF_PANELS);
}
/* A tile's accumulators: started from accs when k0 > 0 (else zero), saved to
 * accs between K blocks, folded into y at the end (tile, tileb). */
AI void acc_load(int MR, int NR, __m512 acc[8][8], int k0, const float *accs) {
#pragma GCC unroll 8
    for (int i = 0; i < MR; i++)
#pragma GCC unroll 8
        for (int j = 0; j < NR; j++) acc[i][j] = k0 ? _mm512_loadu_ps(accs + (i * NR + j) * 16) : _mm512_setzero_ps();
}
AI void acc_save(int MR, int NR, __m512 acc[8][8], float *accs) {
#pragma GCC unroll 8
    for (int i = 0; i < MR; i++)
#pragma GCC unroll 8
        for (int j = 0; j < NR; j++) _mm512_storeu_ps(accs + (i * NR + j) * 16, acc[i][j]);
}
AI void acc_fold(int MR, int NR, __m512 acc[8][8], float *y, int ldy, int add) {
    if (MR * NR >= 8) { /* 16 accumulators a fold16x16 (the same tree per lane, shuffled) */
        const int n = MR * NR;
#pragma GCC unroll 4
        for (int g0 = 0; g0 < n; g0 += 16) {
            __m512 v[16];
            float t[16];
#pragma GCC unroll 16
            for (int u = 0; u < 16; u++) v[u] = g0 + u < n ? acc[(g0 + u) / NR][(g0 + u) % NR] : _mm512_setzero_ps();
            _mm512_storeu_ps(t, fold16x16(v));
#pragma GCC unroll 16
            for (int u = 0; u < 16; u++)
                if (g0 + u < n) {
                    float *yp = y + (size_t)((g0 + u) / NR) * ldy + (g0 + u) % NR;
                    *yp = add ? *yp + t[u] : t[u];
                }
        }
        return;
    }
#pragma GCC unroll 8
    for (int i = 0; i < MR; i++)
#pragma GCC unroll 8
        for (int j = 0; j < NR; j++) {
            float s = fold16(acc[i][j]);
            float *yp = y + (size_t)i * ldy + j;
            *yp = add ? *yp + s : s;
        }
}

/* The register tile: MR tokens x NR outputs, each a D16 dot over all of K —
 * or over the steps [k0, k1) of it (k0, k1 multiples of 16 except k1 = K): the
 * 16-lane accumulators start from accs ([MR][NR][16] floats) when k0 > 0 and
 * are saved there when k1 < K, so a dot computed in several K blocks performs
 * the same FMAs in the same order as one computed at once (same bits). */
AI void tile(int MR, int NR, int dt, float *y, int ldy, const float *x, int ldx, const char *w,
             size_t wrow, int K, int add, int k0, int k1, float *accs) {
    __m512 acc[8][8];
    acc_load(MR, NR, acc, k0, accs);
    int k = k0;
    const size_t esz = dt == TD_DTYPE_F32 ? 4 : 2;
    const char *pf = pf_ahead(w, NR, wrow);
    for (; k + 16 <= k1; k += 16) {
        __m512 wv[8];
#pragma GCC unroll 8
        for (int j = 0; j < NR; j++) _mm_prefetch(pf + j * wrow + (size_t)k * esz, PF_HINT);
#pragma GCC unroll 8
        for (int j = 0; j < NR; j++) wv[j] = ldw(w + j * wrow, k, dt);
#pragma GCC unroll 8
        for (int i = 0; i < MR; i++) {
            __m512 xv = _mm512_loadu_ps(x + (size_t)i * ldx + k);
            /* keep xv in a register: GCC otherwise folds this load into each of the
             * NR FMAs (NR loads instead of one; load-port bound for NR <= 4) */
            __asm__("" : "+v"(xv));
#pragma GCC unroll 8
            for (int j = 0; j < NR; j++) acc[i][j] = _mm512_fmadd_ps(xv, wv[j], acc[i][j]);
        }
    }
    if (k1 < K) {
        acc_save(MR, NR, acc, accs);
        return;
    }
    if (k < K) {
        __mmask16 m = tailmask(K - k);
        __m512 wv[8];
#pragma GCC unroll 8
        for (int j = 0; j < NR; j++) wv[j] = ldwm(w + j * wrow, k, dt, m);
#pragma GCC unroll 8
        for (int i = 0; i < MR; i++) {
            __m512 xv = _mm512_maskz_loadu_ps(m, x + (size_t)i * ldx + k);
#pragma GCC unroll 8
            for (int j = 0; j < NR; j++) acc[i][j] = _mm512_fmadd_ps(xv, wv[j], acc[i][j]);
        }
    }
    acc_fold(MR, NR, acc, y, ldy, add);
}

/* The bf16-activation tile (act_type bf16, bf16 weights): the same register
 * tile and K blocking as tile(), over bf16 activations x; each element is a B32
 * dot — per 32 elements one vdpbf16ps into a 16-lane accumulator (lane l takes
 * the pair 2l, 2l+1), a masked zero-padded final step, the fold16 tree — so
 * its bits do not depend on M, the tile or the K blocks (k0, k1 multiples of 32
 * except k1 = K). Compiled for AVX512_BF16 whatever the build's -march (TBF);
 * run only when the CPU has it (bf16_ok). pfm, the software prefetch: 0 none,
 * PFM_NEAR the rows pf_ahead gives toward L1, PFM_FAR those and the rows two
 * tiles further toward L2 (matmul_bv says where each is used). */
#define TBF __attribute__((target("avx512bf16")))
enum { PFM_NONE, PFM_NEAR, PFM_FAR };
TBF AI void tileb(int MR, int NR, int dt, float *y, int ldy, const uint16_t *x, int ldx, const char *w, size_t wrow,
                  int K, int add, int k0, int k1, float *accs, int pfm) {
    (void)dt;
    __m512 acc[8][8];
    acc_load(MR, NR, acc, k0, accs);
    int k = k0;
    const char *pf = pf_ahead(w, NR, wrow), *pf2 = pf + 2 * (size_t)NR * wrow;
    /* far: a value the compiler cannot see, so the far tiles keep this loop
     * with its branch. The loop specialised for PFM_FAR (the same prefetches
     * in the same order, same addresses) was slower on Zen 5: a T = 8 forward
     * of the 0.6B shape in bf16 took 1.04 of the near-only tiles' time, this
     * one 0.87-0.88 (bench/forward-notes.md, "Stop 51"). */
    int far = pfm == PFM_FAR;
    if (far) __asm__("" : "+r"(far));
    for (; k + 32 <= k1; k += 32) {
        __m512i wv[8];
        if (far) {
#pragma GCC unroll 8
            for (int j = 0; j < NR; j++) _mm_prefetch(pf2 + j * wrow + (size_t)k * 2, _MM_HINT_T1);
#pragma GCC unroll 8
            for (int j = 0; j < NR; j++) _mm_prefetch(pf + j * wrow + (size_t)k * 2, PF_HINT);
        } else
#pragma GCC unroll 8
            for (int j = 0; j < NR && pfm != PFM_NONE; j++) _mm_prefetch(pf + j * wrow + (size_t)k * 2, PF_HINT);
#pragma GCC unroll 8
        for (int j = 0; j < NR; j++) wv[j] = _mm512_loadu_si512(w + j * wrow + (size_t)k * 2);
#pragma GCC unroll 8
        for (int i = 0; i < MR; i++) {
            __m512i xv = _mm512_loadu_si512(x + (size_t)i * ldx + k);
            __asm__("" : "+v"(xv)); /* one load per token (see tile()) */
#pragma GCC unroll 8
            for (int j = 0; j < NR; j++) acc[i][j] = _mm512_dpbf16_ps(acc[i][j], (__m512bh)xv, (__m512bh)wv[j]);
        }
    }
    if (k1 < K) {
        acc_save(MR, NR, acc, accs);
        return;
    }
    if (k < K) {
        __mmask32 m = (__mmask32)((1u << (K - k)) - 1u);
        __m512i wv[8];
#pragma GCC unroll 8
        for (int j = 0; j < NR; j++) wv[j] = _mm512_maskz_loadu_epi16(m, w + j * wrow + (size_t)k * 2);
#pragma GCC unroll 8
        for (int i = 0; i < MR; i++) {
            __m512i xv = _mm512_maskz_loadu_epi16(m, x + (size_t)i * ldx + k);
#pragma GCC unroll 8
            for (int j = 0; j < NR; j++) acc[i][j] = _mm512_dpbf16_ps(acc[i][j], (__m512bh)xv, (__m512bh)wv[j]);
        }
    }
    acc_fold(MR, NR, acc, y, ldy, add);
}

/* The B32 tile without vdpbf16ps (bf16_fma: CPUs where that instruction is
 * slow — on an Intel Xeon of model 207, 0.5 a cycle against two f32 fmas a
 * cycle; bench/forward-notes.md, "Stop 52"): the two fmas of each lane step as
 * dp_lane defines them, odd element first, on operands widened to f32, with
 * MXCSR's FTZ and DAZ on for the k loop only. DAZ reads a zero-exponent bf16
 * (a subnormal once widened) as the zero of its sign (bfz, ftz of acc); FTZ's
 * x86 rule, tininess after rounding to 24 bits with an unbounded exponent, is
 * fz24's. The fold and the add into y run under the caller's MXCSR, as
 * everywhere else. x is split_b32's layout (ldx unused): per 32-element step
 * the tile's tokens' widened halves, 1 KiB in a row. Each step widens the NR
 * weight vectors into 2 NR registers, then loads each token's two halves once
 * (loading x in every fma instead ran at 108 GFLOP/s a core from L2 against
 * 168; the fma peak is 176). The weights are prefetched toward L2, not L1
 * (the 0.6B shape's T = 8 forward: 0.91-0.94 of the time). Same K blocking
 * and fold as tileb, so the same bits. */
#define MXCSR_FTZ_DAZ 0x8040u
/* one 32-element step of tilem: row j's weights v[j] (32 bf16) widened into the
 * odd and even halves, each token's split x at xk read by its fmas */
AI void mstep(int MR, int NR, __m512 acc[8][8], const float *xk, const __m512i *v) {
    const __m512i hi = _mm512_set1_epi32((int)0xffff0000u);
    __m512 wo[8], we[8];
#pragma GCC unroll 8
    for (int j = 0; j < NR; j++) {
        wo[j] = _mm512_castsi512_ps(_mm512_and_si512(v[j], hi));
        we[j] = _mm512_castsi512_ps(_mm512_slli_epi32(v[j], 16));
    }
#pragma GCC unroll 8
    for (int i = 0; i < MR; i++) {
        __m512 xo = _mm512_loadu_ps(xk + 32 * i), xe = _mm512_loadu_ps(xk + 32 * i + 16);
        __asm__("" : "+v"(xo), "+v"(xe)); /* one load each, kept in a register */
#pragma GCC unroll 8
        for (int j = 0; j < NR; j++) {
            acc[i][j] = _mm512_fmadd_ps(xo, wo[j], acc[i][j]);
            acc[i][j] = _mm512_fmadd_ps(xe, we[j], acc[i][j]);
        }
    }
}
/* Ties the accumulators to this point of the instruction stream: a volatile
 * asm stays in order with the MXCSR writes, and the fmas (after) or the fold
 * (before) cannot cross it, so every fma of tilem runs under FTZ|DAZ and no
 * fold add does. */
AI void acc_pin(int MR, int NR, __m512 acc[8][8]) {
#pragma GCC unroll 8
    for (int i = 0; i < MR; i++)
#pragma GCC unroll 8
        for (int j = 0; j < NR; j++) __asm__ volatile("" : "+v"(acc[i][j]));
}
AI void tilem(int MR, int NR, int dt, float *y, int ldy, const float *x, int ldx, const char *w, size_t wrow, int K,
              int add, int k0, int k1, float *accs) {
    (void)dt, (void)ldx;
    __m512 acc[8][8];
    __m512i v[8];
    acc_load(MR, NR, acc, k0, accs);
    const unsigned csr = _mm_getcsr();
    _mm_setcsr(csr | MXCSR_FTZ_DAZ);
    acc_pin(MR, NR, acc);
    const char *pf = pf_ahead(w, NR, wrow);
    int k = k0;
    for (; k + 32 <= k1; k += 32) {
#pragma GCC unroll 8
        for (int j = 0; j < NR; j++) _mm_prefetch(pf + j * wrow + (size_t)k * 2, _MM_HINT_T1);
#pragma GCC unroll 8
        for (int j = 0; j < NR; j++) v[j] = _mm512_loadu_si512(w + j * wrow + (size_t)k * 2);
        mstep(MR, NR, acc, x + 8 * (size_t)k, v);
    }
    if (k < k1) { /* k1 = K: the last, partial step (x is zero past K) */
#pragma GCC unroll 8
        for (int j = 0; j < NR; j++)
            v[j] = _mm512_maskz_loadu_epi16((__mmask32)((1u << (K - k)) - 1u), w + j * wrow + (size_t)k * 2);
        mstep(MR, NR, acc, x + 8 * (size_t)k, v);
    }
    acc_pin(MR, NR, acc);
    _mm_setcsr(csr);
    acc_pin(MR, NR, acc);
    if (k1 < K) acc_save(MR, NR, acc, accs);
    else acc_fold(MR, NR, acc, y, ldy, add);
}

/* x (M tokens of K bf16, ldx apart) in tilem's split layout: blocks of 8
 * tokens, 8 * kp floats each (kp = K rounded up to 32); in a block, step by
 * step, the 8 tokens' 32 floats (16 odd elements, 16 even; zero past K), so a
 * tile's step reads one run of 1 KiB. Block b holds tokens 8b .. 8b+7: it
 * starts at float b * 8 * kp, where matmul_t's x + m * ldx puts a tile of the
 * tokens from m (a multiple of 8 there, or 0) with ldx = kp. */
static void split_b32(float *xs, int kp, const uint16_t *x, int ldx, int M, int K) {
    const __m512i hi = _mm512_set1_epi32((int)0xffff0000u);
    for (int m = 0; m < M; m++)
        for (int k = 0; k < kp; k += 32) {
            __mmask32 mk = K - k >= 32 ? (__mmask32)~0u : (__mmask32)((1u << (K - k)) - 1u);
            __m512i v = _mm512_maskz_loadu_epi16(mk, x + (size_t)m * ldx + k);
            float *o = xs + (size_t)(m / 8) * 8 * kp + (size_t)k * 8 + (size_t)(m % 8) * 32;
            _mm512_storeu_ps(o, _mm512_castsi512_ps(_mm512_and_si512(v, hi)));
            _mm512_storeu_ps(o + 16, _mm512_castsi512_ps(_mm512_slli_epi32(v, 16)));
        }
}

TBF static int bf16_conforms(void) {
    float acc[16], hw[16];
    uint16_t x[32], w[32];
    td_bf16_probe_lanes(acc, x, w);
    _mm512_storeu_ps(hw, _mm512_dpbf16_ps(_mm512_loadu_ps(acc), (__m512bh)_mm512_loadu_si512(x), (__m512bh)_mm512_loadu_si512(w)));
    for (int l = 0; l < 16; l++) {
        float e = dp_lane(acc[l], x[2 * l], x[2 * l + 1], w[2 * l], w[2 * l + 1]);
        if (memcmp(&e, &hw[l], 4) != 0) return 0;
    }
    return 1;
}

/* vdpbf16ps is used where the CPU has it and it computes the probe lanes as the
 * definition does; elsewhere td_matmul_bf16a runs the emulation (same bits). */
static int bf16_ok(void) {
    static _Atomic int ok = -1;
    int v = atomic_load_explicit(&ok, memory_order_relaxed);
    if (v < 0) {
        __builtin_cpu_init();
        v = __builtin_cpu_supports("avx512bf16") && bf16_conforms() ? 1 : 0;
        atomic_store_explicit(&ok, v, memory_order_relaxed);
    }
    return v;
}

typedef void (*tile_fn)(float *y, int ldy, const void *x, int ldx, const char *w, size_t wrow, int K, int add,
                        int k0, int k1, float *accs); /* x: f32 (tile) or bf16 (tileb) */
#define TILE_INST(MR, NR, DT, SUF) TILE_INST_(MR, NR, DT, SUF) /* expands NR_MAIN first */
#define TILE_INST_(MR, NR, DT, SUF)                                                                      \
    TA_##SUF static void tile_##MR##x##NR##_##SUF(float *y, int ldy, const void *x, int ldx, const char *w, \
                                                  size_t wrow, int K, int add, int k0, int k1, float *accs) { \
        TK_##SUF(MR, NR, DT, y, ldy, x, ldx, w, wrow, K, add, k0, k1, accs);                             \
    }
/* the tile template (TK_) and attributes (TA_) of each set */
#define TK_f32 tile
#define TK_f16 tile
#define TK_bf16 tile
#define TK_ba(...) tileb(__VA_ARGS__, PFM_NEAR) /* with its software prefetch */
#define TK_bn(...) tileb(__VA_ARGS__, PFM_NONE)
#define TK_bf(...) tileb(__VA_ARGS__, PFM_FAR)
#define TK_bm tilem
#define TA_f32
#define TA_f16
#define TA_bf16
#define TA_ba TBF
#define TA_bn TBF
#define TA_bf TBF
#define TA_bm
/* Tiles for 2 <= M < 5: MR_MAIN tokens x NR_MAIN outputs (fewer tokens at the end
 * of a block, one output at the end of the range); M >= 5: min(M, 8) x NR_WIDE, so
 * every weight vector converted serves up to 8 tokens (measured in L2, K=1024 bf16,
 * M=8: 4x6 155 GFLOP/s, 8x3 184, 8x2 182 on one core; M = 5..7 in one pass of
 * M x 3 tiles instead of a 4x6 and a 1..3x6 pass: K=1024 N=16384 from DRAM, one
 * core, 131/140/149 -> 149/158/164 GFLOP/s; M = 3, 4 gain nothing); M = 1: 1 x 8. */
#ifndef MR_MAIN
#define MR_MAIN 4
#endif
#ifndef NR_MAIN
#define NR_MAIN 6
#endif
#define NR_WIDE 3 /* outputs of the 8-token tiles */
#define TILE_SET(DT, SUF)                                                                                \
    TILE_INST(1, 1, DT, SUF) TILE_INST(2, 1, DT, SUF) TILE_INST(3, 1, DT, SUF) TILE_INST(4, 1, DT, SUF)  \
    TILE_INST(5, 1, DT, SUF) TILE_INST(6, 1, DT, SUF) TILE_INST(7, 1, DT, SUF) TILE_INST(8, 1, DT, SUF)  \
    TILE_INST(1, NR_MAIN, DT, SUF) TILE_INST(2, NR_MAIN, DT, SUF) TILE_INST(3, NR_MAIN, DT, SUF)          \
    TILE_INST(4, NR_MAIN, DT, SUF) TILE_INST(5, NR_MAIN, DT, SUF) TILE_INST(6, NR_MAIN, DT, SUF)          \
    TILE_INST(7, NR_MAIN, DT, SUF) TILE_INST(8, NR_MAIN, DT, SUF) TILE_INST(1, 8, DT, SUF)                \
    TILE_INST(1, NR_WIDE, DT, SUF) TILE_INST(2, NR_WIDE, DT, SUF) TILE_INST(3, NR_WIDE, DT, SUF)          \
    TILE_INST(4, NR_WIDE, DT, SUF) TILE_INST(5, NR_WIDE, DT, SUF) TILE_INST(6, NR_WIDE, DT, SUF)          \
    TILE_INST(7, NR_WIDE, DT, SUF) TILE_INST(8, NR_WIDE, DT, SUF)
TILE_SET(TD_DTYPE_F32, f32)
TILE_SET(TD_DTYPE_F16, f16)
TILE_SET(TD_DTYPE_BF16, bf16)
TILE_SET(TD_DTYPE_BF16, ba)
TILE_SET(TD_DTYPE_BF16, bn)
TILE_SET(TD_DTYPE_BF16, bf)
TILE_SET(TD_DTYPE_BF16, bm)

#define TN(MR, NR, SUF) tile_##MR##x##NR##_##SUF
#define TNX(MR, NR, SUF) TN(MR, NR, SUF)
typedef struct { tile_fn t[9][2]; tile_fn gemv8; tile_fn w[9]; } tile_set; /* t[mr][NR=1 | NR_MAIN], w[mr]: mr x NR_WIDE */
#define TS(SUF) {{{0, 0}, {TN(1, 1, SUF), TNX(1, NR_MAIN, SUF)}, {TN(2, 1, SUF), TNX(2, NR_MAIN, SUF)}, \
                  {TN(3, 1, SUF), TNX(3, NR_MAIN, SUF)}, {TN(4, 1, SUF), TNX(4, NR_MAIN, SUF)},           \
                  {TN(5, 1, SUF), TNX(5, NR_MAIN, SUF)}, {TN(6, 1, SUF), TNX(6, NR_MAIN, SUF)},           \
                  {TN(7, 1, SUF), TNX(7, NR_MAIN, SUF)}, {TN(8, 1, SUF), TNX(8, NR_MAIN, SUF)}},          \
                 TN(1, 8, SUF),                                                                    \
                 {0, TNX(1, NR_WIDE, SUF), TNX(2, NR_WIDE, SUF), TNX(3, NR_WIDE, SUF), TNX(4, NR_WIDE, SUF), \
                  TNX(5, NR_WIDE, SUF), TNX(6, NR_WIDE, SUF), TNX(7, NR_WIDE, SUF), TNX(8, NR_WIDE, SUF)}}
static const tile_set TILES[3] = {[TD_DTYPE_F32] = TS(f32), [TD_DTYPE_F16] = TS(f16), [TD_DTYPE_BF16] = TS(bf16)};
static const tile_set TILES_BA = TS(ba); /* bf16 activations x bf16 weights */
static const tile_set TILES_BN = TS(bn); /* the same without software prefetch */
static const tile_set TILES_BF = TS(bf); /* the same with the far prefetch too */
static const tile_set TILES_BM = TS(bm); /* the same bits without vdpbf16ps (tilem) */

/* M >= 8 (prefill, verify): the outputs are taken in panels of about PANEL_BYTES
 * of weights, which stay in L2 while every 8-token tile of the whole batch runs
 * over them — the weights stream from memory once per product, not once per
 * token block. Within a panel, an 8-token tile's activations (8 x KC floats,
 * 32 KiB) stay in L1 while the panel's rows stream from L2; K longer than KC is
 * taken in blocks, the accumulators of the panel's tiles saved between blocks
 * (tile(): same FMAs in the same order, same bits). */
#define PANEL_BYTES (512 << 10)
#define KC 1024
#define KBLK_PANEL 96 /* outputs per panel when K is blocked (accumulator scratch 8 x 96 x 16 floats) */

/* The loop over tiles for either tile set: x has xsz-byte elements (f32: 4,
 * bf16: 2), the tiles step K by kstep (16, 32). */
AI void matmul_t(float *y, int ldy, const char *x, size_t xsz, int ldx, int M, const char *wb, size_t wrow,
                 const tile_set *ts, int kstep, int K, int n0, int n1, int add) {
    if (M == 1) {
        int n = n0;
        for (; n + 8 <= n1; n += 8) ts->gemv8(y + n, ldy, x, ldx, wb + n * wrow, wrow, K, add, 0, K, NULL);
        for (; n < n1; n++) ts->t[1][0](y + n, ldy, x, ldx, wb + n * wrow, wrow, K, add, 0, K, NULL);
        return;
    }
    if (M < 5) { /* 5..7 tokens: one pass of the wide tiles (the 4-token tiles would take two) */
        int n = n0;
        for (; n + NR_MAIN <= n1; n += NR_MAIN)
            for (int m = 0; m < M; m += MR_MAIN) {
                int mr = M - m < MR_MAIN ? M - m : MR_MAIN;
                ts->t[mr][1](y + (size_t)m * ldy + n, ldy, x + (size_t)m * ldx * xsz, ldx, wb + n * wrow, wrow, K, add, 0, K, NULL);
            }
        for (; n < n1; n++)
            for (int m = 0; m < M; m += MR_MAIN) {
                int mr = M - m < MR_MAIN ? M - m : MR_MAIN;
                ts->t[mr][0](y + (size_t)m * ldy + n, ldy, x + (size_t)m * ldx * xsz, ldx, wb + n * wrow, wrow, K, add, 0, K, NULL);
            }
        return;
    }
    int nkb = K > KC ? (K + KC - 1) / KC : 1;
    int kblk = nkb > 1 ? ((K + nkb - 1) / nkb + kstep - 1) & ~(kstep - 1) : K;
    int nb = (int)(PANEL_BYTES / wrow) / NR_WIDE * NR_WIDE;
    if (nkb > 1 && nb > KBLK_PANEL) nb = KBLK_PANEL;
    if (nb < NR_WIDE) nb = NR_WIDE;
    float accs[KBLK_PANEL * 8 * 16];
    for (int pb = n0; pb < n1; pb += nb) {
        int pe = pb + nb < n1 ? pb + nb : n1;
        for (int m = 0; m < M; m += 8) {
            int mr = M - m < 8 ? M - m : 8;
            float *ym = y + (size_t)m * ldy;
            const char *xm = x + (size_t)m * ldx * xsz;
            for (int k0 = 0; k0 < K; k0 += kblk) {
                int k1 = k0 + kblk < K ? k0 + kblk : K;
                int n = pb;
                for (; n + NR_WIDE <= pe; n += NR_WIDE)
                    ts->w[mr](ym + n, ldy, xm, ldx, wb + n * wrow, wrow, K, add, k0, k1, nkb > 1 ? accs + (n - pb) * 8 * 16 : NULL);
                for (; n < pe; n++)
                    ts->t[mr][0](ym + n, ldy, xm, ldx, wb + n * wrow, wrow, K, add, k0, k1, nkb > 1 ? accs + (n - pb) * 8 * 16 : NULL);
            }
        }
    }
}

static void matmul_v(float *y, int ldy, const float *x, int ldx, int M, const void *W, int dt,
                     int K, int n0, int n1, int add) {
    matmul_t(y, ldy, (const char *)x, 4, ldx, M, W, (size_t)K * (dt == TD_DTYPE_F32 ? 4 : 2), &TILES[dt], 16, K, n0,
             n1, add);
}
/* hw: a product over weights streamed from memory on a CPU whose hardware
 * prefetchers stream its one-token tiles better alone (td_kernels_hw_stream).
 * There, by the number of tokens (Zen 5, 0.6B shape, bf16, context 512,
 * forwards alternating in one process; bench/forward-notes.md, "Stop 51"):
 *   1 and 2 tokens: no software prefetch (T = 2: 0.94-0.95 of the time at
 *   ~45 GB/s, 0.97-1.0 at ~75);
 *   3 and 4 tokens: the near prefetch (the far one added, T = 4 took
 *   0.92-1.01 at ~75 GB/s but 1.02-1.08 at ~45);
 *   5 to 8 tokens, one pass over the weights: the near prefetch toward L1 and
 *   the far one toward L2 (T = 8: 0.87-0.88 at 57-76 GB/s, 0.97-0.98 at
 *   42-48; T = 6: 0.95-0.96 / 0.97-1.0; the tiny-code target, mostly in L3:
 *   0.99-1.01). The prefetch changes no bit. */
static void matmul_bv(float *y, int ldy, const uint16_t *x, int ldx, int M, const uint16_t *W, int K, int n0, int n1,
                      int add, int hw) {
    const tile_set *ts = !hw || (M > 2 && M < 5) || M > 8 ? &TILES_BA : M <= 2 ? &TILES_BN : &TILES_BF;
    matmul_t(y, ldy, (const char *)x, 2, ldx, M, (const char *)W, (size_t)K * 2, ts, 32, K, n0, n1, add);
}

/* The B32 product on tilem (no vdpbf16ps): x split once into this thread's
 * scratch. Returns 0, or -1 (nothing done) when the scratch cannot be had. */
static int matmul_bm(float *y, int ldy, const uint16_t *x, int ldx, int M, const uint16_t *W, int K, int n0, int n1,
                     int add) {
    int kp = (K + 31) & ~31;
    float *xs = td_thread_scratch(sizeof(float) * (size_t)((M + 7) & ~7) * (size_t)kp);
    if (!xs) return -1;
    split_b32(xs, kp, x, ldx, M, K);
    matmul_t(y, ldy, (const char *)xs, 4, kp, M, (const char *)W, (size_t)K * 2, &TILES_BM, 32, K, n0, n1, add);
    return 0;
}

/* The P24 layout's products (td_matmul_bf16p, kernels.h): the B32 order of
 * tileb over weights packed panel, k-block major. Per panel of 24 rows and per
 * k-block of up to P24_KB elements, groups of 3 rows, per 32-element step the
 * group's 3 x 64 bytes: a thread reads one stream. Activations go to this
 * thread's scratch interleaved [step][token][32] (8 token slots, one block of
 * up to 8 tokens), so a k-block's share stays in L1 beside the stream; a
 * panel's accumulators stay in registers (one token: 24 of them, across all
 * its k-blocks) or in L1 between k-blocks (2-8 tokens). Each output's steps run
 * in k order and end in the same D16 fold as tileb's (acc_fold): its bits.
 * (bench/forward-notes.md, "Stop 57": one stream against the plain tiles' 3
 * rows + 8 activation rows + 8 output rows.) */
#define P24_ROWS TD_P24_ROWS
#define P24_KB TD_P24_KB
AI size_t p24_panel_bytes(int K) { return (size_t)P24_ROWS * (size_t)K * 2; }
/* The bytes of k-block kb of a panel start at kb * P24_ROWS * P24_KB * 2 (every block before the last is whole). */
TBF AI void p24_tile(int MR, float *y, int ldy, const uint16_t *xil, const char *pw, int K, int add) {
    __m512 accs[P24_ROWS / 3][8][3];
    const int G = P24_ROWS / 3;
    for (int kb0 = 0; kb0 < K; kb0 += P24_KB) {
        const int S = (K - kb0 < P24_KB ? K - kb0 : P24_KB) / 32;
        const char *wk = pw + (size_t)kb0 * P24_ROWS * 2;
        const uint16_t *xb = xil + (size_t)(kb0 / 32) * 256;
        for (int g = 0; g < G; g++) {
            __m512 acc[8][8];
#pragma GCC unroll 8
            for (int i = 0; i < MR; i++)
#pragma GCC unroll 3
                for (int j = 0; j < 3; j++) acc[i][j] = kb0 ? accs[g][i][j] : _mm512_setzero_ps();
            const char *w = wk + (size_t)g * S * 192;
            for (int s = 0; s < S; s++) {
                const char *q = w + (size_t)s * 192;
                _mm_prefetch(q + 4096, _MM_HINT_T1);
                _mm_prefetch(q + 4096 + 64, _MM_HINT_T1);
                _mm_prefetch(q + 4096 + 128, _MM_HINT_T1);
                __m512i w0 = _mm512_load_si512(q), w1 = _mm512_load_si512(q + 64), w2 = _mm512_load_si512(q + 128);
#pragma GCC unroll 8
                for (int i = 0; i < MR; i++) {
                    __m512i xv = _mm512_load_si512(xb + (size_t)s * 256 + i * 32);
                    __asm__("" : "+v"(xv)); /* one load a token (see tile()) */
                    acc[i][0] = _mm512_dpbf16_ps(acc[i][0], (__m512bh)xv, (__m512bh)w0);
                    acc[i][1] = _mm512_dpbf16_ps(acc[i][1], (__m512bh)xv, (__m512bh)w1);
                    acc[i][2] = _mm512_dpbf16_ps(acc[i][2], (__m512bh)xv, (__m512bh)w2);
                }
            }
            if (kb0 + P24_KB < K) {
#pragma GCC unroll 8
                for (int i = 0; i < MR; i++)
#pragma GCC unroll 3
                    for (int j = 0; j < 3; j++) accs[g][i][j] = acc[i][j];
            } else {
                acc_fold(MR, 3, acc, y + g * 3, ldy, add);
            }
        }
    }
}
/* One token: the panel's 24 outputs in registers across its k-blocks, no
 * software prefetch (the hardware prefetchers stream one stream best). */
TBF AI void p24_one(float *y, const uint16_t *x, const char *pw, int K, int add) {
    const int G = P24_ROWS / 3;
    __m512 acc[P24_ROWS / 3][3];
#pragma GCC unroll 8
    for (int g = 0; g < G; g++)
#pragma GCC unroll 3
        for (int j = 0; j < 3; j++) acc[g][j] = _mm512_setzero_ps();
    for (int kb0 = 0; kb0 < K; kb0 += P24_KB) {
        const int S = (K - kb0 < P24_KB ? K - kb0 : P24_KB) / 32;
        const char *wk = pw + (size_t)kb0 * P24_ROWS * 2;
        for (int s = 0; s < S; s++) {
            __m512i xv = _mm512_loadu_si512(x + kb0 + s * 32);
            __asm__("" : "+v"(xv));
#pragma GCC unroll 8
            for (int g = 0; g < G; g++) {
                const char *q = wk + ((size_t)g * S + s) * 192;
#pragma GCC unroll 3
                for (int j = 0; j < 3; j++)
                    acc[g][j] = _mm512_dpbf16_ps(acc[g][j], (__m512bh)xv, (__m512bh)_mm512_load_si512(q + j * 64));
            }
        }
    }
    /* the fold, as tileb's 1 x 8 tiles fold (fold16x16 over 16, then 8 of them) */
    __m512 f[8][8];
#pragma GCC unroll 8
    for (int u = 0; u < 8; u++) f[0][u] = acc[u / 3][u % 3];
    acc_fold(1, 8, f, y, 1, add);
#pragma GCC unroll 8
    for (int u = 0; u < 8; u++) f[0][u] = acc[(u + 8) / 3][(u + 8) % 3];
    acc_fold(1, 8, f, y + 8, 1, add);
#pragma GCC unroll 8
    for (int u = 0; u < 8; u++) f[0][u] = acc[(u + 16) / 3][(u + 16) % 3];
    acc_fold(1, 8, f, y + 16, 1, add);
}
#define P24_TILE(MR) \
    TBF static void p24_tile_##MR(float *y, int ldy, const uint16_t *xil, const char *pw, int K, int add) { \
        p24_tile(MR, y, ldy, xil, pw, K, add);                                                             \
    }
P24_TILE(1) P24_TILE(2) P24_TILE(3) P24_TILE(4) P24_TILE(5) P24_TILE(6) P24_TILE(7) P24_TILE(8)
typedef void (*p24_fn)(float *y, int ldy, const uint16_t *xil, const char *pw, int K, int add);
static const p24_fn P24_TILES[9] = {0, p24_tile_1, p24_tile_2, p24_tile_3, p24_tile_4,
                                    p24_tile_5, p24_tile_6, p24_tile_7, p24_tile_8};
TBF static void p24_one_fn(float *y, const uint16_t *x, const char *pw, int K, int add) { p24_one(y, x, pw, K, add); }

/* Whole panels [q0, q1) of the packed weights pk for all M tokens: the
 * blocks of 8 tokens (up to P24_SUPER of them at a time) interleaved once into
 * this thread's scratch, then each panel meets every block while it sits in
 * L1/L2 (the weights stream once per P24_SUPER blocks); 0, or -1 (nothing
 * done) when the scratch cannot be had. */
#define P24_SUPER 64
static int matmul_p24(float *y, int ldy, const uint16_t *x, int ldx, int M, const char *pk, int K, int q0, int q1,
                      int add) {
    if (M == 1) {
        for (int q = q0; q < q1; q++)
            p24_one_fn(y + (size_t)q * P24_ROWS, x, pk + (size_t)q * p24_panel_bytes(K), K, add);
        return 0;
    }
    const size_t blk = (size_t)K * 8; /* bf16 elements of one interleaved block of 8 tokens */
    int nbt = (M + 7) / 8;
    uint16_t *xil = td_thread_scratch(blk * 2 * (size_t)(nbt < P24_SUPER ? nbt : P24_SUPER));
    if (!xil) return -1;
    for (int b0 = 0; b0 < nbt; b0 += P24_SUPER) {
        int nb = nbt - b0 < P24_SUPER ? nbt - b0 : P24_SUPER, m0 = 8 * b0, m1 = M < 8 * (b0 + nb) ? M : 8 * (b0 + nb);
        for (int m = m0; m < m1; m++) /* token m: block (m - m0) / 8, slot m % 8 of [step][slot][32] */
            for (int k = 0; k < K; k += 32)
                memcpy(xil + (size_t)((m - m0) / 8) * blk + (size_t)(k / 32) * 256 + (m % 8) * 32, x + (size_t)m * ldx + k, 64);
        for (int q = q0; q < q1; q++) {
            const char *pw = pk + (size_t)q * p24_panel_bytes(K);
            for (int b = 0; b < nb; b++) {
                int mr = m1 - (m0 + 8 * b) < 8 ? m1 - (m0 + 8 * b) : 8;
                P24_TILES[mr](y + (size_t)(m0 + 8 * b) * ldy + (size_t)q * P24_ROWS, ldy, xil + (size_t)b * blk, pw, K, add);
            }
        }
    }
    return 0;
}

AI __m512 exp_v(__m512 x) { return td_exp512(x); }

#ifndef ATT_PF
#define ATT_PF 8 /* att_values_part: V rows prefetched this many keys ahead */
#endif

/* Attention in blocks of qb queries (1, 2 or 4) that share every K and V load.
 * Each query's scores, softmax and output are computed with exactly the
 * operations of attend_p for that query alone (see kernels.h), so neither qb nor
 * the other queries of the block change its bits. sc: qb rows of ss >= n floats. */

/* Scores of the qb queries against keys [0, n) (n = the block's largest n_keys;
 * a query's scores past its own n_keys are computed and ignored). Blocks of
 * 16/qb keys x qb queries fill the 16 accumulators of one fold16x16: lane
 * b*kb + u = fold16 of (query b, key j0 + u) — the D16 dot of attend_p. */
AI void att_scores(int qb, int dt, float *sc, int ss, const float *q, int ldq, const char *K, size_t rs, int hd,
                   int n, float scale, const char *pf, size_t pfn) {
    const int kb = 16 / qb;
    const size_t rowb = eoff(dt, (size_t)hd);
    int j0 = 0;
    td_pf_stream ps = td_pf_begin(pf, pfn, n / kb);
    if ((hd & 15) == 0)
        for (; j0 + kb <= n; j0 += kb) {
            td_pf_step(&ps);
            __m512 acc[16];
#pragma GCC unroll 16
            for (int u = 0; u < 16; u++) acc[u] = _mm512_setzero_ps();
            for (int d = 0; d < hd; d += 16) {
                __m512 qv[4];
#pragma GCC unroll 4
                for (int b = 0; b < qb; b++) {
                    qv[b] = _mm512_loadu_ps(q + (size_t)b * ldq + d);
                    __asm__("" : "+v"(qv[b])); /* keep in a register: GCC would fold the load into every FMA */
                }
                const char *kr = K + (size_t)j0 * rs;
                if (d == 0 && !pf) /* without a stream: the block after next (0.6B shape, T=8: ~1-2% faster) */
                    for (int u = 2 * kb; u < 3 * kb && j0 + u < n; u++)
                        for (size_t off = 0; off < rowb; off += 64) _mm_prefetch(kr + (size_t)u * rs + off, _MM_HINT_T0);
#pragma GCC unroll 16
                for (int u = 0; u < kb; u++) {
                    __m512 kv = ldw(kr + (size_t)u * rs, d, dt);
                    __asm__("" : "+v"(kv));
#pragma GCC unroll 4
                    for (int b = 0; b < qb; b++) acc[b * kb + u] = _mm512_fmadd_ps(qv[b], kv, acc[b * kb + u]);
                }
            }
            __m512 r = _mm512_mul_ps(fold16x16(acc), _mm512_set1_ps(scale));
#pragma GCC unroll 4
            for (int b = 0; b < qb; b++) /* lanes b*kb .. b*kb+kb-1 -> sc[b*ss + j0 ..] */
                _mm512_mask_storeu_ps(sc + (size_t)b * ss + j0 - b * kb, (__mmask16)(tailmask(kb) << (b * kb)), r);
        }
    for (; j0 < n; j0++)
        for (int b = 0; b < qb; b++)
            sc[(size_t)b * ss + j0] = dot_v(q + (size_t)b * ldq, K + (size_t)j0 * rs, dt, hd) * scale;
}

/* Softmax of one query's n scores in place: e_j = exp(s_j - max), then
 * p_j = e_j * (1 / D16 sum) — the very product attend_p forms before each
 * value fma, taken here once per key (a vector multiply rounds as the scalar
 * one does), so att_values_part reads p_j and broadcasts it straight into its
 * fmas instead of forming it again for every 64 dimensions. */
static void att_softmax(float *sc, int n) {
    __m512 vm = _mm512_set1_ps(-INFINITY);
    int j = 0;
    for (; j + 16 <= n; j += 16) vm = _mm512_max_ps(_mm512_loadu_ps(sc + j), vm);
    float mx = _mm512_reduce_max_ps(vm); /* max is exact and order-free */
    for (; j < n; j++) mx = sc[j] > mx ? sc[j] : mx;
    __m512 vmx = _mm512_set1_ps(mx), acc = _mm512_setzero_ps();
    for (j = 0; j + 16 <= n; j += 16) {
        __m512 e = exp_v(_mm512_sub_ps(_mm512_loadu_ps(sc + j), vmx));
        _mm512_storeu_ps(sc + j, e);
        acc = _mm512_add_ps(acc, e);
    }
    if (j < n) {
        __mmask16 m = tailmask(n - j);
        __m512 e = _mm512_maskz_mov_ps(m, exp_v(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, sc + j), vmx)));
        _mm512_mask_storeu_ps(sc + j, m, e);
        acc = _mm512_add_ps(acc, e);
    }
    __m512 inv = _mm512_set1_ps(1.0f / fold16(acc));
    for (j = 0; j + 16 <= n; j += 16) _mm512_storeu_ps(sc + j, _mm512_mul_ps(_mm512_loadu_ps(sc + j), inv));
    if (j < n) {
        __mmask16 m = tailmask(n - j);
        _mm512_mask_storeu_ps(sc + j, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, sc + j), inv));
    }
}

/* A query's own keys [ja, jb) past those its block shares, into its running
 * sums a[0 .. nv): a[v] += p_j V_j[d0 + 16v ..] in key order, each vector loaded
 * whole (mk NULL) or under mk[v] (att_values_part's two widths of a pass). */
AI void att_own_keys(int dt, int nv, const __mmask16 *mk, __m512 *a, const float *scb, const char *V, size_t rs, int d0,
                     int ja, int jb) {
    for (int j = ja; j < jb; j++) {
        __m512 p = _mm512_set1_ps(scb[j]);
        const char *vj = V + (size_t)j * rs;
#pragma GCC unroll 8
        for (int v = 0; v < nv; v++)
            a[v] = _mm512_fmadd_ps(p, mk ? ldwm(vj, d0 + 16 * v, dt, mk[v]) : ldw(vj, d0 + 16 * v, dt), a[v]);
    }
}

/* o_b = sum_j p_bj V_j (p: att_softmax's probabilities) for the qb queries over keys [j0, j1), in j
 * order per query, 64 dimensions (4 vectors, the last masked) at a time — 128 (8 vectors)
 * while they last for one or two queries; the
 * keys all queries attend to are shared, each query then finishes its own
 * (query b takes [j0, min(j1, nk[b]))). Each query's running sums start from
 * zero when j0 == 0, else from o (parked there between calls), so a pass
 * split into key blocks (att_multi) gives the bits of one pass (att_block).
 * pf: V rows before pf may be prefetched ATT_PF keys ahead (0: none); or a
 * stream (pfs, pfn bytes) spread over the first pass's keys. */
AI void att_values_part(int qb, int dt, float *o, int ldo, const float *sc, int ss, const int *nk,
                        const char *V, size_t rs, int hd, int j0, int j1, int pf, const char *pfs, size_t pfn) {
    int je[4], nmin = j1;
    for (int b = 0; b < qb; b++) {
        je[b] = nk[b] < j1 ? nk[b] : j1;
        nmin = je[b] < nmin ? je[b] : nmin;
    }
    int d0 = 0;
    td_pf_stream ps = td_pf_begin(pfs, pfn, nmin - j0); /* issued in the first pass (d0 == 0) */
    if (qb <= 2) /* one or two queries (a decode's GQA pair): whole rows of 128 dimensions, so V is read row by
                    row, not in two strided passes; the same fmas in the same order per dimension */
        for (; d0 + 128 <= hd; d0 += 128) {
            __m512 a[2][8];
#pragma GCC unroll 2
            for (int b = 0; b < qb; b++)
#pragma GCC unroll 8
                for (int v = 0; v < 8; v++) a[b][v] = j0 ? _mm512_loadu_ps(o + (size_t)b * ldo + d0 + 16 * v) : _mm512_setzero_ps();
            for (int j = j0; j < nmin; j++) {
                const char *vj = V + (size_t)j * rs;
                if (!d0) td_pf_step(&ps);
                if (j + ATT_PF < pf)
                    for (size_t off = 0; off < eoff(dt, 128); off += 64) _mm_prefetch(vj + ATT_PF * rs + eoff(dt, (size_t)d0) + off, _MM_HINT_T0);
                __m512 vv[8];
#pragma GCC unroll 8
                for (int v = 0; v < 8; v++) {
                    vv[v] = ldw(vj, d0 + 16 * v, dt);
                    __asm__("" : "+v"(vv[v])); /* one load each, shared by the queries */
                }
#pragma GCC unroll 2
                for (int b = 0; b < qb; b++) {
                    __m512 p = _mm512_set1_ps(sc[(size_t)b * ss + j]);
#pragma GCC unroll 8
                    for (int v = 0; v < 8; v++) a[b][v] = _mm512_fmadd_ps(p, vv[v], a[b][v]);
                }
            }
#pragma GCC unroll 2
            for (int b = 0; b < qb; b++) {
                att_own_keys(dt, 8, NULL, a[b], sc + (size_t)b * ss, V, rs, d0, nmin > j0 ? nmin : j0, je[b]);
#pragma GCC unroll 8
                for (int v = 0; v < 8; v++) _mm512_storeu_ps(o + (size_t)b * ldo + d0 + 16 * v, a[b][v]);
            }
        }
    for (; d0 < hd; d0 += 64) {
        int rem = hd - d0;
        int nb = rem >= 64 ? 4 : (rem + 15) / 16;
        int last = rem - 16 * (nb - 1);
        __mmask16 mk[4];
        for (int v = 0; v < 4; v++) mk[v] = v < nb - 1 ? (__mmask16)0xFFFF : v == nb - 1 ? (last >= 16 ? (__mmask16)0xFFFF : tailmask(last)) : 0;
        __m512 a[4][4];
#pragma GCC unroll 4
        for (int b = 0; b < qb; b++)
#pragma GCC unroll 4
            for (int v = 0; v < 4; v++)
                a[b][v] = j0 && v < nb ? _mm512_maskz_loadu_ps(mk[v], o + (size_t)b * ldo + d0 + 16 * v) : _mm512_setzero_ps();
        if (nb == 4 && mk[3] == 0xFFFF) {
            for (int j = j0; j < nmin; j++) {
                const char *vj = V + (size_t)j * rs;
                if (!d0) td_pf_step(&ps);
                if (j + ATT_PF < pf)
                    for (size_t off = 0; off < eoff(dt, 64); off += 64) _mm_prefetch(vj + ATT_PF * rs + eoff(dt, (size_t)d0) + off, _MM_HINT_T0);
                __m512 v0 = ldw(vj, d0, dt), v1 = ldw(vj, d0 + 16, dt), v2 = ldw(vj, d0 + 32, dt),
                       v3 = ldw(vj, d0 + 48, dt);
                __asm__("" : "+v"(v0), "+v"(v1), "+v"(v2), "+v"(v3)); /* one load each, shared by the queries */
#pragma GCC unroll 4
                for (int b = 0; b < qb; b++) {
                    __m512 p = _mm512_set1_ps(sc[(size_t)b * ss + j]);
                    a[b][0] = _mm512_fmadd_ps(p, v0, a[b][0]);
                    a[b][1] = _mm512_fmadd_ps(p, v1, a[b][1]);
                    a[b][2] = _mm512_fmadd_ps(p, v2, a[b][2]);
                    a[b][3] = _mm512_fmadd_ps(p, v3, a[b][3]);
                }
            }
        } else {
            for (int j = j0; j < nmin; j++) {
                const char *vj = V + (size_t)j * rs;
                if (!d0) td_pf_step(&ps);
#pragma GCC unroll 4
                for (int v = 0; v < 4; v++) {
                    if (v >= nb) break;
                    __m512 vv = ldwm(vj, d0 + 16 * v, dt, mk[v]);
                    __asm__("" : "+v"(vv));
#pragma GCC unroll 4
                    for (int b = 0; b < qb; b++)
                        a[b][v] = _mm512_fmadd_ps(_mm512_set1_ps(sc[(size_t)b * ss + j]), vv, a[b][v]);
                }
            }
        }
#pragma GCC unroll 4
        for (int b = 0; b < qb; b++) {
            att_own_keys(dt, nb, mk, a[b], sc + (size_t)b * ss, V, rs, d0, nmin > j0 ? nmin : j0, je[b]);
            float *ob = o + (size_t)b * ldo + d0;
#pragma GCC unroll 4
            for (int v = 0; v < 4; v++)
                if (v < nb) _mm512_mask_storeu_ps(ob + 16 * v, mk[v], a[b][v]);
        }
    }
}

AI void att_block(int qb, int dt, float *o, int ldo, const float *q, int ldq, const int *nk, const char *K,
                  const char *V, size_t rs, int hd, float scale, float *sc) {
    int n = nk[0];
    for (int b = 1; b < qb; b++) n = nk[b] > n ? nk[b] : n;
    att_scores(qb, dt, sc, n, q, ldq, K, rs, hd, n, scale, NULL, 0);
    int nmin = nk[0];
    for (int b = 0; b < qb; b++) {
        att_softmax(sc + (size_t)b * n, nk[b]);
        nmin = nk[b] < nmin ? nk[b] : nmin;
    }
    att_values_part(qb, dt, o, ldo, sc, n, nk, V, rs, hd, 0, n, nmin, NULL, 0);
}
/* att_block instantiated per block size and K/V dtype (constants, so each
 * variant has its own loads and conversions inlined) */
typedef void (*att_fn)(float *o, int ldo, const float *q, int ldq, const int *nk, const char *K, const char *V,
                       size_t rs, int hd, float scale, float *sc);
#define ATT_INST(QB, DT, SUF)                                                                               \
    static void att_block##QB##_##SUF(float *o, int ldo, const float *q, int ldq, const int *nk, const char *K, \
                                      const char *V, size_t rs, int hd, float scale, float *sc) {          \
        att_block(QB, DT, o, ldo, q, ldq, nk, K, V, rs, hd, scale, sc);                                     \
    }
#define ATT_SET(DT, SUF) ATT_INST(1, DT, SUF) ATT_INST(2, DT, SUF) ATT_INST(3, DT, SUF) ATT_INST(4, DT, SUF)
ATT_SET(TD_DTYPE_F32, f32)
ATT_SET(TD_DTYPE_F16, f16)
ATT_SET(TD_DTYPE_BF16, bf16)
ATT_SET(TD_DTYPE_Q8_0, q8)
#define ATS(SUF) {att_block1_##SUF, att_block2_##SUF, att_block3_##SUF, att_block4_##SUF}
static const att_fn ATT[4][4] = {[TD_DTYPE_F32] = ATS(f32), [TD_DTYPE_F16] = ATS(f16), [TD_DTYPE_BF16] = ATS(bf16),
                                 [TD_DTYPE_Q8_0] = ATS(q8)};

/* Parts of att_multi, instantiated per block size and K/V dtype: the scores of
 * keys [j0, j0 + n) (att_scores on the shifted rows: a score is its D16 dot
 * wherever it falls in a block), and att_values_part. */
typedef void (*att_sc_fn)(float *sc, int ss, const float *q, int ldq, const char *K, size_t rs, int hd, int n,
                          float scale, const char *pf, size_t pfn);
typedef void (*att_pv_fn)(float *o, int ldo, const float *sc, int ss, const int *nk,
                          const char *V, size_t rs, int hd, int j0, int j1, const char *pf, size_t pfn);
#define ATTP_INST(QB, DT, SUF)                                                                                      \
    static void att_sc##QB##_##SUF(float *sc, int ss, const float *q, int ldq, const char *K, size_t rs, int hd,  \
                                   int n, float scale, const char *pf, size_t pfn) {                                \
        att_scores(QB, DT, sc, ss, q, ldq, K, rs, hd, n, scale, pf, pfn);                                           \
    }                                                                                                               \
    static void att_pv##QB##_##SUF(float *o, int ldo, const float *sc, int ss, const int *nk, const char *V,      \
                                   size_t rs, int hd, int j0, int j1, const char *pf, size_t pfn) {                 \
        att_values_part(QB, DT, o, ldo, sc, ss, nk, V, rs, hd, j0, j1, 0, pf, pfn);                                 \
    }
#define ATTP_SET(DT, SUF) ATTP_INST(1, DT, SUF) ATTP_INST(2, DT, SUF) ATTP_INST(3, DT, SUF) ATTP_INST(4, DT, SUF)
ATTP_SET(TD_DTYPE_F32, f32)
ATTP_SET(TD_DTYPE_F16, f16)
ATTP_SET(TD_DTYPE_BF16, bf16)
ATTP_SET(TD_DTYPE_Q8_0, q8)
#define ATSC(SUF) {att_sc1_##SUF, att_sc2_##SUF, att_sc3_##SUF, att_sc4_##SUF}
#define ATPV(SUF) {att_pv1_##SUF, att_pv2_##SUF, att_pv3_##SUF, att_pv4_##SUF}
static const att_sc_fn ATT_SC[4][4] = {[TD_DTYPE_F32] = ATSC(f32), [TD_DTYPE_F16] = ATSC(f16), [TD_DTYPE_BF16] = ATSC(bf16),
                                       [TD_DTYPE_Q8_0] = ATSC(q8)};
static const att_pv_fn ATT_PV[4][4] = {[TD_DTYPE_F32] = ATPV(f32), [TD_DTYPE_F16] = ATPV(f16), [TD_DTYPE_BF16] = ATPV(bf16),
                                       [TD_DTYPE_Q8_0] = ATPV(q8)};

/* The key blocking of att_multi and attend_b32_v: bmax[i / 4] = the largest
 * n_keys of query block i (blocks of 4, the last of fewer); returns the largest
 * of all. *kc = keys a block: about 16 KiB of rows of rowb bytes, a multiple
 * of 16 (so even, and a multiple of every block's 16/qb keys a fold). */
static int att_key_blocks(int nq, const int *nk, size_t rowb, int bmax[TD_ATTEND_QMAX / 4], int *kc) {
    int nmax = 0;
    for (int i = 0; i < nq; i += 4) {
        int qb = nq - i >= 4 ? 4 : nq - i, m = 0;
        for (int b = 0; b < qb; b++) m = nk[i + b] > m ? nk[i + b] : m;
        bmax[i / 4] = m;
        nmax = m > nmax ? m : nmax;
    }
    *kc = (int)(16384 / rowb) & ~15;
    if (*kc < 16) *kc = 16;
    return nmax;
}

/* Up to TD_ATTEND_QMAX queries over one K/V (a T = 8 verify of a GQA-2 model:
 * 16 queries a kv head). Blocks of 4 queries as att_block, but each pass over
 * the keys goes in blocks of about 16 KiB of K (or V) rows, every query block
 * taking its turn on a key block while it sits in L1: the K/V rows come from
 * memory once, not once per 4 queries. Each query's operations are att_block's
 * (scores, softmax, values in key order), so its bits are those of any other
 * blocking, alone or not. */
static void att_multi(float *o, int ldo, const float *q, int ldq, int nq, const int *nk, const char *K,
                      const char *V, int dt, size_t rs, int hd, float scale, float *sc) {
    int bmax[TD_ATTEND_QMAX / 4], kc, nmax = att_key_blocks(nq, nk, eoff(dt, (size_t)hd), bmax, &kc);
    for (int j0 = 0; j0 < nmax; j0 += kc)
        for (int i = 0; i < nq; i += 4) {
            int qb = nq - i >= 4 ? 4 : nq - i, j1 = j0 + kc < bmax[i / 4] ? j0 + kc : bmax[i / 4];
            if (j0 < j1) {
                size_t pfn;
                const char *pf = td_att_pf_slice(K, rs, eoff(dt, (size_t)hd), j0, kc, nmax, i / 4, (nq + 3) / 4, &pfn);
                ATT_SC[dt][qb - 1](sc + (size_t)i * nmax + j0, nmax, q + (size_t)i * ldq, ldq, K + (size_t)j0 * rs, rs, hd,
                                   j1 - j0, scale, pf, pfn);
            }
        }
    for (int b = 0; b < nq; b++) att_softmax(sc + (size_t)b * nmax, nk[b]);
    for (int j0 = 0; j0 < nmax; j0 += kc)
        for (int i = 0; i < nq; i += 4) {
            int qb = nq - i >= 4 ? 4 : nq - i, j1 = j0 + kc < bmax[i / 4] ? j0 + kc : bmax[i / 4];
            if (j0 < j1 || j0 == 0) { /* j0 == 0: a block of queries without keys still writes its zeros */
                size_t pfn;
                const char *pf = td_att_pf_slice(V, rs, eoff(dt, (size_t)hd), j0, kc, nmax, i / 4, (nq + 3) / 4, &pfn);
                ATT_PV[dt][qb - 1](o + (size_t)i * ldo, ldo, sc + (size_t)i * nmax, nmax, nk + i, V, rs, hd, j0,
                                   j1 > j0 ? j1 : j0, pf, pfn);
            }
        }
}

static void attend_v(float *o, int ldo, const float *q, int ldq, int nq, const int *n_keys, const char *K,
                     const char *V, int dt, int ldkv, int hd, float scale, float *sc) {
    const size_t rs = eoff(dt, (size_t)ldkv);
    for (int i = 0; i < nq;) {
        if (nq - i > 4) { /* several blocks of queries share each pass over the keys */
            int n = nq - i < TD_ATTEND_QMAX ? nq - i : TD_ATTEND_QMAX;
            att_multi(o + (size_t)i * ldo, ldo, q + (size_t)i * ldq, ldq, n, n_keys + i, K, V, dt, rs, hd, scale, sc);
            i += n;
            continue;
        }
        int qb = nq - i; /* 3: a GQA group of 3 reads its K/V once */
        ATT[dt][qb - 1](o + (size_t)i * ldo, ldo, q + (size_t)i * ldq, ldq, n_keys + i, K, V, rs, hd, scale, sc);
        i += qb;
    }
}

/* The A32 order on vdpbf16ps (kernels.h, td_attend_b32), queries in blocks of
 * qb <= 4 that share each K and V load, several blocks taking turns on each
 * block of about 16 KiB of K (then V) rows while it sits in L1, as att_multi
 * does. Scores: blocks of 16/qb keys x qb queries, 32 dimensions a step (hd a
 * multiple of 32), one fold16x16 — each lane the B32 dot of dotb_p. Values:
 * each pair of keys (2m, 2m + 1) is interleaved by vpunpck{l,h}wd into lanes of
 * (V_2m[d], V_2m+1[d]), which vdpbf16ps takes with the broadcast pair (p_2m,
 * p_2m+1): lane for lane dp_lane, on dimensions in the unpacks' order, parked
 * in o in that order between key blocks and put back at the end. */
TBF AI void a32_scores(int qb, float *sc, int ss, const uint16_t *q, int ldq, const uint16_t *K, size_t ldkv, int hd,
                       int n, const char *pf, size_t pfn) {
    const int kb = 16 / qb;
    int j0 = 0;
    td_pf_stream ps = td_pf_begin(pf, pfn, n / kb);
    for (; j0 + kb <= n; j0 += kb) {
        td_pf_step(&ps);
        __m512 acc[16];
#pragma GCC unroll 16
        for (int u = 0; u < 16; u++) acc[u] = _mm512_setzero_ps();
        for (int d = 0; d < hd; d += 32) {
            __m512i qv[4];
#pragma GCC unroll 4
            for (int b = 0; b < qb; b++) {
                qv[b] = _mm512_loadu_si512(q + (size_t)b * ldq + d);
                __asm__("" : "+v"(qv[b]));
            }
#pragma GCC unroll 16
            for (int u = 0; u < kb; u++) {
                __m512i kv = _mm512_loadu_si512(K + (size_t)(j0 + u) * ldkv + d);
                __asm__("" : "+v"(kv));
#pragma GCC unroll 4
                for (int b = 0; b < qb; b++)
                    acc[b * kb + u] = _mm512_dpbf16_ps(acc[b * kb + u], (__m512bh)qv[b], (__m512bh)kv);
            }
        }
        __m512 r = fold16x16(acc);
#pragma GCC unroll 4
        for (int b = 0; b < qb; b++)
            _mm512_mask_storeu_ps(sc + (size_t)b * ss + j0 - b * kb, (__mmask16)(tailmask(kb) << (b * kb)), r);
    }
    for (; j0 < n; j0++)
        for (int b = 0; b < qb; b++) {
            __m512 acc = _mm512_setzero_ps();
            for (int d = 0; d < hd; d += 32)
                acc = _mm512_dpbf16_ps(acc, (__m512bh)_mm512_loadu_si512(q + (size_t)b * ldq + d),
                                       (__m512bh)_mm512_loadu_si512(K + (size_t)j0 * ldkv + d));
            sc[(size_t)b * ss + j0] = fold16(acc);
        }
}

/* Keys [j0, j1) (j0 even; j1 even unless it ends every query's keys) of the
 * value sums of qb queries, dimensions [d0, d0 + 32 ND): from zero when j0 == 0,
 * else from o (parked there in the unpacks' order). Pairs below every query's
 * end are shared; then each query's own, row j + 1 read only when j + 1 < its
 * n_keys (else zeros). */
TBF AI void a32_values(int qb, int ND, float *o, int ldo, const uint16_t *p, int ps, const int *nk, const uint16_t *V,
                       size_t ldkv, int d0, int j0, int j1, const char *pf, size_t pfn) {
    __m512 a[4][8];
    int je[4], jsh = j1;
    for (int b = 0; b < qb; b++) {
        je[b] = nk[b] < j1 ? nk[b] : j1;
        jsh = je[b] < jsh ? je[b] : jsh;
    }
    jsh &= ~1;
    td_pf_stream pst = td_pf_begin(pf, pfn, (jsh - j0) / 2);
#pragma GCC unroll 4
    for (int b = 0; b < qb; b++)
#pragma GCC unroll 8
        for (int v = 0; v < 2 * ND; v++)
            a[b][v] = j0 ? _mm512_loadu_ps(o + (size_t)b * ldo + d0 + 16 * v) : _mm512_setzero_ps();
    for (int j = j0; j < jsh; j += 2) {
        const uint16_t *x = V + (size_t)j * ldkv + d0, *y = x + ldkv;
        td_pf_step(&pst);
        __m512i w[8];
#pragma GCC unroll 4
        for (int c = 0; c < ND; c++) {
            __m512i xv = _mm512_loadu_si512(x + 32 * c), yv = _mm512_loadu_si512(y + 32 * c);
            w[2 * c] = _mm512_unpacklo_epi16(xv, yv);
            w[2 * c + 1] = _mm512_unpackhi_epi16(xv, yv);
        }
#pragma GCC unroll 4
        for (int b = 0; b < qb; b++) {
            __m512i pp = _mm512_set1_epi32(*(const int32_t *)(const void *)(p + (size_t)b * ps + j));
#pragma GCC unroll 8
            for (int v = 0; v < 2 * ND; v++) a[b][v] = _mm512_dpbf16_ps(a[b][v], (__m512bh)pp, (__m512bh)w[v]);
        }
    }
#pragma GCC unroll 4
    for (int b = 0; b < qb; b++) {
        for (int j = jsh > j0 ? jsh : j0; j < je[b]; j += 2) { /* this query's own pairs */
            const uint16_t *x = V + (size_t)j * ldkv + d0, *y = x + ldkv;
            int two = j + 1 < nk[b];
            uint32_t pr = p[(size_t)b * ps + j] | (two ? (uint32_t)p[(size_t)b * ps + j + 1] << 16 : 0u);
            __m512i pp = _mm512_set1_epi32((int32_t)pr);
#pragma GCC unroll 4
            for (int c = 0; c < ND; c++) {
                __m512i xv = _mm512_loadu_si512(x + 32 * c), yv = two ? _mm512_loadu_si512(y + 32 * c) : _mm512_setzero_si512();
                a[b][2 * c] = _mm512_dpbf16_ps(a[b][2 * c], (__m512bh)pp, (__m512bh)_mm512_unpacklo_epi16(xv, yv));
                a[b][2 * c + 1] = _mm512_dpbf16_ps(a[b][2 * c + 1], (__m512bh)pp, (__m512bh)_mm512_unpackhi_epi16(xv, yv));
            }
        }
#pragma GCC unroll 8
        for (int v = 0; v < 2 * ND; v++) _mm512_storeu_ps(o + (size_t)b * ldo + d0 + 16 * v, a[b][v]);
    }
}

/* a32_scores and a32_values (over all of hd) instantiated per block size */
#define A32_INST(QB)                                                                                               \
    TBF static void a32_sc##QB(float *sc, int ss, const uint16_t *q, int ldq, const uint16_t *K, size_t ldkv,   \
                               int hd, int n, const char *pf, size_t pfn) {                                       \
        a32_scores(QB, sc, ss, q, ldq, K, ldkv, hd, n, pf, pfn);                                                   \
    }                                                                                                              \
    TBF static void a32_pv##QB(float *o, int ldo, const uint16_t *p, int ps, const int *nk, const uint16_t *V,    \
                               size_t ldkv, int hd, int j0, int j1, const char *pf, size_t pfn) {                 \
        int d0 = 0; /* the first pass over the rows prefetches */                                                 \
        if (QB <= 2) /* whole rows of 128 dimensions (the registers allow it) */                                   \
            for (; d0 + 128 <= hd; d0 += 128) a32_values(QB, 4, o, ldo, p, ps, nk, V, ldkv, d0, j0, j1, pf, d0 ? 0 : pfn); \
        for (; d0 + 64 <= hd; d0 += 64) a32_values(QB, 2, o, ldo, p, ps, nk, V, ldkv, d0, j0, j1, pf, d0 ? 0 : pfn);    \
        if (d0 < hd) a32_values(QB, 1, o, ldo, p, ps, nk, V, ldkv, d0, j0, j1, pf, d0 ? 0 : pfn);                       \
    }
A32_INST(1)
A32_INST(2)
A32_INST(3)
A32_INST(4)
typedef void (*a32_sc_fn)(float *sc, int ss, const uint16_t *q, int ldq, const uint16_t *K, size_t ldkv, int hd, int n,
                          const char *pf, size_t pfn);
typedef void (*a32_pv_fn)(float *o, int ldo, const uint16_t *p, int ps, const int *nk, const uint16_t *V, size_t ldkv,
                          int hd, int j0, int j1, const char *pf, size_t pfn);
static const a32_sc_fn A32_SC[4] = {a32_sc1, a32_sc2, a32_sc3, a32_sc4};
static const a32_pv_fn A32_PV[4] = {a32_pv1, a32_pv2, a32_pv3, a32_pv4};
/* td_attend_b32 on vdpbf16ps: sc and p rows ps apart (the largest n_keys,
 * rounded up to even) */
TBF static void attend_b32_v(float *o, int ldo, const uint16_t *q, int ldq, int nq, const int *nk, const uint16_t *K,
                             const uint16_t *V, size_t ldkv, int hd, float *sc, uint16_t *p) {
    int bmax[TD_ATTEND_QMAX / 4], kc, nmax = att_key_blocks(nq, nk, 2 * (size_t)hd, bmax, &kc), ps = (nmax + 1) & ~1;
    for (int j0 = 0; j0 < nmax; j0 += kc)
        for (int i = 0; i < nq; i += 4) {
            int qb = nq - i >= 4 ? 4 : nq - i, j1 = j0 + kc < bmax[i / 4] ? j0 + kc : bmax[i / 4];
            if (j0 < j1) {
                size_t pfn;
                const char *pf = td_att_pf_slice((const char *)K, 2 * ldkv, 2 * (size_t)hd, j0, kc, nmax, i / 4, (nq + 3) / 4, &pfn);
                A32_SC[qb - 1](sc + (size_t)i * ps + j0, ps, q + (size_t)i * ldq, ldq, K + (size_t)j0 * ldkv, ldkv, hd,
                               j1 - j0, pf, pfn);
            }
        }
    for (int b = 0; b < nq; b++) {
        att_softmax(sc + (size_t)b * ps, nk[b]);
        td_from_f32(p + (size_t)b * ps, sc + (size_t)b * ps, TD_DTYPE_BF16, (size_t)nk[b]);
    }
    for (int j0 = 0; j0 < nmax; j0 += kc)
        for (int i = 0; i < nq; i += 4) {
            int qb = nq - i >= 4 ? 4 : nq - i, j1 = j0 + kc < bmax[i / 4] ? j0 + kc : bmax[i / 4];
            if (j0 < j1) {
                size_t pfn;
                const char *pf = td_att_pf_slice((const char *)V, 2 * ldkv, 2 * (size_t)hd, j0, kc, nmax, i / 4, (nq + 3) / 4, &pfn);
                A32_PV[qb - 1](o + (size_t)i * ldo, ldo, p + (size_t)i * ps, ps, nk + i, V, ldkv, hd, j0, j1, pf, pfn);
            }
        }
    const __m512i lo = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
    const __m512i hi = _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31);
    for (int b = 0; b < nq; b++) /* the unpacks' order back to dimension order */
        for (int d = 0; d < hd; d += 32) {
            float *ob = o + (size_t)b * ldo + d;
            __m512 x = _mm512_loadu_ps(ob), y = _mm512_loadu_ps(ob + 16);
            _mm512_storeu_ps(ob, _mm512_permutex2var_ps(x, lo, y));
            _mm512_storeu_ps(ob + 16, _mm512_permutex2var_ps(x, hi, y));
        }
}
#endif /* TD_HAVE_AVX512 */

/* ---- public entry points -------------------------------------------------- */

#ifdef TD_HAVE_AVX512
#define FAST() (resolve_path() == TD_KPATH_AVX512)
#else
#define FAST() 0
#endif

float td_dot(const float *a, const float *b, int n) {
    AVX2_DO(return td_avx2_dot(a, b, TD_DTYPE_F32, n));
    NEON_DO(return td_neon_dot(a, b, TD_DTYPE_F32, n));
#ifdef TD_HAVE_AVX512
    if (FAST()) return dot_v(a, (const char *)b, TD_DTYPE_F32, n);
#endif
    return dot_p(a, b, TD_DTYPE_F32, n);
}
float td_dot_bf16(const float *a, const uint16_t *w, int n) {
    AVX2_DO(return td_avx2_dot(a, w, TD_DTYPE_BF16, n));
    NEON_DO(return td_neon_dot(a, w, TD_DTYPE_BF16, n));
#ifdef TD_HAVE_AVX512
    if (FAST()) return dot_v(a, (const char *)w, TD_DTYPE_BF16, n);
#endif
    return dot_p(a, w, TD_DTYPE_BF16, n);
}
float td_dot_f16(const float *a, const uint16_t *w, int n) {
    AVX2_DO(return td_avx2_dot(a, w, TD_DTYPE_F16, n));
    NEON_DO(return td_neon_dot(a, w, TD_DTYPE_F16, n));
#ifdef TD_HAVE_AVX512
    if (FAST()) return dot_v(a, (const char *)w, TD_DTYPE_F16, n);
#endif
    return dot_p(a, w, TD_DTYPE_F16, n);
}

void td_to_f32(float *dst, const void *src, int dtype, size_t n) {
    if (dtype == TD_DTYPE_F32) { memcpy(dst, src, n * sizeof(float)); return; }
    if (td_dtype_is_quant(dtype)) { td_dequantize_row(dtype, src, dst, (int64_t)n); return; }
    AVX2_DO(td_avx2_to_f32(dst, src, dtype, n); return);
    size_t i = 0;
#ifdef TD_HAVE_AVX512
    if (FAST()) {
        const char *s = src;
        for (; i + 16 <= n; i += 16) _mm512_storeu_ps(dst + i, ldw(s + i * 2, 0, dtype));
    }
#endif
    for (; i < n; i++) dst[i] = wval(src, i, dtype);
}

void td_matmul(float *y, int ldy, const float *x, int ldx, int M, const void *W, int dtype,
               int K, int n0, int n1, int add) {
    if (M <= 0 || n0 >= n1) return;
    if (td_dtype_is_quant(dtype)) { td_quant_matmul(y, ldy, x, ldx, M, W, dtype, K, n0, n1, add); return; }
    AVX2_DO(td_avx2_matmul(y, ldy, x, ldx, M, W, dtype, K, n0, n1, add); return);
    NEON_DO(td_neon_matmul(y, ldy, x, ldx, M, W, dtype, K, n0, n1, add); return);
#ifdef TD_HAVE_AVX512
    if (FAST()) { matmul_v(y, ldy, x, ldx, M, W, dtype, K, n0, n1, add); return; }
#endif
    matmul_p(y, ldy, x, ldx, M, W, dtype, K, n0, n1, add);
}

int td_argmax(const float *x, int n) {
    int b = 0, j = 1;
#ifdef TD_HAVE_AVX512
    if (FAST() && n >= 32 && x[0] == x[0]) {
        /* the maximum (vmaxps keeps its second operand when the first is NaN),
         * then the first index that holds it (-0 and +0 tie, as > has them) */
        __m512 vm = _mm512_set1_ps(x[0]);
        for (j = 0; j + 16 <= n; j += 16) vm = _mm512_max_ps(_mm512_loadu_ps(x + j), vm);
        float mx = _mm512_reduce_max_ps(vm);
        for (; j < n; j++) mx = x[j] > mx ? x[j] : mx;
        for (j = 0; j + 16 <= n; j += 16) {
            __mmask16 e = _mm512_cmp_ps_mask(_mm512_loadu_ps(x + j), _mm512_set1_ps(mx), _CMP_EQ_OQ);
            if (e) return j + __builtin_ctz(e);
        }
        for (; j < n; j++) if (x[j] == mx) return j;
        return 0; /* not reached */
    }
#endif
    for (; j < n; j++) if (x[j] > x[b]) b = j;
    return b;
}

size_t td_panel16_elems(int K, int N) { return (size_t)((N + 15) / 16) * 16 * (size_t)K; }

void td_panel16_pack(float *wp, const void *W, int dtype, int K, int N) {
    memset(wp, 0, sizeof(float) * td_panel16_elems(K, N));
    for (int n = 0; n < N; n++)
        for (int k = 0; k < K; k++) wp[((size_t)(n / 16) * K + k) * 16 + n % 16] = wval(W, (size_t)n * K + k, dtype);
}

void td_panel16_addmv(float *y, const float *wp, const float *x, int K, int N) {
    int n = 0;
#ifdef TD_HAVE_AVX512
    if (FAST())
        for (; n < N; n += 16) {
            const float *w = wp + (size_t)(n / 16) * K * 16;
            __mmask16 m = N - n >= 16 ? (__mmask16)0xFFFF : tailmask(N - n);
            __m512 acc = _mm512_maskz_loadu_ps(m, y + n);
            for (int k = 0; k < K; k++) acc = _mm512_fmadd_ps(_mm512_set1_ps(x[k]), _mm512_loadu_ps(w + (size_t)k * 16), acc);
            _mm512_mask_storeu_ps(y + n, m, acc);
        }
#endif
    for (; n < N; n++) {
        const float *w = wp + (size_t)(n / 16) * K * 16 + n % 16;
        float acc = y[n];
        for (int k = 0; k < K; k++) acc = fmaf(x[k], w[(size_t)k * 16], acc);
        y[n] = acc;
    }
}

void td_matmul_rows(float *y, int ldy, const float *x, int M, const void *W, int dtype,
                    int K, int n0, int n1, float *wbuf) {
    (void)wbuf;
    td_matmul(y, ldy, x, K, M, W, dtype, K, n0, n1, 0);
}

/* A speed choice by CPU vendor (intel: 1 for Intel's cores, 0 for AMD's), read
 * once into *slot (-1: not chosen yet); the environment variable env = 0|1
 * overrides it. */
static int vendor_knob(_Atomic int *slot, const char *env, int intel) {
    int r = atomic_load_explicit(slot, memory_order_relaxed);
    if (r < 0) {
        const char *e = getenv(env);
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
        __builtin_cpu_init();
        r = e && *e ? strcmp(e, "0") != 0 : intel ? __builtin_cpu_is("intel") != 0 : __builtin_cpu_is("amd") != 0;
#else
        (void)intel;
        r = e && *e && strcmp(e, "0") != 0;
#endif
        atomic_store_explicit(slot, r, memory_order_relaxed);
    }
    return r;
}
static _Atomic int hw_stream_choice = -1, bf16_fma_choice = -1, hw_stream_set = 0, hw_stream_env = -1;
int td_kernels_hw_stream(void) { return vendor_knob(&hw_stream_choice, "TD_HW_STREAM", 0); }
void td_kernels_set_hw_stream(int v) {
    atomic_store_explicit(&hw_stream_set, v >= 0, memory_order_relaxed);
    atomic_store_explicit(&hw_stream_choice, v < 0 ? -1 : v != 0, memory_order_relaxed);
}
int td_kernels_hw_stream_fixed(void) {
    if (atomic_load_explicit(&hw_stream_set, memory_order_relaxed)) return 1;
    int e = atomic_load_explicit(&hw_stream_env, memory_order_relaxed);
    if (e < 0) {
        const char *v = getenv("TD_HW_STREAM");
        atomic_store_explicit(&hw_stream_env, e = v && *v, memory_order_relaxed);
    }
    return e;
}
int td_kernels_bf16_fma(void) { return vendor_knob(&bf16_fma_choice, "TD_BF16_FMA", 1); }
void td_kernels_set_bf16_fma(int v) { atomic_store_explicit(&bf16_fma_choice, v < 0 ? -1 : v != 0, memory_order_relaxed); }

void td_matmul_bf16a(float *y, int ldy, const uint16_t *x, int ldx, int M, const uint16_t *W, int K, int n0, int n1,
                     int add) {
    td_matmul_bf16a_stream(y, ldy, x, ldx, M, W, K, n0, n1, add, 0);
}

void td_matmul_bf16a_stream(float *y, int ldy, const uint16_t *x, int ldx, int M, const uint16_t *W, int K, int n0,
                            int n1, int add, int stream) {
    td_matmul_bf16a_pf(y, ldy, x, ldx, M, W, K, n0, n1, add, stream, -1);
}

void td_matmul_bf16a_pf(float *y, int ldy, const uint16_t *x, int ldx, int M, const uint16_t *W, int K, int n0, int n1,
                        int add, int stream, int hw) {
    if (M <= 0 || n0 >= n1) return;
    (void)stream; /* read only by the AVX-512 tiles */
    (void)hw;
#ifdef TD_HAVE_AVX512
    if (FAST()) {
        int dp = bf16_ok();
        if ((!dp || (M >= 5 && td_kernels_bf16_fma())) && matmul_bm(y, ldy, x, ldx, M, W, K, n0, n1, add) == 0)
            return;
        if (dp) {
            matmul_bv(y, ldy, x, ldx, M, W, K, n0, n1, add, stream && (hw < 0 ? td_kernels_hw_stream() : hw));
            return;
        }
    }
#endif
#ifdef TD_HAVE_AVX2_PATH
    /* AVX2 (or AVX-512 without its BF16 extension: every such CPU has AVX2) */
    if (resolve_path() != TD_KPATH_PORTABLE) { td_avx2_matmul_bf16a(y, ldy, x, ldx, M, W, K, n0, n1, add); return; }
#endif
    matmul_bp(y, ldy, x, ldx, M, W, K, n0, n1, add);
}

int td_kernels_bf16_native(void) {
#ifdef TD_HAVE_AVX512
    return FAST() && bf16_ok();
#else
    return 0;
#endif
}

/* ---- the P24 layout (kernels.h) ------------------------------------------ */
#define P24_MAGIC 0x34325042u /* "BP24" */
typedef struct { uint32_t magic, pad; int64_t n, k; char rest[40]; } p24_head; /* the 64 bytes before the panels */

int td_bf16p_packable(int64_t N, int64_t K) { return K >= 32 && K % 32 == 0 && K <= (1 << 20) && N >= TD_P24_ROWS && N <= (1 << 24); }

size_t td_bf16p_bytes(int64_t N, int64_t K) {
    return td_bf16p_packable(N, K) ? sizeof(p24_head) + (size_t)(N / TD_P24_ROWS) * TD_P24_ROWS * (size_t)K * 2 : 0;
}

void td_bf16p_pack(void *dst, const uint16_t *W, int64_t N, int64_t K) {
    p24_head h = {P24_MAGIC, 0, N, K, {0}};
    memcpy(dst, &h, sizeof h);
    char *out = (char *)dst + sizeof h;
    for (int64_t q = 0; q < N / TD_P24_ROWS; q++)
        for (int64_t kb0 = 0; kb0 < K; kb0 += TD_P24_KB) {
            int64_t S = (K - kb0 < TD_P24_KB ? K - kb0 : TD_P24_KB) / 32;
            for (int g = 0; g < TD_P24_ROWS / 3; g++)
                for (int64_t st = 0; st < S; st++)
                    for (int j = 0; j < 3; j++) {
                        const uint16_t *src = W + (size_t)(q * TD_P24_ROWS + g * 3 + j) * (size_t)K + (size_t)(kb0 + st * 32);
                        memcpy(out, src, 64);
                        out += 64;
                    }
        }
}

int td_bf16p_check(const void *pk, int64_t N, int64_t K) {
    if (!pk) return 0;
    p24_head h;
    memcpy(&h, pk, sizeof h);
    return h.magic == P24_MAGIC && h.n == N && h.k == K;
}

static _Atomic int p24_choice = -1, p24_env = -1; /* -1: TD_P24 (default on), read once into p24_env */
void td_kernels_set_p24(int v) { atomic_store_explicit(&p24_choice, v < 0 ? -1 : v != 0, memory_order_relaxed); }

int td_kernels_p24(void) {
#ifdef TD_HAVE_AVX512
    int on = atomic_load_explicit(&p24_choice, memory_order_relaxed);
    if (on < 0 && (on = atomic_load_explicit(&p24_env, memory_order_relaxed)) < 0) { /* asked per product: no getenv each time */
        const char *e = getenv("TD_P24");
        on = !(e && *e && !strcmp(e, "0"));
        atomic_store_explicit(&p24_env, on, memory_order_relaxed);
    }
    return on && FAST() && bf16_ok() && !td_kernels_bf16_fma();
#else
    return 0;
#endif
}

void td_matmul_bf16p(float *y, int ldy, const uint16_t *x, int ldx, int M, const void *pk, const uint16_t *W, int K,
                     int N, int n0, int n1, int add, int stream, int hw) {
    if (M <= 0 || n0 >= n1) return;
#ifdef TD_HAVE_AVX512
    if (td_kernels_p24() && td_bf16p_check(pk, N, K) && n1 <= N) {
        int qa = (n0 + TD_P24_ROWS - 1) / TD_P24_ROWS, qb = (n1 < N / TD_P24_ROWS * TD_P24_ROWS ? n1 : N / TD_P24_ROWS * TD_P24_ROWS) / TD_P24_ROWS;
        if (qa < qb && matmul_p24(y, ldy, x, ldx, M, (const char *)pk + sizeof(p24_head), K, qa, qb, add) == 0) {
            /* the rows outside whole panels: the plain tiles (the same bits) */
            td_matmul_bf16a_pf(y, ldy, x, ldx, M, W, K, n0, qa * TD_P24_ROWS, add, stream, hw);
            td_matmul_bf16a_pf(y, ldy, x, ldx, M, W, K, qb * TD_P24_ROWS, n1, add, stream, hw);
            return;
        }
    }
#endif
    (void)pk;
    (void)N;
    td_matmul_bf16a_pf(y, ldy, x, ldx, M, W, K, n0, n1, add, stream, hw);
}

/* ---- per-thread scratch (td_thread_scratch) ------------------------------ */
typedef struct { size_t cap; void *p; } scratch_buf;
static pthread_key_t g_key;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static int g_key_ok;
static void scratch_free(void *v) {
    scratch_buf *s = v;
    free(s->p);
    free(s);
}
static void scratch_init(void) { g_key_ok = pthread_key_create(&g_key, scratch_free) == 0; }
void *td_thread_scratch(size_t n) {
    pthread_once(&g_once, scratch_init);
    if (!g_key_ok) return NULL;
    scratch_buf *s = pthread_getspecific(g_key);
    if (!s) {
        if (!(s = calloc(1, sizeof *s))) return NULL;
        if (pthread_setspecific(g_key, s)) { free(s); return NULL; }
    }
    if (s->cap < n) {
        size_t cap = (n + 4095) & ~(size_t)4095;
        void *p = aligned_alloc(64, cap);
        if (!p) return NULL;
        free(s->p);
        s->p = p;
        s->cap = cap;
    }
    return s->p;
}

void td_rmsnorm(float *out, const float *x, const void *w, int dtype, int n, float eps) {
    float ss = td_dot(x, x, n);
    float r = 1.0f / sqrtf(ss / (float)n + eps);
    AVX2_DO(td_avx2_norm_apply(out, x, w, dtype, n, r); return);
    NEON_DO(td_neon_norm_apply(out, x, w, dtype, n, r); return);
    int i = 0;
#ifdef TD_HAVE_AVX512
    if (FAST()) {
        __m512 vr = _mm512_set1_ps(r);
        for (; i + 16 <= n; i += 16)
            _mm512_storeu_ps(out + i, _mm512_mul_ps(ldw(w, i, dtype), _mm512_mul_ps(_mm512_loadu_ps(x + i), vr)));
    }
#endif
    for (; i < n; i++) out[i] = wval(w, (size_t)i, dtype) * (x[i] * r);
}

void td_exp(float *out, const float *x, int n) {
    AVX2_DO(td_avx2_exp(out, x, n); return);
    NEON_DO(td_neon_exp(out, x, n); return);
    int i = 0;
#ifdef TD_HAVE_AVX512
    if (FAST()) {
        for (; i + 16 <= n; i += 16) _mm512_storeu_ps(out + i, exp_v(_mm512_loadu_ps(x + i)));
        if (i < n) {
            __mmask16 m = tailmask(n - i);
            _mm512_mask_storeu_ps(out + i, m, exp_v(_mm512_maskz_loadu_ps(m, x + i)));
            return;
        }
    }
#endif
    for (; i < n; i++) out[i] = exp_p(x[i]);
}

void td_swiglu(float *out, const float *g, const float *u, int n) {
    AVX2_DO(td_avx2_swiglu(out, g, u, n); return);
    NEON_DO(td_neon_swiglu(out, g, u, n); return);
    int i = 0;
#ifdef TD_HAVE_AVX512
    if (FAST()) {
        const __m512 one = _mm512_set1_ps(1.0f);
        for (; i + 16 <= n; i += 16) {
            __m512 gv = _mm512_loadu_ps(g + i);
            __m512 e = exp_v(_mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(gv), _mm512_set1_epi32((int)0x80000000u))));
            _mm512_storeu_ps(out + i, _mm512_mul_ps(_mm512_div_ps(gv, _mm512_add_ps(one, e)), _mm512_loadu_ps(u + i)));
        }
    }
#endif
    for (; i < n; i++) out[i] = (g[i] / (1.0f + exp_p(-g[i]))) * u[i];
}

void td_attend_kv(float *o, int ldo, const float *q, int ldq, int nq, const int *n_keys,
                  const void *K, const void *V, int kv_dtype, int ldkv, int hd, float scale, float *scratch) {
    AVX2_DO(td_avx2_attend(o, ldo, q, ldq, nq, n_keys, K, V, kv_dtype, ldkv, hd, scale, scratch); return);
    if (kv_dtype != TD_DTYPE_Q8_0) /* the NEON path has no q8_0 rows: the portable order serves them */
        NEON_DO(td_neon_attend(o, ldo, q, ldq, nq, n_keys, K, V, kv_dtype, ldkv, hd, scale, scratch); return);
#ifdef TD_HAVE_AVX512
    if (FAST()) { attend_v(o, ldo, q, ldq, nq, n_keys, K, V, kv_dtype, ldkv, hd, scale, scratch); return; }
#endif
    attend_p(o, ldo, q, ldq, nq, n_keys, K, V, kv_dtype, ldkv, hd, scale, scratch);
}

void td_attend_b32(float *o, int ldo, const uint16_t *q, int ldq, int nq, const int *n_keys, const uint16_t *K,
                   const uint16_t *V, int ldkv, int hd, float *sc, uint16_t *p) {
    TD_ASSERT(hd % 32 == 0 && nq <= TD_ATTEND_QMAX);
#ifdef TD_HAVE_AVX512
    if (FAST() && bf16_ok()) {
        attend_b32_v(o, ldo, q, ldq, nq, n_keys, K, V, (size_t)ldkv, hd, sc, p);
        return;
    }
#endif
    attend_b32_p(o, ldo, q, ldq, nq, n_keys, K, V, ldkv, hd, sc, p);
}

void td_attend(float *o, int ldo, const float *q, int ldq, int nq, const int *n_keys,
               const float *K, const float *V, int ldkv, int hd, float scale, float *scratch) {
    td_attend_kv(o, ldo, q, ldq, nq, n_keys, K, V, TD_DTYPE_F32, ldkv, hd, scale, scratch);
}

void td_from_f32(void *dst, const float *src, int dtype, size_t n) {
    if (dtype == TD_DTYPE_F32) { memcpy(dst, src, n * sizeof(float)); return; }
    if (dtype == TD_DTYPE_Q8_0) { /* whole blocks (n a multiple of 32): one quantizer on every path */
        TD_ASSERT(n % 32 == 0);
        td_quantize_row(TD_DTYPE_Q8_0, src, dst, (int64_t)n);
        return;
    }
    uint16_t *d = dst;
    size_t i = 0;
    if (dtype == TD_DTYPE_BF16) { /* integer rounding: one definition for every path */
#ifdef TD_HAVE_AVX512
        if (FAST()) { /* td_f32_to_bf16 on 16 lanes */
            const __m512i one = _mm512_set1_epi32(1), bias = _mm512_set1_epi32(0x7fff), q = _mm512_set1_epi32(0x40);
            const __m512i abs = _mm512_set1_epi32(0x7fffffff), inf = _mm512_set1_epi32(0x7f800000);
            for (; i + 16 <= n; i += 16) {
                __m512i v = _mm512_loadu_si512(src + i), hi = _mm512_srli_epi32(v, 16);
                __m512i r = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(v, bias), _mm512_and_si512(hi, one)), 16);
                __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(v, abs), inf);
                r = _mm512_mask_or_epi32(r, nan, hi, q);
                _mm256_storeu_si256((__m256i *)(d + i), _mm512_cvtepi32_epi16(r));
            }
        }
#endif
        for (; i < n; i++) d[i] = td_f32_to_bf16(src[i]);
        return;
    }
    AVX2_DO(td_avx2_to_f16(d, src, n); return);
#ifdef TD_HAVE_AVX512
    if (FAST()) {
        for (; i + 16 <= n; i += 16)
            _mm256_storeu_si256((__m256i *)(d + i), _mm512_cvtps_ph(_mm512_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
        if (i < n) {
            __mmask16 m = tailmask((int)(n - i));
            _mm256_mask_storeu_epi16(d + i, m, _mm512_cvtps_ph(_mm512_maskz_loadu_ps(m, src + i), _MM_FROUND_TO_NEAREST_INT));
        }
        return;
    }
#endif
    for (; i < n; i++) d[i] = td_f32_to_f16(src[i]);
}

void td_rope(float *v, const float *cs, const float *sn, int hd) {
    int half = hd / 2, i = 0;
    AVX2_DO(td_avx2_rope(v, cs, sn, hd); return);
#ifdef TD_HAVE_AVX512
    if (FAST()) /* the same two products and one subtraction (addition) per lane, rounded as the scalar ones */
        for (; i + 16 <= half; i += 16) {
            __m512 a = _mm512_loadu_ps(v + i), b = _mm512_loadu_ps(v + i + half);
            __m512 c = _mm512_loadu_ps(cs + i), s = _mm512_loadu_ps(sn + i);
            _mm512_storeu_ps(v + i, _mm512_sub_ps(_mm512_mul_ps(a, c), _mm512_mul_ps(b, s)));
            _mm512_storeu_ps(v + i + half, _mm512_add_ps(_mm512_mul_ps(b, c), _mm512_mul_ps(a, s)));
        }
#endif
    for (; i < half; i++) {
        float a = v[i], b = v[i + half];
        v[i] = a * cs[i] - b * sn[i];
        v[i + half] = b * cs[i] + a * sn[i];
    }
}
