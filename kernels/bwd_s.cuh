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
 *
 * Knobs (compile time, for measurements; production builds none):
 *   RNK_S_PAIR=1  rows of several warps two at a time, a stripe's row j and
 *                 j + R, whose sums meet at one block barrier (s_pairs): half
 *                 the barriers, the same trees and row sums, dw bitwise the
 *                 same; 2 rows in registers, as production.
 *   RNK_S_PAIR=2  the same with the next pair loaded ahead (4 rows) and half
 *                 the blocks a SM (128 registers a thread), except for blocks
 *                 of 1024 threads, which keep 64 and RNK_S_PAIR=1's loads.
 *   RNK_S_LEAN=1  the same rows, trees and arithmetic as production with
 *                 fewer instructions a row (s_lean): per-thread pointers
 *                 advanced by a byte step instead of row * stride + col in
 *                 64 bits each row, two row buffers taking turns (no copy,
 *                 no zeroing a row), the buffer parity fixed at each turn,
 *                 dy's load kind chosen once a chunk.  Not with RNK_S_PAIR.
 *   RNK_S_LEAN=2  =1 with wv and the byte steps in shared memory, read where
 *                 used, and red's slot stored by the lane that reads it: no
 *                 spill in the row loop at TPR 128-512 (=1: 11 a row).
 */
#ifndef RNK_BWD_S_CUH
#define RNK_BWD_S_CUH

#include "bwd_finish.cuh"

#ifndef RNK_S_PAIR
#define RNK_S_PAIR 0
#endif
#if RNK_S_PAIR < 0 || RNK_S_PAIR > 2
#error "RNK_S_PAIR: 0 (production), 1 or 2"
#endif
#ifndef RNK_S_LEAN
#define RNK_S_LEAN 0
#endif
#if RNK_S_LEAN < 0 || RNK_S_LEAN > 2
#error "RNK_S_LEAN: 0 (production), 1 or 2"
#endif
#if RNK_S_LEAN && RNK_S_PAIR
#error "RNK_S_LEAN and RNK_S_PAIR are two experiments: one at a time"
#endif

