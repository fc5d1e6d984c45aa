"""``keras.ops.image``: colour conversions, resizing and resampling, geometric transforms, patches,
padding and cropping, Gaussian blur, Sobel edges and SSIM, with the numerics of Keras's JAX backend.

Everything is composed of ops (gathers, matmuls, elementwise ops, reductions), so it runs on both
backends and differentiates as JAX does (w.r.t. the images, and w.r.t. coordinates, transforms,
points, scales and translations where JAX's formulas are differentiable in them):

* **sampling** (``map_coordinates`` and the transforms built on it): JAX's ``map_coordinates`` (order 0:
  round half away from zero; order 1: linear), one ``take`` per corner of the flattened image with the
  weights and the fill mode's index fix (``constant``, ``nearest``, ``wrap``, ``mirror``, ``reflect``);
* **separable filters and resampling** (``resize``, ``scale_and_translate``, ``gaussian_blur``,
  ``sobel_edges``, ``ssim``): one matmul per axis with a ``(input, output)`` weight matrix (JAX's
  ``compute_weight_mat`` for the resampling kernels; a banded matrix of the 1-d taps for filters);
* **patches**: one ``take`` of precomputed (host) flat indices, so overlapping patches add up in the VJP.

Host constants (index tables, grids) are made on the host from shapes and Python arguments and
placed next to the images; no op reads a device tensor on the host, except ``elastic_transform``'s
``sigma`` (its kernel size ``int(6 * sigma) | 1`` is a shape).
"""

from __future__ import annotations

import itertools
import math
from typing import Any, Callable, Sequence

import numpy as np

from .. import backend, utils
from .._validate import BFLOAT16
from ..autodiff.tensor import Tensor
from ..kernels import numeric as N
from . import _core
from ._core import is_float, keras_op, np_dtype, result_type, tensors
from ._elementwise import (abs as _abs, add, cast, clip, divide, equal, exp, floor, floor_divide, greater,
                           greater_equal, less, less_equal, logical_and, maximum, minimum, mod, multiply, negative,
                           sign, sin, square, subtract, where)
from ._indexing import slice as _slice, take, take_along_axis
from ._matmul import matmul
from ._reductions import argmax, mean, sum as _sum
from ._shape import broadcast_to, concatenate, expand_dims, moveaxis, pad, reshape, split, squeeze, stack, swapaxes

__all__ = ["affine_transform", "crop_images", "elastic_transform", "extract_patches", "extract_patches_3d",
           "gaussian_blur", "hsv_to_rgb", "map_coordinates", "pad_images", "perspective_transform", "resize",
           "rgb_to_grayscale", "rgb_to_hsv", "scale_and_translate", "sobel_edges", "ssim"]

_INTERPOLATION_ORDER = {"nearest": 0, "bilinear": 1}
_FILL_MODES = ("constant", "nearest", "wrap", "mirror", "reflect")
_RESIZE_INTERPOLATIONS = ("bilinear", "nearest", "lanczos3", "lanczos5", "bicubic", "area")
_SCALE_AND_TRANSLATE_METHODS = ("linear", "bilinear", "trilinear", "cubic", "bicubic", "tricubic", "lanczos3",
                                "lanczos5")


# ---------------------------------------------------------------------------------------- helpers
def _data_format(data_format: "str | None", op: str) -> str:
    df = backend.image_data_format() if data_format is None else str(data_format).lower()
    if df not in ("channels_last", "channels_first"):
        raise ValueError(f"{op}: data_format must be 'channels_last' or 'channels_first', got {data_format!r}")
    return df


def _check_rank(op: str, name: str, t: Tensor, ranks: tuple = (3, 4)) -> None:
    if t.ndim not in ranks:
        what = " or ".join(str(r) for r in ranks)
        raise ValueError(f"{op}: {name} must have rank {what} (a single image or a batch of images), got shape "
                         f"{t.shape}")


def _choice(op: str, name: str, value: Any, allowed: Sequence) -> None:
    if value not in allowed:
        raise ValueError(f"{op}: {name} must be one of {tuple(allowed)}, got {name}={value!r}")


def _nhwc(t: Tensor, df: str, image_rank: int = 3) -> "tuple[Tensor, bool]":
    """Images as ``(N, *spatial, C)`` (a batch axis added to a single image), and whether one was added."""
    single = t.ndim == image_rank
    x = expand_dims(t, 0) if single else t
    if df == "channels_first":
        x = moveaxis(x, 1, -1)
    return x, single


def _restore(x: Tensor, df: str, single: bool) -> Tensor:
    if df == "channels_first":
        x = moveaxis(x, -1, 1)
    return squeeze(x, 0) if single else x


def _compute_dtype(dt: np.dtype) -> np.dtype:
    """Floats compute in themselves, ints and bool in ``result_type(dtype, float32)`` (Keras's rule)."""
    return dt if is_float(dt) else np_dtype(result_type(dt, "float32"))


# Device copies of the host constants below (index grids, filter taps), uploaded on first use and kept:
# a training step captured as a CUDA graph may not upload (its first, eager, run fills this), and a
# captured step reads them at replay, so they are never dropped. Bounded: past the limit a constant is
# uploaded per call (and a capture of that step is refused with the upload's error).
_DEVICE_CONSTS: dict = {}
_DEVICE_CONST_BYTES = [0]
_DEVICE_CONST_LIMIT = 256 << 20


def _const(host: Any, like: Tensor, dtype: Any = None) -> Tensor:
    """A host constant (a NumPy array of ``dtype``, default ``like``'s) placed on ``like``'s device (a kept
    copy there: see ``_DEVICE_CONSTS``)."""
    arr = np.ascontiguousarray(np.asarray(host).astype(like.dtype if dtype is None else np_dtype(dtype)))
    raw = like.data
    if not backend.is_device_array(raw):
        return _core.tensor(arr, raw)
    key = (str(backend.device_of(raw)), arr.dtype.str, arr.shape, arr.tobytes())
    hit = _DEVICE_CONSTS.get(key)
    if hit is not None:
        return Tensor(hit)
    t = _core.tensor(arr, raw)
    if _DEVICE_CONST_BYTES[0] + arr.nbytes <= _DEVICE_CONST_LIMIT:
        _DEVICE_CONSTS[key] = t.data
        _DEVICE_CONST_BYTES[0] += arr.nbytes
    return t


def _back_to(y: Tensor, dt: np.dtype) -> Tensor:
    """A float result as ``dt`` (ints: truncated toward zero, as ``astype``)."""
    return y if y.dtype == dt else cast(y, dt)


def _round_half_away(x: Tensor) -> Tensor:
    """Round half away from zero (XLA's ``round``), exactly: ``floor(|x|)`` plus one where the fraction is >= 0.5."""
    a = _abs(x)
    r = floor(a)
    return multiply(sign(x), add(r, cast(greater_equal(subtract(a, r), 0.5), x.dtype)))


