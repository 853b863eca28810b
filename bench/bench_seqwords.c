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
 * Usage: bench_seqwords [--iters N] [--spin-us U] [--wide-us W [--wide-blocks B]]
 *                       [--out FILE]
 * Prints one line per mode (p50, p90, p99 and max of each hop, in us; the
 * table keeps p50-p99; with --wide-us the spans and their difference) and
 * appends them to FILE as a markdown table.  Run with and without MPS.
 */
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gpu/e2e_cuda.h"
#include "bench_util.h"

#define CK(call) RNE_CK(call)

typedef CUresult (*pfn_value64)(CUstream s, CUdeviceptr addr, cuuint64_t v, unsigned flags);
static pfn_value64 wait64, write64;

enum mode { M_HOST, M_DEVICE, M_EVENT, M_COUNT };
static const char *mode_name[M_COUNT] = {"host words", "device words", "IPC events"};

static void resolve(void)
{
    enum cudaDriverEntryPointQueryResult q;
    CK(cudaGetDriverEntryPointByVersion("cuStreamWaitValue64", (void **)&wait64, 12000,
                                        cudaEnableDefault, &q));
    CK(cudaGetDriverEntryPointByVersion("cuStreamWriteValue64", (void **)&write64, 12000,
                                        cudaEnableDefault, &q));
    if (!wait64 || !write64) {
        fprintf(stderr, "no stream memory operations\n");
        exit(1);
    }
}

static void xwrite(int fd, const void *p, size_t n)
{
    if (write(fd, p, n) != (ssize_t)n) {
        perror("write");
        exit(1);
    }
}
static void xread(int fd, void *p, size_t n)
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

static void value(pfn_value64 fn, cudaStream_t s, CUdeviceptr a, uint64_t v, unsigned flags)
{
    CUresult r = fn((CUstream)s, a, v, flags);
    if (r != CUDA_SUCCESS) {
        fprintf(stderr, "stream memory operation failed: %d\n", (int)r);
        exit(1);
    }
}

/* Words at byte 0 (ready) and 256 (done) of a shared area. */
#define W_READY 0
#define W_DONE 256

/* --wide-us (0: off) and --wide-blocks. */
static uint64_t wide_ns;
static unsigned wide_blocks = 1056;

/* A kernel as wide as a real one, wide_ns long. */
static void wide(const rne_kernels *k, cudaStream_t s)
{
    CK(rne_spin_grid(k, wide_ns, wide_blocks, 128, s));
}

/* The daemon's side of one mode: n iterations; stamps t1 into host memory
 * the parent reads (shared mapping `t1`). */
static void daemon_side(enum mode m, int n, int to_client, int from_client, uint8_t *host_words,
                        uint64_t *t1_shared)
{
    rne_kernels k;
    cudaStream_t s;
    uint64_t *t1;
    CUdeviceptr words = 0;
    void *dptr = NULL;

    CK(cudaSetDevice(0));
    resolve();
    CK(rne_load(&k));
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CK(cudaMalloc((void **)&t1, (size_t)n * sizeof *t1));
    if (m == M_HOST) {
        CK(cudaHostRegister(host_words, 4096, cudaHostRegisterMapped | cudaHostRegisterPortable));
        CK(cudaHostGetDevicePointer(&dptr, host_words, 0));
        words = (CUdeviceptr)(uintptr_t)dptr;
    } else if (m == M_DEVICE) {
        cudaIpcMemHandle_t h;
        CK(cudaMalloc(&dptr, 2u << 20));
        CK(cudaMemset(dptr, 0, 4096));
        CK(cudaDeviceSynchronize());
        CK(cudaIpcGetMemHandle(&h, dptr));
        xwrite(to_client, &h, sizeof h);
        words = (CUdeviceptr)(uintptr_t)dptr;
    }
    if (m != M_EVENT) {
        char go;
        xread(from_client, &go, 1);          /* the client has mapped the words */
        for (int i = 1; i <= n; i++) {
            value(wait64, s, words + W_READY, (uint64_t)i, CU_STREAM_WAIT_VALUE_GEQ);
            if (wide_ns)
                wide(&k, s);
            else
                CK(rne_stamp(&k, t1 + i - 1, s));
            value(write64, s, words + W_DONE, (uint64_t)i, CU_STREAM_WRITE_VALUE_DEFAULT);
        }
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
            xread(from_client, &go, 1);       /* the client recorded its event */
            CK(cudaStreamWaitEvent(s, cev, 0));
            if (wide_ns)
                wide(&k, s);
            else
                CK(rne_stamp(&k, t1 + i - 1, s));
            CK(cudaEventRecord(ev, s));
            xwrite(to_client, &go, 1);
        }
    }
    CK(cudaStreamSynchronize(s));
    CK(cudaMemcpy(t1_shared, t1, (size_t)n * sizeof *t1, cudaMemcpyDeviceToHost));
    if (m == M_HOST)
        CK(cudaHostUnregister(host_words));
    exit(0);
}

static double pct(uint64_t *v, int n, double p)
{
    qsort(v, (size_t)n, sizeof *v, cmp_u64);
    int i = (int)(p * (n - 1) + 0.5);
    return (double)v[i] / 1000.0;
}

