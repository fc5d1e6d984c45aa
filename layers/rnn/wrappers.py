"""Keras 3's layer wrappers for sequences: ``Bidirectional`` (an RNN run both ways) and ``TimeDistributed`` (a
layer applied to every time step), in ``keras.ops``."""

from __future__ import annotations

from typing import Any, Sequence

from dnnbind import ops as _ops
from dnnbind.autodiff.tensor import Tensor

from ..base import Layer, register
from ._fused import run_fused_bidirectional
from .cells import deserialize_layer, serialize_layer

__all__ = ["Bidirectional", "TimeDistributed", "clone_layer"]

_MERGE_MODES = ("sum", "mul", "ave", "concat", None)


def clone_layer(layer: Layer, **overrides: Any) -> Layer:
    """A new layer of ``layer``'s class and config (new weights), with ``overrides`` in the config; a recurrent
    layer's cell (and a stack's cells) are copied the same way (their classes need no registry)."""
    config = layer.get_config()
    config.update(overrides)
    if "cell" in config and isinstance(getattr(layer, "cell", None), Layer):
        config["cell"] = clone_layer(layer.cell)
    if "cells" in config and isinstance(getattr(layer, "cells", None), list):
        config["cells"] = [clone_layer(c) if isinstance(c, Layer) else c for c in layer.cells]
    return type(layer).from_config(config)


def _removeprefix(name: str, prefix: str) -> str:
    return name[len(prefix):] if name.startswith(prefix) else name


def _set_mask(output: Any, mask: Any) -> Any:
    """Attach Keras's output mask to a tensor (what the next layer reads when given no ``mask``)."""
    if mask is not None and isinstance(output, Tensor):
        output._keras_mask = mask
    return output


