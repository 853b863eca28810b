/* SPDX-License-Identifier: MIT */
/*
 * test_daemon_chan_vmm.c - the daemon's side of VMM ranges on the session
 * channel (daemon/chan_vmm.c), with a fake backend and a fake region table:
 * chunks wait in order, the layout rules, the backend's import, VMM_MAP
 * handing the chunks to the region (which takes them whatever it answers),
 * and every error dropping what waits, each chunk exactly once.
 */
#include "rn_test.h"

#include <stdlib.h>
#include <string.h>

#include "../../daemon/chan_vmm.c"

/* ---- a fake backend: chunks are numbered, imports and drops counted ---------------- */

typedef struct fake {
    rnd_backend base;
    int imported, dropped;
    int fail_import_at;        /* import number that fails (1-based); 0: none */
    uint64_t last_offset, last_size;
} fake;

static int fake_import(rnd_backend *be, void *bsess, int fd, uint64_t offset, uint64_t size,
                       void **chunk, rnp_error *err)
{
    fake *f = (fake *)be;
    (void)bsess, (void)fd;
    if (f->fail_import_at && f->imported + 1 == f->fail_import_at) {
        f->fail_import_at = 0;
        return rnp_fail(err, RN_INVALID_ARGUMENT, "vmm_chunk: not an exported allocation");
    }
    f->imported++;
    f->last_offset = offset;
    f->last_size = size;
    *chunk = malloc(1);
    return 0;
}

static void fake_drop(rnd_backend *be, void *chunk)
{
    ((fake *)be)->dropped++;
    free(chunk);
}

static const rnd_backend_ops fake_ops = {
    .name = "fake", .vmm_import = fake_import, .vmm_drop = fake_drop};
static const rnd_backend_ops novmm_ops = {.name = "cpu"};

/* ---- a fake region table ------------------------------------------------------------- */

static int region_rc;          /* what the next rnd_region_add_vmm answers */
static uint32_t region_n;
static uint64_t region_total;

int rnd_region_add_vmm(rnd_session *s, void **chunks, uint32_t n, uint64_t total,
                       const uint8_t uuid[RNP_UUID_BYTES], uint32_t *id, rnp_error *err)
{
    rnd_backend *be = s->tab->be;
    (void)uuid;
    region_n = n;
    region_total = total;
    /* It takes every chunk, whatever it answers. */
    for (uint32_t i = 0; i < n; i++) {
        be->ops->vmm_drop(be, chunks[i]);
        chunks[i] = NULL;
    }
    if (region_rc)
        return rnp_fail(err, region_rc, "register: the session has 4096 regions");
    *id = 7;
    return 0;
}

/* ---- helpers ----------------------------------------------------------------------------- */

#define M2 (2ull << 20)

typedef struct world {
    fake f;
    rnd_sessions tab;
    rnd_session s;
    rnd_vmm_pending p;
} world;

static world *mk(const rnd_backend_ops *ops)
{
    world *w = calloc(1, sizeof *w);
    w->f.base.ops = ops;
    w->tab.be = &w->f.base;
    w->s.tab = &w->tab;
    region_rc = 0;
    region_n = 0;
    region_total = 0;
    return w;
}

static void done(world *w)
{
    rnd_vmm_pending_clear(w->tab.be, &w->p);
    rnd_vmm_pending_free(&w->p);
    /* Every chunk imported was let go exactly once. */
    assert_int_equal(w->f.imported, w->f.dropped);
    free(w);
}

static int chunk(world *w, uint32_t index, uint64_t offset, uint64_t size, rnp_error *err)
{
    rnp_chan_msg m = {.type = RNP_CHAN_VMM_CHUNK};
    m.u.vmm_chunk.index = index;
    m.u.vmm_chunk.offset = offset;
    m.u.vmm_chunk.size = size;
    return rnd_vmm_chunk(&w->s, &w->p, &m, 3, err);
}

static int map(world *w, uint32_t count, uint64_t total, uint32_t *region, rnp_error *err)
{
    rnp_chan_msg m = {.type = RNP_CHAN_VMM_MAP};
    m.u.vmm_map.count = count;
    m.u.vmm_map.total = total;
    return rnd_vmm_map(&w->s, &w->p, &m, region, err);
}

