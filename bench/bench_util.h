/* SPDX-License-Identifier: MIT */
/*
 * bench_util.h - what the host-side benchmarks share: a monotonic clock in
 * nanoseconds, a sleep, the comparison that sorts samples and their
 * percentiles.  Header-only (static inline).
 */
#ifndef RN_BENCH_UTIL_H
#define RN_BENCH_UTIL_H

#include <errno.h>
#include <stddef.h>
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

/* Sleep us microseconds (again after a signal). */
static inline void sleep_us(uint64_t us)
{
    struct timespec ts = {(time_t)(us / 1000000u), (long)(us % 1000000u) * 1000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

/* The p-quantile (0 .. 1, nearest rank below) of n sorted ns samples, in
 * us; 0 when there are none. */
static inline double pct_us(const uint64_t *v, size_t n, double p)
{
    return n ? (double)v[(size_t)(p * (double)(n - 1))] / 1000.0 : 0.0;
}

#endif
