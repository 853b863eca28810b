/* SPDX-License-Identifier: MIT */
/*
 * bwd_kernel.cuh - the device code of the fused, deterministic RMSNorm
 * backward kernel, shared by the production entry point (cuda_bwd.cu) and
 * the benchmark-only variants (cuda_variants.cu); the pieces both paths use
 * are in bwd_common.cuh.  C++ templates; nothing here is visible through rnk.h.
 *
 * One launch does everything:
 *   1. blocks claim chunks of C = rnk_chunk_rows(m, n) rows from an atomic
 *      counter; a block works on G = rnk_chunk_stripes(n) rows at once (one
 *      stripe of tpr threads each), writes dx, and keeps fp32 dw sums per
 *      stripe in registers (fast path: rows arrive through a ring of STAGES
 *      row slots in shared memory, filled with cp.async STAGES - 1 rows
 *      ahead, and the stripes run independently of each other) or in the
 *      chunk's workspace slots (general path); at the chunk's end it adds
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
 * fixed shuffle tree, then the stripe's warps in order).
 */
#ifndef RNK_BWD_KERNEL_CUH
#define RNK_BWD_KERNEL_CUH

#include "bwd_common.cuh"

namespace rnk {

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

/*
 * One row of a stripe, read from its ring slot st (this thread's first
 * vector): the row sums (sum of x^2 only when rstd is recomputed), rstd and
 * c, then dx and dw's sums.  With -DRNK_HOLD_ROWS=1 and one or two vectors a
 * thread the row is held in registers across the two passes (a stripe's
 * barrier between them makes the compiler read shared memory again), as the
 * kernel before issue 15 did; with four, whose stripes are one or two warps,
 * the registers are left to dw's sums and the second pass reads the ring.
 */
#ifndef RNK_HOLD_ROWS
#define RNK_HOLD_ROWS 0
#endif
template <class T, int NV>
__device__ __forceinline__ void process_row(const Params &p, int64_t r, int parity, int g,
                                            const int64_t (&col)[NV], const bool (&ok)[NV],
                                            const uint4 *st, float rs, const float *wsm,
                                            float (&acc)[NV][Vec<T>::N], rsum_t (*red)[32][2])
{
    constexpr int VEC = Vec<T>::N;
    constexpr bool HOLD = RNK_HOLD_ROWS && NV <= 2;
    const bool only_b = p.rstd != nullptr;
    uint4 hx[HOLD ? NV : 1], hy[HOLD ? NV : 1];
    if (HOLD) {
#pragma unroll
        for (int v = 0; v < NV; v++) {
            hx[HOLD ? v : 0] = ok[v] ? st[v * blockDim.x] : make_uint4(0, 0, 0, 0);
            hy[HOLD ? v : 0] = ok[v] ? st[(NV + v) * blockDim.x] : make_uint4(0, 0, 0, 0);
        }
    }
    /* One chain of additions per vector, then a fixed tree over the
     * vectors: NV independent chains keep the scheduler busy where one
     * chain over the thread's whole share of the row would stall it. */
    rsum_t s1v[NV], s2v[NV];
#pragma unroll
    for (int v = 0; v < NV; v++) {
        s1v[v] = 0;
        s2v[v] = 0;
        if (ok[v]) {
            float xf[VEC], yf[VEC], wv[VEC];
            Vec<T>::unpack(HOLD ? hx[HOLD ? v : 0] : st[v * blockDim.x], xf);
            Vec<T>::unpack(HOLD ? hy[HOLD ? v : 0] : st[(NV + v) * blockDim.x], yf);
            load_w<VEC>(wsm + col[v], wv);
#pragma unroll
            for (int e = 0; e < VEC; e++) {
                if (!only_b)
                    s1v[v] += (rsum_t)(xf[e] * xf[e]);
                s2v[v] += (rsum_t)(xf[e] * (yf[e] * wv[e]));
            }
        }
    }
#pragma unroll
    for (int h = 1; h < NV; h <<= 1)
#pragma unroll
        for (int v = 0; v + h < NV; v += 2 * h) {
            s1v[v] += s1v[v + h];
            s2v[v] += s2v[v + h];
        }
    rsum_t s1 = s1v[0], s2 = s2v[0];
#if RNK_RELOAD_ROW
    /* Read the row from shared memory again below rather than keeping it
     * in registers from the sums' pass. */
    asm volatile("" ::: "memory");
#endif
    stripe_sum2<rsum_t>(s1, s2, only_b, g, p.tpr, parity, true, red);
    const float rstd = only_b ? rs : 1.0f / sqrtf((float)(s1 / (rsum_t)p.n) + p.eps);
    const float c = (float)((rsum_t)rstd * (s2 / (rsum_t)p.n));
#pragma unroll
    for (int v = 0; v < NV; v++) {
        if (ok[v]) {
            float xf[VEC], yf[VEC], rf[VEC], d[VEC], wv[VEC];
            Vec<T>::unpack(HOLD ? hx[HOLD ? v : 0] : st[v * blockDim.x], xf);
            Vec<T>::unpack(HOLD ? hy[HOLD ? v : 0] : st[(NV + v) * blockDim.x], yf);
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
 * Block shapes (cuda_bwd.cu's plan): a stripe of tpr threads holds NV
 * vectors of 16 bytes of a row per thread, NV = 1, 2 or 4: about four below
 * 512 vectors a row (bf16 n < 4096), so that small rows reduce inside one
 * warp and rows of 2048 across two; about two from there (256 threads at
 * n = 4096, 512 at 8192), where four left too few warps a SM.  A block is G
 * such stripes, at most 512 threads.  The register bounds leave the compiler
 * free (NV = 4 takes 125, NV <= 2 96-108): capping NV <= 2 at 64 for two
 * blocks of 512 spilled, and capping NV = 4 at 80 for three blocks of 256
 * spilled and lost 25-45 % (bench/RESULTS.md).
 */
#ifndef RNK_NV_TARGET
#define RNK_NV_TARGET 4 /* vectors per thread the plan aims at, rows < 512 vectors */
#endif
#ifndef RNK_NV_WIDE
#define RNK_NV_WIDE 2 /* the same for rows of 512 vectors or more (bf16 n >= 4096) */
#endif
#ifndef RNK_NV12_MINB
#define RNK_NV12_MINB 1 /* blocks of 512 threads per SM for NV = 1, 2 */
#endif
#ifndef RNK_NV4_MINB
#define RNK_NV4_MINB 1 /* the same for NV = 4 */
#endif
#ifndef RNK_FAST_MAXT
#define RNK_FAST_MAXT 512
#endif
#ifndef RNK_RELOAD_ROW
#define RNK_RELOAD_ROW 0
#endif
template <class T, class TW, int NV, int MODE>
__global__ void __launch_bounds__(RNK_FAST_MAXT, NV >= 4 ? RNK_NV4_MINB : RNK_NV12_MINB) fast_kernel(Params p)
{
    constexpr int VEC = Vec<T>::N;
    extern __shared__ float smem[];
    __shared__ rsum_t red[2][32][2];
    __shared__ int s_claim[2], s_last;
    const int tpr = p.tpr, G = p.G;
    const int g = threadIdx.x / tpr, lt = threadIdx.x - g * tpr;
    const int64_t n = p.n;
    const bool want_dw = p.dw != nullptr;

    unsigned nxt = claim_issue(p); /* overlaps the weight staging below */
    /* w + weight_offset in shared memory (1 without a weight): registers
     * are kept for dw's sums. */
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

        /* Stripe g takes rows r0 + g, r0 + g + G, ... on its own: STAGES - 1
         * of them in flight (see stage_row), no barrier with the other
         * stripes until the chunk's end.  One commit group per step, empty
         * or not, so that wait_group<STAGES - 1> always means "this step's
         * row is here".  rstd is prefetched as far ahead, in registers
         * (rsq[0]: this step). */
        const int64_t rg = r0 + g;
        const int64_t steps = rg < r1 ? (r1 - rg + G - 1) / G : 0;
        const int slot = 2 * NV * (int)blockDim.x;
        float rsq[STAGES];
#pragma unroll
        for (int i = 0; i < STAGES; i++)
            rsq[i] = 0.0f;
#pragma unroll
        for (int i = 0; i < STAGES - 1; i++) {
            if (i < steps) {
                const int64_t r = rg + (int64_t)i * G;
                stage_row<T, NV>(p, r, col, ok, ring + i * slot);
                if (p.rstd)
                    rsq[i] = __ldg(p.rstd + r);
            }
            cp_async_commit();
        }
        int sa = STAGES - 1, sc = 0; /* stage being filled, being read */
        for (int64_t t = 0; t < steps; t++) {
            const int64_t ta = t + STAGES - 1;
            if (ta < steps) {
                const int64_t ra = rg + ta * G;
                stage_row<T, NV>(p, ra, col, ok, ring + sa * slot);
                if (p.rstd)
                    rsq[STAGES - 1] = __ldg(p.rstd + ra);
            }
            cp_async_commit();
            cp_async_wait<STAGES - 1>();
            process_row<T, NV>(p, rg + t * G, (int)(t & 1), g, col, ok,
                               ring + sc * slot + threadIdx.x, rsq[0], wsm, acc, red);
            sa = sa + 1 == STAGES ? 0 : sa + 1;
            sc = sc + 1 == STAGES ? 0 : sc + 1;
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
    __shared__ rsum_t red[2][32][2];
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
            const bool valid = r < r1; /* stripes step in lockstep here: the row
                                        * sums meet at the block's barrier */
            const int parity = (int)(t & 1);
            const int64_t xo = r * p.xs, yo = r * p.dys;
            rsum_t s1 = 0, s2 = 0;
            for (int64_t j = lt; valid && j < n; j += tpr) {
                float xf = ld_any(p.x_dt, p.x, xo + j);
                float yf = ld_any(p.dy_dt, p.dy, yo + j);
                float w = has_w ? ld_any(p.w_dt, p.w, j) + p.offset : 1.0f;
                s1 += (rsum_t)(xf * xf);
                s2 += (rsum_t)(xf * (yf * w));
            }
            stripe_sum2<rsum_t>(s1, s2, false, g, tpr, parity, false, red);
            if (!valid)
                continue;
            const float rstd = p.rstd ? p.rstd[r] : 1.0f / sqrtf((float)(s1 / (rsum_t)n) + p.eps);
            const float c = (float)((rsum_t)rstd * (s2 / (rsum_t)n));
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
