"""Core layers: Dense, Dropout, Flatten, Reshape-free activations (Activation, ReLU, Softmax, ...)."""

from __future__ import annotations

import math
from typing import Any, Sequence

from dnnbind import _validate, ops
from dnnbind import initializers as _init
from dnnbind.utils import draw_seed

from .base import ActivationFn, Layer, register, split_batch

__all__ = ["Dense", "Dropout", "Flatten", "Activation", "ReLU", "Softmax", "LeakyReLU", "ELU"]


class _ActivationMixin:
    """A layer with an ``activation=`` argument: owns an :class:`ActivationFn` and can skip a final softmax."""

    activation: ActivationFn

    def _set_activation(self, activation: Any) -> None:
        self.activation = ActivationFn(activation, owner=f"{type(self).__name__} '{self.name}'")
        self._skipped_softmax = False

    @property
    def has_final_softmax(self) -> bool:
        return self.activation.is_softmax

    def _activate(self, z: Any, training: bool, skip_softmax: bool) -> Any:
        self._skipped_softmax = skip_softmax
        if skip_softmax:
            return z
        return self.activation.forward(z, training)

    def _activation_backward(self, dy: Any) -> Any:
        return dy if self._skipped_softmax else self.activation.backward(dy)

    def _forward(self, x: Any, training: bool, skip_softmax: bool) -> Any:
        raise NotImplementedError

    def forward(self, x, training=False):
        return self._forward(x, training, False)

    def forward_logits(self, x, training=False):
        return self._forward(x, training, True)


