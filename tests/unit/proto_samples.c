/* SPDX-License-Identifier: MIT */
/*
 * proto_samples.c - what the proto tests share: one sample of every request
 * and reply (each optional field present in one sample and absent in
 * another), encode and decode wrappers that fail the test on surprise, and
 * msgpack-c packing of a tree.  Linked into every unit test binary, so its
 * names carry the prefix tp_.
 */
#include <string.h>

#include <msgpack.h>

#include "proto_samples.h"

/* ---- sample messages ----------------------------------------------------------- */

static void fill(uint8_t *b, size_t n, uint8_t seed)
{
    for (size_t i = 0; i < n; i++)
        b[i] = (uint8_t)(seed + 7 * i);
}

/* Sets the fields only: a struct assignment could carry stack bytes into the
 * padding of a memset message, and the round trips compare whole structs. */
void tp_set_tensor(rnp_tensor *t, uint32_t region, uint64_t offset, uint64_t stride)
{
    t->region.id = region;
    t->offset = offset;
    t->stride = stride;
}

/* Sample request i (0 <= i < TP_NREQ); every optional field of BWD appears in
 * one sample and is absent in another. */
const char *tp_make_request(int i, rnp_request *q)
{
    memset(q, 0, sizeof *q);
    q->version = RNP_VERSION;
    q->id = 1000 + i;
    rnp_bwd_req *b = &q->u.bwd;
    switch (i) {
    case 0:
        q->op = RN_OP_HELLO;
        snprintf(q->u.hello.client_name, RNP_MAX_NAME, "trainer-0");
        q->u.hello.pid = 4242;
        return "hello";
    case 1:
        q->op = RN_OP_REGISTER;
        fill(q->u.reg.session.b, RNP_SESSION_BYTES, 1);
        q->u.reg.kind = RNP_REGION_SHM;
        q->u.reg.size = 1 << 20;
        snprintf(q->u.reg.shm_name, sizeof q->u.reg.shm_name, "/rn-4242-0");
        return "register-shm";
    case 2:
        q->op = RN_OP_REGISTER;
        fill(q->u.reg.session.b, RNP_SESSION_BYTES, 1);
        q->u.reg.kind = RNP_REGION_CUDA_IPC;
        q->u.reg.size = 1ull << 30;
        fill(q->u.reg.ipc_handle, RNP_IPC_HANDLE_BYTES, 3);
        fill(q->u.reg.device_uuid, RNP_UUID_BYTES, 9);
        return "register-ipc";
    case 3:
        q->op = RN_OP_UNREGISTER;
        fill(q->u.unreg.session.b, RNP_SESSION_BYTES, 1);
        q->u.unreg.region.id = 7;
        return "unregister";
    case 4:
        q->op = RN_OP_EVENTS;
        fill(q->u.events.session.b, RNP_SESSION_BYTES, 1);
        q->u.events.n = 4;
        for (int k = 0; k < 4; k++)
            fill(q->u.events.ready[k], RNP_IPC_HANDLE_BYTES, (uint8_t)(40 + k));
        fill(q->u.events.device_uuid, RNP_UUID_BYTES, 9);
        return "events";
    case 5: /* only the required fields */
        q->op = RN_OP_BWD;
        fill(b->session.b, RNP_SESSION_BYTES, 1);
        b->seq = 1, b->m = 1024, b->n = 4096;
        b->x_dtype = b->dy_dtype = b->dx_dtype = RN_DTYPE_BF16;
        tp_set_tensor(&b->x, 1, 0, 4096);
        tp_set_tensor(&b->dy, 2, 0, 4096);
        tp_set_tensor(&b->dx, 3, 0, 4096);
        b->eps = 1e-6f;
        b->ready_slot = -1;
        return "bwd-min";
    case 6: /* every optional field */
        q->op = RN_OP_BWD;
        fill(b->session.b, RNP_SESSION_BYTES, 1);
        b->seq = 0xfffffffffull, b->m = 32768, b->n = 4096;
        b->x_dtype = RN_DTYPE_BF16, b->dy_dtype = RN_DTYPE_F16, b->dx_dtype = RN_DTYPE_F32;
        tp_set_tensor(&b->x, 1, 64, 4160);
        tp_set_tensor(&b->dy, 2, 128, 4096);
        tp_set_tensor(&b->dx, 3, 0, 4096);
        b->has_w = b->has_rstd = b->has_dres = b->has_dw = true;
        b->w_dtype = RN_DTYPE_BF16;
        tp_set_tensor(&b->w, 4, 0, 0);
        tp_set_tensor(&b->rstd, 4, 8192, 0);
        b->dres_dtype = RN_DTYPE_BF16;
        tp_set_tensor(&b->dres, 5, 0, 4096);
        b->dw_dtype = RN_DTYPE_F32;
        tp_set_tensor(&b->dw, 6, 256, 0);
        b->eps = 1e-5f, b->weight_offset = 1.0f;
        b->ready_slot = 15, b->mode = RNP_MODE_SYNC;
        return "bwd-full";
    case 7: /* in place, weight without dw, ready slot 0 */
        q->op = RN_OP_BWD;
        fill(b->session.b, RNP_SESSION_BYTES, 1);
        b->seq = 2, b->m = 0, b->n = 1;
        b->x_dtype = b->dy_dtype = b->dx_dtype = RN_DTYPE_F32;
        tp_set_tensor(&b->x, 1, 0, 1);
        tp_set_tensor(&b->dy, 2, 4, 3);
        tp_set_tensor(&b->dx, 2, 4, 3);
        b->has_w = true, b->w_dtype = RN_DTYPE_F32;
        tp_set_tensor(&b->w, 1, 4096, 0);
        b->eps = 0.0f, b->weight_offset = -0.0f;
        b->ready_slot = 0;
        return "bwd-inplace";
    case 8: q->op = RN_OP_PING; q->id = 0; return "ping";
    case 9: q->op = RN_OP_HEALTH; q->id = UINT64_MAX; return "health";
    case 10: q->op = RN_OP_STATS; return "stats";
    case 11:
        q->op = RN_OP_BYE;
        fill(q->u.bye.b, RNP_SESSION_BYTES, 1);
        return "bye";
    case 12: /* the optional scalars without the optional tensors */
        q->op = RN_OP_BWD;
        fill(b->session.b, RNP_SESSION_BYTES, 2);
        b->seq = 3, b->m = 7, b->n = 33;
        b->x_dtype = b->dy_dtype = b->dx_dtype = RN_DTYPE_F16;
        tp_set_tensor(&b->x, 1, 0, 40);
        tp_set_tensor(&b->dy, 1, 1024, 33);
        tp_set_tensor(&b->dx, 1, 4096, 64);
        b->eps = 1e-6f, b->weight_offset = 0.5f;
        b->ready_slot = 7, b->mode = RNP_MODE_ASYNC;
        return "bwd-scalars";
    case 13: /* every tensor in one region, disjoint: the validator's busiest case */
        q->op = RN_OP_BWD;
        fill(b->session.b, RNP_SESSION_BYTES, 3);
        b->seq = 4, b->m = 3, b->n = 5;
        b->x_dtype = RN_DTYPE_F32, b->dy_dtype = RN_DTYPE_BF16, b->dx_dtype = RN_DTYPE_F16;
        tp_set_tensor(&b->x, 9, 0, 5);
        tp_set_tensor(&b->dy, 9, 64, 6);
        tp_set_tensor(&b->dx, 9, 128, 5);
        b->has_w = b->has_rstd = b->has_dres = b->has_dw = true;
        b->w_dtype = RN_DTYPE_F16;
        tp_set_tensor(&b->w, 9, 160, 0);
        tp_set_tensor(&b->rstd, 9, 176, 0);
        b->dres_dtype = RN_DTYPE_F32;
        tp_set_tensor(&b->dres, 9, 192, 5);
        b->dw_dtype = RN_DTYPE_F16;
        tp_set_tensor(&b->dw, 9, 256, 0);
        b->eps = 1e-5f;
        b->ready_slot = -1;
        return "bwd-one-region";
    }
    return NULL;
}

