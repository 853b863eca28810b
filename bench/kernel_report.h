/* SPDX-License-Identifier: MIT */
/*
 * kernel_report.h - bench_kernel's results (kernel_report.c): the PyTorch
 * and Quack times it is given, its table, DIR/kernel.csv, DIR/kernel.json
 * and issue 15's targets.
 */
#ifndef KERNEL_REPORT_H
#define KERNEL_REPORT_H

#include <stdbool.h>
#include <stdint.h>

#include "kernel_floor.h"

enum { KR_NV = 3 }; /* fused, separate (a second dw kernel), atomic */

/* One shape's results. */
typedef struct kr_row {
    int64_t m, n;
    const char *w;           /* "f32" or "bf16" */
    double bytes;
    double us[KR_NV];        /* median microseconds */
    kf_row fl;               /* --floor: the empty and streaming kernels */
    double torch_eager, torch_compile; /* microseconds, 0 if absent */
    double torch_det, quack;           /* compile with deterministic algorithms; Quack */
    char plan[160];
} kr_row;

/* Fill the rows' PyTorch and Quack times from kernel_torch.py's CSV (m,n,w,
 * eager,compile[,det,quack]); a missing file is a note, not an error. */
void kr_load_torch(kr_row *rows, int nrows, const char *path);

/* Print the table, write DIR/kernel.csv and DIR/kernel.json (and with
 * with_floor, kf_report's), then the plans and the targets.  copy_bw and
 * copy_bw2: the copy bandwidth at start and end (bytes/s), measured or
 * assumed (copy_measured).  0, or 1 with a message on stderr. */
int kr_report(const char *dir, const char *gpu, int sms, double copy_bw, double copy_bw2,
              bool copy_measured, bool with_floor, const kr_row *rows, int nrows);

#endif
