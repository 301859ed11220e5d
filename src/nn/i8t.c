/* i8t — int8 products on Intel AMX-INT8 tiles (the rule and layouts: i8t.h).
 *
 * Like amx.c's single blocks: a block is 16 outputs x up to 16 tokens; tile C
 * accumulates it (int32), tile A takes the block's weights for one step (16
 * rows x 64 int8, read in place from qw at a stride of K bytes), tile B the
 * packed activations of the step (16 quads x the chunk's tokens); TDPBSSD per
 * step of 64. Two sets of these three tiles (0-2, 3-5): with one chunk of
 * tokens (M <= 16, or M a multiple of 16) both are configured alike and serve
 * alternate blocks, so a block's first steps need not wait for the previous
 * block's result to leave its tile; with a remainder chunk set 0 takes the
 * full chunks and set 1 the remainder, so one configuration serves a whole
 * range of full-height blocks (reloading per chunk would cost ~50 ns a time).
 * The next block's rows are prefetched while a block runs its first chunk.
 * The result tile is stored and each token's column gathered, converted,
 * scaled and written into y (masked to the block's rows).
 *
 * The configuration is read at entry and put back on return (i8t.h says why);
 * between, it changes only for the last rows of a range (< 16: A and C tiles
 * of that many rows). Which set or configuration computes an output never
 * changes its bits: the dot is exact and the scaling is per element. */
#define _GNU_SOURCE
#include "nn/i8t.h"
#include "nn/kernels.h"
#include "util/util.h"

#include <math.h>
#include <string.h>

/* ---- the quantization rule and the layouts in C (every build) ---- */

/* max |x[k]| / 127, or 0 where that underflows; a NaN element is skipped */
static float row_scale(const float *x, int K) {
    float amax = 0.0f;
    for (int k = 0; k < K; k++) {
        float a = fabsf(x[k]);
        if (a > amax) amax = a;
    }
    return amax / 127.0f;
}

/* x / s clamped to [-127, 127] (a NaN to -127, as the vector max does), then
 * rounded to nearest even; s != 0 */
static int8_t quant1(float x, float s) {
    float v = x / s;
    v = v >= -127.0f ? (v <= 127.0f ? v : 127.0f) : -127.0f;
    return (int8_t)nearbyintf(v);
}

void td_i8t_quantize(int8_t *qw, float *s, const void *W, int dtype, int N, int K) {
    TD_ASSERT(K > 0 && (dtype == TD_DTYPE_F32 || dtype == TD_DTYPE_BF16 || dtype == TD_DTYPE_F16));
    enum { CH = 256 };
    size_t es = dtype == TD_DTYPE_F32 ? 4 : 2;
    float buf[CH];
    for (int n = 0; n < N; n++) {
        const char *row = (const char *)W + (size_t)n * (size_t)K * es;
        int8_t *q = qw + (size_t)n * (size_t)K;
        float amax = 0.0f;
        for (int k0 = 0; k0 < K; k0 += CH) { /* the row in chunks: no allocation */
            int c = K - k0 < CH ? K - k0 : CH;
            td_to_f32(buf, row + (size_t)k0 * es, dtype, (size_t)c);
            for (int k = 0; k < c; k++) { /* as row_scale */
                float a = fabsf(buf[k]);
                if (a > amax) amax = a;
            }
        }
        float sn = amax / 127.0f;
        s[n] = sn;
        for (int k0 = 0; k0 < K; k0 += CH) {
            int c = K - k0 < CH ? K - k0 : CH;
            td_to_f32(buf, row + (size_t)k0 * es, dtype, (size_t)c);
            for (int k = 0; k < c; k++) q[k0 + k] = sn != 0.0f ? quant1(buf[k], sn) : 0;
        }
    }
}

/* word of token i (of a chunk of mc) for element k, relative to the chunk */
static inline size_t act_word(int k, int i, int mc) { return (size_t)(k / 64) * 16 * mc + (size_t)((k % 64) / 4) * mc + i; }

static void act_c(uint32_t *xp, float *xs, const float *x, int ldx, int M, int K) {
    for (int m0 = 0; m0 < M; m0 += 16) {
        int mc = M - m0 < 16 ? M - m0 : 16;
        uint32_t *chunk = xp + (size_t)m0 * (size_t)K / 4;
        for (int i = 0; i < mc; i++) {
            const float *xr = x + (size_t)(m0 + i) * ldx;
            float s = row_scale(xr, K);
            xs[m0 + i] = s;
            for (int k = 0; k < K; k += 4) {
                int8_t b[4];
                for (int j = 0; j < 4; j++) b[j] = s != 0.0f ? quant1(xr[k + j], s) : 0;
                memcpy(chunk + act_word(k, i, mc), b, 4);
            }
        }
    }
}

