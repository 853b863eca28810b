/* SPDX-License-Identifier: MIT */
/*
 * session.c - client sessions: creation on HELLO with a random capability,
 * the pid watch, regions with reference counts, and the end of a session
 * (client exit, BYE, idle timeout, drain), which releases regions and the
 * backend's state only after the session's in-flight work has completed.
 */
#include "session.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
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
void rnd_session_client_gone(rnd_session *s, const char *why)
{
    if (s->ending)
        return;
    s->tab->stats->clients_died++;
    s->gone = true;
    if (s->tab->cancel)
        s->tab->cancel(s);
    rnd_session_end(s, why);
}

static void client_died(rnd_session *s)
{
    rnd_session_client_gone(s, "client process exited");
}

/* A pidfd watch lives apart from its session: moving the watch to the
 * verified pid closes the old one while the session lives on, and libuv lets
 * go of a handle only in a later callback, after the session may be gone. */
struct rnd_pidwatch {
    uv_poll_t poll;
    int fd;
    rnd_session *s;                /* NULL once the session let go */
};

static void on_watch_closed(uv_handle_t *h)
{
    rnd_pidwatch *w = h->data;
    close(w->fd);
    free(w);
}

static void watch_close(rnd_session *s)
{
    rnd_pidwatch *w = s->watch;
    if (!w)
        return;
    s->watch = NULL;
    w->s = NULL;
    uv_close((uv_handle_t *)&w->poll, on_watch_closed);
}

static void on_pid_exit(uv_poll_t *h, int status, int events)
{
    rnd_pidwatch *w = h->data;
    if (w->s)
        client_died(w->s);
}

/* Watch pid for s (pid 0: nothing to watch).  Returns -1 when no process pid
 * exists; any other failure leaves s to the once-a-second check. */
static int watch_pid(rnd_session *s, uint32_t pid)
{
    rnd_pidwatch *w;
    int fd, urc;

    if (pid == 0)
        return 0;
    fd = (int)syscall(SYS_pidfd_open, (pid_t)pid, 0);
    if (fd < 0) {
        int e = errno;
        if (e == ESRCH || e == EINVAL)
            return -1;
        /* Old kernels and valgrind lack pidfd_open: the once-a-second
         * rnd_sessions_check_pids covers those sessions. */
        rnd_debug("pidfd_open(%u) failed (%s): checking the pid once a second instead",
                  (unsigned)pid, strerror(e));
        return 0;
    }
    if (!(w = calloc(1, sizeof *w))) {
        close(fd);
        return 0;
    }
    w->fd = fd;
    if ((urc = uv_poll_init(s->tab->loop, &w->poll, fd)) != 0) {
        rnd_warn("Failed to poll the pidfd of client pid %u (%s): checking it once a second",
                 (unsigned)pid, uv_strerror(urc));
        close(fd);
        free(w);
        return 0;
    }
    w->poll.data = w;
    w->s = s;
    s->watch = w;
    if ((urc = uv_poll_start(&w->poll, UV_READABLE, on_pid_exit)) != 0) {
        rnd_warn("Failed to poll the pidfd of client pid %u (%s): checking it once a second",
                 (unsigned)pid, uv_strerror(urc));
        watch_close(s);
    }
    return 0;
}

void rnd_sessions_init(rnd_sessions *tab, uv_loop_t *loop, rnd_backend *be,
                       const rnd_config *cfg, rnd_stats *stats, void (*cancel)(rnd_session *))
{
    memset(tab, 0, sizeof *tab);
    tab->loop = loop;
    tab->be = be;
    tab->cfg = cfg;
    tab->stats = stats;
    tab->cancel = cancel;
    rn_queue_init(&tab->list);
    tab->map_budget = cfg->max_mappings;
    if (!tab->map_budget) {
        unsigned long long m = 0;
        FILE *f = fopen("/proc/sys/vm/max_map_count", "re");
        if (f && fscanf(f, "%llu", &m) == 1 && m > 0) {
            uint64_t reserve = m / 8 > 1024 ? m / 8 : 1024;
            tab->map_budget = m > 2 * reserve ? m - reserve : m / 2;
        } else {
            tab->map_budget = UINT64_MAX;   /* no such limit on this host */
        }
        if (f)
            fclose(f);
    }
    tab->map_share = tab->map_budget / 4 > 0 ? tab->map_budget / 4 : 1;
}

