/* gguf — open, map and validate a GGUF file; write one.
 *
 * Reader design: the file is mapped whole (PROT_READ, MAP_PRIVATE) and parsed
 * with a bounds-checked cursor; nothing but keys and tensor names is copied
 * (string values and numeric arrays stay views into the mapping). The file is
 * untrusted, so before anything is allocated or pointed at we check:
 *   - magic "GGUF", version 2 or 3;
 *   - tensor and metadata counts against the bytes left (each entry needs a
 *     minimum number of bytes), so a huge count fails before any allocation;
 *   - every string length and array count against the bytes left; keys and
 *     tensor names non-empty, at most 65535 / 255 bytes, without NUL bytes;
 *   - value types known; arrays of arrays refused (nesting depth 1);
 *   - keys unique, tensor names unique;
 *   - general.alignment, when present, a U32 power of two in [1, 65536];
 *   - tensors: n_dims in 1..4, every ne >= 1, the element count and byte size
 *     computed without overflow, ne[0] a whole number of the type's blocks,
 *     the type known (td_gguf_types), offset a multiple of the alignment, the
 *     byte range inside the data section, no two tensors overlapping;
 *   - computable tensors (F32/F16/BF16) aligned to their element size.
 * Errors name the file, the byte offset and the field.
 *
 * Writer design: metadata and tensor infos are serialised into a growing
 * buffer as they are added (keys checked unique); tensor offsets are assigned
 * in order, each aligned. td_gguf_w_write_header writes the buffer and the
 * padding, then the caller streams each tensor's bytes; the writer pads
 * between tensors and checks each tensor gets exactly its size. */
#define _POSIX_C_SOURCE 200809L
#include "io/gguf.h"
#include "util/util.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define GG_MAX_KEY 65535
#define GG_MAX_NAME 255
#define GG_MAX_ALIGN 65536

/* GGML tensor types. dtype >= 0 marks the ones tandem computes with; the others
 * are known so their sizes can be checked and a model using them refused by name. */
static const td_gguf_type td_gguf_types[] = {
    {0, "F32", TD_DTYPE_F32, 1, 4},
    {1, "F16", TD_DTYPE_F16, 1, 2},
    {30, "BF16", TD_DTYPE_BF16, 1, 2},
    {2, "Q4_0", TD_DTYPE_Q4_0, 32, 18},
    {3, "Q4_1", TD_DTYPE_Q4_1, 32, 20},
    {6, "Q5_0", TD_DTYPE_Q5_0, 32, 22},
    {7, "Q5_1", TD_DTYPE_Q5_1, 32, 24},
    {8, "Q8_0", TD_DTYPE_Q8_0, 32, 34},
    {9, "Q8_1", -1, 32, 36},
    {10, "Q2_K", TD_DTYPE_Q2_K, 256, 84},
    {11, "Q3_K", TD_DTYPE_Q3_K, 256, 110},
    {12, "Q4_K", TD_DTYPE_Q4_K, 256, 144},
    {13, "Q5_K", TD_DTYPE_Q5_K, 256, 176},
    {14, "Q6_K", TD_DTYPE_Q6_K, 256, 210},
    {15, "Q8_K", -1, 256, 292},
    {16, "IQ2_XXS", -1, 256, 66},
    {17, "IQ2_XS", -1, 256, 74},
    {18, "IQ3_XXS", -1, 256, 98},
    {19, "IQ1_S", -1, 256, 50},
    {20, "IQ4_NL", TD_DTYPE_IQ4_NL, 32, 18},
    {21, "IQ3_S", -1, 256, 110},
    {22, "IQ2_S", -1, 256, 82},
    {23, "IQ4_XS", TD_DTYPE_IQ4_XS, 256, 136},
    {24, "I8", -1, 1, 1},
    {25, "I16", -1, 1, 2},
    {26, "I32", -1, 1, 4},
    {27, "I64", -1, 1, 8},
    {28, "F64", -1, 1, 8},
    {29, "IQ1_M", -1, 256, 56},
    {34, "TQ1_0", -1, 256, 54},
    {35, "TQ2_0", -1, 256, 66},
    {39, "MXFP4", -1, 32, 17},
};
#define GG_N_TYPES (sizeof td_gguf_types / sizeof td_gguf_types[0])

const td_gguf_type *td_gguf_type_by_id(int id) {
    for (size_t i = 0; i < GG_N_TYPES; i++)
        if (td_gguf_types[i].id == id) return &td_gguf_types[i];
    return NULL;
}

const td_gguf_type *td_gguf_type_by_dtype(int dtype) {
    for (size_t i = 0; i < GG_N_TYPES; i++)
        if (dtype >= 0 && td_gguf_types[i].dtype == dtype) return &td_gguf_types[i];
    return NULL;
}

size_t td_gguf_row_bytes(const td_gguf_type *t, int64_t n) {
    if (!t || n < 0 || n % t->block != 0) return 0;
    size_t r;
    if (td_mul_size((size_t)(n / t->block), (size_t)t->block_bytes, &r) != 0) return 0;
    return r;
}

/* Bytes of one scalar of a value type; 0 for STRING/ARRAY, -1 unknown. */
static int gg_scalar_size(uint32_t t) {
    switch (t) {
    case TD_GGUF_U8: case TD_GGUF_I8: case TD_GGUF_BOOL: return 1;
    case TD_GGUF_U16: case TD_GGUF_I16: return 2;
    case TD_GGUF_U32: case TD_GGUF_I32: case TD_GGUF_F32: return 4;
    case TD_GGUF_U64: case TD_GGUF_I64: case TD_GGUF_F64: return 8;
    case TD_GGUF_STRING: case TD_GGUF_ARRAY: return 0;
    default: return -1;
    }
}

