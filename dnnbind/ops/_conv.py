"""Convolutions of ``keras.ops.nn``: ``conv``, ``conv_transpose``, ``depthwise_conv``, ``separable_conv``,
``unfold`` and ``fold``, in Keras's layouts (kernels ``(*spatial, in/groups, out)``, transposed kernels
``(*spatial, out, in)``; ``data_format`` either way) and Keras's padding rules (``"same"``: the odd pixel
at the end; ``conv_transpose``'s ``output_padding``, as the JAX backend).

Three recorded primitives carry every 2-d convolution, in :mod:`dnnbind.kernels.conv`'s layouts (NHWC
or NCHW, filters KRSC or KCRS; cuDNN on the device):

* :func:`conv2d` (``conv2d_forward``), :func:`conv2d_transpose` (``conv2d_backward_data``: the data
  gradient is a transposed convolution) and :func:`conv2d_filter_grad` (``conv2d_backward_filter``);
* each one's VJP is made of the other two, so every derivative of a convolution is again
  convolutions, differentiable to any order (a gradient penalty through ``conv`` works).

1-d convolutions run as 2-d ones of height 1. 3-d convolutions are sums over the depth taps of 2-d
convolutions of depth slices folded into the batch (and ``conv_transpose`` the adjoint: 2-d transposed
convolutions placed at strided depths), built from the same primitives and ``pad``/``get_item``, so
they run on cuDNN's 2-d kernels too and differentiate like the rest. ``unfold``/``fold`` gather and
place strided slices (exact data movement; no arithmetic that TF32 could round).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NoReturn, Sequence

from .. import kernels
from ..autodiff import engine as _engine
from ..autodiff.tensor import LazyTensor, Tensor, TransposedView
from ..autodiff.variable import Variable
from ..kernels._params import resolve_padding
from ..kernels.conv import conv_params
from . import _core, _elementwise
from ._core import is_float, keras_op, make, np_dtype, result_type, tensors
from ._nn_common import channels_last, op, padding_mode, place_strided, spatial_tuple, to_dtype
from ._nn_common import data_format as _standardize_format

__all__ = ["conv", "conv_transpose", "depthwise_conv", "separable_conv", "unfold", "fold", "conv2d",
           "conv2d_transpose", "conv2d_filter_grad", "Geometry"]


@dataclass(frozen=True)
class Geometry:
    """A 2-d convolution's arguments as :mod:`dnnbind.kernels.conv` takes them: padding explicit
    ``(top, bottom, left, right)``, ``layout`` ``"NHWC"`` or ``"NCHW"``."""

    stride: tuple
    padding: tuple
    dilation: tuple
    groups: int
    layout: str

    def kwargs(self) -> dict:
        return {"stride": self.stride, "padding": self.padding, "dilation": self.dilation, "groups": self.groups,
                "layout": self.layout}


def _same_dtype(g: Tensor, like: Tensor) -> Tensor:
    return g if g.dtype == like.dtype else op("cast")(g, like.dtype)


def _conv_vjp(x: Tensor, w: Tensor, geo: Geometry) -> Any:
    """The VJP of ``conv2d(x, w)``: :func:`conv2d_transpose` (x) and :func:`conv2d_filter_grad` (w)."""
    x_shape, w_shape = tuple(x.shape), tuple(w.shape)

    def backward(node: Any, g: Tensor) -> tuple:
        g = _same_dtype(g, x)
        need = node.needs_input_grad
        return (conv2d_transpose(g, w, x_shape, geo) if need[0] else None,
                conv2d_filter_grad(x, g, w_shape, geo) if need[1] else None)

    return backward


def conv2d(x: Tensor, w: Tensor, geo: Geometry) -> Tensor:
    """``kernels.conv2d_forward(x, w)`` recorded; its VJP is :func:`conv2d_transpose` (x) and
    :func:`conv2d_filter_grad` (w)."""
    y = kernels.conv2d_forward(x.data, w.data, **geo.kwargs())
    return make(y, (x, w), _conv_vjp(x, w, geo), "conv")


class PendingConv(LazyTensor):
    """``act(conv2d(x, w) + bias)`` of ``keras.ops.conv`` (2-d), computed when ``data`` is first read.

    ``ops.conv`` returns one with no bias; ``ops.add`` of a per-channel bias (``(K,)`` channels_last,
    ``(K, 1, 1)`` channels_first) to an unread one gives one with the bias, and ``ops.relu`` of that one
    with the activation: the three ops of a user's conv layer become one cuDNN convolution + bias +
    activation call forward (as dnnbind's Conv2D runs) and one node backward (relu's mask, the bias sum,
    the data and filter gradients). Any other use reads ``data`` and the convolution runs as it is; the
    unread intermediate tensors keep their own nodes, so each gives the right gradient wherever it is
    used. The geometry is checked when the op is called (``kernels.conv_params``), not when read."""

    __slots__ = ("x", "w", "geo", "bias", "act")

    def __init__(self, x: Tensor, w: Tensor, geo: Geometry, bias: "Tensor | None", act: "str | None",
                 shape: tuple) -> None:
        self.x, self.w, self.geo, self.bias, self.act = x, w, geo, bias, act
        self._init_lazy(shape, x)

    def _make(self) -> Any:
        made = _pending_forward(self.x, self.w, self.bias, self.act, self.geo)
        node = self._node
        if node is not None and self.act is not None and node.vjp is not None:
            node.outputs_raw = (made,)  # the relu mask of the backward
        return made


def _pending_forward(x: Tensor, w: Tensor, bias: "Tensor | None", act: "str | None", geo: Geometry) -> Any:
    if bias is None:
        return kernels.conv2d_forward(x.data, w.data, **geo.kwargs())
    b = bias.data
    if geo.layout == "NCHW":
        b = b.reshape(b.shape[0])
    return kernels.conv2d_bias_activation_forward(x.data, w.data, b, activation=act or "linear", **geo.kwargs())


def _pending_conv(x: Tensor, w: Tensor, geo: Geometry) -> Tensor:
    """:func:`conv2d`, its computation deferred to the first read (see :class:`PendingConv`)."""
    _, y_shape = conv_params("conv", tuple(x.shape), tuple(w.shape), **geo.kwargs())
    y = PendingConv(x, w, geo, None, None, tuple(y_shape))
    if _core.needs_grad(x, w):
        _engine.attach(y, (_core.edge(x), _core.edge(w)), _conv_vjp(x, w, geo), "conv")
    return y


def _bias_of(p: PendingConv, b: Any) -> "Tensor | None":
    """``b`` (a tensor, or a variable: read now) when it is a per-channel bias of ``p``'s dtype that ``p``
    (unread, no bias yet) can take, else None."""
    if p._made is not None or p.bias is not None or not isinstance(b, (Tensor, Variable)):
        return None
    k = p._shape[3] if p.geo.layout == "NHWC" else p._shape[1]
    if tuple(b.shape) != ((k,) if p.geo.layout == "NHWC" else (k, 1, 1)):
        return None
    if isinstance(b, Variable):
        b = _core.tensor(b)  # the read the add would make (autocast included)
    return b if b.dtype == p.dtype and is_float(b.dtype) else None


def _fused(p: PendingConv, bias: Tensor, act: "str | None") -> PendingConv:
    """``act(conv(p.x, p.w) + bias)`` as one pending tensor, recorded as one node."""
    x, w, geo = p.x, p.w, p.geo
    y = PendingConv(x, w, geo, bias, act, p._shape)
    if _core.needs_grad(x, w, bias):
        x_shape, w_shape = tuple(x.shape), tuple(w.shape)
        axes = (0, 1, 2) if geo.layout == "NHWC" else (0, 2, 3)

        def backward(node: Any, g: Tensor) -> tuple:
            g = _same_dtype(g, x)
            need = node.needs_input_grad
            if act == "relu":
                out = node.outputs_raw[0] if node.outputs_raw is not None else _pending_forward(x, w, bias, act, geo)
                if _core.recording():  # an outer tape records this backward: the differentiable form
                    dz = op("multiply")(g, op("cast")(op("greater")(Tensor(out), 0.0), g.dtype))
                else:
                    dz = Tensor(kernels.activation_backward(g.data, out, out, "relu"))
            else:
                dz = g
            db = None
            if need[2]:
                db = op("sum")(dz, axis=axes)
                if geo.layout == "NCHW":
                    db = op("reshape")(db, tuple(bias.shape))
            return (conv2d_transpose(dz, w, x_shape, geo) if need[0] else None,
                    conv2d_filter_grad(x, dz, w_shape, geo) if need[1] else None, db)

        _engine.attach(y, (_core.edge(x), _core.edge(w), _core.edge(bias)), backward,
                       "conv_bias" if act is None else f"conv_bias_{act}")
    return y


def fuse_add(a: Any, b: Any) -> "Tensor | None":
    """``ops.add``'s hook: a pending convolution plus its per-channel bias (either order), else None."""
    if type(a) is PendingConv:
        bias = _bias_of(a, b)
        if bias is not None:
            return _fused(a, bias, None)
    if type(b) is PendingConv:
        bias = _bias_of(b, a)
        if bias is not None:
            return _fused(b, bias, None)
    return None


