/* util — small shared helpers for the library: error reporting into td_err,
 * invariant assertions, monotonic time, whole-file reads and checked sizes.
 * Nothing here allocates behind the caller's back except td_read_file. */
#ifndef TD_UTIL_H
#define TD_UTIL_H

#include "tandem.h"
#include <stddef.h>
#include <stdint.h>

/* Record an error (printf-style message) in err (may be NULL); returns code. */
int td_seterr(td_err *err, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* For broken invariants only (never for bad input): print and abort. */
void td_assert_fail(const char *expr, const char *file, int line);
#define TD_ASSERT(x) ((x) ? (void)0 : td_assert_fail(#x, __FILE__, __LINE__))

/* Monotonic seconds. */
double td_now(void);

/* Open path read-only for the loaders: a file descriptor (owned by the caller,
 * close()) when it is a regular file, its size in *size; else a negative TD_E*
 * code with a message naming the path. A FIFO or device is refused without
 * blocking (opened O_NONBLOCK, which does not change reads of a regular file). */
int td_open_regular(const char *path, long long *size, td_err *err);

/* Read a whole regular file into an owned, NUL-terminated buffer (free()). */
int td_read_file(const char *path, char **data, size_t *len, td_err *err);

/* a*b with overflow check: 0 ok, TD_ERANGE on overflow. */
int td_mul_size(size_t a, size_t b, size_t *out);

/* bf16 / f16 <-> f32 */
static inline float td_bf16_to_f32(uint16_t h) {
    union { uint32_t u; float f; } v;
    v.u = (uint32_t)h << 16;
    return v.f;
}
float td_f16_to_f32(uint16_t h);
/* f32 -> bf16, round to nearest even; a NaN stays a NaN (quiet bit set, sign kept). */
static inline uint16_t td_f32_to_bf16(float f) {
    union { float f; uint32_t u; } v = {.f = f};
    if ((v.u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((v.u >> 16) | 0x40u);
    return (uint16_t)((v.u + 0x7fffu + ((v.u >> 16) & 1u)) >> 16);
}
/* f32 -> f16: td_f32_to_f16 in nn/quant.h. */

#endif
