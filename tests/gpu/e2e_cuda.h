/* SPDX-License-Identifier: MIT */
/*
 * e2e_cuda.h - two tiny GPU kernels for the end-to-end tests and benchmark,
 * written in PTX and loaded at run time (cudaLibraryLoadData), because the
 * test and benchmark programs are plain C:
 *   rn_spin(ns)    one thread spins for ns nanoseconds of %globaltimer: a
 *                  delay of chosen length on a stream (races show up only
 *                  when the two sides' timings vary);
 *   rn_stamp(out)  one thread writes %globaltimer to *out: a GPU-side time
 *                  stamp at a point of a stream.
 * Header-only (static inline), included by tests/gpu and bench/.
 */
#ifndef RN_E2E_CUDA_H
#define RN_E2E_CUDA_H

#include <cuda_runtime_api.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

static const char rne_ptx[] =
    ".version 7.0\n"
    ".target sm_80\n"
    ".address_size 64\n"
    ".visible .entry rn_spin(.param .u64 ns)\n"
    "{\n"
    "    .reg .u64 %rd<5>;\n"
    "    .reg .pred %p;\n"
    "    ld.param.u64 %rd1, [ns];\n"
    "    mov.u64 %rd2, %globaltimer;\n"
    "SPIN:\n"
    "    mov.u64 %rd3, %globaltimer;\n"
    "    sub.u64 %rd4, %rd3, %rd2;\n"
    "    setp.lt.u64 %p, %rd4, %rd1;\n"
    "    @%p bra SPIN;\n"
    "    ret;\n"
    "}\n"
    ".visible .entry rn_stamp(.param .u64 out)\n"
    "{\n"
    "    .reg .u64 %rd<4>;\n"
    "    ld.param.u64 %rd1, [out];\n"
    "    cvta.to.global.u64 %rd2, %rd1;\n"
    "    mov.u64 %rd3, %globaltimer;\n"
    "    st.global.u64 [%rd2], %rd3;\n"
    "    ret;\n"
    "}\n";

/* A CUDA runtime call that must succeed, for the benchmarks: the call, the
 * place and the error on stderr, then exit 1. */
#define RNE_CK(call)                                                                          \
    do {                                                                                      \
        cudaError_t e_ = (call);                                                              \
        if (e_ != cudaSuccess) {                                                              \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call,                     \
                    cudaGetErrorString(e_));                                                  \
            exit(1);                                                                          \
        }                                                                                     \
    } while (0)

/* A CUDA driver function (cuStreamWaitValue64, ...) through the runtime's
 * entry points, so that no benchmark links libcuda itself; exits 1 where the
 * driver has none. */
static inline void *rne_driver_entry(const char *name)
{
    enum cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
    void *fn = NULL;
    if (cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess || !fn) {
        fprintf(stderr, "the CUDA driver has no %s\n", name);
        exit(1);
    }
    return fn;
}

typedef struct rne_kernels {
    cudaLibrary_t lib;
    cudaKernel_t spin, stamp;
} rne_kernels;

/* Load the kernels into the current device's context. */
static inline cudaError_t rne_load(rne_kernels *k)
{
    cudaError_t e = cudaLibraryLoadData(&k->lib, rne_ptx, NULL, NULL, 0, NULL, NULL, 0);
    if (e == cudaSuccess)
        e = cudaLibraryGetKernel(&k->spin, k->lib, "rn_spin");
    if (e == cudaSuccess)
        e = cudaLibraryGetKernel(&k->stamp, k->lib, "rn_stamp");
    return e;
}

static inline cudaError_t rne_spin(const rne_kernels *k, uint64_t ns, cudaStream_t st)
{
    dim3 one = {1, 1, 1};
    void *args[] = {&ns};
    return cudaLaunchKernel((const void *)k->spin, one, one, args, 0, st);
}

/* rn_spin in every thread of blocks blocks of threads threads: a kernel as
 * wide as a real one that takes ns nanoseconds. */
static inline cudaError_t rne_spin_grid(const rne_kernels *k, uint64_t ns, unsigned blocks,
                                        unsigned threads, cudaStream_t st)
{
    dim3 g = {blocks, 1, 1}, b = {threads, 1, 1};
    void *args[] = {&ns};
    return cudaLaunchKernel((const void *)k->spin, g, b, args, 0, st);
}

static inline cudaError_t rne_stamp(const rne_kernels *k, uint64_t *dev_out, cudaStream_t st)
{
    dim3 one = {1, 1, 1};
    void *args[] = {&dev_out};
    return cudaLaunchKernel((const void *)k->stamp, one, one, args, 0, st);
}

#endif
