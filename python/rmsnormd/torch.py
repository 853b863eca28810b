# SPDX-License-Identifier: MIT
"""RMSNorm for PyTorch with its backward pass in rmsnormd.

rms_norm(x, weight, eps) is an autograd.Function: the forward runs in
PyTorch (its fused RMSNorm kernel where it applies, else fp32 operations)
and saves rstd in fp32; the backward hands x, dy, w and
rstd to the daemon on the current CUDA stream (rn_rmsnorm_bwd), which writes
dx and dw there without a host synchronisation.  RMSNorm is an nn.Module with
torch.nn.RMSNorm's constructor and state_dict, so it replaces it in place;
replace_rmsnorm(model) swaps every torch.nn.RMSNorm of a model.

Requirements:
 - CUDA tensors from PyTorch's caching allocator, with or without expandable
   segments (PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True).  Expandable
   segments map memory with cuMemCreate, which has no classic CUDA IPC
   handle; libclient shares it with the daemon as POSIX file descriptors
   instead, which needs it created exportable that way (PyTorch does since
   its PR #130890).  Where it cannot be shared (not exportable, or
   RMSNORMD_VMM=0 in the environment, libclient's opt-out), the backward
   fails with RNError NOT_SHARED, whose message says what to change.
 - A daemon on the same GPU (by UUID), ideally under MPS with the workers.
Tensors on the CPU take PyTorch's own path, unless a client is given
explicitly: then the backward runs on the daemon's CPU backend (through a
shared staging buffer), which is how hosts without a GPU use it.

The last dimension(s) being normalised must be contiguous; other dimensions
may have any row stride (x and dy are copied only when they are not).
"""

import math
import os
import re
import threading
import warnings

try:
    import torch
    import torch.nn.functional as F
except ImportError as e:  # pragma: no cover - exercised where torch is absent
    raise ImportError(
        "rmsnormd.torch needs PyTorch (import torch failed: %s); the rest of the "
        "rmsnormd package works without it" % e) from e

from . import _lib
from . import client as _client
from .client import Client, RNError

_DTYPES = {
    torch.float32: _lib.DTYPE_F32,
    torch.float16: _lib.DTYPE_F16,
    torch.bfloat16: _lib.DTYPE_BF16,
}

# ---- the process's default client --------------------------------------------------

_default_lock = threading.Lock()
_default = None
_default_own = False  # (_default made by default_client, not set)


def _forked():
    # A lock another thread held at fork() stays held in the child for ever:
    # the child gets a fresh one.
    global _default_lock
    _default_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forked)


def default_client():
    """The Client rms_norm uses when none is given: connected on first use to
    rmsnormd's default endpoint ($RMSNORMD_ENDPOINT, ...), one per process
    (a forked child gets its own, if no client was open in the parent at the
    fork: else RNError UNSUPPORTED, and children must be started with spawn
    or forkserver)."""
    global _default, _default_own
    c = _default
    if c is not None and c._handle is not None and c._gen == _client._fork_gen:
        return c
    with _default_lock:
        c = _default
        if c is not None and c.closed and not _default_own and c._pid == os.getpid():
            # (not a new one at the default endpoint: the one set may have
            # named another daemon, another GPU's)
            raise ValueError("rmsnormd.torch: the default client (set_default_client) is "
                             "closed; set another, or None to connect to the default endpoint")
        if c is None or c.closed or c._pid != os.getpid():
            c = Client(name="torch pid %d" % os.getpid())
            _default, _default_own = c, True
        return c


def set_default_client(client):
    """Use `client` (a Client, or None to connect on next use) by default.
    Once a client set here is closed, calls without a client raise
    ValueError until another is set (or None)."""
    global _default, _default_own
    with _default_lock:
        _default, _default_own = client, False


# ---- checks ------------------------------------------------------------------------------

def _dtype_code(t, field):
    try:
        return _DTYPES[t.dtype]
    except KeyError:
        raise TypeError("rms_norm: %s has dtype %s; supported: float32, float16, bfloat16"
                        % (field, t.dtype)) from None


def _rows(t, n):
    """t as a [M, n] view with unit column stride and a row stride >= n,
    copying only when no such view exists (broadcast or permuted grads)."""
    t2 = t.reshape(-1, n)
    if t2.stride(1) != 1 or (t2.size(0) > 1 and t2.stride(0) < n):
        t2 = t2.contiguous()
    return t2


