"""The recurrent cells of Keras 3 (``SimpleRNNCell``, ``LSTMCell``, ``GRUCell``, ``StackedRNNCells``), one time
step each, written in ``keras.ops`` so that they train on both backends with no backward written by hand.

A cell is a layer with ``state_size`` (an int, or a list of ints: one per state tensor), ``output_size``, and
``call(inputs, states, training=False) -> (output, new_states)`` on one step ``(batch, features)``. Weights and
their layouts are Keras's: ``kernel`` ``(features, gates * units)``, ``recurrent_kernel`` ``(units, gates *
units)``, ``bias`` ``(gates * units,)`` (GRU with ``reset_after=True``: ``(2, 3 * units)``, the input bias then
the recurrent one); the gates are packed in Keras's order, i, f, c, o for the LSTM and z, r, h for the GRU.

Dropout (``dropout`` on the step inputs, ``recurrent_dropout`` on the previous output) uses one mask for every
step of a sequence, drawn at the first step of a call and dropped when the :class:`~.rnn.RNN` layer's call ends
(:class:`DropoutRNNCell`, as Keras): the masks come from the cell's own ``keras.random.SeedGenerator``. With
``recurrent_dropout`` each gate gets its own masks (Keras's ``implementation=1``).
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from dnnbind import _validate
from dnnbind import activations as _activations
from dnnbind import initializers as _init
from dnnbind import ops as _ops
from dnnbind import random as _random

from ..base import Layer, deserialize, register

__all__ = ["DropoutRNNCell", "SimpleRNNCell", "LSTMCell", "GRUCell", "StackedRNNCells", "is_nested",
           "flatten_states", "pack_states", "deserialize_layer", "serialize_layer"]


# ----- nested state structures (StackedRNNCells holds one structure per cell) -----------------------------
def is_nested(value: Any) -> bool:
    return isinstance(value, (list, tuple))


def flatten_states(states: Any) -> list:
    """The tensors of a (nested) structure of states, in order."""
    if is_nested(states):
        return [t for s in states for t in flatten_states(s)]
    return [states]


def pack_states(structure: Any, flat: Sequence[Any]) -> Any:
    """``flat`` (as :func:`flatten_states` gives it) back into the nesting of ``structure``."""
    flat = list(flat)

    def take(s: Any) -> Any:
        if is_nested(s):
            return type(s)(take(x) for x in s) if isinstance(s, tuple) else [take(x) for x in s]
        return flat.pop(0)

    out = take(structure)
    if flat:
        raise ValueError(f"{len(flat)} state tensor(s) left over when packing into {structure!r}")
    return out


def serialize_layer(layer: Layer) -> dict:
    """``{"class_name": ..., "config": ...}`` of a layer held inside another (a cell, a wrapped layer)."""
    return {"class_name": type(layer).__name__, "config": layer.get_config()}


def deserialize_layer(config: Any, what: str, owner: str) -> Layer:
    """A layer from :func:`serialize_layer`'s dict (or Keras's ``{"module", "class_name", "config", ...}``),
    or the layer itself; anything else is a clear error naming ``owner`` and the argument ``what``."""
    if isinstance(config, Layer):
        return config
    if isinstance(config, dict) and isinstance(config.get("class_name"), str) and isinstance(config.get("config"),
                                                                                            dict):
        return deserialize({"class_name": config["class_name"], "config": dict(config["config"])})
    raise _validate.ArgumentTypeError(f"{owner}: {what} must be a layer or its config "
                                      f"{{'class_name': ..., 'config': {{...}}}}, got {str(config)[:200]}")


def _rate(value: Any, name: str, owner: str) -> float:
    """Keras clips dropout rates into [0, 1]; anything that is not a real number is refused."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)) or \
            not np.isfinite(float(value)):
        raise _validate.ArgumentTypeError(f"{owner}: {name} must be a number in [0, 1], got {value!r}")
    return min(1.0, max(0.0, float(value)))


