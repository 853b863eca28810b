/* SPDX-License-Identifier: MIT */
/*
 * test_daemon_backend_cpu.c - the daemon's CPU backend on its own: shared
 * memory regions with size checks and errors that name the field, jobs run
 * on the worker pool and completed on the loop thread, the bounded queue,
 * the refusal of CUDA-only features, a client shrinking its region under a
 * running job (the daemon survives, the job fails and its mapping is marked
 * lost), and the failure knob (debug-fail-after: every pending job ends
 * DEVICE_FAILING before the fatal hook runs, once).
 */
#include "rn_test.h"

#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "../../daemon/backend_cpu.c"
#include "../../daemon/cpu_fault.c"
#include "../../daemon/stats.c"

typedef struct fixture {
    uv_loop_t loop;
    rnd_backend *be;
    char shm[64];
    int ndone;
    pthread_t loop_thread;
    bool wrong_thread;
    int nfatal;
    int done_at_fatal;             /* ndone when the fatal hook ran */
} fixture;

static fixture *F;

static void on_fatal(void *ctx, const char *msg)
{
    fixture *f = ctx;
    f->nfatal++;
    f->done_at_fatal = f->ndone;
}

static int setup_with(void **state, uint32_t threads, uint32_t max_jobs, uint32_t fail_after)
{
    fixture *f = calloc(1, sizeof *f);
    rnd_backend_opts o = {0};
    rnp_error err = {0};

    assert_int_equal(uv_loop_init(&f->loop), 0);
    o.loop = &f->loop;
    o.threads = threads;
    o.max_jobs = max_jobs;
    o.debug_fail_after = fail_after;
    o.fatal = on_fatal;
    o.fatal_ctx = f;
    assert_int_equal(rnd_backend_cpu_ops.init(&o, &f->be, &err), 0);
    snprintf(f->shm, sizeof f->shm, "/rnd-test-%d", (int)getpid());
    f->loop_thread = pthread_self();
    F = f;
    *state = f;
    return 0;
}

static int setup(void **state)
{
    return setup_with(state, 2, 2, 0);
}

/* One worker, room for four jobs, and the third submitted fails the backend. */
static int setup_failing(void **state)
{
    return setup_with(state, 1, 4, 3);
}

static int teardown(void **state)
{
    fixture *f = *state;
    rnd_backend_cpu_ops.fini(f->be);
    uv_run(&f->loop, UV_RUN_DEFAULT);   /* closes the async handle */
    assert_int_equal(uv_loop_close(&f->loop), 0);
    shm_unlink(f->shm);
    free(f);
    return 0;
}

/* A shared memory object of size bytes, mapped here as the client would. */
static void *make_shm(fixture *f, size_t size)
{
    int fd = shm_open(f->shm, O_RDWR | O_CREAT | O_TRUNC, 0600);
    assert_true(fd >= 0);
    assert_int_equal(ftruncate(fd, (off_t)size), 0);
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    assert_true(p != MAP_FAILED);
    close(fd);
    return p;
}

static rnp_register_req reg_req(const char *name, uint64_t size)
{
    rnp_register_req r;
    memset(&r, 0, sizeof r);
    r.kind = RNP_REGION_SHM;
    r.size = size;
    snprintf(r.shm_name, sizeof r.shm_name, "%s", name);
    return r;
}

static void test_info(void **state)
{
    fixture *f = *state;
    rnd_device_info info;
    rnd_backend_cpu_ops.info(f->be, &info);
    assert_string_equal(info.backend, "cpu");
    assert_int_equal(info.sm_count, 2);
    assert_int_equal(info.event_slots, 0);
    assert_true(info.device_name[0] != '\0');
}

static void expect_reg_error(fixture *f, const rnp_register_req *r, int code, const char *field)
{
    rnp_error err = {0};
    rnd_mapping m = {0};
    void *bsess = NULL;
    assert_int_equal(rnd_backend_cpu_ops.session_open(f->be, &bsess, &err), 0);
    assert_int_equal(rnd_backend_cpu_ops.region_open(f->be, bsess, r, &m, &err), code);
    assert_int_equal(err.code, code);
    assert_non_null(strstr(err.msg, field));
    assert_null(m.base);   /* outputs untouched on failure */
    rnd_backend_cpu_ops.session_close(f->be, bsess);
}

