"""Products of ``keras.ops`` built on ``matmul`` (cuBLAS on the device): ``einsum``, ``tensordot``,
``dot``, ``inner``, ``vdot``, and the broadcast products ``outer``, ``kron``, ``cross``.

Every contraction is one labelled pair step, :func:`_pair`: both operands are transposed so that the
shared kept axes lead (a batch), the contracted axes meet in the middle, then reshaped to
``(batch..., M, K) @ (batch..., K, N)`` and multiplied by one batched ``matmul``, whose batch axes
broadcast. ``einsum`` reduces each operand's own axes first (repeated labels become a diagonal view,
labels no one else reads are summed), then folds the operands left to right through :func:`_pair`.
No op here has a hand-written VJP: the gradient falls out of ``transpose``/``reshape``/``sum``/
``matmul`` and the diagonal view, so every product is differentiable again as far as those are.

dtypes are Keras's: the operands promoted together (``result_type``), except that ``einsum`` of int8
operands gives int32 (Keras's rule, so that the sums do not wrap). Integer products compute in int32
or int64 and are cast back to the promoted type (wrapping as JAX's do).
"""

from __future__ import annotations

import math
import string
from typing import Any, Sequence

import numpy as np

from ..autodiff.tensor import Tensor
from ..kernels import numeric as N
from . import _core
from ._core import keras_op, np_dtype, result_type, tensors
from ._elementwise import cast, multiply, subtract
from ._matmul import matmul
from ._reductions import sum as _sum
from ._shape import broadcast_to, c_strides, moveaxis, reshape, transpose, view_strided

__all__ = ["einsum", "tensordot", "dot", "inner", "vdot", "outer", "kron", "cross"]

_LETTERS = frozenset(string.ascii_letters)


def _promoted(name: str, ts: Sequence[Tensor]) -> "tuple[list[Tensor], np.dtype]":
    """The operands cast to their Keras result dtype (int8 with only int8: int32, as Keras's einsum)."""
    names = {_core.standardize_dtype(t.dtype) for t in ts}
    dt = np.dtype(np.int32) if names == {"int8"} and name == "einsum" else np_dtype(result_type(*ts))
    return [t if t.dtype == dt else cast(t, dt) for t in ts], dt


def _finish(t: Tensor, dt: np.dtype) -> Tensor:
    return t if t.dtype == dt else cast(t, dt)


# ------------------------------------------------------------------------------- the pair step
def _sum_labels(t: Tensor, labels: list, drop: set) -> "tuple[Tensor, list]":
    """``t`` summed over the axes whose label is in ``drop``."""
    axes = tuple(i for i, lab in enumerate(labels) if lab in drop)
    if not axes:
        return t, labels
    return _sum(t, axis=axes), [lab for lab in labels if lab not in drop]


def _squeeze_labels(t: Tensor, labels: list, drop: set) -> "tuple[Tensor, list]":
    """``t`` without the (size-1) axes whose label is in ``drop``."""
    keep = [i for i, lab in enumerate(labels) if lab not in drop]
    if len(keep) == len(labels):
        return t, labels
    return reshape(t, tuple(t.shape[i] for i in keep)), [labels[i] for i in keep]


def _arrange(t: Tensor, labels: list, order: list) -> Tensor:
    """``t`` with its axes in the order of ``order`` (labels)."""
    perm = [labels.index(lab) for lab in order]
    return transpose(t, perm) if perm != list(range(len(perm))) else t


