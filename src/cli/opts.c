/* opts — shared CLI option parsing (see cli.h). */
#define _GNU_SOURCE
#include "cli/cli.h"

#include <errno.h>
#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

double cli_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

const char *cli_default_model_dir(void) {
    static char path[PATH_MAX];
    const char *env = getenv("TANDEM_MODEL");
    if (env && *env) return env;
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = 0;
        char *d = dirname(exe); /* .../build or .../build/san */
        for (int up = 0; up < 3; up++) {
            snprintf(path, sizeof path, "%s/models/tiny-code/target", d);
            if (access(path, R_OK) == 0) return path;
            d = dirname(d);
        }
    }
    return "models/tiny-code/target";
}

const char *cli_default_drafter(const char *model_dir) {
    static char spec[PATH_MAX + 16];
    char tmp[PATH_MAX];
    snprintf(tmp, sizeof tmp, "%s", model_dir);
    const char *fam = dirname(tmp);
    /* drafting over the 1,024 ids the target emits most plus each row's context
     * ids, prompt lookup first (offered to the planner at no draft cost). The
     * draft model's matrices stay bf16: with quant=q8_0 batch 1 measured the
     * same and batch 8 about 6% slower (bench/results/spec.jsonl) */
    snprintf(spec, sizeof spec, "model:%s/draft,vocab=1024,lookup=3", fam);
    char cfg[PATH_MAX + 32];
    snprintf(cfg, sizeof cfg, "%s/draft/config.json", fam);
    return access(cfg, R_OK) == 0 ? spec : "none";
}

int cli_die(const char *what, const td_err *e) {
    fprintf(stderr, "tandem: %s: %s\n", what, e && e->msg[0] ? e->msg : "failed");
    return 1;
}

int cli_need_arg(int i, int argc, const char *opt) {
    if (i + 1 >= argc) { fprintf(stderr, "tandem: option %s needs a value\n", opt); return 0; }
    return 1;
}

int cli_parse_int(const char *s, const char *opt, long lo, long hi, long *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || *end || end == s || v < lo || v > hi) {
        fprintf(stderr, "tandem: %s: '%s' is not an integer in [%ld, %ld]\n", opt, s, lo, hi);
        return 0;
    }
    *out = v;
    return 1;
}

int cli_parse_float(const char *s, const char *opt, double lo, double hi, double *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || *end || end == s || !(v >= lo && v <= hi)) {
        fprintf(stderr, "tandem: %s: '%s' is not a number in [%g, %g]\n", opt, s, lo, hi);
        return 0;
    }
    *out = v;
    return 1;
}

/* a type name through parse (-1: not one) into *out, else a message naming the choices */
static int parse_type(const char *s, const char *opt, int (*parse)(const char *), const char *choices, int *out) {
    int t = parse(s);
    if (t < 0) {
        fprintf(stderr, "tandem: %s: '%s' is not %s\n", opt, s, choices);
        return 0;
    }
    *out = t;
    return 1;
}
static int kv_type_parse(const char *s) { return s && !strcmp(s, "auto") ? CLI_KV_AUTO : td_kv_type_parse(s); }
int cli_parse_kv_type(const char *s, const char *opt, int *out) {
    int t = kv_type_parse(s);
    if (t == -1) {
        fprintf(stderr, "tandem: %s: '%s' is not auto, f32, bf16, f16 or q8_0\n", opt, s);
        return 0;
    }
    *out = t;
    return 1;
}
int cli_kv_type(int kv, int act) {
    if (kv != CLI_KV_AUTO) return kv;
    /* bf16 K/V under act bf16 takes the A32 order, which only AVX-512 BF16 runs fast: elsewhere (AVX2)
       it is the C emulation, 3x the time of an f32 cache (bench/forward-notes.md, "Stop 49") */
    if (act == TD_ACT_AMX || (act == TD_DTYPE_BF16 && td_act_type_parse("auto") != TD_DTYPE_F32)) return TD_DTYPE_BF16;
    return TD_DTYPE_F32;
}
int cli_parse_act_type(const char *s, const char *opt, int *out) { return parse_type(s, opt, td_act_type_parse, "f32, bf16, amx or auto", out); }

