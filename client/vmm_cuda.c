/* SPDX-License-Identifier: MIT */
/*
 * vmm_cuda.c - device pointers in CUDA virtual memory (vmm.h): memory from
 * cuMemCreate mapped with cuMemMap, as PyTorch's expandable segments are,
 * which has no CUDA IPC handle.  Built only with CUDA (RN_HAVE_CUDA).
 *
 * A tensor's bytes lie in one or more physical allocations mapped side by
 * side into a reserved range; the walk (vmm_walk.c) finds them from the
 * driver's view of each address (the mapping's base and size).  Each is
 * exported as a POSIX descriptor (cuMemExportToShareableHandle), sent on
 * the session channel (VMM_CHUNK) and closed at once; VMM_MAP makes them one
 * region whose base is the first allocation's address here, so a tensor's
 * offset is its distance from that address.
 *
 * The cache: one entry per registered range, holding a reference to every
 * allocation in it (cuMemRetainAllocationHandle), so that an allocation's
 * handle stays its own while cached: a handle value can only be reused
 * once every reference is gone.  A call into a cached range checks that
 * each of its allocations is still the one mapped there (the handle at its
 * address); the segment may have grown, shrunk, or been unmapped and
 * mapped again meanwhile.  A range whose allocations changed
 * is dropped (UNREGISTER), and a new one is registered.  Memory the client
 * released stays alive in the daemon (and here) until then, or until the
 * session ends.  A range that a call captured into a live CUDA graph names
 * is held (rnc_vmm_hold): never the least recently used one dropped, and
 * when it goes stale it is only marked so (new calls register another)
 * until the graph is gone, for the graph's replays name its region.
 *
 * On by default (issue 17; run on an H200, with and without MPS: see
 * bench/RESULTS.md).  RMSNORMD_VMM=0 in the environment turns it off
 * (rnc_vmm_enabled): such memory is then refused (RN_NOT_SHARED), as
 * before this support existed.
 */
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client_int.h"
#include "rn_check.h"
#include "vmm.h"

/* Ranges cached per client; the least recently used goes beyond this (a
 * call uses at most seven, which are the most recent), unless a live graph
 * holds it (the cache then grows past it). */
#define VMM_MAX_RANGES 256

typedef struct vmm_piece {
    uintptr_t base;
    size_t size;
    CUmemGenericAllocationHandle h; /* our reference */
} vmm_piece;

typedef struct vmm_range {
    uintptr_t base;
    uint64_t total;
    uint32_t region;
    uint32_t n;
    vmm_piece *pc;
    uint64_t used;  /* v->tick at its last use */
    uint32_t holds; /* calls captured into live graphs that name its region */
    bool stale;     /* an allocation changed under it while held: no new call
                     * uses it; dropped when the last hold goes */
} vmm_range;

struct rnc_vmm {
    rnp_session session; /* the session its regions belong to */
    vmm_range *r;
    size_t n, cap;
    rnc_vmm_piece *walk; /* scratch for rnc_vmm_walk */
    uint64_t tick;
};

static struct {
    CUresult (*attrs)(unsigned, CUpointer_attribute *, void **, CUdeviceptr);
    CUresult (*range)(CUdeviceptr *, size_t *, CUdeviceptr);
    CUresult (*retain)(CUmemGenericAllocationHandle *, void *);
    CUresult (*release)(CUmemGenericAllocationHandle);
    CUresult (*props)(CUmemAllocationProp *, CUmemGenericAllocationHandle);
    CUresult (*export)(void *, CUmemGenericAllocationHandle, CUmemAllocationHandleType,
                       unsigned long long);
    bool ok;
} drv;
static pthread_once_t drv_once = PTHREAD_ONCE_INIT;

static void drv_init(void)
{
    drv.ok = rn_cuda_entry_to("cuPointerGetAttributes", (void **)&drv.attrs) &&
             rn_cuda_entry_to("cuMemGetAddressRange", (void **)&drv.range) &&
             rn_cuda_entry_to("cuMemRetainAllocationHandle", (void **)&drv.retain) &&
             rn_cuda_entry_to("cuMemRelease", (void **)&drv.release) &&
             rn_cuda_entry_to("cuMemGetAllocationPropertiesFromHandle", (void **)&drv.props) &&
             rn_cuda_entry_to("cuMemExportToShareableHandle", (void **)&drv.export);
}

