/* SPDX-License-Identifier: MIT */
/*
 * ref64.cu - an fp64 reference of the backward pass on the GPU, written
 * separately from (and much more simply than) the production kernel, for the
 * tests' largest shapes where the CPU reference would take hours.  Plain
 * per-row, per-element and per-column kernels in double; no chunks, no
 * vectors, no shared tricks.  rnk_cuda_verify judges a launch's outputs with
 * exactly rnk_verify's rules without ever storing the m*n reference.
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "rnk_test.h"

namespace {

int ck(cudaError_t e, const char *file, int line, const char *what, char *msg, size_t msglen)
{
    if (e == cudaSuccess)
        return RNK_OK;
    (void)cudaGetLastError();
    const char *base = strrchr(file, '/');
    if (msg && msglen)
        snprintf(msg, msglen, "%s:%d: %s: %s", base ? base + 1 : file, line, what,
                 cudaGetErrorString(e));
    return RNK_ECUDA;
}

#define RCK(call)                                                                  \
    do {                                                                           \
        rc = ck((call), __FILE__, __LINE__, #call, msg, msglen);                   \
        if (rc)                                                                    \
            goto out;                                                              \
    } while (0)

__device__ double ld64(int dt, const void *p, int64_t i)
{
    if (dt == RNK_F32)
        return (double)((const float *)p)[i];
    if (dt == RNK_BF16)
        return (double)__bfloat162float(((const __nv_bfloat16 *)p)[i]);
    return (double)__half2float(((const __half *)p)[i]);
}

struct Ref {
    const void *x, *dy, *w, *dres, *dx;
    const float *rstd;
    int64_t m, n, xs, dys, dxs, drs;
    int x_dt, dy_dt, w_dt, dr_dt, dx_dt;
    double eps, offset;
    double *row;   /* [m][3]: rstd, c, mean |xhat * g| */
};

__device__ double gfac(const Ref &r, int64_t j)
{
    return r.w ? ld64(r.w_dt, r.w, j) + r.offset : 1.0;
}

/* One block per row: rstd, c = mean(xhat * g), A = mean |xhat * g|. */
__global__ void row_kernel(Ref r)
{
    __shared__ double sh[3][256];
    for (int64_t i = blockIdx.x; i < r.m; i += gridDim.x) {
        double ss = 0, sc = 0, sa = 0;
        for (int64_t j = threadIdx.x; j < r.n; j += blockDim.x) {
            double x = ld64(r.x_dt, r.x, i * r.xs + j);
            ss += x * x;
        }
        sh[0][threadIdx.x] = ss;
        __syncthreads();
        for (int s = blockDim.x / 2; s > 0; s >>= 1) {
            if ((int)threadIdx.x < s)
                sh[0][threadIdx.x] += sh[0][threadIdx.x + s];
            __syncthreads();
        }
        double rstd = r.rstd ? (double)r.rstd[i] : 1.0 / sqrt(sh[0][0] / (double)r.n + r.eps);
        for (int64_t j = threadIdx.x; j < r.n; j += blockDim.x) {
            double p = ld64(r.x_dt, r.x, i * r.xs + j) * rstd * ld64(r.dy_dt, r.dy, i * r.dys + j) *
                       gfac(r, j);
            sc += p;
            sa += fabs(p);
        }
        __syncthreads();
        sh[1][threadIdx.x] = sc;
        sh[2][threadIdx.x] = sa;
        __syncthreads();
        for (int s = blockDim.x / 2; s > 0; s >>= 1) {
            if ((int)threadIdx.x < s) {
                sh[1][threadIdx.x] += sh[1][threadIdx.x + s];
                sh[2][threadIdx.x] += sh[2][threadIdx.x + s];
            }
            __syncthreads();
        }
        if (threadIdx.x == 0) {
            r.row[i * 3 + 0] = rstd;
            r.row[i * 3 + 1] = sh[1][0] / (double)r.n;
            r.row[i * 3 + 2] = sh[2][0] / (double)r.n;
        }
        __syncthreads();
    }
}

/* Reference dx of element (i, j), and the cancellation floor's scale. */
__device__ double ref_dx(const Ref &r, int64_t i, int64_t j, double *scale)
{
    double rstd = r.row[i * 3], c = r.row[i * 3 + 1], A = r.row[i * 3 + 2];
    double xh = ld64(r.x_dt, r.x, i * r.xs + j) * rstd;
    double g = ld64(r.dy_dt, r.dy, i * r.dys + j) * gfac(r, j);
    double d = rstd * (g - xh * c);
    *scale = fabs(rstd) * (fabs(g) + fabs(xh) * (fabs(c) + A));
    if (r.dres) {
        double dr = ld64(r.dr_dt, r.dres, i * r.drs + j);
        d += dr;
        *scale += fabs(dr);
    }
    return d;
}

