"""The one backward engine: nodes recorded by differentiable operations, and reverse accumulation.

While a :class:`~dnnbind.autodiff.GradientTape` is active in the current thread, every differentiable
operation whose inputs need a gradient records a :class:`Node`: the edges to the nodes that produced
its inputs, and a vector-Jacobian product (``vjp(node, *output_grads) -> input grads``) that keeps only
what the backward needs (Chainer's ``FunctionNode``; PyTorch's ``autograd.Function``). Tensors point
to the node that made them (``Tensor._node``, ``Tensor._index``); nodes never point to their outputs,
so the graph has no reference cycle and dies with the last tensor that can reach it (refcounting,
never the cyclic collector, which is off during a CUDA-graph capture).

:func:`gradient` walks the nodes reachable from the targets in reverse creation order (a node is made
after the nodes of its inputs, so creation order is a topological order), sums the gradients of an
output read by several operations, and runs only the VJPs of nodes that lead to a requested source.
Sources are leaves (:class:`Leaf`: a variable, or a tensor a tape watches) or any recorded tensor.

A VJP receives tensors and returns tensors (or raw arrays, wrapped as constants). VJPs written in
``dnnbind.ops`` are themselves recorded when a tape is active during :func:`gradient` (an outer tape:
higher-order gradients). A VJP that calls kernels directly (a hand-fused backward) is marked
``once_differentiable``: differentiating its result again raises an error naming the operation
instead of returning a wrong zero.
"""

from __future__ import annotations

import itertools
import operator
import threading
from typing import Any, Callable, Sequence

__all__ = ["Node", "Leaf", "recording", "record", "attach", "gradient", "stop_recording", "active_tapes", "hooks",
           "FilledTensor"]

_seq = itertools.count(1)
_local = threading.local()


class _Hooks:
    """Functions of the ops room the engine needs (installed by :mod:`dnnbind.ops` on import: the
    engine sits below it). ``add(a, b)``: the differentiable sum of two gradients; ``wrap(x)``: a raw
    array or number as a constant Tensor (``tensor``: that class); ``materialize(filled)``: a
    :class:`FilledTensor`'s array."""

    ops: Any = None  # the dnnbind.ops module itself
    add: Callable[[Any, Any], Any] = None  # type: ignore[assignment]
    wrap: Callable[[Any], Any] = None  # type: ignore[assignment]
    tensor: type = None  # type: ignore[assignment]  # the Tensor class (what ``wrap`` returns as it is)
    materialize: Callable[[Any], Any] = None  # type: ignore[assignment]
    seed: Callable[[Any], Any] = None  # type: ignore[assignment]


hooks = _Hooks()


# (the thread's state read as attributes, AttributeError until its first tape: every op asks)
def _tapes() -> list:
    try:
        return _local.tapes
    except AttributeError:
        tapes = _local.tapes = []
        _local.paused = 0
        return tapes


def active_tapes() -> list:
    """The tapes recording in this thread (innermost last); empty while recording is stopped."""
    tapes = _tapes()
    return [] if _local.paused else tapes


def recording() -> bool:
    """Whether differentiable operations record nodes now (a tape is active and not stopped)."""
    try:
        return not _local.paused if _local.tapes else False
    except AttributeError:  # no tape ever in this thread
        return False


class stop_recording:
    """``with stop_recording():`` operations inside record nothing (TensorFlow's
    ``tape.stop_recording()``, PyTorch's ``no_grad``)."""

    def __enter__(self) -> "stop_recording":
        _tapes()
        _local.paused += 1
        return self

    def __exit__(self, *exc: Any) -> None:
        _local.paused -= 1


class Node:
    """One application of a differentiable operation.

    ``edges``: per input, ``(node, output index)`` of what produced it, or None for an input that
    needs no gradient. ``vjp(node, *grads)``: given the gradients of the outputs (a Tensor or None per
    output), returns one gradient per input (None where there is none). ``needs_input_grad`` is set
    by :func:`gradient` before the call (a VJP may skip the gradients nobody asked for).
    ``saved`` is free for the VJP's use; ``outputs_raw`` are the raw output arrays when the VJP asked
    for them (:meth:`output`)."""

    __slots__ = ("seq", "edges", "vjp", "n_outputs", "name", "needs_input_grad", "saved", "outputs_raw",
                 "once_differentiable", "holders", "emit", "__weakref__")

    is_leaf = False

    def __init__(self, edges: tuple, vjp: "Callable | None", n_outputs: int, name: str,
                 once_differentiable: bool = False) -> None:
        self.seq = next(_seq)
        self.edges = edges
        self.vjp = vjp
        self.n_outputs = n_outputs
        self.name = name
        self.needs_input_grad: tuple = ()
        self.saved: Any = None
        self.outputs_raw: Any = None
        self.once_differentiable = once_differentiable
        self.holders = 0
        # set by gradient() while the VJP runs, when its caller hears of final leaf gradients (on_leaf):
        # emit(i, grad) delivers input i's gradient before the VJP returns (it then returns None there), so a
        # leaf's final gradient can be reported early (the data-parallel all-reduce of a weight overlaps the
        # rest of the backward, as DDP's hooks do); None otherwise, and the VJP returns every gradient
        self.emit = None

    def output(self, index: int = 0) -> Any:
        """Output ``index`` as a tensor connected to this node (for VJPs that read their result, e.g.
        ``exp``): rebuilt from ``outputs_raw`` on demand, so the node holds no tensor of its own."""
        raw = self.outputs_raw[index]
        t = hooks.wrap(raw)
        t._node, t._index = self, index
        return t

    def release(self) -> None:
        """Drop what the backward needed (after the last tape that may run it has)."""
        self.vjp = None
        self.saved = None
        self.outputs_raw = None

    def __repr__(self) -> str:
        return f"<Node {self.name} #{self.seq} inputs={len(self.edges)} outputs={self.n_outputs}>"


