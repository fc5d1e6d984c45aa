"""``keras.layers.EinsumDense``: a dense layer whose product is an einsum equation (``"abc,cde->abde"``), built
on :func:`dnnbind.ops.einsum` (trains on both backends with no hand-written backward). The kernel and bias
shapes come from the equation as Keras 3 derives them (``_analyze_einsum_string``, ported below), so
Keras's ``.weights.h5`` files load unchanged."""

from __future__ import annotations

import math
import re
from typing import Any, Sequence

from dnnbind import _validate
from dnnbind import activations as _activations
from dnnbind import initializers as _init
from dnnbind import ops as _ops

from .base import Layer, register
from .graph import output_spec as _output_spec

__all__ = ["EinsumDense"]


# Keras 3's three equation forms: no ellipsis, one on the left, one on the right ("..." written as "0")
_FORMS = ("([a-zA-Z]+),([a-zA-Z]+)->([a-zA-Z]+)", "0([a-zA-Z]+),([a-zA-Z]+)->0([a-zA-Z]+)",
          "([a-zA-Z]{2,})0,([a-zA-Z]+)->([a-zA-Z]+)0")


class _FansFromAxes(_init.Initializer):
    """A VarianceScaling initializer whose fans are the products of the kernel's input and output axes
    (Keras 3 gives EinsumDense's kernel initializer ``input_axes``/``output_axes``). Every kernel axis is an
    input or an output axis, so the kernel holds ``fan_in * fan_out`` values: a ``(fan_in, fan_out)`` draw,
    reshaped, has the distribution Keras's has."""

    def __init__(self, base: _init.Initializer, fan_in: int, fan_out: int) -> None:
        self.base, self.fan_in, self.fan_out = base, int(fan_in), int(fan_out)

    def __call__(self, shape: Sequence[int], dtype: Any = "float32") -> Any:
        return self.base((self.fan_in, self.fan_out), dtype=dtype).reshape(tuple(shape))

    def compute_output_spec(self, inputs: Any, **kwargs: Any) -> Any:
        """The symbolic output: the shape of a run (an axis that :meth:`compute_output_shape` leaves None, as
        Keras 3 does for an ``output_shape`` entry of None, is known here when the input knows it; dnnbind's
        own layers downstream need it)."""
        return _output_spec(self, (inputs,), kwargs)

    def get_config(self) -> dict:
        return self.base.get_config()


def analyze_einsum_string(equation: str, bias_axes: "str | None", input_shape: Sequence[Any],
                          output_shape: Sequence[Any], owner: str = "EinsumDense") -> tuple:
    """``(kernel_shape, bias_shape or None, full_output_shape, kernel input axes, kernel output axes)`` for
    ``equation`` on ``input_shape`` (with the batch axis), as Keras 3's ``_analyze_einsum_string``."""
    if not isinstance(equation, str):
        raise _validate.ArgumentTypeError(f"{owner}: equation must be a str, got {equation!r}")
    dot_replaced = re.sub(r"\.\.\.", "0", equation)
    for pattern, left in zip(_FORMS, (False, True, False)):
        split = re.fullmatch(pattern, dot_replaced)
        if split:
            return _analyze_split_string(split, bias_axes, tuple(input_shape), output_shape, left, owner)
    raise ValueError(f"{owner}: Invalid einsum equation '{equation}'. Equations must be in the form "
                     "[X],[Y]->[Z], ...[X],[Y]->...[Z], or [X]...,[Y]->[Z]....")


