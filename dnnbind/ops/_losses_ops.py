"""Losses of ``keras.ops.nn``: ``binary_crossentropy``, ``categorical_crossentropy``,
``sparse_categorical_crossentropy`` (elementwise / per-sample, no reduction, as Keras), ``ctc_loss`` and
``ctc_decode``.

The two categorical cross-entropies are one fused node each: the forward is
:mod:`dnnbind.kernels.crossentropy` (one pass computing every row's loss and its gradient: softmax
cross-entropy for ``from_logits=True``, Keras's renormalise-and-clip rule otherwise), and the VJP
reuses that saved gradient, scaled by the incoming per-sample gradient (no kernel at all when that
is a host-known ``FilledTensor`` of ones, one scale when it is another number). Recorded by an outer
tape (higher-order gradients), the VJP is the same derivative in ops. A class axis other than the
last is moved there first.

``ctc_loss`` is the forward (alpha) recursion of Keras's JAX backend (optax's ``ctc_loss``) in ops,
one time step after another, differentiable through autodiff. ``ctc_decode``'s greedy strategy runs
on the device; ``beam_search`` (Keras's JAX algorithm, step for step) runs on the host, as
TensorFlow's beam-search decoder does.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import backend
from ..autodiff.engine import recording
from ..autodiff.tensor import Tensor
from ..kernels import crossentropy as _xent
from ..kernels import numeric as N
from . import _core
from ._activations import log_softmax, softmax
from ._core import is_float, keras_op, make, np_dtype, result_type, tensors
from ._elementwise import (add, cast, clip, divide, equal, greater, less, log, logaddexp, logical_and, multiply,
                           negative, softplus, subtract, where)
from ._nn_common import as_float, op, to_dtype
from ._reductions import sum

__all__ = ["binary_crossentropy", "categorical_crossentropy", "sparse_categorical_crossentropy", "ctc_loss",
           "ctc_decode"]


def _float_dtype(*ts: Tensor) -> np.dtype:
    dt = np_dtype(result_type(*ts))
    return dt if is_float(dt) else _core.floatx()


# ------------------------------------------------------------------------------------------ binary
@keras_op(family="nn")
def binary_crossentropy(target: Any, output: Any, from_logits: bool = False) -> Tensor:
    """``keras.ops.binary_crossentropy``: the elementwise loss (no reduction); probabilities are clipped to
    ``[epsilon, 1 - epsilon]``; from logits, ``softplus(x) - t * x`` (= ``-t log sigmoid(x) - (1 - t)
    log sigmoid(-x)``)."""
    t, o = tensors(target, output)
    if tuple(t.shape) != tuple(o.shape):
        raise ValueError("binary_crossentropy: Arguments `target` and `output` must have the same shape. Received: "
                         f"target.shape={tuple(t.shape)}, output.shape={tuple(o.shape)}")
    dt = _float_dtype(t, o)
    t, o = to_dtype(t, dt), to_dtype(o, dt)
    if from_logits:
        return subtract(softplus(o), multiply(t, o))
    eps = backend.epsilon()
    p = clip(o, eps, 1.0 - eps)
    return negative(add(multiply(t, log(p)), multiply(subtract(1.0, t), log(subtract(1.0, p)))))


# ------------------------------------------------------------------------------------- categorical
def _log_probs(z: Tensor, from_logits: bool) -> Tensor:
    """The log-probabilities the loss uses, in ops: ``log_softmax(z)``, or ``log(clip(z / sum(z)))``."""
    if from_logits:
        return log_softmax(z)
    eps = backend.epsilon()
    return log(clip(divide(z, sum(z, axis=-1, keepdims=True)), eps, 1.0 - eps))


def _rows_grad_composed(z: Tensor, t: Tensor, from_logits: bool) -> Tensor:
    """d(row loss)/dz in ops (for a recording backward): ``softmax(z) sum(t) - t``, or through the
    renormalisation and the clip."""
    total_t = sum(t, axis=-1, keepdims=True)
    if from_logits:
        return subtract(multiply(softmax(z), total_t), t)
    eps = backend.epsilon()
    total = sum(z, axis=-1, keepdims=True)
    p = divide(z, total)
    inside = logical_and(greater(p, eps), less(p, 1.0 - eps))
    gp = where(inside, negative(divide(t, clip(p, eps, 1.0 - eps))), 0.0)
    return divide(subtract(gp, sum(multiply(gp, p), axis=-1, keepdims=True)), total)


def _crossentropy_rows(owner: str, labels: Tensor, z: Tensor, sparse: bool, from_logits: bool) -> Tensor:
    """One fused node: per-row losses of ``z`` ``(M, C)`` against ``labels`` (``(M,)`` ints or ``(M, C)``)."""
    fn = _xent.softmax_cross_entropy_rows if from_logits else _xent.crossentropy_from_probs_rows
    losses, grad = fn(z.data, labels.data)
    m, c = int(z.shape[0]), int(z.shape[1])

    def backward(node: Any, g: Tensor) -> tuple:
        need = node.needs_input_grad
        col = op("reshape")(g, (m, 1))
        dense = None if not (need[0] or recording()) else (
            labels if not sparse else op("one_hot")(labels, c, dtype=z.dtype))
        gz = gt = None
        if need[1]:
            if recording():
                gz = multiply(col, _rows_grad_composed(z, dense, from_logits))
            else:  # the saved gradient, times each sample's incoming gradient
                gz = multiply(Tensor(grad), col)
        if need[0] and not sparse:
            gt = negative(multiply(col, _log_probs(z, from_logits)))
        return gt, gz

    return make(losses, (None if sparse else labels, z), backward, owner)


def _class_last(t: Tensor, axis: int) -> Tensor:
    return t if axis == t.ndim - 1 else op("moveaxis")(t, axis, -1)


def _axis(axis: Any, ndim: int, owner: str) -> int:
    if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)) or not -ndim <= int(axis) < ndim:
        raise ValueError(f"{owner}: axis must be an int in [-{ndim}, {ndim}), got {axis!r}")
    return int(axis) % ndim


@keras_op(family="nn")
def categorical_crossentropy(target: Any, output: Any, from_logits: bool = False, axis: int = -1) -> Tensor:
    """``keras.ops.categorical_crossentropy``: ``-sum(target * log p, axis)`` per sample, ``p`` the softmax of
    ``output`` (``from_logits``) or ``output`` renormalised and clipped to ``[epsilon, 1 - epsilon]``. One fused
    kernel each way."""
    owner = "categorical_crossentropy"
    t, o = tensors(target, output)
    if tuple(t.shape) != tuple(o.shape):
        raise ValueError(f"{owner}: Arguments `target` and `output` must have the same shape. Received: "
                         f"target.shape={tuple(t.shape)}, output.shape={tuple(o.shape)}")
    if o.ndim < 1:
        raise ValueError(f"{owner}: Arguments `target` and `output` must be at least rank 1. Received: "
                         f"target.shape={tuple(t.shape)}, output.shape={tuple(o.shape)}")
    ax = _axis(axis, o.ndim, owner)
    dt = _float_dtype(t, o)
    t, o = _class_last(to_dtype(t, dt), ax), _class_last(to_dtype(o, dt), ax)
    lead = tuple(o.shape[:-1])
    c = int(o.shape[-1])
    reshape = op("reshape")
    loss = _crossentropy_rows(owner, reshape(t, (-1, c)), reshape(o, (-1, c)), False, bool(from_logits))
    return reshape(loss, lead)


@keras_op(family="nn")
def sparse_categorical_crossentropy(target: Any, output: Any, from_logits: bool = False, axis: int = -1) -> Tensor:
    """``keras.ops.sparse_categorical_crossentropy``: ``-log p[target]`` per sample (``target`` class indices,
    int32; a trailing axis of 1 is dropped). One fused kernel each way. A class index outside
    ``[0, classes)`` is an error on the CPU and a NaN loss on the device (Keras: a loss of 0)."""
    owner = "sparse_categorical_crossentropy"
    t, o = tensors(target, output)
    if o.ndim < 1:
        raise ValueError(f"{owner}: Argument `output` must be at least rank 1. Received: output.shape={tuple(o.shape)}")
    if t.dtype != np.int32:
        t = cast(t, "int32")
    if t.ndim == o.ndim and t.ndim and t.shape[-1] == 1:
        t = op("squeeze")(t, -1)
    ax = _axis(axis, o.ndim, owner)
    without = tuple(o.shape[:ax]) + tuple(o.shape[ax + 1:])
    if tuple(t.shape) != without:
        raise ValueError(f"{owner}: Arguments `target` and `output` must have the same shape up until the last "
                         f"dimension: target.shape={tuple(t.shape)}, output.shape={tuple(o.shape)}")
    o = _class_last(as_float(o), ax)
    c = int(o.shape[-1])
    reshape = op("reshape")
    loss = _crossentropy_rows(owner, reshape(t, (-1,)), reshape(o, (-1, c)), True, bool(from_logits))
    return reshape(loss, without)


# ---------------------------------------------------------------------------------------- ctc_loss
_LOG_EPSILON = -1e5


def _update_phi(phi: Tensor, added: Tensor) -> Tensor:
    """``phi[:, 1:]`` log-added with ``added`` (``phi[:, 0]`` kept)."""
    get_item = op("get_item")
    return op("concatenate")([get_item(phi, (slice(None), slice(0, 1))),
                              logaddexp(get_item(phi, (slice(None), slice(1, None))), added)], axis=-1)


def _lengths_padding(lengths: Tensor, size: int, dt: np.dtype) -> Tensor:
    """1.0 past each row's length, 0.0 before (a constant)."""
    ar = Tensor(N.iota(size, 0, 1, np.int32, device=lengths.device).reshape(1, size))
    return cast(op("greater_equal")(ar, op("expand_dims")(lengths, -1)), dt)


