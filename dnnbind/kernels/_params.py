"""Normalised parameters shared by the NumPy and CUDA implementations of an op.

The public op validates its arguments once, turns them into one of these
records, and hands the same record to whichever implementation runs. Both
implementations therefore agree on padding, including Keras's asymmetric
``padding="same"``.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Iterable, Iterator, Sequence, Union

import numpy as np

from .._validate import ArgumentTypeError

__all__ = [
    "LAYOUTS",
    "ConvParams",
    "PoolParams",
    "as_pair",
    "resolve_padding",
    "conv_output_size",
    "check_layout",
    "is_plain",
    "naming",
]

LAYOUTS = ("NCHW", "NHWC")

PaddingSpec = Union[int, str, Sequence[int]]


def _integers(value: object, name: str, spelling: str) -> tuple[int, ...]:
    """``value`` (a sequence) as exact ints; a float, a string or a bool is refused, never truncated."""
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise TypeError(f"{name} must be {spelling}, got {value!r} ({type(value).__name__})")
    items = tuple(value)
    if any(isinstance(v, bool) or not isinstance(v, (int, np.integer)) for v in items):
        raise TypeError(f"{name} must be {spelling}, got {value!r} (holding "
                        f"{', '.join(sorted({type(v).__name__ for v in items}))})")
    return tuple(int(v) for v in items)


def as_pair(value: "int | Sequence[int]", name: str) -> tuple[int, int]:
    """``3`` -> ``(3, 3)``; ``(2, 3)`` stays; anything else is a clear error."""
    if type(value) is int and value >= 1:  # hot path: a plain positive int
        return (value, value)
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        pair = (int(value), int(value))
    else:
        pair = _integers(value, name, "an int or a pair of ints")
        if len(pair) != 2:
            raise ValueError(f"{name} must have 2 values (height, width), got {value!r}")
    if any(v < 1 for v in pair) and name != "padding":
        raise ValueError(f"{name} must be positive, got {value!r}")
    return pair  # type: ignore[return-value]


@contextlib.contextmanager
def naming(op: str) -> Iterator[None]:
    """Prefix the errors of the geometry helpers above with ``op``; a wrong type stays a TypeError
    (``ArgumentTypeError``, also a ValueError as the ops raised before)."""
    try:
        yield
    except TypeError as exc:
        raise ArgumentTypeError(f"{op}: {exc}") from None
    except ValueError as exc:
        raise ValueError(f"{op}: {exc}") from None


def is_plain(value: object) -> bool:
    """An exact int or str, or a tuple of exact ints: a spelling safe as a memo key (True, 1.0 and
    NumPy integers hash like ints but must still reach the checks that refuse or convert them)."""
    t = type(value)
    if t is int or t is str:
        return True
    if t is tuple:
        for v in value:
            if type(v) is not int:
                return False
        return True
    return False


def check_layout(layout: str) -> str:
    up = str(layout).upper()
    if up not in LAYOUTS:
        raise ValueError(f"layout must be 'NCHW' or 'NHWC', got {layout!r}")
    return up


def conv_output_size(size: int, kernel: int, stride: int, dilation: int, pad_lo: int, pad_hi: int) -> int:
    """Output length of a 1-d convolution/pooling window sweep."""
    effective = (kernel - 1) * dilation + 1
    return (size + pad_lo + pad_hi - effective) // stride + 1


def resolve_padding(
    padding: PaddingSpec,
    in_hw: Sequence[int],
    kernel_hw: Sequence[int],
    stride: Sequence[int],
    dilation: Sequence[int] = (1, 1),
) -> tuple[int, int, int, int]:
    """Turn a padding spec into explicit ``(top, bottom, left, right)``.

    ``"valid"`` is no padding. ``"same"`` follows Keras/TensorFlow: the output
    is ``ceil(in / stride)`` and any odd total goes to the bottom and right, which
    is why the result may be asymmetric. An int or a pair is symmetric; a
    4-tuple is taken as it is.
    """
    if isinstance(padding, str):
        mode = padding.lower()
        if mode == "valid":
            return (0, 0, 0, 0)
        if mode != "same":
            raise ValueError(f"padding must be 'valid', 'same', an int, a pair or a 4-tuple, got {padding!r}")
        out: list[int] = []
        for size, k, s, d in zip(in_hw, kernel_hw, stride, dilation):
            effective = (k - 1) * d + 1
            out_size = -(-size // s)
            total = max((out_size - 1) * s + effective - size, 0)
            out += [total // 2, total - total // 2]
        return (out[0], out[1], out[2], out[3])
    if isinstance(padding, (int, np.integer)) and not isinstance(padding, bool):
        if padding < 0:
            raise ValueError(f"padding must be >= 0, got {padding}")
        return (int(padding),) * 4
    values = _integers(padding, "padding", "'valid', 'same', an int, a pair or a 4-tuple of ints")
    if any(v < 0 for v in values):
        raise ValueError(f"padding must be >= 0, got {padding!r}")
    if len(values) == 2:
        return (values[0], values[0], values[1], values[1])
    if len(values) == 4:
        return values  # type: ignore[return-value]
    raise ValueError(f"padding must have 2 or 4 values, got {padding!r}")


@dataclass(frozen=True)
class ConvParams:
    """A 2-d convolution's geometry. ``pad`` is ``(top, bottom, left, right)``."""

    stride: tuple[int, int]
    pad: tuple[int, int, int, int]
    dilation: tuple[int, int]
    groups: int

    @property
    def symmetric(self) -> bool:
        return self.pad[0] == self.pad[1] and self.pad[2] == self.pad[3]

    def output_hw(self, in_hw: Sequence[int], kernel_hw: Sequence[int]) -> tuple[int, int]:
        t, b, l, r = self.pad
        return (
            conv_output_size(in_hw[0], kernel_hw[0], self.stride[0], self.dilation[0], t, b),
            conv_output_size(in_hw[1], kernel_hw[1], self.stride[1], self.dilation[1], l, r),
        )


@dataclass(frozen=True)
class PoolParams:
    """A 2-d pooling's geometry. ``mode`` is 'max', 'avg' (padding excluded) or 'avg_include_pad'."""

    mode: str
    window: tuple[int, int]
    stride: tuple[int, int]
    pad: tuple[int, int, int, int]

    @property
    def symmetric(self) -> bool:
        return self.pad[0] == self.pad[1] and self.pad[2] == self.pad[3]

    def output_hw(self, in_hw: Sequence[int]) -> tuple[int, int]:
        t, b, l, r = self.pad
        return (
            conv_output_size(in_hw[0], self.window[0], self.stride[0], 1, t, b),
            conv_output_size(in_hw[1], self.window[1], self.stride[1], 1, l, r),
        )
