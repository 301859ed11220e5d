/* kernels — the numeric building blocks of the forward pass (CPU, f32 compute).
 *
 * Batch invariance is the rule every kernel here keeps: an output element is a
 * reduction over one axis accumulated in ONE fixed order that depends only on
 * the length of that axis — never on how many rows (tokens) are processed in the
 * same call, on how the work is tiled, or on the thread count.
 *
 * The dot-product order ("D16"), used by every matrix product, attention score
 * and norm: one accumulator of 16 lanes; for k = 0, 16, 32, ... lane l does
 * acc[l] = fma(a[k+l], b[k+l], acc[l]) (a final partial step zero-pads both
 * operands); then the fixed fold s8[i] = acc[i] + acc[i+8], s4[i] = s8[i] +
 * s8[i+4], s2[i] = s4[i] + s4[i+2], s = s2[0] + s2[1]. bf16/f16 weights are
 * converted exactly to f32 before the fma (no bf16 rounding of activations).
 *
 * The bf16-activation order ("B32", td_matmul_bf16a, used for bf16 weights when
 * a context's act_type is bf16): each activation row is rounded once to bf16
 * (td_from_f32: nearest even); one accumulator of 16 lanes; for k = 0, 32, 64,
 * ... lane l performs one step of AVX-512 BF16's vdpbf16ps on the pair
 * (k+2l, k+2l+1) — as measured on AMD Zen 5 and matching Intel's definition:
 * bf16 inputs with a zero exponent read as zero (DAZ), then acc = fz(fma(x1,
 * w1, acc)), acc = fz(fma(x0, w0, acc)) (odd element first, each fma rounded
 * to nearest even, a tiny result flushed to a zero of its sign — tiny as x86's
 * FTZ judges it: below FLT_MIN after rounding to 24 bits with an unbounded
 * exponent, so an exact value <= FLT_MIN - 2^-151 that fmaf rounds to FLT_MIN
 * flushes too); a final
 * partial step zero-pads both operands; then the D16 fold. Because bf16 x bf16
 * products are exact, this differs from the D16 dot only by the activation
 * rounding (relative 2^-9 per element) and the summation order. The AVX-512
 * path runs vdpbf16ps when the CPU has AVX512_BF16; every other case (portable,
 * AVX2, an AVX-512 CPU without BF16) runs a C emulation of the same lanes
 * (td_bf16_dp_lane) — the same bits, much slower.
 *
 * Four implementations produce the same bits: an AVX-512 path (compiled when
 * the target has AVX-512F/BW/VL), an AVX2+FMA path (kernels_avx2.c, in every
 * x86-64 build), a NEON path (kernels_neon.c, in every AArch64 build: the
 * matrix products and dots, the rest portable) and a portable C path that
 * emulates the 16 lanes with fmaf. The default is the best one the CPU
 * supports; TD_KERNELS=portable|avx2|avx512|neon in the environment or
 * td_kernels_set_path() forces one (tests check they agree bit for bit). */
#ifndef TD_KERNELS_H
#define TD_KERNELS_H

#include <stddef.h>
#include <stdint.h>

enum { TD_KPATH_PORTABLE = 0, TD_KPATH_AVX512 = 1, TD_KPATH_AVX2 = 2, TD_KPATH_NEON = 3, TD_KPATH_COUNT = 4 };
/* 1 when the path is compiled in and the CPU has its instructions. */
int td_kernels_supported(int path);
/* Select the implementation (falls back to portable when not supported; so
 * does an unknown TD_KERNELS value). Returns the path in force. Not to be
 * called while kernels run. */
int td_kernels_set_path(int path);
int td_kernels_path(void);
const char *td_kernels_path_name(void);

/* sum_k a[k]*b[k] in the D16 order. */
float td_dot(const float *a, const float *b, int n);
/* Same bits as td_dot(a, f32(w), n) for a bf16 / f16 vector w. */
float td_dot_bf16(const float *a, const uint16_t *w, int n);
float td_dot_f16(const float *a, const uint16_t *w, int n);

/* Convert n weights of dtype (TD_DTYPE_*) to f32 (exact). */
void td_to_f32(float *dst, const void *src, int dtype, size_t n);

