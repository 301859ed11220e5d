/* util — error buffer formatting, assertions, clock, file reads, half floats. */
#define _POSIX_C_SOURCE 200809L
#include "util.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

const char *td_strerror(int code) {
    switch (code) {
    case TD_OK: return "ok";
    case TD_EINVAL: return "invalid argument";
    case TD_ENOMEM: return "out of memory";
    case TD_EIO: return "i/o error";
    case TD_EFORMAT: return "malformed input";
    case TD_EUNSUPPORTED: return "unsupported";
    case TD_ERANGE: return "out of range";
    case TD_EFULL: return "capacity exhausted";
    case TD_ESTATE: return "invalid state";
    default: return "unknown error";
    }
}

int td_seterr(td_err *err, int code, const char *fmt, ...) {
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
        err->code = code;
    }
    return code;
}

void td_assert_fail(const char *expr, const char *file, int line) {
    fprintf(stderr, "tandem: invariant broken: %s (%s:%d)\n", expr, file, line);
    abort();
}

double td_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

int td_read_file(const char *path, char **data, size_t *len, td_err *err) {
    *data = NULL;
    if (len) *len = 0;
    FILE *f = fopen(path, "rb");
    if (!f) return td_seterr(err, TD_EIO, "%s: %s", path, strerror(errno));
    if (fseek(f, 0, SEEK_END) != 0) {
        fclose(f);
        return td_seterr(err, TD_EIO, "%s: cannot seek", path);
    }
    long n = ftell(f);
    if (n < 0 || fseek(f, 0, SEEK_SET) != 0) {
        fclose(f);
        return td_seterr(err, TD_EIO, "%s: cannot size", path);
    }
    char *buf = malloc((size_t)n + 1);
    if (!buf) {
        fclose(f);
        return td_seterr(err, TD_ENOMEM, "%s: out of memory reading %ld bytes", path, n);
    }
    size_t got = fread(buf, 1, (size_t)n, f);
    fclose(f);
    if (got != (size_t)n) {
        free(buf);
        return td_seterr(err, TD_EIO, "%s: short read", path);
    }
    buf[n] = 0;
    *data = buf;
    if (len) *len = (size_t)n;
    return 0;
}

int td_mul_size(size_t a, size_t b, size_t *out) {
    if (a && b > SIZE_MAX / a) return TD_ERANGE;
    *out = a * b;
    return 0;
}

float td_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ff, u;
    if (exp == 0) {
        if (man == 0) {
            u = sign;
        } else { /* subnormal: normalise */
            int e = -1;
            do { e++; man <<= 1; } while (!(man & 0x400));
            man &= 0x3ff;
            u = sign | ((uint32_t)(127 - 15 - e) << 23) | (man << 13);
        }
    } else if (exp == 31) {
        u = sign | 0x7f800000u | (man << 13);
    } else {
        u = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    union { uint32_t u; float f; } v;
    v.u = u;
    return v.f;
}
