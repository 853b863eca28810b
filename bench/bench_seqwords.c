/* SPDX-License-Identifier: MIT */
/*
 * bench_seqwords.c - what one GPU-side dependency between two processes
 * costs, by the means the fast path could use (PROTOCOL.md section 13): a
 * 64-bit sequence word that one process's stream writes
 * (cuStreamWriteValue64) and the other's waits on (cuStreamWaitValue64,
 * GEQ), the word in host memory both processes registered with CUDA (a
 * memfd, cudaHostRegister) or in device memory one process allocated and
 * the other opened by its CUDA IPC memory handle; and, for comparison, the
 * classic path's CUDA IPC event (cudaEventRecord, cudaStreamWaitEvent).
 *
 * The parent is the client, a forked child the daemon.  Per iteration: the
 * client's stream spins (so that the daemon's side is already waiting),
 * stamps t0 (%globaltimer), signals; the daemon's stream waits, stamps t1,
 * signals back; the client's stream waits and stamps t2.  Hop 1 is t1 - t0,
 * hop 2 is t2 - t1, each minus the same two stamps back to back on one
 * stream (the stamp's own cost).  The words' waits are queued ahead, as the
 * daemon queues them; an event wait can only be queued after its record, so
 * the event mode hands each record over a pipe (the spin hides that).
 *
 * --wide-us W: the dependency between kernels as wide as a real one
 * instead (--wide-blocks B of 128 threads, default 1056 = 8 a SM of an H200,
 * each spinning W us): the client's stream stamps t0, runs one, writes
 * ready and waits for done, then stamps t2; the daemon's stream waits for
 * ready, runs one and writes done.  The same two kernels on one stream
 * between two stamps, in the client's process first, are the in-process
 * chain; what the two cross-process hops add to a chain of real kernels is
 * the difference of the two spans (what bench_e2e_cuda calls the GPU time
 * added, without any daemon).
 *
 * --rnk M,N: the daemon's kernel is the production one (rnk_cuda_bwd on a
 * problem of bench_problem.h in the daemon's own memory) instead of a wide
 * one, and the in-process chain runs the same kernel on the client's copy:
 * with no --wide-us this is bench_e2e_cuda's hop loop (one-thread producer
 * and consumer around the kernel) without the daemon.  --like-daemon: the
 * daemon's stream holds what rmsnormd's ring_submit queues (daemon/cuda/
 * submit.c): the wait, a timing event, the kernel reading a cancel word in
 * pinned host memory, both done words in one cuStreamBatchMemOp (the
 * ring's host word and the device word), a timing event.  The mode "fast
 * path words" is the fast path's layout: ready in the shared host memory,
 * done in device memory the client allocated and the daemon opened by its
 * CUDA IPC handle (RING_OPEN's done region).  Together they tell what of
 * bench_e2e_cuda's "GPU time added" the stream's contents explain;
 * --like-daemon-mask B takes them one by one (1 the events, 2 the cancel
 * word, 4 the batch; 8: the events without timing, 16: the cancel word in
 * device memory, 32: each completion event a blocking-sync one of its own,
 * which a thread waits on in order, as the daemon's completion threads do).
 * The two relays are the ways into the daemon's kernel that wait on the
 * host, not in the daemon's stream, on the fast path's words: "host relay"
 * is --ring-ready=host (a thread of the daemon spins on ready in host
 * memory, then queues the call: the launch follows ready), "armed relay"
 * queues each call ahead behind a wait on a word of the daemon's own in
 * pinned memory, which that thread sets once it saw ready (a daemon-owned
 * word: the daemon could release such a wait itself, so no stream of its
 * waits on a client for long).  Against "fast path words" (the stream waits
 * on the client's ready) they tell what the host's part of the hop costs.
 * (RN_ARMED_GO=stream: a stream of the daemon's writes the word instead of
 * the thread; RN_ARMED_WORD=alloc: the word in memory of cudaHostAlloc's,
 * not in the registered page beside ready; RN_RELAY_DEBUG=1: progress
 * lines.  The armed relay hung until the modules were loaded eagerly, as
 * below: a lazy load in the first launch waited for the stream that waits
 * on this thread's word; bench/RESULTS.md, 2026-12-05.)
 * --mode I: only mode I of host words, device words, fast path words, IPC
 * events, host relay, armed relay (0-5).  --ipc-inputs: the daemon's kernel works on the client's
 * tensors, opened by their CUDA IPC handle, as rmsnormd's does.  (Unlike
 * bench_e2e_cuda's hop loop, the client here waits for each call before
 * the next.)
 *
 * Usage: bench_seqwords [--iters N] [--spin-us U] [--wide-us W [--wide-blocks B]]
 *                       [--rnk M,N [--like-daemon | --like-daemon-mask B] [--ipc-inputs]]
 *                       [--mode I] [--out FILE]
 * Prints one line per mode (p50, p90, p99 and max of each hop, in us; the
 * table keeps p50-p99; with --wide-us the spans and their difference) and
 * appends them to FILE as a markdown table.  Run with and without MPS.
 */
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench_problem.h"
#include "bench_util.h"
#include "seqwords.h"