/* Store n f32 values as dtype (the KV cache's write): TD_DTYPE_F32 copies;
 * TD_DTYPE_BF16 rounds to nearest even (a NaN stays a NaN, quieted, sign kept);
 * TD_DTYPE_F16 rounds to nearest even as F16C's vcvtps2ph does (overflow to
 * inf, f16 subnormals kept, a NaN quieted with its payload's top bits);
 * TD_DTYPE_Q8_0 (n a multiple of 32) writes GGUF Q8_0 blocks by
 * td_quantize_row (d = max|x| / 127 as f16, q = round(x / d)). The same bits
 * on every path (the AVX paths use F16C; test_kernels compares). */
void td_from_f32(void *dst, const float *src, int dtype, size_t n);

/* y[m*ldy + n] = sum_k x[m*ldx + k] * W[n*K + k]   (add = 0)
 * y[m*ldy + n] += (that sum)                       (add = 1: residual fused)
 * for n in [n0, n1), m in [0, M). W: [N][K] of dtype, row-major. Register-tiled
 * over tokens and outputs; every element is a D16 dot, so the bits of row m do
 * not depend on M, on [n0, n1) or on the tiling. */
void td_matmul(float *y, int ldy, const float *x, int ldx, int M, const void *W, int dtype,
               int K, int n0, int n1, int add);

/* bf16 activations x bf16 weights (act_type bf16): y[m*ldy + n] (+)= the B32
 * dot of x[m*ldx .. +K) with W[n*K .. +K), both bf16, for n in [n0, n1), m in
 * [0, M). Register-tiled like td_matmul; every element is a B32 dot, so the
 * bits of row m do not depend on M, [n0, n1), the tiling or the path. */
void td_matmul_bf16a(float *y, int ldy, const uint16_t *x, int ldx, int M, const uint16_t *W, int K, int n0, int n1,
                     int add);
/* The same, stream: 1 when W streams from memory (td_mm_in.stream): where
 * td_kernels_hw_stream says so, a product of 1 or 2 tokens then leaves the
 * prefetching to the hardware, and one of 5 to 8 tokens adds a prefetch toward
 * L2 further ahead (kernels.c, matmul_bv). A prefetch choice only: the same bits. */
void td_matmul_bf16a_stream(float *y, int ldy, const uint16_t *x, int ldx, int M, const uint16_t *W, int K, int n0,
                            int n1, int add, int stream);
/* The same with hw, the prefetch choice td_kernels_hw_stream makes, given for
 * this product: 0 or 1, or -1 for td_kernels_hw_stream's (forward contexts
 * choose by measured time, nn/hwsel.h). Again the same bits. */
void td_matmul_bf16a_pf(float *y, int ldy, const uint16_t *x, int ldx, int M, const uint16_t *W, int K, int n0, int n1,
                        int add, int stream, int hw);
/* 1 where a decode's one-token products over weights streamed from memory run
 * faster without the kernels' software prefetch, the hardware prefetchers
 * alone following their streams: AMD's cores (Zen 5: the 0.6B shape's Q8_0
 * decode 16.1-16.5 -> 13.4-14.3 ms a token, bf16 under act bf16 5-7% faster),
 * not Intel's (Sapphire Rapids: the R16 product 12-17% slower without it;
 * bench/forward-notes.md, "Stop 45", "Stop 50"). Read by td_matmul_bf16a_stream
 * and the R16 VNNI tiles (nn/q8r.h) where the caller gives no choice of its own;
 * forward contexts choose per forward size by measured time, starting from it
 * (nn/hwsel.h: on the same VMs it went stale). TD_HW_STREAM=0|1 overrides it;
 * td_kernels_set_hw_stream(1 / 0, or -1 for the default) for tests and A/B
 * runs. Never changes a bit. */
int td_kernels_hw_stream(void);
void td_kernels_set_hw_stream(int v);
/* 1 while that choice is fixed (TD_HW_STREAM set, or td_kernels_set_hw_stream
 * given 0 or 1): forward contexts then take it as it is instead of choosing
 * per forward size by measured time (nn/hwsel.h). */
int td_kernels_hw_stream_fixed(void);
/* 1 where td_matmul_bf16a's products of 5 or more tokens run each B32 step as
 * two f32 fmas under MXCSR FTZ|DAZ instead of vdpbf16ps (kernels.c, tilem):
 * Intel's cores, whose vdpbf16ps gives half the flops of their f32 fmas (Xeon
 * model 207: 86 against 176 GFLOP/s a core), not AMD's (Zen 5: the 0.6B
 * shape's prefill 2.5x llama.cpp's on vdpbf16ps). CPUs with AVX-512 but no
 * conforming vdpbf16ps run those tiles for every M. TD_BF16_FMA=0|1 overrides
 * it; td_kernels_set_bf16_fma(1 / 0, or -1 for the default) for tests and A/B
 * runs. Never changes a bit. */
