# SPDX-License-Identifier: MIT
# Shared by the GPU run scripts (sourced, not run): their output folders, a
# step that keeps its log and notes its result in the summary, and an MPS
# control daemon of the script's own.  The sourcing script sets out (the
# logs' folder) and summary=() first, or calls run_dirs.

# run_dirs OUT_FINAL [SUB [SUMMARY]]: OUT_FINAL/SUB made (SUB: logs), then
# out_final and out (the logs' folder) set to them as absolute paths,
# summary=() and the summary file OUT_FINAL/SUMMARY (summary.txt) emptied.
run_dirs() {
    mkdir -p "$1/${2:-logs}"
    out_final=$(cd "$1" && pwd)
    out=$out_final/${2:-logs}
    summary=()
    summary_file=$out_final/${3:-summary.txt}
    : >"$summary_file"
}

# step NAME LOG COMMAND...: run COMMAND with its output in $out/LOG, then
# note NAME, its exit status, its seconds and its pass/fail lines (also
# appended to $summary_file at once where the script sets one, so that a
# run cut short keeps the steps it finished).
step() {
    local name=$1 log=$2; shift 2
    local t0=$SECONDS
    "$@" >"$out/$log" 2>&1
    local rc=$?
    local res
    res=$(grep -E '^\[  (PASSED|FAILED) \]|^[0-9]+ (passed|failed)' "$out/$log" | tail -2 | tr '\n' ' ')
    summary+=("$(printf '%-34s rc=%-3s %4ss  %s' "$name" "$rc" $((SECONDS - t0)) "$res")")
    [ -n "${summary_file:-}" ] && printf '%s\n' "${summary[-1]}" >>"$summary_file"
    return 0
}

# left T: T seconds, or fewer when the sourcing script's $deadline (in
# $SECONDS) comes first: a step's time limit cut to the run's budget.
left() {
    local l=$((deadline - SECONDS))
    [ "$l" -lt "$1" ] && echo "$l" || echo "$1"
}

# mps_start TAG: an MPS control daemon with its pipes and log under /tmp/rn-TAG-mps-*.
# Returns nonzero when it did not start (then nothing is exported).
mps_start() {
    export CUDA_MPS_PIPE_DIRECTORY=/tmp/rn-$1-mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/rn-$1-mps-log
    mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
    nvidia-cuda-mps-control -d && return 0
    unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
    return 1
}

# mps_stop NAME: stop it, keep its control log as $out/mps-control-NAME.log.
mps_stop() {
    echo quit | nvidia-cuda-mps-control
    cp "$CUDA_MPS_LOG_DIRECTORY"/control.log "$out/mps-control-$1.log" 2>/dev/null
    unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
    sleep 1 # the server's clients are gone; let it exit before the next start
}
