"""2-d convolution (forward, backward data, backward filter), bias add/grad, fused conv+bias+activation,
a convolution followed by a training batch norm (``conv2d_batchnorm_forward_training``), and the backward of
a convolution applied to relu(batch norm) down to the batch norm's input (``batchnorm_relu_conv2d_backward``).

Layouts: ``x`` is ``(N, C, H, W)`` for ``layout="NCHW"`` and ``(N, H, W, C)`` for
``"NHWC"``; the filter is ``(K, C/groups, R, S)`` and ``(K, R, S, C/groups)``
respectively. Padding is an int, a pair ``(ph, pw)``, ``(top, bottom, left,
right)``, ``"valid"`` or ``"same"`` (Keras: the odd pixel goes to the bottom and
right, see :func:`dnnbind.kernels._params.resolve_padding`). This is cross-correlation,
as in cuDNN and Keras (no kernel flip).

The NumPy reference works in NHWC internally (NCHW arguments are viewed as
NHWC through a transpose, which costs nothing until the im2col copy): im2col
through ``as_strided`` on the padded input, one BLAS matmul per group, and a
``col2im`` scatter with one strided add per kernel position for the data gradient.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
from numpy.lib.stride_tricks import as_strided

from ._dispatch import as_array, check_float, check_out, check_same_dtype, finish, route, to_compute
from ._host_memory import tune_malloc_once
from ._params import ConvParams, as_pair, check_layout, is_plain, naming, resolve_padding
from .activation import _forward as _activation_forward, resolve_activation

__all__ = [
    "conv_params",
    "conv2d_output_shape",
    "conv2d_forward",
    "conv2d_backward_data",
    "conv2d_backward_filter",
    "bias_add",
    "bias_backward",
    "conv2d_bias_activation_forward",
    "conv2d_batchnorm_forward_training",
    "batchnorm_relu_conv2d_backward",
]


# --------------------------------------------------------------------------------------------
# Validation and parameter normalisation.

def _shape4(op: str, name: str, shape: Any) -> tuple[int, int, int, int]:
    try:
        dims = tuple(map(int, shape))
    except TypeError:
        raise TypeError(f"{op}: {name} must be a 4-tuple of ints, got {shape!r}") from None
    if len(dims) != 4 or min(dims) < 1:
        raise ValueError(f"{op}: {name} must have 4 positive dimensions, got {shape!r}")
    return dims  # type: ignore[return-value]


def _nchw(shape: Sequence[int], layout: str) -> tuple[int, int, int, int]:
    """(N, C, H, W) of a 4-d activation shape."""
    if layout == "NCHW":
        return tuple(shape)  # type: ignore[return-value]
    n, h, w, c = shape
    return (n, c, h, w)


def _kcrs(shape: Sequence[int], layout: str) -> tuple[int, int, int, int]:
    """(K, C/g, R, S) of a filter shape."""
    if layout == "NCHW":
        return tuple(shape)  # type: ignore[return-value]
    k, r, s, c = shape
    return (k, c, r, s)


def _layout_shape(n: int, c: int, h: int, w: int, layout: str) -> tuple[int, int, int, int]:
    return (n, c, h, w) if layout == "NCHW" else (n, h, w, c)


def conv_params(
    op: str,
    x_shape: Sequence[int],
    w_shape: Sequence[int],
    *,
    stride: Any,
    padding: Any,
    dilation: Any,
    groups: int,
    layout: str,
) -> tuple[ConvParams, tuple[int, int, int, int]]:
    """Check a convolution's geometry; return its :class:`ConvParams` and the output shape (in ``layout``)."""
    # Memo of accepted geometries: every training step repeats the same few. Only exact
    # Python ints/strs (and tuples of ints) are memoised, so that True, 1.0 or a NumPy
    # integer, which hash like 1, still go through the checks below and get their errors.
    key = None
    if (_plain(stride) and _plain(padding) and _plain(dilation) and type(groups) is int
            and type(x_shape) is tuple and type(w_shape) is tuple):
        key = (op, x_shape, w_shape, stride, padding, dilation, groups, layout)
        hit = _conv_params_memo.get(key)
        if hit is not None:
            return hit
    result = _conv_params(op, x_shape, w_shape, stride=stride, padding=padding, dilation=dilation,
                          groups=groups, layout=layout)
    if key is not None:
        if len(_conv_params_memo) >= 4096:
            _conv_params_memo.clear()
        _conv_params_memo[key] = result
    return result


_conv_params_memo: dict = {}


_plain = is_plain


