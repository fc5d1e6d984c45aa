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


@register
class ReversibleEmbedding(Embedding):
    """``ReversibleEmbedding(input_dim, output_dim, tie_weights=True, embeddings_initializer="uniform",
    embeddings_regularizer=None, embeddings_constraint=None, mask_zero=False, reverse_dtype=None,
    logit_soft_cap=None)``: an :class:`Embedding` that also maps vectors back to logits over the ids,
    ``call(inputs, reverse=True)``: ``inputs @ embeddings.T`` (``tie_weights``) or ``inputs @ reverse_embeddings``
    (a second weight ``(output_dim, input_dim)``), in ``reverse_dtype`` when given, soft-capped as
    ``tanh(logits / cap) * cap`` when ``logit_soft_cap`` is set (Keras 3)."""

    def __init__(self, input_dim: int, output_dim: int, tie_weights: bool = True,
                 embeddings_initializer: Any = "uniform", embeddings_regularizer: Any = None,
                 embeddings_constraint: Any = None, mask_zero: bool = False, reverse_dtype: Any = None,
                 logit_soft_cap: "float | None" = None, **kwargs: Any) -> None:
        super().__init__(input_dim, output_dim, embeddings_initializer=embeddings_initializer,
                         embeddings_regularizer=embeddings_regularizer, embeddings_constraint=embeddings_constraint,
                         mask_zero=mask_zero, **kwargs)
        owner = f"ReversibleEmbedding '{self.name}'"
        self.tie_weights = _validate.boolean(tie_weights, "tie_weights", owner)
        self.reverse_dtype = None if reverse_dtype is None else str(_validate.normalize_dtype(
            reverse_dtype, f"{owner}: reverse_dtype"))
        self.logit_soft_cap = None if logit_soft_cap is None else float(_validate.number(
            logit_soft_cap, "logit_soft_cap", owner, low=0.0, low_open=True))
        self.reverse_embeddings = None

    def build(self, input_shape: "Sequence[Any] | None" = None) -> None:
        super().build(input_shape)
        if not self.tie_weights:
            self.reverse_embeddings = self.add_weight(shape=(self.output_dim, self.input_dim),
                                                      initializer=self.embeddings_initializer,
                                                      name="reverse_embeddings", trainable=True)
        self.built = True

    def call(self, inputs: Any, reverse: bool = False) -> Any:
        if not reverse:
            return super().call(inputs)
        owner = f"ReversibleEmbedding '{self.name}'"
        if inputs.shape[-1] != self.output_dim:
            raise ValueError(f"{owner}: reverse=True takes vectors of size output_dim={self.output_dim} on the last "
                             f"axis, got shape {tuple(inputs.shape)}")
        kernel = _ops.transpose(self.embeddings) if self.tie_weights else self.reverse_embeddings
        x = inputs
        if self.reverse_dtype is not None:
            x = _ops.cast(x, self.reverse_dtype)
            kernel = _ops.cast(kernel, self.reverse_dtype)
        logits = _ops.matmul(x, kernel)
        if self.logit_soft_cap is not None:
            logits = _ops.multiply(_ops.tanh(_ops.divide(logits, self.logit_soft_cap)), self.logit_soft_cap)
        return logits

    def compute_mask(self, inputs: Any, mask: Any = None) -> Any:
        return None  # (the forward call sets the mask on its output itself, as Keras)

    def compute_output_shape(self, input_shape: Sequence[Any], reverse: bool = False) -> tuple:
        if reverse:
            return (*tuple(input_shape)[:-1], self.input_dim)
        return super().compute_output_shape(input_shape)

    def get_config(self) -> dict:
        return {**super().get_config(), "tie_weights": self.tie_weights, "reverse_dtype": self.reverse_dtype,
                "logit_soft_cap": self.logit_soft_cap}


__all__ += ["ReversibleEmbedding"]
