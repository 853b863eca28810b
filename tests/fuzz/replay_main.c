/* SPDX-License-Identifier: MIT */
/*
 * replay_main.c - runs fuzz harnesses without libFuzzer: feeds every regular
 * file of the directories named on the command line to
 * LLVMFuzzerTestOneInput once, and prints a cmocka-style report that
 * tests/run.sh counts (one test per file).  A crash or an abort in the
 * harness is the failure; the last "replay:" line names the file.
 */
#include <dirent.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int cmp(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Replays one file; returns 0, or -1 if it cannot be read. */
static int replay(const char *path)
{
    FILE *f = fopen(path, "rb");
    uint8_t *buf = NULL;
    long n;
    int rc = -1;
    if (!f)
        return -1;
    if (fseek(f, 0, SEEK_END) != 0 || (n = ftell(f)) < 0 || fseek(f, 0, SEEK_SET) != 0)
        goto out;
    /* An exact-size heap copy, so a sanitizer sees any read past the end. */
    buf = malloc(n ? (size_t)n : 1);
    if (!buf || fread(buf, 1, (size_t)n, f) != (size_t)n)
        goto out;
    printf("replay: %s (%ld bytes)\n", path, n);
    fflush(stdout);
    LLVMFuzzerTestOneInput(buf, (size_t)n);
    rc = 0;
out:
    free(buf);
    fclose(f);
    return rc;
}

int main(int argc, char **argv)
{
    int files = 0, failed = 0;
    for (int a = 1; a < argc; a++) {
        DIR *d = opendir(argv[a]);
        struct dirent *e;
        char **names = NULL;
        size_t nn = 0;
        if (!d) {
            if (errno == ENOENT)
                continue; /* an absent folder has nothing to replay */
            fprintf(stderr, "replay: cannot open %s: %s\n", argv[a], strerror(errno));
            failed++;
            continue;
        }
        while ((e = readdir(d)) != NULL) {
            if (e->d_name[0] == '.')
                continue;
            char **grown = realloc(names, (nn + 1) * sizeof *names);
            if (!grown)
                abort();
            names = grown;
            names[nn++] = strdup(e->d_name);
        }
        closedir(d);
        /* Sorted, so that runs are repeatable and the log reads in order. */
        qsort(names, nn, sizeof *names, cmp);
        for (size_t i = 0; i < nn; i++) {
            char path[4096];
            snprintf(path, sizeof path, "%s/%s", argv[a], names[i]);
            if (replay(path) != 0) {
                fprintf(stderr, "replay: cannot read %s\n", path);
                failed++;
            } else {
                files++;
            }
            free(names[i]);
        }
        free(names);
    }
    printf("[==========] %d test(s) run.\n", files + failed);
    printf("[  PASSED  ] %d test(s).\n", files);
    if (failed)
        printf("[  FAILED  ] %d test(s).\n", failed);
    return failed ? 1 : 0;
}
