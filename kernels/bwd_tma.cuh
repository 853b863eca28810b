/* SPDX-License-Identifier: MIT */
/*
 * bwd_tma.cuh - RNK_TMA = 1 (being measured, off by default): the fast
 * path's rows staged by the Tensor Memory Accelerator instead of each
 * thread's cp.async.  Included by bwd_kernel.cuh.
 *
 * Why: ncu had each warp's 16-byte-per-thread cp.async ask L2 for 32
 * sectors where 16 carry the data, and 12 shared-memory wavefronts where 4
 * would do (bench/RESULTS.md, "Issue 15, sixth attempt").  A bulk copy
 * (cp.async.bulk) moves a whole row of x or dy, n * sizeof(T) contiguous
 * bytes, in one request issued by one thread, and signals an mbarrier when
 * its bytes have landed.
 *
 * Layout: stripe g's stage s is a row buffer of 2 * NV * tpr 16-byte
 * vectors in the ring's memory: x's row from vector 0, dy's from vector
 * NV * tpr.  Thread lt's vector v of a row is vector v * tpr + lt there,
 * so process_row reads it unchanged (sl = buffer + lt, us = tpr), a warp
 * reading 512 contiguous bytes.  The copies write exactly n * sizeof(T)
 * bytes a row; the vectors past n (threads with !ok[v]) are never written
 * by them, and are zeroed at the start of every chunk (the stripe combine
 * and the finish reuse the ring's memory in between): each such vector is
 * written and read by its own thread only.
 *
 * Ordering: one mbarrier per stripe and stage (arrival count 1: the
 * stripe's lane 0 arrives with the row's byte count, then issues both
 * copies); the stripe's threads wait for the stage's phase before they
 * read it.  The row in stage s is stripe row q (counted across the block's
 * chunks), q % ST == s, phase parity (q / ST) & 1.  A stage is refilled
 * only when every thread of the stripe is done reading it: at the top of
 * step t every thread of the stripe has passed row t - 1's barrier
 * (stripe_sum2: the named barrier, or the warp's shuffles for a stripe of
 * one warp), which comes after its reads of row t - 1 when the row is held
 * in registers (RNK_HOLD >= 1), and after all of row t - 2 in any case; so
 * row t + L goes into the stage of row t - 1 (L = ST - 1 rows ahead) when
 * rows are held, else of row t - 2 (L = ST - 2).  Lane 0 then fences the
 * async proxy (fence.proxy.async) against the generic reads and writes of
 * that memory before the copy.
 */
#ifndef RNK_BWD_TMA_CUH
#define RNK_BWD_TMA_CUH

/* Stripes x stages of mbarriers a block may need: 512 threads, stripes of
 * one warp, 4 stages. */
enum { TMA_MAX_BARS = 16 * 4 };

__device__ __forceinline__ void mbar_init(unsigned bar, unsigned count)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}

/* Make the inits visible to the async proxy (the copies complete on them). */
__device__ __forceinline__ void mbar_init_fence()
{
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

__device__ __forceinline__ void mbar_arrive_tx(unsigned bar, unsigned bytes)
{
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes)
                 : "memory");
}

__device__ __forceinline__ void mbar_wait(unsigned bar, unsigned parity)
{
    asm volatile("{\n"
                 ".reg .pred p;\n"
                 "RNK_TMA_WAIT_%=:\n"
                 "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
                 "@!p bra RNK_TMA_WAIT_%=;\n"
                 "}" ::"r"(bar),
                 "r"(parity)
                 : "memory");
}

/* Generic-proxy accesses of shared memory before, the async proxy's after. */
__device__ __forceinline__ void fence_proxy_async()
{
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

/* bytes (a multiple of 16) from global src to shared dst (both 16-byte
 * aligned), completing on bar. */
__device__ __forceinline__ void bulk_copy(unsigned dst, const void *src, unsigned bytes,
                                          unsigned bar)
{
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes "
                 "[%0], [%1], %2, [%3];" ::"r"(dst),
                 "l"(src), "r"(bytes), "r"(bar)
                 : "memory");
}

/* The block's mbarriers, at the kernel's start (a __syncthreads follows). */
__device__ __forceinline__ void tma_init(unsigned bars, int nbars)
{
    if ((int)threadIdx.x < nbars)
        mbar_init(bars + threadIdx.x * 8u, 1u);
    if (threadIdx.x == 0)
        mbar_init_fence();
}

