/* SPDX-License-Identifier: MIT */
/*
 * test_proto_mutations.c - every field of every sample message, mutated one
 * at a time: replaced by a value of each other type, left out, given twice,
 * keyed by a non-string; and an unknown key added to every map.  Each
 * mutation must give its exact error code (or decode, where the protocol
 * allows it: optional fields, unknown keys in replies).
 *
 * The mutations unpack a valid message into a msgpack-c object tree (trusted
 * bytes, so msgpack_unpack is fine here), change one thing, pack it again
 * and decode it.
 */
#include <stdlib.h>
#include <string.h>

#include <msgpack.h>

#include "proto_samples.h"

static uint8_t g_buf[RNP_MAX_MSG + 64];

typedef struct mctx {
    bool reply;
    uint32_t op;
    msgpack_object *root;
    const void *orig;        /* decoded original (for replies that must still decode) */
    int checked;
} mctx;

static int family(const msgpack_object *o)
{
    switch (o->type) {
    case MSGPACK_OBJECT_POSITIVE_INTEGER:
    case MSGPACK_OBJECT_NEGATIVE_INTEGER: return 1;
    case MSGPACK_OBJECT_FLOAT32:
    case MSGPACK_OBJECT_FLOAT64: return 2;
    default: return 10 + o->type;
    }
}

static char g_lasterr[RNP_MAX_ERRMSG];

static int check_mut(mctx *c)
{
    static uint8_t buf[RNP_MAX_MSG * 2];
    static rnp_reply out;
    rnp_error err = { 0 };
    size_t n = tp_pack_obj(c->root, buf, sizeof buf);
    c->checked++;
    int rc = tp_dec(c->reply, buf, n, &out, &err);
    snprintf(g_lasterr, sizeof g_lasterr, "%s", rc ? err.msg : "success");
    return rc;
}

static bool is_optional(bool reply, uint32_t op, const char *parent, const char *key)
{
    static const char *const opt[] = { "w", "rstd", "dres", "dw", "weight_offset", "ready", "mode",
                                       "ordering" };
    if (reply)
        return strcmp(parent, "body.counters") == 0 || strcmp(parent, "body.hists") == 0 ||
               (op == RN_OP_HELLO && strcmp(parent, "body.limits") == 0 &&
                strcmp(key, "seq_window") == 0) ||
               (op == RN_OP_HELLO && strcmp(parent, "body") == 0 && strcmp(key, "channel") == 0);
    if (op != RN_OP_BWD || strcmp(parent, "body") != 0)
        return false;
    for (size_t i = 0; i < sizeof opt / sizeof opt[0]; i++)
        if (strcmp(opt[i], key) == 0)
            return true;
    return false;
}

static msgpack_object mk_str(const char *s)
{
    msgpack_object o = { .type = MSGPACK_OBJECT_STR };
    o.via.str.ptr = s, o.via.str.size = (uint32_t)strlen(s);
    return o;
}

/* Every mutation of one map entry or array element, with its expected
 * code; depth is the nesting depth the child would have as a container. */
