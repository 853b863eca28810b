/*
 * client_cuda.c - the stream-ordered calls on device pointers (built only
 * with a CUDA Toolkit, RN_HAVE_CUDA): rn_rmsnorm_bwd and rn_rmsnorm_bwd_sync.
 *
 * Each pointer is mapped to its allocation: the base through
 * cuMemGetAddressRange, the identity through CU_POINTER_ATTRIBUTE_BUFFER_ID,
 * so that an allocation freed and another made at the same address is not
 * mistaken for the old one.  A new allocation is registered once with its
 * CUDA IPC handle (cudaIpcGetMemHandle on the base) and the UUID of its
 * device, and cached; a cached entry is dropped (UNREGISTER) when the buffer
 * id at its base changes or a new allocation overlaps it.
 *
 * Ordering without host synchronisation: at the first call the library
 * creates a small ring of interprocess "ready" events and swaps them for the
 * daemon's "done" events (EVENTS).  A call records ready[k] on the caller's
 * stream, sends BWD naming k, waits for the acknowledgement, and enqueues
 * cudaStreamWaitEvent(stream, done[j]) for the j the daemon recorded before
 * it answered.  A ready slot is recorded again only after the request that
 * used it was acknowledged (one request at a time per connection), and the
 * daemon's wait on it was enqueued before that acknowledgement.
 *
 * The driver is reached through cudaGetDriverEntryPointByVersion, so a
 * worker links no libcuda of its own.  The CUDA state of a client lives in a
 * table keyed by the rn_client, tagged with the session it was built under:
 * after a daemon restart (a new session) regions and events are built again.
 */
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client_int.h"

/* Ready/done ring size: one request per connection is in flight, so two
 * would do; a few more let the daemon's wait lag without stalling us. */
#define READY_SLOTS 4

/* Called by rn_close (client.c). */
void rnc_cuda_release(rn_client *c);

typedef CUresult (*pfn_range)(CUdeviceptr *base, size_t *size, CUdeviceptr p);
typedef CUresult (*pfn_attrs)(unsigned n, CUpointer_attribute *attrs, void **data, CUdeviceptr p);

static pthread_once_t drv_once = PTHREAD_ONCE_INIT;
static pfn_range drv_range;
static pfn_attrs drv_attrs;
static char drv_error[160];

/* One registered allocation of this client in the current session. */
typedef struct alloc_ent {
    uintptr_t base;
    size_t size;
    unsigned long long buffer_id;
    uint32_t region;
} alloc_ent;

typedef struct cstate {
    const rn_client *c;
    rnp_session session;           /* the session it was built under */
    bool built;
    int device;                    /* of the events */
    uint32_t nev;
    cudaEvent_t ready[READY_SLOTS];
    cudaEvent_t done[RNP_MAX_EVENTS];
    uint32_t next_ready;
    alloc_ent *ents;
    size_t nents, cap;
    struct cstate *next;
} cstate;

static pthread_mutex_t table_mu = PTHREAD_MUTEX_INITIALIZER;
static cstate *table;

/* UUIDs of devices by ordinal, filled on first use. */
static pthread_mutex_t uuid_mu = PTHREAD_MUTEX_INITIALIZER;
static struct { bool have; uint8_t b[RNP_UUID_BYTES]; } uuids[64];

static void drv_init(void)
{
    enum cudaDriverEntryPointQueryResult q1 = cudaDriverEntryPointSymbolNotFound, q2 = q1;
    cudaError_t e1 = cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", (void **)&drv_range,
                                                      12000, cudaEnableDefault, &q1);
    cudaError_t e2 = cudaGetDriverEntryPointByVersion("cuPointerGetAttributes", (void **)&drv_attrs,
                                                      12000, cudaEnableDefault, &q2);
    if (e1 != cudaSuccess || e2 != cudaSuccess || q1 != cudaDriverEntryPointSuccess ||
        q2 != cudaDriverEntryPointSuccess || !drv_range || !drv_attrs) {
        snprintf(drv_error, sizeof drv_error, "the CUDA driver's entry points are unavailable: %s",
                 cudaGetErrorString(e1 != cudaSuccess ? e1 : e2));
        (void)cudaGetLastError();
        drv_range = NULL;
        drv_attrs = NULL;
    }
}

