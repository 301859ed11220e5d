/* test_vocab — draft vocabularies (src/spec/vocab.c): a ranked subset gathers
 * exactly the ranked rows of the LM head, a pick is the argmax of the full head
 * restricted to the kept ids and the row's context ids, context ids stop at
 * their cap, and malformed ranking files are refused with messages. */
#define _GNU_SOURCE
#include "t.h"
#include "spec/vocab.h"
#include "nn/kernels.h"
#include "nn/quant.h"

#include <math.h>
#include <stdint.h>
#include <unistd.h>

enum { V = 3000, D = 40 }; /* D not a multiple of 16: the dot's tail is exercised */

static uint64_t g_rng = 88172645463325252ull;
static uint32_t rnd(void) { g_rng ^= g_rng << 13; g_rng ^= g_rng >> 7; g_rng ^= g_rng << 17; return (uint32_t)g_rng; }
static float frand(void) { return (float)(rnd() % 20001) / 10000.0f - 1.0f; }

static uint16_t bf16(float f) { uint32_t u; memcpy(&u, &f, 4); return (uint16_t)(u >> 16); }

static char g_dir[64];

static void write_file(const char *name, const char *text) {
    char p[128];
    snprintf(p, sizeof p, "%s/%s", g_dir, name);
    FILE *f = fopen(p, "w");
    if (f) { fputs(text, f); fclose(f); }
}

/* a ranking: ids in a fixed pseudo-random order (a permutation of 0..V-1) */
static void write_ranking(int32_t *perm) {
    for (int i = 0; i < V; i++) perm[i] = i;
    for (int i = V - 1; i > 0; i--) { int j = (int)(rnd() % (uint32_t)(i + 1)); int32_t t = perm[i]; perm[i] = perm[j]; perm[j] = t; }
    size_t cap = (size_t)V * 8 + 64, n = 0;
    char *s = malloc(cap);
    n += (size_t)snprintf(s + n, cap - n, "{\"method\": \"test\", \"ranked_ids\": [");
    for (int i = 0; i < V; i++) n += (size_t)snprintf(s + n, cap - n, "%s%d", i ? "," : "", (int)perm[i]);
    snprintf(s + n, cap - n, "]}\n");
    write_file("draft_vocab.json", s);
    free(s);
}

static void test_ranked_pick(const uint16_t *W) {
    t_begin("ranked_subset_and_context_ids");
    int32_t *perm = malloc(sizeof(int32_t) * V);
    write_ranking(perm);
    td_tensor head = {.data = W, .dtype = TD_DTYPE_BF16, .n_dims = 2, .shape = {V, D}};
    td_draft_vocab v;
    td_draft_ctxids cx = {0};
    td_err err = {0};
    float *full = malloc(sizeof(float) * V), *sub = malloc(sizeof(float) * V), *scr = malloc(sizeof(float) * TD_DRAFT_CTXIDS);
    float hn[D];
    const int N = 700;
    T_REQUIRE(td_draft_vocab_open(&v, g_dir, N, &head, &err) == 0, "open: %s", err.msg);
    T_CHECK(v.ranked == 1 && v.n_sub == N && head.shape[0] == N && head.data != W, "a ranked subset is gathered");
    for (int j = 0; j < N; j++) {
        T_CHECK(td_draft_vocab_id(&v, j) == perm[j], "logit %d stands for id %d", j, (int)perm[j]);
        if (memcmp((const uint16_t *)head.data + (size_t)j * D, W + (size_t)perm[j] * D, D * 2) != 0) {
            T_CHECK(0, "gathered row %d is not LM-head row %d", j, (int)perm[j]);
            break;
        }
    }
    T_REQUIRE(td_draft_ctxids_init(&cx, &v, &err) == 0, "ctxids: %s", err.msg);
    /* context: some kept ids (ignored), some not (kept, in first-seen order), repeats */
    int32_t ctx[64];
    int nc = 0;
    for (int i = 0; i < 64; i++) ctx[nc++] = perm[(i * 37) % V];
    td_draft_ctxids_note(&v, &cx, ctx, nc);
    td_draft_ctxids_note(&v, &cx, ctx, nc);
    int expect = 0;
    for (int i = 0; i < 64; i++) {
        int r = (i * 37) % V, dup = 0;
        for (int k = 0; k < i; k++) dup |= (k * 37) % V == r;
        if (r >= N && !dup) expect++;
    }
    T_CHECK(cx.n == expect, "context ids: %d, expected %d (kept ids and repeats are skipped)", cx.n, expect);
    /* many hidden states: the pick is the argmax of the full head over kept ∪ context */
    for (int trial = 0; trial < 200; trial++) {
        for (int k = 0; k < D; k++) hn[k] = frand();
        td_matmul(full, V, hn, D, 1, W, TD_DTYPE_BF16, D, 0, V, 0);
        td_matmul(sub, N, hn, D, 1, head.data, TD_DTYPE_BF16, D, 0, N, 0);
        int32_t best = -1;
        for (int j = 0; j < N; j++) if (best < 0 || full[perm[j]] > full[best]) best = perm[j];
        for (int j = 0; j < cx.n; j++) if (full[cx.ids[j]] > full[best]) best = cx.ids[j];
        int32_t got = td_draft_vocab_pick(&v, sub, &cx, hn, scr);
        if (got != best) { T_CHECK(got == best, "trial %d: picked %d, the restricted argmax is %d", trial, (int)got, (int)best); break; }
        int32_t only = td_draft_vocab_pick(&v, sub, NULL, NULL, scr);
        int32_t bk = -1;
        for (int j = 0; j < N; j++) if (bk < 0 || full[perm[j]] > full[bk]) bk = perm[j];
        if (only != bk) { T_CHECK(only == bk, "trial %d: kept-only pick %d, expected %d", trial, (int)only, (int)bk); break; }
    }
    /* the cap: noting every id keeps TD_DRAFT_CTXIDS of them */
    for (int32_t id = 0; id < V; id++) td_draft_ctxids_note(&v, &cx, &id, 1);
    T_CHECK(cx.n == (V - N < TD_DRAFT_CTXIDS ? V - N : TD_DRAFT_CTXIDS), "capped context ids: %d", cx.n);
    /* q spread back onto the full vocabulary */
    for (int j = 0; j < N; j++) sub[j] = (float)(j + 1);
    td_draft_vocab_scatter(&v, sub, full);
    int ok = 1;
    for (int j = 0; j < N; j++) ok &= full[perm[j]] == (float)(j + 1);
    for (int j = N; j < V; j++) ok &= full[perm[j]] == 0.0f;
    T_CHECK(ok, "scatter puts q_j at id perm[j] and zero elsewhere");
done:
    td_draft_ctxids_free(&cx);
    td_draft_vocab_free(&v);
    free(perm); free(full); free(sub); free(scr);
    t_end();
}

