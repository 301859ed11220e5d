/* gguf — read-only mmapped GGUF v3 files with every field validated, and a
 * streaming GGUF writer.
 *
 * Format (little-endian): "GGUF", u32 version (3; 2 is read too), u64 tensor
 * count, u64 metadata count, the metadata (key string, u32 value type, value),
 * the tensor infos (name string, u32 n_dims, u64 ne[n_dims] innermost first,
 * u32 ggml type, u64 offset), padding to general.alignment (default 32), then
 * the data section; each tensor's offset is relative to its start. A string is
 * a u64 length and that many bytes (no NUL). An array is a u32 element type, a
 * u64 count and the elements. Files are untrusted: see gguf.c for the checks.
 *
 * Tensor types are one table (gguf.c, td_gguf_types): GGML type id, name,
 * TD_DTYPE_* (or -1 when tandem cannot compute with it), values per block and
 * bytes per block. Adding a computable type is one line there. */
#ifndef TD_GGUF_H
#define TD_GGUF_H

#include "tandem.h"
#include <stddef.h>
#include <stdint.h>

/* GGUF metadata value types. */
enum {
    TD_GGUF_U8 = 0, TD_GGUF_I8 = 1, TD_GGUF_U16 = 2, TD_GGUF_I16 = 3, TD_GGUF_U32 = 4,
    TD_GGUF_I32 = 5, TD_GGUF_F32 = 6, TD_GGUF_BOOL = 7, TD_GGUF_STRING = 8, TD_GGUF_ARRAY = 9,
    TD_GGUF_U64 = 10, TD_GGUF_I64 = 11, TD_GGUF_F64 = 12,
};

#define TD_GGUF_MAX_DIMS 4
#define TD_GGUF_DEFAULT_ALIGNMENT 32

/* One GGML tensor type. */
typedef struct td_gguf_type {
    int id;             /* GGML type id as stored in the file */
    const char *name;   /* "F32", "Q8_0", ... */
    int dtype;          /* TD_DTYPE_*, or -1: tandem does not compute with it */
    int block;          /* values per block (1 for plain types) */
    int block_bytes;    /* bytes per block */
} td_gguf_type;

/* The type with GGML id `id`, or NULL when unknown. */
const td_gguf_type *td_gguf_type_by_id(int id);
/* The type that stores TD_DTYPE_* `dtype`, or NULL. */
const td_gguf_type *td_gguf_type_by_dtype(int dtype);
/* Bytes of a row of n values of type t; 0 when n is not a whole number of blocks. */
size_t td_gguf_row_bytes(const td_gguf_type *t, int64_t n);

/* A string inside the mapping: not NUL-terminated. */
typedef struct td_gguf_str {
    const char *s;      /* borrowed from the mapping */
    size_t len;
} td_gguf_str;

typedef struct td_gguf_kv {
    char *key;          /* owned, NUL-terminated */
    int type;           /* TD_GGUF_* */
    int arr_type;       /* element type when type == TD_GGUF_ARRAY */
    uint64_t n;         /* element count of an array (1 for a scalar) */
    union {
        uint64_t u;     /* U8..U64, BOOL */
        int64_t i;      /* I8..I64 */
        double f;       /* F32, F64 */
    } v;                /* scalar value */
    td_gguf_str str;    /* STRING value */
    const void *arr;    /* numeric array elements, little-endian, in the mapping */
    td_gguf_str *strs;  /* [n] string array elements, owned */
} td_gguf_kv;

typedef struct td_gguf_tensor {
    char *name;         /* owned */
    const td_gguf_type *type;
    int n_dims;
    int64_t ne[TD_GGUF_MAX_DIMS]; /* innermost first, as in the file; unused dims are 1 */
    uint64_t offset;    /* in the data section */
    const void *data;   /* into the mapping */
    size_t nbytes;
} td_gguf_tensor;

