#define _GNU_SOURCE
/* test_block — the block drafter against its PyTorch reference
 * (tests/fixtures/tiny-code-block, made by tools/train/stage4), and its input
 * checks.
 *   - rounds: for 3 prompts, 6 greedy speculative rounds driven through the
 *     draft contract directly (prefill taps -> append, draft at depth
 *     block_size-1 with the drafter's confidence pruning, target verify with
 *     taps, commit): per round the number of drafts, the drafts, the target's
 *     greedy tokens and the accepted count m equal the reference's; after round
 *     2 a captured checkpoint restored into a fresh group drafts round 3's drafts;
 *   - logits: the unpruned round-0 block of each prompt (prune=off) drafted with
 *     q at temperature 0.5: each position's q equals softmax(reference logits
 *     / 0.5) within 1e-3 relative (a position is compared when the
 *     sampled previous draft equals the reference's greedy one, since the
 *     Markov bias reads it; seeds are tried until every position is compared);
 *   - refusals: a drafter trained for another target (layers, hidden size,
 *     vocabulary, a tap layer out of range), malformed config.json values, a
 *     truncated weight file, bad checkpoints (namespace, size, non-finite). */
#include "tandem.h"
#include "t.h"
#include "spec/draft.h"
#include "tspec.h"
#include "nn/amx.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <sys/stat.h>
#include <unistd.h>

#define FX "tests/fixtures/tiny-code-block"
#define BLK "models/tiny-code/block"
#define MAXK 16

static int32_t argmax(const float *x, int n) {
    int32_t b = 0;
    for (int i = 1; i < n; i++) if (x[i] > x[b]) b = i;
    return b;
}

static td_model *g_m;
static td_ctx *g_c;
static float *g_logits, *g_taps;
static int g_V, g_D;

/* Prefill S[0..n) through the target with the drafter's taps and append it. */
static int prefill_row(td_drafter *d, td_draft_rows *rows, int *row, const int32_t *S, int n, td_err *err) {
    const int *tl;
    int nt = td_drafter_taps(d, &tl);
    uint8_t ones[256];
    memset(ones, 1, sizeof ones);
    td_ctx_row_add(g_c, row);
    td_batch pb = {.n_rows = 1, .rows = row, .n_tokens = &n, .tokens = S, .want = ones, .taps = tl, .n_taps = nt, .skip_logits = 1};
    int rc = td_ctx_forward(g_c, &pb, NULL, g_taps, err);
    return rc ? rc : td_draft_rows_append(rows, S, n, g_taps, NULL, err);
}

/* Greedy drafts of the one row of rows after pending token t, at depth K. */
static int draft_one(td_draft_rows *rows, int32_t t, int K, int32_t *out, int *n_out, td_err *err) {
    td_sampling sp = td_sampling_default();
    const td_sampling *spp = &sp;
    uint64_t pos = 0;
    int depth = K;
    td_draft_req q = {.n_rows = 1, .pending = &t, .depth = &depth, .max_depth = K, .tokens = out, .n_tokens = n_out,
                      .sampling = &spp, .out_pos = &pos};
    return td_draft_rows_draft(rows, &q, err);
}

/* Capture row `row` of rows, restore it into a fresh one-row group of d and
 * draft there at depth K from pending t (greedy): drafts -> out[0..*n_out). */
static int restored_draft(td_drafter *d, td_draft_rows *rows, int row, int K, int32_t t, int32_t *out, int *n_out,
                          td_err *err) {
    td_draft_rows other = {0};
    td_draft_checkpoint *ck = NULL;
    int rc = rows->vt->capture(rows->self, row, &ck, err);
    if (!rc) rc = d->vt->open_rows(d->self, 1, 240, K, g_c, &other, err);
    if (!rc) rc = td_draft_rows_append(&other, NULL, 0, NULL, ck, err);
    td_draft_checkpoint_free(ck);
    if (!rc) rc = draft_one(&other, t, K, out, n_out, err);
    td_draft_rows_free(&other);
    return rc;
}

static void test_rounds(cJSON *fx) {
    t_begin("block_matches_pytorch_reference");
    td_drafter *d = NULL;
    td_draft_rows rows = {0};
    td_err err = {0};
    T_REQUIRE(td_drafter_open(&d, "block:" BLK, g_m, &err) == 0, "block: %s", err.msg);
    int K = cJSON_GetObjectItem(fx, "block_size")->valueint - 1;
    T_REQUIRE(K >= 1 && K < MAXK, "block size");
    const int *tl;
    int nt = td_drafter_taps(d, &tl);
    uint8_t ones[256];
    memset(ones, 1, sizeof ones);
    int rounds_ok = 0, rounds_total = 0, ckpt_checked = 0, pruned_rounds = 0;
    cJSON *p;
    cJSON_ArrayForEach(p, cJSON_GetObjectItem(fx, "prompts")) {
        cJSON *ids = cJSON_GetObjectItem(p, "prompt_ids");
        int N = cJSON_GetArraySize(ids);
        int32_t S[256];
        for (int i = 0; i < N; i++) S[i] = cJSON_GetArrayItem(ids, i)->valueint;
        int n = N - 1, row;
        int32_t t = S[N - 1];
        T_REQUIRE(d->vt->open_rows(d->self, 1, 240, K, g_c, &rows, &err) == 0, "open rows: %s", err.msg);
        T_REQUIRE(prefill_row(d, &rows, &row, S, n, &err) == 0, "prefill: %s", err.msg);
        cJSON *r;
        cJSON_ArrayForEach(r, cJSON_GetObjectItem(p, "rounds")) {
            rounds_total++;
            int ok = cJSON_GetObjectItem(r, "S_len")->valueint == n && cJSON_GetObjectItem(r, "t")->valueint == t;
            int nd = 0;
            int32_t drafts[MAXK];
            T_REQUIRE(draft_one(&rows, t, K, drafts, &nd, &err) == 0, "draft: %s", err.msg);
            cJSON *fd = cJSON_GetObjectItem(r, "drafts");
            ok &= nd == cJSON_GetArraySize(fd);
            for (int j = 0; ok && j < nd; j++) ok &= drafts[j] == cJSON_GetArrayItem(fd, j)->valueint;
            pruned_rounds += nd < K;
            int32_t win[MAXK + 1];
            win[0] = t;
            memcpy(win + 1, drafts, sizeof(int32_t) * (size_t)nd);
            int nw = nd + 1;
            td_batch vb = {.n_rows = 1, .rows = &row, .n_tokens = &nw, .tokens = win, .want = ones, .taps = tl, .n_taps = nt};
            T_REQUIRE(td_ctx_forward(g_c, &vb, g_logits, g_taps, &err) == 0, "verify: %s", err.msg);
            int32_t tg[MAXK + 1];
            cJSON *ftg = cJSON_GetObjectItem(r, "target_greedy");
            for (int i = 0; i <= nd; i++) {
                tg[i] = argmax(g_logits + (size_t)i * g_V, g_V);
                ok &= i < cJSON_GetArraySize(ftg) && tg[i] == cJSON_GetArrayItem(ftg, i)->valueint;
            }
            int mm = 0;
            while (mm < nd && tg[mm] == drafts[mm]) mm++;
            ok &= mm == cJSON_GetObjectItem(r, "m")->valueint;
            if (!ok) printf("  prompt %s round %d differs (%d drafts)\n", cJSON_GetObjectItem(p, "id")->valuestring,
                            cJSON_GetObjectItem(r, "round")->valueint, nd);
            rounds_ok += ok;
            td_draft_commit cm = {.old_pending = t, .accepted = drafts, .n_accepted = mm, .new_pending = tg[mm], .taps = g_taps};
            T_REQUIRE(td_draft_rows_commit(&rows, &cm, &err) == 0, "commit: %s", err.msg);
            td_ctx_row_trim(g_c, row, n + 1 + mm);
            S[n] = t;
            memcpy(S + n + 1, drafts, sizeof(int32_t) * (size_t)mm);
            n += 1 + mm;
            t = tg[mm];
            if (cJSON_GetObjectItem(r, "round")->valueint == 2) {
                /* a checkpoint restored into a fresh group drafts round 3's drafts */
                int32_t b2[MAXK];
                int nb2 = 0;
                T_REQUIRE(restored_draft(d, &rows, 0, K, t, b2, &nb2, &err) == 0, "restore and draft: %s", err.msg);
                cJSON *next = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(p, "rounds"), 3), "drafts");
                int same = nb2 == cJSON_GetArraySize(next);
                for (int j = 0; same && j < nb2; j++) same = b2[j] == cJSON_GetArrayItem(next, j)->valueint;
                T_CHECK(same, "restored block row drafts differently from the reference");
                ckpt_checked++;
            }
        }
        td_draft_rows_free(&rows);
        td_ctx_row_remove(g_c, row);
    }
    printf("  %d of %d rounds identical (number of drafts, drafts, target tokens, m); %d rounds pruned below %d\n",
           rounds_ok, rounds_total, pruned_rounds, K);
    T_CHECK(rounds_total == 18 && rounds_ok == rounds_total, "rounds identical: %d of %d", rounds_ok, rounds_total);
    T_CHECK(pruned_rounds > 0, "the reference rounds exercise pruning");
    T_CHECK(ckpt_checked == 3, "checkpoint round trips: %d of 3", ckpt_checked);
