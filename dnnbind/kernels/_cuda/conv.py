"""2-d convolution on cuDNN: forward, backward data, backward filter, bias add/grad, fused
conv + bias + activation.

cuDNN calls: cudnnConvolutionForward / BackwardData / BackwardFilter (algorithms from
:mod:`dnnbind.cudnn.algo`), cudnnConvolutionBiasActivationForward, on the public
:mod:`dnnbind.cudnn` descriptors; the fused conv + bias + activation graph of ``fused.py``
(cuDNN graph API) where it is chosen, and the plain convolutions as graph plans of ``conv_graph.py``
where chosen (channels-last, groups 1: a legacy call costs cuDNN 9 a graph rebuild on the host);
NVRTC kernels from ``layout.cu`` for explicit padding, cropping and the bias add/reduction.

Asymmetric padding (Keras ``padding="same"`` with an even window or stride > 1) cannot be
put in a cuDNN descriptor. It is done exactly instead: the input is copied into a
zero-filled buffer padded by (top, bottom, left, right) (``pad2d``), the convolution runs
with pad 0; backward data computes the gradient of the padded input and crops its interior
out (``crop2d``); backward filter convolves the padded input. Symmetric padding goes into the
descriptor as usual.

Filters: NCHW uses KCRS, NHWC uses KRSC (``(K, R, S, C/groups)``). All computations
accumulate in float32 (float64 for float64 data); fp16/bf16 run with tensor-op math, fp32
with TF32 when ``config.allow_tf32`` (CUDNN_DEFAULT_MATH) and strict FMA math otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ... import cudnn
from ..._lib import cudnn as C
from ...cudnn import algo
from .._params import ConvParams
from . import _common as cm
from . import activation as act_mod
from . import colsum, conv_graph, fused
from .reshaping import crop_nchw, pad_nchw, transpose

__all__ = [
    "conv2d_forward",
    "conv2d_backward_data",
    "conv2d_backward_filter",
    "bias_add",
    "bias_backward",
    "conv2d_bias_activation_forward",
]

GEOMETRY_CACHE_SIZE = 256
"""Convolution geometries (shapes, parameters, layout, dtype and their descriptors) kept."""


@dataclass(frozen=True)
class _Geometry:
    """Descriptors and shapes of one (x, w, params, layout, dtype) combination, cached."""

    layout: str
    dtype: np.dtype
    x_dims: tuple  # (N, C, H, W) of the user's x
    xp_dims: tuple  # (N, C, H, W) cuDNN sees (padded when the padding is explicit)
    w_kcrs: tuple
    y_dims: tuple
    explicit: "tuple[int, int, int, int] | None"  # (top, bottom, left, right) done by pad2d
    desc_pad: tuple  # (pad_h, pad_w) in the descriptor
    params: ConvParams
    # The descriptors stay out of eq/hash, which the fields above decide.
    x_desc: cudnn.TensorDescriptor = field(compare=False)  # describes xp_dims
    w_desc: cudnn.FilterDescriptor = field(compare=False)
    y_desc: cudnn.TensorDescriptor = field(compare=False)
    # Their raw handles, read once (each call passes them; the objects above own them and live as
    # long as this geometry).
    x: int = field(init=False, compare=False, repr=False)
    w: int = field(init=False, compare=False, repr=False)
    y: int = field(init=False, compare=False, repr=False)
    # ConvKeys built so far, by (direction, device, config switches); not part of eq/hash.
    keys: dict = field(default_factory=dict, compare=False, hash=False, repr=False)

    def __post_init__(self) -> None:
        for name in ("x", "w", "y"):
            object.__setattr__(self, name, getattr(self, f"{name}_desc").handle)

    def layout_shape(self, dims: tuple) -> tuple:
        n, c, h, w = dims
        return dims if self.layout == "NCHW" else (n, h, w, c)

    def key(self, direction: str, device: int) -> algo.ConvKey:
        cfg = cm.config()
        # Everything ConvKey reads from the config is in the memo key, so a change of
        # allow_tf32/workspace_limit/deterministic/benchmark still gives a fresh key.
        memo = (direction, device, cfg.allow_tf32, cfg.workspace_limit, cfg.deterministic, cfg.benchmark)
        hit = self.keys.get(memo)
        if hit is None:
            hit = self.keys[memo] = self._make_key(direction, device, cfg)
        return hit

    def _make_key(self, direction: str, device: int, cfg: Any) -> algo.ConvKey:
        return algo.ConvKey(
            direction=direction, device=device, x_dims=self.xp_dims, w_dims=self.w_kcrs, y_dims=self.y_dims,
            dtype=str(self.dtype), layout=self.layout, pad=self.desc_pad, stride=self.params.stride,
            dilation=self.params.dilation, groups=self.params.groups,
            math=algo.math_for(self.dtype, cfg.allow_tf32), workspace_limit=cfg.workspace_limit,
            deterministic=bool(cfg.deterministic), benchmark=bool(cfg.benchmark),
        )

    def context(self, function: str, choice: "algo.AlgoChoice | None" = None) -> dict:
        ctx = {
            "function": function,
            "x shape (N,C,H,W)": self.x_dims,
            "padded x shape" if self.explicit else "x shape seen by cuDNN": self.xp_dims,
            "x strides (elements)": self.x_desc.get().strides,
            "w shape (K,C/g,R,S)": self.w_kcrs,
            "y shape (N,K,P,Q)": self.y_dims,
            "y strides (elements)": self.y_desc.get().strides,
            "layout": self.layout,
            "dtype": str(self.dtype),
            "stride": self.params.stride,
            "padding (t,b,l,r)": self.params.pad,
            "dilation": self.params.dilation,
            "groups": self.params.groups,
        }
        if choice is not None:
            ctx["algorithm"] = f"{choice.name} ({choice.source}, workspace {choice.workspace} B, " \
                               f"math {choice.math.name})"
        return ctx


_geometries = cudnn.LRUCache(GEOMETRY_CACHE_SIZE, "conv2d geometries")


def _kcrs(w_shape, layout: str) -> tuple:
    if layout == "NCHW":
        return tuple(int(v) for v in w_shape)
    k, r, s, c = (int(v) for v in w_shape)
    return (k, c, r, s)


def _geometry(x_shape, w_shape, params: ConvParams, layout: str, dtype) -> _Geometry:
    if not isinstance(dtype, np.dtype):
        dtype = np.dtype(dtype)
    # dtype objects hash and compare by value (bfloat16 included): no str() per call.
    key = (tuple(x_shape), tuple(w_shape), params, layout, dtype)
    g = _geometries.get(key)
    if g is not None:
        return g
    x_dims = cm.nchw_dims(x_shape, layout)
    w_kcrs = _kcrs(w_shape, layout)
    t, b, l, r = params.pad
    if params.symmetric:
        explicit, desc_pad, xp_dims = None, (t, l), x_dims
    else:
        explicit, desc_pad = params.pad, (0, 0)
        xp_dims = (x_dims[0], x_dims[1], x_dims[2] + t + b, x_dims[3] + l + r)
    oh, ow = params.output_hw(x_dims[2:], w_kcrs[2:])
    y_dims = (x_dims[0], w_kcrs[0], oh, ow)
    g = _Geometry(
        layout=layout, dtype=dtype, x_dims=x_dims, xp_dims=xp_dims, w_kcrs=w_kcrs, y_dims=y_dims,
        explicit=explicit, desc_pad=desc_pad, params=params,
        x_desc=_tensor(xp_dims, dtype, layout), w_desc=cudnn.FilterDescriptor.cached(_layout_order(w_kcrs, layout),
                                                                                    dtype, layout),
        y_desc=_tensor(y_dims, dtype, layout),
    )
    return _geometries.put(key, g)


def _layout_order(dims_nchw: tuple, layout: str) -> tuple:
    """(N, C, H, W) (or (K, C, R, S)) in ``layout``'s axis order, what the descriptors take."""
    n, c, h, w = dims_nchw
    return dims_nchw if layout == "NCHW" else (n, h, w, c)


