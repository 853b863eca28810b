/* SPDX-License-Identifier: MIT */
/*
 * kernel_accuracy.c - bench_kernel --accuracy DIR: dx's accuracy of the
 * production kernel on the inputs kernel_torch.py --accuracy DIR wrote.
 */
#include "kernel_accuracy.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu/e2e_cuda.h"

#define CU(call) RNE_CK(call)

/* Read a whole file of `bytes` bytes into host memory, or exit. */
static void *slurp(const char *path, size_t bytes)
{
    FILE *f = fopen(path, "rb");
    void *p = malloc(bytes);
    if (!f || !p || fread(p, 1, bytes, f) != bytes) {
        fprintf(stderr, "accuracy: cannot read %zu bytes of %s\n", bytes, path);
        exit(1);
    }
    fclose(f);
    return p;
}

/* kernel_accuracy.h says what it measures. */
void ka_measure(rnk_device *dev, cudaStream_t st, const char *dir)
{
    static const int64_t ns[] = {256, 1024, 4096, 8192};
    static const char *wn[] = {"f32", "bf16"};
    char path[4096], msg[256];
    snprintf(path, sizeof path, "%s/acc_ours.csv", dir);
    FILE *out = fopen(path, "w");
    if (!out) {
        fprintf(stderr, "accuracy: cannot write %s\n", path);
        exit(1);
    }
    fprintf(out, "m,n,w,impl,max_ulp,frac_over1\n");
    for (int wi = 0; wi < 2; wi++)
        for (int k = 0; k < 4; k++) {
            int64_t m = 4096, n = ns[k], mn = m * n;
            rnk_dtype wt = wi == 0 ? RNK_F32 : RNK_BF16;
            char base[4000];
            snprintf(base, sizeof base, "%s/acc_%lld_%lld_%s", dir, (long long)m, (long long)n, wn[wi]);
            snprintf(path, sizeof path, "%s.x", base);
            uint16_t *hx = slurp(path, (size_t)mn * 2);
            snprintf(path, sizeof path, "%s.dy", base);
            uint16_t *hy = slurp(path, (size_t)mn * 2);
            snprintf(path, sizeof path, "%s.w", base);
            float *hw = slurp(path, (size_t)n * 4);
            snprintf(path, sizeof path, "%s.rstd", base);
            float *hr = slurp(path, (size_t)m * 4);
            uint16_t *hw16 = malloc((size_t)n * 2);
            for (int64_t j = 0; j < n; j++) /* exact: the values came from bf16 */
                rnk_store(RNK_BF16, hw16, j, hw[j]);
            void *x, *dy, *dx, *w, *dw, *ws;
            float *rstd;
            double *ref;
            size_t wsb = rnk_cuda_workspace_size(dev, m, n);
            CU(cudaMalloc(&x, (size_t)mn * 2));
            CU(cudaMalloc(&dy, (size_t)mn * 2));
            CU(cudaMalloc(&dx, (size_t)mn * 2));
            CU(cudaMalloc(&w, (size_t)n * 4));
            CU(cudaMalloc(&dw, (size_t)n * 4));
            CU(cudaMalloc((void **)&rstd, (size_t)m * 4));
            CU(cudaMalloc((void **)&ref, (size_t)mn * 8));
            CU(cudaMalloc(&ws, wsb));
            CU(cudaMemcpy(x, hx, (size_t)mn * 2, cudaMemcpyHostToDevice));
            CU(cudaMemcpy(dy, hy, (size_t)mn * 2, cudaMemcpyHostToDevice));
            CU(cudaMemcpy(w, wi == 0 ? (void *)hw : (void *)hw16, (size_t)n * (wi == 0 ? 4 : 2),
                          cudaMemcpyHostToDevice));
            CU(cudaMemcpy(rstd, hr, (size_t)m * 4, cudaMemcpyHostToDevice));
            CU(cudaMemset(dx, 0xff, (size_t)mn * 2)); /* NaN: unwritten shows */
            rnk_bwd_args a;
            memset(&a, 0, sizeof a);
            a.m = m;
            a.n = n;
            a.x_dtype = a.dy_dtype = a.dx_dtype = RNK_BF16;
            a.w_dtype = a.dw_dtype = wt;
            a.x = x;
            a.dy = dy;
            a.dx = dx;
            a.x_stride = a.dy_stride = a.dx_stride = n;
            a.w = w;
            a.dw = dw;
            a.rstd = rstd;
            a.eps = 1e-5f;
            if (rnk_cuda_workspace_init(ws, wsb, st, msg, sizeof msg) ||
                rnk_cuda_bwd(dev, &a, ws, wsb, st, msg, sizeof msg) ||
                rnk_cuda_ref64(&a, ref, NULL, st, msg, sizeof msg)) {
                fprintf(stderr, "accuracy: %s\n", msg);
                exit(1);
            }
            CU(cudaStreamSynchronize(st));
            uint16_t *gdx = malloc((size_t)mn * 2);
            double *gref = malloc((size_t)mn * 8);
            CU(cudaMemcpy(gdx, dx, (size_t)mn * 2, cudaMemcpyDeviceToHost));
            CU(cudaMemcpy(gref, ref, (size_t)mn * 8, cudaMemcpyDeviceToHost));
            double mx = 0;
            int64_t over = 0;
            for (int64_t e = 0; e < mn; e++) {
                double r = gref[e], got = rnk_load(RNK_BF16, gdx, e);
                double ar = fabs(r) < 0x1p-126 ? 0x1p-126 : fabs(r);
                double u = fabs(got - r) / ldexp(1.0, (int)floor(log2(ar)) - 7);
                if (!(u <= mx)) /* NaN too */
                    mx = u;
                over += !(u <= 1.0);
            }
            fprintf(out, "%lld,%lld,%s,ours,%.4f,%.3e\n", (long long)m, (long long)n, wn[wi], mx,
                    (double)over / (double)mn);
            printf("accuracy %lldx%lld w=%s ours: worst %.3f ulp, %.4f %% beyond 1 ulp\n",
                   (long long)m, (long long)n, wn[wi], mx, 100.0 * (double)over / (double)mn);
            free(gdx);
            free(gref);
            free(hx);
            free(hy);
            free(hw);
            free(hw16);
            free(hr);
            cudaFree(x);
            cudaFree(dy);
            cudaFree(dx);
            cudaFree(w);
            cudaFree(dw);
            cudaFree(rstd);
            cudaFree(ref);
            cudaFree(ws);
        }
    fclose(out);
}