done:
    td_draft_rows_free(&rows);
    td_drafter_free(d);
    t_end();
}

/* Under act_type amx (where the machine has the tiles) the drafter's attention
 * and, with quant=q8_0, its products of 3+ entries run on the tiles (bf16
 * attention, int8 copies); under act_type bf16 its products take bf16 inputs
 * (B32, or R16 with quant=q8_0): its drafts may move a little against the
 * float32 reference but must stay close. The rounds follow the reference's trajectory
 * (its drafts verified, its m committed); this round's own drafts are compared
 * with the reference's: the first draft and the drafts position by position.
 * A row restored from a checkpoint (its bf16 keys and values rebuilt from the
 * f32 ones) drafts exactly as the original. */
static void test_rounds_act(cJSON *fx, const char *spec, const char *name, int act) {
    t_begin(name);
    td_drafter *d = NULL;
    td_draft_rows rows = {0};
    td_err err = {0};
    td_ctx *c_f32 = g_c, *ca = NULL;
    td_ctx_params cp = td_ctx_default_params();
    cp.max_ctx = 256;
    cp.max_tokens = 128;
    cp.max_logits = 128;
    cp.act_type = act;
    T_REQUIRE(td_ctx_open(&ca, g_m, &cp, &err) == 0, "%s context: %s", td_act_type_name(act), err.msg);
    g_c = ca; /* prefill_row and restored_draft run on it */
    T_REQUIRE(td_drafter_open(&d, spec, g_m, &err) == 0, "%s: %s", spec, err.msg);
    int K = cJSON_GetObjectItem(fx, "block_size")->valueint - 1;
    const int *tl;
    int nt = td_drafter_taps(d, &tl);
    uint8_t ones[256];
    memset(ones, 1, sizeof ones);
    int rounds = 0, first_same = 0, pos_same = 0, pos_all = 0, restored = 0, restored_same = 0;
    cJSON *p;
    cJSON_ArrayForEach(p, cJSON_GetObjectItem(fx, "prompts")) {
        cJSON *ids = cJSON_GetObjectItem(p, "prompt_ids");
        int N = cJSON_GetArraySize(ids), row;
        int32_t S[256], want_next[MAXK];
        int n_want_next = -1;
        for (int i = 0; i < N; i++) S[i] = cJSON_GetArrayItem(ids, i)->valueint;
        int n = N - 1;
        int32_t t = S[N - 1];
        T_REQUIRE(d->vt->open_rows(d->self, 1, 240, K, ca, &rows, &err) == 0, "open rows: %s", err.msg);
        T_REQUIRE(prefill_row(d, &rows, &row, S, n, &err) == 0, "prefill: %s", err.msg);
        cJSON *r;
        cJSON_ArrayForEach(r, cJSON_GetObjectItem(p, "rounds")) {
            T_REQUIRE(cJSON_GetObjectItem(r, "S_len")->valueint == n && cJSON_GetObjectItem(r, "t")->valueint == t,
                      "the reference's trajectory");
            int nd = 0;
            int32_t drafts[MAXK];
            T_REQUIRE(draft_one(&rows, t, K, drafts, &nd, &err) == 0, "draft: %s", err.msg);
            if (n_want_next >= 0) { /* the restored row's drafts of this round */
                restored++;
                restored_same += nd == n_want_next && !memcmp(drafts, want_next, sizeof(int32_t) * (size_t)nd);
                n_want_next = -1;
            }
            cJSON *fd = cJSON_GetObjectItem(r, "drafts");
            int nr = cJSON_GetArraySize(fd), m = cJSON_GetObjectItem(r, "m")->valueint;
            int32_t win[MAXK + 1];
            win[0] = t;
            for (int j = 0; j < nr && j < MAXK; j++) win[j + 1] = cJSON_GetArrayItem(fd, j)->valueint;
            rounds++;
            first_same += nd > 0 && nr > 0 && drafts[0] == win[1];
            for (int j = 0; j < nr; j++) pos_same += j < nd && drafts[j] == win[j + 1];
            pos_all += nr;
            /* verify the reference's window, commit the reference's m */
            int nw = nr + 1;
            td_batch vb = {.n_rows = 1, .rows = &row, .n_tokens = &nw, .tokens = win, .want = ones, .taps = tl, .n_taps = nt};
            T_REQUIRE(m >= 0 && m <= nr && nr <= MAXK, "reference round");
            T_REQUIRE(td_ctx_forward(ca, &vb, g_logits, g_taps, &err) == 0, "verify: %s", err.msg);
            int32_t next = cJSON_GetArrayItem(cJSON_GetObjectItem(r, "target_greedy"), m)->valueint;
            td_draft_commit cm = {.old_pending = t, .accepted = win + 1, .n_accepted = m, .new_pending = next, .taps = g_taps};
            T_REQUIRE(td_draft_rows_commit(&rows, &cm, &err) == 0, "commit: %s", err.msg);
            td_ctx_row_trim(ca, row, n + 1 + m);
            S[n] = t;
            memcpy(S + n + 1, win + 1, sizeof(int32_t) * (size_t)m);
            n += 1 + m;
            t = next;
            if (cJSON_GetObjectItem(r, "round")->valueint == 2) /* the next round's drafts, from a restored row */
                T_REQUIRE(restored_draft(d, &rows, 0, K, t, want_next, &n_want_next, &err) == 0, "restore: %s", err.msg);
        }
        td_draft_rows_free(&rows);
        td_ctx_row_remove(ca, row);
    }
    printf("  %s: first draft as the reference's in %d of %d rounds, %d of %d reference drafts matched in place; "
           "%d of %d restored rows drafted as the original\n", spec, first_same, rounds, pos_same, pos_all, restored_same, restored);
    T_CHECK(rounds == 18 && first_same >= 16, "first drafts: %d of %d as the reference's", first_same, rounds);
    T_CHECK(pos_all > 0 && pos_same * 10 >= pos_all * 8, "drafts in place: %d of %d", pos_same, pos_all);
    T_CHECK(restored == 3 && restored_same == restored, "restored rows: %d of %d draft as the original", restored_same, restored);
done:
    g_c = c_f32;
    td_draft_rows_free(&rows);
    td_drafter_free(d);
    td_ctx_free(ca);
    t_end();
}

