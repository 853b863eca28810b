/* SPDX-License-Identifier: MIT */
/*
 * bench_wake - what a thread wake-up costs on this host, as the fast path's
 * daemon pays it when calls come further apart than the doorbell thread's
 * spin (PyTorch's synced backward: one call every few hundred us).  A call
 * on the ring reaches the GPU through two sleeping threads of the daemon:
 * the client's futex wake of the doorbell thread, then the doorbell
 * thread's uv_async_send (an eventfd) to the loop in epoll_wait.  Measured
 * here with two threads of one process, a call every --gap us:
 *
 *   futex     a thread asleep in FUTEX_WAIT, woken by FUTEX_WAKE
 *   eventfd   a thread asleep in epoll_wait on an eventfd, woken by a write
 *   chain     futex, then that thread's eventfd write to a third in
 *             epoll_wait (the daemon's doorbell -> loop path)
 *   spin      a thread spinning on the word (the doorbell thread's first
 *             50 us): the floor
 *
 * Prints p10/p50/p90/p99 of the time from the waker's clock read to the
 * woken thread's (CLOCK_MONOTONIC), and writes them to --out FILE (CSV).
 * Usage: bench_wake [--gap US] [--n N] [--out FILE]
 */
#include <errno.h>
#include <linux/futex.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "bench_util.h"

enum { M_FUTEX, M_EVENTFD, M_CHAIN, M_SPIN, M_N };
static const char *mode_name[M_N] = {"futex", "eventfd", "chain", "spin"};

static _Atomic uint32_t word;    /* the doorbell */
static _Atomic uint64_t t_sent;  /* the waker's clock */
static _Atomic uint64_t t_woken; /* the last thread's clock, 0 until then */
static _Atomic int stop;
static int efd, ep;
static int mode;

static void die(const char *what)
{
    fprintf(stderr, "bench_wake: %s: %s\n", what, strerror(errno));
    exit(1);
}

/* The last thread: in epoll_wait on efd (eventfd, chain), else none. */
static void *loop_thread(void *arg)
{
    struct epoll_event ev;
    uint64_t v;

    (void)arg;
    while (!atomic_load(&stop)) {
        int n = epoll_wait(ep, &ev, 1, 200);
        if (n < 0 && errno != EINTR)
            die("epoll_wait");
        if (n == 1) {
            if (read(efd, &v, sizeof v) != sizeof v)
                die("read eventfd");
            atomic_store(&t_woken, now_ns());
        }
    }
    return NULL;
}

/* The doorbell thread: asleep on the word (futex, chain) or spinning on it. */
static void *bell_thread(void *arg)
{
    uint32_t seen = 0;
    uint64_t one = 1;

    (void)arg;
    while (!atomic_load(&stop)) {
        uint32_t w = atomic_load(&word);
        if (w == seen) {
            if (mode != M_SPIN) {
                struct timespec ts = {0, 200000000};
                syscall(SYS_futex, &word, FUTEX_WAIT_PRIVATE, seen, &ts, NULL, 0);
            }
            continue;
        }
        seen = w;
        if (mode == M_CHAIN) {
            if (write(efd, &one, sizeof one) != sizeof one)
                die("write eventfd");
        } else {
            atomic_store(&t_woken, now_ns());
        }
    }
    return NULL;
}

int main(int argc, char **argv)
{
    unsigned gap = 300, n = 2000;
    const char *out = NULL;
    FILE *csv = NULL;

    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--gap") == 0 && i + 1 < argc)
            gap = (unsigned)atoi(argv[++i]);
        else if (strcmp(argv[i], "--n") == 0 && i + 1 < argc)
            n = (unsigned)atoi(argv[++i]);
        else if (strcmp(argv[i], "--out") == 0 && i + 1 < argc)
            out = argv[++i];
        else {
            fprintf(stderr, "usage: bench_wake [--gap US] [--n N] [--out FILE]\n");
            return 2;
        }
    }
    if (n < 10 || gap < 10 || gap > 1000000) {
        fprintf(stderr, "bench_wake: --n >= 10 and --gap in 10..1000000\n");
        return 2;
    }
    if (out && !(csv = fopen(out, "w")))
        die(out);
    if (csv)
        fprintf(csv, "mode,gap_us,n,p10_us,p50_us,p90_us,p99_us\n");
    uint64_t *lat = calloc(n, sizeof *lat);
    if (!lat)
        die("calloc");
    printf("thread wake-up, a call every %u us, %u calls each (us from the waker's clock)\n", gap, n);
    printf("%-8s %8s %8s %8s %8s\n", "mode", "p10", "p50", "p90", "p99");
    for (mode = 0; mode < M_N; mode++) {
        pthread_t tb, tl;
        struct epoll_event ev = {.events = EPOLLIN};

        if ((efd = eventfd(0, EFD_NONBLOCK)) < 0 || (ep = epoll_create1(0)) < 0)
            die("eventfd/epoll");
        if (epoll_ctl(ep, EPOLL_CTL_ADD, efd, &ev) != 0)
            die("epoll_ctl");
        atomic_store(&stop, 0);
        atomic_store(&word, 0);
        if (pthread_create(&tl, NULL, loop_thread, NULL) != 0 ||
            (mode != M_EVENTFD && pthread_create(&tb, NULL, bell_thread, NULL) != 0))
            die("pthread_create");
        sleep_us(20000);
        unsigned got = 0;
        for (unsigned i = 0; i < n + 10; i++) {
            sleep_us(gap);
            atomic_store(&t_woken, 0);
            uint64_t t0 = now_ns();
            atomic_store(&t_sent, t0);
            if (mode == M_EVENTFD) {
                uint64_t one = 1;
                if (write(efd, &one, sizeof one) != sizeof one)
                    die("write eventfd");
            } else {
                atomic_fetch_add(&word, 1);
                if (mode != M_SPIN)
                    syscall(SYS_futex, &word, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
            }
            uint64_t t1;
            uint64_t deadline = t0 + 100000000u;
            while ((t1 = atomic_load(&t_woken)) == 0 && now_ns() < deadline) {
            }
            if (t1 && i >= 10) /* the first ten warm up */
                lat[got++] = t1 - t0;
        }
        atomic_store(&stop, 1);
        atomic_fetch_add(&word, 1);
        syscall(SYS_futex, &word, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
        pthread_join(tl, NULL);
        if (mode != M_EVENTFD)
            pthread_join(tb, NULL);
        close(ep);
        close(efd);
        if (got < n / 2) {
            fprintf(stderr, "bench_wake: %s: only %u of %u wake-ups seen\n", mode_name[mode], got, n);
            return 1;
        }
        qsort(lat, got, sizeof *lat, cmp_u64);
        double q[4];
        const double at[4] = {0.10, 0.50, 0.90, 0.99};
        for (int k = 0; k < 4; k++)
            q[k] = (double)lat[(size_t)(at[k] * (got - 1))] / 1000.0;
        printf("%-8s %8.2f %8.2f %8.2f %8.2f\n", mode_name[mode], q[0], q[1], q[2], q[3]);
        if (csv)
            fprintf(csv, "%s,%u,%u,%.3f,%.3f,%.3f,%.3f\n", mode_name[mode], gap, got, q[0], q[1],
                    q[2], q[3]);
    }
    free(lat);
    if (csv && fclose(csv) != 0)
        die(out);
    return 0;
}
