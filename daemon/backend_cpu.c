/* SPDX-License-Identifier: MIT */
/*
 * backend_cpu.c - the CPU backend: regions are POSIX shared memory objects
 * mapped into the daemon; BWD runs the CPU twin (rnk_cpu_bwd) on a fixed pool
 * of worker threads fed by a bounded queue.  A finished job goes onto a
 * completion list and the loop is woken with uv_async_send; the loop drains
 * the whole list (uv_async_send coalesces wake-ups, so one wake-up may stand
 * for many jobs).  Jobs are never acknowledged early: each gets its done
 * event once computed, and the reply goes then.
 *
 * Ring jobs (the fast path, backend.h's rnd_ring_job) of a session run in
 * order, one at a time, from the session's stream: a worker takes the head
 * of a stream only once the ring's ready word has reached its seq.  No
 * worker blocks on a ready word: while only streams whose heads are not
 * ready wait, one idle worker re-checks them at a growing interval
 * (POLL_MIN_NS .. POLL_MAX_NS), so that one client's unready inputs hold no
 * worker that another client's requests need.
 *
 * Failure: the CPU has no failure mode that ends the backend, but the
 * debugging knob debug-fail-after makes the Nth submitted job fail it as a
 * broken GPU would, so that the server's failure path (every pending request
 * answered DEVICE_FAILING, exit 2) is tested without a GPU.
 */
#include "backend.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cpu_fault.h"
#include "ring_io.h"
#include "rn_check.h"
#include "stats.h"

/* Below this many elements a request runs on one thread: starting helper
 * threads would cost more than it saves. */
#define SPLIT_ELEMS (1 << 18)

/* How often an idle worker re-checks ready words that streams wait on: from
 * this ... */
#define POLL_MIN_NS 20000ull
/* ... doubling to this while nothing becomes ready. */
#define POLL_MAX_NS 2000000ull

typedef struct cpu_backend {
    rnd_backend base;
    uv_async_t async;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    rn_queue waiting;                  /* jobs waiting for a worker (under mu) */
    uint32_t queued, running, max_jobs;
    const uint32_t *revoked_held;      /* rnd_backend_opts.revoked_held (loop thread) */
    rn_queue finished;                 /* jobs waiting for the loop (under mu) */
    rn_queue streams;                  /* cpu_sess with ring jobs waiting (under mu) */
    bool polling;                      /* a worker re-checks ready words (under mu) */
    bool stream_turn;                  /* pick: the streams go first next (under mu) */
    pthread_t *threads;
    uint32_t nthreads, started;
    bool stop;
    char cpu_name[RNP_MAX_NAME];
    /* debug-fail-after (loop thread, except failed: under mu too) */
    uint32_t fail_after, submitted;
    bool failed, fatal_sent;
    char fail_msg[RNP_REASON_LEN];
    void (*fatal)(void *ctx, const char *msg);
    void *fatal_ctx;
} cpu_backend;

/* A session's state: its stream of ring jobs. */
typedef struct cpu_sess {
    rn_queue stream;                   /* ring jobs in order, the head maybe running */
    bool busy;                         /* its head is on a worker */
    rn_queue link;                     /* on streams while the stream is not empty */
} cpu_sess;

/* Under mu: the head of a stream that may start (ready, or nothing to wait
 * for), or NULL; *gated says whether a stream waits on a ready word. */
static rnd_job *pick_stream(cpu_backend *b, bool *gated)
{
    rn_queue *q;

    RN_QUEUE_FOREACH(q, &b->streams) {
        cpu_sess *cs = RN_QUEUE_DATA(q, cpu_sess, link);
        if (cs->busy)
            continue;
        rnd_job *job = RN_QUEUE_DATA(rn_queue_head(&cs->stream), rnd_job, link);
        if (job->ring->status || b->failed || atomic_load(&job->cancelled) ||
            (atomic_load(&job->ring->abandon) && !job->ring->arm_key) ||
            rnd_ring_wait_met(job->ring)) {
            cs->busy = true;
            /* The others' turn first next time. */
            rn_queue_remove(&cs->link);
            rn_queue_push_back(&b->streams, &cs->link);
            return job;
        }
        *gated = true;
    }
    return NULL;
}

/* Under mu: the next job to run, or NULL.  The unordered queue (nanomsg
 * jobs, graph replays) and the streams take turns, so that neither starves
 * the other: before, the queue came first, and clients calling back to back
 * on the classic path (or one replaying graphs) kept every ring call
 * waiting for as long as they went on. */