void td_i8t_matmul_ref(float *y, int ldy, const uint32_t *xp, const float *xs, int M, const int8_t *qw, const float *ws,
                       int K, int n0, int n1, int add) {
    for (int m = 0; m < M; m++) {
        int m0 = m / 16 * 16, mc = M - m0 < 16 ? M - m0 : 16;
        const int8_t *chunk = (const int8_t *)(xp + (size_t)m0 * (size_t)K / 4);
        for (int n = n0; n < n1; n++) {
            const int8_t *w = qw + (size_t)n * (size_t)K;
            int32_t dot = 0;
            for (int k = 0; k < K; k++) dot += (int32_t)w[k] * chunk[act_word(k, m - m0, mc) * 4 + (size_t)(k % 4)];
            float v = (float)dot * ws[n];
            v = v * xs[m];
            float *yo = y + (size_t)m * ldy + n;
            *yo = add ? *yo + v : v;
        }
    }
}

#if defined(__x86_64__) && (defined(__clang__) ? __clang_major__ >= 12 : __GNUC__ >= 11)
#include "nn/amx.h"

#include <cpuid.h>
#include <immintrin.h>
#include <stdatomic.h>

#define TA __attribute__((target("amx-tile,amx-int8,avx512f,avx512bw")))

/* Set t (tiles 3t .. 3t+2): C rows x mc[t] int32, A rows x 64 int8, B 16
 * quads x mc[t] tokens — for mc0 == mc1 the bytes of amx.c's configure(mc, rows). */
static void make_cfg(td_amx_tilecfg *c, int rows, int mc0, int mc1) {
    memset(c, 0, sizeof *c);
    c->palette = 1;
    for (int t = 0; t < 2; t++) {
        int mc = t ? mc1 : mc0;
        c->rows[3 * t] = (uint8_t)rows;
        c->colsb[3 * t] = (uint16_t)(mc * 4);
        c->rows[3 * t + 1] = (uint8_t)rows;
        c->colsb[3 * t + 1] = 64;
        c->rows[3 * t + 2] = 16;
        c->colsb[3 * t + 2] = (uint16_t)(mc * 4);
    }
}

/* ---- activations: the rule of act_c, 64 elements a step ---- */

