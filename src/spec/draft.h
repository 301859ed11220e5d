/* draft — the draft contract: what every drafter implements.
 *
 * A provider (td_drafter) lives as long as the process serves its target: it
 * owns the draft machinery (a second model's weights, a learned head, nothing
 * for prompt lookup). For each speculative group it opens a ROW GROUP, which
 * holds per-row draft state for the rows that draft, in the group's dense row
 * order. Every round the speculative group:
 *   1. calls draft(): each row's pending token (sampled by the target, not yet
 *      in any KV) and the depth chosen for it -> up to depth proposals per row
 *      (a row may propose fewer, e.g. no n-gram match), optionally with the
 *      drafter's probabilities q over the vocabulary for each proposal;
 *   2. verifies all rows in one target forward and accepts;
 *   3. calls commit() for EVERY row, also rows drafted at depth 0: the row's
 *      committed stream grew by [old pending, d_1..d_m] (m accepted drafts) and
 *      its new pending token is the target's sample after them. Tapping drafters
 *      get the target's hidden rows for exactly those m+1 positions; rejected
 *      positions never reach a drafter.
 * Membership changes (append, filter) and capture happen only between rounds.
 * A provider differs from another only in what fills the draft; verification,
 * acceptance, rollback, sampling and statistics belong to the group. */
#ifndef TD_DRAFT_H
#define TD_DRAFT_H

#include "tandem.h"
#include <stddef.h>
#include <stdint.h>

/* An owned, immutable snapshot of one row's draft state (opaque bytes tagged by
 * the provider's namespace); restored by append into a group of the same
 * provider kind. */
typedef struct td_draft_checkpoint {
    char ns[64];          /* provider namespace, e.g. "ngram-v1" */
    size_t size;
    unsigned char *data;  /* owned, [size] */
} td_draft_checkpoint;
void td_draft_checkpoint_free(td_draft_checkpoint *ck);
/* A new checkpoint of namespace ns holding `size` bytes (uninitialised) for a
 * provider's capture to fill; *out is owned by the caller (NULL on failure). */
int td_draft_checkpoint_new(td_draft_checkpoint **out, const char *ns, size_t size, td_err *err);

/* A draft request for all rows of a row group. */
typedef struct td_draft_req {
    int n_rows;
    const int32_t *pending;   /* [n_rows] borrowed */
    const int *depth;         /* [n_rows] 0..max_depth (0 = propose nothing) */
    int max_depth;            /* row stride of tokens / probs */
    int32_t *tokens;          /* [n_rows][max_depth] out */
    int *n_tokens;            /* [n_rows] out: proposals written, <= depth */
    float *probs;             /* [n_rows][max_depth][n_vocab] out, or NULL when the
                                 group does not need q (match rule). A drafter
                                 without probabilities sets has_probs = 0. */
    int has_probs;            /* out: 1 when probs were written */
    const td_sampling *const *sampling; /* [n_rows] borrowed: each row's sampling (for
                                 drafters that sample under the rejection rule) */
    const uint64_t *out_pos;  /* [n_rows] output position of the row's next token */
    const unsigned char *own; /* [n_rows] or NULL: 1 = draft the row with the drafter itself,
                                 skipping its own prompt lookup (the group declined the
                                 lookup's offer for it: the drafter's drafts pay better) */
    int steps;                /* out, optional: the draft steps this call ran, in the unit of
                                 td_drafter.step_extra (the block drafter: the entries of its
                                 longest row block; 0 when no forward ran). The group sets -1
                                 first; left so, it counts the deepest row's proposals. */
} td_draft_req;

/* What one row committed in a round. */
typedef struct td_draft_commit {
    int32_t old_pending;      /* the token verified first this round */
    const int32_t *accepted;  /* [n_accepted] borrowed: the accepted drafts */
    int n_accepted;
    int32_t new_pending;      /* the target's sample after them */
    const float *taps;        /* [(n_accepted+1)][n_taps][n_embd] borrowed, or NULL */
} td_draft_commit;

