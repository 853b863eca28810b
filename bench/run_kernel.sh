#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The kernel benchmark, whole, on a GPU host: PyTorch's and Quack's numbers
# (and dx accuracy on shared inputs), then ours (which merges them), then the
# plot.  Build first, where nvcc is, with the benchmark-only variants compiled in:
#   make BUILD=build/bench NVCCFLAGS=-DRNK_BENCH_VARIANTS=1 build/bench/bench/bench_kernel
# Quack is measured when `import quack` works (/work/shared/tools/quack-wheels.sh
# says how to bring it to a host without package access).
# Usage: bench/run_kernel.sh BUILD_DIR OUT_DIR [--quick]
# Writes OUT_DIR/torch.csv, kernel.csv, kernel.json, kernel.png, bench.log (with the
# GPU's clocks before and after) and
# OUT_DIR/acc/acc_torch.csv, acc_ours.csv (the inputs they share stay in OUT_DIR/acc).
set -euo pipefail
build=${1:?usage: run_kernel.sh BUILD_DIR OUT_DIR [--quick]}
out=${2:?usage: run_kernel.sh BUILD_DIR OUT_DIR [--quick]}
quick=${3:-}
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out/acc"
export PYTHONUNBUFFERED=1
# PyTorch and Quack first; a failure or a time limit (TORCH_TIMEOUT, default
# 420 s) leaves the rows finished, and our own numbers are measured regardless.
timeout "${TORCH_TIMEOUT:-420}" python3 "$here/kernel_torch.py" "$out/torch.csv" $quick \
    --accuracy "$out/acc" >"$out/torch.log" 2>&1 || echo "kernel_torch.py: exit $? (see $out/torch.log)"
tail -n 2 "$out/torch.log"
"$build/bench/bench_kernel" --accuracy "$out/acc" 2>&1 | tee "$out/accuracy.log" || true
# The clocks and power before and after ours (two H100s of the same kind
# have run ours up to 6 % apart at N = 4096-8192 while Quack's times agreed).
clocks() {
    nvidia-smi --query-gpu=clocks.sm,clocks.max.sm,clocks.mem,power.draw,power.limit,temperature.gpu \
        --format=csv,noheader 2>/dev/null | sed "s/^/gpu clocks $1: /" || true
}
clocks before | tee "$out/bench.log"
"$build/bench/bench_kernel" --out "$out" --torch "$out/torch.csv" $quick 2>&1 | tee -a "$out/bench.log"
clocks after | tee -a "$out/bench.log"
python3 "$here/plot_kernel.py" "$out/kernel.json" "$out/kernel.png"
