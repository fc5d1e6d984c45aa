"""Spatial (channel-wise) dropout: one keep/drop draw per (sample, channel), shared by every
spatial position (Keras SpatialDropout2D), kept values scaled by ``1 / (1 - rate)``.

``x`` is 4-d, ``(N, C, H, W)`` for ``layout="NCHW"`` or ``(N, H, W, C)`` for ``"NHWC"``. The
random stream is a :class:`dnnbind.kernels.DropoutState` (rate and seed; ``seed=None`` draws one
from :func:`dnnbind.utils.draw_seed`). The NumPy backend draws from ``state.rng``; the CUDA
backend hashes ``(state.seed, draw counter, n * C + c)`` with the draw counter on the device,
advanced by the mask kernel itself, so a replayed CUDA graph draws a fresh mask each time.

The reserve the forward returns is the ``(N, C)`` mask times the scale (float32; float64 for
float64 data): pass it unchanged to :func:`spatial_dropout_backward`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ._dispatch import as_array, check_float, check_out, finish, param_dtype, route, to_compute
from ._params import check_layout
from .dropout import DropoutState

__all__ = ["spatial_dropout_forward", "spatial_dropout_backward"]


def _channels(op: str, name: str, x: Any, layout: str) -> tuple[int, int]:
    """(N, C) of a 4-d tensor in ``layout``."""
    if x.ndim != 4:
        raise ValueError(f"{op}: {name} must be 4-d ({'(N, C, H, W)' if layout == 'NCHW' else '(N, H, W, C)'}), "
                         f"got shape {tuple(x.shape)}")
    check_float(op, name, x)
    return int(x.shape[0]), int(x.shape[1] if layout == "NCHW" else x.shape[3])


def _broadcast(mask: np.ndarray, layout: str) -> np.ndarray:
    return mask[:, :, None, None] if layout == "NCHW" else mask[:, None, None, :]


def spatial_dropout_forward(x: Any, state: DropoutState, *, layout: str = "NHWC", out: Any = None,
                            stream: Any = None) -> tuple[Any, Any]:
    """``(y, reserve)``: ``y = x * mask[n, c] / (1 - rate)`` with a fresh ``(N, C)`` mask (training only).

    ``reserve`` is ``None`` when ``state.rate == 0`` (``y`` is then a copy of ``x``).

    CUDA: ``_cuda.spatial_dropout.spatial_dropout_forward(x, state, layout=layout, out=out, stream=stream)``.
    """
    op = "spatial_dropout_forward"
    x = as_array(x)
    if not isinstance(state, DropoutState):
        raise TypeError(f"{op}: state must be a dnnbind.kernels.DropoutState, got {type(state).__name__}")
    layout = check_layout(layout)
    n, c = _channels(op, "x", x, layout)
    check_out(op, out, x.shape, x.dtype)
    impl = route(op, "spatial_dropout", x=x, out=out)
    if impl is not None:
        return impl.spatial_dropout_forward(x, state, layout=layout, out=out, stream=stream)
    if state.rate == 0.0:
        return finish(x.copy(), out, x.dtype), None
    keep = state.rng.random((n, c), dtype=np.float32) >= state.rate
    reserve = keep.astype(param_dtype(x.dtype)) * (1.0 / (1.0 - state.rate))
    return finish(to_compute(x) * _broadcast(reserve, layout), out, x.dtype), reserve


def spatial_dropout_backward(dy: Any, reserve: Any, *, layout: str = "NHWC", out: Any = None,
                             stream: Any = None) -> Any:
    """``dx = dy * reserve[n, c]`` with the forward's reserve (``None``: the rate was 0, ``dx`` copies ``dy``).

    CUDA: ``_cuda.spatial_dropout.spatial_dropout_backward(dy, reserve, layout=layout, out=out, stream=stream)``.
    """
    op = "spatial_dropout_backward"
    dy = as_array(dy)
    layout = check_layout(layout)
    n, c = _channels(op, "dy", dy, layout)
    check_out(op, out, dy.shape, dy.dtype)
    if reserve is not None:
        reserve = as_array(reserve)
        want = param_dtype(dy.dtype)
        if tuple(reserve.shape) != (n, c) or reserve.dtype != want:
            raise ValueError(
                f"{op}: reserve has shape {tuple(reserve.shape)} and dtype {reserve.dtype}, expected ({n}, {c}) "
                f"{want} for dy of shape {tuple(dy.shape)} ({layout}); pass the reserve spatial_dropout_forward returned"
            )
    impl = route(op, "spatial_dropout", dy=dy, reserve=reserve, out=out)
    if impl is not None:
        return impl.spatial_dropout_backward(dy, reserve, layout=layout, out=out, stream=stream)
    if reserve is None:
        return finish(dy.copy(), out, dy.dtype)
    return finish(to_compute(dy) * _broadcast(reserve, layout), out, dy.dtype)
