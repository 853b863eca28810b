/* SPDX-License-Identifier: MIT */
/*
 * buffer.c - shared host buffers for the CPU backend: POSIX shm objects
 * (mode 0600) that the daemon gets as descriptors on the session channel,
 * the clean-up of names that a killed client left behind, and the host
 * pointer mapper of the backward call (a pointer into one of the client's
 * buffers becomes its region and offset).
 *
 * A buffer keeps its descriptor open until free: after a daemon restart the
 * library registers every live buffer again by it.  Its name is removed as
 * soon as the daemon has the descriptor (at once when the session is known
 * to have a channel); only a daemon without a session channel opens buffers
 * by name, and for it the name stays until free.  So rn_buffer_free,
 * rn_close and an exit handler unlink, and rn_connect sweeps names of
 * processes that died without doing so.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "client_int.h"
#include "rn_check.h"
#include "rn_queue.h"

#define SHM_PREFIX "rmsnormd."

/*
 * Every live shm name of this process, so that the exit handler can unlink
 * the names of clients the program never closed.  Entries carry the pid
 * that created them: a forked child inherits the list but must not unlink
 * its parent's names when it exits.
 */
typedef struct live_name {
    rn_queue link;
    pid_t pid;
    char name[64];
} live_name;

static pthread_mutex_t live_mu = PTHREAD_MUTEX_INITIALIZER;
static rn_queue live_names = {&live_names, &live_names};
static unsigned long name_counter;

static void live_add(const char *name)
{
    live_name *e = calloc(1, sizeof *e);
    if (e == NULL)
        return; /* only the exit-time clean-up is lost */
    e->pid = getpid();
    snprintf(e->name, sizeof e->name, "%s", name);
    pthread_mutex_lock(&live_mu);
    rn_queue_push_front(&live_names, &e->link);
    pthread_mutex_unlock(&live_mu);
}

static void live_remove(const char *name)
{
    rn_queue *q;
    pthread_mutex_lock(&live_mu);
    RN_QUEUE_FOREACH(q, &live_names) {
        live_name *e = RN_QUEUE_DATA(q, live_name, link);
        if (strcmp(e->name, name) == 0) {
            rn_queue_remove(&e->link);
            free(e);
            break;
        }
    }
    pthread_mutex_unlock(&live_mu);
}

/* A destructor rather than atexit(): it also runs when the shared library
 * is unloaded, where an atexit handler would point into unmapped code. */
__attribute__((destructor)) static void unlink_live_names(void)
{
    pid_t me = getpid();
    rn_queue *q;
    /* Another thread may hold the lock at exit; then skip rather than hang. */
    if (pthread_mutex_trylock(&live_mu) != 0)
        return;
    RN_QUEUE_FOREACH(q, &live_names) {
        live_name *e = RN_QUEUE_DATA(q, live_name, link);
        if (e->pid == me)
            shm_unlink(e->name);
    }
    pthread_mutex_unlock(&live_mu);
}

/* The inode of our pid namespace: pids are compared only within one, since
 * containers sharing /dev/shm may see the same pid for different processes. */
static unsigned long pidns_id(void)
{
    struct stat st;
    if (stat("/proc/self/ns/pid", &st) != 0)
        return 0;
    return (unsigned long)st.st_ino;
}

