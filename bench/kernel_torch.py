#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""PyTorch's and Quack's side of the kernel benchmark (bench/bench_kernel.c reads its CSV).

Grid: M in {4096, 8192, 16384, 32768, 65536} x N in {256 .. 8192}, bf16 x, dy
and dx, with an fp32 weight (w "f32": fp32 dw) and with a bf16 weight (w
"bf16": bf16 dw); --quick keeps the same subset bench_kernel --quick does
(every other M and N).  For each shape it times two things:

  eager    torch.autograd.grad(y, (x, w), dy) with y = F.rms_norm(x, (N,), w,
           1e-5) from a forward pass done beforehand, i.e. PyTorch's own
           RMSNorm backward as a training step runs it (with an fp32 weight
           and bf16 x PyTorch does not use its fused kernel).
  compile  torch.compile(bwd_formula, dynamic=False): the backward formula with
           the kernel's semantics (rstd given as fp32 [M]; all math in fp32;
           dx in x's dtype, dw = sum over rows of dy * xhat in fp32, then in
           the weight's dtype), compiled for static shapes, i.e. one graph
           and one set of Inductor kernels specialised to each (M, N, weight
           dtype), which is what torch.compile does best for a shape it knows
           in advance.  The mode is --mode (or $KERNEL_TORCH_MODE): "default"
           (Inductor's default mode, the default here: 0.1-1 s of compiling a
           shape, all 60 shapes in about 70 s on an H200, from a cold cache)
           or "max-autotune-no-cudagraphs" (its coordinate-descent tuning
           benchmarks many kernel configs per shape: on an H200 up to 1.44x
           faster kernels at some shapes, e.g. 8192x8192 bf16 174 us against
           249 us, none at others, but 4-35 s of compiling a shape, so the
           whole grid needs far more than run_kernel.sh's default 300 s).
           Dynamo's recompile limits are raised so that no shape falls back
           to eager; a shape that fails to compile gets 0 (absent) and a
           message on stderr.
  compile_det  the same, compiled and run with
           torch.use_deterministic_algorithms(True) (a second compiled
           function, so each mode has its own graphs).
  quack    Quack's quack.rmsnorm.rmsnorm_bwd(x, w, dy, rstd) (one CuTe-DSL
           kernel writing per-CTA fp32 dw partials, then dw_partial.sum(0)),
           when the quack package imports (0 otherwise); it compiles once per
           N and dtype set, at the first call.