/* ---- tests ------------------------------------------------------------------------------- */

static void test_range_of_three(void **state)
{
    (void)state;
    world *w = mk(&fake_ops);
    rnp_error err = {0};
    uint32_t region = 0;

    assert_int_equal(chunk(w, 0, 0, M2, &err), 0);
    assert_int_equal(chunk(w, 1, M2, 10 * M2, &err), 0);
    assert_int_equal(chunk(w, 2, 11 * M2, M2, &err), 0);
    assert_true(w->f.last_offset == 11 * M2 && w->f.last_size == M2);
    assert_int_equal(w->p.n, 3);
    assert_true(w->p.end == 12 * M2);
    assert_int_equal(map(w, 3, 12 * M2, &region, &err), 0);
    assert_int_equal(region, 7);
    assert_int_equal(region_n, 3);
    assert_true(region_total == 12 * M2);
    assert_int_equal(w->p.n, 0);
    assert_true(w->p.end == 0);
    /* A second range on the same connection starts at chunk 0 again. */
    assert_int_equal(chunk(w, 0, 0, M2, &err), 0);
    assert_int_equal(map(w, 1, M2, &region, &err), 0);
    assert_int_equal(w->f.imported, 4);
    done(w);
}

/* Many chunks: the list grows. */
static void test_many_chunks(void **state)
{
    (void)state;
    world *w = mk(&fake_ops);
    rnp_error err = {0};
    uint32_t region = 0;

    for (uint32_t i = 0; i < 1000; i++)
        assert_int_equal(chunk(w, i, (uint64_t)i * M2, M2, &err), 0);
    assert_int_equal(map(w, 1000, 1000 * M2, &region, &err), 0);
    assert_int_equal(region_n, 1000);
    done(w);
}

/* A layout error drops what waits, and the client starts again at 0. */
static void test_layout_error_drops(void **state)
{
    (void)state;
    world *w = mk(&fake_ops);
    rnp_error err = {0};
    uint32_t region = 0;

    assert_int_equal(chunk(w, 0, 0, M2, &err), 0);
    assert_int_equal(chunk(w, 1, M2, M2, &err), 0);
    assert_int_equal(chunk(w, 3, 2 * M2, M2, &err), RN_INVALID_ARGUMENT);
    assert_string_equal(err.msg, "vmm_chunk.index: 3, expected 2 (chunks come in order from 0)");
    assert_int_equal(w->p.n, 0);
    assert_int_equal(w->f.dropped, 2);
    /* Not imported: the layout is checked first. */
    assert_int_equal(w->f.imported, 2);
    /* A gap. */
    assert_int_equal(chunk(w, 0, 0, M2, &err), 0);
    assert_int_equal(chunk(w, 1, 2 * M2, M2, &err), RN_INVALID_ARGUMENT);
    assert_non_null(strstr(err.msg, "vmm_chunk.offset"));
    assert_int_equal(w->p.n, 0);
    /* After an error, index 1 is out of order. */
    assert_int_equal(chunk(w, 1, M2, M2, &err), RN_INVALID_ARGUMENT);
    assert_int_equal(chunk(w, 0, 0, M2, &err), 0);
    assert_int_equal(map(w, 1, M2, &region, &err), 0);
    done(w);
}

/* A range given up half-way (its client stopped waiting for a reply): the
 * next range's chunk 0 drops the chunks left waiting and starts afresh. */
static void test_chunk0_restarts(void **state)
{
    (void)state;
    world *w = mk(&fake_ops);
    rnp_error err = {0};
    uint32_t region = 0;

    assert_int_equal(chunk(w, 0, 0, M2, &err), 0);
    assert_int_equal(chunk(w, 1, M2, M2, &err), 0);
    assert_int_equal(chunk(w, 0, 0, 4 * M2, &err), 0);
    assert_int_equal(w->f.dropped, 2);
    assert_int_equal(w->p.n, 1);
    assert_true(w->p.end == 4 * M2);
    assert_int_equal(map(w, 1, 4 * M2, &region, &err), 0);
    assert_true(region_total == 4 * M2);
    done(w);
}

