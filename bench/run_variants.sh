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
set -uo pipefail
dir=${1:?usage: run_variants.sh DIR OUT [ARGS...]}
out=${2:?usage: run_variants.sh DIR OUT [ARGS...]}
shift 2
args=("$@")
[ ${#args[@]} -eq 0 ] && args=(--quick)
mkdir -p "$out"
names=()
for b in "$dir"/bench_kernel.*; do
    name=${b##*.}
    names+=("$name")
    mkdir -p "$out/$name"
    ${RV_TIMEOUT:+timeout -k 5 "$RV_TIMEOUT"} "$b" --out "$out/$name" "${args[@]}" >"$out/$name.log" 2>&1 ||
        echo "$name: exit $?"
done
python3 - "$out" "${names[@]}" <<'PY' | tee "$out/variants.txt"
import csv, math, sys
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
PY
