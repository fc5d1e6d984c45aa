"""``keras.utils.model_to_dot`` / ``plot_model``: a model's layer graph as a pydot graph, and that graph drawn to a
file by Graphviz. Both need ``pydot`` (and Graphviz's ``dot`` program to draw), which dnnbind does not install:
without them they raise ``ImportError`` saying what to install, as Keras does in a script."""

from __future__ import annotations

import os
from typing import Any

__all__ = ["model_to_dot", "plot_model"]


def _pydot():
    try:
        import pydot  # (deferred: an optional dependency)
    except ImportError as exc:
        raise ImportError("You must install pydot (`pip install pydot`) for model_to_dot / plot_model to work; "
                          "drawing a file also needs Graphviz (https://graphviz.org/download/)") from exc
    return pydot


def _shape_text(shape: Any) -> str:
    if shape is None:
        return "?"
    return "(" + ", ".join("None" if s is None else str(s) for s in shape) + ")"


def _label(layer: Any, show_shapes: bool, show_dtype: bool, show_layer_names: bool, show_layer_activations: bool,
           show_trainable: bool) -> str:
    title = f"{layer.name} ({type(layer).__name__})" if show_layer_names else type(layer).__name__
    lines = [title]
    if show_layer_activations and hasattr(layer, "activation"):
        activation = layer.get_config().get("activation")
        if isinstance(activation, str):
            lines.append(f"Activation: {activation}")
    if show_shapes:
        out = getattr(layer, "output_shape", None)  # dnnbind's shapes leave out the batch axis
        lines.append(f"Output shape: {_shape_text(None if out is None else (None, *out))}")
    if show_dtype:
        lines.append(f"Output dtype: {getattr(layer, 'dtype', '?')}")
    if show_trainable:
        lines.append(f"Trainable: {'T' if layer.trainable else 'F'}")
    return "\n".join(lines)


def _edges(model: Any) -> list[tuple[Any, Any]]:
    """``(source layer, destination layer)`` for every connection of a functional model (a Sequential: a chain)."""
    layers = list(model.layers)
    if not hasattr(model, "_nodes"):
        return list(zip(layers, layers[1:]))
    edges = []
    for layer in layers:
        for node in getattr(layer, "_inbound_nodes", []):
            if not any(node is n for n in model._nodes):
                continue
            for tensor in node.input_tensors:
                source = tensor._keras_history[0]
                if (source, layer) not in edges:
                    edges.append((source, layer))
    return edges


def model_to_dot(model: Any, show_shapes: bool = False, show_dtype: bool = False, show_layer_names: bool = True,
                 rankdir: str = "TB", expand_nested: bool = False, dpi: int = 200, subgraph: bool = False,
                 show_layer_activations: bool = False, show_trainable: bool = False, **kwargs: Any):
    """A ``pydot.Dot`` with one box per layer (its name and class, optionally its output shape, dtype,
    activation and trainable flag) and an edge per connection. ``expand_nested`` is not supported (a nested
    model is one box)."""
    if not getattr(model, "built", False):
        raise ValueError("This model has not yet been built. Build the model first by calling `build()` or by "
                         "calling the model on a batch of data.")
    if rankdir not in ("TB", "LR"):
        raise ValueError(f"model_to_dot: rankdir must be 'TB' or 'LR', got {rankdir!r}")
    pydot = _pydot()
    dot = pydot.Dot()
    dot.set("rankdir", rankdir)
    dot.set("concentrate", True)
    dot.set("dpi", dpi)
    dot.set_node_defaults(shape="record")
    for layer in model.layers:
        dot.add_node(pydot.Node(str(id(layer)), label=_label(layer, show_shapes, show_dtype, show_layer_names,
                                                             show_layer_activations, show_trainable)))
    for source, destination in _edges(model):
        dot.add_edge(pydot.Edge(str(id(source)), str(id(destination))))
    return dot


def plot_model(model: Any, to_file: "str | os.PathLike" = "model.png", show_shapes: bool = False,
               show_dtype: bool = False, show_layer_names: bool = False, rankdir: str = "TB",
               expand_nested: bool = False, dpi: int = 200, show_layer_activations: bool = False,
               show_trainable: bool = False, **kwargs: Any):
    """Draw :func:`model_to_dot`'s graph to ``to_file`` (its extension picks the format: png, svg, pdf, dot...).
    Returns None (Keras returns an IPython image in a notebook)."""
    dot = model_to_dot(model, show_shapes=show_shapes, show_dtype=show_dtype, show_layer_names=show_layer_names,
                       rankdir=rankdir, expand_nested=expand_nested, dpi=dpi,
                       show_layer_activations=show_layer_activations, show_trainable=show_trainable)
    to_file = os.fspath(to_file)
    extension = os.path.splitext(to_file)[1][1:] or "png"
    dot.write(to_file, format=extension)
    return None
