"""Preprocessing ops on the ``channel_affine`` kernels of ``preprocessing.cu``: rescaling and
(inverse) normalization with their backward. Inputs are contiguous; the parameters are cast to the
kernel's accumulation type (float32, float64 for float64 data) on the device when they are not.
"""

from __future__ import annotations

from typing import Any

from . import _common as cm
from .elementwise import cast

__all__ = ["rescale", "normalize", "normalize_backward"]

_FILE = "preprocessing.cu"
_RESCALE, _NORMALIZE, _INVERT, _NORMALIZE_BWD, _INVERT_BWD = range(5)


def _acc(param: Any, x: Any, s) -> Any:
    want = cm.F64 if x.dtype == cm.F64 else cm.F32
    return None if param is None else (param if param.dtype == want else cast(param, want, stream=s))


def _affine(x: Any, a: Any, b: Any, channels: tuple, mode: int, epsilon: float, out: Any, stream: Any) -> Any:
    s = cm.stream_of(stream)
    a, b = _acc(a, x, s), _acc(b, x, s)
    res = cm.output(out, x.shape, x.dtype, s)
    c, inner = channels
    total = int(x.size)
    cm.launch(_FILE, f"channel_affine_{cm.suffix(x.dtype)}", total,
              (cm.p(x), cm.p(a), cm.p(b), cm.p(res), cm.i64(total), cm.i64(c), cm.i64(inner), cm.i32(mode),
               cm.f64(epsilon)), s)
    return res


def rescale(x: Any, scale: Any, offset: Any = None, *, channels: tuple, out: Any = None, stream: Any = None) -> Any:
    """``x * scale + offset`` with the parameters laid out as ``channels = (C, inner)``."""
    return _affine(x, scale, offset, channels, _RESCALE, 0.0, out, stream)


def normalize(x: Any, mean: Any, variance: Any, *, channels: tuple, invert: bool = False, epsilon: float = 1e-7,
              out: Any = None, stream: Any = None) -> Any:
    """``(x - mean) / max(sqrt(variance), epsilon)`` (or its inverse)."""
    return _affine(x, mean, variance, channels, _INVERT if invert else _NORMALIZE, epsilon, out, stream)


def normalize_backward(dy: Any, variance: Any, *, channels: tuple, invert: bool = False, epsilon: float = 1e-7,
                       stream: Any = None) -> Any:
    """``dy / max(sqrt(variance), epsilon)`` (times it when ``invert``)."""
    return _affine(dy, None, variance, channels, _INVERT_BWD if invert else _NORMALIZE_BWD, epsilon, None, stream)
