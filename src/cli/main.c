/* tandem CLI — `tandem run`, `tandem inspect`, `tandem bench`. Uses only
 * include/tandem.h. Each command parses its own options, prints --help,
 * reports errors on stderr and exits non-zero; generated text streams to
 * stdout, timings and statistics go to stderr. `run` decodes through the
 * speculative group (with drafter "none" it is plain decoding). */
#define _GNU_SOURCE
#include "cli/cli.h"
#include "server/server.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void run_help(void) {
    printf("usage: tandem run [-m DIR] (-p TEXT | -f FILE) [options]\n"
           "Generate text with a model, streaming it to stdout; timings and speculative\n"
           "statistics go to stderr.\n\n"
           "  -p, --prompt TEXT      prompt text\n"
           "  -f, --file FILE        read the prompt from FILE\n"
           "      --chat             wrap the prompt as a user message in the model's chat template\n"
           "      --system TEXT      system message for --chat\n"
           "      --ids              also print the generated token ids to stderr\n"
           "  -h, --help             this help\n");
    cli_gen_opts_help();
}

static char *read_text_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) { fprintf(stderr, "tandem: %s: %s\n", path, strerror(errno)); return NULL; }
    size_t cap = 1 << 16, len = 0, got;
    char *buf = malloc(cap);
    while (buf && (got = fread(buf + len, 1, cap - len - 1, f)) > 0) {
        len += got;
        if (len + 1 == cap) {
            char *nb = realloc(buf, cap * 2);
            if (!nb) { free(buf); buf = NULL; break; }
            buf = nb;
            cap *= 2;
        }
    }
    fclose(f);
    if (!buf) { fprintf(stderr, "tandem: out of memory reading %s\n", path); return NULL; }
    buf[len] = 0;
    return buf;
}

static void print_stats(const char *drafter, const td_spec_stats *st) {
    fprintf(stderr, "speculative: drafter %s, rounds %ld, drafted %ld, accepted %ld (%.1f%%), mean accepted %.2f, tokens/round %.2f\n",
            drafter, st->rounds, st->drafted, st->accepted, st->drafted ? 100.0 * st->accepted / st->drafted : 0.0,
            td_spec_stats_mean_accepted(st), st->rounds ? (double)st->emitted / st->rounds : 0.0);
    if (st->drafted) {
        fprintf(stderr, "acceptance by position:");
        for (int j = 0; j < TD_SPEC_MAX_DEPTH && st->drafted_at[j]; j++)
            fprintf(stderr, " %d:%.2f", j + 1, (double)st->accepted_at[j] / st->drafted_at[j]);
        fprintf(stderr, "\n");
    }
    fprintf(stderr, "time: draft %.3f s, verify %.3f s, accept %.3f s, prefill %.3f s\n",
            st->t_draft, st->t_verify, st->t_accept, st->t_prefill);
}

