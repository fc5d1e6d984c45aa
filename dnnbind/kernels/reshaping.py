"""Ops of the reshaping layers: 2-d zero padding and cropping, 2-d upsampling (nearest and bilinear)
and axis permutation, each with its backward.

Images are ``(N, C, H, W)`` (``layout="NCHW"``) or ``(N, H, W, C)`` (``"NHWC"``); padding and
cropping amounts are ``(top, bottom, left, right)`` in pixels. The backward of :func:`pad2d` is
:func:`crop2d` by the same amounts, and the reverse.

Upsampling by integer factors ``size = (sh, sw)`` follows Keras ``UpSampling2D``:

* ``"nearest"``: ``y[oh, ow] = x[oh // sh, ow // sw]`` (Keras's ``ops.repeat``);
* ``"bilinear"``: half-pixel centres with edge clamping, as ``tf.image.resize`` /
  ``jax.image.resize`` / ``torch.nn.functional.interpolate(align_corners=False)``: output row ``oh``
  samples ``src = (oh + 0.5) / sh - 0.5`` and mixes input rows ``floor(src)`` and ``floor(src) + 1``
  (clamped to ``[0, H - 1]``) with weights ``1 - frac(src)`` and ``frac(src)``; columns likewise.

Low precision computes in float32 (the bilinear weights and the backward's sums).
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ._dispatch import as_array, check_float, check_out, compute_dtype, finish, route, to_compute
from ._params import check_layout

__all__ = ["pad2d", "crop2d", "upsample2d_forward", "upsample2d_backward", "UPSAMPLE_INTERPOLATIONS",
           "transpose"]

UPSAMPLE_INTERPOLATIONS = ("nearest", "bilinear")


def _image(op: str, name: str, x: Any, layout: str) -> "tuple[Any, str]":
    x = as_array(x)
    layout = check_layout(layout)
    if x.ndim != 4:
        raise ValueError(f"{op}: {name} must be 4-d ({'N, C, H, W' if layout == 'NCHW' else 'N, H, W, C'}), "
                         f"got shape {tuple(x.shape)}")
    check_float(op, name, x)
    return x, layout


def _amounts(op: str, name: str, value: Any) -> tuple[int, int, int, int]:
    try:
        items = tuple(value)
    except TypeError:
        items = ()
    if len(items) != 4 or any(isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0 for v in items):
        raise ValueError(f"{op}: {name} must be 4 ints >= 0 (top, bottom, left, right), got {value!r}")
    return tuple(int(v) for v in items)  # type: ignore[return-value]


def _hw_axes(layout: str) -> tuple[int, int]:
    return (2, 3) if layout == "NCHW" else (1, 2)


def _with_hw(shape: Sequence[int], layout: str, h: int, w: int) -> tuple:
    out = list(int(d) for d in shape)
    ah, aw = _hw_axes(layout)
    out[ah], out[aw] = h, w
    return tuple(out)


def pad2d(x: Any, padding: Sequence[int], *, value: float = 0.0, layout: str = "NCHW", out: Any = None,
          stream: Any = None) -> Any:
    """``x`` with ``padding = (top, bottom, left, right)`` rows/columns of ``value`` added around H and W.

    CUDA: ``_cuda.reshaping.pad2d(x, padding, value=value, layout=layout, out=out, stream=stream)``
    (padding a tuple of 4 ints, layout upper case).
    """
    op = "pad2d"
    x, layout = _image(op, "x", x, layout)
    pad = _amounts(op, "padding", padding)
    try:
        value = float(value)
    except (TypeError, ValueError):
        raise TypeError(f"{op}: value must be a number, got {value!r}") from None
    ah, aw = _hw_axes(layout)
    t, b, l, r = pad
    shape = _with_hw(x.shape, layout, x.shape[ah] + t + b, x.shape[aw] + l + r)
    check_out(op, out, shape, x.dtype)
    impl = route(op, "reshaping", x=x, out=out)
    if impl is not None:
        return impl.pad2d(x, pad, value=value, layout=layout, out=out, stream=stream)
    res = np.full(shape, value, dtype=x.dtype) if out is None else out
    if out is not None:
        res[...] = value
    index = [slice(None)] * 4
    index[ah], index[aw] = slice(t, t + x.shape[ah]), slice(l, l + x.shape[aw])
    res[tuple(index)] = x
    return res


def crop2d(x: Any, cropping: Sequence[int], *, layout: str = "NCHW", out: Any = None, stream: Any = None) -> Any:
    """``x`` without ``cropping = (top, bottom, left, right)`` rows/columns at its edges (a new array).

    CUDA: ``_cuda.reshaping.crop2d(x, cropping, layout=layout, out=out, stream=stream)``.
    """
    op = "crop2d"
    x, layout = _image(op, "x", x, layout)
    crop = _amounts(op, "cropping", cropping)
    ah, aw = _hw_axes(layout)
    t, b, l, r = crop
    h, w = x.shape[ah] - t - b, x.shape[aw] - l - r
    if h < 1 or w < 1:
        raise ValueError(f"{op}: cropping {crop} (top, bottom, left, right) leaves nothing of a "
                         f"{x.shape[ah]}x{x.shape[aw]} image")
    shape = _with_hw(x.shape, layout, h, w)
    check_out(op, out, shape, x.dtype)
    impl = route(op, "reshaping", x=x, out=out)
    if impl is not None:
        return impl.crop2d(x, crop, layout=layout, out=out, stream=stream)
    index = [slice(None)] * 4
    index[ah], index[aw] = slice(t, t + h), slice(l, l + w)
    window = x[tuple(index)]
    if out is None:
        return np.ascontiguousarray(window)
    np.copyto(out, window)
    return out


def _upsample_args(op: str, size: Any, interpolation: Any) -> tuple[tuple[int, int], str]:
    items = (size, size) if isinstance(size, (int, np.integer)) and not isinstance(size, bool) else size
    try:
        pair = tuple(items)
    except TypeError:
        pair = ()
    if len(pair) != 2 or any(isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1 for v in pair):
        raise ValueError(f"{op}: size must be an int or a pair of ints >= 1 (height, width), got {size!r}")
    kind = str(interpolation).lower() if isinstance(interpolation, str) else interpolation
    if kind not in UPSAMPLE_INTERPOLATIONS:
        raise ValueError(f"{op}: interpolation must be one of {', '.join(UPSAMPLE_INTERPOLATIONS)}, "
                         f"got {interpolation!r}")
    return (int(pair[0]), int(pair[1])), kind


def bilinear_weights(in_size: int, factor: int, dtype: Any = np.float64) -> np.ndarray:
    """The ``(in_size * factor, in_size)`` matrix of half-pixel bilinear upsampling along one axis."""
    o = np.arange(in_size * factor)
    src = (o + 0.5) / factor - 0.5
    lo = np.floor(src)
    frac = src - lo
    lo = lo.astype(np.int64)
    m = np.zeros((in_size * factor, in_size), dtype=np.float64)
    np.add.at(m, (o, np.clip(lo, 0, in_size - 1)), 1.0 - frac)
    np.add.at(m, (o, np.clip(lo + 1, 0, in_size - 1)), frac)
    return m.astype(dtype)


def _resample(x: np.ndarray, mh: np.ndarray, mw: np.ndarray, layout: str) -> np.ndarray:
    """``mh @ x @ mw.T`` over the (H, W) axes of ``x``."""
    if layout == "NCHW":
        return np.einsum("ah,nchw,bw->ncab", mh, x, mw, optimize=True)
    return np.einsum("ah,nhwc,bw->nabc", mh, x, mw, optimize=True)


def upsample2d_forward(x: Any, *, size: Any = (2, 2), interpolation: str = "nearest", layout: str = "NCHW",
                       out: Any = None, stream: Any = None) -> Any:
    """``x`` upsampled by the integer factors ``size = (sh, sw)``: ``H -> H*sh``, ``W -> W*sw``.

    CUDA: ``_cuda.reshaping.upsample2d_forward(x, size=size, interpolation=interpolation, layout=layout,
    out=out, stream=stream)`` (size a pair of ints, interpolation and layout normalised).
    """
    op = "upsample2d_forward"
    x, layout = _image(op, "x", x, layout)
    size, kind = _upsample_args(op, size, interpolation)
    ah, aw = _hw_axes(layout)
    shape = _with_hw(x.shape, layout, x.shape[ah] * size[0], x.shape[aw] * size[1])
    check_out(op, out, shape, x.dtype)
    impl = route(op, "reshaping", x=x, out=out)
    if impl is not None:
        return impl.upsample2d_forward(x, size=size, interpolation=kind, layout=layout, out=out, stream=stream)
    if kind == "nearest":
        y = np.repeat(np.repeat(x, size[0], axis=ah), size[1], axis=aw)
        if out is None:
            return y
        np.copyto(out, y)
        return out
    cd = compute_dtype(x.dtype)
    y = _resample(to_compute(x), bilinear_weights(x.shape[ah], size[0], cd), bilinear_weights(x.shape[aw], size[1], cd),
                  layout)
    return finish(np.ascontiguousarray(y), out, x.dtype)


def upsample2d_backward(dy: Any, x_shape: Sequence[int], *, size: Any = (2, 2), interpolation: str = "nearest",
                        layout: str = "NCHW", stream: Any = None) -> Any:
    """Gradient w.r.t. the input of :func:`upsample2d_forward` (shape ``x_shape``) given ``dy``.

    ``"nearest"``: each input pixel gets the sum of its ``sh x sw`` block of ``dy``; ``"bilinear"``:
    the transposed interpolation (the sum of ``dy`` times each tap's weight).

    CUDA: ``_cuda.reshaping.upsample2d_backward(dy, x_shape, size=size, interpolation=interpolation,
    layout=layout, stream=stream)`` with ``x_shape`` a tuple.
    """
    op = "upsample2d_backward"
    dy, layout = _image(op, "dy", dy, layout)
    size, kind = _upsample_args(op, size, interpolation)
    x_shape = tuple(int(d) for d in x_shape)
    ah, aw = _hw_axes(layout)
    if len(x_shape) != 4 or _with_hw(x_shape, layout, x_shape[ah] * size[0], x_shape[aw] * size[1]) != tuple(
            dy.shape):
        raise ValueError(f"{op}: dy has shape {tuple(dy.shape)} but an input of shape {x_shape} upsampled by {size} "
                         f"({layout}) gives a different one")
    impl = route(op, "reshaping", dy=dy)
    if impl is not None:
        return impl.upsample2d_backward(dy, x_shape, size=size, interpolation=kind, layout=layout, stream=stream)
    g = to_compute(dy)
    if kind == "nearest":
        blocks = list(x_shape)
        blocks[ah:ah + 1] = [x_shape[ah], size[0]]
        blocks[aw + 1:aw + 2] = [x_shape[aw], size[1]]
        dx = g.reshape(blocks).sum(axis=(ah + 1, aw + 2))
    else:
        cd = g.dtype
        mh = bilinear_weights(x_shape[ah], size[0], cd)
        mw = bilinear_weights(x_shape[aw], size[1], cd)
        dx = _resample(g, mh.T, mw.T, layout)
    return finish(np.ascontiguousarray(dx), None, dy.dtype)


def transpose(x: Any, axes: Sequence[int], *, out: Any = None, stream: Any = None) -> Any:
    """``x`` with its axes permuted (``np.transpose(x, axes)``), as a new contiguous array. Any dtype.

    CUDA: ``_cuda.reshaping.transpose(x, axes, out=out, stream=stream)`` (axes a tuple of
    non-negative ints).
    """
    op = "transpose"
    x = as_array(x)
    try:
        perm = tuple(int(a) % x.ndim if x.ndim else int(a) for a in axes)
    except (TypeError, ValueError):
        raise TypeError(f"{op}: axes must be a sequence of ints, got {axes!r}") from None
    if sorted(perm) != list(range(x.ndim)) or any(not -x.ndim <= int(a) < x.ndim for a in axes):
        raise ValueError(f"{op}: axes must be a permutation of the {x.ndim} axes of x (shape {tuple(x.shape)}), "
                         f"got {tuple(axes)}")
    shape = tuple(int(x.shape[a]) for a in perm)
    check_out(op, out, shape, x.dtype)
    impl = route(op, "reshaping", x=x, out=out)
    if impl is not None:
        return impl.transpose(x, perm, out=out, stream=stream)
    if out is None:
        return np.ascontiguousarray(np.transpose(x, perm))
    np.copyto(out, np.transpose(x, perm))
    return out