__global__ void dx_ref_kernel(Ref r, double *out)
{
    int64_t total = r.m * r.n;
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < total;
         e += (int64_t)gridDim.x * blockDim.x) {
        double s;
        out[e] = ref_dx(r, e / r.n, e % r.n, &s);
    }
}

/* One thread per column, rows in order: dw_j and sum |dy * xhat|. */
__global__ void dw_ref_kernel(Ref r, double *dw, double *dwabs)
{
    for (int64_t j = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; j < r.n;
         j += (int64_t)gridDim.x * blockDim.x) {
        double s = 0, sa = 0;
        for (int64_t i = 0; i < r.m; i++) {
            double p = ld64(r.dy_dt, r.dy, i * r.dys + j) * ld64(r.x_dt, r.x, i * r.xs + j) *
                       r.row[i * 3];
            s += p;
            sa += fabs(p);
        }
        dw[j] = s;
        if (dwabs)
            dwabs[j] = sa;
    }
}

struct Counts {
    unsigned long long count, nonfinite, over1, over2, maxulp;
    double e2, r2;
};

__device__ uint16_t bits16(int dt, const void *p, int64_t i)
{
    return ((const uint16_t *)p)[i];
}

__device__ uint16_t round16(int dt, double v)
{
    if (dt == RNK_BF16) {
        __nv_bfloat16 h = __double2bfloat16(v);
        return *reinterpret_cast<uint16_t *>(&h);
    }
    __half h = __double2half(v);
    return *reinterpret_cast<uint16_t *>(&h);
}

__device__ long long ord16(uint16_t h)
{
    long long mag = h & 0x7fff;
    return (h & 0x8000) ? -mag : mag;
}

__global__ void judge_kernel(Ref r, Counts *out)
{
    Counts c = {0, 0, 0, 0, 0, 0.0, 0.0};
    const double u24 = 5.9604644775390625e-08; /* 2^-24 */
    int64_t total = r.m * r.n;
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < total;
         e += (int64_t)gridDim.x * blockDim.x) {
        int64_t i = e / r.n, j = e % r.n;
        double scale;
        double ref = ref_dx(r, i, j, &scale);
        double slack = 64.0 * u24 * scale;
        double got = ld64(r.dx_dt, r.dx, i * r.dxs + j);
        c.count++;
        if (!isfinite(got) && isfinite(ref)) {
            c.nonfinite++;
            continue;
        }
        double err = fabs(got - ref);
        double ex = err > slack ? err - slack : 0.0;
        c.e2 += ex * ex;
        c.r2 += ref * ref;
        if (r.dx_dt != RNK_F32) {
            long long u = ord16(bits16(r.dx_dt, r.dx, i * r.dxs + j)) - ord16(round16(r.dx_dt, ref));
            if (u < 0)
                u = -u;
            if ((unsigned long long)u > c.maxulp)
                c.maxulp = (unsigned long long)u;
            if (err > slack) {
                c.over1 += u > 1;
                c.over2 += u > 2;
            }
        }
    }
    atomicAdd(&out->count, c.count);
    atomicAdd(&out->nonfinite, c.nonfinite);
    atomicAdd(&out->over1, c.over1);
    atomicAdd(&out->over2, c.over2);
    atomicMax(&out->maxulp, c.maxulp);
    atomicAdd(&out->e2, c.e2);
    atomicAdd(&out->r2, c.r2);
}

Ref make_ref(const rnk_bwd_args *a, double *row)
{
    Ref r;
    r.x = a->x;
    r.dy = a->dy;
    r.w = a->w_dtype != RNK_NONE ? a->w : nullptr;
    r.dres = a->dres_dtype != RNK_NONE ? a->dres : nullptr;
    r.dx = a->dx;
    r.rstd = a->rstd;
    r.m = a->m;
    r.n = a->n;
    r.xs = a->x_stride;
    r.dys = a->dy_stride;
    r.dxs = a->dx_stride;
    r.drs = a->dres_stride;
    r.x_dt = a->x_dtype;
    r.dy_dt = a->dy_dtype;
    r.w_dt = a->w_dtype;
    r.dr_dt = a->dres_dtype;
    r.dx_dt = a->dx_dtype;
    r.eps = a->eps;
    r.offset = a->weight_offset;
    r.row = row;
    return r;
}

} /* namespace */

