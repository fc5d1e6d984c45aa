"""Functional models: ``Model(inputs, outputs)`` over a graph of layer applications (Keras 3's
``Functional``).

Layers (and models, and ``keras.ops``) called on symbolic tensors (``keras.Input``) record
:class:`~dnnbind.layers.graph.Node` s. ``Functional`` walks back from the outputs to the inputs, orders the
nodes topologically, and runs them by calling each node's layer on the values of its inputs: every
computation records on the tape while one is active (:mod:`dnnbind.autodiff`), so training needs no
model-level backward. The plan is made once per model: maximal runs of dnnbind's own single-input layers
whose intermediate results nobody else reads execute as one :class:`~dnnbind.models.chain.LayerChain`
(one recorded node, the conv + batch-norm and batch-norm + relu fusions), as ``Sequential`` does.

Config (Keras style): ``{"name", "trainable", "layers": [{"class_name", "config", "name",
"inbound_nodes": [{"args": [...], "kwargs": {...}}]}], "input_layers": [[name, node, tensor]],
"output_layers": [...]}`` with a symbolic tensor in ``args``/``kwargs`` written as
``{"class_name": "__keras_tensor__", "config": {"shape", "dtype", "keras_history": [layer, node,
tensor]}}``.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from .. import _validate
from .. import saving_lib
from ..autodiff.tensor import Tensor
from ..layers.base import Layer, unique_name
from ..layers.graph import InputLayer, KerasTensor, Node, substitute
from .chain import LayerChain, chainable
from .model import Model, deserialize_layer

__all__ = ["Functional"]


def _tensor_list(value: Any, what: str) -> tuple[list[KerasTensor], "list[str] | None"]:
    """``(tensors, dict keys or None)`` from one KerasTensor, a list/tuple or a dict of them."""
    keys = None
    if isinstance(value, dict):
        keys = list(value)
        items = list(value.values())
    elif isinstance(value, (list, tuple)):
        items = list(value)
    else:
        items = [value]
    if not items:
        raise ValueError(f"Functional: {what} must not be empty")
    for t in items:
        if not isinstance(t, KerasTensor):
            raise _validate.ArgumentTypeError(
                f"Functional: {what} must be symbolic tensors (from keras.Input and layers called on them), got "
                f"{type(t).__name__}")
    return items, keys


class Functional(Model):
    """A model over a graph of layers: ``Model(inputs, outputs)`` (see the module docstring).

    ``inputs``: a ``keras.Input`` tensor, a list or a dict of them; ``outputs``: a tensor, a list or
    a dict of them. Outputs are named after the layers producing them (``output_names``); inputs
    after their Input layers. ``layers`` lists the InputLayers first, then the layers in
    topological order (each once, also when shared), as Keras 3.
    """

    def __init__(self, inputs: Any, outputs: Any, name: str | None = None, trainable: bool = True) -> None:
        in_tensors, in_keys = _tensor_list(inputs, "inputs")
        out_tensors, out_keys = _tensor_list(outputs, "outputs")
        for t in in_tensors:
            if not isinstance(t._keras_history[0], InputLayer):
                raise ValueError(f"Functional: inputs must come from keras.Input(...); '{t.name}' was made by layer "
                                 f"'{t._keras_history[0].name}' ({type(t._keras_history[0]).__name__})")
        if len({id(t) for t in in_tensors}) != len(in_tensors):
            raise ValueError("Functional: an input tensor is listed twice in inputs")
        nodes = self._topological_nodes(in_tensors, out_tensors)
        layers: list[Layer] = [t._keras_history[0] for t in in_tensors]
        for node in nodes:
            if not any(node.layer is layer for layer in layers):
                layers.append(node.layer)
        self._refuse_duplicate_names(layers)
        self._init_model(name if name is not None else unique_name("functional"), trainable)
        self.__dict__["inputs"] = in_tensors
        self.__dict__["outputs"] = out_tensors
        self._input_keys = in_keys
        self._output_keys = out_keys
        # Keras's unpack_singleton: one output (bare, or a list of one) is returned as a tensor; a dict stays
        self._single_output = len(out_tensors) == 1 and out_keys is None
        # how the config writes the refs: a bare [layer, node, tensor] for a bare tensor, as Keras
        self._bare_refs = (not isinstance(inputs, (list, tuple, dict)), not isinstance(outputs, (list, tuple, dict)))
        self._nodes = nodes
        self._graph_layers = layers
        consumers: dict[int, int] = {}
        for node in nodes:
            for t in node.input_tensors:
                consumers[id(t)] = consumers.get(id(t), 0) + 1
        self._consumers = consumers
        counted = [consumers.get(id(t), 0) + sum(o is t for o in out_tensors) for t in out_tensors]
        # an output read by nothing else can skip its final softmax (fused into the cross-entropy)
        self._fusable = [t._keras_history[0].has_final_softmax and c == 1 and not any(t is i for i in in_tensors)
                         and t._keras_history[0]._is_legacy() for t, c in zip(out_tensors, counted)]
        self._built_input_shapes = [tuple(t.shape[1:]) for t in in_tensors]
        self._built_output_shapes = [tuple(t.shape[1:]) for t in out_tensors]
        self._single_input = len(in_tensors) == 1
        self._plan = self._make_plan()
        dev = self.device
        for layer in self._flat_layers():
            if layer._device is None:
                layer._device = dev
            elif layer._device != dev:
                layer.to(dev)
        self.built = True

    @staticmethod
    def _refuse_duplicate_names(layers: list[Layer]) -> None:
        """Keras 3's rule (``ops/function.py``: map_graph): every layer of the graph, Input layers
        included, has its own name, which its saved config refers to it by."""
        names = [layer.name for layer in layers]
        for name in names:
            if names.count(name) != 1:
                kinds = ", ".join(type(layer).__name__ for layer in layers if layer.name == name)
                raise ValueError(f'The name "{name}" is used {names.count(name)} times in the model ({kinds}). All '
                                 "operation names should be unique. Give each layer its own name= (or none: an "
                                 "automatic name is unique), so the model can be saved and loaded again.")

    @property
    def input(self) -> Any:
        """Keras 3's ``Model.input``: the input tensor, or the list (the dict) of them as given."""
        if self._input_keys is not None:
            return dict(zip(self._input_keys, self.inputs))
        return self.inputs[0] if len(self.inputs) == 1 else list(self.inputs)

    @staticmethod
    def _topological_nodes(inputs: list[KerasTensor], outputs: list[KerasTensor]) -> list[Node]:
        """The nodes between ``inputs`` and ``outputs``, each after the nodes it reads (depth-first)."""
        input_ids = {id(t) for t in inputs}
        order: list[Node] = []
        done: set[int] = set()
        active: set[int] = set()

        def visit(tensor: KerasTensor) -> None:
            if id(tensor) in input_ids:
                return
            node = tensor.node
            if id(node) in done:
                return
            if isinstance(node.layer, InputLayer):
                raise ValueError(f"Functional: graph disconnected: an output depends on input '{node.layer.name}', "
                                 f"which is not in inputs {[t.name for t in inputs]}")
            if id(node) in active:  # pragma: no cover - nodes are made after their inputs: no cycle
                raise ValueError("Functional: the layer graph has a cycle")
            active.add(id(node))
            for t in node.input_tensors:
                visit(t)
            active.discard(id(node))
            done.add(id(node))
            order.append(node)

        for t in outputs:
            visit(t)
        return order

    def _make_plan(self) -> list:
        """The execution plan: ``("node", node)`` steps and ``("chain", LayerChain, input tensor, output tensor,
        last node)`` steps for maximal runs of chainable nodes, each reading the previous one's only output,
        which nobody else reads (layers applied more than once in the graph run node by node: their state is
        per application)."""
        uses: dict[int, int] = {}
        for node in self._nodes:
            uses[id(node.layer)] = uses.get(id(node.layer), 0) + 1
        outputs = {id(t) for t in self.outputs}

        def linkable(node: Node) -> bool:
            return (chainable(node.layer) and uses[id(node.layer)] == 1 and len(node.input_tensors) == 1
                    and len(node.output_tensors) == 1 and not node.call_kwargs and len(node.call_args) == 1
                    and node.call_args[0] is node.input_tensors[0])

        plan: list = []
        run: list[Node] = []

        def close() -> None:
            if len(run) >= 2:
                plan.append(("chain", LayerChain([n.layer for n in run]), run[0].input_tensors[0],
                             run[-1].output_tensors[0], run[-1]))
            else:
                plan.extend(("node", n) for n in run)
            run.clear()

        for node in self._nodes:
            if linkable(node):
                prev = run[-1] if run else None
                if prev is not None and node.input_tensors[0] is prev.output_tensors[0] and \
                        self._consumers.get(id(prev.output_tensors[0]), 0) == 1 and \
                        id(prev.output_tensors[0]) not in outputs:
                    run.append(node)
                    continue
                close()
                run.append(node)
                continue
            close()
            plan.append(("node", node))
        close()
        return plan

    # ----- structure --------------------------------------------------------------------------
    @property
    def layers(self) -> list[Layer]:
        return list(self._graph_layers)

    def _direct_layers(self) -> list:
        return [layer for layer in self._graph_layers if not isinstance(layer, InputLayer)]

    def _input_names(self) -> list[str]:
        return self._input_keys if self._input_keys is not None else [t._keras_history[0].name for t in self.inputs]

    @property
    def output_names(self) -> list[str]:
        if self._output_keys is not None:
            return list(self._output_keys)
        names: list[str] = []
        for t in self.outputs:
            base = t._keras_history[0].name
            name, k = base, 1
            while name in names:
                name, k = f"{base}_{k}", k + 1
            names.append(name)
        return names

    def _input_hint(self) -> str:
        return f" (input '{self._input_names()[0]}')"

    def _input_dtypes(self) -> "list[np.dtype | None]":
        """Each ``Input``'s dtype: Keras 3 converts the data to it (int32 ids stay integers)."""
        return [np.dtype(t.dtype) for t in self.inputs]

    def _guess_input_structure(self, x: Any) -> None:
        pass

    def _require_layers(self, what: str) -> None:
        pass

    def build(self, input_shape: Any = None) -> None:
        """A functional model is built when it is made; ``build`` only checks ``input_shape`` if given."""
        if input_shape is not None:
            shapes = input_shape if isinstance(input_shape, list) and input_shape and isinstance(
                input_shape[0], (list, tuple)) else [input_shape]
            got = [tuple(s)[1:] if tuple(s) and tuple(s)[0] is None else tuple(s) for s in shapes]
            if got != self._built_input_shapes:
                raise ValueError(f"{self._owner}: build got input shape(s) {input_shape}, but the model's inputs "
                                 f"are {[(None, *s) for s in self._built_input_shapes]}")
        self._drop_graphs()

    def _build_for(self, shapes: list[tuple], single: bool | None = None) -> None:
        self.build([(None, *s) for s in shapes])

    # ----- forward ----------------------------------------------------------------------------
    def _fusable_outputs(self) -> list[bool]:
        return list(self._fusable)

    def _execute(self, xs: list, training: Any, logits: Sequence[bool]) -> list:
        values: dict[int, Any] = {id(t): x for t, x in zip(self.inputs, xs)}
        skip = {id(t) for t, lg in zip(self.outputs, logits) if lg}
        train = bool(training) if training is not None else False
        for step in self._plan:
            if step[0] == "chain":
                _, chain, src, dst, _last = step
                values[id(dst)] = chain.apply(values[id(src)], train, id(dst) in skip)
                continue
            node = step[1]
            layer = node.layer
            out_t = node.output_tensors
            if layer._is_legacy() and len(out_t) == 1 and id(out_t[0]) in skip:
                arg = substitute(node.call_args[0], lambda kt: values[id(kt)])
                values[id(out_t[0])] = layer._legacy_apply(arg, train, logits=True)
                continue
            args = substitute(node.call_args, lambda kt: values[id(kt)])
            kwargs = substitute(node.call_kwargs, lambda kt: values[id(kt)])
            if "training" not in kwargs:
                kwargs["training"] = training
            out = layer(*args, **kwargs)
            flat = _flat_values(out)
            if len(flat) != len(out_t):
                raise ValueError(f"{self._owner}: layer '{layer.name}' returned {len(flat)} outputs, the graph "
                                 f"recorded {len(out_t)}")
            for t, v in zip(out_t, flat):
                values[id(t)] = v
        return [values[id(t)] for t in self.outputs]

    def _arrange_inputs(self, inputs: Any) -> list:
        if isinstance(inputs, dict):
            names = self._input_names()
            missing = [n for n in names if n not in inputs]
            if missing:
                raise ValueError(f"{self._owner}: inputs are missing {missing}; expected {names}")
            return [inputs[n] for n in names]
        if isinstance(inputs, (list, tuple)) and not (len(self.inputs) == 1 and hasattr(inputs, "shape")):
            items = list(inputs)
            if len(items) != len(self.inputs):
                if len(self.inputs) == 1:
                    return [inputs]
                raise ValueError(f"{self._owner}: expected {len(self.inputs)} inputs, got {len(items)}")
            return items
        return [inputs]

    def call(self, inputs: Any, training: Any = None, mask: Any = None) -> Any:
        """Run the graph (Keras's ``Functional.call``): outputs in the structure the model was made with."""
        outs = self._execute(self._arrange_inputs(inputs), training, [False] * len(self.outputs))
        if self._output_keys is not None:
            return dict(zip(self._output_keys, outs))
        return outs[0] if self._single_output else outs

    def _run_forward(self, xs: list, training: bool, logits: Sequence[bool]) -> list:
        return self._execute(list(xs), training, logits)

    def _build_from_call(self, args: tuple, kwargs: dict) -> None:
        self.built = True

    def compute_output_spec(self, inputs: Any, training: Any = None, mask: Any = None) -> Any:
        items = self._arrange_inputs(inputs)
        batch = items[0].shape[0] if items and hasattr(items[0], "shape") else None
        specs = [((batch, *tuple(t.shape[1:])), t.dtype) for t in self.outputs]
        if self._output_keys is not None:
            return dict(zip(self._output_keys, specs))
        return specs[0] if self._single_output else specs

    # ----- summary and config -----------------------------------------------------------------
    def _summary_graph(self) -> tuple[list, dict]:
        """Keras 3's ``map_graph`` order: ``(layers, nodes by depth)``. The layers (InputLayers included) by
        decreasing depth from the outputs, within a depth in the order a depth-first walk from the outputs
        first meets them; a node's depth is one more than its deepest consumer's (an input's node counts
        as a node with no parents)."""
        producer = {id(t): node for node in self._nodes for t in node.output_tensors}
        input_nodes: dict = {}

        def node_of(t):
            found = producer.get(id(t))
            if found is None:  # an InputLayer's tensor: one node of its own, keyed by the layer
                layer = t._keras_history[0]
                found = input_nodes.setdefault(id(layer), (layer, []))
            return found

        def layer_of(node):
            return node[0] if isinstance(node, tuple) else node.layer

        def parents(node):
            return [] if isinstance(node, tuple) else [node_of(t) for t in node.input_tensors]

        order, finished, indices = [], set(), {}

        def walk(node):
            if id(node) in finished:
                return
            indices.setdefault(id(layer_of(node)), len(indices))
            for parent in parents(node):
                walk(parent)
            finished.add(id(node))
            order.append(node)

        for t in self.outputs:
            walk(node_of(t))
        node_depth, layer_depth, layers = {}, {}, {}
        for node in reversed(order):
            layer = layer_of(node)
            depth = max(node_depth.get(id(node), 0), layer_depth.get(id(layer), 0))
            layer_depth[id(layer)], node_depth[id(node)], layers[id(layer)] = depth, depth, layer
            for parent in parents(node):
                node_depth[id(parent)] = max(depth + 1, node_depth.get(id(parent), 0))
        ranked = sorted(layers.values(), key=lambda la: (-layer_depth[id(la)], indices[id(la)]))
        by_depth: dict = {}
        for node in order:
            by_depth.setdefault(node_depth[id(node)], []).append(node)
        return ranked, by_depth

    def _summary_rows(self) -> list[tuple]:
        """Keras 3's rows: one per layer (InputLayers included) in ``map_graph`` order, "Connected to" the
        inputs of each of its applications in this model as ``layer[node][tensor]``, the output shape of its
        last application."""
        layers, _ = self._summary_graph()
        rows = []
        for layer in layers:
            nodes = [n for n in self._nodes if n.layer is layer]
            if not nodes:  # an InputLayer
                t = next(t for t in self.inputs if t._keras_history[0] is layer)
                rows.append((f"{layer.name} (InputLayer)", str(t.shape).replace(",)", ")"), "0", "-", layer))
                continue
            links = ", ".join(f"{t._keras_history[0].name}[{t._keras_history[1]}][{t._keras_history[2]}]"
                              for n in nodes for t in n.input_tensors)
            outs = nodes[-1].output_tensors
            shape = (str(outs[0].shape).replace(",)", ")") if len(outs) == 1
                     else "[" + ", ".join(str(t.shape).replace(",)", ")") for t in outs) + "]")
            rows.append((f"{layer.name} ({type(layer).__name__})", shape, f"{layer.count_params():,}",
                         links or "-", layer))
        return rows

    def _summary_is_sequential(self) -> bool:
        """Keras's ``sequential_like``: one node per depth, none with more than one input tensor, no layer
        applied twice."""
        _, by_depth = self._summary_graph()
        for nodes in by_depth.values():
            if len(nodes) > 1 or (not isinstance(nodes[0], tuple) and len(nodes[0].input_tensors) > 1):
                return False
        applied = [id(n.layer) for n in self._nodes]
        return len(applied) == len(set(applied))

    @staticmethod
    def _tensor_config(t: KerasTensor) -> dict:
        layer, node_index, tensor_index = t._keras_history
        return {"class_name": "__keras_tensor__",
                "config": {"shape": list(t.shape), "dtype": t.dtype,
                           "keras_history": [layer.name, node_index, tensor_index]}}

    def get_config(self) -> dict:
        layers = []
        for layer in self._graph_layers:
            nodes = []
            if not isinstance(layer, InputLayer):
                for node in layer._inbound_nodes:
                    if not any(node is n for n in self._nodes):
                        continue  # an application outside this model
                    nodes.append({"args": self._encode_arguments(list(node.call_args)),
                                  "kwargs": {k: self._encode_arguments(v) for k, v in node.call_kwargs.items()
                                             if k != "training"}})
            layers.append({"class_name": type(layer).__name__, "name": layer.name, "config": layer.get_config(),
                           "inbound_nodes": nodes})

        def refs(tensors: list[KerasTensor], bare: bool) -> list:
            out = [[t._keras_history[0].name, self._node_position(t), t._keras_history[2]] for t in tensors]
            return out[0] if bare and len(out) == 1 else out  # Keras writes a bare tensor's ref bare

        bare_in, bare_out = getattr(self, "_bare_refs", (False, False))
        config: dict = {"name": self.name, "trainable": self.trainable, "layers": layers,
                        "input_layers": refs(self.inputs, bare_in), "output_layers": refs(self.outputs, bare_out)}
        if self._input_keys is not None:
            config["input_names"] = list(self._input_keys)
        if self._output_keys is not None:
            config["output_names"] = list(self._output_keys)
        return config

    def _encode_arguments(self, value: Any) -> Any:
        """A node's call arguments as JSON: symbolic tensors as ``__keras_tensor__`` entries, structures as lists
        and dicts, plain values as they are."""
        if isinstance(value, KerasTensor):
            return self._tensor_config(value)
        if isinstance(value, (list, tuple)):
            return [self._encode_arguments(v) for v in value]
        if isinstance(value, dict):
            return {k: self._encode_arguments(v) for k, v in value.items()}
        if value is None or isinstance(value, (bool, int, float, str)):
            return value
        if hasattr(value, "item") and getattr(value, "ndim", 1) == 0:
            return value.item()
        raise TypeError(f"{self._owner}: a layer call argument of type {type(value).__name__} cannot be written to "
                        "the model's config")

    def _node_position(self, t: KerasTensor) -> int:
        """The node index of ``t`` counted over this model's nodes of its layer (what the config lists)."""
        layer, node_index, _ = t._keras_history
        if isinstance(layer, InputLayer):
            return 0
        mine = [n for n in layer._inbound_nodes if any(n is m for m in self._nodes)]
        node = layer._inbound_nodes[node_index]
        return next(i for i, n in enumerate(mine) if n is node)

    @classmethod
    def from_config(cls, config: dict, custom_objects: "dict | None" = None, *,
                    max_weight_bytes: int | None = None) -> "Functional":
        """A functional model from :meth:`get_config`'s dict (which may come from an untrusted file):
        the layers' constructors check their arguments, the graph is checked, and the weights are
        sized from the config before any is created (``AllocationTooLargeError`` past
        ``max_weight_bytes``, default the physical memory). ``custom_objects`` maps class names to the
        user's layer classes (Keras's argument); a layer is known in the graph by its entry's name, as in
        Keras (a user's ``get_config`` may leave out ``name``)."""
        if not isinstance(config, dict):
            raise TypeError(f"Functional.from_config: config must be a dict, got {type(config).__name__}")
        config = dict(config)
        owner = f"Functional.from_config ('{config.get('name')}')"
        entries = config.get("layers")
        if not isinstance(entries, list) or not entries:
            raise TypeError(f"{owner}: 'layers' must be a non-empty list, got {type(entries).__name__}")
        for i, entry in enumerate(entries):
            if not (isinstance(entry, dict) and isinstance(entry.get("class_name"), str)
                    and isinstance(entry.get("config"), dict) and isinstance(entry.get("inbound_nodes", []), list)):
                raise TypeError(f"{owner}: layers[{i}] must be {{'class_name': str, 'name': str, 'config': dict, "
                                f"'inbound_nodes': list}}, got {str(entry)[:120]}")
        if custom_objects is not None and not isinstance(custom_objects, dict):
            raise TypeError(f"{owner}: custom_objects must be a dict of class names to classes, got "
                            f"{type(custom_objects).__name__}")
        custom = custom_objects or {}
        layers = {}
        for entry in entries:
            layer = deserialize_layer(entry, custom)  # constructors allocate nothing
            key = entry["config"].get("name", entry.get("name", layer.name))
            if key in layers:
                raise ValueError(f"{owner}: two layers are named '{key}'")
            layers[key] = layer

        def decode(value: Any, layer_name: str, refs: list) -> Any:
            """A node argument with its symbolic tensors as ``("__ref__", layer, node, tensor)`` markers."""
            if isinstance(value, dict) and value.get("class_name") == "__keras_tensor__":
                hist = value.get("config", {}).get("keras_history")
                if not (isinstance(hist, list) and len(hist) == 3 and isinstance(hist[0], str)
                        and all(type(v) is int and v >= 0 for v in hist[1:])):
                    raise TypeError(f"{owner}: layer '{layer_name}': a node argument must be a keras tensor with "
                                    f"keras_history [layer, node, tensor], got {str(value)[:120]}")
                if hist[0] not in layers:
                    raise ValueError(f"{owner}: layer '{layer_name}' reads from unknown layer '{hist[0]}'")
                refs.append(tuple(hist))
                return ("__ref__", *hist)
            if isinstance(value, list):
                return [decode(v, layer_name, refs) for v in value]
            if isinstance(value, dict):
                return {k: decode(v, layer_name, refs) for k, v in value.items()}
            return value

        def parse_args(node: Any, layer_name: str) -> tuple[list, dict, list]:
            if not isinstance(node, dict) or not isinstance(node.get("args"), list) or not node["args"]:
                raise TypeError(f"{owner}: layer '{layer_name}': each inbound node must be {{'args': [...]}}")
            refs: list = []
            args = decode(node["args"], layer_name, refs)
            kwargs = decode(node.get("kwargs") or {}, layer_name, refs)
            if not isinstance(kwargs, dict):
                raise TypeError(f"{owner}: layer '{layer_name}': a node's kwargs must be a dict")
            return args, kwargs, refs

        def fill(value: Any, made: dict) -> Any:
            if isinstance(value, tuple) and len(value) == 4 and value[0] == "__ref__":
                out = made[(value[1], value[2])]
                flat = _flat_values(out)
                if value[3] >= len(flat):
                    raise ValueError(f"{owner}: layer '{value[1]}' node {value[2]} has no output {value[3]}")
                return flat[value[3]]
            if isinstance(value, list):
                return [fill(v, made) for v in value]
            if isinstance(value, dict):
                return {k: fill(v, made) for k, v in value.items()}
            return value

        def replay(apply: Callable[[Layer, list, dict], Any]) -> dict:
            """Apply every inbound node once its inputs exist; returns {(layer, node): output}."""
            made: dict[tuple, Any] = {}
            for name, layer in layers.items():
                if isinstance(layer, InputLayer):
                    made[(name, 0)] = apply(layer, [], {})
            pending = [(entry["config"].get("name", entry.get("name")), i, node) for entry in entries
                       for i, node in enumerate(entry.get("inbound_nodes", []))
                       if entry["class_name"] != "InputLayer"]
            while pending:
                left = []
                for name, index, node in pending:
                    args, kwargs, refs = parse_args(node, name)
                    if (name, index - 1) not in made and index > 0 or any((r[0], r[1]) not in made for r in refs):
                        left.append((name, index, node))
                        continue
                    made[(name, index)] = apply(layers[name], fill(args, made), fill(kwargs, made))
                if len(left) == len(pending):
                    raise ValueError(f"{owner}: the layer graph cannot be rebuilt (missing or cyclic inputs of "
                                     f"{sorted({p[0] for p in left})})")
                pending = left
            return made

        bare: dict[str, bool] = {}

        def check_refs(key: str) -> list[tuple]:
            refs = config.get(key)
            if isinstance(refs, dict):  # Keras writes named inputs/outputs as a dict of refs
                config.setdefault(key.replace("_layers", "_names"), list(refs))
                refs = list(refs.values())
            bare[key] = isinstance(refs, list) and len(refs) == 3 and isinstance(refs[0], str)
            if bare[key]:
                refs = [refs]  # Keras writes a single ref bare (a model of one bare input/output tensor)
            if not isinstance(refs, list) or not refs or not all(
                    isinstance(r, list) and len(r) == 3 and r[0] in layers for r in refs):
                raise TypeError(f"{owner}: '{key}' must be a list of [layer name, node, tensor], got {str(refs)[:120]}")
            return [(r[0], r[1], r[2] if type(r[2]) is int else 0) for r in refs]

        in_refs, out_refs = check_refs("input_layers"), check_refs("output_layers")
        in_refs = [r[:2] for r in in_refs]

        # first pass on shapes only: size the weights before any is created
        budget = {"total": 0}
        limit = max_weight_bytes

        def shape_only(layer: Layer, args: list, kwargs: dict) -> Any:
            if isinstance(layer, InputLayer):
                return _Shape((None, *layer.input_shape))
            if not layer._is_legacy():
                return _Shape(None)  # a layer with a call of its own: sized when it builds
            if not args or (not layer.multi_input and isinstance(args[0], list)) or len(args) != 1:
                raise ValueError(f"{owner}: layer '{layer.name}' takes one input, the config gives {len(args)}")
            first = args[0]
            shape = [a.shape for a in first] if isinstance(first, list) else first.shape
            if shape is None or (layer.multi_input and any(s is None for s in shape)):
                return _Shape(None)
            if not layer.multi_input and not getattr(layer, "_budgeted", False):
                remaining = None if limit is None else limit - budget["total"]
                budget["total"] += saving_lib.check_weight_budget(
                    [layer], shape[1:], f"Functional '{config.get('name')}'", remaining)
                layer._budgeted = True
            return _Shape(layer.compute_output_shape(shape))

        try:
            replay(shape_only)
        finally:
            for layer in layers.values():
                layer.__dict__.pop("_budgeted", None)

        def symbolic(layer: Layer, args: list, kwargs: dict) -> Any:
            if isinstance(layer, InputLayer):
                return layer.output
            return layer(*args, **kwargs)

        made = replay(symbolic)
        ins = [made[r] for r in in_refs]
        outs = [_flat_values(made[r[:2]])[r[2]] for r in out_refs]
        in_names, out_names = config.get("input_names"), config.get("output_names")
        inputs = dict(zip(in_names, ins)) if isinstance(in_names, list) and len(in_names) == len(ins) else \
            ins[0] if bare["input_layers"] else ins
        outputs = dict(zip(out_names, outs)) if isinstance(out_names, list) and len(out_names) == len(outs) else \
            outs[0] if bare["output_layers"] else outs
        return cls(inputs, outputs, name=config.get("name"), trainable=config.get("trainable", True))


def _flat_values(value: Any) -> list:
    """A layer's result (a tensor, or a list/tuple/dict of them) as a flat list, in Keras's order."""
    if isinstance(value, (list, tuple)):
        return [v for item in value for v in _flat_values(item)]
    if isinstance(value, dict):
        return [v for item in value.values() for v in _flat_values(item)]
    return [value]


class _Shape:
    """A shape standing for a tensor while a config is sized (kept whole by :func:`_flat_values`)."""

    __slots__ = ("shape",)

    def __init__(self, shape: Any) -> None:
        self.shape = shape