def fuse_relu(x: Any) -> "Tensor | None":
    """``ops.relu``'s hook: relu of an unread pending convolution with its bias, else None."""
    if x._made is None and x.bias is not None and x.act is None:
        return _fused(x, x.bias, "relu")
    return None


def conv2d_transpose(dy: Tensor, w: Tensor, x_shape: Sequence[int], geo: Geometry) -> Tensor:
    """``kernels.conv2d_backward_data(dy, w, x_shape)`` recorded: the transposed convolution. Its VJP:
    :func:`conv2d` of the cotangent (dy) and :func:`conv2d_filter_grad` (w)."""
    dx = kernels.conv2d_backward_data(dy.data, w.data, tuple(x_shape), **geo.kwargs())
    w_shape = tuple(w.shape)

    def backward(node: Any, h: Tensor) -> tuple:
        h = _same_dtype(h, dy)
        need = node.needs_input_grad
        return (conv2d(h, w, geo) if need[0] else None,
                conv2d_filter_grad(h, dy, w_shape, geo) if need[1] else None)

    return make(dx, (dy, w), backward, "conv_transpose")


def conv2d_filter_grad(x: Tensor, dy: Tensor, w_shape: Sequence[int], geo: Geometry) -> Tensor:
    """``kernels.conv2d_backward_filter(x, dy, w_shape)`` recorded (bilinear in ``x`` and ``dy``); its VJP:
    :func:`conv2d_transpose` (x) and :func:`conv2d` (dy) of the cotangent."""
    dw = kernels.conv2d_backward_filter(x.data, dy.data, tuple(w_shape), **geo.kwargs())
    x_shape = tuple(x.shape)

    def backward(node: Any, h: Tensor) -> tuple:
        h = _same_dtype(h, x)
        need = node.needs_input_grad
        return (conv2d_transpose(dy, h, x_shape, geo) if need[0] else None,
                conv2d(x, h, geo) if need[1] else None)

    return make(dw, (x, dy), backward, "conv_filter_grad")