extern "C" int rnk_cuda_ref64(const rnk_bwd_args *a, double *dx_ref, double *dw_ref, void *stream,
                              char *msg, size_t msglen)
{
    int rc = rnk_check_args(a, msg, msglen);
    double *row = nullptr;
    cudaStream_t st = (cudaStream_t)stream;
    if (rc || a->m == 0)
        return rc;
    RCK(cudaMallocAsync((void **)&row, (size_t)a->m * 3 * sizeof(double), st));
    {
        Ref r = make_ref(a, row);
        row_kernel<<<(unsigned)(a->m < 65535 ? a->m : 65535), 256, 0, st>>>(r);
        RCK(cudaGetLastError());
        if (dx_ref) {
            dx_ref_kernel<<<4096, 256, 0, st>>>(r, dx_ref);
            RCK(cudaGetLastError());
        }
        if (dw_ref) {
            dw_ref_kernel<<<(unsigned)((a->n + 255) / 256), 256, 0, st>>>(r, dw_ref, nullptr);
            RCK(cudaGetLastError());
        }
    }
    RCK(cudaStreamSynchronize(st));
out:
    if (row)
        cudaFreeAsync(row, st);
    return rc;
}

extern "C" int rnk_cuda_verify(const rnk_bwd_args *a, void *stream, rnk_verdict *v, char *msg,
                               size_t msglen)
{
    int rc = rnk_check_args(a, msg, msglen);
    cudaStream_t st = (cudaStream_t)stream;
    double *row = nullptr, *dwr = nullptr, *dwa = nullptr;
    double *h_dwr = nullptr, *h_dwa = nullptr;
    void *h_dw = nullptr;
    Counts *cnt = nullptr, hc;
    rnk_verdict res;
    if (rc)
        return rc;
    memset(&res, 0, sizeof res);
    if (a->m == 0) {
        res.ok = 1;
        *v = res;
        return RNK_OK;
    }
    RCK(cudaMallocAsync((void **)&row, (size_t)a->m * 3 * sizeof(double), st));
    RCK(cudaMallocAsync((void **)&cnt, sizeof(Counts), st));
    RCK(cudaMemsetAsync(cnt, 0, sizeof(Counts), st));
    {
        Ref r = make_ref(a, row);
        row_kernel<<<(unsigned)(a->m < 65535 ? a->m : 65535), 256, 0, st>>>(r);
        RCK(cudaGetLastError());
        judge_kernel<<<132 * 16, 256, 0, st>>>(r, cnt);
        RCK(cudaGetLastError());
        RCK(cudaMemcpyAsync(&hc, cnt, sizeof hc, cudaMemcpyDeviceToHost, st));
        if (a->dw_dtype != RNK_NONE) {
            size_t nb = (size_t)a->n * sizeof(double);
            RCK(cudaMallocAsync((void **)&dwr, nb, st));
            RCK(cudaMallocAsync((void **)&dwa, nb, st));
            dw_ref_kernel<<<(unsigned)((a->n + 127) / 128), 128, 0, st>>>(r, dwr, dwa);
            RCK(cudaGetLastError());
            h_dwr = (double *)malloc(nb);
            h_dwa = (double *)malloc(nb);
            h_dw = malloc((size_t)a->n * rnk_dtype_size(a->dw_dtype));
            if (!h_dwr || !h_dwa || !h_dw) {
                rc = RNK_ENOMEM;
                goto out;
            }
            RCK(cudaMemcpyAsync(h_dwr, dwr, nb, cudaMemcpyDeviceToHost, st));
            RCK(cudaMemcpyAsync(h_dwa, dwa, nb, cudaMemcpyDeviceToHost, st));
            RCK(cudaMemcpyAsync(h_dw, a->dw, (size_t)a->n * rnk_dtype_size(a->dw_dtype),
                                cudaMemcpyDeviceToHost, st));
        }
        RCK(cudaStreamSynchronize(st));
    }
    res.dx_count = (int64_t)hc.count;
    res.dx_nonfinite = (int64_t)hc.nonfinite;
    res.dx_over1 = (int64_t)hc.over1;
    res.dx_over2 = (int64_t)hc.over2;
    res.dx_max_ulp = (double)hc.maxulp;
    res.dx_rel = hc.r2 > 0 ? sqrt(hc.e2 / hc.r2) : sqrt(hc.e2);
    rnk_judge(a, &res, h_dw, h_dwr, h_dwa);
    *v = res;
out:
    if (row)
        cudaFreeAsync(row, st);
    if (cnt)
        cudaFreeAsync(cnt, st);
    if (dwr)
        cudaFreeAsync(dwr, st);
    if (dwa)
        cudaFreeAsync(dwa, st);
    free(h_dwr);
    free(h_dwa);
    free(h_dw);
    return rc;
}

