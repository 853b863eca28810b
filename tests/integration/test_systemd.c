/* SPDX-License-Identifier: MIT */
/*
 * test_systemd.c - the deployment as an operator meets it.
 *
 *  - `make install` into a fresh DESTDIR (with a PREFIX other than the
 *    default, so that every path rewrite is exercised), checked file by file:
 *    the exact set of files, their modes, the SONAME links, the installed
 *    binaries identical to the build's, the pkg-config file; then
 *    `make uninstall` removes every file again.
 *  - `systemd-analyze verify` on the installed system and user units: any
 *    output at all fails the test (verify prints warnings yet exits 0).  The
 *    units name their programs by installed path, so the checked copies name
 *    the DESTDIR copy of rmsnormd instead (and a stub where this host has no
 *    nvidia-cuda-mps-control); MANPATH points at the installed man pages, so
 *    verify's Documentation= check finds exactly what was installed.
 *  - `systemd-analyze security --offline=true` on the system template: the
 *    overall exposure must be at most 3.0.
 *  - The sysusers.d and tmpfiles.d entries applied to an empty root.
 *  - The man pages against what they describe: every flag of `rmsnormd
 *    --help`, every command of rmsnormctl, every function of the public
 *    header.
 *  - The daemon's sd_notify protocol on a NOTIFY_SOCKET this test owns, with
 *    WATCHDOG_USEC set and the example configuration (every key enabled) as
 *    its config file: READY=1 (the socket is then bound, with its mode and
 *    group), STATUS=, at least two WATCHDOG=1 pings at less than the
 *    watchdog interval, and after SIGTERM STOPPING=1 and exit status 0.
 *
 * Needs RN_BUILD and RN_SRC (tests/run.sh sets them).  None of this needs
 * systemd as PID 1.
 */
#include "rn_test.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <grp.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifndef RN_VERSION
#error "RN_VERSION comes from the Makefile"
#endif

/* The PREFIX of the test install: not the default, so rewrites show. */
#define TPREFIX "/opt/rmsnormd"
#define SOVERSION "0"
#define WATCHDOG_USEC 400000ULL

/* ---- small helpers ------------------------------------------------------------ */

static const char *env_or_skip(const char *name)
{
    const char *v = getenv(name);
    return (v && *v) ? v : NULL;
}

static char *xasprintf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static char *xasprintf(const char *fmt, ...)
{
    va_list ap;
    char *s = NULL;
    va_start(ap, fmt);
    int n = vasprintf(&s, fmt, ap);
    va_end(ap);
    assert_true(n >= 0);
    return s;
}

static char *read_file(const char *path)
{
    FILE *f = fopen(path, "re");
    if (!f)
        return NULL;
    char *buf = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&buf, &len);
    char chunk[4096];
    size_t n;
    while ((n = fread(chunk, 1, sizeof chunk, f)) > 0)
        fwrite(chunk, 1, n, m);
    fclose(f);
    fclose(m);
    return buf;
}

static void write_file(const char *path, const char *text, mode_t mode)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
    assert_true(fd >= 0);
    size_t len = strlen(text);
    assert_int_equal(write(fd, text, len), (ssize_t)len);
    close(fd);
    assert_int_equal(chmod(path, mode), 0);
}

static bool files_equal(const char *a, const char *b)
{
    struct stat sa, sb;
    if (stat(a, &sa) != 0 || stat(b, &sb) != 0 || sa.st_size != sb.st_size)
        return false;
    FILE *fa = fopen(a, "re"), *fb = fopen(b, "re");
    bool same = fa && fb;
    while (same) {
        int ca = fgetc(fa), cb = fgetc(fb);
        if (ca != cb)
            same = false;
        if (ca == EOF || cb == EOF)
            break;
    }
    if (fa)
        fclose(fa);
    if (fb)
        fclose(fb);
    return same;
}

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st, (void)flag, (void)ftw;
    remove(path);
    return 0;
}