static void mutate_child(mctx *c, msgpack_object *parent, uint32_t i, const char *ppath,
                         const char *path, int depth)
{
    msgpack_object *slot = parent->type == MSGPACK_OBJECT_MAP ? &parent->via.map.ptr[i].val
                                                              : &parent->via.array.ptr[i];
    static const uint8_t binb[1] = { 1 };
    msgpack_object repl[9];
    memset(repl, 0, sizeof repl);
    repl[0].type = MSGPACK_OBJECT_NIL;
    repl[1].type = MSGPACK_OBJECT_BOOLEAN, repl[1].via.boolean = true;
    repl[2].type = MSGPACK_OBJECT_NEGATIVE_INTEGER, repl[2].via.i64 = -5;
    repl[3].type = MSGPACK_OBJECT_FLOAT64, repl[3].via.f64 = 1.5;
    repl[4] = mk_str("s");
    repl[5].type = MSGPACK_OBJECT_BIN, repl[5].via.bin.ptr = (const char *)binb, repl[5].via.bin.size = 1;
    repl[6].type = MSGPACK_OBJECT_ARRAY;
    repl[7].type = MSGPACK_OBJECT_MAP;
    repl[8].type = MSGPACK_OBJECT_POSITIVE_INTEGER, repl[8].via.u64 = 1;

    /* 1. a value of every other type */
    msgpack_object save = *slot;
    for (int k = 0; k < 9; k++) {
        if (family(&repl[k]) == family(&save))
            continue;
        /* The negative integer is a valid value of the signed slot fields. */
        if (repl[k].type == MSGPACK_OBJECT_NEGATIVE_INTEGER && family(&save) == 1)
            continue;
        *slot = repl[k];
        int rc = check_mut(c);
        bool container = repl[k].type == MSGPACK_OBJECT_ARRAY || repl[k].type == MSGPACK_OBJECT_MAP;
        int want = (container && depth > RNP_MAX_DEPTH) ? RN_TOO_DEEP : RN_BAD_TYPE;
        if (rc != want)
            fail_msg("%s replaced by type %d: expected %s, got %s (%s)", path, repl[k].type,
                     rnp_err_name(want), rnp_err_name(rc), g_lasterr);
        *slot = save;
    }
    if (parent->type != MSGPACK_OBJECT_MAP)
        return;

    msgpack_object_map *m = &parent->via.map;
    msgpack_object_kv *orig = m->ptr;
    uint32_t size = m->size;
    msgpack_object_kv *tmp = calloc(size + 1, sizeof *tmp);
    assert_non_null(tmp);
    char key[64];
    snprintf(key, sizeof key, "%.*s", (int)orig[i].key.via.str.size, orig[i].key.via.str.ptr);

    /* 2. the entry left out */
    memcpy(tmp, orig, i * sizeof *tmp);
    memcpy(tmp + i, orig + i + 1, (size - i - 1) * sizeof *tmp);
    m->ptr = tmp, m->size = size - 1;
    int rc = check_mut(c);
    int want = is_optional(c->reply, c->op, ppath, key) ? 0 : RN_MISSING_FIELD;
    if (rc != want)
        fail_msg("%s left out: expected %s, got %s (%s)", path, rnp_err_name(want), rnp_err_name(rc),
                 g_lasterr);

    /* 3. the entry twice */
    memcpy(tmp, orig, size * sizeof *tmp);
    tmp[size] = orig[i];
    m->ptr = tmp, m->size = size + 1;
    rc = check_mut(c);
    if (rc != RN_DUPLICATE_FIELD)
        fail_msg("%s twice: expected DUPLICATE_FIELD, got %s (%s)", path, rnp_err_name(rc), g_lasterr);

    /* 4. its key not a string */
    memcpy(tmp, orig, size * sizeof *tmp);
    tmp[i].key = repl[8];
    m->ptr = tmp, m->size = size;
    rc = check_mut(c);
    if (rc != RN_BAD_TYPE)
        fail_msg("%s with an integer key: expected BAD_TYPE, got %s (%s)", path, rnp_err_name(rc), g_lasterr);

    m->ptr = orig, m->size = size;
    free(tmp);
}

/* An unknown key added to a map: an error in a request, ignored in a reply.
 * Added twice (first, and again last, so that the walk meets the first copy
 * before any known key): a request's key twice is DUPLICATE_FIELD whether
 * or not it is known; a reply skips both. */
