"""Spatial dropout on NVRTC kernels (``spatial_dropout.cu``): a one-block mask kernel over the
(N, C) draws and an elementwise channel-scale kernel; no cuDNN, no host synchronisation.

The draw counter of a :class:`dnnbind.kernels.DropoutState` on a device is a one-element int64
DeviceArray in ``state.device_states[("spatial", device)]`` (the cuDNN dropout states of
``kernels._cuda.dropout`` use the plain device index as key). It is made, zeroed, on the first
eager call; a CUDA-graph capture cannot make it (it would be graph memory outliving the
capture), so capturing before one eager call raises.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import _common as cm

__all__ = ["spatial_dropout_forward", "spatial_dropout_backward"]

_SOURCE = "spatial_dropout.cu"
_MASK_BLOCK = 1024


def _counter(state: Any, s: Any) -> Any:
    key = ("spatial", s.device_index)
    counter = state.device_states.get(key)
    if counter is None:
        if s.is_capturing():
            raise RuntimeError(
                f"spatial_dropout_forward: {state!r} has no draw counter on device {s.device_index} yet and the "
                "stream is capturing a CUDA graph; run one eager step first (a warm-up step makes it)"
            )
        counter = cm.empty((1,), np.int64, s)
        counter.fill_zero(s)
        state.device_states[key] = counter
    return counter


def _scale(src: Any, mask: Any, dst: Any, layout: str, s: Any) -> None:
    n, c, h, w = cm.nchw_dims(src.shape, layout)
    cm.launch(_SOURCE, f"channel_scale_{cm.suffix(src.dtype)}", int(src.size),
              (cm.p(src), cm.p(mask), cm.p(dst), cm.i64(src.size), cm.i64(c), cm.i64(h * w),
               cm.i32(layout == "NHWC")), s)


def spatial_dropout_forward(x: Any, state: Any, *, layout: str = "NHWC", out: Any = None,
                            stream: Any = None) -> "tuple[Any, Any]":
    """(y, reserve): reserve is the (N, C) scaled mask, float32 (float64 for float64 data)."""
    s = cm.stream_of(stream)
    y = cm.output(out, x.shape, x.dtype, s)
    if state.rate == 0.0:
        cm.memcpy(y, x, s)
        return y, None
    n, c, _, _ = cm.nchw_dims(x.shape, layout)
    mdt = cm.F64 if x.dtype == cm.F64 else cm.F32
    mask = cm.empty((n, c), mdt, s)
    if n * c:
        cm.launch_rows(_SOURCE, f"spatial_dropout_mask_{cm.suffix(mdt)}", 1,
                       (cm.p(mask), cm.p(_counter(state, s)), cm.u64(state.seed & (2**64 - 1)), cm.i64(n * c),
                        cm.f32(state.rate), cm.f64(1.0 / (1.0 - state.rate))), s, block=_MASK_BLOCK)
    _scale(x, mask, y, layout, s)
    return y, mask


def spatial_dropout_backward(dy: Any, reserve: Any, *, layout: str = "NHWC", out: Any = None,
                             stream: Any = None) -> Any:
    """dx = dy * reserve[n, c] (a copy of dy when reserve is None)."""
    s = cm.stream_of(stream)
    dx = cm.output(out, dy.shape, dy.dtype, s)
    if reserve is None:
        cm.memcpy(dx, dy, s)
        return dx
    _scale(dy, reserve, dx, layout, s)
    return dx