static void rm_rf(const char *path)
{
    if (path)
        nftw(path, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

static bool have_program(const char *name)
{
    const char *path = getenv("PATH");
    char *copy = strdup(path ? path : "/usr/bin:/bin"), *save = NULL;
    bool found = false;
    for (char *dir = strtok_r(copy, ":", &save); dir && !found; dir = strtok_r(NULL, ":", &save)) {
        char *p = xasprintf("%s/%s", dir, name);
        found = access(p, X_OK) == 0;
        free(p);
    }
    free(copy);
    return found;
}

/*
 * Run argv (PATH lookup) with extra environment entries ("NAME=value", or
 * "NAME" to unset), stdin from /dev/null, stdout and stderr together into
 * *out (malloc'd, NUL-terminated).  Killed after timeout_s.  Returns the exit
 * status, or -1 when it did not exit normally.
 */
static int run(char *const argv[], char *const env[], char **out, int timeout_s)
{
    int pipefd[2];
    assert_int_equal(pipe2(pipefd, O_CLOEXEC), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        int null = open("/dev/null", O_RDONLY);
        dup2(null, 0);
        dup2(pipefd[1], 1);
        dup2(pipefd[1], 2);
        for (size_t i = 0; env && env[i]; i++) {
            if (strchr(env[i], '='))
                putenv(env[i]);
            else
                unsetenv(env[i]);
        }
        execvp(argv[0], argv);
        fprintf(stderr, "exec %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    close(pipefd[1]);
    char *buf = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&buf, &len);
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    bool killed = false;
    for (;;) {
        struct timespec now;
        clock_gettime(CLOCK_MONOTONIC, &now);
        long left = timeout_s * 1000L - ((now.tv_sec - t0.tv_sec) * 1000L +
                                         (now.tv_nsec - t0.tv_nsec) / 1000000L);
        if (left <= 0) {
            kill(pid, SIGKILL);
            killed = true;
            break;
        }
        struct pollfd p = {.fd = pipefd[0], .events = POLLIN};
        int r = poll(&p, 1, (int)left);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            continue;
        char chunk[4096];
        ssize_t n = read(pipefd[0], chunk, sizeof chunk);
        if (n <= 0)
            break;
        fwrite(chunk, 1, (size_t)n, m);
    }
    close(pipefd[0]);
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
        ;
    if (killed)
        fprintf(m, "\n(killed after %d s)\n", timeout_s);
    fclose(m);
    *out = buf;
    return (WIFEXITED(status) && !killed) ? WEXITSTATUS(status) : -1;
}

/* ---- the installed tree, shared by the tests of this group ------------------------ */

static struct {
    const char *build;  /* RN_BUILD */
    const char *src;    /* RN_SRC */
    char *tmp;          /* scratch directory of the group */
    char *destdir;      /* tmp/dest */
    char *root;         /* destdir + TPREFIX */
    char *install_log;
    int install_rc;
} g;

static char *inst(const char *rel) { return xasprintf("%s/%s", g.root, rel); }

static int group_setup(void **state)
{
    (void)state;
    g.build = env_or_skip("RN_BUILD");
    g.src = env_or_skip("RN_SRC");
    if (!g.build || !g.src)
        return 0; /* each test skips with the reason */
    char tmpl[] = "/tmp/rn-systemd-XXXXXX";
    if (!mkdtemp(tmpl))
        return -1;
    g.tmp = strdup(tmpl);
    g.destdir = xasprintf("%s/dest", g.tmp);
    g.root = xasprintf("%s%s", g.destdir, TPREFIX);

    /* Install exactly what the suite is testing: -o marks every installed
     * build output as up to date, so make never rebuilds one (possibly with
     * other flags) behind the test's back.  MAKEFLAGS of an outer make would
     * carry its jobserver and variables: dropped. */
    char *build_arg = xasprintf("BUILD=%s", g.build);
    char *dest_arg = xasprintf("DESTDIR=%s", g.destdir);
    char *o[5] = {
        xasprintf("%s/rmsnormd", g.build),
        xasprintf("%s/rmsnormctl", g.build),
        xasprintf("%s/librmsnorm_client.a", g.build),
        xasprintf("%s/librmsnorm_client.so.%s", g.build, RN_VERSION),
        xasprintf("%s/include/rmsnorm_client.h", g.build),
    };
    char *argv[] = {"make", "--no-print-directory", "-C", (char *)g.src, build_arg, dest_arg,
                    "PREFIX=" TPREFIX, "WITH_MPS=1", "-o", o[0], "-o", o[1], "-o", o[2], "-o", o[3],
                    "-o", o[4], "install", NULL};
    char *env[] = {"MAKEFLAGS", "MFLAGS", "MAKELEVEL", "GNUMAKEFLAGS", NULL};
    g.install_rc = run(argv, env, &g.install_log, 300);
    free(build_arg);
    free(dest_arg);
    for (int i = 0; i < 5; i++)
        free(o[i]);
    return 0;
}

static int group_teardown(void **state)
{
    (void)state;
    rm_rf(g.tmp);
    free(g.tmp);
    free(g.destdir);
    free(g.root);
    free(g.install_log);
    return 0;
}

#define NEED_INSTALL()                                                            \
    do {                                                                          \
        if (!g.build || !g.src)                                                   \
            RN_SKIP("RN_BUILD and RN_SRC are not set (run through tests/run.sh)"); \
        if (g.install_rc != 0) {                                                  \
            printf("make install failed (%d):\n%s\n", g.install_rc,              \
                   g.install_log ? g.install_log : "");                           \
            fail_msg("make install failed");                                      \
        }                                                                         \
    } while (0)

/* ---- make install, file by file ------------------------------------------------- */

struct expect {
    const char *path;   /* relative to DESTDIR+PREFIX */
    mode_t mode;        /* permission bits; 0 for a symlink */
    const char *link;   /* symlink target, or NULL for a regular file */
};

static const struct expect expected[] = {
    {"sbin/rmsnormd", 0755, NULL},
    {"bin/rmsnormctl", 0755, NULL},
    {"lib/librmsnorm_client.so." RN_VERSION, 0644, NULL},
    {"lib/librmsnorm_client.so." SOVERSION, 0, "librmsnorm_client.so." RN_VERSION},
    {"lib/librmsnorm_client.so", 0, "librmsnorm_client.so." SOVERSION},
    {"lib/librmsnorm_client.a", 0644, NULL},
    {"lib/pkgconfig/rmsnorm-client.pc", 0644, NULL},
    {"include/rmsnorm_client.h", 0644, NULL},
    {"share/man/man1/rmsnormctl.1", 0644, NULL},
    {"share/man/man3/rmsnorm_client.3", 0644, NULL},
    {"share/man/man3/rn_connect.3", 0644, NULL},
    {"share/bash-completion/completions/rmsnormctl", 0644, NULL},
    {"share/man/man8/rmsnormd.8", 0644, NULL},
    {"share/doc/rmsnormd/rmsnormd.conf.example", 0644, NULL},
    {"share/doc/rmsnormd/README.md", 0644, NULL},
    {"share/doc/rmsnormd/rmsnormd-daemonset.yaml", 0644, NULL},
    {"share/doc/rmsnormd/LICENSE", 0644, NULL},
    {"share/doc/rmsnormd/CHANGELOG.md", 0644, NULL},
    {"lib/systemd/system/rmsnormd@.service", 0644, NULL},
    {"lib/systemd/system/nvidia-cuda-mps.service", 0644, NULL},
    {"lib/systemd/user/rmsnormd@.service", 0644, NULL},
    {"lib/systemd/user/nvidia-cuda-mps.service", 0644, NULL},
    {"lib/sysusers.d/rmsnormd.conf", 0644, NULL},
    {"lib/tmpfiles.d/rmsnormd.conf", 0644, NULL},
};
#define NEXPECTED (sizeof expected / sizeof expected[0])

/* Every non-directory under DESTDIR, as paths relative to DESTDIR+PREFIX
 * (or absolute "!/..." paths for anything outside PREFIX). */
static char *found[256];
static size_t nfound;
static int bad_dirs;

static int collect(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)ftw;
    size_t rl = strlen(g.root);
    if (flag == FTW_D || flag == FTW_DP) {
        if ((st->st_mode & 07777) != 0755) {
            printf("directory %s has mode %04o, expected 0755\n", path, st->st_mode & 07777);
            bad_dirs++;
        }
        return 0;
    }
    if (nfound < 256) {
        if (strncmp(path, g.root, rl) == 0 && path[rl] == '/')
            found[nfound++] = strdup(path + rl + 1);
        else
            found[nfound++] = xasprintf("!%s", path + strlen(g.destdir));
    }
    return 0;
}

static void test_install_tree(void **state)
{
    (void)state;
    NEED_INSTALL();
    nfound = 0;
    bad_dirs = 0;
    assert_int_equal(nftw(g.destdir, collect, 16, FTW_PHYS), 0);
    assert_int_equal(bad_dirs, 0);

    /* Exactly the expected files: nothing missing, nothing extra. */
    int problems = 0;
    for (size_t i = 0; i < nfound; i++) {
        bool known = false;
        for (size_t j = 0; j < NEXPECTED; j++)
            known |= strcmp(found[i], expected[j].path) == 0;
        /* One man page link per public function (rn_connect above is one):
         * each sends man(1) to rmsnorm_client(3). */
        if (!known && strncmp(found[i], "share/man/man3/rn_", 18) == 0) {
            char *p = inst(found[i]);
            char *text = read_file(p);
            known = text && strcmp(text, ".so man3/rmsnorm_client.3\n") == 0;
            free(text);
            free(p);
        }
        if (!known) {
            printf("unexpected file installed: %s\n", found[i]);
            problems++;
        }
    }
    for (size_t j = 0; j < NEXPECTED; j++) {
        char *p = inst(expected[j].path);
        struct stat st;
        if (lstat(p, &st) != 0) {
            printf("missing: %s\n", expected[j].path);
            problems++;
        } else if (expected[j].link) {
            char target[256] = "";
            ssize_t n = readlink(p, target, sizeof target - 1);
            if (!S_ISLNK(st.st_mode) || n < 0 || strcmp(target, expected[j].link) != 0) {
                printf("%s: expected a symlink to %s\n", expected[j].path, expected[j].link);
                problems++;
            }
        } else if (!S_ISREG(st.st_mode) || (st.st_mode & 07777) != expected[j].mode) {
            printf("%s: mode %04o (regular: %d), expected regular %04o\n", expected[j].path,
                   st.st_mode & 07777, S_ISREG(st.st_mode), expected[j].mode);
            problems++;
        } else if (st.st_size == 0) {
            printf("%s: empty\n", expected[j].path);
            problems++;
        }
        free(p);
    }
    for (size_t i = 0; i < nfound; i++)
        free(found[i]);
    assert_int_equal(problems, 0);

    /* The programs and libraries are the build's, byte for byte. */
    static const char *const same[][2] = {
        {"sbin/rmsnormd", "rmsnormd"},
        {"bin/rmsnormctl", "rmsnormctl"},
        {"lib/librmsnorm_client.so." RN_VERSION, "librmsnorm_client.so." RN_VERSION},
        {"lib/librmsnorm_client.a", "librmsnorm_client.a"},
        {"include/rmsnorm_client.h", "include/rmsnorm_client.h"},
    };
    for (size_t i = 0; i < sizeof same / sizeof same[0]; i++) {
        char *a = inst(same[i][0]);
        char *b = xasprintf("%s/%s", g.build, same[i][1]);
        if (!files_equal(a, b))
            fail_msg("%s differs from %s", a, b);
        free(a);
        free(b);
    }

    /* The units start the installed daemon and nothing names the default
     * prefix any more. */
    static const char *const units[] = {
        "lib/systemd/system/rmsnormd@.service",
        "lib/systemd/user/rmsnormd@.service",
    };
    for (size_t i = 0; i < 2; i++) {
        char *p = inst(units[i]);
        char *text = read_file(p);
        assert_non_null(text);
        assert_non_null(strstr(text, "\nExecStart=" TPREFIX "/sbin/rmsnormd "));
        assert_null(strstr(text, "/usr/local/"));
        free(text);
        free(p);
    }

    /* The public header is self-contained: rn_wire.h is folded in. */
    char *h = inst("include/rmsnorm_client.h");
    char *text = read_file(h);
    assert_non_null(text);
    assert_null(strstr(text, "#include \"rn_wire.h\""));
    assert_non_null(strstr(text, "RN_ERRORS"));
    assert_non_null(strstr(text, "rn_connect"));
    free(text);
    free(h);
}

static void test_install_library(void **state)
{
    (void)state;
    NEED_INSTALL();
    char *out = NULL;

    /* The SONAME is the one the symlink provides. */
    if (have_program("readelf")) {
        char *so = inst("lib/librmsnorm_client.so." RN_VERSION);
        char *argv[] = {"readelf", "-d", so, NULL};
        assert_int_equal(run(argv, NULL, &out, 30), 0);
        if (!strstr(out, "Library soname: [librmsnorm_client.so." SOVERSION "]"))
            fail_msg("SONAME is not librmsnorm_client.so." SOVERSION ":\n%s", out);
        free(out);
        free(so);
    } else {
        printf("readelf not found: SONAME not checked\n");
    }

    /* pkg-config resolves the installed file, with the install's prefix. */
    char *pc = inst("lib/pkgconfig/rmsnorm-client.pc");
    char *text = read_file(pc);
    assert_non_null(text);
    assert_non_null(strstr(text, "prefix=" TPREFIX "\n"));
    assert_non_null(strstr(text, "\nVersion: " RN_VERSION "\n"));
    assert_null(strstr(text, "@PREFIX@"));
    assert_null(strstr(text, "@VERSION@"));
    free(text);
    free(pc);
    if (have_program("pkg-config")) {
        char *pcpath = xasprintf("PKG_CONFIG_PATH=%s/lib/pkgconfig", g.root);
        char *env[] = {pcpath, "PKG_CONFIG_LIBDIR", "PKG_CONFIG_SYSROOT_DIR", NULL};
        char *argv1[] = {"pkg-config", "--modversion", "rmsnorm-client", NULL};
        assert_int_equal(run(argv1, env, &out, 30), 0);
        assert_string_equal(out, RN_VERSION "\n");
        free(out);
        char *argv2[] = {"pkg-config", "--cflags", "--libs", "rmsnorm-client", NULL};
        assert_int_equal(run(argv2, env, &out, 30), 0);
        assert_non_null(strstr(out, "-I" TPREFIX "/include"));
        assert_non_null(strstr(out, "-L" TPREFIX "/lib"));
        assert_non_null(strstr(out, "-lrmsnorm_client"));
        free(out);
        free(pcpath);
    }
}

/* ---- systemd-analyze ------------------------------------------------------------- */

static char *replace_all(const char *text, const char *from, const char *to)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&buf, &len);
    size_t fl = strlen(from);
    for (const char *p = text; *p;) {
        const char *hit = strstr(p, from);
        if (!hit) {
            fputs(p, m);
            break;
        }
        fwrite(p, 1, (size_t)(hit - p), m);
        fputs(to, m);
        p = hit + fl;
    }
    fclose(m);
    return buf;
}

