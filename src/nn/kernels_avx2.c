/* kernels_avx2 — the AVX2+FMA path: the D16 order of kernels.h on 256-bit registers.
 *
 * A D16 accumulator is a pair of ymm registers (lanes 0-7, 8-15); each lane does
 * the portable path's fmas in the same order, and fold16 adds lo + hi (s8) and
 * then the same tree as the AVX-512 fold. Tails (a length not a multiple of 16)
 * are copied into zeroed 16-element buffers, so the padded lanes perform the
 * portable path's fma(0, 0, acc) / acc + 0. exp: AVX2 has no scalef, so p * 2^n
 * is done as two power-of-two multiplies, n = n1 + n2 with n1 = n >> 1: the first
 * is exact (the product stays normal), the second rounds once, as ldexpf does.
 *
 * Matmul tiles: 1 x 4 outputs for one token (decode), 2 tokens x 3 outputs
 * otherwise (12 accumulators + 2 weight registers of the 16 ymm). The weights of
 * an output are loaded and converted once per 16-step and applied to every
 * token of the tile; the activations come from L1. (Q8_0 / Q4_0 products have
 * their own integer kernels: quant_avx2.c.) bf16 weights take the even/odd
 * tiles instead (matmul_bf16_eo: one shift or AND per 8 weights, activations
 * permuted to match; 2 tokens x 2 outputs with the activations held in registers),
 * with the same lanes and bits; bf16 activations (act_type
 * bf16) the B32 tiles (td_avx2_matmul_bf16a).
 * Attention: queries in blocks of TD_ATTEND_QMAX over L1-sized blocks of keys;
 * scores 4 keys at a time, 8 keys folded together (fold8x8: the D16 fold on
 * shuffled registers). K/V rows may be stored as f32, bf16 or f16
 * (td_attend_kv): each element is widened exactly where it is loaded (ldw8).
 *
 * Compiled with -mavx2 -mfma -mf16c -mno-avx512f (Makefile, this file only) so the
 * code is genuine AVX2 even in a -march=native build on an AVX-512 machine. */
#include "kernels_avx2.h"
#include "kernels.h"

#ifdef TD_HAVE_AVX2_PATH
#if !defined(__AVX2__) || !defined(__FMA__) || !defined(__F16C__)
#error "kernels_avx2.c needs -mavx2 -mfma -mf16c (the Makefile adds them on x86-64)"
#endif
#include "tandem.h"
#include "util/util.h"

#include <immintrin.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#define AI static inline __attribute__((always_inline))

int td_avx2_cpu_ok(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
}

/* fold of one D16 accumulator (lo = lanes 0-7, hi = lanes 8-15) */
AI float fold16(__m256 lo, __m256 hi) {
    __m256 a = _mm256_add_ps(lo, hi);                                              /* s8 */
    __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1)); /* s4 */
    __m128 c = _mm_add_ps(b, _mm_movehl_ps(b, b));                                 /* s2 in lanes 0,1 */
    __m128 d = _mm_add_ss(c, _mm_movehdup_ps(c));                                  /* s2[0] + s2[1] */
    return _mm_cvtss_f32(d);
}

/* The rest of the fold (s4, s2, s) for 8 keys at once: s8[u] holds key u's s8;
 * lane u of the result = the fold of key u, the same additions in the same order. */
AI __m256 fold8x8(const __m256 *s8) {
    __m256 c[4], e[2];
#pragma GCC unroll 4
    for (int k = 0; k < 4; k++) /* s4: lanes 0-3 key 2k, lanes 4-7 key 2k+1 */
        c[k] = _mm256_add_ps(_mm256_permute2f128_ps(s8[2 * k], s8[2 * k + 1], 0x20),
                             _mm256_permute2f128_ps(s8[2 * k], s8[2 * k + 1], 0x31));
#pragma GCC unroll 2
    for (int k = 0; k < 2; k++) /* s2: [4k (2 lanes), 4k+2 (2 lanes) | 4k+1, 4k+3] */
        e[k] = _mm256_add_ps(_mm256_shuffle_ps(c[2 * k], c[2 * k + 1], 0x44),
                             _mm256_shuffle_ps(c[2 * k], c[2 * k + 1], 0xEE));
    /* s: [keys 0, 2, 4, 6 | 1, 3, 5, 7] */
    __m256 r = _mm256_add_ps(_mm256_shuffle_ps(e[0], e[1], 0x88), _mm256_shuffle_ps(e[0], e[1], 0xDD));
    return _mm256_permutevar8x32_ps(r, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

/* 8 weights from element k of w (dtype f32, bf16 or f16), exact f32; for a
 * Q8_0 K/V row (k a multiple of 8) the dequantized (float)q * d of its block */
AI __m256 ldw8(const void *w, size_t k, int dt) {
    if (dt == TD_DTYPE_Q8_0) {
        const uint8_t *b = (const uint8_t *)w + k / 32 * 34;
        int16_t h;
        memcpy(&h, b, 2);
        __m256 d = _mm256_cvtph_ps(_mm_set1_epi16(h)); /* exact, as td_f16_to_f32 */
        __m128i q = _mm_loadl_epi64((const __m128i *)(const void *)(b + 2 + k % 32));
        return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)), d);
    }
    if (dt == TD_DTYPE_BF16)
        return _mm256_castsi256_ps(
            _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)((const uint16_t *)w + k))), 16));
    if (dt == TD_DTYPE_F16) return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)w + k)));
    return _mm256_loadu_ps((const float *)w + k);
}

AI size_t esize(int dt) { return dt == TD_DTYPE_F32 ? 4 : 2; }
/* bytes before element k of a K/V row (Q8_0: k a multiple of 32, whole blocks) */
AI size_t eoff(int dt, size_t k) { return dt == TD_DTYPE_Q8_0 ? k / 32 * 34 : k * esize(dt); }

/* n - k (< 16) elements of size esz from p + k*esz into the zeroed 64-byte buf */
AI void pad16(void *buf, const void *p, int k, int n, size_t esz) {
    memset(buf, 0, 64);
    memcpy(buf, (const char *)p + (size_t)k * esz, (size_t)(n - k) * esz);
}

