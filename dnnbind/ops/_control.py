"""Control flow of ``keras.ops`` (``keras.ops.core``): ``cond``, ``switch``, ``while_loop``, ``fori_loop``,
``scan``, ``map``, ``vectorized_map`` and ``associative_scan``, with Keras's signatures and JAX's
semantics (nested lists, tuples and dicts as pytrees; a loop carry keeps its structure, shapes and
dtypes).

dnnbind runs them eagerly: Python loops over the ops, so a tape records every iteration and gradients
flow through loops and branches (also through tensors the functions close over), to any order.
``scan``'s ``unroll`` is validated and has no other effect (it shapes a compiled loop; eagerly every
iteration runs anyway). ``associative_scan`` is the log-depth (Blelloch/JAX) algorithm on ops, so it
is differentiable too.

**Host reads.** A predicate (``cond``, ``while_loop``'s ``cond``), a ``switch`` index and ``fori_loop``'s
bounds decide which Python code runs, so a tensor there is read on the host: on a GPU that waits for
its stream (data-dependent control flow synchronises, as in PyTorch eager).
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from ..autodiff.engine import stop_recording
from ..autodiff.tape import _flatten as _tree_flatten  # the tapes' own pytree walk (nested list/tuple/dict)
from ..autodiff.tensor import Tensor
from ..kernels import numeric as N
from . import _core
from ._core import keras_op
from ._shape import concatenate, flip, get_item, reshape, stack

__all__ = ["cond", "switch", "while_loop", "fori_loop", "scan", "map", "vectorized_map", "associative_scan"]


# ---------------------------------------------------------------------------------------- pytrees
def _structure(tree: Any) -> Any:
    """A comparable description of ``tree``'s nesting (leaves are ``None``)."""
    if isinstance(tree, dict):
        return ("dict", tuple((k, _structure(v)) for k, v in tree.items()))
    if isinstance(tree, (list, tuple)):
        return (type(tree).__name__, tuple(_structure(v) for v in tree))
    return None


def _as_tensors(tree: Any) -> Any:
    """``tree`` with every leaf a tensor (None leaves stay None)."""
    leaves, rebuild = _tree_flatten(tree)
    return rebuild([None if v is None else _core.tensor(v) for v in leaves])


def _weak(value: Any) -> bool:
    """Whether a leaf is a Python number (weakly typed: ``_core.tensor`` and ``result_type`` treat it so)."""
    return isinstance(value, (bool, int, float, complex))


def _check_same(op: str, what: str, before: Any, after: Any, weak: "list | None" = None) -> None:
    """``after`` must have ``before``'s structure and its leaves' shapes and dtypes (a leaf that came from
    a Python number may change dtype: it is weakly typed, as in JAX)."""
    if _structure(before) != _structure(after):
        raise TypeError(f"{op}: the {what} must keep its structure across iterations; it went from "
                        f"{_structure(before)} to {_structure(after)}")
    old, _ = _tree_flatten(before)
    new, _ = _tree_flatten(after)
    for i, (a, b) in enumerate(zip(old, new)):
        if a is None or b is None:
            continue
        sa, sb = tuple(np.shape(a)), tuple(np.shape(b))
        if sa != sb:
            raise TypeError(f"{op}: the {what} must keep its shapes across iterations; leaf {i} went from {sa} to "
                            f"{sb}")
        da, db = _core.dtype_of(a), _core.dtype_of(b)
        if da != db and not (weak and weak[i]):
            raise TypeError(f"{op}: the {what} must keep its dtypes across iterations; leaf {i} went from {da} to {db} "
                            "(cast it in the body)")


def _predicate(op: str, pred: Any) -> bool:
    """A scalar predicate as a Python bool (a tensor is read on the host: the branch taken depends on it)."""
    if isinstance(pred, (bool, np.bool_)) or (isinstance(pred, (int, float, np.number)) and not isinstance(pred, Tensor)):
        return bool(pred)
    (t,) = _core.tensors(pred)
    if t.ndim != 0:
        raise ValueError(f"{op}: the predicate must be a scalar (shape ()), got shape {t.shape}")
    return bool(t)


