#define _GNU_SOURCE
/* test_forward — batch invariance, KV rollback and forward input checks on
 * random-weight models written by tmodel.h (shapes chosen so that no dimension
 * is a multiple of the vector width, to exercise every tail path). */
#include "tandem.h"
#include "t.h"
#include "tmodel.h"
#include "tctx.h"

#include <math.h>
#include <unistd.h>

#include "model/model.h"
#include "nn/amx.h"
#include "nn/kernels.h"
#include "nn/mmx.h"
#include "nn/pool.h"

static td_model *open_model(const char *dir, const tm_shape *s) {
    if (tm_write(dir, s) != 0) return NULL;
    td_model *m = NULL;
    td_err err = {0};
    if (td_model_open(&m, dir, &err) != 0) { printf("  open %s: %s\n", dir, err.msg); return NULL; }
    return m;
}

static const char *KVN[4] = {[TD_DTYPE_F32] = "f32", [TD_DTYPE_F16] = "f16", [TD_DTYPE_BF16] = "bf16", [TD_DTYPE_Q8_0] = "q8_0"};

/* kv: the KV cache's type (each type must keep every invariance) */
static void test_invariance(const char *name, const tm_shape *s, const char *dir, int kv) {
    char nm[128];
    snprintf(nm, sizeof nm, "%s%s%s%s", name, kv == TD_DTYPE_F32 ? "" : "_kv_", kv == TD_DTYPE_F32 ? "" : KVN[kv],
             tc_act == TD_DTYPE_BF16 ? "_act_bf16" : tc_act == TD_ACT_AMX ? "_act_amx" : "");
    t_begin(nm);
    td_model *m = open_model(dir, s);
    td_ctx *c3 = NULL, *cs = NULL;
    float *a = NULL, *dd = NULL;
    T_REQUIRE(m != NULL, "model did not open");
    int V = s->vocab;
    int32_t seq[12];
    uint64_t st = s->seed + 7;
    for (int i = 0; i < 12; i++) seq[i] = (int32_t)(tm_rng(&st) % (uint64_t)V);
    a = malloc(sizeof(float) * 64 * V); dd = malloc(sizeof(float) * 64 * V);
    T_REQUIRE(a && dd, "memory");
    /* T=1 steps (one thread) == one T=7 block == inside a ragged B=5 batch (two threads) */
    const char *bad = tc_invariance(m, V, seq, a, kv);
    T_CHECK(bad == NULL, "%s", bad ? bad : "");
    /* the T=7 block with 3 threads: the attention of one row then runs as two
     * jobs (post-processing, then attention units) instead of one fused job */
    c3 = tc_open_ctx(m, 1, 3, kv);
    T_REQUIRE(c3 != NULL, "context of 3 threads");
    int r;
    td_ctx_row_add(c3, &r);
    T_REQUIRE(tc_feed(c3, r, seq, 5, dd) == 0, "prefill 3 threads");
    T_REQUIRE(tc_feed(c3, r, seq + 5, 7, dd) == 0, "block 3 threads");
    T_CHECK(memcmp(a, dd, sizeof(float) * 7 * V) == 0, "T=7 with 3 threads differs from T=1");
    /* serial forwards (serial_tokens: every job on the caller, chunk 0 of 1) of a
     * 2-thread context: the prefill of 5 runs on the pool, the block of 7 serially */
    {
        td_ctx_params p = td_ctx_default_params();
        p.max_rows = 1; p.max_ctx = 64; p.max_tokens = 64; p.max_logits = 64; p.n_threads = 2; p.kv_type = kv;
        p.act_type = tc_act;
        p.serial_tokens = 7;
        td_err err = {0};
        T_REQUIRE(td_ctx_open(&cs, m, &p, &err) == 0, "serial context: %s", err.msg);
        td_ctx_row_add(cs, &r);
        memset(dd, 0, sizeof(float) * 7 * V);
        T_REQUIRE(tc_feed(cs, r, seq, 5, dd) == 0, "prefill, pool");
        T_REQUIRE(tc_feed(cs, r, seq + 5, 7, dd) == 0, "block, serial");
        T_CHECK(memcmp(a, dd, sizeof(float) * 7 * V) == 0, "a serial T=7 forward differs from T=1");
    }
    /* matrix products in more chunks than threads (any chunk size, claimed
     * dynamically and stolen): the same bits, 2 and 3 threads */
    for (int nth = 2; nth <= 3; nth++)
        for (int per = 2; per <= 7; per += 5) {
            td_ctx_free(c3);
            c3 = tc_open_ctx(m, 1, nth, kv);
            T_REQUIRE(c3 != NULL, "context");
            td_ctx_set_mm_chunks(c3, per, 1);
            td_ctx_set_mm_chunks_1(c3, per + 1, 0); /* the T = 1 steps: 3 or 8 a thread */
            td_ctx_set_stream(c3, per == 7);         /* and with the streamed weights' far prefetch */
            td_ctx_row_add(c3, &r);
            T_REQUIRE(tc_feed(c3, r, seq, 5, dd) == 0, "prefill chunks");
            for (int i = 5; i < 12; i++) T_REQUIRE(tc_feed(c3, r, seq + i, 1, dd + (size_t)(i - 5) * V) == 0, "T=1 chunks");
            T_CHECK(memcmp(a, dd, sizeof(float) * 7 * V) == 0, "T=1 with %d threads x %d chunks (stream %d) differs", nth, per, per == 7);
            td_ctx_row_trim(c3, r, 5);
            T_REQUIRE(tc_feed(c3, r, seq + 5, 7, dd) == 0, "block chunks");
            T_CHECK(memcmp(a, dd, sizeof(float) * 7 * V) == 0, "T=7 with %d threads x %d chunks differs", nth, per);
        }
    /* a long prefill (40 tokens: its products' inputs converted by the threads in
     * 16-row chunks, the last one short) gives every position the logits of 40
     * T=1 steps, with 1, 2 and 3 threads (one thread: a pool that runs every
     * job as chunk 0 of 1) */
    {
        enum { NL = 40 };
        int32_t lseq[NL];
        for (int i = 0; i < NL; i++) lseq[i] = (int32_t)(tm_rng(&st) % (uint64_t)V);
        float *one = malloc(sizeof(float) * NL * V), *all = malloc(sizeof(float) * NL * V);
        T_REQUIRE(one && all, "memory");
        td_ctx_free(c3);
        c3 = tc_open_ctx(m, 1, 1, kv);
        T_REQUIRE(c3 != NULL, "context");
        td_ctx_row_add(c3, &r);
        int ok = 1;
        for (int i = 0; i < NL; i++) ok &= tc_feed(c3, r, lseq + i, 1, one + (size_t)i * V) == 0;
        for (int nth = 1; nth <= 3; nth++) {
            td_ctx_free(c3);
            c3 = tc_open_ctx(m, 1, nth, kv);
            T_REQUIRE(c3 != NULL, "context");
            td_ctx_row_add(c3, &r);
            memset(all, 0, sizeof(float) * NL * V);
            ok &= tc_feed(c3, r, lseq, NL, all) == 0;
            T_CHECK(ok && memcmp(one, all, sizeof(float) * NL * V) == 0, "a %d-token prefill on %d threads differs from T=1 steps",
                    NL, nth);
        }
        free(one); free(all);
    }
done:
    free(a); free(dd);
    td_ctx_free(c3);
    td_ctx_free(cs);
    td_model_free(m);
    t_end();
}