/* The mapping of one physical allocation that contains addr. */
static int look(void *ctx, uintptr_t addr, rnc_vmm_piece *out)
{
    CUpointer_attribute at[] = {CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR,
                                CU_POINTER_ATTRIBUTE_MAPPING_SIZE};
    unsigned long long base = 0, size = 0;
    void *data[] = {&base, &size};
    CUdeviceptr b = 0;
    size_t s = 0;

    (void)ctx;
    if (drv.attrs(2, at, data, (CUdeviceptr)addr) == CUDA_SUCCESS && size > 0) {
        out->base = (uintptr_t)base;
        out->size = (size_t)size;
        return 0;
    }
    /* Older drivers: the address range, which for cuMemMap memory is the
     * mapping's. */
    if (drv.range(&b, &s, (CUdeviceptr)addr) != CUDA_SUCCESS || s == 0)
        return -1;
    out->base = (uintptr_t)b;
    out->size = s;
    return 0;
}

static void range_free(vmm_range *r)
{
    for (uint32_t i = 0; i < r->n; i++)
        (void)drv.release(r->pc[i].h);
    free(r->pc);
    r->pc = NULL;
    r->n = 0;
}

/* Drop cached range i: the daemon's region (best effort) and our references. */
static void drop_range(rn_client *c, rnc_vmm *v, size_t i)
{
    (void)rnc_unregister(c, v->r[i].region);
    range_free(&v->r[i]);
    memmove(&v->r[i], &v->r[i + 1], (v->n - i - 1) * sizeof v->r[0]);
    v->n--;
}

/* Forget every range without telling the daemon (its session is gone). */
static void forget_all(rnc_vmm *v)
{
    for (size_t i = 0; i < v->n; i++)
        range_free(&v->r[i]);
    v->n = 0;
}

void rnc_vmm_release(rn_client *c)
{
    rnc_vmm *v = c->vmm;

    if (!v)
        return;
    forget_all(v);
    free(v->r);
    free(v->walk);
    free(v);
    c->vmm = NULL;
}

/* Whether every allocation of r is still the one r holds, at its address.
 * All of them, not only those under the tensor: a range found stale later
 * in the same call would be dropped while an earlier tensor of the call
 * names its region. */
static bool still_mapped(const vmm_range *r)
{
    for (uint32_t i = 0; i < r->n; i++) {
        const vmm_piece *pc = &r->pc[i];
        CUmemGenericAllocationHandle h = 0;
        if (drv.retain(&h, (void *)pc->base) != CUDA_SUCCESS)
            return false;
        (void)drv.release(h);
        if (h != pc->h)
            return false;
    }
    return true;
}

/* Why memory with handle types `types` cannot be shared, as c's error. */
static int not_exportable(rn_client *c, const char *field, unsigned long long types)
{
    if (types & CU_MEM_HANDLE_TYPE_FABRIC)
        return rnc_fail(c, RN_NOT_SHARED,
                        "%s: cuMemCreate memory exportable as fabric handles only (PyTorch's "
                        "choice where IMEX works); rmsnormd imports POSIX descriptors: set "
                        "expandable_segments:False",
                        field);
    return rnc_fail(c, RN_NOT_SHARED,
                    "%s: cuMemCreate memory not exportable as a POSIX descriptor (handle types "
                    "0x%llx); PyTorch requests one for expandable segments since its PR #130890: "
                    "upgrade it, or set expandable_segments:False",
                    field, types);
}

/* A failure of the registration, with field in front of its message. */
static int field_fail(rn_client *c, int rv, const char *field)
{
    char why[RN_ERRMSG_LEN];

    snprintf(why, sizeof why, "%s", c->last_error);
    return rnc_fail(c, rv, "%s: %s", field, why);
}

