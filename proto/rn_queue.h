/* SPDX-License-Identifier: MIT */
/*
 * rn_queue.h - the one intrusive list of the project: a circular doubly
 * linked list whose head is a node of its own (libuv's queue.h style).
 *
 * A structure that sits on a list embeds an rn_queue; the list's owner keeps
 * another rn_queue as the head.  An empty list is a head that points at
 * itself.  Every operation is O(1) and none allocates.  Header-only, C11,
 * depends on nothing: every folder of the project may include it.
 *
 *     typedef struct job { int n; rn_queue link; } job;
 *     rn_queue list;
 *     rn_queue_init(&list);
 *     rn_queue_push_back(&list, &j->link);
 *     RN_QUEUE_FOREACH(q, &list) { job *x = RN_QUEUE_DATA(q, job, link); ... }
 *
 * Removing the node being visited inside RN_QUEUE_FOREACH is not allowed;
 * RN_QUEUE_FOREACH_SAFE allows it.
 */
#ifndef RN_QUEUE_H
#define RN_QUEUE_H

#include <stdbool.h>
#include <stddef.h>

typedef struct rn_queue {
    struct rn_queue *next, *prev;
} rn_queue;

/* The structure of type `type` whose member `field` is the node q. */
#define RN_QUEUE_DATA(q, type, field) ((type *)(void *)((char *)(q) - offsetof(type, field)))

#define RN_QUEUE_FOREACH(q, h) for ((q) = (h)->next; (q) != (h); (q) = (q)->next)
/* n: a second rn_queue * that holds the next node, so q may be removed. */
#define RN_QUEUE_FOREACH_SAFE(q, n, h)                                                  \
    for ((q) = (h)->next, (n) = (q)->next; (q) != (h); (q) = (n), (n) = (q)->next)

static inline void rn_queue_init(rn_queue *q)
{
    q->next = q->prev = q;
}

static inline bool rn_queue_empty(const rn_queue *h)
{
    return h->next == h;
}

/* The first node, or NULL when the list is empty. */
static inline rn_queue *rn_queue_head(const rn_queue *h)
{
    return h->next == h ? NULL : h->next;
}

static inline void rn_queue_push_back(rn_queue *h, rn_queue *q)
{
    q->next = h;
    q->prev = h->prev;
    h->prev->next = q;
    h->prev = q;
}

static inline void rn_queue_push_front(rn_queue *h, rn_queue *q)
{
    q->prev = h;
    q->next = h->next;
    h->next->prev = q;
    h->next = q;
}

/* Unlink q and leave it pointing at itself, so removing it twice is harmless
 * and rn_queue_linked tells whether it is on a list. */
static inline void rn_queue_remove(rn_queue *q)
{
    q->prev->next = q->next;
    q->next->prev = q->prev;
    q->next = q->prev = q;
}

static inline bool rn_queue_linked(const rn_queue *q)
{
    return q->next != q;
}

/* Move every node of src to the end of dst; src becomes empty. */
static inline void rn_queue_move(rn_queue *dst, rn_queue *src)
{
    if (rn_queue_empty(src))
        return;
    src->next->prev = dst->prev;
    dst->prev->next = src->next;
    src->prev->next = dst;
    dst->prev = src->prev;
    rn_queue_init(src);
}

#endif