# ------------------------------------------------------------------------------------ geometry
def _output_size(size: int, k: int, stride: int, dilation: int, lo: int, hi: int) -> int:
    return (size + lo + hi - ((k - 1) * dilation + 1)) // stride + 1


def _pads(padding: str, sizes: Sequence[int], ks: Sequence[int], strides: Sequence[int],
          dilations: Sequence[int]) -> list:
    """``[(lo, hi)]`` per spatial axis (``"same"``: TensorFlow's rule, the odd pixel at the end)."""
    out = []
    for size, k, s, d in zip(sizes, ks, strides, dilations):
        lo_hi = resolve_padding(padding, (size, 1), (k, 1), (s, 1), (d, 1))[:2]
        out.append(tuple(int(v) for v in lo_hi))
    return out


_FILTER_AXES = {"NHWC": (3, 0, 1, 2), "NCHW": (3, 2, 0, 1)}  # Keras (R, S, Cin/g, K) -> KRSC / KCRS


def _filter(kernel: Tensor, layout: str) -> Tensor:
    """A Keras 2-d kernel ``(R, S, Cin/g, K)`` in the kernels' filter layout (KRSC or KCRS). A variable
    stored in that layout (its Keras read a lazy transpose of the storage, a TransposedView) gives its
    stored tensor, with no transpose either way (its gradient arrives in the storage layout too)."""
    axes = _FILTER_AXES[layout]
    if isinstance(kernel, TransposedView) and all(kernel.axes[a] == i for i, a in enumerate(axes)):
        return kernel.source
    return op("transpose")(kernel, axes)


def _adopt_filter_layout(kernel: Any, nsp: int, fmt: str) -> None:
    """A layer's fresh 2-d kernel (``add_weight``, not yet seen by an optimizer or a tape) moves to the
    convolution's filter layout once, so that no step transposes it (Variable.relayout): the same layout
    dnnbind's Conv2D keeps its kernel in."""
    if not (isinstance(kernel, Variable) and kernel._relayout_ok and nsp == 2 and len(kernel.shape) == 4
            and is_float(kernel.dtype)):
        return
    if any(tape.has_accessed(kernel) for tape in _engine.active_tapes()):
        return  # read on a tape already: its gradient there is in the Keras layout
    kernel.relayout(_FILTER_AXES["NHWC" if channels_last(fmt) else "NCHW"])