static int cmd_run(int argc, char **argv) {
    const char *prompt = NULL, *file = NULL, *system_msg = NULL;
    int chat = 0, print_ids = 0;
    cli_gen_opts o;
    cli_gen_opts_init(&o);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int r = cli_gen_opt(&o, argc, argv, &i);
        if (r < 0) return 2;
        if (r > 0) continue;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { run_help(); return 0; }
        else if (!strcmp(a, "-p") || !strcmp(a, "--prompt")) { if (!cli_need_arg(i, argc, a)) return 2; prompt = argv[++i]; }
        else if (!strcmp(a, "-f") || !strcmp(a, "--file")) { if (!cli_need_arg(i, argc, a)) return 2; file = argv[++i]; }
        else if (!strcmp(a, "--chat")) chat = 1;
        else if (!strcmp(a, "--system")) { if (!cli_need_arg(i, argc, a)) return 2; system_msg = argv[++i]; }
        else if (!strcmp(a, "--ids")) print_ids = 1;
        else { fprintf(stderr, "tandem run: unknown option '%s' (see --help)\n", a); return 2; }
    }
    if (!prompt && !file) { fprintf(stderr, "tandem run: give a prompt with -p TEXT or -f FILE (see --help)\n"); return 2; }
    int bundled = o.model_dir == NULL;
    if (!o.model_dir) o.model_dir = cli_default_model_dir();
    if (!o.draft) o.draft = bundled ? cli_default_drafter(o.model_dir) : "none";

    td_err err = {0};
    char *file_text = NULL;
    if (file && !(prompt = file_text = read_text_file(file))) return 1;
    td_model *m = NULL;
    if (td_model_open_params(&m, o.model_dir, &o.mp, &err) != 0) { free(file_text); return cli_die(o.model_dir, &err); }
    const td_tokenizer *tok = td_model_tokenizer(m);
    int rc = 1;
    td_ctx *c = NULL;
    td_drafter *d = NULL;
    td_spec *g = NULL;
    int32_t *ids = NULL, *out_ids = NULL;
    char *rendered = NULL;
    if (!tok) { fprintf(stderr, "tandem: %s has no tokenizer.json\n", o.model_dir); goto out; }
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
    if (!(ids = malloc(sizeof(int32_t) * (size_t)n))) goto out;
    td_tokenize(tok, text, strlen(text), flags, ids, n);

    if (td_drafter_open(&d, o.draft, m, &err) != 0) { cli_die("--draft", &err); goto out; }
    td_ctx_params cp = td_ctx_default_params();
    cp.max_rows = 2; /* the row, and a spare for measuring verify cost */
    cp.max_ctx = (int)o.ctx;
    cp.n_threads = (int)o.threads;
    cp.kv_type = cli_kv_type(o.kv_type, o.act_type);
    cp.act_type = o.act_type;
    if (td_ctx_open(&c, m, &cp, &err) != 0) { cli_die("context", &err); goto out; }
    cp = td_ctx_get_params(c);
    if (n >= cp.max_ctx) { fprintf(stderr, "tandem: prompt of %d tokens does not fit the context of %d\n", n, cp.max_ctx); goto out; }
    if (n + o.gp.max_tokens > cp.max_ctx) o.gp.max_tokens = cp.max_ctx - n;
    td_spec_params sp = td_spec_default_params();
    sp.max_depth = d ? o.depth : 0;
    sp.fixed_depth = o.fixed_depth;
    sp.accept = o.accept;
    if (td_spec_open(&g, c, m, d, &sp, &err) != 0) { cli_die("speculative group", &err); goto out; }
    int id;
    if (td_spec_add(g, ids, n, &o.gp, 1, &id, &err) != 0) { cli_die("prompt", &err); goto out; }
    if (!(out_ids = malloc(sizeof(int32_t) * (size_t)(o.gp.max_tokens + 1)))) goto out;
    if (!chat) { fputs(prompt, stdout); fflush(stdout); }
    int n_out = 0, done = 0;
    char buf[4096];
    double t0 = 0, t_first = 0;
    t0 = cli_now();
    while (!done) {
        int live = td_spec_step(g, &err);
        if (live < 0) { cli_die("generation", &err); goto out; }
        if (!t_first) t_first = cli_now();
        for (;;) {
            size_t nt = 0;
            int k = td_spec_take(g, id, out_ids + n_out, NULL, o.gp.max_tokens + 1 - n_out, buf, sizeof buf, &nt, &done);
            if (k < 0) goto out;
            n_out += k;
            fwrite(buf, 1, nt, stdout);
            if (nt < sizeof buf) break;
        }
        fflush(stdout);
    }
    double t_end = cli_now();
    printf("\n");
    fflush(stdout);
    if (print_ids) {
        fprintf(stderr, "ids:");
        for (int i = 0; i < n_out; i++) fprintf(stderr, " %d", out_ids[i]);
        fprintf(stderr, "\n");
    }
    td_spec_stats st;
    td_spec_stats_get(g, -1, &st);
    double dec = t_end - t0 - st.t_prefill;
    fprintf(stderr, "prefill: %d tokens in %.3f s (%.1f tok/s); decode: %d tokens in %.3f s (%.1f tok/s)\n",
            n, st.t_prefill, st.t_prefill > 0 ? n / st.t_prefill : 0.0, n_out, dec, dec > 0 ? n_out / dec : 0.0);
    if (d) print_stats(td_drafter_id(d), &st);
    rc = 0;
out:
    free(rendered);
    free(ids);
    free(out_ids);
    free(file_text);
    td_spec_free(g);
    td_ctx_free(c);
    td_drafter_free(d);
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
    if (!dir) dir = cli_default_model_dir();
    td_err err = {0};
    td_model *m = NULL;
    td_model_params mp = {.use_mmap = 1}; /* describing reads no weights: no copy */
    if (td_model_open_params(&m, dir, &mp, &err) != 0) return cli_die(dir, &err);
    td_model_describe(m, stdout);
    td_model_free(m);
    return 0;
}

static void main_help(void) {
    printf("tandem — LLM inference with exact speculative decoding\n\n"
           "usage: tandem COMMAND [options]   (tandem COMMAND --help for each)\n\n"
           "commands:\n"
           "  run       generate text from a prompt\n"
           "  inspect   describe a model directory\n"
           "  quantize  write a model as a GGUF file (llama.cpp's layout)\n"
           "  bench     benchmarks (bench spec: plain vs speculative decoding)\n"
           "  serve     OpenAI-compatible HTTP server (continuous batching, speculation per request)\n");
}

int main(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "help")) {
        main_help();
        return argc < 2 ? 2 : 0;
    }
    if (!strcmp(argv[1], "run")) return cmd_run(argc - 1, argv + 1);
    if (!strcmp(argv[1], "inspect")) return cmd_inspect(argc - 1, argv + 1);
    if (!strcmp(argv[1], "bench")) return cmd_bench(argc - 1, argv + 1);
    if (!strcmp(argv[1], "quantize")) return cmd_quantize(argc - 1, argv + 1);
    if (!strcmp(argv[1], "serve")) return td_serve_main(argc - 1, argv + 1);
    fprintf(stderr, "tandem: unknown command '%s' (see tandem --help)\n", argv[1]);
    return 2;
}
