#define _GNU_SOURCE
/* test_quant — Q8_0 / Q4_0 weights: the f16 rounding, the GGUF block layouts,
 * the quantizers' error bounds, every quantized product against td_matmul over
 * the dequantized f32 matrix (memcmp: quant.h promises the same bits) and
 * against the unquantized matrix (stated bounds), portable vs AVX-512 bits,
 * the R16 order of act_type amx (nn/q8r.h) against its scalar statement,
 * ragged M and N, bad K, tensor size checks; then whole models quantized at
 * load: batch invariance (T=1 / inside T=7 / ragged B=5, memcmp), speculative
 * output == plain output, and the trained tiny target's top-1 agreement with
 * its unquantized self. */
#include "tandem.h"
#include "t.h"
#include "tmodel.h"
#include "tctx.h"
#include "model/model.h"
#include "nn/amx.h"
#include "nn/kernels.h"
#include "nn/q8r.h"
#include "nn/quant.h"
#include "util/util.h"

#include <dlfcn.h>
#include <math.h>
#include <unistd.h>
#if defined(__F16C__)
#include <immintrin.h>
#endif

static uint64_t g_rng = 12345;
/* the formats with blocks of 32; the first NQREF quantize as ggml's reference quantizers do */
#define NQDT 6
#define NQREF 5
static const int QDT[NQDT] = {TD_DTYPE_Q8_0, TD_DTYPE_Q4_0, TD_DTYPE_Q5_0, TD_DTYPE_Q4_1, TD_DTYPE_Q5_1, TD_DTYPE_IQ4_NL};
/* the ones whose dot products with Q8_0 activations ggml exports (ggml_vec_dot_*_q8_0) */
#define NDOT 4
static const int DOTDT[NDOT] = {TD_DTYPE_Q8_0, TD_DTYPE_Q4_0, TD_DTYPE_Q5_0, TD_DTYPE_IQ4_NL};
/* the formats with super-blocks of 256 */
#define NKDT 6
static const int KDT[NKDT] = {TD_DTYPE_Q4_K, TD_DTYPE_Q5_K, TD_DTYPE_Q6_K, TD_DTYPE_IQ4_XS, TD_DTYPE_Q3_K, TD_DTYPE_Q2_K};
static float frand(void) { return (float)((tm_rng(&g_rng) >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f; }
static char g_dir[256];

/* ---- formats -------------------------------------------------------------- */

static void test_f16(void) {
    t_begin("f16_round_nearest_even");
    /* every finite f16 survives f16 -> f32 -> f16 */
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        if ((h & 0x7c00) == 0x7c00 && (h & 0x3ff)) continue; /* NaN */
        if (td_f32_to_f16(td_f16_to_f32((uint16_t)h)) != h) bad++;
    }
    T_CHECK(bad == 0, "%d f16 values do not round-trip", bad);
    /* ties go to even; overflow to inf; below half the smallest subnormal to 0 */
    T_CHECK(td_f32_to_f16(1.0f + 1.0f / 2048) == 0x3c00, "tie 1+2^-11 -> 1");
    T_CHECK(td_f32_to_f16(1.0f + 3.0f / 2048) == 0x3c02, "tie 1+3*2^-11 -> 1+2^-9");
    T_CHECK(td_f32_to_f16(65520.0f) == 0x7c00 && td_f32_to_f16(65519.0f) == 0x7bff, "overflow boundary");
    T_CHECK(td_f32_to_f16(ldexpf(1.0f, -25)) == 0 && td_f32_to_f16(ldexpf(1.5f, -25)) == 1, "subnormal rounding");
    T_CHECK(td_f32_to_f16(-0.0f) == 0x8000, "negative zero");
    float nan = NAN;
    uint16_t hn = td_f32_to_f16(nan);
    T_CHECK((hn & 0x7c00) == 0x7c00 && (hn & 0x3ff), "NaN stays NaN (%04x)", hn);
#if defined(__F16C__)
    /* the hardware conversion (round to nearest even) agrees on random bit patterns */
    uint64_t st = 99;
    int diff = 0;
    for (int i = 0; i < 400000; i++) {
        uint32_t u = (uint32_t)tm_rng(&st);
        if (i & 1) u = (u & 0x807fffffu) | ((100u + (u >> 23) % 56u) << 23); /* mostly the f16 range */
        float f;
        memcpy(&f, &u, 4);
        if (f != f) continue;
        if (td_f32_to_f16(f) != (uint16_t)_cvtss_sh(f, 0)) diff++;
    }
    T_CHECK(diff == 0, "%d of 400000 differ from vcvtps2ph", diff);
#endif
    t_end();
}

static void test_layout(void) {
    t_begin("block_layout_gguf");
    /* Q8_0: d = amax/127 exactly when amax = 127 * 2^-6; q = x/d */
    float x[32];
    for (int j = 0; j < 32; j++) x[j] = (float)((j * 37) % 255 - 127) / 64.0f;
    x[5] = 127.0f / 64.0f;
    unsigned char b8[34], b4[18];
    T_REQUIRE(td_quantize_row(TD_DTYPE_Q8_0, x, b8, 32) == 0, "q8 quantize");
    uint16_t d;
    memcpy(&d, b8, 2);
    T_CHECK(d == td_f32_to_f16(1.0f / 64), "q8 scale %04x", d);
    int ok = 1;
    for (int j = 0; j < 32; j++) ok &= (int8_t)b8[2 + j] == (int8_t)((j * 37) % 255 - 127) || j == 5;
    T_CHECK(ok && (int8_t)b8[2 + 5] == 127, "q8 values at bytes 2..33");
    float y[32];
    td_dequantize_row(TD_DTYPE_Q8_0, b8, y, 32);
    T_CHECK(memcmp(x, y, sizeof x) == 0, "q8 round trip of representable values");
    /* Q4_0: the value of largest magnitude is -8 d; nibble n(j) of value j sits in
     * byte j (low) for j < 16 and byte j-16 (high) for j >= 16 */
    int nib[32];
    for (int j = 0; j < 32; j++) nib[j] = (j * 5 + 3) % 16;
    nib[9] = 0;
    for (int j = 0; j < 32; j++) x[j] = (float)(nib[j] - 8) * 0.25f;
    T_REQUIRE(td_quantize_row(TD_DTYPE_Q4_0, x, b4, 32) == 0, "q4 quantize");
    memcpy(&d, b4, 2);
    T_CHECK(d == td_f32_to_f16(0.25f), "q4 scale %04x", d);
    ok = 1;
    for (int j = 0; j < 16; j++) ok &= b4[2 + j] == (nib[j] | nib[j + 16] << 4);
    T_CHECK(ok, "q4 nibbles");
    td_dequantize_row(TD_DTYPE_Q4_0, b4, y, 32);
    T_CHECK(memcmp(x, y, sizeof x) == 0, "q4 round trip of representable values");
    /* all-zero block: scale 0, values 0 */
    memset(x, 0, sizeof x);
    td_quantize_row(TD_DTYPE_Q4_0, x, b4, 32);
    td_dequantize_row(TD_DTYPE_Q4_0, b4, y, 32);
    T_CHECK((b4[0] | (b4[1] & 0x7f)) == 0 && y[0] == 0.0f && y[31] == 0.0f, "zero block (scale +-0)");
    /* sizes */
    T_CHECK(td_dtype_row_bytes(TD_DTYPE_Q8_0, 64) == 68 && td_dtype_row_bytes(TD_DTYPE_Q4_0, 64) == 36, "row bytes");
    T_CHECK(td_dtype_row_bytes(TD_DTYPE_Q8_0, 48) == 0 && td_dtype_row_bytes(TD_DTYPE_Q4_0, 33) == 0, "bad n");
    T_CHECK(td_dtype_row_bytes(TD_DTYPE_Q5_0, 64) == 44 && td_dtype_row_bytes(TD_DTYPE_Q5_0, 40) == 0, "q5_0 row bytes");
done:
    t_end();
}

static void test_quant_error(void) {
    t_begin("quantize_error_bounds");
    int K = 32 * 40;
    float *x = malloc(sizeof(float) * K), *y = malloc(sizeof(float) * K);
    unsigned char *q = malloc(td_dtype_row_bytes(TD_DTYPE_Q8_0, K));
    for (int qi = 0; qi < NQDT; qi++) {
        int dt = QDT[qi];
        double worst = 0;
        for (int rep = 0; rep < 20; rep++) {
            float scale = ldexpf(1.0f, rep % 9 - 4);
            for (int i = 0; i < K; i++) x[i] = frand() * scale * (i % 7 == 0 ? 3.0f : 1.0f);
            T_CHECK(td_quantize_row(dt, x, q, K) == 0, "quantize");
            td_dequantize_row(dt, q, y, K);
            for (int b = 0; b < K / 32; b++) {
                float amax = 0, lo = INFINITY, hi = -INFINITY;
                for (int j = 0; j < 32; j++) {
                    amax = fmaxf(amax, fabsf(x[b * 32 + j]));
                    lo = fminf(lo, x[b * 32 + j]);
                    hi = fmaxf(hi, x[b * 32 + j]);
                }
                /* q8_0: error <= d/2 of rounding + |q| * (f16 rounding of d); q4_0: values
                 * of the sign opposite to the largest one clip at 7 d, so up to d */
                float d = amax / (dt == TD_DTYPE_Q8_0 || dt == TD_DTYPE_IQ4_NL ? 127.0f : dt == TD_DTYPE_Q5_0 ? 16.0f : 8.0f);
                float bound = d * (dt == TD_DTYPE_Q8_0     ? 0.5f + 127.0f / 2048
                                   : dt == TD_DTYPE_Q5_0   ? 1.0f + 16.0f / 2048
                                   : dt == TD_DTYPE_IQ4_NL ? 14.0f + 127.0f / 2048 /* the sign opposite the largest: 113 */
                                                           : 1.0f + 8.0f / 2048) * 1.0001f;
                if (td_dtype_has_min32(dt)) { /* q4_1 / q5_1: d/2 of rounding, the f16 roundings of d (q times) and m */
                    int top = dt == TD_DTYPE_Q4_1 ? 15 : 31;
                    d = (hi - lo) / (float)top;
                    bound = (d * (0.5f + (float)top / 2048) + fabsf(lo) / 2048) * 1.0001f;
                }
                for (int j = 0; j < 32; j++) {
                    float e = fabsf(y[b * 32 + j] - x[b * 32 + j]);
                    if (e > bound) { T_CHECK(e <= bound, "dt %d block %d value %d err %g bound %g", dt, b, j, e, bound); rep = 99; break; }
                    if (d > 0 && e / d > worst) worst = e / d;
                }
            }
        }
        printf("  %s: worst error %.3f d\n", td_dtype_name(dt), worst);
    }
    /* the td_to_f32 hook dequantizes */
    td_quantize_row(TD_DTYPE_Q4_0, x, q, K);
    float *z = malloc(sizeof(float) * K);
    td_dequantize_row(TD_DTYPE_Q4_0, q, y, K);
    td_to_f32(z, q, TD_DTYPE_Q4_0, (size_t)K);
    T_CHECK(memcmp(y, z, sizeof(float) * K) == 0, "td_to_f32 == td_dequantize_row");
    /* non-finite input gives a defined result */
    x[3] = NAN; x[40] = INFINITY;
    T_CHECK(td_quantize_row(TD_DTYPE_Q8_0, x, q, K) == 0 && td_quantize_row(TD_DTYPE_Q4_0, x, q, K) == 0, "nan input");
    T_CHECK(td_quantize_row(TD_DTYPE_Q8_0, x, q, 40) == TD_EINVAL && td_quantize_row(TD_DTYPE_BF16, x, q, 32) == TD_EINVAL,
            "bad n or dtype");
    free(x); free(y); free(z); free(q);
    t_end();
}

/* llama.cpp's own quantizers (libggml-base.so of the pinned npm package
 * @node-llama-cpp/linux-x64, see scripts/test-deps) produce the same bytes; its
 * dequantizers the same values. TD_GGML_LIB overrides the library's path. */
/* The path of one of llama.cpp's libraries (name: "libggml-base.so", ...), in
 * TD_GGML_LIB's directory when that is set. */
static const char *ggml_lib(char *buf, size_t n, const char *name) {
    static const char *where[] = {".cache/npm-llama", ".cache/npm"}; /* scripts/test-deps llama, or with the rest */
    const char *env = getenv("TD_GGML_LIB");
    if (env) {
        const char *sl = strrchr(env, '/');
        snprintf(buf, n, "%.*s%s", sl ? (int)(sl - env + 1) : 0, env, name);
        return buf;
    }
    for (int i = 0; i < 2; i++) {
        snprintf(buf, n, "%s/node_modules/@node-llama-cpp/linux-x64/bins/linux-x64/%s", where[i], name);
        if (access(buf, R_OK) == 0) break;
    }
    return buf;
}

/* dlopen ggml's library name (RTLD_NOW | flags); *missing = 1 (and a skip line)
 * when it is not installed; NULL with the reason printed when it does not load */
static void *ggml_open(const char *name, int flags, int *missing) {
    char buf[300];
    const char *lib = ggml_lib(buf, sizeof buf, name);
#if !defined(__x86_64__)
    *missing = 1; /* the prebuilt library is x86-64 code */
    printf("  %s is an x86-64 library: skipped on this architecture\n", lib);
    return NULL;
#endif
    *missing = access(lib, R_OK) != 0;
    if (*missing) {
        printf("  %s not installed: skipped (scripts/test-deps llama installs it on x86-64 Linux)\n", lib);
        return NULL;
    }
    void *h = dlopen(lib, RTLD_NOW | flags);
    if (!h) printf("  dlopen %s: %s\n", lib, dlerror());
    return h;
}

static void test_ggml_oracle(void) {
    t_begin("ggml_reference_quantizers_agree");
    int missing;
    float *x = NULL, *y = NULL, *z = NULL;
    unsigned char *a = NULL, *b = NULL;
    void *h = ggml_open("libggml-base.so", RTLD_LOCAL, &missing);
    if (missing) goto done;
    T_REQUIRE(h != NULL, "libggml-base.so does not load");
    typedef void (*qfn)(const float *, void *, int64_t);
    typedef void (*dqfn)(const void *, float *, int64_t);
    typedef uint16_t (*hfn)(float);
    qfn qf[NQDT] = {(qfn)dlsym(h, "quantize_row_q8_0_ref"), (qfn)dlsym(h, "quantize_row_q4_0_ref"),
                    (qfn)dlsym(h, "quantize_row_q5_0_ref"), (qfn)dlsym(h, "quantize_row_q4_1_ref"),
                    (qfn)dlsym(h, "quantize_row_q5_1_ref"), (qfn)dlsym(h, "quantize_row_iq4_nl_ref")};
    dqfn df[NQDT] = {(dqfn)dlsym(h, "dequantize_row_q8_0"), (dqfn)dlsym(h, "dequantize_row_q4_0"),
                     (dqfn)dlsym(h, "dequantize_row_q5_0"), (dqfn)dlsym(h, "dequantize_row_q4_1"),
                     (dqfn)dlsym(h, "dequantize_row_q5_1"), (dqfn)dlsym(h, "dequantize_row_iq4_nl")};
    hfn f16 = (hfn)dlsym(h, "ggml_fp32_to_fp16");
    for (int t = 0; t < NQDT; t++) T_REQUIRE(qf[t] && df[t], "symbols for %s missing from libggml-base.so", td_dtype_name(QDT[t]));
    T_REQUIRE(f16, "ggml_fp32_to_fp16 missing from libggml-base.so");
    enum { K = 32 * 256 };
    x = malloc(sizeof(float) * K); y = malloc(sizeof(float) * K); z = malloc(sizeof(float) * K);
    a = malloc(34 * K / 32); b = malloc(34 * K / 32);
    int bad[NQDT] = {0}, badv[NQDT] = {0}, badh = 0;
    double e_td = 0, e_gg = 0, x2 = 0; /* IQ4_NL: tandem's quantizer against ggml's */
    for (int rep = 0; rep < 40; rep++) {
        float scale = ldexpf(1.0f, rep % 13 - 6);
        for (int i = 0; i < K; i++) {
            x[i] = frand() * scale;
            int kind = (int)(tm_rng(&g_rng) % 16);
            if (kind == 0) x[i] = 0.0f;
            else if (kind == 1) x[i] = roundf(x[i] * 8) / 8; /* ties of the rounding */
            else if (kind == 2) x[i] = -x[(i + 7) % K];      /* equal magnitudes, both signs */
        }
        if (rep % 5 == 0) memset(x + 64, 0, sizeof(float) * 32); /* an all-zero block */
        for (int t = 0; t < NQDT; t++) {
            int dt = QDT[t];
            size_t nb = td_dtype_row_bytes(dt, K);
            td_quantize_row(dt, x, a, K);
            qf[t](x, b, K);
            if (t < NQREF) bad[t] += memcmp(a, b, nb) != 0;
            td_dequantize_row(dt, a, y, K);
            df[t](a, z, K);
            badv[t] += memcmp(y, z, sizeof(float) * K) != 0;
            if (t >= NQREF) { /* the two quantizers' errors; then random blocks through both dequantizers */
                df[t](b, z, K);
                for (int i = 0; i < K; i++) {
                    e_td += ((double)y[i] - x[i]) * ((double)y[i] - x[i]);
                    e_gg += ((double)z[i] - x[i]) * ((double)z[i] - x[i]);
                    x2 += (double)x[i] * x[i];
                }
                for (size_t i = 0; i < nb; i++) a[i] = (unsigned char)tm_rng(&g_rng);
                for (int blk = 0; blk < K / 32; blk++) {
                    uint16_t hd = td_f32_to_f16(frand());
                    memcpy(a + 18 * blk, &hd, 2);
                }
                td_dequantize_row(dt, a, y, K);
                df[t](a, z, K);
                badv[t] += memcmp(y, z, sizeof(float) * K) != 0;
            }
        }
        for (int i = 0; i < K; i++) badh += td_f32_to_f16(x[i] * 1000) != f16(x[i] * 1000);
    }
    int nbad = 0, nbadv = 0;
    for (int t = 0; t < NQDT; t++) {
        nbad += bad[t];
        nbadv += badv[t];
        if (bad[t] || badv[t])
            T_CHECK(0, "%s: quantized bytes differ from ggml's in %d of 40 rows, dequantized values in %d", td_dtype_name(QDT[t]),
                    bad[t], badv[t]);
    }
    double rt = sqrt(e_td / x2), rg = sqrt(e_gg / x2);
    printf("  iq4_nl: random and quantized blocks decode to ggml's bits; relative rms error of tandem's quantizer %.4f, "
           "ggml's reference quantizer %.4f\n", rt, rg);
    T_CHECK(rt < 1.5 * rg, "iq4_nl: tandem's quantizer error %.4f is far above ggml's %.4f", rt, rg);
    T_CHECK(badh == 0, "%d f16 conversions differ from ggml_fp32_to_fp16", badh);
    if (!nbad && !nbadv)
        printf("  40 rows of %d values: q8_0, q4_0, q5_0, q4_1 and q5_1 bytes, and every format's decoding, identical to "
               "libggml-base.so's\n", K);
done:
    if (h) dlclose(h);
    free(x); free(y); free(z); free(a); free(b);
    t_end();
}

/* ---- products ------------------------------------------------------------- */

/* The Q16 order of quant.h transcribed scalar by scalar: the activations
 * quantized by td_quant_act_row (checked against llama.cpp's quantizer below),
 * exact int32 lane sums of 4 products, c = dw * d, one fmaf per lane, the D16
 * fold. Also returns, in double, the product over the dequantized weights
 * (*exact) and quant.h's stated error bound for it (*bound). */
static float q16_ref(const float *x, const unsigned char *wrow, int dt, int K, double *exact, double *bound) {
    int nb = K / 32;
    size_t bs = td_dtype_row_bytes(dt, 32);
    int8_t q[32 * 64];
    float d[64], wd[32], acc[16] = {0}, macc[8] = {0};
    td_quant_act_row(x, K, q, d);
    double ex = 0, act = 0, rnd = 0;
    for (int b = 0; b < nb; b++) {
        const unsigned char *blk = wrow + (size_t)b * bs;
        td_dequantize_row(dt, blk, wd, 32);
        uint16_t h;
        memcpy(&h, blk, 2);
        float dw = td_f16_to_f32(h), c = dw * d[b];
        double aw = 0, ap = 0;
        for (int l = 0; l < 8; l++) {
            int32_t p = 0;
            for (int i = 0; i < 4; i++) {
                int k = 4 * l + i;
                int w;
                if (dt == TD_DTYPE_Q8_0) w = (int8_t)blk[2 + k];
                else if (dt == TD_DTYPE_Q4_0) w = k < 16 ? (blk[2 + k] & 15) - 8 : (blk[2 + k - 16] >> 4) - 8;
                else if (dt == TD_DTYPE_Q5_0)
                    w = (k < 16 ? blk[6 + k] & 15 : blk[6 + k - 16] >> 4) + 16 * ((blk[2 + k / 8] >> (k % 8)) & 1) - 16;
                else if (dt == TD_DTYPE_Q4_1) w = k < 16 ? blk[4 + k] & 15 : blk[4 + k - 16] >> 4;
                else if (dt == TD_DTYPE_Q5_1)
                    w = (k < 16 ? blk[8 + k] & 15 : blk[8 + k - 16] >> 4) + 16 * ((blk[4 + k / 8] >> (k % 8)) & 1);
                else w = td_iq4_values[k < 16 ? blk[2 + k] & 15 : blk[2 + k - 16] >> 4];
                p += w * q[32 * b + k];
            }
            acc[8 * (b & 1) + l] = fmaf(c, (float)p, acc[8 * (b & 1) + l]);
            ap += fabs((double)p);
        }
        for (int k = 0; k < 32; k++) {
            ex += (double)wd[k] * x[32 * b + k];
            aw += fabs(wd[k]);
        }
        act += 0.5001 * d[b] * aw;
        rnd += fabs(c) * ap;
        if (td_dtype_has_min32(dt)) { /* the minimum: m * d times the block's exact sum of q */
            int S = 0;
            for (int k = 0; k < 32; k++) S += q[32 * b + k];
            memcpy(&h, blk + 2, 2);
            float e = td_f16_to_f32(h) * d[b];
            macc[b % 8] = fmaf(e, (float)S, macc[b % 8]);
            rnd += fabs(e) * abs(S);
        }
    }
    *exact = ex;
    *bound = act + (nb + 6) * ldexp(1.0, -23) * rnd;
    float s8[8], s4[4], s2[2];
    for (int i = 0; i < 8; i++) s8[i] = acc[i] + acc[i + 8];
    for (int i = 0; i < 4; i++) s4[i] = s8[i] + s8[i + 4];
    for (int i = 0; i < 2; i++) s2[i] = s4[i] + s4[i + 2];
    if (!td_dtype_has_min32(dt)) return s2[0] + s2[1];
    float m4[4], m2[2];
    for (int i = 0; i < 4; i++) m4[i] = macc[i] + macc[i + 4];
    for (int i = 0; i < 2; i++) m2[i] = m4[i] + m4[i + 2];
    return (s2[0] + s2[1]) + (m2[0] + m2[1]);
}

/* the kernel paths this CPU runs (the portable one always) into paths; their count */
static int kernel_paths(int *paths) {
    int n = 0;
    for (int p = 0; p < TD_KPATH_COUNT; p++)
        if (p == TD_KPATH_PORTABLE || td_kernels_supported(p)) paths[n++] = p;
    return n;
}

/* got ([Mmax][ldy], first filled by init_got) holds a product of M rows and N
 * outputs with the reference's bits ref[m * ldy + n] (add = 1: added to the
 * fill), and the fill elsewhere */
static void init_got(float *got, int n) {
    for (int i = 0; i < n; i++) got[i] = (float)i * 0.25f;
}
static int same_as_ref(const float *got, const float *ref, int M, int N, int ldy, int Mmax, int add) {
    int same = 1;
    for (int m = 0; m < Mmax; m++)
        for (int n = 0; n < ldy; n++) {
            float init = (float)(m * ldy + n) * 0.25f, want = m >= M || n >= N ? init
                                                             : add ? init + ref[m * ldy + n]
                                                                   : ref[m * ldy + n];
            same &= !memcmp(&want, &got[m * ldy + n], 4);
        }
    return same;
}

/* td_matmul of M rows on every path in paths, with add = 0 and 1 and over an
 * inner output sub-range, against ref (the reference order's bits, memcmp):
 * rows past M and columns past N untouched. Returns the products run; failures
 * are reported (the first 5 of *fails) and counted. */
static int paths_vs_ref(const float *x, int ldx, int M, const char *Wq, int dt, int K, int N, const float *ref, float *got,
                        int ldy, int Mmax, const int *paths, int npaths, int *fails) {
    int run = 0;
    for (int p = 0; p < npaths; p++) {
        td_kernels_set_path(paths[p]);
        for (int add = 0; add < 2; add++) {
            init_got(got, Mmax * ldy);
            td_matmul(got, ldy, x, ldx, M, Wq, dt, K, 0, N, add);
            run++;
            if (!same_as_ref(got, ref, M, N, ldy, Mmax, add) && (*fails)++ < 5)
                T_CHECK(0, "%s path %d M %d N %d K %d add %d: not the reference order's bits", td_dtype_name(dt), paths[p],
                        M, N, K, add);
        }
        if (N > 2) { /* an output sub-range gives the same bits as the full range */
            for (int i = 0; i < Mmax * ldy; i++) got[i] = -1.0f;
            td_matmul(got, ldy, x, ldx, M, Wq, dt, K, 1, N - 1, 0);
            int same = 1;
            for (int m = 0; m < M; m++)
                same &= !memcmp(got + m * ldy + 1, ref + m * ldy + 1, sizeof(float) * (N - 2)) && got[m * ldy] == -1.0f &&
                        got[m * ldy + N - 1] == -1.0f;
            if (!same && (*fails)++ < 5) T_CHECK(0, "%s M %d N %d K %d: sub-range differs", td_dtype_name(dt), M, N, K);
        }
    }
    return run;
}

static void test_matmul(void) {
    t_begin("matmul_q16_order_all_paths");
    static const int Ms[] = {1, 2, 3, 5, 7, 8, 9, 13, 17, 70};
    static const int Ns[] = {1, 2, 3, 5, 8, 11, 19, 37, 67}; /* 67: 8 strips of 8 outputs and a ragged one */
    static const int Ks[] = {32, 64, 96, 352, 1024};
    int paths[TD_KPATH_COUNT], npaths = kernel_paths(paths), deflt = td_kernels_path();
    int fails = 0, checked = 0;
    double e2[NQDT] = {0}, y2[NQDT] = {0}, worst[NQDT] = {0};
    for (int qi = 0; qi < NQDT; qi++)
        for (size_t ki = 0; ki < sizeof Ks / sizeof Ks[0]; ki++)
            for (size_t ni = 0; ni < sizeof Ns / sizeof Ns[0]; ni++) {
                int K = Ks[ki], N = Ns[ni], Mmax = 70, ldx = K + 3, ldy = N + 2, dt = QDT[qi];
                size_t rb = td_dtype_row_bytes(dt, K);
                float *W = malloc(sizeof(float) * N * K), *x = malloc(sizeof(float) * Mmax * ldx);
                char *Wq = malloc(rb * N);
                float *ref = malloc(sizeof(float) * Mmax * ldy), *got = malloc(sizeof(float) * Mmax * ldy);
                double *ex = malloc(sizeof(double) * Mmax * N), *bd = malloc(sizeof(double) * Mmax * N);
                for (int i = 0; i < N * K; i++) W[i] = frand();
                for (int i = 0; i < Mmax * ldx; i++) x[i] = frand() * (i % 5 == 0 ? 4.0f : 1.0f);
                if (K >= 96) {
                    memset(x + 32, 0, sizeof(float) * 32);      /* a zero block */
                    for (int k = 64; k < 96; k++) x[ldx + k] *= 1e-31f; /* below 2^-100: quantized to 0 */
                }
                for (int n = 0; n < N; n++) td_quantize_row(dt, W + (size_t)n * K, Wq + n * rb, K);
                if (dt == TD_DTYPE_Q8_0) /* weight bytes of -128 (a file may hold them; the quantizer never writes them) */
                    for (int n = 0; n < N; n += 2) Wq[n * rb + 2 + (n * 7) % 32] = (char)0x80;
                for (int m = 0; m < Mmax; m++)
                    for (int n = 0; n < N; n++)
                        ref[m * ldy + n] = q16_ref(x + (size_t)m * ldx, (const unsigned char *)Wq + n * rb, dt, K,
                                                   &ex[m * N + n], &bd[m * N + n]);
                for (size_t mi = 0; mi < sizeof Ms / sizeof Ms[0]; mi++)
                    checked += paths_vs_ref(x, ldx, Ms[mi], Wq, dt, K, N, ref, got, ldy, Mmax, paths, npaths, &fails);
                /* against the dequantized weights: quant.h's stated bound; against the
                 * unquantized matrix: the relative rms error */
                for (int m = 0; m < Mmax; m++)
                    for (int n = 0; n < N; n++) {
                        double e = fabs(ref[m * ldy + n] - ex[m * N + n]), b = bd[m * N + n];
                        if (e > b && fails++ < 5) T_CHECK(0, "%s K %d: error %g vs dequantized over the bound %g", td_dtype_name(dt), K, e, b);
                        if (b > 0 && e / b > worst[qi]) worst[qi] = e / b;
                        if (dt == TD_DTYPE_Q8_0 && n % 2 == 0) continue; /* the rows given -128 bytes */
                        double exact = 0;
                        for (int k = 0; k < K; k++) exact += (double)x[m * ldx + k] * W[(size_t)n * K + k];
                        e2[qi] += (ref[m * ldy + n] - exact) * (ref[m * ldy + n] - exact);
                        y2[qi] += exact * exact;
                    }
                free(W); free(x); free(Wq); free(ref); free(got); free(ex); free(bd);
            }
    td_kernels_set_path(deflt);
    double r[NQDT];
    printf("  %d products x %d paths compared with the scalar Q16 order (memcmp); error vs dequantized weights as a "
           "fraction of the stated bound (worst), rms error / rms output vs the unquantized matrix:",
           checked / npaths, npaths);
    for (int i = 0; i < NQDT; i++) {
        r[i] = sqrt(e2[i] / y2[i]);
        printf(" %s %.2f %.2e%s", td_dtype_name(QDT[i]), worst[i], r[i], i + 1 < NQDT ? ";" : "\n");
    }
    T_CHECK(r[0] < 0.02 && r[1] < 0.2 && r[0] < r[2] && r[2] < r[1] && r[5] < 0.2 && r[4] < r[3] && r[3] < 0.2,
            "quantization error implausibly large (q8_0 < q5_0 < q4_0 and q5_1 < q4_1 expected)");
    t_end();
}

/* The R16 order (Q8_0 products under act_type bf16 and amx, q8r.h), on the
 * kernel path in force: the activation record holds td_quant_act_row's q and d and -128 times
 * each block's sum of q; the kernel's outputs are the bits of a scalar
 * statement of the order for every M (1 .. 130: a verify's one or two tiles
 * of up to 8 tokens (M <= 16), tiles of 4, 3, 2, 1 and two slabs), N (tails
 * of fewer than 16 outputs), K, add = 0 / 1 and output ranges split on
 * 16-output groups; they lie within quant.h's error bound of the
 * product over the dequantized weights; a non-finite activation block makes its
 * row's outputs NaN and leaves the other rows alone. */
static float r16_ref(const int8_t *q, const float *d, const unsigned char *wrow, int K) {
    float a = 0.0f;
    for (int b = 0; b < K / 32; b++) {
        /* volatile: GCC 12.2 with -march=native on AVX-VNNI CPUs vectorizes an
         * int8 x int8 sum into VPDPBUSD, which takes one operand as unsigned
         * (wrong sums; forward-notes "GCC 12 and int8 dot products") */
        volatile int32_t p = 0;
        for (int i = 0; i < 32; i++) p = p + (int8_t)wrow[34 * b + 2 + i] * q[32 * b + i];
        uint16_t h;
        memcpy(&h, wrow + 34 * b, 2);
        a = fmaf(td_f16_to_f32(h) * d[b], (float)p, a);
    }
    return a;
}

static void test_q8r(void) {
    char name[64];
    snprintf(name, sizeof name, "matmul_r16_order_%s", td_kernels_path_name());
    t_begin(name);
    static const int Ms[] = {1, 2, 3, 4, 5, 7, 8, 13, 16, 130};
    static const int Ns[] = {1, 15, 16, 17, 45, 67};
    static const int Ks[] = {32, 96, 1024};
    enum { MMAX = 130 };
    int fails = 0, checked = 0;
    double worst = 0;
    for (size_t ki = 0; ki < sizeof Ks / sizeof Ks[0]; ki++)
        for (size_t ni = 0; ni < sizeof Ns / sizeof Ns[0]; ni++) {
            int K = Ks[ki], N = Ns[ni], ldy = N + 3;
            size_t rb = td_dtype_row_bytes(TD_DTYPE_Q8_0, K), xb = td_q8r_row_bytes(K);
            float *W = malloc(sizeof(float) * N * K), *x = malloc(sizeof(float) * MMAX * K);
            unsigned char *Wq = malloc(rb * N), *xq = malloc(xb * MMAX);
            void *R = aligned_alloc(64, td_q8r_bytes(N, K, TD_Q8R_BYTES));
            float *ref = malloc(sizeof(float) * MMAX * ldy), *got = malloc(sizeof(float) * MMAX * ldy), *dq = malloc(sizeof(float) * K);
            int8_t *q = malloc(K);
            float *d = malloc(sizeof(float) * K / 32);
            for (int i = 0; i < N * K; i++) W[i] = frand();
            for (int i = 0; i < MMAX * K; i++) x[i] = frand() * (i % 7 == 0 ? 8.0f : 1.0f);
            if (K >= 96) memset(x + K + 32, 0, sizeof(float) * 32); /* a zero block */
            for (int n = 0; n < N; n++) td_quantize_row(TD_DTYPE_Q8_0, W + (size_t)n * K, Wq + n * rb, K);
            for (int n = 0; n < N; n += 2) Wq[n * rb + 2 + (n * 7) % 32] = 0x80; /* weight bytes of -128 */
            td_q8r_repack(R, Wq, TD_DTYPE_Q8_0, N, K, 0, N);
            td_q8r_act(xq, x, K, MMAX, K);
            int rec_ok = 1;
            for (int m = 0; m < MMAX; m++) {
                td_quant_act_row(x + (size_t)m * K, K, q, d);
                const unsigned char *row = xq + (size_t)m * xb;
                rec_ok &= !memcmp(row, q, K) && !memcmp(row + K, d, sizeof(float) * K / 32);
                for (int b = 0; b < K / 32; b++) {
                    int32_t s = 0, s16 = 0, got_s, got_h;
                    for (int i = 0; i < 32; i++) s += q[32 * b + i], s16 += i < 16 ? q[32 * b + i] : 0;
                    memcpy(&got_s, row + K + K / 8 + 4 * b, 4);
                    memcpy(&got_h, row + K + K / 4 + 4 * b, 4);
                    rec_ok &= got_s == -128 * s && got_h == -128 * s16;
                }
                for (int n = 0; n < N; n++) {
                    float r = ref[m * ldy + n] = r16_ref(q, d, Wq + n * rb, K);
                    /* within quant.h's bound of the product over the dequantized weights */
                    td_dequantize_row(TD_DTYPE_Q8_0, Wq + n * rb, dq, K);
                    double ex = 0, bound = 0, rnd = 0;
                    for (int b = 0; b < K / 32; b++) {
                        double aw = 0;
                        for (int i = 0; i < 32; i++) {
                            ex += (double)dq[32 * b + i] * x[(size_t)m * K + 32 * b + i];
                            aw += fabs(dq[32 * b + i]);
                            rnd += fabs((double)dq[32 * b + i] * d[b] * q[32 * b + i]);
                        }
                        bound += 0.5001 * d[b] * aw;
                    }
                    bound += (K / 32 + 6) * ldexp(1.0, -23) * rnd;
                    if (fabs(r - ex) > bound && fails++ < 5) T_CHECK(0, "K %d: error %g over the bound %g", K, fabs(r - ex), bound);
                    if (bound > 0 && fabs(r - ex) / bound > worst) worst = fabs(r - ex) / bound;
                }
            }
            if (!rec_ok && fails++ < 5) T_CHECK(0, "K %d: the activation record is not q, d, -128 sum q, -128 sum of 16 q", K);
            for (size_t mi = 0; mi < sizeof Ms / sizeof Ms[0]; mi++) {
                int M = Ms[mi];
                for (int add = 0; add < 2; add++)
                    for (int st = 0; st < 3; st++) { /* weights in cache, then streamed on either one-token path */
                        int pfe = st ? N : 0;
                        int hw = st == 2, split = !add && N > 16;
                        td_kernels_set_hw_stream(split ? !hw : hw); /* split: the choice given per product */
                        init_got(got, MMAX * ldy);
                        /* one call, or two ranges split on a 16-output group, the later first */
                        if (!split) td_q8r_matmul(got, ldy, xq, M, R, K, 0, N, add, pfe, TD_Q8R_BYTES);
                        else {
                            td_q8r_matmul_hw(got, ldy, xq, M, R, K, 16, N, add, pfe, TD_Q8R_BYTES, hw);
                            td_q8r_matmul_hw(got, ldy, xq, M, R, K, 0, 16, add, pfe, TD_Q8R_BYTES, hw);
                        }
                        checked++;
                        if (!same_as_ref(got, ref, M, N, ldy, MMAX, add) && fails++ < 5)
                            T_CHECK(0, "M %d N %d K %d add %d pf_end %d hw %d: not the R16 order's bits", M, N, K, add, pfe,
                                    st == 2);
                    }
                td_kernels_set_hw_stream(-1);
            }
            if (K == 96 && N == 45) { /* a NaN in row 2's second block: that row NaN, the others unchanged */
                x[2 * K + 40] = NAN;
                td_q8r_act(xq, x, K, 5, K);
                td_q8r_matmul(got, ldy, xq, 5, R, K, 0, N, 0, 0, TD_Q8R_BYTES);
                int ok = 1;
                for (int m = 0; m < 5; m++)
                    for (int n = 0; n < N; n++)
                        ok &= m == 2 ? isnan(got[m * ldy + n]) : !memcmp(&got[m * ldy + n], &ref[m * ldy + n], 4);
                T_CHECK(ok, "a NaN activation: its row NaN, the other rows unchanged");
            }
            free(W); free(x); free(Wq); free(xq); free(R); free(ref); free(got); free(dq); free(q); free(d);
        }
    printf("  %d products compared with the scalar R16 order (memcmp); error vs dequantized weights, worst fraction "
           "of the stated bound: %.2f\n", checked, worst);
    t_end();
}

/* Q4_0, IQ4_NL and Q5_0 blocks in the R16 order: on every kernel path and for
 * every M (AMX tiles from 16 tokens), each output is bit for bit the one of the
 * Q8_0 matrix holding the same int8 values and f16 scales (test_q8r checks
 * that matrix's bits against the scalar order), from records of the file's
 * bytes (nibbles through tables of the formats' values + 128; Q5_0's fifth
 * bits from its qh plane). Ragged row counts
 * (a padded last group), K of 1, 3
 * and 32 blocks, odd output ranges split on a group. */
static void test_q8r_4bit(void) {
    t_begin("matmul_r16_4bit_blocks_as_q8_0");
    static const int dts[] = {TD_DTYPE_Q4_0, TD_DTYPE_IQ4_NL, TD_DTYPE_Q5_0};
    static const int Ns[] = {1, 17, 45}, Ks[] = {32, 96, 1024}, Ms[] = {1, 2, 5, 8, 16, 35};
    enum { MMAX = 35 };
    int checked = 0, fails = 0;
    T_CHECK(td_q8r_format(TD_DTYPE_Q8_0) == TD_Q8R_BYTES && td_q8r_format(TD_DTYPE_Q5_0) == TD_Q8R_Q5_0 &&
                td_q8r_format(TD_DTYPE_Q4_0) == TD_Q8R_NIB_Q4_0 && td_q8r_format(TD_DTYPE_IQ4_NL) == TD_Q8R_NIB_IQ4_NL &&
                td_q8r_format(TD_DTYPE_Q4_K) == TD_Q8R_Q4_K && td_q8r_format(TD_DTYPE_Q6_K) == TD_Q8R_Q6_K &&
                td_q8r_format(TD_DTYPE_Q5_K) == TD_Q8R_Q5_K && !td_q8r_dtype_ok(TD_DTYPE_Q4_1) &&
                !td_q8r_dtype_ok(TD_DTYPE_Q5_1) && !td_q8r_dtype_ok(TD_DTYPE_Q3_K) && !td_q8r_dtype_ok(TD_DTYPE_Q2_K) &&
                td_q8r_format(TD_DTYPE_IQ4_XS) == TD_Q8R_IQ4_XS && !td_q8r_dtype_ok(TD_DTYPE_BF16) && !td_q8r_table(TD_Q8R_BYTES),
            "R16 holds Q8_0 as bytes, Q4_0 and IQ4_NL as nibbles, Q5_0 as nibbles and bits, Q4_K, Q5_K, Q6_K, IQ4_XS, nothing else");
    for (int k = 0; k < 16; k++)
        T_CHECK(td_q8r_table(TD_Q8R_NIB_Q4_0)[k] == k - 8 + 128 && td_q8r_table(TD_Q8R_NIB_IQ4_NL)[k] == td_iq4_values[k] + 128 &&
                    td_q8r_table(TD_Q8R_Q5_0)[k] == k - 16 + 128,
                "nibble tables at %d", k);
    int deflt = td_kernels_path();
    for (size_t di = 0; di < sizeof dts / sizeof dts[0]; di++)
        for (size_t ki = 0; ki < sizeof Ks / sizeof Ks[0]; ki++)
            for (size_t ni = 0; ni < sizeof Ns / sizeof Ns[0]; ni++) {
                int dt = dts[di], K = Ks[ki], N = Ns[ni], nb = K / 32, fmt = td_q8r_format(dt), ldy = N + 1;
                size_t rb = td_dtype_row_bytes(dt, K), r8 = td_dtype_row_bytes(TD_DTYPE_Q8_0, K);
                float *W = malloc(sizeof(float) * N * K), *x = malloc(sizeof(float) * MMAX * K);
                float *want = malloc(sizeof(float) * MMAX * ldy), *got = malloc(sizeof(float) * MMAX * ldy);
                unsigned char *Wq = malloc(rb * N), *W8 = malloc(r8 * N), *xq = malloc(td_q8r_row_bytes(K) * MMAX);
                void *R = aligned_alloc(64, td_q8r_bytes(N, K, fmt)), *R8 = aligned_alloc(64, td_q8r_bytes(N, K, TD_Q8R_BYTES));
                T_REQUIRE(W && x && want && got && Wq && W8 && xq && R && R8, "memory");
                for (int i = 0; i < N * K; i++) W[i] = frand() * (i % 11 == 0 ? 4.0f : 1.0f);
                for (int i = 0; i < MMAX * K; i++) x[i] = frand();
                for (int n = 0; n < N; n++) td_quantize_row(dt, W + (size_t)n * K, Wq + n * rb, K);
                for (int n = 0; n < N; n++) /* the same values and scales as Q8_0 blocks */
                    for (int b = 0; b < nb; b++) {
                        const unsigned char *blk = Wq + n * rb + (size_t)b * (rb / nb);
                        unsigned char *o = W8 + n * r8 + 34 * (size_t)b;
                        memcpy(o, blk, 2);
                        td_block_i8(blk, dt, (int8_t *)(o + 2));
                    }
                td_q8r_repack(R, Wq, dt, N, K, 0, N);
                td_q8r_repack(R8, W8, TD_DTYPE_Q8_0, N, K, 0, N);
                td_q8r_act(xq, x, K, MMAX, K);
                td_kernels_set_path(TD_KPATH_PORTABLE);
                td_q8r_matmul(want, ldy, xq, MMAX, R8, K, 0, N, 0, 0, TD_Q8R_BYTES);
                for (int path = 0; path < TD_KPATH_COUNT; path++) {
                    if (path != TD_KPATH_PORTABLE && !td_kernels_supported(path)) continue;
                    td_kernels_set_path(path);
                    for (size_t mi = 0; mi < sizeof Ms / sizeof Ms[0]; mi++)
                        for (int st = 0; st < 4; st++) { /* cached, streamed, on either one-token path */
                            int M = Ms[mi], pfe = st == 1 || st == 2 ? N : 0;
                            int hw = st >= 2;
                            td_kernels_set_hw_stream(N <= 16 ? hw : !hw); /* split: the choice given per product */
                            init_got(got, MMAX * ldy);
                            if (N <= 16) td_q8r_matmul(got, ldy, xq, M, R, K, 0, N, 0, pfe, fmt);
                            else {
                                td_q8r_matmul_hw(got, ldy, xq, M, R, K, 16, N, 0, pfe, fmt, hw);
                                td_q8r_matmul_hw(got, ldy, xq, M, R, K, 0, 16, 0, pfe, fmt, hw);
                            }
                            checked++;
                            if (!same_as_ref(got, want, M, N, ldy, MMAX, 0) && fails++ < 5)
                                T_CHECK(0, "%s path %d M %d N %d K %d pf_end %d hw %d: not the Q8_0 matrix's bits", td_dtype_name(dt),
                                        path, M, N, K, pfe, st >= 2);
                        }
                    td_kernels_set_hw_stream(-1);
                }
                free(W), free(x), free(want), free(got), free(Wq), free(W8), free(xq), free(R), free(R8);
            }
    td_kernels_set_path(deflt);
    printf("  %d products of Q4_0, IQ4_NL and Q5_0 matrices: the bits of their Q8_0 transcriptions\n", checked);
done:
    td_kernels_set_path(deflt);
    t_end();
}

/* One Q4_K super-block (five: Q5_K's) decoded as GGUF defines it
 * (get_scale_min_k4 and the value order of dequantize_row_q4_K / _q5_K: qs
 * after the scales, or after Q5_K's 32 qh bytes, whose bit j of byte l is
 * worth 16 in value l of sub-block j), written out here, apart from the library. */
static void k4_decode(const unsigned char *blk, int five, float *d, float *dmin, int sc[8], int mn[8], int q[256]) {
    uint16_t h;
    memcpy(&h, blk, 2);
    *d = td_f16_to_f32(h);
    memcpy(&h, blk + 2, 2);
    *dmin = td_f16_to_f32(h);
    const unsigned char *s = blk + 4;
    for (int j = 0; j < 8; j++) {
        sc[j] = j < 4 ? s[j] & 63 : (s[j + 4] & 15) | (s[j - 4] >> 6) << 4;
        mn[j] = j < 4 ? s[j + 4] & 63 : (s[j + 4] >> 4) | (s[j] >> 6) << 4;
    }
    const unsigned char *qs = blk + (five ? 48 : 16), *qh = blk + 16;
    for (int c = 0; c < 4; c++)
        for (int l = 0; l < 32; l++) {
            q[64 * c + l] = (qs[32 * c + l] & 15) + (five ? 16 * (qh[l] >> (2 * c) & 1) : 0);
            q[64 * c + 32 + l] = (qs[32 * c + l] >> 4) + (five ? 16 * (qh[l] >> (2 * c + 1) & 1) : 0);
        }
}

/* One Q6_K super-block decoded as GGUF defines it (dequantize_row_q6_K): the
 * values q6 - 32 and the 16 int8 scales. */
static void k6_decode(const unsigned char *blk, float *d, int sc[16], int q[256]) {
    uint16_t h;
    memcpy(&h, blk + 208, 2);
    *d = td_f16_to_f32(h);
    for (int i = 0; i < 16; i++) sc[i] = (int8_t)blk[192 + i];
    for (int hf = 0; hf < 2; hf++) {
        const unsigned char *ql = blk + 64 * hf, *qh = blk + 128 + 32 * hf;
        for (int l = 0; l < 32; l++) {
            q[128 * hf + l] = ((ql[l] & 15) | (qh[l] & 3) << 4) - 32;
            q[128 * hf + l + 32] = ((ql[l + 32] & 15) | (qh[l] >> 2 & 3) << 4) - 32;
            q[128 * hf + l + 64] = ((ql[l] >> 4) | (qh[l] >> 4 & 3) << 4) - 32;
            q[128 * hf + l + 96] = ((ql[l + 32] >> 4) | (qh[l] >> 6 & 3) << 4) - 32;
        }
    }
}

/* One IQ4_XS super-block decoded as GGUF defines it (dequantize_row_iq4_xs): d, the
 * 8 scales ls - 32 and the values td_iq4_values[nibble] (sub-block j's 16 qs
 * bytes at 8 + 16j: value l the low nibble of byte l, value l + 16 the high). */
static void xs_decode(const unsigned char *blk, float *d, int sc[8], int q[256]) {
    uint16_t h, sh;
    memcpy(&h, blk, 2);
    memcpy(&sh, blk + 2, 2);
    *d = td_f16_to_f32(h);
    for (int j = 0; j < 8; j++) {
        sc[j] = ((blk[4 + j / 2] >> 4 * (j % 2) & 15) | (sh >> 2 * j & 3) << 4) - 32;
        for (int l = 0; l < 16; l++) {
            q[32 * j + l] = td_iq4_values[blk[8 + 16 * j + l] & 15];
            q[32 * j + l + 16] = td_iq4_values[blk[8 + 16 * j + l] >> 4];
        }
    }
}

/* Q4_K, Q5_K, Q6_K and IQ4_XS in the R16 order (q8r.h): on every kernel path and for every
 * M (AMX tiles from 16 tokens), each output is bit for bit q8r.h's statement
 * of it, computed here from the file's bytes (Q4_K, Q5_K: P and S per block of 32,
 * then fma(d sc d_b, P) and fma(dmin m d_b, -S); Q6_K: the sums of the two
 * halves of 16, then fma(d sc_lo d_b, P_lo) and fma(d sc_hi d_b, P_hi); IQ4_XS: P
 * per block of 32 of the table's values, then fma(d sc d_b, P)), and
 * within a stated bound of the product over the dequantized weights. Rows
 * with random scale and quant bytes (every code), ragged row counts, 1 and 3
 * super-blocks, output ranges split on a group. */
static void test_q8r_kq(int dt) {
    char name[64];
    snprintf(name, sizeof name, "matmul_r16_%s", td_dtype_name(dt));
    t_begin(name);
    int fmt = td_q8r_format(dt), six = dt == TD_DTYPE_Q6_K, five = dt == TD_DTYPE_Q5_K, xs = dt == TD_DTYPE_IQ4_XS;
    int sbb = six ? 210 : five ? 176 : xs ? 136 : 144;
    static const int Ns[] = {1, 17, 45}, Ks[] = {256, 768}, Ms[] = {1, 2, 3, 5, 8, 16, 35};
    enum { MMAX = 35 };
    int checked = 0, fails = 0;
    double worst = 0;
    int deflt = td_kernels_path();
    T_CHECK(td_q8r_table(fmt) && td_q8r_table(fmt)[0] == (six ? 96 : xs ? 1 : 128) &&
                td_q8r_table(fmt)[15] == (six ? 111 : xs ? 241 : 143),
            "the table: Q4_K's q + 128 (Q5_K's low 4 bits), Q6_K's low 4 bits + 96, IQ4_XS's IQ4_NL values + 128");
    for (size_t ki = 0; ki < sizeof Ks / sizeof Ks[0]; ki++)
        for (size_t ni = 0; ni < sizeof Ns / sizeof Ns[0]; ni++) {
            int K = Ks[ki], N = Ns[ni], nb = K / 32, nsb = K / 256, ldy = N + 1;
            size_t rb = td_dtype_row_bytes(dt, K), xb = td_q8r_row_bytes(K);
            float *W = malloc(sizeof(float) * N * K), *x = malloc(sizeof(float) * MMAX * K), *dq = malloc(sizeof(float) * K);
            float *want = malloc(sizeof(float) * MMAX * ldy), *got = malloc(sizeof(float) * MMAX * ldy);
            unsigned char *Wq = malloc(rb * N), *xq = malloc(xb * MMAX);
            void *R = aligned_alloc(64, td_q8r_bytes(N, K, fmt));
            T_REQUIRE(W && x && dq && want && got && Wq && xq && R, "memory");
            for (int i = 0; i < N * K; i++) W[i] = frand() * (i % 11 == 0 ? 4.0f : 1.0f) + (i % 256 < 32 ? 0.5f : 0.0f);
            for (int i = 0; i < MMAX * K; i++) x[i] = frand() * (i % 7 == 0 ? 8.0f : 1.0f);
            for (int n = 0; n < N; n++) {
                td_quantize_row(dt, W + (size_t)n * K, Wq + n * rb, K);
                if (n % 3 == 1) /* random scale, minimum and quant bytes (d, dmin kept) */
                    for (int sb = 0; sb < nsb; sb++)
                        for (int i = six ? 0 : xs ? 2 : 4; i < (six ? 208 : sbb); i++)
                            Wq[n * rb + (size_t)sbb * sb + i] = (unsigned char)(tm_rng(&g_rng) >> 24);
            }
            td_q8r_repack(R, Wq, dt, N, K, 0, N);
            td_q8r_act(xq, x, K, MMAX, K);
            for (int m = 0; m < MMAX; m++) {
                const unsigned char *row = xq + (size_t)m * xb;
                const int8_t *q = (const int8_t *)row;
                for (int n = 0; n < N; n++) {
                    float a = 0.0f;
                    double ex = 0, bound = 0, rnd = 0;
                    td_dequantize_row(dt, Wq + n * rb, dq, K);
                    for (int sb = 0; sb < nsb; sb++) {
                        float d, dmin = 0;
                        int sc[16], mn[8], qv[256];
                        if (six) k6_decode(Wq + n * rb + (size_t)sbb * sb, &d, sc, qv);
                        else if (xs) xs_decode(Wq + n * rb + (size_t)sbb * sb, &d, sc, qv);
                        else k4_decode(Wq + n * rb + (size_t)sbb * sb, five, &d, &dmin, sc, mn, qv);
                        for (int j = 0; j < 8; j++) {
                            int b = 8 * sb + j;
                            int32_t P = 0, S = 0, P2 = 0;
                            for (int i = 0; i < 32; i++) {
                                if (six && i >= 16) P2 += qv[32 * j + i] * q[32 * b + i];
                                else P += qv[32 * j + i] * q[32 * b + i];
                                S += q[32 * b + i];
                            }
                            float db;
                            memcpy(&db, row + K + 4 * b, 4);
                            if (six) {
                                a = fmaf(d * (float)sc[2 * j] * db, (float)P, a);
                                a = fmaf(d * (float)sc[2 * j + 1] * db, (float)P2, a);
                            } else if (xs) {
                                a = fmaf(d * (float)sc[j] * db, (float)P, a);
                            } else {
                                a = fmaf(d * (float)sc[j] * db, (float)P, a);
                                a = fmaf(dmin * (float)mn[j] * db, (float)-S, a);
                            }
                            double aw = 0;
                            for (int i = 0; i < 32; i++) {
                                ex += (double)dq[32 * b + i] * x[(size_t)m * K + 32 * b + i];
                                aw += fabs(dq[32 * b + i]);
                                rnd += fabs((double)dq[32 * b + i] * db * q[32 * b + i]);
                            }
                            bound += 0.5001 * db * aw;
                        }
                    }
                    want[m * ldy + n] = a;
                    bound += (2 * nb + 6) * ldexp(1.0, -23) * (rnd + 1e-30);
                    if (fabs(a - ex) > bound && fails++ < 5) T_CHECK(0, "N %d K %d: error %g over the bound %g", N, K, fabs(a - ex), bound);
                    if (bound > 0 && fabs(a - ex) / bound > worst) worst = fabs(a - ex) / bound;
                }
            }
            for (int path = 0; path < TD_KPATH_COUNT; path++) {
                if (path != TD_KPATH_PORTABLE && !td_kernels_supported(path)) continue;
                td_kernels_set_path(path);
                for (size_t mi = 0; mi < sizeof Ms / sizeof Ms[0]; mi++)
                    for (int add = 0; add < 2; add++)
                        for (int st = 0; st < 4; st++) { /* cached, streamed, on either one-token path */
                            int M = Ms[mi], pfe = st == 1 || st == 2 ? N : 0;
                            int hw = st >= 2, split = !add && N > 16;
                            td_kernels_set_hw_stream(split ? !hw : hw); /* split: the choice given per product */
                            init_got(got, MMAX * ldy);
                            if (!split) td_q8r_matmul(got, ldy, xq, M, R, K, 0, N, add, pfe, fmt);
                            else {
                                td_q8r_matmul_hw(got, ldy, xq, M, R, K, 16, N, 0, pfe, fmt, hw);
                                td_q8r_matmul_hw(got, ldy, xq, M, R, K, 0, 16, 0, pfe, fmt, hw);
                            }
                            checked++;
                            if (!same_as_ref(got, want, M, N, ldy, MMAX, add) && fails++ < 5)
                                T_CHECK(0, "path %d M %d N %d K %d add %d pf_end %d hw %d: not the order's bits", path, M, N, K,
                                        add, pfe, st >= 2);
                        }
                td_kernels_set_hw_stream(-1);
            }
            td_kernels_set_path(deflt);
            free(W), free(x), free(dq), free(want), free(got), free(Wq), free(xq), free(R);
        }
    printf("  %d products of %s matrices: the R16 order's bits; error vs dequantized weights, worst fraction of the "
           "stated bound: %.2f\n", checked, td_dtype_name(dt), worst);
done:
    td_kernels_set_path(deflt);
    t_end();
}

/* non-finite activations give NaN outputs (never a number) on every path; the
 * other rows are unaffected */
static void test_nonfinite(void) {
    t_begin("matmul_nonfinite_activations_nan");
    enum { K = 512, N = 5 };
    float *W = malloc(sizeof(float) * N * K), *x = malloc(sizeof(float) * 3 * K), y[3 * N];
    unsigned char *Wq = malloc(34 * N * K / 32);
    T_REQUIRE(W && x && Wq, "memory");
    for (int i = 0; i < N * K; i++) W[i] = frand();
    for (int i = 0; i < 3 * K; i++) x[i] = frand();
    x[K + 300] = NAN;
    x[2 * K + 3] = -INFINITY;
    int deflt = td_kernels_path();
    for (int dt = TD_DTYPE_Q8_0; dt < TD_DTYPE_COUNT; dt++) {
        size_t rb = td_dtype_row_bytes(dt, K);
        for (int n = 0; n < N; n++) td_quantize_row(dt, W + n * K, Wq + n * rb, K);
        for (int p = 0; p < TD_KPATH_COUNT; p++) {
            if (p != TD_KPATH_PORTABLE && !td_kernels_supported(p)) continue;
            td_kernels_set_path(p);
            td_matmul(y, N, x, K, 3, Wq, dt, K, 0, N, 0);
            int ok = 1;
            for (int n = 0; n < N; n++) ok &= isfinite(y[n]) && isnan(y[N + n]) && isnan(y[2 * N + n]);
            T_CHECK(ok, "%s path %d: NaN / inf activations must give NaN outputs, finite ones numbers", td_dtype_name(dt), p);
        }
    }
    td_kernels_set_path(deflt);
    /* the quantizers on non-finite weights: defined bytes (the sanitizer build traps
     * an undefined float-to-int conversion), decoded without a trap */
    for (int i = 0; i < K; i++) W[i] = i % 50 == 0 ? INFINITY : i % 77 == 0 ? NAN : frand();
    for (int dt = TD_DTYPE_Q8_0; dt < TD_DTYPE_COUNT; dt++) {
        T_CHECK(td_quantize_row(dt, W, Wq, K) == 0, "%s quantize", td_dtype_name(dt));
        td_dequantize_row(dt, Wq, x, K);
    }
done:
    free(W); free(x); free(Wq);
    t_end();
}

/* llama.cpp's own dot products (ggml_vec_dot_q8_0_q8_0 / _q4_0_q8_0 of
 * libggml-cpu-x64.so, the package's baseline x86-64 CPU backend) on activations
 * that both quantize exactly (x = q * 2^-e with a |q| = 127 in every block, so
 * d = 2^-e in f32 and f16 alike): the integer block products must agree, so the
 * results differ only by the f32 summation order (bound: (nb + 6) 2^-22 *
 * sum_b |c_b| sum |w q|). Also: td_quant_act_row's q and d against ggml's
 * reference quantizer on random activations (the same q except at exact .5
 * ties, where tandem rounds to even and ggml away from zero). */
/* Activation quantization (td_quant_act_row, _k) gives the same q, d and sums on
 * every kernel path: blocks of every magnitude, ties at .5, tiny blocks (q = 0,
 * d = 0), and blocks holding a NaN or an infinity (q = 0, d = NaN). */
static void test_act_paths(void) {
    t_begin("quant_act_rows_same_bits_on_every_path");
    enum { K = 1024 };
    float *x = malloc(sizeof(float) * K);
    int8_t q[TD_KPATH_COUNT][K];
    float d[TD_KPATH_COUNT][K / 32];
    int32_t S[TD_KPATH_COUNT][K / 32];
    int16_t S16[TD_KPATH_COUNT][K / 16];
    T_REQUIRE(x, "memory");
    int deflt = td_kernels_path(), checked = 0;
    for (int rep = 0; rep < 40; rep++) {
        for (int k = 0; k < K; k++) x[k] = frand() * ldexpf(1.0f, (k / 32 + rep) % 40 - 20);
        for (int k = 64; k < 96; k++) x[k] = (float)(k - 80) * 0.5f * (rep % 3 + 1); /* exact .5 ties once scaled by 127 / 16 */
        for (int k = 96; k < 128; k++) x[k] = ldexpf(frand(), -110);               /* tiny block */
        if (rep % 4 == 1) x[300] = NAN;
        if (rep % 4 == 2) x[700] = rep % 8 == 2 ? INFINITY : -INFINITY;
        for (int p = 0; p < TD_KPATH_COUNT; p++) {
            if (p != TD_KPATH_PORTABLE && !td_kernels_supported(p)) continue;
            td_kernels_set_path(p);
            if (rep % 2) td_quant_act_row_k(x, K, q[p], d[p], S[p], S16[p]);
            else td_quant_act_row(x, K, q[p], d[p]);
            int nd = rep % 2 ? K / 256 : K / 32;
            if (p == TD_KPATH_PORTABLE) continue;
            checked++;
            T_CHECK(memcmp(q[p], q[TD_KPATH_PORTABLE], K) == 0, "rep %d path %d: q differs from the portable path", rep, p);
            T_CHECK(memcmp(d[p], d[TD_KPATH_PORTABLE], sizeof(float) * (size_t)nd) == 0, "rep %d path %d: d differs", rep, p);
            if (rep % 2)
                T_CHECK(memcmp(S[p], S[TD_KPATH_PORTABLE], sizeof S[p]) == 0 && memcmp(S16[p], S16[TD_KPATH_PORTABLE], sizeof S16[p]) == 0,
                        "rep %d path %d: block sums differ", rep, p);
        }
        /* the rule itself, on the portable path's output: a NaN / inf block has d NaN and q 0 */
        if (rep % 4 == 1 || rep % 4 == 2) {
            int b = (rep % 4 == 1 ? 300 : 700) / (rep % 2 ? 256 : 32), n = rep % 2 ? 256 : 32, zero = 1;
            for (int j = 0; j < n; j++) zero &= q[TD_KPATH_PORTABLE][b * n + j] == 0;
            T_CHECK(isnan(d[TD_KPATH_PORTABLE][b]) && zero, "rep %d: a non-finite block must give d = NaN, q = 0", rep);
        }
    }
    td_kernels_set_path(deflt);
    if (!checked) printf("  (only the portable path here: nothing to compare)\n");
done:
    free(x);
    t_end();
}

static void test_ggml_dot(void) {
    t_begin("ggml_vec_dot_agrees");
    char bb[300], bc[300];
    const char *base = ggml_lib(bb, sizeof bb, "libggml-base.so"), *cpu = ggml_lib(bc, sizeof bc, "libggml-cpu-x64.so");
    void *hb = NULL, *hc = NULL;
    float *x = NULL, *W = NULL;
    unsigned char *wq = NULL, *yq = NULL;
    int8_t *q = NULL;
#if !defined(__x86_64__)
    printf("  %s is an x86-64 library: skipped on this architecture\n", cpu);
    goto done;
#endif
    if (access(cpu, R_OK) != 0 || access(base, R_OK) != 0) {
        printf("  %s not installed: skipped (scripts/test-deps llama installs it on x86-64 Linux)\n", cpu);
        goto done;
    }
    hb = dlopen(base, RTLD_NOW | RTLD_GLOBAL);
    T_REQUIRE(hb != NULL, "dlopen %s: %s", base, dlerror());
    hc = dlopen(cpu, RTLD_NOW | RTLD_LOCAL);
    T_REQUIRE(hc != NULL, "dlopen %s: %s", cpu, dlerror());
    typedef void (*vdfn)(int, float *, size_t, const void *, size_t, const void *, size_t, int);
    typedef void (*qfn)(const float *, void *, int64_t);
    void (*init)(void) = (void (*)(void))dlsym(hc, "ggml_cpu_init");
    vdfn vdf[NDOT] = {(vdfn)dlsym(hc, "ggml_vec_dot_q8_0_q8_0"), (vdfn)dlsym(hc, "ggml_vec_dot_q4_0_q8_0"),
                      (vdfn)dlsym(hc, "ggml_vec_dot_q5_0_q8_0"), (vdfn)dlsym(hc, "ggml_vec_dot_iq4_nl_q8_0")};
    qfn qref = (qfn)dlsym(hb, "quantize_row_q8_0_ref");
    T_REQUIRE(init && vdf[0] && vdf[1] && vdf[2] && vdf[3] && qref, "symbols missing from %s", cpu);
    init();
    enum { KMAX = 32 * 96 };
    x = malloc(sizeof(float) * KMAX); W = malloc(sizeof(float) * KMAX);
    wq = malloc(34 * KMAX / 32); yq = malloc(34 * KMAX / 32); q = malloc(KMAX);
    float dq[KMAX / 32];
    int deflt = td_kernels_path(), bad = 0, n = 0, badq = 0, ties = 0;
    double worst = 0;
    for (int rep = 0; rep < 200; rep++) {
        int nb = 1 + (int)(tm_rng(&g_rng) % 96), K = 32 * nb, dt = DOTDT[rep % NDOT];
        for (int k = 0; k < K; k++) W[k] = frand() * (k % 11 == 0 ? 3.0f : 1.0f);
        td_quantize_row(dt, W, wq, K);
        if (dt == TD_DTYPE_Q8_0) wq[2 + (rep * 5) % 32] = 0x80; /* a weight byte of -128 */
        double tolsum = 0;
        for (int b = 0; b < nb; b++) {
            int e = 1 + (int)(tm_rng(&g_rng) % 20), zero = tm_rng(&g_rng) % 9 == 0;
            float d = ldexpf(1.0f, -e);
            unsigned char *yb = yq + 34 * b;
            uint16_t h = td_f32_to_f16(d);
            memcpy(yb, &h, 2);
            for (int j = 0; j < 32; j++) {
                int v = zero ? 0 : j == (b * 7) % 32 ? (b & 1 ? -127 : 127) : (int)(tm_rng(&g_rng) % 255) - 127;
                x[32 * b + j] = (float)v * d;
                yb[2 + j] = (unsigned char)(int8_t)v;
            }
            float wd[32];
            td_dequantize_row(dt, wq + td_dtype_row_bytes(dt, 32) * (size_t)b, wd, 32);
            for (int j = 0; j < 32; j++) tolsum += fabs((double)wd[j] * x[32 * b + j]);
        }
        float ref;
        vdf[rep % NDOT](K, &ref, 0, wq, 0, yq, 0, 1);
        double tol = (nb + 6) * ldexp(1.0, -22) * tolsum;
        for (int p = 0; p < TD_KPATH_COUNT; p++) {
            if (p != TD_KPATH_PORTABLE && !td_kernels_supported(p)) continue;
            td_kernels_set_path(p);
            float got;
            td_matmul(&got, 1, x, K, 1, wq, dt, K, 0, 1, 0);
            double e = fabs((double)got - ref);
            n++;
            if (e > tol && bad++ < 5) T_CHECK(0, "%s K %d path %d: %.9g vs ggml %.9g (tolerance %g)", td_dtype_name(dt), K, p, got, ref, tol);
            if (tol > 0 && e / tol > worst) worst = e / tol;
        }
        /* activation quantization against ggml's reference quantizer */
        for (int k = 0; k < K; k++) x[k] = frand() * (k % 7 == 0 ? 5.0f : 1.0f) * ldexpf(1.0f, rep % 9 - 4);
        td_quant_act_row(x, K, q, dq);
        qref(x, yq, K);
        for (int b = 0; b < nb; b++) {
            uint16_t h;
            memcpy(&h, yq + 34 * b, 2);
            badq += h != td_f32_to_f16(dq[b]);
            for (int j = 0; j < 32; j++) {
                if (q[32 * b + j] == (int8_t)yq[34 * b + 2 + j]) continue;
                float v = x[32 * b + j] * (1.0f / dq[b]);
                if (fabsf(v - truncf(v)) == 0.5f && abs(q[32 * b + j] - (int8_t)yq[34 * b + 2 + j]) == 1) ties++;
                else badq++;
            }
        }
    }
    td_kernels_set_path(deflt);
    printf("  %d dot products: worst difference %.3f of the summation-order bound; activation quantization: %d "
           "mismatches, %d ties rounded to even\n", n, worst, badq, ties);
    T_CHECK(badq == 0, "%d activation scales / values differ from quantize_row_q8_0_ref", badq);
done:
    if (hc) dlclose(hc);
    if (hb) dlclose(hb);
    free(x); free(W); free(wq); free(yq); free(q);
    t_end();
}

static void test_bad_sizes(void) {
    t_begin("bad_k_and_tensor_sizes");
    td_err err = {0};
    T_CHECK(td_dtype_check_row(TD_DTYPE_Q8_0, 48, "w", &err) == TD_EFORMAT && strstr(err.msg, "48") &&
                strstr(err.msg, "multiple of 32"), "K=48: %s", err.msg);
    T_CHECK(td_dtype_check_row(TD_DTYPE_Q4_0, 64, "w", &err) == 0 && td_dtype_check_row(TD_DTYPE_BF16, 7, "w", &err) == 0,
            "good rows");
    T_CHECK(td_dtype_check_tensor(TD_DTYPE_Q8_0, 10, 64, 680, "w", &err) == 0, "right size");
    T_CHECK(td_dtype_check_tensor(TD_DTYPE_Q8_0, 10, 64, 679, "blk.0.attn_q.weight", &err) == TD_EFORMAT &&
                strstr(err.msg, "blk.0.attn_q.weight") && strstr(err.msg, "680") && strstr(err.msg, "679"),
            "short: %s", err.msg);
    T_CHECK(td_dtype_check_tensor(TD_DTYPE_Q4_0, 10, 64, 361, "w", &err) == TD_EFORMAT, "long");
    T_CHECK(td_dtype_check_tensor(TD_DTYPE_Q4_0, (int64_t)1 << 62, 1 << 20, 0, "w", &err) == TD_EFORMAT, "overflow");
    T_CHECK(td_dtype_check_tensor(9, 1, 32, 64, "w", &err) == TD_EFORMAT, "unknown dtype");
    /* a product over a K that is not a multiple of 32 never returns numbers */
    float x[48] = {0}, y[2] = {1, 1};
    unsigned char w[2 * 34] = {0};
    td_matmul(y, 2, x, 48, 1, w, TD_DTYPE_Q8_0, 48, 0, 2, 0);
    T_CHECK(isnan(y[0]) && isnan(y[1]), "K=48 gives NaN");
    t_end();
}

/* ---- k-quants (Q4_K, Q5_K, Q6_K) ------------------------------------------------ */


/* One super-block decoded the way llama.cpp's dequantize_row_q*_K loops walk it
 * (a transcription independent of src/nn/kquant.c): v[256] the integers of the
 * product (Q4_K/Q5_K: q; Q6_K: q - 32), ws[16] the scale of each 16 values
 * (d * sc), wm[16] each 16 values' minimum scale (dmin * m; 0 without minimums);
 * isc / im the integer scales and minimums. */
static void kref_decode(int dt, const unsigned char *blk, int v[256], float ws[16], float wm[16], int isc[16], int im[16]) {
    uint16_t h;
    if (dt == TD_DTYPE_Q2_K) { /* dequantize_row_q2_K's loops */
        uint16_t hm;
        memcpy(&h, blk + 80, 2);
        memcpy(&hm, blk + 82, 2);
        float d = td_f16_to_f32(h), dmin = td_f16_to_f32(hm);
        const unsigned char *q = blk + 16;
        int is = 0, y = 0;
        for (int n = 0; n < 256; n += 128) {
            int shift = 0;
            for (int j = 0; j < 4; ++j) {
                for (int half = 0; half < 2; half++) {
                    int sc = blk[is];
                    isc[is] = sc & 0xF;
                    im[is] = sc >> 4;
                    ws[is] = d * (float)isc[is];
                    wm[is] = dmin * (float)im[is];
                    for (int l = 0; l < 16; ++l) v[y + 16 * half + l] = (q[16 * half + l] >> shift) & 3;
                    is++;
                }
                y += 32;
                shift += 2;
            }
            q += 32;
        }
        return;
    }
    if (dt == TD_DTYPE_Q3_K) { /* dequantize_row_q3_K's loops: the scales unpacked word by word */
        uint32_t aux[4], tmp;
        memcpy(aux, blk + 96, 12);
        tmp = aux[2];
        aux[2] = ((aux[0] >> 4) & 0x0f0f0f0f) | (((tmp >> 4) & 0x03030303) << 4);
        aux[3] = ((aux[1] >> 4) & 0x0f0f0f0f) | (((tmp >> 6) & 0x03030303) << 4);
        aux[0] = (aux[0] & 0x0f0f0f0f) | (((tmp >> 0) & 0x03030303) << 4);
        aux[1] = (aux[1] & 0x0f0f0f0f) | (((tmp >> 2) & 0x03030303) << 4);
        const int8_t *sc = (const int8_t *)aux;
        memcpy(&h, blk + 108, 2);
        float d = td_f16_to_f32(h);
        const unsigned char *q = blk + 32, *hm = blk;
        int is = 0, m = 1, y = 0;
        for (int n = 0; n < 256; n += 128) {
            int shift = 0;
            for (int j = 0; j < 4; ++j) {
                for (int half = 0; half < 2; half++) {
                    isc[is] = sc[is] - 32;
                    ws[is] = d * (float)isc[is];
                    for (int l = 0; l < 16; ++l)
                        v[y + 16 * half + l] = ((q[16 * half + l] >> shift) & 3) - ((hm[16 * half + l] & m) ? 0 : 4);
                    is++;
                }
                y += 32;
                shift += 2;
                m <<= 1;
            }
            q += 32;
        }
        for (int j = 0; j < 16; j++) wm[j] = (float)(im[j] = 0);
        return;
    }
    if (dt == TD_DTYPE_IQ4_XS) { /* dequantize_row_iq4_xs's loop */
        uint16_t sh;
        memcpy(&h, blk, 2);
        memcpy(&sh, blk + 2, 2);
        float d = td_f16_to_f32(h);
        const unsigned char *sl = blk + 4, *qs = blk + 8;
        for (int ib = 0; ib < 8; ib++) {
            int ls = ((sl[ib / 2] >> 4 * (ib % 2)) & 0xf) | (((sh >> 2 * ib) & 3) << 4);
            for (int j = 0; j < 16; j++) {
                v[32 * ib + j] = td_iq4_values[qs[16 * ib + j] & 0xf];
                v[32 * ib + j + 16] = td_iq4_values[qs[16 * ib + j] >> 4];
            }
            isc[2 * ib] = isc[2 * ib + 1] = ls - 32;
            ws[2 * ib] = ws[2 * ib + 1] = d * (float)(ls - 32);
            wm[2 * ib] = wm[2 * ib + 1] = 0.0f;
            im[2 * ib] = im[2 * ib + 1] = 0;
        }
        return;
    }
    if (dt == TD_DTYPE_Q6_K) {
        memcpy(&h, blk + 208, 2);
        float d = td_f16_to_f32(h);
        const unsigned char *ql = blk, *qh = blk + 128;
        const int8_t *sc = (const int8_t *)(blk + 192);
        for (int n = 0; n < 2; n++) {
            for (int l = 0; l < 32; l++) {
                v[128 * n + l] = ((ql[64 * n + l] & 15) | ((qh[32 * n + l] >> 0) & 3) << 4) - 32;
                v[128 * n + l + 32] = ((ql[64 * n + l + 32] & 15) | ((qh[32 * n + l] >> 2) & 3) << 4) - 32;
                v[128 * n + l + 64] = ((ql[64 * n + l] >> 4) | ((qh[32 * n + l] >> 4) & 3) << 4) - 32;
                v[128 * n + l + 96] = ((ql[64 * n + l + 32] >> 4) | ((qh[32 * n + l] >> 6) & 3) << 4) - 32;
            }
        }
        for (int i = 0; i < 16; i++) ws[i] = d * (float)(isc[i] = sc[i]);
        for (int j = 0; j < 16; j++) wm[j] = (float)(im[j] = 0);
        return;
    }
    uint16_t hm;
    memcpy(&h, blk, 2);
    memcpy(&hm, blk + 2, 2);
    float d = td_f16_to_f32(h), dmin = td_f16_to_f32(hm);
    const unsigned char *s = blk + 4, *qh = blk + 16, *qs = blk + (dt == TD_DTYPE_Q5_K ? 48 : 16);
    for (int j = 0; j < 8; j++) {
        int sc, m;
        if (j < 4) { sc = s[j] & 63; m = s[j + 4] & 63; }
        else { sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4); m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4); }
        ws[2 * j] = ws[2 * j + 1] = d * (float)sc;
        isc[2 * j] = isc[2 * j + 1] = sc;
        wm[2 * j] = wm[2 * j + 1] = dmin * (float)m;
        im[2 * j] = im[2 * j + 1] = m;
    }
    for (int g = 0; g < 4; g++)
        for (int l = 0; l < 32; l++) {
            v[64 * g + l] = qs[32 * g + l] & 0xF;
            v[64 * g + 32 + l] = qs[32 * g + l] >> 4;
            if (dt == TD_DTYPE_Q5_K) {
                v[64 * g + l] += qh[l] & (1 << (2 * g)) ? 16 : 0;
                v[64 * g + 32 + l] += qh[l] & (2 << (2 * g)) ? 16 : 0;
            }
        }
}

