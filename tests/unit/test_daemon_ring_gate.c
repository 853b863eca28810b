/* SPDX-License-Identifier: MIT */
/*
 * test_daemon_ring_gate.c - an armed ring job's wait and gate as the CPU
 * backend decides them (daemon/ring_io.h: rnd_ring_wait_met,
 * rnd_ring_gate_open), the twin of the kernel's gate (rnk_bwd_args.gate,
 * latch): the wait ends once go reaches the key; the gate is open once
 * ready reached it, unless an earlier job of the same epoch found its gate
 * shut (the latch, with the first key that skipped: rnd_ring_gate_was_shut
 * after the jobs ended), which a job of the next epoch ignores; a job not
 * armed waits for ready and is always open.
 */
#include "rn_test.h"

#include <string.h>

#include "../../daemon/ring_io.h"

static uint64_t ring[RNP_RING_HDR / 8];
static uint64_t arm[2];

static void words(uint64_t ready, uint64_t go)
{
    *rnp_ring_u64(ring, RNP_RING_O_READY) = ready;
    *rnp_ring_u64(ring, RNP_RING_O_GO) = go;
}

static rnd_ring_job job(uint64_t seq, uint64_t epoch)
{
    rnd_ring_job rj;
    memset(&rj, 0, sizeof rj);
    rj.ring = ring;
    rj.seq = seq;
    rj.arm = epoch ? arm : NULL;
    rj.arm_key = epoch ? seq : 0;
    rj.arm_epoch = epoch;
    return rj;
}

static void test_wait_and_gate(void **state)
{
    (void)state;
    memset(ring, 0, sizeof ring);
    memset(arm, 0, sizeof arm);
    rnd_ring_job a = job(5, 1);
    words(4, 4);
    assert_false(rnd_ring_wait_met(&a));
    words(5, 4);
    assert_false(rnd_ring_wait_met(&a)); /* (ready alone: no) */
    words(5, 5);
    assert_true(rnd_ring_wait_met(&a));
    assert_true(rnd_ring_gate_open(&a));
    assert_int_equal(arm[0], 0);
    assert_false(rnd_ring_gate_was_shut(&a));
    /* go past ready (the daemon's raise): shut, and latched */
    rnd_ring_job b = job(6, 1), c = job(7, 1);
    words(5, 9);
    assert_true(rnd_ring_wait_met(&b));
    assert_false(rnd_ring_gate_open(&b));
    assert_int_equal(arm[0], 1);
    assert_int_equal(arm[1], 6); /* (the first key that skipped) */
    assert_true(rnd_ring_gate_was_shut(&b));
    assert_false(rnd_ring_gate_was_shut(&a)); /* (before the first skip: it ran) */
    /* ready came for the next one: still shut in this epoch */
    words(7, 9);
    assert_true(rnd_ring_wait_met(&c));
    assert_false(rnd_ring_gate_open(&c));
    assert_int_equal(arm[1], 6);
    assert_true(rnd_ring_gate_was_shut(&c));
    /* the next epoch ignores the latch */
    rnd_ring_job d = job(7, 2);
    assert_true(rnd_ring_gate_open(&d));
    assert_int_equal(arm[0], 1);
    assert_false(rnd_ring_gate_was_shut(&d));
    /* not armed: the wait is ready's, the gate always open */
    rnd_ring_job e = job(8, 0);
    words(7, 9);
    assert_false(rnd_ring_wait_met(&e));
    words(8, 0);
    assert_true(rnd_ring_wait_met(&e));
    assert_true(rnd_ring_gate_open(&e));
    /* sequence numbers compare modulo 2^64 */
    rnd_ring_job f = job(2, 3);
    words(UINT64_MAX, 1);
    assert_false(rnd_ring_wait_met(&f));
    words(2, 3);
    assert_true(rnd_ring_wait_met(&f));
    assert_true(rnd_ring_gate_open(&f));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_wait_and_gate),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
