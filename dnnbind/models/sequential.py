"""``Sequential``: a linear stack of layers (``keras.Sequential``).

Its forward runs the layers in order. Consecutive runs of dnnbind's own layers execute as one
:class:`~dnnbind.models.chain.LayerChain` each: one recorded node per run, with the batch-norm + relu and
convolution + batch-norm fusions in training (see :mod:`dnnbind.models.chain`); any other layer (a user's
layer, a nested model) is called as it is, its ops recorded on the tape. The last layer's softmax may be
skipped and fused with a cross-entropy (``has_final_softmax`` / ``forward_logits``).
"""

from __future__ import annotations

import operator
from typing import Any, Callable, Sequence

import numpy as np

from .. import _validate, kernels
from .. import saving_lib
from ..autodiff.tensor import Tensor
from ..layers.base import Layer, _bump_structure, unique_name
from ..layers.graph import Input, InputLayer, KerasTensor
from .chain import LayerChain, chainable, conv_bn_candidates, fusion_candidates
from .model import Model, deserialize_layer

__all__ = ["Sequential", "fusion_candidates", "conv_bn_candidates"]


class Sequential(Model):
    """A linear stack of layers (``keras.Sequential``).

    ``Sequential([Input((28, 28, 1)), Conv2D(32, 3, activation="relu"), ...])``; then ``compile``,
    ``fit``, ``evaluate``, ``predict``. Input shapes exclude the batch axis and are channels_last
    by default.
    """

    def __init__(self, layers: Sequence[Layer] | None = None, name: str | None = None, trainable: bool = True) -> None:
        self._init_model(name if name is not None else unique_name("sequential"), trainable)
        self._layers: list[Layer] = []
        self._input_layer: InputLayer | None = None
        self._output_shape: tuple[int, ...] | None = None
        for layer in layers or []:
            self.add(layer)

    # ----- structure --------------------------------------------------------------------------
    @property
    def layers(self) -> list[Layer]:
        """The layers (the Input is not one, as in Keras 3)."""
        return list(self._layers)

    def add(self, layer: Layer) -> None:
        """Append a layer (an ``Input`` only as the first element)."""
        if isinstance(layer, KerasTensor):
            origin = layer._keras_history[0]
            if not isinstance(origin, InputLayer):
                raise TypeError(f"Sequential.add expects a dnnbind layer or keras.Input(...), got a symbolic tensor "
                                f"made by layer '{origin.name}'")
            layer = origin
        if isinstance(layer, InputLayer):
            if self._layers or self._input_layer is not None:
                raise ValueError(f"Sequential '{self.name}': an Input can only be the first element of the model")
            self._input_layer = layer
        elif isinstance(layer, Layer):
            if any(existing is layer for existing in self._layers):
                raise ValueError(f"Sequential '{self.name}': layer '{layer.name}' was already added")
            if any(existing.name == layer.name for existing in self._layers):
                # Keras 3 refuses it here too; a duplicate name would also make the saved file unloadable
                raise ValueError(f"All layers added to a Sequential model should have unique names. Name "
                                 f"'{layer.name}' is already the name of a layer in Sequential '{self.name}'. "
                                 f"Update the `name` argument to pass a unique name.")
            self._layers.append(layer)
            _bump_structure()
        else:
            raise TypeError(f"Sequential.add expects a dnnbind layer, got {type(layer).__name__}")
        was_built = self.built
        self.built = False
        if self._sequential_input_shape() is not None:
            try:
                self.build()
            except BaseException:
                # a layer that cannot be built on this model is not added (Keras 3 does the same)
                if isinstance(layer, InputLayer):
                    self._input_layer = None
                else:
                    self._layers.pop()
                    _bump_structure()
                self.built = was_built
                raise

    def pop(self) -> Layer:
        """Remove and return the last layer."""
        if not self._layers:
            raise IndexError(f"Sequential '{self.name}' has no layers to pop")
        layer = self._layers.pop()
        _bump_structure()
        self.built = False
        if self._layers and self._sequential_input_shape() is not None:
            self.build()
        return layer

    @property
    def inputs(self) -> list:
        """Keras 3's ``Sequential.inputs`` once the model knows its input shape: ``[the Input's tensor]``
        (made for the built shape where the model has no ``Input``)."""
        return self._graph("inputs")[0]

    @property
    def outputs(self) -> list:
        """Keras 3's ``Sequential.outputs``: ``[the last layer's symbolic output]`` of the model applied to
        :attr:`inputs` (each layer's ``output`` is then its tensor in that graph)."""
        return self._graph("outputs")[1]

    def _graph(self, what: str) -> "tuple[list, list]":
        """The model as a functional graph (Keras 3 builds one in ``Sequential.build``): the layers applied in
        turn to the Input's tensor, made again only when the layers or the input shape change."""
        if not self.built:
            if not self._layers or self._sequential_input_shape() is None:
                raise AttributeError(f"Sequential model '{self.name}' has no defined {what} yet.")
            self.build()
        key = (tuple(id(layer) for layer in self._layers), tuple(self._built_input_shape))
        cached = self.__dict__.get("_graph_cache")
        if cached is not None and cached[0] == key:
            return cached[1], cached[2]
        if self._input_layer is not None and tuple(self._input_layer.input_shape) == tuple(self._built_input_shape):
            x = self._input_layer.output
        else:
            x = Input(shape=tuple(self._built_input_shape))
        inputs = [x]
        for layer in self._layers:
            x = layer(x)
        outputs = x if isinstance(x, list) else [x]
        self.__dict__["_graph_cache"] = (key, inputs, outputs)
        return inputs, outputs

    def _sequential_input_shape(self) -> tuple[int, ...] | None:
        if self._input_layer is not None:
            return self._input_layer.input_shape
        if self._layers and self._layers[0]._declared_input_shape is not None:
            return self._layers[0]._declared_input_shape
        if self._layers and self._layers[0].built:
            return self._layers[0].input_shape
        return None

    @property
    def input_shape(self) -> tuple:
        shape = self._sequential_input_shape()
        return None if shape is None else (None, *shape)

    @property
    def output_shape(self) -> tuple:
        if not self.built:
            raise ValueError(f"Sequential '{self.name}' is not built yet")
        return (None, *self._output_shape)

    def build(self, input_shape: Sequence[Any] | None = None) -> None:
        """Build every layer for inputs of ``input_shape`` (no batch axis; a leading None is fine)."""
        if input_shape is None:
            input_shape = self._sequential_input_shape()
            if input_shape is None:
                raise ValueError(f"Sequential '{self.name}': the input shape is unknown; start the model with "
                                 "keras.Input(shape=...) or call it on data")
        if isinstance(input_shape, (list, tuple)) and input_shape and input_shape[0] is None:
            input_shape = input_shape[1:]
        input_shape = shape = _validate.shape(input_shape, "input_shape", f"Sequential '{self.name}': build")
        self._drop_graphs()  # (re)building may create new weight arrays
        dev = self.device
        layer_shapes = {}
        for layer in self._layers:
            if layer._device is None:
                layer._device = dev
            elif layer._device != dev:
                layer.to(dev)
            if layer._is_legacy():
                layer._ensure_built(shape)
                shape = tuple(layer.output_shape)
            else:  # a user's layer or a model: built from a symbolic input, its output shape found by running it
                kt = KerasTensor((None, *shape), layer._effective_compute_dtype_name())
                if not layer.built:
                    layer._build_from_call((kt,), {})
                out = layer.compute_output_shape((None, *shape))
                if not isinstance(out, tuple) or any(s is None for s in out[1:]):
                    raise ValueError(f"Sequential '{self.name}': layer '{layer.name}' gives outputs of shape {out}; a "
                                     "Sequential needs one output of known shape per layer")
                shape = tuple(out[1:])
                layer_shapes[id(layer)] = shape
        self._layer_shapes = layer_shapes
        self._built_input_shape = input_shape
        self._output_shape = shape
        self.built = True

    def _layer_output_shape(self, layer):
        return self.__dict__.get("_layer_shapes", {}).get(id(layer))

    def _require_built(self, what: str) -> None:
        if not self.built:
            if self._sequential_input_shape() is not None:
                self.build()
            else:
                raise ValueError(f"Sequential '{self.name}': {what} needs a built model; give it an Input "
                                 "(keras.Input(shape=...)) or call fit/predict on data first")

    def _require_layers(self, what: str) -> None:
        if not self._layers:
            raise ValueError(f"Sequential '{self.name}': {what} needs a model with at least one layer; add "
                             "layers first (Sequential([Input(...), Dense(...)]) or model.add(...))")

    # ----- the trainer's interface ------------------------------------------------------------
    def _input_names(self) -> list[str]:
        return [self._input_layer.name if self._input_layer is not None else "input"]

    @property
    def output_names(self) -> list[str]:
        return [self._layers[-1].name if self._layers else "output"]

    def _input_dtypes(self) -> "list[np.dtype | None]":
        """The ``Input``'s dtype (Keras 3 converts the data to it), None without an ``Input``."""
        layer = self._input_layer
        return [None if layer is None else np.dtype(layer.input_dtype)]

    def _expected_input_shapes(self) -> "list[tuple] | None":
        shape = self._built_input_shape if self.built else self._sequential_input_shape()
        return None if shape is None else [tuple(shape)]

    def _output_shapes(self) -> list[tuple]:
        self._require_built("the output shape")
        return [tuple(self._output_shape)]

    def _build_for(self, shapes: list[tuple], single: bool | None = None) -> None:
        self.build(shapes[0])

    def _input_hint(self) -> str:
        first = self._layers[0] if self._layers else None
        return f" (first layer '{first.name}' ({type(first).__name__}))" if first else ""

    def _guess_input_structure(self, x: Any) -> None:
        pass

    def _fusable_outputs(self) -> list[bool]:
        return [self._layers[-1].has_final_softmax]

    def _direct_layers(self) -> list:
        return list(self._layers)

    def _segments(self) -> list:
        """The layers grouped for the forward: a :class:`LayerChain` per run of chainable layers, the other
        layers alone (kept while the layer list stays the same)."""
        key = tuple(self._layers)
        cached = self.__dict__.get("_segments_cache")
        if cached is not None and len(cached[0]) == len(key) and all(map(operator.is_, cached[0], key)):
            return cached[1]
        segments: list = []
        run: list = []
        for layer in self._layers:
            if chainable(layer):
                run.append(layer)
                continue
            if run:
                segments.append(LayerChain(run))
                run = []
            segments.append(layer)
        if run:
            segments.append(LayerChain(run))
        object.__setattr__(self, "_segments_cache", (key, segments))
        return segments

    def _fused_pairs(self, training: bool) -> "tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]":
        """The fusion plan of a training forward with ``training`` (:meth:`LayerChain._fused_pairs`) when the
        whole model is one chain (its indices are the model's layers'); none otherwise."""
        segments = self._segments()
        if len(segments) == 1 and isinstance(segments[0], LayerChain):
            return segments[0]._fused_pairs(training)
        return (), (), ()

    def _forward(self, x: Any, training: Any, logits: bool) -> Any:
        self._require_layers("call")
        segments = self._segments()
        train = bool(training) if training is not None else False
        for k, seg in enumerate(segments):
            last = k == len(segments) - 1
            if isinstance(seg, LayerChain):
                x = seg.apply(x, train, logits and last)
            else:
                # None stays None (Keras): a layer then takes its own call's default, so an augmentation
                # layer (call(..., training=True)) augments in a model called without training=
                x = seg(x, training=training)
        return x

    def call(self, inputs: Any, training: Any = None, mask: Any = None) -> Any:
        """The layers in order (Keras's ``Sequential.call``)."""
        return self._forward(inputs, training, False)

    def _run_forward(self, xs: list, training: bool, logits: Sequence[bool]) -> list:
        self._require_built("a forward")
        return [self._forward(xs[0], training, bool(logits[0]))]

    def _build_from_call(self, args: tuple, kwargs: dict) -> None:
        first = args[0] if args else next(iter(kwargs.values()))
        self.build(tuple(first.shape[1:]))

    def compute_output_spec(self, inputs: Any, training: Any = None, mask: Any = None) -> Any:
        self._require_built("a symbolic call")
        batch = inputs.shape[0] if hasattr(inputs, "shape") else None
        return ((batch, *self._output_shape), self._layers[-1]._effective_compute_dtype_name())

    # ----- config -----------------------------------------------------------------------------
    def get_config(self) -> dict:
        layers = []
        if self._input_layer is not None:
            layers.append({"class_name": "InputLayer", "config": self._input_layer.get_config()})
        layers += [{"class_name": type(layer).__name__, "config": layer.get_config()} for layer in self._layers]
        config = {"name": self.name, "trainable": self.trainable, "layers": layers}
        if self.built:
            config["build_input_shape"] = list(self._built_input_shape)
        return config

    @classmethod
    def from_config(cls, config: dict, *, max_weight_bytes: int | None = None) -> "Sequential":
        """A model from :meth:`get_config`'s dict, which may come from an untrusted file: the layers'
        constructors check their arguments, and the weights are sized from the config before any is
        created (``AllocationTooLargeError`` past ``max_weight_bytes``, default the physical memory)."""
        if not isinstance(config, dict):
            raise TypeError(f"Sequential.from_config: config must be a dict, got {type(config).__name__}")
        owner = f"Sequential.from_config ('{config.get('name')}')"
        layer_configs = config.get("layers")
        if not isinstance(layer_configs, list):
            raise TypeError(f"{owner}: 'layers' must be a list, got {type(layer_configs).__name__}")
        for i, entry in enumerate(layer_configs):
            if not (isinstance(entry, dict) and isinstance(entry.get("class_name"), str)
                    and isinstance(entry.get("config"), dict)):
                raise TypeError(f"{owner}: layers[{i}] must be {{'class_name': str, 'config': dict}}, "
                                f"got {str(entry)[:120]}")
        build_shape = config.get("build_input_shape")
        if build_shape is not None:
            build_shape = _validate.shape(build_shape[1:] if isinstance(build_shape, list) and build_shape
                                          and build_shape[0] is None else build_shape, "build_input_shape", owner)
        layers = [deserialize_layer(entry) for entry in layer_configs]  # constructors allocate nothing
        model = cls(name=config.get("name"), trainable=config.get("trainable", True))
        input_shape = layers[0].input_shape if layers and isinstance(layers[0], InputLayer) else None
        if input_shape is None and layers:
            input_shape = layers[0]._declared_input_shape
        if input_shape is None:
            input_shape = build_shape
        if input_shape is not None:
            saving_lib.check_weight_budget(layers, input_shape, f"Sequential '{model.name}'", max_weight_bytes)
        for layer in layers:
            model.add(layer)
        if not model.built and build_shape is not None:
            model.build(build_shape)
        return model

    def __repr__(self) -> str:
        return f"<Sequential name={self.name}, layers={len(self._layers)}, built={self.built}>"