Timing, the same for both: after warm-up calls, many calls (--reps, default
60) are queued behind a GPU sleep long enough that all of them are enqueued
before the GPU reaches the first (so the host's call rate does not show);
each call sits between two CUDA events and the median interval is the
result, in microseconds.  The calls rotate over enough input sets (random,
never zeros) that they read >= 240 MB, 4x the H200's 60 MB L2, so L2 cannot
serve the inputs.  Shapes run largest first; each shape's tensors are freed
before the next.

Writes OUT.csv: the header m,n,w,eager_us,compile_us,compile_det_us,quack_us,
then one row per shape,
flushed as it is measured (a run cut short keeps its rows); progress goes to
stderr.  0 in a column means not measured.

With --accuracy DIR it then measures dx's accuracy on fixed random inputs
(M = 4096, N in {256, 1024, 4096, 8192}, both weights): the worst error of
each element against an fp64 reference with the same fp32 rstd, in bf16
ulps of the reference, and the fraction beyond one ulp, for eager,
torch.compile and Quack (DIR/acc_torch.csv); the inputs go to DIR for
bench_kernel --accuracy DIR to measure ours on the same values.

Usage: kernel_torch.py OUT.csv [--quick] [--mode default|max-autotune-no-cudagraphs]
                       [--reps N] [--shape M,N,f32|bf16 ...] [--accuracy DIR]
"""
import argparse
import math
import os
import statistics
import sys
import time
import traceback

import torch
import torch.nn.functional as F

EPS = 1e-5
MS = [4096, 8192, 16384, 32768, 65536]
NS = [256, 512, 1024, 2048, 4096, 8192]
WDTYPES = (("f32", torch.float32), ("bf16", torch.bfloat16))  # bench_kernel's spelling
ROTATE_BYTES = 240e6  # bytes read over one rotation of the input sets: 4x a 60 MB L2
MAX_SETS = 64
RECOMPILE_LIMIT = 256  # > the 60 shapes, so that no shape falls back to eager


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def bwd_formula(x, dy, w, rstd):
    """RMSNorm backward with the kernel's semantics (see kernels/rnk.h)."""
    xf = x.float()
    dyf = dy.float()
    r = rstd.unsqueeze(1)
    xhat = xf * r
    g = dyf * w.float()
    c = (xhat * g).mean(dim=1, keepdim=True)
    dx = r * (g - xhat * c)
    dw = (dyf * xhat).sum(dim=0)
    return dx.to(x.dtype), dw.to(w.dtype)


def bwd_formula_det(x, dy, w, rstd):
    """The same formula, as a second function for the deterministic mode."""
    return bwd_formula(x, dy, w, rstd)


def load_quack():
    try:
        from quack.rmsnorm import rmsnorm_bwd
    except Exception as e:  # not installed: the column stays 0
        log(f"note: quack not available: {e!r}")
        return None

    def quack_bwd(x, dy, w, rstd):
        dx, dw, _, _ = rmsnorm_bwd(x, w, dy, rstd)
        return dx, dw

    return quack_bwd


ACC_SHAPES = [(4096, n, w) for w in ("f32", "bf16") for n in (256, 1024, 4096, 8192)]


def ulp_stats(dx, ref):
    """Worst |dx - ref| in bf16 ulps of ref (2^(floor(log2|ref|) - 7)), and the
    fraction of elements more than one such ulp away."""
    d = (dx.double() - ref).abs()
    e = torch.floor(torch.log2(ref.abs().clamp_min(2.0 ** -126)))
    u = d / torch.exp2(e - 7)
    return u.max().item(), (u > 1).double().mean().item()


def accuracy(outdir, fns, dev, seed=12345):
    """dx accuracy on the same random inputs for eager, torch.compile and Quack;
    the inputs go to outdir for bench_kernel --accuracy to run ours on."""
    compiled, _, quack = fns
    os.makedirs(outdir, exist_ok=True)
    g = torch.Generator(device=dev)
    g.manual_seed(seed)
    with open(os.path.join(outdir, "acc_torch.csv"), "w") as f:
        f.write("m,n,w,impl,max_ulp,frac_over1\n")
        for m, n, wname in ACC_SHAPES:
            wdt = dict(WDTYPES)[wname]
            x = torch.randn(m, n, device=dev, generator=g).to(torch.bfloat16)
            dy = torch.randn(m, n, device=dev, generator=g).to(torch.bfloat16)
            w = (1.0 + 0.3 * torch.randn(n, device=dev, generator=g)).to(wdt)
            x64 = x.double()
            rstd = torch.rsqrt(x64.pow(2).mean(dim=1) + EPS).float()
            r = rstd.double().unsqueeze(1)
            xh = x64 * r
            gg = dy.double() * w.double()
            ref = r * (gg - xh * (xh * gg).mean(dim=1, keepdim=True))
            base = os.path.join(outdir, f"acc_{m}_{n}_{wname}")
            x.view(torch.int16).cpu().numpy().tofile(base + ".x")
            dy.view(torch.int16).cpu().numpy().tofile(base + ".dy")
            w.float().cpu().numpy().tofile(base + ".w")
            rstd.cpu().numpy().tofile(base + ".rstd")
            xr = x.detach().requires_grad_(True)
            wr = w.detach().requires_grad_(True)
            y = F.rms_norm(xr, (n,), wr, EPS)
            impls = [("eager", torch.autograd.grad(y, (xr, wr), dy)[0])]
            try:
                impls.append(("compile", compiled(x, dy, w, rstd)[0]))
            except Exception as e:
                log(f"  accuracy {m}x{n}: compile failed: {e!r}")
            if quack is not None:
                try:
                    impls.append(("quack", quack(x, dy, w, rstd)[0]))
                except Exception as e:
                    log(f"  accuracy {m}x{n}: quack failed: {e!r}")
            for name, dx in impls:
                mx, fr = ulp_stats(dx, ref)
                f.write(f"{m},{n},{wname},{name},{mx:.4f},{fr:.3e}\n")
                log(f"accuracy {m}x{n} w={wname} {name}: worst {mx:.3f} ulp, "
                    f"{100 * fr:.4f} % beyond 1 ulp")
            f.flush()


def raise_recompile_limits():
    cfg = torch._dynamo.config
    for name in ("cache_size_limit", "recompile_limit",
                 "accumulated_cache_size_limit", "accumulated_recompile_limit"):
        if hasattr(cfg, name):
            try:
                setattr(cfg, name, max(int(getattr(cfg, name)), RECOMPILE_LIMIT))
            except Exception as e:  # an alias that refuses to be set: the other one is
                log(f"note: torch._dynamo.config.{name} not set: {e!r}")
    # hitting the limit anyway: an error (recorded as 0), not a silent eager run
    if hasattr(cfg, "fail_on_recompile_limit_hit"):
        cfg.fail_on_recompile_limit_hit = True


def unique_graphs():
    try:
        return int(torch._dynamo.utils.counters["stats"]["unique_graphs"])
    except Exception:
        return -1


class Sleeper:
    """torch.cuda._sleep takes clock cycles; this converts microseconds."""

    def __init__(self):
        self.ok = hasattr(torch.cuda, "_sleep")
        self.cycles_per_us = 2000.0
        if not self.ok:
            log("note: torch.cuda._sleep missing: calls are not queued behind a sleep")
            return
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        cycles = 20_000_000
        for _ in range(2):  # the second, with the clocks up
            a.record()
            torch.cuda._sleep(cycles)
            b.record()
            b.synchronize()
            us = a.elapsed_time(b) * 1e3
        if us > 0:
            self.cycles_per_us = cycles / us

    def __call__(self, us):
        if self.ok:
            torch.cuda._sleep(int(us * self.cycles_per_us))


def time_calls(fn, sets, reps, sleep, label):
    """Median microseconds of one call, rotating over sets (see the docstring)."""
    for i in range(max(3, min(len(sets), 8))):  # warm-up
        fn(*sets[i % len(sets)])
    torch.cuda.synchronize()
    k = 10  # host time to issue one call, to size the sleep
    t = time.perf_counter()
    for i in range(k):
        fn(*sets[i % len(sets)])
    host_us = (time.perf_counter() - t) / k * 1e6
    torch.cuda.synchronize()
    sleep_us = min(max(2000.0, 1.5 * reps * host_us + 1000.0), 1e6)
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(reps + 2)]
    ev[-1].record()
    sleep(sleep_us)
    ev[0].record()
    t = time.perf_counter()
    for i in range(reps):
        fn(*sets[i % len(sets)])
        ev[i + 1].record()
    issue_ms = (time.perf_counter() - t) * 1e3
    torch.cuda.synchronize()
    slept_ms = ev[-1].elapsed_time(ev[0])
    iv = [ev[i].elapsed_time(ev[i + 1]) * 1e3 for i in range(reps)]
    med = statistics.median(iv)
    # Issuing outlasts the sleep when the launch queue fills (eager with an
    # fp32 weight launches many kernels a call); the GPU waits for the host
    # only if, on top of that, the host is slower per call than the GPU, and
    # then the later calls are the slower ones.
    first, last = statistics.median(iv[: reps // 2]), statistics.median(iv[reps // 2:])
    if sleep.ok and issue_ms > slept_ms and host_us > med and last > 1.1 * first:
        log(f"  note: {label}: the host's rate may show: {host_us:.1f} us a call on the host, "
            f"median {first:.1f} us over the first half of the calls, {last:.1f} us over "
            f"the second")
    return med


def rel_err(a, b):
    a, b = a.float(), b.float()
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()


def time_compiled(compiled, comp_sets, eager_sets, eager, reps, sleep, label, dynamo=True):
    """Compile (first call), check against autograd, time; 0 on failure.
    dynamo: a torch.compile'd function, which must compile a new graph."""
    try:
        g0 = unique_graphs()
        t = time.perf_counter()
        dx_c, dw_c = compiled(*comp_sets[0])
        torch.cuda.synchronize()
        compile_s = time.perf_counter() - t
        g1 = unique_graphs()
        if dynamo and g0 > 0 and g1 == g0:
            # nothing new was compiled for a new static shape: Dynamo ran it eagerly
            raise RuntimeError("torch.compile compiled no graph for this shape (fell back to eager?)")
        try:  # the formula against PyTorch's backward, same inputs
            dx_e, dw_e = eager(*eager_sets[0])
            ex, ew = rel_err(dx_c, dx_e), rel_err(dw_c, dw_e)
            if not (ex < 0.03 and ew < 0.03):
                log(f"  {label}: WARNING: result differs from autograd: "
                    f"dx {ex:.3g}, dw {ew:.3g} (relative to max |value|)")
            del dx_e, dw_e
        except Exception as e:
            log(f"  {label}: check against autograd skipped: {e!r}")
        del dx_c, dw_c
        us = time_calls(compiled, comp_sets, reps, sleep, label)
        log(f"  {label}: first call {compile_s:.1f} s (graphs {g0} -> {g1})")
        return us
    except Exception as e:
        msg = "".join(traceback.format_exception_only(type(e), e)).strip()
        log(f"  {label}: failed, time = 0: {msg[:2000]}")
        return 0.0


def bench_shape(m, n, wname, wdt, fns, reps, sleep, dev):
    compiled, compiled_det, quack = fns
    label = f"{m}x{n} w={wname}"
    per_set = 4 * m * n  # bytes of x and dy that one call reads
    nsets = max(2, min(MAX_SETS, math.ceil(ROTATE_BYTES / per_set)))
    w = (1.0 + 0.3 * torch.randn(n, device=dev)).to(wdt)
    eager_sets, comp_sets = [], []
    for _ in range(nsets):
        x = torch.randn(m, n, device=dev, dtype=torch.bfloat16)
        dy = torch.randn(m, n, device=dev, dtype=torch.bfloat16)
        xr = x.detach().requires_grad_(True)
        wr = w.detach().requires_grad_(True)
        y = F.rms_norm(xr, (n,), wr, EPS)
        eager_sets.append((y, xr, wr, dy))
        rstd = torch.rsqrt(x.float().pow(2).mean(dim=1) + EPS)
        comp_sets.append((x, dy, w, rstd))

    def eager(y, xr, wr, dy):
        return torch.autograd.grad(y, (xr, wr), dy, retain_graph=True)

    e_us = 0.0
    try:
        e_us = time_calls(eager, eager_sets, reps, sleep, label + " eager")
    except Exception as e:
        log(f"  {label}: eager failed: {e!r}")
    c_us = time_compiled(compiled, comp_sets, eager_sets, eager, reps, sleep, label + " compile")
    torch.use_deterministic_algorithms(True)
    try:
        d_us = time_compiled(compiled_det, comp_sets, eager_sets, eager, reps, sleep,
                             label + " compile (deterministic)")
    finally:
        torch.use_deterministic_algorithms(False)
    q_us = 0.0
    if quack is not None:
        q_us = time_compiled(quack, comp_sets, eager_sets, eager, reps, sleep, label + " quack",
                             dynamo=False)
    del eager_sets, comp_sets, w
    return e_us, c_us, d_us, q_us


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out", help="CSV to write")
    ap.add_argument("--quick", action="store_true", help="the subset bench_kernel --quick runs")
    ap.add_argument("--mode", default=os.environ.get("KERNEL_TORCH_MODE", "default"),
                    choices=["default", "max-autotune-no-cudagraphs"],
                    help="torch.compile mode (default: $KERNEL_TORCH_MODE, else default); modes "
                         "with CUDA graphs are not offered: they copy the rotated inputs into "
                         "static buffers")
    ap.add_argument("--reps", type=int, default=60, help="timed calls per shape and variant")
    ap.add_argument("--shape", action="append", default=[], metavar="M,N,W",
                    help="only this shape, e.g. 65536,4096,bf16 (repeatable)")
    ap.add_argument("--accuracy", metavar="DIR",
                    help="then compare dx accuracy (eager, compile, Quack) on fixed random "
                         "inputs, written to DIR for bench_kernel --accuracy DIR")
    ap.add_argument("--accuracy-seed", type=int, default=12345, metavar="S",
                    help="the accuracy inputs' generator seed (default 12345, the standing's)")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        log("kernel_torch.py: no CUDA device")
        return 1
    dev = torch.device("cuda")
    torch.manual_seed(0)
    raise_recompile_limits()
    mode = None if args.mode == "default" else args.mode
    compiled = torch.compile(bwd_formula, dynamic=False, mode=mode)
    compiled_det = torch.compile(bwd_formula_det, dynamic=False, mode=mode)
    fns = (compiled, compiled_det, load_quack())
    shapes = [(m, n, wname, wdt)
              for wname, wdt in WDTYPES
              for i, m in enumerate(MS)
              for j, n in enumerate(NS)
              if not (args.quick and (i % 2 or j == 1))]
    if args.shape:
        want = {tuple(x.strip() for x in s.split(",")) for s in args.shape}
        shapes = [s for s in shapes if (str(s[0]), str(s[1]), s[2]) in want]
    shapes.sort(key=lambda s: (-s[0] * s[1], -s[1], s[2]))  # largest first
    log(f"torch {torch.__version__} on {torch.cuda.get_device_name(0)}; compile mode {args.mode}, "
        f"static shapes; {len(shapes)} shapes, {args.reps} calls each")
    sleep = Sleeper()
    t0 = time.time()
    done = 0
    with open(args.out, "w") as f:  # written row by row: a cut-short run still leaves its rows
        f.write("m,n,w,eager_us,compile_us,compile_det_us,quack_us\n")
        f.flush()
        for m, n, wname, wdt in shapes:
            try:
                e_us, c_us, d_us, q_us = bench_shape(m, n, wname, wdt, fns, args.reps, sleep, dev)
            except Exception as e:  # e.g. out of memory making the inputs
                log(f"  {m}x{n} w={wname}: failed: {e!r}")
                e_us = c_us = d_us = q_us = 0.0
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            f.write(f"{m},{n},{wname},{e_us:.3f},{c_us:.3f},{d_us:.3f},{q_us:.3f}\n")
            f.flush()
            done += 1
            nbytes = 6 * m * n + 4 * m + 2 * n * (4 if wname == "f32" else 2)  # as bench_kernel

            def tbps(us):
                return nbytes / (us * 1e-6) / 1e12 if us > 0 else 0.0

            log(f"torch {m:6d} x {n:5d} w={wname:4s}: eager {e_us:9.2f} us, compile {c_us:9.2f} us,"
                f" deterministic {d_us:9.2f} us, quack {q_us:9.2f} us"
                f" ({tbps(e_us):.2f} / {tbps(c_us):.2f} / {tbps(d_us):.2f} / {tbps(q_us):.2f} TB/s)"
                f"  [{done}/{len(shapes)}, {time.time() - t0:.0f} s]")
    log(f"kernel_torch.py: {done} shapes in {time.time() - t0:.0f} s -> {args.out}")
    if args.accuracy:  # after the timing, whose check wants each shape's first compile
        accuracy(args.accuracy, fns, dev, args.accuracy_seed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