static rnd_job *pick(cpu_backend *b, bool *gated)
{
    rnd_job *job = NULL;
    rn_queue *q;

    *gated = false;
    if (b->stream_turn && (job = pick_stream(b, gated)) != NULL) {
        b->stream_turn = false;
        return job;
    }
    if ((q = rn_queue_head(&b->waiting))) {
        rn_queue_remove(q);
        b->stream_turn = true;
        return RN_QUEUE_DATA(q, rnd_job, link);
    }
    if (!b->stream_turn && (job = pick_stream(b, gated)) != NULL)
        return job;
    return NULL;
}

/* Under mu: wait on cv for at most ns. */
static void wait_ns(cpu_backend *b, uint64_t ns)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += (time_t)(ns / 1000000000u);
    ts.tv_nsec += (long)(ns % 1000000000u);
    if (ts.tv_nsec >= 1000000000L)
        ts.tv_sec++, ts.tv_nsec -= 1000000000L;
    pthread_cond_timedwait(&b->cv, &b->mu, &ts);
}

/* A ring job's status when it computes nothing (backend.h), else 0. */
static int ring_preset(cpu_backend *b, rnd_job *job)
{
    if (job->ring->status)
        return job->ring->status;
    if (b->failed)
        return RN_DEVICE_FAILING;
    int ab = job->ring->arm_key ? 0 : atomic_load(&job->ring->abandon);
    if (!atomic_load(&job->cancelled) && ab && !rnd_ring_ready(job->ring)) {
        snprintf(job->ring->msg, sizeof job->ring->msg, "bwd: %s before the slot's input was "
                 "ready; it was not run", ab == RN_DRAINING ? "the daemon shut down" :
                 "the session ended");
        return ab;
    }
    return 0;
}

/* Under mu: a ring job ended; answer it in the ring (unless it was
 * revoked: backend.h) and let its stream's next job go. */
static void stream_pop(cpu_backend *b, rnd_job *job, bool revoked)
{
    cpu_sess *cs = job->bsess;

    if (!revoked)
        rnd_ring_answer(job);
    rn_queue_remove(&job->link);
    cs->busy = false;
    if (rn_queue_empty(&cs->stream))
        rn_queue_remove(&cs->link);
    else
        pthread_cond_signal(&b->cv);
}

