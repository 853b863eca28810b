/* SPDX-License-Identifier: MIT */
/*
 * test_ctl_format.c - rmsnormctl's Prometheus and JSON output of latency:
 * histograms with cumulative buckets, exact le bounds, +Inf, _sum and
 * _count where the daemon sends buckets, and the summary of before where it
 * does not (an older daemon).  format.c is compiled into the test, so no
 * daemon is needed for the older daemon's case.
 */
#include "rn_test.h"

#include <stdlib.h>
#include <string.h>

#include "../../client/ctl/format.c"

/* Two histograms, "queue" (values in three buckets) and "total" (empty). */
static void sample(rn_stats_info *s, rn_hist_buckets *b, int with_buckets)
{
    memset(s, 0, sizeof *s);
    memset(b, 0, RN_MAX_HISTS * sizeof *b);
    snprintf(s->backend, sizeof s->backend, "cpu");
    snprintf(s->device, sizeof s->device, "cpu");
    s->nhists = 2;
    snprintf(s->hists[0].name, RN_STAT_NAME_LEN, "queue");
    s->hists[0] = (rn_hist){ .count = 6, .p50 = 1023, .p90 = 1500000000, .p99 = 1500000000,
                             .max = 1400000000 };
    snprintf(s->hists[0].name, RN_STAT_NAME_LEN, "queue");
    snprintf(s->hists[1].name, RN_STAT_NAME_LEN, "total");
    for (unsigned i = 0; i < 2; i++) {
        b[i].struct_size = sizeof b[i];
        snprintf(b[i].name, RN_STAT_NAME_LEN, "%s", s->hists[i].name);
        b[i].count = s->hists[i].count;
        b[i].present = with_buckets;
    }
    if (!with_buckets)
        return;
    b[0].nbuckets = 3;
    b[0].buckets[0] = (rn_bucket){ .le_ns = 7, .count = 1 };
    b[0].buckets[1] = (rn_bucket){ .le_ns = 1023, .count = 3 };
    b[0].buckets[2] = (rn_bucket){ .le_ns = 1610612735, .count = 2 };
    b[0].sum_ns = 2000003007;
}

/* The output of fmt as a string (static; valid until the next call). */
static const char *render(rnctl_format fmt, const rn_stats_info *s, const rn_hist_buckets *b)
{
    static char text[1 << 16];
    rnctl_instance in;
    memset(&in, 0, sizeof in);
    snprintf(in.endpoint, sizeof in.endpoint, "ipc:///run/x.sock");
    FILE *f = fmemopen(text, sizeof text, "w");
    assert_non_null(f);
    rnctl_print_stats(f, fmt, s, b, &in);
    assert_int_equal(fclose(f), 0);
    return text;
}

#define HAS(text, s)                                                              \
    do {                                                                          \
        if (!strstr(text, s))                                                     \
            fail_msg("missing: %s\n---- output ----\n%s", s, text);               \
    } while (0)

static void test_prometheus_histogram(void **state)
{
    (void)state;
    static rn_stats_info s;
    static rn_hist_buckets b[RN_MAX_HISTS];
    sample(&s, b, 1);
    const char *t = render(RNCTL_PROMETHEUS, &s, b);
    const char *q = "{endpoint=\"ipc:///run/x.sock\",stage=\"queue\"";
    char line[256];
    HAS(t, "# TYPE rmsnormd_latency_seconds histogram\n");
    /* Cumulative counts at the fixed power-of-two bounds (the same for every
     * daemon, so that series add up), then +Inf = count. */
    const char *want[] = { "_bucket%s,le=\"0.000001023\"} 4\n", "_bucket%s,le=\"1.073741823\"} 4\n",
                           "_bucket%s,le=\"2.147483647\"} 6\n", "_bucket%s,le=\"137.438953471\"} 6\n",
                           "_bucket%s,le=\"+Inf\"} 6\n", "_sum%s} 2.000003007\n", "_count%s} 6\n" };
    for (size_t k = 0; k < sizeof want / sizeof want[0]; k++) {
        char w[200];
        snprintf(w, sizeof w, want[k], q);
        snprintf(line, sizeof line, "rmsnormd_latency_seconds%s", w);
        HAS(t, line);
    }
    /* An empty histogram: +Inf 0, sum 0, count 0. */
    HAS(t, "rmsnormd_latency_seconds_bucket{endpoint=\"ipc:///run/x.sock\",stage=\"total\","
           "le=\"+Inf\"} 0\n");
    HAS(t, "rmsnormd_latency_seconds_sum{endpoint=\"ipc:///run/x.sock\",stage=\"total\"} 0\n");
    /* No bound other than the fixed ones (the daemon's own 7 ns is not one). */
    assert_null(strstr(t, "le=\"0.000000007\""));
    assert_null(strstr(t, "quantile="));
    assert_null(strstr(t, " summary\n"));
    /* The maximum stays a gauge. */
    HAS(t, "# TYPE rmsnormd_latency_max_seconds gauge\n");
    HAS(t, "rmsnormd_latency_max_seconds{endpoint=\"ipc:///run/x.sock\",stage=\"queue\"} "
           "1.400000000\n");
}

