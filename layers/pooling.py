"""Pooling layers (Keras 3 arguments): MaxPooling2D, AveragePooling2D, GlobalAveragePooling2D,
GlobalMaxPooling2D, GlobalMaxPooling1D, GlobalAveragePooling1D (hand-written forward/backward); MaxPooling1D/3D,
AveragePooling1D/3D, GlobalMaxPooling3D, GlobalAveragePooling3D and the adaptive poolings (written in keras.ops)."""

from __future__ import annotations

from typing import Any, Sequence

from dnnbind import _validate, kernels
from dnnbind import backend as _backend
from dnnbind import ops as _ops
from dnnbind.autodiff.tensor import Tensor
from dnnbind.kernels._params import PoolParams, resolve_padding
from dnnbind.ops._nn_common import padding_mode, spatial_tuple

from .base import Layer, is_symbolic, register, split_batch
from .conv import check_image_shape, data_format_to_layout

__all__ = ["MaxPooling2D", "MaxPool2D", "AveragePooling2D", "AvgPool2D", "GlobalAveragePooling2D",
           "GlobalAvgPool2D", "GlobalMaxPooling2D", "GlobalMaxPool2D", "GlobalMaxPooling1D", "GlobalMaxPool1D",
           "GlobalAveragePooling1D", "GlobalAvgPool1D"]


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
        y = kernels.pool2d_forward(x, **self._kwargs())
        if training:
            d = self.__dict__  # per-step fields (see Layer.__setattr__)
            d["_x"], d["_y"] = x, y
        return y

    def backward(self, dy, need_dx=True):
        dx = kernels.pool2d_backward(dy, self._x, self._y, **self._kwargs())
        d = self.__dict__
        d["_x"] = d["_y"] = None
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




