/* SPDX-License-Identifier: MIT */
/*
 * bwd_common.cuh - the device code both paths of the fused RMSNorm backward
 * kernel share (bwd_kernel.cuh has the paths themselves): parameters,
 * element access, cp.async, the row reduction, chunk claims and publication
 * (bwd_finish.cuh has the dw finish).  C++ templates; nothing here is
 * visible through rnk.h.
 */
#ifndef RNK_BWD_COMMON_CUH
#define RNK_BWD_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "rnk.h"

/* RNK_TRACE = 1: per-block timelines for the benchmark (bwd_kernel.cuh's
 * knob list; rnk_test.h has the record layout).  0: no code, no field. */
#ifndef RNK_TRACE
#define RNK_TRACE 0
#endif
#if RNK_TRACE
#include "rnk_test.h"
#endif

namespace rnk {

enum Mode {
    MODE_FUSED = 0,         /* production: deterministic, one launch */
    MODE_PARTIALS_ONLY = 1, /* benchmark "separate": a second kernel finishes dw */
    MODE_ATOMIC = 2,        /* benchmark "fused non-deterministic": fp32 atomics */
};

/* Counter words, each on its own 128-byte line of the workspace header
 * (the cancel state and CTR_END, rnk_bwd_args.done's count of the blocks
 * out, share the exit counter's line: each block touches them at its start
 * and at its end only). */
enum { CTR_CLAIM = 0, CTR_DONE = 32, CTR_SLICE = 64, CTR_EXIT = 96, CTR_CANCEL = 112,
       CTR_END = 120, CTR_WORDS = 128 };
/* CTR_CANCEL: what this launch knows of the cancel word. */
enum { CANCEL_UNKNOWN = 0, CANCEL_READING = 1, CANCEL_CLEAR = 2, CANCEL_SET = 3,
       CANCEL_GATED = 4 /* rnk_bwd_args.gate below its key: no done words either */ };
/* The finish's slices: 32 columns under the contiguous order (finish_slice,
 * at most RNK_MAX_CHUNKS = 256 chunks), 8 (FIN_CV_IL = 2 float4 of each
 * partial row) under the interleaved one (finish_slices_il, up to
 * MAX_CHUNKS_IL; slices of 4 columns were 0.4 % slower over the grid, up to
 * 3 % at 4096 x 2048, bench/RESULTS.md 2026-12-07). */
enum { FIN_COLS = 32, FIN_COLS_IL = 8, FIN_CV_IL = FIN_COLS_IL / 4 };
/* Chunks' partials the contiguous finish stages in shared memory at a time
 * (its tile: FIN_BATCH * FIN_COLS floats). */
#ifndef RNK_FIN_BATCH
#define RNK_FIN_BATCH 256
#endif
enum { FIN_BATCH = RNK_FIN_BATCH };
/* The most chunks the interleaved order has (rnk.h: 8 * 132), and their groups. */
enum { MAX_CHUNKS_IL = 1056, MAX_GROUPS_IL = (MAX_CHUNKS_IL + RNK_DW_GROUP - 1) / RNK_DW_GROUP };
static constexpr size_t WS_HEADER = CTR_WORDS * 4;

/*
 * Issue 15, ninth attempt (bench/RESULTS.md), both on by default (=0 puts
 * back the full fences, for comparison):
 *   RNK_LEAN_SYNC        release / acquire instead of full fences: the chunk
 *                        publish is one red.release, no fence after the
 *                        acquiring wait, the exit count one atom.acq_rel, and
 *                        the last block resets the counters with plain
 *                        stores (the launch's end orders them before the next
 *                        launch): about 1 us a launch;
 *   RNK_EARLY_EXIT       a finishing block counts itself out (CTR_EXIT)
 *                        as soon as it has seen every chunk done, its last
 *                        use of the counters, so that the count's round trip
 *                        overlaps its dw slices instead of following them.
 * (Adding each group of chunk partials in registers at the finish, and a
 * static first chunk per block, were measured too and not kept.)
 */
#ifndef RNK_LEAN_SYNC
#define RNK_LEAN_SYNC 1
#endif
#ifndef RNK_EARLY_EXIT
#define RNK_EARLY_EXIT 1
#endif

struct Params {
    const void *x, *dy, *w, *dres;
    void *dx, *dw;
    const float *rstd;
    int64_t m, n, xs, dys, dxs, drs;
    int x_dt, dy_dt, dx_dt, w_dt, dr_dt, dw_dt;
    float eps, offset;
    int64_t C;        /* contiguous order: rows per chunk; 0: interleaved, chunk k
                       * holds rows k, k + P, k + 2P, ... (rnk.h) */
    int nchunks, G, tpr, nslices;
    int even_bars;    /* RNK_RACECHECK=1: stripes meet their barriers equally (bwd_kernel.cuh) */
    int64_t pst;      /* floats per stripe slot (n rounded up to 4) */
    int64_t wsp;      /* ring path: floats of w staged in shared memory before the ring */
    int64_t cs;       /* floats per chunk: G * pst */
    unsigned *ctr;    /* workspace header */
    float *part;      /* chunk k, stripe slot g at part + k * cs + g * pst */
    float *acc;       /* MODE_ATOMIC: fp32 accumulator [n], zero between launches */
    const unsigned *cancel; /* rnk_bwd_args.cancel: NULL or the word read first */
    const unsigned long long *gate; /* rnk_bwd_args.gate, read with the cancel word */
    unsigned long long gate_key;
    unsigned long long *latch, latch_epoch; /* rnk_bwd_args.latch, read with gate */
    unsigned long long *done0, *done1, done_v; /* rnk_bwd_args.done, done_value */
    int64_t xstep, ystep, dstep, drstep; /* ring path: bytes between a stripe's rows */
    float inv_n;      /* 1 / n (RNK_LEAN's row means) */
#if RNK_TRACE
    rnk_trace_head *tr_head;  /* NULL: this launch records nothing */
    rnk_trace_block *tr_blk;  /* [tr_nblk] */
    rnk_trace_chunk *tr_chk;  /* [tr_nchk] */
    int tr_nblk, tr_nchk;
#endif
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

/*
 * L2 eviction priorities.  The rows stream through L2 once: their loads
 * (x, dy; and dx's stores, st.global.cs) ask to be evicted first.  The chunk
 * partials are written near the end and read once more by the finish: their
 * stores ask to be evicted last, the finish's loads first (they are dead
 * once read, and no line of ours stays behind at evict_last).  2.6-2.9 %
 * faster at the 2^26-element shapes and beyond, 1.8 % over the grid, on an
 * H100; the rows' hint alone changes nothing (bench/RESULTS.md,
 * 2026-12-07).  The policies live in uniform registers (the load's
 * descriptor), not in the thread's.
 */
__device__ __forceinline__ unsigned long long l2_evict_first()
{
    unsigned long long pol;
    asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
    return pol;
}
__device__ __forceinline__ unsigned long long l2_evict_last()
{
    unsigned long long pol;
    asm("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(pol));
    return pol;
}
/* dw's step for one element, rnk.h's order: acc + dy * xhat, each
 * operation rounded once (one fma with RNK_DW_FMA). */
__device__ __forceinline__ float dw_step(float acc, float dy, float xh)
{
#if RNK_DW_FMA
    return __fmaf_rn(dy, xh, acc);
#else
    return __fadd_rn(acc, __fmul_rn(dy, xh));
#endif
}
/* One element's dx, dresidual not added: from dy, the weight, xhat (x *
 * rstd, rounded) and the row's rstd and c. */
__device__ __forceinline__ float dx_elem(float dy, float w, float xh, float rstd, float c)
{
    return rstd * (dy * w - xh * c);
}
/* A partial's float4 / float, stored at L2 (st.global.cg), evict last. */
__device__ __forceinline__ void st_part4(float *p, float4 v)
{
    asm volatile("st.global.cg.L2::cache_hint.v4.f32 [%0], {%1,%2,%3,%4}, %5;" ::"l"(p),
                 "f"(v.x), "f"(v.y), "f"(v.z), "f"(v.w), "l"(l2_evict_last())
                 : "memory");
}
__device__ __forceinline__ void st_part(float *p, float v)
{
    asm volatile("st.global.cg.L2::cache_hint.f32 [%0], %1, %2;" ::"l"(p), "f"(v),
                 "l"(l2_evict_last())
                 : "memory");
}
/* A partial's float4 for the finish, from L2, evict first. */
__device__ __forceinline__ float4 ld_part4(const float *p)
{
    float4 v;
    asm volatile("ld.global.cg.L2::cache_hint.v4.f32 {%0,%1,%2,%3}, [%4], %5;"
                 : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
                 : "l"(p), "l"(l2_evict_first())
                 : "memory");
    return v;
}

__device__ __forceinline__ unsigned ld_acquire(const unsigned *p)
{
    unsigned v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ void fence_acq_rel_gpu()
{
    asm volatile("fence.acq_rel.gpu;" ::: "memory");
}

__device__ __forceinline__ void red_release_add(unsigned *p, unsigned v)
{
    asm volatile("red.release.gpu.global.add.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ unsigned atom_acq_rel_add(unsigned *p, unsigned v)
{
    unsigned old;
    asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], %2;"
                 : "=r"(old)
                 : "l"(p), "r"(v)
                 : "memory");
    return old;
}
__device__ __forceinline__ void st_relaxed(unsigned *p, unsigned v)
{
    asm volatile("st.relaxed.gpu.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

__device__ __forceinline__ void st_release_sys64(unsigned long long *p, unsigned long long v)
{
    asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
__device__ __forceinline__ void st_release_gpu64(unsigned long long *p, unsigned long long v)
{
    asm volatile("st.release.gpu.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

/* A shared-memory address as PTX's .shared instructions take it. */
__device__ __forceinline__ unsigned smem_addr(const void *p)
{
    return (unsigned)__cvta_generic_to_shared(p);
}

/* Asynchronous 16-byte copies, global to shared (sm_80 and later): the
 * contiguous finish's loads of the partials, evict first (st_part4). */
__device__ __forceinline__ void cp_async16(void *sdst, const void *gsrc)
{
    asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2;" ::"r"(
                     smem_addr(sdst)),
                 "l"(gsrc), "l"(l2_evict_first())
                 : "memory");
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
 * The per-row sums are fp32 by default; -DRNK_ROW_F64=1 accumulates them in
 * fp64 (each thread's products are still formed in fp32; the ring, general
 * and S kernels alike), the accuracy experiment of bench/RESULTS.md: it
 * brings 4096 x 256's worst dx element (bf16 weight) from 1.15 to 0.50 ulp,
 * below eager's 0.52, and every shape of the accuracy table to eager's or
 * below, but costs 1-4 % on the ring kernel (H100, 2026-12-06) and, with
 * those shapes on S, 1.1 % over the grid and 3 % at 4096 x 256 (H100,
 * 2026-12-07): over the 1 % the accuracy target allows; not the default.
 * Only S's rows of up to 256 columns have fp64 sums in production
 * (bwd_s.cuh's RNK_S_F64_MAXN: 0.7-1.0 % over the grid).
 * TwoSum row sums widened once into an fp64 tree (RNK_ROW_F64=2 for a
 * while) were 1-4 % slower at every ring shape (H100, 2026-12-07), so they
 * went again.
 */
#ifndef RNK_ROW_F64
#define RNK_ROW_F64 0
#endif
#if RNK_ROW_F64
typedef double rsum_t;
#else
typedef float rsum_t;
#endif

/*
 * Sum (a, b) over the tpr threads of stripe g in a fixed order: a shuffle
 * tree inside each warp, then the stripe's warps in order (b only when
 * only_b: a is not needed when rstd is given).  A stripe of one warp needs no
 * barrier.  A stripe of several warps meets at one barrier per row: its own
 * named barrier (1 + g, tpr threads) when stripes run independently (the
 * fast path: G <= 15 there whenever tpr > 32), else the whole block's (the
 * general path, whose stripes step in lockstep).  red is [2][32][2],
 * double-buffered by parity so that one barrier per row does: a warp can
 * rewrite red[parity] only after the stripe's next barrier, which every
 * reader of the last red[parity] has passed.
 */
template <class S>
__device__ __forceinline__ void stripe_sum2(S &a, S &b, bool only_b, int g, int tpr, int parity,
                                            bool own_barrier, S (*red)[32][2], bool tree = false)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        if (!only_b)
            a += __shfl_xor_sync(0xffffffffu, a, o);
        b += __shfl_xor_sync(0xffffffffu, b, o);
    }
    if (tpr > 32) {
        const int warp = threadIdx.x >> 5, w0 = (g * tpr) >> 5, nw = tpr >> 5;
        const int lane = threadIdx.x & 31;
        if (lane == 0) {
            red[parity][warp][0] = a;
            red[parity][warp][1] = b;
        }
        if (own_barrier)
            asm volatile("bar.sync %0, %1;" ::"r"(1 + g), "r"(tpr) : "memory");
        else
            asm volatile("bar.sync 1, %0;" ::"r"(blockDim.x) : "memory");
        if (tree) {
            /* Lane i takes warp i's sums (zeros past the stripe's warps),
             * then the same fixed shuffle tree: no loop, every lane ends
             * with the same sums. */
            a = !only_b && lane < nw ? red[parity][w0 + lane][0] : (S)0;
            b = lane < nw ? red[parity][w0 + lane][1] : (S)0;
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) {
                if (!only_b)
                    a += __shfl_xor_sync(0xffffffffu, a, o);
                b += __shfl_xor_sync(0xffffffffu, b, o);
            }
            return;
        }
        a = 0;
        b = 0;
        for (int i = 0; i < nw; i++) {
            a += red[parity][w0 + i][0];
            b += red[parity][w0 + i][1];
        }
    }
}

/* ---- per-block timelines (RNK_TRACE = 1; empty otherwise) ---------------
 * Thread 0 of each block stores %globaltimer at the phase boundaries of
 * rnk_test.h (T0 .. T5) as it passes them (after the block's barrier where
 * there is one), straight to global memory, so that nothing stays live in
 * registers across the row loop.  A handful of stores a block, one a chunk. */
#if RNK_TRACE
__device__ __forceinline__ uint64_t trace_now()
{
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)::"memory");
    return t;
}
#endif

/* T0, the block's SM and (block 0) the launch's head.  kind: rnk_test.h's. */
__device__ __forceinline__ void trace_start(const Params &p, unsigned kind)
{
#if RNK_TRACE
    if (p.tr_head != nullptr && threadIdx.x == 0) {
        const uint64_t t = trace_now();
        if ((int)blockIdx.x < p.tr_nblk) {
            unsigned sm;
            asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
            p.tr_blk[blockIdx.x].t[0] = t;
            p.tr_blk[blockIdx.x].smid = sm;
        }
        if (blockIdx.x == 0) {
            rnk_trace_head *h = p.tr_head;
            h->grid = gridDim.x;
            h->threads = blockDim.x;
            h->nchunks = (unsigned)p.nchunks;
            h->nslices = (unsigned)p.nslices;
            h->G = (unsigned)p.G;
            h->tpr = (unsigned)p.tpr;
            h->kind = kind;
            h->blocks_cap = (unsigned)p.tr_nblk;
            h->chunks_cap = (unsigned)p.tr_nchk;
            h->magic = RNK_TRACE_MAGIC;
        }
    }
#else
    (void)p, (void)kind;
#endif
}

/* The block's finish has its group sums (rnk_trace_block.tg). */
__device__ __forceinline__ void trace_groups(const Params &p)
{
#if RNK_TRACE
    if (p.tr_head != nullptr && threadIdx.x == 0 && (int)blockIdx.x < p.tr_nblk)
        p.tr_blk[blockIdx.x].tg = trace_now();
#else
    (void)p;
#endif
}

/* T[first] .. T[last] = now (one reading). */
__device__ __forceinline__ void trace_mark(const Params &p, int first, int last)
{
#if RNK_TRACE
    if (p.tr_head != nullptr && threadIdx.x == 0 && (int)blockIdx.x < p.tr_nblk) {
        const uint64_t t = trace_now();
        for (int i = first; i <= last; i++)
            p.tr_blk[blockIdx.x].t[i] = t;
    }
#else
    (void)p, (void)first, (void)last;
#endif
}

/* T2, the claim loop's end, with the number of chunks the block did. */
__device__ __forceinline__ void trace_rows_done(const Params &p, int chunks)
{
#if RNK_TRACE
    if (p.tr_head != nullptr && threadIdx.x == 0 && (int)blockIdx.x < p.tr_nblk) {
        p.tr_blk[blockIdx.x].t[2] = trace_now();
        p.tr_blk[blockIdx.x].chunks = (unsigned)chunks;
    }
#else
    (void)p, (void)chunks;
#endif
}

/* Chunk k done (published, where there is a publish) by this block. */
__device__ __forceinline__ void trace_chunk(const Params &p, int k)
{
#if RNK_TRACE
    if (p.tr_head != nullptr && threadIdx.x == 0 && k < p.tr_nchk) {
        p.tr_chk[k].t = trace_now();
        p.tr_chk[k].block = blockIdx.x;
    }
#else
    (void)p, (void)k;
#endif
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
#if RNK_LEAN_SYNC
        /* Release at gpu scope is cumulative: it covers the block's writes
         * that the barrier ordered before it. */
        red_release_add(&p.ctr[CTR_DONE], 1u);
#else
        __threadfence();
        atomicAdd(&p.ctr[CTR_DONE], 1u);
#endif
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

/* Interleaved order: the rows of chunk k, k + P, ... below m. */
__device__ __forceinline__ int64_t chunk_len(const Params &p, int k)
{
    return (p.m - k + p.nchunks - 1) / p.nchunks;
}

/*
 * The cancel word (rnk_bwd_args.cancel), known to each block before it does
 * anything else.  It may lie in host memory, where a read costs a trip
 * over the bus and hundreds of blocks reading it at once cost hundreds of
 * microseconds, so one block per launch reads it: the first to swap the
 * workspace's CTR_CANCEL from UNKNOWN to READING, which then stores CLEAR
 * or SET; the others wait for that (the reader is running, so the wait
 * ends), and the launch's last block resets it to UNKNOWN with the other
 * counters.  The whole launch thus sees one value.  A block that finds it
 * set claims no chunk and reads or writes no tensor; it only takes part in
 * the exit count (finish_and_exit without the finish), so the last block out
 * still resets the counters.  The gate word (rnk_bwd_args.gate) and its
 * latch are read by the same thread in the same trip: below its key, or
 * with the latch at its epoch, the state is GATED, which is SET without the
 * done words, whatever the cancel word says (and the latch is set).  Returns
 * CANCEL_CLEAR, _SET or _GATED.
 */
__device__ __forceinline__ int cancelled(const Params &p)
{
    __shared__ int s_cancel;
    if (p.cancel == nullptr && p.gate == nullptr)
        return CANCEL_CLEAR;
    if (threadIdx.x == 0) {
        unsigned st = atomicCAS(&p.ctr[CTR_CANCEL], (unsigned)CANCEL_UNKNOWN,
                                (unsigned)CANCEL_READING);
        if (st == CANCEL_UNKNOWN) {
            /* The three loads go out together; the fence after them
             * makes them an acquire (at the GPU's scope: the client's
             * kernels that wrote the inputs ran on this GPU, in the
             * default memory synchronization domain, and its stream's
             * write of ready follows them with a system-wide barrier;
             * a producer in the remote domain would need .sys), so
             * this launch's reads of the inputs come after an open gate,
             * and a release for the verdict, which the other blocks read
             * with acquire.  (ld.acquire of the gate word instead cost
             * 1.3-1.5 us a call, fence.acq_rel.sys 0.6, this fence 0.2
             * at most: bench/RESULTS.md.)  The cancel word needs no
             * order: a set one means nothing is read. */
            unsigned c = p.cancel ? *(const volatile unsigned *)p.cancel : 0u;
            /* (bit 62 is not the client's: rnk.h) */
            unsigned long long gv =
                p.gate ? *(const volatile unsigned long long *)p.gate & ~(1ull << 62) : 0ull;
            unsigned long long lv = p.latch ? *(volatile unsigned long long *)p.latch : 0ull;
            fence_acq_rel_gpu();
            /* A shut gate first: the daemon took the call back and runs
             * it again (or never, its client gone), so not even a
             * cancelled launch may write its done words.  It stays shut
             * for the later launches of its epoch (the latch). */
            const bool latched = p.latch && lv == p.latch_epoch;
            const bool shut = p.gate && (latched || (long long)(gv - p.gate_key) < 0);
            if (shut && p.latch && !latched) {
                ((volatile unsigned long long *)p.latch)[1] = p.gate_key;
                ((volatile unsigned long long *)p.latch)[0] = p.latch_epoch;
                __threadfence_system();
            }
            st = shut       ? CANCEL_GATED
                 : c != 0u  ? CANCEL_SET
                            : CANCEL_CLEAR;
            atomicExch(&p.ctr[CTR_CANCEL], st);
        } else {
            while ((st = ld_acquire(&p.ctr[CTR_CANCEL])) == CANCEL_READING)
                __nanosleep(32);
        }
        s_cancel = (int)st;
    }
    __syncthreads();
    return s_cancel;
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

} /* namespace rnk */

#endif
