"""The attention family (Keras 3): ``MultiHeadAttention``, ``GroupedQueryAttention`` (``GroupQueryAttention``),
``Attention`` and ``AdditiveAttention``, written on :mod:`dnnbind.ops` (they train on both backends with no
hand-written backward).

MultiHeadAttention and GroupedQueryAttention follow Keras's ``_compute_attention``: with no dropout, no scores
asked for and 4-d projections, the core is :func:`dnnbind.ops.dot_product_attention` (cuDNN's fused SDPA where
:func:`dnnbind.ops.fused_attention` takes it); otherwise the explicit einsum, masked softmax and einsum, which
also returns the scores. As in Keras the two paths differ only for a query row whose every key is masked: the
fused path attends uniformly, the explicit path outputs zeros. Their projections are ``EinsumDense`` layers
named ``query``/``key``/``value``/``attention_output`` under Keras's attribute names, so Keras's weight files
load both ways.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from dnnbind import _validate
from dnnbind import constraints as _constraints
from dnnbind import initializers as _init
from dnnbind import kernels as _kernels
from dnnbind import ops as _ops
from dnnbind import random as _random
from dnnbind import regularizers as _regularizers
from dnnbind.autodiff.tensor import Tensor

from .base import _REGISTRY, Layer, _bump_structure, register
from .einsum_dense import EinsumDense
from .graph import output_spec as _output_spec

__all__ = ["MultiHeadAttention", "GroupedQueryAttention", "GroupQueryAttention", "Attention", "AdditiveAttention"]

_LETTERS = "abcdefghijklmnopqrstuvwxyz"


# ----- Keras's einsum equations for multi-head attention (multi_head_attention.py) --------------------------
def _build_attention_equation(rank: int, attn_axes: tuple) -> tuple[str, str, int]:
    """(query-key product equation, combine equation, rank of the scores) for projections of ``rank``
    ``(batch, <non-attention axes>, <attention axes>, heads, channels)``."""
    target = _LETTERS[:rank]
    batch_dims = tuple(np.delete(range(rank), attn_axes + (rank - 1,)))
    offset = rank
    source = ""
    for i in range(rank):
        if i in batch_dims or i == rank - 1:
            source += target[i]
        else:
            source += _LETTERS[offset]
            offset += 1
    product = "".join([target[i] for i in batch_dims] + [target[i] for i in attn_axes]
                      + [source[i] for i in attn_axes])
    return f"{source},{target}->{product}", f"{product},{source}->{target}", len(product)


def _build_proj_equation(free_dims: int, bound_dims: int, output_dims: int) -> tuple[str, str, int]:
    """(equation, bias axes, output rank) of a projection: ``free_dims`` kept axes, ``bound_dims`` contracted,
    ``output_dims`` new ones."""
    inp = _LETTERS[:free_dims]
    bound = _LETTERS[free_dims:free_dims + bound_dims]
    new = _LETTERS[free_dims + bound_dims:free_dims + bound_dims + output_dims]
    return f"{inp}{bound},{bound}{new}->{inp}{new}", new, free_dims + output_dims


def _output_shape(output_rank: int, known_last_dims: Sequence[Any]) -> list:
    return [None] * (output_rank - len(known_last_dims)) + list(known_last_dims)


def _mask_of(t: Any) -> Any:
    return getattr(t, "_keras_mask", None) if isinstance(t, Tensor) else None


def _causal_mask(t_len: int, s_len: int, like: Any = None) -> Tensor:
    """``(1, T, S)`` bool: target ``t`` sees sources ``s <= t`` (Keras's cumsum construction, as an iota), on
    the device of ``like`` (the query; else the default device): a kernel there, no host upload."""
    device = like.device if isinstance(like, Tensor) else None
    rows = _ops.reshape(Tensor(_kernels.numeric.iota(t_len, 0, 1, np.int32, device=device)), (1, t_len, 1))
    cols = _ops.reshape(Tensor(_kernels.numeric.iota(s_len, 0, 1, np.int32, device=device)), (1, 1, s_len))
    return _ops.greater_equal(rows, cols)


def _combine_masks(owner: str, query: Any, value: Any, query_mask: Any, value_mask: Any, key_mask: Any,
                   attention_mask: Any, use_causal_mask: bool) -> Any:
    """Keras's ``_compute_attention_mask``: ``[B, T, 1]`` query, ``[B, 1, S]`` value and key masks, the
    ``[1, T, S]`` causal mask and ``attention_mask``, and-ed (None when there is none)."""
    auto = None
    for name, m, axis in (("query_mask", query_mask, -1), ("value_mask", value_mask, -2),
                          ("key_mask", key_mask, -2)):
        if m is None:
            continue
        m = _ops.convert_to_tensor(m)
        expect = tuple(query.shape[:2]) if name == "query_mask" else tuple(value.shape[:2])
        if tuple(m.shape) != expect:
            raise ValueError(f"{owner}: {name} must have shape {expect} (batch, {'target' if axis == -1 else 'source'}"
                             f" length), got {tuple(m.shape)}")
        m = _ops.expand_dims(_ops.cast(m, "bool"), axis)
        auto = m if auto is None else _ops.logical_and(auto, m)
    if use_causal_mask:
        m = _causal_mask(int(query.shape[1]), int(value.shape[1]), query)
        auto = m if auto is None else _ops.logical_and(auto, m)
    if attention_mask is not None:
        attention_mask = _ops.cast(_ops.convert_to_tensor(attention_mask), "bool")
    if auto is not None:
        attention_mask = auto if attention_mask is None else _ops.logical_and(attention_mask, auto)
    return attention_mask


def _masked_softmax(owner: str, scores: Tensor, mask: Any, axes: tuple, expansion_axis: int) -> Tensor:
    """Keras's ``Softmax(axis=axes)(scores, mask)`` after the mask is expanded at ``expansion_axis`` up to the
    scores' rank: masked scores are ``-1e9`` (``-3e4`` in float16) before the softmax, 0 after it."""
    if mask is not None:
        for _ in range(scores.ndim - mask.ndim):
            mask = _ops.expand_dims(mask, expansion_axis)
        if mask.ndim > scores.ndim or any(m != 1 and m != s for m, s in zip(mask.shape[::-1], scores.shape[::-1])):
            raise ValueError(f"{owner}: the attention mask (expanded to shape {tuple(mask.shape)}) does not broadcast "
                             f"to the attention scores of shape {tuple(scores.shape)} (batch, heads, target, source)")
        big = -3e4 if str(scores.dtype) == "float16" else -1e9
        scores = _ops.where(mask, scores, big)
    if len(axes) > 1:
        probs = _ops.exp(_ops.subtract(scores, _ops.logsumexp(scores, axis=axes, keepdims=True)))
    else:
        probs = _ops.softmax(scores, axis=axes[0])
    if mask is not None:
        probs = _ops.where(mask, probs, 0.0)
    return probs


def _positive_int(value: Any, name: str, owner: str) -> int:
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"{owner}: Received an invalid value for argument `{name}`, expected a positive integer. "
                         f"Received: {name}={value!r}")
    return int(value)


