/* SPDX-License-Identifier: MIT */
/*
 * chan.c - the session channel's messages (PROTOCOL.md section 12): one
 * fixed-size datagram each, parsed field by field into rnp_chan_msg and
 * encoded back.  The daemon and libclient both use these; which types a
 * side accepts, and what a field's value means, is theirs to decide.
 */
#include <string.h>

#include "rn_proto.h"

/* The name a type's errors start with (the field of PROTOCOL.md's table),
 * or NULL for a type that is not the channel's. */
static const char *type_name(int t)
{
    switch (t) {
    case RNP_CHAN_AUTH: return "auth";
    case RNP_CHAN_REGISTER_FD: return "register_fd";
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
    int rc;

    memset(msg, 0, sizeof *msg);
    msg->type = RNP_CHAN_NONE;
    if ((rc = parse_header(m, len, truncated, nfds, msg, err)) != 0)
        return rc;
    if (!(name = type_name(msg->type)))
        return rnp_fail(err, RN_UNKNOWN_OP, "message.type: unknown type %u", (unsigned)msg->type);
    if (msg->type == RNP_CHAN_REGISTER_FD && nfds != 1)
        return rnp_fail(err, RN_INVALID_ARGUMENT, "%s: carries exactly one descriptor, got %u",
                        name, nfds);
    if (msg->type != RNP_CHAN_REGISTER_FD && nfds != 0)
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
