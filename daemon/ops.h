/* SPDX-License-Identifier: MIT */
/*
 * ops.h - the control operations: everything but BWD.  Each fills a reply
 * (header already set) or returns an rn_status with err; the op table in
 * request.c has already admitted the request (session looked up and
 * touched, draining and failing checked where the table says so).
 */
#ifndef RND_OPS_H
#define RND_OPS_H

#include "ctx.h"

typedef int rnd_op_fn(rnd_ctx *ctx, rnd_session *s, const rnp_request *req, rnp_reply *rep,
                      rnp_error *err);

rnd_op_fn rnd_op_hello, rnd_op_register, rnd_op_unregister, rnd_op_events, rnd_op_ping,
    rnd_op_health, rnd_op_stats;
/* BYE: the reply goes first, then the session ends (the op table's
 * OPF_ENDS_SESSION). */
rnd_op_fn rnd_op_bye;

#endif