static void test_region_errors(void **state)
{
    fixture *f = *state;
    rnp_register_req r;
    char name[64];

    make_shm(f, 4096);
    r = reg_req(f->shm, 4096);
    r.kind = RNP_REGION_CUDA_IPC;
    expect_reg_error(f, &r, RN_UNSUPPORTED, "register.kind");
    r = reg_req("no-slash", 4096);
    expect_reg_error(f, &r, RN_INVALID_ARGUMENT, "register.shm_name");
    r = reg_req("/a/b", 4096);
    expect_reg_error(f, &r, RN_INVALID_ARGUMENT, "register.shm_name");
    r = reg_req("/", 4096);
    expect_reg_error(f, &r, RN_INVALID_ARGUMENT, "register.shm_name");
    snprintf(name, sizeof name, "/rnd-test-absent-%d", (int)getpid());
    r = reg_req(name, 4096);
    expect_reg_error(f, &r, RN_INVALID_ARGUMENT, "register.shm_name");
    r = reg_req(f->shm, 0);
    expect_reg_error(f, &r, RN_INVALID_ARGUMENT, "register.size");
    /* Claiming more than the object has would let a job read past its end. */
    r = reg_req(f->shm, 4097);
    expect_reg_error(f, &r, RN_INVALID_ARGUMENT, "register.size");
}

static void test_region_maps_shared_memory(void **state)
{
    fixture *f = *state;
    rnp_register_req r;
    rnp_error err = {0};
    rnd_mapping m = {0};
    char *client = make_shm(f, 8192);

    r = reg_req(f->shm, 6000);   /* a prefix of the object is fine */
    assert_int_equal(rnd_backend_cpu_ops.region_open(f->be, f->be, &r, &m, &err), 0);
    assert_non_null(m.base);
    assert_int_equal(m.size, 6000);
    strcpy(client + 100, "written by the client");
    assert_string_equal((char *)m.base + 100, "written by the client");
    strcpy((char *)m.base + 200, "written by the daemon");
    assert_string_equal(client + 200, "written by the daemon");
    rnd_backend_cpu_ops.region_close(f->be, f->be, &m);
    munmap(client, 8192);
}

static void test_cuda_features_refused(void **state)
{
    fixture *f = *state;
    rnp_events_req ev;
    rnp_events_rep rep;
    rnp_error err = {0};
    rnd_job job;

    memset(&ev, 0, sizeof ev);
    ev.n = 1;
    assert_int_equal(rnd_backend_cpu_ops.events(f->be, f->be, &ev, &rep, &err), RN_UNSUPPORTED);
    assert_non_null(strstr(err.msg, "events"));

    memset(&job, 0, sizeof job);
    job.ready_slot = 0;
    assert_int_equal(rnd_backend_cpu_ops.submit(f->be, &job, &err), RN_NO_EVENTS);
    assert_non_null(strstr(err.msg, "bwd.ready:"));
}

static void on_done(rnd_job *job)
{
    F->ndone++;
    if (!pthread_equal(pthread_self(), F->loop_thread))
        F->wrong_thread = true;
}

/* A job over [m, n] f32 tensors laid out x | dy | dx | w | dw in base. */
static void make_job(rnd_job *job, void *base, int64_t m, int64_t n)
{
    float *x = base, *dy = x + m * n, *dx = dy + m * n, *w = dx + m * n, *dw = w + n;
    memset(job, 0, sizeof *job);
    job->args.m = m;
    job->args.n = n;
    job->args.x_dtype = job->args.dy_dtype = job->args.dx_dtype = RNK_F32;
    job->args.w_dtype = job->args.dw_dtype = RNK_F32;
    job->args.x = x;
    job->args.dy = dy;
    job->args.dx = dx;
    job->args.w = w;
    job->args.dw = dw;
    job->args.x_stride = job->args.dy_stride = job->args.dx_stride = n;
    job->args.eps = 1e-6f;
    job->ready_slot = -1;
    job->done = on_done;
}