static void test_prometheus_older_daemon(void **state)
{
    (void)state;
    static rn_stats_info s;
    static rn_hist_buckets b[RN_MAX_HISTS];
    sample(&s, b, 0);
    const char *t = render(RNCTL_PROMETHEUS, &s, b);
    HAS(t, "# TYPE rmsnormd_latency_seconds summary\n");
    HAS(t, "rmsnormd_latency_seconds{endpoint=\"ipc:///run/x.sock\",stage=\"queue\","
           "quantile=\"0.99\"} 1.500000000\n");
    assert_null(strstr(t, "_bucket"));
    HAS(t, "# TYPE rmsnormd_latency_max_seconds gauge\n");
    /* No buckets at all (b NULL) is the same. */
    assert_string_equal(render(RNCTL_PROMETHEUS, &s, NULL), t);
}

static void test_json_buckets(void **state)
{
    (void)state;
    static rn_stats_info s;
    static rn_hist_buckets b[RN_MAX_HISTS];
    sample(&s, b, 1);
    const char *t = render(RNCTL_JSON, &s, b);
    HAS(t, "\"max_ns\":1400000000,\"sum_ns\":2000003007,\"buckets\":[{\"le_ns\":7,\"count\":1},"
           "{\"le_ns\":1023,\"count\":3},{\"le_ns\":1610612735,\"count\":2}]}");
    HAS(t, "\"total\":{\"count\":0,\"p50_ns\":0,\"p90_ns\":0,\"p99_ns\":0,\"max_ns\":0,"
           "\"sum_ns\":0,\"buckets\":[]}");
    sample(&s, b, 0);
    t = render(RNCTL_JSON, &s, b);
    assert_null(strstr(t, "buckets"));
}

/* Counters that a CPU daemon never sends (the python test checks the ones
 * it does): each has its own help line and its type. */
static void test_prometheus_help_lines(void **state)
{
    static const struct {
        const char *name, *metric, *type;
    } want[] = {
        {"fast.graphs", "rmsnormd_fast_graphs", "gauge"},
        {"fast.deferred", "rmsnormd_fast_deferred_total", "counter"},
        {"fast.polled", "rmsnormd_fast_polled_total", "counter"},
        {"fast.prepared", "rmsnormd_fast_prepared_total", "counter"},
        {"fast.ready_waits", "rmsnormd_fast_ready_waits_total", "counter"},
        {"closes.pending", "rmsnormd_closes_pending", "gauge"},
        {"closes.done", "rmsnormd_closes_done_total", "counter"},
        {"closes.pending_max", "rmsnormd_closes_pending_max", "gauge"},
        {"closes.wait_max_us", "rmsnormd_closes_wait_max_us", "gauge"},
        {"closes.thread", "rmsnormd_closes_thread", "gauge"},
        {"closes.gated", "rmsnormd_closes_gated_total", "counter"},
        {"closes.gated_max_us", "rmsnormd_closes_gated_max_us", "gauge"},
        {"closes.busy_held", "rmsnormd_closes_busy_held_total", "counter"},
        {"closes.streams_pending", "rmsnormd_closes_streams_pending", "gauge"},
        {"closes.streams_spare", "rmsnormd_closes_streams_spare", "gauge"},
        {"regions.ipc_large", "rmsnormd_regions_ipc_large_total", "counter"},
        {"regions.remap_waits", "rmsnormd_regions_remap_waits_total", "counter"},
    };
    static rn_stats_info s;
    static rn_hist_buckets b[RN_MAX_HISTS];
    char line[256];

    (void)state;
    sample(&s, b, 1);
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        snprintf(s.stats[i].name, RN_STAT_NAME_LEN, "%s", want[i].name);
        s.stats[i].value = i;
    }
    s.nstats = sizeof want / sizeof want[0];
    const char *t = render(RNCTL_PROMETHEUS, &s, b);
    assert_null(strstr(t, "The daemon's counter"));
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        snprintf(line, sizeof line, "# HELP %s ", want[i].metric);
        HAS(t, line);
        snprintf(line, sizeof line, "# TYPE %s %s\n", want[i].metric, want[i].type);
        HAS(t, line);
        snprintf(line, sizeof line, "%s{endpoint=\"ipc:///run/x.sock\"} %zu\n", want[i].metric,
                 i);
        HAS(t, line);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_prometheus_histogram),
        cmocka_unit_test(test_prometheus_older_daemon),
        cmocka_unit_test(test_prometheus_help_lines),
        cmocka_unit_test(test_json_buckets),
    };
    return cmocka_run_group_tests_name("rmsnormctl format", tests, NULL, NULL);
}
