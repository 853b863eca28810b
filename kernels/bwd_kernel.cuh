/*
 * bwd_kernel.cuh - device code of the fused, deterministic RMSNorm backward
 * kernel, shared by the production entry point (cuda_bwd.cu) and the
 * benchmark-only variants (cuda_variants.cu).  C++ templates; nothing here is
 * visible through rnk.h.
 *
 * One launch does everything:
 *   1. blocks claim chunks of C = rnk_chunk_rows(m, n) rows from an atomic
 *      counter; a block works on G = rnk_chunk_stripes(n) rows at once (one
 *      stripe each), writes dx, and keeps fp32 dw sums per stripe in
 *      registers (fast path: rows arrive through a ring of STAGES row slots
 *      in shared memory, filled with cp.async STAGES - 1 rows ahead) or in
 *      the chunk's workspace slots (general path); at the chunk's end it adds
 *      the stripes in order into the chunk's partial row and bumps a "done"
 *      counter (release);
 *   2. a block that finds no chunk left waits (acquire) until done ==
 *      nchunks.  This cannot deadlock however few blocks are resident: every
 *      claimed chunk belongs to a block that is already running and never
 *      waits before finishing it;
 *   3. blocks take 32-column slices and add the partials of each column in
 *      rnk.h's fixed two-level order (groups of RNK_DW_GROUP chunks in
 *      parallel, then the groups), rounding once to dw's dtype;
 *   4. the last block to exit resets every counter to zero, so the next
 *      launch (or a graph replay) starts clean without a memset.
 * dx and dw are bitwise deterministic and dw does not depend on the grid:
 * every sum has a fixed order (rnk.h documents dw's; the row reductions use a
 * fixed shuffle tree, then warps in order).
 */
#ifndef RNK_BWD_KERNEL_CUH
#define RNK_BWD_KERNEL_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "rnk.h"

namespace rnk {

enum Mode {
    MODE_FUSED = 0,         /* production: deterministic, one launch */
    MODE_PARTIALS_ONLY = 1, /* benchmark "separate": a second kernel finishes dw */
    MODE_ATOMIC = 2,        /* benchmark "fused non-deterministic": fp32 atomics */
};

/* Counter words, each on its own 128-byte line of the workspace header. */
enum { CTR_CLAIM = 0, CTR_DONE = 32, CTR_SLICE = 64, CTR_EXIT = 96, CTR_WORDS = 128 };
enum { FIN_COLS = 32 };
static constexpr size_t WS_HEADER = CTR_WORDS * 4;

struct Params {
    const void *x, *dy, *w, *dres;
    void *dx, *dw;
    const float *rstd;
    int64_t m, n, xs, dys, dxs, drs;
    int x_dt, dy_dt, dx_dt, w_dt, dr_dt, dw_dt;
    float eps, offset;
    int64_t C;        /* rows per chunk */
    int nchunks, G, tpr, nslices;
    int64_t pst;      /* floats per stripe slot (n rounded up to 4) */
    int64_t cs;       /* floats per chunk: G * pst */
    unsigned *ctr;    /* workspace header */
    float *part;      /* chunk k, stripe slot g at part + k * cs + g * pst */
    float *acc;       /* MODE_ATOMIC: fp32 accumulator [n], zero between launches */
};

/* ---- element access ------------------------------------------------------ */

__device__ __forceinline__ float ld_any(int dt, const void *p, int64_t i)
{
    if (dt == RNK_F32)
        return ((const float *)p)[i];
    if (dt == RNK_BF16)
        return __bfloat162float(((const __nv_bfloat16 *)p)[i]);
    return __half2float(((const __half *)p)[i]);
}

__device__ __forceinline__ void st_any(int dt, void *p, int64_t i, float v)
{
    if (dt == RNK_F32)
        ((float *)p)[i] = v;
    else if (dt == RNK_BF16)
        ((__nv_bfloat16 *)p)[i] = __float2bfloat16_rn(v);
    else
        ((__half *)p)[i] = __float2half_rn(v);
}

template <class T> struct Vec;
template <> struct Vec<float> {
    static constexpr int N = 4;
    static constexpr int DT = RNK_F32;
    static __device__ __forceinline__ void unpack(const uint4 &u, float (&f)[4])
    {
        f[0] = __uint_as_float(u.x);
        f[1] = __uint_as_float(u.y);
        f[2] = __uint_as_float(u.z);
        f[3] = __uint_as_float(u.w);
    }
    static __device__ __forceinline__ uint4 pack(const float (&f)[4])
    {
        return make_uint4(__float_as_uint(f[0]), __float_as_uint(f[1]), __float_as_uint(f[2]),
                          __float_as_uint(f[3]));
    }
};
template <> struct Vec<__nv_bfloat16> {
    static constexpr int N = 8;
    static constexpr int DT = RNK_BF16;
    static __device__ __forceinline__ void unpack(const uint4 &u, float (&f)[8])
    {
        const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            f[2 * i] = __uint_as_float(w[i] << 16);
            f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
        }
    }
    static __device__ __forceinline__ uint32_t pk2(float a, float b)
    {
        __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
        return *reinterpret_cast<uint32_t *>(&h);
    }
    static __device__ __forceinline__ uint4 pack(const float (&f)[8])
    {
        return make_uint4(pk2(f[0], f[1]), pk2(f[2], f[3]), pk2(f[4], f[5]), pk2(f[6], f[7]));
    }
};
template <> struct Vec<__half> {
    static constexpr int N = 8;
    static constexpr int DT = RNK_F16;
    static __device__ __forceinline__ void unpack(const uint4 &u, float (&f)[8])
    {
        const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            __half2 h = *reinterpret_cast<const __half2 *>(&w[i]);
            float2 v = __half22float2(h);
            f[2 * i] = v.x;
            f[2 * i + 1] = v.y;
        }
    }
    static __device__ __forceinline__ uint32_t pk2(float a, float b)
    {
        __half2 h = __floats2half2_rn(a, b);
        return *reinterpret_cast<uint32_t *>(&h);
    }
    static __device__ __forceinline__ uint4 pack(const float (&f)[8])
    {
        return make_uint4(pk2(f[0], f[1]), pk2(f[2], f[3]), pk2(f[4], f[5]), pk2(f[6], f[7]));
    }
};

