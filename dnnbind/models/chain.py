"""Linear chains of dnnbind's own layers, run as one recorded node with the layer fusions (the fusion
planner for a static chain: ``Sequential``, and the single-consumer runs of a functional graph).

The forward runs the layers in order on raw arrays; a training forward fuses where the planner finds it
pays (below); while a tape records and a gradient is needed, the whole chain records ONE node whose VJP
runs the layers' hand-written backwards in reverse (each layer's weight gradients are emitted as soon as
they are final, so a data-parallel all-reduce overlaps the rest of the backward). This keeps the speed
the chain had before the op-level tape: one node, no per-layer tensors.

Fusions (``kernels.config.fuse_layers``, training forwards only):

* a ``BatchNormalization`` immediately followed by a plain relu (``Activation("relu")``, or ``ReLU()`` with
  its defaults) that is not the last layer runs as one batch-norm op with ``activation="relu"``
  (``BatchNormalization._forward_fused``); the relu layer's forward is skipped and its backward passes
  ``dy`` through;
* a ``Conv2D`` (exact class: float kernel, no bias, linear activation, channels_last) immediately followed
  by such a ``BatchNormalization`` (NHWC) in the same compute dtype runs as one
  ``kernels.conv2d_batchnorm_forward_training`` (the statistics may come from the convolution's epilogue: a
  cuDNN graph with genstats, chosen per shape);
* such a plain ``Conv2D`` right after an NHWC batch norm fused with its relu runs its backward through the
  relu and the batch norm in one op (``Conv2D._backward_into_batchnorm``: on CUDA possibly cuDNN's
  DgradDreluBNBwdWeight graph).
"""

from __future__ import annotations

import operator
from typing import Any, Callable, Sequence

from .. import kernels
from ..autodiff import engine
from ..autodiff.tensor import Tensor
from ..layers.base import Layer, _pending, _trainable_edges, structure_version
from ..layers.conv import Conv2D
from ..layers.core import Activation, ReLU
from ..layers.normalization import BatchNormalization
from ..ops import _core as ops_core

__all__ = ["LayerChain", "fusion_candidates", "conv_bn_candidates", "chainable"]


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


def chainable(layer: Any) -> bool:
    """Whether ``layer`` can be a link of a chain: one of dnnbind's own single-input layers (a hand-written
    forward and backward, no ``call`` of its own)."""
    return (isinstance(layer, Layer) and layer._is_legacy() and not layer.multi_input
            and layer._post_activation() is None and layer.activity_regularizer is None)


