"""A convolution followed by a training batch norm, with the statistics in the convolution's epilogue.

``conv2d_batchnorm_forward_training`` returns ``(y, out, saved)``: ``y`` the convolution's output,
``out`` the batch norm's (relu'd when asked), ``saved`` the batch norm's record for its backward.

**The fused path** (channels-last, groups 1, float16 / bfloat16 / float32 data, float32 parameters,
``config.fused_graphs``): one cuDNN graph plan ``y = conv_fprop(x, w)`` with ``genstats(y)`` writing the
per-channel float32 sum and sum of squares in the convolution's epilogue (``conv_graph.py``'s
``forward_genstats`` direction), then one kernel (``batchnorm.cu``'s ``bn_apply_sums_channels_last``,
16-byte loads and stores where C and the pointers allow; C <= :data:`APPLY_MAX_CHANNELS`) that finalizes the
statistics from the sums (mean, biased variance E[y^2] - mean^2, 1/sqrt(var + eps): as cuDNN's
bn_finalize, it loses digits to cancellation when a channel's |mean| is many times its standard deviation,
where the legacy batch norm does not; the cancellation is clamped at 0, never negative),
normalises ``y`` into ``out`` (with the relu) and, in its first block, writes the saved mean and 1/std
and updates the running statistics (Keras momentum, biased variance). What is saved against the two
ops: the batch norm's statistics pass over ``y``. The record's ``path`` is ``"cudnn_genstats"``;
:func:`~dnnbind.kernels.batchnorm_backward` takes it as it takes a record made by
hand (its *Ex path when cuDNN needs no reserve for the shape, else the legacy SPATIAL path, from the
saved mean and 1/std). With ``activation="relu"`` the record keeps beta, and the fused batch-norm + relu
backward (one cudnnBatchNormalizationBackwardEx) takes it where cuDNN needs no reserve for the shape (none
of the shapes measured on the H200 did); elsewhere the relu's backward runs apart.

**The choice**, per shape, is ``conv_graph.py``'s (plans cached and never evicted, nothing built or
measured while capturing, a refusal remembered, a pointer off 16 bytes or a key undecided in a capture
running the legacy path for that call). Under ``config.benchmark`` both paths are timed doing the same
job on scratch statistics, so the timing leaves the running statistics alone: the graph path is the
plan plus the normalisation kernel (plus, with the relu, the relu backward pass that its backward adds
where the fused backward cannot take the record); the legacy
path is the convolution and the batch norm's training call. Without ``config.benchmark`` the graph is
tried for float16 only (the measurements behind that are in ``conv_graph.py``'s doc).

**The legacy path** (everything else): ``conv.conv2d_forward`` then ``batchnorm.batchnorm_forward_training``.
"""

from __future__ import annotations

from typing import Any

from .._params import ConvParams
from ..batchnorm import BatchNormSaved
from . import _common as cm
from . import conv as conv_mod
from . import conv_graph
from .activation import activation_backward
from .batchnorm import GENSTATS, batchnorm_backward, batchnorm_forward_training, fused_backward_takes_genstats
from .elementwise import copy

__all__ = ["conv2d_batchnorm_forward_training", "batchnorm_relu_conv2d_backward", "GENSTATS"]


def _vector(width: int, channels: int, *arrays: Any) -> bool:
    """16-byte packs of ``width`` elements fit: C a multiple of ``width`` and every array 16-byte aligned."""
    return channels % width == 0 and cm.aligned16(*arrays)


APPLY_MAX_CHANNELS = 2048
"""The most output channels the normalising kernel's shared tables hold (16 KiB; more: the legacy path)."""
APPLY_BLOCKS_PER_SM = 8
"""Blocks per SM of the normalising kernel (256 threads each: 2,048 threads, an H100/H200 SM's limit)."""


