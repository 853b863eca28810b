/* SPDX-License-Identifier: MIT */
/*
 * cpu_fault.c - the CPU backend's guard against shared memory that its
 * client shrinks under a job.
 *
 * A client can shrink its shared memory object (ftruncate) after REGISTER;
 * touching the mapping past the new end then raises SIGBUS (BUS_ADRERR) in
 * whichever thread computes.  Rather than let one client kill the daemon,
 * the handler records the fault, then maps private zero pages over the rest
 * of the mapping, from the faulting page to its end, so that the access
 * completes.  When a job ends, it looks for recorded ranges
 * inside its own tensors: one there means its results are void (it read
 * zero pages, now or because an earlier job faulted them in), and the
 * server drops the region that holds it.  Faults in other clients' regions
 * leave the job alone.  Any other SIGBUS keeps its default action.
 *
 * Why the rest of the mapping and not the page: each page mapped over a
 * file mapping splits it, and a job that touches every other page of a
 * large region shrunk to nothing split it 80 000 times, past the kernel's
 * vm.max_map_count (65 530); the handler's mmap then failed and the daemon
 * died of the SIGBUS.  The mappings the backend made are in a table the
 * handler reads without a lock (the loop thread alone adds and removes);
 * a fault outside them (none is expected) gets the page alone, as before.
 */
#include "cpu_fault.h"

#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* Ranges recorded, the oldest forgotten past this many. */
#define FAULT_RING 64
/* Mappings tracked at most (beyond them a fault maps its page alone). */
#define MAPS_MAX 16384

static _Atomic uintptr_t fault_lo[FAULT_RING], fault_hi[FAULT_RING];
static atomic_uint_fast64_t fault_next; /* ring slots claimed */
static _Atomic uintptr_t map_lo[MAPS_MAX], map_hi[MAPS_MAX];
static _Atomic uintptr_t map_fault[MAPS_MAX]; /* the lowest page faulted in it, 0: none */
static atomic_uint map_top;             /* entries in use are below it */
static atomic_uint map_marked;          /* entries with a fault */
static uintptr_t page_size;

/* The entry of the tracked mapping that holds addr (its end in *hi), or
 * -1.  lo is read again after hi: an entry the loop thread reused meanwhile
 * must not pair one mapping's start with another's end. */
static int mapping_of(uintptr_t addr, uintptr_t *hi)
{
    unsigned top = atomic_load(&map_top);
    for (unsigned i = 0; i < top; i++) {
        uintptr_t lo = atomic_load(&map_lo[i]);
        *hi = atomic_load(&map_hi[i]);
        if (lo && addr >= lo && addr < *hi && atomic_load(&map_lo[i]) == lo)
            return (int)i;
    }
    return -1;
}

static void on_sigbus(int sig, siginfo_t *si, void *uc)
{
    (void)sig;
    (void)uc;
    if (si->si_code == BUS_ADRERR && si->si_addr) {
        uintptr_t page = (uintptr_t)si->si_addr & ~(page_size - 1), end = 0;
        int i = mapping_of(page, &end);
        /* Recorded before the zero pages go in, so that no job reads them
         * unmarked: a tracked mapping keeps its lowest fault until it is
         * untracked (no later fault can push it out), any other fault goes
         * in the ring. */
        if (i >= 0) {
            uintptr_t cur = atomic_load(&map_fault[i]);
            while ((!cur || page < cur) &&
                   !atomic_compare_exchange_weak(&map_fault[i], &cur, page))
                ;
            if (!cur)
                atomic_fetch_add(&map_marked, 1);
        } else {
            end = page + page_size;
            uint_fast64_t k = atomic_fetch_add(&fault_next, 1) % FAULT_RING;
            atomic_store(&fault_lo[k], 0);
            atomic_store(&fault_hi[k], end);
            atomic_store(&fault_lo[k], page);
        }
        if (mmap((void *)page, end - page, PROT_READ | PROT_WRITE,
                 MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS, -1, 0) != MAP_FAILED)
            return;
    }
    /* Returning re-executes the access, which now takes the default action. */
    signal(SIGBUS, SIG_DFL);
}

int rnd_cpu_fault_init(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_sigbus;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    page_size = (uintptr_t)sysconf(_SC_PAGESIZE);
    return sigaction(SIGBUS, &sa, NULL);
}

