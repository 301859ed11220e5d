/* safetensors — read-only mmapped safetensors files with a fully validated header.
 *
 * Format: u64 little-endian header length N, N bytes of JSON
 * {"name": {"dtype": "BF16", "shape": [..], "data_offsets": [begin, end]}, ...,
 *  "__metadata__": {...}}, then the data region. Every offset pair is checked to be
 * ordered, within the data region, and equal in size to dtype size x shape product;
 * the header must be valid JSON of that schema. Files are untrusted. */
#ifndef TD_SAFETENSORS_H
#define TD_SAFETENSORS_H

#include "tandem.h"
#include <stddef.h>
#include <stdint.h>

typedef struct td_st_tensor {
    char *name;          /* owned */
    int dtype;           /* TD_DTYPE_*, or -1 for a dtype tandem does not compute with */
    char dtype_name[16];
    int n_dims;
    int64_t shape[8];
    const void *data;    /* into the mapping */
    size_t nbytes;
} td_st_tensor;

typedef struct td_st_file {
    char *path;          /* owned */
    void *map;           /* mmap base */
    size_t map_len;
    td_st_tensor *tensors; /* [n_tensors], owned */
    int n_tensors;
} td_st_file;

int td_st_open(td_st_file **out, const char *path, td_err *err);
void td_st_free(td_st_file *f);
/* Drop the mapping's pages from the process (MADV_DONTNEED): for a caller that
 * copied what it needs. The mapping stays valid (pages fault back in from the
 * file if read again). */
void td_st_release(td_st_file *f);
/* The tensor called name, or NULL. */
const td_st_tensor *td_st_find(const td_st_file *f, const char *name);

#endif
