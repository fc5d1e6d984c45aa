"""Inverted dropout: zero each element with probability ``rate`` and scale the rest by ``1 / (1 - rate)``.

A :class:`DropoutState` holds the rate and the random stream. The NumPy backend
draws from a ``np.random.Generator``; the CUDA backend keeps its cuDNN dropout
state (a :class:`dnnbind.cudnn.DropoutDescriptor` seeded from ``seed``) per device in
``state.device_states``, so a CUDA graph replays new masks from the same state.
A state made with ``seed=None`` draws its seed from dnnbind's seed generator
(:func:`dnnbind.utils.draw_seed`), so :func:`dnnbind.utils.set_random_seed` fixes
the masks on both backends. The reserve returned by the
forward is opaque: pass it, unchanged, to :func:`dropout_backward` (NumPy: the
mask times the scale, in ``x``'s dtype; ``None`` when ``rate == 0``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..utils import draw_seed
from ._dispatch import as_array, check_float, check_out, route

__all__ = ["DropoutState", "dropout_forward", "dropout_backward"]


class DropoutState:
    """Rate and seeded random stream of one dropout site.

    Parameters
    ----------
    rate:
        Probability of dropping an element, in ``[0, 1)``.
    seed:
        Seed of the stream (``None``: drawn from dnnbind's seed generator,
        reproducible after :func:`dnnbind.utils.set_random_seed`; the drawn seed
        is kept in ``seed``, and the CUDA state is seeded from it too).
    """

    def __init__(self, rate: float, seed: "int | None" = None) -> None:
        rate = float(rate)
        if not 0.0 <= rate < 1.0:
            raise ValueError(f"DropoutState: rate must be in [0, 1), got {rate}")
        if seed is None:
            seed = draw_seed()
        self.rate = rate
        self.seed = int(seed)
        self.rng = np.random.default_rng(self.seed)
        #: per-device CUDA state (cuDNN dropout descriptor and its states buffer), owned by kernels._cuda.dropout
        self.device_states: dict[Any, Any] = {}

    def __repr__(self) -> str:
        return f"DropoutState(rate={self.rate}, seed={self.seed})"


def _check_state(op: str, state: Any) -> None:
    if not isinstance(state, DropoutState):
        raise TypeError(f"{op}: state must be a dnnbind.kernels.DropoutState, got {type(state).__name__}")


def dropout_forward(x: Any, state: DropoutState, *, out: Any = None, stream: Any = None) -> tuple[Any, Any]:
    """``(y, reserve)``: ``y = x * mask / (1 - rate)`` with a fresh random mask (training only).

    CUDA: ``_cuda.dropout.dropout_forward(x, state, out=out, stream=stream)``.
    """
    op = "dropout_forward"
    x = as_array(x)
    _check_state(op, state)
    check_float(op, "x", x)
    check_out(op, out, x.shape, x.dtype)
    impl = route(op, "dropout", x=x, out=out)
    if impl is not None:
        return impl.dropout_forward(x, state, out=out, stream=stream)
    if state.rate == 0.0:
        if out is None:
            return x.copy(), None
        np.copyto(out, x)
        return out, None
    keep = state.rng.random(x.shape, dtype=np.float32) >= state.rate
    reserve = keep.astype(x.dtype)
    reserve *= x.dtype.type(1.0 / (1.0 - state.rate))
    return np.multiply(x, reserve, out=out), reserve


def dropout_backward(dy: Any, reserve: Any, state: DropoutState, *, stream: Any = None) -> Any:
    """``dx = dy * mask / (1 - rate)``, the mask being the one the forward drew (``reserve``).

    CUDA: ``_cuda.dropout.dropout_backward(dy, reserve, state, stream=stream)``.
    """
    op = "dropout_backward"
    dy = as_array(dy)
    _check_state(op, state)
    check_float(op, "dy", dy)
    if reserve is None:
        if state.rate != 0.0:
            raise ValueError(f"{op}: reserve is None but the rate is {state.rate}; pass the forward's reserve")
        impl = route(op, "dropout", dy=dy)
        if impl is not None:
            return impl.dropout_backward(dy, reserve, state, stream=stream)
        return dy.copy()
    impl = route(op, "dropout", dy=dy, reserve=reserve)
    if impl is not None:
        return impl.dropout_backward(dy, reserve, state, stream=stream)
    if tuple(reserve.shape) != tuple(dy.shape) or reserve.dtype != dy.dtype:
        raise ValueError(
            f"{op}: reserve has shape {tuple(reserve.shape)} and dtype {reserve.dtype}, expected dy's "
            f"{tuple(dy.shape)}, {dy.dtype} (pass the reserve returned by dropout_forward)"
        )
    return dy * reserve