def _dropout_rate(value: Any, owner: str) -> float:
    rate = _validate.number(value, "dropout", owner, low=0.0, high=1.0)
    if rate >= 1.0:
        raise ValueError(f"{owner}: dropout must be in [0, 1), got {value!r}")
    return float(rate)


def _check_flash(flash_attention: Any, dropout: float, owner: str) -> "bool | None":
    if flash_attention is not None and not isinstance(flash_attention, (bool, np.bool_)):
        raise _validate.ArgumentTypeError(f"{owner}: flash_attention must be None, True or False, got "
                                          f"{flash_attention!r}")
    if flash_attention and dropout > 0.0:
        raise ValueError(f"{owner}: Dropout is not supported when flash attention is enabled. Please set dropout to "
                         "0.0 to use flash attention.")
    return None if flash_attention is None else bool(flash_attention)


def _track(layer: Layer, name: str, sub: Layer) -> None:
    """Assign ``sub`` to the private attribute ``name`` and track it there (Keras's weights files key
    GroupedQueryAttention's projections by their private attribute names, ``_query_dense``...)."""
    object.__setattr__(layer, name, sub)
    layer.__dict__["_tracked"][name] = sub
    _bump_structure()


class _ProjectedAttention(Layer):
    """What MultiHeadAttention and GroupedQueryAttention share: the sublayers' arguments, the masks, the
    dropout on the scores, the config of the initializers, regularizers and constraints."""

    def _init_common(self, dropout: Any, use_bias: Any, flash_attention: Any, kernel_initializer: Any,
                     bias_initializer: Any, kernel_regularizer: Any, bias_regularizer: Any,
                     activity_regularizer: Any, kernel_constraint: Any, bias_constraint: Any, use_gate: Any,
                     seed: Any, owner: str) -> None:
        self._dropout = _dropout_rate(dropout, owner)
        self._use_bias = _validate.boolean(use_bias, "use_bias", owner)
        if _validate.boolean(use_gate, "use_gate", owner):
            raise NotImplementedError(f"{owner}: use_gate=True (a sigmoid-gated output) is not supported")
        self._use_gate = False
        self._flash_attention = _check_flash(flash_attention, self._dropout, owner)
        self._kernel_initializer = _init.get(kernel_initializer)
        self._bias_initializer = _init.get(bias_initializer)
        self._kernel_regularizer = _regularizers.get(kernel_regularizer)
        self._bias_regularizer = _regularizers.get(bias_regularizer)
        self._activity_regularizer = _regularizers.get(activity_regularizer)
        self._kernel_constraint = _constraints.get(kernel_constraint)
        self._bias_constraint = _constraints.get(bias_constraint)
        self.seed = None if seed is None else _validate.non_negative_int(seed, "seed", owner)
        self._seed_generator = _random.SeedGenerator(self.seed) if self._dropout > 0 else None
        self.supports_masking = True

    def _sublayer_kwargs(self) -> dict:
        """Keras's ``_get_common_kwargs_for_sublayer``: each projection gets its own copy of the
        initializers (a shared stateless one would give every projection the same values)."""
        return dict(kernel_regularizer=self._kernel_regularizer, bias_regularizer=self._bias_regularizer,
                    activity_regularizer=self._activity_regularizer, kernel_constraint=self._kernel_constraint,
                    bias_constraint=self._bias_constraint, dtype=self.dtype_policy,
                    kernel_initializer=type(self._kernel_initializer).from_config(
                        self._kernel_initializer.get_config()),
                    bias_initializer=type(self._bias_initializer).from_config(self._bias_initializer.get_config()))

    def _dropout_scores(self, scores: Tensor, training: Any) -> Tensor:
        if self._dropout > 0.0 and training:
            return _random.dropout(scores, self._dropout, seed=self._seed_generator)
        return scores

    def _common_config(self) -> dict:
        return {
            "dropout": self._dropout, "use_bias": self._use_bias, "use_gate": self._use_gate,
            "kernel_initializer": _init.serialize(self._kernel_initializer),
            "bias_initializer": _init.serialize(self._bias_initializer),
            "kernel_regularizer": None if self._kernel_regularizer is None
            else _regularizers.serialize(self._kernel_regularizer),
            "bias_regularizer": None if self._bias_regularizer is None
            else _regularizers.serialize(self._bias_regularizer),
            "activity_regularizer": None if self._activity_regularizer is None
            else _regularizers.serialize(self._activity_regularizer),
            "kernel_constraint": None if self._kernel_constraint is None
            else _constraints.serialize(self._kernel_constraint),
            "bias_constraint": None if self._bias_constraint is None
            else _constraints.serialize(self._bias_constraint),
            "seed": self.seed,
        }

    def _masks(self, query: Any, value: Any, key: Any, query_mask: Any, value_mask: Any, key_mask: Any) -> tuple:
        """The masks of the call: each argument, else the Keras mask its tensor carries."""
        query_mask = _mask_of(query) if _mask_of(query) is not None else query_mask
        value_mask = value_mask if value_mask is not None else _mask_of(value)
        key_mask = key_mask if key_mask is not None or key is None else _mask_of(key)
        return query_mask, value_mask, key_mask

    def _check_inputs(self, owner: str, query: Any, value: Any, key: Any) -> None:
        for name, t in (("query", query), ("value", value), ("key", key)):
            if t is not None and (not hasattr(t, "shape") or len(t.shape) < 3):
                raise ValueError(f"{owner}: `{name}` must be a tensor of rank >= 3 (batch, <sequence axes>, "
                                 f"features), got {getattr(t, 'shape', type(t).__name__)}")


