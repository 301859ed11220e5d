/* fuzz_checkpoint — libFuzzer harness for restoring a drafter row from a
 * checkpoint (src/spec/drafters/ngram.c, model.c, mtp.c and block.c:
 * rows_vt.append with a td_draft_checkpoint, src/spec/draft.h).
 *
 * Checkpoints are made by a provider's capture and restored into a group of
 * the same kind within one process; they are not read from files or the
 * network. The restore still validates them (namespace, size, token range,
 * finiteness, context), and that validation is what this exercises. Design:
 * four drafters are opened once — "ngram" and "model:" over a tiny target
 * (tests/fixtures/qwen3-rand, vocabulary 512; the draft model's restore
 * prefills its own KV), and the trained MTP head and block drafter of
 * models/tiny-code over their target (vocabulary 16384). The first input
 * byte picks the drafter (bits 0-1: ngram, model, mtp, block) and the
 * namespace (bit 2 set: another drafter's); the rest is the checkpoint's
 * bytes. A restore must either fail with a message or give a row whose
 * capture holds the same bytes (for the block drafter: whose capture restores
 * to a row that captures the same bytes again) and that then drafts once (or
 * refuses with a message: a restored stream may fill the context). Run from the repository
 * root, or set TD_FUZZ_MODEL (the small target) and TD_FUZZ_TINY (the
 * models/tiny-code directory). */
#include "model/model.h"
#include "spec/draft.h"
#include "tandem.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_ROWS 2
#define MAX_CTX 64
#define MAX_DEPTH 4

static td_model *targets[2]; /* the small target, the tiny-code one */
static td_drafter *drafters[4];

static void fail(const char *msg) {
    fprintf(stderr, "fuzz_checkpoint: %s\n", msg);
    abort();
}

static void setup(void) {
    const char *dir = getenv("TD_FUZZ_MODEL"), *tiny = getenv("TD_FUZZ_TINY");
    if (!dir) dir = "tests/fixtures/qwen3-rand";
    if (!tiny) tiny = "models/tiny-code";
    char spec[4200];
    td_err err = {0};
    if (td_model_open(&targets[0], dir, &err)) fail(err.msg);
    snprintf(spec, sizeof spec, "%s/target", tiny);
    if (td_model_open(&targets[1], spec, &err)) fail(err.msg);
    if (td_drafter_open(&drafters[0], "ngram", targets[0], &err)) fail(err.msg);
    snprintf(spec, sizeof spec, "model:%s", dir);
    if (td_drafter_open(&drafters[1], spec, targets[0], &err)) fail(err.msg);
    snprintf(spec, sizeof spec, "mtp:%s/mtp", tiny);
    if (td_drafter_open(&drafters[2], spec, targets[1], &err)) fail(err.msg);
    snprintf(spec, sizeof spec, "block:%s/block", tiny);
    if (td_drafter_open(&drafters[3], spec, targets[1], &err)) fail(err.msg);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!targets[0]) setup();
    if (size < 1) return 0;
    int kind = data[0] & 3;
    td_drafter *d = drafters[kind];
    td_err err = {0};
    td_draft_rows rows = {0};
    if (d->vt->open_rows(d->self, MAX_ROWS, MAX_CTX, MAX_DEPTH, NULL, &rows, &err)) abort();

    td_draft_checkpoint *ck = NULL;
    const char *ns = (data[0] & 4) ? drafters[(kind + 1) & 3]->ns : d->ns;
    if (td_draft_checkpoint_new(&ck, ns, size - 1, &err)) abort();
    if (size > 1) memcpy(ck->data, data + 1, size - 1);
    int rc = td_draft_rows_append(&rows, NULL, 0, NULL, ck, &err);
    if (rc) {
        if (rc > 0 || !err.msg[0] || rows.n_rows != 0) abort();
    } else {
        /* the capture holds the same bytes (the block drafter keeps only the
         * context ids its vocabulary lacks, so its capture may drop some: its
         * capture must be a fixed point, restored and captured again) */
        td_draft_checkpoint *back = NULL, *again = NULL;
        if (rows.vt->capture(rows.self, 0, &back, &err)) abort();
        if (strcmp(back->ns, ck->ns)) abort();
        if (kind != 3 && (back->size != ck->size || (ck->size && memcmp(back->data, ck->data, ck->size)))) abort();
        if (td_draft_rows_append(&rows, NULL, 0, NULL, back, &err) || rows.vt->capture(rows.self, 1, &again, &err)) abort();
        if (again->size != back->size || (back->size && memcmp(again->data, back->data, back->size))) abort();
        td_draft_checkpoint_free(again);
        td_draft_checkpoint_free(back);
        /* both rows (the restored one and its copy) draft once */
        int32_t pending[MAX_ROWS] = {1, 2}, toks[MAX_ROWS * MAX_DEPTH];
        int depth[MAX_ROWS] = {MAX_DEPTH, MAX_DEPTH}, n_tok[MAX_ROWS] = {0, 0};
        td_sampling smp = td_sampling_default();
        const td_sampling *sp[MAX_ROWS] = {&smp, &smp};
        uint64_t pos[MAX_ROWS] = {0, 0};
        td_draft_req q = {.n_rows = MAX_ROWS, .pending = pending, .depth = depth, .max_depth = MAX_DEPTH,
                          .tokens = toks, .n_tokens = n_tok, .probs = NULL, .sampling = sp, .out_pos = pos};
        rc = td_draft_rows_draft(&rows, &q, &err);
        if (rc) { /* e.g. a restored stream that fills the context leaves no room */
            if (rc > 0 || !err.msg[0]) abort();
        } else {
            for (int r = 0; r < MAX_ROWS; r++) {
                if (n_tok[r] < 0 || n_tok[r] > MAX_DEPTH) abort();
                for (int i = 0; i < n_tok[r]; i++)
                    if (toks[r * MAX_DEPTH + i] < 0 || toks[r * MAX_DEPTH + i] >= d->target->cfg.n_vocab) abort();
            }
        }
    }
    td_draft_checkpoint_free(ck);
    td_draft_rows_free(&rows);
    return 0;
}
