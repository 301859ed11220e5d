/* tandem CLI — `tandem run`, `tandem inspect`. Uses only include/tandem.h.
 * Each command parses its own options, prints --help, reports errors on stderr
 * and exits non-zero; text streams to stdout, timings go to stderr. */
#define _GNU_SOURCE
#include "tandem.h"

#include <errno.h>
#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *default_model_dir(void) {
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

static int die(const char *what, const td_err *e) {
    fprintf(stderr, "tandem: %s: %s\n", what, e && e->msg[0] ? e->msg : "failed");
    return 1;
}

/* ---- option parsing helpers ---- */
static int need_arg(int i, int argc, const char *opt) {
    if (i + 1 >= argc) { fprintf(stderr, "tandem: option %s needs a value\n", opt); return 0; }
    return 1;
}
static int parse_int(const char *s, const char *opt, long lo, long hi, long *out) {
    char *end; errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || *end || end == s || v < lo || v > hi) {
        fprintf(stderr, "tandem: %s: '%s' is not an integer in [%ld, %ld]\n", opt, s, lo, hi);
        return 0;
    }
    *out = v; return 1;
}
static int parse_float(const char *s, const char *opt, double lo, double hi, double *out) {
    char *end; errno = 0;
    double v = strtod(s, &end);
    if (errno || *end || end == s || !(v >= lo && v <= hi)) {
        fprintf(stderr, "tandem: %s: '%s' is not a number in [%g, %g]\n", opt, s, lo, hi);
        return 0;
    }
    *out = v; return 1;
}

static void run_help(void) {
    printf("usage: tandem run [-m DIR] (-p TEXT | -f FILE) [options]\n"
           "Generate text with a model, streaming it to stdout; timings go to stderr.\n\n"
           "  -m, --model DIR        model directory (Hugging Face layout); default: the bundled model\n"
           "  -p, --prompt TEXT      prompt text\n"
           "  -f, --file FILE        read the prompt from FILE\n"
           "  -n, --n-predict N      new tokens at most (default 128)\n"
           "      --chat             wrap the prompt as a user message in the model's chat template\n"
           "      --system TEXT      system message for --chat\n"
           "      --temp T           temperature (default 0 = greedy)\n"
           "      --seed S           seed of the counter-based sampler (default 0)\n"
           "      --top-k K          keep the K most likely tokens (0 = off)\n"
           "      --top-p P          nucleus sampling (1 = off)\n"
           "      --min-p P          min-p filter (0 = off)\n"
           "      --repeat-penalty R CTRL repetition penalty (1 = off)\n"
           "      --presence-penalty P, --frequency-penalty F   OpenAI-style penalties\n"
           "      --stop STR         stop at STR (repeatable)\n"
           "      --ignore-eos       keep going past end-of-sequence tokens\n"
           "      --ctx N            KV positions (default: the model's, at most 4096)\n"
           "  -t, --threads N        threads (default: all online CPUs)\n"
           "      --ids              also print the generated token ids to stderr\n"
           "  -h, --help             this help\n");
}

static int print_cb(const char *text, size_t len, void *user) {
    (void)user;
    fwrite(text, 1, len, stdout);
    fflush(stdout);
    return 0;
}

