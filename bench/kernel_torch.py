#!/usr/bin/env python3
"""PyTorch's side of the kernel benchmark (bench/bench_kernel.c reads its CSV).

For the same grid (M in 4096..65536, N in 256..8192, bf16 x/dy/dx, an fp32
or a bf16 weight, rstd given where the formula needs it) it times, with CUDA
events, the median of many calls over input sets rotated so that L2 cannot
serve them:
  eager    torch.autograd.grad of F.rms_norm (PyTorch's own backward)
  compile  torch.compile of the backward formula (fp32 math, dx in bf16, dw in
           the weight's dtype), M marked dynamic so each N compiles once.
Writes m,n,w,eager_us,compile_us lines.  Usage: kernel_torch.py OUT.csv [--quick]
"""
import math
import statistics
import sys
import time

import torch
import torch.nn.functional as F

EPS = 1e-5


def bwd_formula(x, dy, w, rstd):
    xf = x.float()
    dyf = dy.float()
    xhat = xf * rstd.unsqueeze(1)
    g = dyf * w.float()
    c = (xhat * g).mean(dim=1, keepdim=True)
    dx = rstd.unsqueeze(1) * (g - xhat * c)
    dw = (dyf * xhat).sum(dim=0)
    return dx.to(x.dtype), dw.to(w.dtype)


compiled = torch.compile(bwd_formula)


def time_calls(fn, sets, reps):
    for i in range(3):
        fn(*sets[i % len(sets)])
    torch.cuda.synchronize()
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(reps + 1)]
    # queue behind a short sleep so the host's call rate does not show
    torch.cuda._sleep(2_000_000)
    ev[0].record()
    for i in range(reps):
        fn(*sets[i % len(sets)])
        ev[i + 1].record()
    torch.cuda.synchronize()
    return statistics.median(ev[i].elapsed_time(ev[i + 1]) * 1e3 for i in range(reps))


def main():
    out = sys.argv[1]
    quick = "--quick" in sys.argv
    dev = torch.device("cuda")
    ms = [4096, 8192, 16384, 32768, 65536]
    ns = [256, 512, 1024, 2048, 4096, 8192]
    t0 = time.time()
    f = open(out, "w")  # written row by row: a cut-short run still leaves its rows
    f.write("m,n,w,eager_us,compile_us\n")
    for wname, wdt in (("f32", torch.float32), ("bf16", torch.bfloat16)):
        for i, m in enumerate(ms):
            for j, n in enumerate(ns):
                if quick and (i % 2 or j % 2):
                    continue
                setb = 3 * m * n * 2
                nsets = max(2, min(64, math.ceil(240e6 / setb)))
                w = (1.0 + 0.3 * torch.randn(n, device=dev)).to(wdt)
                eager_sets, comp_sets = [], []
                for s in range(nsets):
                    x = torch.randn(m, n, device=dev, dtype=torch.bfloat16)
                    dy = torch.randn(m, n, device=dev, dtype=torch.bfloat16)
                    xr = x.detach().requires_grad_(True)
                    wr = w.detach().requires_grad_(True)
                    y = F.rms_norm(xr, (n,), wr, EPS)
                    eager_sets.append((y, xr, wr, dy))
                    rstd = torch.rsqrt(x.float().pow(2).mean(dim=1) + EPS)
                    torch._dynamo.mark_dynamic(x, 0)
                    torch._dynamo.mark_dynamic(dy, 0)
                    torch._dynamo.mark_dynamic(rstd, 0)
                    comp_sets.append((x, dy, w, rstd))

                def eager(y, xr, wr, dy):
                    return torch.autograd.grad(y, (xr, wr), dy, retain_graph=True)

                reps = 40
                e_us = time_calls(eager, eager_sets, reps)
                c_us = time_calls(compiled, comp_sets, reps)
                f.write(f"{m},{n},{wname},{e_us:.3f},{c_us:.3f}\n")
                f.flush()
                print(f"torch {m:6d} x {n:5d} w={wname:4s}: eager {e_us:9.2f} us, "
                      f"compile {c_us:9.2f} us  ({time.time() - t0:.0f} s)", flush=True)
                del eager_sets, comp_sets
                torch.cuda.empty_cache()
    f.close()


if __name__ == "__main__":
    main()
