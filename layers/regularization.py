"""Regularization layers beyond Dropout (Keras 3 arguments): SpatialDropout2D (hand-written forward/backward);
ActivityRegularization, AlphaDropout, GaussianDropout, GaussianNoise, SpatialDropout1D and SpatialDropout3D
(written in keras.ops)."""

from __future__ import annotations

import math
from typing import Any

from dnnbind import _validate, kernels
from dnnbind import backend as _backend
from dnnbind import ops as _ops
from dnnbind import random as _random
from dnnbind import regularizers as _regularizers

from .base import Layer, register, split_batch
from .conv import check_image_shape, data_format_to_layout
from .core import Dropout

__all__ = ["SpatialDropout2D"]


@register
class SpatialDropout2D(Dropout):
    """Drop whole feature maps: in training, each (sample, channel) is zeroed with probability ``rate``
    for every spatial position at once, the kept ones scaled by ``1/(1-rate)`` (Keras 3).

    Inputs are 4-d, ``(N, H, W, C)`` (channels_last) or ``(N, C, H, W)``. ``seed=None`` draws the mask
    stream's seed when the layer is created, from dnnbind's seed generator
    (:func:`dnnbind.utils.set_random_seed` makes it reproducible); ``seed`` (the config value) stays
    None. Moving the layer to another device restarts the stream from that seed. On CUDA the masks
    are drawn on the device (``kernels.spatial_dropout_forward``), so a captured training step draws a
    new mask at each replay.
    """

    def __init__(self, rate: float, data_format: str | None = None, seed: int | None = None,
                 **kwargs: Any) -> None:
        super().__init__(rate, seed=seed, **kwargs)
        self.data_format, self.layout = data_format_to_layout(data_format, f"SpatialDropout2D '{self.name}'")

    def build(self, input_shape):
        _, shape = split_batch(input_shape)
        check_image_shape(shape, f"SpatialDropout2D '{self.name}'", self.data_format)
        self._set_built(shape)

    def _drop(self, x):
        return kernels.spatial_dropout_forward(x, self._state, layout=self.layout)

    def _drop_backward(self, dy):
        return kernels.spatial_dropout_backward(dy, self._reserve, layout=self.layout)

    def get_config(self):
        return {**super().get_config(), "data_format": self.data_format}


# ----------------------------------------------------------------------------------------------------------
# Written in keras.ops: the noise comes from a per-layer SeedGenerator whose counter lives and advances on the
# inputs' device (a captured training step draws new noise at each replay), and the op tape differentiates them.
class _NoiseLayer(Layer):
    """The seed handling of the noise layers (Keras 3: ``self.seed_generator = SeedGenerator(seed)``)."""

    @property
    def _owner(self) -> str:
        return f"{type(self).__name__} '{self.name}'"

    def _make_generator(self, seed: Any) -> None:
        self.seed = None if seed is None else _validate.integer(seed, "seed", self._owner)
        self.seed_generator = _random.SeedGenerator(self.seed)

    def _generator_on(self, x: Any) -> "_random.SeedGenerator":
        """The generator with its counter on ``x``'s device (moved there, value kept, the first time: an
        explicit copy outside the hot path, as the image layers do)."""
        gen = self.seed_generator
        device = _backend.device_of(x.data)
        if gen.device != device:
            gen.counter = _backend.asarray(_backend.to_numpy(gen.counter), device=device)
        return gen

    def _on_device_change(self) -> None:
        if hasattr(self, "seed_generator"):
            gen = self.seed_generator
            if gen.device != self.device:
                gen.counter = _backend.asarray(_backend.to_numpy(gen.counter), device=self.device)

    def compute_output_shape(self, input_shape: Any) -> tuple:
        return tuple(input_shape)


def _rate(value: Any, owner: str) -> float:
    return float(_validate.number(value, "rate", owner, low=0.0, high=1.0, high_open=True))


@register
class ActivityRegularization(Layer):
    """``ActivityRegularization(l1=0.0, l2=0.0)``: the identity, adding ``l1 * sum(|x|) + l2 * sum(x**2)``
    (divided by the batch size, as every activity regularizer in Keras 3) to the layer's losses."""

    def __init__(self, l1: float = 0.0, l2: float = 0.0, **kwargs: Any) -> None:
        kwargs.pop("activity_regularizer", None)
        owner = f"ActivityRegularization '{kwargs.get('name')}'"
        l1 = float(_validate.number(l1, "l1", owner, low=0.0))
        l2 = float(_validate.number(l2, "l2", owner, low=0.0))
        super().__init__(activity_regularizer=_regularizers.L1L2(l1=l1, l2=l2), **kwargs)
        self.l1, self.l2 = l1, l2
        self.supports_masking = True
        self.built = True

    def call(self, inputs: Any) -> Any:
        return inputs

    def compute_output_shape(self, input_shape: Any) -> tuple:
        return tuple(input_shape)

    def get_config(self) -> dict:
        config = super().get_config()
        config.pop("activity_regularizer", None)
        return {**config, "l1": self.l1, "l2": self.l2}