/* Two greedy rounds of prompt S[0..N) (its last token the anchor) in rows, the
 * first round's drafts all committed (verified through the target for their
 * taps): the drafts of both rounds -> out[2][MAXK], counts -> nout[2]. The
 * target row is removed again; the drafter's row stays. */
static int two_rounds(td_drafter *d, td_draft_rows *rows, const int32_t *S, int N, int K, int32_t out[2][MAXK],
                      int nout[2], td_err *err) {
    const int *tl;
    int nt = td_drafter_taps(d, &tl), row, rc;
    uint8_t ones[256];
    memset(ones, 1, sizeof ones);
    int32_t t = S[N - 1];
    if ((rc = prefill_row(d, rows, &row, S, N - 1, err)) != 0) return rc;
    if ((rc = draft_one(rows, t, K, out[0], &nout[0], err)) != 0) return rc;
    int32_t win[MAXK + 1];
    win[0] = t;
    memcpy(win + 1, out[0], sizeof(int32_t) * (size_t)nout[0]);
    int nw = nout[0] + 1;
    td_batch vb = {.n_rows = 1, .rows = &row, .n_tokens = &nw, .tokens = win, .want = ones, .taps = tl, .n_taps = nt};
    if ((rc = td_ctx_forward(g_c, &vb, g_logits, g_taps, err)) != 0) return rc;
    int32_t next = argmax(g_logits + (size_t)nout[0] * g_V, g_V);
    td_draft_commit cm = {.old_pending = t, .accepted = win + 1, .n_accepted = nout[0], .new_pending = next, .taps = g_taps};
    if ((rc = td_draft_rows_commit(rows, &cm, err)) != 0) return rc;
    rc = draft_one(rows, next, K, out[1], &nout[1], err);
    td_ctx_row_remove(g_c, row);
    return rc;
}

/* A row that joins after another left takes the leaver's buffers (their pages
 * already mapped); what it drafts must not depend on that: two rounds of
 * prompt B in a group where prompt A drafted, committed and left equal the
 * same rounds in a fresh group, token for token. */
static void test_row_reuse(cJSON *fx) {
    t_begin("block_row_after_a_leaver_drafts_as_fresh");
    td_drafter *d = NULL;
    td_draft_rows used = {0}, fresh = {0};
    td_err err = {0};
    T_REQUIRE(td_drafter_open(&d, "block:" BLK ",prune=off", g_m, &err) == 0, "block: %s", err.msg);
    int K = cJSON_GetObjectItem(fx, "block_size")->valueint - 1;
    cJSON *ps = cJSON_GetObjectItem(fx, "prompts");
    int32_t A[256], B[256];
    int NA = cJSON_GetArraySize(cJSON_GetObjectItem(cJSON_GetArrayItem(ps, 0), "prompt_ids"));
    int NB = cJSON_GetArraySize(cJSON_GetObjectItem(cJSON_GetArrayItem(ps, 1), "prompt_ids"));
    T_REQUIRE(NA > NB && NB > 1, "fixture prompts: the first longer than the second");
    for (int i = 0; i < NA; i++) A[i] = cJSON_GetArrayItem(cJSON_GetObjectItem(cJSON_GetArrayItem(ps, 0), "prompt_ids"), i)->valueint;
    for (int i = 0; i < NB; i++) B[i] = cJSON_GetArrayItem(cJSON_GetObjectItem(cJSON_GetArrayItem(ps, 1), "prompt_ids"), i)->valueint;
    int32_t oa[2][MAXK], ou[2][MAXK], of[2][MAXK];
    int na[2], nu[2], nf[2];
    T_REQUIRE(d->vt->open_rows(d->self, 1, 240, K, g_c, &used, &err) == 0, "open rows: %s", err.msg);
    T_REQUIRE(two_rounds(d, &used, A, NA, K, oa, na, &err) == 0, "prompt A: %s", err.msg);
    td_draft_rows_filter(&used, NULL, 0); /* A leaves */
    T_REQUIRE(two_rounds(d, &used, B, NB, K, ou, nu, &err) == 0, "prompt B after A: %s", err.msg);
    T_REQUIRE(d->vt->open_rows(d->self, 1, 240, K, g_c, &fresh, &err) == 0, "open rows: %s", err.msg);
    T_REQUIRE(two_rounds(d, &fresh, B, NB, K, of, nf, &err) == 0, "prompt B fresh: %s", err.msg);
    for (int r = 0; r < 2; r++) {
        T_CHECK(nu[r] == K && nf[r] == K, "round %d: %d and %d drafts (prune=off drafts %d)", r, nu[r], nf[r], K);
        T_CHECK(nu[r] == nf[r] && !memcmp(ou[r], of[r], sizeof(int32_t) * (size_t)nf[r]),
                "round %d: prompt B drafts differently after a leaver than fresh", r);
    }
done:
    td_draft_rows_free(&used);
    td_draft_rows_free(&fresh);
    td_drafter_free(d);
    t_end();
}

/* Round 0 of a fixture prompt: opens a one-row group of d, prefills it with
 * the prompt less its last token (*t, the anchor) and returns round 0's
 * logits_rows and drafts_unpruned (each K long). */
static int round0_row(td_drafter *d, cJSON *p, int K, td_draft_rows *rows, int *row, int32_t *t, cJSON **lr, cJSON **du,
                      td_err *err) {
    cJSON *ids = cJSON_GetObjectItem(p, "prompt_ids");
    int N = cJSON_GetArraySize(ids);
    int32_t S[256];
    if (N < 2 || N > 256) { snprintf(err->msg, sizeof err->msg, "prompt of %d tokens", N); return TD_EFORMAT; }
    for (int i = 0; i < N; i++) S[i] = cJSON_GetArrayItem(ids, i)->valueint;
    cJSON *r0 = cJSON_GetArrayItem(cJSON_GetObjectItem(p, "rounds"), 0);
    *lr = cJSON_GetObjectItem(r0, "logits_rows");
    *du = cJSON_GetObjectItem(r0, "drafts_unpruned");
    if (cJSON_GetArraySize(*lr) != K || cJSON_GetArraySize(*du) != K) {
        snprintf(err->msg, sizeof err->msg, "round 0 carries %d logits rows and %d drafts, not %d", cJSON_GetArraySize(*lr),
                 cJSON_GetArraySize(*du), K);
        return TD_EFORMAT;
    }
    *t = S[N - 1];
    int rc = d->vt->open_rows(d->self, 1, 240, K, g_c, rows, err);
    return rc ? rc : prefill_row(d, rows, row, S, N - 1, err);
}

