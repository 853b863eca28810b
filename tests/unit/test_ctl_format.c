/* SPDX-License-Identifier: MIT */
/*
 * test_ctl_format.c - rmsnormctl's Prometheus and JSON output of latency:
 * histograms with cumulative buckets, exact le bounds, +Inf, _sum and
 * _count where the daemon sends buckets, and the summary of before where it
 * does not (an older daemon).  format.c is compiled into the test, so no
 * daemon is needed for the older daemon's case.  And rmsnormctl(1) documents
 * every statistic format.c and the daemon name.
 */
#include "rn_test.h"

#include <dirent.h>
#include <stdbool.h>
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

/* ---- rmsnormctl(1) documents every statistic ---------------------------------------- */

#define MAX_NAMES 128
typedef struct names {
    char v[MAX_NAMES][RN_STAT_NAME_LEN];
    int n;
} names;

static void names_add(names *ns, const char *s, size_t len)
{
    assert_true(ns->n < MAX_NAMES);
    assert_true(len < RN_STAT_NAME_LEN);
    memcpy(ns->v[ns->n], s, len);
    ns->v[ns->n][len] = '\0';
    ns->n++;
}

static bool names_has(const names *ns, const char *s)
{
    for (int i = 0; i < ns->n; i++)
        if (strcmp(ns->v[i], s) == 0)
            return true;
    return false;
}

/* Each string literal that follows `call` in text: the names the daemon
 * gives (rnd_stats_put(out, "fast.ok", ...)) or format.c prints. */
static void scan_literals(const char *text, const char *call, const char *until, names *out)
{
    size_t cl = strlen(call);
    for (const char *p = strstr(text, call); p; p = strstr(p + 1, call)) {
        const char *b = p + cl;
        size_t len = strcspn(b, until);
        if (len > 0 && strchr(until, b[len]) && b[len] != '\0' && !memchr(b, '%', len))
            names_add(out, b, len);
    }
}

/* The daemon's own counter and histogram names: every literal it hands to
 * rnd_stats_put and put_hist in the .c files of daemon/ and daemon/cuda/. */
static void daemon_names(const char *src, names *counters, names *hists)
{
    static const char *const dirs[] = {"daemon", "daemon/cuda"};
    for (size_t k = 0; k < sizeof dirs / sizeof dirs[0]; k++) {
        char dir[4096], path[8192];
        snprintf(dir, sizeof dir, "%s/%s", src, dirs[k]);
        DIR *d = opendir(dir);
        struct dirent *e;
        if (!d)
            fail_msg("cannot open %s", dir);
        while ((e = readdir(d)) != NULL) {
            size_t l = strlen(e->d_name);
            if (l < 3 || strcmp(e->d_name + l - 2, ".c") != 0)
                continue;
            snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
            char *text = rn_test_read_file(path, NULL);
            if (!text)
                fail_msg("cannot read %s", path);
            scan_literals(text, "rnd_stats_put(out, \"", "\"", counters);
            scan_literals(text, "put_hist(out, \"", "\"", hists);
            free(text);
        }
        closedir(d);
    }
}

/* The metric and the type of the last "# TYPE" line of text. */
static void last_type(const char *text, char *metric, char *type)
{
    const char *p = NULL;
    for (const char *q = strstr(text, "# TYPE "); q; q = strstr(q + 1, "# TYPE "))
        p = q;
    assert_non_null(p);
    assert_int_equal(sscanf(p, "# TYPE %127s %31s", metric, type), 2);
}

static void need_entry(const char *man, const char *entry)
{
    char want[600];
    snprintf(want, sizeof want, "\n%s", entry);
    if (!strstr(man, want))
        fail_msg("systemd/man/rmsnormctl.1 has no entry \"%s\" (its STATISTICS section "
                 "documents every statistic: name, Prometheus name, type, unit, meaning)",
                 entry);
}

/*
 * Every statistic in rmsnormctl(1)'s STATISTICS section, with the name,
 * type and unit line its entries have: each counter of format.c's HELP
 * table with the Prometheus name and type that format.c gives it, each
 * family, each metric format.c prints of its own, and each counter and
 * histogram the daemon sends (which must also have a HELP line or belong
 * to a family); and no entry there for a name nobody sends.
 */
