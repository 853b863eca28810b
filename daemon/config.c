/* SPDX-License-Identifier: MIT */
/*
 * config.c - defaults, flags and the configuration file.  Flags and file keys
 * go through one setter, so a value means the same wherever it comes from and
 * every error names its key (and, for the file, its line).
 */
#include "config.h"

#include <errno.h>
#include <ctype.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "log.h"

#ifndef RN_VERSION
#define RN_VERSION "0.0.0"
#endif

/* One row per setting: the long flag name, whether it takes a value, and the
 * --help text with its default. */
typedef struct flag_def {
    const char *name;
    const char *arg;   /* NULL: a switch without a value */
    const char *help;
} flag_def;

static const flag_def flags[] = {
    {"endpoint", "URL", "ipc:// endpoint to bind (default: ipc://$RUNTIME_DIRECTORY/rmsnormd.sock,\n"
                        "                          else ipc://$XDG_RUNTIME_DIR/rmsnormd.sock, else\n"
                        "                          ipc:///tmp/rmsnormd-$UID.sock)"},
    {"backend", "auto|cuda|cpu", "compute backend (default auto: cuda if a usable device, else cpu)"},
    {"device", "INDEX|UUID", "CUDA device (default 0)"},
    {"socket-mode", "OCTAL", "permissions of the socket file (default 0660)"},
    {"socket-group", "NAME", "group of the socket file (default: unchanged)"},
    {"max-sessions", "N", "client sessions at once (default 64)"},
    {"max-sessions-per-uid", "N", "sessions of one verified user at once (default: a quarter of\n"
                                  "                          max-sessions, at least 1)"},
    {"auth-timeout", "SEC", "end a session not authenticated on the session channel this\n"
                            "                          long after its HELLO (default 10; 0 = never, for\n"
                            "                          old clients)"},
    {"allow-shm-names", NULL, "accept REGISTER of shared memory by name over nanomsg, for old\n"
                              "                          clients: the daemon opens the name with its own\n"
                              "                          privileges (default no; --allow-shm-names=yes|no,\n"
                              "                          in the file: yes|no)"},
    {"max-connections", "N", "client connections to the socket at once; more are refused at\n"
                             "                          once (default 1024)"},
    {"spin-us", "US", "after a request, poll this long before sleeping (default 100 on\n"
                      "                          hosts with 4 or more CPUs, else 0: never spin)"},
    {"max-regions", "N", "registered regions per session (default 4096)"},
    {"max-mapped-gib", "N", "GiB of regions one session may have mapped (default 1024)"},
    {"max-mappings", "N", "regions mapped at once in all (default 0: vm.max_map_count less an\n"
                          "                          eighth for the daemon itself); one client\n"
                          "                          process may hold a quarter of them"},
    {"max-inflight", "N", "requests in flight per session (default 64)"},
    {"max-inflight-total", "N", "requests in flight in all (default 1024)"},
    {"max-inflight-per-uid", "N", "requests in flight of one verified user's sessions (default:\n"
                                  "                          half of max-inflight-total; root and the\n"
                                  "                          daemon's own user are not counted)"},
    {"max-graphs", "N", "graph slots (calls captured into CUDA graphs on the fast path)\n"
                        "                          open at once in all; the daemon polls each\n"
                        "                          every 20 us (default 4096; 0: none)"},
    {"ring-spin-us", "US", "after a ring slot the loop polls the rings this long before it\n"
                           "                          sleeps (default 1000 on hosts with 4 or more\n"
                           "                          CPUs, else 0: never; a core while calls come)"},
    {"ring-ready", "auto|gpu|host|armed", "fast path: who waits for a slot's inputs (its\n"
                                    "                          ready word): gpu (the daemon's stream waits on\n"
                                    "                          it), host (the ring thread polls it and submits\n"
                                    "                          only ready slots: no stream waits on a client),\n"
                                    "                          armed (a slot of a ring whose client writes go\n"
                                    "                          is queued at once; its wait on ready has a bit\n"
                                    "                          the daemon sets to take it back), auto (cuda:\n"
                                    "                          armed under MPS, else host; cpu: gpu)\n"
                                    "                          (default auto)"},
    {"max-m", "N", "largest M (rows) of a request (default 16777216)"},
    {"max-n", "N", "largest N (columns) of a request (default 262144)"},
    {"idle-timeout", "SEC", "end a session idle this long (default 600; 0 = never)"},
    {"threads", "N", "CPU backend worker threads (default: online CPUs)"},
    {"log-level", "LEVEL", "debug|info|notice|warning|error (default info)"},
    {"kernel-deadline-ms", "MS", "cuda: a kernel running longer fails the device (default 60000)"},
    {"cuda-fast-path", NULL, "cuda: offer the fast path (a ring of slots, PROTOCOL.md\n"
                              "                          section 13) where the device has 64-bit stream\n"
                              "                          memory operations (default yes;\n"
                              "                          --cuda-fast-path=no, or no in the file: off)"},
    {"debug-force-grid", "N", "cuda, debugging: launch every kernel with N CTAs (default 0: the\n"
                              "                          plan's; same results, far slower)"},
    {"debug-fail-after", "N", "debugging: the Nth request fails the backend as a broken device\n"
                              "                          would (default 0: never); for failure tests"},
    {"config", "FILE", "configuration file (default " RND_DEFAULT_CONFIG ", skipped if missing)"},
    {"version", NULL, "print the version and exit"},
    {"help", NULL, "print this help and exit"},
};
#define NFLAGS (sizeof flags / sizeof flags[0])