/* ---- more test helpers: random inputs, rstd, an SM hog ------------------- */

namespace {

__device__ uint64_t mix64(uint64_t z)
{
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Roughly normal (sum of four uniforms), never a constant pattern. */
__global__ void fill_kernel(int dt, void *p, int64_t rows, int64_t cols, int64_t stride,
                            uint64_t seed, float scale, float bias)
{
    int64_t total = rows * cols;
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < total;
         e += (int64_t)gridDim.x * blockDim.x) {
        int64_t i = e / cols, j = e % cols;
        uint64_t h = mix64(seed ^ mix64((uint64_t)e));
        float s = 0.0f;
        for (int k = 0; k < 4; k++)
            s += (float)((h >> (16 * k)) & 0xffff) * (1.0f / 32768.0f) - 1.0f;
        float v = bias + scale * 0.8660254f * s;
        int64_t o = i * stride + j;
        if (dt == RNK_F32)
            ((float *)p)[o] = v;
        else if (dt == RNK_BF16)
            ((__nv_bfloat16 *)p)[o] = __float2bfloat16_rn(v);
        else
            ((__half *)p)[o] = __float2half_rn(v);
    }
}

__global__ void rstd_kernel(int dt, const void *x, int64_t m, int64_t n, int64_t xs, double eps,
                            float *out)
{
    __shared__ double sh[256];
    for (int64_t i = blockIdx.x; i < m; i += gridDim.x) {
        double ss = 0;
        for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
            double v = ld64(dt, x, i * xs + j);
            ss += v * v;
        }
        sh[threadIdx.x] = ss;
        __syncthreads();
        for (int s = blockDim.x / 2; s > 0; s >>= 1) {
            if ((int)threadIdx.x < s)
                sh[threadIdx.x] += sh[threadIdx.x + s];
            __syncthreads();
        }
        if (threadIdx.x == 0)
            out[i] = (float)(1.0 / sqrt(sh[0] / (double)n + eps));
        __syncthreads();
    }
}

/* Spin until *stop is non-zero or timeout_ns passes; block 0 reports that it
 * started through *started.  Launched with a whole SM's shared memory, so
 * each block holds one SM. */
__global__ void hog_kernel(const volatile int *stop, volatile int *started, uint64_t timeout_ns)
{
    extern __shared__ int hog_smem[];
    uint64_t t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    if (threadIdx.x == 0) {
        hog_smem[0] = 1;
        if (blockIdx.x == 0)
            *started = 1;
    }
    for (;;) {
        if (*stop)
            break;
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
        if (t - t0 > timeout_ns)
            break;
        __nanosleep(1000);
    }
}

} /* namespace */

extern "C" int rnk_cuda_fill(rnk_dtype dt, void *p, int64_t rows, int64_t cols, int64_t stride,
                             uint64_t seed, float scale, float bias, void *stream, char *msg,
                             size_t msglen)
{
    int rc = RNK_OK;
    if (rows <= 0 || cols <= 0)
        return RNK_OK;
    fill_kernel<<<132 * 8, 256, 0, (cudaStream_t)stream>>>((int)dt, p, rows, cols, stride, seed,
                                                             scale, bias);
    RCK(cudaGetLastError());
out:
    return rc;
}

extern "C" int rnk_cuda_rstd(rnk_dtype dt, const void *x, int64_t m, int64_t n, int64_t stride,
                             float eps, float *out_rstd, void *stream, char *msg, size_t msglen)
{
    int rc = RNK_OK;
    if (m <= 0)
        return RNK_OK;
    rstd_kernel<<<(unsigned)(m < 65535 ? m : 65535), 256, 0, (cudaStream_t)stream>>>(
        (int)dt, x, m, n, stride, (double)eps, out_rstd);
    RCK(cudaGetLastError());
out:
    return rc;
}

extern "C" int rnk_cuda_hog(int blocks, const int *stop, int *started, unsigned timeout_ms,
                            void *stream, char *msg, size_t msglen)
{
    int rc = RNK_OK, dev = 0, smem = 0;
    RCK(cudaGetDevice(&dev));
    RCK(cudaDeviceGetAttribute(&smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    RCK(cudaFuncSetAttribute((const void *)hog_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             smem));
    hog_kernel<<<blocks, 32, smem, (cudaStream_t)stream>>>(stop, started,
                                                           (uint64_t)timeout_ms * 1000000ull);
    RCK(cudaGetLastError());
out:
    return rc;
}
