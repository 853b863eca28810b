/* SPDX-License-Identifier: MIT */
/*
 * rawring.c - a fast-path client below libclient (see rawring.h).
 */
#include "integration/rawring.h"

#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "integration/raw.h"
#include "integration/rawchan.h"

static uint64_t ms_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

int rnr_ring_call(rnr_ring *g, rnp_request *q, rnp_reply *rep)
{
    static uint64_t id = 100;
    q->version = RNP_VERSION;
    q->id = ++id;
    if (rnr_call(g->sock, q, rep) != 0)
        return -1;
    return rep->status;
}

static int ring_open(rnr_ring *g, const char *endpoint, uint32_t slots, size_t data_bytes,
                     bool seal, bool go)
{
    static rnp_request q;
    static rnp_reply r;
    char msg[200];
    uint32_t pid, uid;

    memset(g, 0, sizeof *g);
    g->no_go = !go;
    g->chan = g->fd = -1;
    g->slots = slots;
    size_t ring = (size_t)rnp_ring_bytes(slots);
    ring = (ring + 4095) & ~(size_t)4095;
    g->data_bytes = data_bytes;
    g->size = ring + data_bytes;
    if ((g->sock = rnr_open(endpoint)) < 0 || rnr_hello(g->sock, &g->session) != 0)
        return -1;
    if ((g->chan = rnr_chan_connect(endpoint)) < 0 ||
        rnr_chan_auth(g->chan, &g->session, &pid, &uid, msg, sizeof msg) != 0) {
        printf("rawring: AUTH failed: %s\n", msg);
        return -1;
    }
    /* MFD_CLOEXEC, and MFD_ALLOW_SEALING to seal it. */
    g->fd = (int)syscall(SYS_memfd_create, "rawring", seal ? 3u : 1u);
    if (g->fd < 0 || ftruncate(g->fd, (off_t)g->size) != 0)
        return -1;
    if (seal && fcntl(g->fd, F_ADD_SEALS, F_SEAL_SHRINK) != 0)
        return -1;
    g->mem = mmap(NULL, g->size, PROT_READ | PROT_WRITE, MAP_SHARED, g->fd, 0);
    if (g->mem == MAP_FAILED)
        return -1;
    g->data = g->mem + ring;
    rnp_ring_init(g->mem, slots);
    if (rnr_chan_register(g->chan, g->fd, g->size, &g->region, msg, sizeof msg) != 0) {
        printf("rawring: REGISTER_FD failed: %s\n", msg);
        return -1;
    }
    memset(&q, 0, sizeof q);
    q.op = RN_OP_RING_OPEN;
    q.u.ring_open.session = g->session;
    q.u.ring_open.region.id = g->region;
    q.u.ring_open.slots = slots;
    q.u.ring_open.go = !g->no_go;
    if (rnr_ring_call(g, &q, &r) != 0) {
        printf("rawring: RING_OPEN failed: %d %s\n", r.status, r.error);
        return -1;
    }
    g->ring = r.u.ring_open.ring;
    return 0;
}

int rnr_ring_open(rnr_ring *g, const char *endpoint, uint32_t slots, size_t data_bytes)
{
    return ring_open(g, endpoint, slots, data_bytes, false, true);
}

int rnr_ring_open_nogo(rnr_ring *g, const char *endpoint, uint32_t slots, size_t data_bytes)
{
    return ring_open(g, endpoint, slots, data_bytes, false, false);
}

int rnr_ring_open_sealed(rnr_ring *g, const char *endpoint, uint32_t slots, size_t data_bytes)
{
    return ring_open(g, endpoint, slots, data_bytes, true, true);
}

void rnr_ring_close(rnr_ring *g)
{
    if (g->sock >= 0)
        rnr_close(g->sock);
    if (g->chan >= 0)
        close(g->chan);
    if (g->mem && g->mem != MAP_FAILED)
        munmap(g->mem, g->size);
    if (g->fd >= 0)
        close(g->fd);
    g->sock = g->chan = g->fd = -1;
    g->mem = NULL;
}

static void tensor(const rnr_ring *g, const void *p, rnp_tensor *t)
{
    t->region.id = g->region;
    t->offset = (uint64_t)((const uint8_t *)p - g->mem);
}

