"""2-d pooling on cuDNN (cudnnPoolingForward / cudnnPoolingBackward), both layouts, except
non-overlapping channels-last max pooling (stride == window, no padding: Keras ``MaxPooling2D``'s
default), which runs dnnbind's kernels (``layout.cu``: ``maxpool2d_fwd_nhwc`` / ``maxpool2d_bwd_nhwc``)
while ``MAXPOOL_NHWC_KERNELS`` is True.

Modes: ``max`` (CUDNN_POOLING_MAX, or MAX_DETERMINISTIC under ``config.deterministic``),
``avg`` (average excluding padding), ``avg_include_pad``.

Asymmetric padding (Keras ``"same"``) cannot go in the descriptor, so it is made explicit:

* max: pad the input with -inf (``pad2d``), pool with pad 0; backward pools the same
  padded input and crops the gradient's interior (``crop2d``).
* avg_include_pad: pad with zeros, pool with pad 0 (the divisor is the window area).
* avg (exclude padding): pad with zeros, pool "include padding" with pad 0, then multiply
  each output position by area / (number of real pixels in its window), a float32 (Ho, Wo)
  map built on the host once per shape key and uploaded once. Backward multiplies dy by the
  same map, runs the include-padding backward and crops.

Global average pooling is a row reduction (``reduce_rows`` / ``reduce_mid``) and a broadcast.

Descriptors are the public :mod:`dnnbind.cudnn` ones (``cached``), held by a bounded cache of
plans, one per (x shape, parameters, layout, dtype, deterministic).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ... import cudnn
from ..._lib import cudnn as C
from ...cuda.array import constant
from .._params import PoolParams
from . import _common as cm
from .reshaping import crop_nchw, pad_nchw

__all__ = ["pool2d_forward", "pool2d_backward", "global_avg_pool2d_forward", "global_avg_pool2d_backward"]

PLAN_CACHE_SIZE = 256
"""Pooling plans (shapes, parameters and their descriptors) kept."""

MAXPOOL_NHWC_KERNELS: bool = True
"""True: non-overlapping NHWC max pooling runs dnnbind's kernels both ways (16-byte accesses over
channels; on an H200 cuDNN's pooling_fw_kernel_max_nhwc took 97 us for airbench94's 1024x31x31x64
bfloat16 input); False: cuDNN's, for comparison."""
# The switch changes the kernels a step captures: a captured step is keyed by it.
cm.config().register_switches(__name__, lambda: (MAXPOOL_NHWC_KERNELS,))

# Exclude-padding maps by (device, (H, W), params). Never evicted: a captured step graph
# addresses the map it was captured with, and nothing tells this module when that graph dies.
_maps: dict = {}


class _Plan:
    """How one (x shape, params, layout, dtype) is pooled."""

    def __init__(self, x_shape, params: PoolParams, layout: str, dtype) -> None:
        self.layout = layout
        self.dtype = np.dtype(dtype)
        self.params = params
        self.x_dims = cm.nchw_dims(x_shape, layout)
        n, c, h, w = self.x_dims
        oh, ow = params.output_hw((h, w))
        self.y_dims = (n, c, oh, ow)
        t, b, l, r = params.pad
        self.explicit = None if params.symmetric else params.pad
        if self.explicit is None:
            self.xp_dims, desc_pad = self.x_dims, (t, l)
        else:
            self.xp_dims, desc_pad = (n, c, h + t + b, w + l + r), (0, 0)
        if params.mode == "max":
            mode = C.PoolingMode.MAX_DETERMINISTIC if cm.config().deterministic else C.PoolingMode.MAX
        elif params.mode == "avg_include_pad" or self.explicit is not None:
            mode = C.PoolingMode.AVERAGE_COUNT_INCLUDE_PADDING
        else:
            mode = C.PoolingMode.AVERAGE_COUNT_EXCLUDE_PADDING
        self.mode = mode
        self.needs_map = params.mode == "avg" and self.explicit is not None
        # nan_propagation: a NaN in a window shows in the output, as in NumPy.
        self.pool_desc = cudnn.PoolingDescriptor.cached(mode, params.window, desc_pad, params.stride, True)
        self.x_desc = cudnn.TensorDescriptor.cached(self.layout_shape(self.xp_dims), self.dtype, layout)
        self.y_desc = cudnn.TensorDescriptor.cached(self.layout_shape(self.y_dims), self.dtype, layout)
        self.pad_value = float("-inf") if params.mode == "max" else 0.0

    def layout_shape(self, dims: tuple) -> tuple:
        n, c, h, w = dims
        return dims if self.layout == "NCHW" else (n, h, w, c)

    def context(self, function: str) -> dict:
        return {"function": function, "x shape (N,C,H,W)": self.x_dims, "pooled shape": self.xp_dims,
                "y shape": self.y_dims, "layout": self.layout, "dtype": str(self.dtype),
                "mode": self.params.mode, "window": self.params.window, "stride": self.params.stride,
                "padding (t,b,l,r)": self.params.pad}