@register
class MultiHeadAttention(_ProjectedAttention):
    """``MultiHeadAttention(num_heads, key_dim, value_dim=None, dropout=0.0, use_bias=True, output_shape=None,
    attention_axes=None, flash_attention=None, kernel_initializer="glorot_uniform", bias_initializer="zeros",
    kernel_regularizer=None, bias_regularizer=None, activity_regularizer=None, kernel_constraint=None,
    bias_constraint=None, seed=None)`` (Keras 3).

    ``call(query, value, key=None, query_mask=None, value_mask=None, key_mask=None, attention_mask=None,
    return_attention_scores=False, training=None, use_causal_mask=False)``: ``query`` ``(B, T, dim)``,
    ``value``/``key`` ``(B, S, dim)`` (or more axes, with ``attention_axes``); the output has the query's shape
    with ``output_shape`` (default: the query's last axis) last; the scores are ``(B, num_heads, T, S)``.

    Weights (Keras's layout and order): ``query`` kernel ``(dim, num_heads, key_dim)`` and bias
    ``(num_heads, key_dim)``, ``key`` likewise, ``value`` ``(dim, num_heads, value_dim)``,
    ``attention_output`` ``(num_heads, value_dim, *output_shape)`` and bias ``output_shape``. ``dropout``
    applies to the scores in training. Masks: ``query_mask`` ``(B, T)``, ``value_mask``/``key_mask``
    ``(B, S)`` (True: attend; each also read from the Keras mask its tensor carries), ``attention_mask``
    ``(B, T, S)``; all are and-ed with the causal mask. The query's mask is the output's mask. An explicit
    ``query_mask`` is honoured when the query carries no mask (Keras 3 ignores it then). ``sliding_window``
    and ``use_gate=True`` are not supported.
    """

    def __init__(self, num_heads: int, key_dim: int, value_dim: "int | None" = None, dropout: float = 0.0,
                 use_bias: bool = True, output_shape: Any = None, attention_axes: Any = None,
                 sliding_window: Any = None, flash_attention: Any = None, kernel_initializer: Any = "glorot_uniform",
                 bias_initializer: Any = "zeros", kernel_regularizer: Any = None, bias_regularizer: Any = None,
                 activity_regularizer: Any = None, kernel_constraint: Any = None, bias_constraint: Any = None,
                 use_gate: bool = False, seed: "int | None" = None, **kwargs: Any) -> None:
        name = kwargs.get("name")
        owner = f"MultiHeadAttention '{name}'" if isinstance(name, str) else "MultiHeadAttention"
        num_heads = _positive_int(num_heads, "num_heads", owner)
        key_dim = _positive_int(key_dim, "key_dim", owner)
        if value_dim is not None:
            value_dim = _positive_int(value_dim, "value_dim", owner)
        super().__init__(**kwargs)
        owner = f"MultiHeadAttention '{self.name}'"
        self._num_heads, self._key_dim = num_heads, key_dim
        self._value_dim = value_dim if value_dim else key_dim
        self._init_common(dropout, use_bias, flash_attention, kernel_initializer, bias_initializer,
                          kernel_regularizer, bias_regularizer, activity_regularizer, kernel_constraint,
                          bias_constraint, use_gate, seed, owner)
        if output_shape:
            if isinstance(output_shape, (int, np.integer)) and not isinstance(output_shape, bool):
                output_shape = (int(output_shape),)
            if not isinstance(output_shape, (list, tuple)) or not all(
                    isinstance(s, (int, np.integer)) and not isinstance(s, bool) and s > 0 for s in output_shape):
                raise ValueError(f"{owner}: Invalid `output_shape`: {output_shape!r}. When specified, the "
                                 "`output_shape` should be a positive int or a tuple/list of them.")
            output_shape = tuple(int(s) for s in output_shape)
        self._output_shape = output_shape or None
        if isinstance(attention_axes, (int, np.integer)) and not isinstance(attention_axes, bool):
            attention_axes = (int(attention_axes),)
        elif attention_axes is not None:
            if not isinstance(attention_axes, (list, tuple)) or not all(
                    isinstance(a, (int, np.integer)) and not isinstance(a, bool) for a in attention_axes):
                raise ValueError(f"{owner}: `attention_axes` must be an int, list, or tuple. Received: "
                                 f"attention_axes={attention_axes!r}")
            attention_axes = tuple(int(a) for a in attention_axes) or None
        self._attention_axes = attention_axes
        if sliding_window is not None:
            raise NotImplementedError(f"{owner}: sliding_window is not supported")
        self._sliding_window = None
        self._inverse_sqrt_key_dim = 1.0 / math.sqrt(float(self._key_dim))

    num_heads = property(lambda self: self._num_heads)
    key_dim = property(lambda self: self._key_dim)
    value_dim = property(lambda self: self._value_dim)
    dropout = property(lambda self: self._dropout)
    use_bias = property(lambda self: self._use_bias)
    attention_axes = property(lambda self: self._attention_axes)

    def build(self, query_shape: Sequence[Any], value_shape: Sequence[Any],
              key_shape: "Sequence[Any] | None" = None) -> None:
        owner = f"MultiHeadAttention '{self.name}'"
        query_shape, value_shape = tuple(query_shape), tuple(value_shape)
        key_shape = value_shape if key_shape is None else tuple(key_shape)
        for name, shape in (("query", query_shape), ("value", value_shape), ("key", key_shape)):
            if len(shape) < 3:
                raise ValueError(f"{owner}: `{name}` must have rank >= 3 (batch, <sequence axes>, features), got "
                                 f"shape {shape}")
        if value_shape[1:-1] != key_shape[1:-1]:
            raise ValueError(f"{owner}: All dimensions of `value` and `key`, except the last one, must be equal. "
                             f"Received: value_shape={value_shape} and key_shape={key_shape}")
        if len(query_shape) != len(value_shape):
            raise ValueError(f"{owner}: `query` and `value` must have the same rank, got shapes {query_shape} and "
                             f"{value_shape}")
        rank = len(query_shape) + 1  # of the projections: a heads axis more
        axes = tuple(range(1, rank - 2)) if self._attention_axes is None else tuple(
            a if a >= 0 else (rank - 1) + a for a in self._attention_axes)
        if not axes or any(not 1 <= a < rank - 2 for a in axes) or len(set(axes)) != len(axes):
            raise ValueError(f"{owner}: attention_axes={self._attention_axes} must name distinct sequence axes of "
                             f"the inputs of shape {query_shape} (1 to {rank - 3}, or negative from the feature axis)")
        common = self._sublayer_kwargs
        eq, bias, out_rank = _build_proj_equation(len(query_shape) - 1, 1, 2)
        query_dense = EinsumDense(eq, _output_shape(out_rank - 1, [self._num_heads, self._key_dim]),
                                  bias_axes=bias if self._use_bias else None, name="query", **common())
        query_dense.build(query_shape)
        eq, bias, out_rank = _build_proj_equation(len(key_shape) - 1, 1, 2)
        key_dense = EinsumDense(eq, _output_shape(out_rank - 1, [self._num_heads, self._key_dim]),
                                bias_axes=bias if self._use_bias else None, name="key", **common())
        key_dense.build(key_shape)
        eq, bias, out_rank = _build_proj_equation(len(value_shape) - 1, 1, 2)
        value_dense = EinsumDense(eq, _output_shape(out_rank - 1, [self._num_heads, self._value_dim]),
                                  bias_axes=bias if self._use_bias else None, name="value", **common())
        value_dense.build(value_shape)
        self._attention_axes = axes
        self._dot_product_equation, self._combine_equation, scores_rank = _build_attention_equation(out_rank, axes)
        self._norm_axes = tuple(range(scores_rank - len(axes), scores_rank))
        out_shape = self._output_shape or (query_shape[-1],)
        eq, bias, out_rank = _build_proj_equation(len(query_shape) - 1, 2, len(out_shape))
        output_dense = EinsumDense(eq, _output_shape(out_rank - 1, out_shape),
                                   bias_axes=bias if self._use_bias else None, name="attention_output", **common())
        output_dense.build((*query_shape[:-1], self._num_heads, self._value_dim))
        # Keras's weights files key them by these (public) names, in this order
        self.query_dense, self.key_dense, self.value_dense = query_dense, key_dense, value_dense
        self.output_dense = output_dense
        self.built = True

    def _compute_attention(self, query: Tensor, key: Tensor, value: Tensor, attention_mask: Any = None,
                           training: Any = None, return_attention_scores: bool = False,
                           use_causal_mask: bool = False) -> tuple:
        """Keras's ``_compute_attention`` on the projections ``(B, T, N, key_dim)``... : (output, scores or
        None)."""
        owner = f"MultiHeadAttention '{self.name}'"
        if self._flash_attention and return_attention_scores:
            raise ValueError(f"{owner}: Returning attention scores is not supported when flash attention is "
                             "enabled. Please disable flash attention to access attention scores.")
        if not (self._dropout > 0.0 or return_attention_scores or query.ndim != 4):
            mask = attention_mask
            if mask is not None:
                for _ in range(4 - mask.ndim):
                    mask = _ops.expand_dims(mask, -len(self._attention_axes) * 2 - 1)
                mask = _ops.cast(mask, "bool")
            out = _ops.dot_product_attention(query, key, value, mask=mask, scale=self._inverse_sqrt_key_dim,
                                             is_causal=bool(use_causal_mask), flash_attention=self._flash_attention)
            return out, None
        if use_causal_mask:
            causal = _causal_mask(int(query.shape[1]), int(value.shape[1]), query)
            attention_mask = causal if attention_mask is None else _ops.logical_and(attention_mask, causal)
        query = _ops.multiply(query, _ops.cast(self._inverse_sqrt_key_dim, query.dtype))
        scores = _ops.einsum(self._dot_product_equation, key, query)
        scores = _masked_softmax(owner, scores, attention_mask, self._norm_axes, -len(self._attention_axes) * 2 - 1)
        out = _ops.einsum(self._combine_equation, self._dropout_scores(scores, training), value)
        return out, scores

    def call(self, query: Any, value: Any, key: Any = None, query_mask: Any = None, value_mask: Any = None,
             key_mask: Any = None, attention_mask: Any = None, return_attention_scores: bool = False,
             training: Any = None, use_causal_mask: bool = False) -> Any:
        owner = f"MultiHeadAttention '{self.name}'"
        self._check_inputs(owner, query, value, key)
        return_attention_scores = _validate.boolean(return_attention_scores, "return_attention_scores", owner)
        use_causal_mask = _validate.boolean(use_causal_mask, "use_causal_mask", owner)
        query_mask, value_mask, key_mask = self._masks(query, value, key, query_mask, value_mask, key_mask)
        if key is None:
            key = value
        causal_only = (use_causal_mask and query_mask is None and value_mask is None and key_mask is None
                       and attention_mask is None)
        mask = None if causal_only else _combine_masks(owner, query, value, query_mask, value_mask, key_mask,
                                                       attention_mask, use_causal_mask)
        q = self.query_dense(query)
        k = self.key_dense(key)
        v = self.value_dense(value)
        out, scores = self._compute_attention(q, k, v, mask, training, return_attention_scores,
                                              use_causal_mask=causal_only)
        out = self.output_dense(out)
        if query_mask is not None:
            out._keras_mask = _ops.cast(_ops.convert_to_tensor(query_mask), "bool")
        return (out, scores) if return_attention_scores else out

    def compute_output_shape(self, query_shape: Sequence[Any], value_shape: Sequence[Any],
                             key_shape: "Sequence[Any] | None" = None) -> tuple:
        query_shape, value_shape = tuple(query_shape), tuple(value_shape)
        key_shape = value_shape if key_shape is None else tuple(key_shape)
        if value_shape[1:-1] != key_shape[1:-1]:
            raise ValueError(f"MultiHeadAttention '{self.name}': All dimensions of `value` and `key`, except the "
                             f"last one, must be equal. Received: value_shape={value_shape} and key_shape={key_shape}")
        return query_shape[:-1] + self._output_shape if self._output_shape else query_shape

    def compute_output_spec(self, query: Any, value: Any, key: Any = None, **kwargs: Any) -> Any:
        if kwargs.get("return_attention_scores"):
            return _output_spec(self, (query, value) if key is None else (query, value, key), kwargs)
        shape = self.compute_output_shape(query.shape, value.shape, None if key is None else key.shape)
        return (tuple(shape), self._effective_compute_dtype_name())

    def get_config(self) -> dict:
        return {**super().get_config(), "num_heads": self._num_heads, "key_dim": self._key_dim,
                "value_dim": self._value_dim, **self._common_config(),
                "output_shape": self._output_shape, "attention_axes": self._attention_axes,
                "sliding_window": None}


