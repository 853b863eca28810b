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

static void stats_json(FILE *f, const rn_stats_info *s)
{
    fprintf(f, "{\"backend\":");
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
                ",\"p99_ns\":%" PRIu64 ",\"max_ns\":%" PRIu64 "}",
                h->count, h->p50, h->p90, h->p99, h->max);
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
        fprintf(f, "\n%-10s %12s %12s %12s %12s %12s\n", "latency", "count", "p50 us", "p90 us",
                "p99 us", "max us");
        for (unsigned i = 0; i < s->nhists; i++) {
            const rn_hist *h = &s->hists[i];
            fprintf(f, "%-10s %12" PRIu64 " %12.1f %12.1f %12.1f %12.1f\n", h->name, h->count,
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

/* Counters that are gauges: they go down as well as up. */
static int is_gauge(const char *name)
{
    static const char *gauges[] = {"sessions.active", "regions.active", "inflight.current",
                                   "inflight.max", "uptime.seconds"};
    for (size_t i = 0; i < sizeof gauges / sizeof gauges[0]; i++)
        if (strcmp(name, gauges[i]) == 0)
            return 1;
    return strstr(name, ".active") != NULL || strstr(name, ".current") != NULL;
}

/*
 * The text exposition format.  Families whose members differ by one word
 * ("requests.bwd", "errors.OUT_OF_BOUNDS", "replies.ok") become one metric
 * with a label; the rest become one metric each.
 */
static void stats_prometheus(FILE *f, const rn_stats_info *s)
{
    static const struct {
        const char *prefix, *metric, *label, *help;
    } fam[] = {
        {"requests.", "rmsnormd_requests_total", "op", "Requests received, by operation."},
        {"errors.", "rmsnormd_errors_total", "code", "Error replies, by error code."},
        {"replies.", "rmsnormd_replies_total", "result", "Replies sent, by result."},
    };
    char name[128];

    fprintf(f,
            "# HELP rmsnormd_info The daemon's backend and device.\n# TYPE rmsnormd_info gauge\n");
    fprintf(f, "rmsnormd_info{backend=\"");
    prom_label(f, s->backend);
    fprintf(f, "\",device=\"");
    prom_label(f, s->device);
    fprintf(f, "\"} 1\n");

    for (size_t k = 0; k < sizeof fam / sizeof fam[0]; k++) {
        size_t pl = strlen(fam[k].prefix);
        int header = 0;
        for (unsigned i = 0; i < s->nstats; i++) {
            if (strncmp(s->stats[i].name, fam[k].prefix, pl) != 0)
                continue;
            if (!header) {
                fprintf(f, "# HELP %s %s\n# TYPE %s counter\n", fam[k].metric, fam[k].help,
                        fam[k].metric);
                header = 1;
            }
            fprintf(f, "%s{%s=\"", fam[k].metric, fam[k].label);
            prom_label(f, s->stats[i].name + pl);
            fprintf(f, "\"} %" PRIu64 "\n", s->stats[i].value);
        }
    }
    for (unsigned i = 0; i < s->nstats; i++) {
        const char *n = s->stats[i].name;
        int in_family = 0, gauge = is_gauge(n);
        for (size_t k = 0; k < sizeof fam / sizeof fam[0]; k++)
            if (strncmp(n, fam[k].prefix, strlen(fam[k].prefix)) == 0)
                in_family = 1;
        if (in_family)
            continue;
        prom_name(name, sizeof name, n);
        /* Counters end in _total, once ("sessions.total" stays one). */
        size_t nl = strlen(name);
        const char *suffix =
            gauge || (nl >= 6 && strcmp(name + nl - 6, "_total") == 0) ? "" : "_total";
        fprintf(f, "# HELP rmsnormd_%s%s The daemon's statistic \"%s\".\n", name, suffix, n);
        fprintf(f, "# TYPE rmsnormd_%s%s %s\n", name, suffix, gauge ? "gauge" : "counter");
        fprintf(f, "rmsnormd_%s%s %" PRIu64 "\n", name, suffix, s->stats[i].value);
    }
    if (s->nhists) {
        fprintf(f, "# HELP rmsnormd_latency_seconds Request latency by stage (from log-scale "
                   "buckets).\n# TYPE rmsnormd_latency_seconds summary\n");
        for (unsigned i = 0; i < s->nhists; i++) {
            const rn_hist *h = &s->hists[i];
            const struct {
                const char *q;
                uint64_t v;
            } qs[] = {{"0.5", h->p50}, {"0.9", h->p90}, {"0.99", h->p99}, {"1", h->max}};
            for (size_t k = 0; k < 4; k++) {
                fprintf(f, "rmsnormd_latency_seconds{stage=\"");
                prom_label(f, h->name);
                fprintf(f, "\",quantile=\"%s\"} %.9f\n", qs[k].q, (double)qs[k].v / 1e9);
            }
            fprintf(f, "rmsnormd_latency_seconds_count{stage=\"");
            prom_label(f, h->name);
            fprintf(f, "\"} %" PRIu64 "\n", h->count);
        }
    }
}

void rnctl_print_stats(FILE *f, rnctl_format fmt, const rn_stats_info *s)
{
    switch (fmt) {
    case RNCTL_JSON:
        stats_json(f, s);
        break;
    case RNCTL_PROMETHEUS:
        stats_prometheus(f, s);
        break;
    case RNCTL_TABLE:
        stats_table(f, s);
        break;
    }
}
