/*
 * rmsnormctl - ask rmsnormd for its health and statistics, measure it, and
 * check that it computes the right thing.
 *
 *   rmsnormctl [--endpoint URL] [--timeout MS] COMMAND [OPTIONS]
 *
 * Exit codes: 0 success; 1 a check failed (health degraded, selftest or
 * bench mismatch); 2 daemon unreachable or failing; 64 usage error.
 */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "rmsnorm_client.h"
#include "rmsnormctl_verify.h"

#define EXIT_CHECK       1
#define EXIT_UNREACHABLE 2
#define EXIT_USAGE       64

static const char *g_endpoint; /* NULL: the default endpoint */
static int g_timeout_ms;       /* 0: the library's default */

static const char *prog = "rmsnormctl";

static void usage_main(FILE *f)
{
    fprintf(f,
            "Usage: %s [--endpoint URL] [--timeout MS] COMMAND [OPTIONS]\n"
            "\n"
            "Talk to rmsnormd, the RMSNorm backward daemon.\n"
            "\n"
            "Options:\n"
            "  -e, --endpoint URL   daemon endpoint (default: $RMSNORMD_ENDPOINT, else\n"
            "                       ipc://$RUNTIME_DIRECTORY/rmsnormd.sock, else\n"
            "                       ipc://$XDG_RUNTIME_DIR/rmsnormd.sock, else\n"
            "                       ipc:///tmp/rmsnormd-$UID.sock)\n"
            "  -t, --timeout MS     per-request timeout (default %d)\n"
            "  -h, --help           this text; COMMAND --help for a command's options\n"
            "\n"
            "Commands:\n"
            "  health     daemon health; exit 0 ok, 1 degraded, 2 unreachable or failing\n"
            "  stats      counters and latency histograms (table, --json, --prometheus)\n"
            "  info       what the daemon said at HELLO: backend, device, limits\n"
            "  ping       round-trip times (-c N)\n"
            "  selftest   run a grid of shapes and dtypes and check every result\n"
            "  bench      K processes x R requests, verified, with throughput and latency\n"
            "  version    versions of rmsnormctl, libclient and (if reachable) the daemon\n",
            prog, RN_DEFAULT_TIMEOUT_MS);
}

static int connect_or_complain(rn_client **c)
{
    rn_connect_opts o = {0};
    char ep[256];
    int rv;
    o.endpoint = g_endpoint;
    o.timeout_ms = g_timeout_ms;
    o.client_name = "rmsnormctl";
    rv = rn_connect(&o, c);
    if (rv != 0) {
        if (!g_endpoint && rn_default_endpoint(ep, sizeof ep))
            fprintf(stderr, "%s: cannot reach rmsnormd at %s: %s (%s)\n", prog, ep,
                    rn_last_error(NULL), rn_err_name(rv));
        else
            fprintf(stderr, "%s: cannot reach rmsnormd: %s (%s)\n", prog, rn_last_error(NULL),
                    rn_err_name(rv));
    }
    return rv;
}

static void call_failed(rn_client *c, const char *what, int rv)
{
    fprintf(stderr, "%s: %s failed: %s (%s)\n", prog, what, rn_last_error(c), rn_err_name(rv));
}

/* Exit status for a failure to talk to the daemon. */
static int failure_status(int rv)
{
    return RN_STATUS_GROUP(rv) == 4 || rv == RN_DEVICE_FAILING ? EXIT_UNREACHABLE : EXIT_CHECK;
}

static int wants_help(int argc, char **argv)
{
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0)
            return 1;
    return 0;
}

