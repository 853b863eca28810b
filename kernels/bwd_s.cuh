/* SPDX-License-Identifier: MIT */
/*
 * bwd_s.cuh - the fast path of the fused, deterministic RMSNorm backward for
 * the shapes under rnk.h's interleaved order (bf16 or fp16 rows of 129 to
 * 8192 columns, large enough; rnk_chunking): rows straight from global memory
 * into registers (16-byte loads, the next row in flight while one is
 * reduced), one row per TPR threads, dw summed in registers, the chunk
 * partials finished in the same launch (bwd_finish.cuh).
 *
 * A thread holds one 16-byte vector (8 columns) of a row up to n = 2048,
 * two beyond (s_nv): TPR = the fewest threads, at least a warp, that cover n
 * that way (32 up to n = 256, then 64, 128, 256 up to n = 4096, 512 at
 * n = 8192).  A block of BT = max(128, TPR) threads works
 * on R = BT / TPR rows at once (R = the interleaved order's G: 4 rows of a
 * warp each at n <= 256, 2 rows of two warps each at n <= 512, else 1), one
 * stripe each, in lockstep where a row has several warps (the row
 * exchange's barrier): row j of a chunk goes to stripe j % R, as rnk.h's
 * order says.  Blocks claim chunks (rnk.h: chunk c = rows c, c + P, ...)
 * from an atomic counter; with the default grid each block takes one or
 * two.  A row's two sums (sum of x * g, and of x^2 when rstd is
 * recomputed) meet in a fixed shuffle tree, then, for rows of several
 * warps, at one block barrier per row through a double-buffered array,
 * added over the warps by the same shuffle tree (in fp64 for rows of up to
 * 256 columns: RNK_S_F64_MAXN below).
 *
 * The weight (none, fp32 or the rows' dtype) is read once per block by its
 * dtype at run time: one kernel serves all three.
 *
 * Loads: x, rstd and (when dx is not dy) dy through the read-only path, dy
 * through plain loads when dx aliases it (each row is read whole, by the
 * threads that write it, before any of its dx is stored); the rows evict
 * first from L2, the partials last (bwd_common.cuh's L2 eviction
 * priorities).
 */
#ifndef RNK_BWD_S_CUH
#define RNK_BWD_S_CUH

#include <type_traits>

#include "bwd_finish.cuh"