# ---- the autograd function --------------------------------------------------------------

# PyTorch's own fused forward (PyTorch >= 2.8): one kernel that returns y
# and rstd (fp32, one per row), the kernel torch.nn.RMSNorm itself runs when
# the weight has x's dtype.  Used where it gives what torch.nn.RMSNorm gives
# (no weight offset, weight None or of x's dtype); elsewhere, or where it has
# no kernel for the device, _forward_composite.  Device types it failed on
# are remembered in _fused_off.
_FUSED = getattr(torch.ops.aten, "_fused_rms_norm", None)
_fused_off = set()
_fused_checked = set()  # (device type, dtype) whose results were as needed
_OOM = getattr(torch, "OutOfMemoryError", getattr(torch.cuda, "OutOfMemoryError", MemoryError))
_NO_KERNEL = re.compile(r"not implemented for|could not run|no kernel|not supported", re.I)


def _forward_fused(x, weight, n, eps, weight_offset):
    """(y in x's shape, rstd fp32 contiguous with one element per row, in
    x's shape but its last dim 1), or None where the fused op does not
    apply.  x's last dim is n.  A forward costs the caller's host a few
    microseconds per tensor call here (and several times that on a busy
    host), so the op's results are checked once per device type and dtype
    (_fused_checked), not on every call."""
    if (_FUSED is None or weight_offset or x.numel() == 0
            or (weight is not None and weight.dtype != x.dtype)
            or (_fused_off and x.device.type in _fused_off)):
        return None
    try:
        y, rstd = _FUSED(x, [n], weight if weight is None or weight.dim() == 1
                         else weight.reshape(n), eps)
    except _OOM:
        raise  # the composite needs more memory still
    except NotImplementedError:  # no kernel for this device
        _fused_off.add(x.device.type)
        return None
    except RuntimeError as e:
        # Only "no kernel for this device/dtype" turns the fused op off; a
        # real failure (a CUDA error, say) is the caller's to see, not a
        # reason to go on with the composite on a broken context.
        if not _NO_KERNEL.search(str(e)):
            raise
        _fused_off.add(x.device.type)
        return None
    key = (x.device.type, x.dtype)
    if key not in _fused_checked:
        if (rstd.dtype != torch.float32 or rstd.numel() * n != x.numel() or y.shape != x.shape
                or not rstd.is_contiguous()):
            _fused_off.add(x.device.type)
            return None
        _fused_checked.add(key)
    return y, rstd


_out_dtypes = {}


def _out_dtype(x_dtype, w_dtype):
    """The dtype of torch's own F.rms_norm for these dtypes, asked of it once
    on meta tensors: x's in recent PyTorch, the promotion of the two in
    others."""
    d = _out_dtypes.get((x_dtype, w_dtype))
    if d is None:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                d = torch.nn.functional.rms_norm(
                    torch.empty(1, 8, dtype=x_dtype, device="meta"), (8,),
                    torch.empty(8, dtype=w_dtype, device="meta")).dtype
        except Exception:  # (no F.rms_norm, or none on meta tensors)
            d = torch.promote_types(x_dtype, w_dtype)
        _out_dtypes[(x_dtype, w_dtype)] = d
    return d


def _forward_composite(x2, weight, n, eps, weight_offset):
    xf = x2.float()
    rstd = torch.rsqrt(xf.square().mean(dim=1) + eps)
    y = xf * rstd.unsqueeze(1)
    out_dtype = x2.dtype
    if weight is not None:
        wf = weight.reshape(n).float()
        if weight_offset:
            wf = wf + weight_offset
        y = y * wf
        out_dtype = _out_dtype(x2.dtype, weight.dtype)
    return y.to(out_dtype), rstd


