/* SPDX-License-Identifier: MIT */
/*
 * kernel_report.c - bench_kernel's results: the table, kernel.csv,
 * kernel.json and issue 15's targets (kernel_report.h).
 */
#include "kernel_report.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

void kr_load_torch(kr_row *rows, int nrows, const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, "note: no PyTorch results (%s)\n", path);
        return;
    }
    char line[256], w[16];
    long long m, n;
    double e, c, d = 0, q = 0;
    while (fgets(line, sizeof line, f)) {
        int k = sscanf(line, "%lld,%lld,%15[^,],%lf,%lf,%lf,%lf", &m, &n, w, &e, &c, &d, &q);
        if (k < 5)
            continue;
        if (k < 7)
            d = q = 0;
        for (int i = 0; i < nrows; i++)
            if (rows[i].m == m && rows[i].n == n && strcmp(rows[i].w, w) == 0) {
                rows[i].torch_eager = e;
                rows[i].torch_compile = c;
                rows[i].torch_det = d;
                rows[i].quack = q;
            }
    }
    fclose(f);
}

int kr_report(const char *dir, const char *gpu, int sms, double copy_bw, double copy_bw2,
              bool copy_measured, bool with_floor, const kr_row *rows, int nrows)
{
    char path[4096];
    time_t now = time(NULL);
    char date[64];
    strftime(date, sizeof date, "%Y-%m-%d %H:%M UTC", gmtime(&now));
    printf("GPU: %s, %d SMs; %s\n", gpu, sms, date);
    if (copy_measured)
        printf("D2D copy bandwidth (read + write): %.3f TB/s at start, %.3f TB/s at end\n",
               copy_bw / 1e12, copy_bw2 / 1e12);
    else
        printf("D2D copy bandwidth: not measured (--shape without --floor); %%copy assumes "
               "%.2f TB/s\n",
               copy_bw / 1e12);
    printf("\n%6s %5s %4s | %8s %6s %5s | %8s %8s %5s %5s | %8s %8s %8s %8s | %5s %5s %5s %5s\n",
           "M", "N", "w", "fused us", "TB/s", "%copy", "sep us", "atom us", "f/sep", "f/atm",
           "eager us", "comp us", "det us", "quack us", "f/eag", "f/cmp", "f/det", "f/qck");
    snprintf(path, sizeof path, "%s/kernel.csv", dir);
    FILE *csv = fopen(path, "w");
    snprintf(path, sizeof path, "%s/kernel.json", dir);
    FILE *js = fopen(path, "w");
    if (!csv || !js) {
        fprintf(stderr, "cannot write under %s\n", dir);
        return 1;
    }
    fprintf(csv, "m,n,w,bytes,fused_us,separate_us,atomic_us,torch_eager_us,torch_compile_us,"
                 "torch_compile_det_us,quack_us,fused_tbps,floor_us,plan\n");
    fprintf(js, "{\n  \"gpu\": \"%s\", \"sms\": %d, \"date\": \"%s\",\n"
                "  \"copy_tbps\": %.4f, \"copy_tbps_end\": %.4f, \"copy_measured\": %s,\n"
                "  \"rows\": [\n",
            gpu, sms, date, copy_bw / 1e12, copy_bw2 / 1e12,
            copy_measured ? "true" : "false");
    /* Issue 15's targets; a ratio x/fused > 1 means fused is faster. */
    int miss_bw = 0, big = 0, miss_sep = 0, miss_atom = 0, miss_q = 0, nq = 0;
    int miss_e = 0, miss_c = 0, miss_d = 0, nt = 0;
    double lq = 0, worst_q = 1e9, worst_atom = 1e9, worst_sep = 1e9, us_small = 0;
    for (int i = 0; i < nrows; i++) {
        const kr_row *r = &rows[i];
        double tbps = r->bytes / (r->us[0] * 1e-6) / 1e12;
        double floor_us = r->bytes / copy_bw * 1e6;
        double fs = r->us[1] / r->us[0], fa = r->us[2] / r->us[0];
        bool is_big = r->m * r->n >= ((int64_t)1 << 26);
        bool low = is_big && tbps < 0.9 * copy_bw / 1e12;
        big += is_big;
        miss_bw += low;
        miss_sep += fs < 1.0;
        miss_atom += fa < 0.97;
        worst_sep = fs < worst_sep ? fs : worst_sep;
        worst_atom = fa < worst_atom ? fa : worst_atom;
        if (r->m == 4096 && r->n == 256 && (us_small == 0 || r->us[0] > us_small))
            us_small = r->us[0];
        double fe = r->torch_eager > 0 ? r->torch_eager / r->us[0] : 0;
        double fc = r->torch_compile > 0 ? r->torch_compile / r->us[0] : 0;
        double fd = r->torch_det > 0 ? r->torch_det / r->us[0] : 0;
        double fq = r->quack > 0 ? r->quack / r->us[0] : 0;
        if (r->torch_eager > 0) {
            nt++;
            miss_e += fe <= 1.0;
            miss_c += fc <= 1.0;
            miss_d += fd <= 1.0;
        }
        if (r->quack > 0) {
            nq++;
            miss_q += fq <= 1.0;
            lq += log(fq);
            worst_q = fq < worst_q ? fq : worst_q;
        }
        printf("%6lld %5lld %4s | %8.2f %6.3f %5.1f | %8.2f %8.2f %5.3f %5.3f | %8.2f %8.2f %8.2f "
               "%8.2f | %5.2f %5.2f %5.2f %5.3f%s\n",
               (long long)r->m, (long long)r->n, r->w, r->us[0], tbps,
               100.0 * tbps * 1e12 / copy_bw, r->us[1], r->us[2], fs, fa, r->torch_eager,
               r->torch_compile, r->torch_det, r->quack, fe, fc, fd, fq, low ? "  <90%" : "");
        fprintf(csv, "%lld,%lld,%s,%.0f,%.3f,%.3f,%.3f,%.3f,%.3f,%.3f,%.3f,%.4f,%.3f,\"%s\"\n",
                (long long)r->m, (long long)r->n, r->w, r->bytes, r->us[0], r->us[1], r->us[2],
                r->torch_eager, r->torch_compile, r->torch_det, r->quack, tbps, floor_us, r->plan);
        fprintf(js,
                "    {\"m\": %lld, \"n\": %lld, \"w\": \"%s\", \"bytes\": %.0f, \"fused_us\": %.3f, "
                "\"separate_us\": %.3f, \"atomic_us\": %.3f, \"torch_eager_us\": %.3f, "
                "\"torch_compile_us\": %.3f, \"torch_compile_det_us\": %.3f, \"quack_us\": %.3f, "
                "\"floor_us\": %.3f, \"plan\": \"%s\"}%s\n",
                (long long)r->m, (long long)r->n, r->w, r->bytes, r->us[0], r->us[1], r->us[2],
                r->torch_eager, r->torch_compile, r->torch_det, r->quack, floor_us, r->plan,
                i + 1 < nrows ? "," : "");
    }
    fprintf(js, "  ]\n}\n");
    fclose(csv);
    fclose(js);
    if (with_floor) {
        kf_row *fl = calloc((size_t)nrows, sizeof *fl);
        for (int i = 0; i < nrows; i++)
            fl[i] = rows[i].fl;
        int rc = kf_report(dir, copy_bw, fl, nrows);
        free(fl);
        if (rc)
            return rc;
    }
    printf("\nplans:\n");
    for (int i = 0; i < nrows; i++)
        printf("  %6lld x %5lld %4s: %s\n", (long long)rows[i].m, (long long)rows[i].n, rows[i].w,
               rows[i].plan);
    printf("\ntargets (issue 15, %d shapes):\n", nrows);
    if (nq)
        printf("  faster than Quack everywhere: %s (%d of %d miss, worst %.3fx); geomean %.3fx "
               "(target 1.15x): %s\n",
               miss_q ? "MISSED" : "held", miss_q, nq, worst_q, exp(lq / nq),
               exp(lq / nq) >= 1.15 ? "held" : "MISSED");
    else
        printf("  Quack: not measured in this run\n");
    printf("  M*N >= 2^26 at >= 90%% of copy bandwidth: %s (%d of %d miss)\n",
           miss_bw ? "MISSED" : "held", miss_bw, big);
    if (nt)
        printf("  faster than eager / torch.compile / torch.compile deterministic everywhere: "
               "%s (%d / %d / %d of %d miss)\n",
               miss_e + miss_c + miss_d ? "MISSED" : "held", miss_e, miss_c, miss_d, nt);
    else
        printf("  PyTorch: not measured in this run\n");
    printf("  fused >= 1.0x over separate everywhere: %s (%d miss, worst %.3fx)\n",
           miss_sep ? "MISSED" : "held", miss_sep, worst_sep);
    printf("  fused within 3%% of atomic everywhere: %s (%d miss, worst %.3fx)\n",
           miss_atom ? "MISSED" : "held", miss_atom, worst_atom);
    if (us_small > 0)
        printf("  4096 x 256 <= 10 us: %s (%.2f us, the slower weight dtype)\n",
               us_small <= 10.0 ? "held" : "MISSED", us_small);
    return 0;
}
