/* SPDX-License-Identifier: MIT */
/*
 * chan.c - the session channel's messages (PROTOCOL.md section 12): one
 * fixed-size datagram each, parsed field by field into rnp_chan_msg and
 * encoded back.  The daemon and libclient both use these; which types a
 * side accepts, and what a field's value means, is theirs to decide.
 */
#include <errno.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "rn_proto.h"

/* The name a type's errors start with (the field of PROTOCOL.md's table),
 * or NULL for a type that is not the channel's. */
static const char *type_name(int t)
{
    switch (t) {
    case RNP_CHAN_AUTH: return "auth";
    case RNP_CHAN_REGISTER_FD: return "register_fd";
    case RNP_CHAN_VMM_CHUNK: return "vmm_chunk";
    case RNP_CHAN_VMM_MAP: return "vmm_map";
    case RNP_CHAN_VMM_CHUNK_OK: return "vmm_chunk_ok";
    case RNP_CHAN_AUTH_OK: return "auth_ok";
    case RNP_CHAN_REGION_OK: return "region_ok";
    case RNP_CHAN_ERROR: return "error";
    }
    return NULL;
}

size_t rnp_chan_len(int t)
{
    switch (t) {
    case RNP_CHAN_AUTH: return RNP_CHAN_AUTH_LEN;
    case RNP_CHAN_REGISTER_FD: return RNP_CHAN_REGISTER_FD_LEN;
    case RNP_CHAN_VMM_CHUNK: return RNP_CHAN_VMM_CHUNK_LEN;
    case RNP_CHAN_VMM_MAP: return RNP_CHAN_VMM_MAP_LEN;
    case RNP_CHAN_VMM_CHUNK_OK: return RNP_CHAN_VMM_CHUNK_OK_LEN;
    case RNP_CHAN_AUTH_OK: return RNP_CHAN_AUTH_OK_LEN;
    case RNP_CHAN_REGION_OK: return RNP_CHAN_REGION_OK_LEN;
    case RNP_CHAN_ERROR: return RNP_CHAN_ERROR_LEN;
    }
    return 0;
}

/* The header: everything up to and including the type. */
static int parse_header(const uint8_t *m, size_t len, bool truncated, unsigned nfds,
                        rnp_chan_msg *msg, rnp_error *err)
{
    if (truncated || len > RNP_CHAN_MAX || nfds > RNP_CHAN_MAX_FDS)
        return rnp_fail(err, RN_TOO_BIG, "message: longer than %d bytes, or more than %d "
                        "descriptors", RNP_CHAN_MAX, RNP_CHAN_MAX_FDS);
    if (len < RNP_CHAN_HDR)
        return rnp_fail(err, RN_MALFORMED, "message: %zu bytes, shorter than the header", len);
    if (rnp_le32_get(m) != RNP_CHAN_MAGIC)
        return rnp_fail(err, RN_MALFORMED, "message.magic: 0x%08x is not the channel's",
                        rnp_le32_get(m));
    if (rnp_le16_get(m + 4) != RNP_CHAN_VERSION)
        return rnp_fail(err, RN_BAD_VERSION, "message.version: %u, this daemon speaks %d",
                        rnp_le16_get(m + 4), RNP_CHAN_VERSION);
    msg->type = rnp_le16_get(m + 6);
    return 0;
}