static void test_logits(cJSON *fx) {
    t_begin("block_logits_match_pytorch");
    td_drafter *d = NULL;
    td_draft_rows rows = {0};
    td_err err = {0};
    float *probs = NULL, *flog = NULL;
    size_t fbytes = 0;
    flog = (float *)t_slurp(FX "/logits.f32", &fbytes);
    T_REQUIRE(flog, "missing " FX "/logits.f32");
    T_REQUIRE(td_drafter_open(&d, "block:" BLK ",prune=off", g_m, &err) == 0, "block: %s", err.msg);
    int K = cJSON_GetObjectItem(fx, "block_size")->valueint - 1;
    probs = malloc(sizeof(float) * (size_t)K * g_V);
    T_REQUIRE(probs, "memory");
    double worst = 0;
    int compared = 0, wanted = 0;
    cJSON *p;
    cJSON_ArrayForEach(p, cJSON_GetObjectItem(fx, "prompts")) {
        int row;
        int32_t t;
        cJSON *lr, *du;
        T_REQUIRE(round0_row(d, p, K, &rows, &row, &t, &lr, &du, &err) == 0, "round 0 of prompt %s: %s",
                  cJSON_GetObjectItem(p, "id")->valuestring, err.msg);
        int seen[MAXK] = {0};
        wanted += K;
        /* greedy first: the unpruned drafts equal the reference's */
        {
            td_sampling sp = td_sampling_default();
            const td_sampling *spp = &sp;
            uint64_t pos = 0;
            int depth = K, nd = 0;
            int32_t dr[MAXK];
            td_draft_req q = {.n_rows = 1, .pending = &t, .depth = &depth, .max_depth = K, .tokens = dr,
                              .n_tokens = &nd, .sampling = &spp, .out_pos = &pos};
            T_REQUIRE(td_draft_rows_draft(&rows, &q, &err) == 0, "draft");
            int same = nd == K;
            for (int j = 0; same && j < K; j++) same = dr[j] == cJSON_GetArrayItem(du, j)->valueint;
            T_CHECK(same, "unpruned greedy drafts of prompt %s equal the reference's", cJSON_GetObjectItem(p, "id")->valuestring);
        }
        /* Drafting does not change a block row's committed context, so the
         * same round can be drafted again under other seeds. */
        for (uint64_t seed = 1; seed <= 256; seed++) {
            int all = 1;
            for (int j = 0; j < K; j++) all &= seen[j];
            if (all) break;
            td_sampling sp = td_sampling_default();
            sp.temperature = 0.5f; /* q = softmax(logits / 0.5): the argmax chain is sampled often */
            sp.seed = seed;
            const td_sampling *spp = &sp;
            uint64_t pos = 0;
            int depth = K, nd = 0;
            int32_t dr[MAXK];
            td_draft_req q = {.n_rows = 1, .pending = &t, .depth = &depth, .max_depth = K, .tokens = dr,
                              .n_tokens = &nd, .probs = probs, .sampling = &spp, .out_pos = &pos};
            T_REQUIRE(td_draft_rows_draft(&rows, &q, &err) == 0 && q.has_probs && nd == K, "draft with q");
            for (int j = 0; j < K; j++) {
                if (j > 0 && dr[j - 1] != cJSON_GetArrayItem(du, j - 1)->valueint) break;
                if (seen[j]) continue;
                int fr = cJSON_GetArrayItem(lr, j)->valueint;
                T_REQUIRE(fr >= 0 && (size_t)(fr + 1) * g_V * sizeof(float) <= fbytes, "logits row in range");
                const float *ref = flog + (size_t)fr * g_V, *pr = probs + (size_t)j * g_V;
                double mx = -1e30, s = 0, md = 0, pm = 0;
                for (int v = 0; v < g_V; v++) mx = ref[v] > mx ? ref[v] : mx;
                for (int v = 0; v < g_V; v++) s += exp((ref[v] - mx) / 0.5);
                for (int v = 0; v < g_V; v++) {
                    double pv = exp((ref[v] - mx) / 0.5) / s;
                    if (fabs(pv - pr[v]) > md) md = fabs(pv - pr[v]);
                    if (pv > pm) pm = pv;
                }
                if (md / pm > worst) worst = md / pm;
                seen[j] = 1;
                compared++;
            }
        }
        td_draft_rows_free(&rows);
        td_ctx_row_remove(g_c, row);
    }
    printf("  %d of %d block positions compared; worst relative error of the draft distribution %.2e\n", compared, wanted, worst);
    T_CHECK(compared == wanted, "every position compared: %d of %d", compared, wanted);
    T_CHECK(worst <= 1e-3, "draft distribution differs from PyTorch by %.2e relative", worst);
done:
    free(probs);
    free(flog);
    td_draft_rows_free(&rows);
    td_drafter_free(d);
    t_end();
}

/* A draft vocabulary (vocab=N): the first N ids of BLK/draft_vocab.json's
 * ranking plus the row's context ids (its committed tokens outside them). The
 * reference rows hold the full logits (LM head + Markov bias of the
 * full-vocabulary drafts), so position j is checked while the drafts before it
 * agree with the reference's: greedy = the argmax of the row over the kept ids
 * and the context ids (the Markov bias applies to both); q at position 1
 * (whose Markov input is the anchor) = softmax(row / 0.5) over the kept ids,
 * zero beyond. */
