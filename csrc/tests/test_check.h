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

#endif /* PYLLM_TEST_CHECK_H */
