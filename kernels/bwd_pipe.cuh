/* SPDX-License-Identifier: MIT */
/*
 * bwd_pipe.cuh - issue 15, eleventh attempt (an experiment knob, off by
 * default): the fast path's row loop for stripes of several warps with the
 * per-row exchange of the row sums split in two, so that no warp waits for
 * its stripe's other warps at every row.  bwd_kernel.cuh includes it (after
 * its ring helpers) and uses it where tpr > 32 and NV <= 2 (pipe_on) when
 * RNK_PIPE != 0:
 *   RNK_PIPE = 1  the row's vectors read from the ring twice (sums, then dx);
 *                 the ring has one stage more than fast_stages, so that as
 *                 many rows as before stay in flight;
 *   RNK_PIPE = 2  the row's packed vectors kept in registers from its sums
 *                 to its dx for NV <= RNK_HOLD_NV (one ring read a row, the
 *                 ring as before); as 1 for larger NV (it would spill).
 * Row t of a stripe: each warp forms its share of the sums (the same chains
 * and shuffle tree as process_row), lane 0 stores it in red[t % 4] and
 * arrives on the stripe's mbarrier t % 4; then the thread waits for row
 * t - 1's mbarrier (which every warp arrived at one row earlier), adds the
 * warps' shares in the same fixed order as stripe_sum2, and does row t - 1's
 * dx and dw.  dx and dw keep their bits: every sum is formed in the same
 * order, only the row whose dx follows is another.
 * Slots: a warp stores row t's share after it has waited for row t - 2,
 * that is after every warp of the stripe arrived at row t - 2, which each
 * did after its reads of row t - 4 (same slot); a slot's mbarrier starts its
 * next phase (row t + 4) only after every warp waited for row t.  No
 * deadlock: a stripe's warps take the same rows, and nothing waits across
 * stripes.
 */
#ifndef RNK_BWD_PIPE_CUH
#define RNK_BWD_PIPE_CUH

#if RNK_PIPE

namespace rnk {

/* PIPE_WARPS: at least 16, so that red_pipe also holds stripe_rows' red[2][32][2]. */
enum {
    PIPE_SLOTS = 4,
    PIPE_WARPS = RNK_FAST_MAXT / 32 > 16 ? RNK_FAST_MAXT / 32 : 16,
    PIPE_STRIPES = RNK_FAST_MAXT / 64
};
static_assert(RNK_PIPE == 1 || RNK_PIPE == 2, "RNK_PIPE: 0, 1 or 2");

/* mbarriers in shared memory at CTA scope (sm_90: try_wait; sm_80: test_wait). */
__device__ __forceinline__ void mbar_init(unsigned a, unsigned count)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(a), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive(unsigned a)
{
#if __CUDA_ARCH__ >= 900
    asm volatile("mbarrier.arrive.release.cta.shared::cta.b64 _, [%0];" ::"r"(a) : "memory");
#else
    asm volatile("{\n\t.reg .b64 st;\n\tmbarrier.arrive.shared.b64 st, [%0];\n}" ::"r"(a)
                 : "memory");
#endif
}
__device__ __forceinline__ void mbar_wait(unsigned a, unsigned parity)
{
#if __CUDA_ARCH__ >= 900
    asm volatile("{\n\t.reg .pred P;\n"
                 "RNK_PIPE_WAIT:\n\t"
                 "mbarrier.try_wait.parity.acquire.cta.shared::cta.b64 P, [%0], %1;\n\t"
                 "@!P bra RNK_PIPE_WAIT;\n}" ::"r"(a),
                 "r"(parity)
                 : "memory");
#else
    asm volatile("{\n\t.reg .pred P;\n"
                 "RNK_PIPE_WAIT:\n\t"
                 "mbarrier.test_wait.parity.shared.b64 P, [%0], %1;\n\t"
                 "@!P bra RNK_PIPE_WAIT;\n}" ::"r"(a),
                 "r"(parity)
                 : "memory");
#endif
}

/* Thread threadIdx.x < 4 * stripes sets up one slot's mbarrier (one arrival
 * per warp of a stripe); the block's barrier that follows publishes them. */
__device__ __forceinline__ void pipe_init(unsigned long long (*mbar)[PIPE_SLOTS], int G, int tpr)
{
    if (tpr > 32 && (int)threadIdx.x < G * PIPE_SLOTS)
        mbar_init((unsigned)__cvta_generic_to_shared(
                      &mbar[threadIdx.x / PIPE_SLOTS][threadIdx.x % PIPE_SLOTS]),
                  (unsigned)(tpr >> 5));
}

/* Row u of the stripe: this warp's share of the sums, as process_row forms
 * it (per-vector chains, the tree over the vectors, the shuffle tree), to
 * red[u % 4] and mbarrier u % 4. */
template <class T, int NV, bool ONLY_B>
__device__ __forceinline__ void pipe_sums(const uint4 *sl, int us, uint4 (&hx)[NV], uint4 (&hy)[NV],
                                          const float (*wv)[Vec<T>::N],
                                          rsum_t (*red)[PIPE_WARPS][2], unsigned mb, unsigned u)
{
    constexpr int VEC = Vec<T>::N;
    constexpr bool HOLD = pipe_hold(NV);
    if (HOLD)
#pragma unroll
        for (int v = 0; v < NV; v++) {
            hx[v] = sl[v * us];
            hy[v] = sl[(NV + v) * us];
        }
    rsum_t s1v[NV], s2v[NV];
#pragma unroll
    for (int v = 0; v < NV; v++) {
        float xf[VEC], yf[VEC];
        Vec<T>::unpack(HOLD ? hx[v] : sl[v * us], xf);
        Vec<T>::unpack(HOLD ? hy[v] : sl[(NV + v) * us], yf);
        s1v[v] = 0;
        s2v[v] = 0;
#pragma unroll
        for (int e = 0; e < VEC; e++) {
            if (!ONLY_B)
                s1v[v] += (rsum_t)(xf[e] * xf[e]);
            s2v[v] += (rsum_t)(xf[e] * (yf[e] * wv[v][e]));
        }
    }
#pragma unroll
    for (int h = 1; h < NV; h <<= 1)
#pragma unroll
        for (int v = 0; v + h < NV; v += 2 * h) {
            s1v[v] += s1v[v + h];
            s2v[v] += s2v[v + h];
        }
    rsum_t a = s1v[0], b = s2v[0];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        if (!ONLY_B)
            a += __shfl_xor_sync(0xffffffffu, a, o);
        b += __shfl_xor_sync(0xffffffffu, b, o);
    }
    const int slot = (int)(u & (PIPE_SLOTS - 1));
    /* Orders this warp's reads of the slot (row u - 4) before lane 0's store. */
    __syncwarp();
    if ((threadIdx.x & 31) == 0) {
        if (!ONLY_B)
            red[slot][threadIdx.x >> 5][0] = a;
        red[slot][threadIdx.x >> 5][1] = b;
        mbar_arrive(mb + 8u * (unsigned)slot); /* release: the stores above */
    }
}

