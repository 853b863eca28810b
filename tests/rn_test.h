/* SPDX-License-Identifier: MIT */
/*
 * rn_test.h - small helpers shared by the cmocka suites.  Include after
 * <cmocka.h>'s prerequisites; it includes cmocka itself.
 */
#ifndef RN_TEST_H
#define RN_TEST_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <cmocka.h>

/* Skip the current test, giving the reason tests/run.sh prints in its summary. */
#define RN_SKIP(...)                                   \
    do {                                               \
        printf("skip-reason: " __VA_ARGS__);           \
        printf("\n");                                  \
        fflush(stdout);                                \
        skip();                                        \
    } while (0)

#endif