/* The regions mapped for s's pid: for a session authenticated on the
 * channel, those of sessions with that verified pid; for one that is not,
 * of every session with its claimed pid.  A claim in HELLO never counts
 * against a verified client's share. */
static uint64_t mapped_by(const rnd_session *s)
{
    uint64_t n = 0;
    const rn_queue *q;
    RN_QUEUE_FOREACH(q, &s->tab->list) {
        const rnd_session *o = RN_QUEUE_DATA(q, rnd_session, link);
        if (o->pid == s->pid && (o->authed || !s->authed))
            n += o->nregions;
    }
    return n;
}

int rnd_session_create(rnd_sessions *tab, const rnp_hello_req *hello, rnd_session **out,
                       rnp_error *err)
{
    rnd_session *s;
    ssize_t got = 0;
    int rc;

    s = calloc(1, sizeof *s);
    if (!s)
        return rnp_fail(err, RN_NOMEM, "hello: out of memory");
    s->tab = tab;
    rn_queue_init(&s->running);
    s->pid = hello->pid;
    snprintf(s->name, sizeof s->name, "%s", hello->client_name);
    s->next_region_id = 1;

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
    if (rnd_dedupe_init(&s->dedupe, rnd_seq_window(tab->cfg)) != 0) {
        rc = rnp_fail(err, RN_NOMEM, "hello: out of memory");
        goto fail;
    }
    if ((rc = tab->be->ops->session_open(tab->be, &s->bsess, err)) != 0)
        goto fail_dedupe;
    /* pid 0 means "do not watch me"; the idle timeout still applies.  The
     * pid is a claim until the session authenticates (rnd_session_bind). */
    if (watch_pid(s, hello->pid) != 0) {
        rc = rnp_fail(err, RN_INVALID_ARGUMENT, "hello.pid: no process %u", (unsigned)hello->pid);
        goto fail_backend;
    }
    s->last_active_ns = s->created_ns = rnd_now_ns();
    rn_queue_push_front(&tab->list, &s->link);
    tab->n++;
    tab->stats->sessions_total++;
    {
        char hx[9];
        session_hex(s, hx);
        rnd_info("Session %s opened for '%s' (pid %u)", hx, s->name, (unsigned)s->pid);
    }
    *out = s;
    return 0;

fail_backend:
    tab->be->ops->session_close(tab->be, s->bsess);
fail_dedupe:
    rnd_dedupe_fini(&s->dedupe);
fail:
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

#define SESSION_OF(q) RN_QUEUE_DATA(q, rnd_session, link)

rnd_session *rnd_session_find(rnd_sessions *tab, const rnp_session *cap)
{
    rn_queue *q;
    RN_QUEUE_FOREACH(q, &tab->list) {
        rnd_session *s = SESSION_OF(q);
        if (!s->ending && cap_equal(&s->cap, cap)) {
            s->last_active_ns = rnd_now_ns();
            return s;
        }
    }
    return NULL;
}

/* Authenticated sessions of uid, ending ones excluded. */
static uint32_t sessions_of_uid(const rnd_sessions *tab, uint32_t uid)
{
    uint32_t n = 0;
    const rn_queue *q;
    RN_QUEUE_FOREACH(q, &tab->list) {
        const rnd_session *o = SESSION_OF(q);
        n += o->authed && !o->ending && o->uid == uid;
    }
    return n;
}

/* The in-flight count of uid's sessions, shared (one reference more), or
 * NULL when out of memory. */
static rnd_uid_load *uid_load_of(rnd_sessions *tab, uint32_t uid)
{
    rn_queue *q;
    RN_QUEUE_FOREACH(q, &tab->list) {
        rnd_session *o = SESSION_OF(q);
        if (o->uid_load && o->uid == uid) {
            o->uid_load->refs++;
            return o->uid_load;
        }
    }
    rnd_uid_load *l = calloc(1, sizeof *l);
    if (l)
        l->refs = 1;
    return l;
}

static void uid_load_drop(rnd_session *s)
{
    if (s->uid_load && --s->uid_load->refs == 0)
        free(s->uid_load);
    s->uid_load = NULL;
}

int rnd_session_bind(rnd_session *s, uint32_t pid, uint32_t uid, void *chan, rnp_error *err)
{
    rnd_sessions *tab = s->tab;
    char hx[9];

    if (s->authed || s->chan)
        return rnp_fail(err, RN_INVALID_ARGUMENT,
                        "auth.session: already authenticated on another connection");
    /* The daemon's own user and root could stop the daemon anyway; the
     * quotas (sessions here, requests in flight: uid_load) keep other
     * users from taking all of them. */
    bool quota = uid != 0 && uid != (uint32_t)geteuid();
    if (quota) {
        uint32_t n = sessions_of_uid(tab, uid);
        if (n >= tab->cfg->max_sessions_per_uid)
            return rnp_fail(err, RN_BUSY,
                            "auth: uid %u has %u sessions, its limit (--max-sessions-per-uid)",
                            (unsigned)uid, (unsigned)n);
    }
    session_hex(s, hx);
    if (pid != s->pid || !s->watch) {
        if (pid != s->pid)
            rnd_info("Session %s of '%s': HELLO claimed pid %u, the channel's peer is pid %u; "
                     "the verified pid counts", hx, s->name, (unsigned)s->pid, (unsigned)pid);
        watch_close(s);
        s->pid = pid;
        /* The peer may have exited since the kernel recorded it: then the
         * once-a-second check ends the session. */
        (void)watch_pid(s, pid);
    }
    if (quota && !(s->uid_load = uid_load_of(tab, uid)))
        return rnp_fail(err, RN_NOMEM, "auth: out of memory");
    s->uid = uid;
    s->authed = true;
    s->chan = chan;
    rnd_debug("Session %s authenticated: pid %u, uid %u", hx, (unsigned)pid, (unsigned)uid);
    return 0;
}

static void region_close(rnd_region *r)
{
    rnd_session *s = r->sess;
    rnd_sessions *tab = s->tab;

    tab->be->ops->region_close(tab->be, s->bsess, &r->map);
    s->mapped_bytes -= r->map.size;
    tab->regions_active--;
    free(r);
}

void rnd_region_unref(rnd_region *r)
{
    if (--r->refs == 0 && r->unlinked)
        region_close(r);
}

/* Where a region's memory comes from: req (REGISTER over nanomsg), the
 * descriptor fd (REGISTER_FD), or imported CUDA VMM chunks (VMM_MAP). */
typedef struct region_src {
    const rnp_register_req *req;
    int fd;
    void **chunks;
    uint32_t nchunks;
    const uint8_t *uuid;
} region_src;

/* The limits, then the backend's mapping of src. */
static int region_add(rnd_session *s, const region_src *src, uint64_t size, uint32_t *id,
                      rnp_error *err)
{
    const rnd_config *cfg = s->tab->cfg;
    rnd_backend *be = s->tab->be;
    rnd_region *r;
    int rc;

    if (s->nregions >= cfg->max_regions)
        return rnp_fail(err, RN_BUSY,
                        "register: the session has %u regions, the limit (--max-regions)",
                        s->nregions);
    /* Every region is a mapping of the daemon, and the kernel allows only
     * vm.max_map_count of those: no client may take them all, nor all of
     * them together the daemon's own. */
    if (s->tab->regions_active >= s->tab->map_budget)
        return rnp_fail(err, RN_BUSY,
                        "register: %llu regions are mapped, all the daemon allows "
                        "(--max-mappings, from vm.max_map_count)",
                        (unsigned long long)s->tab->regions_active);
    uint64_t mine = s->pid ? mapped_by(s) : s->nregions;
    if (mine >= s->tab->map_share)
        return rnp_fail(err, RN_BUSY,
                        "register: client pid %u has %llu regions mapped, its share (a quarter "
                        "of the %llu the daemon allows: --max-mappings)",
                        (unsigned)s->pid, (unsigned long long)mine,
                        (unsigned long long)s->tab->map_budget);
    uint64_t cap = cfg->max_mapped_gib << 30;
    /* Larger than the whole budget: no UNREGISTER could make room, so not
     * BUSY ("retry later"). */
    if (size > cap)
        return rnp_fail(err, RN_TOO_LARGE,
                        "register.size: %llu bytes exceed the %llu GiB one session may map "
                        "(--max-mapped-gib)",
                        (unsigned long long)size, (unsigned long long)cfg->max_mapped_gib);
    if (s->mapped_bytes > cap || size > cap - s->mapped_bytes)
        return rnp_fail(err, RN_BUSY,
                        "register.size: %llu more bytes would pass the session's %llu GiB of "
                        "mapped regions (--max-mapped-gib)",
                        (unsigned long long)size, (unsigned long long)cfg->max_mapped_gib);
    if (!s->regions) {
        s->regions = calloc(cfg->max_regions, sizeof *s->regions);
        if (!s->regions)
            return rnp_fail(err, RN_NOMEM, "register: out of memory");
    }
    r = calloc(1, sizeof *r);
    if (!r)
        return rnp_fail(err, RN_NOMEM, "register: out of memory");
    if (s->tab->before_map)
        s->tab->before_map(s);
    if (src->req)
        rc = be->ops->region_open(be, s->bsess, src->req, &r->map, err);
    else if (src->chunks)
        rc = be->ops->region_open_vmm(be, s->bsess, src->chunks, src->nchunks, size, src->uuid,
                                      &r->map, err);
    else
        rc = be->ops->region_open_fd(be, s->bsess, src->fd, size, &r->map, err);
    if (rc != 0) {
        free(r);
        return rc;
    }
    r->sess = s;
    do {
        r->id = s->next_region_id++;
    } while (r->id == 0 || rnd_region_find(s, r->id));
    s->regions[s->nregions++] = r;
    s->mapped_bytes += r->map.size;
    s->tab->regions_active++;
    *id = r->id;
    return 0;
}

int rnd_region_add(rnd_session *s, const rnp_register_req *req, uint32_t *id, rnp_error *err)
{
    region_src src = {.req = req, .fd = -1};
    return region_add(s, &src, req->size, id, err);
}

int rnd_region_add_fd(rnd_session *s, int fd, uint64_t size, uint32_t *id, rnp_error *err)
{
    region_src src = {.fd = fd};
    return region_add(s, &src, size, id, err);
}

int rnd_region_add_vmm(rnd_session *s, void **chunks, uint32_t n, uint64_t total,
                       const uint8_t uuid[RNP_UUID_BYTES], uint32_t *id, rnp_error *err)
{
    rnd_backend *be = s->tab->be;
    region_src src = {.fd = -1, .chunks = chunks, .nchunks = n, .uuid = uuid};
    int rc;

    if (!be->ops->region_open_vmm) {
        for (uint32_t i = 0; i < n; i++)
            be->ops->vmm_drop(be, chunks[i]);
        return rnp_fail(err, RN_UNSUPPORTED, "vmm_map: the %s backend maps no CUDA memory",
                        be->ops->name);
    }
    rc = region_add(s, &src, total, id, err);
    /* region_open_vmm took the chunks (and cleared them), whatever it
     * answered; a limit that refused the region before leaves them here. */
    for (uint32_t i = 0; rc != 0 && i < n; i++)
        if (chunks[i]) {
            be->ops->vmm_drop(be, chunks[i]);
            chunks[i] = NULL;
        }
    return rc;
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
    s->in_end = true;
    watch_close(s);
    if (s->chan && s->tab->unbind)
        s->tab->unbind(s);
    s->chan = NULL;
    session_hex(s, hx);
    rnd_info("Session %s of '%s' (pid %u) ends: %s%s", hx, s->name, (unsigned)s->pid, why,
             rn_queue_empty(&s->running) ? "" : "; releasing after its in-flight requests");
    /* The ring first: it may still take the slots published so far. */
    if (s->tab->ring_end)
        s->tab->ring_end(s);
    if (s->tab->be->ops->session_ending)
        s->tab->be->ops->session_ending(s->tab->be, s->bsess);
    /* Unlinking closes every region no request uses; the rest close as their
     * last request completes. */
    while (s->nregions)
        region_unlink_at(s, s->nregions - 1);
    s->in_end = false;
    rnd_session_maybe_free(s);
}

void rnd_session_maybe_free(rnd_session *s)
{
    rnd_sessions *tab = s->tab;

    if (!s->ending || s->in_end || !rn_queue_empty(&s->running))
        return;
    rn_queue_remove(&s->link);
    tab->n--;
    tab->be->ops->session_close(tab->be, s->bsess);
    rnd_dedupe_fini(&s->dedupe);
    uid_load_drop(s);
    free(s->regions);
    s->regions = NULL;
    free(s);
}

/* Ending a session may free it (nothing running), so every walk that ends
 * sessions holds the next node first. */
void rnd_sessions_expire(rnd_sessions *tab, uint64_t now_ns)
{
    uint64_t limit = (uint64_t)tab->cfg->idle_timeout * 1000000000ull;
    rn_queue *q, *n;
    char why[64];

    if (!limit)
        return;
    RN_QUEUE_FOREACH_SAFE(q, n, &tab->list) {
        rnd_session *s = SESSION_OF(q);
        if (s->ending || !rn_queue_empty(&s->running) || now_ns - s->last_active_ns < limit)
            continue;
        /* A call left in its ring for its inputs (--ring-ready=host) keeps
         * the session, as a request on the GPU does. */
        if (tab->ring_pending && tab->ring_pending(s))
            continue;
        tab->stats->sessions_expired++;
        snprintf(why, sizeof why, "idle for %u s", tab->cfg->idle_timeout);
        rnd_session_end(s, why);
    }
}

void rnd_sessions_check_pids(rnd_sessions *tab)
{
    rn_queue *q, *n;

    RN_QUEUE_FOREACH_SAFE(q, n, &tab->list) {
        rnd_session *s = SESSION_OF(q);
        if (s->ending || s->watch || s->pid == 0)
            continue;
        if (kill((pid_t)s->pid, 0) != 0 && errno == ESRCH)
            client_died(s);
    }
}

void rnd_sessions_end_all(rnd_sessions *tab, const char *why)
{
    rn_queue *q, *n;

    RN_QUEUE_FOREACH_SAFE(q, n, &tab->list)
        rnd_session_end(SESSION_OF(q), why);
}

void rnd_sessions_expire_unauthenticated(rnd_sessions *tab, uint64_t now_ns)
{
    uint64_t limit = (uint64_t)tab->cfg->auth_timeout * 1000000000ull;
    rn_queue *q, *n;
    char why[96];

    if (!limit)
        return;
    RN_QUEUE_FOREACH_SAFE(q, n, &tab->list) {
        rnd_session *s = SESSION_OF(q);
        if (s->ending || s->authed || now_ns - s->created_ns < limit)
            continue;
        tab->stats->sessions_unauth_ended++;
        snprintf(why, sizeof why, "not authenticated on the session channel within %u s",
                 tab->cfg->auth_timeout);
        rnd_session_end(s, why);
    }
}

bool rnd_sessions_evict_unauthenticated(rnd_sessions *tab, uint64_t now_ns)
{
    rnd_session *oldest = NULL;
    rn_queue *q;

    RN_QUEUE_FOREACH(q, &tab->list) {
        rnd_session *s = SESSION_OF(q);
        if (s->ending || s->authed || now_ns - s->created_ns < RND_AUTH_GRACE_NS)
            continue;
        /* Only one whose end frees its place at once: a session with work
         * in flight (or calls in its ring) stays counted until that ends,
         * and the newcomer was refused all the same (review). */
        if (!rn_queue_empty(&s->running) || (tab->ring_pending && tab->ring_pending(s)))
            continue;
        if (!oldest || s->created_ns < oldest->created_ns)
            oldest = s;
    }
    if (!oldest)
        return false;
    tab->stats->sessions_unauth_ended++;
    rnd_session_end(oldest, "not authenticated, and a new client needs its place");
    return true;
}

uint32_t rnd_sessions_unauthenticated(const rnd_sessions *tab)
{
    uint32_t n = 0;
    const rn_queue *q;
    RN_QUEUE_FOREACH(q, &tab->list) {
        const rnd_session *s = SESSION_OF(q);
        n += !s->ending && !s->authed;
    }
    return n;
}

uint64_t rnd_sessions_oldest(const rnd_sessions *tab)
{
    uint64_t oldest = 0;
    const rn_queue *q;

    /* Each running queue is in order of receipt: its first entry that is
     * not a ring slot's is its oldest. */
    RN_QUEUE_FOREACH(q, &tab->list) {
        const rn_queue *h;
        RN_QUEUE_FOREACH(h, &SESSION_OF(q)->running) {
            const rnd_running *u = RN_QUEUE_DATA(h, rnd_running, link);
            if (u->ring)
                continue;
            if (!oldest || u->recv_ns < oldest)
                oldest = u->recv_ns;
            break;
        }
    }
    return oldest;
}
