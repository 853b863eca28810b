/* SPDX-License-Identifier: MIT */
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
 * id at its base changes or a new allocation overlaps it, and before any
 * new registration every cached entry whose memory was freed is.
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
 * This file is the device pointer mapper of the backward call (bwd.c runs
 * the call, its session retry and its timing).  The driver is reached
 * through cudaGetDriverEntryPointByVersion, so a worker links no libcuda of
 * its own.  The CUDA state of a client hangs off the rn_client, tagged with
 * the session it was built under: after a daemon restart (a new session)
 * regions and events are built again.
 */
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client_int.h"
#include "rn_check.h"
#include "vmm.h"

/* Ready/done ring size: one request per connection is in flight, so two
 * would do; a few more let the daemon's wait lag without stalling us. */
#define READY_SLOTS 4

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

struct rnc_cuda {
    rnp_session session; /* the session it was built under */
    bool built;
    int device; /* of the events */
    uint32_t nev;
    cudaEvent_t ready[READY_SLOTS];
    cudaEvent_t done[RNP_MAX_EVENTS];
    uint32_t next_ready;
    bool events_tried; /* a fast-path call tried the exchange in this session */
    alloc_ent *ents;
    size_t nents, cap;
};

/* One device call: what the mapper's hooks need besides the client. */
typedef struct cuda_call {
    const rn_bwd_args *a; /* the tensors' shapes (vmm_cuda.c needs their spans) */
    cudaStream_t stream;
    int mode;   /* rnp_mode */
    bool fresh; /* this call asked the daemon again whether it has CUDA */
    bool ring;  /* headed for the fast path (rnc_bwd_ring_dev) */
} cuda_call;

/* UUIDs of devices by ordinal, filled on first use. */
static pthread_mutex_t uuid_mu = PTHREAD_MUTEX_INITIALIZER;
static struct {
    bool have;
    uint8_t b[RNP_UUID_BYTES];
} uuids[64];

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

/* A failed CUDA runtime call (RN_CUDA_GOTO cleared CUDA's error state). */
static int cuda_fail(rn_client *c, const char *what, const rn_fault *f)
{
    return rnc_fail(c, f->cuda == cudaErrorMemoryAllocation ? RN_NOMEM : RN_CUDA, "%s: %s", what,
                    f->why);
}

static int device_uuid(rn_client *c, int dev, uint8_t out[RNP_UUID_BYTES])
{
    struct cudaDeviceProp p;
    rn_fault f;

    if (dev < 0 || dev >= 64)
        return rnc_fail(c, RN_UNSUPPORTED, "device %d: ordinals above 63 are not supported", dev);
    pthread_mutex_lock(&uuid_mu);
    if (!uuids[dev].have) {
        RN_CUDA_GOTO(cudaGetDeviceProperties(&p, dev), &f, fail);
        memcpy(uuids[dev].b, p.uuid.bytes, RNP_UUID_BYTES);
        uuids[dev].have = true;
    }
    memcpy(out, uuids[dev].b, RNP_UUID_BYTES);
    pthread_mutex_unlock(&uuid_mu);
    return 0;
fail:
    pthread_mutex_unlock(&uuid_mu);
    return cuda_fail(c, "cudaGetDeviceProperties", &f);
}

/* ---- per-client state ------------------------------------------------------------------ */

static void drop_events(rnc_cuda *s)
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
static void reset(rnc_cuda *s)
{
    drop_events(s);
    s->nents = 0;
    s->next_ready = 0;
    s->events_tried = false;
    s->built = false;
}

void rnc_cuda_release(rn_client *c)
{
    rnc_cuda *s = c->cuda;

    if (!s)
        return;
    drop_events(s);
    free(s->ents);
    free(s);
    c->cuda = NULL;
    rnc_vmm_release(c);
}

/* ---- events ------------------------------------------------------------------------------ */

