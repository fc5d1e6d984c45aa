"""``keras.layers.Wrapper``, ``SpectralNormalization`` and ``serialize`` (Keras 3).

``Wrapper(layer)`` is the base of layers that hold one other layer; :class:`SpectralNormalization` is one,
written in ``keras.ops``. (``InputSpec`` lives in :mod:`.input_spec`, a leaf that base.py imports.)
"""

from __future__ import annotations

from typing import Any

from dnnbind import _validate
from dnnbind import initializers as _init
from dnnbind import ops as _ops

from .base import Layer, register
from .input_spec import InputSpec, assert_input_compatibility
from .rnn.cells import deserialize_layer, serialize_layer

__all__ = ["Wrapper", "SpectralNormalization", "InputSpec", "serialize", "assert_input_compatibility"]


def serialize(layer: Layer) -> dict:
    """``keras.layers.serialize``: ``{"module": "keras.layers", "class_name", "config", "registered_name"}``
    (the config is the layer's ``get_config()``); :func:`dnnbind.layers.deserialize` reads it back."""
    if not isinstance(layer, Layer):
        raise _validate.ArgumentTypeError(f"keras.layers.serialize takes a layer, got {type(layer).__name__}")
    return {"module": "keras.layers", "class_name": type(layer).__name__, "config": layer.get_config(),
            "registered_name": None}


@register
class Wrapper(Layer):
    """``Wrapper(layer)``: the base of the layers that wrap one other layer (Keras 3). ``build`` builds the
    wrapped layer; the config holds it as ``{"class_name", "config"}`` under ``"layer"``; by itself it calls
    the wrapped layer."""

    def __init__(self, layer: Any, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        owner = f"{type(self).__name__} '{self.name}'"
        layer = deserialize_layer(layer, "layer", owner)
        if not isinstance(layer, Layer):
            raise ValueError(f"{owner}: layer must be a keras.layers.Layer instance, got {layer!r}")
        self.layer = layer

    @classmethod
    def _builds_keras_shapes(cls) -> bool:
        return True

    def build(self, input_shape: Any = None) -> None:
        if not self.layer.built and input_shape is not None:
            if self.layer._is_legacy():
                self.layer._ensure_built((None, *tuple(input_shape)[1:]))
            else:
                self.layer.build(tuple(input_shape))
                self.layer.built = True
        self.built = True

    def call(self, inputs: Any, training: Any = None) -> Any:
        return self.layer(inputs, training=training) if training is not None else self.layer(inputs)

    def compute_output_shape(self, input_shape: Any) -> Any:
        return self.layer.compute_output_shape(input_shape)

    def get_config(self) -> dict:
        return {**super().get_config(), "layer": serialize_layer(self.layer)}


@register
class SpectralNormalization(Wrapper):
    """``SpectralNormalization(layer, power_iterations=1)``: the wrapped layer's ``kernel`` (or ``embeddings``)
    divided by its largest singular value, estimated by ``power_iterations`` steps of the power method from a
    kept vector ``vector_u`` ``(1, kernel.shape[-1])`` (non-trainable, TruncatedNormal(0.02) at first). As in
    Keras 3, in training each call updates ``vector_u`` and assigns the normalised kernel to the wrapped
    layer's kernel, which the wrapped layer then uses (the gradient is the wrapped layer's, taken at the
    normalised kernel; a kernel of zeros is left as it is); not training, the layer runs with its current
    kernel."""

    def __init__(self, layer: Any, power_iterations: int = 1, **kwargs: Any) -> None:
        super().__init__(layer, **kwargs)
        self.power_iterations = _validate.positive_int(power_iterations, "power_iterations",
                                                       f"SpectralNormalization '{self.name}'")
        self.vector_u = None

    def build(self, input_shape: Any) -> None:
        super().build(input_shape)
        owner = f"SpectralNormalization '{self.name}'"
        kernel = getattr(self.layer, "kernel", None)
        if kernel is None:
            kernel = getattr(self.layer, "embeddings", None)
        if kernel is None:
            raise ValueError(f"{owner}: {type(self.layer).__name__} object has no attribute 'kernel' nor "
                             "'embeddings'")
        self.kernel = kernel  # tracked here too, as Keras (its files list it among this layer's variables)
        self._kernel_shape = tuple(int(s) for s in kernel.shape)
        self.vector_u = self.add_weight(shape=(1, self._kernel_shape[-1]),
                                        initializer=_init.TruncatedNormal(stddev=0.02), trainable=False,
                                        name="vector_u", dtype=kernel.dtype)
        self.built = True

    def _kernel(self) -> Any:
        kernel = getattr(self.layer, "kernel", None)
        return kernel if kernel is not None else self.layer.embeddings

    def normalized_weights(self) -> tuple:
        """``(vector_u, kernel / sigma)`` after ``power_iterations`` steps (Keras's ``normalized_weights``)."""
        kernel = self._kernel()
        weights = _ops.reshape(kernel, (-1, self._kernel_shape[-1]))
        u = _ops.convert_to_tensor(self.vector_u)
        v = None
        for _ in range(self.power_iterations):
            v = _ops.normalize(_ops.matmul(u, _ops.transpose(weights)), axis=None)
            u = _ops.normalize(_ops.matmul(v, weights), axis=None)
        u, v = _ops.stop_gradient(u), _ops.stop_gradient(v)
        sigma = _ops.matmul(_ops.matmul(v, weights), _ops.transpose(u))
        return u, _ops.reshape(_ops.divide(kernel, sigma), self._kernel_shape)

    def call(self, inputs: Any, training: Any = False) -> Any:
        if training:
            kernel = self._kernel()
            u, normalized = self.normalized_weights()
            # (selected on the device, not branched on the host: no synchronisation in a training step)
            zero = _ops.all(_ops.equal(kernel, 0))
            self.vector_u.assign(_ops.where(zero, self.vector_u, _ops.cast(u, self.vector_u.dtype)))
            kernel.assign(_ops.where(zero, kernel, _ops.cast(normalized, kernel.dtype)))
        out = self.layer(inputs)
        return _ops.cast(out, inputs.dtype)

    def get_config(self) -> dict:
        return {**super().get_config(), "power_iterations": self.power_iterations}