def _conv_params(op: str, x_shape: Sequence[int], w_shape: Sequence[int], *, stride: Any, padding: Any,
                 dilation: Any, groups: int, layout: str) -> tuple[ConvParams, tuple[int, int, int, int]]:
    n, c, h, w = _nchw(x_shape, layout)
    k, cg, r, s = _kcrs(w_shape, layout)
    if isinstance(groups, bool) or not isinstance(groups, (int, np.integer)) or groups < 1:
        raise ValueError(f"{op}: groups must be a positive int, got {groups!r}")
    groups = int(groups)
    if c != cg * groups:
        raise ValueError(
            f"{op}: x has {c} channels but w expects {cg * groups} (w shape {tuple(w_shape)}, "
            f"groups={groups}, layout {layout})"
        )
    if k % groups:
        raise ValueError(
            f"{op}: w has {k} output channels, which groups={groups} does not divide (w shape {tuple(w_shape)})"
        )
    with naming(op):
        stride_p = as_pair(stride, "stride")
        dilation_p = as_pair(dilation, "dilation")
        pad = resolve_padding(padding, (h, w), (r, s), stride_p, dilation_p)
    params = ConvParams(stride=stride_p, pad=pad, dilation=dilation_p, groups=groups)
    oh, ow = params.output_hw((h, w), (r, s))
    if oh < 1 or ow < 1:
        raise ValueError(
            f"{op}: the output would be empty ({oh}x{ow}): input {h}x{w}, kernel {r}x{s}, "
            f"dilation {dilation_p}, padding (top, bottom, left, right) {pad}, stride {stride_p}"
        )
    return params, _layout_shape(n, k, oh, ow, layout)


def conv2d_output_shape(
    x_shape: Sequence[int], w_shape: Sequence[int], *, stride: Any = 1, padding: Any = 0, dilation: Any = 1,
    groups: int = 1, layout: str = "NCHW",
) -> tuple[int, int, int, int]:
    """The output shape of :func:`conv2d_forward` (in ``layout``) without computing it."""
    layout = check_layout(layout)
    x_shape = _shape4("conv2d_output_shape", "x_shape", x_shape)
    w_shape = _shape4("conv2d_output_shape", "w_shape", w_shape)
    return conv_params(
        "conv2d_output_shape", x_shape, w_shape, stride=stride, padding=padding, dilation=dilation,
        groups=groups, layout=layout,
    )[1]


def _check4(op: str, name: str, arr: Any) -> None:
    if arr.ndim != 4:
        raise ValueError(f"{op}: {name} must be 4-d, got shape {tuple(arr.shape)}")
    check_float(op, name, arr)


# --------------------------------------------------------------------------------------------
# NumPy reference, NHWC internally. ``x``: (N, H, W, C) (any strides), ``w``: (K, R, S, Cg).

def _to_nhwc(x: np.ndarray, layout: str) -> np.ndarray:
    return x.transpose(0, 2, 3, 1) if layout == "NCHW" else x


def _from_nhwc(y: np.ndarray, layout: str) -> np.ndarray:
    return y.transpose(0, 3, 1, 2) if layout == "NCHW" else y


def _filter_krsc(w: np.ndarray, layout: str) -> np.ndarray:
    return w.transpose(0, 2, 3, 1) if layout == "NCHW" else w


def _pad_nhwc(x: np.ndarray, pad: tuple[int, int, int, int]) -> np.ndarray:
    t, b, l, r = pad
    if not (t or b or l or r):
        return x
    n, h, w, c = x.shape
    xp = np.zeros((n, h + t + b, w + l + r, c), dtype=x.dtype)
    xp[:, t:t + h, l:l + w, :] = x
    return xp


# Below this many input channels per group, the columns are built transposed, (R*S*C, M): one
# contiguous copy per kernel position, instead of gathering rows of a handful of floats.
_NARROW_CHANNELS = 4


