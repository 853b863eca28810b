/* SPDX-License-Identifier: MIT */
/*
 * bench_ipcmem.c - does the kernel run slower on another process's memory?
 * The daemon's kernel works on tensors it opened by CUDA IPC memory handle,
 * and at 32768x4096 it takes 6 % longer than the same launch in the client
 * (bench_e2e_cuda's "kernel" line).  This program times the same launch
 * (rnk_cuda_bwd, bf16 x/dy/dx/w, fp32 dw, rstd given, as bench_e2e_cuda)
 * on five memories, in one process, interleaved in rounds:
 *
 *   local       tensors this process allocated (cudaMalloc);
 *   ipc         the same layout allocated (cudaMalloc) by a forked child
 *               process and opened here by its CUDA IPC memory handle, as
 *               the daemon opens a client's tensors;
 *   vmm         this process's own cuMemCreate allocation, mapped at an
 *               address aligned to the allocation granularity;
 *   vmm-imp     the child's cuMemCreate allocation, its descriptor passed
 *               over a socket (SCM_RIGHTS) and mapped here at an address
 *               aligned to the granularity, as the daemon maps a client's
 *               expandable segments (REGISTER_FD);
 *   vmm-imp-1g  the same, mapped at an address aligned to 1 GiB.
 *
 * --split: x, dy and dx each in an allocation of its own, the small tensors
 * in a fourth (as PyTorch's caching allocator gives large tensors their own
 * segments); without it one allocation holds them all.
 *
 * --neighbour: before each launch the child runs a one-thread kernel of its
 * own and synchronises (as the daemon's kernel follows the client's
 * producer; under MPS two clients, without MPS a context switch).
 *
 * Each launch is timed alone (CUDA events around it, then synchronised), so
 * the times are the kernel's and not the host's.  Every set of tensors holds
 * the same random data (the same seeds); after timing, dx and dw are
 * poisoned, computed once more from each set, and compared bit for bit with
 * local's (they must be equal: same data, same alignment, same plan).
 *
 *   bench_ipcmem [--iters N] [--rounds R] [--shape M,N]... [--split] [--neighbour]
 *                [--label TEXT] [--out FILE]
 * Prints one line per shape (median us on each memory, the ratios to local,
 * and each set's base address modulo 2 MiB, in KiB) and appends them to FILE
 * as a markdown table.  Run with and without MPS.
 */
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench_problem.h"
#include "gpu/e2e_cuda.h"
#include "rnk.h"
#include "rnk_test.h"

