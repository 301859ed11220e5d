/* quant — block-quantized weights, byte-compatible with GGUF's Q8_0 and Q4_0.
 *
 * Formats (blocks of 32 consecutive values of a row; a row of K values is K/32
 * blocks, so K must be a multiple of 32):
 *   Q8_0: f16 scale d, then 32 int8 q[i]        (34 bytes);  value i = q[i] * d
 *   Q4_0: f16 scale d, then 16 bytes qs[j]      (18 bytes);  value j      = ((qs[j] & 15) - 8) * d,
 *                                                             value j + 16 = ((qs[j] >> 4) - 8) * d
 * Quantization (td_quantize_row) follows llama.cpp's reference quantizers:
 * Q8_0 d = amax/127, q = roundf(x/d); Q4_0 d = (the value of largest magnitude)/-8,
 * nibble = min(15, trunc(x/d + 8.5)). Non-finite or NaN inputs give a defined
 * (clamped) result instead of undefined behaviour.
 *
 * Matrix products (td_quant_matmul, reached through td_matmul): every weight is
 * dequantized exactly to f32 — q * d is exact in f32 (at most 8 + 11 significant
 * bits) — and multiplied in the D16 order of kernels.h. So the result is the same
 * bits as td_matmul over the f32 dequantized matrix: batch invariance and the
 * reference for tests come for free, and activations are never rounded. The
 * AVX-512 tiles (up to 8 tokens x 3 outputs, or 1 x 8 for decode) dequantize a
 * 16-value half block per output row once and reuse it for every token of the
 * tile; Q4_0 dequantizes by a 16-entry table lookup (vpermps) of (n - 8) * d.
 * The portable path computes the same operations in the same order. */
#ifndef TD_QUANT_H
#define TD_QUANT_H

#include "tandem.h"
#include <stddef.h>
#include <stdint.h>

#define TD_QK 32 /* values per block */

typedef struct td_block_q8_0 {
    uint16_t d;      /* f16 scale */
    int8_t qs[32];
} td_block_q8_0;     /* 34 bytes */

typedef struct td_block_q4_0 {
    uint16_t d;      /* f16 scale */
    uint8_t qs[16];  /* low nibbles: values 0..15, high nibbles: values 16..31 */
} td_block_q4_0;     /* 18 bytes */

/* 1 for TD_DTYPE_Q8_0 / TD_DTYPE_Q4_0. */
int td_dtype_is_quant(int dtype);
/* "f32", "f16", "bf16", "q8_0", "q4_0", or "?". */
const char *td_dtype_name(int dtype);
/* Bytes of n consecutive values of one row of dtype (n a multiple of 32 for the
 * block formats; 0 when dtype is unknown or n does not fit its blocks). */
size_t td_dtype_row_bytes(int dtype, int64_t n);
/* 0 when a row of n values can be stored as dtype; else TD_EFORMAT with a
 * message naming what (tensor names the tensor in the message). */
int td_dtype_check_row(int dtype, int64_t n, const char *tensor, td_err *err);

/* 0 when nbytes is exactly the size of a [rows][k] tensor of dtype (k a
 * multiple of 32 for the block formats); else TD_EFORMAT naming the tensor,
 * the dtype, the shape and both sizes. */
int td_dtype_check_tensor(int dtype, int64_t rows, int64_t k, uint64_t nbytes, const char *tensor, td_err *err);

/* f32 -> f16, round to nearest even (overflow to inf, NaN stays NaN). */
uint16_t td_f32_to_f16(float f);

/* Quantize n values (n % 32 == 0) of x into dst (td_dtype_row_bytes(dtype, n)
 * bytes). Returns 0, or TD_EINVAL for another dtype or a bad n. */
int td_quantize_row(int dtype, const float *x, void *dst, int64_t n);
/* Dequantize n values (n % 32 == 0) starting at a block boundary of src. */
void td_dequantize_row(int dtype, const void *src, float *dst, int64_t n);

/* td_matmul for a quantized W ([N] rows of K values, row-major blocks; K must
 * be a multiple of 32 — callers validate at load; with another K the outputs
 * [n0, n1) are set to NaN). Same contract and bits as td_matmul on the f32
 * dequantized matrix, on every kernel path. */
void td_quant_matmul(float *y, int ldy, const float *x, int ldx, int M, const void *W, int dtype,
                     int K, int n0, int n1, int add);

#endif