def _pair(a: Tensor, la: list, b: Tensor, lb: list, keep: set) -> "tuple[Tensor, list]":
    """The product of ``a`` (axis labels ``la``) and ``b`` (``lb``) summed over the shared labels not in
    ``keep``; labels of one operand only that are not kept are summed out first. Returns the result and
    its labels: the shared kept ones (batch), then ``a``'s own, then ``b``'s own."""
    a, la = _sum_labels(a, la, {x for x in la if x not in lb and x not in keep})
    b, lb = _sum_labels(b, lb, {x for x in lb if x not in la and x not in keep})
    contract = [x for x in la if x in lb and x not in keep]
    # a contracted label broadcast from size 1 in one operand: sum it out of the other, drop it from both
    size_a = dict(zip(la, a.shape))
    size_b = dict(zip(lb, b.shape))
    ones_a = {x for x in contract if size_a[x] == 1 and size_b[x] != 1}
    ones_b = {x for x in contract if size_b[x] == 1 and size_a[x] != 1}
    if ones_a or ones_b:
        a, la = _sum_labels(a, la, ones_b)
        b, lb = _sum_labels(b, lb, ones_a)
        a, la = _squeeze_labels(a, la, ones_a)
        b, lb = _squeeze_labels(b, lb, ones_b)
        contract = [x for x in contract if x not in ones_a | ones_b]
    batch = [x for x in la if x in lb and x not in contract]
    own_a = [x for x in la if x not in lb]
    own_b = [x for x in lb if x not in la]
    out_labels = batch + own_a + own_b
    if not contract:  # no sum: one broadcast multiply
        a = _arrange(a, la, batch + own_a)
        b = _arrange(b, lb, batch + own_b)
        a = reshape(a, tuple(a.shape) + (1,) * len(own_b))
        b = reshape(b, tuple(b.shape[:len(batch)]) + (1,) * len(own_a) + tuple(b.shape[len(batch):]))
        return multiply(a, b), out_labels
    a = _arrange(a, la, batch + own_a + contract)
    b = _arrange(b, lb, batch + contract + own_b)
    nb = len(batch)
    a_batch, b_batch = tuple(a.shape[:nb]), tuple(b.shape[:nb])
    m_shape = tuple(a.shape[nb:nb + len(own_a)])
    n_shape = tuple(b.shape[nb + len(contract):])
    k = math.prod(a.shape[nb + len(own_a):])
    a = reshape(a, a_batch + (math.prod(m_shape), k))
    b = reshape(b, b_batch + (k, math.prod(n_shape)))
    out = matmul(a, b)
    return reshape(out, tuple(out.shape[:nb]) + m_shape + n_shape), out_labels


# ------------------------------------------------------------------------------------- einsum
def _parse_term(name: str, term: str, ndim: "int | None", n_ellipsis: int) -> list:
    """The labels of one subscript term: letters, and the ellipsis as ``n_ellipsis`` (or, for an operand,
    ``ndim - letters``) positional labels ``0, 1, ...`` aligned to the right."""
    if term.count("...") > 1 or "." in term.replace("...", ""):
        raise ValueError(f"{name}: invalid subscript term {term!r} (at most one '...', and no other '.')")
    head, dots, tail = term.partition("...")
    for ch in head + tail:
        if ch not in _LETTERS:
            raise ValueError(f"{name}: invalid subscript character {ch!r} in {term!r} (letters and '...' only)")
    letters = len(head) + len(tail)
    if ndim is not None:
        if (not dots and ndim != letters) or (dots and ndim < letters):
            raise ValueError(f"{name}: the subscript {term!r} names {letters} axes but its operand has rank {ndim}")
        n = ndim - letters if dots else 0
    else:
        n = n_ellipsis if dots else 0
    return list(head) + list(range(n_ellipsis - n, n_ellipsis)) + list(tail)