static void *worker(void *arg)
{
    cpu_backend *b = arg;
    rnd_job *job;

    uint64_t poll_ns = POLL_MIN_NS;
    bool gated;

    pthread_mutex_lock(&b->mu);
    for (;;) {
        if (!(job = pick(b, &gated))) {
            if (b->stop && !gated)
                break;
            if (gated && !b->polling) {
                /* The one poller: sleep a while, then look again. */
                b->polling = true;
                wait_ns(b, poll_ns);
                b->polling = false;
                poll_ns = poll_ns * 2 > POLL_MAX_NS ? POLL_MAX_NS : poll_ns * 2;
            } else {
                pthread_cond_wait(&b->cv, &b->mu);
            }
            continue;
        }
        poll_ns = POLL_MIN_NS;
        b->queued--;
        b->running++;
        /* The twin's results do not depend on its thread count, so a large
         * request may use the whole pool when nothing else is waiting. */
        int nt = 1;
        if (b->queued == 0 && b->running == 1 &&
            job->args.m * job->args.n >= (int64_t)SPLIT_ELEMS)
            nt = (int)b->nthreads;
        pthread_mutex_unlock(&b->mu);

        char msg[RNP_MAX_ERRMSG] = "";
        /* An armed job whose gate is shut (backend.h; its wait was met when
         * pick took it: ready may have moved back since, the gate decides):
         * taken back if the daemon revoked it (marked before it set its bit
         * of ready), else its client's ready went back or carried the bit;
         * nothing at all is done.
         * On a failed backend a revoked one is taken back unlooked (as the
         * cuda backend's fail_job), the others answered failing. */
        bool armed = job->ring && !job->ring->graph && job->ring->arm_key &&
                     !atomic_load(&job->cancelled);
        bool shut = armed && (b->failed ? atomic_load(&job->ring->revoked)
                                        : !rnd_ring_gate_open(job->ring));
        if (shut)
            atomic_store(&job->ring->skipped, true);
        bool revoked = shut && atomic_load(&job->ring->revoked);
        bool skip = shut || atomic_load(&job->cancelled);
        int preset = job->ring && !shut ? ring_preset(b, job) : 0;
        uintptr_t fault;
        job->start_ns = rnd_now_ns();
        int rc = skip || preset ? RNK_OK : rnk_cpu_bwd(&job->args, nt, msg, sizeof msg);
        job->end_ns = rnd_now_ns();
        job->done_slot = -1;
        job->priv = NULL;
        if (preset) {
            job->status = preset;
            snprintf(job->msg, sizeof job->msg, "%s", preset == RN_DEVICE_FAILING ?
                     "bwd: the backend failed" : job->ring->msg);
        } else if (revoked) {
            job->status = RN_RESTARTED;
            snprintf(job->msg, sizeof job->msg, "bwd: revoked; the daemon runs it again");
        } else if (shut) {
            job->status = RN_INVALID_ARGUMENT;
            snprintf(job->msg, sizeof job->msg, "%s; it was not run", RND_READY_BACK_MSG);
        } else if (skip) {
            job->status = RN_PEER_DIED;
            snprintf(job->msg, sizeof job->msg,
                     "bwd: the client exited before the request ran; skipped");
        } else if ((fault = rnd_cpu_fault_hit(&job->args)) != 0) {
            /* The loop marks the mapping lost (mark_lost). */
            job->priv = (void *)fault;
            job->status = RN_OUT_OF_BOUNDS;
            snprintf(job->msg, sizeof job->msg,
                     "bwd: a shared memory region shrank below its registered size "
                     "while the request ran; results are void");
        } else if (rc == RNK_OK) {
            job->status = RN_OK;
        } else {
            job->status = rnd_status_of_rnk(rc);
            snprintf(job->msg, sizeof job->msg, "bwd: %.190s", msg[0] ? msg : "the CPU twin failed");
        }

        pthread_mutex_lock(&b->mu);
        b->running--;
        if (job->ring && job->ring->graph)
            rnd_ring_answer(job); /* (never on a stream: PROTOCOL.md 13.8) */
        else if (job->ring)
            stream_pop(b, job, revoked);
        rn_queue_push_back(&b->finished, &job->link);
        uv_async_send(&b->async);
    }
    pthread_mutex_unlock(&b->mu);
    return NULL;
}

/* The mapping of the job's tensor that holds the faulted page is lost. */
static void mark_lost(rnd_job *job, uintptr_t page)
{
    for (int t = 0; t < RNP_T_COUNT; t++) {
        rnd_mapping *m = job->maps[t];
        if (m && rnd_cpu_fault_in(m->base, m->size, page))
            m->lost = true;
    }
}

static void fail_job(cpu_backend *b, rnd_job *job)
{
    job->status = RN_DEVICE_FAILING;
    job->done_slot = -1;
    snprintf(job->msg, sizeof job->msg, "bwd: the backend failed: %.150s", b->fail_msg);
}

static void on_async(uv_async_t *h)
{
    cpu_backend *b = h->data;
    rn_queue list, *q;
    bool idle;

    rn_queue_init(&list);
    pthread_mutex_lock(&b->mu);
    rn_queue_move(&list, &b->finished);
    if (b->failed) {
        /* Nothing waiting will run: they end with the failure.  Ring jobs
         * still go through the workers, which answer them in their rings
         * in order. */
        RN_QUEUE_FOREACH(q, &b->waiting) {
            rnd_job *job = RN_QUEUE_DATA(q, rnd_job, link);
            b->queued--;
            if (job->ring && job->ring->graph) {
                /* A graph slot's stream waits on its done word. */
                fail_job(b, job);
                rnd_ring_answer(job);
            }
        }
        rn_queue_move(&list, &b->waiting);
    }
    idle = b->queued == 0 && b->running == 0;
    pthread_mutex_unlock(&b->mu);
    while ((q = rn_queue_head(&list))) {
        rnd_job *job = RN_QUEUE_DATA(q, rnd_job, link);
        rn_queue_remove(q);
        if (job->priv)
            mark_lost(job, (uintptr_t)job->priv);
        if (b->failed)
            fail_job(b, job);
        job->done(job);
    }
    /* The fatal hook comes after every job's done event. */
    if (b->failed && idle && !b->fatal_sent) {
        b->fatal_sent = true;
        b->fatal(b->fatal_ctx, b->fail_msg);
    }
}

