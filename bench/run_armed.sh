#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The daemon's armed mode (--ring-ready=armed, daemon/ring_arm.c) on a GPU
# host, run from the repository root, in parts of about 4-6 minutes each
# (one device command each; PART all runs checks and measure):
#   checks  1. test_kernel_gpu's gate, done-word and cancel tests in full,
#              then their quick subset under compute-sanitizer (memcheck);
#           2. test_fastpath_cuda with RN_DAEMON_ARGS=--ring-ready=armed under
#              MPS, then its kill -9 tests (which skip under MPS) without MPS:
#              the dead-client path of armed calls;
#   measure 3. under MPS, the GPU time added per call (bench_e2e_cuda
#              --fast-only --ks 0) with the three ready modes taking turns,
#              two rounds: gpu, host, armed, armed, host, gpu;
#           4. under MPS, K = 1, 2, 4, 8 clients (--tput-only) for host, armed
#              and armed with RMSNORMD_DEBUG_ARM_POLICY=free: what revocations
#              cost when clients share the daemon (the daemon at
#              --log-level=debug logs each revocation);
#   late    5. under MPS, the GPU time added when producers come late
#              (bench_e2e_cuda --lead-us 3000 and 30000: past the doorbell
#              thread's 1 ms spin, where it polls ready words), for gpu,
#              host, armed, and armed with a 100 ms spin
#              (RMSNORMD_DEBUG_READY_SPIN_US=100000), in turn and back.
# Every bench run ends with its daemon's counts (daemon_counts: fast.armed,
# fast.revoked, ...): an "armed" row without armed calls measured host mode.
# Writes to OUT: summary-PART.txt (each step's result as it ends, the bench
# runs' counts and exit lines), added.md and tput.md (the tables), and
# logs-PART.tgz (every log, the bench daemons' logs included).
# RA_BENCH_ARGS: more bench_e2e_cuda arguments for the GPU-time runs of
# measure and late, e.g. --split (x, dy and dx in allocations of their own,
# as PyTorch's allocator gives large tensors).
# Usage: bench/run_armed.sh BUILD OUT [checks|measure|late|all]   (BUILD: a build
# or a pack of one, tests/gpu/pack_build.sh); LD_LIBRARY_PATH for the
# runtime libraries.
set -u
build=${1:?usage: run_armed.sh BUILD OUT [checks|measure|late|all]}
out=${2:?usage: run_armed.sh BUILD OUT [checks|measure|late|all]}
part=${3:-all}
case $part in checks | measure | late | all) ;; *) echo "run_armed.sh: PART: checks, measure, late or all" >&2; exit 2 ;; esac
here=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "$build" && pwd) # (the tests run rmsnormctl from $RN_BUILD, elsewhere)
# shellcheck source=tests/gpu/run_lib.sh
. "$here/tests/gpu/run_lib.sh"
run_dirs "$out" "l-$part" "summary-$part.txt"
export RN_BUILD=$build RN_SRC=$here CUDA_MODULE_LOADING=EAGER

# Every step's timeout is cut to what is left of RA_BUDGET seconds (540 by
# default: a device command's 10 minutes, less the pack's unpacking and this
# script's end), and a step with less than 20 s left is skipped, so that the
# script always ends on its own and keeps its logs.
deadline=$((SECONDS + ${RA_BUDGET:-540}))
extra=()
[ -n "${RA_BENCH_ARGS:-}" ] && read -ra extra <<<"$RA_BENCH_ARGS"
within() { # within NAME T: whether a step of T seconds may start
    if [ "$(left "$2")" -lt 20 ]; then
        echo "$1: skipped, out of time" >>"$summary_file"
        return 1
    fi
}

mps=0
finish() {
    [ $mps = 1 ] && mps_stop armed
    mps=0
    tar -czf "$out_final/logs-$part.tgz" -C "$out_final" "l-$part" && rm -rf "$out"
    cat "$summary_file"
}
trap finish EXIT
mps_on() {
    if mps_start armed; then mps=1; else
        echo "MPS did not start: the steps below run without it" >>"$summary_file"
    fi
}
mps_off() {
    [ $mps = 1 ] && mps_stop armed
    mps=0
}

