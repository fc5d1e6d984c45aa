"""Fused multi-tensor optimizer updates on NVRTC kernels (``optim.cu``).

All tensors of one (parameter dtype, gradient dtype) group are updated by one launch. The
launch reads a small device "pointer table" (int64: per tensor the parameter, gradient and
state pointers, the size, its first chunk and whether its pointers allow 16-byte vector access;
then per chunk the tensor and start). Chunks are a power of two between :data:`MIN_CHUNK` and
:data:`CHUNK` items, picked from the group's total size so that it spreads over about
:data:`TARGET_CHUNKS` blocks (fixed by the sizes alone: the clipping sums, which run per chunk,
give the same bits on every GPU). The table is built on the host and uploaded once per list of
arrays and kept in the caller's :class:`dnnbind.kernels.UpdateTables` (``tables=``; an Optimizer
owns one; None: the one kept with ``params[0]``), looked up by the addresses and sizes it holds,
so a training loop that keeps its arrays pays for it once. During a CUDA-graph capture a table is made for the captured update
alone and dies with it (see :class:`~dnnbind.kernels.UpdateTables`).

``lr``, ``step`` and ``grad_scale`` may be numbers (baked into the launch) or 0-d device
arrays (read by the kernel, so a replayed CUDA graph sees their current values); ``skip`` is
a number or a 0-d int32 device flag (nonzero: nothing changes). :func:`advance_step` adds one
to a device step counter unless the same flag is set, read on the device (one thread).

``clip`` (a resolved :class:`dnnbind.kernels.optim.GradientClipping`): ``"value"`` is a clamp inside
the update kernels; ``"norm"``/``"global_norm"`` first reduce the gradients' squares on the
device and turn them into one factor per tensor there (:func:`_clip_factors`), which the update
kernels multiply by. The host never reads a norm, so the step stays capturable; the scratch
(doubles: per-tensor sums and factors, per-chunk partial sums) is allocated on the stream and
freed, stream-ordered, when the update has been queued.
"""

from __future__ import annotations

import weakref
from typing import Any, Sequence

import numpy as np

from ..optim import UpdateTables
from . import _common as cm

__all__ = ["sgd_update", "adam_update", "rmsprop_update", "advance_step", "CHUNK", "MIN_CHUNK"]

_FILE = "optim.cu"
CHUNK = 1 << 16  # the most items per chunk: few table entries for large models
MIN_CHUNK = 1 << 10  # the fewest: one pass of a 256-thread block at 4 items per thread
TARGET_CHUNKS = 512  # about 4 blocks per SM on an H200 (132 SMs): enough loads in flight
TABLE_COLS = 8  # per tensor: param, grad, state0..2, size, first chunk, vectorised (optim.cu)
_VECTOR_BYTES = 16
# The tables of callers that pass none, kept with their first parameter array (by identity, weakly):
# they die with it, and an address can never find another array's tables here.
_tables_of_params: "weakref.WeakKeyDictionary[Any, UpdateTables]" = weakref.WeakKeyDictionary()
_PARAM_SUFFIX = {cm.F32: "f32", cm.F64: "f64", cm.F16: "f16"}


def _tables_for(tables: "UpdateTables | None", params: list) -> UpdateTables:
    if tables is not None:
        return tables
    kept = _tables_of_params.get(params[0])
    if kept is None:
        kept = _tables_of_params[params[0]] = UpdateTables()
    return kept


