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
 * --ways LIST: the memories timed (all five by default; all are allocated).
 * --words LIST: each timed with each of these launches (a column
 * memory+launch; none alone by default), the words as the daemon's fast
 * path passes them (submit.c's ring_submit) with values that let it run
 * (cancel 0, gate at its key, latch not at its epoch): none (no words, as
 * bench_e2e_cuda in-process); dev (cancel, gate, latch in device memory);
 * host (the daemon's: cancel, latch in mapped cudaHostAlloc memory, gate in
 * a memfd page mapped and cudaHostRegister'ed, as a ring's ready); done
 * (host, and the kernel writes done[0] into that page, as the ring's, and
 * done[1] into the child's cudaMalloc opened by IPC, as libclient's); pool
 * (done, the workspace from cudaMallocAsync as a ring stream's: the
 * daemon's armed launch).  --wait: each launch queued behind a wait
 * (cuStreamWaitValue64) on a host word the host writes 20 us after queueing
 * start event, kernel and end event, so the start event is taken as the
 * daemon's (after its stream's wait on ready), not on an idle stream before
 * the host launched the kernel.  --means: a row of means too.
 *
 * Each launch is timed alone (CUDA events around it, then synchronised), so
 * the times are the kernel's and not the host's.  Every set of tensors holds
 * the same random data (the same seeds); after timing, dx and dw are
 * poisoned, computed once more from each set, and compared bit for bit with
 * the first column's (they must be equal: same data, same alignment, same
 * plan).
 *
 *   bench_ipcmem [--iters N] [--rounds R] [--shape M,N]... [--split] [--neighbour]
 *                [--ways LIST] [--words LIST] [--wait] [--means] [--label TEXT]
 *                [--out FILE]
 * Prints a markdown table, a row per shape (median us on each column, the
 * ratios to the first, and each memory's base address modulo 2 MiB, in
 * KiB), and appends it to FILE.  Run with and without MPS.
 */
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench_problem.h"
#include "bench_util.h"
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
enum { M_NONE, M_DEV, M_HOST, M_DONE, M_POOL, M_COUNT }; /* --words */
static const char *mode_name[M_COUNT] = {"none", "dev", "host", "done", "pool"};

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
    CUresult (*wait64)(CUstream, CUdeviceptr, cuuint64_t, unsigned int);
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
    load("cuStreamWaitValue64", (void **)&drv.wait64);
}

static CUmemAllocationProp vmm_prop(void)
{
    CUmemAllocationProp p = {.type = CU_MEM_ALLOCATION_TYPE_PINNED,
                             .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0},
                             .requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR};
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
    CUmemAccessDesc a = {.location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0},
                         .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
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

/* ---- the words of --words and --wait (main sets them once) ------------------ */

static struct {
    uint64_t *dev;    /* dev: [0] cancel (its low half), [1] gate, [2] [3] latch */
    uint64_t *latch;  /* host: pinned, mapped, [0] [1]; [2] --wait's word */
    uint64_t *page;   /* a memfd page, registered: [0] gate (a ring's ready), [8] done */
    void *cancel_d, *latch_d, *page_d; /* device addresses; cancel: 4096 zero words */
    uint64_t *done1;  /* the child's done word, opened by IPC handle */
} wd;

static void *host_words(size_t bytes, void **dev)
{
    void *h;
    CK(cudaHostAlloc(&h, bytes, cudaHostAllocMapped | cudaHostAllocPortable));
    memset(h, 0, bytes);
    CK(cudaHostGetDevicePointer(dev, h, 0));
    return h;
}

static void words_init(void)
{
    static const uint64_t dv[4] = {0, 1, 0, 0}; /* cancel 0, gate at its key 1, latch 0 */
    int fd = memfd_create("bench_ipcmem", MFD_CLOEXEC);
    if (fd < 0 || ftruncate(fd, 4096) != 0 ||
        (wd.page = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)) == MAP_FAILED) {
        perror("bench_ipcmem: memfd");
        exit(1);
    }
    close(fd);
    wd.page[0] = 1;
    CK(cudaHostRegister(wd.page, 4096, cudaHostRegisterMapped | cudaHostRegisterPortable));
    CK(cudaHostGetDevicePointer(&wd.page_d, wd.page, 0));
    host_words(4096 * sizeof(unsigned), &wd.cancel_d);
    wd.latch = host_words(3 * sizeof(uint64_t), &wd.latch_d);
    CK(cudaMalloc((void **)&wd.dev, sizeof dv));
    CK(cudaMemcpy(wd.dev, dv, sizeof dv, cudaMemcpyHostToDevice));
}

