/* kernels_neon — the NEON path: the D16 and Q16 orders on 128-bit registers
 * (kernels_neon.h).
 *
 * A D16 accumulator is four float32x4 registers; a step loads 16 weights,
 * widens them exactly (bf16: a 16-bit left shift; f16: FCVTL) and does one FMLA
 * per register, so each lane performs the portable fmaf chain. A length that is
 * not a multiple of 16 ends with a step over zero-padded copies, as the
 * portable path's fmaf(0, 0, acc) does. Tiles: 1 token x 4 outputs for one
 * token (decode streams the weights once), 2 tokens x 2 outputs otherwise (the
 * weights converted once per step and applied to both tokens). Attention: the
 * scores as D16 dots, the softmax as attend_p's (exp4 for exp_p), then the
 * values four output elements a register, each element's fma chain over the
 * keys in key order, as attend_p's.
 *
 * Q8_0 / Q4_0 (Q16 order): per block, two SDOTs of 16 weight bytes against 16
 * activation bytes give P_b[0..3] and P_b[4..7]; they are converted to f32
 * (exact: |P| < 2^16) and folded into lanes 8 (b & 1) + l with one FMLA each
 * by c_b = dw_b * d_b. The integer sums are exact, so the bits are the
 * portable matmul_p's. Q4_0 nibbles become int8 (nibble - 8) in registers. */
#include "nn/kernels_neon.h"

#ifdef TD_HAVE_NEON_PATH
#include "nn/kernels_avx2.h" /* td_exp's constants (EXP_*), shared by every path */
#include "nn/quant.h"
#include "tandem.h"
#include "util/util.h"

#include <arm_neon.h>
#include <math.h>
#include <string.h>
#include <sys/auxv.h>

#ifndef HWCAP_ASIMDDP
#define HWCAP_ASIMDDP (1 << 20)
#endif

#define AI static inline __attribute__((always_inline))

int td_neon_dotprod_ok(void) { return (getauxval(AT_HWCAP) & HWCAP_ASIMDDP) != 0; }

/* the D16 fold of lanes v[0] (0-3) .. v[3] (12-15): s8 = lanes i + (i + 8),
 * s4[i] = s8[i] + s8[i + 4], s2[i] = s4[i] + s4[i + 2], s2[0] + s2[1] */
AI float fold16(const float32x4_t *v) {
    float32x4_t s4 = vaddq_f32(vaddq_f32(v[0], v[2]), vaddq_f32(v[1], v[3]));
    float32x2_t s2 = vadd_f32(vget_low_f32(s4), vget_high_f32(s4));
    return vget_lane_f32(s2, 0) + vget_lane_f32(s2, 1);
}

/* 4 weights of dtype dt at element i of w, as f32 (exact) */
AI float32x4_t ld4(const void *w, size_t i, int dt) {
    if (dt == TD_DTYPE_F32) return vld1q_f32((const float *)w + i);
    uint16x4_t h = vld1_u16((const uint16_t *)w + i);
    if (dt == TD_DTYPE_BF16) return vreinterpretq_f32_u32(vshll_n_u16(h, 16));
    return vcvt_f32_f16(vreinterpret_f16_u16(h));
}

/* the weight at element i of w (dt), as f32 (exact; the scalar tails) */
AI float wv1(const void *w, size_t i, int dt) {
    return dt == TD_DTYPE_F32    ? ((const float *)w)[i]
           : dt == TD_DTYPE_BF16 ? td_bf16_to_f32(((const uint16_t *)w)[i])
                                 : td_f16_to_f32(((const uint16_t *)w)[i]);
}

/* one 16-step: the weights at w + i (dt) into r[0..3] */
AI void ld16(float32x4_t *r, const void *w, size_t i, int dt) {
    for (int j = 0; j < 4; j++) r[j] = ld4(w, i + 4 * (size_t)j, dt);
}