def chunk_items(total: int) -> int:
    """Items per chunk for a group of ``total`` items: a power of two, MIN_CHUNK..CHUNK."""
    want = -(-int(total) // TARGET_CHUNKS)
    return min(CHUNK, max(MIN_CHUNK, 1 << max(0, want - 1).bit_length()))


def _vectorisable(arrays: Sequence[Any], vw: int) -> bool:
    """Whether every array (None: unused) allows ``vw``-item vector access at chunk starts: its
    address aligned to ``min(16, vw * itemsize)`` bytes (what optim.cu's load_pack needs)."""
    for a in arrays:
        if a is not None and cm.ptr(a) % min(_VECTOR_BYTES, vw * np.dtype(a.dtype).itemsize):
            return False
    return True


def _static_key(params: list, grads: list, states: Sequence["list | None"], device: int) -> tuple:
    """The part of a group's table key the gradients' addresses do not change (see _table)."""
    cols = [params] + [s if s is not None else [None] * len(params) for s in states]
    return ((device, params[0].dtype, grads[0].dtype) + tuple([tuple([0 if a is None else a.ptr for a in col])
                                                               for col in cols])
            + (tuple([int(p.size) for p in params]),))


def _table(params: list, grads: list, states: Sequence["list | None"], stream,
           tables: UpdateTables, static_key: "tuple | None" = None) -> "tuple[Any, int, int, int]":
    """(device table, ntensors, nchunks, chunk items) for one dtype group, kept in ``tables`` by
    pointers and sizes. ``static_key``: :func:`_static_key` of these lists, kept by a caller that
    updates the same parameters and states every step (a ``PreparedUpdate``)."""
    capturing = stream.is_capturing()
    if not capturing:
        # The key is the table's whole content (with the group's dtypes, on which the vector
        # flags depend), so a hit is right even when other arrays now live at these addresses.
        # (list comprehensions, not generators: this runs for every step of an eager loop)
        if static_key is None:
            static_key = _static_key(params, grads, states, stream.device_index)
        key = static_key + (tuple([g.ptr for g in grads]),)
        hit = tables._get(key)
        if hit is not None:
            return hit
    cols = [params, grads] + [s if s is not None else [None] * len(params) for s in states]
    cols += [[None] * len(params)] * (5 - len(cols))
    sizes = [int(p.size) for p in params]
    n = len(params)
    chunk = chunk_items(sum(sizes))
    vw = _VECTOR_BYTES // np.dtype(params[0].dtype).itemsize
    chunks = [(t, start) for t, size in enumerate(sizes) for start in range(0, size, chunk)]
    host = np.zeros(TABLE_COLS * n + 2 * len(chunks), dtype=np.int64)
    first = 0
    for t in range(n):
        row = [col[t] for col in cols]
        host[TABLE_COLS * t: TABLE_COLS * t + 5] = [cm.ptr(a) for a in row]
        host[TABLE_COLS * t + 5: TABLE_COLS * (t + 1)] = [sizes[t], first, _vectorisable(row, vw)]
        first += -(-sizes[t] // chunk)
    if chunks:
        host[TABLE_COLS * n:] = np.asarray(chunks, dtype=np.int64).reshape(-1)
    from ...cuda.array import constant

    # constant(), not to_device(): the table may first be needed while a train step is being
    # captured into a CUDA graph (the gradients' addresses are the graph's own then).
    entry = (constant(host, stream=stream), n, len(chunks), chunk)
    if capturing:
        # Made inside a capture, the table is graph memory: it must die inside the capture (the
        # graph frees it after the update and re-uploads it from its own pinned bytes at every
        # replay). Kept, it would outlive the step as an allocation the graph still owned. Nor is
        # a kept table used while capturing: the graph would address memory `tables` may drop.
        return entry
    tables._put(key, entry)
    return entry


def _groups(params: list, grads: list, states: Sequence["list | None"]) -> dict:
    """{(param suffix, grad suffix): (params, grads, states...)} preserving order."""
    # The common case, one group (every parameter and every gradient of one dtype each), in one
    # pass of comparisons instead of a dict entry and appends per tensor; the lists are the
    # caller's (nothing below writes into them).
    pd, gd = params[0].dtype, grads[0].dtype
    for p, g in zip(params, grads):
        if p.dtype != pd or g.dtype != gd:
            break
    else:
        psfx = _PARAM_SUFFIX.get(pd)
        if psfx is not None:
            return {(psfx, cm.suffix(gd)): (params, grads, list(states))}
    groups: dict = {}
    for i, (p, g) in enumerate(zip(params, grads)):
        try:
            key = (_PARAM_SUFFIX[np.dtype(p.dtype)], cm.suffix(g.dtype))
        except KeyError:
            raise TypeError(f"optimizer update: params[{i}] has dtype {p.dtype}; the CUDA kernels update "
                            "float32, float64 or float16 parameters") from None
        entry = groups.setdefault(key, ([], [], [[] for _ in states]))
        entry[0].append(p)
        entry[1].append(g)
        for k, st in enumerate(states):
            entry[2][k].append(None if st is None else st[i])
    return {k: (ps, gs, [None if states[j] is None else sts[j] for j in range(len(states))])
            for k, (ps, gs, sts) in groups.items()}


def _skip(skip: Any, op: str) -> "tuple[bool, int]":
    """(skip now on the host, device flag pointer)."""
    from ...backend import is_device_array

    if skip is None:
        return False, 0
    if is_device_array(skip):
        if skip.size != 1 or np.dtype(skip.dtype) != np.int32:
            raise TypeError(f"{op}: skip as a device array must be one int32 element, got {skip.dtype} "
                            f"{tuple(skip.shape)}")
        return False, int(skip.ptr)
    return bool(int(np.asarray(skip))), 0


def _inv_scale(grad_scale: Any, op: str) -> "tuple[float, int]":
    value, ptr = cm.device_scalar_ptr(grad_scale, op, "grad_scale")
    if grad_scale is None:
        return 1.0, 0
    if ptr:
        return 1.0, ptr
    if value == 0:
        raise ValueError(f"{op}: grad_scale must be nonzero")
    return 1.0 / value, 0


def _step(step: Any, op: str) -> "tuple[float, int, int]":
    """(host step, device pointer, kind 0 host / 1 float32 / 2 int32 / 3 int64)."""
    from ...backend import is_device_array

    if is_device_array(step):
        kinds = {np.dtype(np.float32): 1, np.dtype(np.int32): 2, np.dtype(np.int64): 3}
        kind = kinds.get(np.dtype(step.dtype))
        if kind is None or step.size != 1:
            raise TypeError(f"{op}: step as a device array must be one float32/int32/int64 element, got "
                            f"{step.dtype} {tuple(step.shape)}")
        return 0.0, int(step.ptr), kind
    t = float(np.asarray(step))
    if t < 1:
        raise ValueError(f"{op}: step must be >= 1 (the 1-based update count), got {t}")
    return t, 0, 0


_CLIP_MODES = {"norm": 1, "global_norm": 2}


def _prepare(params: list, grads: list, states: list, stream, tables: "UpdateTables | None",
             prepared: Any = None) -> dict:
    """{group key: (params, grads, states, (table, ntensors, nchunks, chunk))}: one table per dtype
    group, shared by the clipping reduction and the update. ``prepared`` (an
    ``kernels.optim.PreparedUpdate`` of these parameters and states) keeps, per tuple of gradient
    dtypes, the grouping (gradient indices, parameter and state lists) and each group's static key."""
    tables = _tables_for(tables, params)
    if prepared is None:
        return {key: (ps, gs, sts, _table(ps, gs, sts, stream, tables))
                for key, (ps, gs, sts) in _groups(params, grads, states).items()}
    dtypes = tuple([g.dtype for g in grads])
    grouping = prepared._groupings.get((dtypes, stream.device_index))
    if grouping is None:
        grouping = prepared._groupings[(dtypes, stream.device_index)] = _grouping(params, grads, states,
                                                                                  stream.device_index)
    out = {}
    for key, idx, ps, sts, static in grouping:
        gs = grads if idx is None else [grads[i] for i in idx]
        out[key] = (ps, gs, sts, _table(ps, gs, sts, stream, tables, static))
    return out


def _grouping(params: list, grads: list, states: list, device: int) -> list:
    """[(group key, gradient indices or None for all, params, states, static key)]: _groups' groups,
    with where each group's gradients sit in ``grads``."""
    groups = _groups(params, grads, states)
    if len(groups) == 1:
        (key, (ps, gs, sts)), = groups.items()
        return [(key, None, ps, sts, _static_key(ps, gs, sts, device))]
    # _groups makes its groups in first-seen order, each in parameter order: the same walk
    indices: dict = {}
    for i, (p, g) in enumerate(zip(params, grads)):
        indices.setdefault((_PARAM_SUFFIX[np.dtype(p.dtype)], cm.suffix(g.dtype)), []).append(i)
    return [(key, indices[key], ps, sts, _static_key(ps, gs, sts, device)) for key, (ps, gs, sts) in groups.items()]


def _clip_factors(groups: dict, clip: Any, inv: float, gs_ptr: int, skip_ptr: int, stream) -> "tuple[Any, dict]":
    """For clipnorm / global_clipnorm: (scratch array to keep alive until the updates are queued,
    {group key: device pointer to that group's per-tensor factors (float64)}); (None, {}) otherwise."""
    mode = _CLIP_MODES.get(getattr(clip, "mode", None))
    if mode is None:
        return None, {}
    ntotal = sum(entry[1] for _, _, _, entry in groups.values())
    nchunks_total = sum(entry[2] for _, _, _, entry in groups.values())
    scratch = cm.empty((2 * ntotal + max(nchunks_total, 1),), cm.F64, stream)
    sumsq_ptr, factors_ptr, partial_ptr = scratch.ptr, scratch.ptr + 8 * ntotal, scratch.ptr + 16 * ntotal
    pointers = {}
    tensor_offset = chunk_offset = 0
    for key, (params, _, _, (table, n, nchunks, chunk)) in groups.items():
        partial = partial_ptr + 8 * chunk_offset
        sumsq = sumsq_ptr + 8 * tensor_offset
        head = (cm.p(table), cm.i64(n), cm.i64(nchunks))
        vw = _VECTOR_BYTES // np.dtype(params[0].dtype).itemsize
        if nchunks:
            cm.launch_rows(_FILE, f"grad_sumsq_{key[1]}", nchunks,
                           head + (cm.i64(chunk), cm.p(partial), cm.i32(vw)), stream, max_grid=4096)
        # also for a group of empty tensors: their sums must read 0, not stale memory
        cm.launch(_FILE, "tensor_sumsq", n, head + (cm.p(partial), cm.p(sumsq)), stream, block=64)
        pointers[key] = factors_ptr + 8 * tensor_offset
        tensor_offset += n
        chunk_offset += nchunks
    cm.launch(_FILE, "clip_factors", 1, (cm.p(sumsq_ptr), cm.i64(ntotal), cm.p(factors_ptr), cm.i32(mode),
                                         cm.f64(clip.value), cm.f64(inv), cm.p(gs_ptr), cm.p(skip_ptr)),
              stream, block=32)
    return scratch, pointers


def _launch(name: str, group_key: tuple, entry: tuple, args: tuple, clip: Any, clip_ptrs: dict, stream) -> None:
    table, n, nchunks, chunk = entry
    if nchunks == 0:
        return
    clipvalue = clip.value if getattr(clip, "mode", None) == "value" else 0.0
    cm.launch_rows(_FILE, f"{name}_{group_key[0]}_{group_key[1]}", nchunks,
                   (cm.p(table), cm.i64(n), cm.i64(nchunks), cm.i64(chunk)) + args
                   + (cm.p(clip_ptrs.get(group_key, 0)), cm.f32(clipvalue)), stream, max_grid=4096)


def sgd_update(params: list, grads: list, velocities: "list | None", *, lr: Any, momentum: float = 0.0,
               nesterov: bool = False, weight_decay: float = 0.0, grad_scale: Any = None, skip: Any = None,
               clip: Any = None, tables: "UpdateTables | None" = None, stream: Any = None,
               prepared: Any = None) -> None:
    """SGD (momentum, nesterov, decoupled weight decay) in place over every tensor."""
    op = "sgd_update"
    s = cm.stream_of(stream)
    skip_now, skip_ptr = _skip(skip, op)
    if skip_now:
        return None
    lr_v, lr_ptr = cm.device_scalar_ptr(lr, op, "lr")
    inv, gs_ptr = _inv_scale(grad_scale, op)
    groups = _prepare(params, grads, [velocities if momentum else None], s, tables, prepared)
    scratch, clip_ptrs = _clip_factors(groups, clip, inv, gs_ptr, skip_ptr, s)
    for key, (_, _, _, entry) in groups.items():
        _launch("sgd", key, entry, (cm.f32(lr_v), cm.p(lr_ptr), cm.f32(momentum), cm.i32(bool(nesterov)),
                                    cm.f32(weight_decay), cm.f64(inv), cm.p(gs_ptr), cm.p(skip_ptr)),
                clip, clip_ptrs, s)
    del scratch  # freed stream-ordered, after the updates that read it
    return None


def adam_update(params: list, grads: list, m: list, v: list, *, lr: Any, step: Any, beta1: float = 0.9,
                beta2: float = 0.999, epsilon: float = 1e-7, weight_decay: float = 0.0, amsgrad: bool = False,
                vhat: "list | None" = None, grad_scale: Any = None, skip: Any = None, clip: Any = None,
                tables: "UpdateTables | None" = None, stream: Any = None, prepared: Any = None) -> None:
    """Adam / AdamW (amsgrad optional) in place over every tensor; ``step`` is 1-based."""
    op = "adam_update"
    s = cm.stream_of(stream)
    skip_now, skip_ptr = _skip(skip, op)
    if skip_now:
        return None
    lr_v, lr_ptr = cm.device_scalar_ptr(lr, op, "lr")
    step_v, step_ptr, step_kind = _step(step, op)
    inv, gs_ptr = _inv_scale(grad_scale, op)
    groups = _prepare(params, grads, [m, v, vhat if amsgrad else None], s, tables, prepared)
    scratch, clip_ptrs = _clip_factors(groups, clip, inv, gs_ptr, skip_ptr, s)
    for key, (_, _, _, entry) in groups.items():
        _launch("adam", key, entry,
                (cm.f32(lr_v), cm.p(lr_ptr), cm.f64(step_v), cm.p(step_ptr), cm.i32(step_kind), cm.f64(beta1),
                 cm.f64(beta2), cm.f32(epsilon), cm.f32(weight_decay), cm.i32(bool(amsgrad)), cm.f64(inv),
                 cm.p(gs_ptr), cm.p(skip_ptr)), clip, clip_ptrs, s)
    del scratch  # freed stream-ordered, after the updates that read it
    return None


def rmsprop_update(params: list, grads: list, avg_sq: list, *, lr: Any, rho: float = 0.9, momentum: float = 0.0,
                   epsilon: float = 1e-7, centered: bool = False, mom: "list | None" = None,
                   avg: "list | None" = None, weight_decay: float = 0.0, grad_scale: Any = None, skip: Any = None,
                   clip: Any = None, tables: "UpdateTables | None" = None, stream: Any = None,
                   prepared: Any = None) -> None:
    """RMSprop (momentum, centered; epsilon inside the root as Keras) in place over every tensor."""
    op = "rmsprop_update"
    s = cm.stream_of(stream)
    skip_now, skip_ptr = _skip(skip, op)
    if skip_now:
        return None
    lr_v, lr_ptr = cm.device_scalar_ptr(lr, op, "lr")
    inv, gs_ptr = _inv_scale(grad_scale, op)
    groups = _prepare(params, grads, [avg_sq, mom if momentum else None, avg if centered else None], s, tables,
                      prepared)
    scratch, clip_ptrs = _clip_factors(groups, clip, inv, gs_ptr, skip_ptr, s)
    for key, (_, _, _, entry) in groups.items():
        _launch("rmsprop", key, entry,
                (cm.f32(lr_v), cm.p(lr_ptr), cm.f32(rho), cm.f32(momentum), cm.f32(epsilon), cm.i32(bool(centered)),
                 cm.f32(weight_decay), cm.f64(inv), cm.p(gs_ptr), cm.p(skip_ptr)), clip, clip_ptrs, s)
    del scratch  # freed stream-ordered, after the updates that read it
    return None


def advance_step(step: Any, *, skip: Any = None, stream: Any = None) -> None:
    """``step += 1`` on the device unless ``skip`` (a number, or a 0-d int32 device flag read by the kernel)."""
    op = "advance_step"
    s = cm.stream_of(stream)
    skip_now, skip_ptr = _skip(skip, op)
    if skip_now:
        return None
    _, step_ptr, step_kind = _step(step, op)
    if not step_ptr:
        raise TypeError(f"{op}: step must be a one-element float32/int32/int64 DeviceArray (advanced in place)")
    cm.launch(_FILE, "advance_step", 1, (cm.p(step), cm.i32(step_kind), cm.p(skip_ptr)), s, block=32)
    return None