def _tensor(dims_nchw: tuple, dtype: np.dtype, layout: str) -> cudnn.TensorDescriptor:
    return cudnn.TensorDescriptor.cached(_layout_order(dims_nchw, layout), dtype, layout)


def _padded_input(x: Any, g: _Geometry, stream) -> Any:
    return x if g.explicit is None else pad_nchw(x, g.x_dims, g.explicit, g.layout, 0.0, stream)


def _run(direction: str, g: _Geometry, stream, buffers: tuple, function: str, call) -> None:
    """Run one convolution: the cuDNN graph plan ``conv_graph.py`` chose for this shape key (channels-last,
    groups 1, ``config.fused_graphs``), else the legacy call. ``buffers``: the x, w, y-role pointers."""
    handle = cm.cudnn_handle(stream)
    if cm.config().fused_graphs and _graph_run(
            direction, g, stream, handle, buffers, function,
            lambda: _legacy_run(direction, g, stream, handle, buffers, function, call)):
        return
    _legacy_run(direction, g, stream, handle, buffers, function, call)


def graph_key(direction: str, g: _Geometry, device: int) -> "conv_graph.ConvGraphKey | None":
    """``conv_graph``'s key of ``direction`` for geometry ``g`` (None: no graph is tried), memoised on the geometry
    as its ConvKeys are (by every setting the key reads: deterministic decides whether keys exist)."""
    cfg = cm.config()
    memo = ("graph", direction, device, cfg.allow_tf32, cfg.benchmark, cfg.workspace_limit, cfg.deterministic,
            conv_graph.FORCE_GRAPH)
    key = g.keys.get(memo, False)
    if key is False:
        key = g.keys[memo] = conv_graph.conv_key(
            direction, device, g.xp_dims, g.w_kcrs, g.y_dims, g.desc_pad, g.params.stride, g.params.dilation,
            g.params.groups, g.dtype, g.layout)
    return key


