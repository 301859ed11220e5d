/* vocab — a drafter's draft vocabulary: the token ids its LM head keeps.
 *
 * A drafter's LM head (vocabulary x hidden) is usually its largest matrix, and a
 * draft step pays for all of it. `vocab=N` keeps N ids. Which ones: the first N
 * of DIR/draft_vocab.json's "ranked_ids" when the drafter's directory has that
 * file (the ids the target emits most, most frequent first — written by
 * tools/draftvocab/rank.py), else ids 0..N-1 (byte-level BPE ids follow merge
 * order, a proxy for frequency). A ranked subset gathers its rows of the LM head
 * into one owned matrix at open (once, not per token); an id prefix is a view.
 * Draft logit j stands for token td_draft_vocab_id(v, j).
 *
 * Code copies identifiers from its context, and those are rare tokens: a row
 * also keeps its CONTEXT IDS — ids of its prompt and output outside the kept
 * set (up to a cap), whose LM-head rows it gathers as they first appear; a greedy
 * draft picks the best of the kept logits and the context ids' logits (one dot
 * each with the drafter's final-normed hidden state: the same D16 dot as the
 * full head). Proposals come from these ids only; the target's verification
 * makes that harmless to the output. Sampled drafts (rejection rule) use the
 * kept ids alone. */
#ifndef TD_SPEC_VOCAB_H
#define TD_SPEC_VOCAB_H

#include "model/model.h"

typedef struct td_draft_vocab {
    int n_sub;         /* ids kept (= the full vocabulary when no vocab=N) */
    int n_vocab;       /* the full vocabulary */
    int32_t *ids;      /* [n_sub] owned: token id of draft logit j; NULL = ids 0..n_sub-1 */
    void *rows;        /* owned gathered LM-head rows [n_sub][row bytes], or NULL (a view) */
    int ranked;        /* 1 when the ids came from draft_vocab.json */
    uint8_t *kept;     /* [n_vocab] owned: 1 = a kept id; NULL when all are kept */
    td_tensor full;    /* the whole LM head (borrowed view, for context ids) */
} td_draft_vocab;

/* Set up v for n_sub ids (0 = keep the whole vocabulary) of a drafter in `dir`
 * whose LM head is *head ([n_vocab][n_embd], any dtype): reads dir/draft_vocab.json
 * if present (a malformed file is an error naming it), and rewrites *head into
 * the draft head: a view of its first n_sub rows, or the gathered rows (owned by
 * v, valid until td_draft_vocab_free). On failure v holds nothing to free. */
int td_draft_vocab_open(td_draft_vocab *v, const char *dir, int n_sub, td_tensor *head, td_err *err);
void td_draft_vocab_free(td_draft_vocab *v);

static inline int32_t td_draft_vocab_id(const td_draft_vocab *v, int j) { return v->ids ? v->ids[j] : (int32_t)j; }

/* Spread q over the draft vocabulary (q_sub[n_sub]) onto the full vocabulary
 * (q[n_vocab]): zero for ids not kept. q may be q_sub only for an id prefix
 * (v->ids NULL). */
void td_draft_vocab_scatter(const td_draft_vocab *v, const float *q_sub, float *q);

/* One row's context ids (see above). Empty and allocation-free when the draft
 * vocabulary keeps every id. */
typedef struct td_draft_ctxids {
    int n, cap;
    int32_t *ids;      /* [cap] owned */
    uint8_t *seen;     /* [n_vocab] owned: 1 = in ids */
    void *rows;        /* [cap][row bytes] owned: their LM-head rows */
} td_draft_ctxids;

#define TD_DRAFT_CTXIDS 1024 /* context ids a row keeps at most */

int td_draft_ctxids_init(td_draft_ctxids *c, const td_draft_vocab *v, td_err *err);
void td_draft_ctxids_free(td_draft_ctxids *c);
/* Note tokens of the row's stream (prompt or committed output). */
void td_draft_ctxids_note(const td_draft_vocab *v, td_draft_ctxids *c, const int32_t *t, int n);

/* The greedy draft token: the best of the kept logits lg[n_sub] and the row's
 * context ids (whose logits are the full head's rows times hn, the drafter's
 * final-normed hidden state [n_embd]; c NULL or empty: the kept ids only).
 * Ties go to the earlier candidate (kept ids in rank order first).
 * scratch: [TD_DRAFT_CTXIDS] floats. */
int32_t td_draft_vocab_pick(const td_draft_vocab *v, const float *lg, const td_draft_ctxids *c, const float *hn,
                            float *scratch);

/* The context ids' logits from the full head's rows for M inputs:
 * out[m*c->n + j] (+)= rows_j . x_m for j < c->n (add = 1 accumulates, as a
 * second matrix's bias would). x: [M][head's row width]. Each value is the same
 * whatever M (td_matmul is batch invariant). */
void td_draft_ctxids_logits(const td_draft_vocab *v, const td_draft_ctxids *c, const float *x, int M, float *out, int add);
/* The greedy pick given the kept logits lg[n_sub] and the context ids' logits
 * cl[c->n] (c NULL or empty: the kept ids only); ties as td_draft_vocab_pick. */
int32_t td_draft_vocab_best(const td_draft_vocab *v, const float *lg, const td_draft_ctxids *c, const float *cl);

#endif
