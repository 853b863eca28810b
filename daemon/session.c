/*
 * session.c - client sessions: creation on HELLO with a random capability,
 * the pid watch, regions with reference counts, and the end of a session
 * (client exit, BYE, idle timeout, drain), which releases regions and the
 * backend's state only after the session's in-flight work has completed.
 */
#include "server.h"

#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "log.h"

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif

static void session_hex(const rnd_session *s, char out[9])
{
    static const char hex[] = "0123456789abcdef";
    /* The first four bytes identify a session in logs; the rest stays secret. */
    for (int i = 0; i < 4; i++) {
        out[2 * i] = hex[s->cap.b[i] >> 4];
        out[2 * i + 1] = hex[s->cap.b[i] & 15];
    }
    out[8] = '\0';
}

/* The client is gone: nobody waits for its queued requests, so let the
 * backend skip those it has not started rather than compute for no one. */
static void client_died(rnd_session *s)
{
    s->srv->stats.clients_died++;
    for (rnd_pending *p = s->running; p; p = p->next)
        atomic_store(&p->job.cancelled, true);
    rnd_session_end(s, "client process exited");
}

static void on_pid_exit(uv_poll_t *h, int status, int events)
{
    client_died(h->data);
}

int rnd_session_create(rnd_server *srv, const rnp_hello_req *hello, rnd_session **out,
                       rnp_error *err)
{
    rnd_session *s;
    ssize_t got = 0;
    int rc;

    s = calloc(1, sizeof *s);
    if (!s)
        return rnp_fail(err, RN_NOMEM, "hello: out of memory");
    s->srv = srv;
    s->pidfd = -1;
    s->pid = hello->pid;
    snprintf(s->name, sizeof s->name, "%s", hello->client_name);
    s->next_region_id = 1;

    /* pid 0 means "do not watch me"; the idle timeout still applies. */
    if (hello->pid != 0) {
        s->pidfd = (int)syscall(SYS_pidfd_open, (pid_t)hello->pid, 0);
        if (s->pidfd < 0) {
            int e = errno;
            if (e == ESRCH || e == EINVAL) {
                rc = rnp_fail(err, RN_INVALID_ARGUMENT, "hello.pid: no process %u",
                              (unsigned)hello->pid);
                goto fail;
            }
            /* Old kernels and valgrind lack pidfd_open: the once-a-second
             * rnd_sessions_check_pids covers those sessions. */
            rnd_debug("pidfd_open(%u) failed (%s): checking the pid once a second instead",
                      (unsigned)hello->pid, strerror(e));
        }
    }
    while (got < (ssize_t)sizeof s->cap.b) {
        ssize_t n = getrandom(s->cap.b + got, sizeof s->cap.b - (size_t)got, 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            rc = rnp_fail(err, RN_SYSTEM, "hello: getrandom: %s", strerror(errno));
            goto fail;
        }
        got += n;
    }
    if (rnd_dedupe_init(&s->dedupe, srv->cfg.max_inflight * 2 > 128 ? srv->cfg.max_inflight * 2
                                                                     : 128) != 0) {
        rc = rnp_fail(err, RN_NOMEM, "hello: out of memory");
        goto fail;
    }
    if ((rc = srv->be->ops->session_open(srv->be, &s->bsess, err)) != 0)
        goto fail_dedupe;
    if (s->pidfd >= 0) {
        int urc = uv_poll_init(srv->loop, &s->pid_poll, s->pidfd);
        if (urc == 0) {
            s->pid_poll_init = true;
            s->pid_poll.data = s;
            urc = uv_poll_start(&s->pid_poll, UV_READABLE, on_pid_exit);
        }
        if (urc != 0)
            rnd_warn("Failed to poll the pidfd of client pid %u (%s): its session ends on BYE "
                     "or idle timeout only", (unsigned)hello->pid, uv_strerror(urc));
    }
    s->last_active_ns = rnd_now_ns();
    s->next = srv->sessions;
    if (srv->sessions)
        srv->sessions->prev = s;
    srv->sessions = s;
    srv->nsessions++;
    srv->stats.sessions_total++;
    {
        char hx[9];
        session_hex(s, hx);
        rnd_info("Session %s opened for '%s' (pid %u)", hx, s->name, (unsigned)s->pid);
    }
    *out = s;
    return 0;

fail_dedupe:
    rnd_dedupe_fini(&s->dedupe);
fail:
    if (s->pidfd >= 0)
        close(s->pidfd);
    free(s);
    return rc;
}

/* Capabilities are secrets: compare without an early exit. */
static bool cap_equal(const rnp_session *a, const rnp_session *b)
{
    uint8_t d = 0;
    for (size_t i = 0; i < sizeof a->b; i++)
        d |= a->b[i] ^ b->b[i];
    return d == 0;
}

rnd_session *rnd_session_find(rnd_server *srv, const rnp_session *cap)
{
    for (rnd_session *s = srv->sessions; s; s = s->next)
        if (!s->ending && cap_equal(&s->cap, cap))
            return s;
    return NULL;
}

static void region_close(rnd_region *r)
{
    rnd_session *s = r->sess;
    rnd_server *srv = s->srv;

    srv->be->ops->region_close(srv->be, s->bsess, &r->map);
    s->mapped_bytes -= r->map.size;
    srv->regions_active--;
    free(r);
}