/* random super-blocks: every byte random, the f16 scales finite (any value of a
 * finite scale is a valid block; the quantizer never writes most of them) */
static void krand_blocks(int dt, unsigned char *b, int nsb) {
    size_t bs = td_dtype_row_bytes(dt, 256);
    for (size_t i = 0; i < bs * (size_t)nsb; i++) b[i] = (unsigned char)tm_rng(&g_rng);
    for (int s = 0; s < nsb; s++)
        for (int k = 0; k < (dt == TD_DTYPE_Q6_K || dt == TD_DTYPE_IQ4_XS || dt == TD_DTYPE_Q3_K ? 1 : 2); k++) {
            uint16_t h = td_f32_to_f16(frand() * ldexpf(1.0f, (int)(tm_rng(&g_rng) % 12) - 14));
            size_t at = dt == TD_DTYPE_Q6_K ? 208 : dt == TD_DTYPE_Q3_K ? 108 : dt == TD_DTYPE_Q2_K ? 80 : 0;
            memcpy(b + bs * (size_t)s + at + 2 * (size_t)k, &h, 2);
        }
}

static void test_kq_layout(void) {
    t_begin("kquant_layout_and_sizes");
    T_CHECK(td_dtype_row_bytes(TD_DTYPE_Q4_K, 512) == 288 && td_dtype_row_bytes(TD_DTYPE_Q5_K, 256) == 176 &&
                td_dtype_row_bytes(TD_DTYPE_Q6_K, 768) == 630, "row bytes");
    T_CHECK(td_dtype_row_bytes(TD_DTYPE_Q4_K, 384) == 0 && td_dtype_row_bytes(TD_DTYPE_Q6_K, 32) == 0, "partial super-block");
    td_err err = {0};
    T_CHECK(td_dtype_check_row(TD_DTYPE_Q5_K, 384, "blk.0.ffn_down.weight", &err) == TD_EFORMAT &&
                strstr(err.msg, "multiple of 256") && strstr(err.msg, "blk.0.ffn_down.weight"), "K=384: %s", err.msg);
    T_CHECK(!strcmp(td_dtype_name(TD_DTYPE_Q4_K), "q4_k") && td_dtype_parse("q6_k") == TD_DTYPE_Q6_K &&
                td_dtype_parse("q6_K") == -1, "names");
    /* hand-made blocks, values from quant.h's definition */
    unsigned char b[210];
    float y[256];
    int bad = 0;
    memset(b, 0, sizeof b);
    uint16_t one = td_f32_to_f16(1.0f), half = td_f32_to_f16(0.5f);
    memcpy(b, &one, 2);
    memcpy(b + 2, &half, 2);
    /* sub-block j: sc = j + 1 (j = 7: 40, past 4 bits), m = 2 j (j = 6: 33) */
    int sc[8] = {1, 2, 3, 4, 5, 6, 7, 40}, mm[8] = {0, 2, 4, 6, 8, 10, 33, 14};
    for (int j = 0; j < 4; j++) {
        b[4 + j] = (unsigned char)(sc[j] | (sc[j + 4] >> 4) << 6);
        b[8 + j] = (unsigned char)(mm[j] | (mm[j + 4] >> 4) << 6);
        b[12 + j] = (unsigned char)((sc[j + 4] & 15) | (mm[j + 4] & 15) << 4);
    }
    for (int i = 0; i < 128; i++) b[16 + i] = (unsigned char)((i % 16) | (15 - i % 16) << 4);
    td_dequantize_row(TD_DTYPE_Q4_K, b, y, 256);
    for (int v = 0; v < 256; v++) {
        int j = v / 32, l = v % 32, q = j % 2 ? 15 - l % 16 : l % 16;
        bad += y[v] != (float)(sc[j] * q) - 0.5f * (float)mm[j];
    }
    T_CHECK(bad == 0, "q4_k: %d of 256 values", bad);
    /* Q5_K: the same scales; qh bit j of byte l set when l is odd */
    unsigned char b5[176];
    memcpy(b5, b, 16);
    for (int l = 0; l < 32; l++) b5[16 + l] = l & 1 ? 0xff : 0;
    memcpy(b5 + 48, b + 16, 128);
    td_dequantize_row(TD_DTYPE_Q5_K, b5, y, 256);
    bad = 0;
    for (int v = 0; v < 256; v++) {
        int j = v / 32, l = v % 32, q = (j % 2 ? 15 - l % 16 : l % 16) + (l & 1 ? 16 : 0);
        bad += y[v] != (float)(sc[j] * q) - 0.5f * (float)mm[j];
    }
    T_CHECK(bad == 0, "q5_k: %d of 256 values", bad);
    /* Q6_K: q = v % 64, scale of 16 values i = i - 8, d = 0.25 */
    memset(b, 0, sizeof b);
    for (int v = 0; v < 256; v++) {
        int q = (v * 5) % 64, h = v / 128, g = (v % 128) / 32, l = v % 32;
        b[64 * h + 32 * (g & 1) + l] |= (unsigned char)((q & 15) << (g < 2 ? 0 : 4));
        b[128 + 32 * h + l] |= (unsigned char)((q >> 4) << (2 * g));
    }
    for (int i = 0; i < 16; i++) b[192 + i] = (unsigned char)(int8_t)(i - 8);
    uint16_t qd = td_f32_to_f16(0.25f);
    memcpy(b + 208, &qd, 2);
    td_dequantize_row(TD_DTYPE_Q6_K, b, y, 256);
    bad = 0;
    for (int v = 0; v < 256; v++) bad += y[v] != 0.25f * (float)(v / 16 - 8) * (float)((v * 5) % 64 - 32);
    T_CHECK(bad == 0, "q6_k: %d of 256 values", bad);
    t_end();
}