TA static float row_scale_v(const float *x, int K) { /* K a multiple of 64 */
    __m512 a[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
    for (int k = 0; k < K; k += 64) /* max(|x|, acc): acc where |x| is a NaN, as row_scale */
        for (int e = 0; e < 4; e++) a[e] = _mm512_max_ps(_mm512_abs_ps(_mm512_loadu_ps(x + k + 16 * e)), a[e]);
    return _mm512_reduce_max_ps(_mm512_max_ps(_mm512_max_ps(a[0], a[1]), _mm512_max_ps(a[2], a[3]))) / 127.0f;
}

/* q of x[0 .. 64) under scale s (!= 0), as 16 dwords of 4 consecutive bytes.
 * The rule divides; a VDIVPS per 16 values cost 15% of an act (M = 8, K =
 * 1280: 2.55 us, 2.2 without). x * inv (inv = f32 1 / s) is within 2^-23
 * relative (|x / s| <= 127: 1.6e-5) of the exact quotient, and so is f32 x / s;
 * so both round alike unless x * inv lies within 2^-12 of a half-integer, and
 * only those lanes (about 1 in 2000) are divided. div = 1: every lane divided
 * (inv unusable). */
TA static __m512i quant64(const float *x, __m512 vs, __m512 inv, int div) {
    const __m512 lo = _mm512_set1_ps(-127.0f), hi = _mm512_set1_ps(127.0f), half = _mm512_set1_ps(0.5f);
    const __m512 near = _mm512_set1_ps(0x1p-12f);
    __m512i d[4];
    for (int e = 0; e < 4; e++) {
        __m512 xv = _mm512_loadu_ps(x + 16 * e), v;
        if (div) v = _mm512_div_ps(xv, vs);
        else {
            v = _mm512_mul_ps(xv, inv);
            __m512 f = _mm512_sub_ps(v, _mm512_roundscale_ps(v, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC));
            __mmask16 tie = _mm512_cmp_ps_mask(_mm512_abs_ps(_mm512_sub_ps(f, half)), near, _CMP_LT_OQ);
            if (tie) v = _mm512_mask_div_ps(v, tie, xv, vs);
        }
        v = _mm512_min_ps(_mm512_max_ps(v, lo), hi); /* a NaN v: lo (max returns its second operand) */
        d[e] = _mm512_cvt_roundps_epi32(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    }
    /* packs within 128-bit lanes: lane l holds the dwords (4l .. 4l+3) of d[0], d[1], d[2], d[3] in turn */
    __m512i p = _mm512_packs_epi16(_mm512_packs_epi32(d[0], d[1]), _mm512_packs_epi32(d[2], d[3]));
    return _mm512_permutexvar_epi32(_mm512_set_epi32(15, 11, 7, 3, 14, 10, 6, 2, 13, 9, 5, 1, 12, 8, 4, 0), p);
}

TA static void act_v(uint32_t *xp, float *xs, const float *x, int ldx, int M, int K) {
    for (int m0 = 0; m0 < M; m0 += 16) {
        int mc = M - m0 < 16 ? M - m0 : 16;
        uint32_t *chunk = xp + (size_t)m0 * (size_t)K / 4;
        const __m512i idx = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                               _mm512_set1_epi32(mc));
        for (int i = 0; i < mc; i++) {
            const float *xr = x + (size_t)(m0 + i) * ldx;
            float s = row_scale_v(xr, K);
            xs[m0 + i] = s;
            float inv = s != 0.0f ? 1.0f / s : 0.0f;
            int div = !(inv < 0x1p127f); /* s <= 2^-127: 1 / s near overflow, divide throughout */
            __m512 vs = _mm512_set1_ps(s), vinv = _mm512_set1_ps(inv);
            for (int k = 0; k < K; k += 64) {
                uint32_t *step = chunk + (size_t)(k / 64) * 16 * mc + i;
                __m512i q = s != 0.0f ? quant64(xr + k, vs, vinv, div) : _mm512_setzero_si512();
                if (mc == 1) _mm512_storeu_si512(step, q);
                else _mm512_i32scatter_epi32(step, idx, q, 4);
            }
        }
    }
}

void td_i8t_act(uint32_t *xp, float *xs, const float *x, int ldx, int M, int K) {
    TD_ASSERT(td_i8t_fits(K));
    if (td_i8t_available()) act_v(xp, xs, x, ldx, M, K);
    else act_c(xp, xs, x, ldx, M, K);
}

/* ---- the product ---- */

/* acc[r][i] = the int32 dot of qw's row n + r with the chunk's token i, for
 * the configured rows and mc tokens; xc: the chunk's packed activations, w:
 * row n, pf: the next block's first row (prefetched along) or NULL. One copy
 * per tile set (C, A, B = 0, 1, 2 or 3, 4, 5). */
#define I8T_BLOCK(NAME, TC, TA_, TB)                                                                     \
    TA static void NAME(int32_t *acc, const uint32_t *xc, int mc, const int8_t *w, int K, const int8_t *pf) { \
        _tile_zero(TC);                                                                                   \
        for (int k = 0; k < K; k += 64) {                                                                 \
            if (pf) for (int r = 0; r < 16; r++) _mm_prefetch((const char *)(pf + (size_t)r * K + k), _MM_HINT_T0); \
            _tile_loadd(TB, xc + (size_t)(k / 64) * 16 * mc, mc * 4);                                      \
            _tile_loadd(TA_, w + k, K);                                                                   \
            _tile_dpbssd(TC, TA_, TB);                                                                    \
        }                                                                                                 \
        _tile_stored(TC, acc, mc * 4);                                                                    \
    }
I8T_BLOCK(block0, 0, 1, 2)
I8T_BLOCK(block1, 3, 4, 5)

/* y[i][r] (+)= ((float)a[r][i] * ws[r]) * xs[i] for tokens i < mc and rows
 * r < rows: a column of the stored tile gathered into one vector per token */
TA static void scatter(float *y, int ldy, const int32_t *a, int mc, int rows, const float *ws, const float *xs, int add) {
    const __m512i idx = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                           _mm512_set1_epi32(mc));
    const __mmask16 km = (__mmask16)(rows >= 16 ? 0xFFFFu : (1u << rows) - 1u);
    const __m512 w = _mm512_maskz_loadu_ps(km, ws);
    for (int i = 0; i < mc; i++) {
        __m512i d = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), km, idx, a + i, 4);
        __m512 v = _mm512_mul_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(d), w), _mm512_set1_ps(xs[i]));
        float *yr = y + (size_t)i * ldy;
        if (add) v = _mm512_add_ps(_mm512_maskz_loadu_ps(km, yr), v);
        _mm512_mask_storeu_ps(yr, km, v);
    }
}

