#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Run test suites and print one summary line: "N passed, N failed, N skipped".
# Usage: tests/run.sh BUILD_DIR [SUITE...]   (suites: layers unit fuzz integration python gpu)
# Each test binary is cmocka; its log goes to BUILD_DIR/test-logs/ and is
# printed when it fails.  Skipped tests give their reason on a line starting
# "skip-reason:" (tests/rn_test.h's RN_SKIP).
set -u
build=${1:?usage: tests/run.sh BUILD_DIR [SUITE...]}; shift
suites=${*:-layers unit fuzz integration python gpu}
here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here" || exit 2
logs="$build/test-logs"; mkdir -p "$logs"
export RN_BUILD="$here/$build" RN_SRC="$here"
# A test binary gets this long before it is killed and counted as failed.
per_test_timeout=${RN_TEST_TIMEOUT:-900}

passed=0 failed=0 skipped=0
reasons=()
failures=()

# count LOG NAME: add the cmocka summary of LOG to the totals; a log without
# one (crash, timeout) counts as one failure.
count() {
    local log=$1 name=$2 rc=$3 p f s
    p=$(sed -n 's/^\[  PASSED  \] \([0-9]*\) test.*/\1/p' "$log" | awk '{s+=$1} END {print s+0}')
    f=$(sed -n 's/^\[  FAILED  \] \([0-9]*\) test.*/\1/p' "$log" | awk '{s+=$1} END {print s+0}')
    s=$(sed -n 's/^\[  SKIPPED \] \([0-9]*\) test.*/\1/p' "$log" | awk '{s+=$1} END {print s+0}')
    if ! grep -q '^\[==========\] .* run\.' "$log" || { [ "$rc" != 0 ] && [ "$f" = 0 ]; }; then
        f=$((f + 1))
        echo "    (exit status $rc without a complete cmocka report)" >>"$log"
    fi
    passed=$((passed + p)); failed=$((failed + f)); skipped=$((skipped + s))
    while IFS= read -r r; do reasons+=("$name: ${r#skip-reason: }"); done \
        < <(grep '^skip-reason:' "$log" | sort -u)
    if [ "$f" -gt 0 ]; then
        failures+=("$name")
        printf '  FAIL  %-40s (%s passed, %s failed)\n' "$name" "$p" "$f"
        echo "  ---- $log (last 60 lines) ----"; tail -n 60 "$log" | sed 's/^/  | /'
    else
        printf '  ok    %-40s (%s passed%s)\n' "$name" "$p" "$([ "$s" -gt 0 ] && echo ", $s skipped")"
    fi
}

run_bins() {  # run_bins SUITE: every build/tests/SUITE/test_* binary
    local suite=$1 b name log rc
    for b in "$build/tests/$suite"/test_*; do
        [ -x "$b" ] || continue
        name="$suite/$(basename "$b")"; log="$logs/${suite}-$(basename "$b").log"
        timeout -k 10 "$per_test_timeout" "$b" >"$log" 2>&1; rc=$?
        count "$log" "$name" "$rc"
    done
}