namespace rnk {

/* rnk.h's RNK_S_RX (2 in production; RNK_S_RX_MAXN 1024): blocks RNK_S_RX
 * times wider for rows of up to RNK_S_RX_MAXN columns (the row classes whose
 * TPR * NV * 8 columns are at most that), so RNK_S_RX times the rows at
 * once (rnk.h's G) and RNK_S_RX times fewer, longer chunks: the same rows a
 * stripe, fewer partials for the finish.  The knob's factor for the row
 * class of TPR threads of NV vectors: */
__host__ __device__ constexpr int s_rx(int tprnv)
{
    return tprnv * 8 <= RNK_S_RX_MAXN ? RNK_S_RX : 1;
}

/* Block shape of TPR threads a row holding NV vectors each: BT threads, R
 * rows at once, MINB blocks a SM (32 / NV warps: 64 * NV registers a
 * thread). */
template <int TPR, int NV = 1> struct SShape {
    static constexpr int BT = (TPR < 128 ? 128 : TPR) * s_rx(TPR * NV);
    static constexpr int R = BT / TPR;
    static constexpr int WPR = TPR / 32;
    static constexpr int MINB = 1024 / (BT * NV) > 0 ? 1024 / (BT * NV) : 1;
};
/* The row sums' type of the row class of TPR threads of NV vectors (8
 * columns each): fp64 for the classes up to RNK_S_F64_MAXN columns, else
 * rsum_t (bwd_common.cuh's RNK_ROW_F64=1 makes every path's sums fp64).
 * 256 in production: fp64 sums on S's rows of up to 256 columns cost
 * 0.7-1.0 % over the benchmark grid (2-10 % at N = 256; compiled for three
 * blocks a SM, without the row loop's spills, they cost more) and take
 * 4096 x 256's worst dx element (bf16 weight) from 1.15 to 0.50 ulp (eager
 * 0.52), and from 342 and 17 to 8.3 and 5.7 ulp on two other seeds; on
 * every path they cost 1.1 % (H100, 2026-12-07, bench/RESULTS.md).  0: fp32
 * sums there too. */
#ifndef RNK_S_F64_MAXN
#define RNK_S_F64_MAXN 256
#endif
template <int TPR, int NV>
using s_rsum_t = typename std::conditional<(TPR * NV * 8 <= RNK_S_F64_MAXN), double, rsum_t>::type;

/* a[0] + ... + a[K-1] pairwise (K a power of two): neighbours first, then
 * pairs of pairs, ... (RNK_S_F64_MAXN's in-thread sums). */
template <int K> __device__ __forceinline__ double s_pairwise(double (&a)[K])
{
    static_assert((K & (K - 1)) == 0, "s_pairwise: a power of two");
#pragma unroll
    for (int w = 1; w < K; w *= 2)
#pragma unroll
        for (int i = 0; i + w < K; i += 2 * w)
            a[i] += a[i + w];
    return a[0];
}

/* RNK_S_FEW (a knob for benchmark builds, 0 in production): where the
 * launch's work (its chunks, or the finish's slices if more) fits in
 * RNK_S_FEW blocks a SM, the kernels of one vector a thread (rows of up to
 * 2048 columns, compiled for 1024 / BT blocks a SM: 64 registers) run as
 * an instance compiled for RNK_S_FEW blocks a SM, whose registers hold the
 * row loop without spills (m = 4096 up to 1024 columns: 256 chunks on 132
 * SMs).  The same source, so the same results, bit for bit. */
#ifndef RNK_S_FEW
#define RNK_S_FEW 0
#endif

/* RNK_S_PP (a knob for benchmark builds, 0 in production): the row loop
 * unrolled by two, so that its two row buffers take turns.  In
 * production's loop the next row's values are moved into the current
 * row's registers at the loop's head (cur = nx); the moves wait for their
 * loads, and only then do the next row's loads go out, so while a warp
 * waits for a row no other row of it is in flight (production's SASS: the
 * moves at the head of the row loop, then its loads; ncu put 38 % of the
 * warps' stalls there).  Unrolled, row t + 1's loads can go out before
 * row t's are waited for: two rows in flight in the same registers, as the
 * streaming kernel shaped as S (bench_kernel --floor) loads.  1: every S
 * kernel; 2: those of several warps a row (from 257 columns: the kernel
 * of up to 256, with its fp64 sums, spills more unrolled). */
#ifndef RNK_S_PP
#define RNK_S_PP 0
#endif
__host__ __device__ constexpr bool s_pp(int tpr)
{
    return RNK_S_PP == 1 || (RNK_S_PP == 2 && tpr > 32);
}

/* RNK_S_LAG (a knob for benchmark builds, 0 in production): the row
 * exchange one row late.  A warp adds its part of row t + 1 and arrives at
 * that row's mbarrier before it waits at row t's, so that warps whose loads
 * came early run a row ahead of those whose loads came late instead of
 * waiting for them at every row; the rows in flight go from one to two
 * (three row buffers, the loop unrolled by three so that none is moved).
 * 1: the kernels of two vectors a thread (2049-8192 columns, 128
 * registers); 2: every S kernel whose rows have several warps. */
#ifndef RNK_S_LAG
#define RNK_S_LAG 0
#endif
__host__ __device__ constexpr bool s_lag(int tpr, int nv)
{
    return tpr > 32 && (RNK_S_LAG >= 2 || (RNK_S_LAG == 1 && nv == 2));
}

__device__ __forceinline__ void mbar_init(unsigned long long *b, unsigned count)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(b)), "r"(count)
                 : "memory");
}
/* (release at the CTA's scope: the arriving thread's shared stores first) */
__device__ __forceinline__ void mbar_arrive(unsigned long long *b)
{
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_addr(b)) : "memory");
}
/* Until the phase of this parity completes (acquire at the CTA's scope). */
__device__ __forceinline__ void mbar_wait(unsigned long long *b, unsigned parity)
{
    asm volatile("{\n\t.reg .pred P1;\n"
                 "LAB_WAIT:\n\t"
                 "mbarrier.try_wait.parity.shared::cta.b64 P1, [%0], %1;\n\t"
                 "@P1 bra DONE;\n\t"
                 "bra LAB_WAIT;\n"
                 "DONE:\n\t}" ::"r"(smem_addr(b)),
                 "r"(parity)
                 : "memory");
}