@register
class GroupedQueryAttention(_ProjectedAttention):
    """``GroupedQueryAttention(head_dim, num_query_heads, num_key_value_heads, dropout=0.0, use_bias=True,
    flash_attention=None, kernel_initializer="glorot_uniform", bias_initializer="zeros", kernel_regularizer=None,
    bias_regularizer=None, activity_regularizer=None, kernel_constraint=None, bias_constraint=None, seed=None)``
    (Keras 3; also ``GroupQueryAttention``).

    ``call`` as :class:`MultiHeadAttention`'s on ``(B, T, dim)`` / ``(B, S, dim)`` inputs. Query head ``n``
    attends with key/value head ``n // (num_query_heads / num_key_value_heads)``. Weights (Keras's layout):
    ``query`` kernel ``(dim, num_query_heads, head_dim)``, ``key``/``value`` ``(dim, num_key_value_heads,
    head_dim)``, biases ``(heads, head_dim)``, ``attention_output`` ``(num_query_heads, head_dim, dim)`` and bias
    ``(dim,)``. The masks are taken only from the arguments (Keras 3 reads no Keras mask here).
    ``sliding_window`` and ``use_gate=True`` are not supported.
    """

    def __init__(self, head_dim: int, num_query_heads: int, num_key_value_heads: int, dropout: float = 0.0,
                 use_bias: bool = True, sliding_window: Any = None, flash_attention: Any = None,
                 kernel_initializer: Any = "glorot_uniform", bias_initializer: Any = "zeros",
                 kernel_regularizer: Any = None, bias_regularizer: Any = None, activity_regularizer: Any = None,
                 kernel_constraint: Any = None, bias_constraint: Any = None, use_gate: bool = False,
                 seed: "int | None" = None, **kwargs: Any) -> None:
        name = kwargs.get("name")
        owner = f"GroupedQueryAttention '{name}'" if isinstance(name, str) else "GroupedQueryAttention"
        head_dim = _positive_int(head_dim, "head_dim", owner)
        num_query_heads = _positive_int(num_query_heads, "num_query_heads", owner)
        num_key_value_heads = _positive_int(num_key_value_heads, "num_key_value_heads", owner)
        if num_query_heads % num_key_value_heads:
            raise ValueError(f"{owner}: `num_query_heads` must be divisible by `num_key_value_heads`, got "
                             f"num_query_heads={num_query_heads}, num_key_value_heads={num_key_value_heads}")
        super().__init__(**kwargs)
        owner = f"GroupedQueryAttention '{self.name}'"
        self.head_dim, self.num_query_heads, self.num_key_value_heads = head_dim, num_query_heads, num_key_value_heads
        self.num_repeats = num_query_heads // num_key_value_heads
        self._init_common(dropout, use_bias, flash_attention, kernel_initializer, bias_initializer,
                          kernel_regularizer, bias_regularizer, activity_regularizer, kernel_constraint,
                          bias_constraint, use_gate, seed, owner)
        if sliding_window is not None:
            raise NotImplementedError(f"{owner}: sliding_window is not supported")
        self._inverse_sqrt_head_dim = 1.0 / math.sqrt(float(head_dim))

    dropout = property(lambda self: self._dropout)
    use_bias = property(lambda self: self._use_bias)

    def build(self, query_shape: Sequence[Any], value_shape: Sequence[Any],
              key_shape: "Sequence[Any] | None" = None) -> None:
        owner = f"GroupedQueryAttention '{self.name}'"
        query_shape, value_shape = tuple(query_shape), tuple(value_shape)
        key_shape = value_shape if key_shape is None else tuple(key_shape)
        for name, shape in (("query", query_shape), ("value", value_shape), ("key", key_shape)):
            if len(shape) != 3:
                raise ValueError(f"{owner}: `{name}` must be 3-d (batch, length, features), got shape {shape}")
        if value_shape[1] != key_shape[1]:
            raise ValueError(f"{owner}: `value` and `key` must have the same length, got shapes {value_shape} and "
                             f"{key_shape}")
        self.feature_dim = query_shape[-1]
        common, bias = self._sublayer_kwargs, self._use_bias
        subs = [
            ("_query_dense", EinsumDense("bqm,muh->bquh", (None, self.num_query_heads, self.head_dim),
                                         bias_axes="uh" if bias else None, name="query", **common()), query_shape),
            ("_key_dense", EinsumDense("bkm,mvh->bkvh", (None, self.num_key_value_heads, self.head_dim),
                                       bias_axes="vh" if bias else None, name="key", **common()), key_shape),
            ("_value_dense", EinsumDense("bkm,mvh->bkvh", (None, self.num_key_value_heads, self.head_dim),
                                         bias_axes="vh" if bias else None, name="value", **common()), value_shape),
            ("_output_dense", EinsumDense("bquh,uhm->bqm", (None, self.feature_dim), bias_axes="m" if bias else None,
                                          name="attention_output", **common()),
             (None, None, self.num_query_heads, self.head_dim)),
        ]
        for _, sub, shape in subs:
            sub.build(shape)
        for attr, sub, _ in subs:
            _track(self, attr, sub)
        self.built = True

    query_dense = property(lambda self: self._query_dense)
    key_dense = property(lambda self: self._key_dense)
    value_dense = property(lambda self: self._value_dense)
    output_dense = property(lambda self: self._output_dense)

    def _compute_attention(self, query: Tensor, key: Tensor, value: Tensor, attention_mask: Any = None,
                           training: Any = None, return_attention_scores: bool = False,
                           use_causal_mask: bool = False) -> tuple:
        """Keras's ``_compute_attention`` on ``(B, T, Nq, H)`` queries and ``(B, S, Nkv, H)`` keys/values (the
        fused path groups the heads itself; the explicit one repeats them, as Keras)."""
        owner = f"GroupedQueryAttention '{self.name}'"
        if self._flash_attention and return_attention_scores:
            raise ValueError(f"{owner}: Returning attention scores is not supported when flash attention is "
                             "enabled. Please disable flash attention to access attention scores.")
        if not (self._dropout > 0.0 or return_attention_scores):
            mask = attention_mask
            if mask is not None:
                for _ in range(4 - mask.ndim):
                    mask = _ops.expand_dims(mask, -3)
                mask = _ops.cast(mask, "bool")
            out = _ops.dot_product_attention(query, key, value, mask=mask, scale=self._inverse_sqrt_head_dim,
                                             is_causal=bool(use_causal_mask), flash_attention=self._flash_attention)
            return out, None
        key = _ops.repeat(key, self.num_repeats, axis=2)
        value = _ops.repeat(value, self.num_repeats, axis=2)
        if use_causal_mask:
            causal = _causal_mask(int(query.shape[1]), int(value.shape[1]), query)
            attention_mask = causal if attention_mask is None else _ops.logical_and(attention_mask, causal)
        query = _ops.multiply(query, _ops.cast(self._inverse_sqrt_head_dim, query.dtype))
        scores = _ops.einsum("bquh,bkuh->buqk", query, key)
        scores = _masked_softmax(owner, scores, attention_mask, (-1,), -3)
        out = _ops.einsum("buqk,bkuh->bquh", self._dropout_scores(scores, training), value)
        return out, scores

    def call(self, query: Any, value: Any, key: Any = None, query_mask: Any = None, value_mask: Any = None,
             key_mask: Any = None, attention_mask: Any = None, return_attention_scores: bool = False,
             training: Any = None, use_causal_mask: bool = False) -> Any:
        owner = f"GroupedQueryAttention '{self.name}'"
        self._check_inputs(owner, query, value, key)
        return_attention_scores = _validate.boolean(return_attention_scores, "return_attention_scores", owner)
        use_causal_mask = _validate.boolean(use_causal_mask, "use_causal_mask", owner)
        if key is None:
            key = value
        causal_only = (use_causal_mask and query_mask is None and value_mask is None and key_mask is None
                       and attention_mask is None)
        mask = None if causal_only else _combine_masks(owner, query, value, query_mask, value_mask, key_mask,
                                                       attention_mask, use_causal_mask)
        q = self._query_dense(query)
        k = self._key_dense(key)
        v = self._value_dense(value)
        out, scores = self._compute_attention(q, k, v, mask, training, return_attention_scores,
                                              use_causal_mask=causal_only)
        out = self._output_dense(out)
        return (out, scores) if return_attention_scores else out

    def compute_output_shape(self, query_shape: Sequence[Any], value_shape: Sequence[Any],
                             key_shape: "Sequence[Any] | None" = None) -> tuple:
        return tuple(query_shape)

    def compute_output_spec(self, query: Any, value: Any, key: Any = None, **kwargs: Any) -> Any:
        if kwargs.get("return_attention_scores"):
            return _output_spec(self, (query, value) if key is None else (query, value, key), kwargs)
        return (tuple(query.shape), self._effective_compute_dtype_name())

    def get_config(self) -> dict:
        return {**super().get_config(), "head_dim": self.head_dim, "num_query_heads": self.num_query_heads,
                "num_key_value_heads": self.num_key_value_heads, **self._common_config(), "sliding_window": None}