def _analyze_split_string(split: Any, bias_axes: "str | None", input_shape: tuple, output_shape: Any,
                          left_elided: bool, owner: str) -> tuple:
    input_spec, weight_spec, output_spec = split.group(1), split.group(2), split.group(3)
    elided = len(input_shape) - len(input_spec)
    if elided < 0 or (elided > 0 and "0" not in re.sub(r"\.\.\.", "0", split.string)):
        raise ValueError(f"{owner}: the equation's input '{input_spec}' has {len(input_spec)} axes, the inputs "
                         f"have shape {input_shape} (rank {len(input_shape)})")
    output_shape = [output_shape] if isinstance(output_shape, int) else list(output_shape)
    output_shape.insert(0, input_shape[0])
    if elided > 0 and left_elided:
        for i in range(1, elided):
            output_shape.insert(1, input_shape[i])
    elif elided > 0:
        for i in range(len(input_shape) - elided, len(input_shape)):
            output_shape.append(input_shape[i])
    if len(output_shape) != len(output_spec) + (elided if elided > 0 else 0):
        raise ValueError(f"{owner}: output_shape {tuple(output_shape[1:])} does not fit the equation's output "
                         f"'{output_spec}' for inputs of shape {input_shape} (the full output shape would be "
                         f"{tuple(output_shape)})")
    if left_elided:
        input_dim_map = {dim: (i + elided) - len(input_shape) for i, dim in enumerate(input_spec)}
        output_dim_map = {dim: i + elided for i, dim in enumerate(output_spec)}
    else:
        input_dim_map = {dim: i for i, dim in enumerate(input_spec)}
        output_dim_map = {dim: i for i, dim in enumerate(output_spec)}
    for dim in input_spec:
        in_size = input_shape[input_dim_map[dim]]
        if dim in output_dim_map:
            out_size = output_shape[output_dim_map[dim]]
            if out_size is not None and out_size != in_size:
                raise ValueError(f"{owner}: Input shape and output shape do not match at shared dimension '{dim}'. "
                                 f"Input shape is {in_size}, and output shape is {out_size}.")
    for dim in output_spec:
        if dim not in input_spec and dim not in weight_spec:
            raise ValueError(f"{owner}: Dimension '{dim}' was specified in the output '{output_spec}' but has no "
                             f"corresponding dim in the input spec '{input_spec}' or weight spec '{weight_spec}'")
    weight_shape, input_axes, output_axes = [], [], []
    for i, dim in enumerate(weight_spec):
        if dim in output_dim_map:
            weight_shape.append(output_shape[output_dim_map[dim]])
            output_axes.append(i)
        elif dim in input_dim_map:
            weight_shape.append(input_shape[input_dim_map[dim]])
            input_axes.append(i)
        else:
            raise ValueError(f"{owner}: Weight dimension '{dim}' did not have a match in either the input spec "
                             f"'{input_spec}' or the output spec '{output_spec}'. For this layer, the weight must "
                             "be fully specified.")
    if any(s is None for s in weight_shape):
        raise ValueError(f"{owner}: the kernel shape {tuple(weight_shape)} has an unknown axis: give output_shape "
                         "for every output axis that the kernel carries")
    bias_shape = None
    if bias_axes is not None:
        if not isinstance(bias_axes, str):
            raise _validate.ArgumentTypeError(f"{owner}: bias_axes must be a str or None, got {bias_axes!r}")
        num_left_elided = elided if left_elided else 0
        idx_map = {char: output_shape[i + num_left_elided] for i, char in enumerate(output_spec)}
        for char in bias_axes:
            if char not in output_spec:
                raise ValueError(f"{owner}: Bias dimension '{char}' was requested, but is not part of the output "
                                 f"spec '{output_spec}'")
        first = min(output_spec.find(char) for char in bias_axes) if bias_axes else len(output_spec)
        bias_shape = [idx_map[char] if char in bias_axes else 1 for char in output_spec[first:]]
        if not left_elided:
            bias_shape.extend([1] * max(elided, 0))
    return weight_shape, bias_shape, output_shape, input_axes, output_axes


