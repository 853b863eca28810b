/* SPDX-License-Identifier: MIT */
/*
 * kernel_floor.h - bench_kernel --floor's check and report (kernel_floor.c):
 * the empty kernels and the streaming kernels dx = x + dy that bench_kernel
 * times beside each shape's production launch.
 */
#ifndef KERNEL_FLOOR_H
#define KERNEL_FLOOR_H

#include <stdint.h>

#include "rnk_test.h"

/* One shape's times, median microseconds. */
typedef struct kf_row {
    int64_t m, n;
    const char *w; /* "f32" or "bf16" */
    double fused_us;
    double empty_us[2]; /* empty kernel as the shape's launch / one warp */
    double add_us[RNK_ADD_HOWS]; /* dx = x + dy, rnk_cuda_add_launch's ways (0: n/a) */
} kf_row;

/* After an add kernel's runs (how: RNK_ADD_*) over a dx poisoned with NaNs:
 * 64 elements of a's dx spread over the whole shape, the first and last
 * among them, must be bf16(x + dy); the program ends if one is not. */
void kf_check_add(const rnk_bwd_args *a, int how);

/* Print the floors' tables (the add kernels' bandwidth against copy_bw,
 * bytes/s) and write DIR/floor.csv; 0, or 1 with a message on stderr. */
int kf_report(const char *dir, double copy_bw, const kf_row *rows, int nrows);

#endif
