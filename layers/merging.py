"""Merge layers (Keras 3): Add, Subtract, Multiply, Average, Maximum, Minimum, Concatenate, Dot.

Multi-input layers (``multi_input = True``): ``forward(inputs)`` takes a list of arrays (NumPy or
DeviceArray, one device), ``backward(dy)`` returns one gradient per input, in input order, each a
distinct array (a caller may accumulate into one in place). Shapes given to ``build`` and
``compute_output_shape`` are lists of per-input shapes without the batch axis.

The elementwise layers broadcast as Keras 3's ``Merge`` does: the batch axes must agree; an input of
lower rank gets size-1 axes right after its batch axis (Keras's ``expand_dims(x, 1)``), then size-1 axes
stretch (NumPy rules); other mismatches are refused with the shapes named. Inputs of one shape take the
plain elementwise kernels; broadcast ones the broadcasting kernels, and their gradients are summed back
over the stretched axes. Maximum/Minimum send each element's gradient to the first input holding the
extremum (TensorFlow's rule for ties). Inputs are cast to the layer's compute dtype.

``Dot`` (a layer with a ``call`` of its own, in ``keras.ops``: it trains through the tape) is Keras 3's
``batch_dot`` of two inputs along ``axes``, optionally L2-normalised first.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from dnnbind import _validate, kernels
from dnnbind import ops as _ops
from dnnbind.kernels import numeric as _numeric

from .base import Layer, register

__all__ = ["Add", "Subtract", "Multiply", "Average", "Maximum", "Minimum", "Concatenate", "Dot"]


def _shape_text(shape: Sequence[Any]) -> str:
    return "(batch" + "".join(f", {s}" for s in shape) + ")"


class _Merge(Layer):
    """Shared plumbing: input-count and shape checks, casting, and the n == 1 pass-through."""

    multi_input = True
    _exact_inputs: "int | None" = None  # Subtract takes exactly 2
    _broadcasts = True  # elementwise layers broadcast (Keras 3); Concatenate does not
    _bshapes: "tuple | None" = None  # the last forward's (aligned, original) input shapes when it broadcast

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
        out = shapes[0]
        for i, s in enumerate(shapes[1:], 1):
            out = self._broadcast_pair(out, s, i, shapes)
        return out

    def _broadcast_pair(self, a: tuple, b: tuple, i: int, shapes: list) -> tuple:
        """Keras 3's ``_compute_elemwise_op_output_shape`` (shapes without the batch axis)."""
        if len(a) < len(b):
            a, b = b, a
        b = (1,) * (len(a) - len(b)) + b
        out = []
        for m, n in zip(a, b):
            if m is None or n is None:
                out.append(None)
            elif m == 1 or m == n:
                out.append(n)
            elif n == 1:
                out.append(m)
            else:
                raise ValueError(
                    f"{self._owner}: inputs have incompatible shapes: input 0 is {_shape_text(shapes[0])} and input "
                    f"{i} {_shape_text(shapes[i])}; each axis must agree or be 1 in one of them (Keras broadcasting)")
        return tuple(out)

    def _inputs(self, inputs: Sequence[Any]) -> list:
        if not isinstance(inputs, (list, tuple)):
            raise _validate.ArgumentTypeError(f"{self._owner}: forward takes a list of arrays, got "
                                              f"{type(inputs).__name__}")
        xs = [self._cast_input(x) for x in inputs]
        self._check_count(len(xs))
        return self._align(xs) if self._broadcasts else xs

    def _align(self, xs: list) -> list:
        """``xs`` as given when they share one shape (``self._bshapes`` None); else checked (batch sizes, Keras
        broadcasting), each reshaped to the common rank, and ``self._bshapes = (aligned, original)`` kept for
        backward's reductions."""
        shapes = [tuple(int(d) for d in x.shape) for x in xs]
        if all(s == shapes[0] for s in shapes):
            self._bshapes = None
            return xs
        if any(len(s) == 0 for s in shapes) or len({s[0] for s in shapes}) > 1:
            raise ValueError(f"{self._owner}: cannot merge tensors with different batch sizes (or without a batch "
                             f"axis); got shapes {shapes}")
        self._output_shape([s[1:] for s in shapes])  # refuses what does not broadcast, before any kernel
        rank = max(len(s) for s in shapes)
        aligned = [s if len(s) == rank else (s[0],) + (1,) * (rank - len(s)) + s[1:] for s in shapes]
        self._bshapes = (aligned, shapes)
        return [x if tuple(x.shape) == a else x.reshape(a) for x, a in zip(xs, aligned)]

    def _combine(self, name: str, a: Any, b: Any) -> Any:
        """``name`` of two aligned inputs: the plain kernel for one shape, the broadcasting one otherwise."""
        if self._bshapes is None:
            return getattr(kernels, name)(a, b)
        return self._writable(_numeric.binary(name, a, b))

    @staticmethod
    def _writable(y: Any) -> Any:
        """The NumPy twin of a broadcasting kernel may give a read-only view; the layer's results are written
        in place later (folds, a caller's gradient accumulation), so they get their own memory."""
        return kernels.copy(y) if isinstance(y, np.ndarray) and not y.flags.writeable else y

    def _reduced(self, grads: list) -> list:
        """Full-size gradients summed over each input's stretched axes, in its own shape, each a distinct array."""
        if self._bshapes is None:
            return grads
        aligned, original = self._bshapes
        out, seen = [], set()
        for g, a, o in zip(grads, aligned, original):
            axes = tuple(k for k, (n, m) in enumerate(zip(a, g.shape)) if n == 1 and int(m) != 1)
            if axes:
                g = _numeric.reduce("sum", g, axis=axes, keepdims=True)
            elif id(g) in seen:
                g = kernels.copy(g)
            seen.add(id(g))
            out.append(g if tuple(g.shape) == o else g.reshape(o))
        return out

    def _fold(self, name: str, xs: list) -> Any:
        """``name(...name(name(xs[0], xs[1]), xs[2])..., xs[-1])``: one new array, then in place (one shape)."""
        y = self._combine(name, xs[0], xs[1])
        op = getattr(kernels, name)
        for x in xs[2:]:
            if self._bshapes is None:
                op(y, x, out=y)
            else:
                y = self._combine(name, y, x)
        return y

    def _pass_through(self, dy: Any, n: int) -> list:
        """``dy`` for the first input and copies for the others (summed back to each input's shape)."""
        if self._bshapes is not None:
            return self._reduced([dy] * n)
        return [dy] + [kernels.copy(dy) for _ in range(n - 1)]

    def _full(self, x: Any, shape: tuple) -> Any:
        """An aligned input stretched to the output ``shape`` (a stride-0 view copied)."""
        if tuple(x.shape) == shape:
            return x
        strides, step = [], 1
        for n in reversed(tuple(x.shape)):
            strides.append(step)
            step *= int(n)
        strides = [0 if int(n) == 1 and m != 1 else st for n, m, st in zip(x.shape, shape, reversed(strides))]
        return _numeric.strided_copy(x, shape, strides, 0)


