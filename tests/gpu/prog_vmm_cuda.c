/* SPDX-License-Identifier: MIT */
/*
 * prog_vmm_cuda.c - a client process of the VMM GPU tests
 * (test_vmm_cuda.c): its tensors live in CUDA virtual memory, as PyTorch's
 * expandable segments allocate it: one reserved address range, physical
 * allocations (cuMemCreate, exportable as POSIX descriptors) mapped into it
 * side by side, tensors that span the boundaries between them.  Results
 * are judged on the GPU against the fp64 reference (rnk_cuda_verify).
 *
 *   prog_vmm_cuda ENDPOINT results     shapes x dtypes, tensors across chunks
 *   prog_vmm_cuda ENDPOINT grow        calls, then the range grows (more
 *                                      chunks mapped) and a call spans the
 *                                      new ones; then a chunk under a cached
 *                                      range is unmapped and another
 *                                      allocation mapped at its address: the
 *                                      next call must see the new memory
 *   prog_vmm_cuda ENDPOINT graph       calls captured into CUDA graphs
 *                                      replay after their cached ranges
 *                                      went stale, or were the least
 *                                      recently used of more than 256
 *   prog_vmm_cuda ENDPOINT flood       calls until killed ("running" after
 *                                      the first ones)
 *   prog_vmm_cuda ENDPOINT noexport    memory created without an exportable
 *                                      handle type: RN_NOT_SHARED, saying so
 *   prog_vmm_cuda ENDPOINT optout      exportable memory with RMSNORMD_VMM=0:
 *                                      RN_NOT_SHARED, naming the variable
 *   prog_vmm_cuda ENDPOINT cost        the time of a sync call whose tensors
 *                                      need new ranges (1, 4 and 8 chunks
 *                                      each), and of the same call cached
 *                                      (for bench/RESULTS.md)
 *
 * It runs with libclient's default (RMSNORMD_VMM unset: VMM memory shared
 * by descriptor); only optout sets RMSNORMD_VMM=0, the opt-out.
 * Prints "ok ..." / "FAIL ..." lines and exits 0 when all passed.
 */
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "rmsnorm_client.h"
#include "rmsnormctl_verify.h"
#include "rnk.h"
#include "rnk_test.h"
#include "gpu/e2e_prog.h"

#define CHUNKS_MAX 32

static const char *endpoint;
static cudaStream_t st;
static rn_client *cli;
static int failures;
static int dev;

#define CU(call)                                                                              \
    do {                                                                                      \
        CUresult r_ = (call);                                                                 \
        if (r_ != CUDA_SUCCESS) {                                                             \
            printf("FAIL %s:%d: %s: driver error %d\n", __FILE__, __LINE__, #call, (int)r_);   \
            exit(1);                                                                          \
        }                                                                                     \
    } while (0)

/* ---- the driver's virtual memory calls ---------------------------------------------------- */

static struct {
    CUresult (*create)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *,
                       unsigned long long);
    CUresult (*gran)(size_t *, const CUmemAllocationProp *, CUmemAllocationGranularity_flags);
    CUresult (*reserve)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
    CUresult (*map)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);
    CUresult (*access)(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t);
    CUresult (*unmap)(CUdeviceptr, size_t);
    CUresult (*release)(CUmemGenericAllocationHandle);
} drv;

