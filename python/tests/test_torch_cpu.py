# SPDX-License-Identifier: MIT
"""rmsnormd.torch where PyTorch is installed but no GPU is needed: the
module's drop-in contract with torch.nn.RMSNorm, argument checks and the CPU
fallback.  Skipped without PyTorch."""

import sys

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed for %s" % sys.executable)

import torch.nn.functional as F  # noqa: E402

import rmsnormd  # noqa: E402
import rmsnormd.torch as rnt  # noqa: E402


def test_package_names_resolve_lazily():
    assert rmsnormd.RMSNorm is rnt.RMSNorm
    assert rmsnormd.rms_norm is rnt.rms_norm
    assert rmsnormd.replace_rmsnorm is rnt.replace_rmsnorm


def test_same_constructor_and_state_dict_as_torch():
    ref = torch.nn.RMSNorm([4, 8], eps=1e-5, dtype=torch.bfloat16)
    ours = rnt.RMSNorm([4, 8], eps=1e-5, dtype=torch.bfloat16)
    assert ours.normalized_shape == ref.normalized_shape == (4, 8)
    assert ours.weight.dtype == torch.bfloat16 and torch.equal(ours.weight, ref.weight)
    assert ours.state_dict().keys() == ref.state_dict().keys()
    ours.load_state_dict(ref.state_dict())
    assert repr(ours).endswith(repr(ref)[len("RMSNorm"):])
    bare = rnt.RMSNorm(16, elementwise_affine=False)
    assert bare.weight is None and list(bare.parameters()) == []


def test_replace_keeps_parameters_and_nesting():
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Sequential(torch.nn.RMSNorm(8)))
    w = model[1][0].weight
    out = rnt.replace_rmsnorm(model)
    assert out is model
    assert type(model[1][0]) is rnt.RMSNorm and model[1][0].weight is w
    assert rnt.replace_rmsnorm(model) is model  # a second pass changes nothing


def test_cpu_tensors_match_torch():
    x = torch.randn(5, 32, requires_grad=True)
    w = torch.randn(32, requires_grad=True)
    y = rnt.rms_norm(x, w, 1e-6)
    torch.testing.assert_close(y, F.rms_norm(x, (32,), w, 1e-6))
    y.sum().backward()
    assert x.grad.shape == x.shape and w.grad.shape == w.shape


def test_shape_checks_name_the_argument():
    with pytest.raises(ValueError, match="weight"):
        rnt.rms_norm(torch.randn(2, 8), torch.ones(4))
    with pytest.raises(ValueError, match="normalized_shape"):
        rnt.rms_norm(torch.randn(2, 8), None, normalized_shape=(3,))


def test_expandable_segments_setting_is_not_refused(monkeypatch):
    # Expandable segments work (libclient shares their memory by
    # descriptor): nothing in the module refuses them up front, on the
    # setting's presence.  On a GPU: test_torch_cuda.py, test_torch_vmm.py.
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    monkeypatch.setenv("PYTORCH_ALLOC_CONF", "expandable_segments:True")
    assert not [k for k in vars(rnt) if "expandable" in k.lower()]
    x = torch.randn(5, 32, requires_grad=True)
    rnt.rms_norm(x, torch.ones(32)).sum().backward()
    assert x.grad is not None


# ---- CPU tensors through the daemon's CPU backend (client given explicitly) -------------

from torchref import judge, reference  # noqa: E402

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def _run(client, x, w, dy, eps=1e-6, **kw):
    xr = x.detach().clone().requires_grad_(True)
    wr = w.detach().clone().requires_grad_(True) if w is not None else None
    rnt.rms_norm(xr, wr, eps, client=client, **kw).backward(dy)
    return xr.grad, (wr.grad if wr is not None else None)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).split(".")[-1])