def _graph_run(direction: str, g: _Geometry, stream, handle, buffers: tuple, function: str, legacy,
               tail=None, key: Any = False) -> bool:
    """The convolution (or ``conv_bn.py``'s fused direction) as a cuDNN graph plan where ``conv_graph.py``
    chose one: True when it ran. ``key``: the caller's :func:`graph_key`, if it has it."""
    if key is False:
        key = graph_key(direction, g, stream.device_index)
    if key is None:
        return False
    try:
        return conv_graph.convolution(key, handle, stream, buffers, legacy, tail)
    except cm.CudnnError as exc:
        for name, value in g.context(f"{function} as a cuDNN graph plan (cudnnBackendExecute)").items():
            exc.context.setdefault(name, value)
        exc.add_context()
        raise


def _legacy_run(direction: str, g: _Geometry, stream, handle, buffers: tuple, function: str, call) -> None:
    """Choose the algorithm (cached), get its workspace, make the cuDNN call with context on errors."""
    key = g.key(direction, stream.device_index)
    choice = None
    try:
        choice = algo.choose(key, handle, g.x_desc, g.w_desc, g.y_desc, stream, buffers)
        raw = handle.handle
        algo.run_with_workspace(key, choice, stream, handle, g.x_desc, g.w_desc, g.y_desc,
                                lambda ch, ws: call(raw, ch, ws))
    except cm.CudnnError as exc:
        for name, value in g.context(function, choice).items():
            exc.context.setdefault(name, value)
        exc.add_context()
        raise


# ------------------------------------------------------------------------------------ ops

def conv2d_forward(x: Any, w: Any, *, params: ConvParams, layout: str = "NCHW", out: Any = None,
                   stream: Any = None) -> Any:
    """``y = conv(x, w)`` (cross-correlation); y is (N, K, P, Q) in ``layout``."""
    s = cm.stream_of(stream)
    g = _geometry(x.shape, w.shape, params, layout, x.dtype)
    y = cm.output(out, g.layout_shape(g.y_dims), x.dtype, s)
    xin = _padded_input(x, g, s)
    one, zero = cm.ONE.of(g.dtype), cm.ZERO.of(g.dtype)

    def call(handle, choice, ws):
        C.cudnnConvolutionForward(handle, one, g.x, xin.ptr, g.w, w.ptr, choice.conv, choice.algo, ws,
                                  choice.workspace, zero, g.y, y.ptr)

    _run("forward", g, s, (xin.ptr, w.ptr, y.ptr), "cudnnConvolutionForward", call)
    return y