TA void td_i8t_matmul(float *y, int ldy, const uint32_t *xp, const float *xs, int M, const int8_t *qw, const float *ws,
                      int K, int n0, int n1, int add) {
    TD_ASSERT(td_i8t_fits(K) && M >= 0 && n0 >= 0);
    if (M == 0 || n1 <= n0) return;
    /* the chunks' widths on sets 0 and 1 (equal: the sets alternate by block) */
    int mc0 = M < 16 ? M : 16, mc1 = M <= 16 || M % 16 == 0 ? mc0 : M % 16;
    td_amx_tilecfg found, cur, want;
    td_amx_store_cfg(&found);
    cur = found;
    int32_t acc[2][16 * 16]; /* per tile set: [16 outputs][16 tokens] */
    int set = 0, cfg_rows = 0;
    for (int n = n0; n < n1; n += 16) {
        int rows = n1 - n < 16 ? n1 - n : 16;
        if (rows != cfg_rows) {
            make_cfg(&want, rows, mc0, mc1);
            if (memcmp(&want, &cur, sizeof want) != 0) {
                td_amx_load_cfg(&want);
                cur = want;
            }
            cfg_rows = rows;
        }
        const int8_t *w = qw + (size_t)n * (size_t)K;
        for (int m = 0; m < M; m += 16) {
            int mc = M - m < 16 ? M - m : 16;
            int t = mc0 == mc1 ? (set ^= 1) : mc != 16; /* the tile set */
            const int8_t *pf = m == 0 && n + 32 <= n1 ? w + (size_t)16 * K : NULL;
            (t ? block1 : block0)(acc[t], xp + (size_t)m * (size_t)K / 4, mc, w, K, pf);
            scatter(y + (size_t)m * ldy + n, ldy, acc[t], mc, rows, ws + n, xs + m, add);
        }
    }
    /* put back what this thread had (amx.c relies on its cached shape); the
     * init state stays ours: no cached shape of another module can be live */
    if (found.palette != 0 && memcmp(&found, &cur, sizeof cur) != 0) td_amx_load_cfg(&found);
}

/* A product of 17 rows (a tail of one) and 3 tokens, K = 64, against the
 * scalar definition, bit for bit. */
static int i8t_works(void) {
    int8_t w[17 * 64];
    float x[3 * 64], xs[3], ws[17], y[3 * 17], r[3 * 17];
    uint32_t xp[3 * 16];
    for (int n = 0; n < 17; n++) {
        ws[n] = 1.0f / (float)(n + 1);
        for (int k = 0; k < 64; k++) w[n * 64 + k] = (int8_t)((7 * k + 3 * n) % 255 - 127);
    }
    for (int m = 0; m < 3; m++)
        for (int k = 0; k < 64; k++) x[m * 64 + k] = (float)(k - 20 * m);
    act_v(xp, xs, x, 64, 3, 64);
    td_i8t_matmul(y, 17, xp, xs, 3, w, ws, 64, 0, 17, 0);
    td_i8t_matmul_ref(r, 17, xp, xs, 3, w, ws, 64, 0, 17, 0);
    return memcmp(y, r, sizeof y) == 0;
}

int td_i8t_available(void) {
    static _Atomic int ok = -1;
    int v = atomic_load_explicit(&ok, memory_order_relaxed);
    if (v < 0) {
        unsigned a, b, c, d;
        v = 0;
        if (td_amx_available() && __get_cpuid_count(7, 0, &a, &b, &c, &d) && (d >> 25 & 1)) v = i8t_works();
        atomic_store_explicit(&ok, v, memory_order_relaxed);
    }
    return v;
}

#else /* no AMX in this build: the layout in C (nothing runs the product without tiles) */

int td_i8t_available(void) { return 0; }
void td_i8t_act(uint32_t *xp, float *xs, const float *x, int ldx, int M, int K) {
    TD_ASSERT(td_i8t_fits(K));
    act_c(xp, xs, x, ldx, M, K);
}
void td_i8t_matmul(float *y, int ldy, const uint32_t *xp, const float *xs, int M, const int8_t *qw, const float *ws,
                   int K, int n0, int n1, int add) {
    (void)y; (void)ldy; (void)xp; (void)xs; (void)M; (void)qw; (void)ws; (void)K; (void)n0; (void)n1; (void)add;
    TD_ASSERT(!"td_i8t_matmul without AMX-INT8");
}

#endif
