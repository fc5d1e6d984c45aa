"""Softmax and log-softmax over the last axis on cuDNN (cudnnSoftmaxForward/Backward).

The array is described as (rows, C, 1, 1) with CUDNN_SOFTMAX_MODE_INSTANCE, which
normalises over C for each row; CUDNN_SOFTMAX_ACCURATE subtracts the row maximum first,
CUDNN_SOFTMAX_LOG gives log-softmax.
"""

from __future__ import annotations

from typing import Any

from . import _common as cm

__all__ = ["softmax_forward", "softmax_backward"]

_ACCURATE, _LOG = 1, 2
_MODE_INSTANCE = 0


def _desc(x: Any) -> int:
    c = int(x.shape[-1]) if x.ndim else 1
    rows = int(x.size) // c if c else 0
    return cm.tensor_desc((rows, c, 1, 1), x.dtype)


def softmax_forward(x: Any, *, log: bool = False, out: Any = None, stream: Any = None) -> Any:
    """softmax (or log-softmax) of ``x`` over its last axis; ``out`` may be ``x``."""
    s = cm.stream_of(stream)
    y = cm.output(out, x.shape, x.dtype, s)
    if x.size == 0:
        return y
    desc = _desc(x)
    try:
        cm.cudnn_call("cudnnSoftmaxForward", cm.cudnn_handle(s), _LOG if log else _ACCURATE, _MODE_INSTANCE,
                      cm.ONE.of(x.dtype), desc, x.ptr, cm.ZERO.of(x.dtype), desc, y.ptr)
    except cm.CudnnError as exc:
        exc.add_context(function="cudnnSoftmaxForward", shape=tuple(x.shape), dtype=str(x.dtype), log=log)
        raise
    return y


def softmax_backward(dy: Any, y: Any, *, log: bool = False, stream: Any = None) -> Any:
    """``dx`` from the forward output ``y`` and ``dy`` (``dx = y * (dy - sum(dy * y))``, or the log form)."""
    s = cm.stream_of(stream)
    dx = cm.empty(dy.shape, dy.dtype, s)
    if dy.size == 0:
        return dx
    desc = _desc(dy)
    try:
        cm.cudnn_call("cudnnSoftmaxBackward", cm.cudnn_handle(s), _LOG if log else _ACCURATE, _MODE_INSTANCE,
                      cm.ONE.of(dy.dtype), desc, y.ptr, desc, dy.ptr, cm.ZERO.of(dy.dtype), desc, dx.ptr)
    except cm.CudnnError as exc:
        exc.add_context(function="cudnnSoftmaxBackward", shape=tuple(dy.shape), dtype=str(dy.dtype), log=log)
        raise
    return dx