/*
 * Copy an installed unit into dir for verification, naming the DESTDIR copy
 * of the daemon instead of its installed path, and a stub where this host
 * lacks nvidia-cuda-mps-control (on a GPU node the real one is checked).
 */
static char *stage_unit(const char *installed_rel, const char *dir)
{
    char *src = inst(installed_rel);
    char *text = read_file(src);
    assert_non_null(text);
    char *daemon = inst("sbin/rmsnormd");
    char *t1 = replace_all(text, TPREFIX "/sbin/rmsnormd", daemon);
    char *t2 = t1;
    if (access("/usr/bin/nvidia-cuda-mps-control", X_OK) != 0) {
        char *stub = xasprintf("%s/nvidia-cuda-mps-control", g.tmp);
        write_file(stub, "#!/bin/sh\nexit 0\n", 0755);
        t2 = replace_all(t1, "/usr/bin/nvidia-cuda-mps-control", stub);
        free(t1);
        free(stub);
    }
    const char *base = strrchr(installed_rel, '/') + 1;
    char *dst = xasprintf("%s/%s", dir, base);
    write_file(dst, t2, 0644);
    free(t2);
    free(daemon);
    free(text);
    free(src);
    return dst;
}

static void verify_units(bool user)
{
    NEED_INSTALL();
    if (!have_program("systemd-analyze"))
        RN_SKIP("systemd-analyze is not installed (make deps installs systemd)");
    const char *sub = user ? "user" : "system";
    char *dir = xasprintf("%s/verify-%s", g.tmp, sub);
    assert_int_equal(mkdir(dir, 0755), 0);
    char *rel_d = xasprintf("lib/systemd/%s/rmsnormd@.service", sub);
    char *rel_m = xasprintf("lib/systemd/%s/nvidia-cuda-mps.service", sub);
    char *u1 = stage_unit(rel_d, dir);
    char *u2 = stage_unit(rel_m, dir);
    /* A concrete instance too: a GPU UUID with its dashes. */
    char *u3 = xasprintf("%s/rmsnormd@GPU-0ae0a482-33ec-bc29-d70c-76e666e82b2f.service", dir);
    assert_int_equal(symlink(u1, u3), 0);

    char *manpath = xasprintf("MANPATH=%s/share/man", g.root);
    char *xdg = xasprintf("XDG_RUNTIME_DIR=%s/xdg-%s", g.tmp, sub);
    mkdir(strchr(xdg, '=') + 1, 0700);
    char *env[] = {manpath, xdg, "SYSTEMD_LOG_LEVEL", NULL};
    char *argv_sys[] = {"systemd-analyze", "verify", u1, u2, u3, NULL};
    char *argv_user[] = {"systemd-analyze", "--user", "verify", u1, u2, u3, NULL};
    char *out = NULL;
    int rc = run(user ? argv_user : argv_sys, env, &out, 120);
    if (rc != 0 || out[0] != '\0')
        fail_msg("systemd-analyze%s verify (exit %d) said:\n%s", user ? " --user" : "", rc, out);
    free(out);

    /* The check is real: a misspelt setting is reported. */
    char *bad = xasprintf("%s/rmsnormd-typo@.service", dir);
    char *good_text = read_file(u1);
    char *bad_text = replace_all(good_text, "\nRestartSec=", "\nRestartSek=");
    write_file(bad, bad_text, 0644);
    char *argv_bad_sys[] = {"systemd-analyze", "verify", bad, NULL};
    char *argv_bad_user[] = {"systemd-analyze", "--user", "verify", bad, NULL};
    run(user ? argv_bad_user : argv_bad_sys, env, &out, 120);
    assert_non_null(strstr(out, "RestartSek"));
    free(out);
    free(bad);
    free(bad_text);
    free(good_text);

    free(manpath);
    free(xdg);
    free(u1);
    free(u2);
    free(u3);
    free(rel_d);
    free(rel_m);
    free(dir);
}

