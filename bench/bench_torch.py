#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""RMSNorm through PyTorch's autograd, as a user writes it: torch's own
(torch.nn.RMSNorm) against rmsnormd.torch.RMSNorm with the backward in the
daemon (libclient's default path; with --classic also the classic path).

    bench_torch.py OUT [--shapes 4096x1024,16384x4096,65536x4096]
                       [--wdtypes bf16,fp32] [--iters 200] [--classic]
                       [--cpu] [--endpoint ipc://...]

Starts its own rmsnormd ($RN_BUILD/rmsnormd, else the checkout's build/)
and stops it (SIGTERM, checked to exit 0), unless --endpoint names one.
For every shape (M x N, x and dy in --xdtype, the weight in each of
--wdtypes) and every implementation it times, with CUDA events:

  fwd     y = norm(x)
  bwd     y.backward(dy) alone (the forward runs before the first event)
  fwdbwd  y = norm(x); y.backward(dy)

in two regimes, each as the median of --iters iterations after --warmup:

  synced  torch.cuda.synchronize() before each iteration, events around
          it: the latency of one call into an idle GPU, host time included
          (launches, Python, libclient, the daemon's turn around).
  stream  no synchronisation inside the loop: events around each iteration
          (median) and around the whole loop (loop_us: its mean per
          iteration, everything the loop issued, forward included for bwd):
          the throughput of back-to-back calls.

The implementations take turns in --rounds rounds, so that clock and
thermal drift hit them alike.  Inputs are random (x ~ N(0.5, 2), dy ~ N(0,
1), weight ~ 1 + 0.1 N(0, 1)); before timing, each implementation's dx and
dw are compared with torch's own (max abs difference over max abs value)
and the daemon's statistics show which path its calls took.  Errors of the
fast path surface at the next call: the script calls Client.sync() after
each measurement (outside the timing), so a failed call fails the run.

Writes OUT/bench_torch.csv (one row per measurement, with the ratio
implementation / torch of the median), OUT/bench_torch.json (the rows, the
environment, the daemon's path counters) and OUT/daemon.log, and prints a
table.  Exit status 0 when every measurement ran and every gradient check
held; 2 when there is nothing to measure on (no PyTorch, no GPU).

--cpu: the smoke mode for hosts without a GPU (and CI): CPU tensors, the
daemon's CPU backend (rmsnormd.torch sends CPU tensors there when a client is
given), host timers instead of CUDA events; same code path otherwise.
"""

import argparse
import csv
import ctypes
import json
import os
import platform
import select
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(REPO, "python"))

DEFAULT_SHAPES = "4096x1024,16384x4096,65536x4096"
MODES = ("fwd", "bwd", "fwdbwd")
REGIMES = ("synced", "stream")
EPS = 1e-6


def die(msg, code=2):
    print("bench_torch: " + msg, file=sys.stderr, flush=True)
    sys.exit(code)


def parse_shapes(text):
    out = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        try:
            m, n = (int(v) for v in part.lower().split("x"))
        except ValueError:
            raise argparse.ArgumentTypeError("shape %r: expected MxN, e.g. 4096x1024" % part)
        if m <= 0 or n <= 0:
            raise argparse.ArgumentTypeError("shape %r: M and N must be positive" % part)
        out.append((m, n))
    if not out:
        raise argparse.ArgumentTypeError("no shapes given")
    return out


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="\n\n".join(__doc__.split("\n\n")[2:]))
    ap.add_argument("out", help="directory for bench_torch.csv, bench_torch.json, daemon.log")
    ap.add_argument("--shapes", type=parse_shapes, default=parse_shapes(DEFAULT_SHAPES),
                    help="comma-separated MxN (default %s)" % DEFAULT_SHAPES)
    ap.add_argument("--xdtype", default="bf16", choices=["bf16", "fp16", "fp32"],
                    help="dtype of x and dy (default bf16)")
    ap.add_argument("--wdtypes", default="bf16,fp32",
                    help="comma-separated weight dtypes (default bf16,fp32)")
    ap.add_argument("--modes", default=",".join(MODES),
                    help="comma-separated, of %s (default all)" % ", ".join(MODES))
    ap.add_argument("--regimes", default=",".join(REGIMES),
                    help="comma-separated, of %s (default all)" % ", ".join(REGIMES))
    ap.add_argument("--iters", type=int, default=200, help="timed iterations per measurement")
    ap.add_argument("--warmup", type=int, default=20, help="untimed iterations first")
    ap.add_argument("--rounds", type=int, default=4,
                    help="the implementations take turns this many times (default 4)")
    ap.add_argument("--classic", action="store_true",
                    help="also time the classic path (Client(path='classic'))")
    ap.add_argument("--cpu", action="store_true",
                    help="smoke mode: CPU tensors on the daemon's CPU backend")
    ap.add_argument("--endpoint", help="use this running daemon instead of starting one")
    ap.add_argument("--build", default=None,
                    help="where rmsnormd is (default $RN_BUILD, else <repo>/build)")
    ap.add_argument("--label", default="", help="free text stored in the JSON (e.g. 'MPS on')")
    a = ap.parse_args(argv)
    for name, allowed in (("modes", MODES), ("regimes", REGIMES)):
        vals = [v for v in getattr(a, name).split(",") if v]
        bad = [v for v in vals if v not in allowed]
        if bad or not vals:
            ap.error("--%s: %s not among %s" % (name, ",".join(bad) or "nothing", ", ".join(allowed)))
        setattr(a, name, vals)
    a.wdtypes = [v for v in a.wdtypes.split(",") if v]
    bad = [v for v in a.wdtypes if v not in ("bf16", "fp16", "fp32", "none")]
    if bad or not a.wdtypes:
        ap.error("--wdtypes: %s not among bf16, fp16, fp32, none" % (",".join(bad) or "nothing"))
    if a.iters < 1 or a.warmup < 0 or a.rounds < 1:
        ap.error("--iters >= 1, --warmup >= 0, --rounds >= 1")
    a.rounds = min(a.rounds, a.iters)
    return a


# ---- the daemon ---------------------------------------------------------------------------

def _die_with_parent():
    # Between fork and exec: a killed benchmark takes its daemon with it.
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class Daemon:
    """One rmsnormd on ipc://<tmp>/d.sock, ready when it said READY=1 on our
    notify socket (as python/tests/conftest.py and gpu_cycle.py start it)."""

    def __init__(self, build, backend, log_path):
        self.build = build
        self.backend = backend
        self.log_path = log_path
        self.dir = tempfile.mkdtemp(prefix="rnbt-", dir="/tmp")
        self.endpoint = "ipc://%s/d.sock" % self.dir
        self.proc = None

    def start(self, timeout=60):
        binary = os.path.join(self.build, "rmsnormd")
        if not os.access(binary, os.X_OK):
            die("no daemon at %s (build it with make, or set RN_BUILD / --build)" % binary)
        notify = os.path.join(self.dir, "notify")
        conf = os.path.join(self.dir, "empty.conf")
        open(conf, "w").close()
        ns = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        ns.bind(notify)
        env = dict(os.environ, NOTIFY_SOCKET=notify)
        env.pop("RMSNORMD_ENDPOINT", None)
        try:
            with open(self.log_path, "ab") as log:
                # RN_TORCH_DAEMON_ARGS: more daemon flags, e.g. "--ring-spin-us 0"
                # for a run without the loop's poll of the rings.
                extra = os.environ.get("RN_TORCH_DAEMON_ARGS", "").split()
                self.proc = subprocess.Popen(
                    [binary, "--backend", self.backend, "--endpoint", self.endpoint, "--config",
                     conf, "--log-level", "info"] + extra,
                    stdout=log, stderr=log, stdin=subprocess.DEVNULL, env=env,
                    preexec_fn=_die_with_parent)
            deadline = time.monotonic() + timeout
            while True:
                left = deadline - time.monotonic()
                if left <= 0 or self.proc.poll() is not None:
                    code = self.proc.poll()
                    self.proc.kill()
                    self.proc.wait()
                    die("rmsnormd (%s backend) not ready within %d s (exit %s); see %s"
                        % (self.backend, timeout, code, self.log_path))
                r, _, _ = select.select([ns], [], [], min(left, 0.2))
                if r and "READY=1" in ns.recv(4096).decode("utf-8", "replace").split("\n"):
                    return self
        finally:
            ns.close()

    def stop(self):
        """SIGTERM; the exit status (-9 when it had to be killed)."""
        code = None
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.send_signal(signal.SIGTERM)
            try:
                code = self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                code = -9
            self.proc = None
        shutil.rmtree(self.dir, ignore_errors=True)
        return code


# ---- timers ---------------------------------------------------------------------------------

class CudaTimer:
    """CUDA events recorded on the current stream, from a pool made before
    the timing (torch creates an event at its first record: that cost must
    not fall inside a timed region); read after a synchronize."""

    def __init__(self, torch):
        self.torch = torch
        self.pool = []

    def events(self, k):
        while len(self.pool) < k:
            e = self.torch.cuda.Event(enable_timing=True)
            e.record()
            self.pool.append(e)
        return self.pool[:k]

    def sync(self):
        self.torch.cuda.synchronize()

    def us(self, a, b):
        return a.elapsed_time(b) * 1000.0


class _HostMark:
    __slots__ = ("t",)

    def record(self):
        self.t = time.perf_counter()


class HostTimer:
    """perf_counter for CPU tensors (everything is synchronous there)."""

    def __init__(self):
        self.pool = []

    def events(self, k):
        while len(self.pool) < k:
            self.pool.append(_HostMark())
        return self.pool[:k]

    def sync(self):
        pass

    def us(self, a, b):
        return (b.t - a.t) * 1e6


# ---- one measurement ---------------------------------------------------------------------------

class Case:
    """One implementation on one (shape, weight dtype): its module, a leaf
    input sharing x's values, and dy in the output's dtype."""

    def __init__(self, name, module, x, dy, client):
        self.name = name
        self.module = module
        self.x = x.detach().clone().requires_grad_(True)
        self.dy_base = dy
        self.dy = None
        self.client = client

    def clear(self):
        self.x.grad = None
        if self.module.weight is not None:
            self.module.weight.grad = None

    def forward(self):
        y = self.module(self.x)
        if self.dy is None or self.dy.dtype != y.dtype:
            self.dy = self.dy_base.to(y.dtype)
        return y

    def check_errors(self):
        # The fast path reports a failed call at the next one, or here.
        if self.client is not None:
            self.client.sync()


def time_loop(case, mode, regime, iters, timer):
    """iters iterations of one mode; returns (per-iteration us, loop us per
    iteration or None).  Nothing but the marks is added inside the timed
    regions: what they hold is what a user's code pays."""
    ev = timer.events(2 * iters + 2)
    stream = regime == "stream"
    if stream:
        timer.sync()
        ev[-2].record()
    for i in range(iters):
        a, b = ev[2 * i], ev[2 * i + 1]
        case.clear()
        if mode == "bwd":
            y = case.forward()
            if not stream:
                timer.sync()
            a.record()
            y.backward(case.dy)
            b.record()
        else:
            if not stream:
                timer.sync()
            a.record()
            y = case.forward()
            if mode == "fwdbwd":
                y.backward(case.dy)
            b.record()
        del y
    if stream:
        ev[-1].record()
    timer.sync()
    spans = [timer.us(ev[2 * i], ev[2 * i + 1]) for i in range(iters)]
    loop = timer.us(ev[-2], ev[-1]) / iters if stream else None
    case.check_errors()
    return spans, loop


def pct(vals, q):
    s = sorted(vals)
    k = min(len(s) - 1, max(0, int(round(q * (len(s) - 1)))))
    return s[k]


# ---- the gradient check ----------------------------------------------------------------------

def grads(case):
    case.clear()
    y = case.forward()
    y.backward(case.dy)
    case.check_errors()
    dw = case.module.weight.grad if case.module.weight is not None else None
    return y.detach(), case.x.grad.detach(), (dw.detach() if dw is not None else None)


PATH_COUNTERS = ("requests.bwd", "fast.slots", "fast.errors")


def settled_counters(client, before, wait_s=3.0):
    """The daemon's counters once the call just made shows in them: a
    fast-path slot is counted when the daemon sees its kernel end, which
    can come a little after the stream saw done."""
    deadline = time.monotonic() + wait_s
    while True:
        after = client.stats().counters
        if any(after.get(k, 0) != before.get(k, 0) for k in PATH_COUNTERS) \
                or time.monotonic() > deadline:
            return after
        time.sleep(0.01)


def rel_err(a, b):
    if a is None and b is None:
        return 0.0
    a, b = a.double(), b.double()
    scale = b.abs().max().item()
    return (a - b).abs().max().item() / (scale if scale > 0 else 1.0)


# tolerance on max|ours - torch's| / max|torch's|: both round to the
# output dtype, and dw sums M rows in different orders.
TOL = {"bf16": 3e-2, "fp16": 5e-3, "fp32": 1e-4}


# ---- main --------------------------------------------------------------------------------------

def main(argv=None):
    a = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        import torch
    except ImportError as e:
        die("needs PyTorch (import torch failed: %s)" % e)
    if not a.cpu and not torch.cuda.is_available():
        die("no CUDA GPU visible to PyTorch (torch.cuda.is_available() is False, torch %s, "
            "CUDA %s): run it on a GPU host, or use --cpu for the smoke mode on the daemon's "
            "CPU backend" % (torch.__version__, torch.version.cuda))
    # libclient's default path is what this measures as "daemon": a path
    # chosen in the environment would change that silently.
    if os.environ.pop("RMSNORMD_PATH", None) is not None:
        print("bench_torch: RMSNORMD_PATH ignored (the 'daemon' rows are libclient's default; "
              "--classic adds the classic path)", flush=True)
    import rmsnormd
    import rmsnormd.torch as rnt

    dtypes = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
    os.makedirs(a.out, exist_ok=True)
    build = os.path.abspath(a.build or os.environ.get("RN_BUILD") or os.path.join(REPO, "build"))
    device = torch.device("cpu") if a.cpu else torch.device("cuda", torch.cuda.current_device())
    backend = "cpu" if a.cpu else "cuda"
    timer = HostTimer() if a.cpu else CudaTimer(torch)
    if a.cpu:
        torch.set_num_threads(1)

    daemon = None
    classic = None
    endpoint = a.endpoint
    if endpoint is None:
        daemon = Daemon(build, backend, os.path.join(a.out, "daemon.log")).start()
        endpoint = daemon.endpoint
    os.environ["RMSNORMD_ENDPOINT"] = endpoint

    rows, checks, failures = [], [], []
    meta = {}
    t_start = time.monotonic()
    try:
        # The "daemon" implementation uses the process's default client, as
        # user code does (rmsnormd.torch.RMSNorm with no client); CPU tensors
        # only go to the daemon with a client given, so --cpu gives one.
        if a.cpu:
            rnt.set_default_client(rmsnormd.Client(endpoint, name="bench_torch"))
        dflt = rnt.default_client()
        classic = rmsnormd.Client(endpoint, name="bench_torch classic",
                                  path="classic") if a.classic else None
        info = dflt.server_info()
        meta = {
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "device": "CPU" if a.cpu else torch.cuda.get_device_name(device),
            "daemon_version": info.daemon_version,
            "daemon_backend": info.backend,
            "daemon_device": info.device_name,
            "mps": info.mps,
            "libclient": rmsnormd.version(),
            "default_path": dflt.path,
            "host": platform.node(),
            "label": a.label,
            "args": {k: v for k, v in vars(a).items() if k != "shapes"},
            "shapes": ["%dx%d" % s for s in a.shapes],
        }
        print("bench_torch: torch %s on %s; rmsnormd %s (%s backend, MPS %s); libclient %s, "
              "default path %s" % (meta["torch"], meta["device"], info.daemon_version, info.backend,
                                   "on" if info.mps else "off", meta["libclient"], dflt.path),
              flush=True)
        xdt = dtypes[a.xdtype]
        # Drawn where they are used (a 65536x4096 draw on the CPU takes seconds).
        gen = torch.Generator(device=device).manual_seed(1234)
        for (m, n) in a.shapes:
            x = (torch.randn(m, n, generator=gen, device=device) * 2 + 0.5).to(xdt)
            dy = torch.randn(m, n, generator=gen, device=device).to(xdt)
            for wname in a.wdtypes:
                w0 = None
                if wname != "none":
                    w0 = (1 + 0.1 * torch.randn(n, generator=gen, device=device)).to(dtypes[wname])
                affine = w0 is not None
                wdt = dtypes[wname] if affine else None
                mods = [("torch", torch.nn.RMSNorm(n, eps=EPS, elementwise_affine=affine,
                                                   device=device, dtype=wdt), None),
                        ("daemon", rnt.RMSNorm(n, eps=EPS, elementwise_affine=affine,
                                               device=device, dtype=wdt,
                                               client=dflt if a.cpu else None), dflt)]
                if classic is not None:
                    mods.append(("classic", rnt.RMSNorm(n, eps=EPS, elementwise_affine=affine,
                                                        device=device, dtype=wdt, client=classic),
                                 classic))
                cases = []
                for name, mod, client in mods:
                    if affine:
                        with torch.no_grad():
                            mod.weight.copy_(w0)
                    cases.append(Case(name, mod, x, dy, client))
                tag = "%dx%d x=%s w=%s" % (m, n, a.xdtype, wname)

                # Gradients first: a path that computes nothing fast must not
                # pass for a fast one.  Then which path the calls took.
                ref = grads(cases[0])
                for c in cases[1:]:
                    before = dflt.stats().counters
                    y, dx, dw = grads(c)
                    after = settled_counters(dflt, before)
                    ey = rel_err(y, ref[0])
                    ex = rel_err(dx, ref[1])
                    ew = rel_err(dw, ref[2]) if affine else 0.0
                    tol = TOL[a.xdtype]
                    ok = ey <= tol and ex <= tol and ew <= max(tol, TOL.get(wname, tol))
                    took = {k: after.get(k, 0) - before.get(k, 0)
                            for k in PATH_COUNTERS}
                    path = ("fast" if took["fast.slots"] > 0 else
                            "classic" if took["requests.bwd"] > 0 else "none")
                    checks.append({"case": tag, "impl": c.name, "err_y": ey, "err_dx": ex,
                                   "err_dw": ew, "tol": tol, "ok": ok, "path_taken": path,
                                   "counters": took})
                    if not ok:
                        failures.append("%s %s: gradients differ from torch's (y %.2e, dx %.2e, "
                                        "dw %.2e > %.0e)" % (tag, c.name, ey, ex, ew, tol))
                    if path == "none":
                        failures.append("%s %s: no call reached the daemon" % (tag, c.name))
                    elif c.name == "classic" and path != "classic":
                        failures.append("%s classic: the calls took the %s path" % (tag, path))
                    elif c.name == "daemon" and not a.cpu and path != "fast":
                        # libclient's default on a CUDA daemon is the fast
                        # path: a silent fallback would measure the wrong one.
                        failures.append("%s daemon: the calls took the %s path, not the fast "
                                        "one (see daemon.log)" % (tag, path))
                    if took["fast.errors"]:
                        failures.append("%s %s: the daemon counted %d fast-path errors"
                                        % (tag, c.name, took["fast.errors"]))
                del ref

                for mode in a.modes:
                    for regime in a.regimes:
                        for c in cases:
                            time_loop(c, mode, regime, max(1, a.warmup), timer)
                        spans = {c.name: [] for c in cases}
                        loops = {c.name: [] for c in cases}
                        per = [a.iters // a.rounds + (1 if r < a.iters % a.rounds else 0)
                               for r in range(a.rounds)]
                        for k in per:
                            for c in cases:
                                s, lp = time_loop(c, mode, regime, k, timer)
                                spans[c.name] += s
                                if lp is not None:
                                    loops[c.name].append((lp, k))
                        base = statistics.median(spans["torch"])
                        for c in cases:
                            s = spans[c.name]
                            med = statistics.median(s)
                            lp = (sum(v * k for v, k in loops[c.name]) / sum(k for _, k in loops[c.name])
                                  if loops[c.name] else None)
                            rows.append({
                                "shape": "%dx%d" % (m, n), "m": m, "n": n, "x_dtype": a.xdtype,
                                "w_dtype": wname, "impl": c.name, "mode": mode, "regime": regime,
                                "iters": len(s), "median_us": round(med, 2),
                                "p10_us": round(pct(s, 0.1), 2), "p90_us": round(pct(s, 0.9), 2),
                                "mean_us": round(statistics.fmean(s), 2),
                                "loop_us": round(lp, 2) if lp is not None else None,
                                "ratio": round(med / base, 3) if base > 0 else None,
                            })
                        print_block(rows[-len(cases):])
                        # A run cut short by a time limit keeps what it measured.
                        write_results(a.out, rows, checks, failures, meta)
                del cases, mods
            # No empty_cache(): the daemon keeps the allocator's segments
            # mapped, and the next shape's reuse them.
            del x, dy
        meta["daemon_counters"] = {k: v for k, v in dflt.stats().counters.items()
                                   if k.startswith(("requests.bwd", "fast.", "errors."))}
    except rmsnormd.RNError as e:
        failures.append("rmsnormd: %s" % e)
    finally:
        # Close the clients before the daemon goes: a clean end of session.
        try:
            rnt.default_client().close()
            if classic is not None:
                classic.close()
        except Exception:
            pass
        if daemon is not None:
            code = daemon.stop()
            if code != 0:
                failures.append("rmsnormd exited with %s after SIGTERM (see %s)"
                                % (code, daemon.log_path))
    meta["wall_s"] = round(time.monotonic() - t_start, 1)
    write_results(a.out, rows, checks, failures, meta)
    print_summary(rows)
    if failures:
        for f in failures:
            print("bench_torch: FAIL: " + f, flush=True)
        return 1
    print("bench_torch: ok (%d measurements, %.0f s)" % (len(rows), meta["wall_s"]), flush=True)
    return 0


FIELDS = ["shape", "m", "n", "x_dtype", "w_dtype", "impl", "mode", "regime", "iters", "median_us",
          "p10_us", "p90_us", "mean_us", "loop_us", "ratio"]


def write_results(out, rows, checks, failures, meta):
    with open(os.path.join(out, "bench_torch.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS)
        w.writeheader()
        for r in rows:
            w.writerow({k: ("" if r[k] is None else r[k]) for k in FIELDS})
    with open(os.path.join(out, "bench_torch.json"), "w") as f:
        json.dump({"meta": meta, "rows": rows, "checks": checks, "failures": failures}, f, indent=1)


def print_block(rows):
    r0 = rows[0]
    cells = []
    for r in rows:
        cell = "%s %.1f" % (r["impl"], r["median_us"])
        if r["loop_us"] is not None:
            cell += " (loop %.1f)" % r["loop_us"]
        if r["impl"] != "torch":
            cell += " %.2fx" % r["ratio"]
        cells.append(cell)
    print("  %-10s w=%-4s %-6s %-6s us: %s" % (r0["shape"], r0["w_dtype"], r0["mode"], r0["regime"],
                                              "; ".join(cells)), flush=True)


def print_summary(rows):
    """impl / torch per (shape, w dtype, mode, regime): the median's ratio,
    and the loop's where there is one."""
    if not rows:
        return
    impls = [i for i in dict.fromkeys(r["impl"] for r in rows) if i != "torch"]
    keys = list(dict.fromkeys((r["shape"], r["w_dtype"], r["mode"], r["regime"]) for r in rows))
    by = {(r["shape"], r["w_dtype"], r["mode"], r["regime"], r["impl"]): r for r in rows}
    head = "| shape | w | mode | regime | torch us |" + "".join(
        " %s us | %s/torch | %s/torch loop |" % (i, i, i) for i in impls)
    print("\n" + head)
    print("|" + "---|" * (5 + 3 * len(impls)))
    for k in keys:
        t = by.get(k + ("torch",))
        if t is None:
            continue
        line = "| %s | %s | %s | %s | %.1f |" % (k[0], k[1], k[2], k[3], t["median_us"])
        for i in impls:
            r = by.get(k + (i,))
            if r is None:
                line += " - | - | - |"
                continue
            lr = ("%.2fx" % (r["loop_us"] / t["loop_us"]) if r["loop_us"] and t["loop_us"]
                  else "-")
            line += " %.1f | %.2fx | %s |" % (r["median_us"], r["ratio"], lr)
        print(line)
    print(flush=True)


if __name__ == "__main__":
    sys.exit(main())
