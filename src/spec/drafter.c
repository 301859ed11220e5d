/* drafter — opens a drafter from its spec string and frees providers.
 * "none" | "ngram[:MIN-MAX]" | "model:DIR" | "mtp:DIR". Each kind lives in spec/drafters/. */
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
    if (!strncmp(spec, "model:", 6)) return td_drafter_model_open(out, spec + 6, target, err);
    if (!strncmp(spec, "mtp:", 4)) return td_drafter_mtp_open(out, spec + 4, target, err);
    return td_seterr(err, TD_EINVAL, "unknown drafter '%s' (use none, ngram[:MIN-MAX], model:DIR or mtp:DIR)", spec);
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