/* llama.cpp's own dequantizers (libggml-base.so) on random blocks and on
 * tandem's quantizer output: the same f32 bits; and tandem's quantizers' error
 * against ggml's reference quantizers' on the same rows */
static void test_kq_ggml(void) {
    t_begin("kquant_ggml_dequantizers_agree");
    enum { K = 256 * 24 };
    int missing;
    float *x = malloc(sizeof(float) * K), *y = malloc(sizeof(float) * K), *z = malloc(sizeof(float) * K);
    unsigned char *a = malloc(210 * K / 256), *b = malloc(210 * K / 256);
    void *h = ggml_open("libggml-base.so", RTLD_LOCAL, &missing);
    T_REQUIRE(x && y && z && a && b, "memory");
    if (missing) goto done;
    T_REQUIRE(h != NULL, "libggml-base.so does not load");
    typedef void (*qfn)(const float *, void *, int64_t);
    typedef void (*dqfn)(const void *, float *, int64_t);
    static const char *dqn[NKDT] = {"dequantize_row_q4_K", "dequantize_row_q5_K", "dequantize_row_q6_K", "dequantize_row_iq4_xs",
                                    "dequantize_row_q3_K", "dequantize_row_q2_K"};
    static const char *qn[NKDT] = {"quantize_row_q4_K_ref", "quantize_row_q5_K_ref", "quantize_row_q6_K_ref",
                                   "quantize_row_iq4_xs_ref", "quantize_row_q3_K_ref", "quantize_row_q2_K_ref"};
    for (int ki = 0; ki < NKDT; ki++) {
        int dt = KDT[ki];
        dqfn dq = (dqfn)dlsym(h, dqn[ki]);
        qfn qr = (qfn)dlsym(h, qn[ki]);
        T_REQUIRE(dq && qr, "%s / %s missing from libggml-base.so", dqn[ki], qn[ki]);
        int badr = 0, badq = 0;
        double e_td = 0, e_gg = 0, x2 = 0;
        for (int rep = 0; rep < 20; rep++) {
            krand_blocks(dt, a, K / 256);
            td_dequantize_row(dt, a, y, K);
            dq(a, z, K);
            badr += memcmp(y, z, sizeof(float) * K) != 0;
            float scale = ldexpf(1.0f, rep % 9 - 4);
            for (int i = 0; i < K; i++) {
                x[i] = frand() * scale * (i % 97 == 0 ? 6.0f : 1.0f);
                if (rep % 4 == 1 && i % 3) x[i] = fabsf(x[i]); /* lopsided blocks: the minimums matter */
            }
            if (rep % 5 == 0) memset(x + 256, 0, sizeof(float) * 256); /* an all-zero super-block */
            T_REQUIRE(td_quantize_row(dt, x, a, K) == 0, "quantize");
            td_dequantize_row(dt, a, y, K);
            dq(a, z, K);
            badq += memcmp(y, z, sizeof(float) * K) != 0;
            qr(x, b, K);
            dq(b, z, K);
            for (int i = 0; i < K; i++) {
                e_td += ((double)y[i] - x[i]) * ((double)y[i] - x[i]);
                e_gg += ((double)z[i] - x[i]) * ((double)z[i] - x[i]);
                x2 += (double)x[i] * x[i];
            }
        }
        T_CHECK(badr == 0 && badq == 0, "%s: %d random rows and %d quantized rows decode differently from ggml",
                td_dtype_name(dt), badr, badq);
        double rt = sqrt(e_td / x2), rg = sqrt(e_gg / x2);
        printf("  %s: 40 rows of %d values decode to ggml's bits; relative rms error of tandem's quantizer %.4f, "
               "ggml's reference quantizer %.4f\n", td_dtype_name(dt), K, rt, rg);
        T_CHECK(rt < 1.5 * rg, "%s: tandem's quantizer error %.4f is far above ggml's %.4f", td_dtype_name(dt), rt, rg);
    }
done:
    if (h) dlclose(h);
    free(x); free(y); free(z); free(a); free(b);
    t_end();
}