/* The last partial step's operands, zero-padded to 16 (n - k < 16 elements left). */
static void tail16(float *a16, float *w16, const float *a, const void *w, int dt, int k, int n) {
    memset(a16, 0, 16 * sizeof(float));
    memset(w16, 0, 16 * sizeof(float));
    memcpy(a16, a + k, sizeof(float) * (size_t)(n - k));
    for (int i = 0; i < n - k; i++) w16[i] = wv1(w, (size_t)(k + i), dt);
}

AI void fma16(float32x4_t *acc, const float32x4_t *x, const float32x4_t *w) {
    for (int j = 0; j < 4; j++) acc[j] = vfmaq_f32(acc[j], x[j], w[j]);
}

AI void zero16(float32x4_t *acc) {
    for (int j = 0; j < 4; j++) acc[j] = vdupq_n_f32(0.0f);
}

float td_neon_dot(const float *a, const void *w, int dt, int n) {
    float32x4_t acc[4], x[4], v[4];
    zero16(acc);
    int k = 0;
    for (; k + 16 <= n; k += 16) {
        ld16(x, a, (size_t)k, TD_DTYPE_F32);
        ld16(v, w, (size_t)k, dt);
        fma16(acc, x, v);
    }
    if (k < n) {
        float a16[16], w16[16];
        tail16(a16, w16, a, w, dt, k, n);
        ld16(x, a16, 0, TD_DTYPE_F32);
        ld16(v, w16, 0, TD_DTYPE_F32);
        fma16(acc, x, v);
    }
    return fold16(acc);
}

AI void put(float *y, float s, int add) { *y = add ? *y + s : s; }

/* token x against outputs w0..w3 (rows of K elements, wrow bytes apart) */
static void tile_1x4(float *y, const float *x, const char *w, size_t wrow, int dt, int K, int add) {
    float32x4_t acc[4][4], xv[4], v[4];
    for (int o = 0; o < 4; o++) zero16(acc[o]);
    int k = 0;
    for (; k + 16 <= K; k += 16) {
        ld16(xv, x, (size_t)k, TD_DTYPE_F32);
        for (int o = 0; o < 4; o++) {
            ld16(v, w + (size_t)o * wrow, (size_t)k, dt);
            fma16(acc[o], xv, v);
        }
    }
    if (k < K) {
        float a16[16], w16[16];
        for (int o = 0; o < 4; o++) {
            tail16(a16, w16, x, w + (size_t)o * wrow, dt, k, K);
            ld16(xv, a16, 0, TD_DTYPE_F32);
            ld16(v, w16, 0, TD_DTYPE_F32);
            fma16(acc[o], xv, v);
        }
    }
    for (int o = 0; o < 4; o++) put(y + o, fold16(acc[o]), add);
}

/* tokens x0, x1 against outputs w0, w1 */
static void tile_2x2(float *y, int ldy, const float *x, int ldx, const char *w, size_t wrow, int dt, int K, int add) {
    float32x4_t acc[2][2][4], xv[2][4], v[4];
    for (int t = 0; t < 2; t++)
        for (int o = 0; o < 2; o++) zero16(acc[t][o]);
    int k = 0;
    for (; k + 16 <= K; k += 16) {
        ld16(xv[0], x, (size_t)k, TD_DTYPE_F32);
        ld16(xv[1], x + ldx, (size_t)k, TD_DTYPE_F32);
        for (int o = 0; o < 2; o++) {
            ld16(v, w + (size_t)o * wrow, (size_t)k, dt);
            fma16(acc[0][o], xv[0], v);
            fma16(acc[1][o], xv[1], v);
        }
    }
    if (k < K) {
        float a16[16], w16[16];
        for (int t = 0; t < 2; t++)
            for (int o = 0; o < 2; o++) {
                tail16(a16, w16, x + (size_t)t * ldx, w + (size_t)o * wrow, dt, k, K);
                ld16(xv[0], a16, 0, TD_DTYPE_F32);
                ld16(v, w16, 0, TD_DTYPE_F32);
                fma16(acc[t][o], xv[0], v);
            }
    }
    for (int t = 0; t < 2; t++)
        for (int o = 0; o < 2; o++) put(y + (size_t)t * ldy + o, fold16(acc[t][o]), add);
}