/* A model whose weights were copied out of the files (use_mmap = 0) gives the
 * same logits as the mapped one, bit for bit. */
static void test_copied(const tm_shape *s, const char *dir) {
    t_begin("forward_copied_weights_same_logits");
    td_model *m = open_model(dir, s), *mc = NULL;
    td_ctx *c = NULL, *cc = NULL;
    float *a = NULL, *b = NULL;
    T_REQUIRE(m != NULL, "model");
    td_model_params mp = {.use_mmap = 0};
    td_err err = {0};
    T_REQUIRE(td_model_open_params(&mc, dir, &mp, &err) == 0, "copied: %s", err.msg);
    td_model_info ia, ib;
    td_model_get_info(m, &ia);
    td_model_get_info(mc, &ib);
    T_CHECK(ia.copied == 0 && ib.copied == 1, "copied flags %d %d", ia.copied, ib.copied);
    int V = s->vocab;
    a = malloc(sizeof(float) * 12 * V); b = malloc(sizeof(float) * 12 * V);
    c = tc_open_ctx(m, 1, 2, TD_DTYPE_F32);
    cc = tc_open_ctx(mc, 1, 2, TD_DTYPE_F32);
    T_REQUIRE(a && b && c && cc, "ctx");
    int32_t seq[12];
    uint64_t st = 17;
    for (int i = 0; i < 12; i++) seq[i] = (int32_t)(tm_rng(&st) % (uint64_t)V);
    int r, rc2;
    td_ctx_row_add(c, &r);
    td_ctx_row_add(cc, &rc2);
    T_REQUIRE(tc_feed(c, r, seq, 12, a) == 0 && tc_feed(cc, rc2, seq, 12, b) == 0, "forward");
    T_CHECK(memcmp(a, b, sizeof(float) * 12 * V) == 0, "copied weights give other logits");
done:
    free(a); free(b);
    td_ctx_free(c); td_ctx_free(cc);
    td_model_free(m); td_model_free(mc);
    t_end();
}

static void test_rollback(const tm_shape *s, const char *dir, int kv) {
    char nm[64];
    snprintf(nm, sizeof nm, "kv_rollback%s%s%s", kv == TD_DTYPE_F32 ? "" : "_", kv == TD_DTYPE_F32 ? "" : KVN[kv],
             tc_act == TD_DTYPE_BF16 ? "_act_bf16" : tc_act == TD_ACT_AMX ? "_act_amx" : "");
    t_begin(nm);
    td_model *m = open_model(dir, s);
    td_ctx *c = NULL;
    float *ref = NULL, *got = NULL, *tmp = NULL;
    T_REQUIRE(m != NULL, "model");
    int V = s->vocab;
    c = tc_open_ctx(m, 2, 2, kv);
    T_REQUIRE(c != NULL, "ctx");
    ref = malloc(sizeof(float) * 64 * V); got = malloc(sizeof(float) * 64 * V); tmp = malloc(sizeof(float) * 64 * V);
    int32_t seq[20], alt[8];
    uint64_t st = 99;
    for (int i = 0; i < 20; i++) seq[i] = (int32_t)(tm_rng(&st) % (uint64_t)V);
    for (int i = 0; i < 8; i++) alt[i] = (int32_t)(tm_rng(&st) % (uint64_t)V);
    int r0, r1;
    td_ctx_row_add(c, &r0);
    td_ctx_row_add(c, &r1);
    /* reference: never goes past */
    T_REQUIRE(tc_feed(c, r0, seq, 20, ref) == 0, "ref");
    /* decode, wander off 8 wrong tokens, trim back, continue */
    T_REQUIRE(tc_feed(c, r1, seq, 10, tmp) == 0, "prefix");
    T_REQUIRE(tc_feed(c, r1, alt, 8, tmp) == 0, "wrong branch");
    T_CHECK(td_ctx_row_len(c, r1) == 18, "len after branch");
    T_CHECK(td_ctx_row_trim(c, r1, 10) == 0, "trim");
    T_CHECK(td_ctx_row_len(c, r1) == 10, "len after trim");
    for (int i = 10; i < 20; i++) T_REQUIRE(tc_feed(c, r1, seq + i, 1, got + (size_t)(i - 10) * V) == 0, "redo");
    T_CHECK(memcmp(ref + (size_t)10 * V, got, sizeof(float) * 10 * V) == 0, "logits after rollback differ");
    T_CHECK(td_ctx_row_trim(c, r1, 21) == TD_ERANGE, "trim past the end must fail");
done:
    free(ref); free(got); free(tmp);
    td_ctx_free(c);
    td_model_free(m);
    t_end();
}

