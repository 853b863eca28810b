/* SPDX-License-Identifier: MIT */
/*
 * bench_util.h - what the host-side benchmarks share: a monotonic clock in
 * nanoseconds and the comparison that sorts samples for percentiles.
 * Header-only (static inline).
 */
#ifndef RN_BENCH_UTIL_H
#define RN_BENCH_UTIL_H

#include <stdint.h>
#include <time.h>

static inline uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* qsort's comparison for uint64_t samples, ascending. */
static inline int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

#endif
