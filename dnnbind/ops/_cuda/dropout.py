"""Dropout on cuDNN (cudnnDropoutForward / cudnnDropoutBackward).

Each :class:`dnnbind.ops.DropoutState` gets, per device, a cuDNN dropout descriptor and its
random-states buffer (``cudnnSetDropoutDescriptor`` seeds it from ``state.seed`` once, on the
stream of the first call), kept in ``state.device_states[device]``.

RNG advance: cudnnDropoutForward reads the generator states from the buffer and writes the
advanced states back, so each forward (eager, or a replay of a captured CUDA graph, which
reuses the same buffer address) draws a fresh mask; ``tests/test_ops_dropout_gpu.py`` checks
both. The reserve space (the mask, opaque) is allocated per call from the stream-ordered
pool and must be passed unchanged to the backward.

cuDNN's dropout has no bfloat16 kernels (CUDNN_STATUS_NOT_SUPPORTED on cuDNN 9.19), so
bfloat16 tensors go through float32 copies: cast, drop out, cast back.
"""

from __future__ import annotations

import ctypes
import weakref
from typing import Any

import numpy as np

from ..._lib import cudnn as C
from . import _common as cm
from .elementwise import cast

__all__ = ["dropout_forward", "dropout_backward", "device_state"]


class _CudaDropout:
    """The cuDNN dropout descriptor of one DropoutState on one device, and its states buffer."""

    def __init__(self, rate: float, seed: int, stream) -> None:
        handle = cm.cudnn_handle(stream)
        raw = ctypes.c_void_p()
        C.call("cudnnCreateDropoutDescriptor", ctypes.byref(raw))
        self.desc = int(raw.value or 0)
        self._finalizer = weakref.finalize(self, _destroy, self.desc)
        size = ctypes.c_size_t()
        C.call("cudnnDropoutGetStatesSize", handle, ctypes.byref(size))
        self.states_size = int(size.value)
        self.states = cm.empty((self.states_size,), np.uint8, stream)
        C.call("cudnnSetDropoutDescriptor", self.desc, handle, ctypes.c_float(rate), self.states.ptr,
               self.states_size, ctypes.c_ulonglong(seed & (2**64 - 1)),
               context={"rate": rate, "seed": seed, "states bytes": self.states_size})
        self.rate = rate


def _destroy(desc: int) -> None:
    try:
        C.raw("cudnnDestroyDropoutDescriptor")(desc)
    except Exception:
        pass


def device_state(state: Any, stream) -> _CudaDropout:
    """The per-device cuDNN state of ``state`` (created on first use, on ``stream``)."""
    device = stream.device_index
    cuda_state = state.device_states.get(device)
    if cuda_state is None or cuda_state.rate != state.rate:
        cuda_state = state.device_states[device] = _CudaDropout(float(state.rate), int(state.seed), stream)
    return cuda_state


def _desc(x: Any) -> int:
    return cm.tensor_desc((1, max(int(x.size), 1), 1, 1), x.dtype)


_CUDNN_DTYPES = (cm.F32, cm.F16, cm.F64)


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
    ds = device_state(state, s)
    desc = _desc(x)
    size = ctypes.c_size_t()
    cm.cudnn_call("cudnnDropoutGetReserveSpaceSize", desc, ctypes.byref(size))
    reserve = cm.empty((int(size.value),), np.uint8, s)
    try:
        cm.cudnn_call("cudnnDropoutForward", cm.cudnn_handle(s), ds.desc, desc, x.ptr, desc, y.ptr, reserve.ptr,
                      reserve.nbytes)
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
    ds = device_state(state, s)
    desc = _desc(dy)
    try:
        cm.cudnn_call("cudnnDropoutBackward", cm.cudnn_handle(s), ds.desc, desc, dy.ptr, desc, dx.ptr, reserve.ptr,
                      reserve.nbytes)
    except cm.CudnnError as exc:
        exc.add_context(function="cudnnDropoutBackward", shape=tuple(dy.shape), dtype=str(dy.dtype),
                        rate=state.rate)
        raise
    return dx
