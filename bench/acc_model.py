#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""A model, on the CPU, of the ring kernel's dx arithmetic at M x 256 (bf16
x, dy and dx, rstd given; 32 lanes of 8 columns a row): the worst dx element
in bf16 ulps against fp64, and the fraction beyond one ulp, for several
ways of forming the row sum, over several seeds of fresh random inputs.

  bench/acc_model.py [--seeds K] [--m M] [--w f32|bf16]
  bench/acc_model.py --write DIR [--seed S]

With --write it only draws seed S's inputs the same way and writes them
where bench_kernel --accuracy DIR reads them (4096 x 256, 1024, 4096 and
8192, both weights, each drawn afresh from seed S: 4096 x 256's are the
model's; the files kernel_torch.py --accuracy writes), so that the kernel
itself is measured on the model's seeds.

Inputs are drawn as bench/kernel_torch.py --accuracy draws them (x and dy
standard normal, w = 1 + 0.3 * normal, all rounded to bf16 or w kept in
fp32), with numpy's generator, so the seeds are not kernel_torch.py's.
Row-sum forms of x * g, g = dy * w rounded to fp32 in each:
  base    an fp32 chain of eight fused multiply-adds a lane (x * g not
          rounded on its own), then the fixed butterfly over the warp in
          fp32 (production);
  tree64  the same chain, the butterfly in fp64;
  f64     each product x * g rounded to fp32, widened and added in fp64,
          the butterfly in fp64
          (the kernel's RNK_ROW_F64 = 1);
  ts64    the products added in fp32 with an error term (TwoSum), the sum
          and its error widened once, the butterfly in fp64.
The element step is the kernel's for each: xh = x * rstd, then
dx = rstd * (g - xh * c) with the product fused, rounded to bf16.  numpy
needs a few seconds a seed at M = 4096.
"""
import argparse
import os

import numpy as np

F32, F64 = np.float32, np.float64
LANES, N = 32, 256


def to_bf16(a):
    """Round fp32 to bf16 (nearest, ties to even), returned as fp32."""
    u = np.asarray(a, dtype=F32).view(np.uint32).astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
    return r.astype(np.uint32).view(F32)


def fma32(a, b, c):
    """a * b + c rounded once to fp32 (the product is exact in fp64)."""
    return (a.astype(F64) * b.astype(F64) + c.astype(F64)).astype(F32)


def butterfly(s, dt):
    """The warp's xor-shuffle tree (offsets 16 .. 1), every add in dt."""
    s = s.astype(dt)
    for o in (16, 8, 4, 2, 1):
        s = (s + s[:, np.arange(LANES) ^ o]).astype(dt)
    return s[:, 0]


def row_sums(xs, gs):
    """The row sum of x * g in each form: {name: fp64 array of M}."""
    m, _, v = xs.shape
    chain = np.zeros((m, LANES), F32)
    wide = np.zeros((m, LANES), F64)
    ts, te = np.zeros((m, LANES), F32), np.zeros((m, LANES), F32)
    for e in range(v):
        chain = fma32(xs[:, :, e], gs[:, :, e], chain)
        t = (xs[:, :, e] * gs[:, :, e]).astype(F32)
        wide = wide + t.astype(F64)
        s = (ts + t).astype(F32)
        bp = (s - ts).astype(F32)
        err = (ts - (s - bp).astype(F32)).astype(F32) + (t - bp).astype(F32)
        te = (te + err.astype(F32)).astype(F32)
        ts = s
    return {
        "base": butterfly(chain, F32).astype(F64),
        "tree64": butterfly(chain, F64),
        "f64": butterfly(wide, F64),
        "ts64": butterfly(ts.astype(F64) + te.astype(F64), F64),
    }


def draw(rng, m, n, wname):
    """x, dy (bf16 values), w and the fp32 rstd of x, as fp32 arrays."""
    x = to_bf16(rng.standard_normal((m, n)).astype(F32))
    dy = to_bf16(rng.standard_normal((m, n)).astype(F32))
    w = (1.0 + 0.3 * rng.standard_normal(n)).astype(F32)
    if wname == "bf16":
        w = to_bf16(w)
    rstd = (1.0 / np.sqrt((x.astype(F64) ** 2).mean(1) + 1e-5)).astype(F32)
    return x, dy, w, rstd


def write_inputs(outdir, seed):
    """bench_kernel --accuracy's inputs (acc_M_N_W.{x,dy,w,rstd}) for one seed."""
    os.makedirs(outdir, exist_ok=True)
    for wname in ("f32", "bf16"):
        for n in (256, 1024, 4096, 8192):
            x, dy, w, rstd = draw(np.random.default_rng(seed), 4096, n, wname)
            base = os.path.join(outdir, f"acc_4096_{n}_{wname}")
            (x.view(np.uint32) >> 16).astype(np.uint16).tofile(base + ".x")
            (dy.view(np.uint32) >> 16).astype(np.uint16).tofile(base + ".dy")
            w.tofile(base + ".w")
            rstd.tofile(base + ".rstd")


def one_seed(seed, m, wname):
    x, dy, w, rstd = draw(np.random.default_rng(seed), m, N, wname)
    r64 = rstd.astype(F64)[:, None]
    xh64 = x.astype(F64) * r64
    g64 = dy.astype(F64) * w.astype(F64)
    ref = r64 * (g64 - xh64 * (xh64 * g64).mean(1, keepdims=True))
    ulp = 2.0 ** (np.floor(np.log2(np.maximum(np.abs(ref), 2.0 ** -126))) - 7)
    g = (dy * w).astype(F32)
    xh = (x * rstd[:, None]).astype(F32)
    v = N // LANES
    out = {}
    for name, s in row_sums(x.reshape(m, LANES, v), g.reshape(m, LANES, v)).items():
        if name == "base":
            c = (rstd * (s.astype(F32) * F32(1.0 / N)).astype(F32)).astype(F32)
        else:
            c = (rstd.astype(F64) * (s * (1.0 / N))).astype(F32)
        t = fma32(-xh, np.broadcast_to(c[:, None], xh.shape), g)
        dx = to_bf16((rstd[:, None] * t).astype(F32)).astype(F64)
        err = np.abs(dx - ref) / ulp
        out[name] = (err.max(), (err > 1).mean())
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=8)
    ap.add_argument("--m", type=int, default=4096)
    ap.add_argument("--w", choices=("f32", "bf16"), default="bf16")
    ap.add_argument("--write", metavar="DIR")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    if a.write:
        write_inputs(a.write, a.seed)
        return
    names = ("base", "tree64", "f64", "ts64")
    print(f"{a.m}x{N}, {a.w} weight: worst dx element, bf16 ulps against fp64 "
          "(fraction beyond 1 ulp)")
    print("seed " + " ".join(f"{n:>18}" for n in names))
    for seed in range(a.seeds):
        o = one_seed(seed, a.m, a.w)
        print(f"{seed:4d} " + " ".join(f"{o[n][0]:9.3f} ({o[n][1]:.1e})" for n in names))


if __name__ == "__main__":
    main()
