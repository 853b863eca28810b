#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Where a kernel's warps stall, instruction by instruction, from ncu's
source page (ncu --import REP --page source --print-source sass --csv,
which bench/ncu_compare.sh writes with NC_SOURCE=1): the warp samples in
all, then the TOP instructions with the most samples, each with its share
and its stall reasons (the sampled ones, largest first).
Usage: bench/ncu_source.py FILE.csv[.gz] [TOP]"""
import csv
import gzip
import sys


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    path = sys.argv[1]
    top = int(sys.argv[2]) if len(sys.argv) > 2 else 12
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", newline="") as f:
        rows = list(csv.reader(f))
    # The first row names the kernel; the header is the row with "Source".
    h = next((i for i, r in enumerate(rows) if len(r) > 2 and r[1] == "Source"), None)
    if h is None:
        print(f"{path}: no source page (see the .src.log beside it)")
        return
    hdr, data = rows[h], [r for r in rows[h + 1:] if len(r) == len(rows[h])]
    col = {name: i for i, name in enumerate(hdr)}
    samp = col["Warp Stall Sampling (All Samples)"]
    reasons = [n for n in hdr if n.startswith("stall_") and "Not Issued" not in n]

    def num(r, i):
        try:
            return int(r[i])
        except ValueError:
            return 0

    total = sum(num(r, samp) for r in data)
    print(f"{' '.join(rows[0][1:2])}: {total} warp samples, {len(data)} instructions")
    for r in sorted(data, key=lambda r: -num(r, samp))[:top]:
        n = num(r, samp)
        why = sorted(((num(r, col[x]), x[6:]) for x in reasons), reverse=True)
        why = ", ".join(f"{w} {c}" for c, w in why[:3] if c)
        print(f"  {100.0 * n / max(total, 1):5.1f} %  {r[0][-6:]}  {r[1].strip()[:56]:56}  {why}")


if __name__ == "__main__":
    main()
