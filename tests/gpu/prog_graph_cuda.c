/* SPDX-License-Identifier: MIT */
/*
 * prog_graph_cuda - a client process for test_graph_cuda: calls captured
 * into a CUDA graph (PROTOCOL.md 13.8).
 *
 *   prog_graph_cuda ENDPOINT replay N
 *
 * Captures, on one stream, in the global capture mode (as PyTorch does):
 * copies of fresh inputs from pinned staging, two rn_rmsnorm_bwd calls
 * (the second on the first one's dx, so that the order of the two inside
 * the graph matters) and copies of the outputs to pinned memory.  Then N
 * times: new inputs into the staging, a GPU-side delay of random length on
 * the stream before the replay (a late producer), the replay, and the same
 * work eagerly (the fast path's ring); dx and dw of both must be bitwise
 * equal.  Ends with rn_check 0 and the graph destroyed (its slots given
 * back at the next call, which is the last check), after a sync call and
 * a classic-path client's call in a capture are refused.  Exit 0 on
 * success.
 */
#include <cuda_runtime_api.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "e2e_cuda.h"
#include "rmsnorm_client.h"

#define M 64
#define N 1024

static int fails;

#define CK(call) RNE_CK(call)
#define RCK(c, call)                                                                          \
    do {                                                                                      \
        int r_ = (call);                                                                      \
        if (r_ != 0) {                                                                        \
            fprintf(stderr, "%s:%d: %s: %d %s\n", __FILE__, __LINE__, #call, r_,              \
                    rn_last_error(c));                                                        \
            exit(1);                                                                          \
        }                                                                                     \
    } while (0)

typedef struct bufs {
    uint16_t *x, *dy, *dx1, *dx2;  /* bf16 */
    float *w, *rstd, *dw1, *dw2;
} bufs;

static rn_bwd_args args(void *x, void *dy, void *dx, float *w, float *rstd, float *dw)
{
    rn_bwd_args a = RN_BWD_ARGS_INIT;
    a.m = M;
    a.n = N;
    a.x = x;
    a.dy = dy;
    a.dx = dx;
    a.x_stride = a.dy_stride = a.dx_stride = N;
    a.x_dtype = a.dy_dtype = a.dx_dtype = RN_DTYPE_BF16;
    a.w = w;
    a.w_dtype = RN_DTYPE_F32;
    a.rstd = rstd;
    a.dw = dw;
    a.dw_dtype = RN_DTYPE_F32;
    a.eps = 1e-6f;
    return a;
}

/* The work: inputs in, two calls (the second's dy is the first's dx),
 * outputs out. */
static void work(rn_client *c, cudaStream_t st, const bufs *d, void *in, void *out)
{
    size_t xb = (size_t)M * N * 2, wb = (size_t)N * 4, rb = (size_t)M * 4;
    uint8_t *i = in, *o = out;

    CK(cudaMemcpyAsync(d->x, i, xb, cudaMemcpyHostToDevice, st));
    CK(cudaMemcpyAsync(d->dy, i + xb, xb, cudaMemcpyHostToDevice, st));
    CK(cudaMemcpyAsync(d->w, i + 2 * xb, wb, cudaMemcpyHostToDevice, st));
    CK(cudaMemcpyAsync(d->rstd, i + 2 * xb + wb, rb, cudaMemcpyHostToDevice, st));
    rn_bwd_args a1 = args(d->x, d->dy, d->dx1, d->w, d->rstd, d->dw1);
    rn_bwd_args a2 = args(d->x, d->dx1, d->dx2, d->w, d->rstd, d->dw2);
    RCK(c, rn_rmsnorm_bwd(c, &a1, st));
    RCK(c, rn_rmsnorm_bwd(c, &a2, st));
    CK(cudaMemcpyAsync(o, d->dx2, xb, cudaMemcpyDeviceToHost, st));
    CK(cudaMemcpyAsync(o + xb, d->dw1, wb, cudaMemcpyDeviceToHost, st));
    CK(cudaMemcpyAsync(o + xb + wb, d->dw2, wb, cudaMemcpyDeviceToHost, st));
}

/* What cannot join a capture is refused RN_UNSUPPORTED, the capture
 * left valid: a sync call, and an async call of a client on the classic
 * path.  (Before, each ran once at capture time, on inputs the capture had
 * not written, and the graph left it out.) */
static void refused_in_capture(rn_client *c, const char *endpoint, cudaStream_t st,
                               const bufs *d)
{
    rn_connect_opts o = RN_CONNECT_OPTS_INIT;
    rn_client *cc = NULL;
    rn_bwd_args a = args(d->x, d->dy, d->dx1, d->w, d->rstd, d->dw1);
    enum cudaStreamCaptureStatus cap;
    cudaGraph_t g;
    rn_timing t;

    o.endpoint = endpoint;
    o.path = RN_PATH_CLASSIC;
    if (rn_connect(&o, &cc) != 0) {
        fprintf(stderr, "rn_connect (classic): %s\n", rn_last_error(NULL));
        exit(1);
    }
    RCK(cc, rn_rmsnorm_bwd(cc, &a, st)); /* (its events exchanged outside the capture) */
    CK(cudaStreamSynchronize(st));
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
    int r1 = rn_rmsnorm_bwd_sync(c, &a, st, &t);
    int r2 = rn_rmsnorm_bwd(cc, &a, st);
    CK(cudaStreamIsCapturing(st, &cap));
    CK(cudaStreamEndCapture(st, &g));
    CK(cudaGraphDestroy(g));
    if (r1 != RN_UNSUPPORTED || r2 != RN_UNSUPPORTED || cap != cudaStreamCaptureStatusActive) {
        fprintf(stderr, "in a capture: sync call %d, classic call %d (expected %d each: %s), "
                "capture status %d\n", r1, r2, RN_UNSUPPORTED, rn_last_error(cc), (int)cap);
        fails++;
    }
    printf("in a capture: sync call and classic call refused: %s\n", rn_last_error(cc));
    rn_close(cc);
}