@register
class Dense(_ActivationMixin, Layer):
    """Fully connected layer ``y = activation(x @ kernel + bias)`` over the last axis.

    ``kernel`` has the Keras layout ``(in, units)`` (also the internal one: cuBLAS takes it transposed
    for free).
    """

    def __init__(self, units: int, activation: Any = None, use_bias: bool = True,
                 kernel_initializer: Any = "glorot_uniform", bias_initializer: Any = "zeros", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        owner = f"Dense '{self.name}'"
        self.units = _validate.positive_int(units, "units", owner)
        self._set_activation(activation)
        self.use_bias = _validate.boolean(use_bias, "use_bias", owner)
        self.kernel_initializer = _init.get(kernel_initializer)
        self.bias_initializer = _init.get(bias_initializer)

    def build(self, input_shape: Sequence[int]) -> None:
        _, shape = split_batch(input_shape)
        if len(shape) < 1:
            raise ValueError(f"Dense '{self.name}' needs inputs with at least one feature axis, got shape {shape}")
        self.kernel = self.add_weight("kernel", (shape[-1], self.units), self.kernel_initializer)
        self.bias = self.add_weight("bias", (self.units,), self.bias_initializer) if self.use_bias else None
        self._set_built(shape)

    def _output_shape(self, input_shape):
        return (*input_shape[:-1], self.units)

    def _forward(self, x: Any, training: bool, skip_softmax: bool) -> Any:
        x = self._cast_input(x)
        lead = tuple(x.shape[:-1])
        x2 = x if x.ndim == 2 else x.reshape(int(math.prod(lead)), int(x.shape[-1]))
        w = self._compute_weight(self.kernel)
        b = self._compute_weight(self.bias) if self.bias is not None else None
        z = ops.dense_forward(x2, w, b)
        if x.ndim != 2:
            z = z.reshape(*lead, self.units)
        if training:
            self._x2, self._w, self._lead = x2, w, lead
        return self._activate(z, training, skip_softmax)

    def backward(self, dy, need_dx=True):
        dz = self._activation_backward(dy)
        dz2 = dz if dz.ndim == 2 else dz.reshape(int(math.prod(self._lead)), self.units)
        if self.trainable:
            self.grads["kernel"] = self._to_variable_dtype(ops.dense_backward_weight(self._x2, dz2), self.kernel)
            if self.bias is not None:
                self.grads["bias"] = self._to_variable_dtype(ops.bias_backward(dz2), self.bias)
        dx = ops.dense_backward_input(dz2, self._w) if need_dx else None
        if dx is not None and len(self._lead) != 1:
            dx = dx.reshape(*self._lead, int(self._x2.shape[-1]))
        self._x2 = self._w = None
        return dx

    def get_config(self):
        return {**super().get_config(), "units": self.units, "activation": self.activation.name,
                "use_bias": self.use_bias, "kernel_initializer": _init.serialize(self.kernel_initializer),
                "bias_initializer": _init.serialize(self.bias_initializer)}


@register
class Dropout(Layer):
    """Randomly zero a fraction ``rate`` of the inputs in training, scaling the rest by ``1/(1-rate)``.

    ``seed=None`` draws the mask stream's seed when the layer is created, from dnnbind's seed
    generator (:func:`dnnbind.utils.set_random_seed` makes it reproducible); ``seed`` (the config
    value) stays None. Moving the layer to another device restarts the stream from that seed.
    """

    def __init__(self, rate: float, noise_shape: Any = None, seed: int | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        owner = f"{type(self).__name__} '{self.name}'"
        rate = _validate.number(rate, "rate", owner, low=0.0, high=1.0, high_open=True)
        if noise_shape is not None:
            raise NotImplementedError(f"{owner}: noise_shape is not supported")
        self.rate = float(rate)
        self.seed = None if seed is None else _validate.non_negative_int(seed, "seed", owner)
        self._seed = draw_seed() if seed is None else self.seed
        self._state = None
        self._reserve = None

    def _on_device_change(self) -> None:
        self._state = None

    # What the mask covers: one element here, a whole feature map in SpatialDropout2D.
    def _drop(self, x):
        return ops.dropout_forward(x, self._state)

    def _drop_backward(self, dy):
        return ops.dropout_backward(dy, self._reserve, self._state)

    def forward(self, x, training=False):
        if not training or self.rate == 0.0:
            self._reserve = None
            return x
        if self._state is None:
            self._state = ops.DropoutState(self.rate, seed=self._seed)
        y, self._reserve = self._drop(x)
        return y

    def backward(self, dy, need_dx=True):
        if self._reserve is None:
            return dy
        dx = self._drop_backward(dy)
        self._reserve = None
        return dx

    def get_config(self):
        return {**super().get_config(), "rate": self.rate, "seed": self.seed}


@register
class Flatten(Layer):
    """Flatten all but the batch axis, in the data's own order (channels_last: H, W, C).

    The internal activation layout equals the data format, so this is a reshape (a view).
    """

    def __init__(self, data_format: str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if data_format is not None:
            _validate.one_of(str(data_format).lower(), "data_format", f"Flatten '{self.name}'",
                             ("channels_last", "channels_first"))
        self.data_format = data_format

    def _output_shape(self, input_shape):
        return (int(math.prod(input_shape)),)

    def forward(self, x, training=False):
        self._in_shape = tuple(x.shape)
        return x.reshape(int(x.shape[0]), int(math.prod(x.shape[1:])))

    def backward(self, dy, need_dx=True):
        return dy.reshape(*self._in_shape)

    def get_config(self):
        return {**super().get_config(), "data_format": self.data_format}


class _ActivationLayerBase(Layer):
    """A layer that applies one activation (its backward uses what the forward kept)."""

    def _make_fn(self) -> ActivationFn:
        raise NotImplementedError

    def _fn(self) -> ActivationFn:
        if getattr(self, "_act", None) is None:
            self._act = self._make_fn()
            self._skipped = False
        return self._act

    @property
    def has_final_softmax(self) -> bool:
        return self._fn().is_softmax

    def forward(self, x, training=False):
        self._skipped = False
        return self._fn().forward(self._cast_input(x), training)

    def forward_logits(self, x, training=False):
        self._skipped = True
        return self._cast_input(x)

    def backward(self, dy, need_dx=True):
        return dy if self._skipped else self._fn().backward(dy)


@register
class Activation(_ActivationLayerBase):
    """Apply a named activation (``"relu"``, ``"softmax"``, ``"gelu"``, ...)."""

    def __init__(self, activation: Any, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.activation = activation
        self._act = ActivationFn(activation, owner=f"Activation '{self.name}'")
        self._skipped = False

    def _make_fn(self):
        return ActivationFn(self.activation)

    def get_config(self):
        return {**super().get_config(), "activation": self._act.name}


@register
class ReLU(_ActivationLayerBase):
    """``ReLU(max_value=None, negative_slope=0.0, threshold=0.0)``: plain, capped (ReLU6) or leaky."""

    def __init__(self, max_value: float | None = None, negative_slope: float = 0.0, threshold: float = 0.0,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        owner = f"ReLU '{self.name}'"
        if max_value is not None:
            max_value = _validate.number(max_value, "max_value", owner, low=0.0, low_open=True)
        negative_slope = _validate.number(negative_slope, "negative_slope", owner, low=0.0)
        threshold = _validate.number(threshold, "threshold", owner)
        if threshold != 0.0:
            raise NotImplementedError(f"ReLU '{self.name}': threshold != 0 is not supported")
        if max_value is not None and negative_slope != 0.0:
            raise NotImplementedError(f"ReLU '{self.name}': max_value together with negative_slope is not supported")
        self.max_value = max_value
        self.negative_slope = negative_slope
        self.threshold = threshold

    def _make_fn(self):
        if self.max_value is not None:
            fn = ActivationFn("relu6")
            fn.alpha = self.max_value
            return fn
        if self.negative_slope:
            return ActivationFn("leaky_relu", alpha=self.negative_slope)
        return ActivationFn("relu")

    def get_config(self):
        return {**super().get_config(), "max_value": self.max_value, "negative_slope": self.negative_slope,
                "threshold": self.threshold}


@register
class LeakyReLU(_ActivationLayerBase):
    """``max(x, negative_slope * x)``; Keras 3 default slope 0.3."""

    def __init__(self, negative_slope: float = 0.3, **kwargs: Any) -> None:
        kwargs.pop("alpha", None)
        super().__init__(**kwargs)
        self.negative_slope = _validate.number(negative_slope, "negative_slope", f"LeakyReLU '{self.name}'", low=0.0)

    def _make_fn(self):
        return ActivationFn("leaky_relu", alpha=self.negative_slope)

    def get_config(self):
        return {**super().get_config(), "negative_slope": self.negative_slope}


@register
class ELU(_ActivationLayerBase):
    """``x`` for x > 0 else ``alpha * (exp(x) - 1)``."""

    def __init__(self, alpha: float = 1.0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.alpha = _validate.number(alpha, "alpha", f"ELU '{self.name}'")

    def _make_fn(self):
        return ActivationFn("elu", alpha=self.alpha)

    def get_config(self):
        return {**super().get_config(), "alpha": self.alpha}


@register
class Softmax(_ActivationLayerBase):
    """Softmax over the last axis (other axes are not supported)."""

    def __init__(self, axis: int = -1, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.axis = _validate.integer(axis, "axis", f"Softmax '{self.name}'")

    def build(self, input_shape):
        _, shape = split_batch(input_shape)
        if self.axis not in (-1, len(shape)):
            raise NotImplementedError(
                f"Softmax '{self.name}': only the last axis is supported (axis=-1), got axis={self.axis}"
            )
        self._set_built(shape)

    def _make_fn(self):
        return ActivationFn("softmax")

    def get_config(self):
        return {**super().get_config(), "axis": self.axis}