float td_avx2_dot(const float *a, const void *w, int dt, int n) {
    __m256 lo = _mm256_setzero_ps(), hi = lo;
    int k = 0;
    for (; k + 16 <= n; k += 16) {
        lo = _mm256_fmadd_ps(_mm256_loadu_ps(a + k), ldw8(w, (size_t)k, dt), lo);
        hi = _mm256_fmadd_ps(_mm256_loadu_ps(a + k + 8), ldw8(w, (size_t)k + 8, dt), hi);
    }
    if (k < n) {
        float xa[16];
        _Alignas(32) unsigned char wb[64];
        pad16(xa, a, k, n, 4);
        pad16(wb, w, k, n, esize(dt));
        lo = _mm256_fmadd_ps(_mm256_loadu_ps(xa), ldw8(wb, 0, dt), lo);
        hi = _mm256_fmadd_ps(_mm256_loadu_ps(xa + 8), ldw8(wb, 8, dt), hi);
    }
    return fold16(lo, hi);
}

void td_avx2_to_f32(float *dst, const void *src, int dt, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, ldw8(src, i, dt));
    for (; i < n; i++) {
        _Alignas(32) unsigned char b[64] = {0};
        memcpy(b, (const char *)src + i * esize(dt), esize(dt));
        dst[i] = _mm256_cvtss_f32(ldw8(b, 0, dt));
    }
}

/* ---- matmul ---------------------------------------------------------------- */

#define PF_PANELS 2 /* prefetch the weight panel this many tiles ahead */

/* One 16-step of an MR x NR tile: x rows at stride ldx from element k, weight
 * rows at stride wrow (bytes) from element kw. */
AI void tile_step(int MR, int NR, int dt, __m256 (*lo)[4], __m256 (*hi)[4], const float *x, int ldx, int k,
                  const char *w, size_t wrow, int kw) {
#pragma GCC unroll 4
    for (int j = 0; j < NR; j++) {
        __m256 w0 = ldw8(w + j * wrow, (size_t)kw, dt), w1 = ldw8(w + j * wrow, (size_t)kw + 8, dt);
#pragma GCC unroll 4
        for (int i = 0; i < MR; i++) {
            lo[i][j] = _mm256_fmadd_ps(_mm256_loadu_ps(x + (size_t)i * ldx + k), w0, lo[i][j]);
            hi[i][j] = _mm256_fmadd_ps(_mm256_loadu_ps(x + (size_t)i * ldx + k + 8), w1, hi[i][j]);
        }
    }
}

/* The register tile: MR tokens x NR outputs, each a D16 dot over all of K. */
AI void tile(int MR, int NR, int dt, float *y, int ldy, const float *x, int ldx, const char *w, size_t wrow,
             int K, int add) {
    __m256 lo[2][4], hi[2][4];
#pragma GCC unroll 4
    for (int i = 0; i < MR; i++)
#pragma GCC unroll 4
        for (int j = 0; j < NR; j++) lo[i][j] = hi[i][j] = _mm256_setzero_ps();
    const char *pf = w + (size_t)NR * wrow * PF_PANELS;
    int k = 0;
    for (; k + 16 <= K; k += 16) {
#pragma GCC unroll 4
        for (int j = 0; j < NR; j++) _mm_prefetch(pf + j * wrow + (size_t)k * esize(dt), _MM_HINT_T0);
        tile_step(MR, NR, dt, lo, hi, x, ldx, k, w, wrow, k);
    }
    if (k < K) {
        const size_t esz = esize(dt);
        float xb[2][16];
        _Alignas(32) unsigned char wb[4][64];
        for (int i = 0; i < MR; i++) pad16(xb[i], x + (size_t)i * ldx, k, K, 4);
        for (int j = 0; j < NR; j++) pad16(wb[j], w + j * wrow, k, K, esz);
        tile_step(MR, NR, dt, lo, hi, &xb[0][0], 16, 0, (const char *)wb, 64, 0);
    }
#pragma GCC unroll 4
    for (int i = 0; i < MR; i++)
#pragma GCC unroll 4
        for (int j = 0; j < NR; j++) td_avx2_put(y, ldy, i, j, fold16(lo[i][j], hi[i][j]), add);
}

typedef void (*tile_fn)(float *y, int ldy, const float *x, int ldx, const char *w, size_t wrow, int K, int add);
#define TILE_INST(MR, NR, DT, SUF)                                                                      \
    static void tile_##MR##x##NR##_##SUF(float *y, int ldy, const float *x, int ldx, const char *w,     \
                                         size_t wrow, int K, int add) {                                 \
        tile(MR, NR, DT, y, ldy, x, ldx, w, wrow, K, add);                                              \
    }
#define TILE_SET(DT, SUF)                                                                               \
    TILE_INST(1, 1, DT, SUF) TILE_INST(2, 1, DT, SUF) TILE_INST(1, 3, DT, SUF) TILE_INST(2, 3, DT, SUF) \
    TILE_INST(1, 4, DT, SUF)
TILE_SET(TD_DTYPE_F32, f32)
TILE_SET(TD_DTYPE_F16, f16)
TILE_SET(TD_DTYPE_BF16, bf16)

/* t[mr][wide]: mr tokens (1, 2) x 1 output (wide = 0) or 3 outputs (wide = 1) */
typedef struct { tile_fn t[3][2]; tile_fn gemv4; } tile_set;
#define TS(SUF) {{{0, 0}, {tile_1x1_##SUF, tile_1x3_##SUF}, {tile_2x1_##SUF, tile_2x3_##SUF}}, tile_1x4_##SUF}
static const tile_set TILES[3] = {[TD_DTYPE_F32] = TS(f32), [TD_DTYPE_F16] = TS(f16), [TD_DTYPE_BF16] = TS(bf16)};

#define MBLOCK 64 /* tokens whose activations stay in L2 while a weight panel streams */