static void read_cpu_name(char *out, size_t len)
{
    char line[256];
    FILE *f = fopen("/proc/cpuinfo", "re");

    snprintf(out, len, "cpu");
    if (!f)
        return;
    while (fgets(line, sizeof line, f)) {
        char *colon;
        if (strncmp(line, "model name", 10) != 0 || !(colon = strchr(line, ':')))
            continue;
        colon++;
        while (*colon == ' ' || *colon == '\t')
            colon++;
        colon[strcspn(colon, "\n")] = '\0';
        snprintf(out, len, "%s", colon);
        break;
    }
    fclose(f);
}

static void cpu_fini(rnd_backend *be);

static int cpu_init(const rnd_backend_opts *o, rnd_backend **out, rnp_error *err)
{
    cpu_backend *b;
    char fmsg[160];
    rn_fault f;
    long ncpu;
    int rc;

    b = calloc(1, sizeof *b);
    if (!b)
        return rnp_fail(err, RN_NOMEM, "backend: out of memory");
    b->base.ops = &rnd_backend_cpu_ops;
    b->nthreads = o->threads;
    if (b->nthreads == 0) {
        ncpu = sysconf(_SC_NPROCESSORS_ONLN);
        b->nthreads = ncpu > 0 ? (uint32_t)ncpu : 1;
    }
    b->max_jobs = o->max_jobs ? o->max_jobs : 1024;
    b->revoked_held = o->revoked_held;
    b->fail_after = o->debug_fail_after;
    b->fatal = o->fatal;
    b->fatal_ctx = o->fatal_ctx;
    rn_queue_init(&b->waiting);
    rn_queue_init(&b->finished);
    rn_queue_init(&b->streams);
    read_cpu_name(b->cpu_name, sizeof b->cpu_name);
    RN_PT_GOTO(pthread_mutex_init(&b->mu, NULL), &f, fail_free);
    RN_PT_GOTO(pthread_cond_init(&b->cv, NULL), &f, fail_cond);
    b->threads = calloc(b->nthreads, sizeof *b->threads);
    if (!b->threads) {
        rc = rnp_fail(err, RN_NOMEM, "backend: out of memory");
        goto fail;
    }
    if (rnd_cpu_fault_init() != 0) {
        rc = rnp_fail(err, RN_SYSTEM, "backend: sigaction(SIGBUS): %s", strerror(errno));
        goto fail;
    }
    if ((rc = uv_async_init(o->loop, &b->async, on_async)) != 0) {
        rc = rnp_fail(err, RN_SYSTEM, "backend: uv_async_init: %s", uv_strerror(rc));
        goto fail;
    }
    b->async.data = b;
    for (; b->started < b->nthreads; b->started++) {
        if ((rc = pthread_create(&b->threads[b->started], NULL, worker, b)) != 0) {
            rc = rnp_fail(err, RN_SYSTEM, "backend: starting worker thread %u: %s", b->started,
                          strerror(rc));
            cpu_fini(&b->base);
            return rc;
        }
    }
    *out = &b->base;
    return 0;
fail:
    pthread_cond_destroy(&b->cv);
    pthread_mutex_destroy(&b->mu);
    free(b->threads);
    free(b);
    return rc;
fail_cond:
    pthread_mutex_destroy(&b->mu);
fail_free:
    free(b);
    return rnp_fail(err, RN_SYSTEM, "backend: %s", rn_fault_format(&f, fmsg, sizeof fmsg));
}

static void on_async_closed(uv_handle_t *h)
{
    cpu_backend *b = h->data;
    pthread_cond_destroy(&b->cv);
    pthread_mutex_destroy(&b->mu);
    free(b->threads);
    free(b);
}

static void cpu_fini(rnd_backend *be)
{
    cpu_backend *b = (cpu_backend *)be;

    if (!b)
        return;
    pthread_mutex_lock(&b->mu);
    b->stop = true;
    pthread_cond_broadcast(&b->cv);
    pthread_mutex_unlock(&b->mu);
    for (uint32_t i = 0; i < b->started; i++)
        pthread_join(b->threads[i], NULL);
    uv_close((uv_handle_t *)&b->async, on_async_closed);
}

static void cpu_info(rnd_backend *be, rnd_device_info *out)
{
    cpu_backend *b = (cpu_backend *)be;

    memset(out, 0, sizeof *out);
    snprintf(out->backend, sizeof out->backend, "cpu");
    snprintf(out->device_name, sizeof out->device_name, "%s", b->cpu_name);
    out->sm_count = b->nthreads;
    out->rings = true;
    out->done_words = true;
}

