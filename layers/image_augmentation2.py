"""The last image augmentation layers of Keras 3: RandomPosterization, RandomElasticTransform, AugMix and
RandAugment.

Written in :mod:`dnnbind.ops` on the pattern of :mod:`.image_preprocessing` (whose base they share): a per-layer
:class:`dnnbind.random.SeedGenerator` whose counter lives on the images' device (no host read, so a captured
training step draws new transforms on each replay), Keras's two steps ``get_random_transformation`` /
``transform_images`` with Keras's transformation formats where Keras's can be applied as given, and
``call(inputs, training=True)``.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from dnnbind import _validate
from dnnbind import backend as _backend
from dnnbind import ops as _ops
from dnnbind import random as _random
from dnnbind.autodiff.tensor import Tensor
from dnnbind.ops import _image as _image_ops

from .base import register
from .image_augmentation import _to_range
from .image_preprocessing import _ImagePreprocessing

__all__ = ["RandomPosterization", "RandomElasticTransform", "AugMix", "RandAugment"]


def _keras_factor(value: Any, name: str, owner: str, bounds: tuple, what: str = "factor") -> tuple:
    """Keras 3.15's ``_set_factor`` rule, checks included: a number (``int``/``float``) within ``bounds`` means
    ``(max(-|f|, low), |f|)``; a pair only needs ``pair[0] <= high`` and ``pair[1] >= low`` (as given, before
    sorting: Keras checks no more) and is sorted."""
    message = (f"{owner}: The `{name}` argument should be a number (or a list of two numbers) in the range "
               f"[{bounds[0]}, {bounds[1]}]. Received: {what}={value}")
    if isinstance(value, (tuple, list)):
        if len(value) != 2 or not all(isinstance(v, (int, float)) for v in value):
            raise ValueError(message)
        if value[0] > bounds[1] or value[1] < bounds[0]:
            raise ValueError(message)
        return tuple(sorted(value))
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if value < bounds[0] or value > bounds[1]:
            raise ValueError(message)
        f = abs(value)
        return (max(-f, bounds[0]), f)
    raise ValueError(message)


def _pair_range(value: Any, owner: str) -> list:
    if not isinstance(value, (tuple, list)) or len(value) != 2:
        raise ValueError(f"{owner}: The `value_range` argument should be a list of two numbers. "
                         f"Received: value_range={value}")
    return sorted(value)


@register
class RandomPosterization(_ImagePreprocessing):
    """``RandomPosterization(factor, value_range=(0, 255), data_format=None, seed=None)``: in training, each image
    keeps only its top ``bits`` bits per channel (on the 0-255 scale, as uint8: ``(x >> s) << s`` with ``s = 8 -
    bits``), as Keras 3.15. ``factor`` follows Keras's rule and its checks exactly: a number ``f`` in [1, 8] means
    ``(1, f)``; a pair is only required to satisfy ``pair[0] <= 8`` and ``pair[1] >= 1``; ``bits`` is drawn with
    ``randint(factor[0], factor[1])`` (the upper end excluded: ``factor=4`` keeps 1, 2 or 3 bits) unless both ends
    are equal. Not training: the images unchanged. Transformation: ``{"shift_factor": (batch,) uint8}``."""

    def __init__(self, factor: Any, value_range: Any = (0, 255), data_format: "str | None" = None,
                 seed: "int | None" = None, **kwargs: Any) -> None:
        super().__init__(data_format=data_format, **kwargs)
        self.factor = _keras_factor(factor, "factor", self._owner, (1, 8))
        self.value_range = _pair_range(value_range, self._owner)
        self._make_generator(seed)

    def get_random_transformation(self, data: Any, training: bool = True, seed: Any = None) -> Any:
        images = self._images(data["images"] if isinstance(data, dict) else data)
        n = self._batch(images)
        if self.factor[0] != self.factor[1]:
            if seed is None:
                seed = self._generator_on(_backend.device_of(images.data))
            bits = _random.randint((n,), int(self.factor[0]), int(self.factor[1]), dtype="uint8", seed=seed)
        else:
            bits = _ops.full_like(_ops.reshape(images, (n, -1))[:, 0], int(self.factor[0]), dtype="uint8")
        return {"shift_factor": _ops.subtract(np.uint8(8), bits)}

    def transform_images(self, images: Any, transformation: Any = None, training: bool = True) -> Tensor:
        images = self._images(images)
        if not training:
            return images
        if transformation is None:
            transformation = self.get_random_transformation(images)
        shift = _ops.cast(transformation["shift_factor"], "uint8")
        shift = _ops.reshape(shift, (-1, 1, 1, 1) if images.ndim == 4 else (1, 1, 1))
        x = _to_range(self._float(images), self.value_range, (0, 255))
        x = _ops.cast(x, "uint8")
        x = _ops.bitwise_left_shift(_ops.bitwise_right_shift(x, shift), shift)
        return _to_range(self._float(x), (0, 255), self.value_range)

    def get_config(self) -> dict:
        return {**super().get_config(), "factor": self.factor, "value_range": self.value_range, "seed": self.seed}


_ELASTIC_FILL_MODES = ("constant", "nearest", "wrap", "mirror", "reflect")
_ELASTIC_INTERPOLATIONS = ("nearest", "bilinear")


@register
class RandomElasticTransform(_ImagePreprocessing):
    """``RandomElasticTransform(factor=1.0, scale=1.0, interpolation="bilinear", fill_mode="reflect",
    fill_value=0.0, value_range=(0, 255), seed=None, data_format=None)``: in training, each image is, with a
    probability drawn in ``factor``, resampled at its pixel grid displaced by ``alpha`` times two Gaussian-blurred
    normal fields scaled by ``sigma`` (``alpha = 0.1 max(H, W) d``, ``sigma = 0.05 min(H, W) d`` for a distortion
    ``d`` drawn once per batch in ``scale``), then clipped to ``value_range``, as Keras 3.15's layer over
    ``ops.image.elastic_transform``. ``factor`` and ``scale`` follow Keras's rule and checks (bounds [0, 1]).

    Transformation: ``{"apply_transform": (batch,) bool, "distortion_factor": (), "dx": (batch, H, W), "dy":
    (batch, H, W)}``: the unit normal fields are part of it (drawn on the device from the layer's generator),
    where Keras carries a seed; Keras's JAX backend draws both fields from one key (they are equal), dnnbind two.
    The blur's kernel size is ``int(6 sigma) | 1`` for the largest sigma ``scale`` allows (a random ``sigma``
    would otherwise be read on the host), its taps from the drawn ``sigma``: with a fixed ``scale`` (both ends
    equal) this is Keras's kernel exactly, otherwise its taps reach further (the far taps are tiny).
    Not training: the images cast to the compute dtype."""

    def __init__(self, factor: Any = 1.0, scale: Any = 1.0, interpolation: str = "bilinear",
                 fill_mode: str = "reflect", fill_value: Any = 0.0, value_range: Any = (0, 255),
                 seed: "int | None" = None, data_format: "str | None" = None, **kwargs: Any) -> None:
        super().__init__(data_format=data_format, **kwargs)
        self.factor = _keras_factor(factor, "factor", self._owner, (0, 1))
        self.scale = _keras_factor(scale, "scale", self._owner, (0, 1))
        if interpolation not in _ELASTIC_INTERPOLATIONS:
            raise NotImplementedError(f"{self._owner}: Unknown `interpolation` {interpolation}. Expected of one "
                                      f"{_ELASTIC_INTERPOLATIONS}.")
        if fill_mode not in _ELASTIC_FILL_MODES:
            raise NotImplementedError(f"{self._owner}: Unknown `fill_mode` {fill_mode}. Expected of one "
                                      f"{_ELASTIC_FILL_MODES}.")
        self.interpolation, self.fill_mode = interpolation, fill_mode
        self.fill_value = _validate.number(fill_value, "fill_value", self._owner)
        _pair_range(value_range, self._owner)
        self.value_range = list(value_range)
        self._make_generator(seed)

    def get_random_transformation(self, data: Any, training: bool = True, seed: Any = None) -> Any:
        if not training or self.scale[1] == 0 or self.factor[1] == 0:
            return None
        images = self._images(data["images"] if isinstance(data, dict) else data)
        n = self._batch(images)
        h, w = self._hw(images)
        if seed is None:
            seed = self._generator_on(_backend.device_of(images.data))
        probability = _random.uniform((n,), self.factor[0], self.factor[1], seed=seed)
        threshold = _random.uniform((n,), 0.0, 1.0, seed=seed)
        dt = self._effective_compute_dtype()
        distortion = _random.uniform((), self.scale[0], self.scale[1], dtype=dt, seed=seed)
        return {"apply_transform": _ops.less(threshold, probability), "distortion_factor": distortion,
                "dx": _random.normal((n, h, w), dtype=dt, seed=seed),
                "dy": _random.normal((n, h, w), dtype=dt, seed=seed)}

    def _field(self, noise: Any, sigma: Any, size: int, like: Tensor) -> Tensor:
        """``sigma * noise`` blurred along both axes (zero SAME padding), ``(N, H, W)``."""
        d = _ops.multiply(_ops.cast(noise, like.dtype), sigma)
        blurred = _ops.image.gaussian_blur(_ops.expand_dims(d, -1), kernel_size=(size, size), sigma=(sigma, sigma),
                                           data_format="channels_last")
        return _ops.squeeze(blurred, -1)

    def transform_images(self, images: Any, transformation: Any = None, training: bool = True) -> Tensor:
        images = self._float(self._images(images))
        if not training or transformation is None:
            return images
        h, w = self._hw(images)
        factor = _ops.cast(transformation["distortion_factor"], images.dtype)
        alpha = _ops.multiply(factor, 0.1 * max(h, w))
        sigma = _ops.multiply(factor, 0.05 * min(h, w))
        size = int(6 * (min(h, w) * (0.05 * self.scale[1]))) | 1
        single = images.ndim == 3
        x = _ops.expand_dims(images, 0) if single else images
        if self.data_format == "channels_first":
            x = _ops.transpose(x, (0, 2, 3, 1))
        dx = self._field(transformation["dx"], sigma, size, x)
        dy = self._field(transformation["dy"], sigma, size, x)
        rows = _ops.reshape(_ops.arange(h, dtype=x.dtype), (1, h, 1))
        cols = _ops.reshape(_ops.arange(w, dtype=x.dtype), (1, 1, w))
        coords = [_ops.add(rows, _ops.multiply(dy, alpha)), _ops.add(cols, _ops.multiply(dx, alpha))]
        out = _image_ops._sample(x, coords, 1 if self.interpolation == "bilinear" else 0, self.fill_mode,
                                 self.fill_value)
        if self.data_format == "channels_first":
            out = _ops.transpose(out, (0, 3, 1, 2))
        out = _ops.squeeze(out, 0) if single else out
        apply = _ops.reshape(transformation["apply_transform"], (-1, 1, 1, 1) if not single else (1, 1, 1))
        out = _ops.where(apply, out, images)
        return _ops.cast(_ops.clip(out, self.value_range[0], self.value_range[1]), images.dtype)

    def get_config(self) -> dict:
        return {**super().get_config(), "factor": self.factor, "scale": self.scale,
                "interpolation": self.interpolation, "fill_mode": self.fill_mode, "fill_value": self.fill_value,
                "value_range": self.value_range, "seed": self.seed}


class _Composite(_ImagePreprocessing):
    """The augmentation layers AugMix and RandAugment choose from, made as Keras makes them (its names, factors
    and order); their draws come from the composite's generator, as Keras's ``seed=self._get_seed_generator``."""

    def _sublayers_from(self, names: Sequence[str], factor: tuple, interpolation: str, data_format: Any) -> None:
        from . import image_augmentation as _ia
        from . import image_preprocessing as _ipp

        common = {"data_format": data_format, "dtype": self.dtype_policy}
        seeded = {**common, "seed": self.seed}
        vr = self.value_range
        makers = {
            "random_shear": lambda: _ia.RandomShear(x_factor=factor, y_factor=factor, interpolation=interpolation,
                                                    **seeded),
            "random_translation": lambda: _ipp.RandomTranslation(height_factor=factor, width_factor=factor,
                                                                 interpolation=interpolation, **seeded),
            "random_rotation": lambda: _ipp.RandomRotation(factor=factor, interpolation=interpolation, **seeded),
            "random_posterization": lambda: RandomPosterization(factor=max(1, int(8 * factor[1])), value_range=vr,
                                                                **seeded),
            "solarization": lambda: _ia.Solarization(addition_factor=factor, threshold_factor=factor, value_range=vr,
                                                     **seeded),
            "auto_contrast": lambda: _ia.AutoContrast(value_range=vr, **common),
            "equalization": lambda: _ia.Equalization(value_range=vr, **common),
            "random_brightness": lambda: _ipp.RandomBrightness(factor=factor, value_range=vr, **seeded),
            "random_color_degeneration": lambda: _ia.RandomColorDegeneration(factor=factor, value_range=vr, **seeded),
            "random_contrast": lambda: _ipp.RandomContrast(factor=factor, value_range=vr, **seeded),
            "random_sharpness": lambda: _ia.RandomSharpness(factor=factor, value_range=vr, **seeded),
        }
        self._augment_layers = list(names)
        for name in names:
            setattr(self, name, makers[name]())

    def _sub_transformation(self, name: str, images: Tensor, seed: Any) -> Any:
        return getattr(self, name).get_random_transformation(images, training=True, seed=seed)

    def _apply(self, name: str, images: Tensor, transformation: Any) -> Tensor:
        return _ops.cast(getattr(self, name).transform_images(images, transformation, training=True), images.dtype)

    def compute_output_shape(self, input_shape: Sequence[Any]) -> tuple:
        return tuple(input_shape)


AUGMIX_LAYERS_ALL = ("random_shear", "random_translation", "random_rotation", "random_posterization", "solarization",
                     "auto_contrast", "equalization", "random_brightness", "random_color_degeneration",
                     "random_contrast", "random_sharpness")
AUGMIX_LAYERS = AUGMIX_LAYERS_ALL[:7]


@register
class AugMix(_Composite):
    """``AugMix(value_range=(0, 255), num_chains=3, chain_depth=3, factor=0.3, alpha=1.0, all_ops=True,
    interpolation="bilinear", seed=None, data_format=None)``: Keras 3's AugMix. In training, ``num_chains`` chains
    of ``chain_depth`` steps, each step one of the augmentation layers (``all_ops``: the eleven, else the seven
    geometric and tonal ones, made as Keras makes them from ``factor``: a number ``f`` in [0, 1] means ``(0, f)``)
    or nothing; the chains are mixed with Dirichlet(``alpha``) weights and the result with the images by a
    Beta(``alpha``, ``alpha``) weight, then clipped to ``value_range``.

    Keras picks each step's layer with Python's ``random`` on the host; here the pick is a device draw from the
    layer's generator (``randint`` over the layers and "nothing"), and every layer's candidate is computed and the
    picked one selected (``where``), as Keras's RandAugment selects: no host read, so a captured training step picks
    anew on each replay, at the price of computing every candidate. Transformation: ``{"chain_mixing_weights":
    (num_chains,), "weight_sample": (), "chain_transforms": [[step, ...], ...]}`` where a step is Keras's
    ``{"layer_name": name, "transformation": t}`` (applied as given) or dnnbind's ``{"layer_index": () int,
    "transformations": {name: t}}`` (index ``len(layers)``: nothing). Not training: the images cast to the compute
    dtype."""

    def __init__(self, value_range: Any = (0, 255), num_chains: int = 3, chain_depth: int = 3, factor: Any = 0.3,
                 alpha: float = 1.0, all_ops: bool = True, interpolation: str = "bilinear",
                 seed: "int | None" = None, data_format: "str | None" = None, **kwargs: Any) -> None:
        super().__init__(data_format=data_format, **kwargs)
        self.value_range = list(value_range) if isinstance(value_range, tuple) else value_range
        _pair_range(self.value_range, self._owner)
        self.num_chains = _validate.integer(num_chains, "num_chains", self._owner, minimum=1)
        self.chain_depth = _validate.integer(chain_depth, "chain_depth", self._owner, minimum=1)
        self.factor = _keras_factor(factor, "factor", self._owner, (0, 1))
        self.alpha = _validate.number(alpha, "alpha", self._owner, low=0.0, low_open=True)
        self.all_ops = bool(all_ops)
        self.interpolation = interpolation
        self._make_generator(seed)
        self._sublayers_from(AUGMIX_LAYERS_ALL if self.all_ops else AUGMIX_LAYERS, self.factor, interpolation,
                             data_format)

    def get_random_transformation(self, data: Any, training: bool = True, seed: Any = None) -> Any:
        if not training:
            return None
        images = self._images(data["images"] if isinstance(data, dict) else data)
        if seed is None:
            seed = self._generator_on(_backend.device_of(images.data))
        g = _random.gamma((self.num_chains,), self.alpha, seed=seed)
        weights = _ops.divide(g, _ops.sum(g, axis=-1, keepdims=True))
        # (shape (1,), then the scalar: random.beta of shape () fails in the NumPy sigmoid kernel today)
        weight_sample = _ops.reshape(_random.beta((1,), self.alpha, self.alpha, seed=seed), ())
        chains = []
        for _ in range(self.num_chains):
            steps = []
            for _ in range(self.chain_depth):
                index = _random.randint((), 0, len(self._augment_layers) + 1, seed=seed)
                steps.append({"layer_index": index,
                              "transformations": {name: self._sub_transformation(name, images, seed)
                                                  for name in self._augment_layers}})
            chains.append(steps)
        return {"chain_mixing_weights": weights, "weight_sample": weight_sample, "chain_transforms": chains}

    def _step(self, x: Tensor, step: dict) -> Tensor:
        if "layer_name" in step:
            return self._apply(step["layer_name"], x, step["transformation"])
        index = step["layer_index"]
        out = x
        for i, name in enumerate(self._augment_layers):
            out = _ops.where(_ops.equal(index, i), self._apply(name, x, step["transformations"][name]), out)
        return out

    def transform_images(self, images: Any, transformation: Any = None, training: bool = True) -> Tensor:
        images = self._float(self._images(images))
        if not training or transformation is None:
            return images
        weights = _ops.cast(transformation["chain_mixing_weights"], images.dtype)
        w = _ops.cast(transformation["weight_sample"], images.dtype)
        mixed = _ops.zeros_like(images)
        for i, chain in enumerate(transformation["chain_transforms"]):
            x = images
            for step in chain:
                x = self._step(x, step)
            mixed = _ops.add(mixed, _ops.multiply(x, weights[i]))
        out = _ops.add(_ops.multiply(w, images), _ops.multiply(_ops.subtract(1.0, w), mixed))
        return _ops.cast(_ops.clip(out, self.value_range[0], self.value_range[1]), images.dtype)

    def get_config(self) -> dict:
        return {**super().get_config(), "value_range": self.value_range, "num_chains": self.num_chains,
                "chain_depth": self.chain_depth, "factor": self.factor, "alpha": self.alpha, "all_ops": self.all_ops,
                "interpolation": self.interpolation, "seed": self.seed}


RANDAUGMENT_LAYERS = ("random_shear", "random_translation", "random_rotation", "random_brightness",
                      "random_color_degeneration", "random_contrast", "random_sharpness", "random_posterization",
                      "solarization", "auto_contrast", "equalization")


@register
class RandAugment(_Composite):
    """``RandAugment(value_range=(0, 255), num_ops=2, factor=0.5, interpolation="bilinear", seed=None,
    data_format=None)``: Keras 3's RandAugment. In training, ``num_ops`` times, one of eleven augmentation layers
    (made as Keras makes them from ``factor``: a number ``f`` in [0, 1] means ``(0, f)``) picked by a device draw
    and applied; every candidate is computed and the picked one selected (``where``), as Keras does, so a captured
    step picks anew on each replay. Each layer's transformation is drawn once per call (a layer picked twice
    applies it twice). Transformation: Keras's ``{"transforms": {name: t}, "layer_idxes": (num_ops,) int}``. Not
    training: the images cast to the compute dtype."""

    def __init__(self, value_range: Any = (0, 255), num_ops: int = 2, factor: Any = 0.5,
                 interpolation: str = "bilinear", seed: "int | None" = None, data_format: "str | None" = None,
                 **kwargs: Any) -> None:
        super().__init__(data_format=data_format, **kwargs)
        self.value_range = list(value_range) if isinstance(value_range, tuple) else value_range
        _pair_range(self.value_range, self._owner)
        self.num_ops = _validate.integer(num_ops, "num_ops", self._owner, minimum=0)
        self.factor = _keras_factor(factor, "factor", self._owner, (0, 1))
        self.interpolation = interpolation
        self._make_generator(seed)
        self._sublayers_from(RANDAUGMENT_LAYERS, self.factor, interpolation, data_format)

    def get_random_transformation(self, data: Any, training: bool = True, seed: Any = None) -> Any:
        if not training:
            return None
        images = self._images(data["images"] if isinstance(data, dict) else data)
        if seed is None:
            seed = self._generator_on(_backend.device_of(images.data))
        idxes = _random.randint((max(self.num_ops, 1),), 0, len(self._augment_layers), seed=seed)[:self.num_ops]
        transforms = {name: self._sub_transformation(name, images, seed) for name in self._augment_layers}
        return {"transforms": transforms, "layer_idxes": idxes}

    def transform_images(self, images: Any, transformation: Any = None, training: bool = True) -> Tensor:
        images = self._float(self._images(images))
        if not training or transformation is None:
            return images
        idxes = transformation["layer_idxes"]
        transforms = transformation["transforms"]
        x = images
        for i in range(self.num_ops):
            for k, name in enumerate(transforms):
                x = _ops.where(_ops.equal(idxes[i], k), self._apply(name, x, transforms[name]), x)
        return x

    def get_config(self) -> dict:
        return {**super().get_config(), "value_range": self.value_range, "num_ops": self.num_ops,
                "factor": self.factor, "interpolation": self.interpolation, "seed": self.seed}