class Leaf(Node):
    """A gradient source: a variable, or a tensor a tape watches. It has no inputs."""

    __slots__ = ("owner",)
    is_leaf = True

    def __init__(self, owner: Any) -> None:
        super().__init__((), None, 1, f"leaf of {type(owner).__name__}")
        self.owner = owner  # what gradient(..., sources) names; a Variable keeps its leaf alive itself


def record(raw_outputs: "Any | tuple", edges: tuple, vjp: Callable, name: str, *, keep_outputs: bool = False,
           once_differentiable: bool = False, multiple: bool = False) -> "Any | tuple":
    """Wrap ``raw_outputs`` (one raw array, or a tuple when ``multiple``) as tensors made by a new node with
    ``edges`` and ``vjp``. Call only when :func:`recording` and some edge is not None (the ops check)."""
    outs = raw_outputs if multiple else (raw_outputs,)
    node = Node(edges, vjp, len(outs), name, once_differentiable)
    if keep_outputs:
        node.outputs_raw = tuple(outs)
    tapes = _tapes()
    node.holders = len(tapes)
    for t in tapes:
        if t._persistent:
            node.holders = -1  # a persistent tape keeps every node it recorded
            break
    wrap = hooks.wrap
    result = []
    for i, raw in enumerate(outs):
        t = wrap(raw)
        t._node, t._index = node, i
        result.append(t)
    return tuple(result) if multiple else result[0]


def attach(t: Any, edges: tuple, vjp: Callable, name: str) -> Any:
    """Make ``t`` (an existing tensor, e.g. a lazy view) the one output of a new node with ``edges`` and
    ``vjp``, as :func:`record` does for the tensors it wraps. Call only when :func:`recording`."""
    node = Node(edges, vjp, 1, name)
    node.holders = -1 if any(tape._persistent for tape in _tapes()) else len(_tapes())
    t._node, t._index = node, 0
    return t


class FilledTensor:
    """Marker base for tensors whose every element is one host-known number (``value``) and whose array is
    made only when someone reads ``data``: the seed of a backward (ones), a gradient scaled by a Python
    number. VJPs with a fast path for them (a fused loss whose gradient is already computed, ``sum``,
    ``mean``) test ``isinstance(g, FilledTensor)``. The concrete class lives in :mod:`dnnbind.autodiff.tensor`."""

    __slots__ = ()


def _accumulate(old: Any, new: Any) -> Any:
    return new if old is None else hooks.add(old, new)


