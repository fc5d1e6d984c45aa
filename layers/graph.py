"""Symbolic tensors and the functional graph: ``keras.Input``, :class:`KerasTensor`, :class:`Node`, and the
calls that record nodes instead of computing (layers, models and ``keras.ops`` called on symbolic
tensors).

A layer called on symbolic tensors builds itself for their shapes, records a :class:`Node` (the layer, the
call's arguments with the symbolic tensors in place, its symbolic outputs) and returns the outputs.
Their shapes come from the layer's ``compute_output_shape`` when it has one, else from running its
``call`` on zeros (Keras's NumPy backend does the same: ``compute_output_spec``), twice when a dimension
is unknown, so that the dimensions that follow it are found. A ``keras.ops`` function called on a
symbolic tensor becomes a node of an :class:`OpLayer` (Keras 3's operations in a functional graph).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from dnnbind import _validate, ops
from dnnbind.autodiff import engine as _engine
from dnnbind.autodiff.tensor import Tensor, install_operators
from dnnbind.kernels import numeric as _numeric
from dnnbind.ops import _core as _ops_core

from . import base
from .base import Layer, register, unique_name

__all__ = ["KerasTensor", "Node", "InputLayer", "Input", "OpLayer", "symbolic_call", "output_spec"]


class KerasTensor:
    """A symbolic tensor (Keras's ``KerasTensor``): a shape with the batch axis (``None`` unless
    ``Input(batch_size=...)``), a dtype and the layer application that produced it
    (``_keras_history = (layer, node_index, tensor_index)``). It has no value: layers and ops called on it
    record nodes and return new ones; ``Model(inputs, outputs)`` turns the recorded graph into a model."""

    def __init__(self, shape: Sequence[Any], dtype: Any = "float32", layer: "Layer | None" = None,
                 node_index: int = 0, tensor_index: int = 0, name: str | None = None) -> None:
        self.shape = tuple(None if s is None else int(s) for s in shape)
        self.dtype = _ops_core.standardize_dtype(dtype)
        self._keras_history = (layer, node_index, tensor_index)
        self.name = name if name is not None else (layer.name if layer is not None else "keras_tensor")

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def node(self) -> "Node":
        layer, node_index, _ = self._keras_history
        return layer._inbound_nodes[node_index]

    def __array__(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError(f"KerasTensor '{self.name}' {self.shape} is symbolic and has no value: build "
                        "keras.Model(inputs, outputs) from it and call the model on data")

    def __bool__(self) -> bool:
        raise TypeError(f"KerasTensor '{self.name}' is symbolic: it has no truth value (use keras.ops.cond "
                        "or ops.where in a model)")

    def __len__(self) -> int:
        if not self.shape or self.shape[0] is None:
            raise TypeError(f"KerasTensor '{self.name}' has an unknown first dimension")
        return self.shape[0]

    def __iter__(self):
        raise TypeError(f"KerasTensor '{self.name}' is symbolic: iterate over ops.unstack(x) instead")

    __hash__ = object.__hash__

    def __repr__(self) -> str:
        return f"<KerasTensor shape={self.shape}, dtype={self.dtype}, name={self.name}>"


class Node:
    """One application of a layer to symbolic tensors: ``layer``, the call's ``call_args``/``call_kwargs``
    (symbolic tensors in place), ``input_tensors`` (the symbolic ones, flattened in order), ``outputs`` (the
    call's symbolic result: a tensor or a structure) and ``output_tensors`` (flattened). Appended to
    ``layer._inbound_nodes``."""

    def __init__(self, layer: Layer, call_args: tuple, call_kwargs: dict, outputs_spec: Any) -> None:
        self.layer = layer
        self.call_args = tuple(call_args)
        self.call_kwargs = dict(call_kwargs)
        self.input_tensors = _flat_symbolic((self.call_args, self.call_kwargs))
        self.index = len(layer._inbound_nodes)
        layer._inbound_nodes.append(self)
        counter = [0]

        def make(spec: Any) -> Any:
            if not _is_leaf_spec(spec):
                if isinstance(spec, list):
                    return [make(s) for s in spec]
                if isinstance(spec, tuple):
                    return tuple(make(s) for s in spec)
                if isinstance(spec, dict):
                    return {k: make(v) for k, v in spec.items()}
            shape, dtype = spec
            i = counter[0]
            counter[0] += 1
            base_name = layer.name if self.index == 0 else f"{layer.name}_{self.index}"
            return KerasTensor(shape, dtype, layer=layer, node_index=self.index, tensor_index=i,
                               name=base_name if i == 0 else f"{base_name}_{i}")

        self.outputs = make(outputs_spec)
        self.output_tensors = _flat_symbolic(self.outputs)

    @property
    def parent_nodes(self) -> list["Node"]:
        return [t.node for t in self.input_tensors]


def _is_leaf_spec(spec: Any) -> bool:
    """An output spec is ``(shape, dtype name)``; anything else is a structure of specs."""
    return (isinstance(spec, tuple) and len(spec) == 2 and isinstance(spec[1], str)
            and isinstance(spec[0], (tuple, list)))


def _flat_symbolic(value: Any) -> list:
    if isinstance(value, KerasTensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _flat_symbolic(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _flat_symbolic(v)]
    return []


def substitute(value: Any, fn: Callable[[KerasTensor], Any]) -> Any:
    """``value`` with every symbolic tensor replaced by ``fn(tensor)``."""
    if isinstance(value, KerasTensor):
        return fn(value)
    if isinstance(value, list):
        return [substitute(v, fn) for v in value]
    if isinstance(value, tuple):
        return tuple(substitute(v, fn) for v in value)
    if isinstance(value, dict):
        return {k: substitute(v, fn) for k, v in value.items()}
    return value


# ----------------------------------------------------------------------------------- output shapes
def _zeros_for(kt: KerasTensor, fill: int, device: Any) -> Tensor:
    shape = tuple(fill if s is None else s for s in kt.shape)
    return Tensor(_numeric.full(shape, 0, _ops_core.np_dtype(kt.dtype), device=device))


def _spec_of(value: Any) -> Any:
    if isinstance(value, (list, tuple)) and not hasattr(value, "shape"):
        return [_spec_of(v) for v in value] if isinstance(value, list) else tuple(_spec_of(v) for v in value)
    if isinstance(value, dict):
        return {k: _spec_of(v) for k, v in value.items()}
    if hasattr(value, "shape") and hasattr(value, "dtype"):
        return (tuple(int(s) for s in value.shape), _ops_core.standardize_dtype(value.dtype))
    raise TypeError(f"a layer's call returned {type(value).__name__}, not a tensor or a structure of tensors")


def _merge_specs(a: Any, b: Any) -> Any:
    """The dimensions that differ between the two trial runs are unknown (None)."""
    if not _is_leaf_spec(a):
        if isinstance(a, list):
            return [_merge_specs(x, y) for x, y in zip(a, b)]
        if isinstance(a, dict):
            return {k: _merge_specs(a[k], b[k]) for k in a}
        return tuple(_merge_specs(x, y) for x, y in zip(a, b))
    (sa, da), (sb, _) = a, b
    return (tuple(x if x == y else None for x, y in zip(sa, sb)), da)


def output_spec(layer: Layer, args: tuple, kwargs: dict, training: Any = None) -> Any:
    """The output spec (``(shape, dtype)`` per output, in the call's structure) of calling ``layer`` on the
    symbolic tensors in ``args``/``kwargs``: ``call`` run on zeros, nothing recorded, no loss kept."""
    unknown = any(s is None for t in _flat_symbolic((args, kwargs)) for s in t.shape)
    specs = []
    for fill in ((2, 3) if unknown else (2,)):
        a = substitute(args, lambda kt, f=fill: _zeros_for(kt, f, layer.device))
        k = substitute(kwargs, lambda kt, f=fill: _zeros_for(kt, f, layer.device))
        saved_losses = list(layer.__dict__.get("_own_losses", []))
        with _engine.stop_recording(), np.errstate(all="ignore"), base.symbolic_trace():
            out = layer._keras_call(a, dict(k), training)
        layer.__dict__["_own_losses"] = saved_losses
        specs.append(_spec_of(out))
    return specs[0] if len(specs) == 1 else _merge_specs(specs[0], specs[1])


def spec_from_shape(shape: Any) -> Any:
    """A symbolic tensor standing for ``shape`` (for :meth:`Layer.compute_output_shape` of a user's layer)."""
    if isinstance(shape, list) and shape and isinstance(shape[0], (list, tuple)):
        return [spec_from_shape(s) for s in shape]
    return KerasTensor(tuple(shape), "float32")


def shape_structure(spec: Any) -> Any:
    if _is_leaf_spec(spec):
        return tuple(spec[0])
    if isinstance(spec, list):
        return [shape_structure(s) for s in spec]
    if isinstance(spec, dict):
        return {k: shape_structure(v) for k, v in spec.items()}
    return tuple(shape_structure(s) for s in spec)


# ---------------------------------------------------------------------------------- symbolic calls
def symbolic_call(layer: Layer, args: tuple, kwargs: dict) -> Any:
    """Record ``layer(*args, **kwargs)`` on symbolic tensors; returns the symbolic outputs."""
    kwargs = dict(kwargs)
    training = kwargs.pop("training", None)
    for t in _flat_symbolic((args, kwargs)):
        if t.ndim < 1 and layer._is_legacy():
            raise ValueError(f"layer '{layer.name}' expects a batch of inputs, got a symbolic scalar")
    if layer._is_legacy():
        inputs = args[0]
        if layer.multi_input:
            if not isinstance(inputs, (list, tuple)) or not inputs:
                raise _validate.ArgumentTypeError(f"{type(layer).__name__} '{layer.name}' takes a list of inputs, "
                                                  f"got {type(inputs).__name__}")
            # a static batch size (Input(batch_shape=...)) is still the batch axis: dnnbind's layers take None
            shapes = [(None, *tuple(t.shape)[1:]) for t in inputs]
        else:
            if isinstance(inputs, (list, tuple)):
                if len(inputs) != 1:
                    raise _validate.ArgumentTypeError(f"{type(layer).__name__} '{layer.name}' takes one input, got a "
                                                      f"list of {len(inputs)}")
                inputs = inputs[0]
                args = (inputs,) + tuple(args[1:])
            shapes = (None, *tuple(inputs.shape)[1:])
        kwargs.pop("mask", None)
        layer._ensure_built(shapes)
        out_shape = layer.compute_output_shape(shapes)
        batch = (inputs[0] if layer.multi_input else inputs).shape[0]
        spec = ((batch, *tuple(out_shape)[1:]), layer._effective_compute_dtype_name())
        node = Node(layer, args, kwargs, spec)
        return node.outputs
    if not layer.built:
        layer._build_from_call(args, kwargs)
    spec = layer.compute_output_spec(*args, **kwargs) if hasattr(layer, "compute_output_spec") else None
    if spec is None:
        if type(layer).compute_output_shape is not Layer.compute_output_shape:
            first = args[0]
            shapes = substitute(first, lambda kt: kt.shape)
            out_shapes = layer.compute_output_shape(shapes)
            dtype = layer._effective_compute_dtype_name()
            spec = _shapes_to_spec(out_shapes, dtype)
        else:
            spec = output_spec(layer, args, kwargs, training)
    if training is not None:
        kwargs["training"] = training
    node = Node(layer, args, kwargs, spec)
    return node.outputs


def _shapes_to_spec(shapes: Any, dtype: str) -> Any:
    if isinstance(shapes, list) and shapes and isinstance(shapes[0], (list, tuple)):
        return [_shapes_to_spec(s, dtype) for s in shapes]
    if isinstance(shapes, tuple) and shapes and isinstance(shapes[0], (tuple, list)):
        return tuple(_shapes_to_spec(s, dtype) for s in shapes)
    if isinstance(shapes, dict):
        return {k: _shapes_to_spec(v, dtype) for k, v in shapes.items()}
    return (tuple(shapes), dtype)


def _effective_compute_dtype_name(self: Layer) -> str:
    return _ops_core.standardize_dtype(_validate.normalize_dtype(self.compute_dtype))


Layer._effective_compute_dtype_name = _effective_compute_dtype_name  # type: ignore[attr-defined]


# -------------------------------------------------------------------------------------- Input
@register
class InputLayer(Layer):
    """Declares the input shape of a model (Keras ``keras.Input``); computes nothing."""

    def __init__(self, shape: Sequence[int] | None = None, batch_size: int | None = None, dtype: Any = None,
                 name: str | None = None, sparse: Any = None, batch_shape: Any = None, input_tensor: Any = None,
                 optional: bool = False, **kwargs: Any) -> None:
        if shape is None:
            shape = kwargs.pop("input_shape", None)
        if batch_shape is not None and shape is None:
            batch_size, shape = batch_shape[0], tuple(batch_shape[1:])
        kwargs.pop("ragged", None)
        if sparse:
            raise ValueError("Input: dnnbind has no sparse tensors (sparse=True)")
        if shape is None:
            raise ValueError("Input: `shape` is required, e.g. Input(shape=(28, 28, 1))")
        if isinstance(shape, (list, tuple)) and any(s is None for s in shape):
            dims = tuple(s for s in shape if s is not None)
            if dims:
                _validate.shape(dims, "shape", "Input")
            shape = tuple(shape)
        else:
            shape = _validate.shape(shape, "shape", "Input")
        batch_size = _validate.optional_positive_int(batch_size, "batch_size", "Input")
        super().__init__(name=name if name is not None else unique_name("input_layer"), dtype=None, **kwargs)
        self.batch_size = batch_size
        self.input_dtype = "float32" if dtype is None else _ops_core.standardize_dtype(dtype)
        self.input_shape = tuple(shape)
        self.output_shape = tuple(shape)
        self.built = True
        Node(self, (), {}, ((batch_size, *shape), self.input_dtype))  # its tensor is self.output (Layer.output)

    @property
    def shape(self) -> tuple:
        """Keras reports the batch axis too: ``(None, 28, 28, 1)``."""
        return (self.batch_size, *self.input_shape)

    def forward(self, x, training=False):
        return x

    def backward(self, dy, need_dx=True):
        return dy

    def get_config(self) -> dict:
        return {"shape": list(self.input_shape), "batch_size": self.batch_size, "dtype": self.input_dtype,
                "name": self.name}


def Input(shape: Sequence[int] | None = None, batch_size: int | None = None, dtype: Any = None,
          sparse: Any = None, batch_shape: Any = None, name: str | None = None, tensor: Any = None,
          optional: bool = False) -> KerasTensor:
    """``keras.Input``: a symbolic tensor of ``shape`` (no batch axis; channels_last images are
    ``(H, W, C)``), the start of a functional model (``Model(inputs, outputs)``) or the first element
    of a ``Sequential``. Its ``shape`` has the batch axis: ``(None, *shape)``."""
    if tensor is not None:
        raise ValueError("Input: tensor= is not supported (dnnbind builds models from symbolic inputs only)")
    return InputLayer(shape=shape, batch_size=batch_size, dtype=dtype, name=name, sparse=sparse,
                      batch_shape=batch_shape, optional=optional).output


# ------------------------------------------------------------------------------ ops on symbolic tensors
@register
class OpLayer(Layer):
    """A ``keras.ops`` function applied in a functional graph (``x = keras.ops.reshape(inputs, ...)``):
    its call re-applies the op with the call's other arguments. ``op`` is the op's registered name."""

    def __init__(self, op: str, arguments: Any = None, **kwargs: Any) -> None:
        if op not in _ops_core.REGISTRY:
            raise ValueError(f"OpLayer: unknown op {op!r}")
        kwargs.setdefault("name", unique_name(op))
        super().__init__(**kwargs)
        self.op = op
        self._template = arguments  # (args, kwargs) with placeholders for the tensors
        self.built = True

    def call(self, *tensors: Any) -> Any:
        args, kwargs = self._template
        it = iter(tensors)
        filled = _fill_placeholders((args, kwargs), it)
        fn = _ops_core.REGISTRY[self.op]["fn"]
        return fn(*filled[0], **filled[1])

    def get_config(self) -> dict:
        return {**super().get_config(), "op": self.op, "arguments": _encode_arguments(self._template)}

    @classmethod
    def from_config(cls, config: dict) -> "OpLayer":
        config = dict(config)
        config["arguments"] = _decode_arguments(config.get("arguments"))
        return cls(**config)


_PLACEHOLDER = "__tensor__"


def _fill_placeholders(value: Any, it) -> Any:
    if isinstance(value, str) and value == _PLACEHOLDER:
        return next(it)
    if isinstance(value, list):
        return [_fill_placeholders(v, it) for v in value]
    if isinstance(value, tuple):
        return tuple(_fill_placeholders(v, it) for v in value)
    if isinstance(value, dict):
        return {k: _fill_placeholders(v, it) for k, v in value.items()}
    return value


def _encode_arguments(value: Any) -> Any:
    """The non-tensor arguments of an op as JSON (tuples tagged, so they round-trip)."""
    if isinstance(value, tuple):
        return {"__tuple__": [_encode_arguments(v) for v in value]}
    if isinstance(value, list):
        return [_encode_arguments(v) for v in value]
    if isinstance(value, dict):
        return {"__dict__": {k: _encode_arguments(v) for k, v in value.items()}}
    if isinstance(value, (np.integer, np.floating, np.bool_)):
        return value.item()
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, slice):
        return {"__slice__": [_encode_arguments(value.start), _encode_arguments(value.stop),
                              _encode_arguments(value.step)]}
    if value is Ellipsis:
        return {"__ellipsis__": True}
    if isinstance(value, np.ndarray):
        return {"__array__": value.tolist(), "dtype": str(value.dtype)}
    raise TypeError(f"an op argument of type {type(value).__name__} cannot be saved in a model config")


def _decode_arguments(value: Any) -> Any:
    if isinstance(value, dict):
        if "__tuple__" in value:
            return tuple(_decode_arguments(v) for v in value["__tuple__"])
        if "__dict__" in value:
            return {k: _decode_arguments(v) for k, v in value["__dict__"].items()}
        if "__array__" in value:
            return np.asarray(value["__array__"], dtype=value.get("dtype"))
        if "__slice__" in value:
            return slice(*value["__slice__"])
        if "__ellipsis__" in value:
            return Ellipsis
    if isinstance(value, list):
        return [_decode_arguments(v) for v in value]
    return value


def _symbolic_op(op: Callable, args: tuple, kwargs: dict) -> Any:
    """``keras.ops`` called on symbolic tensors: a node of a new :class:`OpLayer`."""
    tensors = _flat_symbolic((args, kwargs))
    template = substitute((tuple(args), dict(kwargs)), lambda kt: _PLACEHOLDER)
    layer = OpLayer(op.__keras_op__, template)
    return layer(*tensors)


_ops_core.set_symbolic_handler(_symbolic_op)
install_operators(KerasTensor, ops._OperatorTable(), identity_equality=True)
base._graph_hooks.symbolic_call = symbolic_call
base._graph_hooks.output_spec = output_spec
base._graph_hooks.spec_from_shape = spec_from_shape
base._graph_hooks.shape_structure = shape_structure
