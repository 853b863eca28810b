/* SPDX-License-Identifier: MIT */
/*
 * ring.c - the cuda backend's half of the fast path (PROTOCOL.md section
 * 13; backend.h, rnd_ring_job).  On unless the daemon runs with
 * --cuda-fast-path=no, where the device has 64-bit stream memory operations.
 *
 * The ring's memory: a memfd the client passed on the session channel
 * (REGISTER_FD), mapped here and registered with CUDA (cudaHostRegister,
 * mapped), so that a stream can wait on and write the ring's words through
 * their device address.  Such a region holds a ring only: a tensor in it is
 * refused (the kernel wants device memory).
 *
 * A ring job on the session's stream, after the session's earlier work
 * (submit.c, ring_submit):
 *   valid slot    the host writes status 0 into the slot; the stream waits
 *                 for ready >= seq (cuStreamWaitValue64, GEQ; not with
 *                 --ring-ready=host, where the loop takes only ready slots),
 *                 records the start event, runs the kernel, writes done =
 *                 seq: the kernel's last block writes the done words
 *                 (rnk_bwd_args.done: the client's word, released at the
 *                 GPU's scope, then the ring's, at the system's), and the
 *                 stream writes
 *                 nothing after it (1-2 us less GPU time a call than the
 *                 stream's writes, bench/RESULTS.md); with m = 0, or
 *                 RMSNORMD_DEBUG_KERNEL_DONE=0, the stream writes them
 *                 (with its memory barrier: the outputs and the status are
 *                 visible before done; both words in one
 *                 cuStreamBatchMemOp); the start and completion events
 *                 (timing, one job in RND_CUDA_TIME_EVERY) give
 *                 fast.compute;
 *   invalid slot  the host writes status and message into the slot; the
 *                 stream writes done = seq after the previous job, without
 *                 waiting for ready and without a kernel;
 *   a launch that fails after the wait was queued: as an invalid slot (the
 *                 host writes the error, the stream writes done after the
 *                 wait).
 * The slot is the client's to read only once done reached it, so the host
 * may write the status before the stream writes done.  The completion event
 * follows done; at completion (complete.c) the loop wakes the client's
 * threads that sleep on done (the GPU's write rings no futex).  On a
 * failure of the device the failure path answers the ring jobs left from
 * the host: status, then done (rnd_cuda_ring_answer_host).
 *
 * A client that died: its jobs are cancelled, but their waits for ready are
 * on the stream already and its producer will never write ready.  The watch
 * (and the end of the session) write ready = seq into the daemon's own
 * mapping of the ring, so that the stream moves on; the kernels of those
 * jobs then find their session's cancel word (rnk_bwd_args.cancel) set,
 * which the watch sets before ready, and skip their work; the kernel reads it once per launch (one block reads
 * it and publishes it to the others through the workspace) and, when set,
 * touches no tensor.  Every block reading it cost 140-430 us per launch; the
 * read once per launch costs 1.5-2 us of GPU time a call, its trip over the
 * bus before the blocks start (bench/RESULTS.md), and it is on
 * (RMSNORMD_DEBUG_CANCEL_WORD=0 turns it off).  The words live
 * in pinned host memory the daemon alone writes, with plain stores: setting
 * one needs no stream, so nothing can queue it behind the very wait it is
 * meant to release.  An abandoned slot (the drain, the end of a live
 * client's session) runs once its producer writes ready.
 */
#include "cuda_int.h"

#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "log.h"
#include "ring_io.h"
#include "stats.h"

typedef CUresult (*pfn_dev_get)(CUdevice *d, int ordinal);
typedef CUresult (*pfn_dev_attr)(int *v, CUdevice_attribute a, CUdevice d);

/* A ring's memory: a descriptor region mapped and registered with CUDA
 * (rnd_mapping.handle, on b->hostmaps). */
typedef struct rnd_cuda_hostmap {
    void *host;
    size_t len;                    /* mapped and registered bytes (whole pages) */
    CUdeviceptr dev;               /* host's device address */
    rn_queue link;
    rnd_cuda_release rel;          /* once released: to the closer */
} rnd_cuda_hostmap;

