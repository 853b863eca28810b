# SPDX-License-Identifier: MIT
"""rmsnormd.torch with PyTorch's expandable segments (cuMemCreate memory,
shared with the daemon by file descriptor, libclient's default: issue 17):
the gradients of a grid of shapes and dtypes, computed in a process with
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, must equal bit for bit
those of the same run without it (the kernel is deterministic; only where
the memory lives differs).  A 4-worker run of the training demo likewise.
Both runs leave RMSNORMD_VMM unset, so they test the default.

Run on an NVIDIA H200 under MPS (bench/RESULTS.md, "Expandable segments").
Skipped where PyTorch, a CUDA device or a CUDA-enabled libclient is absent.
"""

import json
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed for %s" % sys.executable)
if not torch.cuda.is_available():
    pytest.skip("no CUDA device visible to PyTorch", allow_module_level=True)

from conftest import Daemon  # noqa: E402

PYDIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Each case's gradients, hashed and written out; large shapes make the
# segments grow across several physical chunks between calls.
_GRADS = r"""
import hashlib, sys, zlib, torch
import rmsnormd.torch as rnt
out = []
dev = torch.device('cuda', 0)
keep = []
for shape in [(3, 7), (64, 512), (257, 1000), (1024, 4096), (4096, 8192), (2, 3, 8192)]:
    for dtype in [torch.float32, torch.float16, torch.bfloat16]:
        g = torch.Generator(device=dev).manual_seed(zlib.crc32(repr((shape, str(dtype))).encode()))
        x = (torch.randn(shape, device=dev, generator=g) * 2 + 0.5).to(dtype).requires_grad_(True)
        w = (torch.randn(shape[-1], device=dev, generator=g) * 0.5 + 1).to(dtype).requires_grad_(True)
        dy = torch.randn(shape, device=dev, generator=g).to(dtype)
        rnt.rms_norm(x, w, 1e-6).backward(dy)
        torch.cuda.synchronize()
        h = hashlib.sha256()
        for t in (x.grad, w.grad):
            h.update(t.detach().contiguous().view(torch.uint8).cpu().numpy().tobytes())
        out.append("%s %s %s" % ("x".join(map(str, shape)), str(dtype).split(".")[-1], h.hexdigest()))
        keep.append(x)  # the segment keeps growing
segs = torch.cuda.memory._snapshot()["segments"] if hasattr(torch.cuda.memory, "_snapshot") else []
known = [s["is_expandable"] for s in segs if "is_expandable" in s]
print("expandable", any(known) if known else "unknown")
print("\n".join(out))
"""


@pytest.fixture(scope="module")
def gpu_daemon():
    d = Daemon(["--log-level", "notice"], backend="cuda").start()
    yield d
    code = d.stop()
    log = d.log()
    d.cleanup()
    assert code == 0, "rmsnormd exited with %r\n%s" % (code, log)


def _env(endpoint, expandable):
    """The environment of a run: libclient's default (RMSNORMD_VMM unset),
    and expandable segments asked for or not."""
    env = dict(os.environ, PYTHONPATH=PYDIR, RMSNORMD_ENDPOINT=endpoint)
    for k in ("RMSNORMD_VMM", "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"):
        env.pop(k, None)
    if expandable:
        env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    return env


def _run(code, endpoint, expandable):
    env = _env(endpoint, expandable)
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout.splitlines()


def test_gradients_bitwise_equal_with_expandable_segments(gpu_daemon):
    plain = _run(_GRADS, gpu_daemon.endpoint, False)
    exp = _run(_GRADS, gpu_daemon.endpoint, True)
    # Where PyTorch says, the memory is where it should be.
    assert plain[0] in ("expandable False", "expandable unknown"), plain[0]
    assert exp[0] in ("expandable True", "expandable unknown"), exp[0]
    assert exp[1:] == plain[1:]


def test_training_demo_bitwise_equal_with_expandable_segments(gpu_daemon, tmp_path):
    demo = os.path.join(PYDIR, "examples", "train_mp.py")
    runs = []
    for expandable in (False, True):
        out = str(tmp_path / ("run-%d.json" % expandable))
        env = _env(gpu_daemon.endpoint, expandable)
        r = subprocess.run([sys.executable, demo, "--impl", "daemon", "--workers", "4",
                            "--steps", "60", "--out", out], env=env, capture_output=True,
                           text=True, timeout=900)
        assert r.returncode == 0, r.stdout + r.stderr
        with open(out) as f:
            runs.append(json.load(f)["workers"])
    for a, b in zip(runs[0], runs[1]):
        assert a["losses"] == b["losses"], (a["rank"], a["losses"][-3:], b["losses"][-3:])
        assert a["param_sha256"] == b["param_sha256"], a["rank"]