void rnd_config_defaults(rnd_config *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->backend = RND_BACKEND_AUTO;
    snprintf(cfg->device, sizeof cfg->device, "0");
    cfg->socket_mode = 0660;
    cfg->max_sessions = 64;
    cfg->max_regions = 4096;
    cfg->max_mapped_gib = 1024;
    cfg->max_inflight = 64;
    cfg->max_inflight_total = 1024;
    cfg->max_graphs = 4096;
    cfg->max_m = 16777216;
    cfg->max_n = 262144;
    cfg->idle_timeout = 600;
    cfg->auth_timeout = 10;
    cfg->max_connections = 1024;
    cfg->cuda_fast_path = true;
    cfg->spin_us = -1;
    cfg->ring_spin_us = -1;
    cfg->threads = 0;
    cfg->log_level = RND_LOG_INFO;
    cfg->kernel_deadline_ms = 60000;
}

/* Keys compare with '-' and '_' ignored and leading dashes skipped, so
 * "--max-sessions", "max-sessions", "max_sessions" and "maxsessions" are
 * one key (no two settings differ only in their dashes). */
static const flag_def *find_flag(const char *key, size_t keylen)
{
    while (keylen > 0 && *key == '-')
        key++, keylen--;
    for (size_t i = 0; i < NFLAGS; i++) {
        const char *n = flags[i].name;
        size_t j = 0;
        for (;;) {
            while (j < keylen && (key[j] == '-' || key[j] == '_'))
                j++;
            while (*n == '-')
                n++;
            if (j == keylen || !*n || key[j] != *n)
                break;
            j++;
            n++;
        }
        if (j == keylen && *n == '\0' && keylen > 0)
            return &flags[i];
    }
    return NULL;
}

static int parse_u64(const char *v, uint64_t lo, uint64_t hi, int base, uint64_t *out)
{
    char *end;
    unsigned long long x;

    if (!v || !*v || *v == '-' || *v == '+' || isspace((unsigned char)*v))
        return -1;
    errno = 0;
    x = strtoull(v, &end, base);
    if (errno || *end || x < lo || x > hi)
        return -1;
    *out = x;
    return 0;
}

/* One of three words (a, b or c, in their enum's order) into *out. */
/* value as one of the n words of w (3 or 4). */
static int choice(const char *key, const char *value, const char *const *w, int n, int *out,
                  rnp_error *err)
{
    for (int i = 0; i < n; i++)
        if (strcmp(value, w[i]) == 0) {
            *out = i;
            return 0;
        }
    if (n == 4)
        return rnp_fail(err, RN_INVALID_ARGUMENT, "%s: expected %s, %s, %s or %s, got '%s'", key,
                        w[0], w[1], w[2], w[3], value);
    return rnp_fail(err, RN_INVALID_ARGUMENT, "%s: expected %s, %s or %s, got '%s'", key, w[0],
                    w[1], w[2], value);
}

