/* SPDX-License-Identifier: MIT */
/*
 * raw.h - talk to the daemon on a plain NN_REQ socket, below libclient, to
 * send exactly the bytes a test wants (malformed messages, duplicates).
 * Internal names: rnr_.
 */
#ifndef RN_RAW_H
#define RN_RAW_H

#include <stddef.h>
#include <stdint.h>

#include "rn_proto.h"

/* An NN_REQ socket connected to endpoint with 10 s timeouts; -1 on error. */
int rnr_open(const char *endpoint);
void rnr_close(int sock);

/* Send len bytes and decode the reply into *rep.  Returns 0 when a reply
 * arrived and decoded (whatever its status), -1 otherwise (printed). */
int rnr_send_bytes(int sock, const void *buf, size_t len, rnp_reply *rep);

/* Encode req (version and id as given) and exchange it. */
int rnr_call(int sock, const rnp_request *req, rnp_reply *rep);

/* The `paths` a HELLO on a fresh connection to endpoint is answered with;
 * -1 when no answer came. */
int rnr_hello_paths(const char *endpoint);

/* HELLO; fills *session.  Returns 0 or -1. */
int rnr_hello(int sock, rnp_session *session);

/* REGISTER an shm object by name; fills *region.  Returns the reply status,
 * or -1 when no reply came. */
int rnr_register(int sock, const rnp_session *s, const char *name, uint64_t size, uint32_t *region);

#endif
