#define _GNU_SOURCE
/* test_mtp — the MTP drafter against its PyTorch reference
 * (tests/fixtures/tiny-code-mtp, made by tools/train/stage3): for 3 prompts,
 * 6 greedy speculative rounds at depth 4 driven through the draft contract
 * directly (prefill taps -> append, draft, target verify with taps, commit),
 * so every proposal is observable. Checked per round: the head's 4 drafts, the
 * target's greedy tokens and the accepted count m; and for rounds 0-1 the head's
 * full logits (through q = softmax at temperature 1) within 1e-3 relative. */
#include "tandem.h"
#include "t.h"
#include "spec/draft.h"
#include "tspec.h"
#include "nn/amx.h"

#include <cjson/cJSON.h>
#include <math.h>

static int32_t argmax(const float *x, int n) {
    int32_t b = 0;
    for (int i = 1; i < n; i++) if (x[i] > x[b]) b = i;
    return b;
}

int main(void) {
    t_begin("mtp_matches_pytorch_reference");
    td_model *m = NULL;
    td_drafter *d = NULL;
    td_ctx *c = NULL;
    td_draft_rows rows = {0};
    cJSON *fx = NULL;
    float *flog = NULL, *logits = NULL, *taps = NULL, *probs = NULL;
    td_err err = {0};
    char *txt = t_slurp("tests/fixtures/tiny-code-mtp/ref.json", NULL);
    T_REQUIRE(txt != NULL, "missing tests/fixtures/tiny-code-mtp/ref.json");
    fx = cJSON_Parse(txt);
    free(txt);
    size_t fbytes;
    flog = (float *)t_slurp("tests/fixtures/tiny-code-mtp/logits.f32", &fbytes);
    T_REQUIRE(fx && flog, "fixture files");
    T_REQUIRE(td_model_open(&m, "models/tiny-code/target", &err) == 0, "target: %s", err.msg);
    T_REQUIRE(td_drafter_open(&d, "mtp:models/tiny-code/mtp", m, &err) == 0, "mtp: %s", err.msg);
    td_model_info info;
    td_model_get_info(m, &info);
    int V = info.n_vocab, D = info.n_embd, K = 4;
    const int *tl;
    T_REQUIRE(td_drafter_taps(d, &tl) == 1 && tl[0] == info.n_layer, "the head taps the last layer");
    td_ctx_params cp = td_ctx_default_params();
    cp.max_ctx = 256;
    cp.max_tokens = 128;
    cp.max_logits = 128;
    T_REQUIRE(td_ctx_open(&c, m, &cp, &err) == 0, "ctx: %s", err.msg);
    logits = malloc(sizeof(float) * 128 * (size_t)V);
    taps = malloc(sizeof(float) * 128 * (size_t)D);
    probs = malloc(sizeof(float) * (size_t)K * V);
    uint8_t ones[128];
    memset(ones, 1, sizeof ones);
    int rounds_ok = 0, rounds_total = 0, ckpt_checked = 0;
    double worst = 0;
    cJSON *p;
    cJSON_ArrayForEach(p, cJSON_GetObjectItem(fx, "prompts")) {
        cJSON *ids = cJSON_GetObjectItem(p, "prompt_ids");
        int N = cJSON_GetArraySize(ids);
        int32_t S[256];
        for (int i = 0; i < N; i++) S[i] = cJSON_GetArrayItem(ids, i)->valueint;
        int n = N - 1;
        int32_t t = S[N - 1];
        T_REQUIRE(d->vt->open_rows(d->self, 1, 240, K, c, &rows, &err) == 0, "open rows: %s", err.msg);
        int row;
        td_ctx_row_add(c, &row);
        int tap = info.n_layer;
        td_batch pb = {.n_rows = 1, .rows = &row, .n_tokens = &n, .tokens = S, .want = ones,
                       .taps = &tap, .n_taps = 1, .skip_logits = 1};
        T_REQUIRE(td_ctx_forward(c, &pb, NULL, taps, &err) == 0, "prefill: %s", err.msg);
        T_REQUIRE(td_draft_rows_append(&rows, S, n, taps, NULL, &err) == 0, "append: %s", err.msg);
        cJSON *r;
        cJSON_ArrayForEach(r, cJSON_GetObjectItem(p, "rounds")) {
            rounds_total++;
            int ok = cJSON_GetObjectItem(r, "S_len")->valueint == n && cJSON_GetObjectItem(r, "t")->valueint == t;
            /* draft at temperature 1 with no filters so q = softmax(logits) */
            td_sampling sp = td_sampling_default();
            sp.temperature = 1.0f;
            const td_sampling *spp = &sp;
            uint64_t pos = 0;
            int depth = K, nt = 0;
            int32_t drafts[4];
            /* greedy proposals first (probs NULL) */
            td_draft_req q = {.n_rows = 1, .pending = &t, .depth = &depth, .max_depth = K, .tokens = drafts,
                              .n_tokens = &nt, .probs = NULL, .sampling = &spp, .out_pos = &pos};
            T_REQUIRE(td_draft_rows_draft(&rows, &q, &err) == 0, "draft: %s", err.msg);
            cJSON *fd = cJSON_GetObjectItem(r, "drafts");
            for (int j = 0; j < K; j++) ok &= nt == K && drafts[j] == cJSON_GetArrayItem(fd, j)->valueint;
            /* verify [t, d1..d4] */
            int32_t win[5] = {t, drafts[0], drafts[1], drafts[2], drafts[3]};
            int nw = 5;
            td_batch vb = {.n_rows = 1, .rows = &row, .n_tokens = &nw, .tokens = win, .want = ones, .taps = &tap, .n_taps = 1};
            T_REQUIRE(td_ctx_forward(c, &vb, logits, taps, &err) == 0, "verify: %s", err.msg);
            int32_t tg[5];
            cJSON *ftg = cJSON_GetObjectItem(r, "target_greedy");
            for (int i = 0; i < 5; i++) { tg[i] = argmax(logits + (size_t)i * V, V); ok &= tg[i] == cJSON_GetArrayItem(ftg, i)->valueint; }
            int mm = 0;
            while (mm < K && tg[mm] == drafts[mm]) mm++;
            ok &= mm == cJSON_GetObjectItem(r, "m")->valueint;
            if (!ok) printf("  prompt %s round %d differs\n", cJSON_GetObjectItem(p, "id")->valuestring, cJSON_GetObjectItem(r, "round")->valueint);
            rounds_ok += ok;
            /* commit */
            td_draft_commit cm = {.old_pending = t, .accepted = drafts, .n_accepted = mm, .new_pending = tg[mm], .taps = taps};
            T_REQUIRE(td_draft_rows_commit(&rows, &cm, &err) == 0, "commit: %s", err.msg);
            td_ctx_row_trim(c, row, n + 1 + mm);
            for (int j = 0; j < mm; j++) S[n + 1 + j] = drafts[j];
            S[n] = t;
            n += 1 + mm;
            t = tg[mm];
            /* after the third round of each prompt: a checkpoint restored into a
               fresh group drafts the fixture's fourth-round drafts (the live row
               is left alone: a draft must be followed by its commit) */
            if (cJSON_GetObjectItem(r, "round")->valueint == 2) {
                td_draft_rows other = {0};
                td_draft_checkpoint *ck = NULL;
                int32_t b2[4];
                int nb2 = 0;
                T_REQUIRE(rows.vt->capture(rows.self, 0, &ck, &err) == 0, "capture: %s", err.msg);
                T_REQUIRE(d->vt->open_rows(d->self, 1, 240, K, c, &other, &err) == 0, "open");
                int rc2 = td_draft_rows_append(&other, NULL, 0, NULL, ck, &err);
                td_draft_checkpoint_free(ck);
                T_REQUIRE(rc2 == 0, "restore: %s", err.msg);
                td_draft_req qb = {.n_rows = 1, .pending = &t, .depth = &depth, .max_depth = K, .tokens = b2,
                                   .n_tokens = &nb2, .sampling = &spp, .out_pos = &pos};
                T_REQUIRE(td_draft_rows_draft(&other, &qb, &err) == 0, "draft restored: %s", err.msg);
                cJSON *next = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(p, "rounds"), 3), "drafts");
                int same = nb2 == 4;
                for (int j = 0; same && j < 4; j++) same = b2[j] == cJSON_GetArrayItem(next, j)->valueint;
                T_CHECK(same, "restored MTP row drafts differently from the reference");
                td_draft_rows_free(&other);
                ckpt_checked++;
            }
        }
        td_draft_rows_free(&rows);
        td_ctx_row_remove(c, row);
    }
    /* the head's first-step logits of round 0 of each prompt: draft with q at
       temperature 1; q must equal the softmax of the reference logits */
    cJSON_ArrayForEach(p, cJSON_GetObjectItem(fx, "prompts")) {
        cJSON *ids = cJSON_GetObjectItem(p, "prompt_ids");
        int N = cJSON_GetArraySize(ids);
        int32_t S[256];
        for (int i = 0; i < N; i++) S[i] = cJSON_GetArrayItem(ids, i)->valueint;
        cJSON *r0 = cJSON_GetArrayItem(cJSON_GetObjectItem(p, "rounds"), 0);
        cJSON *lr = cJSON_GetObjectItem(r0, "logits_rows");
        if (!cJSON_IsArray(lr)) continue;
        int n = N - 1;
        int32_t t = S[N - 1];
        T_REQUIRE(d->vt->open_rows(d->self, 1, 240, K, c, &rows, &err) == 0, "open rows");
        int row, tap = info.n_layer;
        td_ctx_row_add(c, &row);
        td_batch pb = {.n_rows = 1, .rows = &row, .n_tokens = &n, .tokens = S, .want = ones,
                       .taps = &tap, .n_taps = 1, .skip_logits = 1};
        T_REQUIRE(td_ctx_forward(c, &pb, NULL, taps, &err) == 0, "prefill");
        T_REQUIRE(td_draft_rows_append(&rows, S, n, taps, NULL, &err) == 0, "append");
        td_sampling sp = td_sampling_default();
        sp.temperature = 1.0f;
        const td_sampling *spp = &sp;
        uint64_t pos = 0;
        int depth = 1, nt = 0;
        int32_t dr[4];
        td_draft_req q = {.n_rows = 1, .pending = &t, .depth = &depth, .max_depth = K, .tokens = dr,
                          .n_tokens = &nt, .probs = probs, .sampling = &spp, .out_pos = &pos};
        T_REQUIRE(td_draft_rows_draft(&rows, &q, &err) == 0 && q.has_probs, "draft with q");
        int fr = cJSON_GetArrayItem(lr, 0)->valueint;
        T_REQUIRE((size_t)(fr + 1) * V * sizeof(float) <= fbytes, "logits row in range");
        const float *ref = flog + (size_t)fr * V;
        double mx = -1e30, s = 0, md = 0, pm = 0;
        for (int v = 0; v < V; v++) mx = ref[v] > mx ? ref[v] : mx;
        for (int v = 0; v < V; v++) s += exp(ref[v] - mx);
        for (int v = 0; v < V; v++) {
            double pr = exp(ref[v] - mx) / s;
            if (fabs(pr - probs[v]) > md) md = fabs(pr - probs[v]);
            if (pr > pm) pm = pr;
        }
        if (md / pm > worst) worst = md / pm;
        td_draft_rows_free(&rows);
        td_ctx_row_remove(c, row);
    }
    printf("  %d of %d rounds identical (drafts, target tokens, m); head distribution worst relative error %.2e\n",
           rounds_ok, rounds_total, worst);
    T_CHECK(rounds_total == 18 && rounds_ok == rounds_total, "rounds identical: %d of %d", rounds_ok, rounds_total);
    T_CHECK(ckpt_checked == 3, "checkpoint round trips: %d of 3", ckpt_checked);
    T_CHECK(worst <= 1e-3, "head distribution differs from PyTorch by %.2e relative", worst);