@keras_op(family="nn")
def ctc_loss(target: Any, output: Any, target_length: Any, output_length: Any, mask_index: int = 0) -> Tensor:
    """``keras.ops.ctc_loss``: the connectionist temporal classification loss per sequence, ``(batch,)``.
    ``target`` ``(batch, max_label_length)`` class ids, ``output`` ``(batch, max_time, classes)`` logits,
    ``mask_index`` the blank class. Keras's JAX algorithm (the alpha recursion in log space, impossible
    transitions at log 1e-5 instead of -inf), in ops over the time steps: differentiable w.r.t. ``output``."""
    owner = "ctc_loss"
    t, o, tl, ol = tensors(target, output, target_length, output_length)
    if o.ndim != 3 or t.ndim != 2:
        raise ValueError(f"{owner}: output must be (batch, time, classes) and target (batch, max_label_length), got "
                         f"shapes {tuple(o.shape)} and {tuple(t.shape)}")
    for name, v in (("target", t), ("target_length", tl), ("output_length", ol)):
        if v.shape[0] != o.shape[0]:
            raise ValueError(f"{owner}: Arguments `{name}` and `output` must have the same first dimension. Received "
                             f"shapes: `{tuple(v.shape)}` and `{tuple(o.shape)}`.")
    dt = np_dtype(result_type(o.dtype, "float32"))
    o = to_dtype(o, dt)
    t = cast(t, "int32") if t.dtype != np.int32 else t
    tl = cast(tl, "int32") if tl.dtype != np.int32 else tl
    ol = cast(ol, "int32") if ol.dtype != np.int32 else ol
    batch, steps, classes = (int(s) for s in o.shape)
    labels = int(t.shape[1])
    get_item, transpose, reshape = op("get_item"), op("transpose"), op("reshape")
    target_pad = _lengths_padding(tl, labels, dt)
    output_pad = _lengths_padding(ol, steps, dt)
    logprobs = log_softmax(o)
    label_lengths = cast(subtract(float(labels), sum(target_pad, axis=1)), "int32")
    if labels > 1:
        repeat = cast(equal(get_item(t, (slice(None), slice(None, -1))), get_item(t, (slice(None), slice(1, None)))),
                      dt)
        repeat = op("pad")(repeat, ((0, 0), (0, 1)))
    else:
        repeat = Tensor(N.full((batch, labels), 0.0, dt, device=o.device))
    phi_lp = transpose(get_item(logprobs, (slice(None), slice(None), slice(mask_index, mask_index + 1))), (1, 0, 2))
    hot = op("one_hot")(t, classes, dtype=dt)
    emit_lp = transpose(op("matmul")(logprobs, transpose(hot, (0, 2, 1))), (1, 0, 2))  # (T, B, N)
    phi = Tensor(N.pad(N.full((batch, labels), _LOG_EPSILON, dt, device=o.device), ((0, 0), (1, 0))))
    emit = Tensor(N.full((batch, labels), _LOG_EPSILON, dt, device=o.device))
    no_repeat = multiply(subtract(1.0, repeat), _LOG_EPSILON)
    with_repeat = multiply(repeat, _LOG_EPSILON)
    for step in range(steps):
        lp_emit, lp_phi = get_item(emit_lp, step), get_item(phi_lp, step)
        pad = get_item(output_pad, (slice(None), slice(step, step + 1)))
        phi_before = phi
        phi = _update_phi(phi, add(emit, with_repeat))
        next_emit = logaddexp(add(get_item(phi, (slice(None), slice(None, -1))), lp_emit), add(emit, lp_emit))
        next_phi = _update_phi(add(phi, lp_phi), add(add(emit, lp_phi), no_repeat))
        keep = subtract(1.0, pad)
        emit = add(multiply(pad, emit), multiply(keep, next_emit))
        phi = add(multiply(pad, phi_before), multiply(keep, next_phi))
    last = _update_phi(phi, emit)
    pick = op("one_hot")(label_lengths, labels + 1, dtype=dt)
    return negative(sum(multiply(last, pick), axis=1))


