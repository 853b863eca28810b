#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""The table of bench/ncu_compare.sh: one row a (implementation, shape) from
ncu's raw CSV pages in OUT/*.ncu.txt.  Usage: bench/ncu_table.py OUT"""
import csv
import glob
import io
import os
import re
import sys

COLS = [
    ("gpu__time_duration.sum", "us", 1e-3),
    ("dram__throughput.avg.pct_of_peak_sustained_elapsed", "dram%", 1),
    ("lts__t_sectors.avg.pct_of_peak_sustained_elapsed", "l2%", 1),
    ("smsp__issue_active.avg.pct_of_peak_sustained_active", "issue%", 1),
    ("sm__warps_active.avg.per_cycle_active", "warps/SM", 1),
    ("launch__registers_per_thread", "regs", 1),
    ("launch__shared_mem_per_block_dynamic", "smemKB", 1 / 1024),
    ("launch__grid_size", "grid", 1),
    ("launch__block_size", "block", 1),
    ("smsp__average_warp_latency_issue_stalled_long_scoreboard.ratio", "st:lsb", 1),
    ("smsp__average_warp_latency_issue_stalled_barrier.ratio", "st:bar", 1),
    ("smsp__average_warp_latency_issue_stalled_short_scoreboard.ratio", "st:ssb", 1),
    ("smsp__average_warp_latency_issue_stalled_wait.ratio", "st:wait", 1),
    ("dram__bytes_read.sum", "rd MB", 1e-6),
    ("dram__bytes_write.sum", "wr MB", 1e-6),
]


def rows(path):
    text = open(path, errors="replace").read()
    start = text.find('"ID"')
    if start < 0:
        return []
    rd = list(csv.reader(io.StringIO(text[start:])))
    head, body = rd[0], [r for r in rd[2:] if len(r) == len(rd[0])]
    return [dict(zip(head, r)) for r in body]


def num(v):
    try:
        return float(str(v).replace(",", ""))
    except ValueError:
        return float("nan")


def main():
    out = sys.argv[1]
    print(f"{'impl':>6} {'shape':>12} " + " ".join(f"{c[1]:>8}" for c in COLS) +
          f" {'inst/elem':>9} {'rd/least':>8} {'wr/least':>8}")
    for path in sorted(glob.glob(os.path.join(out, "*.ncu.txt"))):
        m = re.match(r"(\w+)-(\d+)x(\d+)\.ncu\.txt", os.path.basename(path))
        if not m:
            continue
        name, mm, nn = m.group(1), int(m.group(2)), int(m.group(3))
        rs = rows(path)
        if not rs:
            print(f"{name:>6} {mm:>6}x{nn:<5} (no kernel profiled; see {path})")
            continue
        for r in rs:
            cells = [num(r.get(k, "nan")) * s for k, _, s in COLS]
            inst = num(r.get("smsp__inst_executed.sum", "nan")) * 32 / (mm * nn)
            # The least DRAM traffic of the problem (bf16 rows): x and dy
            # read with rstd, dx written; the weight and dw's partials are
            # small beside them.
            rd = num(r.get("dram__bytes_read.sum", "nan")) / (2 * mm * nn * 2 + 4 * mm)
            wr = num(r.get("dram__bytes_write.sum", "nan")) / (mm * nn * 2)
            print(f"{name:>6} {mm:>6}x{nn:<5} " + " ".join(f"{c:8.1f}" for c in cells) +
                  f" {inst:9.2f} {rd:8.3f} {wr:8.3f}  {r.get('Kernel Name', '')[:40]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
