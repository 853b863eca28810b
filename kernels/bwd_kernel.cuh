/* SPDX-License-Identifier: MIT */
/*
 * bwd_kernel.cuh - the device code of the fused, deterministic RMSNorm
 * backward kernel, shared by the production entry point (cuda_bwd.cu) and
 * the benchmark-only variants (cuda_variants.cu); the pieces both paths use
 * are in bwd_common.cuh, the end of a launch (dw's finish) in
 * bwd_finish.cuh.  C++ templates; nothing here is visible through rnk.h.
 *
 * Two of the three paths are here: the ring path (fast_kernel: aligned rows
 * of one dtype under rnk.h's contiguous order) and the general path
 * (general_kernel: any dtypes, alignment and n, under either order); S, the
 * interleaved order's fast path, is in bwd_s.cuh.
 * One launch does everything, on every path:
 *   1. blocks claim chunks (rnk.h: contiguous, C = rnk_chunk_rows(m, n) rows
 *      each; interleaved, P chunks of rows k, k + P, ...) from an atomic
 *      counter; a block works on G rows of a chunk at once (one stripe of
 *      tpr threads each), writes dx, and keeps fp32 dw sums per stripe in
 *      registers (ring path: rows arrive through a ring of STAGES row slots
 *      in shared memory, filled with cp.async STAGES - 1 rows ahead, and the
 *      stripes run independently of each other) or in the chunk's workspace
 *      slots (general path); at the chunk's end it adds the stripes in order
 *      into the chunk's partial row and bumps a "done" counter (release);
 *   2. a block that finds no chunk left and has a slice of step 3 waits
 *      (acquire) until done == nchunks; one without a slice counts itself
 *      out and leaves.  This cannot deadlock however few blocks are
 *      resident: every claimed chunk belongs to a block that is already
 *      running and never waits before finishing it;
 *   3. blocks take 32-column slices (8 under the interleaved order) and add
 *      the partials of each column in rnk.h's fixed two-level order (groups
 *      of RNK_DW_GROUP chunks in parallel, then the groups), rounding once
 *      to dw's dtype;
 *   4. the last block to exit resets every counter to zero, so the next
 *      launch (or a graph replay) starts clean without a memset.
 * dx and dw are bitwise deterministic and dw depends neither on the grid nor
 * on the path: every sum has a fixed order (rnk.h documents dw's; the row
 * reductions use a fixed shuffle tree, then the stripe's warps in order).
 */
#ifndef RNK_BWD_KERNEL_CUH
#define RNK_BWD_KERNEL_CUH

#include "bwd_finish.cuh"

