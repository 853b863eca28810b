/* SPDX-License-Identifier: MIT */
/*
 * client.c - libclient's public face: rn_connect and rn_close, the
 * observation calls (ping, health, stats, server info) and the small helpers
 * (version, error text, default endpoint).  It builds on conn.c and
 * session.c and calls nothing that calls back into it.
 */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "client_int.h"
#include "ring_int.h"
#include "rn_check.h"

/* The public structs mirror proto's limits; a change there must show here. */
_Static_assert(RN_NAME_LEN == RNP_MAX_NAME, "name length");
_Static_assert(RN_UUID_LEN == RNP_UUID_BYTES, "uuid length");
_Static_assert(RN_MAX_REASONS == RNP_MAX_REASONS, "reasons");
_Static_assert(RN_REASON_LEN == RNP_REASON_LEN, "reason length");
_Static_assert(RN_MAX_STATS == RNP_MAX_STATS, "stats");
_Static_assert(RN_MAX_HISTS == RNP_MAX_HISTS, "hists");
_Static_assert(RN_MAX_BUCKETS == RNP_MAX_BUCKETS, "buckets");
_Static_assert(RN_STAT_NAME_LEN == RNP_STAT_NAME, "stat name");
_Static_assert(RN_ERRMSG_LEN >= RNP_MAX_ERRMSG, "error message");

#ifndef RN_VERSION
#define RN_VERSION "0.0.0"
#endif

/* proto/ makes the error text from the one table; libclient only passes it on. */
const char *rn_strerror(int code)
{
    return rnp_strerror(code);
}

const char *rn_err_name(int code)
{
    return rnp_err_name(code);
}

const char *rn_version(void)
{
    return RN_VERSION;
}

const char *rn_default_endpoint(char *buf, size_t len)
{
    const char *env = getenv("RMSNORMD_ENDPOINT");
    rnp_error err;
    int w;

    if (buf == NULL || len == 0)
        return NULL;
    if (env && *env) {
        w = snprintf(buf, len, "%s", env);
        return w < 0 || (size_t)w >= len ? NULL : buf;
    }
    /* The daemon's own default, from the same code. */
    return rnp_default_endpoint(buf, len, &err) == 0 ? buf : NULL;
}

/* ---- connect, close ------------------------------------------------------------------ */

/* A deeper ring lets a caller run further ahead of the GPU before a call
 * waits on the host for the oldest one (CUDA's own launch queue holds
 * about a thousand); the daemon takes at most its max_inflight of them at
 * a time whatever the depth. */
static int ring_slots_env(uint32_t *slots)
{
    const char *e = getenv("RMSNORMD_RING_SLOTS");
    *slots = RING_SLOTS_DEFAULT;
    if (!e || !*e)
        return 0;
    char *end;
    unsigned long v = strtoul(e, &end, 10);
    if (*end || e[0] < '0' || e[0] > '9' || !v || v > RNP_RING_MAX_SLOTS || (v & (v - 1)))
        return rnc_fail(NULL, RN_INVALID_ARGUMENT,
                        "RMSNORMD_RING_SLOTS: '%.40s' is not a power of two from 1 to %u", e,
                        RNP_RING_MAX_SLOTS);
    *slots = (uint32_t)v;
    return 0;
}