class DropoutRNNCell:
    """Keras's mixin: one dropout mask per call of the RNN (the same for every step), made on first use.

    The host class has ``dropout``, ``recurrent_dropout``, ``seed`` and, with per-gate masks,
    ``dropout_mask_count``; the masks are kept in private attributes (not state: nothing saves them) until
    :meth:`reset_dropout_mask` / :meth:`reset_recurrent_dropout_mask`."""

    _dropout_mask = None
    _recurrent_dropout_mask = None
    _seed_generator = None

    @property
    def seed_generator(self) -> "_random.SeedGenerator":
        if self._seed_generator is None:
            self._seed_generator = _random.SeedGenerator(seed=self.seed)
        return self._seed_generator

    def _create_dropout_mask(self, step_input: Any, rate: float) -> Any:
        ones = _ops.ones_like(_ops.stop_gradient(step_input))
        count = getattr(self, "dropout_mask_count", None)
        if count is None:
            return _random.dropout(ones, rate=rate, seed=self.seed_generator)
        return [_random.dropout(ones, rate=rate, seed=self.seed_generator) for _ in range(count)]

    def get_dropout_mask(self, step_input: Any) -> Any:
        if self._dropout_mask is None and self.dropout > 0:
            self._dropout_mask = self._create_dropout_mask(step_input, self.dropout)
        return self._dropout_mask

    def get_recurrent_dropout_mask(self, step_input: Any) -> Any:
        if self._recurrent_dropout_mask is None and self.recurrent_dropout > 0:
            self._recurrent_dropout_mask = self._create_dropout_mask(step_input, self.recurrent_dropout)
        return self._recurrent_dropout_mask

    def reset_dropout_mask(self) -> None:
        self._dropout_mask = None

    def reset_recurrent_dropout_mask(self) -> None:
        self._recurrent_dropout_mask = None


