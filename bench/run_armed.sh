#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The daemon's armed mode (--ring-ready=armed, daemon/ring_arm.c) on a GPU
# host, in one command of about 6 minutes, run from the repository root:
#   1. checks: test_kernel_gpu's gate, done-word and cancel tests (under
#      compute-sanitizer when it is there); test_fastpath_cuda, test_isolation
#      and test_fastpath (the CPU suites run against this daemon too) with
#      RN_DAEMON_ARGS=--ring-ready=armed, under MPS;
#   2. under MPS, the GPU time added per call (bench_e2e_cuda --fast-only --ks
#      0) with the three ready modes taking turns, two rounds: gpu, host,
#      armed, armed, host, gpu;
#   3. under MPS, K = 1, 2, 4, 8 clients (--tput-only) for host, armed and
#      armed with RMSNORMD_DEBUG_ARM_POLICY=free:
#      what revocations cost when clients share the daemon (the daemon at
#      --log-level=debug logs each revocation).
# Writes to OUT: summary.txt (each step's result), added.md (step 2's tables
# one after another), tput.md, logs.tgz (everything else).
# Usage: bench/run_armed.sh BUILD OUT   (BUILD: a build or a pack of one,
# tests/gpu/pack_build.sh); LD_LIBRARY_PATH for the runtime libraries.
set -u
build=${1:?usage: run_armed.sh BUILD OUT}
out=${2:?usage: run_armed.sh BUILD OUT}
here=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "$build" && pwd) # (the tests run rmsnormctl from $RN_BUILD, elsewhere)
mkdir -p "$out/l"
summary=()
out_final=$out
out=$out/l
# shellcheck source=tests/gpu/run_lib.sh
. "$here/tests/gpu/run_lib.sh"
export RN_BUILD=$build RN_SRC=$here CUDA_MODULE_LOADING=EAGER

san=()
command -v compute-sanitizer >/dev/null && san=(compute-sanitizer --error-exitcode 9)
RNK_GPU_TESTS=gate,done_words,cancel step "kernel gate (sanitizer)" kernel.log \
    timeout 300 "${san[@]}" "$build/tests/gpu/test_kernel_gpu"

mps_start armed
export RN_DAEMON_ARGS=--ring-ready=armed
step "fastpath_cuda armed (MPS)" fastpath_cuda.log timeout 240 "$build/tests/gpu/test_fastpath_cuda"
step "isolation armed (MPS)" isolation.log timeout 120 "$build/tests/integration/test_isolation"
step "fastpath (cpu suite) armed" fastpath.log timeout 200 "$build/tests/integration/test_fastpath"
unset RN_DAEMON_ARGS

for mode in gpu host armed armed host gpu; do
    step "added $mode" "added-$mode-$SECONDS.log" timeout 120 \
        "$build/bench/bench_e2e_cuda" --daemon "$build/rmsnormd" --label "MPS $mode" \
        --fast-only --ks 0 --iters 300 --daemon-arg "--ring-ready=$mode" \
        --out "$out/added-$mode-$SECONDS.md"
done
# (armed-free: RMSNORMD_DEBUG_ARM_POLICY=free, rings arm whatever else is
# in flight and other rings' calls take nothing back)
for mode in host armed armed-free; do
    RMSNORMD_DEBUG_ARM_POLICY=$([ "$mode" = armed-free ] && echo free || echo alone) \
        step "tput $mode" "tput-$mode.log" timeout 150 \
        "$build/bench/bench_e2e_cuda" --daemon "$build/rmsnormd" --label "MPS $mode" \
        --fast-only --tput-only --iters 300 --daemon-arg "--ring-ready=${mode%-free}" \
        --daemon-arg "--log-level=debug" --out "$out/tput-$mode.md"
done
mps_stop armed

cat "$out"/added-*.md >"$out_final/added.md" 2>/dev/null
cat "$out"/tput-*.md >"$out_final/tput.md" 2>/dev/null
printf '%s\n' "${summary[@]}" | tee "$out_final/summary.txt"
[ -d "$out" ] && tar -czf "$out_final/logs.tgz" -C "$out_final" l && rm -rf "$out"
