"""Merge layers (Keras 3): Add, Subtract, Multiply, Average, Maximum, Minimum, Concatenate.

Multi-input layers (``multi_input = True``): ``forward(inputs)`` takes a list of arrays (NumPy or
DeviceArray, one device), ``backward(dy)`` returns one gradient per input, in input order, each a
distinct array (a caller may accumulate into one in place). Shapes given to ``build`` and
``compute_output_shape`` are lists of per-input shapes without the batch axis.

The elementwise layers take inputs of one shape: Keras's broadcasting of size-1 axes between
inputs is not supported, and unequal shapes are refused with both shapes named. Maximum/Minimum
send each element's gradient to the first input holding the extremum (TensorFlow's rule for ties).
Inputs are cast to the layer's compute dtype.
"""

from __future__ import annotations

from typing import Any, Sequence

from dnnbind import _validate, kernels

from .base import Layer, register

__all__ = ["Add", "Subtract", "Multiply", "Average", "Maximum", "Minimum", "Concatenate"]


class _Merge(Layer):
    """Shared plumbing: input-count and shape checks, casting, and the n == 1 pass-through."""

    multi_input = True
    _exact_inputs: "int | None" = None  # Subtract takes exactly 2

    @property
    def _owner(self) -> str:
        return f"{type(self).__name__} '{self.name}'"

    def _check_count(self, n: int) -> None:
        if self._exact_inputs is not None and n != self._exact_inputs:
            raise ValueError(f"{self._owner} takes exactly {self._exact_inputs} inputs, got {n}")
        if n < 1:
            raise ValueError(f"{self._owner} takes a list of at least 1 input, got {n}")

    def _output_shape(self, input_shapes: Sequence[Sequence[int]]) -> tuple:
        shapes = [tuple(s) for s in input_shapes]
        self._check_count(len(shapes))
        for i, s in enumerate(shapes[1:], 1):
            if s != shapes[0]:
                raise ValueError(
                    f"{self._owner}: every input must have the shape of the first, (batch, "
                    f"{', '.join(map(str, shapes[0]))}), got (batch, {', '.join(map(str, s))}) for input {i}; "
                    "broadcasting between inputs is not supported")
        return shapes[0]

    def _inputs(self, inputs: Sequence[Any]) -> list:
        if not isinstance(inputs, (list, tuple)):
            raise _validate.ArgumentTypeError(f"{self._owner}: forward takes a list of arrays, got "
                                              f"{type(inputs).__name__}")
        xs = [self._cast_input(x) for x in inputs]
        self._check_count(len(xs))
        return xs

    @staticmethod
    def _fold(op: Any, xs: list) -> Any:
        """``op(...op(op(xs[0], xs[1]), xs[2])..., xs[-1])``: one new array, then in place."""
        y = op(xs[0], xs[1])
        for x in xs[2:]:
            op(y, x, out=y)
        return y

    def _pass_through(self, dy: Any, n: int) -> list:
        """``dy`` for the first input and copies for the others."""
        return [dy] + [kernels.copy(dy) for _ in range(n - 1)]


@register
class Add(_Merge):
    """Elementwise sum of the inputs."""

    def forward(self, inputs, training=False):
        xs = self._inputs(inputs)
        self._n = len(xs)
        return xs[0] if len(xs) == 1 else self._fold(kernels.add, xs)

    def backward(self, dy, need_dx=True):
        return self._pass_through(dy, self._n) if need_dx else [None] * self._n


@register
class Subtract(_Merge):
    """``inputs[0] - inputs[1]`` (exactly two inputs)."""

    _exact_inputs = 2

    def forward(self, inputs, training=False):
        a, b = self._inputs(inputs)
        return kernels.subtract(a, b)

    def backward(self, dy, need_dx=True):
        if not need_dx:
            return [None, None]
        return [dy, kernels.scale(dy, -1.0)]


@register
class Multiply(_Merge):
    """Elementwise product of the inputs; the gradient of input i is ``dy`` times the other inputs."""

    def forward(self, inputs, training=False):
        xs = self._inputs(inputs)
        self._n = len(xs)
        self._xs = xs if training else None
        return xs[0] if len(xs) == 1 else self._fold(kernels.multiply, xs)

    def backward(self, dy, need_dx=True):
        xs, self._xs = self._xs, None
        if not need_dx:
            return [None] * self._n
        if self._n == 1:
            return [dy]
        if xs is None:
            raise RuntimeError(f"{self._owner}: backward called without a training forward")
        grads = []
        for i in range(len(xs)):
            g = None
            for j, x in enumerate(xs):
                if j != i:
                    g = kernels.multiply(dy if g is None else g, x)
            grads.append(g)
        return grads


@register
class Average(_Merge):
    """Elementwise mean of the inputs (their sum divided by their count)."""

    def forward(self, inputs, training=False):
        xs = self._inputs(inputs)
        self._n = len(xs)
        if len(xs) == 1:
            return xs[0]
        y = self._fold(kernels.add, xs)
        return kernels.scale(y, 1.0 / len(xs), out=y)

    def backward(self, dy, need_dx=True):
        if not need_dx:
            return [None] * self._n
        if self._n == 1:
            return [dy]
        return [kernels.scale(dy, 1.0 / self._n) for _ in range(self._n)]