class _GatedCell(Layer, DropoutRNNCell):
    """What the three Keras cells share: their arguments, weights, dropout and config."""

    #: gates packed in the kernels (SimpleRNN 1, GRU 3, LSTM 4)
    _gates = 1
    _has_recurrent_activation = True

    def __init__(self, units: int, activation: Any = "tanh", recurrent_activation: Any = "sigmoid",
                 use_bias: bool = True, kernel_initializer: Any = "glorot_uniform",
                 recurrent_initializer: Any = "orthogonal", bias_initializer: Any = "zeros",
                 kernel_regularizer: Any = None, recurrent_regularizer: Any = None, bias_regularizer: Any = None,
                 kernel_constraint: Any = None, recurrent_constraint: Any = None, bias_constraint: Any = None,
                 dropout: float = 0.0, recurrent_dropout: float = 0.0, seed: "int | None" = None,
                 **kwargs: Any) -> None:
        implementation = kwargs.pop("implementation", 2)
        super().__init__(kernel_regularizer=kernel_regularizer, recurrent_regularizer=recurrent_regularizer,
                         bias_regularizer=bias_regularizer, kernel_constraint=kernel_constraint,
                         recurrent_constraint=recurrent_constraint, bias_constraint=bias_constraint, **kwargs)
        owner = f"{type(self).__name__} '{self.name}'"
        if isinstance(units, (bool, np.bool_)) or not isinstance(units, (int, np.integer)) or units <= 0:
            raise ValueError(f"{owner}: Received an invalid value for argument `units`, expected a positive "
                             f"integer, got {units!r}.")
        self.units = int(units)
        self.activation = self._activation(activation, "activation", owner)
        if self._has_recurrent_activation:
            self.recurrent_activation = self._activation(recurrent_activation, "recurrent_activation", owner)
        self.use_bias = _validate.boolean(use_bias, "use_bias", owner)
        self.kernel_initializer = self._initializer(kernel_initializer, "kernel_initializer", owner)
        self.recurrent_initializer = self._initializer(recurrent_initializer, "recurrent_initializer", owner)
        self.bias_initializer = self._initializer(bias_initializer, "bias_initializer", owner)
        self.dropout = _rate(dropout, "dropout", owner)
        self.recurrent_dropout = _rate(recurrent_dropout, "recurrent_dropout", owner)
        self.seed = None if seed is None else _validate.non_negative_int(seed, "seed", owner)
        self.implementation = _validate.one_of(implementation, "implementation", owner, (1, 2))
        if self.recurrent_dropout != 0.0:
            self.implementation = 1
        if self.implementation == 1 and self._gates > 1:
            self.dropout_mask_count = self._gates
        self.supports_masking = False
        self.kernel = self.recurrent_kernel = self.bias = None

    @classmethod
    def _builds_keras_shapes(cls) -> bool:
        return True  # build() takes Keras shapes, with the batch axis (also when a model builds it)

    @staticmethod
    def _activation(value: Any, name: str, owner: str) -> Any:
        try:
            return _activations.get(value)
        except ValueError as exc:
            raise ValueError(f"{owner}: {name}: {exc}") from None

    @staticmethod
    def _initializer(value: Any, name: str, owner: str) -> Any:
        try:
            return _init.get(value)
        except (ValueError, TypeError) as exc:
            raise ValueError(f"{owner}: {name}: {exc}") from None

    # ----- weights -------------------------------------------------------------------------------------
    def _bias_shape(self) -> tuple:
        return (self._gates * self.units,)

    def _bias_value(self, shape: tuple, dtype: Any) -> "np.ndarray | None":
        """The bias's initial value when it is not ``bias_initializer(shape)`` (overridden: the LSTM's forget
        gate)."""
        return None

    def build(self, input_shape: Sequence[Any]) -> None:
        owner = f"{type(self).__name__} '{self.name}'"
        shape = tuple(input_shape)
        if not shape or shape[-1] is None:
            raise ValueError(f"{owner}: the last axis of the step inputs must be known, got shape {shape}")
        width = self._gates * self.units
        self.kernel = self.add_weight(shape=(int(shape[-1]), width), initializer=self.kernel_initializer,
                                      name="kernel")
        self.recurrent_kernel = self.add_weight(shape=(self.units, width), initializer=self.recurrent_initializer,
                                                name="recurrent_kernel")
        if self.use_bias:
            special = self._bias_value  # (the LSTM's forget gate) made as the initial value, never assigned after
            initializer = self.bias_initializer if type(self)._bias_value is _GatedCell._bias_value else (
                lambda shape, dtype: special(tuple(shape), dtype))
            self.bias = self.add_weight(shape=self._bias_shape(), initializer=initializer, name="bias")
        else:
            self.bias = None
        self.built = True

    # ----- one step --------------------------------------------------------------------------------------
    def _masks(self, inputs: Any, h_tm1: Any, training: Any) -> tuple:
        """``(input masks, recurrent masks)`` for this step: None, one mask, or one per gate."""
        dp = rec = None
        if training and 0.0 < self.dropout < 1.0:
            dp = self.get_dropout_mask(inputs)
        if training and 0.0 < self.recurrent_dropout < 1.0:
            rec = self.get_recurrent_dropout_mask(h_tm1)
        return dp, rec

    def _projections(self, x: Any, kernel: Any, masks: Any) -> list:
        """``x @ kernel`` split into its gates; ``masks`` (one per gate) multiply ``x`` first."""
        if isinstance(masks, list):
            return [_ops.matmul(_ops.multiply(x, m), k) for m, k in zip(masks, _ops.split(kernel, self._gates,
                                                                                       axis=1))]
        if masks is not None:
            x = _ops.multiply(x, masks)
        z = _ops.matmul(x, kernel)
        return [z] if self._gates == 1 else _ops.split(z, self._gates, axis=-1)

    def get_initial_state(self, batch_size: "int | None" = None) -> list:
        sizes = self.state_size if is_nested(self.state_size) else [self.state_size]
        dtype = self._effective_compute_dtype_name()
        return [_ops.zeros((int(batch_size), int(d)), dtype=dtype) for d in sizes]

    def compute_output_shape(self, input_shape: Sequence[Any]) -> tuple:
        return (tuple(input_shape)[0], self.units)

    # ----- config ----------------------------------------------------------------------------------------
    def get_config(self) -> dict:
        config = super().get_config()
        for key in ("kernel", "recurrent", "bias"):
            config.setdefault(f"{key}_regularizer", None)
            config.setdefault(f"{key}_constraint", None)
        config.update(units=self.units, activation=_activations.serialize(self.activation))
        if self._has_recurrent_activation:
            config["recurrent_activation"] = _activations.serialize(self.recurrent_activation)
        config.update(use_bias=self.use_bias, kernel_initializer=_init.serialize(self.kernel_initializer),
                      recurrent_initializer=_init.serialize(self.recurrent_initializer),
                      bias_initializer=_init.serialize(self.bias_initializer), dropout=self.dropout,
                      recurrent_dropout=self.recurrent_dropout, seed=self.seed)
        return config