static void test_verify_system_units(void **state)
{
    (void)state;
    verify_units(false);
}

static void test_verify_user_units(void **state)
{
    (void)state;
    verify_units(true);
}

static void test_security_exposure(void **state)
{
    (void)state;
    NEED_INSTALL();
    if (!have_program("systemd-analyze"))
        RN_SKIP("systemd-analyze is not installed (make deps installs systemd)");
    char *dir = xasprintf("%s/security", g.tmp);
    assert_int_equal(mkdir(dir, 0755), 0);
    char *u = stage_unit("lib/systemd/system/rmsnormd@.service", dir);
    char *inst0 = xasprintf("%s/rmsnormd@0.service", dir);
    assert_int_equal(symlink(u, inst0), 0);
    char *argv[] = {"systemd-analyze", "security", "--offline=true", "--no-pager", inst0, NULL};
    char *env[] = {"SYSTEMD_COLORS=0", "SYSTEMD_LOG_LEVEL", NULL};
    char *out = NULL;
    run(argv, env, &out, 120);
    const char *line = strstr(out, "Overall exposure level for ");
    if (!line)
        fail_msg("no \"Overall exposure level\" line in:\n%s", out);
    const char *colon = strchr(line, ':');
    assert_non_null(colon);
    char *end = NULL;
    double exposure = strtod(colon + 1, &end);
    assert_true(end != colon + 1);
    printf("exposure of rmsnormd@0.service: %.1f\n", exposure);
    if (exposure > 3.0)
        fail_msg("exposure %.1f > 3.0:\n%s", exposure, out);
    free(out);
    free(inst0);
    free(u);
    free(dir);
}