/* ---- bf16 weights: the even/odd tiles -----------------------------------------
 * A 256-bit load of 16 bf16 weights holds a pair per dword (element 2i in the low
 * half, 2i+1 in the high half), so one shift gives the even elements as f32 (E)
 * and one AND the odd ones (O), without the widening shuffle of ldw8. E lane i is
 * D16 lane 2i and O lane i D16 lane 2i+1 — the same lanes, the same fmas, only
 * held in other registers — so the activations are permuted to match once per
 * call (each 16-block: its 8 even elements, then its 8 odd ones, the last block
 * zero-padded) into this thread's td_thread_scratch, and the fold interleaves E and O
 * back into lanes 0-7 / 8-15 first. The bits are those of tile() above; where no
 * scratch can be had, td_avx2_matmul falls back to it. */

#define EO_MBLOCK 64 /* tokens permuted at a time */

/* rows [0, m) of x (K values each) into xp (ldp floats apart), each 16-block as
 * evens then odds, the last block zero-padded to Kp = K rounded up to 16 */
static void eo_permute(float *xp, int ldp, const float *x, int ldx, int m, int K) {
    const __m256i idx = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7);
    for (int i = 0; i < m; i++) {
        const float *xi = x + (size_t)i * ldx;
        float *pi = xp + (size_t)i * ldp;
        int k = 0;
        for (; k + 16 <= K; k += 16) {
            __m256 a = _mm256_permutevar8x32_ps(_mm256_loadu_ps(xi + k), idx);     /* 0 2 4 6 | 1 3 5 7 */
            __m256 b = _mm256_permutevar8x32_ps(_mm256_loadu_ps(xi + k + 8), idx); /* 8 .. 14 | 9 .. 15 */
            _mm256_store_ps(pi + k, _mm256_permute2f128_ps(a, b, 0x20));
            _mm256_store_ps(pi + k + 8, _mm256_permute2f128_ps(a, b, 0x31));
        }
        if (k < K) {
            float t[16] = {0};
            memcpy(t, xi + k, sizeof(float) * (size_t)(K - k));
            for (int l = 0; l < 8; l++) { pi[k + l] = t[2 * l]; pi[k + 8 + l] = t[2 * l + 1]; }
        }
    }
}

/* E (even lanes) and O (odd lanes) of a D16 accumulator back to the usual fold */
AI float fold_eo(__m256 e, __m256 o) {
    __m256 l = _mm256_unpacklo_ps(e, o), h = _mm256_unpackhi_ps(e, o); /* [0 1 2 3 | 8 9 10 11], [4 5 6 7 | 12 .. 15] */
    return fold16(_mm256_permute2f128_ps(l, h, 0x20), _mm256_permute2f128_ps(l, h, 0x31));
}

/* One 16-step of an MR x NR even/odd tile: xp rows ldp apart from element k,
 * weight rows wrow elements apart from element kw. */
AI void eo_step(int MR, int NR, __m256 (*e)[4], __m256 (*o)[4], const float *xp, int ldp, int k, const uint16_t *w,
                size_t wrow, int kw) {
    const __m256i hm = _mm256_set1_epi32((int)0xffff0000u);
    __m256 xe[2], xo[2];
#pragma GCC unroll 2
    for (int i = 0; i < MR; i++) {
        xe[i] = _mm256_load_ps(xp + (size_t)i * ldp + k);
        xo[i] = _mm256_load_ps(xp + (size_t)i * ldp + k + 8);
        /* 2 x 2: 8 accumulators + these 4 + 2 weights + the mask fit the 16 ymm, so the
         * activations are loaded once, not once per output as fma memory operands (the
         * compiler's choice otherwise): 2 x 3 with 12 such loads per step was load-bound */
        if (NR == 2) __asm__("" : "+x"(xe[i]), "+x"(xo[i]));
    }
#pragma GCC unroll 4
    for (int j = 0; j < NR; j++) {
        __m256i v = _mm256_loadu_si256((const __m256i *)(w + j * wrow + kw));
        __m256 we = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16)), wo = _mm256_castsi256_ps(_mm256_and_si256(v, hm));
#pragma GCC unroll 2
        for (int i = 0; i < MR; i++) {
            e[i][j] = _mm256_fmadd_ps(xe[i], we, e[i][j]);
            o[i][j] = _mm256_fmadd_ps(xo[i], wo, o[i][j]);
        }
    }
}

AI void eo_tile(int MR, int NR, float *y, int ldy, const float *xp, int ldp, const uint16_t *w, size_t wrow, int K,
                int add) {
    __m256 e[2][4], o[2][4];
#pragma GCC unroll 2
    for (int i = 0; i < MR; i++)
#pragma GCC unroll 4
        for (int j = 0; j < NR; j++) e[i][j] = o[i][j] = _mm256_setzero_ps();
    const char *pf = (const char *)(w + (size_t)NR * wrow * PF_PANELS);
    int k = 0;
    for (; k + 16 <= K; k += 16) {
#pragma GCC unroll 4
        for (int j = 0; j < NR; j++) _mm_prefetch(pf + (j * wrow + (size_t)k) * 2, _MM_HINT_T0);
        eo_step(MR, NR, e, o, xp, ldp, k, w, wrow, k);
    }
    if (k < K) { /* the weights' last block zero-padded (xp is already) */
        _Alignas(32) uint16_t wb[4][32]; /* pad16 fills 64 bytes */
        for (int j = 0; j < NR; j++) pad16(wb[j], w + j * wrow, k, K, 2);
        eo_step(MR, NR, e, o, xp, ldp, k, &wb[0][0], 32, 0);
    }
#pragma GCC unroll 2
    for (int i = 0; i < MR; i++)
#pragma GCC unroll 4
        for (int j = 0; j < NR; j++) td_avx2_put(y, ldy, i, j, fold_eo(e[i][j], o[i][j]), add);
}

typedef void (*eo_fn)(float *y, int ldy, const float *xp, int ldp, const uint16_t *w, size_t wrow, int K, int add);
#define EO_INST(MR, NR)                                                                                        \
    static void eo_##MR##x##NR(float *y, int ldy, const float *xp, int ldp, const uint16_t *w, size_t wrow, int K, \
                               int add) {                                                                      \
        eo_tile(MR, NR, y, ldy, xp, ldp, w, wrow, K, add);                                                     \
    }