static void test_import_error_drops(void **state)
{
    (void)state;
    world *w = mk(&fake_ops);
    rnp_error err = {0};

    w->f.fail_import_at = 3;
    assert_int_equal(chunk(w, 0, 0, M2, &err), 0);
    assert_int_equal(chunk(w, 1, M2, M2, &err), 0);
    assert_int_equal(chunk(w, 2, 2 * M2, M2, &err), RN_INVALID_ARGUMENT);
    assert_string_equal(err.msg, "vmm_chunk: not an exported allocation");
    assert_int_equal(w->p.n, 0);
    assert_int_equal(w->f.dropped, 2);
    done(w);
}

static void test_map_errors(void **state)
{
    (void)state;
    world *w = mk(&fake_ops);
    rnp_error err = {0};
    uint32_t region = 0;

    /* No chunks. */
    assert_int_equal(map(w, 0, 0, &region, &err), RN_INVALID_ARGUMENT);
    assert_non_null(strstr(err.msg, "vmm_map.count"));
    /* A count that is not the chunks': they are dropped. */
    assert_int_equal(chunk(w, 0, 0, M2, &err), 0);
    assert_int_equal(chunk(w, 1, M2, M2, &err), 0);
    assert_int_equal(map(w, 3, 2 * M2, &region, &err), RN_INVALID_ARGUMENT);
    assert_string_equal(err.msg, "vmm_map.count: 3, but 2 chunks were received for the range");
    assert_int_equal(w->p.n, 0);
    assert_int_equal(w->f.dropped, 2);
    /* A total that is not theirs. */
    assert_int_equal(chunk(w, 0, 0, M2, &err), 0);
    assert_int_equal(map(w, 1, M2 + 1, &region, &err), RN_INVALID_ARGUMENT);
    assert_non_null(strstr(err.msg, "vmm_map.total"));
    assert_int_equal(w->p.n, 0);
    assert_int_equal(region_n, 0); /* the region was never asked */
    /* The region refuses (a limit): it took the chunks all the same. */
    region_rc = RN_BUSY;
    assert_int_equal(chunk(w, 0, 0, M2, &err), 0);
    assert_int_equal(map(w, 1, M2, &region, &err), RN_BUSY);
    assert_int_equal(w->p.n, 0);
    done(w);
}

/* A backend without VMM (the CPU backend): UNSUPPORTED, nothing waits. */
static void test_no_vmm_backend(void **state)
{
    (void)state;
    world *w = mk(&novmm_ops);
    rnp_error err = {0};

    assert_int_equal(chunk(w, 0, 0, M2, &err), RN_UNSUPPORTED);
    assert_string_equal(err.msg, "vmm_chunk: the cpu backend maps no CUDA memory");
    assert_int_equal(w->p.n, 0);
    done(w);
}

/* The connection ends with chunks waiting: they are dropped; without a
 * backend (the process exits), only forgotten. */
static void test_clear(void **state)
{
    (void)state;
    world *w = mk(&fake_ops);
    rnp_error err = {0};
    void *keep;

    assert_int_equal(chunk(w, 0, 0, M2, &err), 0);
    assert_int_equal(chunk(w, 1, M2, M2, &err), 0);
    rnd_vmm_pending_clear(w->tab.be, &w->p);
    assert_int_equal(w->p.n, 0);
    assert_int_equal(w->f.dropped, 2);
    assert_int_equal(chunk(w, 0, 0, M2, &err), 0);
    keep = w->p.chunks[0];
    rnd_vmm_pending_clear(NULL, &w->p);
    assert_int_equal(w->p.n, 0);
    free(keep);
    w->f.dropped++;
    done(w);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_range_of_three),    cmocka_unit_test(test_many_chunks),
        cmocka_unit_test(test_layout_error_drops),
        cmocka_unit_test(test_chunk0_restarts), cmocka_unit_test(test_import_error_drops),
        cmocka_unit_test(test_map_errors),        cmocka_unit_test(test_no_vmm_backend),
        cmocka_unit_test(test_clear),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