int rn_connect(const rn_connect_opts *opts, rn_client **out)
{
    rn_connect_opts o = {0};
    char epbuf[256];
    rn_client *c = NULL;
    rn_fault f;
    uint64_t t0;
    int rv, left = -1;

    rnc_clear_thread_error();
    if (out == NULL)
        return rnc_fail(NULL, RN_INVALID_ARGUMENT, "out: must not be NULL");
    if (opts) {
        /* 0.1's layout ends before path (ABI rules in the header). */
        size_t n = opts->struct_size ? opts->struct_size : offsetof(rn_connect_opts, path);
        memcpy(&o, opts, n < sizeof o ? n : sizeof o);
    }
    if (o.path == RN_PATH_DEFAULT) {
        const char *p = getenv("RMSNORMD_PATH");
        if (!p || !*p || strcmp(p, "auto") == 0)
            o.path = RN_PATH_AUTO;
        else if (strcmp(p, "classic") == 0)
            o.path = RN_PATH_CLASSIC;
        else if (strcmp(p, "fast") == 0)
            o.path = RN_PATH_FAST;
        else
            return rnc_fail(NULL, RN_INVALID_ARGUMENT,
                            "RMSNORMD_PATH: '%.40s' is not a path (classic, fast, auto)", p);
    }
    /* Where a fast-path call's stream waits for done (ring_cuda.c). */
    const char *dwenv = getenv("RMSNORMD_DONE_WORD");
    if (dwenv && *dwenv && strcmp(dwenv, "device") != 0 && strcmp(dwenv, "host") != 0)
        return rnc_fail(NULL, RN_INVALID_ARGUMENT,
                        "RMSNORMD_DONE_WORD: '%.40s' is not a place (device, host)", dwenv);
    uint32_t ring_slots;
    rv = ring_slots_env(&ring_slots);
    if (rv != 0)
        return rv;
    if (o.path != RN_PATH_CLASSIC && o.path != RN_PATH_FAST && o.path != RN_PATH_AUTO)
        return rnc_fail(NULL, RN_INVALID_ARGUMENT, "path: %d is not a path (RN_PATH_*)", o.path);
    if (o.timeout_ms < -1)
        return rnc_fail(NULL, RN_INVALID_ARGUMENT, "timeout_ms: %d is negative (-1 means forever)",
                        o.timeout_ms);
    if (o.endpoint == NULL) {
        if (rn_default_endpoint(epbuf, sizeof epbuf) == NULL)
            return rnc_fail(NULL, RN_ENDPOINT, "endpoint: the default endpoint is too long");
        o.endpoint = epbuf;
    }
    if (strlen(o.endpoint) >= sizeof c->endpoint)
        return rnc_fail(NULL, RN_ENDPOINT, "endpoint: longer than %zu bytes",
                        sizeof c->endpoint - 1);

    c = calloc(1, sizeof *c);
    if (c == NULL)
        return rnc_fail(NULL, RN_NOMEM, "out of memory for the client");
    c->owner = getpid();
    c->sock = -1;
    RN_PT_GOTO(pthread_mutex_init(&c->mu, NULL), &f, no_mutex);
    snprintf(c->endpoint, sizeof c->endpoint, "%s", o.endpoint);
    c->timeout_ms = o.timeout_ms == 0 ? RN_DEFAULT_TIMEOUT_MS : o.timeout_ms;
    c->path = o.path;
    /* RMSNORMD_WATCH=0: no watcher thread (watch.c), for debugging. */
    const char *wenv = getenv("RMSNORMD_WATCH");
    c->watch_off = wenv && strcmp(wenv, "0") == 0;
    /* RMSNORMD_BELL=0: ring the doorbell's futex, not the session's bell. */
    const char *benv = getenv("RMSNORMD_BELL");
    c->bell_off = benv && strcmp(benv, "0") == 0;
    c->done_host = dwenv && strcmp(dwenv, "host") == 0;
    c->ring_slots = ring_slots;
    if (o.client_name && *o.client_name)
        snprintf(c->name, sizeof c->name, "%s", o.client_name);
    else
        snprintf(c->name, sizeof c->name, "pid %ld", (long)getpid());

    /* One timeout for the whole call: the connect and the PING share it. */
    t0 = rnc_now_ns();
    if ((rv = rnc_conn_open(c, c->timeout_ms)) != 0)
        goto fail;
    rnc_sweep_stale();
    /*
     * A PING, not a HELLO: it shows that the daemon answers, and it needs no
     * session, so that rmsnormctl health, stats and ping work at the
     * daemon's session limit and take no session from a worker.  The first
     * call that needs a session opens it.  A daemon that accepts the
     * connection but never answers is as good as none.
     */
    if (c->timeout_ms >= 0) {
        uint64_t spent = (rnc_now_ns() - t0) / 1000000u;
        left = spent >= (uint64_t)c->timeout_ms ? 1 : c->timeout_ms - (int)spent;
    }
    rnc_request(c, RN_OP_PING);
    if ((rv = rnc_transact(c, left)) != 0)
        goto fail;
    *out = c;
    return 0;
fail:
    if (rv == RN_TIMEOUT)
        rv = RN_UNREACHABLE;
    rnc_fail(NULL, rv, "%s", c->last_error);
    rnc_conn_close(c);
    pthread_mutex_destroy(&c->mu);
    free(c);
    return rv;
no_mutex:
    free(c);
    return rnc_fail(NULL, RN_SYSTEM, "pthread_mutex_init: %s", strerror(f.err));
}

/* rn_close in a fork child, of the parent's copy: the child's own copies of
 * descriptors and mappings go, and nothing else.  No BYE (it would end the
 * parent's session), no ring words (shared with the parent), no CUDA, no
 * nanomsg (its threads are not in the child: nn_close would wait for
 * good), no mutex (another thread may have held it at the fork), no unlink
 * of the parent's buffers. */