static void *entry(const char *name, char *why, size_t len)
{
    void *fn = rn_cuda_entry(name);
    if (!fn && !why[0])
        snprintf(why, len, "the driver has no %s", name);
    return fn;
}

void rnd_cuda_ring_probe(rnd_cuda *b, bool want)
{
    char why[160] = "";
    pfn_dev_get dev_get;
    pfn_dev_attr dev_attr;
    CUdevice d = 0;
    int mem64 = 0, hostreg = 0;

    if (!want)
        return;
    dev_get = (pfn_dev_get)entry("cuDeviceGet", why, sizeof why);
    dev_attr = (pfn_dev_attr)entry("cuDeviceGetAttribute", why, sizeof why);
    b->wait64 = (rnd_cuda_wait64_fn)entry("cuStreamWaitValue64", why, sizeof why);
    b->write64 = (rnd_cuda_write64_fn)entry("cuStreamWriteValue64", why, sizeof why);
    b->batch = (rnd_cuda_batch_fn)rn_cuda_entry("cuStreamBatchMemOp"); /* (else two writes) */
    if (!why[0] && dev_get(&d, b->dev) != CUDA_SUCCESS)
        snprintf(why, sizeof why, "cuDeviceGet(%d) failed", b->dev);
    if (!why[0] &&
        (dev_attr(&mem64, CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS, d) != CUDA_SUCCESS ||
         dev_attr(&hostreg, CU_DEVICE_ATTRIBUTE_HOST_REGISTER_SUPPORTED, d) != CUDA_SUCCESS))
        snprintf(why, sizeof why, "cuDeviceGetAttribute failed");
    if (!why[0] && !mem64)
        snprintf(why, sizeof why,
                 "device %d has no 64-bit stream memory operations "
                 "(CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS is 0)", b->dev);
    if (!why[0] && !hostreg)
        snprintf(why, sizeof why, "device %d cannot register host memory", b->dev);
    if (why[0]) {
        rnd_warn("cuda-fast-path: %s; the fast path stays off (HELLO offers the classic path "
                 "only)", why);
        return;
    }
    void *words = NULL, *dev = NULL;
    if (cudaHostAlloc(&words, RND_CUDA_CANCEL_WORDS * sizeof(unsigned),
                      cudaHostAllocMapped | cudaHostAllocPortable) != cudaSuccess ||
        cudaHostGetDevicePointer(&dev, words, 0) != cudaSuccess ||
        !(b->cancel_used = calloc(RND_CUDA_CANCEL_WORDS, 1))) {
        (void)cudaGetLastError();
        if (words)
            cudaFreeHost(words);
        rnd_warn("cuda-fast-path: no pinned memory for the cancel words; the fast path stays "
                 "off (HELLO offers the classic path only)");
        return;
    }
    memset(words, 0, RND_CUDA_CANCEL_WORDS * sizeof(unsigned));
    b->cancel_host = words;
    /* On unless RMSNORMD_DEBUG_CANCEL_WORD=0: one read of a word in host
     * memory per launch, 1.5-2 us of GPU time a call (bench/RESULTS.md). */
    const char *cw = getenv("RMSNORMD_DEBUG_CANCEL_WORD");
    b->cancel_words = !(cw && !strcmp(cw, "0"));
    if (!b->cancel_words)
        rnd_warn("RMSNORMD_DEBUG_CANCEL_WORD=0: a dead client's pending kernels run on memory "
                 "the daemon still maps instead of being skipped");
    /* On unless RMSNORMD_DEBUG_KERNEL_DONE=0: the kernel's last block writes
     * the done words, in place of the stream's writes after it (1-2 us of
     * GPU time a call less, bench/RESULTS.md). */
    const char *kd = getenv("RMSNORMD_DEBUG_KERNEL_DONE");
    b->kernel_done = !(kd && !strcmp(kd, "0"));
    if (!b->kernel_done)
        rnd_warn("RMSNORMD_DEBUG_KERNEL_DONE=0: the stream writes the done words after the "
                 "kernel");
    /* Off unless RMSNORMD_DEBUG_LEAN_START=1 (not yet measured on a GPU):
     * a ring job taken once its ready word had come (or a graph replay)
     * and not timed records no start event, one CUDA call less before its
     * kernel's launch (1-2.5 us of the loop's, bench_submit). */
    const char *ls = getenv("RMSNORMD_DEBUG_LEAN_START");
    b->lean_start = ls && !strcmp(ls, "1");
    if (b->lean_start)
        rnd_info("RMSNORMD_DEBUG_LEAN_START=1: no start event for ring jobs that wait for "
                 "nothing");
    /* Off unless RMSNORMD_DEBUG_GATE_READY=1 (a measurement): an unarmed
     * ring job's kernel also reads the ring's ready word as its gate, in
     * the cancel word's trip (always open: the job waited for the word, or
     * was taken once it had come), which is what a kernel gated on the
     * client's own ready word would cost. */
    const char *gr = getenv("RMSNORMD_DEBUG_GATE_READY");
    b->gate_ready = gr && !strcmp(gr, "1");
    if (b->gate_ready)
        rnd_info("RMSNORMD_DEBUG_GATE_READY=1: ring kernels read the ready word as their gate");
    b->cancel_dev = (CUdeviceptr)(uintptr_t)dev;
    b->rings = true;
    b->done_words = true;
    rnd_info("The cuda backend offers the fast path (PROTOCOL.md section 13; "
             "--cuda-fast-path=no turns it off)");
}