static int exchange_events(rn_client *c, rnc_cuda *s)
{
    uint32_t n = c->hello.limits.event_slots;
    rnp_events_req *ev;
    cudaIpcEventHandle_t h;
    rn_fault f;
    const char *what = NULL;
    int dev, rv;

    if (n == 0)
        return rnc_fail(c, RN_UNSUPPORTED,
                        "the daemon's %s backend has no CUDA events; use rn_rmsnorm_bwd_host",
                        c->hello.backend);
    if (n > READY_SLOTS)
        n = READY_SLOTS;
    RN_CUDA_GOTO(cudaGetDevice(&dev), &f, no_device);
    drop_events(s);
    ev = &rnc_request(c, RN_OP_EVENTS)->u.events;
    ev->session = c->session;
    ev->n = n;
    if ((rv = device_uuid(c, dev, ev->device_uuid)) != 0)
        return rv;
    for (uint32_t i = 0; i < n; i++) {
        what = "creating the ready events";
        RN_CUDA_GOTO(
            cudaEventCreateWithFlags(&s->ready[i], cudaEventDisableTiming | cudaEventInterprocess),
            &f, cuda_failed);
        what = "cudaIpcGetEventHandle";
        RN_CUDA_GOTO(cudaIpcGetEventHandle(&h, s->ready[i]), &f, cuda_failed);
        memcpy(ev->ready[i], &h, sizeof h);
    }
    if ((rv = rnc_transact(c, c->timeout_ms)) != 0)
        goto fail;
    if (c->rep.u.events.n != n) {
        rv = rnc_fail(c, RN_BAD_REPLY, "events reply: %u done events for %u ready events",
                      c->rep.u.events.n, n);
        goto fail;
    }
    what = "opening the daemon's done event (cudaIpcOpenEventHandle)";
    for (uint32_t i = 0; i < n; i++) {
        memcpy(&h, c->rep.u.events.done[i], sizeof h);
        RN_CUDA_GOTO(cudaIpcOpenEventHandle(&s->done[i], h), &f, cuda_failed);
    }
    s->nev = n;
    s->device = dev;
    s->next_ready = 0;
    return 0;
no_device:
    return cuda_fail(c, "cudaGetDevice", &f);
cuda_failed:
    rv = cuda_fail(c, what, &f);
fail:
    drop_events(s);
    return rv;
}

/* ---- pointers -> (region, offset) ----------------------------------------------------------- */

static void drop_entry(rn_client *c, rnc_cuda *s, size_t i)
{
    /* Best effort: a region the daemon no longer has is gone already. */
    (void)rnc_unregister(c, s->ents[i].region);
    s->ents[i] = s->ents[--s->nents];
}