/* The worst logit difference of a 16-token forward with each KV type in kvs
 * (n of them) from one with kvs[0] (f32), checked to be > 0 (the type is in
 * force) and <= tol * max |logit|. */
static void kv_close(const tm_shape *s, td_model *m, const int *kvs, int n, double tol) {
    td_ctx *c[4] = {0};
    float *lg[4] = {0};
    int V = s->vocab;
    int32_t seq[16];
    uint64_t st = 5;
    for (int i = 0; i < 16; i++) seq[i] = (int32_t)(tm_rng(&st) % (uint64_t)V);
    for (int i = 0; i < n; i++) {
        c[i] = tc_open_ctx(m, 1, 2, kvs[i]);
        lg[i] = malloc(sizeof(float) * 16 * V);
        T_REQUIRE(c[i] && lg[i], "ctx %s", KVN[kvs[i]]);
        T_CHECK(td_ctx_get_params(c[i]).kv_type == kvs[i], "kv_type %s kept", KVN[kvs[i]]);
        int r;
        td_ctx_row_add(c[i], &r);
        T_REQUIRE(tc_feed(c[i], r, seq, 16, lg[i]) == 0, "forward %s", KVN[kvs[i]]);
    }
    for (int k = 1; k < n; k++) {
        double md = 0, mx = 0;
        for (size_t i = 0; i < (size_t)16 * V; i++) {
            double d = fabs((double)lg[k][i] - lg[0][i]);
            md = d > md ? d : md;
            mx = fabs(lg[0][i]) > mx ? fabs(lg[0][i]) : mx;
        }
        printf("  kv %s: worst logit difference from f32 %.3g (max |logit| %.3g)\n", KVN[kvs[k]], md, mx);
        T_CHECK(md > 0, "kv %s: logits equal f32's bit for bit: the storage type is not in force", KVN[kvs[k]]);
        T_CHECK(md <= tol * mx, "kv %s: logits differ from f32 by %.3g (of %.3g)", KVN[kvs[k]], md, mx);
    }
done:
    for (int i = 0; i < n; i++) { td_ctx_free(c[i]); free(lg[i]); }
}

/* A q8_0 cache (a model whose head_dim, 32, is one block): in force and close
 * to an f32 cache's logits. */
static void test_kv_q8(const tm_shape *s, const char *dir) {
    t_begin("kv_q8_0_close_to_f32");
    td_model *m = open_model(dir, s);
    T_REQUIRE(m != NULL, "model");
    kv_close(s, m, (const int[]){TD_DTYPE_F32, TD_DTYPE_Q8_0}, 2, 3e-2);
done:
    td_model_free(m);
    t_end();
}

/* The KV type is in force (bf16 / f16 storage changes the logits a little, not
 * a lot: they stay close to f32's) and a bad one is refused with a message. */
static void test_kv_types(const tm_shape *s, const char *dir) {
    t_begin("kv_types");
    td_model *m = open_model(dir, s);
    T_REQUIRE(m != NULL, "model");
    kv_close(s, m, (const int[]){TD_DTYPE_F32, TD_DTYPE_F16, TD_DTYPE_BF16}, 3, 1e-2);
    td_ctx_params p = td_ctx_default_params();
    T_CHECK(p.kv_type == TD_DTYPE_F32 || p.kv_type == TD_DTYPE_BF16 || p.kv_type == TD_DTYPE_F16, "default kv type");
    p.kv_type = TD_DTYPE_Q8_0; /* this model's head_dim, 18, is no multiple of q8_0's blocks of 32 */
    td_ctx *bad = NULL;
    td_err err = {0};
    T_CHECK(td_ctx_open(&bad, m, &p, &err) == TD_EUNSUPPORTED && !bad && strstr(err.msg, "q8_0") && strstr(err.msg, "18"),
            "q8_0 KV refused for head_dim 18: %s", err.msg);
    p.kv_type = TD_DTYPE_Q4_0;
    T_CHECK(td_ctx_open(&bad, m, &p, &err) == TD_EINVAL && !bad && strstr(err.msg, "kv_type"), "q4_0 KV refused: %s", err.msg);
    p.kv_type = -1;
    T_CHECK(td_ctx_open(&bad, m, &p, &err) == TD_EINVAL && !bad, "kv_type -1 refused");
    T_CHECK(td_kv_type_parse("bf16") == TD_DTYPE_BF16 && td_kv_type_parse("f16") == TD_DTYPE_F16 &&
            td_kv_type_parse("f32") == TD_DTYPE_F32 && td_kv_type_parse("q8_0") == TD_DTYPE_Q8_0 &&
            td_kv_type_parse("q4_0") == -1 && td_kv_type_parse("fp8") == -1 && td_kv_type_parse("") == -1 &&
            td_kv_type_parse(NULL) == -1 && !strcmp(td_kv_type_name(TD_DTYPE_Q8_0), "q8_0") &&
            td_kv_type_name(TD_DTYPE_Q4_0) == NULL, "kv type names");
done:
    td_model_free(m);
    t_end();
}

/* Logits of 16 tokens on the bf16-weight model mb with f32 activations and
 * with act, and on the f32-weight model mf likewise (vocabularies vb, vf): act
 * moves mb's logits, within 3e-2 of the largest, and leaves mf's bit for bit.
 * Call inside a test (T_ checks); 0 when it could run. */