/* Register the allocations of walk[0..n) as one range; appended to v. */
static int register_range(rn_client *c, rnc_vmm *v, const char *field, size_t n,
                          const uint8_t uuid[RNP_UUID_BYTES], vmm_range *out)
{
    uintptr_t base = v->walk[0].base;
    uint64_t total = 0;
    size_t got = 0;
    int rv = 0;

    out->pc = calloc(n, sizeof *out->pc);
    if (!out->pc)
        return rnc_fail(c, RN_NOMEM, "%s: out of memory", field);
    /* Our references first: what is sent is what the cache then checks. */
    for (; got < n; got++) {
        CUmemAllocationProp prop;
        vmm_piece *pc = &out->pc[got];
        pc->base = v->walk[got].base;
        pc->size = v->walk[got].size;
        if (drv.retain(&pc->h, (void *)pc->base) != CUDA_SUCCESS) {
            rv = rnc_fail(c, RN_NOT_SHARED,
                          "%s: no allocation handle for the memory at %p "
                          "(cuMemRetainAllocationHandle): memory pools (cudaMallocAsync) cannot "
                          "be shared; use cudaMalloc or cuMemCreate",
                          field, (void *)pc->base);
            goto fail;
        }
        memset(&prop, 0, sizeof prop);
        if (drv.props(&prop, pc->h) != CUDA_SUCCESS) {
            got++;
            rv = rnc_fail(c, RN_NOT_SHARED,
                          "%s: cuMemGetAllocationPropertiesFromHandle failed for %p", field,
                          (void *)pc->base);
            goto fail;
        }
        if (!(prop.requestedHandleTypes & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)) {
            got++;
            rv = not_exportable(c, field, (unsigned long long)prop.requestedHandleTypes);
            goto fail;
        }
        total += pc->size;
    }
    for (size_t i = 0; i < n; i++) {
        int fd = -1;
        CUresult r = drv.export(&fd, out->pc[i].h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
        if (r != CUDA_SUCCESS) {
            rv = rnc_fail(c, RN_NOT_SHARED,
                          "%s: cuMemExportToShareableHandle (POSIX descriptor) failed for %p: "
                          "driver error %d",
                          field, (void *)out->pc[i].base, (int)r);
            goto fail;
        }
        rv = rnc_chan_vmm_chunk(c, fd, (uint32_t)i, (uint64_t)(out->pc[i].base - base),
                                (uint64_t)out->pc[i].size);
        close(fd);
        if (rv != 0) {
            rv = field_fail(c, rv, field);
            goto fail;
        }
    }
    if ((rv = rnc_chan_vmm_map(c, (uint32_t)n, total, uuid, &out->region)) != 0) {
        rv = field_fail(c, rv, field);
        goto fail;
    }
    out->base = base;
    out->total = total;
    out->n = (uint32_t)n;
    return 0;
fail:
    out->n = (uint32_t)got;
    range_free(out);
    return rv;
}

bool rnc_vmm_enabled(void)
{
    const char *e = getenv("RMSNORMD_VMM");
    return !(e && strcmp(e, "0") == 0);
}

int rnc_vmm_map(rn_client *c, const char *field, const void *p, uint64_t bytes,
                const uint8_t uuid[RNP_UUID_BYTES], rnp_tensor *t)
{
    uintptr_t lo = (uintptr_t)p, hi, at = lo;
    rnc_vmm *v;
    vmm_range nr;
    int n, rv;

    pthread_once(&drv_once, drv_init);
    if (!drv.ok)
        return rnc_fail(c, RN_NOT_SHARED,
                        "%s: cuMemCreate memory needs the CUDA driver's virtual memory calls, "
                        "which it lacks",
                        field);
    if (!c->have_chan)
        return rnc_fail(c, RN_NOT_SHARED,
                        "%s: cuMemCreate memory is shared over the session channel, which this "
                        "daemon lacks (an older rmsnormd?)",
                        field);
    if (bytes == 0 || __builtin_add_overflow(lo, (uintptr_t)bytes, &hi))
        return rnc_fail(c, RN_NOT_SHARED, "%s: the tensor's span does not fit the address space",
                        field);
    if (!c->vmm && !(c->vmm = calloc(1, sizeof *c->vmm)))
        return rnc_fail(c, RN_NOMEM, "%s: out of memory", field);
    v = c->vmm;
    if (memcmp(&v->session, &c->session, sizeof v->session) != 0) {
        forget_all(v);
        v->session = c->session;
    }
    /* The largest cached range that covers the tensor and still maps the
     * same allocations (the largest: after the segment grew, tensors of
     * one call then share a region where they can); stale ones met on the
     * way are dropped. */
    {
        size_t best = v->n;
        for (size_t i = 0; i < v->n;) {
            vmm_range *r = &v->r[i];
            if (r->stale || lo < r->base || hi > r->base + r->total ||
                (best < v->n && r->total <= v->r[best].total)) {
                i++;
                continue;
            }
            if (!still_mapped(r)) {
                /* A graph's replays still name its region: the daemon's
                 * mapping stays until the graph is gone (rnc_vmm_hold);
                 * the daemon's references keep that memory alive. */
                if (r->holds) {
                    r->stale = true;
                    i++;
                    continue;
                }
                drop_range(c, v, i);
                best = v->n; /* indices moved: look again */
                i = 0;
                continue;
            }
            best = i++;
        }
        if (best < v->n) {
            v->r[best].used = ++v->tick;
            t->region.id = v->r[best].region;
            t->offset = (uint64_t)(lo - v->r[best].base);
            return 0;
        }
    }
    if (!v->walk && !(v->walk = calloc(RNP_VMM_MAX_CHUNKS, sizeof *v->walk)))
        return rnc_fail(c, RN_NOMEM, "%s: out of memory", field);
    n = rnc_vmm_walk(look, NULL, lo, hi, v->walk, RNP_VMM_MAX_CHUNKS, &at);
    if (n == RNC_VMM_HOLE)
        return rnc_fail(c, RN_NOT_SHARED, "%s: nothing is mapped at %p, inside the tensor",
                        field, (void *)at);
    if (n == RNC_VMM_TOO_MANY)
        return rnc_fail(c, RN_NOT_SHARED,
                        "%s: the tensor spans more than %u physical allocations", field,
                        RNP_VMM_MAX_CHUNKS);
    if (n <= 0)
        return rnc_fail(c, RN_NOT_SHARED,
                        "%s: the driver's mapping at %p does not contain it", field, (void *)at);
    /* Room for one more: the least recently used ranges that no live
     * graph holds go, down to the limit (held ones may have kept it above),
     * but never one this call already named (used in the last RNP_T_COUNT
     * ticks: a call maps at most that many tensors); none left to drop:
     * the cache grows. */
    while (v->n >= VMM_MAX_RANGES) {
        size_t lru = v->n;
        for (size_t i = 0; i < v->n; i++)
            if (!v->r[i].holds && v->tick - v->r[i].used >= RNP_T_COUNT &&
                (lru == v->n || v->r[i].used < v->r[lru].used))
                lru = i;
        if (lru == v->n)
            break;
        drop_range(c, v, lru);
    }
    if (v->n == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 8;
        vmm_range *nv = realloc(v->r, cap * sizeof *nv);
        if (!nv)
            return rnc_fail(c, RN_NOMEM, "%s: out of memory", field);
        v->r = nv;
        v->cap = cap;
    }
    memset(&nr, 0, sizeof nr);
    if ((rv = register_range(c, v, field, (size_t)n, uuid, &nr)) != 0)
        return rv;
    nr.used = ++v->tick;
    v->r[v->n++] = nr;
    t->region.id = nr.region;
    t->offset = (uint64_t)(lo - nr.base);
    return 0;
}

void rnc_vmm_hold(rn_client *c, const rnp_session *session, const uint32_t *regions, size_t n,
                  bool hold)
{
    rnc_vmm *v = c->vmm;

    if (!v || memcmp(&v->session, session, sizeof v->session) != 0)
        return; /* (another session's regions: gone with it) */
    /* A session over (the daemon gone, or a new session that has not yet
     * mapped VMM memory, whose region ids restart): its cache is forgotten
     * at the next map, and an UNREGISTER now would go to a dead daemon or
     * name another session's region. */
    if (!c->have_session || memcmp(&c->session, session, sizeof c->session) != 0 ||
        rnc_watch_fired(c))
        return;
    for (size_t k = 0; k < n; k++) {
        for (size_t i = 0; regions[k] && i < v->n; i++) {
            vmm_range *r = &v->r[i];
            if (r->region != regions[k])
                continue;
            if (hold)
                r->holds++;
            else if (r->holds && --r->holds == 0 && r->stale)
                drop_range(c, v, i);
            break;
        }
    }
}