def _spatial(t: Tensor, fmt: str) -> tuple:
    return tuple(t.shape[1:-1]) if channels_last(fmt) else tuple(t.shape[2:])


def _channels(t: Tensor, fmt: str) -> int:
    return int(t.shape[-1] if channels_last(fmt) else t.shape[1])


def _check_rank(owner: str, x: Tensor, kernel: Tensor, name: str = "kernel") -> int:
    nsp = x.ndim - 2
    if nsp not in (1, 2, 3):
        raise ValueError(f"{owner}: inputs must be 3-d, 4-d or 5-d (batch, 1 to 3 spatial axes, channels), got shape "
                         f"{tuple(x.shape)}")
    if kernel.ndim != nsp + 2:
        raise ValueError(f"{owner}: {name} must have rank {nsp + 2} for inputs of rank {x.ndim}, got shape "
                         f"{tuple(kernel.shape)}")
    return nsp


def _empty_output(owner: str, x: Tensor, kernel: Tensor, strides: tuple, dilation: tuple,
                  padding: str) -> NoReturn:
    raise ValueError(f"{owner}: the convolution operation resulted in an empty output. This can happen if the input "
                     "is too small for the given kernel size, strides, dilation rate, and padding mode "
                     f"(inputs {tuple(x.shape)}, kernel {tuple(kernel.shape)}, strides={strides}, "
                     f"dilation_rate={dilation}, padding={padding!r}).")


# ----------------------------------------------------------------------------------------- conv
def _as_2d(t: Tensor, fmt: str) -> Tensor:
    """A 1-d (batch, width, channels) tensor as 2-d of height 1."""
    shape = tuple(t.shape)
    return op("reshape")(t, (shape[0], 1) + shape[1:] if channels_last(fmt) else shape[:2] + (1, shape[2]))


def _from_2d(t: Tensor, fmt: str) -> Tensor:
    shape = tuple(t.shape)
    return op("reshape")(t, (shape[0], shape[2], shape[3]) if channels_last(fmt) else shape[:2] + (shape[3],))


def _conv(owner: str, x: Tensor, kernel: Tensor, strides: tuple, padding: str, fmt: str, dilation: tuple) -> Tensor:
    """The convolution of ``x`` and a Keras kernel (both already of one float dtype), any rank."""
    nsp = x.ndim - 2
    channels, cg = _channels(x, fmt), int(kernel.shape[-2])
    if cg == 0 or channels % cg:
        raise ValueError(f"{owner}: The number of input channels must be evenly divisible by kernel's in_channels. "
                         f"Received input channels {channels} and kernel in_channels {cg}.")
    groups = channels // cg
    if kernel.shape[-1] % groups:
        raise ValueError(f"{owner}: the kernel's {kernel.shape[-1]} output channels must be divisible by the "
                         f"{groups} groups (input channels {channels} / kernel in_channels {cg})")
    sizes, ks = _spatial(x, fmt), tuple(int(k) for k in kernel.shape[:nsp])
    pads = _pads(padding, sizes, ks, strides, dilation)
    if any(_output_size(n, k, s, d, lo, hi) < 1 for n, k, s, d, (lo, hi) in zip(sizes, ks, strides, dilation, pads)):
        _empty_output(owner, x, kernel, strides, dilation, padding)
    layout = "NHWC" if channels_last(fmt) else "NCHW"
    if nsp == 2:
        geo = Geometry(strides, pads[0] + pads[1], dilation, groups, layout)
        return _pending_conv(x, _filter(kernel, layout), geo)
    if nsp == 1:
        geo = Geometry((1,) + strides, (0, 0) + pads[0], (1,) + dilation, groups, layout)
        k2 = op("reshape")(kernel, (1,) + tuple(kernel.shape))
        return _from_2d(conv2d(_as_2d(x, fmt), _filter(k2, layout), geo), fmt)
    return _conv3d(x, kernel, strides, pads, fmt, dilation, groups)


def _depth_first(t: Tensor, fmt: str) -> Tensor:
    """(N, D, ...) with the rest in the 2-d layout: channels_last as it is, channels_first (N, C, D, H, W)
    as (N, D, C, H, W)."""
    return t if channels_last(fmt) else op("moveaxis")(t, 2, 1)