static int cuda_fail(rn_client *c, const char *what, cudaError_t e)
{
    (void)cudaGetLastError();
    return rnc_fail(c, e == cudaErrorMemoryAllocation ? RN_NOMEM : RN_CUDA, "%s: %s", what,
                    cudaGetErrorString(e));
}

static int device_uuid(rn_client *c, int dev, uint8_t out[RNP_UUID_BYTES])
{
    int rv = 0;
    if (dev < 0 || dev >= 64)
        return rnc_fail(c, RN_UNSUPPORTED, "device %d: ordinals above 63 are not supported", dev);
    pthread_mutex_lock(&uuid_mu);
    if (!uuids[dev].have) {
        struct cudaDeviceProp p;
        cudaError_t e = cudaGetDeviceProperties(&p, dev);
        if (e != cudaSuccess) {
            rv = cuda_fail(c, "cudaGetDeviceProperties", e);
            goto out;
        }
        memcpy(uuids[dev].b, p.uuid.bytes, RNP_UUID_BYTES);
        uuids[dev].have = true;
    }
    memcpy(out, uuids[dev].b, RNP_UUID_BYTES);
out:
    pthread_mutex_unlock(&uuid_mu);
    return rv;
}

/* ---- per-client state ------------------------------------------------------------------ */

static void drop_events(cstate *s)
{
    for (uint32_t i = 0; i < READY_SLOTS; i++)
        if (s->ready[i]) {
            cudaEventDestroy(s->ready[i]);
            s->ready[i] = NULL;
        }
    for (uint32_t i = 0; i < RNP_MAX_EVENTS; i++)
        if (s->done[i]) {
            cudaEventDestroy(s->done[i]);
            s->done[i] = NULL;
        }
    s->nev = 0;
    (void)cudaGetLastError();
}

/* Forget everything that belonged to the old session: its regions and
 * events are gone with it (the daemon released them). */
static void reset(cstate *s)
{
    drop_events(s);
    s->nents = 0;
    s->next_ready = 0;
    s->built = false;
}

static cstate *state_of(rn_client *c)
{
    cstate *s;

    pthread_mutex_lock(&table_mu);
    for (s = table; s; s = s->next)
        if (s->c == c)
            break;
    if (!s && (s = calloc(1, sizeof *s)) != NULL) {
        s->c = c;
        s->next = table;
        table = s;
    }
    pthread_mutex_unlock(&table_mu);
    return s;
}

void rnc_cuda_release(rn_client *c)
{
    cstate **pp, *s = NULL;

    pthread_mutex_lock(&table_mu);
    for (pp = &table; *pp; pp = &(*pp)->next) {
        if ((*pp)->c == c) {
            s = *pp;
            *pp = s->next;
            break;
        }
    }
    pthread_mutex_unlock(&table_mu);
    if (!s)
        return;
    drop_events(s);
    free(s->ents);
    free(s);
}

/* ---- events ------------------------------------------------------------------------------ */

static int exchange_events(rn_client *c, cstate *s)
{
    uint32_t n = c->hello.limits.event_slots;
    rnp_events_req *ev;
    cudaIpcEventHandle_t h;
    cudaError_t e;
    int dev, rv;

    if (n == 0)
        return rnc_fail(c, RN_UNSUPPORTED,
                        "the daemon's %s backend has no CUDA events; use rn_rmsnorm_bwd_host",
                        c->hello.backend);
    if (n > READY_SLOTS)
        n = READY_SLOTS;
    if ((e = cudaGetDevice(&dev)) != cudaSuccess)
        return cuda_fail(c, "cudaGetDevice", e);
    drop_events(s);
    memset(&c->req, 0, sizeof c->req);
    c->req.op = RN_OP_EVENTS;
    ev = &c->req.u.events;
    ev->session = c->session;
    ev->n = n;
    if ((rv = device_uuid(c, dev, ev->device_uuid)) != 0)
        return rv;
    for (uint32_t i = 0; i < n; i++) {
        e = cudaEventCreateWithFlags(&s->ready[i], cudaEventDisableTiming | cudaEventInterprocess);
        if (e != cudaSuccess) {
            rv = cuda_fail(c, "creating the ready events", e);
            goto fail;
        }
        if ((e = cudaIpcGetEventHandle(&h, s->ready[i])) != cudaSuccess) {
            rv = cuda_fail(c, "cudaIpcGetEventHandle", e);
            goto fail;
        }
        memcpy(ev->ready[i], &h, sizeof h);
    }
    if ((rv = rnc_transact(c, c->timeout_ms)) != 0)
        goto fail;
    if (c->rep.u.events.n != n) {
        rv = rnc_fail(c, RN_BAD_REPLY, "events reply: %u done events for %u ready events",
                      c->rep.u.events.n, n);
        goto fail;
    }
    for (uint32_t i = 0; i < n; i++) {
        memcpy(&h, c->rep.u.events.done[i], sizeof h);
        if ((e = cudaIpcOpenEventHandle(&s->done[i], h)) != cudaSuccess) {
            rv = cuda_fail(c, "opening the daemon's done event (cudaIpcOpenEventHandle)", e);
            goto fail;
        }
    }
    s->nev = n;
    s->device = dev;
    s->next_ready = 0;
    return 0;
fail:
    drop_events(s);
    return rv;
}

