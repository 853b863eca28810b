#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Issue 14's PyTorch targets in one command on a GPU host with PyTorch, run
# from the repository root:
#   1. under MPS (a control daemon of our own, pipe and log under /tmp):
#      bench/bench_torch.py (autograd fwd / bwd / fwd+bwd of torch.nn.RMSNorm
#      against rmsnormd.torch.RMSNorm on libclient's default path and on the
#      classic path, 4096x1024, 16384x4096, 65536x4096, bf16 activations,
#      bf16 and fp32 weights), then the 4-worker training demo
#      (python/examples/gpu_cycle.py: train_mp.py with the daemon and
#      with torch.nn.RMSNorm, two pairs in ABBA order, compare_runs.py);
#   2. MPS stopped: the same again (without the classic path).
# Each step has a time limit (bench 100 s, training demo 420 s: its four runs
# and the side-by-side one start four PyTorch workers each, about 50 s a run
# under MPS on an H200, the side-by-side one about 75 s).
# The whole takes more than a device command's 10 minutes: RN_TORCH_ONLY=bench
# or RN_TORCH_ONLY=train runs one part (and RN_NO_MPS=1 / RN_ONLY_MPS=1 one half).  Writes at most 8 files to OUT:
#   summary.txt   what is printed at the end: step time ratio daemon/torch
#                 per training run, autograd ratios per shape
#   results.json  the same numbers, and the bench rows of both runs
#   bench_mps.csv, bench_nomps.csv   bench_torch.py's rows
#   run.log       every step's output
#   raw.tar.gz    the rest: bench JSON, daemon logs, the training runs' JSON
#                 files and compare_runs.py's tables
# Exit status 0 when every step ran and passed its checks (the targets are
# reported, not judged).
#
# Usage: bench/run_torch.sh BUILD OUT
#   BUILD: a build directory or a pack of one (tests/gpu/pack_build.sh):
#   rmsnormd and librmsnorm_client.so.0 are taken from it.
# Environment: LD_LIBRARY_PATH for the runtime libraries a bare host lacks
# (libuv, libnanomsg, libmsgpackc); RN_TORCH_QUICK=1 shortens every step
# (a smoke run); RN_TORCH_DAEMON_ARGS adds flags to bench_torch.py's daemon (e.g. "--ring-spin-us
# 0"); RN_NO_MPS=1 skips the MPS half; RN_TORCH_CPU=1 runs it all
# on the daemon's CPU backend with tiny shapes (the script's own test, on a
# host without a GPU).
set -u
build=${1:?usage: run_torch.sh BUILD OUT}
out=${2:?usage: run_torch.sh BUILD OUT}
here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here" || exit 2
case $build in /*) ;; *) build="$here/$build" ;; esac
mkdir -p "$out" || exit 2
out=$(cd "$out" && pwd)
work=$(mktemp -d /tmp/rn-torchbench.XXXXXX)
log="$out/run.log"
: >"$log"
export RN_BUILD="$build"
export RMSNORMD_LIBCLIENT="$build/librmsnorm_client.so.0"
export PYTHONPATH="$here/python${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
# As gpu_run.sh: runtime libraries a bare host lacks may sit in .gpu-libs/.
export LD_LIBRARY_PATH="$here/.gpu-libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export CUBLAS_WORKSPACE_CONFIG=:4096:8
unset RMSNORMD_PATH RMSNORMD_ENDPOINT
status=0
say() { echo "$*" | tee -a "$log"; }

if [ ! -x "$build/rmsnormd" ] || [ ! -e "$RMSNORMD_LIBCLIENT" ]; then
    say "run_torch: no rmsnormd or librmsnorm_client.so.0 in $build"
    exit 2
fi

# Step sizes: the bench's iterations and the training run's steps (20 of
# them are warm-up, left out of the medians).
iters=150 rounds=3 steps=${RN_TORCH_STEPS:-200}
bench_limit=100 train_limit=${RN_TORCH_TRAIN_LIMIT:-420}
bench_extra=() train_extra=()
if [ "${RN_TORCH_QUICK:-0}" = 1 ]; then
    iters=20 rounds=2 steps=40 bench_limit=60 train_limit=60
fi
if [ "${RN_TORCH_CPU:-0}" = 1 ]; then
    # The script itself on a host without a GPU: the daemon's CPU backend,
    # tiny shapes and a tiny model (MPS is still tried where it exists).
    iters=10 rounds=2 steps=25 bench_limit=120 train_limit=300
    bench_extra=(--cpu --shapes 64x128,32x256)
    train_extra=(--dim 32 --layers 1 --heads 2 --batch 2 --seq 16 --vocab 64)
    export RN_CYCLE_BACKEND=cpu
fi

{
    echo "== $(date -u +%FT%TZ) commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
    nvidia-smi -L 2>&1
    python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name(0))' 2>&1
} >>"$log"

mps_dir=/tmp/rn-mps-torchbench
mps_up=0
mps_start() {
    command -v nvidia-cuda-mps-control >/dev/null || { say "== no nvidia-cuda-mps-control"; return 1; }
    export CUDA_MPS_PIPE_DIRECTORY=$mps_dir/pipe CUDA_MPS_LOG_DIRECTORY=$mps_dir/log
    mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
    if nvidia-cuda-mps-control -d >>"$log" 2>&1; then
        mps_up=1
        return 0
    fi
    unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
    return 1
}
mps_stop() {
    [ $mps_up = 1 ] || return 0
    echo quit | nvidia-cuda-mps-control >>"$log" 2>&1
    # The server leaves once its clients have; give it a moment.
    for _ in 1 2 3 4 5 6 7 8 9 10; do
        pgrep -u "$(id -u)" -x nvidia-cuda-mps-server >/dev/null 2>&1 || break
        sleep 0.5
    done
    mps_up=0
    unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
}
trap 'mps_stop' EXIT

# One half: bench_torch.py, then the training demo.  $1: mps or nomps.
half() {
    local tag=$1 state=$2; shift 2
    local t0=$SECONDS
    if [ "${RN_TORCH_ONLY:-}" != train ]; then
        say "== $tag: bench_torch.py ($state)"
        timeout -k 5 "$bench_limit" python3 bench/bench_torch.py "$work/bench_$tag" --iters "$iters" \
            --rounds "$rounds" --label "MPS $state" ${bench_extra[@]+"${bench_extra[@]}"} "$@" \
            >>"$log" 2>&1 || {
            say "   bench_torch.py: exit $? (see run.log)"
            status=1
        }
        say "   $((SECONDS - t0)) s"
    fi
    [ "${RN_TORCH_ONLY:-}" = bench ] && return 0
    say "== $tag: training demo, 4 workers x $steps steps ($state)"
    t0=$SECONDS
    RN_MPS_STATE=$state timeout -k 5 "$train_limit" python3 python/examples/gpu_cycle.py \
        "$work/train_$tag" --workers 4 --steps "$steps" ${train_extra[@]+"${train_extra[@]}"} \
        >>"$log" 2>&1 || {
        say "   gpu_cycle.py: exit $? (see run.log)"
        status=1
    }
    say "   $((SECONDS - t0)) s"
}

if [ "${RN_NO_MPS:-0}" != 1 ] && mps_start; then
    half mps on --classic
    mps_stop
elif [ "${RN_NO_MPS:-0}" = 1 ]; then
    say "== MPS half skipped (RN_NO_MPS=1)"
else
    say "== MPS half skipped: MPS could not start"
    status=1
fi
[ "${RN_ONLY_MPS:-0}" = 1 ] || half nomps off

python3 bench/torch_summary.py "$work" "$out/results.json" >"$out/summary.txt" 2>>"$log" || status=1
for t in mps nomps; do
    [ -f "$work/bench_$t/bench_torch.csv" ] && cp "$work/bench_$t/bench_torch.csv" "$out/bench_$t.csv"
done
(cd "$work" && tar czf "$out/raw.tar.gz" --exclude='*.csv' . 2>>"$log") || true
rm -rf "$work"
cat "$out/summary.txt"
echo "== run_torch: $([ $status = 0 ] && echo PASS || echo FAIL) (files in $out)" | tee -a "$log"
exit $status