def _depth_back(t: Tensor, fmt: str) -> Tensor:
    return t if channels_last(fmt) else op("moveaxis")(t, 1, 2)


def _conv3d(x: Tensor, kernel: Tensor, strides: tuple, pads: list, fmt: str, dilation: tuple, groups: int) -> Tensor:
    """3-d convolution = sum over the depth taps ``kd`` of 2-d convolutions of the depth slices
    ``x[:, kd * dilation + o * stride]`` (all output depths ``o`` folded into the batch) with ``kernel[kd]``."""
    reshape, get_item = op("reshape"), op("get_item")
    layout = "NHWC" if channels_last(fmt) else "NCHW"
    xd = _depth_first(x, fmt)
    (lo, hi), sd, dd = pads[0], strides[0], dilation[0]
    if lo or hi:
        xd = op("pad")(xd, ((0, 0), (lo, hi)) + ((0, 0),) * 3)
    n, depth = int(xd.shape[0]), int(xd.shape[1])
    kd_count = int(kernel.shape[0])
    out_depth = (depth - ((kd_count - 1) * dd + 1)) // sd + 1
    geo = Geometry(strides[1:], pads[1] + pads[2], dilation[1:], groups, layout)
    total = None
    for kd in range(kd_count):
        start = kd * dd
        taps = get_item(xd, (slice(None), slice(start, start + (out_depth - 1) * sd + 1, sd)))
        folded = reshape(taps, (n * out_depth,) + tuple(taps.shape[2:]))
        y = conv2d(folded, _filter(get_item(kernel, kd), layout), geo)
        total = y if total is None else op("add")(total, y)
    return _depth_back(reshape(total, (n, out_depth) + tuple(total.shape[1:])), fmt)


@keras_op(family="nn")
def conv(inputs: Any, kernel: Any, strides: Any = 1, padding: str = "valid", data_format: Any = None,
         dilation_rate: Any = 1) -> Tensor:
    """``keras.ops.conv``: 1-d, 2-d or 3-d convolution (cross-correlation); ``kernel`` ``(*spatial,
    in_channels / groups, out_channels)``, ``groups = in_channels / kernel.shape[-2]``; the inputs are
    converted to the kernel's dtype (Keras's rule). 2-d (and 1-d, 3-d through it): cuDNN on the device."""
    owner = "conv"
    fmt = _standardize_format(data_format, owner)
    if isinstance(kernel, Variable) and kernel._relayout_ok:
        _adopt_filter_layout(kernel, len(kernel.shape) - 2, fmt)
    x, k = tensors(inputs, kernel)
    nsp = _check_rank(owner, x, k)
    dt = k.dtype if is_float(k.dtype) else np_dtype(result_type(x, k, float))
    x, k = to_dtype(x, dt), to_dtype(k, dt)
    return _conv(owner, x, k, spatial_tuple(strides, nsp, "strides", owner), padding_mode(padding, owner), fmt,
                 spatial_tuple(dilation_rate, nsp, "dilation_rate", owner))


def _float_pair(owner: str, *ts: Tensor) -> list:
    dt = np_dtype(result_type(*ts))
    if not is_float(dt):
        dt = _core.floatx()
    return [to_dtype(t, dt) for t in ts]


def _check_depthwise_channels(owner: str, x: Tensor, kernel: Tensor, fmt: str) -> None:
    if _channels(x, fmt) != kernel.shape[-2]:
        raise ValueError(f"{owner}: The number of input channels must match the kernel's input channels. Received: "
                         f"input channels={_channels(x, fmt)}, kernel input channels={kernel.shape[-2]}, "
                         f"data_format='{fmt}'.")


def _depthwise(owner: str, x: Tensor, kernel: Tensor, strides: Any, padding: str, fmt: str, dilation: Any) -> Tensor:
    nsp = _check_rank(owner, x, kernel)
    _check_depthwise_channels(owner, x, kernel, fmt)
    c, m = int(kernel.shape[-2]), int(kernel.shape[-1])
    k = op("reshape")(kernel, tuple(kernel.shape[:-2]) + (1, c * m))  # groups = channels: one filter set each
    return _conv(owner, x, k, spatial_tuple(strides, nsp, "strides", owner), padding_mode(padding, owner), fmt,
                 spatial_tuple(dilation, nsp, "dilation_rate", owner))