static void test_vocab(cJSON *fx) {
    t_begin("block_vocab_ranked_context_ids");
    enum { NSUB = 64 };
    td_drafter *d = NULL;
    td_draft_rows rows = {0};
    td_err err = {0};
    float *probs = NULL, *flog = NULL;
    uint8_t *kept = NULL, *cand = NULL;
    int32_t *rank = NULL;
    size_t fbytes = 0;
    char *vt = t_slurp(BLK "/draft_vocab.json", NULL);
    cJSON *vj = vt ? cJSON_Parse(vt) : NULL;
    free(vt);
    flog = (float *)t_slurp(FX "/logits.f32", &fbytes);
    T_REQUIRE(flog, "missing " FX "/logits.f32");
    cJSON *ra = cJSON_GetObjectItem(vj, "ranked_ids");
    T_REQUIRE(cJSON_GetArraySize(ra) >= NSUB, BLK "/draft_vocab.json ranks %d ids", cJSON_GetArraySize(ra));
    kept = calloc((size_t)g_V, 1);
    cand = calloc((size_t)g_V, 1);
    rank = malloc(sizeof(int32_t) * NSUB);
    T_REQUIRE(kept && cand && rank, "memory");
    for (int i = 0; i < NSUB; i++) rank[i] = cJSON_GetArrayItem(ra, i)->valueint, kept[rank[i]] = 1;
    char spec[300];
    snprintf(spec, sizeof spec, "block:%s,prune=off,vocab=%d", BLK, NSUB);
    T_REQUIRE(td_drafter_open(&d, spec, g_m, &err) == 0, "block: %s", err.msg);
    T_CHECK(strstr(td_drafter_id(d), "vocab=64") != NULL, "the id names the draft vocabulary: %s", td_drafter_id(d));
    int K = cJSON_GetObjectItem(fx, "block_size")->valueint - 1;
    probs = malloc(sizeof(float) * (size_t)K * g_V);
    T_REQUIRE(probs, "memory");
    int greedy_checked = 0, q_checked = 0, from_ctx = 0, ctx_beat_kept = 0;
    double worst = 0;
    cJSON *p;
    cJSON_ArrayForEach(p, cJSON_GetObjectItem(fx, "prompts")) {
        int row;
        int32_t t;
        cJSON *lr, *du;
        T_REQUIRE(round0_row(d, p, K, &rows, &row, &t, &lr, &du, &err) == 0, "round 0 of prompt %s: %s",
                  cJSON_GetObjectItem(p, "id")->valuestring, err.msg);
        /* the candidates: kept ids, then the committed stream's other ids (the prompt less its anchor) */
        memcpy(cand, kept, (size_t)g_V);
        cJSON *ids = cJSON_GetObjectItem(p, "prompt_ids");
        for (int i = 0; i + 1 < cJSON_GetArraySize(ids); i++) cand[cJSON_GetArrayItem(ids, i)->valueint] = 1;
        td_sampling sp = td_sampling_default();
        const td_sampling *spp = &sp;
        uint64_t pos = 0;
        int depth = K, nd = 0;
        int32_t dr[MAXK];
        td_draft_req q = {.n_rows = 1, .pending = &t, .depth = &depth, .max_depth = K, .tokens = dr,
                          .n_tokens = &nd, .sampling = &spp, .out_pos = &pos};
        T_REQUIRE(td_draft_rows_draft(&rows, &q, &err) == 0 && nd == K, "draft");
        for (int j = 0; j < K; j++) {
            if (j > 0 && dr[j - 1] != cJSON_GetArrayItem(du, j - 1)->valueint) break;
            int fr = cJSON_GetArrayItem(lr, j)->valueint;
            T_REQUIRE(fr >= 0 && (size_t)(fr + 1) * g_V * sizeof(float) <= fbytes, "logits row in range");
            const float *ref = flog + (size_t)fr * g_V;
            int best = -1, best_kept = rank[0];
            for (int v = 0; v < g_V; v++)
                if (cand[v] && (best < 0 || ref[v] > ref[best])) best = v;
            for (int i = 1; i < NSUB; i++) if (ref[rank[i]] > ref[best_kept]) best_kept = rank[i];
            T_CHECK(dr[j] == best, "prompt %s position %d: draft %d, the reference's argmax over the kept and context ids is %d",
                    cJSON_GetObjectItem(p, "id")->valuestring, j + 1, (int)dr[j], best);
            from_ctx += !kept[dr[j]];
            ctx_beat_kept += best != best_kept;
            greedy_checked++;
        }
        { /* a checkpoint carries the context ids: the restored row drafts the same */
            int32_t d2[MAXK];
            int n2 = 0;
            T_REQUIRE(restored_draft(d, &rows, 0, K, t, d2, &n2, &err) == 0, "restore and draft: %s", err.msg);
            T_CHECK(n2 == nd && memcmp(d2, dr, sizeof(int32_t) * (size_t)nd) == 0, "a restored row drafts as the original");
        }
        sp.temperature = 0.5f;
        sp.seed = 7;
        q.probs = probs;
        T_REQUIRE(td_draft_rows_draft(&rows, &q, &err) == 0 && q.has_probs && nd == K, "draft with q");
        const float *ref = flog + (size_t)cJSON_GetArrayItem(lr, 0)->valueint * g_V;
        double mx = -1e30, s = 0, md = 0, pm = 0, beyond = 0;
        for (int v = 0; v < g_V; v++) if (kept[v]) mx = ref[v] > mx ? ref[v] : mx;
        for (int v = 0; v < g_V; v++) if (kept[v]) s += exp((ref[v] - mx) / 0.5);
        for (int v = 0; v < g_V; v++) {
            double pv = kept[v] ? exp((ref[v] - mx) / 0.5) / s : 0;
            if (fabs(pv - probs[v]) > md) md = fabs(pv - probs[v]);
            if (pv > pm) pm = pv;
            if (!kept[v]) beyond += fabs(probs[v]);
        }
        T_CHECK(beyond == 0, "q is zero outside the draft vocabulary (sum %g)", beyond);
        T_CHECK(kept[dr[0]], "the sampled draft %d is inside the draft vocabulary", (int)dr[0]);
        if (md / pm > worst) worst = md / pm;
        q_checked++;
        td_draft_rows_free(&rows);
        td_ctx_row_remove(g_c, row);
    }
    printf("  %d greedy positions (%d drafted from context ids) and %d distributions checked against the reference cut to "
           "%d ranked ids; worst relative error %.2e\n", greedy_checked, from_ctx, q_checked, NSUB, worst);
    T_CHECK(greedy_checked >= q_checked && q_checked > 0, "positions checked");
    T_CHECK(from_ctx > 0, "some greedy draft comes from a context id (the case under test)");
    T_CHECK(from_ctx == ctx_beat_kept, "a context id is drafted exactly where it beats every kept id (%d, %d)", from_ctx, ctx_beat_kept);
    T_CHECK(worst <= 1e-3, "draft distribution differs from PyTorch's cut to the vocabulary by %.2e relative", worst);
    td_drafter_free(d);
    d = NULL;
    snprintf(spec, sizeof spec, "block:%s,vocab=%d", BLK, g_V + 1);
    T_CHECK(td_drafter_open(&d, spec, g_m, &err) == TD_EINVAL && d == NULL && strstr(err.msg, "vocabulary"),
            "a draft vocabulary past the target's: %s", err.msg);
    snprintf(spec, sizeof spec, "block:%s,vocab=x", BLK);
    T_CHECK(td_drafter_open(&d, spec, g_m, &err) == TD_EINVAL && d == NULL && strstr(err.msg, "option"),
            "a draft vocabulary that is not a number: %s", err.msg);
    snprintf(spec, sizeof spec, "block:%s,vocab=0", BLK);
    T_CHECK(td_drafter_open(&d, spec, g_m, &err) == TD_EINVAL && d == NULL && strstr(err.msg, "vocabulary"),
            "an empty draft vocabulary: %s", err.msg);
done:
    cJSON_Delete(vj);
    free(kept);
    free(cand);
    free(rank);
    free(probs);
    free(flog);
    td_draft_rows_free(&rows);
    td_drafter_free(d);
    t_end();
}

/* Lazy projection: two rows of one group with the same prompt receive the same
 * commits (from greedy verification of row 0's drafts); row 1 drafts only now
 * and then (depth 0 in between, its committed taps wait unprojected, and one
 * idle stretch overflows the drafter's 128-position backlog). Whenever row 1
 * drafts, its drafts equal row 0's, and a checkpoint of row 1 taken while it
 * has a backlog, restored into a fresh group, drafts the same too. */
static void test_lazy(cJSON *fx) {
    t_begin("block_lazy_projection");
    td_drafter *d = NULL;
    td_draft_rows rows = {0};
    td_err err = {0};
    int row = -1;
    T_REQUIRE(td_drafter_open(&d, "block:" BLK ",vocab=1024", g_m, &err) == 0, "block: %s", err.msg);
    int K = cJSON_GetObjectItem(fx, "block_size")->valueint - 1;
    const int *tl;
    int nt = td_drafter_taps(d, &tl);
    uint8_t ones[256];
    memset(ones, 1, sizeof ones);
    cJSON *ids = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(fx, "prompts"), 1), "prompt_ids");
    int N = cJSON_GetArraySize(ids);
    int32_t S[256];
    T_REQUIRE(N >= 2 && N < 64, "prompt of %d tokens", N);
    for (int i = 0; i < N; i++) S[i] = cJSON_GetArrayItem(ids, i)->valueint;
    int n = N - 1;
    int32_t t = S[N - 1];
    T_REQUIRE(d->vt->open_rows(d->self, 2, 240, K, g_c, &rows, &err) == 0, "open rows: %s", err.msg);
    T_REQUIRE(prefill_row(d, &rows, &row, S, n, &err) == 0, "prefill: %s", err.msg);
    T_REQUIRE(td_draft_rows_append(&rows, S, n, g_taps, NULL, &err) == 0, "second row: %s", err.msg);
    int compared = 0, idle = 0, idle_pos = 0, longest_idle = 0, ck_checked = 0;
    for (int round = 0; n + 1 + K + 8 <= 230; round++) {
        /* row 1 drafts in rounds 0-1, once after 6 idle rounds, then after more
         * than 128 committed positions, then every 5 rounds */
        int b_drafts = round < 2 || round == 8 || (round > 8 && idle_pos > 130) || (longest_idle > 130 && idle >= 5);
        td_sampling sp = td_sampling_default();
        const td_sampling *spp[2] = {&sp, &sp};
        uint64_t pos[2] = {0, 0};
        int32_t pend[2] = {t, t}, dr[2 * MAXK];
        int depth[2] = {K, b_drafts ? K : 0}, nd[2] = {0, 0};
        if (b_drafts && idle > 0 && !ck_checked) { /* a checkpoint of a row with a backlog */
            int32_t d0[MAXK], d2[MAXK];
            int n0 = 0, n2 = 0;
            T_REQUIRE(restored_draft(d, &rows, 1, K, t, d2, &n2, &err) == 0, "restore row 1: %s", err.msg);
            T_REQUIRE(restored_draft(d, &rows, 0, K, t, d0, &n0, &err) == 0, "restore row 0: %s", err.msg);
            T_CHECK(n2 == n0 && memcmp(d2, d0, sizeof(int32_t) * (size_t)n0) == 0,
                    "a checkpoint taken with %d idle rounds behind drafts as the always-projected row's", idle);
            ck_checked = 1;
        }
        td_draft_req q = {.n_rows = 2, .pending = pend, .depth = depth, .max_depth = K, .tokens = dr,
                          .n_tokens = nd, .sampling = spp, .out_pos = pos};
        T_REQUIRE(td_draft_rows_draft(&rows, &q, &err) == 0, "draft: %s", err.msg);
        if (b_drafts) {
            T_CHECK(nd[1] == nd[0] && memcmp(dr, dr + K, sizeof(int32_t) * (size_t)nd[0]) == 0,
                    "round %d: the row drafting after %d idle rounds drafts as the always-drafting row", round, idle);
            compared++;
            idle = idle_pos = 0;
        } else {
            T_CHECK(nd[1] == 0, "depth 0 drafts nothing");
            idle++;
        }
        int32_t win[MAXK + 1];
        win[0] = t;
        memcpy(win + 1, dr, sizeof(int32_t) * (size_t)nd[0]);
        int nw = nd[0] + 1;
        td_batch vb = {.n_rows = 1, .rows = &row, .n_tokens = &nw, .tokens = win, .want = ones, .taps = tl, .n_taps = nt};
        T_REQUIRE(td_ctx_forward(g_c, &vb, g_logits, g_taps, &err) == 0, "verify: %s", err.msg);
        int mm = 0;
        int32_t tg = argmax(g_logits, g_V);
        while (mm < nd[0] && tg == dr[mm]) tg = argmax(g_logits + (size_t)++mm * g_V, g_V);
        td_draft_commit cm[2];
        cm[0] = (td_draft_commit){.old_pending = t, .accepted = dr, .n_accepted = mm, .new_pending = tg, .taps = g_taps};
        cm[1] = cm[0];
        T_REQUIRE(td_draft_rows_commit(&rows, cm, &err) == 0, "commit: %s", err.msg);
        td_ctx_row_trim(g_c, row, n + 1 + mm);
        if (!b_drafts && (idle_pos += 1 + mm) > longest_idle) longest_idle = idle_pos;
        n += 1 + mm;
        t = tg;
    }
    printf("  %d rounds compared; longest idle stretch %d committed positions\n", compared, longest_idle);
    T_CHECK(compared >= 4 && longest_idle > 130 && ck_checked, "the schedule ran: %d comparisons, idle %d, checkpoint %d",
            compared, longest_idle, ck_checked);