_plans = cudnn.LRUCache(PLAN_CACHE_SIZE, "pool2d plans")


def _plan(x_shape, params: PoolParams, layout: str, dtype) -> _Plan:
    if not isinstance(dtype, np.dtype):
        dtype = np.dtype(dtype)
    # dtype objects hash and compare by value (bfloat16 included): no str() per call.
    key = (tuple(x_shape), params, layout, dtype, bool(cm.config().deterministic))
    plan = _plans.get(key)
    if plan is None:
        plan = _plans.put(key, _Plan(x_shape, params, layout, dtype))
    return plan


def exclude_pad_map(x_hw, params: PoolParams) -> np.ndarray:
    """float32 (Ho, Wo): window area / number of real (unpadded) pixels in each window."""
    (kh, kw), (sh, sw) = params.window, params.stride
    t, _, l, _ = params.pad
    oh, ow = params.output_hw(x_hw)

    def counts(size: int, out: int, k: int, s: int, lo: int) -> np.ndarray:
        start = np.arange(out) * s - lo
        return np.minimum(start + k, size) - np.maximum(start, 0)

    cnt = np.outer(counts(x_hw[0], oh, kh, sh, t), counts(x_hw[1], ow, kw, sw, l)).astype(np.float64)
    return np.ascontiguousarray((kh * kw) / np.maximum(cnt, 1.0), dtype=np.float32)


def _map(plan: _Plan, stream) -> Any:
    key = (stream.device_index, plan.x_dims[2:], plan.params)
    m = _maps.get(key)
    if m is None:
        m = constant(exclude_pad_map(plan.x_dims[2:], plan.params), stream=stream)
        if not stream.is_capturing():  # made in a capture it is graph memory: it dies with the step
            _maps[key] = m
    return m


def _scale_by_map(src: Any, dst: Any, plan: _Plan, stream) -> None:
    n, c, oh, ow = plan.y_dims
    cm.launch("layout.cu", f"scale_hw_{cm.suffix(src.dtype)}", n * c * oh * ow,
              (cm.p(src), cm.p(dst), cm.p(_map(plan, stream)), cm.i64(n * c * oh * ow), cm.i32(c),
               cm.i32(oh * ow), cm.i32(plan.layout == "NHWC")), stream)


def _padded(x: Any, plan: _Plan, stream) -> Any:
    if plan.explicit is None:
        return x
    return pad_nchw(x, plan.x_dims, plan.explicit, plan.layout, plan.pad_value, stream)


def pool2d_forward(x: Any, *, params: PoolParams, layout: str = "NCHW", out: Any = None,
                   stream: Any = None) -> Any:
    """Pooled ``y`` of shape (N, C, Ho, Wo) in ``layout``."""
    s = cm.stream_of(stream)
    if _own_maxpool(params, layout):
        return _maxpool_forward_nhwc(x, out, params, s)
    plan = _plan(x.shape, params, layout, x.dtype)
    y = cm.output(out, plan.layout_shape(plan.y_dims), x.dtype, s)
    xin = _padded(x, plan, s)
    handle = cm.cudnn_handle(s)  # held for the call (the plan holds the descriptors)
    try:
        C.cudnnPoolingForward(handle.handle, plan.pool_desc.handle, cm.ONE.of(plan.dtype), plan.x_desc.handle, xin.ptr,
                              cm.ZERO.of(plan.dtype), plan.y_desc.handle, y.ptr)
    except cm.CudnnError as exc:
        exc.add_context(**plan.context("cudnnPoolingForward"))
        raise
    if plan.needs_map:
        _scale_by_map(y, y, plan, s)
    return y


def pool2d_backward(dy: Any, x: Any, y: Any, *, params: PoolParams, layout: str = "NCHW",
                    stream: Any = None) -> Any:
    """``dx`` (the shape of ``x``) from ``dy``, the forward input ``x`` and output ``y``."""
    s = cm.stream_of(stream)
    if _own_maxpool(params, layout):
        return _maxpool_backward_nhwc(dy, x, y, params, s)
    plan = _plan(x.shape, params, layout, x.dtype)
    dx = cm.empty(x.shape, x.dtype, s)
    xin = _padded(x, plan, s)
    dxp = dx if plan.explicit is None else cm.empty(plan.layout_shape(plan.xp_dims), x.dtype, s)
    g = dy
    if plan.needs_map:
        g = cm.empty(dy.shape, dy.dtype, s)
        _scale_by_map(dy, g, plan, s)
    handle = cm.cudnn_handle(s)
    y_desc, x_desc = plan.y_desc.handle, plan.x_desc.handle
    try:
        C.cudnnPoolingBackward(handle.handle, plan.pool_desc.handle, cm.ONE.of(plan.dtype), y_desc, y.ptr, y_desc,
                               g.ptr, x_desc, xin.ptr, cm.ZERO.of(plan.dtype), x_desc, dxp.ptr)
    except cm.CudnnError as exc:
        exc.add_context(**plan.context("cudnnPoolingBackward"))
        raise
    if plan.explicit is not None:
        crop_nchw(dxp, plan.x_dims, plan.explicit, layout, dx, s)
    return dx


