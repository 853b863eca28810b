#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Graph capture on the fast path (PROTOCOL.md 13.8) and a stream per ring,
# on a GPU host, without and with MPS: test_graph_cuda (two clients, 1000
# replays each, bitwise against eager), test_fastpath_cuda (the ring, now on
# streams of its own), test_watch_cuda (the daemon killed under a waiting
# stream or replay; without MPS only) and python/tests/test_torch_graph.py
# where PyTorch is installed.  Build where nvcc is, pack with tests/gpu/pack_build.sh, then
# from the repository root (LD_LIBRARY_PATH with the runtime libraries):
#   tests/gpu/graph_run.sh PACK OUT
# Logs go to OUT; the last lines summarise each step.
set -u
pack=${1:?usage: graph_run.sh PACK OUT}
out=${2:?usage: graph_run.sh PACK OUT}
mkdir -p "$out"
export RN_BUILD=$(realpath "$pack")
summary=()
. "$(dirname "$0")/run_lib.sh"
pytests() {
    if python3 -c 'import torch' 2>/dev/null; then
        step "test_torch_graph.py ($1)" "torch-graph-$1.log" env \
            RMSNORMD_LIBCLIENT="$RN_BUILD/librmsnorm_client.so.0" PYTHONPATH="$PWD/python" \
            timeout 500 python3 -m pytest -q python/tests/test_torch_graph.py
    else
        summary+=("test_torch_graph.py ($1): skipped, no PyTorch for python3")
    fi
}

"$pack/tests/gpu/prog_probe" | tee "$out/gpu.txt"
step "test_graph_cuda (no MPS)" graph-nomps.log timeout 300 "$pack/tests/gpu/test_graph_cuda"
step "test_fastpath_cuda (no MPS)" fast-nomps.log env RN_SKIP_TESTS='test_kill9*' \
    timeout 300 "$pack/tests/gpu/test_fastpath_cuda"
# The daemon killed under a waiting stream (libclient's watcher); not under MPS.
step "test_watch_cuda (no MPS)" watch-nomps.log timeout 300 "$pack/tests/gpu/test_watch_cuda"
pytests nomps
if mps_start graph; then
    step "test_graph_cuda (MPS)" graph-mps.log env RN_EXPECT_MPS=1 timeout 300 \
        "$pack/tests/gpu/test_graph_cuda"
    step "test_fastpath_cuda (MPS)" fast-mps.log env RN_EXPECT_MPS=1 \
        RN_SKIP_TESTS='test_kill9*' timeout 300 "$pack/tests/gpu/test_fastpath_cuda"
    pytests mps
    mps_stop graph
else
    summary+=("MPS: nvidia-cuda-mps-control -d failed")
fi
printf '%s\n' "${summary[@]}" | tee "$out/summary.txt"
