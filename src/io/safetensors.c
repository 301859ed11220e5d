/* safetensors — open, map and validate one .safetensors file.
 *
 * Design: the file is opened read-only and mapped whole (PROT_READ, MAP_PRIVATE);
 * nothing is copied but the JSON header, which is duplicated into a
 * NUL-terminated buffer so cJSON never reads past it. The file is untrusted, so
 * before any pointer into the mapping is formed we check:
 *   - the file holds at least the 8-byte length prefix;
 *   - the header length N is <= 100 MB and <= file size - 8;
 *   - the header is one JSON object (only whitespace may follow it, as the
 *     format pads with spaces);
 *   - every entry but "__metadata__" is an object with a "dtype" string, a
 *     "shape" array of at most 8 non-negative integers, and "data_offsets"
 *     [begin, end] of integers with begin <= end <= data region size;
 *   - end - begin equals (product of shape) x (dtype size), computed with
 *     overflow checks (dtypes of unknown size are refused);
 *   - no tensor name appears twice.
 * F32, F16 and BF16 are mapped to TD_DTYPE_*; other known dtypes (F64, I8, U8,
 * I16, I32, I64, BOOL, F8_*) are recorded with dtype -1 so the loader can refuse a
 * needed tensor by name. Alignment: a computable tensor (F32/F16/BF16) whose data
 * pointer is not aligned to its element size is REFUSED (TD_EUNSUPPORTED, naming
 * the tensor); files written by the safetensors library are always aligned.
 * Tensors are kept sorted by name, so td_st_find is a binary search. */
#define _GNU_SOURCE /* MAP_ANONYMOUS, MADV_HUGEPAGE, MADV_POPULATE_READ */
#include "io/safetensors.h"
#include "util/util.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* Mapping: weights are read in full by every forward pass, so the mapping is
 * placed at a 2 MiB-aligned address and advised MADV_HUGEPAGE: page-cache folios
 * of 2 MiB (which large-folio file systems create on read-ahead, and this advice
 * asks for on a page-cache miss) are then mapped with one PMD entry each instead
 * of 512 4 KiB PTEs. Measured on this project's VM (nested paging): streaming a
 * 1.2 GB model through 4 KiB mappings ran at 2-5 GB/s under load, through 2 MiB
 * mappings at the speed of anonymous huge-page memory. The whole file is then
 * pre-faulted (MADV_POPULATE_READ, else MADV_WILLNEED read-ahead), after the
 * header is validated, so the first forward pass pays no page faults. All of
 * this is advice: where the kernel lacks it the mapping works as before. */
#define ST_ALIGN ((size_t)2 << 20)

/* Map len bytes of fd read-only at a ST_ALIGN-aligned address (when len is at
 * least ST_ALIGN; else wherever mmap puts it). MAP_FAILED on failure. */
static void *st_map(int fd, size_t len) {
    if (len < ST_ALIGN || len > SIZE_MAX - ST_ALIGN) return mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, 0);
    /* reserve len + ST_ALIGN of address space, put the file at the aligned
     * address inside it, give back the slack on both sides */
    char *r = mmap(NULL, len + ST_ALIGN, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (r == MAP_FAILED) return mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, 0);
    char *a = (char *)(((uintptr_t)r + ST_ALIGN - 1) & ~(uintptr_t)(ST_ALIGN - 1));
    void *m = mmap(a, len, PROT_READ, MAP_PRIVATE | MAP_FIXED, fd, 0);
    if (m == MAP_FAILED) {
        munmap(r, len + ST_ALIGN);
        return mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, 0);
    }
    if (a > r) munmap(r, (size_t)(a - r));
    size_t tail = (size_t)(r + len + ST_ALIGN - (a + len));
    if (tail) munmap(a + len, tail);
#ifdef MADV_HUGEPAGE
    madvise(m, len, MADV_HUGEPAGE);
#endif
    return m;
}

/* Fault the whole mapping in now (advice; errors are ignored), then read a
 * byte of each page: on the project's VM (nested paging) the first access to
 * a page still cost ~1 us after MADV_POPULATE_READ, and a drafter whose weights
 * were first read in its first round paid 4-8 ms there (bench/forward-notes.md,
 * "Stop 59"), which priced its steps many times too high. */
