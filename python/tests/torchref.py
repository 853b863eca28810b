# SPDX-License-Identifier: MIT
"""Tolerances and the fp64 reference for the PyTorch tests (imported only
where PyTorch is installed): gradients by torch.autograd of F.rms_norm in
fp64, judged with issue 3's tolerances as kernels/rnk.h states them."""

import torch
import torch.nn.functional as F

_MANT = {torch.float16: (10, -14), torch.bfloat16: (7, -126), torch.float32: (23, -126)}


def _ulp(dt, r):
    mant, min_exp = _MANT[dt]
    e = torch.frexp(r.abs())[1].to(torch.float64) - 1
    e = torch.where(r == 0, torch.full_like(e, min_exp), e).clamp(min=min_exp)
    return torch.exp2(e - mant)


def judge(name, got, ref, floor):
    """None if got (any dtype) is within tolerance of the fp64 ref, else why."""
    dt = got.dtype
    g = got.double()
    if not torch.isfinite(g).all():
        return "%s: non-finite values" % name
    if dt == torch.float32:
        excess = ((g - ref).abs() - floor).clamp(min=0)
        rel = (excess.norm() / ref.norm().clamp(min=1e-300)).item()
        return None if rel <= 1e-5 else "%s: relative norm error %.3g > 1e-5" % (name, rel)
    rounded = ref.to(dt).double()
    u = _ulp(dt, rounded)
    err = (g - rounded).abs()
    within_floor = (g - ref).abs() <= floor
    over2 = ((err > 2 * u) & ~within_floor).sum().item()
    over1 = ((err > u) & ~within_floor).sum().item()
    if over2:
        i = ((err > 2 * u) & ~within_floor).nonzero()[0].tolist()
        return "%s: %d elements beyond 2 ulp (first at %s: %r vs %r)" % (
            name, over2, i, g[tuple(i)].item(), ref[tuple(i)].item())
    if over1 > got.numel() * 1e-4:
        return "%s: %d of %d elements beyond 1 ulp" % (name, over1, got.numel())
    return None


def reference(x, w, dy, eps, n_shape):
    """fp64 gradients by torch.autograd of F.rms_norm, and the floors."""
    x64 = x.detach().double().requires_grad_(True)
    w64 = w.detach().double().requires_grad_(True) if w is not None else None
    y = F.rms_norm(x64, n_shape, w64, eps)
    y.backward(dy.double())
    n = 1
    for s in n_shape:
        n *= s
    x2 = x64.detach().reshape(-1, n)
    dy2 = dy.double().reshape(-1, n)
    rstd = torch.rsqrt(x2.square().mean(1, keepdim=True) + eps)
    xhat = x2 * rstd
    g = dy2 * (w64.detach().reshape(n) if w is not None else 1.0)
    c = (xhat * g).mean(1, keepdim=True)
    cabs = (xhat * g).abs().mean(1, keepdim=True)
    dx_floor = 64 * 2.0 ** -24 * rstd * (g.abs() + xhat.abs() * (c.abs() + cabs))
    dw_floor = 64 * 2.0 ** -24 * (dy2 * xhat).abs().sum(0)
    dw = w64.grad if w is not None else None
    return (x64.grad, dx_floor.reshape(x.shape), dw,
            dw_floor.reshape(w.shape) if w is not None else None)
