/* SPDX-License-Identifier: MIT */
/*
 * bwd_s.cuh - the fast path of the fused, deterministic RMSNorm backward for
 * the shapes under rnk.h's interleaved order (bf16 or fp16 rows of 257 to
 * 8192 columns, large enough; rnk_chunking): rows straight from global memory
 * into registers (16-byte loads, the next row in flight while one is
 * reduced), one row per TPR threads, dw summed in registers, the chunk
 * partials finished in the same launch (bwd_finish.cuh).
 *
 * A thread holds one 16-byte vector (8 columns) of a row: TPR = the fewest
 * threads, at least a warp, that cover n (32 up to n = 256, then 64, 128,
 * 256, 512, 1024 at n = 8192).  A block of BT = max(128, TPR) threads works
 * on R = BT / TPR rows at once (R = the interleaved order's G: 2 rows of two
 * warps each at n <= 512, else 1; the template also has R = 4 rows of a warp
 * for n <= 256, which no order uses now), one stripe each, in lockstep:
 * row j of a chunk goes to stripe j % R, as rnk.h's order says.  Blocks claim
 * chunks (rnk.h: chunk c = rows c, c + P, ...) from an atomic counter; with
 * the default grid each block takes one or two.  A row's two sums (sum of
 * x * g, and of x^2 when rstd is recomputed) meet in a fixed shuffle tree,
 * then, for rows of several warps, at one block barrier per row through a
 * double-buffered array, added over the warps by the same shuffle tree.
 *
 * The weight (none, fp32 or the rows' dtype) is read once per block by its
 * dtype at run time: one kernel serves all three.
 *
 * Loads: x, rstd and (when dx is not dy) dy through the read-only path, dy
 * through plain loads when dx aliases it (each row is read whole, by the
 * threads that write it, before any of its dx is stored).
 */
#ifndef RNK_BWD_S_CUH
#define RNK_BWD_S_CUH

#include "bwd_finish.cuh"

namespace rnk {

/*
 * RNK_S_SPLIT (an experiment, off): for rstd given, the row exchange's block
 * barrier split in two phases.  Lane 0 of each warp posts the warp's sums and
 * arrives on an mbarrier (release), then the warp does the row's work that
 * needs no row sum (xhat = x * rstd, dw's additions, dres's unpack) while the
 * other warps arrive, and only then waits for the phase (acquire) and reads
 * the sums.  1: one mbarrier for the block's warps (the same warps meet as at
 * production's __syncthreads); 2: one a stripe (where R > 1, n <= 512, a
 * stripe's warps wait only for each other).  The same additions in the same
 * order: dw is production's bit for bit; dx is written rounding by rounding
 * as production's build computes it (s_split_dx).  rstd recomputed (its
 * rstd needs the sum) and rows of one warp (no barrier) are production's
 * code.
 */
#ifndef RNK_S_SPLIT
#define RNK_S_SPLIT 0
#endif

/*
 * RNK_S_PP (an experiment, off): the row loop unrolled by two with the two
 * row buffers taking turns.  Production copies the next row's registers
 * into the current row's at the top of each iteration (cur = nx), and that
 * copy waits for the next row's loads to land before the row after it is
 * asked for: a warp has one row's loads in flight while it waits.  Taking
 * turns asks for row t + 2 before it waits for row t + 1: two rows in
 * flight, with the same registers.  The same arithmetic a row (dw
 * production's bit for bit; dx as ptxas contracts each copy).  For rstd
 * given only (recomputed, ptxas spills in the loop at 64 registers).
 */
#ifndef RNK_S_PP
#define RNK_S_PP 0
#endif

/* Block shape of TPR threads a row: BT threads, R rows at once, MINB blocks
 * a SM (32 warps: 64 registers a thread). */
template <int TPR> struct SShape {
    static constexpr int BT = TPR < 128 ? 128 : TPR;
    static constexpr int R = BT / TPR;
    static constexpr int WPR = TPR / 32;
    static constexpr int MINB = 1024 / BT;
};
/* The block's shared arrays: the row sums of each warp (double-buffered by
 * parity), stripes 1 .. R-1's dw sums for the chunk's partial, ATOMIC's flag. */
template <int TPR, int VEC> struct SShared {
#if RNK_S_SPLIT
    /* RNK_S_SPLIT's mbarriers, [g][0] stripe g's (red's stride a stripe) */
    unsigned long long mb[SShape<TPR>::R][SShape<TPR>::WPR];
#endif
    float red[2][SShape<TPR>::R][SShape<TPR>::WPR][2];
    float comb[SShape<TPR>::R > 1 ? (SShape<TPR>::R - 1) * TPR * VEC : 1];
    int claim[2], last;
};
/* The fast path's widest row: 1024 threads of 8 columns. */
enum { S_MAX_N = 8192 };

/* Threads a row for n columns (n <= S_MAX_N): the host's plan and the
 * variants use it. */
__host__ __device__ constexpr int s_tpr(int64_t n)
{
    return n <= 256 ? 32 : n <= 512 ? 64 : n <= 1024 ? 128 : n <= 2048 ? 256 : n <= 4096 ? 512
                                                                                           : 1024;
}

__device__ __forceinline__ uint4 ldnc16(const void *p)
{
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

/* A row's two sums over a warp by a fixed shuffle tree (s1 only when rstd
 * is recomputed): every lane ends with the warp's sums. */
template <bool RS> __device__ __forceinline__ void s_warp_sum(float &s1, float &s2)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        if (!RS)
            s1 += __shfl_xor_sync(0xffffffffu, s1, o);
        s2 += __shfl_xor_sync(0xffffffffu, s2, o);
    }
}

