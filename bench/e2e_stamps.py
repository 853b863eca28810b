#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Where a fast-path call's GPU time goes: bench_e2e_cuda's hop loop through
the daemon, its client's producer and consumer stamps (RN_E2E_STAMPS=CLIENT)
set beside the daemon's stamps just before and after its kernel
(RMSNORMD_DEBUG_STAMPS=DAEMON; daemon/cuda/stamps.c).  All stamps are the
GPU's %globaltimer, one clock for every process.  Per shape, the hop loop's
calls are the last ITERS lines of that shape in each file, in order: the hop
loop is a shape's last run of calls in the daemon, and its client appends
(a client file kept over several runs, or one with the classic path's run
before the fast path's, still ends with the last run's fast-path calls).

Prints per shape the p50 / p90 in us of
  to kernel    producer stamp -> the daemon's stamp before its kernel
               (the producer's end, ready, the daemon's wait and start)
  kernel       the daemon's two stamps (its kernel and one stamp kernel)
  back         the daemon's stamp after its kernel -> consumer stamp
               (the done words, the client's wait, its consumer's start;
               negative when the consumer started before the stamp kernel:
               the kernel writes done itself, RMSNORMD_DEBUG_KERNEL_DONE)
  span         producer -> consumer

Usage: e2e_stamps.py CLIENT DAEMON [--iters ITERS] [--out FILE]
  ITERS: bench_e2e_cuda's --iters (default 300); FILE: a markdown table, appended
"""
import sys


def read(path):
    rows = []
    with open(path) as f:
        for line in f:
            p = line.split()
            if len(p) == 4:
                rows.append((int(p[0]), int(p[1]), int(p[2]), int(p[3])))
    return rows


def pct(v, q):
    v = sorted(v)
    return v[min(len(v) - 1, int(q * (len(v) - 1) + 0.5))] / 1000.0


def main(argv):
    if len(argv) < 3:
        print("\n".join(__doc__.strip().splitlines()[-2:]), file=sys.stderr)
        return 2
    client, daemon = read(argv[1]), read(argv[2])
    out = argv[argv.index("--out") + 1] if "--out" in argv else None
    iters = int(argv[argv.index("--iters") + 1]) if "--iters" in argv else 300
    shapes = []
    for m, n, _, _ in client:
        if (m, n) not in shapes:
            shapes.append((m, n))
    lines = ["| shape | calls | to kernel p50 / p90 us | kernel p50 / p90 us | back p50 / p90 us "
             "| span p50 / p90 us |", "|---|---|---|---|---|---|"]
    for m, n in shapes:
        c = [r for r in client if (r[0], r[1]) == (m, n)][-iters:]
        d = [r for r in daemon if (r[0], r[1]) == (m, n)][-iters:]
        if len(c) < iters or len(d) < iters:
            print("%dx%d: %d client calls and %d daemon stamps, %d wanted (--iters)"
                  % (m, n, len(c), len(d), iters), file=sys.stderr)
            return 1
        to = [dd[2] - cc[2] for cc, dd in zip(c, d)]
        kern = [dd[3] - dd[2] for dd in d]
        back = [cc[3] - dd[3] for cc, dd in zip(c, d)]
        span = [cc[3] - cc[2] for cc in c]
        # (back may be negative: the kernel writes the done words itself,
        # so the consumer may start before the daemon's stamp after it)
        if min(to) < 0:
            print("%dx%d: a daemon stamp outside its call's (the join is off)" % (m, n),
                  file=sys.stderr)
            return 1
        lines.append("| %dx%d | %d | %.2f / %.2f | %.2f / %.2f | %.2f / %.2f | %.2f / %.2f |" % (
            m, n, len(c), pct(to, .5), pct(to, .9), pct(kern, .5), pct(kern, .9),
            pct(back, .5), pct(back, .9), pct(span, .5), pct(span, .9)))
    print("\n".join(lines))
    if out:
        with open(out, "a") as f:
            f.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
