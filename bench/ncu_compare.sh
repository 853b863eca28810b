#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# ncu of our fused kernel and of Quack's rmsnorm_bwd on the same shapes, side
# by side, on a GPU host (one device command; Quack importable as
# bench/run_kernel_quack.sh installs it, else only ours is profiled):
#   bench/ncu_compare.sh BUILD OUT [M N ...]       (default 65536 2048 65536 1024)
# BUILD holds bench/bench_kernel (make BUILD=... NVCCFLAGS=-DRNK_BENCH_VARIANTS=1
# BUILD/bench/bench_kernel, or a bench_kernel.NAME of build_variants.sh given as
# BUILD=FILE).  bf16 x/dy/dx, fp32 weight, rstd given.  Prints one table of
# the metrics that say where a memory-bound kernel loses: time, DRAM and L2
# throughput, instructions issued per element, issue rate, warps a SM,
# registers, shared memory, the top stall reasons, and the bytes read from
# and written to DRAM against the least the problem needs (x and dy read,
# dx written: M x N x 2 bytes each, rstd's 4 M read); OUT/NAME-MxN.ncu.txt
# keep ncu's full reports.  NC_SOURCE=1: each kernel also profiled for its
# stalls by instruction (SourceCounters): OUT/NAME-MxN.src.csv.gz (ncu's
# source page, SASS) and bench/ncu_source.py's summary of it printed after
# the table (where the warps wait, and why).
set -u
build=${1:?usage: ncu_compare.sh BUILD OUT [M N ...]}
out=${2:?usage: ncu_compare.sh BUILD OUT [M N ...]}
shift 2
shapes=("$@")
[ ${#shapes[@]} -eq 0 ] && shapes=(65536 2048 65536 1024)
bk=$build
[ -d "$build" ] && bk=$build/bench/bench_kernel
mkdir -p "$out"
here=$(cd "$(dirname "$0")" && pwd)
metrics=gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,\
lts__t_sectors.avg.pct_of_peak_sustained_elapsed,smsp__inst_executed.sum,\
smsp__issue_active.avg.pct_of_peak_sustained_active,sm__warps_active.avg.per_cycle_active,\
launch__registers_per_thread,launch__shared_mem_per_block_dynamic,launch__grid_size,\
launch__block_size,smsp__average_warp_latency_issue_stalled_long_scoreboard.ratio,\
smsp__average_warp_latency_issue_stalled_barrier.ratio,\
smsp__average_warp_latency_issue_stalled_short_scoreboard.ratio,\
smsp__average_warp_latency_issue_stalled_wait.ratio,smsp__average_warp_latency_issue_stalled_no_instruction.ratio,\
dram__bytes_read.sum,dram__bytes_write.sum
ncu_one() { # NAME M N KERNEL_REGEX COMMAND...
    local name=$1 m=$2 n=$3 k=$4; shift 4
    local base=$out/$name-${m}x$n
    timeout 240 ncu --clock-control none --print-units base --metrics "$metrics" --kernel-name "regex:$k" \
        --launch-skip 3 --launch-count 1 --csv --page raw "$@" >"$base.ncu.txt" 2>&1
    [ "${NC_SOURCE:-0}" = 1 ] || return 0
    timeout 240 ncu --clock-control none --kernel-name "regex:$k" --launch-skip 3 --launch-count 1 \
        --section SourceCounters --section WarpStateStats -f -o "$base" "$@" >"$base.src.log" 2>&1 &&
        ncu --import "$base.ncu-rep" --page source --print-source sass --csv 2>>"$base.src.log" |
        gzip >"$base.src.csv.gz"
    rm -f "$base.ncu-rep"
}
# Quack's side: a script file, not a heredoc on ncu_one's stdin, which the
# first of ncu_one's two runs would read up and leave the second (NC_SOURCE)
# nothing to run.
quack_py=
if python3 -c 'import quack.rmsnorm' 2>/dev/null; then
    quack_py=$out/quack_one.py
    cat >"$quack_py" <<'PY'
import sys, torch
from quack.rmsnorm import rmsnorm_bwd
m, n = int(sys.argv[1]), int(sys.argv[2])
g = torch.Generator(device="cuda").manual_seed(1)
x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16, generator=g)
dy = torch.randn(m, n, device="cuda", dtype=torch.bfloat16, generator=g)
w = 1 + 0.3 * torch.randn(n, device="cuda", generator=g)
rstd = torch.rsqrt(x.float().square().mean(1) + 1e-6)
for _ in range(6):
    rmsnorm_bwd(x, w, dy, rstd)
torch.cuda.synchronize()
PY
fi
while [ ${#shapes[@]} -ge 2 ]; do
    m=${shapes[0]} n=${shapes[1]}
    shapes=("${shapes[@]:2}")
    ncu_one ours "$m" "$n" 'fast_kernel|general_kernel|s_kernel' "$bk" --shape "$m,$n,f32" --reps 8
    if [ -n "$quack_py" ]; then
        ncu_one quack "$m" "$n" 'RMSNorm|[Rr]ms[Nn]orm' python3 "$quack_py" "$m" "$n"
    fi
done
python3 "$here/ncu_table.py" "$out"
if [ "${NC_SOURCE:-0}" = 1 ]; then
    for f in "$out"/*.src.csv.gz; do
        if [ -s "$f" ]; then python3 "$here/ncu_source.py" "$f" 8; fi
    done
fi
