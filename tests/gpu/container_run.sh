#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
#
# container_run.sh PACK OUT - does a worker in another container work with a
# daemon outside it?  For the Kubernetes notes in systemd/README.md.  Run on
# a GPU host, as root (unshare and mount), from the repository root, with a
# build packed by tests/gpu/pack_build.sh:
#
#   sudo env LD_LIBRARY_PATH=$PWD/.gpu-libs tests/gpu/container_run.sh $PWD/PACK OUT
#
# It starts rmsnormd (--backend cuda) normally, in the host's namespaces, on a
# socket in a fresh directory, then runs client programs of PACK in what a
# container gives a pod without hostIPC or hostPID: a new PID namespace
# (/proc remounted), a new IPC namespace, a new mount namespace with a
# private tmpfs on /dev/shm and (RN_CT_NET=1, the default) a new network
# namespace; only the socket directory and the GPU are shared.  Each case's
# output is in OUT/<case>.log, the daemon's in OUT/daemon.log, and a summary
# in OUT/summary.txt (also printed).
#
#   host-fast      the fast path from the host (the baseline: the build works)
#   ns-fast        the fast path in the namespaces: 200 checked calls
#   ns-late        ... a producer 1 s late (ordering through the ring's words)
#   ns-churn       ... 10 sessions of 4 allocations each (REGISTER, release)
#   ns-order       prog_e2e_cuda's producer -> call -> consumer, fast path
#   ns-classic     the classic path (IPC events): expected to fail at EVENTS
#                  with a private /dev/shm; the message is reported
#   ns-vmm         cuMemCreate memory (descriptors on the session channel):
#                  prog_vmm_cuda results (its sync calls take the classic path)
#   ns-vmm-fast    ... async calls only (prog_vmm_cuda flood for 3 s)
#   ns-kill        kill -9 of a namespace's processes with calls pending: the
#                  daemon releases the session (the pid watch works across
#                  PID namespaces) and stays healthy
# and, from the daemon's log, the pid a namespaced client claimed at HELLO
# against the one the session channel verified.
#
# RN_CT_MPS=1 starts an MPS control daemon (pipes under OUT) for the whole
# run, so that daemon and clients are MPS clients: under MPS a client talks
# to the server through its pipe directory and /dev/shm, which is where a
# private /dev/shm may break it (reported as the cases' results).
set -u

pack=${1:?usage: container_run.sh PACK OUT}
out=${2:?usage: container_run.sh PACK OUT}
net=${RN_CT_NET:-1}
mps=${RN_CT_MPS:-0}

if [ "$(id -u)" != 0 ]; then
    echo "container_run.sh: run as root (unshare, mount)" >&2
    exit 2
fi
for p in rmsnormd rmsnormctl tests/gpu/prog_fastpath_cuda tests/gpu/prog_e2e_cuda \
    tests/gpu/prog_vmm_cuda; do
    [ -x "$pack/$p" ] || { echo "container_run.sh: $pack/$p missing" >&2; exit 2; }
done
command -v unshare >/dev/null || { echo "container_run.sh: no unshare" >&2; exit 2; }
mkdir -p "$out" && out=$(cd "$out" && pwd) && pack=$(cd "$pack" && pwd)
: >"$out/summary.txt"

sockdir=$(mktemp -d /tmp/rn-ct.XXXXXX)
ep="ipc://$sockdir/rmsnormd.sock"
ctl() { "$pack/rmsnormctl" --endpoint "$ep" --timeout 5000 "$@"; }
# counter NAME: one of the daemon's STATS counters (-1: unreadable).
counter() {
    local v
    v=$(ctl stats --json 2>/dev/null | grep -o "\"$1\":[0-9]*" | head -1 | cut -d: -f2)
    echo "${v:--1}"
}
say() { echo "$*" | tee -a "$out/summary.txt"; }

dpid=
mps_pipe=
cleanup() {
    [ -n "$dpid" ] && kill -TERM "$dpid" 2>/dev/null && wait "$dpid" 2>/dev/null
    if [ -n "$mps_pipe" ]; then
        echo quit | CUDA_MPS_PIPE_DIRECTORY=$mps_pipe nvidia-cuda-mps-control >/dev/null 2>&1
    fi
    rm -rf "$sockdir"
}
trap cleanup EXIT

if [ "$mps" = 1 ]; then
    mps_pipe=$out/mps-pipe
    mkdir -p "$mps_pipe" "$out/mps-log"
    export CUDA_MPS_PIPE_DIRECTORY=$mps_pipe CUDA_MPS_LOG_DIRECTORY=$out/mps-log
    nvidia-cuda-mps-control -d || { echo "container_run.sh: no MPS control daemon" >&2; exit 2; }
fi

"$pack/rmsnormd" --backend cuda --endpoint "$ep" --log-level debug >"$out/daemon.log" 2>&1 &
dpid=$!
for _ in $(seq 300); do
    ctl health -q >/dev/null 2>&1; rc=$?
    [ $rc -le 1 ] && break
    kill -0 "$dpid" 2>/dev/null || { echo "the daemon exited; see $out/daemon.log" >&2; exit 1; }
    sleep 0.1