void rnd_region_unref(rnd_region *r)
{
    if (--r->refs == 0 && r->unlinked)
        region_close(r);
}

rnd_region *rnd_region_find(rnd_session *s, uint32_t id)
{
    for (uint32_t i = 0; i < s->nregions; i++)
        if (s->regions[i]->id == id)
            return s->regions[i];
    return NULL;
}

int rnd_region_add(rnd_session *s, const rnp_register_req *req, uint32_t *id, rnp_error *err)
{
    rnd_server *srv = s->srv;
    rnd_region *r;
    int rc;

    if (s->nregions >= srv->cfg.max_regions)
        return rnp_fail(err, RN_BUSY,
                        "register: the session has %u regions, the limit (--max-regions)",
                        s->nregions);
    uint64_t cap = srv->cfg.max_mapped_gib << 30;
    if (s->mapped_bytes > cap || req->size > cap - s->mapped_bytes)
        return rnp_fail(err, RN_BUSY,
                        "register.size: %llu more bytes would pass the session's %llu GiB of "
                        "mapped regions (--max-mapped-gib)",
                        (unsigned long long)req->size, (unsigned long long)srv->cfg.max_mapped_gib);
    if (!s->regions) {
        s->regions = calloc(srv->cfg.max_regions, sizeof *s->regions);
        if (!s->regions)
            return rnp_fail(err, RN_NOMEM, "register: out of memory");
    }
    r = calloc(1, sizeof *r);
    if (!r)
        return rnp_fail(err, RN_NOMEM, "register: out of memory");
    if ((rc = srv->be->ops->region_open(srv->be, s->bsess, req, &r->map, err)) != 0) {
        free(r);
        return rc;
    }
    r->sess = s;
    do {
        r->id = s->next_region_id++;
    } while (r->id == 0 || rnd_region_find(s, r->id));
    s->regions[s->nregions++] = r;
    s->mapped_bytes += r->map.size;
    srv->regions_active++;
    *id = r->id;
    return 0;
}

static void region_unlink_at(rnd_session *s, uint32_t i)
{
    rnd_region *r = s->regions[i];
    s->regions[i] = s->regions[--s->nregions];
    r->unlinked = true;
    if (r->refs == 0)
        region_close(r);
}

int rnd_region_remove(rnd_session *s, uint32_t id, rnp_error *err)
{
    for (uint32_t i = 0; i < s->nregions; i++) {
        if (s->regions[i]->id == id) {
            region_unlink_at(s, i);
            return 0;
        }
    }
    return rnp_fail(err, RN_UNKNOWN_REGION, "unregister.region: no region %u in this session",
                    (unsigned)id);
}

void rnd_session_end(rnd_session *s, const char *why)
{
    char hx[9];

    if (s->ending)
        return;
    s->ending = true;
    if (s->pid_poll_init)
        uv_poll_stop(&s->pid_poll);
    session_hex(s, hx);
    rnd_info("Session %s of '%s' (pid %u) ends: %s%s", hx, s->name, (unsigned)s->pid, why,
             s->inflight ? "; releasing after its in-flight requests" : "");
    if (s->srv->be->ops->session_ending)
        s->srv->be->ops->session_ending(s->srv->be, s->bsess);
    /* Unlinking closes every region no request uses; the rest close as their
     * last request completes. */
    while (s->nregions)
        region_unlink_at(s, s->nregions - 1);
    rnd_session_maybe_free(s);
}

static void on_session_closed(uv_handle_t *h)
{
    rnd_session *s = h->data;
    if (s->pidfd >= 0)
        close(s->pidfd);
    free(s);
}

void rnd_session_maybe_free(rnd_session *s)
{
    rnd_server *srv = s->srv;

    if (!s->ending || s->inflight > 0)
        return;
    if (s->prev)
        s->prev->next = s->next;
    else
        srv->sessions = s->next;
    if (s->next)
        s->next->prev = s->prev;
    srv->nsessions--;
    srv->be->ops->session_close(srv->be, s->bsess);
    rnd_dedupe_fini(&s->dedupe);
    free(s->regions);
    s->regions = NULL;
    if (s->pid_poll_init) {
        s->pid_poll.data = s;
        uv_close((uv_handle_t *)&s->pid_poll, on_session_closed);
    } else {
        if (s->pidfd >= 0)
            close(s->pidfd);
        free(s);
    }
}

void rnd_sessions_expire(rnd_server *srv, uint64_t now_ns)
{
    uint64_t limit = (uint64_t)srv->cfg.idle_timeout * 1000000000ull;
    rnd_session *s, *next;
    char why[64];

    if (!limit)
        return;
    for (s = srv->sessions; s; s = next) {
        next = s->next;
        if (s->ending || s->inflight || now_ns - s->last_active_ns < limit)
            continue;
        srv->stats.sessions_expired++;
        snprintf(why, sizeof why, "idle for %u s", srv->cfg.idle_timeout);
        rnd_session_end(s, why);
    }
}

void rnd_sessions_check_pids(rnd_server *srv)
{
    rnd_session *s, *next;

    for (s = srv->sessions; s; s = next) {
        next = s->next;
        if (s->ending || s->pidfd >= 0 || s->pid == 0)
            continue;
        if (kill((pid_t)s->pid, 0) != 0 && errno == ESRCH)
            client_died(s);
    }
}