static void load(const char *name, void **fn)
{
    enum cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
    if (cudaGetDriverEntryPointByVersion(name, fn, 12000, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess || !*fn) {
        printf("FAIL the driver has no %s\n", name);
        exit(1);
    }
}

static void drv_load(void)
{
    load("cuMemCreate", (void **)&drv.create);
    load("cuMemGetAllocationGranularity", (void **)&drv.gran);
    load("cuMemAddressReserve", (void **)&drv.reserve);
    load("cuMemMap", (void **)&drv.map);
    load("cuMemSetAccess", (void **)&drv.access);
    load("cuMemUnmap", (void **)&drv.unmap);
    load("cuMemRelease", (void **)&drv.release);
}

/* An expandable segment of our own: a reserved range and the chunks mapped
 * into it from its start. */
typedef struct segment {
    CUdeviceptr base;
    size_t chunk, reserved;
    CUmemGenericAllocationHandle h[CHUNKS_MAX];
    bool mapped[CHUNKS_MAX];
    bool exportable;
} segment;

static CUmemAllocationProp prop_of(bool exportable)
{
    CUmemAllocationProp p;
    memset(&p, 0, sizeof p);
    p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    p.location.id = dev;
    p.requestedHandleTypes = exportable ? CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
                                        : CU_MEM_HANDLE_TYPE_NONE;
    return p;
}

static void seg_init(segment *s, bool exportable)
{
    CUmemAllocationProp p = prop_of(exportable);
    memset(s, 0, sizeof s[0]);
    s->exportable = exportable;
    CU(drv.gran(&s->chunk, &p, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
    s->reserved = s->chunk * CHUNKS_MAX;
    CU(drv.reserve(&s->base, s->reserved, s->chunk, 0, 0));
}

/* Map a new allocation as chunk i. */
static void seg_map(segment *s, int i)
{
    CUmemAllocationProp p = prop_of(s->exportable);
    CUmemAccessDesc a;
    memset(&a, 0, sizeof a);
    a.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    a.location.id = dev;
    a.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    CU(drv.create(&s->h[i], s->chunk, &p, 0));
    CU(drv.map(s->base + (CUdeviceptr)i * s->chunk, s->chunk, 0, s->h[i], 0));
    CU(drv.access(s->base + (CUdeviceptr)i * s->chunk, s->chunk, &a, 1));
    s->mapped[i] = true;
}

/* Unmap chunk i and release our handle (as the allocator does when it
 * shrinks a segment); the daemon may still hold its own. */
static void seg_unmap(segment *s, int i)
{
    CK(cudaStreamSynchronize(st));
    CU(drv.unmap(s->base + (CUdeviceptr)i * s->chunk, s->chunk));
    CU(drv.release(s->h[i]));
    s->mapped[i] = false;
}

/* ---- calls ------------------------------------------------------------------------------ */

static void args_of(rn_bwd_args *a, int64_t m, int64_t n, rn_dtype dt)
{
    memset(a, 0, sizeof *a);
    a->struct_size = sizeof *a;
    a->m = m;
    a->n = n;
    a->x_dtype = a->dy_dtype = a->dx_dtype = a->w_dtype = dt;
    a->dw_dtype = RN_DTYPE_F32;
    a->dres_dtype = RN_DTYPE_NONE;
    a->eps = 1e-6f;
    a->x_stride = a->dy_stride = a->dx_stride = n;
}

/* Fill a's inputs and poison its outputs, on st. */
static void prepare(rn_bwd_args *a, uint64_t seed, const char *what)
{
    char msg[200] = "";
    int rc = rnk_cuda_fill((rnk_dtype)a->x_dtype, (void *)a->x, a->m, a->n, a->x_stride, seed,
                           1.0f, 0.1f, st, msg, sizeof msg);
    if (!rc)
        rc = rnk_cuda_fill((rnk_dtype)a->dy_dtype, (void *)a->dy, a->m, a->n, a->dy_stride,
                           seed + 1, 1.0f, 0.0f, st, msg, sizeof msg);
    if (!rc)
        rc = rnk_cuda_fill((rnk_dtype)a->w_dtype, (void *)a->w, 1, a->n, a->n, seed + 2, 0.5f,
                           1.0f, st, msg, sizeof msg);
    if (rc) {
        printf("FAIL %s: fill: %s\n", what, msg);
        exit(1);
    }
    CK(cudaMemsetAsync(a->dx, 0xff, (size_t)(a->m * a->n) * esz(a->dx_dtype), st));
    CK(cudaMemsetAsync(a->dw, 0xff, (size_t)a->n * 4, st));
}

/* Fill a's inputs, poison its outputs, call, and judge the outputs. */
static bool call_and_verify(rn_bwd_args *a, uint64_t seed, bool sync, const char *what)
{
    prepare(a, seed, what);
    int rc = sync ? rn_rmsnorm_bwd_sync(cli, a, st, NULL) : rn_rmsnorm_bwd(cli, a, st);
    if (rc != 0) {
        printf("FAIL %s: %s: %s\n", what, rn_err_name(rc), rn_last_error(cli));
        failures++;
        return false;
    }
    if (rne_verify(a, st, what))
        return true;
    failures++;
    return false;
}

/* Map chunks of s from 0 until [0, need) bytes are mapped. */
static void map_upto(segment *s, size_t need)
{
    for (int i = 0; (size_t)i * s->chunk < need; i++) {
        if (i >= CHUNKS_MAX) {
            printf("FAIL %zu bytes need more than %d chunks\n", need, CHUNKS_MAX);
            exit(1);
        }
        if (!s->mapped[i])
            seg_map(s, i);
    }
}

/* ---- modes ----------------------------------------------------------------------------- */

static int run_results(void)
{
    static const int64_t shapes[][2] = {{1, 1}, {7, 100}, {256, 4096}, {1000, 4096}, {3, 65536}};
    static const rn_dtype dts[] = {RN_DTYPE_BF16, RN_DTYPE_F16, RN_DTYPE_F32};
    segment s;
    int cases = 0;

    seg_init(&s, true);
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        for (size_t d = 0; d < 3; d++) {
            rn_bwd_args a;
            char what[128];
            /* Start just before the end of chunk 0, so that x crosses into
             * chunk 1 (and larger shapes span several). */
            char *start = (char *)(uintptr_t)s.base + s.chunk - 4096;
            args_of(&a, shapes[i][0], shapes[i][1], dts[d]);
            map_upto(&s, s.chunk - 4096 + layout(&a, NULL, false));
            layout(&a, start, false);
            snprintf(what, sizeof what, "results %lldx%lld dtype %d", (long long)a.m,
                     (long long)a.n, (int)dts[d]);
            if (call_and_verify(&a, 1000 + cases, d == 2, what))
                cases++;
        }
    }
    CK(cudaStreamSynchronize(st));
    printf("ok results: %d cases, chunks of %zu bytes\n", cases, s.chunk);
    return failures ? 1 : 0;
}

static int run_grow(void)
{
    segment s;
    rn_bwd_args a;
    size_t bytes;
    char *p;

    seg_init(&s, true);
    /* A tensor set inside chunks 0 and 1. */
    args_of(&a, 128, 2048, RN_DTYPE_BF16);
    bytes = layout(&a, NULL, false);
    map_upto(&s, s.chunk + 8192);
    p = (char *)(uintptr_t)s.base + s.chunk - bytes / 2;
    layout(&a, p, false);
    call_and_verify(&a, 1, false, "grow: before");
    call_and_verify(&a, 2, false, "grow: cached");
    /* The segment grows (chunks 2, 3 and as many more as the larger
     * tensor set needs); it spans chunk 1 and the new ones. */
    seg_map(&s, 2);
    seg_map(&s, 3);
    args_of(&a, 512, 4096, RN_DTYPE_BF16);
    map_upto(&s, s.chunk + 4096 + layout(&a, NULL, false));
    layout(&a, (char *)(uintptr_t)s.base + s.chunk + 4096, false);
    call_and_verify(&a, 3, false, "grow: after growth");
    /* Chunk 1 unmapped and another allocation mapped at its address: the
     * cached ranges over it are stale; the next call must reach the new
     * memory (its results are judged there). */
    seg_unmap(&s, 1);
    seg_map(&s, 1);
    call_and_verify(&a, 4, false, "grow: after remap");
    call_and_verify(&a, 5, true, "grow: after remap, cached, sync");
    /* And the segment shrinks at its end: a tensor in chunk 0 still works. */
    seg_unmap(&s, 3);
    args_of(&a, 4, 256, RN_DTYPE_F32);
    layout(&a, (char *)(uintptr_t)s.base, false);
    call_and_verify(&a, 6, false, "grow: after shrink");
    CK(cudaStreamSynchronize(st));
    printf("ok grow\n");
    return failures ? 1 : 0;
}

/* A call on a's tensors captured into a graph (the global mode, as PyTorch
 * captures), instantiated into *ge. */
static void capture(rn_bwd_args *a, cudaGraph_t *g, cudaGraphExec_t *ge, const char *what)
{
    CK(cudaStreamSynchronize(st));
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
    int rc = rn_rmsnorm_bwd(cli, a, st);
    CK(cudaStreamEndCapture(st, g));
    if (rc != 0) {
        printf("FAIL %s: capture: %s: %s\n", what, rn_err_name(rc), rn_last_error(cli));
        exit(1);
    }
    CK(cudaGraphInstantiate(ge, *g, 0));
}

/* Fresh inputs, poisoned outputs, a replay of ge (a call on a's tensors),
 * judged; and no error reported. */
static void replay(rn_bwd_args *a, cudaGraphExec_t ge, uint64_t seed, const char *what)
{
    prepare(a, seed, what);
    CK(cudaGraphLaunch(ge, st));
    if (!rne_verify(a, st, what))
        failures++;
    int rc = rn_check(cli);
    if (rc != 0) {
        printf("FAIL %s: rn_check: %s: %s\n", what, rn_err_name(rc), rn_last_error(cli));
        failures++;
    }
}

/* Graphs replay calls on VMM memory whose cached ranges libclient would
 * otherwise have unregistered: one whose range went stale (another
 * allocation mapped under part of it), one whose range is the least
 * recently used of more than the cache keeps (256). */
static int run_graph(void)
{
    enum { MANY = 9 };
    segment s, many[MANY];
    rn_bwd_args a, ga, gb, b;
    cudaGraph_t g1, g2;
    cudaGraphExec_t e1, e2;
    char what[96];
    size_t bytes;
    int ranges = 0;

    seg_init(&s, true);
    map_upto(&s, 3 * s.chunk);
    /* Tensors across chunks 0 and 1: their range [0, 1] is cached. */
    args_of(&a, 128, 2048, RN_DTYPE_BF16);
    bytes = layout(&a, NULL, false);
    layout(&a, (char *)(uintptr_t)s.base + s.chunk - bytes / 2, false);
    call_and_verify(&a, 1, false, "graph: tensors across chunks 0 and 1");
    /* Graph 1: a call inside chunk 0, which names range [0, 1] (the
     * largest cached one that covers it).  Graph 2: inside chunk 2. */
    args_of(&ga, 64, 1024, RN_DTYPE_BF16);
    layout(&ga, (char *)(uintptr_t)s.base, false);
    capture(&ga, &g1, &e1, "graph 1");
    replay(&ga, e1, 2, "graph 1: first replay");
    args_of(&gb, 64, 1024, RN_DTYPE_F16);
    layout(&gb, (char *)(uintptr_t)s.base + 2 * s.chunk, false);
    capture(&gb, &g2, &e2, "graph 2");
    replay(&gb, e2, 3, "graph 2: first replay");
    /* Chunk 1 replaced: range [0, 1] is stale.  An eager call on graph 1's
     * tensors then needs a range of its own; graph 1 still names the old
     * one. */
    seg_unmap(&s, 1);
    seg_map(&s, 1);
    call_and_verify(&ga, 4, false, "graph: eager call after the remap");
    replay(&ga, e1, 5, "graph 1: replay after the remap");
    /* 288 more ranges, one chunk each: graph 2's is the least recently
     * used. */
    for (int k = 0; k < MANY; k++) {
        seg_init(&many[k], true);
        map_upto(&many[k], CHUNKS_MAX * many[k].chunk);
        for (int i = 0; i < CHUNKS_MAX; i++) {
            args_of(&b, 4, 256, RN_DTYPE_F32);
            layout(&b, (char *)(uintptr_t)many[k].base + (size_t)i * many[k].chunk, false);
            snprintf(what, sizeof what, "graph: range %d of the flood", ranges);
            call_and_verify(&b, 100 + (uint64_t)ranges++, false, what);
        }
    }
    replay(&gb, e2, 6, "graph 2: replay after 288 other ranges");
    replay(&ga, e1, 7, "graph 1: replay after 288 other ranges");
    /* The graphs gone, their slots (and holds) go back at the next call. */
    CK(cudaStreamSynchronize(st));
    CK(cudaGraphExecDestroy(e1));
    CK(cudaGraphDestroy(g1));
    CK(cudaGraphExecDestroy(e2));
    CK(cudaGraphDestroy(g2));
    call_and_verify(&ga, 8, false, "graph: eager call after the graphs");
    call_and_verify(&gb, 9, true, "graph: eager call after the graphs, sync");
    CK(cudaStreamSynchronize(st));
    if (failures == 0)
        printf("ok graph: %d ranges besides the graphs'\n", ranges);
    return failures ? 1 : 0;
}

static int run_flood(void)
{
    segment s;
    rn_bwd_args a;

    seg_init(&s, true);
    args_of(&a, 2048, 4096, RN_DTYPE_BF16);
    map_upto(&s, s.chunk - 4096 + layout(&a, NULL, false));
    layout(&a, (char *)(uintptr_t)s.base + s.chunk - 4096, false);
    for (long i = 0;; i++) {
        int rc = rn_rmsnorm_bwd(cli, &a, st);
        if (rc != 0) {
            printf("FAIL flood: %s: %s\n", rn_err_name(rc), rn_last_error(cli));
            return 1;
        }
        if (i == 8) {
            printf("running\n");
            fflush(stdout);
        }
    }
}

/* One call on a tensor in VMM memory (exportable or not) that libclient
 * must refuse with RN_NOT_SHARED, its message naming x and containing
 * needle. */
static int refused_call(const char *what, bool exportable, const char *needle)
{
    segment s;
    rn_bwd_args a;
    int rc;

    seg_init(&s, exportable);
    args_of(&a, 16, 1024, RN_DTYPE_BF16);
    map_upto(&s, layout(&a, NULL, false));
    layout(&a, (char *)(uintptr_t)s.base, false);
    rc = rn_rmsnorm_bwd(cli, &a, st);
    if (rc != RN_NOT_SHARED || !strstr(rn_last_error(cli), needle) ||
        strncmp(rn_last_error(cli), "x: ", 3) != 0) {
        printf("FAIL %s: %s: %s\n", what, rn_err_name(rc), rn_last_error(cli));
        return 1;
    }
    printf("ok %s: %s\n", what, rn_last_error(cli));
    return 0;
}

static int run_noexport(void)
{
    return refused_call("noexport", false, "POSIX descriptor");
}

/* The opt-out: memory that would be shared is refused, as before VMM
 * sharing existed, with a message naming the variable. */
static int run_optout(void)
{
    setenv("RMSNORMD_VMM", "0", 1);
    return refused_call("optout", true, "RMSNORMD_VMM=0");
}

static double now_us(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e6 + (double)t.tv_nsec / 1e3;
}

static int run_cost(void)
{
    static const int spans[] = {1, 4, 8};
    for (size_t k = 0; k < sizeof spans / sizeof spans[0]; k++) {
        segment s;
        rn_bwd_args a;
        double t0, first, cached = 1e30;
        seg_init(&s, true);
        /* x, dy and dx of spans[k] chunks each (bf16, 1024 columns). */
        args_of(&a, (int64_t)(spans[k] * s.chunk / 2048), 1024, RN_DTYPE_BF16);
        map_upto(&s, layout(&a, NULL, false));
        layout(&a, (char *)(uintptr_t)s.base, false);
        call_and_verify(&a, 9, true, "cost: warm-up of the kernel");
        CK(cudaStreamSynchronize(st));
        /* The same tensors at a new address: the next segment. */
        segment s2;
        seg_init(&s2, true);
        map_upto(&s2, layout(&a, NULL, false));
        layout(&a, (char *)(uintptr_t)s2.base, false);
        t0 = now_us();
        if (rn_rmsnorm_bwd_sync(cli, &a, st, NULL) != 0) {
            printf("FAIL cost: %s\n", rn_last_error(cli));
            return 1;
        }
        first = now_us() - t0;
        for (int i = 0; i < 20; i++) {
            t0 = now_us();
            if (rn_rmsnorm_bwd_sync(cli, &a, st, NULL) != 0) {
                printf("FAIL cost: %s\n", rn_last_error(cli));
                return 1;
            }
            double d = now_us() - t0;
            cached = d < cached ? d : cached;
        }
        printf("ok cost: x, dy, dx of %d chunks of %zu bytes each: first call (ranges "
               "registered) %.0f us, cached %.0f us (best of 20)\n",
               spans[k], s.chunk, first, cached);
    }
    return failures ? 1 : 0;
}

int main(int argc, char **argv)
{
    rn_connect_opts o = {0};

    if (argc < 3) {
        fprintf(stderr, "usage: prog_vmm_cuda ENDPOINT results|grow|graph|flood|noexport|optout|cost\n");
        return 2;
    }
    endpoint = argv[1];
    setvbuf(stdout, NULL, _IOLBF, 0);
    /* libclient's default, whatever the caller's environment says. */
    unsetenv("RMSNORMD_VMM");
    CK(cudaSetDevice(0));
    CK(cudaGetDevice(&dev));
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    drv_load();
    o.endpoint = endpoint;
    o.timeout_ms = 30000;
    o.client_name = "vmm";
    if (rn_connect(&o, &cli) != 0) {
        printf("FAIL connect: %s\n", rn_last_error(NULL));
        return 1;
    }
    if (strcmp(argv[2], "results") == 0)
        return run_results();
    if (strcmp(argv[2], "grow") == 0)
        return run_grow();
    if (strcmp(argv[2], "graph") == 0)
        return run_graph();
    if (strcmp(argv[2], "flood") == 0)
        return run_flood();
    if (strcmp(argv[2], "noexport") == 0)
        return run_noexport();
    if (strcmp(argv[2], "optout") == 0)
        return run_optout();
    if (strcmp(argv[2], "cost") == 0)
        return run_cost();
    fprintf(stderr, "prog_vmm_cuda: unknown mode %s\n", argv[2]);
    return 2;
}