/* RNK_S_LAG's shared arrays: the weight (each thread's columns, out of its
 * registers) and the mbarriers of rows 0, 2, ... and 1, 3, ...; none (an
 * empty base, taking no place) where the knob is off. */
template <bool LAG, int W> struct SLagShared {
    float wsm[W];
    unsigned long long mbar[2];
};
template <int W> struct SLagShared<false, W> {
};

/* The block's shared arrays: the row sums of each warp (double-buffered by
 * parity), stripes 1 .. R-1's dw sums for the chunk's partial, ATOMIC's flag. */
template <int TPR, int VEC, int NV = 1>
struct SShared : SLagShared<s_lag(TPR, NV), TPR * VEC * NV> {
    s_rsum_t<TPR, NV> red[s_lag(TPR, NV) ? 4 : 2][SShape<TPR, NV>::R][SShape<TPR, NV>::WPR][2];
    float comb[SShape<TPR, NV>::R > 1 ? (SShape<TPR, NV>::R - 1) * TPR * VEC * NV : 1];
    int claim[2], last;
};
/* The fast path's widest row: 8192 columns (512 threads of 16). */
enum { S_MAX_N = 8192 };

/* 16-byte vectors a thread holds of a row of 1025-2048, 2049-4096 and
 * 4097-8192 columns (knobs for benchmark builds), the row then taking that
 * many times fewer threads.  Vector v of a thread is at column
 * lt * 8 + v * TPR * 8, so that each load instruction of a warp still covers
 * 512 contiguous bytes.  Two from 2049 columns: half the warps a row meet at
 * its barrier, as many bytes in flight (0.7-1.5 % faster on an H100,
 * bench/RESULTS.md 2026-12-06 16:07); at 1025-2048 two were 3 % slower at
 * small M. */
#ifndef RNK_S_NV2K
#define RNK_S_NV2K 1
#endif
#ifndef RNK_S_NV4K
#define RNK_S_NV4K 2
#endif
#ifndef RNK_S_NV8K
#define RNK_S_NV8K 2
#endif

/* Vectors a thread holds of a row of n columns (n <= S_MAX_N). */
__host__ __device__ constexpr int s_nv(int64_t n)
{
    return n <= 1024 ? 1 : n <= 2048 ? RNK_S_NV2K : n <= 4096 ? RNK_S_NV4K : RNK_S_NV8K;
}

/* Threads a row for n columns (n <= S_MAX_N): the host's plan and the
 * variants use it. */
__host__ __device__ constexpr int s_tpr(int64_t n)
{
    return (n <= 256 ? 32 : n <= 512 ? 64 : n <= 1024 ? 128 : n <= 2048 ? 256 : n <= 4096 ? 512
                                                                                            : 1024) /
           s_nv(n);
}

__device__ __forceinline__ uint4 ldnc16(const void *p)
{
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.L2::cache_hint.v4.u32 {%0,%1,%2,%3}, [%4], %5;"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p), "l"(l2_evict_first()));
    return v;
}

/* A row's two sums over a warp by a fixed shuffle tree (s1 only when rstd
 * is recomputed): every lane ends with the warp's sums. */
template <bool RS, class A> __device__ __forceinline__ void s_warp_sum(A &s1, A &s2)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        if (!RS)
            s1 += __shfl_xor_sync(0xffffffffu, s1, o);
        s2 += __shfl_xor_sync(0xffffffffu, s2, o);
    }
}

/* One row's share of a thread: x, dy, dres vectors and rstd (zeros when the
 * row is past the chunk or the vector past n). */
template <int NV> struct SRow {
    uint4 x[NV], y[NV], r[NV];
    float rs;
};