int rnp_chan_parse(const uint8_t *m, size_t len, bool truncated, unsigned nfds,
                   rnp_chan_msg *msg, rnp_error *err)
{
    const uint8_t *b;
    const char *name;
    bool one_fd;
    int rc;

    memset(msg, 0, sizeof *msg);
    msg->type = RNP_CHAN_NONE;
    if ((rc = parse_header(m, len, truncated, nfds, msg, err)) != 0)
        return rc;
    if (!(name = type_name(msg->type)))
        return rnp_fail(err, RN_UNKNOWN_OP, "message.type: unknown type %u", (unsigned)msg->type);
    one_fd = msg->type == RNP_CHAN_REGISTER_FD || msg->type == RNP_CHAN_VMM_CHUNK;
    if (one_fd && nfds != 1)
        return rnp_fail(err, RN_INVALID_ARGUMENT, "%s: carries exactly one descriptor, got %u",
                        name, nfds);
    if (!one_fd && nfds != 0)
        return rnp_fail(err, RN_INVALID_ARGUMENT, "%s: carries no descriptors, got %u", name,
                        nfds);
    if (len != rnp_chan_len(msg->type))
        return rnp_fail(err, RN_MALFORMED, "%s: %zu bytes, expected %zu", name, len,
                        rnp_chan_len(msg->type));
    b = m + RNP_CHAN_HDR;
    switch (msg->type) {
    case RNP_CHAN_AUTH:
        memcpy(msg->u.auth.session.b, b, RNP_SESSION_BYTES);
        break;
    case RNP_CHAN_REGISTER_FD:
        msg->u.register_fd.size = rnp_le64_get(b);
        break;
    case RNP_CHAN_VMM_CHUNK:
        msg->u.vmm_chunk.offset = rnp_le64_get(b);
        msg->u.vmm_chunk.size = rnp_le64_get(b + 8);
        msg->u.vmm_chunk.index = rnp_le32_get(b + 16);
        break;
    case RNP_CHAN_VMM_MAP:
        msg->u.vmm_map.total = rnp_le64_get(b);
        msg->u.vmm_map.count = rnp_le32_get(b + 8);
        memcpy(msg->u.vmm_map.device_uuid, b + 16, RNP_UUID_BYTES);
        break;
    case RNP_CHAN_VMM_CHUNK_OK:
        msg->u.vmm_chunk_ok.index = rnp_le32_get(b);
        break;
    case RNP_CHAN_AUTH_OK:
        msg->u.auth_ok.pid = rnp_le32_get(b);
        msg->u.auth_ok.uid = rnp_le32_get(b + 4);
        break;
    case RNP_CHAN_REGION_OK:
        msg->u.region_ok.region = rnp_le32_get(b);
        break;
    case RNP_CHAN_ERROR:
        msg->u.error.code = rnp_le32_get(b);
        /* Up to the first NUL, cut at the field's last byte; zeros after. */
        memcpy(msg->u.error.msg, b + 4, strnlen((const char *)b + 4, RNP_CHAN_ERROR_MSG - 1));
        break;
    }
    return 0;
}

size_t rnp_chan_encode(const rnp_chan_msg *msg, uint8_t *buf)
{
    size_t len = rnp_chan_len(msg->type);
    uint8_t *b = buf + RNP_CHAN_HDR;

    if (!len)
        return 0;
    memset(buf, 0, len);
    rnp_chan_hdr(buf, (uint16_t)msg->type);
    switch (msg->type) {
    case RNP_CHAN_AUTH:
        memcpy(b, msg->u.auth.session.b, RNP_SESSION_BYTES);
        break;
    case RNP_CHAN_REGISTER_FD:
        rnp_le64_put(b, msg->u.register_fd.size);
        break;
    case RNP_CHAN_VMM_CHUNK:
        rnp_le64_put(b, msg->u.vmm_chunk.offset);
        rnp_le64_put(b + 8, msg->u.vmm_chunk.size);
        rnp_le32_put(b + 16, msg->u.vmm_chunk.index);
        break;
    case RNP_CHAN_VMM_MAP:
        rnp_le64_put(b, msg->u.vmm_map.total);
        rnp_le32_put(b + 8, msg->u.vmm_map.count);
        memcpy(b + 16, msg->u.vmm_map.device_uuid, RNP_UUID_BYTES);
        break;
    case RNP_CHAN_VMM_CHUNK_OK:
        rnp_le32_put(b, msg->u.vmm_chunk_ok.index);
        break;
    case RNP_CHAN_AUTH_OK:
        rnp_le32_put(b, msg->u.auth_ok.pid);
        rnp_le32_put(b + 4, msg->u.auth_ok.uid);
        break;
    case RNP_CHAN_REGION_OK:
        rnp_le32_put(b, msg->u.region_ok.region);
        break;
    case RNP_CHAN_ERROR:
        rnp_le32_put(b, msg->u.error.code);
        /* Cut to the field, which keeps its terminating NUL (buf is zeroed). */
        memcpy(b + 4, msg->u.error.msg, strnlen(msg->u.error.msg, RNP_CHAN_ERROR_MSG - 1));
        break;
    }
    return len;
}

/* ---- CUDA virtual memory ranges: the layout rules --------------------------- */

