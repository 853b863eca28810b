/* SPDX-License-Identifier: MIT */
/*
 * raw.c - a plain NN_REQ socket for tests that must control the bytes on
 * the wire (see raw.h).
 */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <nanomsg/nn.h>
#include <nanomsg/reqrep.h>

#include "integration/raw.h"

int rnr_open(const char *endpoint)
{
    int s = nn_socket(AF_SP, NN_REQ), t = 10000, max = 4 * RNP_MAX_MSG;
    if (s < 0)
        return -1;
    if (nn_setsockopt(s, NN_SOL_SOCKET, NN_SNDTIMEO, &t, sizeof t) != 0 ||
        nn_setsockopt(s, NN_SOL_SOCKET, NN_RCVTIMEO, &t, sizeof t) != 0 ||
        nn_setsockopt(s, NN_SOL_SOCKET, NN_RCVMAXSIZE, &max, sizeof max) != 0 ||
        nn_connect(s, endpoint) < 0) {
        printf("raw: %s: %s\n", endpoint, nn_strerror(nn_errno()));
        nn_close(s);
        return -1;
    }
    return s;
}

void rnr_close(int sock)
{
    if (sock >= 0)
        nn_close(sock);
}

int rnr_send_bytes(int sock, const void *buf, size_t len, rnp_reply *rep)
{
    void *msg = NULL;
    rnp_error err = {0};
    int n, rv;
    if (nn_send(sock, buf, len, 0) < 0) {
        printf("raw: send: %s\n", nn_strerror(nn_errno()));
        return -1;
    }
    n = nn_recv(sock, &msg, NN_MSG, 0);
    if (n < 0) {
        printf("raw: no reply: %s\n", nn_strerror(nn_errno()));
        return -1;
    }
    rv = rnp_decode_reply(msg, (size_t)n, rep, &err);
    nn_freemsg(msg);
    if (rv != 0) {
        printf("raw: the reply does not decode: %s\n", err.msg);
        return -1;
    }
    return 0;
}

int rnr_call(int sock, const rnp_request *req, rnp_reply *rep)
{
    static uint8_t buf[RNP_MAX_MSG];
    size_t len = 0;
    rnp_error err = {0};
    if (rnp_encode_request(req, buf, sizeof buf, &len, &err) != 0) {
        printf("raw: encode: %s\n", err.msg);
        return -1;
    }
    return rnr_send_bytes(sock, buf, len, rep);
}

/* One HELLO as client `name` on sock; 0 with its reply in *r. */
static int hello(int sock, const char *name, rnp_reply *r)
{
    static rnp_request q;
    memset(&q, 0, sizeof q);
    q.version = RNP_VERSION;
    q.op = RN_OP_HELLO;
    q.id = 1;
    snprintf(q.u.hello.client_name, sizeof q.u.hello.client_name, "%s", name);
    q.u.hello.pid = (uint32_t)getpid();
    return rnr_call(sock, &q, r) == 0 && r->status == 0 ? 0 : -1;
}

int rnr_hello_paths(const char *endpoint)
{
    static rnp_reply r;
    int sock = rnr_open(endpoint), paths = -1;

    if (sock < 0)
        return -1;
    if (hello(sock, "paths", &r) == 0) {
        static rnp_request q;
        paths = (int)r.u.hello.paths;
        /* BYE: the session would otherwise count in sessions.active until
         * the daemon's auth timeout (10 s) ends it. */
        memset(&q, 0, sizeof q);
        q.version = RNP_VERSION;
        q.op = RN_OP_BYE;
        q.id = 2;
        q.u.bye = r.u.hello.session;
        (void)rnr_call(sock, &q, &r);
    }
    rnr_close(sock);
    return paths;
}

int rnr_hello(int sock, rnp_session *session)
{
    static rnp_reply r;
    if (hello(sock, "raw", &r) != 0) {
        printf("raw: HELLO failed: %d %s\n", r.status, r.error);
        return -1;
    }
    *session = r.u.hello.session;
    return 0;
}

int rnr_register(int sock, const rnp_session *s, const char *name, uint64_t size, uint32_t *region)
{
    static rnp_request q;
    static rnp_reply r;
    memset(&q, 0, sizeof q);
    q.version = RNP_VERSION;
    q.op = RN_OP_REGISTER;
    q.id = 2;
    q.u.reg.session = *s;
    q.u.reg.kind = RNP_REGION_SHM;
    q.u.reg.size = size;
    snprintf(q.u.reg.shm_name, sizeof q.u.reg.shm_name, "%s", name);
    if (rnr_call(sock, &q, &r) != 0)
        return -1;
    if (r.status == 0)
        *region = r.u.reg.region.id;
    return r.status;
}