int td_kernels_bf16_fma(void);
void td_kernels_set_bf16_fma(int v);
/* One lane of the B32 step, the portable definition of vdpbf16ps (see above):
 * fz(fma(x0, w0, fz(fma(x1, w1, daz(acc))))) over DAZ-read bf16 inputs. */
float td_bf16_dp_lane(float acc, uint16_t x0, uint16_t x1, uint16_t w0, uint16_t w1);
/* One step of it: fz(fma(a, b, c)) for bf16 values a, b and an f32 c with a
 * nonzero exponent or zero (the emulations' fix-up where fma gives +-FLT_MIN). */
float td_bf16_fz24(float a, float b, float c);
/* The P24 layout of a bf16 matrix [N][K] for the bf16-activation products
 * (act_type bf16): a 64-byte header (N, K), then the whole panels of
 * TD_P24_ROWS rows; inside a panel, k-blocks of TD_P24_KB elements (the last
 * may be shorter); inside a k-block, groups of 3 rows; per 32-element step
 * the group's 3 rows' 64 bytes side by side. A thread's share of a product
 * is then one stream, where the plain tiles read 3 weight rows, 8 activation
 * rows and 8 output rows side by side, more streams than the hardware
 * prefetchers keep (bench/forward-notes.md, "Stop 57"). Rows past the last
 * whole panel are not in it: the plain matrix serves them.
 * td_bf16p_packable: K a multiple of 32, N >= TD_P24_ROWS (sizes bounded).
 * td_bf16p_bytes: the packed size (0 when not packable). td_bf16p_pack: dst
 * (64-byte aligned, td_bf16p_bytes) from W. td_bf16p_check: pk holds [N][K].
 * td_matmul_bf16p: td_matmul_bf16a_pf's product, the same bits, taking the
 * whole panels of [n0, n1) from pk where td_kernels_p24() and pk checks out
 * (else, and for the other rows, W's plain tiles). */
#define TD_P24_ROWS 24 /* a multiple of 3 (groups) and 8 (the products' output blocks) */
#define TD_P24_KB 512
int td_bf16p_packable(int64_t N, int64_t K);
size_t td_bf16p_bytes(int64_t N, int64_t K);
void td_bf16p_pack(void *dst, const uint16_t *W, int64_t N, int64_t K);
int td_bf16p_check(const void *pk, int64_t N, int64_t K);
/* 1 where td_matmul_bf16p takes the packed panels: the AVX-512 path with
 * native vdpbf16ps, not on tilem's CPUs (td_kernels_bf16_fma), and not turned
 * off (TD_P24=0 in the environment: no context then makes the copies;
 * td_kernels_set_p24(0 / 1, or -1 for the default) for tests and A/B runs:
 * copies already made are then left unread). */
int td_kernels_p24(void);
void td_kernels_set_p24(int v);
void td_matmul_bf16p(float *y, int ldy, const uint16_t *x, int ldx, int M, const void *pk, const uint16_t *W, int K,
                     int N, int n0, int n1, int add, int stream, int hw);
/* 1 when td_matmul_bf16a runs on vdpbf16ps (AVX-512 path in force, the CPU has
 * AVX512_BF16, and the instruction computes the lanes of td_bf16_probe_lanes as
 * td_bf16_dp_lane does; products of 5+ tokens may still take the fma tiles,
 * td_kernels_bf16_fma), 0 when it runs an emulation. */
int td_kernels_bf16_native(void);
/* The operands of one vdpbf16ps whose first TD_BF16_PROBES lanes are those on
 * which a CPU's instruction has been seen to differ from td_bf16_dp_lane
 * (kernels.c says which and how); the other lanes are zero. */
#define TD_BF16_PROBES 3
void td_bf16_probe_lanes(float acc[16], uint16_t x[32], uint16_t w[32]);

/* A narrow matrix-vector product added in place, over a panel layout:
 * y[n] = fma(x[K-1], Wp(n, K-1), ... fma(x[0], Wp(n, 0), y[n])) for n < N, where
 * Wp(n, k) = wp[((n / 16) * K + k) * 16 + n % 16] (panels of 16 rows, each
 * stored column by column; the last panel zero-padded). One fma per term in k
 * order, so every path gives the same bits. For small K (a low-rank bias over a
 * vocabulary) where a dot per row would spend more on its reduction than on the
 * multiplies. td_panel16_pack lays W [N][K] (dtype f32/bf16/f16) out so. */
