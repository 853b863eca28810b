/* SPDX-License-Identifier: MIT */
/*
 * format.c - rmsnormctl's one formatter of the daemon's statistics: a table
 * for people, one JSON object for programs, and the Prometheus text
 * exposition format for node_exporter's textfile collector.
 */
#include <ctype.h>
#include <inttypes.h>
#include <string.h>

#include "rmsnormctl.h"

static void json_str(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\')
            fprintf(f, "\\%c", ch);
        else if (ch < 0x20)
            fprintf(f, "\\u%04x", ch);
        else
            fputc(ch, f);
    }
    fputc('"', f);
}

/* The buckets of histogram i, or NULL when the daemon sent none (older than
 * 0.2) or the caller has none. */
static const rn_hist_buckets *buckets_of(const rn_hist_buckets *b, const rn_stats_info *s,
                                         unsigned i)
{
    if (b == NULL || i >= RN_MAX_HISTS || !b[i].present ||
        strcmp(b[i].name, s->hists[i].name) != 0)
        return NULL;
    return &b[i];
}

static void stats_json(FILE *f, const rn_stats_info *s, const rn_hist_buckets *b,
                       const rnctl_instance *in)
{
    fprintf(f, "{\"endpoint\":");
    json_str(f, in->endpoint);
    fprintf(f, ",\"gpu_uuid\":");
    json_str(f, in->gpu_uuid);
    fprintf(f, ",\"backend\":");
    json_str(f, s->backend);
    fprintf(f, ",\"device\":");
    json_str(f, s->device);
    fprintf(f, ",\"counters\":{");
    for (unsigned i = 0; i < s->nstats; i++) {
        fprintf(f, "%s", i ? "," : "");
        json_str(f, s->stats[i].name);
        fprintf(f, ":%" PRIu64, s->stats[i].value);
    }
    fprintf(f, "},\"histograms\":{");
    for (unsigned i = 0; i < s->nhists; i++) {
        const rn_hist *h = &s->hists[i];
        fprintf(f, "%s", i ? "," : "");
        json_str(f, h->name);
        fprintf(f,
                ":{\"count\":%" PRIu64 ",\"p50_ns\":%" PRIu64 ",\"p90_ns\":%" PRIu64
                ",\"p99_ns\":%" PRIu64 ",\"max_ns\":%" PRIu64,
                h->count, h->p50, h->p90, h->p99, h->max);
        /* Each bucket's own count (not cumulative), as the daemon sends it. */
        const rn_hist_buckets *hb = buckets_of(b, s, i);
        if (hb) {
            fprintf(f, ",\"sum_ns\":%" PRIu64 ",\"buckets\":[", hb->sum_ns);
            for (unsigned k = 0; k < hb->nbuckets; k++)
                fprintf(f, "%s{\"le_ns\":%" PRIu64 ",\"count\":%" PRIu64 "}", k ? "," : "",
                        hb->buckets[k].le_ns, hb->buckets[k].count);
            fprintf(f, "]");
        }
        fprintf(f, "}");
    }
    fprintf(f, "}}\n");
}

static void stats_table(FILE *f, const rn_stats_info *s)
{
    fprintf(f, "backend  %s\ndevice   %s\n\n", s->backend, s->device);
    fprintf(f, "%-40s %20s\n", "counter", "value");
    for (unsigned i = 0; i < s->nstats; i++)
        fprintf(f, "%-40s %20" PRIu64 "\n", s->stats[i].name, s->stats[i].value);
    if (s->nhists) {
        /* The daemon's percentiles are the upper bounds of its log-scale
         * buckets (within 1/8 above the true value); the maximum is exact.
         * Say so: rmsnormctl ping and bench print exact percentiles. */
        fprintf(f, "\nlatency since start; p50, p90, p99: upper bounds of log-scale buckets; "
                   "max: exact\n");
        fprintf(f, "%-12s %12s %12s %12s %12s %12s\n", "stage", "count", "p50 <= us",
                "p90 <= us", "p99 <= us", "max us");
        for (unsigned i = 0; i < s->nhists; i++) {
            const rn_hist *h = &s->hists[i];
            fprintf(f, "%-12s %12" PRIu64 " %12.1f %12.1f %12.1f %12.1f\n", h->name, h->count,
                    (double)h->p50 / 1e3, (double)h->p90 / 1e3, (double)h->p99 / 1e3,
                    (double)h->max / 1e3);
        }
    }
}