static int check_act_moves(td_model *mb, int vb, td_model *mf, int vf, int act, uint64_t seed) {
    const char *an = td_act_type_name(act);
    td_ctx *c[4] = {0};
    float *lg[4] = {0};
    int32_t seq[16];
    int rc = -1;
    uint64_t st = seed;
    for (int i = 0; i < 16; i++) seq[i] = (int32_t)(tm_rng(&st) % (uint64_t)(vb < vf ? vb : vf));
    for (int k = 0; k < 4; k++) { /* bf16 model f32 / act, f32 model f32 / act */
        tc_act = k & 1 ? act : TD_DTYPE_F32;
        c[k] = tc_open_ctx(k < 2 ? mb : mf, 1, 2, TD_DTYPE_F32);
        tc_act = TD_DTYPE_F32;
        lg[k] = malloc(sizeof(float) * 16 * (k < 2 ? vb : vf));
        T_REQUIRE(c[k] && lg[k], "ctx %d", k);
        T_CHECK(td_ctx_get_params(c[k]).act_type == (k & 1 ? act : TD_DTYPE_F32), "act_type kept");
        int r;
        td_ctx_row_add(c[k], &r);
        T_REQUIRE(tc_feed(c[k], r, seq, 16, lg[k]) == 0, "forward %d", k);
    }
    double md = 0, mx = 0;
    for (size_t i = 0; i < (size_t)16 * vb; i++) {
        double d = fabs((double)lg[1][i] - lg[0][i]);
        md = d > md ? d : md;
        mx = fabs(lg[0][i]) > mx ? fabs(lg[0][i]) : mx;
    }
    printf("  act %s: worst logit difference from f32 %.3g (max |logit| %.3g)\n", an, md, mx);
    T_CHECK(md > 0, "act %s: logits equal f32's bit for bit: the mode is not in force", an);
    T_CHECK(md <= 3e-2 * mx, "act %s: logits differ from f32 by %.3g (of %.3g)", an, md, mx);
    T_CHECK(memcmp(lg[2], lg[3], sizeof(float) * 16 * vf) == 0, "act %s changed an f32 model's logits", an);
    rc = 0;
done:
    for (int k = 0; k < 4; k++) { td_ctx_free(c[k]); free(lg[k]); }
    return rc;
}

/* act_type bf16 is in force on a bf16 model (logits move, a little), leaves an
 * f32 model's logits unchanged bit for bit (only bf16 weights take it), and a
 * bad value is refused with a message. */
static void test_act_types(const tm_shape *sb, const char *db, const tm_shape *sf, const char *df) {
    t_begin("act_types");
    td_model *mb = open_model(db, sb), *mf = open_model(df, sf);
    T_REQUIRE(mb && mf, "models");
    T_REQUIRE(check_act_moves(mb, sb->vocab, mf, sf->vocab, TD_DTYPE_BF16, 11) == 0, "bf16 activations");
    td_ctx_params p = td_ctx_default_params();
    T_CHECK(p.act_type == TD_DTYPE_F32, "default act type f32");
    td_ctx *bad = NULL;
    td_err err = {0};
    p.act_type = TD_DTYPE_F16;
    T_CHECK(td_ctx_open(&bad, mb, &p, &err) == TD_EINVAL && !bad && strstr(err.msg, "act_type"), "f16 act refused: %s", err.msg);
    p.act_type = 77;
    T_CHECK(td_ctx_open(&bad, mb, &p, &err) == TD_EINVAL && !bad, "act_type 77 refused");
    T_CHECK(td_act_type_parse("bf16") == TD_DTYPE_BF16 && td_act_type_parse("f32") == TD_DTYPE_F32 &&
            td_act_type_parse("f16") == -1 && td_act_type_parse(NULL) == -1 && !strcmp(td_act_type_name(TD_DTYPE_BF16), "bf16") &&
            td_act_type_name(TD_DTYPE_F16) == NULL, "act type names");
done:
    td_model_free(mb);
    td_model_free(mf);
    t_end();
}

/* The schedule chosen per forward size by measured time (nn/hwsel.h: the
 * prefetch choice and the chunks a thread): a streamed context's decode steps
 * and verify blocks, choosing (its first 12 steps try the 4 schedules 3 times
 * each, then it picks), give the bits of contexts whose schedule is fixed
 * (hw 0 with one chunk a thread, hw 1 with 8); once seeded it reports its
 * choice, and none with adaptation off or everything fixed. */