@register
class AlphaDropout(_NoiseLayer):
    """``AlphaDropout(rate, noise_shape=None, seed=None)``: dropout that keeps the mean and variance of
    self-normalising (SELU) activations: in training, dropped entries take SELU's negative saturation
    ``-alpha * scale`` and the result is ``a * x + b`` with Keras's affine correction; the identity otherwise."""

    def __init__(self, rate: float, noise_shape: Any = None, seed: "int | None" = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.rate = _rate(rate, self._owner)
        self.noise_shape = None if noise_shape is None else tuple(None if n is None else int(n) for n in noise_shape)
        self._make_generator(seed)
        self.supports_masking = True
        self.built = True

    def call(self, inputs: Any, training: Any = False) -> Any:
        if not (training and self.rate > 0):
            return inputs
        shape = tuple(int(s) for s in inputs.shape) if self.noise_shape is None else tuple(
            int(inputs.shape[i]) if n is None else n for i, n in enumerate(self.noise_shape))
        alpha, scale = 1.6732632423543772848170429916717, 1.0507009873554804934193349852946
        alpha_p = -alpha * scale
        u = _random.uniform(shape, seed=self._generator_on(inputs))
        kept = _ops.cast(_ops.greater_equal(u, self.rate), inputs.dtype)
        a = ((1 - self.rate) * (1 + self.rate * alpha_p ** 2)) ** -0.5
        b = -a * alpha_p * self.rate
        x = _ops.add(_ops.multiply(inputs, kept), _ops.multiply(alpha_p, _ops.subtract(1.0, kept)))
        return _ops.add(_ops.multiply(a, x), b)

    def get_config(self) -> dict:
        return {**super().get_config(), "rate": self.rate, "seed": self.seed,
                "noise_shape": None if self.noise_shape is None else list(self.noise_shape)}


@register
class GaussianDropout(_NoiseLayer):
    """``GaussianDropout(rate, seed=None)``: in training, multiply by noise from ``N(1, rate / (1 - rate))``
    (standard deviation ``sqrt(rate / (1 - rate))``); the identity otherwise."""

    def __init__(self, rate: float, seed: "int | None" = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.rate = _rate(rate, self._owner)
        self._make_generator(seed)
        self.supports_masking = True
        self.built = True

    def call(self, inputs: Any, training: Any = False) -> Any:
        if not (training and self.rate > 0):
            return inputs
        stddev = math.sqrt(self.rate / (1.0 - self.rate))
        noise = _random.normal(tuple(int(s) for s in inputs.shape), mean=1.0, stddev=stddev, dtype=inputs.dtype,
                               seed=self._generator_on(inputs))
        return _ops.multiply(inputs, noise)

    def get_config(self) -> dict:
        return {**super().get_config(), "rate": self.rate, "seed": self.seed}


@register
class GaussianNoise(_NoiseLayer):
    """``GaussianNoise(stddev, seed=None)``: in training, add noise from ``N(0, stddev**2)``; the identity
    otherwise."""

    def __init__(self, stddev: float, seed: "int | None" = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.stddev = float(_validate.number(stddev, "stddev", self._owner, low=0.0))
        self._make_generator(seed)
        self.supports_masking = True
        self.built = True

    def call(self, inputs: Any, training: Any = False) -> Any:
        if not (training and self.stddev > 0):
            return inputs
        noise = _random.normal(tuple(int(s) for s in inputs.shape), mean=0.0, stddev=self.stddev,
                               dtype=inputs.dtype, seed=self._generator_on(inputs))
        return _ops.add(inputs, noise)

    def get_config(self) -> dict:
        return {**super().get_config(), "stddev": self.stddev, "seed": self.seed}


class _SpatialDropoutND(_NoiseLayer):
    """Keras 3's spatial dropouts: ``keras.random.dropout`` with a noise shape of one per (sample,
    channel), so whole feature maps are dropped (kept ones scaled by ``1 / (1 - rate)``)."""

    rank = 1

    def __init__(self, rate: float, data_format: "str | None" = None, seed: "int | None" = None,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.rate = _rate(rate, self._owner)
        fmt = _backend.image_data_format() if data_format is None else str(data_format).lower()
        self.data_format = _validate.one_of(fmt, "data_format", self._owner, ("channels_last", "channels_first"))
        self._make_generator(seed)
        self.built = True

    def _check(self, shape: tuple) -> None:
        if len(shape) != self.rank + 2:
            raise ValueError(f"{self._owner} expects {self.rank + 2}-d inputs, got shape {tuple(shape)}")

    def call(self, inputs: Any, training: Any = False) -> Any:
        shape = tuple(int(s) for s in inputs.shape)
        self._check(shape)
        if not (training and self.rate > 0):
            return inputs
        ones = (1,) * self.rank
        noise = (shape[0], *ones, shape[-1]) if self.data_format == "channels_last" else (shape[0], shape[1], *ones)
        return _random.dropout(inputs, self.rate, noise_shape=noise, seed=self._generator_on(inputs))

    def get_config(self) -> dict:
        # Keras's own keys (its SpatialDropout layers take no other arguments)
        return {"rate": self.rate, "seed": self.seed, "name": self.name, "dtype": self.dtype_policy.name,
                "data_format": self.data_format}


@register
class SpatialDropout1D(_SpatialDropoutND):
    """``SpatialDropout1D(rate, seed=None)``: drop whole feature channels of ``(batch, steps, features)``."""

    rank = 1

    def __init__(self, rate: float, seed: "int | None" = None, **kwargs: Any) -> None:
        super().__init__(rate, "channels_last", seed, **kwargs)

    def get_config(self) -> dict:
        config = super().get_config()
        config.pop("data_format")
        return config


@register
class SpatialDropout3D(_SpatialDropoutND):
    """``SpatialDropout3D(rate, data_format=None, seed=None)``: drop whole 3-d feature maps of ``(batch, d1,
    d2, d3, channels)`` (or channels first)."""

    rank = 3


__all__ += ["ActivityRegularization", "AlphaDropout", "GaussianDropout", "GaussianNoise", "SpatialDropout1D",
            "SpatialDropout3D"]
