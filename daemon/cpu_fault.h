/* SPDX-License-Identifier: MIT */
/*
 * cpu_fault.h - the CPU backend's guard against shared memory that its
 * client shrinks under a job (cpu_fault.c says how).
 */
#ifndef RND_CPU_FAULT_H
#define RND_CPU_FAULT_H

#include <stdint.h>

#include "rnk.h"

/* Install the SIGBUS handler (once per process).  0, or -1 with errno. */
int rnd_cpu_fault_init(void);
/* A client's mapping [base, base + size) was made (loop thread): a fault
 * inside it replaces the rest of it at once. */
void rnd_cpu_fault_track(const void *base, uint64_t size);
/* ... and is about to be unmapped (no job uses it): forgotten, with the
 * faults recorded inside it. */
void rnd_cpu_fault_untrack(const void *base, uint64_t size);
/* An address of a recorded fault inside one of a's tensors (its results
 * are void), or 0. */
uintptr_t rnd_cpu_fault_hit(const rnk_bwd_args *a);
/* Whether [p, p + bytes) holds the page of addr. */
int rnd_cpu_fault_in(const void *p, uint64_t bytes, uintptr_t addr);

#endif
