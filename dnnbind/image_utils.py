"""``keras.utils`` / ``keras.preprocessing.image`` image helpers: ``img_to_array``, ``array_to_img``, ``load_img``,
``save_img``, ``smart_resize``.

Reading and writing image files needs Pillow, which dnnbind does not depend on: install it with
``pip install 'dnnbind[images]'`` (or ``pip install pillow``); without it those functions raise ``ImportError``
saying so. ``img_to_array`` of an array-like and ``smart_resize`` (through ``keras.ops.image.resize``) need no
Pillow. Layouts as Keras: ``(height, width, channels)`` for ``channels_last``, ``(channels, height, width)`` for
``channels_first``.
"""

from __future__ import annotations

import io
import os
from typing import Any

import numpy as np

__all__ = ["img_to_array", "array_to_img", "load_img", "save_img", "smart_resize"]

_PIL_MISSING = ("{what} needs Pillow, which dnnbind does not install by default: pip install 'dnnbind[images]' "
                "(or pip install pillow)")


def _pil(what: str):
    try:
        from PIL import Image  # (deferred: Pillow is an optional dependency)
    except ImportError as exc:
        raise ImportError(_PIL_MISSING.format(what=what)) from exc
    return Image


def _data_format(data_format: "str | None", owner: str) -> str:
    if data_format is None:
        from .backend import image_data_format  # (deferred: only this default needs it)
        data_format = image_data_format()
    if data_format not in ("channels_first", "channels_last"):
        raise ValueError(f"{owner}: data_format must be 'channels_first' or 'channels_last', got {data_format!r}")
    return data_format


def img_to_array(img: Any, data_format: "str | None" = None, dtype: Any = None) -> np.ndarray:
    """A 3-D float array of a PIL image (or anything array-like of shape ``(h, w)`` or ``(h, w, c)``), in
    ``data_format``'s layout (a 2-D image gets one channel)."""
    data_format = _data_format(data_format, "img_to_array")
    x = np.asarray(img, dtype=dtype or "float32")
    if x.ndim == 3:
        if data_format == "channels_first":
            x = x.transpose(2, 0, 1)
    elif x.ndim == 2:
        x = x.reshape((1, *x.shape)) if data_format == "channels_first" else x.reshape((*x.shape, 1))
    else:
        raise ValueError(f"Unsupported image shape: {x.shape}")
    return x


def array_to_img(x: Any, data_format: "str | None" = None, scale: bool = True, dtype: Any = None):
    """A PIL image of a 3-D array (1, 3 or 4 channels); ``scale`` maps the values' range onto 0..255."""
    Image = _pil("array_to_img")
    data_format = _data_format(data_format, "array_to_img")
    x = np.asarray(x, dtype=dtype or "float32")
    if x.ndim != 3:
        raise ValueError(f"Expected image array to have rank 3 (single image). Got array with shape: {x.shape}")
    if data_format == "channels_first":
        x = x.transpose(1, 2, 0)
    if scale:
        x = x - np.min(x)
        x_max = np.max(x)
        if x_max != 0:
            x /= x_max
        x *= 255
    channels = x.shape[2]
    if channels == 4:
        return Image.fromarray(x.astype("uint8"), "RGBA")
    if channels == 3:
        return Image.fromarray(x.astype("uint8"), "RGB")
    if channels == 1:
        if np.max(x) > 255:
            return Image.fromarray(x[:, :, 0].astype("int32"), "I")
        return Image.fromarray(x[:, :, 0].astype("uint8"), "L")
    raise ValueError(f"Unsupported channel number: {channels}")


def save_img(path: Any, x: Any, data_format: "str | None" = None, file_format: "str | None" = None,
             scale: bool = True, **kwargs: Any) -> None:
    """Write an image array to ``path`` (Pillow)."""
    img = array_to_img(x, data_format=data_format, scale=scale)
    if img.mode == "RGBA" and (file_format == "jpg" or file_format == "jpeg"):
        img = img.convert("RGB")
    img.save(path, format=file_format, **kwargs)


def load_img(path: Any, color_mode: str = "rgb", target_size: "tuple[int, int] | None" = None,
             interpolation: str = "nearest", keep_aspect_ratio: bool = False):
    """A PIL image read from ``path`` (a file path or a binary stream), converted to ``color_mode``
    (``"grayscale"``, ``"rgb"``, ``"rgba"``) and resized to ``target_size`` ``(height, width)``."""
    Image = _pil("load_img")
    if color_mode not in ("grayscale", "rgb", "rgba"):
        raise ValueError('color_mode must be "grayscale", "rgb", or "rgba"')
    if isinstance(path, io.BytesIO):
        img = Image.open(path)
    elif isinstance(path, (str, os.PathLike)):
        with open(path, "rb") as f:
            img = Image.open(io.BytesIO(f.read()))
    else:
        raise TypeError(f"path should be path-like or io.BytesIO, not {type(path)}")
    mode = {"grayscale": ("L", "I;16", "I"), "rgb": ("RGB",), "rgba": ("RGBA",)}[color_mode]
    if img.mode not in mode:
        img = img.convert(mode[0])
    if target_size is not None:
        width_height = (target_size[1], target_size[0])
        if img.size != width_height:
            methods = {"nearest": Image.NEAREST, "bilinear": Image.BILINEAR, "bicubic": Image.BICUBIC,
                       "lanczos": Image.LANCZOS, "box": Image.BOX, "hamming": Image.HAMMING}
            if interpolation not in methods:
                raise ValueError(f"Invalid interpolation method {interpolation} specified. Supported methods are "
                                 f"{', '.join(methods)}")
            if keep_aspect_ratio:
                width, height = img.size
                target_width, target_height = width_height
                crop_height = (width * target_height) // target_width
                crop_width = (height * target_width) // target_height
                crop_height, crop_width = min(height, crop_height), min(width, crop_width)
                left, top = (width - crop_width) // 2, (height - crop_height) // 2
                img = img.crop((left, top, left + crop_width, top + crop_height))
            img = img.resize(width_height, methods[interpolation])
    return img


def smart_resize(x: Any, size: "tuple[int, int]", interpolation: str = "bilinear", data_format: str = "channels_last",
                 backend_module: Any = None):
    """Resize an image (or a batch) to ``size`` ``(height, width)`` without distorting its aspect ratio: the
    largest centred crop of the target ratio, then a resize (``keras.ops.image.resize`` with ``crop_to_aspect_ratio``)."""
    from . import ops  # (deferred: only this function needs the ops)
    if len(size) != 2:
        raise ValueError(f"Expected `size` to be a tuple of 2 integers, but got: {size}.")
    return ops.image.resize(x, size, interpolation=interpolation, crop_to_aspect_ratio=True, data_format=data_format)