/* ---- pointers -> (region, offset) ----------------------------------------------------------- */

static void unregister(rn_client *c, uint32_t region)
{
    memset(&c->req, 0, sizeof c->req);
    c->req.op = RN_OP_UNREGISTER;
    c->req.u.unreg.session = c->session;
    c->req.u.unreg.region.id = region;
    /* Best effort: a region the daemon no longer has is gone already. */
    (void)rnc_transact(c, c->timeout_ms);
}

static void drop_entry(rn_client *c, cstate *s, size_t i)
{
    unregister(c, s->ents[i].region);
    s->ents[i] = s->ents[--s->nents];
}

static int register_alloc(rn_client *c, cstate *s, const char *field, uintptr_t base, size_t size,
                          unsigned long long id, int dev, uint32_t *region)
{
    cudaIpcMemHandle_t h;
    cudaError_t e;
    int rv;

    /* An allocation that overlaps a cached one means the old one was freed:
     * release the daemon's mapping of it. */
    for (size_t i = 0; i < s->nents;) {
        if (s->ents[i].base < base + size && base < s->ents[i].base + s->ents[i].size)
            drop_entry(c, s, i);
        else
            i++;
    }
    if (s->nents == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 16;
        alloc_ent *n = realloc(s->ents, cap * sizeof *n);
        if (!n)
            return rnc_fail(c, RN_NOMEM, "%s: out of memory", field);
        s->ents = n;
        s->cap = cap;
    }
    if ((e = cudaIpcGetMemHandle(&h, (void *)base)) != cudaSuccess) {
        (void)cudaGetLastError();
        return rnc_fail(c, RN_NOT_SHARED, "%s: cudaIpcGetMemHandle on its allocation: %s", field,
                        cudaGetErrorString(e));
    }
    memset(&c->req, 0, sizeof c->req);
    c->req.op = RN_OP_REGISTER;
    c->req.u.reg.session = c->session;
    c->req.u.reg.kind = RNP_REGION_CUDA_IPC;
    c->req.u.reg.size = size;
    memcpy(c->req.u.reg.ipc_handle, &h, sizeof h);
    if ((rv = device_uuid(c, dev, c->req.u.reg.device_uuid)) != 0)
        return rv;
    if ((rv = rnc_transact(c, c->timeout_ms)) != 0) {
        char why[RN_ERRMSG_LEN];
        snprintf(why, sizeof why, "%s", c->last_error);
        return rnc_fail(c, rv, "%s: %s", field, why);
    }
    s->ents[s->nents].base = base;
    s->ents[s->nents].size = size;
    s->ents[s->nents].buffer_id = id;
    s->ents[s->nents].region = c->rep.u.reg.region.id;
    *region = s->ents[s->nents].region;
    s->nents++;
    return 0;
}