static int cpu_session_open(rnd_backend *be, void **bsess, rnp_error *err)
{
    cpu_sess *cs = calloc(1, sizeof *cs);
    if (!cs)
        return rnp_fail(err, RN_NOMEM, "hello: out of memory");
    rn_queue_init(&cs->stream);
    rn_queue_init(&cs->link);
    *bsess = cs;
    return 0;
}

/* Every job of the session has had its done event: its stream is empty. */
static void cpu_session_close(rnd_backend *be, void *bsess)
{
    free(bsess);
}

/* Map size bytes of fd shared; field names the request's fields in errors
 * ("register" or "register_fd").  Does not close fd. */
static int map_fd(int fd, uint64_t size, const char *field, rnd_mapping *out, rnp_error *err)
{
    struct stat st;
    void *base;

    if (size == 0)
        return rnp_fail(err, RN_INVALID_ARGUMENT, "%s.size: must be at least 1 byte", field);
    if (size > (uint64_t)SIZE_MAX / 2)
        return rnp_fail(err, RN_INVALID_ARGUMENT, "%s.size: %llu bytes is too large", field,
                        (unsigned long long)size);
    if (fstat(fd, &st) != 0)
        return rnp_fail(err, RN_SYSTEM, "%s: fstat: %s", field, strerror(errno));
    /* Shared memory objects and memfds are regular files; a pipe, socket or
     * device must not be mapped (nor a descriptor that cannot be). */
    if (!S_ISREG(st.st_mode))
        return rnp_fail(err, RN_INVALID_ARGUMENT, "%s: not a shared memory object", field);
    if ((uint64_t)st.st_size < size)
        return rnp_fail(err, RN_INVALID_ARGUMENT,
                        "%s.size: %llu bytes claimed, but the object has %lld", field,
                        (unsigned long long)size, (long long)st.st_size);
    base = mmap(NULL, (size_t)size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED) {
        int e = errno;
        return rnp_fail(err, e == ENOMEM ? RN_NOMEM : RN_SYSTEM, "%s: mmap of %llu bytes: %s",
                        field, (unsigned long long)size, strerror(e));
    }
    rnd_cpu_fault_track(base, size);
    out->base = base;
    out->size = size;
    out->handle = NULL;
    return 0;
}

static int cpu_region_open_fd(rnd_backend *be, void *bsess, int fd, uint64_t size,
                              rnd_mapping *out, rnp_error *err)
{
    return map_fd(fd, size, "register_fd", out, err);
}

static int cpu_region_open(rnd_backend *be, void *bsess, const rnp_register_req *req,
                           rnd_mapping *out, rnp_error *err)
{
    const char *name = req->shm_name;
    int fd, rc;
    size_t len;

    if (req->kind != RNP_REGION_SHM)
        return rnp_fail(err, RN_UNSUPPORTED,
                        "register.kind: the cpu backend maps POSIX shared memory only "
                        "(CUDA IPC needs the cuda backend)");
    len = strnlen(name, sizeof req->shm_name);
    if (len < 2 || len > NAME_MAX || name[0] != '/' || strchr(name + 1, '/'))
        return rnp_fail(err, RN_INVALID_ARGUMENT,
                        "register.shm_name: expected '/name' without further slashes");
    if (req->size == 0)
        return rnp_fail(err, RN_INVALID_ARGUMENT, "register.size: must be at least 1 byte");
    if (req->size > (uint64_t)SIZE_MAX / 2)
        return rnp_fail(err, RN_INVALID_ARGUMENT, "register.size: %llu bytes is too large",
                        (unsigned long long)req->size);

    fd = shm_open(name, O_RDWR | O_CLOEXEC | O_NOFOLLOW, 0);
    if (fd < 0) {
        int e = errno;
        if (e == ENOENT)
            return rnp_fail(err, RN_INVALID_ARGUMENT,
                            "register.shm_name: no shared memory object '%.*s'", 200 - 60, name);
        return rnp_fail(err, e == ENOMEM ? RN_NOMEM : RN_SYSTEM,
                        "register.shm_name: cannot open '%.*s': %s", 200 - 80, name, strerror(e));
    }
    rc = map_fd(fd, req->size, "register", out, err);
    close(fd);
    return rc;
}

