#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The whole GPU cycle of the Python binding in one command, on a GPU host
# with PyTorch (run from the repository root):
#   1. start an MPS control daemon (unless RN_NO_MPS=1), so the daemon and
#      the workers share the GPU without context switches;
#   2. pytest python/tests: the CPU-backend tests, test_torch_cuda.py
#      (gradients against torch.autograd of F.rms_norm over shapes x dtypes)
#      and test_torch_vmm.py (expandable segments; about 110 s on an H200),
#      within RN_PYTEST_TIMEOUT seconds (default 400);
#   3. gpu_cycle.py: one CUDA rmsnormd, train_mp.py with 4 workers four
#      times (daemon twice, torch.nn.RMSNorm twice), compare_runs.py, then
#      once with both models in each worker side by side (RN_CYCLE_BOTH=0:
#      not), within RN_TRAIN_TIMEOUT seconds (default 330).
# Everything it writes goes to $OUT (default /tmp/rn-gpu-out): pytest.log,
# pytest-daemon.log, cycle.log, daemon.log, summary.md and runs.tar.gz (the
# runs' JSON files: daemon1, daemon2, torch, torch2, both).
#
# Usage: python/examples/gpu_run.sh [BUILD_DIR] [train_mp.py options...]
#   BUILD_DIR: where make put rmsnormd and libclient (default build); the
#   shared libraries a bare GPU host lacks (libuv, libnanomsg, libmsgpackc)
#   are looked for in .gpu-libs/ as well.
set -u
here=$(cd "$(dirname "$0")/../.." && pwd)
cd "$here" || exit 2
build=${1:-build}; shift || true
OUT=${OUT:-/tmp/rn-gpu-out}
mkdir -p "$OUT"
export RN_BUILD="$here/$build"
export RMSNORMD_LIBCLIENT="$RN_BUILD/librmsnorm_client.so.0"
export LD_LIBRARY_PATH="$here/.gpu-libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PYTHONPATH="$here/python"
export PYTHONUNBUFFERED=1
export CUBLAS_WORKSPACE_CONFIG=:4096:8
# PYTORCH_CUDA_ALLOC_CONF is left as the caller set it: memory from
# PyTorch's expandable segments is shared with the daemon by descriptor
# (test_torch_vmm.py compares runs with and without them).
status=0

{
    echo "== $(date -u +%FT%TZ) commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
    nvidia-smi -L 2>&1
    python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name(0))' 2>&1
} >"$OUT/cycle.log"

mps=0
if [ "${RN_NO_MPS:-0}" != 1 ] && command -v nvidia-cuda-mps-control >/dev/null; then
    export CUDA_MPS_PIPE_DIRECTORY=/tmp/rn-mps/pipe CUDA_MPS_LOG_DIRECTORY=/tmp/rn-mps/log
    mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
    if nvidia-cuda-mps-control -d >>"$OUT/cycle.log" 2>&1; then
        mps=1
        trap 'echo quit | nvidia-cuda-mps-control >/dev/null 2>&1' EXIT
    fi
fi
echo "== MPS: $([ $mps = 1 ] && echo on || echo off)" | tee -a "$OUT/cycle.log"

echo "== pytest python/tests" | tee -a "$OUT/cycle.log"
RN_LOG_DIR="$OUT" timeout -k 5 "${RN_PYTEST_TIMEOUT:-400}" python3 -m pytest -q --maxfail=5 --no-header \
    python/tests >"$OUT/pytest.log" 2>&1 || status=1
tail -n 15 "$OUT/pytest.log" | tee -a "$OUT/cycle.log"

echo "== training cycle" | tee -a "$OUT/cycle.log"
RN_MPS_STATE=$([ $mps = 1 ] && echo on || echo off) \
    timeout -k 5 "${RN_TRAIN_TIMEOUT:-330}" python3 python/examples/gpu_cycle.py "$OUT" "$@" \
    >>"$OUT/cycle.log" 2>&1 || status=1
tail -n 40 "$OUT/cycle.log"
# Few files come back from a remote run: the runs' JSON files travel as one.
(cd "$OUT" && ls ./*.json >/dev/null 2>&1 && tar czf runs.tar.gz ./*.json && rm -f ./*.json)
echo "== gpu_run: $([ $status = 0 ] && echo PASS || echo FAIL)" | tee -a "$OUT/cycle.log"
exit $status
