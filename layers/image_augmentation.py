"""More image augmentation layers of Keras 3: AutoContrast, Equalization, Solarization, RandomInvert, RandomGrayscale,
RandomColorDegeneration, RandomSaturation, RandomSharpness, RandomHue, RandomGaussianBlur, RandomColorJitter, MixUp, CutMix, RandomErasing,
RandomShear, RandomPerspective, and Pipeline (a list of layers applied in turn).

Written in :mod:`dnnbind.ops` on the pattern of :mod:`.image_preprocessing` (whose base they share): a
per-layer :class:`dnnbind.random.SeedGenerator` with its counter on the images' device, Keras's two steps
``get_random_transformation`` / ``transform_images`` with Keras's transformation formats, so a given
transformation is applied bitwise as Keras applies it; ``call(inputs, training=True)``.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from dnnbind import _validate
from dnnbind import backend as _backend
from dnnbind import ops as _ops
from dnnbind import random as _random
from dnnbind.autodiff.tensor import Tensor

from . import image_preprocessing as _ip
from .base import Layer, deserialize, register
from .image_preprocessing import _factor_pair, _ImagePreprocessing, _is_number

__all__ = ["AutoContrast", "Solarization", "RandomInvert", "RandomGrayscale", "Pipeline"]


def _range(value: Any, owner: str) -> list:
    if not isinstance(value, (tuple, list)) or len(value) != 2 or not all(_is_number(v) for v in value):
        raise ValueError(f"{owner}: value_range must be a list of two numbers (low, high), got {value!r}")
    return sorted(float(v) if isinstance(v, float) else v for v in value)


def _to_range(x: Tensor, original: Sequence, target: Sequence) -> Tensor:
    """Keras's ``_transform_value_range``: ``x`` from ``original`` to ``target`` (unchanged when equal)."""
    if original[0] == target[0] and original[1] == target[1]:
        return x
    x = _ops.divide(_ops.subtract(x, float(original[0])), float(original[1] - original[0]))
    return _ops.add(_ops.multiply(x, float(target[1] - target[0])), float(target[0]))


def _batch_shape(images: Tensor) -> tuple:
    return (int(images.shape[0]), 1, 1, 1) if images.ndim == 4 else (1, 1, 1)


