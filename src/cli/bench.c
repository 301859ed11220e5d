/* bench — `tandem bench spec`: plain and speculative decoding of the same
 * prompts in one process, with continuous batching up to --batch rows, so the
 * two are measured on the same machine state. Prints a table, or with --json
 * one JSON object: plain_tps, spec_tps, speedup, mean_accepted, exact (the
 * speculative tokens equal the plain tokens for every prompt), and more.
 *
 * On a shared machine the load drifts while a benchmark runs, so plain and
 * speculative decoding are interleaved: at batch 1 prompt by prompt, at larger
 * batches run by run; with --reps N each piece runs N times in each mode
 * (alternating, which mode goes first alternating too) and its fastest run
 * counts; the JSON also gives the median of the N paired ratios. */
#define _GNU_SOURCE
#include "cli/cli.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    int32_t *ids;   /* prompt */
    int n;
    int32_t *out;   /* generated, [max_tokens] */
    int n_out;
} bench_prompt;

typedef struct {
    double wall_s, prefill_s;
    long tokens;
    td_spec_stats st;
} bench_result;

static void bench_help(void) {
    printf("usage: tandem bench spec [-m DIR] (--prompts FILE | --random K) [options]\n"
           "Run plain and speculative decoding over the same prompts in one process.\n\n"
           "      --prompts FILE     JSONL with a \"prompt\" string per line (e.g. bench/prompts/code.jsonl)\n"
           "      --random K         K prompts of 64 random tokens instead (nothing to predict)\n"
           "      --limit K          use the first K prompts\n"
           "      --max-prompt N     keep the first N tokens of each prompt (default 256)\n"
           "      --batch B          rows decoded together, refilled as they finish (default 1)\n"
           "      --reps N           run each piece N times per mode, alternating; the fastest counts (default 1)\n"
           "      --json             print one JSON object\n"
           "  -h, --help             this help\n");
    cli_gen_opts_help();
}

static int load_prompts(const char *path, const td_tokenizer *tok, int limit, int max_prompt,
                        bench_prompt **out, int *n_out) {
    FILE *f = fopen(path, "r");
    if (!f) { fprintf(stderr, "tandem bench: %s: %s\n", path, strerror(errno)); return 1; }
    bench_prompt *ps = NULL;
    int n = 0, cap = 0, lineno = 0;
    char *line = NULL;
    size_t lcap = 0;
    while (getline(&line, &lcap, f) > 0 && (limit <= 0 || n < limit)) {
        lineno++;
        if (line[0] == '\n' || line[0] == 0) continue;
        cJSON *j = cJSON_Parse(line);
        cJSON *p = j ? cJSON_GetObjectItemCaseSensitive(j, "prompt") : NULL;
        if (!cJSON_IsString(p)) {
            fprintf(stderr, "tandem bench: %s:%d: not a JSON object with a \"prompt\" string\n", path, lineno);
            cJSON_Delete(j);
            free(line); fclose(f);
            return 1;
        }
        const char *s = p->valuestring;
        int k = td_tokenize(tok, s, strlen(s), 0, NULL, 0);
        if (k > 0) {
            if (n == cap) { cap = cap ? cap * 2 : 64; ps = realloc(ps, sizeof *ps * (size_t)cap); }
            int keep = k < max_prompt ? k : max_prompt;
            int32_t *ids = malloc(sizeof(int32_t) * (size_t)k);
            td_tokenize(tok, s, strlen(s), 0, ids, k);
            ps[n] = (bench_prompt){.ids = ids, .n = keep};
            n++;
        }
        cJSON_Delete(j);
    }
    free(line);
    fclose(f);
    *out = ps;
    *n_out = n;
    return 0;
}

/* r = a - b: what a group's counters gained over a stretch (the group's
 * totals grow for its lifetime). */
static void stats_sub(td_spec_stats *r, const td_spec_stats *a, const td_spec_stats *b) {
    *r = *a;
    r->rounds -= b->rounds; r->drafted -= b->drafted; r->accepted -= b->accepted; r->emitted -= b->emitted;
    for (int j = 0; j < TD_SPEC_MAX_DEPTH; j++) { r->drafted_at[j] -= b->drafted_at[j]; r->accepted_at[j] -= b->accepted_at[j]; }
    r->t_draft -= b->t_draft; r->t_verify -= b->t_verify; r->t_accept -= b->t_accept; r->t_prefill -= b->t_prefill;
}

/* Decode every prompt with up to B rows at once in group g (borrowed; it lives
 * for the whole benchmark, as a server's does, so what its depth planner has
 * learnt carries from piece to piece); rows are refilled as they finish. */