void rnc_sweep_stale(void)
{
    unsigned long ns = pidns_id();
    DIR *d = opendir("/dev/shm");
    struct dirent *de;
    if (d == NULL)
        return;
    while ((de = readdir(d)) != NULL) {
        unsigned long pid, n, ens;
        char tail;
        struct stat st;
        char name[300];
        if (strncmp(de->d_name, SHM_PREFIX, strlen(SHM_PREFIX)) != 0)
            continue;
        if (sscanf(de->d_name + strlen(SHM_PREFIX), "%lu.%lu.%lu%c", &pid, &n, &ens, &tail) != 3)
            continue;
        if (ens != ns || pid == 0 || fstatat(dirfd(d), de->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 ||
            st.st_uid != geteuid())
            continue;
        if (kill((pid_t)pid, 0) == 0 || errno != ESRCH)
            continue;
        snprintf(name, sizeof name, "/%s", de->d_name);
        shm_unlink(name);
    }
    closedir(d);
}

/* Remove b's name: the daemon has it by descriptor, and nobody else needs
 * the name.  Fine when b has none. */
static void buf_unname(rnc_buf *b)
{
    if (!b->name[0])
        return;
    shm_unlink(b->name);
    live_remove(b->name);
    b->name[0] = '\0';
}

void rnc_buf_release(rnc_buf *b)
{
    if (b->base)
        munmap(b->base, b->size);
    if (b->fd >= 0)
        close(b->fd);
    b->fd = -1;
    buf_unname(b);
    b->base = NULL;
}

/* Create, size and map a fresh shm object. */
static int create_shm(rn_client *c, size_t bytes, rnc_buf *out)
{
    rnc_buf b = {0};
    unsigned long ns = pidns_id();
    int fd = -1, rv;
    rn_fault f;

    b.size = bytes;
    b.fd = -1;
    for (int tries = 0;; tries++) {
        unsigned long k = __atomic_fetch_add(&name_counter, 1, __ATOMIC_RELAXED);
        snprintf(b.name, sizeof b.name, "/" SHM_PREFIX "%ld.%lu.%lu", (long)getpid(), k, ns);
        fd = shm_open(b.name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
        if (fd >= 0)
            break;
        /* EEXIST: a dead process with our pid left this name; take the next. */
        if (errno != EEXIST || tries > 1000)
            return rnc_fail(c, RN_SYSTEM, "buffer: shm_open(%s): %s", b.name, strerror(errno));
    }
    /* Reserve the memory now: a full /dev/shm is an error here, not a
     * SIGBUS on first touch later.  posix_fallocate returns an error
     * number, as the pthread calls do. */
    RN_PT_GOTO(posix_fallocate(fd, 0, (off_t)bytes), &f, no_space);
    b.base = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (b.base == MAP_FAILED) {
        b.base = NULL;
        rv = rnc_fail(c, errno == ENOMEM ? RN_NOMEM : RN_SYSTEM, "buffer: mmap of %zu bytes: %s",
                      bytes, strerror(errno));
        goto fail;
    }
    b.fd = fd;
    live_add(b.name);
    /* The object stays 0600: the daemon gets the descriptor, and nobody
     * needs the name once the session is known to have a channel. */
    if (c->have_session && c->hello.channel)
        buf_unname(&b);
    *out = b;
    return 0;
no_space:
    rv = rnc_fail(c, f.err == ENOSPC ? RN_NOMEM : RN_SYSTEM,
                  "buffer: reserving %zu bytes in /dev/shm: %s", bytes, strerror(f.err));
fail:
    close(fd);
    shm_unlink(b.name);
    return rv;
}

static int register_step(rn_client *c, void *b)
{
    return rnc_register_buf(c, b);
}

int rn_buffer_alloc(rn_client *c, size_t bytes, void **ptr)
{
    rnc_buf b;
    int rv;
    if (c == NULL)
        return RN_INVALID_ARGUMENT;
    /* Under the lock from here: even an argument error writes c's message. */
    pthread_mutex_lock(&c->mu);
    if (ptr == NULL) {
        rv = rnc_fail(c, RN_INVALID_ARGUMENT, "ptr: must not be NULL");
        goto out;
    }
    if (bytes == 0) {
        rv = rnc_fail(c, RN_INVALID_ARGUMENT, "bytes: must be > 0");
        goto out;
    }
    if (bytes > (size_t)INT64_MAX) {
        rv = rnc_fail(c, RN_INVALID_ARGUMENT, "bytes: %zu is too large", bytes);
        goto out;
    }
    if (c->nbufs == c->capbufs) {
        size_t cap = c->capbufs ? 2 * c->capbufs : 8;
        rnc_buf *nb = realloc(c->bufs, cap * sizeof *nb);
        if (nb == NULL) {
            rv = rnc_fail(c, RN_NOMEM, "buffer: out of memory for the buffer table");
            goto out;
        }
        c->bufs = nb;
        c->capbufs = cap;
    }
    if ((rv = create_shm(c, bytes, &b)) != 0)
        goto out;
    /* A fresh session registers every buffer in the table, so b joins the
     * table only once it is registered itself. */
    if ((rv = rnc_in_session(c, register_step, &b)) != 0) {
        rnc_buf_release(&b);
        goto out;
    }
    /* Created before the session was known to have a channel: the name
     * can go now that the daemon has the descriptor. */
    if (c->have_chan)
        buf_unname(&b);
    c->bufs[c->nbufs++] = b;
    *ptr = b.base;
out:
    pthread_mutex_unlock(&c->mu);
    return rv;
}

int rn_buffer_free(rn_client *c, void *ptr)
{
    size_t i;
    rnc_buf b;
    int rv = 0;
    if (c == NULL)
        return RN_INVALID_ARGUMENT;
    if (ptr == NULL)
        return 0;
    pthread_mutex_lock(&c->mu);
    for (i = 0; i < c->nbufs; i++)
        if (c->bufs[i].base == ptr)
            break;
    if (i == c->nbufs) {
        rv = rnc_fail(c, RN_INVALID_ARGUMENT, "ptr: %p was not returned by rn_buffer_alloc", ptr);
        goto out;
    }
    b = c->bufs[i];
    c->bufs[i] = c->bufs[--c->nbufs];
    /* The daemon must let go of the region before the name disappears, but
     * a lost session has nothing to unregister. */
    if (c->have_session && b.region != 0) {
        rv = rnc_unregister(c, b.region);
        if (rv == RN_UNKNOWN_SESSION) {
            c->have_session = false;
            rv = 0;
        }
    }
    rnc_buf_release(&b);
out:
    pthread_mutex_unlock(&c->mu);
    return rv;
}

/* ---- the host pointer mapper ------------------------------------------------------------ */

/* Find the buffer holding p; the daemon checks bounds, this only turns a
 * pointer into (region, offset) and names the field when the pointer is not
 * in shared memory at all. */
static int map_host(rn_client *c, void *ctx, const char *field, const void *p, rnp_tensor *t)
{
    const char *cp = p;
    (void)ctx;
    for (size_t i = 0; i < c->nbufs; i++) {
        const char *b = c->bufs[i].base;
        if (cp >= b && cp < b + c->bufs[i].size) {
            t->region.id = c->bufs[i].region;
            t->offset = (uint64_t)(cp - b);
            return 0;
        }
    }
    return rnc_fail(c, RN_NOT_SHARED,
                    "%s: pointer %p is not inside a buffer from rn_buffer_alloc of this client",
                    field, p);
}

const rnc_mapper rnc_host_mapper = {.map = map_host};