/* Row-group operations. Each slot says when it is called and who owns what. */
typedef struct td_draft_rows_vt {
    /* required. Append one row at the end of the group. tokens[0..n) is the
     * row's committed stream so far (its prompt; borrowed for the call); the
     * row's pending token comes with the first draft(). taps: the target's
     * hidden rows for those n positions ([n][n_taps][n_embd]) when the provider
     * taps, else NULL. ck: a checkpoint to restore instead (borrowed), or NULL. */
    int (*append)(void *g, const int32_t *tokens, int n, const float *taps,
                  const td_draft_checkpoint *ck, td_err *err);
    /* required. Propose drafts for every row (see td_draft_req). */
    int (*draft)(void *g, td_draft_req *req, td_err *err);
    /* optional. Proposals that cost no forward to make (copied from the row's
     * own stream: prompt lookup), asked for before the group plans the round's
     * depths, so the plan knows what each row has on offer and weighs it at
     * no draft cost. For each row i: up to max_depth tokens to follow
     * pending[i] into tokens[i * max_depth ..] and their count into
     * n_tokens[i] (0: nothing on offer), and into match[i] the length of the
     * context match behind it (the n-gram that recurred; 0: not a lookup) —
     * a longer match is accepted more often, and the group keeps acceptance
     * estimates per strength. Called at most once a round, before draft(),
     * and only under the match rule (an offer has no probabilities).
     * A row the group drafts from its offer gets depth 0 in that round's
     * draft(): the drafter sees a row it was not asked to draft, and commit()
     * then tells it what was accepted as for any row. */
    int (*offer)(void *g, const int32_t *pending, int max_depth, int32_t *tokens, int *n_tokens, int *match,
                 td_err *err);
    /* required. cm[0..n_rows) in row order, one per row, every round. */
    int (*commit)(void *g, const td_draft_commit *cm, int n_rows, td_err *err);
    /* required. Keep rows keep[0..n_keep) (ascending old indices), in that order. */
    void (*filter)(void *g, const int *keep, int n_keep);
    /* optional. Snapshot row `row` into a new owned checkpoint. */
    int (*capture)(void *g, int row, td_draft_checkpoint **out, td_err *err);
    /* required. Free the group and all its rows. */
    void (*free)(void *g);
} td_draft_rows_vt;

typedef struct td_draft_rows {
    const td_draft_rows_vt *vt;
    void *self;               /* the implementation's group state, owned */
    int n_rows;               /* maintained by the wrappers below */
} td_draft_rows;

/* Provider operations. */
typedef struct td_drafter_vt {
    /* required. Open a row group for max_rows rows at most, streams of up to
     * max_ctx tokens and drafts of up to max_depth tokens; the group is owned
     * by the caller (td_draft_rows_free). target_ctx (borrowed, may be NULL) is
     * the context the target verifies in, driven from the same thread: a
     * drafter running its own forwards shares its threads. */
    int (*open_rows)(void *self, int max_rows, int max_ctx, int max_depth, const td_ctx *target_ctx,
                     td_draft_rows *out, td_err *err);
    /* optional. Target layers whose hidden states the provider's rows consume,
     * in capture order (td_batch.taps semantics). Absent: no taps. */
    int (*tap_layers)(void *self, const int **layers);
    /* required. Free the provider. */
    void (*free)(void *self);
} td_drafter_vt;

struct td_drafter {
    const td_drafter_vt *vt;
    void *self;               /* owned */
    char id[256];
    char ns[64];              /* checkpoint namespace */
    size_t weight_bytes;
    double step_cost_hint;    /* a draft step's cost as a fraction of a one-token target
                                 forward, before any is measured (the planner's prior) */
    int step_extra;           /* steps a drafting round costs beyond one per position of its
                                 deepest row: 0 for autoregressive drafters (depth k, k steps);
                                 1 for the block drafter (one forward over the anchor's entry
                                 and k masked ones) */
    int max_drafts;           /* the most proposals draft() makes for a row, offers aside
                                 (the block drafter: block_size - 1); 0: no limit of its own */
    int offers_all;           /* 1: every proposal the drafter makes is on offer (rows_vt.offer),
                                 so a row with nothing on offer is not drafted at all */
    const td_model *target;   /* borrowed */
};

/* Bind tensor `name` of a drafter's weight file f to t, with an exact shape
 * check ([d0] when d1 == 0, else [d0][d1]); path names the file in errors. */