@register
class Add(_Merge):
    """Elementwise sum of the inputs."""

    def forward(self, inputs, training=False):
        xs = self._inputs(inputs)
        self._n = len(xs)
        return xs[0] if len(xs) == 1 else self._fold("add", xs)

    def backward(self, dy, need_dx=True):
        return self._pass_through(dy, self._n) if need_dx else [None] * self._n


@register
class Subtract(_Merge):
    """``inputs[0] - inputs[1]`` (exactly two inputs)."""

    _exact_inputs = 2

    def forward(self, inputs, training=False):
        a, b = self._inputs(inputs)
        return self._combine("subtract", a, b)

    def backward(self, dy, need_dx=True):
        if not need_dx:
            return [None, None]
        return self._reduced([dy, kernels.scale(dy, -1.0)])


@register
class Multiply(_Merge):
    """Elementwise product of the inputs; the gradient of input i is ``dy`` times the other inputs."""

    def forward(self, inputs, training=False):
        xs = self._inputs(inputs)
        self._n = len(xs)
        self._xs = xs if training else None
        return xs[0] if len(xs) == 1 else self._fold("multiply", xs)

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
                    g = self._combine("multiply", dy if g is None else g, x)
            grads.append(g)
        return self._reduced(grads)


@register
class Average(_Merge):
    """Elementwise mean of the inputs (their sum divided by their count)."""

    def forward(self, inputs, training=False):
        xs = self._inputs(inputs)
        self._n = len(xs)
        if len(xs) == 1:
            return xs[0]
        y = self._fold("add", xs)
        return kernels.scale(y, 1.0 / len(xs), out=y)

    def backward(self, dy, need_dx=True):
        if not need_dx:
            return [None] * self._n
        if self._n == 1:
            return [dy]
        return self._reduced([kernels.scale(dy, 1.0 / self._n) for _ in range(self._n)])