void cli_gen_opts_init(cli_gen_opts *o) {
    memset(o, 0, sizeof *o);
    o->kv_type = CLI_KV_AUTO;
    o->mp = td_model_default_params();
    o->act_type = td_ctx_default_params().act_type;
    o->depth = 8;
    o->accept = TD_ACCEPT_MATCH;
    o->gp.sampling = td_sampling_default();
    o->gp.max_tokens = 128;
    o->gp.stop = o->stops;
}

void cli_gen_opts_help(void) {
    printf("  -m, --model DIR        model directory (Hugging Face layout); default: the bundled model\n"
           "  -n, --n-predict N      new tokens at most (default 128)\n"
           "      --draft SPEC       none | ngram[:MIN-MAX] | model:DIR[,vocab=N][,quant=q8_0|q4_0][,lookup=N]\n"
           "                         | mtp:DIR[,vocab=N][,quant=...][,lookup=N]\n"
           "                         | block:DIR[,prune=on|off][,vocab=N][,quant=...][,lookup=N]\n"
           "                         (default: the bundled draft model with the bundled target, else none)\n"
           "      --draft-depth N    most draft tokens per round, 0..16 (default 8; 0 = plain decoding)\n"
           "      --fixed-depth      always draft --draft-depth tokens (no depth controller)\n"
           "      --accept RULE      match (exact, default) | rejection (speculative sampling)\n"
           "      --temp T           temperature (default 0 = greedy)\n"
           "      --seed S           seed of the counter-based sampler (default 0)\n"
           "      --top-k K          keep the K most likely tokens (0 = off)\n"
           "      --top-p P          nucleus sampling (1 = off)\n"
           "      --min-p P          min-p filter (0 = off)\n"
           "      --repeat-penalty R CTRL repetition penalty (1 = off)\n"
           "      --presence-penalty P, --frequency-penalty F   OpenAI-style penalties\n"
           "      --stop STR         stop at STR (repeatable, at most 16)\n"
           "      --ignore-eos       keep going past end-of-sequence tokens\n"
           "      --ctx N            KV positions per row (default: the model's, at most 4096)\n"
           "      --kv-type T        KV cache storage: auto (default: bf16 under --act-type amx, and under\n"
           "                         bf16 on CPUs with AVX-512 BF16; else f32) | f32 | bf16 | f16\n"
           "                         (half the bytes) | q8_0 (blocks of 32 int8 and a scale: 0.53x\n"
           "                         bf16's bytes); a model drafter's cache follows it\n"
           "      --act-type T       activations entering bf16-weight products: f32 (default) |\n"
           "                         bf16 (rounded to bf16, bf16 dot products: faster, logits move\n"
           "                         by ~1e-2 relative; Q8_0 in the R16 order over a repacked copy;\n"
           "                         a model drafter follows it) | amx (bf16 on\n"
           "                         Intel AMX tiles, where the CPU has them: bits are the CPU's;\n"
           "                         Q8_0 weights repacked for 16-output VNNI products) | auto (amx\n"
           "                         where the CPU has the tiles, else bf16 where it has AVX-512\n"
           "                         BF16, else f32)\n"
           "  -t, --threads N        threads (default: physical cores)\n"
           CLI_MMAP_HELP);
}

