/* SPDX-License-Identifier: MIT */
/*
 * test_daemon_ring_gate.c - an armed ring job's wait and gate as the CPU
 * backend decides them (daemon/ring_io.h: rnd_ring_wait_met,
 * rnd_ring_gate_open), the twin of the kernel's gate (rnk_bwd_args.gate,
 * latch): the wait ends once the ready word reaches the key, as a stream
 * wait compares it (the daemon's bit RNP_RING_READY_RAISED passes every
 * key); the gate is open once the client's ready, the bit left out,
 * reached it, unless an earlier job of the same epoch found its gate shut
 * (the latch, with the first key that skipped: rnd_ring_gate_was_shut
 * after the jobs ended), which a job of the next epoch ignores; a job not
 * armed waits for the client's ready and is always open.  The go word
 * plays no part (the client's own).
 */
#include "rn_test.h"

#include <string.h>

#include "../../daemon/ring_io.h"

static uint64_t ring[RNP_RING_HDR / 8];
static uint64_t arm[2];

static void ready(uint64_t word)
{
    *rnp_ring_u64(ring, RNP_RING_O_READY) = word;
    *rnp_ring_u64(ring, RNP_RING_O_GO) = 0; /* (never read) */
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
    const uint64_t R = RNP_RING_READY_RAISED;
    memset(ring, 0, sizeof ring);
    memset(arm, 0, sizeof arm);
    rnd_ring_job a = job(5, 1);
    ready(4);
    assert_false(rnd_ring_wait_met(&a));
    ready(5);
    assert_true(rnd_ring_wait_met(&a));
    assert_true(rnd_ring_gate_open(&a));
    assert_int_equal(arm[0], 0);
    assert_false(rnd_ring_gate_was_shut(&a));
    /* the daemon's bit (a revocation): the wait passes, the gate is shut,
     * and latched */
    rnd_ring_job b = job(6, 1), c = job(7, 1);
    ready(5 | R);
    assert_true(rnd_ring_wait_met(&b));
    assert_false(rnd_ring_gate_open(&b));
    assert_int_equal(arm[0], 1);
    assert_int_equal(arm[1], 6); /* (the first key that skipped) */
    assert_true(rnd_ring_gate_was_shut(&b));
    assert_false(rnd_ring_gate_was_shut(&a)); /* (before the first skip: it ran) */
    /* ready came for the next one: still shut in this epoch */
    ready(7 | R);
    assert_true(rnd_ring_wait_met(&c));
    assert_false(rnd_ring_gate_open(&c));
    assert_int_equal(arm[1], 6);
    assert_true(rnd_ring_gate_was_shut(&c));
    /* the next epoch ignores the latch; the bit set or not, the client's
     * ready decides */
    rnd_ring_job d = job(7, 2);
    assert_true(rnd_ring_gate_open(&d));
    assert_int_equal(arm[0], 1);
    assert_false(rnd_ring_gate_was_shut(&d));
    /* not armed: the wait is the client's ready, the bit left out, and the
     * gate always open */
    rnd_ring_job e = job(8, 0);
    ready(7 | R);
    assert_false(rnd_ring_wait_met(&e));
    ready(8);
    assert_true(rnd_ring_wait_met(&e));
    assert_true(rnd_ring_gate_open(&e));
    /* sequence numbers compare modulo 2^64 */
    rnd_ring_job f = job(2, 3);
    ready(UINT64_MAX);
    assert_false(rnd_ring_wait_met(&f));
    ready(2);
    assert_true(rnd_ring_wait_met(&f));
    assert_true(rnd_ring_gate_open(&f));
    /* the bit passes a wait for any key within 2^62 of the client's */
    rnd_ring_job g = job(1000, 4);
    ready(3 | R);
    assert_true(rnd_ring_wait_met(&g));
    assert_false(rnd_ring_gate_open(&g));
    assert_int_equal(rnp_ring_ready_seq(3 | R), 3);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_wait_and_gate),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
