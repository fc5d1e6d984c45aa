"""Pooling of ``keras.ops.nn``: ``max_pool``, ``average_pool`` (1-d, 2-d, 3-d; ``"valid"``/``"same"``;
either ``data_format``) and ``adaptive_max_pool``, ``adaptive_average_pool`` (Keras's two-pool gather).

One recorded primitive, :func:`pool2d` (``kernels.pool2d_forward``/``pool2d_backward``: cuDNN, or
dnnbind's NHWC max-pool kernels, on the device), carries them all: 1-d pooling is 2-d of height 1;
3-d pooling is separable (a box window's maximum is the maximum over depth of the maxima over
height and width, and the average excluding padding is the product of the per-axis averages), so it
runs as a 2-d pooling over height and width with the depth folded into the batch, then one over the
depth; adaptive pooling pools one axis at a time with stride-1 windows and gathers. Average pooling
with ``"same"`` divides by the number of real inputs in each window, as Keras.

The first-order backward is the kernel's; when a tape records it (higher-order gradients) it is made
of ops: average pooling's backward is a linear op whose VJP is average pooling again, and max
pooling's sends the gradient to the first maximum of each window through strided slices.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from .. import kernels
from ..autodiff.engine import recording
from ..autodiff.tensor import Tensor
from ..kernels import numeric as N
from ..kernels._params import resolve_padding
from ._core import keras_op, make, tensors
from ._nn_common import as_float, channels_last, op, padding_mode, place_strided, spatial_tuple
from ._nn_common import data_format as _standardize_format

__all__ = ["max_pool", "average_pool", "adaptive_max_pool", "adaptive_average_pool", "pool2d"]


def pool2d(x: Tensor, mode: str, window: tuple, stride: tuple, pads: tuple, layout: str) -> Tensor:
    """``kernels.pool2d_forward`` recorded (``mode`` ``"max"`` or ``"avg"``, padding explicit
    ``(top, bottom, left, right)``)."""
    params = {"mode": mode, "window": window, "stride": stride, "padding": pads, "layout": layout}
    y = kernels.pool2d_forward(x.data, **params)

    def backward(node: Any, g: Tensor) -> tuple:
        if g.dtype != x.dtype:
            g = op("cast")(g, x.dtype)
        y_raw = node.outputs_raw[0]
        if not recording():
            return (Tensor(kernels.pool2d_backward(g.data, x.data, y_raw, **params)),)
        if mode == "avg":
            return (_avg_pool_grad(g, x.data, y_raw, params),)
        return (_max_pool_grad_composed(g, x.data, y_raw, params),)

    return make(y, (x,), backward, "max_pool" if mode == "max" else "average_pool", keep_outputs=True)


def _avg_pool_grad(g: Tensor, x_raw: Any, y_raw: Any, params: dict) -> Tensor:
    """Average pooling's backward as a recorded op: linear in ``g``; its VJP is average pooling."""
    dx = kernels.pool2d_backward(g.data, x_raw, y_raw, **params)
    geometry = (params["window"], params["stride"], params["padding"], params["layout"])
    return make(dx, (g,), lambda node, h: (pool2d(h, "avg", *geometry),), "average_pool_grad")


def _spatial_axes(layout: str) -> tuple:
    return (1, 2) if layout == "NHWC" else (2, 3)


def _max_pool_grad_composed(g: Tensor, x_raw: Any, y_raw: Any, params: dict) -> Tensor:
    """Max pooling's backward in ops: ``sum_k place_k(where(first_max_k, g, 0))`` over the window
    positions ``k`` (``first_max_k``: position ``k`` holds the window's first maximum, a constant), so the
    second derivative (a gradient of this, w.r.t. ``g``) gathers at the maxima."""
    where, get_item = op("where"), op("get_item")
    (kh, kw), (sh, sw), (t, b, l, r) = params["window"], params["stride"], params["padding"]
    ah, aw = _spatial_axes(params["layout"])
    widths = [(0, 0)] * 4
    widths[ah], widths[aw] = (t, b), (l, r)
    xp = Tensor(N.pad(x_raw, tuple(widths), constant_value=-np.inf) if t or b or l or r else x_raw)
    y = Tensor(y_raw)
    oh, ow = int(y.shape[ah]), int(y.shape[aw])
    claimed = None
    total = None
    for i in range(kh):
        for j in range(kw):
            key = [slice(None)] * 4
            key[ah] = slice(i, i + (oh - 1) * sh + 1, sh)
            key[aw] = slice(j, j + (ow - 1) * sw + 1, sw)
            hit = op("equal")(get_item(xp, tuple(key)), y)
            if claimed is not None:
                hit = op("logical_and")(hit, op("logical_not")(claimed))
                claimed = op("logical_or")(claimed, hit)
            else:
                claimed = hit
            starts, steps = [0] * 4, [1] * 4
            starts[ah], starts[aw], steps[ah], steps[aw] = i, j, sh, sw
            placed = place_strided(where(hit, g, 0.0), tuple(xp.shape), starts, steps)
            total = placed if total is None else op("add")(total, placed)
    if t or b or l or r:
        key = [slice(None)] * 4
        key[ah] = slice(t, int(xp.shape[ah]) - b)
        key[aw] = slice(l, int(xp.shape[aw]) - r)
        total = get_item(total, tuple(key))
    return total