static size_t job_bytes(int64_t m, int64_t n) { return (size_t)(3 * m * n + 2 * n) * 4; }

static void test_job_runs_and_completes_on_loop(void **state)
{
    fixture *f = *state;
    const int64_t m = 100, n = 300;
    size_t bytes = job_bytes(m, n);
    rnp_register_req r = reg_req(f->shm, bytes);
    rnp_error err = {0};
    rnd_mapping map = {0};
    float *client = make_shm(f, bytes);
    rnd_job job;

    for (int64_t i = 0; i < 2 * m * n; i++)
        client[i] = (float)((i * 7919) % 101) / 50.0f - 1.0f;
    for (int64_t j = 0; j < n; j++)
        client[3 * m * n + j] = 1.0f + (float)j / 1000.0f;
    assert_int_equal(rnd_backend_cpu_ops.region_open(f->be, f->be, &r, &map, &err), 0);

    make_job(&job, map.base, m, n);
    assert_int_equal(rnd_backend_cpu_ops.submit(f->be, &job, &err), 0);
    while (F->ndone == 0)
        uv_run(&f->loop, UV_RUN_ONCE);
    assert_int_equal(F->ndone, 1);
    assert_false(F->wrong_thread);
    assert_int_equal(job.status, 0);
    assert_int_equal(job.done_slot, -1);
    assert_true(job.start_ns > 0 && job.end_ns >= job.start_ns);

    /* The daemon's results are those of the twin run here, bit for bit. */
    float *dx = malloc((size_t)(m * n) * 4), *dw = malloc((size_t)n * 4);
    rnk_bwd_args a = job.args;
    a.x = client;
    a.dy = client + m * n;
    a.w = client + 3 * m * n;
    a.dx = dx;
    a.dw = dw;
    assert_int_equal(rnk_cpu_bwd(&a, 1, NULL, 0), 0);
    assert_memory_equal(dx, client + 2 * m * n, (size_t)(m * n) * 4);
    assert_memory_equal(dw, client + 3 * m * n + n, (size_t)n * 4);
    free(dx);
    free(dw);
    rnd_backend_cpu_ops.region_close(f->be, f->be, &map);
    munmap(client, bytes);
}

static void test_queue_is_bounded(void **state)
{
    fixture *f = *state;
    const int64_t m = 2048, n = 2048;   /* tens of milliseconds each */
    size_t bytes = job_bytes(m, n);
    void *client = make_shm(f, bytes);
    rnd_job jobs[3];
    rnp_error err = {0};

    /* Separate outputs are not needed: the jobs only have to be slow. */
    for (int i = 0; i < 3; i++)
        make_job(&jobs[i], client, m, n);
    jobs[1].args.dw = NULL;
    jobs[1].args.dw_dtype = RNK_NONE;
    jobs[2].args.dw = NULL;
    jobs[2].args.dw_dtype = RNK_NONE;
    assert_int_equal(rnd_backend_cpu_ops.submit(f->be, &jobs[0], &err), 0);
    assert_int_equal(rnd_backend_cpu_ops.submit(f->be, &jobs[1], &err), 0);
    /* max_jobs is 2: the third is refused, not queued. */
    assert_int_equal(rnd_backend_cpu_ops.submit(f->be, &jobs[2], &err), RN_BUSY);
    assert_non_null(strstr(err.msg, "queue"));
    while (F->ndone < 2)
        uv_run(&f->loop, UV_RUN_ONCE);
    assert_int_equal(F->ndone, 2);
    /* Room again. */
    assert_int_equal(rnd_backend_cpu_ops.submit(f->be, &jobs[2], &err), 0);
    while (F->ndone < 3)
        uv_run(&f->loop, UV_RUN_ONCE);
    munmap(client, bytes);
}