/* Streaming loads and stores: every byte is touched once. Plain (coherent)
 * loads, not the read-only path: dx may alias dy. */
__device__ __forceinline__ uint4 ld16(const void *p)
{
    return __ldcs(reinterpret_cast<const uint4 *>(p));
}
__device__ __forceinline__ void st16(void *p, uint4 v)
{
    __stcs(reinterpret_cast<uint4 *>(p), v);
}

__device__ __forceinline__ unsigned ld_acquire(const unsigned *p)
{
    unsigned v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

/* Asynchronous 16-byte copies, global to shared (sm_80 and later). */
__device__ __forceinline__ void cp_async16(void *sdst, const void *gsrc)
{
    const unsigned s = (unsigned)__cvta_generic_to_shared(sdst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(s), "l"(gsrc) : "memory");
}
__device__ __forceinline__ void cp_async_commit()
{
    asm volatile("cp.async.commit_group;" ::: "memory");
}
template <int N> __device__ __forceinline__ void cp_async_wait()
{
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

/*
 * Sum (a, b) over the tpr threads of stripe g in a fixed order: a shuffle
 * tree inside each warp, then the stripe's warps in order.  When a stripe
 * spans several warps the whole block meets at one barrier per row (all
 * stripes step through their rows in lockstep, so the count always matches);
 * red is [2][32][2] floats, double-buffered by parity so one barrier per row
 * does.
 */
__device__ __forceinline__ void stripe_sum2(float &a, float &b, int g, int tpr, int parity,
                                            float (*red)[32][2])
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        a += __shfl_xor_sync(0xffffffffu, a, o);
        b += __shfl_xor_sync(0xffffffffu, b, o);
    }
    if (tpr > 32) {
        const int warp = threadIdx.x >> 5, w0 = (g * tpr) >> 5, nw = tpr >> 5;
        if ((threadIdx.x & 31) == 0) {
            red[parity][warp][0] = a;
            red[parity][warp][1] = b;
        }
        /* The whole block meets (stripes step in lockstep).  Barrier 1 and
         * __syncthreads' barrier 0 measured the same on the H200. */
        asm volatile("bar.sync 1, %0;" ::"r"(blockDim.x) : "memory");
        a = 0.0f;
        b = 0.0f;
        for (int i = 0; i < nw; i++) {
            a += red[parity][w0 + i][0];
            b += red[parity][w0 + i][1];
        }
    }
}

