"""2-d pooling (max, average excluding padding, average including padding) and global average pooling.

``x`` is ``(N, C, H, W)`` (NCHW) or ``(N, H, W, C)`` (NHWC). ``window`` and
``stride`` are ints or pairs (``stride=None`` means the window, as in Keras);
padding is as for convolutions (``"same"`` puts the odd pixel at the bottom
and right). Max pooling treats padding as ``-inf``; ``"avg"`` divides by the
number of real (unpadded) inputs in each window (Keras/TF ``padding="same"``,
cuDNN ``AVERAGE_COUNT_EXCLUDE_PADDING``); ``"avg_include_pad"`` divides by the
window area.

Ties in max pooling: the gradient goes to the first maximum of the window in
row-major (top-left first) order.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
from numpy.lib.stride_tricks import as_strided

from ._dispatch import as_array, check_float, check_out, finish, route, to_compute
from ._host_memory import tune_malloc_once
from ._params import PoolParams, as_pair, check_layout, is_plain, naming, resolve_padding

__all__ = [
    "POOL_MODES",
    "pool_params",
    "pool2d_forward",
    "pool2d_backward",
    "global_avg_pool2d_forward",
    "global_avg_pool2d_backward",
]

POOL_MODES = ("max", "avg", "avg_include_pad")
_MODE_ALIASES = {"average": "avg", "avg_exclude_pad": "avg", "mean": "avg"}


def pool_params(op: str, x_shape: Sequence[int], *, mode: str, window: Any, stride: Any, padding: Any,
                layout: str) -> tuple[PoolParams, tuple[int, int, int, int]]:
    """Check a pooling's geometry; return its :class:`PoolParams` and the output shape (in ``layout``)."""
    # Memo of accepted geometries, as conv_params': only exact ints/strs (and tuples of ints) are
    # keys, so True, 2.0 or a NumPy integer still go through the checks and get their errors.
    key = None
    if (type(x_shape) is tuple and type(mode) is str and type(layout) is str and is_plain(window)
            and (stride is None or is_plain(stride)) and is_plain(padding)):
        key = (x_shape, mode, window, stride, padding, layout)
        hit = _pool_params_memo.get(key)
        if hit is not None:
            return hit
    result = _pool_params(op, x_shape, mode=mode, window=window, stride=stride, padding=padding, layout=layout)
    if key is not None:
        if len(_pool_params_memo) >= 4096:
            _pool_params_memo.clear()
        _pool_params_memo[key] = result
    return result


_pool_params_memo: dict = {}


def _pool_params(op: str, x_shape: Sequence[int], *, mode: str, window: Any, stride: Any, padding: Any,
                 layout: str) -> tuple[PoolParams, tuple[int, int, int, int]]:
    name = _MODE_ALIASES.get(str(mode).lower(), str(mode).lower())
    if name not in POOL_MODES:
        raise ValueError(f"{op}: mode must be one of {', '.join(POOL_MODES)}, got {mode!r}")
    if layout == "NCHW":
        n, c, h, w = x_shape
    else:
        n, h, w, c = x_shape
    with naming(op):
        window_p = as_pair(window, "window")
        stride_p = window_p if stride is None else as_pair(stride, "stride")
        pad = resolve_padding(padding, (h, w), window_p, stride_p)
    if pad[0] >= window_p[0] or pad[1] >= window_p[0] or pad[2] >= window_p[1] or pad[3] >= window_p[1]:
        raise ValueError(f"{op}: padding {pad} must be smaller than the window {window_p} on each side")
    params = PoolParams(mode=name, window=window_p, stride=stride_p, pad=pad)
    oh, ow = params.output_hw((h, w))
    if oh < 1 or ow < 1:
        raise ValueError(
            f"{op}: the output would be empty ({oh}x{ow}): input {h}x{w}, window {window_p}, "
            f"padding (top, bottom, left, right) {pad}, stride {stride_p}"
        )
    return params, ((n, c, oh, ow) if layout == "NCHW" else (n, oh, ow, c))


def _check4(op: str, name: str, arr: Any) -> None:
    if arr.ndim != 4:
        raise ValueError(f"{op}: {name} must be 4-d, got shape {tuple(arr.shape)}")
    check_float(op, name, arr)


# --------------------------------------------------------------------------------------------
# NumPy reference: one strided slice per window position, in either layout.

def _index(layout: str, hs: slice, ws: slice) -> tuple:
    if layout == "NCHW":
        return (slice(None), slice(None), hs, ws)
    return (slice(None), hs, ws, slice(None))