const char *tp_make_reply(int i, rnp_reply *p)
{
    memset(p, 0, sizeof *p);
    p->version = RNP_VERSION;
    p->id = 2000 + i;
    rnp_hello_rep *h = &p->u.hello;
    switch (i) {
    case 0:
    case 1:
        p->op = RN_OP_HELLO;
        fill(h->session.b, RNP_SESSION_BYTES, 77);
        snprintf(h->daemon_version, RNP_MAX_NAME, "0.1.0");
        if (i == 0) {
            snprintf(h->backend, RNP_MAX_NAME, "cpu");
            snprintf(h->device_name, RNP_MAX_NAME, "cpu (2 threads)");
            h->sm_count = 2;
        } else {
            snprintf(h->backend, RNP_MAX_NAME, "cuda");
            snprintf(h->device_name, RNP_MAX_NAME, "NVIDIA H200");
            fill(h->device_uuid, RNP_UUID_BYTES, 9);
            h->sm_count = 132, h->cc_major = 9, h->cc_minor = 0, h->mps = true;
        }
        h->limits = (rnp_limits){ .max_sessions = 64, .max_regions = 256, .max_inflight = 8,
                                  .max_inflight_total = 256, .max_m = 1ull << 24,
                                  .max_n = 65536, .max_msg = RNP_MAX_MSG, .event_slots = 16,
                                  .seq_window = 128 };
        return i == 0 ? "hello-cpu" : "hello-cuda";
    case 2: p->op = RN_OP_REGISTER; p->u.reg.region.id = 7; return "register";
    case 3: p->op = RN_OP_UNREGISTER; return "unregister";
    case 4:
        p->op = RN_OP_EVENTS;
        p->u.events.n = 4;
        for (int k = 0; k < 4; k++)
            fill(p->u.events.done[k], RNP_IPC_HANDLE_BYTES, (uint8_t)(90 + k));
        return "events";
    case 5:
        p->op = RN_OP_BWD;
        p->u.bwd = (rnp_bwd_rep){ .seq = 12, .done_slot = 3, .queue_ns = 1500, .compute_ns = 0 };
        return "bwd-async";
    case 6:
        p->op = RN_OP_BWD;
        p->u.bwd = (rnp_bwd_rep){ .seq = 13, .done_slot = -1, .queue_ns = 900, .compute_ns = 191000 };
        return "bwd-sync";
    case 7: p->op = RN_OP_PING; p->u.ping.daemon_time_ns = 1764696000123456789ull; return "ping";
    case 8:
        p->op = RN_OP_HEALTH;
        snprintf(p->u.health.backend, RNP_MAX_NAME, "cuda");
        p->u.health.mps = true;
        return "health-ok";
    case 9:
        p->op = RN_OP_HEALTH;
        p->u.health.state = RNP_HEALTH_DEGRADED;
        snprintf(p->u.health.backend, RNP_MAX_NAME, "cuda");
        p->u.health.nreasons = 2;
        snprintf(p->u.health.reasons[0], RNP_REASON_LEN, "MPS is not active");
        p->u.health.reasons[1][0] = '\0'; /* an empty reason is valid */
        return "health-degraded";
    case 10: {
        rnp_stats_rep *s = &p->u.stats;
        p->op = RN_OP_STATS;
        snprintf(s->backend, RNP_MAX_NAME, "cpu");
        snprintf(s->device, RNP_MAX_NAME, "cpu");
        const char *names[] = { "requests.bwd", "requests.hello", "errors.OUT_OF_BOUNDS", "bytes" };
        for (int k = 0; k < 4; k++) {
            snprintf(s->stats[k].name, RNP_STAT_NAME, "%s", names[k]);
            s->stats[k].value = (uint64_t)k * 1000003u;
        }
        s->nstats = 4;
        const char *hn[] = { "queue", "compute", "total" };
        for (int k = 0; k < 3; k++) {
            snprintf(s->hists[k].name, RNP_STAT_NAME, "%s", hn[k]);
            s->hists[k] = (rnp_hist){ .count = 10, .p50 = 100, .p90 = 900, .p99 = 9900, .max = 1ull << 40 };
            snprintf(s->hists[k].name, RNP_STAT_NAME, "%s", hn[k]);
        }
        s->nhists = 3;
        return "stats";
    }
    case 11:
        p->op = RN_OP_STATS;
        snprintf(p->u.stats.backend, RNP_MAX_NAME, "cpu");
        return "stats-empty";
    case 16: {
        /* A newer daemon's histograms: sum and buckets (a daemon before 0.2
         * sends the form of sample 10). */
        rnp_stats_rep *s = &p->u.stats;
        p->op = RN_OP_STATS;
        snprintf(s->backend, RNP_MAX_NAME, "cpu");
        snprintf(s->device, RNP_MAX_NAME, "cpu (2 threads)");
        const char *hn[] = { "queue", "compute", "total" };
        for (int k = 0; k < 3; k++) {
            rnp_hist *hh = &s->hists[k];
            snprintf(hh->name, RNP_STAT_NAME, "%s", hn[k]);
            hh->has_buckets = true;
            if (k == 1)
                continue; /* an empty histogram: no buckets, sum 0 */
            hh->buckets[0] = (rnp_bucket){ .upper = 7, .count = 1 };
            hh->buckets[1] = (rnp_bucket){ .upper = 1023, .count = 5 };
            hh->buckets[2] = (rnp_bucket){ .upper = 147455, .count = 3 };
            hh->buckets[3] = (rnp_bucket){ .upper = UINT64_MAX, .count = 1 };
            hh->nbuckets = 4;
            hh->count = 10, hh->p50 = 1023, hh->p90 = 147455, hh->p99 = 1ull << 40;
            hh->max = 1ull << 40, hh->sum = 5 + 5 * 1000 + 3 * 140000 + (1ull << 40);
        }
        s->nhists = 3;
        return "stats-buckets";
    }
    case 12: p->op = RN_OP_BYE; return "bye";
    case 13:
        p->op = RN_OP_BWD;
        p->status = RN_OUT_OF_BOUNDS;
        snprintf(p->error, RNP_MAX_ERRMSG, "bwd.dx: bytes [0, 8388608) exceed region 3 of 4096 bytes");
        return "error-bounds";
    case 14:
        p->op = 77, p->id = 0;
        p->status = RN_UNKNOWN_OP;
        snprintf(p->error, RNP_MAX_ERRMSG, "op: 77 is not an operation");
        return "error-unknown-op";
    case 15:
        p->op = RN_OP_HELLO, p->version = 9;
        p->status = RN_BAD_VERSION;
        snprintf(p->error, RNP_MAX_ERRMSG, "v: version 9 is not supported (supported: 1)");
        return "error-version";
    }
    return NULL;
}