static int map_dev_ptr(rn_client *c, cstate *s, const char *field, const void *p, rnp_tensor *t)
{
    CUpointer_attribute attrs[] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_IS_MANAGED,
                                   CU_POINTER_ATTRIBUTE_BUFFER_ID,
                                   CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE,
                                   CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL};
    /* The booleans and the enum are written at their own width (at most 4
     * bytes); zeroed 8-byte slots read right whatever that width is. */
    unsigned long long mtype = 0, managed = 0, ipc = 0, id = 0;
    int ordinal = -1;
    void *data[] = {&mtype, &managed, &id, &ipc, &ordinal};
    CUdeviceptr base = 0;
    size_t size = 0;
    uint32_t region = 0;
    int rv;

    if (p == NULL)
        return rnc_fail(c, RN_INVALID_ARGUMENT, "%s: pointer is NULL but its dtype is set", field);
    if (drv_attrs(5, attrs, data, (CUdeviceptr)(uintptr_t)p) != CUDA_SUCCESS)
        return rnc_fail(c, RN_NOT_SHARED, "%s: pointer %p is not known to CUDA", field, p);
    if (managed)
        return rnc_fail(c, RN_NOT_SHARED,
                        "%s: managed memory (cudaMallocManaged) cannot be shared with the daemon; "
                        "use cudaMalloc", field);
    if (mtype != CU_MEMORYTYPE_DEVICE)
        return rnc_fail(c, RN_NOT_SHARED,
                        "%s: host memory cannot be shared with the daemon as a device pointer; use "
                        "cudaMalloc (or rn_rmsnorm_bwd_host with rn_buffer_alloc)", field);
    if (!ipc)
        return rnc_fail(c, RN_NOT_SHARED,
                        "%s: memory from cuMemCreate or a memory pool (e.g. PyTorch expandable "
                        "segments, cudaMallocAsync) has no CUDA IPC handle; use cudaMalloc", field);
    /* The hot path: a pointer into an allocation registered before, same
     * buffer id, needs no further driver call. */
    for (size_t i = 0; i < s->nents; i++) {
        if (s->ents[i].buffer_id == id && (uintptr_t)p >= s->ents[i].base &&
            (uintptr_t)p < s->ents[i].base + s->ents[i].size) {
            t->region.id = s->ents[i].region;
            t->offset = (uint64_t)((uintptr_t)p - s->ents[i].base);
            return 0;
        }
    }
    if (drv_range(&base, &size, (CUdeviceptr)(uintptr_t)p) != CUDA_SUCCESS)
        return rnc_fail(c, RN_NOT_SHARED, "%s: cuMemGetAddressRange failed for %p", field, p);
    for (size_t i = 0; i < s->nents; i++) {
        if (s->ents[i].base != (uintptr_t)base)
            continue;
        if (s->ents[i].buffer_id == id && s->ents[i].size == size) {
            region = s->ents[i].region;
        } else {
            /* Freed and allocated again at the same address: not the memory
             * the daemon mapped. */
            drop_entry(c, s, i);
        }
        break;
    }
    if (!region &&
        (rv = register_alloc(c, s, field, (uintptr_t)base, size, id, ordinal, &region)) != 0)
        return rv;
    t->region.id = region;
    t->offset = (uint64_t)((uintptr_t)p - (uintptr_t)base);
    return 0;
}

/* ---- the calls ------------------------------------------------------------------------------- */

/* Map every tensor into b (registering new allocations). */
static int map_tensors(rn_client *c, cstate *s, const rn_bwd_args *a, rnp_bwd_req *b)
{
    int rv;
    if ((rv = map_dev_ptr(c, s, "x", a->x, &b->x)) != 0 ||
        (rv = map_dev_ptr(c, s, "dy", a->dy, &b->dy)) != 0 ||
        (rv = map_dev_ptr(c, s, "dx", a->dx, &b->dx)) != 0)
        return rv;
    b->x.stride = (uint64_t)a->x_stride;
    b->dy.stride = (uint64_t)a->dy_stride;
    b->dx.stride = (uint64_t)a->dx_stride;
    if ((b->has_w = a->w_dtype != RN_DTYPE_NONE) &&
        (rv = map_dev_ptr(c, s, "w", a->w, &b->w)) != 0)
        return rv;
    if ((b->has_rstd = a->rstd != NULL) && (rv = map_dev_ptr(c, s, "rstd", a->rstd, &b->rstd)) != 0)
        return rv;
    if ((b->has_dres = a->dres_dtype != RN_DTYPE_NONE)) {
        if ((rv = map_dev_ptr(c, s, "dres", a->dres, &b->dres)) != 0)
            return rv;
        b->dres.stride = (uint64_t)a->dres_stride;
    }
    if ((b->has_dw = a->dw_dtype != RN_DTYPE_NONE) &&
        (rv = map_dev_ptr(c, s, "dw", a->dw, &b->dw)) != 0)
        return rv;
    return 0;
}