int rnd_config_set(rnd_config *cfg, const char *key, const char *value, rnp_error *err)
{
    const flag_def *f = find_flag(key, strlen(key));
    uint64_t x;

    if (!f)
        return rnp_fail(err, RN_INVALID_ARGUMENT, "unknown setting '%s' (see --help)", key);
    if (strcmp(f->name, "allow-shm-names") == 0 || strcmp(f->name, "cuda-fast-path") == 0) {
        bool *sw = f->name[0] == 'a' ? &cfg->allow_shm_names : &cfg->cuda_fast_path;
        /* A switch on the command line (no value), yes or no in the file. */
        if (!value || !strcmp(value, "yes") || !strcmp(value, "true") || !strcmp(value, "1"))
            *sw = true;
        else if (!strcmp(value, "no") || !strcmp(value, "false") || !strcmp(value, "0"))
            *sw = false;
        else
            return rnp_fail(err, RN_INVALID_ARGUMENT, "%s: expected yes or no, got '%s'", f->name,
                            value);
        return 0;
    }
    if (!f->arg)
        return rnp_fail(err, RN_INVALID_ARGUMENT, "%s: not a setting", f->name);
    if (!value)
        return rnp_fail(err, RN_INVALID_ARGUMENT, "%s: needs a value (%s)", f->name, f->arg);

#define NUM(field, lo, hi)                                                              \
    do {                                                                                \
        if (parse_u64(value, (lo), (hi), 10, &x) != 0)                                  \
            return rnp_fail(err, RN_INVALID_ARGUMENT, "%s: expected an integer from %llu to %llu, got '%s'", \
                        f->name, (unsigned long long)(lo), (unsigned long long)(hi), value); \
        cfg->field = x;                                                                 \
        return 0;                                                                       \
    } while (0)

    if (strcmp(f->name, "endpoint") == 0) {
        if (strlen(value) >= sizeof cfg->endpoint)
            return rnp_fail(err, RN_INVALID_ARGUMENT, "endpoint: longer than %zu bytes", sizeof cfg->endpoint - 1);
        snprintf(cfg->endpoint, sizeof cfg->endpoint, "%s", value);
        return 0;
    }
    if (strcmp(f->name, "backend") == 0) /* (rnd_backend_choice's order) */
        return choice("backend", value, (const char *const[3]){"auto", "cuda", "cpu"}, 3,
                       &cfg->backend, err);
    if (strcmp(f->name, "device") == 0) {
        if (!*value || strlen(value) >= sizeof cfg->device)
            return rnp_fail(err, RN_INVALID_ARGUMENT, "device: expected an index or a UUID, got '%s'", value);
        snprintf(cfg->device, sizeof cfg->device, "%s", value);
        return 0;
    }
    if (strcmp(f->name, "socket-mode") == 0) {
        if (parse_u64(value, 0, 07777, 8, &x) != 0)
            return rnp_fail(err, RN_INVALID_ARGUMENT, "socket-mode: expected an octal mode such as 0660, got '%s'",
                        value);
        cfg->socket_mode = (mode_t)x;
        return 0;
    }
    if (strcmp(f->name, "socket-group") == 0) {
        if (strlen(value) >= sizeof cfg->socket_group)
            return rnp_fail(err, RN_INVALID_ARGUMENT, "socket-group: name too long");
        snprintf(cfg->socket_group, sizeof cfg->socket_group, "%s", value);
        return 0;
    }
    if (strcmp(f->name, "max-sessions") == 0)
        NUM(max_sessions, 1, 65536);
    if (strcmp(f->name, "max-sessions-per-uid") == 0)
        NUM(max_sessions_per_uid, 1, 65536);
    if (strcmp(f->name, "auth-timeout") == 0)
        NUM(auth_timeout, 0, 3600);
    if (strcmp(f->name, "max-connections") == 0)
        NUM(max_connections, 1, 1u << 20);
    if (strcmp(f->name, "spin-us") == 0)
        NUM(spin_us, 0, 10000);
    if (strcmp(f->name, "max-regions") == 0)
        NUM(max_regions, 1, 1u << 20);
    if (strcmp(f->name, "max-mapped-gib") == 0)
        NUM(max_mapped_gib, 1, 1u << 20);
    if (strcmp(f->name, "max-mappings") == 0)
        NUM(max_mappings, 0, UINT32_MAX);
    if (strcmp(f->name, "max-inflight") == 0)
        NUM(max_inflight, 1, 1u << 20);
    if (strcmp(f->name, "max-inflight-total") == 0)
        NUM(max_inflight_total, 1, 1u << 24);
    if (strcmp(f->name, "max-inflight-per-uid") == 0)
        NUM(max_inflight_per_uid, 1, 1u << 24);
    if (strcmp(f->name, "max-graphs") == 0)
        NUM(max_graphs, 0, 1u << 20);
    if (strcmp(f->name, "ring-spin-us") == 0)
        NUM(ring_spin_us, 0, 100000);
    if (strcmp(f->name, "ring-ready") == 0) /* (RND_RING_READY_*'s order) */
        return choice("ring-ready", value,
                      (const char *const[4]){"auto", "gpu", "host", "armed"}, 4,
                       &cfg->ring_ready, err);
    if (strcmp(f->name, "max-m") == 0)
        NUM(max_m, 1, (uint64_t)INT64_MAX);
    if (strcmp(f->name, "max-n") == 0)
        NUM(max_n, 1, UINT32_MAX);
    if (strcmp(f->name, "idle-timeout") == 0)
        NUM(idle_timeout, 0, 365u * 24 * 3600);
    if (strcmp(f->name, "threads") == 0)
        NUM(threads, 1, 4096);
    if (strcmp(f->name, "kernel-deadline-ms") == 0)
        NUM(kernel_deadline_ms, 1, 24ull * 3600 * 1000);
    if (strcmp(f->name, "debug-force-grid") == 0)
        NUM(debug_force_grid, 0, INT32_MAX);
    if (strcmp(f->name, "debug-fail-after") == 0)
        NUM(debug_fail_after, 0, UINT32_MAX);
    if (strcmp(f->name, "log-level") == 0) {
        int l = rnd_log_level_parse(value);
        if (l < 0)
            return rnp_fail(err, RN_INVALID_ARGUMENT,
                        "log-level: expected debug, info, notice, warning or error, got '%s'",
                        value);
        cfg->log_level = l;
        return 0;
    }
    if (strcmp(f->name, "config") == 0) {
        snprintf(cfg->config_path, sizeof cfg->config_path, "%s", value);
        return 0;
    }
#undef NUM
    return rnp_fail(err, RN_INVALID_ARGUMENT, "%s: not settable", f->name);
}