@pytest.mark.parametrize("wkind", ["same", "f32", "none"])
def test_cpu_daemon_gradients_match_fp64_autograd(client, dtype, wkind):
    g = torch.Generator().manual_seed(7)
    x = (torch.randn(37, 129, generator=g) * 2 + 0.5).to(dtype)
    dy = torch.randn(37, 129, generator=g).to(dtype)
    w = None
    if wkind != "none":
        w = (1 + 0.2 * torch.randn(129, generator=g)).to(dtype if wkind == "same" else torch.float32)
    before = client.stats().get("requests.bwd")
    dx, dw = _run(client, x, w, dy)
    assert client.stats().get("requests.bwd") == before + 1   # the daemon did it
    ref_dx, fl, ref_dw, dfl = reference(x, w, dy, 1e-6, (129,))
    assert dx.dtype == dtype and dx.shape == x.shape
    problems = [judge("dx", dx, ref_dx, fl)]
    if w is not None:
        assert dw.dtype == w.dtype
        problems.append(judge("dw", dw, ref_dw, dfl))
    problems = [p for p in problems if p]
    assert not problems, "\n".join(problems)


def test_cpu_daemon_strided_rows_offset_and_multi_dim(client):
    base = torch.randn(20, 300, dtype=torch.bfloat16)
    x = base[:, 44:172]
    dy = torch.randn(20, 128, dtype=torch.bfloat16)
    w = torch.randn(128, dtype=torch.bfloat16)
    dx, dw = _run(client, x, w, dy, weight_offset=1.0, dw_dtype=torch.float32)
    ref_dx, fl, ref_dw, dfl = reference(x, w.double() + 1.0, dy, 1e-6, (128,))
    assert judge("dx", dx, ref_dx, fl) is None
    assert dw.dtype == torch.bfloat16 and judge("dw", dw, ref_dw, dfl) is None

    x3 = torch.randn(3, 5, 4, 16)
    dy3 = torch.randn_like(x3)
    w3 = torch.randn(4, 16)
    dx3, dw3 = _run(client, x3, w3, dy3, normalized_shape=(4, 16))
    ref_dx3, fl3, ref_dw3, dfl3 = reference(x3, w3, dy3, 1e-6, (4, 16))
    assert dw3.shape == (4, 16)
    assert judge("dx", dx3, ref_dx3, fl3) is None and judge("dw", dw3, ref_dw3, dfl3) is None


def test_cpu_daemon_same_x_shape_other_normalized_shape(client):
    """The host path's staging layout is per normalised size too: the same
    x shape and dtypes normalised over one dim and then two (before, the
    second call took the first one's layout and failed)."""
    g = torch.Generator().manual_seed(11)
    x = torch.randn(3, 4, 16, generator=g)
    dy = torch.randn(3, 4, 16, generator=g)
    for shape in ((16,), (4, 16), (16,)):
        w = 1 + 0.1 * torch.randn(shape, generator=g)
        dx, dw = _run(client, x, w, dy, normalized_shape=shape)
        ref_dx, fl, ref_dw, dfl = reference(x, w, dy, 1e-6, shape)
        assert judge("dx", dx, ref_dx, fl) is None and judge("dw", dw, ref_dw, dfl) is None


def test_cpu_daemon_module_trains_like_torch(client):
    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.RMSNorm(64), torch.nn.Linear(64, 4))
    ours = torch.nn.Sequential(torch.nn.Linear(16, 64), rnt.RMSNorm(64, client=client),
                               torch.nn.Linear(64, 4))
    ours.load_state_dict(ref.state_dict())
    opt_r = torch.optim.SGD(ref.parameters(), lr=0.1)
    opt_o = torch.optim.SGD(ours.parameters(), lr=0.1)
    x, t = torch.randn(32, 16), torch.randn(32, 4)
    for _ in range(5):
        for m, o in ((ref, opt_r), (ours, opt_o)):
            o.zero_grad()
            F.mse_loss(m(x), t).backward()
            o.step()
    for (name, a), (_, b) in zip(ref.named_parameters(), ours.named_parameters()):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5, msg=name)