/* Row u: wait for every warp's share, add them as stripe_sum2 does, then
 * rstd, c, dx and dw's sums exactly as process_row. */
template <class T, int NV, bool ONLY_B, bool DRES>
__device__ __forceinline__ void
pipe_rest(const Params &p, const uint4 *sl, int us, const uint4 (&hx)[NV], const uint4 (&hy)[NV],
          const float (*wv)[Vec<T>::N], float rs, char *dxr, const char *drr,
          const unsigned (&coff)[NV], const bool (&ok)[NV], int g, float (&acc)[NV][Vec<T>::N],
          rsum_t (*red)[PIPE_WARPS][2], unsigned mb, unsigned u)
{
    constexpr int VEC = Vec<T>::N;
    constexpr bool HOLD = pipe_hold(NV);
    const int slot = (int)(u & (PIPE_SLOTS - 1));
    const int lane = threadIdx.x & 31, w0 = (g * p.tpr) >> 5, nw = p.tpr >> 5;
    mbar_wait(mb + 8u * (unsigned)slot, (u / PIPE_SLOTS) & 1u);
#if RNK_LEAN
    rsum_t s1 = !ONLY_B && lane < nw ? red[slot][w0 + lane][0] : (rsum_t)0;
    rsum_t s2 = lane < nw ? red[slot][w0 + lane][1] : (rsum_t)0;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        if (!ONLY_B)
            s1 += __shfl_xor_sync(0xffffffffu, s1, o);
        s2 += __shfl_xor_sync(0xffffffffu, s2, o);
    }
    const float rstd = ONLY_B ? rs : 1.0f / sqrtf((float)(s1 * (rsum_t)p.inv_n) + p.eps);
    const float c = (float)((rsum_t)rstd * (s2 * (rsum_t)p.inv_n));
#else
    (void)lane;
    rsum_t s1 = 0, s2 = 0;
    for (int i = 0; i < nw; i++) {
        if (!ONLY_B)
            s1 += red[slot][w0 + i][0];
        s2 += red[slot][w0 + i][1];
    }
    const float rstd = ONLY_B ? rs : 1.0f / sqrtf((float)(s1 / (rsum_t)p.n) + p.eps);
    const float c = (float)((rsum_t)rstd * (s2 / (rsum_t)p.n));