class _RMSNormFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, n, eps, weight_offset, dw_dtype, client):
        # One normalised dim (the common case): x as it is, no reshapes.
        x2 = x if x.shape[-1] == n else x.reshape(-1, n)
        out = _forward_fused(x2, weight, n, eps, weight_offset)
        if out is None:
            x2 = x.reshape(-1, n)
            out = _forward_composite(x2, weight, n, eps, weight_offset)
            m = x2.size(0)
        else:
            m = x.numel() // n
        y, rstd = out
        if x2 is not x:
            y = y.reshape(x.shape)
        # rstd: contiguous, one fp32 per row (whatever its shape)
        ctx.save_for_backward(x, weight, rstd)
        # What the backward needs besides the tensors, in one attribute:
        # rows, n, eps, weight offset, dw's dtype (None: the weight's) and
        # the client (None: the default).
        ctx.cfg = (m, n, eps, weight_offset, dw_dtype, client)
        return y

    @staticmethod
    def backward(ctx, dy):
        # Autograd runs a backward with grad mode on only for create_graph=True.
        # The daemon's gradients carry no graph, so a gradient penalty built
        # on them would silently lose its terms: refuse instead.
        if _grad_enabled():
            raise RuntimeError(
                "rmsnormd: the RMSNorm backward runs in the daemon and is not differentiable; "
                "double backward (create_graph=True) needs torch.nn.RMSNorm")
        x, weight, rstd = ctx.saved_tensors
        m, n, eps, weight_offset, dw_dtype, client = ctx.cfg
        if weight is not None and not ctx.needs_input_grad[1]:
            dw_dtype = False  # no dw wanted
        if m == 0:
            return _grads_empty(x, weight, dw_dtype)
        if client is None:
            client = default_client()
        if not x.is_cuda:
            return _bwd_host(client, x, dy, weight, rstd, m, n, eps, weight_offset, dw_dtype)
        a, dx, dw, keep = _device_args(x, dy, weight, rstd, m, n, eps, weight_offset, dw_dtype)
        idx = x.get_device()
        try:
            _launch(client, a, idx)
        except RNError as e:
            if e.code // 100 not in (1, 2, 3) and e.name != "NO_CUDA":
                # Not a refusal: the request may have reached the daemon,
                # whose kernel can still read the inputs and write dx and
                # dw after this returns, with no wait on our stream for
                # it.  Their memory must never be handed out again.
                _in_doubt.append((x, dy, dx, dw, rstd) + keep)
            # NOT_SHARED (memory libclient cannot share, e.g. expandable
            # segments not exportable as POSIX descriptors, or with
            # RMSNORMD_VMM=0) carries libclient's message, which names
            # the tensor and what to change.
            raise
        # The copies in keep (rows of x or dy, the weight made contiguous):
        # the caching allocator may hand their memory to the next allocation
        # on this stream, which is ordered after the daemon's kernel by the
        # stream wait rn_rmsnorm_bwd left there, so nothing needs to be kept
        # alive past this point.
        if dw is not None and dw.dtype != weight.dtype:
            dw = dw.to(weight.dtype)
        return dx, dw, None, None, None, None, None


_grad_enabled = torch.is_grad_enabled
_empty_like = torch.empty_like
_CONTIG = torch.contiguous_format
_PACK = _lib.BWD_PACK.pack if _lib.BWD_PACK is not None else None
_ARGS = _lib.BwdArgs.from_buffer_copy
_BWD_SIZE = _lib.BWD_SIZE
_NONE = _lib.DTYPE_NONE


def _rows_of(t, n, what, keep):
    """(address, row stride) of t as [M, n] rows with unit column stride,
    copying t only where no such view exists (broadcast or permuted grads);
    the view or copy goes into keep.  what names t in a dtype error."""
    code = _DTYPES.get(t.dtype)
    if code is None:
        _dtype_code(t, what)
    if t.is_contiguous():  # the common case: no view needed
        return t.data_ptr(), n, code
    t2 = _rows(t, n)
    keep.append(t2)
    return t2.data_ptr(), t2.stride(0), code


