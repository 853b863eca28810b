#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Draw bench_kernel's JSON: effective bandwidth per shape and variant.

Usage: plot_kernel.py kernel.json out.png
One panel per weight dtype; shapes on the x axis (M x N), one line per
variant (fused, separate, atomic, torch eager, torch.compile), and the
measured copy bandwidth (the limit) and 90 % of it as horizontal lines.
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    data = json.load(open(sys.argv[1]))
    rows = data["rows"]
    copy = data["copy_tbps"]
    fig, axes = plt.subplots(2, 1, figsize=(14, 9), sharey=True)
    series = [("fused_us", "fused (deterministic)", "-o"), ("separate_us", "separate (2 kernels)", "-s"),
              ("atomic_us", "atomic (non-deterministic)", "-^"),
              ("torch_eager_us", "PyTorch eager", "--x"), ("torch_compile_us", "torch.compile", "--+"),
              ("torch_compile_det_us", "torch.compile, deterministic", ":+"),
              ("quack_us", "Quack rmsnorm_bwd", "-D")]
    for ax, w in zip(axes, ("f32", "bf16")):
        rs = [r for r in rows if r["w"] == w]
        rs.sort(key=lambda r: (r["n"], r["m"]))
        labels = [f'{r["m"] // 1024}K x {r["n"]}' for r in rs]
        xs = range(len(rs))
        for key, name, style in series:
            ys = [r["bytes"] / (r[key] * 1e-6) / 1e12 if r.get(key, 0) > 0 else float("nan") for r in rs]
            ax.plot(xs, ys, style, label=name, markersize=4)
        ax.axhline(copy, color="k", linewidth=0.8, label=f"D2D copy {copy:.2f} TB/s")
        ax.axhline(0.9 * copy, color="k", linewidth=0.8, linestyle=":", label="90 % of copy")
        ax.set_xticks(list(xs))
        ax.set_xticklabels(labels, rotation=70, fontsize=7)
        ax.set_ylabel("effective TB/s")
        ax.set_title(f'RMSNorm backward, bf16 x/dy/dx, {w} weight and dw ({data["gpu"]}, {data["date"]})')
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(sys.argv[2], dpi=110)


if __name__ == "__main__":
    main()
