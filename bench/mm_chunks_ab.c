/* bench/mm_chunks_ab.c — two product chunkings of the same forward, alternated
 * round by round in one process, so a shared machine's drift (its bandwidth
 * moves by a fifth within minutes) weighs on both alike. Rounds go A B B A ...;
 * each round times N forwards of T new tokens on a row holding CTX positions
 * (rolled back after each) and keeps their median; each A round is paired with
 * its B neighbour. Prints the median of the paired ratios B / A with its
 * quartiles, and each side's median forward.
 * WHICH picks what A and B set (neither changes a bit of the output):
 *   1   — td_ctx_set_mm_chunks_1: chunks a thread of a one-token product of
 *         2 MiB or more (the decode's products);
 *   all — td_ctx_set_mm_chunks: chunks a thread of every product;
 *   stream — td_ctx_set_stream: A and B are 0 (weights cached: near prefetch)
 *         or 1 (weights streamed: far prefetch);
 *   p24 — td_kernels_set_p24: A and B are 0 (bf16 products on the plain
 *         matrices) or 1 (on their P24 copies, act_type bf16; nn/kernels.h).
 * Build and run (from the repository root, after make):
 *   cc -std=c11 -O2 -march=native -Iinclude -Isrc bench/mm_chunks_ab.c build/libtandem.a -o /tmp/mm_chunks_ab \
 *      -lpcre2-8 -lutf8proc -lcjson -lmicrohttpd -lm -pthread
 *   /tmp/mm_chunks_ab MODEL ACT KV CTX T N ROUNDS WHICH A B
 *   e.g. /tmp/mm_chunks_ab /tmp/q06-q8.gguf amx bf16 64 1 3 800 1 1 8
 *        /tmp/mm_chunks_ab /tmp/q06.gguf amx bf16 64 1 3 400 stream 0 1
 *        /tmp/mm_chunks_ab /tmp/q06.gguf bf16 bf16 512 8 3 40 p24 0 1 */
#include "nn/kernels.h"
#include "nn/pool.h"
#include "fwd_row.h"

int main(int argc, char **argv) {
    if (argc != 11) {
        fprintf(stderr, "usage: mm_chunks_ab MODEL ACT KV CTX T N ROUNDS (1|all|stream|p24) A B\n");
        return 2;
    }
    int act = td_act_type_parse(argv[2]), kv = td_kv_type_parse(argv[3]);
    int ctx = atoi(argv[4]), T = atoi(argv[5]), N = atoi(argv[6]), R = atoi(argv[7]);
    int one = !strcmp(argv[8], "1"), stream = !strcmp(argv[8], "stream"), p24 = !strcmp(argv[8], "p24");
    int A = atoi(argv[9]), B = atoi(argv[10]), lo = stream || p24 ? 0 : 1, hi = stream || p24 ? 1 : 64;
    if (act < 0 || kv < 0 || ctx < 0 || ctx > (1 << 20) || T < 1 || T > 512 || N < 1 || N > 100000 || R < 4 ||
        R > 100000 || (!one && !stream && !p24 && strcmp(argv[8], "all")) || A < lo || A > hi || B < lo || B > hi) {
        fprintf(stderr, "mm_chunks_ab: bad argument (0 <= CTX <= 2^20, 1 <= T <= 512, 4 <= ROUNDS, WHICH 1, all, "
                        "stream or p24, 1 <= A, B <= 64, or 0 <= A, B <= 1 for stream and p24)\n");
        return 2;
    }
    fwd_row f;
    if (fwd_row_open(&f, argv[1], act, kv, ctx, T, "mm_chunks_ab") != 0) return 1;
    double *ts = malloc(sizeof(double) * (size_t)N), *med[2], *rat = malloc(sizeof(double) * (size_t)R);
    med[0] = malloc(sizeof(double) * (size_t)R);
    med[1] = malloc(sizeof(double) * (size_t)R);
    int rc = 1, cnt[2] = {0, 0};
    if (!ts || !rat || !med[0] || !med[1]) { fprintf(stderr, "mm_chunks_ab: out of memory\n"); goto out; }
    for (int r = 0; r < R; r++) {
        int k = (r % 2) ^ ((r / 2) % 2); /* A B B A */
        if (p24) td_kernels_set_p24(k ? B : A);
        else if (stream) td_ctx_set_stream(f.c, k ? B : A);
        else if (one) td_ctx_set_mm_chunks_1(f.c, k ? B : A, (size_t)2 << 20);
        else td_ctx_set_mm_chunks(f.c, k ? B : A, (size_t)64 << 10);
        for (int i = 0; i < N; i++)
            if (fwd_row_step(&f, &ts[i]) != 0) goto out;
        qsort(ts, (size_t)N, sizeof(double), fr_cmpd);
        med[k][cnt[k]++] = ts[N / 2];
    }
    int np = cnt[0] < cnt[1] ? cnt[0] : cnt[1];
    for (int i = 0; i < np; i++) rat[i] = med[1][i] / med[0][i];
    qsort(rat, (size_t)np, sizeof(double), fr_cmpd);
    qsort(med[0], (size_t)cnt[0], sizeof(double), fr_cmpd);
    qsort(med[1], (size_t)cnt[1], sizeof(double), fr_cmpd);
    printf("{\"model\": \"%s\", \"T\": %d, \"ctx\": %d, \"which\": \"%s\", \"A\": %d, \"B\": %d, \"pairs\": %d, "
           "\"ratio_b_a\": %.4f, \"q1\": %.4f, \"q3\": %.4f, \"median_ms_a\": %.3f, \"median_ms_b\": %.3f}\n",
           argv[1], T, ctx, argv[8], A, B, np, rat[np / 2], rat[np / 4], rat[3 * np / 4], med[0][cnt[0] / 2],
           med[1][cnt[1] / 2]);
    rc = 0;
out:
    free(ts); free(rat); free(med[0]); free(med[1]);
    fwd_row_close(&f);
    return rc;
}
