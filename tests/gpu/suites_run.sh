#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Every GPU suite of the daemon and libclient, on one build, in one device
# command of at most SUITES_BUDGET seconds (570 by default: each step's time
# limit is cut to what is left, and a step with less than 20 s left is
# skipped and says so), in the parts named (default: armed mps nomps pytest):
#   armed   bench/run_armed.sh's checks: the kernel's gate tests in full and
#           under memcheck, test_fastpath_cuda armed under MPS, its kill -9
#           tests armed without MPS;
#   mps     under MPS: test_fastpath_cuda, test_e2e_cuda, test_graph_cuda;
#   nomps   without MPS: test_watch_cuda (the daemon killed under waiting
#           streams; it skips under MPS), test_e2e_cuda, test_fastpath_cuda,
#           test_graph_cuda, test_vmm_cuda, test_kernel_gpu;
#   pytest  under MPS, where python3 has PyTorch: test_torch_cuda.py,
#           test_torch_graph.py, test_torch_vmm.py.
# Run from the repository root on a GPU host (LD_LIBRARY_PATH with the
# runtime libraries a bare host lacks):
#   tests/gpu/suites_run.sh BUILD OUT [PART...]
# BUILD: a build directory or a pack of one (tests/gpu/pack_build.sh).
# Writes OUT/summary.txt (each step's result as it ends, then each log's
# pass and fail lines after its part) and OUT/logs.tgz (every log), so a
# run cut short keeps what it finished.  Exit status 0 when every step ran
# and exited 0.
set -u
build=${1:?usage: suites_run.sh BUILD OUT [armed|mps|nomps|pytest]...}
out_final=${2:?usage: suites_run.sh BUILD OUT [armed|mps|nomps|pytest]...}
shift 2
parts=("$@")
[ ${#parts[@]} -eq 0 ] && parts=(armed mps nomps pytest)
for p in "${parts[@]}"; do
    case $p in armed | mps | nomps | pytest) ;; *)
        echo "suites_run.sh: PART: armed, mps, nomps or pytest, not '$p'" >&2
        exit 2 ;;
    esac
done
here=$(cd "$(dirname "$0")/../.." && pwd)
build=$(cd "$build" && pwd)
# shellcheck source=tests/gpu/run_lib.sh
. "$here/tests/gpu/run_lib.sh"
run_dirs "$out_final"
export RN_BUILD=$build RN_SRC=$here CUDA_MODULE_LOADING=EAGER
deadline=$((SECONDS + ${SUITES_BUDGET:-570}))
status=0
# suite NAME BINARY T [VAR=VALUE...]: tests/gpu/BINARY with its log in NAME.log
suite() {
    local name=$1 bin=$2 t=$3
    shift 3
    if [ "$(left "$t")" -lt 20 ]; then
        echo "$name: skipped, out of time" >>"$summary_file"
        status=1
        return 0
    fi
    step "$name" "$name.log" env "$@" timeout -k 5 "$(left "$t")" "$build/tests/gpu/$bin"
    [[ ${summary[-1]} == *"rc=0 "* ]] || status=1
}
mps=0
mps_on() {
    if mps_start suites; then mps=1; else
        echo "MPS did not start: the MPS steps are skipped" >>"$summary_file"
        status=1
    fi
}
mps_off() {
    [ $mps = 1 ] && mps_stop suites
    mps=0
}
finish() {
    mps_off
    tar -czf "$out_final/logs.tgz" -C "$out_final" logs && rm -rf "$out"
}
trap finish EXIT

{
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1
    "$build/tests/gpu/prog_probe" 2>&1
} >>"$summary_file"
for part in "${parts[@]}"; do
    case $part in
    armed)
        RA_BUDGET=$(left 150) "$here/bench/run_armed.sh" "$build" "$out/armed" checks >/dev/null 2>&1
        cat "$out/armed/summary-checks.txt" >>"$summary_file"
        # (its exit status is not its steps': a step that failed or was skipped)
        grep -qE ' rc=[1-9]|skipped|did not start' "$out/armed/summary-checks.txt" && status=1 ;;
    mps)
        mps_on
        if [ $mps = 1 ]; then
            suite fastpath-mps test_fastpath_cuda 200
            suite e2e-mps test_e2e_cuda 200 RN_EXPECT_MPS=1
            suite graph-mps test_graph_cuda 150 RN_EXPECT_MPS=1
        fi
        mps_off ;;
    nomps)
        suite watch-nomps test_watch_cuda 120
        suite e2e-nomps test_e2e_cuda 200
        suite fastpath-nomps test_fastpath_cuda 200
        suite graph-nomps test_graph_cuda 150
        suite vmm-nomps test_vmm_cuda 120
        suite kernel-nomps test_kernel_gpu 150 ;;
    pytest)
        if ! python3 -c 'import torch' 2>/dev/null; then
            echo "pytest: skipped, no PyTorch for python3" >>"$summary_file"
        elif [ "$(left 240)" -lt 20 ]; then
            echo "pytest: skipped, out of time" >>"$summary_file"
            status=1
        else
            mps_on
            step "pytest (MPS)" pytest.log env RMSNORMD_LIBCLIENT="$build/librmsnorm_client.so.0" \
                PYTHONPATH="$here/python" PYTHONUNBUFFERED=1 timeout -k 5 "$(left 240)" \
                python3 -m pytest -q python/tests/test_torch_cuda.py \
                python/tests/test_torch_graph.py python/tests/test_torch_vmm.py
            [[ ${summary[-1]} == *"rc=0 "* ]] || status=1
            mps_off
        fi ;;
    esac
    # each log of the part: its pass, skip and fail lines
    for f in "$out"/*.log; do
        [ -e "$f" ] || continue
        grep -hE '^\[  (PASSED|SKIPPED)  \] [0-9]|^\[  FAILED  \]|[0-9]+ (passed|failed)' "$f" |
            head -8 | sed "s|^|  $(basename "$f" .log): |" >>"$summary_file"
        mkdir -p "$out/$part" && mv "$f" "$out/$part/"
    done
    echo "-- $part done at ${SECONDS}s" >>"$summary_file"
done
cat "$summary_file"
exit $status