static int parse_u64(const char *s, const char *what, uint64_t lo, uint64_t hi, uint64_t *out)
{
    char *end;
    unsigned long long v;
    errno = 0;
    if (*s == '-' || *s == '\0')
        goto bad;
    v = strtoull(s, &end, 10);
    if (errno || *end != '\0' || v < lo || v > hi)
        goto bad;
    *out = v;
    return 0;
bad:
    fprintf(stderr, "%s: %s: \"%s\" is not an integer in %" PRIu64 "..%" PRIu64 "\n", prog, what, s,
            lo, hi);
    return -1;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* Nearest-rank percentile of a sorted array. */
static uint64_t pct(const uint64_t *v, size_t n, double p)
{
    size_t k;
    if (n == 0)
        return 0;
    k = (size_t)ceil(p / 100.0 * (double)n);
    if (k < 1)
        k = 1;
    if (k > n)
        k = n;
    return v[k - 1];
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---- health -------------------------------------------------------------------- */

static int cmd_health(int argc, char **argv)
{
    rn_client *c = NULL;
    rn_health_info h;
    static const char *names[] = {"ok", "degraded", "failing"};
    int rv, quiet = 0;

    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            printf("Usage: %s health [-q]\n\nPrint the daemon's health and why it is not ok.\n"
                   "  -q, --quiet   print nothing, only set the exit status\n"
                   "Exit status: 0 ok, 1 degraded, 2 unreachable or failing.\n",
                   prog);
            return 0;
        } else if (strcmp(argv[i], "-q") == 0 || strcmp(argv[i], "--quiet") == 0) {
            quiet = 1;
        } else {
            fprintf(stderr, "%s health: unknown option %s\n", prog, argv[i]);
            return EXIT_USAGE;
        }
    }
    if (connect_or_complain(&c) != 0)
        return EXIT_UNREACHABLE;
    rv = rn_health(c, &h);
    if (rv != 0) {
        call_failed(c, "health", rv);
        rn_close(c);
        return EXIT_UNREACHABLE;
    }
    if (!quiet) {
        printf("%s (backend %s%s)\n", h.state >= 0 && h.state <= 2 ? names[h.state] : "unknown",
               h.backend, h.mps ? ", MPS client" : "");
        for (unsigned i = 0; i < h.nreasons; i++)
            printf("  %s\n", h.reasons[i]);
    }
    rn_close(c);
    return h.state == RN_HEALTH_OK         ? 0
           : h.state == RN_HEALTH_DEGRADED ? EXIT_CHECK
                                           : EXIT_UNREACHABLE;
}

/* ---- stats ---------------------------------------------------------------------- */

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

static int cmd_stats(int argc, char **argv)
{
    enum { TABLE, JSON, PROM } fmt = TABLE;
    const char *outpath = NULL;
    rn_client *c = NULL;
    rn_stats_info *s;
    int rv;
    FILE *f = stdout;
    char tmp[4096];

    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            printf("Usage: %s stats [--json | --prometheus] [-o FILE]\n\n"
                   "Print the daemon's counters and latency histograms.\n"
                   "  --json          one JSON object\n"
                   "  --prometheus    text exposition format (HELP/TYPE lines), for\n"
                   "                  node_exporter's textfile collector\n"
                   "  -o, --output F  write to F atomically (F.tmp, then rename), e.g.\n"
                   "                  /var/lib/node_exporter/textfile/rmsnormd.prom\n",
                   prog);
            return 0;
        } else if (strcmp(argv[i], "--json") == 0) {
            fmt = JSON;
        } else if (strcmp(argv[i], "--prometheus") == 0) {
            fmt = PROM;
        } else if ((strcmp(argv[i], "-o") == 0 || strcmp(argv[i], "--output") == 0) &&
                   i + 1 < argc) {
            outpath = argv[++i];
        } else {
            fprintf(stderr, "%s stats: unknown option %s\n", prog, argv[i]);
            return EXIT_USAGE;
        }
    }
    s = calloc(1, sizeof *s);
    if (s == NULL) {
        fprintf(stderr, "%s: out of memory\n", prog);
        return EXIT_CHECK;
    }
    if (connect_or_complain(&c) != 0) {
        free(s);
        return EXIT_UNREACHABLE;
    }
    rv = rn_stats(c, s);
    if (rv != 0) {
        call_failed(c, "stats", rv);
        rn_close(c);
        free(s);
        return failure_status(rv);
    }
    rn_close(c);
    if (outpath) {
        snprintf(tmp, sizeof tmp, "%s.tmp", outpath);
        f = fopen(tmp, "w");
        if (f == NULL) {
            fprintf(stderr, "%s: cannot write %s: %s\n", prog, tmp, strerror(errno));
            free(s);
            return EXIT_CHECK;
        }
    }
    if (fmt == JSON)
        stats_json(f, s);
    else if (fmt == PROM)
        stats_prometheus(f, s);
    else
        stats_table(f, s);
    free(s);
    if (outpath) {
        if (fclose(f) != 0 || rename(tmp, outpath) != 0) {
            fprintf(stderr, "%s: cannot write %s: %s\n", prog, outpath, strerror(errno));
            unlink(tmp);
            return EXIT_CHECK;
        }
    } else if (fflush(stdout) != 0) {
        return EXIT_CHECK;
    }
    return 0;
}

/* ---- info, version --------------------------------------------------------------------- */