def _device_args(x, dy, weight, rstd, m, n, eps, weight_offset, dw_dtype):
    """(BwdArgs, dx, dw or None, copies to keep alive while the call is in
    doubt) for device tensors: dx in x's shape and dtype, dw in the weight's
    shape and dw_dtype (None: the weight's; False: no dw).  Nothing here
    calls CUDA, so it runs on CPU tensors too (bench_torch_host.py)."""
    keep = []
    if not rstd.is_contiguous():  # (the forward's are; m fp32 values in row order)
        rstd = rstd.contiguous()
        keep.append(rstd)
    xp, xs, xc = _rows_of(x, n, "x", keep)
    dyp, dys, dyc = _rows_of(dy, n, "dy", keep)
    # empty_like keeps a contiguous tensor's strides; without the keyword
    # it costs less.
    dx = _empty_like(x) if xs == n and x.is_contiguous() else _empty_like(x, memory_format=_CONTIG)
    wp = wc = dwp = dwc = 0
    dw = None
    if weight is not None:
        wc = _DTYPES.get(weight.dtype) or _dtype_code(weight, "weight")
        if weight.is_contiguous():
            wp = weight.data_ptr()
        else:
            w = weight.contiguous()
            keep.append(w)
            wp = w.data_ptr()
        if dw_dtype is not False:
            if (dw_dtype is None or dw_dtype == weight.dtype) and weight.is_contiguous():
                dw = _empty_like(weight)
            else:
                dw = _empty_like(weight, dtype=dw_dtype, memory_format=_CONTIG)
            dwc = _DTYPES.get(dw.dtype) or _dtype_code(dw, "dw")
            dwp = dw.data_ptr()
    if _PACK is not None:
        a = _ARGS(_PACK(_BWD_SIZE, m, n, xc, dyc, xc, wc, _NONE, dwc, xp, xs, dyp, dys,
                        dx.data_ptr(), n, wp, rstd.data_ptr(), 0, 0, dwp, eps, weight_offset))
    else:  # pragma: no cover - where struct cannot mirror the layout
        a = _lib.BwdArgs(m=m, n=n, x_dtype=xc, dy_dtype=dyc, dx_dtype=xc, w_dtype=wc,
                         dw_dtype=dwc, x=xp, x_stride=xs, dy=dyp, dy_stride=dys,
                         dx=dx.data_ptr(), dx_stride=n, w=wp, rstd=rstd.data_ptr(), dw=dwp,
                         eps=eps, weight_offset=weight_offset)
    return a, dx, dw, tuple(keep)


# The current CUDA stream of a device as an int, and switching the current
# device: PyTorch's own calls beneath torch.cuda.current_stream(d).cuda_stream
# and `with torch.cuda.device(d)`, without the Python objects those make
# per call; the public forms where a PyTorch lacks them.
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)
_exchange_device = getattr(torch.cuda, "_exchange_device", None)
_maybe_exchange_device = getattr(torch.cuda, "_maybe_exchange_device", None)


def _launch(client, a, idx):
    """client.bwd(a, the current stream of device idx) with device idx
    current (libclient's CUDA calls act on the current device)."""
    if _raw_stream is None or _exchange_device is None or _maybe_exchange_device is None:
        stream = torch.cuda.current_stream(idx).cuda_stream
        with torch.cuda.device(idx):
            client.bwd(a, stream)
        return
    stream = _raw_stream(idx)
    prev = _exchange_device(idx)
    if prev == idx:
        client.bwd(a, stream)
        return
    try:
        client.bwd(a, stream)
    finally:
        _maybe_exchange_device(prev)


def _grads_empty(x, weight, dw_dtype):
    dx = torch.empty_like(x, memory_format=_CONTIG)
    dw = None
    if weight is not None and dw_dtype is not False:
        dw = torch.zeros_like(weight, memory_format=_CONTIG)
    return dx, dw, None, None, None, None, None


# Tensors of CUDA calls that failed after they may have reached the daemon
# (a timeout, a lost connection, a CUDA error): kept for the life of the
# process, so that a late kernel never writes into reused memory.
_in_doubt = []


# ---- CPU tensors through the daemon's CPU backend ----------------------------------------

# Each client's own, kept on it (so that a client dropped is collected, and
# its session and memory go with it), under its lock: client._torch_staging,
# one growing staging area (a HostBuffer), and client._torch_layouts, layout
# -> (HostBuffer, BwdArgs, views): the staging views and the arguments of one
# layout, valid while that buffer is the client's staging area.
_HOST_LAYOUTS_MAX = 64


def _staging(client, nbytes):
    buf = getattr(client, "_torch_staging", None)
    if buf is not None and buf.address is not None and buf.nbytes >= nbytes:
        return buf
    # (the layouts' tensors, which view the memory, go before it is unmapped)
    client._torch_layouts = {}
    client._torch_staging = None
    if buf is not None and buf.address is not None:
        buf.free()
    buf = client.alloc(max(nbytes, 1 << 20))
    client._torch_staging = buf
    return buf


