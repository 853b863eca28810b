/* SPDX-License-Identifier: MIT */
/*
 * seqwords_daemon.c - bench_seqwords' daemon side: in a child process, the
 * waits, the work and the done writes of each mode (bench_seqwords.c's top
 * says what each mode is), queued on one stream as rmsnormd queues them.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench_util.h"
#include "seqwords.h"

/* --like-daemon-mask 32: the daemon's completion thread, waiting on each
 * job's completion event in order (cudaEventSynchronize, blocking sync). */
typedef struct waiter {
    cudaEvent_t *ev;
    int n;
} waiter;

static void *waiter_main(void *arg)
{
    const waiter *w = arg;
    CK(cudaSetDevice(0));
    for (int i = 0; i < w->n; i++)
        CK(cudaEventSynchronize(w->ev[i]));
    return NULL;
}

/* The daemon's side of one call on s: the production kernel (--rnk), a wide
 * one (--wide-us), or else the stamp t1. */
static void daemon_work(const kjob *kj, const rne_kernels *k, uint64_t *t1, cudaStream_t s)
{
    if (rnk_m)
        kjob_run(kj, s);
    else if (wide_ns)
        wide(k, s);
    else
        CK(rne_stamp(k, t1, s));
}

/* What the daemon queues for one call, and where. */
typedef struct dq {
    cudaStream_t s;
    const kjob *kj;
    const rne_kernels *k;
    uint64_t *t1;                  /* its stamps (device memory) */
    CUdeviceptr host_dev, done;    /* the host words, the done word */
    cudaEvent_t ev0, ev1;
    waiter *wt;
    pthread_t *wth;
} dq;

/* Call i on q's stream: a wait for *wait >= i (wait 0: none), the daemon's
 * work, done = i (--like-daemon: with its events, cancel word, batch). */
static void queue_call(const dq *q, int i, CUdeviceptr wait)
{
    if (wait)
        value(wait64, q->s, wait, (uint64_t)i, CU_STREAM_WAIT_VALUE_GEQ);
    if (like_daemon & LD_EVENTS)
        CK(cudaEventRecord(q->ev0, q->s));
    daemon_work(q->kj, q->k, q->t1 + i - 1, q->s);
    if (like_daemon & LD_BATCH) {
        /* the ring's word (host) and the done word, one batch */
        CUstreamBatchMemOpParams ops[2];
        memset(ops, 0, sizeof ops);
        ops[0].writeValue.operation = CU_STREAM_MEM_OP_WRITE_VALUE_64;
        ops[0].writeValue.address = q->host_dev + W_DONE + 64;
        ops[0].writeValue.value64 = (uint64_t)i;
        ops[0].writeValue.flags = CU_STREAM_WRITE_VALUE_DEFAULT;
        ops[1] = ops[0];
        ops[1].writeValue.address = q->done + W_DONE;
        CUresult r = batch((CUstream)q->s, 2, ops, 0);
        if (r != CUDA_SUCCESS) {
            fprintf(stderr, "cuStreamBatchMemOp: %d\n", (int)r);
            exit(1);
        }
    } else {
        value(write64, q->s, q->done + W_DONE, (uint64_t)i, CU_STREAM_WRITE_VALUE_DEFAULT);
    }
    if (like_daemon & LD_BLOCKING)
        CK(cudaEventRecord(q->wt->ev[i - 1], q->s));
    else if (like_daemon & LD_EVENTS)
        CK(cudaEventRecord(q->ev1, q->s));
    if ((like_daemon & LD_BLOCKING) && i == 1 &&
        pthread_create(q->wth, NULL, waiter_main, q->wt) != 0) {
        fprintf(stderr, "pthread_create failed\n");
        exit(1);
    }
}

/* The daemon's side of one mode: n iterations; stamps t1 into host memory
 * the parent reads (shared mapping `t1`). */
