/* drafter — opens a drafter from its spec string and frees providers.
 * "none" | "ngram[:MIN-MAX]" | "model:DIR[,vocab=N]" | "mtp:DIR[,vocab=N]" | "block:DIR[,prune=on|off]".
 * Each kind lives in spec/drafters/. */
#include "spec/draft.h"
#include "util/util.h"

#include <stdlib.h>
#include <string.h>

int td_drafter_open(td_drafter **out, const char *spec, const td_model *target, td_err *err) {
    *out = NULL;
    if (!spec || !target) return td_seterr(err, TD_EINVAL, "td_drafter_open: NULL spec or target");
    if (!strcmp(spec, "none") || !*spec) return 0;
    if (!strcmp(spec, "ngram")) return td_drafter_ngram_open(out, NULL, target, err);
    if (!strncmp(spec, "ngram:", 6)) return td_drafter_ngram_open(out, spec + 6, target, err);
    if (!strncmp(spec, "model:", 6) || !strncmp(spec, "mtp:", 4)) {
        /* KIND:DIR[,vocab=N] */
        int is_model = spec[1] == 'o';
        char dir[4096];
        snprintf(dir, sizeof dir, "%s", spec + (is_model ? 6 : 4));
        int n_sub = 0;
        char *opt = strstr(dir, ",vocab=");
        if (opt) {
            char *end;
            long v = strtol(opt + 7, &end, 10);
            if (*end || end == opt + 7 || v < 1 || v > (1L << 24))
                return td_seterr(err, TD_EINVAL, "draft vocabulary in '%s' must be a positive count, as %s:DIR,vocab=4096", spec,
                                 is_model ? "model" : "mtp");
            n_sub = (int)v;
            *opt = 0;
        }
        return is_model ? td_drafter_model_open(out, dir, n_sub, target, err) : td_drafter_mtp_open(out, dir, n_sub, target, err);
    }
    if (!strncmp(spec, "block:", 6)) return td_drafter_block_open(out, spec + 6, target, err);
    return td_seterr(err, TD_EINVAL, "unknown drafter '%s' (use none, ngram[:MIN-MAX], model:DIR, mtp:DIR or block:DIR)", spec);
}

void td_drafter_free(td_drafter *d) {
    if (!d) return;
    d->vt->free(d->self);
    free(d);
}

const char *td_drafter_id(const td_drafter *d) { return d ? d->id : "none"; }
size_t td_drafter_weight_bytes(const td_drafter *d) { return d ? d->weight_bytes : 0; }

void td_draft_checkpoint_free(td_draft_checkpoint *ck) {
    if (!ck) return;
    free(ck->data);
    free(ck);
}