#endif
#pragma unroll
    for (int v = 0; v < NV; v++) {
        float xf[VEC], yf[VEC], rf[VEC], d[VEC];
        /* (not held: the ring's slot, read only after the wait) */
        Vec<T>::unpack(HOLD ? hx[v] : sl[v * us], xf);
        Vec<T>::unpack(HOLD ? hy[v] : sl[(NV + v) * us], yf);
        if (DRES)
            Vec<T>::unpack(ld16(drr + coff[v]), rf);
#pragma unroll
        for (int e = 0; e < VEC; e++) {
            const float xh = __fmul_rn(xf[e], rstd);
            const float gg = yf[e] * wv[v][e];
            d[e] = rstd * (gg - xh * c);
            if (DRES)
                d[e] += rf[e];
#if RNK_DW_FMA
            acc[v][e] = __fmaf_rn(yf[e], xh, acc[v][e]);
#else
            acc[v][e] = __fadd_rn(acc[v][e], __fmul_rn(yf[e], xh));
#endif
        }
        if (ok[v])
            st16(dxr + coff[v], Vec<T>::pack(d));
    }
}

/*
 * stripe_rows with the exchange split: the same ring, prefetch and commit
 * groups (STAGES - 1 rows in flight), row t's sums published before row
 * t - 1 is finished.  u: the stripe's rows so far in this launch (the
 * mbarriers' phases), advanced by steps.
 */
template <class T, int NV, bool ONLY_B, bool DRES>
__device__ __forceinline__ void
stripe_rows_pipe(const Params &p, int64_t rg, int64_t steps, int g, unsigned sring,
                 const uint4 *ring, const float (*wv)[Vec<T>::N], const unsigned (&coff)[NV],
                 const unsigned (&nb)[NV], const bool (&ok)[NV], float (&acc)[NV][Vec<T>::N],
                 rsum_t (*red)[PIPE_WARPS][2], unsigned mb, unsigned &u)
{
    constexpr int ST = fast_stages(NV);
    constexpr int RS = ring_stages(NV); /* ST + 1 unless pipe_hold */
    constexpr int ES = (int)sizeof(T);
    constexpr int SLOT = 2 * NV;
    const int us = RNK_RING_LANE_MAJOR ? 1 : (int)blockDim.x;
    const unsigned ub = (unsigned)us * 16u;
    const int64_t G = p.G;
#if RNK_LEAN
    const int64_t xstep = p.xstep, ystep = p.ystep, dstep = p.dstep;
#else
    const int64_t xstep = G * p.xs * ES, ystep = G * p.dys * ES, dstep = G * p.dxs * ES;
#endif
    const char *xa = (const char *)p.x + rg * p.xs * ES;
    const char *ya = (const char *)p.dy + rg * p.dys * ES;
    const float *ra = ONLY_B ? p.rstd + rg : nullptr;
    char *dxr = (char *)p.dx + rg * p.dxs * ES; /* the row to finish next */
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
    int sa = ST - 1, sc = 0, sp = 0;      /* stage being filled, being summed, to finish */
    float rp = 0.0f;                      /* rstd given: the row to finish */
    uint4 hx[NV], hy[NV], px[NV], py[NV]; /* held rows (pipe_hold): to sum, to finish */
    const int n = (int)steps;             /* (at most a chunk's rows) */
    for (int t = 0; t < n; t++) {
        if (t + ST - 1 < n) {
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
        pipe_sums<T, NV, ONLY_B>(ring + sc * SLOT * us, us, hx, hy, wv, red, mb, u + (unsigned)t);
        if (t > 0) {
            pipe_rest<T, NV, ONLY_B, DRES>(p, ring + sp * SLOT * us, us, px, py, wv, rp, dxr, drr,
                                           coff, ok, g, acc, red, mb, u + (unsigned)t - 1u);
            dxr += dstep;
            if (DRES)
                drr += drstep;
        }
        if (pipe_hold(NV)) {
#pragma unroll
            for (int v = 0; v < NV; v++) {
                px[v] = hx[v];
                py[v] = hy[v];
            }
        }
        sp = sc;
        rp = rsq[0];
        sa = sa + 1 == RS ? 0 : sa + 1;
        sc = sc + 1 == RS ? 0 : sc + 1;
#pragma unroll
        for (int i = 0; i < ST - 1; i++)
            rsq[i] = rsq[i + 1];
    }
    if (n > 0)
        pipe_rest<T, NV, ONLY_B, DRES>(p, ring + sp * SLOT * us, us, px, py, wv, rp, dxr, drr, coff,
                                       ok, g, acc, red, mb, u + (unsigned)n - 1u);
    cp_async_wait<0>();
    u += (unsigned)n;
}

} /* namespace rnk */

#endif /* RNK_PIPE */

#endif
