"""Regularization layers beyond Dropout (Keras 3 arguments): SpatialDropout2D."""

from __future__ import annotations

from typing import Any

from dnnbind import _validate, ops
from dnnbind.utils import draw_seed

from .base import Layer, register, split_batch
from .conv import check_image_shape, data_format_to_layout

__all__ = ["SpatialDropout2D"]


@register
class SpatialDropout2D(Layer):
    """Drop whole feature maps: in training, each (sample, channel) is zeroed with probability ``rate``
    for every spatial position at once, the kept ones scaled by ``1/(1-rate)`` (Keras 3).

    Inputs are 4-d, ``(N, H, W, C)`` (channels_last) or ``(N, C, H, W)``. ``seed=None`` draws the mask
    stream's seed when the layer is created, from dnnbind's seed generator
    (:func:`dnnbind.utils.set_random_seed` makes it reproducible); ``seed`` (the config value) stays
    None. Moving the layer to another device restarts the stream from that seed. On CUDA the masks
    are drawn on the device (``ops.spatial_dropout_forward``), so a captured training step draws a
    new mask at each replay.
    """

    def __init__(self, rate: float, data_format: str | None = None, seed: int | None = None,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        owner = f"SpatialDropout2D '{self.name}'"
        self.rate = _validate.number(rate, "rate", owner, low=0.0, high=1.0, high_open=True)
        self.data_format, self.layout = data_format_to_layout(data_format, owner)
        self.seed = None if seed is None else _validate.non_negative_int(seed, "seed", owner)
        self._seed = draw_seed() if seed is None else self.seed
        self._state = None
        self._reserve = None

    def _on_device_change(self) -> None:
        self._state = None

    def build(self, input_shape):
        _, shape = split_batch(input_shape)
        check_image_shape(shape, f"SpatialDropout2D '{self.name}'", self.data_format)
        self._set_built(shape)

    def forward(self, x, training=False):
        if not training or self.rate == 0.0:
            self._reserve = None
            return x
        if self._state is None:
            self._state = ops.DropoutState(self.rate, seed=self._seed)
        y, self._reserve = ops.spatial_dropout_forward(x, self._state, layout=self.layout)
        return y

    def backward(self, dy, need_dx=True):
        if self._reserve is None:
            return dy
        dx = ops.spatial_dropout_backward(dy, self._reserve, layout=self.layout)
        self._reserve = None
        return dx

    def get_config(self):
        return {**super().get_config(), "rate": self.rate, "data_format": self.data_format, "seed": self.seed}