done:
    td_draft_rows_free(&rows);
    if (row >= 0) td_ctx_row_remove(g_c, row);
    td_drafter_free(d);
    t_end();
}

/* Short blocks: a row asked for k < block_size - 1 drafts runs the anchor and
 * k masks (the drafter reports k + 1 steps), and its drafts are its own: the
 * same alone as beside rows asking for other depths in the same forward; a
 * row asking for more than block_size - 1 gets a full block. */
static void test_short_blocks(cJSON *fx) {
    t_begin("block_short_blocks_per_row");
    td_drafter *d = NULL;
    td_draft_rows rows = {0};
    td_err err = {0};
    int row = -1;
    T_REQUIRE(td_drafter_open(&d, "block:" BLK ",prune=off", g_m, &err) == 0, "block: %s", err.msg);
    int G = cJSON_GetObjectItem(fx, "block_size")->valueint;
    T_REQUIRE(G >= 6 && G <= MAXK, "block size %d", G);
    T_CHECK(d->step_extra == 1 && d->max_drafts == G - 1, "cost shape: step_extra %d, max_drafts %d", d->step_extra, d->max_drafts);
    cJSON *ids = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(fx, "prompts"), 0), "prompt_ids");
    int N = cJSON_GetArraySize(ids);
    int32_t S[256];
    T_REQUIRE(N >= 2 && N < 128, "prompt of %d tokens", N);
    for (int i = 0; i < N; i++) S[i] = cJSON_GetArrayItem(ids, i)->valueint;
    T_REQUIRE(d->vt->open_rows(d->self, 3, 240, MAXK, g_c, &rows, &err) == 0, "open rows: %s", err.msg);
    T_REQUIRE(prefill_row(d, &rows, &row, S, N - 1, &err) == 0, "prefill: %s", err.msg);
    for (int r = 1; r < 3; r++) T_REQUIRE(td_draft_rows_append(&rows, S, N - 1, g_taps, NULL, &err) == 0, "row %d: %s", r, err.msg);
    td_sampling sp = td_sampling_default();
    const td_sampling *spp[3] = {&sp, &sp, &sp};
    uint64_t pos[3] = {0, 0, 0};
    int32_t pend[3] = {S[N - 1], S[N - 1], S[N - 1]};
    /* rounds: {depths} -> drafts per row; alone[k] = the drafts of row 0 alone at depth k */
    int32_t alone[MAXK][MAXK], dr[3 * MAXK];
    int n_alone[MAXK] = {0};
    const int ks[] = {1, 3, G - 2, G - 1};
    for (int a = 0; a < 4; a++) {
        int k = ks[a], depth[3] = {k, 0, 0}, nd[3] = {0, 0, 0};
        td_draft_req q = {.n_rows = 3, .pending = pend, .depth = depth, .max_depth = MAXK, .tokens = dr,
                          .n_tokens = nd, .sampling = spp, .out_pos = pos, .steps = -1};
        T_REQUIRE(td_draft_rows_draft(&rows, &q, &err) == 0, "draft: %s", err.msg);
        T_CHECK(nd[0] == k && q.steps == k + 1, "depth %d alone: %d drafts, %d steps (want %d, %d)", k, nd[0], q.steps, k, k + 1);
        memcpy(alone[k], dr, sizeof(int32_t) * (size_t)k);
        n_alone[k] = nd[0];
    }
    /* the same depths side by side, in every arrangement of three rows */
    const int mix[4][3] = {{1, G - 1, 3}, {3, 1, G - 2}, {G - 1, G - 2, 1}, {G - 2, 3, G - 1}};
    for (int m = 0; m < 4; m++) {
        int depth[3] = {mix[m][0], mix[m][1], mix[m][2]}, nd[3] = {0, 0, 0};
        td_draft_req q = {.n_rows = 3, .pending = pend, .depth = depth, .max_depth = MAXK, .tokens = dr,
                          .n_tokens = nd, .sampling = spp, .out_pos = pos, .steps = -1};
        T_REQUIRE(td_draft_rows_draft(&rows, &q, &err) == 0, "draft: %s", err.msg);
        int deepest = 0;
        for (int r = 0; r < 3; r++) {
            int k = depth[r];
            if (k > deepest) deepest = k;
            T_CHECK(nd[r] == n_alone[k] && memcmp(dr + r * MAXK, alone[k], sizeof(int32_t) * (size_t)k) == 0,
                    "arrangement %d: row %d at depth %d drafts as alone", m, r, k);
        }
        T_CHECK(q.steps == deepest + 1, "arrangement %d: %d steps, want %d", m, q.steps, deepest + 1);
    }
    /* deeper than a block holds: a full block, block_size - 1 drafts */
    {
        int depth[3] = {G + 3, 0, 0}, nd[3] = {0, 0, 0};
        td_draft_req q = {.n_rows = 3, .pending = pend, .depth = depth, .max_depth = MAXK, .tokens = dr,
                          .n_tokens = nd, .sampling = spp, .out_pos = pos, .steps = -1};
        T_REQUIRE(td_draft_rows_draft(&rows, &q, &err) == 0, "draft: %s", err.msg);
        T_CHECK(nd[0] == G - 1 && q.steps == G && memcmp(dr, alone[G - 1], sizeof(int32_t) * (size_t)(G - 1)) == 0,
                "depth %d: %d drafts in %d steps, as depth %d", G + 3, nd[0], q.steps, G - 1);
    }
done:
    td_draft_rows_free(&rows);
    if (row >= 0) td_ctx_row_remove(g_c, row);
    td_drafter_free(d);
    t_end();
}