def _im2col(x: np.ndarray, p: ConvParams, r: int, s: int, oh: int, ow: int) -> np.ndarray:
    """(G, N*OH*OW, R*S*Cg) patches of the NHWC input (one copy)."""
    xp = _pad_nhwc(x, p.pad)
    n, _, _, c = xp.shape
    sn, sh, sw, sc = xp.strides
    g = p.groups
    win = as_strided(
        xp,
        shape=(n, oh, ow, r, s, g, c // g),
        strides=(sn, sh * p.stride[0], sw * p.stride[1], sh * p.dilation[0], sw * p.dilation[1], sc * (c // g), sc),
        writeable=False,
    )
    if g == 1:
        return win.reshape(1, n * oh * ow, r * s * c)
    return win.transpose(5, 0, 1, 2, 3, 4, 6).reshape(g, n * oh * ow, r * s * (c // g))


def _im2col_narrow(x: np.ndarray, p: ConvParams, r: int, s: int, oh: int, ow: int, ones_row: bool) -> np.ndarray:
    """Transposed patches ``(R*S*C [+1], N*OH*OW)`` for groups=1 and few channels.

    With ``ones_row`` a last row of ones is appended, so that a bias folds into the GEMM.
    """
    xp = _pad_nhwc(x, p.pad)
    n, _, _, c = xp.shape
    (sh, sw), (dh, dw) = p.stride, p.dilation
    cols = np.empty((r * s * c + int(ones_row), n, oh, ow), dtype=xp.dtype)
    for i in range(r):
        for j in range(s):
            k = (i * s + j) * c
            cols[k:k + c] = xp[:, i * dh:i * dh + (oh - 1) * sh + 1:sh, j * dw:j * dw + (ow - 1) * sw + 1:sw, :] \
                .transpose(3, 0, 1, 2)
    if ones_row:
        cols[-1] = 1
    return cols.reshape(cols.shape[0], n * oh * ow)


def _conv_forward_nhwc(x: np.ndarray, w: np.ndarray, p: ConvParams, b: "np.ndarray | None" = None) -> np.ndarray:
    """NHWC convolution, plus the bias ``b`` (K,) when given."""
    tune_malloc_once()
    n, h, wd, c = x.shape
    k, r, s, cg = w.shape
    g = p.groups
    oh, ow = p.output_hw((h, wd), (r, s))
    if g == 1 and c <= _NARROW_CHANNELS:
        cols_t = _im2col_narrow(x, p, r, s, oh, ow, ones_row=b is not None)
        wmat = w.reshape(k, r * s * c)
        if b is not None:
            wmat = np.concatenate([wmat, b.reshape(k, 1).astype(wmat.dtype, copy=False)], axis=1)
        return np.matmul(cols_t.T, wmat.T).reshape(n, oh, ow, k)
    cols = _im2col(x, p, r, s, oh, ow)
    wmat = w.reshape(g, k // g, r * s * cg).transpose(0, 2, 1)  # (G, RSCg, Kg)
    y = np.matmul(cols, wmat)  # (G, M, Kg)
    y = y.reshape(n, oh, ow, k) if g == 1 else y.transpose(1, 0, 2).reshape(n, oh, ow, k)
    if b is not None:
        y += b
    return y


def _conv_backward_data_nhwc(dy: np.ndarray, w: np.ndarray, x_shape_nhwc: Sequence[int], p: ConvParams) -> np.ndarray:
    n, h, wd, c = x_shape_nhwc
    k, r, s, cg = w.shape
    g = p.groups
    _, oh, ow, _ = dy.shape
    m = n * oh * ow
    t, b, l, rp = p.pad
    sh, sw = p.stride
    dh, dw = p.dilation
    if g == 1:
        # One GEMM per kernel position, batched: (R*S, M, C). Each slab is a contiguous NHWC
        # image, so the col2im adds below run over whole (OW, C) rows.
        wrs = w.reshape(k, r * s, c).transpose(1, 0, 2)  # (RS, K, C)
        dcols = np.matmul(dy.reshape(m, k), wrs)
        shape = (n, h + t + b, wd + l + rp, c)
        if sh == 1 and sw == 1:
            # The first kernel position covers the block [0, OH) x [0, OW) densely: assign it and
            # zero only the rest, instead of zero-filling everything and adding.
            dxp = np.empty(shape, dtype=dcols.dtype)
            dxp[:, :oh, :ow] = dcols[0].reshape(n, oh, ow, c)
            dxp[:, oh:] = 0
            dxp[:, :oh, ow:] = 0
            first = 1
        else:
            dxp = np.zeros(shape, dtype=dcols.dtype)
            first = 0
        for pos in range(first, r * s):
            i, j = divmod(pos, s)
            dxp[:, i * dh:i * dh + (oh - 1) * sh + 1:sh, j * dw:j * dw + (ow - 1) * sw + 1:sw] += (
                dcols[pos].reshape(n, oh, ow, c)
            )
        return dxp[:, t:t + h, l:l + wd, :]
    dyg = dy.reshape(m, g, k // g).transpose(1, 0, 2)  # (G, M, Kg)
    dcols = np.matmul(dyg, w.reshape(g, k // g, r * s * cg))  # (G, M, RSCg)
    dcols = dcols.reshape(g, n, oh, ow, r, s, cg)
    dxp = np.zeros((n, h + t + b, wd + l + rp, g, cg), dtype=dcols.dtype)
    for i in range(r):
        for j in range(s):
            patch = dcols[:, :, :, :, i, j, :]  # (G, N, OH, OW, Cg)
            dxp[:, i * dh:i * dh + (oh - 1) * sh + 1:sh, j * dw:j * dw + (ow - 1) * sw + 1:sw] += (
                patch.transpose(1, 2, 3, 0, 4)
            )
    return dxp.reshape(n, h + t + b, wd + l + rp, c)[:, t:t + h, l:l + wd, :]


def _conv_backward_filter_nhwc(x: np.ndarray, dy: np.ndarray, w_shape_krsc: Sequence[int], p: ConvParams) -> np.ndarray:
    k, r, s, cg = w_shape_krsc
    g = p.groups
    n, oh, ow, _ = dy.shape
    m = n * oh * ow
    if g == 1 and cg <= _NARROW_CHANNELS:
        cols_t = _im2col_narrow(x, p, r, s, oh, ow, ones_row=False)  # (RSC, M)
        # (RSC, M) @ (M, K) reads dy row by row: faster than the transposed product for a tall dy.
        return np.matmul(cols_t, dy.reshape(m, k)).T.reshape(k, r, s, cg)
    cols = _im2col(x, p, r, s, oh, ow)  # (G, M, RSCg)
    dyg = dy.reshape(m, g, k // g).transpose(1, 2, 0)  # (G, Kg, M)
    dw = np.matmul(dyg, cols)  # (G, Kg, RSCg)
    return dw.reshape(k, r, s, cg)


# Channels-last bias add and bias gradient. NumPy's broadcast add and its reduction over the
# leading axes run inner loops of only C elements; a bias tiled to a row of a few hundred
# elements, and a BLAS gemv with a vector of ones, run over long contiguous rows instead
# (about 1.5x and 4x faster on a 128x26x26x32 batch). The gemv sums in the same order class
# as NumPy's axis-0 reduction (a running sum per channel, no pairwise summation).
_BIAS_ROW = 512
_ones_cache: dict = {}


def _ones(n: int, dtype: np.dtype) -> np.ndarray:
    ones = _ones_cache.get(dtype)
    if ones is None or ones.shape[0] < n:
        ones = np.ones(max(n, 1024), dtype=dtype)
        ones.flags.writeable = False
        _ones_cache[dtype] = ones
    return ones[:n]


def _bias_add_last(y: np.ndarray, b: np.ndarray, out: "np.ndarray | None") -> np.ndarray:
    """``y + b`` over the last axis, into ``out`` when given (it may be ``y``)."""
    c = y.shape[-1]
    if y.ndim < 2 or not y.flags.c_contiguous or (out is not None and not out.flags.c_contiguous):
        return np.add(y, b, out=out)
    reps = 1
    for d in reversed(y.shape[:-1]):  # merge trailing dims into the row while it is short
        if c * reps >= _BIAS_ROW:
            break
        reps *= d
    y2 = y.reshape(-1, c * reps)
    res = np.add(y2, np.tile(b, reps), out=None if out is None else out.reshape(y2.shape))
    return out if out is not None else res.reshape(y.shape)


def _bias_backward_last(dy: np.ndarray) -> np.ndarray:
    """Sum of a C-contiguous ``dy`` over every axis but the last."""
    c = dy.shape[-1]
    rows = dy.size // c if c else 0
    if rows == 0 or dy.dtype not in (np.float32, np.float64):
        return dy.reshape(rows, c).sum(axis=0)
    return np.matmul(_ones(rows, dy.dtype), dy.reshape(rows, c))


# --------------------------------------------------------------------------------------------
# Public ops.

def conv2d_forward(
    x: Any,
    w: Any,
    *,
    stride: Any = 1,
    padding: Any = 0,
    dilation: Any = 1,
    groups: int = 1,
    layout: str = "NCHW",
    out: Any = None,
    stream: Any = None,
) -> Any:
    """Cross-correlate ``x`` with the filter ``w``: ``y[n, k, oh, ow] = sum_{c,r,s} x[...] * w[k, c, r, s]``.

    ``x`` and ``w`` share one float dtype; ``y`` has it too, shape ``(N, K, OH, OW)``
    (NCHW) or ``(N, OH, OW, K)`` (NHWC). Low precision accumulates in float32.

    CUDA: ``_cuda.conv.conv2d_forward(x, w, params=params, layout=layout, out=out, stream=stream)``
    where ``params`` is the :class:`ConvParams` (explicit (top, bottom, left, right) padding)
    and ``layout`` is upper case.
    """
    op = "conv2d_forward"
    x, w = as_array(x), as_array(w)
    layout = check_layout(layout)
    _check4(op, "x", x)
    _check4(op, "w", w)
    check_same_dtype(op, "x", x, "w", w)
    params, y_shape = conv_params(
        op, x.shape, w.shape, stride=stride, padding=padding, dilation=dilation, groups=groups, layout=layout
    )
    check_out(op, out, y_shape, x.dtype)
    impl = route(op, "conv", x=x, w=w, out=out)
    if impl is not None:
        return impl.conv2d_forward(x, w, params=params, layout=layout, out=out, stream=stream)
    xc = to_compute(x)
    y = _conv_forward_nhwc(_to_nhwc(xc, layout), _filter_krsc(to_compute(w), layout), params)
    return finish(np.ascontiguousarray(_from_nhwc(y, layout)) if out is None else _from_nhwc(y, layout), out, x.dtype)


def conv2d_backward_data(
    dy: Any,
    w: Any,
    x_shape: Sequence[int],
    *,
    stride: Any = 1,
    padding: Any = 0,
    dilation: Any = 1,
    groups: int = 1,
    layout: str = "NCHW",
    out: Any = None,
    stream: Any = None,
) -> Any:
    """Gradient of :func:`conv2d_forward` with respect to its input: ``dx`` of shape ``x_shape``.

    ``dy`` is the output gradient (the forward's output shape); the geometry
    arguments are those of the forward call.

    CUDA: ``_cuda.conv.conv2d_backward_data(dy, w, x_shape, params=params, layout=layout, out=out,
    stream=stream)`` with ``x_shape`` a tuple of 4 ints.
    """
    op = "conv2d_backward_data"
    dy, w = as_array(dy), as_array(w)
    layout = check_layout(layout)
    x_shape = _shape4(op, "x_shape", x_shape)
    _check4(op, "dy", dy)
    _check4(op, "w", w)
    check_same_dtype(op, "dy", dy, "w", w)
    params, y_shape = conv_params(
        op, x_shape, w.shape, stride=stride, padding=padding, dilation=dilation, groups=groups, layout=layout
    )
    if tuple(dy.shape) != y_shape:
        raise ValueError(f"{op}: dy has shape {tuple(dy.shape)} but the forward output shape is {y_shape} ({layout})")
    check_out(op, out, x_shape, dy.dtype)
    impl = route(op, "conv", dy=dy, w=w, out=out)
    if impl is not None:
        return impl.conv2d_backward_data(dy, w, x_shape, params=params, layout=layout, out=out, stream=stream)
    n, c, h, wd = _nchw(x_shape, layout)
    dx = _conv_backward_data_nhwc(
        _to_nhwc(to_compute(dy), layout), _filter_krsc(to_compute(w), layout), (n, h, wd, c), params
    )
    dx = _from_nhwc(dx, layout)
    return finish(np.ascontiguousarray(dx) if out is None else dx, out, dy.dtype)


def conv2d_backward_filter(
    x: Any,
    dy: Any,
    w_shape: Sequence[int],
    *,
    stride: Any = 1,
    padding: Any = 0,
    dilation: Any = 1,
    groups: int = 1,
    layout: str = "NCHW",
    out: Any = None,
    stream: Any = None,
) -> Any:
    """Gradient of :func:`conv2d_forward` with respect to the filter: ``dw`` of shape ``w_shape``.

    CUDA: ``_cuda.conv.conv2d_backward_filter(x, dy, w_shape, params=params, layout=layout, out=out,
    stream=stream)`` with ``w_shape`` a tuple of 4 ints.
    """
    op = "conv2d_backward_filter"
    x, dy = as_array(x), as_array(dy)
    layout = check_layout(layout)
    w_shape = _shape4(op, "w_shape", w_shape)
    _check4(op, "x", x)
    _check4(op, "dy", dy)
    check_same_dtype(op, "x", x, "dy", dy)
    params, y_shape = conv_params(
        op, x.shape, w_shape, stride=stride, padding=padding, dilation=dilation, groups=groups, layout=layout
    )
    if tuple(dy.shape) != y_shape:
        raise ValueError(f"{op}: dy has shape {tuple(dy.shape)} but the forward output shape is {y_shape} ({layout})")
    check_out(op, out, w_shape, x.dtype)
    impl = route(op, "conv", x=x, dy=dy, out=out)
    if impl is not None:
        return impl.conv2d_backward_filter(x, dy, w_shape, params=params, layout=layout, out=out, stream=stream)
    k, cg, r, s = _kcrs(w_shape, layout)
    dw = _conv_backward_filter_nhwc(_to_nhwc(to_compute(x), layout), _to_nhwc(to_compute(dy), layout), (k, r, s, cg), params)
    if layout == "NCHW":
        dw = dw.transpose(0, 3, 1, 2)
    return finish(np.ascontiguousarray(dw) if out is None else dw, out, x.dtype)


def _bias_axis(op: str, y: Any, layout: str) -> int:
    if y.ndim == 2:
        return 1
    if y.ndim == 4:
        return 1 if layout == "NCHW" else 3
    raise ValueError(f"{op}: expects a 2-d (N, C) or 4-d tensor, got shape {tuple(y.shape)}")


def bias_add(y: Any, b: Any, *, layout: str = "NCHW", out: Any = None, stream: Any = None) -> Any:
    """``y + b`` along the channel axis (axis 1 for NCHW, the last for NHWC and for 2-d ``(N, C)``).

    ``b`` is ``(C,)`` in ``y``'s dtype. ``out`` may be ``y`` (in place).

    CUDA: ``_cuda.conv.bias_add(y, b, layout=layout, out=out, stream=stream)``.
    """
    op = "bias_add"
    y, b = as_array(y), as_array(b)
    layout = check_layout(layout)
    axis = _bias_axis(op, y, layout)
    check_float(op, "y", y)
    check_same_dtype(op, "y", y, "b", b)
    if tuple(b.shape) != (y.shape[axis],):
        raise ValueError(
            f"{op}: b has shape {tuple(b.shape)} but y (shape {tuple(y.shape)}, layout {layout}) has "
            f"{y.shape[axis]} channels"
        )
    check_out(op, out, y.shape, y.dtype)
    impl = route(op, "conv", y=y, b=b, out=out)
    if impl is not None:
        return impl.bias_add(y, b, layout=layout, out=out, stream=stream)
    bb = b.reshape((-1, 1, 1)) if (y.ndim == 4 and axis == 1) else b
    if to_compute(y) is y:
        if axis == y.ndim - 1:
            return _bias_add_last(y, b, out)
        return np.add(y, bb, out=out)
    return finish(to_compute(y) + to_compute(bb), out, y.dtype)


def bias_backward(dy: Any, *, layout: str = "NCHW", stream: Any = None) -> Any:
    """``db``: ``dy`` summed over every axis but the channel axis; shape ``(C,)``, ``dy``'s dtype.

    CUDA: ``_cuda.conv.bias_backward(dy, layout=layout, stream=stream)``.
    """
    op = "bias_backward"
    dy = as_array(dy)
    layout = check_layout(layout)
    axis = _bias_axis(op, dy, layout)
    check_float(op, "dy", dy)
    impl = route(op, "conv", dy=dy)
    if impl is not None:
        return impl.bias_backward(dy, layout=layout, stream=stream)
    dyc = to_compute(dy)
    if axis == dy.ndim - 1 and dyc.flags.c_contiguous:
        return _bias_backward_last(dyc).astype(dy.dtype, copy=False)
    axes = tuple(a for a in range(dy.ndim) if a != axis)
    return dyc.sum(axis=axes).astype(dy.dtype, copy=False)


def conv2d_bias_activation_forward(
    x: Any,
    w: Any,
    b: Any,
    *,
    activation: str = "relu",
    alpha: "float | None" = None,
    stride: Any = 1,
    padding: Any = 0,
    dilation: Any = 1,
    groups: int = 1,
    layout: str = "NCHW",
    out: Any = None,
    stream: Any = None,
) -> Any:
    """``activation(conv2d_forward(x, w) + b)`` in one call (cuDNN's fused kernel where it applies).

    Any kind of :mod:`dnnbind.kernels.activation` is accepted (``"linear"`` for none);
    the result is the activation's output, so a backward needs the activation
    kinds whose derivative reads ``y`` only (relu, sigmoid, tanh, linear) or a
    separate pre-activation.

    CUDA: ``_cuda.conv.conv2d_bias_activation_forward(x, w, b, activation=kind, alpha=alpha,
    params=params, layout=layout, out=out, stream=stream)`` (kind/alpha normalised as in
    :func:`dnnbind.kernels.activation_forward`).
    """
    op = "conv2d_bias_activation_forward"
    x, w, b = as_array(x), as_array(w), as_array(b)
    layout = check_layout(layout)
    kind, alpha = resolve_activation(op, activation, alpha)
    _check4(op, "x", x)
    _check4(op, "w", w)
    check_same_dtype(op, "x", x, "w", w)
    check_same_dtype(op, "x", x, "b", b)
    params, y_shape = conv_params(
        op, x.shape, w.shape, stride=stride, padding=padding, dilation=dilation, groups=groups, layout=layout
    )
    k = _kcrs(w.shape, layout)[0]
    if tuple(b.shape) != (k,):
        raise ValueError(f"{op}: b has shape {tuple(b.shape)}, expected ({k},) for w of shape {tuple(w.shape)}")
    check_out(op, out, y_shape, x.dtype)
    impl = route(op, "conv", x=x, w=w, b=b, out=out)
    if impl is not None:
        return impl.conv2d_bias_activation_forward(
            x, w, b, activation=kind, alpha=alpha, params=params, layout=layout, out=out, stream=stream
        )
    xc = to_compute(x)
    y = _conv_forward_nhwc(_to_nhwc(xc, layout), _filter_krsc(to_compute(w), layout), params,
                           to_compute(b))
    y = _activation_forward(y, kind, alpha, y)
    return finish(np.ascontiguousarray(_from_nhwc(y, layout)) if out is None else _from_nhwc(y, layout), out, x.dtype)


def conv2d_batchnorm_forward_training(
    x: Any,
    w: Any,
    gamma: Any,
    beta: Any,
    running_mean: Any,
    running_var: Any,
    *,
    momentum: float = 0.99,
    epsilon: float = 1e-3,
    activation: "str | None" = None,
    stride: Any = 1,
    padding: Any = 0,
    dilation: Any = 1,
    groups: int = 1,
    layout: str = "NCHW",
    out: Any = None,
    stream: Any = None,
) -> "tuple[Any, Any, Any]":
    """A convolution followed by a training batch norm over its output channels, in one call.

    Returns ``(y, out, saved)``: ``y = conv2d_forward(x, w, ...)`` (what the batch norm normalised:
    its backward's ``x``), ``out, saved = batchnorm_forward_training(y, gamma, beta, running_mean,
    running_var, momentum=momentum, epsilon=epsilon, mode="spatial", layout=layout,
    activation=activation, out=out)``; the running statistics are updated in place. Pass ``y`` and ``saved``
    to :func:`dnnbind.kernels.batchnorm_backward` (with ``out`` as its ``y`` when ``activation="relu"``),
    and ``y``'s gradient to the convolution's backward ops. ``gamma`` ... ``running_var`` are
    ``(K,)`` float32 (float64 for float64 data).

    CUDA (``_cuda/conv_bn.py``): channels-last float16/bfloat16/float32 data may run the convolution
    as one cuDNN graph that also writes the per-channel sum and sum of squares of ``y`` in its epilogue
    (genstats), then one kernel that finalizes the statistics and normalises (the batch norm's own
    statistics pass over ``y`` is saved); chosen per shape as ``conv_graph.py`` chooses its plans,
    else the two ops above. Each dtype's results equal the two ops' within that dtype's rounding, but
    the variance comes from the sums (E[y^2] - mean^2, in float32, as cuDNN's ``bn_finalize`` does), which
    loses digits when a channel's |mean| is many times its standard deviation.
    NumPy: the two ops above.
    """
    from .batchnorm import _check_activation, _check_momentum_epsilon, _check_params, batchnorm_forward_training

    op = "conv2d_batchnorm_forward_training"
    x, w = as_array(x), as_array(w)
    gamma, beta, running_mean, running_var = map(as_array, (gamma, beta, running_mean, running_var))
    layout = check_layout(layout)
    activation = _check_activation(op, activation)
    _check4(op, "x", x)
    _check4(op, "w", w)
    check_same_dtype(op, "x", x, "w", w)
    params, y_shape = conv_params(
        op, x.shape, w.shape, stride=stride, padding=padding, dilation=dilation, groups=groups, layout=layout
    )
    k = _kcrs(w.shape, layout)[0]
    _check_params(op, x, (k,), source=f"w of shape {tuple(w.shape)} ({k} output channels)", gamma=gamma, beta=beta,
                  running_mean=running_mean, running_var=running_var)
    momentum, epsilon = _check_momentum_epsilon(op, momentum, epsilon)
    check_out(op, out, y_shape, x.dtype)
    impl = route(op, "conv_bn", x=x, w=w, gamma=gamma, beta=beta, running_mean=running_mean,
                 running_var=running_var, out=out)
    if impl is not None:
        return impl.conv2d_batchnorm_forward_training(
            x, w, gamma, beta, running_mean, running_var, params=params, momentum=momentum, epsilon=epsilon,
            activation=activation, layout=layout, out=out, stream=stream,
        )
    y = conv2d_forward(x, w, stride=stride, padding=padding, dilation=dilation, groups=groups, layout=layout)
    out, saved = batchnorm_forward_training(y, gamma, beta, running_mean, running_var, momentum=momentum,
                                            epsilon=epsilon, mode="spatial", layout=layout, activation=activation,
                                            out=out)
    return y, out, saved


def batchnorm_relu_conv2d_backward(
    dy: Any,
    w: Any,
    x: Any,
    y: Any,
    gamma: Any,
    beta: Any,
    saved: Any,
    *,
    epsilon: float = 1e-3,
    stride: Any = 1,
    padding: Any = 0,
    dilation: Any = 1,
    groups: int = 1,
    layout: str = "NCHW",
    stream: Any = None,
) -> "tuple[Any, Any, Any]":
    """The backward of ``conv2d(relu(batchnorm(x)), w)`` from the convolution's output gradient, in one call.

    ``x`` is the batch norm's input and ``y = relu(batchnorm(x))`` its training forward's output (with
    ``activation="relu"``, whose record is ``saved``), which the convolution took as input; ``dy`` is
    the gradient of the convolution's output. Returns ``(dx, dgamma, dbeta)``, the same as
    ``batchnorm_backward(conv2d_backward_data(dy, w, y.shape, ...), x, gamma, saved, activation="relu",
    y=y)``. The convolution's filter gradient is not part of it (``conv2d_backward_filter(y, dy, ...)``).

    CUDA (``_cuda/conv_bn.py``): channels-last data with symmetric padding may run the data gradient,
    the relu's backward and the batch norm's weight gradients as one cuDNN graph (cuDNN's
    DgradDreluBNBwdWeight pattern; the relu's mask recomputed from ``x``, the saved statistics, gamma
    and beta), then one kernel for dx; chosen per shape, else the two ops above. NumPy: the two ops.
    """
    from .batchnorm import BatchNormSaved, _check_momentum_epsilon, _check_params, batchnorm_backward

    op = "batchnorm_relu_conv2d_backward"
    dy, w, x, y = as_array(dy), as_array(w), as_array(x), as_array(y)
    gamma, beta = as_array(gamma), as_array(beta)
    layout = check_layout(layout)
    for name, arr in (("dy", dy), ("w", w), ("x", x), ("y", y)):
        _check4(op, name, arr)
    check_same_dtype(op, "dy", dy, "w", w)
    check_same_dtype(op, "dy", dy, "x", x)
    check_same_dtype(op, "dy", dy, "y", y)
    if tuple(x.shape) != tuple(y.shape):
        raise ValueError(f"{op}: y (the relu's output) has shape {tuple(y.shape)}, expected x's {tuple(x.shape)}")
    params, out_shape = conv_params(
        op, y.shape, w.shape, stride=stride, padding=padding, dilation=dilation, groups=groups, layout=layout
    )
    if tuple(dy.shape) != tuple(out_shape):
        raise ValueError(f"{op}: dy has shape {tuple(dy.shape)}, expected the convolution's output shape "
                         f"{tuple(out_shape)} for x {tuple(y.shape)} and w {tuple(w.shape)}")
    if not isinstance(saved, BatchNormSaved):
        raise TypeError(f"{op}: saved must be the BatchNormSaved of the batch norm's training forward, got "
                        f"{type(saved).__name__}")
    if saved.activation not in (None, "relu") or (saved.path is not None and saved.activation != "relu"):
        raise ValueError(f"{op}: saved comes from a forward with activation={saved.activation!r}; this backward "
                         "needs the record of a forward with activation='relu'")
    if saved.x_shape is not None and tuple(saved.x_shape) != tuple(x.shape):
        raise ValueError(f"{op}: saved was made for x of shape {tuple(saved.x_shape)}, got x of shape {tuple(x.shape)}")
    c = _nchw(x.shape, layout)[1]
    mean, inv_std = as_array(saved.mean), as_array(saved.inv_std)
    _check_params(op, x, (c,), source=f"x of shape {tuple(x.shape)} ({c} channels, {layout})", gamma=gamma, beta=beta,
                  **{"saved.mean": mean, "saved.inv_std": inv_std})
    _, epsilon = _check_momentum_epsilon(op, 0.0, epsilon)
    impl = route(op, "conv_bn", dy=dy, w=w, x=x, y=y, gamma=gamma, beta=beta, saved_mean=mean, saved_inv_std=inv_std)
    if impl is not None:
        return impl.batchnorm_relu_conv2d_backward(dy, w, x, y, gamma, beta, saved, params=params, epsilon=epsilon,
                                                   layout=layout, stream=stream)
    dconv = conv2d_backward_data(dy, w, y.shape, stride=stride, padding=padding, dilation=dilation, groups=groups,
                                 layout=layout)
    return batchnorm_backward(dconv, x, gamma, saved, epsilon=epsilon, mode="spatial", layout=layout,
                              activation="relu", y=y)
