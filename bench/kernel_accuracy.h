/* SPDX-License-Identifier: MIT */
/*
 * kernel_accuracy.h - bench_kernel --accuracy DIR (kernel_accuracy.c).
 */
#ifndef KERNEL_ACCURACY_H
#define KERNEL_ACCURACY_H

#include <cuda_runtime_api.h>

#include "rnk_test.h"

/*
 * dx's accuracy on the inputs kernel_torch.py --accuracy DIR wrote (bf16 x
 * and dy, the weight as fp32 values, fp32 rstd): the worst |dx - ref| in
 * bf16 ulps of the fp64 reference (the same rstd), and the fraction of
 * elements beyond one ulp, exactly as kernel_torch.py measures PyTorch's and
 * Quack's.  Writes DIR/acc_ours.csv and prints a line a shape; exits on error.
 */
void ka_measure(rnk_device *dev, cudaStream_t st, const char *dir);

#endif