void td_panel16_addmv(float *y, const float *wp, const float *x, int K, int N);
size_t td_panel16_elems(int K, int N);
void td_panel16_pack(float *wp, const void *W, int dtype, int K, int N);

/* The index of the first largest of x[0..n) (n >= 1), NaNs never chosen past
 * index 0: what `b = 0; for (j) if (x[j] > x[b]) b = j;` returns. */
int td_argmax(const float *x, int n);

/* The older interface: td_matmul(y, ldy, x, K, M, W, dtype, K, n0, n1, 0);
 * wbuf is unused (may be NULL). */
void td_matmul_rows(float *y, int ldy, const float *x, int M, const void *W, int dtype,
                    int K, int n0, int n1, float *wbuf);

/* out = x * rsqrt(mean(x^2) + eps) * w  (w of dtype, length n); out may equal x.
 * The sum of squares is a D16 dot of x with itself; then out[i] = w[i] * (x[i] * r). */
void td_rmsnorm(float *out, const float *x, const void *w, int dtype, int n, float eps);

/* Rotary embedding of one head vector v[hd] in place, rotate-half layout
 * (pairs i, i + hd/2) with the position's cos/sin tables cs, sn [hd/2]:
 * v_i' = v_i c_i - v_{i+h} s_i,  v_{i+h}' = v_{i+h} c_i + v_i s_i (no fma). */
void td_rope(float *v, const float *cs, const float *sn, int hd);

/* exp(x) elementwise (n values; out may equal x): a Cephes-style polynomial,
 * within 2 ulp of expf for x in [-87, 88]; the same bits on every path. */
void td_exp(float *out, const float *x, int n);

/* out[i] = (g[i] / (1 + exp(-g[i]))) * u[i]   (exp as td_exp); out may equal g. */
void td_swiglu(float *out, const float *g, const float *u, int n);

/* This thread's scratch of at least n bytes, 64-byte aligned, or NULL when out
 * of memory. One buffer per thread that only grows (so after a session's first
 * forwards no call allocates) and is freed when the thread exits. Valid until
 * this thread's next call: a kernel takes it, fills it and is done with it
 * within one call (the q8_0/q4_0 activation packs, the AVX2 bf16 path's
 * permuted activations), and no kernel calls another while holding it. */
void *td_thread_scratch(size_t n);

/* A prefetch stream spread over a loop's steps: bytes [0, n) from p, per bytes
 * (whole 64-byte lines) a step (td_pf_step at the top of each). Prefetches only:
 * no bit of any result depends on them. */
typedef struct { const char *p; size_t n, per, at; } td_pf_stream;
static inline td_pf_stream td_pf_begin(const char *p, size_t n, int steps) {
    size_t st = (size_t)(steps > 1 ? steps : 1);
    td_pf_stream s = {p, n, (n / 64 + st - 1) / st * 64, 0};
    return s;
}
static inline void td_pf_step(td_pf_stream *s) {
    for (size_t k = 0; k < s->per && s->at < s->n; k += 64, s->at += 64) __builtin_prefetch(s->p + s->at, 0, 3);
}
/* The attention passes over many queries go over a head's keys in blocks of
 * about 16 KiB (kc rows), every query block taking its turn on a key block
 * while it sits in L1. What query block bi (of nb) prefetches during its turn
 * on key block [j0, j0 + kc) of X (rows rs bytes apart, the last of them rowb
 * bytes long, nmax rows): a 1/nb slice of the next key block, so the rows
 * stream in while every query block computes, not only during the first one's
 * pass; block 0's first query block fetches block 0 itself too, from
 * TD_ATT_PF_DIST bytes on. Returns the start and sets *pfn (0: nothing). One
 * thread over 224 cold heads of 512 keys, hd 128, bf16 rows (a 0.6B shape's
 * cache), A32 order: 16 queries a head 10.0 -> 7.7 ms, 2 queries 4.9 -> 3.8 ms
 * (bench/attend_bw.c; bench/forward-notes.md, "Stop 37"). */
#define TD_ATT_PF_DIST 2048
static inline const char *td_att_pf_slice(const char *X, size_t rs, size_t rowb, int j0, int kc, int nmax, int bi,
                                          int nb, size_t *pfn) {
    int n0 = j0 + kc < nmax ? j0 + kc : nmax, n1 = j0 + 2 * kc < nmax ? j0 + 2 * kc : nmax;
    size_t b0 = (size_t)(n0 + (n1 - n0) * bi / nb) * rs, b1 = (size_t)(n0 + (n1 - n0) * (bi + 1) / nb) * rs;
    size_t end = nmax > 0 ? (size_t)(nmax - 1) * rs + rowb : 0; /* the last row's end */
    if (j0 == 0 && bi == 0) b0 = TD_ATT_PF_DIST;
    if (b1 > end) b1 = end;
    *pfn = b1 > b0 ? b1 - b0 : 0;
    return X + (*pfn ? b0 : 0);
}