/* Prometheus metric names allow [a-zA-Z0-9_:]. */
static void prom_name(char *out, size_t len, const char *s)
{
    size_t i = 0;
    for (; *s && i + 1 < len; s++)
        out[i++] = (isalnum((unsigned char)*s) || *s == '_') ? *s : '_';
    out[i] = '\0';
}

static void prom_label(FILE *f, const char *s)
{
    for (; *s; s++) {
        if (*s == '\\' || *s == '"')
            fprintf(f, "\\%c", *s);
        else if (*s == '\n')
            fprintf(f, "\\n");
        else
            fputc(*s, f);
    }
}

/* What each of the daemon's counters means, for the HELP lines.  rmsnormctl(1)'s
 * STATISTICS section has an entry for each, with its type and unit, and for
 * each family, histogram and metric of rmsnormctl's own (test_ctl_format's
 * test_man_page_documents_every_metric fails without). */
static const struct {
    const char *name, *help;
} counter_help[] = {
    {"bytes.processed", "Bytes of x, dy and dx that backward passes read and wrote."},
    {"sessions.active", "Client sessions open now."},
    {"sessions.total", "Client sessions opened since the daemon started."},
    {"sessions.expired", "Sessions the daemon ended because their client stopped renewing them."},
    {"regions.active", "Shared memory regions registered by clients now."},
    {"inflight.current", "Requests received and not yet answered, now."},
    {"inflight.max", "The most requests in flight at once since the daemon started."},
    {"uptime.seconds", "Seconds since the daemon started."},
    {"busy.rejected", "Requests refused with BUSY at a limit."},
    {"dup.answered", "Retried requests answered from the duplicate window, not run again."},
    {"clients.died", "Client processes that died with a session open."},
    {"front.restarts", "Restarts of the daemon's front process (the nanomsg socket's owner)."},
    {"sessions.unauthenticated",
     "Sessions open now whose client has not yet proved itself on the session channel."},
    {"channel.evicted",
     "Session channel connections not yet authenticated that were closed for a new one at the "
     "limit (those of the user holding the most)."},
    {"channel.refused",
     "Session channel connections refused at accept: every one held was authenticated, or the "
     "daemon was draining."},
    {"sessions.unauth_ended",
     "Sessions the daemon ended because their client never authenticated in time, or to make "
     "room for a new client at the session limit."},
    {"fast.slots", "Fast-path ring slots answered (fast.ok + fast.errors)."},
    {"fast.ok", "Fast-path ring slots that ran successfully."},
    {"fast.errors", "Fast-path ring slots answered with an error status."},
    {"fast.rings", "Fast-path rings open now."},
    {"fast.graphs", "Fast-path graph slots (captured CUDA graphs) open now."},
    {"fast.deferred",
     "Times a fast-path slot or graph replay was left in its ring at a limit, to be taken later."},
    {"fast.polled", "Ring slots the daemon's loop took while polling after a slot (--ring-spin-us)."},
    {"fast.bells", "Wake-ups of the daemon's loop by a session's bell (a slot published while it slept)."},
    {"fast.prepared", "Ring slots prepared (decoded, validated, pinned) before their ready word came."},
    {"fast.ready_waits",
     "Ring slots left in their ring until their inputs were ready (--ring-ready=host)."},
    {"fast.armed", "Ring slots queued before their inputs were ready (--ring-ready=armed)."},
    {"fast.revoked", "Armed ring slots the daemon took back, to take again (--ring-ready=armed)."},
    {"fast.revokes", "Times the daemon took a ring's armed slots back (--ring-ready=armed)."},
    {"closes.pending", "Released GPU mappings and ring memory not closed yet."},
    {"closes.done", "Released GPU mappings and ring memory closed since the daemon started."},
    {"closes.pending_max", "The most released mappings waiting to be closed at once."},
    {"closes.wait_max_us", "The longest from a mapping's release to its close, in microseconds."},
    {"closes.thread", "1 when released mappings close on the closer thread, 0 on the loop."},
    {"closes.gated",
     "Times the closer's gate held closes: a stream waited on a client's late inputs, or the "
     "daemon's own GPU work allowed no quiet moment."},
    {"closes.busy_held",
     "Looks of the closer's gate that held a close for a quiet moment of the daemon's GPU work."},
    {"closes.gated_max_us",
     "The longest the closer's gate held closes (the current hold included), in microseconds."},
    {"closes.streams_pending",
     "Streams of ended sessions whose give-back waits for the closer's gate."},
    {"closes.streams_spare", "Streams of ended sessions' rings kept idle for the next rings."},
    {"regions.ipc_large",
     "CUDA IPC allocations over 512 MiB mapped; the kernel can run slower on tensors inside them."},
    {"regions.remap_waits",
     "Registrations that waited for released mappings of the same memory to close."},
};

