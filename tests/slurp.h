/* slurp.h — t_slurp, shared by the test programs (through t.h) and the fuzz
 * harnesses (tests/fuzz), which do not use the test harness itself. */
#ifndef TD_SLURP_H
#define TD_SLURP_H
#include <stdio.h>
#include <stdlib.h>

/* Read a whole file into a malloc'd NUL-terminated buffer (NULL if missing). */
static inline char *t_slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (b && fread(b, 1, (size_t)n, f) != (size_t)n) { free(b); b = NULL; }
    fclose(f);
    if (b) b[n] = 0;
    if (b && len) *len = (size_t)n;
    return b;
}
#endif