static rnd_cuda_hostmap *hostmap_of(rnd_cuda *b, const void *handle)
{
    rn_queue *q;
    RN_QUEUE_FOREACH(q, &b->hostmaps) {
        rnd_cuda_hostmap *h = RN_QUEUE_DATA(q, rnd_cuda_hostmap, link);
        if (h == handle)
            return h;
    }
    return NULL;
}

CUdeviceptr rnd_cuda_ring_dev_addr(rnd_cuda *b, const void *p)
{
    rn_queue *q;
    RN_QUEUE_FOREACH(q, &b->hostmaps) {
        rnd_cuda_hostmap *h = RN_QUEUE_DATA(q, rnd_cuda_hostmap, link);
        uintptr_t lo = (uintptr_t)h->host;
        if ((uintptr_t)p >= lo && (uintptr_t)p - lo < h->len)
            return h->dev + ((uintptr_t)p - lo);
    }
    return 0;
}

int rnd_cuda_region_open_fd(rnd_backend *be, void *bsess, int fd, uint64_t size,
                            rnd_mapping *out, rnp_error *err)
{
    rnd_cuda *b = (rnd_cuda *)be;
    long page = sysconf(_SC_PAGESIZE);
    rnd_cuda_hostmap *h;
    struct stat st;
    void *dev = NULL;
    size_t len;
    rn_fault f;

    (void)bsess;
    if (!b->rings)
        return rnp_fail(err, RN_UNSUPPORTED,
                        "register_fd: the cuda backend maps CUDA IPC handles (REGISTER kind 2) "
                        "only");
    if (b->failed)
        return rnd_cuda_failed_err(b, err, "register_fd");
    if (size == 0 || size > SIZE_MAX - (size_t)page)
        return rnp_fail(err, RN_INVALID_ARGUMENT, "register_fd.size: %llu",
                        (unsigned long long)size);
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))
        return rnp_fail(err, RN_INVALID_ARGUMENT,
                        "register_fd: not a regular file (a memfd holding a ring)");
    if ((uint64_t)st.st_size < size)
        return rnp_fail(err, RN_INVALID_ARGUMENT, "register_fd.size: %llu bytes, the object has "
                        "%lld", (unsigned long long)size, (long long)st.st_size);
    /* The doorbell thread reads the ring from this mapping: a file its
     * client could cut would fault the daemon (SIGBUS). */
    int seals = fcntl(fd, F_GET_SEALS);
    if (seals < 0 || !(seals & F_SEAL_SHRINK))
        return rnp_fail(err, RN_INVALID_ARGUMENT,
                        "register_fd: the memfd is not sealed against shrinking (F_SEAL_SHRINK; "
                        "libclient seals its rings)");
    if (!(h = calloc(1, sizeof *h)))
        return rnp_fail(err, RN_NOMEM, "register_fd: out of memory");
    len = ((size_t)size + (size_t)page - 1) / (size_t)page * (size_t)page;
    h->host = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (h->host == MAP_FAILED) {
        free(h);
        return rnp_fail(err, RN_SYSTEM, "register_fd: mmap: %s", strerror(errno));
    }
    h->len = len;
    RN_CUDA_GOTO(cudaHostRegister(h->host, len, cudaHostRegisterMapped | cudaHostRegisterPortable),
                 &f, fail);
    RN_CUDA_GOTO(cudaHostGetDevicePointer(&dev, h->host, 0), &f, fail_registered);
    h->dev = (CUdeviceptr)(uintptr_t)dev;
    rn_queue_push_back(&b->hostmaps, &h->link);
    out->base = h->host;
    out->size = size;
    out->handle = h;
    return 0;