@register
class SimpleRNNCell(_GatedCell):
    """``keras.layers.SimpleRNNCell(units, activation="tanh", use_bias=True, kernel_initializer="glorot_uniform",
    recurrent_initializer="orthogonal", bias_initializer="zeros", kernel_regularizer=None,
    recurrent_regularizer=None, bias_regularizer=None, kernel_constraint=None, recurrent_constraint=None,
    bias_constraint=None, dropout=0.0, recurrent_dropout=0.0, seed=None)``.

    ``h = activation(x @ kernel + bias + h_tm1 @ recurrent_kernel)``; ``state_size = units``."""

    _has_recurrent_activation = False

    def __init__(self, units: int, activation: Any = "tanh", use_bias: bool = True, **kwargs: Any) -> None:
        if "recurrent_activation" in kwargs:
            raise TypeError(f"{type(self).__name__}: unexpected keyword argument(s) recurrent_activation")
        super().__init__(units, activation=activation, use_bias=use_bias, **kwargs)
        self.state_size = self.units
        self.output_size = self.units

    def call(self, sequence: Any, states: Any, training: Any = False) -> tuple:
        prev_output = states[0] if is_nested(states) else states
        dp, rec = self._masks(sequence, prev_output, training)
        (h,) = self._projections(sequence, self.kernel, dp)
        if self.bias is not None:
            h = _ops.add(h, self.bias)
        if rec is not None:
            prev_output = _ops.multiply(prev_output, rec)
        output = self.activation(_ops.add(h, _ops.matmul(prev_output, self.recurrent_kernel)))
        return output, ([output] if is_nested(states) else output)


@register
class LSTMCell(_GatedCell):
    """``keras.layers.LSTMCell(units, activation="tanh", recurrent_activation="sigmoid", use_bias=True,
    kernel_initializer="glorot_uniform", recurrent_initializer="orthogonal", bias_initializer="zeros",
    unit_forget_bias=True, kernel_regularizer=None, recurrent_regularizer=None, bias_regularizer=None,
    kernel_constraint=None, recurrent_constraint=None, bias_constraint=None, dropout=0.0,
    recurrent_dropout=0.0, seed=None)``.

    Gates i, f, c, o (in that order along the kernels' last axis); ``state_size = [units, units]`` (h, c).
    ``unit_forget_bias``: the forget gate's bias starts at 1 (the rest from ``bias_initializer``)."""

    _gates = 4

    def __init__(self, units: int, activation: Any = "tanh", recurrent_activation: Any = "sigmoid",
                 use_bias: bool = True, unit_forget_bias: bool = True, **kwargs: Any) -> None:
        super().__init__(units, activation=activation, recurrent_activation=recurrent_activation,
                         use_bias=use_bias, **kwargs)
        self.unit_forget_bias = _validate.boolean(unit_forget_bias, "unit_forget_bias",
                                                  f"{type(self).__name__} '{self.name}'")
        self.state_size = [self.units, self.units]
        self.output_size = self.units

    def _bias_value(self, shape: tuple, dtype: Any) -> "np.ndarray | None":
        if not self.unit_forget_bias:
            return np.asarray(self.bias_initializer(shape, dtype=dtype), dtype)
        u = self.units
        init = self.bias_initializer
        return np.concatenate([np.asarray(init((u,), dtype=dtype)), np.ones((u,), dtype),
                               np.asarray(init((2 * u,), dtype=dtype))]).astype(dtype)

    def call(self, inputs: Any, states: Any, training: Any = False) -> tuple:
        h_tm1, c_tm1 = states[0], states[1]
        dp, rec = self._masks(inputs, h_tm1, training)
        xs = self._projections(inputs, self.kernel, dp)
        hs = self._projections(h_tm1, self.recurrent_kernel, rec)
        if self.bias is not None:
            bs = _ops.split(self.bias, 4, axis=0)
            xs = [_ops.add(x, b) for x, b in zip(xs, bs)]
        z_i, z_f, z_c, z_o = (_ops.add(x, h) for x, h in zip(xs, hs))
        i = self.recurrent_activation(z_i)
        f = self.recurrent_activation(z_f)
        c = _ops.add(_ops.multiply(f, c_tm1), _ops.multiply(i, self.activation(z_c)))
        o = self.recurrent_activation(z_o)
        h = _ops.multiply(o, self.activation(c))
        return h, [h, c]

    def get_config(self) -> dict:
        return {**super().get_config(), "unit_forget_bias": self.unit_forget_bias}