/* cstep: columns between a thread's vectors (TPR * 8). */
template <class T, bool RS, bool DRES, int NV>
__device__ __forceinline__ void s_load(const Params &p, SRow<NV> &d, int64_t row, bool on,
                                       int col, const bool (&ok)[NV], int cstep, bool nc)
{
    constexpr int64_t ES = (int64_t)sizeof(T);
#pragma unroll
    for (int v = 0; v < NV; v++)
        d.x[v] = d.y[v] = d.r[v] = make_uint4(0u, 0u, 0u, 0u);
    d.rs = 0.0f;
    if (!on)
        return;
#pragma unroll
    for (int v = 0; v < NV; v++)
        if (ok[v]) {
            const int c = col + v * cstep;
            d.x[v] = ldnc16((const char *)p.x + (row * p.xs + c) * ES);
            const char *yp = (const char *)p.dy + (row * p.dys + c) * ES;
            d.y[v] = nc ? ldnc16(yp) : ld16(yp);
            if (DRES)
                d.r[v] = ld16((const char *)p.dres + (row * p.drs + c) * ES);
        }
    if (RS)
        d.rs = __ldg(p.rstd + row);
}

#if RNK_S_LAG
/* RNK_S_LAG's rows of chunk k (s_chunks' loop, the exchange a row late):
 * row t + 1's sums go out before row t's come in.  ph counts the block's
 * rows so far: row ph's sums go to red[ph % 4], its arrivals to mbarrier
 * mbar[ph % 2], phase ph / 2 of that barrier.  Four slots: a warp writes
 * row t + 4's sums only after it waited at row t + 2, which every warp
 * arrives at after it read row t's (with three, row t + 3's would follow
 * only the wait at row t + 1, whose arrivals come before the reads of row
 * t's).
 * A phase cannot complete twice while a warp waits at it: row t + 2's needs
 * that warp's own arrival, which comes after its wait at row t. */
template <class T, int TPR, bool RS, bool DRES, int NV>
__device__ __forceinline__ void s_rows_lag(const Params &p, SShared<TPR, Vec<T>::N, NV> &sh, int k,
                                           int64_t cnt, int64_t iters, int col,
                                           const bool (&ok)[NV], bool nc,
                                           float (&acc)[NV][Vec<T>::N], int &ph)
{
    using RT = s_rsum_t<TPR, NV>;
    constexpr int R = SShape<TPR, NV>::R, WPR = SShape<TPR, NV>::WPR, VEC = Vec<T>::N;
    constexpr int CS = TPR * VEC;
    constexpr int64_t ES = (int64_t)sizeof(T);
    const int tid = threadIdx.x, grp = tid / TPR, lane = tid & 31, wir = (tid % TPR) >> 5;
    const int64_t P = p.nchunks;
    /* The weights of vector v (sh.wsm: this thread's own columns). */
    auto wload = [&](int v, float (&w)[VEC]) {
#pragma unroll
        for (int e = 0; e < VEC; e += 4) {
            const float4 q = *reinterpret_cast<const float4 *>(&sh.wsm[col + v * CS + e]);
            w[e] = q.x, w[e + 1] = q.y, w[e + 2] = q.z, w[e + 3] = q.w;
        }
    };
    /* This warp's part of a row: its sums into slot q, then its arrival. */
    auto part = [&](const SRow<NV> &d, int q) {
        RT s1 = 0.0f, s2 = 0.0f;
#pragma unroll
        for (int v = 0; v < NV; v++) {
            float xf[VEC], yf[VEC], w[VEC];
            Vec<T>::unpack(d.x[v], xf);
            Vec<T>::unpack(d.y[v], yf);
            wload(v, w);
#pragma unroll
            for (int e = 0; e < VEC; e++) {
                if (!RS)
                    s1 += (RT)(xf[e] * xf[e]);
                s2 += (RT)(xf[e] * (yf[e] * w[e]));
            }
        }
        s_warp_sum<RS>(s1, s2);
        if (lane == 0) {
            sh.red[q & 3][grp][wir][0] = s1;
            sh.red[q & 3][grp][wir][1] = s2;
            mbar_arrive(&sh.mbar[q & 1]);
        }
    };
    /* Row t (the block's row q): its sums once every warp's part is in,
     * then dx and dw as s_chunks' loop. */
    auto out = [&](const SRow<NV> &d, int64_t t, int q) {
        mbar_wait(&sh.mbar[q & 1], (unsigned)(q >> 1) & 1u);
        RT s1 = !RS && lane < WPR ? sh.red[q & 3][grp][lane][0] : 0.0f;
        RT s2 = lane < WPR ? sh.red[q & 3][grp][lane][1] : 0.0f;
        s_warp_sum<RS>(s1, s2);
        const int64_t j = t * R + grp;
        if (j >= cnt)
            return;
        const float rstd = RS ? d.rs : 1.0f / sqrtf((float)(s1 * (RT)p.inv_n) + p.eps);
        const float c = (float)((RT)rstd * (s2 * (RT)p.inv_n));
#pragma unroll
        for (int v = 0; v < NV; v++) {
            float xf[VEC], yf[VEC], rf[VEC], o[VEC], w[VEC];
            Vec<T>::unpack(d.x[v], xf);
            Vec<T>::unpack(d.y[v], yf);
            if (DRES)
                Vec<T>::unpack(d.r[v], rf);
            wload(v, w);
#pragma unroll
            for (int e = 0; e < VEC; e++) {
                const float xh = __fmul_rn(xf[e], rstd);
                o[e] = dx_elem(yf[e], w[e], xh, rstd, c);
                if (DRES)
                    o[e] += rf[e];
                acc[v][e] = dw_step(acc[v][e], yf[e], xh);
            }
            if (ok[v])
                st16((char *)p.dx + ((k + j * P) * p.dxs + col + v * CS) * ES, Vec<T>::pack(o));
        }
    };
    SRow<NV> b[3];
    s_load<T, RS, DRES, NV>(p, b[0], k + grp * P, grp < cnt, col, ok, CS, nc);
    s_load<T, RS, DRES, NV>(p, b[1], k + (R + grp) * P, R + grp < cnt, col, ok, CS, nc);
    part(b[0], ph);
#pragma unroll 1
    for (int64_t t0 = 0; t0 < iters; t0 += 3) {
#pragma unroll
        for (int s = 0; s < 3; s++) {
            const int64_t t = t0 + s, j2 = (t + 2) * R + grp;
            if (t >= iters) /* (the same for the whole block) */
                break;
            s_load<T, RS, DRES, NV>(p, b[(s + 2) % 3], k + j2 * P, j2 < cnt, col, ok, CS, nc);
            if (t + 1 < iters)
                part(b[(s + 1) % 3], ph + 1);
            out(b[s], t, ph);
            ph++;
        }
    }
}
#endif