/* ---- shared phases ----------------------------------------------------- */

/*
 * Publish a chunk's partial: the barrier orders every thread's writes before
 * thread 0's fence, which makes them visible before the "done" bump (the
 * pattern of a cooperative grid barrier, without its residency requirement).
 */
__device__ __forceinline__ void publish_chunk(const Params &p)
{
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        atomicAdd(&p.ctr[CTR_DONE], 1u);
    }
}

/*
 * Chunk claims.  Thread 0 asks for the block's next chunk as soon as it
 * starts on the current one, so the atomic's round trip hides behind the
 * chunk's loads; the answer goes to one of two shared slots (by parity), so a
 * slot is never rewritten while a thread may still read it.  A claimed chunk
 * always belongs to a running block: that is what makes waiting safe.
 */
__device__ __forceinline__ unsigned claim_issue(const Params &p)
{
    return threadIdx.x == 0 ? atomicAdd(&p.ctr[CTR_CLAIM], 1u) : 0u;
}

/*
 * Finish 32 columns [sl*32, sl*32+32): stage up to 256 chunks' partials at a
 * time in shared memory (cp.async, all in flight at once); each warp adds whole
 * groups of RNK_DW_GROUP partials in chunk order, then warp 0 adds the group
 * sums in order (rnk.h's two-level order); round once at the end.
 * tile: 256 * 32 floats.
 */
static_assert(256 % RNK_DW_GROUP == 0, "a staged batch holds whole groups");
__device__ __forceinline__ void finish_slice(const Params &p, int sl, float *tile)
{
    __shared__ float gsum[256 / RNK_DW_GROUP][FIN_COLS];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    const int64_t col = (int64_t)sl * FIN_COLS + lane;
    const bool ok = col < p.n;
    float d = 0.0f;
    for (int base = 0; base < p.nchunks; base += 256) {
        const int cnt = p.nchunks - base < 256 ? p.nchunks - base : 256;
        /* 8 copies of 16 bytes per chunk, all in flight at once; columns
         * past n are left as they are and never stored. */
        for (int it = threadIdx.x; it < cnt * 8; it += blockDim.x) {
            const int k = it >> 3, q = it & 7;
            const int64_t c0 = (int64_t)sl * FIN_COLS + 4 * q;
            if (c0 < p.n)
                cp_async16(tile + k * FIN_COLS + 4 * q, p.part + (int64_t)(base + k) * p.cs + c0);
        }
        cp_async_commit();
        cp_async_wait<0>();
        __syncthreads();
        const int ng = (cnt + RNK_DW_GROUP - 1) / RNK_DW_GROUP;
        for (int q = warp; q < ng; q += nw) {
            const int k1 = (q + 1) * RNK_DW_GROUP < cnt ? (q + 1) * RNK_DW_GROUP : cnt;
            float gs = 0.0f;
            for (int k = q * RNK_DW_GROUP; k < k1; k++)
                gs = __fadd_rn(gs, tile[k * FIN_COLS + lane]);
            gsum[q][lane] = gs;
        }
        __syncthreads();
        if (warp == 0) {
            for (int q = 0; q < ng; q++)
                d = __fadd_rn(d, gsum[q][lane]);
        }
        __syncthreads();
    }
    if (warp == 0 && ok)
        st_any(p.dw_dt, p.dw, col, d);
}

/* Steps 2-4 of the fused launch.  Slices are dealt to blocks statically:
 * once every chunk is done nothing waits any more, so a block that starts
 * late still finishes its slices. */