def _einsum_plan(subscripts: str, shapes: Sequence[tuple]) -> "tuple[list, list, dict]":
    """(labels per operand, output labels, size per label) of ``subscripts`` for operands of ``shapes``."""
    name = "einsum"
    if not isinstance(subscripts, str):
        raise TypeError(f"{name}: subscripts must be a string, got {type(subscripts).__name__}")
    spec = subscripts.replace(" ", "")
    parts = spec.split("->")
    if len(parts) > 2:
        raise ValueError(f"At most one '->' is supported in `einsum` subscripts, but received {subscripts}.")
    terms = parts[0].split(",")
    if len(terms) != len(shapes):
        raise ValueError(f"Number of operands ({len(shapes)}) does not match the number of input specs "
                         f"({len(terms)}) in `einsum`, received subscripts={subscripts}.")
    n_ell = 0
    for term, shape in zip(terms, shapes):
        if "..." in term:
            n_ell = max(n_ell, len(shape) - (len(term) - 3))
    labels = [_parse_term(name, term, len(shape), n_ell) for term, shape in zip(terms, shapes)]
    sizes: dict = {}
    for term, labs, shape in zip(terms, labels, shapes):
        for lab, size in zip(labs, shape):
            old = sizes.get(lab, 1)
            if size != old and old != 1 and size != 1:
                what = f"label {lab!r}" if isinstance(lab, str) else "the '...' axes"
                raise ValueError(f"{name}: {what} has size {old} in one operand and {size} in {term!r} (shapes "
                                 f"{[tuple(s) for s in shapes]}); sizes must be equal or 1")
            sizes[lab] = size if old == 1 else old
    if len(parts) == 2:
        out = _parse_term(name, parts[1], None, n_ell)
        if len(set(out)) != len(out):
            raise ValueError(f"{name}: the output subscript {parts[1]!r} repeats a label")
        unknown = [x for x in out if x not in sizes and isinstance(x, str)]
        if unknown:
            raise ValueError(f"{name}: the output label {unknown[0]!r} does not appear in the inputs of "
                             f"{subscripts!r}")
    else:
        counts: dict = {}
        for labs in labels:
            for lab in labs:
                if isinstance(lab, str):
                    counts[lab] = counts.get(lab, 0) + 1
        out = list(range(n_ell)) + sorted(lab for lab, c in counts.items() if c == 1)
    return labels, out, sizes


def _diagonal_labels(t: Tensor, labels: list) -> "tuple[Tensor, list]":
    """A label repeated in one operand ("ii"): the diagonal, as one strided view."""
    uniq = list(dict.fromkeys(labels))
    if len(uniq) == len(labels):
        return t, labels
    cs = c_strides(t.shape)
    shape, strides = [], []
    for lab in uniq:
        dims = [i for i, x in enumerate(labels) if x == lab]
        sizes = {t.shape[i] for i in dims}
        if len(sizes) != 1:
            raise ValueError(f"einsum: the repeated label {lab!r} has different sizes {sorted(sizes)} in one operand")
        shape.append(t.shape[dims[0]])
        strides.append(sum(cs[i] for i in dims))
    return view_strided(t, tuple(shape), tuple(strides), 0, "einsum"), uniq


@keras_op
def einsum(subscripts: str, *operands: Any, **kwargs: Any) -> Tensor:
    """``keras.ops.einsum``: NumPy's Einstein summation (explicit ``->`` or implicit output, ``...``,
    repeated labels for diagonals and traces, size-1 broadcasting). Computed as a diagonal view and sums
    per operand, then pairwise contractions from left to right, each one batched ``matmul`` (no contraction
    path search: order the operands yourself for long chains). ``kwargs`` (NumPy's ``optimize``...) are
    accepted and ignored."""
    if not operands:
        raise ValueError("einsum: needs at least one operand")
    ts, dt = _promoted("einsum", tensors(*operands))
    labels, out, sizes = _einsum_plan(subscripts, [tuple(t.shape) for t in ts])
    items = [_diagonal_labels(t, labs) for t, labs in zip(ts, labels)]
    keeps: list = []  # per pair step: the labels read after it (the output's and the later operands')
    later = set(out)
    for _, labs in reversed(items[1:]):
        keeps.insert(0, set(later))
        later |= set(labs)
    cur, lc = items[0]
    if len(items) == 1:
        cur, lc = _sum_labels(cur, lc, {x for x in lc if x not in out})
    for (nxt, ln), keep in zip(items[1:], keeps):
        cur, lc = _pair(cur, lc, nxt, ln, keep)
    cur, lc = _sum_labels(cur, lc, {x for x in lc if x not in out})
    cur = _arrange(cur, lc, out)
    shape = tuple(sizes[x] for x in out)
    if tuple(cur.shape) != shape:
        cur = broadcast_to(cur, shape)
    return _finish(cur, dt)


# ---------------------------------------------------------------------------- tensordot and friends
def _axes_list(name: str, axes: Any, ndim: int, which: str) -> list:
    items = [axes] if isinstance(axes, (int, np.integer)) else list(axes)
    out = []
    for a in items:
        a = int(a)
        if not -ndim <= a < ndim:
            raise ValueError(f"{name}: axis {a} of {which} is out of range for rank {ndim}")
        out.append(a % ndim)
    if len(set(out)) != len(out):
        raise ValueError(f"{name}: {which} axes {items} repeat an axis")
    return out