pfn_value64 wait64, write64;
pfn_batch batch;

const char *mode_name[M_COUNT] = {"host words", "device words", "fast path words",
                                         "IPC events", "host relay", "armed relay"};

void resolve(void)
{
    enum cudaDriverEntryPointQueryResult q;
    CK(cudaGetDriverEntryPointByVersion("cuStreamWaitValue64", (void **)&wait64, 12000,
                                        cudaEnableDefault, &q));
    CK(cudaGetDriverEntryPointByVersion("cuStreamWriteValue64", (void **)&write64, 12000,
                                        cudaEnableDefault, &q));
    CK(cudaGetDriverEntryPointByVersion("cuStreamBatchMemOp", (void **)&batch, 12000,
                                        cudaEnableDefault, &q));
    if (!wait64 || !write64 || !batch) {
        fprintf(stderr, "no stream memory operations\n");
        exit(1);
    }
}

void xwrite(int fd, const void *p, size_t n)
{
    if (write(fd, p, n) != (ssize_t)n) {
        perror("write");
        exit(1);
    }
}
void xread(int fd, void *p, size_t n)
{
    size_t got = 0;
    while (got < n) {
        ssize_t r = read(fd, (char *)p + got, n - got);
        if (r <= 0) {
            fprintf(stderr, "read: %s\n", r ? strerror(errno) : "end of pipe");
            exit(1);
        }
        got += (size_t)r;
    }
}

void value(pfn_value64 fn, cudaStream_t s, CUdeviceptr a, uint64_t v, unsigned flags)
{
    CUresult r = fn((CUstream)s, a, v, flags);
    if (r != CUDA_SUCCESS) {
        fprintf(stderr, "stream memory operation failed: %d\n", (int)r);
        exit(1);
    }
}

/* --wide-us (0: off) and --wide-blocks. */
uint64_t wide_ns;
unsigned wide_blocks = 1056;

/* A kernel as wide as a real one, wide_ns long. */
void wide(const rne_kernels *k, cudaStream_t s)
{
    CK(rne_spin_grid(k, wide_ns, wide_blocks, 128, s));
}

/* --rnk M,N (0: off), --like-daemon (LD_* bits) and --ipc-inputs. */
int64_t rnk_m, rnk_n;
int like_daemon, ipc_inputs;
static int only_mode = -1;

/* The problem in this process's memory (fd < 0), or, --ipc-inputs, the
 * client's (daemon: true), whose CUDA IPC handle goes over fd. */