class LayerChain:
    """The layers ``layers`` (each :func:`chainable`) applied one after the other."""

    def __init__(self, layers: Sequence[Layer]) -> None:
        self.layers = list(layers)
        # (the layer list, its batch-norm + relu candidates, its conv + batch-norm candidates)
        self._fusion_cache: "tuple[tuple[Layer, ...], tuple[int, ...], tuple[int, ...]]" = ((), (), ())

    def _fused_pairs(self, training: bool) -> "tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]":
        """(the batch norms (indices) a forward with ``training`` runs fused with the next layer's relu,
        the convolutions it runs as one op with the batch norm after them, the convolutions whose backward
        runs through the relu and the batch norm before them)."""
        if not training or not kernels.config.fuse_layers:
            return (), (), ()
        layers, (known, candidates, conv_bn) = self.layers, self._fusion_cache
        if len(known) != len(layers) or not all(map(operator.is_, known, layers)):
            candidates, conv_bn = fusion_candidates(layers), conv_bn_candidates(layers)
            self._fusion_cache = (tuple(layers), candidates, conv_bn)
        if not candidates and not conv_bn:
            return (), (), ()
        # same compute dtype: the next layer's input cast, which the fused op skips, would do nothing
        pairs = tuple(i for i in candidates if layers[i]._fusable(training)
                      and layers[i]._effective_compute_dtype() == layers[i + 1]._effective_compute_dtype())
        convs = tuple(i for i in conv_bn if layers[i + 1]._fusable(training)
                      and layers[i]._effective_compute_dtype() == layers[i + 1]._effective_compute_dtype())
        back = tuple(i + 2 for i in pairs if i + 2 < len(layers) and _plain_conv(layers[i + 2])
                     and layers[i].layout == "NHWC"
                     and layers[i + 2]._effective_compute_dtype() == layers[i]._effective_compute_dtype())
        return pairs, convs, back

    # ----- raw forward / backward ---------------------------------------------------------------------
    def forward(self, x: Any, training: bool, logits: bool = False) -> "tuple[Any, tuple]":
        """The chain on a raw array; returns ``(y, plan)`` (``plan``: what the backward must follow)."""
        layers = self.layers
        fused, convs, back = self._fused_pairs(training)
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
        y = last.forward_logits(x, training=training) if logits else last.forward(x, training=training)
        return y, (fused, back)

    def backward(self, dy: Any, plan: tuple, need_dx: bool, on_layer: "Callable[[int], None] | None" = None) -> Any:
        """The chain's backward from ``dy`` (the layers' hand-written backwards in reverse, fused where the
        forward's ``plan`` says); ``on_layer(i)`` after ``layers[i]``'s gradients are final."""
        fused, back = plan
        layers = self.layers
        done = len(layers)  # layers from here on had their backward run by a fused convolution's
        for i in range(len(layers) - 1, -1, -1):
            layer = layers[i]
            if i in back:
                # the convolution, the relu before it and the batch norm before that, in one backward
                dy, done = layer._backward_into_batchnorm(dy, layers[i - 2]), i - 2
            elif i >= done:
                pass
            elif i - 1 not in fused:
                dy = layer.backward(dy, need_dx=need_dx or i > 0)
            # else: a relu fused into the batch norm before it, whose backward takes dy as it is
            if on_layer is not None:
                on_layer(i)
        return dy

    # ----- one recorded node ------------------------------------------------------------------------
    def _weights(self) -> tuple:
        """``([(layer, weight)], [per layer: ((weight name, input position), ...)], [weight])`` of the trainable
        weights, kept until the structure version moves (a trainable flag, a new weight)."""
        memo = self.__dict__.get("_weights_memo")
        version = structure_version()
        if memo is None or memo[0] != version:
            weights = [(layer, w) for layer in self.layers if layer.trainable for w in layer.trainable_weights]
            per_layer = [tuple((w.name, k + 1) for k, (owner, w) in enumerate(weights) if owner is layer)
                         for layer in self.layers]
            memo = (version, weights, per_layer, [w for _, w in weights])
            self._weights_memo = memo
        return memo[1], memo[2], memo[3]


    def apply(self, x: Any, training: bool, logits: bool = False) -> Tensor:
        """The chain on ``x`` (a tensor or an array) as one node (see the module docstring)."""
        first = self.layers[0]
        raw, t = first._raw_input(x)
        if not engine.recording():
            y, _ = self.forward(raw, training, logits)
            return Tensor(y)
        weights, per_layer, variables = self._weights()
        in_edge = None if t is None else ops_core.edge(t)
        w_edges = _trainable_edges(variables)
        if in_edge is None and all(e is None for e in w_edges):
            y, _ = self.forward(raw, training, logits)
            return Tensor(y)
        states = [(layer, layer._call_state()) for layer in self.layers]
        previous = self.__dict__.get("_last_saved")
        if previous is not None and not previous["done"]:
            # the chain applied again before the previous application's backward (a shared model): what the
            # previous forward left on each layer is put back for that backward
            previous["state"] = [before for _, before in states]
        run_training = training or all(layer._training_free for layer in self.layers)
        y, plan = self.forward(raw, run_training, logits)
        saved = {"state": None, "done": False}
        self._last_saved = saved
        _pending().extend([(layer, before, saved) for layer, before in states])
        layers = self.layers

        def vjp(node: Any, dy: Tensor) -> tuple:
            need_dx = node.needs_input_grad[0]
            results: list = [None] * (1 + len(weights))
            emit = node.emit

            def finished(i: int) -> None:
                d = layers[i].__dict__
                grads = d["grads"]  # (set to {} below, before the backward)
                if not grads:
                    return
                d["grads"] = {}
                for name, k in per_layer[i]:
                    g = grads[name] if name in grads else None
                    if g is not None:
                        results[k] = g
                        if emit is not None:
                            emit(k, g)

            if saved["state"] is not None:
                for layer, state in zip(self.layers, saved["state"]):
                    layer._restore_call_state(state)
            for layer in self.layers:
                layer.__dict__["grads"] = {}
            if emit is not None:  # each layer's weight gradients are delivered as soon as they are final
                dx = self.backward(dy.data, plan, need_dx, finished)
            else:
                dx = self.backward(dy.data, plan, need_dx)
                for i in range(len(layers)):
                    finished(i)
            saved["done"] = True
            results[0] = dx if need_dx else None
            return tuple(results)

        return engine.record(y, (in_edge,) + w_edges, vjp, f"chain of {len(self.layers)} layers",
                             once_differentiable=True)
