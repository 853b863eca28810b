/* SPDX-License-Identifier: MIT */
/*
 * test_daemon_stats.c - the daemon's log-scale histograms (bucket edges,
 * percentiles within the promised 12.5 %, clamping to the max), the
 * buckets exported into a STATS reply (merged exactly when too many) and the
 * rendering of counters into a STATS reply with their stable names.
 */
#include "rn_test.h"

#include <stdlib.h>
#include <string.h>

#include "../../daemon/stats.c"

static void test_bucket_edges(void **state)
{
    /* Small values are exact. */
    for (uint64_t v = 0; v < 8; v++) {
        assert_int_equal(rnd_hist_index(v), v);
        assert_int_equal(rnd_hist_upper(rnd_hist_index(v)), v);
    }
    /* Every value lies in its bucket, and the bucket is narrow: its upper
     * edge is less than 12.5 % above the value. */
    uint64_t v = 8;
    unsigned prev = rnd_hist_index(7);
    while (v < (1ull << 62)) {
        unsigned b = rnd_hist_index(v);
        uint64_t up = rnd_hist_upper(b);
        assert_true(b < RND_HIST_BUCKETS);
        assert_true(b >= prev);          /* monotonic */
        assert_true(up >= v);
        assert_true(up - v < v / 8 + 1);
        if (b > 0)
            assert_true(rnd_hist_upper(b - 1) < v);   /* and not in the one below */
        prev = b;
        v += 1 + v / 1000;
    }
    /* The largest values still land inside the table. */
    assert_true(rnd_hist_index(UINT64_MAX) < RND_HIST_BUCKETS);
    assert_int_equal(rnd_hist_upper(rnd_hist_index(UINT64_MAX)), UINT64_MAX);
    assert_true(rnd_hist_index(1ull << 63) < RND_HIST_BUCKETS);
}

static void test_quantiles(void **state)
{
    rnd_hist *h = calloc(1, sizeof *h);

    assert_int_equal(rnd_hist_quantile(h, 0.5), 0);   /* empty */
    for (uint64_t v = 1; v <= 1000; v++)
        rnd_hist_add(h, v * 1000);                     /* 1 us .. 1 ms */
    assert_int_equal(h->count, 1000);
    assert_int_equal(h->max, 1000000);
    uint64_t p50 = rnd_hist_quantile(h, 0.50), p90 = rnd_hist_quantile(h, 0.90);
    uint64_t p99 = rnd_hist_quantile(h, 0.99), p100 = rnd_hist_quantile(h, 1.0);
    assert_true(p50 >= 500000 && p50 <= 500000 + 500000 / 8);
    assert_true(p90 >= 900000 && p90 <= 900000 + 900000 / 8);
    assert_true(p99 >= 990000 && p99 <= 1000000);      /* clamped to the max */
    assert_int_equal(p100, 1000000);
    assert_true(p50 <= p90 && p90 <= p99);

    /* One outlier moves the max and p100, not the median. */
    rnd_hist_add(h, 5000000000ull);
    assert_int_equal(h->max, 5000000000ull);
    assert_int_equal(rnd_hist_quantile(h, 1.0), 5000000000ull);
    assert_true(rnd_hist_quantile(h, 0.5) <= 562500);

    /* A single value is reported exactly. */
    memset(h, 0, sizeof *h);
    rnd_hist_add(h, 123456);
    assert_int_equal(rnd_hist_quantile(h, 0.5), 123456);
    assert_int_equal(rnd_hist_quantile(h, 0.99), 123456);
    free(h);
}

static const rnp_stat *find(const rnp_stats_rep *r, const char *name)
{
    for (uint32_t i = 0; i < r->nstats; i++)
        if (strcmp(r->stats[i].name, name) == 0)
            return &r->stats[i];
    return NULL;
}