class _Extremum(_Merge):
    _op = "maximum"

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
        if self._bshapes is None:
            return kernels.extremum_backward(dy, xs, y)
        shape = tuple(int(d) for d in dy.shape)
        return self._reduced(kernels.extremum_backward(dy, [self._full(x, shape) for x in xs], y))


@register
class Maximum(_Extremum):
    """Elementwise maximum of the inputs (NaN propagates)."""

    _op = "maximum"


@register
class Minimum(_Extremum):
    """Elementwise minimum of the inputs (NaN propagates)."""

    _op = "minimum"


@register
class Concatenate(_Merge):
    """Join the inputs along ``axis`` (Keras numbering, the batch axis being 0; default -1, the last).

    The inputs must agree on every other axis; the batch axis cannot be the one joined.
    """

    _broadcasts = False

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


def _batch_dot(x: Any, y: Any, axes: Sequence[int]) -> Any:
    """Keras 3's ``batch_dot`` of two batched tensors (rank >= 2) over ``x``'s axis ``axes[0]`` and ``y``'s
    ``axes[1]`` (non-negative, not the batch axis): the result has ``x``'s other axes, then ``y``'s other
    non-batch axes, and is ``(batch, 1)`` where that would leave the batch axis alone."""
    a0, a1 = axes
    x_rank, y_rank = x.ndim, y.ndim
    if x_rank == 2:
        x, a0 = _ops.expand_dims(x, 1), a0 + 1
    if y_rank == 2:
        y = _ops.expand_dims(y, 2)
    # x: the contracted axis last; y: the contracted axis right after the batch axis
    x = _ops.transpose(x, [k for k in range(x.ndim) if k != a0] + [a0]) if a0 != x.ndim - 1 else x
    y = _ops.transpose(y, [0, a1] + [k for k in range(1, y.ndim) if k != a1]) if a1 != 1 else y
    x_mid, y_tail = tuple(x.shape[1:-1]), tuple(y.shape[2:])
    batch, depth = int(x.shape[0]), int(x.shape[-1])
    x3 = _ops.reshape(x, (batch, -1, depth)) if x.ndim != 3 else x
    y3 = _ops.reshape(y, (batch, depth, -1)) if y.ndim != 3 else y
    out = _ops.matmul(x3, y3)
    if x.ndim != 3 or y.ndim != 3:
        out = _ops.reshape(out, (batch, *x_mid, *y_tail))
    if x_rank == 2:
        return _ops.squeeze(out, 1)
    if y_rank == 2:
        return _ops.squeeze(out, -1)
    return out


