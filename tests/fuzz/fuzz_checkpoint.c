/* fuzz_checkpoint — libFuzzer harness for restoring a drafter row from a
 * checkpoint (src/spec/drafters/ngram.c and model.c: rows_vt.append with a
 * td_draft_checkpoint, src/spec/draft.h).
 *
 * Checkpoints are made by a provider's capture and restored into a group of
 * the same kind within one process; they are not read from files or the
 * network. The restore still validates them (namespace, size, token range,
 * context), and that validation is what this exercises. Design: a tiny target
 * (tests/fixtures/qwen3-rand, vocabulary 512) and two drafters over it are
 * opened once: "ngram" and "model:" the same directory (a draft model whose
 * restore prefills its own KV). The first input byte picks the drafter (bit 0)
 * and the namespace (bit 1 set: a wrong one); the rest is the checkpoint's
 * bytes. A restore must either fail with a message or give a row whose capture
 * holds the same bytes and that then drafts once (or refuses with a message:
 * a restored stream may fill the context). Run from the
 * repository root, or set TD_FUZZ_MODEL. */
#include "spec/draft.h"
#include "tandem.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_ROWS 2
#define MAX_CTX 64
#define MAX_DEPTH 4

static td_model *target;
static td_drafter *drafters[2];

static void setup(void) {
    const char *dir = getenv("TD_FUZZ_MODEL");
    if (!dir) dir = "tests/fixtures/qwen3-rand";
    char spec[4200];
    td_err err = {0};
    if (td_model_open(&target, dir, &err)) { fprintf(stderr, "fuzz_checkpoint: %s\n", err.msg); abort(); }
    snprintf(spec, sizeof spec, "model:%s", dir);
    if (td_drafter_open(&drafters[0], "ngram", target, &err) || td_drafter_open(&drafters[1], spec, target, &err)) {
        fprintf(stderr, "fuzz_checkpoint: %s\n", err.msg);
        abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!target) setup();
    if (size < 1) return 0;
    td_drafter *d = drafters[data[0] & 1];
    td_err err = {0};
    td_draft_rows rows = {0};
    if (d->vt->open_rows(d->self, MAX_ROWS, MAX_CTX, MAX_DEPTH, NULL, &rows, &err)) abort();

    td_draft_checkpoint *ck = NULL;
    const char *ns = (data[0] & 2) ? ((data[0] & 1) ? "ngram-v1" : "model-v1") : d->ns;
    if (td_draft_checkpoint_new(&ck, ns, size - 1, &err)) abort();
    if (size > 1) memcpy(ck->data, data + 1, size - 1);
    int rc = td_draft_rows_append(&rows, NULL, 0, NULL, ck, &err);
    if (rc) {
        if (rc > 0 || !err.msg[0] || rows.n_rows != 0) abort();
    } else {
        td_draft_checkpoint *back = NULL;
        if (rows.vt->capture(rows.self, 0, &back, &err)) abort();
        if (back->size != ck->size || (ck->size && memcmp(back->data, ck->data, ck->size)) || strcmp(back->ns, ck->ns)) abort();
        td_draft_checkpoint_free(back);
        int32_t pending = 1, toks[MAX_DEPTH];
        int depth = MAX_DEPTH, n_tok = 0;
        td_sampling smp = td_sampling_default();
        const td_sampling *sp = &smp;
        uint64_t pos = 0;
        td_draft_req q = {.n_rows = 1, .pending = &pending, .depth = &depth, .max_depth = MAX_DEPTH,
                          .tokens = toks, .n_tokens = &n_tok, .probs = NULL, .sampling = &sp, .out_pos = &pos};
        rc = td_draft_rows_draft(&rows, &q, &err);
        if (rc) { /* e.g. a restored stream that fills the context leaves no room */
            if (rc > 0 || !err.msg[0]) abort();
        } else {
            if (n_tok < 0 || n_tok > MAX_DEPTH) abort();
            for (int i = 0; i < n_tok; i++)
                if (toks[i] < 0 || toks[i] >= 512) abort();
        }
    }
    td_draft_checkpoint_free(ck);
    td_draft_rows_free(&rows);
    return 0;
}
