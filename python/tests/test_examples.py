# SPDX-License-Identifier: MIT
"""The training example end to end on the CPU: gpu_cycle.py with the
daemon's CPU backend runs train_mp.py (worker processes, the backward pass
through the daemon) twice, PyTorch's RMSNorm twice, and compare_runs.py must
find the daemon runs bit-identical and close to PyTorch's.  Needs PyTorch;
skipped where a GPU is visible (gpu_run.sh runs the real cycle there)."""

import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed for %s" % sys.executable)

from conftest import BUILD, REPO  # noqa: E402


def test_training_cycle_on_the_cpu_backend(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible: python/examples/gpu_run.sh runs the real cycle")
    env = dict(os.environ, RN_BUILD=BUILD, RN_CYCLE_BACKEND="cpu",
               PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    env.pop("RMSNORMD_ENDPOINT", None)
    cmd = [sys.executable, os.path.join(REPO, "python", "examples", "gpu_cycle.py"),
           str(tmp_path), "--workers", "2", "--steps", "25", "--dim", "32", "--layers", "1",
           "--heads", "2", "--batch", "2", "--seq", "16", "--vocab", "64"]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    summary = (tmp_path / "summary.md").read_text()
    assert "identical for all 2 workers" in summary
    assert "| NO |" not in summary
