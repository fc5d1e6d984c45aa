"""Regularization layers beyond Dropout (Keras 3 arguments): SpatialDropout2D."""

from __future__ import annotations

from typing import Any

from dnnbind import kernels

from .base import register, split_batch
from .conv import check_image_shape, data_format_to_layout
from .core import Dropout

__all__ = ["SpatialDropout2D"]


@register
class SpatialDropout2D(Dropout):
    """Drop whole feature maps: in training, each (sample, channel) is zeroed with probability ``rate``
    for every spatial position at once, the kept ones scaled by ``1/(1-rate)`` (Keras 3).

    Inputs are 4-d, ``(N, H, W, C)`` (channels_last) or ``(N, C, H, W)``. ``seed=None`` draws the mask
    stream's seed when the layer is created, from dnnbind's seed generator
    (:func:`dnnbind.utils.set_random_seed` makes it reproducible); ``seed`` (the config value) stays
    None. Moving the layer to another device restarts the stream from that seed. On CUDA the masks
    are drawn on the device (``kernels.spatial_dropout_forward``), so a captured training step draws a
    new mask at each replay.
    """

    def __init__(self, rate: float, data_format: str | None = None, seed: int | None = None,
                 **kwargs: Any) -> None:
        super().__init__(rate, seed=seed, **kwargs)
        self.data_format, self.layout = data_format_to_layout(data_format, f"SpatialDropout2D '{self.name}'")

    def build(self, input_shape):
        _, shape = split_batch(input_shape)
        check_image_shape(shape, f"SpatialDropout2D '{self.name}'", self.data_format)
        self._set_built(shape)

    def _drop(self, x):
        return kernels.spatial_dropout_forward(x, self._state, layout=self.layout)

    def _drop_backward(self, dy):
        return kernels.spatial_dropout_backward(dy, self._reserve, layout=self.layout)

    def get_config(self):
        return {**super().get_config(), "data_format": self.data_format}
