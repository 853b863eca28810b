/* SPDX-License-Identifier: MIT */
/*
 * kernel_trace.c - bench_kernel --trace's report: from the per-block
 * records the kernel writes with -DRNK_TRACE=1 (rnk_test.h), where a launch's
 * time goes.  For one shape, the launch of median event time:
 *   the grid, blocks per SM (from %smid), chunks per block;
 *   T0 .. T5 of every block, relative to the launch's earliest T0: min /
 *   median / max over blocks;
 *   the phases T1-T0 (setup), T2-T1 (rows), T3-T2 (wait for every chunk),
 *   T4-T3 (dw finish), T5-T4 (exit): min / median / max;
 *   when the chunks were published (quantiles), and the straggler;
 *   the span (last T5 - first T0) against the event-timed launch;
 * and the spread of event time and span over all traced launches.
 */
#include "kernel_trace.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "rnk_test.h"

int kt_parse(const char *spec, kt_shape *s, int *ns)
{
    const char *p = spec;
    while (*p) {
        while (*p == '+' || *p == ';' || *p == ' ')
            p++;
        if (!*p)
            break;
        long long m = 0, n = 0;
        char w[8] = "f32";
        int used = 0;
        if (sscanf(p, "%lld,%lld%n", &m, &n, &used) != 2 || m <= 0 || n <= 0) {
            fprintf(stderr, "shapes: \"%s\": expected M,N[,f32|bf16]\n", p);
            return 2;
        }
        p += used;
        if (*p == ',') {
            size_t k = strcspn(p + 1, "+; ");
            if (k == 0 || k >= sizeof w) {
                fprintf(stderr, "shapes: bad weight dtype in \"%s\"\n", spec);
                return 2;
            }
            memcpy(w, p + 1, k);
            w[k] = 0;
            p += 1 + k;
        }
        if (strcmp(w, "f32") && strcmp(w, "bf16")) {
            fprintf(stderr, "shapes: weight dtype \"%s\": f32 or bf16\n", w);
            return 2;
        }
        if (*ns >= KT_MAX_SHAPES) {
            fprintf(stderr, "shapes: more than %d\n", KT_MAX_SHAPES);
            return 2;
        }
        s[*ns].m = m;
        s[*ns].n = n;
        snprintf(s[*ns].w, sizeof s[*ns].w, "%s", w);
        (*ns)++;
    }
    return 0;
}

/* One launch's records, checked against its buffer's size. */
typedef struct view {
    const rnk_trace_head *h;
    const rnk_trace_block *b;
    const rnk_trace_chunk *c;
    int nb, nc;  /* records present */
    uint64_t t0; /* earliest T0 */
    double span; /* us: latest T5 - earliest T0 */
} view;