/* ---- sysusers.d and tmpfiles.d ---------------------------------------------------- */

static void test_sysusers_tmpfiles(void **state)
{
    (void)state;
    NEED_INSTALL();
    if (!have_program("systemd-sysusers") || !have_program("systemd-tmpfiles"))
        RN_SKIP("systemd-sysusers or systemd-tmpfiles is not installed");
    char *root = xasprintf("%s/osroot", g.tmp);
    assert_int_equal(mkdir(root, 0755), 0);
    char *etc = xasprintf("%s/etc", root);
    assert_int_equal(mkdir(etc, 0755), 0);
    char *out = NULL;

    /* The users and groups, applied to an empty root. */
    char *su = inst("lib/sysusers.d/rmsnormd.conf");
    char *root_arg = xasprintf("--root=%s", root);
    char *argv1[] = {"systemd-sysusers", root_arg, su, NULL};
    int rc = run(argv1, NULL, &out, 60);
    if (rc != 0)
        fail_msg("systemd-sysusers (exit %d):\n%s", rc, out);
    free(out);
    char *pw_path = xasprintf("%s/passwd", etc);
    char *gr_path = xasprintf("%s/group", etc);
    char *pw = read_file(pw_path), *gr = read_file(gr_path);
    assert_non_null(pw);
    assert_non_null(gr);
    /* group "rmsnorm" and user "rmsnormd" whose primary group it is. */
    char *gline = strstr(gr, "rmsnorm:");
    assert_non_null(gline);
    unsigned gid = 0;
    assert_int_equal(sscanf(gline, "rmsnorm:x:%u:", &gid), 1);
    char *uline = strstr(pw, "rmsnormd:");
    assert_non_null(uline);
    unsigned uid = 0, ugid = 0;
    assert_int_equal(sscanf(uline, "rmsnormd:x:%u:%u:", &uid, &ugid), 2);
    assert_int_equal(ugid, gid);
    assert_true(uid > 0 && uid < 1000);
    char *nl = strchr(uline, '\n');
    if (nl)
        *nl = '\0';
    assert_non_null(strstr(uline, "nologin"));
    free(pw);
    free(gr);

    /* The runtime parent directory. */
    char *tf = inst("lib/tmpfiles.d/rmsnormd.conf");
    char *argv2[] = {"systemd-tmpfiles", "--create", root_arg, tf, NULL};
    rc = run(argv2, NULL, &out, 60);
    if (rc != 0)
        fail_msg("systemd-tmpfiles (exit %d):\n%s", rc, out);
    free(out);
    char *run_dir = xasprintf("%s/run/rmsnormd", root);
    struct stat st;
    assert_int_equal(stat(run_dir, &st), 0);
    assert_true(S_ISDIR(st.st_mode));
    assert_int_equal(st.st_mode & 07777, 0755);
    assert_int_equal(st.st_uid, 0);

    free(run_dir);
    free(tf);
    free(pw_path);
    free(gr_path);
    free(root_arg);
    free(su);
    free(etc);
    free(root);
}

/* ---- the man pages tell the truth ------------------------------------------------- */

/* Every "--long-flag" in text (NUL-separated list in *list, count returned). */
static size_t long_flags(const char *text, char flags[][64], size_t max)
{
    size_t n = 0;
    for (const char *p = text; (p = strstr(p, "--")) != NULL;) {
        p += 2;
        size_t len = strspn(p, "abcdefghijklmnopqrstuvwxyz-");
        if (len < 2 || len >= 64 || p[-3] == '-' || (p > text + 2 && p[-3] != ' ' &&
                                                      p[-3] != '[' && p[-3] != '\t' &&
                                                      p[-3] != '\n' && p[-3] != ','))
            continue;
        bool dup = false;
        for (size_t i = 0; i < n; i++)
            dup |= strncmp(flags[i], p, len) == 0 && flags[i][len] == '\0';
        if (!dup && n < max) {
            memcpy(flags[n], p, len);
            flags[n][len] = '\0';
            n++;
        }
        p += len;
    }
    return n;
}

/* Does the roff text mention "--flag" (written \-\-flag, with \- for each -)? */
static bool roff_has_flag(const char *roff, const char *flag)
{
    char want[160] = "\\-\\-";
    size_t w = 4;
    for (const char *f = flag; *f && w < sizeof want - 3; f++) {
        if (*f == '-') {
            want[w++] = '\\';
            want[w++] = '-';
        } else {
            want[w++] = *f;
        }
    }
    want[w] = '\0';
    return strstr(roff, want) != NULL;
}

