/* t.h — the tiny test harness every C test uses. A test program runs named
 * cases; each case prints "PASS name" or "FAIL name" (with the failed checks),
 * and tests/run.sh counts those lines. Checks never stop a case early unless
 * T_REQUIRE is used, so one run reports every broken assertion. */
#ifndef TD_T_H
#define TD_T_H
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int t_case_failed, t_any_failed;
static const char *t_case_name;

static inline void t_begin(const char *name) { t_case_name = name; t_case_failed = 0; }
static inline void t_end(void) {
    printf("%s %s\n", t_case_failed ? "FAIL" : "PASS", t_case_name);
    fflush(stdout);
    if (t_case_failed) t_any_failed = 1;
}
#define T_CHECK(cond, ...) do { if (!(cond)) { t_case_failed = 1; \
    printf("  check failed %s:%d: %s: ", __FILE__, __LINE__, #cond); printf(__VA_ARGS__); printf("\n"); } } while (0)
/* Like T_CHECK but ends the case (jumps to the label `done` that the case defines). */
#define T_REQUIRE(cond, ...) do { if (!(cond)) { T_CHECK(cond, __VA_ARGS__); goto done; } } while (0)
static inline int t_exit(void) { return t_any_failed ? 1 : 0; }

#include "slurp.h"
#endif
