/* SPDX-License-Identifier: MIT */
/*
 * cmd_selftest.c - rmsnormctl selftest: a grid of shapes and dtypes and the
 * optional parts of the call, each checked against the CPU twin and the
 * fp64 reference (rmsnormctl_verify.c).
 */
#include <string.h>

#include "rmsnormctl.h"
#include "rmsnormctl_verify.h"

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

int rnctl_selftest(const rnctl_globals *g, int argc, char **argv)
{
    static const rn_dtype dts[] = {RN_DTYPE_BF16, RN_DTYPE_F16, RN_DTYPE_F32};
    static const int64_t shapes[][2] = {{1, 1},     {3, 7},      {17, 128},
                                        {64, 1000}, {300, 4096}, {0, 64}};
    rn_client *c = NULL;
    struct rn_server_info si;
    int verbose = 0, fails = 0, total = 0, rv;
    bool bitwise, cuda;

    for (int i = 1; i < argc; i++) {
        if (rnctl_is_help(argv[i])) {
            printf(
                "Usage: %s selftest [-v]\n\nAllocate buffers (shared memory for the CPU backend,\n"
                "device memory for the CUDA backend), submit a grid of shapes and dtypes, and\n"
                "check every result against the CPU twin (bitwise, on the CPU backend) and\n"
                "the fp64 reference.  Exit 0 only if all match.\n"
                "  -v, --verbose   one line per case\n",
                RNCTL_PROG);
            return 0;
        } else if (strcmp(argv[i], "-v") == 0 || strcmp(argv[i], "--verbose") == 0) {
            verbose = 1;
        } else {
            return rnctl_unknown_option("selftest", argv[i]);
        }
    }
    if (rnctl_connect(g, &c) != 0)
        return EXIT_UNREACHABLE;
    if ((rv = rn_server_info(c, &si)) != 0) {
        rnctl_call_failed(c, "info", rv);
        rn_close(c);
        return rnctl_failure_status(rv);
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
     * padded rows, dw in the weight's dtype, weight offset: variations of one
     * 33 x 257 bf16 case, and one larger shape. */
    {
        /* One row per case: clearer as a table than wrapped field by field. */
        /* clang-format off */
        static const rnv_case variants[] = {
            {.m = 33, .n = 257, .x = RN_DTYPE_BF16, .dy = RN_DTYPE_BF16, .dx = RN_DTYPE_BF16,
             .eps = 1e-5f},
            {.m = 33, .n = 257, .x = RN_DTYPE_BF16, .dy = RN_DTYPE_BF16, .dx = RN_DTYPE_BF16,
             .eps = 1e-5f, .w = RN_DTYPE_BF16, .dw = RN_DTYPE_BF16, .weight_offset = 1.0f},
            {.m = 33, .n = 257, .x = RN_DTYPE_BF16, .dy = RN_DTYPE_BF16, .dx = RN_DTYPE_BF16,
             .eps = 1e-5f, .dres = RN_DTYPE_F32, .w = RN_DTYPE_F32, .dw = RN_DTYPE_F32},
            {.m = 33, .n = 257, .x = RN_DTYPE_BF16, .dy = RN_DTYPE_BF16, .dx = RN_DTYPE_BF16,
             .eps = 1e-5f, .inplace = true, .rstd = true, .w = RN_DTYPE_F16, .dw = RN_DTYPE_F32},
            {.m = 33, .n = 257, .x = RN_DTYPE_F32, .dy = RN_DTYPE_F16, .dx = RN_DTYPE_BF16,
             .eps = 1e-5f, .pad = 7},
            {.m = 2048, .n = 512, .x = RN_DTYPE_BF16, .dy = RN_DTYPE_BF16, .dx = RN_DTYPE_BF16,
             .eps = 1e-5f, .w = RN_DTYPE_F32, .dw = RN_DTYPE_F32},
        };
        /* clang-format on */
        for (size_t v = 0; v < sizeof variants / sizeof variants[0]; v++) {
            total++;
            fails += run_case(c, cuda, &variants[v], 1000 + (uint64_t)v, bitwise, verbose) != 0;
        }
    }
    rn_close(c);
    printf("selftest: %d of %d cases match (%s backend%s)\n", total - fails, total, si.backend,
           bitwise ? ", bitwise against the CPU twin" : "");
    return fails ? EXIT_CHECK : 0;
}
