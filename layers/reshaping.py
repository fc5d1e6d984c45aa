"""Reshaping layers (Keras 3): Reshape, Permute, Identity, ZeroPadding2D, Cropping2D, UpSampling2D; ZeroPadding1D/3D,
Cropping1D/3D, UpSampling1D/3D and RepeatVector (written in keras.ops).

None has weights. Reshape, Permute and Identity move data of any dtype as it is; the 2-d layers
cast their input to the compute dtype and take ``data_format`` (``"channels_last"``, the default:
``(batch, height, width, channels)``; or ``"channels_first"``).
"""

from __future__ import annotations

import math
import numbers
from typing import Any, Sequence

import numpy as np

from dnnbind import _validate, kernels
from dnnbind import backend as _backend
from dnnbind import ops as _ops
from dnnbind.ops._nn_common import spatial_tuple
from dnnbind.kernels.reshaping import UPSAMPLE_INTERPOLATIONS

from .base import Layer, register
from .conv import check_image_shape, data_format_to_layout

__all__ = ["Reshape", "Permute", "Identity", "ZeroPadding2D", "Cropping2D", "UpSampling2D"]

# Keras accepts these too (through kernels.image.resize); dnnbind has no kernels for them yet
_UNSUPPORTED_INTERPOLATIONS = ("bicubic", "lanczos3", "lanczos5", "area")


def _shape_text(shape: Sequence[int]) -> str:
    return f"(batch, {', '.join(map(str, shape))})"


