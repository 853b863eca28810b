# SPDX-License-Identifier: MIT
"""The training example end to end on the CPU: gpu_cycle.py with the
daemon's CPU backend runs train_mp.py (worker processes, the backward pass
through the daemon) twice, PyTorch's RMSNorm twice, and compare_runs.py must
find the daemon runs bit-identical and close to PyTorch's.  Needs PyTorch;
skipped where a GPU is visible (gpu_run.sh runs the real cycle there)."""

import json
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed for %s" % sys.executable)

from conftest import BUILD, REPO  # noqa: E402


def test_training_cycle_on_the_cpu_backend(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible: python/examples/gpu_run.sh runs the real cycle")
    # (the daemon flags and --phases: their plumbing, checked below)
    env = dict(os.environ, RN_BUILD=BUILD, RN_CYCLE_BACKEND="cpu",
               RN_CYCLE_DAEMON_ARGS="--spin-us 0 --log-level debug",
               PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    env.pop("RMSNORMD_ENDPOINT", None)
    cmd = [sys.executable, os.path.join(REPO, "python", "examples", "gpu_cycle.py"),
           str(tmp_path), "--workers", "2", "--steps", "25", "--dim", "32", "--layers", "1",
           "--heads", "2", "--batch", "2", "--seq", "16", "--vocab", "64", "--phases"]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    # --phases: a line of medians per run; the daemon's count its calls
    # (3 norms of one layer a step: 2 in the block, 1 at the end).
    lines = [ln for ln in r.stdout.splitlines() if "phases (medians, ms)" in ln]
    assert len(lines) == 6, r.stdout[-4000:]  # (the side-by-side run: two lines)
    daemon = [ln for ln in lines if "impl=daemon" in ln]
    assert len(daemon) == 3 and all(ln.endswith("in 3 calls") for ln in daemon), daemon
    assert all(ln.endswith("in 0 calls") for ln in lines if "impl=torch" in ln), lines
    with open(tmp_path / "daemon1.json") as f:
        run = json.load(f)
    assert all(len(w["phases"]) == 25 for w in run["workers"])
    # both models side by side in each worker: their losses as in the
    # separate runs (the same seeds and data), and a ratio per worker
    with open(tmp_path / "both.json") as f:
        both = json.load(f)
    with open(tmp_path / "torch.json") as f:
        alone = json.load(f)
    for w, d, t in zip(both["workers"], run["workers"], alone["workers"]):
        assert w["loss_bits"] == d["loss_bits"] and w["param_sha256"] == d["param_sha256"]
        assert w["torch"]["loss_bits"] == t["loss_bits"]
    assert len(both["side_by_side"]["ratios"]) == 2
    assert "train_mp: side by side, median step daemon / torch per worker" in r.stdout
    # the flags reached the daemon (debug lines in its log)
    assert "debug" in (tmp_path / "daemon.log").read_text().lower()
    summary = (tmp_path / "summary.md").read_text()
    assert "identical for all 2 workers" in summary
    assert "| NO |" not in summary


def test_cycle_finds_a_side_by_side_model_that_differs(tmp_path):
    """gpu_cycle.same_bits: each model of the side-by-side run against its
    separate run, per worker (loss bits and final parameters)."""
    sys.path.insert(0, os.path.join(REPO, "python", "examples"))
    import gpu_cycle

    def run(name, workers):
        (tmp_path / (name + ".json")).write_text(json.dumps({"workers": workers}))

    one = {"loss_bits": ["0x1p+0"], "param_sha256": "aa"}
    other = {"loss_bits": ["0x1p+1"], "param_sha256": "aa"}
    run("daemon1", [dict(one, rank=0), dict(one, rank=1)])
    run("torch", [dict(one, rank=0), dict(one, rank=1)])
    run("both", [dict(one, rank=0, torch=one), dict(one, rank=1, torch=one)])
    assert gpu_cycle.same_bits(str(tmp_path)) == []
    run("both", [dict(one, rank=0, torch=other), dict(other, rank=1, torch=one)])
    assert gpu_cycle.same_bits(str(tmp_path)) == [
        "both: worker 1's daemon model differs from daemon1.json",
        "both: worker 0's torch model differs from torch.json"]
