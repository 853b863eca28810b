# SPDX-License-Identifier: MIT
"""rmsnormd: Python binding of libclient, and RMSNorm for PyTorch whose
backward pass runs in the rmsnormd daemon.

python/ holds this package (pure Python: ctypes over libclient's shared
library, no compiled extension), its tests (python/tests, pytest, run
against a real daemon) and the training example (python/examples).  It
depends on libclient only; PyTorch is imported when a PyTorch name is first
used, so `import rmsnormd` works where PyTorch is not installed.

    import rmsnormd
    with rmsnormd.Client() as c:          # default endpoint
        print(c.health(), c.server_info())

    from rmsnormd.torch import RMSNorm    # drop-in for torch.nn.RMSNorm
"""

import os as _os

from ._lib import (DTYPE_BF16, DTYPE_F16, DTYPE_F32, DTYPE_NONE, HEALTH_DEGRADED,
                   HEALTH_FAILING, HEALTH_OK, BwdArgs, LibraryNotFound)
from .client import (Client, Health, Histogram, HostBuffer, RNError, ServerInfo, Stats,
                     Timing, connect, default_endpoint, err_name, strerror, version)

def _read_version():
    # VERSION is the repository's one version file (python/rmsnormd/VERSION
    # links to it, and the wheel carries a copy): the C library's version.
    with open(_os.path.join(_os.path.dirname(__file__), "VERSION")) as f:
        return f.read().strip()


__version__ = _read_version()

__all__ = [
    "Client", "connect", "RNError", "LibraryNotFound", "Health", "Histogram", "Stats",
    "ServerInfo", "Timing", "HostBuffer", "BwdArgs", "default_endpoint", "err_name",
    "strerror", "version", "DTYPE_NONE", "DTYPE_F32", "DTYPE_F16", "DTYPE_BF16",
    "HEALTH_OK", "HEALTH_DEGRADED", "HEALTH_FAILING", "rms_norm", "RMSNorm",
    "replace_rmsnorm", "__version__",
]

_TORCH_NAMES = ("rms_norm", "RMSNorm", "replace_rmsnorm")


def __getattr__(name):
    # The PyTorch part loads on first use so that importing the package never
    # imports torch.
    if name in _TORCH_NAMES:
        from . import torch as _t
        return getattr(_t, name)
    raise AttributeError("module 'rmsnormd' has no attribute %r" % name)
