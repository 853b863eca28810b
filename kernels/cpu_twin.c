/* SPDX-License-Identifier: MIT */
/*
 * cpu_twin.c - the CPU backend's RMSNorm backward: the same math as the CUDA
 * kernel, multi-threaded with pthreads, and the same dw summation order
 * (rnk.h, rnk_chunking_of), so its dw is bitwise the GPU's when rstd is
 * given and its results never depend on the thread count.
 *
 * Phase 1: threads claim the chunks of rnk_chunking_of() (contiguous or
 * interleaved rows, rnk.h) from an atomic counter; each writes dx for its
 * rows and one fp32 dw partial per chunk.
 * Phase 2: threads claim column blocks and add the partials in chunk order.
 * Per-row sums (x^2 for a recomputed rstd, xhat * g for the projection) are
 * accumulated in double: more accurate than the GPU's fp32 tree (fp64 only
 * on its fast path's rows of up to 256 columns), and, being inside one row,
 * just as independent of the thread count.
 *
 * Must be compiled without floating-point contraction (the Makefile gives
 * kernels/ -ffp-contract=off), so that dy * xhat and the sums are each
 * rounded once, exactly like the kernel's __fmul_rn / __fadd_rn.
 */
#include "rnk.h"
#include "rnk_conv.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct twin_job {
    const rnk_bwd_args *a;
    int64_t nchunks;     /* P */
    int64_t chunk;       /* contiguous: rows per chunk C (chunk k: rows k*C ..);
                          * 0: interleaved (chunk k: rows k, k + P, k + 2P, ...) */
    int stripes;
    float *partials;     /* [nchunks][n] or NULL when dw is not wanted */
    atomic_llong next;   /* next chunk (phase 1) or column block (phase 2) */
    atomic_int failed;   /* a worker could not allocate its scratch */
} twin_job;

enum { COL_BLOCK = 1024 };

/* Phase 1 for one chunk (its rows in rnk.h's order).  xf, yf: the row's x
 * and dy; of: its dx before rounding; rf: its dresidual_out (scratch rows of
 * n floats). */
static void run_chunk(twin_job *job, int64_t k, float *xf, float *yf, float *of, float *rf,
                      const float *wv, float *stripe)
{
    const rnk_bwd_args *a = job->a;
    const int64_t n = a->n, G = job->stripes, C = job->chunk;
    /* rows i0, i0 + step, ... below i1 */
    const int64_t step = C ? 1 : job->nchunks, i0 = C ? k * C : k;
    const int64_t i1 = C && (k + 1) * C < a->m ? (k + 1) * C : a->m;
    if (stripe)
        for (int64_t j = 0; j < G * n; j++)
            stripe[j] = 0.0f;
    for (int64_t jr = 0, i = i0; i < i1; jr++, i += step) {
        const int64_t xo = i * a->x_stride, yo = i * a->dy_stride, dxo = i * a->dx_stride;
        /* The whole row is read before any of dx is written: dx may be dy. */
        rnk_load_row(a->x_dtype, a->x, xo, n, xf);
        rnk_load_row(a->dy_dtype, a->dy, yo, n, yf);
        if (a->dres_dtype != RNK_NONE)
            rnk_load_row(a->dres_dtype, a->dres, i * a->dres_stride, n, rf);
        float rstd;
        if (a->rstd) {
            rstd = a->rstd[i];
        } else {
            double ss = 0.0;
            for (int64_t j = 0; j < n; j++)
                ss += (double)xf[j] * (double)xf[j];
            rstd = (float)(1.0 / sqrt(ss / (double)n + (double)a->eps));
        }
        double cs = 0.0;
        for (int64_t j = 0; j < n; j++) {
            float xh = xf[j] * rstd;
            float g = wv ? yf[j] * wv[j] : yf[j];
            cs += (double)xh * (double)g;
        }
        const float c = (float)(cs / (double)n);
        float *srow = stripe ? stripe + (jr % G) * n : NULL;
        for (int64_t j = 0; j < n; j++) {
            float xh = xf[j] * rstd;
            float g = wv ? yf[j] * wv[j] : yf[j];
            float d = rstd * (g - xh * c);
            if (a->dres_dtype != RNK_NONE)
                d = d + rf[j];
            of[j] = d;
            if (srow) {
#if RNK_DW_FMA
                srow[j] = fmaf(yf[j], xh, srow[j]);
#else
                float p = yf[j] * xh;
                srow[j] = srow[j] + p;
#endif
            }
        }
        rnk_store_row(a->dx_dtype, a->dx, dxo, n, of);
    }
    if (stripe) {
        float *part = job->partials + k * n;
        for (int64_t j = 0; j < n; j++) {
            float p = 0.0f;
            for (int64_t s = 0; s < G; s++)
                p = p + stripe[s * n + j];
            part[j] = p;
        }
    }
}