EO_INST(1, 1) EO_INST(2, 1) EO_INST(1, 2) EO_INST(2, 2) EO_INST(1, 4)

/* tokens [0, m) x outputs [n0, n1) in 2 x 2 tiles (1 x 2, 2 x 1, 1 x 1 at the edges),
 * outputs outermost: a pair's weights are read from memory once for all tokens */
static void eo_rect(float *y, int ldy, const float *xp, int ldp, const uint16_t *W, int K, int m, int n0, int n1,
                    int add) {
    const size_t wrow = (size_t)K;
    for (int n = n0; n < n1; n += 2) {
        int two_n = n1 - n >= 2;
        for (int i = 0; i < m; i += 2) {
            eo_fn f = m - i >= 2 ? (two_n ? eo_2x2 : eo_2x1) : (two_n ? eo_1x2 : eo_1x1);
            f(y + (size_t)i * ldy + n, ldy, xp + (size_t)i * ldp, ldp, W + n * wrow, wrow, K, add);
        }
    }
}

/* 0 when there is no scratch (the caller then takes the widening tiles) */
static int matmul_bf16_eo(float *y, int ldy, const float *x, int ldx, int M, const uint16_t *W, int K, int n0,
                          int n1, int add) {
    const int Kp = (K + 15) & ~15, ldp = Kp + 16; /* + 16: rows not 4 KiB apart (L1 bank conflicts) */
    const int mrows = M < EO_MBLOCK ? M : EO_MBLOCK;
    float *xp = td_thread_scratch(sizeof(float) * (size_t)mrows * (size_t)ldp);
    if (!xp) return 0;
    const size_t wrow = (size_t)K;
    for (int mb = 0; mb < M; mb += EO_MBLOCK) {
        int me = mb + EO_MBLOCK < M ? mb + EO_MBLOCK : M;
        eo_permute(xp, ldp, x + (size_t)mb * ldx, ldx, me - mb, K);
        float *yb = y + (size_t)mb * ldy;
        int n = n0;
        if (me - mb == 1) {
            for (; n + 4 <= n1; n += 4) eo_1x4(yb + n, ldy, xp, ldp, W + n * wrow, wrow, K, add);
            for (; n < n1; n++) eo_1x1(yb + n, ldy, xp, ldp, W + n * wrow, wrow, K, add);
            continue;
        }
        eo_rect(yb, ldy, xp, ldp, W, K, me - mb, n0, n1, add);
    }
    return 1;
}

void td_avx2_matmul(float *y, int ldy, const float *x, int ldx, int M, const void *W, int dt, int K, int n0,
                    int n1, int add) {
    size_t wrow = (size_t)K * esize(dt);
    const char *wb = W;
    const tile_set *ts = &TILES[dt];
    if (dt == TD_DTYPE_BF16 && matmul_bf16_eo(y, ldy, x, ldx, M, W, K, n0, n1, add)) return;
    if (M == 1) {
        int n = n0;
        for (; n + 4 <= n1; n += 4) ts->gemv4(y + n, ldy, x, ldx, wb + n * wrow, wrow, K, add);
        for (; n < n1; n++) ts->t[1][0](y + n, ldy, x, ldx, wb + n * wrow, wrow, K, add);
        return;
    }
    for (int mb = 0; mb < M; mb += MBLOCK) {
        int me = mb + MBLOCK < M ? mb + MBLOCK : M;
        int n = n0;
        for (; n + 3 <= n1; n += 3)
            for (int m = mb; m < me; m += 2)
                ts->t[me - m < 2 ? 1 : 2][1](y + (size_t)m * ldy + n, ldy, x + (size_t)m * ldx, ldx, wb + n * wrow,
                                             wrow, K, add);
        for (; n < n1; n++)
            for (int m = mb; m < me; m += 2)
                ts->t[me - m < 2 ? 1 : 2][0](y + (size_t)m * ldy + n, ldy, x + (size_t)m * ldx, ldx, wb + n * wrow,
                                             wrow, K, add);
    }
}

/* ---- bf16 activations x bf16 weights: the B32 order (td_matmul_bf16a) ------
 * One 32-element step feeds the 16 lanes a pair each: lanes 0-7 take elements
 * 0-15 of the step, lanes 8-15 elements 16-31. A dword of a 256-bit load holds a
 * pair (element 2l in its low half, 2l+1 in its high half), so the pair's two
 * f32 values are the dword shifted left by 16 and the dword with its low half
 * cleared. Each lane then does exactly what kernels.c's dp_lane does: inputs
 * with a zero exponent read as signed zeros, acc = fz(fma(x1, w1, acc)), acc =
 * fz(fma(x0, w0, acc)): flush8 below FLT_MIN, and where fma gives +-FLT_MIN
 * (rare), td_bf16_fz24 decides lane by lane from the exact value. */

/* v with a subnormal (zero-exponent) value replaced by the zero of its sign */
AI __m256 flush8(__m256 v) {
    const __m256 sign = _mm256_castsi256_ps(_mm256_set1_epi32((int)0x80000000u));
    __m256 big = _mm256_cmp_ps(_mm256_andnot_ps(sign, v), _mm256_set1_ps(FLT_MIN), _CMP_GE_OQ);
    __m256 keep = _mm256_or_ps(big, sign); /* a NaN or inf compares unordered: */
    __m256 nan = _mm256_cmp_ps(v, v, _CMP_UNORD_Q); /* keep those too */
    return _mm256_and_ps(v, _mm256_or_ps(keep, nan));
}

/* the pair halves of 16 bf16 values at p: *e = elements 0, 2, .., 14, *o = 1, 3, .., 15 */
AI void pairs8(const uint16_t *p, __m256 *e, __m256 *o) {
    __m256i v = _mm256_loadu_si256((const __m256i *)p);
    *e = flush8(_mm256_castsi256_ps(_mm256_slli_epi32(v, 16)));
    *o = flush8(_mm256_castsi256_ps(_mm256_and_si256(v, _mm256_set1_epi32((int)0xffff0000u))));
}