void daemon_side(enum mode m, int n, int to_client, int from_client, uint8_t *host_words,
                        uint64_t *t1_shared)
{
    rne_kernels k;
    cudaStream_t s;
    uint64_t *t1;
    CUdeviceptr ready = 0, done = 0, host_dev = 0;
    void *dptr = NULL;
    kjob kj;
    cudaEvent_t ev0, ev1;

    CK(cudaSetDevice(0));
    resolve();
    CK(rne_load(&k));
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CK(cudaMalloc((void **)&t1, (size_t)n * sizeof *t1));
    CK(cudaEventCreateWithFlags(&ev0, like_daemon & LD_UNTIMED ? cudaEventDisableTiming : 0));
    CK(cudaEventCreateWithFlags(&ev1, like_daemon & LD_UNTIMED ? cudaEventDisableTiming : 0));
    waiter wt = {NULL, n};
    pthread_t wth;
    if (like_daemon & LD_BLOCKING) {
        wt.ev = malloc((size_t)n * sizeof *wt.ev);
        for (int i = 0; i < n; i++)
            CK(cudaEventCreateWithFlags(&wt.ev[i], cudaEventDisableTiming | cudaEventBlockingSync));
    }
    if (rnk_m)
        kjob_init(&kj, true, from_client);
    if (m == M_HOST || fast_words(m) || (like_daemon & LD_BATCH)) {
        CK(cudaHostRegister(host_words, 4096, cudaHostRegisterMapped | cudaHostRegisterPortable));
        CK(cudaHostGetDevicePointer(&dptr, host_words, 0));
        host_dev = (CUdeviceptr)(uintptr_t)dptr;
        ready = done = host_dev;
    }
    if (m == M_DEVICE) {
        cudaIpcMemHandle_t h;
        CK(cudaMalloc(&dptr, 2u << 20));
        CK(cudaMemset(dptr, 0, 4096));
        CK(cudaDeviceSynchronize());
        CK(cudaIpcGetMemHandle(&h, dptr));
        xwrite(to_client, &h, sizeof h);
        ready = done = (CUdeviceptr)(uintptr_t)dptr;
    } else if (fast_words(m)) {
        cudaIpcMemHandle_t h; /* the client's device word */
        xread(from_client, &h, sizeof h);
        CK(cudaIpcOpenMemHandle(&dptr, h, cudaIpcMemLazyEnablePeerAccess));
        done = (CUdeviceptr)(uintptr_t)dptr;
    }
    dq q = {s, &kj, &k, t1, host_dev, done, ev0, ev1, &wt, &wth};
    if (m == M_RELAY || m == M_ARMED) {
        /* The daemon's thread sees ready in host memory and then launches
         * (host relay: --ring-ready=host), or releases a call queued ahead
         * behind a word of its own in pinned memory (armed relay). */
        const uint64_t *rd = (const uint64_t *)(host_words + W_READY);
        uint64_t *go = NULL;
        CUdeviceptr go_dev = 0;
        bool go_alloc = false;
        if (m == M_ARMED) {
            /* The word in the registered page beside ready (a memfd, as the
             * fast path's words are: waits on such memory are known to
             * work), or (RN_ARMED_WORD=alloc) in memory of cudaHostAlloc's,
             * as the cancel words are. */
            const char *aw = getenv("RN_ARMED_WORD");
            go_alloc = aw && !strcmp(aw, "alloc");
            if (go_alloc) {
                void *d;
                CK(cudaHostAlloc((void **)&go, 64, cudaHostAllocMapped | cudaHostAllocPortable));
                CK(cudaHostGetDevicePointer(&d, go, 0));
                go_dev = (CUdeviceptr)(uintptr_t)d;
            } else {
                go = (uint64_t *)(host_words + W_GO);
                go_dev = host_dev + W_GO;
            }
            *go = 0;
        }
        cudaStream_t go_stream = NULL;
        const char *gs = getenv("RN_ARMED_GO");
        if (m == M_ARMED && gs && !strcmp(gs, "stream"))
            CK(cudaStreamCreateWithFlags(&go_stream, cudaStreamNonBlocking));
        char g;
        xread(from_client, &g, 1); /* the client has mapped the words */
        int dbg = getenv("RN_RELAY_DEBUG") != NULL;
        if (dbg)
            fprintf(stderr, "daemon: got g, queueing call 1 (go_dev %llx)\n", (unsigned long long)go_dev);
        if (m == M_ARMED)
            queue_call(&q, 1, go_dev);
        if (dbg)
            fprintf(stderr, "daemon: call 1 queued\n");
        for (int i = 1; i <= n; i++) {
            uint64_t t0 = now_ns();
            if (dbg && i <= 3)
                fprintf(stderr, "daemon: waiting for ready %d (now %llu)\n", i,
                        (unsigned long long)__atomic_load_n(rd, __ATOMIC_ACQUIRE));
            while (__atomic_load_n(rd, __ATOMIC_ACQUIRE) < (uint64_t)i)
                if (now_ns() - t0 > 10000000000ull) {
                    fprintf(stderr, "%s: ready %d did not come within 10 s\n", mode_name[m], i);
                    exit(1);
                }
            if (m == M_ARMED && go_stream) {
                /* RN_ARMED_GO=stream: the word written by a stream of the
                 * daemon's instead of the CPU's store */
                value(write64, go_stream, go_dev, (uint64_t)i, CU_STREAM_WRITE_VALUE_DEFAULT);
                if (i < n)
                    queue_call(&q, i + 1, go_dev);
            } else if (m == M_ARMED) {
                __atomic_store_n(go, (uint64_t)i, __ATOMIC_RELEASE);
                if (dbg && i <= 3)
                    fprintf(stderr, "daemon: go = %d written\n", i);
                if (i < n)
                    queue_call(&q, i + 1, go_dev); /* the next call, armed at once */
            } else {
                queue_call(&q, i, 0);
            }
        }
        CK(cudaStreamSynchronize(s));
        if (go_alloc)
            CK(cudaFreeHost(go));
    } else if (m != M_EVENT) {
        char go;
        xread(from_client, &go, 1); /* the client has mapped the words */
        for (int i = 1; i <= n; i++)
            queue_call(&q, i, ready + W_READY);
    } else {
        cudaEvent_t ev;
        cudaIpcEventHandle_t h;
        CK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming | cudaEventInterprocess));
        CK(cudaIpcGetEventHandle(&h, ev));
        xwrite(to_client, &h, sizeof h);
        cudaIpcEventHandle_t ch;
        cudaEvent_t cev;
        xread(from_client, &ch, sizeof ch);
        CK(cudaIpcOpenEventHandle(&cev, ch));
        for (int i = 1; i <= n; i++) {
            char go;
            xread(from_client, &go, 1); /* the client recorded its event */
            CK(cudaStreamWaitEvent(s, cev, 0));
            daemon_work(&kj, &k, t1 + i - 1, s);
            CK(cudaEventRecord(ev, s));
            xwrite(to_client, &go, 1);
        }
    }
    CK(cudaStreamSynchronize(s));
    if (like_daemon & LD_BLOCKING)
        pthread_join(wth, NULL);
    CK(cudaMemcpy(t1_shared, t1, (size_t)n * sizeof *t1, cudaMemcpyDeviceToHost));
    if (fast_words(m))
        CK(cudaIpcCloseMemHandle(dptr));
    if (host_dev)
        CK(cudaHostUnregister(host_words));
    exit(0);
}