def _contract(name: str, a: Tensor, b: Tensor, axes_a: list, axes_b: list) -> Tensor:
    """``a`` and ``b`` contracted over ``axes_a`` with ``axes_b`` (pairwise), the free axes of ``a`` then
    those of ``b``, in the Keras result dtype."""
    (a, b), dt = _promoted(name, [a, b])
    if len(axes_a) != len(axes_b):
        raise ValueError(f"{name}: the two operands must contract the same number of axes, got {axes_a} and {axes_b}")
    for i, j in zip(axes_a, axes_b):
        if a.shape[i] != b.shape[j]:
            raise ValueError(f"Shape mismatch on `x1[axes[0]]` and `x2[axes[1]]`, received "
                             f"{[a.shape[k] for k in axes_a]} and {[b.shape[k] for k in axes_b]}.")
    la = [("a", i) for i in range(a.ndim)]
    lb = [("b", j) for j in range(b.ndim)]
    for i, j in zip(axes_a, axes_b):
        lb[j] = la[i]
    free = [x for x in la if x not in lb] + [x for x in lb if x not in la]
    if a.ndim == 0 or b.ndim == 0:
        return _finish(multiply(a, b), dt)
    out, labels = _pair(a, la, b, lb, set(free))
    return _finish(_arrange(out, labels, free), dt)


@keras_op
def tensordot(x1: Any, x2: Any, axes: Any = 2) -> Tensor:
    """``keras.ops.tensordot``: ``axes`` an int N (the last N axes of ``x1`` with the first N of ``x2``)
    or a pair of axis sequences; one ``matmul``."""
    a, b = tensors(x1, x2)
    if isinstance(axes, (int, np.integer)):
        n = int(axes)
        if n < 0 or n > a.ndim or n > b.ndim:
            raise ValueError(f"tensordot: axes={n} must be in [0, min(x1.ndim, x2.ndim)] = [0, {min(a.ndim, b.ndim)}]")
        axes_a, axes_b = list(range(a.ndim - n, a.ndim)), list(range(n))
    else:
        if len(axes) != 2:
            raise ValueError(f"tensordot: axes must be an int or a pair of axis lists, got {axes!r}")
        axes_a = _axes_list("tensordot", axes[0], a.ndim, "x1")
        axes_b = _axes_list("tensordot", axes[1], b.ndim, "x2")
    return _contract("tensordot", a, b, axes_a, axes_b)


@keras_op
def dot(x1: Any, x2: Any) -> Tensor:
    """``keras.ops.dot``: NumPy's ``dot`` (a scalar operand multiplies; otherwise the last axis of ``x1``
    with the second-to-last of ``x2``, or its only one)."""
    a, b = tensors(x1, x2)
    if a.ndim == 0 or b.ndim == 0:
        return _contract("dot", a, b, [], [])
    want = 0 if b.ndim == 1 else b.ndim - 2
    if a.shape[-1] != b.shape[want]:
        raise ValueError(f"dot: shapes {a.shape} and {b.shape} are not aligned: {a.shape[-1]} (x1's last axis) != "
                         f"{b.shape[want]} (x2's axis {want})")
    return _contract("dot", a, b, [a.ndim - 1], [want])


@keras_op
def inner(x1: Any, x2: Any) -> Tensor:
    """``keras.ops.inner``: the sum product over the last axes (a scalar operand multiplies)."""
    a, b = tensors(x1, x2)
    if a.ndim == 0 or b.ndim == 0:
        return _contract("inner", a, b, [], [])
    if a.shape[-1] != b.shape[-1]:
        raise ValueError(f"`inner` requires the last dimension of `x1` and `x2` to match. Received: x1.shape="
                         f"{a.shape}, x2.shape={b.shape}.")
    return _contract("inner", a, b, [a.ndim - 1], [b.ndim - 1])


