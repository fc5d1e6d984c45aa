"""Pooling layers: MaxPooling2D, AveragePooling2D, GlobalAveragePooling2D (Keras 3 arguments)."""

from __future__ import annotations

from typing import Any, Sequence

from dnnbind import _validate, ops
from dnnbind.ops._params import PoolParams, resolve_padding

from .base import Layer, register, split_batch
from .conv import check_image_shape, data_format_to_layout

__all__ = ["MaxPooling2D", "MaxPool2D", "AveragePooling2D", "AvgPool2D", "GlobalAveragePooling2D",
           "GlobalAvgPool2D"]


class _Pooling2D(Layer):
    _mode = "max"

    def __init__(self, pool_size: "int | Sequence[int]" = (2, 2), strides: "int | Sequence[int] | None" = None,
                 padding: str = "valid", data_format: str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        owner = f"{type(self).__name__} '{self.name}'"
        self.pool_size = _validate.int_pair(pool_size, "pool_size", owner)
        self.strides = self.pool_size if strides is None else _validate.int_pair(strides, "strides", owner)
        if str(padding).lower() not in ("valid", "same"):
            raise ValueError(f"{owner}: padding must be 'valid' or 'same', got {padding!r}")
        self.padding = str(padding).lower()
        self.data_format, self.layout = data_format_to_layout(data_format, owner)

    def _hw_c(self, shape):
        return (shape[0], shape[1], shape[2]) if self.data_format == "channels_last" else (shape[1], shape[2], shape[0])

    def _params_for(self, h: int, w: int) -> PoolParams:
        pad = resolve_padding(self.padding, (h, w), self.pool_size, self.strides)
        return PoolParams(mode=self._mode, window=self.pool_size, stride=self.strides, pad=pad)

    def _output_shape(self, input_shape):
        owner = f"{type(self).__name__} '{self.name}'"
        check_image_shape(tuple(input_shape), owner, self.data_format)
        h, w, c = self._hw_c(input_shape)
        oh, ow = self._params_for(h, w).output_hw((h, w))
        if oh < 1 or ow < 1:
            raise ValueError(f"{owner}: input {h}x{w} is smaller than pool_size {self.pool_size}")
        return (oh, ow, c) if self.data_format == "channels_last" else (c, oh, ow)

    def build(self, input_shape):
        _, shape = split_batch(input_shape)
        h, w, _ = self._hw_c(shape) if len(shape) == 3 else (0, 0, 0)
        self._set_built(shape)
        self._pool = self._params_for(h, w)

    def _kwargs(self) -> dict:
        p = self._pool
        return {"mode": p.mode, "window": p.window, "stride": p.stride, "padding": p.pad, "layout": self.layout}

    def forward(self, x, training=False):
        y = ops.pool2d_forward(x, **self._kwargs())
        if training:
            self._x, self._y = x, y
        return y

    def backward(self, dy, need_dx=True):
        dx = ops.pool2d_backward(dy, self._x, self._y, **self._kwargs())
        self._x = self._y = None
        return dx

    def get_config(self):
        return {**super().get_config(), "pool_size": list(self.pool_size), "strides": list(self.strides),
                "padding": self.padding, "data_format": self.data_format}


@register
class MaxPooling2D(_Pooling2D):
    """Max over ``pool_size`` windows (``strides`` default to ``pool_size``)."""

    _mode = "max"


@register
class AveragePooling2D(_Pooling2D):
    """Average over windows; with ``padding="same"`` the padding is excluded from the count (as Keras)."""

    _mode = "avg"


MaxPool2D = MaxPooling2D
AvgPool2D = AveragePooling2D


@register
class GlobalAveragePooling2D(Layer):
    """Mean over height and width: ``(N, H, W, C) -> (N, C)`` (or ``(N, 1, 1, C)`` with keepdims)."""

    def __init__(self, data_format: str | None = None, keepdims: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        owner = f"GlobalAveragePooling2D '{self.name}'"
        self.data_format, self.layout = data_format_to_layout(data_format, owner)
        self.keepdims = _validate.boolean(keepdims, "keepdims", owner)

    def _output_shape(self, input_shape):
        check_image_shape(tuple(input_shape), f"GlobalAveragePooling2D '{self.name}'", self.data_format)
        c = input_shape[2] if self.data_format == "channels_last" else input_shape[0]
        if not self.keepdims:
            return (c,)
        return (1, 1, c) if self.data_format == "channels_last" else (c, 1, 1)

    def forward(self, x, training=False):
        n = int(x.shape[0])
        y = ops.global_avg_pool2d_forward(x, layout=self.layout)
        self._x_shape = tuple(x.shape)
        self._op_shape = tuple(y.shape)
        out = self._output_shape(tuple(x.shape[1:]))
        return y if tuple(y.shape) == (n, *out) else y.reshape(n, *out)

    def backward(self, dy, need_dx=True):
        if tuple(dy.shape) != self._op_shape:
            dy = dy.reshape(*self._op_shape)
        return ops.global_avg_pool2d_backward(dy, self._x_shape, layout=self.layout)

    def get_config(self):
        return {**super().get_config(), "data_format": self.data_format, "keepdims": self.keepdims}


GlobalAvgPool2D = GlobalAveragePooling2D