static void test_fill(void **state)
{
    rnd_stats *s = calloc(1, sizeof *s);
    rnp_stats_rep *r = calloc(1, sizeof *r);
    rnd_gauges g = {.sessions_active = 3, .regions_active = 7, .inflight_current = 2,
                    .now_ns = 5000000000ull + 42};

    rnd_stats_init(s, 42);
    rnd_stats_request(s, RN_OP_BWD);
    rnd_stats_request(s, RN_OP_BWD);
    rnd_stats_request(s, RN_OP_HELLO);
    rnd_stats_request(s, 0);
    rnd_stats_request(s, 77);          /* unknown op: counted as unknown */
    rnd_stats_reply(s, 0);
    rnd_stats_reply(s, RN_BUSY);
    rnd_stats_reply(s, RN_BUSY);
    rnd_stats_reply(s, RN_OUT_OF_BOUNDS);
    s->bytes_processed = 1234;
    s->inflight_max = 9;
    rnd_hist_add(&s->queue, 1000);
    rnd_hist_add(&s->total, 3000);
    s->fast_ok = 4;
    s->fast_errors = 1;
    rnd_hist_add(&s->fast_total, 5000);
    rnd_hist_add(&s->fast_take, 700);
    g.rings_open = 2;

    rnd_stats_fill(s, &g, r);
    assert_true(r->nstats <= RNP_MAX_STATS);
    assert_int_equal(find(r, "requests.bwd")->value, 2);
    assert_int_equal(find(r, "requests.hello")->value, 1);
    assert_int_equal(find(r, "requests.unknown")->value, 2);
    assert_int_equal(find(r, "requests.bye")->value, 0);   /* every op is listed */
    assert_int_equal(find(r, "replies.ok")->value, 1);
    assert_int_equal(find(r, "errors.BUSY")->value, 2);
    assert_int_equal(find(r, "errors.OUT_OF_BOUNDS")->value, 1);
    assert_null(find(r, "errors.MALFORMED"));             /* only codes seen */
    assert_int_equal(find(r, "busy.rejected")->value, 2);
    assert_int_equal(find(r, "bytes.processed")->value, 1234);
    assert_int_equal(find(r, "sessions.active")->value, 3);
    assert_int_equal(find(r, "regions.active")->value, 7);
    assert_int_equal(find(r, "inflight.current")->value, 2);
    assert_int_equal(find(r, "inflight.max")->value, 9);
    assert_int_equal(find(r, "uptime.seconds")->value, 5);
    assert_non_null(find(r, "sessions.total"));
    assert_non_null(find(r, "dup.answered"));
    assert_non_null(find(r, "clients.died"));
    assert_int_equal(find(r, "requests.ring_open")->value, 0);
    assert_int_equal(find(r, "fast.slots")->value, 5);
    assert_int_equal(find(r, "fast.ok")->value, 4);
    assert_int_equal(find(r, "fast.errors")->value, 1);
    assert_int_equal(find(r, "fast.rings")->value, 2);
    /* Sent always, as the other counters (rmsnormctl has their help lines). */
    assert_int_equal(find(r, "fast.graphs")->value, 0);
    assert_int_equal(find(r, "fast.deferred")->value, 0);

    assert_int_equal(r->nhists, 7);
    assert_string_equal(r->hists[3].name, "fast.queue");
    assert_string_equal(r->hists[4].name, "fast.compute");
    assert_string_equal(r->hists[5].name, "fast.total");
    assert_int_equal(r->hists[5].max, 5000);
    assert_string_equal(r->hists[6].name, "fast.take");
    assert_int_equal(r->hists[6].count, 1);
    assert_int_equal(r->hists[6].max, 700);
    assert_string_equal(r->hists[0].name, "queue");
    assert_int_equal(r->hists[0].count, 1);
    assert_int_equal(r->hists[0].p50, 1000);
    assert_string_equal(r->hists[1].name, "compute");
    assert_int_equal(r->hists[1].count, 0);
    assert_string_equal(r->hists[2].name, "total");
    assert_int_equal(r->hists[2].max, 3000);
    /* Sum and buckets: the one value's bucket, and none for an empty one. */
    assert_true(r->hists[0].has_buckets);
    assert_int_equal(r->hists[0].sum, 1000);
    assert_int_equal(r->hists[0].nbuckets, 1);
    assert_int_equal(r->hists[0].buckets[0].upper, rnd_hist_upper(rnd_hist_index(1000)));
    assert_int_equal(r->hists[0].buckets[0].count, 1);
    assert_true(r->hists[1].has_buckets);
    assert_int_equal(r->hists[1].nbuckets, 0);
    assert_int_equal(r->hists[1].sum, 0);

    /* Every error code of the table fits into one reply. */
#define REPLY_CODE(code, name, msg) rnd_stats_reply(s, code);
    RN_ERRORS(REPLY_CODE)
#undef REPLY_CODE
    rnd_stats_fill(s, &g, r);
    assert_true(r->nstats <= RNP_MAX_STATS);
    assert_non_null(find(r, "errors.INTERNAL"));
    free(s);
    free(r);
}

