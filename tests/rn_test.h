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
#include <stdlib.h>
#include <cmocka.h>

/* Skip the current test, giving the reason tests/run.sh prints in its summary. */
#define RN_SKIP(...)                                   \
    do {                                               \
        printf("skip-reason: " __VA_ARGS__);           \
        printf("\n");                                  \
        fflush(stdout);                                \
        skip();                                        \
    } while (0)

/* The whole file at path, malloc'ed and NUL-terminated (the NUL not
 * counted in *len, where len is not NULL); NULL when it cannot be opened. */
static inline char *rn_test_read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    char *buf = NULL;
    size_t n = 0, cap = 0, got;
    if (!f)
        return NULL;
    do {
        if (n + 4096 + 1 > cap) {
            cap = 2 * cap + 8192;
            buf = realloc(buf, cap);
            assert_non_null(buf);
        }
        got = fread(buf + n, 1, cap - n - 1, f);
        n += got;
    } while (got > 0);
    assert_false(ferror(f));
    fclose(f);
    buf[n] = '\0';
    if (len)
        *len = n;
    return buf;
}

#endif