static void st_prefault(void *map, size_t len) {
#ifdef MADV_POPULATE_READ
    if (madvise(map, len, MADV_POPULATE_READ) == 0) goto touch;
#endif
    madvise(map, len, MADV_WILLNEED);
touch:;
    volatile unsigned char sink = 0;
    for (size_t o = 0; o < len; o += 4096) sink ^= ((const volatile unsigned char *)map)[o];
    (void)sink;
}

#define ST_MAX_HEADER ((uint64_t)100 * 1000 * 1000)
#define ST_MAX_DIMS 8
/* Largest integer a JSON number (a double in cJSON) represents exactly. */
#define ST_MAX_EXACT 9007199254740992.0

typedef struct st_dtype_desc {
    const char *name;
    int dtype;    /* TD_DTYPE_* or -1 */
    size_t size;  /* bytes per element */
} st_dtype_desc;

static const st_dtype_desc st_dtypes[] = {
    {"F32", TD_DTYPE_F32, 4}, {"F16", TD_DTYPE_F16, 2}, {"BF16", TD_DTYPE_BF16, 2},
    {"F64", -1, 8},           {"I64", -1, 8},           {"U64", -1, 8},
    {"I32", -1, 4},           {"U32", -1, 4},           {"I16", -1, 2},
    {"U16", -1, 2},           {"I8", -1, 1},            {"U8", -1, 1},
    {"BOOL", -1, 1},          {"F8_E4M3", -1, 1},       {"F8_E5M2", -1, 1},
};

static const st_dtype_desc *st_dtype_lookup(const char *name) {
    for (size_t i = 0; i < sizeof st_dtypes / sizeof st_dtypes[0]; i++)
        if (strcmp(st_dtypes[i].name, name) == 0) return &st_dtypes[i];
    return NULL;
}

/* A JSON number that is a non-negative integer represented exactly. */
static int st_get_uint(const cJSON *j, uint64_t *out) {
    if (!cJSON_IsNumber(j)) return -1;
    double d = j->valuedouble;
    if (!isfinite(d) || d < 0 || d > ST_MAX_EXACT || floor(d) != d) return -1;
    *out = (uint64_t)d;
    return 0;
}

static int st_cmp_name(const void *a, const void *b) {
    const td_st_tensor *x = a, *y = b;
    return strcmp(x->name, y->name);
}

void td_st_free(td_st_file *f) {
    if (!f) return;
    if (f->map && f->map != MAP_FAILED) munmap(f->map, f->map_len);
    for (int i = 0; i < f->n_tensors; i++) free(f->tensors[i].name);
    free(f->tensors);
    free(f->path);
    free(f);
}