#if RNK_S_SPLIT
__device__ __forceinline__ unsigned s_smem(const void *p)
{
    return (unsigned)__cvta_generic_to_shared(p);
}
__device__ __forceinline__ void s_mb_init(unsigned long long *b, unsigned cnt)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(s_smem(b)), "r"(cnt) : "memory");
}
/* Arrive on the mbarrier at shared address a (release at the CTA's scope:
 * this thread's accesses before it are seen by whoever waits for the phase). */
__device__ __forceinline__ void s_mb_arrive(unsigned a)
{
    asm volatile("mbarrier.arrive.release.cta.shared::cta.b64 _, [%0];" ::"r"(a) : "memory");
}
/* Wait for the phase of parity ph to complete (acquire at the CTA's scope). */
__device__ __forceinline__ void s_mb_wait(unsigned a, int ph)
{
    asm volatile("{\n\t.reg .pred P1;\n"
                 "S_MB_WAIT:\n\t"
                 "mbarrier.try_wait.parity.acquire.cta.shared::cta.b64 P1, [%0], %1;\n\t"
                 "@P1 bra S_MB_DONE;\n\t"
                 "bra S_MB_WAIT;\n"
                 "S_MB_DONE:\n\t}" ::"r"(a),
                 "r"(ph)
                 : "memory");
}
/* dx of one element as production's build rounds it (CUDA 13.0, sm_90: its
 * PTX read with .dev-main/lean/reuse2.py, its SASS by eye): yw - xh * c is
 * one FMA over yw's rounded product in element 5 of a bf16 row (not with
 * dres past TPR 64), over xh * c's rounded product in every other; with
 * dres, rstd * t + dres is one FMA. */
template <class T> struct SBf16 {
    static constexpr bool v = false;
};
template <> struct SBf16<__nv_bfloat16> {
    static constexpr bool v = true;
};
template <class T, int TPR, bool DRES>
__device__ __forceinline__ float s_split_dx(float yf, float wv, float xh, float c, float rstd,
                                            float rf, int e)
{
    const bool r = SBf16<T>::v && e == 5 && (!DRES || TPR == 64);
    const float t = r ? __fmaf_rn(-c, xh, __fmul_rn(yf, wv)) : __fmaf_rn(yf, wv, -__fmul_rn(c, xh));
    return DRES ? __fmaf_rn(rstd, t, rf) : __fmul_rn(rstd, t);
}
#endif

/* One row's share of a thread: x, dy, dres vectors and rstd (zeros when the
 * row is past the chunk or the vector past n). */
struct SRow {
    uint4 x, y, r;
    float rs;
};

template <class T, bool RS, bool DRES>
__device__ __forceinline__ void s_load(const Params &p, SRow &d, int64_t row, bool on, int col,
                                       bool ok, bool nc)
{
    constexpr int64_t ES = (int64_t)sizeof(T);
    d.x = d.y = d.r = make_uint4(0u, 0u, 0u, 0u);
    d.rs = 0.0f;
    if (!on)
        return;
    if (ok) {
        d.x = ldnc16((const char *)p.x + (row * p.xs + col) * ES);
        const char *yp = (const char *)p.dy + (row * p.dys + col) * ES;
        d.y = nc ? ldnc16(yp) : ld16(yp);
        if (DRES)
            d.r = ld16((const char *)p.dres + (row * p.drs + col) * ES);
    }
    if (RS)
        d.rs = __ldg(p.rstd + row);
}