void td_neon_matmul(float *y, int ldy, const float *x, int ldx, int M, const void *W, int dt, int K, int n0, int n1,
                    int add) {
    size_t wrow = (size_t)K * (dt == TD_DTYPE_F32 ? 4 : 2);
    const char *w = W;
    int m = 0;
    if (M == 1) {
        int n = n0;
        for (; n + 4 <= n1; n += 4) tile_1x4(y + n, x, w + (size_t)n * wrow, wrow, dt, K, add);
        for (; n < n1; n++) put(y + n, td_neon_dot(x, w + (size_t)n * wrow, dt, K), add);
        return;
    }
    for (; m + 2 <= M; m += 2) {
        int n = n0;
        for (; n + 2 <= n1; n += 2)
            tile_2x2(y + (size_t)m * ldy + n, ldy, x + (size_t)m * ldx, ldx, w + (size_t)n * wrow, wrow, dt, K, add);
        for (; n < n1; n++)
            for (int t = m; t < m + 2; t++)
                put(y + (size_t)t * ldy + n, td_neon_dot(x + (size_t)t * ldx, w + (size_t)n * wrow, dt, K), add);
    }
    for (; m < M; m++) {
        int n = n0;
        for (; n + 4 <= n1; n += 4) tile_1x4(y + (size_t)m * ldy + n, x + (size_t)m * ldx, w + (size_t)n * wrow, wrow, dt, K, add);
        for (; n < n1; n++) put(y + (size_t)m * ldy + n, td_neon_dot(x + (size_t)m * ldx, w + (size_t)n * wrow, dt, K), add);
    }
}

void td_neon_norm_apply(float *out, const float *x, const void *w, int dt, int n, float r) {
    float32x4_t vr = vdupq_n_f32(r);
    int i = 0;
    for (; i + 4 <= n; i += 4) vst1q_f32(out + i, vmulq_f32(ld4(w, (size_t)i, dt), vmulq_f32(vld1q_f32(x + i), vr)));
    for (; i < n; i++) out[i] = wv1(w, (size_t)i, dt) * (x[i] * r);
}

/* 2^k for k in [-126, 127], exactly */
AI float32x4_t pow2i(int32x4_t k) { return vreinterpretq_f32_s32(vshlq_n_s32(vaddq_s32(k, vdupq_n_s32(127)), 23)); }

/* td_exp's polynomial (kernels_avx2.h's constants), lane by lane as exp_p: the
 * clamps as comparisons (a NaN becomes EXP_LO, as there), rint by FRINTN, the
 * fmas fused, and p * 2^n as two power-of-two multiplies, n1 = n >> 1 exact,
 * the second rounding once as ldexpf does */
AI float32x4_t exp4(float32x4_t x) {
    float32x4_t lo = vdupq_n_f32(EXP_LO), hi = vdupq_n_f32(EXP_HI);
    x = vbslq_f32(vcgtq_f32(x, lo), x, lo);
    x = vbslq_f32(vcltq_f32(x, hi), x, hi);
    float32x4_t n = vrndnq_f32(vmulq_f32(x, vdupq_n_f32(EXP_LOG2E)));
    float32x4_t r = vfmsq_f32(x, n, vdupq_n_f32(EXP_C1));
    r = vfmsq_f32(r, n, vdupq_n_f32(EXP_C2));
    float32x4_t p = vdupq_n_f32(EXP_P0);
    p = vfmaq_f32(vdupq_n_f32(EXP_P1), p, r);
    p = vfmaq_f32(vdupq_n_f32(EXP_P2), p, r);
    p = vfmaq_f32(vdupq_n_f32(EXP_P3), p, r);
    p = vfmaq_f32(vdupq_n_f32(EXP_P4), p, r);
    p = vfmaq_f32(vdupq_n_f32(EXP_P5), p, r);
    p = vfmaq_f32(r, p, vmulq_f32(r, r));
    p = vaddq_f32(p, vdupq_n_f32(1.0f));
    int32x4_t ni = vcvtq_s32_f32(n), n1 = vshrq_n_s32(ni, 1);
    return vmulq_f32(vmulq_f32(p, pow2i(n1)), pow2i(vsubq_s32(ni, n1)));
}