/* Parse one header entry into t. data points at the start of the data region. */
static int st_parse_entry(td_st_tensor *t, const cJSON *e, const char *path,
                          const unsigned char *data, uint64_t data_len, td_err *err) {
    const char *name = e->string;
    if (!cJSON_IsObject(e))
        return td_seterr(err, TD_EFORMAT, "%s: tensor %s: header entry is not an object", path, name);
    const cJSON *jd = cJSON_GetObjectItemCaseSensitive(e, "dtype");
    const cJSON *js = cJSON_GetObjectItemCaseSensitive(e, "shape");
    const cJSON *jo = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
    if (!cJSON_IsString(jd) || !jd->valuestring)
        return td_seterr(err, TD_EFORMAT, "%s: tensor %s: missing or non-string \"dtype\"", path, name);
    if (!cJSON_IsArray(js))
        return td_seterr(err, TD_EFORMAT, "%s: tensor %s: missing or non-array \"shape\"", path, name);
    if (!cJSON_IsArray(jo))
        return td_seterr(err, TD_EFORMAT, "%s: tensor %s: missing or non-array \"data_offsets\"", path, name);

    const st_dtype_desc *dd = st_dtype_lookup(jd->valuestring);
    if (!dd)
        return td_seterr(err, TD_EFORMAT, "%s: tensor %s: unknown dtype \"%.32s\"", path, name,
                         jd->valuestring);
    t->dtype = dd->dtype;
    snprintf(t->dtype_name, sizeof t->dtype_name, "%s", dd->name);

    int nd = cJSON_GetArraySize(js);
    if (nd > ST_MAX_DIMS)
        return td_seterr(err, TD_EUNSUPPORTED, "%s: tensor %s: %d dimensions (at most %d supported)",
                         path, name, nd, ST_MAX_DIMS);
    t->n_dims = nd;
    size_t count = 1;
    int i = 0;
    const cJSON *d;
    cJSON_ArrayForEach(d, js) {
        uint64_t v;
        if (st_get_uint(d, &v) != 0)
            return td_seterr(err, TD_EFORMAT, "%s: tensor %s: shape[%d] is not a non-negative integer",
                             path, name, i);
        if (v > (uint64_t)INT64_MAX || v > SIZE_MAX || td_mul_size(count, (size_t)v, &count) != 0)
            return td_seterr(err, TD_ERANGE, "%s: tensor %s: shape element count overflows", path, name);
        t->shape[i++] = (int64_t)v;
    }
    size_t nbytes;
    if (td_mul_size(count, dd->size, &nbytes) != 0)
        return td_seterr(err, TD_ERANGE, "%s: tensor %s: byte size (shape x %s) overflows", path, name,
                         dd->name);

    if (cJSON_GetArraySize(jo) != 2)
        return td_seterr(err, TD_EFORMAT, "%s: tensor %s: data_offsets must be [begin, end]", path, name);
    uint64_t begin, end;
    if (st_get_uint(cJSON_GetArrayItem(jo, 0), &begin) != 0 ||
        st_get_uint(cJSON_GetArrayItem(jo, 1), &end) != 0)
        return td_seterr(err, TD_EFORMAT, "%s: tensor %s: data_offsets are not non-negative integers",
                         path, name);
    if (begin > end)
        return td_seterr(err, TD_EFORMAT, "%s: tensor %s: data_offsets [%llu, %llu] are reversed", path,
                         name, (unsigned long long)begin, (unsigned long long)end);
    if (end > data_len)
        return td_seterr(err, TD_EFORMAT,
                         "%s: tensor %s: data_offsets end %llu is past the data region (%llu bytes; "
                         "file truncated?)",
                         path, name, (unsigned long long)end, (unsigned long long)data_len);
    if (end - begin != (uint64_t)nbytes)
        return td_seterr(err, TD_EFORMAT,
                         "%s: tensor %s: data_offsets span %llu bytes but shape x %s needs %zu", path,
                         name, (unsigned long long)(end - begin), dd->name, nbytes);
    t->data = data + begin;
    t->nbytes = nbytes;
    if (dd->dtype >= 0 && ((uintptr_t)t->data % dd->size) != 0)
        return td_seterr(err, TD_EUNSUPPORTED,
                         "%s: tensor %s: %s data (data_offsets begin %llu) is not %zu-byte aligned "
                         "in the file; refusing misaligned weights",
                         path, name, dd->name, (unsigned long long)begin, dd->size);
    return 0;
}

static int st_parse_header(td_st_file *f, const char *hdr, size_t hlen, const unsigned char *data,
                           uint64_t data_len, td_err *err) {
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(hdr, hlen, &end, 0);
    if (!root) {
        size_t at = end && end >= hdr && end <= hdr + hlen ? (size_t)(end - hdr) : 0;
        const char *ep = cJSON_GetErrorPtr();
        if (ep && ep >= hdr && ep <= hdr + hlen) at = (size_t)(ep - hdr);
        return td_seterr(err, TD_EFORMAT, "%s: header is not valid JSON (error near byte %zu of %zu)",
                         f->path, at, hlen);
    }
    int rc = 0;
    if (!cJSON_IsObject(root)) {
        rc = td_seterr(err, TD_EFORMAT, "%s: header is not a JSON object", f->path);
        goto out;
    }
    for (const char *p = end; p && p < hdr + hlen; p++) {
        if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r') {
            rc = td_seterr(err, TD_EFORMAT, "%s: header has trailing bytes after the JSON object",
                           f->path);
            goto out;
        }
    }
    int n = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, root) {
        if (!e->string) {
            rc = td_seterr(err, TD_EFORMAT, "%s: header entry without a name", f->path);
            goto out;
        }
        if (strcmp(e->string, "__metadata__") != 0) n++;
    }
    f->tensors = calloc(n ? (size_t)n : 1, sizeof *f->tensors);
    if (!f->tensors) {
        rc = td_seterr(err, TD_ENOMEM, "%s: out of memory for %d tensors", f->path, n);
        goto out;
    }
    cJSON_ArrayForEach(e, root) {
        if (strcmp(e->string, "__metadata__") == 0) continue;
        td_st_tensor *t = &f->tensors[f->n_tensors];
        t->name = strdup(e->string);
        if (!t->name) {
            rc = td_seterr(err, TD_ENOMEM, "%s: out of memory", f->path);
            goto out;
        }
        f->n_tensors++;
        rc = st_parse_entry(t, e, f->path, data, data_len, err);
        if (rc) goto out;
    }
    qsort(f->tensors, (size_t)f->n_tensors, sizeof *f->tensors, st_cmp_name);
    for (int i = 1; i < f->n_tensors; i++) {
        if (strcmp(f->tensors[i - 1].name, f->tensors[i].name) == 0) {
            rc = td_seterr(err, TD_EFORMAT, "%s: tensor %s appears twice in the header", f->path,
                           f->tensors[i].name);
            goto out;
        }
    }