void rnd_cpu_fault_track(const void *base, uint64_t size)
{
    uintptr_t lo = (uintptr_t)base, hi = lo + ((size + page_size - 1) & ~(uint64_t)(page_size - 1));
    unsigned top = atomic_load(&map_top), i;

    for (i = 0; i < top && atomic_load(&map_lo[i]); i++)
        ;
    if (i == MAPS_MAX)
        return; /* (a fault there maps its page alone) */
    atomic_store(&map_hi[i], hi);
    atomic_store(&map_lo[i], lo);
    if (i == top)
        atomic_store(&map_top, top + 1);
}

int rnd_cpu_fault_in(const void *p, uint64_t bytes, uintptr_t addr)
{
    uintptr_t lo = (uintptr_t)p, pg = addr & ~(page_size - 1);
    return p && bytes && pg < lo + bytes && lo < pg + page_size;
}

/* Does [p, p + bytes) overlap [lo, hi)? */
static bool overlaps(const void *p, uint64_t bytes, uintptr_t lo, uintptr_t hi)
{
    uintptr_t a = (uintptr_t)p;
    return p && bytes && lo < a + bytes && a < hi;
}

void rnd_cpu_fault_untrack(const void *base, uint64_t size)
{
    uintptr_t lo = (uintptr_t)base;
    unsigned top = atomic_load(&map_top);

    for (unsigned i = 0; i < top; i++)
        if (atomic_load(&map_lo[i]) == lo) {
            atomic_store(&map_lo[i], 0);
            atomic_store(&map_hi[i], 0);
            if (atomic_exchange(&map_fault[i], 0))
                atomic_fetch_sub(&map_marked, 1);
            break;
        }
    /* Once unmapped, the addresses may be reused by an intact region of
     * any client, whose jobs must not be taken for faulted.  No job uses
     * the mapping any more, so no fault inside it is being recorded now. */
    for (int k = 0; k < FAULT_RING; k++) {
        uintptr_t flo = atomic_load(&fault_lo[k]), fhi = atomic_load(&fault_hi[k]);
        if (flo && overlaps(base, size, flo, fhi))
            atomic_compare_exchange_strong(&fault_lo[k], &flo, 0);
    }
}

uintptr_t rnd_cpu_fault_hit(const rnk_bwd_args *a)
{
    uint_fast64_t n = atomic_load(&fault_next);
    unsigned marked = atomic_load(&map_marked);
    if ((n == 0 && marked == 0) || a->m == 0)
        return 0;
    uint64_t rows = (uint64_t)(a->m - 1), n_ = (uint64_t)a->n;
    struct {
        const void *p;
        uint64_t bytes;
    } t[] = {
        {a->x, (rows * (uint64_t)a->x_stride + n_) * rnk_dtype_size(a->x_dtype)},
        {a->dy, (rows * (uint64_t)a->dy_stride + n_) * rnk_dtype_size(a->dy_dtype)},
        {a->dx, (rows * (uint64_t)a->dx_stride + n_) * rnk_dtype_size(a->dx_dtype)},
        {a->dres,
         a->dres ? (rows * (uint64_t)a->dres_stride + n_) * rnk_dtype_size(a->dres_dtype) : 0},
        {a->w, n_ * rnk_dtype_size(a->w_dtype)},
        {a->dw, n_ * rnk_dtype_size(a->dw_dtype)},
        {a->rstd, a->rstd ? (uint64_t)a->m * sizeof(float) : 0},
    };
    /* The tracked mappings' faults (only while one has any): the fault's
     * page to the mapping's end. */
    for (unsigned i = 0, top = marked ? atomic_load(&map_top) : 0; i < top; i++) {
        uintptr_t lo = atomic_load(&map_fault[i]), hi = atomic_load(&map_hi[i]);
        if (atomic_load(&map_fault[i]) != lo)
            continue; /* (untracked meanwhile: hi may be another mapping's) */
        for (size_t j = 0; lo && j < sizeof t / sizeof t[0]; j++)
            if (overlaps(t[j].p, t[j].bytes, lo, hi))
                return lo;
    }
    /* Past FAULT_RING faults the oldest ranges are forgotten; their regions
     * were dropped when the jobs that faulted them ended. */
    for (uint_fast64_t k = n > FAULT_RING ? n - FAULT_RING : 0; k < n; k++) {
        uintptr_t lo = atomic_load(&fault_lo[k % FAULT_RING]);
        uintptr_t hi = atomic_load(&fault_hi[k % FAULT_RING]);
        if (atomic_load(&fault_lo[k % FAULT_RING]) != lo)
            continue; /* (a newer fault is taking the slot: its range is its own) */
        for (size_t i = 0; lo && i < sizeof t / sizeof t[0]; i++)
            if (overlaps(t[i].p, t[i].bytes, lo, hi))
                return lo;
    }
    return 0;
}
