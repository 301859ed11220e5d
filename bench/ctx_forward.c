/* bench/ctx_forward.c — the time of one forward of T new tokens on a row that
 * already holds CTX positions, for a chosen KV cache type and activation type:
 * what a decode step (T = 1) or a verify (T = 8) costs at a long context, where
 * the cache's bytes (bf16 against q8_0) weigh as much as the weights'.
 * `tandem bench forward` measures at context 512 only; this is its long-context
 * complement (bench/forward-notes.md, "Stop 34", took its q8_0 figures here).
 * In one process: the row is filled with CTX tokens (forwards of up to 512),
 * then N forwards of T tokens each (logits at every position, as a verify
 * wants them), the row trimmed back to CTX after each; prints one JSON object
 * with the median and the fastest forward in ms.
 * Build and run (from the repository root, after make):
 *   cc -std=c11 -O2 -march=native -Iinclude bench/ctx_forward.c build/libtandem.a -o /tmp/ctx_forward \
 *      -lpcre2-8 -lutf8proc -lcjson -lmicrohttpd -lm -pthread
 *   /tmp/ctx_forward MODEL ACT KV CTX T N     e.g. /tmp/ctx_forward /tmp/q06-q8.gguf bf16 q8_0 4096 1 30
 * FWD_MMAP=1 in the environment maps the weights (0 copies them; unset: by size, as
 * td_model_open): a bf16 model over 256 MiB is copied by default, and only a
 * mapped one gets P24 copies (README, "Packed bf16 weights"). */
#include "fwd_row.h"

int main(int argc, char **argv) {
    if (argc != 7) {
        fprintf(stderr, "usage: ctx_forward MODEL ACT(f32|bf16|amx|auto) KV(f32|bf16|f16|q8_0) CTX T N\n");
        return 2;
    }
    int act = td_act_type_parse(argv[2]), kv = td_kv_type_parse(argv[3]);
    int ctx = atoi(argv[4]), T = atoi(argv[5]), N = atoi(argv[6]);
    if (act < 0 || kv < 0 || ctx < 1 || ctx > (1 << 20) || T < 1 || T > 512 || N < 1 || N > 100000) {
        fprintf(stderr, "ctx_forward: bad argument (ACT, KV, 1 <= CTX <= 2^20, 1 <= T <= 512, 1 <= N <= 100000)\n");
        return 2;
    }
    fwd_row f;
    if (fwd_row_open(&f, argv[1], act, kv, ctx, T, "ctx_forward") != 0) return 1;
    double *ts = malloc(sizeof(double) * (size_t)N);
    int rc = 1;
    if (!ts) { fprintf(stderr, "ctx_forward: out of memory\n"); goto out; }
    for (int r = 0; r < N; r++)
        if (fwd_row_step(&f, &ts[r]) != 0) goto out;
    qsort(ts, (size_t)N, sizeof(double), fr_cmpd);
    printf("{\"model\": \"%s\", \"act_type\": \"%s\", \"kv_type\": \"%s\", \"ctx\": %d, \"T\": %d, \"n\": %d, "
           "\"median_ms\": %.3f, \"min_ms\": %.3f}\n",
           argv[1], td_act_type_name(act), td_kv_type_name(kv), ctx, T, N, ts[N / 2], ts[0]);
    rc = 0;
out:
    free(ts);
    fwd_row_close(&f);
    return rc;
}
