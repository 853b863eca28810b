/* SPDX-License-Identifier: MIT */
/*
 * rmsnormctl_mem.c - where rmsnormctl's test cases live: shared-memory
 * buffers for a daemon on the CPU backend, device memory for one on the CUDA
 * backend.  Either way the case is laid out and checked in host memory; for
 * CUDA the whole buffer travels to the device before the call and back after
 * it, so selftest and bench check a CUDA daemon with the same code.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef RN_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

#include "rmsnormctl_verify.h"

int rnv_mem_alloc(rn_client *c, bool cuda, size_t bytes, rnv_mem *m, char *msg, size_t len)
{
    rnv_mem r = {0};
    int rv;

    msg[0] = '\0';
    r.bytes = bytes;
    if (!cuda) {
        if ((rv = rn_buffer_alloc(c, bytes, &r.host)) != 0) {
            snprintf(msg, len, "buffer: %s (%s)", rn_last_error(c), rn_err_name(rv));
            return rv;
        }
        *m = r;
        return 0;
    }
#ifdef RN_HAVE_CUDA
    cudaError_t e;
    if ((r.host = malloc(bytes)) == NULL) {
        snprintf(msg, len, "host copy: out of memory for %zu bytes", bytes);
        return RN_NOMEM;
    }
    if ((e = cudaMalloc(&r.dev, bytes)) != cudaSuccess) {
        (void)cudaGetLastError();
        snprintf(msg, len, "cudaMalloc of %zu bytes: %s", bytes, cudaGetErrorString(e));
        free(r.host);
        return e == cudaErrorMemoryAllocation ? RN_NOMEM : RN_CUDA;
    }
    *m = r;
    return 0;
#else
    snprintf(msg, len, "the daemon runs the cuda backend, and this rmsnormctl was built without "
                       "CUDA");
    return RN_NO_CUDA;
#endif
}

void rnv_mem_free(rn_client *c, rnv_mem *m)
{
    if (m->dev) {
#ifdef RN_HAVE_CUDA
        cudaFree(m->dev);
#endif
        free(m->host);
    } else if (m->host) {
        rn_buffer_free(c, m->host);
    }
    memset(m, 0, sizeof *m);
}

#ifdef RN_HAVE_CUDA
/* p moved from the host copy to the device copy. */
static void *rebase(const rnv_mem *m, const void *p)
{
    return p ? (char *)m->dev + ((const char *)p - (const char *)m->host) : NULL;
}
#endif

int rnv_mem_run(rn_client *c, rnv_mem *m, const rn_bwd_args *a, rn_timing *t, char *msg,
                size_t len)
{
    int rv;

    msg[0] = '\0';
    if (!m->dev) {
        if ((rv = rn_rmsnorm_bwd_host(c, a, t)) != 0)
            snprintf(msg, len, "%s (%s)", rn_last_error(c), rn_err_name(rv));
        return rv;
    }
#ifdef RN_HAVE_CUDA
    rn_bwd_args d = *a;
    cudaError_t e;

    d.x = rebase(m, a->x);
    d.dy = rebase(m, a->dy);
    d.dx = rebase(m, a->dx);
    d.w = rebase(m, a->w);
    d.rstd = rebase(m, a->rstd);
    d.dres = rebase(m, a->dres);
    d.dw = rebase(m, a->dw);
    /* Inputs and poisoned outputs up; the synchronous call returns after the
     * daemon's kernel finished, so the results can come straight back. */
    if ((e = cudaMemcpy(m->dev, m->host, m->bytes, cudaMemcpyHostToDevice)) != cudaSuccess)
        goto cuda_fail;
    if ((rv = rn_rmsnorm_bwd_sync(c, &d, NULL, t)) != 0) {
        snprintf(msg, len, "%s (%s)", rn_last_error(c), rn_err_name(rv));
        return rv;
    }
    if ((e = cudaMemcpy(m->host, m->dev, m->bytes, cudaMemcpyDeviceToHost)) != cudaSuccess)
        goto cuda_fail;
    return 0;
cuda_fail:
    (void)cudaGetLastError();
    snprintf(msg, len, "copying the case to or from the device: %s", cudaGetErrorString(e));
    return RN_CUDA;
#else
    snprintf(msg, len, "built without CUDA");
    return RN_NO_CUDA;
#endif
}