namespace rnk {

/* ---- the ring path: aligned rows of one dtype, staged in shared memory ---- */

/*
 * Knobs (bench/build_variants.sh builds one benchmark per set):
 *   RNK_STAGES1/2/4  rows in the ring per stripe for NV = 1, 2, 4 vectors a
 *                    thread (STAGES - 1 rows of each stripe in flight while
 *                    one is reduced);
 *   RNK_W_REGS       w + weight_offset held in registers for NV <= this
 *                    (else read from shared memory at every row).
 */
#ifndef RNK_STAGES1
#define RNK_STAGES1 3
#endif
#ifndef RNK_STAGES2
#define RNK_STAGES2 3
#endif
#ifndef RNK_STAGES4
#define RNK_STAGES4 3
#endif
#ifndef RNK_W_REGS
#define RNK_W_REGS 2
#endif
/* RNK_RING_LANE_MAJOR = 1: each thread's ring slots contiguous (offsets are
 * immediates); 0: slot-major, consecutive threads' 16-byte slots adjacent
 * (as the kernel of f06db7b), so that a warp's cp.async writes 512
 * contiguous bytes of shared memory. */
#ifndef RNK_RING_LANE_MAJOR
#define RNK_RING_LANE_MAJOR 0
#endif
/* RNK_HOLD: what a thread keeps of its row between the row sums and dx:
 * 0 nothing (both passes read the ring in shared memory), 1 the packed
 * 16-byte vectors (one ring read a row, unpacked twice), 2 the unpacked
 * floats for NV <= RNK_HOLD_NV (else nothing: NV = 4 would spill). */
#ifndef RNK_HOLD
#define RNK_HOLD 2
#endif
#ifndef RNK_HOLD_NV
#define RNK_HOLD_NV 2
#endif
/* RNK_LEAN = 1 (being measured): the stripe's warps summed by a shuffle
 * tree instead of a loop (bwd_common.cuh's stripe_sum2), the row steps
 * and 1/n from the host: 20-40 % fewer instructions a row
 * (bench/RESULTS.md). */
#ifndef RNK_LEAN
#define RNK_LEAN 1
#endif
/* RNK_TRACE = 1 (benchmark only; defined in bwd_common.cuh, 0 by default:
 * no code, no Params field): thread 0 of each block stores %globaltimer at
 * the phase boundaries (entry, setup done, claim loop done, every chunk
 * done, finish done, exit; rnk_test.h's rnk_trace_block), its %smid and
 * chunk count, and each chunk's publish time, into the buffer of
 * rnk_cuda_set_trace; bench_kernel --trace prints them (bench/RESULTS.md,
 * "How to trace"). */
static_assert(RNK_STAGES1 >= 2 && RNK_STAGES2 >= 2 && RNK_STAGES4 >= 2, "RNK_STAGES*: at least 2");

__host__ __device__ constexpr int fast_stages(int nv)
{
    return nv == 1 ? RNK_STAGES1 : nv == 2 ? RNK_STAGES2 : RNK_STAGES4;
}
__host__ __device__ constexpr bool fast_w_regs(int nv)
{
    return nv <= RNK_W_REGS;
}
/* 16-byte ring slots per thread: STAGES rows of NV x and NV dy vectors, and
 * one slot of padding, so that threads sit an odd number of 16-byte units
 * apart and a warp's 16-byte accesses never meet in a bank. */
__host__ __device__ constexpr int ring_slots(int nv)
{
    return 2 * nv * fast_stages(nv) + 1;
}
/* Floats of w a stripe lane keeps in shared memory (when not in registers):
 * its NV * VEC columns, padded for the same reason. */
__host__ __device__ constexpr int w_lane_floats(int nv, int vec)
{
    return nv * vec + 4;
}

/* 16-byte asynchronous copy that writes zeros past src_bytes (0 or 16): the
 * columns past n read as zeros, with no branch.  Rows: evict first from L2
 * (bwd_common.cuh's L2 eviction priorities). */
__device__ __forceinline__ void cp_async16z(unsigned sdst, const void *gsrc, unsigned src_bytes)
{
    asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2, %3;" ::"r"(sdst),
                 "l"(gsrc), "r"(src_bytes), "l"(l2_evict_first())
                 : "memory");
}

/*
 * A thread's share of a row: NV vectors of VEC columns, vector v at columns
 * (v * tpr + lt) * VEC (a warp reads 512 contiguous bytes per vector);
 * coff[v]: its byte offset in a row, nb[v]: 16, or 0 for a vector past n
 * (offset 0, nothing read, zeros written); w (wv[v]): w + weight_offset of
 * its columns, 0 past n.
 *
 * Start copying one row's vectors of x and dy into ring stage S of the
 * thread's ring at shared address sring.
 */
template <int NV>
__device__ __forceinline__ void stage_row(int S, unsigned sring, unsigned ub, const char *xr,
                                          const char *yr, const unsigned (&coff)[NV],
                                          const unsigned (&nb)[NV])
{
#pragma unroll
    for (int v = 0; v < NV; v++) {
        cp_async16z(sring + (S * 2 * NV + v) * ub, xr + coff[v], nb[v]);
        cp_async16z(sring + (S * 2 * NV + NV + v) * ub, yr + coff[v], nb[v]);
    }
}

/*
 * One row of a stripe, from ring slot sl (this thread's vectors): the row
 * sums (sum of x^2 only when rstd is recomputed), rstd and c, then dx (to
 * dxr, the row's dx) and dw's sums.  Vectors past n hold zeros (x, dy and
 * w), so they add nothing and are only not stored.
 */
