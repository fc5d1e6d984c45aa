"""``keras.models.clone_model`` (Keras 3's ``keras/src/models/cloning.py``).

A clone has the structure of the model and new layers, made by ``clone_function`` (default
``layer.__class__.from_config(layer.get_config())``): fresh weights, not copies (``set_weights`` copies
them). A Sequential model is rebuilt from the cloned layers on a new ``Input`` of the same batch shape,
dtype and name; a functional model's graph is replayed node by node on new inputs (or ``input_tensors``),
each cloned layer applied with ``call_function(layer, *args, **kwargs)`` (default ``layer(*args,
**kwargs)``); a layer applied several times is cloned once and shared again. ``recursive=True`` clones
nested Sequential/functional models with ``clone_model`` itself. A subclassed model is
``cls.from_config(model.get_config())``. A compiled model's clone is compiled from its compile config.
"""

from __future__ import annotations

from typing import Any, Callable

from ..layers import Input, InputLayer
from ..layers.graph import KerasTensor, substitute
from .functional import Functional, _flat_values
from .model import Model
from .sequential import Sequential

__all__ = ["clone_model"]


def _default_clone(layer: Any) -> Any:
    return layer.__class__.from_config(layer.get_config())


def _wrap_clone_function(clone_function: "Callable | None", call_function: "Callable | None", recursive: bool,
                         cache: dict) -> Callable:
    """``clone_function`` made safe for sharing (one clone per layer) and for ``recursive``."""
    fn = _default_clone if clone_function is None else clone_function

    def wrapped(layer: Any) -> Any:
        if id(layer) in cache:
            return cache[id(layer)]
        if recursive and isinstance(layer, Sequential):
            clone = clone_model(layer, clone_function=clone_function, recursive=True, cache=cache)
        elif recursive and isinstance(layer, Functional):
            clone = clone_model(layer, clone_function=clone_function, call_function=call_function, recursive=True,
                                cache=cache)
        else:
            clone = fn(layer)
        cache[id(layer)] = clone
        return clone

    return wrapped


def _compile_like(model: Model, clone: Model) -> Model:
    if getattr(model, "compiled", False):
        clone.compile_from_config(model.get_compile_config())
    return clone


def _clone_sequential(model: Sequential, clone_function: Callable, input_tensors: Any) -> Sequential:
    new_layers: list = [clone_function(layer) for layer in model.layers]
    ref = model._input_layer
    if input_tensors is not None:
        if isinstance(input_tensors, (list, tuple)):
            if len(input_tensors) != 1:
                raise ValueError("clone_model: argument `input_tensors` must contain a single tensor for a "
                                 f"Sequential model, got {len(input_tensors)}")
            input_tensors = input_tensors[0]
        if not isinstance(input_tensors, KerasTensor) or not isinstance(input_tensors._keras_history[0], InputLayer):
            raise ValueError("clone_model: argument `input_tensors` must be a KerasTensor made by keras.Input(...), "
                             f"got {type(input_tensors).__name__}")
        new_layers = [input_tensors] + new_layers
    elif ref is not None:
        new_layers = [Input(batch_shape=ref.shape, dtype=ref.input_dtype, name=ref.name)] + new_layers
    return _compile_like(model, Sequential(new_layers, name=model.name, trainable=model.trainable))


def _new_inputs(model: Functional, input_tensors: Any) -> list:
    if input_tensors is None:
        return [Input(batch_shape=t.shape, dtype=t.dtype, name=t._keras_history[0].name) for t in model.inputs]
    given = list(input_tensors.values()) if isinstance(input_tensors, dict) else (
        list(input_tensors) if isinstance(input_tensors, (list, tuple)) else [input_tensors])
    if not all(isinstance(t, KerasTensor) for t in given):
        raise ValueError("clone_model: all entries in `input_tensors` must be KerasTensors, got "
                         f"{[type(t).__name__ for t in given]}")
    if len(given) != len(model.inputs):
        raise ValueError(f"clone_model: `input_tensors` must have the structure of model.input ({len(model.inputs)} "
                         f"tensor(s)), got {len(given)}")
    if isinstance(input_tensors, dict) and model._input_keys is not None:
        missing = [k for k in model._input_keys if k not in input_tensors]
        if missing:
            raise ValueError(f"clone_model: `input_tensors` lacks the model's inputs {missing}")
        given = [input_tensors[k] for k in model._input_keys]
    return given