/* the lanes of fma(a, b, c) that are +-FLT_MIN, recomputed by td_bf16_fz24 */
static __attribute__((noinline, cold)) __m256 fz24_fix8(__m256 r, __m256 a, __m256 b, __m256 c, int mask) {
    float rv[8], av[8], bv[8], cv[8];
    _mm256_storeu_ps(rv, r), _mm256_storeu_ps(av, a), _mm256_storeu_ps(bv, b), _mm256_storeu_ps(cv, c);
    for (int l = 0; l < 8; l++)
        if (mask >> l & 1) rv[l] = td_bf16_fz24(av[l], bv[l], cv[l]);
    return _mm256_loadu_ps(rv);
}

AI __m256 fz8(__m256 a, __m256 b, __m256 c) {
    __m256 r = _mm256_fmadd_ps(a, b, c);
    const __m256 sign = _mm256_castsi256_ps(_mm256_set1_epi32((int)0x80000000u));
    int edge = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_andnot_ps(sign, r), _mm256_set1_ps(FLT_MIN), _CMP_EQ_OQ));
    if (__builtin_expect(edge != 0, 0)) r = fz24_fix8(r, a, b, c, edge);
    return flush8(r);
}

AI __m256 dp8(__m256 acc, __m256 x0, __m256 x1, __m256 w0, __m256 w1) {
    acc = fz8(x1, w1, acc);
    return fz8(x0, w0, acc);
}

/* one 32-step of an MR x NR tile (x rows at stride ldx, weight rows at stride wrow elements) */
AI void tileb_step(int MR, int NR, __m256 (*lo)[2], __m256 (*hi)[2], const uint16_t *x, int ldx,
                   const uint16_t *w, size_t wrow) {
    __m256 xe[2][2], xo[2][2];
#pragma GCC unroll 2
    for (int i = 0; i < MR; i++)
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) pairs8(x + (size_t)i * ldx + 16 * h, &xe[i][h], &xo[i][h]);
#pragma GCC unroll 2
    for (int j = 0; j < NR; j++) {
        __m256 we[2], wo[2];
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) pairs8(w + j * wrow + 16 * h, &we[h], &wo[h]);
#pragma GCC unroll 2
        for (int i = 0; i < MR; i++) {
            lo[i][j] = dp8(lo[i][j], xe[i][0], xo[i][0], we[0], wo[0]);
            hi[i][j] = dp8(hi[i][j], xe[i][1], xo[i][1], we[1], wo[1]);
        }
    }
}

AI void tileb(int MR, int NR, float *y, int ldy, const uint16_t *x, int ldx, const uint16_t *w, size_t wrow,
              int K, int add) {
    __m256 lo[2][2], hi[2][2];
#pragma GCC unroll 2
    for (int i = 0; i < MR; i++)
#pragma GCC unroll 2
        for (int j = 0; j < NR; j++) lo[i][j] = hi[i][j] = _mm256_setzero_ps();
    int k = 0;
    for (; k + 32 <= K; k += 32) tileb_step(MR, NR, lo, hi, x + k, ldx, w + k, wrow);
    if (k < K) {
        _Alignas(32) uint16_t xb[2][32], wb[2][32];
        for (int i = 0; i < MR; i++) pad16(xb[i], x + (size_t)i * ldx, k, K, 2);
        for (int j = 0; j < NR; j++) pad16(wb[j], w + j * wrow, k, K, 2);
        tileb_step(MR, NR, lo, hi, &xb[0][0], 32, &wb[0][0], 32);
    }
#pragma GCC unroll 2
    for (int i = 0; i < MR; i++)
#pragma GCC unroll 2
        for (int j = 0; j < NR; j++) td_avx2_put(y, ldy, i, j, fold16(lo[i][j], hi[i][j]), add);
}

#define TILEB_INST(MR, NR)                                                                                  \
    static void tileb_##MR##x##NR(float *y, int ldy, const uint16_t *x, int ldx, const uint16_t *w, size_t wrow, \
                                  int K, int add) {                                                         \
        tileb(MR, NR, y, ldy, x, ldx, w, wrow, K, add);                                                     \
    }
TILEB_INST(1, 1) TILEB_INST(1, 2) TILEB_INST(2, 1) TILEB_INST(2, 2)

void td_avx2_matmul_bf16a(float *y, int ldy, const uint16_t *x, int ldx, int M, const uint16_t *W, int K, int n0,
                          int n1, int add) {
    size_t wrow = (size_t)K;
    for (int m = 0; m < M; m += 2) {
        int two = M - m >= 2;
        const uint16_t *xm = x + (size_t)m * ldx;
        float *ym = y + (size_t)m * ldy;
        int n = n0;
        for (; n + 2 <= n1; n += 2)
            (two ? tileb_2x2 : tileb_1x2)(ym + n, ldy, xm, ldx, W + n * wrow, wrow, K, add);
        for (; n < n1; n++) (two ? tileb_2x1 : tileb_1x1)(ym + n, ldy, xm, ldx, W + n * wrow, wrow, K, add);
    }
}

void td_avx2_norm_apply(float *out, const float *x, const void *w, int dt, int n, float r) {
    __m256 vr = _mm256_set1_ps(r);
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(out + i, _mm256_mul_ps(ldw8(w, (size_t)i, dt), _mm256_mul_ps(_mm256_loadu_ps(x + i), vr)));
    if (i < n) {
        float xb[16], ob[8];
        _Alignas(32) unsigned char wb[64];
        pad16(xb, x, i, n, 4);
        pad16(wb, w, i, n, esize(dt));
        _mm256_storeu_ps(ob, _mm256_mul_ps(ldw8(wb, 0, dt), _mm256_mul_ps(_mm256_loadu_ps(xb), vr)));
        memcpy(out + i, ob, sizeof(float) * (size_t)(n - i));
    }
}

