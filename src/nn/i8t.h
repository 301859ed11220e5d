/* i8t — products of int8 weights (one f32 scale per output row) with int8
 * activations (one f32 scale per token) on Intel AMX-INT8 tiles. For small,
 * fast, approximate products (a speculative drafter's, M = 1..16 tokens typical,
 * up to 64): its results match no other kernel; they are reproducible and
 * batch invariant (an output's bits depend on its own weight row and token
 * alone, never on M, the output range or the tiling).
 *
 * Quantization (the same rule for weight rows and activation rows): a row x of
 * width K gets the scale s = max_k |x[k]| / 127 (f32 division) and the values
 * q[k] = x[k] / s (f32 division) clamped to [-127, 127] and rounded to nearest,
 * ties to even (the default rounding mode); a row whose s is 0 (all zeros, or
 * so small that max / 127 underflows) has s = 0 and q = 0; one whose s is
 * subnormal (max < 127 * 2^-126) follows the rule with that coarse s (values
 * may clamp). Inputs are finite (a NaN or infinity gives some value in
 * [-127, 127], never undefined behavior).
 *
 * The product: y[m][n] = ((float)P * ws[n]) * xs[m], where P = sum_k qw[n][k] *
 * xq[m][k] is the exact int32 dot (TDPBSSD, signed x signed; exact while |P| <
 * 2^31, which |q| <= 127 guarantees for K < 133144) converted to f32 (nearest
 * even), then two f32 multiplies in that order; add = 1 adds it to y (one more
 * f32 add). td_i8t_matmul_ref computes exactly this in scalar C (tests compare
 * bit for bit).
 *
 * Layouts (bytes in memory order; x86 is little-endian):
 *   qw [N][K] int8 row-major: read in place as A tiles (16 rows x 64 bytes at a
 *     stride of K bytes; the last rows of a range under a configuration of
 *     fewer rows, never reading past row n1 - 1);
 *   xp the packed activations, B tiles: token chunk c = m / 16 of mc tokens (16,
 *     or the remainder) starts at word 16 c * K / 4; inside it step s = k / 64,
 *     quad r = (k % 64) / 4 and token i = m % 16 is word s*16*mc + r*mc + i,
 *     whose 4 bytes are xq[m][k - k % 4 .. + 4) (VNNI quads: one step is 16
 *     rows of mc * 4 bytes).
 * Any alignment works; give qw (and xp) 64-byte alignment: then every 64-byte
 * tile row is one cache line. A qw from malloc (16 bytes past a line) made an
 * L2-resident product 1.5x slower (M = 8, N = 1280, K = 384: 14 us, 9 aligned).
 *
 * Tile configuration: LDTILECFG is per thread and amx.c keeps the shape it last
 * loaded in thread-local statics, not re-reading it (a stale one computes wrong
 * rows, or faults on a tile left unconfigured). So td_i8t_matmul trusts no
 * cache: it reads the thread's configuration at entry (STTILECFG, ~5 ns),
 * loads its own only where that differs, and on return loads back the one it
 * found (LDTILECFG, ~50 ns) — unless it found the init state (no
 * configuration): then no module on this thread can hold a cached shape, and
 * it leaves its own for its next call. So a module that caches sees across a
 * call the configuration it left. That holds while nothing releases the tiles
 * (TILERELEASE) of a thread where amx.c has configured them. Its single-block
 * configuration has the very bytes of amx.c's configure(mc, rows) (C, A, B =
 * tiles 0-2 and 3-5; C and B mc * 4 bytes wide, A 64), so products of both
 * kinds with the same token count (over whole 16-row blocks) reload nothing. */
#ifndef TD_I8T_H
#define TD_I8T_H

#include <stddef.h>
#include <stdint.h>

/* 1 when td_amx_available() (tile state granted), the CPU has AMX-INT8
 * (CPUID.(EAX=7,ECX=0):EDX bit 25) and a small exact product checks out. */
int td_i8t_available(void);
/* 1 when a product of width K can run on the tiles (K > 0, a multiple of 64). */
static inline int td_i8t_fits(int K) { return K > 0 && K % 64 == 0; }

/* Quantize W ([N][K] of dtype TD_DTYPE_F32 / BF16 / F16, as td_to_f32 reads
 * it) row by row by the rule above: qw [N][K] int8, s [N] float. Any K > 0. */
void td_i8t_quantize(int8_t *qw, float *s, const void *W, int dtype, int N, int K);

/* uint32 words of packed activations for M rows of width K (td_i8t_fits(K)). */
static inline size_t td_i8t_act_words(int M, int K) { return (size_t)M * (size_t)K / 4; }
/* Quantize rows x[m*ldx .. +K), m in [0, M), by the rule above (scale xs[m])
 * and pack them into xp (td_i8t_act_words(M, K) words) in the layout above.
 * The layout depends on M: pack for the M of the product. td_i8t_fits(K). */
void td_i8t_act(uint32_t *xp, float *xs, const float *x, int ldx, int M, int K);

/* y[m*ldy + n] (+)= ((float)P * ws[n]) * xs[m] for n in [n0, n1), m in [0, M)
 * (add = 1 accumulates), P the int32 dot of qw's row n with packed token m.
 * Requires td_i8t_available() and td_i8t_fits(K); any 0 <= n0 <= n1, M >= 0
 * (M > 16 runs in chunks of 16 tokens). No allocation. */
void td_i8t_matmul(float *y, int ldy, const uint32_t *xp, const float *xs, int M, const int8_t *qw, const float *ws,
                   int K, int n0, int n1, int add);
/* The same, the same bits, in scalar C (any build, any CPU; for tests). */
void td_i8t_matmul_ref(float *y, int ldy, const uint32_t *xp, const float *xs, int M, const int8_t *qw, const float *ws,
                       int K, int n0, int n1, int add);

#endif
