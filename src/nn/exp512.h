/* exp512 — the AVX-512 exp of the kernels (kernels.c's exp_v, td_exp on the
 * AVX-512 path), in one place so that the AMX attention's fused softmax
 * (amx.c) computes the same bits as td_exp. A range clamp, Cody-Waite
 * reduction by ln 2 in two parts, a degree-6 polynomial, then 2^n by scalef;
 * the constants are the AVX2 path's (kernels_avx2.h), so both paths agree.
 * For x86-64 translation units that compile AVX-512F code (globally or under
 * a target attribute that includes avx512f). */
#ifndef TD_EXP512_H
#define TD_EXP512_H

#if defined(__x86_64__)
#include "nn/kernels_avx2.h"

#include <immintrin.h>

static inline __attribute__((always_inline, target("avx512f"))) __m512 td_exp512(__m512 x) {
    x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(EXP_LO)), _mm512_set1_ps(EXP_HI));
    __m512 t = _mm512_mul_ps(x, _mm512_set1_ps(EXP_LOG2E));
    __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(EXP_C1), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(EXP_C2), r);
    __m512 p = _mm512_set1_ps(EXP_P0);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(EXP_P1));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(EXP_P2));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(EXP_P3));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(EXP_P4));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(EXP_P5));
    __m512 z = _mm512_mul_ps(r, r);
    p = _mm512_fmadd_ps(p, z, r);
    p = _mm512_add_ps(p, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}
#endif

#endif
