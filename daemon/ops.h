/*
 * ops.h - the control operations: everything but BWD.  Each fills a reply
 * (header already set) or returns an rn_status with err; the op table in
 * request.c has already admitted the request (session looked up and
 * touched, draining and failing checked where the table says so).
 */
#ifndef RND_OPS_H
#define RND_OPS_H

#include "ctx.h"

int rnd_op_hello(rnd_ctx *ctx, rnd_session *s, const rnp_request *req, rnp_reply *rep,
                 rnp_error *err);
int rnd_op_register(rnd_ctx *ctx, rnd_session *s, const rnp_request *req, rnp_reply *rep,
                    rnp_error *err);
int rnd_op_unregister(rnd_ctx *ctx, rnd_session *s, const rnp_request *req, rnp_reply *rep,
                      rnp_error *err);
int rnd_op_events(rnd_ctx *ctx, rnd_session *s, const rnp_request *req, rnp_reply *rep,
                  rnp_error *err);
int rnd_op_ping(rnd_ctx *ctx, rnd_session *s, const rnp_request *req, rnp_reply *rep,
                rnp_error *err);
int rnd_op_health(rnd_ctx *ctx, rnd_session *s, const rnp_request *req, rnp_reply *rep,
                  rnp_error *err);
int rnd_op_stats(rnd_ctx *ctx, rnd_session *s, const rnp_request *req, rnp_reply *rep,
                 rnp_error *err);
/* BYE: the reply goes first, then the session ends (see request.c). */
int rnd_op_bye(rnd_ctx *ctx, rnd_session *s, const rnp_request *req, rnp_reply *rep,
               rnp_error *err);

#endif
