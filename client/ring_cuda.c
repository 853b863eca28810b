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
 * rmsnormd --cuda-fast-path=no).
 *
 * A stream being captured into a CUDA graph (PROTOCOL.md 13.8): ring.c
 * gives the call a graph slot, and this captures a one-thread kernel that
 * starts a replay (done = 0, then gen + 1, with system-scope fences, and
 * done = 1 instead if the slot is closed) and the wait for done >= 1.  The
 * kernel is PTX, loaded at run time (cudaLibraryLoadData, once per
 * process), so that libclient holds no device code of nvcc's and builds
 * where no GPU is.  The slot is freed when CUDA destroys the graph (a user
 * object whose destructor ring.c gives).
 *
 * The driver is reached through cudaGetDriverEntryPointByVersion, as in
 * client_cuda.c: no libcuda link of our own.
 */
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "client_int.h"
#include "rn_check.h"
#include "rn_ring.h"

/*
 * The replay's start, for the graph slot at `slot` (PROTOCOL.md 13.8), one
 * thread.  The words are in host memory both processes map, so every
 * access is system scope.  Dekker with the daemon (and ring.c's
 * graph_let_go), which stores closed and then reads gen: this stores gen
 * and then reads closed, with a full fence between, so either the daemon
 * sees the new gen (and answers it) or this sees closed (and sets done
 * itself); a replay never waits for an answer that does not come.  The
 * fence before gen orders the producer's work captured before it (ended
 * in stream order) and done = 0 before the daemon can see gen move.
 * sm_70: the first target with .sys scope and .relaxed/.release.
 */
static const char kick_ptx[] =
    ".version 6.0\n"
    ".target sm_70\n"
    ".address_size 64\n"
    ".visible .entry rn_graph_kick(.param .u64 slot)\n"
    "{\n"
    "    .reg .u64 %rd<8>;\n"
    "    .reg .u32 %r<3>;\n"
    "    .reg .pred %p<3>;\n"
    "    ld.param.u64 %rd1, [slot];\n"
    "    cvta.to.global.u64 %rd1, %rd1;\n"
    "    add.u64 %rd2, %rd1, 512;\n"   /* gen */
    "    add.u64 %rd3, %rd1, 576;\n"   /* done */
    "    add.u64 %rd4, %rd1, 640;\n"   /* closed */
    "    ld.relaxed.sys.global.u32 %r1, [%rd4];\n"
    "    setp.ne.u32 %p1, %r1, 0;\n"
    "    @%p1 bra CLOSED;\n"
    "    mov.u64 %rd5, 0;\n"
    "    st.relaxed.sys.global.u64 [%rd3], %rd5;\n"
    "    fence.sc.sys;\n"
    "    ld.relaxed.sys.global.u64 %rd6, [%rd2];\n"
    "    add.u64 %rd6, %rd6, 1;\n"
    "    st.relaxed.sys.global.u64 [%rd2], %rd6;\n"
    "    fence.sc.sys;\n"
    "    ld.relaxed.sys.global.u32 %r2, [%rd4];\n"
    "    setp.eq.u32 %p2, %r2, 0;\n"
    "    @%p2 bra END;\n"
    "CLOSED:\n"
    "    mov.u64 %rd7, 1;\n"
    "    st.release.sys.global.u64 [%rd3], %rd7;\n"
    "END:\n"
    "    ret;\n"
    "}\n";

typedef CUresult (*pfn_value64)(CUstream s, CUdeviceptr addr, cuuint64_t v, unsigned flags);
typedef CUresult (*pfn_stream_id)(CUstream s, unsigned long long *id);
typedef CUresult (*pfn_batch)(CUstream s, unsigned count, CUstreamBatchMemOpParams *ops,
                              unsigned flags);

typedef CUresult (*pfn_ctx_get)(CUcontext *ctx);
typedef CUresult (*pfn_ctx_set)(CUcontext ctx);

static pthread_once_t once = PTHREAD_ONCE_INIT;
static pfn_value64 wait64, write64;
static pfn_ctx_get ctx_get; /* (done_enter: the done context, the thread's put back) */
static pfn_ctx_set ctx_set;
static pfn_batch batch; /* (without it: two writes) */
static pfn_stream_id get_id; /* (CUDA 12.0 on; without it the handle serves) */