/* Causal attention of nq queries against one KV head. Query i (hd floats at
 * q + i*ldq) attends to keys 0 .. n_keys[i]-1 (rows of K and V, stride ldkv):
 *   s_j = td_dot(q_i, K_j, hd) * scale;  mx = max_j s_j;  e_j = exp(s_j - mx);
 *   sum = D16 sum of e_0..e_{n-1};  o_i[d] = sum over j in order of
 *   fma(e_j * (1/sum), V_j[d], o_i[d]) (sequential in j from 0).
 * So each query's output depends only on its own q, keys and n_keys — not on nq
 * or on which queries share the call. Every K and V row may be read up to
 * max(n_keys) (all of them must be valid). scratch: min(nq, TD_ATTEND_QMAX) x
 * max(n_keys) floats. The AVX-512 path takes the queries in blocks of up to
 * TD_ATTEND_QB (then the rest, 1 to 3: a GQA group of 3 reads its K/V once)
 * that share each K/V load; scores of 16 keys (16/qb keys x qb queries, 15
 * lanes for 3) are folded together (fold16x16: the same additions as the D16
 * fold, on shuffled registers). The AVX2 path takes the queries in blocks of
 * up to TD_ATTEND_QMAX over L1-sized blocks of keys (kernels_avx2.c): a T = 8
 * verify of a GQA-2 model is 16 queries per KV head, whose K/V rows are then
 * read from L2/L3 once instead of four times. */
#define TD_ATTEND_QB 4
#define TD_ATTEND_QMAX 16 /* scratch rows (the largest query block of any path) */
void td_attend(float *o, int ldo, const float *q, int ldq, int nq, const int *n_keys,
               const float *K, const float *V, int ldkv, int hd, float scale, float *scratch);
/* The same over K and V rows stored as kv_dtype (TD_DTYPE_F32, BF16, F16 or
 * Q8_0; ldkv in elements): every K and V element is widened to f32 where it
 * is loaded — exactly, or for Q8_0 dequantized as td_dequantize_row does
 * ((float)q * d, one rounding; hd and ldkv multiples of 32) — then the
 * operations of td_attend run unchanged, so the result equals td_attend over
 * the widened rows, bit for bit, on every path (NEON takes Q8_0 rows through
 * the portable order). */
void td_attend_kv(float *o, int ldo, const float *q, int ldq, int nq, const int *n_keys,
                  const void *K, const void *V, int kv_dtype, int ldkv, int hd, float scale, float *scratch);

/* Attention in the "A32" order (act_type bf16 over a bf16 cache, nn/forward.c):
 * the bf16 counterpart of td_attend, with queries and probabilities rounded to
 * bf16 and every product a vdpbf16ps lane (dp_lane of the B32 order above).
 * Query i (hd bf16 at q + i*ldq: the caller rounds q * scale once) attends to
 * keys 0 .. n_keys[i]-1 (bf16 rows of K and V, ldkv elements apart):
 *   s_j = B32 dot(q_i, K_j, hd)  (16 lanes over pairs, then the D16 fold);
 *   mx, e_j = exp(s_j - mx), sum: as td_attend;  p_j = bf16(e_j * (1/sum))
 *   (nearest even, td_f32_to_bf16);  for each dimension d, acc = +0 and for
 *   m = 0, 1, ... in order: acc = dp_lane(acc, p_2m, p_2m+1, V_2m[d],
 *   V_2m+1[d]) (the odd key first; a last odd key pairs with zeros);
 *   o_i[d] = acc.
 * Each query's bits depend on its own q, n_keys[i] and keys only (batch
 * invariant); the AVX-512 path (vdpbf16ps where bf16 is native) and the
 * portable emulation give the same bits. hd a multiple of 32, nq <=
 * TD_ATTEND_QMAX. Scratch: sc and p each nq x (max n_keys rounded up to even)
 * elements (f32 and bf16). */
void td_attend_b32(float *o, int ldo, const uint16_t *q, int ldq, int nq, const int *n_keys, const uint16_t *K,
                   const uint16_t *V, int ldkv, int hd, float *sc, uint16_t *p);

#endif