static int run_all(td_spec *g, const cli_gen_opts *o, int B, bench_prompt *ps, int np, bench_result *res) {
    td_err err = {0};
    td_spec_stats st0, st1;
    td_spec_stats_get(g, -1, &st0);
    int *row_of = malloc(sizeof(int) * (size_t)B), *prompt_of = malloc(sizeof(int) * (size_t)B);
    if (!row_of || !prompt_of) { free(row_of); free(prompt_of); fprintf(stderr, "tandem bench: out of memory\n"); return 1; }
    for (int i = 0; i < B; i++) row_of[i] = -1;
    int next = 0, live = 0, rc = 0;
    double t0 = cli_now();
    for (;;) {
        for (int i = 0; i < B && next < np; i++)
            if (row_of[i] < 0) {
                if (td_spec_add(g, ps[next].ids, ps[next].n, &o->gp, 1, &row_of[i], &err) != 0) { rc = cli_die("add", &err); goto out; }
                prompt_of[i] = next++;
                ps[prompt_of[i]].n_out = 0;
                live++;
            }
        if (!live) break;
        if (td_spec_step(g, &err) < 0) { rc = cli_die("step", &err); goto out; }
        for (int i = 0; i < B; i++) {
            if (row_of[i] < 0) continue;
            bench_prompt *p = &ps[prompt_of[i]];
            int done = 0;
            int k = td_spec_take(g, row_of[i], p->out + p->n_out, NULL, o->gp.max_tokens - p->n_out, NULL, 0, NULL, &done);
            if (k > 0) p->n_out += k;
            if (done) { td_spec_remove(g, row_of[i]); row_of[i] = -1; live--; }
        }
    }
    res->wall_s = cli_now() - t0;
    td_spec_stats_get(g, -1, &st1);
    stats_sub(&res->st, &st1, &st0);
    res->prefill_s = res->st.t_prefill;
    res->tokens = res->st.emitted;
out:
    for (int i = 0; rc && i < B; i++)
        if (row_of[i] >= 0) td_spec_remove(g, row_of[i]);
    free(row_of);
    free(prompt_of);
    return rc;
}

/* acc += r (decode time and tokens; speculative counters) */
static void result_add(bench_result *acc, const bench_result *r) {
    acc->wall_s += r->wall_s;
    acc->prefill_s += r->prefill_s;
    acc->tokens += r->tokens;
    td_spec_stats *a = &acc->st;
    const td_spec_stats *b = &r->st;
    a->rounds += b->rounds; a->drafted += b->drafted; a->accepted += b->accepted; a->emitted += b->emitted;
    for (int j = 0; j < TD_SPEC_MAX_DEPTH; j++) { a->drafted_at[j] += b->drafted_at[j]; a->accepted_at[j] += b->accepted_at[j]; }
    a->t_draft += b->t_draft; a->t_verify += b->t_verify; a->t_accept += b->t_accept; a->t_prefill += b->t_prefill;
}

static double round4(double x) { return round(x * 1e4) / 1e4; }

/* Decode time of a result (prefill excluded). */
static double decode_s(const bench_result *r) { return r->wall_s - r->prefill_s; }

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Median over repetitions of plain seconds / speculative seconds (a speedup
 * per pair of runs taken back to back): robust to a burst of load that hits
 * a few runs, where best-of-N per mode can pair a lucky plain run with an
 * unlucky speculative one. */
static double paired_median(const double *p, const double *s, int n) {
    double v[128];
    int k = 0;
    for (int r = 0; r < n && k < 128; r++)
        if (s[r] > 0) v[k++] = p[r] / s[r];
    if (!k) return 0;
    qsort(v, (size_t)k, sizeof v[0], cmp_double);
    return k % 2 ? v[k / 2] : 0.5 * (v[k / 2 - 1] + v[k / 2]);
}

