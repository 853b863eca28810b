/* SPDX-License-Identifier: MIT */
/*
 * rawchan.c - the session channel for tests that must control its
 * messages (see rawchan.h).
 */
#include "integration/rawchan.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

int rnr_chan_connect(const char *endpoint)
{
    struct sockaddr_un sa;
    int fd;

    memset(&sa, 0, sizeof sa);
    sa.sun_family = AF_UNIX;
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s%s", endpoint + 6, RNP_CHAN_SUFFIX);
    if ((fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0)) < 0)
        return -1;
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
        int e = errno;
        close(fd);
        errno = e;
        return -1;
    }
    return fd;
}

int rnr_chan_send(int fd, const void *m, size_t len, const int *fds, int nfds)
{
    union {
        struct cmsghdr align;
        char b[CMSG_SPACE(sizeof(int) * 8)];
    } cb;
    struct iovec iov = {(void *)m, len};
    struct msghdr mh = {0};

    mh.msg_iov = &iov;
    mh.msg_iovlen = 1;
    if (nfds > 0 && nfds <= 8) {
        struct cmsghdr *cm;
        memset(&cb, 0, sizeof cb);
        mh.msg_control = cb.b;
        mh.msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)nfds);
        cm = CMSG_FIRSTHDR(&mh);
        cm->cmsg_level = SOL_SOCKET;
        cm->cmsg_type = SCM_RIGHTS;
        cm->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)nfds);
        memcpy(CMSG_DATA(cm), fds, sizeof(int) * (size_t)nfds);
    }
    if (sendmsg(fd, &mh, MSG_NOSIGNAL) != (ssize_t)len) {
        printf("rawchan: sendmsg: %s\n", strerror(errno));
        return -1;
    }
    return 0;
}

int rnr_chan_recv(int fd, uint32_t *a, uint32_t *b, char *msg, size_t msglen)
{
    struct pollfd p = {.fd = fd, .events = POLLIN};
    uint8_t r[RNP_CHAN_MAX + 1];
    ssize_t n;

    if (msg && msglen)
        msg[0] = '\0';
    if (poll(&p, 1, 10000) != 1) {
        printf("rawchan: no reply within 10 s\n");
        return -1;
    }
    n = recv(fd, r, sizeof r, 0);
    if (n <= 0)
        return -1;
    if (n < RNP_CHAN_HDR || rnp_le32_get(r) != RNP_CHAN_MAGIC) {
        printf("rawchan: a reply of %zd bytes that is not the channel's\n", n);
        return -1;
    }
    switch (rnp_le16_get(r + 6)) {
    case RNP_CHAN_AUTH_OK:
    case RNP_CHAN_REGION_OK:
    case RNP_CHAN_VMM_CHUNK_OK:
        if (n != RNP_CHAN_HDR + 8)
            return -1;
        if (a)
            *a = rnp_le32_get(r + RNP_CHAN_HDR);
        if (b)
            *b = rnp_le32_get(r + RNP_CHAN_HDR + 4);
        return 0;
    case RNP_CHAN_ERROR:
        if (n != RNP_CHAN_ERROR_LEN)
            return -1;
        if (msg && msglen)
            snprintf(msg, msglen, "%.*s", RNP_CHAN_ERROR_MSG, (const char *)r + RNP_CHAN_HDR + 4);
        return (int)rnp_le32_get(r + RNP_CHAN_HDR);
    }
    return -1;
}

int rnr_chan_auth(int fd, const rnp_session *cap, uint32_t *pid, uint32_t *uid, char *msg,
                  size_t msglen)
{
    uint8_t m[RNP_CHAN_AUTH_LEN];

    rnp_chan_hdr(m, RNP_CHAN_AUTH);
    memcpy(m + RNP_CHAN_HDR, cap->b, RNP_SESSION_BYTES);
    if (rnr_chan_send(fd, m, sizeof m, NULL, 0) != 0)
        return -1;
    return rnr_chan_recv(fd, pid, uid, msg, msglen);
}

int rnr_chan_register(int fd, int shm, uint64_t size, uint32_t *region, char *msg,
                      size_t msglen)
{
    uint8_t m[RNP_CHAN_REGISTER_FD_LEN];

    rnp_chan_hdr(m, RNP_CHAN_REGISTER_FD);
    rnp_le64_put(m + RNP_CHAN_HDR, size);
    if (rnr_chan_send(fd, m, sizeof m, &shm, 1) != 0)
        return -1;
    return rnr_chan_recv(fd, region, NULL, msg, msglen);
}
