/* SPDX-License-Identifier: MIT */
/*
 * bench_ipcmem.c - does the kernel run slower on another process's memory?
 * The daemon's kernel works on tensors it opened by CUDA IPC memory handle,
 * and at 32768x4096 it takes 6 % longer than the same launch in the client
 * (bench_e2e_cuda's "kernel" line).  This program times the same launch
 * (rnk_cuda_bwd, bf16 x/dy/dx/w, fp32 dw, rstd given, as bench_e2e_cuda)
 * four ways, in one process, interleaved in rounds:
 *
 *   local        on tensors this process allocated (cudaMalloc);
 *   imported     on the same layout allocated by a forked child process and
 *                opened here by its CUDA IPC memory handle (as the daemon);
 *   local+nb     local, each launch right after the child ran a one-thread
 *                kernel of its own and synchronised (as the daemon's kernel
 *                follows the client's producer; under MPS the two are
 *                different clients, without MPS a context switch);
 *   imported+nb  imported, the same.
 *
 * Each launch is timed alone (CUDA events around it, then synchronised), so
 * the times are the kernel's and not the host's.  Both sets of tensors hold
 * the same random data (the same seeds); after timing, dx and dw are poisoned,
 * computed once more from each set, and compared bit for bit (they must be
 * equal: same data, same alignment, same plan).
 *
 *   bench_ipcmem [--iters N] [--rounds R] [--shape M,N]... [--label TEXT] [--out FILE]
 * Prints one line per shape (median us of each way and the ratios to local)
 * and appends them to FILE as a markdown table.  Run with and without MPS.
 */
#include <cuda_runtime_api.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gpu/e2e_cuda.h"
#include "rnk.h"
#include "rnk_test.h"

#define CK(call) RNE_CK(call)

enum { W_LOCAL, W_IMPORTED, W_LOCAL_NB, W_IMPORTED_NB, W_COUNT };
static const char *way_name[W_COUNT] = {"local", "imported", "local+nb", "imported+nb"};

static void xio(int fd, void *p, size_t n, int wr)
{
    size_t done = 0;
    while (done < n) {
        ssize_t r = wr ? write(fd, (char *)p + done, n - done) : read(fd, (char *)p + done, n - done);
        if (r <= 0) {
            if (r < 0 && errno == EINTR)
                continue;
            fprintf(stderr, "bench_ipcmem: pipe: %s\n", r ? strerror(errno) : "closed");
            exit(1);
        }
        done += (size_t)r;
    }
}

static size_t arena_bytes(int64_t m, int64_t n)
{
    return 3 * (size_t)(m * n) * 2 + (size_t)n * 8 + (size_t)m * 4 + 8 * 256;
}

/* Lay out x, dy, dx, w, dw, rstd in an arena; fill x, dy, w (fixed seeds) and
 * rstd when fill is set. */
static void layout(rnk_bwd_args *k, char *arena, int64_t m, int64_t n, int fill, cudaStream_t st)
{
    size_t off = 0, mn = (size_t)(m * n);
    char msg[200];
#define TAKE(b) (off += ((b) + 255) / 256 * 256, (void *)(arena + off - ((b) + 255) / 256 * 256))
    memset(k, 0, sizeof *k);
    k->m = m;
    k->n = n;
    k->x_dtype = k->dy_dtype = k->dx_dtype = k->w_dtype = RNK_BF16;
    k->dw_dtype = RNK_F32;
    k->x_stride = k->dy_stride = k->dx_stride = n;
    k->eps = 1e-6f;
    k->x = TAKE(mn * 2);
    k->dy = TAKE(mn * 2);
    k->dx = TAKE(mn * 2);
    k->w = TAKE((size_t)n * 2);
    k->dw = TAKE((size_t)n * 4);
    k->rstd = TAKE((size_t)m * 4);
#undef TAKE
    if (fill && (rnk_cuda_fill(RNK_BF16, (void *)k->x, m, n, n, 11, 1.0f, 0.1f, st, msg, sizeof msg) ||
                 rnk_cuda_fill(RNK_BF16, (void *)k->dy, m, n, n, 12, 1.0f, 0.0f, st, msg, sizeof msg) ||
                 rnk_cuda_fill(RNK_BF16, (void *)k->w, 1, n, n, 13, 0.5f, 1.0f, st, msg, sizeof msg) ||
                 rnk_cuda_rstd(RNK_BF16, k->x, m, n, n, k->eps, (float *)k->rstd, st, msg,
                               sizeof msg))) {
        fprintf(stderr, "bench_ipcmem: fill: %s\n", msg);
        exit(1);
    }
}

/* The child: allocates and fills on 'A', runs a one-thread kernel on 'K',
 * frees on 'F', leaves on 'Q'.  Every command is answered. */
