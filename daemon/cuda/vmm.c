/* SPDX-License-Identifier: MIT */
/*
 * vmm.c - regions in a client's CUDA virtual memory (cuMemCreate, as
 * PyTorch's expandable segments allocate it), passed as one POSIX
 * descriptor per physical allocation on the session channel (VMM_CHUNK,
 * VMM_MAP: PROTOCOL.md section 12; the core's side is chan_vmm.c).
 *
 * Each chunk is imported as it comes (cuMemImportFromShareableHandle; the
 * descriptor is closed by the core right after) and checked against the
 * allocation's own properties: pinned device memory, offset and size
 * multiples of its granularity.  VMM_MAP reserves one range of the
 * client's total, maps every chunk whole at its offset (cuMemMap maps an
 * allocation from its start), and grants the daemon's device read-write
 * access.  The region closes like a CUDA IPC one (on the closer thread,
 * closer.c, once its fence has completed); closing unmaps, releases the
 * imported handles and frees the range, and the client's memory is then the
 * client's alone.
 *
 * Issue 17; run on an NVIDIA H200 with and without MPS (tests/gpu/
 * test_vmm_cuda.c, bench/RESULTS.md "Expandable segments").
 */
#include "cuda_int.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* One imported physical allocation. */
typedef struct vmm_chunk {
    CUmemGenericAllocationHandle h;
    uint64_t size;
} vmm_chunk;

/* A mapped range: rnd_cuda_map.vmm. */
struct rnd_cuda_vmm {
    CUdeviceptr base;              /* 0 until reserved */
    uint64_t total;
    uint32_t n, mapped;            /* chunks held; of them mapped, from the first */
    vmm_chunk chunks[];
};

/* The driver's virtual memory calls, reached through the runtime as the
 * rest of the backend reaches the driver (no libcuda link). */
static struct {
    CUresult (*import)(CUmemGenericAllocationHandle *, void *, CUmemAllocationHandleType);
    CUresult (*props)(CUmemAllocationProp *, CUmemGenericAllocationHandle);
    CUresult (*gran)(size_t *, const CUmemAllocationProp *, CUmemAllocationGranularity_flags);
    CUresult (*reserve)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
    CUresult (*map)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);
    CUresult (*access)(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t);
    CUresult (*unmap)(CUdeviceptr, size_t);
    CUresult (*release)(CUmemGenericAllocationHandle);
    CUresult (*free)(CUdeviceptr, size_t);
    bool ok;
} drv;
static pthread_once_t drv_once = PTHREAD_ONCE_INIT;

static void drv_init(void)
{
    drv.ok = rn_cuda_entry_to("cuMemImportFromShareableHandle", (void **)&drv.import) &&
             rn_cuda_entry_to("cuMemGetAllocationPropertiesFromHandle", (void **)&drv.props) &&
             rn_cuda_entry_to("cuMemGetAllocationGranularity", (void **)&drv.gran) &&
             rn_cuda_entry_to("cuMemAddressReserve", (void **)&drv.reserve) &&
             rn_cuda_entry_to("cuMemMap", (void **)&drv.map) && rn_cuda_entry_to("cuMemSetAccess", (void **)&drv.access) &&
             rn_cuda_entry_to("cuMemUnmap", (void **)&drv.unmap) &&
             rn_cuda_entry_to("cuMemRelease", (void **)&drv.release) &&
             rn_cuda_entry_to("cuMemAddressFree", (void **)&drv.free);
}

static int no_driver(rnp_error *err, const char *field)
{
    return rnp_fail(err, RN_UNSUPPORTED,
                    "%s: the CUDA driver has no virtual memory management entry points", field);
}