@keras_op(family="nn")
def depthwise_conv(inputs: Any, kernel: Any, strides: Any = 1, padding: str = "valid", data_format: Any = None,
                   dilation_rate: Any = 1) -> Tensor:
    """``keras.ops.depthwise_conv``: each input channel convolved with its own ``kernel[..., c, :]``
    (``kernel`` ``(*spatial, in_channels, multiplier)``; output channel ``c * multiplier + m``): a grouped
    convolution with one group per channel (cuDNN on the device)."""
    owner = "depthwise_conv"
    x, k = _float_pair(owner, *tensors(inputs, kernel))
    return _depthwise(owner, x, k, strides, padding, _standardize_format(data_format, owner), dilation_rate)


@keras_op(family="nn")
def separable_conv(inputs: Any, depthwise_kernel: Any, pointwise_kernel: Any, strides: Any = 1,
                   padding: str = "valid", data_format: Any = None, dilation_rate: Any = 1) -> Tensor:
    """``keras.ops.separable_conv``: ``depthwise_conv`` then a 1x1 ``conv`` with ``pointwise_kernel``."""
    owner = "separable_conv"
    x, dk, pk = _float_pair(owner, *tensors(inputs, depthwise_kernel, pointwise_kernel))
    fmt = _standardize_format(data_format, owner)
    nsp = _check_rank(owner, x, dk, "depthwise_kernel")
    if pk.ndim != nsp + 2:
        raise ValueError(f"{owner}: pointwise_kernel must have rank {nsp + 2}, got shape {tuple(pk.shape)}")
    y = _depthwise(owner, x, dk, strides, padding, fmt, dilation_rate)
    return _conv(owner, y, pk, (1,) * nsp, "valid", fmt, spatial_tuple(dilation_rate, nsp, "dilation_rate", owner))


