/* SPDX-License-Identifier: MIT */
/*
 * test_client_vmm.c - the host-only half of libclient's CUDA virtual memory
 * support (client/vmm_walk.c): the walk over the physical allocations
 * mapped behind a tensor's bytes, on a fake address space (a list of
 * (base, size) mappings, as an expandable segment has: chunks side by
 * side, holes where a chunk was unmapped), and a tensor's byte span.
 */
#include <stdlib.h>
#include <string.h>

#include "rn_test.h"
#include "vmm.h"

#define MB (1u << 20)
#define SEG 0x7f0000000000ull

/* A fake address space: the mappings, unordered. */
typedef struct space {
    rnc_vmm_piece m[32];
    size_t n;
    int lies;      /* 1: answer a mapping that does not contain the address */
} space;

static int look(void *ctx, uintptr_t addr, rnc_vmm_piece *out)
{
    space *s = ctx;
    for (size_t i = 0; i < s->n; i++)
        if (addr >= s->m[i].base && addr - s->m[i].base < s->m[i].size) {
            *out = s->m[i];
            if (s->lies)
                out->base = addr + 1;
            return 0;
        }
    return -1;
}

/* A segment of k chunks of size sz from SEG (chunk i at SEG + i * sz). */
static space segment(size_t k, size_t sz)
{
    space s;
    memset(&s, 0, sizeof s);
    for (size_t i = 0; i < k; i++)
        s.m[s.n++] = (rnc_vmm_piece){(uintptr_t)(SEG + i * sz), sz};
    return s;
}

static void test_walk_one_chunk(void **state)
{
    (void)state;
    space s = segment(4, 2 * MB);
    rnc_vmm_piece out[8];
    uintptr_t at = 0;

    /* Inside chunk 1, first byte to last. */
    assert_int_equal(rnc_vmm_walk(look, &s, SEG + 2 * MB, SEG + 4 * MB, out, 8, &at), 1);
    assert_true(out[0].base == SEG + 2 * MB && out[0].size == 2 * MB);
    /* A tensor in the middle of a chunk: the whole chunk. */
    assert_int_equal(rnc_vmm_walk(look, &s, SEG + 3 * MB, SEG + 3 * MB + 8, out, 8, &at), 1);
    assert_true(out[0].base == SEG + 2 * MB);
}

static void test_walk_spanning(void **state)
{
    (void)state;
    space s = segment(6, 2 * MB);
    rnc_vmm_piece out[8];
    uintptr_t at = 0;

    /* Across the boundary of chunks 0 and 1. */
    assert_int_equal(rnc_vmm_walk(look, &s, SEG + 2 * MB - 4, SEG + 2 * MB + 4, out, 8, &at), 2);
    assert_true(out[0].base == SEG && out[1].base == SEG + 2 * MB);
    /* Ending exactly at a chunk's end does not take the next one. */
    assert_int_equal(rnc_vmm_walk(look, &s, SEG + MB, SEG + 4 * MB, out, 8, &at), 2);
    /* Chunks 1 to 4. */
    assert_int_equal(rnc_vmm_walk(look, &s, SEG + 3 * MB, SEG + 9 * MB, out, 8, &at), 4);
    for (int i = 0; i < 4; i++)
        assert_true(out[i].base == SEG + (uintptr_t)(i + 1) * 2 * MB && out[i].size == 2 * MB);
    /* Room for 3 only. */
    assert_int_equal(rnc_vmm_walk(look, &s, SEG + 3 * MB, SEG + 9 * MB, out, 3, &at),
                     RNC_VMM_TOO_MANY);
}

/* Chunks of different sizes (a segment's chunks need not be equal). */
static void test_walk_uneven(void **state)
{
    (void)state;
    space s;
    rnc_vmm_piece out[8];
    uintptr_t at = 0;

    memset(&s, 0, sizeof s);
    s.m[s.n++] = (rnc_vmm_piece){SEG + 20 * MB, 2 * MB}; /* unordered on purpose */
    s.m[s.n++] = (rnc_vmm_piece){SEG, 20 * MB};
    s.m[s.n++] = (rnc_vmm_piece){SEG + 22 * MB, 40 * MB};
    assert_int_equal(rnc_vmm_walk(look, &s, SEG + 19 * MB, SEG + 23 * MB, out, 8, &at), 3);
    assert_true(out[0].base == SEG && out[0].size == 20 * MB);
    assert_true(out[1].base == SEG + 20 * MB && out[1].size == 2 * MB);
    assert_true(out[2].base == SEG + 22 * MB && out[2].size == 40 * MB);
}

/* A chunk unmapped in the middle (the segment shrank there): a hole, named. */
static void test_walk_hole(void **state)
{
    (void)state;
    space s = segment(4, 2 * MB);
    rnc_vmm_piece out[8];
    uintptr_t at = 0;

    s.m[1] = s.m[--s.n]; /* chunk 1 is gone */
    assert_int_equal(rnc_vmm_walk(look, &s, SEG + MB, SEG + 5 * MB, out, 8, &at), RNC_VMM_HOLE);
    assert_true(at == SEG + 2 * MB);
    /* Nothing at the start. */
    assert_int_equal(rnc_vmm_walk(look, &s, SEG + 9 * MB, SEG + 10 * MB, out, 8, &at),
                     RNC_VMM_HOLE);
    assert_true(at == SEG + 9 * MB);
    /* Past the last chunk. */
    assert_int_equal(rnc_vmm_walk(look, &s, SEG + 7 * MB, SEG + 9 * MB, out, 8, &at),
                     RNC_VMM_HOLE);
    assert_true(at == SEG + 8 * MB);
}