static void resolve(void)
{
    if (!rn_cuda_entry_to("cuStreamWaitValue64", (void **)&wait64) ||
        !rn_cuda_entry_to("cuStreamWriteValue64", (void **)&write64))
        wait64 = write64 = NULL;
    if (!rn_cuda_entry_to("cuStreamGetId", (void **)&get_id))
        get_id = NULL;
    if (!rn_cuda_entry_to("cuStreamBatchMemOp", (void **)&batch))
        batch = NULL;
    if (!rn_cuda_entry_to("cuCtxGetCurrent", (void **)&ctx_get) ||
        !rn_cuda_entry_to("cuCtxSetCurrent", (void **)&ctx_set))
        ctx_get = NULL, ctx_set = NULL;
}

/* The stream's id, unique among the context's streams for the process's
 * life (the legacy and the per-thread default streams included), or 0. */
static uint64_t stream_id(void *stream)
{
    unsigned long long id = 0;

    pthread_once(&once, resolve);
    if (!get_id || get_id((CUstream)stream, &id) != CUDA_SUCCESS)
        return 0;
    return (uint64_t)id;
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

/*
 * Where the caller's stream waits for done: by default on a done word of
 * the ring's own in device memory (RING_OPEN's done_region), which the
 * daemon writes with the ring's word (its kernel just before it, its
 * stream just after it: PROTOCOL.md 13.2); RMSNORMD_DONE_WORD=host at
 * rn_connect: on the ring's word in host memory.  Eight processes
 * under MPS saw a stream's wait on a word in host memory late by 8-61 ms
 * now and then, and never on device memory, which also took 2-5 us off a
 * call's GPU time (bench/RESULTS.md).  When the session is lost (the
 * watcher, ring.c's lost()) the word is raised on a stream of the
 * client's own (done_raise).
 */
#define DONE_BUF_BYTES (2u << 20) /* its own allocation block: 262 144 opens */

/* Any thread: make the context the done words were made in current (the
 * device's primary context where it could not be told), the thread's own
 * in *was to put back (done_leave).  The thread's context is put back as
 * it was, which on the watcher's thread is none: setting the device back
 * (cudaGetDevice says 0 on a thread that never chose one) made device 0's
 * primary context there, hundreds of MiB on GPU 0 in every process of a
 * multi-GPU job after a daemon restart (found in review).  And the done
 * context, not the device's primary one: a client of cuCtxCreate's made
 * its stream and words in a context of its own, where the primary context's
 * writes failed and its streams waited for good. */
static bool done_enter(rn_client *c, CUcontext *was, bool *saved, enum cudaStreamCaptureMode *cm)
{
    pthread_once(&once, resolve);
    /* Relaxed: a stream another thread of the process captures in the
     * global mode is not invalidated by this thread's copy and sync. */
    *cm = cudaStreamCaptureModeRelaxed;
    if (cudaThreadExchangeStreamCaptureMode(cm) != cudaSuccess) {
        (void)cudaGetLastError();
        *cm = cudaStreamCaptureModeRelaxed;
    }
    *saved = ctx_get && ctx_set && ctx_get(was) == CUDA_SUCCESS;
    if (c->done_ctx && ctx_set)
        return ctx_set((CUcontext)c->done_ctx) == CUDA_SUCCESS;
    return cudaSetDevice(c->done_device) == cudaSuccess;
}

static void done_leave(CUcontext was, bool saved, enum cudaStreamCaptureMode cm)
{
    if (saved && ctx_set(was) != CUDA_SUCCESS)
        (void)cudaGetLastError();
    if (cudaThreadExchangeStreamCaptureMode(&cm) != cudaSuccess)
        (void)cudaGetLastError();
}

static void done_free(rn_client *c)
{
    CUcontext was = NULL;
    enum cudaStreamCaptureMode cm;
    bool saved;

    if (done_enter(c, &was, &saved, &cm)) {
        if (c->done_stream && cudaStreamDestroy((cudaStream_t)c->done_stream) != cudaSuccess)
            (void)cudaGetLastError();
        if (c->done_buf && cudaFree(c->done_buf) != cudaSuccess)
            (void)cudaGetLastError();
    } else {
        (void)cudaGetLastError(); /* (its context gone: its memory went with it) */
    }
    done_leave(was, saved, cm);
    c->done_buf = c->done_stream = c->done_ctx = NULL;
    c->done_next = 0;
    c->done_free = NULL;
    c->done_raise = NULL;
    c->done_read = NULL;
}

/* Any thread (the watcher's): *addr = seq on the client's own stream, which
 * waits on nothing, so that a stream waiting on the word moves on.  A plain
 * store, not the host word's maximum: a daemon that wrote after this (one
 * silent past the watcher's linger that came back) could lower it again. */
static void done_raise(rn_client *c, uint64_t addr, uint64_t seq)
{
    CUcontext was = NULL;
    enum cudaStreamCaptureMode cm;
    bool saved;

    if (!done_enter(c, &was, &saved, &cm) ||
        write64((CUstream)c->done_stream, (CUdeviceptr)addr, seq, CU_STREAM_WRITE_VALUE_DEFAULT) !=
            CUDA_SUCCESS)
        (void)cudaGetLastError(); /* (a failed device: the streams fail with it) */
    done_leave(was, saved, cm);
}

/* Any thread (the watcher's): the word at addr, read on the client's own
 * stream. */
static int done_read(rn_client *c, uint64_t addr, uint64_t *v)
{
    CUcontext was = NULL;
    enum cudaStreamCaptureMode cm;
    bool saved;
    int rc = -1;

    if (done_enter(c, &was, &saved, &cm) &&
        cudaMemcpyAsync(v, (const void *)(uintptr_t)addr, sizeof *v, cudaMemcpyDeviceToHost,
                        (cudaStream_t)c->done_stream) == cudaSuccess &&
        cudaStreamSynchronize((cudaStream_t)c->done_stream) == cudaSuccess)
        rc = 0;
    else
        (void)cudaGetLastError();
    done_leave(was, saved, cm);
    return rc;
}

static int done_word(rn_client *c, void **p)
{
    rn_fault f;

    *p = NULL;
    if (c->done_host)
        return 0;
    if (!c->done_buf) {
        void *buf = NULL;
        cudaStream_t st = NULL;
        RN_CUDA_GOTO(cudaGetDevice(&c->done_device), &f, fail);
        RN_CUDA_GOTO(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), &f, fail);
        /* The context the stream (and the words) are made in: the thread's
         * current one, the primary context unless the caller made another
         * current (cuCtxCreate). */
        CUcontext ctx = NULL;
        pthread_once(&once, resolve);
        c->done_ctx = ctx_get && ctx_get(&ctx) == CUDA_SUCCESS ? (void *)ctx : NULL;
        if (cudaMalloc(&buf, DONE_BUF_BYTES) != cudaSuccess) {
            (void)cudaGetLastError();
            (void)cudaStreamDestroy(st);
            return rnc_fail(c, RN_CUDA, "ring: no device memory for done words");
        }
        /* Zero before any stream can wait on it (on the word's own stream,
         * which no capture involves). */
        if (cudaMemsetAsync(buf, 0, DONE_BUF_BYTES, st) != cudaSuccess ||
            cudaStreamSynchronize(st) != cudaSuccess) {
            (void)cudaGetLastError();
            (void)cudaFree(buf);
            (void)cudaStreamDestroy(st);
            return rnc_fail(c, RN_CUDA, "ring: zeroing the done words failed");
        }
        c->done_buf = buf;
        c->done_stream = st;
        c->done_next = 0;
        c->done_free = done_free;
        c->done_raise = done_raise;
        c->done_read = done_read;
    }
    if (c->done_next >= DONE_BUF_BYTES / 8)
        return 0; /* (all used: the ring's word) */
    *p = (uint8_t *)c->done_buf + 8u * c->done_next++;
    return 0;
fail:
    return rnc_fail(c, RN_CUDA, "ring: device memory for done words: %s", f.why);
}