/* ---- encode, decode --------------------------------------------------------------- */

size_t tp_enc_req(const rnp_request *q, uint8_t *buf, size_t cap)
{
    size_t len = 0;
    rnp_error err = { 0 };
    int rc = rnp_encode_request(q, buf, cap, &len, &err);
    if (rc)
        fail_msg("encode request: %s", err.msg);
    return len;
}

size_t tp_enc_rep(const rnp_reply *p, uint8_t *buf, size_t cap)
{
    size_t len = 0;
    rnp_error err = { 0 };
    int rc = rnp_encode_reply(p, buf, cap, &len, &err);
    if (rc)
        fail_msg("encode reply: %s", err.msg);
    return len;
}

/* Decodes as a request (reply == false) or a reply; returns the code and
 * checks that a failure comes with a message naming something ("x: ..."). */
int tp_dec(bool reply, const void *buf, size_t len, void *out, rnp_error *err)
{
    int rc = reply ? rnp_decode_reply(buf, len, out, err) : rnp_decode_request(buf, len, out, err);
    if (rc != 0) {
        assert_int_equal(err->code, rc);
        assert_non_null(strstr(err->msg, ": "));
        assert_true(strlen(err->msg) > 3);
    }
    return rc;
}

void tp_expect_code(bool reply, const void *buf, size_t len, int want, const char *what)
{
    static rnp_reply out; /* big enough for either */
    rnp_error err = { 0 };
    int rc = tp_dec(reply, buf, len, &out, &err);
    if (rc != want)
        fail_msg("%s: expected %s, got %s (%s)", what, rnp_err_name(want), rnp_err_name(rc),
                 rc ? err.msg : "success");
}

size_t tp_pack_obj(const msgpack_object *o, uint8_t *out, size_t cap)
{
    msgpack_sbuffer sb;
    msgpack_packer pk;
    msgpack_sbuffer_init(&sb);
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_object(&pk, *o);
    assert_true(sb.size <= cap);
    memcpy(out, sb.data, sb.size);
    size_t n = sb.size;
    msgpack_sbuffer_destroy(&sb);
    return n;
}