int cmd_bench_forward(int argc, char **argv); /* bench_forward.c */
int cmd_bench(int argc, char **argv) {
    if (argc >= 2 && !strcmp(argv[1], "forward")) return cmd_bench_forward(argc - 1, argv + 1);
    if (argc < 2 || (strcmp(argv[1], "spec") && strcmp(argv[1], "-h") && strcmp(argv[1], "--help"))) {
        fprintf(stderr, "usage: tandem bench spec [options]  (see tandem bench spec --help)\n");
        return 2;
    }
    if (strcmp(argv[1], "spec")) { bench_help(); return 0; }
    cli_gen_opts o;
    cli_gen_opts_init(&o);
    const char *prompts = NULL;
    long limit = 0, max_prompt = 256, batch = 1, random_k = 0, reps = 1;
    int json = 0;
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        int r = cli_gen_opt(&o, argc, argv, &i);
        if (r < 0) return 2;
        if (r > 0) continue;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { bench_help(); return 0; }
        else if (!strcmp(a, "--prompts")) { if (!cli_need_arg(i, argc, a)) return 2; prompts = argv[++i]; }
        else if (!strcmp(a, "--random")) { if (!cli_need_arg(i, argc, a) || !cli_parse_int(argv[++i], a, 1, 100000, &random_k)) return 2; }
        else if (!strcmp(a, "--limit")) { if (!cli_need_arg(i, argc, a) || !cli_parse_int(argv[++i], a, 1, 1000000, &limit)) return 2; }
        else if (!strcmp(a, "--max-prompt")) { if (!cli_need_arg(i, argc, a) || !cli_parse_int(argv[++i], a, 1, 1 << 20, &max_prompt)) return 2; }
        else if (!strcmp(a, "--batch")) { if (!cli_need_arg(i, argc, a) || !cli_parse_int(argv[++i], a, 1, 256, &batch)) return 2; }
        else if (!strcmp(a, "--reps")) { if (!cli_need_arg(i, argc, a) || !cli_parse_int(argv[++i], a, 1, 100, &reps)) return 2; }
        else if (!strcmp(a, "--json")) json = 1;
        else { fprintf(stderr, "tandem bench spec: unknown option '%s' (see --help)\n", a); return 2; }
    }
    if (!prompts && !random_k) { fprintf(stderr, "tandem bench spec: give --prompts FILE or --random K\n"); return 2; }
    int bundled = o.model_dir == NULL;
    if (!o.model_dir) o.model_dir = cli_default_model_dir();
    if (!o.draft) o.draft = bundled ? cli_default_drafter(o.model_dir) : "ngram";
    td_err err = {0};
    td_model *m = NULL;
    if (td_model_open_params(&m, o.model_dir, &o.mp, &err) != 0) return cli_die(o.model_dir, &err);
    int rc = 1, np = 0;
    bench_prompt *ps = NULL;
    td_drafter *d = NULL;
    td_ctx *c = NULL;
    const td_tokenizer *tok = td_model_tokenizer(m);
    if (random_k) {
        td_model_info info;
        td_model_get_info(m, &info);
        ps = calloc((size_t)random_k, sizeof *ps);
        np = (int)random_k;
        uint64_t s = 12345;
        for (int i = 0; i < np; i++) {
            ps[i].n = 64;
            ps[i].ids = malloc(sizeof(int32_t) * 64);
            for (int k = 0; k < 64; k++) {
                s = s * 6364136223846793005ull + 1442695040888963407ull;
                ps[i].ids[k] = (int32_t)((s >> 33) % (uint64_t)info.n_vocab);
            }
        }
    } else {
        if (!tok) { fprintf(stderr, "tandem bench: %s has no tokenizer.json\n", o.model_dir); goto out; }
        if (load_prompts(prompts, tok, (int)limit, (int)max_prompt, &ps, &np) != 0) goto out;
    }
    if (np == 0) { fprintf(stderr, "tandem bench: no prompts\n"); goto out; }
    for (int i = 0; i < np; i++) {
        ps[i].out = malloc(sizeof(int32_t) * (size_t)(o.gp.max_tokens + 1));
        if (!ps[i].out) goto out;
    }
    if (td_drafter_open(&d, o.draft, m, &err) != 0) { cli_die("--draft", &err); goto out; }
    td_ctx_params cp = td_ctx_default_params();
    cp.max_rows = (int)batch + 1;
    cp.max_ctx = o.ctx ? (int)o.ctx : (int)max_prompt + o.gp.max_tokens + TD_SPEC_MAX_DEPTH + 2;
    cp.max_tokens = cp.max_rows * (TD_SPEC_MAX_DEPTH + 1) > 512 ? cp.max_rows * (TD_SPEC_MAX_DEPTH + 1) : 512;
    cp.max_logits = cp.max_rows * (TD_SPEC_MAX_DEPTH + 1);
    cp.n_threads = (int)o.threads;
    o.kv_type = cli_kv_type(o.kv_type, o.act_type);
    cp.kv_type = o.kv_type;
    cp.act_type = o.act_type;
    if (td_ctx_open(&c, m, &cp, &err) != 0) { cli_die("context", &err); goto out; }
    /* Pieces of the prompt list (one prompt at batch 1, all of them otherwise),
     * each decoded plain then speculatively, reps times; a piece's fastest run
     * per mode counts. The plain tokens of a piece are the reference. */
    bench_result rp = {0}, rs = {0};
    td_spec *gplain = NULL, *gspec = NULL;
    td_spec_params sp = td_spec_default_params();
    sp.max_depth = 0;
    if (td_spec_open(&gplain, c, m, NULL, &sp, &err) != 0) { cli_die("speculative group", &err); goto out; }
    sp.max_depth = d ? o.depth : 0;
    sp.fixed_depth = o.fixed_depth;
    sp.accept = o.accept;
    if (td_spec_open(&gspec, c, m, d, &sp, &err) != 0) { cli_die("speculative group", &err); goto out; }
    int32_t **ref = calloc((size_t)np, sizeof(int32_t *));
    int *nref = calloc((size_t)np, sizeof(int));
    /* decode seconds of repetition r in each mode, summed over pieces: the
     * paired ratios rep_p[r] / rep_s[r] compare runs taken moments apart */
    double *rep_p = calloc((size_t)reps, sizeof(double)), *rep_s = calloc((size_t)reps, sizeof(double));
    if (!ref || !nref || !rep_p || !rep_s) goto out_ref;
    int piece = batch == 1 ? 1 : np, exact = 1, first_diff = -1;
    for (int p0 = 0; p0 < np; p0 += piece) {
        int pn = np - p0 < piece ? np - p0 : piece;
        bench_result bp = {0}, bs = {0};
        for (int rep = 0; rep < reps; rep++) {
            /* odd reps run the speculative pass first, so that neither mode
             * always follows the other (a cache or frequency after-effect
             * then favours each equally); rep 0 is plain first: its tokens
             * are the reference */
            for (int pass = 0; pass < 2; pass++) {
                int spec = (pass == 1) != (rep % 2 == 1);
                bench_result r = {0};
                if (run_all(spec ? gspec : gplain, &o, (int)batch, ps + p0, pn, &r) != 0) goto out_ref;
                if (!spec) {
                    if (rep == 0 || decode_s(&r) < decode_s(&bp)) bp = r;
                    rep_p[rep] += decode_s(&r);
                    for (int i = p0; rep == 0 && i < p0 + pn; i++) {
                        ref[i] = malloc(sizeof(int32_t) * (size_t)(ps[i].n_out + 1));
                        if (!ref[i]) goto out_ref;
                        memcpy(ref[i], ps[i].out, sizeof(int32_t) * (size_t)ps[i].n_out);
                        nref[i] = ps[i].n_out;
                    }
                    continue;
                }
                if (rep == 0 || decode_s(&r) < decode_s(&bs)) bs = r;
                rep_s[rep] += decode_s(&r);
                for (int i = p0; i < p0 + pn; i++)
                    if (nref[i] != ps[i].n_out || memcmp(ref[i], ps[i].out, sizeof(int32_t) * (size_t)nref[i]) != 0) {
                        exact = 0;
                        if (first_diff < 0) first_diff = i;
                    }
            }
        }
        result_add(&rp, &bp);
        result_add(&rs, &bs);
    }
    double dp = decode_s(&rp), ds = decode_s(&rs);
    double plain_tps = dp > 0 ? rp.tokens / dp : 0, spec_tps = ds > 0 ? rs.tokens / ds : 0;
    double mean_acc = td_spec_stats_mean_accepted(&rs.st);
    if (json) {
        cJSON *j = cJSON_CreateObject();
        cJSON_AddStringToObject(j, "model", o.model_dir);
        cJSON_AddStringToObject(j, "drafter", td_drafter_id(d));
        cJSON_AddStringToObject(j, "prompt_source", random_k ? "random" : prompts);
        cJSON_AddNumberToObject(j, "prompts", np);
        cJSON_AddNumberToObject(j, "batch", (double)batch);
        cJSON_AddNumberToObject(j, "max_tokens", o.gp.max_tokens);
        cJSON_AddNumberToObject(j, "reps", (double)reps);
        cJSON_AddNumberToObject(j, "temperature", o.gp.sampling.temperature);
        cJSON_AddStringToObject(j, "accept", o.accept == TD_ACCEPT_MATCH ? "match" : "rejection");
        cJSON_AddNumberToObject(j, "max_depth", d ? o.depth : 0);
        cJSON_AddBoolToObject(j, "fixed_depth", o.fixed_depth);
        cJSON_AddStringToObject(j, "kv_type", td_kv_type_name(o.kv_type));
        cJSON_AddStringToObject(j, "act_type", td_act_type_name(o.act_type));
        cJSON_AddNumberToObject(j, "plain_tokens", (double)rp.tokens);
        cJSON_AddNumberToObject(j, "spec_tokens", (double)rs.tokens);
        cJSON_AddNumberToObject(j, "plain_s", round4(dp));
        cJSON_AddNumberToObject(j, "spec_s", round4(ds));
        cJSON_AddNumberToObject(j, "plain_tps", round4(plain_tps));
        cJSON_AddNumberToObject(j, "spec_tps", round4(spec_tps));
        cJSON_AddNumberToObject(j, "speedup", round4(plain_tps > 0 ? spec_tps / plain_tps : 0));
        cJSON_AddNumberToObject(j, "speedup_paired_median", round4(paired_median(rep_p, rep_s, (int)reps)));
        cJSON *rsp = cJSON_AddArrayToObject(j, "rep_speedups");
        for (int r = 0; rsp && r < reps; r++)
            cJSON_AddItemToArray(rsp, cJSON_CreateNumber(round4(rep_s[r] > 0 ? rep_p[r] / rep_s[r] : 0)));
        cJSON_AddNumberToObject(j, "mean_accepted", round4(mean_acc));
        cJSON_AddNumberToObject(j, "rounds", (double)rs.st.rounds);
        cJSON_AddNumberToObject(j, "drafted", (double)rs.st.drafted);
        cJSON_AddNumberToObject(j, "accepted", (double)rs.st.accepted);
        cJSON *acc = cJSON_AddArrayToObject(j, "acceptance_by_position");
        for (int k = 0; acc && k < TD_SPEC_MAX_DEPTH && rs.st.drafted_at[k]; k++)
            cJSON_AddItemToArray(acc, cJSON_CreateNumber(round4((double)rs.st.accepted_at[k] / rs.st.drafted_at[k])));
        cJSON_AddNumberToObject(j, "t_draft", round4(rs.st.t_draft));
        cJSON_AddNumberToObject(j, "t_verify", round4(rs.st.t_verify));
        cJSON_AddNumberToObject(j, "t_accept", round4(rs.st.t_accept));
        cJSON_AddNumberToObject(j, "t_prefill", round4(rs.st.t_prefill));
        cJSON_AddNumberToObject(j, "plain_t_verify", round4(rp.st.t_verify));
        cJSON_AddNumberToObject(j, "plain_t_accept", round4(rp.st.t_accept));
        cJSON_AddNumberToObject(j, "plain_t_prefill", round4(rp.st.t_prefill));
        cJSON_AddBoolToObject(j, "exact", exact);
        char *txt = cJSON_PrintUnformatted(j);
        cJSON_Delete(j);
        if (!txt) { fprintf(stderr, "tandem bench: out of memory\n"); goto out_ref; }
        printf("%s\n", txt);
        free(txt);
    } else {
        printf("prompts %d, batch %ld, drafter %s, depth %d%s, accept %s, temperature %g\n", np, batch, td_drafter_id(d),
               d ? o.depth : 0, o.fixed_depth ? " (fixed)" : "", o.accept == TD_ACCEPT_MATCH ? "match" : "rejection",
               o.gp.sampling.temperature);
        printf("plain:       %ld tokens in %.3f s = %.1f tok/s\n", rp.tokens, dp, plain_tps);
        printf("speculative: %ld tokens in %.3f s = %.1f tok/s (speedup %.2fx), mean accepted %.2f, tokens/round %.2f\n",
               rs.tokens, ds, spec_tps, plain_tps > 0 ? spec_tps / plain_tps : 0, mean_acc,
               rs.st.rounds ? (double)rs.st.emitted / rs.st.rounds : 0);
        if (reps > 1) printf("paired: median speedup over %ld back-to-back pairs %.3fx\n", reps, paired_median(rep_p, rep_s, (int)reps));
        printf("exact: %s\n", exact ? "yes" : "NO");
    }
    if (!exact) fprintf(stderr, "tandem bench: speculative output differs from plain (first at prompt %d)\n", first_diff);
    rc = 0;
out_ref:
    free(rep_p);
    free(rep_s);
    for (int i = 0; ref && i < np; i++) free(ref[i]);
    free(ref);
    free(nref);
out:
    for (int i = 0; ps && i < np; i++) { free(ps[i].ids); free(ps[i].out); }
    free(ps);
    td_spec_free(gspec);
    td_spec_free(gplain);
    td_ctx_free(c);
    td_drafter_free(d);
    td_model_free(m);
    return rc;
}
