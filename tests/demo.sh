#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# make demo: start rmsnormd (best backend available) on a private endpoint,
# check it, run 4 client processes that each send a stream of requests
# through libclient and verify every result, print the daemon's statistics,
# and stop it with SIGTERM (it must exit 0).
#
# Usage: tests/demo.sh BUILD_DIR      (e.g. tests/demo.sh build)
# Environment: DEMO_REQUESTS (per worker, default 500), DEMO_M, DEMO_N,
# DEMO_DTYPE (default 256 x 1024 bf16).
set -u
build=${1:?usage: tests/demo.sh BUILD_DIR}
here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here" || exit 2
rmsnormd="$build/rmsnormd"
ctl="$build/rmsnormctl"
for p in "$rmsnormd" "$ctl"; do
    [ -x "$p" ] || { echo "demo: $p is missing; run make first" >&2; exit 2; }
done

dir=$(mktemp -d /tmp/rmsnormd-demo.XXXXXX)
endpoint="ipc://$dir/rmsnormd.sock"
log="$dir/rmsnormd.log"
pid=""

cleanup() {
    if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
        kill -KILL "$pid" 2>/dev/null
        wait "$pid" 2>/dev/null
    fi
    rm -rf "$dir"
}
trap cleanup EXIT

step() { printf '\n==> %s\n' "$*"; }

step "starting rmsnormd --backend auto on $endpoint"
"$rmsnormd" --backend auto --endpoint "$endpoint" --config /dev/null 2>"$log" &
pid=$!

# Readiness: the daemon answers once its backend is up and the socket is
# bound.  (Under systemd it says READY=1; here a bounded retry is enough.)
ready=""
for _ in $(seq 1 100); do
    if ! kill -0 "$pid" 2>/dev/null; then
        echo "demo: rmsnormd exited during start-up:" >&2; cat "$log" >&2; exit 1
    fi
    # health -q: 0 ok, 1 degraded (serving; a CUDA daemon without MPS says
    # so), 2 unreachable or failing.
    "$ctl" --endpoint "$endpoint" --timeout 1000 health -q 2>/dev/null
    if [ $? -le 1 ]; then
        ready=1; break
    fi
    sleep 0.1
done
if [ -z "$ready" ]; then
    echo "demo: rmsnormd did not become ready within 10 s:" >&2; cat "$log" >&2; exit 1
fi
"$ctl" --endpoint "$endpoint" info || exit 1

step "health"
"$ctl" --endpoint "$endpoint" health
[ $? -le 1 ] || exit 1

step "selftest: a grid of shapes and dtypes against the CPU twin and fp64"
"$ctl" --endpoint "$endpoint" selftest || { cat "$log" >&2; exit 1; }

step "4 client processes, each a stream of verified requests"
"$ctl" --endpoint "$endpoint" bench -k 4 -r "${DEMO_REQUESTS:-500}" --m "${DEMO_M:-256}" \
    --n "${DEMO_N:-1024}" --dtype "${DEMO_DTYPE:-bf16}" || { cat "$log" >&2; exit 1; }

step "ping"
"$ctl" --endpoint "$endpoint" ping -c 200 || exit 1

step "the daemon's statistics"
"$ctl" --endpoint "$endpoint" stats || exit 1

step "stopping rmsnormd with SIGTERM"
kill -TERM "$pid"
# A drain that does not end within a minute is a failure, not a hang.
for _ in $(seq 600); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
if kill -0 "$pid" 2>/dev/null; then
    echo "rmsnormd did not exit within 60 s of SIGTERM; killing it" >&2
    kill -KILL "$pid"
fi
wait "$pid"
rc=$?
pid=""
echo "rmsnormd exited with status $rc"
echo "---- its log ----"
tail -n 8 "$log"
if [ "$rc" != 0 ]; then
    echo "demo: FAILED (rmsnormd exit status $rc)" >&2
    exit 1
fi
echo
echo "demo: OK"
