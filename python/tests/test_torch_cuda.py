# SPDX-License-Identifier: MIT
"""rmsnormd.torch on a GPU host: gradients against torch.autograd of
F.rms_norm in fp64, over a grid of shapes and dtypes, within the kernel's
tolerances (kernels/rnk.h); strided inputs, streams, determinism, the
nn.Module swap, and expandable segments: they work by default and are
refused with RMSNORMD_VMM=0, libclient's opt-out (their gradients, bit for
bit against a run without them: test_torch_vmm.py).

Skipped where PyTorch, a CUDA device or a CUDA-enabled libclient is absent.
"""

import os
import subprocess
import sys
import zlib

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed for %s" % sys.executable)
if not torch.cuda.is_available():
    pytest.skip("no CUDA device visible to PyTorch", allow_module_level=True)

import torch.nn.functional as F  # noqa: E402

import rmsnormd  # noqa: E402
import rmsnormd.torch as rnt  # noqa: E402

from conftest import Daemon  # noqa: E402
from torchref import judge, reference  # noqa: E402

PYDIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEV = torch.device("cuda", 0)


@pytest.fixture(scope="module")
def gpu_daemon():
    d = Daemon(["--log-level", "notice"], backend="cuda").start()
    yield d
    code = d.stop()
    log = d.log()
    if os.environ.get("RN_LOG_DIR"):
        # Kept for whoever runs the GPU cycle remotely (gpu_run.sh sets it).
        with open(os.path.join(os.environ["RN_LOG_DIR"], "pytest-daemon.log"), "w") as f:
            f.write(log)
    d.cleanup()
    assert code == 0, "rmsnormd exited with %r\n%s" % (code, log)


@pytest.fixture(scope="module")
def gclient(gpu_daemon):
    c = rmsnormd.Client(gpu_daemon.endpoint, timeout=30)
    info = c.server_info()
    assert info.backend == "cuda", info
    rnt.set_default_client(c)
    yield c
    rnt.set_default_client(None)
    c.close()


def _run(x, w, dy, eps=1e-6, n_shape=None, **kw):
    xr = x.detach().requires_grad_(True)
    wr = w.detach().requires_grad_(True) if w is not None else None
    y = rnt.rms_norm(xr, wr, eps, normalized_shape=n_shape, **kw)
    y.backward(dy)
    return xr.grad, (wr.grad if wr is not None else None), y


SHAPES = [(1, 1), (3, 7), (64, 512), (257, 1000), (1024, 4096), (8, 65536), (2, 3, 8192)]
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
WEIGHTS = ["same", "f32", "none"]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).split(".")[-1])
@pytest.mark.parametrize("wkind", WEIGHTS)
def test_gradients_match_fp64_autograd(gclient, shape, dtype, wkind):
    seed = zlib.crc32(repr((shape, str(dtype), wkind)).encode())
    g = torch.Generator(device=DEV).manual_seed(seed)
    n = shape[-1]
    x = (torch.randn(shape, device=DEV, generator=g) * 2 + 0.5).to(dtype)
    dy = torch.randn(shape, device=DEV, generator=g).to(dtype)
    w = None
    if wkind != "none":
        wdt = dtype if wkind == "same" else torch.float32
        w = (1 + 0.2 * torch.randn(n, device=DEV, generator=g)).to(wdt)
    eps = 1e-6
    dx, dw, y = _run(x, w, dy, eps)
    ref_dx, dx_floor, ref_dw, dw_floor = reference(x, w, dy, eps, (n,))
    problems = [judge("dx", dx, ref_dx, dx_floor)]
    if w is not None:
        assert dw.dtype == w.dtype
        problems.append(judge("dw", dw, ref_dw, dw_floor))
    problems = [p for p in problems if p]
    assert not problems, "\n".join(problems)
    # The forward is PyTorch's own math: it agrees with F.rms_norm.
    y_ref = F.rms_norm(x.float(), (n,), w.float() if w is not None else None, eps)
    torch.testing.assert_close(y.float(), y_ref, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).split(".")[-1])
