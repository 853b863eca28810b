/* SPDX-License-Identifier: MIT */
/*
 * front.h - the front process and its link to the core.
 *
 * nanomsg 1.1.5 aborts the process on some malformed SP frames (17 bytes
 * from any peer of the socket are enough).  So the nanomsg socket lives in a
 * small front process that does nothing but move bytes: it binds the
 * endpoint, receives each message with its routing header, keeps the header
 * under a token and forwards (token, body) to the core over a private
 * AF_UNIX SOCK_SEQPACKET socketpair; a reply (token, bytes) from the core
 * goes out with the header kept under that token.  When nanomsg aborts, only
 * the front dies: the core, with its sessions, mappings and GPU work, starts
 * a new front, and what is lost is the replies to requests in flight at that
 * moment (their clients' REQ sockets re-send them, and the duplicate window
 * answers a BWD that ran).  The model is OpenSSH's and Postfix's privilege
 * separation of the code that parses untrusted bytes.
 *
 * The core starts the front by executing its own binary (rmsnormd --front
 * ...; nanomsg is not fork-safe and the core may hold a CUDA context), with
 * the link as descriptor 3.  The front ignores SIGTERM, SIGINT and SIGHUP
 * (the core decides when to stop) and dies with the core (PR_SET_PDEATHSIG).
 * It exits when the core closes the link, after answering RN_DRAINING to
 * the requests the core never read (RND_LINK_LAST_READ says which: none
 * without it), closing its socket and removing the socket file.
 *
 * Serving is checked end to end: every few seconds the core asks the front
 * to probe (RND_LINK_PROBE); the front opens a new nanomsg connection to its
 * own endpoint, sends a probe message, answers it itself when it arrives on
 * the socket and reports RND_LINK_PROBE_OK.  A front that cannot accept a
 * connection (descriptors exhausted, nanomsg wedged) fails the probe, and
 * the core restarts it and stops the watchdog's pings meanwhile.
 */
#ifndef RND_FRONT_H
#define RND_FRONT_H

#include <stdint.h>

/* The descriptor of the link in the front process. */
#define RND_FRONT_FD 3

/* One datagram on the link: this header, then the message bytes. */
enum rnd_link_kind {
    RND_LINK_READY = 1,   /* front -> core: the socket is bound; no body */
    RND_LINK_FAIL,        /* front -> core: start-up failed; body: the message */
    RND_LINK_REQ,         /* front -> core: a request; body: its bytes */
    RND_LINK_REP,         /* core -> front: the reply to token; body: its bytes */
    RND_LINK_FORGET,      /* core -> front: token gets no reply; drop its header */
    RND_LINK_PROBE,       /* core -> front: connect to the endpoint as a client would
                           * and get an answer (token: the probe's number) */
    RND_LINK_PROBE_OK,    /* front -> core: that probe was answered */
    RND_LINK_REFUSED,     /* front -> core: connections refused at --max-connections
                           * since the front started (recv_ns: the count); no body */
    RND_LINK_LAST_READ,   /* core -> front, as its drain closes the link: token is the
                           * last request it read (0: none); the front answers the
                           * requests after it RN_DRAINING; no body */
};

typedef struct rnd_link_hdr {
    uint32_t kind;
    uint32_t token;
    uint64_t recv_ns;     /* REQ: CLOCK_MONOTONIC when the front received it */
} rnd_link_hdr;

/*
 * The front process's main: argv after "--front" is CORE_PID ENDPOINT MODE
 * GROUP MAX_CONNECTIONS SPIN_US (MODE octal, GROUP "" for unchanged).  Returns the exit status.
 */
int rnd_front_main(int argc, char **argv);

#endif