static const char *gg_type_name(uint32_t t) {
    static const char *n[] = {"U8", "I8", "U16", "I16", "U32", "I32", "F32", "BOOL", "STRING", "ARRAY", "U64", "I64", "F64"};
    return t < 13 ? n[t] : "?";
}

/* ---- reader ------------------------------------------------------------- */

typedef struct gg_cur {
    const unsigned char *p;
    size_t len, at;
    const char *path;
    td_err *err;
} gg_cur;

static size_t gg_left(const gg_cur *c) { return c->len - c->at; }

static int gg_need(gg_cur *c, size_t n, const char *what) {
    if (n > gg_left(c))
        return td_seterr(c->err, TD_EFORMAT, "%s: %s at byte %zu needs %zu bytes but the file has %zu left (truncated?)",
                         c->path, what, c->at, n, gg_left(c));
    return 0;
}

static uint64_t gg_le(const unsigned char *p, int n) {
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

static int gg_u32(gg_cur *c, uint32_t *v, const char *what) {
    int rc = gg_need(c, 4, what);
    if (rc) return rc;
    *v = (uint32_t)gg_le(c->p + c->at, 4);
    c->at += 4;
    return 0;
}

static int gg_u64(gg_cur *c, uint64_t *v, const char *what) {
    int rc = gg_need(c, 8, what);
    if (rc) return rc;
    *v = gg_le(c->p + c->at, 8);
    c->at += 8;
    return 0;
}

/* A string: length then bytes; max bytes at most. */
static int gg_str(gg_cur *c, td_gguf_str *s, size_t max, const char *what) {
    uint64_t n;
    size_t at = c->at;
    int rc = gg_u64(c, &n, what);
    if (rc) return rc;
    if (n > gg_left(c))
        return td_seterr(c->err, TD_EFORMAT, "%s: %s at byte %zu: string length %llu is past the end of the file (%zu bytes left)",
                         c->path, what, at, (unsigned long long)n, gg_left(c));
    if (n > max)
        return td_seterr(c->err, TD_EFORMAT, "%s: %s at byte %zu: string length %llu exceeds %zu", c->path, what, at,
                         (unsigned long long)n, max);
    s->s = (const char *)c->p + c->at;
    s->len = (size_t)n;
    c->at += (size_t)n;
    return 0;
}

/* An owned NUL-terminated copy of a name (non-empty, no NUL bytes). */
static int gg_name(gg_cur *c, char **out, size_t max, const char *what) {
    td_gguf_str s;
    size_t at = c->at;
    int rc = gg_str(c, &s, max, what);
    if (rc) return rc;
    if (s.len == 0) return td_seterr(c->err, TD_EFORMAT, "%s: %s at byte %zu is empty", c->path, what, at);
    if (memchr(s.s, 0, s.len))
        return td_seterr(c->err, TD_EFORMAT, "%s: %s at byte %zu contains a NUL byte", c->path, what, at);
    *out = malloc(s.len + 1);
    if (!*out) return td_seterr(c->err, TD_ENOMEM, "%s: out of memory", c->path);
    memcpy(*out, s.s, s.len);
    (*out)[s.len] = 0;
    return 0;
}

static int gg_scalar(gg_cur *c, td_gguf_kv *kv, uint32_t type) {
    int sz = gg_scalar_size(type);
    char what[96];
    snprintf(what, sizeof what, "value of key %.60s", kv->key);
    int rc = gg_need(c, (size_t)sz, what);
    if (rc) return rc;
    uint64_t raw = gg_le(c->p + c->at, sz);
    c->at += (size_t)sz;
    switch (type) {
    case TD_GGUF_I8: kv->v.i = (int8_t)raw; break;
    case TD_GGUF_I16: kv->v.i = (int16_t)raw; break;
    case TD_GGUF_I32: kv->v.i = (int32_t)raw; break;
    case TD_GGUF_I64: kv->v.i = (int64_t)raw; break;
    case TD_GGUF_F32: { union { uint32_t u; float f; } x; x.u = (uint32_t)raw; kv->v.f = x.f; break; }
    case TD_GGUF_F64: { union { uint64_t u; double f; } x; x.u = raw; kv->v.f = x.f; break; }
    case TD_GGUF_BOOL:
        if (raw > 1)
            return td_seterr(c->err, TD_EFORMAT, "%s: key %s: BOOL value %llu is not 0 or 1", c->path, kv->key,
                             (unsigned long long)raw);
        kv->v.u = raw;
        break;
    default: kv->v.u = raw; break;
    }
    return 0;
}

static int gg_value(gg_cur *c, td_gguf_kv *kv) {
    const char *path = c->path;
    uint32_t type;
    int rc = gg_u32(c, &type, "metadata value type");
    if (rc) return rc;
    if (gg_scalar_size(type) < 0)
        return td_seterr(c->err, TD_EFORMAT, "%s: key %s: unknown value type %u", path, kv->key, type);
    kv->type = (int)type;
    kv->n = 1;
    if (type == TD_GGUF_STRING) {
        char what[96];
        snprintf(what, sizeof what, "value of key %.60s", kv->key);
        return gg_str(c, &kv->str, SIZE_MAX, what);
    }
    if (type != TD_GGUF_ARRAY) return gg_scalar(c, kv, type);
    uint32_t at;
    uint64_t n;
    if ((rc = gg_u32(c, &at, "array element type")) || (rc = gg_u64(c, &n, "array length"))) return rc;
    if (at == TD_GGUF_ARRAY)
        return td_seterr(c->err, TD_EUNSUPPORTED, "%s: key %s: arrays of arrays are not supported", path, kv->key);
    int es = gg_scalar_size(at);
    if (es < 0) return td_seterr(c->err, TD_EFORMAT, "%s: key %s: unknown array element type %u", path, kv->key, at);
    kv->arr_type = (int)at;
    /* every element needs es bytes (a string at least its 8-byte length) */
    size_t min = at == TD_GGUF_STRING ? 8 : (size_t)es;
    if (n > gg_left(c) / min)
        return td_seterr(c->err, TD_EFORMAT,
                         "%s: key %s: array of %llu %s elements at byte %zu does not fit in the %zu bytes left", path,
                         kv->key, (unsigned long long)n, gg_type_name(at), c->at, gg_left(c));
    kv->n = n;
    if (at != TD_GGUF_STRING) {
        kv->arr = c->p + c->at;
        c->at += (size_t)n * (size_t)es;
        if (at == TD_GGUF_BOOL)
            for (uint64_t i = 0; i < n; i++)
                if (((const unsigned char *)kv->arr)[i] > 1)
                    return td_seterr(c->err, TD_EFORMAT, "%s: key %s: element %llu is not a BOOL (0 or 1)", path,
                                     kv->key, (unsigned long long)i);
        return 0;
    }
    kv->strs = malloc((n ? (size_t)n : 1) * sizeof *kv->strs);
    if (!kv->strs) return td_seterr(c->err, TD_ENOMEM, "%s: out of memory for array %s", path, kv->key);
    for (uint64_t i = 0; i < n; i++) {
        char what[112];
        snprintf(what, sizeof what, "element %llu of key %.60s", (unsigned long long)i, kv->key);
        if ((rc = gg_str(c, &kv->strs[i], SIZE_MAX, what))) return rc;
    }
    return 0;
}

static int gg_tensor_info(gg_cur *c, td_gguf_tensor *t, int idx) {
    const char *path = c->path;
    int rc;
    char what[64];
    snprintf(what, sizeof what, "name of tensor %d", idx);
    if ((rc = gg_name(c, &t->name, GG_MAX_NAME, what))) return rc;
    uint32_t nd;
    if ((rc = gg_u32(c, &nd, "tensor n_dims"))) return rc;
    if (nd < 1 || nd > TD_GGUF_MAX_DIMS)
        return td_seterr(c->err, TD_EFORMAT, "%s: tensor %s: n_dims = %u (must be 1..%d)", path, t->name, nd,
                         TD_GGUF_MAX_DIMS);
    t->n_dims = (int)nd;
    for (int i = 0; i < TD_GGUF_MAX_DIMS; i++) t->ne[i] = 1;
    size_t count = 1;
    for (uint32_t i = 0; i < nd; i++) {
        uint64_t ne;
        if ((rc = gg_u64(c, &ne, "tensor dimension"))) return rc;
        if (ne == 0) return td_seterr(c->err, TD_EFORMAT, "%s: tensor %s: dimension ne[%u] is 0", path, t->name, i);
        if (ne > (uint64_t)INT64_MAX || ne > SIZE_MAX || td_mul_size(count, (size_t)ne, &count) != 0)
            return td_seterr(c->err, TD_ERANGE, "%s: tensor %s: dimension ne[%u] = %llu makes the element count overflow",
                             path, t->name, i, (unsigned long long)ne);
        t->ne[i] = (int64_t)ne;
    }
    uint32_t type;
    if ((rc = gg_u32(c, &type, "tensor type"))) return rc;
    t->type = td_gguf_type_by_id((int)type);
    if (!t->type) return td_seterr(c->err, TD_EFORMAT, "%s: tensor %s: unknown tensor type %u", path, t->name, type);
    if (t->ne[0] % t->type->block != 0)
        return td_seterr(c->err, TD_EFORMAT, "%s: tensor %s: ne[0] = %lld is not a multiple of the %s block size %d",
                         path, t->name, (long long)t->ne[0], t->type->name, t->type->block);
    size_t row = td_gguf_row_bytes(t->type, t->ne[0]);
    if (row == 0 || td_mul_size(row, count / (size_t)t->ne[0], &t->nbytes) != 0)
        return td_seterr(c->err, TD_ERANGE, "%s: tensor %s: byte size overflows", path, t->name);
    if ((rc = gg_u64(c, &t->offset, "tensor offset"))) return rc;
    return 0;
}

static int gg_cmp_kv(const void *a, const void *b) {
    return strcmp((*(const td_gguf_kv *const *)a)->key, (*(const td_gguf_kv *const *)b)->key);
}

static int gg_cmp_off(const void *a, const void *b) {
    const td_gguf_tensor *x = *(const td_gguf_tensor *const *)a, *y = *(const td_gguf_tensor *const *)b;
    if (x->offset != y->offset) return x->offset < y->offset ? -1 : 1;
    return 0;
}

static int gg_cmp_tname(const void *a, const void *b) {
    return strcmp((*(const td_gguf_tensor *const *)a)->name, (*(const td_gguf_tensor *const *)b)->name);
}

/* Keys unique; tensor names unique; tensors not overlapping. */
static int gg_check_unique(td_gguf_file *f, td_err *err) {
    size_t n = (size_t)(f->n_kvs > f->n_tensors ? f->n_kvs : f->n_tensors);
    void **ix = malloc((n ? n : 1) * sizeof *ix);
    if (!ix) return td_seterr(err, TD_ENOMEM, "%s: out of memory", f->path);
    int rc = 0;
    for (int i = 0; i < f->n_kvs; i++) ix[i] = &f->kvs[i];
    qsort(ix, (size_t)f->n_kvs, sizeof *ix, gg_cmp_kv);
    for (int i = 1; i < f->n_kvs && !rc; i++)
        if (strcmp(((td_gguf_kv *)ix[i])->key, ((td_gguf_kv *)ix[i - 1])->key) == 0)
            rc = td_seterr(err, TD_EFORMAT, "%s: metadata key %s appears twice", f->path, ((td_gguf_kv *)ix[i])->key);
    for (int i = 0; i < f->n_tensors; i++) ix[i] = &f->tensors[i];
    qsort(ix, (size_t)f->n_tensors, sizeof *ix, gg_cmp_tname);
    for (int i = 1; i < f->n_tensors && !rc; i++)
        if (strcmp(((td_gguf_tensor *)ix[i])->name, ((td_gguf_tensor *)ix[i - 1])->name) == 0)
            rc = td_seterr(err, TD_EFORMAT, "%s: tensor %s appears twice", f->path, ((td_gguf_tensor *)ix[i])->name);
    qsort(ix, (size_t)f->n_tensors, sizeof *ix, gg_cmp_off);
    for (int i = 1; i < f->n_tensors && !rc; i++) {
        const td_gguf_tensor *a = ix[i - 1], *b = ix[i];
        if (a->offset + a->nbytes > b->offset)
            rc = td_seterr(err, TD_EFORMAT, "%s: tensors %s (bytes %llu..%llu) and %s (from %llu) overlap", f->path,
                           a->name, (unsigned long long)a->offset, (unsigned long long)(a->offset + a->nbytes), b->name,
                           (unsigned long long)b->offset);
    }
    free(ix);
    return rc;
}

static int gg_parse(td_gguf_file *f, td_err *err) {
    gg_cur c = {.p = f->map, .len = f->map_len, .path = f->path, .err = err};
    int rc = gg_need(&c, 4, "magic");
    if (rc) return rc;
    if (memcmp(c.p, "GGUF", 4) != 0) return td_seterr(err, TD_EFORMAT, "%s: not a GGUF file (magic is not \"GGUF\")", f->path);
    c.at = 4;
    uint64_t n_t, n_kv;
    if ((rc = gg_u32(&c, &f->version, "version"))) return rc;
    if (f->version != 3 && f->version != 2)
        return td_seterr(err, TD_EUNSUPPORTED, "%s: GGUF version %u is not supported (2, 3)", f->path, f->version);
    if ((rc = gg_u64(&c, &n_t, "tensor count")) || (rc = gg_u64(&c, &n_kv, "metadata count"))) return rc;
    /* minimum bytes: a key/value 8 + 1 + 4 + 1; a tensor info 8 + 1 + 4 + 8 + 4 + 8 */
    if (n_kv > gg_left(&c) / 14)
        return td_seterr(err, TD_EFORMAT, "%s: metadata count %llu cannot fit in the file (%zu bytes)", f->path,
                         (unsigned long long)n_kv, f->map_len);
    if (n_t > gg_left(&c) / 33 || n_t > INT32_MAX)
        return td_seterr(err, TD_EFORMAT, "%s: tensor count %llu cannot fit in the file (%zu bytes)", f->path,
                         (unsigned long long)n_t, f->map_len);
    f->kvs = calloc(n_kv ? (size_t)n_kv : 1, sizeof *f->kvs);
    f->tensors = calloc(n_t ? (size_t)n_t : 1, sizeof *f->tensors);
    if (!f->kvs || !f->tensors) return td_seterr(err, TD_ENOMEM, "%s: out of memory", f->path);
    for (uint64_t i = 0; i < n_kv; i++) {
        td_gguf_kv *kv = &f->kvs[i];
        char what[48];
        snprintf(what, sizeof what, "key of metadata entry %llu", (unsigned long long)i);
        if ((rc = gg_name(&c, &kv->key, GG_MAX_KEY, what))) return rc;
        f->n_kvs++;
        if ((rc = gg_value(&c, kv))) return rc;
    }
    f->alignment = TD_GGUF_DEFAULT_ALIGNMENT;
    const td_gguf_kv *al = td_gguf_find_kv(f, "general.alignment");
    if (al) {
        if (al->type != TD_GGUF_U32)
            return td_seterr(err, TD_EFORMAT, "%s: general.alignment has type %s (must be U32)", f->path, gg_type_name((uint32_t)al->type));
        if (al->v.u == 0 || al->v.u > GG_MAX_ALIGN || (al->v.u & (al->v.u - 1)))
            return td_seterr(err, TD_EFORMAT, "%s: general.alignment = %llu is not a power of two in [1, %d]", f->path,
                             (unsigned long long)al->v.u, GG_MAX_ALIGN);
        f->alignment = (uint32_t)al->v.u;
    }
    for (uint64_t i = 0; i < n_t; i++) {
        if ((rc = gg_tensor_info(&c, &f->tensors[i], (int)i))) {
            if (f->tensors[i].name) f->n_tensors++;
            return rc;
        }
        f->n_tensors++;
    }
    size_t pad = (f->alignment - c.at % f->alignment) % f->alignment;
    if (n_t > 0 && pad > gg_left(&c))
        return td_seterr(err, TD_EFORMAT, "%s: the data section (at byte %zu after padding) is past the end of the file",
                         f->path, c.at + pad);
    f->data_offset = n_t > 0 ? c.at + pad : c.at;
    size_t data_len = f->map_len - f->data_offset;
    for (int i = 0; i < f->n_tensors; i++) {
        td_gguf_tensor *t = &f->tensors[i];
        if (t->offset % f->alignment != 0)
            return td_seterr(err, TD_EFORMAT, "%s: tensor %s: offset %llu is not a multiple of the alignment %u", f->path,
                             t->name, (unsigned long long)t->offset, f->alignment);
        if (t->offset > data_len || t->nbytes > data_len - t->offset)
            return td_seterr(err, TD_EFORMAT,
                             "%s: tensor %s: bytes %llu..%llu are past the end of the data section (%zu bytes; truncated?)",
                             f->path, t->name, (unsigned long long)t->offset,
                             (unsigned long long)t->offset + (unsigned long long)t->nbytes, data_len);
        t->data = (const unsigned char *)f->map + f->data_offset + t->offset;
        size_t es = (size_t)t->type->block_bytes;
        if (t->type->dtype >= 0 && t->type->block == 1 && (uintptr_t)t->data % es != 0)
            return td_seterr(err, TD_EUNSUPPORTED, "%s: tensor %s: %s data is not %zu-byte aligned", f->path, t->name,
                             t->type->name, es);
    }
    return gg_check_unique(f, err);
}

void td_gguf_free(td_gguf_file *f) {
    if (!f) return;
    if (f->mapped && f->map) munmap(f->map, f->map_len);
    if (f->fd >= 0) close(f->fd);
    for (int i = 0; i < f->n_kvs; i++) {
        free(f->kvs[i].key);
        free(f->kvs[i].strs);
    }
    free(f->kvs);
    for (int i = 0; i < f->n_tensors; i++) free(f->tensors[i].name);
    free(f->tensors);
    free(f->path);
    free(f);
}

static int gg_new(td_gguf_file **out, const char *name, td_err *err) {
    *out = calloc(1, sizeof **out);
    if (!*out || !((*out)->path = strdup(name))) {
        free(*out);
        *out = NULL;
        return td_seterr(err, TD_ENOMEM, "%s: out of memory", name);
    }
    (*out)->fd = -1;
    return 0;
}

int td_gguf_open_mem(td_gguf_file **out, const void *buf, size_t len, const char *name, td_err *err) {
    if (!out) return td_seterr(err, TD_EINVAL, "td_gguf_open_mem: out is NULL");
    *out = NULL;
    if (!buf && len) return td_seterr(err, TD_EINVAL, "td_gguf_open_mem: buf is NULL");
    td_gguf_file *f;
    int rc = gg_new(&f, name ? name : "(memory)", err);
    if (rc) return rc;
    f->map = (void *)buf;
    f->map_len = len;
    rc = gg_parse(f, err);
    if (rc) {
        td_gguf_free(f);
        return rc;
    }
    *out = f;
    return 0;
}

int td_gguf_open(td_gguf_file **out, const char *path, td_err *err) {
    if (!out) return td_seterr(err, TD_EINVAL, "td_gguf_open: out is NULL");
    *out = NULL;
    if (!path) return td_seterr(err, TD_EINVAL, "td_gguf_open: path is NULL");
    td_gguf_file *f;
    int rc = gg_new(&f, path, err);
    if (rc) return rc;
    long long fsize;
    int fd = td_open_regular(path, &fsize, err);
    if (fd < 0) {
        rc = fd;
        goto fail;
    }
    if (fsize < 24) {
        rc = td_seterr(err, TD_EFORMAT, "%s: file is %lld bytes, too short for a GGUF header (24)", path,
                       fsize);
        goto fail;
    }
    if ((unsigned long long)fsize > SIZE_MAX) {
        rc = td_seterr(err, TD_ERANGE, "%s: file too large to map", path);
        goto fail;
    }
    f->map_len = (size_t)fsize;
    f->map = mmap(NULL, f->map_len, PROT_READ, MAP_PRIVATE, fd, 0);
    if (f->map == MAP_FAILED) {
        f->map = NULL;
        rc = td_seterr(err, TD_EIO, "%s: mmap failed: %s", path, strerror(errno));
        goto fail;
    }
    f->mapped = 1;
    f->fd = fd; /* kept: td_model_repack_q8r maps pages of it again */
    fd = -1;
    if ((rc = gg_parse(f, err))) goto fail;
    *out = f;
    return 0;
fail:
    if (fd >= 0) close(fd);
    td_gguf_free(f);
    return rc;
}

const td_gguf_kv *td_gguf_find_kv(const td_gguf_file *f, const char *key) {
    if (!f || !key) return NULL;
    for (int i = 0; i < f->n_kvs; i++)
        if (strcmp(f->kvs[i].key, key) == 0) return &f->kvs[i];
    return NULL;
}

const td_gguf_tensor *td_gguf_find_tensor(const td_gguf_file *f, const char *name) {
    if (!f || !name) return NULL;
    for (int i = 0; i < f->n_tensors; i++)
        if (strcmp(f->tensors[i].name, name) == 0) return &f->tensors[i];
    return NULL;
}

static int gg_is_int(int t) {
    return t == TD_GGUF_U8 || t == TD_GGUF_I8 || t == TD_GGUF_U16 || t == TD_GGUF_I16 || t == TD_GGUF_U32 ||
           t == TD_GGUF_I32 || t == TD_GGUF_U64 || t == TD_GGUF_I64;
}
static int gg_is_signed(int t) { return t == TD_GGUF_I8 || t == TD_GGUF_I16 || t == TD_GGUF_I32 || t == TD_GGUF_I64; }

int td_gguf_get_u32(const td_gguf_file *f, const char *key, uint32_t *out, td_err *err) {
    const td_gguf_kv *kv = td_gguf_find_kv(f, key);
    if (!kv) return 0;
    if (!gg_is_int(kv->type))
        return td_seterr(err, TD_EFORMAT, "%s: key %s has type %s (expected an integer)", f->path, key,
                         gg_type_name((uint32_t)kv->type));
    if ((gg_is_signed(kv->type) && kv->v.i < 0) || kv->v.u > UINT32_MAX)
        return td_seterr(err, TD_ERANGE, "%s: key %s = %lld is out of range", f->path, key, (long long)kv->v.i);
    *out = (uint32_t)kv->v.u;
    return 1;
}

int td_gguf_get_f64(const td_gguf_file *f, const char *key, double *out, td_err *err) {
    const td_gguf_kv *kv = td_gguf_find_kv(f, key);
    if (!kv) return 0;
    if (kv->type != TD_GGUF_F32 && kv->type != TD_GGUF_F64)
        return td_seterr(err, TD_EFORMAT, "%s: key %s has type %s (expected F32 or F64)", f->path, key,
                         gg_type_name((uint32_t)kv->type));
    *out = kv->v.f;
    return 1;
}

int td_gguf_get_bool(const td_gguf_file *f, const char *key, int *out, td_err *err) {
    const td_gguf_kv *kv = td_gguf_find_kv(f, key);
    if (!kv) return 0;
    if (kv->type != TD_GGUF_BOOL)
        return td_seterr(err, TD_EFORMAT, "%s: key %s has type %s (expected BOOL)", f->path, key,
                         gg_type_name((uint32_t)kv->type));
    *out = kv->v.u != 0;
    return 1;
}

int td_gguf_get_str(const td_gguf_file *f, const char *key, td_gguf_str *out, td_err *err) {
    const td_gguf_kv *kv = td_gguf_find_kv(f, key);
    if (!kv) return 0;
    if (kv->type != TD_GGUF_STRING)
        return td_seterr(err, TD_EFORMAT, "%s: key %s has type %s (expected STRING)", f->path, key,
                         gg_type_name((uint32_t)kv->type));
    *out = kv->str;
    return 1;
}

int64_t td_gguf_arr_int(const td_gguf_kv *kv, uint64_t i) {
    const unsigned char *p = kv->arr;
    int es = gg_scalar_size((uint32_t)kv->arr_type);
    uint64_t raw = gg_le(p + (size_t)i * (size_t)es, es);
    switch (kv->arr_type) {
    case TD_GGUF_I8: return (int8_t)raw;
    case TD_GGUF_I16: return (int16_t)raw;
    case TD_GGUF_I32: return (int32_t)raw;
    default: return (int64_t)raw;
    }
}

/* ---- writer ------------------------------------------------------------- */

struct td_gguf_writer {
    FILE *fp;
    char *path;
    uint32_t alignment;
    unsigned char *kv, *ti;       /* serialised metadata / tensor infos */
    size_t kv_len, kv_cap, ti_len, ti_cap;
    uint64_t n_kv, n_t;
    char **keys;                  /* [n_kv] owned, for the uniqueness check */
    size_t *sizes;                /* [n_t] bytes per tensor */
    uint64_t next_off;            /* data offset for the next tensor added */
    uint64_t written_t;           /* tensors whose data was written */
    uint64_t data_at;             /* bytes of the data section written */
    size_t cur_done;              /* bytes of tensor written_t written so far */
    int rc;                       /* sticky error */
    td_err err;
};

static int gw_fail(td_gguf_writer *w, int code, const char *msg, const char *what) {
    if (!w->rc) {
        w->rc = code;
        td_seterr(&w->err, code, "%s: %s%s%s", w->path, msg, what ? " " : "", what ? what : "");
    }
    return w->rc;
}

static int gw_put(td_gguf_writer *w, unsigned char **buf, size_t *len, size_t *cap, const void *p, size_t n) {
    if (w->rc) return w->rc;
    if (*len + n > *cap) {
        size_t c = *cap ? *cap : 4096;
        while (c < *len + n) c *= 2;
        unsigned char *nb = realloc(*buf, c);
        if (!nb) return gw_fail(w, TD_ENOMEM, "out of memory", NULL);
        *buf = nb;
        *cap = c;
    }
    memcpy(*buf + *len, p, n);
    *len += n;
    return 0;
}

static int gw_le(td_gguf_writer *w, int ti, uint64_t v, int n) {
    unsigned char b[8];
    for (int i = 0; i < n; i++) b[i] = (unsigned char)(v >> (8 * i));
    return ti ? gw_put(w, &w->ti, &w->ti_len, &w->ti_cap, b, (size_t)n) : gw_put(w, &w->kv, &w->kv_len, &w->kv_cap, b, (size_t)n);
}

static int gw_strn(td_gguf_writer *w, int ti, const char *s, size_t n) {
    gw_le(w, ti, n, 8);
    return ti ? gw_put(w, &w->ti, &w->ti_len, &w->ti_cap, s, n) : gw_put(w, &w->kv, &w->kv_len, &w->kv_cap, s, n);
}

/* Key (unique) and value type. */
static int gw_key(td_gguf_writer *w, const char *key, uint32_t type) {
    if (w->rc) return w->rc;
    for (uint64_t i = 0; i < w->n_kv; i++)
        if (strcmp(w->keys[i], key) == 0) return gw_fail(w, TD_EINVAL, "duplicate metadata key", key);
    char **nk = realloc(w->keys, (size_t)(w->n_kv + 1) * sizeof *nk);
    if (!nk || !(nk[w->n_kv] = strdup(key))) {
        if (nk) w->keys = nk;
        return gw_fail(w, TD_ENOMEM, "out of memory", NULL);
    }
    w->keys = nk;
    w->n_kv++;
    gw_strn(w, 0, key, strlen(key));
    return gw_le(w, 0, type, 4);
}

int td_gguf_w_open(td_gguf_writer **out, const char *path, uint32_t alignment, td_err *err) {
    if (!out) return td_seterr(err, TD_EINVAL, "td_gguf_w_open: out is NULL");
    *out = NULL;
    if (!path) return td_seterr(err, TD_EINVAL, "td_gguf_w_open: path is NULL");
    if (alignment == 0 || alignment > GG_MAX_ALIGN || (alignment & (alignment - 1)))
        return td_seterr(err, TD_EINVAL, "td_gguf_w_open: alignment %u is not a power of two", alignment);
    td_gguf_writer *w = calloc(1, sizeof *w);
    if (!w || !(w->path = strdup(path))) {
        free(w);
        return td_seterr(err, TD_ENOMEM, "out of memory");
    }
    w->alignment = alignment;
    w->fp = fopen(path, "wb");
    if (!w->fp) {
        int rc = td_seterr(err, TD_EIO, "%s: %s", path, strerror(errno));
        free(w->path);
        free(w);
        return rc;
    }
    if (alignment != TD_GGUF_DEFAULT_ALIGNMENT) td_gguf_w_u32(w, "general.alignment", alignment);
    *out = w;
    return 0;
}

int td_gguf_w_close(td_gguf_writer *w, int ok, td_err *err) {
    if (!w) return 0;
    int rc = w->rc;
    if (ok && !rc && w->written_t != w->n_t) gw_fail(w, TD_ESTATE, "not every tensor's data was written", NULL);
    rc = w->rc;
    if (w->fp && fclose(w->fp) != 0 && !rc) rc = gw_fail(w, TD_EIO, "write failed:", strerror(errno));
    if (rc && err) *err = w->err;
    if (rc || !ok) remove(w->path);
    for (uint64_t i = 0; i < w->n_kv; i++) free(w->keys[i]);
    free(w->keys);
    free(w->sizes);
    free(w->kv);
    free(w->ti);
    free(w->path);
    free(w);
    return rc;
}

int td_gguf_w_str(td_gguf_writer *w, const char *key, const char *val) {
    gw_key(w, key, TD_GGUF_STRING);
    return gw_strn(w, 0, val, strlen(val));
}
int td_gguf_w_u32(td_gguf_writer *w, const char *key, uint32_t val) {
    gw_key(w, key, TD_GGUF_U32);
    return gw_le(w, 0, val, 4);
}
int td_gguf_w_i32(td_gguf_writer *w, const char *key, int32_t val) {
    gw_key(w, key, TD_GGUF_I32);
    return gw_le(w, 0, (uint32_t)val, 4);
}
int td_gguf_w_f32(td_gguf_writer *w, const char *key, float val) {
    union { float f; uint32_t u; } x = {.f = val};
    gw_key(w, key, TD_GGUF_F32);
    return gw_le(w, 0, x.u, 4);
}
int td_gguf_w_bool(td_gguf_writer *w, const char *key, int val) {
    gw_key(w, key, TD_GGUF_BOOL);
    return gw_le(w, 0, val ? 1 : 0, 1);
}
int td_gguf_w_arr_str(td_gguf_writer *w, const char *key, const char *const *vals, const size_t *lens, size_t n) {
    gw_key(w, key, TD_GGUF_ARRAY);
    gw_le(w, 0, TD_GGUF_STRING, 4);
    gw_le(w, 0, n, 8);
    for (size_t i = 0; i < n; i++) gw_strn(w, 0, vals[i], lens ? lens[i] : strlen(vals[i]));
    return w->rc;
}
int td_gguf_w_arr_i32(td_gguf_writer *w, const char *key, const int32_t *vals, size_t n) {
    gw_key(w, key, TD_GGUF_ARRAY);
    gw_le(w, 0, TD_GGUF_I32, 4);
    gw_le(w, 0, n, 8);
    for (size_t i = 0; i < n; i++) gw_le(w, 0, (uint32_t)vals[i], 4);
    return w->rc;
}

int td_gguf_w_tensor(td_gguf_writer *w, const char *name, const td_gguf_type *t, int n_dims, const int64_t *ne) {
    if (w->rc) return w->rc;
    if (!t || n_dims < 1 || n_dims > TD_GGUF_MAX_DIMS) return gw_fail(w, TD_EINVAL, "bad type or n_dims for tensor", name);
    size_t count = 1;
    for (int i = 0; i < n_dims; i++)
        if (ne[i] < 1 || td_mul_size(count, (size_t)ne[i], &count) != 0)
            return gw_fail(w, TD_EINVAL, "bad dimensions for tensor", name);
    size_t row = td_gguf_row_bytes(t, ne[0]), nbytes;
    if (!row || td_mul_size(row, count / (size_t)ne[0], &nbytes) != 0)
        return gw_fail(w, TD_EINVAL, "row length is not a whole number of blocks for tensor", name);
    size_t *ns = realloc(w->sizes, (size_t)(w->n_t + 1) * sizeof *ns);
    if (!ns) return gw_fail(w, TD_ENOMEM, "out of memory", NULL);
    w->sizes = ns;
    w->sizes[w->n_t++] = nbytes;
    gw_strn(w, 1, name, strlen(name));
    gw_le(w, 1, (uint64_t)n_dims, 4);
    for (int i = 0; i < n_dims; i++) gw_le(w, 1, (uint64_t)ne[i], 8);
    gw_le(w, 1, (uint64_t)t->id, 4);
    gw_le(w, 1, w->next_off, 8);
    w->next_off += nbytes;
    w->next_off += (w->alignment - w->next_off % w->alignment) % w->alignment;
    return w->rc;
}

static int gw_write(td_gguf_writer *w, const void *p, size_t n) {
    if (w->rc) return w->rc;
    if (n && fwrite(p, 1, n, w->fp) != n) return gw_fail(w, TD_EIO, "write failed:", strerror(errno));
    return 0;
}

static int gw_pad(td_gguf_writer *w, uint64_t at) {
    static const unsigned char zero[GG_MAX_ALIGN];
    return gw_write(w, zero, (size_t)((w->alignment - at % w->alignment) % w->alignment));
}

int td_gguf_w_write_header(td_gguf_writer *w, td_err *err) {
    /* The data section on a cache line: at the default alignment (32) it starts 32 bytes off one
       for about half of all header lengths, and then so does every tensor whose offset is a
       multiple of 64, bf16 rows included (a reader that copies or maps them in place reads each
       row across one more line). The key general.alignment = 32 (the default, 33 bytes) shifts the
       header; it is added where that puts the data start on a line (all header lengths but those
       32 past a multiple of 64). Readers see the default alignment either way. */
    if (!w->rc && w->alignment == 32) {
        uint64_t hl = 24 + w->kv_len + w->ti_len, at = (hl + 31) / 32 * 32, at2 = (hl + 33 + 31) / 32 * 32;
        int has = 0;
        for (uint64_t i = 0; i < w->n_kv; i++) has |= strcmp(w->keys[i], "general.alignment") == 0;
        if (!has && at % 64 && at2 % 64 == 0) td_gguf_w_u32(w, "general.alignment", 32);
    }
    unsigned char h[24];
    memcpy(h, "GGUF", 4);
    uint64_t v[3] = {3, w->n_t, w->n_kv};
    for (int i = 0; i < 4; i++) h[4 + i] = (unsigned char)(v[0] >> (8 * i));
    for (int i = 0; i < 8; i++) h[8 + i] = (unsigned char)(v[1] >> (8 * i));
    for (int i = 0; i < 8; i++) h[16 + i] = (unsigned char)(v[2] >> (8 * i));
    gw_write(w, h, sizeof h);
    gw_write(w, w->kv, w->kv_len);
    gw_write(w, w->ti, w->ti_len);
    gw_pad(w, sizeof h + w->kv_len + w->ti_len);
    if (w->rc && err) *err = w->err;
    return w->rc;
}

int td_gguf_w_write_data(td_gguf_writer *w, const void *data, size_t n, td_err *err) {
    const unsigned char *p = data;
    while (!w->rc && n > 0) {
        if (w->written_t >= w->n_t) {
            gw_fail(w, TD_ESTATE, "more tensor data than the tensors hold", NULL);
            break;
        }
        size_t left = w->sizes[w->written_t] - w->cur_done, k = n < left ? n : left;
        gw_write(w, p, k);
        p += k;
        n -= k;
        w->cur_done += k;
        w->data_at += k;
        if (w->cur_done == w->sizes[w->written_t]) { /* tensor complete: pad to the alignment */
            gw_pad(w, w->data_at);
            w->data_at += (w->alignment - w->data_at % w->alignment) % w->alignment;
            w->written_t++;
            w->cur_done = 0;
        }
    }
    if (w->rc && err) *err = w->err;
    return w->rc;
}

int td_gguf_w_copy(td_gguf_writer *w, const td_gguf_kv *kv) {
    gw_key(w, kv->key, (uint32_t)kv->type);
    if (kv->type == TD_GGUF_STRING) return gw_strn(w, 0, kv->str.s, kv->str.len);
    if (kv->type != TD_GGUF_ARRAY) {
        int sz = gg_scalar_size((uint32_t)kv->type);
        uint64_t raw = kv->v.u;
        if (kv->type == TD_GGUF_F32) {
            union { float f; uint32_t u; } x = {.f = (float)kv->v.f};
            raw = x.u;
        } else if (kv->type == TD_GGUF_F64) {
            union { double f; uint64_t u; } x = {.f = kv->v.f};
            raw = x.u;
        }
        return gw_le(w, 0, raw, sz);
    }
    gw_le(w, 0, (uint32_t)kv->arr_type, 4);
    gw_le(w, 0, kv->n, 8);
    if (kv->arr_type != TD_GGUF_STRING)
        return gw_put(w, &w->kv, &w->kv_len, &w->kv_cap, kv->arr, (size_t)kv->n * (size_t)gg_scalar_size((uint32_t)kv->arr_type));
    for (uint64_t i = 0; i < kv->n; i++) gw_strn(w, 0, kv->strs[i].s, kv->strs[i].len);
    return w->rc;
}
