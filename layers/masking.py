"""``keras.layers.Masking``: marks the time steps whose features all equal ``mask_value`` as padding (the mask the
recurrent layers read) and zeroes them."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from dnnbind import _validate
from dnnbind import ops as _ops

from .base import Layer, register

__all__ = ["Masking"]


@register
class Masking(Layer):
    """``Masking(mask_value=0.0)``: for inputs ``(batch, time, features)`` (any rank >= 2: the last axis is the
    features), a step is masked when every feature equals ``mask_value``. The output is the input with masked
    steps set to 0, carrying the mask ``(batch, time)`` (True: a real step) for the layers after it."""

    def __init__(self, mask_value: float = 0.0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if isinstance(mask_value, (bool, np.bool_)) or not isinstance(mask_value, (int, float, np.integer,
                                                                                   np.floating)):
            raise _validate.ArgumentTypeError(f"Masking '{self.name}': mask_value must be a number, got "
                                              f"{mask_value!r}")
        self.mask_value = mask_value
        self.supports_masking = True
        self.built = True

    def compute_mask(self, inputs: Any, mask: Any = None) -> Any:
        return _ops.any(_ops.not_equal(inputs, self.mask_value), axis=-1)

    def call(self, inputs: Any) -> Any:
        if getattr(inputs, "ndim", 0) < 2:
            raise ValueError(f"Masking '{self.name}': expects inputs of rank >= 2 (batch, ..., features), got shape "
                             f"{getattr(inputs, 'shape', None)}")
        keep = _ops.any(_ops.not_equal(inputs, self.mask_value), axis=-1, keepdims=True)
        outputs = _ops.where(keep, inputs, _ops.zeros_like(inputs))
        outputs._keras_mask = _ops.squeeze(keep, axis=-1)
        return outputs

    def compute_output_shape(self, input_shape: Sequence[Any]) -> tuple:
        return tuple(input_shape)

    def get_config(self) -> dict:
        return {**super().get_config(), "mask_value": self.mask_value}