def _contract(x: Tensor, axis: int, weights: Tensor) -> Tensor:
    """``x`` with its ``axis`` (length ``L``) replaced by ``weights``' columns (``(L, L_out)``): one matmul."""
    axis %= x.ndim
    shape = tuple(x.shape)
    pre, post = math.prod(shape[:axis]), math.prod(shape[axis + 1:])
    y = matmul(swapaxes(weights, 0, 1), reshape(x, (pre, shape[axis], post)))
    return reshape(y, shape[:axis] + (weights.shape[1],) + shape[axis + 1:])


def _filter_matrix(taps: Tensor, length_in: int, length_out: int, offset: int) -> Tensor:
    """The ``(length_in, length_out)`` matrix of a 1-d correlation with ``taps`` (``K``): column ``o`` holds
    ``taps[t]`` at row ``o + t - offset``, zero outside (zero padding). ``offset`` ``(K - 1) // 2`` with
    ``length_out = length_in`` is SAME padding; ``0`` with ``length_in - K + 1`` is VALID. Differentiable in
    the taps (a gather of them)."""
    k = int(taps.shape[0])
    rel = np.arange(length_in)[:, None] - np.arange(length_out)[None, :] + offset
    inside = (rel >= 0) & (rel < k)
    idx = _const(np.where(inside, rel, 0), taps, np.int32)
    return multiply(take(taps, idx), _const(inside, taps))