int rnd_cuda_vmm_import(rnd_backend *be, void *bsess, int fd, uint64_t offset, uint64_t size,
                        void **chunk, rnp_error *err)
{
    rnd_cuda *b = (rnd_cuda *)be;
    CUmemAllocationProp prop;
    CUmemGenericAllocationHandle h = 0;
    size_t gran = 0;
    vmm_chunk *c;
    CUresult r;
    int rc;

    (void)bsess;
    if (b->failed)
        return rnd_cuda_failed_err(b, err, "vmm_chunk");
    pthread_once(&drv_once, drv_init);
    if (!drv.ok)
        return no_driver(err, "vmm_chunk");
    (void)cudaSetDevice(b->dev);
    r = drv.import(&h, (void *)(uintptr_t)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    if (r != CUDA_SUCCESS)
        return rnp_fail(err, r == CUDA_ERROR_OUT_OF_MEMORY ? RN_NOMEM : RN_INVALID_ARGUMENT,
                        "vmm_chunk: the descriptor is not a CUDA allocation exported as a POSIX "
                        "descriptor (cuMemImportFromShareableHandle: driver error %d)",
                        (int)r);
    memset(&prop, 0, sizeof prop);
    if ((r = drv.props(&prop, h)) != CUDA_SUCCESS) {
        rc = rnp_fail(err, RN_CUDA,
                      "vmm_chunk: cuMemGetAllocationPropertiesFromHandle: driver error %d",
                      (int)r);
        goto fail;
    }
    if (prop.type != CU_MEM_ALLOCATION_TYPE_PINNED ||
        prop.location.type != CU_MEM_LOCATION_TYPE_DEVICE) {
        rc = rnp_fail(err, RN_INVALID_ARGUMENT,
                      "vmm_chunk: not pinned device memory (allocation type %d, location type "
                      "%d)",
                      (int)prop.type, (int)prop.location.type);
        goto fail;
    }
    if ((r = drv.gran(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM)) != CUDA_SUCCESS) {
        rc = rnp_fail(err, RN_CUDA, "vmm_chunk: cuMemGetAllocationGranularity: driver error %d",
                      (int)r);
        goto fail;
    }
    if ((rc = rnp_vmm_gran_check(offset, size, gran, err)) != 0)
        goto fail;
    if (!(c = calloc(1, sizeof *c))) {
        rc = rnp_fail(err, RN_NOMEM, "vmm_chunk: out of memory");
        goto fail;
    }
    c->h = h;
    c->size = size;
    *chunk = c;
    return 0;
fail:
    (void)drv.release(h);
    return rc;
}

void rnd_cuda_vmm_drop(rnd_backend *be, void *chunk)
{
    vmm_chunk *c = chunk;

    (void)be;
    if (!c)
        return;
    (void)drv.release(c->h);
    free(c);
}

/* Unmap, release and free everything v holds (no kernel uses it). */
void rnd_cuda_vmm_release(rnd_cuda_vmm *v)
{
    uint64_t off = 0;

    if (!v)
        return;
    for (uint32_t i = 0; i < v->mapped; i++) {
        (void)drv.unmap(v->base + off, v->chunks[i].size);
        off += v->chunks[i].size;
    }
    for (uint32_t i = 0; i < v->n; i++)
        (void)drv.release(v->chunks[i].h);
    if (v->base)
        (void)drv.free(v->base, v->total);
    free(v);
}

int rnd_cuda_region_open_vmm(rnd_backend *be, void *bsess, void **chunks, uint32_t n,
                             uint64_t total, const uint8_t uuid[RNP_UUID_BYTES], rnd_mapping *out,
                             rnp_error *err)
{
    rnd_cuda *b = (rnd_cuda *)be;
    CUmemAccessDesc acc;
    rnd_cuda_vmm *v;
    rnd_cuda_map *m = NULL;
    uint64_t off = 0, align = 0;
    CUresult r;
    int rc;

    (void)bsess;
    v = calloc(1, sizeof *v + (size_t)n * sizeof v->chunks[0]);
    if (!v) {
        for (uint32_t i = 0; i < n; i++) {
            rnd_cuda_vmm_drop(be, chunks[i]);
            chunks[i] = NULL;
        }
        return rnp_fail(err, RN_NOMEM, "vmm_map: out of memory");
    }
    /* v holds every chunk from here: whatever happens, rnd_cuda_vmm_release
     * lets them go. */
    for (uint32_t i = 0; i < n; i++) {
        vmm_chunk *c = chunks[i];
        v->chunks[i] = *c;
        free(c);
        chunks[i] = NULL;
        if (v->chunks[i].size > align)
            align = v->chunks[i].size;
    }
    v->n = n;
    v->total = total;
    if ((rc = rnd_cuda_same_device(b, uuid, "vmm_map.device_uuid", "the memory is", err)) != 0)
        goto fail;
    if (b->failed) {
        rc = rnd_cuda_failed_err(b, err, "vmm_map");
        goto fail;
    }
    (void)cudaSetDevice(b->dev);
    /* Aligned as the largest chunk where the driver can (as the client's
     * own range is); else the granularity, which every offset is a
     * multiple of. */
    r = drv.reserve(&v->base, total, align, 0, 0);
    if (r != CUDA_SUCCESS)
        r = drv.reserve(&v->base, total, 0, 0, 0);
    if (r != CUDA_SUCCESS) {
        v->base = 0;
        rc = rnp_fail(err, r == CUDA_ERROR_OUT_OF_MEMORY ? RN_NOMEM : RN_CUDA,
                      "vmm_map: reserving %" PRIu64 " bytes of address space "
                      "(cuMemAddressReserve): driver error %d",
                      total, (int)r);
        goto fail;
    }
    for (uint32_t i = 0; i < n; i++) {
        r = drv.map(v->base + off, v->chunks[i].size, 0, v->chunks[i].h, 0);
        if (r != CUDA_SUCCESS) {
            rc = rnp_fail(err, RN_INVALID_ARGUMENT,
                          "vmm_map: chunk %u: mapping %" PRIu64 " bytes failed (cuMemMap: driver "
                          "error %d): vmm_chunk.size larger than its allocation?",
                          i, v->chunks[i].size, (int)r);
            goto fail;
        }
        v->mapped++;
        off += v->chunks[i].size;
    }
    memset(&acc, 0, sizeof acc);
    acc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    acc.location.id = b->dev;
    acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    if ((r = drv.access(v->base, total, &acc, 1)) != CUDA_SUCCESS) {
        rc = rnp_fail(err, RN_CUDA, "vmm_map: cuMemSetAccess for device %d: driver error %d",
                      b->dev, (int)r);
        goto fail;
    }
    if (!(m = calloc(1, sizeof *m))) {
        rc = rnp_fail(err, RN_NOMEM, "vmm_map: out of memory");
        goto fail;
    }
    m->dptr = (void *)(uintptr_t)v->base;
    m->vmm = v;
    out->base = m->dptr;
    out->size = total;
    out->handle = m;
    return 0;
fail:
    rnd_cuda_vmm_release(v);
    return rc;
}