static uint16_t bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)(u >> 16);
}

static void fresh(uint8_t *in, unsigned seed)
{
    size_t xb = (size_t)M * N * 2;
    uint16_t *x = (uint16_t *)in, *dy = (uint16_t *)(in + xb);
    float *w = (float *)(in + 2 * xb), *r = w + N;
    srand(seed);
    for (size_t k = 0; k < (size_t)M * N; k++) {
        x[k] = bf16((float)rand() / RAND_MAX * 4.0f - 2.0f);
        dy[k] = bf16((float)rand() / RAND_MAX * 2.0f - 1.0f);
    }
    for (int k = 0; k < N; k++)
        w[k] = 0.5f + (float)rand() / RAND_MAX;
    for (int k = 0; k < M; k++)
        r[k] = 0.5f + (float)rand() / RAND_MAX;
}

int main(int argc, char **argv)
{
    rn_connect_opts o = RN_CONNECT_OPTS_INIT;
    rn_client *c = NULL;
    cudaStream_t st;
    cudaGraph_t g;
    cudaGraphExec_t ge;
    rne_kernels kern;
    bufs d;
    size_t xb = (size_t)M * N * 2, wb = (size_t)N * 4, rb = (size_t)M * 4;
    size_t inb = 2 * xb + wb + rb, outb = xb + 2 * wb;
    uint8_t *in, *out_g, *out_e;

    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc < 4 || strcmp(argv[2], "replay") != 0) {
        fprintf(stderr, "usage: %s ENDPOINT replay N\n", argv[0]);
        return 2;
    }
    int n = atoi(argv[3]);
    CK(cudaSetDevice(0));
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    CK(rne_load(&kern));
    o.endpoint = argv[1];
    o.path = RN_PATH_FAST;
    if (rn_connect(&o, &c) != 0) {
        fprintf(stderr, "rn_connect: %s\n", rn_last_error(NULL));
        return 1;
    }
    CK(cudaMalloc((void **)&d.x, xb));
    CK(cudaMalloc((void **)&d.dy, xb));
    CK(cudaMalloc((void **)&d.dx1, xb));
    CK(cudaMalloc((void **)&d.dx2, xb));
    CK(cudaMalloc((void **)&d.w, wb));
    CK(cudaMalloc((void **)&d.rstd, rb));
    CK(cudaMalloc((void **)&d.dw1, wb));
    CK(cudaMalloc((void **)&d.dw2, wb));
    CK(cudaMallocHost((void **)&in, inb));
    CK(cudaMallocHost((void **)&out_g, outb));
    CK(cudaMallocHost((void **)&out_e, outb));
    fresh(in, 1);
    work(c, st, &d, in, out_e); /* eager first: the ring is set up outside the capture */
    CK(cudaStreamSynchronize(st));
    RCK(c, rn_check(c));

    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
    work(c, st, &d, in, out_g);
    CK(cudaStreamEndCapture(st, &g));
    CK(cudaGraphInstantiate(&ge, g, 0));
    printf("captured; replaying %d times\n", n);
    srand(12345);
    for (int r = 0; r < n; r++) {
        fresh(in, 1000u + (unsigned)r);
        memset(out_g, 0xa5, outb);
        memset(out_e, 0x5a, outb);
        CK(rne_spin(&kern, (uint64_t)(rand() % 4 == 0 ? rand() % 200000 : 0), st));
        CK(cudaGraphLaunch(ge, st));
        CK(cudaStreamSynchronize(st));
        work(c, st, &d, in, out_e);
        CK(cudaStreamSynchronize(st));
        if (memcmp(out_g, out_e, outb) != 0) {
            if (fails++ < 5)
                fprintf(stderr, "replay %d: the graph's dx/dw differ from the eager call's\n", r);
        }
    }
    RCK(c, rn_check(c));
    /* Back to back without a host wait between replays. */
    for (int r = 0; r < n; r++)
        CK(cudaGraphLaunch(ge, st));
    CK(cudaStreamSynchronize(st));
    RCK(c, rn_check(c));
    CK(cudaGraphExecDestroy(ge));
    CK(cudaGraphDestroy(g));
    CK(cudaDeviceSynchronize());
    refused_in_capture(c, argv[1], st, &d);
    /* The slots come back at the next call (their destructors ran). */
    work(c, st, &d, in, out_e);
    CK(cudaStreamSynchronize(st));
    RCK(c, rn_sync(c));
    rn_close(c);
    printf("%d replays, %d mismatches\n", n, fails);
    return fails ? 1 : 0;
}
