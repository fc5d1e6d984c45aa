"""Shape and indexing ``keras.ops``: ``reshape``, ``transpose``, ``expand_dims``, ``squeeze``,
``broadcast_to``, ``concatenate``, ``stack``, ``split``, ``moveaxis``, ``swapaxes``, ``flip``, ``pad``,
``ravel`` and ``get_item`` (Python's ``x[...]``).

Results are contiguous arrays: a reshape of a contiguous array is a view (no kernel); everything
that moves elements is one :func:`dnnbind.kernels.numeric.strided_copy` of a strided view (basic
indexing, transposes, flips and broadcasts are all such views). The VJP of a view is the transpose
copy, or a zero array with the gradient written into the same view (``strided_assign``).
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from ..autodiff.tensor import FilledTensor, Tensor
from ..kernels import numeric as N
from . import _core
from ._core import filled, is_float, keras_op, make, tensors

__all__ = ["reshape", "transpose", "expand_dims", "squeeze", "broadcast_to", "concatenate", "stack", "split",
           "moveaxis", "swapaxes", "flip", "pad", "ravel", "get_item", "view_strided"]


def c_strides(shape: Sequence[int]) -> tuple[int, ...]:
    """Element strides of a C-contiguous array of ``shape``."""
    out = []
    acc = 1
    for s in reversed(tuple(shape)):
        out.append(acc)
        acc *= int(s)
    return tuple(reversed(out))


def _zeros(shape: tuple, t: Tensor) -> Any:
    return N.full(shape, 0, t.dtype, device=t.device)


def view_strided(t: Tensor, shape: tuple, strides: tuple, offset: int, name: str) -> Tensor:
    """A copy of the view ``(shape, element strides, offset)`` of contiguous ``t``, differentiable."""
    out = N.strided_copy(t.data, shape, strides, offset)
    if not is_float(t.dtype):
        return Tensor(out)
    src_shape = tuple(t.shape)

    def backward(node: Any, g: Tensor) -> tuple:
        return (_unview(g, src_shape, shape, strides, offset),)

    return make(out, (t,), backward, name)


def _unview(g: Tensor, src_shape: tuple, shape: tuple, strides: tuple, offset: int) -> Tensor:
    """The VJP of a strided view: zeros of ``src_shape`` with ``g`` written (added, for broadcasts) back."""
    if any(s == 0 and n > 1 for s, n in zip(strides, shape)):  # a broadcast view: sum over the repeated axes
        keep = [i for i, (s, n) in enumerate(zip(strides, shape)) if not (s == 0 and n > 1)]
        summed = _core.REGISTRY["sum"]["fn"](g, axis=tuple(i for i in range(len(shape)) if i not in keep),
                                             keepdims=True)
        new_shape = tuple(1 if i not in keep else n for i, n in enumerate(shape))
        new_strides = tuple(0 if i not in keep else s for i, s in enumerate(strides))
        return _unview(summed, src_shape, new_shape, new_strides, offset)
    return _assign_view(g, src_shape, shape, strides, offset)


def _assign_view(g: Tensor, src_shape: tuple, shape: tuple, strides: tuple, offset: int) -> Tensor:
    """Zeros of ``src_shape`` with ``g`` in the view (differentiable in ``g``: its VJP is the view)."""
    base = N.full(src_shape, 0, g.dtype, device=g.device)
    gd = g.data if tuple(g.shape) == shape else N.strided_copy(
        g.data.reshape(*g.shape) if False else g.data, shape, _broadcast_strides(tuple(g.shape), shape), 0)
    N.strided_assign(base, shape, strides, offset, gd)
    return make(base, (g,), lambda node, gg: (view_strided(gg, shape, strides, offset, "get_item")
                                              if tuple(g.shape) == shape else None,), "scatter_view")


def _broadcast_strides(src: tuple, shape: tuple) -> tuple:
    """Element strides reading contiguous ``src`` broadcast to ``shape``."""
    cs = c_strides(src)
    lead = len(shape) - len(src)
    out = [0] * lead
    for i, n in enumerate(src):
        out.append(0 if (n == 1 and shape[lead + i] != 1) else cs[i])
    return tuple(out)


# --------------------------------------------------------------------------------------- reshape
def _resolve_shape(new_shape: Any, size: int, name: str) -> tuple:
    if isinstance(new_shape, (int, np.integer)):
        new_shape = (int(new_shape),)
    new = [int(s) if s is not None else -1 for s in new_shape]
    unknown = [i for i, s in enumerate(new) if s == -1]
    if len(unknown) > 1:
        raise ValueError(f"{name}: only one dimension can be -1 (or None), got {tuple(new_shape)}")
    known = math.prod(s for s in new if s != -1)
    if unknown:
        if known == 0 or size % known:
            raise ValueError(f"{name}: cannot reshape a tensor of {size} elements into shape {tuple(new_shape)}")
        new[unknown[0]] = size // known
    if math.prod(new) != size:
        raise ValueError(f"{name}: cannot reshape a tensor of {size} elements into shape {tuple(new_shape)}")
    return tuple(new)


@keras_op
def reshape(x: Any, newshape: Any) -> Tensor:
    """``keras.ops.reshape`` (a view: no copy; ``-1`` or None infers one dimension)."""
    (t,) = tensors(x)
    shape = _resolve_shape(newshape, t.size, "reshape")
    if shape == tuple(t.shape):
        return t
    if isinstance(t, FilledTensor) and t._node is None:
        return filled(t.value, shape, t.dtype, t.device)
    old = tuple(t.shape)
    out = t.data.reshape(*shape) if shape else t.data.reshape(())
    if not is_float(t.dtype):
        return Tensor(out)
    return make(out, (t,), lambda node, g: (reshape(g, old),), "reshape")


@keras_op
def ravel(x: Any) -> Tensor:
    return reshape(x, (-1,))


# ------------------------------------------------------------------------------------- transposes
@keras_op
def transpose(x: Any, axes: Any = None) -> Tensor:
    """``keras.ops.transpose`` (``axes`` None reverses them)."""
    (t,) = tensors(x)
    nd = t.ndim
    perm = tuple(range(nd))[::-1] if axes is None else tuple(int(a) % max(nd, 1) for a in axes)
    if sorted(perm) != list(range(nd)):
        raise ValueError(f"transpose: axes {axes!r} are not a permutation of the {nd} axes of shape {t.shape}")
    if perm == tuple(range(nd)):
        return t
    shape = tuple(t.shape[p] for p in perm)
    cs = c_strides(t.shape)
    strides = tuple(cs[p] for p in perm)
    out = N.strided_copy(t.data, shape, strides, 0)
    if not is_float(t.dtype):
        return Tensor(out)
    return make(out, (t,), lambda node, g: (transpose(g, inverse_permutation(perm)),), "transpose")


def inverse_permutation(perm: Sequence[int]) -> tuple:
    """The axes that undo ``perm`` (``np.argsort(perm)``, without NumPy's per-call array conversion:
    transpose runs it for every recorded call, twice per conv layer and step through ``ops.conv``)."""
    inverse = [0] * len(perm)
    for i, p in enumerate(perm):
        inverse[p] = i
    return tuple(inverse)


@keras_op
def moveaxis(x: Any, source: Any, destination: Any) -> Tensor:
    (t,) = tensors(x)
    nd = t.ndim
    src = [int(s) % nd for s in (source if isinstance(source, (list, tuple)) else [source])]
    dst = [int(d) % nd for d in (destination if isinstance(destination, (list, tuple)) else [destination])]
    if len(src) != len(dst):
        raise ValueError("moveaxis: source and destination must have the same number of axes")
    order = [i for i in range(nd) if i not in src]
    for d, s in sorted(zip(dst, src)):
        order.insert(d, s)
    return transpose(t, order)


@keras_op
def swapaxes(x: Any, axis1: int, axis2: int) -> Tensor:
    (t,) = tensors(x)
    perm = list(range(t.ndim))
    a, b = int(axis1) % t.ndim, int(axis2) % t.ndim
    perm[a], perm[b] = perm[b], perm[a]
    return transpose(t, perm)


@keras_op
def flip(x: Any, axis: Any = None) -> Tensor:
    """``keras.ops.flip`` (``axis`` None: every axis)."""
    (t,) = tensors(x)
    axes = range(t.ndim) if axis is None else [int(a) % t.ndim for a in (axis if isinstance(axis, (list, tuple))
                                                                      else [axis])]
    axes = set(axes)
    if not axes or t.size == 0:
        return t
    cs = c_strides(t.shape)
    strides = tuple(-s if i in axes else s for i, s in enumerate(cs))
    offset = sum((t.shape[i] - 1) * cs[i] for i in axes)
    return view_strided(t, tuple(t.shape), strides, offset, "flip")


# --------------------------------------------------------------------------------- expand/squeeze
@keras_op
def expand_dims(x: Any, axis: Any) -> Tensor:
    (t,) = tensors(x)
    axes = axis if isinstance(axis, (list, tuple)) else [axis]
    nd = t.ndim + len(axes)
    norm = sorted(int(a) % nd for a in axes)
    shape = list(t.shape)
    for a in norm:
        shape.insert(a, 1)
    return reshape(t, tuple(shape))


@keras_op
def squeeze(x: Any, axis: Any = None) -> Tensor:
    (t,) = tensors(x)
    if axis is None:
        shape = tuple(s for s in t.shape if s != 1)
    else:
        axes = {int(a) % max(t.ndim, 1) for a in (axis if isinstance(axis, (list, tuple)) else [axis])}
        for a in axes:
            if t.shape[a] != 1:
                raise ValueError(f"squeeze: cannot squeeze axis {a} of size {t.shape[a]} (shape {t.shape})")
        shape = tuple(s for i, s in enumerate(t.shape) if i not in axes)
    return reshape(t, shape)


@keras_op
def broadcast_to(x: Any, shape: Any) -> Tensor:
    """``keras.ops.broadcast_to`` (NumPy rules)."""
    (t,) = tensors(x)
    shape = tuple(int(s) for s in shape)
    if N.broadcast_shapes(t.shape, shape, op="broadcast_to") != shape:
        raise ValueError(f"broadcast_to: cannot broadcast shape {t.shape} to {shape}")
    if tuple(t.shape) == shape:
        return t
    if isinstance(t, FilledTensor) and t._node is None:
        return filled(t.value, shape, t.dtype, t.device)
    return view_strided(t, shape, _broadcast_strides(tuple(t.shape), shape), 0, "broadcast_to")


# ------------------------------------------------------------------------------------ joins, splits
@keras_op
def concatenate(xs: Sequence[Any], axis: int = 0) -> Tensor:
    """``keras.ops.concatenate`` (dtypes promoted as Keras)."""
    ts = tensors(*xs)
    if not ts:
        raise ValueError("concatenate: needs at least one tensor")
    dt = _core.np_dtype(_core.result_type(*ts))
    cast = _core.REGISTRY["cast"]["fn"]
    ts = [t if t.dtype == dt else cast(t, dt) for t in ts]
    nd = ts[0].ndim
    if nd == 0:
        raise ValueError("concatenate: zero-dimensional tensors cannot be concatenated")
    ax = int(axis) % nd
    for t in ts:
        if t.ndim != nd or any(a != b for i, (a, b) in enumerate(zip(t.shape, ts[0].shape)) if i != ax):
            raise ValueError(f"concatenate: shapes {[t.shape for t in ts]} differ outside axis {ax}")
    shape = list(ts[0].shape)
    sizes = [int(t.shape[ax]) for t in ts]
    shape[ax] = sum(sizes)
    shape = tuple(shape)
    out = N.full(shape, 0, dt, device=ts[0].device)
    cs = c_strides(shape)
    start = 0
    views = []
    for t, n in zip(ts, sizes):
        vshape = tuple(t.shape)
        offset = start * cs[ax]
        if n:
            N.strided_assign(out, vshape, cs, offset, t.data)
        views.append((vshape, offset))
        start += n
    if not is_float(dt):
        return Tensor(out)

    def backward(node: Any, g: Tensor) -> tuple:
        need = node.needs_input_grad
        return tuple(view_strided(g, vs, cs, off, "concatenate") if need[i] else None
                     for i, (vs, off) in enumerate(views))

    return make(out, tuple(ts), backward, "concatenate")


@keras_op
def stack(x: Sequence[Any], axis: int = 0) -> Tensor:
    ts = tensors(*x)
    if not ts:
        raise ValueError("stack: needs at least one tensor")
    nd = ts[0].ndim + 1
    ax = int(axis) % nd
    return concatenate([expand_dims(t, ax) for t in ts], axis=ax)


@keras_op
def split(x: Any, indices_or_sections: Any, axis: int = 0) -> list:
    """``keras.ops.split``: a number of equal sections, or the indices where to cut."""
    (t,) = tensors(x)
    ax = int(axis) % t.ndim
    n = int(t.shape[ax])
    if isinstance(indices_or_sections, (int, np.integer)):
        k = int(indices_or_sections)
        if k <= 0 or n % k:
            raise ValueError(f"split: axis {ax} of size {n} does not split into {k} equal sections")
        cuts = [n // k * i for i in range(1, k)]
    else:
        cuts = [int(c) for c in indices_or_sections]
    bounds = [0] + [min(max(c, 0), n) for c in cuts] + [n]
    out = []
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        idx = [slice(None)] * t.ndim
        idx[ax] = slice(lo, max(lo, hi))
        out.append(get_item(t, tuple(idx)))
    return out


@keras_op
def pad(x: Any, pad_width: Any, mode: str = "constant", constant_values: Any = None) -> Tensor:
    """``keras.ops.pad``: modes ``constant`` (``constant_values``, default 0), ``edge``, ``reflect``,
    ``symmetric``, ``wrap``; the gradient of ``constant`` is the interior."""
    (t,) = tensors(x)
    nd = t.ndim
    width = np.asarray(pad_width, dtype=np.int64)
    if width.ndim == 0:
        width = np.full((nd, 2), int(width))
    elif width.shape == (2,):
        width = np.tile(width, (nd, 1))
    elif width.shape == (1, 2):
        width = np.tile(width, (nd, 1))
    if width.shape != (nd, 2):
        raise ValueError(f"pad: pad_width must give (before, after) for each of the {nd} axes, got {pad_width!r}")
    widths = tuple((int(a), int(b)) for a, b in width)
    if mode != "constant" and constant_values is not None:
        raise ValueError(f"pad: constant_values is only used with mode='constant', got mode={mode!r}")
    value = 0 if constant_values is None else constant_values
    out = N.pad(t.data, widths, mode=mode, constant_value=float(value))
    if not is_float(t.dtype):
        return Tensor(out)
    shape = tuple(t.shape)
    if mode == "constant":
        cs = c_strides(tuple(out.shape))
        offset = sum(w[0] * c for w, c in zip(widths, cs))
        return make(out, (t,), lambda node, g: (view_strided(g, shape, cs, offset, "pad"),), "pad")

    def backward(node: Any, g: Tensor) -> tuple:
        # the padded result gathers input elements: its transpose adds each output's gradient back
        index = np.arange(t.size, dtype=np.int64).reshape(shape)
        src = np.pad(index, widths, mode=mode).reshape(-1)
        idx = _core.tensor(src.astype(np.int32), g.data)
        gflat = reshape(g, (-1,))
        zeros = Tensor(N.full((t.size,), 0, g.dtype, device=g.device))
        add = _core.REGISTRY["index_add"]["fn"] if "index_add" in _core.REGISTRY else None
        summed = add(zeros, idx, gflat) if add is not None else Tensor(N.index_add(zeros.data, idx.data, gflat.data))
        return (reshape(summed, shape),)

    return make(out, (t,), backward, "pad")


# -------------------------------------------------------------------------------------- indexing
def _basic_view(shape: tuple, key: tuple) -> "tuple[tuple, tuple, int, tuple] | None":
    """``(view shape, element strides, offset, result shape)`` of basic indexing (ints, slices, None,
    Ellipsis) of a contiguous array of ``shape``; None when ``key`` has advanced indices."""
    if any(k is Ellipsis for k in key):
        i = next(j for j, k in enumerate(key) if k is Ellipsis)
        used = sum(1 for k in key if k is not None and k is not Ellipsis)
        key = key[:i] + (slice(None),) * (len(shape) - used) + key[i + 1:]
    cs = c_strides(shape)
    dim = 0
    vshape, vstrides, offset = [], [], 0
    for k in key:
        if k is None:
            vshape.append(1)
            vstrides.append(0)
            continue
        if dim >= len(shape):
            raise IndexError(f"too many indices for a tensor of rank {len(shape)}")
        n = shape[dim]
        if isinstance(k, (bool, np.bool_)):
            return None
        if isinstance(k, (int, np.integer)) or (isinstance(k, Tensor) and k.ndim == 0 and k.dtype.kind in "iu"):
            i = int(k)
            if not -n <= i < n:
                raise IndexError(f"index {i} is out of bounds for axis {dim} with size {n}")
            offset += (i % n) * cs[dim]
            dim += 1
            continue
        if isinstance(k, slice):
            start, stop, step = k.indices(n)
            count = len(range(start, stop, step))
            vshape.append(count)
            vstrides.append(step * cs[dim])
            if count:
                offset += start * cs[dim]
            dim += 1
            continue
        return None
    for d in range(dim, len(shape)):
        vshape.append(shape[d])
        vstrides.append(cs[d])
    return tuple(vshape), tuple(vstrides), offset, tuple(vshape)


@keras_op
def get_item(x: Any, key: Any) -> Tensor:
    """``x[key]``: ints, slices (any step), None, Ellipsis; an integer tensor or list on one axis
    (``take``); a bool mask (reads it on the host: the result's shape depends on it)."""
    (t,) = tensors(x)
    if not isinstance(key, tuple):
        key = (key,)
    basic = _basic_view(tuple(t.shape), key)
    if basic is not None:
        vshape, vstrides, offset, _ = basic
        if vshape == tuple(t.shape) and offset == 0 and vstrides == c_strides(t.shape):
            return t
        return view_strided(t, vshape, vstrides, offset, "get_item")
    return _advanced(t, key)


def _advanced(t: Tensor, key: tuple) -> Tensor:
    reg = _core.REGISTRY
    # one advanced index (an int array or list, or a bool mask) among basic ones
    adv = [i for i, k in enumerate(key) if not (k is None or k is Ellipsis or isinstance(k, slice)
                                                or (isinstance(k, (int, np.integer)) and not isinstance(k, bool)))]
    if len(adv) == 1:
        i = adv[0]
        k = key[i]
        kt = _core.tensor(k, _core.device_of_args(t))
        if kt.dtype.kind == "b":
            mask = kt.numpy()  # a host read: the result's length is the mask's count
            idx = np.nonzero(mask.reshape(-1))[0].astype(np.int32)
            before = sum(1 for k2 in key[:i] if k2 is not None and k2 is not Ellipsis)
            if any(k2 is Ellipsis for k2 in key[:i]):
                before = t.ndim - sum(1 for k2 in key[i:] if k2 is not None and k2 is not Ellipsis) - mask.ndim + 1
            lead = tuple(t.shape[:before])
            flat = reshape(t, lead + (-1,) + tuple(t.shape[before + mask.ndim:]))
            rest = key[:i] + (slice(None),) + key[i + 1:]
            taken = reg["take"]["fn"](flat, _core.tensor(idx, _core.device_of_args(t)), axis=before)
            return get_item(taken, rest) if any(not (isinstance(r, slice) and r == slice(None)) for r in rest) \
                else taken
        # position of the axis the advanced index applies to
        before = key[:i]
        if any(k2 is Ellipsis for k2 in before):
            ax = t.ndim - sum(1 for k2 in key[i + 1:] if k2 is not None and k2 is not Ellipsis) - 1
        else:
            ax = sum(1 for k2 in before if k2 is not None)
        taken = reg["take"]["fn"](t, kt, axis=ax)
        rest = list(key[:i]) + [slice(None)] * kt.ndim + list(key[i + 1:])
        return get_item(taken, tuple(rest))
    # several advanced indices: they broadcast together and index their axes jointly (NumPy), the
    # rest of the key is applied after; supported when they are adjacent and the key has no None
    if any(k is None for k in key) or adv != list(range(adv[0], adv[-1] + 1)):
        raise NotImplementedError("get_item: several advanced indices are supported only when they are adjacent "
                                  "and the key has no None; use keras.ops.take / take_along_axis")
    first = adv[0]
    if any(k is Ellipsis for k in key[:first]):
        raise NotImplementedError("get_item: an Ellipsis before several advanced indices is not supported")
    idx = [_core.tensor(key[i], _core.device_of_args(t)) for i in adv]
    shape = N.broadcast_shapes(*[k.shape for k in idx], op="get_item")
    idx = [reg["broadcast_to"]["fn"](reg["cast"]["fn"](k, "int32"), shape) for k in idx]
    lead = key[:first]
    moved = get_item(t, tuple(lead) + (Ellipsis,)) if lead else t
    gathered = reg["gather_nd"]["fn"](moveaxis(moved, list(range(first, first + len(adv))),
                                               list(range(len(adv)))) if first else moved,
                                      stack(idx, axis=-1))
    tail = key[adv[-1] + 1:]
    if first:
        gathered = moveaxis(gathered, list(range(len(shape))), list(range(first, first + len(shape))))
    return get_item(gathered, (slice(None),) * (first + len(shape)) + tuple(tail)) if tail else gathered