def test_double_backward_is_refused(client):
    # A gradient penalty differentiates the backward; the daemon's gradients
    # carry no graph, so this must fail loudly rather than drop the term.
    x = torch.randn(4, 16, requires_grad=True)
    w = torch.randn(16, requires_grad=True)
    y = rnt.rms_norm(x, w, client=client)
    with pytest.raises(RuntimeError, match="double backward"):
        torch.autograd.grad((y * torch.randn(4, 16)).sum(), x, create_graph=True)
    # The same graph still works for an ordinary backward.
    gx, = torch.autograd.grad((y * torch.randn(4, 16)).sum(), x)
    assert gx.shape == x.shape


def test_cpu_daemon_refusal_is_an_rnerror(daemon_factory):
    d = daemon_factory("--max-n", "64")
    with rmsnormd.Client(d.endpoint) as c:
        x = torch.randn(4, 128, requires_grad=True)
        y = rnt.rms_norm(x, None, client=c)
        with pytest.raises(rmsnormd.RNError) as ei:
            y.sum().backward()
    assert ei.value.name == "TOO_LARGE" and "n" in ei.value.message


# ---- the forward: PyTorch's fused kernel where it gives torch.nn.RMSNorm's output -------

def _spy_fused(monkeypatch, fail=False):
    calls = []
    real = rnt._FUSED

    def spy(*args):
        calls.append(args)
        if fail or real is None:
            raise NotImplementedError("no kernel for this backend (test)")
        return real(*args)

    monkeypatch.setattr(rnt, "_FUSED", spy)
    monkeypatch.setattr(rnt, "_fused_off", set())
    return calls


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).split(".")[-1])
def test_forward_is_torchs_own_where_the_weight_matches(client, monkeypatch, dtype):
    if rnt._FUSED is None:
        pytest.skip("this PyTorch has no aten::_fused_rms_norm")
    calls = _spy_fused(monkeypatch)
    g = torch.Generator().manual_seed(3)
    x = (torch.randn(3, 7, 64, generator=g) * 2 + 0.5).to(dtype).requires_grad_(True)
    w = (1 + 0.1 * torch.randn(64, generator=g)).to(dtype).requires_grad_(True)
    y = rnt.rms_norm(x, w, 1e-6, client=client)
    assert len(calls) == 1
    torch.testing.assert_close(y, F.rms_norm(x.detach(), (64,), w.detach(), 1e-6))
    if "cpu" not in rnt._fused_off:
        # Bit for bit the fused kernel's output, which is what torch.nn.RMSNorm
        # gives where it dispatches to it (CUDA, weight of x's dtype).
        ref_y, _ = rnt._FUSED(x.detach().reshape(-1, 64), [64], w.detach(), 1e-6)
        assert torch.equal(y, ref_y.reshape(y.shape))
    dy = torch.randn(3, 7, 64, generator=g).to(dtype)
    y.backward(dy)
    ref_dx, fl, ref_dw, dfl = reference(x, w, dy, 1e-6, (64,))
    assert judge("dx", x.grad, ref_dx, fl) is None
    assert judge("dw", w.grad, ref_dw, dfl) is None


def test_forward_composite_for_mixed_dtypes_and_offsets(client, monkeypatch):
    calls = _spy_fused(monkeypatch)
    x = torch.randn(5, 32, dtype=torch.bfloat16)
    w32 = 1 + 0.1 * torch.randn(32)
    y = rnt.rms_norm(x, w32, 1e-6, client=client)
    # torch's own dtype for these (x's in recent PyTorch, promoted in others)
    assert y.dtype == F.rms_norm(x, (32,), w32).dtype
    y2 = rnt.rms_norm(x, w32.bfloat16(), 1e-6, weight_offset=1.0, client=client)
    assert calls == []
    torch.testing.assert_close(y2.float(), F.rms_norm(x.float(), (32,), w32.bfloat16().float() + 1,
                                                      1e-6), rtol=2e-2, atol=2e-2)