template <class T, int NV, bool ONLY_B, bool DRES>
__device__ __forceinline__ void process_row(const Params &p, const uint4 *sl, int us,
                                            const float (*wv)[Vec<T>::N],
                                            float rs, char *dxr, const char *drr,
                                            const unsigned (&coff)[NV], const bool (&ok)[NV], int g,
                                            int parity, float (&acc)[NV][Vec<T>::N],
                                            rsum_t (*red)[32][2])
{
    constexpr int VEC = Vec<T>::N;
    constexpr int HOLD = RNK_HOLD == 2 && NV > RNK_HOLD_NV ? 0 : RNK_HOLD;
    /* The row's vectors: read from the ring once (HOLD >= 1) or at each pass. */
    uint4 hx[HOLD >= 1 ? NV : 1], hy[HOLD >= 1 ? NV : 1];
    float fx[HOLD == 2 ? NV : 1][VEC], fy[HOLD == 2 ? NV : 1][VEC];
    if (HOLD >= 1) {
#pragma unroll
        for (int v = 0; v < NV; v++) {
            hx[HOLD >= 1 ? v : 0] = sl[v * us];
            hy[HOLD >= 1 ? v : 0] = sl[(NV + v) * us];
        }
    }
    /* One chain of additions per vector, then a fixed tree over the
     * vectors: NV independent chains keep the scheduler busy where one
     * chain over the thread's whole share of the row would stall it. */
    rsum_t s1v[NV], s2v[NV];
#pragma unroll
    for (int v = 0; v < NV; v++) {
        float xf[VEC], yf[VEC];
        Vec<T>::unpack(HOLD >= 1 ? hx[HOLD >= 1 ? v : 0] : sl[v * us], xf);
        Vec<T>::unpack(HOLD >= 1 ? hy[HOLD >= 1 ? v : 0] : sl[(NV + v) * us], yf);
        s1v[v] = 0;
        s2v[v] = 0;
#pragma unroll
        for (int e = 0; e < VEC; e++) {
            if (!ONLY_B)
                s1v[v] += (rsum_t)(xf[e] * xf[e]);
            s2v[v] += (rsum_t)(xf[e] * (yf[e] * wv[v][e]));
            if (HOLD == 2) {
                fx[HOLD == 2 ? v : 0][e] = xf[e];
                fy[HOLD == 2 ? v : 0][e] = yf[e];
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
    stripe_sum2<rsum_t>(s1, s2, ONLY_B, g, p.tpr, parity, true, red, RNK_LEAN != 0);
#if RNK_LEAN
    /* A multiply by 1/n (from the host) instead of a division a row. */
    const float rstd = ONLY_B ? rs : 1.0f / sqrtf((float)(s1 * (rsum_t)p.inv_n) + p.eps);
    const float c = (float)((rsum_t)rstd * (s2 * (rsum_t)p.inv_n));
#else
    const float rstd = ONLY_B ? rs : 1.0f / sqrtf((float)(s1 / (rsum_t)p.n) + p.eps);
    const float c = (float)((rsum_t)rstd * (s2 / (rsum_t)p.n));
#endif
#pragma unroll
    for (int v = 0; v < NV; v++) {
        float xf[VEC], yf[VEC], rf[VEC], d[VEC];
        if (HOLD == 2) {
#pragma unroll
            for (int e = 0; e < VEC; e++) {
                xf[e] = fx[HOLD == 2 ? v : 0][e];
                yf[e] = fy[HOLD == 2 ? v : 0][e];
            }
        } else {
            Vec<T>::unpack(HOLD >= 1 ? hx[HOLD >= 1 ? v : 0] : sl[v * us], xf);
            Vec<T>::unpack(HOLD >= 1 ? hy[HOLD >= 1 ? v : 0] : sl[(NV + v) * us], yf);
        }
        if (DRES)
            Vec<T>::unpack(ld16(drr + coff[v]), rf);
#pragma unroll
        for (int e = 0; e < VEC; e++) {
            const float xh = __fmul_rn(xf[e], rstd);
            d[e] = dx_elem(yf[e], wv[v][e], xh, rstd, c);
            if (DRES)
                d[e] += rf[e];
            acc[v][e] = dw_step(acc[v][e], yf[e], xh);
        }
        if (ok[v])
            st16(dxr + coff[v], Vec<T>::pack(d));
    }
}

/*
 * A stripe's rows of one chunk: rows rg, rg + G, ... (steps of them), each
 * through the ring: STAGES - 1 rows in flight while one is reduced, one
 * commit group per step, empty or not, so that wait_group<STAGES - 1> always
 * means "this step's row is here".  rstd is prefetched as far ahead, in
 * registers (rsq[0]: this step).  Each thread copies, and later reads, only
 * its own slots, so cp.async.wait_group alone orders a copy before its read,
 * and a slot is refilled only after its row is done.  (Unrolling this loop
 * by STAGES, so that every slot offset is a constant, made the hot loop 3 to
 * 8 rows of code long and 20 % slower: bench/RESULTS.md.)
 */
template <class T, int NV, bool ONLY_B, bool DRES>
__device__ __forceinline__ void stripe_rows(const Params &p, int64_t rg, int64_t steps, int g,
                                            unsigned sring, const uint4 *ring,
                                            const float (*wv)[Vec<T>::N],
                                            const unsigned (&coff)[NV], const unsigned (&nb)[NV],
                                            const bool (&ok)[NV], float (&acc)[NV][Vec<T>::N],
                                            rsum_t (*red)[32][2])
{
    constexpr int ST = fast_stages(NV);
    constexpr int ES = (int)sizeof(T);
    constexpr int SLOT = 2 * NV; /* 16-byte slots per stage */
    /* uint4 units between a thread's consecutive slots (see RNK_RING_LANE_MAJOR) */
    const int us = RNK_RING_LANE_MAJOR ? 1 : (int)blockDim.x;
    const unsigned ub = (unsigned)us * 16u;
    const int64_t G = p.G;
#if RNK_LEAN /* from the host: not recomputed from the parameters at every row */
    const int64_t xstep = p.xstep, ystep = p.ystep, dstep = p.dstep;
#else
    const int64_t xstep = G * p.xs * ES, ystep = G * p.dys * ES, dstep = G * p.dxs * ES;
#endif
    const char *xa = (const char *)p.x + rg * p.xs * ES; /* the next row to stage */
    const char *ya = (const char *)p.dy + rg * p.dys * ES;
    const float *ra = ONLY_B ? p.rstd + rg : nullptr;
    char *dxr = (char *)p.dx + rg * p.dxs * ES; /* the row being reduced */
    const char *drr = DRES ? (const char *)p.dres + rg * p.drs * ES : nullptr;
    const int64_t drstep = DRES ? (RNK_LEAN ? p.drstep : G * p.drs * ES) : 0;
    float rsq[ST];
#pragma unroll
    for (int i = 0; i < ST; i++)
        rsq[i] = 0.0f;
#pragma unroll
    for (int i = 0; i < ST - 1; i++) {
        if (i < steps) {
            stage_row<NV>(i, sring, ub, xa, ya, coff, nb);
            if (ONLY_B) {
                rsq[i] = __ldg(ra);
                ra += G;
            }
            xa += xstep;
            ya += ystep;
        }
        cp_async_commit();
    }
    int sa = ST - 1, sc = 0; /* stage being filled, being read */
    for (int64_t t = 0; t < steps; t++) {
        if (t + ST - 1 < steps) {
            stage_row<NV>(0, sring + sa * SLOT * ub, ub, xa, ya, coff, nb);
            if (ONLY_B) {
                rsq[ST - 1] = __ldg(ra);
                ra += G;
            }
            xa += xstep;
            ya += ystep;
        }
        cp_async_commit();
        cp_async_wait<ST - 1>();
        process_row<T, NV, ONLY_B, DRES>(p, ring + sc * SLOT * us, us, wv, rsq[0], dxr, drr, coff,
                                         ok, g,
                                         (int)(t & 1), acc, red);
        dxr += dstep;
        if (DRES)
            drr += drstep;
        sa = sa + 1 == ST ? 0 : sa + 1;
        sc = sc + 1 == ST ? 0 : sc + 1;
#pragma unroll
        for (int i = 0; i < ST - 1; i++)
            rsq[i] = rsq[i + 1];
    }
    cp_async_wait<0>();
}

/*
 * Block shapes (cuda_bwd.cu's plan): a stripe of tpr threads holds NV
 * vectors of 16 bytes of a row per thread, NV = 1, 2 or 4: about four below
 * 512 vectors a row (bf16 n < 4096), so that small rows reduce inside one
 * warp and rows of 2048 across two; about two from there (256 threads at
 * n = 4096, 512 at 8192), where four left too few warps a SM.  A block is G
 * such stripes, at most 512 threads.
 */
#ifndef RNK_NV_TARGET
#define RNK_NV_TARGET 2 /* vectors per thread the plan aims at, rows < 512 vectors */
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
template <class T, class TW, int NV, int MODE>
__global__ void __launch_bounds__(RNK_FAST_MAXT, NV >= 4 ? RNK_NV4_MINB : RNK_NV12_MINB) fast_kernel(Params p)
{
    constexpr int VEC = Vec<T>::N;
    constexpr bool WREG = fast_w_regs(NV);
    constexpr int WLF = w_lane_floats(NV, VEC);
    extern __shared__ float smem[];
    __shared__ rsum_t red[2][32][2];
    __shared__ int s_claim[2], s_last;
    const int tpr = p.tpr, G = p.G;
    const int g = threadIdx.x / tpr, lt = threadIdx.x - g * tpr;
    const int64_t n = p.n;
    const bool want_dw = p.dw != nullptr;

    trace_start(p, 1u | (unsigned)NV << 4 | (unsigned)MODE << 8);
    /* The first claim goes out before the cancel word is known (it touches
     * no tensor, and the last block out resets the counters, whatever a
     * cancelled launch claimed), so its round trip overlaps the word's. */
    unsigned nxt = claim_issue(p);
    if (int c = cancelled(p); c != CANCEL_CLEAR) {
        finish_and_exit(p, smem, false, c != CANCEL_GATED);
        return;
    }
    /* smem: w + weight_offset per lane (p.wsp floats, none when w is held in
     * registers), then the ring, which the stripe combine and the finish's
     * tile reuse. */
    float *work = smem + p.wsp;
    uint4 *ring = reinterpret_cast<uint4 *>(work) +
                  threadIdx.x * (RNK_RING_LANE_MAJOR ? ring_slots(NV) : 1);
    const unsigned sring = smem_addr(ring);
    /* The plan keeps n small enough for a row to fit in shared memory. */
    const int n32 = (int)n;
    int col[NV];
    unsigned coff[NV], nb[NV];
    bool ok[NV];
#pragma unroll
    for (int v = 0; v < NV; v++) {
        col[v] = (v * tpr + lt) * VEC;
        ok[v] = col[v] < n32;
        coff[v] = ok[v] ? (unsigned)col[v] * (unsigned)sizeof(T) : 0u;
        nb[v] = ok[v] ? 16u : 0u;
    }
    float wreg[WREG ? NV : 1][VEC];
    const float(*wv)[VEC];
    if (WREG) {
#pragma unroll
        for (int v = 0; v < NV; v++)
#pragma unroll
            for (int e = 0; e < VEC; e++)
                wreg[WREG ? v : 0][e] =
                    col[v] + e < n32 ? (p.w ? ld_any(Vec<TW>::DT, p.w, col[v] + e) + p.offset : 1.0f)
                                   : 0.0f;
        wv = wreg;
    } else {
        for (int i = threadIdx.x; i < tpr * NV; i += blockDim.x) {
            const int l = i % tpr, v = i / tpr;
            const int64_t c0 = ((int64_t)v * tpr + l) * VEC;
            for (int e = 0; e < VEC; e++)
                smem[l * WLF + v * VEC + e] =
                    c0 + e < n ? (p.w ? ld_any(Vec<TW>::DT, p.w, c0 + e) + p.offset : 1.0f) : 0.0f;
        }
        wv = reinterpret_cast<const float(*)[VEC]>(smem + lt * WLF);
    }
    if (threadIdx.x == 0)
        s_claim[0] = (int)nxt;
    __syncthreads();
    trace_mark(p, 1, 1);

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

        /* Stripe g takes rows r0 + g, r0 + g + G, ... on its own, no
         * barrier with the other stripes until the chunk's end. */
        const int64_t rg = r0 + g;
        const int64_t steps = rg < r1 ? (r1 - rg + G - 1) / G : 0;
        if (p.rstd && !p.dres)
            stripe_rows<T, NV, true, false>(p, rg, steps, g, sring, ring, wv, coff, nb, ok, acc, red);
        else if (p.rstd)
            stripe_rows<T, NV, true, true>(p, rg, steps, g, sring, ring, wv, coff, nb, ok, acc, red);
        else if (!p.dres)
            stripe_rows<T, NV, false, false>(p, rg, steps, g, sring, ring, wv, coff, nb, ok, acc, red);
        else
            stripe_rows<T, NV, false, true>(p, rg, steps, g, sring, ring, wv, coff, nb, ok, acc, red);
        /* compute-sanitizer racecheck orders two threads' accesses across a
         * block barrier only when the writer has met no more barriers,
         * whatever their ids, than the reader: a stripe with one row fewer
         * in this chunk (one named barrier fewer) made it report the stripe
         * combine below as 15-1933 races (a minimal repro of the tool's
         * behaviour: bench/RESULTS.md).  Under racecheck (RNK_RACECHECK=1)
         * the short stripe meets its own barrier once more, which evens the
         * count and changes nothing else. */
        if (p.even_bars && tpr > 32 && steps < (r1 - r0 + G - 1) / G)
            asm volatile("bar.sync %0, %1;" ::"r"(1 + g), "r"(tpr) : "memory");

        if (threadIdx.x == 0)
            s_claim[(it + 1) & 1] = (int)nxt;
        if (!want_dw) {
            __syncthreads();
            trace_chunk(p, k);
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
                        st_part4(part + col[v] + e,
                                 make_float4(__fadd_rn(0.0f, acc[v][e]),
                                             __fadd_rn(0.0f, acc[v][e + 1]),
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
                    st_part(part + j, s);
            }
        }
        if (MODE == MODE_ATOMIC)
            atomic_tail(p, &s_last);
        else if (MODE == MODE_FUSED)
            publish_chunk(p);
        else
            __syncthreads();
        trace_chunk(p, s_claim[it & 1]); /* = k, which need not stay live */
    }
    trace_rows_done(p, it);
    finish_and_exit(p, work, MODE == MODE_FUSED);
}

/* ---- the general path: any dtypes, any alignment, any n ------------------- */

/*
 * Two passes over each row (sums, then dx), stripe sums of dw kept in the
 * chunk's workspace slots (each element always touched by the same thread).
 * IL: rnk.h's interleaved order (chunk k: rows k, k + P, ...), else the
 * contiguous one (rows k * C .. k * C + C - 1).
 */
template <bool IL>
__global__ void __launch_bounds__(1024) general_kernel(Params p)
{
    extern __shared__ float smem[];
    __shared__ rsum_t red[2][32][2];
    __shared__ int s_claim[2];
    const int tpr = p.tpr, G = p.G;
    const int g = threadIdx.x / tpr, lt = threadIdx.x - g * tpr;
    const int64_t n = p.n;
    const bool want_dw = p.dw != nullptr;
    const bool has_w = p.w != nullptr;

    trace_start(p, 2u);
    unsigned nxt = claim_issue(p); /* before the cancel word, as in fast_kernel */
    if (int c = cancelled(p); c != CANCEL_CLEAR) {
        finish_and_exit<IL>(p, smem, false, c != CANCEL_GATED);
        return;
    }
    if (threadIdx.x == 0)
        s_claim[0] = (int)nxt;
    __syncthreads();
    trace_mark(p, 1, 1);
    int it = 0;
    for (int k = s_claim[0]; k < p.nchunks; it++, k = s_claim[it & 1]) {
        nxt = claim_issue(p);
        /* The chunk's rows: r0, r0 + rs, ... (cnt of them) */
        const int64_t rs = IL ? (int64_t)p.nchunks : 1;
        const int64_t r0 = IL ? (int64_t)k : (int64_t)k * p.C;
        const int64_t cnt = IL ? chunk_len(p, k) : (r0 + p.C < p.m ? p.C : p.m - r0);
        float *slot = p.part + (int64_t)k * p.cs + (int64_t)g * p.pst;
        if (want_dw)
            for (int64_t j = lt; j < n; j += tpr)
                slot[j] = 0.0f;
        const int64_t steps = (cnt + G - 1) / G;
        int64_t r = r0 + g * rs;
        for (int64_t t = 0; t < steps; t++, r += G * rs) {
            const bool valid = g + t * G < cnt; /* stripes step in lockstep here: the
                                                 * row sums meet at the block's barrier */
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
                float d = dx_elem(yf, w, xh, rstd, c);
                if (p.dres)
                    d += ld_any(p.dr_dt, p.dres, r * p.drs + j);
                st_any(p.dx_dt, p.dx, r * p.dxs + j, d);
                if (want_dw)
                    slot[j] = dw_step(slot[j], yf, xh);
            }
        }
        if (threadIdx.x == 0)
            s_claim[(it + 1) & 1] = (int)nxt;
        __syncthreads();
        if (!want_dw) {
            trace_chunk(p, k);
            continue;
        }
        float *part = p.part + (int64_t)k * p.cs;
        for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
            float s = 0.0f;
            for (int gg = 0; gg < G; gg++)
                s = __fadd_rn(s, part[(int64_t)gg * p.pst + j]);
            part[j] = s;
        }
        publish_chunk(p);
        trace_chunk(p, k);
    }
    trace_rows_done(p, it);
    finish_and_exit<IL>(p, smem, true);
}

/* The "separate" benchmark variant's second kernel: one block per slice
 * (contiguous order; IL: slices of the interleaved finish). */
template <bool IL>
__global__ void __launch_bounds__(256) finish_kernel(Params p)
{
    extern __shared__ float smem[];
    if constexpr (IL)
        finish_slices_il<256>(p);
    else
        for (int sl = blockIdx.x; sl < p.nslices; sl += gridDim.x)
            finish_slice(p, sl, smem);
}

} /* namespace rnk */

#endif