static int cmd_run(int argc, char **argv) {
    const char *model_dir = NULL, *prompt = NULL, *file = NULL, *system_msg = NULL;
    const char *stops[16];
    int n_stop = 0, chat = 0, print_ids = 0;
    long n_predict = 128, ctx_n = 0, threads = 0;
    td_gen_params gp = {.sampling = td_sampling_default(), .max_tokens = 128};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        long lv; double dv;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { run_help(); return 0; }
        else if (!strcmp(a, "-m") || !strcmp(a, "--model")) { if (!need_arg(i, argc, a)) return 2; model_dir = argv[++i]; }
        else if (!strcmp(a, "-p") || !strcmp(a, "--prompt")) { if (!need_arg(i, argc, a)) return 2; prompt = argv[++i]; }
        else if (!strcmp(a, "-f") || !strcmp(a, "--file")) { if (!need_arg(i, argc, a)) return 2; file = argv[++i]; }
        else if (!strcmp(a, "-n") || !strcmp(a, "--n-predict")) { if (!need_arg(i, argc, a) || !parse_int(argv[++i], a, 0, 1 << 24, &n_predict)) return 2; }
        else if (!strcmp(a, "--chat")) chat = 1;
        else if (!strcmp(a, "--system")) { if (!need_arg(i, argc, a)) return 2; system_msg = argv[++i]; }
        else if (!strcmp(a, "--temp")) { if (!need_arg(i, argc, a) || !parse_float(argv[++i], a, 0, 100, &dv)) return 2; gp.sampling.temperature = (float)dv; }
        else if (!strcmp(a, "--seed")) { if (!need_arg(i, argc, a)) return 2; char *e; errno = 0; unsigned long long s = strtoull(argv[++i], &e, 10); if (errno || *e) { fprintf(stderr, "tandem: --seed: '%s' is not an unsigned integer\n", argv[i]); return 2; } gp.sampling.seed = s; }
        else if (!strcmp(a, "--top-k")) { if (!need_arg(i, argc, a) || !parse_int(argv[++i], a, 0, 1 << 24, &lv)) return 2; gp.sampling.top_k = (int)lv; }
        else if (!strcmp(a, "--top-p")) { if (!need_arg(i, argc, a) || !parse_float(argv[++i], a, 1e-6, 1, &dv)) return 2; gp.sampling.top_p = (float)dv; }
        else if (!strcmp(a, "--min-p")) { if (!need_arg(i, argc, a) || !parse_float(argv[++i], a, 0, 1, &dv)) return 2; gp.sampling.min_p = (float)dv; }
        else if (!strcmp(a, "--repeat-penalty")) { if (!need_arg(i, argc, a) || !parse_float(argv[++i], a, 0.01, 100, &dv)) return 2; gp.sampling.repeat_penalty = (float)dv; }
        else if (!strcmp(a, "--presence-penalty")) { if (!need_arg(i, argc, a) || !parse_float(argv[++i], a, -2, 2, &dv)) return 2; gp.sampling.presence_penalty = (float)dv; }
        else if (!strcmp(a, "--frequency-penalty")) { if (!need_arg(i, argc, a) || !parse_float(argv[++i], a, -2, 2, &dv)) return 2; gp.sampling.frequency_penalty = (float)dv; }
        else if (!strcmp(a, "--stop")) { if (!need_arg(i, argc, a)) return 2; if (n_stop == 16) { fprintf(stderr, "tandem: at most 16 --stop strings\n"); return 2; } stops[n_stop++] = argv[++i]; }
        else if (!strcmp(a, "--ignore-eos")) gp.ignore_eos = 1;
        else if (!strcmp(a, "--ids")) print_ids = 1;
        else if (!strcmp(a, "--ctx")) { if (!need_arg(i, argc, a) || !parse_int(argv[++i], a, 1, 1 << 22, &ctx_n)) return 2; }
        else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) { if (!need_arg(i, argc, a) || !parse_int(argv[++i], a, 1, 256, &threads)) return 2; }
        else { fprintf(stderr, "tandem run: unknown option '%s' (see --help)\n", a); return 2; }
    }
    if (!prompt && !file) { fprintf(stderr, "tandem run: give a prompt with -p TEXT or -f FILE (see --help)\n"); return 2; }
    gp.max_tokens = (int)n_predict;
    gp.stop = stops;
    gp.n_stop = n_stop;
    if (!model_dir) model_dir = default_model_dir();

    td_err err = {0};
    char *file_text = NULL;
    if (file) {
        FILE *f = fopen(file, "rb");
        if (!f) { fprintf(stderr, "tandem: %s: %s\n", file, strerror(errno)); return 1; }
        size_t cap = 1 << 16, len = 0;
        file_text = malloc(cap);
        size_t got;
        while (file_text && (got = fread(file_text + len, 1, cap - len - 1, f)) > 0) {
            len += got;
            if (len + 1 == cap) { char *nb = realloc(file_text, cap * 2); if (!nb) { free(file_text); file_text = NULL; break; } file_text = nb; cap *= 2; }
        }
        fclose(f);
        if (!file_text) { fprintf(stderr, "tandem: out of memory reading %s\n", file); return 1; }
        file_text[len] = 0;
        prompt = file_text;
    }
    td_model *m = NULL;
    if (td_model_open(&m, model_dir, &err) != 0) { free(file_text); return die(model_dir, &err); }
    const td_tokenizer *tok = td_model_tokenizer(m);
    int rc = 1;
    td_ctx *c = NULL;
    int32_t *ids = NULL;
    char *rendered = NULL;
    if (!tok) { fprintf(stderr, "tandem: %s has no tokenizer.json\n", model_dir); goto out; }
    const char *text = prompt;
    int flags = 0;
    if (chat) {
        td_chat_style style = td_tokenizer_chat_style(tok);
        if (style == TD_CHAT_NONE) { fprintf(stderr, "tandem: --chat: the model's tokenizer_config.json has no chat template tandem knows\n"); goto out; }
        td_chat_msg msgs[2];
        int nm = 0;
        if (system_msg) msgs[nm++] = (td_chat_msg){"system", system_msg};
        msgs[nm++] = (td_chat_msg){"user", prompt};
        int need = td_chat_render(style, msgs, nm, 1, NULL, 0);
        if (need < 0 || !(rendered = malloc((size_t)need + 1))) { fprintf(stderr, "tandem: cannot render the chat template\n"); goto out; }
        td_chat_render(style, msgs, nm, 1, rendered, (size_t)need + 1);
        text = rendered;
        flags = TD_TOK_PARSE_SPECIAL;
    }
    int n = td_tokenize(tok, text, strlen(text), flags, NULL, 0);
    if (n < 0) { fprintf(stderr, "tandem: tokenizing the prompt failed: %s\n", td_strerror(n)); goto out; }
    if (n == 0) { fprintf(stderr, "tandem: the prompt is empty: give at least one token of text\n"); goto out; }
    ids = malloc(sizeof(int32_t) * (size_t)n);
    if (!ids) goto out;
    td_tokenize(tok, text, strlen(text), flags, ids, n);
    td_ctx_params cp = td_ctx_default_params();
    cp.max_ctx = (int)ctx_n;
    cp.n_threads = (int)threads;
    if (td_ctx_open(&c, m, &cp, &err) != 0) { die("context", &err); goto out; }
    cp = td_ctx_get_params(c);
    if (n + gp.max_tokens > cp.max_ctx) {
        if (n >= cp.max_ctx) { fprintf(stderr, "tandem: prompt of %d tokens does not fit the context of %d\n", n, cp.max_ctx); goto out; }
        gp.max_tokens = cp.max_ctx - n;
    }
    int32_t *out_ids = malloc(sizeof(int32_t) * (size_t)(gp.max_tokens + 1));
    if (!out_ids) goto out;
    if (!chat) { fputs(prompt, stdout); fflush(stdout); }
    td_gen_stats st;
    if (td_generate(c, m, ids, n, &gp, print_cb, NULL, out_ids, gp.max_tokens, &st, &err) != 0) {
        free(out_ids);
        die("generation", &err);
        goto out;
    }
    printf("\n");
    if (print_ids) {
        fprintf(stderr, "ids:");
        for (int i = 0; i < st.n_gen; i++) fprintf(stderr, " %d", out_ids[i]);
        fprintf(stderr, "\n");
    }
    free(out_ids);
    fprintf(stderr, "prefill: %d tokens in %.3f s (%.1f tok/s); decode: %d tokens in %.3f s (%.1f tok/s)\n",
            st.n_prompt, st.prefill_s, st.prefill_s > 0 ? st.n_prompt / st.prefill_s : 0.0,
            st.n_gen, st.decode_s, st.decode_s > 0 ? st.n_gen / st.decode_s : 0.0);
    rc = 0;