/* quant.h's k-quant product order, scalar by scalar (with kref_decode): the
 * activations quantized per 256 by the rule of td_quant_act_row (written out
 * again here), integer super-block sums, one fmaf per lane and super-block; also
 * the product over the dequantized weights in double (*exact) */
static float kq_ref(const float *x, const unsigned char *wrow, int dt, int K, double *exact) {
    int nsb = K / 256, v[256];
    size_t bs = td_dtype_row_bytes(dt, 256);
    int8_t q[256 * 8];
    float d[8], acc[16] = {0}, macc[8] = {0}, ws[16], wm[16];
    int isc[16], im[16];
    for (int s = 0; s < nsb; s++) {
        float amax = 0.0f;
        for (int i = 0; i < 256; i++) amax = fmaxf(amax, fabsf(x[256 * s + i]));
        d[s] = amax / 127.0f;
        float id = d[s] != 0.0f ? 1.0f / d[s] : 0.0f;
        for (int i = 0; i < 256; i++) q[256 * s + i] = (int8_t)rintf(x[256 * s + i] * id);
    }
    double ex = 0;
    for (int s = 0; s < nsb; s++) {
        const unsigned char *blk = wrow + (size_t)s * bs;
        kref_decode(dt, blk, v, ws, wm, isc, im);
        uint16_t h;
        size_t dat = dt == TD_DTYPE_Q6_K ? 208 : dt == TD_DTYPE_Q3_K ? 108 : dt == TD_DTYPE_Q2_K ? 80 : 0;
        memcpy(&h, blk + dat, 2);
        float dw = td_f16_to_f32(h), dmin = 0.0f;
        int mins = dt == TD_DTYPE_Q4_K || dt == TD_DTYPE_Q5_K || dt == TD_DTYPE_Q2_K;
        if (mins) { memcpy(&h, blk + dat + 2, 2); dmin = td_f16_to_f32(h); }
        int32_t P[8] = {0};
        for (int j = 0; j < 8; j++) {
            int S[2] = {0, 0};
            for (int l = 0; l < 8; l++) {
                int32_t p = 0;
                for (int i = 0; i < 4; i++) p += v[32 * j + 4 * l + i] * q[256 * s + 32 * j + 4 * l + i];
                P[l] += isc[2 * j + l / 4] * p;
            }
            for (int i = 0; i < 32; i++) {
                S[i / 16] += q[256 * s + 32 * j + i];
                ex += ((double)ws[2 * j + i / 16] * v[32 * j + i] - wm[2 * j + i / 16]) * x[256 * s + 32 * j + i];
            }
            if (mins) macc[j] = fmaf(dmin * d[s], (float)(im[2 * j] * S[0] + im[2 * j + 1] * S[1]), macc[j]);
        }
        for (int l = 0; l < 8; l++) acc[8 * (s & 1) + l] = fmaf(dw * d[s], (float)P[l], acc[8 * (s & 1) + l]);
    }
    *exact = ex;
    float s8[8], s4[4], s2[2], m4[4], m2[2];
    for (int i = 0; i < 8; i++) s8[i] = acc[i] + acc[i + 8];
    for (int i = 0; i < 4; i++) { s4[i] = s8[i] + s8[i + 4]; m4[i] = macc[i] + macc[i + 4]; }
    for (int i = 0; i < 2; i++) { s2[i] = s4[i] + s4[i + 2]; m2[i] = m4[i] + m4[i + 2]; }
    return dt == TD_DTYPE_Q4_K || dt == TD_DTYPE_Q5_K || dt == TD_DTYPE_Q2_K ? (s2[0] + s2[1]) - (m2[0] + m2[1]) : s2[0] + s2[1];
}