/* Counters that are gauges: they go down as well as up. */
static int is_gauge(const char *name)
{
    static const char *gauges[] = {
        "sessions.active",     "regions.active",           "inflight.current",   "inflight.max",
        "uptime.seconds",      "sessions.unauthenticated", "fast.rings",         "fast.graphs",
        "closes.pending",      "closes.pending_max",       "closes.wait_max_us", "closes.thread",
        "closes.gated_max_us", "closes.streams_pending",   "closes.streams_spare"};
    for (size_t i = 0; i < sizeof gauges / sizeof gauges[0]; i++)
        if (strcmp(name, gauges[i]) == 0)
            return 1;
    return strstr(name, ".active") != NULL || strstr(name, ".current") != NULL;
}

/*
 * The labels every sample carries, so that the series of two daemons (one
 * .prom file per GPU in node_exporter's textfile folder) never collide:
 * the endpoint, and the GPU's UUID where the daemon has a GPU.
 */
static void prom_instance(FILE *f, const rnctl_instance *in)
{
    fprintf(f, "endpoint=\"");
    prom_label(f, in->endpoint);
    fputc('"', f);
    if (in->gpu_uuid[0]) {
        fprintf(f, ",gpu_uuid=\"");
        prom_label(f, in->gpu_uuid);
        fputc('"', f);
    }
}

/* rmsnormd_up: 1 with the statistics, 0 in their place (rnctl_print_down). */
static void prom_up(FILE *f, const rnctl_instance *in, int up)
{
    fprintf(f, "# HELP rmsnormd_up Whether rmsnormctl could read the daemon's statistics.\n"
               "# TYPE rmsnormd_up gauge\n"
               "rmsnormd_up{");
    prom_instance(f, in);
    fprintf(f, "} %d\n", up);
}

/* Nanoseconds as seconds, exactly: the decimal digits of ns / 10^9 without
 * trailing zeros, so that an le bound is the daemon's bound to the digit. */
static void prom_seconds(FILE *f, uint64_t ns)
{
    char frac[10];
    int n = 9;
    snprintf(frac, sizeof frac, "%09" PRIu64, ns % 1000000000u);
    while (n > 0 && frac[n - 1] == '0')
        frac[--n] = '\0';
    fprintf(f, "%" PRIu64 "%s%s", ns / 1000000000u, n ? "." : "", frac);
}

/* One latency sample's name and labels, up to the value: NAME{instance,stage="..."[,le="]. */
static void prom_stage(FILE *f, const char *metric, const rnctl_instance *in, const char *stage)
{
    fprintf(f, "%s{", metric);
    prom_instance(f, in);
    fprintf(f, ",stage=\"");
    prom_label(f, stage);
    fputc('"', f);
}

/*
 * The latency histograms as Prometheus histograms: cumulative counts at
 * fixed bounds, +Inf, the sum and the count.  The bounds are the same in
 * every daemon's output, so that series add up across daemons (a sum by le)
 * as well as over time, unlike the percentiles of a summary: each power of
 * two of nanoseconds less one, from 2^10 - 1 (about 1 us) to 2^37 - 1 (about
 * 137 s).  The daemon's log-scale buckets (merged or not) never straddle such
 * a bound, so every cumulative count is exact.
 */