struct td_st_file;
struct td_tensor;
int td_draft_bind(const struct td_st_file *f, struct td_tensor *t, const char *name, int64_t d0, int64_t d1,
                  const char *path, td_err *err);

/* A drafter's weights: DIR/model.safetensors, or the shards that
 * DIR/model.safetensors.index.json's "weight_map" names (plain file names in
 * DIR, as transformers writes them; files stay under 16 MB in a repository). */
#define TD_DRAFT_MAX_SHARDS 8
typedef struct td_draft_weights {
    int n;                                      /* files open */
    struct td_st_file *f[TD_DRAFT_MAX_SHARDS];  /* owned mappings */
    char path[TD_DRAFT_MAX_SHARDS][1280];       /* their paths, for messages */
    size_t bytes;                               /* mapped bytes in all */
} td_draft_weights;
int td_draft_weights_open(td_draft_weights *w, const char *dir, td_err *err);
void td_draft_weights_free(td_draft_weights *w);
/* td_draft_bind on whichever file holds `name` (exactly one may). */
int td_draft_weights_bind(const td_draft_weights *w, struct td_tensor *t, const char *name, int64_t d0, int64_t d1,
                          td_err *err);

/* For a drafter's own context (td_ctx_params.serial_tokens): how many new
 * tokens a forward of model view v may hold and still run on the calling thread
 * alone. A small drafter's matrices take microseconds each, less than handing
 * them to the pool's workers and back; the bound is TD_DRAFT_SERIAL_MACS
 * multiply-adds (a token's: its layers' products and its LM-head rows, i.e. the
 * draft vocabulary). 0 for a model too large for one token to qualify.
 * The bound was 4 M, set on a box loaded 8-11 deep, where the workers had no
 * core to wake on; on a quiet 2-core machine the bundled draft model (1.8 M a
 * token at vocab=1024) and MTP head (2.3 M) draft 25-45% faster on both threads
 * (in-process, depth 1 and 3, after a target forward; bench/forward-notes.md),
 * so only drafters under 1 M a token stay on the calling thread. */
#define TD_DRAFT_SERIAL_MACS 1000000.0
struct td_model;
int td_draft_serial_tokens(const struct td_model *v);

/* A drafter's own matmul weights in memory as Q8_0 / Q4_0 (spec option
 * quant=q8_0|q4_0): the seven matrices of each of the n_layer layers L and the
 * tensors extra[0..n_extra-1], quantized into one arena (*arena: owned by the
 * caller, free() it) and rebound to it. *delta: bytes the drafter's resident
 * weights change by (negative: the quantized copies replace what the mapping
 * held). On error nothing was changed. */
struct td_layer_w;
int td_draft_quantize(struct td_layer_w *L, int n_layer, struct td_tensor **extra, int n_extra, int dtype,
                      void **arena, long long *delta, td_err *err);
/* The same matrices' R16 repacks (nn/q8r.h) where they are Q8_0, for a target
 * context of act_type amx (td_tensors_repack_q8r; *arena owned by the caller,
 * NULL when nothing was repacked), made once: under a lock shared by all
 * drafters, nothing is done when *done is set, and *done is set on success (a
 * drafter's groups may be opened on several threads at once). With iarena
 * (may be NULL), where the CPU has AMX-INT8, the Q8_0 matrices whose width is
 * a multiple of 64 also get int8 copies with a scale per row (td_tensor.ip,
 * nn/i8t.h) in *iarena (owned by the caller, free() it): products of several
 * tokens run on the AMX-INT8 tiles (a drafter's block of entries). */
int td_draft_repack_q8r(int *done, struct td_layer_w *L, int n_layer, struct td_tensor **extra, int n_extra,
                        void **arena, void **iarena, td_err *err);
/* "q8_0" / "q4_0" -> TD_DTYPE_*; 0 for anything else. */
int td_draft_quant_parse(const char *s);

/* Prompt lookup (the ngram drafter's, and option lookup=N of the model and MTP drafters):
 * the most recent earlier occurrence of the last n tokens of s[0..len); returns
 * the index just past it (what followed it starts there), or -1. */
int td_ngram_find(const int32_t *s, int len, int n);
/* The same for the longest n in n_min..n_max that recurs, in one pass over s
 * (the result of td_ngram_find for n = n_max, n_max - 1, ... down to the
 * first that matches); *matched (may be NULL): that n, 0 when none. */