static void *phase1(void *arg)
{
    twin_job *job = arg;
    const rnk_bwd_args *a = job->a;
    const int64_t n = a->n;
    const int want_dw = job->partials != NULL;
    const int have_w = a->w_dtype != RNK_NONE;
    size_t floats = (size_t)n * (4 + (have_w ? 1 : 0) + (want_dw ? job->stripes : 0));
    float *buf = malloc(floats * sizeof(float));
    if (!buf) {
        atomic_store(&job->failed, 1);
        return NULL;
    }
    float *xf = buf, *yf = buf + n, *of = buf + 2 * n, *rf = buf + 3 * n;
    float *wv = have_w ? buf + 4 * n : NULL;
    float *stripe = want_dw ? buf + (4 + (have_w ? 1 : 0)) * n : NULL;
    if (wv)
        for (int64_t j = 0; j < n; j++)
            wv[j] = rnk_load(a->w_dtype, a->w, j) + a->weight_offset;
    for (;;) {
        if (atomic_load(&job->failed))
            break;
        int64_t k = atomic_fetch_add(&job->next, 1);
        if (k >= job->nchunks)
            break;
        run_chunk(job, k, xf, yf, of, rf, wv, stripe);
    }
    free(buf);
    return NULL;
}

static void *phase2(void *arg)
{
    twin_job *job = arg;
    const rnk_bwd_args *a = job->a;
    const int64_t n = a->n, nblocks = (n + COL_BLOCK - 1) / COL_BLOCK;
    for (;;) {
        int64_t b = atomic_fetch_add(&job->next, 1);
        if (b >= nblocks)
            break;
        int64_t j1 = (b + 1) * COL_BLOCK < n ? (b + 1) * COL_BLOCK : n;
        for (int64_t j = b * COL_BLOCK; j < j1; j++) {
            /* rnk.h: groups of RNK_DW_GROUP partials, then the groups */
            float d = 0.0f;
            for (int64_t q = 0; q < job->nchunks; q += RNK_DW_GROUP) {
                int64_t qe = q + RNK_DW_GROUP < job->nchunks ? q + RNK_DW_GROUP : job->nchunks;
                float g = 0.0f;
                for (int64_t k = q; k < qe; k++)
                    g = g + job->partials[k * n + j];
                d = d + g;
            }
            rnk_store(a->dw_dtype, a->dw, j, d);
        }
    }
    return NULL;
}

/* Run fn on nthreads threads, the caller being one of them.  If a thread
 * cannot be created the others do its share: results do not depend on it. */
static void run_parallel(void *(*fn)(void *), twin_job *job, int nthreads)
{
    pthread_t tid[256];
    int started = 0;
    if (nthreads > 256)
        nthreads = 256;
    for (int t = 1; t < nthreads; t++) {
        if (pthread_create(&tid[started], NULL, fn, job) != 0)
            break;
        started++;
    }
    fn(job);
    for (int t = 0; t < started; t++)
        pthread_join(tid[t], NULL);
}

int rnk_cpu_bwd(const rnk_bwd_args *a, int nthreads, char *msg, size_t msglen)
{
    int rc = rnk_check_args(a, msg, msglen);
    if (rc)
        return rc;
    if (a->m == 0)
        return RNK_OK;
    if (nthreads <= 0) {
        long c = sysconf(_SC_NPROCESSORS_ONLN);
        nthreads = c > 0 ? (int)c : 1;
    }
    twin_job job;
    memset(&job, 0, sizeof job);
    job.a = a;
    rnk_chunking ch;
    rnk_chunking_of(a->m, a->n, a->x_dtype, a->dy_dtype, a->dx_dtype, &ch);
    job.nchunks = ch.nchunks;
    job.chunk = ch.interleaved ? 0 : ch.rows;
    job.stripes = ch.stripes;
    atomic_init(&job.next, 0);
    atomic_init(&job.failed, 0);
    if (a->dw_dtype != RNK_NONE) {
        job.partials = malloc((size_t)job.nchunks * (size_t)a->n * sizeof(float));
        if (!job.partials)
            goto nomem;
    }
    int t1 = nthreads < job.nchunks ? nthreads : (int)job.nchunks;
    run_parallel(phase1, &job, t1);
    if (atomic_load(&job.failed))
        goto nomem;
    if (job.partials) {
        int64_t nblocks = (a->n + COL_BLOCK - 1) / COL_BLOCK;
        atomic_store(&job.next, 0);
        run_parallel(phase2, &job, nthreads < nblocks ? nthreads : (int)nblocks);
    }
    free(job.partials);
    return RNK_OK;

nomem:
    free(job.partials);
    if (msg && msglen > 0)
        snprintf(msg, msglen, "cpu: out of memory for %lld x %lld", (long long)a->m,
                 (long long)a->n);
    return RNK_ENOMEM;
}