void kjob_init(kjob *j, bool daemon, int fd)
{
    char msg[256];
    size_t bytes[BP_PARTS];
    char *base[BP_PARTS] = {NULL};
    cudaIpcMemHandle_t h;

    if (rnk_cuda_init(0, &j->dev, msg, sizeof msg) != 0) {
        fprintf(stderr, "rnk_cuda_init: %s\n", msg);
        exit(1);
    }
    bp_parts(rnk_m, rnk_n, 0, bytes);
    if (daemon && ipc_inputs) { /* as the daemon maps a client's tensors */
        xread(fd, &h, sizeof h);
        CK(cudaIpcOpenMemHandle((void **)&base[0], h, cudaIpcMemLazyEnablePeerAccess));
    } else {
        CK(cudaMalloc((void **)&base[0], bytes[0]));
    }
    j->wsb = rnk_cuda_workspace_size(j->dev, rnk_m, rnk_n);
    CK(cudaMalloc(&j->ws, j->wsb));
    CK(cudaMemset(j->ws, 0, j->wsb));
    bp_place(&j->a, base, rnk_m, rnk_n, 0);
    if (!(daemon && ipc_inputs) && bp_fill(&j->a, 11, NULL, msg, sizeof msg) != 0) {
        fprintf(stderr, "inputs: %s\n", msg);
        exit(1);
    }
    if (!daemon && ipc_inputs) {
        CK(cudaDeviceSynchronize());
        CK(cudaIpcGetMemHandle(&h, base[0]));
        xwrite(fd, &h, sizeof h);
    }
    if (daemon && (like_daemon & LD_CANCEL) && (like_daemon & LD_CANCEL_DEV)) {
        CK(cudaMalloc((void **)&j->a.cancel, 64));
        CK(cudaMemset((void *)j->a.cancel, 0, 64));
    } else if (daemon && (like_daemon & LD_CANCEL)) {
        void *d;
        CK(cudaHostAlloc((void **)&j->cancel_host, 64, cudaHostAllocMapped));
        *j->cancel_host = 0;
        CK(cudaHostGetDevicePointer(&d, j->cancel_host, 0));
        j->a.cancel = d;
    }
    CK(cudaDeviceSynchronize());
}

void kjob_run(const kjob *j, cudaStream_t s)
{
    char msg[256];
    if (rnk_cuda_bwd(j->dev, &j->a, j->ws, j->wsb, s, msg, sizeof msg) != 0) {
        fprintf(stderr, "rnk_cuda_bwd: %s\n", msg);
        exit(1);
    }
}

/* Spans, not hops: a chain of kernels on each side (--wide-us, --rnk). */
int spans(void)
{
    return wide_ns || rnk_m;
}

static double pct(uint64_t *v, int n, double p)
{
    qsort(v, (size_t)n, sizeof *v, cmp_u64);
    int i = (int)(p * (n - 1) + 0.5);
    return (double)v[i] / 1000.0;
}

typedef struct result {
    double h1[4], h2[4], stamp;
} result;