done
say "rmsnormd $(ctl info 2>/dev/null | grep -m1 -i device) on $ep (MPS run: $mps, own network namespace: $net)"
say "host /dev/shm: $(ls /dev/shm | wc -l) entries"

# inside NAME CMD...: CMD in fresh PID, IPC, mount (private /dev/shm) and
# network namespaces; its output in OUT/NAME.log; returns its status.
nsflags=(--pid --ipc --mount --fork --kill-child --mount-proc)
[ "$net" = 1 ] && nsflags+=(--net)
inside() {
    local name=$1; shift
    timeout 300 unshare "${nsflags[@]}" -- bash -c '
        mount -t tmpfs -o size=512m,mode=1777 tmpfs /dev/shm || exit 90
        echo "in the namespaces: pid $$, /dev/shm entries: $(ls /dev/shm | wc -l)"
        exec "$@"' inside "$@" >"$out/$name.log" 2>&1
}

# result NAME RC [EXPECT]: one summary line, with the log's last FAIL line.
result() {
    local name=$1 rc=$2 why
    why=$(grep -m1 -E "FAIL|error|Error" "$out/$name.log" | cut -c1-220)
    if [ "$rc" = 0 ]; then
        say "  $name: PASS"
    else
        say "  $name: FAIL (exit $rc)${why:+: $why}"
    fi
}

say "cases:"
"$pack/tests/gpu/prog_fastpath_cuda" "$ep" quick 50 >"$out/host-fast.log" 2>&1
result host-fast $?
inside ns-fast "$pack/tests/gpu/prog_fastpath_cuda" "$ep" quick 200
result ns-fast $?
inside ns-late "$pack/tests/gpu/prog_fastpath_cuda" "$ep" stall 1000
result ns-late $?
inside ns-churn "$pack/tests/gpu/prog_fastpath_cuda" "$ep" churn 10 4
result ns-churn $?
inside ns-order env RMSNORMD_PATH=fast "$pack/tests/gpu/prog_e2e_cuda" "$ep" order 200 4242
result ns-order $?
inside ns-classic env RMSNORMD_PATH=classic "$pack/tests/gpu/prog_e2e_cuda" "$ep" order 20 4242
result ns-classic $?
inside ns-vmm "$pack/tests/gpu/prog_vmm_cuda" "$ep" results
result ns-vmm $?

# flood: async calls until killed; "running" once the first ones passed.
inside ns-vmm-fast timeout -s KILL 3 "$pack/tests/gpu/prog_vmm_cuda" "$ep" flood
if grep -q running "$out/ns-vmm-fast.log" && ! grep -q FAIL "$out/ns-vmm-fast.log"; then
    say "  ns-vmm-fast: PASS (calls ran for 3 s, then the process was killed)"
else
    result ns-vmm-fast 1
fi

# kill -9 with calls pending behind a 3 s producer: the namespace's first
# process dies, and with it every process of the namespace.
died0=$(counter clients.died)
unshare "${nsflags[@]}" -- bash -c '
    mount -t tmpfs -o size=512m,mode=1777 tmpfs /dev/shm || exit 90
    exec "$@"' inside "$pack/tests/gpu/prog_fastpath_cuda" "$ep" hold 3000 >"$out/ns-kill.log" 2>&1 &
upid=$!
for _ in $(seq 600); do grep -q pending "$out/ns-kill.log" && break; sleep 0.1; done
# (--kill-child: the namespace's first process gets SIGKILL when unshare dies)
kill -KILL "$upid" 2>/dev/null
wait "$upid" 2>/dev/null
ok=0
for _ in $(seq 300); do
    [ "$(counter clients.died)" -gt "$died0" ] && [ "$(counter sessions.active)" -le 1 ] &&
        [ "$(counter regions.active)" = 0 ] && { ok=1; break; }
    sleep 0.1
done
ctl health -q >/dev/null 2>&1; h=$?
if [ $ok = 1 ] && [ $h -le 1 ]; then
    say "  ns-kill: PASS (session released, health $h)"
else
    say "  ns-kill: FAIL (clients.died $(counter clients.died), sessions.active $(counter sessions.active), regions.active $(counter regions.active), health $h)"
fi

say "pids (daemon log): a namespaced client's HELLO claim, then the verified peer:"
# The second 'fast' session is ns-fast's (the first is host-fast's).
sid=$(grep "opened for 'fast'" "$out/daemon.log" | sed -n 2p | awk '{print $4}')
[ -n "$sid" ] && grep -E "Session $sid (opened|authenticated)" "$out/daemon.log" | cut -c1-160 |
    tee -a "$out/summary.txt"
say "classic path in the namespaces, the error reported:"
grep -m2 -E "events|EVENTS|FAIL" "$out/ns-classic.log" | cut -c1-240 | tee -a "$out/summary.txt"
say "closes: done $(counter closes.done), pending $(counter closes.pending), longest wait $(counter closes.wait_max_us) us"
ctl health >"$out/health.txt" 2>&1; say "health at the end: $(head -1 "$out/health.txt")"
say "logs: $out"
