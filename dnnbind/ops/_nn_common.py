"""Helpers the ``keras.ops.nn`` modules share: argument normalisation in Keras's spellings
(``data_format``, per-axis tuples, ``padding``), float promotion, and :func:`place_strided`, the
differentiable "zeros with a tensor written at strided positions" (the adjoint of a strided slice,
made of ``reshape``/``pad``/``get_item`` so that it can be differentiated again).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from .. import backend
from ..autodiff.tensor import Tensor
from . import _core
from ._core import is_float

__all__ = ["op", "data_format", "spatial_tuple", "padding_mode", "as_float", "to_dtype", "place_strided",
           "channels_last"]


def op(name: str) -> Callable:
    """A registered op by name (the ops of other families, looked up when called: no import cycle)."""
    return _core.REGISTRY[name]["fn"]


def data_format(value: Any, owner: str) -> str:
    """Keras's ``standardize_data_format``: None is ``keras.config.image_data_format()``."""
    if value is None:
        return backend.image_data_format()
    name = str(value).lower()
    if name not in ("channels_last", "channels_first"):
        raise ValueError(f"{owner}: the `data_format` argument must be one of {{'channels_first', 'channels_last'}}. "
                         f"Received: data_format={value!r}")
    return name


def channels_last(fmt: str) -> bool:
    return fmt == "channels_last"


def spatial_tuple(value: Any, n: int, name: str, owner: str, *, minimum: int = 1) -> tuple[int, ...]:
    """An int or a sequence of ``n`` ints (each >= ``minimum``) as an ``n``-tuple."""
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        items = (int(value),) * n
    else:
        try:
            items = tuple(int(v) for v in value)
        except TypeError:
            raise TypeError(f"{owner}: {name} must be an int or a tuple of {n} ints, got {value!r}") from None
        if any(isinstance(v, bool) for v in value):
            raise TypeError(f"{owner}: {name} must be an int or a tuple of {n} ints, got {value!r}")
        if len(items) != n:
            raise ValueError(f"{owner}: {name} must have {n} values (one per spatial axis), got {value!r}")
    if any(v < minimum for v in items):
        raise ValueError(f"{owner}: {name} must be >= {minimum}, got {value!r}")
    return items


def padding_mode(value: Any, owner: str) -> str:
    """``"valid"`` or ``"same"`` (any case), Keras's two padding modes."""
    name = value.lower() if isinstance(value, str) else value
    if name not in ("valid", "same"):
        raise ValueError(f"{owner}: padding must be 'valid' or 'same', got {value!r}")
    return name


def to_dtype(t: Tensor, dt: Any) -> Tensor:
    """``t`` cast (differentiably) to ``dt`` when it differs."""
    dt = _core.np_dtype(dt)
    return t if t.dtype == dt else op("cast")(t, dt)


def as_float(t: Tensor) -> Tensor:
    """``t`` as a float tensor: floats keep their dtype, ints and bool take floatx (Keras's float functions)."""
    return t if is_float(t.dtype) else op("cast")(t, _core.floatx())


def place_strided(t: Tensor, shape: Sequence[int], starts: Sequence[int], steps: Sequence[int]) -> Tensor:
    """Zeros of ``shape`` holding ``t`` at ``starts[a] + i * steps[a]`` along every axis ``a`` (the
    positions must lie inside ``shape``): the adjoint of the slice ``x[..., start::step, ...]``. Built
    from reshape, pad and slicing, so it is differentiable to any order (its VJP is that slice)."""
    shape = tuple(int(s) for s in shape)
    reshape, pad, get_item = op("reshape"), op("pad"), op("get_item")
    cur = tuple(int(s) for s in t.shape)
    if any(s > 1 and n > 1 for s, n in zip(steps, cur)):
        # interleave zeros: (.., n, ..) -> (.., n, 1, ..) padded to (.., n, step, ..) -> (.., n * step, ..)
        split, widths, merged = [], [], []
        for n, s in zip(cur, steps):
            s = s if n > 1 else 1
            split += [n, 1]
            widths += [(0, 0), (0, s - 1)]
            merged.append(n * s)
        t = reshape(pad(reshape(t, tuple(split)), tuple(widths)), tuple(merged))
        cur = tuple(merged)
    before = [int(b) for b in starts]
    after = [total - b - n for total, b, n in zip(shape, before, cur)]
    if any(before) or any(a > 0 for a in after):
        t = pad(t, tuple((b, max(a, 0)) for b, a in zip(before, after)))
    if any(a < 0 for a in after):  # the interleaved zeros past the last element: cut
        t = get_item(t, tuple(slice(0, total) for total in shape))
    return t
