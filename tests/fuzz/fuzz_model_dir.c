/* fuzz_model_dir — libFuzzer harness for opening a model directory in Hugging
 * Face layout (src/model/model.c, src/model/config.c).
 *
 * Design: at start a temp directory gets the weights of a small valid model
 * (tests/fixtures/qwen3-rand: three safetensors shards, the first two
 * symlinked) and copies of its JSON files and its last shard. The first input
 * byte picks which file the rest of the input replaces (by its value mod 8):
 * 0-4 config.json, 5 generation_config.json, 6 model.safetensors.index.json, 7 the third
 * shard model-00003-of-00003.safetensors (tensors that parse but do not fit
 * the config: names, shapes, dtypes). td_model_open_params then opens the
 * directory (bit 7 of the first byte: copied weights, else mapped); a failure
 * must come with a negative code and a message; a success is described and
 * freed. The replaced file is restored after each run; the directory is
 * removed at exit. Run from the repository root, or set TD_FUZZ_MODEL to the
 * fixture directory. */
#define _GNU_SOURCE
#include "tandem.h"
#include "../slurp.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char dir[256];
#define N_FILES 4
static const char *names[N_FILES] = {"config.json", "generation_config.json", "model.safetensors.index.json",
                                     "model-00003-of-00003.safetensors"};
static char *orig[N_FILES];
static size_t orig_len[N_FILES];

static void put(const char *name, const void *data, size_t n) {
    char p[512];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    FILE *f = fopen(p, "wb");
    if (!f || fwrite(data, 1, n, f) != n || fclose(f)) { perror(p); abort(); }
}

/* the temp directory goes at exit (libFuzzer exits through exit()) */
static void cleanup(void) {
    char p[512];
    for (int i = 0; i < N_FILES; i++) { snprintf(p, sizeof p, "%s/%s", dir, names[i]); unlink(p); }
    for (int s = 1; s <= 2; s++) { snprintf(p, sizeof p, "%s/model-%05d-of-00003.safetensors", dir, s); unlink(p); }
    rmdir(dir);
}

static void setup(void) {
    const char *src = getenv("TD_FUZZ_MODEL");
    if (!src) src = "tests/fixtures/qwen3-rand";
    char real[4096];
    if (!realpath(src, real)) { perror(src); abort(); }
    snprintf(dir, sizeof dir, "/tmp/td-fuzz-model-XXXXXX");
    if (!mkdtemp(dir)) { perror("mkdtemp"); abort(); }
    for (int i = 0; i < N_FILES; i++) {
        char p[4200];
        snprintf(p, sizeof p, "%s/%s", real, names[i]);
        orig[i] = t_slurp(p, &orig_len[i]);
        if (!orig[i]) { perror(p); abort(); }
        put(names[i], orig[i], orig_len[i]);
    }
    for (int s = 1; s <= 2; s++) {
        char from[4200], to[512];
        snprintf(from, sizeof from, "%s/model-%05d-of-00003.safetensors", real, s);
        snprintf(to, sizeof to, "%s/model-%05d-of-00003.safetensors", dir, s);
        if (symlink(from, to)) { perror(to); abort(); }
    }
    atexit(cleanup);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!dir[0]) setup();
    if (size < 1) return 0;
    static const int pick[8] = {0, 0, 0, 0, 0, 1, 2, 3};
    int which = pick[data[0] % 8];
    /* one branch per file: the coverage of a run tells the modes apart, so
       libFuzzer keeps a seed of each (a valid replacement of any file loads the
       same model along the same paths otherwise) */
    switch (which) {
    case 0: put(names[0], data + 1, size - 1); break;
    case 1: put(names[1], data + 1, size - 1); break;
    case 2: put(names[2], data + 1, size - 1); break;
    default: put(names[3], data + 1, size - 1); break;
    }

    td_model *m = NULL;
    td_err err = {0};
    td_model_params mp = td_model_default_params();
    mp.use_mmap = (data[0] & 0x80) ? 0 : 1;
    int rc = td_model_open_params(&m, dir, &mp, &err);
    if (rc) {
        if (m || rc > 0 || !err.msg[0]) abort();
    } else {
        td_model_info info;
        td_model_get_info(m, &info);
        FILE *devnull = fopen("/dev/null", "w");
        if (devnull) { td_model_describe(m, devnull); fclose(devnull); }
        td_model_free(m);
    }
    put(names[which], orig[which], orig_len[which]);
    return 0;
}