void td_neon_exp(float *out, const float *x, int n) {
    int i = 0;
    for (; i + 4 <= n; i += 4) vst1q_f32(out + i, exp4(vld1q_f32(x + i)));
    if (i < n) {
        float b[4] = {0};
        memcpy(b, x + i, sizeof(float) * (size_t)(n - i));
        vst1q_f32(b, exp4(vld1q_f32(b)));
        memcpy(out + i, b, sizeof(float) * (size_t)(n - i));
    }
}

AI float32x4_t swiglu4(float32x4_t g, float32x4_t u) {
    return vmulq_f32(vdivq_f32(g, vaddq_f32(vdupq_n_f32(1.0f), exp4(vnegq_f32(g)))), u);
}

void td_neon_swiglu(float *out, const float *g, const float *u, int n) {
    int i = 0;
    for (; i + 4 <= n; i += 4) vst1q_f32(out + i, swiglu4(vld1q_f32(g + i), vld1q_f32(u + i)));
    if (i < n) {
        float gb[4] = {0}, ub[4] = {0};
        memcpy(gb, g + i, sizeof(float) * (size_t)(n - i));
        memcpy(ub, u + i, sizeof(float) * (size_t)(n - i));
        vst1q_f32(gb, swiglu4(vld1q_f32(gb), vld1q_f32(ub)));
        memcpy(out + i, gb, sizeof(float) * (size_t)(n - i));
    }
}

/* D16 sum (adds, zero-padded tail) */
static float sum16(const float *a, int n) {
    float32x4_t acc[4];
    zero16(acc);
    int k = 0;
    for (; k + 16 <= n; k += 16)
        for (int j = 0; j < 4; j++) acc[j] = vaddq_f32(acc[j], vld1q_f32(a + k + 4 * j));
    if (k < n) {
        float a16[16] = {0};
        memcpy(a16, a + k, sizeof(float) * (size_t)(n - k));
        for (int j = 0; j < 4; j++) acc[j] = vaddq_f32(acc[j], vld1q_f32(a16 + 4 * j));
    }
    return fold16(acc);
}

void td_neon_attend(float *o, int ldo, const float *q, int ldq, int nq, const int *n_keys, const char *K, const char *V,
                    int dt, int ldkv, int hd, float scale, float *sc) {
    const size_t rs = (size_t)ldkv * (dt == TD_DTYPE_F32 ? 4 : 2); /* bytes between rows */
    for (int i = 0; i < nq; i++) {
        const float *qi = q + (size_t)i * ldq;
        int n = n_keys[i];
        float *oi = o + (size_t)i * ldo;
        for (int j = 0; j < n; j++) sc[j] = td_neon_dot(qi, K + (size_t)j * rs, dt, hd) * scale;
        float mx = -INFINITY;
        for (int j = 0; j < n; j++) mx = sc[j] > mx ? sc[j] : mx;
        for (int j = 0; j < n; j++) sc[j] = sc[j] - mx;
        td_neon_exp(sc, sc, n);
        float inv = 1.0f / sum16(sc, n);
        int d4 = hd / 4 * 4;
        for (int d = 0; d < hd; d++) oi[d] = 0.0f;
        for (int j = 0; j < n; j++) { /* each output element its own fma chain over the keys, in key order */
            float pr = sc[j] * inv;
            const char *vj = V + (size_t)j * rs;
            float32x4_t p = vdupq_n_f32(pr);
            for (int d = 0; d < d4; d += 4) vst1q_f32(oi + d, vfmaq_f32(vld1q_f32(oi + d), p, ld4(vj, (size_t)d, dt)));
            for (int d = d4; d < hd; d++) oi[d] = fmaf(pr, wv1(vj, (size_t)d, dt), oi[d]);
        }
    }
}

/* ---- Q8_0 / Q4_0 in the Q16 order (needs SDOT) ------------------------------ */

#define TDP __attribute__((target("arch=armv8.2-a+dotprod")))