def test_forward_falls_back_where_the_fused_op_has_no_kernel(client, monkeypatch):
    calls = _spy_fused(monkeypatch, fail=True)
    g = torch.Generator().manual_seed(5)
    x = torch.randn(9, 48, generator=g, requires_grad=True)
    w = torch.randn(48, generator=g, requires_grad=True)
    for _ in range(2):
        y = rnt.rms_norm(x, w, 1e-6, client=client)
    assert len(calls) == 1 and rnt._fused_off == {"cpu"}   # tried once, then not again
    torch.testing.assert_close(y, F.rms_norm(x.detach(), (48,), w.detach(), 1e-6))
    dy = torch.randn(9, 48, generator=g)
    y.backward(dy)
    ref_dx, fl, ref_dw, dfl = reference(x, w, dy, 1e-6, (48,))
    assert judge("dx", x.grad, ref_dx, fl) is None
    assert judge("dw", w.grad, ref_dw, dfl) is None


def test_forward_fused_results_checked_once(client, monkeypatch):
    """The fused op's results are checked the first time per device type and
    dtype: one not as needed (rstd in another dtype) turns the fused path
    off for the device type, and the composite gives the forward."""
    if rnt._FUSED is None:
        pytest.skip("this PyTorch has no aten::_fused_rms_norm")
    monkeypatch.setattr(rnt, "_fused_off", set())
    monkeypatch.setattr(rnt, "_fused_checked", set())
    real = rnt._FUSED
    monkeypatch.setattr(rnt, "_FUSED", lambda *a: (lambda y, r: (y, r.double()))(*real(*a)))
    x = torch.randn(6, 32)
    w = 1 + 0.1 * torch.randn(32)
    y = rnt.rms_norm(x, w, 1e-6, client=client)
    assert rnt._fused_off == {"cpu"} and rnt._fused_checked == set()
    torch.testing.assert_close(y, F.rms_norm(x, (32,), w, 1e-6))
    # as they should be: checked once, then taken as they come
    monkeypatch.setattr(rnt, "_fused_off", set())
    monkeypatch.setattr(rnt, "_FUSED", real)
    y = rnt.rms_norm(x, w, 1e-6, client=client)
    assert rnt._fused_checked == {("cpu", torch.float32)} and rnt._fused_off == set()
    torch.testing.assert_close(y, F.rms_norm(x, (32,), w, 1e-6))


def test_forward_fused_not_given_up_for_empty_input_or_out_of_memory(client, monkeypatch):
    calls = _spy_fused(monkeypatch)
    x = torch.randn(0, 16, requires_grad=True)
    w = torch.ones(16, requires_grad=True)
    rnt.rms_norm(x, w, client=client).sum().backward()   # zero rows: the composite
    assert calls == [] and x.grad.shape == x.shape and torch.equal(w.grad, torch.zeros(16))

    def oom(*args):
        raise rnt._OOM("out of memory (test)")

    monkeypatch.setattr(rnt, "_FUSED", oom)
    with pytest.raises(rnt._OOM):
        rnt.rms_norm(torch.randn(4, 16), torch.ones(16), client=client)
    assert rnt._fused_off == set()    # a passing shortage does not turn the fused path off


def test_forward_fused_error_is_raised_not_hidden(client, monkeypatch):
    """A failure of the fused op that is not "no kernel here" (a CUDA error,
    say) reaches the caller and does not turn the fused path off."""
    monkeypatch.setattr(rnt, "_fused_off", set())

    def broken(*args):
        raise RuntimeError("CUDA error: an illegal memory access was encountered (test)")

    monkeypatch.setattr(rnt, "_FUSED", broken)
    with pytest.raises(RuntimeError, match="illegal memory access"):
        rnt.rms_norm(torch.randn(4, 16), torch.ones(16), client=client)
    assert rnt._fused_off == set()


# ---- the device path's host side, on CPU tensors (it calls no CUDA) ---------------------

