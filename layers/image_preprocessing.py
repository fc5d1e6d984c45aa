"""Image augmentation and preprocessing layers (Keras 3): RandomFlip, RandomRotation, RandomZoom,
RandomTranslation, RandomCrop, RandomContrast, RandomBrightness, Resizing, CenterCrop.

They are written in :mod:`dnnbind.ops` (``call``, no hand-written backward), so they run on both
backends, differentiate through the tape and compose inside a captured training step. Their random
numbers come from a :class:`dnnbind.random.SeedGenerator` per layer (``seed=None``: one drawn from
:func:`dnnbind.utils.draw_seed`, so :func:`dnnbind.utils.set_random_seed` makes it reproducible), whose
counter lives and advances on the images' device: a replayed graph draws new transforms.

As in Keras 3, ``call(inputs, training=True)``: a layer called on its own augments (``training``
defaults to True); inside a model it follows the model's ``training`` (``fit`` augments, ``predict``
and ``evaluate`` do not). When not training the random layers are the identity (cast to the compute
dtype as Keras does), except RandomCrop (below). Each layer has Keras's two steps,
``get_random_transformation(images, training=True, seed=None)`` and ``transform_images(images,
transformation, training=True)``, with Keras's transformation dicts (``{"flips": ...}``,
``{"rotation_matrix": ...}``, ...), so a given transformation can be applied deterministically.

Images are ``(batch, height, width, channels)`` (channels_last) or ``(batch, channels, height,
width)``, or one image without the batch axis. The geometric layers sample with
:func:`dnnbind.ops.image.affine_transform` (Keras's JAX numerics).

Differences from Keras 3.15, on purpose:

* RandomCrop when not training (and in training when the image is not larger than the crop on both
  axes) returns the largest central crop of the target's aspect ratio resized to ``(height, width)``, as
  Keras documents it and as its ``compute_output_shape`` says; Keras 3.15's code returns the uncropped
  images at inference, and slices ``height`` rows from the aspect box's start in training.
* RandomFlip refuses an unknown ``mode`` (Keras ignores it and never flips).
* RandomBrightness on integer images adds in float and saturates back to their dtype (Keras casts the
  delta to the image dtype, so negative deltas wrap around on uint8).
"""

from __future__ import annotations

import math
import numbers
from typing import Any, Sequence

import numpy as np

from dnnbind import _validate, backend, utils
from dnnbind import kernels as _kernels
from dnnbind import ops as _ops
from dnnbind import random as _random
from dnnbind.autodiff.tensor import Tensor

from .base import Layer, register

__all__ = ["RandomFlip", "RandomRotation", "RandomZoom", "RandomTranslation", "RandomCrop", "RandomContrast",
           "RandomBrightness", "Resizing", "CenterCrop"]

_AFFINE_FILL_MODES = ("reflect", "wrap", "constant", "nearest")
_AFFINE_INTERPOLATIONS = ("nearest", "bilinear")
_RESIZE_INTERPOLATIONS = ("bilinear", "nearest", "lanczos3", "lanczos5", "bicubic", "area")
_FLIP_MODES = ("horizontal", "vertical", "horizontal_and_vertical")


def _is_number(value: Any) -> bool:
    return isinstance(value, (numbers.Real, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_))


def _factor_pair(value: Any, name: str, owner: str, low: float, high: float, low_open: bool = False,
                 clip_low: bool = False) -> tuple:
    """Keras's factor rule: a number ``f`` means ``(-|f|, |f|)`` (with ``clip_low``, the lower end raised
    to ``low``: Keras's image layers' base rule), a pair of numbers is sorted; the number, or each number
    of the pair, in ``[low, high]`` (``(low, high]`` with ``low_open``)."""
    interval = f"{'(' if low_open else '['}{low:g}, {high:g}]"
    message = f"{owner}: {name} must be a number or a pair of numbers in {interval}, got {value!r}"

    def inside(v: float) -> bool:
        return math.isfinite(v) and (low < v if low_open else low <= v) and v <= high

    if isinstance(value, (tuple, list)):
        if len(value) != 2 or not all(_is_number(v) and inside(float(v)) for v in value):
            raise ValueError(message)
        return tuple(sorted(float(v) for v in value))
    if not _is_number(value) or not inside(float(value)):
        raise ValueError(message)
    f = abs(float(value))
    return (max(-f, low) if clip_low else -f, f)


