/* emit — see emit.h. */
#include "spec/emit.h"

#include <stdlib.h>
#include <string.h>

void td_emit_init(td_emitter *e, const char *const *stop, int n_stop) {
    memset(e, 0, sizeof *e);
    e->stop = stop;
    e->n_stop = n_stop;
}

void td_emit_free(td_emitter *e) {
    free(e->buf);
    memset(e, 0, sizeof *e);
}

static int append(td_emitter *e, const char *s, size_t n) {
    if (e->len + n + 1 > e->cap) {
        size_t nc = e->cap ? e->cap : 1024;
        while (nc < e->len + n + 1) nc *= 2;
        char *nb = realloc(e->buf, nc);
        if (!nb) return TD_ENOMEM;
        e->buf = nb;
        e->cap = nc;
    }
    memcpy(e->buf + e->len, s, n);
    e->len += n;
    e->buf[e->len] = 0;
    return 0;
}

/* Earliest stop string starting at or after `from`, or -1. */
static long find_stop(const td_emitter *e, size_t from) {
    long best = -1;
    for (int i = 0; i < e->n_stop; i++) {
        size_t n = strlen(e->stop[i]);
        if (!n || n > e->len) continue;
        for (size_t p = from; p + n <= e->len; p++)
            if (memcmp(e->buf + p, e->stop[i], n) == 0) {
                if (best < 0 || (long)p < best) best = (long)p;
                break;
            }
    }
    return best;
}

/* Longest tail of the text that is a proper prefix of a stop string. */
static size_t held_tail(const td_emitter *e) {
    size_t hold = 0;
    for (int i = 0; i < e->n_stop; i++) {
        size_t n = strlen(e->stop[i]);
        for (size_t k = n > 1 ? n - 1 : 0; k > hold; k--)
            if (k <= e->len && memcmp(e->buf + e->len - k, e->stop[i], k) == 0) { hold = k; break; }
    }
    return hold;
}

int td_emit_token(td_emitter *e, const td_tokenizer *tok, int32_t id) {
    if (!tok) return 0;
    char piece[1024];
    int n = td_utf8_stream_push(&e->us, tok, id, piece, (int)sizeof piece);
    if (n < 0) return n;
    if (n > 0 && append(e, piece, (size_t)n) != 0) return TD_ENOMEM;
    if (e->n_stop) {
        /* a stop string may begin inside text held back earlier (after upto) */
        long at = find_stop(e, e->upto);
        if (at >= 0) {
            e->len = (size_t)at;
            e->buf[e->len] = 0;
            e->upto = e->len;
            return 1;
        }
        e->upto = e->len - held_tail(e);
    } else {
        e->upto = e->len;
    }
    return 0;
}

int td_emit_finish(td_emitter *e) {
    char piece[16];
    int n = td_utf8_stream_flush(&e->us, piece, (int)sizeof piece);
    if (n > 0 && append(e, piece, (size_t)n) != 0) return TD_ENOMEM;
    e->upto = e->len;
    return 0;
}