/* k, a memory's tensors, launched as --words' mode m. */
static void words(rnk_bwd_args *k, int m)
{
    if (m == M_NONE)
        return;
    k->gate_key = k->latch_epoch = 1;
    k->cancel = m == M_DEV ? (const void *)wd.dev : wd.cancel_d;
    k->gate = m == M_DEV ? (void *)(wd.dev + 1) : wd.page_d;
    k->latch = m == M_DEV ? (void *)(wd.dev + 2) : wd.latch_d;
    k->done[0] = m >= M_DONE ? (uint64_t *)wd.page_d + 8 : NULL;
    k->done[1] = m >= M_DONE ? wd.done1 : NULL;
}

/* The child: first sends the IPC handle of a zeroed 2 MiB cudaMalloc (its
 * done words, as libclient's); then on 'A' allocates a cudaMalloc arena and
 * a cuMemCreate one, fills both, sends the IPC handle and then the
 * allocation's descriptor; on 'K' runs a one-thread kernel; on 'F' frees; on
 * 'Q' leaves.  Every command is answered. */
static void child(int sock)
{
    rne_kernels kern;
    cudaStream_t st;
    char *arena[BP_PARTS], *varena[BP_PARTS];
    size_t bytes[BP_PARTS], vsize[BP_PARTS];
    CUmemGenericAllocationHandle vh[BP_PARTS];
    cudaIpcMemHandle_t dh;
    void *done;
    int np = 0;
    CK(cudaSetDevice(0));
    CK(cudaFree(NULL));
    drv_load();
    CK(rne_load(&kern));
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    CK(cudaMalloc(&done, 2u << 20));
    CK(cudaMemset(done, 0, 2u << 20));
    CK(cudaIpcGetMemHandle(&dh, done));
    xio(sock, &dh, sizeof dh, 1);
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

static void bwd(rnk_device *dev, const rnk_bwd_args *k, void *ws, size_t wsb, cudaStream_t st)
{
    char msg[200];
    if (rnk_cuda_bwd(dev, k, ws, wsb, st, msg, sizeof msg)) {
        fprintf(stderr, "bench_ipcmem: %s\n", msg);
        exit(1);
    }
}

static uint64_t seq; /* the launches' done value and --wait's word, up by one a launch */

/* dx and dw of one set after a launch on poisoned outputs, into host copies;
 * its done words, if any, checked. */
static void outputs(rnk_device *dev, rnk_bwd_args *k, void *ws, size_t wsb, cudaStream_t st,
                    uint16_t *dx, float *dw)
{
    size_t mn = (size_t)(k->m * k->n);
    uint64_t d1 = 0;
    CK(cudaMemsetAsync((void *)k->dx, 0xff, mn * 2, st));
    CK(cudaMemsetAsync(k->dw, 0xff, (size_t)k->n * 4, st));
    k->done_value = ++seq;
    bwd(dev, k, ws, wsb, st);
    CK(cudaMemcpyAsync(dx, k->dx, mn * 2, cudaMemcpyDeviceToHost, st));
    CK(cudaMemcpyAsync(dw, k->dw, (size_t)k->n * 4, cudaMemcpyDeviceToHost, st));
    CK(cudaMemcpyAsync(&d1, wd.done1, sizeof d1, cudaMemcpyDeviceToHost, st));
    CK(cudaStreamSynchronize(st));
    if (k->done[0] && (__atomic_load_n(wd.page + 8, __ATOMIC_ACQUIRE) != seq || d1 != seq)) {
        fprintf(stderr, "bench_ipcmem: the done words are not %llu\n", (unsigned long long)seq);
        exit(1);
    }
}

typedef struct opts {
    int iters, rounds, nshapes, neighbour, wait, means;
    unsigned ways, modes; /* masks over way_name and mode_name */
    int64_t shapes[16][2];
    const char *label, *out;
} opts;

/* A comma-separated list of names into a mask; 0 when a name is unknown. */
static unsigned mask_of(char *list, const char *const *name, int count)
{
    unsigned mask = 0;
    for (char *sv, *t = strtok_r(list, ",", &sv); t; t = strtok_r(NULL, ",", &sv)) {
        int i = 0;
        while (i < count && strcmp(t, name[i]))
            i++;
        mask |= i < count ? 1u << i : 1u << 31;
    }
    return mask >> 31 ? 0 : mask;
}

static int parse(int argc, char **argv, opts *o)
{
    static const int64_t def[][2] = {{16384, 1024}, {32768, 4096}, {49152, 4096}, {65536, 4096}};
    *o = (opts){.iters = 40, .rounds = 4, .label = "", .ways = (1u << W_COUNT) - 1, .modes = 1};
    for (int i = 1; i < argc; i++) {
        int more = i + 1 < argc;
        if (!strcmp(argv[i], "--iters") && more)
            o->iters = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--rounds") && more)
            o->rounds = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--label") && more)
            o->label = argv[++i];
        else if (!strcmp(argv[i], "--out") && more)
            o->out = argv[++i];
        else if (!strcmp(argv[i], "--neighbour"))
            o->neighbour = 1;
        else if (!strcmp(argv[i], "--wait"))
            o->wait = 1;
        else if (!strcmp(argv[i], "--means"))
            o->means = 1;
        else if (!strcmp(argv[i], "--split"))
            split = 1;
        else if (!strcmp(argv[i], "--ways") && more &&
                 (o->ways = mask_of(argv[++i], way_name, W_COUNT)))
            continue;
        else if (!strcmp(argv[i], "--words") && more &&
                 (o->modes = mask_of(argv[++i], mode_name, M_COUNT)))
            continue;
        else if (!strcmp(argv[i], "--shape") && more && o->nshapes < 16) {
            long long m, n;
            if (sscanf(argv[++i], "%lld,%lld", &m, &n) != 2 || m < 1 || n < 1) {
                fprintf(stderr, "bench_ipcmem: --shape wants M,N\n");
                return 2;
            }
            o->shapes[o->nshapes][0] = m;
            o->shapes[o->nshapes++][1] = n;
        } else {
            fprintf(stderr, "usage: bench_ipcmem [--iters N] [--rounds R] [--shape M,N]... "
                            "[--split] [--neighbour] [--ways LIST] [--words LIST] [--wait] "
                            "[--means] [--label TEXT] [--out FILE] (bench_ipcmem.c's top)\n");
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

enum { V_MAX = W_COUNT * M_COUNT }; /* columns: a memory with a launch */

/* One row of a shape's times v, on stdout and in FILE (fs[1], if open). */
static void row(FILE *const fs[2], const char *label, const char *nb, const char *sh,
                const double *v, int nv, const char *al, int eq)
{
    for (int j = 0; j < 2 && fs[j]; j++) {
        fprintf(fs[j], "| %s%s | %s |", label, nb, sh);
        for (int i = 0; i < nv; i++)
            fprintf(fs[j], " %.2f |", v[i]);
        for (int i = 1; i < nv; i++)
            fprintf(fs[j], " %.3f |", v[i] / v[0]);
        fprintf(fs[j], " %s | %s |\n", al, eq ? "yes" : "NO");
    }
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

    char msg[200], c;
    rnk_device *dev;
    cudaStream_t st;
    cudaEvent_t e0, e1;
    cudaIpcMemHandle_t dh;
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
    words_init();
    xio(sock, &dh, sizeof dh, 0);
    CK(cudaIpcOpenMemHandle((void **)&wd.done1, dh, cudaIpcMemLazyEnablePeerAccess));
    int nv = 0, vw[V_MAX], vm[V_MAX]; /* the columns' memories and launches */
    char vname[V_MAX][24];
    for (int i = 0; i < V_MAX; i++) {
        int w = vw[nv] = i / M_COUNT, m = vm[nv] = i % M_COUNT;
        if ((o.ways >> w & 1) && (o.modes >> m & 1))
            snprintf(vname[nv++], sizeof vname[0], "%s%s%s", way_name[w], m ? "+" : "",
                     m ? mode_name[m] : "");
    }
    FILE *fs[2] = {stdout, o.out ? fopen(o.out, "a") : NULL};
    if (o.out && !fs[1]) {
        perror(o.out);
        return 1;
    }
    char nb[48];
    snprintf(nb, sizeof nb, "%s%s%s", split ? " (split)" : "", o.neighbour ? " (neighbour)" : "",
             o.wait ? " (wait)" : "");
    for (int j = 0; j < 2 && fs[j]; j++) {
        fprintf(fs[j], "\n| label | shape |");
        for (int v = 0; v < nv; v++)
            fprintf(fs[j], " %s us |", vname[v]);
        for (int v = 1; v < nv; v++)
            fprintf(fs[j], " %s / %s |", vname[v], vname[0]);
        fprintf(fs[j], " base mod 2 MiB, KiB | bits equal |\n|---|---|");
        for (int v = 1; v < 2 * nv; v++)
            fprintf(fs[j], "---|");
        fprintf(fs[j], "---|---|\n");
    }
    float *t = malloc(sizeof *t * (size_t)o.iters * (size_t)o.rounds * (size_t)nv);
    if (!t)
        return 1;
    for (int s = 0; s < o.nshapes; s++) {
        int64_t m = o.shapes[s][0], n = o.shapes[s][1];
        size_t bytes[BP_PARTS], vsize[BP_PARTS];
        CUmemGenericAllocationHandle vh[BP_PARTS], ih[BP_PARTS];
        char *base[W_COUNT][BP_PARTS];
        rnk_bwd_args kw[W_COUNT], k[V_MAX];
        int np = bp_parts(m, n, split, bytes);
        CUmemAllocationProp p = vmm_prop();
        c = 'A';
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
            layout(&kw[w], base[w], m, n, w == W_LOCAL || w == W_VMM, st);
        size_t wsb = rnk_cuda_workspace_size(dev, m, n);
        void *ws[2], *vws[V_MAX]; /* cudaMalloc's, the pool's (cudaMallocAsync) */
        CK(cudaMalloc(&ws[0], wsb));
        CK(cudaMallocAsync(&ws[1], wsb, st));
        for (int i = 0; i < 2; i++)
            if (rnk_cuda_workspace_init(ws[i], wsb, st, msg, sizeof msg)) {
                fprintf(stderr, "bench_ipcmem: %s\n", msg);
                return 1;
            }
        for (int v = 0; v < nv; v++) {
            k[v] = kw[vw[v]];
            words(&k[v], vm[v]);
            vws[v] = ws[vm[v] == M_POOL];
        }
        int cnt[V_MAX] = {0};
        for (int r = -1; r < o.rounds; r++) /* round -1 warms up, untimed */
            for (int vi = 0; vi < nv; vi++) {
                int v = (vi + (r < 0 ? 0 : r)) % nv; /* each round starts elsewhere */
                for (int i = 0; i < o.iters; i++) {
                    if (o.neighbour) {
                        c = 'K';
                        xio(sock, &c, 1, 1);
                        xio(sock, &c, 1, 0);
                    }
                    k[v].done_value = ++seq;
                    if (o.wait)
                        CU(drv.wait64(st, (CUdeviceptr)(uintptr_t)wd.latch_d + 16, seq,
                                      CU_STREAM_WAIT_VALUE_GEQ));
                    CK(cudaEventRecord(e0, st));
                    bwd(dev, &k[v], vws[v], wsb, st);
                    CK(cudaEventRecord(e1, st));
                    if (o.wait) { /* the stream waits by now; then ready comes */
                        for (uint64_t t0 = now_ns(); now_ns() - t0 < 20000;)
                            ;
                        __atomic_store_n(&wd.latch[2], seq, __ATOMIC_RELEASE);
                    }
                    CK(cudaEventSynchronize(e1));
                    float ms;
                    CK(cudaEventElapsedTime(&ms, e0, e1));
                    if (r >= 0)
                        t[(size_t)v * o.iters * o.rounds + cnt[v]++] = ms * 1000.0f;
                }
            }
        double med[V_MAX], mean[V_MAX];
        for (int v = 0; v < nv; v++) {
            float *x = t + (size_t)v * o.iters * o.rounds;
            qsort(x, (size_t)cnt[v], sizeof *x, cmp_f);
            med[v] = x[cnt[v] / 2];
            mean[v] = 0;
            for (int i = 0; i < cnt[v]; i++)
                mean[v] += x[i] / cnt[v];
        }
        size_t mn = (size_t)(m * n);
        uint16_t *dx0 = malloc(mn * 4 + (size_t)n * 8); /* dx0, dx1, dw0, dw1 */
        if (!dx0)
            return 1;
        uint16_t *dx1 = dx0 + mn;
        float *dw0 = (float *)(dx1 + mn), *dw1 = dw0 + n;
        int eq = 1;
        outputs(dev, &k[0], vws[0], wsb, st, dx0, dw0);
        for (int v = 1; v < nv; v++) {
            outputs(dev, &k[v], vws[v], wsb, st, dx1, dw1);
            eq &= !memcmp(dx0, dx1, mn * 2) && !memcmp(dw0, dw1, (size_t)n * 4);
        }
        free(dx0);
        char sh[32], al[96] = "", lb[80];
        snprintf(sh, sizeof sh, "%lldx%lld", (long long)m, (long long)n);
        for (int w = 0; w < W_COUNT; w++)
            if (o.ways >> w & 1)
                snprintf(al + strlen(al), sizeof al - strlen(al), "%s%llu", al[0] ? "/" : "",
                         (unsigned long long)((uintptr_t)base[w][0] % (2u << 20) / 1024));
        row(fs, o.label, nb, sh, med, nv, al, eq);
        snprintf(lb, sizeof lb, "%s mean", o.label);
        if (o.means)
            row(fs, lb, nb, sh, mean, nv, al, eq);
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
        CK(cudaFree(ws[0]));
        CK(cudaFreeAsync(ws[1], st));
        CK(cudaStreamSynchronize(st));
        c = 'F';
        xio(sock, &c, 1, 1);
        xio(sock, &c, 1, 0);
        if (!eq) {
            fprintf(stderr, "bench_ipcmem: %s: dx/dw differ between the sets\n", sh);
            return 1;
        }
    }
    CK(cudaIpcCloseMemHandle(wd.done1));
    c = 'Q';
    xio(sock, &c, 1, 1);
    waitpid(pid, NULL, 0);
    if (fs[1])
        fclose(fs[1]);
    free(t);
    rnk_cuda_fini(dev);
    return 0;
}