static void test_man_pages(void **state)
{
    (void)state;
    NEED_INSTALL();
    char *out = NULL;
    char flags[64][64];
    int missing = 0;

    /* rmsnormd(8) documents every flag of --help. */
    char *d = xasprintf("%s/rmsnormd", g.build);
    char *argv1[] = {d, "--help", NULL};
    assert_int_equal(run(argv1, NULL, &out, 30), 0);
    char *m8 = inst("share/man/man8/rmsnormd.8");
    char *roff = read_file(m8);
    assert_non_null(roff);
    size_t n = long_flags(out, flags, 64);
    assert_true(n >= 10);
    /* ... and the example configuration has a line for every flag that is
     * a setting (all but --config, --version and --help). */
    char *ex_path = inst("share/doc/rmsnormd/rmsnormd.conf.example");
    char *example = read_file(ex_path);
    assert_non_null(example);
    for (size_t i = 0; i < n; i++) {
        if (!roff_has_flag(roff, flags[i])) {
            printf("rmsnormd(8) does not document --%s\n", flags[i]);
            missing++;
        }
        char *key = xasprintf("\n# %s = ", flags[i]);
        if (strcmp(flags[i], "config") && strcmp(flags[i], "version") &&
            strcmp(flags[i], "help") && !strstr(example, key)) {
            printf("rmsnormd.conf.example has no line \"# %s = ...\"\n", flags[i]);
            missing++;
        }
        free(key);
    }
    free(example);
    free(ex_path);
    free(roff);
    free(m8);
    free(out);
    free(d);

    /* rmsnormctl(1) documents every global flag and command. */
    char *c = xasprintf("%s/rmsnormctl", g.build);
    char *argv2[] = {c, "--help", NULL};
    assert_int_equal(run(argv2, NULL, &out, 30), 0);
    char *m1 = inst("share/man/man1/rmsnormctl.1");
    roff = read_file(m1);
    assert_non_null(roff);
    n = long_flags(out, flags, 64);
    for (size_t i = 0; i < n; i++)
        if (!roff_has_flag(roff, flags[i])) {
            printf("rmsnormctl(1) does not document --%s\n", flags[i]);
            missing++;
        }
    /* The commands are the indented words under "Commands:"; each one's
     * own --help lists its options, long and short. */
    const char *cmds = strstr(out, "\nCommands:\n");
    assert_non_null(cmds);
    size_t ncmds = 0;
    for (const char *line = strchr(cmds + 1, '\n'); line && line[1] == ' ';
         line = strchr(line + 1, '\n')) {
        char cmd[32];
        if (sscanf(line + 1, " %31[a-z]", cmd) != 1)
            continue;
        ncmds++;
        char *tp = xasprintf(".B %s", cmd);
        const char *entry = strstr(roff, tp);
        if (!entry || (entry[strlen(tp)] != ' ' && entry[strlen(tp)] != '\n')) {
            printf("rmsnormctl(1) does not document the command %s\n", cmd);
            missing++;
        }
        free(tp);
        char *argv3[] = {c, cmd, "--help", NULL};
        char *cout = NULL;
        assert_int_equal(run(argv3, NULL, &cout, 30), 0);
        size_t nf = long_flags(cout, flags, 64);
        for (size_t i = 0; i < nf; i++)
            if (!roff_has_flag(roff, flags[i])) {
                printf("rmsnormctl(1) does not document %s --%s\n", cmd, flags[i]);
                missing++;
            }
        for (const char *q = cout; (q = strstr(q, " -")) != NULL; q++) {
            if (!(q[2] >= 'a' && q[2] <= 'z') || (q[3] != ' ' && q[3] != ',' && q[3] != ']'))
                continue;
            char want[8] = {'\\', '-', q[2], '\0'};
            const char *hit = roff;
            bool ok = false;
            while (!ok && (hit = strstr(hit, want)) != NULL) {
                ok = !(hit[3] >= 'a' && hit[3] <= 'z') && hit[3] != '\\';
                hit++;
            }
            if (!ok) {
                printf("rmsnormctl(1) does not document %s -%c\n", cmd, q[2]);
                missing++;
            }
        }
        free(cout);
    }
    assert_true(ncmds >= 5);
    free(roff);
    free(m1);
    free(out);
    free(c);

    /* rmsnorm_client(3) names every exported function of the header. */
    char *hp = inst("include/rmsnorm_client.h");
    char *hdr = read_file(hp);
    assert_non_null(hdr);
    char *m3 = inst("share/man/man3/rmsnorm_client.3");
    roff = read_file(m3);
    assert_non_null(roff);
    size_t nfuncs = 0;
    for (const char *p = hdr; (p = strstr(p, "RN_EXPORT ")) != NULL; p++) {
        const char *nl = strchr(p, '\n');
        const char *name = strstr(p, "rn_");
        if (!name || (nl && name > nl) || strncmp(p, "RN_EXPORT __", 12) == 0)
            continue;
        /* The function's name is the rn_ identifier followed by '('. */
        const char *paren = strchr(name, '(');
        while (name && paren && name < paren) {
            const char *next = strstr(name + 3, "rn_");
            if (!next || next > paren)
                break;
            name = next;
        }
        if (!paren || (nl && paren > nl))
            continue;
        char fn[64];
        size_t len = strspn(name, "abcdefghijklmnopqrstuvwxyz_0123456789");
        if (len == 0 || len >= sizeof fn)
            continue;
        memcpy(fn, name, len);
        fn[len] = '\0';
        nfuncs++;
        char *syn = xasprintf(" %s(", fn);
        char *syn2 = xasprintf("*%s(", fn);
        if (!strstr(roff, syn) && !strstr(roff, syn2)) {
            printf("rmsnorm_client(3) has no synopsis for %s\n", fn);
            missing++;
        }
        free(syn);
        free(syn2);
    }
    assert_true(nfuncs >= 10);
    free(roff);
    free(m3);
    free(hdr);
    free(hp);
    assert_int_equal(missing, 0);
}

/* ---- the notify protocol ---------------------------------------------------------- */

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/*
 * The example configuration with every key switched on, pointed at this
 * test's endpoint, CPU backend and group: the daemon must accept every key.
 */