static void run_mode(enum mode m, int n, uint64_t spin_ns, result *res)
{
    int c2d[2], d2c[2];
    size_t tbytes = ((size_t)n * sizeof(uint64_t) + 4095) & ~(size_t)4095;
    int fd = (int)syscall(SYS_memfd_create, "seqwords", 0u);
    if (fd < 0 || ftruncate(fd, 4096) != 0 || pipe(c2d) || pipe(d2c)) {
        perror("setup");
        exit(1);
    }
    uint8_t *host_words = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    uint64_t *t1_shared =
        mmap(NULL, tbytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (host_words == MAP_FAILED || t1_shared == MAP_FAILED) {
        perror("mmap");
        exit(1);
    }
    memset(host_words, 0, 4096);
    result *shared =
        mmap(NULL, sizeof *shared, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (shared == MAP_FAILED) {
        perror("mmap");
        exit(1);
    }
    fflush(NULL); /* nothing buffered is written twice by the children */
    pid_t pid = fork();
    if (pid == 0) {
        close(c2d[1]);
        close(d2c[0]);
        daemon_side(m, n, d2c[1], c2d[0], host_words, t1_shared);
    }
    close(c2d[0]);
    close(d2c[1]);
    /* The client in a child of its own too: this process never touches
     * CUDA, so that every mode forks from a process without a context. */
    pid_t cpid = fork();
    if (cpid != 0) {
        int cst = 0, dst = 0;
        waitpid(cpid, &cst, 0);
        waitpid(pid, &dst, 0);
        if (!WIFEXITED(cst) || WEXITSTATUS(cst) != 0 || !WIFEXITED(dst) || WEXITSTATUS(dst) != 0) {
            fprintf(stderr, "%s: a side failed (client status %d, daemon status %d)\n",
                    mode_name[m], cst, dst);
            exit(1);
        }
        *res = *shared;
        munmap(shared, sizeof *shared);
        munmap(host_words, 4096);
        munmap(t1_shared, tbytes);
        close(fd);
        close(c2d[1]);
        close(d2c[0]);
        return;
    }
    res = shared;

    rne_kernels k;
    cudaStream_t s;
    uint64_t *t0, *t2, *h0, *h2, *hb;
    CUdeviceptr ready = 0, done = 0;
    void *dptr = NULL, *own = NULL;
    cudaEvent_t ev = NULL, dev_ev = NULL;
    kjob kj;

    CK(cudaSetDevice(0));
    resolve();
    CK(rne_load(&k));
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CK(cudaMalloc((void **)&t0, 3 * (size_t)n * sizeof *t0));
    t2 = t0 + n;
    uint64_t *base = t0 + 2 * n;
    if (rnk_m)
        kjob_init(&kj, false, c2d[1]);
    if (m == M_HOST || fast_words(m)) {
        CK(cudaHostRegister(host_words, 4096, cudaHostRegisterMapped | cudaHostRegisterPortable));
        CK(cudaHostGetDevicePointer(&dptr, host_words, 0));
        ready = done = (CUdeviceptr)(uintptr_t)dptr;
    }
    if (fast_words(m)) { /* the done word in this process's device memory */
        cudaIpcMemHandle_t h;
        CK(cudaMalloc(&own, 2u << 20));
        CK(cudaMemset(own, 0, 4096));
        CK(cudaDeviceSynchronize());
        CK(cudaIpcGetMemHandle(&h, own));
        xwrite(c2d[1], &h, sizeof h);
        done = (CUdeviceptr)(uintptr_t)own;
    }
    if (m == M_HOST || fast_words(m)) {
        xwrite(c2d[1], "g", 1);
    } else if (m == M_DEVICE) {
        cudaIpcMemHandle_t h;
        xread(d2c[0], &h, sizeof h);
        CK(cudaIpcOpenMemHandle(&dptr, h, cudaIpcMemLazyEnablePeerAccess));
        ready = done = (CUdeviceptr)(uintptr_t)dptr;
        xwrite(c2d[1], "g", 1);
    } else {
        cudaIpcEventHandle_t h;
        xread(d2c[0], &h, sizeof h);
        CK(cudaIpcOpenEventHandle(&dev_ev, h));
        CK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming | cudaEventInterprocess));
        CK(cudaIpcGetEventHandle(&h, ev));
        xwrite(c2d[1], &h, sizeof h);
    }
    /* The stamp's own cost: two stamps back to back (spans: the in-process
     * chain, the client's kernel and the daemon's between the stamps). */
    for (int i = 0; i < n; i++) {
        CK(rne_spin(&k, spans() ? spin_ns : 2000, s));
        CK(rne_stamp(&k, base + i, s));
        if (wide_ns)
            wide(&k, s);
        if (rnk_m)
            kjob_run(&kj, s);
        else if (wide_ns)
            wide(&k, s);
        CK(rne_stamp(&k, t2 + i, s));
    }
    uint64_t *chain_in = NULL;
    CK(cudaStreamSynchronize(s));
    hb = malloc(2 * (size_t)n * sizeof *hb);
    CK(cudaMemcpy(hb, base, (size_t)n * sizeof *hb, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(hb + n, t2, (size_t)n * sizeof *hb, cudaMemcpyDeviceToHost));
    for (int i = 0; i < n; i++)
        hb[i] = hb[n + i] - hb[i];
    if (spans()) {
        chain_in = malloc((size_t)n * sizeof *chain_in);
        memcpy(chain_in, hb, (size_t)n * sizeof *chain_in);
    }
    res->stamp = spans() ? 0.0 : pct(hb, n, 0.5);

    for (int i = 1; i <= n; i++) {
        CK(rne_spin(&k, spin_ns, s));
        CK(rne_stamp(&k, t0 + i - 1, s));
        if (wide_ns)
            wide(&k, s);
        if (m == M_EVENT) {
            char go = 'g';
            CK(cudaEventRecord(ev, s));
            xwrite(c2d[1], &go, 1);
            xread(d2c[0], &go, 1);
            CK(cudaStreamWaitEvent(s, dev_ev, 0));
        } else {
            value(write64, s, ready + W_READY, (uint64_t)i, CU_STREAM_WRITE_VALUE_DEFAULT);
            value(wait64, s, done + W_DONE, (uint64_t)i, CU_STREAM_WAIT_VALUE_GEQ);
        }
        CK(rne_stamp(&k, t2 + i - 1, s));
        if (getenv("RN_RELAY_DEBUG") && i <= 3)
            fprintf(stderr, "client: call %d queued, syncing\n", i);
        CK(cudaStreamSynchronize(s));
        if (getenv("RN_RELAY_DEBUG") && i <= 3)
            fprintf(stderr, "client: call %d done\n", i);
    }
    /* The daemon's stamps are in t1_shared once it exits. */
    close(c2d[1]);
    char eof;
    while (read(d2c[0], &eof, 1) > 0)
        ;
    h0 = malloc((size_t)n * sizeof *h0);
    h2 = malloc((size_t)n * sizeof *h2);
    CK(cudaMemcpy(h0, t0, (size_t)n * sizeof *h0, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(h2, t2, (size_t)n * sizeof *h2, cudaMemcpyDeviceToHost));
    uint64_t *a = malloc((size_t)n * sizeof *a), *b = malloc((size_t)n * sizeof *b);
    uint64_t stamp_ns = (uint64_t)(res->stamp * 1000.0);
    for (int i = 0; i < n; i++) {
        uint64_t x = t1_shared[i] - h0[i], y = h2[i] - t1_shared[i];
        a[i] = x > stamp_ns ? x - stamp_ns : 0;
        b[i] = y > stamp_ns ? y - stamp_ns : 0;
        if (spans()) { /* h1: the cross-process chain's span, h2: the in-process one */
            a[i] = h2[i] - h0[i];
            b[i] = chain_in[i];
        }
    }
    const double ps[4] = {0.5, 0.9, 0.99, 1.0};
    for (int j = 0; j < 4; j++) {
        res->h1[j] = pct(a, n, ps[j]);
        res->h2[j] = pct(b, n, ps[j]);
    }
    if (m == M_DEVICE)
        CK(cudaIpcCloseMemHandle(dptr));
    if (m == M_HOST || fast_words(m))
        CK(cudaHostUnregister(host_words));
    if (own)
        CK(cudaFree(own));
    if (ev)
        CK(cudaEventDestroy(ev));
    CK(cudaStreamDestroy(s));
    CK(cudaFree(t0));
    free(a);
    free(b);
    free(h0);
    free(h2);
    free(hb);
    free(chain_in);
    exit(0);
}

int main(int argc, char **argv)
{
    int n = 500;
    double spin_us = 100;
    const char *out = NULL;

    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--iters") && i + 1 < argc)
            n = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--spin-us") && i + 1 < argc)
            spin_us = atof(argv[++i]);
        else if (!strcmp(argv[i], "--out") && i + 1 < argc)
            out = argv[++i];
        else if (!strcmp(argv[i], "--wide-us") && i + 1 < argc)
            wide_ns = (uint64_t)(atof(argv[++i]) * 1000.0);
        else if (!strcmp(argv[i], "--wide-blocks") && i + 1 < argc)
            wide_blocks = (unsigned)atoi(argv[++i]);
        else if (!strcmp(argv[i], "--rnk") && i + 1 < argc &&
                 sscanf(argv[i + 1], "%" SCNd64 ",%" SCNd64, &rnk_m, &rnk_n) == 2 && rnk_m > 0 &&
                 rnk_n > 0)
            i++;
        else if (!strcmp(argv[i], "--like-daemon"))
            like_daemon = LD_ALL;
        else if (!strcmp(argv[i], "--like-daemon-mask") && i + 1 < argc)
            like_daemon = atoi(argv[++i]) & (LD_ALL | LD_UNTIMED | LD_CANCEL_DEV | LD_BLOCKING);
        else if (!strcmp(argv[i], "--mode") && i + 1 < argc)
            only_mode = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--ipc-inputs"))
            ipc_inputs = 1;
        else {
            fprintf(stderr,
                    "usage: %s [--iters N] [--spin-us U] [--wide-us W [--wide-blocks B]] "
                    "[--rnk M,N [--like-daemon | --like-daemon-mask B] [--ipc-inputs]] [--mode I] "
                    "[--out FILE]\n",
                    argv[0]);
            return 2;
        }
    }
    if ((like_daemon || ipc_inputs) && !rnk_m) {
        fprintf(stderr, "--like-daemon, --ipc-inputs: with --rnk M,N\n");
        return 2;
    }
    if (n < 10) {
        fprintf(stderr, "--iters: at least 10\n");
        return 2;
    }
    /* No CUDA call before the forks: each process makes its own context.
     * Its modules load when the context is made, as rmsnormd's do (main.c):
     * with lazy loading the armed relay's first launch waited for its own
     * stream, blocked on the word only this thread sets, for good. */
    setenv("CUDA_MODULE_LOADING", "EAGER", 1);
    const char *mps = getenv("CUDA_MPS_PIPE_DIRECTORY");
    printf("== bench_seqwords: one dependency client -> daemon (hop 1) and back (hop 2), %d "
           "iterations, producer spin %.0f us, %s ==\n",
           n, spin_us, mps ? "MPS pipe set" : "no MPS");
    FILE *f = out ? fopen(out, "a") : NULL;
    char what[160];
    int w = snprintf(what, sizeof what, "%s", wide_ns ? "" : "one-thread producer, ");
    if (wide_ns)
        w += snprintf(what + w, sizeof what - (size_t)w, "kernels of %u blocks x %.1f us, ",
                      wide_blocks, (double)wide_ns / 1000.0);
    if (rnk_m)
        snprintf(
            what + w, sizeof what - (size_t)w, "rnk %" PRId64 "x%" PRId64 "%s%s%s%s%s%s, ", rnk_m,
            rnk_n, like_daemon ? " like the daemon:" : "",
            like_daemon & LD_EVENTS ? (like_daemon & LD_UNTIMED ? " untimed events" : " events")
                                    : "",
            like_daemon & LD_CANCEL ? (like_daemon & LD_CANCEL_DEV ? " cancel (device)" : " cancel")
                                    : "",
            like_daemon & LD_BATCH ? " batch" : "",
            like_daemon & LD_BLOCKING ? " blocking completion" : "",
            ipc_inputs ? ", inputs by IPC" : "");
    if (spans()) {
        printf("   %sspans of the chain stamp -> kernel -> kernel -> stamp\n", what);
        if (f)
            fprintf(f,
                    "| means (%s), %s | across processes p50 / p90 "
                    "/ p99 us | in-process p50 / p90 / p99 us | added p50 / p90 us |\n"
                    "|---|---|---|---|\n",
                    mps ? "MPS" : "no MPS", what);
    } else if (f) {
        fprintf(f,
                "| means (%s) | hop 1 p50 / p90 / p99 us | hop 2 p50 / p90 / p99 us "
                "| stamp us |\n|---|---|---|---|\n",
                mps ? "MPS" : "no MPS");
    }
    for (int m = 0; m < M_COUNT; m++) {
        result r;
        if (only_mode >= 0 && m != only_mode)
            continue;
        run_mode((enum mode)m, n, (uint64_t)(spin_us * 1000.0), &r);
        if (spans()) {
            printf("mode=\"%s\" cross_p50_us=%.2f cross_p90_us=%.2f cross_p99_us=%.2f "
                   "inproc_p50_us=%.2f inproc_p90_us=%.2f inproc_p99_us=%.2f added_p50_us=%.2f "
                   "added_p90_us=%.2f\n",
                   mode_name[m], r.h1[0], r.h1[1], r.h1[2], r.h2[0], r.h2[1], r.h2[2],
                   r.h1[0] - r.h2[0], r.h1[1] - r.h2[1]);
            fflush(stdout);
            if (f)
                fprintf(f, "| %s | %.2f / %.2f / %.2f | %.2f / %.2f / %.2f | %.2f / %.2f |\n",
                        mode_name[m], r.h1[0], r.h1[1], r.h1[2], r.h2[0], r.h2[1], r.h2[2],
                        r.h1[0] - r.h2[0], r.h1[1] - r.h2[1]);
            continue;
        }
        printf("mode=\"%s\" hop1_p50_us=%.2f hop1_p90_us=%.2f hop1_p99_us=%.2f hop1_max_us=%.1f "
               "hop2_p50_us=%.2f hop2_p90_us=%.2f hop2_p99_us=%.2f hop2_max_us=%.1f "
               "stamp_us=%.2f\n",
               mode_name[m], r.h1[0], r.h1[1], r.h1[2], r.h1[3], r.h2[0], r.h2[1], r.h2[2], r.h2[3],
               r.stamp);
        fflush(stdout);
        if (f)
            fprintf(f, "| %s | %.2f / %.2f / %.2f | %.2f / %.2f / %.2f | %.2f |\n", mode_name[m],
                    r.h1[0], r.h1[1], r.h1[2], r.h2[0], r.h2[1], r.h2[2], r.stamp);
    }
    if (f)
        fclose(f);
    return 0;
}