fail_registered:
    (void)cudaHostUnregister(h->host);
    (void)cudaGetLastError();
fail:
    munmap(h->host, len);
    free(h);
    return rnd_cuda_fault(b, &f, false, err, "register_fd: registering the ring with CUDA");
}

/* On the closer thread (or the loop's, at fini): no job uses the memory. */
static void hostmap_close(rnd_cuda_release *r)
{
    rnd_cuda_hostmap *h = RN_QUEUE_DATA(r, rnd_cuda_hostmap, rel);

    if (cudaHostUnregister(h->host) != cudaSuccess)
        (void)cudaGetLastError(); /* (nothing to do about it: the memory is dropped) */
    munmap(h->host, h->len);
    free(h);
}

static void hostmap_free(rnd_cuda *b, rnd_cuda_hostmap *h)
{
    rn_queue_remove(&h->link);
    /* A failed device may still hold it: left to the process exit. */
    if (!b->failed)
        hostmap_close(&h->rel);
}

int rnd_cuda_device_word(rnd_backend *be, const rnd_mapping *m, uint64_t off, void **out,
                         rnp_error *err)
{
    rnd_cuda *b = (rnd_cuda *)be;

    if (!b->done_words)
        return rnp_fail(err, RN_UNSUPPORTED, "ring_open.done_region: the fast path is off");
    /* A stream write to host memory not registered with CUDA would fail
     * the device: only a client's device memory (REGISTER, CUDA IPC or VMM). */
    if (hostmap_of(b, m->handle))
        return rnp_fail(err, RN_INVALID_ARGUMENT,
                        "ring_open.done_region: its region is host memory; the done word must "
                        "be in device memory (REGISTER of a CUDA IPC handle)");
    *out = (uint8_t *)m->base + off;
    return 0;
}

void rnd_cuda_region_close_any(rnd_backend *be, void *bsess, rnd_mapping *m)
{
    rnd_cuda *b = (rnd_cuda *)be;
    rnd_cuda_hostmap *h = b->rings ? hostmap_of(b, m->handle) : NULL;

    /* No job uses m (backend.h): the ring's last job wrote done and
     * completed before its region was released.  Unregistering may wait
     * for the device, as closing an IPC mapping does (mapcache.c): it goes
     * to the closer thread with those (closer.c). */
    if (h) {
        rn_queue_remove(&h->link);
        m->handle = NULL;
        h->rel.close = hostmap_close;
        h->rel.what = "a ring's host memory";
        h->rel.bytes = h->len;
        rnd_cuda_release_later(b, bsess, &h->rel);
    } else {
        rnd_cuda_region_close(be, bsess, m);
    }
}

void rnd_cuda_ring_flush_released(rnd_cuda *b)
{
    rnd_cuda_flush_unmaps(b);
}

/* (The released rings' memory was closed with the IPC mappings,
 * rnd_cuda_close_unmaps.) */
void rnd_cuda_ring_fini(rnd_cuda *b)
{
    rn_queue *q;
    while (b->rings && (q = rn_queue_head(&b->hostmaps)) != NULL)
        hostmap_free(b, RN_QUEUE_DATA(q, rnd_cuda_hostmap, link));
    if (b->cancel_host && !b->failed)
        cudaFreeHost(b->cancel_host);
    b->cancel_host = NULL;
    free(b->cancel_used);
    b->cancel_used = NULL;
    if (b->arm_host && !b->failed)
        cudaFreeHost(b->arm_host);
    b->arm_host = NULL;
    free(b->arm_used);
    b->arm_used = NULL;
}