@register
class Bidirectional(Layer):
    """``keras.layers.Bidirectional(layer, merge_mode="concat", weights=None, backward_layer=None)``: ``layer``
    (an RNN) run forwards and a copy of it with ``go_backwards`` flipped run backwards, their outputs merged
    (``"concat"`` on the last axis, ``"sum"``, ``"mul"``, ``"ave"``, or None: the tuple of both). With
    ``return_sequences`` the backward outputs are flipped back into time order first. ``backward_layer``: the
    backward layer to use instead (its ``go_backwards`` must differ from ``layer``'s; ``stateful``,
    ``return_sequences`` and ``return_state`` must match). ``initial_state``: the forward states then the
    backward ones. As in Keras, ``layer`` itself is not used: ``forward_layer`` is a copy of it named
    ``forward_<name>`` (its weights are new). When both layers take the fused path with the same cell (Keras's
    ``_can_attempt_fused_lstm``: no dropout, not stateful), the two directions run as one bidirectional fused
    call (cuDNN's bidirectional RNN on a GPU)."""

    _last_call_fused = False

    def __init__(self, layer: Any, merge_mode: "str | None" = "concat", weights: Any = None,
                 backward_layer: Any = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        owner = f"{type(self).__name__} '{self.name}'"
        if isinstance(layer, dict):
            layer = deserialize_layer(layer, "layer", owner)
        if isinstance(backward_layer, dict):
            backward_layer = deserialize_layer(backward_layer, "backward_layer", owner)
        if not isinstance(layer, Layer):
            raise ValueError(f"{owner}: Please initialize `Bidirectional` layer with a `keras.layers.Layer` "
                             f"instance. Received: {layer!r}")
        if backward_layer is not None and not isinstance(backward_layer, Layer):
            raise ValueError(f"{owner}: `backward_layer` need to be a `keras.layers.Layer` instance. Received: "
                             f"{backward_layer!r}")
        if merge_mode not in _MERGE_MODES:
            raise ValueError(f"{owner}: Invalid merge mode. Received: {merge_mode!r}. Merge mode should be one of "
                             '{"sum", "mul", "ave", "concat", None}')
        for attr in ("go_backwards", "return_sequences", "return_state", "stateful"):
            if not hasattr(layer, attr):
                raise ValueError(f"{owner}: layer must be a recurrent layer (it has no `{attr}`), got "
                                 f"{type(layer).__name__}")
        forward = clone_layer(layer, name=f"forward_{_removeprefix(layer.name, 'forward_')}")
        if backward_layer is None:
            backward_layer = clone_layer(layer, name=f"backward_{_removeprefix(layer.name, 'backward_')}",
                                         go_backwards=not layer.go_backwards)
        if forward.go_backwards == backward_layer.go_backwards:
            raise ValueError(f"{owner}: Forward layer and backward layer should have different `go_backwards` "
                             f"value. Received: forward_layer.go_backwards {forward.go_backwards}, "
                             f"backward_layer.go_backwards={backward_layer.go_backwards}")
        for attr in ("stateful", "return_sequences", "return_state"):
            a, b = getattr(forward, attr), getattr(backward_layer, attr)
            if a != b:
                raise ValueError(f'{owner}: Forward layer and backward layer are expected to have the same value for '
                                 f'attribute "{attr}", got "{a}" for forward layer and "{b}" for backward layer')
        for rnn in (forward, backward_layer):
            if getattr(rnn, "zero_output_for_mask", None) is not None:
                rnn.zero_output_for_mask = rnn.return_sequences
        self.forward_layer = forward
        self.backward_layer = backward_layer
        self.merge_mode = merge_mode
        self.stateful = layer.stateful
        self.return_sequences = layer.return_sequences
        self.return_state = layer.return_state
        self.supports_masking = True
        self._initial_weights = None
        if weights:
            weights = list(weights)
            if len(weights) % 2:
                raise ValueError(f"{owner}: weights must hold the forward layer's arrays then the backward "
                                 f"layer's (an even count), got {len(weights)}")
            self._initial_weights = weights

    @classmethod
    def _builds_keras_shapes(cls) -> bool:
        return True  # build() takes Keras shapes, with the batch axis (also when a model builds it)

    def _owner(self) -> str:
        return f"{type(self).__name__} '{self.name}'"

    @property
    def states(self) -> "tuple | None":
        f, b = self.forward_layer.states, self.backward_layer.states
        return tuple(f + b) if f and b else None

    def reset_states(self) -> None:
        self.reset_state()

    def reset_state(self) -> None:
        if not self.stateful:
            raise AttributeError(f"{self._owner()}: Layer must be stateful.")
        self.forward_layer.reset_state()
        self.backward_layer.reset_state()

    def build(self, sequences_shape: Sequence[Any], initial_state_shape: Any = None) -> None:
        for rnn in (self.forward_layer, self.backward_layer):
            if not rnn.built:
                rnn.build(tuple(sequences_shape))
        if self._initial_weights is not None:
            half = len(self._initial_weights) // 2
            self.forward_layer.set_weights(self._initial_weights[:half])
            self.backward_layer.set_weights(self._initial_weights[half:])
            self._initial_weights = None
        self.built = True

    def compute_output_shape(self, sequences_shape: Sequence[Any], initial_state_shape: Any = None) -> Any:
        output_shape = self.forward_layer.compute_output_shape(tuple(sequences_shape))
        state_shape: tuple = ()
        if self.return_state:
            output_shape, state_shape = output_shape[0], tuple(output_shape[1:])
        if self.merge_mode == "concat":
            output_shape = (*tuple(output_shape)[:-1], tuple(output_shape)[-1] * 2)
        elif self.merge_mode is None:
            output_shape = [tuple(output_shape), tuple(output_shape)]
        if self.return_state:
            if self.merge_mode is None:
                return tuple(output_shape) + state_shape + state_shape
            return (tuple(output_shape),) + state_shape + state_shape
        return tuple(output_shape) if self.merge_mode is not None else output_shape

    def compute_mask(self, inputs: Any, mask: Any = None) -> Any:
        if isinstance(mask, list):
            mask = mask[0]
        if self.return_sequences:
            output_mask = (mask, mask) if not self.merge_mode else mask
        else:
            output_mask = (None, None) if not self.merge_mode else None
        return output_mask

    def call(self, sequences: Any, initial_state: Any = None, mask: Any = None, training: Any = None) -> Any:
        fused = run_fused_bidirectional(self, sequences, initial_state, mask, training) \
            if isinstance(sequences, Tensor) and sequences.ndim == 3 else None
        if fused is not None:  # one bidirectional call: the reverse outputs come aligned to the input steps
            y, y_rev, fused_states, joined = fused
            return self._merge(y, y_rev, tuple(fused_states), mask, joined)
        self._last_call_fused = False
        forward_state = backward_state = None
        if initial_state is not None:
            states = list(initial_state) if isinstance(initial_state, (list, tuple)) else [initial_state]
            if len(states) % 2:
                raise ValueError(f"{self._owner()}: initial_state must hold the forward layer's states then the "
                                 f"backward layer's (an even count), got {len(states)}")
            half = len(states) // 2
            forward_state, backward_state = states[:half], states[half:]
        y = self.forward_layer(sequences, initial_state=forward_state, mask=mask, training=training)
        y_rev = self.backward_layer(sequences, initial_state=backward_state, mask=mask, training=training)
        states: tuple = ()
        if self.return_state:
            states = tuple(y[1:]) + tuple(y_rev[1:])
            y, y_rev = y[0], y_rev[0]
        if self.return_sequences:
            y_rev = _ops.flip(y_rev, axis=1)
        return self._merge(y, y_rev, states, mask)

    def _merge(self, y: Any, y_rev: Any, states: tuple, mask: Any, joined: Any = None) -> Any:
        if joined is not None:
            output: Any = joined
        elif self.merge_mode == "concat":
            output = _ops.concatenate([y, y_rev], axis=-1)
        elif self.merge_mode == "sum":
            output = _ops.add(y, y_rev)
        elif self.merge_mode == "ave":
            output = _ops.divide(_ops.add(y, y_rev), 2.0)
        elif self.merge_mode == "mul":
            output = _ops.multiply(y, y_rev)
        else:
            output = (y, y_rev)
        if self.return_sequences and mask is not None:
            for o in (output if isinstance(output, tuple) else [output]):
                _set_mask(o, mask)
        if self.return_state:
            return (output if self.merge_mode is None else (output,)) + states
        return output

    def get_config(self) -> dict:
        return {**super().get_config(), "merge_mode": self.merge_mode,
                "layer": serialize_layer(self.forward_layer), "backward_layer": serialize_layer(self.backward_layer)}

    @classmethod
    def from_config(cls, config: dict) -> "Bidirectional":
        config = dict(config)
        owner = f"{cls.__name__} '{config.get('name')}'"
        layer = deserialize_layer(config.pop("layer", None), "layer", owner)
        backward = config.pop("backward_layer", None)
        if backward is not None:
            backward = deserialize_layer(backward, "backward_layer", owner)
        return cls(layer, backward_layer=backward, **config)


@register
class TimeDistributed(Layer):
    """``keras.layers.TimeDistributed(layer)``: ``layer`` applied to every time step of ``(batch, time, ...)``
    inputs (step by step, as Keras does: a layer whose result depends on the batch, a BatchNormalization in
    training, sees one step's batch at a time), the outputs stacked back on axis 1. The input mask passes
    through; it reaches ``layer`` step by step when its ``call`` takes ``mask``."""

    def __init__(self, layer: Any, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        owner = f"{type(self).__name__} '{self.name}'"
        if isinstance(layer, dict):
            layer = deserialize_layer(layer, "layer", owner)
        if not isinstance(layer, Layer):
            raise ValueError(f"{owner}: Please initialize `TimeDistributed` layer with a `keras.layers.Layer` "
                             f"instance. Received: {layer!r}")
        self.layer = layer
        self.supports_masking = True

    @classmethod
    def _builds_keras_shapes(cls) -> bool:
        return True  # build() takes Keras shapes, with the batch axis (also when a model builds it)

    def _child_shape(self, input_shape: Any) -> tuple:
        if not isinstance(input_shape, (tuple, list)) or len(input_shape) < 3:
            raise ValueError(f"{type(self).__name__} '{self.name}': `TimeDistributed` Layer should be passed an "
                             f"`input_shape` with at least 3 dimensions, received: {input_shape}")
        return (input_shape[0], *tuple(input_shape)[2:])

    def build(self, input_shape: Sequence[Any]) -> None:
        child = self._child_shape(tuple(input_shape))
        if not self.layer.built:
            if self.layer._is_legacy():
                self.layer._ensure_built((None, *child[1:]))
            else:
                self.layer.build(child)
                self.layer.built = True
        self.built = True

    def compute_output_shape(self, input_shape: Sequence[Any]) -> tuple:
        shape = tuple(input_shape)
        out = tuple(self.layer.compute_output_shape(self._child_shape(shape)))
        return (out[0], shape[1], *out[1:])

    def call(self, inputs: Any, training: Any = None, mask: Any = None) -> Any:
        owner = f"{type(self).__name__} '{self.name}'"
        if not isinstance(inputs, Tensor) or inputs.ndim < 3:
            raise ValueError(f"{owner}: expects inputs of shape (batch, time, ...), got shape "
                             f"{getattr(inputs, 'shape', None)}")
        if mask is not None:
            mshape = tuple(mask.shape)
            if len(mshape) < 2 or mshape[:2] != tuple(inputs.shape[:2]):
                raise ValueError(f"{owner}: The `mask` passed to the `TimeDistributed` layer has a shape {mshape} "
                                 f"that is incompatible with the input shape {tuple(inputs.shape)}: its first two "
                                 "dimensions (batch size and timesteps) must match the input's.")
        steps = _ops.unstack(inputs, axis=1)
        step_masks = _ops.unstack(mask, axis=1) if mask is not None else None
        takes_mask = not self.layer._is_legacy() and "mask" in self.layer._call_parameters()
        outputs = []
        for t, x in enumerate(steps):
            kwargs = {"training": training} if training is not None else {}
            if takes_mask and step_masks is not None:
                kwargs["mask"] = step_masks[t]
            outputs.append(self.layer(x, **kwargs))
        return _set_mask(_ops.stack(outputs, axis=1), mask)

    def get_config(self) -> dict:
        return {**super().get_config(), "layer": serialize_layer(self.layer)}

    @classmethod
    def from_config(cls, config: dict) -> "TimeDistributed":
        config = dict(config)
        layer = deserialize_layer(config.pop("layer", None), "layer", f"{cls.__name__} '{config.get('name')}'")
        return cls(layer, **config)
