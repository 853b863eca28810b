/* SPDX-License-Identifier: MIT */
/*
 * chan_vmm.h - CUDA virtual memory ranges on the session channel
 * (PROTOCOL.md section 12: VMM_CHUNK ... VMM_MAP).  A client registers a
 * tensor's range in memory from cuMemCreate (PyTorch's expandable
 * segments) as the physical allocations behind it, one VMM_CHUNK each with
 * its descriptor, then VMM_MAP; the daemon imports each chunk as it comes
 * (so that it keeps no descriptor) and holds the imported allocations here,
 * per connection, until the VMM_MAP maps them as one region.  Any error
 * drops the range's pending chunks: the client starts again at chunk 0.
 */
#ifndef RND_CHAN_VMM_H
#define RND_CHAN_VMM_H

#include <stdint.h>

#include "backend.h"
#include "rn_proto.h"
#include "session.h"

/* The chunks received for the range being registered on one connection. */
typedef struct rnd_vmm_pending {
    void **chunks;                 /* the backend's imported allocations */
    uint32_t n, cap;
    uint64_t end;                  /* bytes the chunks cover */
} rnd_vmm_pending;

/* VMM_CHUNK m with its descriptor fd (the caller closes it) for session s:
 * the layout rules, then the backend's import.  Returns 0 (the chunk is
 * pending), or an rn_status with err after dropping every pending chunk. */
int rnd_vmm_chunk(rnd_session *s, rnd_vmm_pending *p, const rnp_chan_msg *m, int fd,
                  rnp_error *err);
/* VMM_MAP m: the pending chunks become one region (*region).  The pending
 * list is empty afterwards, whatever the outcome.  Returns 0 or an
 * rn_status with err. */
int rnd_vmm_map(rnd_session *s, rnd_vmm_pending *p, const rnp_chan_msg *m, uint32_t *region,
                rnp_error *err);
/* Drop every pending chunk (an error, the connection's end).  be may be
 * NULL only when nothing is pending. */
void rnd_vmm_pending_clear(rnd_backend *be, rnd_vmm_pending *p);
/* Free the list itself (after a clear). */
void rnd_vmm_pending_free(rnd_vmm_pending *p);

#endif