static void add_unknown(mctx *c, msgpack_object *map, const char *path)
{
    if (c->reply && (strcmp(path, "body.counters") == 0 || strcmp(path, "body.hists") == 0))
        return; /* every key there is a name */
    msgpack_object_map *m = &map->via.map;
    msgpack_object_kv *orig = m->ptr;
    uint32_t size = m->size;
    msgpack_object_kv *tmp = calloc(size + 2, sizeof *tmp);
    assert_non_null(tmp);
    memcpy(tmp, orig, size * sizeof *tmp);
    tmp[size].key = mk_str("zz_unknown");
    tmp[size].val.type = MSGPACK_OBJECT_NIL;
    m->ptr = tmp, m->size = size + 1;
    int rc = check_mut(c);
    int want = c->reply ? 0 : RN_UNKNOWN_FIELD;
    if (rc != want)
        fail_msg("unknown key in %s: expected %s, got %s (%s)", *path ? path : "(top)",
                 rnp_err_name(want), rnp_err_name(rc), g_lasterr);

    tmp[0].key = mk_str("zz_unknown");
    tmp[0].val.type = MSGPACK_OBJECT_NIL;
    memcpy(tmp + 1, orig, size * sizeof *tmp);
    tmp[size + 1] = tmp[0];
    tmp[size + 1].val.type = MSGPACK_OBJECT_POSITIVE_INTEGER, tmp[size + 1].val.via.u64 = 1;
    m->ptr = tmp, m->size = size + 2;
    rc = check_mut(c);
    want = c->reply ? 0 : RN_DUPLICATE_FIELD;
    if (rc != want)
        fail_msg("unknown key twice in %s: expected %s, got %s (%s)", *path ? path : "(top)",
                 rnp_err_name(want), rnp_err_name(rc), g_lasterr);
    m->ptr = orig, m->size = size;
    free(tmp);
}

static void walk(mctx *c, msgpack_object *o, const char *path, int depth)
{
    char sub[160];
    if (o->type == MSGPACK_OBJECT_MAP) {
        add_unknown(c, o, path);
        for (uint32_t i = 0; i < o->via.map.size; i++) {
            msgpack_object_kv *kv = &o->via.map.ptr[i];
            snprintf(sub, sizeof sub, "%s%s%.*s", path, *path ? "." : "", (int)kv->key.via.str.size,
                     kv->key.via.str.ptr);
            mutate_child(c, o, i, path, sub, depth + 1);
            walk(c, &kv->val, sub, depth + 1);
        }
    } else if (o->type == MSGPACK_OBJECT_ARRAY) {
        for (uint32_t i = 0; i < o->via.array.size; i++) {
            snprintf(sub, sizeof sub, "%s[%u]", path, i);
            mutate_child(c, o, i, path, sub, depth + 1);
            walk(c, &o->via.array.ptr[i], sub, depth + 1);
        }
    }
}

static void mutate_message(bool reply, uint32_t op, const uint8_t *buf, size_t len, const char *name)
{
    msgpack_unpacked u;
    size_t off = 0;
    msgpack_unpacked_init(&u);
    assert_int_equal(msgpack_unpack_next(&u, (const char *)buf, len, &off), MSGPACK_UNPACK_SUCCESS);
    mctx c = { .reply = reply, .op = op, .root = &u.data };
    /* The tree packs back to the same bytes: the mutations start from the
     * real encoding. */
    static uint8_t again[RNP_MAX_MSG];
    size_t n = tp_pack_obj(&u.data, again, sizeof again);
    assert_int_equal(n, len);
    assert_memory_equal(again, buf, len);
    walk(&c, &u.data, "", 1);
    assert_true(c.checked > 0);
    (void)name;
    msgpack_unpacked_destroy(&u);
}

static void test_mutations_requests(void **state)
{
    (void)state;
    for (int i = 0; i < TP_NREQ; i++) {
        rnp_request q;
        const char *name = tp_make_request(i, &q);
        size_t len = tp_enc_req(&q, g_buf, sizeof g_buf);
        mutate_message(false, q.op, g_buf, len, name);
    }
}

static void test_mutations_replies(void **state)
{
    (void)state;
    for (int i = 0; i < TP_NREP; i++) {
        static rnp_reply p;
        const char *name = tp_make_reply(i, &p);
        size_t len = tp_enc_rep(&p, g_buf, sizeof g_buf);
        mutate_message(true, p.op, g_buf, len, name);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mutations_requests),
        cmocka_unit_test(test_mutations_replies),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