static void test_shrunk_region_fails_the_job(void **state)
{
    fixture *f = *state;
    const int64_t m = 256, n = 1024;
    size_t bytes = job_bytes(m, n);
    rnp_register_req r = reg_req(f->shm, bytes);
    rnp_error err = {0};
    rnd_mapping map = {0};
    rnd_job job;
    int fd;

    /* cmocka installs its own SIGBUS handler around each test; put the
     * backend's back, as the daemon has it. */
    assert_int_equal(rnd_cpu_fault_init(), 0);
    munmap(make_shm(f, bytes), bytes);
    assert_int_equal(rnd_backend_cpu_ops.region_open(f->be, f->be, &r, &map, &err), 0);
    /* The client shrinks the object after registering it. */
    fd = shm_open(f->shm, O_RDWR, 0);
    assert_true(fd >= 0);
    assert_int_equal(ftruncate(fd, 4096), 0);
    close(fd);

    make_job(&job, map.base, m, n);
    job.maps[RNP_T_X] = job.maps[RNP_T_DY] = job.maps[RNP_T_DX] = &map;
    job.maps[RNP_T_W] = job.maps[RNP_T_DW] = &map;
    assert_int_equal(rnd_backend_cpu_ops.submit(f->be, &job, &err), 0);
    while (F->ndone == 0)
        uv_run(&f->loop, UV_RUN_ONCE);
    assert_int_equal(job.status, RN_OUT_OF_BOUNDS);
    assert_true(map.lost);
    assert_non_null(strstr(job.msg, "shrank"));
    void *old_base = map.base;
    rnd_backend_cpu_ops.region_close(f->be, f->be, &map);

    /* An intact object mapped afterwards at the same addresses (the kernel
     * reuses the range just unmapped) is not taken for the faulted one. */
    munmap(make_shm(f, bytes), bytes);
    rnd_mapping again = {0};
    assert_int_equal(rnd_backend_cpu_ops.region_open(f->be, f->be, &r, &again, &err), 0);
    assert_ptr_equal(again.base, old_base);
    make_job(&job, again.base, m, n);
    job.maps[RNP_T_X] = job.maps[RNP_T_DY] = job.maps[RNP_T_DX] = &again;
    job.maps[RNP_T_W] = job.maps[RNP_T_DW] = &again;
    F->ndone = 0;
    assert_int_equal(rnd_backend_cpu_ops.submit(f->be, &job, &err), 0);
    while (F->ndone == 0)
        uv_run(&f->loop, UV_RUN_ONCE);
    assert_int_equal(job.status, RN_OK);
    assert_false(again.lost);
    rnd_backend_cpu_ops.region_close(f->be, f->be, &again);
}

static int maps_lines(void)
{
    FILE *fp = fopen("/proc/self/maps", "r");
    int n = 0, ch;
    assert_non_null(fp);
    while ((ch = fgetc(fp)) != EOF)
        n += ch == '\n';
    fclose(fp);
    return n;
}

/* A job that touches every other page of a region shrunk to nothing: the
 * fault replaces the rest of the mapping at once.  Before, each fault
 * mapped one page over the region, splitting its mapping: 80 000 faults of
 * one job passed vm.max_map_count, the handler's mmap failed and the daemon
 * died of the SIGBUS (here, 6 144 faults made 12 000 mappings). */
