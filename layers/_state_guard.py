"""State made inside ``call`` is refused from a layer's second call on.

A layer (or subclassed model) whose ``call`` creates a layer holding weights, or assigns a new layer to an
attribute of an already built layer, gets fresh random weights on every call: nothing trains them, no file
saves them, and its predictions change from call to call. Keras 3 locks a layer's state when it is built
("You cannot add new elements of state (variables or sub-layers) to a layer that is already built"): an
assignment of a new sublayer inside ``call`` raises there. A layer made inside ``call`` and only applied
(``layers.Dense(2)(x)``) passes in Keras, untracked; here it is refused too when it holds weights.

What is checked, around each outermost eager call of a layer that defines ``call`` (a user's layer, a
model), from its second call on (its first call may still create what it lacks, lazily, and track it):

* a layer newly reachable from the called one (attributes, lists and dicts of them, a model's graph
  layers) whose holder was built before the call: assigned inside ``call``;
* a weight made during the call by a layer the called one cannot reach: a layer created inside ``call``.

Layers made inside ``call`` without weights (``layers.Activation("relu")(x)``, ``layers.add([a, b])``)
pass: they hold no state to lose. A sublayer built for the first time during a later call (a branch
taken late) may make weights and sublayers in its ``build``: it was not built before the call, so that
passes too.

The fast path is two reads of the structure version (which moves whenever a layer or variable is
tracked or a weight made): only a call during which it moved walks the layers. The walk of the layers
before the call is kept per structure version on the called layer.

A leaf of :mod:`dnnbind.layers`: it knows layers only by the attributes base.py gives them.
"""

from __future__ import annotations

import threading
from typing import Any, Callable

__all__ = ["CallWatch", "note_weight"]

_local = threading.local()
_ARMED = "_state_guard_armed"  # set in a layer's __dict__ after its first call returned
_TREE = "_state_guard_tree"  # (structure version, ids of the reachable layers, ids of those built)


def note_weight(weight: Any) -> None:
    """Called for every weight made (``Layer._add_weight``): noted by the calls being watched."""
    watches = getattr(_local, "made", None)
    if watches:
        for made in watches:
            made.append(weight)


def _children(layer: Any) -> list:
    kids = layer._sublayers()
    inner = layer._inner_layers()  # a model's own layers (a functional graph's, a Sequential's)
    if inner is not kids and inner:
        kids = list(kids) + [k for k in inner if not any(k is o for o in kids)]
    return kids


def _reachable(root: Any) -> "tuple[dict[int, Any], dict[int, Any]]":
    """``{id: layer}`` of every layer reachable from ``root`` (root included) and ``{id(child): holder}``."""
    nodes = {id(root): root}
    holders: dict[int, Any] = {}
    stack = [root]
    while stack:
        layer = stack.pop()
        for child in _children(layer):
            if id(child) not in nodes:
                nodes[id(child)] = child
                holders[id(child)] = layer
                stack.append(child)
    return nodes, holders


def _snapshot(root: Any, version: int) -> tuple:
    nodes, _ = _reachable(root)
    built = frozenset(i for i, layer in nodes.items() if layer is root or layer.__dict__.get("built"))
    tree = (version, frozenset(nodes), built)
    root.__dict__[_TREE] = tree
    return tree


def _owner(layer: Any) -> str:
    return f"{type(layer).__name__} '{layer.name}'"


def _attribute_of(holder: Any, child: Any) -> str:
    """How ``holder`` holds ``child``: ``self.<name>`` (``[i]``/``['key']`` inside a list or dict)."""
    for name, value in (holder.__dict__.get("_tracked") or {}).items():
        value = holder.__dict__.get(name, value)
        if value is child:
            return f"self.{name}"
        if isinstance(value, (list, tuple)) and any(v is child for v in value):
            return f"self.{name}[{next(i for i, v in enumerate(value) if v is child)}]"
        if isinstance(value, dict) and any(v is child for v in value.values()):
            return f"self.{name}[{next(k for k, v in value.items() if v is child)!r}]"
    return "an attribute"


_ADVICE = ("create sublayers in __init__ (or, when they depend on the input shape, in build) and only apply "
           "them in call")


def _check(root: Any, before: tuple, made: list, version: int) -> None:
    nodes, holders = _reachable(root)
    _, old, old_built = before
    for i, layer in nodes.items():
        holder = holders.get(i)
        if i in old or holder is None or id(holder) not in old_built:
            continue
        raise ValueError(
            f"{_owner(root)}: a call after the first assigned a new layer, {_owner(layer)}, to {_owner(holder)} "
            f"({_attribute_of(holder, layer)}), which was already built: a layer created or re-assigned inside "
            f"call is new on every call, so its weights are never trained or saved (Keras 3 refuses it too: "
            f"'You cannot add new elements of state to a layer that is already built'); {_ADVICE}")
    lost: dict[int, list] = {}
    for weight in made:
        owner = weight.layer
        if id(owner) not in nodes:
            lost.setdefault(id(owner), [owner]).append(weight.name)
    if lost:
        described = "; ".join(f"{_owner(entry[0])} (weights {', '.join(entry[1:])})" for entry in lost.values())
        raise ValueError(
            f"{_owner(root)}: a call after the first created layer(s) holding weights that {_owner(root)} does "
            f"not track: {described}. A layer created inside call is new on every call (fresh random weights "
            f"each time, none of them trained or saved: {_owner(root)} tracks {len(root.weights)} weight(s)); "
            f"{_ADVICE}, assigned to self")
    _snapshot(root, version)


class CallWatch:
    """Around one outermost eager call of ``layer`` (a context manager; ``structure_version`` is base.py's). Raises ValueError after the call when it made state it must not."""

    __slots__ = ("layer", "version", "before", "made", "_structure_version")

    def __init__(self, layer: Any, structure_version: Callable[[], int]) -> None:
        self.layer = layer
        self._structure_version = structure_version
        self.before = None
        self.made: "list | None" = None

    def __enter__(self) -> "CallWatch":
        d = self.layer.__dict__
        if not d.get(_ARMED):
            return self
        self.version = version = self._structure_version()
        tree = d.get(_TREE)
        self.before = tree if tree is not None and tree[0] == version else _snapshot(self.layer, version)
        self.made = []
        stack = getattr(_local, "made", None)
        if stack is None:
            stack = _local.made = []
        stack.append(self.made)
        return self

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        if self.made is None:
            if exc_type is None:
                self.layer.__dict__[_ARMED] = True
            return
        stack = _local.made
        del stack[next(i for i in range(len(stack) - 1, -1, -1) if stack[i] is self.made)]
        if exc_type is None:
            version = self._structure_version()
            if version != self.version:
                _check(self.layer, self.before, self.made, version)