/* a block's 32 int8 weight values (Q4_0: nibble - 8) in two registers */
TDP AI void wvals(const uint8_t *blk, int dt, int8x16_t *lo, int8x16_t *hi) {
    if (dt == TD_DTYPE_Q8_0) {
        *lo = vld1q_s8((const int8_t *)blk + 2);
        *hi = vld1q_s8((const int8_t *)blk + 18);
        return;
    }
    uint8x16_t qs = vld1q_u8(blk + 2), eight = vdupq_n_u8(8);
    *lo = vreinterpretq_s8_u8(vsubq_u8(vandq_u8(qs, vdupq_n_u8(15)), eight)); /* values 0-15 */
    *hi = vreinterpretq_s8_u8(vsubq_u8(vshrq_n_u8(qs, 4), eight));            /* values 16-31 */
}

/* T tokens (rows of a, lda apart) x O outputs (weight rows wrow apart) over all blocks */
TDP AI void qtile(float *y, int ldy, const char *a, size_t lda, int T, const uint8_t *w, size_t wrow, int O, int K,
                  size_t bs, int dt, int add) {
    int nb = K / 32;
    float32x4_t acc[2][4][4];
    for (int t = 0; t < T; t++)
        for (int o = 0; o < O; o++) zero16(acc[t][o]);
    for (int b = 0; b < nb; b++) {
        int8x16_t wl[4], wh[4];
        float dw[4];
        for (int o = 0; o < O; o++) {
            const uint8_t *blk = w + (size_t)o * wrow + (size_t)b * bs;
            uint16_t h;
            memcpy(&h, blk, 2);
            dw[o] = vgetq_lane_f32(vcvt_f32_f16(vreinterpret_f16_u16(vdup_n_u16(h))), 0); /* FCVTL: exact */
            wvals(blk, dt, &wl[o], &wh[o]);
        }
        int s = 2 * (b & 1); /* even blocks: lanes 0-7, odd: 8-15 */
        for (int t = 0; t < T; t++) {
            const int8_t *q = (const int8_t *)(a + (size_t)t * lda) + 32 * b;
            float d = ((const float *)(const void *)(a + (size_t)t * lda + K))[b];
            int8x16_t ql = vld1q_s8(q), qh = vld1q_s8(q + 16);
            for (int o = 0; o < O; o++) {
                float32x4_t c = vdupq_n_f32(dw[o] * d);
                int32x4_t p0 = vdotq_s32(vdupq_n_s32(0), wl[o], ql), p1 = vdotq_s32(vdupq_n_s32(0), wh[o], qh);
                acc[t][o][s] = vfmaq_f32(acc[t][o][s], c, vcvtq_f32_s32(p0));
                acc[t][o][s + 1] = vfmaq_f32(acc[t][o][s + 1], c, vcvtq_f32_s32(p1));
            }
        }
    }
    for (int t = 0; t < T; t++)
        for (int o = 0; o < O; o++) put(y + (size_t)t * ldy + o, fold16(acc[t][o]), add);
}

TDP void td_neon_qmatmul(float *y, int ldy, const char *a, size_t lda, int M, const void *W, int dt, int K, int n0,
                         int n1, int add) {
    size_t bs = dt == TD_DTYPE_Q8_0 ? 34 : 18, wrow = (size_t)(K / 32) * bs;
    const uint8_t *w = W;
    for (int m = 0; m < M;) {
        int T = M - m >= 2 ? 2 : 1, O = T == 2 ? 2 : 4;
        const char *am = a + (size_t)m * lda;
        float *ym = y + (size_t)m * ldy;
        int n = n0;
        for (; n + O <= n1; n += O) {
            if (T == 2) qtile(ym + n, ldy, am, lda, 2, w + (size_t)n * wrow, wrow, 2, K, bs, dt, add);
            else qtile(ym + n, ldy, am, lda, 1, w + (size_t)n * wrow, wrow, 4, K, bs, dt, add);
        }
        for (; n < n1; n++)
            for (int t = 0; t < T; t++) qtile(ym + (size_t)t * ldy + n, ldy, am + (size_t)t * lda, lda, 1, w + (size_t)n * wrow, wrow, 1, K, bs, dt, add);
        m += T;
    }
}
#endif