static char *trim(char *s)
{
    char *e;
    while (isspace((unsigned char)*s))
        s++;
    e = s + strlen(s);
    while (e > s && isspace((unsigned char)e[-1]))
        *--e = '\0';
    return s;
}

/*
 * Walk the file's `key = value` lines, calling fn on each.  Shared by the
 * start-up read and the SIGHUP re-read.
 */
typedef int (*line_fn)(void *ctx, const char *key, const char *value, rnp_error *err);

static int walk_file(const char *path, bool must_exist, line_fn fn, void *ctx, bool *found,
                     rnp_error *err)
{
    char line[4096];
    rnp_error inner = {0};
    FILE *f;
    int lineno = 0, rc = RN_INVALID_ARGUMENT;

    *found = false;
    f = fopen(path, "re");
    if (!f) {
        if (errno == ENOENT && !must_exist)
            return 0;
        return rnp_fail(err, RN_INVALID_ARGUMENT, "config file %s: %s", path, strerror(errno));
    }
    *found = true;
    while (fgets(line, sizeof line, f)) {
        char *s, *eq, *hash;
        lineno++;
        if (!strchr(line, '\n') && !feof(f)) {
            rnp_fail(err, RN_INVALID_ARGUMENT, "%s:%d: line too long", path, lineno);
            goto out;
        }
        if ((hash = strchr(line, '#')))
            *hash = '\0';
        s = trim(line);
        if (!*s)
            continue;
        eq = strchr(s, '=');
        if (!eq) {
            rnp_fail(err, RN_INVALID_ARGUMENT, "%s:%d: expected 'key = value', got '%s'", path, lineno, s);
            goto out;
        }
        *eq = '\0';
        if (fn(ctx, trim(s), trim(eq + 1), &inner) != 0) {
            rnp_fail(err, RN_INVALID_ARGUMENT, "%s:%d: %s", path, lineno, inner.msg);
            goto out;
        }
    }
    if (ferror(f)) {
        rnp_fail(err, RN_INVALID_ARGUMENT, "config file %s: read error", path);
        goto out;
    }
    rc = 0;
out:
    fclose(f);
    return rc;
}