/* ---- refusals ------------------------------------------------------------ */

static char g_tmp[256];

static int copy_file(const char *from, const char *to) {
    size_t n = 0;
    char *b = t_slurp(from, &n);
    FILE *f = fopen(to, "wb");
    int ok = b && f && fwrite(b, 1, n, f) == n;
    if (f) fclose(f);
    free(b);
    return ok ? 0 : -1;
}

/* A copy of the trained drafter whose config.json has `from` replaced by `to`. */
static int variant(const char *name, const char *from, const char *to, char *dir, size_t cap) {
    snprintf(dir, cap, "%s/%s", g_tmp, name);
    mkdir(dir, 0755);
    char path[600];
    /* the weights: one file or shards with their index (whichever the drafter has) */
    static const char *const files[] = {"model.safetensors", "model.safetensors.index.json",
                                        "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"};
    int copied = 0;
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        char from[600];
        snprintf(from, sizeof from, "%s/%s", BLK, files[i]);
        if (access(from, R_OK) != 0) continue;
        snprintf(path, sizeof path, "%s/%s", dir, files[i]);
        if (copy_file(from, path)) return -1;
        copied++;
    }
    if (!copied) return -1;
    char *cfg = t_slurp(BLK "/config.json", NULL);
    if (!cfg) return -1;
    char *at = strstr(cfg, from);
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    if (!f || !at) { free(cfg); if (f) fclose(f); return -1; }
    fprintf(f, "%.*s%s%s", (int)(at - cfg), cfg, to, at + strlen(from));
    fclose(f);
    free(cfg);
    return 0;
}

static void expect_refusal(const char *name, const char *from, const char *to, int code, const char *msg) {
    char dir[400], spec[420];
    td_err err = {0};
    td_drafter *d = NULL;
    if (variant(name, from, to, dir, sizeof dir)) { T_CHECK(0, "%s: could not make the variant (is '%s' in config.json?)", name, from); return; }
    snprintf(spec, sizeof spec, "block:%s", dir);
    int rc = td_drafter_open(&d, spec, g_m, &err);
    T_CHECK(rc == code && d == NULL && strstr(err.msg, msg), "%s: rc %d, message: %s", name, rc, err.msg);
    td_drafter_free(d);
}

static void test_refusals(void) {
    t_begin("block_refuses_bad_drafters");
    snprintf(g_tmp, sizeof g_tmp, "/tmp/td_block_XXXXXX");
    T_REQUIRE(mkdtemp(g_tmp), "tmp dir");
    expect_refusal("layers", "\"target_num_hidden_layers\": 10", "\"target_num_hidden_layers\": 12", TD_EINVAL, "trained for a target");
    expect_refusal("hidden", "\"target_hidden_size\": 384", "\"target_hidden_size\": 512", TD_EINVAL, "trained for a target");
    expect_refusal("vocab", "\"target_vocab_size\": 16384", "\"target_vocab_size\": 151936", TD_EINVAL, "trained for a target");
    expect_refusal("tap", "\"tap_layers\": [", "\"tap_layers\": [11, ", TD_EINVAL, "tap_layers[0]");
    expect_refusal("arch", "TandemBlockDrafter", "Qwen3ForCausalLM", TD_EUNSUPPORTED, "TandemBlockDrafter");
    expect_refusal("block0", "\"block_size\": ", "\"block_size\": 1, \"x\": ", TD_EFORMAT, "block_size");
    expect_refusal("mask", "\"mask_token_id\": ", "\"mask_token_id\": 99999, \"x\": ", TD_EFORMAT, "mask_token_id");
    expect_refusal("heads", "\"num_key_value_heads\": 2", "\"num_key_value_heads\": 4", TD_EFORMAT, "multiple");
    expect_refusal("eps", "\"rms_norm_eps\": ", "\"rms_norm_eps\": -1, \"x\": ", TD_EFORMAT, "rms_norm_eps");
    expect_refusal("thr_len", "\"prune_thresholds\": [", "\"prune_thresholds\": [0.5, ", TD_EFORMAT, "prune_thresholds");
    expect_refusal("thr_val", "\"prune_thresholds\": [", "\"prune_thresholds\": [\"high\", ", TD_EFORMAT, "prune_thresholds");
    {   /* one layer more than the checkpoint holds: the first missing layer's tensors are named */
        char *cfg = t_slurp(BLK "/config.json", NULL);
        const char *key = "\"num_hidden_layers\": ";
        const char *at = cfg ? strstr(cfg, key) : NULL;
        int n = at ? atoi(at + strlen(key)) : 0;
        free(cfg);
        char from[64], to[64], missing[32];
        snprintf(from, sizeof from, "%s%d", key, n);
        snprintf(to, sizeof to, "%s%d", key, n + 1);
        snprintf(missing, sizeof missing, "layers.%d", n);
        expect_refusal("layers_count", from, to, TD_EFORMAT, missing);
    }
    expect_refusal("ffn", "\"intermediate_size\": 1280", "\"intermediate_size\": 1024", TD_EFORMAT, "shape");
    expect_refusal("rank", "\"markov_rank\": 32", "\"markov_rank\": 16", TD_EFORMAT, "markov");
    /* the chain head: a width its weights do not have, and a bad value */
    expect_refusal("chain_w", "\"chain_hidden\": 512", "\"chain_hidden\": 256", TD_EFORMAT, "chain.inp");
    expect_refusal("chain_neg", "\"chain_hidden\": 512", "\"chain_hidden\": -1", TD_EFORMAT, "chain_hidden");
    /* shard indexes naming files outside the directory, or none */
    {
        static const struct { const char *name, *index, *msg; } bad[] = {
            {"idx_escape", "{\"weight_map\": {\"fc.weight\": \"../model-00001-of-00002.safetensors\"}}", "not a file name"},
            {"idx_empty", "{\"weight_map\": {}}", "names no shard"},
            {"idx_nomap", "{\"metadata\": {}}", "weight_map"},
            {"idx_missing", "{\"weight_map\": {\"fc.weight\": \"model-00009-of-00009.safetensors\"}}", "model-00009"},
        };
        for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
            char dir[400], path[600], spec[420];
            td_err err = {0};
            td_drafter *d = NULL;
            T_REQUIRE(variant(bad[i].name, "{", "{", dir, sizeof dir) == 0, "variant");
            snprintf(path, sizeof path, "%s/model.safetensors", dir);
            unlink(path);
            snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
            FILE *f = fopen(path, "w");
            T_REQUIRE(f, "index");
            fputs(bad[i].index, f);
            fclose(f);
            snprintf(spec, sizeof spec, "block:%s", dir);
            T_CHECK(td_drafter_open(&d, spec, g_m, &err) != 0 && d == NULL && strstr(err.msg, bad[i].msg),
                    "%s: refused with '%s' (wanted '%s')", bad[i].name, err.msg, bad[i].msg);
        }
    }
    /* a truncated weight file */
    {
        char dir[400], path[600], spec[420];
        td_err err = {0};
        td_drafter *d = NULL;
        T_REQUIRE(variant("trunc", "{", "{", dir, sizeof dir) == 0, "variant");
        snprintf(path, sizeof path, "%s/model.safetensors", dir);
        if (access(path, F_OK) != 0) snprintf(path, sizeof path, "%s/model-00002-of-00002.safetensors", dir);
        T_REQUIRE(truncate(path, 4096) == 0, "truncate");
        snprintf(spec, sizeof spec, "block:%s", dir);
        T_CHECK(td_drafter_open(&d, spec, g_m, &err) != 0 && d == NULL, "truncated weights refused: %s", err.msg);
        printf("  truncated weights: %s\n", err.msg);
    }
    {
        td_err err = {0};
        td_drafter *d = NULL;
        T_CHECK(td_drafter_open(&d, "block:", g_m, &err) == TD_EINVAL && !d, "empty directory: %s", err.msg);
        T_CHECK(td_drafter_open(&d, "block:/nonexistent", g_m, &err) != 0 && !d, "missing directory: %s", err.msg);
    }