static int write_ready(rn_client *c, void *stream, uint64_t addr, uint64_t seq)
{
    CUresult r;

    /* (A stream being captured takes a graph slot instead: ring.c.) */
    r = write64((CUstream)stream, (CUdeviceptr)addr, seq, CU_STREAM_WRITE_VALUE_DEFAULT);
    if (r != CUDA_SUCCESS)
        return rnc_fail(c, RN_CUDA, "ring: cuStreamWriteValue64 (ready): CUDA driver error %d",
                        (int)r);
    return 0;
}

/* ready, then go (ring.c), in one call: each write with its memory
 * barrier, so that go is seen after ready.  RN_UNSUPPORTED, nothing queued,
 * where the driver does not batch (ring.c then writes them one by one). */
static int write_ready_go(rn_client *c, void *stream, uint64_t addr, uint64_t addr2, uint64_t seq)
{
    CUstreamBatchMemOpParams ops[2];
    CUresult r;

    if (!batch)
        return RN_UNSUPPORTED;
    memset(ops, 0, sizeof ops);
    for (int i = 0; i < 2; i++) {
        ops[i].writeValue.operation = CU_STREAM_MEM_OP_WRITE_VALUE_64;
        ops[i].writeValue.address = (CUdeviceptr)(i ? addr2 : addr);
        ops[i].writeValue.value64 = seq;
        ops[i].writeValue.flags = CU_STREAM_WRITE_VALUE_DEFAULT;
    }
    r = batch((CUstream)stream, 2, ops, 0);
    if (r != CUDA_SUCCESS)
        return rnc_fail(c, RN_CUDA, "ring: cuStreamBatchMemOp (ready, go): CUDA driver error %d",
                        (int)r);
    return 0;
}

