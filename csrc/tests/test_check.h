/*
 * test_check.h - the C tests' CHECK: counts passes and failures, prints each failure with its place.
 */
#ifndef PYLLM_TEST_CHECK_H
#define PYLLM_TEST_CHECK_H

#include <stdio.h>

static int passed, failed;

#define CHECK(cond, ...)                         \
    do {                                         \
        if (cond) {                              \
            passed++;                            \
        } else {                                 \
            failed++;                            \
            printf("FAIL %s:%d: ", __FILE__, __LINE__); \
            printf(__VA_ARGS__);                 \
            printf("\n");                        \
        }                                        \
    } while (0)

/* The last line of a test program: the counts, and its exit status. */
static inline int check_report(void) {
    printf("%d passed, %d failed\n", passed, failed);
    return failed != 0;
}

#endif /* PYLLM_TEST_CHECK_H */