class _GlobalPooling(Layer):
    """Max or mean over every spatial axis, through the 2-d ops on a 4-d view of the input.

    1-d inputs ``(N, steps, C)`` are viewed as ``(N, steps, 1, C)`` (NHWC) and ``(N, C, steps)`` as
    ``(N, C, steps, 1)`` (NCHW): the same memory, so the reshapes are views. Max pooling is one
    pooling window covering the whole map (cuDNN pooling on the GPU); the gradient goes to the first
    maximum in row-major order, as ``kernels.pool2d_backward``.
    """

    _rank = 2
    _mode = "max"

    def __init__(self, data_format: str | None = None, keepdims: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        owner = f"{type(self).__name__} '{self.name}'"
        self.data_format, self.layout = data_format_to_layout(data_format, owner)
        self.keepdims = _validate.boolean(keepdims, "keepdims", owner)

    def _image_shape(self, shape) -> tuple[int, int, int]:
        shape = tuple(shape)
        owner = f"{type(self).__name__} '{self.name}'"
        if self._rank == 2:
            check_image_shape(shape, owner, self.data_format)
            return shape
        if len(shape) != 2:
            order = "(steps, features)" if self.data_format == "channels_last" else "(features, steps)"
            raise ValueError(f"{owner} expects 3-d inputs (batch, {order[1:]}, got a sample shape {shape}")
        return (shape[0], 1, shape[1]) if self.data_format == "channels_last" else (shape[0], shape[1], 1)

    def _output_shape(self, input_shape):
        image = self._image_shape(input_shape)
        c = image[2] if self.data_format == "channels_last" else image[0]
        if not self.keepdims:
            return (c,)
        ones = (1,) * self._rank
        return (*ones, c) if self.data_format == "channels_last" else (c, *ones)

    def forward(self, x, training=False):
        n = int(x.shape[0])
        x4 = x.reshape(n, *self._image_shape(tuple(x.shape[1:])))
        if self._mode == "avg":
            y = kernels.global_avg_pool2d_forward(x4, layout=self.layout)
            y4 = None
        else:
            hw = (int(x4.shape[1]), int(x4.shape[2])) if self.layout == "NHWC" else (int(x4.shape[2]),
                                                                                      int(x4.shape[3]))
            y4 = kernels.pool2d_forward(x4, mode="max", window=hw, stride=hw, padding=0, layout=self.layout)
            y = y4
        if training:  # the mean's gradient needs only the shape; the max's needs the input
            self._x4 = x4 if y4 is not None else None
            self._y4, self._x4_shape, self._x_shape = y4, tuple(x4.shape), tuple(x.shape)
        return y.reshape(n, *self._output_shape(tuple(x.shape[1:])))

    def backward(self, dy, need_dx=True):
        x4, y4, x4_shape, x_shape = self._x4, self._y4, self._x4_shape, self._x_shape
        n = int(dy.shape[0])
        if y4 is None:
            dx4 = kernels.global_avg_pool2d_backward(dy.reshape(n, int(dy.size) // n), x4_shape, layout=self.layout)
        else:
            hw = x4_shape[1:3] if self.layout == "NHWC" else x4_shape[2:4]
            dx4 = kernels.pool2d_backward(dy.reshape(*y4.shape), x4, y4, mode="max", window=hw, stride=hw, padding=0,
                                      layout=self.layout)
        self._x4 = self._y4 = None
        return dx4.reshape(*x_shape)

    def get_config(self):
        return {**super().get_config(), "data_format": self.data_format, "keepdims": self.keepdims}


@register
class GlobalMaxPooling2D(_GlobalPooling):
    """Max over height and width: ``(N, H, W, C) -> (N, C)`` (or ``(N, 1, 1, C)`` with keepdims)."""

    _rank, _mode = 2, "max"


@register
class GlobalMaxPooling1D(_GlobalPooling):
    """Max over steps: ``(N, steps, C) -> (N, C)`` (or ``(N, 1, C)`` with keepdims)."""

    _rank, _mode = 1, "max"


@register
class GlobalAveragePooling1D(_GlobalPooling):
    """Mean over steps: ``(N, steps, C) -> (N, C)`` (or ``(N, 1, C)`` with keepdims). With a mask
    ``(N, steps)`` (the ``mask`` call argument, else the Keras mask the input carries, e.g. from
    ``Embedding(mask_zero=True)``), the mean of the unmasked steps, as Keras 3 (a fully masked row divides
    by 0, as there); computed in ``keras.ops``, so it trains with no hand-written backward."""

    _rank, _mode = 1, "avg"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        mask = kwargs.get("mask")
        x = args[0] if args else kwargs.get("inputs")
        if mask is None and isinstance(x, Tensor):
            mask = getattr(x, "_keras_mask", None)
        if mask is None or is_symbolic(x) or is_symbolic(mask):
            return super().__call__(*args, **kwargs)
        return self._masked_mean(x, mask)

    def _masked_mean(self, x: Any, mask: Any) -> Any:
        owner = f"GlobalAveragePooling1D '{self.name}'"
        x = self._convert_inputs(x)
        if x.ndim != 3:
            raise ValueError(f"{owner} expects 3-d inputs (batch, steps, features), got shape {tuple(x.shape)}")
        self._ensure_built((None, *tuple(x.shape)[1:]))
        mask = _ops.convert_to_tensor(mask)
        steps_axis = 1 if self.data_format == "channels_last" else 2
        if tuple(mask.shape) != (int(x.shape[0]), int(x.shape[steps_axis])):
            raise ValueError(f"{owner}: mask must have shape (batch, steps) = {(int(x.shape[0]), int(x.shape[steps_axis]))},"
                             f" got {tuple(mask.shape)}")
        keep = _ops.cast(_ops.expand_dims(mask, 2 if self.data_format == "channels_last" else 1), "bool")
        total = _ops.sum(_ops.where(keep, x, 0), axis=steps_axis, keepdims=self.keepdims)
        count = _ops.sum(_ops.cast(keep, x.dtype), axis=steps_axis, keepdims=self.keepdims)
        return _ops.divide(total, count)


@register
class GlobalAveragePooling2D(_GlobalPooling):
    """Mean over height and width: ``(N, H, W, C) -> (N, C)`` (or ``(N, 1, 1, C)`` with keepdims)."""

    _rank, _mode = 2, "avg"


GlobalAvgPool2D = GlobalAveragePooling2D
GlobalMaxPool2D = GlobalMaxPooling2D
GlobalMaxPool1D = GlobalMaxPooling1D
GlobalAvgPool1D = GlobalAveragePooling1D


# ----------------------------------------------------------------------------------------------------------
# 1-d and 3-d window pooling, 3-d global pooling and adaptive pooling: written in keras.ops (the op tape
# differentiates them; ops.max_pool / ops.average_pool run 1-d pooling as 2-d of unit height and 3-d pooling
# as a 2-d pooling of the (height, width) planes then one over depth, which is exact for max and for the
# mean of the real (unpadded) inputs, whose count factorises over the axes).
def _data_format(data_format: "str | None", owner: str) -> str:
    fmt = _backend.image_data_format() if data_format is None else str(data_format).lower()
    return _validate.one_of(fmt, "data_format", owner, ("channels_last", "channels_first"))


def _check_rank(owner: str, shape: tuple, rank: int, data_format: str) -> tuple:
    shape = tuple(shape)
    if len(shape) != rank + 2:
        spatial = [f"dim{i + 1}" for i in range(rank)] if rank > 1 else ["steps"]
        axes = spatial + ["channels"] if data_format == "channels_last" else ["channels"] + spatial
        raise ValueError(f"{owner} expects {rank + 2}-d inputs (batch, {', '.join(axes)}), got shape {shape}")
    return shape


def _spatial_of(shape: tuple, data_format: str) -> tuple:
    return tuple(shape[1:-1]) if data_format == "channels_last" else tuple(shape[2:])


def _with_spatial(shape: tuple, spatial: Sequence, data_format: str) -> tuple:
    if data_format == "channels_last":
        return (shape[0], *spatial, shape[-1])
    return (shape[0], shape[1], *spatial)


class _PoolingND(Layer):
    """Keras 3's ``BasePooling`` for the ranks whose layers are written in ``keras.ops``."""

    rank = 1
    _mode = "max"

    def __init__(self, pool_size: Any, strides: Any = None, padding: str = "valid", data_format: "str | None" = None,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        owner = self._owner
        self.pool_size = spatial_tuple(pool_size, self.rank, "pool_size", owner)
        self.strides = self.pool_size if strides is None else spatial_tuple(strides, self.rank, "strides", owner)
        self.padding = padding_mode(padding, owner)
        self.data_format = _data_format(data_format, owner)

    @property
    def _owner(self) -> str:
        return f"{type(self).__name__} '{self.name}'"

    def build(self, input_shape: Any) -> None:
        self.compute_output_shape(input_shape)  # wrong rank or too small an input: the error now
        self.built = True

    def call(self, inputs: Any) -> Any:
        _check_rank(self._owner, tuple(inputs.shape), self.rank, self.data_format)
        fn = _ops.max_pool if self._mode == "max" else _ops.average_pool
        return fn(inputs, self.pool_size, self.strides, self.padding, self.data_format)

    def compute_output_shape(self, input_shape: Any) -> tuple:
        shape = _check_rank(self._owner, tuple(input_shape), self.rank, self.data_format)
        out = []
        for n, k, s in zip(_spatial_of(shape, self.data_format), self.pool_size, self.strides):
            if n is None:
                out.append(None)
                continue
            size = -(-int(n) // s) if self.padding == "same" else (int(n) - k) // s + 1
            if size < 1:
                raise ValueError(f"{self._owner}: the pooling window {self.pool_size} does not fit the input of shape "
                                 f"{shape} with padding='valid' (strides {self.strides})")
            out.append(size)
        return _with_spatial(shape, out, self.data_format)

    def get_config(self) -> dict:
        return {**super().get_config(), "pool_size": list(self.pool_size), "padding": self.padding,
                "strides": list(self.strides), "data_format": self.data_format}


@register
class MaxPooling1D(_PoolingND):
    """``MaxPooling1D(pool_size=2, strides=None, padding="valid", data_format=None)``: the maximum of each
    window over the steps of ``(batch, steps, features)`` (or ``(batch, features, steps)``)."""

    rank, _mode = 1, "max"

    def __init__(self, pool_size: Any = 2, strides: Any = None, padding: str = "valid",
                 data_format: "str | None" = None, **kwargs: Any) -> None:
        super().__init__(pool_size, strides, padding, data_format, **kwargs)


@register
class AveragePooling1D(_PoolingND):
    """``AveragePooling1D(pool_size, strides=None, padding="valid", data_format=None)``: the mean of each
    window (with ``"same"``, of its real inputs, as Keras)."""

    rank, _mode = 1, "avg"


@register
class MaxPooling3D(_PoolingND):
    """``MaxPooling3D(pool_size=(2, 2, 2), strides=None, padding="valid", data_format=None)`` over
    ``(batch, d1, d2, d3, channels)`` (or channels first)."""

    rank, _mode = 3, "max"

    def __init__(self, pool_size: Any = (2, 2, 2), strides: Any = None, padding: str = "valid",
                 data_format: "str | None" = None, **kwargs: Any) -> None:
        super().__init__(pool_size, strides, padding, data_format, **kwargs)


@register
class AveragePooling3D(_PoolingND):
    """``AveragePooling3D(pool_size, strides=None, padding="valid", data_format=None)``."""

    rank, _mode = 3, "avg"


MaxPool1D = MaxPooling1D
AvgPool1D = AveragePooling1D
MaxPool3D = MaxPooling3D
AvgPool3D = AveragePooling3D


class _GlobalPooling3D(Layer):
    _mode = "max"

    def __init__(self, data_format: "str | None" = None, keepdims: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        owner = f"{type(self).__name__} '{self.name}'"
        self.data_format = _data_format(data_format, owner)
        self.keepdims = _validate.boolean(keepdims, "keepdims", owner)

    def _axes(self) -> tuple:
        return (1, 2, 3) if self.data_format == "channels_last" else (2, 3, 4)

    def call(self, inputs: Any) -> Any:
        _check_rank(f"{type(self).__name__} '{self.name}'", tuple(inputs.shape), 3, self.data_format)
        fn = _ops.max if self._mode == "max" else _ops.mean
        return fn(inputs, axis=self._axes(), keepdims=self.keepdims)

    def compute_output_shape(self, input_shape: Any) -> tuple:
        shape = _check_rank(f"{type(self).__name__} '{self.name}'", tuple(input_shape), 3, self.data_format)
        c = shape[-1] if self.data_format == "channels_last" else shape[1]
        if not self.keepdims:
            return (shape[0], c)
        return _with_spatial(shape, (1, 1, 1), self.data_format)

    def get_config(self) -> dict:
        return {**super().get_config(), "data_format": self.data_format, "keepdims": self.keepdims}


@register
class GlobalMaxPooling3D(_GlobalPooling3D):
    """Max over the three spatial axes: ``(N, d1, d2, d3, C) -> (N, C)`` (``(N, 1, 1, 1, C)`` with keepdims)."""

    _mode = "max"


@register
class GlobalAveragePooling3D(_GlobalPooling3D):
    """Mean over the three spatial axes: ``(N, d1, d2, d3, C) -> (N, C)`` (``(N, 1, 1, 1, C)`` with keepdims)."""

    _mode = "avg"


GlobalMaxPool3D = GlobalMaxPooling3D
GlobalAvgPool3D = GlobalAveragePooling3D


class _AdaptivePooling(Layer):
    """Keras 3's ``BaseAdaptivePooling``: pool to a fixed ``output_size`` (:func:`dnnbind.ops.adaptive_max_pool`,
    :func:`dnnbind.ops.adaptive_average_pool`: window ``i`` of an axis of length ``L`` covers
    ``[floor(i L / out), ceil((i + 1) L / out))``)."""

    rank = 1
    _mode = "max"

    def __init__(self, output_size: Any, data_format: "str | None" = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        owner = f"{type(self).__name__} '{self.name}'"
        self.output_size = spatial_tuple(output_size, self.rank, "output_size", owner)
        self.data_format = _data_format(data_format, owner)

    def call(self, inputs: Any) -> Any:
        _check_rank(f"{type(self).__name__} '{self.name}'", tuple(inputs.shape), self.rank, self.data_format)
        fn = _ops.adaptive_max_pool if self._mode == "max" else _ops.adaptive_average_pool
        return fn(inputs, self.output_size, data_format=self.data_format)

    def compute_output_shape(self, input_shape: Any) -> tuple:
        shape = _check_rank(f"{type(self).__name__} '{self.name}'", tuple(input_shape), self.rank, self.data_format)
        return _with_spatial(shape, self.output_size, self.data_format)

    def get_config(self) -> dict:
        return {**super().get_config(), "output_size": list(self.output_size), "data_format": self.data_format}


@register
class AdaptiveMaxPooling1D(_AdaptivePooling):
    """``AdaptiveMaxPooling1D(output_size, data_format=None)``: ``(N, steps, C) -> (N, output_size, C)``."""

    rank, _mode = 1, "max"


@register
class AdaptiveMaxPooling2D(_AdaptivePooling):
    """``AdaptiveMaxPooling2D(output_size, data_format=None)``: ``(N, H, W, C) -> (N, oh, ow, C)``."""

    rank, _mode = 2, "max"


@register
class AdaptiveMaxPooling3D(_AdaptivePooling):
    """``AdaptiveMaxPooling3D(output_size, data_format=None)``."""

    rank, _mode = 3, "max"


@register
class AdaptiveAveragePooling1D(_AdaptivePooling):
    """``AdaptiveAveragePooling1D(output_size, data_format=None)``."""

    rank, _mode = 1, "avg"


@register
class AdaptiveAveragePooling2D(_AdaptivePooling):
    """``AdaptiveAveragePooling2D(output_size, data_format=None)``."""

    rank, _mode = 2, "avg"


@register
class AdaptiveAveragePooling3D(_AdaptivePooling):
    """``AdaptiveAveragePooling3D(output_size, data_format=None)``."""

    rank, _mode = 3, "avg"


__all__ += ["MaxPooling1D", "MaxPool1D", "AveragePooling1D", "AvgPool1D", "MaxPooling3D", "MaxPool3D",
            "AveragePooling3D", "AvgPool3D", "GlobalMaxPooling3D", "GlobalMaxPool3D", "GlobalAveragePooling3D",
            "GlobalAvgPool3D", "AdaptiveMaxPooling1D", "AdaptiveMaxPooling2D", "AdaptiveMaxPooling3D",
            "AdaptiveAveragePooling1D", "AdaptiveAveragePooling2D", "AdaptiveAveragePooling3D"]