/*
 * The claim loop from the block's first chunk k0 on: rows, dx, the chunk's
 * partial (stripes added in order: p = +0 + stripe_0 + ... + stripe_{R-1})
 * and its publication.  RS: rstd given; DRES: dresidual_out added.
 */
template <class T, int TPR, int MODE, bool RS, bool DRES, int NV>
__device__ __forceinline__ void s_chunks(const Params &p, SShared<TPR, Vec<T>::N, NV> &sh)
{
    using S = SShape<TPR, NV>;
    using RT = s_rsum_t<TPR, NV>;
    constexpr int R = S::R, WPR = S::WPR, VEC = Vec<T>::N, CS = TPR * VEC, W = CS * NV;
    constexpr int64_t ES = (int64_t)sizeof(T);
    auto &red = sh.red;
    float *comb = sh.comb;
    int *s_claim = sh.claim;
    const int tid = threadIdx.x, grp = tid / TPR, lt = tid % TPR;
    const int lane = tid & 31, wir = lt >> 5;
    const int col = lt * VEC;
    bool ok[NV];
#pragma unroll
    for (int v = 0; v < NV; v++)
        ok[v] = col + v * CS < p.n;
    const bool nc = p.dx != p.dy;
    const int64_t P = p.nchunks;
    float wv[NV][VEC];
#pragma unroll
    for (int v = 0; v < NV; v++)
#pragma unroll
        for (int e = 0; e < VEC; e++)
            wv[v][e] = ok[v] ? (p.w ? ld_any(p.w_dt, p.w, col + v * CS + e) + p.offset : 1.0f)
                                    : 0.0f;

    int it = 0, par = 0;
#if RNK_S_LAG
    int ph = 0; /* (s_rows_lag) */
    if constexpr (s_lag(TPR, NV))
#pragma unroll
        for (int v = 0; v < NV; v++)
#pragma unroll
            for (int e = 0; e < VEC; e++)
                sh.wsm[col + v * CS + e] = wv[v][e];
#endif
    for (int k = s_claim[0]; k < p.nchunks; it++, k = s_claim[it & 1]) {
        unsigned nxt = claim_issue(p);
        const int64_t cnt = chunk_len(p, k);
        const int64_t iters = (cnt + R - 1) / R;
        float acc[NV][VEC];
#pragma unroll
        for (int v = 0; v < NV; v++)
#pragma unroll
            for (int e = 0; e < VEC; e++)
                acc[v][e] = 0.0f;
        SRow<NV> cur;
#if RNK_S_LAG
        if constexpr (s_lag(TPR, NV))
            s_rows_lag<T, TPR, RS, DRES, NV>(p, sh, k, cnt, iters, col, ok, nc, acc, ph);
        else
#endif
            s_load<T, RS, DRES, NV>(p, cur, k + grp * P, grp < cnt, col, ok, CS, nc);
#pragma unroll(s_pp(TPR) ? 2 : 1)
        for (int64_t t = 0; t < (s_lag(TPR, NV) ? 0 : iters); t++) {
            const int64_t j = t * R + grp, jn = j + R;
            SRow<NV> nx;
            s_load<T, RS, DRES, NV>(p, nx, k + jn * P, jn < cnt, col, ok, CS, nc);
            float xf[NV][VEC], yf[NV][VEC];
#pragma unroll
            for (int v = 0; v < NV; v++) {
                Vec<T>::unpack(cur.x[v], xf[v]);
                Vec<T>::unpack(cur.y[v], yf[v]);
            }
            RT s1 = 0.0f, s2 = 0.0f;
            if constexpr (std::is_same<RT, double>::value) {
                /* fp64 sums (RNK_S_F64_MAXN): the thread's products added
                 * pairwise, three additions deep, not in a chain of eight:
                 * the latency the fp64 adds would put on a short row. */
                double q1[NV * VEC], q2[NV * VEC];
#pragma unroll
                for (int v = 0; v < NV; v++)
#pragma unroll
                    for (int e = 0; e < VEC; e++) {
                        q1[v * VEC + e] = RS ? 0.0 : (double)(xf[v][e] * xf[v][e]);
                        q2[v * VEC + e] = (double)(xf[v][e] * (yf[v][e] * wv[v][e]));
                    }
                if (!RS)
                    s1 = s_pairwise(q1);
                s2 = s_pairwise(q2);
            } else {
#pragma unroll
                for (int v = 0; v < NV; v++)
#pragma unroll
                    for (int e = 0; e < VEC; e++) {
                        if (!RS)
                            s1 += (RT)(xf[v][e] * xf[v][e]);
                        s2 += (RT)(xf[v][e] * (yf[v][e] * wv[v][e]));
                    }
            }
            s_warp_sum<RS>(s1, s2);
            if (WPR > 1) {
                if (lane == 0) {
                    red[par][grp][wir][0] = s1;
                    red[par][grp][wir][1] = s2;
                }
                __syncthreads();
                /* Lane i takes warp i's sums (zeros past the row's warps),
                 * then the same fixed shuffle tree: every lane ends with the
                 * row's sums. */
                s1 = !RS && lane < WPR ? red[par][grp][lane][0] : 0.0f;
                s2 = lane < WPR ? red[par][grp][lane][1] : 0.0f;
                s_warp_sum<RS>(s1, s2);
                par ^= 1;
            }
            if (j < cnt) {
                const float rstd =
                    RS ? cur.rs : 1.0f / sqrtf((float)(s1 * (RT)p.inv_n) + p.eps);
                const float c = (float)((RT)rstd * (s2 * (RT)p.inv_n));
#pragma unroll
                for (int v = 0; v < NV; v++) {
                    float rf[VEC], d[VEC];
                    if (DRES)
                        Vec<T>::unpack(cur.r[v], rf);
#pragma unroll
                    for (int e = 0; e < VEC; e++) {
                        const float xh = __fmul_rn(xf[v][e], rstd);
                        d[e] = dx_elem(yf[v][e], wv[v][e], xh, rstd, c);
                        if (DRES)
                            d[e] += rf[e];
                        acc[v][e] = dw_step(acc[v][e], yf[v][e], xh);
                    }
                    if (ok[v])
                        st16((char *)p.dx + ((k + j * P) * p.dxs + col + v * CS) * ES,
                             Vec<T>::pack(d));
                }
            }
            cur = nx;
        }
        if (tid == 0)
            s_claim[(it + 1) & 1] = (int)nxt;
        if (!p.dw) {
            __syncthreads();
            trace_chunk(p, s_claim[it & 1]);
            continue;
        }
        if (R > 1) {
            if (grp > 0)
#pragma unroll
                for (int v = 0; v < NV; v++)
                    if (ok[v])
#pragma unroll
                        for (int e = 0; e < VEC; e++)
                            comb[(grp - 1) * W + col + v * CS + e] = acc[v][e];
            __syncthreads();
        }
        if (grp == 0) {
#pragma unroll
            for (int v = 0; v < NV; v++) {
                if (!ok[v])
                    continue;
                const int cv = col + v * CS;
                float q[VEC];
#pragma unroll
                for (int e = 0; e < VEC; e++) {
                    q[e] = __fadd_rn(0.0f, acc[v][e]);
#pragma unroll
                    for (int g = 1; g < R; g++)
                        q[e] = __fadd_rn(q[e], comb[(g - 1) * W + cv + e]);
                }
                if (MODE == MODE_ATOMIC) {
#pragma unroll
                    for (int e = 0; e < VEC; e++)
                        atomicAdd(p.acc + cv + e, q[e]);
                } else {
                    float *part = p.part + (int64_t)k * p.cs + cv;
#pragma unroll
                    for (int e = 0; e < VEC; e += 4)
                        st_part4(part + e, make_float4(q[e], q[e + 1], q[e + 2], q[e + 3]));
                }
            }
        }
        if (MODE == MODE_ATOMIC)
            atomic_tail(p, &sh.last);
        else if (MODE == MODE_FUSED)
            publish_chunk(p);
        else
            __syncthreads();
        trace_chunk(p, s_claim[it & 1]);
    }
    trace_rows_done(p, it);
}