def test_dw_in_fp32_and_weight_offset(gclient, dtype):
    n = 768
    x = torch.randn(96, n, device=DEV).to(dtype)
    dy = torch.randn(96, n, device=DEV).to(dtype)
    w = (0.1 * torch.randn(n, device=DEV)).to(dtype)
    dx, dw, _ = _run(x, w, dy, 1e-5, weight_offset=1.0, dw_dtype=torch.float32)
    # y = xhat * (w + 1): the reference sees the weight w + 1 (in fp64).
    ref_dx, dx_floor, ref_dw, dw_floor = reference(x, w.double() + 1.0, dy, 1e-5, (n,))
    assert judge("dx", dx, ref_dx, dx_floor) is None
    assert dw.dtype == dtype
    # dw came back in fp32 and was rounded once to the weight's dtype.
    assert judge("dw", dw, ref_dw, dw_floor) is None


def test_strided_rows_and_multi_dim_normalized_shape(gclient):
    base = torch.randn(50, 700, device=DEV, dtype=torch.bfloat16)
    x = base[:, 100:612]            # row stride 700, no copy needed
    assert not x.is_contiguous()
    dy = torch.randn(50, 512, device=DEV, dtype=torch.bfloat16)
    w = torch.randn(512, device=DEV, dtype=torch.bfloat16)
    dx, dw, _ = _run(x, w, dy)
    ref_dx, fl, ref_dw, dfl = reference(x, w, dy, 1e-6, (512,))
    assert judge("dx", dx, ref_dx, fl) is None
    assert judge("dw", dw, ref_dw, dfl) is None

    x3 = torch.randn(6, 4, 16, 32, device=DEV)
    dy3 = torch.randn_like(x3)
    w3 = torch.randn(16, 32, device=DEV)
    dx3, dw3, _ = _run(x3, w3, dy3, n_shape=(16, 32))
    ref_dx3, fl3, ref_dw3, dfl3 = reference(x3, w3, dy3, 1e-6, (16, 32))
    assert dw3.shape == (16, 32)
    assert judge("dx", dx3, ref_dx3, fl3) is None
    assert judge("dw", dw3, ref_dw3, dfl3) is None


def test_broadcast_grad_and_empty_batch(gclient):
    x = torch.randn(4, 256, device=DEV, requires_grad=True)
    w = torch.ones(256, device=DEV, requires_grad=True)
    rnt.rms_norm(x, w).sum().backward()   # dy is an expanded (stride 0) tensor
    ref_x = x.detach().clone().requires_grad_(True)
    ref_w = w.detach().clone().requires_grad_(True)
    F.rms_norm(ref_x, (256,), ref_w, torch.finfo(torch.float32).eps).sum().backward()
    torch.testing.assert_close(x.grad, ref_x.grad, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(w.grad, ref_w.grad, rtol=1e-4, atol=1e-5)

    e = torch.randn(0, 64, device=DEV, requires_grad=True)
    we = torch.randn(64, device=DEV, requires_grad=True)
    rnt.rms_norm(e, we).sum().backward()
    assert e.grad.shape == (0, 64) and torch.count_nonzero(we.grad) == 0


def test_bitwise_deterministic(gclient):
    x = torch.randn(4096, 2048, device=DEV, dtype=torch.bfloat16)
    dy = torch.randn_like(x)
    w = torch.randn(2048, device=DEV, dtype=torch.bfloat16)
    first = _run(x, w, dy)
    for _ in range(3):
        again = _run(x, w, dy)
        assert torch.equal(first[0].view(torch.int16), again[0].view(torch.int16))
        assert torch.equal(first[1].view(torch.int16), again[1].view(torch.int16))


def test_side_stream_ordering(gclient):
    # The backward runs on a side stream right after the kernels that produce
    # its inputs there, and a consumer reads dx on the same stream, with no
    # host synchronisation in between: the stream order must carry it.
    s = torch.cuda.Stream()
    n = 4096
    w = torch.randn(n, device=DEV, requires_grad=True)
    results = []
    with torch.cuda.stream(s):
        for i in range(20):
            x = torch.randn(512, n, device=DEV).mul_(1 + i).requires_grad_(True)
            y = rnt.rms_norm(x, w)
            (y * (i + 1)).sum().backward()
            results.append((x, x.grad.clone(), x.grad.abs().sum()))
    torch.cuda.synchronize()
    for i, (x, gx, _) in enumerate(results):
        xr = x.detach().clone().requires_grad_(True)
        (F.rms_norm(xr, (n,), w.detach(), torch.finfo(torch.float32).eps) * (i + 1)).sum().backward()
        torch.testing.assert_close(gx, xr.grad, rtol=1e-4, atol=1e-4)


def test_module_swaps_for_torch_rmsnorm(gclient):
    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.RMSNorm(128, eps=1e-5),
                              torch.nn.Linear(128, 8)).to(DEV)
    ours = torch.nn.Sequential(torch.nn.Linear(64, 128), rnt.RMSNorm(128, eps=1e-5),
                               torch.nn.Linear(128, 8)).to(DEV)
    ours.load_state_dict(ref.state_dict())     # same parameter names
    x = torch.randn(32, 64, device=DEV)
    ref(x).square().sum().backward()
    ours(x).square().sum().backward()
    for (name, a), (_, b) in zip(ref.named_parameters(), ours.named_parameters()):
        torch.testing.assert_close(b.grad, a.grad, rtol=1e-4, atol=1e-5, msg=name)

    old = ref[1]
    swapped = rnt.replace_rmsnorm(ref)
    assert swapped is ref and isinstance(ref[1], rnt.RMSNorm)
    assert ref[1].weight is old.weight   # optimizers keep their parameter
    assert rnt.replace_rmsnorm(torch.nn.RMSNorm(8)).__class__ is rnt.RMSNorm
    m = rnt.RMSNorm((4, 8), elementwise_affine=False, dtype=torch.bfloat16, device=DEV)
    assert m.weight is None and "elementwise_affine=False" in repr(m)


