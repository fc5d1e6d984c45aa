"""``keras.tree``: nested structures (lists, tuples, namedtuples, dicts, deques) as Keras 3 walks them.

The semantics are those of Keras 3's optree implementation (``keras/src/tree/optree_impl.py``), written here
in pure Python:

* the nodes are ``list``, ``tuple``, ``collections.namedtuple`` classes, ``dict`` (its leaves in sorted key
  order; insertion order when the keys cannot be sorted), ``collections.OrderedDict`` (insertion order),
  ``collections.defaultdict`` (sorted) and ``collections.deque``; everything else is a leaf, ``None``
  included (``none_is_leaf=True``, Keras's choice), and so are strings and arrays;
* a rebuilt dict keeps the key order of the structure it was made from;
* two structures match when their nodes have the same types (a ``dict``, an ``OrderedDict`` and a
  ``defaultdict`` match each other), lengths and keys; :func:`assert_same_paths` only compares paths.

A shared leaf: standard library only.
"""

from __future__ import annotations

import collections
from typing import Any, Callable, Iterable

__all__ = ["MAP_TO_NONE", "assert_same_paths", "assert_same_structure", "flatten", "flatten_with_path", "is_nested",
           "lists_to_tuples", "map_shape_structure", "map_structure", "map_structure_up_to", "pack_sequence_as",
           "traverse"]


class MAP_TO_NONE:
    """Special value for :func:`traverse`: a function returning it replaces the subtree with ``None``."""


def _is_namedtuple(x: Any) -> bool:
    return isinstance(x, tuple) and hasattr(type(x), "_fields")


def _is_node(x: Any, none_is_leaf: bool = True) -> bool:
    if x is None:
        return not none_is_leaf
    return isinstance(x, (list, tuple, dict, collections.deque))


def _dict_keys(d: dict) -> list:
    if type(d) is collections.OrderedDict:
        return list(d)
    try:
        return sorted(d)
    except TypeError:  # keys of several types: insertion order
        return list(d)


def _children(x: Any) -> tuple[list, list]:
    """``(children, path entries)`` of a node."""
    if x is None:
        return [], []
    if isinstance(x, dict):
        keys = _dict_keys(x)
        return [x[k] for k in keys], keys
    items = list(x)
    return items, list(range(len(items)))


def _rebuild(node: Any, children: list) -> Any:
    """A node like ``node`` holding ``children`` (in :func:`_children`'s order)."""
    if node is None:
        return None
    if isinstance(node, dict):
        by_key = dict(zip(_dict_keys(node), children))
        ordered = [(k, by_key[k]) for k in node]  # the original key order
        if isinstance(node, collections.defaultdict):
            return type(node)(node.default_factory, ordered)
        return type(node)(ordered)
    if _is_namedtuple(node):
        return type(node)(*children)
    if isinstance(node, collections.deque):
        return collections.deque(children, maxlen=node.maxlen)
    if isinstance(node, tuple):
        return tuple(children) if type(node) is tuple else type(node)(children)
    return list(children) if type(node) is list else type(node)(children)


def _type_name(x: Any) -> str:
    if _is_namedtuple(x):
        return "collections.namedtuple"
    if isinstance(x, collections.OrderedDict):
        return "collections.OrderedDict"
    if isinstance(x, collections.defaultdict):
        return "collections.defaultdict"
    if isinstance(x, collections.deque):
        return "collections.deque"
    return type(x).__name__