@register
class AutoContrast(_ImagePreprocessing):
    """``AutoContrast(value_range=(0, 255))``: each image (and channel) stretched so that its minimum over height
    and width maps to the low end of ``value_range`` and its maximum to the high end (a constant channel is left as
    it is). Deterministic: it applies in training and inference alike, as Keras. The output is in the compute dtype
(integer images too, as Keras 3.15 returns them). (Keras takes the minimum over axes
    1 and 2 whatever the data format; here over the image's height and width.)"""

    def __init__(self, value_range: Any = (0, 255), **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.value_range = _range(value_range, self._owner)

    def call(self, inputs: Any, training: Any = True) -> Tensor:
        return self.transform_images(self._images(inputs), None, training=training)

    def transform_images(self, images: Any, transformation: Any = None, training: bool = True) -> Tensor:
        images = self._images(images)
        x = _to_range(self._float(images), self.value_range, (0, 255))
        h, w = self._hw_axes(x.ndim)
        low = _ops.min(x, axis=(h, w), keepdims=True)
        high = _ops.max(x, axis=(h, w), keepdims=True)
        scale = _ops.divide(255.0, _ops.subtract(high, low))
        y = _ops.clip(_ops.add(_ops.multiply(x, scale), _ops.negative(_ops.multiply(low, scale))), 0.0, 255.0)
        y = _to_range(y, (0, 255), self.value_range)
        return _ops.where(_ops.isnan(y), self._float(images), y)

    def get_config(self) -> dict:
        return {**super().get_config(), "value_range": self.value_range}


@register
class Solarization(_ImagePreprocessing):
    """``Solarization(addition_factor=0.0, threshold_factor=0.0, value_range=(0, 255), seed=None)``: in training,
    add a random amount (``[addition_factor[0], addition_factor[1] * 255]``, in the 0-255 scale) to each image, clip,
    and invert (``255 - x``) the pixels at or above a random threshold (``[threshold_factor[0], threshold_factor[1]
    * 255]``: Keras's bounds, the low one not scaled), as Keras 3. A number ``f`` in [0, 1] means ``(0, f)``. The
    output is in the compute dtype (integer images too, as Keras). Transformation: ``{"additions": (batch, 1, 1,
    1), "thresholds": (batch, 1, 1, 1)}``."""

    def __init__(self, addition_factor: Any = 0.0, threshold_factor: Any = 0.0, value_range: Any = (0, 255),
                 seed: "int | None" = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.addition_factor = self._unit_factor(addition_factor, "addition_factor")
        self.threshold_factor = self._unit_factor(threshold_factor, "threshold_factor")
        self.value_range = _range(value_range, self._owner)
        self._make_generator(seed)

    def _unit_factor(self, value: Any, name: str) -> tuple:
        message = f"{self._owner}: {name} must be a number or a pair of numbers in [0, 1], got {value!r}"
        if isinstance(value, (tuple, list)):
            if len(value) != 2 or not all(_is_number(v) and 0 <= v <= 1 for v in value):
                raise ValueError(message)
            return tuple(sorted(value))
        if not _is_number(value) or not 0 <= value <= 1:
            raise ValueError(message)
        return (0, value)

    def get_random_transformation(self, data: Any, training: bool = True, seed: Any = None) -> Any:
        if not training:
            return None
        images = self._images(data)
        shape = _batch_shape(images)
        dt = self._effective_compute_dtype()
        return {"additions": self._uniform(images, shape, self.addition_factor[0], self.addition_factor[1] * 255,
                                           dtype=dt, seed=seed),
                "thresholds": self._uniform(images, shape, self.threshold_factor[0], self.threshold_factor[1] * 255,
                                            dtype=dt, seed=seed)}

    def transform_images(self, images: Any, transformation: Any, training: bool = True) -> Tensor:
        images = self._images(images)
        x = self._float(images)
        if not training or transformation is None:
            return x
        x = _to_range(x, self.value_range, (0, 255))
        y = _ops.clip(_ops.add(x, _ops.cast(transformation["additions"], x.dtype)), 0.0, 255.0)
        y = _ops.where(_ops.less(y, _ops.cast(transformation["thresholds"], x.dtype)), y, _ops.subtract(255.0, y))
        return _to_range(y, (0, 255), self.value_range)

    def get_config(self) -> dict:
        return {**super().get_config(), "value_range": self.value_range, "addition_factor": self.addition_factor,
                "threshold_factor": self.threshold_factor, "seed": self.seed}


@register
class RandomInvert(_ImagePreprocessing):
    """``RandomInvert(factor=1.0, value_range=(0, 255), seed=None, data_format=None)``: in training, each image is
    replaced by ``value_range[1] - image`` when a uniform draw in [0, 1) is below its inversion probability, itself
    drawn uniformly in ``factor`` (a number ``f`` in [-1, 1] means ``(max(-f, -1), f)``, as Keras's base rule).
    Transformation: ``{"apply_inversion": (batch,) bool}``."""

    def __init__(self, factor: Any = 1.0, value_range: Any = (0, 255), seed: "int | None" = None,
                 data_format: "str | None" = None, **kwargs: Any) -> None:
        super().__init__(data_format=data_format, **kwargs)
        self.factor = _factor_pair(factor, "factor", self._owner, -1.0, 1.0, clip_low=True)
        self.value_range = list(value_range) if isinstance(value_range, (tuple, list)) else value_range
        _range(self.value_range, self._owner)
        self._make_generator(seed)

    def get_random_transformation(self, data: Any, training: bool = True, seed: Any = None) -> Any:
        if not training:
            return None
        images = self._images(data)
        n = int(images.shape[0]) if images.ndim == 4 else 1
        probability = self._uniform(images, (n,), self.factor[0], self.factor[1], seed=seed)
        threshold = self._uniform(images, (n,), 0.0, 1.0, seed=seed)
        return {"apply_inversion": _ops.less(threshold, probability)}

    def transform_images(self, images: Any, transformation: Any, training: bool = True) -> Tensor:
        images = self._images(images)
        if not training or transformation is None:
            return images
        x = self._float(images)
        apply = _ops.reshape(transformation["apply_inversion"], (-1, 1, 1, 1) if x.ndim == 4 else (1, 1, 1))
        return _ops.where(apply, _ops.subtract(float(self.value_range[1]), x), x)

    def get_config(self) -> dict:
        return {**super().get_config(), "factor": list(self.factor), "value_range": self.value_range,
                "seed": self.seed}


@register
class RandomGrayscale(_ImagePreprocessing):
    """``RandomGrayscale(factor=0.5, data_format=None, seed=None)``: in training, each image is replaced with
    probability ``factor`` by its grayscale (``ops.image.rgb_to_grayscale``: ``0.2989 R + 0.5870 G + 0.1140 B``,
    broadcast over the channels by the selection, as Keras's ``where``). Transformation: a ``(batch, 1, 1, 1)``
    bool array."""

    def __init__(self, factor: float = 0.5, data_format: "str | None" = None, seed: "int | None" = None,
                 **kwargs: Any) -> None:
        super().__init__(data_format=data_format, **kwargs)
        self.factor = float(_validate.number(factor, "factor", self._owner, low=0.0, high=1.0))
        self._make_generator(seed)

    def get_random_transformation(self, data: Any, training: bool = True, seed: Any = None) -> Any:
        images = self._images(data)
        n = int(images.shape[0]) if images.ndim == 4 else 1
        draws = self._uniform(images, (n,), 0.0, 1.0, seed=seed)
        return _ops.reshape(_ops.less(draws, self.factor), (n, 1, 1, 1))

    def transform_images(self, images: Any, transformation: Any, training: bool = True) -> Tensor:
        images = self._images(images)
        if not training:
            return images
        if transformation is None:
            transformation = self.get_random_transformation(images)
        gray = _ops.image.rgb_to_grayscale(images, data_format=self.data_format)
        apply = transformation if images.ndim == 4 else _ops.reshape(transformation, (1, 1, 1))
        return _ops.where(apply, gray, images)

    def get_config(self) -> dict:
        return {**super().get_config(), "factor": self.factor}  # (Keras's config has no seed)


@register
class Pipeline(Layer):
    """``Pipeline(layers, name=None)``: the layers applied in turn (Keras 3; ``training`` is passed on to those
    whose ``call`` takes it). The config holds the layers' configs."""

    def __init__(self, layers: Sequence[Layer], name: "str | None" = None, **kwargs: Any) -> None:
        super().__init__(name=name, **kwargs)
        owner = f"Pipeline '{self.name}'"
        items = []
        for i, layer in enumerate(layers):
            if isinstance(layer, dict):
                layer = deserialize({"class_name": layer["class_name"], "config": dict(layer["config"])})
            if not isinstance(layer, Layer):
                raise _validate.ArgumentTypeError(f"{owner}: layers[{i}] must be a layer, got {type(layer).__name__}")
            items.append(layer)
        self.layers = items
        self.built = True

    def call(self, inputs: Any, training: Any = True) -> Any:
        x = inputs
        for layer in self.layers:
            takes = not layer._is_legacy() and "training" in layer._call_parameters()
            x = layer(x, training=training) if takes else layer(x)
        return x

    def compute_output_shape(self, input_shape: Any) -> Any:
        shape = input_shape
        for layer in self.layers:
            shape = layer.compute_output_shape(shape)
        return shape

    def get_config(self) -> dict:
        return {**super().get_config(), "layers": [{"module": "keras.layers", "class_name": type(layer).__name__,
                                                    "config": layer.get_config(), "registered_name": None}
                                                   for layer in self.layers]}


class _FactorColourLayer(_ImagePreprocessing):
    """A random per-image colour change of strength drawn in ``factor`` (Keras's base factor rule), then clipped
    to ``value_range``; transformation ``{"factor": ...}``."""

    _bounds = (-1.0, 1.0)
    _factor_shape: "tuple | None" = None  # None: (batch,); else (batch, 1, 1, 1)

    def __init__(self, factor: Any, value_range: Any = (0, 255), data_format: "str | None" = None,
                 seed: "int | None" = None, **kwargs: Any) -> None:
        super().__init__(data_format=data_format, **kwargs)
        self.factor = _factor_pair(factor, "factor", self._owner, *self._bounds, clip_low=True)
        self.value_range = _range(value_range, self._owner)
        self._make_generator(seed)

    def _draw(self, images: Tensor, seed: Any) -> Tensor:
        n = int(images.shape[0]) if images.ndim == 4 else 1
        shape = (n, 1, 1, 1) if self._factor_shape else (n,)
        return self._uniform(images, shape, self.factor[0], self.factor[1], seed=seed)

    def get_random_transformation(self, data: Any, training: bool = True, seed: Any = None) -> Any:
        return {"factor": self._draw(self._images(data), seed)}

    def _batched(self, images: Tensor) -> "tuple[Tensor, bool]":
        return (_ops.expand_dims(images, 0), True) if images.ndim == 3 else (images, False)

    def get_config(self) -> dict:
        return {**super().get_config(), "factor": list(self.factor), "value_range": self.value_range,
                "seed": self.seed}


@register
class RandomColorDegeneration(_FactorColourLayer):
    """``RandomColorDegeneration(factor, value_range=(0, 255), data_format=None, seed=None)``: in training, each
    image blended towards its grayscale, ``x + f * (gray(x) - x)`` with ``f`` drawn in ``factor`` per image, then
    clipped to ``value_range`` (Keras 3). Transformation: ``{"factor": (batch, 1, 1, 1)}``."""

    _factor_shape = (1, 1, 1)

    def transform_images(self, images: Any, transformation: Any = None, training: bool = True) -> Tensor:
        images = self._images(images)
        if not training:
            return images
        x = self._float(images)
        factor = _ops.cast(transformation["factor"], x.dtype)
        if x.ndim == 3:
            factor = _ops.reshape(factor, (1, 1, 1))
        gray = _ops.image.rgb_to_grayscale(x, data_format=self.data_format)
        y = _ops.add(x, _ops.multiply(factor, _ops.subtract(gray, x)))
        return _ops.clip(y, self.value_range[0], self.value_range[1])


@register
class RandomSaturation(_FactorColourLayer):
    """``RandomSaturation(factor, value_range=(0, 255), data_format=None, seed=None)``: in training, each image's
    HSV saturation multiplied by ``f / (1 - f + 1e-7)`` (``f`` drawn in ``factor``: 0.5 keeps it, 0 makes grayscale,
    1 saturates), clipped to ``value_range`` (as Keras 3, which clips the saturation channel to it), then back to
    RGB. Transformation: ``{"factor": (batch,)}`` (the multiplier)."""

    def get_random_transformation(self, data: Any, training: bool = True, seed: Any = None) -> Any:
        f = self._draw(self._images(data), seed)
        return {"factor": _ops.divide(f, _ops.add(_ops.subtract(1.0, f), 1e-7))}

    def transform_images(self, images: Any, transformation: Any = None, training: bool = True) -> Tensor:
        images = self._images(images)
        if not training:
            return images
        x, single = self._batched(self._float(images))
        factor = _ops.reshape(_ops.cast(transformation["factor"], x.dtype), (-1, 1, 1))
        hsv = _ops.image.rgb_to_hsv(x, data_format=self.data_format)
        axis = -1 if self.data_format == "channels_last" else 1
        h, s, v = _ops.unstack(hsv, 3, axis=axis)
        s = _ops.clip(_ops.multiply(s, factor), self.value_range[0], self.value_range[1])
        y = _ops.image.hsv_to_rgb(_ops.stack([h, s, v], axis=axis), data_format=self.data_format)
        return _ops.squeeze(y, 0) if single else y


@register
class RandomSharpness(_FactorColourLayer):
    """``RandomSharpness(factor, value_range=(0, 255), data_format=None, seed=None)``: in training, each image
    blended with its 3x3 smoothing (``[[1, 1, 1], [1, 5, 1], [1, 1, 1]] / 13``, depthwise, ``"same"``):
    ``x + (1 - 2 f) * (smooth(x) - x)``, ``f`` drawn in ``factor`` (in [0, 1]; 0.5 keeps the image), clipped to
    ``value_range`` (Keras 3). Transformation: ``{"factor": (batch,)}``."""

    _bounds = (0.0, 1.0)

    def transform_images(self, images: Any, transformation: Any = None, training: bool = True) -> Tensor:
        images = self._images(images)
        x = self._float(images)
        if not training:
            return x
        x, single = self._batched(x)
        if self.data_format == "channels_first":
            x = _ops.swapaxes(x, -3, -1)
        factor = _ops.reshape(_ops.multiply(_ops.cast(transformation["factor"], x.dtype), 2.0), (-1, 1, 1, 1))
        a, b = 1.0 / 13.0, 5.0 / 13.0
        channels = int(x.shape[-1])
        kernel = np.tile(np.array([[a, a, a], [a, b, a], [a, a, a]], dtype=x.dtype).reshape(3, 3, 1, 1),
                         (1, 1, channels, 1))
        smooth = _ops.depthwise_conv(x, _ops.convert_to_tensor(kernel), strides=1, padding="same",
                                     data_format="channels_last")
        y = _ops.add(x, _ops.multiply(_ops.subtract(1.0, factor), _ops.subtract(smooth, x)))
        y = _ops.clip(y, self.value_range[0], self.value_range[1])
        if self.data_format == "channels_first":
            y = _ops.swapaxes(y, -3, -1)
        return _ops.squeeze(y, 0) if single else y


__all__ += ["RandomColorDegeneration", "RandomSaturation", "RandomSharpness"]


@register
class RandomHue(_FactorColourLayer):
    """``RandomHue(factor, value_range=(0, 255), data_format=None, seed=None)``: in training, each image's HSV hue
    shifted (cyclically) by ``±f / 2``, ``f`` drawn in ``factor`` (in [0, 1]) and the sign at random, as Keras 3;
    images taken to [0, 1], through HSV and back, clipped and returned in ``value_range``. Transformation:
    ``{"factor": (batch,)}`` (the signed shift)."""

    _bounds = (0.0, 1.0)

    def get_random_transformation(self, data: Any, training: bool = True, seed: Any = None) -> Any:
        images = self._images(data)
        n = int(images.shape[0]) if images.ndim == 4 else 1
        sign = _ops.where(_ops.greater(self._uniform(images, (n,), 0.0, 1.0, seed=seed), 0.5), -1.0, 1.0)
        return {"factor": _ops.multiply(_ops.multiply(sign, self._draw(images, seed)), 0.5)}

    def transform_images(self, images: Any, transformation: Any = None, training: bool = True) -> Tensor:
        images = self._images(images)
        if not training:
            return images
        x, single = self._batched(_to_range(self._float(images), self.value_range, (0, 1)))
        shift = _ops.reshape(_ops.cast(transformation["factor"], x.dtype), (-1, 1, 1))
        hsv = _ops.image.rgb_to_hsv(x, data_format=self.data_format)
        axis = -1 if self.data_format == "channels_last" else 1
        h, s, v = _ops.unstack(hsv, 3, axis=axis)
        h = _ops.add(h, shift)
        h = _ops.where(_ops.greater(h, 1.0), _ops.subtract(h, 1.0), h)
        h = _ops.where(_ops.less(h, 0.0), _ops.add(h, 1.0), h)
        y = _ops.clip(_ops.image.hsv_to_rgb(_ops.stack([h, s, v], axis=axis), data_format=self.data_format), 0.0, 1.0)
        y = _to_range(y, (0, 1), self.value_range)
        return _ops.squeeze(y, 0) if single else y


@register
class RandomGaussianBlur(_FactorColourLayer):
    """``RandomGaussianBlur(factor=1.0, kernel_size=3, sigma=1.0, value_range=(0, 255), data_format=None,
    seed=None)``: in training, each image blurred (:func:`dnnbind.ops.image.gaussian_blur`, ``kernel_size`` odd)
    with probability drawn in ``factor``, with one pair of sigmas per batch drawn in ``sigma`` (a number ``s``:
    ``(0, s)``), then clipped to ``value_range`` (Keras 3). Transformation: ``{"should_apply_blur": (batch,) bool,
    "blur_factor": (2,)}``."""

    _bounds = (0.0, 1.0)

    def __init__(self, factor: Any = 1.0, kernel_size: Any = 3, sigma: Any = 1.0, value_range: Any = (0, 255),
                 data_format: "str | None" = None, seed: "int | None" = None, **kwargs: Any) -> None:
        super().__init__(factor, value_range, data_format, seed, **kwargs)
        owner = self._owner
        sizes = tuple(kernel_size) if isinstance(kernel_size, (tuple, list)) else (kernel_size, kernel_size)
        if len(sizes) != 2 or not all(isinstance(k, (int, np.integer)) and k > 0 and k % 2 for k in sizes):
            raise ValueError(f"{owner}: kernel_size must be an odd positive int or a pair of them, got "
                             f"{kernel_size!r}")
        self.kernel_size = tuple(int(k) for k in sizes)
        self.sigma = _factor_pair(sigma, "sigma", owner, 0.0, 1.0, clip_low=True) if not isinstance(
            sigma, (tuple, list)) else tuple(sorted(float(s) for s in sigma))

    def get_random_transformation(self, data: Any, training: bool = True, seed: Any = None) -> Any:
        if not training:
            return None
        images = self._images(data)
        n = int(images.shape[0]) if images.ndim == 4 else 1
        probability = self._uniform(images, (n,), self.factor[0], self.factor[1], seed=seed)
        threshold = self._uniform(images, (n,), 0.0, 1.0, seed=seed)
        sigma = _ops.add(self._uniform(images, (2,), self.sigma[0], self.sigma[1],
                                       dtype=self._effective_compute_dtype(), seed=seed), 1e-6)
        return {"should_apply_blur": _ops.less(threshold, probability), "blur_factor": sigma}

    def transform_images(self, images: Any, transformation: Any = None, training: bool = True) -> Tensor:
        images = self._images(images)
        x = self._float(images)
        if not training or transformation is None:
            return x
        x, single = self._batched(x)
        sigma = _ops.cast(transformation["blur_factor"], x.dtype)
        blurred = _ops.image.gaussian_blur(x, kernel_size=self.kernel_size, sigma=(sigma[0], sigma[1]),
                                           data_format=self.data_format)
        apply = _ops.reshape(transformation["should_apply_blur"], (-1, 1, 1, 1))
        y = _ops.clip(_ops.where(apply, blurred, x), self.value_range[0], self.value_range[1])
        return _ops.squeeze(y, 0) if single else y

    def get_config(self) -> dict:
        return {**super().get_config(), "kernel_size": list(self.kernel_size), "sigma": list(self.sigma)}


__all__ += ["RandomHue", "RandomGaussianBlur"]


@register
class MixUp(_ImagePreprocessing):
    """``MixUp(alpha=0.2, data_format=None, seed=None)``: in training, each image (and, given
    ``{"images": ..., "labels": ...}``, its label) mixed with another of the batch: ``w * x + (1 - w) * x[perm]``,
    ``w ~ Beta(alpha, alpha)`` per sample and ``perm`` a random permutation of the batch (Keras 3).
    Transformation: ``{"mix_weight": (batch,), "permutation_order": (batch,) int64}``."""

    def __init__(self, alpha: float = 0.2, data_format: "str | None" = None, seed: "int | None" = None,
                 **kwargs: Any) -> None:
        super().__init__(data_format=data_format, **kwargs)
        self.alpha = float(_validate.number(alpha, "alpha", self._owner, low=0.0, low_open=True))
        self._make_generator(seed)

    def get_random_transformation(self, data: Any, training: bool = True, seed: Any = None) -> Any:
        images = self._images(data["images"] if isinstance(data, dict) else data)
        n = int(images.shape[0]) if images.ndim == 4 else 1
        gen = seed if seed is not None else self._generator_on(_backend.device_of(images.data))
        order = _random.shuffle(_ops.arange(0, n, dtype="int64"), seed=gen)
        weight = _random.beta((n,), self.alpha, self.alpha, seed=gen)
        return {"mix_weight": weight, "permutation_order": order}

    def transform_images(self, images: Any, transformation: Any = None, training: bool = True) -> Tensor:
        images = self._images(images)
        x = self._float(images)
        if not training or transformation is None:
            return x
        w = _ops.cast(_ops.reshape(transformation["mix_weight"], (-1, 1, 1, 1)), x.dtype)
        other = _ops.take(x, transformation["permutation_order"], axis=0)
        return _ops.add(_ops.multiply(w, x), _ops.multiply(_ops.subtract(1.0, w), other))

    def transform_labels(self, labels: Any, transformation: Any = None, training: bool = True) -> Tensor:
        y = labels if isinstance(labels, Tensor) else _ops.convert_to_tensor(labels)
        if not training or transformation is None:
            return y
        if y.dtype.kind not in "f":
            y = _ops.cast(y, self._effective_compute_dtype())
        w = _ops.cast(_ops.reshape(transformation["mix_weight"], (-1, 1)), y.dtype)
        other = _ops.take(y, transformation["permutation_order"], axis=0)
        return _ops.add(_ops.multiply(w, y), _ops.multiply(_ops.subtract(1.0, w), other))

    def call(self, inputs: Any, training: Any = True) -> Any:
        training = bool(training)
        t = self.get_random_transformation(inputs, training=training) if training else None
        if isinstance(inputs, dict):
            out = dict(inputs)
            out["images"] = self.transform_images(inputs["images"], t, training=training)
            if "labels" in inputs:
                out["labels"] = self.transform_labels(inputs["labels"], t, training=training)
            return out
        return self.transform_images(inputs, t, training=training)

    def get_config(self) -> dict:
        return {**super().get_config(), "alpha": self.alpha, "seed": self.seed}


@register
class RandomColorJitter(_ImagePreprocessing):
    """``RandomColorJitter(value_range=(0, 255), brightness_factor=None, contrast_factor=None,
    saturation_factor=None, hue_factor=None, seed=None, data_format=None)``: in training, RandomBrightness,
    RandomContrast, RandomSaturation then RandomHue (those whose factor is given), each drawing its own
    transformation, as Keras 3."""

    def __init__(self, value_range: Any = (0, 255), brightness_factor: Any = None, contrast_factor: Any = None,
                 saturation_factor: Any = None, hue_factor: Any = None, seed: "int | None" = None,
                 data_format: "str | None" = None, **kwargs: Any) -> None:
        super().__init__(data_format=data_format, **kwargs)
        self.value_range = list(value_range) if isinstance(value_range, (tuple, list)) else value_range
        self.brightness_factor, self.contrast_factor = brightness_factor, contrast_factor
        self.saturation_factor, self.hue_factor = saturation_factor, hue_factor
        self._make_generator(seed)
        vr = self.value_range
        fmt = self.data_format
        self.random_brightness = None if brightness_factor is None else _ip.RandomBrightness(
            brightness_factor, value_range=vr, seed=seed, data_format=fmt)
        self.random_contrast = None if contrast_factor is None else _ip.RandomContrast(
            contrast_factor, value_range=vr, seed=seed, data_format=fmt)
        self.random_saturation = None if saturation_factor is None else RandomSaturation(
            saturation_factor, value_range=vr, seed=seed, data_format=fmt)
        self.random_hue = None if hue_factor is None else RandomHue(hue_factor, value_range=vr, seed=seed,
                                                                    data_format=fmt)

    def transform_images(self, images: Any, transformation: Any = None, training: bool = True) -> Tensor:
        images = self._images(images)
        x = self._float(images)
        if not training:
            return x
        for layer in (self.random_brightness, self.random_contrast, self.random_saturation, self.random_hue):
            if layer is not None:
                x = layer.transform_images(x, layer.get_random_transformation(x), training=True)
        return self._float(x)

    def get_config(self) -> dict:
        return {**super().get_config(), "value_range": self.value_range, "brightness_factor": self.brightness_factor,
                "contrast_factor": self.contrast_factor, "saturation_factor": self.saturation_factor,
                "hue_factor": self.hue_factor, "seed": self.seed}


__all__ += ["MixUp", "RandomColorJitter"]


def _interpolation(value: Any, owner: str) -> str:
    if value not in ("nearest", "bilinear"):
        raise NotImplementedError(f"{owner}: Unknown `interpolation` {value!r}; expected one of ('nearest', "
                                  "'bilinear')")
    return value


@register
class RandomShear(_ImagePreprocessing):
    """``RandomShear(x_factor=0.0, y_factor=0.0, interpolation="bilinear", fill_mode="reflect", fill_value=0.0,
    data_format=None, seed=None)``: in training, each image sheared along x and y by factors drawn in ``x_factor``
    and ``y_factor`` (a number ``f`` in [0, 1]: ``[-f, f]``) with a random common sign, through
    :func:`dnnbind.ops.image.affine_transform` with the matrix ``[1, sx, 0, sy, 1, 0, 0, 0]`` (Keras 3).
    Transformation: ``{"shear_factor": (batch, 2)}``."""

    def __init__(self, x_factor: Any = 0.0, y_factor: Any = 0.0, interpolation: str = "bilinear",
                 fill_mode: str = "reflect", fill_value: float = 0.0, data_format: "str | None" = None,
                 seed: "int | None" = None, **kwargs: Any) -> None:
        super().__init__(data_format=data_format, **kwargs)
        owner = self._owner
        self.x_factor = self._shear_factor(x_factor, "x_factor")
        self.y_factor = self._shear_factor(y_factor, "y_factor")
        if fill_mode not in ("reflect", "wrap", "constant", "nearest"):
            raise NotImplementedError(f"{owner}: Unknown `fill_mode` {fill_mode!r}; expected one of ('reflect', "
                                      "'wrap', 'constant', 'nearest')")
        self.fill_mode = fill_mode
        self.fill_value = float(fill_value)
        self.interpolation = _interpolation(interpolation, owner)
        self._make_generator(seed)

    def _shear_factor(self, value: Any, name: str) -> tuple:
        # (a pair may hold negative ends, so that the config, which has them, round-trips; Keras 3.15 refuses them)
        message = f"{self._owner}: {name} must be a number in [0, 1] or a pair of numbers in [-1, 1], got {value!r}"
        if isinstance(value, (tuple, list)):
            if len(value) != 2 or not all(_is_number(v) and -1 <= v <= 1 for v in value):
                raise ValueError(message)
            return tuple(sorted(float(v) for v in value))
        if not _is_number(value) or not 0 <= value <= 1:
            raise ValueError(message)
        return (-abs(float(value)), abs(float(value)))

    def get_random_transformation(self, data: Any, training: bool = True, seed: Any = None) -> Any:
        if not training:
            return None
        images = self._images(data)
        n = int(images.shape[0]) if images.ndim == 4 else 1
        dt = self._effective_compute_dtype()
        sign = _ops.where(_ops.greater(self._uniform(images, (n, 1), 0.0, 1.0, dtype=dt, seed=seed), 0.5), -1.0, 1.0)
        sy = self._uniform(images, (n, 1), self.y_factor[0], self.y_factor[1], dtype=dt, seed=seed)
        sx = self._uniform(images, (n, 1), self.x_factor[0], self.x_factor[1], dtype=dt, seed=seed)
        return {"shear_factor": _ops.multiply(_ops.concatenate([sx, sy], axis=1), _ops.cast(sign, dt))}

    def transform_images(self, images: Any, transformation: Any = None, training: bool = True) -> Tensor:
        images = self._images(images)
        x = self._float(images)
        if not training or transformation is None:
            return x
        f = _ops.cast(transformation["shear_factor"], "float32")
        n = int(f.shape[0])
        ones, zeros = _ops.ones((n,), "float32"), _ops.zeros((n,), "float32")
        matrix = _ops.stack([ones, f[:, 0], zeros, f[:, 1], ones, zeros, zeros, zeros], axis=1)
        return self._affine(x, matrix, self.interpolation)

    def get_config(self) -> dict:
        return {**super().get_config(), "x_factor": list(self.x_factor), "y_factor": list(self.y_factor),
                "fill_mode": self.fill_mode, "interpolation": self.interpolation, "seed": self.seed,
                "fill_value": self.fill_value}


@register
class RandomPerspective(_ImagePreprocessing):
    """``RandomPerspective(factor=1.0, scale=1.0, interpolation="bilinear", fill_value=0.0, seed=None,
    data_format=None)``: in training, each image (with probability drawn in ``factor``) warped so that its four
    corners move by up to ``scale / 2`` of their coordinates (:func:`dnnbind.ops.image.perspective_transform`),
    as Keras 3. Transformation: ``{"apply_perspective": (batch,) bool, "start_points": (batch, 4, 2),
    "end_points": (batch, 4, 2)}``."""

    def __init__(self, factor: Any = 1.0, scale: float = 1.0, interpolation: str = "bilinear",
                 fill_value: float = 0.0, seed: "int | None" = None, data_format: "str | None" = None,
                 **kwargs: Any) -> None:
        super().__init__(data_format=data_format, **kwargs)
        owner = self._owner
        self.factor = _factor_pair(factor, "factor", owner, -1.0, 1.0, clip_low=True)
        self.scale = float(_validate.number(scale, "scale", owner, low=0.0, high=1.0))
        self.fill_value = float(fill_value)
        self.interpolation = _interpolation(interpolation, owner)
        self._make_generator(seed)

    def get_random_transformation(self, data: Any, training: bool = True, seed: Any = None) -> Any:
        if not training:
            return None
        images = self._images(data)
        n = int(images.shape[0]) if images.ndim == 4 else 1
        h, w = self._hw(images)
        dt = self._effective_compute_dtype()
        probability = self._uniform(images, (n,), self.factor[0], self.factor[1], seed=seed)
        threshold = self._uniform(images, (n,), 0.0, 1.0, seed=seed)
        jitter = self._uniform(images, (n, 4, 2), -0.5 * self.scale, 0.5 * self.scale, dtype=dt, seed=seed)
        corners = np.array([[[0.0, 0.0], [w - 1, 0.0], [0.0, h - 1], [w - 1, h - 1]]], dtype=dt)
        start = _ops.repeat(_ops.convert_to_tensor(corners), n, axis=0)
        return {"apply_perspective": _ops.less(threshold, probability), "start_points": start,
                "end_points": _ops.add(start, _ops.multiply(start, jitter))}

    def transform_images(self, images: Any, transformation: Any = None, training: bool = True) -> Tensor:
        images = self._images(images)
        x = self._float(images)
        if not training or transformation is None:
            return x
        x, single = (_ops.expand_dims(x, 0), True) if x.ndim == 3 else (x, False)
        out = _ops.image.perspective_transform(x, transformation["start_points"], transformation["end_points"],
                                               interpolation=self.interpolation, fill_value=self.fill_value,
                                               data_format=self.data_format)
        apply = _ops.reshape(transformation["apply_perspective"], (-1, 1, 1, 1))
        out = _ops.where(apply, out, x)
        return _ops.squeeze(out, 0) if single else out

    def get_config(self) -> dict:
        return {**super().get_config(), "factor": list(self.factor), "scale": self.scale,
                "interpolation": self.interpolation, "fill_value": self.fill_value, "seed": self.seed}


__all__ += ["RandomShear", "RandomPerspective"]


@register
class CutMix(_ImagePreprocessing):
    """``CutMix(factor=1.0, seed=None, data_format=None)``: in training, a random box of each image of a batch
    replaced by the same box of another image (a random permutation), its label mixed by the kept area: with
    ``alpha`` drawn in ``factor`` (plus 1e-6) and ``w ~ Beta(alpha, alpha)`` per image, a box of side ratio
    ``sqrt(1 - w)`` at a uniform position; the label weight is the box's exact complement (Keras 3). A single
    image (rank 3) is left as it is. Transformation: ``{"permutation_order": (batch,) int32, "batch_masks": a bool
    array of the images' shape, "mix_weight": (batch, 1, 1, 1)}``."""

    def __init__(self, factor: Any = 1.0, seed: "int | None" = None, data_format: "str | None" = None,
                 **kwargs: Any) -> None:
        super().__init__(data_format=data_format, **kwargs)
        self.factor = _factor_pair(factor, "factor", self._owner, 0.0, 1.0, clip_low=True)
        self._make_generator(seed)

    def get_random_transformation(self, data: Any, training: bool = True, seed: Any = None) -> Any:
        if not training:
            return None
        images = self._images(data["images"] if isinstance(data, dict) else data)
        if images.ndim == 3:
            return None
        n = int(images.shape[0])
        h, w = self._hw(images)
        dt = self._effective_compute_dtype()
        gen = seed if seed is not None else self._generator_on(_backend.device_of(images.data))
        alpha = _ops.add(_random.uniform((), self.factor[0], self.factor[1], dtype=dt, seed=gen), 1e-6)
        weight = _random.beta((n,), alpha, alpha, dtype=dt, seed=gen)
        ratio = _ops.sqrt(_ops.subtract(1.0, weight))

        def bounds(length: int) -> tuple:
            crop = _ops.multiply(ratio, float(length))
            start = _ops.multiply(_random.uniform((n,), 0.0, 1.0, dtype=dt, seed=gen), _ops.subtract(float(length), crop))
            return start, _ops.add(start, crop)

        x0, x1 = bounds(w)
        y0, y1 = bounds(h)
        mask = _box_mask(self, images, x0, x1, y0, y1)

        def col(t: Tensor) -> Tensor:
            return _ops.reshape(t, (-1, 1, 1, 1))

        mix = _ops.subtract(1.0, _ops.divide(_ops.multiply(_ops.subtract(col(x1), col(x0)),
                                                           _ops.subtract(col(y1), col(y0))), float(w * h)))
        order = _random.shuffle(_ops.arange(0, n, dtype="int32"), seed=gen)
        return {"permutation_order": order, "batch_masks": mask, "mix_weight": mix}

    def transform_images(self, images: Any, transformation: Any = None, training: bool = True) -> Tensor:
        images = self._images(images)
        x = self._float(images)
        if not training or transformation is None:
            return x
        other = _ops.take(x, transformation["permutation_order"], axis=0)
        return _ops.where(transformation["batch_masks"], other, x)

    def transform_labels(self, labels: Any, transformation: Any = None, training: bool = True) -> Tensor:
        y = labels if isinstance(labels, Tensor) else _ops.convert_to_tensor(labels)
        if not training or transformation is None:
            return y
        if y.dtype.kind != "f":
            y = _ops.cast(y, self._effective_compute_dtype())
        w = _ops.cast(_ops.reshape(transformation["mix_weight"], (-1, 1)), y.dtype)
        other = _ops.take(y, transformation["permutation_order"], axis=0)
        return _ops.add(_ops.multiply(w, y), _ops.multiply(_ops.subtract(1.0, w), other))

    call = MixUp.call

    def get_config(self) -> dict:
        return {**super().get_config(), "factor": list(self.factor), "seed": self.seed}


__all__ += ["CutMix"]


@register
class Equalization(_ImagePreprocessing):
    """``Equalization(value_range=(0, 255), bins=256, data_format=None)``: histogram equalisation of each channel,
    as Keras 3 computes it: one histogram of ``bins`` bins per channel over the whole batch (Keras's layer takes
    each channel's values of every image together), its cumulative sum as the lookup table (a channel with a
    single occupied bin is left as it is). Deterministic: applied whenever ``training`` is true (the default of a
    direct call), the identity otherwise."""

    def __init__(self, value_range: Any = (0, 255), bins: int = 256, data_format: "str | None" = None,
                 **kwargs: Any) -> None:
        super().__init__(data_format=data_format, **kwargs)
        self.bins = _validate.integer(bins, "bins", self._owner, minimum=2)
        self.value_range = _range(value_range, self._owner)

    def _equalize(self, channel: Tensor) -> Tensor:
        c = _to_range(channel, self.value_range, (0, 255))
        nb = self.bins
        scaled = _ops.divide(_ops.multiply(_ops.cast(c, "float32"), float(nb - 1)), 255.0)
        flat = _ops.reshape(_ops.clip(_ops.cast(scaled, "int32"), 0, nb - 1), (-1,))
        hist = _ops.bincount(flat, minlength=nb)
        cdf = _ops.cast(_ops.cumsum(hist), "float32")
        cdf_min = _ops.take(cdf, _ops.argmax(_ops.greater(cdf, 0.0)))
        denominator = _ops.subtract(cdf[-1], cdf_min)
        denominator = _ops.where(_ops.equal(denominator, 0.0), 1.0, denominator)
        table = _ops.clip(_ops.round(_ops.divide(_ops.multiply(_ops.subtract(cdf, cdf_min), 255.0), denominator)),
                          0.0, 255.0)
        index = _ops.cast(_ops.clip(_ops.multiply(_ops.divide(c, 255.0), float(nb - 1)), 0.0, float(nb - 1)), "int32")
        equalized = _ops.cast(_ops.take(table, index), c.dtype)
        occupied = _ops.count_nonzero(hist)
        out = _ops.where(_ops.less_equal(occupied, 1), c, equalized)
        return _to_range(out, (0, 255), self.value_range)

    def transform_images(self, images: Any, transformation: Any = None, training: bool = True) -> Tensor:
        images = self._images(images)
        if not training:
            return images
        x = self._float(images)
        axis = -1 if self.data_format == "channels_last" else -3
        channels = _ops.unstack(x, int(x.shape[axis]), axis=axis)
        return _ops.stack([self._equalize(c) for c in channels], axis=axis)

    def get_config(self) -> dict:
        return {**super().get_config(), "bins": self.bins, "value_range": self.value_range}


__all__ += ["Equalization"]


def _box_mask(layer: _ImagePreprocessing, images: Tensor, x0: Tensor, x1: Tensor, y0: Tensor, y1: Tensor) -> Tensor:
    """Keras's ``_generate_batch_mask``: True inside each image's box ``[x0, x1) x [y0, y1)`` (pixel indices), for
    every channel; the images' shape."""
    h, w = layer._hw(images)
    dt = layer._effective_compute_dtype()
    last = layer.data_format == "channels_last"
    gy = _ops.reshape(_ops.arange(h, dtype=dt), (1, h, 1, 1) if last else (1, 1, h, 1))
    gx = _ops.reshape(_ops.arange(w, dtype=dt), (1, 1, w, 1) if last else (1, 1, 1, w))

    def col(t: Tensor) -> Tensor:
        return _ops.reshape(t, (-1, 1, 1, 1))

    mask = _ops.logical_and(_ops.logical_and(_ops.greater_equal(gx, col(x0)), _ops.less(gx, col(x1))),
                            _ops.logical_and(_ops.greater_equal(gy, col(y0)), _ops.less(gy, col(y1))))
    shape = tuple(int(s) for s in images.shape)
    return _ops.broadcast_to(mask, shape if len(shape) == 4 else (1, *shape))


@register
class RandomErasing(_ImagePreprocessing):
    """``RandomErasing(factor=1.0, scale=(0.02, 0.33), fill_value=None, value_range=(0, 255), seed=None,
    data_format=None)``: in training, with probability drawn in ``factor``, a random box of each image (side ratios
    ``sqrt`` of draws in ``scale``, at a uniform position) filled with ``fill_value`` (a number, three numbers per
    channel, or None: Gaussian noise times ``value_range[1]``), as Keras 3. Transformation: ``{"apply_erasing":
    (batch,) bool, "batch_masks": a bool array of the images' shape, "fill_value": an array of it}``."""

    def __init__(self, factor: Any = 1.0, scale: Any = (0.02, 0.33), fill_value: Any = None,
                 value_range: Any = (0, 255), seed: "int | None" = None, data_format: "str | None" = None,
                 **kwargs: Any) -> None:
        super().__init__(data_format=data_format, **kwargs)
        owner = self._owner
        self.factor = _factor_pair(factor, "factor", owner, 0.0, 1.0, clip_low=True)
        self.scale = _factor_pair(scale, "scale", owner, 0.0, 1.0, clip_low=True)
        if fill_value is not None and not (_is_number(fill_value) or (
                isinstance(fill_value, (tuple, list)) and len(fill_value) == 3 and all(map(_is_number, fill_value)))):
            raise ValueError(f"{owner}: fill_value must be None, a number or a list of three numbers, got "
                             f"{fill_value!r}")
        self.fill_value = list(fill_value) if isinstance(fill_value, tuple) else fill_value
        self.value_range = list(value_range) if isinstance(value_range, (tuple, list)) else value_range
        _range(self.value_range, owner)
        self._make_generator(seed)

    def get_random_transformation(self, data: Any, training: bool = True, seed: Any = None) -> Any:
        if not training:
            return None
        images = self._images(data["images"] if isinstance(data, dict) else data)
        n = int(images.shape[0]) if images.ndim == 4 else 1
        h, w = self._hw(images)
        dt = self._effective_compute_dtype()
        gen = seed if seed is not None else self._generator_on(_backend.device_of(images.data))
        ratio = _ops.sqrt(_random.uniform((n, 2), self.scale[0], self.scale[1], dtype=dt, seed=gen))

        def bounds(length: int, r: Tensor) -> tuple:
            crop = _ops.multiply(r, float(length))
            start = _ops.multiply(_random.uniform((n,), 0.0, 1.0, dtype=dt, seed=gen), _ops.subtract(float(length), crop))
            return start, _ops.add(start, crop)

        x0, x1 = bounds(w, ratio[:, 0])
        y0, y1 = bounds(h, ratio[:, 1])
        batched = images if images.ndim == 4 else _ops.expand_dims(images, 0)
        mask = _box_mask(self, batched, x0, x1, y0, y1)
        probability = _random.uniform((n,), self.factor[0], self.factor[1], seed=gen)
        threshold = _random.uniform((n,), 0.0, 1.0, seed=gen)
        shape = tuple(int(s) for s in batched.shape)
        if self.fill_value is None:
            fill = _ops.multiply(_random.normal(shape, dtype=dt, seed=gen), float(self.value_range[1]))
        elif isinstance(self.fill_value, list):
            per_channel = (1, 1, 1, 3) if self.data_format == "channels_last" else (1, 3, 1, 1)
            fill = _ops.broadcast_to(_ops.reshape(_ops.convert_to_tensor(np.asarray(self.fill_value, dt)),
                                                  per_channel), shape)
        else:
            fill = _ops.full(shape, float(self.fill_value), dtype=dt)
        return {"apply_erasing": _ops.less(threshold, probability), "batch_masks": mask, "fill_value": fill}

    def transform_images(self, images: Any, transformation: Any = None, training: bool = True) -> Tensor:
        images = self._images(images)
        x = self._float(images)
        if not training or transformation is None:
            return x
        single = x.ndim == 3
        xb = _ops.expand_dims(x, 0) if single else x
        fill = _ops.cast(transformation["fill_value"], xb.dtype)
        erased = _ops.where(transformation["batch_masks"], fill, xb)
        out = _ops.where(_ops.reshape(transformation["apply_erasing"], (-1, 1, 1, 1)), erased, xb)
        return _ops.squeeze(out, 0) if single else out

    def get_config(self) -> dict:
        return {**super().get_config(), "factor": list(self.factor), "scale": list(self.scale),
                "fill_value": self.fill_value, "value_range": self.value_range, "seed": self.seed}


__all__ += ["RandomErasing"]