done:;
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_tmp);
    if (system(cmd) != 0) printf("  could not remove %s\n", g_tmp);
    t_end();
}

static void test_checkpoints(void) {
    t_begin("block_checkpoints_untrusted");
    td_drafter *d = NULL;
    td_draft_rows rows = {0}, other = {0};
    td_draft_checkpoint *ck = NULL;
    td_err err = {0};
    T_REQUIRE(td_drafter_open(&d, "block:" BLK, g_m, &err) == 0, "block: %s", err.msg);
    int32_t S[12] = {100, 200, 300, 400, 500, 600, 700, 800, 900, 1000, 1100, 1200};
    int row;
    T_REQUIRE(d->vt->open_rows(d->self, 2, 64, 7, g_c, &rows, &err) == 0, "open rows");
    T_REQUIRE(prefill_row(d, &rows, &row, S, 12, &err) == 0, "prefill: %s", err.msg);
    T_REQUIRE(rows.vt->capture(rows.self, 0, &ck, &err) == 0, "capture");
    T_REQUIRE(d->vt->open_rows(d->self, 1, 8, 7, g_c, &other, &err) == 0, "open small group");
    /* longer than the receiving group's context */
    T_CHECK(td_draft_rows_append(&other, NULL, 0, NULL, ck, &err) == TD_EFORMAT && strstr(err.msg, "positions"),
            "checkpoint past the context: %s", err.msg);
    td_draft_rows_free(&other);
    T_REQUIRE(d->vt->open_rows(d->self, 1, 64, 7, g_c, &other, &err) == 0, "open group");
    td_draft_checkpoint bad = *ck;
    snprintf(bad.ns, sizeof bad.ns, "mtp-v1");
    T_CHECK(td_draft_rows_append(&other, NULL, 0, NULL, &bad, &err) == TD_EFORMAT && strstr(err.msg, "namespace"), "namespace: %s", err.msg);
    bad = *ck;
    bad.size -= 4;
    T_CHECK(td_draft_rows_append(&other, NULL, 0, NULL, &bad, &err) == TD_EFORMAT, "short checkpoint: %s", err.msg);
    bad.size = 8;
    T_CHECK(td_draft_rows_append(&other, NULL, 0, NULL, &bad, &err) == TD_EFORMAT, "header only: %s", err.msg);
    int32_t len;
    memcpy(&len, ck->data, 4);
    int32_t neg = -5;
    memcpy(ck->data, &neg, 4);
    T_CHECK(td_draft_rows_append(&other, NULL, 0, NULL, ck, &err) == TD_EFORMAT, "negative length: %s", err.msg);
    memcpy(ck->data, &len, 4);
    float nan = NAN;
    memcpy(ck->data + ck->size - 4, &nan, 4);
    T_CHECK(td_draft_rows_append(&other, NULL, 0, NULL, ck, &err) == TD_EFORMAT && strstr(err.msg, "finite"), "NaN: %s", err.msg);
    T_CHECK(other.n_rows == 0, "no row was added by a refused checkpoint");
    int32_t badtok[2] = {1, 99999};
    T_CHECK(td_draft_rows_append(&other, badtok, 2, g_taps, NULL, &err) == TD_ERANGE, "token outside the vocabulary: %s", err.msg);
done:
    td_draft_checkpoint_free(ck);
    td_draft_rows_free(&other);
    td_draft_rows_free(&rows);
    td_drafter_free(d);
    t_end();
}

int main(void) {
    td_err err = {0};
    char *txt = t_slurp(FX "/ref.json", NULL);
    cJSON *fx = txt ? cJSON_Parse(txt) : NULL;
    free(txt);
    if (!fx || td_model_open(&g_m, "models/tiny-code/target", &err) != 0) {
        printf("FAIL block_setup: fixture or target missing (%s)\n", err.msg);
        return 1;
    }
    td_model_info info;
    td_model_get_info(g_m, &info);
    g_V = info.n_vocab;
    g_D = info.n_embd;
    td_ctx_params cp = td_ctx_default_params();
    cp.max_ctx = 256;
    cp.max_tokens = 128;
    cp.max_logits = 128;
    g_logits = malloc(sizeof(float) * 128 * (size_t)g_V);
    g_taps = malloc(sizeof(float) * 128 * 8 * (size_t)g_D);
    if (!g_logits || !g_taps || td_ctx_open(&g_c, g_m, &cp, &err) != 0) {
        printf("FAIL block_setup: %s\n", err.msg);
        return 1;
    }
    test_rounds(fx);
    test_logits(fx);
    test_vocab(fx);
    test_lazy(fx);
    test_short_blocks(fx);
    test_row_reuse(fx);
    test_refusals();
    test_checkpoints();
    /* speculative == plain with the trained block drafter and a bf16 target KV cache */
    ts_exact("block_exact_kv_bf16", g_m, "block:" BLK, TD_DTYPE_BF16, cJSON_GetObjectItem(fx, "prompts"));
    /* and a q8_0 target cache (the drafter's own context stays f32) */
    ts_exact("block_exact_kv_q8_0", g_m, "block:" BLK, TD_DTYPE_Q8_0, cJSON_GetObjectItem(fx, "prompts"));
    /* and with the target's products (and the drafter's bf16 ones) on AMX tiles, where the machine has them */
    if (td_amx_available()) {
        test_rounds_act(fx, "block:" BLK, "block_near_reference_act_amx", TD_ACT_AMX);
        test_rounds_act(fx, "block:" BLK ",quant=q8_0", "block_near_reference_act_amx_q8_0", TD_ACT_AMX);
        ts_act = TD_ACT_AMX;
        ts_exact("block_exact_act_amx", g_m, "block:" BLK, TD_DTYPE_F32, cJSON_GetObjectItem(fx, "prompts"));
        /* its matrices in Q8_0 (quant=q8_0): R16 products over their repacks */
        ts_exact("block_exact_act_amx_q8_0", g_m, "block:" BLK ",quant=q8_0", TD_DTYPE_F32, cJSON_GetObjectItem(fx, "prompts"));
        /* a bf16 target cache: the target's attention on the tiles too (head_dim 64) */
        ts_exact("block_exact_act_amx_kv_bf16", g_m, "block:" BLK ",quant=q8_0", TD_DTYPE_BF16, cJSON_GetObjectItem(fx, "prompts"));
        ts_act = TD_DTYPE_F32;
    }
    /* quant=q8_0 under an f32 target: the drafter's own matrices in the R16 order, the rest f32 */
    test_rounds_act(fx, "block:" BLK ",quant=q8_0", "block_near_reference_act_f32_q8_0", TD_DTYPE_F32);
    /* and under act_type bf16 (vdpbf16ps where the CPU runs it, else its emulation) */
    test_rounds_act(fx, "block:" BLK, "block_near_reference_act_bf16", TD_DTYPE_BF16);
    test_rounds_act(fx, "block:" BLK ",quant=q8_0", "block_near_reference_act_bf16_q8_0", TD_DTYPE_BF16);
    ts_act = TD_DTYPE_BF16;
    ts_exact("block_exact_act_bf16", g_m, "block:" BLK, TD_DTYPE_F32, cJSON_GetObjectItem(fx, "prompts"));
    ts_exact("block_exact_act_bf16_q8_0", g_m, "block:" BLK ",quant=q8_0", TD_DTYPE_BF16, cJSON_GetObjectItem(fx, "prompts"));
    ts_act = TD_DTYPE_F32;
    cJSON_Delete(fx);
    td_ctx_free(g_c);
    td_model_free(g_m);
    free(g_logits);
    free(g_taps);
    return t_exit();
}
