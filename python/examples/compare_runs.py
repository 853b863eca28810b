#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Judge train_mp.py's outputs:

    compare_runs.py DAEMON_RUN1.json DAEMON_RUN2.json TORCH_RUN.json [TORCH_RUN2.json]
                    [--md OUT.md] [--label TEXT]

 - determinism: the two daemon runs have bit-identical loss curves and final
   parameters, worker by worker;
 - closeness: the daemon run's loss curve follows the PyTorch run's (the
   mean loss of the last 50 steps, or all of a shorter run, within 3 %, the first 10 steps within
   0.05 nats: the runs start from the same weights and data);
 - step time: median step time per worker after 20 warm-up steps (all
   steps of a run of 20 or fewer), with and without the daemon.
A second PyTorch run, when given, shows whether the rest of the model is
deterministic by itself (if it is not, the daemon runs cannot be either),
and gives a second pair (DAEMON_RUN2, TORCH_RUN2) for the step time: the
mean of the two pairs' ratios is the one to quote when the runs went ABBA
(gpu_cycle.py's order).
Exit status 0 when both checks hold.  --md writes a Markdown table.
"""

import argparse
import json
import statistics
import sys


def load(p):
    with open(p) as f:
        return json.load(f)


WARMUP = 20


def warmup(run):
    """The warm-up steps left out of the step time: 20, or none in a run
    too short to have them."""
    n = min(len(w["step_ms"]) for w in run["workers"])
    return WARMUP if n > WARMUP else 0


def median_step(run):
    k = warmup(run)
    return statistics.mean(statistics.median(w["step_ms"][k:]) for w in run["workers"])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("daemon1")
    ap.add_argument("daemon2")
    ap.add_argument("torch")
    ap.add_argument("torch2", nargs="?")
    ap.add_argument("--md")
    ap.add_argument("--label", default="")
    a = ap.parse_args()
    d1, d2, tr = load(a.daemon1), load(a.daemon2), load(a.torch)
    ok = True
    lines = []

    def identical(r1, r2):
        return all(w1["loss_bits"] == w2["loss_bits"] and w1["param_sha256"] == w2["param_sha256"]
                   for w1, w2 in zip(r1["workers"], r2["workers"]))

    det = []
    for w1, w2 in zip(d1["workers"], d2["workers"]):
        same_loss = w1["loss_bits"] == w2["loss_bits"]
        same_params = w1["param_sha256"] == w2["param_sha256"]
        det.append(same_loss and same_params)
        if not (same_loss and same_params):
            first = next((i for i, (x, y) in enumerate(zip(w1["loss_bits"], w2["loss_bits"]))
                          if x != y), None)
            lines.append("worker %d: runs differ (first differing step %s, params %s)"
                         % (w1["rank"], first, "same" if same_params else "differ"))
    ok &= all(det)

    close = []
    rows = []
    # The tables say how many steps they averaged: a short run has fewer
    # than 50 to average and 20 to leave out.
    last_k = min(50, min(len(w["losses"]) for w in d1["workers"]))
    for wd, wt in zip(d1["workers"], tr["workers"]):
        ld, lt = wd["losses"], wt["losses"]
        k = min(50, len(ld))
        md, mt = sum(ld[-k:]) / k, sum(lt[-k:]) / k
        rel = abs(md - mt) / mt
        early = max(abs(x - y) for x, y in zip(ld[:10], lt[:10]))
        good = rel <= 0.03 and early <= 0.05
        close.append(good)
        rows.append((wd["rank"], ld[0], lt[0], md, mt, rel, early, good))
    ok &= all(close)

    sd, st = median_step(d1), median_step(tr)
    args = d1["args"]
    out = []
    where = ("the CPU (the daemon's CPU backend)" if d1["gpu"] == "CPU"
             else "one GPU (%s)" % d1["gpu"])
    out.append("Model: %d layers, d=%d, %d heads, seq %d, batch %d, vocab %d, %s; %d workers "
               "on %s, %d steps, torch %s."
               % (args["layers"], args["dim"], args["heads"], args["seq"], args["batch"],
                  args["vocab"], args["dtype"], args["workers"], where, args["steps"],
                  d1["torch"]))
    out.append("")
    out.append("| worker | loss step 0 (daemon / torch) | mean loss last %d (daemon / torch) "
               "| rel. diff | max diff steps 0-9 | close |" % last_k)
    out.append("|---|---|---|---|---|---|")
    for r, l0d, l0t, md, mt, rel, early, good in rows:
        out.append("| %d | %.4f / %.4f | %.4f / %.4f | %.2f %% | %.4f | %s |"
                   % (r, l0d, l0t, md, mt, 100 * rel, early, "yes" if good else "NO"))
    out.append("")
    out.append("Determinism (two daemon runs, loss bits and final-parameter SHA-256 per "
               "worker): %s." % ("identical for all %d workers" % len(det) if all(det)
                                 else "DIFFERENT: " + "; ".join(lines)))
    if a.torch2:
        t2 = load(a.torch2)
        out.append("Determinism of the same model with torch.nn.RMSNorm (two runs): %s."
                   % ("identical" if identical(tr, t2) else "different: PyTorch's own kernels "
                      "are not deterministic here"))
    out.append("")
    k = warmup(d1)
    out.append("| step time (median %s, mean over workers) | ms |"
               % ("after %d warm-up steps" % k if k else "of all steps: too few for a warm-up"))
    out.append("|---|---|")
    out.append("| torch.nn.RMSNorm (in process) | %.2f |" % st)
    out.append("| rmsnormd.torch.RMSNorm (backward in the daemon) | %.2f |" % sd)
    out.append("| second daemon run | %.2f |" % median_step(d2))
    if a.torch2:
        out.append("| second torch run | %.2f |" % median_step(t2))
    out.append("| ratio daemon / torch | %.2fx |" % (sd / st))
    if a.torch2:
        # gpu_cycle.py runs the pairs ABBA: their mean cancels a drift.
        r2 = median_step(d2) / median_step(t2)
        out.append("| ratio of the second pair | %.2fx |" % r2)
        out.append("| mean of the two pairs' ratios | %.2fx |" % ((sd / st + r2) / 2))
    text = "\n".join(out)
    print(text)
    print("\nverdict: %s" % ("PASS" if ok else "FAIL"))
    if a.md:
        with open(a.md, "w") as f:
            f.write((a.label + "\n\n" if a.label else "") + text + "\n")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