# bench NAME TIMEOUT ARGS...: bench_e2e_cuda with ARGS; its daemon's log is
# kept beside its own, and its counts and exit line go to the summary.
bench() {
    local name=$1 t=$2; shift 2
    within "$name" "$t" || return 0
    local before
    before=$(ls -d /tmp/rn-bench.* 2>/dev/null | tr '\n' ' ')
    step "$name" "$name.log" timeout -k 5 "$(left "$t")" "$build/bench/bench_e2e_cuda" \
        --daemon "$build/rmsnormd" "$@"
    local d
    for d in $(ls -d /tmp/rn-bench.* 2>/dev/null); do
        case " $before " in *" $d "*) continue ;; esac
        cp "$d/daemon.log" "$out/$name-daemon.log" 2>/dev/null
        rm -rf "$d"
    done
    local back
    back=$(grep -c 'taken back' "$out/$name-daemon.log" 2>/dev/null)
    {
        printf '    %s\n' "$(grep -h '^daemon_counts\|exit status' "$out/$name.log" | tr '\n' ' ')"
        printf '    taken back (debug log lines): %s\n' "${back:-0}"
    } >>"$summary_file"
}

if [ "$part" = checks ] || [ "$part" = all ]; then
    san=()
    command -v compute-sanitizer >/dev/null && san=(compute-sanitizer --error-exitcode 9)
    RNK_GPU_TESTS=gate,done_words,cancel step "kernel gate (full)" kernel.log \
        timeout -k 5 "$(left 120)" "$build/tests/gpu/test_kernel_gpu"
    # (not test_gate_stream: its host stores come after the launch, which
    # the sanitizer may hold until the kernel is done)
    RNK_GPU_QUICK=1 RNK_GPU_TESTS=gate_word,done_words,cancel step "kernel gate (memcheck, quick)" \
        kernel-san.log timeout -k 5 "$(left 150)" "${san[@]}" "$build/tests/gpu/test_kernel_gpu"
    mps_on
    within "fastpath_cuda armed (MPS)" 200 &&
        RN_DAEMON_ARGS=--ring-ready=armed step "fastpath_cuda armed (MPS)" fastpath_cuda.log \
            timeout -k 5 "$(left 200)" "$build/tests/gpu/test_fastpath_cuda"
    mps_off
    within "fastpath_cuda kill -9" 120 &&
        RN_TESTS='test_kill9_*' RN_DAEMON_ARGS=--ring-ready=armed \
            step "fastpath_cuda kill -9, armed (no MPS)" fastpath_cuda_kill9.log \
            timeout -k 5 "$(left 120)" "$build/tests/gpu/test_fastpath_cuda"
fi

if [ "$part" = measure ] || [ "$part" = all ]; then
    mps_on
    for mode in gpu host armed armed host gpu; do
        bench "added-$mode-$SECONDS" 70 --label "MPS $mode" --fast-only --ks 0 --iters 300 \
            --daemon-arg "--ring-ready=$mode" "${extra[@]}" --out "$out/added-$mode-$SECONDS.md"
    done
    # (armed-free: RMSNORMD_DEBUG_ARM_POLICY=free, rings arm whatever else is
    # in flight and other rings' calls take nothing back)
    for mode in host armed armed-free; do
        RMSNORMD_DEBUG_ARM_POLICY=$([ "$mode" = armed-free ] && echo free || echo alone) \
            bench "tput-$mode" 90 --label "MPS $mode" --fast-only --tput-only --iters 300 \
            --daemon-arg "--ring-ready=${mode%-free}" --daemon-arg "--log-level=debug" \
            --out "$out/tput-$mode.md"
    done
    mps_off
    cat "$out"/added-*.md >"$out_final/added.md" 2>/dev/null
    cat "$out"/tput-*.md >"$out_final/tput.md" 2>/dev/null
fi

if [ "$part" = late ]; then
    mps_on
    for lead in 3000 30000; do
        it=200
        [ "$lead" = 30000 ] && it=40
        for mode in gpu host armed armed-spin armed-spin armed host gpu; do
            RMSNORMD_DEBUG_READY_SPIN_US=$([ "$mode" = armed-spin ] && echo 100000) \
                bench "late-$lead-$mode-$SECONDS" 60 --label "MPS $mode lead $lead" --fast-only \
                --ks 0 --iters "$it" --lead-us "$lead" --daemon-arg "--ring-ready=${mode%-spin}" \
                "${extra[@]}" --out "$out/late-$lead-$mode.md"
        done
    done
    mps_off
    cat "$out"/late-*.md >"$out_final/late.md" 2>/dev/null
fi
