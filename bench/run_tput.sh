#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# K = 1, 2, 4, 8 clients through the daemon against the same clients with
# the kernel linked in (bench_e2e_cuda --tput-only), under MPS, in one
# device command of one to two minutes: issue 14's "calls per second scale with
# K until the GPU is busy", where the daemon stays at about a third of
# in-process at 4096x256 and not because of its loop (bench/RESULTS.md,
# 2026-12-06).  What is left to tell apart: the daemon's streams waiting on
# its clients' ready words on CUDA's 8 hardware queues a process (armed
# mode, the default under MPS, queues those waits; host mode does not), and
# everything else a daemon call has (the two hops, the completions).  So
# six configurations take turns, two rounds (the second in reverse order):
#   armed     the default under MPS
#   gpu       --ring-ready=gpu: every slot's wait on the GPU, no gate, no
#             revocations (what armed adds to plain GPU waits)
#   host      --ring-ready=host: no stream of the daemon waits on a client
#   armed16   armed, the daemon alone with CUDA_DEVICE_MAX_CONNECTIONS=16
#   host16    host, the same
#   inproc    the kernel in each client, no daemon (the ceiling)
# TP_ROWS="NAME ..." runs those instead (each once, in that order), from the
# six and:
#   idev      in-process, each call with the stream memory operations of a
#             daemon call on the client's own stream (write and wait on two
#             words in device memory: RN_E2E_INPROC_WORDS, e2e_client.c)
#   ihost     the same, the words in mapped pinned host memory
#   NAME@DxK  D instances of NAME's bench at once, K clients each (D
#             daemons for a daemon row): whether the rate is a daemon
#             process's; the summary adds up their "together" rates.
# Usage: bench/run_tput.sh BUILD OUT [M,N] (default 4096,256; BUILD a build
# or a pack of one, tests/gpu/pack_build.sh); LD_LIBRARY_PATH for the
# runtime libraries.  Writes OUT/tput.md (the rows, labelled), OUT/summary.txt
# and OUT/logs.tgz.  TP_ITERS: calls a client (3000; 30000 for NAME@DxK rows,
# so that the instances overlap).
set -u
build=${1:?usage: run_tput.sh BUILD OUT [M,N]}
out_final=${2:?usage: run_tput.sh BUILD OUT [M,N]}
shape=${3:-4096,256}
here=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "$build" && pwd)
# shellcheck source=tests/gpu/run_lib.sh
. "$here/tests/gpu/run_lib.sh"
run_dirs "$out_final"
# The daemon alone with more hardware queues: its clients keep CUDA's 8.
wrap=$out/rmsnormd-16
printf '#!/bin/sh\nCUDA_DEVICE_MAX_CONNECTIONS=16 exec %s "$@"\n' "$build/rmsnormd" >"$wrap"
chmod +x "$wrap"
bench() { # NAME LABEL ITERS [ARGS...]: one bench_e2e_cuda run of configuration NAME
    local name=$1 label=$2 iters=$3 daemon=$build/rmsnormd words=
    shift 3
    local args=("$@")
    case $name in
    host | host16) args+=(--daemon-arg --ring-ready=host) ;;
    gpu) args+=(--daemon-arg --ring-ready=gpu) ;;
    inproc) args+=(--tput-inproc) ;;
    idev | ihost) args+=(--tput-inproc) words=${name#i} ;;
    esac
    case $name in *16) daemon=$wrap ;; esac
    RN_E2E_INPROC_WORDS=$words timeout -k 5 90 "$build/bench/bench_e2e_cuda" \
        --daemon "$daemon" --fast-only --tput-only --tput-shape "$shape" \
        --iters "$iters" --label "$label" --out "$out_final/tput.md" "${args[@]}"
}
together() { # LOG...: the sum of their K rows' together_per_s
    grep -h '^K=' "$@" | sed 's/.*together_per_s=\([0-9]*\).*/\1/' | awk '{s += $1} END {print s + 0}'
}
row() { # NAME or NAME@DxK
    local name=$1
    case $name in
    *@*x*)
        local base=${name%@*} d=${name#*@}
        local k=${d#*x} logs=() pids=()
        d=${d%x*}
        for i in $(seq 1 "$d"); do
            logs+=("$out/$name-$i-$SECONDS.log")
            bench "$base" "$name.$i" "${TP_ITERS:-30000}" --ks "$k" >"${logs[-1]}" 2>&1 &
            pids+=($!)
        done
        local t0=$SECONDS rc=0
        for p in "${pids[@]}"; do wait "$p" || rc=$?; done
        printf '%-34s rc=%-3s %4ss  together (sum) %s calls/s\n' "$name $shape" "$rc" \
            $((SECONDS - t0)) "$(together "${logs[@]}")" >>"$summary_file"
        ;;
    *) step "$name $shape" "$name-$SECONDS.log" bench "$name" "$name" "${TP_ITERS:-3000}" ;;
    esac
}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >>"$summary_file" 2>&1
if ! mps_start tput; then
    echo "MPS did not start" >>"$summary_file"
    exit 1
fi
for name in ${TP_ROWS:-armed gpu host armed16 host16 inproc inproc host16 armed16 host gpu armed}; do
    row "$name"
done
mps_stop tput
tar -czf "$out_final/logs.tgz" -C "$out_final" logs && rm -rf "$out"
cat "$summary_file"
grep -F '| K=' "$out_final/tput.md" | cut -d'|' -f2-4,9
