# SPDX-License-Identifier: MIT
"""The example scripts' command lines, without PyTorch or a GPU: --help
starts nothing and creates nothing, and the comparison's summary states
the steps it really averaged in a short run."""

import json
import os
import subprocess
import sys

from conftest import REPO

EXAMPLES = os.path.join(REPO, "python", "examples")


def test_gpu_cycle_help_starts_nothing(tmp_path):
    for args, code in ((["--help"], 0), (["-h"], 0), ([], 64), (["--steps", "3"], 1)):
        r = subprocess.run([sys.executable, os.path.join(EXAMPLES, "gpu_cycle.py")] + args,
                           cwd=tmp_path, capture_output=True, text=True, timeout=60)
        assert r.returncode == code, (args, r.stdout, r.stderr)
        assert os.listdir(tmp_path) == [], (args, os.listdir(tmp_path))
        assert "rmsnormd" not in r.stderr or "OUTDIR" in r.stderr + r.stdout


def _run(path, steps, bits):
    w = {"rank": 0, "losses": [2.0 - 0.01 * i for i in range(steps)],
         "step_ms": [1.0] * steps, "loss_bits": bits, "param_sha256": "x"}
    run = {"workers": [w], "gpu": "CPU", "torch": "2.4",
           "args": {"layers": 1, "dim": 8, "heads": 1, "seq": 4, "batch": 1, "vocab": 16,
                    "dtype": "float32", "workers": 1, "steps": steps}}
    with open(path, "w") as f:
        json.dump(run, f)
    return str(path)


def test_compare_runs_short_run_summary(tmp_path):
    runs = [_run(tmp_path / ("%s.json" % n), 8, "b") for n in ("d1", "d2", "t")]
    md = tmp_path / "summary.md"
    r = subprocess.run([sys.executable, os.path.join(EXAMPLES, "compare_runs.py")] + runs
                       + ["--md", str(md)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    text = md.read_text()
    assert "mean loss last 8 " in text
    assert "last 50" not in text
    assert "after 20 warm-up" not in text
