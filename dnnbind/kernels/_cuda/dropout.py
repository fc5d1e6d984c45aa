"""Dropout on cuDNN (cudnnDropoutForward / cudnnDropoutBackward).

Each :class:`dnnbind.kernels.DropoutState` gets, per device, a public
:class:`dnnbind.cudnn.DropoutDescriptor` owning its random-states buffer
(seeded from ``state.seed`` once, when the descriptor is made, on the stream of the first call),
kept in ``state.device_states[device]``.

RNG advance: cudnnDropoutForward reads the generator states from the buffer and writes the
advanced states back, so each forward (eager, or a replay of a captured CUDA graph, which
reuses the same buffer address) draws a fresh mask; ``tests/test_kernels_dropout_gpu.py`` checks
both. The reserve space (the mask, opaque) is allocated per call from the stream-ordered
pool and must be passed unchanged to the backward.

cuDNN's dropout has no bfloat16 kernels (CUDNN_STATUS_NOT_SUPPORTED on cuDNN 9.19), so
bfloat16 tensors go through float32 copies: cast, drop out, cast back.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ... import cudnn
from ..._lib import cudnn as C
from . import _common as cm
from .elementwise import cast

__all__ = ["dropout_forward", "dropout_backward", "device_state"]


def device_state(state: Any, stream) -> cudnn.DropoutDescriptor:
    """The cuDNN dropout descriptor of ``state`` on ``stream``'s device (created on first use, on ``stream``)."""
    device = stream.device_index
    desc = state.device_states.get(device)
    if desc is None or desc.rate != state.rate:
        desc = cudnn.DropoutDescriptor(cm.cudnn_handle(stream), float(state.rate), int(state.seed) & (2**64 - 1))
        state.device_states[device] = desc
    return desc


def _desc(x: Any) -> cudnn.TensorDescriptor:
    """Any shape as (1, size, 1, 1): dropout is pointwise."""
    return cudnn.TensorDescriptor.cached((1, x.size, 1, 1), x.dtype)


_CUDNN_DTYPES = (cm.F32, cm.F16, cm.F64)
_reserve_sizes = cudnn.LRUCache(256, "dropout reserve sizes")


def _reserve_size(x: Any, desc: cudnn.TensorDescriptor) -> int:
    """cuDNN's reserve bytes for dropout over ``x`` (its (1, size, 1, 1) descriptor ``desc``), asked once per
    (size, dtype)."""
    key = (x.size, x.dtype)
    size = _reserve_sizes.get(key)
    if size is None:
        size = _reserve_sizes.put(key, cudnn.DropoutDescriptor.reserve_space_size(desc))
    return size


def _via_float32(x: Any, s: Any) -> Any:
    return cast(x, cm.F32, stream=s)


def dropout_forward(x: Any, state: Any, *, out: Any = None, stream: Any = None) -> "tuple[Any, Any]":
    """(y, reserve): y = x * mask / (1 - rate); reserve is an opaque uint8 DeviceArray (None at rate 0)."""
    s = cm.stream_of(stream)
    y = cm.output(out, x.shape, x.dtype, s)
    if state.rate == 0.0 or x.size == 0:
        cm.memcpy(y, x, s)
        return y, None
    if x.dtype not in _CUDNN_DTYPES:
        y32, reserve = dropout_forward(_via_float32(x, s), state, stream=s)
        cast(y32, x.dtype, out=y, stream=s)
        return y, reserve
    dropout, desc, handle = device_state(state, s), _desc(x), cm.cudnn_handle(s)  # held for the call
    reserve = cm.empty((_reserve_size(x, desc),), np.uint8, s)
    d = desc.handle
    try:
        C.cudnnDropoutForward(handle.handle, dropout.handle, d, x.ptr, d, y.ptr, reserve.ptr, reserve.nbytes)
    except cm.CudnnError as exc:
        exc.add_context(function="cudnnDropoutForward", shape=tuple(x.shape), dtype=str(x.dtype), rate=state.rate)
        raise
    return y, reserve


def dropout_backward(dy: Any, reserve: Any, state: Any, *, stream: Any = None) -> Any:
    """dx = dy * mask / (1 - rate) with the forward's mask (from ``reserve``)."""
    s = cm.stream_of(stream)
    dx = cm.empty(dy.shape, dy.dtype, s)
    if reserve is None or dy.size == 0:
        cm.memcpy(dx, dy, s)
        return dx
    if dy.dtype not in _CUDNN_DTYPES:
        return cast(dropout_backward(_via_float32(dy, s), reserve, state, stream=s), dy.dtype, out=dx, stream=s)
    dropout, desc, handle = device_state(state, s), _desc(dy), cm.cudnn_handle(s)  # held for the call
    d = desc.handle
    try:
        C.cudnnDropoutBackward(handle.handle, dropout.handle, d, dy.ptr, d, dx.ptr, reserve.ptr, reserve.nbytes)
    except cm.CudnnError as exc:
        exc.add_context(function="cudnnDropoutBackward", shape=tuple(dy.shape), dtype=str(dy.dtype),
                        rate=state.rate)
        raise
    return dx