static void test_shrunk_region_few_mappings(void **state)
{
    fixture *f = *state;
    const int64_t m = 2048, n = 1, st = 2048; /* a row every 8 KiB */
    size_t bytes = (size_t)(3 * m * st + 2) * 4;
    rnp_register_req r = reg_req(f->shm, bytes);
    rnp_error err = {0};
    rnd_mapping map = {0};
    rnd_job job;
    int fd;

    assert_int_equal(rnd_cpu_fault_init(), 0);
    munmap(make_shm(f, bytes), bytes);
    assert_int_equal(rnd_backend_cpu_ops.region_open(f->be, f->be, &r, &map, &err), 0);
    fd = shm_open(f->shm, O_RDWR, 0);
    assert_true(fd >= 0);
    assert_int_equal(ftruncate(fd, 0), 0);
    close(fd);
    int before = maps_lines();
    make_job(&job, map.base, m, n);
    float *x = map.base;
    job.args.x = x;
    job.args.dy = x + m * st;
    job.args.dx = x + 2 * m * st;
    job.args.w = x + 3 * m * st;
    job.args.dw = x + 3 * m * st + 1;
    job.args.x_stride = job.args.dy_stride = job.args.dx_stride = st;
    job.maps[RNP_T_X] = job.maps[RNP_T_DY] = job.maps[RNP_T_DX] = &map;
    job.maps[RNP_T_W] = job.maps[RNP_T_DW] = &map;
    assert_int_equal(rnd_backend_cpu_ops.submit(f->be, &job, &err), 0);
    while (F->ndone == 0)
        uv_run(&f->loop, UV_RUN_ONCE);
    int after = maps_lines();
    assert_int_equal(job.status, RN_OUT_OF_BOUNDS);
    assert_true(map.lost);
    if (after - before > 16)
        fail_msg("the faults made %d mappings more (at most 16 expected)", after - before);
    rnd_backend_cpu_ops.region_close(f->be, f->be, &map);
}

static void test_fail_after_answers_every_pending_job(void **state)
{
    fixture *f = *state;
    const int64_t m = 2048, n = 2048;   /* tens of milliseconds each */
    size_t bytes = job_bytes(m, n);
    void *client = make_shm(f, bytes);
    rnd_job jobs[3], late;
    rnp_error err = {0};

    for (int i = 0; i < 3; i++) {
        make_job(&jobs[i], client, m, n);
        jobs[i].args.dw = NULL;
        jobs[i].args.dw_dtype = RNK_NONE;
    }
    /* One worker: the first runs, the second waits; the third fails the
     * backend as it is submitted. */
    for (int i = 0; i < 3; i++)
        assert_int_equal(rnd_backend_cpu_ops.submit(f->be, &jobs[i], &err), 0);
    while (F->nfatal == 0)
        uv_run(&f->loop, UV_RUN_ONCE);
    assert_int_equal(F->nfatal, 1);
    assert_int_equal(F->done_at_fatal, 3);      /* every job had its done event first */
    for (int i = 0; i < 3; i++) {
        assert_int_equal(jobs[i].status, RN_DEVICE_FAILING);
        assert_non_null(strstr(jobs[i].msg, "debug-fail-after"));
    }
    /* Failed for good: nothing new is taken. */
    make_job(&late, client, m, n);
    assert_int_equal(rnd_backend_cpu_ops.submit(f->be, &late, &err), RN_DEVICE_FAILING);
    int h = rnd_backend_cpu_ops.health(f->be, NULL, 0, &(uint32_t){0});
    assert_int_equal(h, RNP_HEALTH_FAILING);
    uv_run(&f->loop, UV_RUN_NOWAIT);
    assert_int_equal(F->nfatal, 1);
    munmap(client, bytes);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_info, setup, teardown),
        cmocka_unit_test_setup_teardown(test_region_errors, setup, teardown),
        cmocka_unit_test_setup_teardown(test_region_maps_shared_memory, setup, teardown),
        cmocka_unit_test_setup_teardown(test_cuda_features_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_job_runs_and_completes_on_loop, setup, teardown),
        cmocka_unit_test_setup_teardown(test_queue_is_bounded, setup, teardown),
        cmocka_unit_test_setup_teardown(test_shrunk_region_fails_the_job, setup, teardown),
        cmocka_unit_test_setup_teardown(test_shrunk_region_few_mappings, setup, teardown),
        cmocka_unit_test_setup_teardown(test_fail_after_answers_every_pending_job, setup_failing,
                                        teardown),
    };
    return cmocka_run_group_tests_name("daemon cpu backend", tests, NULL, NULL);
}