def conv2d_backward_data(dy: Any, w: Any, x_shape, *, params: ConvParams, layout: str = "NCHW",
                         out: Any = None, stream: Any = None) -> Any:
    """``dx`` of shape ``x_shape`` from ``dy`` and ``w``.

    float64 channels-last runs channels-first between two transposes: cuDNN 9 has no float64
    backward algorithm for NHWC at many shapes (every candidate reports NOT_SUPPORTED; the H200 run's
    registry cases, 1-d to 3-d, grouped and dilated)."""
    s = cm.stream_of(stream)
    if layout == "NHWC" and np.dtype(dy.dtype) == np.float64:
        n, h, wd, c = (int(d) for d in x_shape)
        dx_c = conv2d_backward_data(transpose(dy, (0, 3, 1, 2), stream=s), transpose(w, (0, 3, 1, 2), stream=s),
                                    (n, c, h, wd), params=params, layout="NCHW", stream=s)
        return transpose(dx_c, (0, 2, 3, 1), out=out, stream=s)
    g = _geometry(tuple(x_shape), w.shape, params, layout, dy.dtype)
    dx = cm.output(out, tuple(x_shape), dy.dtype, s)
    dxp = dx if g.explicit is None else cm.empty(g.layout_shape(g.xp_dims), dy.dtype, s)
    one, zero = cm.ONE.of(g.dtype), cm.ZERO.of(g.dtype)

    def call(handle, choice, ws):
        C.cudnnConvolutionBackwardData(handle, one, g.w, w.ptr, g.y, dy.ptr, choice.conv, choice.algo, ws,
                                       choice.workspace, zero, g.x, dxp.ptr)

    _run("backward_data", g, s, (dxp.ptr, w.ptr, dy.ptr), "cudnnConvolutionBackwardData", call)
    if g.explicit is not None:
        crop_nchw(dxp, g.x_dims, g.explicit, layout, dx, s)
    return dx


def conv2d_backward_filter(x: Any, dy: Any, w_shape, *, params: ConvParams, layout: str = "NCHW",
                           out: Any = None, stream: Any = None) -> Any:
    """``dw`` of shape ``w_shape`` (KCRS for NCHW, KRSC for NHWC) from ``x`` and ``dy``; float64 channels-last
    runs channels-first between transposes, as :func:`conv2d_backward_data` does."""
    s = cm.stream_of(stream)
    if layout == "NHWC" and np.dtype(x.dtype) == np.float64:
        k, r, sw, c = (int(d) for d in w_shape)
        dw_c = conv2d_backward_filter(transpose(x, (0, 3, 1, 2), stream=s), transpose(dy, (0, 3, 1, 2), stream=s),
                                      (k, c, r, sw), params=params, layout="NCHW", stream=s)
        return transpose(dw_c, (0, 2, 3, 1), out=out, stream=s)
    g = _geometry(x.shape, tuple(w_shape), params, layout, x.dtype)
    dw = cm.output(out, tuple(w_shape), x.dtype, s)
    xin = _padded_input(x, g, s)
    one, zero = cm.ONE.of(g.dtype), cm.ZERO.of(g.dtype)

    def call(handle, choice, ws):
        C.cudnnConvolutionBackwardFilter(handle, one, g.x, xin.ptr, g.y, dy.ptr, choice.conv, choice.algo, ws,
                                         choice.workspace, zero, g.w, dw.ptr)

    _run("backward_filter", g, s, (xin.ptr, dw.ptr, dy.ptr), "cudnnConvolutionBackwardFilter", call)
    return dw


# ---------------------------------------------------------------------------------- bias

def bias_add(y: Any, b: Any, *, layout: str = "NCHW", out: Any = None, stream: Any = None) -> Any:
    """``y + b`` along the channel axis (axis 1 of 4-d NCHW, else the last axis); ``out`` may be ``y``.

    Channels-last data whose C is a multiple of 16 bytes' worth of elements, with y, b and out 16-byte
    aligned, takes 16-byte loads and stores (``layout.cu``'s ``bias_add_rows``); else one element per step.
    """
    s = cm.stream_of(stream)
    res = cm.output(out, y.shape, y.dtype, s)
    outer, c, inner = colsum.channel_split(y.shape, layout)
    sfx = cm.suffix(y.dtype)
    name = f"bias_add_{sfx}" if b.dtype == y.dtype else f"bias_add_f32bias_{sfx}"
    if b.dtype != y.dtype and b.dtype != cm.F32:
        raise TypeError(f"bias_add: b must be {y.dtype} or float32, got {b.dtype}")
    total = outer * c * inner
    # channels-last: 16 bytes of y per thread when whole vectors fit C and every array is aligned
    vw = cm.vector_width(y.dtype)
    vec = inner == 1 and c % vw == 0 and cm.aligned16(y, b, res)
    cm.launch("layout.cu", name, total // vw if vec else total,
              (cm.p(y), cm.p(b), cm.p(res), cm.i64(total), cm.i64(c), cm.i64(inner), cm.i32(int(vec))), s)
    return res


