"""``keras.ops``: numpy-like, broadcasting, differentiable operations on :class:`dnnbind.Tensor`.

The low-level cuDNN/cuBLAS forward and backward primitives that lived here until dnnbind 0.2 are
in :mod:`dnnbind.kernels`; their old names still resolve here, with a ``DeprecationWarning``, for
one release.
"""

from __future__ import annotations

import warnings
from typing import Any

from .. import kernels as _kernels


def __getattr__(name: str) -> Any:
    if name in _kernels.__all__:
        warnings.warn(f"dnnbind.ops.{name} moved to dnnbind.kernels.{name} (the low-level primitives); "
                      "dnnbind.ops is now keras.ops. The old name goes in the next release.",
                      DeprecationWarning, stacklevel=2)
        return getattr(_kernels, name)
    raise AttributeError(f"module 'dnnbind.ops' has no attribute {name!r}")