static int register_alloc(rn_client *c, rnc_cuda *s, const char *field, uintptr_t base, size_t size,
                          unsigned long long id, int dev, uint32_t *region)
{
    rnp_register_req r;
    cudaIpcMemHandle_t h;
    rn_fault f;
    int rv;

    /* A cached allocation that was freed (it overlaps this one, or its base
     * holds no allocation or another one now): release the daemon's mapping
     * of it first.  All of them, not only the overlapping ones: the driver
     * packs small allocations into shared blocks, and the daemon cannot open
     * a handle into a block while it still maps a freed allocation of it.
     * One attribute query per cached entry, at a registration only. */
    for (size_t i = 0; i < s->nents;) {
        CUpointer_attribute at = CU_POINTER_ATTRIBUTE_BUFFER_ID;
        unsigned long long bid = 0;
        void *data = &bid;
        if ((s->ents[i].base < base + size && base < s->ents[i].base + s->ents[i].size) ||
            drv_attrs(1, &at, &data, (CUdeviceptr)s->ents[i].base) != CUDA_SUCCESS ||
            bid != s->ents[i].buffer_id)
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
    RN_CUDA_GOTO(cudaIpcGetMemHandle(&h, (void *)base), &f, no_handle);
    memset(&r, 0, sizeof r);
    r.kind = RNP_REGION_CUDA_IPC;
    r.size = size;
    memcpy(r.ipc_handle, &h, sizeof h);
    if ((rv = device_uuid(c, dev, r.device_uuid)) != 0)
        return rv;
    if ((rv = rnc_register(c, &r, region)) != 0) {
        char why[RN_ERRMSG_LEN];
        snprintf(why, sizeof why, "%s", c->last_error);
        return rnc_fail(c, rv, "%s: %s", field, why);
    }
    s->ents[s->nents].base = base;
    s->ents[s->nents].size = size;
    s->ents[s->nents].buffer_id = id;
    s->ents[s->nents].region = *region;
    s->nents++;
    return 0;
no_handle:
    return rnc_fail(c, RN_NOT_SHARED, "%s: cudaIpcGetMemHandle on its allocation: %s", field,
                    f.why);
}

/* The mapper's map hook: p to its allocation's region, registering the
 * allocation at its first use. */
static int map_dev_ptr(rn_client *c, void *ctx, const char *field, const void *p, rnp_tensor *t)
{
    CUpointer_attribute attrs[] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                                   CU_POINTER_ATTRIBUTE_IS_MANAGED, CU_POINTER_ATTRIBUTE_BUFFER_ID,
                                   CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE,
                                   CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL};
    /* The booleans and the enum are written at their own width (at most 4
     * bytes); zeroed 8-byte slots read right whatever that width is. */
    unsigned long long mtype = 0, managed = 0, ipc = 0, id = 0;
    int ordinal = -1;
    void *data[] = {&mtype, &managed, &id, &ipc, &ordinal};
    rnc_cuda *s = c->cuda;
    CUdeviceptr base = 0;
    size_t size = 0;
    uint32_t region = 0;
    int rv;

    if (drv_attrs(5, attrs, data, (CUdeviceptr)(uintptr_t)p) != CUDA_SUCCESS)
        return rnc_fail(c, RN_NOT_SHARED, "%s: pointer %p is not known to CUDA", field, p);
    if (managed)
        return rnc_fail(c, RN_NOT_SHARED,
                        "%s: managed memory (cudaMallocManaged) cannot be shared with the daemon; "
                        "use cudaMalloc",
                        field);
    if (mtype != CU_MEMORYTYPE_DEVICE)
        return rnc_fail(c, RN_NOT_SHARED,
                        "%s: host memory cannot be shared with the daemon as a device pointer; use "
                        "cudaMalloc (or rn_rmsnorm_bwd_host with rn_buffer_alloc)",
                        field);
    if (!ipc && !rnc_vmm_enabled())
        return rnc_fail(c, RN_NOT_SHARED,
                        "%s: memory from cuMemCreate or a memory pool (e.g. PyTorch expandable "
                        "segments, cudaMallocAsync) has no CUDA IPC handle, and RMSNORMD_VMM=0 "
                        "turns off sharing cuMemCreate memory by descriptor; unset "
                        "RMSNORMD_VMM, or use cudaMalloc",
                        field);
    if (!ipc) {
        /* cuMemCreate memory (PyTorch's expandable segments): shared by
         * descriptor, one per physical allocation (vmm_cuda.c), unless
         * RMSNORMD_VMM=0. */
        const cuda_call *k = ctx;
        uint8_t uuid[RNP_UUID_BYTES];
        uint64_t bytes = 0;
        if (!k || !k->a || rnc_tensor_bytes(k->a, field, &bytes) != 0)
            return rnc_fail(c, RN_NOT_SHARED, "%s: the tensor's span does not fit", field);
        if ((rv = device_uuid(c, ordinal, uuid)) != 0)
            return rv;
        return rnc_vmm_map(c, field, p, bytes, uuid, t);
    }
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

/* ---- the mapper's other hooks ------------------------------------------------------------- */

/* In the session, before mapping: a daemon with CUDA, the driver's entry
 * points, and this session's state and events. */
static int prepare(rn_client *c, void *ctx)
{
    cuda_call *k = ctx;
    rnc_cuda *s;
    int rv;

    if (c->hello.limits.event_slots == 0 && !k->fresh &&
        memcmp(&c->cuda_asked, &c->session, sizeof c->session) != 0 && !rnc_ring_busy(c)) {
        /* What HELLO said may be old: a daemon that fell back to the CPU
         * (--backend auto before the GPU was ready) may have come back
         * with CUDA since.  Ask once more before refusing: once a session,
         * and not while ring calls are out, which the BYE would end (it
         * ended the session at every such call, found in review). */
        rnc_end_session(c);
        k->fresh = true;
        if ((rv = rnc_ensure_session(c)) != 0)
            return rv;
        c->cuda_asked = c->session;
    }
    if (c->hello.limits.event_slots == 0)
        return rnc_fail(c, RN_UNSUPPORTED,
                        "the daemon runs the %s backend, which has no CUDA; use "
                        "rn_rmsnorm_bwd_host with buffers from rn_buffer_alloc",
                        c->hello.backend);
    if (!drv_attrs)
        return rnc_fail(c, RN_NO_CUDA, "%s", drv_error);
    if (!c->cuda && !(c->cuda = calloc(1, sizeof *c->cuda)))
        return rnc_fail(c, RN_NOMEM, "out of memory for the client's CUDA state");
    s = c->cuda;
    if (s->built && memcmp(&s->session, &c->session, sizeof s->session) != 0)
        reset(s);
    if (!s->built) {
        s->session = c->session;
        s->built = true;
    }
    /* The events are the classic path's.  A call that the ring will take
     * (the daemon offers it in this session) needs none, but the first one
     * still exchanges them, once, so that a later classic call (a stream
     * being captured into a graph, with RN_PATH_AUTO) finds them made and
     * does no setup inside the capture; if the exchange fails (IPC events
     * need a /dev/shm shared with the daemon, which a container may not
     * have) the ring goes on without them. */
    bool ring = k->ring && (c->hello.paths & RNP_PATH_FAST) && c->have_chan;
    if (s->nev == 0 && !ring)
        return exchange_events(c, s);
    if (s->nev == 0 && !s->events_tried) {
        s->events_tried = true;
        if (exchange_events(c, s) != 0)
            rnc_clear_thread_error();
    }
    return 0;
}

/* The daemon's stream waits for everything queued on ours so far. */
static int ready(rn_client *c, void *ctx, int32_t *slot)
{
    cuda_call *k = ctx;
    rnc_cuda *s = c->cuda;
    uint32_t i = s->next_ready++ % s->nev;
    rn_fault f;

    RN_CUDA_GOTO(cudaEventRecord(s->ready[i], k->stream), &f, fail);
    *slot = (int32_t)i;
    return 0;
fail:
    return cuda_fail(c, "recording the ready event on the stream", &f);
}

/* Stream-ordered: later work on the caller's stream waits for the kernel. */
static int accepted(rn_client *c, void *ctx)
{
    cuda_call *k = ctx;
    rnc_cuda *s = c->cuda;
    int32_t j = c->rep.u.bwd.done_slot;
    rn_fault f;

    if (k->mode != RNP_MODE_ASYNC)
        return 0;
    if (j < 0 || (uint32_t)j >= s->nev)
        return rnc_fail(c, RN_BAD_REPLY, "bwd reply: done slot %d outside 0..%u", (int)j,
                        s->nev - 1);
    /* The daemon recorded done[j] before it answered: waiting now waits
     * for exactly this request's kernel. */
    RN_CUDA_GOTO(cudaStreamWaitEvent(k->stream, s->done[j], 0), &f, fail);
    return 0;
fail:
    return cuda_fail(c, "cudaStreamWaitEvent on the done event", &f);
}

static const rnc_mapper cuda_mapper = {
    .prepare = prepare,
    .map = map_dev_ptr,
    .ready = ready,
    .accepted = accepted,
};

/* ---- the calls ------------------------------------------------------------------------------- */

static int bwd_call(rn_client *c, const rn_bwd_args *a, void *stream, int mode, rn_timing *t)
{
    cuda_call k = {.a = a, .stream = (cudaStream_t)stream, .mode = mode};

    if (c == NULL)
        return RN_INVALID_ARGUMENT;
    pthread_once(&drv_once, drv_init);
    /* The fast path (ring_cuda.c) where the daemon offers it, unless the
     * client asked for the classic one. */
    bool automatic = c->path == RN_PATH_AUTO;
    if (mode == RNP_MODE_ASYNC &&
        (c->path == RN_PATH_FAST || (automatic && !__atomic_load_n(&c->ring_off, __ATOMIC_RELAXED)))) {
        enum cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
        enum cudaStreamCaptureMode relaxed = cudaStreamCaptureModeRelaxed;
        if (cudaStreamIsCapturing((cudaStream_t)stream, &cap) != cudaSuccess) {
            (void)cudaGetLastError();
            cap = cudaStreamCaptureStatusNone; /* ring_cuda.c says why */
        }
        /* A call on a stream being captured takes a graph slot (ring.c).
         * Its setup (registering memory, events, loading the replay's
         * kernel) must not be refused as unsafe during the capture (torch
         * captures in the global mode): this thread's mode is relaxed for
         * the call, which queues nothing on the capturing stream but the
         * replay's start and wait. */
        bool relax = cap == cudaStreamCaptureStatusActive &&
                     cudaThreadExchangeStreamCaptureMode(&relaxed) == cudaSuccess;
        {
            k.ring = true;
            int rv = rnc_bwd_ring_dev(c, a, &cuda_mapper, &k, &rnc_cuda_ring_dev, stream);
            if (relax && cudaThreadExchangeStreamCaptureMode(&relaxed) != cudaSuccess)
                (void)cudaGetLastError();
            /* RN_PATH_AUTO: a ring that cannot be set up in this process
             * (a driver without stream memory operations, host memory that
             * cannot be registered, a daemon that refuses the ring) is not
             * tried again; this call and the later ones take the classic
             * path, as they did before the fast path existed. */
            if (rv != 0 && automatic && rnc_ring_setup_failed_here() &&
                cap != cudaStreamCaptureStatusActive && /* (the classic path cannot be captured) */
                (rv == RN_NO_CUDA || rv == RN_UNSUPPORTED || rv == RN_CUDA)) {
                __atomic_store_n(&c->ring_off, true, __ATOMIC_RELAXED);
                rnc_clear_thread_error();
                k.ring = false;
                return rnc_bwd(c, a, mode, &cuda_mapper, &k, t);
            }
            return rv;
        }
    }
    /* The classic path cannot be captured (ring_step says why; a sync
     * call, or the classic path chosen or fallen back to, came here):
     * its kernel would run once, now, on inputs the capture has not
     * written, and no replay would run it. */
    enum cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing((cudaStream_t)stream, &cap) != cudaSuccess)
        (void)cudaGetLastError();
    if (cap != cudaStreamCaptureStatusNone) {
        pthread_mutex_lock(&c->mu); /* (c's message is written under it) */
        int rv = rnc_fail(c, RN_UNSUPPORTED,
                          "graph: the stream is being captured into a CUDA graph, which only an "
                          "async call on the fast path can join (this is %s)",
                          mode != RNP_MODE_ASYNC ? "a sync call" : "the classic path");
        pthread_mutex_unlock(&c->mu);
        return rv;
    }
    return rnc_bwd(c, a, mode, &cuda_mapper, &k, t);
}

int rn_rmsnorm_bwd(rn_client *c, const rn_bwd_args *a, void *cuda_stream)
{
    return bwd_call(c, a, cuda_stream, RNP_MODE_ASYNC, NULL);
}

int rn_rmsnorm_bwd_sync(rn_client *c, const rn_bwd_args *a, void *cuda_stream, rn_timing *t)
{
    return bwd_call(c, a, cuda_stream, RNP_MODE_SYNC, t);
}