static void test_kq_matmul(void) {
    t_begin("kquant_matmul_order_all_paths");
    static const int Ms[] = {1, 2, 3, 4, 5, 6, 7, 8, 17}; /* every tile of kq512.c (1-8 tokens) and 8 + 8 + 1 */
    static const int Ns[] = {1, 2, 3, 7, 12};
    static const int Ks[] = {256, 512, 1280};
    int paths[TD_KPATH_COUNT], npaths = kernel_paths(paths), deflt = td_kernels_path(), fails = 0, checked = 0;
    double e2[NKDT] = {0}, y2[NKDT] = {0}, r2[NKDT] = {0};
    for (int kd = 0; kd < NKDT; kd++)
        for (size_t ki = 0; ki < sizeof Ks / sizeof Ks[0]; ki++)
            for (size_t ni = 0; ni < sizeof Ns / sizeof Ns[0]; ni++) {
                int K = Ks[ki], N = Ns[ni], Mmax = 17, ldx = K + 3, ldy = N + 2, dt = KDT[kd];
                size_t rb = td_dtype_row_bytes(dt, K);
                float *W = malloc(sizeof(float) * N * K), *x = malloc(sizeof(float) * Mmax * ldx);
                unsigned char *Wq = malloc(rb * N);
                float *ref = malloc(sizeof(float) * Mmax * ldy), *got = malloc(sizeof(float) * Mmax * ldy);
                double *ex = malloc(sizeof(double) * Mmax * N);
                for (int i = 0; i < N * K; i++) W[i] = frand() + (i % 3 == 0 ? 0.5f : 0.0f); /* off-centre: minimums */
                for (int i = 0; i < Mmax * ldx; i++) x[i] = frand() * (i % 5 == 0 ? 4.0f : 1.0f);
                memset(x + 32, 0, sizeof(float) * 32); /* a zero block */
                for (int n = 0; n < N; n++) {
                    if (n % 3 == 2) krand_blocks(dt, Wq + n * rb, K / 256); /* any bytes a file may hold */
                    else td_quantize_row(dt, W + (size_t)n * K, Wq + n * rb, K);
                }
                for (int m = 0; m < Mmax; m++)
                    for (int n = 0; n < N; n++)
                        ref[m * ldy + n] = kq_ref(x + (size_t)m * ldx, Wq + n * rb, dt, K, &ex[m * N + n]);
                for (size_t mi = 0; mi < sizeof Ms / sizeof Ms[0]; mi++)
                    checked += paths_vs_ref(x, ldx, Ms[mi], (const char *)Wq, dt, K, N, ref, got, ldy, Mmax, paths, npaths, &fails);
                /* against the dequantized weights (activation rounding only) and the unquantized matrix */
                for (int m = 0; m < Mmax; m++)
                    for (int n = 0; n < N; n++) {
                        if (n % 3 == 2) continue; /* random blocks: no unquantized matrix */
                        double e = ref[m * ldy + n] - ex[m * N + n];
                        r2[kd] += e * e;
                        double exact = 0;
                        for (int k = 0; k < K; k++) exact += (double)x[m * ldx + k] * W[(size_t)n * K + k];
                        e2[kd] += (ref[m * ldy + n] - exact) * (ref[m * ldy + n] - exact);
                        y2[kd] += exact * exact;
                    }
                free(W); free(x); free(Wq); free(ref); free(got); free(ex);
            }
    td_kernels_set_path(deflt);
    double r[NKDT], rd[NKDT];
    for (int i = 0; i < NKDT; i++) { r[i] = sqrt(e2[i] / y2[i]); rd[i] = sqrt(r2[i] / y2[i]); }
    printf("  %d products x %d paths equal the scalar k-quant order (memcmp); rms error / rms output: vs the "
           "dequantized weights q4_k %.1e q5_k %.1e q6_k %.1e iq4_xs %.1e q3_k %.1e q2_k %.1e, vs the unquantized matrix "
           "q4_k %.2e q5_k %.2e q6_k %.2e iq4_xs %.2e q3_k %.2e q2_k %.2e\n", checked / npaths, npaths, rd[0], rd[1], rd[2],
           rd[3], rd[4], rd[5], r[0], r[1], r[2], r[3], r[4], r[5]);
    T_CHECK(rd[0] < 0.02 && rd[1] < 0.02 && rd[2] < 0.02 && rd[3] < 0.02 && rd[4] < 0.02 && rd[5] < 0.03,
            "activation rounding error implausibly large");
    T_CHECK(r[0] < 0.15 && r[1] < r[0] && r[2] < r[1] && r[3] < 0.15 && r[4] > r[0] && r[4] < 0.3 && r[5] > r[4] && r[5] < 0.6,
            "quantization errors implausible (q2_k > q3_k > q4_k > q5_k > q6_k expected)");
    t_end();
}