static void cpu_region_close(rnd_backend *be, void *bsess, rnd_mapping *m)
{
    if (m && m->base) {
        rnd_cpu_fault_untrack(m->base, m->size);
        munmap(m->base, (size_t)m->size);
    }
}

/* RING_OPEN's done word: every region here is memory the client maps too;
 * rnd_ring_answer writes the word after the ring's done. */
static int cpu_device_word(rnd_backend *be, const rnd_mapping *m, uint64_t off, void **out,
                           rnp_error *err)
{
    (void)be;
    (void)err;
    *out = (uint8_t *)m->base + off;
    return 0;
}

static int cpu_events(rnd_backend *be, void *bsess, const rnp_events_req *req,
                      rnp_events_rep *out, rnp_error *err)
{
    return rnp_fail(err, RN_UNSUPPORTED,
                    "events: the cpu backend has no CUDA events (send BWD with ready_slot -1)");
}

/* The armed calls' words (backend.h): plain memory, whose latch (arm[0])
 * the workers read and write (rnd_ring_gate_open) as a kernel does the
 * cuda backend's. */
static uint64_t *cpu_arm_open(rnd_backend *be)
{
    (void)be;
    return calloc(2, sizeof(uint64_t));
}

static void cpu_arm_close(rnd_backend *be, uint64_t *words)
{
    (void)be;
    free(words);
}

static int cpu_submit(rnd_backend *be, rnd_job *job, rnp_error *err)
{
    cpu_backend *b = (cpu_backend *)be;

    if (job->ready_slot != -1)
        return rnp_fail(err, RN_NO_EVENTS,
                        "bwd.ready: the cpu backend has no events; send -1, not %d",
                        (int)job->ready_slot);
    if (b->failed)
        return rnp_fail(err, RN_DEVICE_FAILING, "bwd: the backend failed: %.150s", b->fail_msg);
    pthread_mutex_lock(&b->mu);
    if (rnd_backend_queue_full(b->queued + b->running, b->revoked_held, b->max_jobs) &&
        !(job->ring && job->ring->force)) {
        pthread_mutex_unlock(&b->mu);
        return rnp_fail(err, RN_BUSY, "bwd: the cpu backend's queue is full (%u jobs)",
                        b->max_jobs);
    }
    if (job->ring && !job->ring->graph) {
        cpu_sess *cs = job->bsess;
        if (rn_queue_empty(&cs->stream))
            rn_queue_push_back(&b->streams, &cs->link);
        rn_queue_push_back(&cs->stream, &job->link);
    } else {
        rn_queue_push_back(&b->waiting, &job->link);
    }
    b->queued++;
    if (b->fail_after && ++b->submitted == b->fail_after) {
        /* The knob: from here on the backend is failed.  The job just queued
         * and every other one not yet finished end with DEVICE_FAILING
         * (on_async, from the loop: never inside submit). */
        b->failed = true;
        snprintf(b->fail_msg, sizeof b->fail_msg,
                 "debug-fail-after: job %u failed the backend on purpose", b->fail_after);
        uv_async_send(&b->async);
        /* Ring jobs are answered by the workers, in order. */
        pthread_cond_broadcast(&b->cv);
    } else {
        pthread_cond_signal(&b->cv);
    }
    pthread_mutex_unlock(&b->mu);
    return 0;
}

static int cpu_health(rnd_backend *be, char (*reasons)[RNP_REASON_LEN], uint32_t max,
                      uint32_t *n)
{
    cpu_backend *b = (cpu_backend *)be;

    *n = 0;
    if (!b->failed)
        return RNP_HEALTH_OK;
    if (max > 0)
        snprintf(reasons[(*n)++], RNP_REASON_LEN, "cpu: %.100s", b->fail_msg);
    return RNP_HEALTH_FAILING;
}

const rnd_backend_ops rnd_backend_cpu_ops = {
    .name = "cpu",
    .init = cpu_init,
    .fini = cpu_fini,
    .info = cpu_info,
    .session_open = cpu_session_open,
    .session_close = cpu_session_close,
    .region_open = cpu_region_open,
    .region_open_fd = cpu_region_open_fd,
    .region_close = cpu_region_close,
    .device_word = cpu_device_word,
    .events = cpu_events,
    .submit = cpu_submit,
    .arm_open = cpu_arm_open,
    .arm_close = cpu_arm_close,
    .health = cpu_health,
};
