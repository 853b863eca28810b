/*
 * transport.c - the nanomsg raw REP socket: bind with the configured mode and
 * group, poll NN_RCVFD (level-triggered) from libuv and drain it with
 * NN_DONTWAIT, and send replies with each request's own control header.
 * Knows nothing of what a message means: the receive callback decides.
 */
#include "transport.h"

#include <errno.h>
#include <grp.h>
#include <nanomsg/nn.h>
#include <nanomsg/reqrep.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ctx.h"
#include "log.h"

void rnd_reply_init(rnp_reply *rep, uint32_t op, uint64_t id)
{
    memset(rep, 0, offsetof(rnp_reply, u));
    rep->version = RNP_VERSION;
    rep->op = op;
    rep->id = id;
}

void rnd_reply(rnd_ctx *ctx, void *control, rnp_reply *rep)
{
    rnd_transport *t = &ctx->tx;
    rnp_error err = {0};
    struct nn_msghdr hdr;
    struct nn_iovec iov;
    size_t len = 0;

    if (rnp_encode_reply(rep, t->buf, sizeof t->buf, &len, &err) != 0) {
        rnd_err("Failed to encode the reply to %s id %llu: %s", rnp_op_name((int)rep->op),
                (unsigned long long)rep->id, err.msg);
        rnd_reply_init(rep, rep->op, rep->id);
        rep->status = RN_INTERNAL;
        snprintf(rep->error, sizeof rep->error, "reply could not be encoded: %.150s", err.msg);
        if (rnp_encode_reply(rep, t->buf, sizeof t->buf, &len, &err) != 0) {
            if (control)
                nn_freemsg(control);
            return;
        }
    }
    rnd_stats_reply(&ctx->stats, rep->status);
    if (rep->status != 0)
        rnd_debug("Reply %s id %llu: %s: %s", rnp_op_name((int)rep->op),
                  (unsigned long long)rep->id, rnp_err_name(rep->status), rep->error);
    if (t->sock < 0 || !control) {
        if (control)
            nn_freemsg(control);
        return;
    }
    memset(&hdr, 0, sizeof hdr);
    iov.iov_base = t->buf;
    iov.iov_len = len;
    hdr.msg_iov = &iov;
    hdr.msg_iovlen = 1;
    hdr.msg_control = &control;
    hdr.msg_controllen = NN_MSG;
    if (nn_sendmsg(t->sock, &hdr, NN_DONTWAIT) < 0) {
        /* Not nn_freemsg(control): once nn_sendmsg has taken the header into
         * its message it frees it on failure itself.  A raw REP socket drops
         * replies to vanished peers silently, so this happens only while the
         * socket closes, where a leaked header does no harm. */
        rnd_debug("Failed to send the reply to %s id %llu: %s", rnp_op_name((int)rep->op),
                  (unsigned long long)rep->id, nn_strerror(nn_errno()));
    }
}

void rnd_reply_error(rnd_ctx *ctx, void *control, uint32_t op, uint64_t id, int code,
                     const char *fmt, ...)
{
    rnp_reply rep;
    va_list ap;

    rnd_reply_init(&rep, op, id);
    rep.status = code;
    va_start(ap, fmt);
    vsnprintf(rep.error, sizeof rep.error, fmt, ap);
    va_end(ap);
    rnd_reply(ctx, control, &rep);
}

void rnd_reply_rnp_error(rnd_ctx *ctx, void *control, uint32_t op, uint64_t id,
                         const rnp_error *err)
{
    rnd_reply_error(ctx, control, op, id, err->code ? err->code : RN_INTERNAL, "%s",
                    err->msg[0] ? err->msg : rnp_strerror(err->code));
}

void rnd_transport_receive_all(rnd_ctx *ctx)
{
    rnd_transport *t = &ctx->tx;

    /* NN_RCVFD is level-triggered: drain until EAGAIN. */
    while (t->sock >= 0) {
        void *body = NULL, *control = NULL;
        struct nn_msghdr hdr;
        struct nn_iovec iov;
        int n;

        memset(&hdr, 0, sizeof hdr);
        iov.iov_base = &body;
        iov.iov_len = NN_MSG;
        hdr.msg_iov = &iov;
        hdr.msg_iovlen = 1;
        hdr.msg_control = &control;
        hdr.msg_controllen = NN_MSG;
        n = nn_recvmsg(t->sock, &hdr, NN_DONTWAIT);
        if (n < 0) {
            int e = nn_errno();
            if (e == EAGAIN)
                break;
            if (e == EINTR)
                continue;
            rnd_err("Failed to receive: %s", nn_strerror(e));
            break;
        }
        if (!control) {
            /* A raw socket always delivers the routing header; without it
             * there is nobody to reply to. */
            rnd_warn("Dropping a message without a routing header");
            nn_freemsg(body);
            continue;
        }
        t->rx(ctx, &control, body, (size_t)n, rnd_now_ns());
        if (control)
            nn_freemsg(control);
        nn_freemsg(body);
    }
}