/*
 * stripe_rows with bulk copies: the same rows, the same process_row, the
 * same order of every sum.  buf: the stripe's first stage (uint4s); sbuf
 * its shared address; bars: the shared address of the stripe's ST
 * mbarriers; q: the stripe's rows staged so far (updated).
 */
template <class T, int NV, bool ONLY_B, bool DRES>
__device__ __forceinline__ void stripe_rows_tma(const Params &p, int64_t rg, int64_t steps, int g,
                                                uint4 *buf, unsigned sbuf, unsigned bars,
                                                unsigned &q, const float (*wv)[Vec<T>::N],
                                                const unsigned (&coff)[NV], const bool (&ok)[NV],
                                                float (&acc)[NV][Vec<T>::N],
                                                rsum_t (*red)[32][2])
{
    constexpr int ST = fast_stages(NV);
    constexpr int HOLD = RNK_HOLD == 2 && NV > RNK_HOLD_NV ? 0 : RNK_HOLD;
    constexpr int L = HOLD >= 1 ? ST - 1 : ST - 2; /* rows in flight ahead */
    static_assert(L >= 1, "RNK_TMA: rows not held need 3 stages or more");
    static_assert(ST <= TMA_MAX_BARS / 16, "RNK_TMA: more stages than mbarriers");
    constexpr int ES = (int)sizeof(T);
    const int tpr = p.tpr, lt = (int)threadIdx.x - g * tpr;
    const int sv = 2 * NV * tpr; /* vectors a stage */
    const unsigned rowb = (unsigned)(p.n * ES);
    const bool issuer = lt == 0;
#if RNK_LEAN
    const int64_t xstep = p.xstep, ystep = p.ystep, dstep = p.dstep;
#else
    const int64_t G = p.G;
    const int64_t xstep = G * p.xs * ES, ystep = G * p.dys * ES, dstep = G * p.dxs * ES;
#endif
    const char *xa = (const char *)p.x + rg * p.xs * ES;
    const char *ya = (const char *)p.dy + rg * p.dys * ES;
    const float *ra = ONLY_B ? p.rstd + rg : nullptr;
    char *dxr = (char *)p.dx + rg * p.dxs * ES;
    const char *drr = DRES ? (const char *)p.dres + rg * p.drs * ES : nullptr;
    const int64_t drstep = DRES ? (RNK_LEAN ? p.drstep : p.G * p.drs * ES) : 0;

    if (steps <= 0)
        return;
    /* The vectors past n read as zeros (their own thread's, never copied). */
#pragma unroll
    for (int v = 0; v < NV; v++)
        if (!ok[v])
#pragma unroll
            for (int s = 0; s < ST; s++) {
                buf[s * sv + v * tpr + lt] = make_uint4(0, 0, 0, 0);
                buf[s * sv + (NV + v) * tpr + lt] = make_uint4(0, 0, 0, 0);
            }
    float rsq[L + 1]; /* rsq[0]: the row being reduced; rsq[L]: the row staged */
#pragma unroll
    for (int i = 0; i <= L; i++)
        rsq[i] = 0.0f;
    /* Step t stages row t + L and reduces row t (t < 0: filling). */
    for (int64_t t = -L; t < steps; t++) {
        if (t + L < steps) {
            /* The copies overwrite what the comb, the finish or row t - 1
             * (t - 2) left, after the barrier that ended those: lane 0
             * fences the async proxy first. */
            const unsigned s = (q + (unsigned)(t + L)) % ST, bar = bars + s * 8u;
            if (tpr == 32)
                __syncwarp();
            if (issuer) {
                fence_proxy_async();
                mbar_arrive_tx(bar, 2u * rowb);
                bulk_copy(sbuf + s * (unsigned)sv * 16u, xa, rowb, bar);
                bulk_copy(sbuf + (s * (unsigned)sv + (unsigned)(NV * tpr)) * 16u, ya, rowb, bar);
            }
            if (ONLY_B) {
                rsq[L] = __ldg(ra);
                ra += p.G;
            }
            xa += xstep;
            ya += ystep;
        }
        if (t >= 0) {
            const unsigned qt = q + (unsigned)t, sc = qt % ST;
            mbar_wait(bars + sc * 8u, (qt / ST) & 1u);
            process_row<T, NV, ONLY_B, DRES>(p, buf + sc * sv + lt, tpr, wv, rsq[0], dxr, drr, coff,
                                             ok, g, (int)(t & 1), acc, red);
            dxr += dstep;
            if (DRES)
                drr += drstep;
        }
#pragma unroll
        for (int i = 0; i < L; i++)
            rsq[i] = rsq[i + 1];
    }
    q += (unsigned)steps;
}

#endif