# ------------------------------------------------------------------------------- conv_transpose
def _transpose_pads(k: int, stride: int, dilation: int, padding: str, output_padding: "int | None") -> tuple:
    """Keras's ``(left, right)`` padding of the stride-dilated input (the JAX backend's
    ``_convert_conv_transpose_padding_args_from_keras_to_jax``)."""
    eff = (k - 1) * dilation + 1
    if padding == "valid":
        extra = max(eff, stride) - eff if output_padding is None else output_padding
        return eff - 1, eff - 1 + extra
    pad_len = stride + eff - 2 if output_padding is None else eff + eff % 2 - 2 + output_padding
    left = min(pad_len // 2 + pad_len % 2, eff - 1)
    return left, pad_len - left


def _output_padding(value: Any, nsp: int, owner: str) -> list:
    if value is None:
        return [None] * nsp
    return list(spatial_tuple(value, nsp, "output_padding", owner, minimum=0))


def _conv_transpose(owner: str, x: Tensor, kernel: Tensor, strides: tuple, padding: str, out_pad: list, fmt: str,
                    dilation: tuple) -> Tensor:
    nsp = x.ndim - 2
    if _channels(x, fmt) != kernel.shape[-1]:
        raise ValueError(f"{owner}: The number of input channels must match the kernel's input channels. Received: "
                         f"input channels={_channels(x, fmt)}, kernel input channels={kernel.shape[-1]}, "
                         f"data_format='{fmt}'.")
    sizes, ks = _spatial(x, fmt), tuple(int(k) for k in kernel.shape[:nsp])
    # per axis, as the adjoint of a convolution: its padding (front, back) and output length; a negative
    # back padding means zero rows past the last the convolution reads
    front, back, lengths = [], [], []
    for n, k, s, d, op_ in zip(sizes, ks, strides, dilation, out_pad):
        lo, hi = _transpose_pads(k, s, d, padding, op_)
        eff = (k - 1) * d + 1
        length = (n - 1) * s + lo + hi - eff + 2
        if length < 1:
            _empty_output(owner, x, kernel, strides, dilation, padding)
        front.append(eff - 1 - lo)
        back.append(eff - 1 - hi)
        lengths.append(length)
    layout = "NHWC" if channels_last(fmt) else "NCHW"
    if nsp == 3:
        return _conv_transpose3d(x, kernel, strides, front, back, lengths, fmt, dilation)
    if nsp == 1:
        x2 = _as_2d(x, fmt)
        k2 = op("reshape")(kernel, (1,) + tuple(kernel.shape))
        y = _transpose2d(x2, k2, (1,) + strides, [0] + front, [0] + back, [1] + lengths, layout, (1,) + dilation)
        return _from_2d(y, fmt)
    return _transpose2d(x, kernel, strides, front, back, lengths, layout, dilation)


def _transpose2d(x: Tensor, kernel: Tensor, strides: tuple, front: list, back: list, lengths: list, layout: str,
                 dilation: tuple) -> Tensor:
    """A 2-d transposed convolution: ``conv2d_transpose`` for the convolution with padding (front, max(back,
    0)) on each axis, then zero rows/columns where ``back`` is negative."""
    n = int(x.shape[0])
    cout = int(kernel.shape[-2])
    cut = [max(-b, 0) for b in back]
    hw = (lengths[0] - cut[0], lengths[1] - cut[1])
    x_shape = (n,) + hw + (cout,) if layout == "NHWC" else (n, cout) + hw
    geo = Geometry(strides, (front[0], max(back[0], 0), front[1], max(back[1], 0)), dilation, 1, layout)
    y = conv2d_transpose(x, _filter(kernel, layout), x_shape, geo)
    if any(cut):
        widths = ((0, cut[0]), (0, cut[1]))
        y = op("pad")(y, ((0, 0),) + widths + ((0, 0),) if layout == "NHWC" else ((0, 0), (0, 0)) + widths)
    return y


def _conv_transpose3d(x: Tensor, kernel: Tensor, strides: tuple, front: list, back: list, lengths: list, fmt: str,
                      dilation: tuple) -> Tensor:
    """The adjoint of :func:`_conv3d`: for each depth tap ``kd``, the 2-d transposed convolution of every
    input depth slice with ``kernel[kd]``, placed at depths ``kd * dilation + i * stride``; then the depth
    padding cropped (or, past the last tap, zeros added)."""
    reshape, get_item = op("reshape"), op("get_item")
    layout = "NHWC" if channels_last(fmt) else "NCHW"
    xd = _depth_first(x, fmt)
    n, depth = int(xd.shape[0]), int(xd.shape[1])
    sd, dd = strides[0], dilation[0]
    kd_count = int(kernel.shape[0])
    full = (depth - 1) * sd + (kd_count - 1) * dd + 1
    folded = reshape(xd, (n * depth,) + tuple(xd.shape[2:]))
    total = None
    for kd in range(kd_count):
        y = _transpose2d(folded, get_item(kernel, kd), strides[1:], front[1:], back[1:], lengths[1:], layout,
                         dilation[1:])
        y = reshape(y, (n, depth) + tuple(y.shape[1:]))
        shape = (n, full) + tuple(y.shape[2:])
        placed = place_strided(y, shape, (0, kd * dd) + (0,) * (y.ndim - 2), (1, sd) + (1,) * (y.ndim - 2))
        total = placed if total is None else op("add")(total, placed)
    lo, hi = front[0], back[0]  # the convolution's depth padding: crop it (hi < 0: zeros past the end)
    total = get_item(total, (slice(None), slice(lo, full - max(hi, 0))))
    if hi < 0:
        total = op("pad")(total, ((0, 0), (0, -hi)) + ((0, 0),) * 3)
    return _depth_back(total, fmt)


@keras_op(family="nn")
def conv_transpose(inputs: Any, kernel: Any, strides: Any = 1, padding: str = "valid", output_padding: Any = None,
                   data_format: Any = None, dilation_rate: Any = 1) -> Tensor:
    """``keras.ops.conv_transpose``: the transposed convolution (the gradient of ``conv`` w.r.t. its input);
    ``kernel`` ``(*spatial, out_channels, in_channels)``; output size per axis ``(in - 1) * stride +
    kernel`` (``"valid"``) or ``in * stride`` (``"same"``), adjusted by ``output_padding``. 2-d: cuDNN's
    backward-data convolution on the device."""
    owner = "conv_transpose"
    x, k = _float_pair(owner, *tensors(inputs, kernel))
    fmt = _standardize_format(data_format, owner)
    nsp = _check_rank(owner, x, k)
    return _conv_transpose(owner, x, k, spatial_tuple(strides, nsp, "strides", owner), padding_mode(padding, owner),
                           _output_padding(output_padding, nsp, owner), fmt,
                           spatial_tuple(dilation_rate, nsp, "dilation_rate", owner))


# --------------------------------------------------------------------------------- unfold, fold
def _pair(value: Any, name: str, owner: str, minimum: int = 1) -> tuple:
    return spatial_tuple(value, 2, name, owner, minimum=minimum)


@keras_op(family="nn")
def unfold(x: Any, kernel_size: Any, dilation: Any = 1, padding: Any = 0, stride: Any = 1) -> Tensor:
    """``keras.ops.unfold`` (torch's ``Unfold``): the sliding blocks of an NCHW ``x`` ``(N, C, H, W)`` as
    ``(N, C * kh * kw, L)`` (channel-major, then the kernel positions row by row)."""
    owner = "unfold"
    (t,) = tensors(x)
    if t.ndim != 4:
        raise ValueError(f"{owner}: Input must be a 4D tensor. Received: input.shape={tuple(t.shape)}")
    (kh, kw), (dh, dw) = _pair(kernel_size, "kernel_size", owner), _pair(dilation, "dilation", owner)
    (ph, pw), (sh, sw) = _pair(padding, "padding", owner, 0), _pair(stride, "stride", owner)
    n, c, h, w = (int(v) for v in t.shape)
    oh, ow = _output_size(h, kh, sh, dh, ph, ph), _output_size(w, kw, sw, dw, pw, pw)
    if oh < 1 or ow < 1:
        raise ValueError(f"{owner}: no block fits: input {h}x{w}, kernel_size ({kh}, {kw}), dilation ({dh}, {dw}), "
                         f"padding ({ph}, {pw}), stride ({sh}, {sw})")
    if ph or pw:
        t = op("pad")(t, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    get_item = op("get_item")
    blocks = [get_item(t, (slice(None), slice(None), slice(i * dh, i * dh + (oh - 1) * sh + 1, sh),
                           slice(j * dw, j * dw + (ow - 1) * sw + 1, sw)))
              for i in range(kh) for j in range(kw)]
    return op("reshape")(op("stack")(blocks, axis=2), (n, c * kh * kw, oh * ow))


@keras_op(family="nn")
def fold(x: Any, output_size: Any, kernel_size: Any, dilation: Any = 1, padding: Any = 0, stride: Any = 1) -> Tensor:
    """``keras.ops.fold`` (torch's ``Fold``, col2im): blocks ``(N, C * kh * kw, L)`` summed back into
    ``(N, C, *output_size)`` (overlaps add up; the inverse layout of :func:`unfold`)."""
    owner = "fold"
    (t,) = tensors(x)
    if t.ndim != 3:
        raise ValueError(f"{owner}: Input must be a 3D tensor. Received: input.shape={tuple(t.shape)}")
    (oh, ow), (kh, kw) = _pair(output_size, "output_size", owner), _pair(kernel_size, "kernel_size", owner)
    (dh, dw), (ph, pw) = _pair(dilation, "dilation", owner), _pair(padding, "padding", owner, 0)
    sh, sw = _pair(stride, "stride", owner)
    n, ckk, length = (int(v) for v in t.shape)
    if ckk % (kh * kw):
        raise ValueError(f"{owner}: The second dimension of the input ({ckk}) must be divisible by kernel_size product "
                         f"({kh * kw}).")
    c = ckk // (kh * kw)
    nh, nw = _output_size(oh, kh, sh, dh, ph, ph), _output_size(ow, kw, sw, dw, pw, pw)
    if nh < 1 or nw < 1 or nh * nw != length:
        raise ValueError(f"{owner}: an output of {oh}x{ow} (padding ({ph}, {pw}), kernel_size ({kh}, {kw}), dilation "
                         f"({dh}, {dw}), stride ({sh}, {sw})) has {max(nh, 0)}x{max(nw, 0)} blocks, but the input "
                         f"holds {length}")
    blocks = op("reshape")(t, (n, c, kh * kw, nh, nw))
    get_item = op("get_item")
    shape = (n, c, oh + 2 * ph, ow + 2 * pw)
    total = None
    for i in range(kh):
        for j in range(kw):
            placed = place_strided(get_item(blocks, (slice(None), slice(None), i * kw + j)), shape,
                                   (0, 0, i * dh, j * dw), (1, 1, sh, sw))
            total = placed if total is None else op("add")(total, placed)
    if ph or pw:
        total = get_item(total, (slice(None), slice(None), slice(ph, ph + oh), slice(pw, pw + ow)))
    return total


# ops.add / ops.relu hand a PendingConv to these (the elementwise room sits beside this one, so the
# hooks are registered here, by type)
_elementwise.ADD_HOOKS[PendingConv] = fuse_add
_elementwise.RELU_HOOKS[PendingConv] = fuse_relu