static void on_readable(uv_poll_t *h, int status, int events)
{
    rnd_transport_receive_all(h->data);
}

int rnd_transport_open(rnd_ctx *ctx, rnd_rx_fn rx, rnp_error *err)
{
    rnd_transport *t = &ctx->tx;
    const rnd_config *cfg = &ctx->cfg;
    const char *path = rnd_config_ipc_path(cfg);
    int maxsize = (int)RND_RCV_MAX, fd, rc;
    size_t fdlen = sizeof fd;
    mode_t old_umask;
    gid_t gid = (gid_t)-1;

    t->sock = -1;
    t->rx = rx;
    snprintf(t->path, sizeof t->path, "%s", path);
    if (cfg->socket_group[0]) {
        struct group gr, *res = NULL;
        char buf[4096];
        if (getgrnam_r(cfg->socket_group, &gr, buf, sizeof buf, &res) != 0 || !res)
            return rnp_fail(err, RN_INVALID_ARGUMENT, "socket-group: no group '%s'",
                            cfg->socket_group);
        gid = res->gr_gid;
    }
    t->sock = nn_socket(AF_SP_RAW, NN_REP);
    if (t->sock < 0)
        return rnp_fail(err, RN_SYSTEM, "Failed to create the nanomsg socket: %s",
                        nn_strerror(nn_errno()));
    if (nn_setsockopt(t->sock, NN_SOL_SOCKET, NN_RCVMAXSIZE, &maxsize, sizeof maxsize) < 0) {
        rc = rnp_fail(err, RN_SYSTEM, "Failed to set NN_RCVMAXSIZE: %s", nn_strerror(nn_errno()));
        goto fail;
    }
    /* The socket file appears with no access for others until its mode and
     * group are set, so there is no window in which it is too open. */
    old_umask = umask(0177);
    rc = nn_bind(t->sock, cfg->endpoint);
    umask(old_umask);
    if (rc < 0) {
        int e = nn_errno();
        rc = rnp_fail(err, RN_ENDPOINT, "Failed to bind %s: %s%s", cfg->endpoint, nn_strerror(e),
                      e == EADDRINUSE ? " (another rmsnormd is serving it?)" : "");
        goto fail;
    }
    if (gid != (gid_t)-1 && chown(path, (uid_t)-1, gid) != 0) {
        rc = rnp_fail(err, RN_SYSTEM, "Failed to set the group of %s to %s: %s", path,
                      cfg->socket_group, strerror(errno));
        goto fail_unlink;
    }
    if (chmod(path, cfg->socket_mode) != 0) {
        rc = rnp_fail(err, RN_SYSTEM, "Failed to set the mode of %s to %04o: %s", path,
                      (unsigned)cfg->socket_mode, strerror(errno));
        goto fail_unlink;
    }
    if (nn_getsockopt(t->sock, NN_SOL_SOCKET, NN_RCVFD, &fd, &fdlen) < 0) {
        rc = rnp_fail(err, RN_SYSTEM, "Failed to get NN_RCVFD: %s", nn_strerror(nn_errno()));
        goto fail_unlink;
    }
    if ((rc = uv_poll_init(ctx->loop, &t->poll, fd)) != 0) {
        rc = rnp_fail(err, RN_SYSTEM, "Failed to poll the socket: %s", uv_strerror(rc));
        goto fail_unlink;
    }
    t->poll_init = true;
    t->poll.data = ctx;
    if ((rc = uv_poll_start(&t->poll, UV_READABLE, on_readable)) != 0) {
        rc = rnp_fail(err, RN_SYSTEM, "Failed to poll the socket: %s", uv_strerror(rc));
        goto fail_unlink;
    }
    return 0;

fail_unlink:
    unlink(path);
fail:
    nn_close(t->sock);
    t->sock = -1;
    return rc;
}

void rnd_transport_close(rnd_ctx *ctx)
{
    rnd_transport *t = &ctx->tx;

    if (t->poll_init && !uv_is_closing((uv_handle_t *)&t->poll))
        uv_close((uv_handle_t *)&t->poll, NULL);
    if (t->sock >= 0) {
        nn_close(t->sock);
        t->sock = -1;
        /* nanomsg leaves the socket file behind; a later daemon would clean
         * it up, but an orderly exit should not leave litter. */
        unlink(t->path);
    }
}