const unsigned *rnd_cuda_cancel_word(rnd_cuda *b, rnd_cuda_sess *cs)
{
    static bool warned;

    if (cs->cancel < 0) {
        for (int i = 0; i < RND_CUDA_CANCEL_WORDS; i++)
            if (!b->cancel_used[i]) {
                b->cancel_used[i] = 1;
                __atomic_store_n(&b->cancel_host[i], 0u, __ATOMIC_RELEASE);
                cs->cancel = i;
                break;
            }
        if (cs->cancel < 0) {
            if (!warned)
                rnd_warn("All %d cancel words are taken: ring jobs of newer sessions run without "
                         "one (their kernels would run if their client died)",
                         RND_CUDA_CANCEL_WORDS);
            warned = true;
            return NULL;
        }
    }
    return (const unsigned *)(uintptr_t)(b->cancel_dev + (CUdeviceptr)cs->cancel * sizeof(unsigned));
}

uint64_t *rnd_cuda_arm_open(rnd_backend *be)
{
    rnd_cuda *b = (rnd_cuda *)be;
    void *words = NULL, *dev = NULL;

    if (!b->rings || !b->kernel_done || b->failed)
        return NULL;
    if (!b->arm_host) {
        /* (Each ring's latch, which its armed kernels read with the cancel
         * word and set when their gate is shut: backend.h.) */
        size_t bytes = RND_CUDA_CANCEL_WORDS * 2 * sizeof(uint64_t);
        bool ok = cudaHostAlloc(&words, bytes, cudaHostAllocMapped | cudaHostAllocPortable) ==
                      cudaSuccess &&
                  cudaHostGetDevicePointer(&dev, words, 0) == cudaSuccess &&
                  (b->arm_used = calloc(RND_CUDA_CANCEL_WORDS, 1)) != NULL;
        if (!ok) {
            (void)cudaGetLastError();
            if (words)
                cudaFreeHost(words);
            free(b->arm_used);
            b->arm_used = NULL;
            rnd_warn("No armed calls (no pinned memory for their words): rings run in host mode");
            return NULL;
        }
        memset(words, 0, bytes);
        b->arm_host = words;
        b->arm_dev = (CUdeviceptr)(uintptr_t)dev;
    }
    for (int i = 0; i < RND_CUDA_CANCEL_WORDS; i++)
        if (!b->arm_used[i]) {
            b->arm_used[i] = 1;
            uint64_t *w = b->arm_host + 2 * i;
            __atomic_store_n(&w[1], 0, __ATOMIC_RELAXED);
            __atomic_store_n(&w[0], 0, __ATOMIC_RELEASE);
            return w;
        }
    return NULL;
}

void rnd_cuda_arm_close(rnd_backend *be, uint64_t *words)
{
    rnd_cuda *b = (rnd_cuda *)be;

    if (words && b->arm_used)
        b->arm_used[(words - b->arm_host) / 2] = 0;
}

CUdeviceptr rnd_cuda_arm_dev(const rnd_cuda *b, const uint64_t *words, int which)
{
    return b->arm_dev + (CUdeviceptr)((words - b->arm_host) + which) * sizeof(uint64_t);
}

void rnd_cuda_cancel_release(rnd_cuda *b, rnd_cuda_sess *cs)
{
    if (cs->cancel >= 0 && b->cancel_used)
        b->cancel_used[cs->cancel] = 0;
    cs->cancel = -1;
}

int rnd_cuda_host_tensors(rnd_cuda *b, const rnd_job *job, rnp_error *err)
{
    static const char *names[RNP_T_COUNT] = {"x", "dy", "dx", "w", "rstd", "dres", "dw"};

    for (int t = 0; t < RNP_T_COUNT; t++)
        if (job->maps[t] && hostmap_of(b, job->maps[t]->handle))
            return rnp_fail(err, RN_INVALID_ARGUMENT,
                            "bwd.%s: its region is host memory registered for a ring; tensors "
                            "must be device memory (REGISTER of a CUDA IPC handle)",
                            t < RNP_T_COUNT && names[t] ? names[t] : "tensor");
    return 0;
}