def _own_maxpool(params: PoolParams, layout: str) -> bool:
    """Non-overlapping NHWC max pooling (stride == window, no padding), with the kernels switched on."""
    return (MAXPOOL_NHWC_KERNELS and params.mode == "max" and layout == "NHWC" and params.window == params.stride
            and params.pad == (0, 0, 0, 0))


def _vector(c: int, dtype: Any, arrays: tuple) -> bool:
    """16-byte accesses over channels: whole vectors fit C and every array is 16-byte aligned."""
    return c % cm.vector_width(dtype) == 0 and cm.aligned16(*arrays)


def _maxpool_forward_nhwc(x: Any, out: Any, params: PoolParams, s: Any) -> Any:
    """Non-overlapping NHWC max pooling: one coalesced kernel instead of cudnnPoolingForward. Leftover
    rows/columns (past the last full window) are in no window, as cuDNN's output size has it."""
    n, h, w, c = x.shape  # a DeviceArray's shape is a tuple of ints
    kh, kw = params.window
    oh, ow = params.output_hw((h, w))
    y = cm.output(out, (n, oh, ow, c), x.dtype, s)
    total = n * oh * ow * c
    vw = 16 // x.dtype.itemsize if _vector(c, x.dtype, (x, y)) else 1
    cm.launch("layout.cu", f"maxpool2d_fwd_nhwc_{cm.suffix(x.dtype)}", total // vw,
              (cm.p(x), cm.p(y), cm.i64(total), cm.i32(h), cm.i32(w), cm.i32(c), cm.i32(oh), cm.i32(ow), cm.i32(kh),
               cm.i32(kw), cm.i32(vw > 1)), s)
    return y


def _maxpool_backward_nhwc(dy: Any, x: Any, y: Any, params: PoolParams, s: Any) -> Any:
    """Non-overlapping NHWC max pooling: one coalesced kernel instead of cudnnPoolingBackward. The
    kernel also writes the zeros of the rows/columns past the last window (no memset of all of dx)."""
    n, h, w, c = x.shape  # a DeviceArray's shape is a tuple of ints
    oh, ow = int(y.shape[1]), int(y.shape[2])
    kh, kw = params.window
    dx = cm.empty(x.shape, x.dtype, s)
    if oh == 0 or ow == 0:  # no window at all: every element is a leftover
        dx.fill_zero(s)
        return dx
    vw = 16 // x.dtype.itemsize if _vector(c, x.dtype, (x, y, dy, dx)) else 1
    cm.launch("layout.cu", f"maxpool2d_bwd_nhwc_{cm.suffix(x.dtype)}", int(dy.size) // vw,
              (cm.p(x), cm.p(y), cm.p(dy), cm.p(dx), cm.i64(int(dy.size)), cm.i32(h), cm.i32(w), cm.i32(c),
               cm.i32(oh), cm.i32(ow), cm.i32(kh), cm.i32(kw), cm.i32(vw > 1)), s)
    return dx


def global_avg_pool2d_forward(x: Any, *, layout: str = "NCHW", out: Any = None, stream: Any = None) -> Any:
    """(N, C) means over H and W (deterministic fixed-order sums)."""
    s = cm.stream_of(stream)
    n, c, h, w = cm.nchw_dims(x.shape, layout)
    y = cm.output(out, (n, c), x.dtype, s)
    sfx = cm.suffix(x.dtype)
    scale = 1.0 / (h * w) if h * w else float("nan")
    if layout == "NCHW":
        cm.launch_rows("elementwise.cu", f"reduce_rows_{sfx}", n * c,
                       (cm.p(x), cm.p(y), cm.i64(n * c), cm.i64(h * w), cm.f64(scale)), s)
    else:
        cm.launch("elementwise.cu", f"reduce_mid_{sfx}", n * c,
                  (cm.p(x), cm.p(y), cm.i64(n), cm.i64(h * w), cm.i64(c), cm.f64(scale)), s)
    return y


def global_avg_pool2d_backward(dy: Any, x_shape, *, layout: str = "NCHW", stream: Any = None) -> Any:
    """``dx[n, c, h, w] = dy[n, c] / (H * W)`` in ``layout``."""
    s = cm.stream_of(stream)
    n, c, h, w = cm.nchw_dims(x_shape, layout)
    dx = cm.empty(tuple(x_shape), dy.dtype, s)
    cm.launch("layout.cu", f"broadcast_hw_{cm.suffix(dy.dtype)}", n * c * h * w,
              (cm.p(dy), cm.p(dx), cm.i64(n * c * h * w), cm.i32(c), cm.i32(h * w), cm.i32(layout == "NHWC"),
               cm.f64(1.0 / (h * w) if h * w else 0.0)), s)
    return dx
