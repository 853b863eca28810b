/* SPDX-License-Identifier: MIT */
/*
 * test_valgrind - the daemon and clients under valgrind --leak-check=full
 * for a short run: no memory errors and no leaks (valgrind's error exit
 * code fails the test).  Skipped where valgrind is missing and in sanitizer
 * builds (valgrind cannot run AddressSanitizer binaries).
 */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rn_test.h"
#include "integration/harness.h"

static void dump_valgrind_logs(const rnh_daemon *d)
{
    DIR *dd = opendir(d->dir);
    struct dirent *de;
    char path[512], line[1024];
    if (dd == NULL)
        return;
    while ((de = readdir(dd)) != NULL) {
        FILE *f;
        if (strncmp(de->d_name, "valgrind.", 9) != 0)
            continue;
        snprintf(path, sizeof path, "%s/%s", d->dir, de->d_name);
        printf("---- %s ----\n", path);
        if ((f = fopen(path, "r")) != NULL) {
            while (fgets(line, sizeof line, f))
                fputs(line, stdout);
            fclose(f);
        }
    }
    closedir(dd);
}

static void test_valgrind(void **state)
{
    rnh_daemon *d = *state;
    rnh_proc p;
    char line[200];
    int st;

    if (rnh_asan())
        RN_SKIP("valgrind cannot run AddressSanitizer builds (the ASan run checks leaks itself)");
    if (rnh_valgrind() == NULL)
        RN_SKIP("valgrind is not installed (make deps installs it)");

    d->valgrind = true;
    rnh_arg(d, "--threads");
    rnh_arg(d, "2");
    assert_int_equal(rnh_start(d), 0);

    /* A client under valgrind: connect, buffers, requests, errors, close. */
    {
        const char *argv[] = {"prog_worker", "--endpoint", d->endpoint, "-r",      "20",  "--m",
                              "8",           "--n",        "96",        "--dtype", "f16", NULL};
        assert_int_equal(rnh_spawn("prog_worker", argv, true, &p), 0);
        assert_true(rnh_read_line(&p, line, sizeof line, 120000) >= 0);
        assert_string_equal(line, "ready");
        assert_true(rnh_read_line(&p, line, sizeof line, 120000) >= 0);
        assert_string_equal(line, "first");
        assert_true(rnh_read_line(&p, line, sizeof line, 120000) >= 0);
        assert_string_equal(line, "done ok=20 failed=0 last=OK");
        st = rnh_wait(&p, 120000);
        rnh_proc_close(&p);
        if (st != 0)
            fail_msg("prog_worker under valgrind exited with %d (97: valgrind found errors)", st);
    }
    /* rmsnormctl too: stats and a small selftest-like bench. */
    {
        char ctl[512];
        snprintf(ctl, sizeof ctl, "%s/rmsnormctl", rnh_build_dir());
        const char *argv[] = {"rmsnormctl", "--endpoint",   d->endpoint,
                              "stats",      "--prometheus", NULL};
        assert_int_equal(rnh_spawn(ctl, argv, true, &p), 0);
        assert_true(rnh_read_line(&p, line, sizeof line, 120000) >= 0);
        assert_non_null(strstr(line, "# HELP"));
        st = rnh_wait(&p, 120000);
        rnh_proc_close(&p);
        if (st != 0)
            fail_msg("rmsnormctl under valgrind exited with %d (97: valgrind found errors)", st);
    }
    st = rnh_stop(d, RNH_STOP_TIMEOUT_MS);
    if (st != 0) {
        dump_valgrind_logs(d);
        fail_msg("rmsnormd under valgrind exited with %d (97: valgrind found errors)", st);
    }
    RNH_PASS(d);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_valgrind, rnh_setup, rnh_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
