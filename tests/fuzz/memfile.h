/* memfile.h — the fuzz input as a file: written to one memfd (made on first use,
 * reused across runs) and named by its /proc/self/fd path, so that the real
 * open/fstat/mmap path of a loader runs. Needs _GNU_SOURCE (memfd_create). */
#ifndef TD_FUZZ_MEMFILE_H
#define TD_FUZZ_MEMFILE_H
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

/* The path of a file holding data[0..size); valid until the next call. */
static const char *fuzz_memfile(const char *name, const uint8_t *data, size_t size) {
    static int fd = -1;
    static char path[64];
    if (fd < 0) {
        fd = memfd_create(name, 0);
        if (fd < 0) { perror("memfd_create"); abort(); }
        snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    }
    if (ftruncate(fd, 0) || pwrite(fd, data, size, 0) != (ssize_t)size) abort();
    return path;
}
#endif