int td_ngram_longest(const int32_t *s, int len, int n_min, int n_max, int *matched);
#define TD_LOOKUP_MAX 8 /* the longest n-gram a drafter's lookup tries first */
/* A drafter's prompt lookup (option lookup=N of the model and MTP drafters):
 * with the pending token appended to the committed stream s[0..len) (s must
 * have room for it at s[len]), the longest n-gram of n_min..TD_LOOKUP_MAX tokens
 * ending there that occurred before proposes what followed it: up to max_out
 * tokens into out. Returns how many (0: no match); *matched (may be NULL): the
 * length of the n-gram that matched. */
int td_draft_lookup(int32_t *s, int len, int32_t pending, int n_min, int max_out, int32_t *out, int *matched);
/* The offer (rows_vt.offer) of option lookup=N for a group of n_rows rows:
 * row i's proposals are td_draft_lookup's over the stream stream_of(g, i, &len)
 * returns (its committed tokens, with room for one more); nothing on offer
 * when n_min is 0 (lookup= not given). */
void td_draft_offer_lookup(void *g, int n_rows, int32_t *(*stream_of)(void *g, int i, int *len), int n_min,
                           const int32_t *pending, int max_depth, int32_t *tokens, int *n_tokens, int *match);

/* Small wrappers so callers never touch the tables directly. */
static inline int td_draft_rows_append(td_draft_rows *r, const int32_t *t, int n, const float *taps,
                                       const td_draft_checkpoint *ck, td_err *err) {
    int rc = r->vt->append(r->self, t, n, taps, ck, err);
    if (rc == 0) r->n_rows++;
    return rc;
}
static inline int td_draft_rows_draft(td_draft_rows *r, td_draft_req *q, td_err *err) {
    return r->vt->draft(r->self, q, err);
}
/* 1 when the group offers proposals before planning (td_draft_rows_vt.offer). */
static inline int td_draft_rows_can_offer(const td_draft_rows *r) { return r->vt && r->vt->offer; }
static inline int td_draft_rows_offer(td_draft_rows *r, const int32_t *pending, int max_depth, int32_t *tokens,
                                      int *n_tokens, int *match, td_err *err) {
    return r->vt->offer(r->self, pending, max_depth, tokens, n_tokens, match, err);
}
static inline int td_draft_rows_commit(td_draft_rows *r, const td_draft_commit *cm, td_err *err) {
    return r->vt->commit(r->self, cm, r->n_rows, err);
}
static inline void td_draft_rows_filter(td_draft_rows *r, const int *keep, int n_keep) {
    r->vt->filter(r->self, keep, n_keep);
    r->n_rows = n_keep;
}
static inline void td_draft_rows_free(td_draft_rows *r) {
    if (r->vt) r->vt->free(r->self);
    r->vt = NULL;
    r->self = NULL;
    r->n_rows = 0;
}
static inline int td_drafter_taps(const td_drafter *d, const int **layers) {
    if (!d || !d->vt->tap_layers) { *layers = NULL; return 0; }
    return d->vt->tap_layers(d->self, layers);
}

/* Provider constructors, one per drafter file in spec/drafters/. */
int td_drafter_ngram_open(td_drafter **out, const char *args, const td_model *target, td_err *err);
/* quant: 0, or TD_DTYPE_Q8_0 / TD_DTYPE_Q4_0 to quantize the drafter's own
 * matrices at load (cheaper draft steps; the target's verification keeps the
 * output exact). lookup: 0, or N in 1..TD_LOOKUP_MAX for prompt lookup first
 * (td_draft_lookup). */
int td_drafter_model_open(td_drafter **out, const char *dir, int n_sub, int quant, int lookup, const td_model *target,
                          td_err *err);
int td_drafter_mtp_open(td_drafter **out, const char *dir, int n_sub, int quant, int lookup, const td_model *target,
                        td_err *err);
/* spec: "DIR[,prune=on|off][,vocab=N][,quant=q8_0|q4_0]" (the part after "block:") */
int td_drafter_block_open(td_drafter **out, const char *spec, const td_model *target, td_err *err);

#endif