namespace rnk {

/* Block shape of TPR threads a row: BT threads, R rows at once, MINB blocks
 * a SM (32 warps: 64 registers a thread). */
template <int TPR> struct SShape {
    static constexpr int BT = TPR < 128 ? 128 : TPR;
    static constexpr int R = BT / TPR;
    static constexpr int WPR = TPR / 32;
#if RNK_S_PAIR == 2
    /* 16 warps: 128 registers a thread for 4 rows in flight (a block of
     * 1024 threads cannot have more than 64). */
    static constexpr int MINB = BT < 1024 ? 512 / BT : 1;
#else
    static constexpr int MINB = 1024 / BT;
#endif
};
/* Rows a stripe reduces at one barrier: 2 under RNK_S_PAIR (a pair's sums
 * side by side, row j's warps then row j + R's). */
enum { S_BAR_ROWS = RNK_S_PAIR ? 2 : 1 };
#if RNK_S_LEAN == 2
/* RNK_S_LEAN=2: each thread's wv in shared memory, wv[0..3] in lo, the rest
 * in hi (blocks of 1024 threads: wv[4..5], wv[6..7] stay in registers, as
 * all 8 would pass the 48 KiB of static shared memory). */
template <int BT> struct SWsh {
    float4 lo[BT], hi[BT];
};
template <> struct SWsh<1024> {
    float4 lo[1024];
    float2 hi[1024];
};
#endif
/* The block's shared arrays: the row sums of each warp (double-buffered by
 * parity), stripes 1 .. R-1's dw sums for the chunk's partial, ATOMIC's flag. */
template <int TPR, int VEC> struct SShared {
    float red[2][SShape<TPR>::R][S_BAR_ROWS * SShape<TPR>::WPR][2];
    float comb[SShape<TPR>::R > 1 ? (SShape<TPR>::R - 1) * TPR * VEC : 1];
    int claim[2], last;
#if RNK_S_LEAN == 2
    SWsh<SShape<TPR>::BT> wsh;
    longlong2 step[2]; /* s_lean's byte steps: x, dy; dx, dres */
#endif
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

#if RNK_S_PAIR
/* RNK_S_PAIR's pieces of a row, the same arithmetic as s_chunks' loop: its
 * two sums over the warp, ... */
template <class T, bool RS>
__device__ __forceinline__ void s_sums(const SRow &d, const float (&wv)[Vec<T>::N], float &s1,
                                       float &s2)
{
    constexpr int VEC = Vec<T>::N;
    float xf[VEC], yf[VEC];
    Vec<T>::unpack(d.x, xf);
    Vec<T>::unpack(d.y, yf);
    s1 = 0.0f;
    s2 = 0.0f;
#pragma unroll
    for (int e = 0; e < VEC; e++) {
        if (!RS)
            s1 += xf[e] * xf[e];
        s2 += xf[e] * (yf[e] * wv[e]);
    }
    s_warp_sum<RS>(s1, s2);
}

/* ... and, from the row's sums over the block, its dx (stored at row
 * `row`) and its step of dw. */
template <class T, bool RS, bool DRES>
__device__ __forceinline__ void s_dx(const Params &p, const SRow &d, const float (&wv)[Vec<T>::N],
                                     float s1, float s2, float (&acc)[Vec<T>::N], int64_t row,
                                     int col, bool ok)
{
    constexpr int VEC = Vec<T>::N;
    constexpr int64_t ES = (int64_t)sizeof(T);
    float xf[VEC], yf[VEC], rf[VEC], dd[VEC];
    Vec<T>::unpack(d.x, xf);
    Vec<T>::unpack(d.y, yf);
    const float rstd = RS ? d.rs : 1.0f / sqrtf(s1 * p.inv_n + p.eps);
    const float c = rstd * (s2 * p.inv_n);
    if (DRES)
        Vec<T>::unpack(d.r, rf);
#pragma unroll
    for (int e = 0; e < VEC; e++) {
        const float xh = __fmul_rn(xf[e], rstd);
        dd[e] = rstd * (yf[e] * wv[e] - xh * c);
        if (DRES)
            dd[e] += rf[e];
#if RNK_DW_FMA
        acc[e] = __fmaf_rn(yf[e], xh, acc[e]);
#else
        acc[e] = __fadd_rn(acc[e], __fmul_rn(yf[e], xh));
#endif
    }
    if (ok)
        st16((char *)p.dx + (row * p.dxs + col) * ES, Vec<T>::pack(dd));
}

/*
 * RNK_S_PAIR: one chunk's rows for rows of several warps, two of a stripe per
 * block barrier.  Pair u of stripe grp is its rows j = 2uR + grp and j + R
 * (the rows production's iterations 2u and 2u + 1 take): both rows' warp sums
 * go to red[par] side by side, one __syncthreads, then each row is added over
 * its warps by the same tree as production, so every row's sums and rstd are
 * production's bit for bit.  dx and dw then go row j first, row j + R second:
 * acc sees production's additions in its order, each rounded alone, and dw
 * stays bitwise the same.  dx is production's expression, but which product of
 * dy * w - xhat * c an FMA takes in is the compilers' choice, element by
 * element (production's RS instantiations fuse dy * w in most, xhat * c in
 * some): dx may differ from production's by that one fp32 rounding, not bit
 * for bit.  The block runs ceil(iters / 2) pairs, the same count in every
 * stripe (barriers match); rows at or past cnt load as zeros, store nothing
 * and add nothing, as production's.  par flips once a pair: red[par] is
 * written again only after the next pair's barrier, which no warp passes
 * before every warp has read this pair's sums.
 *
 * Loads: RNK_S_PAIR=1 keeps production's 2 rows in registers (its 64 a
 * thread): the next pair's rows go out as the pair's free theirs, row j + 2R
 * once row j's dx is stored, j + 3R after j + R's.  Holding a third row
 * across the barrier (the next pair's first, issued before the sums) made
 * ptxas spill 10 to 50 words a pair (sm_90).  RNK_S_PAIR=2 (blocks under 1024
 * threads) issues the whole next pair before the sums: 4 rows, in flight
 * across the barrier, in up to 128 registers at half the occupancy.
 */
template <class T, int TPR, bool RS, bool DRES>
__device__ __forceinline__ void s_pairs(const Params &p, SShared<TPR, Vec<T>::N> &sh, int k,
                                        int64_t cnt, const float (&wv)[Vec<T>::N],
                                        float (&acc)[Vec<T>::N], int &par)
{
    using S = SShape<TPR>;
    constexpr int R = S::R, WPR = S::WPR, VEC = Vec<T>::N;
    constexpr bool AHEAD2 = RNK_S_PAIR == 2 && S::BT < 1024;
    auto &red = sh.red;
    const int tid = threadIdx.x, grp = tid / TPR, lt = tid % TPR;
    const int lane = tid & 31, wir = lt >> 5;
    const int col = lt * VEC;
    const bool ok = col < p.n;
    const bool nc = p.dx != p.dy;
    const int64_t P = p.nchunks;
    const int64_t pairs = ((cnt + R - 1) / R + 1) / 2;
    SRow a, b;
    s_load<T, RS, DRES>(p, a, k + grp * P, grp < cnt, col, ok, nc);
    s_load<T, RS, DRES>(p, b, k + (grp + R) * P, grp + R < cnt, col, ok, nc);
#pragma unroll 1
    for (int64_t u = 0; u < pairs; u++) {
        const int64_t j = 2 * u * R + grp, j1 = j + R, jn = j + 2 * R, jn1 = jn + R;
        SRow na, nb;
        if (AHEAD2) {
            s_load<T, RS, DRES>(p, na, k + jn * P, jn < cnt, col, ok, nc);
            s_load<T, RS, DRES>(p, nb, k + jn1 * P, jn1 < cnt, col, ok, nc);
        }
        float s1a, s2a, s1b, s2b;
        s_sums<T, RS>(a, wv, s1a, s2a);
        s_sums<T, RS>(b, wv, s1b, s2b);
        if (lane == 0) {
            red[par][grp][wir][0] = s1a;
            red[par][grp][wir][1] = s2a;
            red[par][grp][WPR + wir][0] = s1b;
            red[par][grp][WPR + wir][1] = s2b;
        }
        __syncthreads();
        /* As production: lane i takes warp i's sums of each row (zeros past
         * the row's warps), then the fixed tree, a row at a time. */
        s1a = !RS && lane < WPR ? red[par][grp][lane][0] : 0.0f;
        s2a = lane < WPR ? red[par][grp][lane][1] : 0.0f;
        s1b = !RS && lane < WPR ? red[par][grp][WPR + lane][0] : 0.0f;
        s2b = lane < WPR ? red[par][grp][WPR + lane][1] : 0.0f;
        s_warp_sum<RS>(s1a, s2a);
        s_warp_sum<RS>(s1b, s2b);
        par ^= 1;
        if (j < cnt)
            s_dx<T, RS, DRES>(p, a, wv, s1a, s2a, acc, k + j * P, col, ok);
        if (!AHEAD2) /* (into row j's registers, free now) */
            s_load<T, RS, DRES>(p, na, k + jn * P, jn < cnt, col, ok, nc);
        if (j1 < cnt)
            s_dx<T, RS, DRES>(p, b, wv, s1b, s2b, acc, k + j1 * P, col, ok);
        if (!AHEAD2)
            s_load<T, RS, DRES>(p, nb, k + jn1 * P, jn1 < cnt, col, ok, nc);
        a = na;
        b = nb;
    }
}
#endif

#if RNK_S_LEAN
/*
 * RNK_S_LEAN: one chunk's rows as production's loop in s_chunks (the same
 * rows, loads, sums, trees, barriers and dx / dw expressions), with the
 * bookkeeping around them cut:
 *   - each thread keeps its stripe's pointers to x, dy, dx (dres, rstd) and
 *     adds a byte step (R rows of the chunk: R * P rows of the tensor) a row,
 *     instead of forming (k + j * P) * stride + col in 64 bits per row and
 *     tensor;
 *   - two row buffers take turns (the loop is written twice, a and b), so
 *     the next row is not copied into the current one, and a buffer is not
 *     zeroed before each load: both are zeroed once a chunk, a thread past
 *     n never loads (its zeros stay, as production's), and a row past the
 *     chunk's end leaves the buffer's old row, whose sums meet only in its
 *     own stripe's slots of red and are dropped with the row (no dx, no dw);
 *   - red's parity is fixed at each of the two turns: the chunk's first row
 *     takes red[0].  Between chunks every thread passes a __syncthreads
 *     (s_chunks: the comb, publish, atomic_tail or !dw barrier) after its
 *     last read of red, so red[0] may be written again at once;
 *   - dy's load kind (nc: dx is not dy) is a template argument, chosen once
 *     a chunk;
 *   - one down-counter of the block's row steps (n_it, the same in every
 *     stripe, so barriers match); this stripe's rows end d = iters - (its
 *     rows) steps earlier (d is 0 or 1, 0 when R = 1).
 */
/*
 * dx's dy * w - xhat * c: production writes both products plain (mul.f32,
 * sub.f32 in its PTX), and ptxas fuses one into the FMA: dy * w where NVVM
 * computed it again for dx, fma(dy, w, -round(xhat * c)), or xhat * c where
 * NVVM kept the row sum's round(dy * w) for it, fma(-c, xhat, round(dy * w)).
 * NVVM's choice goes element by element and instantiation by instantiation,
 * so s_lean writes every operation with its rounding and takes production's
 * choice from this table, read from production's sm_90 PTX of CUDA 13.0
 * (MODE_FUSED; the benchmark's other modes take the same): bit e set =
 * element e fused fma(-c, xhat, round(dy * w)).  Another compiler may choose
 * otherwise: g60_bits compares dx bit for bit.
 */
template <class T, int TPR, bool RS, bool DRES> constexpr unsigned s_lean_reuse()
{
    if (sizeof(T) == 2 && Vec<T>::DT == RNK_BF16)
        return TPR == 64 ? (RS ? 0x20u : 0xa0u) : (RS && DRES ? 0u : 0x20u);
    return TPR == 64 || RS || DRES ? 0u : 0x80u; /* fp16 */
}

template <class T, int TPR, bool RS, bool DRES, bool NC>
__device__ __forceinline__ void s_lean(const Params &p, SShared<TPR, Vec<T>::N> &sh, int k,
                                       int64_t cnt, const float (&wv)[Vec<T>::N],
                                       float (&acc)[Vec<T>::N])
{
    using S = SShape<TPR>;
    constexpr int R = S::R, WPR = S::WPR, VEC = Vec<T>::N;
    constexpr int64_t ES = (int64_t)sizeof(T);
    constexpr unsigned RU = s_lean_reuse<T, TPR, RS, DRES>();
    auto &red = sh.red;
    const int tid = threadIdx.x, grp = R == 1 ? 0 : tid / TPR, lt = R == 1 ? tid : tid % TPR;
    const int lane = tid & 31, wir = lt >> 5;
    const int col = lt * VEC;
    const bool ok = col < p.n;
    const int64_t P = p.nchunks, r0 = k + grp * P, RP = R * P;
    /* (a chunk's rows: under 2^31, as m / P + 1 rows of at least 257
     * columns of 2 bytes, P >= 128, is) */
    const int iters = (int)((cnt + R - 1) / R);
    const int d = R == 1 ? 0 : iters - (int)((cnt - grp + R - 1) / R);
    const char *px = (const char *)p.x + (r0 * p.xs + col) * ES;
    const char *py = (const char *)p.dy + (r0 * p.dys + col) * ES;
    const char *pr = DRES ? (const char *)p.dres + (r0 * p.drs + col) * ES : nullptr;
    const float *prs = RS ? p.rstd + r0 : nullptr;
    char *pd = (char *)p.dx + (r0 * p.dxs + col) * ES;
    /* byte steps {x, dy}, {dx, dres}; RNK_S_LEAN=2: read from shared memory
     * where used (s_kernel writes them), not held in 8 registers */
#if RNK_S_LEAN == 2
    const longlong2 *const stp = sh.step;
#else
    const int64_t sx = RP * p.xs * ES, sy = RP * p.dys * ES, sr = DRES ? RP * p.drs * ES : 0;
    const longlong2 stp[2] = {{sx, sy}, {RP * p.dxs * ES, sr}};
#endif
    /* RNK_S_LEAN=2: wv read from shared memory each row, twice when a
     * barrier lies between its uses, instead of 8 registers held */
    auto wget = [&](float(&w)[VEC]) {
#if RNK_S_LEAN == 2
        const float4 u = sh.wsh.lo[tid];
        const auto v = sh.wsh.hi[tid];
        w[0] = u.x, w[1] = u.y, w[2] = u.z, w[3] = u.w, w[4] = v.x, w[5] = v.y;
        if constexpr (S::BT < 1024)
            w[6] = v.z, w[7] = v.w;
        else
            w[6] = wv[6], w[7] = wv[7];
#else
#pragma unroll
        for (int e = 0; e < VEC; e++)
            w[e] = wv[e];
#endif
    };
    SRow a, b;
    a.x = a.y = a.r = b.x = b.y = b.r = make_uint4(0u, 0u, 0u, 0u);
    a.rs = b.rs = 0.0f;
    /* Load the stripe's next row into nx when there is one (left > 1), the
     * pointers past it. */
    auto load = [&](SRow &nx, bool on) {
        if (on && ok) {
            nx.x = ldnc16(px);
            nx.y = NC ? ldnc16(py) : ld16(py);
            if (DRES)
                nx.r = ld16(pr);
        }
        if (RS && on)
            nx.rs = __ldg(prs);
        px += stp[0].x;
        py += stp[0].y;
        if (DRES)
            pr += stp[1].y;
        if (RS)
            prs += RP;
    };
    /* One row step: cur's row reduced, dx stored (when the stripe still has
     * a row), the next row loaded into nx; q: red's parity. */
    auto step = [&](SRow &cur, SRow &nx, int q, int n_it) {
        load(nx, n_it > d + 1);
        float xf[VEC], yf[VEC];
        Vec<T>::unpack(cur.x, xf);
        Vec<T>::unpack(cur.y, yf);
        float s1 = 0.0f, s2 = 0.0f, yw[VEC], w[VEC];
        wget(w);
#pragma unroll
        for (int e = 0; e < VEC; e++) {
            yw[e] = __fmul_rn(yf[e], w[e]);
            if (!RS)
                s1 = __fmaf_rn(xf[e], xf[e], s1);
            s2 = __fmaf_rn(xf[e], yw[e], s2);
        }
        s_warp_sum<RS>(s1, s2);
        if (WPR > 1) {
            /* (every lane holds the warp's sums, bit for bit: lane wir
             * stores them, at the address that lane reads back) */
            if (lane == (RNK_S_LEAN == 2 ? wir : 0)) {
                red[q][grp][RNK_S_LEAN == 2 ? lane : wir][0] = s1;
                red[q][grp][RNK_S_LEAN == 2 ? lane : wir][1] = s2;
            }
            __syncthreads();
            s1 = !RS && lane < WPR ? red[q][grp][lane][0] : 0.0f;
            s2 = lane < WPR ? red[q][grp][lane][1] : 0.0f;
            s_warp_sum<RS>(s1, s2);
        }
        if (R == 1 || n_it > d) {
            const float rstd = RS ? cur.rs : 1.0f / sqrtf(__fmaf_rn(s1, p.inv_n, p.eps));
            const float c = __fmul_rn(rstd, __fmul_rn(s2, p.inv_n));
            float rf[VEC], dd[VEC];
            if (DRES)
                Vec<T>::unpack(cur.r, rf);
            wget(w);
#pragma unroll
            for (int e = 0; e < VEC; e++) {
                const float xh = __fmul_rn(xf[e], rstd);
                const float t = RU >> e & 1u ? __fmaf_rn(-c, xh, yw[e])
                                             : __fmaf_rn(yf[e], w[e], -__fmul_rn(xh, c));
                dd[e] = DRES ? __fmaf_rn(rstd, t, rf[e]) : __fmul_rn(rstd, t);
#if RNK_DW_FMA
                acc[e] = __fmaf_rn(yf[e], xh, acc[e]);
#else
                acc[e] = __fadd_rn(acc[e], __fmul_rn(yf[e], xh));
#endif
            }
            if (ok)
                st16(pd, Vec<T>::pack(dd));
        }
        pd += stp[1].x;
    };
    if (iters <= 0)
        return;
    load(a, iters > d);
#pragma unroll 1
    for (int n_it = iters;;) {
        step(a, b, 0, n_it);
        if (--n_it == 0)
            break;
        step(b, a, 1, n_it);
        if (--n_it == 0)
            break;
    }
}
#endif

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
#if RNK_S_LEAN == 2
    static_assert(VEC == 8, "wsh: 8 columns a thread");
    sh.wsh.lo[tid] = make_float4(wv[0], wv[1], wv[2], wv[3]);
    if constexpr (S::BT < 1024)
        sh.wsh.hi[tid] = make_float4(wv[4], wv[5], wv[6], wv[7]);
    else
        sh.wsh.hi[tid] = make_float2(wv[4], wv[5]);
#endif

    int it = 0, par = 0;
    for (int k = s_claim[0]; k < p.nchunks; it++, k = s_claim[it & 1]) {
        unsigned nxt = claim_issue(p);
        const int64_t cnt = chunk_len(p, k);
        const int64_t iters = (cnt + R - 1) / R;
        float acc[VEC];
#pragma unroll
        for (int e = 0; e < VEC; e++)
            acc[e] = 0.0f;
#if RNK_S_PAIR
        if constexpr (WPR > 1) {
            s_pairs<T, TPR, RS, DRES>(p, sh, k, cnt, wv, acc, par);
        } else { /* (one warp a row, no barrier: production's loop, closed below) */
#endif
#if RNK_S_LEAN
        (void)iters, (void)WPR, (void)ES, (void)red, (void)lane, (void)wir, (void)P, (void)par;
        if (nc)
            s_lean<T, TPR, RS, DRES, true>(p, sh, k, cnt, wv, acc);
        else
            s_lean<T, TPR, RS, DRES, false>(p, sh, k, cnt, wv, acc);
#else
        SRow cur;
        s_load<T, RS, DRES>(p, cur, k + grp * P, grp < cnt, col, ok, nc);
#pragma unroll 1
        for (int64_t t = 0; t < iters; t++) {
            const int64_t j = t * R + grp, jn = j + R;
            SRow nx;
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
            cur = nx;
        }
#endif
#if RNK_S_PAIR
        }
#endif
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
#if RNK_S_LEAN == 2
    if (threadIdx.x == 0) { /* (s_lean's steps, R * P rows) */
        const int64_t RP = (int64_t)SShape<TPR>::R * p.nchunks * (int64_t)sizeof(T);
        sh.step[0] = make_longlong2(RP * p.xs, RP * p.dys);
        sh.step[1] = make_longlong2(RP * p.dxs, p.dres ? RP * p.drs : 0);
    }
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
