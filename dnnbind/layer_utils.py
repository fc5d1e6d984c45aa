"""``keras.utils.get_source_inputs``: the ``Input`` tensors a symbolic tensor of the functional graph comes from."""

from __future__ import annotations

from typing import Any

from .layers.graph import InputLayer

__all__ = ["get_source_inputs"]


def get_source_inputs(tensor: Any) -> Any:
    """The list of ``keras.Input`` tensors that ``tensor`` (a symbolic tensor) is computed from, in the order the
    graph reaches them, each once; ``tensor`` itself (in a list) when it is an input. A tensor without a
    graph history is returned as it is, as Keras does."""
    history = getattr(tensor, "_keras_history", None)
    if history is None:
        return tensor
    layer, node_index, _ = history
    if isinstance(layer, InputLayer) or not layer._inbound_nodes:
        return [tensor]
    node = layer._inbound_nodes[node_index]
    sources: list = []
    for t in node.input_tensors:
        for x in get_source_inputs(t):
            if all(x is not seen for seen in sources):
                sources.append(x)
    return sources
