/* SPDX-License-Identifier: MIT */
/*
 * cmd_stats.c - rmsnormctl stats: the daemon's counters and latency
 * histograms, as a table, JSON or Prometheus text (format.c), to stdout or
 * atomically to a file.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "rmsnormctl.h"

/* -o's file, written atomically: opened as outpath.tmp (tmp), then put in
 * place.  NULL / non-zero after saying why. */
static FILE *open_tmp(const char *outpath, char *tmp, size_t len)
{
    snprintf(tmp, len, "%s.tmp", outpath);
    FILE *f = fopen(tmp, "w");
    if (f == NULL)
        fprintf(stderr, "%s: cannot write %s: %s\n", RNCTL_PROG, tmp, strerror(errno));
    return f;
}

static int put_in_place(FILE *f, const char *tmp, const char *outpath)
{
    if (fclose(f) != 0 || rename(tmp, outpath) != 0) {
        fprintf(stderr, "%s: cannot write %s: %s\n", RNCTL_PROG, outpath, strerror(errno));
        unlink(tmp);
        return -1;
    }
    return 0;
}

/* The daemon's statistics could not be read: a Prometheus file given with
 * -o gets rmsnormd_up 0 in place of its last values (left there, a scraper
 * went on exporting them as if the daemon were up).  Returns status. */
static int down(const rnctl_globals *g, rnctl_format fmt, const char *outpath, int status)
{
    rnctl_instance in;
    char tmp[4096];
    FILE *f;

    if (!outpath || fmt != RNCTL_PROMETHEUS || !(f = open_tmp(outpath, tmp, sizeof tmp)))
        return status;
    rnctl_instance_local(g, &in);
    rnctl_print_down(f, &in);
    (void)put_in_place(f, tmp, outpath);
    return status;
}

int rnctl_stats(const rnctl_globals *g, int argc, char **argv)
{
    rnctl_format fmt = RNCTL_TABLE;
    const char *fmt_opt = NULL;
    rnctl_instance in;
    const char *outpath = NULL;
    rn_client *c = NULL;
    rn_stats_info *s;
    rn_hist_buckets *b;
    int rv;
    FILE *f = stdout;
    char tmp[4096];

    for (int i = 1; i < argc; i++) {
        if (rnctl_is_help(argv[i])) {
            printf("Usage: %s stats [--json | --prometheus] [-o FILE]\n\n"
                   "Print the daemon's counters and latency histograms.\n"
                   "  --json          one JSON object\n"
                   "  --prometheus    text exposition format (HELP/TYPE lines), for\n"
                   "                  node_exporter's textfile collector; every series is\n"
                   "                  labelled with the endpoint and the GPU's UUID, so one\n"
                   "                  file per daemon never collides\n"
                   "  -o, --output F  write to F atomically (F.tmp, then rename), e.g.\n"
                   "                  /var/lib/node_exporter/textfile/rmsnormd.prom\n",
                   RNCTL_PROG);
            return 0;
        } else if (strcmp(argv[i], "--json") == 0 || strcmp(argv[i], "--prometheus") == 0) {
            /* Two formats at once is a mistake, not a choice of the last. */
            if (fmt_opt && strcmp(fmt_opt, argv[i]) != 0)
                return rnctl_usage_error("stats", "%s and %s: choose one format", fmt_opt,
                                         argv[i]);
            fmt_opt = argv[i];
            fmt = strcmp(argv[i], "--json") == 0 ? RNCTL_JSON : RNCTL_PROMETHEUS;
        } else if (strcmp(argv[i], "-o") == 0 || strcmp(argv[i], "--output") == 0) {
            if (i + 1 >= argc)
                return rnctl_usage_error("stats", "%s needs a file name", argv[i]);
            outpath = argv[++i];
        } else {
            return rnctl_unknown_option("stats", argv[i]);
        }
    }
    s = calloc(1, sizeof *s);
    b = calloc(RN_MAX_HISTS, sizeof *b);
    if (s == NULL || b == NULL) {
        fprintf(stderr, "%s: out of memory\n", RNCTL_PROG);
        free(s);
        free(b);
        return EXIT_CHECK;
    }
    if (rnctl_connect(g, &c) != 0) {
        free(s);
        free(b);
        return down(g, fmt, outpath, EXIT_UNREACHABLE);
    }
    /* One STATS reply for the summaries and the buckets, so they agree. */
    rv = rn_stats_hist_buckets(c, s, b, RN_MAX_HISTS);
    if (rv != 0) {
        rnctl_call_failed(c, "stats", rv);
        rn_close(c);
        free(s);
        free(b);
        return down(g, fmt, outpath, rnctl_failure_status(rv));
    }
    /* The instance labels cost a HELLO (a session opened and closed): only
     * the machine-read formats carry them. */
    if (fmt != RNCTL_TABLE)
        rnctl_instance_of(c, g, &in);
    else
        memset(&in, 0, sizeof in);
    rn_close(c);
    if (outpath && !(f = open_tmp(outpath, tmp, sizeof tmp))) {
        free(s);
        free(b);
        return EXIT_CHECK;
    }
    rnctl_print_stats(f, fmt, s, b, &in);
    free(s);
    free(b);
    if (outpath) {
        if (put_in_place(f, tmp, outpath) != 0)
            return EXIT_CHECK;
    } else if (fflush(stdout) != 0) {
        return EXIT_CHECK;
    }
    return 0;
}
