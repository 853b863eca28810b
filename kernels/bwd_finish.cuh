/* SPDX-License-Identifier: MIT */
/*
 * bwd_finish.cuh - the end of a fused launch (bwd_kernel.cuh's step 2-4):
 * dw's finish from the chunk partials in rnk.h's fixed order (the
 * contiguous order's and the interleaved one's), the exit count and the
 * last block's reset of the workspace counters.  C++ templates; nothing
 * here is visible through rnk.h.
 */
#ifndef RNK_BWD_FINISH_CUH
#define RNK_BWD_FINISH_CUH

#include "bwd_common.cuh"

namespace rnk {

/*
 * d + a[0] + a[s] + a[2s] + ... + a[(k-1)s], added in that order, each
 * addition rounded once: loads from shared memory eight at a time before
 * their additions, so that the chain of additions does not wait for a load
 * each (0.3 % over the grid on an H100, up to 1.8 % at 8192 x 1024;
 * bench/RESULTS.md, 2026-12-07).
 */
__device__ __forceinline__ float sum_in_order(float d, const float *a, int s, int k)
{
    int i = 0;
    for (; i + 8 <= k; i += 8) {
        float t[8];
#pragma unroll
        for (int u = 0; u < 8; u++)
            t[u] = a[(i + u) * s];
#pragma unroll
        for (int u = 0; u < 8; u++)
            d = __fadd_rn(d, t[u]);
    }
    for (; i < k; i++)
        d = __fadd_rn(d, a[i * s]);
    return d;
}

/*
 * Contiguous order: finish 32 columns [sl*32, sl*32+32): stage up to
 * FIN_BATCH chunks' partials at a time in shared memory (cp.async, all in
 * flight at once); each warp adds whole groups of RNK_DW_GROUP partials in
 * chunk order, then warp 0 adds the group sums in order (rnk.h's two-level
 * order); round once at the end.  tile: FIN_BATCH * 32 floats.
 */
static_assert(FIN_BATCH % RNK_DW_GROUP == 0, "a staged batch holds whole groups");
__device__ __forceinline__ void finish_slice(const Params &p, int sl, float *tile)
{
    __shared__ float gsum[FIN_BATCH / RNK_DW_GROUP][FIN_COLS];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    const int64_t col = (int64_t)sl * FIN_COLS + lane;
    const bool ok = col < p.n;
    float d = 0.0f;
    for (int base = 0; base < p.nchunks; base += FIN_BATCH) {
        const int cnt = p.nchunks - base < FIN_BATCH ? p.nchunks - base : FIN_BATCH;
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
            const int k0 = q * RNK_DW_GROUP;
            const int k1 = k0 + RNK_DW_GROUP < cnt ? k0 + RNK_DW_GROUP : cnt;
            gsum[q][lane] = sum_in_order(0.0f, tile + k0 * FIN_COLS + lane, FIN_COLS, k1 - k0);
        }
        __syncthreads();
        trace_groups(p);
        if (warp == 0)
            d = sum_in_order(d, &gsum[0][lane], FIN_COLS, ng);
        __syncthreads();
    }
    if (warp == 0 && ok)
        st_any(p.dw_dt, p.dw, col, d);
}

/* finish_slices_il's slices a block at a time: SB = blockDim / (2 *
 * groups), at least 1, and at most an even share of the grid's slices, so
 * that the finish's loads spread over up to every block (has_slice deals
 * the same): without that cap 19 blocks finished 4096 x 8192's 1024 slices,
 * with it all 132 do; 1-3 % faster where N >= 4096 and M is small, neutral
 * elsewhere (bench/RESULTS.md, 2026-12-06).  Which block adds a slice does
 * not change dw's bits. */
__device__ __forceinline__ int il_slices_a_block(const Params &p)
{
    const int Q = (p.nchunks + RNK_DW_GROUP - 1) / RNK_DW_GROUP, T = (int)blockDim.x;
    const int sb = T / (2 * Q) > 0 ? T / (2 * Q) : 1;
    const int share = (int)((p.nslices + gridDim.x - 1) / gridDim.x);
    return sb < share ? sb : share;
}

/* g += x, lane by lane, each addition rounded once. */
__device__ __forceinline__ void fadd4(float4 &g, const float4 &x)
{
    g.x = __fadd_rn(g.x, x.x);
    g.y = __fadd_rn(g.y, x.y);
    g.z = __fadd_rn(g.z, x.z);
    g.w = __fadd_rn(g.w, x.w);
}

/*
 * A group's partials for finish_slices_il, loaded by two threads, adjacent
 * lanes, eight each, all sixteen in flight at once (one trip to L2, where one
 * thread alone made two of eight in the 64-register kernels: 0.7 % faster
 * over the grid on an H100, up to 2.4 %, bench/RESULTS.md 2026-12-07), the
 * upper eight handed down by shuffles; the lower thread adds all sixteen in
 * chunk order (rnk.h).  Every thread runs the same number of rounds (the
 * shuffles need whole warps).  gsum: finish_slices_il's group sums,
 * [item][float4 of the slice].
 */