__device__ __forceinline__ void finish_and_exit(const Params &p, float *tile, bool fused)
{
    if (fused && p.dw) {
        if (threadIdx.x == 0) {
            while (ld_acquire(&p.ctr[CTR_DONE]) < (unsigned)p.nchunks)
                __nanosleep(64);
            __threadfence();
        }
        __syncthreads();
        for (int sl = blockIdx.x; sl < p.nslices; sl += gridDim.x)
            finish_slice(p, sl, tile);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        unsigned prev = atomicAdd(&p.ctr[CTR_EXIT], 1u);
        if (prev == gridDim.x - 1) {
            /* Everyone else has exited its claim loops: nothing reads the
             * counters any more in this launch. */
            atomicExch(&p.ctr[CTR_CLAIM], 0u);
            atomicExch(&p.ctr[CTR_DONE], 0u);
            atomicExch(&p.ctr[CTR_SLICE], 0u);
            __threadfence();
            atomicExch(&p.ctr[CTR_EXIT], 0u);
        }
    }
}

/* MODE_ATOMIC: after a chunk, the block that completed the last chunk
 * converts the fp32 accumulator to dw and zeroes it for the next launch. */
__device__ __forceinline__ void atomic_tail(const Params &p, int *s_last)
{
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        *s_last = (int)atomicAdd(&p.ctr[CTR_DONE], 1u);
    }
    __syncthreads();
    if (*s_last == p.nchunks - 1) {
        __threadfence();
        for (int64_t j = threadIdx.x; j < p.n; j += blockDim.x) {
            st_any(p.dw_dt, p.dw, j, __ldcg(p.acc + j));
            p.acc[j] = 0.0f;
        }
    }
    __syncthreads();
}

/* ---- the fast path: aligned rows of one dtype, staged in shared memory ---- */

template <int VEC>
__device__ __forceinline__ void load_w(const float *w, float (&out)[VEC])
{
#pragma unroll
    for (int e = 0; e < VEC; e += 4) {
        float4 q = *reinterpret_cast<const float4 *>(w + e);
        out[e] = q.x;
        out[e + 1] = q.y;
        out[e + 2] = q.z;
        out[e + 3] = q.w;
    }
}

/*
 * Rows reach the block through a ring of STAGES row slots in shared memory,
 * filled with cp.async (16 bytes per copy, L2 only): STAGES - 1 rows of each
 * stripe are in flight while one is reduced, and the bytes in flight cost no
 * registers.  Each thread copies, and later reads, only its own vectors of a
 * row (slot j of stage s at ring[(s * 2 * NV + j) * blockDim.x + tid]: x's
 * vectors are j < NV, dy's j >= NV), so cp.async.wait_group alone orders the
 * copy before the read; no barrier is needed for the ring.
 */
#ifndef RNK_STAGES
#define RNK_STAGES 3
#endif
enum { STAGES = RNK_STAGES };
static_assert(STAGES >= 2 && STAGES <= 8, "RNK_STAGES: 2 to 8");

/* Start copying one row's vectors of x and dy into a stage. */
template <class T, int NV>
__device__ __forceinline__ void stage_row(const Params &p, int64_t r, const int64_t (&col)[NV],
                                          const bool (&ok)[NV], uint4 *stage)
{
#pragma unroll
    for (int v = 0; v < NV; v++) {
        if (ok[v]) {
            cp_async16(stage + v * blockDim.x + threadIdx.x, (const T *)p.x + r * p.xs + col[v]);
            cp_async16(stage + (NV + v) * blockDim.x + threadIdx.x,
                       (const T *)p.dy + r * p.dys + col[v]);
        }
    }
}