/* The exported buckets of h describe it exactly: bounds are the daemon's
 * bucket edges, strictly ascending, and the cumulative count at each bound
 * is the number of values added that are <= it. */
static void check_export(const rnd_hist *h, const uint64_t *vals, size_t nvals, uint32_t want_n)
{
    static rnp_bucket b[RNP_MAX_BUCKETS + 1];
    uint32_t n = 12345;
    uint64_t cum = 0;
    rnd_hist_export(h, b, &n);
    assert_true(n <= RNP_MAX_BUCKETS);
    assert_int_equal(n, want_n);
    for (uint32_t k = 0; k < n; k++) {
        size_t le = 0;
        assert_true(b[k].count > 0);
        if (k > 0)
            assert_true(b[k].upper > b[k - 1].upper);
        assert_int_equal(rnd_hist_upper(rnd_hist_index(b[k].upper)), b[k].upper);
        cum += b[k].count;
        for (size_t i = 0; i < nvals; i++)
            le += vals[i] <= b[k].upper;
        assert_int_equal(cum, le);
    }
    assert_int_equal(cum, h->count);
}

static void test_export_buckets(void **state)
{
    (void)state;
    rnd_hist *h = calloc(1, sizeof *h);
    uint64_t *vals = calloc(4096, sizeof *vals);
    size_t n = 0;
    assert_non_null(h);
    assert_non_null(vals);

    /* Few buckets: exported as they are, one per non-empty bucket. */
    const uint64_t few[] = { 0, 5, 1000, 1001, 1100, 250000, 1ull << 40, UINT64_MAX };
    for (size_t i = 0; i < sizeof few / sizeof few[0]; i++)
        rnd_hist_add(h, vals[n++] = few[i]);
    check_export(h, vals, n, 7);   /* 1000 and 1001 share a bucket */

    /* 100 non-empty buckets (values 2^10 .. 2^22.5, 8 per power of two):
     * halving the resolution once leaves 50. */
    memset(h, 0, sizeof *h);
    n = 0;
    for (unsigned i = 0; i < 100; i++) {
        uint64_t v = rnd_hist_upper(rnd_hist_index(1024) + i);
        rnd_hist_add(h, vals[n++] = v);
        rnd_hist_add(h, vals[n++] = v - 1);
    }
    check_export(h, vals, n, 50);

    /* Every bucket non-empty: one bucket per power of two, 62 in all. */
    memset(h, 0, sizeof *h);
    n = 0;
    for (unsigned i = 0; i < RND_HIST_BUCKETS; i++)
        rnd_hist_add(h, vals[n++] = rnd_hist_upper(i));
    check_export(h, vals, n, RND_HIST_BUCKETS >> RND_HIST_SUB_BITS);
    free(vals);
    free(h);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bucket_edges),
        cmocka_unit_test(test_quantiles),
        cmocka_unit_test(test_fill),
        cmocka_unit_test(test_export_buckets),
    };
    return cmocka_run_group_tests_name("daemon stats", tests, NULL, NULL);
}