typedef struct result { double h1[4], h2[4], stamp; } result;

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
    uint64_t *t1_shared = mmap(NULL, tbytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
                               -1, 0);
    if (host_words == MAP_FAILED || t1_shared == MAP_FAILED) {
        perror("mmap");
        exit(1);
    }
    memset(host_words, 0, 4096);
    result *shared = mmap(NULL, sizeof *shared, PROT_READ | PROT_WRITE,
                          MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (shared == MAP_FAILED) {
        perror("mmap");
        exit(1);
    }
    fflush(NULL);   /* nothing buffered is written twice by the children */
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
    CUdeviceptr words = 0;
    void *dptr = NULL;
    cudaEvent_t ev = NULL, dev_ev = NULL;

    CK(cudaSetDevice(0));
    resolve();
    CK(rne_load(&k));
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CK(cudaMalloc((void **)&t0, 3 * (size_t)n * sizeof *t0));
    t2 = t0 + n;
    uint64_t *base = t0 + 2 * n;
    if (m == M_HOST) {
        CK(cudaHostRegister(host_words, 4096, cudaHostRegisterMapped | cudaHostRegisterPortable));
        CK(cudaHostGetDevicePointer(&dptr, host_words, 0));
        words = (CUdeviceptr)(uintptr_t)dptr;
        xwrite(c2d[1], "g", 1);
    } else if (m == M_DEVICE) {
        cudaIpcMemHandle_t h;
        xread(d2c[0], &h, sizeof h);
        CK(cudaIpcOpenMemHandle(&dptr, h, cudaIpcMemLazyEnablePeerAccess));
        words = (CUdeviceptr)(uintptr_t)dptr;
        xwrite(c2d[1], "g", 1);
    } else {
        cudaIpcEventHandle_t h;
        xread(d2c[0], &h, sizeof h);
        CK(cudaIpcOpenEventHandle(&dev_ev, h));
        CK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming | cudaEventInterprocess));
        CK(cudaIpcGetEventHandle(&h, ev));
        xwrite(c2d[1], &h, sizeof h);
    }
    /* The stamp's own cost: two stamps back to back (--wide-us: the
     * in-process chain, two wide kernels between the stamps). */
    for (int i = 0; i < n; i++) {
        CK(rne_spin(&k, wide_ns ? spin_ns : 2000, s));
        CK(rne_stamp(&k, base + i, s));
        if (wide_ns) {
            wide(&k, s);
            wide(&k, s);
        }
        CK(rne_stamp(&k, t2 + i, s));
    }
    uint64_t *chain_in = NULL;
    CK(cudaStreamSynchronize(s));
    hb = malloc(2 * (size_t)n * sizeof *hb);
    CK(cudaMemcpy(hb, base, (size_t)n * sizeof *hb, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(hb + n, t2, (size_t)n * sizeof *hb, cudaMemcpyDeviceToHost));
    for (int i = 0; i < n; i++)
        hb[i] = hb[n + i] - hb[i];
    if (wide_ns) {
        chain_in = malloc((size_t)n * sizeof *chain_in);
        memcpy(chain_in, hb, (size_t)n * sizeof *chain_in);
    }
    res->stamp = wide_ns ? 0.0 : pct(hb, n, 0.5);

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
            value(write64, s, words + W_READY, (uint64_t)i, CU_STREAM_WRITE_VALUE_DEFAULT);
            value(wait64, s, words + W_DONE, (uint64_t)i, CU_STREAM_WAIT_VALUE_GEQ);
        }
        CK(rne_stamp(&k, t2 + i - 1, s));
        CK(cudaStreamSynchronize(s));
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
        if (wide_ns) { /* h1: the cross-process chain's span, h2: the in-process one */
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
    if (m == M_HOST)
        CK(cudaHostUnregister(host_words));
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
        else {
            fprintf(stderr, "usage: %s [--iters N] [--spin-us U] [--wide-us W [--wide-blocks B]] "
                            "[--out FILE]\n", argv[0]);
            return 2;
        }
    }
    if (n < 10) {
        fprintf(stderr, "--iters: at least 10\n");
        return 2;
    }
    /* No CUDA call before the forks: each process makes its own context. */
    const char *mps = getenv("CUDA_MPS_PIPE_DIRECTORY");
    printf("== bench_seqwords: one dependency client -> daemon (hop 1) and back (hop 2), %d "
           "iterations, producer spin %.0f us, %s ==\n",
           n, spin_us, mps ? "MPS pipe set" : "no MPS");
    FILE *f = out ? fopen(out, "a") : NULL;
    if (wide_ns) {
        printf("   wide: %u blocks of 128 threads, %.1f us each; spans of the chain stamp -> "
               "kernel -> kernel -> stamp\n", wide_blocks, (double)wide_ns / 1000.0);
        if (f)
            fprintf(f, "| means (%s), kernels of %u blocks x %.1f us | across processes p50 / p90 "
                       "/ p99 us | in-process p50 / p90 / p99 us | added p50 / p90 us |\n"
                       "|---|---|---|---|\n",
                    mps ? "MPS" : "no MPS", wide_blocks, (double)wide_ns / 1000.0);
    } else if (f) {
        fprintf(f, "| means (%s) | hop 1 p50 / p90 / p99 us | hop 2 p50 / p90 / p99 us "
                   "| stamp us |\n|---|---|---|---|\n", mps ? "MPS" : "no MPS");
    }
    for (int m = 0; m < M_COUNT; m++) {
        result r;
        run_mode((enum mode)m, n, (uint64_t)(spin_us * 1000.0), &r);
        if (wide_ns) {
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
               mode_name[m], r.h1[0], r.h1[1], r.h1[2], r.h1[3], r.h2[0], r.h2[1], r.h2[2],
               r.h2[3], r.stamp);
        fflush(stdout);
        if (f)
            fprintf(f, "| %s | %.2f / %.2f / %.2f | %.2f / %.2f / %.2f | %.2f |\n", mode_name[m],
                    r.h1[0], r.h1[1], r.h1[2], r.h2[0], r.h2[1], r.h2[2], r.stamp);
    }
    if (f)
        fclose(f);
    return 0;
}