def gradient(targets: Sequence[Any], seeds: Sequence[Any], sources: Sequence[Any], *, tape: Any = None,
             release: bool = True, on_leaf: "Callable[[Any, Any], None] | None" = None, raw: bool = False) -> list:
    """Gradients of ``targets`` (tensors), seeded with ``seeds`` (one tensor per target, the gradient of
    the final scalar w.r.t. it), w.r.t. ``sources`` (leaves' owners or recorded tensors): one entry per
    source, None when unconnected.

    ``tape``: the tape asking (its non-persistent nodes are released after their VJP runs, unless another
    tape that was active when they were recorded still holds them). ``on_leaf(owner, grad)``: called once
    per source leaf as soon as its gradient is final (every node that read it has delivered), before the
    sweep ends. ``raw``: the results (and what ``on_leaf`` gets) are raw arrays, not tensors (a training step
    hands them to the optimizer), and a raw array a VJP gives a leaf is kept as it is, never wrapped."""
    # (nodes are dict keys by identity: Node defines no __eq__/__hash__)
    # --- the keys of the sources: leaves by owner, recorded tensors by (node, index)
    want: dict = {}
    for i, s in enumerate(sources):
        try:  # a Variable: its leaf (None until first read while recording)
            node, index = s._leaf, 0
        except AttributeError:  # a recorded tensor (or something unconnected)
            node, index = getattr(s, "_node", None), getattr(s, "_index", 0)
        if node is not None:
            key = (node, index)
            if key in want:
                want[key].append(i)
            else:
                want[key] = [i]
    # --- the non-leaf nodes reachable from the targets (a leaf has no inputs and no VJP: the sweep has nothing
    # to do there), inputs before their consumers, and which of them lead to a source. ``relevant`` starts
    # with every source node: for the nodes reached, that is the same as the sources reached.
    stack = [node for node in (getattr(t, "_node", None) for t in targets) if node is not None]
    seen: set = set()
    while stack:
        node = stack.pop()
        if node in seen:
            continue
        seen.add(node)
        for edge in node.edges:
            if edge is not None and not edge[0].is_leaf and edge[0] not in seen:
                stack.append(edge[0])
    order = sorted(seen, key=_SEQ)
    relevant = {k[0] for k in want}
    for node in order:
        if node in relevant:
            continue
        for e in node.edges:
            if e is not None and e[0] in relevant:
                relevant.add(node)
                break
    # --- seeds
    grads: dict = {}
    for t, g in zip(targets, seeds):
        node = getattr(t, "_node", None)
        if node is None or node not in relevant:
            continue
        key = (node, t._index)
        grads[key] = _accumulate(grads.get(key), g)
    results: list = [None] * len(sources)
    interval = None if tape is None else (tape._first_seq, tape._last_seq)
    # --- how many deliveries each source leaf waits for (to report it as soon as it is final)
    pending: dict = {}
    if on_leaf is not None:
        for node in order:
            if node in relevant and not node.is_leaf:
                for e in node.edges:
                    if e is not None and e[0].is_leaf and (e[0], 0) in want:
                        pending[e[0]] = pending.get(e[0], 0) + 1
    wrap, tensor_type = hooks.wrap, hooks.tensor
    outer_tape = recording()  # (a tape records this backward: a once-differentiable VJP's results are poisoned)

    def deliver(edge: tuple, g: Any, poison: bool, node: Node) -> None:
        if g.__class__ is not tensor_type and (poison or not raw or not edge[0].is_leaf):
            g = wrap(g)  # (a tensor subclass as it is; a raw array as a constant)
        if poison:
            g = _poisoned(g, node)
        old = grads[edge] if edge in grads else None
        grads[edge] = g if old is None else hooks.add(wrap(old), wrap(g))  # (wrap: a raw leaf gradient)
        if pending:
            target = edge[0]
            left = pending.get(target)
            if left is not None:
                pending[target] = left - 1
                if left == 1:
                    g = grads[edge]
                    on_leaf(target.owner, g.data if raw and isinstance(g, tensor_type) else g)

    # --- reverse sweep (a source's gradient stays in ``grads``: it is final once its node comes up, and it
    # is read into ``results`` after the sweep)
    for node in reversed(order):
        if node.is_leaf or node not in relevant:
            continue
        if node.n_outputs == 1:
            key = (node, 0)
            g = grads.get(key) if key in want else grads.pop(key, None)
            if g is None:
                continue
            outs = (g,)
        else:
            outs = tuple(grads.get((node, i)) if (node, i) in want else grads.pop((node, i), None)
                         for i in range(node.n_outputs))
            if all(g is None for g in outs):
                continue
        if node.vjp is None:
            raise RuntimeError(
                f"the backward of {node.name} was already run and its saved tensors were freed: a "
                "non-persistent GradientTape computes one set of gradients; use "
                "GradientTape(persistent=True) to call gradient() more than once")
        edges = node.edges
        needs = node.needs_input_grad = tuple([e is not None and e[0] in relevant for e in edges])
        poison = node.once_differentiable and outer_tape
        emitted: set = set()
        if on_leaf is not None:  # early delivery matters only to whoever hears of final leaf gradients

            def emit(i: int, g: Any, _node: Node = node, _emitted: set = emitted, _poison: bool = poison) -> None:
                if g is not None and _node.needs_input_grad[i] and i not in _emitted:
                    _emitted.add(i)
                    deliver(_node.edges[i], g, _poison, _node)

            node.emit = emit
            try:
                in_grads = node.vjp(node, *outs)
            finally:
                node.emit = None
        else:
            in_grads = node.vjp(node, *outs)
        if not isinstance(in_grads, (tuple, list)):
            in_grads = (in_grads,)
        if len(in_grads) != len(edges):
            raise RuntimeError(f"the VJP of {node.name} returned {len(in_grads)} gradients for "
                               f"{len(edges)} inputs")
        for i, g in enumerate(in_grads):
            if g is None or not needs[i] or (emitted and i in emitted):
                continue
            deliver(edges[i], g, poison, node)
        if release and interval is not None and node.holders > 0 and interval[0] <= node.seq <= interval[1]:
            node.holders -= 1
            if node.holders == 0:
                node.release()
    for key, positions in want.items():
        g = grads[key] if key in grads else None
        if raw and g is not None and isinstance(g, tensor_type):
            g = g.data
        for j in positions:
            results[j] = g
    return results


_SEQ = operator.attrgetter("seq")


def _poisoned(g: Any, node: Node) -> Any:
    """``g`` as the output of a node that refuses to be differentiated (a once-differentiable VJP's result
    seen by an outer tape)."""
    def refuse(_node: Node, *_grads: Any) -> tuple:
        raise NotImplementedError(
            f"{node.name} has a hand-written backward that is differentiable only once; a second-order "
            "gradient through it (a gradient penalty, a Hessian) needs the layer written in dnnbind.ops")

    edges = tuple(e for e in node.edges)
    return record(g.data, edges, refuse, f"second derivative of {node.name}")