def _host_int(op: str, name: str, value: Any) -> int:
    """An integer argument that decides which code runs (a tensor is read on the host)."""
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        return int(value)
    (t,) = _core.tensors(value)
    if t.ndim != 0 or t.dtype.kind not in "iu":
        raise TypeError(f"{op}: {name} must be an integer scalar, got shape {t.shape} and dtype {t.dtype}")
    return int(t)


def _callable(op: str, name: str, f: Any) -> None:
    if not callable(f):
        raise TypeError(f"{op}: {name} must be a callable, got {type(f).__name__}")


# --------------------------------------------------------------------------------------- branches
@keras_op(family="core", differentiable=False)
def cond(pred: Any, true_fn: Callable, false_fn: Callable) -> Any:
    """``keras.ops.cond``: ``true_fn()`` if ``pred`` else ``false_fn()``. ``pred`` (a scalar) is read on the
    host. Gradients flow through the branch taken (its ops, and the tensors it closes over)."""
    _callable("cond", "true_fn", true_fn)
    _callable("cond", "false_fn", false_fn)
    return true_fn() if _predicate("cond", pred) else false_fn()


@keras_op(family="core")
def switch(index: Any, branches: Any, *operands: Any) -> Any:
    """``keras.ops.switch``: ``branches[index](*operands)``, ``index`` clamped into range (read on the host
    when it is a tensor). Differentiable in the operands."""
    branches = list(branches)
    if not branches:
        raise ValueError("switch: branches must hold at least one function")
    for i, b in enumerate(branches):
        _callable("switch", f"branches[{i}]", b)
    i = min(max(_host_int("switch", "index", index), 0), len(branches) - 1)
    return branches[i](*operands)


# ------------------------------------------------------------------------------------------ loops
@keras_op(family="core")
def while_loop(cond: Callable, body: Callable, loop_vars: Any, maximum_iterations: "int | None" = None) -> Any:
    """``keras.ops.while_loop``: ``loop_vars = body(*loop_vars)`` while ``cond(*loop_vars)`` (read on the
    host each iteration) and fewer than ``maximum_iterations`` ran. A tuple or list of loop variables is
    passed positionally and a tuple is returned; anything else is one variable. Each variable keeps its
    structure, shape and dtype. Differentiable (every iteration is recorded; JAX's ``while_loop`` is not
    reverse-differentiable, TensorFlow's and PyTorch's are)."""
    _callable("while_loop", "cond", cond)
    _callable("while_loop", "body", body)
    is_tuple = isinstance(loop_vars, (tuple, list))
    state = tuple(loop_vars) if is_tuple else (loop_vars,)
    weak = [_weak(v) for v in _tree_flatten(state)[0]]
    state = _as_tensors(state)
    count = 0
    while (maximum_iterations is None or count < int(maximum_iterations)) and _predicate("while_loop", cond(*state)):
        new = body(*state)
        new = tuple(new) if isinstance(new, (tuple, list)) else (new,)
        if len(new) != len(state):
            raise TypeError(f"while_loop: body must return {len(state)} loop variable(s), got {len(new)}")
        new = _as_tensors(new)
        _check_same("while_loop", "loop variables", state, new, weak)
        state = new
        count += 1
    return state if is_tuple else state[0]


@keras_op(family="core")
def fori_loop(lower: Any, upper: Any, body_fun: Callable, init_val: Any) -> Any:
    """``keras.ops.fori_loop``: ``val = body_fun(i, val)`` for ``i`` in ``range(lower, upper)`` (``i`` a
    Python int; tensor bounds are read on the host). Differentiable in ``init_val``."""
    _callable("fori_loop", "body_fun", body_fun)
    lo, hi = _host_int("fori_loop", "lower", lower), _host_int("fori_loop", "upper", upper)
    weak = [_weak(v) for v in _tree_flatten(init_val)[0]]
    val = _as_tensors(init_val)
    for i in range(lo, hi):
        new = _as_tensors(body_fun(i, val))
        _check_same("fori_loop", "loop state", val, new, weak)
        val = new
    return val


def _stack_outputs(op: str, ys: list) -> Any:
    """Per-iteration outputs (one structure) stacked on a new leading axis per leaf."""
    first = ys[0]
    if all(y is None for y in ys):
        return None
    leaves0, rebuild = _tree_flatten(first)
    columns = [[] for _ in leaves0]
    for y in ys:
        if _structure(y) != _structure(first):
            raise TypeError(f"{op}: every iteration must return outputs of one structure; got {_structure(first)} "
                            f"and {_structure(y)}")
        for col, leaf in zip(columns, _tree_flatten(y)[0]):
            col.append(_core.tensor(leaf))
    return rebuild([stack(col) for col in columns])


