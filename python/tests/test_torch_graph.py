# SPDX-License-Identifier: MIT
"""rmsnormd.torch inside torch.cuda.CUDAGraph (PROTOCOL.md 13.8, graph slots):
a small model's forward and backward with rmsnormd.torch.RMSNorm captured
once, replayed 1000 times with fresh inputs, each replay's output and
gradients bitwise equal to the same step run eagerly.

Skipped where PyTorch, a CUDA device or a CUDA-enabled libclient is absent.
"""

import os
import sys

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed for %s" % sys.executable)
if not torch.cuda.is_available():
    pytest.skip("no CUDA device visible to PyTorch", allow_module_level=True)

import rmsnormd  # noqa: E402
import rmsnormd.torch as rnt  # noqa: E402

from conftest import Daemon  # noqa: E402

DEV = torch.device("cuda", 0)
REPLAYS = int(os.environ.get("RN_GRAPH_REPLAYS", "1000"))


@pytest.fixture(scope="module")
def gclient():
    d = Daemon(["--log-level", "notice"], backend="cuda").start()
    c = rmsnormd.Client(d.endpoint, timeout=30)
    assert c.server_info().backend == "cuda"
    rnt.set_default_client(c)
    yield c
    rnt.set_default_client(None)
    c.close()
    code = d.stop()
    log = d.log()
    d.cleanup()
    assert code == 0, "rmsnormd exited with %r\n%s" % (code, log)


class Model(torch.nn.Module):
    def __init__(self, dim, dtype):
        super().__init__()
        self.inp = torch.nn.Linear(dim, dim, device=DEV, dtype=dtype)
        self.norm1 = rnt.RMSNorm(dim, eps=1e-6, device=DEV, dtype=dtype)
        self.mid = torch.nn.Linear(dim, dim, device=DEV, dtype=dtype)
        self.norm2 = rnt.RMSNorm(dim, eps=1e-6, device=DEV, dtype=dtype)
        self.out = torch.nn.Linear(dim, dim, device=DEV, dtype=dtype)

    def forward(self, x):
        h = self.norm1(self.inp(x))
        h = self.norm2(torch.nn.functional.gelu(self.mid(h)) + h)
        return self.out(h)


def _step(model, x):
    y = model(x)
    loss = y.float().pow(2).mean()
    loss.backward()
    return y, loss


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_graph_replays_bitwise(gclient, dtype):
    torch.manual_seed(0)
    model = Model(256, dtype)
    params = list(model.parameters())
    static_x = torch.randn(64, 256, device=DEV, dtype=dtype, requires_grad=False)

    # Warm-up on a side stream (as PyTorch asks before a capture): it also
    # sets up the ring outside the capture.
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            for p in params:
                p.grad = None
            _step(model, static_x)
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()

    g = torch.cuda.CUDAGraph()
    for p in params:
        p.grad = None
    with torch.cuda.graph(g):
        static_y, static_loss = _step(model, static_x)
    static_grads = [p.grad for p in params]

    gen = torch.Generator(device=DEV).manual_seed(1)
    for r in range(REPLAYS):
        x = torch.randn(64, 256, device=DEV, dtype=dtype, generator=gen)
        static_x.copy_(x)
        g.replay()
        got_y = static_y.clone()
        got_grads = [t.clone() for t in static_grads]
        for p in params:
            p.grad = None
        y, _ = _step(model, x)
        assert torch.equal(got_y, y), "replay %d: the forward differs from eager" % r
        for i, (a, p) in enumerate(zip(got_grads, params)):
            assert torch.equal(a, p.grad), "replay %d: gradient %d differs from eager" % (r, i)
    torch.cuda.synchronize()
    gclient.check()
    del g
    torch.cuda.synchronize()
    gclient.check()