@register
class Reshape(Layer):
    """Reshape each sample to ``target_shape`` (no batch axis; one entry may be -1, inferred).

    A view of contiguous data (no copy), in the data's own order (channels_last stays channels_last).
    """

    def __init__(self, target_shape: Sequence[int], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        owner = f"Reshape '{self.name}'"
        if isinstance(target_shape, (numbers.Integral, np.integer)) and not isinstance(target_shape, bool):
            target_shape = (target_shape,)
        if isinstance(target_shape, (str, bytes)) or not isinstance(target_shape, (list, tuple)):
            raise _validate.ArgumentTypeError(f"{owner}: target_shape must be a tuple of ints such as (7, 7, 64), "
                                              f"got {target_shape!r}")
        dims = []
        for d in target_shape:
            if isinstance(d, (bool, np.bool_)) or not isinstance(d, (numbers.Integral, np.integer)):
                raise _validate.ArgumentTypeError(f"{owner}: target_shape must hold ints, got {tuple(target_shape)}")
            if d < 1 and d != -1:
                raise ValueError(f"{owner}: target_shape entries must be >= 1 or -1, got {tuple(target_shape)}")
            dims.append(int(d))
        if dims.count(-1) > 1:
            raise ValueError(f"{owner}: target_shape may hold one -1, got {tuple(dims)}")
        self.target_shape = tuple(dims)

    def _output_shape(self, input_shape):
        size = math.prod(input_shape)
        known = math.prod(d for d in self.target_shape if d != -1)
        dims = list(self.target_shape)
        if -1 in dims:
            if size % known:
                raise ValueError(f"Reshape '{self.name}': cannot reshape {_shape_text(input_shape)} ({size} values per "
                                 f"sample) to {_shape_text(self.target_shape)}: {size} is not a multiple of {known}")
            dims[dims.index(-1)] = size // known
        elif known != size:
            raise ValueError(f"Reshape '{self.name}': cannot reshape {_shape_text(input_shape)} ({size} values per "
                             f"sample) to {_shape_text(self.target_shape)} ({known} values)")
        return tuple(dims)

    def forward(self, x, training=False):
        self._in_shape = tuple(x.shape)
        return x.reshape(int(x.shape[0]), *self.output_shape)

    def backward(self, dy, need_dx=True):
        return dy.reshape(*self._in_shape) if need_dx else None

    def get_config(self):
        return {**super().get_config(), "target_shape": list(self.target_shape)}


@register
class Permute(Layer):
    """Permute the non-batch axes: ``dims`` is a permutation of ``1..rank`` (1-indexed, batch excluded),
    e.g. ``Permute((2, 1))`` swaps the two axes of ``(batch, a, b)`` inputs. Copies the data."""

    def __init__(self, dims: Sequence[int], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        owner = f"Permute '{self.name}'"
        if isinstance(dims, (str, bytes)) or not isinstance(dims, (list, tuple)):
            raise _validate.ArgumentTypeError(f"{owner}: dims must be a tuple of ints such as (2, 1), got {dims!r}")
        items = [_validate.integer(d, "dims", owner) for d in dims]
        if sorted(items) != list(range(1, len(items) + 1)):
            raise ValueError(f"{owner}: dims must be a permutation of 1..{len(items)} (the batch axis 0 stays "
                             f"first), got {tuple(dims)}")
        self.dims = tuple(items)
        inverse = [0] * len(items)
        for k, d in enumerate(items):
            inverse[d - 1] = k + 1
        self._forward_axes = (0, *self.dims)
        self._backward_axes = (0, *inverse)

    def _output_shape(self, input_shape):
        if len(input_shape) != len(self.dims):
            raise ValueError(f"Permute '{self.name}': dims {self.dims} permute {len(self.dims)} axes but the inputs "
                             f"{_shape_text(input_shape)} have {len(input_shape)}")
        return tuple(input_shape[d - 1] for d in self.dims)

    def forward(self, x, training=False):
        return kernels.transpose(x, self._forward_axes)

    def backward(self, dy, need_dx=True):
        return kernels.transpose(dy, self._backward_axes) if need_dx else None

    def get_config(self):
        return {**super().get_config(), "dims": list(self.dims)}


@register
class Identity(Layer):
    """Return the input unchanged (and the gradient unchanged)."""

    def forward(self, x, training=False):
        return x

    def backward(self, dy, need_dx=True):
        return dy if need_dx else None


def _pairs(value: Any, name: str, owner: str) -> tuple[tuple[int, int], tuple[int, int]]:
    """Keras's 2-d padding/cropping forms -> ``((top, bottom), (left, right))``: an int (all four), a pair
    of ints (symmetric height, width) or a pair of pairs."""
    def count(v: Any) -> int:
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, (numbers.Integral, np.integer)):
            raise _validate.ArgumentTypeError(f"{owner}: {name} must be an int, a pair of ints or a pair of pairs "
                                              f"of ints ((top, bottom), (left, right)), got {value!r}")
        if v < 0:
            raise ValueError(f"{owner}: {name} must not be negative, got {value!r}")
        return int(v)

    if not isinstance(value, (list, tuple)):
        p = count(value)
        return (p, p), (p, p)
    if len(value) != 2:
        raise ValueError(f"{owner}: {name} must be an int, a pair of ints or a pair of pairs of ints "
                         f"((top, bottom), (left, right)), got {value!r}")
    out = []
    for item in value:
        if isinstance(item, (list, tuple)):
            if len(item) != 2:
                raise ValueError(f"{owner}: {name} must be a pair of pairs ((top, bottom), (left, right)), "
                                 f"got {value!r}")
            out.append((count(item[0]), count(item[1])))
        else:
            p = count(item)
            out.append((p, p))
    return out[0], out[1]


class _Image2D(Layer):
    """A weightless layer on 4-d images with a ``data_format``."""

    def _set_data_format(self, data_format: Any) -> str:
        owner = f"{type(self).__name__} '{self.name}'"
        self.data_format, self.layout = data_format_to_layout(data_format, owner)
        return owner

    def _hwc(self, shape: Sequence[int]) -> tuple[int, int, int]:
        check_image_shape(tuple(shape), f"{type(self).__name__} '{self.name}'", self.data_format)
        return (shape[0], shape[1], shape[2]) if self.data_format == "channels_last" else (shape[1], shape[2], shape[0])

    def _image_shape(self, h: int, w: int, c: int) -> tuple[int, int, int]:
        return (h, w, c) if self.data_format == "channels_last" else (c, h, w)

    def get_config(self):
        return {**super().get_config(), "data_format": self.data_format}


@register
class ZeroPadding2D(_Image2D):
    """Add rows and columns of zeros around each image.

    ``padding``: an int (every side), ``(rows, cols)`` (symmetric) or ``((top, bottom), (left, right))``,
    in pixels.
    """

    def __init__(self, padding: Any = (1, 1), data_format: str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        owner = self._set_data_format(data_format)
        self.padding = _pairs(padding, "padding", owner)
        (t, b), (l, r) = self.padding
        self._amounts = (t, b, l, r)

    def _output_shape(self, input_shape):
        h, w, c = self._hwc(input_shape)
        t, b, l, r = self._amounts
        return self._image_shape(h + t + b, w + l + r, c)

    def forward(self, x, training=False):
        return kernels.pad2d(self._cast_input(x), self._amounts, layout=self.layout)

    def backward(self, dy, need_dx=True):
        return kernels.crop2d(dy, self._amounts, layout=self.layout) if need_dx else None

    def get_config(self):
        return {**super().get_config(), "padding": [list(p) for p in self.padding]}


@register
class Cropping2D(_Image2D):
    """Remove rows and columns at the edges of each image.

    ``cropping``: an int (every side), ``(rows, cols)`` (symmetric) or ``((top, bottom), (left, right))``,
    in pixels; at least one row and column must remain.
    """

    def __init__(self, cropping: Any = ((0, 0), (0, 0)), data_format: str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        owner = self._set_data_format(data_format)
        self.cropping = _pairs(cropping, "cropping", owner)
        (t, b), (l, r) = self.cropping
        self._amounts = (t, b, l, r)

    def _output_shape(self, input_shape):
        h, w, c = self._hwc(input_shape)
        t, b, l, r = self._amounts
        if t + b >= h or l + r >= w:
            raise ValueError(f"Cropping2D '{self.name}': cropping {self.cropping} ((top, bottom), (left, right)) must "
                             f"leave at least one row and column of the {h}x{w} inputs")
        return self._image_shape(h - t - b, w - l - r, c)

    def forward(self, x, training=False):
        return kernels.crop2d(self._cast_input(x), self._amounts, layout=self.layout)

    def backward(self, dy, need_dx=True):
        return kernels.pad2d(dy, self._amounts, layout=self.layout) if need_dx else None

    def get_config(self):
        return {**super().get_config(), "cropping": [list(p) for p in self.cropping]}


@register
class UpSampling2D(_Image2D):
    """Repeat rows and columns ``size = (rows, cols)`` times (``interpolation="nearest"``) or interpolate
    (``"bilinear"``: half-pixel centres, edges clamped, as Keras's ``kernels.image.resize``)."""

    def __init__(self, size: Any = (2, 2), data_format: str | None = None, interpolation: str = "nearest",
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        owner = self._set_data_format(data_format)
        self.size = _validate.int_pair(size, "size", owner)
        kind = interpolation.lower() if isinstance(interpolation, str) else interpolation
        if kind in _UNSUPPORTED_INTERPOLATIONS:
            raise NotImplementedError(f"{owner}: interpolation {interpolation!r} is not supported; use one of "
                                      f"{', '.join(UPSAMPLE_INTERPOLATIONS)}")
        self.interpolation = _validate.one_of(kind, "interpolation", owner, UPSAMPLE_INTERPOLATIONS)

    def _output_shape(self, input_shape):
        h, w, c = self._hwc(input_shape)
        return self._image_shape(h * self.size[0], w * self.size[1], c)

    def _kwargs(self) -> dict:
        return {"size": self.size, "interpolation": self.interpolation, "layout": self.layout}

    def forward(self, x, training=False):
        x = self._cast_input(x)
        self._x_shape = tuple(x.shape)
        return kernels.upsample2d_forward(x, **self._kwargs())

    def backward(self, dy, need_dx=True):
        return kernels.upsample2d_backward(dy, self._x_shape, **self._kwargs()) if need_dx else None

    def get_config(self):
        return {**super().get_config(), "size": list(self.size), "interpolation": self.interpolation}


# ----------------------------------------------------------------------------------------------------------
# 1-d and 3-d padding, cropping and up-sampling, and RepeatVector: written in keras.ops (the op tape
# differentiates them; they move data of any dtype).
def _n_pairs(value: Any, n: int, name: str, owner: str) -> tuple:
    """Keras's forms of an ``n``-axis padding or cropping -> ``n`` ``(before, after)`` pairs: an int (every
    side), ``n`` ints (symmetric per axis) or ``n`` pairs (for ``n == 1``: an int or one pair)."""
    shape_text = "(before, after)" if n == 1 else f"{n} ints or {n} pairs of ints"
    message = f"{owner}: {name} must be an int or {shape_text}, got {value!r}"

    def count(v: Any) -> int:
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, (numbers.Integral, np.integer)):
            raise _validate.ArgumentTypeError(message)
        if v < 0:
            raise ValueError(f"{owner}: {name} must not be negative, got {value!r}")
        return int(v)

    if not isinstance(value, (list, tuple)):
        p = count(value)
        return ((p, p),) * n
    if n == 1:
        if len(value) != 2:
            raise ValueError(message)
        return ((count(value[0]), count(value[1])),)
    if len(value) != n:
        raise ValueError(message)
    out = []
    for item in value:
        if isinstance(item, (list, tuple)):
            if len(item) != 2:
                raise ValueError(message)
            out.append((count(item[0]), count(item[1])))
        else:
            p = count(item)
            out.append((p, p))
    return tuple(out)


def _fmt(data_format: "str | None", owner: str) -> str:
    fmt = _backend.image_data_format() if data_format is None else str(data_format).lower()
    return _validate.one_of(fmt, "data_format", owner, ("channels_last", "channels_first"))


class _SpatialND(Layer):
    """Shared checks of the 1-d and 3-d reshaping layers: inputs of rank ``rank + 2``."""

    rank = 1
    data_format = "channels_last"

    @property
    def _owner(self) -> str:
        return f"{type(self).__name__} '{self.name}'"

    def _check(self, shape: Any) -> tuple:
        shape = tuple(shape)
        if len(shape) != self.rank + 2:
            spatial = ["steps"] if self.rank == 1 else [f"dim{i + 1}" for i in range(self.rank)]
            axes = spatial + ["features"] if self.data_format == "channels_last" else ["features"] + spatial
            raise ValueError(f"{self._owner} expects {self.rank + 2}-d inputs (batch, {', '.join(axes)}), got shape "
                             f"{shape}")
        return shape

    def _first(self) -> int:
        return 1 if self.data_format == "channels_last" else 2


class _ZeroPaddingND(_SpatialND):
    def __init__(self, padding: Any, data_format: "str | None" = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.padding = _n_pairs(padding, self.rank, "padding", self._owner)
        self.data_format = _fmt(data_format, self._owner)
        self.built = True

    def _widths(self) -> list:
        pads = [(0, 0)] * (self.rank + 2)
        for i, p in enumerate(self.padding):
            pads[self._first() + i] = p
        return pads

    def call(self, inputs: Any) -> Any:
        self._check(inputs.shape)
        return _ops.pad(inputs, self._widths())

    def compute_output_shape(self, input_shape: Any) -> tuple:
        shape = list(self._check(input_shape))
        for i, (a, b) in enumerate(self.padding):
            j = self._first() + i
            shape[j] = None if shape[j] is None else int(shape[j]) + a + b
        return tuple(shape)

    def get_config(self) -> dict:
        padding = list(self.padding[0]) if self.rank == 1 else [list(p) for p in self.padding]
        return {**super().get_config(), "padding": padding, "data_format": self.data_format}


@register
class ZeroPadding1D(_ZeroPaddingND):
    """``ZeroPadding1D(padding=1, data_format=None)``: zeros before and after the steps of ``(batch, steps,
    features)`` (``padding``: an int or ``(before, after)``)."""

    rank = 1

    def __init__(self, padding: Any = 1, data_format: "str | None" = None, **kwargs: Any) -> None:
        super().__init__(padding, data_format, **kwargs)


@register
class ZeroPadding3D(_ZeroPaddingND):
    """``ZeroPadding3D(padding=((1, 1), (1, 1), (1, 1)), data_format=None)``: zeros around the three spatial
    axes (an int, three ints or three ``(before, after)`` pairs)."""

    rank = 3

    def __init__(self, padding: Any = ((1, 1), (1, 1), (1, 1)), data_format: "str | None" = None,
                 **kwargs: Any) -> None:
        super().__init__(padding, data_format, **kwargs)


class _CroppingND(_SpatialND):
    def __init__(self, cropping: Any, data_format: "str | None" = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.cropping = _n_pairs(cropping, self.rank, "cropping", self._owner)
        self.data_format = _fmt(data_format, self._owner)
        self.built = True

    def compute_output_shape(self, input_shape: Any) -> tuple:
        shape = list(self._check(input_shape))
        for i, (a, b) in enumerate(self.cropping):
            j = self._first() + i
            if shape[j] is None:
                continue
            if int(shape[j]) - a - b < 1:
                raise ValueError(f"{self._owner}: cropping {self.cropping} leaves nothing of axis {j} (length "
                                 f"{shape[j]}) of inputs of shape {tuple(input_shape)}")
            shape[j] = int(shape[j]) - a - b
        return tuple(shape)

    def call(self, inputs: Any) -> Any:
        self.compute_output_shape(tuple(inputs.shape))
        index = [slice(None)] * (self.rank + 2)
        for i, (a, b) in enumerate(self.cropping):
            j = self._first() + i
            index[j] = slice(a, int(inputs.shape[j]) - b)
        return inputs[tuple(index)]


@register
class Cropping1D(_CroppingND):
    """``Cropping1D(cropping=(1, 1))``: drop steps at the start and end of ``(batch, steps, features)``."""

    rank = 1

    def __init__(self, cropping: Any = (1, 1), **kwargs: Any) -> None:
        super().__init__(cropping, "channels_last", **kwargs)

    def get_config(self) -> dict:
        return {**Layer.get_config(self), "cropping": list(self.cropping[0])}


@register
class Cropping3D(_CroppingND):
    """``Cropping3D(cropping=((1, 1), (1, 1), (1, 1)), data_format=None)``: crop the three spatial axes."""

    rank = 3

    def __init__(self, cropping: Any = ((1, 1), (1, 1), (1, 1)), data_format: "str | None" = None,
                 **kwargs: Any) -> None:
        super().__init__(cropping, data_format, **kwargs)

    def get_config(self) -> dict:
        return {**super().get_config(), "cropping": [list(p) for p in self.cropping], "data_format": self.data_format}


@register
class UpSampling1D(_SpatialND):
    """``UpSampling1D(size=2)``: each step of ``(batch, steps, features)`` repeated ``size`` times."""

    rank = 1

    def __init__(self, size: int = 2, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.size = _validate.positive_int(size, "size", self._owner)
        self.built = True

    def call(self, inputs: Any) -> Any:
        self._check(inputs.shape)
        return _ops.repeat(inputs, self.size, axis=1)

    def compute_output_shape(self, input_shape: Any) -> tuple:
        shape = self._check(input_shape)
        return (shape[0], None if shape[1] is None else int(shape[1]) * self.size, shape[2])

    def get_config(self) -> dict:
        return {**super().get_config(), "size": self.size}


@register
class UpSampling3D(_SpatialND):
    """``UpSampling3D(size=(2, 2, 2), data_format=None)``: nearest-neighbour up-sampling of the three spatial
    axes (each entry repeated ``size[i]`` times along axis ``i``)."""

    rank = 3

    def __init__(self, size: Any = (2, 2, 2), data_format: "str | None" = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.size = spatial_tuple(size, 3, "size", self._owner)
        self.data_format = _fmt(data_format, self._owner)
        self.built = True

    def call(self, inputs: Any) -> Any:
        self._check(inputs.shape)
        out = inputs
        for i, s in enumerate(self.size):
            if s != 1:
                out = _ops.repeat(out, s, axis=self._first() + i)
        return out

    def compute_output_shape(self, input_shape: Any) -> tuple:
        shape = list(self._check(input_shape))
        for i, s in enumerate(self.size):
            j = self._first() + i
            shape[j] = None if shape[j] is None else int(shape[j]) * s
        return tuple(shape)

    def get_config(self) -> dict:
        return {**super().get_config(), "size": list(self.size), "data_format": self.data_format}


@register
class RepeatVector(Layer):
    """``RepeatVector(n)``: ``(batch, features) -> (batch, n, features)``."""

    def __init__(self, n: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.n = _validate.positive_int(n, "n", f"RepeatVector '{self.name}'")
        self.built = True

    def _check(self, shape: Any) -> tuple:
        shape = tuple(shape)
        if len(shape) != 2:
            raise ValueError(f"RepeatVector '{self.name}' expects 2-d inputs (batch, features), got shape {shape}")
        return shape

    def call(self, inputs: Any) -> Any:
        self._check(inputs.shape)
        return _ops.repeat(_ops.expand_dims(inputs, 1), self.n, axis=1)

    def compute_output_shape(self, input_shape: Any) -> tuple:
        shape = self._check(input_shape)
        return (shape[0], self.n, shape[1])

    def get_config(self) -> dict:
        return {**super().get_config(), "n": self.n}


__all__ += ["ZeroPadding1D", "ZeroPadding3D", "Cropping1D", "Cropping3D", "UpSampling1D", "UpSampling3D",
            "RepeatVector"]
