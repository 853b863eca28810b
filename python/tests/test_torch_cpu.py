"""rmsnormd.torch where PyTorch is installed but no GPU is needed: the
module's drop-in contract with torch.nn.RMSNorm, argument checks, the CPU
fallback and the expandable-segments check.  Skipped without PyTorch."""

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed")

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


def test_expandable_segments_setting_is_recognised(monkeypatch):
    monkeypatch.delenv("PYTORCH_ALLOC_CONF", raising=False)
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:128")
    assert rnt._expandable_segments_requested() is None
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:128, expandable_segments:True")
    assert rnt._expandable_segments_requested() == "PYTORCH_CUDA_ALLOC_CONF"
    with pytest.raises(rmsnormd.RNError) as ei:
        rnt._check_allocator()
    assert ei.value.name == "NOT_SHARED" and "expandable" in ei.value.message
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:False")
    assert rnt._expandable_segments_requested() is None