def _legacy_args(x, dy, weight, rstd, n, eps, off, dw_t):
    # The arguments as the backward built them field by field before it
    # packed them in one call (and the tensors they point into).
    x2, dy2 = rnt._rows(x, n), rnt._rows(dy, n)
    a = rmsnormd._lib.BwdArgs()
    a.m, a.n = x2.size(0), n
    a.x_dtype = a.dx_dtype = rnt._dtype_code(x2, "x")
    a.dy_dtype = rnt._dtype_code(dy2, "dy")
    a.x, a.x_stride = x2.data_ptr(), x2.stride(0)
    a.dy, a.dy_stride = dy2.data_ptr(), dy2.stride(0)
    a.dx_stride = n
    if weight is not None:
        w = weight.reshape(n).contiguous()
        a.w_dtype = rnt._dtype_code(w, "weight")
        a.w = w.data_ptr() if weight.is_contiguous() else 0
    if dw_t is not None:
        a.dw_dtype = rnt._DTYPES[dw_t]
    a.rstd = rstd.data_ptr()
    a.eps, a.weight_offset = eps, off
    return a


@pytest.mark.parametrize("layout", ["plain", "3d", "strided", "permuted", "broadcast"])
@pytest.mark.parametrize("wkind", ["same", "f32", "none", "nograd", "dw32"])
def test_device_args_match_field_by_field(layout, wkind):
    g = torch.Generator().manual_seed(2)
    n = 64
    if layout == "3d":
        x = torch.randn(3, 5, n, generator=g, dtype=torch.bfloat16)
    elif layout == "strided":
        x = torch.randn(7, 2 * n, generator=g, dtype=torch.bfloat16)[:, 3:3 + n]
    elif layout == "permuted":
        x = torch.randn(n, 7, generator=g, dtype=torch.bfloat16).t()
    else:
        x = torch.randn(7, n, generator=g, dtype=torch.bfloat16)
    dy = torch.randn(x.shape, generator=g).to(torch.bfloat16)
    if layout == "broadcast":
        dy = torch.ones(1, 1, dtype=torch.bfloat16).expand(x.shape)
    m = x.numel() // n
    w = None if wkind == "none" else torch.randn(n, generator=g).to(
        torch.float32 if wkind == "f32" else torch.bfloat16)
    dw_dtype = False if wkind == "nograd" else (torch.float32 if wkind == "dw32" else None)
    dw_t = None if w is None or dw_dtype is False else (dw_dtype or w.dtype)
    rstd = torch.rand(m)
    a, dx, dw, keep = rnt._device_args(x, dy, w, rstd, m, n, 1e-5, 0.25, dw_dtype)
    ref = _legacy_args(x, dy, w, rstd, n, 1e-5, 0.25, dw_t)
    ref.dx = dx.data_ptr()
    assert dx.shape == x.shape and dx.dtype == x.dtype and dx.is_contiguous()
    if dw_t is None:
        assert dw is None
    else:
        ref.dw = dw.data_ptr()
        assert dw.shape == w.shape and dw.dtype == dw_t and dw.is_contiguous()
    got = {f: getattr(a, f) for f, _ in rmsnormd._lib.BwdArgs._fields_}
    want = {f: getattr(ref, f) for f, _ in rmsnormd._lib.BwdArgs._fields_}
    for f in ("x", "dy"):  # copies of a non-contiguous tensor: new memory, in keep
        t = {"x": x, "dy": dy}[f]
        if not t.is_contiguous() and got[f] != t.data_ptr():
            assert any(k.data_ptr() == got[f] for k in keep)
            want[f] = got[f]
    assert got == want


class _FakeClient:
    def __init__(self, fail=None):
        self.calls, self.fail = [], fail

    def bwd(self, a, stream):
        self.calls.append((a, stream, rnt._exchange_device(-1)))
        if self.fail:
            raise self.fail


@pytest.mark.parametrize("current", [0, 1])
@pytest.mark.parametrize("fail", [False, True])
def test_launch_uses_the_stream_and_restores_the_device(monkeypatch, current, fail):
    # _launch without a GPU: PyTorch's device and stream calls replaced by
    # fakes that record what the real ones would have been asked.
    state = {"dev": current, "log": []}

    def exchange(d):
        if d < 0:
            return state["dev"]
        prev, state["dev"] = state["dev"], d
        state["log"].append(("exchange", d))
        return prev

    def maybe(d):
        state["log"].append(("maybe", d))
        state["dev"] = d
        return d

    monkeypatch.setattr(rnt, "_raw_stream", lambda idx: 0x1000 + idx)
    monkeypatch.setattr(rnt, "_exchange_device", exchange)
    monkeypatch.setattr(rnt, "_maybe_exchange_device", maybe)
    c = _FakeClient(rmsnormd.RNError(402, "UNREACHABLE", "test") if fail else None)
    args = object()
    if fail:
        with pytest.raises(rmsnormd.RNError):
            rnt._launch(c, args, 1)
    else:
        rnt._launch(c, args, 1)
    assert c.calls == [(args, 0x1001, 1)]   # device 1's stream, with device 1 current
    assert state["dev"] == current           # restored, on failure too
    assert state["log"] == [("exchange", 1)] + ([("maybe", 0)] if current == 0 else [])