def _leading(op: str, xs: Any) -> "tuple[list, Any, int]":
    """The leaves of ``xs`` as tensors, its rebuild function and the common leading length."""
    leaves, rebuild = _tree_flatten(xs)
    ts = [_core.tensor(v) for v in leaves]
    for t in ts:
        if t.ndim == 0:
            raise ValueError(f"{op}: every array to scan over needs a leading axis, got a scalar")
    sizes = {int(t.shape[0]) for t in ts}
    if len(sizes) > 1:
        raise ValueError(f"{op}: the arrays to scan over have different leading sizes {sorted(sizes)}")
    return ts, rebuild, (sizes.pop() if sizes else 0)


def _empty_outputs(op: str, f: Callable, carry: Any, x_leaves: list, x_rebuild: Any) -> Any:
    """The outputs of a loop of zero iterations: ``f`` runs once unrecorded on zero slices to learn their
    shapes (JAX traces it), and each output leaf becomes an empty stack of that shape."""
    x = x_rebuild([Tensor(N.full(tuple(t.shape[1:]), 0, t.dtype, device=t.device)) for t in x_leaves]) \
        if x_rebuild is not None else None
    with stop_recording():
        _, y = f(carry, x)
    if y is None:
        return None
    leaves, rebuild = _tree_flatten(y)
    out = []
    for leaf in leaves:
        t = _core.tensor(leaf)
        out.append(Tensor(N.full((0,) + tuple(t.shape), 0, t.dtype, device=t.device)))
    return rebuild(out)


def _scan(op: str, f: Callable, init: Any, xs: Any, length: Any, reverse: bool) -> tuple:
    if xs is None and length is None:
        raise ValueError(f"{op}: got no xs to scan over and no length")
    if xs is not None:
        x_leaves, x_rebuild, n = _leading(op, xs)
        if length is not None and int(length) != n:
            raise ValueError(f"{op}: length={length} does not match the leading size {n} of xs")
    else:
        x_leaves, x_rebuild, n = [], None, int(length)
    weak = [_weak(v) for v in _tree_flatten(init)[0]]
    carry = _as_tensors(init)
    if n == 0:
        return carry, _empty_outputs(op, f, carry, x_leaves, x_rebuild)
    ys = []
    for i in (range(n - 1, -1, -1) if reverse else range(n)):
        x = x_rebuild([get_item(t, i) for t in x_leaves]) if x_rebuild is not None else None
        result = f(carry, x)
        if not isinstance(result, (tuple, list)) or len(result) != 2:
            raise TypeError(f"{op}: f must return a pair (carry, y), got {type(result).__name__}")
        new = _as_tensors(result[0])
        _check_same(op, "carry", carry, new, weak)
        carry = new
        ys.append(result[1])
    if reverse:
        ys.reverse()
    return carry, _stack_outputs(op, ys)


@keras_op(family="core")
def scan(f: Callable, init: Any, xs: Any = None, length: "int | None" = None, reverse: bool = False,
         unroll: Any = 1) -> tuple:
    """``keras.ops.scan``: ``carry, y = f(carry, x)`` over the leading axis of ``xs`` (a pytree; None with
    ``length``), returning the final carry and the ``y``s stacked (``reverse``: from the end, ys kept in
    order; ``y`` None: None). The carry keeps its structure, shapes and dtypes. ``unroll``: a positive
    int or a bool (no effect eagerly). Differentiable in ``init`` and ``xs``."""
    _callable("scan", "f", f)
    if not isinstance(unroll, bool) and (not isinstance(unroll, (int, np.integer)) or unroll < 1):
        raise ValueError(f"scan: unroll must be a positive integer or a bool, got unroll={unroll!r}")
    return _scan("scan", f, init, xs, length, bool(reverse))


def _map(op: str, f: Callable, xs: Any) -> Any:
    _callable(op, "f" if op == "map" else "function", f)
    _, ys = _scan(op, lambda carry, x: ((), f(x)), (), xs, None, False)
    return ys


