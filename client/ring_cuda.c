/* SPDX-License-Identifier: MIT */
/*
 * ring_cuda.c - the fast path's device side on a CUDA stream (built only
 * with a CUDA Toolkit, RN_HAVE_CUDA): the ring's memory registered with
 * CUDA (cudaHostRegister, mapped), ready = seq written by the caller's
 * stream (cuStreamWriteValue64: its memory barrier orders the producer's
 * writes before it) and the stream's wait for done >= seq
 * (cuStreamWaitValue64, GEQ).  PROTOCOL.md section 13.3.
 *
 * rn_rmsnorm_bwd takes this path on RN_PATH_FAST and RN_PATH_AUTO (the
 * default) where the daemon offers it (the CUDA backend does, unless
 * rmsnormd --cuda-fast-path=no).  A stream being captured into a CUDA graph
 * is refused here (RN_UNSUPPORTED; RN_PATH_AUTO sends such a call to the
 * classic path before it gets here): the slot and the producer word are
 * written by the host at the call, not at the replay.
 *
 * The driver is reached through cudaGetDriverEntryPointByVersion, as in
 * client_cuda.c: no libcuda link of our own.
 */
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <pthread.h>
#include <stdio.h>

#include "client_int.h"
#include "rn_check.h"

typedef CUresult (*pfn_value64)(CUstream s, CUdeviceptr addr, cuuint64_t v, unsigned flags);

static pthread_once_t once = PTHREAD_ONCE_INIT;
static pfn_value64 wait64, write64;

static void resolve(void)
{
    if (!rn_cuda_entry_to("cuStreamWaitValue64", (void **)&wait64) ||
        !rn_cuda_entry_to("cuStreamWriteValue64", (void **)&write64))
        wait64 = write64 = NULL;
}

static int attach(rn_client *c, void *base, size_t size, uint64_t *dev)
{
    void *d = NULL;
    rn_fault f;

    pthread_once(&once, resolve);
    if (!wait64 || !write64)
        return rnc_fail(c, RN_NO_CUDA,
                        "ring: the CUDA driver has no cuStreamWaitValue64/cuStreamWriteValue64");
    RN_CUDA_GOTO(cudaHostRegister(base, size, cudaHostRegisterMapped | cudaHostRegisterPortable),
                 &f, fail);
    RN_CUDA_GOTO(cudaHostGetDevicePointer(&d, base, 0), &f, fail_registered);
    *dev = (uint64_t)(uintptr_t)d;
    return 0;
fail_registered:
    (void)cudaHostUnregister(base);
    (void)cudaGetLastError();
fail:
    return rnc_fail(c, RN_CUDA, "ring: registering its memory with CUDA: %s", f.why);
}

static void detach(void *base)
{
    if (cudaHostUnregister(base) != cudaSuccess)
        (void)cudaGetLastError();
}

static int write_ready(rn_client *c, void *stream, uint64_t addr, uint64_t seq)
{
    enum cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
    CUresult r;

    if (cudaStreamIsCapturing((cudaStream_t)stream, &cap) != cudaSuccess) {
        (void)cudaGetLastError();
        return rnc_fail(c, RN_CUDA, "ring: cudaStreamIsCapturing failed on the stream");
    }
    if (cap != cudaStreamCaptureStatusNone)
        return rnc_fail(c, RN_UNSUPPORTED,
                        "ring: the stream is being captured into a CUDA graph, which the fast "
                        "path does not support yet; use RN_PATH_CLASSIC outside graphs");
    r = write64((CUstream)stream, (CUdeviceptr)addr, seq, CU_STREAM_WRITE_VALUE_DEFAULT);
    if (r != CUDA_SUCCESS)
        return rnc_fail(c, RN_CUDA, "ring: cuStreamWriteValue64 (ready): CUDA driver error %d",
                        (int)r);
    return 0;
}

static int wait_done(rn_client *c, void *stream, uint64_t addr, uint64_t seq)
{
    CUresult r = wait64((CUstream)stream, (CUdeviceptr)addr, seq, CU_STREAM_WAIT_VALUE_GEQ);

    if (r != CUDA_SUCCESS)
        return rnc_fail(c, RN_CUDA,
                        "ring: cuStreamWaitValue64 (done): CUDA driver error %d; the call was "
                        "published and runs, but the stream does not wait for it",
                        (int)r);
    return 0;
}

const rnc_ring_dev rnc_cuda_ring_dev = {
    .attach = attach,
    .detach = detach,
    .write = write_ready,
    .wait = wait_done,
};