#define CK(call) RNE_CK(call)
#define CU(call)                                                                                   \
    do {                                                                                           \
        CUresult r_ = (call);                                                                      \
        if (r_ != CUDA_SUCCESS) {                                                                  \
            fprintf(stderr, "%s:%d: %s: CUresult %d\n", __FILE__, __LINE__, #call, (int)r_);       \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

enum { W_LOCAL, W_IPC, W_VMM, W_VMM_IMP, W_VMM_IMP_1G, W_COUNT };
static const char *way_name[W_COUNT] = {"local", "ipc", "vmm", "vmm-imp", "vmm-imp-1g"};

/* ---- the driver's virtual memory calls ---------------------------------- */

static struct {
    CUresult (*create)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *,
                       unsigned long long);
    CUresult (*gran)(size_t *, const CUmemAllocationProp *, CUmemAllocationGranularity_flags);
    CUresult (*reserve)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
    CUresult (*free_va)(CUdeviceptr, size_t);
    CUresult (*map)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);
    CUresult (*access)(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t);
    CUresult (*unmap)(CUdeviceptr, size_t);
    CUresult (*release)(CUmemGenericAllocationHandle);
    CUresult (*export_fd)(void *, CUmemGenericAllocationHandle, CUmemAllocationHandleType,
                          unsigned long long);
    CUresult (*import_fd)(CUmemGenericAllocationHandle *, void *, CUmemAllocationHandleType);
} drv;

static void load(const char *name, void **fn)
{
    enum cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
    if (cudaGetDriverEntryPointByVersion(name, fn, 12000, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess || !*fn) {
        fprintf(stderr, "bench_ipcmem: the driver has no %s\n", name);
        exit(1);
    }
}

static void drv_load(void)
{
    load("cuMemCreate", (void **)&drv.create);
    load("cuMemGetAllocationGranularity", (void **)&drv.gran);
    load("cuMemAddressReserve", (void **)&drv.reserve);
    load("cuMemAddressFree", (void **)&drv.free_va);
    load("cuMemMap", (void **)&drv.map);
    load("cuMemSetAccess", (void **)&drv.access);
    load("cuMemUnmap", (void **)&drv.unmap);
    load("cuMemRelease", (void **)&drv.release);
    load("cuMemExportToShareableHandle", (void **)&drv.export_fd);
    load("cuMemImportFromShareableHandle", (void **)&drv.import_fd);
}

static CUmemAllocationProp vmm_prop(void)
{
    CUmemAllocationProp p;
    memset(&p, 0, sizeof p);
    p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    p.location.id = 0;
    p.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    return p;
}

static size_t vmm_size(size_t bytes)
{
    size_t g;
    CUmemAllocationProp p = vmm_prop();
    CU(drv.gran(&g, &p, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
    return (bytes + g - 1) / g * g;
}

/* Map allocation h of size bytes at an address aligned to align (0: the
 * granularity), readable and writable by this device. */
static char *vmm_map(CUmemGenericAllocationHandle h, size_t size, size_t align)
{
    CUdeviceptr va;
    CUmemAccessDesc a;
    memset(&a, 0, sizeof a);
    a.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    a.location.id = 0;
    a.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    CU(drv.reserve(&va, size, align, 0, 0));
    CU(drv.map(va, size, 0, h, 0));
    CU(drv.access(va, size, &a, 1));
    return (char *)(uintptr_t)va;
}

static void vmm_unmap(char *p, size_t size)
{
    CU(drv.unmap((CUdeviceptr)(uintptr_t)p, size));
    CU(drv.free_va((CUdeviceptr)(uintptr_t)p, size));
}

/* ---- the socket to the child ---------------------------------------------- */

static void xio(int fd, void *p, size_t n, int wr)
{
    size_t done = 0;
    while (done < n) {
        ssize_t r =
            wr ? write(fd, (char *)p + done, n - done) : read(fd, (char *)p + done, n - done);
        if (r <= 0) {
            if (r < 0 && errno == EINTR)
                continue;
            fprintf(stderr, "bench_ipcmem: socket: %s\n", r ? strerror(errno) : "closed");
            exit(1);
        }
        done += (size_t)r;
    }
}

static void send_fd(int sock, int fd)
{
    char c = 'D', ctl[CMSG_SPACE(sizeof(int))];
    struct iovec iov = {.iov_base = &c, .iov_len = 1};
    struct msghdr mh = {
        .msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl, .msg_controllen = sizeof ctl};
    memset(ctl, 0, sizeof ctl);
    struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(cm), &fd, sizeof fd);
    if (sendmsg(sock, &mh, 0) != 1) {
        perror("bench_ipcmem: sendmsg");
        exit(1);
    }
}

static int recv_fd(int sock)
{
    char c, ctl[CMSG_SPACE(sizeof(int))];
    struct iovec iov = {.iov_base = &c, .iov_len = 1};
    struct msghdr mh = {
        .msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl, .msg_controllen = sizeof ctl};
    int fd = -1;
    if (recvmsg(sock, &mh, 0) != 1) {
        perror("bench_ipcmem: recvmsg");
        exit(1);
    }
    for (struct cmsghdr *cm = CMSG_FIRSTHDR(&mh); cm; cm = CMSG_NXTHDR(&mh, cm))
        if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS)
            memcpy(&fd, CMSG_DATA(cm), sizeof fd);
    if (fd < 0) {
        fprintf(stderr, "bench_ipcmem: no descriptor from the child\n");
        exit(1);
    }
    return fd;
}

/* ---- tensors ---------------------------------------------------------------- */

static int split; /* --split */

/* Lay out a set in its allocations (bench_problem.h); fill x, dy, w (fixed
 * seeds) and rstd when fill is set. */
static void layout(rnk_bwd_args *k, char *const base[BP_PARTS], int64_t m, int64_t n, int fill,
                   cudaStream_t st)
{
    char msg[200];
    bp_place(k, base, m, n, split);
    if (fill && bp_fill(k, 11, st, msg, sizeof msg)) {
        fprintf(stderr, "bench_ipcmem: fill: %s\n", msg);
        exit(1);
    }
}

/* The child: on 'A' allocates a cudaMalloc arena and a cuMemCreate one,
 * fills both, sends the IPC handle and then the allocation's descriptor; on
 * 'K' runs a one-thread kernel; on 'F' frees; on 'Q' leaves.  Every command
 * is answered. */
static void child(int sock)
{
    rne_kernels kern;
    cudaStream_t st;
    char *arena[BP_PARTS], *varena[BP_PARTS];
    size_t bytes[BP_PARTS], vsize[BP_PARTS];
    CUmemGenericAllocationHandle vh[BP_PARTS];
    int np = 0;
    CK(cudaSetDevice(0));
    CK(cudaFree(NULL));
    drv_load();
    CK(rne_load(&kern));
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    for (;;) {
        char c;
        xio(sock, &c, 1, 0);
        if (c == 'A') {
            int64_t mn[2];
            rnk_bwd_args k;
            CUmemAllocationProp p = vmm_prop();
            xio(sock, mn, sizeof mn, 0);
            np = bp_parts(mn[0], mn[1], split, bytes);
            for (int i = 0; i < np; i++) {
                CK(cudaMalloc((void **)&arena[i], bytes[i]));
                vsize[i] = vmm_size(bytes[i]);
                CU(drv.create(&vh[i], vsize[i], &p, 0));
                varena[i] = vmm_map(vh[i], vsize[i], 0);
            }
            layout(&k, arena, mn[0], mn[1], 1, st);
            layout(&k, varena, mn[0], mn[1], 1, st);
            CK(cudaStreamSynchronize(st));
            for (int i = 0; i < np; i++) {
                cudaIpcMemHandle_t h;
                int fd = -1;
                CK(cudaIpcGetMemHandle(&h, arena[i]));
                CU(drv.export_fd(&fd, vh[i], CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
                xio(sock, &h, sizeof h, 1);
                send_fd(sock, fd);
                close(fd);
            }
        } else if (c == 'K') {
            CK(rne_spin(&kern, 1000, st));
            CK(cudaStreamSynchronize(st));
            xio(sock, &c, 1, 1);
        } else if (c == 'F') {
            for (int i = 0; i < np; i++) {
                CK(cudaFree(arena[i]));
                vmm_unmap(varena[i], vsize[i]);
                CU(drv.release(vh[i]));
            }
            np = 0;
            xio(sock, &c, 1, 1);
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

typedef struct opts {
    int iters, rounds, nshapes, neighbour;
    int64_t shapes[16][2];
    const char *label, *out;
} opts;

static int parse(int argc, char **argv, opts *o)
{
    static const int64_t def[][2] = {{16384, 1024}, {32768, 4096}, {49152, 4096}, {65536, 4096}};
    *o = (opts){.iters = 40, .rounds = 4, .label = ""};
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--iters") && i + 1 < argc)
            o->iters = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--rounds") && i + 1 < argc)
            o->rounds = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--label") && i + 1 < argc)
            o->label = argv[++i];
        else if (!strcmp(argv[i], "--out") && i + 1 < argc)
            o->out = argv[++i];
        else if (!strcmp(argv[i], "--neighbour"))
            o->neighbour = 1;
        else if (!strcmp(argv[i], "--split"))
            split = 1;
        else if (!strcmp(argv[i], "--shape") && i + 1 < argc && o->nshapes < 16) {
            long long m, n;
            if (sscanf(argv[++i], "%lld,%lld", &m, &n) != 2 || m < 1 || n < 1) {
                fprintf(stderr, "bench_ipcmem: --shape wants M,N\n");
                return 2;
            }
            o->shapes[o->nshapes][0] = m;
            o->shapes[o->nshapes++][1] = n;
        } else {
            fprintf(stderr, "usage: bench_ipcmem [--iters N] [--rounds R] [--shape M,N]... "
                            "[--split] [--neighbour] [--label TEXT] [--out FILE]\n");
            return 2;
        }
    }
    if (o->iters < 1 || o->rounds < 1) {
        fprintf(stderr, "bench_ipcmem: --iters and --rounds must be positive\n");
        return 2;
    }
    if (!o->nshapes) {
        o->nshapes = 4;
        memcpy(o->shapes, def, sizeof def);
    }
    return 0;
}

int main(int argc, char **argv)
{
    opts o;
    int rc = parse(argc, argv, &o), sv[2];
    if (rc)
        return rc;
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv)) {
        perror("socketpair");
        return 1;
    }
    fflush(NULL);
    pid_t pid = fork(); /* before this process touches CUDA */
    if (pid < 0) {
        perror("fork");
        return 1;
    }
    if (pid == 0) {
        close(sv[0]);
        child(sv[1]);
    }
    close(sv[1]);
    int sock = sv[0];

    char msg[200];
    rnk_device *dev;
    cudaStream_t st;
    cudaEvent_t e0, e1;
    CK(cudaSetDevice(0));
    CK(cudaFree(NULL));
    drv_load();
    if (rnk_cuda_init(0, &dev, msg, sizeof msg)) {
        fprintf(stderr, "bench_ipcmem: %s\n", msg);
        return 1;
    }
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    FILE *f = o.out ? fopen(o.out, "a") : NULL;
    if (o.out && !f) {
        perror(o.out);
        return 1;
    }
    char nb[40];
    snprintf(nb, sizeof nb, "%s%s", split ? " (split)" : "", o.neighbour ? " (neighbour)" : "");
    if (f) {
        fprintf(f, "\n| label | shape |");
        for (int w = 0; w < W_COUNT; w++)
            fprintf(f, " %s us |", way_name[w]);
        for (int w = 1; w < W_COUNT; w++)
            fprintf(f, " %s / local |", way_name[w]);
        fprintf(f, " base mod 2 MiB, KiB | bits equal |\n|---|---|");
        for (int w = 1; w < 2 * W_COUNT; w++)
            fprintf(f, "---|");
        fprintf(f, "---|---|\n");
    }
    printf("%-10s %11s", "label", "shape");
    for (int w = 0; w < W_COUNT; w++)
        printf(" %10s", way_name[w]);
    printf("   ratios to local; base mod 2 MiB (KiB); bits\n");
    float *t = malloc(sizeof *t * (size_t)o.iters * (size_t)o.rounds * W_COUNT);
    if (!t)
        return 1;
    for (int s = 0; s < o.nshapes; s++) {
        int64_t m = o.shapes[s][0], n = o.shapes[s][1];
        size_t bytes[BP_PARTS], vsize[BP_PARTS];
        CUmemGenericAllocationHandle vh[BP_PARTS], ih[BP_PARTS];
        char *base[W_COUNT][BP_PARTS], c = 'A';
        rnk_bwd_args k[W_COUNT];
        int np = bp_parts(m, n, split, bytes);
        CUmemAllocationProp p = vmm_prop();
        xio(sock, &c, 1, 1);
        xio(sock, o.shapes[s], sizeof o.shapes[s], 1);
        for (int i = 0; i < np; i++) {
            cudaIpcMemHandle_t h;
            xio(sock, &h, sizeof h, 0);
            int fd = recv_fd(sock);
            CU(drv.import_fd(&ih[i], (void *)(uintptr_t)fd,
                             CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
            close(fd);
            vsize[i] = vmm_size(bytes[i]);
            CK(cudaMalloc((void **)&base[W_LOCAL][i], bytes[i]));
            CK(cudaIpcOpenMemHandle((void **)&base[W_IPC][i], h, cudaIpcMemLazyEnablePeerAccess));
            CU(drv.create(&vh[i], vsize[i], &p, 0));
            base[W_VMM][i] = vmm_map(vh[i], vsize[i], 0);
            base[W_VMM_IMP][i] = vmm_map(ih[i], vsize[i], 0);
            base[W_VMM_IMP_1G][i] = vmm_map(ih[i], vsize[i], (size_t)1 << 30);
        }
        for (int w = 0; w < W_COUNT; w++) /* local and vmm filled here, the others by the child */
            layout(&k[w], base[w], m, n, w == W_LOCAL || w == W_VMM, st);
        size_t wsb = rnk_cuda_workspace_size(dev, m, n);
        void *ws;
        CK(cudaMalloc(&ws, wsb));
        if (rnk_cuda_workspace_init(ws, wsb, st, msg, sizeof msg)) {
            fprintf(stderr, "bench_ipcmem: %s\n", msg);
            return 1;
        }
        int cnt[W_COUNT] = {0};
        for (int r = -1; r < o.rounds; r++) /* round -1 warms up, untimed */
            for (int wi = 0; wi < W_COUNT; wi++) {
                int w = (wi + (r < 0 ? 0 : r)) % W_COUNT; /* each round starts elsewhere */
                for (int i = 0; i < o.iters; i++) {
                    if (o.neighbour) {
                        c = 'K';
                        xio(sock, &c, 1, 1);
                        xio(sock, &c, 1, 0);
                    }
                    CK(cudaEventRecord(e0, st));
                    if (rnk_cuda_bwd(dev, &k[w], ws, wsb, st, msg, sizeof msg)) {
                        fprintf(stderr, "bench_ipcmem: %s\n", msg);
                        return 1;
                    }
                    CK(cudaEventRecord(e1, st));
                    CK(cudaEventSynchronize(e1));
                    float ms;
                    CK(cudaEventElapsedTime(&ms, e0, e1));
                    if (r >= 0)
                        t[(size_t)w * o.iters * o.rounds + cnt[w]++] = ms * 1000.0f;
                }
            }
        double med[W_COUNT];
        for (int w = 0; w < W_COUNT; w++) {
            float *v = t + (size_t)w * o.iters * o.rounds;
            qsort(v, (size_t)cnt[w], sizeof *v, cmp_f);
            med[w] = v[cnt[w] / 2];
        }
        size_t mn = (size_t)(m * n);
        uint16_t *dx0 = malloc(mn * 2), *dx1 = malloc(mn * 2);
        float *dw0 = malloc((size_t)n * 4), *dw1 = malloc((size_t)n * 4);
        if (!dx0 || !dx1 || !dw0 || !dw1)
            return 1;
        int eq = 1;
        outputs(dev, &k[W_LOCAL], ws, wsb, st, dx0, dw0);
        for (int w = 1; w < W_COUNT; w++) {
            outputs(dev, &k[w], ws, wsb, st, dx1, dw1);
            eq &= !memcmp(dx0, dx1, mn * 2) && !memcmp(dw0, dw1, (size_t)n * 4);
        }
        free(dx0);
        free(dx1);
        free(dw0);
        free(dw1);
        char sh[32], al[96] = "";
        snprintf(sh, sizeof sh, "%lldx%lld", (long long)m, (long long)n);
        for (int w = 0; w < W_COUNT; w++)
            snprintf(al + strlen(al), sizeof al - strlen(al), "%s%llu", w ? "/" : "",
                     (unsigned long long)((uintptr_t)base[w][0] % (2u << 20) / 1024));
        printf("%-10s %11s", o.label, sh);
        for (int w = 0; w < W_COUNT; w++)
            printf(" %10.2f", med[w]);
        printf("  ");
        for (int w = 1; w < W_COUNT; w++)
            printf(" %.3f", med[w] / med[0]);
        printf("; %s; %s%s\n", al, eq ? "equal" : "DIFFER", nb);
        if (f) {
            fprintf(f, "| %s%s | %s |", o.label, nb, sh);
            for (int w = 0; w < W_COUNT; w++)
                fprintf(f, " %.2f |", med[w]);
            for (int w = 1; w < W_COUNT; w++)
                fprintf(f, " %.3f |", med[w] / med[0]);
            fprintf(f, " %s | %s |\n", al, eq ? "yes" : "NO");
        }
        fflush(stdout);
        for (int i = 0; i < np; i++) {
            CK(cudaIpcCloseMemHandle(base[W_IPC][i]));
            CK(cudaFree(base[W_LOCAL][i]));
            vmm_unmap(base[W_VMM][i], vsize[i]);
            vmm_unmap(base[W_VMM_IMP][i], vsize[i]);
            vmm_unmap(base[W_VMM_IMP_1G][i], vsize[i]);
            CU(drv.release(vh[i]));
            CU(drv.release(ih[i]));
        }
        CK(cudaFree(ws));
        c = 'F';
        xio(sock, &c, 1, 1);
        xio(sock, &c, 1, 0);
        if (!eq) {
            fprintf(stderr, "bench_ipcmem: %s: dx/dw differ between the sets\n", sh);
            return 1;
        }
    }
    char q = 'Q';
    xio(sock, &q, 1, 1);
    waitpid(pid, NULL, 0);
    if (f)
        fclose(f);
    free(t);
    rnk_cuda_fini(dev);
    return 0;
}
