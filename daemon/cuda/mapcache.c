/* SPDX-License-Identifier: MIT */
/*
 * mapcache.c - regions as CUDA IPC memory mappings: opened once per
 * REGISTER with the claimed size checked against the allocation, closed when
 * the server closes the region.  The server holds a region until the done
 * event of every job that uses it (backend.h), so a close never races a
 * kernel that reads the memory; but closing may wait for the device, so the
 * close itself happens on the closer thread (closer.c).
 */
#include "cuda_int.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "stats.h"

/*
 * Open h.  The driver packs small cudaMalloc allocations into shared blocks,
 * and a handle cannot be opened while this process still maps, from the same
 * client, an allocation of that block that was freed since
 * (cudaErrorAlreadyMapped): the client unregisters what it freed before it
 * registers anything new (client_cuda.c), but the closes of those mappings
 * run on the closer thread.  So on that error: let the released mappings
 * close, at most RND_CUDA_REMAP_WAIT_MS on the loop, and try once more.
 */
static cudaError_t open_handle(rnd_cuda *b, void **p, cudaIpcMemHandle_t h)
{
    cudaError_t e = cudaIpcOpenMemHandle(p, h, cudaIpcMemLazyEnablePeerAccess);

    if (e == cudaErrorAlreadyMapped) {
        (void)cudaGetLastError();
        b->remap_waits++;
        if (rnd_cuda_closer_drain(b, RND_CUDA_REMAP_WAIT_MS))
            e = cudaIpcOpenMemHandle(p, h, cudaIpcMemLazyEnablePeerAccess);
    }
    return e;
}

int rnd_cuda_region_open(rnd_backend *be, void *bsess, const rnp_register_req *req,
                         rnd_mapping *out, rnp_error *err)
{
    rnd_cuda *b = (rnd_cuda *)be;
    cudaIpcMemHandle_t h;
    CUdeviceptr base = 0;
    size_t size = 0;
    void *p = NULL;
    rnd_cuda_map *m;
    rn_fault f;
    CUresult r;
    int rc;

    (void)bsess;
    if (req->kind != RNP_REGION_CUDA_IPC)
        return rnp_fail(err, RN_UNSUPPORTED,
                        "register.kind: the cuda backend maps CUDA IPC memory handles only "
                        "(POSIX shared memory needs the cpu backend)");
    if ((rc = rnd_cuda_same_device(b, req->device_uuid, "register.device_uuid", "the memory is",
                                   err)) != 0)
        return rc;
    if (req->size == 0)
        return rnp_fail(err, RN_INVALID_ARGUMENT, "register.size: must be at least 1 byte");
    if (b->failed)
        return rnd_cuda_failed_err(b, err, "register");
    m = calloc(1, sizeof *m);
    if (!m)
        return rnp_fail(err, RN_NOMEM, "register: out of memory");
    _Static_assert(sizeof h == RNP_IPC_HANDLE_BYTES, "IPC handle size");
    memcpy(&h, req->ipc_handle, sizeof h);
    /* Opening a handle this process has open already only counts it again
     * (same address); each region closes its own count. */
    RN_CUDA_GOTO(open_handle(b, &p, h), &f, fail_open);
    r = b->get_range(&base, &size, (CUdeviceptr)(uintptr_t)p);
    if (r != CUDA_SUCCESS) {
        rc = rnp_fail(err, RN_CUDA,
                      "register.ipc_handle: cuMemGetAddressRange of the mapping failed (CUDA "
                      "driver error %d)",
                      (int)r);
        goto fail_close;
    }
    if ((uint64_t)size < req->size) {
        rc = rnp_fail(err, RN_INVALID_ARGUMENT,
                      "register.size: %" PRIu64 " bytes claimed, but the allocation has %zu",
                      req->size, size);
        goto fail_close;
    }
    if (size > RND_CUDA_IPC_LARGE && b->ipc_large++ == 0)
        rnd_notice("register: a CUDA IPC allocation of %zu MiB; the kernel can run up to 2x slower "
                   "on tensors inside one IPC allocation this large (counted in "
                   "regions.ipc_large): give large tensors allocations of their own or use VMM "
                   "memory (PyTorch: PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True)",
                   size >> 20);
    m->dptr = p;
    out->base = p;
    out->size = req->size;
    out->handle = m;
    return 0;

fail_open:
    rc = rnd_cuda_fault(b, &f, true, err, "register.ipc_handle");
    free(m);
    return rc;
fail_close:
    (void)cudaIpcCloseMemHandle(p);
    (void)cudaGetLastError();
    free(m);
    return rc;
}

void rnd_cuda_stats(rnd_backend *be, rnp_stats_rep *out)
{
    rnd_cuda_closer_stats(be, out);
    rnd_stats_put(out, "regions.ipc_large", ((rnd_cuda *)be)->ipc_large);
    rnd_stats_put(out, "regions.remap_waits", ((rnd_cuda *)be)->remap_waits);
}

/* On the closer thread (or the loop's, at fini): nothing uses the mapping. */
static void map_close(rnd_cuda_release *r)
{
    rnd_cuda_map *m = RN_QUEUE_DATA(r, rnd_cuda_map, rel);

    if (m->vmm)
        rnd_cuda_vmm_release(m->vmm);
    else if (cudaIpcCloseMemHandle(m->dptr) != cudaSuccess)
        (void)cudaGetLastError(); /* (nothing to do about it: the mapping is dropped) */
    free(m);
}

/* No job that uses the mapping is on the GPU any more (backend.h). */
void rnd_cuda_region_close(rnd_backend *be, void *bsess, rnd_mapping *mp)
{
    rnd_cuda *b = (rnd_cuda *)be;
    rnd_cuda_map *m = mp ? mp->handle : NULL;

    if (!m)
        return;
    mp->handle = NULL;
    m->rel.close = map_close;
    m->rel.what = m->vmm ? "a VMM range" : "an IPC mapping";
    m->rel.bytes = mp->size;
    rnd_cuda_release_later(b, bsess, &m->rel);
}