/* LB: blocks a SM the kernel is compiled for, SShape's MINB when 0
 * (RNK_S_FEW's instances: fewer, with more registers a thread). */
template <class T, int TPR, int MODE, int NV = 1, int LB = 0>
__global__ void __launch_bounds__(SShape<TPR, NV>::BT, LB ? LB : SShape<TPR, NV>::MINB)
    s_kernel(Params p)
{
    __shared__ SShared<TPR, Vec<T>::N, NV> sh;
    trace_start(p, 3u);
    /* The first claim goes out before the cancel word is known, as on the
     * other paths (bwd_kernel.cuh). */
    const unsigned nxt = claim_issue(p);
    if (int c = cancelled(p); c != CANCEL_CLEAR) {
        finish_and_exit<true, SShape<TPR, NV>::BT>(p, nullptr, false, c != CANCEL_GATED);
        return;
    }
    if (threadIdx.x == 0) {
        sh.claim[0] = (int)nxt;
#if RNK_S_LAG
        if constexpr (s_lag(TPR, NV)) {
            mbar_init(&sh.mbar[0], SShape<TPR, NV>::BT / 32);
            mbar_init(&sh.mbar[1], SShape<TPR, NV>::BT / 32);
        }
#endif
    }
    __syncthreads();
    trace_mark(p, 1, 1);
    if (p.rstd && !p.dres)
        s_chunks<T, TPR, MODE, true, false, NV>(p, sh);
    else if (p.rstd)
        s_chunks<T, TPR, MODE, true, true, NV>(p, sh);
    else if (!p.dres)
        s_chunks<T, TPR, MODE, false, false, NV>(p, sh);
    else
        s_chunks<T, TPR, MODE, false, true, NV>(p, sh);
    finish_and_exit<true, SShape<TPR, NV>::BT>(p, nullptr, MODE == MODE_FUSED);
}

} /* namespace rnk */

#endif