void td_avx2_rope(float *v, const float *cs, const float *sn, int hd) {
    int half = hd / 2, i = 0;
    for (; i + 8 <= half; i += 8) { /* the portable path's products and sums, 8 lanes at a time */
        __m256 x = _mm256_loadu_ps(v + i), y = _mm256_loadu_ps(v + i + half);
        __m256 c = _mm256_loadu_ps(cs + i), s = _mm256_loadu_ps(sn + i);
        _mm256_storeu_ps(v + i, _mm256_sub_ps(_mm256_mul_ps(x, c), _mm256_mul_ps(y, s)));
        _mm256_storeu_ps(v + i + half, _mm256_add_ps(_mm256_mul_ps(y, c), _mm256_mul_ps(x, s)));
    }
    for (; i < half; i++) {
        float x = v[i], y = v[i + half];
        v[i] = x * cs[i] - y * sn[i];
        v[i + half] = y * cs[i] + x * sn[i];
    }
}

/* ---- exp, swiglu -------------------------------------------------------------- */

/* 2^e for integer lanes e in [-126, 127] */
AI __m256 pow2i(__m256i e) { return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(e, _mm256_set1_epi32(127)), 23)); }

AI __m256 exp_v(__m256 x) {
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(EXP_LO)), _mm256_set1_ps(EXP_HI));
    __m256 t = _mm256_mul_ps(x, _mm256_set1_ps(EXP_LOG2E));
    __m256 n = _mm256_round_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(EXP_C1), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(EXP_C2), r);
    __m256 p = _mm256_set1_ps(EXP_P0);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(EXP_P1));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(EXP_P2));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(EXP_P3));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(EXP_P4));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(EXP_P5));
    __m256 z = _mm256_mul_ps(r, r);
    p = _mm256_fmadd_ps(p, z, r);
    p = _mm256_add_ps(p, _mm256_set1_ps(1.0f));
    /* p * 2^n, n in [-150, 129]: n1 = floor(n / 2) and n2 = n - n1 lie in [-75, 65] */
    __m256i ni = _mm256_cvtps_epi32(n), n1 = _mm256_srai_epi32(ni, 1);
    return _mm256_mul_ps(_mm256_mul_ps(p, pow2i(n1)), pow2i(_mm256_sub_epi32(ni, n1)));
}

void td_avx2_exp(float *out, const float *x, int n) {
    int i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, exp_v(_mm256_loadu_ps(x + i)));
    if (i < n) {
        float b[16];
        pad16(b, x, i, n, 4);
        _mm256_storeu_ps(b, exp_v(_mm256_loadu_ps(b)));
        memcpy(out + i, b, sizeof(float) * (size_t)(n - i));
    }
}

AI __m256 swiglu_v(__m256 g, __m256 u) {
    __m256 e = exp_v(_mm256_xor_ps(g, _mm256_set1_ps(-0.0f)));
    return _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.0f), e)), u);
}

void td_avx2_swiglu(float *out, const float *g, const float *u, int n) {
    int i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, swiglu_v(_mm256_loadu_ps(g + i), _mm256_loadu_ps(u + i)));
    if (i < n) {
        float gb[16], ub[16];
        pad16(gb, g, i, n, 4);
        pad16(ub, u, i, n, 4);
        _mm256_storeu_ps(gb, swiglu_v(_mm256_loadu_ps(gb), _mm256_loadu_ps(ub)));
        memcpy(out + i, gb, sizeof(float) * (size_t)(n - i));
    }
}

/* ---- attention ------------------------------------------------------------------ */

/* mask of the first r (0..8) lanes, for maskload/maskstore */
AI __m256i lanes(int r) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(r), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* scores of keys j0 .. j0+7 (hd a multiple of 16; K rows of dtype dt, rs bytes
 * apart, from kb): s8 of 4 keys at a time, then fold8x8 */
AI __m256 scores8(int dt, const float *qi, const char *kb, size_t rs, int hd) {
    __m256 s8[8];
#pragma GCC unroll 2
    for (int h = 0; h < 8; h += 4) { /* unrolled: s8 and the fold stay in registers */
        __m256 lo[4], hi[4];
#pragma GCC unroll 4
        for (int u = 0; u < 4; u++) lo[u] = hi[u] = _mm256_setzero_ps();
        for (int d = 0; d < hd; d += 16) {
            __m256 q0 = _mm256_loadu_ps(qi + d), q1 = _mm256_loadu_ps(qi + d + 8);
#pragma GCC unroll 4
            for (int u = 0; u < 4; u++) {
                const char *kr = kb + (size_t)(h + u) * rs;
                lo[u] = _mm256_fmadd_ps(q0, ldw8(kr, (size_t)d, dt), lo[u]);
                hi[u] = _mm256_fmadd_ps(q1, ldw8(kr, (size_t)d + 8, dt), hi[u]);
            }
        }
#pragma GCC unroll 4
        for (int u = 0; u < 4; u++) s8[h + u] = _mm256_add_ps(lo[u], hi[u]);
    }
    return fold8x8(s8);
}

/* Attention for K/V rows of dtype DT (a constant in each instance below).
 * Queries go in blocks of up to TD_ATTEND_QMAX, and each pass over the keys goes in
 * blocks of about 16 KiB of K (or V) rows, every query of the block taking its
 * turn on one key block while it sits in L1: the K/V rows come from L2/L3 once
 * per query block instead of once per query. Each query's operations are those
 * of the portable attend_p in the same order (a score is its D16 dot, whether
 * scores8 or td_avx2_dot makes it; the output accumulates in j order, its
 * running sums parked in o between key blocks), so neither the blocking nor the
 * other queries change a bit. sc: TD_ATTEND_QMAX rows of max(n_keys) floats. */
AI void attend_scores(int dt, float *sc, const float *qi, const char *K, size_t rs, int hd, int j0, int j1,
                      __m256 vscale, float scale, td_pf_stream *pf) {
    int j = j0;
    if ((hd & 15) == 0)
        for (; j + 8 <= j1; j += 8) {
            td_pf_step(pf);
            _mm256_storeu_ps(sc + j, _mm256_mul_ps(scores8(dt, qi, K + (size_t)j * rs, rs, hd), vscale));
        }
    for (; j < j1; j++) sc[j] = td_avx2_dot(qi, K + (size_t)j * rs, dt, hd) * scale;
}