@register
class EinsumDense(Layer):
    """``EinsumDense(equation, output_shape, activation=None, bias_axes=None, kernel_initializer="glorot_uniform",
    bias_initializer="zeros", kernel_regularizer=None, bias_regularizer=None, kernel_constraint=None,
    bias_constraint=None, lora_rank=None, lora_alpha=None)``.

    ``y = activation(einsum(equation, x, kernel) + bias)``. ``output_shape``: the output's shape without the
    batch axis (an int for one axis; ``None`` entries are taken from the input). The kernel's shape is each
    kernel letter's size (from the output where the letter is there, else from the input); the bias spans the
    output from its first ``bias_axes`` letter on, size 1 on the others (Keras 3). A VarianceScaling kernel
    initializer counts its fans over the kernel's input and output axes, as Keras 3. ``lora_rank`` and
    quantization are not supported.
    """

    def __init__(self, equation: str, output_shape: Any, activation: Any = None, bias_axes: "str | None" = None,
                 kernel_initializer: Any = "glorot_uniform", bias_initializer: Any = "zeros",
                 kernel_regularizer: Any = None, bias_regularizer: Any = None, kernel_constraint: Any = None,
                 bias_constraint: Any = None, lora_rank: "int | None" = None, lora_alpha: "float | None" = None,
                 **kwargs: Any) -> None:
        kwargs.pop("gptq_unpacked_column_size", None)
        if kwargs.pop("quantization_config", None) is not None:
            raise NotImplementedError("EinsumDense: quantization_config is not supported")
        super().__init__(kernel_regularizer=kernel_regularizer, bias_regularizer=bias_regularizer,
                         kernel_constraint=kernel_constraint, bias_constraint=bias_constraint, **kwargs)
        owner = f"EinsumDense '{self.name}'"
        if not isinstance(equation, str):
            raise _validate.ArgumentTypeError(f"{owner}: equation must be a str, got {equation!r}")
        if not any(re.fullmatch(p, re.sub(r"\.\.\.", "0", equation)) for p in _FORMS):
            raise ValueError(f"{owner}: Invalid einsum equation '{equation}'. Equations must be in the form "
                             "[X],[Y]->[Z], ...[X],[Y]->...[Z], or [X]...,[Y]->[Z]....")
        if isinstance(output_shape, int) and not isinstance(output_shape, bool):
            partial = (output_shape,)
        elif isinstance(output_shape, (list, tuple)):
            partial = tuple(output_shape)
        else:
            raise _validate.ArgumentTypeError(f"{owner}: output_shape must be an int or a list/tuple of ints (None "
                                              f"for an axis taken from the input), got {output_shape!r}")
        for s in partial:
            if s is not None and (not isinstance(s, int) or isinstance(s, bool) or s <= 0):
                raise ValueError(f"{owner}: output_shape entries must be positive ints or None, got {output_shape!r}")
        if bias_axes is not None and not isinstance(bias_axes, str):
            raise _validate.ArgumentTypeError(f"{owner}: bias_axes must be a str or None, got {bias_axes!r}")
        if lora_rank is not None:
            raise NotImplementedError(f"{owner}: lora_rank (LoRA fine-tuning) is not supported")
        self.equation = equation
        self.partial_output_shape = partial
        self.bias_axes = bias_axes
        self.activation = _activations.get(activation)
        self.kernel_initializer = _init.get(kernel_initializer)
        self.bias_initializer = _init.get(bias_initializer)
        self.lora_rank = None
        self.lora_alpha = lora_alpha
        self.kernel = None
        self.bias = None
        self._full_output_shape: "tuple | None" = None

    def build(self, input_shape: Sequence[Any]) -> None:
        owner = f"EinsumDense '{self.name}'"
        input_shape = tuple(input_shape)
        kernel_shape, bias_shape, full, input_axes, output_axes = analyze_einsum_string(
            self.equation, self.bias_axes, input_shape, self.partial_output_shape, owner)
        init = self.kernel_initializer
        if isinstance(init, _init.VarianceScaling):
            fan_in = math.prod(kernel_shape[a] for a in input_axes)
            fan_out = math.prod(kernel_shape[a] for a in output_axes)
            init = _FansFromAxes(init, fan_in, fan_out)
        self.kernel = self.add_weight(shape=tuple(kernel_shape), initializer=init, name="kernel", trainable=True)
        if bias_shape is not None:
            self.bias = self.add_weight(shape=tuple(bias_shape), initializer=self.bias_initializer, name="bias",
                                        trainable=True)
        self._full_output_shape = tuple(full)
        self.built = True

    def call(self, inputs: Any, training: Any = None) -> Any:
        x = _ops.einsum(self.equation, inputs, self.kernel)
        if self.bias is not None:
            x = _ops.add(x, self.bias)
        if self.activation is not _activations.linear:
            x = self.activation(x)
        return x

    def compute_output_shape(self, input_shape: Sequence[Any]) -> tuple:
        _, _, full, _, _ = analyze_einsum_string(self.equation, self.bias_axes, tuple(input_shape),
                                                 self.partial_output_shape, f"EinsumDense '{self.name}'")
        return tuple(full)

    def compute_output_spec(self, inputs: Any, **kwargs: Any) -> Any:
        """The symbolic output: the shape of a run (an axis that :meth:`compute_output_shape` leaves None, as
        Keras 3 does for an ``output_shape`` entry of None, is known here when the input knows it; dnnbind's
        own layers downstream need it)."""
        return _output_spec(self, (inputs,), kwargs)

    def get_config(self) -> dict:
        config = super().get_config()
        for key in ("kernel_regularizer", "bias_regularizer", "kernel_constraint", "bias_constraint"):
            config.setdefault(key, None)
        config.update(output_shape=list(self.partial_output_shape), equation=self.equation,
                      activation=_activations.serialize(self.activation), bias_axes=self.bias_axes,
                      kernel_initializer=_init.serialize(self.kernel_initializer),
                      bias_initializer=_init.serialize(self.bias_initializer))
        if self.lora_alpha is not None:
            config["lora_alpha"] = self.lora_alpha
        return config