def _pad(x: np.ndarray, pad: tuple[int, int, int, int], layout: str, value: float) -> np.ndarray:
    t, b, l, r = pad
    if not (t or b or l or r):
        return x
    shape = list(x.shape)
    ah, aw = (2, 3) if layout == "NCHW" else (1, 2)
    h, w = shape[ah], shape[aw]
    shape[ah] += t + b
    shape[aw] += l + r
    xp = np.full(shape, value, dtype=x.dtype)
    xp[_index(layout, slice(t, t + h), slice(l, l + w))] = x
    return xp


def _positions(p: PoolParams, oh: int, ow: int, layout: str):
    (kh, kw), (sh, sw) = p.window, p.stride
    for i in range(kh):
        for j in range(kw):
            yield _index(layout, slice(i, i + (oh - 1) * sh + 1, sh), slice(j, j + (ow - 1) * sw + 1, sw))


def _avg_divisor(p: PoolParams, h: int, w: int, oh: int, ow: int, layout: str, dtype) -> "np.ndarray | float":
    if p.mode == "avg_include_pad":
        return float(p.window[0] * p.window[1])
    t, _, l, _ = p.pad

    def counts(size: int, out: int, k: int, s: int, lo: int) -> np.ndarray:
        start = np.arange(out) * s - lo
        return np.minimum(start + k, size) - np.maximum(start, 0)

    cnt = np.outer(counts(h, oh, p.window[0], p.stride[0], t), counts(w, ow, p.window[1], p.stride[1], l))
    cnt = cnt.astype(dtype)
    return cnt if layout == "NCHW" else cnt[:, :, None]


def _tiles_nhwc(x: np.ndarray, p: PoolParams, oh: int, ow: int) -> np.ndarray:
    """Non-overlapping windows of an NHWC array as a ``(N, OH, KH, OW*KW, C)`` view.

    For a fixed window row the ``(OW*KW, C)`` block is one contiguous run of the input
    row, so elementwise work on it runs over long inner loops instead of C-sized ones.
    """
    (kh, kw), (sn, sh, sw, sc) = p.window, x.strides
    return as_strided(x, shape=(x.shape[0], oh, kh, ow * kw, x.shape[3]),
                      strides=(sn, sh * kh, sh, sw, sc), writeable=x.flags.writeable)


def _fast_path(p: PoolParams, layout: str) -> bool:
    """NHWC, no padding, stride == window: the common Keras MaxPooling2D/AveragePooling2D case."""
    return layout == "NHWC" and p.stride == p.window and not any(p.pad)


def _pool_forward_fast(x: np.ndarray, p: PoolParams, oh: int, ow: int) -> np.ndarray:
    (kh, kw), n, c = p.window, x.shape[0], x.shape[3]
    combine = np.maximum if p.mode == "max" else np.add
    t = _tiles_nhwc(x, p, oh, ow)
    # Reduce the window rows first, over long runs; the first combine allocates its result, so
    # no pass is spent copying the first row or column.
    rows = combine(t[:, :, 0], t[:, :, 1]) if kh > 1 else t[:, :, 0].copy()  # (N, OH, OW*KW, C)
    for i in range(2, kh):
        combine(rows, t[:, :, i], out=rows)
    rows = rows.reshape(n, oh, ow, kw, c)
    acc = combine(rows[:, :, :, 0], rows[:, :, :, 1]) if kw > 1 else rows[:, :, :, 0].copy()
    for j in range(2, kw):
        combine(acc, rows[:, :, :, j], out=acc)
    if p.mode != "max":
        acc /= kh * kw
    return acc


def _windows_nhwc(x: np.ndarray, p: PoolParams, oh: int, ow: int) -> np.ndarray:
    """Non-overlapping windows of an NHWC array as an ``(N, OH, KH, OW, KW, C)`` view."""
    (kh, kw), (sn, sh, sw, sc) = p.window, x.strides
    return as_strided(x, shape=(x.shape[0], oh, kh, ow, kw, x.shape[3]),
                      strides=(sn, sh * kh, sh, sw * kw, sw, sc), writeable=x.flags.writeable)