/* Softmax of one query's n scores in place (exp(s - max)), returning 1 / sum. */
AI float attend_softmax(float *sc, int n) {
    /* max (exact, order-free) */
    __m256 vm = _mm256_set1_ps(-INFINITY);
    int j;
    for (j = 0; j + 8 <= n; j += 8) vm = _mm256_max_ps(_mm256_loadu_ps(sc + j), vm);
    float m8[8], mx = -INFINITY;
    _mm256_storeu_ps(m8, vm);
    for (int l = 0; l < 8; l++) mx = m8[l] > mx ? m8[l] : mx;
    for (; j < n; j++) mx = sc[j] > mx ? sc[j] : mx;
    /* exp and D16 sum (the tail's missing lanes add 0) */
    __m256 vmx = _mm256_set1_ps(mx), lo = _mm256_setzero_ps(), hi = lo;
    for (j = 0; j + 16 <= n; j += 16) {
        __m256 e0 = exp_v(_mm256_sub_ps(_mm256_loadu_ps(sc + j), vmx));
        __m256 e1 = exp_v(_mm256_sub_ps(_mm256_loadu_ps(sc + j + 8), vmx));
        _mm256_storeu_ps(sc + j, e0);
        _mm256_storeu_ps(sc + j + 8, e1);
        lo = _mm256_add_ps(lo, e0);
        hi = _mm256_add_ps(hi, e1);
    }
    if (j < n) {
        float b[16];
        int r = n - j;
        pad16(b, sc, j, n, 4);
        __m256 e0 = exp_v(_mm256_sub_ps(_mm256_loadu_ps(b), vmx));
        __m256 e1 = exp_v(_mm256_sub_ps(_mm256_loadu_ps(b + 8), vmx));
        e0 = _mm256_and_ps(e0, _mm256_castsi256_ps(lanes(r)));
        e1 = _mm256_and_ps(e1, _mm256_castsi256_ps(lanes(r - 8)));
        _mm256_storeu_ps(b, e0);
        _mm256_storeu_ps(b + 8, e1);
        memcpy(sc + j, b, sizeof(float) * (size_t)r);
        lo = _mm256_add_ps(lo, e0);
        hi = _mm256_add_ps(hi, e1);
    }
    return 1.0f / fold16(lo, hi);
}

/* oi += sum over j in [j0, j1), in order, of (sc[j] * inv) V_j — from zero when
 * j0 == 0 — in blocks of 8 dims (64 at a time), the running sums kept in oi.
 * V holds the rows of keys vr.. (key j at V + (j - vr) rs). */
AI void attend_pv(int dt, float *oi, const float *sc, float inv, const char *V, int vr, size_t rs, int hd, int j0, int j1,
                  td_pf_stream *pf) {
    for (int d0 = 0; d0 < hd; d0 += 64) {
        int rem = hd - d0;
        const char *vb = V + eoff(dt, (size_t)d0);
        __m256 a[8];
        if (rem >= 64) {
            for (int b = 0; b < 8; b++) a[b] = j0 ? _mm256_loadu_ps(oi + d0 + 8 * b) : _mm256_setzero_ps();
            for (int j = j0; j < j1; j++) {
                if (!d0) td_pf_step(pf);
                __m256 p = _mm256_set1_ps(sc[j] * inv);
                const char *vj = vb + (size_t)(j - vr) * rs;
#pragma GCC unroll 8
                for (int b = 0; b < 8; b++) a[b] = _mm256_fmadd_ps(p, ldw8(vj, (size_t)8 * b, dt), a[b]);
            }
            for (int b = 0; b < 8; b++) _mm256_storeu_ps(oi + d0 + 8 * b, a[b]);
        } else {
            int nb = (rem + 7) / 8;
            __m256i ml = lanes(rem - 8 * (nb - 1)), all = lanes(8);
            for (int b = 0; b < nb; b++)
                a[b] = j0 ? _mm256_maskload_ps(oi + d0 + 8 * b, b == nb - 1 ? ml : all) : _mm256_setzero_ps();
            for (int j = j0; j < j1; j++) {
                __m256 p = _mm256_set1_ps(sc[j] * inv);
                const char *vj = vb + (size_t)(j - vr) * rs;
                if (dt == TD_DTYPE_F32) {
                    for (int b = 0; b < nb; b++)
                        a[b] = _mm256_fmadd_ps(p, _mm256_maskload_ps((const float *)vj + 8 * b, b == nb - 1 ? ml : all), a[b]);
                } else { /* no 16-bit masked load: the rem values (q8_0: whole blocks) into a zeroed buffer */
                    _Alignas(32) uint16_t vt[64] = {0};
                    memcpy(vt, vj, eoff(dt, (size_t)rem));
                    for (int b = 0; b < nb; b++) a[b] = _mm256_fmadd_ps(p, ldw8(vt, (size_t)8 * b, dt), a[b]);
                }
            }
            for (int b = 0; b < nb; b++) _mm256_maskstore_ps(oi + d0 + 8 * b, b == nb - 1 ? ml : all, a[b]);
        }
    }
}

/* rows [j0, j1) of X (rs bytes apart, dtype dt) as f32 rows of hd into w, ldw8's values */
AI void widen_rows(float *w, const char *X, size_t rs, int j0, int j1, int hd, int dt) {
    for (int j = j0; j < j1; j++)
        for (int d = 0; d < hd; d += 8) _mm256_storeu_ps(w + (size_t)(j - j0) * hd + d, ldw8(X + (size_t)j * rs, (size_t)d, dt));
}

/* The rows [j0, j1) of K or V that a key block's passes read: X itself (*base = 0,
 * rows indexed from 0), or their f32 copy in wide (*base = j0) when wide is set */
AI const char *key_block(float *wide, const char *X, size_t rs, int j0, int j1, int hd, int dt, int *base) {
    if (!wide) {
        *base = 0;
        return X;
    }
    widen_rows(wide, X, rs, j0, j1, hd, dt);
    *base = j0;
    return (const char *)wide;
}