def _clone_functional(model: Functional, clone_function: Callable, call_function: "Callable | None",
                      input_tensors: Any) -> Functional:
    inputs = _new_inputs(model, input_tensors)
    values: dict[int, Any] = {id(old): new for old, new in zip(model.inputs, inputs)}
    for node in model._nodes:
        layer = clone_function(node.layer)
        args = substitute(node.call_args, lambda kt: values[id(kt)])
        kwargs = substitute(node.call_kwargs, lambda kt: values[id(kt)])
        out = call_function(layer, *args, **kwargs) if call_function is not None else layer(*args, **kwargs)
        flat = _flat_values(out)
        if len(flat) != len(node.output_tensors):
            raise ValueError(f"clone_model: the clone of layer '{node.layer.name}' returned {len(flat)} outputs, "
                             f"the original {len(node.output_tensors)}")
        for old, new in zip(node.output_tensors, flat):
            values[id(old)] = new
    outs = [values[id(t)] for t in model.outputs]
    new_in: Any = dict(zip(model._input_keys, inputs)) if model._input_keys is not None else (
        inputs[0] if len(inputs) == 1 else inputs)
    new_out: Any = dict(zip(model._output_keys, outs)) if model._output_keys is not None else (
        outs[0] if model._single_output else outs)
    return _compile_like(model, Functional(new_in, new_out, name=model.name, trainable=model.trainable))


def clone_model(model: Model, input_tensors: Any = None, clone_function: "Callable | None" = None,
                call_function: "Callable | None" = None, recursive: bool = False, **kwargs: Any) -> Model:
    """A copy of a Sequential or functional ``model`` made of new layers (fresh weights; Keras 3).

    Args:
        model: a ``Sequential``, functional or subclassed model.
        input_tensors: ``keras.Input`` tensors to build the clone on (the structure of ``model.input``);
            default: new inputs of the same shapes, dtypes and names.
        clone_function: ``fn(layer) -> layer`` for every layer but the inputs; default
            ``layer.__class__.from_config(layer.get_config())``. ``lambda layer: layer`` reuses the layers.
        call_function: ``fn(layer, *args, **kwargs)`` applying each cloned layer (functional models only).
        recursive: clone nested Sequential/functional models with ``clone_model`` (else ``clone_function``).

    A subclassed model takes none of ``input_tensors``, ``clone_function``, ``call_function`` (Keras 3) and is
    cloned as ``type(model).from_config(model.get_config())``.
    """
    cache = kwargs.pop("cache", None)
    if kwargs:
        raise ValueError(f"clone_model: unexpected keyword argument(s): {tuple(kwargs)}")
    if not isinstance(model, Model):
        raise TypeError(f"clone_model: expected a keras Model, got {type(model).__name__}")
    for name, fn in (("clone_function", clone_function), ("call_function", call_function)):
        if fn is not None and not callable(fn):
            raise ValueError(f"clone_model: expected `{name}` argument to be a callable, got {fn!r}")
    cache = {} if cache is None else cache
    if isinstance(model, Sequential):
        if call_function is not None:
            raise ValueError("clone_model: `call_function` argument is not supported with Sequential models. In a "
                             "Sequential model, layers aren't called at model-construction time (they're merely "
                             "listed). Use `call_function` with Functional models only.")
        return _clone_sequential(model, _wrap_clone_function(clone_function, None, recursive, cache), input_tensors)
    if isinstance(model, Functional):
        return _clone_functional(model, _wrap_clone_function(clone_function, call_function, recursive, cache),
                                 call_function, input_tensors)
    if clone_function is not None or input_tensors is not None:
        raise ValueError("clone_model: arguments `clone_function` and `input_tensors` are only supported for "
                         f"Sequential models or Functional models, got a model of type '{type(model).__name__}'")
    if call_function is not None:
        raise ValueError("clone_model: argument `call_function` is only supported for Functional models, got a "
                         f"model of type '{type(model).__name__}'")
    return _compile_like(model, type(model).from_config(model.get_config()))