static int cmd_info(int argc, char **argv)
{
    rn_client *c = NULL;
    struct rn_server_info si;
    int rv;
    if (wants_help(argc, argv)) {
        printf("Usage: %s info\n\nPrint what the daemon reports about itself: backend, device,\n"
               "limits.\n",
               prog);
        return 0;
    }
    if (argc > 1) {
        fprintf(stderr, "%s info: unknown option %s\n", prog, argv[1]);
        return EXIT_USAGE;
    }
    if (connect_or_complain(&c) != 0)
        return EXIT_UNREACHABLE;
    rv = rn_server_info(c, &si);
    if (rv != 0) {
        call_failed(c, "info", rv);
        rn_close(c);
        return failure_status(rv);
    }
    printf("endpoint            %s\n", si.endpoint);
    printf("daemon version      %s (protocol %u)\n", si.daemon_version, si.protocol_version);
    printf("backend             %s%s\n", si.backend, si.mps ? " (MPS client)" : "");
    printf("device              %s\n", si.device_name);
    printf("device uuid         ");
    for (int i = 0; i < RN_UUID_LEN; i++)
        printf("%02x%s", si.device_uuid[i], i == 3 || i == 5 || i == 7 || i == 9 ? "-" : "");
    printf("\n");
    if (strcmp(si.backend, "cpu") == 0)
        printf("worker threads      %u\n", si.sm_count);
    else
        printf("SMs                 %u (compute capability %u.%u)\n", si.sm_count, si.cc_major,
               si.cc_minor);
    printf("max sessions        %u\n", si.max_sessions);
    printf("max regions         %u per session\n", si.max_regions);
    printf("max in flight       %u per session, %u in total\n", si.max_inflight,
           si.max_inflight_total);
    printf("max shape           m <= %" PRIu64 ", n <= %u\n", si.max_m, si.max_n);
    printf("max message         %u bytes\n", si.max_msg);
    printf("event slots         %u\n", si.event_slots);
    rn_close(c);
    return 0;
}

static int cmd_version(int argc, char **argv)
{
    rn_client *c = NULL;
    rn_connect_opts o = {0};
    struct rn_server_info si;
    if (wants_help(argc, argv)) {
        printf("Usage: %s version\n\nPrint the versions of rmsnormctl and libclient, and of the\n"
               "daemon when it is reachable.\n",
               prog);
        return 0;
    }
    printf("rmsnormctl %s\nlibclient %s\n", RN_VERSION, rn_version());
    o.endpoint = g_endpoint;
    o.timeout_ms = g_timeout_ms ? g_timeout_ms : 2000;
    o.client_name = "rmsnormctl";
    if (rn_connect(&o, &c) == 0 && rn_server_info(c, &si) == 0)
        printf("rmsnormd %s (protocol %u, backend %s)\n", si.daemon_version, si.protocol_version,
               si.backend);
    else
        printf("rmsnormd unreachable: %s\n", c ? rn_last_error(c) : rn_last_error(NULL));
    rn_close(c);
    return 0;
}

/* ---- ping -------------------------------------------------------------------------------- */

static int cmd_ping(int argc, char **argv)
{
    uint64_t count = 10, *rtt;
    rn_client *c = NULL;
    int rv = 0;
    size_t done = 0;
    double sum = 0;

    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            printf(
                "Usage: %s ping [-c N]\n\nSend N pings (default 10) one after another and print\n"
                "the round-trip percentiles.\n",
                prog);
            return 0;
        } else if ((strcmp(argv[i], "-c") == 0 || strcmp(argv[i], "--count") == 0) &&
                   i + 1 < argc) {
            if (parse_u64(argv[++i], "ping -c", 1, 100000000, &count) != 0)
                return EXIT_USAGE;
        } else {
            fprintf(stderr, "%s ping: unknown option %s\n", prog, argv[i]);
            return EXIT_USAGE;
        }
    }
    rtt = calloc(count, sizeof *rtt);
    if (rtt == NULL) {
        fprintf(stderr, "%s: out of memory for %" PRIu64 " samples\n", prog, count);
        return EXIT_CHECK;
    }
    if (connect_or_complain(&c) != 0) {
        free(rtt);
        return EXIT_UNREACHABLE;
    }
    for (; done < count; done++) {
        if ((rv = rn_ping(c, &rtt[done])) != 0) {
            call_failed(c, "ping", rv);
            break;
        }
        sum += (double)rtt[done];
    }
    rn_close(c);
    if (done > 0) {
        qsort(rtt, done, sizeof *rtt, cmp_u64);
        printf("%zu pings to %s\n", done, g_endpoint ? g_endpoint : "the default endpoint");
        printf("round trip (us): min %.1f  p50 %.1f  p90 %.1f  p99 %.1f  max %.1f  mean %.1f\n",
               (double)rtt[0] / 1e3, (double)pct(rtt, done, 50) / 1e3,
               (double)pct(rtt, done, 90) / 1e3, (double)pct(rtt, done, 99) / 1e3,
               (double)rtt[done - 1] / 1e3, sum / (double)done / 1e3);
    }
    free(rtt);
    return rv == 0 ? 0 : failure_status(rv);
}

