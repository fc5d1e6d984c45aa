"""``Sequential``: a linear stack of layers (``keras.Sequential``).

The special case of a model whose graph is a chain: the forward runs the layers in order and the
backward in reverse (no tape needed: every layer is applied once, to the previous one's output),
the first layer with ``need_dx=False``. The last layer's softmax is skipped and fused with a
cross-entropy (``has_final_softmax`` / ``forward_logits``).

Layer fusion (``kernels.config.fuse_layers``): in a training forward, a ``BatchNormalization``
immediately followed by a plain relu (``Activation("relu")``, or ``ReLU()`` with its defaults) that
is not the last layer runs as one batch-norm op with ``activation="relu"``
(``BatchNormalization._forward_fused``); the relu layer's forward is skipped and its backward passes
``dy`` through (the batch norm's backward takes it w.r.t. the activated output). The candidate
pairs come from the layer list (:func:`fusion_candidates`, recomputed when it changes); each
training forward keeps those whose batch norm runs its plain training op now (trainable, no
replica) in the same compute dtype as the relu. Inference forwards never fuse.

A ``Conv2D`` (exact class: float kernel, no bias, linear activation, channels_last) immediately
followed by such a ``BatchNormalization`` (NHWC) in the same compute dtype runs, in a training
forward, as one ``kernels.conv2d_batchnorm_forward_training`` (``Conv2D._forward_into_batchnorm``), with
the relu after it when that pair fuses too: on CUDA the batch-norm statistics may come from the
convolution's epilogue (a cuDNN graph with genstats, chosen per shape; see ``kernels/_cuda/conv_bn.py``).
The two layers' backwards are their own. Candidates: :func:`conv_bn_candidates`.

Such a plain ``Conv2D`` right after a channels-last (NHWC) batch norm fused with its relu (the relu's
output is the convolution's input) runs its backward through the relu and the batch norm in one op
(``Conv2D._backward_into_batchnorm``: the filter gradient, then ``kernels.batchnorm_relu_conv2d_backward``),
when the two layers share their compute dtype: on CUDA the data gradient, the relu's mask and the
batch norm's weight gradients may be one cuDNN graph (cuDNN's DgradDreluBNBwdWeight pattern).
"""

from __future__ import annotations

import operator
from typing import Any, Callable, Sequence

from .. import _validate, kernels
from .. import saving_lib
from ..layers.base import InputLayer, KerasTensor, Layer, deserialize, unique_name
from ..layers.conv import Conv2D
from ..layers.core import Activation, ReLU
from ..layers.normalization import BatchNormalization
from ..layers.tape import Tape
from .model import Model

__all__ = ["Sequential", "fusion_candidates", "conv_bn_candidates"]


def _is_plain_relu(layer: Layer) -> bool:
    """``Activation("relu")`` or ``ReLU()`` with its defaults (exact classes: a subclass may change forward)."""
    if type(layer) is Activation:
        return layer._fn().name == "relu"
    return (type(layer) is ReLU and layer.max_value is None and layer.negative_slope == 0.0
            and layer.threshold == 0.0)


def fusion_candidates(layers: Sequence[Layer]) -> "tuple[int, ...]":
    """Indices ``i`` of the batch norms that ``layers[i + 1]``'s relu may fuse into: a
    ``BatchNormalization`` (whose ``forward`` and ``backward`` are BatchNormalization's own) followed by a plain relu
    that is not the last layer (the last one's output is the model's, left to the loss's handling)."""
    return tuple(i for i in range(len(layers) - 2)
                 if isinstance(layers[i], BatchNormalization)
                 and type(layers[i]).forward is BatchNormalization.forward
                 and type(layers[i]).backward is BatchNormalization.backward and _is_plain_relu(layers[i + 1]))


def _plain_conv(layer: Layer) -> bool:
    """A ``Conv2D`` (exact class) whose output is ``conv(x, w)`` alone: float kernel, no bias, linear, NHWC."""
    return (type(layer) is Conv2D and layer.bias is None and layer.activation.kind is None
            and layer.quantization_mode is None and layer.data_format == "channels_last")


