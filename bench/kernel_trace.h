/* SPDX-License-Identifier: MIT */
/*
 * kernel_trace.h - bench_kernel --trace: the shapes it takes and the report
 * of the per-block timelines the kernel records with -DRNK_TRACE=1
 * (kernel_trace.c; rnk_test.h has the records).
 */
#ifndef KERNEL_TRACE_H
#define KERNEL_TRACE_H

#include <stddef.h>
#include <stdint.h>

enum { KT_MAX_SHAPES = 32 };
/* bf16 rows, fp32 weight, rstd given (as the timed runs) */
#define KT_DEFAULT_SHAPES "4096,256+16384,1024+65536,2048+65536,8192"

typedef struct kt_shape {
    int64_t m, n;
    char w[8]; /* "f32" or "bf16" */
} kt_shape;

/* Append the shapes of "M,N[,w][+M,N[,w]...]" (also ';' or ' ' between
 * shapes; w defaults to f32) to s[*ns]; 0, or 2 with a message on stderr. */
int kt_parse(const char *spec, kt_shape *s, int *ns);

/* One traced launch: a host copy of its trace buffer and its event time. */
typedef struct kt_launch {
    const unsigned char *buf;
    size_t bytes;
    double event_us;
} kt_launch;

/* Print one shape's table (from the launch of median event time, with the
 * spread over all nl launches) and, with dir, write every launch's
 * per-block rows to DIR/trace-MxN-w.csv and per-chunk rows to
 * DIR/trace-MxN-w-chunks.csv.  Returns 0, or 1 when nothing was recorded. */
int kt_report(int64_t m, int64_t n, const char *w, const char *plan, int sms, const kt_launch *l,
              int nl, const char *dir);

#endif