out:
    free(rendered);
    free(ids);
    free(file_text);
    td_ctx_free(c);
    td_model_free(m);
    return rc;
}

static int cmd_inspect(int argc, char **argv) {
    const char *dir = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            printf("usage: tandem inspect [DIR]\nPrint a model directory's config, tensor count, bytes and dtypes.\n"
                   "Without DIR: the bundled model.\n");
            return 0;
        }
        if (argv[i][0] == '-') { fprintf(stderr, "tandem inspect: unknown option '%s'\n", argv[i]); return 2; }
        if (dir) { fprintf(stderr, "tandem inspect: one directory at a time\n"); return 2; }
        dir = argv[i];
    }
    if (!dir) dir = default_model_dir();
    td_err err = {0};
    td_model *m = NULL;
    if (td_model_open(&m, dir, &err) != 0) return die(dir, &err);
    td_model_describe(m, stdout);
    td_model_free(m);
    return 0;
}

static void main_help(void) {
    printf("tandem — LLM inference with exact speculative decoding\n\n"
           "usage: tandem COMMAND [options]   (tandem COMMAND --help for each)\n\n"
           "commands:\n"
           "  run       generate text from a prompt\n"
           "  inspect   describe a model directory\n");
}

int main(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "help")) {
        main_help();
        return argc < 2 ? 2 : 0;
    }
    if (!strcmp(argv[1], "run")) return cmd_run(argc - 1, argv + 1);
    if (!strcmp(argv[1], "inspect")) return cmd_inspect(argc - 1, argv + 1);
    fprintf(stderr, "tandem: unknown command '%s' (see tandem --help)\n", argv[1]);
    return 2;
}