/*
 * The claim loop from the block's first chunk k0 on: rows, dx, the chunk's
 * partial (stripes added in order: p = +0 + stripe_0 + ... + stripe_{R-1})
 * and its publication.  RS: rstd given; DRES: dresidual_out added.
 */
template <class T, int TPR, int MODE, bool RS, bool DRES>
__device__ __forceinline__ void s_chunks(const Params &p, SShared<TPR, Vec<T>::N> &sh)
{
    using S = SShape<TPR>;
    constexpr int R = S::R, WPR = S::WPR, VEC = Vec<T>::N, W = TPR * VEC;
    constexpr int64_t ES = (int64_t)sizeof(T);
    auto &red = sh.red;
    float *comb = sh.comb;
    int *s_claim = sh.claim;
    const int tid = threadIdx.x, grp = tid / TPR, lt = tid % TPR;
    const int lane = tid & 31, wir = lt >> 5;
    const int col = lt * VEC;
    const bool ok = col < p.n;
    const bool nc = p.dx != p.dy;
    const int64_t P = p.nchunks;
    float wv[VEC];
#pragma unroll
    for (int e = 0; e < VEC; e++)
        wv[e] = ok ? (p.w ? ld_any(p.w_dt, p.w, col + e) + p.offset : 1.0f) : 0.0f;

    int it = 0, par = 0;
    for (int k = s_claim[0]; k < p.nchunks; it++, k = s_claim[it & 1]) {
        unsigned nxt = claim_issue(p);
        const int64_t cnt = chunk_len(p, k);
        const int64_t iters = (cnt + R - 1) / R;
        float acc[VEC];
#pragma unroll
        for (int e = 0; e < VEC; e++)
            acc[e] = 0.0f;
        SRow cur;
        s_load<T, RS, DRES>(p, cur, k + grp * P, grp < cnt, col, ok, nc);
        /* Row t of the chunk from cur, the next one's loads issued into nx
         * first. */
        auto row = [&](SRow &cur, SRow &nx, int64_t t) {
            const int64_t j = t * R + grp, jn = j + R;
            s_load<T, RS, DRES>(p, nx, k + jn * P, jn < cnt, col, ok, nc);
            float xf[VEC], yf[VEC];
            Vec<T>::unpack(cur.x, xf);
            Vec<T>::unpack(cur.y, yf);
            float s1 = 0.0f, s2 = 0.0f;
#pragma unroll
            for (int e = 0; e < VEC; e++) {
                if (!RS)
                    s1 += xf[e] * xf[e];
                s2 += xf[e] * (yf[e] * wv[e]);
            }
            s_warp_sum<RS>(s1, s2);
#if RNK_S_SPLIT
            /* RNK_S_SPLIT (above): post, arrive, dw, wait, read. */
            constexpr bool SPL = RS && WPR > 1;
            float xs[VEC], rs_[VEC];
            if constexpr (SPL) {
                const unsigned mba = s_smem(&sh.mb[RNK_S_SPLIT == 2 && R > 1 ? grp : 0][0]);
                __syncwarp(); /* the warp's reads of this buffer two rows ago */
                if (lane == 0) {
                    red[par][grp][wir][0] = s1;
                    red[par][grp][wir][1] = s2;
                    s_mb_arrive(mba);
                }
#pragma unroll
                for (int e = 0; e < VEC; e++)
                    xs[e] = __fmul_rn(xf[e], cur.rs);
                if (j < cnt) {
#pragma unroll
                    for (int e = 0; e < VEC; e++)
#if RNK_DW_FMA
                        acc[e] = __fmaf_rn(yf[e], xs[e], acc[e]);
#else
                        acc[e] = __fadd_rn(acc[e], __fmul_rn(yf[e], xs[e]));
#endif
                }
                if (DRES)
                    Vec<T>::unpack(cur.r, rs_);
                s_mb_wait(mba, par);
                s1 = 0.0f;
                s2 = lane < WPR ? red[par][grp][lane][1] : 0.0f;
                s_warp_sum<RS>(s1, s2);
                par ^= 1;
            } else
#endif
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
#if RNK_S_SPLIT
            if constexpr (SPL) {
                if (j < cnt) {
                    const float rstd = cur.rs;
                    const float c = rstd * (s2 * p.inv_n);
                    float d[VEC];
#pragma unroll
                    for (int e = 0; e < VEC; e++)
                        d[e] = s_split_dx<T, TPR, DRES>(yf[e], wv[e], xs[e], c, rstd,
                                                        DRES ? rs_[e] : 0.0f, e);
                    if (ok)
                        st16((char *)p.dx + ((k + j * P) * p.dxs + col) * ES, Vec<T>::pack(d));
                }
            } else
#endif
            if (j < cnt) {
                const float rstd = RS ? cur.rs : 1.0f / sqrtf(s1 * p.inv_n + p.eps);
                const float c = rstd * (s2 * p.inv_n);
                float rf[VEC], d[VEC];
                if (DRES)
                    Vec<T>::unpack(cur.r, rf);
#pragma unroll
                for (int e = 0; e < VEC; e++) {
                    const float xh = __fmul_rn(xf[e], rstd);
                    d[e] = rstd * (yf[e] * wv[e] - xh * c);
                    if (DRES)
                        d[e] += rf[e];
#if RNK_DW_FMA
                    acc[e] = __fmaf_rn(yf[e], xh, acc[e]);
#else
                    acc[e] = __fadd_rn(acc[e], __fmul_rn(yf[e], xh));
#endif
                }
                if (ok)
                    st16((char *)p.dx + ((k + j * P) * p.dxs + col) * ES, Vec<T>::pack(d));
            }
        };
#if RNK_S_PP
        /* RNK_S_PP (above): the two buffers take turns, no copy (rstd
         * given: recomputed, the two copies spill at 64 registers). */
        if constexpr (RS) {
            SRow nx;
#pragma unroll 1
            for (int64_t t = 0; t < iters; t += 2) {
                row(cur, nx, t);
                if (t + 1 == iters)
                    break;
                row(nx, cur, t + 1);
            }
        } else
#endif
        {
#pragma unroll 1
            for (int64_t t = 0; t < iters; t++) {
                SRow nx;
                row(cur, nx, t);
                cur = nx;
            }
        }
        if (tid == 0)
            s_claim[(it + 1) & 1] = (int)nxt;
        if (!p.dw) {
            __syncthreads();
            trace_chunk(p, s_claim[it & 1]);
            continue;
        }
        if (R > 1) {
            if (grp > 0 && ok)
#pragma unroll
                for (int e = 0; e < VEC; e++)
                    comb[(grp - 1) * W + col + e] = acc[e];
            __syncthreads();
        }
        if (grp == 0 && ok) {
            float q[VEC];
#pragma unroll
            for (int e = 0; e < VEC; e++) {
                q[e] = __fadd_rn(0.0f, acc[e]);
#pragma unroll
                for (int g = 1; g < R; g++)
                    q[e] = __fadd_rn(q[e], comb[(g - 1) * W + col + e]);
            }
            if (MODE == MODE_ATOMIC) {
#pragma unroll
                for (int e = 0; e < VEC; e++)
                    atomicAdd(p.acc + col + e, q[e]);
            } else {
                float *part = p.part + (int64_t)k * p.cs + col;
#pragma unroll
                for (int e = 0; e < VEC; e += 4)
                    __stcg(reinterpret_cast<float4 *>(part + e),
                           make_float4(q[e], q[e + 1], q[e + 2], q[e + 3]));
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

template <class T, int TPR, int MODE>
__global__ void __launch_bounds__(SShape<TPR>::BT, SShape<TPR>::MINB) s_kernel(Params p)
{
    __shared__ SShared<TPR, Vec<T>::N> sh;
    trace_start(p, 3u);
    /* The first claim goes out before the cancel word is known, as on the
     * other paths (bwd_kernel.cuh). */
    const unsigned nxt = claim_issue(p);
    if (int c = cancelled(p); c != CANCEL_CLEAR) {
        finish_and_exit<true, SShape<TPR>::BT>(p, nullptr, false, c != CANCEL_GATED);
        return;
    }
    if (threadIdx.x == 0)
        sh.claim[0] = (int)nxt;
#if RNK_S_SPLIT
    if (SShape<TPR>::WPR > 1 && threadIdx.x < SShape<TPR>::R)
        s_mb_init(&sh.mb[threadIdx.x][0],
                  RNK_S_SPLIT == 2 ? SShape<TPR>::WPR : SShape<TPR>::BT / 32);
#endif
    __syncthreads();
    trace_mark(p, 1, 1);
    if (p.rstd && !p.dres)
        s_chunks<T, TPR, MODE, true, false>(p, sh);
    else if (p.rstd)
        s_chunks<T, TPR, MODE, true, true>(p, sh);
    else if (!p.dres)
        s_chunks<T, TPR, MODE, false, false>(p, sh);
    else
        s_chunks<T, TPR, MODE, false, true>(p, sh);
    finish_and_exit<true, SShape<TPR>::BT>(p, nullptr, MODE == MODE_FUSED);
}

} /* namespace rnk */

#endif
