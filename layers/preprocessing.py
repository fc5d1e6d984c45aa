"""Preprocessing layers (Keras 3): Rescaling and Normalization (with ``adapt``).

Both cast their input to the compute dtype (uint8 images become floats) and compute in float32
(float64 under a float64 policy). Their constants live on the layer's device, made at ``build``
(and again after ``to``), never inside a training step.
"""

from __future__ import annotations

import itertools
import math
import numbers
from typing import Any, Iterable, Iterator, Sequence

import numpy as np

from dnnbind import _validate, backend, kernels
from dnnbind.kernels.preprocessing import channel_run

from .base import Layer, register, split_batch

__all__ = ["Rescaling", "Normalization"]

_EPSILON = 1e-7  # keras.backend.epsilon(), Normalization's floor on the standard deviation
_ADAPT_CHUNK = 1 << 22  # elements per float64 pass of adapt()


def _constant_value(value: Any, name: str, owner: str) -> "float | list":
    """A number or a 1-d list of numbers (per channel), as it goes in the config."""
    if isinstance(value, (numbers.Real, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_)):
        return _validate.number(value, name, owner)
    try:
        arr = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError):
        raise _validate.ArgumentTypeError(f"{owner}: {name} must be a number or a 1-d list of numbers (one per "
                                          f"channel), got {value!r}") from None
    if arr.ndim > 1 or arr.size == 0 or not np.all(np.isfinite(arr)):
        raise ValueError(f"{owner}: {name} must be a finite number or a non-empty 1-d list of finite numbers, got "
                         f"{value!r}")
    return [float(v) for v in arr.reshape(-1)]


def _keras_shape(shape: tuple) -> Any:
    """A weight's ``to_keras``: the internal array seen with its Keras ``shape`` (the layer base stores
    0-d weights 1-d: np.ascontiguousarray makes 0-d arrays 1-d)."""
    def to_keras(a: np.ndarray) -> np.ndarray:
        return a.reshape(shape)

    return to_keras


class _Constants(Layer):
    """A layer whose computation uses constant arrays made from host values at build."""

    def _param_dtype(self) -> np.dtype:
        return np.dtype(np.float64) if self._effective_compute_dtype() == np.float64 else np.dtype(np.float32)

    def _host_constants(self) -> dict:
        """name -> host array of the constants (empty when there are none)."""
        return {}

    def _make_constants(self) -> None:
        dt = self._param_dtype()
        self._consts = {k: backend.asarray(np.ascontiguousarray(v, dtype=dt), device=self.device)
                        for k, v in self._host_constants().items()}

    def _on_device_change(self) -> None:
        if self.built:
            self._make_constants()