done:
    free(flog); free(logits); free(taps); free(probs);
    td_draft_rows_free(&rows);
    td_ctx_free(c);
    td_drafter_free(d);
    t_end();
    /* speculative == plain with the trained head and a bf16 KV cache (target and head) */
    if (m && fx) ts_exact("mtp_exact_kv_bf16", m, "mtp:models/tiny-code/mtp", TD_DTYPE_BF16, cJSON_GetObjectItem(fx, "prompts"));
    /* and with a q8_0 cache (target and head; head_dim 64, two blocks) */
    if (m && fx) ts_exact("mtp_exact_kv_q8_0", m, "mtp:models/tiny-code/mtp", TD_DTYPE_Q8_0, cJSON_GetObjectItem(fx, "prompts"));
    if (m && fx && td_amx_available()) { /* the target's and the head's products on AMX tiles */
        ts_act = TD_ACT_AMX;
        ts_exact("mtp_exact_act_amx", m, "mtp:models/tiny-code/mtp", TD_DTYPE_F32, cJSON_GetObjectItem(fx, "prompts"));
        /* a bf16 cache: the target's and the head's attention on the tiles too (head_dim 64) */
        ts_exact("mtp_exact_act_amx_kv_bf16", m, "mtp:models/tiny-code/mtp,quant=q8_0", TD_DTYPE_BF16, cJSON_GetObjectItem(fx, "prompts"));
        ts_act = TD_DTYPE_F32;
    }
    cJSON_Delete(fx);
    td_model_free(m);
    return t_exit();
}
