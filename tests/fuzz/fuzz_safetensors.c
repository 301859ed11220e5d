/* fuzz_safetensors — libFuzzer harness for the safetensors reader
 * (src/io/safetensors.c).
 *
 * Design: the input is written to one memfd, reused across runs, and opened
 * through its /proc/self/fd path by td_st_open (the real open/fstat/mmap
 * path). When it opens, every tensor is looked up by name, its fields checked
 * against each other, and its whole claimed byte range read (a bad bound shows
 * as an ASan error or SIGSEGV); then td_st_release. A failure must come with a
 * negative code and a message. */
#define _GNU_SOURCE
#include "io/safetensors.h"
#include "tandem.h"
#include "memfile.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static volatile uint64_t sink;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = fuzz_memfile("fuzz.safetensors", data, size);

    td_err err = {0};
    td_st_file *f = NULL;
    int rc = td_st_open(&f, path, &err);
    if (rc) {
        if (f || rc > 0 || !err.msg[0]) abort();
        return 0;
    }
    uint64_t acc = 0;
    for (int i = 0; i < f->n_tensors; i++) {
        const td_st_tensor *t = &f->tensors[i];
        if (td_st_find(f, t->name) != t) abort();
        if (t->n_dims < 0 || t->n_dims > 8) abort();
        if (t->nbytes) {
            const unsigned char *p = t->data;
            if (p < (const unsigned char *)f->map || p + t->nbytes > (const unsigned char *)f->map + f->map_len) abort();
            for (size_t j = 0; j < t->nbytes; j += 97) acc += p[j];
            acc += p[t->nbytes - 1];
        }
    }
    td_st_find(f, "");
    td_st_find(f, "model.embed_tokens.weight");
    sink = acc;
    td_st_release(f);
    td_st_free(f);
    return 0;
}