@keras_op(family="core")
def map(f: Callable, xs: Any) -> Any:  # noqa: A001 (Keras's name)
    """``keras.ops.map``: ``f`` applied to each slice of ``xs`` (a pytree) along its leading axis, the
    results stacked (a pytree of stacks). Differentiable in ``xs``."""
    return _map("map", f, xs)


@keras_op(family="core")
def vectorized_map(function: Callable, elements: Any) -> Any:
    """``keras.ops.vectorized_map``: ``function`` on each slice of ``elements`` along axis 0, stacked (JAX's
    ``vmap`` semantics: a tuple, list or dict of tensors gives the function one of the same structure).
    dnnbind runs it as a loop (``map``); differentiable in ``elements``."""
    return _map("vectorized_map", function, elements)


# ------------------------------------------------------------------------------- associative scan
def _slice_axis(t: Tensor, start: "int | None", stop: "int | None", step: "int | None", axis: int) -> Tensor:
    key = [slice(None)] * t.ndim
    key[axis] = slice(start, stop, step)
    return get_item(t, tuple(key))


def _interleave(a: Tensor, b: Tensor, axis: int) -> Tensor:
    """``[a0, b0, a1, b1, ...]`` along ``axis`` (``a`` as long as ``b`` or one longer)."""
    na, nb = int(a.shape[axis]), int(b.shape[axis])
    head = a if na == nb else _slice_axis(a, 0, nb, None, axis)
    pairs = stack([head, b], axis=axis + 1)
    shape = list(head.shape)
    shape[axis] = 2 * nb
    merged = reshape(pairs, tuple(shape))
    return merged if na == nb else concatenate([merged, _slice_axis(a, nb, None, None, axis)], axis=axis)


@keras_op(family="core")
def associative_scan(f: Callable, elems: Any, reverse: bool = False, axis: int = 0) -> Any:
    """``keras.ops.associative_scan``: the inclusive scan ``[e0, f(e0, e1), f(f(e0, e1), e2), ...]`` of the
    associative ``f`` (elementwise over ``axis``) along ``axis`` of ``elems`` (a pytree of tensors of one
    length there), by JAX's log-depth algorithm (about ``2 log2 n`` calls of ``f`` on halved slices).
    ``reverse``: from the end. Differentiable."""
    _callable("associative_scan", "f", f)
    leaves, rebuild = _tree_flatten(elems)
    ts = [_core.tensor(v) for v in leaves]
    if not ts:
        return elems
    ax = int(axis) % ts[0].ndim
    sizes = [int(t.shape[ax]) for t in ts]
    if len(set(sizes)) != 1:
        raise ValueError(f"associative_scan: every array must have one length along axis {axis}, got "
                         f"{[tuple(t.shape) for t in ts]}")
    if reverse:
        ts = [flip(t, ax) for t in ts]

    def combine(a: list, b: list) -> list:
        out, _ = _tree_flatten(f(rebuild(a), rebuild(b)))
        out = [_core.tensor(o) for o in out]
        if len(out) != len(a) or any(tuple(o.shape) != tuple(x.shape) for o, x in zip(out, a)):
            raise ValueError("associative_scan: f must return the structure and shapes of its inputs, got "
                             f"{[tuple(o.shape) for o in out]} for {[tuple(x.shape) for x in a]}")
        return out

    def run(elems_: list) -> list:
        n = int(elems_[0].shape[ax])
        if n < 2:
            return elems_
        reduced = combine([_slice_axis(e, 0, -1, 2, ax) for e in elems_], [_slice_axis(e, 1, None, 2, ax) for e in elems_])
        odd = run(reduced)
        if n % 2 == 0:
            even = combine([_slice_axis(e, 0, -1, None, ax) for e in odd], [_slice_axis(e, 2, None, 2, ax) for e in elems_])
        else:
            even = combine(odd, [_slice_axis(e, 2, None, 2, ax) for e in elems_])
        even = [concatenate([_slice_axis(e, 0, 1, None, ax), r], axis=ax) for e, r in zip(elems_, even)]
        return [_interleave(e, o, ax) for e, o in zip(even, odd)]

    out = run(ts)
    if reverse:
        out = [flip(t, ax) for t in out]
    return rebuild(out)