@register
class GRUCell(_GatedCell):
    """``keras.layers.GRUCell(units, activation="tanh", recurrent_activation="sigmoid", use_bias=True,
    kernel_initializer="glorot_uniform", recurrent_initializer="orthogonal", bias_initializer="zeros",
    kernel_regularizer=None, recurrent_regularizer=None, bias_regularizer=None, kernel_constraint=None,
    recurrent_constraint=None, bias_constraint=None, dropout=0.0, recurrent_dropout=0.0, reset_after=True,
    seed=None)``.

    Gates z, r, h; ``h = z * h_tm1 + (1 - z) * hh``. ``reset_after=True`` (Keras 3's and cuDNN's form): the
    reset gate multiplies ``h_tm1 @ recurrent_kernel_h + recurrent_bias_h``, and ``bias`` is ``(2, 3 * units)``
    (input bias, recurrent bias); ``reset_after=False``: it multiplies ``h_tm1`` before the matmul and ``bias``
    is ``(3 * units,)``. ``state_size = units``."""

    _gates = 3

    def __init__(self, units: int, activation: Any = "tanh", recurrent_activation: Any = "sigmoid",
                 use_bias: bool = True, reset_after: bool = True, **kwargs: Any) -> None:
        super().__init__(units, activation=activation, recurrent_activation=recurrent_activation,
                         use_bias=use_bias, **kwargs)
        self.reset_after = _validate.boolean(reset_after, "reset_after", f"{type(self).__name__} '{self.name}'")
        self.state_size = self.units
        self.output_size = self.units

    def _bias_shape(self) -> tuple:
        return (2, 3 * self.units) if self.reset_after else (3 * self.units,)

    def call(self, inputs: Any, states: Any, training: Any = False) -> tuple:
        h_tm1 = states[0] if is_nested(states) else states
        input_bias = recurrent_bias = None
        if self.bias is not None:
            if self.reset_after:
                input_bias, recurrent_bias = _ops.unstack(self.bias, axis=0)
            else:
                input_bias = self.bias
        dp, rec = self._masks(inputs, h_tm1, training)
        x_z, x_r, x_h = self._projections(inputs, self.kernel, dp)
        if input_bias is not None:
            x_z, x_r, x_h = (_ops.add(x, b) for x, b in zip((x_z, x_r, x_h), _ops.split(input_bias, 3, axis=0)))
        rec_masks = rec if isinstance(rec, list) else [rec] * 3
        h_z, h_r, h_h = (h_tm1 if m is None else _ops.multiply(h_tm1, m) for m in rec_masks)
        k_z, k_r, k_h = _ops.split(self.recurrent_kernel, 3, axis=1)
        r_z, r_r = _ops.matmul(h_z, k_z), _ops.matmul(h_r, k_r)
        if recurrent_bias is not None:
            b_z, b_r, b_h = _ops.split(recurrent_bias, 3, axis=0)
            r_z, r_r = _ops.add(r_z, b_z), _ops.add(r_r, b_r)
        z = self.recurrent_activation(_ops.add(x_z, r_z))
        r = self.recurrent_activation(_ops.add(x_r, r_r))
        if self.reset_after:
            r_h = _ops.matmul(h_h, k_h)
            if recurrent_bias is not None:
                r_h = _ops.add(r_h, b_h)
            r_h = _ops.multiply(r, r_h)
        else:
            r_h = _ops.matmul(_ops.multiply(r, h_h), k_h)
        hh = self.activation(_ops.add(x_h, r_h))
        h = _ops.add(_ops.multiply(z, h_tm1), _ops.multiply(_ops.subtract(1.0, z), hh))
        return h, ([h] if is_nested(states) else h)

    def get_config(self) -> dict:
        return {**super().get_config(), "reset_after": self.reset_after}