static void test_hw_adapt(const tm_shape *s, const char *dir) {
    t_begin(tc_act == TD_DTYPE_BF16 ? "forward_sched_adapt_act_bf16" : "forward_sched_adapt");
    td_model *m = open_model(dir, s);
    td_ctx *c = NULL;
    float *lg[3] = {0};
    T_REQUIRE(m != NULL, "model did not open");
    int V = s->vocab, r;
    enum { NS = 26, NSTEP = 14 }; /* 4 prompt tokens, 14 one-token steps, 4 two-token blocks */
    int32_t seq[NS];
    uint64_t st = 11;
    for (int i = 0; i < NS; i++) seq[i] = (int32_t)(tm_rng(&st) % (uint64_t)V);
    for (int k = 0; k < 3; k++) T_REQUIRE((lg[k] = malloc(sizeof(float) * NS * V)) != NULL, "memory");
    int fixed = td_kernels_hw_stream_fixed();
    for (int k = 0; k < 3; k++) { /* k = 0: choosing, 1: hw 0 and 1 chunk a thread, 2: hw 1 and 8 chunks */
        if (k) td_kernels_set_hw_stream(k - 1);
        c = tc_open_ctx(m, 1, 2, TD_DTYPE_BF16);
        T_REQUIRE(c != NULL, "context");
        td_ctx_set_stream(c, 1);
        if (k) td_ctx_set_mm_chunks(c, k == 1 ? 1 : 8, 1);
        td_ctx_row_add(c, &r);
        int ok = tc_feed(c, r, seq, 4, lg[k]) == 0;
        for (int i = 4; i < 4 + NSTEP; i++) ok &= tc_feed(c, r, seq + i, 1, lg[k] + (size_t)(i - 4) * V) == 0;
        for (int i = 4 + NSTEP; i + 2 <= NS; i += 2) ok &= tc_feed(c, r, seq + i, 2, lg[k] + (size_t)(i - 4) * V) == 0;
        T_REQUIRE(ok, "forwards (k %d)", k);
        int hw, ch, rc = td_ctx_sched_choice(c, 1, &hw, &ch);
        if (k == 0) {
            T_CHECK(rc == 0 && (hw == -1) == (fixed != 0) && (fixed || hw == 0 || hw == 1) && (ch == 1 || ch == 8),
                    "%d one-token forwards: rc %d, hw %d (fixed %d), chunks %d", NSTEP, rc, hw, fixed, ch);
            T_CHECK(td_ctx_sched_choice(c, 9, &hw, &ch) == -1 && td_ctx_sched_choice(c, 0, &hw, &ch) == -1, "sizes outside 1..8");
            T_CHECK(td_ctx_sched_choice(c, 3, &hw, &ch) == -1, "no forward of 3 tokens yet: no choice");
            td_ctx_set_hw_adapt(c, 0);
            T_CHECK(td_ctx_sched_choice(c, 1, &hw, &ch) == -1 && hw == -1 && ch == 1, "adaptation off: hw %d, chunks %d", hw, ch);
        } else {
            T_CHECK(rc == -1 && hw == -1 && ch == (k == 1 ? 1 : 8), "all fixed (k %d): rc %d, hw %d, chunks %d", k, rc, hw, ch);
        }
        td_kernels_set_hw_stream(-1);
        td_ctx_free(c);
        c = NULL;
    }
    for (int k = 1; k < 3; k++)
        T_CHECK(memcmp(lg[0], lg[k], sizeof(float) * (NS - 4) * V) == 0,
                "logits with the schedule chosen by time differ from those with schedule %d fixed", k);
done:
    td_ctx_free(c);
    for (int k = 0; k < 3; k++) free(lg[k]);
    td_model_free(m);
    t_end();
}

/* The P24 copies (td_model_repack_p24, nn/kernels.h): an act_type bf16 context
 * on a CPU where td_kernels_p24() packs the model's bf16 matrices whose sizes
 * allow it, and its forwards — a prompt, one-token steps, a block of 4 — give
 * exactly the logits of the same forwards with the packed products turned off
 * (td_kernels_set_p24(0): the plain tiles). Elsewhere nothing is packed. */
static void test_p24(const tm_shape *s, const char *dir) {
    t_begin("forward_p24_equals_plain");
    td_model *m = open_model(dir, s);
    td_ctx *c = NULL;
    float *lg[2] = {0};
    T_REQUIRE(m != NULL, "model did not open");
    int V = s->vocab, r;
    enum { NS = 14 }; /* 5 prompt tokens, 5 one-token steps, a block of 4 */
    int32_t seq[NS];
    uint64_t st = 21;
    for (int i = 0; i < NS; i++) seq[i] = (int32_t)(tm_rng(&st) % (uint64_t)V);
    for (int k = 0; k < 2; k++) T_REQUIRE((lg[k] = malloc(sizeof(float) * NS * V)) != NULL, "memory");
    int p24 = td_kernels_p24();
    for (int k = 0; k < 2; k++) { /* k = 0: the packed products, 1: turned off */
        if (k) td_kernels_set_p24(0);
        c = tc_open_ctx(m, 1, 2, TD_DTYPE_BF16);
        T_REQUIRE(c != NULL, "context");
        td_ctx_row_add(c, &r);
        int ok = tc_feed(c, r, seq, 5, lg[k]) == 0;
        for (int i = 5; i < 10; i++) ok &= tc_feed(c, r, seq + i, 1, lg[k] + (size_t)(i - 4) * V) == 0;
        ok &= tc_feed(c, r, seq + 10, 4, lg[k] + (size_t)6 * V) == 0;
        T_REQUIRE(ok, "forwards (k %d)", k);
        td_ctx_free(c);
        c = NULL;
    }
    td_kernels_set_p24(-1);
    const td_tensor *wq = &m->w.layers[0].w_gate;
    T_CHECK((wq->pk != NULL) == (p24 && td_bf16p_packable(wq->shape[0], wq->shape[1])),
            "gate [%lld][%lld]: copy %p where p24 %d", (long long)wq->shape[0], (long long)wq->shape[1], wq->pk, p24);
    T_CHECK(memcmp(lg[0], lg[1], sizeof(float) * 10 * V) == 0, "logits over the P24 copies differ from the plain tiles'");
    { /* products over packed weights cut their ranges on whole panels (the plain rows of a panel cut in
         two would be read from pages a mapped model handed back) */
        int K = (int)wq->shape[1];
        uint16_t *xa = malloc(sizeof(uint16_t) * (size_t)K);
        float *x = calloc((size_t)K, sizeof(float));
        T_REQUIRE(xa && x, "memory");
        const td_tensor *ws[2] = {wq, &m->w.layers[0].w_up};
        td_mm_in in;
        td_mm_plan(&in, TD_DTYPE_BF16, ws, 2, x, K, 1, K, xa, NULL);
        T_CHECK(td_mm_block(&in) == (wq->pk && ws[1]->pk ? TD_P24_ROWS : 8), "bf16 block %d (copies %p %p)", td_mm_block(&in),
                wq->pk, ws[1]->pk);
        td_mm_plan(&in, TD_DTYPE_F32, ws, 2, x, K, 1, K, NULL, NULL);
        T_CHECK(td_mm_block(&in) == 8, "f32 block %d", td_mm_block(&in));
        free(xa);
        free(x);
    }
done:
    td_kernels_set_p24(-1);
    td_ctx_free(c);
    for (int k = 0; k < 2; k++) free(lg[k]);
    td_model_free(m);
    t_end();
}