@register
class Dot(Layer):
    """Dot product of two inputs along ``axes`` (Keras 3's ``keras.layers.Dot``): ``axes`` is one int (the same
    axis of both) or two (``(axis of input 0, axis of input 1)``), negative counting from the last; never the
    batch axis 0. ``normalize=True`` L2-normalises both inputs along those axes first (the cosine proximity).
    Inputs of shapes ``(b, 3, 5)`` and ``(b, 10, 3)`` with ``axes=(1, 2)`` give ``(b, 5, 10)``; two ``(b, n)``
    give ``(b, 1)``."""

    def __init__(self, axes: Any, normalize: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if isinstance(axes, bool) or not isinstance(axes, (int, np.integer)):
            if not isinstance(axes, (list, tuple)):
                raise _validate.ArgumentTypeError(f"{self._owner}: invalid type for argument `axes`: it should be a "
                                                  f"list or an int. Received: axes={axes!r}")
            if len(axes) != 2:
                raise ValueError(f"{self._owner}: invalid format for argument `axes`: it should contain two "
                                 f"elements. Received: axes={axes!r}")
            if any(isinstance(a, bool) or not isinstance(a, (int, np.integer)) for a in axes):
                raise ValueError(f"{self._owner}: invalid format for argument `axes`: list elements should be "
                                 f"integers. Received: axes={axes!r}")
            axes = type(axes)(int(a) for a in axes)
        else:
            axes = int(axes)
        self.axes = axes
        self.normalize = bool(normalize)

    @property
    def _owner(self) -> str:
        return f"Dot '{self.name}'"

    def _pair(self, shapes: Sequence[Sequence[Any]]) -> tuple:
        if not isinstance(shapes, (list, tuple)) or len(shapes) != 2 or not all(
                isinstance(s, (list, tuple)) for s in shapes):
            raise ValueError(f"{self._owner}: a `Dot` layer should be called on a list of 2 inputs. Received: "
                             f"input_shape={shapes}")
        return tuple(shapes[0]), tuple(shapes[1])

    def _resolved_axes(self, shape1: tuple, shape2: tuple) -> tuple[int, int]:
        """``axes`` as non-negative axes of the batched shapes, checked: rank >= 2, not the batch axis, in range,
        sizes that agree."""
        for i, s in enumerate((shape1, shape2)):
            if len(s) < 2:
                raise ValueError(f"{self._owner}: cannot do batch_dot on inputs with rank < 2; input {i} has shape "
                                 f"{s} (the batch axis counts)")
        wanted = (self.axes, self.axes) if isinstance(self.axes, int) else tuple(self.axes)
        out = []
        for i, (a, s) in enumerate(zip(wanted, (shape1, shape2))):
            if not -len(s) <= a < len(s):
                raise ValueError(f"{self._owner}: axes={self.axes!r} is out of range for input {i} of shape {s}")
            a %= len(s)
            if a == 0:
                raise ValueError(f"{self._owner}: cannot perform batch_dot over axis 0 (the batch axis); got "
                                 f"axes={self.axes!r} for shapes {shape1} and {shape2}")
            out.append(a)
        d1, d2 = shape1[out[0]], shape2[out[1]]
        if d1 is not None and d2 is not None and d1 != d2:
            raise ValueError(f"{self._owner}: incompatible input shapes: axis values {d1} (at axis {out[0]}) != {d2} "
                             f"(at axis {out[1]}). Full input shapes: {shape1}, {shape2}")
        b1, b2 = shape1[0], shape2[0]
        if b1 is not None and b2 is not None and b1 != b2:
            raise ValueError(f"{self._owner}: cannot do batch_dot on inputs with different batch sizes: {shape1} and "
                             f"{shape2}")
        return out[0], out[1]

    def build(self, input_shape: Any) -> None:
        self._resolved_axes(*self._pair(input_shape))
        self.built = True

    def call(self, inputs: Any) -> Any:
        if not isinstance(inputs, (list, tuple)) or len(inputs) != 2:
            raise ValueError(f"{self._owner}: a `Dot` layer should be called on exactly 2 inputs, got "
                             f"{len(inputs) if isinstance(inputs, (list, tuple)) else type(inputs).__name__}")
        x1, x2 = (_ops.convert_to_tensor(x) for x in inputs)
        axes = self._resolved_axes(tuple(x1.shape), tuple(x2.shape))
        if self.normalize:
            x1 = _ops.normalize(x1, axis=axes[0])
            x2 = _ops.normalize(x2, axis=axes[1])
        return _batch_dot(x1, x2, axes)

    def compute_output_shape(self, input_shape: Any) -> tuple:
        shape1, shape2 = self._pair(input_shape)
        a0, a1 = self._resolved_axes(shape1, shape2)
        out = [d for k, d in enumerate(shape1) if k != a0] + [d for k, d in enumerate(shape2) if k not in (0, a1)]
        return tuple(out + [1] if len(out) == 1 else out)

    def get_config(self) -> dict:
        return {**super().get_config(), "axes": self.axes, "normalize": self.normalize}


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


def dot(inputs: Sequence[Any], axes: Any = -1, **kwargs: Any) -> Any:
    """``keras.layers.dot``: ``Dot(axes=axes, **kwargs)(inputs)`` (``normalize=`` among ``kwargs``)."""
    return Dot(axes=axes, **kwargs)(inputs)


__all__ += ["add", "subtract", "multiply", "average", "maximum", "minimum", "concatenate", "dot"]