/* ---- selftest ------------------------------------------------------------------------------ */

/* Run one case through c (device memory when cuda); 0 if it matches, else
 * prints why. */
static int run_case(rn_client *c, bool cuda, const rnv_case *k, uint64_t seed, bool bitwise,
                    int verbose)
{
    rnv_mem mem;
    rn_bwd_args a;
    rnv_expect e = {0};
    char desc[256], msg[512];
    double rel = 0;
    int rv;

    rnv_describe(k, desc, sizeof desc);
    if ((rv = rnv_mem_alloc(c, cuda, rnv_bytes(k), &mem, msg, sizeof msg)) != 0) {
        printf("FAIL  %s: %s\n", desc, msg);
        return -1;
    }
    rnv_setup(k, mem.host, seed, &a);
    if (rnv_expect_init(&e, &a, 0, msg, sizeof msg) != 0) {
        printf("FAIL  %s: computing the expected result: %s\n", desc, msg);
        rnv_mem_free(c, &mem);
        return -1;
    }
    rv = rnv_mem_run(c, &mem, &a, NULL, msg, sizeof msg);
    if (rv != 0) {
        printf("FAIL  %s: %s\n", desc, msg);
    } else if (rnv_compare(&a, &e, bitwise, &rel, msg, sizeof msg) != 0) {
        printf("FAIL  %s: %s\n", desc, msg);
        rv = -1;
    } else if (verbose) {
        printf("ok    %s (%smax error %.2g of max |value|)\n", desc,
               bitwise ? "bitwise = CPU twin, " : "", rel);
    }
    rnv_expect_fini(&e);
    rnv_mem_free(c, &mem);
    return rv == 0 ? 0 : -1;
}

static int cmd_selftest(int argc, char **argv)
{
    static const rn_dtype dts[] = {RN_DTYPE_BF16, RN_DTYPE_F16, RN_DTYPE_F32};
    static const int64_t shapes[][2] = {{1, 1},     {3, 7},      {17, 128},
                                        {64, 1000}, {300, 4096}, {0, 64}};
    rn_client *c = NULL;
    struct rn_server_info si;
    int verbose = 0, fails = 0, total = 0, rv;
    bool bitwise, cuda;

    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            printf(
                "Usage: %s selftest [-v]\n\nAllocate buffers (shared memory for the CPU backend,\n"
                "device memory for the CUDA backend), submit a grid of shapes and dtypes, and\n"
                "check every result against the CPU twin (bitwise, on the CPU backend) and\n"
                "the fp64 reference.  Exit 0 only if all match.\n"
                "  -v, --verbose   one line per case\n",
                prog);
            return 0;
        } else if (strcmp(argv[i], "-v") == 0 || strcmp(argv[i], "--verbose") == 0) {
            verbose = 1;
        } else {
            fprintf(stderr, "%s selftest: unknown option %s\n", prog, argv[i]);
            return EXIT_USAGE;
        }
    }
    if (connect_or_complain(&c) != 0)
        return EXIT_UNREACHABLE;
    if ((rv = rn_server_info(c, &si)) != 0) {
        call_failed(c, "info", rv);
        rn_close(c);
        return failure_status(rv);
    }
    /* The CPU backend runs the CPU twin itself, so its bits must match; the
     * CUDA backend computes on device memory. */
    bitwise = strcmp(si.backend, "cpu") == 0;
    cuda = strcmp(si.backend, "cuda") == 0;

    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        for (size_t d = 0; d < sizeof dts / sizeof dts[0]; d++) {
            rnv_case k = {0};
            k.m = shapes[s][0];
            k.n = shapes[s][1];
            k.x = k.dy = k.dx = dts[d];
            k.w = dts[(d + 1) % 3];
            k.dw = RN_DTYPE_F32;
            k.rstd = true;
            k.eps = 1e-6f;
            total++;
            fails += run_case(c, cuda, &k, 100 * s + d, bitwise, verbose) != 0;
        }
    }
    /* The optional parts: no weight, recomputed rstd, residual, in place,
     * padded rows, dw in the weight's dtype, weight offset. */
    {
        rnv_case k = {.m = 33,
                      .n = 257,
                      .x = RN_DTYPE_BF16,
                      .dy = RN_DTYPE_BF16,
                      .dx = RN_DTYPE_BF16,
                      .eps = 1e-5f};
        rnv_case variants[6];
        for (int v = 0; v < 6; v++)
            variants[v] = k;
        variants[0].rstd = false;
        variants[1].w = RN_DTYPE_BF16;
        variants[1].dw = RN_DTYPE_BF16;
        variants[1].weight_offset = 1.0f;
        variants[2].dres = RN_DTYPE_F32;
        variants[2].w = RN_DTYPE_F32;
        variants[2].dw = RN_DTYPE_F32;
        variants[3].inplace = true;
        variants[3].rstd = true;
        variants[3].w = RN_DTYPE_F16;
        variants[3].dw = RN_DTYPE_F32;
        variants[4].pad = 7;
        variants[4].x = RN_DTYPE_F32;
        variants[4].dy = RN_DTYPE_F16;
        variants[4].dx = RN_DTYPE_BF16;
        variants[5].m = 2048;
        variants[5].n = 512;
        variants[5].w = RN_DTYPE_F32;
        variants[5].dw = RN_DTYPE_F32;
        for (int v = 0; v < 6; v++) {
            total++;
            fails += run_case(c, cuda, &variants[v], 1000 + (uint64_t)v, bitwise, verbose) != 0;
        }
    }
    rn_close(c);
    printf("selftest: %d of %d cases match (%s backend%s)\n", total - fails, total, si.backend,
           bitwise ? ", bitwise against the CPU twin" : "");
    return fails ? EXIT_CHECK : 0;
}