def bias_backward(dy: Any, *, layout: str = "NCHW", stream: Any = None) -> Any:
    """``db[c] = sum of dy over every axis but the channel axis``, dtype of dy, shape (C,).

    Every sum runs in a fixed order set by the shape alone, so the result is deterministic.
    Channels-last data (NHWC, or 2-d (rows, C)) is read once with 16-byte loads where C and the
    address allow (``layout.cu``'s column sums): up to 512 row blocks write float32 (float64)
    partial sums, which a second launch adds; 256 rows or fewer take one launch. NCHW, whose
    channel planes are contiguous, takes one block per channel.
    """
    return colsum.channel_sums(dy, layout, stream)


# --------------------------------------------------------------------- fused conv+bias+act

_FUSED_UNSUPPORTED: set = set()  # geometries where cuDNN refused the fused call
# Statuses with which cuDNN declines a fused configuration it cannot run (the separate calls can).
_FUSED_REFUSALS = (C.Status.NOT_SUPPORTED, C.Status.BAD_PARAM)
_FUSED_MODES = {"relu": C.ActivationMode.RELU, "linear": C.ActivationMode.IDENTITY}


def _fused_choice(activation: str, g: _Geometry, handle: cudnn.Handle, s: Any,
                  buffers: tuple) -> "algo.AlgoChoice | None":
    """The algorithm of the fused call, or None when cuDNN cannot run it for this geometry.

    relu takes the usual choice; linear (identity) must use IMPLICIT_PRECOMP_GEMM, the only
    algorithm cuDNN allows with it, and is None when that algorithm cannot run this geometry.
    """
    key = g.key("forward", s.device_index)
    if activation == "relu":
        return algo.choose(key, handle, g.x_desc, g.w_desc, g.y_desc, s, buffers)
    # The fixed algorithm's workspace is asked once per key (memoised on the geometry, as its keys are),
    # not once per call; a None answer is remembered by the caller in _FUSED_UNSUPPORTED.
    memo = ("fused_linear", key)
    choice = g.keys.get(memo)
    if choice is None:
        fixed = C.ConvolutionFwdAlgo.IMPLICIT_PRECOMP_GEMM
        conv = algo.conv_desc(key, key.math)
        size = algo.workspace_size("forward", handle, g.x_desc, g.w_desc, g.y_desc, conv, fixed)
        if size is None:
            return None
        choice = g.keys[memo] = algo.AlgoChoice(fixed, key.math, size, conv, True, "fixed")
    return choice


def _fused_forward(x: Any, w: Any, b: Any, y: Any, activation: str, g: _Geometry, s: Any) -> bool:
    """cudnnConvolutionBiasActivationForward into ``y``: True when it ran, False when cuDNN cannot
    fuse this geometry (no algorithm, or the call refused with NOT_SUPPORTED / BAD_PARAM)."""
    xin = _padded_input(x, g, s)
    b_desc = cudnn.TensorDescriptor.cached((1, g.w_kcrs[0], 1, 1), g.dtype)
    # PROPAGATE_NAN: a NaN input gives a NaN output, as NumPy's reference does.
    act = cudnn.ActivationDescriptor.cached(_FUSED_MODES[activation], 0.0, None, True)
    one, zero = cm.ONE.of(g.dtype), cm.ZERO.of(g.dtype)
    handle = cm.cudnn_handle(s)
    try:
        choice = _fused_choice(activation, g, handle, s, (xin.ptr, w.ptr, y.ptr))
        if choice is None:
            return False
        ws = cudnn.workspace(s, choice.workspace)
        # z = y with alpha2 = 0: cuDNN requires a z operand; y is never read for alpha2 == 0.
        C.cudnnConvolutionBiasActivationForward(
            handle.handle, one, g.x, xin.ptr, g.w, w.ptr, choice.conv, choice.algo, ws, choice.workspace, zero, g.y,
            y.ptr, b_desc.handle, b.ptr, act.handle, g.y, y.ptr)
    except cm.CudnnError as exc:
        if exc.status not in _FUSED_REFUSALS:
            for name, value in g.context("cudnnConvolutionBiasActivationForward").items():
                exc.context.setdefault(name, value)
            exc.add_context()
            raise
        return False
    return True


