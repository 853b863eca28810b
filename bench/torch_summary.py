#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""The compact summary of bench/run_torch.sh: reads its work directory
(bench_{mps,nomps}/bench_torch.json from bench_torch.py and
train_{mps,nomps}/{daemon1,daemon2,torch,torch2,both}.json from
gpu_cycle.py), prints the step time ratio daemon / torch per training run
pair (the pairs ran ABBA) and side by side (both.json: both models in each
worker, taking turns step by step; where present, the verdict, else the
pairs' mean), and the autograd ratios per shape, and writes all of it as
JSON.

    torch_summary.py WORKDIR RESULTS.json

Step time as compare_runs.py takes it: each worker's median after 20
warm-up steps, averaged over the workers.  Issue 14's targets (under MPS):
training demo <= 1.10x, autograd backward <= 1.3x at 4096x1024 and
<= 1.05x at 16384x4096; they are reported, not judged (exit status 0
whenever something was read).
"""

import json
import os
import statistics
import sys

WARMUP = 20
TARGETS = {"4096x1024": 1.3, "16384x4096": 1.05}
TRAIN_TARGET = 1.10
HALVES = (("mps", "MPS on"), ("nomps", "MPS off"))
# (mode, regime, column, use the loop's mean instead of the median)
COLUMNS = (("bwd", "synced", "bwd synced", False), ("bwd", "stream", "bwd stream", False),
           ("fwdbwd", "synced", "f+b synced", False), ("fwdbwd", "stream", "f+b loop", True),
           ("fwd", "synced", "fwd synced", False))


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def step_ms(run):
    n = min(len(w["step_ms"]) for w in run["workers"])
    k = WARMUP if n > WARMUP else 0
    return statistics.mean(statistics.median(w["step_ms"][k:]) for w in run["workers"])


def training(d):
    runs = {k: load(os.path.join(d, k + ".json")) for k in ("daemon1", "daemon2", "torch", "torch2")}
    pairs = []
    for dk, tk in (("daemon1", "torch"), ("daemon2", "torch2")):
        if runs[dk] and runs[tk]:
            sd, st = step_ms(runs[dk]), step_ms(runs[tk])
            pairs.append({"daemon_ms": round(sd, 3), "torch_ms": round(st, 3),
                          "ratio": round(sd / st, 3)})
    # train_mp.py --impl both: both models in each worker, taking turns
    # step by step (its ratio per worker, and their mean).
    both = load(os.path.join(d, "both.json"))
    sbs = None
    if both and both.get("side_by_side"):
        sbs = {"ratios": [round(x, 3) for x in both["side_by_side"]["ratios"]],
               "mean": round(both["side_by_side"]["mean"], 3)}
    if not pairs and not sbs:
        return None
    det = None
    if runs["daemon1"] and runs["daemon2"]:
        det = all(a["loss_bits"] == b["loss_bits"] and a["param_sha256"] == b["param_sha256"]
                  for a, b in zip(runs["daemon1"]["workers"], runs["daemon2"]["workers"]))
    first = next(r for r in list(runs.values()) + [both] if r)
    res = {"pairs": pairs, "daemon_runs_identical": det, "steps": first["args"]["steps"],
           "workers": first["args"]["workers"], "gpu": first.get("gpu")}
    if sbs:
        res["side_by_side"] = sbs
    return res


def ratios(bench):
    """{(shape, w): {impl: {column: (ratio, impl us, torch us)}}}"""
    by = {}
    for r in bench["rows"]:
        by[(r["shape"], r["w_dtype"], r["mode"], r["regime"], r["impl"])] = r
    out = {}
    for r in bench["rows"]:
        if r["impl"] == "torch":
            continue
        for mode, regime, col, loop in COLUMNS:
            if (r["mode"], r["regime"]) != (mode, regime):
                continue
            t = by.get((r["shape"], r["w_dtype"], mode, regime, "torch"))
            if t is None:
                continue
            mine, base = (r["loop_us"], t["loop_us"]) if loop else (r["median_us"], t["median_us"])
            if not mine or not base:
                continue
            cell = out.setdefault((r["shape"], r["w_dtype"]), {}).setdefault(r["impl"], {})
            cell[col] = (round(mine / base, 3), mine, base)
    return out


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: torch_summary.py WORKDIR RESULTS.json")
    work, dest = sys.argv[1], sys.argv[2]
    result = {}
    lines = []
    meta = None
    for tag, state in HALVES:
        b = load(os.path.join(work, "bench_" + tag, "bench_torch.json"))
        t = training(os.path.join(work, "train_" + tag))
        if b is None and t is None:
            continue
        meta = meta or (b or {}).get("meta")
        half = result.setdefault(tag, {})
        lines.append("== %s" % state)
        if t:
            half["training"] = t
            lines.append("training demo (%d workers, %d steps, median step after %d, ms): %s; "
                         "daemon runs bit-identical: %s"
                         % (t["workers"], t["steps"], WARMUP,
                            "; ".join("daemon %.2f / torch %.2f = %.2fx" % (p["daemon_ms"],
                                                                           p["torch_ms"], p["ratio"])
                                      for p in t["pairs"]),
                            {True: "yes", False: "NO", None: "?"}[t["daemon_runs_identical"]]))
            sbs = t.get("side_by_side")
            if sbs:
                lines.append("  side by side (both models in each worker, taking turns): "
                             "daemon / torch %.2fx (per worker %s)"
                             % (sbs["mean"], ", ".join("%.2f" % x for x in sbs["ratios"])))
            if tag == "mps":
                # The pairs ran ABBA (gpu_cycle.py): their mean cancels a
                # drift of the machine over the cycle; the worst pair alone
                # carries it.  Side by side, both see the same machine at
                # the same time: where it ran, it is the verdict.
                worst = max((p["ratio"] for p in t["pairs"]), default=float("nan"))
                mean = statistics.mean(p["ratio"] for p in t["pairs"]) if t["pairs"] else worst
                t["mean_ratio"] = round(mean, 3)
                if sbs:
                    lines.append("  target <= %.2fx: side by side %.2fx: %s (the separate runs' "
                                 "pairs: mean %.2fx, worst %.2fx)"
                                 % (TRAIN_TARGET, sbs["mean"],
                                    "met" if sbs["mean"] <= TRAIN_TARGET else "NOT met", mean,
                                    worst))
                else:
                    lines.append("  target <= %.2fx: mean of the pairs %.2fx: %s (worst pair "
                                 "%.2fx)" % (TRAIN_TARGET, mean,
                                             "met" if mean <= TRAIN_TARGET else "NOT met", worst))
        else:
            lines.append("training demo: no results")
        if b is None:
            lines.append("autograd: no results")
            continue
        lines.append("daemon's own view: MPS %s, %s backend on %s"
                     % ("on" if b["meta"].get("mps") else "off", b["meta"].get("daemon_backend"),
                        b["meta"].get("daemon_device")))
        half["bench_meta"] = b["meta"]
        half["bench_failures"] = b["failures"]
        half["bench_rows"] = b["rows"]
        half["paths_taken"] = sorted({(c["impl"], c["path_taken"]) for c in b["checks"]})
        rat = ratios(b)
        half["autograd"] = {"%s w=%s" % k: v for k, v in rat.items()}
        lines.append("autograd ratio impl/torch (impl us / torch us); synced: idle GPU per call, "
                     "stream: back to back, loop: loop mean per iteration")
        cols = [c[2] for c in COLUMNS]
        lines.append("  %-11s %-4s %-7s" % ("shape", "w", "impl") + "".join(" %-22s" % c for c in cols))
        for (shape, w), impls in rat.items():
            for impl, cells in impls.items():
                txt = ""
                for c in cols:
                    v = cells.get(c)
                    txt += " %-22s" % ("%.2fx (%.0f/%.0f)" % v if v else "-")
                lines.append("  %-11s %-4s %-7s%s" % (shape, w, impl, txt))
        if tag == "mps":
            for shape, lim in TARGETS.items():
                got = [(w, cells["daemon"]) for (s, w), cells in rat.items()
                       if s == shape and "daemon" in cells]
                for w, cells in got:
                    parts = []
                    for col in ("bwd synced", "bwd stream"):
                        if col in cells:
                            v = cells[col][0]
                            parts.append("%s %.2fx %s" % (col, v, "met" if v <= lim else "NOT met"))
                    lines.append("  target %s w=%s bwd <= %.2fx: %s" % (shape, w, lim,
                                                                        ", ".join(parts) or "-"))
        for f in b["failures"]:
            lines.append("  FAIL: " + f)
        lines.append("  paths taken: " + ", ".join("%s=%s" % p for p in half["paths_taken"]))
    if not result:
        sys.exit("torch_summary: nothing found under %s" % work)
    head = "run_torch summary"
    if meta:
        head += ": %s, torch %s, rmsnormd %s, libclient %s" % (meta.get("device"), meta.get("torch"),
                                                               meta.get("daemon_version"),
                                                               meta.get("libclient"))
    text = "\n".join([head] + lines)
    print(text)
    result["summary"] = text
    with open(dest, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
