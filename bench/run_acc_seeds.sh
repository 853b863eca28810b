#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# dx's accuracy of each bench_kernel.NAME in DIR (bench/build_variants.sh
# makes them) on K seeds of fresh inputs (bench/acc_model.py --write: 4096 x
# 256, 1024, 4096 and 8192, fp32 and bf16 weight; 4096 x 256's are the
# model's own), one variant after another on the same inputs:
#   bench/run_acc_seeds.sh DIR OUT [K]      (K defaults to 4)
# Writes OUT/acc.csv (seed, m, n, w, variant, worst ulp, fraction beyond
# 1 ulp) and prints, per shape and weight, each variant's median and largest
# worst element over the seeds and the seeds beyond 1 ulp (OUT/acc.txt).
# Needs python3 with numpy; about 10 s a seed and variant on an H100 host.
set -uo pipefail
dir=${1:?usage: run_acc_seeds.sh DIR OUT [K]}
out=${2:?usage: run_acc_seeds.sh DIR OUT [K]}
k=${3:-4}
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"
echo "seed,m,n,w,variant,max_ulp,frac_over1" >"$out/acc.csv"
for ((s = 0; s < k; s++)); do
    d=$out/inputs
    rm -rf "$d"
    python3 "$here/acc_model.py" --write "$d" --seed "$s" || exit 1
    for b in "$dir"/bench_kernel.*; do
        name=${b##*.}
        if ! "$b" --accuracy "$d" >"$out/$name-$s.log" 2>&1; then
            echo "$name: seed $s: exit $? (see $out/$name-$s.log)" >&2
            continue
        fi
        tail -n +2 "$d/acc_ours.csv" | awk -F, -v s="$s" -v v="$name" \
            'BEGIN { OFS = "," } { print s, $1, $2, $3, v, $5, $6 }' >>"$out/acc.csv"
    done
done
rm -rf "$out/inputs"
python3 - "$out/acc.csv" <<'PY' | tee "$out/acc.txt"
import csv, statistics, sys
rows = list(csv.DictReader(open(sys.argv[1])))
names = sorted({r["variant"] for r in rows})
by = {}
for r in rows:
    by.setdefault((int(r["n"]), r["w"]), {}).setdefault(r["variant"], []).append(
        float(r["max_ulp"]))
print("worst dx element over the seeds, bf16 ulps: median / largest / seeds beyond 1 ulp")
print(f"{'shape':>14} " + " ".join(f"{nm:>22}" for nm in names))
for (n, w), v in sorted(by.items()):
    cells = []
    for nm in names:
        u = v.get(nm, [])
        cells.append(f"{statistics.median(u):7.3f} {max(u):7.3f} {sum(x > 1 for x in u):2d}/{len(u):<2d}"
                     if u else f"{'-':>22}")
    print(f"{'4096x%d %s' % (n, w):>14} " + " ".join(f"{c:>22}" for c in cells))
PY