void rnr_ring_req(const rnr_ring *g, const rn_bwd_args *a, rnp_bwd_req *b)
{
    memset(b, 0, sizeof *b);
    b->m = (uint64_t)a->m;
    b->n = (uint32_t)a->n;
    b->x_dtype = (uint8_t)a->x_dtype, b->dy_dtype = (uint8_t)a->dy_dtype;
    b->dx_dtype = (uint8_t)a->dx_dtype;
    tensor(g, a->x, &b->x), b->x.stride = (uint64_t)a->x_stride;
    tensor(g, a->dy, &b->dy), b->dy.stride = (uint64_t)a->dy_stride;
    tensor(g, a->dx, &b->dx), b->dx.stride = (uint64_t)a->dx_stride;
    if ((b->has_w = a->w_dtype != RN_DTYPE_NONE))
        tensor(g, a->w, &b->w), b->w_dtype = (uint8_t)a->w_dtype;
    if ((b->has_rstd = a->rstd != NULL))
        tensor(g, a->rstd, &b->rstd);
    if ((b->has_dres = a->dres_dtype != RN_DTYPE_NONE))
        tensor(g, a->dres, &b->dres), b->dres.stride = (uint64_t)a->dres_stride,
            b->dres_dtype = (uint8_t)a->dres_dtype;
    if ((b->has_dw = a->dw_dtype != RN_DTYPE_NONE))
        tensor(g, a->dw, &b->dw), b->dw_dtype = (uint8_t)a->dw_dtype;
    b->eps = a->eps;
    b->weight_offset = a->weight_offset;
    b->ready_slot = -1;
}

void rnr_ring_ready(rnr_ring *g, uint64_t seq)
{
    __atomic_store_n(rnp_ring_u64(g->mem, RNP_RING_O_READY), seq, __ATOMIC_RELEASE);
    if (!g->no_go)
        rnr_ring_go(g, seq);
}

void rnr_ring_go(rnr_ring *g, uint64_t seq)
{
    __atomic_store_n(rnp_ring_u64(g->mem, RNP_RING_O_GO), seq, __ATOMIC_RELEASE);
}

uint64_t rnr_ring_publish(rnr_ring *g, const rnp_bwd_req *b, const uint8_t *desc, bool set_ready)
{
    uint64_t seq = g->seq + 1;
    uint8_t *slot = g->mem + rnp_ring_slot_off(seq, g->slots);

    if (desc)
        memcpy(slot, desc, RNP_RING_DESC);
    else
        rnp_ring_encode(b, seq, slot);
    rnp_ring_put_result(slot, 0, NULL);
    if (set_ready)
        rnr_ring_ready(g, seq);
    __atomic_store_n(rnp_ring_u64(g->mem, RNP_RING_O_PROD), seq, __ATOMIC_RELEASE);
    g->seq = seq;
    atomic_thread_fence(memory_order_seq_cst);
    if (!g->no_bell && __atomic_load_n(rnp_ring_u32(g->mem, RNP_RING_O_SLEEPING), __ATOMIC_SEQ_CST)) {
        __atomic_add_fetch(rnp_ring_u32(g->mem, RNP_RING_O_DOORBELL), 1, __ATOMIC_SEQ_CST);
        syscall(SYS_futex, rnp_ring_u32(g->mem, RNP_RING_O_DOORBELL), FUTEX_WAKE, 1, NULL, NULL, 0);
    }
    return seq;
}

uint64_t rnr_ring_done(const rnr_ring *g)
{
    return __atomic_load_n(rnp_ring_u64(g->mem, RNP_RING_O_DONE), __ATOMIC_ACQUIRE);
}

int rnr_ring_wait(const rnr_ring *g, uint64_t seq, int timeout_ms)
{
    uint64_t t0 = ms_now();
    while (!rnp_seq_reached(rnr_ring_done(g), seq)) {
        if (ms_now() - t0 > (uint64_t)timeout_ms) {
            printf("rawring: done stays %llu, waiting for %llu\n",
                   (unsigned long long)rnr_ring_done(g), (unsigned long long)seq);
            return -1;
        }
        struct timespec d = {0, 200000};
        nanosleep(&d, NULL);
    }
    return 0;
}

int rnr_ring_status(const rnr_ring *g, uint64_t seq, char *msg, size_t len)
{
    return rnp_ring_get_result(g->mem + rnp_ring_slot_off(seq, g->slots), msg, len);
}

uint32_t rnr_ring_state(const rnr_ring *g)
{
    return __atomic_load_n(rnp_ring_u32(g->mem, RNP_RING_O_STATE), __ATOMIC_ACQUIRE);
}
