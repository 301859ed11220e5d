/* tspec.h — speculative output == plain output on the bundled target, for the
 * tests of trained drafters (test_mtp, test_block): each fixture prompt is
 * decoded greedily by td_generate and by a speculative group over the drafter,
 * both on contexts whose KV cache is stored as kv_type; the token streams must
 * be equal. Prints the acceptance, so a drafter that never proposes anything
 * useful shows. */
#ifndef TD_TSPEC_H
#define TD_TSPEC_H
#include "tandem.h"
#include "t.h"
#include <cjson/cJSON.h>

#define TS_NTOK 32

/* td_ctx_params.act_type of the contexts ts_ctx opens (a test sets it around calls) */
static int ts_act = TD_DTYPE_F32;
static inline td_ctx *ts_ctx(const td_model *m, int kv_type) {
    td_ctx_params p = td_ctx_default_params();
    p.max_rows = 2; p.max_ctx = 256; p.max_tokens = 128; p.max_logits = 128; p.n_threads = 2; p.kv_type = kv_type;
    p.act_type = ts_act;
    td_ctx *c = NULL;
    td_err err = {0};
    if (td_ctx_open(&c, m, &p, &err) != 0) printf("  ctx: %s\n", err.msg);
    return c;
}

/* Case `name`: the prompts (arrays of "prompt_ids") of fixture `prompts`. */
static inline void ts_exact(const char *name, const td_model *m, const char *spec, int kv_type, cJSON *prompts) {
    t_begin(name);
    td_drafter *d = NULL;
    td_ctx *cp = NULL, *cs = NULL;
    td_spec *g = NULL;
    td_err err = {0};
    long drafted = 0, accepted = 0;
    int np = 0, same = 0;
    T_REQUIRE(td_drafter_open(&d, spec, m, &err) == 0, "drafter %s: %s", spec, err.msg);
    cp = ts_ctx(m, kv_type);
    cs = ts_ctx(m, kv_type);
    T_REQUIRE(cp && cs, "contexts");
    td_spec_params sp = td_spec_default_params();
    sp.max_depth = 4;
    sp.fixed_depth = 1;
    T_REQUIRE(td_spec_open(&g, cs, m, d, &sp, &err) == 0, "spec: %s", err.msg);
    td_gen_params gp = {.sampling = td_sampling_default(), .max_tokens = TS_NTOK, .ignore_eos = 1};
    cJSON *p;
    cJSON_ArrayForEach(p, prompts) {
        cJSON *ids = cJSON_GetObjectItem(p, "prompt_ids");
        int N = cJSON_GetArraySize(ids);
        int32_t S[256], ref[TS_NTOK], got[TS_NTOK];
        T_REQUIRE(N > 0 && N < 200, "prompt length");
        for (int i = 0; i < N; i++) S[i] = cJSON_GetArrayItem(ids, i)->valueint;
        td_gen_stats st;
        T_REQUIRE(td_generate(cp, m, S, N, &gp, NULL, NULL, ref, TS_NTOK, &st, &err) == 0, "plain: %s", err.msg);
        int id, n = 0, done = 0;
        T_REQUIRE(td_spec_add(g, S, N, &gp, 1, &id, &err) == 0, "add: %s", err.msg);
        for (int r = 0; r < 4 * TS_NTOK && !done; r++) {
            T_REQUIRE(td_spec_step(g, &err) >= 0, "step: %s", err.msg);
            n += td_spec_take(g, id, got + n, NULL, TS_NTOK - n, NULL, 0, NULL, &done);
        }
        td_spec_stats ss;
        td_spec_stats_get(g, id, &ss);
        drafted += ss.drafted;
        accepted += ss.accepted;
        td_spec_remove(g, id);
        np++;
        same += n == st.n_gen && !memcmp(ref, got, sizeof(int32_t) * (size_t)n);
    }
    printf("  %s, KV %s: %d of %d prompts identical to plain, drafted %ld accepted %ld\n", spec,
           td_kv_type_name(kv_type), same, np, drafted, accepted);
    T_CHECK(np > 0 && same == np, "speculative differs from plain on %d of %d prompts", np - same, np);
    T_CHECK(accepted > 0, "no draft accepted: the check would not exercise acceptance");
done:
    td_spec_free(g);
    td_ctx_free(cp); td_ctx_free(cs);
    td_drafter_free(d);
    t_end();
}
#endif