static void close_copy(rn_client *c)
{
    rnc_watch_stop(c); /* (a child's: closes the copies only) */
    if (c->have_chan)
        close(c->chan);
    if (c->have_bell)
        close(c->bell);
    rnc_ring_forget(c);
    for (size_t i = 0; i < c->nbufs; i++) {
        if (c->bufs[i].base)
            munmap(c->bufs[i].base, c->bufs[i].size);
        if (c->bufs[i].fd >= 0)
            close(c->bufs[i].fd);
    }
    free(c->bufs);
    free(c);
}

void rn_close(rn_client *c)
{
    if (c == NULL)
        return;
    if (c->owner != getpid()) {
        close_copy(c);
        return;
    }
    rnc_cuda_release(c);
    pthread_mutex_lock(&c->mu);
    /* First: the BYE's close of the channel is not the daemon going, and
     * the ring's memory goes below. */
    bool ended = rnc_watch_stop(c), answered = true, refused = !c->have_session;
    /* A session the watcher saw end needs no BYE (a dead daemon would make
     * it wait BYE_TIMEOUT_MS). */
    if (c->have_session && !ended) {
        answered = rnc_end_session(c) == 0;
        refused = answered && c->rep.status != 0;
    }
    /* A BYE refused (a restarted daemon knows no such session), or none to
     * send: nobody may be left to answer the ring's calls, and their
     * streams waited on done for good (found in review). */
    if (refused && !ended)
        rnc_ring_orphan(c);
    rnc_chan_close(c);
    rnc_ring_release(c, answered);
    for (size_t i = 0; i < c->nbufs; i++)
        rnc_buf_release(&c->bufs[i]);
    free(c->bufs);
    rnc_conn_close(c);
    pthread_mutex_unlock(&c->mu);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

/* ---- observation ----------------------------------------------------------------------- */

/*
 * The observation calls share their frame: c's mutex, an output that must
 * not be NULL (named by field; out NULL with field NULL is fine), and a
 * request with no body.  *sent_ns (may be NULL) gets the time the exchange
 * began.  Returns with c->rep filled on success; the caller unlocks.
 */
static int ask(rn_client *c, uint32_t op, const void *out, const char *field, uint64_t *sent_ns)
{
    pthread_mutex_lock(&c->mu);
    if (out == NULL && field != NULL)
        return rnc_fail(c, RN_INVALID_ARGUMENT, "%s: must not be NULL", field);
    rnc_request(c, op);
    if (sent_ns)
        *sent_ns = rnc_now_ns();
    return rnc_transact(c, c->timeout_ms);
}

int rn_ping(rn_client *c, uint64_t *rtt_ns)
{
    uint64_t t0 = 0;
    int rv;
    if (c == NULL)
        return RN_INVALID_ARGUMENT;
    rv = ask(c, RN_OP_PING, rtt_ns, NULL, &t0);
    if (rv == 0 && rtt_ns)
        *rtt_ns = rnc_now_ns() - t0;
    pthread_mutex_unlock(&c->mu);
    return rv;
}

int rn_health(rn_client *c, rn_health_info *h)
{
    int rv;
    if (c == NULL)
        return RN_INVALID_ARGUMENT;
    if ((rv = ask(c, RN_OP_HEALTH, h, "h", NULL)) == 0) {
        const rnp_health_rep *r = &c->rep.u.health;
        rn_health_info hi;
        memset(&hi, 0, sizeof hi);
        hi.struct_size = sizeof hi;
        hi.state = (int)r->state;
        hi.mps = r->mps;
        snprintf(hi.backend, sizeof hi.backend, "%s", r->backend);
        hi.nreasons = r->nreasons <= RN_MAX_REASONS ? r->nreasons : RN_MAX_REASONS;
        for (unsigned i = 0; i < hi.nreasons; i++)
            snprintf(hi.reasons[i], sizeof hi.reasons[i], "%s", r->reasons[i]);
        *h = hi;
    }
    pthread_mutex_unlock(&c->mu);
    return rv;
}

/* Copy a STATS reply into the caller's structs (the client's lock held). */
static void stats_copy(const rnp_stats_rep *r, rn_stats_info *s, rn_hist_buckets *b, unsigned nb)
{
    memset(s, 0, sizeof *s);
    s->struct_size = sizeof *s;
    snprintf(s->backend, sizeof s->backend, "%s", r->backend);
    snprintf(s->device, sizeof s->device, "%s", r->device);
    s->nstats = r->nstats <= RN_MAX_STATS ? r->nstats : RN_MAX_STATS;
    for (unsigned i = 0; i < s->nstats; i++) {
        snprintf(s->stats[i].name, sizeof s->stats[i].name, "%s", r->stats[i].name);
        s->stats[i].value = r->stats[i].value;
    }
    s->nhists = r->nhists <= RN_MAX_HISTS ? r->nhists : RN_MAX_HISTS;
    for (unsigned i = 0; i < s->nhists; i++) {
        const rnp_hist *hp = &r->hists[i];
        snprintf(s->hists[i].name, sizeof s->hists[i].name, "%s", hp->name);
        s->hists[i].count = hp->count;
        s->hists[i].p50 = hp->p50;
        s->hists[i].p90 = hp->p90;
        s->hists[i].p99 = hp->p99;
        s->hists[i].max = hp->max;
    }
    for (unsigned i = 0; i < nb; i++) {
        rn_hist_buckets *o = &b[i];
        memset(o, 0, sizeof *o);
        o->struct_size = sizeof *o;
        if (i >= s->nhists)
            continue;
        const rnp_hist *hp = &r->hists[i];
        snprintf(o->name, sizeof o->name, "%s", hp->name);
        o->count = hp->count;
        if (!hp->has_buckets)
            continue;
        o->present = 1;
        o->sum_ns = hp->sum;
        o->nbuckets = hp->nbuckets <= RN_MAX_BUCKETS ? hp->nbuckets : RN_MAX_BUCKETS;
        for (unsigned k = 0; k < o->nbuckets; k++) {
            o->buckets[k].le_ns = hp->buckets[k].upper;
            o->buckets[k].count = hp->buckets[k].count;
        }
    }
}

int rn_stats(rn_client *c, rn_stats_info *s)
{
    return rn_stats_hist_buckets(c, s, NULL, 0);
}

int rn_stats_hist_buckets(rn_client *c, rn_stats_info *s, rn_hist_buckets *b, unsigned nb)
{
    int rv;
    if (c == NULL)
        return RN_INVALID_ARGUMENT;
    if (b == NULL && nb > 0) {
        pthread_mutex_lock(&c->mu);
        rv = rnc_fail(c, RN_INVALID_ARGUMENT, "b: must not be NULL when nb is %u", nb);
        pthread_mutex_unlock(&c->mu);
        return rv;
    }
    if ((rv = ask(c, RN_OP_STATS, s, "s", NULL)) == 0)
        stats_copy(&c->rep.u.stats, s, b, nb);
    pthread_mutex_unlock(&c->mu);
    return rv;
}

uint64_t rn_stats_get(const rn_stats_info *s, const char *name, uint64_t dflt)
{
    if (s == NULL || name == NULL)
        return dflt;
    for (unsigned i = 0; i < s->nstats && i < RN_MAX_STATS; i++)
        if (strcmp(s->stats[i].name, name) == 0)
            return s->stats[i].value;
    return dflt;
}

int rn_server_info(rn_client *c, struct rn_server_info *i)
{
    int rv;
    if (c == NULL)
        return RN_INVALID_ARGUMENT;
    pthread_mutex_lock(&c->mu);
    if (i == NULL)
        rv = rnc_fail(c, RN_INVALID_ARGUMENT, "i: must not be NULL");
    else /* After a daemon restart, describe the daemon that runs now. */
        rv = rnc_ensure_session(c);
    if (rv == 0) {
        const rnp_hello_rep *h = &c->hello;
        struct rn_server_info si;
        memset(&si, 0, sizeof si);
        si.struct_size = sizeof si;
        snprintf(si.endpoint, sizeof si.endpoint, "%s", c->endpoint);
        snprintf(si.daemon_version, sizeof si.daemon_version, "%s", h->daemon_version);
        snprintf(si.backend, sizeof si.backend, "%s", h->backend);
        snprintf(si.device_name, sizeof si.device_name, "%s", h->device_name);
        memcpy(si.device_uuid, h->device_uuid, sizeof si.device_uuid);
        si.sm_count = h->sm_count;
        si.cc_major = h->cc_major;
        si.cc_minor = h->cc_minor;
        si.mps = h->mps;
        si.protocol_version = RNP_VERSION;
        si.max_sessions = h->limits.max_sessions;
        si.max_regions = h->limits.max_regions;
        si.max_inflight = h->limits.max_inflight;
        si.max_inflight_total = h->limits.max_inflight_total;
        si.max_m = h->limits.max_m;
        si.max_n = h->limits.max_n;
        si.max_msg = h->limits.max_msg;
        si.event_slots = h->limits.event_slots;
        *i = si;
    }
    pthread_mutex_unlock(&c->mu);
    return rv;
}