static void test_prefix_and_whole(const uint16_t *W) {
    t_begin("prefix_without_ranking_and_whole_vocabulary");
    char p[128];
    snprintf(p, sizeof p, "%s/draft_vocab.json", g_dir);
    unlink(p);
    td_tensor head = {.data = W, .dtype = TD_DTYPE_BF16, .n_dims = 2, .shape = {V, D}};
    td_draft_vocab v;
    td_err err = {0};
    T_REQUIRE(td_draft_vocab_open(&v, g_dir, 100, &head, &err) == 0, "open: %s", err.msg);
    T_CHECK(!v.ranked && head.data == W && head.shape[0] == 100 && td_draft_vocab_id(&v, 42) == 42, "ids 0..99, a view");
    T_CHECK(v.kept && v.kept[99] && !v.kept[100], "kept marks the prefix");
    td_draft_vocab_free(&v);
    head.shape[0] = V;
    T_REQUIRE(td_draft_vocab_open(&v, g_dir, 0, &head, &err) == 0, "open whole: %s", err.msg);
    td_draft_ctxids cx;
    T_CHECK(v.n_sub == V && !v.kept && td_draft_ctxids_init(&cx, &v, &err) == 0 && !cx.ids,
            "the whole vocabulary: no kept table, no context ids");
    T_CHECK(td_draft_vocab_open(&v, g_dir, V + 1, &head, &err) == TD_EINVAL && strstr(err.msg, "outside"), "too many ids: %s", err.msg);
done:
    td_draft_vocab_free(&v);
    t_end();
}

static void test_bad_rankings(const uint16_t *W) {
    t_begin("malformed_rankings_refused");
    static const struct { const char *text; const char *want; } bad[] = {
        {"not json", "not valid JSON"},
        {"{\"ids\": [1, 2]}", "ranked_ids"},
        {"{\"ranked_ids\": [1, 2, 3]}", "fewer than"},
        {"{\"ranked_ids\": [1, 2, 1, 4, 5]}", "repeats"},
        {"{\"ranked_ids\": [1, 2, 3000, 4, 5]}", "not a token id"},
        {"{\"ranked_ids\": [1, -2, 3, 4, 5]}", "not a token id"},
        {"{\"ranked_ids\": [1, 2.5, 3, 4, 5]}", "not a token id"},
        {"{\"ranked_ids\": [1, \"2\", 3, 4, 5]}", "not a token id"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        write_file("draft_vocab.json", bad[i].text);
        td_tensor head = {.data = W, .dtype = TD_DTYPE_BF16, .n_dims = 2, .shape = {V, D}};
        td_draft_vocab v;
        td_err err = {0};
        int rc = td_draft_vocab_open(&v, g_dir, 5, &head, &err);
        T_CHECK(rc < 0 && strstr(err.msg, bad[i].want) && strstr(err.msg, "draft_vocab.json") && head.data == W && !v.ids,
                "case %zu: rc %d, message '%s' (wanted '%s')", i, rc, err.msg, bad[i].want);
        td_draft_vocab_free(&v);
    }
    t_end();
}

int main(void) {
    snprintf(g_dir, sizeof g_dir, "/tmp/td_vocab_XXXXXX");
    if (!mkdtemp(g_dir)) return 1;
    uint16_t *W = malloc(sizeof(uint16_t) * V * D);
    for (int i = 0; i < V * D; i++) W[i] = bf16(frand());
    test_ranked_pick(W);
    test_prefix_and_whole(W);
    test_bad_rankings(W);
    char p[128];
    snprintf(p, sizeof p, "%s/draft_vocab.json", g_dir);
    unlink(p);
    rmdir(g_dir);
    free(W);
    return t_exit();
}
