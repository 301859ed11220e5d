/* kq512 — the k-quant products (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS) on AVX-512 (BW + VNNI),
 * internal: td_quant_matmul (quant.c) dispatches to them on the AVX-512 path.
 *
 * Same bits as the portable and AVX2 products (the k-quant order of quant.h):
 * each super-block's P_s[l] is an exact integer, and every float operation of
 * that order is performed once, in order, per output. What differs is only
 * the arrangement: two super-blocks (2p, 2p + 1) at a time, one in each
 * 256-bit half of a register, so that one 512-bit vpmaddubsw + vpdpwssd step
 * serves 64 values of a token and the acc[8 (s & 1) + l] update of both
 * super-blocks is one 16-lane fma (lanes 0-7 even, 8-15 odd). A weight row's
 * super-blocks are decoded once per tile of up to 8 tokens (decode, verify and
 * prefill use the same tiles). Compiled only where the build targets
 * AVX-512 F/BW/VL/VNNI (as quant.c's VNNI kernels), run only where the CPU has
 * them. */
#ifndef TD_KQ512_H
#define TD_KQ512_H

/* 1 when this build has the kernels, the CPU runs them and dt is one they take
 * (TD_DTYPE_Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS); else 0. */
int td_kq512_ok(int dt);

/* td_quant_matmul's contract for those dtypes (quant.h; K % 256 == 0, checked
 * by the caller): y[m][n] (+)= activation row m of x (f32, quantized here as
 * td_quant_act_row_k does) times weight row n of W, for m < M, n in [n0, n1).
 * Returns 0, or TD_ENOMEM when this thread's scratch cannot grow (the caller
 * then takes another path). */
int td_kq512_matmul(float *y, int ldy, const float *x, int ldx, int M, const void *W, int dt, int K, int n0, int n1,
                    int add);

#endif