def _same_filter(x: Tensor, axis: int, taps: Tensor) -> Tensor:
    """A SAME (zero-padded) correlation of ``x`` with ``taps`` along ``axis`` (JAX's padding: ``(K-1)//2`` before)."""
    n = int(x.shape[axis])
    return _contract(x, axis, _filter_matrix(taps, n, n, (int(taps.shape[0]) - 1) // 2))


def _gaussian_taps(size: int, sigma: Any, like: Tensor) -> Tensor:
    """``exp(-0.5 ((i - (size-1)/2) / sigma)^2)``, normalised (a number or a tensor ``sigma``)."""
    x = _const(np.arange(size) - (size - 1) / 2.0, like)
    k = exp(multiply(square(divide(x, sigma)), -0.5))
    return divide(k, _sum(k))


# --------------------------------------------------------------------------------------- sampling
def _indices_and_weights(coordinate: Tensor, order: int) -> list:
    """JAX's interpolation nodes of one axis: ``[(int32 index, weight or None for 1)]``."""
    if order == 0:
        return [(cast(_round_half_away(coordinate), "int32"), None)]
    lower = floor(coordinate)
    upper_weight = subtract(coordinate, lower)
    index = cast(lower, "int32")
    return [(index, subtract(1.0, upper_weight)), (add(index, 1), upper_weight)]


def _mirror(index: Tensor, size: int) -> Tensor:
    s = size - 1  # half the period of the triangle wave
    if s == 0:
        return multiply(index, 0)
    return _abs(subtract(mod(add(index, s), 2 * s), s))


def _fix_index(index: Tensor, size: int, mode: str) -> Tensor:
    """JAX's ``_INDEX_FIXERS`` (constant's out-of-range indices are clamped for the gather; their value
    is replaced by the fill value)."""
    if mode in ("constant", "nearest"):
        return clip(index, 0, size - 1)
    if mode == "wrap":
        return mod(index, size)
    if mode == "mirror":
        return _mirror(index, size)
    return floor_divide(subtract(_mirror(add(multiply(index, 2), 1), 2 * size + 1), 1), 2)  # reflect


def _sample(x: Tensor, coords: Sequence[Tensor], order: int, mode: str, cval: Any) -> Tensor:
    """JAX's ``map_coordinates`` over the spatial axes of ``x`` (``(N, *S, C)``) at ``coords`` (one float
    tensor ``(N, *O)`` per spatial axis): ``(N, *O, C)`` in ``x``'s dtype."""
    nb, spatial, channels = int(x.shape[0]), tuple(int(s) for s in x.shape[1:-1]), int(x.shape[-1])
    dt = _compute_dtype(x.dtype)
    src = x if x.dtype == dt else cast(x, dt)
    flat = reshape(src, (nb * math.prod(spatial), channels))
    out_shape = tuple(coords[0].shape)
    base = _const(np.arange(nb).reshape((nb,) + (1,) * (len(out_shape) - 1)) * math.prod(spatial), flat, np.int32)
    strides = [math.prod(spatial[i + 1:]) for i in range(len(spatial))]
    fill = float(np.asarray(cval).astype(x.dtype)) if not isinstance(cval, Tensor) else cast(cval, dt)
    axes = []
    for coordinate, size in zip(coords, spatial):
        nodes = []
        for index, weight in _indices_and_weights(coordinate, order):
            valid = logical_and(greater_equal(index, 0), less(index, size)) if mode == "constant" else None
            nodes.append((_fix_index(index, size, mode), valid, weight))
        axes.append(nodes)
    total = None
    for combo in itertools.product(*axes):
        flat_index = base
        for (index, _, _), stride in zip(combo, strides):
            flat_index = add(flat_index, multiply(index, stride) if stride != 1 else index)
        value = take(flat, flat_index, axis=0)
        valids = [v for _, v, _ in combo if v is not None]
        if valids:
            ok = valids[0]
            for v in valids[1:]:
                ok = logical_and(ok, v)
            value = where(expand_dims(ok, -1), value, fill)
        weights = [w for _, _, w in combo if w is not None]
        if weights:
            w = weights[0]
            for other in weights[1:]:
                w = multiply(w, other)
            value = multiply(expand_dims(w, -1), value)
        total = value if total is None else add(total, value)
    if not is_float(x.dtype):
        total = _round_half_away(total)
    return _back_to(total, x.dtype)


def _grid(height: int, width: int, like: Tensor) -> "tuple[Tensor, Tensor]":
    """Row and column indices ``(H, 1)`` and ``(1, W)`` as floats of ``like``'s dtype."""
    return (_const(np.arange(height).reshape(height, 1), like), _const(np.arange(width).reshape(1, width), like))


@keras_op(family="image")
def map_coordinates(inputs: Any, coordinates: Any, order: int, fill_mode: str = "constant",
                    fill_value: Any = 0) -> Tensor:
    """``keras.ops.image.map_coordinates``: ``inputs`` interpolated at ``coordinates`` (``(inputs.ndim,
    *out_shape)``; order 0 nearest, 1 linear), points outside handled by ``fill_mode`` (``constant`` with
    ``fill_value``, ``nearest``, ``wrap``, ``mirror``, ``reflect``). Differentiable in both."""
    x, c = tensors(inputs, coordinates)
    if c.ndim < 2:
        raise ValueError(f"map_coordinates: coordinates must have rank >= 2, got shape {c.shape}")
    if c.shape[0] != x.ndim:
        raise ValueError(f"map_coordinates: the first axis of coordinates must be the rank of inputs ({x.ndim}), "
                         f"got coordinates of shape {c.shape} for inputs of shape {x.shape}")
    _choice("map_coordinates", "fill_mode", fill_mode, _FILL_MODES)
    _choice("map_coordinates", "order", order, (0, 1))
    if not is_float(c.dtype):
        c = cast(c, _core.floatx())
    coords = [expand_dims(c[i], 0) for i in range(x.ndim)]
    out = _sample(reshape(x, (1,) + tuple(x.shape) + (1,)), coords, int(order), fill_mode, fill_value)
    return reshape(out, tuple(c.shape[1:]))


# ------------------------------------------------------------------------------------ transforms
def _coordinate_dtype(images: Tensor, *others: Tensor) -> np.dtype:
    """The float dtype sample coordinates are computed in (Keras's promotion of the operands with float)."""
    dt = np_dtype(result_type(images, *others, float))
    return dt if is_float(dt) else _core.floatx()


@keras_op(family="image")
def affine_transform(images: Any, transform: Any, interpolation: str = "bilinear", fill_mode: str = "constant",
                     fill_value: Any = 0, data_format: "str | None" = None) -> Tensor:
    """``keras.ops.image.affine_transform``: output pixel ``(x, y)`` samples the input at
    ``((a0 x + a1 y + a2) / k, (b0 x + b1 y + b2) / k)``, ``k = c0 x + c1 y + 1``, for each row
    ``[a0, a1, a2, b0, b1, b2, c0, c1]`` of ``transform`` (``(8,)`` or ``(N, 8)``; one row serves every
    image). With ``c0 = c1 = 0`` this is Keras's JAX result; the projective ``k`` is TensorFlow's, as Keras
    documents it (its JAX backend does not divide by ``k``). Differentiable in the images and the transform."""
    op = "affine_transform"
    df = _data_format(data_format, op)
    _choice(op, "interpolation", interpolation, tuple(_INTERPOLATION_ORDER))
    _choice(op, "fill_mode", fill_mode, _FILL_MODES)
    img, tr = tensors(images, transform)
    _check_rank(op, "images", img)
    if tr.ndim not in (1, 2) or tr.shape[-1] != 8:
        raise ValueError(f"{op}: transform must have shape (8,) or (N, 8), got {tr.shape}")
    x, single = _nhwc(img, df)
    nb, h, w = int(x.shape[0]), int(x.shape[1]), int(x.shape[2])
    if tr.ndim == 2 and tr.shape[0] not in (1, nb):
        raise ValueError(f"{op}: transform has {tr.shape[0]} rows for {nb} images (give one row, or one per image)")
    cdt = _coordinate_dtype(img, tr)
    tr = reshape(cast(tr, cdt) if tr.dtype != cdt else tr, (-1, 8, 1, 1))
    rows, cols = _grid(h, w, tr)
    a0, a1, a2, b0, b1, b2, c0, c1 = (tr[:, i] for i in range(8))
    k = add(add(multiply(c0, cols), multiply(c1, rows)), 1.0)
    x_in = divide(add(add(multiply(a0, cols), multiply(a1, rows)), a2), k)
    y_in = divide(add(add(multiply(b0, cols), multiply(b1, rows)), b2), k)
    shape = (nb, h, w)
    out = _sample(x, [broadcast_to(y_in, shape), broadcast_to(x_in, shape)], _INTERPOLATION_ORDER[interpolation],
                  fill_mode, fill_value)
    return _restore(out, df, single)


def _gauss_jordan_solve(a: Tensor, b: Tensor) -> Tensor:
    """``inv(a) @ b`` for small batched systems (``(B, n, n)``, ``(B, n, k)``) by Gauss-Jordan elimination
    with partial pivoting, in ops: it runs on every backend and is differentiable (``n`` steps)."""
    n = int(a.shape[-1])
    m = concatenate([a, b], axis=-1)
    rows = _const(np.arange(n).reshape(1, n), m, np.int32)
    for j in range(n):
        below = _abs(m[:, j:, j])
        p = add(cast(argmax(below, axis=-1), "int32"), j)  # (B,)
        pe = expand_dims(p, -1)
        order = where(equal(rows, j), pe, where(equal(rows, pe), j, rows))
        m = take_along_axis(m, expand_dims(order, -1), axis=1)
        pivot_row = divide(m[:, j:j + 1, :], m[:, j:j + 1, j:j + 1])  # (B, 1, n + k)
        eliminated = subtract(m, multiply(m[:, :, j:j + 1], pivot_row))
        m = where(reshape(equal(rows, j), (1, n, 1)), pivot_row, eliminated)
    return m[:, :, n:]


def _homography(start: Tensor, end: Tensor) -> Tensor:
    """The 8 coefficients mapping ``end`` points to ``start`` points (Keras's ``compute_homography_matrix``)."""
    sx, sy, ex, ey = start[..., 0], start[..., 1], end[..., 0], end[..., 1]
    zeros, ones = multiply(ex, 0.0), add(multiply(ex, 0.0), 1.0)
    x_rows = stack([ex, ey, ones, zeros, zeros, zeros, negative(multiply(sx, ex)), negative(multiply(sx, ey))], -1)
    y_rows = stack([zeros, zeros, zeros, ex, ey, ones, negative(multiply(sy, ex)), negative(multiply(sy, ey))], -1)
    coefficients = concatenate([x_rows, y_rows], axis=1)  # (B, 8, 8)
    target = expand_dims(concatenate([sx, sy], axis=-1), -1)
    return squeeze(_gauss_jordan_solve(coefficients, target), -1)


@keras_op(family="image")
def perspective_transform(images: Any, start_points: Any, end_points: Any, interpolation: str = "bilinear",
                          fill_value: Any = 0, data_format: "str | None" = None) -> Tensor:
    """``keras.ops.image.perspective_transform``: the homography mapping ``end_points`` to ``start_points``
    (``(4, 2)`` or ``(N, 4, 2)``, ``(x, y)``) solved per image, then sampled (constant fill). The 8x8
    systems are solved by elimination in ops (every backend); differentiable in images and points."""
    op = "perspective_transform"
    df = _data_format(data_format, op)
    _choice(op, "interpolation", interpolation, tuple(_INTERPOLATION_ORDER))
    img, sp, ep = tensors(images, start_points, end_points)
    _check_rank(op, "images", img)
    for name, p in (("start_points", sp), ("end_points", ep)):
        if p.ndim not in (2, 3) or tuple(p.shape[-2:]) != (4, 2):
            raise ValueError(f"{op}: {name} must have shape (4, 2) or (N, 4, 2), got {p.shape}")
    if tuple(sp.shape) != tuple(ep.shape):
        raise ValueError(f"{op}: start_points and end_points must have the same shape, got {sp.shape} and "
                         f"{ep.shape}")
    x, single = _nhwc(img, df)
    nb, h, w = int(x.shape[0]), int(x.shape[1]), int(x.shape[2])
    cdt = _coordinate_dtype(img, sp, ep)
    sp, ep = (reshape(cast(p, cdt) if p.dtype != cdt else p, (-1, 4, 2)) for p in (sp, ep))
    if sp.shape[0] not in (1, nb):
        raise ValueError(f"{op}: {sp.shape[0]} sets of points for {nb} images (give one, or one per image)")
    t = reshape(_homography(sp, ep), (-1, 8, 1, 1))
    rows, cols = _grid(h, w, t)
    denom = add(add(multiply(t[:, 6], cols), multiply(t[:, 7], rows)), 1.0)
    x_in = divide(add(add(multiply(t[:, 0], cols), multiply(t[:, 1], rows)), t[:, 2]), denom)
    y_in = divide(add(add(multiply(t[:, 3], cols), multiply(t[:, 4], rows)), t[:, 5]), denom)
    shape = (nb, h, w)
    out = _sample(x, [broadcast_to(y_in, shape), broadcast_to(x_in, shape)], _INTERPOLATION_ORDER[interpolation],
                  "constant", fill_value)
    return _restore(out, df, single)


def _draw_seed(op: str, seed: Any) -> int:
    if seed is None:
        return utils.draw_seed()
    if isinstance(seed, (int, np.integer)) and not isinstance(seed, bool):
        return int(seed)
    raise TypeError(f"{op}: seed must be an int or None, got {type(seed).__name__}")


def _host_number(op: str, name: str, value: Any) -> float:
    """A scalar the op needs on the host (it decides a shape); a tensor is read there (documented)."""
    try:
        return float(value)
    except (TypeError, ValueError):
        raise TypeError(f"{op}: {name} must be a number (it decides the kernel size), got {value!r}") from None


@keras_op(family="image")
def elastic_transform(images: Any, alpha: Any = 20.0, sigma: Any = 5.0, interpolation: str = "bilinear",
                      fill_mode: str = "reflect", fill_value: Any = 0.0, seed: Any = None,
                      data_format: "str | None" = None) -> Tensor:
    """``keras.ops.image.elastic_transform``: each image sampled at its grid displaced by ``alpha`` times
    a Gaussian-blurred (``sigma``, kernel ``int(6 sigma) | 1``) normal field scaled by ``sigma``, one field
    per axis (Philox draws from ``seed``: reproducible; None: dnnbind's seed generator). Keras's JAX
    backend draws both fields from one key (so they are equal); dnnbind draws two. ``sigma`` is read on
    the host when it is a tensor (it decides the kernel size). Differentiable in the images."""
    op = "elastic_transform"
    df = _data_format(data_format, op)
    _choice(op, "interpolation", interpolation, tuple(_INTERPOLATION_ORDER))
    _choice(op, "fill_mode", fill_mode, _FILL_MODES)
    (img,) = tensors(images)
    _check_rank(op, "images", img)
    sig = _host_number(op, "sigma", sigma)
    x, single = _nhwc(img, df)
    nb, h, w = int(x.shape[0]), int(x.shape[1]), int(x.shape[2])
    cdt = _compute_dtype(img.dtype)
    dy, dx = _displacements(nb, h, w, sig, _draw_seed(op, seed), cdt, x)
    rows, cols = _grid(h, w, dy)
    out = _sample(x, [add(rows, multiply(dy, alpha)), add(cols, multiply(dx, alpha))],
                  _INTERPOLATION_ORDER[interpolation], fill_mode, fill_value)
    return _restore(out, df, single)


def _displacements(nb: int, h: int, w: int, sigma: float, seed: int, dtype: np.dtype,
                   like: Tensor) -> "tuple[Tensor, Tensor]":
    """The two smoothed random fields ``(N, H, W)`` of ``elastic_transform`` (``sigma * normal``, blurred)."""
    size = int(6 * sigma) | 1
    n = nb * h * w
    fields = []
    for counter in (0, n):  # two disjoint stretches of one Philox stream
        raw = N.random("normal", (nb, h, w), seed, counter, np.float32, device=like.device)
        d = multiply(_back_to(Tensor(raw), dtype), sigma)
        taps = _gaussian_taps(size, sigma, d)
        fields.append(_same_filter(_same_filter(d, 1, taps), 2, taps))
    return fields[0], fields[1]


# ------------------------------------------------------------------------------- filters, edges, SSIM
@keras_op(family="image")
def gaussian_blur(images: Any, kernel_size: Any = (3, 3), sigma: Any = (1.0, 1.0),
                  data_format: "str | None" = None) -> Tensor:
    """``keras.ops.image.gaussian_blur``: a depthwise Gaussian filter with zero (SAME) padding, separable.
    As Keras's backends build the kernel, ``kernel_size[0]``/``sigma[0]`` act along the width and
    ``kernel_size[1]``/``sigma[1]`` along the height. ``data_format=None`` is the configured format
    (Keras's JAX backend treats None as channels_first; pass it explicitly there). ints compute in
    float32 and are truncated back. Differentiable in the images and ``sigma``."""
    op = "gaussian_blur"
    df = _data_format(data_format, op)
    (img,) = tensors(images)
    _check_rank(op, "images", img)
    sizes = tuple(int(k) for k in (kernel_size if isinstance(kernel_size, (tuple, list)) else (kernel_size,) * 2))
    if len(sizes) != 2 or any(k < 1 for k in sizes):
        raise ValueError(f"{op}: kernel_size must be two positive ints, got {kernel_size!r}")
    x, single = _nhwc(img, df)
    cdt = _compute_dtype(img.dtype)
    x = _back_to(x, cdt)
    sig = sigma if isinstance(sigma, (tuple, list)) else (sigma, sigma)
    if len(sig) != 2:
        raise ValueError(f"{op}: sigma must be two numbers, got {sigma!r}")
    sig = [s if isinstance(s, (int, float)) else cast(tensors(s)[0], cdt) for s in sig]
    x = _same_filter(x, 2, _gaussian_taps(sizes[0], sig[0], x))
    x = _same_filter(x, 1, _gaussian_taps(sizes[1], sig[1], x))
    return _restore(_back_to(x, img.dtype), df, single)


@keras_op(family="image")
def sobel_edges(images: Any, data_format: "str | None" = None) -> Tensor:
    """``keras.ops.image.sobel_edges``: 3x3 Sobel responses with zero (SAME) padding, ``[dy, dx]`` on a new
    last axis: ``(N, H, W, C, 2)`` (channels_last) or ``(N, C, H, W, 2)``. Separable; ints compute in
    float32 and are cast back."""
    op = "sobel_edges"
    df = _data_format(data_format, op)
    (img,) = tensors(images)
    _check_rank(op, "images", img, (4,))
    h_axis, w_axis = (1, 2) if df == "channels_last" else (2, 3)
    x = _back_to(img, _compute_dtype(img.dtype))
    smooth, diff = _const([1.0, 2.0, 1.0], x), _const([-1.0, 0.0, 1.0], x)
    dy = _same_filter(_same_filter(x, h_axis, diff), w_axis, smooth)
    dx = _same_filter(_same_filter(x, h_axis, smooth), w_axis, diff)
    return _back_to(stack([dy, dx], axis=-1), img.dtype)


@keras_op(family="image")
def ssim(image1: Any, image2: Any, max_val: float = 1.0, filter_size: int = 11, filter_sigma: float = 1.5,
         k1: float = 0.01, k2: float = 0.03, data_format: "str | None" = None) -> Tensor:
    """``keras.ops.image.ssim``: the mean structural similarity per image (Wang et al. 2004) with a
    Gaussian window (``filter_size``, ``filter_sigma``) and VALID filtering, averaged over channels: ``()``
    for one image, ``(N,)`` for a batch; in ``image1``'s dtype (Keras's ``_ssim``). Differentiable."""
    op = "ssim"
    df = _data_format(data_format, op)
    a, b = tensors(image1, image2)
    _check_rank(op, "image1", a)
    _check_rank(op, "image2", b)
    if tuple(a.shape) != tuple(b.shape):
        raise ValueError(f"{op}: image1 and image2 must have the same shape, got {a.shape} and {b.shape}")
    size = int(filter_size)
    x1, single = _nhwc(a, df)
    x2, _ = _nhwc(b, df)
    h, w = int(x1.shape[1]), int(x1.shape[2])
    if size < 1 or size > h or size > w:
        raise ValueError(f"{op}: filter_size must be in [1, min(height, width)] = [1, {min(h, w)}] (VALID "
                         f"filtering), got {filter_size!r}")
    cdt = np_dtype(result_type(a.dtype, float))
    x1, x2 = _back_to(x1, cdt), _back_to(x2, cdt)
    coords = _const(np.arange(size), x1)
    g = exp(divide(negative(square(subtract(coords, (size - 1) / 2.0))), 2.0 * filter_sigma ** 2))
    g = divide(g, _sum(g))
    rows, cols = _filter_matrix(g, h, h - size + 1, 0), _filter_matrix(g, w, w - size + 1, 0)

    def window(t: Tensor) -> Tensor:
        return _contract(_contract(t, 1, rows), 2, cols)

    c1, c2 = (k1 * max_val) ** 2, (k2 * max_val) ** 2
    mu1, mu2 = window(x1), window(x2)
    mu1_sq, mu2_sq, mu1_mu2 = multiply(mu1, mu1), multiply(mu2, mu2), multiply(mu1, mu2)
    sigma1_sq = subtract(window(multiply(x1, x1)), mu1_sq)
    sigma2_sq = subtract(window(multiply(x2, x2)), mu2_sq)
    sigma12 = subtract(window(multiply(x1, x2)), mu1_mu2)
    numerator = multiply(add(multiply(mu1_mu2, 2.0), c1), add(multiply(sigma12, 2.0), c2))
    denominator = multiply(add(add(mu1_sq, mu2_sq), c1), add(add(sigma1_sq, sigma2_sq), c2))
    value = mean(mean(divide(numerator, denominator), axis=(1, 2)), axis=-1)
    return _back_to(squeeze(value, 0) if single else value, a.dtype)


# ---------------------------------------------------------------------------------------- colours
def _channel_axis(df: str) -> int:
    return -1 if df == "channels_last" else -3


@keras_op(family="image")
def rgb_to_grayscale(images: Any, data_format: "str | None" = None) -> Tensor:
    """``keras.ops.image.rgb_to_grayscale``: ``0.2989 R + 0.5870 G + 0.1140 B`` on a 1-channel axis (a
    1-channel input is returned as it is); ints compute in float32 and are truncated back."""
    op = "rgb_to_grayscale"
    df = _data_format(data_format, op)
    (img,) = tensors(images)
    _check_rank(op, "images", img)
    axis = _channel_axis(df)
    if img.shape[axis] not in (1, 3):
        raise ValueError(f"{op}: expected 3 (RGB) or 1 (grayscale) channels, got images of shape {img.shape}")
    if img.shape[axis] == 1:
        return img
    x = _back_to(img, _compute_dtype(img.dtype))
    gray = _contract(x, axis, _const(np.array([[0.2989], [0.5870], [0.1140]]), x))
    return _back_to(gray, img.dtype)


def _float_images(op: str, images: Any) -> Tensor:
    (img,) = tensors(images)
    _check_rank(op, "images", img)
    if not is_float(img.dtype):
        raise ValueError(f"{op}: images must have a float dtype, got {img.dtype}")
    return img


def _planes(img: Tensor, axis: int, op: str) -> list:
    if img.shape[axis] != 3:
        raise ValueError(f"{op}: images must have 3 channels, got shape {img.shape}")
    return [squeeze(p, axis) for p in split(img, 3, axis=axis)]


@keras_op(family="image")
def rgb_to_hsv(images: Any, data_format: "str | None" = None) -> Tensor:
    """``keras.ops.image.rgb_to_hsv`` (dm_pix's formulas, as Keras): hue, saturation and value in ``[0, 1]``
    for RGB in ``[0, 1]`` (float images only)."""
    op = "rgb_to_hsv"
    df = _data_format(data_format, op)
    img = _float_images(op, images)
    axis = _channel_axis(df)
    eps = 2.0 ** -7 if img.dtype == BFLOAT16 else float(np.finfo(img.dtype).eps)
    img = where(less(_abs(img), eps), 0.0, img)
    r, g, b = _planes(img, axis, op)
    value = maximum(maximum(r, g), b)
    range_ = subtract(value, minimum(minimum(r, g), b))
    safe_value = where(greater(value, 0.0), value, 1.0)
    safe_range = where(greater(range_, 0.0), range_, 1.0)
    saturation = where(greater(value, 0.0), divide(range_, safe_value), 0.0)
    norm = divide(1.0, multiply(safe_range, 6.0))
    hue = where(equal(value, g), add(multiply(norm, subtract(b, r)), 2.0 / 6.0),
                add(multiply(norm, subtract(r, g)), 4.0 / 6.0))
    hue = where(equal(value, r), multiply(norm, subtract(g, b)), hue)
    hue = add(where(greater(range_, 0.0), hue, 0.0), cast(less(hue, 0.0), hue.dtype))
    return stack([hue, saturation, value], axis=axis)


@keras_op(family="image")
def hsv_to_rgb(images: Any, data_format: "str | None" = None) -> Tensor:
    """``keras.ops.image.hsv_to_rgb`` (dm_pix's formulas, as Keras; float images only)."""
    op = "hsv_to_rgb"
    df = _data_format(data_format, op)
    img = _float_images(op, images)
    axis = _channel_axis(df)
    hue, saturation, value = _planes(img, axis, op)
    dh = multiply(mod(hue, 1.0), 6.0)
    dr = clip(subtract(_abs(subtract(dh, 3.0)), 1.0), 0.0, 1.0)
    dg = clip(subtract(2.0, _abs(subtract(dh, 2.0))), 0.0, 1.0)
    db = clip(subtract(2.0, _abs(subtract(dh, 4.0))), 0.0, 1.0)
    one_minus_s = subtract(1.0, saturation)
    planes = [multiply(value, add(one_minus_s, multiply(saturation, d))) for d in (dr, dg, db)]
    return stack(planes, axis=axis)


# ------------------------------------------------------------------------------------- resampling
def _triangle(x: Tensor) -> Tensor:
    return maximum(subtract(1.0, _abs(x)), 0.0)


def _keys_cubic(x: Tensor) -> Tensor:
    """Keys' cubic convolution kernel (a = -0.5) of ``|x|``."""
    inner = add(multiply(multiply(subtract(multiply(x, 1.5), 2.5), x), x), 1.0)
    outer = add(multiply(subtract(multiply(add(multiply(x, -0.5), 2.5), x), 4.0), x), 2.0)
    return where(greater_equal(x, 2.0), 0.0, where(greater_equal(x, 1.0), outer, inner))


def _lanczos(radius: float) -> Callable[[Tensor], Tensor]:
    def kernel(x: Tensor) -> Tensor:
        y = multiply(multiply(sin(multiply(x, math.pi)), sin(multiply(x, math.pi / radius))), radius)
        den = where(equal(x, 0.0), 1.0, multiply(square(x), math.pi ** 2))
        out = where(greater(x, 1e-3), divide(y, den), 1.0)
        return where(greater(x, radius), 0.0, out)
    return kernel


_KERNELS: dict = {"linear": _triangle, "bilinear": _triangle, "trilinear": _triangle, "cubic": _keys_cubic,
                  "bicubic": _keys_cubic, "tricubic": _keys_cubic, "lanczos3": _lanczos(3.0),
                  "lanczos5": _lanczos(5.0)}


def _weight_matrix(size_in: int, size_out: int, scale: Any, translation: Any, kernel: Callable, antialias: bool,
                   like: Tensor, dtype: np.dtype) -> Tensor:
    """JAX's ``compute_weight_mat`` (``(size_in, size_out)`` of ``dtype``, on ``like``'s device): the kernel
    at the distances of output sample points to input pixel centres (widened by ``1 / scale`` when
    antialiasing a downscale), normalised per column, zero where the sample falls outside the input.
    ``scale``/``translation``: Python numbers or 0-d tensors (then differentiable in them)."""
    tensor_scale = isinstance(scale, Tensor)
    inv_scale = divide(1.0, scale) if tensor_scale else 1.0 / scale
    kernel_scale = 1.0
    if antialias:
        kernel_scale = maximum(inv_scale, 1.0) if tensor_scale else max(inv_scale, 1.0)
    shift = multiply(translation, inv_scale) if tensor_scale or isinstance(translation, Tensor) else \
        translation * inv_scale
    outs = _const(np.arange(size_out) + 0.5, like, dtype)
    sample = subtract(subtract(multiply(outs, inv_scale), shift), 0.5)  # (size_out,)
    pixels = _const(np.arange(size_in).reshape(size_in, 1), like, dtype)
    weights = kernel(divide(_abs(subtract(reshape(sample, (1, size_out)), pixels)), kernel_scale))
    total = _sum(weights, axis=0, keepdims=True)
    weights = where(greater(_abs(total), 1000.0 * float(np.finfo(np.float32).eps)),
                    divide(weights, where(equal(total, 0.0), 1.0, total)), 0.0)
    inside = logical_and(greater_equal(sample, -0.5), less_equal(sample, size_in - 0.5))
    return where(reshape(inside, (1, size_out)), weights, 0.0)


def _area_matrix(size_in: int, size_out: int, like: Tensor) -> Tensor:
    """TensorFlow's area resampling: output pixel ``o`` averages input ``[o s, (o + 1) s)``, ``s = in / out``,
    each pixel weighted by its overlap."""
    s = size_in / size_out
    lo = np.arange(size_out)[None, :] * s
    i = np.arange(size_in)[:, None]
    overlap = np.clip(np.minimum(i + 1, lo + s) - np.maximum(i, lo), 0.0, None)
    return _const(overlap / s, like)


def _nearest_rows(size_in: int, size_out: int) -> np.ndarray:
    """JAX's nearest-neighbour sources: ``floor((o + 0.5) * in / out)`` computed in float32, as JAX does."""
    offsets = (np.arange(size_out, dtype=np.float32) + np.float32(0.5)) * np.float32(size_in) / np.float32(size_out)
    return np.floor(offsets).astype(np.int32)


def _weight_dtype(dt: np.dtype) -> np.dtype:
    """Resampling weights are computed in float32 (JAX's), float64 for float64 images."""
    return np.dtype(np.float64) if dt == np.float64 else np.dtype(np.float32)


def _resample(x: Tensor, axis: int, size_out: int, method: str, antialias: bool) -> Tensor:
    """``x`` resampled along ``axis`` to ``size_out`` by ``method`` (resize's: scale ``out / in``, no shift)."""
    size_in = int(x.shape[axis])
    if method == "nearest":
        return take(x, _const(_nearest_rows(size_in, size_out), x, np.int32), axis=axis)
    if method == "area":
        return _contract(x, axis, _area_matrix(size_in, size_out, x))
    weights = _weight_matrix(size_in, size_out, size_out / size_in, 0.0, _KERNELS[method], antialias, x,
                             _weight_dtype(x.dtype))
    return _contract(x, axis, _back_to(weights, x.dtype))


def _saturate_round(y: Tensor, dt: np.dtype) -> Tensor:
    """Keras's ``_resize`` ending for integer images: round half to even, clip to the type's range, cast."""
    info = np.iinfo(dt) if dt.kind in "iu" else None
    y = _core.REGISTRY["round"]["fn"](y)
    if info is not None:
        y = clip(y, float(info.min), float(info.max))
    return cast(y, dt)


def _aspect_box(height: int, width: int, target_h: int, target_w: int, crop: bool) -> "tuple[int, int]":
    if crop:
        return (max(min(height, int(float(width * target_h) / target_w)), 1),
                max(min(width, int(float(height * target_w) / target_h)), 1))
    return max(height, int(float(width * target_h) / target_w)), max(width, int(float(height * target_w) / target_h))


@keras_op(family="image")
def resize(images: Any, size: Any, interpolation: str = "bilinear", antialias: bool = False,
           crop_to_aspect_ratio: bool = False, pad_to_aspect_ratio: bool = False, fill_mode: str = "constant",
           fill_value: float = 0.0, data_format: "str | None" = None) -> Tensor:
    """``keras.ops.image.resize`` to ``size = (height, width)``: ``interpolation`` ``"nearest"``,
    ``"bilinear"``, ``"bicubic"`` (Keys), ``"lanczos3"``, ``"lanczos5"`` (``jax.image.resize``'s; ``antialias``
    widens the kernel when downscaling) or ``"area"`` (TensorFlow's); ``crop_to_aspect_ratio`` crops the
    central window of the target's aspect first, ``pad_to_aspect_ratio`` pads the short side with
    ``fill_value``. Integer images are rounded and saturated back to their dtype. Differentiable."""
    op = "resize"
    if len(size) != 2:
        raise ValueError(f"{op}: size must be (height, width), got size={size!r}")
    target_h, target_w = int(size[0]), int(size[1])
    if target_h <= 0 or target_w <= 0:
        raise ValueError(f"{op}: size must have a positive height and width, got size={size!r}")
    if crop_to_aspect_ratio and pad_to_aspect_ratio:
        raise ValueError(f"{op}: only one of pad_to_aspect_ratio and crop_to_aspect_ratio can be True")
    _choice(op, "interpolation", interpolation, _RESIZE_INTERPOLATIONS)
    _choice(op, "fill_mode", fill_mode, ("constant",))
    df = _data_format(data_format, op)
    (img,) = tensors(images)
    _check_rank(op, "images", img)
    x, single = _nhwc(img, df)
    height, width = int(x.shape[1]), int(x.shape[2])
    if crop_to_aspect_ratio:
        ch, cw = _aspect_box(height, width, target_h, target_w, True)
        top, left = int(float(height - ch) / 2), int(float(width - cw) / 2)
        x = x[:, top:top + ch, left:left + cw, :]
    elif pad_to_aspect_ratio:
        ph, pw = _aspect_box(height, width, target_h, target_w, False)
        top, left = int(float(ph - height) / 2), int(float(pw - width) / 2)
        if top > 0:
            x = pad(x, ((0, 0), (top, top), (0, 0), (0, 0)), constant_values=fill_value)
        elif left > 0:
            x = pad(x, ((0, 0), (0, 0), (left, left), (0, 0)), constant_values=fill_value)
    dt = img.dtype
    if interpolation != "nearest":
        x = _back_to(x, _compute_dtype(dt))
    for axis, target in ((1, target_h), (2, target_w)):
        if int(x.shape[axis]) != target:
            x = _resample(x, axis, target, interpolation, bool(antialias))
    if x.dtype != dt:
        x = _saturate_round(x, dt) if dt.kind in "iub" else cast(x, dt)
    return _restore(x, df, single)


@keras_op(family="image")
def scale_and_translate(images: Any, output_shape: Any, scale: Any, translation: Any, spatial_dims: Any,
                        method: str, antialias: bool = True) -> Tensor:
    """``keras.ops.image.scale_and_translate`` (``jax.image.scale_and_translate``): output location ``y``
    of each axis in ``spatial_dims`` samples the input at ``(y + 0.5 - translation) / scale - 0.5`` with
    the ``method``'s kernel (``linear``, ``cubic`` (Keys), ``lanczos3``/``5`` and their aliases), zero
    outside. Floats result (ints become float32). Differentiable in images, scale and translation."""
    op = "scale_and_translate"
    _choice(op, "method", method, _SCALE_AND_TRANSLATE_METHODS)
    img, sc, tr = tensors(images, scale, translation)
    dims = [int(d) for d in spatial_dims]
    shape_out = tuple(int(s) for s in output_shape)
    if len(shape_out) != img.ndim:
        raise ValueError(f"{op}: output_shape must have one entry per axis of images ({img.ndim}), got "
                         f"{output_shape!r}")
    if sc.shape != (len(dims),) or tr.shape != (len(dims),):
        raise ValueError(f"{op}: scale and translation must have shape ({len(dims)},) (one entry per spatial "
                         f"dim), got {sc.shape} and {tr.shape}")
    x = _back_to(img, _compute_dtype(img.dtype))
    wdt = np_dtype(result_type(sc, tr, float))
    sc, tr = _back_to(sc, wdt), _back_to(tr, wdt)
    for i, d in enumerate(dims):
        d %= img.ndim
        w = _weight_matrix(int(img.shape[d]), shape_out[d], sc[i], tr[i], _KERNELS[method], bool(antialias), x, wdt)
        x = _contract(x, d, _back_to(w, x.dtype))
    return x


# ---------------------------------------------------------------------------------------- patches
def _tuple(value: Any, n: int, op: str, name: str) -> tuple:
    items = (value,) * n if isinstance(value, (int, np.integer)) else tuple(value)
    if len(items) != n or any(int(v) < 1 for v in items):
        raise ValueError(f"{op}: {name} must be a positive int or {n} positive ints, got {name}={value!r}")
    return tuple(int(v) for v in items)


def _patches(x: Tensor, size: tuple, strides: tuple, dilation: tuple, padding: str, op: str) -> Tensor:
    """Patches of ``x`` (``(N, *S, C)``) as Keras's identity-kernel convolution lays them out: ``(N, *O,
    prod(size) * C)``, the last axis ordered (patch offsets..., channel). One gather."""
    spatial = tuple(int(s) for s in x.shape[1:-1])
    span = tuple((k - 1) * d + 1 for k, d in zip(size, dilation))
    if padding == "same":
        outs = tuple(-(-n // s) for n, s in zip(spatial, strides))
        total = [max((o - 1) * s + k - n, 0) for o, s, k, n in zip(outs, strides, span, spatial)]
        x = pad(x, ((0, 0),) + tuple((t // 2, t - t // 2) for t in total) + ((0, 0),))
        spatial = tuple(int(s) for s in x.shape[1:-1])
    else:
        outs = tuple(max((n - k) // s + 1, 0) for n, k, s in zip(spatial, span, strides))
    if 0 in outs:
        raise ValueError(f"{op}: patches of size {size} (dilation {dilation}) do not fit in images of spatial shape "
                         f"{spatial} with padding='valid'")
    pos = np.zeros(outs + size, np.int64)
    for axis, (o, s, k, d, n) in enumerate(zip(outs, strides, size, dilation, spatial)):
        start = (np.arange(o) * s).reshape([o if i == axis else 1 for i in range(len(size))] + [1] * len(size))
        offset = (np.arange(k) * d).reshape([1] * len(size) + [k if i == axis else 1 for i in range(len(size))])
        pos = pos * n + (start + offset)
    flat = reshape(x, (int(x.shape[0]), math.prod(spatial), int(x.shape[-1])))
    gathered = take(flat, _const(pos, flat, np.int32), axis=1)  # (N, *O, *size, C)
    return reshape(gathered, (int(x.shape[0]),) + outs + (math.prod(size) * int(x.shape[-1]),))


def _extract(op: str, images: Any, size: tuple, strides: Any, dilation_rate: Any, padding: str,
             data_format: "str | None") -> Tensor:
    df = _data_format(data_format, op)
    (img,) = tensors(images)
    nd = len(size)
    _check_rank(op, "images", img, (nd + 1, nd + 2))
    pad_mode = str(padding).lower()
    _choice(op, "padding", pad_mode, ("valid", "same"))
    strides = size if not strides else _tuple(strides, nd, op, "strides")
    dilation = _tuple(dilation_rate, nd, op, "dilation_rate")
    x, single = _nhwc(img, df, nd + 1)
    out = _patches(x, size, strides, dilation, pad_mode, op)
    return _restore(out, df, single)


@keras_op(family="image")
def extract_patches(images: Any, size: Any, strides: Any = None, dilation_rate: Any = 1, padding: str = "valid",
                    data_format: "str | None" = None) -> Tensor:
    """``keras.ops.image.extract_patches``: ``size`` ``(h, w)`` (or an int) patches of images as channels
    (``(..., out_h, out_w, h * w * C)``, ordered row, column, channel); a 3-tuple ``size`` extracts 3-d
    patches (:func:`extract_patches_3d`). ``strides`` default: ``size``."""
    op = "extract_patches"
    if not isinstance(size, (int, np.integer)):
        if not isinstance(size, (tuple, list)):
            raise TypeError(f"{op}: size must be an int or a tuple, got size={size!r} of type {type(size).__name__}")
        if len(size) not in (2, 3):
            raise ValueError(f"{op}: size must be an int or a tuple of length 2 or 3, got size={size!r}")
    sizes = _tuple(size, 2 if isinstance(size, (int, np.integer)) else len(size), op, "size")
    return _extract(op, images, sizes, strides, dilation_rate, padding, data_format)


@keras_op(family="image")
def extract_patches_3d(volumes: Any, size: Any, strides: Any = None, dilation_rate: Any = 1,
                       padding: str = "valid", data_format: "str | None" = None) -> Tensor:
    """``keras.ops.image.extract_patches_3d``: ``(d, h, w)`` patches of volumes (``(N, D, H, W, C)`` or one
    volume) as channels, ordered depth, row, column, channel."""
    sizes = _tuple(size, 3, "extract_patches_3d", "size")
    return _extract("extract_patches_3d", volumes, sizes, strides, dilation_rate, padding, data_format)


# ------------------------------------------------------------------------------- padding, cropping
def _non_negative(op: str, **values: Any) -> None:
    for name, v in values.items():
        if v is not None and v < 0:
            raise ValueError(f"{op}: {name} must be >= 0, got {name}={v}")


def _two_of_three(op: str, names: tuple, values: tuple) -> None:
    if list(values).count(None) != 1:
        given = ", ".join(f"{n}={v}" for n, v in zip(names, values))
        raise ValueError(f"{op}: give exactly two of {', '.join(names)}; got {given}")


def _window(op: str, kind: str, images: Any, data_format: "str | None", top: Any, bottom: Any, height: Any,
            left: Any, right: Any, width: Any) -> tuple:
    """The checked images and window arguments of ``pad_images``/``crop_images`` (``kind``: ``"padding"`` or
    ``"cropping"``): ``(images, height axis, width axis, height, width)``."""
    df = _data_format(data_format, op)
    (img,) = tensors(images)
    _check_rank(op, "images", img)
    rows = (f"top_{kind}", f"bottom_{kind}", "target_height")
    cols = (f"left_{kind}", f"right_{kind}", "target_width")
    _two_of_three(op, rows, (top, bottom, height))
    _two_of_three(op, cols, (left, right, width))
    _non_negative(op, **dict(zip(rows + cols, (top, bottom, height, left, right, width))))
    h_axis, w_axis = (img.ndim - 3, img.ndim - 2) if df == "channels_last" else (img.ndim - 2, img.ndim - 1)
    return img, h_axis, w_axis, int(img.shape[h_axis]), int(img.shape[w_axis])


@keras_op(family="image")
def pad_images(images: Any, top_padding: "int | None" = None, left_padding: "int | None" = None,
               bottom_padding: "int | None" = None, right_padding: "int | None" = None,
               target_height: "int | None" = None, target_width: "int | None" = None,
               data_format: "str | None" = None) -> Tensor:
    """``keras.ops.image.pad_images``: zeros around the images; two of (top, bottom, target height) and two
    of (left, right, target width) decide the third."""
    op = "pad_images"
    img, h_axis, w_axis, height, width = _window(op, "padding", images, data_format, top_padding, bottom_padding,
                                                 target_height, left_padding, right_padding, target_width)
    top = target_height - bottom_padding - height if top_padding is None else top_padding
    bottom = target_height - top - height if bottom_padding is None else bottom_padding
    left = target_width - right_padding - width if left_padding is None else left_padding
    right = target_width - left - width if right_padding is None else right_padding
    _non_negative(op, top_padding=top, left_padding=left, right_padding=right, bottom_padding=bottom)
    widths = [(0, 0)] * img.ndim
    widths[h_axis], widths[w_axis] = (int(top), int(bottom)), (int(left), int(right))
    return pad(img, widths)


@keras_op(family="image")
def crop_images(images: Any, top_cropping: "int | None" = None, left_cropping: "int | None" = None,
                bottom_cropping: "int | None" = None, right_cropping: "int | None" = None,
                target_height: "int | None" = None, target_width: "int | None" = None,
                data_format: "str | None" = None) -> Tensor:
    """``keras.ops.image.crop_images``: the window left after cropping; two of (top, bottom, target height)
    and two of (left, right, target width) decide the third."""
    op = "crop_images"
    img, h_axis, w_axis, height, width = _window(op, "cropping", images, data_format, top_cropping, bottom_cropping,
                                                 target_height, left_cropping, right_cropping, target_width)
    top = height - target_height - bottom_cropping if top_cropping is None else top_cropping
    target_h = height - bottom_cropping - top if target_height is None else target_height
    left = width - target_width - right_cropping if left_cropping is None else left_cropping
    target_w = width - right_cropping - left if target_width is None else target_width
    _non_negative(op, top_cropping=top, target_height=target_h, left_cropping=left, target_width=target_w)
    if top + target_h > height or left + target_w > width:
        raise ValueError(f"{op}: the crop (top {top}, height {target_h}, left {left}, width {target_w}) leaves images "
                         f"of height {height} and width {width}")
    starts, shape = [0] * img.ndim, list(img.shape)
    starts[h_axis], starts[w_axis] = int(top), int(left)
    shape[h_axis], shape[w_axis] = int(target_h), int(target_w)
    return _slice(img, starts, shape)