static_assert(RNK_DW_GROUP == 16, "fin_groups_pairs: groups of sixteen partials");
__device__ __forceinline__ void fin_groups_pairs(const Params &p, int base, int SB,
                                                 float4 (*gsum)[FIN_CV_IL])
{
    constexpr int CV = FIN_CV_IL;
    const int P = p.nchunks, Q = (P + RNK_DW_GROUP - 1) / RNK_DW_GROUP, T = (int)blockDim.x;
    const int items = SB * CV * Q, hi = threadIdx.x & 1;
    for (int i0 = 0; i0 < 2 * items; i0 += T) {
        const int i = (i0 + (int)threadIdx.x) >> 1;
        const int so = i / (CV * Q), r = i - so * CV * Q, cv = r % CV, q = r / CV;
        const int64_t col = (int64_t)(base + so) * FIN_COLS_IL + cv * 4;
        const bool on = i < items, ok = on && base + so < p.nslices && col < p.n;
        const int cnt = P - q * RNK_DW_GROUP < RNK_DW_GROUP ? P - q * RNK_DW_GROUP : RNK_DW_GROUP;
        const float *src = p.part + (int64_t)q * RNK_DW_GROUP * p.cs + col;
        float4 v[8], g = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
        for (int k = 0; k < 8; k++) {
            const int kk = hi * 8 + k;
            v[k] = ok && kk < cnt ? ld_part4(src + kk * p.cs) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
        /* (the lower thread's sum; the upper one's is not used) */
#pragma unroll
        for (int k = 0; k < 8; k++)
            if (ok && k < cnt)
                fadd4(g, v[k]);
#pragma unroll
        for (int k = 0; k < 8; k++) {
            float4 w;
            w.x = __shfl_down_sync(0xffffffffu, v[k].x, 1);
            w.y = __shfl_down_sync(0xffffffffu, v[k].y, 1);
            w.z = __shfl_down_sync(0xffffffffu, v[k].z, 1);
            w.w = __shfl_down_sync(0xffffffffu, v[k].w, 1);
            if (ok && 8 + k < cnt)
                fadd4(g, w);
        }
        if (on && !hi)
            gsum[so * Q + q][cv] = g;
    }
}

/*
 * Interleaved order: finish slices of FIN_COLS_IL = 8 columns (FIN_CV_IL = 2
 * float4 of each partial) in rnk.h's two-level order.  A block
 * takes SB slices at a time (il_slices_a_block); two
 * threads take one group of RNK_DW_GROUP partials of one float4 of a slice,
 * load the group's partials all at once (fin_groups_pairs) and one adds them
 * in chunk order; then one thread per column adds the group sums in order and
 * rounds once.  MAXT: the kernel's largest block (sizes the group sums).
 */
template <int MAXT>
__device__ __forceinline__ void finish_slices_il(const Params &p)
{
    constexpr int E = MAXT / 2 > MAX_GROUPS_IL ? MAXT / 2 : MAX_GROUPS_IL;
    __shared__ float4 gsum[E][FIN_CV_IL];
    const int P = p.nchunks, Q = (P + RNK_DW_GROUP - 1) / RNK_DW_GROUP;
    const int T = (int)blockDim.x, SB = il_slices_a_block(p);
    for (int base = blockIdx.x * SB; base < p.nslices; base += gridDim.x * SB) {
        fin_groups_pairs(p, base, SB, gsum);
        __syncthreads();
        trace_groups(p);
        for (int i = threadIdx.x; i < SB * FIN_COLS_IL; i += T) {
            const int so = i / FIN_COLS_IL, c = i % FIN_COLS_IL;
            const int64_t col = (int64_t)(base + so) * FIN_COLS_IL + c;
            if (base + so < p.nslices && col < p.n) {
                /* gsum[so * Q + q][c >> 2], element c & 3, for q = 0 .. Q-1 */
                const float *gs = reinterpret_cast<const float *>(&gsum[so * Q][c >> 2]) + (c & 3);
                st_any(p.dw_dt, p.dw, col, sum_in_order(0.0f, gs, 4 * FIN_CV_IL, Q));
            }
        }
        __syncthreads();
    }
}

/* A counter's reset by the launch's last block (RNK_LEAN_SYNC: a plain store). */
__device__ __forceinline__ void reset_word(unsigned *w, unsigned v)
{
#if RNK_LEAN_SYNC
    st_relaxed(w, v);
#else
    atomicExch(w, v);
#endif
}

/* Thread 0: count the block out; the value before (grid - 1: the last). */
__device__ __forceinline__ unsigned exit_count(const Params &p)
{
#if RNK_LEAN_SYNC
    /* acq_rel: every block's reads of the counters come before the last
     * block's resets. */
    return atom_acq_rel_add(&p.ctr[CTR_EXIT], 1u);
#else
    __threadfence();
    return atomicAdd(&p.ctr[CTR_EXIT], 1u);
#endif
}

/* Thread 0, after its block's last write (rnk_bwd_args.done): the block
 * that counts itself out last (CTR_END, after any finish) writes the done
 * words.  Each block's count is an acq_rel atomic: the release of its
 * writes (its threads' before the barrier that precedes this), and for the
 * last block the acquire of everyone's.  Then done[1], the client's word
 * in device memory that its stream waits on, with a release at the GPU's
 * scope (the stream's wait and the kernels after it are on this GPU, in
 * the default memory synchronization domain), and
 * only then done[0], the ring's word in host memory, with a release at the
 * system's: done[1] does not wait for a store over the bus (0.4-2.8 us a
 * call on an H100, bench/RESULTS.md).  Without done[1], done[0] alone.
 * CTR_END's reset is a plain store: the next launch comes after this one's
 * end. */
__device__ __forceinline__ void write_done(const Params &p)
{
    if (atom_acq_rel_add(&p.ctr[CTR_END], 1u) != gridDim.x - 1)
        return;
    if (p.done1)
        st_release_gpu64(p.done1, p.done_v);
    st_release_sys64(p.done0, p.done_v);
    p.ctr[CTR_END] = 0u;
}

/* Whether this block has a finish slice (finish_slices_il's and
 * finish_slice's deal). */
template <bool IL> __device__ __forceinline__ bool has_slice(const Params &p)
{
    if constexpr (IL) {
        const int SB = il_slices_a_block(p);
        return (int64_t)blockIdx.x * SB < p.nslices;
    } else {
        return (int64_t)blockIdx.x < p.nslices;
    }
}

/* Steps 2-4 of the fused launch.  Slices are dealt to blocks statically:
 * once every chunk is done nothing waits any more, so a block that starts
 * late still finishes its slices.  Only the blocks that have a slice wait
 * for the chunks (has_slice); the others count themselves out and leave, so
 * that a few blocks poll CTR_DONE, not the whole grid (128 of 1056 at
 * 65536x1024; 2.5-6.5 % faster at 16384-32768 x 512-1024, bench/RESULTS.md).
 * IL: the interleaved order's finish
 * (finish_slices_il, MAXT: the kernel's largest block); else the contiguous
 * one's (finish_slice through tile, FIN_BATCH * FIN_COLS floats).
 * done_words: false for a gated launch (cancelled(), CANCEL_GATED). */
template <bool IL = false, int MAXT = 1024>
__device__ __forceinline__ void finish_and_exit(const Params &p, float *tile, bool fused,
                                                bool done_words = true)
{
    unsigned prev = 0;
    const bool fin = fused && p.dw && has_slice<IL>(p);
    if (fin) {
        if (threadIdx.x == 0) {
            while (ld_acquire(&p.ctr[CTR_DONE]) < (unsigned)p.nchunks)
                __nanosleep(64);
#if !RNK_LEAN_SYNC /* (the acquiring load alone orders the reads that follow) */
            __threadfence();
#endif
        }
#if RNK_EARLY_EXIT
        /* Nothing below reads a counter: the last block's resets may come
         * while the others still add their slices. */
        if (threadIdx.x == 0)
            prev = exit_count(p);
#endif
        __syncthreads();
        trace_mark(p, 3, 3);
        if constexpr (IL)
            finish_slices_il<MAXT>(p);
        else
            for (int sl = blockIdx.x; sl < p.nslices; sl += gridDim.x)
                finish_slice(p, sl, tile);
    }
    __syncthreads();
    trace_mark(p, fin ? 4 : 3, 4);
    if (threadIdx.x == 0) {
        if (!(RNK_EARLY_EXIT && fin))
            prev = exit_count(p);
        if (prev == gridDim.x - 1) {
            /* Everyone else has exited its claim loops: nothing reads the
             * counters any more in this launch (RNK_LEAN_SYNC: and the
             * launch's end makes plain stores visible to the next launch). */
            reset_word(&p.ctr[CTR_CLAIM], 0u);
            reset_word(&p.ctr[CTR_DONE], 0u);
            reset_word(&p.ctr[CTR_SLICE], 0u);
            reset_word(&p.ctr[CTR_CANCEL], (unsigned)CANCEL_UNKNOWN);
#if !RNK_LEAN_SYNC
            __threadfence();
#endif
            reset_word(&p.ctr[CTR_EXIT], 0u);
        }
        if (p.done0 && done_words)
            write_done(p);
    }
    trace_mark(p, 5, 5);
}

} /* namespace rnk */

#endif