def test_close_while_another_thread_runs_backward(daemon):
    # The staging views lie in the client's shared memory: a close() in
    # another thread waits for the backward that uses them, which then
    # finds the client closed (it unmapped the memory under the copies: a
    # segfault).
    import threading
    import time
    c = rmsnormd.Client(daemon.endpoint, timeout=10)
    x = torch.randn(1024, 1024, requires_grad=True)
    w = torch.randn(1024, requires_grad=True)
    seen = []

    def work():
        try:
            while True:
                rnt.rms_norm(x, w, 1e-6, client=c).sum().backward()
        except ValueError as e:
            seen.append(str(e))

    t = threading.Thread(target=work)
    t.start()
    time.sleep(0.5)
    c.close()
    t.join(30)
    assert not t.is_alive()
    assert seen and "closed" in seen[0]


def test_dropped_client_is_collected(daemon):
    # The staging area is the client's own: a client dropped goes, its
    # session with it (a module-level table kept every client used).
    import gc
    import weakref
    refs = []
    for i in range(3):
        c = rmsnormd.Client(daemon.endpoint, timeout=10)
        x = torch.randn(8, 64, requires_grad=True)
        rnt.RMSNorm(64, client=c)(x).sum().backward()
        refs.append(weakref.ref(c))
        del c
        gc.collect()
    assert all(r() is None for r in refs)


def test_layouts_keep_the_weight_shape_apart(client):
    # Two normalized shapes of the same size take different layouts (the
    # second reused the first's views and failed, or not, by call order).
    x = torch.randn(2, 1, 4)
    for shape in [(4,), (1, 4), (4,)]:
        w = torch.ones(shape, requires_grad=True)
        xx = x.clone().requires_grad_()
        rnt.rms_norm(xx, w, client=client).sum().backward()
        assert w.grad.shape == torch.Size(shape)


def test_rows_of_no_elements(client):
    # As torch: a zero-width normalized dim gives an empty output and grads.
    for shape in [(3, 0), (0, 8)]:
        x = torch.randn(*shape, requires_grad=True)
        y = rnt.rms_norm(x, None, client=client)
        assert y.shape == x.shape
        y.sum().backward()
        assert x.grad.shape == x.shape


def test_a_closed_default_client_is_not_replaced_silently(daemon, monkeypatch):
    # A client set as the default may name another daemon than the default
    # endpoint (another GPU's): once closed, calls raise instead of going
    # to the default endpoint.  None goes back to connecting there.
    monkeypatch.setenv("RMSNORMD_ENDPOINT", daemon.endpoint)
    c = rmsnormd.Client(daemon.endpoint)
    rnt.set_default_client(c)
    try:
        assert rnt.default_client() is c
        c.close()
        with pytest.raises(ValueError, match="set_default_client"):
            rnt.default_client()
        rnt.set_default_client(None)
        own = rnt.default_client()
        assert own is not c and not own.closed
        own.close()
        assert rnt.default_client() is not own   # (its own: reconnected)
    finally:
        rnt.set_default_client(None)


def test_deepcopy_of_a_model_shares_its_client(client):
    import copy
    m = torch.nn.Sequential(torch.nn.Linear(8, 8), rnt.RMSNorm(8, client=client))
    m2 = copy.deepcopy(m)
    assert m2[1].client is client
    x = torch.randn(4, 8, requires_grad=True)
    m2(x).sum().backward()
    assert x.grad is not None