int rnp_vmm_chunk_check(uint32_t npending, uint64_t end, uint32_t index, uint64_t offset,
                        uint64_t size, rnp_error *err)
{
    if (index >= RNP_VMM_MAX_CHUNKS)
        return rnp_fail(err, RN_TOO_LARGE, "vmm_chunk.index: %u, a range has at most %u chunks",
                        index, RNP_VMM_MAX_CHUNKS);
    if (index != npending)
        return rnp_fail(err, RN_INVALID_ARGUMENT,
                        "vmm_chunk.index: %u, expected %u (chunks come in order from 0)", index,
                        npending);
    if (size == 0)
        return rnp_fail(err, RN_INVALID_ARGUMENT, "vmm_chunk.size: must be at least 1 byte");
    if (offset != end)
        return rnp_fail(err, RN_INVALID_ARGUMENT,
                        "vmm_chunk.offset: %llu, expected %llu (the end of the chunk before: "
                        "chunks tile the range without gaps)",
                        (unsigned long long)offset, (unsigned long long)end);
    if (size > RNP_VMM_MAX_RANGE || offset > RNP_VMM_MAX_RANGE - size)
        return rnp_fail(err, RN_TOO_LARGE, "vmm_chunk.size: %llu bytes at %llu pass the %llu "
                        "bytes a range may have", (unsigned long long)size,
                        (unsigned long long)offset, (unsigned long long)RNP_VMM_MAX_RANGE);
    return 0;
}

int rnp_vmm_gran_check(uint64_t offset, uint64_t size, uint64_t gran, rnp_error *err)
{
    if (gran == 0)
        return rnp_fail(err, RN_INTERNAL, "vmm_chunk: the allocation's granularity is 0");
    if (offset % gran)
        return rnp_fail(err, RN_INVALID_ARGUMENT,
                        "vmm_chunk.offset: %llu is not a multiple of the allocation's "
                        "granularity (%llu bytes)",
                        (unsigned long long)offset, (unsigned long long)gran);
    if (size % gran)
        return rnp_fail(err, RN_INVALID_ARGUMENT,
                        "vmm_chunk.size: %llu is not a multiple of the allocation's "
                        "granularity (%llu bytes)",
                        (unsigned long long)size, (unsigned long long)gran);
    return 0;
}

int rnp_vmm_map_check(uint32_t npending, uint64_t end, uint32_t count, uint64_t total,
                      rnp_error *err)
{
    if (count == 0)
        return rnp_fail(err, RN_INVALID_ARGUMENT, "vmm_map.count: a range has at least one chunk");
    if (count != npending)
        return rnp_fail(err, RN_INVALID_ARGUMENT,
                        "vmm_map.count: %u, but %u chunks were received for the range", count,
                        npending);
    if (total != end)
        return rnp_fail(err, RN_INVALID_ARGUMENT,
                        "vmm_map.total: %llu bytes, but the chunks cover %llu",
                        (unsigned long long)total, (unsigned long long)end);
    return 0;
}

void rnp_chan_attach_fd(struct msghdr *mh, void *cbuf, size_t cblen, int fd)
{
    struct cmsghdr *cm;

    if (cblen < CMSG_SPACE(sizeof(int)))
        return; /* (a caller's mistake: nothing attached, the peer says so) */
    memset(cbuf, 0, cblen);
    mh->msg_control = cbuf;
    mh->msg_controllen = CMSG_SPACE(sizeof(int));
    cm = CMSG_FIRSTHDR(mh);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(cm), &fd, sizeof fd);
}

int rnp_chan_send(int sock, const rnp_chan_msg *msg, int fd)
{
    union {
        struct cmsghdr align;
        char b[CMSG_SPACE(sizeof(int))];
    } cb;
    uint8_t out[RNP_CHAN_MAX];
    struct iovec iov = {out, rnp_chan_encode(msg, out)};
    struct msghdr mh = {0};
    ssize_t n;

    mh.msg_iov = &iov;
    mh.msg_iovlen = 1;
    if (fd >= 0)
        rnp_chan_attach_fd(&mh, cb.b, sizeof cb.b, fd);
    do
        n = sendmsg(sock, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
    while (n < 0 && errno == EINTR);
    if (n < 0)
        return errno;
    return n == (ssize_t)iov.iov_len ? 0 : EMSGSIZE;
}

unsigned rnp_chan_take_fds(struct msghdr *mh, int *fds, unsigned max)
{
    unsigned n = 0;

    for (struct cmsghdr *cm = CMSG_FIRSTHDR(mh); cm; cm = CMSG_NXTHDR(mh, cm)) {
        if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS ||
            cm->cmsg_len < CMSG_LEN(0))
            continue;
        size_t k = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < k; i++) {
            int fd;
            memcpy(&fd, CMSG_DATA(cm) + i * sizeof(int), sizeof fd);
            if (n < max)
                fds[n++] = fd;
            else
                close(fd);
        }
    }
    return n;
}