@register
class Rescaling(_Constants):
    """``y = x * scale + offset``; ``scale``/``offset`` are numbers or 1-d lists with one value per
    channel of the last axis (Keras broadcasting: channels_last)."""

    def __init__(self, scale: Any, offset: Any = 0.0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        owner = f"Rescaling '{self.name}'"
        self.scale = _constant_value(scale, "scale", owner)
        self.offset = _constant_value(offset, "offset", owner)

    def _host_constants(self) -> dict:
        scale, offset = np.asarray(self.scale, np.float64), np.asarray(self.offset, np.float64)
        shape = np.broadcast_shapes(scale.shape, offset.shape)
        return {"scale": np.broadcast_to(scale, shape), "offset": np.broadcast_to(offset, shape)}

    def build(self, input_shape):
        _, shape = split_batch(input_shape)
        consts = self._host_constants()
        c = consts["scale"].shape[0] if consts["scale"].ndim else 1
        if consts["scale"].ndim and (not shape or shape[-1] != c):
            raise ValueError(f"Rescaling '{self.name}': scale/offset hold {c} values, one per channel of the last "
                             f"axis, but the inputs are (batch, {', '.join(map(str, shape))})")
        self._set_built(shape)
        self._make_constants()

    def forward(self, x, training=False):
        return kernels.rescale(self._cast_input(x), self._consts["scale"], self._consts["offset"])

    def backward(self, dy, need_dx=True):
        return kernels.rescale(dy, self._consts["scale"]) if need_dx else None

    def get_config(self):
        return {**super().get_config(), "scale": self.scale, "offset": self.offset}


@register
class Normalization(_Constants):
    """``y = (x - mean) / max(sqrt(variance), 1e-7)`` per index of the ``axis`` axes (``invert=True``:
    ``y = mean + x * max(sqrt(variance), 1e-7)``).

    ``axis``: an int, a tuple of ints or None (one mean and variance for everything); Keras numbering
    (the batch axis is 0 and cannot be kept). The kept axes must be neighbours, apart from axes of
    size 1 between them. ``mean``/``variance`` given: constants broadcast to the kept axes as Keras
    does (no weights). Otherwise the non-trainable weights ``mean`` and ``variance`` (shape: the kept
    axes' sizes) and ``count`` (shape ``()``, kept at 0 as Keras 3 does, float because checkpoints
    hold float tensors), set by :meth:`adapt`.
    """

    def __init__(self, axis: "int | Sequence[int] | None" = -1, mean: Any = None, variance: Any = None,
                 invert: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        owner = f"Normalization '{self.name}'"
        if axis is None:
            axes: tuple = ()
        elif isinstance(axis, (list, tuple)):
            axes = tuple(_validate.integer(a, "axis", owner) for a in axis)
        else:
            axes = (_validate.integer(axis, "axis", owner),)
        self.axis = axes
        self.invert = _validate.boolean(invert, "invert", owner)
        if (mean is None) != (variance is None):
            raise ValueError(f"{owner}: mean and variance must be given together, got mean={mean!r} and "
                             f"variance={variance!r}")
        if mean is not None:
            try:
                m, v = np.asarray(mean, dtype=np.float64), np.asarray(variance, dtype=np.float64)
            except (TypeError, ValueError):
                raise _validate.ArgumentTypeError(f"{owner}: mean and variance must be numbers or arrays of "
                                                  f"numbers, got {mean!r} and {variance!r}") from None
            if m.shape != v.shape:
                raise ValueError(f"{owner}: mean and variance must have one shape, got {m.shape} and {v.shape}")
            if m.ndim > len(axes):
                raise ValueError(f"{owner}: mean has rank {m.ndim}, more than the {len(axes)} axes of axis={axis!r}")
            if not (np.all(np.isfinite(m)) and np.all(np.isfinite(v)) and np.all(v >= 0)):
                raise ValueError(f"{owner}: mean must be finite and variance finite and >= 0")
            self._input_mean, self._input_variance = m, v
        else:
            self._input_mean = self._input_variance = None
        self.input_mean, self.input_variance = mean, variance

    @property
    def _owner(self) -> str:
        return f"Normalization '{self.name}'"

    def _geometry(self, shape: Sequence[int]) -> "tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]":
        """``(keep, reduce, broadcast)`` for samples of ``shape``: kept and reduced axes of the batched
        array, and the batched broadcast shape of mean/variance."""
        rank = len(shape) + 1
        full = (1, *shape)
        for a in self.axis:
            if not -rank <= a < rank:
                raise ValueError(f"{self._owner}: axis {a} is out of range for {rank}-d inputs (batch, "
                                 f"{', '.join(map(str, shape))})")
        keep = tuple(sorted({a % rank for a in self.axis}))
        if 0 in keep:
            raise ValueError(f"{self._owner}: axis {self.axis} keeps the batch axis 0, whose size is not fixed")
        reduce = tuple(d for d in range(rank) if d not in keep)
        broadcast = tuple(full[d] if d in keep else 1 for d in range(rank))
        try:
            channel_run(self._owner, "the mean", full, broadcast)
        except ValueError:
            raise NotImplementedError(f"{self._owner}: the kept axes {keep} of (batch, {', '.join(map(str, shape))}) "
                                      "must be neighbours (apart from axes of size 1)") from None
        return keep, reduce, broadcast

    def build(self, input_shape):
        _, shape = split_batch(input_shape)
        keep, _, broadcast = self._geometry(shape)
        kept_shape = tuple(broadcast[d] for d in keep)
        if self._input_mean is None:
            view = _keras_shape(kept_shape)
            self._mean_w = self._add_weight("mean", kept_shape, "zeros", trainable=False, to_keras=view)
            self._variance_w = self._add_weight("variance", kept_shape, "ones", trainable=False, to_keras=view)
            self._count_w = self._add_weight("count", (), "zeros", trainable=False, to_keras=_keras_shape(()))
        else:
            self._constant_stats = self._broadcast_given(keep, broadcast)
        self._broadcast = broadcast
        self._set_built(shape)
        self._make_constants()

    def _broadcast_given(self, keep: tuple, broadcast: tuple) -> "tuple[np.ndarray, np.ndarray]":
        """Keras: a scalar fills the broadcast shape; otherwise mean's axes align right with the kept axes."""
        m, v = self._input_mean, self._input_variance
        expanded = [1] * len(broadcast)
        for i in range(1, m.ndim + 1):
            expanded[keep[-i]] = m.shape[-i]
        try:
            return (np.broadcast_to(m.reshape(expanded), broadcast), np.broadcast_to(v.reshape(expanded), broadcast))
        except ValueError:
            raise ValueError(f"{self._owner}: mean/variance of shape {m.shape} do not broadcast to the kept axes "
                             f"{tuple(broadcast[d] for d in keep)}") from None

    def _host_constants(self) -> dict:
        if self._input_mean is None:
            return {}
        mean, variance = self._constant_stats
        return {"mean": mean, "variance": variance}

    def _stats(self) -> "tuple[Any, Any]":
        if self._input_mean is not None:
            return self._consts["mean"], self._consts["variance"]
        return (self._mean_w.value.reshape(*self._broadcast), self._variance_w.value.reshape(*self._broadcast))

    def forward(self, x, training=False):
        mean, variance = self._stats()
        return kernels.normalize(self._cast_input(x), mean, variance, invert=self.invert, epsilon=_EPSILON)

    def backward(self, dy, need_dx=True):
        if not need_dx:
            return None
        return kernels.normalize_backward(dy, self._stats()[1], invert=self.invert, epsilon=_EPSILON)

    # ----- adapt ------------------------------------------------------------------------------
    def adapt(self, data: Any) -> None:
        """Set ``mean`` and ``variance`` from ``data``: an array ``(samples, ...)`` (NumPy or DeviceArray,
        copied to the host) or an iterable of such batches (or of ``(x, y)`` tuples), reduced over every
        axis but ``axis`` in float64 (the batches combined exactly, as Keras). Builds the layer for the
        data's sample shape when needed. Nothing changes when it fails."""
        if self._input_mean is not None:
            raise ValueError(f"{self._owner} was given mean and variance at construction; adapt() has no weights "
                             "to set")
        batches = self._batches(data)
        first = next(batches)
        shape = _validate.shape(tuple(int(d) for d in first.shape[1:]), "adapt() data's sample shape", self._owner)
        keep, reduce, broadcast = self._geometry(shape)
        if self.built:
            for d in keep:
                if shape[d - 1] != self.input_shape[d - 1]:
                    raise ValueError(f"{self._owner} was built for inputs (batch, "
                                     f"{', '.join(map(str, self.input_shape))}); adapt() got data of shape "
                                     f"(samples, {', '.join(map(str, shape))})")
        kept_shape = tuple(broadcast[d] for d in keep)
        mean = np.zeros(kept_shape)
        var = np.zeros(kept_shape)
        total = 0
        for i, batch in enumerate(itertools.chain([first], batches)):
            if batch.ndim != len(shape) + 1 or tuple(int(batch.shape[d]) for d in keep) != kept_shape:
                raise ValueError(f"{self._owner}: adapt() batch {i} has shape {tuple(batch.shape)}, incompatible with "
                                 f"the first batch's (samples, {', '.join(map(str, shape))})")
            # in row chunks, so float64 temporaries stay small whatever the data's size
            rows = max(1, _ADAPT_CHUNK // max(1, math.prod(batch.shape[1:])))
            for start in range(0, batch.shape[0], rows):
                chunk = batch[start:start + rows]
                count = math.prod(chunk.shape[d] for d in reduce)
                b_mean = chunk.mean(axis=reduce, dtype=np.float64).reshape(kept_shape)
                b_var = chunk.var(axis=reduce, dtype=np.float64).reshape(kept_shape)
                total += count
                w = count / total
                new_mean = mean * (1.0 - w) + b_mean * w
                # exact combination of two groups' variances (the lack-of-fit sum of squares, as Keras)
                var = (var + (mean - new_mean) ** 2) * (1.0 - w) + (b_var + (b_mean - new_mean) ** 2) * w
                mean = new_mean
        if not self.built:
            self._ensure_built(shape)
        self._mean_w.assign(mean)
        self._variance_w.assign(var)

    def _batches(self, data: Any) -> Iterator[np.ndarray]:
        """Host arrays of at least one sample each, lazily (a generator of batches is read once)."""
        def host(a: Any, i: int) -> np.ndarray:
            if isinstance(a, tuple) and a:
                a = a[0]
            arr = backend.to_numpy(a) if backend.is_device_array(a) else np.asarray(a)
            if arr.dtype.kind not in "fiu":
                raise _validate.ArgumentTypeError(f"{self._owner}: adapt() needs numeric arrays, got dtype {arr.dtype} "
                                                  f"in batch {i}")
            if arr.ndim < 1 or arr.shape[0] == 0:
                raise ValueError(f"{self._owner}: adapt() needs batches of at least one sample, got shape "
                                 f"{arr.shape} in batch {i}")
            return arr

        if isinstance(data, np.ndarray) or backend.is_device_array(data):
            return iter([host(data, 0)])
        if isinstance(data, (str, bytes, dict)) or not isinstance(data, Iterable):
            raise _validate.ArgumentTypeError(f"{self._owner}: adapt() takes an array or an iterable of batches, got "
                                              f"{type(data).__name__}")
        batches = (host(b, i) for i, b in enumerate(data))
        first = next(batches, None)
        if first is None:
            raise ValueError(f"{self._owner}: adapt() got an empty iterable (no batches)")
        return itertools.chain([first], batches)

    def get_config(self):
        return {**super().get_config(), "axis": list(self.axis), "invert": self.invert,
                "mean": None if self._input_mean is None else self._input_mean.tolist(),
                "variance": None if self._input_variance is None else self._input_variance.tolist()}