typedef struct td_gguf_file {
    char *path;             /* owned */
    void *map;              /* mmap base (or the borrowed buffer of td_gguf_open_mem) */
    size_t map_len;
    int mapped;             /* 1: map is this file's own mmap */
    int fd;                 /* the mapped file, open until td_gguf_free (a caller may map pages of it
                               again: td_model_repack_q8r); -1 when not mapped */
    uint32_t version;
    uint32_t alignment;
    td_gguf_kv *kvs;        /* [n_kvs] in file order, owned */
    int n_kvs;
    td_gguf_tensor *tensors; /* [n_tensors] in file order, owned */
    int n_tensors;
    size_t data_offset;     /* file offset of the data section */
} td_gguf_file;

int td_gguf_open(td_gguf_file **out, const char *path, td_err *err);
/* Parse a file image in memory (borrowed; must outlive f): for tests. */
int td_gguf_open_mem(td_gguf_file **out, const void *buf, size_t len, const char *name, td_err *err);
void td_gguf_free(td_gguf_file *f);

const td_gguf_kv *td_gguf_find_kv(const td_gguf_file *f, const char *key);
const td_gguf_tensor *td_gguf_find_tensor(const td_gguf_file *f, const char *name);

/* Typed getters. Return 1 = found and stored, 0 = absent, negative = present
 * with the wrong type or out of range (message names the key). */
int td_gguf_get_u32(const td_gguf_file *f, const char *key, uint32_t *out, td_err *err); /* any integer type */
int td_gguf_get_f64(const td_gguf_file *f, const char *key, double *out, td_err *err);   /* F32/F64 */
int td_gguf_get_bool(const td_gguf_file *f, const char *key, int *out, td_err *err);
int td_gguf_get_str(const td_gguf_file *f, const char *key, td_gguf_str *out, td_err *err);
/* Element i of an integer array as int64 (caller checked i < n). */
int64_t td_gguf_arr_int(const td_gguf_kv *kv, uint64_t i);

/* ---- writer ------------------------------------------------------------
 * Collect metadata and tensor infos, then td_gguf_w_write_header, then the
 * tensors' bytes in the order they were added (td_gguf_w_write_data). Adding
 * functions record the first error; td_gguf_w_write_header reports it. */
typedef struct td_gguf_writer td_gguf_writer;

int td_gguf_w_open(td_gguf_writer **out, const char *path, uint32_t alignment, td_err *err);
/* Close the file; 0 only when everything was written. The file is removed on failure. */
int td_gguf_w_close(td_gguf_writer *w, int ok, td_err *err);

int td_gguf_w_str(td_gguf_writer *w, const char *key, const char *val);
int td_gguf_w_u32(td_gguf_writer *w, const char *key, uint32_t val);
int td_gguf_w_i32(td_gguf_writer *w, const char *key, int32_t val);
int td_gguf_w_f32(td_gguf_writer *w, const char *key, float val);
int td_gguf_w_bool(td_gguf_writer *w, const char *key, int val);
/* String array of n elements (lens may be NULL: NUL-terminated strings). */
int td_gguf_w_arr_str(td_gguf_writer *w, const char *key, const char *const *vals, const size_t *lens, size_t n);
int td_gguf_w_arr_i32(td_gguf_writer *w, const char *key, const int32_t *vals, size_t n);
/* A copy of a key/value read from another file. */
int td_gguf_w_copy(td_gguf_writer *w, const td_gguf_kv *kv);
/* A tensor of type t with ne[n_dims] (innermost first). */
int td_gguf_w_tensor(td_gguf_writer *w, const char *name, const td_gguf_type *t, int n_dims, const int64_t *ne);
/* At the default alignment (32) it may add general.alignment = 32 first, so
 * that the data section starts on a 64-byte line (see gguf.c). */
int td_gguf_w_write_header(td_gguf_writer *w, td_err *err);
/* The next bytes of the tensors' data, in the order the tensors were added, in
 * chunks of any size; padding is inserted when a tensor is complete. */
int td_gguf_w_write_data(td_gguf_writer *w, const void *data, size_t n, td_err *err);

#endif