def _check_like(node: Any, other: Any, none_is_leaf: bool) -> list:
    """``other``'s children in ``node``'s order, or the ValueError optree raises when ``other`` is not a
    node of the same kind (same type, length, keys)."""
    if isinstance(node, dict):
        if not isinstance(other, dict):
            raise ValueError(f"Expected an instance of dict, collections.OrderedDict, or collections.defaultdict, "
                             f"got {other!r}.")
        keys = _dict_keys(node)
        if set(other) != set(keys):
            got = _dict_keys(other)
            missing = [k for k in keys if k not in other]
            extra = [k for k in got if k not in node]
            raise ValueError(f"dictionary key mismatch; expected key(s): {keys}, got key(s): {got}, missing key(s): "
                             f"{missing}, extra key(s): {extra}; dict: {other!r}.")
        return [other[k] for k in keys]
    if node is None:
        if other is not None:
            raise ValueError(f"Expected an instance of NoneType, got {other!r}.")
        return []
    if type(other) is not type(node):
        raise ValueError(f"Expected an instance of {_type_name(node)}, got {other!r}.")
    if len(other) != len(node):
        kind = _type_name(node)
        kind = "namedtuple" if kind == "collections.namedtuple" else kind
        raise ValueError(f"{kind} arity mismatch; expected: {len(node)}, got: {len(other)}; {kind}: {other!r}.")
    return list(other)


def is_nested(structure: Any) -> bool:
    """Whether ``structure`` is a node (a list, tuple, namedtuple, dict or deque; empty ones too)."""
    return _is_node(structure)


def _flatten(structure: Any, out: list, none_is_leaf: bool = True, is_leaf: "Callable | None" = None) -> None:
    if (is_leaf is not None and is_leaf(structure)) or not _is_node(structure, none_is_leaf):
        out.append(structure)
        return
    for child in _children(structure)[0]:
        _flatten(child, out, none_is_leaf, is_leaf)


def flatten(structure: Any) -> list:
    """The leaves of ``structure`` in order (a dict's by sorted key): ``flatten([1, (2, {"b": 3, "a": 4})])``
    is ``[1, 2, 4, 3]``; a leaf gives ``[leaf]``."""
    out: list = []
    _flatten(structure, out)
    return out


def flatten_with_path(structure: Any) -> list[tuple[tuple, Any]]:
    """``[(path, leaf), ...]``: each path a tuple of the indices and keys leading to the leaf."""
    out: list = []

    def walk(x: Any, path: tuple) -> None:
        if not _is_node(x):
            out.append((path, x))
            return
        children, entries = _children(x)
        for child, entry in zip(children, entries):
            walk(child, path + (entry,))

    walk(structure, ())
    return out


def _paths(structure: Any) -> set:
    return {path for path, _ in flatten_with_path(structure)}


def _map(func: Callable, first: Any, rests: tuple, none_is_leaf: bool, leaf_check: "Callable | None",
         is_leaf: "Callable | None" = None) -> Any:
    """optree's ``tree_map``: the leaves of ``first`` decide the structure; ``rests`` must hold the same
    nodes down to them (their subtrees at those leaves are handed to ``func`` as they are)."""
    if (is_leaf is not None and is_leaf(first)) or not _is_node(first, none_is_leaf):
        if leaf_check is not None:
            leaf_check(first, *rests)
        return func(first, *rests)
    children = _children(first)[0]
    others = [_check_like(first, r, none_is_leaf) for r in rests]
    mapped = [_map(func, c, tuple(o[i] for o in others), none_is_leaf, leaf_check, is_leaf)
              for i, c in enumerate(children)]
    return _rebuild(first, mapped)


def _same_structure_check(none_is_leaf: bool) -> Callable:
    def check(*leaves: Any) -> None:
        if any(_is_node(x, none_is_leaf) for x in leaves):
            raise ValueError("Structures don't have the same nested structure.")
    return check


def map_structure(func: Callable, *structures: Any, none_is_leaf: bool = True) -> Any:
    """``func`` applied to the leaves of ``structures`` (which must have the same structure), in a new
    structure like the first. ``none_is_leaf=False`` leaves every ``None`` as it is (an empty node)."""
    if not structures:
        raise ValueError("Must provide at least one structure")
    if len(structures) == 1 and not _is_node(structures[0]):
        if structures[0] is None and not none_is_leaf:
            return None
        return func(structures[0])
    check = _same_structure_check(none_is_leaf) if len(structures) > 1 else None
    return _map(func, structures[0], structures[1:], none_is_leaf, check)


