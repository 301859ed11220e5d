/* quantize — `tandem quantize IN OUT.gguf [--type T]`: write a model (a Hugging
 * Face directory or a GGUF file) as a GGUF file llama.cpp can load, through
 * td_model_quantize. The type defaults to the input's weight dtype. */
#include "cli/cli.h"

#include <stdio.h>
#include <string.h>

static void quantize_help(void) {
    printf("usage: tandem quantize IN OUT.gguf [--type T]\n"
           "Write the model IN (a Hugging Face model directory, or a GGUF file) as the GGUF\n"
           "file OUT.gguf, with llama.cpp's tensor names, metadata and tokenizer keys.\n\n"
           "  -t, --type T    type of the matrices (default: the input's): f32, f16, bf16,\n"
           "                  q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl, q2_k, q3_k, q4_k, q5_k,\n"
           "                  q6_k, iq4_xs, or the mixes q3_k_m, q4_k_m, q5_k_m; 1-D tensors\n"
           "                  are f32. The output matrix is q8_0 for q8_0 and q4_0, else q6_k;\n"
           "                  the mixes store attn_v and ffn_down as q6_k (q3_k_m: q4_k).\n"
           "                  k-quant matrices whose rows are not a multiple of 256 are stored\n"
           "                  as q5_0 (q4_k), iq4_nl (q2_k, q3_k, iq4_xs) or q8_0\n"
           "  -h, --help      this help\n");
}

int cmd_quantize(int argc, char **argv) {
    const char *in = NULL, *out = NULL, *type = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) { quantize_help(); return 0; }
        if (!strcmp(argv[i], "-t") || !strcmp(argv[i], "--type")) {
            if (!cli_need_arg(i, argc, argv[i])) return 2;
            type = argv[++i];
        } else if (argv[i][0] == '-') {
            fprintf(stderr, "tandem quantize: unknown option '%s'\n", argv[i]);
            return 2;
        } else if (!in) in = argv[i];
        else if (!out) out = argv[i];
        else { fprintf(stderr, "tandem quantize: one input and one output (see --help)\n"); return 2; }
    }
    if (!in || !out) { fprintf(stderr, "tandem quantize: needs IN and OUT.gguf (see --help)\n"); return 2; }
    td_err err = {0};
    td_model *m = NULL;
    td_model_params mp = {.use_mmap = 1}; /* the weights are read once: no copy */
    if (td_model_open_params(&m, in, &mp, &err) != 0) return cli_die(in, &err);
    if (!type) {
        td_model_info info;
        td_model_get_info(m, &info);
        type = info.dtype >= 0 && info.dtype < TD_DTYPE_COUNT ? td_dtype_name(info.dtype) : "bf16";
    }
    double t0 = cli_now();
    int rc = td_model_quantize(m, out, type, &err);
    td_model_free(m);
    if (rc) return cli_die(out, &err);
    fprintf(stderr, "tandem quantize: wrote %s (%s) in %.1f s\n", out, type, cli_now() - t0);
    return 0;
}