static void test_bad_batches(const tm_shape *s, const char *dir) {
    t_begin("forward_bad_input");
    td_model *m = open_model(dir, s);
    td_ctx *c = NULL;
    float *lg = NULL;
    T_REQUIRE(m != NULL, "model");
    c = tc_open_ctx(m, 2, 1, TD_DTYPE_F32);
    T_REQUIRE(c != NULL, "ctx");
    lg = malloc(sizeof(float) * 64 * s->vocab);
    int r;
    td_ctx_row_add(c, &r);
    int32_t toks[64] = {0};
    td_err err = {0};
    int n = 3, bad_row = 1;
    td_batch b = {.n_rows = 1, .rows = &bad_row, .n_tokens = &n, .tokens = toks};
    T_CHECK(td_ctx_forward(c, &b, lg, NULL, &err) == TD_EINVAL && strstr(err.msg, "row"), "dead row: %s", err.msg);
    b.rows = &r;
    toks[1] = s->vocab;
    T_CHECK(td_ctx_forward(c, &b, lg, NULL, &err) == TD_ERANGE && strstr(err.msg, "token id"), "token out of range: %s", err.msg);
    toks[1] = 0;
    n = 0;
    T_CHECK(td_ctx_forward(c, &b, lg, NULL, &err) == TD_EINVAL, "zero tokens");
    n = 60;
    T_CHECK(td_ctx_forward(c, &b, lg, NULL, &err) == 0, "60 tokens fit");
    n = 5;
    T_CHECK(td_ctx_forward(c, &b, lg, NULL, &err) == TD_EFULL && strstr(err.msg, "context"), "context overflow: %s", err.msg);
    T_CHECK(td_ctx_row_len(c, r) == 60, "failed forward must not change the row");
    int tap = s->layers + 1;
    n = 1;
    b.taps = &tap; b.n_taps = 1;
    T_CHECK(td_ctx_forward(c, &b, lg, lg, &err) == TD_ERANGE, "tap out of range");
    int r2;
    T_CHECK(td_ctx_row_add(c, &r2) == 0 && td_ctx_row_add(c, &r2) == TD_EFULL, "row capacity");
done:
    free(lg);
    td_ctx_free(c);
    td_model_free(m);
    t_end();
}

/* taps: the residual stream after l layers equals the embeddings for l = 0 and
 * is the same bits in any batch. */
static void test_taps(const tm_shape *s, const char *dir) {
    t_begin("forward_taps");
    td_model *m = open_model(dir, s);
    td_ctx *c = NULL;
    float *lg = NULL, *tp = NULL, *tp2 = NULL;
    T_REQUIRE(m != NULL, "model");
    c = tc_open_ctx(m, 1, 2, TD_DTYPE_F32);
    T_REQUIRE(c != NULL, "ctx");
    lg = malloc(sizeof(float) * 64 * s->vocab);
    tp = malloc(sizeof(float) * 64 * 3 * s->hidden);
    tp2 = malloc(sizeof(float) * 64 * 3 * s->hidden);
    int r;
    td_ctx_row_add(c, &r);
    int32_t toks[6] = {3, 1, 4, 1, 5, 9};
    int taps[3] = {0, 1, s->layers};
    uint8_t want[6] = {1, 1, 1, 1, 1, 1};
    int n = 6;
    td_batch b = {.n_rows = 1, .rows = &r, .n_tokens = &n, .tokens = toks, .want = want, .taps = taps, .n_taps = 3};
    td_err err = {0};
    T_REQUIRE(td_ctx_forward(c, &b, lg, tp, &err) == 0, "forward: %s", err.msg);
    /* embedding row of token 3 (f32 storage) */
    T_CHECK(tp[0] != 0.0f, "tap 0 written");
    T_CHECK(memcmp(tp + 0, tp + 3 * s->hidden, sizeof(float) * s->hidden) != 0, "tap 0 of different tokens differs");
    T_CHECK(memcmp(tp + (size_t)1 * 3 * s->hidden, tp + (size_t)3 * 3 * s->hidden, sizeof(float) * s->hidden) == 0,
            "token 1 at positions 1 and 3 has the same embedding tap");
    td_ctx_row_trim(c, r, 5);
    n = 1;
    b.tokens = toks + 5;
    T_REQUIRE(td_ctx_forward(c, &b, lg, tp2, &err) == 0, "step: %s", err.msg);
    T_CHECK(memcmp(tp + (size_t)5 * 3 * s->hidden, tp2, sizeof(float) * 3 * s->hidden) == 0, "taps differ between T=6 and T=1");
done:
    free(lg); free(tp); free(tp2);
    td_ctx_free(c);
    td_model_free(m);
    t_end();
}

/* Taps alone (skip_logits): max_logits bounds the positions with logits, not
 * those with taps, so a prompt's taps come in chunks of max_tokens (the
 * speculative group's prefill). A forward of 20 tapped positions on a context
 * of max_logits 4 succeeds, and its taps are the bits of 20 one-token
 * forwards; wanting logits at those 20 positions is still refused. */