# -------------------------------------------------------------------------------------- ctc_decode
def _greedy(x: Tensor, lengths: Tensor, merge_repeated: bool, mask_index: int) -> tuple:
    """Keras's greedy CTC decoding, on the device (kernels.numeric only): per step the best class, blanks
    past each sequence's length, repeats merged, blanks dropped (stable argsort of the kept positions)."""
    batch, steps, _ = (int(s) for s in x.shape)
    i32 = np.dtype(np.int32)
    idx = N.reduce("argmax", x.data, -1)
    scores = N.reduce("max", x.data, -1)
    positions = N.iota(steps, 0, 1, i32, device=x.device).reshape(1, steps)
    past = N.binary("greater_equal", positions, lengths.data.reshape(batch, 1))
    idx = N.where(past, mask_index, idx, dtype=i32)
    scores = N.where(past, 0.0, scores, dtype=x.dtype)
    if merge_repeated and steps > 1:
        same = N.binary("equal", N.strided_copy(idx, (batch, steps - 1), (steps, 1), 1),
                        N.strided_copy(idx, (batch, steps - 1), (steps, 1), 0))
        idx = N.where(N.pad(same, ((0, 0), (1, 0))), mask_index, idx, dtype=i32)
    blank = N.binary("equal", idx, mask_index)
    idx = N.where(blank, -1, idx, dtype=i32)
    order = N.argsort(N.where(blank, steps, positions, dtype=i32), -1)
    decoded = N.take_along_axis(idx, order, -1)
    total = N.unary("negative", N.reduce("sum", scores, -1, True))
    return decoded.reshape(1, batch, steps), total