/* One row of a stripe: the two row sums, rstd and c, then dx and dw's sums. */
template <class T, int NV>
__device__ __forceinline__ void process_row(const Params &p, int64_t r, bool valid, int parity, int g,
                                            const int64_t (&col)[NV], const bool (&ok)[NV],
                                            const uint4 (&bx)[NV], const uint4 (&by)[NV], float rs,
                                            const float *wsm, float (&acc)[NV][Vec<T>::N],
                                            float (*red)[32][2])
{
    constexpr int VEC = Vec<T>::N;
    float s1 = 0.0f, s2 = 0.0f;
#pragma unroll
    for (int v = 0; v < NV; v++) {
        if (valid && ok[v]) {
            float xf[VEC], yf[VEC], wv[VEC];
            Vec<T>::unpack(bx[v], xf);
            Vec<T>::unpack(by[v], yf);
            load_w<VEC>(wsm + col[v], wv);
#pragma unroll
            for (int e = 0; e < VEC; e++) {
                s1 += xf[e] * xf[e];
                s2 += xf[e] * (yf[e] * wv[e]);
            }
        }
    }
    stripe_sum2(s1, s2, g, p.tpr, parity, red);
    if (!valid)
        return;
    const float rstd = p.rstd ? rs : 1.0f / sqrtf(s1 / (float)p.n + p.eps);
    const float c = rstd * (s2 / (float)p.n);
#pragma unroll
    for (int v = 0; v < NV; v++) {
        if (ok[v]) {
            float xf[VEC], yf[VEC], rf[VEC], d[VEC], wv[VEC];
            Vec<T>::unpack(bx[v], xf);
            Vec<T>::unpack(by[v], yf);
            load_w<VEC>(wsm + col[v], wv);
            if (p.dres)
                Vec<T>::unpack(ld16((const T *)p.dres + r * p.drs + col[v]), rf);
#pragma unroll
            for (int e = 0; e < VEC; e++) {
                const float xh = __fmul_rn(xf[e], rstd);
                const float gg = yf[e] * wv[e];
                d[e] = rstd * (gg - xh * c);
                if (p.dres)
                    d[e] += rf[e];
                acc[v][e] = __fadd_rn(acc[v][e], __fmul_rn(yf[e], xh));
            }
            st16((T *)p.dx + r * p.dxs + col[v], Vec<T>::pack(d));
        }
    }
}

/*
 * Block shapes (measured on the H200, bench/RESULTS.md): a one-vector block
 * (NV = 1) of up to 512 threads when it covers several rows (G > 1), which
 * doubles the bytes in flight per SM over 256 at N = 1024; but at most 256
 * over a single row (G = 1), where 512 threads of one vector were 20 % slower
 * than 256 threads of two (N = 4096).  64 registers per thread either way.
 */
#ifndef RNK_NV1_THREADS
#define RNK_NV1_THREADS 512 /* most threads of a one-vector block */
#endif
#ifndef RNK_NV1_THREADS_G1
#define RNK_NV1_THREADS_G1 256 /* the same, when the block covers one row (G = 1) */
#endif
#ifndef RNK_NV1_MINB
#define RNK_NV1_MINB 4 /* blocks of 256 threads per SM the registers must allow */
#endif
template <class T, class TW, int NV, int MODE>
__global__ void __launch_bounds__(NV == 1 ? RNK_NV1_THREADS : 512,
                                  NV == 1 ? RNK_NV1_MINB * 256 / RNK_NV1_THREADS : 1)
fast_kernel(Params p)
{
    constexpr int VEC = Vec<T>::N;
    extern __shared__ float smem[];
    __shared__ float red[2][32][2];
    __shared__ int s_claim[2], s_last;
    const int tpr = p.tpr, G = p.G;
    const int g = threadIdx.x / tpr, lt = threadIdx.x - g * tpr;
    const int64_t n = p.n;
    const bool want_dw = p.dw != nullptr;

    unsigned nxt = claim_issue(p); /* overlaps the weight staging below */
    /* w + weight_offset in shared memory (1 without a weight): registers
     * are kept for rows in flight. */
    float *wsm = smem, *work = smem + p.pst; /* work: the ring, or comb / tile */
    uint4 *ring = reinterpret_cast<uint4 *>(work);
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x)
        wsm[j] = p.w ? ld_any(Vec<TW>::DT, p.w, j) + p.offset : 1.0f;
    if (threadIdx.x == 0)
        s_claim[0] = (int)nxt;
    __syncthreads();
    int64_t col[NV];
    bool ok[NV];