/* ---- bench ------------------------------------------------------------------------------------
 */

/* What the workers share with the parent (one anonymous shared mapping,
 * created before fork). */
typedef struct bench_worker {
    uint64_t done, failed;
    double t_start, t_end;
    int status; /* 0 ok, else exit status */
    int cuda;   /* the daemon runs the CUDA backend: device memory, checked against fp64 */
    char error[600];
} bench_worker;

typedef struct bench_cfg {
    uint64_t k, r, m, n;
    int dtype;
} bench_cfg;

static void bench_worker_main(const bench_cfg *cfg, int id, bench_worker *me, uint64_t *lat,
                              uint64_t *qlat, uint64_t *clat, int ready_fd, int go_fd)
{
    rn_client *c = NULL;
    rn_connect_opts o = {0};
    rnv_case k = {0};
    rn_bwd_args a;
    rnv_expect e = {0};
    rnv_mem mem = {0};
    struct rn_server_info si;
    char name[64], msg[200], byte = 1;
    bool cuda = false;
    int rv;

    snprintf(name, sizeof name, "rmsnormctl bench %d", id);
    o.endpoint = g_endpoint;
    o.timeout_ms = g_timeout_ms;
    o.client_name = name;
    if ((rv = rn_connect(&o, &c)) != 0) {
        snprintf(me->error, sizeof me->error, "connect: %s (%s)", rn_last_error(NULL),
                 rn_err_name(rv));
        me->status = EXIT_UNREACHABLE;
        goto report;
    }
    k.m = (int64_t)cfg->m;
    k.n = (int64_t)cfg->n;
    k.x = k.dy = k.dx = k.w = (rn_dtype)cfg->dtype;
    k.dw = RN_DTYPE_F32;
    k.rstd = true;
    k.eps = 1e-6f;
    /* A daemon on the CUDA backend computes on device memory. */
    if ((rv = rn_server_info(c, &si)) != 0) {
        snprintf(me->error, sizeof me->error, "info: %s (%s)", rn_last_error(c), rn_err_name(rv));
        me->status = failure_status(rv);
        goto report;
    }
    cuda = strcmp(si.backend, "cuda") == 0;
    me->cuda = cuda;
    if ((rv = rnv_mem_alloc(c, cuda, rnv_bytes(&k), &mem, msg, sizeof msg)) != 0) {
        snprintf(me->error, sizeof me->error, "%s", msg);
        me->status = failure_status(rv);
        goto report;
    }
    rnv_setup(&k, mem.host, (uint64_t)id + 1, &a);
    if (rnv_expect_init(&e, &a, 1, msg, sizeof msg) != 0) {
        snprintf(me->error, sizeof me->error, "expected result: %s", msg);
        me->status = EXIT_CHECK;
        goto report;
    }
report:
    /* Tell the parent we are ready (or failed), then wait for the start. */
    if (write(ready_fd, &byte, 1) != 1)
        _exit(EXIT_CHECK);
    close(ready_fd);
    if (me->status == 0) {
        ssize_t rd;
        do
            rd = read(go_fd, &byte, 1);
        while (rd < 0 && errno == EINTR);
        me->t_start = now_s();
        for (uint64_t i = 0; i < cfg->r; i++) {
            rn_timing t;
            rnv_poison(&a);
            rv = rnv_mem_run(c, &mem, &a, &t, msg, sizeof msg);
            if (rv != 0) {
                if (me->failed == 0)
                    snprintf(me->error, sizeof me->error, "request %" PRIu64 ": %s", i, msg);
                __atomic_add_fetch(&me->failed, 1, __ATOMIC_RELAXED);
            } else if (cuda ? rnv_compare(&a, &e, false, NULL, msg, sizeof msg) != 0
                            : !rnv_equal_twin(&a, &e)) {
                /* The GPU's dx rounds its row sums in another order than
                 * the twin: there the check is against fp64, within the
                 * kernel's tolerance. */
                if (me->failed == 0)
                    snprintf(me->error, sizeof me->error, "request %" PRIu64 ": %s", i,
                             cuda ? msg : "result differs from the CPU twin");
                __atomic_add_fetch(&me->failed, 1, __ATOMIC_RELAXED);
            } else {
                lat[i] = t.total_ns;
                qlat[i] = t.queue_ns;
                clat[i] = t.compute_ns;
            }
            __atomic_add_fetch(&me->done, 1, __ATOMIC_RELAXED);
        }
        me->t_end = now_s();
        if (me->failed)
            me->status = EXIT_CHECK;
    }
    rnv_expect_fini(&e);
    rnv_mem_free(c, &mem);
    rn_close(c);
    _exit(me->status);
}