def map_structure_up_to(shallow_structure: Any, func: Callable, *structures: Any) -> Any:
    """``func`` applied to the subtrees of ``structures`` found at the leaves of ``shallow_structure``
    (each structure must hold ``shallow_structure``'s nodes), in a structure like ``shallow_structure``."""
    if not structures:
        raise ValueError("Must provide at least one structure")

    def apply(shallow: Any, *args: Any) -> Any:
        return func(*args)

    return _map(apply, shallow_structure, structures, True, None)


def assert_same_structure(a: Any, b: Any, check_types: Any = None) -> None:
    """Raise ``ValueError`` unless ``a`` and ``b`` have the same nodes (types, lengths, keys) and leaves
    in the same places. ``check_types`` is deprecated in Keras and has no effect."""
    if check_types is not None:
        import warnings  # (deferred: only the deprecated argument needs it)
        warnings.warn("The `check_types` argument is deprecated and no longer has any effect, please remove.",
                      DeprecationWarning, stacklevel=2)
    _map(lambda *_: None, a, (b,), True, _same_structure_check(True))


def assert_same_paths(a: Any, b: Any) -> None:
    """Raise ``ValueError`` unless ``a`` and ``b`` have the same set of leaf paths (a list and a tuple of
    one length match)."""
    a_paths, b_paths = _paths(a), _paths(b)
    if a_paths != b_paths:
        msg = "`a` and `b` don't have the same paths."
        a_diff = a_paths.difference(b_paths)
        if a_diff:
            msg += f"\nPaths in `a` missing in `b`:\n{a_diff}"
        b_diff = b_paths.difference(a_paths)
        if b_diff:
            msg += f"\nPaths in `b` missing in `a`:\n{b_diff}"
        raise ValueError(msg)


def pack_sequence_as(structure: Any, flat_sequence: Iterable) -> Any:
    """``flat_sequence``'s items put in the leaves of a structure like ``structure`` (the inverse of
    :func:`flatten`)."""
    if isinstance(flat_sequence, (str, bytes)) or not isinstance(flat_sequence, Iterable):
        raise TypeError(f"pack_sequence_as: flat_sequence must be a sequence (a list or tuple), got "
                        f"{type(flat_sequence).__name__}")
    flat = list(flat_sequence)
    count = len(flatten(structure))
    if len(flat) != count:
        word = "few" if len(flat) < count else "many"
        raise ValueError(f"Too {word} leaves for PyTreeSpec; expected: {count}, got: {len(flat)}.")
    leaves = iter(flat)
    return _map(lambda _: next(leaves), structure, (), True, None)


def traverse(func: Callable, structure: Any, top_down: bool = True) -> Any:
    """Apply ``func`` to every node and leaf of ``structure``.

    Top-down, a non-None result replaces the subtree (it is not traversed further); None keeps traversing
    its children. Bottom-up, ``func`` sees each subtree after its children were traversed, and a non-None
    result replaces it. :class:`MAP_TO_NONE` as a result stands for ``None``."""

    def children_traversed(x: Any) -> Any:
        if not _is_node(x):
            return x
        return _rebuild(x, [traverse(func, c, top_down=top_down) for c in _children(x)[0]])

    if top_down:
        ret = func(structure)
        if ret is None:
            return children_traversed(structure)
    else:
        traversed = children_traversed(structure)
        ret = func(traversed)
        if ret is None:
            return traversed
    if isinstance(ret, type) and ret.__name__ == "MAP_TO_NONE":
        return None
    return ret


def lists_to_tuples(structure: Any) -> Any:
    """``structure`` with every list made a tuple (at every depth)."""
    return traverse(lambda x: tuple(x) if isinstance(x, list) else None, structure, top_down=False)


def _is_shape_tuple(x: Any) -> bool:
    return isinstance(x, (list, tuple)) and all(isinstance(e, (int, type(None))) for e in x)


def map_shape_structure(func: Callable, structure: Any) -> Any:
    """:func:`map_structure` for a structure of shapes: a list or tuple of ints and ``None`` is a leaf."""
    return _map(func, structure, (), True, None, is_leaf=_is_shape_tuple)
