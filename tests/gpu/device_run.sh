#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The whole GPU check of the kernel in one go, on a GPU host: the full GPU
# test program, compute-sanitizer memcheck and racecheck on a quick subset,
# and the no-deadlock and correctness subset under MPS with 25 % of the SMs.
# Build where nvcc is (make BUILD=... ), then run from the repository root:
#   tests/gpu/device_run.sh BUILD_DIR OUT_DIR
# Logs go to OUT_DIR; the last lines summarise each step.
set -u
build=${1:?usage: device_run.sh BUILD_DIR OUT_DIR}
out=${2:?usage: device_run.sh BUILD_DIR OUT_DIR}
mkdir -p "$out"
export RN_BUILD=$(realpath "$build")
t=$build/tests/gpu/test_kernel_gpu
summary=()
step() { # step NAME LOG COMMAND...: run, keep the log, note pass or fail
    local name=$1 log=$2; shift 2
    local t0=$SECONDS
    "$@" >"$out/$log" 2>&1
    local rc=$?
    local res; res=$(grep -E '^\[  (PASSED|FAILED)  \]|ERROR SUMMARY|RACECHECK SUMMARY' "$out/$log" | tr '\n' ' ')
    summary+=("$(printf '%-26s rc=%-3s %4ss  %s' "$name" "$rc" $((SECONDS - t0)) "$res")")
}

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.used --format=csv >"$out/gpu.txt" 2>&1
"$build/tests/gpu/prog_probe" | tee -a "$out/gpu.txt"

step "gpu tests (full)" full.log timeout 240 "$t"

# compute-sanitizer slows kernels a hundredfold: the quick subset, minus the
# timing-based no-deadlock tests.  RNK_RACECHECK=1 keeps racecheck's count of
# barriers even (bwd_kernel.cuh: else it reports races that are none).
export RNK_GPU_QUICK=1
step "memcheck (quick)" memcheck.log timeout 120 compute-sanitizer --tool memcheck --error-exitcode 9 \
    env RNK_GPU_TESTS='ref64,bad_args,m_zero,dtype,strides,no_weight,repeat,grid_invariance,'\
'graph,back_to_back,cancel,done_words,test_grid' "$t"
step "racecheck (quick)" racecheck.log timeout 90 env RNK_RACECHECK=1 compute-sanitizer --tool racecheck --error-exitcode 9 \
    env RNK_GPU_TESTS='graph,m_zero' "$t"

# MPS, 25 % of the SMs per client: the automatic grid (sized for all SMs)
# must still finish, beside another MPS client holding its share.
export CUDA_MPS_PIPE_DIRECTORY=/tmp/rnk-mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/rnk-mps-log
mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
if nvidia-cuda-mps-control -d; then
    export CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25
    step "MPS 25% no deadlock" mps.log timeout 60 \
        env RNK_GPU_TESTS='no_deadlock_process,repeat,grid_invariance,graph,back_to_back,'\
'done_words' "$t"
    unset CUDA_MPS_ACTIVE_THREAD_PERCENTAGE
    echo quit | nvidia-cuda-mps-control
    cp "$CUDA_MPS_LOG_DIRECTORY"/control.log "$out/mps-control.log" 2>/dev/null
else
    summary+=("MPS: nvidia-cuda-mps-control -d failed")
fi
printf '%s\n' "${summary[@]}" | tee "$out/summary.txt"
tail -n 25 "$out/full.log"