static void test_taps_past_max_logits(const tm_shape *s, const char *dir) {
    t_begin("forward_taps_past_max_logits");
    td_model *m = open_model(dir, s);
    td_ctx *c = NULL;
    float *tp = NULL, *tp1 = NULL, *lg = NULL;
    T_REQUIRE(m != NULL, "model");
    td_ctx_params p = td_ctx_default_params();
    p.max_rows = 2; p.max_ctx = 64; p.max_tokens = 32; p.max_logits = 4; p.n_threads = 2; p.act_type = tc_act;
    td_err err = {0};
    T_REQUIRE(td_ctx_open(&c, m, &p, &err) == 0, "ctx: %s", err.msg);
    enum { N = 20 };
    int taps[2] = {1, s->layers};
    size_t tr = (size_t)2 * s->hidden; /* floats of one position's taps */
    tp = malloc(sizeof(float) * N * tr);
    tp1 = malloc(sizeof(float) * N * tr);
    lg = malloc(sizeof(float) * N * s->vocab);
    T_REQUIRE(tp && tp1 && lg, "alloc");
    int32_t toks[N];
    uint8_t want[N];
    for (int i = 0; i < N; i++) toks[i] = (int32_t)((i * 7 + 3) % s->vocab), want[i] = 1;
    int r0, r1, n = N;
    T_REQUIRE(td_ctx_row_add(c, &r0) == 0 && td_ctx_row_add(c, &r1) == 0, "rows");
    td_batch b = {.n_rows = 1, .rows = &r0, .n_tokens = &n, .tokens = toks, .want = want, .taps = taps, .n_taps = 2, .skip_logits = 1};
    T_REQUIRE(td_ctx_forward(c, &b, NULL, tp, &err) == 0, "20 tapped positions with max_logits 4: %s", err.msg);
    T_CHECK(td_ctx_row_len(c, r0) == N, "row holds the 20 positions");
    int one = 1;
    for (int i = 0; i < N; i++) {
        td_batch b1 = {.n_rows = 1, .rows = &r1, .n_tokens = &one, .tokens = toks + i, .want = want, .taps = taps, .n_taps = 2, .skip_logits = 1};
        T_REQUIRE(td_ctx_forward(c, &b1, NULL, tp1 + (size_t)i * tr, &err) == 0, "step %d: %s", i, err.msg);
    }
    T_CHECK(memcmp(tp, tp1, sizeof(float) * N * tr) == 0, "taps of one forward of 20 differ from 20 one-token forwards");
    T_CHECK(tp[(size_t)(N - 1) * tr + s->hidden] != 0.0f, "last position's last tap written");
    td_ctx_row_trim(c, r0, 0);
    b.skip_logits = 0;
    T_CHECK(td_ctx_forward(c, &b, lg, tp, &err) == TD_ERANGE && strstr(err.msg, "max_logits"), "logits past max_logits: %s", err.msg);
    T_CHECK(td_ctx_row_len(c, r0) == 0, "refused forward leaves the row");
done:
    free(tp); free(tp1); free(lg);
    td_ctx_free(c);
    td_model_free(m);
    t_end();
}

/* act_type amx. Where the machine has AMX-BF16 tiles: on a bf16 model whose
 * widths are multiples of 32 except the down projection's (100: it takes the
 * bf16 order), the logits move from f32's by no more than bf16 activations
 * allow, and an f32 model's not at all. Where it has none: td_ctx_open refuses
 * the type with TD_EUNSUPPORTED and a message. */
static void test_act_amx(const tm_shape *sa, const char *da, const tm_shape *sf, const char *df) {
    t_begin("act_type_amx");
    T_CHECK(td_act_type_parse("amx") == TD_ACT_AMX && !strcmp(td_act_type_name(TD_ACT_AMX), "amx"), "amx name");
    int want = td_amx_available() ? TD_ACT_AMX : td_kernels_bf16_native() ? TD_DTYPE_BF16 : TD_DTYPE_F32;
    T_CHECK(td_act_type_parse("auto") == want && td_act_type_parse("Auto") == -1,
            "auto: amx where the tiles are, else bf16 where vdpbf16ps is native, else f32 (%d, want %d)",
            td_act_type_parse("auto"), want);
    td_model *ma = open_model(da, sa), *mf = open_model(df, sf);
    T_REQUIRE(ma && mf, "models");
    if (!td_amx_available()) {
        td_ctx_params p = td_ctx_default_params();
        p.act_type = TD_ACT_AMX;
        td_err err = {0};
        td_ctx *bad = NULL;
        T_CHECK(td_ctx_open(&bad, ma, &p, &err) == TD_EUNSUPPORTED && !bad && strstr(err.msg, "AMX"),
                "amx without tiles: %d %s", bad != NULL, err.msg);
        printf("  (no AMX-BF16 tiles here: act_type amx refused, as it should be)\n");
        goto done;
    }
    T_REQUIRE(check_act_moves(ma, sa->vocab, mf, sf->vocab, TD_ACT_AMX, 17) == 0, "amx");
done:
    td_model_free(ma);
    td_model_free(mf);
    t_end();
}