def _host_layout(client, key, x, weight, rstd, m, n, eps, weight_offset, dw_t, dy_dtype):
    """The staging views and BwdArgs of one layout: x, dy and dx in x's shape,
    rstd [M], w and dw in the weight's shape, each 64-byte aligned."""
    x_dtype = x.dtype
    parts = [("x", x_dtype, x.shape), ("dy", dy_dtype, x.shape), ("dx", x_dtype, x.shape),
             ("rstd", rstd.dtype, (m,))]
    if weight is not None:
        parts.append(("w", weight.dtype, weight.shape))
    if dw_t is not None:
        parts.append(("dw", dw_t, weight.shape))
    layout, off = {}, 0
    for name, dt, shape in parts:
        layout[name] = (off, dt, shape)
        off += -(-math.prod(shape) * torch.empty((), dtype=dt).element_size() // 64) * 64
    buf = _staging(client, off)
    raw = torch.frombuffer(buf.view(), dtype=torch.uint8, count=off)
    views, addr = {}, {}
    for name, (o, dt, shape) in layout.items():
        k = math.prod(shape) * torch.empty((), dtype=dt).element_size()
        views[name] = raw[o:o + k].view(dt).view(shape)
        addr[name] = buf.address + o
    a = _lib.BwdArgs()
    a.m, a.n = m, n
    a.x_dtype = a.dx_dtype = _dtype_code(x, "x")
    a.dy_dtype = _DTYPES[dy_dtype]
    a.x, a.x_stride = addr["x"], n
    a.dy, a.dy_stride = addr["dy"], n
    a.dx, a.dx_stride = addr["dx"], n
    a.rstd = addr["rstd"]
    if weight is not None:
        a.w_dtype = _dtype_code(weight, "weight")
        a.w = addr["w"]
    if dw_t is not None:
        a.dw_dtype = _DTYPES[dw_t]
        a.dw = addr["dw"]
    a.eps = eps
    a.weight_offset = weight_offset
    layouts = client._torch_layouts
    if len(layouts) >= _HOST_LAYOUTS_MAX:
        layouts.clear()
    hit = (buf, a, views)
    layouts[key] = hit
    return hit


def _bwd_host(client, x, dy, weight, rstd, m, n, eps, weight_offset, dw_dtype):
    """The backward of CPU tensors on the daemon's CPU backend: the tensors
    are copied into a shared staging buffer (the daemon reads only memory
    from rn_buffer_alloc), the call runs there, dx and dw come back as
    copies.  The views and arguments are made once per layout."""
    _dtype_code(dy, "dy")
    dw_t = None
    if weight is not None and dw_dtype is not False:
        dw_t = weight.dtype if dw_dtype is None else dw_dtype
    key = (x.shape, n, x.dtype, dy.dtype, None if weight is None else weight.dtype,
           None if weight is None else weight.shape, dw_t, eps, weight_offset)
    # The client's lock from the staging area's first use to the copies out:
    # a close() in another thread would unmap the memory under the views.
    # (Checked first: after fork() a parent thread may have held the lock.)
    client._handle_or_raise()
    with client._lock:
        client._handle_or_raise()
        hit = getattr(client, "_torch_layouts", {}).get(key)
        if hit is None or hit[0].address is None \
                or getattr(client, "_torch_staging", None) is not hit[0]:
            hit = _host_layout(client, key, x, weight, rstd, m, n, eps, weight_offset, dw_t,
                               dy.dtype)
        _, a, views = hit
        views["x"].copy_(x)
        views["dy"].copy_(dy)
        views["rstd"].copy_(rstd.reshape(-1))
        if weight is not None:
            views["w"].copy_(weight)
        client.bwd_host(a)
        dx = views["dx"].clone()
        dw = views["dw"].clone() if dw_t is not None else None
    if dw is not None and dw.dtype != weight.dtype:
        dw = dw.to(weight.dtype)
    return dx, dw, None, None, None, None, None


def rms_norm(x, weight=None, eps=None, *, normalized_shape=None, weight_offset=0.0,
             dw_dtype=None, client=None):
    """RMSNorm over the last dims of x, backward in rmsnormd.

    x:                CUDA tensor, float32/float16/bfloat16
    weight:           None or a tensor of shape normalized_shape (any of the
                      three dtypes); y = x * rstd * (weight + weight_offset)
    eps:              None: torch.finfo(x.dtype).eps, as torch.nn.RMSNorm
    normalized_shape: the trailing dims normalised together; default
                      weight.shape, or x's last dim without a weight
    dw_dtype:         dtype the daemon writes dw in: None (the weight's) or
                      torch.float32 (returned cast to the weight's dtype)
    client:           a rmsnormd Client; None: default_client() for CUDA
                      tensors and PyTorch's own RMSNorm for CPU tensors
    """
    source = "as given"
    if normalized_shape is None:
        source = "the weight's shape" if weight is not None else "x's last dim"
        normalized_shape = tuple(weight.shape) if weight is not None else (x.shape[-1],)
    elif isinstance(normalized_shape, int):
        normalized_shape = (normalized_shape,)
    normalized_shape = tuple(normalized_shape)
    k = len(normalized_shape)
    if k == 0 or k > x.dim() or tuple(x.shape[x.dim() - k:]) != normalized_shape:
        raise ValueError("rms_norm: x has shape %s; its trailing dims must equal "
                         "normalized_shape %s (%s)" % (tuple(x.shape), normalized_shape, source))
    if weight is not None and tuple(weight.shape) != normalized_shape:
        raise ValueError("rms_norm: weight has shape %s, expected %s"
                         % (tuple(weight.shape), normalized_shape))
    if eps is None:
        eps = torch.finfo(x.dtype).eps
    if not x.is_cuda and client is None:
        if weight_offset:
            weight = weight + weight_offset if weight is not None else None
        return F.rms_norm(x, normalized_shape, weight, eps)
    _dtype_code(x, "x")
    if weight is not None:
        _dtype_code(weight, "weight")
        if weight.device != x.device:
            raise ValueError("rms_norm: weight is on %s, x on %s" % (weight.device, x.device))
    if dw_dtype not in (None, torch.float32) and (weight is None or dw_dtype != weight.dtype):
        raise TypeError("rms_norm: dw_dtype must be None, torch.float32 or the weight's dtype")
    n = math.prod(normalized_shape)
    if n == 0:  # (rows of no elements: nothing for the daemon; torch's own, as torch does)
        if weight is not None and weight_offset:
            weight = weight + weight_offset
        return F.rms_norm(x, normalized_shape, weight, eps)
    return _RMSNormFn.apply(x, weight, n, float(eps), float(weight_offset), dw_dtype, client)


class RMSNorm(torch.nn.Module):
    """Drop-in for torch.nn.RMSNorm whose backward runs in rmsnormd.

    Same constructor (normalized_shape, eps=None, elementwise_affine=True,
    device=None, dtype=None), the same parameter name (`weight`) and so the
    same state_dict.  Extra keywords: weight_offset (y = xhat * (w + offset),
    e.g. 1.0 for Gemma-style norms) and client (a Client; None: the
    process's default client).
    """

    def __init__(self, normalized_shape, eps=None, elementwise_affine=True, device=None,
                 dtype=None, *, weight_offset=0.0, client=None):
        super().__init__()
        if isinstance(normalized_shape, int):
            normalized_shape = (normalized_shape,)
        self.normalized_shape = tuple(normalized_shape)
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        self.weight_offset = weight_offset
        self.client = client
        if elementwise_affine:
            self.weight = torch.nn.Parameter(
                torch.empty(self.normalized_shape, device=device, dtype=dtype))
        else:
            self.register_parameter("weight", None)
        self.reset_parameters()

    def reset_parameters(self):
        if self.weight is not None:
            torch.nn.init.ones_(self.weight)

    def forward(self, x):
        return rms_norm(x, self.weight, self.eps, normalized_shape=self.normalized_shape,
                        weight_offset=self.weight_offset, client=self.client)

    def extra_repr(self):
        return "{normalized_shape}, eps={eps}, elementwise_affine={elementwise_affine}".format(
            **self.__dict__)

    @classmethod
    def from_torch(cls, m, client=None):
        """An RMSNorm sharing m's weight Parameter (so optimizers holding it
        keep working)."""
        new = cls.__new__(cls)
        torch.nn.Module.__init__(new)
        new.normalized_shape = tuple(m.normalized_shape)
        new.eps = m.eps
        new.elementwise_affine = m.elementwise_affine
        new.weight_offset = 0.0
        new.client = client
        if m.weight is not None:
            new.weight = m.weight
        else:
            new.register_parameter("weight", None)
        new.train(m.training)
        return new


def replace_rmsnorm(module, client=None):
    """Replace every torch.nn.RMSNorm inside module (and module itself, if it
    is one) with rmsnormd's RMSNorm, sharing the weights.  Returns the module
    (the new one when module itself was replaced)."""
    if isinstance(module, torch.nn.RMSNorm) and not isinstance(module, RMSNorm):
        return RMSNorm.from_torch(module, client)
    for name, child in list(module.named_children()):
        new = replace_rmsnorm(child, client)
        if new is not child:
            setattr(module, name, new)
    return module