def _graph_forward(x: Any, w: Any, b: Any, y: Any, activation: str, g: _Geometry, s: Any,
                   legacy: Any) -> bool:
    """The fused cuDNN graph into ``y`` where ``fused.py`` chose it for this shape key: True when it ran."""
    cfg = cm.config()
    # Memoised on the geometry as its ConvKeys are: one dict lookup per call, not a key built per call.
    memo = ("fused", s.device_index, activation, cfg.allow_tf32, cfg.benchmark, cfg.workspace_limit)
    key = g.keys.get(memo, False)
    if key is False:
        key = g.keys[memo] = fused.conv_bias_activation_key(
            s.device_index, g.xp_dims, g.w_kcrs, g.desc_pad, g.params.stride, g.params.dilation, g.params.groups,
            g.dtype, activation, g.layout)
    if key is None or b.dtype != g.dtype or not all(a.is_contiguous for a in (x, w, b, y)):
        return False
    try:
        return fused.conv_bias_activation(key, cm.cudnn_handle(s), s, lambda: _padded_input(x, g, s), w.ptr, b.ptr,
                                          y.ptr, legacy)
    except cm.CudnnError as exc:
        for name, value in g.context("conv + bias + activation graph (cudnnBackendExecute)").items():
            exc.context.setdefault(name, value)
        exc.add_context()
        raise


def _legacy_forward(x: Any, w: Any, b: Any, y: Any, activation: str, alpha: "float | None", g: _Geometry,
                    s: Any) -> None:
    """cudnnConvolutionBiasActivationForward where it applies, else conv, bias add and activation."""
    if activation in _FUSED_MODES and g.dtype in (cm.F32, cm.F16) and g not in _FUSED_UNSUPPORTED:
        if _fused_forward(x, w, b, y, activation, g, s):
            return
        # Not a failure: cuDNN's fused kernels cover fewer configurations than the separate
        # calls. Remembered, so the refusal costs one call per geometry; the numbers match.
        _FUSED_UNSUPPORTED.add(g)
    conv2d_forward(x, w, params=g.params, layout=g.layout, out=y, stream=s)
    bias_add(y, b, layout=g.layout, out=y, stream=s)
    if activation != "linear":
        act_mod.activation_forward(y, activation, alpha=alpha, out=y, stream=s)


def conv2d_bias_activation_forward(x: Any, w: Any, b: Any, *, activation: str = "relu",
                                   alpha: "float | None" = None, params: ConvParams, layout: str = "NCHW",
                                   out: Any = None, stream: Any = None) -> Any:
    """``activation(conv(x, w) + b)``.

    With ``config.fused_graphs``, channels-last float16/bfloat16/float32 relu and linear (groups 1)
    try one fused cuDNN graph-API plan, chosen per shape key against the legacy path (``fused.py``:
    heuristically, or timed under ``config.benchmark``). The legacy path: relu and linear through
    cudnnConvolutionBiasActivationForward for float32/float16 (linear only with the
    IMPLICIT_PRECOMP_GEMM algorithm, the one cuDNN allows with an identity activation); other
    cases, or a configuration cuDNN refuses (remembered per geometry in ``_FUSED_UNSUPPORTED``,
    silently), run conv, bias add and the activation as three launches (same numbers).
    """
    s = cm.stream_of(stream)
    g = _geometry(x.shape, w.shape, params, layout, x.dtype)
    y = cm.output(out, g.layout_shape(g.y_dims), x.dtype, s)

    def legacy() -> None:
        _legacy_forward(x, w, b, y, activation, alpha, g, s)

    if not (cm.config().fused_graphs and _graph_forward(x, w, b, y, activation, g, s, legacy)):
        legacy()
    return y