# ------------------------------------------------------------------------------------ geometry
def _explicit(padding: str, sizes: Sequence[int], window: Sequence[int], stride: Sequence[int]) -> tuple:
    """(top, bottom, left, right) of a 2-d pooling."""
    return resolve_padding(padding, tuple(sizes), tuple(window), tuple(stride))


def _check(owner: str, x: Tensor, fmt: str, window: tuple, stride: tuple, padding: str) -> None:
    sizes = x.shape[1:-1] if channels_last(fmt) else x.shape[2:]
    for n, k, s in zip(sizes, window, stride):
        out = -(-n // s) if padding == "same" else (n - k) // s + 1
        if out < 1:
            raise ValueError(f"{owner}: the pooling window {window} does not fit the input of shape {tuple(x.shape)} "
                             f"with padding='valid' (strides {stride})")


def _spatial_input(owner: str, inputs: Any, fmt: Any) -> "tuple[Tensor, str, int]":
    """(float tensor, data format, number of spatial axes) of a pooling's input."""
    (x,) = tensors(inputs)
    x = as_float(x)
    fmt = _standardize_format(fmt, owner)
    nsp = x.ndim - 2
    if nsp not in (1, 2, 3):
        raise ValueError(f"{owner}: inputs must be 3-d, 4-d or 5-d (batch, 1 to 3 spatial axes, channels), got shape "
                         f"{tuple(x.shape)}")
    return x, fmt, nsp


def _pool(owner: str, mode: str, inputs: Any, pool_size: Any, strides: Any, padding: str, fmt: Any) -> Tensor:
    x, fmt, nsp = _spatial_input(owner, inputs, fmt)
    window = spatial_tuple(pool_size, nsp, "pool_size", owner)
    stride = window if strides is None else spatial_tuple(strides, nsp, "strides", owner)
    padding = padding_mode(padding, owner)
    _check(owner, x, fmt, window, stride, padding)
    layout = "NHWC" if channels_last(fmt) else "NCHW"
    reshape = op("reshape")
    shape = tuple(int(s) for s in x.shape)
    if nsp == 2:
        sizes = shape[1:3] if layout == "NHWC" else shape[2:]
        return pool2d(x, mode, window, stride, _explicit(padding, sizes, window, stride), layout)
    if nsp == 1:
        n, a, b = shape
        x2 = reshape(x, (n, 1, a, b) if layout == "NHWC" else (n, a, 1, b))
        width = a if layout == "NHWC" else b
        pads = _explicit(padding, (1, width), (1,) + window, (1,) + stride)
        y = pool2d(x2, mode, (1,) + window, (1,) + stride, pads, layout)
        return reshape(y, (n,) + tuple(y.shape[2:]) if layout == "NHWC" else tuple(y.shape[:2]) + (y.shape[3],))
    # 3-d: height and width first (depth folded into the batch, or into the channels for NCHW), then depth
    if layout == "NHWC":
        n, d, h, w, c = shape
        hw = pool2d(reshape(x, (n * d, h, w, c)), mode, window[1:], stride[1:],
                    _explicit(padding, (h, w), window[1:], stride[1:]), layout)
        oh, ow = int(hw.shape[1]), int(hw.shape[2])
        dep = pool2d(reshape(hw, (n, d, oh * ow, c)), mode, (window[0], 1), (stride[0], 1),
                     _explicit(padding, (d, 1), (window[0], 1), (stride[0], 1)), layout)
        return reshape(dep, (n, int(dep.shape[1]), oh, ow, c))
    n, c, d, h, w = shape
    hw = pool2d(reshape(x, (n, c * d, h, w)), mode, window[1:], stride[1:],
                _explicit(padding, (h, w), window[1:], stride[1:]), layout)
    oh, ow = int(hw.shape[2]), int(hw.shape[3])
    dep = pool2d(reshape(hw, (n, c, d, oh * ow)), mode, (window[0], 1), (stride[0], 1),
                 _explicit(padding, (d, 1), (window[0], 1), (stride[0], 1)), layout)
    return reshape(dep, (n, c, int(dep.shape[2]), oh, ow))


@keras_op(family="nn")
def max_pool(inputs: Any, pool_size: Any, strides: Any = None, padding: str = "valid",
             data_format: Any = None) -> Tensor:
    """``keras.ops.max_pool``: the maximum of each window (1-d, 2-d or 3-d; ``strides`` None: the window);
    ``"same"`` pads with -inf."""
    return _pool("max_pool", "max", inputs, pool_size, strides, padding, data_format)


@keras_op(family="nn")
def average_pool(inputs: Any, pool_size: Any, strides: Any = None, padding: str = "valid",
                 data_format: Any = None) -> Tensor:
    """``keras.ops.average_pool``: the mean of each window; with ``"same"``, of its real (unpadded) inputs."""
    return _pool("average_pool", "avg", inputs, pool_size, strides, padding, data_format)


# ------------------------------------------------------------------------------------- adaptive
def _pool_axis(t: Tensor, axis: int, window: int, mode: str) -> Tensor:
    """Stride-1, ``"valid"`` pooling of ``t`` along one ``axis`` (viewed as the height of an NHWC array
    ``(before, length, 1, after)``: no transpose)."""
    shape = tuple(int(s) for s in t.shape)
    before, after = int(np.prod(shape[:axis])), int(np.prod(shape[axis + 1:]))
    y = pool2d(op("reshape")(t, (before, shape[axis], 1, after)), mode, (window, 1), (1, 1), (0, 0, 0, 0), "NHWC")
    return op("reshape")(y, shape[:axis] + (int(y.shape[1]),) + shape[axis + 1:])


def _gather_index(length: int, out: int, big: int, device: Any) -> Any:
    """Keras's ``_compute_adaptive_pooling_gather_indices``: for each output position, the start of its
    window in the small pooling, or in the big one (placed after it) when its window is the big size."""
    i32 = np.dtype(np.int32)
    idx = N.iota(out, 0, 1, i32, device=device)
    start = N.binary("floor_divide", N.binary("multiply", idx, length), out)
    end = N.binary("floor_divide", N.binary("add", N.binary("multiply", N.binary("add", idx, 1), length), out - 1), out)
    is_big = N.binary("equal", N.binary("subtract", end, start), big)
    return N.where(is_big, N.binary("add", start, length - (big - 1) + 1), start, dtype=i32)


def _adaptive(owner: str, mode: str, inputs: Any, output_size: Any, fmt: Any) -> Tensor:
    x, fmt, nsp = _spatial_input(owner, inputs, fmt)
    sizes = spatial_tuple(output_size, nsp, "output_size", owner)
    first = 1 if channels_last(fmt) else 2
    out = x
    for i, target in enumerate(sizes):
        axis = first + i
        length = int(out.shape[axis])
        small = -(-length // target)
        big = small + 1
        pools = [_pool_axis(out, axis, small, mode)]
        if big <= length:  # else no window can have the big size
            pools.append(_pool_axis(out, axis, big, mode))
        combined = op("concatenate")(pools, axis=axis) if len(pools) > 1 else pools[0]
        out = op("take")(combined, Tensor(_gather_index(length, target, big, x.device)), axis=axis)
    return out


@keras_op(family="nn")
def adaptive_max_pool(inputs: Any, output_size: Any, data_format: Any = None) -> Tensor:
    """``keras.ops.adaptive_max_pool``: max pooling to ``output_size`` (window ``i`` of an axis of length ``L``
    covers ``[floor(i L / out), ceil((i + 1) L / out))``, as Keras)."""
    return _adaptive("adaptive_max_pool", "max", inputs, output_size, data_format)


@keras_op(family="nn")
def adaptive_average_pool(inputs: Any, output_size: Any, data_format: Any = None) -> Tensor:
    """``keras.ops.adaptive_average_pool``: average pooling to ``output_size`` (windows as
    :func:`adaptive_max_pool`)."""
    return _adaptive("adaptive_average_pool", "avg", inputs, output_size, data_format)
