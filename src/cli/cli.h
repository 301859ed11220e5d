/* cli — helpers shared by the tandem subcommands: option parsing with clear
 * messages, the bundled model's location, and the options every generating
 * command accepts (sampling, drafter, depth). Uses only include/tandem.h. */
#ifndef TD_CLI_H
#define TD_CLI_H

#include "tandem.h"

/* The bundled default model directory (TANDEM_MODEL overrides), and its
 * default drafter spec ("model:<family>/draft" when present, else "none"). */
const char *cli_default_model_dir(void);
const char *cli_default_drafter(const char *model_dir);

/* Monotonic seconds. */
double cli_now(void);

int cli_die(const char *what, const td_err *e);
int cli_need_arg(int i, int argc, const char *opt);
int cli_parse_int(const char *s, const char *opt, long lo, long hi, long *out);
int cli_parse_float(const char *s, const char *opt, double lo, double hi, double *out);
/* --kv-type's value: auto | f32 | bf16 | f16 -> CLI_KV_AUTO or TD_DTYPE_* in
 * *out; 0 (message printed) for anything else. Every subcommand parses it
 * here, and resolves auto with cli_kv_type once the act type is known. */
#define CLI_KV_AUTO (-2)
int cli_parse_kv_type(const char *s, const char *opt, int *out);
/* The cache type kv (from cli_parse_kv_type) for activations act: auto is bf16
 * under act amx (with bf16 K/V the target's attention runs on the AMX tiles: the
 * fastest configuration there) and under act bf16 where the CPU has AVX-512 BF16
 * (half the bytes to read: bench/forward-notes.md), and f32 otherwise (the cache
 * that matches transformers closest; on AVX2 a bf16 cache's attention is the C
 * emulation of the A32 order). */
int cli_kv_type(int kv, int act);
/* --act-type's value: f32 | bf16 -> TD_DTYPE_* in *out; 0 (message printed)
 * for anything else. */
int cli_parse_act_type(const char *s, const char *opt, int *out);

/* Options shared by run, bench and serve. */
typedef struct cli_gen_opts {
    const char *model_dir;
    const char *draft;        /* drafter spec, NULL = default */
    int depth;                /* max draft depth */
    int fixed_depth;          /* 1 = no depth controller */
    td_accept_rule accept;
    long threads, ctx;
    int kv_type;              /* --kv-type: CLI_KV_AUTO (default) or td_ctx_params.kv_type */
    td_model_params mp;       /* --no-mmap / --mmap (default: td_model_default_params()) */
    int act_type;             /* td_ctx_params.act_type (default: td_ctx_default_params()'s) */
    td_gen_params gp;
    const char *stops[16];
} cli_gen_opts;

void cli_gen_opts_init(cli_gen_opts *o);
/* Try to consume argv[*i] (and its value) as a shared option. Returns 1 when
 * consumed, 0 when not a shared option, -1 on a bad value (message printed). */
int cli_gen_opt(cli_gen_opts *o, int argc, char **argv, int *i);
/* Help text for the shared options. */
void cli_gen_opts_help(void);
/* Help lines of --no-mmap / --mmap (td_model_params.use_mmap). */
#define CLI_MMAP_HELP                                                                                      \
    "      --no-mmap          copy the weights into anonymous 2 MiB pages at load (default for\n"          \
    "                         weights of 256 MiB or more; smaller models are mapped)\n"                   \
    "      --mmap             use the weights where the files are mapped (no copy)\n"

int cmd_bench(int argc, char **argv);
int cmd_quantize(int argc, char **argv);

#endif