#define PROM_FIRST_POW 10
#define PROM_LAST_POW 37
static void prom_histograms(FILE *f, const rn_stats_info *s, const rn_hist_buckets *b,
                            const rnctl_instance *in)
{
    fprintf(f, "# HELP rmsnormd_latency_seconds Request latency by stage (queue: receipt to "
               "start of compute; compute; total), at power-of-two bounds.\n"
               "# TYPE rmsnormd_latency_seconds histogram\n");
    for (unsigned i = 0; i < s->nhists; i++) {
        const rn_hist_buckets *hb = &b[i];
        uint64_t cum = 0;
        unsigned k = 0;
        for (unsigned e = PROM_FIRST_POW; e <= PROM_LAST_POW; e++) {
            uint64_t le = ((uint64_t)1 << e) - 1;
            while (k < hb->nbuckets && hb->buckets[k].le_ns <= le)
                cum += hb->buckets[k++].count;
            prom_stage(f, "rmsnormd_latency_seconds_bucket", in, s->hists[i].name);
            fprintf(f, ",le=\"");
            prom_seconds(f, le);
            fprintf(f, "\"} %" PRIu64 "\n", cum);
        }
        prom_stage(f, "rmsnormd_latency_seconds_bucket", in, s->hists[i].name);
        fprintf(f, ",le=\"+Inf\"} %" PRIu64 "\n", hb->count);
        prom_stage(f, "rmsnormd_latency_seconds_sum", in, s->hists[i].name);
        fprintf(f, "} ");
        prom_seconds(f, hb->sum_ns);
        fprintf(f, "\n");
        prom_stage(f, "rmsnormd_latency_seconds_count", in, s->hists[i].name);
        fprintf(f, "} %" PRIu64 "\n", hb->count);
    }
}

/* The families of counters that become one Prometheus metric with a label
 * (stats_prometheus). */
static const struct {
    const char *prefix, *metric, *label, *help;
} families[] = {
    {"requests.", "rmsnormd_requests_total", "op",
     "Requests received since the daemon started, by operation."},
    {"errors.", "rmsnormd_errors_total", "code",
     "Error replies sent and fast-path slots answered with an error, by error code."},
    {"replies.", "rmsnormd_replies_total", "result", "Replies sent, by result."},
};

/*
 * The text exposition format.  Families whose members differ by one word
 * ("requests.bwd", "errors.OUT_OF_BOUNDS", "replies.ok") become one metric
 * with a label; the rest become one metric each.  The latency histograms
 * become Prometheus histograms of the daemon's buckets where the daemon
 * sends them (0.2 on), and the maximum a separate gauge.  An older daemon
 * sends only percentiles estimated from its buckets: then they become a
 * summary (p50, p90, p99 and the count), as before, beside the same gauge,
 * because a quantile="1" sample cannot be aggregated across daemons.
 */
