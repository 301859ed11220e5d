/* util — error buffer formatting, assertions, clock, file reads, half floats. */
#define _POSIX_C_SOURCE 200809L
#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

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

int td_open_regular(const char *path, long long *size, td_err *err) {
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return td_seterr(err, TD_EIO, "%s: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        int e = errno;
        close(fd);
        return td_seterr(err, TD_EIO, "%s: %s", path, strerror(e));
    }
    if (!S_ISREG(sb.st_mode)) {
        close(fd);
        return td_seterr(err, TD_EIO, "%s: not a regular file", path);
    }
    *size = (long long)sb.st_size;
    return fd;
}

int td_read_file(const char *path, char **data, size_t *len, td_err *err) {
    *data = NULL;
    if (len) *len = 0;
    long long n;
    int fd = td_open_regular(path, &n, err);
    if (fd < 0) return fd;
    if ((unsigned long long)n >= SIZE_MAX) {
        close(fd);
        return td_seterr(err, TD_ERANGE, "%s: file too large (%lld bytes)", path, n);
    }
    char *buf = malloc((size_t)n + 1);
    if (!buf) {
        close(fd);
        return td_seterr(err, TD_ENOMEM, "%s: out of memory reading %lld bytes", path, n);
    }
    size_t got = 0;
    while (got < (size_t)n) {
        ssize_t r = read(fd, buf + got, (size_t)n - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        got += (size_t)r;
    }
    close(fd);
    if (got != (size_t)n) {
        free(buf);
        return td_seterr(err, TD_EIO, "%s: short read (%zu of %lld bytes)", path, got, n);
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
