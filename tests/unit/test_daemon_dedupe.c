/* SPDX-License-Identifier: MIT */
/*
 * test_daemon_dedupe.c - the per-session window of finished BWD results that
 * answers a re-sent (session, seq) without running it again.
 */
#include "rn_test.h"

#include <string.h>

#include "../../daemon/dedupe.c"

static rnd_result result(uint64_t seq, int status)
{
    rnd_result r;
    memset(&r, 0, sizeof r);
    r.seq = seq;
    r.status = status;
    r.rep.seq = seq;
    r.rep.compute_ns = seq * 10;
    if (status)
        snprintf(r.error, sizeof r.error, "bwd: failure %llu", (unsigned long long)seq);
    return r;
}

static void test_new_then_done(void **state)
{
    rnd_dedupe d;
    const rnd_result *got = NULL;
    rnd_result r;

    assert_int_equal(rnd_dedupe_init(&d, 4), 0);
    assert_int_equal(rnd_dedupe_lookup(&d, 1, &got), RND_SEQ_NEW);
    r = result(1, 0);
    rnd_dedupe_put(&d, &r);
    assert_int_equal(rnd_dedupe_lookup(&d, 1, &got), RND_SEQ_DONE);
    assert_int_equal(got->rep.seq, 1);
    assert_int_equal(got->rep.compute_ns, 10);
    assert_int_equal(rnd_dedupe_lookup(&d, 2, &got), RND_SEQ_NEW);

    /* Failures are remembered with their message. */
    r = result(2, RN_INVALID_ARGUMENT);
    rnd_dedupe_put(&d, &r);
    assert_int_equal(rnd_dedupe_lookup(&d, 2, &got), RND_SEQ_DONE);
    assert_int_equal(got->status, RN_INVALID_ARGUMENT);
    assert_string_equal(got->error, "bwd: failure 2");
    rnd_dedupe_fini(&d);
    rnd_dedupe_fini(&d);   /* twice is fine */
    rnd_dedupe_fini(NULL);
}

static void test_window(void **state)
{
    rnd_dedupe d;
    const rnd_result *got;
    rnd_result r;

    assert_int_equal(rnd_dedupe_init(&d, 4), 0);
    for (uint64_t s = 1; s <= 6; s++) {
        r = result(s, 0);
        rnd_dedupe_put(&d, &r);
    }
    /* 1 and 2 fell out of the window: refused, never run twice. */
    assert_int_equal(rnd_dedupe_lookup(&d, 1, &got), RND_SEQ_TOO_OLD);
    assert_int_equal(rnd_dedupe_lookup(&d, 2, &got), RND_SEQ_TOO_OLD);
    for (uint64_t s = 3; s <= 6; s++) {
        assert_int_equal(rnd_dedupe_lookup(&d, s, &got), RND_SEQ_DONE);
        assert_int_equal(got->rep.seq, s);
    }
    assert_int_equal(rnd_dedupe_lookup(&d, 7, &got), RND_SEQ_NEW);
    assert_int_equal(rnd_dedupe_lookup(&d, 1000, &got), RND_SEQ_NEW);

    /* Results that finish out of order: the evicted maximum guards. */
    r = result(10, 0);
    rnd_dedupe_put(&d, &r);
    r = result(8, 0);
    rnd_dedupe_put(&d, &r);   /* evicts 3 and 4 */
    assert_int_equal(rnd_dedupe_lookup(&d, 4, &got), RND_SEQ_TOO_OLD);
    assert_int_equal(rnd_dedupe_lookup(&d, 7, &got), RND_SEQ_NEW);
    assert_int_equal(rnd_dedupe_lookup(&d, 8, &got), RND_SEQ_DONE);
    assert_int_equal(rnd_dedupe_lookup(&d, 10, &got), RND_SEQ_DONE);
    rnd_dedupe_fini(&d);
}

static void test_large_window(void **state)
{
    rnd_dedupe d;
    const rnd_result *got;
    rnd_result r;

    assert_int_equal(rnd_dedupe_init(&d, 128), 0);
    for (uint64_t s = 1; s <= 10000; s++) {
        r = result(s, 0);
        rnd_dedupe_put(&d, &r);
        /* The request just finished and the one 127 before it are known. */
        assert_int_equal(rnd_dedupe_lookup(&d, s, &got), RND_SEQ_DONE);
        if (s > 127)
            assert_int_equal(rnd_dedupe_lookup(&d, s - 127, &got), RND_SEQ_DONE);
        if (s > 128)
            assert_int_equal(rnd_dedupe_lookup(&d, s - 128, &got), RND_SEQ_TOO_OLD);
    }
    rnd_dedupe_fini(&d);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_new_then_done),
        cmocka_unit_test(test_window),
        cmocka_unit_test(test_large_window),
    };
    return cmocka_run_group_tests_name("daemon dedupe", tests, NULL, NULL);
}
