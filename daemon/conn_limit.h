/* SPDX-License-Identifier: MIT */
/*
 * conn_limit.h - the front's connection limit (conn_limit.c says how).
 */
#ifndef RND_CONN_LIMIT_H
#define RND_CONN_LIMIT_H

#include <stdint.h>

#include "rn_proto.h"

/* From now on refuse a connection to the socket file at path while max
 * others are open.  Call once, right after the bind, in the front only. */
void rnd_conn_limit_arm(const char *path, uint32_t max);
/* Connections refused since the front started. */
uint64_t rnd_conn_limit_refused(void);

#endif
