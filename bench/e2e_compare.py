#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Medians of repeated bench_e2e_cuda runs, builds side by side.

tests/gpu/e2e_run.sh with E2E_ROUNDS=R runs each build's benchmark R times,
alternating the order every round (ABBA), and leaves the logs as
bench-NAME-rROUND.log.  Run-to-run noise of one round is 10-25 % on host
times, so a before/after comparison within a few per cent needs the median
over rounds.  Usage: bench/e2e_compare.py OUT_DIR BASE_NAME [OTHER_NAME...]
Prints, per shape and metric, each build's median (and spread: min-max over
rounds) and the ratio of each other build to the first one.
"""
import glob
import os
import re
import statistics
import sys

SHAPE_METRICS = ["inproc_us", "daemon_us", "ratio", "host_p50_us", "paced_host_p50_us", "ping_p50_us", "hop_p50_us"]


def fields(line):
    # Numbers only: a point whose clients failed prints "-nan" or "-", and
    # is left out of the medians (the count n says how many rounds remain).
    return {k: v for k, v in re.findall(r"(\w+)=([-+0-9.naif]+)", line)
            if re.fullmatch(r"-?[0-9]+(\.[0-9]*)?", v)}


def fmt(v):
    return "%.0f" % v if v >= 1000 else "%.1f" % v if v >= 100 else "%.3f" % v


def parse(path):
    rows = {}
    with open(path) as f:
        for line in f:
            if line.startswith("shape "):
                d = fields(line)
                key = "%sx%s" % (d["m"], d["n"])
                for m in SHAPE_METRICS:
                    if m in d:
                        rows[(key, m)] = float(d[m])
            elif line.startswith("K="):
                d = fields(line)
                for m in ("calls_per_s", "host_p50_us"):
                    if m in d and float(d[m]) > 0:
                        rows[("K=%s" % d["K"], m)] = float(d[m])
    return rows


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    out, names = sys.argv[1], sys.argv[2:]
    data = {}
    for n in names:
        runs = [parse(p) for p in sorted(glob.glob(os.path.join(out, "bench-%s-r*.log" % n)))]
        runs = [r for r in runs if r]
        if not runs:
            sys.exit("no logs for %s in %s" % (n, out))
        data[n] = runs
    keys = []
    for runs in data.values():
        for r in runs:
            keys += [k for k in r if k not in keys]
    head = "%-12s %-18s" % ("shape", "metric")
    for n in names:
        head += " %24s" % ("%s (n=%d)" % (n, len(data[n])))
    for n in names[1:]:
        head += " %10s" % ("%s/%s" % (n, names[0]))[:10]
    print(head)
    for k in keys:
        line = "%-12s %-18s" % k
        med = {}
        for n in names:
            vals = [r[k] for r in data[n] if k in r]
            if not vals:
                line += " %24s" % "-"
                continue
            med[n] = statistics.median(vals)
            cell = "%s [%s-%s]" % (fmt(med[n]), fmt(min(vals)), fmt(max(vals)))
            if len(vals) < len(data[n]):
                cell += " n=%d" % len(vals)
            line += " %24s" % cell
        for n in names[1:]:
            if n in med and names[0] in med and med[names[0]]:
                line += " %10.3f" % (med[n] / med[names[0]])
            else:
                line += " %10s" % "-"
        print(line)


if __name__ == "__main__":
    main()