#pragma unroll
    for (int v = 0; v < NV; v++) {
        col[v] = ((int64_t)v * tpr + lt) * VEC;
        ok[v] = col[v] < n;
    }

    int it = 0;
    for (int k = s_claim[0]; k < p.nchunks; it++, k = s_claim[it & 1]) {
        nxt = claim_issue(p);
        const int64_t r0 = (int64_t)k * p.C;
        const int64_t r1 = r0 + p.C < p.m ? r0 + p.C : p.m;
        float acc[NV][VEC];
#pragma unroll
        for (int v = 0; v < NV; v++)
#pragma unroll
            for (int e = 0; e < VEC; e++)
                acc[v][e] = 0.0f;

        /* STAGES - 1 rows of the stripe in flight (see stage_row).  Stripes
         * step in lockstep (a stripe past the chunk's end joins the barriers
         * with no row).  One commit group per step, empty or not, so that
         * wait_group<STAGES - 1> always means "this step's row is here".
         * rstd is prefetched as far ahead, in registers (rsq[0]: this step). */
        const int64_t steps = (r1 - r0 + G - 1) / G;
        const int64_t rg = r0 + g;
        const int slot = 2 * NV * (int)blockDim.x;
        float rsq[STAGES];
#pragma unroll
        for (int i = 0; i < STAGES; i++)
            rsq[i] = 0.0f;
#pragma unroll
        for (int i = 0; i < STAGES - 1; i++) {
            const int64_t r = rg + (int64_t)i * G;
            if (i < steps && r < r1) {
                stage_row<T, NV>(p, r, col, ok, ring + i * slot);
                if (p.rstd)
                    rsq[i] = __ldg(p.rstd + r);
            }
            cp_async_commit();
        }
        int sa = STAGES - 1, sc = 0; /* stage being filled, being read */
        for (int64_t t = 0; t < steps; t++) {
            const int64_t ta = t + STAGES - 1, ra = rg + ta * G;
            if (ta < steps && ra < r1) {
                stage_row<T, NV>(p, ra, col, ok, ring + sa * slot);
                if (p.rstd)
                    rsq[STAGES - 1] = __ldg(p.rstd + ra);
            }
            cp_async_commit();
            cp_async_wait<STAGES - 1>();
            const int64_t r = rg + t * G;
            const uint4 *st = ring + sc * slot + threadIdx.x;
            sa = sa + 1 == STAGES ? 0 : sa + 1;
            sc = sc + 1 == STAGES ? 0 : sc + 1;
            uint4 cx[NV], cy[NV];
#pragma unroll
            for (int v = 0; v < NV; v++) {
                cx[v] = ok[v] && r < r1 ? st[v * blockDim.x] : make_uint4(0, 0, 0, 0);
                cy[v] = ok[v] && r < r1 ? st[(NV + v) * blockDim.x] : make_uint4(0, 0, 0, 0);
            }
            process_row<T, NV>(p, r, r < r1, (int)(t & 1), g, col, ok, cx, cy, rsq[0], wsm, acc, red);
#pragma unroll
            for (int i = 0; i < STAGES - 1; i++)
                rsq[i] = rsq[i + 1];
        }
        cp_async_wait<0>();

        if (threadIdx.x == 0)
            s_claim[(it + 1) & 1] = (int)nxt;
        if (!want_dw) {
            __syncthreads();
            continue;
        }
        float *part = p.part + (int64_t)k * p.cs;
        if (G == 1 && MODE != MODE_ATOMIC) {
            /* p = +0.0f + stripe_0, exactly as the documented order says */
#pragma unroll
            for (int v = 0; v < NV; v++) {
                if (ok[v]) {
#pragma unroll
                    for (int e = 0; e < VEC; e += 4)
                        __stcg(reinterpret_cast<float4 *>(part + col[v] + e),
                               make_float4(__fadd_rn(0.0f, acc[v][e]), __fadd_rn(0.0f, acc[v][e + 1]),
                                           __fadd_rn(0.0f, acc[v][e + 2]),
                                           __fadd_rn(0.0f, acc[v][e + 3])));
                }
            }
        } else {
            float *comb = work; /* [G][n], over the ring: wait until every
                                 * thread has read its last row from it */
            __syncthreads();
#pragma unroll
            for (int v = 0; v < NV; v++)
                if (ok[v])
#pragma unroll
                    for (int e = 0; e < VEC; e++)
                        comb[g * n + col[v] + e] = acc[v][e];
            __syncthreads();
            for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
                float s = 0.0f;
                for (int gg = 0; gg < G; gg++)
                    s = __fadd_rn(s, comb[gg * n + j]);
                if (MODE == MODE_ATOMIC)
                    atomicAdd(p.acc + j, s);
                else
                    __stcg(part + j, s);
            }
        }
        if (MODE == MODE_ATOMIC)
            atomic_tail(p, &s_last);
        else if (MODE == MODE_FUSED)
            publish_chunk(p);
        else
            __syncthreads();
    }
    finish_and_exit(p, work, MODE == MODE_FUSED);
}

