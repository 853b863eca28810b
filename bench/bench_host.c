/* SPDX-License-Identifier: MIT */
/*
 * bench_host.c - bench_host.h's daemon and call.
 */
#include "bench_host.h"

#include <errno.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench_util.h"

enum { MAX_EXTRA = 32 };

pid_t bench_daemon_start(const char *path, const char *endpoint, char **extra, int nextra)
{
    char *argv[8 + MAX_EXTRA];
    int k = 0;
    bool backend = false;

    if (nextra > MAX_EXTRA) {
        fprintf(stderr, "bench: at most %d daemon arguments\n", MAX_EXTRA);
        return -1;
    }
    argv[k++] = (char *)path;
    argv[k++] = "--endpoint";
    argv[k++] = (char *)endpoint;
    argv[k++] = "--config";
    argv[k++] = "/dev/null";
    for (int i = 0; i < nextra; i++)
        backend |= strcmp(extra[i], "--backend") == 0;
    if (!backend) {
        argv[k++] = "--backend";
        argv[k++] = "cpu";
    }
    for (int i = 0; i < nextra; i++)
        argv[k++] = extra[i];
    argv[k] = NULL;
    pid_t pid = fork();
    if (pid == 0) {
        if (!freopen("/dev/null", "w", stderr))
            _exit(127);
        execv(path, argv);
        _exit(127);
    }
    if (pid < 0) {
        fprintf(stderr, "bench: fork: %s\n", strerror(errno));
        return -1;
    }
    /* Up once it answers. */
    for (int i = 0; i < 200; i++) {
        rn_connect_opts o = {.endpoint = endpoint, .timeout_ms = 200};
        rn_client *c = NULL;
        uint64_t rtt;
        if (rn_connect(&o, &c) == 0 && rn_ping(c, &rtt) == 0) {
            rn_close(c);
            return pid;
        }
        rn_close(c);
        sleep_us(50000);
    }
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    fprintf(stderr, "bench: the daemon %s did not answer within 10 s\n", path);
    return -1;
}

void bench_daemon_stop(pid_t pid)
{
    if (pid <= 0)
        return;
    kill(pid, SIGTERM);
    waitpid(pid, NULL, 0);
}

void bench_tiny_call(float *buf, rn_bwd_args *a)
{
    enum { M = BENCH_TINY_M, N = BENCH_TINY_N };
    float *x = buf, *dy = x + M * N, *dx = dy + M * N, *w = dx + M * N, *dw = w + N;
    for (int i = 0; i < M * N; i++) {
        x[i] = (float)((i * 7) % 11) / 11.0f - 0.5f;
        dy[i] = (float)((i * 5) % 13) / 13.0f - 0.5f;
    }
    for (int j = 0; j < N; j++)
        w[j] = 1.0f + (float)j / N;
    *a = (rn_bwd_args)RN_BWD_ARGS_INIT;
    a->m = M, a->n = N;
    a->x_dtype = a->dy_dtype = a->dx_dtype = a->w_dtype = a->dw_dtype = RN_DTYPE_F32;
    a->dres_dtype = RN_DTYPE_NONE;
    a->x = x, a->x_stride = N;
    a->dy = dy, a->dy_stride = N;
    a->dx = dx, a->dx_stride = N;
    a->w = w, a->dw = dw;
    a->eps = 1e-6f;
}
