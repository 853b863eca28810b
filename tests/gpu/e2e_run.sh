#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The daemon's whole GPU check in one go, on a GPU host: test_e2e_cuda without
# and with MPS, and bench_e2e_cuda under MPS, optionally next to other builds
# (the "before" of a change: the daemons run back to back in the same MPS
# session, each with its own benchmark program, so their ratios compare).
# Build where nvcc is, pack with tests/gpu/pack_build.sh (another build needs
# only rmsnormd and bench/bench_e2e_cuda), then from the repository root:
#   tests/gpu/e2e_run.sh BUILD OUT [OTHER_BUILD...]
# Environment: E2E_STEPS (default "tests bench"; add "fast" for the fast
# path's tests and its benchmark beside the classic path, "hostword" for the
# fast path's tests with the done word in host memory), E2E_ITERS (default 300),
# E2E_ROUNDS (default 1; more runs every build's benchmark that many times,
# alternating the order, and prints the medians side by side: compare.txt).
# Logs and the benchmark tables go to OUT; the last lines summarise each step.
set -u
build=${1:?usage: e2e_run.sh BUILD OUT [OTHER_BUILD...]}
out=${2:?usage: e2e_run.sh BUILD OUT [OTHER_BUILD...]}
shift 2
others=("$@")
steps=${E2E_STEPS:-tests bench}
iters=${E2E_ITERS:-300}
rounds=${E2E_ROUNDS:-1}
mkdir -p "$out"
summary=()
. "$(dirname "$0")/run_lib.sh"

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.used --format=csv >"$out/gpu.txt" 2>&1
"$build/tests/gpu/prog_probe" | tee -a "$out/gpu.txt"

case " $steps " in *" tests "*)
    export RN_BUILD=$(realpath "$build")
    step "test_e2e_cuda (no MPS)" e2e-nomps.log timeout 280 "$build/tests/gpu/test_e2e_cuda"
    if mps_start e2e; then
        step "test_e2e_cuda (MPS)" e2e-mps.log env RN_EXPECT_MPS=1 timeout 280 \
            "$build/tests/gpu/test_e2e_cuda"
        mps_stop tests
    else
        summary+=("MPS: nvidia-cuda-mps-control -d failed")
    fi
    unset RN_BUILD ;;
esac

# The CUDA fast path's own tests and its benchmark beside the classic path
# (both paths in one run): E2E_STEPS="fast" (or "tests bench fast").
case " $steps " in *" fast "*)
    export RN_BUILD=$(realpath "$build")
    step "test_fastpath_cuda (no MPS)" fast-nomps.log timeout 280 \
        "$build/tests/gpu/test_fastpath_cuda"
    if mps_start e2e; then
        step "test_fastpath_cuda (MPS)" fast-mps.log timeout 280 \
            "$build/tests/gpu/test_fastpath_cuda"
        step "bench_e2e_cuda --fast MPS" bench-fast.log timeout 400 \
            "$build/bench/bench_e2e_cuda" --daemon "$build/rmsnormd" --label "MPS" \
            --iters "$iters" --out "$out/bench-fast.md" --fast
        mps_stop fast
    else
        summary+=("MPS: nvidia-cuda-mps-control -d failed")
    fi
    unset RN_BUILD ;;
esac

# The fast path's tests with the client's streams waiting on the ring's done
# word in host memory (RMSNORMD_DONE_WORD=host; libclient's default is a
# word in device memory; the kill tests are what show the raise of either
# when a session is lost), without and with MPS: E2E_STEPS="hostword".
case " $steps " in *" hostword "*)
    export RN_BUILD=$(realpath "$build") RMSNORMD_DONE_WORD=host
    step "test_fastpath_cuda hostword (no MPS)" hostword-fast-nomps.log timeout 280 \
        "$build/tests/gpu/test_fastpath_cuda"
    step "test_e2e_cuda hostword (no MPS)" hostword-e2e-nomps.log timeout 280 \
        "$build/tests/gpu/test_e2e_cuda"
    if mps_start e2e; then
        step "test_fastpath_cuda hostword (MPS)" hostword-fast-mps.log timeout 280 \
            "$build/tests/gpu/test_fastpath_cuda"
        step "test_e2e_cuda hostword (MPS)" hostword-e2e-mps.log env RN_EXPECT_MPS=1 \
            timeout 280 "$build/tests/gpu/test_e2e_cuda"
        mps_stop hostword
    else
        summary+=("MPS: nvidia-cuda-mps-control -d failed")
    fi
    unset RN_BUILD RMSNORMD_DONE_WORD ;;
esac

case " $steps " in *" bench "*)
    if mps_start e2e; then
        # Each build its own client and daemon, back to back; with several
        # rounds the order alternates (ABBA) so that drift cancels, and
        # bench/e2e_compare.py takes the medians.
        order=("${others[@]}" "$build")
        names=()
        for b in "${order[@]}"; do names+=("$(basename "$b")"); done
        for ((r = 1; r <= rounds; r++)); do
            for b in "${order[@]}"; do
                name=$(basename "$b")
                log="bench-$name.log"
                [ "$rounds" -gt 1 ] && log="bench-$name-r$r.log"
                step "bench_e2e_cuda MPS ($name) round $r" "$log" timeout 200 \
                    "$b/bench/bench_e2e_cuda" --daemon "$b/rmsnormd" --label "MPS $name r$r" \
                    --iters "$iters" --out "$out/bench.md"
            done
            order=($(printf '%s\n' "${order[@]}" | tac))
        done
        mps_stop bench
        if [ "$rounds" -gt 1 ]; then
            python3 "$(dirname "$0")/../../bench/e2e_compare.py" "$out" "${names[@]}" \
                | tee "$out/compare.txt"
        fi
    else
        summary+=("MPS: nvidia-cuda-mps-control -d failed")
    fi ;;
esac
printf '%s\n' "${summary[@]}" | tee "$out/summary.txt"