@keras_op
def vdot(x1: Any, x2: Any) -> Tensor:
    """``keras.ops.vdot``: the dot product of the flattened operands (no conjugation: dnnbind has no complex
    tensors on the device)."""
    a, b = tensors(x1, x2)
    if a.size != b.size:
        raise ValueError(f"vdot: the operands must have the same number of elements, got shapes {a.shape} and "
                         f"{b.shape}")
    return _contract("vdot", reshape(a, (-1,)), reshape(b, (-1,)), [0], [0])


@keras_op
def outer(x1: Any, x2: Any) -> Tensor:
    """``keras.ops.outer``: ``ravel(x1)[:, None] * ravel(x2)[None, :]`` (one broadcast multiply)."""
    (a, b), dt = _promoted("outer", tensors(x1, x2))
    return _finish(multiply(reshape(a, (-1, 1)), reshape(b, (1, -1))), dt)


@keras_op
def kron(x1: Any, x2: Any) -> Tensor:
    """``keras.ops.kron``: the Kronecker product, ``a[i] * b[j]`` at ``i * b.shape + j`` on every axis
    (the lower rank padded with leading 1s): one broadcast multiply of interleaved axes."""
    (a, b), dt = _promoted("kron", tensors(x1, x2))
    nd = max(a.ndim, b.ndim)
    sa = (1,) * (nd - a.ndim) + tuple(a.shape)
    sb = (1,) * (nd - b.ndim) + tuple(b.shape)
    ia = tuple(v for s in sa for v in (s, 1))
    ib = tuple(v for s in sb for v in (1, s))
    prod = multiply(reshape(a, ia), reshape(b, ib))
    return _finish(reshape(prod, tuple(p * q for p, q in zip(sa, sb))), dt)


@keras_op
def cross(x1: Any, x2: Any, axisa: int = -1, axisb: int = -1, axisc: int = -1, axis: Any = None) -> Tensor:
    """``keras.ops.cross``: the cross product of (arrays of) 2- or 3-vectors along ``axisa``/``axisb``,
    the result's vectors along ``axisc`` (``axis`` sets all three). Two 2-vectors give the z component
    only (a scalar per pair), as NumPy and JAX."""
    (a, b), dt = _promoted("cross", tensors(x1, x2))
    if axis is not None:
        axisa = axisb = axisc = axis
    if a.ndim == 0 or b.ndim == 0:
        raise ValueError(f"cross: both operands need rank >= 1, got shapes {a.shape} and {b.shape}")
    a = moveaxis(a, int(axisa), -1)
    b = moveaxis(b, int(axisb), -1)
    if a.shape[-1] not in (2, 3) or b.shape[-1] not in (2, 3):
        raise ValueError(f"`x1`'s and `x2`'s vector axes must have 2 or 3 components, got {a.shape[-1]} and "
                         f"{b.shape[-1]}")
    get = _core.REGISTRY["get_item"]["fn"]

    def comp(t: Tensor, i: int) -> "Tensor | float":
        return get(t, (Ellipsis, i)) if i < t.shape[-1] else 0.0

    a0, a1, a2 = (comp(a, i) for i in range(3))
    b0, b1, b2 = (comp(b, i) for i in range(3))

    def term(p: Any, q: Any, r: Any, s: Any) -> Any:  # p * q - r * s, a zero component dropping out
        left = 0.0 if isinstance(p, float) or isinstance(q, float) else multiply(p, q)
        right = 0.0 if isinstance(r, float) or isinstance(s, float) else multiply(r, s)
        if isinstance(right, float):
            return left
        return multiply(right, -1) if isinstance(left, float) else subtract(left, right)

    z = term(a0, b1, a1, b0)
    if a.shape[-1] == 2 and b.shape[-1] == 2:
        return _finish(z, dt)
    shape = N.broadcast_shapes(a.shape[:-1], b.shape[:-1], op="cross")
    parts = [term(a1, b2, a2, b1), term(a2, b0, a0, b2), z]
    parts = [broadcast_to(p, shape) if tuple(p.shape) != shape else p for p in parts]
    stacked = _core.REGISTRY["stack"]["fn"](parts, axis=-1)
    nd = stacked.ndim
    ax = int(axisc)
    if not -nd <= ax < nd:
        raise ValueError(f"cross: axisc={axisc} is out of range for a result of rank {nd}")
    return _finish(moveaxis(stacked, -1, ax), dt)