out:
    cJSON_Delete(root);
    return rc;
}

int td_st_open(td_st_file **out, const char *path, td_err *err) {
    if (!out) return td_seterr(err, TD_EINVAL, "td_st_open: out is NULL");
    *out = NULL;
    if (!path) return td_seterr(err, TD_EINVAL, "td_st_open: path is NULL");
    td_st_file *f = calloc(1, sizeof *f);
    if (!f || !(f->path = strdup(path))) {
        free(f);
        return td_seterr(err, TD_ENOMEM, "%s: out of memory", path);
    }
    int rc = 0;
    char *hdr = NULL;
    long long fsize;
    int fd = td_open_regular(path, &fsize, err);
    if (fd < 0) {
        rc = fd;
        goto fail;
    }
    if (fsize < 8) {
        rc = td_seterr(err, TD_EFORMAT, "%s: file is %lld bytes, too short for a safetensors header",
                       path, fsize);
        goto fail;
    }
    if ((unsigned long long)fsize > SIZE_MAX) {
        rc = td_seterr(err, TD_ERANGE, "%s: file too large to map", path);
        goto fail;
    }
    f->map_len = (size_t)fsize;
    f->map = st_map(fd, f->map_len);
    if (f->map == MAP_FAILED) {
        f->map = NULL;
        rc = td_seterr(err, TD_EIO, "%s: mmap failed: %s", path, strerror(errno));
        goto fail;
    }
    close(fd);
    fd = -1;

    const unsigned char *base = f->map;
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | base[i];
    if (hlen > ST_MAX_HEADER) {
        rc = td_seterr(err, TD_EFORMAT, "%s: header length %llu exceeds the 100 MB limit", path,
                       (unsigned long long)hlen);
        goto fail;
    }
    if (hlen > (uint64_t)f->map_len - 8) {
        rc = td_seterr(err, TD_EFORMAT,
                       "%s: header length %llu is past the end of the file (%zu bytes; truncated?)",
                       path, (unsigned long long)hlen, f->map_len);
        goto fail;
    }
    if (hlen < 2) {
        rc = td_seterr(err, TD_EFORMAT, "%s: header length %llu is too short for a JSON object", path,
                       (unsigned long long)hlen);
        goto fail;
    }
    hdr = malloc((size_t)hlen + 1);
    if (!hdr) {
        rc = td_seterr(err, TD_ENOMEM, "%s: out of memory for a %llu-byte header", path,
                       (unsigned long long)hlen);
        goto fail;
    }
    memcpy(hdr, base + 8, (size_t)hlen);
    hdr[hlen] = 0;
    if (memchr(hdr, 0, (size_t)hlen)) {
        rc = td_seterr(err, TD_EFORMAT, "%s: header contains a NUL byte", path);
        goto fail;
    }
    rc = st_parse_header(f, hdr, (size_t)hlen, base + 8 + hlen, (uint64_t)f->map_len - 8 - hlen, err);
    if (rc) goto fail;
    free(hdr);
    st_prefault(f->map, f->map_len);
    *out = f;
    return 0;
fail:
    if (fd >= 0) close(fd);
    free(hdr);
    td_st_free(f);
    return rc;
}

void td_st_release(td_st_file *f) {
    if (f && f->map) madvise(f->map, f->map_len, MADV_DONTNEED);
}

const td_st_tensor *td_st_find(const td_st_file *f, const char *name) {
    if (!f || !name) return NULL;
    int lo = 0, hi = f->n_tensors - 1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2;
        int c = strcmp(name, f->tensors[mid].name);
        if (c == 0) return &f->tensors[mid];
        if (c < 0) hi = mid - 1;
        else lo = mid + 1;
    }
    return NULL;
}