def test_cpu_tensors_take_pytorchs_path():
    x = torch.randn(3, 16, requires_grad=True)
    w = torch.randn(16, requires_grad=True)
    rnt.rms_norm(x, w).sum().backward()
    assert x.grad is not None and w.grad is not None


def _subprocess(code, endpoint, **env):
    """Run code in a fresh interpreter; a variable given as None is unset."""
    full = dict(os.environ, PYTHONPATH=PYDIR, RMSNORMD_ENDPOINT=endpoint)
    for k, v in env.items():
        if v is None:
            full.pop(k, None)
        else:
            full[k] = v
    return subprocess.run([sys.executable, "-c", code], env=full, capture_output=True,
                          text=True, timeout=120)


_EXPANDABLE = """
import torch, rmsnormd, rmsnormd.torch as rnt
x = torch.randn(8, 256, device='cuda', requires_grad=True)
w = torch.ones(256, device='cuda', requires_grad=True)
try:
    rnt.rms_norm(x, w).sum().backward()
    torch.cuda.synchronize()
except rmsnormd.RNError as e:
    print('RNError', e.name, e.message)
else:
    print('no error')
"""


# Expandable segments asked for in the environment, or switched on at run
# time (where nothing but libclient can see them).
_HOW = {
    "environment": ({"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
                     "PYTORCH_ALLOC_CONF": None}, ""),
    "run time": ({"PYTORCH_CUDA_ALLOC_CONF": None, "PYTORCH_ALLOC_CONF": None},
                 "import torch; torch.cuda.memory._set_allocator_settings("
                 "'expandable_segments:True')\n"),
}


@pytest.mark.parametrize("how", sorted(_HOW))
def test_expandable_segments_work_by_default(gpu_daemon, how):
    env, prefix = _HOW[how]
    r = _subprocess(prefix + _EXPANDABLE, gpu_daemon.endpoint, RMSNORMD_VMM=None, **env)
    assert r.stdout.strip() == "no error", r.stdout + r.stderr


@pytest.mark.parametrize("how", sorted(_HOW))
def test_expandable_segments_are_refused_with_vmm_off(gpu_daemon, how):
    # RMSNORMD_VMM=0: libclient refuses memory without a CUDA IPC handle,
    # as before it could share it, and its message names the variable.
    env, prefix = _HOW[how]
    r = _subprocess(prefix + _EXPANDABLE, gpu_daemon.endpoint, RMSNORMD_VMM="0", **env)
    assert "RNError NOT_SHARED" in r.stdout, r.stdout + r.stderr
    assert "expandable" in r.stdout and "RMSNORMD_VMM=0" in r.stdout, r.stdout
