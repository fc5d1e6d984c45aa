"""Conv2D (Keras 3 arguments), computed by ``ops.conv2d_*`` in NHWC (channels_last) or NCHW."""

from __future__ import annotations

from typing import Any, Sequence

from dnnbind import _validate, ops
from dnnbind import initializers as _init
from dnnbind.ops._params import ConvParams, resolve_padding

from .base import Layer, register, split_batch
from .core import _ActivationMixin

__all__ = ["Conv2D", "Convolution2D", "data_format_to_layout"]


def data_format_to_layout(data_format: str | None, owner: str) -> tuple[str, str]:
    """``(data_format, layout)``: None -> channels_last (Keras's default) -> NHWC."""
    fmt = "channels_last" if data_format is None else str(data_format).lower()
    if fmt == "channels_last":
        return fmt, "NHWC"
    if fmt == "channels_first":
        return fmt, "NCHW"
    raise ValueError(f"{owner}: data_format must be 'channels_last' or 'channels_first', got {data_format!r}")


def check_image_shape(shape: tuple[int, ...], owner: str, data_format: str) -> None:
    if len(shape) != 3:
        order = "(height, width, channels)" if data_format == "channels_last" else "(channels, height, width)"
        raise ValueError(f"{owner} expects 4-d inputs (batch, {order[1:]}, got a sample shape {shape}")


@register
class Conv2D(_ActivationMixin, Layer):
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
        owner = f"Conv2D '{self.name}'"
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

    def _output_shape(self, input_shape):
        owner = f"Conv2D '{self.name}'"
        check_image_shape(tuple(input_shape), owner, self.data_format)
        h, w, _ = self._split(input_shape)
        oh, ow = self._params_for(h, w).output_hw((h, w), self.kernel_size)
        if oh < 1 or ow < 1:
            raise ValueError(
                f"{owner}: input {h}x{w} is too small for kernel {self.kernel_size} with padding "
                f"'{self.padding}' (output would be {oh}x{ow})"
            )
        return (oh, ow, self.filters) if self.data_format == "channels_last" else (self.filters, oh, ow)

    def build(self, input_shape):
        _, shape = split_batch(input_shape)
        owner = f"Conv2D '{self.name}'"
        check_image_shape(shape, owner, self.data_format)
        h, w, c = self._split(shape)
        if c % self.groups:
            raise ValueError(f"{owner}: input channels {c} are not divisible by groups={self.groups}")
        self._conv = self._params_for(h, w)
        kh, kw = self.kernel_size
        if self.layout == "NHWC":
            to_internal, to_keras = (lambda a: a.transpose(3, 0, 1, 2)), (lambda a: a.transpose(1, 2, 3, 0))
        else:
            to_internal, to_keras = (lambda a: a.transpose(3, 2, 0, 1)), (lambda a: a.transpose(2, 3, 1, 0))
        self.kernel = self.add_weight("kernel", (kh, kw, c // self.groups, self.filters), self.kernel_initializer,
                                      to_internal=to_internal, to_keras=to_keras)
        self.bias = self.add_weight("bias", (self.filters,), self.bias_initializer) if self.use_bias else None
        self._set_built(shape)

    def _conv_kwargs(self) -> dict:
        p = self._conv
        return {"stride": p.stride, "padding": p.pad, "dilation": p.dilation, "groups": p.groups,
                "layout": self.layout}

    def _forward(self, x, training, skip_softmax):
        x = self._cast_input(x)
        w = self._compute_weight(self.kernel)
        act = self.activation
        if self.bias is not None and act.kind in (None, "relu"):
            # Kernel fusion: one cudnnConvolutionBiasActivationForward on the GPU (one pass less
            # over the output on NumPy) instead of conv, bias add and activation.
            y = ops.conv2d_bias_activation_forward(x, w, self._compute_weight(self.bias),
                                                   activation=act.kind or "linear", **self._conv_kwargs())
            self._skipped_softmax = False
            if training:
                self._x, self._w = x, w
                act.remember(y, y)  # relu's gradient mask, x > 0, is y > 0
            return y
        z = ops.conv2d_forward(x, w, **self._conv_kwargs())
        if self.bias is not None:
            z = ops.bias_add(z, self._compute_weight(self.bias), layout=self.layout)
        if training:
            self._x, self._w = x, w
        return self._activate(z, training, skip_softmax)

    def backward(self, dy, need_dx=True):
        dz = self._activation_backward(dy)
        kw = self._conv_kwargs()
        if self.trainable:
            dw = ops.conv2d_backward_filter(self._x, dz, tuple(self._w.shape), **kw)
            self.grads["kernel"] = self._to_variable_dtype(dw, self.kernel)
            if self.bias is not None:
                self.grads["bias"] = self._to_variable_dtype(ops.bias_backward(dz, layout=self.layout), self.bias)
        dx = ops.conv2d_backward_data(dz, self._w, tuple(self._x.shape), **kw) if need_dx else None
        self._x = self._w = None
        return dx

    def get_config(self):
        return {**super().get_config(), "filters": self.filters, "kernel_size": list(self.kernel_size),
                "strides": list(self.strides), "padding": self.padding, "data_format": self.data_format,
                "dilation_rate": list(self.dilation_rate), "groups": self.groups,
                "activation": self.activation.name, "use_bias": self.use_bias,
                "kernel_initializer": _init.serialize(self.kernel_initializer),
                "bias_initializer": _init.serialize(self.bias_initializer)}


Convolution2D = Conv2D
