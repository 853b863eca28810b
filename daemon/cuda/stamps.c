/* SPDX-License-Identifier: MIT */
/*
 * stamps.c - RMSNORMD_DEBUG_STAMPS=PATH, a measurement aid: the GPU's clock
 * (%globaltimer, one clock for every process on the GPU) just before and
 * just after each fast-path kernel, taken by a one-thread kernel on the
 * ring's stream on each side of it (rnk_cuda_stamp), so that a client's own
 * stamps around its call can be set beside the daemon's kernel: how long
 * from the client's producer to the daemon's kernel, the kernel, and from
 * it back to the client's consumer (bench/e2e_stamps.py joins them).  The
 * last RND_CUDA_STAMPS pairs stay in pinned memory and go to PATH, a line
 * "m n before after" each in the order of submission, when the backend
 * ends.  The two stamps add two small kernels to every call: for taking
 * the time apart, not for production.
 */
#include "cuda_int.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"

void rnd_cuda_stamps_init(rnd_cuda *b)
{
    const char *path = getenv("RMSNORMD_DEBUG_STAMPS");
    void *dev = NULL;

    if (!path || !*path)
        return;
    if (cudaHostAlloc((void **)&b->stamps, 2 * RND_CUDA_STAMPS * sizeof(uint64_t),
                      cudaHostAllocMapped) != cudaSuccess ||
        cudaHostGetDevicePointer(&dev, b->stamps, 0) != cudaSuccess ||
        !(b->stamp_shape = calloc(RND_CUDA_STAMPS, sizeof *b->stamp_shape)) ||
        !(b->stamp_path = strdup(path))) {
        (void)cudaGetLastError();
        rnd_warn("RMSNORMD_DEBUG_STAMPS: no memory for the stamps; not taken");
        rnd_cuda_stamps_fini(b);
        return;
    }
    memset(b->stamps, 0, 2 * RND_CUDA_STAMPS * sizeof(uint64_t));
    b->stamps_dev = (uint64_t *)dev;
    rnd_warn("RMSNORMD_DEBUG_STAMPS: two stamp kernels around every fast-path kernel, written "
             "to %s at the end",
             path);
}

int rnd_cuda_stamp(rnd_cuda *b, const rnd_job *job, bool after, cudaStream_t st)
{
    char msg[RNP_MAX_ERRMSG];

    if (!b->stamps)
        return 0;
    if (!after) {
        b->stamp_cur = b->nstamps++ % RND_CUDA_STAMPS;
        b->stamp_shape[b->stamp_cur][0] = job->args.m;
        b->stamp_shape[b->stamp_cur][1] = job->args.n;
    }
    if (rnk_cuda_stamp(b->stamps_dev + 2 * b->stamp_cur + after, st, msg, sizeof msg) != 0) {
        rnd_warn("RMSNORMD_DEBUG_STAMPS: %s", msg);
        return -1;
    }
    return 0;
}

/* (The device is idle here: every stamp has landed.  No file when no
 * kernel was stamped.) */
void rnd_cuda_stamps_fini(rnd_cuda *b)
{
    if (b->stamps && b->stamp_shape && b->stamp_path && !b->failed && b->nstamps) {
        FILE *f = fopen(b->stamp_path, "w");
        uint64_t n = b->nstamps < RND_CUDA_STAMPS ? b->nstamps : RND_CUDA_STAMPS;
        for (uint64_t i = 0; f && i < n; i++) {
            uint64_t k = (b->nstamps - n + i) % RND_CUDA_STAMPS;
            fprintf(f, "%" PRId64 " %" PRId64 " %" PRIu64 " %" PRIu64 "\n", b->stamp_shape[k][0],
                    b->stamp_shape[k][1], b->stamps[2 * k], b->stamps[2 * k + 1]);
        }
        if (!f || fclose(f) != 0)
            rnd_warn("RMSNORMD_DEBUG_STAMPS: cannot write %s", b->stamp_path);
    }
    if (b->stamps && !b->failed)
        cudaFreeHost(b->stamps);
    b->stamps = NULL;
    b->stamps_dev = NULL;
    free(b->stamp_shape);
    b->stamp_shape = NULL;
    free(b->stamp_path);
    b->stamp_path = NULL;
}