def _max_pool_backward_fast(dy: np.ndarray, x: np.ndarray, y: np.ndarray, p: PoolParams, oh: int,
                            ow: int) -> np.ndarray:
    """Max-pool gradient for the fast-path geometry, in three broadcast passes over ``x``.

    The hits ``x == y`` are stored one contiguous plane per window position, so that the
    first-maximum rule (each position loses to the hits of the positions before it) runs
    over long contiguous runs; the comparison and the final ``dy * hit`` each take one
    call over the whole input instead of one per window position.
    """
    (kh, kw), (n, h, w, c) = p.window, x.shape
    hits = np.empty((kh, kw, n, oh, ow, c), dtype=bool)
    hits_view = hits.transpose(2, 3, 0, 4, 1, 5)  # (N, OH, KH, OW, KW, C), as the windows
    np.equal(_windows_nhwc(x, p, oh, ow), y[:, :, None, :, None, :], out=hits_view)
    planes = hits.reshape(kh * kw, n, oh, ow, c)
    claimed = planes[0].copy() if kh * kw > 2 else planes[0]
    for k in range(1, kh * kw):
        np.greater(planes[k], claimed, out=planes[k])  # hit and not claimed before
        if k < kh * kw - 1:
            np.logical_or(claimed, planes[k], out=claimed)
    exact = oh * kh == h and ow * kw == w
    dx = np.empty_like(x, dtype=dy.dtype) if exact else np.zeros_like(x, dtype=dy.dtype)
    np.multiply(dy[:, :, None, :, None, :], hits_view, out=_windows_nhwc(dx, p, oh, ow))
    return dx


def _pool_forward(x: np.ndarray, p: PoolParams, layout: str) -> np.ndarray:
    tune_malloc_once()
    h, w = (x.shape[2], x.shape[3]) if layout == "NCHW" else (x.shape[1], x.shape[2])
    oh, ow = p.output_hw((h, w))
    if _fast_path(p, layout):
        return _pool_forward_fast(x, p, oh, ow)
    is_max = p.mode == "max"
    xp = _pad(x, p.pad, layout, -np.inf if is_max else 0.0)
    acc = None
    for idx in _positions(p, oh, ow, layout):
        if acc is None:
            acc = xp[idx].copy()
        elif is_max:
            np.maximum(acc, xp[idx], out=acc)
        else:
            acc += xp[idx]
    if not is_max:
        acc /= _avg_divisor(p, h, w, oh, ow, layout, acc.dtype)
    return acc


def _pool_backward(dy: np.ndarray, x: np.ndarray, y: np.ndarray, p: PoolParams, layout: str) -> np.ndarray:
    h, w = (x.shape[2], x.shape[3]) if layout == "NCHW" else (x.shape[1], x.shape[2])
    oh, ow = p.output_hw((h, w))
    if p.mode == "max" and _fast_path(p, layout):
        return _max_pool_backward_fast(dy, x, y, p, oh, ow)
    t, b, l, r = p.pad
    shape = list(x.shape)
    ah, aw = (2, 3) if layout == "NCHW" else (1, 2)
    shape[ah] += t + b
    shape[aw] += l + r
    # Windows that do not overlap own their inputs: assign instead of accumulate, and when they
    # also tile the input exactly, every element is assigned once and no zero fill is needed.
    overlap = p.stride[0] < p.window[0] or p.stride[1] < p.window[1]
    exact = not overlap and p.stride == p.window and oh * p.window[0] == shape[ah] and ow * p.window[1] == shape[aw]
    dxp = np.empty(shape, dtype=dy.dtype) if exact else np.zeros(shape, dtype=dy.dtype)
    if p.mode == "max":
        xp = _pad(x, p.pad, layout, -np.inf)
        last = p.window[0] * p.window[1] - 1
        unclaimed = None
        for k, idx in enumerate(_positions(p, oh, ow, layout)):
            hit = np.equal(xp[idx], y)
            if unclaimed is not None:
                hit &= unclaimed
            if k < last:  # the first maximum claims the window; later equal values get nothing
                unclaimed = np.logical_not(hit) if unclaimed is None else np.logical_xor(unclaimed, hit, out=unclaimed)
            if overlap:
                dxp[idx] += dy * hit
            else:
                np.multiply(dy, hit, out=dxp[idx])
    else:
        share = dy / _avg_divisor(p, h, w, oh, ow, layout, dy.dtype)
        for idx in _positions(p, oh, ow, layout):
            if overlap:
                dxp[idx] += share
            else:
                dxp[idx] = share
    return dxp[_index(layout, slice(t, t + h), slice(l, l + w))]


# --------------------------------------------------------------------------------------------
# Public ops.

def pool2d_forward(
    x: Any,
    *,
    mode: str = "max",
    window: Any = 2,
    stride: Any = None,
    padding: Any = 0,
    layout: str = "NCHW",
    out: Any = None,
    stream: Any = None,
) -> Any:
    """Pool ``x`` over ``window`` (height, width) patches; the result has ``x``'s dtype and layout.

    CUDA: ``_cuda.pooling.pool2d_forward(x, params=params, layout=layout, out=out, stream=stream)``
    with ``params`` the :class:`PoolParams` (mode normalised, stride filled in, explicit
    (top, bottom, left, right) padding).
    """
    op = "pool2d_forward"
    x = as_array(x)
    layout = check_layout(layout)
    _check4(op, "x", x)
    params, y_shape = pool_params(op, x.shape, mode=mode, window=window, stride=stride, padding=padding, layout=layout)
    check_out(op, out, y_shape, x.dtype)
    impl = route(op, "pooling", x=x, out=out)
    if impl is not None:
        return impl.pool2d_forward(x, params=params, layout=layout, out=out, stream=stream)
    return finish(_pool_forward(to_compute(x), params, layout), out, x.dtype)


