#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""The Python binding's host cost per autograd backward (rmsnormd.torch),
on the daemon's CPU backend: no GPU needed.

    bench_torch_host.py [--shape 8x1024] [--dtype bf16] [--wdtype bf16]
                        [--calls 2000] [--batches 15] [--endpoint ipc://...]

Every figure is the median over --batches batches of the mean per call of
--calls calls (us), with the spread of the batches (min..max) as the
machine's noise.  Starts its own rmsnormd (CPU backend; $RN_BUILD, else the
checkout's build/) unless --endpoint names one.

Totals (the real code of the rmsnormd package imported, whichever it is:
run this file with PYTHONPATH at another checkout's python/ to compare):
  e2e      torch.autograd.grad(y, (x, w), dy) through the daemon
  stub     the same with libclient's rn_rmsnorm_bwd_host replaced by a C
           function that returns 0 (compiled here with cc): everything the
           host does but the daemon's turn
  floor    the same autograd call on a Function whose backward returns two
           ready tensors: PyTorch's own engine cost
  binding  stub - floor: what rmsnormd.torch adds on the host
  fwd.*    the forward of rmsnormd.torch.RMSNorm against torch.nn.RMSNorm's
           (fwd.binding: the difference)
Parts (single steps, in a loop):
  legacy.* the steps of the backward before the host-overhead work (main
           at e413afd), as it wrote them: _rows twice, two torch.empty,
           BwdArgs field by field, Client._call (RLock, os.getpid, byref)
  now.*    the CUDA path's host steps of the imported package where it
           has them, on CPU tensors: rmsnormd.torch._device_args (rows,
           dx and dw, the BwdArgs), the allocation alone, Client.bwd with
           rn_rmsnorm_bwd a no-op
The CPU path also copies through a staging buffer, which the CUDA path does
not; the CUDA-only steps (the current stream, the current device) cannot be
timed without a GPU.
"""

import argparse
import ctypes
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
if not any(os.path.isfile(os.path.join(p, "rmsnormd", "__init__.py")) for p in sys.path if p):
    sys.path.insert(0, os.path.join(REPO, "python"))
sys.path.insert(0, HERE)

DT = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


def measure(fn, calls, batches):
    """(median, min, max) over batches of the mean us per call of fn()."""
    for _ in range(max(10, calls // 10)):
        fn()
    per = []
    clock = time.perf_counter_ns
    for _ in range(batches):
        t0 = clock()
        for _ in range(calls):
            fn()
        per.append((clock() - t0) / calls / 1e3)
    return statistics.median(per), min(per), max(per)


def noop_library(tmp):
    src = os.path.join(tmp, "noop.c")
    so = os.path.join(tmp, "libnoop.so")
    with open(src, "w") as f:
        f.write("int rn_bench_noop(void *a, void *b, void *c)\n"
                "{ (void)a; (void)b; (void)c; return 0; }\n")
    subprocess.run([os.environ.get("CC", "cc"), "-O2", "-shared", "-fPIC", "-o", so, src],
                   check=True)
    return ctypes.CDLL(so)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default="8x1024")
    ap.add_argument("--dtype", default="bf16", choices=sorted(DT))
    ap.add_argument("--wdtype", default="bf16", choices=sorted(DT))
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--batches", type=int, default=15)
    ap.add_argument("--endpoint")
    ap.add_argument("--build", default=os.environ.get("RN_BUILD") or os.path.join(REPO, "build"))
    a = ap.parse_args(argv)
    m, n = (int(v) for v in a.shape.lower().split("x"))
    os.environ.setdefault("RMSNORMD_LIBCLIENT", os.path.join(a.build, "librmsnorm_client.so.0"))
    try:
        import torch
    except ImportError:
        print("bench_torch_host: needs PyTorch (%s)" % sys.executable, file=sys.stderr)
        return 2
    torch.set_num_threads(1)
    import rmsnormd
    import rmsnormd.torch as rnt
    from rmsnormd import _lib

    tmp = tempfile.mkdtemp(prefix="rnbh-")
    daemon = None
    endpoint = a.endpoint
    if endpoint is None:
        from bench_torch import Daemon
        daemon = Daemon(a.build, "cpu", os.path.join(tmp, "daemon.log")).start()
        endpoint = daemon.endpoint
    rows = []

    def out(name, r):
        rows.append((name, r))
        print("%-24s %8.2f us  (%.2f..%.2f)" % ((name,) + r), flush=True)

    try:
        dt, wdt = getattr(torch, DT[a.dtype]), getattr(torch, DT[a.wdtype])
        g = torch.Generator().manual_seed(1)
        x = torch.randn(m, n, generator=g).to(dt).requires_grad_(True)
        w = (1 + 0.1 * torch.randn(n, generator=g)).to(wdt).requires_grad_(True)
        dy = torch.randn(m, n, generator=g).to(torch.promote_types(dt, wdt))
        print("%s x %s, weight %s, %d calls x %d batches; package %s"
              % (a.shape, a.dtype, a.wdtype, a.calls, a.batches,
                 os.path.dirname(rmsnormd.__file__)), flush=True)

        client = rmsnormd.Client(endpoint, name="bench_torch_host")
        y = rnt.rms_norm(x, w, 1e-6, client=client)
        grad = torch.autograd.grad
        out("e2e", measure(lambda: grad(y, (x, w), dy, retain_graph=True), a.calls, a.batches))

        lib = _lib.lib()
        noop = noop_library(tmp).rn_bench_noop
        real = lib.rn_rmsnorm_bwd_host
        noop.restype, noop.argtypes = real.restype, real.argtypes
        lib.rn_rmsnorm_bwd_host = noop  # before the client: it may keep the function
        try:
            sclient = rmsnormd.Client(endpoint, name="bench_torch_host stub")
            ys = rnt.rms_norm(x, w, 1e-6, client=sclient)
            stub = measure(lambda: grad(ys, (x, w), dy, retain_graph=True), a.calls, a.batches)
            out("stub", stub)
        finally:
            lib.rn_rmsnorm_bwd_host = real

        gx, gw = torch.empty_like(x), torch.empty_like(w)

        class Ready(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x, w):
                return x * 1

            @staticmethod
            def backward(ctx, dy):
                return gx, gw

        yf = Ready.apply(x, w)
        floor = measure(lambda: grad(yf, (x, w), dy, retain_graph=True), a.calls, a.batches)
        out("floor", floor)
        out("binding", (stub[0] - floor[0], stub[1] - floor[2], stub[2] - floor[1]))

        # ---- the forward: the module against torch.nn.RMSNorm's (the kernel
        # is torch's fused one in both where the weight has x's dtype) -------
        m_torch = torch.nn.RMSNorm(n, eps=1e-6, dtype=wdt)
        m_ours = rnt.RMSNorm(n, eps=1e-6, dtype=wdt, client=client)
        f_torch = measure(lambda: m_torch(x), a.calls, a.batches)
        f_ours = measure(lambda: m_ours(x), a.calls, a.batches)
        out("fwd.torch", f_torch)
        out("fwd.rmsnormd", f_ours)
        out("fwd.binding", (f_ours[0] - f_torch[0], f_ours[1] - f_torch[2],
                            f_ours[2] - f_torch[1]))

        # ---- the legacy steps, as the backward wrote them before -----------------------
        x2d = x.detach()

        def legacy_rows():
            return rnt_rows(x2d, n), rnt_rows(dy, n)

        def rnt_rows(t, n):
            t2 = t.reshape(-1, n)
            if t2.stride(1) != 1 or (t2.size(0) > 1 and t2.stride(0) < n):
                t2 = t2.contiguous()
            return t2

        def legacy_alloc():
            return (torch.empty((m, n), dtype=x2d.dtype, device=x2d.device),
                    torch.empty(n, dtype=w.dtype, device=x2d.device))

        dx, dw = legacy_alloc()
        wd = w.detach()
        codes = {torch.float32: 1, torch.float16: 2, torch.bfloat16: 3}

        def code(t):
            return codes[t.dtype]

        def legacy_args():
            b = _lib.BwdArgs()
            b.m = m
            b.n = n
            b.x_dtype = code(x2d)
            b.dy_dtype = code(dy)
            b.dx_dtype = b.x_dtype
            b.x, b.x_stride = x2d.data_ptr(), x2d.stride(0)
            b.dy, b.dy_stride = dy.data_ptr(), dy.stride(0)
            b.dx, b.dx_stride = dx.data_ptr(), dx.stride(0)
            ww = wd.reshape(n).contiguous()
            b.w_dtype = code(ww)
            b.w = ww.data_ptr()
            b.dw_dtype = code(dw)
            b.dw = dw.data_ptr()
            b.rstd = dx.data_ptr()
            b.eps = 1e-6
            b.weight_offset = 0.0
            return b

        args = legacy_args()
        lock = threading.RLock()
        pid = os.getpid()
        h = ctypes.c_void_p(1)

        def legacy_call():
            with lock:
                if os.getpid() != pid:
                    raise RuntimeError("fork")
                rv = noop(h, ctypes.byref(args), ctypes.byref(_lib.Timing()))
                if rv != 0:
                    raise RuntimeError(rv)

        out("legacy.rows", measure(legacy_rows, a.calls, a.batches))
        out("legacy.alloc", measure(legacy_alloc, a.calls, a.batches))
        out("legacy.args", measure(legacy_args, a.calls, a.batches))
        out("legacy.call", measure(legacy_call, a.calls, a.batches))
        out("ctypes.noop", measure(lambda: noop(h, args, None), a.calls, a.batches))

        dev_args = getattr(rnt, "_device_args", None)
        if dev_args is not None:
            # The CUDA path's host steps, on CPU tensors: rows, allocation
            # and arguments in one (_device_args), allocation alone, and
            # Client.bwd with rn_rmsnorm_bwd a no-op (lock, fork check, call).
            rstd = torch.rand(m)

            def now_args():
                return dev_args(x2d, dy, wd, rstd, m, n, 1e-6, 0.0, None)

            def now_alloc():
                return torch.empty_like(x2d), torch.empty_like(wd)  # contiguous x, w

            nargs = now_args()[0]
            real_bwd = lib.rn_rmsnorm_bwd
            noop2 = noop_library(tmp).rn_bench_noop
            noop2.restype, noop2.argtypes = real_bwd.restype, real_bwd.argtypes
            lib.rn_rmsnorm_bwd = noop2
            try:
                out("now.rows+alloc+args", measure(now_args, a.calls, a.batches))
                out("now.alloc", measure(now_alloc, a.calls, a.batches))
                out("now.call", measure(lambda: client.bwd(nargs, 0), a.calls, a.batches))
            finally:
                lib.rn_rmsnorm_bwd = real_bwd
        client.close()
        sclient.close()
    finally:
        if daemon is not None:
            code_ = daemon.stop()
            if code_ != 0:
                print("bench_torch_host: the daemon exited %s" % code_, file=sys.stderr)
                return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
