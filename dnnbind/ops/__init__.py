"""``keras.ops``: numpy-like, broadcasting, differentiable operations on :class:`dnnbind.Tensor`.

``import dnnbind as keras; keras.ops.matmul(x, w)`` follows Keras 3's names, arguments, broadcasting
and dtype rules on NumPy arrays (the CPU backend) and on GPU arrays (NVRTC, cuDNN and cuBLAS
kernels), and records what a :class:`dnnbind.GradientTape` needs to differentiate it. Each family
lives in a module of its own (``_elementwise``, ``_reductions``, ``_shape``, ``_indexing``,
``_creation``, ``_matmul``, ``_core_ops``...); this package re-exports them all, and Keras's
sub-namespaces (``keras.ops.numpy``, ``.nn``, ``.linalg``, ``.image``, ``.core``, ``.math``).

The low-level cuDNN/cuBLAS forward and backward primitives that lived here until dnnbind 0.2 are in
:mod:`dnnbind.kernels`; their old names still resolve here, with a ``DeprecationWarning``, for one
release (the names Keras also has, such as ``add`` or ``matmul``, are Keras's now).
"""

from __future__ import annotations

import warnings
from typing import Any

from .. import kernels as _kernels
from ..autodiff import engine as _engine
from ..autodiff.tensor import Tensor, install_operators as _install_operators
from ..autodiff.variable import Variable as _Variable
from . import _core
from ._core import REGISTRY, result_type, standardize_dtype
from ._control import *  # noqa: F401,F403
from ._core_ops import *  # noqa: F401,F403
from ._creation import *  # noqa: F401,F403
from ._elementwise import *  # noqa: F401,F403
from ._elementwise import invert_or_not, logical_and_or_bitwise, logical_or_or_bitwise, logical_xor_or_bitwise
from ._image import *  # noqa: F401,F403
from ._indexing import *  # noqa: F401,F403
from ._linalg import *  # noqa: F401,F403
from ._matmul import *  # noqa: F401,F403
from ._math import *  # noqa: F401,F403
from ._nn import *  # noqa: F401,F403
from ._numpy_a import *  # noqa: F401,F403
from ._reductions import *  # noqa: F401,F403
from ._shape import *  # noqa: F401,F403
from ._statistics import *  # noqa: F401,F403

_engine.hooks.ops = __import__(__name__, fromlist=["*"])
_engine.hooks.add = _core.REGISTRY["add"]["fn"]


class _OperatorTable:
    """What Python's operators on tensors call (the extra names map ``&``/``|``/``^``/``~`` to the logical
    ops on bools and the bitwise ones on integers)."""

    def __getattr__(self, name: str) -> Any:
        extra = {"logical_and_or_bitwise": logical_and_or_bitwise, "logical_or_or_bitwise": logical_or_or_bitwise,
                 "logical_xor_or_bitwise": logical_xor_or_bitwise, "invert_or_not": invert_or_not}
        if name in extra:
            return extra[name]
        return _core.REGISTRY[name]["fn"]


_install_operators(Tensor, _OperatorTable())
_install_operators(_Variable, _OperatorTable(), identity_equality=True)

_OLD = frozenset(_kernels.__all__) - frozenset(REGISTRY)


def __getattr__(name: str) -> Any:
    if name in _OLD:
        warnings.warn(f"dnnbind.ops.{name} moved to dnnbind.kernels.{name} (the low-level primitives); "
                      "dnnbind.ops is now keras.ops. The old name goes in the next release.",
                      DeprecationWarning, stacklevel=2)
        return getattr(_kernels, name)
    raise AttributeError(f"module 'dnnbind.ops' has no attribute {name!r}")

# Keras's sub-namespaces (keras.ops.numpy, .nn, ...), after every family has registered its ops
from . import core, image, linalg, math, nn, numpy  # noqa: E402,F401