def _check_cell(cell: Any, what: str, owner: str) -> None:
    if not callable(getattr(cell, "call", None)):
        raise ValueError(f"{owner}: {what} should have a `call` method, got {cell!r}")
    if getattr(cell, "state_size", None) is None:
        raise ValueError(f"{owner}: {what} should have a `state_size` attribute (an integer or a list of integers, "
                         f"one per state tensor), got {cell!r}")


def _cell_output_size(cell: Any) -> int:
    size = getattr(cell, "output_size", None)
    if size is not None:
        return int(size)
    state = cell.state_size
    return int(state[0] if is_nested(state) else state)


def _call_cell(cell: Any, inputs: Any, states: Any, training: Any) -> tuple:
    """``cell(inputs, states[, training=...])``: ``training`` only when the cell's ``call`` takes it."""
    if isinstance(cell, Layer):
        params = cell._call_parameters()
        if "training" in params or params.get("**"):
            return cell(inputs, states, training=training)
    return cell(inputs, states) if callable(cell) else cell.call(inputs, states)


@register
class StackedRNNCells(Layer):
    """``keras.layers.StackedRNNCells(cells)``: cells run one after the other within each step, the output of
    one the input of the next. ``state_size`` is the list of the cells' state sizes; the states are one
    structure per cell (a list for a cell of several states)."""

    def __init__(self, cells: Sequence[Any], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        owner = f"{type(self).__name__} '{self.name}'"
        if not is_nested(cells) or not cells:
            raise _validate.ArgumentTypeError(f"{owner}: cells must be a non-empty list of RNN cells, got {cells!r}")
        cells = [deserialize_layer(c, "cells", owner) if isinstance(c, dict) else c for c in cells]
        for k, cell in enumerate(cells):
            _check_cell(cell, f"cells[{k}]", owner)
        self.cells = list(cells)

    @classmethod
    def _builds_keras_shapes(cls) -> bool:
        return True  # build() takes Keras shapes, with the batch axis (also when a model builds it)

    @property
    def state_size(self) -> list:
        return [c.state_size for c in self.cells]

    @property
    def output_size(self) -> int:
        return _cell_output_size(self.cells[-1])

    def get_initial_state(self, batch_size: "int | None" = None) -> list:
        out = []
        for cell in self.cells:
            fn = getattr(cell, "get_initial_state", None)
            if fn is not None:  # (as the cell gives it: Keras's cells give a list, even of one state)
                out.append(fn(batch_size=batch_size))
            else:
                sizes = cell.state_size
                dtype = self._effective_compute_dtype_name()
                zeros = [_ops.zeros((int(batch_size), int(d)), dtype=dtype)
                         for d in (sizes if is_nested(sizes) else [sizes])]
                out.append(zeros if is_nested(sizes) else zeros[0])
        return out

    def build(self, input_shape: Sequence[Any]) -> None:
        shape = tuple(input_shape)
        for cell in self.cells:
            if isinstance(cell, Layer) and not cell.built:
                cell.build(shape)
                cell.built = True
            shape = (shape[0], _cell_output_size(cell))
        self.built = True

    def call(self, inputs: Any, states: Any, training: Any = False) -> tuple:
        new_states = []
        for cell, cell_states in zip(self.cells, states):
            was_list = is_nested(cell_states)
            cell_states = list(cell_states) if was_list else [cell_states]
            inputs, cell_states = _call_cell(cell, inputs, cell_states, training)
            if not is_nested(cell_states):
                cell_states = [cell_states]
            new_states.append(cell_states[0] if len(cell_states) == 1 and not was_list else list(cell_states))
        return inputs, new_states

    def compute_output_shape(self, input_shape: Sequence[Any]) -> tuple:
        return (tuple(input_shape)[0], self.output_size)

    def get_config(self) -> dict:
        return {**super().get_config(), "cells": [serialize_layer(c) for c in self.cells]}

    @classmethod
    def from_config(cls, config: dict) -> "StackedRNNCells":
        config = dict(config)
        cells = [deserialize_layer(c, "cells", f"{cls.__name__} '{config.get('name')}'")
                 for c in config.pop("cells", [])]
        return cls(cells, **config)
