/* SPDX-License-Identifier: MIT */
/*
 * daemon/ - rmsnormd, the daemon: configuration (config.c), logging (log.c),
 * the daemon's life (server.c: start, timers, signals, the drain), the socket
 * (transport.c), the request path (request.c: decode, the op table, the BWD
 * request object; ops.c: the control operations), sessions and regions
 * (session.c), health (health.c), the duplicate window (dedupe.c),
 * statistics (stats.c), systemd notification (notify.c) and the compute
 * backends behind one table of functions (backend.h: backend_cpu.c, and
 * cuda/ where a CUDA Toolkit exists).  ctx.h is the state they share.
 *
 * daemon/ depends on proto/ and kernels/ and on nothing else of ours.  It is
 * the only part of the project that logs.  Internal non-static names use the
 * prefix rnd_.
 *
 * main.c - rmsnormd's entry point: configuration, the backend choice, the
 * server, and the exit status (0 after a clean drain, 1 when start-up fails,
 * 2 after a fatal backend failure).  The daemon stays in the foreground;
 * systemd (or a test) supervises it and learns of readiness via sd_notify.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>
#include <uv.h>

#include "backend.h"
#include "config.h"
#include "front.h"
#include "log.h"
#include "server.h"

#ifndef RN_VERSION
#define RN_VERSION "0.0.0"
#endif

/*
 * Every client connection is a descriptor of the front process, which
 * inherits this limit: the usual soft limit of 1024 ran out at about 1000
 * idle clients, after which nanomsg spun and new clients hung.  So take the
 * hard limit (systemd's units set LimitNOFILE too).
 */
static void raise_fd_limit(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur >= rl.rlim_max)
        return;
    rlim_t want = rl.rlim_max;
    rl.rlim_cur = want;
    if (setrlimit(RLIMIT_NOFILE, &rl) != 0)
        rnd_warn("Failed to raise the descriptor limit to %llu: %s", (unsigned long long)want,
                 strerror(errno));
}

/* The server is large (it holds a message buffer): keep it off the stack. */
static rnd_server server;

/*
 * --backend cuda: CUDA or nothing.  --backend auto: CUDA when a usable device
 * exists, else the CPU backend (the ordinary case on a host without a GPU,
 * logged at info; any other CUDA failure is logged as a warning).
 */
static int start_backend(const rnd_config *cfg, uv_loop_t *loop, rnd_backend **out,
                         char *fallback, size_t fallback_len)
{
    rnd_backend_opts o = {
        .loop = loop,
        .device = cfg->device,
        .threads = cfg->threads,
        .max_jobs = cfg->max_inflight_total,
        .revoked_held = &server.ctx.rings.revoked_held,
        .kernel_deadline_ms = cfg->kernel_deadline_ms,
        .debug_force_grid = cfg->debug_force_grid,
        .cuda_fast_path = cfg->cuda_fast_path,
        .debug_fail_after = cfg->debug_fail_after,
        .fatal = rnd_server_fatal,
        .fatal_ctx = &server,
        .revoke = rnd_server_revoke,
    };
    rnp_error err = {0};
    int rc;

    if (cfg->backend != RND_BACKEND_CPU) {
#ifdef RN_HAVE_CUDA
        /*
         * Load every kernel variant when the context is created.  With lazy
         * loading the first launch of a variant loads its module, which
         * waits for work already queued on the device - including a session
         * stream blocked on a client's unready input - and so stalls the loop
         * thread for as long as that client takes.  A process-wide setting,
         * so it is made here, before the first CUDA call.
         */
        setenv("CUDA_MODULE_LOADING", "EAGER", 1);
        rc = rnd_backend_cuda_ops.init(&o, out, &err);
        if (rc == 0)
            return 0;
        if (cfg->backend == RND_BACKEND_CUDA) {
            rnd_err("Failed to start the cuda backend: %s", err.msg);
            return -1;
        }
        if (rc == RN_NO_CUDA)
            rnd_info("%s: using the CPU backend", err.msg);
        else {
            rnd_warn("The cuda backend did not start (%s): using the cpu backend", err.msg);
            snprintf(fallback, fallback_len, "cuda did not start (%.60s); serving on the cpu",
                     err.msg);
        }
#else
        if (cfg->backend == RND_BACKEND_CUDA) {
            rnd_err("Failed to start the cuda backend: this rmsnormd was built without CUDA");
            return -1;
        }
#endif
    }
    rc = rnd_backend_cpu_ops.init(&o, out, &err);
    if (rc != 0) {
        rnd_err("Failed to start the cpu backend: %s", err.msg);
        return -1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    char fallback[RNP_REASON_LEN] = "";
    rnp_error err = {0};
    rnd_config cfg;
    rnd_backend *be = NULL;
    uv_loop_t loop;
    int action, rc;

    /* The front process (front.h): this binary again, started by the core. */
    if (argc > 1 && strcmp(argv[1], "--front") == 0)
        return rnd_front_main(argc - 2, argv + 2);
    rnd_log_init();
    if (rnd_config_load(&cfg, argc, argv, RND_DEFAULT_CONFIG, &action, &err) != 0) {
        fprintf(stderr, "rmsnormd: %s\n", err.msg);
        return 1;
    }
    if (action == RND_SHOW_HELP) {
        rnd_config_usage(stdout, "rmsnormd");
        return 0;
    }
    if (action == RND_SHOW_VERSION) {
        printf("rmsnormd %s\n", RN_VERSION);
        return 0;
    }
    rnd_log_set_level(cfg.log_level);
    /* A reply to a client that vanished must not kill the daemon. */
    signal(SIGPIPE, SIG_IGN);
    raise_fd_limit();

    if ((rc = uv_loop_init(&loop)) != 0) {
        rnd_err("Failed to start the event loop: %s", uv_strerror(rc));
        return 1;
    }
    if (start_backend(&cfg, &loop, &be, fallback, sizeof fallback) != 0)
        goto fail_loop;
    if (rnd_server_start(&server, &loop, &cfg, be, &err) != 0) {
        rnd_err("%s", err.msg);
        be->ops->fini(be);
        goto fail_loop;
    }
    rnd_server_set_fallback(&server, fallback);
    rnd_info("rmsnormd %s serving %s with the %s backend (%s, %u %s)%s%s", RN_VERSION,
             cfg.endpoint, server.ctx.dev.backend, server.ctx.dev.device_name,
             server.ctx.dev.sm_count, strcmp(server.ctx.dev.backend, "cpu") == 0 ? "threads" : "SMs",
             cfg.config_path[0] ? "; config " : "", cfg.config_path);
    rnd_server_announce(&server);

    uv_run(&loop, UV_RUN_DEFAULT);
    rnd_server_fini(&server);
    rc = uv_loop_close(&loop);
    if (rc != 0)
        rnd_warn("Event loop closed with handles still open: %s", uv_strerror(rc));
    if (server.exit_code == 2) {
        /* A failed device: every request has been answered and the socket
         * closed.  Leave without the library destructors (cudart's among
         * them), which may run into threads still inside a broken CUDA
         * context and turn an orderly exit 2 into a crash. */
        fflush(stdout);
        fflush(stderr);
        _exit(2);
    }
    return server.exit_code;

fail_loop:
    /* Let closing handles finish so the loop closes cleanly. */
    uv_run(&loop, UV_RUN_DEFAULT);
    uv_loop_close(&loop);
    return 1;
}