for suite in $suites; do
    case $suite in
    unit) echo "suite $suite"; run_bins "$suite" ;;
    integration)
        echo "suite $suite"; run_bins "$suite"
        # The fast-path suite again with the daemon's armed mode
        # (--ring-ready=armed, daemon/ring_arm.c) under every daemon: its
        # tests of one mode's own behaviour skip.
        b="$build/tests/integration/test_fastpath"
        if [ -x "$b" ]; then
            name="integration/test_fastpath (--ring-ready=armed)"; log="$logs/integration-test_fastpath-armed.log"
            RN_DAEMON_ARGS=--ring-ready=armed timeout -k 10 "$per_test_timeout" "$b" >"$log" 2>&1; rc=$?
            count "$log" "$name" "$rc"
        fi ;;
    layers)
        # The structure rules (tests/check_layers.py): no call or include
        # circle between files, no source over 700 lines, folders used as
        # the README's layout says.  One test.
        echo "suite layers"
        log="$logs/layers.log"
        py=/usr/bin/python3; [ -x "$py" ] || py=python3
        if "$py" tests/check_layers.py "$build" >"$log" 2>&1; then
            passed=$((passed + 1)); echo "  ok    layers ($(tail -1 "$log" | sed 's/^layers: //'))"
        else
            failed=$((failed + 1)); failures+=(layers); echo "  FAIL  layers"; sed 's/^/  | /' "$log"
        fi ;;
    fuzz)
        echo "suite fuzz (replay of the corpus and the regression inputs)"
        for b in "$build/tests/fuzz"/replay_*; do
            [ -x "$b" ] || continue
            name="fuzz/$(basename "$b")"; log="$logs/fuzz-$(basename "$b").log"
            timeout -k 10 "$per_test_timeout" "$b" tests/fuzz/corpus tests/fuzz/regressions >"$log" 2>&1
            count "$log" "$name" "$?"
        done ;;
    python)
        echo "suite python"
        if [ ! -d python/tests ]; then continue; fi
        log="$logs/python.log"
        # The user's interpreter (PYTHON, else python3 on PATH): the one
        # where they installed PyTorch and prometheus_client.
        py=${PYTHON:-python3}
        pyname="$py ($(command -v "$py" 2>/dev/null || echo "not found"))"
        if ! "$py" -c 'import pytest' 2>/dev/null; then
            skipped=$((skipped + 1)); reasons+=("python: pytest is not installed for $pyname (make deps installs it; PYTHON= picks another interpreter)")
            continue
        fi
        echo "  interpreter: $pyname"
        # A sanitizer build's libclient needs the ASan runtime loaded first.
        san=; grep -qa 'libasan\.so' "$build/librmsnorm_client.so.0" 2>/dev/null && san=$(${CC:-cc} -print-file-name=libasan.so)
        # Test the libclient of this build, never one named in the caller's environment.
        env -u RMSNORMD_LIBCLIENT ${san:+LD_PRELOAD=$san ASAN_OPTIONS=detect_leaks=0} PYTHONPATH="$here/python" \
            timeout -k 10 "$per_test_timeout" "$py" -m pytest -q python/tests >"$log" 2>&1; rc=$?
        line=$(grep -E '^[=]* *[0-9]+ (passed|failed|skipped|error)' "$log" | tail -1)
        p=$(echo "$line" | grep -oE '[0-9]+ passed' | grep -oE '[0-9]+'); p=${p:-0}
        f=$(echo "$line" | grep -oE '[0-9]+ (failed|error)' | grep -oE '[0-9]+' | awk '{s+=$1} END {print s+0}')
        s=$(echo "$line" | grep -oE '[0-9]+ skipped' | grep -oE '[0-9]+'); s=${s:-0}
        # rc 5 is "no tests collected": with python/tests present, a failure.
        if [ "$rc" != 0 ] && [ "$f" = 0 ]; then f=1; fi
        passed=$((passed + p)); failed=$((failed + f)); skipped=$((skipped + s))
        if [ "$f" -gt 0 ]; then failures+=(python); echo "  FAIL  python/tests"; tail -n 60 "$log" | sed 's/^/  | /'
        else echo "  ok    python/tests ($p passed)"; fi
        while IFS= read -r r; do reasons+=("python: $r"); done < <(grep -E '^SKIPPED' "$log" | sort -u)
        ;;
    gpu)
        echo "suite gpu"
        gpu_bins=$(ls "$build/tests/gpu"/test_* 2>/dev/null)
        if [ -z "$gpu_bins" ]; then
            skipped=$((skipped + 1)); reasons+=("gpu: not built (no CUDA Toolkit)"); continue
        fi
        # CUDA's start-up can block (a wedged GPU, another user's MPS server).
        if ! timeout -k 5 60 "$build/tests/gpu/prog_probe" >"$logs/gpu-probe.log" 2>&1; then
            n=$(echo "$gpu_bins" | wc -w)
            skipped=$((skipped + n))
            why=$(head -1 "$logs/gpu-probe.log"); why=${why:-the CUDA probe did not answer within 60 s}
            reasons+=("gpu: $n test programs skipped: $why")
            continue
        fi
        run_bins gpu ;;
    *) echo "unknown suite $suite" >&2; exit 2 ;;
    esac
done

echo
if [ ${#reasons[@]} -gt 0 ]; then
    echo "skipped:"; printf '  %s\n' "${reasons[@]}"
fi
if [ ${#failures[@]} -gt 0 ]; then
    echo "failed:"; printf '  %s\n' "${failures[@]}"
fi
echo "$passed passed, $failed failed, $skipped skipped"
[ "$failed" = 0 ]