static char *example_config(const char *dir, const char *endpoint, const char *group)
{
    char *src = xasprintf("%s/systemd/rmsnormd.conf.example", g.src);
    char *text = read_file(src);
    assert_non_null(text);
    char *buf = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&buf, &len);
    int keys = 0;
    for (char *save = NULL, *line = strtok_r(text, "\n", &save); line;
         line = strtok_r(NULL, "\n", &save)) {
        char key[64];
        int off = 0;
        if (sscanf(line, "# %63[a-z-] =%n", key, &off) == 1 && off > 0) {
            keys++;
            if (strcmp(key, "endpoint") == 0)
                fprintf(m, "endpoint = %s\n", endpoint);
            else if (strcmp(key, "backend") == 0)
                fprintf(m, "backend = cpu\n");
            else if (strcmp(key, "socket-group") == 0)
                fprintf(m, "socket-group = %s\n", group);
            else if (strcmp(key, "threads") == 0)
                fprintf(m, "threads = 2\n");
            else
                fprintf(m, "%s\n", line + 2);
        } else {
            fprintf(m, "%s\n", line);
        }
    }
    fclose(m);
    assert_true(keys >= 14);
    char *dst = xasprintf("%s/rmsnormd.conf", dir);
    write_file(dst, buf, 0644);
    free(buf);
    free(text);
    free(src);
    return dst;
}

static void print_file(const char *title, const char *path)
{
    char *t = read_file(path);
    printf("---- %s ----\n%s\n---- end ----\n", title, t ? t : "(unreadable)");
    free(t);
}

static void test_notify_protocol(void **state)
{
    (void)state;
    if (!g.build || !g.src)
        RN_SKIP("RN_BUILD and RN_SRC are not set (run through tests/run.sh)");
    char *daemon = xasprintf("%s/rmsnormd", g.build);
    if (access(daemon, X_OK) != 0)
        fail_msg("%s is not built", daemon);

    char *dir = xasprintf("%s/notify", g.tmp);
    assert_int_equal(mkdir(dir, 0755), 0);
    char *sock_path = xasprintf("%s/rmsnormd.sock", dir);
    char *endpoint = xasprintf("ipc://%s", sock_path);
    struct group *gr = getgrgid(getegid());
    assert_non_null(gr);
    char *conf = example_config(dir, endpoint, gr->gr_name);
    char *log = xasprintf("%s/daemon.log", dir);

    /* The notify socket this test owns. */
    char *npath = xasprintf("%s/notify.sock", dir);
    int nfd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    assert_true(nfd >= 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    assert_true(strlen(npath) < sizeof sa.sun_path);
    strcpy(sa.sun_path, npath);
    assert_int_equal(bind(nfd, (struct sockaddr *)&sa, sizeof sa), 0);

    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        int lfd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        int null = open("/dev/null", O_RDONLY);
        dup2(null, 0);
        dup2(lfd, 1);
        dup2(lfd, 2);
        setenv("NOTIFY_SOCKET", npath, 1);
        char wd[32];
        snprintf(wd, sizeof wd, "%llu", WATCHDOG_USEC);
        setenv("WATCHDOG_USEC", wd, 1);
        unsetenv("WATCHDOG_PID");
        unsetenv("RUNTIME_DIRECTORY");
        unsetenv("JOURNAL_STREAM");
        execl(daemon, "rmsnormd", "--config", conf, (char *)NULL);
        _exit(127);
    }
    int pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
    assert_true(pidfd >= 0);

    /* Events in arrival order. */
    enum { EV_READY, EV_STATUS, EV_WATCHDOG, EV_STOPPING };
    static const char *const ev_name[] = {"READY=1", "STATUS=", "WATCHDOG=1", "STOPPING=1"};
    struct notify_event { int kind; double t; } ev[512];
    size_t nev = 0;
    int seen[4] = {0};
    int wd_after_ready = 0;
    double last_wd = 0, max_gap = 0, term_at = 0;
    bool ping_between = false; /* a gap across the ping below is not counted */
    bool ready_socket_ok = false, exited = false, pinged = false;
    int status = 0;
    const double t0 = now_s(), deadline = t0 + 60;
    char why[512] = "";

    while (!exited && now_s() < deadline) {
        struct pollfd p[2] = {{.fd = nfd, .events = POLLIN}, {.fd = pidfd, .events = POLLIN}};
        int r = poll(p, 2, (int)((deadline - now_s()) * 1000) + 1);
        if (r < 0 && errno == EINTR)
            continue;
        if (p[0].revents & POLLIN) {
            char msg[4096];
            ssize_t len;
            while ((len = recv(nfd, msg, sizeof msg - 1, 0)) > 0) {
                msg[len] = '\0';
                double t = now_s();
                for (char *save = NULL, *line = strtok_r(msg, "\n", &save); line;
                     line = strtok_r(NULL, "\n", &save)) {
                    int kind = -1;
                    if (strcmp(line, "READY=1") == 0)
                        kind = EV_READY;
                    else if (strncmp(line, "STATUS=", 7) == 0)
                        kind = EV_STATUS;
                    else if (strcmp(line, "WATCHDOG=1") == 0)
                        kind = EV_WATCHDOG;
                    else if (strcmp(line, "STOPPING=1") == 0)
                        kind = EV_STOPPING;
                    else
                        continue;
                    printf("%8.3f s  %s\n", t - t0, line);
                    if (nev < 512)
                        ev[nev++] = (struct notify_event){kind, t};
                    seen[kind]++;
                    if (kind == EV_READY && seen[EV_READY] == 1) {
                        /* READY=1 promises a bound socket with its mode and
                         * group. */
                        struct stat st;
                        ready_socket_ok = stat(sock_path, &st) == 0 && S_ISSOCK(st.st_mode) &&
                                          (st.st_mode & 07777) == 0660 &&
                                          st.st_gid == gr->gr_gid;
                        if (!ready_socket_ok)
                            snprintf(why, sizeof why, "at READY=1 the socket is not a 0660 "
                                                      "socket of group %s", gr->gr_name);
                    }
                    if (kind == EV_WATCHDOG && seen[EV_READY] && !term_at) {
                        /* (not across the rmsnormctl ping below, which holds
                         * this loop while the pings queue up) */
                        if (wd_after_ready++ > 0 && !ping_between && t - last_wd > max_gap)
                            max_gap = t - last_wd;
                        last_wd = t;
                        ping_between = false;
                    }
                }
            }
        }
        if (seen[EV_READY] && !pinged) {
            /* A real client, connecting right after READY=1. */
            pinged = true;
            char *ctl = xasprintf("%s/rmsnormctl", g.build);
            char *argv[] = {ctl, "--endpoint", endpoint, "ping", NULL};
            char *out = NULL;
            int rc = run(argv, NULL, &out, 30);
            if (rc != 0)
                snprintf(why, sizeof why, "rmsnormctl ping right after READY=1 failed (%d): %.300s",
                         rc, out);
            free(out);
            free(ctl);
            ping_between = true;
        }
        if (!term_at && wd_after_ready >= 3 && seen[EV_STATUS]) {
            term_at = now_s();
            kill(pid, SIGTERM);
        }
        if (p[1].revents & POLLIN) {
            while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
                ;
            exited = true;
        }
    }
    /* Whatever the daemon sent just before it exited. */
    if (exited) {
        char msg[4096];
        ssize_t len;
        while ((len = recv(nfd, msg, sizeof msg - 1, 0)) > 0) {
            msg[len] = '\0';
            if (strstr(msg, "STOPPING=1") && nev < 512) {
                ev[nev++] = (struct notify_event){EV_STOPPING, now_s()};
                seen[EV_STOPPING]++;
            }
        }
    } else {
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
        snprintf(why, sizeof why, "the daemon did not exit within 60 s (READY %d, WATCHDOG %d, "
                                  "STATUS %d, STOPPING %d)", seen[0], seen[2], seen[1], seen[3]);
    }
    close(pidfd);
    close(nfd);

    /* The order: nothing but STATUS= before READY=1; STOPPING=1 only after
     * SIGTERM and after the pings; at least two pings after READY=1. */
    size_t first_ready = nev, first_stop = nev;
    for (size_t i = 0; i < nev; i++) {
        if (ev[i].kind == EV_READY && first_ready == nev)
            first_ready = i;
        if (ev[i].kind == EV_STOPPING && first_stop == nev)
            first_stop = i;
    }
    if (!why[0] && first_ready == nev)
        snprintf(why, sizeof why, "no READY=1");
    for (size_t i = 0; !why[0] && i < first_ready; i++)
        if (ev[i].kind != EV_STATUS)
            snprintf(why, sizeof why, "%s before READY=1", ev_name[ev[i].kind]);
    if (!why[0] && !seen[EV_STATUS])
        snprintf(why, sizeof why, "no STATUS=");
    if (!why[0] && wd_after_ready < 2)
        snprintf(why, sizeof why, "%d WATCHDOG=1 pings after READY=1, expected at least 2",
                 wd_after_ready);
    if (!why[0] && max_gap * 1e6 >= (double)WATCHDOG_USEC)
        snprintf(why, sizeof why, "%.0f ms between two pings: the watchdog (%llu ms) would fire",
                 max_gap * 1e3, WATCHDOG_USEC / 1000);
    if (!why[0] && first_stop == nev)
        snprintf(why, sizeof why, "no STOPPING=1 after SIGTERM");
    if (!why[0] && ev[first_stop].t < term_at)
        snprintf(why, sizeof why, "STOPPING=1 before SIGTERM");
    if (!why[0] && !(WIFEXITED(status) && WEXITSTATUS(status) == 0))
        snprintf(why, sizeof why, "exit status %d (signal %d), expected 0",
                 WIFEXITED(status) ? WEXITSTATUS(status) : -1,
                 WIFSIGNALED(status) ? WTERMSIG(status) : 0);
    if (why[0]) {
        print_file("daemon log", log);
        print_file("configuration", conf);
        fail_msg("%s", why);
    }
    printf("READY=1, STATUS=, %d WATCHDOG=1 pings (largest gap %.0f ms), STOPPING=1, exit 0\n",
           wd_after_ready, max_gap * 1e3);

    free(npath);
    free(log);
    free(conf);
    free(endpoint);
    free(sock_path);
    free(dir);
    free(daemon);
}

