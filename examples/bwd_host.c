/* SPDX-License-Identifier: MIT */
/*
 * bwd_host.c - the smallest whole worker: connect to rmsnormd, share three
 * tensors with it, run one RMSNorm backward pass there and print a result.
 *
 * It uses the CPU backend's calls (rn_buffer_alloc, rn_rmsnorm_bwd_host), so
 * it runs on any host with a daemon; a CUDA worker passes device pointers
 * and a stream to rn_rmsnorm_bwd instead, with the same rn_bwd_args.
 *
 *   cc bwd_host.c $(pkg-config --cflags --libs rmsnorm-client) -lm -o bwd_host
 *   RMSNORMD_ENDPOINT=ipc:///run/rmsnormd/0/rmsnormd.sock ./bwd_host
 *
 * Exit status: 0 when the daemon's dx and dw match a direct computation.
 */
#include <err.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include <rmsnorm_client.h>

enum { M = 4, N = 8 };

int main(void)
{
    rn_client *c;
    float *x, *dy, *w, *dx, *dw;
    size_t mat = sizeof(float) * M * N, vec = sizeof(float) * N;
    void *buf;
    int rc;

    if (rn_connect(NULL, &c) != 0) /* RMSNORMD_ENDPOINT or the default */
        errx(1, "rmsnormd: %s", rn_last_error(NULL));
    /* One shared buffer holds every tensor; the daemon maps it once. */
    if ((rc = rn_buffer_alloc(c, 3 * mat + 2 * vec, &buf)) != 0)
        errx(1, "rn_buffer_alloc: %s (%s)", rn_last_error(c), rn_err_name(rc));
    x = buf;
    dy = x + M * N;
    dx = dy + M * N;
    w = dx + M * N;
    dw = w + N;
    for (int i = 0; i < M * N; i++) {
        x[i] = (float)((i * 7) % 11) / 11.0f - 0.5f;
        dy[i] = (float)((i * 5) % 13) / 13.0f - 0.5f;
    }
    for (int j = 0; j < N; j++)
        w[j] = 1.0f + (float)j / N;

    rn_bwd_args a = RN_BWD_ARGS_INIT;
    a.m = M;
    a.n = N;
    a.x_dtype = a.dy_dtype = a.dx_dtype = RN_DTYPE_F32;
    a.w_dtype = a.dw_dtype = RN_DTYPE_F32;
    a.dres_dtype = RN_DTYPE_NONE;
    a.x = x, a.x_stride = N;
    a.dy = dy, a.dy_stride = N;
    a.dx = dx, a.dx_stride = N;
    a.w = w;
    a.dw = dw;
    a.rstd = NULL; /* the daemon recomputes it from x and eps */
    a.eps = 1e-6f;
    rn_timing t;
    if ((rc = rn_rmsnorm_bwd_host(c, &a, &t)) != 0)
        errx(1, "rn_rmsnorm_bwd_host: %s (%s)", rn_last_error(c), rn_err_name(rc));

    /* The same computation here, in double, as a check. */
    double worst = 0, dwref[N] = {0};
    for (int i = 0; i < M; i++) {
        double ss = 0, cc = 0;
        for (int j = 0; j < N; j++)
            ss += (double)x[i * N + j] * x[i * N + j];
        double rstd = 1.0 / sqrt(ss / N + 1e-6);
        for (int j = 0; j < N; j++)
            cc += x[i * N + j] * rstd * dy[i * N + j] * w[j];
        cc /= N;
        for (int j = 0; j < N; j++) {
            double xhat = x[i * N + j] * rstd;
            double ref = rstd * (dy[i * N + j] * w[j] - xhat * cc);
            worst = fmax(worst, fabs(ref - dx[i * N + j]));
            dwref[j] += dy[i * N + j] * xhat;
        }
    }
    for (int j = 0; j < N; j++)
        worst = fmax(worst, fabs(dwref[j] - dw[j]));
    printf("rmsnormd %s: dx[0] = %.6f, dw[0] = %.6f, largest error %.2e, %llu us in the daemon\n",
           rn_version(), dx[0], dw[0], worst,
           (unsigned long long)((t.queue_ns + t.compute_ns) / 1000));
    rn_close(c); /* frees the buffer too */
    return worst < 1e-4 ? 0 : 1;
}