class _Extremum(_Merge):
    _op = staticmethod(kernels.maximum)

    def forward(self, inputs, training=False):
        xs = self._inputs(inputs)
        self._n = len(xs)
        if len(xs) == 1:
            self._xs = self._y = None
            return xs[0]
        y = self._fold(self._op, xs)
        self._xs, self._y = (xs, y) if training else (None, None)
        return y

    def backward(self, dy, need_dx=True):
        xs, y = self._xs, self._y
        self._xs = self._y = None
        if not need_dx:
            return [None] * self._n
        if self._n == 1:
            return [dy]
        if xs is None:
            raise RuntimeError(f"{self._owner}: backward called without a training forward")
        return kernels.extremum_backward(dy, xs, y)


@register
class Maximum(_Extremum):
    """Elementwise maximum of the inputs (NaN propagates)."""

    _op = staticmethod(kernels.maximum)


@register
class Minimum(_Extremum):
    """Elementwise minimum of the inputs (NaN propagates)."""

    _op = staticmethod(kernels.minimum)


@register
class Concatenate(_Merge):
    """Join the inputs along ``axis`` (Keras numbering, the batch axis being 0; default -1, the last).

    The inputs must agree on every other axis; the batch axis cannot be the one joined.
    """

    def __init__(self, axis: int = -1, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.axis = _validate.integer(axis, "axis", self._owner)

    def _array_axis(self, rank: int) -> int:
        """``axis`` as a non-negative axis of the batched arrays (rank counts the batch axis)."""
        if not -rank <= self.axis < rank or self.axis % rank == 0:
            raise ValueError(f"{self._owner}: axis must name a non-batch axis of {rank}-d inputs (1..{rank - 1} or "
                             f"-{rank - 1}..-1), got {self.axis}")
        return self.axis % rank

    def _output_shape(self, input_shapes):
        shapes = [tuple(s) for s in input_shapes]
        self._check_count(len(shapes))
        ax = self._array_axis(len(shapes[0]) + 1) - 1
        for i, s in enumerate(shapes[1:], 1):
            if len(s) != len(shapes[0]) or any(a != b for k, (a, b) in enumerate(zip(s, shapes[0])) if k != ax):
                raise ValueError(
                    f"{self._owner}: inputs must match on every axis but axis {self.axis}; input 0 has shape (batch, "
                    f"{', '.join(map(str, shapes[0]))}) and input {i} (batch, {', '.join(map(str, s))})")
        out = list(shapes[0])
        out[ax] = sum(s[ax] for s in shapes)
        return tuple(out)

    def forward(self, inputs, training=False):
        xs = self._inputs(inputs)
        self._n = len(xs)
        if len(xs) == 1:
            return xs[0]
        ax = self._array_axis(xs[0].ndim)
        self._ax, self._sizes = ax, tuple(int(x.shape[ax]) for x in xs)
        return kernels.concatenate(xs, axis=ax)

    def backward(self, dy, need_dx=True):
        if not need_dx:
            return [None] * self._n
        if self._n == 1:
            return [dy]
        return kernels.concatenate_backward(dy, self._sizes, axis=self._ax)

    def get_config(self):
        return {**super().get_config(), "axis": self.axis}


# ----- Keras's merge functions: a layer made and called in one go ------------------------------------
def add(inputs: Sequence[Any], **kwargs: Any) -> Any:
    """``keras.layers.add``: ``Add(**kwargs)(inputs)``."""
    return Add(**kwargs)(inputs)


def subtract(inputs: Sequence[Any], **kwargs: Any) -> Any:
    """``keras.layers.subtract``: ``Subtract(**kwargs)(inputs)``."""
    return Subtract(**kwargs)(inputs)


def multiply(inputs: Sequence[Any], **kwargs: Any) -> Any:
    """``keras.layers.multiply``: ``Multiply(**kwargs)(inputs)``."""
    return Multiply(**kwargs)(inputs)


def average(inputs: Sequence[Any], **kwargs: Any) -> Any:
    """``keras.layers.average``: ``Average(**kwargs)(inputs)``."""
    return Average(**kwargs)(inputs)


def maximum(inputs: Sequence[Any], **kwargs: Any) -> Any:
    """``keras.layers.maximum``: ``Maximum(**kwargs)(inputs)``."""
    return Maximum(**kwargs)(inputs)


def minimum(inputs: Sequence[Any], **kwargs: Any) -> Any:
    """``keras.layers.minimum``: ``Minimum(**kwargs)(inputs)``."""
    return Minimum(**kwargs)(inputs)


def concatenate(inputs: Sequence[Any], axis: int = -1, **kwargs: Any) -> Any:
    """``keras.layers.concatenate``: ``Concatenate(axis=axis, **kwargs)(inputs)``."""
    return Concatenate(axis=axis, **kwargs)(inputs)


__all__ += ["add", "subtract", "multiply", "average", "maximum", "minimum", "concatenate"]