int cli_gen_opt(cli_gen_opts *o, int argc, char **argv, int *ip) {
    int i = *ip;
    const char *a = argv[i];
    long lv;
    double dv;
    td_sampling *s = &o->gp.sampling;
#define VAL() do { if (!cli_need_arg(i, argc, a)) return -1; *ip = ++i; } while (0)
    if (!strcmp(a, "-m") || !strcmp(a, "--model")) { VAL(); o->model_dir = argv[i]; }
    else if (!strcmp(a, "-n") || !strcmp(a, "--n-predict")) { VAL(); if (!cli_parse_int(argv[i], a, 0, 1 << 24, &lv)) return -1; o->gp.max_tokens = (int)lv; }
    else if (!strcmp(a, "--draft")) { VAL(); o->draft = argv[i]; }
    else if (!strcmp(a, "--draft-depth")) { VAL(); if (!cli_parse_int(argv[i], a, 0, TD_SPEC_MAX_DEPTH, &lv)) return -1; o->depth = (int)lv; }
    else if (!strcmp(a, "--fixed-depth")) o->fixed_depth = 1;
    else if (!strcmp(a, "--accept")) {
        VAL();
        if (!strcmp(argv[i], "match")) o->accept = TD_ACCEPT_MATCH;
        else if (!strcmp(argv[i], "rejection")) o->accept = TD_ACCEPT_REJECTION;
        else { fprintf(stderr, "tandem: --accept: '%s' is not match or rejection\n", argv[i]); return -1; }
    }
    else if (!strcmp(a, "--temp")) { VAL(); if (!cli_parse_float(argv[i], a, 0, 100, &dv)) return -1; s->temperature = (float)dv; }
    else if (!strcmp(a, "--seed")) {
        VAL();
        char *e;
        errno = 0;
        unsigned long long v = strtoull(argv[i], &e, 10);
        if (errno || *e || e == argv[i] || argv[i][0] == '-') { fprintf(stderr, "tandem: --seed: '%s' is not an unsigned integer\n", argv[i]); return -1; }
        s->seed = v;
    }
    else if (!strcmp(a, "--top-k")) { VAL(); if (!cli_parse_int(argv[i], a, 0, 1 << 24, &lv)) return -1; s->top_k = (int)lv; }
    else if (!strcmp(a, "--top-p")) { VAL(); if (!cli_parse_float(argv[i], a, 1e-6, 1, &dv)) return -1; s->top_p = (float)dv; }
    else if (!strcmp(a, "--min-p")) { VAL(); if (!cli_parse_float(argv[i], a, 0, 1, &dv)) return -1; s->min_p = (float)dv; }
    else if (!strcmp(a, "--repeat-penalty")) { VAL(); if (!cli_parse_float(argv[i], a, 0.01, 100, &dv)) return -1; s->repeat_penalty = (float)dv; }
    else if (!strcmp(a, "--presence-penalty")) { VAL(); if (!cli_parse_float(argv[i], a, -2, 2, &dv)) return -1; s->presence_penalty = (float)dv; }
    else if (!strcmp(a, "--frequency-penalty")) { VAL(); if (!cli_parse_float(argv[i], a, -2, 2, &dv)) return -1; s->frequency_penalty = (float)dv; }
    else if (!strcmp(a, "--stop")) {
        VAL();
        if (o->gp.n_stop == 16) { fprintf(stderr, "tandem: at most 16 --stop strings\n"); return -1; }
        o->stops[o->gp.n_stop++] = argv[i];
    }
    else if (!strcmp(a, "--ignore-eos")) o->gp.ignore_eos = 1;
    else if (!strcmp(a, "--kv-type")) { VAL(); if (!cli_parse_kv_type(argv[i], a, &o->kv_type)) return -1; }
    else if (!strcmp(a, "--no-mmap")) o->mp.use_mmap = 0;
    else if (!strcmp(a, "--mmap")) o->mp.use_mmap = 1;
    else if (!strcmp(a, "--act-type")) { VAL(); if (!cli_parse_act_type(argv[i], a, &o->act_type)) return -1; }
    else if (!strcmp(a, "--ctx")) { VAL(); if (!cli_parse_int(argv[i], a, 1, 1 << 22, &lv)) return -1; o->ctx = lv; }
    else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) { VAL(); if (!cli_parse_int(argv[i], a, 1, 256, &lv)) return -1; o->threads = lv; }
    else return 0;
#undef VAL
    return 1;
}