/* ---- the general path: any dtypes, any alignment, any n ------------------- */

/*
 * Two passes over each row (sums, then dx), stripe sums of dw kept in the
 * chunk's workspace slots (each element always touched by the same thread).
 */
static __global__ void __launch_bounds__(1024) general_kernel(Params p)
{
    extern __shared__ float smem[];
    __shared__ float red[2][32][2];
    __shared__ int s_claim[2];
    const int tpr = p.tpr, G = p.G;
    const int g = threadIdx.x / tpr, lt = threadIdx.x - g * tpr;
    const int64_t n = p.n;
    const bool want_dw = p.dw != nullptr;
    const bool has_w = p.w != nullptr;

    unsigned nxt = claim_issue(p);
    if (threadIdx.x == 0)
        s_claim[0] = (int)nxt;
    __syncthreads();
    int it = 0;
    for (int k = s_claim[0]; k < p.nchunks; it++, k = s_claim[it & 1]) {
        nxt = claim_issue(p);
        const int64_t r0 = (int64_t)k * p.C;
        const int64_t r1 = r0 + p.C < p.m ? r0 + p.C : p.m;
        float *slot = p.part + (int64_t)k * p.cs + (int64_t)g * p.pst;
        if (want_dw)
            for (int64_t j = lt; j < n; j += tpr)
                slot[j] = 0.0f;
        const int64_t steps = (r1 - r0 + G - 1) / G;
        int64_t r = r0 + g;
        for (int64_t t = 0; t < steps; t++, r += G) {
            const bool valid = r < r1; /* lockstep: see the fast path */
            const int parity = (int)(t & 1);
            const int64_t xo = r * p.xs, yo = r * p.dys;
            float s1 = 0.0f, s2 = 0.0f;
            for (int64_t j = lt; valid && j < n; j += tpr) {
                float xf = ld_any(p.x_dt, p.x, xo + j);
                float yf = ld_any(p.dy_dt, p.dy, yo + j);
                float w = has_w ? ld_any(p.w_dt, p.w, j) + p.offset : 1.0f;
                s1 += xf * xf;
                s2 += xf * (yf * w);
            }
            stripe_sum2(s1, s2, g, tpr, parity, red);
            if (!valid)
                continue;
            const float rstd = p.rstd ? p.rstd[r] : 1.0f / sqrtf(s1 / (float)n + p.eps);
            const float c = rstd * (s2 / (float)n);
            for (int64_t j = lt; j < n; j += tpr) {
                float xf = ld_any(p.x_dt, p.x, xo + j);
                float yf = ld_any(p.dy_dt, p.dy, yo + j);
                float w = has_w ? ld_any(p.w_dt, p.w, j) + p.offset : 1.0f;
                const float xh = __fmul_rn(xf, rstd);
                float d = rstd * (yf * w - xh * c);
                if (p.dres)
                    d += ld_any(p.dr_dt, p.dres, r * p.drs + j);
                st_any(p.dx_dt, p.dx, r * p.dxs + j, d);
                if (want_dw)
                    slot[j] = __fadd_rn(slot[j], __fmul_rn(yf, xh));
            }
        }
        if (threadIdx.x == 0)
            s_claim[(it + 1) & 1] = (int)nxt;
        __syncthreads();
        if (!want_dw)
            continue;
        float *part = p.part + (int64_t)k * p.cs;
        for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
            float s = 0.0f;
            for (int gg = 0; gg < G; gg++)
                s = __fadd_rn(s, part[(int64_t)gg * p.pst + j]);
            part[j] = s;
        }
        publish_chunk(p);
    }
    finish_and_exit(p, smem, true);
}

/* The "separate" benchmark variant's second kernel: one block per slice. */
static __global__ void __launch_bounds__(256) finish_kernel(Params p)
{
    extern __shared__ float smem[];
    for (int sl = blockIdx.x; sl < p.nslices; sl += gridDim.x)
        finish_slice(p, sl, smem);
}

} /* namespace rnk */

#endif
