# SPDX-License-Identifier: MIT
"""bench/bench_torch.py and bench/torch_summary.py, so that the scripts of
bench/run_torch.sh cannot rot between GPU runs: the benchmark's smoke mode
(--cpu: CPU tensors on the daemon's CPU backend, the same code path as on a
GPU otherwise) with tiny shapes, its clear refusal where there is nothing to
measure on, and the summary on results made up here.  The smoke run needs
PyTorch (skipped without it); the other tests do not."""

import csv
import json
import os
import subprocess
import sys

import pytest

from conftest import BUILD, REPO

BENCH = os.path.join(REPO, "bench", "bench_torch.py")
SUMMARY = os.path.join(REPO, "bench", "torch_summary.py")


def _env():
    env = dict(os.environ, RN_BUILD=BUILD,
               PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    env.pop("RMSNORMD_ENDPOINT", None)
    env.pop("RMSNORMD_PATH", None)
    return env


def _has_torch():
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True


def test_refuses_clearly_without_a_gpu_or_pytorch(tmp_path):
    if _has_torch():
        import torch
        if torch.cuda.is_available():
            pytest.skip("a GPU is visible: bench/run_torch.sh runs the real benchmark")
    r = subprocess.run([sys.executable, BENCH, str(tmp_path / "out"), "--iters", "1"],
                       env=_env(), capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stdout + r.stderr
    want = "no CUDA GPU visible to PyTorch" if _has_torch() else "needs PyTorch"
    assert want in r.stderr
    if _has_torch():
        assert "--cpu" in r.stderr
    # Nothing was started, nothing measured.
    assert not (tmp_path / "out" / "bench_torch.csv").exists()


def test_bad_arguments_are_refused_before_anything_starts(tmp_path):
    for args in (["--shapes", "12"], ["--modes", "sideways"], ["--wdtypes", "int8"]):
        r = subprocess.run([sys.executable, BENCH, str(tmp_path)] + args, env=_env(),
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 2 and "error" in r.stderr, (args, r.stderr)


def test_cpu_smoke_run_measures_every_case(tmp_path):
    if not _has_torch():
        pytest.skip("PyTorch is not installed for %s" % sys.executable)
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, BENCH, str(out), "--cpu", "--shapes", "16x64,8x96",
                        "--iters", "4", "--warmup", "1", "--rounds", "2", "--classic"],
                       env=_env(), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    assert "bench_torch: ok" in r.stdout
    with open(out / "bench_torch.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    # 2 shapes x 2 weight dtypes x 3 modes x 2 regimes x 3 implementations
    assert len(rows) == 72
    assert {r["impl"] for r in rows} == {"torch", "daemon", "classic"}
    for r in rows:
        assert float(r["median_us"]) > 0 and int(r["iters"]) == 4
        assert float(r["ratio"]) > 0
        assert (r["loop_us"] != "") == (r["regime"] == "stream")
    data = json.loads((out / "bench_torch.json").read_text())
    assert data["failures"] == []
    assert data["meta"]["daemon_backend"] == "cpu"
    # Both implementations reached the daemon, with torch's gradients.
    assert {(c["impl"], c["path_taken"]) for c in data["checks"]} == {
        ("daemon", "classic"), ("classic", "classic")}
    assert all(c["ok"] for c in data["checks"])
    assert data["meta"]["daemon_counters"]["requests.bwd"] > 0
    assert (out / "daemon.log").exists()

    # The summary reads the same files as run_torch.sh lays them out.
    work = tmp_path / "work"
    (work / "bench_nomps").mkdir(parents=True)
    os.rename(out / "bench_torch.json", work / "bench_nomps" / "bench_torch.json")
    r = subprocess.run([sys.executable, SUMMARY, str(work), str(tmp_path / "results.json")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "16x64" in r.stdout and "8x96" in r.stdout and "classic" in r.stdout


def _train_run(step_ms, bits="0x1p+0"):
    return {"args": {"steps": len(step_ms), "workers": 2}, "gpu": "fake",
            "workers": [{"rank": k, "step_ms": list(step_ms), "loss_bits": [bits],
                         "param_sha256": "00"} for k in range(2)]}


def _bench_row(shape, w, impl, mode, regime, med, loop=None):
    return {"shape": shape, "w_dtype": w, "impl": impl, "mode": mode, "regime": regime,
            "median_us": med, "loop_us": loop}


def test_summary_ratios_and_targets(tmp_path):
    work = tmp_path / "work"
    train = work / "train_mps"
    train.mkdir(parents=True)
    # 20 warm-up steps left out, then a median: 11 ms against 10 ms in the
    # first pair; 12 against 10 in the second (drift over an ABBA cycle).
    slow = [100.0] * 20 + [11.0] * 31
    fast = [100.0] * 20 + [10.0] * 31
    slower = [100.0] * 20 + [12.0] * 31
    for name, steps in (("daemon1", slow), ("daemon2", slower), ("torch", fast),
                        ("torch2", fast)):
        (train / (name + ".json")).write_text(json.dumps(_train_run(steps)))
    rows = []
    for impl, bwd in (("torch", 100.0), ("daemon", 125.0)):
        rows += [_bench_row("4096x1024", "bf16", impl, "bwd", "synced", bwd),
                 _bench_row("4096x1024", "bf16", impl, "bwd", "stream", bwd * 0.5),
                 _bench_row("4096x1024", "bf16", impl, "fwdbwd", "stream", 300.0,
                            400.0 if impl == "torch" else 500.0)]
    bench = {"meta": {"device": "fake GPU", "torch": "0", "daemon_version": "0",
                      "libclient": "0"},
             "rows": rows, "failures": [],
             "checks": [{"impl": "daemon", "path_taken": "fast"}]}
    (work / "bench_mps").mkdir()
    (work / "bench_mps" / "bench_torch.json").write_text(json.dumps(bench))
    dest = tmp_path / "results.json"
    r = subprocess.run([sys.executable, SUMMARY, str(work), str(dest)], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    text = r.stdout
    assert "daemon 11.00 / torch 10.00 = 1.10x" in text
    assert "daemon 12.00 / torch 10.00 = 1.20x" in text
    # The verdict is the pairs' mean (1.15x), not the better pair.
    assert "target <= 1.10x: mean of the pairs 1.15x: NOT met (worst pair 1.20x)" in text
    assert "target 4096x1024 w=bf16 bwd <= 1.30x: bwd synced 1.25x met, bwd stream 1.25x met" \
        in text
    res = json.loads(dest.read_text())
    assert res["mps"]["training"]["pairs"][0]["ratio"] == 1.1
    assert res["mps"]["training"]["mean_ratio"] == 1.15
    assert res["mps"]["autograd"]["4096x1024 w=bf16"]["daemon"]["f+b loop"][0] == 1.25
    assert res["mps"]["paths_taken"] == [["daemon", "fast"]]
    assert "side_by_side" not in res["mps"]["training"]

    # With the side-by-side run (train_mp.py --impl both), it is the verdict.
    (train / "both.json").write_text(json.dumps(dict(
        _train_run(slow), side_by_side={"ratios": [1.04, 1.08], "mean": 1.06})))
    r = subprocess.run([sys.executable, SUMMARY, str(work), str(dest)], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "side by side (both models in each worker, taking turns): daemon / torch 1.06x " \
        "(per worker 1.04, 1.08)" in r.stdout
    assert "target <= 1.10x: side by side 1.06x: met (the separate runs' pairs: mean 1.15x, " \
        "worst 1.20x)" in r.stdout
    res = json.loads(dest.read_text())
    assert res["mps"]["training"]["side_by_side"] == {"ratios": [1.04, 1.08], "mean": 1.06}
