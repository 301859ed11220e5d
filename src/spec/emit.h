/* emit — turns a row's emitted tokens into released text, matching stop strings.
 *
 * Shared by plain generation and the speculative group so that both stop at the
 * same token: text is accumulated through the streaming UTF-8 decoder; after
 * each token the stop strings are searched in the not-yet-released text; text
 * that could still be the start of a stop string is held back. The buffer grows
 * by doubling (amortised, never per token in steady state). */
#ifndef TD_EMIT_H
#define TD_EMIT_H

#include "tandem.h"
#include <stddef.h>

typedef struct td_emitter {
    char *buf;            /* owned; emitted text */
    size_t len, cap;
    size_t sent;          /* bytes released to the consumer */
    size_t upto;          /* bytes releasable now (<= len) */
    td_utf8_stream us;
    const char *const *stop; /* borrowed */
    int n_stop;
} td_emitter;

void td_emit_init(td_emitter *e, const char *const *stop, int n_stop);
void td_emit_free(td_emitter *e);
/* Add one token's text. Returns 1 when a stop string now occurs (the text is cut
 * before it and the stream must end), 0 otherwise, negative on error. */
int td_emit_token(td_emitter *e, const td_tokenizer *tok, int32_t id);
/* End of stream: release held-back bytes (incomplete UTF-8 as U+FFFD). */
int td_emit_finish(td_emitter *e);

#endif
