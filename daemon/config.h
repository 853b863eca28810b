/* SPDX-License-Identifier: MIT */
/*
 * config.h - rmsnormd's settings: defaults, command-line flags and the
 * configuration file (`key = value` lines, '#' comments, keys are the long
 * flag names; flags win over the file).  Pure: no logging, no global state,
 * so the unit tests exercise it directly.
 */
#ifndef RND_CONFIG_H
#define RND_CONFIG_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

#include "rn_proto.h"

#define RND_DEFAULT_CONFIG "/etc/rmsnormd/rmsnormd.conf"
#define RND_SUN_PATH_MAX RNP_SUN_PATH_MAX
#define RND_ENDPOINT_MAX 512

enum rnd_backend_choice { RND_BACKEND_AUTO = 0, RND_BACKEND_CUDA, RND_BACKEND_CPU };

/* --ring-ready (rnd_config.ring_ready). */
enum { RND_RING_READY_AUTO = 0, RND_RING_READY_GPU = 1, RND_RING_READY_HOST = 2,
       RND_RING_READY_ARMED = 3 };

typedef struct rnd_config {
    char endpoint[RND_ENDPOINT_MAX];   /* "" until rnd_config_finish picks the default */
    int backend;                       /* rnd_backend_choice */
    char device[64];                   /* index or UUID */
    mode_t socket_mode;
    char socket_group[64];             /* "" = leave the group unchanged */
    uint32_t max_sessions;
    /* Connections to the socket at once (the front refuses more: each is a
     * descriptor, and nanomsg spins when it runs out of them). */
    uint32_t max_connections;
    /* Microseconds the core and the front poll without sleeping after a
     * request; -1 until rnd_config_finish picks the default. */
    int32_t spin_us;
    uint32_t max_regions;
    /* Address space (CPU backend) or device memory (CUDA) one session may
     * have mapped: sparse shm objects cost a client nothing and could
     * otherwise exhaust the daemon's address space for everyone. */
    uint64_t max_mapped_gib;
    /* Mappings (regions) in all: each is a VMA of the daemon, and the kernel
     * allows vm.max_map_count of those per process.  0: from that limit. */
    uint64_t max_mappings;
    uint32_t max_inflight;
    uint32_t max_inflight_total;
    uint32_t max_inflight_per_uid; /* of one verified user's sessions (0: the default) */
    /* Graph slots open at once in all (GRAPH_OPEN, PROTOCOL.md 13.8): the
     * doorbell thread polls every one of them every 20 us.  0: none. */
    uint32_t max_graphs;
    /* After a ring slot the loop polls the rings itself this long (us)
     * before it sleeps again (ring.c); -1 until rnd_config_finish picks the
     * default, 0 never. */
    int32_t ring_spin_us;
    /* --ring-ready: whether a ring's slots are taken only once their ready
     * word reached their seq (ring.c's take), so that no stream of the
     * daemon waits on a client (host), or at once (gpu); auto, the default:
     * host on the cuda backend, gpu on the cpu backend (whose workers wait
     * for ready on the host themselves); armed: queued at once behind a word
     * of the daemon's (ring_arm.c). */
    int ring_ready;
    uint64_t max_m;
    uint32_t max_n;
    uint32_t idle_timeout;             /* seconds; 0 = never */
    /* Sessions of one verified uid (counted when a session authenticates on
     * the session channel); 0 until rnd_config_finish picks the default,
     * a quarter of max_sessions. */
    uint32_t max_sessions_per_uid;
    /* A session that has not authenticated on the session channel within
     * this many seconds of its HELLO ends: its pid and uid are unverified,
     * so it must not hold a place for long.  0 = never (old clients). */
    uint32_t auth_timeout;
    /* REGISTER by shm name over nanomsg: the daemon opens the name with its
     * own privileges, so only for old clients on a trusted host. */
    bool allow_shm_names;
    uint32_t threads;                  /* 0 = one per online CPU */
    uint64_t kernel_deadline_ms;       /* cuda: a longer kernel fails the device */
    /* cuda: offer the fast path (default yes). */
    bool cuda_fast_path;
    uint32_t debug_force_grid;         /* cuda: CTAs of every launch; 0 = the plan's */
    uint32_t debug_fail_after;         /* the Nth request fails the backend; 0 = never */
    int log_level;                     /* rnd_log_level */
    char config_path[4096];            /* the file that was read, "" if none */
    bool log_level_from_flag;          /* SIGHUP leaves a flag's level alone */
} rnd_config;

/* What rnd_config_parse_args asks the caller to do besides running. */
enum rnd_config_action { RND_RUN = 0, RND_SHOW_HELP, RND_SHOW_VERSION };

void rnd_config_defaults(rnd_config *cfg);

/*
 * Set one key (a long flag name, with or without the leading dashes; '-' and
 * '_' are interchangeable) from text.  Returns 0, or an rn_status with a one-line
 * message in err naming the key.
 */
int rnd_config_set(rnd_config *cfg, const char *key, const char *value, rnp_error *err);

/*
 * Read a configuration file into cfg.  A missing file is an error only when
 * must_exist; then, as for any error, err says which file and line.
 * Returns 0 or an rn_status with err.
 */
int rnd_config_read_file(rnd_config *cfg, const char *path, bool must_exist, rnp_error *err);

/*
 * The whole start-up sequence: defaults, then the file (--config FILE, or
 * default_file which is skipped silently when missing), then the flags, then
 * rnd_config_finish.  *action says whether to print help or the version.
 * Returns 0 or an rn_status with err.
 */
int rnd_config_load(rnd_config *cfg, int argc, char **argv, const char *default_file,
                    int *action, rnp_error *err);

/*
 * Fill the default endpoint from the environment (RUNTIME_DIRECTORY's first
 * directory, then XDG_RUNTIME_DIR, then /tmp/rmsnormd-$UID.sock) and check
 * the endpoint:
 * ipc:// only, and a path short enough for a Unix socket (proto's
 * rnp_default_endpoint and rnp_check_endpoint, which libclient shares).
 * Returns 0 or an rn_status with err.
 */
int rnd_config_finish(rnd_config *cfg, rnp_error *err);

/* The path of an ipc:// endpoint (points into cfg->endpoint). */
const char *rnd_config_ipc_path(const rnd_config *cfg);

/* The session channel's socket sits beside the nanomsg socket file. */
#define RND_CHAN_SUFFIX RNP_CHAN_SUFFIX


/* Re-read only the log level from the file (for SIGHUP).  Returns 0 and sets
 * *level (unchanged if the file does not set it), or an rn_status with err. */
int rnd_config_reread_log_level(const char *path, int *level, rnp_error *err);

/* The --help text. */
void rnd_config_usage(FILE *out, const char *argv0);

#endif