GroupQueryAttention = GroupedQueryAttention
_REGISTRY["GroupQueryAttention"] = GroupedQueryAttention  # the name Keras 3 exports it under and writes in files


@register
class Attention(Layer):
    """``Attention(use_scale=False, score_mode="dot", dropout=0.0, seed=None)`` (Keras 3, Luong-style).

    ``call([query, value] or [query, value, key], mask=None, training=False, return_attention_scores=False,
    use_causal_mask=False)``: ``query`` ``(B, Tq, dim)``, ``value`` ``(B, Tv, dim_v)``, ``key`` ``(B, Tv, dim)``
    (default ``value``). Scores ``query @ key^T`` (``"dot"``, times ``scale``) or ``concat_score_weight *
    sum(tanh(scale * (q + k)))`` (``"concat"``); the value mask (``mask[1]``) and the causal mask remove sources
    (``-1e9`` before the softmax); ``dropout`` applies to the weights in training; output rows of masked queries
    (``mask[0]``) are 0 and carry the query mask. Weights: ``scale`` ``()`` (``use_scale``),
    ``concat_score_weight`` ``()`` (``"concat"``), both initialised to 1.
    """

    def __init__(self, use_scale: bool = False, score_mode: str = "dot", dropout: float = 0.0,
                 seed: "int | None" = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        owner = f"{type(self).__name__} '{self.name}'"
        self.use_scale = _validate.boolean(use_scale, "use_scale", owner)
        if score_mode not in ("dot", "concat"):
            raise ValueError(f"{owner}: Invalid value for argument score_mode. Expected one of {{'dot', 'concat'}}. "
                             f"Received: score_mode={score_mode!r}")
        self.score_mode = score_mode
        self.dropout = _dropout_rate(dropout, owner)
        self.seed = None if seed is None else _validate.non_negative_int(seed, "seed", owner)
        self._seed_generator = _random.SeedGenerator(self.seed) if self.dropout > 0 else None
        self.supports_masking = True
        self.scale = None
        self.concat_score_weight = None

    def _validate_inputs(self, inputs: Any, mask: Any = None) -> None:
        owner = f"{type(self).__name__} '{self.name}'"
        if not isinstance(inputs, (list, tuple)) or any(s is None or isinstance(s, (int, np.integer))
                                                        for s in inputs):
            raise ValueError(f"{owner}: must be called on a list of inputs, namely [query, value] or [query, value, "
                             f"key]. Received: {type(inputs).__name__}.")
        if not 2 <= len(inputs) <= 3:
            raise ValueError(f"{owner}: accepts inputs list of length 2 or 3, namely [query, value] or [query, value,"
                             f" key]. Received length: {len(inputs)}.")
        if mask is not None:
            if not isinstance(mask, (list, tuple)):
                raise ValueError(f"{owner}: mask must be a list, namely [query_mask, value_mask]. Received: "
                                 f"{type(mask).__name__}.")
            if not 2 <= len(mask) <= 3:
                raise ValueError(f"{owner}: accepts a mask list of length 2 or 3, got {len(mask)}.")

    def _check_shapes(self, shapes: Sequence[Any]) -> None:
        owner = f"{type(self).__name__} '{self.name}'"
        q, v = tuple(shapes[0]), tuple(shapes[1])
        k = tuple(shapes[2]) if len(shapes) > 2 else v
        if len(q) < 2 or len(v) < 2 or len(k) < 2:
            raise ValueError(f"{owner}: query, value and key need a length and a feature axis, got shapes {q}, {v}, {k}")
        if q[-1] != k[-1]:
            raise ValueError(f"{owner}: query and key must have the same last axis, got shapes {q} and {k}")
        if v[-2] != k[-2]:
            raise ValueError(f"{owner}: value and key must have the same length (axis -2), got shapes {v} and {k}")

    def build(self, input_shape: Any) -> None:
        self._validate_inputs(input_shape)
        self._check_shapes(input_shape)
        if self.use_scale:
            self.scale = self.add_weight(name="scale", shape=(), initializer="ones", trainable=True)
        if self.score_mode == "concat":
            self.concat_score_weight = self.add_weight(name="concat_score_weight", shape=(), initializer="ones",
                                                       trainable=True)
        self.built = True

    def _calculate_scores(self, query: Tensor, key: Tensor) -> Tensor:
        if self.score_mode == "dot":
            scores = _ops.matmul(query, _ops.swapaxes(key, -2, -1))
            return scores if self.scale is None else _ops.multiply(scores, self.scale)
        q, k = _ops.expand_dims(query, -2), _ops.expand_dims(key, -3)
        summed = _ops.add(q, k) if self.scale is None else _ops.multiply(self.scale, _ops.add(q, k))
        return _ops.multiply(self.concat_score_weight, _ops.sum(_ops.tanh(summed), axis=-1))

    def _apply_scores(self, scores: Tensor, value: Tensor, scores_mask: Any, training: Any) -> tuple:
        if scores_mask is not None:
            padding = _ops.logical_not(scores_mask)
            if padding.ndim == 2:
                padding = _ops.expand_dims(padding, -2)
            big = 65504.0 if str(scores.dtype) == "float16" else 1.0e9
            scores = _ops.where(padding, _ops.subtract(scores, big), scores)
        weights = _ops.softmax(scores, axis=-1)
        if training and self.dropout > 0:
            weights = _random.dropout(weights, self.dropout, seed=self._seed_generator)
        return _ops.matmul(weights, value), weights

    def call(self, inputs: Any, mask: Any = None, training: Any = False, return_attention_scores: bool = False,
             use_causal_mask: bool = False) -> Any:
        owner = f"{type(self).__name__} '{self.name}'"
        self._validate_inputs(inputs, mask)
        self._check_shapes([tuple(t.shape) for t in inputs])
        if mask is None and any(_mask_of(t) is not None for t in inputs):
            mask = [_mask_of(t) for t in inputs]
        q, v = inputs[0], inputs[1]
        k = inputs[2] if len(inputs) > 2 else v
        q_mask = mask[0] if mask else None
        v_mask = mask[1] if mask else None
        scores = self._calculate_scores(q, k)
        if v_mask is not None:
            v_mask = _ops.cast(_ops.convert_to_tensor(v_mask), "bool")
            if tuple(v_mask.shape) != tuple(v.shape[:-1]):
                raise ValueError(f"{owner}: the value mask must have shape {tuple(v.shape[:-1])}, got "
                                 f"{tuple(v_mask.shape)}")
        scores_mask = v_mask
        if _validate.boolean(use_causal_mask, "use_causal_mask", owner):
            causal = _causal_mask(int(scores.shape[-2]), int(scores.shape[-1]), scores)
            scores_mask = causal if v_mask is None else _ops.logical_and(_ops.expand_dims(v_mask, -2), causal)
        out, weights = self._apply_scores(scores, v, scores_mask, training)
        if q_mask is not None:
            q_mask = _ops.cast(_ops.convert_to_tensor(q_mask), "bool")
            out = _ops.where(_ops.expand_dims(q_mask, -1), out, 0.0)
            out._keras_mask = q_mask
        return (out, weights) if return_attention_scores else out

    def compute_mask(self, inputs: Any, mask: Any = None) -> Any:
        self._validate_inputs(inputs, mask)
        return None if mask is None or mask[0] is None else _ops.convert_to_tensor(mask[0])

    def compute_output_shape(self, input_shape: Any) -> tuple:
        return (*tuple(input_shape[0])[:-1], tuple(input_shape[1])[-1])

    def compute_output_spec(self, inputs: Any, mask: Any = None, return_attention_scores: bool = False,
                            training: Any = None, use_causal_mask: bool = False) -> Any:
        self._validate_inputs(inputs, mask)
        dtype = self._effective_compute_dtype_name()
        shape = self.compute_output_shape([t.shape for t in inputs])
        if return_attention_scores:
            key = inputs[2] if len(inputs) > 2 else inputs[1]
            return (tuple(shape), dtype), ((*tuple(inputs[0].shape)[:-1], key.shape[-2]), dtype)
        return (tuple(shape), dtype)

    def get_config(self) -> dict:
        return {**super().get_config(), "use_scale": self.use_scale, "score_mode": self.score_mode,
                "dropout": self.dropout, "seed": self.seed}


@register
class AdditiveAttention(Attention):
    """``AdditiveAttention(use_scale=True, dropout=0.0)`` (Keras 3, Bahdanau-style): scores
    ``sum(scale * tanh(q + k), axis=-1)``; otherwise as :class:`Attention`. Weight: ``scale`` ``(dim,)``,
    glorot-uniform (``use_scale``)."""

    def __init__(self, use_scale: bool = True, dropout: float = 0.0, **kwargs: Any) -> None:
        super().__init__(use_scale=use_scale, dropout=dropout, **kwargs)

    def build(self, input_shape: Any) -> None:
        self._validate_inputs(input_shape)
        self._check_shapes(input_shape)
        if self.use_scale:
            self.scale = self.add_weight(name="scale", shape=(int(tuple(input_shape[0])[-1]),),
                                         initializer="glorot_uniform", trainable=True)
        self.built = True

    def _calculate_scores(self, query: Tensor, key: Tensor) -> Tensor:
        t = _ops.tanh(_ops.add(_ops.expand_dims(query, -2), _ops.expand_dims(key, -3)))
        return _ops.sum(t if self.scale is None else _ops.multiply(self.scale, t), axis=-1)

    def get_config(self) -> dict:
        config = super().get_config()
        del config["score_mode"]
        return config