def _value_range(value: Any, owner: str) -> list:
    if not isinstance(value, (tuple, list)) or len(value) != 2 or not all(_is_number(v) for v in value):
        raise ValueError(f"{owner}: value_range must be a list of two numbers (low, high), got {value!r}")
    low, high = sorted(float(v) for v in value)
    if not (math.isfinite(low) and math.isfinite(high)) or low == high:
        raise ValueError(f"{owner}: value_range must hold two different finite numbers, got {value!r}")
    return [low, high]


class _ImagePreprocessing(Layer):
    """The shared call: check the images, draw a transformation (when training), apply it."""

    def __init__(self, data_format: "str | None" = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        df = backend.image_data_format() if data_format is None else str(data_format).lower()
        self.data_format = _validate.one_of(df, "data_format", self._owner, ("channels_last", "channels_first"))

    @property
    def _owner(self) -> str:
        return f"{type(self).__name__} '{self.name}'"

    # ----- seeds -------------------------------------------------------------------------------------
    def _make_generator(self, seed: Any) -> None:
        """``self.seed`` (the config value) and ``self.generator`` (Keras: ``SeedGenerator(seed)``)."""
        self.seed = None if seed is None else _validate.integer(seed, "seed", self._owner)
        self.generator = _random.SeedGenerator(self.seed)

    def _generator_on(self, device: backend.Device) -> "_random.SeedGenerator":
        """The generator with its counter on ``device`` (moved there, value kept, the first time a draw
        goes to another device than the one it was made on: an explicit copy, outside the hot path)."""
        gen = self.generator
        if gen.device != device:
            gen.counter = backend.asarray(backend.to_numpy(gen.counter), device=device)
        return gen

    def _on_device_change(self) -> None:
        if hasattr(self, "generator"):
            self._generator_on(self.device)

    def _uniform(self, images: Tensor, shape: Sequence[int], minval: float, maxval: float,
                 dtype: Any = None, seed: Any = None) -> Tensor:
        if seed is None:
            seed = self._generator_on(backend.device_of(images.data))
        return _random.uniform(tuple(shape), minval, maxval, dtype=dtype, seed=seed)

    # ----- geometry ----------------------------------------------------------------------------------
    def _images(self, inputs: Any) -> Tensor:
        images = inputs if isinstance(inputs, Tensor) else _ops.convert_to_tensor(inputs)
        if images.ndim not in (3, 4):
            raise ValueError(f"{self._owner} expects images of rank 3 (one image) or 4 (a batch), got shape "
                             f"{tuple(images.shape)}")
        if images.dtype.kind not in "fiu" and str(images.dtype) != "bfloat16":
            raise _validate.ArgumentTypeError(f"{self._owner} expects numeric images, got dtype {images.dtype}")
        return images

    def _hw_axes(self, rank: int) -> "tuple[int, int]":
        return (rank - 3, rank - 2) if self.data_format == "channels_last" else (rank - 2, rank - 1)

    def _hw(self, images: Tensor) -> "tuple[int, int]":
        h, w = self._hw_axes(images.ndim)
        return int(images.shape[h]), int(images.shape[w])

    def _batch(self, images: Tensor) -> int:
        return int(images.shape[0]) if images.ndim == 4 else 1

    def _float(self, images: Tensor) -> Tensor:
        dt = self._effective_compute_dtype()
        return images if images.dtype == dt else _ops.cast(images, dt)

    def _affine(self, images: Tensor, matrix: Tensor, interpolation: str) -> Tensor:
        """``affine_transform`` of a batch or of one image (``matrix``: ``(N, 8)``, ``(1, 8)`` or ``(8,)``)."""
        single = images.ndim == 3
        x = _ops.expand_dims(images, 0) if single else images
        m = _ops.reshape(matrix, (-1, 8))  # coordinates in float32 at least (float16 images too), as Keras
        out = _ops.image.affine_transform(x, m, interpolation=interpolation, fill_mode=self.fill_mode,
                                          fill_value=self.fill_value, data_format=self.data_format)
        return _ops.squeeze(out, 0) if single else out

    # ----- the Keras steps -------------------------------------------------------------------------------
    def get_random_transformation(self, data: Any, training: bool = True, seed: Any = None) -> Any:
        return None

    def transform_images(self, images: Any, transformation: Any, training: bool = True) -> Tensor:
        raise NotImplementedError

    def call(self, inputs: Any, training: Any = True) -> Tensor:
        images = self._images(inputs)
        training = bool(training)
        transformation = self.get_random_transformation(images, training=training)
        return self.transform_images(images, transformation, training=training)

    def compute_output_shape(self, input_shape: Sequence[Any]) -> tuple:
        return tuple(input_shape)

    def get_config(self) -> dict:
        return {**super().get_config(), "data_format": self.data_format}


class _AffineLayer(_ImagePreprocessing):
    """A random affine resampling (rotation, zoom, translation): ``fill_mode``, ``interpolation``,
    ``fill_value``; not training, the images cast to the compute dtype."""

    def _affine_arguments(self, fill_mode: str, interpolation: str, fill_value: Any) -> None:
        if fill_mode not in _AFFINE_FILL_MODES:
            raise NotImplementedError(f"{self._owner}: unknown fill_mode {fill_mode!r}; expected one of "
                                      f"{_AFFINE_FILL_MODES}")
        if interpolation not in _AFFINE_INTERPOLATIONS:
            raise NotImplementedError(f"{self._owner}: unknown interpolation {interpolation!r}; expected one of "
                                      f"{_AFFINE_INTERPOLATIONS}")
        self.fill_mode, self.interpolation = fill_mode, interpolation
        self.fill_value = _validate.number(fill_value, "fill_value", self._owner)

    def _matrix(self, transformation: dict, images: Tensor) -> Tensor:
        raise NotImplementedError

    def transform_images(self, images: Any, transformation: Any, training: bool = True) -> Tensor:
        images = self._float(self._images(images))
        if not training or transformation is None:
            return images
        return self._affine(images, self._matrix(transformation, images), self.interpolation)

    def _affine_config(self) -> dict:
        return {"fill_mode": self.fill_mode, "interpolation": self.interpolation, "seed": self.seed,
                "fill_value": self.fill_value}


def _column(t: Tensor) -> Tensor:
    return _ops.reshape(t, (-1, 1))


@register
class RandomFlip(_ImagePreprocessing):
    """Flip each image (training) with probability 1/2: ``mode`` ``"horizontal"`` (left-right),
    ``"vertical"`` (up-down) or ``"horizontal_and_vertical"`` (both at once, one coin per image, as Keras).
    Transformation: ``{"flips": bool (batch, 1, 1, 1)}``."""

    def __init__(self, mode: str = "horizontal_and_vertical", seed: "int | None" = None,
                 data_format: "str | None" = None, **kwargs: Any) -> None:
        super().__init__(data_format=data_format, **kwargs)
        self.mode = _validate.one_of(mode, "mode", self._owner, _FLIP_MODES)
        self._make_generator(seed)

    def get_random_transformation(self, data: Any, training: bool = True, seed: Any = None) -> Any:
        if not training:
            return None
        images = self._images(data)
        shape = (1, 1, 1) if images.ndim == 3 else (int(images.shape[0]), 1, 1, 1)
        return {"flips": _ops.less_equal(self._uniform(images, shape, 0.0, 1.0, seed=seed), 0.5)}

    def transform_images(self, images: Any, transformation: Any, training: bool = True) -> Tensor:
        images = self._float(self._images(images))
        if not training or transformation is None:
            return images
        flips = transformation["flips"]
        h_axis, w_axis = self._hw_axes(images.ndim)
        out = images
        if self.mode in ("horizontal", "horizontal_and_vertical"):
            out = _ops.where(flips, _ops.flip(out, axis=w_axis), out)
        if self.mode in ("vertical", "horizontal_and_vertical"):
            out = _ops.where(flips, _ops.flip(out, axis=h_axis), out)
        return out

    def get_config(self) -> dict:
        return {**super().get_config(), "seed": self.seed, "mode": self.mode}


@register
class RandomRotation(_AffineLayer):
    """Rotate each image (training) by a random angle of ``factor`` turns (``0.1``: in [-36, 36] degrees;
    ``(lo, hi)``: in [lo * 360, hi * 360]), counter-clockwise for positive angles, about the image centre
    ``((W-1)/2, (H-1)/2)``. Transformation: ``{"angle": degrees (batch,), "rotation_matrix": (batch, 8)}``."""

    def __init__(self, factor: Any, fill_mode: str = "reflect", interpolation: str = "bilinear",
                 seed: "int | None" = None, fill_value: float = 0.0, data_format: "str | None" = None,
                 **kwargs: Any) -> None:
        super().__init__(data_format=data_format, **kwargs)
        self.factor = _factor_pair(factor, "factor", self._owner, -1.0, 1.0, clip_low=True)
        self._affine_arguments(fill_mode, interpolation, fill_value)
        self._make_generator(seed)

    def get_random_transformation(self, data: Any, training: bool = True, seed: Any = None) -> Any:
        if not training:
            return None
        images = self._images(data)
        angle = self._uniform(images, (self._batch(images),), self.factor[0] * 360.0, self.factor[1] * 360.0,
                              seed=seed)
        height, width = self._hw(images)
        return {"angle": angle, "rotation_matrix": rotation_matrix(angle, height, width)}

    def _matrix(self, transformation: dict, images: Tensor) -> Tensor:
        return transformation["rotation_matrix"]

    def get_config(self) -> dict:
        return {**super().get_config(), "factor": self.factor, **self._affine_config()}


def rotation_matrix(angle: Any, height: int, width: int) -> Tensor:
    """Keras's ``_compute_affine_matrix`` for a pure rotation: rows ``[a0, a1, a2, b0, b1, b2, 0, 0]``
    (output pixel -> input pixel) for angles in degrees (``(batch,)``), about ``((W-1)/2, (H-1)/2)``."""
    theta = _ops.multiply(_ops.convert_to_tensor(angle), math.pi / 180.0)
    cx, cy = 0.5 * (width - 1), 0.5 * (height - 1)
    cos, sin = _column(_ops.cos(theta)), _column(_ops.sin(theta))
    a2 = _ops.add(_ops.subtract(cx, _ops.multiply(cos, cx)), _ops.multiply(sin, cy))
    b2 = _ops.subtract(_ops.subtract(cy, _ops.multiply(sin, cx)), _ops.multiply(cos, cy))
    zeros = _ops.zeros_like(cos)
    return _ops.concatenate([cos, _ops.negative(sin), a2, sin, cos, b2, zeros, zeros], axis=1)


@register
class RandomZoom(_AffineLayer):
    """Zoom each image (training) by a random factor per axis: ``height_factor`` (a number ``f``: in
    [-f, f], or ``(lo, hi)``, each in (-1, 1]) scales the sampled input rows by ``1 + factor`` (positive:
    zoom out, negative: zoom in); ``width_factor`` (None: the height's zoom, aspect kept) the columns.
    Transformation: ``{"height_zoom": (batch, 1), "width_zoom": (batch, 1)}``."""

    def __init__(self, height_factor: Any, width_factor: Any = None, fill_mode: str = "reflect",
                 interpolation: str = "bilinear", seed: "int | None" = None, fill_value: float = 0.0,
                 data_format: "str | None" = None, **kwargs: Any) -> None:
        super().__init__(data_format=data_format, **kwargs)
        self.height_factor = height_factor
        self.height_lower, self.height_upper = _factor_pair(height_factor, "height_factor", self._owner, -1.0, 1.0,
                                                            low_open=True)
        self.width_factor = width_factor
        if width_factor is not None:
            self.width_lower, self.width_upper = _factor_pair(width_factor, "width_factor", self._owner, -1.0, 1.0,
                                                              low_open=True)
        self._affine_arguments(fill_mode, interpolation, fill_value)
        self._make_generator(seed)

    def get_random_transformation(self, data: Any, training: bool = True, seed: Any = None) -> Any:
        if not training:
            return None
        images = self._images(data)
        shape = (self._batch(images), 1)
        height_zoom = self._uniform(images, shape, 1.0 + self.height_lower, 1.0 + self.height_upper, seed=seed)
        width_zoom = height_zoom if self.width_factor is None else \
            self._uniform(images, shape, 1.0 + self.width_lower, 1.0 + self.width_upper, seed=seed)
        return {"height_zoom": height_zoom, "width_zoom": width_zoom}

    def _matrix(self, transformation: dict, images: Tensor) -> Tensor:
        height, width = self._hw(images)
        zx, zy = _column(transformation["width_zoom"]), _column(transformation["height_zoom"])
        x_offset = _ops.multiply(_ops.subtract(1.0, zx), (width - 1.0) / 2.0)
        y_offset = _ops.multiply(_ops.subtract(1.0, zy), (height - 1.0) / 2.0)
        zeros = _ops.zeros_like(zx)
        return _ops.concatenate([zx, zeros, x_offset, zeros, zy, y_offset, zeros, zeros], axis=1)

    def get_config(self) -> dict:
        return {**super().get_config(), "height_factor": self.height_factor, "width_factor": self.width_factor,
                **self._affine_config()}


@register
class RandomTranslation(_AffineLayer):
    """Shift each image (training) by a random fraction of its size: ``height_factor`` / ``width_factor``
    (a number ``f``: in [-f, f], or ``(lo, hi)``, each in [-1, 1]; positive moves the content down /
    right). Transformation: ``{"translations": pixels (batch, 2) as (dx, dy)}``."""

    def __init__(self, height_factor: Any, width_factor: Any, fill_mode: str = "reflect",
                 interpolation: str = "bilinear", seed: "int | None" = None, fill_value: float = 0.0,
                 data_format: "str | None" = None, **kwargs: Any) -> None:
        super().__init__(data_format=data_format, **kwargs)
        self.height_factor = height_factor
        self.height_lower, self.height_upper = _factor_pair(height_factor, "height_factor", self._owner, -1.0, 1.0)
        self.width_factor = width_factor
        self.width_lower, self.width_upper = _factor_pair(width_factor, "width_factor", self._owner, -1.0, 1.0)
        self._affine_arguments(fill_mode, interpolation, fill_value)
        self._make_generator(seed)

    def get_random_transformation(self, data: Any, training: bool = True, seed: Any = None) -> Any:
        if not training:
            return None
        images = self._images(data)
        height, width = self._hw(images)
        shape = (self._batch(images), 1)
        dy = _ops.multiply(self._uniform(images, shape, self.height_lower, self.height_upper, seed=seed), height)
        dx = _ops.multiply(self._uniform(images, shape, self.width_lower, self.width_upper, seed=seed), width)
        return {"translations": _ops.concatenate([dx, dy], axis=1)}

    def _matrix(self, transformation: dict, images: Tensor) -> Tensor:
        t = _ops.convert_to_tensor(transformation["translations"])
        ones, zeros = _ops.ones_like(t[:, 0:1]), _ops.zeros_like(t[:, 0:1])
        return _ops.concatenate([ones, zeros, _ops.negative(t[:, 0:1]), zeros, ones, _ops.negative(t[:, 1:2]),
                                 zeros, zeros], axis=1)

    def get_config(self) -> dict:
        return {**super().get_config(), "height_factor": self.height_factor, "width_factor": self.width_factor,
                **self._affine_config()}


def _size(value: Any, name: str, owner: str) -> int:
    return _validate.positive_int(value, name, owner)


class _Cropping(_ImagePreprocessing):
    """Layers with a target ``height`` and ``width``."""

    def _target(self, height: Any, width: Any) -> None:
        self.height = _size(height, "height", self._owner)
        self.width = _size(width, "width", self._owner)

    def compute_output_shape(self, input_shape: Sequence[Any]) -> tuple:
        shape = list(input_shape)
        if len(shape) not in (3, 4):
            raise ValueError(f"{self._owner} expects images of rank 3 or 4, got shape {tuple(input_shape)}")
        h, w = self._hw_axes(len(shape))
        shape[h], shape[w] = self.height, self.width
        return tuple(shape)

    def _window(self, images: Tensor, top: Any, left: Any, height: int, width: int) -> Tensor:
        """Rows ``top:top+height`` and columns ``left:left+width`` (ints, or int32 tensors: a gather)."""
        h_axis, w_axis = self._hw_axes(images.ndim)
        if isinstance(top, int) and isinstance(left, int):
            index = [slice(None)] * images.ndim
            index[h_axis], index[w_axis] = slice(top, top + height), slice(left, left + width)
            return images[tuple(index)]
        # index ramps made on the images' device (a kernel: a captured step may not upload)
        rows = _ops.add(top, Tensor(_kernels.numeric.iota(height, 0, 1, np.int32, device=images.device)))
        cols = _ops.add(left, Tensor(_kernels.numeric.iota(width, 0, 1, np.int32, device=images.device)))
        return _ops.take(_ops.take(images, rows, axis=h_axis), cols, axis=w_axis)

    def _smart_resize(self, images: Tensor) -> Tensor:
        """Keras's ``smart_resize``: the largest central crop of the target's aspect ratio, resized
        (bilinear) to ``(height, width)``."""
        height, width = self._hw(images)
        crop_h = max(min(height, int(float(width * self.height) / self.width)), 1)
        crop_w = max(min(width, int(float(height * self.width) / self.height)), 1)
        top, left = int(float(height - crop_h) / 2), int(float(width - crop_w) / 2)
        out = self._window(images, top, left, crop_h, crop_w)
        if (crop_h, crop_w) != (self.height, self.width):
            out = _ops.image.resize(out, (self.height, self.width), data_format=self.data_format)
        return out

    def get_config(self) -> dict:
        return {**super().get_config(), "height": self.height, "width": self.width}


@register
class RandomCrop(_Cropping):
    """Crop a random ``(height, width)`` window (training), one place for the whole batch (Keras). When
    not training, or when the images are not larger than the window on both axes: the largest central
    crop of the window's aspect ratio, resized to it (see the module docstring). ``seed=None`` draws one
    in [1, 1e9] at construction (kept in the config, as Keras, so a copy made from it draws the same).
    Transformation: ``(top, left)`` (ints or int32 tensors)."""

    def __init__(self, height: int, width: int, seed: "int | None" = None, data_format: "str | None" = None,
                 **kwargs: Any) -> None:
        super().__init__(data_format=data_format, **kwargs)
        self._target(height, width)
        # Keras draws the config's seed in [1, 1e9] (make_default_seed): one its SeedGenerator can take back
        self._make_generator(utils.draw_seed() % 10**9 + 1 if seed is None else seed)

    def get_random_transformation(self, data: Any, training: bool = True, seed: Any = None) -> Any:
        images = self._images(data)
        height, width = self._hw(images)
        if training and height > self.height and width > self.width:
            top = _ops.cast(self._uniform(images, (), 0.0, float(height - self.height + 1), seed=seed), "int32")
            left = _ops.cast(self._uniform(images, (), 0.0, float(width - self.width + 1), seed=seed), "int32")
            return top, left
        return None

    def transform_images(self, images: Any, transformation: Any, training: bool = True) -> Tensor:
        images = self._float(self._images(images))
        if transformation is None:
            return self._smart_resize(images)
        top, left = transformation
        return self._window(images, top, left, self.height, self.width)

    def get_config(self) -> dict:
        return {**super().get_config(), "seed": self.seed}


@register
class CenterCrop(_Cropping):
    """The central ``(height, width)`` window (an image smaller on an axis: Keras's ``smart_resize``,
    the largest central crop of the target's aspect ratio resized to it); not random, the same in
    training and inference; cast to the compute dtype."""

    def __init__(self, height: int, width: int, data_format: "str | None" = None, **kwargs: Any) -> None:
        super().__init__(data_format=data_format, **kwargs)
        self._target(height, width)

    def transform_images(self, images: Any, transformation: Any = None, training: bool = True) -> Tensor:
        images = self._float(self._images(images))
        height, width = self._hw(images)
        if height >= self.height and width >= self.width:
            return self._window(images, (height - self.height) // 2, (width - self.width) // 2, self.height,
                                self.width)
        return self._smart_resize(images)


@register
class Resizing(_Cropping):
    """Resize to ``(height, width)`` with :func:`dnnbind.ops.image.resize` (``interpolation``,
    ``crop_to_aspect_ratio``, ``pad_to_aspect_ratio`` with ``fill_value``, ``antialias``); the same in
    training and inference. Integer images stay integers (rounded, saturated), as Keras."""

    def __init__(self, height: int, width: int, interpolation: str = "bilinear", crop_to_aspect_ratio: bool = False,
                 pad_to_aspect_ratio: bool = False, fill_mode: str = "constant", fill_value: float = 0.0,
                 antialias: bool = False, data_format: "str | None" = None, **kwargs: Any) -> None:
        super().__init__(data_format=data_format, **kwargs)
        self._target(height, width)
        self.interpolation = _validate.one_of(interpolation, "interpolation", self._owner, _RESIZE_INTERPOLATIONS)
        self.crop_to_aspect_ratio = _validate.boolean(crop_to_aspect_ratio, "crop_to_aspect_ratio", self._owner)
        self.pad_to_aspect_ratio = _validate.boolean(pad_to_aspect_ratio, "pad_to_aspect_ratio", self._owner)
        if self.crop_to_aspect_ratio and self.pad_to_aspect_ratio:
            raise ValueError(f"{self._owner}: only one of crop_to_aspect_ratio and pad_to_aspect_ratio can be True")
        self.fill_mode = _validate.one_of(fill_mode, "fill_mode", self._owner, ("constant",))
        self.fill_value = _validate.number(fill_value, "fill_value", self._owner)
        self.antialias = _validate.boolean(antialias, "antialias", self._owner)

    def transform_images(self, images: Any, transformation: Any = None, training: bool = True) -> Tensor:
        images = self._images(images)
        return _ops.image.resize(images, (self.height, self.width), interpolation=self.interpolation,
                                 antialias=self.antialias, crop_to_aspect_ratio=self.crop_to_aspect_ratio,
                                 pad_to_aspect_ratio=self.pad_to_aspect_ratio, fill_mode=self.fill_mode,
                                 fill_value=self.fill_value, data_format=self.data_format)

    def get_config(self) -> dict:
        return {**super().get_config(), "interpolation": self.interpolation,
                "crop_to_aspect_ratio": self.crop_to_aspect_ratio, "pad_to_aspect_ratio": self.pad_to_aspect_ratio,
                "fill_mode": self.fill_mode, "fill_value": self.fill_value, "antialias": self.antialias}


class _ColourLayer(_ImagePreprocessing):
    """A random per-image change of the pixel values, clipped to ``value_range``."""

    def __init__(self, factor: Any, value_range: Any, seed: Any, bounds: tuple, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.factor = _factor_pair(factor, "factor", self._owner, *bounds, clip_low=True)
        self.value_range = _value_range(value_range, self._owner)
        self._make_generator(seed)

    def _factor_shape(self, images: Tensor) -> tuple:
        return (1, 1, 1) if images.ndim == 3 else (int(images.shape[0]), 1, 1, 1)

    def _clip(self, x: Tensor) -> Tensor:
        return _ops.clip(x, self.value_range[0], self.value_range[1])

    def get_config(self) -> dict:
        return {**super().get_config(), "factor": self.factor, "value_range": self.value_range, "seed": self.seed}


@register
class RandomContrast(_ColourLayer):
    """Scale each image's (and channel's) deviation from its mean over height and width (training) by a
    random factor in ``[1 - factor[0], 1 + factor[1]]``, then clip to ``value_range``. As Keras 3.15, a
    number ``f`` (in [0, 1]) gives ``factor = (0, f)``, so factors in ``[1, 1 + f]``. Not training: the
    images as they are. Transformation: ``{"contrast_factor": (batch, 1, 1, 1)}``."""

    def __init__(self, factor: Any, value_range: Any = (0, 255), seed: "int | None" = None, **kwargs: Any) -> None:
        super().__init__(factor, value_range, seed, (0.0, 1.0), **kwargs)

    def get_random_transformation(self, data: Any, training: bool = True, seed: Any = None) -> Any:
        if not training:
            return None
        images = self._images(data)
        return {"contrast_factor": self._uniform(images, self._factor_shape(images), 1.0 - self.factor[0],
                                                 1.0 + self.factor[1], dtype=self._effective_compute_dtype(),
                                                 seed=seed)}

    def transform_images(self, images: Any, transformation: Any, training: bool = True) -> Tensor:
        images = self._images(images)
        if not training or transformation is None:
            return images
        x = self._float(images)
        h_axis, w_axis = self._hw_axes(x.ndim)
        mean = _ops.mean(x, axis=(h_axis, w_axis), keepdims=True)
        factor = _ops.cast(transformation["contrast_factor"], x.dtype)
        return self._clip(_ops.add(_ops.multiply(_ops.subtract(x, mean), factor), mean))


@register
class RandomBrightness(_ColourLayer):
    """Add to each image (training) a random ``delta * (value_range[1] - value_range[0])``, ``delta`` in
    ``factor`` (a number ``f`` in [-1, 1]: ``[-|f|, |f|]``), then clip to ``value_range`` (integer images:
    saturated back to their dtype). Not training: the images as they are. Transformation:
    ``{"rgb_delta": (batch, 1, 1, 1)}`` (already scaled by the range)."""

    def __init__(self, factor: Any, value_range: Any = (0, 255), seed: "int | None" = None, **kwargs: Any) -> None:
        super().__init__(factor, value_range, seed, (-1.0, 1.0), **kwargs)

    def get_random_transformation(self, data: Any, training: bool = True, seed: Any = None) -> Any:
        if not training:
            return None
        images = self._images(data)
        delta = self._uniform(images, self._factor_shape(images), self.factor[0], self.factor[1], seed=seed)
        return {"rgb_delta": _ops.multiply(delta, self.value_range[1] - self.value_range[0])}

    def transform_images(self, images: Any, transformation: Any, training: bool = True) -> Tensor:
        images = self._images(images)
        if not training or transformation is None:
            return images
        x = self._float(images)
        out = self._clip(_ops.add(x, _ops.cast(transformation["rgb_delta"], x.dtype)))
        if images.dtype.kind in "iu":
            info = np.iinfo(images.dtype)
            out = _ops.cast(_ops.clip(_ops.round(out), float(info.min), float(info.max)), images.dtype)
        return out