def _apply(y: Any, out: Any, sums: Any, squares: Any, gamma: Any, beta: Any, running_mean: Any,
           running_var: Any, mean: Any, inv_std: Any, count: int, epsilon: float, momentum: float, relu: bool,
           s: Any) -> None:
    channels = int(y.shape[-1])
    n = y.size
    width = cm.vector_width(y.dtype)
    vector = _vector(width, channels, y, out)
    name = f"bn_apply_sums_channels_last_{'vec_' if vector else ''}{cm.suffix(y.dtype)}"
    items = n // width if vector else n
    # Every block first builds the C-entry tables: at most APPLY_BLOCKS_PER_SM blocks per SM (a full SM's
    # threads), so each thread strides over several items rather than the tables costing more than the pass.
    blocks = min(-(-items // cm.BLOCK), cm._sm_count(s.device_index) * APPLY_BLOCKS_PER_SM)
    cm.launch_rows("batchnorm.cu", name, blocks,
                   (cm.p(y), cm.p(out), cm.p(sums), cm.p(squares), cm.p(gamma), cm.p(beta), cm.p(running_mean),
                    cm.p(running_var), cm.p(mean), cm.p(inv_std), cm.i64(n), cm.i32(channels), cm.f32(count),
                    cm.f32(epsilon), cm.f32(momentum), cm.i32(relu)), s)


def _legacy_forward(x: Any, w: Any, y: Any, gamma: Any, beta: Any, running_mean: Any, running_var: Any,
                    momentum: float, epsilon: float, activation: "str | None", out: Any, params: ConvParams,
                    layout: str, s: Any) -> "tuple[Any, BatchNormSaved]":
    """The unfused path: the convolution into ``y``, then the batch norm's own training call."""
    conv_mod.conv2d_forward(x, w, params=params, layout=layout, out=y, stream=s)
    return batchnorm_forward_training(y, gamma, beta, running_mean, running_var, momentum=momentum, epsilon=epsilon,
                                      mode="spatial", layout=layout, activation=activation, out=out, stream=s)


def _legacy_backward(dy: Any, w: Any, x: Any, y: Any, gamma: Any, saved: BatchNormSaved, epsilon: float,
                     params: ConvParams, layout: str, s: Any) -> "tuple[Any, Any, Any]":
    """The unfused path: the convolution's data gradient, then the batch norm's backward with the relu."""
    dconv = conv_mod.conv2d_backward_data(dy, w, tuple(y.shape), params=params, layout=layout, stream=s)
    return batchnorm_backward(dconv, x, gamma, saved, epsilon=epsilon, mode="spatial", layout=layout,
                              activation="relu", y=y, stream=s)


def _forward_jobs(g: Any, x: Any, w: Any, gamma: Any, beta: Any, running_mean: Any, running_var: Any,
                  momentum: float, epsilon: float, activation: "str | None", y: Any, sums: Any, squares: Any,
                  count: int, params: ConvParams, s: Any) -> tuple:
    """(legacy, tail): what the choice times, on scratch statistics and outputs (made at the first timed run)."""
    relu = activation == "relu"
    scratch: dict = {}

    def spare(name: str, like: Any) -> Any:
        if name not in scratch:
            scratch[name] = copy(like, stream=s) if name in ("rm", "rv") else cm.empty(like.shape, like.dtype, s)
        return scratch[name]

    def legacy() -> None:
        _legacy_forward(x, w, y, gamma, beta, spare("rm", running_mean), spare("rv", running_var), momentum, epsilon,
                        activation, spare("out", y), params, g.layout, s)

    def tail() -> None:
        o = spare("out", y)
        _apply(y, o, sums, squares, gamma, beta, spare("rm", running_mean), spare("rv", running_var),
               spare("mean", gamma), spare("inv", gamma), count, epsilon, momentum, relu, s)
        # the relu's backward apart, when the fused batch-norm + relu backward cannot take this record
        if relu and not fused_backward_takes_genstats(y, s):
            activation_backward(o, o, o, "relu", stream=s)

    return legacy, tail


def _fused(g: Any, key: Any, x: Any, w: Any, gamma: Any, beta: Any, running_mean: Any, running_var: Any,
           momentum: float, epsilon: float, activation: "str | None", y: Any, out: Any, params: ConvParams,
           s: Any) -> "tuple[Any, BatchNormSaved] | None":
    """The graph path into ``y`` when ``key``'s choice is the graph: (out, saved); else None."""
    if not conv_graph.will_try(key, s):
        return None
    k = g.w_kcrs[0]
    sums, squares = cm.empty((k,), cm.F32, s), cm.empty((k,), cm.F32, s)
    xin = conv_mod._padded_input(x, g, s)
    count = y.size // k
    relu = activation == "relu"
    legacy = tail = None
    if not conv_graph.decided(key):  # the two jobs the choice times (made once per key)
        legacy, tail = _forward_jobs(g, x, w, gamma, beta, running_mean, running_var, momentum, epsilon, activation,
                                     y, sums, squares, count, params, s)
    if not conv_mod._graph_run("forward_genstats", g, s, cm.cudnn_handle(s), (xin.ptr, w.ptr, y.ptr, sums.ptr,
                               squares.ptr), "conv2d_batchnorm_forward_training (conv + genstats)", legacy, tail, key):
        return None
    out = cm.output(out, y.shape, y.dtype, s)
    mean, inv_std = cm.empty((k,), cm.F32, s), cm.empty((k,), cm.F32, s)
    _apply(y, out, sums, squares, gamma, beta, running_mean, running_var, mean, inv_std, count, epsilon, momentum,
           relu, s)
    return out, BatchNormSaved(mean, inv_std, path=GENSTATS, x_shape=tuple(y.shape), x_dtype=y.dtype,
                               activation=activation, beta=beta if relu else None)


def conv2d_batchnorm_forward_training(x: Any, w: Any, gamma: Any, beta: Any, running_mean: Any, running_var: Any,
                                      *, params: ConvParams, momentum: float = 0.99, epsilon: float = 1e-3,
                                      activation: "str | None" = None, layout: str = "NCHW", out: Any = None,
                                      stream: Any = None) -> "tuple[Any, Any, BatchNormSaved]":
    """(y, out, saved); updates running_mean/running_var in place (see the module doc for the paths)."""
    s = cm.stream_of(stream)
    g = conv_mod._geometry(x.shape, w.shape, params, layout, x.dtype)
    y = cm.empty(g.layout_shape(g.y_dims), x.dtype, s)
    if (cm.config().fused_graphs and g.w_kcrs[0] <= APPLY_MAX_CHANNELS and gamma.dtype == cm.F32
            and beta.dtype == cm.F32 and running_mean.dtype == cm.F32 and running_var.dtype == cm.F32):
        key = conv_mod.graph_key("forward_genstats", g, s.device_index)
        if key is not None:
            result = _fused(g, key, x, w, gamma, beta, running_mean, running_var, momentum, epsilon, activation, y,
                            out, params, s)
            if result is not None:
                return (y, *result)
    return (y, *_legacy_forward(x, w, y, gamma, beta, running_mean, running_var, momentum, epsilon, activation, out,
                                params, layout, s))


# ------------------------------------------------------------------------------------------ backward

def _dx(dz: Any, x: Any, dx: Any, eq_dy: Any, eq_x: Any, eq_b: Any, s: Any) -> None:
    channels, n = int(x.shape[-1]), x.size
    width = cm.vector_width(x.dtype)
    vector = _vector(width, channels, dz, x, dx, eq_dy, eq_x, eq_b)
    name = f"bn_dx_coefficients_{'vec_' if vector else ''}{cm.suffix(x.dtype)}"
    cm.launch("batchnorm.cu", name, n // width if vector else n,
              (cm.p(dz), cm.p(x), cm.p(dx), cm.p(eq_dy), cm.p(eq_x), cm.p(eq_b), cm.i64(n), cm.i32(channels)), s)


def batchnorm_relu_conv2d_backward(dy: Any, w: Any, x: Any, y: Any, gamma: Any, beta: Any, saved: BatchNormSaved,
                                   *, params: ConvParams, epsilon: float = 1e-3, layout: str = "NCHW",
                                   stream: Any = None) -> "tuple[Any, Any, Any]":
    """(dx, dgamma, dbeta) of conv(relu(batchnorm(x))) from the convolution's output gradient ``dy``.

    **The fused path** (channels-last, groups 1, symmetric padding, float32 statistics and parameters,
    ``config.fused_graphs``): one cuDNN graph plan (``conv_graph.py``'s ``backward_data_drelu_dbn``:
    the convolution's data gradient, the relu's backward with its mask recomputed from ``x`` and the
    saved statistics, and dbn_weight: dgamma, dbeta and the coefficients of dx), then one kernel
    (``batchnorm.cu``'s ``bn_dx_coefficients``) for ``dx = eq_dy * dz + eq_x * x + eq_b``. The choice is
    made as for the forward (measured under ``config.benchmark``, else float16 only); the legacy path is
    ``conv2d_backward_data`` then ``batchnorm_backward`` with the relu (``y``, the relu's output and the
    convolution's input, gives its mask there).
    """
    s = cm.stream_of(stream)
    g = conv_mod._geometry(y.shape, w.shape, params, layout, dy.dtype)
    c = int(x.shape[-1])
    if (cm.config().fused_graphs and g.explicit is None
            and all(a.dtype == cm.F32 for a in (gamma, beta, saved.mean, saved.inv_std))):
        key = conv_mod.graph_key("backward_data_drelu_dbn", g, s.device_index)
        if key is not None and conv_graph.will_try(key, s):
            dz = cm.empty(x.shape, x.dtype, s)
            coeffs = [cm.empty((c,), cm.F32, s) for _ in range(5)]  # dscale, dbias, eq_dy, eq_x, eq_b
            ptrs = (dy.ptr, w.ptr, x.ptr, saved.mean.ptr, saved.inv_std.ptr, gamma.ptr, beta.ptr, dz.ptr,
                    *(a.ptr for a in coeffs))

            legacy = tail = None
            if not conv_graph.decided(key):  # the two jobs the choice times (made once per key)
                def legacy() -> None:
                    _legacy_backward(dy, w, x, y, gamma, saved, epsilon, params, layout, s)

                def tail() -> None:
                    _dx(dz, x, cm.empty(x.shape, x.dtype, s), *coeffs[2:], s)

            if conv_mod._graph_run("backward_data_drelu_dbn", g, s, cm.cudnn_handle(s), ptrs,
                                   "batchnorm_relu_conv2d_backward (dgrad + drelu + dbn_weight)", legacy, tail, key):
                dx = cm.empty(x.shape, x.dtype, s)
                _dx(dz, x, dx, *coeffs[2:], s)
                return dx, coeffs[0], coeffs[1]
    return _legacy_backward(dy, w, x, y, gamma, saved, epsilon, params, layout, s)