static int set_from_file(void *ctx, const char *key, const char *value, rnp_error *err)
{
    const flag_def *f = find_flag(key, strlen(key));
    /* A file naming another file, or asking for help, is a mistake. */
    if (f && !strcmp(f->name, "config"))
        return rnp_fail(err, RN_INVALID_ARGUMENT, "config: not allowed inside a configuration file");
    return rnd_config_set(ctx, key, value, err);
}

int rnd_config_read_file(rnd_config *cfg, const char *path, bool must_exist, rnp_error *err)
{
    bool found;
    int rc = walk_file(path, must_exist, set_from_file, cfg, &found, err);
    if (rc != 0)
        return rc;
    if (found)
        snprintf(cfg->config_path, sizeof cfg->config_path, "%s", path);
    return 0;
}

static int level_only(void *ctx, const char *key, const char *value, rnp_error *err)
{
    const flag_def *f = find_flag(key, strlen(key));
    if (f && strcmp(f->name, "log-level") == 0) {
        int l = rnd_log_level_parse(value);
        if (l < 0)
            return rnp_fail(err, RN_INVALID_ARGUMENT, "log-level: expected debug, info, notice, warning or error, got '%s'", value);
        *(int *)ctx = l;
    }
    return 0;
}

int rnd_config_reread_log_level(const char *path, int *level, rnp_error *err)
{
    int l = *level, rc;
    bool found;
    if ((rc = walk_file(path, true, level_only, &l, &found, err)) != 0)
        return rc;
    *level = l;
    return 0;
}

/* Split argv into (flag, value) pairs: "--key value" and "--key=value". */
static int next_flag(int argc, char **argv, int *i, const flag_def **f, const char **value,
                     rnp_error *err)
{
    const char *a = argv[*i];
    const char *eq;

    if (strncmp(a, "--", 2) != 0 || a[2] == '\0')
        return rnp_fail(err, RN_INVALID_ARGUMENT, "unexpected argument '%s' (see --help)", a);
    eq = strchr(a, '=');
    *f = find_flag(a + 2, eq ? (size_t)(eq - a - 2) : strlen(a + 2));
    if (!*f)
        return rnp_fail(err, RN_INVALID_ARGUMENT, "unknown option '%s' (see --help)", a);
    if (!(*f)->arg) {
        /* The yes/no switches take "--name=no" too; the actions no value. */
        bool yes_no = !strcmp((*f)->name, "allow-shm-names") || !strcmp((*f)->name, "cuda-fast-path");
        if (eq && !yes_no)
            return rnp_fail(err, RN_INVALID_ARGUMENT, "--%s takes no value", (*f)->name);
        *value = eq ? eq + 1 : NULL;
    } else if (eq) {
        *value = eq + 1;
    } else {
        if (*i + 1 >= argc)
            return rnp_fail(err, RN_INVALID_ARGUMENT, "--%s needs a value (%s)", (*f)->name, (*f)->arg);
        *value = argv[++*i];
    }
    (*i)++;
    return 0;
}

