"""``keras.layers.ConvLSTM1D``, ``ConvLSTM2D`` and ``ConvLSTM3D`` (Keras 3), written in ``keras.ops``.

An LSTM whose input and recurrent transforms are convolutions: at each step
``z = conv(x_t, kernel) + conv(h, recurrent_kernel, padding="same") + bias`` (both convolutions by
:func:`dnnbind.ops.conv`: cuDNN on the device), split on the channel axis into the gates ``i, f, c, o`` (Keras's
order); ``c = f * c + i * activation(z_c)``, ``h = o * activation(c)``. The steps are a Python loop of ops,
differentiated by the op tape (no fused cuDNN RNN exists for convolutional cells). Weights live in the
``cell`` sublayer, as Keras: ``kernel`` ``(*kernel_size, channels, 4 * filters)``, ``recurrent_kernel``
``(*kernel_size, filters, 4 * filters)``, ``bias`` ``(4 * filters,)``.

Not supported (a clear error): ``dropout``/``recurrent_dropout`` above 0, ``stateful=True``, masks.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dnnbind import _validate
from dnnbind import activations as _activations
from dnnbind import constraints as _constraints
from dnnbind import backend as _backend
from dnnbind import initializers as _init
from dnnbind import ops as _ops
from dnnbind import regularizers as _regularizers
from dnnbind.ops._nn_common import padding_mode, spatial_tuple

from .base import Layer, register

__all__ = ["ConvLSTM1D", "ConvLSTM2D", "ConvLSTM3D"]


class _UnitForgetBias(_init.Initializer):
    """Keras's ``unit_forget_bias``: the bias initializer's values with ones for the forget gate."""

    def __init__(self, base: Any, filters: int) -> None:
        self.base, self.filters = base, filters

    def __call__(self, shape: Any, dtype: Any = None) -> Any:
        f = self.filters
        parts = [np.asarray(self.base((f,), dtype=dtype)), np.ones((f,), dtype=dtype),
                 np.asarray(self.base((2 * f,), dtype=dtype))]
        return np.concatenate(parts).astype(dtype)


class ConvLSTMCell(Layer):
    """One step of a ConvLSTM (see the module docstring); it holds the weights."""

    def __init__(self, rank: int, filters: int, kernel_size: tuple, strides: tuple, padding: str, data_format: str,
                 dilation_rate: tuple, activation: Any, recurrent_activation: Any, use_bias: bool,
                 kernel_initializer: Any, recurrent_initializer: Any, bias_initializer: Any, unit_forget_bias: bool,
                 policies: dict, **kwargs: Any) -> None:
        super().__init__(**{**policies, **kwargs})
        self.rank, self.filters, self.kernel_size = rank, filters, kernel_size
        self.strides, self.padding, self.data_format, self.dilation_rate = strides, padding, data_format, dilation_rate
        self.activation = activation
        self.recurrent_activation = recurrent_activation
        self.use_bias = use_bias
        self.kernel_initializer = kernel_initializer
        self.recurrent_initializer = recurrent_initializer
        self.bias_initializer = bias_initializer
        self.unit_forget_bias = unit_forget_bias
        self.kernel = self.recurrent_kernel = self.bias = None

    def build(self, input_dim: int) -> None:
        f4 = 4 * self.filters
        self.kernel = self.add_weight(shape=self.kernel_size + (input_dim, f4), initializer=self.kernel_initializer,
                                      name="kernel")
        self.recurrent_kernel = self.add_weight(shape=self.kernel_size + (self.filters, f4),
                                                initializer=self.recurrent_initializer, name="recurrent_kernel")
        if self.use_bias:
            init = _UnitForgetBias(self.bias_initializer, self.filters) if self.unit_forget_bias else \
                self.bias_initializer
            self.bias = self.add_weight(shape=(f4,), initializer=init, name="bias")
        self.built = True

    def step(self, x: Any, h: Any, c: Any) -> tuple:
        axis = -1 if self.data_format == "channels_last" else 1
        z = _ops.conv(x, self.kernel, strides=self.strides, padding=self.padding, data_format=self.data_format,
                      dilation_rate=self.dilation_rate)
        if self.bias is not None:
            f4 = 4 * self.filters
            shape = (1,) * (self.rank + 1) + (f4,) if axis == -1 else (1, f4) + (1,) * self.rank
            z = _ops.add(z, _ops.reshape(self.bias, shape))
        z = _ops.add(z, _ops.conv(h, self.recurrent_kernel, strides=1, padding="same", data_format=self.data_format))
        zi, zf, zc, zo = _ops.split(z, 4, axis=axis)
        i = self.recurrent_activation(zi)
        f = self.recurrent_activation(zf)
        c = _ops.add(_ops.multiply(f, c), _ops.multiply(i, self.activation(zc)))
        o = self.recurrent_activation(zo)
        return _ops.multiply(o, self.activation(c)), c


class _ConvLSTM(Layer):
    rank = 2

    def __init__(self, filters: int, kernel_size: Any, strides: Any = 1, padding: str = "valid",
                 data_format: "str | None" = None, dilation_rate: Any = 1, activation: Any = "tanh",
                 recurrent_activation: Any = "sigmoid", use_bias: bool = True,
                 kernel_initializer: Any = "glorot_uniform", recurrent_initializer: Any = "orthogonal",
                 bias_initializer: Any = "zeros", unit_forget_bias: bool = True, kernel_regularizer: Any = None,
                 recurrent_regularizer: Any = None, bias_regularizer: Any = None, activity_regularizer: Any = None,
                 kernel_constraint: Any = None, recurrent_constraint: Any = None, bias_constraint: Any = None,
                 dropout: float = 0.0, recurrent_dropout: float = 0.0, seed: "int | None" = None,
                 return_sequences: bool = False, return_state: bool = False, go_backwards: bool = False,
                 stateful: bool = False, unroll: bool = False, **kwargs: Any) -> None:
        kwargs.pop("zero_output_for_mask", None)
        super().__init__(activity_regularizer=activity_regularizer, **kwargs)
        owner = self._owner
        n = self.rank
        self.filters = _validate.positive_int(filters, "filters", owner)
        self.kernel_size = spatial_tuple(kernel_size, n, "kernel_size", owner)
        self.strides = spatial_tuple(strides, n, "strides", owner)
        self.dilation_rate = spatial_tuple(dilation_rate, n, "dilation_rate", owner)
        self.padding = padding_mode(padding, owner)
        fmt = _backend.image_data_format() if data_format is None else str(data_format).lower()
        self.data_format = _validate.one_of(fmt, "data_format", owner, ("channels_last", "channels_first"))
        for name, value in (("dropout", dropout), ("recurrent_dropout", recurrent_dropout)):
            if float(_validate.number(value, name, owner, low=0.0, high=1.0)) > 0.0:
                raise NotImplementedError(f"{owner}: {name} > 0 is not supported by dnnbind's ConvLSTM")
        if stateful:
            raise NotImplementedError(f"{owner}: stateful=True is not supported by dnnbind's ConvLSTM")
        self.dropout = self.recurrent_dropout = 0.0
        self.seed = seed
        self.return_sequences = _validate.boolean(return_sequences, "return_sequences", owner)
        self.return_state = _validate.boolean(return_state, "return_state", owner)
        self.go_backwards = _validate.boolean(go_backwards, "go_backwards", owner)
        self.stateful = False
        self.unroll = bool(unroll)
        policies = {k: v for k, v in dict(kernel_regularizer=kernel_regularizer,
                                          recurrent_kernel_regularizer=recurrent_regularizer,
                                          bias_regularizer=bias_regularizer, kernel_constraint=kernel_constraint,
                                          recurrent_kernel_constraint=recurrent_constraint,
                                          bias_constraint=bias_constraint).items() if v is not None}
        self._policy_args = dict(kernel_regularizer=kernel_regularizer, recurrent_regularizer=recurrent_regularizer,
                                 bias_regularizer=bias_regularizer, kernel_constraint=kernel_constraint,
                                 recurrent_constraint=recurrent_constraint, bias_constraint=bias_constraint)
        self.cell = ConvLSTMCell(n, self.filters, self.kernel_size, self.strides, self.padding, self.data_format,
                                 self.dilation_rate, _activations.get(activation),
                                 _activations.get(recurrent_activation), _validate.boolean(use_bias, "use_bias", owner),
                                 _init.get(kernel_initializer), _init.get(recurrent_initializer),
                                 _init.get(bias_initializer), _validate.boolean(unit_forget_bias, "unit_forget_bias",
                                                                                owner),
                                 policies, name="conv_lstm_cell", dtype=self.dtype_policy)

    @property
    def _owner(self) -> str:
        return f"{type(self).__name__} '{self.name}'"

    def _check(self, shape: Any) -> tuple:
        shape = tuple(shape)
        if len(shape) != self.rank + 3:
            spatial = [f"dim{i + 1}" for i in range(self.rank)]
            axes = spatial + ["channels"] if self.data_format == "channels_last" else ["channels"] + spatial
            raise ValueError(f"{self._owner} expects {self.rank + 3}-d inputs (batch, time, {', '.join(axes)}), got "
                             f"shape {shape}")
        return shape

    def _step_output(self, shape: tuple) -> tuple:
        """The output shape of one step for inputs ``shape`` (batch, time, ...)."""
        spatial = shape[2:-1] if self.data_format == "channels_last" else shape[3:]
        out = []
        for i, n in enumerate(spatial):
            eff = (self.kernel_size[i] - 1) * self.dilation_rate[i] + 1
            size = -(-int(n) // self.strides[i]) if self.padding == "same" else (int(n) - eff) // self.strides[i] + 1
            if size < 1:
                raise ValueError(f"{self._owner}: input {tuple(spatial)} gives an empty output (axis {i}) with "
                                 f"kernel_size {self.kernel_size}, strides {self.strides}, padding '{self.padding}'")
            out.append(size)
        if self.data_format == "channels_last":
            return (shape[0], *out, self.filters)
        return (shape[0], self.filters, *out)

    def build(self, input_shape: Any) -> None:
        shape = self._check(input_shape)
        channels = shape[-1] if self.data_format == "channels_last" else shape[2]
        spatial = shape[2:-1] if self.data_format == "channels_last" else shape[3:]
        if channels is None or None in spatial:
            raise ValueError(f"{self._owner}: the channel and spatial axes must be known (ConvLSTM layers only "
                             f"support static spatial shapes), got input shape {shape}")
        self._step_output(shape)
        if not self.cell.built:
            self.cell.build(int(channels))
        self.built = True

    def call(self, inputs: Any, initial_state: Any = None, training: Any = None) -> Any:
        shape = self._check(tuple(int(s) for s in inputs.shape))
        state_shape = self._step_output(shape)
        if initial_state is None:
            h = _ops.zeros(state_shape, dtype=inputs.dtype)
            c = _ops.zeros(state_shape, dtype=inputs.dtype)
        else:
            h, c = initial_state
        steps = _ops.unstack(inputs, axis=1)
        if self.go_backwards:
            steps = steps[::-1]
        outputs = []
        for x in steps:
            h, c = self.cell.step(x, h, c)
            if self.return_sequences:
                outputs.append(h)
        out = _ops.stack(outputs, axis=1) if self.return_sequences else h
        return [out, h, c] if self.return_state else out

    def compute_output_shape(self, input_shape: Any) -> Any:
        shape = self._check(input_shape)
        step = self._step_output(shape)
        out = (step[0], shape[1], *step[1:]) if self.return_sequences else step
        return [out, step, step] if self.return_state else out

    def get_config(self) -> dict:
        cell = self.cell
        config = super().get_config()
        for key in self._policy_args:
            config.pop(key, None)
        ser = {k: (None if v is None else (_regularizers.serialize(_regularizers.get(v)) if k.endswith("_regularizer")
                                           else _constraints.serialize(_constraints.get(v)))) for k, v in self._policy_args.items()}
        return {**config, "return_sequences": self.return_sequences, "return_state": self.return_state,
                "go_backwards": self.go_backwards, "stateful": self.stateful, "unroll": self.unroll,
                "zero_output_for_mask": False, "filters": self.filters, "kernel_size": list(self.kernel_size),
                "strides": list(self.strides), "padding": self.padding, "data_format": self.data_format,
                "dilation_rate": list(self.dilation_rate), "activation": _activations.serialize(cell.activation),
                "recurrent_activation": _activations.serialize(cell.recurrent_activation), "use_bias": cell.use_bias,
                "kernel_initializer": _init.serialize(cell.kernel_initializer),
                "recurrent_initializer": _init.serialize(cell.recurrent_initializer),
                "bias_initializer": _init.serialize(cell.bias_initializer), "unit_forget_bias": cell.unit_forget_bias,
                **ser, "dropout": self.dropout, "recurrent_dropout": self.recurrent_dropout, "seed": self.seed}


@register
class ConvLSTM1D(_ConvLSTM):
    """1-d ConvLSTM over ``(batch, time, steps, channels)`` (or ``(batch, time, channels, steps)``)."""

    rank = 1


@register
class ConvLSTM2D(_ConvLSTM):
    """2-d ConvLSTM over ``(batch, time, rows, cols, channels)`` (or channels first)."""

    rank = 2


@register
class ConvLSTM3D(_ConvLSTM):
    """3-d ConvLSTM over ``(batch, time, d1, d2, d3, channels)`` (or channels first)."""

    rank = 3