/* Runs last: `make uninstall` removes every file `make install` put there. */
static void test_uninstall(void **state)
{
    (void)state;
    NEED_INSTALL();
    char *build_arg = xasprintf("BUILD=%s", g.build);
    char *dest_arg = xasprintf("DESTDIR=%s", g.destdir);
    char *argv[] = {"make", "--no-print-directory", "-C", (char *)g.src, build_arg, dest_arg,
                    "PREFIX=" TPREFIX, "uninstall", NULL};
    char *env[] = {"MAKEFLAGS", "MFLAGS", "MAKELEVEL", "GNUMAKEFLAGS", NULL};
    char *out = NULL;
    int rc = run(argv, env, &out, 120);
    if (rc != 0)
        fail_msg("make uninstall (exit %d):\n%s", rc, out);
    free(out);
    nfound = 0;
    bad_dirs = 0;
    assert_int_equal(nftw(g.destdir, collect, 16, FTW_PHYS), 0);
    for (size_t i = 0; i < nfound; i++) {
        printf("left behind by make uninstall: %s\n", found[i]);
        free(found[i]);
    }
    assert_int_equal(nfound, 0);
    free(build_arg);
    free(dest_arg);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_install_tree),
        cmocka_unit_test(test_install_library),
        cmocka_unit_test(test_verify_system_units),
        cmocka_unit_test(test_verify_user_units),
        cmocka_unit_test(test_security_exposure),
        cmocka_unit_test(test_sysusers_tmpfiles),
        cmocka_unit_test(test_man_pages),
        cmocka_unit_test(test_notify_protocol),
        cmocka_unit_test(test_uninstall),
    };
    return cmocka_run_group_tests_name("systemd", tests, group_setup, group_teardown);
}