int rnd_config_load(rnd_config *cfg, int argc, char **argv, const char *default_file,
                    int *action, rnp_error *err)
{
    const char *file = NULL;
    const flag_def *f;
    const char *value;
    rnp_error inner = {0};
    rnd_config c;

    *action = RND_RUN;
    /* First pass: unknown flags, --help, --version and --config. */
    for (int i = 1; i < argc;) {
        if (next_flag(argc, argv, &i, &f, &value, err) != 0)
            return RN_INVALID_ARGUMENT;
        if (!strcmp(f->name, "help")) {
            *action = RND_SHOW_HELP;
            return 0;
        }
        if (!strcmp(f->name, "version")) {
            *action = RND_SHOW_VERSION;
            return 0;
        }
        if (!strcmp(f->name, "config"))
            file = value;
    }

    rnd_config_defaults(&c);
    if (file) {
        if (rnd_config_read_file(&c, file, true, err) != 0)
            return RN_INVALID_ARGUMENT;
    } else if (default_file) {
        if (rnd_config_read_file(&c, default_file, false, err) != 0)
            return RN_INVALID_ARGUMENT;
    }
    /* Second pass: flags win over the file. */
    for (int i = 1; i < argc;) {
        next_flag(argc, argv, &i, &f, &value, NULL);
        if (!strcmp(f->name, "config"))
            continue;
        if (rnd_config_set(&c, f->name, value, &inner) != 0)
            return rnp_fail(err, RN_INVALID_ARGUMENT, "--%s", inner.msg);
        if (!strcmp(f->name, "log-level"))
            c.log_level_from_flag = true;
    }
    if (rnd_config_finish(&c, err) != 0)
        return RN_INVALID_ARGUMENT;
    *cfg = c;
    return 0;
}

int rnd_config_finish(rnd_config *cfg, rnp_error *err)
{
    const char *path;
    int rc;

    if (!cfg->endpoint[0] && (rc = rnp_default_endpoint(cfg->endpoint, sizeof cfg->endpoint, err)))
        return rc;
    if ((rc = rnp_check_endpoint(cfg->endpoint, &path, err)) != 0)
        return rc;
    /* The session channel's socket is the nanomsg socket's path plus a
     * suffix, and must fit a Unix socket address too. */
    if (strlen(path) + strlen(RND_CHAN_SUFFIX) >= RND_SUN_PATH_MAX)
        return rnp_fail(err, RN_ENDPOINT,
                        "endpoint: the socket path is %zu bytes; with the session channel's "
                        "'%s' beside it, it must be shorter than %zu ('%.80s')",
                        strlen(path), RND_CHAN_SUFFIX,
                        (size_t)RND_SUN_PATH_MAX - strlen(RND_CHAN_SUFFIX), cfg->endpoint);
    if (!cfg->max_sessions_per_uid)
        cfg->max_sessions_per_uid = cfg->max_sessions / 4 ? cfg->max_sessions / 4 : 1;
    if (!cfg->max_inflight_per_uid)
        cfg->max_inflight_per_uid = cfg->max_inflight_total / 2 ? cfg->max_inflight_total / 2 : 1;
    if (cfg->max_inflight > cfg->max_inflight_total)
        cfg->max_inflight = cfg->max_inflight_total;
    if (cfg->spin_us < 0)
        /* Spinning pays where a core is free for it; on a laptop or a small
         * CI machine it takes the CPU from the clients instead. */
        cfg->spin_us = sysconf(_SC_NPROCESSORS_ONLN) >= 4 ? 100 : 0;
    if (cfg->ring_spin_us < 0)
        cfg->ring_spin_us = sysconf(_SC_NPROCESSORS_ONLN) >= 4 ? 1000 : 0;
    return 0;
}

const char *rnd_config_ipc_path(const rnd_config *cfg)
{
    return cfg->endpoint + 6;
}

void rnd_config_usage(FILE *out, const char *argv0)
{
    fprintf(out,
            "Usage: %s [OPTION...]\n"
            "rmsnormd %s: runs RMSNorm's backward pass for client processes.\n\n"
            "Options (each may also be set in the configuration file as `name = value`,\n"
            "without the dashes; flags win over the file):\n",
            argv0, RN_VERSION);
    for (size_t i = 0; i < NFLAGS; i++) {
        char left[64];
        snprintf(left, sizeof left, "--%s%s%s", flags[i].name, flags[i].arg ? " " : "",
                 flags[i].arg ? flags[i].arg : "");
        if (strlen(left) > 23) /* (a column of space at least before the text) */
            fprintf(out, "  %s\n  %-24s%s\n", left, "", flags[i].help);
        else
            fprintf(out, "  %-24s%s\n", left, flags[i].help);
    }
    fprintf(out, "\nSignals: SIGTERM/SIGINT drain and exit 0; SIGHUP re-reads log-level.\n"
                 "Exit status: 0 clean drain, 1 start-up failure, 2 fatal backend failure.\n");
}