static int bwd_call(rn_client *c, const rn_bwd_args *a, void *stream, int mode, rn_timing *t)
{
    cudaStream_t st = (cudaStream_t)stream;
    uint64_t t0 = rnc_now_ns();
    rnp_bwd_req b;
    cstate *s;
    cudaError_t e;
    int rv;
    uint32_t k;

    if (c == NULL)
        return RN_INVALID_ARGUMENT;
    pthread_once(&drv_once, drv_init);
    pthread_mutex_lock(&c->mu);
    if ((rv = rnc_check_bwd_args(c, a)) != 0)
        goto out;
    if (!(s = state_of(c))) {
        rv = rnc_fail(c, RN_NOMEM, "out of memory for the client's CUDA state");
        goto out;
    }
    /* A lost session (daemon restart) shows as UNKNOWN_SESSION: open a new
     * one, map and exchange everything again, and retry once. */
    for (int attempt = 0, fresh = 0;; attempt++) {
        if ((rv = rnc_ensure_session(c)) != 0)
            break;
        if (c->hello.limits.event_slots == 0 && !fresh) {
            /* What HELLO said may be old: a daemon that fell back to the
             * CPU (--backend auto before the GPU was ready) may have come
             * back with CUDA since.  Ask once more before refusing. */
            rnc_end_session(c);
            fresh = 1;
            attempt--;
            continue;
        }
        if (c->hello.limits.event_slots == 0) {
            rv = rnc_fail(c, RN_UNSUPPORTED,
                          "the daemon runs the %s backend, which has no CUDA; use "
                          "rn_rmsnorm_bwd_host with buffers from rn_buffer_alloc",
                          c->hello.backend);
            break;
        }
        if (!drv_attrs) {
            rv = rnc_fail(c, RN_NO_CUDA, "%s", drv_error);
            break;
        }
        if (s->built && memcmp(&s->session, &c->session, sizeof s->session) != 0)
            reset(s);
        if (!s->built) {
            s->session = c->session;
            s->built = true;
        }
        if (s->nev == 0 && (rv = exchange_events(c, s)) != 0)
            goto retry;
        memset(&b, 0, sizeof b);
        if ((rv = map_tensors(c, s, a, &b)) != 0)
            goto retry;
        /* The daemon's stream waits for everything queued on ours so far. */
        k = s->next_ready++ % s->nev;
        if ((e = cudaEventRecord(s->ready[k], st)) != cudaSuccess) {
            rv = cuda_fail(c, "recording the ready event on the stream", e);
            break;
        }
        rnc_fill_bwd(c, a, mode, (int32_t)k, &b);
        memset(&c->req, 0, sizeof c->req);
        c->req.op = RN_OP_BWD;
        c->req.u.bwd = b;
        rv = rnc_transact(c, c->timeout_ms);
    retry:
        if (rv == RN_UNKNOWN_SESSION && attempt == 0) {
            c->have_session = false;
            continue;
        }
        break;
    }
    if (rv != 0)
        goto out;
    if (mode == RNP_MODE_ASYNC) {
        int32_t j = c->rep.u.bwd.done_slot;
        if (j < 0 || (uint32_t)j >= s->nev) {
            rv = rnc_fail(c, RN_BAD_REPLY, "bwd reply: done slot %d outside 0..%u", (int)j,
                          s->nev - 1);
            goto out;
        }
        /* The daemon recorded done[j] before it answered: waiting now waits
         * for exactly this request's kernel. */
        if ((e = cudaStreamWaitEvent(st, s->done[j], 0)) != cudaSuccess) {
            rv = cuda_fail(c, "cudaStreamWaitEvent on the done event", e);
            goto out;
        }
    }
    if (t) {
        rn_timing tm;
        tm.queue_ns = c->rep.u.bwd.queue_ns;
        tm.compute_ns = c->rep.u.bwd.compute_ns;
        tm.total_ns = rnc_now_ns() - t0;
        *t = tm;
    }
out:
    pthread_mutex_unlock(&c->mu);
    return rv;
}

int rn_rmsnorm_bwd(rn_client *c, const rn_bwd_args *a, void *cuda_stream)
{
    return bwd_call(c, a, cuda_stream, RNP_MODE_ASYNC, NULL);
}

int rn_rmsnorm_bwd_sync(rn_client *c, const rn_bwd_args *a, void *cuda_stream, rn_timing *t)
{
    return bwd_call(c, a, cuda_stream, RNP_MODE_SYNC, t);
}