static int cmd_bench(int argc, char **argv)
{
    bench_cfg cfg = {.k = 4, .r = 1000, .m = 256, .n = 1024, .dtype = RN_DTYPE_BF16};
    size_t shared_bytes;
    char *shm;
    bench_worker *w;
    uint64_t *lat, *qlat, *clat, total_ok = 0, total_failed = 0;
    pid_t *pids;
    int ready[2], go[2], rc = 0, quiet = 0;
    double t0, t1;

    for (int i = 1; i < argc; i++) {
        const char *o = argv[i];
        if (strcmp(o, "--help") == 0 || strcmp(o, "-h") == 0) {
            printf("Usage: %s bench [-k K] [-r R] [--m M] [--n N] [--dtype bf16|f16|f32] [-q]\n\n"
                   "Fork K client processes (default 4) that each send R requests (default\n"
                   "1000) of an M x N backward pass (default 256 x 1024, bf16, fp32 dw) and\n"
                   "verify every result: bitwise against the CPU twin on the CPU backend; on\n"
                   "the CUDA backend, in device memory (copied to the GPU and back around each\n"
                   "call, which the timings include) against fp64 within the kernel's tolerance.\n"
                   "Prints throughput and latency percentiles; a progress line goes to stderr\n"
                   "(-q: none).\n"
                   "Exit status: 0 all verified, 1 a mismatch or error, 2 unreachable.\n",
                   prog);
            return 0;
        }
        if (i + 1 < argc && (strcmp(o, "-k") == 0 || strcmp(o, "--clients") == 0)) {
            if (parse_u64(argv[++i], "bench -k", 1, 256, &cfg.k))
                return EXIT_USAGE;
        } else if (i + 1 < argc && (strcmp(o, "-r") == 0 || strcmp(o, "--requests") == 0)) {
            if (parse_u64(argv[++i], "bench -r", 1, 10000000, &cfg.r))
                return EXIT_USAGE;
        } else if (i + 1 < argc && strcmp(o, "--m") == 0) {
            if (parse_u64(argv[++i], "bench --m", 0, 1u << 24, &cfg.m))
                return EXIT_USAGE;
        } else if (i + 1 < argc && strcmp(o, "--n") == 0) {
            if (parse_u64(argv[++i], "bench --n", 1, 1u << 20, &cfg.n))
                return EXIT_USAGE;
        } else if (i + 1 < argc && strcmp(o, "--dtype") == 0) {
            cfg.dtype = rnv_parse_dtype(argv[++i]);
            if (cfg.dtype <= 0) {
                fprintf(stderr, "%s bench: --dtype: \"%s\" is not bf16, f16 or f32\n", prog,
                        argv[i]);
                return EXIT_USAGE;
            }
        } else if (strcmp(o, "-q") == 0 || strcmp(o, "--quiet") == 0) {
            quiet = 1;
        } else {
            fprintf(stderr, "%s bench: unknown option or missing value: %s\n", prog, o);
            return EXIT_USAGE;
        }
    }

    /* Everything the workers report lives in one shared mapping made before
     * any fork; the parent opens no nanomsg socket at all (nanomsg is not
     * fork-safe once used). */
    shared_bytes = cfg.k * sizeof *w + 3 * cfg.k * cfg.r * sizeof(uint64_t);
    shm = mmap(NULL, shared_bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    pids = calloc(cfg.k, sizeof *pids);
    if (shm == MAP_FAILED || pids == NULL) {
        fprintf(stderr, "%s: out of memory for %" PRIu64 " x %" PRIu64 " samples\n", prog, cfg.k,
                cfg.r);
        free(pids);
        return EXIT_CHECK;
    }
    w = (bench_worker *)shm;
    lat = (uint64_t *)(shm + cfg.k * sizeof *w);
    qlat = lat + cfg.k * cfg.r;
    clat = qlat + cfg.k * cfg.r;
    if (pipe2(ready, O_CLOEXEC) != 0 || pipe2(go, O_CLOEXEC) != 0) {
        fprintf(stderr, "%s: pipe: %s\n", prog, strerror(errno));
        return EXIT_CHECK;
    }
    fflush(NULL);
    for (uint64_t i = 0; i < cfg.k; i++) {
        pid_t p = fork();
        if (p < 0) {
            fprintf(stderr, "%s: fork: %s\n", prog, strerror(errno));
            for (uint64_t j = 0; j < i; j++)
                kill(pids[j], SIGKILL);
            cfg.k = i;
            rc = EXIT_CHECK;
            break;
        }
        if (p == 0) {
            close(ready[0]);
            close(go[1]);
            bench_worker_main(&cfg, (int)i, &w[i], lat + i * cfg.r, qlat + i * cfg.r,
                              clat + i * cfg.r, ready[1], go[0]);
        }
        pids[i] = p;
    }
    close(ready[1]);
    close(go[0]);
    /* Start line: every worker connected and computed its expectation. */
    for (uint64_t i = 0; i < cfg.k; i++) {
        char b;
        ssize_t rd;
        do
            rd = read(ready[0], &b, 1);
        while (rd < 0 && errno == EINTR);
        if (rd != 1)
            break;
    }
    close(ready[0]);
    close(go[1]); /* everyone's read() returns: go */
    t0 = now_s();

    {
        uint64_t total = cfg.k * cfg.r;
        size_t alive = cfg.k;
        struct pollfd none;
        while (alive > 0) {
            int st;
            pid_t p = waitpid(-1, &st, WNOHANG);
            if (p > 0) {
                alive--;
                for (uint64_t i = 0; i < cfg.k; i++)
                    if (pids[i] == p && (!WIFEXITED(st) || WEXITSTATUS(st) != 0) &&
                        w[i].status == 0)
                        w[i].status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
                continue;
            }
            if (p < 0 && errno != EINTR)
                break;
            if (!quiet && isatty(2)) {
                uint64_t d = 0;
                for (uint64_t i = 0; i < cfg.k; i++)
                    d += __atomic_load_n(&w[i].done, __ATOMIC_RELAXED);
                fprintf(stderr, "\rbench: %" PRIu64 "/%" PRIu64 " requests, %.0f/s   ", d, total,
                        (double)d / (now_s() - t0 + 1e-9));
            }
            /* Refresh the progress line a few times a second. */
            poll(&none, 0, 200);
        }
        if (!quiet) {
            uint64_t d = 0;
            for (uint64_t i = 0; i < cfg.k; i++)
                d += w[i].done;
            fprintf(stderr, "\rbench: %" PRIu64 "/%" PRIu64 " requests done%20s\n", d, total, "");
        }
    }
    t1 = now_s();

    {
        double first = 1e300, last = 0;
        uint64_t *all = malloc(cfg.k * cfg.r * sizeof *all);
        uint64_t *qa = malloc(cfg.k * cfg.r * sizeof *qa);
        uint64_t *ca = malloc(cfg.k * cfg.r * sizeof *ca);
        size_t n = 0;
        for (uint64_t i = 0; i < cfg.k; i++) {
            if (w[i].status != 0) {
                fprintf(stderr, "%s: worker %" PRIu64 ": %s\n", prog, i,
                        w[i].error[0] ? w[i].error : "exited with an error");
                if (w[i].status > rc)
                    rc = w[i].status == EXIT_UNREACHABLE ? EXIT_UNREACHABLE : EXIT_CHECK;
            }
            total_failed += w[i].failed;
            total_ok += w[i].done - w[i].failed;
            if (w[i].t_start > 0 && w[i].t_start < first)
                first = w[i].t_start;
            if (w[i].t_end > last)
                last = w[i].t_end;
            for (uint64_t j = 0; all && qa && ca && j < cfg.r; j++)
                if (lat[i * cfg.r + j]) {
                    all[n] = lat[i * cfg.r + j];
                    qa[n] = qlat[i * cfg.r + j];
                    ca[n] = clat[i * cfg.r + j];
                    n++;
                }
        }
        if (last <= first) {
            first = t0;
            last = t1;
        }
        printf("bench: %" PRIu64 " clients x %" PRIu64 " requests, m=%" PRIu64 " n=%" PRIu64
               " %s (w %s, dw f32, rstd given)\n",
               cfg.k, cfg.r, cfg.m, cfg.n, rnv_dtype_name((rn_dtype)cfg.dtype),
               rnv_dtype_name((rn_dtype)cfg.dtype));
        printf("verified: %" PRIu64 " ok, %" PRIu64 " failed (%s)\n", total_ok, total_failed,
               w[0].cuda ? "device memory, against fp64" : "bitwise against the CPU twin");
        if (n > 0) {
            double secs = last - first;
            double bytes =
                3.0 * (double)cfg.m * (double)cfg.n * (cfg.dtype == RN_DTYPE_F32 ? 4.0 : 2.0);
            qsort(all, n, sizeof *all, cmp_u64);
            qsort(qa, n, sizeof *qa, cmp_u64);
            qsort(ca, n, sizeof *ca, cmp_u64);
            printf("throughput: %.0f requests/s over %.2f s (%.2f GB/s of x, dy, dx)\n",
                   (double)n / secs, secs, bytes * (double)n / secs / 1e9);
            printf("latency (us), client round trip: p50 %.1f  p90 %.1f  p99 %.1f  max %.1f\n",
                   (double)pct(all, n, 50) / 1e3, (double)pct(all, n, 90) / 1e3,
                   (double)pct(all, n, 99) / 1e3, (double)all[n - 1] / 1e3);
            printf("latency (us), daemon queue:       p50 %.1f  p90 %.1f  p99 %.1f  max %.1f\n",
                   (double)pct(qa, n, 50) / 1e3, (double)pct(qa, n, 90) / 1e3,
                   (double)pct(qa, n, 99) / 1e3, (double)qa[n - 1] / 1e3);
            printf("latency (us), daemon compute:     p50 %.1f  p90 %.1f  p99 %.1f  max %.1f\n",
                   (double)pct(ca, n, 50) / 1e3, (double)pct(ca, n, 90) / 1e3,
                   (double)pct(ca, n, 99) / 1e3, (double)ca[n - 1] / 1e3);
        }
        free(all);
        free(qa);
        free(ca);
    }
    if (total_failed && rc == 0)
        rc = EXIT_CHECK;
    munmap(shm, shared_bytes);
    free(pids);
    return rc;
}

/* ---- main ---------------------------------------------------------------------------------------
 */

int main(int argc, char **argv)
{
    static const struct option opts[] = {
        {"endpoint", required_argument, NULL, 'e'},
        {"timeout", required_argument, NULL, 't'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    static const struct {
        const char *name;
        int (*fn)(int, char **);
    } cmds[] = {
        {"health", cmd_health},   {"stats", cmd_stats},       {"info", cmd_info},
        {"ping", cmd_ping},       {"selftest", cmd_selftest}, {"bench", cmd_bench},
        {"version", cmd_version},
    };
    int ch;
    uint64_t t;

    /* '+': stop at the command, whose options are its own. */
    while ((ch = getopt_long(argc, argv, "+e:t:h", opts, NULL)) != -1) {
        switch (ch) {
        case 'e':
            g_endpoint = optarg;
            break;
        case 't':
            if (parse_u64(optarg, "--timeout", 1, 86400000, &t) != 0)
                return EXIT_USAGE;
            g_timeout_ms = (int)t;
            break;
        case 'h':
            usage_main(stdout);
            return 0;
        default:
            usage_main(stderr);
            return EXIT_USAGE;
        }
    }
    if (optind >= argc) {
        usage_main(stderr);
        return EXIT_USAGE;
    }
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++)
        if (strcmp(argv[optind], cmds[i].name) == 0)
            return cmds[i].fn(argc - optind, argv + optind);
    if (strcmp(argv[optind], "help") == 0) {
        usage_main(stdout);
        return 0;
    }
    fprintf(stderr, "%s: unknown command \"%s\" (see %s --help)\n", prog, argv[optind], prog);
    return EXIT_USAGE;
}