AI void attend(int dt, float *o, int ldo, const float *q, int ldq, int nq, const int *n_keys, const char *K,
               const char *V, int ldkv, int hd, float scale, float *sc) {
    const __m256 vscale = _mm256_set1_ps(scale);
    const size_t rs = eoff(dt, (size_t)ldkv);
    /* keys per block: about 16 KiB of rows, a multiple of 8 */
    int kb = (int)(16384 / eoff(dt, (size_t)hd)) & ~7;
    if (kb < 8) kb = 8;
    /* q8_0 rows: each key block is dequantized once into f32 rows (ldw8's
     * values, so the same bits) that every query of the block then reads,
     * instead of each query dequantizing it again */
    float *wide = NULL;
    int kd = dt;
    size_t wrs = rs;
    if (dt == TD_DTYPE_Q8_0 && nq >= 4 && (hd & 7) == 0) { /* fewer queries: dequantizing in place is cheaper */
        kb = (int)(16384 / ((size_t)hd * 4)) & ~7;
        if (kb < 8) kb = 8;
        if ((wide = td_thread_scratch((size_t)kb * (size_t)hd * 4)) != NULL) kd = TD_DTYPE_F32, wrs = (size_t)hd * 4;
    }
    for (int i0 = 0; i0 < nq; i0 += TD_ATTEND_QMAX) {
        int qb = nq - i0 < TD_ATTEND_QMAX ? nq - i0 : TD_ATTEND_QMAX, nmax = 0;
        for (int b = 0; b < qb; b++) nmax = n_keys[i0 + b] > nmax ? n_keys[i0 + b] : nmax;
        /* sc row b (nmax floats apart): query i0 + b's scores, then its exps */
        for (int j0 = 0; j0 < nmax; j0 += kb) {
            int kr;
            const char *Kb = key_block(wide, K, rs, j0, j0 + kb < nmax ? j0 + kb : nmax, hd, dt, &kr);
            for (int b = 0; b < qb; b++) {
                int n = n_keys[i0 + b], j1 = j0 + kb < n ? j0 + kb : n;
                if (j0 < j1) { /* each query prefetches its slice of the next key block's rows (kernels.h) */
                    size_t pfn;
                    const char *pfp = td_att_pf_slice(K, rs, eoff(dt, (size_t)hd), j0, kb, nmax, b, qb, &pfn);
                    td_pf_stream pf = td_pf_begin(pfp, pfn, (j1 - j0) / 8);
                    attend_scores(kd, sc + (size_t)b * nmax + j0, q + (size_t)(i0 + b) * ldq, Kb + (size_t)(j0 - kr) * wrs, wrs, hd, 0,
                                  j1 - j0, vscale, scale, &pf);
                }
            }
        }
        float inv[TD_ATTEND_QMAX];
        for (int b = 0; b < qb; b++) {
            inv[b] = attend_softmax(sc + (size_t)b * nmax, n_keys[i0 + b]);
            if (n_keys[i0 + b] <= 0) memset(o + (size_t)(i0 + b) * ldo, 0, sizeof(float) * (size_t)hd); /* no keys: zeros */
        }
        for (int j0 = 0; j0 < nmax; j0 += kb) {
            int vr;
            const char *Vb = key_block(wide, V, rs, j0, j0 + kb < nmax ? j0 + kb : nmax, hd, dt, &vr);
            for (int b = 0; b < qb; b++) {
                int n = n_keys[i0 + b], j1 = j0 + kb < n ? j0 + kb : n;
                if (j0 < j1) {
                    size_t pfn;
                    const char *pfp = td_att_pf_slice(V, rs, eoff(dt, (size_t)hd), j0, kb, nmax, b, qb, &pfn);
                    td_pf_stream pf = td_pf_begin(pfp, pfn, j1 - j0);
                    attend_pv(kd, o + (size_t)(i0 + b) * ldo, sc + (size_t)b * nmax, inv[b], Vb, vr, wrs, hd, j0, j1, &pf);
                }
            }
        }
    }
}

static void attend_f32(float *o, int ldo, const float *q, int ldq, int nq, const int *nk, const char *K,
                       const char *V, int ldkv, int hd, float scale, float *sc) {
    attend(TD_DTYPE_F32, o, ldo, q, ldq, nq, nk, K, V, ldkv, hd, scale, sc);
}
static void attend_bf16(float *o, int ldo, const float *q, int ldq, int nq, const int *nk, const char *K,
                        const char *V, int ldkv, int hd, float scale, float *sc) {
    attend(TD_DTYPE_BF16, o, ldo, q, ldq, nq, nk, K, V, ldkv, hd, scale, sc);
}
static void attend_f16(float *o, int ldo, const float *q, int ldq, int nq, const int *nk, const char *K,
                       const char *V, int ldkv, int hd, float scale, float *sc) {
    attend(TD_DTYPE_F16, o, ldo, q, ldq, nq, nk, K, V, ldkv, hd, scale, sc);
}
static void attend_q8(float *o, int ldo, const float *q, int ldq, int nq, const int *nk, const char *K,
                      const char *V, int ldkv, int hd, float scale, float *sc) {
    attend(TD_DTYPE_Q8_0, o, ldo, q, ldq, nq, nk, K, V, ldkv, hd, scale, sc);
}

void td_avx2_attend(float *o, int ldo, const float *q, int ldq, int nq, const int *n_keys, const void *K,
                    const void *V, int dt, int ldkv, int hd, float scale, float *sc) {
    (dt == TD_DTYPE_BF16   ? attend_bf16
     : dt == TD_DTYPE_F16  ? attend_f16
     : dt == TD_DTYPE_Q8_0 ? attend_q8
                           : attend_f32)(o, ldo, q, ldq, nq, n_keys, K, V, ldkv, hd, scale, sc);
}

void td_avx2_to_f16(uint16_t *dst, const float *src, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(dst + i), _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
    if (i < n) {
        float b[16];
        uint16_t h[8];
        pad16(b, src, (int)i, (int)n, 4);
        _mm_storeu_si128((__m128i *)h, _mm256_cvtps_ph(_mm256_loadu_ps(b), _MM_FROUND_TO_NEAREST_INT));
        memcpy(dst + i, h, 2 * (n - i));
    }
}

#else
typedef int td_kernels_avx2_empty; /* not an x86-64 build: no AVX2 path */
#endif
