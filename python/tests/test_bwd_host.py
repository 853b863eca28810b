# SPDX-License-Identifier: MIT
"""The backward pass through the binding on the CPU backend: buffers from
Client.alloc (rn_buffer_alloc), Client.bwd_host (rn_rmsnorm_bwd_host),
results against a pure-Python fp64 reference, bitwise repeatability, and
refused requests that leave the outputs untouched."""

import ctypes
import pickle
import time

import pytest

import rmsnormd
from refmath import (BF16, F16, F32, NAME, SIZE, Matrix, check_dw, check_dx, reference,
                     rng, rstd_rows, ulp)

NONE = rmsnormd.DTYPE_NONE
POISON = 0xA5


class Case:
    """One backward problem laid out in shared buffers.  x and dy share one
    buffer (dy at an offset), the others have a buffer each."""

    def __init__(self, client, m, n, x_dt, dy_dt, dx_dt, w_dt=NONE, dw_dt=NONE,
                 dres_dt=NONE, stride_pad=0, given_rstd=True, eps=1e-6, weight_offset=0.0,
                 seed=1):
        self.m, self.n = m, n
        stride = n + stride_pad
        r = rng(seed)
        xs = Matrix(None, 0, x_dt, m, n, stride)
        dys_off = -(-xs.nbytes() // 64) * 64 + 64
        dys = Matrix(None, dys_off, dy_dt, m, n, stride)
        self.xy_buf = client.alloc(dys_off + dys.nbytes())
        mem = self.xy_buf.view()
        self.x = Matrix(mem, 0, x_dt, m, n, stride)
        self.dy = Matrix(mem, dys_off, dy_dt, m, n, stride)
        self.x.fill(r, scale=2.0, mean=0.5)
        self.dy.fill(r)
        dxm = Matrix(None, 0, dx_dt, m, n, stride)
        self.dx_buf = client.alloc(dxm.nbytes())
        self.dx = Matrix(self.dx_buf.view(), 0, dx_dt, m, n, stride)
        self.dx_buf.view()[:] = bytes([POISON]) * self.dx_buf.nbytes

        a = rmsnormd.BwdArgs()
        a.m, a.n = m, n
        a.x_dtype, a.dy_dtype, a.dx_dtype = x_dt, dy_dt, dx_dt
        a.x, a.x_stride = self.xy_buf.address, stride
        a.dy, a.dy_stride = self.xy_buf.address + dys_off, stride
        a.dx, a.dx_stride = self.dx_buf.address, stride
        a.eps, a.weight_offset = eps, weight_offset

        x_rows = self.x.rows()
        self.w = None
        if w_dt != NONE:
            self.w_buf = client.alloc(n * SIZE[w_dt])
            self.w = Matrix(self.w_buf.view(), 0, w_dt, 1, n, n)
            self.w.fill(r, scale=0.2, mean=1.0)
            a.w_dtype, a.w = w_dt, self.w_buf.address
        self.dw = None
        if dw_dt != NONE:
            self.dw_buf = client.alloc(n * SIZE[dw_dt])
            self.dw_buf.view()[:] = bytes([POISON]) * self.dw_buf.nbytes
            self.dw = Matrix(self.dw_buf.view(), 0, dw_dt, 1, n, n)
            a.dw_dtype, a.dw = dw_dt, self.dw_buf.address
        self.dres = None
        if dres_dt != NONE:
            self.dres_buf = client.alloc(m * stride * SIZE[dres_dt])
            self.dres = Matrix(self.dres_buf.view(), 0, dres_dt, m, n, stride)
            self.dres.fill(r, scale=0.1)
            a.dres_dtype, a.dres, a.dres_stride = dres_dt, self.dres_buf.address, stride

        rstd = rstd_rows(x_rows, eps)
        if given_rstd:
            self.rstd_buf = client.alloc(4 * m)
            rm = Matrix(self.rstd_buf.view(), 0, F32, 1, m, m)
            for i, v in enumerate(rstd):
                rm.set(0, i, v)
            rstd = rm.rows()[0]  # the fp32 values the daemon reads
            a.rstd = self.rstd_buf.address
        self.args = a
        self.ref_dx, self.ref_dw, self.floor, self.dw_abs = reference(
            x_rows, self.dy.rows(), self.w.rows()[0] if self.w else None, rstd,
            weight_offset, self.dres.rows() if self.dres else None)

    def outputs(self):
        return self.dx.raw(), self.dw.raw() if self.dw else b""


CASES = [
    # x,   dy,   dx,   w,    dw,   dres, pad, rstd given, weight_offset
    (F32, F32, F32, F32, F32, NONE, 0, True, 0.0),
    (BF16, BF16, BF16, BF16, BF16, NONE, 3, False, 0.0),
    (F16, F16, F16, F32, F32, NONE, 0, True, 1.0),
    (BF16, F32, BF16, NONE, NONE, NONE, 8, True, 0.0),
    (F32, BF16, F16, F16, F32, F32, 1, False, 0.0),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "x%s-dy%s-dx%s-w%s-dw%s%s" % (
    NAME[c[0]], NAME[c[1]], NAME[c[2]], NAME.get(c[3], "none"), NAME.get(c[4], "none"),
    "-dres" if c[5] else ""))
def test_bwd_matches_fp64_reference(client, case):
    x_dt, dy_dt, dx_dt, w_dt, dw_dt, dres_dt, pad, given, off = case
    c = Case(client, 37, 129, x_dt, dy_dt, dx_dt, w_dt, dw_dt, dres_dt, pad, given,
             weight_offset=off)
    t = client.bwd_host(c.args)
    assert t.total_ns > 0
    problems = check_dx(dx_dt, c.dx.rows(), c.ref_dx, c.floor)
    if c.dw:
        problems += check_dw(dw_dt, c.dw.rows()[0], c.ref_dw, c.dw_abs)
    assert not problems, "\n".join(problems)

    # Deterministic: the same request again gives the same bits.
    first = c.outputs()
    c.dx_buf.view()[:] = bytes([POISON]) * c.dx_buf.nbytes
    client.bwd_host(c.args)
    assert c.outputs() == first


def test_bwd_padding_between_rows_is_not_written(client):
    c = Case(client, 5, 17, F32, F32, F32, stride_pad=7)
    client.bwd_host(c.args)
    mem = c.dx_buf.view()
    for i in range(c.m - 1):
        gap = mem[(i * 24 + 17) * 4:(i + 1) * 24 * 4]
        assert bytes(gap) == bytes([POISON]) * len(gap), "row %d's padding was written" % i


def test_stats_histograms_have_buckets(client):
    # A few BWDs, so that "total" has values; its buckets add up to its
    # count, ascend, and the cumulative count ends at the total.
    c = Case(client, 5, 17, F32, F32, F32)
    for _ in range(5):
        client.bwd_host(c.args)
    h = client.stats().histograms["total"]
    assert h.buckets is not None and h.sum_ns is not None
    assert h.count > 0
    assert sum(n for _, n in h.buckets) == h.count
    les = [le for le, _ in h.buckets]
    assert les == sorted(les) and len(set(les)) == len(les)
    assert h.cumulative()[-1][1] == h.count
    assert h.max <= les[-1]
    assert h.sum_ns >= h.count  # every value is at least 1 ns


def test_zero_rows_is_a_no_op(client):
    c = Case(client, 3, 8, F32, F32, F32, F32, F32)
    c.args.m = 0
    before = c.outputs()
    client.bwd_host(c.args)
    assert c.outputs() == before


def _refused(client, c, name, field):
    before = c.outputs()
    errors_before = client.stats().get("errors." + name)
    with pytest.raises(rmsnormd.RNError) as ei:
        client.bwd_host(c.args)
    e = ei.value
    assert e.name == name, e
    assert field in e.message, e
    assert c.outputs() == before, "a refused request changed its outputs"
    return e, errors_before


def test_pointer_outside_shared_memory_is_not_shared(client):
    c = Case(client, 4, 16, F32, F32, F32, F32, F32)
    private = ctypes.create_string_buffer(4 * 64)
    c.args.w = ctypes.addressof(private)
    e, _ = _refused(client, c, "NOT_SHARED", "w")
    assert e.code == 110


def test_out_of_bounds_is_refused_by_the_daemon(client):
    c = Case(client, 4, 16, F32, F32, F32, F32, F32)
    c.args.dx_stride = 4096  # rows far past the end of dx's buffer
    e, errs = _refused(client, c, "OUT_OF_BOUNDS", "dx")
    assert e.code == 101
    # The daemon counted it: the error came from there, not from the library.
    assert client.stats().get("errors.OUT_OF_BOUNDS") == errs + 1


def test_misaligned_pointer_is_refused(client):
    c = Case(client, 4, 16, F32, F32, F32)
    c.args.x += 2
    _refused(client, c, "MISALIGNED", "x")


def test_overlapping_output_is_refused(client):
    c = Case(client, 4, 16, F32, F32, F32, F32, F32)
    c.args.dw = c.args.x  # dw would overwrite x
    _refused(client, c, "ALIASING", "dw")


def test_bad_dtype_is_an_invalid_argument(client):
    c = Case(client, 4, 16, F32, F32, F32)
    c.args.dx_dtype = 9
    e, _ = _refused(client, c, "INVALID_ARGUMENT", "dx")
    assert e.code == 100


def test_dw_needs_a_weight_dtype_it_can_take(client):
    c = Case(client, 4, 16, F32, F32, F32, BF16, F16)
    _refused(client, c, "INVALID_ARGUMENT", "dw")


def test_buffers_free_and_foreign_pointers(client):
    b = client.alloc(4096)
    v = b.view()
    v[0:4] = b"abcd"
    assert bytes(b.view()[0:4]) == b"abcd"
    with pytest.raises(ValueError, match="nbytes"):
        client.alloc(0)
    b.free()
    b.free()  # a second free is a no-op
    with pytest.raises(ValueError, match="freed"):
        b.view()
    # A pointer libclient never handed out.
    private = ctypes.create_string_buffer(64)
    with pytest.raises(rmsnormd.RNError) as ei:
        client._call("buffer_free", rmsnormd._lib.lib().rn_buffer_free,
                     ctypes.c_void_p(ctypes.addressof(private)))
    assert ei.value.name == "INVALID_ARGUMENT"


def test_views_die_with_their_buffer(daemon):
    # A view used after free() or close() raises, not reads unmapped (or
    # reused) memory: it crashed the interpreter before.  free() refuses
    # while an object made from a view still uses the memory, as mmap does.
    c = rmsnormd.Client(daemon.endpoint)
    try:
        b = c.alloc(4096)
        v = b.view()
        held = pickle.PickleBuffer(v)   # an export of the view, as numpy's
        with pytest.raises(BufferError, match="still uses it"):
            b.free()
        assert b.address is not None
        del held
        w = b.view()
        b.free()
        with pytest.raises(ValueError):
            v[0]
        with pytest.raises(ValueError):
            w[0] = 1
        v2 = c.alloc(4096).view()
        c.close()
        with pytest.raises(ValueError):
            v2[0]
    finally:
        c.close()


def test_a_dropped_client_closes_at_once(daemon):
    # Its buffers do not hold it in a reference cycle: with the cyclic
    # collector off, the session ends when the last reference goes, and the
    # buffers kept are freed with it.
    import gc
    import weakref
    with rmsnormd.Client(daemon.endpoint) as watcher:
        base = watcher.stats().get("sessions.active")
        gc.disable()
        try:
            c = rmsnormd.Client(daemon.endpoint)
            c.alloc(4096)
            keep = c.alloc(4096)
            v = keep.view()
            ref = weakref.ref(c)
            del c
            assert ref() is None
            assert keep.address is None
            with pytest.raises(ValueError):
                v[0]
            keep.free()   # (a no-op)
        finally:
            gc.enable()
        assert watcher.stats().get("sessions.active") == base


def test_close_releases_buffers_in_the_daemon(daemon):
    with rmsnormd.Client(daemon.endpoint) as watcher:
        base = watcher.stats().get("regions.active")
        c = rmsnormd.Client(daemon.endpoint)
        bufs = [c.alloc(1 << 16) for _ in range(3)]
        assert watcher.stats().get("regions.active") == base + 3
        c.close()
        assert all(b.address is None for b in bufs)
        assert watcher.stats().get("regions.active") == base


def test_device_call_on_cpu_build_or_backend_is_refused(client):
    # rn_rmsnorm_bwd on host buffers: a library without CUDA says UNSUPPORTED;
    # one with CUDA refuses host memory as NOT_SHARED (or the CPU daemon says
    # UNSUPPORTED).  Either way a clear error, and nothing written.
    c = Case(client, 4, 16, F32, F32, F32)
    before = c.outputs()
    with pytest.raises(rmsnormd.RNError) as ei:
        client.bwd(c.args, 0)
    assert ei.value.name in ("UNSUPPORTED", "NOT_SHARED", "NO_CUDA"), ei.value
    assert c.outputs() == before


@pytest.mark.parametrize("case", CASES[:3], ids=["f32", "bf16", "f16"])
def test_the_checks_reject_a_corrupted_result(client, case):
    # The tolerances above must not be so loose that a wrong answer passes:
    # one dx element off by 3 ulp (1 % in fp32) and one dw element off by
    # 5 % are caught.
    x_dt, dy_dt, dx_dt, w_dt, dw_dt, dres_dt, pad, given, off = case
    c = Case(client, 37, 129, x_dt, dy_dt, dx_dt, w_dt, dw_dt, dres_dt, pad, given,
             weight_offset=off)
    client.bwd_host(c.args)
    got = c.dx.rows()
    assert not check_dx(dx_dt, got, c.ref_dx, c.floor)
    g = got[5][7]
    got[5][7] = g * 1.01 if dx_dt == F32 else g + 3 * ulp(dx_dt, g)
    assert check_dx(dx_dt, got, c.ref_dx, c.floor)
    dw = c.dw.rows()[0]
    dw[3] *= 1.05
    assert check_dw(dw_dt, dw, c.ref_dw, c.dw_abs)


def test_bwd_survives_a_daemon_restart(daemon):
    # libclient registers live buffers again with the new daemon, so the same
    # HostBuffers (the same addresses) keep working.
    with rmsnormd.Client(daemon.endpoint, timeout=5) as c:
        case = Case(c, 6, 40, F32, F32, F32, F32, F32)
        c.bwd_host(case.args)
        first = case.outputs()
        assert daemon.stop() == 0
        daemon.start()
        case.dx_buf.view()[:] = bytes([POISON]) * case.dx_buf.nbytes
        c.bwd_host(case.args)
        assert case.outputs() == first
        assert c.stats().get("regions.active") >= 5


def test_one_client_shared_by_threads(client):
    import threading
    cases = [Case(client, 9, 64, F32, F32, F32, F32, F32, seed=s) for s in range(4)]
    expected = []
    for c in cases:
        client.bwd_host(c.args)
        expected.append(c.outputs())
        c.dx_buf.view()[:] = bytes([POISON]) * c.dx_buf.nbytes
    errors = []

    def work(c, want):
        try:
            for _ in range(10):
                client.bwd_host(c.args)
                client.ping()
            if c.outputs() != want:
                errors.append("wrong result")
        except Exception as e:  # reported below, with the thread's case
            errors.append(repr(e))

    threads = [threading.Thread(target=work, args=(c, w)) for c, w in zip(cases, expected)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads)
    assert not errors, errors


def test_fast_path_matches_classic(daemon, client):
    """The fast path (a ring of slots in shared memory): calls published
    without waiting, one sync(), results bitwise the classic path's; the
    daemon's errors raise at sync() and check(), once."""
    fast = rmsnormd.Client(daemon.endpoint, path="fast")
    try:
        assert fast.path == "fast" and client.path == "auto"
        cases = []
        for i, case in enumerate(CASES):
            x_dt, dy_dt, dx_dt, w_dt, dw_dt, dres_dt, pad, given, off = case
            k = (19 + i, 65 + 3 * i, x_dt, dy_dt, dx_dt, w_dt, dw_dt, dres_dt, pad, given)
            f = Case(fast, *k, weight_offset=off, seed=10 + i)
            c = Case(client, *k, weight_offset=off, seed=10 + i)
            fast.bwd_host_async(f.args)
            cases.append((f, c))
        fast.sync()
        for f, c in cases:
            client.bwd_host(c.args)
            assert f.outputs() == c.outputs()
        assert fast.stats().get("fast.ok") == len(CASES)

        bad = cases[0][0]
        bad.args.m += 1000   # past its buffers: only the daemon can tell
        fast.bwd_host_async(bad.args)
        with pytest.raises(rmsnormd.RNError) as ei:
            fast.sync()
        assert ei.value.name == "OUT_OF_BOUNDS"
        fast.check()         # reported once

        # A failed call not yet reported when the client closes: a warning,
        # not silence.
        seen = fast.stats().get("errors.OUT_OF_BOUNDS")
        fast.bwd_host_async(bad.args)
        deadline = time.monotonic() + 20
        while fast.stats().get("errors.OUT_OF_BOUNDS") == seen and time.monotonic() < deadline:
            time.sleep(0.01)
        with pytest.warns(RuntimeWarning, match="failed unseen"):
            fast.close()
    finally:
        fast.close()