static void test_man_page_documents_every_metric(void **state)
{
    static rn_stats_info s;
    static names dcounters, dhists, fixed, entries;
    char entry[512], metric[128], type[32], path[4096];
    const char *src = getenv("RN_SRC");

    (void)state;
    if (!src)
        RN_SKIP("RN_SRC is not set (run through tests/run.sh)");
    snprintf(path, sizeof path, "%s/systemd/man/rmsnormctl.1", src);
    char *man = rn_test_read_file(path, NULL);
    if (!man)
        fail_msg("cannot read %s", path);
    const char *sec = strstr(man, "\n.SH STATISTICS\n");
    if (!sec)
        fail_msg("%s has no STATISTICS section", path);

    /* The HELP table: each counter as format.c renders it alone. */
    memset(&s, 0, sizeof s);
    s.nstats = 1;
    for (size_t i = 0; i < sizeof counter_help / sizeof counter_help[0]; i++) {
        snprintf(s.stats[0].name, RN_STAT_NAME_LEN, "%s", counter_help[i].name);
        last_type(render(RNCTL_PROMETHEUS, &s, NULL), metric, type);
        snprintf(entry, sizeof entry, "\\fB%s\\fR, \\fB%s\\fR (%s, ", counter_help[i].name, metric,
                 type);
        need_entry(sec, entry);
    }
    /* The families: one metric with a label, its member in italics. */
    for (size_t k = 0; k < sizeof families / sizeof families[0]; k++) {
        snprintf(s.stats[0].name, RN_STAT_NAME_LEN, "%sx", families[k].prefix);
        last_type(render(RNCTL_PROMETHEUS, &s, NULL), metric, type);
        assert_string_equal(type, "counter");
        snprintf(entry, sizeof entry, "\\fB%s\\fI%s\\fR, \\fB%s\\fR (counter, ", families[k].prefix,
                 families[k].label, metric);
        need_entry(sec, entry);
    }
    /* What format.c prints of its own (rmsnormd_up, rmsnormd_info, the
     * latency metrics): each fixed name after a "# HELP ". */
    snprintf(path, sizeof path, "%s/client/ctl/format.c", src);
    char *fmt = rn_test_read_file(path, NULL);
    if (!fmt)
        fail_msg("cannot read %s", path);
    scan_literals(fmt, "# HELP ", " ", &fixed);
    free(fmt);
    assert_true(fixed.n >= 4);
    for (int i = 0; i < fixed.n; i++) {
        snprintf(entry, sizeof entry, "\\fB%s\\fR (", fixed.v[i]);
        need_entry(sec, entry);
    }
    /* The daemon's names: a counter has a HELP line (its entry was checked
     * above) or belongs to a family; a histogram is a stage of the latency. */
    daemon_names(src, &dcounters, &dhists);
    assert_true(dcounters.n >= 30);
    assert_true(dhists.n >= 3);
    for (int i = 0; i < dcounters.n; i++) {
        bool known = false;
        for (size_t k = 0; k < sizeof counter_help / sizeof counter_help[0]; k++)
            known = known || strcmp(counter_help[k].name, dcounters.v[i]) == 0;
        for (size_t k = 0; k < sizeof families / sizeof families[0]; k++)
            known = known ||
                    strncmp(dcounters.v[i], families[k].prefix, strlen(families[k].prefix)) == 0;
        if (!known)
            fail_msg("the daemon sends \"%s\", which format.c's counter_help table lacks "
                     "(and rmsnormctl(1)'s STATISTICS section with it)",
                     dcounters.v[i]);
    }
    for (int i = 0; i < dhists.n; i++) {
        snprintf(entry, sizeof entry,
                 "\\fB%s\\fR, \\fBrmsnormd_latency_seconds{stage=\"%s\"}\\fR (histogram, ",
                 dhists.v[i], dhists.v[i]);
        need_entry(sec, entry);
    }
    /* And the other way: every entry (a .TP tag in bold) names one of them. */
    const char *end = strstr(sec + 1, "\n.SH ");
    for (const char *p = strstr(sec, "\n.TP\n\\fB"); p && (!end || p < end);
         p = strstr(p + 1, "\n.TP\n\\fB")) {
        const char *b = p + strlen("\n.TP\n\\fB");
        size_t len = strcspn(b, "\\");
        char name[RN_STAT_NAME_LEN] = "";
        bool known = false;
        assert_true(len < sizeof name);
        memcpy(name, b, len);
        if (strncmp(b + len, "\\fI", 3) == 0) {
            for (size_t k = 0; k < sizeof families / sizeof families[0]; k++)
                known = known || strcmp(families[k].prefix, name) == 0;
        } else {
            for (size_t k = 0; k < sizeof counter_help / sizeof counter_help[0]; k++)
                known = known || strcmp(counter_help[k].name, name) == 0;
            known = known || names_has(&dhists, name) || names_has(&fixed, name);
        }
        if (!known)
            fail_msg("rmsnormctl(1) documents \"%s\", which neither the daemon nor "
                     "rmsnormctl sends",
                     name);
        names_add(&entries, name, len);
    }
    assert_true(entries.n >= (int)(sizeof counter_help / sizeof counter_help[0]));
    free(man);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_prometheus_histogram),
        cmocka_unit_test(test_prometheus_older_daemon),
        cmocka_unit_test(test_prometheus_help_lines),
        cmocka_unit_test(test_json_buckets),
        cmocka_unit_test(test_man_page_documents_every_metric),
    };
    return cmocka_run_group_tests_name("rmsnormctl format", tests, NULL, NULL);
}
