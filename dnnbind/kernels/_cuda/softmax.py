"""Softmax and log-softmax over the last axis on cuDNN (cudnnSoftmaxForward/Backward).

The array is described as (rows, C, 1, 1) with CUDNN_SOFTMAX_MODE_INSTANCE, which
normalises over C for each row; CUDNN_SOFTMAX_ACCURATE subtracts the row maximum first,
CUDNN_SOFTMAX_LOG gives log-softmax.
"""

from __future__ import annotations

from typing import Any

from ... import cudnn
from ..._lib import cudnn as C
from . import _common as cm

__all__ = ["softmax_forward", "softmax_backward"]


def _algorithm(log: bool) -> C.SoftmaxAlgorithm:
    return C.SoftmaxAlgorithm.LOG if log else C.SoftmaxAlgorithm.ACCURATE


def _desc(x: Any) -> cudnn.TensorDescriptor:
    c = int(x.shape[-1]) if x.ndim else 1
    rows = int(x.size) // c if c else 0
    return cudnn.TensorDescriptor.cached((rows, c, 1, 1), x.dtype)


def softmax_forward(x: Any, *, log: bool = False, out: Any = None, stream: Any = None) -> Any:
    """softmax (or log-softmax) of ``x`` over its last axis; ``out`` may be ``x``."""
    s = cm.stream_of(stream)
    y = cm.output(out, x.shape, x.dtype, s)
    if x.size == 0:
        return y
    handle, desc = cm.cudnn_handle(s), _desc(x)  # held for the call: a cache may evict them meanwhile
    d = desc.handle
    try:
        C.cudnnSoftmaxForward(handle.handle, _algorithm(log), C.SoftmaxMode.INSTANCE, cm.ONE.of(x.dtype), d, x.ptr,
                              cm.ZERO.of(x.dtype), d, y.ptr)
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
    handle, desc = cm.cudnn_handle(s), _desc(dy)
    d = desc.handle
    try:
        C.cudnnSoftmaxBackward(handle.handle, _algorithm(log), C.SoftmaxMode.INSTANCE, cm.ONE.of(dy.dtype), d, y.ptr,
                               d, dy.ptr, cm.ZERO.of(dy.dtype), d, dx.ptr)
    except cm.CudnnError as exc:
        exc.add_context(function="cudnnSoftmaxBackward", shape=tuple(dy.shape), dtype=str(dy.dtype), log=log)
        raise
    return dx
