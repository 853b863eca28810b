/* SPDX-License-Identifier: MIT */
/*
 * rawchan.h - talk to the daemon's session channel below libclient, to send
 * exactly the messages a test wants (PROTOCOL.md section 12).  Internal
 * names: rnr_chan_.
 */
#ifndef RN_RAWCHAN_H
#define RN_RAWCHAN_H

#include <stddef.h>
#include <stdint.h>

#include "rn_proto.h"

/* A connection to the channel beside endpoint (ipc://PATH -> PATH.chan);
 * -1 with errno on failure. */
int rnr_chan_connect(const char *endpoint);

/* Send one message of len bytes with nfds descriptors attached.  Returns 0
 * or -1 (printed). */
int rnr_chan_send(int fd, const void *m, size_t len, const int *fds, int nfds);

/*
 * Receive one reply (10 s at most).  Returns 0 for AUTH_OK (pid and uid in
 * *a, *b) or REGION_OK (the region in *a), the code of an ERROR (its
 * message in msg), or -1 when none came or the connection closed.
 */
int rnr_chan_recv(int fd, uint32_t *a, uint32_t *b, char *msg, size_t msglen);

/* AUTH with cap: rnr_chan_recv's result. */
int rnr_chan_auth(int fd, const rnp_session *cap, uint32_t *pid, uint32_t *uid, char *msg,
                  size_t msglen);

/* REGISTER_FD of size bytes of shm: rnr_chan_recv's result. */
int rnr_chan_register(int fd, int shm, uint64_t size, uint32_t *region, char *msg,
                      size_t msglen);

#endif