/* ---- models ----------------------------------------------------------------- */

static td_model *open_q(const char *name, const tm_shape *s, int dt) {
    char d[512];
    snprintf(d, sizeof d, "%s/%s", g_dir, name);
    if (tm_write(d, s) != 0) return NULL;
    td_model *m = NULL;
    td_err err = {0};
    if (td_model_open(&m, d, &err) != 0) { printf("  open %s: %s\n", d, err.msg); return NULL; }
    if (dt >= 0 && td_model_quantize_weights(m, dt, &err) != 0) { printf("  quantize: %s\n", err.msg); td_model_free(m); return NULL; }
    return m;
}

static const tm_shape QSHAPE = {.vocab = 301, .hidden = 64, .layers = 2, .heads = 4, .kv_heads = 2, .head_dim = 32,
                                .ffn = 160, .ctx = 128, .tied = 1, .bf16 = 1, .seed = 5};
/* for the k-quants: every matrix input width a multiple of 256 (ffn 768 = 3 super-blocks) */
static const tm_shape KSHAPE = {.vocab = 301, .hidden = 256, .layers = 2, .heads = 4, .kv_heads = 2, .head_dim = 64,
                                .ffn = 768, .ctx = 128, .tied = 1, .bf16 = 1, .seed = 5};

/* logits at T=1 steps == inside one T=7 block == inside a ragged B=5 batch on 2 threads */
static void test_invariance(int dt, int tied) {
    char name[96];
    snprintf(name, sizeof name, "invariance_%s_%s_%s%s", td_dtype_name(dt), tied ? "tied" : "untied", td_kernels_path_name(),
             tc_act == TD_ACT_AMX ? "_act_amx" : tc_act == TD_DTYPE_BF16 ? "_act_bf16" : "");
    t_begin(name);
    tm_shape s = td_dtype_is_kquant(dt) ? KSHAPE : QSHAPE;
    s.tied = tied;
    s.seed = 5 + (uint64_t)dt * 2 + (uint64_t)tied;
    td_model *m = open_q(name, &s, dt);
    float *a = NULL;
    T_REQUIRE(m != NULL, "model");
    td_model_info in;
    td_model_get_info(m, &in);
    T_CHECK(in.dtype == dt, "main dtype %d", in.dtype);
    if (td_dtype_is_kquant(dt)) /* the output matrix: q6_k for q4_k / q5_k */
        T_CHECK(m->w.lm_head.dtype == TD_DTYPE_Q6_K && m->w.layers[0].wq.dtype == dt, "lm_head %s",
                td_dtype_name(m->w.lm_head.dtype));
    int V = s.vocab;
    int32_t seq[12];
    uint64_t st = s.seed + 7;
    for (int i = 0; i < 12; i++) seq[i] = (int32_t)(tm_rng(&st) % (uint64_t)V);
    a = malloc(sizeof(float) * 7 * V);
    T_REQUIRE(a != NULL, "memory");
    /* T=1 steps (one thread) == one T=7 block == inside a ragged B=5 batch (two threads) */
    const char *bad = tc_invariance(m, V, seq, a, TD_DTYPE_F32);
    T_CHECK(bad == NULL, "%s", bad ? bad : "");
    if (tc_act != TD_DTYPE_F32) /* the contexts multiplied the R16 repacks of the formats they hold */
        T_CHECK(!m->w.layers[0].wq.rp == !td_q8r_dtype_ok(dt) && !m->w.layers[0].attn_norm.rp &&
                    !m->w.lm_head.rp == !td_q8r_dtype_ok(m->w.lm_head.dtype),
                "%s matrices repacked exactly when R16 holds them", td_dtype_name(dt));
    int finite = 1;
    for (int i = 0; i < 7 * V; i++) finite &= isfinite(a[i]);
    T_CHECK(finite, "non-finite logits");
done:
    td_model_free(m);
    free(a);
    t_end();
}