def pool2d_backward(
    dy: Any,
    x: Any,
    y: Any,
    *,
    mode: str = "max",
    window: Any = 2,
    stride: Any = None,
    padding: Any = 0,
    layout: str = "NCHW",
    stream: Any = None,
) -> Any:
    """Gradient of :func:`pool2d_forward`: ``dx`` (``x``'s shape) from ``dy``, the forward's ``x`` and ``y``.

    The geometry arguments are those of the forward call.

    CUDA: ``_cuda.pooling.pool2d_backward(dy, x, y, params=params, layout=layout, stream=stream)``.
    """
    op = "pool2d_backward"
    dy, x, y = as_array(dy), as_array(x), as_array(y)
    layout = check_layout(layout)
    _check4(op, "x", x)
    params, y_shape = pool_params(op, x.shape, mode=mode, window=window, stride=stride, padding=padding, layout=layout)
    for name, arr in (("dy", dy), ("y", y)):
        if tuple(arr.shape) != y_shape or arr.dtype != x.dtype:
            raise ValueError(
                f"{op}: {name} has shape {tuple(arr.shape)} and dtype {arr.dtype}, expected the forward output "
                f"shape {y_shape} ({layout}) and dtype {x.dtype}"
            )
    impl = route(op, "pooling", dy=dy, x=x, y=y)
    if impl is not None:
        return impl.pool2d_backward(dy, x, y, params=params, layout=layout, stream=stream)
    dx = _pool_backward(to_compute(dy), to_compute(x), to_compute(y), params, layout)
    return finish(np.ascontiguousarray(dx), None, x.dtype)


def global_avg_pool2d_forward(x: Any, *, layout: str = "NCHW", out: Any = None, stream: Any = None) -> Any:
    """Mean over height and width: ``(N, C)`` from a 4-d ``x`` (as Keras GlobalAveragePooling2D).

    CUDA: ``_cuda.pooling.global_avg_pool2d_forward(x, layout=layout, out=out, stream=stream)``.
    """
    op = "global_avg_pool2d_forward"
    x = as_array(x)
    layout = check_layout(layout)
    _check4(op, "x", x)
    n, c = (x.shape[0], x.shape[1]) if layout == "NCHW" else (x.shape[0], x.shape[3])
    check_out(op, out, (n, c), x.dtype)
    impl = route(op, "pooling", x=x, out=out)
    if impl is not None:
        return impl.global_avg_pool2d_forward(x, layout=layout, out=out, stream=stream)
    axes = (2, 3) if layout == "NCHW" else (1, 2)
    return finish(to_compute(x).mean(axis=axes), out, x.dtype)


def global_avg_pool2d_backward(dy: Any, x_shape: Sequence[int], *, layout: str = "NCHW", stream: Any = None) -> Any:
    """Gradient of :func:`global_avg_pool2d_forward`: ``dy`` ``(N, C)`` spread evenly over ``x_shape``.

    CUDA: ``_cuda.pooling.global_avg_pool2d_backward(dy, x_shape, layout=layout, stream=stream)``
    with ``x_shape`` a tuple of 4 ints.
    """
    op = "global_avg_pool2d_backward"
    dy = as_array(dy)
    layout = check_layout(layout)
    x_shape = tuple(int(v) for v in x_shape)
    if len(x_shape) != 4:
        raise ValueError(f"{op}: x_shape must have 4 dimensions, got {x_shape}")
    check_float(op, "dy", dy)
    n, c, h, w = x_shape if layout == "NCHW" else (x_shape[0], x_shape[3], x_shape[1], x_shape[2])
    if tuple(dy.shape) != (n, c):
        raise ValueError(f"{op}: dy has shape {tuple(dy.shape)}, expected ({n}, {c}) for x_shape {x_shape} ({layout})")
    impl = route(op, "pooling", dy=dy)
    if impl is not None:
        return impl.global_avg_pool2d_backward(dy, x_shape, layout=layout, stream=stream)
    share = to_compute(dy) / (h * w)
    share = share[:, :, None, None] if layout == "NCHW" else share[:, None, None, :]
    return np.ascontiguousarray(np.broadcast_to(share, x_shape)).astype(dy.dtype, copy=False)
