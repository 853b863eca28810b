/* SPDX-License-Identifier: MIT */
/*
 * errors.c - the error table and the small name tables of the protocol, as
 * text.  Everything here is derived from the X-macros in rn_wire.h, so adding
 * a code there is the only edit a new error needs.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "rn_proto.h"

int rnp_fail(rnp_error *err, int code, const char *fmt, ...)
{
    if (err) {
        va_list ap;
        err->code = code;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
    }
    return code;
}

/* The error table as data, so that one lookup serves the name and the
 * message. */
static const struct errent {
    int code;
    const char *name, *msg;
} errtab[] = {
#define RNP_ERRENT_(c, name, msg) { c, #name, msg },
    RN_ERRORS(RNP_ERRENT_)
#undef RNP_ERRENT_
};

static const struct errent *find_error(int code)
{
    for (size_t i = 0; i < sizeof errtab / sizeof errtab[0]; i++)
        if (errtab[i].code == code)
            return &errtab[i];
    return NULL;
}

const char *rnp_strerror(int code)
{
    const struct errent *e = find_error(code);
    return e ? e->msg : "unknown error";
}

const char *rnp_err_name(int code)
{
    const struct errent *e = find_error(code);
    return e ? e->name : "UNKNOWN";
}

const char *rnp_op_name(int op)
{
    switch (op) {
#define RNP_OPNAME_(c, name, str) case c: return str;
        RN_OPS(RNP_OPNAME_)
#undef RNP_OPNAME_
    }
    return "unknown";
}

bool rnp_op_has_body(uint32_t op, bool request)
{
    switch (op) {
    case RN_OP_HELLO: case RN_OP_REGISTER: case RN_OP_EVENTS: case RN_OP_BWD:
    case RN_OP_RING_OPEN: case RN_OP_GRAPH_OPEN: return true;
    case RN_OP_UNREGISTER: case RN_OP_BYE: case RN_OP_RING_CLOSE: case RN_OP_GRAPH_CLOSE:
        return request;
    case RN_OP_PING: case RN_OP_HEALTH: case RN_OP_STATS: return !request;
    }
    return false;
}

const char *rnp_dtype_name(int dt)
{
    switch (dt) {
    case RN_DTYPE_NONE: return "none";
    case RN_DTYPE_F32: return "f32";
    case RN_DTYPE_F16: return "f16";
    case RN_DTYPE_BF16: return "bf16";
    }
    return "invalid";
}

size_t rnp_dtype_size(int dt)
{
    switch (dt) {
    case RN_DTYPE_F32: return 4;
    case RN_DTYPE_F16: return 2;
    case RN_DTYPE_BF16: return 2;
    }
    return 0;
}

void rnp_reply_error(rnp_reply *rep, const rnp_request *req, int code, const char *msg)
{
    if (!rep)
        return;
    /* Only the header is meaningful in an error reply; clearing the body keeps
     * an encoder from ever sending stale data. */
    memset(rep, 0, sizeof *rep);
    rep->version = RNP_VERSION;
    rep->op = req ? req->op : 0;
    rep->id = req ? req->id : 0;
    rep->status = code;
    snprintf(rep->error, sizeof rep->error, "%s", msg && *msg ? msg : rnp_strerror(code));
}