static void stats_prometheus(FILE *f, const rn_stats_info *s, const rn_hist_buckets *b,
                             const rnctl_instance *in)
{
    char name[128];

    prom_up(f, in, 1);
    fprintf(f, "# HELP rmsnormd_info The daemon's backend and device; the value is always 1.\n"
               "# TYPE rmsnormd_info gauge\n");
    fprintf(f, "rmsnormd_info{");
    prom_instance(f, in);
    fprintf(f, ",backend=\"");
    prom_label(f, s->backend);
    fprintf(f, "\",device=\"");
    prom_label(f, s->device);
    fprintf(f, "\"} 1\n");

    for (size_t k = 0; k < sizeof families / sizeof families[0]; k++) {
        size_t pl = strlen(families[k].prefix);
        int header = 0;
        for (unsigned i = 0; i < s->nstats; i++) {
            if (strncmp(s->stats[i].name, families[k].prefix, pl) != 0)
                continue;
            if (!header) {
                fprintf(f, "# HELP %s %s\n# TYPE %s counter\n", families[k].metric,
                        families[k].help, families[k].metric);
                header = 1;
            }
            fprintf(f, "%s{", families[k].metric);
            prom_instance(f, in);
            fprintf(f, ",%s=\"", families[k].label);
            prom_label(f, s->stats[i].name + pl);
            fprintf(f, "\"} %" PRIu64 "\n", s->stats[i].value);
        }
    }
    for (unsigned i = 0; i < s->nstats; i++) {
        const char *n = s->stats[i].name, *help = NULL;
        int in_family = 0, gauge = is_gauge(n);
        for (size_t k = 0; k < sizeof families / sizeof families[0]; k++)
            if (strncmp(n, families[k].prefix, strlen(families[k].prefix)) == 0)
                in_family = 1;
        if (in_family)
            continue;
        for (size_t k = 0; k < sizeof counter_help / sizeof counter_help[0]; k++)
            if (strcmp(n, counter_help[k].name) == 0)
                help = counter_help[k].help;
        prom_name(name, sizeof name, n);
        /* Counters end in _total, once ("sessions.total" stays one). */
        size_t nl = strlen(name);
        const char *suffix =
            gauge || (nl >= 6 && strcmp(name + nl - 6, "_total") == 0) ? "" : "_total";
        if (help)
            fprintf(f, "# HELP rmsnormd_%s%s %s\n", name, suffix, help);
        else
            fprintf(f, "# HELP rmsnormd_%s%s The daemon's counter \"%s\".\n", name, suffix, n);
        fprintf(f, "# TYPE rmsnormd_%s%s %s\n", name, suffix, gauge ? "gauge" : "counter");
        fprintf(f, "rmsnormd_%s%s{", name, suffix);
        prom_instance(f, in);
        fprintf(f, "} %" PRIu64 "\n", s->stats[i].value);
    }
    /* One metric has one type: a histogram only when every stage has its
     * buckets. */
    int all_buckets = s->nhists > 0;
    for (unsigned i = 0; i < s->nhists; i++)
        if (buckets_of(b, s, i) == NULL)
            all_buckets = 0;
    if (all_buckets) {
        prom_histograms(f, s, b, in);
    } else if (s->nhists) {
        fprintf(f, "# HELP rmsnormd_latency_seconds Request latency by stage (queue: receipt to "
                   "start of compute; compute; total), percentiles estimated from the daemon's "
                   "log-scale buckets (each an upper bound).\n"
                   "# TYPE rmsnormd_latency_seconds summary\n");
        for (unsigned i = 0; i < s->nhists; i++) {
            const rn_hist *h = &s->hists[i];
            const struct {
                const char *q;
                uint64_t v;
            } qs[] = {{"0.5", h->p50}, {"0.9", h->p90}, {"0.99", h->p99}};
            for (size_t k = 0; k < sizeof qs / sizeof qs[0]; k++) {
                fprintf(f, "rmsnormd_latency_seconds{");
                prom_instance(f, in);
                fprintf(f, ",stage=\"");
                prom_label(f, h->name);
                fprintf(f, "\",quantile=\"%s\"} %.9f\n", qs[k].q, (double)qs[k].v / 1e9);
            }
            fprintf(f, "rmsnormd_latency_seconds_count{");
            prom_instance(f, in);
            fprintf(f, ",stage=\"");
            prom_label(f, h->name);
            fprintf(f, "\"} %" PRIu64 "\n", h->count);
        }
    }
    if (s->nhists) {
        fprintf(f, "# HELP rmsnormd_latency_max_seconds The largest request latency by stage "
                   "since the daemon started (exact).\n"
                   "# TYPE rmsnormd_latency_max_seconds gauge\n");
        for (unsigned i = 0; i < s->nhists; i++) {
            fprintf(f, "rmsnormd_latency_max_seconds{");
            prom_instance(f, in);
            fprintf(f, ",stage=\"");
            prom_label(f, s->hists[i].name);
            fprintf(f, "\"} %.9f\n", (double)s->hists[i].max / 1e9);
        }
    }
}

void rnctl_print_stats(FILE *f, rnctl_format fmt, const rn_stats_info *s,
                       const rn_hist_buckets *b, const rnctl_instance *in)
{
    switch (fmt) {
    case RNCTL_JSON:
        stats_json(f, s, b, in);
        break;
    case RNCTL_PROMETHEUS:
        stats_prometheus(f, s, b, in);
        break;
    case RNCTL_TABLE:
        stats_table(f, s);
        break;
    }
}

void rnctl_print_down(FILE *f, const rnctl_instance *in)
{
    prom_up(f, in, 0);
}