static void test_reject_k(void) {
    t_begin("quantize_rejects_width_not_multiple_of_32");
    tm_shape s = QSHAPE;
    s.hidden = 40; /* not a multiple of 32 */
    td_model *m = open_q("badk", &s, -1);
    T_REQUIRE(m != NULL, "model");
    td_err err = {0};
    T_CHECK(td_model_quantize_weights(m, TD_DTYPE_Q8_0, &err) == TD_EUNSUPPORTED && strstr(err.msg, "hidden_size = 40"), "%s",
            err.msg);
    td_model_info in;
    td_model_get_info(m, &in);
    T_CHECK(in.dtype == TD_DTYPE_BF16, "model unchanged");
    T_CHECK(td_model_quantize_weights(m, TD_DTYPE_BF16, &err) == TD_EINVAL, "bf16 is not a quantized type");
done:
    td_model_free(m);
    t_end();
}

/* plain decoding == speculative decoding (ngram drafter) on a quantized target */
static void test_spec(int dt) {
    char name[64];
    snprintf(name, sizeof name, "spec_equals_plain_%s%s", td_dtype_name(dt),
             tc_act == TD_ACT_AMX ? "_act_amx" : tc_act == TD_DTYPE_BF16 ? "_act_bf16" : "");
    t_begin(name);
    tm_shape s = td_dtype_is_kquant(dt) ? KSHAPE : QSHAPE;
    s.seed = 11;
    td_model *m = open_q(name, &s, dt);
    td_drafter *d = NULL;
    td_ctx *c = NULL, *cp = NULL;
    td_spec *g = NULL;
    td_err err = {0};
    T_REQUIRE(m != NULL, "model");
    enum { NT = 48, B = 3 };
    int32_t pr[B][32], ref[B][NT], got[B][NT];
    int np[B], nref[B], ngot[B] = {0}, ids[B], fin[B] = {0};
    td_gen_params gp = {.sampling = td_sampling_default(), .max_tokens = NT};
    for (int i = 0; i < B; i++) {
        uint64_t st = 500 + (uint64_t)i;
        np[i] = 12 + 5 * i;
        for (int k = 0; k < np[i]; k++) pr[i][k] = (int32_t)(k % 4 == 3 ? tm_rng(&st) % 301 : (uint64_t)(7 + k % 3));
        td_ctx_params pp = td_ctx_default_params();
        pp.max_ctx = 128; pp.n_threads = 2; pp.act_type = tc_act;
        T_REQUIRE(td_ctx_open(&cp, m, &pp, &err) == 0, "ctx: %s", err.msg);
        td_gen_stats gs;
        T_REQUIRE(cp && td_generate(cp, m, pr[i], np[i], &gp, NULL, NULL, ref[i], NT, &gs, &err) == 0, "plain: %s", err.msg);
        nref[i] = gs.n_gen;
        td_ctx_free(cp);
        cp = NULL;
    }
    T_REQUIRE(td_drafter_open(&d, "ngram", m, &err) == 0, "drafter: %s", err.msg);
    td_ctx_params p = td_ctx_default_params();
    p.max_rows = B + 1; p.max_ctx = 128; p.max_tokens = 64; p.max_logits = 64; p.n_threads = 2; p.act_type = tc_act;
    T_REQUIRE(td_ctx_open(&c, m, &p, &err) == 0, "ctx: %s", err.msg);
    td_spec_params sp = td_spec_default_params();
    sp.max_depth = 6;
    sp.fixed_depth = 1;
    T_REQUIRE(td_spec_open(&g, c, m, d, &sp, &err) == 0, "spec: %s", err.msg);
    for (int i = 0; i < B; i++) T_REQUIRE(td_spec_add(g, pr[i], np[i], &gp, 1, &ids[i], &err) == 0, "add: %s", err.msg);
    for (int round = 0; round < 400; round++) {
        T_REQUIRE(td_spec_step(g, &err) >= 0, "step: %s", err.msg);
        int all = 1;
        for (int i = 0; i < B; i++) {
            if (fin[i]) continue;
            int done = 0;
            int n = td_spec_take(g, ids[i], got[i] + ngot[i], NULL, NT - ngot[i], NULL, 0, NULL, &done);
            T_REQUIRE(n >= 0, "take");
            ngot[i] += n;
            if (done) fin[i] = 1;
            all &= fin[i];
        }
        if (all) break;
    }
    for (int i = 0; i < B; i++)
        T_CHECK(fin[i] && ngot[i] == nref[i] && !memcmp(got[i], ref[i], sizeof(int32_t) * (size_t)nref[i]),
                "row %d: speculative output differs from plain", i);
    td_spec_stats sst;
    td_spec_stats_get(g, -1, &sst);
    printf("  %s: drafted %ld accepted %ld\n", name, sst.drafted, sst.accepted);
    T_CHECK(sst.drafted > 0, "the drafter drafted nothing: the test would not test verification");
done:
    td_spec_free(g); td_ctx_free(c); td_ctx_free(cp); td_drafter_free(d); td_model_free(m);
    t_end();
}

