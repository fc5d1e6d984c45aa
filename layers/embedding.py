"""``keras.layers.Embedding``: integer ids to dense vectors, a row lookup in ``keras.ops`` (trains on both
backends with no hand-written backward: the gradient of :func:`dnnbind.ops.take` adds into the rows taken)."""

from __future__ import annotations

import warnings
from typing import Any, Sequence

import numpy as np

from dnnbind import _validate
from dnnbind import initializers as _init
from dnnbind import ops as _ops
from dnnbind.autodiff.tensor import Tensor

from .base import Layer, register

__all__ = ["Embedding"]


@register
class Embedding(Layer):
    """``Embedding(input_dim, output_dim, embeddings_initializer="uniform", embeddings_regularizer=None,
    embeddings_constraint=None, mask_zero=False, weights=None, lora_rank=None, lora_alpha=None)``.

    Inputs: integer ids of any rank, each in ``[0, input_dim)``; output: ``inputs.shape + (output_dim,)`` in
    the compute dtype. ``embeddings`` has shape ``(input_dim, output_dim)``. Float inputs that hold whole
    numbers are cast to int32, as Keras 3 does (a default-dtype ``keras.Input`` feeding an Embedding); float
    inputs with a fractional part, and bool inputs, are refused. Ids out of range raise on the NumPy backend;
    on the device they are clamped into range (as ``keras.ops.take`` there: checking them would synchronise
    every step). ``mask_zero=True``: id 0 is padding, :meth:`compute_mask` is ``inputs != 0`` and the output
    carries that mask (so ``input_dim`` should count the padding id). ``lora_rank`` (LoRA fine-tuning) is not
    supported.
    """

    def __init__(self, input_dim: int, output_dim: int, embeddings_initializer: Any = "uniform",
                 embeddings_regularizer: Any = None, embeddings_constraint: Any = None, mask_zero: bool = False,
                 weights: Any = None, lora_rank: "int | None" = None, lora_alpha: "float | None" = None,
                 **kwargs: Any) -> None:
        if kwargs.pop("input_length", None) is not None:
            warnings.warn("Embedding: argument `input_length` is deprecated (Keras 3). Just remove it.",
                          stacklevel=2)
        super().__init__(embeddings_regularizer=embeddings_regularizer,
                         embeddings_constraint=embeddings_constraint, **kwargs)
        owner = f"Embedding '{self.name}'"
        self.input_dim = _validate.positive_int(input_dim, "input_dim", owner)
        self.output_dim = _validate.positive_int(output_dim, "output_dim", owner)
        self.embeddings_initializer = _init.get(embeddings_initializer)
        self.mask_zero = _validate.boolean(mask_zero, "mask_zero", owner)
        self.supports_masking = self.mask_zero
        # Keras 3: ids are not floats to autocast; the output is cast to the compute dtype instead
        self.autocast = False
        if lora_rank is not None or lora_alpha is not None:
            raise NotImplementedError(f"{owner}: lora_rank/lora_alpha (LoRA fine-tuning) is not supported")
        self.embeddings = None
        if weights is not None:
            self.build()
            if not (isinstance(weights, (list, tuple)) and len(weights) == 1):
                weights = [weights]
            self.set_weights(weights)

    def build(self, input_shape: "Sequence[Any] | None" = None) -> None:
        self.embeddings = self.add_weight(shape=(self.input_dim, self.output_dim),
                                          initializer=self.embeddings_initializer, name="embeddings",
                                          trainable=True)
        self.built = True

    def _ids(self, inputs: Any) -> Tensor:
        """``inputs`` as int32/int64 ids, checked (see the class docstring)."""
        owner = f"Embedding '{self.name}'"
        ids = inputs if isinstance(inputs, Tensor) else _ops.convert_to_tensor(inputs)
        kind = ids.dtype.kind
        host = ids.data if isinstance(ids.data, np.ndarray) else None
        if kind == "b" or kind not in "iuf" and str(ids.dtype) != "bfloat16":
            raise _validate.ArgumentTypeError(f"{owner}: inputs must be integer ids, got dtype {ids.dtype}")
        if kind not in "iu":
            if host is not None and host.size and not np.all(np.isfinite(host) & (np.floor(host) == host)):
                bad = np.flatnonzero(~(np.isfinite(host) & (np.floor(host) == host)))[0]
                raise ValueError(f"{owner}: inputs must be integer ids, got dtype {ids.dtype} holding "
                                 f"{float(host.reshape(-1)[bad])!r} at flat position {int(bad)}")
        if str(ids.dtype) not in ("int32", "int64"):
            ids = _ops.cast(ids, "int32")
            host = ids.data if isinstance(ids.data, np.ndarray) else None
        if host is not None and host.size:
            bad = np.flatnonzero((host < 0) | (host >= self.input_dim))
            if bad.size:
                raise ValueError(f"{owner}: ids must be in [0, input_dim={self.input_dim}), got "
                                 f"{int(host.reshape(-1)[bad[0]])} at flat position {int(bad[0])} "
                                 f"({bad.size} out of range)")
        return ids

    def call(self, inputs: Any) -> Any:
        ids = self._ids(inputs)
        outputs = _ops.cast(_ops.take(self.embeddings, ids, axis=0), self.compute_dtype)
        if self.mask_zero:
            outputs._keras_mask = _ops.not_equal(ids, 0)
        return outputs

    def compute_mask(self, inputs: Any, mask: Any = None) -> Any:
        if not self.mask_zero:
            return None
        return _ops.not_equal(inputs, 0)

    def compute_output_shape(self, input_shape: Sequence[Any]) -> tuple:
        return (*tuple(input_shape), self.output_dim)

    def get_config(self) -> dict:
        config = super().get_config()  # (it writes embeddings_regularizer/_constraint when set)
        config.setdefault("embeddings_regularizer", None)
        config.setdefault("embeddings_constraint", None)
        config.update(input_dim=self.input_dim, output_dim=self.output_dim,
                      embeddings_initializer=_init.serialize(self.embeddings_initializer), mask_zero=self.mask_zero)
        return config