static bool view_of(const kt_launch *l, view *v)
{
    memset(v, 0, sizeof *v);
    if (l->bytes < sizeof(rnk_trace_head))
        return false;
    v->h = (const rnk_trace_head *)l->buf;
    if (v->h->magic != RNK_TRACE_MAGIC)
        return false;
    size_t room = (l->bytes - sizeof *v->h) / sizeof *v->b;
    v->nb = (int)(v->h->blocks_cap < room ? v->h->blocks_cap : room);
    v->b = (const rnk_trace_block *)(v->h + 1);
    room = (l->bytes - sizeof *v->h - (size_t)v->nb * sizeof *v->b) / sizeof *v->c;
    v->nc = (int)(v->h->chunks_cap < room ? v->h->chunks_cap : room);
    v->c = (const rnk_trace_chunk *)(v->b + v->nb);
    uint64_t lo = UINT64_MAX, hi = 0;
    for (int i = 0; i < v->nb; i++) {
        if (v->b[i].t[0] && v->b[i].t[0] < lo)
            lo = v->b[i].t[0];
        if (v->b[i].t[5] > hi)
            hi = v->b[i].t[5];
    }
    if (lo == UINT64_MAX)
        return false;
    v->t0 = lo;
    v->span = hi > lo ? (double)(hi - lo) * 1e-3 : 0.0;
    return true;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* min / median / max of v[0..n) (sorted in place); "-" where n == 0 */
static void mmm(const char *name, double *v, int n)
{
    if (n == 0) {
        printf("    %-24s %9s %9s %9s\n", name, "-", "-", "-");
        return;
    }
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    double med = n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
    printf("    %-24s %9.2f %9.2f %9.2f\n", name, v[0], med, v[n - 1]);
}

/* the value at quantile q of sorted v[0..n) */
static double qtl(const double *v, int n, double q)
{
    int i = (int)(q * (n - 1)); /* the lower one: 0.5 gives the median shown */
    return v[i < 0 ? 0 : i >= n ? n - 1 : i];
}

static void write_csv(int64_t m, int64_t n, const char *w, const kt_launch *l, int nl, int shown,
                      const char *dir)
{
    char path[4096];
    if (mkdir(dir, 0777) && errno != EEXIST) {
        fprintf(stderr, "trace: cannot create %s\n", dir);
        return;
    }
    snprintf(path, sizeof path, "%s/trace-%lldx%lld-%s.csv", dir, (long long)m, (long long)n, w);
    FILE *fb = fopen(path, "w");
    snprintf(path, sizeof path, "%s/trace-%lldx%lld-%s-chunks.csv", dir, (long long)m, (long long)n,
             w);
    FILE *fc = fopen(path, "w");
    if (!fb || !fc) {
        fprintf(stderr, "trace: cannot write under %s\n", dir);
        if (fb)
            fclose(fb);
        if (fc)
            fclose(fc);
        return;
    }
    /* ns after the launch's earliest T0; -1: not reached */
    fprintf(fb, "launch,shown,event_us,span_us,block,smid,chunks,t0,t1,t2,t3,t4,t5\n");
    fprintf(fc, "launch,chunk,block,t\n");
    for (int i = 0; i < nl; i++) {
        view v;
        if (!view_of(&l[i], &v))
            continue;
        for (int b = 0; b < v.nb; b++) {
            fprintf(fb, "%d,%d,%.3f,%.3f,%d,%u,%u", i, i == shown, l[i].event_us, v.span, b,
                    v.b[b].smid, v.b[b].chunks);
            for (int k = 0; k < 6; k++)
                fprintf(fb, ",%lld", v.b[b].t[k] ? (long long)(v.b[b].t[k] - v.t0) : -1LL);
            fprintf(fb, "\n");
        }
        for (int k = 0; k < v.nc; k++)
            fprintf(fc, "%d,%d,%u,%lld\n", i, k, v.c[k].block,
                    v.c[k].t ? (long long)(v.c[k].t - v.t0) : -1LL);
    }
    fclose(fb);
    fclose(fc);
    printf("  raw rows: %s/trace-%lldx%lld-%s{,-chunks}.csv (ns after the launch's first T0)\n",
           dir, (long long)m, (long long)n, w);
}

int kt_report(int64_t m, int64_t n, const char *w, const char *plan, int sms, const kt_launch *l,
              int nl, const char *dir)
{
    static const char *bname[6] = {"T0 entry",           "T1 setup done",  "T2 rows done",
                                   "T3 all chunks done", "T4 finish done", "T5 exit"};
    static const char *pname[5] = {"setup  T1-T0", "rows   T2-T1", "wait   T3-T2", "finish T4-T3",
                                   "exit   T5-T4"};
    printf("\n== trace %lld x %lld, bf16 rows, w %s, rstd given: %s\n", (long long)m, (long long)n,
           w, plan);
    /* The launch shown: the median by event time among those that recorded. */
    int *ok = malloc(sizeof(int) * (size_t)(nl > 0 ? nl : 1));
    double *ev = malloc(sizeof(double) * (size_t)(nl > 0 ? nl : 1));
    double *sp = malloc(sizeof(double) * (size_t)(nl > 0 ? nl : 1));
    int nok = 0;
    for (int i = 0; i < nl; i++) {
        view v;
        if (view_of(&l[i], &v)) {
            ev[nok] = l[i].event_us;
            sp[nok] = v.span;
            ok[nok++] = i;
        }
    }
    if (nok == 0) {
        printf("  no launch recorded anything (a build without -DRNK_TRACE=1 in the kernels?)\n");
        free(ok);
        free(ev);
        free(sp);
        return 1;
    }
    int shown = ok[0];
    {
        double *e2 = malloc(sizeof(double) * (size_t)nok);
        memcpy(e2, ev, sizeof(double) * (size_t)nok);
        qsort(e2, (size_t)nok, sizeof *e2, cmp_d);
        double med = e2[(nok - 1) / 2];
        for (int i = 0; i < nok; i++)
            if (l[ok[i]].event_us == med) {
                shown = ok[i];
                break;
            }
        free(e2);
    }
    view v;
    view_of(&l[shown], &v);
    const rnk_trace_head *h = v.h;
    printf("  %d of %d launches recorded; shown: launch %d (median event time): event %.2f us, "
           "span %.2f us (last T5 - first T0)\n",
           nok, nl, shown, l[shown].event_us, v.span);
    qsort(ev, (size_t)nok, sizeof *ev, cmp_d);
    qsort(sp, (size_t)nok, sizeof *sp, cmp_d);
    printf("  over the %d launches, min / median / max: event %.2f / %.2f / %.2f us, span %.2f / "
           "%.2f / %.2f us\n",
           nok, ev[0], qtl(ev, nok, 0.5), ev[nok - 1], sp[0], qtl(sp, nok, 0.5), sp[nok - 1]);
    free(ev);
    free(sp);

    /* SMs: blocks per SM from %smid */
    int per_sm[1024] = {0}, used = 0, bmax = 0, bmin = 1 << 30;
    for (int b = 0; b < v.nb; b++)
        if (v.b[b].t[0] && v.b[b].smid < 1024)
            per_sm[v.b[b].smid]++;
    for (int s = 0; s < 1024; s++)
        if (per_sm[s]) {
            used++;
            bmax = per_sm[s] > bmax ? per_sm[s] : bmax;
            bmin = per_sm[s] < bmin ? per_sm[s] : bmin;
        }
    unsigned kind = h->kind;
    printf("  grid %u blocks of %u threads (%s path, nv %u, G %u x tpr %u, mode %u); %d of %d SMs "
           "used, blocks per SM %d..%d (%.2f on average); %u chunks, %u dw slices\n",
           h->grid, h->threads, (kind & 15) == 1 ? "fast" : "general", (kind >> 4) & 15, h->G,
           h->tpr, kind >> 8, used, sms, used ? bmin : 0, bmax, used ? (double)v.nb / used : 0.0,
           h->nchunks, h->nslices);
    if (v.nb < (int)h->grid || v.nc < (int)h->nchunks)
        printf("  NOTE: the buffer held %d of %u blocks and %d of %u chunks\n", v.nb, h->grid, v.nc,
               h->nchunks);

    /* the timer's step: the smallest gap between distinct readings */
    int nt = 0;
    uint64_t *all = malloc(sizeof(uint64_t) * ((size_t)v.nb * 6 + (size_t)v.nc + 1));
    for (int b = 0; b < v.nb; b++)
        for (int k = 0; k < 6; k++)
            if (v.b[b].t[k])
                all[nt++] = v.b[b].t[k];
    for (int k = 0; k < v.nc; k++)
        if (v.c[k].t)
            all[nt++] = v.c[k].t;
    qsort(all, (size_t)nt, sizeof *all, cmp_u64);
    uint64_t step = 0;
    for (int i = 1; i < nt; i++)
        if (all[i] > all[i - 1] && (step == 0 || all[i] - all[i - 1] < step))
            step = all[i] - all[i - 1];
    free(all);
    printf("  %%globaltimer step seen: %llu ns%s\n", (unsigned long long)step,
           step >= 500 ? " (coarse: phases shorter than this read as 0 or one step)" : "");

    double *x = malloc(sizeof(double) * (size_t)(v.nb > v.nc ? v.nb : v.nc) + sizeof(double));
    printf("    %-24s %9s %9s %9s\n", "us after the first T0", "min", "median", "max");
    for (int k = 0; k < 6; k++) {
        int c = 0;
        for (int b = 0; b < v.nb; b++)
            if (v.b[b].t[k])
                x[c++] = (double)(v.b[b].t[k] - v.t0) * 1e-3;
        mmm(bname[k], x, c);
    }
    printf("    %-24s %9s %9s %9s\n", "phase, us", "min", "median", "max");
    for (int k = 0; k < 5; k++) {
        int c = 0;
        for (int b = 0; b < v.nb; b++)
            if (v.b[b].t[k] && v.b[b].t[k + 1])
                x[c++] = (double)(v.b[b].t[k + 1] - v.b[b].t[k]) * 1e-3;
        mmm(pname[k], x, c);
    }
    {
        int c = 0;
        for (int b = 0; b < v.nb; b++)
            if (v.b[b].t[2])
                x[c++] = v.b[b].chunks;
        mmm("chunks a block", x, c);
    }

    /* the finish, in the blocks that had slices: their group sums (tg), then
     * the column sums; and the block that finished last */
    {
        int c = 0, lastf = -1;
        for (int b = 0; b < v.nb; b++)
            if (v.b[b].tg && v.b[b].t[3])
                x[c++] = (double)(v.b[b].tg - v.b[b].t[3]) * 1e-3;
        mmm("groups tg-T3 (finishers)", x, c);
        c = 0;
        for (int b = 0; b < v.nb; b++)
            if (v.b[b].tg && v.b[b].t[4]) {
                x[c++] = (double)(v.b[b].t[4] - v.b[b].tg) * 1e-3;
                if (lastf < 0 || v.b[b].t[4] > v.b[lastf].t[4])
                    lastf = b;
            }
        mmm("sums T4-tg (finishers)", x, c);
        if (lastf >= 0)
            printf("  last T4: block %d (SM %u): T3 %.2f, groups %.2f, T4 %.2f, T5 %.2f us\n", lastf,
                   v.b[lastf].smid, (double)(v.b[lastf].t[3] - v.t0) * 1e-3,
                   (double)(v.b[lastf].tg - v.t0) * 1e-3, (double)(v.b[lastf].t[4] - v.t0) * 1e-3,
                   v.b[lastf].t[5] ? (double)(v.b[lastf].t[5] - v.t0) * 1e-3 : -1.0);
    }

    /* the block whose claim loop ended last holds everyone's T3 */
    int last = -1;
    for (int b = 0; b < v.nb; b++)
        if (v.b[b].t[2] && (last < 0 || v.b[b].t[2] > v.b[last].t[2]))
            last = b;
    if (last >= 0)
        printf("  last T2: block %d (SM %u, %u chunks): T0 %.2f, T1 %.2f, T2 %.2f us\n", last,
               v.b[last].smid, v.b[last].chunks, (double)(v.b[last].t[0] - v.t0) * 1e-3,
               v.b[last].t[1] ? (double)(v.b[last].t[1] - v.t0) * 1e-3 : -1.0,
               (double)(v.b[last].t[2] - v.t0) * 1e-3);

    /* chunk publishes, in the order they happened */
    int c = 0, lastc = -1;
    for (int k = 0; k < v.nc; k++)
        if (v.c[k].t) {
            x[c++] = (double)(v.c[k].t - v.t0) * 1e-3;
            if (lastc < 0 || v.c[k].t > v.c[lastc].t)
                lastc = k;
        }
    if (c > 0) {
        qsort(x, (size_t)c, sizeof *x, cmp_d);
        printf("  chunk publishes (us after the first T0): first %.2f, 10%% %.2f, 50%% %.2f, "
               "90%% %.2f, last %.2f (chunk %d, block %u)\n",
               x[0], qtl(x, c, 0.1), qtl(x, c, 0.5), qtl(x, c, 0.9), x[c - 1], lastc,
               v.c[lastc].block);
        /* how long the waiting blocks took to see the last publish (the
         * finishers: a block without a slice does not wait, and its T3 is
         * its T4) */
        double lo = 1e30, hi = -1e30;
        for (int b = 0; b < v.nb; b++)
            if (v.b[b].t[3] && v.b[b].tg) {
                double t3 = (double)(v.b[b].t[3] - v.t0) * 1e-3;
                lo = t3 < lo ? t3 : lo;
                hi = t3 > hi ? t3 : hi;
            }
        if (hi >= 0)
            printf("  last publish to T3 (the wait's wake-up): first block %.2f us, last %.2f us\n",
                   lo - x[c - 1], hi - x[c - 1]);
    }
    free(x);
    free(ok);
    if (dir)
        write_csv(m, n, w, l, nl, shown, dir);
    return 0;
}