/* the trained tiny target: argmax of the quantized model's logits agrees with the
 * unquantized model's along a greedy continuation of a code prompt */
static void test_tiny_target(void) {
    t_begin("tiny_target_top1_agreement");
    const char *dir = "models/tiny-code/target";
    td_model *mf = NULL, *mq[2] = {NULL, NULL};
    td_ctx *c = NULL;
    float *lf = NULL, *lq = NULL;
    td_err err = {0};
    if (access(dir, R_OK) != 0) { printf("  %s missing: skipped\n", dir); goto done; }
    T_REQUIRE(td_model_open(&mf, dir, &err) == 0, "open: %s", err.msg);
    for (int q = 0; q < 2; q++) {
        T_REQUIRE(td_model_open(&mq[q], dir, &err) == 0, "open: %s", err.msg);
        T_REQUIRE(td_model_quantize_weights(mq[q], q ? TD_DTYPE_Q4_0 : TD_DTYPE_Q8_0, &err) == 0, "quantize: %s", err.msg);
    }
    const td_tokenizer *tok = td_model_tokenizer(mf);
    T_REQUIRE(tok != NULL, "tokenizer");
    static const char *prompts[] = {"def fibonacci(n):\n", "import os\nimport sys\n\ndef main():\n",
                                    "class Stack:\n    def __init__(self):\n", "for i in range(10):\n"};
    enum { NP = 4, GEN = 48 };
    td_model_info mi;
    td_model_get_info(mf, &mi);
    int V = mi.n_vocab;
    int agree[2] = {0, 0}, total = 0;
    lf = malloc(sizeof(float) * 64 * (size_t)V);
    lq = malloc(sizeof(float) * 64 * (size_t)V);
    for (int p = 0; p < NP; p++) {
        int32_t seq[64 + GEN];
        int n = td_tokenize(tok, prompts[p], strlen(prompts[p]), 0, seq, 64);
        T_REQUIRE(n > 0 && n <= 16, "tokenize");
        /* greedy continuation of the unquantized model */
        td_gen_params gp = {.sampling = td_sampling_default(), .max_tokens = GEN};
        td_gen_stats gs;
        td_ctx_params cp = td_ctx_default_params();
        cp.max_ctx = 128; cp.max_tokens = 64; cp.max_logits = 64; cp.n_threads = 2;
        T_REQUIRE(td_ctx_open(&c, mf, &cp, &err) == 0, "ctx: %s", err.msg);
        T_REQUIRE(td_generate(c, mf, seq, n, &gp, NULL, NULL, seq + n, GEN, &gs, &err) == 0, "gen: %s", err.msg);
        td_ctx_free(c);
        c = NULL;
        int len = n + gs.n_gen < 64 ? n + gs.n_gen : 64;
        /* teacher-forced logits of every position, unquantized and quantized */
        for (int q = -1; q < 2; q++) {
            T_REQUIRE(td_ctx_open(&c, q < 0 ? mf : mq[q], &cp, &err) == 0, "ctx: %s", err.msg);
            int r;
            td_ctx_row_add(c, &r);
            T_REQUIRE(tc_feed(c, r, seq, len, q < 0 ? lf : lq) == 0, "forward");
            td_ctx_free(c);
            c = NULL;
            if (q < 0) continue;
            for (int t = n - 1; t < len; t++) {
                int af = 0, aq = 0;
                for (int v = 1; v < V; v++) {
                    if (lf[(size_t)t * V + v] > lf[(size_t)t * V + af]) af = v;
                    if (lq[(size_t)t * V + v] > lq[(size_t)t * V + aq]) aq = v;
                }
                agree[q] += af == aq;
                if (q == 0) total++;
            }
        }
    }
    printf("  top-1 agreement over %d positions: q8_0 %.1f%%, q4_0 %.1f%%\n", total, 100.0 * agree[0] / total,
           100.0 * agree[1] / total);
    T_CHECK(agree[0] >= 0.95 * total, "q8_0 agreement %d of %d", agree[0], total);
    T_CHECK(agree[1] >= 0.70 * total, "q4_0 agreement %d of %d", agree[1], total);
done:
    td_ctx_free(c);
    td_model_free(mf); td_model_free(mq[0]); td_model_free(mq[1]);
    free(lf); free(lq);
    t_end();
}

int main(void) {
    snprintf(g_dir, sizeof g_dir, "/tmp/td_test_quant_%d", (int)getpid());
    mkdir(g_dir, 0755);
    test_f16();
    test_layout();
    test_quant_error();
    test_ggml_oracle();
    test_matmul();
    test_nonfinite();
    test_act_paths();
    test_ggml_dot();
    test_bad_sizes();
    test_kq_layout();
    test_kq_ggml();
    test_kq_matmul();
    int deflt = td_kernels_path();
    for (int path = 0; path < TD_KPATH_COUNT; path++) {
        if (path != TD_KPATH_PORTABLE && !td_kernels_supported(path)) continue;
        td_kernels_set_path(path);
        test_q8r();
        tc_act = TD_DTYPE_BF16; /* Q8_0, Q4_0, Q5_0 in the R16 order */
        test_invariance(TD_DTYPE_Q8_0, 1);
        test_invariance(TD_DTYPE_Q4_0, 0);
        test_invariance(TD_DTYPE_Q5_0, 1);
        tc_act = TD_DTYPE_F32;
        test_invariance(TD_DTYPE_Q8_0, 1);
        test_invariance(TD_DTYPE_Q4_0, 0);
        test_invariance(TD_DTYPE_Q4_K, 0);
        test_invariance(TD_DTYPE_Q5_K, 1);
        test_invariance(TD_DTYPE_Q6_K, 0);
        test_invariance(TD_DTYPE_Q5_0, 1);
        test_invariance(TD_DTYPE_IQ4_NL, 0);
        test_invariance(TD_DTYPE_IQ4_XS, 1);
        test_invariance(TD_DTYPE_Q3_K, 0);
        test_invariance(TD_DTYPE_Q2_K, 1);
        test_invariance(TD_DTYPE_Q4_1, 0);
        test_invariance(TD_DTYPE_Q5_1, 1);
    }
    td_kernels_set_path(deflt);
    test_q8r_4bit();
    test_q8r_kq(TD_DTYPE_Q4_K);
    test_q8r_kq(TD_DTYPE_Q6_K);
    test_q8r_kq(TD_DTYPE_Q5_K);
    test_q8r_kq(TD_DTYPE_IQ4_XS);
    test_invariance(TD_DTYPE_Q4_0, 1);
    test_reject_k();
    test_spec(TD_DTYPE_Q8_0);
    test_spec(TD_DTYPE_Q4_0);
    test_spec(TD_DTYPE_Q4_K);
    test_spec(TD_DTYPE_Q6_K);
    test_spec(TD_DTYPE_Q5_0);
    test_spec(TD_DTYPE_IQ4_XS);
    test_spec(TD_DTYPE_Q3_K);
    test_spec(TD_DTYPE_Q2_K);
    test_spec(TD_DTYPE_Q4_1);
    /* act_type bf16, and amx where the tiles are: Q8_0, Q4_0, IQ4_NL, Q5_0, Q4_K, Q5_K, Q6_K, IQ4_XS in the R16
     * order (Q4_1: Q16) */
    tc_act = TD_DTYPE_BF16;
    test_invariance(TD_DTYPE_Q8_0, 0);
    test_invariance(TD_DTYPE_Q5_0, 1);
    test_invariance(TD_DTYPE_IQ4_NL, 0);
    test_invariance(TD_DTYPE_Q4_1, 0);
    test_invariance(TD_DTYPE_Q4_K, 1);
    test_invariance(TD_DTYPE_Q6_K, 0);
    test_invariance(TD_DTYPE_Q5_K, 0);
    test_invariance(TD_DTYPE_IQ4_XS, 1);
    test_spec(TD_DTYPE_Q8_0);
    test_spec(TD_DTYPE_Q4_0);
    test_spec(TD_DTYPE_Q4_K);
    test_spec(TD_DTYPE_IQ4_XS);
    if (td_amx_available()) {
        tc_act = TD_ACT_AMX;
        test_invariance(TD_DTYPE_Q8_0, 1);
        test_invariance(TD_DTYPE_Q8_0, 0);
        test_invariance(TD_DTYPE_Q4_0, 1);
        test_invariance(TD_DTYPE_IQ4_NL, 0);
        test_invariance(TD_DTYPE_Q5_0, 0);
        test_invariance(TD_DTYPE_Q4_K, 0);
        test_invariance(TD_DTYPE_Q6_K, 1);
        test_invariance(TD_DTYPE_Q5_K, 1);
        test_invariance(TD_DTYPE_IQ4_XS, 0);
        test_spec(TD_DTYPE_Q8_0);
        test_spec(TD_DTYPE_Q4_0);
        test_spec(TD_DTYPE_Q5_0);
        test_spec(TD_DTYPE_Q4_K);
        test_spec(TD_DTYPE_Q6_K);
        test_spec(TD_DTYPE_Q5_K);
        test_spec(TD_DTYPE_IQ4_XS);
    }
    tc_act = TD_DTYPE_F32;
    test_tiny_target();
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", g_dir);
    if (system(cmd) != 0) printf("  could not remove %s\n", g_dir);
    return t_exit();
}
