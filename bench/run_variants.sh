#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Run every bench_kernel.NAME in DIR (bench/build_variants.sh makes them) on
# the same GPU, one after the other, each with ARGS (default --quick), and
# print their fused times side by side.  Usage:
#   bench/run_variants.sh DIR OUT [ARGS...]
# Writes OUT/NAME/kernel.csv and OUT/NAME.log for each, OUT/variants.txt.
# RV_TIMEOUT=S stops a benchmark that runs longer than S seconds (a variant
# that hangs must not take the others' time); the first NAME in glob order
# is the one the others are compared with.
# RV_TESTS=1 first runs DIR/NAME/tests/gpu/test_kernel_gpu of each variant
# (build_variants.sh with TESTS=1; dw bit for bit against the CPU twin):
# OUT/NAME-tests.log, its result in OUT/variants.txt.
# RV_SHAPES="M,N,w ..." then runs each shape with every variant in turn and
# back (NAME1 .. NAMEk NAMEk .. NAME1; RV_ROUNDS times, default 1):
# OUT/shapes.csv (variant, round, m, n, w, bytes, fused us) and each
# variant's speed over the first, the median of its runs, in
# OUT/variants.txt.  RV_GRID_ROUNDS=R then runs the full grid (all 60
# shapes, a few seconds a variant) R times, the variants in turn and back
# each round: OUT/grid/NAME-ROUND/kernel.csv, and in OUT/variants.txt each
# variant's speed over the first by shape (the median of its rounds), its
# geomean and its worst and best shapes.  RV_BUDGET=S stops starting new
# runs after S seconds.
set -uo pipefail
dir=${1:?usage: run_variants.sh DIR OUT [ARGS...]}
out=${2:?usage: run_variants.sh DIR OUT [ARGS...]}
shift 2
args=("$@")
[ ${#args[@]} -eq 0 ] && args=(--quick)
mkdir -p "$out"
names=()
for b in "$dir"/bench_kernel.*; do
    names+=("${b##*.}")
done
deadline=$((SECONDS + ${RV_BUDGET:-100000}))
: >"$out/tests.txt"
if [ "${RV_TESTS:-0}" = 1 ]; then
    for name in "${names[@]}"; do
        t=$dir/$name/tests/gpu/test_kernel_gpu
        if [ ! -x "$t" ]; then
            echo "$name: no $t (build_variants.sh with TESTS=1)" >>"$out/tests.txt"
            continue
        fi
        timeout -k 5 "${RV_TIMEOUT:-300}" "$t" >"$out/$name-tests.log" 2>&1
        echo "$name: test_kernel_gpu exit $? $(grep -hE '^\[  (PASSED|FAILED)  \]' \
            "$out/$name-tests.log" | tr '\n' ' ')" >>"$out/tests.txt"
    done
fi
for name in "${names[@]}"; do
    mkdir -p "$out/$name"
    ${RV_TIMEOUT:+timeout -k 5 "$RV_TIMEOUT"} "$dir/bench_kernel.$name" --out "$out/$name" \
        "${args[@]}" >"$out/$name.log" 2>&1 || echo "$name: exit $?"
done
: >"$out/shapes.csv"
back=() # (the variants in reverse, for the runs in turn and back)
for ((i = ${#names[@]} - 1; i >= 0; i--)); do back+=("${names[i]}"); done
if [ -n "${RV_SHAPES:-}" ]; then
    i=0
    for ((r = 1; r <= ${RV_ROUNDS:-1}; r++)); do
        for shape in $RV_SHAPES; do
            for name in "${names[@]}" "${back[@]}"; do
                [ $SECONDS -ge $deadline ] && break 3
                i=$((i + 1))
                d=$out/shapes/$i
                mkdir -p "$d"
                ${RV_TIMEOUT:+timeout -k 5 "$RV_TIMEOUT"} "$dir/bench_kernel.$name" --out "$d" \
                    --shape "$shape" >"$d/log" 2>&1 &&
                    tail -n +2 "$d/kernel.csv" | cut -d, -f1-5 | sed "s/^/$name,$r,/" >>"$out/shapes.csv"
            done
        done
    done
fi
if [ -n "${RV_GRID_ROUNDS:-}" ]; then
    for ((r = 1; r <= RV_GRID_ROUNDS; r++)); do
        order=("${names[@]}")
        [ $((r % 2)) = 0 ] && order=("${back[@]}")
        for name in "${order[@]}"; do
            [ $SECONDS -ge $deadline ] && break 2
            d=$out/grid/$name-$r
            mkdir -p "$d"
            ${RV_TIMEOUT:+timeout -k 5 "$RV_TIMEOUT"} "$dir/bench_kernel.$name" --out "$d" \
                >"$d/log" 2>&1 || echo "$name: grid round $r: exit $?"
        done
    done
fi
python3 - "$out" "${names[@]}" <<'PY' | tee "$out/variants.txt"
import csv, glob, math, os, statistics, sys
out, names = sys.argv[1], sys.argv[2:]
rows = {}
for nm in names:
    try:
        for r in csv.DictReader(open(f"{out}/{nm}/kernel.csv")):
            rows.setdefault((int(r["m"]), int(r["n"]), r["w"]), {})[nm] = (
                float(r["fused_us"]), float(r["separate_us"]), float(r["atomic_us"]))
    except OSError:
        print(f"{nm}: no kernel.csv")
print("fused us per variant (sep/atom of the first variant in parentheses)")
print(f"{'M':>6} {'N':>5} {'w':>4} " + " ".join(f"{nm:>9}" for nm in names))
lg = {nm: [] for nm in names}
for key in sorted(rows):
    v = rows[key]
    cells = []
    for nm in names:
        cells.append(f"{v[nm][0]:9.2f}" if nm in v else f"{'-':>9}")
        if nm in v and names[0] in v:
            lg[nm].append(math.log(v[names[0]][0] / v[nm][0]))
    print(f"{key[0]:6d} {key[1]:5d} {key[2]:>4} " + " ".join(cells))
print("geomean speed over " + names[0] + ": " +
      " ".join(f"{nm}={math.exp(sum(l) / len(l)):.3f}" for nm, l in lg.items() if l))
tests = open(f"{out}/tests.txt").read()
if tests:
    print(tests, end="")
runs = {}
for row in csv.reader(open(f"{out}/shapes.csv")):
    nm, _, m, n, w, _, us = row
    runs.setdefault((int(m), int(n), w), {}).setdefault(nm, []).append(float(us))
if runs:
    print(f"shapes in turn and back: {names[0]}'s us (median), each variant's speed over it")
    print(f"{'M':>6} {'N':>5} {'w':>4} {names[0]:>9} " + " ".join(f"{nm:>9}" for nm in names[1:]))
    for key in sorted(runs):
        v = runs[key]
        if names[0] not in v:
            continue
        b = statistics.median(v[names[0]])
        cells = [f"{b / statistics.median(v[nm]):9.3f}" if nm in v else f"{'-':>9}"
                 for nm in names[1:]]
        print(f"{key[0]:6d} {key[1]:5d} {key[2]:>4} {b:9.2f} " + " ".join(cells))
grid = {}
for f in glob.glob(f"{out}/grid/*/kernel.csv"):
    nm = os.path.basename(os.path.dirname(f)).rsplit("-", 1)[0]
    for r in csv.DictReader(open(f)):
        grid.setdefault((int(r["m"]), int(r["n"]), r["w"]), {}).setdefault(nm, []).append(
            float(r["fused_us"]))
if grid:
    print(f"full grid in rounds: {names[0]}'s us (median of its rounds), each variant's "
          "speed over it")
    print(f"{'M':>6} {'N':>5} {'w':>4} {names[0]:>9} " + " ".join(f"{nm:>9}" for nm in names[1:]))
    sp = {nm: [] for nm in names[1:]}
    for key in sorted(grid):
        v = grid[key]
        if names[0] not in v:
            continue
        b = statistics.median(v[names[0]])
        cells = []
        for nm in names[1:]:
            if nm in v:
                x = b / statistics.median(v[nm])
                sp[nm].append((x, key))
                cells.append(f"{x:9.3f}")
            else:
                cells.append(f"{'-':>9}")
        print(f"{key[0]:6d} {key[1]:5d} {key[2]:>4} {b:9.2f} " + " ".join(cells))
    for nm, xs in sp.items():
        if xs:
            xs.sort()
            g = math.exp(sum(math.log(x) for x, _ in xs) / len(xs))
            fmt = lambda t: f"{t[1][0]}x{t[1][1]} {t[1][2]} {t[0]:.3f}"
            print(f"{nm}: geomean {g:.3f} over {len(xs)} shapes; worst {fmt(xs[0])}, "
                  f"best {fmt(xs[-1])}")
PY