def conv_bn_candidates(layers: Sequence[Layer]) -> "tuple[int, ...]":
    """Indices ``i`` of the convolutions that may run with the batch norm ``layers[i + 1]`` as one op: a plain
    ``Conv2D`` (:func:`_plain_conv`) followed by a batch norm that could fuse a relu (see
    :func:`fusion_candidates`: BatchNormalization's own forward and backward) over NHWC data, not the last layer."""
    return tuple(i for i in range(len(layers) - 2)
                 if _plain_conv(layers[i]) and isinstance(layers[i + 1], BatchNormalization)
                 and type(layers[i + 1]).forward is BatchNormalization.forward
                 and type(layers[i + 1]).backward is BatchNormalization.backward
                 and getattr(layers[i + 1], "layout", None) == "NHWC")


class Sequential(Model):
    """A linear stack of layers (``keras.Sequential``).

    ``Sequential([Input((28, 28, 1)), Conv2D(32, 3, activation="relu"), ...])``; then ``compile``,
    ``fit``, ``evaluate``, ``predict``. Input shapes exclude the batch axis and are channels_last
    by default.
    """

    def __init__(self, layers: Sequence[Layer] | None = None, name: str | None = None, trainable: bool = True) -> None:
        self._init_model(name if name is not None else unique_name("sequential"), trainable)
        self._layers: list[Layer] = []
        # (the layer list, its batch-norm + relu candidates, its conv + batch-norm candidates)
        self._fusion_cache: "tuple[tuple[Layer, ...], tuple[int, ...], tuple[int, ...]]" = ((), (), ())
        self._back_now: "tuple[int, ...]" = ()  # the convolutions whose backward the last forward fused
        self._fused_now: "tuple[int, ...]" = ()  # the batch norms the last training forward fused
        self._input_layer: InputLayer | None = None
        self._output_shape: tuple[int, ...] | None = None
        for layer in layers or []:
            self.add(layer)

    # ----- structure --------------------------------------------------------------------------
    @property
    def layers(self) -> list[Layer]:
        """The layers (the Input is not one, as in Keras 3)."""
        return list(self._layers)

    def _flat_layers(self) -> list[Layer]:
        return self._layers

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
            self._layers.append(layer)
        else:
            raise TypeError(f"Sequential.add expects a dnnbind layer, got {type(layer).__name__}")
        was_built = self.built
        self.built = False
        if self._declared_input_shape() is not None:
            try:
                self.build()
            except BaseException:
                # a layer that cannot be built on this model is not added (Keras 3 does the same)
                if isinstance(layer, InputLayer):
                    self._input_layer = None
                else:
                    self._layers.pop()
                self.built = was_built
                raise

    def pop(self) -> Layer:
        """Remove and return the last layer."""
        if not self._layers:
            raise IndexError(f"Sequential '{self.name}' has no layers to pop")
        layer = self._layers.pop()
        self.built = False
        if self._layers and self._declared_input_shape() is not None:
            self.build()
        return layer

    def _declared_input_shape(self) -> tuple[int, ...] | None:
        if self._input_layer is not None:
            return self._input_layer.input_shape
        if self._layers and self._layers[0]._declared_input_shape is not None:
            return self._layers[0]._declared_input_shape
        if self._layers and self._layers[0].built:
            return self._layers[0].input_shape
        return None

    @property
    def input_shape(self) -> tuple:
        shape = self._declared_input_shape()
        return None if shape is None else (None, *shape)

    @property
    def output_shape(self) -> tuple:
        if not self.built:
            raise ValueError(f"Sequential '{self.name}' is not built yet")
        return (None, *self._output_shape)

    def build(self, input_shape: Sequence[Any] | None = None) -> None:
        """Build every layer for inputs of ``input_shape`` (no batch axis; a leading None is fine)."""
        if input_shape is None:
            input_shape = self._declared_input_shape()
            if input_shape is None:
                raise ValueError(f"Sequential '{self.name}': the input shape is unknown; start the model with "
                                 "keras.Input(shape=...) or call it on data")
        if isinstance(input_shape, (list, tuple)) and input_shape and input_shape[0] is None:
            input_shape = input_shape[1:]
        input_shape = shape = _validate.shape(input_shape, "input_shape", f"Sequential '{self.name}': build")
        self._drop_graphs()  # (re)building may create new weight arrays
        dev = self.device
        for layer in self._layers:
            if layer._device is None:
                layer._device = dev
            elif layer._device != dev:
                layer.to(dev)
            layer._ensure_built(shape)
            shape = tuple(layer.output_shape)
        self._built_input_shape = input_shape
        self._output_shape = shape
        self.built = True

    def _require_built(self, what: str) -> None:
        if not self.built:
            if self._declared_input_shape() is not None:
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

    def _expected_input_shapes(self) -> "list[tuple] | None":
        shape = self._built_input_shape if self.built else self._declared_input_shape()
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

    def _fused_pairs(self, training: bool) -> "tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]":
        """(the batch norms (indices) a forward with ``training`` runs fused with the next layer's relu,
        the convolutions it runs as one op with the batch norm after them, the convolutions whose backward
        runs through the relu and the batch norm before them)."""
        if not training or not kernels.config.fuse_layers:
            return (), (), ()
        layers, (known, candidates, conv_bn) = self._layers, self._fusion_cache
        if len(known) != len(layers) or not all(map(operator.is_, known, layers)):
            candidates, conv_bn = fusion_candidates(layers), conv_bn_candidates(layers)
            self._fusion_cache = (tuple(layers), candidates, conv_bn)
        # same compute dtype: the next layer's input cast, which the fused op skips, would do nothing
        pairs = tuple(i for i in candidates if layers[i]._fusable(training)
                      and layers[i]._effective_compute_dtype() == layers[i + 1]._effective_compute_dtype())
        convs = tuple(i for i in conv_bn if layers[i + 1]._fusable(training)
                      and layers[i]._effective_compute_dtype() == layers[i + 1]._effective_compute_dtype())
        back = tuple(i + 2 for i in pairs if i + 2 < len(layers) and _plain_conv(layers[i + 2])
                     and layers[i].layout == "NHWC"
                     and layers[i + 2]._effective_compute_dtype() == layers[i]._effective_compute_dtype())
        return pairs, convs, back

    def _run_forward(self, xs: list, training: bool, logits: Sequence[bool]) -> list:
        x = xs[0]
        layers = self._layers
        fused, convs, self._back_now = self._fused_pairs(training)
        self._fused_now = fused
        if fused or convs:
            skip = -1
            for i in range(len(layers) - 1):
                if i <= skip:
                    continue
                if i in convs:
                    relu = i + 1 in fused
                    x = layers[i]._forward_into_batchnorm(x, layers[i + 1], "relu" if relu else None)
                    skip = i + 2 if relu else i + 1
                elif i in fused:
                    x, skip = layers[i]._forward_fused(x, training, "relu"), i + 1
                else:
                    x = layers[i].forward(x, training=training)
        else:
            for layer in layers[:-1]:
                x = layer.forward(x, training=training)
        last = layers[-1]
        return [last.forward_logits(x, training=training) if logits[0] else last.forward(x, training=training)]

    def _run_backward(self, douts: list, on_grads: "Callable[[Layer], None] | None" = None) -> None:
        dy = douts[0]
        fused, self._fused_now = self._fused_now, ()
        back, self._back_now = self._back_now, ()
        done = len(self._layers)  # layers from here on had their backward run by a fused convolution's
        for i in range(len(self._layers) - 1, -1, -1):
            layer = self._layers[i]
            if i in back:
                # the convolution, the relu before it and the batch norm before that, in one backward
                dy, done = layer._backward_into_batchnorm(dy, self._layers[i - 2]), i - 2
            elif i >= done:
                pass
            elif i - 1 not in fused:
                dy = layer.backward(dy, need_dx=i > 0)
            # else: a relu fused into the batch norm before it, whose backward takes dy as it is
            if on_grads is not None:
                on_grads(layer)

    def _run_on_tape(self, tape: Tape, xs: list) -> list:
        x = xs[0]
        for layer in self._layers:
            x = tape.run(layer, x)
        return [x]

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
        layers = [deserialize(entry) for entry in layer_configs]  # constructors allocate nothing
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