/* Growth: a chunk mapped after the last one extends what a walk finds. */
static void test_walk_growth(void **state)
{
    (void)state;
    space s = segment(2, 2 * MB);
    rnc_vmm_piece out[8];
    uintptr_t at = 0;

    assert_int_equal(rnc_vmm_walk(look, &s, SEG + 3 * MB, SEG + 5 * MB, out, 8, &at),
                     RNC_VMM_HOLE);
    s.m[s.n++] = (rnc_vmm_piece){SEG + 4 * MB, 2 * MB};
    assert_int_equal(rnc_vmm_walk(look, &s, SEG + 3 * MB, SEG + 5 * MB, out, 8, &at), 2);
}

/* A lookup that answers a mapping not containing the address, one that
 * would wrap the address space, or overlapping ones: refused. */
static void test_walk_bad_lookup(void **state)
{
    (void)state;
    space s = segment(2, 2 * MB);
    rnc_vmm_piece out[8];
    uintptr_t at = 0;

    s.lies = 1;
    assert_int_equal(rnc_vmm_walk(look, &s, SEG, SEG + 1, out, 8, &at), RNC_VMM_BAD_LOOKUP);
    memset(&s, 0, sizeof s);
    s.m[s.n++] = (rnc_vmm_piece){UINTPTR_MAX - MB + 1, 2 * MB};
    assert_int_equal(rnc_vmm_walk(look, &s, UINTPTR_MAX - 10, UINTPTR_MAX, out, 8, &at),
                     RNC_VMM_BAD_LOOKUP);
    /* Overlapping mappings (a next one that starts before the end). */
    memset(&s, 0, sizeof s);
    s.m[s.n++] = (rnc_vmm_piece){SEG, 2 * MB};
    s.m[s.n++] = (rnc_vmm_piece){SEG + MB, 4 * MB};
    /* look returns the first that contains SEG + 2 MB: the second, which
     * starts before it. */
    assert_int_equal(rnc_vmm_walk(look, &s, SEG, SEG + 3 * MB, out, 8, &at), RNC_VMM_BAD_LOOKUP);
    assert_true(at == SEG + 2 * MB);
}

static void test_tensor_bytes(void **state)
{
    (void)state;
    rn_bwd_args a = RN_BWD_ARGS_INIT;
    uint64_t b = 0;

    a.m = 3, a.n = 5;
    a.x_dtype = RN_DTYPE_F32, a.dy_dtype = RN_DTYPE_BF16, a.dx_dtype = RN_DTYPE_F16;
    a.w_dtype = RN_DTYPE_BF16, a.dw_dtype = RN_DTYPE_F32, a.dres_dtype = RN_DTYPE_F16;
    a.x_stride = 8, a.dy_stride = 5, a.dx_stride = 6, a.dres_stride = 7;
    assert_int_equal(rnc_tensor_bytes(&a, "x", &b), 0);
    assert_int_equal(b, (2 * 8 + 5) * 4);
    assert_int_equal(rnc_tensor_bytes(&a, "dy", &b), 0);
    assert_int_equal(b, 15 * 2);
    assert_int_equal(rnc_tensor_bytes(&a, "dx", &b), 0);
    assert_int_equal(b, (2 * 6 + 5) * 2);
    assert_int_equal(rnc_tensor_bytes(&a, "dres", &b), 0);
    assert_int_equal(b, (2 * 7 + 5) * 2);
    assert_int_equal(rnc_tensor_bytes(&a, "w", &b), 0);
    assert_int_equal(b, 5 * 2);
    assert_int_equal(rnc_tensor_bytes(&a, "dw", &b), 0);
    assert_int_equal(b, 5 * 4);
    assert_int_equal(rnc_tensor_bytes(&a, "rstd", &b), 0);
    assert_int_equal(b, 3 * 4);
    assert_int_equal(rnc_tensor_bytes(&a, "nope", &b), -1);
    /* No rows: one byte still names the memory. */
    a.m = 0;
    assert_int_equal(rnc_tensor_bytes(&a, "x", &b), 0);
    assert_int_equal(b, 1);
    assert_int_equal(rnc_tensor_bytes(&a, "rstd", &b), 0);
    assert_int_equal(b, 1);
    /* A stride below the row: the row counts (the daemon refuses it). */
    a.m = 2, a.x_stride = 1;
    assert_int_equal(rnc_tensor_bytes(&a, "x", &b), 0);
    assert_int_equal(b, 10 * 4);
    /* Overflow. */
    a.m = INT64_MAX, a.x_stride = INT64_MAX;
    assert_int_equal(rnc_tensor_bytes(&a, "x", &b), -1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_walk_one_chunk), cmocka_unit_test(test_walk_spanning),
        cmocka_unit_test(test_walk_uneven),    cmocka_unit_test(test_walk_hole),
        cmocka_unit_test(test_walk_growth),    cmocka_unit_test(test_walk_bad_lookup),
        cmocka_unit_test(test_tensor_bytes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
