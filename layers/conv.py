"""Convolution layers (Keras 3 arguments): Conv2D, DepthwiseConv2D, SeparableConv2D and Conv1D, all
computed by ``kernels.conv2d_*`` in NHWC (channels_last) or NCHW (depthwise as grouped convolutions,
Conv1D as a 2-d convolution of unit width); Conv1DTranspose, Conv2DTranspose, Conv3DTranspose, Conv3D, DepthwiseConv1D and
SeparableConv1D written in ``keras.ops`` (``ops.conv_transpose``, differentiated by the op tape)."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from dnnbind import _validate, kernels
from dnnbind import activations as _activations
from dnnbind import backend as _backend
from dnnbind import constraints as _constraints
from dnnbind import initializers as _init
from dnnbind import ops as _ops
from dnnbind import regularizers as _regularizers
from dnnbind.kernels._params import ConvParams, resolve_padding
from dnnbind.ops._nn_common import padding_mode, spatial_tuple

from .base import Layer, _regularizer, register, split_batch
from .core import _ActivationMixin, _QuantizableMixin

__all__ = ["Conv2D", "Convolution2D", "DepthwiseConv2D", "SeparableConv2D", "SeparableConvolution2D", "Conv1D",
           "Convolution1D", "data_format_to_layout"]


def data_format_to_layout(data_format: str | None, owner: str) -> tuple[str, str]:
    """``(data_format, layout)``: None -> channels_last (Keras's default) -> NHWC."""
    fmt = "channels_last" if data_format is None else str(data_format).lower()
    if fmt == "channels_last":
        return fmt, "NHWC"
    if fmt == "channels_first":
        return fmt, "NCHW"
    raise ValueError(f"{owner}: data_format must be 'channels_last' or 'channels_first', got {data_format!r}")


def _kernel_layout(layout: str):
    """(to_internal, to_keras) for a Keras (kh, kw, in/groups, filters) kernel: KRSC for NHWC, KCRS for NCHW."""
    if layout == "NHWC":
        return (lambda a: a.transpose(3, 0, 1, 2)), (lambda a: a.transpose(1, 2, 3, 0))
    return (lambda a: a.transpose(3, 2, 0, 1)), (lambda a: a.transpose(2, 3, 1, 0))


def _depthwise_layout(layout: str, kh: int, kw: int, channels: int, multiplier: int):
    """(to_internal, to_keras) for a Keras depthwise kernel ``(kh, kw, in, depth_multiplier)``.

    Internally it is a grouped convolution with ``groups=in`` and ``in * depth_multiplier`` filters,
    output channel ``c * depth_multiplier + m`` (Keras/TF order): ``(in*dm, kh, kw, 1)`` (KRSC) for
    NHWC, ``(in*dm, 1, kh, kw)`` (KCRS) for NCHW.
    """
    k = channels * multiplier
    if layout == "NHWC":
        return ((lambda a: a.reshape(kh, kw, k).transpose(2, 0, 1)[:, :, :, None]),
                (lambda a: a[:, :, :, 0].transpose(1, 2, 0).reshape(kh, kw, channels, multiplier)))
    return ((lambda a: a.reshape(kh, kw, k).transpose(2, 0, 1)[:, None]),
            (lambda a: a[:, 0].transpose(1, 2, 0).reshape(kh, kw, channels, multiplier)))


def check_image_shape(shape: tuple[int, ...], owner: str, data_format: str) -> None:
    if len(shape) != 3:
        order = "(height, width, channels)" if data_format == "channels_last" else "(channels, height, width)"
        raise ValueError(f"{owner} expects 4-d inputs (batch, {order[1:]}, got a sample shape {shape}")


@register
class Conv2D(_QuantizableMixin, _ActivationMixin, Layer):
    """2-d convolution ``y = activation(conv(x, kernel) + bias)``.

    Keras kernel layout ``(kh, kw, in/groups, filters)``; internally ``(filters, kh, kw, in/groups)``
    for channels_last (cuDNN NHWC/KRSC) and ``(filters, in/groups, kh, kw)`` for channels_first.
    ``padding="same"`` pads as Keras (the odd extra row/column at the bottom/right).
    """

    def __init__(self, filters: int, kernel_size: "int | Sequence[int]", strides: "int | Sequence[int]" = (1, 1),
                 padding: str = "valid", data_format: str | None = None,
                 dilation_rate: "int | Sequence[int]" = (1, 1), groups: int = 1, activation: Any = None,
                 use_bias: bool = True, kernel_initializer: Any = "glorot_uniform",
                 bias_initializer: Any = "zeros", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        owner = f"{type(self).__name__} '{self.name}'"
        self.filters = _validate.positive_int(filters, "filters", owner)
        self.kernel_size = _validate.int_pair(kernel_size, "kernel_size", owner)
        self.strides = _validate.int_pair(strides, "strides", owner)
        self.dilation_rate = _validate.int_pair(dilation_rate, "dilation_rate", owner)
        if self.strides != (1, 1) and self.dilation_rate != (1, 1):
            raise ValueError(f"{owner}: strides > 1 together with dilation_rate > 1 is not supported (as Keras)")
        if str(padding).lower() not in ("valid", "same"):
            raise ValueError(f"{owner}: padding must be 'valid' or 'same', got {padding!r}")
        self.padding = str(padding).lower()
        self.data_format, self.layout = data_format_to_layout(data_format, owner)
        groups = _validate.positive_int(groups, "groups", owner)
        if self.filters % groups:
            raise ValueError(f"{owner}: groups must be a positive divisor of filters={self.filters}, got {groups!r}")
        self.groups = groups
        self._set_activation(activation)
        self.use_bias = _validate.boolean(use_bias, "use_bias", owner)
        self.kernel_initializer = _init.get(kernel_initializer)
        self.bias_initializer = _init.get(bias_initializer)

    def _split(self, shape):
        if self.data_format == "channels_last":
            return shape[0], shape[1], shape[2]
        return shape[1], shape[2], shape[0]

    def _params_for(self, h: int, w: int) -> ConvParams:
        pad = resolve_padding(self.padding, (h, w), self.kernel_size, self.strides, self.dilation_rate)
        return ConvParams(stride=self.strides, pad=pad, dilation=self.dilation_rate, groups=self.groups)

    def _out_channels(self, channels: int) -> int:
        return self.filters

    def _output_shape(self, input_shape):
        owner = f"{type(self).__name__} '{self.name}'"
        check_image_shape(tuple(input_shape), owner, self.data_format)
        h, w, c = self._split(input_shape)
        oh, ow = self._params_for(h, w).output_hw((h, w), self.kernel_size)
        if oh < 1 or ow < 1:
            raise ValueError(
                f"{owner}: input {h}x{w} is too small for kernel {self.kernel_size} with padding "
                f"'{self.padding}' (output would be {oh}x{ow})"
            )
        k = self._out_channels(c)
        return (oh, ow, k) if self.data_format == "channels_last" else (k, oh, ow)

    def build(self, input_shape):
        _, shape = split_batch(input_shape)
        owner = f"{type(self).__name__} '{self.name}'"
        check_image_shape(shape, owner, self.data_format)
        h, w, c = self._split(shape)
        if c % self.groups:
            raise ValueError(f"{owner}: input channels {c} are not divisible by groups={self.groups}")
        self._conv = self._params_for(h, w)
        kh, kw = self.kernel_size
        to_internal, to_keras = _kernel_layout(self.layout)
        self._in_per_group = c // self.groups
        # a layer rebuilt from a quantized config makes its quantized weights only (loaded next)
        self.kernel = None if "_pending_quantization" in self.__dict__ else self._add_weight(
            "kernel", (kh, kw, c // self.groups, self.filters), self.kernel_initializer,
            to_internal=to_internal, to_keras=to_keras)
        self.bias = self._add_weight("bias", (self.filters,), self.bias_initializer) if self.use_bias else None
        self._build_pending_quantization()
        self._set_built(shape)

    # ----- quantization (inference): weight-only ------------------------------------------------
    # The kernel is stored in int8 / E4M3 (per output channel / per tensor scales) and dequantized to the
    # compute dtype for cuDNN's float convolution: a memory saving, not a faster convolution (cuDNN's
    # int8 convolutions need NHWC with channels multiple of 4 and int8 activations, not wired here).
    _quantize_modes = ("int8", "float8")
    _quantizes_inputs = False

    def _kernel_dims(self):
        kh, kw = self.kernel_size
        return self.filters, kh * kw * self._in_per_group

    def _internal_kernel_shape(self):
        kh, kw = self.kernel_size
        if self.layout == "NHWC":
            return (self.filters, kh, kw, self._in_per_group)
        return (self.filters, self._in_per_group, kh, kw)

    def _float_kernel_matrix(self):
        from_keras = _kernel_layout(self.layout)[0]
        return np.ascontiguousarray(from_keras(self.kernel.numpy().astype(np.float32))).reshape(self.filters, -1)

    def _quantized_kernel_layout(self, mode):
        kh, kw = self.kernel_size
        return (kh, kw, self._in_per_group, self.filters), *_kernel_layout(self.layout)

    def _dequantized_kernel(self):
        n, k = self._kernel_dims()
        w = kernels.dequantize_weight(self.kernel.value.reshape(n, k), self.kernel_scale.value,
                                  mode=self.quantization_mode, dtype=self._effective_compute_dtype())
        return w.reshape(*self._internal_kernel_shape())

    def _conv_kwargs(self) -> dict:
        p = self._conv
        return {"stride": p.stride, "padding": p.pad, "dilation": p.dilation, "groups": p.groups,
                "layout": self.layout}

    def _forward(self, x, training, skip_softmax):
        x = self._cast_input(x)
        if self.quantization_mode is not None:
            if training:
                self._refuse_training()
            return self._conv_bias_activation(x, self._dequantized_kernel(), self._conv_kwargs(), False,
                                              skip_softmax)
        return self._conv_bias_activation(x, self._compute_weight(self.kernel), self._conv_kwargs(), training,
                                          skip_softmax)

    def _conv_bias_activation(self, x, w, conv_kwargs, training, skip_softmax):
        """``activation(conv(x, w) + bias)``; keeps ``x`` and ``w`` for :meth:`_conv_bias_activation_backward`."""
        act = self.activation
        if self.bias is not None and act.kind in (None, "relu"):
            # Kernel fusion: one cudnnConvolutionBiasActivationForward on the GPU (one pass less
            # over the output on NumPy) instead of conv, bias add and activation.
            y = kernels.conv2d_bias_activation_forward(x, w, self._compute_weight(self.bias),
                                                   activation=act.kind or "linear", **conv_kwargs)
            d = self.__dict__  # per-step fields (see Layer.__setattr__)
            d["_skipped_softmax"] = False
            if training:
                d["_x"], d["_w"] = x, w
                act.remember(y, y)  # relu's gradient mask, x > 0, is y > 0
            return y
        z = kernels.conv2d_forward(x, w, **conv_kwargs)
        if self.bias is not None:
            z = kernels.bias_add(z, self._compute_weight(self.bias), layout=self.layout)
        if training:
            d = self.__dict__
            d["_x"], d["_w"] = x, w
        return self._activate(z, training, skip_softmax)

    def _forward_into_batchnorm(self, x, bn, activation: "str | None"):
        """A training forward of this convolution (no bias, linear activation, float kernel) and of the
        ``BatchNormalization`` ``bn`` after it (then ``activation``) in one op
        (:meth:`BatchNormalization._forward_after_conv`); returns ``bn``'s output. The two layers'
        backwards are the usual ones. For a layer chain's fusion schedule (``models.chain.conv_bn_candidates``)."""
        if self.bias is not None or self.activation.kind is not None or self.quantization_mode is not None:
            raise RuntimeError(f"Conv2D '{self.name}': only a float convolution with no bias and a linear activation "
                               f"fuses with the batch norm after it (use_bias={self.use_bias}, activation="
                               f"{self.activation.name}, quantization_mode={self.quantization_mode})")
        x = self._cast_input(x)
        w = self._compute_weight(self.kernel)
        out = bn._forward_after_conv(x, w, self._conv_kwargs(), True, activation)
        d = self.__dict__
        d["_x"], d["_w"], d["_skipped_softmax"] = x, w, False
        return out

    def _backward_into_batchnorm(self, dy, bn):
        """This convolution's backward (no bias, linear activation) when its input was the relu'd output of the
        ``BatchNormalization`` ``bn``: the filter gradient as usual, then the data gradient, the relu's and
        ``bn``'s backward in one op (:meth:`BatchNormalization._backward_through_conv`); returns ``bn``'s dx.
        For a layer chain's fusion schedule (``models/chain.py``)."""
        if self.bias is not None or self.activation.kind is not None or self.quantization_mode is not None:
            raise RuntimeError(f"Conv2D '{self.name}': only a float convolution with no bias and a linear activation "
                               "fuses its backward with the batch norm before it")
        bn._check_backward_through_conv()  # before any gradient is kept: a refusal changes no state
        if self.trainable:
            dw = kernels.conv2d_backward_filter(self._x, dy, tuple(self._w.shape), **self._conv_kwargs())
            self.grads[self.kernel.name] = self._to_variable_dtype(dw, self.kernel)
        dx = bn._backward_through_conv(dy, self._w, self._conv_kwargs())
        d = self.__dict__
        d["_x"] = d["_w"] = None
        return dx

    def backward(self, dy, need_dx=True):
        if self.quantization_mode is not None:
            self._refuse_training()
        dx = self._conv_bias_activation_backward(dy, self.kernel, self._conv_kwargs(), need_dx)
        d = self.__dict__
        d["_x"] = d["_w"] = None
        return dx

    def _conv_bias_activation_backward(self, dy, kernel, conv_kwargs, need_dx):
        """Fills the gradients of ``kernel`` (and the bias); returns dx (None unless ``need_dx``)."""
        dz = self._activation_backward(dy)
        if self.trainable:
            dw = kernels.conv2d_backward_filter(self._x, dz, tuple(self._w.shape), **conv_kwargs)
            self.grads[kernel.name] = self._to_variable_dtype(dw, kernel)
            if self.bias is not None:
                self.grads["bias"] = self._to_variable_dtype(kernels.bias_backward(dz, layout=self.layout), self.bias)
        return kernels.conv2d_backward_data(dz, self._w, tuple(self._x.shape), **conv_kwargs) if need_dx else None

    def get_config(self):
        return {**super().get_config(), "filters": self.filters, "kernel_size": list(self.kernel_size),
                "strides": list(self.strides), "padding": self.padding, "data_format": self.data_format,
                "dilation_rate": list(self.dilation_rate), "groups": self.groups,
                "activation": self.activation.config, "use_bias": self.use_bias,
                "kernel_initializer": _init.serialize(self.kernel_initializer),
                "bias_initializer": _init.serialize(self.bias_initializer), **self._quantization_config()}


Convolution2D = Conv2D


@register
class DepthwiseConv2D(Conv2D):
    """Depthwise 2-d convolution: each input channel convolved with its own ``depth_multiplier`` filters.

    Output channels ``in * depth_multiplier``, channel ``c * depth_multiplier + m`` from input channel
    ``c`` (Keras). Keras kernel layout ``(kh, kw, in, depth_multiplier)`` (weight ``kernel``), bias
    ``(in * depth_multiplier,)``; computed as a grouped convolution with ``groups=in``
    (``kernels.conv2d_*``, cuDNN grouped convolutions on the GPU).
    """

    _quantize_modes = ()  # own kernel layouts: model.quantize leaves them in float

    def __init__(self, kernel_size: "int | Sequence[int]", strides: "int | Sequence[int]" = (1, 1),
                 padding: str = "valid", depth_multiplier: int = 1, data_format: str | None = None,
                 dilation_rate: "int | Sequence[int]" = (1, 1), activation: Any = None, use_bias: bool = True,
                 depthwise_initializer: Any = "glorot_uniform", bias_initializer: Any = "zeros",
                 depthwise_regularizer: Any = None, bias_regularizer: Any = None, activity_regularizer: Any = None,
                 depthwise_constraint: Any = None, bias_constraint: Any = None, **kwargs: Any) -> None:
        super().__init__(1, kernel_size, strides=strides, padding=padding, data_format=data_format,
                         dilation_rate=dilation_rate, activation=activation, use_bias=use_bias,
                         kernel_initializer=depthwise_initializer, bias_initializer=bias_initializer, **kwargs)
        owner = f"DepthwiseConv2D '{self.name}'"
        self.depth_multiplier = _validate.positive_int(depth_multiplier, "depth_multiplier", owner)
        self._set_weight_policies(depthwise_regularizer=depthwise_regularizer, bias_regularizer=bias_regularizer,
                                  depthwise_constraint=depthwise_constraint, bias_constraint=bias_constraint)
        if activity_regularizer is not None:
            self.activity_regularizer = _regularizer(activity_regularizer)
        self.filters = None  # in * depth_multiplier, known at build

    @property
    def depthwise_initializer(self):
        return self.kernel_initializer

    def _out_channels(self, channels: int) -> int:
        return channels * self.depth_multiplier

    def build(self, input_shape):
        _, shape = split_batch(input_shape)
        owner = f"DepthwiseConv2D '{self.name}'"
        check_image_shape(shape, owner, self.data_format)
        h, w, c = self._split(shape)
        kh, kw = self.kernel_size
        dm = self.depth_multiplier
        pad = resolve_padding(self.padding, (h, w), self.kernel_size, self.strides, self.dilation_rate)
        params = ConvParams(stride=self.strides, pad=pad, dilation=self.dilation_rate, groups=c)
        to_internal, to_keras = _depthwise_layout(self.layout, kh, kw, c, dm)
        self.kernel = self._add_weight("kernel", (kh, kw, c, dm), self.kernel_initializer, to_internal=to_internal,
                                      to_keras=to_keras)
        self.bias = self._add_weight("bias", (c * dm,), self.bias_initializer) if self.use_bias else None
        self.filters, self.groups, self._conv = c * dm, c, params
        self._set_built(shape)

    def get_config(self):
        return {**Layer.get_config(self), "kernel_size": list(self.kernel_size), "strides": list(self.strides),
                "padding": self.padding, "depth_multiplier": self.depth_multiplier, "data_format": self.data_format,
                "dilation_rate": list(self.dilation_rate), "activation": self.activation.config,
                "use_bias": self.use_bias, "depthwise_initializer": _init.serialize(self.kernel_initializer),
                "bias_initializer": _init.serialize(self.bias_initializer)}


@register
class SeparableConv2D(Conv2D):
    """Depthwise separable 2-d convolution: a depthwise convolution (``kernel_size``, ``strides``,
    ``padding``, ``dilation_rate``, ``depth_multiplier``) then a 1x1 pointwise convolution to
    ``filters`` channels, plus bias and activation (fused on the pointwise step, as Conv2D).

    Weights (Keras order and layouts): ``depthwise_kernel`` ``(kh, kw, in, depth_multiplier)``,
    ``pointwise_kernel`` ``(1, 1, in * depth_multiplier, filters)``, ``bias`` ``(filters,)``.
    """

    _quantize_modes = ()  # own kernel layouts: model.quantize leaves them in float

    def __init__(self, filters: int, kernel_size: "int | Sequence[int]", strides: "int | Sequence[int]" = (1, 1),
                 padding: str = "valid", data_format: str | None = None,
                 dilation_rate: "int | Sequence[int]" = (1, 1), depth_multiplier: int = 1, activation: Any = None,
                 use_bias: bool = True, depthwise_initializer: Any = "glorot_uniform",
                 pointwise_initializer: Any = "glorot_uniform", bias_initializer: Any = "zeros",
                 depthwise_regularizer: Any = None, pointwise_regularizer: Any = None, bias_regularizer: Any = None,
                 activity_regularizer: Any = None, depthwise_constraint: Any = None,
                 pointwise_constraint: Any = None, bias_constraint: Any = None, **kwargs: Any) -> None:
        super().__init__(filters, kernel_size, strides=strides, padding=padding, data_format=data_format,
                         dilation_rate=dilation_rate, activation=activation, use_bias=use_bias,
                         kernel_initializer=pointwise_initializer, bias_initializer=bias_initializer, **kwargs)
        owner = f"SeparableConv2D '{self.name}'"
        self.depth_multiplier = _validate.positive_int(depth_multiplier, "depth_multiplier", owner)
        self.depthwise_initializer = _init.get(depthwise_initializer)
        self._set_weight_policies(depthwise_regularizer=depthwise_regularizer, pointwise_regularizer=pointwise_regularizer,
                                  bias_regularizer=bias_regularizer, depthwise_constraint=depthwise_constraint,
                                  pointwise_constraint=pointwise_constraint, bias_constraint=bias_constraint)
        if activity_regularizer is not None:
            self.activity_regularizer = _regularizer(activity_regularizer)

    @property
    def pointwise_initializer(self):
        return self.kernel_initializer

    def build(self, input_shape):
        _, shape = split_batch(input_shape)
        owner = f"SeparableConv2D '{self.name}'"
        check_image_shape(shape, owner, self.data_format)
        h, w, c = self._split(shape)
        kh, kw = self.kernel_size
        dm = self.depth_multiplier
        pad = resolve_padding(self.padding, (h, w), self.kernel_size, self.strides, self.dilation_rate)
        to_internal, to_keras = _depthwise_layout(self.layout, kh, kw, c, dm)
        self.depthwise_kernel = self._add_weight("depthwise_kernel", (kh, kw, c, dm), self.depthwise_initializer,
                                                to_internal=to_internal, to_keras=to_keras)
        to_internal, to_keras = _kernel_layout(self.layout)
        self.pointwise_kernel = self._add_weight("pointwise_kernel", (1, 1, c * dm, self.filters),
                                                self.kernel_initializer, to_internal=to_internal, to_keras=to_keras)
        self.bias = self._add_weight("bias", (self.filters,), self.bias_initializer) if self.use_bias else None
        self._depthwise = ConvParams(stride=self.strides, pad=pad, dilation=self.dilation_rate, groups=c)
        self._conv = ConvParams(stride=(1, 1), pad=(0, 0, 0, 0), dilation=(1, 1), groups=1)
        self._set_built(shape)

    def _depthwise_kwargs(self) -> dict:
        p = self._depthwise
        return {"stride": p.stride, "padding": p.pad, "dilation": p.dilation, "groups": p.groups,
                "layout": self.layout}

    def _forward(self, x, training, skip_softmax):
        x = self._cast_input(x)
        dw = self._compute_weight(self.depthwise_kernel)
        mid = kernels.conv2d_forward(x, dw, **self._depthwise_kwargs())
        if training:
            self._x_in, self._dw = x, dw
        return self._conv_bias_activation(mid, self._compute_weight(self.pointwise_kernel), self._conv_kwargs(),
                                          training, skip_softmax)

    def backward(self, dy, need_dx=True):
        dx = None
        if self.trainable or need_dx:
            dmid = self._conv_bias_activation_backward(dy, self.pointwise_kernel, self._conv_kwargs(), True)
            kw = self._depthwise_kwargs()
            if self.trainable:
                ddw = kernels.conv2d_backward_filter(self._x_in, dmid, tuple(self._dw.shape), **kw)
                self.grads["depthwise_kernel"] = self._to_variable_dtype(ddw, self.depthwise_kernel)
            if need_dx:
                dx = kernels.conv2d_backward_data(dmid, self._dw, tuple(self._x_in.shape), **kw)
        self._x = self._w = self._x_in = self._dw = None
        return dx

    def get_config(self):
        config = super().get_config()
        del config["groups"], config["kernel_initializer"]
        return {**config, "depth_multiplier": self.depth_multiplier,
                "depthwise_initializer": _init.serialize(self.depthwise_initializer),
                "pointwise_initializer": _init.serialize(self.kernel_initializer)}


SeparableConvolution2D = SeparableConv2D


def _single(value: Any, name: str, owner: str) -> int:
    """A positive int given as an int or a one-element list/tuple (Keras 1-d arguments)."""
    if isinstance(value, (list, tuple)):
        if len(value) != 1:
            raise ValueError(f"{owner}: {name} must be an int or a tuple of one int, got {value!r}")
        value = value[0]
    return _validate.positive_int(value, name, owner)


@register
class Conv1D(Conv2D):
    """1-d convolution over ``(batch, steps, channels)`` (channels_last) or ``(batch, channels, steps)``.

    Keras kernel layout ``(kernel_size, in/groups, filters)``, bias ``(filters,)``. Computed as a 2-d
    convolution with a unit width: ``(N, steps, 1, C)`` NHWC or ``(N, C, steps, 1)`` NCHW, the same
    memory as the input (reshapes are views). ``padding="causal"`` pads ``dilation_rate * (kernel_size
    - 1)`` steps on the left only, so output step ``t`` sees inputs up to ``t`` (Keras).
    """

    _quantize_modes = ()  # own kernel layouts: model.quantize leaves them in float

    def __init__(self, filters: int, kernel_size: "int | Sequence[int]", strides: "int | Sequence[int]" = 1,
                 padding: str = "valid", data_format: str | None = None, dilation_rate: "int | Sequence[int]" = 1,
                 groups: int = 1, activation: Any = None, use_bias: bool = True,
                 kernel_initializer: Any = "glorot_uniform", bias_initializer: Any = "zeros",
                 kernel_regularizer: Any = None, bias_regularizer: Any = None, activity_regularizer: Any = None,
                 kernel_constraint: Any = None, bias_constraint: Any = None, **kwargs: Any) -> None:
        name = kwargs.get("name")
        owner = f"Conv1D '{name}'" if isinstance(name, str) else "Conv1D"
        k = _single(kernel_size, "kernel_size", owner)
        s = _single(strides, "strides", owner)
        d = _single(dilation_rate, "dilation_rate", owner)
        mode = str(padding).lower() if isinstance(padding, str) else padding
        if mode not in ("valid", "same", "causal"):
            raise ValueError(f"{owner}: padding must be 'valid', 'same' or 'causal', got {padding!r}")
        super().__init__(filters, (k, 1), strides=(s, 1), padding="valid" if mode == "causal" else mode,
                         data_format=data_format, dilation_rate=(d, 1), groups=groups, activation=activation,
                         use_bias=use_bias, kernel_initializer=kernel_initializer, bias_initializer=bias_initializer,
                         **kwargs)
        self._set_weight_policies(kernel_regularizer=kernel_regularizer, bias_regularizer=bias_regularizer,
                                  kernel_constraint=kernel_constraint, bias_constraint=bias_constraint)
        if activity_regularizer is not None:
            self.activity_regularizer = _regularizer(activity_regularizer)
        self.padding = mode

    def _params_for(self, h: int, w: int) -> ConvParams:
        if self.padding != "causal":
            return super()._params_for(h, w)
        left = self.dilation_rate[0] * (self.kernel_size[0] - 1)
        return ConvParams(stride=self.strides, pad=(left, 0, 0, 0), dilation=self.dilation_rate, groups=self.groups)

    def _image_shape(self, shape) -> tuple[int, int, int]:
        """The 2-d view of a sample shape: (steps, 1, C) channels_last, (C, steps, 1) channels_first."""
        shape = tuple(shape)
        if len(shape) != 2:
            order = "(steps, channels)" if self.data_format == "channels_last" else "(channels, steps)"
            raise ValueError(f"Conv1D '{self.name}' expects 3-d inputs (batch, {order[1:]}, got a sample shape "
                             f"{shape}")
        return (shape[0], 1, shape[1]) if self.data_format == "channels_last" else (shape[0], shape[1], 1)

    def _output_shape(self, input_shape):
        out = super()._output_shape(self._image_shape(input_shape))
        return (out[0], out[2]) if self.data_format == "channels_last" else (out[0], out[1])

    def build(self, input_shape):
        _, shape = split_batch(input_shape)
        image = self._image_shape(shape)
        owner = f"Conv1D '{self.name}'"
        h, w, c = self._split(image)
        if c % self.groups:
            raise ValueError(f"{owner}: input channels {c} are not divisible by groups={self.groups}")
        self._output_shape(shape)  # input too short for the kernel: the error before any weight
        if self.layout == "NHWC":  # internal (filters, k, 1, in/groups)
            to_internal, to_keras = (lambda a: a.transpose(2, 0, 1)[:, :, None, :]), \
                (lambda a: a[:, :, 0, :].transpose(1, 2, 0))
        else:  # internal (filters, in/groups, k, 1)
            to_internal, to_keras = (lambda a: a.transpose(2, 1, 0)[:, :, :, None]), \
                (lambda a: a[:, :, :, 0].transpose(2, 1, 0))
        self.kernel = self._add_weight("kernel", (self.kernel_size[0], c // self.groups, self.filters),
                                      self.kernel_initializer, to_internal=to_internal, to_keras=to_keras)
        self.bias = self._add_weight("bias", (self.filters,), self.bias_initializer) if self.use_bias else None
        self._conv = self._params_for(h, w)
        self._set_built(shape)

    def _forward(self, x, training, skip_softmax):
        n = int(x.shape[0])
        y = super()._forward(x.reshape(n, *self._image_shape(tuple(x.shape[1:]))), training, skip_softmax)
        return y.reshape(n, *self.output_shape)

    def backward(self, dy, need_dx=True):
        n = int(dy.shape[0])
        image_out = (self.output_shape[0], 1, self.output_shape[1]) if self.data_format == "channels_last" \
            else (self.output_shape[0], self.output_shape[1], 1)
        dx = super().backward(dy.reshape(n, *image_out), need_dx)
        return None if dx is None else dx.reshape(n, *self.input_shape)

    def get_config(self):
        config = super().get_config()
        return {**config, "kernel_size": [self.kernel_size[0]], "strides": [self.strides[0]],
                "dilation_rate": [self.dilation_rate[0]]}


Convolution1D = Conv1D


# ------------------------------------------------------------------------------ transposed convolutions
def _deconv_output_length(length: int, k: int, padding: str, output_padding: "int | None", stride: int,
                          dilation: int) -> int:
    """Keras's ``deconv_output_length``: one spatial axis of a transposed convolution's output."""
    eff = (k - 1) * dilation + 1
    if output_padding is None:
        return length * stride + max(eff - stride, 0) if padding == "valid" else length * stride
    pad = eff // 2 if padding == "same" else 0
    return (length - 1) * stride + eff - 2 * pad + output_padding


class _ConvTranspose(Layer):
    """Keras 3's ``BaseConvTranspose``: ``activation(conv_transpose(x, kernel) + bias)`` written in
    ``keras.ops`` (:func:`dnnbind.ops.conv_transpose`: cuDNN's backward-data convolution on the device,
    differentiated by the op tape). Kernel layout ``(*kernel_size, filters, in_channels)``, bias
    ``(filters,)``, as Keras."""

    rank = 2

    def __init__(self, filters: int, kernel_size: Any, strides: Any = 1, padding: str = "valid",
                 output_padding: Any = None, data_format: str | None = None, dilation_rate: Any = 1,
                 activation: Any = None, use_bias: bool = True, kernel_initializer: Any = "glorot_uniform",
                 bias_initializer: Any = "zeros", kernel_regularizer: Any = None, bias_regularizer: Any = None,
                 activity_regularizer: Any = None, kernel_constraint: Any = None, bias_constraint: Any = None,
                 **kwargs: Any) -> None:
        super().__init__(activity_regularizer=activity_regularizer, **kwargs)
        owner = f"{type(self).__name__} '{self.name}'"
        n = self.rank
        self.filters = _validate.positive_int(filters, "filters", owner)
        self.kernel_size = spatial_tuple(kernel_size, n, "kernel_size", owner)
        self.strides = spatial_tuple(strides, n, "strides", owner)
        self.dilation_rate = spatial_tuple(dilation_rate, n, "dilation_rate", owner)
        self.padding = padding_mode(padding, owner)
        self.output_padding = None if output_padding is None else spatial_tuple(
            output_padding, n, "output_padding", owner, minimum=0)
        self.data_format = data_format_to_layout(data_format, owner)[0]
        self.activation = _activations.get(activation)
        self.use_bias = _validate.boolean(use_bias, "use_bias", owner)
        self.kernel_initializer = _init.get(kernel_initializer)
        self.bias_initializer = _init.get(bias_initializer)
        self.kernel_regularizer = _regularizers.get(kernel_regularizer)
        self.bias_regularizer = _regularizers.get(bias_regularizer)
        self.kernel_constraint = _constraints.get(kernel_constraint)
        self.bias_constraint = _constraints.get(bias_constraint)

    def _check_rank(self, input_shape) -> tuple:
        shape = tuple(input_shape)
        if len(shape) != self.rank + 2:
            axes = ", ".join(["channels"] + [f"dim{i + 1}" for i in range(self.rank)]) if \
                self.data_format == "channels_first" else ", ".join([f"dim{i + 1}" for i in range(self.rank)] +
                                                                   ["channels"])
            raise ValueError(f"{type(self).__name__} '{self.name}' expects {self.rank + 2}-d inputs (batch, {axes}), "
                             f"got shape {shape}")
        return shape

    def build(self, input_shape):
        shape = self._check_rank(input_shape)
        channels = shape[-1] if self.data_format == "channels_last" else shape[1]
        if channels is None:
            raise ValueError(f"{type(self).__name__} '{self.name}': the channel axis of the input must be known, "
                             f"got shape {shape}")
        self.compute_output_shape(shape)  # too small an input: the error before any weight
        self.kernel = self.add_weight(shape=self.kernel_size + (self.filters, int(channels)),
                                      initializer=self.kernel_initializer, regularizer=self.kernel_regularizer,
                                      constraint=self.kernel_constraint, name="kernel")
        self.bias = self.add_weight(shape=(self.filters,), initializer=self.bias_initializer,
                                    regularizer=self.bias_regularizer, constraint=self.bias_constraint,
                                    name="bias") if self.use_bias else None
        self.built = True

    def call(self, inputs):
        y = _ops.conv_transpose(inputs, self.kernel, strides=self.strides, padding=self.padding,
                                output_padding=self.output_padding, data_format=self.data_format,
                                dilation_rate=self.dilation_rate)
        if self.bias is not None:
            shape = (1,) * (self.rank + 1) + (self.filters,) if self.data_format == "channels_last" \
                else (1, self.filters) + (1,) * self.rank
            y = _ops.add(y, _ops.reshape(self.bias, shape))
        return self.activation(y)

    def compute_output_shape(self, input_shape):
        shape = self._check_rank(input_shape)
        spatial = shape[1:-1] if self.data_format == "channels_last" else shape[2:]
        out = []
        for i, length in enumerate(spatial):
            pad = None if self.output_padding is None else self.output_padding[i]
            n = None if length is None else _deconv_output_length(int(length), self.kernel_size[i], self.padding, pad,
                                                                  self.strides[i], self.dilation_rate[i])
            if n is not None and n < 1:
                raise ValueError(f"{type(self).__name__} '{self.name}': input {tuple(spatial)} gives an empty output "
                                 f"(axis {i}: {n}) with kernel_size {self.kernel_size}, strides {self.strides}, "
                                 f"padding '{self.padding}', output_padding {self.output_padding}")
            out.append(n)
        if self.data_format == "channels_last":
            return (shape[0], *out, self.filters)
        return (shape[0], self.filters, *out)

    def get_config(self):
        config = super().get_config()
        for key in ("kernel_regularizer", "bias_regularizer", "kernel_constraint", "bias_constraint"):
            config.pop(key, None)
        ser = {"kernel_regularizer": _regularizers.serialize, "bias_regularizer": _regularizers.serialize,
               "kernel_constraint": _constraints.serialize, "bias_constraint": _constraints.serialize}
        return {**config, "filters": self.filters, "kernel_size": list(self.kernel_size),
                "strides": list(self.strides), "padding": self.padding,
                "output_padding": None if self.output_padding is None else list(self.output_padding),
                "data_format": self.data_format, "dilation_rate": list(self.dilation_rate),
                "activation": _activations.serialize(self.activation), "use_bias": self.use_bias,
                "kernel_initializer": _init.serialize(self.kernel_initializer),
                "bias_initializer": _init.serialize(self.bias_initializer),
                **{key: None if getattr(self, key) is None else fn(getattr(self, key)) for key, fn in ser.items()}}


@register
class Conv1DTranspose(_ConvTranspose):
    """Transposed 1-d convolution over ``(batch, steps, channels)`` (channels_last) or ``(batch, channels,
    steps)``; kernel ``(kernel_size, filters, in_channels)``."""

    rank = 1


@register
class Conv2DTranspose(_ConvTranspose):
    """Transposed 2-d convolution ("deconvolution") over NHWC (channels_last) or NCHW inputs; kernel
    ``(kh, kw, filters, in_channels)``. Output size per axis ``in * stride`` (``"same"``) or
    ``in * stride + max(kernel - stride, 0)`` (``"valid"``), or as ``output_padding`` sets it (Keras)."""

    rank = 2


@register
class Conv3DTranspose(_ConvTranspose):
    """Transposed 3-d convolution over ``(batch, d, h, w, channels)`` (channels_last) or ``(batch, channels,
    d, h, w)``; kernel ``(kd, kh, kw, filters, in_channels)`` (computed as 2-d transposed convolutions
    per depth tap, :func:`dnnbind.ops.conv_transpose`)."""

    rank = 3


Convolution1DTranspose = Conv1DTranspose
Convolution2DTranspose = Conv2DTranspose
Convolution3DTranspose = Conv3DTranspose
__all__ += ["Conv1DTranspose", "Conv2DTranspose", "Conv3DTranspose", "Convolution1DTranspose",
            "Convolution2DTranspose", "Convolution3DTranspose"]


# ----------------------------------------------------------------------------------------------------------
# Conv3D, DepthwiseConv1D and SeparableConv1D: written in keras.ops (ops.conv, ops.depthwise_conv,
# ops.separable_conv: cuDNN convolutions on the device, 1-d as 2-d of unit height, 3-d as sums over the depth
# taps of 2-d convolutions; differentiated by the op tape).
class _ConvOps(Layer):
    """The checks, weights and bias of the convolutions written in ``keras.ops``."""

    rank = 3
    #: (weight name, its argument prefix) in creation order, as Keras
    _kernels: tuple = (("kernel", "kernel"),)

    def __init__(self, kernel_size: Any, strides: Any, padding: str, data_format: "str | None", dilation_rate: Any,
                 activation: Any, use_bias: bool, bias_initializer: Any, activity_regularizer: Any,
                 policies: dict, **kwargs: Any) -> None:
        super().__init__(activity_regularizer=activity_regularizer, **{**policies, **kwargs})
        owner = self._owner
        n = self.rank
        self.kernel_size = spatial_tuple(kernel_size, n, "kernel_size", owner)
        self.strides = spatial_tuple(strides, n, "strides", owner)
        self.dilation_rate = spatial_tuple(dilation_rate, n, "dilation_rate", owner)
        if max(self.strides) > 1 and max(self.dilation_rate) > 1:
            raise ValueError(f"{owner}: strides > 1 cannot be combined with dilation_rate > 1 (Keras), got strides "
                             f"{self.strides} and dilation_rate {self.dilation_rate}")
        self.padding = padding_mode(padding, owner)
        fmt = _backend.image_data_format() if data_format is None else str(data_format).lower()
        self.data_format = _validate.one_of(fmt, "data_format", owner, ("channels_last", "channels_first"))
        self.activation = _activations.get(activation)
        self.use_bias = _validate.boolean(use_bias, "use_bias", owner)
        self.bias_initializer = _init.get(bias_initializer)
        self.bias = None

    @property
    def _owner(self) -> str:
        return f"{type(self).__name__} '{self.name}'"

    def _check_rank(self, input_shape: Any) -> tuple:
        shape = tuple(input_shape)
        if len(shape) != self.rank + 2:
            spatial = ["steps"] if self.rank == 1 else [f"dim{i + 1}" for i in range(self.rank)]
            axes = spatial + ["channels"] if self.data_format == "channels_last" else ["channels"] + spatial
            raise ValueError(f"{self._owner} expects {self.rank + 2}-d inputs (batch, {', '.join(axes)}), got shape "
                             f"{shape}")
        return shape

    def _channels(self, shape: tuple) -> int:
        c = shape[-1] if self.data_format == "channels_last" else shape[1]
        if c is None:
            raise ValueError(f"{self._owner}: the channel axis of the input must be known, got shape {shape}")
        return int(c)

    def _out_channels(self, channels: int) -> int:
        raise NotImplementedError

    def _kernel_shapes(self, channels: int) -> list:
        raise NotImplementedError

    def build(self, input_shape: Any) -> None:
        shape = self._check_rank(input_shape)
        channels = self._channels(shape)
        self.compute_output_shape(shape)  # too small an input: the error before any weight
        for (name, prefix), kshape in zip(self._kernels, self._kernel_shapes(channels)):
            w = self.add_weight(shape=kshape, initializer=getattr(self, f"{prefix}_initializer"), name=name)
            w.regularizer = self._policy_for(prefix, "regularizer")
            w.constraint = self._policy_for(prefix, "constraint")
            setattr(self, name, w)
        if self.use_bias:
            self.bias = self.add_weight(shape=(self._out_channels(channels),), initializer=self.bias_initializer,
                                        name="bias")
        self.built = True

    def _convolve(self, inputs: Any) -> Any:
        raise NotImplementedError

    def call(self, inputs: Any) -> Any:
        self._check_rank(inputs.shape)
        y = self._convolve(inputs)
        if self.bias is not None:
            k = int(self.bias.shape[0])
            shape = (1,) * (self.rank + 1) + (k,) if self.data_format == "channels_last" else (1, k) + (1,) * self.rank
            y = _ops.add(y, _ops.reshape(self.bias, shape))
        return self.activation(y)

    def compute_output_shape(self, input_shape: Any) -> tuple:
        shape = self._check_rank(input_shape)
        spatial = shape[1:-1] if self.data_format == "channels_last" else shape[2:]
        out = []
        for i, n in enumerate(spatial):
            if n is None:
                out.append(None)
                continue
            eff = (self.kernel_size[i] - 1) * self.dilation_rate[i] + 1
            size = -(-int(n) // self.strides[i]) if self.padding == "same" else (int(n) - eff) // self.strides[i] + 1
            if size < 1:
                raise ValueError(f"{self._owner}: input {tuple(spatial)} gives an empty output (axis {i}) with "
                                 f"kernel_size {self.kernel_size}, dilation_rate {self.dilation_rate}, strides "
                                 f"{self.strides}, padding '{self.padding}'")
            out.append(size)
        k = self._out_channels(self._channels(shape))
        return (shape[0], *out, k) if self.data_format == "channels_last" else (shape[0], k, *out)

    def get_config(self) -> dict:
        config = super().get_config()
        prefixes = [p for _, p in self._kernels] + ["bias"]
        for p in prefixes:
            config.setdefault(f"{p}_regularizer", None)
            config.setdefault(f"{p}_constraint", None)
        config.setdefault("activity_regularizer", None)
        return {**config, "kernel_size": list(self.kernel_size), "strides": list(self.strides),
                "padding": self.padding, "data_format": self.data_format, "dilation_rate": list(self.dilation_rate),
                "activation": _activations.serialize(self.activation), "use_bias": self.use_bias,
                **{f"{p}_initializer": _init.serialize(getattr(self, f"{p}_initializer")) for _, p in self._kernels},
                "bias_initializer": _init.serialize(self.bias_initializer)}


@register
class Conv3D(_ConvOps):
    """``Conv3D(filters, kernel_size, strides=(1, 1, 1), padding="valid", data_format=None, dilation_rate=(1, 1, 1),
    groups=1, activation=None, use_bias=True, kernel_initializer="glorot_uniform", bias_initializer="zeros", ...)``
    over ``(batch, d1, d2, d3, channels)`` (or channels first). Kernel ``(k1, k2, k3, channels / groups,
    filters)``, bias ``(filters,)``, as Keras."""

    rank = 3

    def __init__(self, filters: int, kernel_size: Any, strides: Any = (1, 1, 1), padding: str = "valid",
                 data_format: "str | None" = None, dilation_rate: Any = (1, 1, 1), groups: int = 1,
                 activation: Any = None, use_bias: bool = True, kernel_initializer: Any = "glorot_uniform",
                 bias_initializer: Any = "zeros", kernel_regularizer: Any = None, bias_regularizer: Any = None,
                 activity_regularizer: Any = None, kernel_constraint: Any = None, bias_constraint: Any = None,
                 **kwargs: Any) -> None:
        policies = dict(kernel_regularizer=kernel_regularizer, bias_regularizer=bias_regularizer,
                        kernel_constraint=kernel_constraint, bias_constraint=bias_constraint)
        super().__init__(kernel_size, strides, padding, data_format, dilation_rate, activation, use_bias,
                         bias_initializer, activity_regularizer, {k: v for k, v in policies.items() if v is not None},
                         **kwargs)
        self.filters = _validate.positive_int(filters, "filters", self._owner)
        self.groups = _validate.positive_int(groups, "groups", self._owner)
        if self.filters % self.groups:
            raise ValueError(f"{self._owner}: filters ({self.filters}) must be a multiple of groups ({self.groups})")
        self.kernel_initializer = _init.get(kernel_initializer)
        self.kernel = None

    def _out_channels(self, channels: int) -> int:
        return self.filters

    def _kernel_shapes(self, channels: int) -> list:
        if channels % self.groups:
            raise ValueError(f"{self._owner}: the input channels ({channels}) must be a multiple of groups "
                             f"({self.groups})")
        return [self.kernel_size + (channels // self.groups, self.filters)]

    def _convolve(self, inputs: Any) -> Any:
        return _ops.conv(inputs, self.kernel, strides=self.strides, padding=self.padding,
                         data_format=self.data_format, dilation_rate=self.dilation_rate)

    def get_config(self) -> dict:
        return {**super().get_config(), "filters": self.filters, "groups": self.groups}


@register
class DepthwiseConv1D(_ConvOps):
    """``DepthwiseConv1D(kernel_size, strides=1, padding="valid", depth_multiplier=1, data_format=None,
    dilation_rate=1, activation=None, use_bias=True, depthwise_initializer="glorot_uniform", ...)``: each
    channel of ``(batch, steps, channels)`` convolved with its own ``depth_multiplier`` filters (output channel
    ``c * depth_multiplier + m``). Kernel ``kernel`` ``(kernel_size, channels, depth_multiplier)``, bias
    ``(channels * depth_multiplier,)``, as Keras."""

    rank = 1
    _kernels = (("kernel", "depthwise"),)

    def __init__(self, kernel_size: Any, strides: Any = 1, padding: str = "valid", depth_multiplier: int = 1,
                 data_format: "str | None" = None, dilation_rate: Any = 1, activation: Any = None,
                 use_bias: bool = True, depthwise_initializer: Any = "glorot_uniform", bias_initializer: Any = "zeros",
                 depthwise_regularizer: Any = None, bias_regularizer: Any = None, activity_regularizer: Any = None,
                 depthwise_constraint: Any = None, bias_constraint: Any = None, **kwargs: Any) -> None:
        policies = dict(depthwise_regularizer=depthwise_regularizer, bias_regularizer=bias_regularizer,
                        depthwise_constraint=depthwise_constraint, bias_constraint=bias_constraint)
        super().__init__(kernel_size, strides, padding, data_format, dilation_rate, activation, use_bias,
                         bias_initializer, activity_regularizer, {k: v for k, v in policies.items() if v is not None},
                         **kwargs)
        self.depth_multiplier = _validate.positive_int(depth_multiplier, "depth_multiplier", self._owner)
        self.depthwise_initializer = _init.get(depthwise_initializer)
        self.kernel = None

    def _out_channels(self, channels: int) -> int:
        return channels * self.depth_multiplier

    def _kernel_shapes(self, channels: int) -> list:
        return [self.kernel_size + (channels, self.depth_multiplier)]

    def _convolve(self, inputs: Any) -> Any:
        return _ops.depthwise_conv(inputs, self.kernel, strides=self.strides, padding=self.padding,
                                   data_format=self.data_format, dilation_rate=self.dilation_rate)

    def get_config(self) -> dict:
        return {**super().get_config(), "depth_multiplier": self.depth_multiplier}


@register
class SeparableConv1D(_ConvOps):
    """``SeparableConv1D(filters, kernel_size, strides=1, padding="valid", data_format=None, dilation_rate=1,
    depth_multiplier=1, activation=None, use_bias=True, depthwise_initializer="glorot_uniform",
    pointwise_initializer="glorot_uniform", bias_initializer="zeros", ...)``: a depthwise convolution then a
    pointwise one. Weights ``depthwise_kernel`` ``(kernel_size, channels, depth_multiplier)``,
    ``pointwise_kernel`` ``(1, channels * depth_multiplier, filters)``, ``bias`` ``(filters,)``, as Keras."""

    rank = 1
    _kernels = (("depthwise_kernel", "depthwise"), ("pointwise_kernel", "pointwise"))

    def __init__(self, filters: int, kernel_size: Any, strides: Any = 1, padding: str = "valid",
                 data_format: "str | None" = None, dilation_rate: Any = 1, depth_multiplier: int = 1,
                 activation: Any = None, use_bias: bool = True, depthwise_initializer: Any = "glorot_uniform",
                 pointwise_initializer: Any = "glorot_uniform", bias_initializer: Any = "zeros",
                 depthwise_regularizer: Any = None, pointwise_regularizer: Any = None, bias_regularizer: Any = None,
                 activity_regularizer: Any = None, depthwise_constraint: Any = None, pointwise_constraint: Any = None,
                 bias_constraint: Any = None, **kwargs: Any) -> None:
        policies = dict(depthwise_regularizer=depthwise_regularizer, pointwise_regularizer=pointwise_regularizer,
                        bias_regularizer=bias_regularizer, depthwise_constraint=depthwise_constraint,
                        pointwise_constraint=pointwise_constraint, bias_constraint=bias_constraint)
        super().__init__(kernel_size, strides, padding, data_format, dilation_rate, activation, use_bias,
                         bias_initializer, activity_regularizer, {k: v for k, v in policies.items() if v is not None},
                         **kwargs)
        self.filters = _validate.positive_int(filters, "filters", self._owner)
        self.depth_multiplier = _validate.positive_int(depth_multiplier, "depth_multiplier", self._owner)
        self.depthwise_initializer = _init.get(depthwise_initializer)
        self.pointwise_initializer = _init.get(pointwise_initializer)
        self.depthwise_kernel = self.pointwise_kernel = None

    def _out_channels(self, channels: int) -> int:
        return self.filters

    def _kernel_shapes(self, channels: int) -> list:
        return [self.kernel_size + (channels, self.depth_multiplier),
                (1,) * self.rank + (channels * self.depth_multiplier, self.filters)]

    def _convolve(self, inputs: Any) -> Any:
        return _ops.separable_conv(inputs, self.depthwise_kernel, self.pointwise_kernel, strides=self.strides,
                                   padding=self.padding, data_format=self.data_format,
                                   dilation_rate=self.dilation_rate)

    def get_config(self) -> dict:
        return {**super().get_config(), "filters": self.filters, "depth_multiplier": self.depth_multiplier}


Convolution3D = Conv3D
SeparableConvolution1D = SeparableConv1D
__all__ += ["Conv3D", "Convolution3D", "DepthwiseConv1D", "SeparableConv1D", "SeparableConvolution1D"]