def _merge_scores(inverse: np.ndarray, scores: np.ndarray) -> np.ndarray:
    with np.errstate(all="ignore"):
        top = scores.max()
        acc = np.zeros_like(scores)
        np.add.at(acc, inverse, np.exp(scores - top))
        return np.log(acc) + top


def _unique_rows(paths: np.ndarray, size: int) -> tuple:
    """``jnp.unique(paths, return_inverse=True, size=size, axis=0, fill_value=-1)``: sorted unique rows padded
    with rows of -1 to ``size``."""
    rows, inverse = np.unique(paths, axis=0, return_inverse=True)
    out = np.full((size, paths.shape[1]), -1, dtype=paths.dtype)
    out[:rows.shape[0]] = rows
    return out, inverse.reshape(-1)


def _beam_search(x: np.ndarray, lengths: np.ndarray, beam_width: int, top_paths: int, mask_index: int) -> tuple:
    """Keras's JAX beam search (``_ctc_beam_search_decode``) in NumPy, step for step (ties broken alike)."""
    batch, steps, classes = x.shape
    shifted = x - x.max(axis=2, keepdims=True)
    logp = shifted - np.log(np.exp(shifted).sum(axis=2, keepdims=True))
    past = np.arange(steps)[None, :] >= lengths.reshape(-1)[:, None]
    logp = np.flip(logp, axis=2)  # Keras flips the classes to break ties as TensorFlow does
    mask = classes - mask_index - 1
    width2 = 2 * beam_width
    n_init = min(classes, beam_width)
    all_paths, all_scores = [], []
    for b in range(batch):
        first = np.argsort(logp[b, 0], kind="stable")[-n_init:]
        paths = np.full((width2, steps), -1, np.int32)
        paths[:n_init, 0] = np.where(first == mask, -1, first)
        scores = np.full(width2, -np.inf, logp.dtype)
        scores[:n_init] = logp[b, 0, first]
        masked = paths[:, 0] == -1
        for t in range(1, steps):
            if past[b, t]:
                continue
            paths, scores, masked = _beam_step(paths, scores, masked, logp[b, t], classes, mask, beam_width)
        paths, inverse = _unique_rows(paths, 2 * classes * beam_width)
        scores = _merge_scores(inverse, scores)
        top = np.argsort(scores, kind="stable")[-top_paths:][::-1]
        all_paths.append(paths[top])
        all_scores.append(scores[top])
    paths = np.stack(all_paths)
    paths = np.where(paths == -1, -1, classes - paths - 1).astype(np.int32)
    return np.ascontiguousarray(paths.transpose(1, 0, 2)), np.stack(all_scores).astype(x.dtype)