static pthread_mutex_t kick_mu = PTHREAD_MUTEX_INITIALIZER;
static cudaLibrary_t kick_lib;
static cudaKernel_t kick_fn;

static int captured(rn_client *c, void *stream)
{
    enum cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;

    if (cudaStreamIsCapturing((cudaStream_t)stream, &cap) != cudaSuccess) {
        (void)cudaGetLastError();
        return -rnc_fail(c, RN_CUDA, "ring: cudaStreamIsCapturing failed on the stream");
    }
    if (cap == cudaStreamCaptureStatusInvalidated)
        return -rnc_fail(c, RN_CUDA, "graph: the stream's capture was invalidated (by an "
                         "earlier error); end it and capture again");
    return cap == cudaStreamCaptureStatusActive;
}

/* The kick kernel, loaded once (a context-independent library). */
static int load_kick(rn_client *c)
{
    rn_fault f;

    pthread_mutex_lock(&kick_mu);
    if (!kick_fn) {
        RN_CUDA_GOTO(cudaLibraryLoadData(&kick_lib, kick_ptx, NULL, NULL, 0, NULL, NULL, 0), &f,
                     fail);
        RN_CUDA_GOTO(cudaLibraryGetKernel(&kick_fn, kick_lib, "rn_graph_kick"), &f, fail);
    }
    pthread_mutex_unlock(&kick_mu);
    return 0;
fail:
    pthread_mutex_unlock(&kick_mu);
    return rnc_fail(c, RN_CUDA, "graph: loading the replay kernel (PTX, sm_70 or later): %s",
                    f.why);
}

static int graph(rn_client *c, void *stream, uint64_t addr, void (*gone)(void *), void *arg,
                 bool *queued)
{
    enum cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    cudaGraph_t gr = NULL;
    cudaUserObject_t obj = NULL;
    dim3 one = {1, 1, 1};
    void *args[] = {&addr};
    const char *what;
    rn_fault f;
    CUresult r;
    int rv;

    *queued = false;
    if ((rv = load_kick(c)) != 0)
        return rv;
    what = "cudaLaunchKernel (the replay's start)";
    RN_CUDA_GOTO(cudaLaunchKernel((const void *)kick_fn, one, one, args, 0, (cudaStream_t)stream),
                 &f, fail);
    *queued = true;
    r = wait64((CUstream)stream, (CUdeviceptr)(addr + RNP_GSLOT_O_DONE), 1,
               CU_STREAM_WAIT_VALUE_GEQ);
    if (r != CUDA_SUCCESS)
        return rnc_fail(c, RN_CUDA,
                        "graph: cuStreamWaitValue64 (done) in the capture: CUDA driver error %d "
                        "(stream memory operations are captured from CUDA 11.7 on)", (int)r);
    /* The graph being built holds the slot: its destructor gives it back. */
    what = "cudaStreamGetCaptureInfo";
#if CUDART_VERSION >= 13000
    RN_CUDA_GOTO(cudaStreamGetCaptureInfo((cudaStream_t)stream, &cs, NULL, &gr, NULL, NULL, NULL),
                 &f, fail);
#else
    RN_CUDA_GOTO(cudaStreamGetCaptureInfo((cudaStream_t)stream, &cs, NULL, &gr, NULL, NULL), &f,
                 fail);
#endif
    if (cs != cudaStreamCaptureStatusActive || !gr)
        return rnc_fail(c, RN_CUDA, "graph: the stream's capture ended during the call");
    what = "cudaUserObjectCreate";
    RN_CUDA_GOTO(cudaUserObjectCreate(&obj, arg, gone, 1, cudaUserObjectNoDestructorSync), &f,
                 fail);
    what = "cudaGraphRetainUserObject";
    RN_CUDA_GOTO(cudaGraphRetainUserObject(gr, obj, 1, cudaGraphUserObjectMove), &f, fail_obj);
    return 0;
fail_obj:
    /* Dropping our reference runs the destructor, which ring.c must not
     * see for a slot it keeps: the slot stays held by the captured nodes
     * (a leak of one slot, never a reuse under a live graph). */
    (void)cudaGetLastError();
    return rnc_fail(c, RN_CUDA, "graph: %s: %s", what, f.why);
fail:
    return rnc_fail(c, RN_CUDA, "graph: %s: %s", what, f.why);
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
    .write2 = write_ready_go,
    .wait = wait_done,
    .done_word = done_word,
    .captured = captured,
    .graph = graph,
    .stream_id = stream_id,
};