int main(void) {
    char tmpl[] = "/tmp/td_fwd_XXXXXX";
    char *dir = mkdtemp(tmpl);
    if (!dir) return 1;
    char d1[512], d2[512], d3[512], d4[512], d5[512], d6[512], d7[512], d8[512], d9[512];
    snprintf(d1, sizeof d1, "%s/qwen", dir);
    snprintf(d2, sizeof d2, "%s/llama", dir);
    snprintf(d3, sizeof d3, "%s/qwenf32", dir);
    snprintf(d4, sizeof d4, "%s/qwenamx", dir);
    snprintf(d5, sizeof d5, "%s/qwenamxkv", dir);
    snprintf(d6, sizeof d6, "%s/qwenhd32", dir);
    snprintf(d7, sizeof d7, "%s/qwenkv4", dir);
    snprintf(d8, sizeof d8, "%s/qwena32", dir);
    snprintf(d9, sizeof d9, "%s/qwenff128", dir);
    tm_shape q = {.llama = 0, .vocab = 301, .hidden = 72, .layers = 2, .heads = 4, .kv_heads = 2, .head_dim = 18,
                  .ffn = 100, .ctx = 128, .tied = 1, .bf16 = 1, .seed = 1};
    tm_shape l = {.llama = 1, .vocab = 257, .hidden = 80, .layers = 3, .heads = 5, .kv_heads = 1, .head_dim = 16,
                  .ffn = 136, .ctx = 128, .tied = 0, .bf16 = 0, .seed = 2};
    tm_shape qf = q;
    qf.bf16 = 0; qf.seed = 3;
    /* widths the AMX tiles take (multiples of 32), but the down projection's (100)
     * and an output count (301) that is not a multiple of 16 */
    tm_shape qa = {.llama = 0, .vocab = 301, .hidden = 64, .layers = 2, .heads = 4, .kv_heads = 2, .head_dim = 16,
                   .ffn = 100, .ctx = 128, .tied = 1, .bf16 = 1, .seed = 4};
    for (int kv = 0; kv < 3; kv++) { /* TD_DTYPE_F32, F16, BF16: every KV cache type */
        test_invariance("batch_invariance_qwen3_bf16", &q, d1, kv);
        test_invariance("batch_invariance_llama_f32", &l, d2, kv);
        test_rollback(&q, d1, kv);
    }
    /* four kv heads: with two threads each takes two of them in the fused
     * attention job (contiguous heads, those its q/k/v share computed), with
     * three they are dealt round-robin; the same bits either way */
    tm_shape g4 = {.llama = 0, .vocab = 301, .hidden = 64, .layers = 2, .heads = 8, .kv_heads = 4, .head_dim = 16,
                   .ffn = 100, .ctx = 128, .tied = 1, .bf16 = 1, .seed = 7};
    for (int kv = 0; kv < 3; kv += 2) test_invariance("batch_invariance_qwen3_kv4", &g4, d7, kv);
    test_copied(&q, d1);
    test_copied(&l, d2);
    test_kv_types(&q, d1);
    /* a q8_0 cache: head_dim 32 (one block), a GQA group of 3; the invariances
     * and the rollback as for every type, with f32 and bf16 activations */
    tm_shape q8 = {.llama = 0, .vocab = 301, .hidden = 72, .layers = 2, .heads = 3, .kv_heads = 1, .head_dim = 32,
                   .ffn = 100, .ctx = 128, .tied = 1, .bf16 = 1, .seed = 6};
    test_kv_q8(&q8, d6);
    test_invariance("batch_invariance_qwen3_bf16_hd32", &q8, d6, TD_DTYPE_Q8_0);
    test_rollback(&q8, d6, TD_DTYPE_Q8_0);
    tc_act = TD_DTYPE_BF16;
    test_invariance("batch_invariance_qwen3_bf16_hd32", &q8, d6, TD_DTYPE_Q8_0);
    tc_act = TD_DTYPE_F32;
    /* act_type bf16 (the bf16 model's products take bf16 activations): the same
     * invariances, with an f32 and a bf16 KV cache */
    tc_act = TD_DTYPE_BF16;
    for (int kv = 0; kv < 3; kv += 2) {
        test_invariance("batch_invariance_qwen3_bf16", &q, d1, kv);
        test_rollback(&q, d1, kv);
    }
    test_hw_adapt(&q, d1);
    tc_act = TD_DTYPE_F32;
    test_hw_adapt(&q, d1);
    tc_act = TD_DTYPE_BF16;
    /* head_dim 32 and a bf16 cache: attention in the A32 order (td_attend_b32,
     * bf16 queries and probabilities); a GQA group of 3, so a block of 7 tokens
     * is 21 queries a kv head, more than one call's 16 */
    tm_shape qb = qa;
    qb.heads = 6; qb.head_dim = 32; qb.seed = 8;
    test_invariance("batch_invariance_qwen3_bf16_a32", &qb, d8, TD_DTYPE_BF16);
    test_rollback(&qb, d8, TD_DTYPE_BF16);
    /* an ffn of 128: the down projection's input converted by the gate/up job's
     * chunks, each its own columns (2 threads: 64 each), or by the caller where
     * the chunks' columns are not whole blocks of 32 (3 threads, 7 chunks a
     * thread); every count gives the bits of one-thread T=1 steps */
    tm_shape qd = qa;
    qd.ffn = 128; qd.seed = 9;
    test_invariance("batch_invariance_qwen3_bf16_ff128", &qd, d9, TD_DTYPE_BF16);
    test_p24(&qd, d9);
    tc_act = TD_DTYPE_F32;
    test_act_types(&q, d1, &qf, d3);
    /* act_type amx, where the tiles exist: the same invariances */
    test_act_amx(&qa, d4, &qf, d3);
    if (td_amx_available()) {
        tc_act = TD_ACT_AMX;
        for (int kv = 0; kv < 3; kv += 2) {
            test_invariance("batch_invariance_qwen3_bf16w32", &qa, d4, kv);
            test_rollback(&qa, d4, kv);
        }
        /* head_dim 32 and a bf16 cache: K/V in the tiles' pair layouts and
         * attention on the tiles (td_amx_attend_rows); a GQA group of 3, so a
         * block of 7 tokens is 21 queries a kv head, more than one tile's 16 */
        tm_shape qt = qa;
        qt.heads = 6; qt.head_dim = 32; qt.seed = 5;
        test_invariance("batch_invariance_qwen3_bf16w32_kvtile", &qt, d5, TD_DTYPE_BF16);
        test_invariance("batch_invariance_qwen3_bf16w32_ff128", &qd, d9, TD_DTYPE_BF16);
        test_rollback(&qt, d5, TD_DTYPE_BF16);
        tc_act = TD_DTYPE_F32;
    }
    test_bad_batches(&qf, d3);
    test_taps(&qf, d3);
    test_taps_past_max_logits(&qf, d3);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) return 1;
    return t_exit();
}
