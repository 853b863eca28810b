/* SPDX-License-Identifier: MIT */
/*
 * kernel_floor.c - bench_kernel --floor: the streaming kernels' check and the
 * floors' tables and CSV.
 */
#include "kernel_floor.h"

#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>

#include "gpu/e2e_cuda.h"
#include "rnk_conv.h"

#define CU(call) RNE_CK(call)

static const char *const how_name[RNK_ADD_HOWS] = {"flat", "S", "S+bar", "S ahead 2",
                                                    "S grid x2"};

void kf_check_add(const rnk_bwd_args *a, int how)
{
    const int64_t mn = a->m * a->n;
    for (int k = 0; k < 64; k++) {
        const int64_t i = k * (mn - 1) / 63;
        uint16_t x, dy, dx;
        CU(cudaMemcpy(&x, (const uint16_t *)a->x + i, 2, cudaMemcpyDeviceToHost));
        CU(cudaMemcpy(&dy, (const uint16_t *)a->dy + i, 2, cudaMemcpyDeviceToHost));
        CU(cudaMemcpy(&dx, (const uint16_t *)a->dx + i, 2, cudaMemcpyDeviceToHost));
        const uint16_t want = rnk_f32_to_bf16(rnk_bf16_to_f32(x) + rnk_bf16_to_f32(dy));
        if (dx != want) {
            fprintf(stderr, "add kernel (%s) %lldx%lld: element %lld is 0x%04x, want 0x%04x\n",
                    how_name[how], (long long)a->m, (long long)a->n, (long long)i, dx, want);
            exit(1);
        }
    }
}

/* Bandwidth of 6MN bytes in us, TB/s (0 where us is 0: not run). */
static double tbps_of(const kf_row *r, double us)
{
    return us > 0 ? 6.0 * (double)r->m * (double)r->n / (us * 1e-6) / 1e12 : 0.0;
}

/* The same as a percentage of copy_bw (bytes/s). */
static double pct_of(const kf_row *r, double us, double copy_bw)
{
    return 100.0 * tbps_of(r, us) * 1e12 / copy_bw;
}

int kf_report(const char *dir, double copy_bw, const kf_row *rows, int nrows)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/floor.csv", dir);
    FILE *fl = fopen(path, "w");
    if (!fl) {
        fprintf(stderr, "cannot write %s\n", path);
        return 1;
    }
    fprintf(fl, "m,n,w,fused_us,empty_as_launched_us,empty_one_warp_us,add_us,add_tbps,"
                "add_pct_copy,add_s_us,add_s_bar_us,add_s_ahead2_us,add_s_grid2_us\n");
    printf("\nthe floors: an empty kernel with each shape's grid, block, shared memory and "
           "parameter size; an empty one-warp kernel; dx = x + dy (6MN bytes; %%copy of "
           "%.3f TB/s; fused speed as a share of its)\n%6s %5s %4s | %8s %8s %8s | %8s "
           "| %8s %6s %5s %7s\n",
           copy_bw / 1e12, "M", "N", "w", "fused us", "empty us", "warp us", "fused-empty",
           "add us", "TB/s", "%copy", "add/fus");
    for (int i = 0; i < nrows; i++) {
        const kf_row *r = &rows[i];
        const double add_tbps = tbps_of(r, r->add_us[RNK_ADD_FLAT]);
        const double add_pct = pct_of(r, r->add_us[RNK_ADD_FLAT], copy_bw);
        printf("%6lld %5lld %4s | %8.2f %8.2f %8.2f | %8.2f | %8.2f %6.3f %5.1f %7.3f\n",
               (long long)r->m, (long long)r->n, r->w, r->fused_us, r->empty_us[0], r->empty_us[1],
               r->fused_us - r->empty_us[0], r->add_us[RNK_ADD_FLAT], add_tbps, add_pct,
               r->add_us[RNK_ADD_FLAT] / r->fused_us);
        fprintf(fl, "%lld,%lld,%s,%.3f,%.3f,%.3f,%.3f,%.4f,%.2f", (long long)r->m, (long long)r->n,
                r->w, r->fused_us, r->empty_us[0], r->empty_us[1], r->add_us[RNK_ADD_FLAT],
                add_tbps, add_pct);
        for (int h = RNK_ADD_S; h < RNK_ADD_HOWS; h++)
            fprintf(fl, ",%.3f", r->add_us[h]);
        fprintf(fl, "\n");
    }
    fclose(fl);
    /* The S-shaped ones, where they ran. */
    printf("\nthe add kernel shaped as the S plan (its grid, block, threads a row, loads "
           "and stores; rows through registers): %%copy of each\n%6s %5s %4s | %8s %6s |",
           "M", "N", "w", "fused us", "%copy");
    for (int h = RNK_ADD_FLAT; h < RNK_ADD_HOWS; h++)
        printf(" %10s", how_name[h]);
    printf("\n");
    for (int i = 0; i < nrows; i++) {
        const kf_row *r = &rows[i];
        if (r->add_us[RNK_ADD_S] <= 0)
            continue;
        printf("%6lld %5lld %4s | %8.2f %6.1f |", (long long)r->m, (long long)r->n, r->w,
               r->fused_us, pct_of(r, r->fused_us, copy_bw));
        for (int h = RNK_ADD_FLAT; h < RNK_ADD_HOWS; h++)
            printf(" %10.1f", pct_of(r, r->add_us[h], copy_bw));
        printf("\n");
    }
    return 0;
}