/* done = seq into the daemon's mapping of the ring, if it is not there yet,
 * with status and message first; then a wake-up of the client's sleepers.
 * A ring's done only moves up: a later job's kernel may write it between
 * this load and the store (the client's ready went back: ring_arm.c), so
 * the store is a compare-and-swap that gives way to a later seq. */
void rnd_cuda_ring_answer_host(rnd_job *job)
{
    rnd_ring_job *rj = job->ring;
    uint64_t *done = rnd_ring_done_word(rj);

    if (atomic_load(&job->cancelled) || rnd_ring_taken_back(rj))
        return; /* (a job taken back answers nothing: its slot is taken again) */
    uint64_t cur = __atomic_load_n(done, __ATOMIC_ACQUIRE);
    if (!rj->graph && rnp_seq_reached(cur, rj->seq)) {
        rnd_cuda_ring_wake(job);
        return;
    }
    rnd_ring_put(rj, job->status, job->msg);
    if (rj->graph)
        __atomic_store_n(done, rnd_ring_done_value(rj), __ATOMIC_RELEASE);
    else
        while (!rnp_seq_reached(cur, rj->seq) &&
               !__atomic_compare_exchange_n(done, &cur, rj->seq, false, __ATOMIC_RELEASE,
                                            __ATOMIC_ACQUIRE))
            ;
    rnd_cuda_ring_wake(job);
}

void rnd_cuda_ring_wake(rnd_job *job)
{
    rnd_ring_job *rj = job->ring;

    if (atomic_load(&job->cancelled) || rj->graph)
        return; /* (a graph slot's done: a stream waits on it, no thread) */
    /* Pairs with the client's increment of waiters before it reads done. */
    atomic_thread_fence(memory_order_seq_cst);
    if (__atomic_load_n(rnp_ring_u32(rj->ring, RNP_RING_O_WAITERS), __ATOMIC_SEQ_CST))
        rnd_ring_wake(rj->ring, RNP_RING_O_DONE);
}

void rnd_cuda_ring_release_cancelled(rnd_cuda *b)
{
    rn_queue *q;

    if (!b->rings)
        return;
    RN_QUEUE_FOREACH(q, &b->outstanding) {
        rnd_cuda_gjob *g = RN_QUEUE_DATA(q, rnd_cuda_gjob, link);
        rnd_job *job = g->job;
        if (!job || !job->ring || job->ring->graph || g->ready_forced ||
            !atomic_load(&job->cancelled))
            continue; /* (a graph slot's replay waits for nothing) */
        /* The session's cancel word first, whether or not this job's
         * ready came (a kernel queued behind others has not read it yet):
         * the session is over, nothing it runs from now on should touch its
         * memory.  Kernels read it only after their wait saw ready. */
        if (g->cs->cancel >= 0)
            __atomic_store_n(&b->cancel_host[g->cs->cancel], 1u, __ATOMIC_SEQ_CST);
        uint64_t *ready = rnp_ring_u64(job->ring->ring, RNP_RING_O_READY);
        uint64_t seen = rnp_ring_ready_seq(__atomic_load_n(ready, __ATOMIC_ACQUIRE));
        /* (An armed job's wait ends with the daemon's bit of the ready
         * word, which the end of its session sets and keeps set until it
         * ended: ring_arm.c's revocation.) */
        if (!job->ring->arm_key && !rnp_seq_reached(seen, job->ring->seq)) {
            /* Its status says it did not run as asked (a session can end
             * with its client alive: a channel that stopped reading), then
             * ready, so that the stream moves on. */
            rnp_ring_put_result(job->ring->slot, RN_RESTARTED,
                                "the session ended before the call's inputs were ready; its "
                                "outputs are undefined");
            __atomic_store_n(ready, job->ring->seq, __ATOMIC_SEQ_CST);
        }
        g->ready_forced = true;
    }
}