def _beam_step(paths: np.ndarray, scores: np.ndarray, masked: np.ndarray, x: np.ndarray, classes: int, mask: int,
               beam_width: int) -> tuple:
    width2 = 2 * beam_width
    paths = np.repeat(paths, classes, axis=0)
    scores = np.repeat(scores, classes)
    prev_masked = np.repeat(masked, classes)
    tail = np.argmax(paths == -1, axis=1)
    rows = np.arange(width2 * classes)
    tails = np.where(tail == 0, -1, paths[rows, tail - 1])
    cls = np.arange(classes)
    cls[mask] = -1
    cls = np.tile(cls, width2)
    masked = cls == -1
    cls = np.where(~prev_masked & (tails == cls), -1, cls)
    paths[rows, tail] = cls
    scores = scores + np.tile(x, width2)
    paths, inverse = _unique_rows(paths, 2 * classes * beam_width)
    emit = _merge_scores(inverse, np.where(masked, -np.inf, scores))
    blank = _merge_scores(inverse, np.where(masked, scores, -np.inf))
    with np.errstate(all="ignore"):
        total = np.logaddexp(emit, blank)
    top = np.argsort(total, kind="stable")[-beam_width:]
    return (np.tile(paths[top], (2, 1)), np.concatenate([emit[top], blank[top]]),
            np.concatenate([np.zeros(beam_width, bool), np.ones(beam_width, bool)]))


@keras_op(family="nn", differentiable=False)
def ctc_decode(inputs: Any, sequence_lengths: Any, strategy: str = "greedy", beam_width: int = 100,
               top_paths: int = 1, merge_repeated: bool = True, mask_index: Any = 0) -> tuple:
    """``keras.ops.ctc_decode``: ``(decoded (top_paths, batch, max_time) int32, scores)``; blanks and merged
    repeats removed, -1 padding at the end. ``"greedy"`` (scores ``(batch, 1)``: minus the summed maxima)
    runs on the device; ``"beam_search"`` (log-probability scores ``(batch, top_paths)``) on the host."""
    owner = "ctc_decode"
    x, lengths = tensors(inputs, sequence_lengths)
    if x.ndim != 3:
        raise ValueError(f"{owner}: inputs must be (batch, max_time, classes), got shape {tuple(x.shape)}")
    x = to_dtype(x, np_dtype(result_type(x.dtype, "float32")))
    lengths = cast(lengths, "int32") if lengths.dtype != np.int32 else lengths
    classes = int(x.shape[2])
    mask = classes - 1 if mask_index is None else int(mask_index)
    if strategy == "greedy":
        decoded, scores = _greedy(x, lengths, bool(merge_repeated), mask)
        return Tensor(decoded), Tensor(scores)
    if strategy == "beam_search":
        if int(top_paths) > int(beam_width) or int(top_paths) < 1:
            raise ValueError(f"{owner}: top_paths must be in [1, beam_width={beam_width}], got {top_paths}")
        # a host computation: beam pruning is data-dependent control flow (TensorFlow's decoder is CPU-only too)
        paths, scores = _beam_search(x.numpy(), lengths.numpy(), int(beam_width), int(top_paths), mask)
        like = x.data if backend.is_device_array(x.data) else None
        return _core.tensor(paths, like), _core.tensor(scores, like)
    raise ValueError(f"{owner}: Invalid strategy {strategy}. Supported values are 'greedy' and 'beam_search'.")