static void child(int in, int out)
{
    rne_kernels kern;
    cudaStream_t st;
    char *arena = NULL;
    CK(cudaSetDevice(0));
    CK(rne_load(&kern));
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    for (;;) {
        char c;
        xio(in, &c, 1, 0);
        if (c == 'A') {
            int64_t mn[2];
            rnk_bwd_args k;
            cudaIpcMemHandle_t h;
            xio(in, mn, sizeof mn, 0);
            CK(cudaMalloc((void **)&arena, arena_bytes(mn[0], mn[1])));
            layout(&k, arena, mn[0], mn[1], 1, st);
            CK(cudaStreamSynchronize(st));
            CK(cudaIpcGetMemHandle(&h, arena));
            xio(out, &h, sizeof h, 1);
        } else if (c == 'K') {
            CK(rne_spin(&kern, 1000, st));
            CK(cudaStreamSynchronize(st));
            xio(out, &c, 1, 1);
        } else if (c == 'F') {
            CK(cudaFree(arena));
            arena = NULL;
            xio(out, &c, 1, 1);
        } else {
            exit(0);
        }
    }
}

static int cmp_f(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

/* dx and dw of one set after a launch on poisoned outputs, into host copies. */
static void outputs(rnk_device *dev, rnk_bwd_args *k, void *ws, size_t wsb, cudaStream_t st,
                    uint16_t *dx, float *dw)
{
    char msg[200];
    size_t mn = (size_t)(k->m * k->n);
    CK(cudaMemsetAsync((void *)k->dx, 0xff, mn * 2, st));
    CK(cudaMemsetAsync(k->dw, 0xff, (size_t)k->n * 4, st));
    if (rnk_cuda_bwd(dev, k, ws, wsb, st, msg, sizeof msg)) {
        fprintf(stderr, "bench_ipcmem: %s\n", msg);
        exit(1);
    }
    CK(cudaMemcpyAsync(dx, k->dx, mn * 2, cudaMemcpyDeviceToHost, st));
    CK(cudaMemcpyAsync(dw, k->dw, (size_t)k->n * 4, cudaMemcpyDeviceToHost, st));
    CK(cudaStreamSynchronize(st));
}

int main(int argc, char **argv)
{
    int iters = 60, rounds = 5, nshapes = 0;
    int64_t shapes[16][2];
    const char *label = "", *out = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--iters") && i + 1 < argc)
            iters = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--rounds") && i + 1 < argc)
            rounds = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--label") && i + 1 < argc)
            label = argv[++i];
        else if (!strcmp(argv[i], "--out") && i + 1 < argc)
            out = argv[++i];
        else if (!strcmp(argv[i], "--shape") && i + 1 < argc && nshapes < 16) {
            long long m, n;
            if (sscanf(argv[++i], "%lld,%lld", &m, &n) != 2 || m < 1 || n < 1) {
                fprintf(stderr, "bench_ipcmem: --shape wants M,N\n");
                return 2;
            }
            shapes[nshapes][0] = m;
            shapes[nshapes++][1] = n;
        } else {
            fprintf(stderr, "usage: bench_ipcmem [--iters N] [--rounds R] [--shape M,N]... "
                            "[--label TEXT] [--out FILE]\n");
            return 2;
        }
    }
    if (iters < 1 || rounds < 1) {
        fprintf(stderr, "bench_ipcmem: --iters and --rounds must be positive\n");
        return 2;
    }
    if (!nshapes) {
        static const int64_t def[][2] = {{4096, 256}, {16384, 1024}, {32768, 4096}, {65536, 4096}};
        nshapes = 4;
        memcpy(shapes, def, sizeof def);
    }
    int p2c[2], c2p[2];
    if (pipe(p2c) || pipe(c2p)) {
        perror("pipe");
        return 1;
    }
    fflush(NULL);
    pid_t pid = fork();   /* before this process touches CUDA */
    if (pid < 0) {
        perror("fork");
        return 1;
    }
    if (pid == 0) {
        close(p2c[1]);
        close(c2p[0]);
        child(p2c[0], c2p[1]);
    }
    close(p2c[0]);
    close(c2p[1]);
    int to = p2c[1], from = c2p[0];

    char msg[200];
    rnk_device *dev;
    cudaStream_t st;
    cudaEvent_t e0, e1;
    CK(cudaSetDevice(0));
    if (rnk_cuda_init(0, &dev, msg, sizeof msg)) {
        fprintf(stderr, "bench_ipcmem: %s\n", msg);
        return 1;
    }
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    FILE *f = out ? fopen(out, "a") : NULL;
    if (out && !f) {
        perror(out);
        return 1;
    }
    if (f)
        fprintf(f, "\n| label | shape | local us | imported us | local+nb us | imported+nb us | "
                   "imported / local | local+nb / local | imported+nb / local | bits equal |\n"
                   "|---|---|---|---|---|---|---|---|---|---|\n");
    printf("%-8s %13s %9s %9s %9s %11s %8s %8s %8s %s\n", "label", "shape", way_name[0],
           way_name[1], way_name[2], way_name[3], "imp/loc", "nb/loc", "inb/loc", "bits");
    float *t = malloc(sizeof *t * (size_t)iters * (size_t)rounds * W_COUNT);
    if (!t)
        return 1;
    for (int s = 0; s < nshapes; s++) {
        int64_t m = shapes[s][0], n = shapes[s][1];
        cudaIpcMemHandle_t h;
        char *local, *imported, c = 'A';
        rnk_bwd_args k[2];
        xio(to, &c, 1, 1);
        xio(to, shapes[s], sizeof shapes[s], 1);
        xio(from, &h, sizeof h, 0);
        CK(cudaIpcOpenMemHandle((void **)&imported, h, cudaIpcMemLazyEnablePeerAccess));
        CK(cudaMalloc((void **)&local, arena_bytes(m, n)));
        layout(&k[0], local, m, n, 1, st);
        layout(&k[1], imported, m, n, 0, st);
        size_t wsb = rnk_cuda_workspace_size(dev, m, n);
        void *ws;
        CK(cudaMalloc(&ws, wsb));
        if (rnk_cuda_workspace_init(ws, wsb, st, msg, sizeof msg)) {
            fprintf(stderr, "bench_ipcmem: %s\n", msg);
            return 1;
        }
        int cnt[W_COUNT] = {0};
        for (int r = -1; r < rounds; r++)          /* round -1 warms up, untimed */
            for (int wi = 0; wi < W_COUNT; wi++) {
                int w = (wi + (r < 0 ? 0 : r)) % W_COUNT;   /* each round starts elsewhere */
                for (int i = 0; i < iters; i++) {
                    if (w >= W_LOCAL_NB) {
                        c = 'K';
                        xio(to, &c, 1, 1);
                        xio(from, &c, 1, 0);
                    }
                    CK(cudaEventRecord(e0, st));
                    if (rnk_cuda_bwd(dev, &k[w & 1], ws, wsb, st, msg, sizeof msg)) {
                        fprintf(stderr, "bench_ipcmem: %s\n", msg);
                        return 1;
                    }
                    CK(cudaEventRecord(e1, st));
                    CK(cudaEventSynchronize(e1));
                    float ms;
                    CK(cudaEventElapsedTime(&ms, e0, e1));
                    if (r >= 0)
                        t[(size_t)w * iters * rounds + cnt[w]++] = ms * 1000.0f;
                }
            }
        double med[W_COUNT];
        for (int w = 0; w < W_COUNT; w++) {
            float *v = t + (size_t)w * iters * rounds;
            qsort(v, (size_t)cnt[w], sizeof *v, cmp_f);
            med[w] = v[cnt[w] / 2];
        }
        size_t mn = (size_t)(m * n);
        uint16_t *dx0 = malloc(mn * 2), *dx1 = malloc(mn * 2);
        float *dw0 = malloc((size_t)n * 4), *dw1 = malloc((size_t)n * 4);
        if (!dx0 || !dx1 || !dw0 || !dw1)
            return 1;
        outputs(dev, &k[0], ws, wsb, st, dx0, dw0);
        outputs(dev, &k[1], ws, wsb, st, dx1, dw1);
        int eq = !memcmp(dx0, dx1, mn * 2) && !memcmp(dw0, dw1, (size_t)n * 4);
        free(dx0);
        free(dx1);
        free(dw0);
        free(dw1);
        char sh[32];
        snprintf(sh, sizeof sh, "%lldx%lld", (long long)m, (long long)n);
        printf("%-8s %13s %9.2f %9.2f %9.2f %11.2f %8.3f %8.3f %8.3f %s\n", label, sh, med[0],
               med[1], med[2], med[3], med[1] / med[0], med[2] / med[0], med[3] / med[0],
               eq ? "equal" : "DIFFER");
        if (f)
            fprintf(f, "| %s | %s | %.2f | %.2f | %.2f | %.2f | %.3f | %.3f | %.3f | %s |\n", label,
                    sh, med[0], med[1], med[2], med[3], med[1] / med[0], med[2] / med[0],
                    med[3] / med[0], eq ? "yes" : "NO");
        fflush(stdout);
        CK(cudaIpcCloseMemHandle(imported));
        CK(cudaFree(local));
        CK(cudaFree(ws));
        c = 'F';
        xio(to, &c, 1, 1);
        xio(from, &c, 1, 0);
        if (!eq) {
            fprintf(stderr, "bench_ipcmem: %s: dx/dw differ between the two sets\n", sh);
            return 1;
        }
    }
    char q = 'Q';
    xio(to, &q, 1, 1);
    waitpid(pid, NULL, 0);
    if (f)
        fclose(f);
    free(t);
    rnk_cuda_fini(dev);
    return 0;
}
