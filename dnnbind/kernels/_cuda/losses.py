"""Losses on NVRTC kernels (``losses.cu``): loss and gradient in one pass.

Each kernel writes the per-row (or per-element) loss into a float64 scratch buffer and the
gradient into ``dpred``; the buffer is then summed in a fixed order (one block, or for large buffers
fixed chunks then one block over their partial sums) into the 0-d loss (float32, float64 for float64 predictions). No atomics: results are bitwise
reproducible. ``grad_scale`` may be a number or a 0-d float32 DeviceArray (read at run time,
so a captured CUDA graph follows a changing loss scale). A sparse label outside [0, C) makes
that row's loss and gradient NaN (the kernel cannot raise). ``sample_weight`` (None, or an
``(N,)`` float32 DeviceArray, read on the device so a captured step takes each batch's weights
from its static buffer) multiplies each sample's loss and gradient; the mean still divides by the
batch size (Keras 3's ``sum_over_batch_size``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import _common as cm
from .elementwise import cast

__all__ = ["softmax_cross_entropy", "crossentropy_from_probs", "binary_crossentropy", "mean_squared_error",
           "CLIP_EPSILON"]

CLIP_EPSILON = 1e-7  # Keras's backend epsilon (dnnbind.kernels.losses.CLIP_EPSILON)
_FILE = "losses.cu"
_I32, _I64 = np.dtype(np.int32), np.dtype(np.int64)


def _loss_dtype(dtype) -> np.dtype:
    return cm.F64 if dtype == cm.F64 else cm.F32


#: values per block of the first stage of a large sum (sum_partials_f64); at most 1024 partials stay for the
#: one-block second stage up to 16M values, more beyond
_CHUNK = 16384
_ONE_BLOCK_MAX = 65536  # below this one block sums the values directly


def _finish(values: Any, count: int, n_values: int, dtype, stream) -> Any:
    """0-d loss = sum(values) / count, on the device: one block for small buffers, else a two-stage sum over
    fixed chunks (all SMs busy; the order depends on ``n_values`` only: deterministic)."""
    lt = _loss_dtype(dtype)
    loss = cm.empty((), lt, stream)
    if n_values > _ONE_BLOCK_MAX:
        blocks = -(-n_values // _CHUNK)
        partials = cm.empty((blocks,), cm.F64, stream)
        cm.launch_rows(_FILE, "sum_partials_f64", blocks, (cm.p(values), cm.p(partials), cm.i64(n_values),
                                                          cm.i64(_CHUNK)), stream, block=512,
                       max_grid=2**31 - 1)
        values, n_values = partials, blocks
    cm.launch_rows(_FILE, f"sum_to_scalar_{cm.suffix(lt)}", 1,
                   (cm.p(values), cm.p(loss), cm.i64(n_values), cm.f64(1.0 / count if count else float("nan"))),
                   stream, block=1024)
    return loss


def _labels(labels: Any, pred: Any, stream) -> "tuple[Any, str]":
    """(device labels, kernel suffix): int32/int64 indices, or dense rows in pred's dtype."""
    if labels.dtype.kind in "iu":
        if labels.dtype not in (_I32, _I64):
            labels = cast(labels, _I64, stream=stream)
        return labels, cm.suffix(labels.dtype)
    if labels.dtype != pred.dtype:
        labels = cast(labels, pred.dtype, stream=stream)
    return labels, "dense"


def _row_loss(kernel: str, pred: Any, labels: Any, ls: float, grad_scale: Any, extra: tuple, op: str,
              sample_weight: Any, stream: Any) -> "tuple[Any, Any]":
    s = cm.stream_of(stream)
    n, c = int(pred.shape[0]), int(pred.shape[1])
    gs, gs_ptr = cm.device_scalar_ptr(grad_scale, op, "grad_scale")
    lab, kind = _labels(labels, pred, s)
    dpred = cm.empty(pred.shape, pred.dtype, s)
    rows = cm.empty((max(n, 1),), cm.F64, s)
    cm.launch_rows(_FILE, f"{kernel}_{cm.suffix(pred.dtype)}_{kind}", n,
                   (cm.p(pred), cm.p(lab), cm.p(dpred), cm.p(rows), cm.i64(n), cm.i64(c), cm.f32(ls), cm.f32(gs),
                    cm.p(gs_ptr)) + extra + (cm.p(sample_weight),), s)
    return _finish(rows, n, n, pred.dtype, s), dpred


def softmax_cross_entropy(logits: Any, labels: Any, *, label_smoothing: float = 0.0, grad_scale: Any = 1.0,
                          sample_weight: Any = None, stream: Any = None) -> "tuple[Any, Any]":
    """Fused softmax + cross-entropy: (mean loss, dlogits = w (softmax - y) / N * grad_scale)."""
    return _row_loss("softmax_xent", logits, labels, float(label_smoothing), grad_scale, (),
                     "softmax_cross_entropy", sample_weight, stream)


def crossentropy_from_probs(probs: Any, labels: Any, *, label_smoothing: float = 0.0, grad_scale: Any = 1.0,
                            sample_weight: Any = None, stream: Any = None) -> "tuple[Any, Any]":
    """Keras categorical cross-entropy of probabilities (rows renormalised, clipped to [1e-7, 1 - 1e-7])."""
    return _row_loss("probs_xent", probs, labels, float(label_smoothing), grad_scale, (cm.f32(CLIP_EPSILON),),
                     "crossentropy_from_probs", sample_weight, stream)


def _elementwise(kind: int, pred: Any, target: Any, ls: float, grad_scale: Any, op: str, sample_weight: Any,
                 stream: Any) -> "tuple[Any, Any]":
    s = cm.stream_of(stream)
    if target.dtype != pred.dtype:
        target = cast(target, pred.dtype, stream=s)
    n = int(pred.size)
    gs, gs_ptr = cm.device_scalar_ptr(grad_scale, op, "grad_scale")
    dpred = cm.empty(pred.shape, pred.dtype, s)
    elem = cm.empty((max(n, 1),), cm.F64, s)
    cm.launch(_FILE, f"elementwise_loss_{cm.suffix(pred.dtype)}", n,
              (cm.p(pred), cm.p(target), cm.p(dpred), cm.p(elem), cm.i64(n), cm.i32(kind), cm.f32(ls), cm.f32(gs),
               cm.p(gs_ptr), cm.f32(CLIP_EPSILON), cm.p(sample_weight),
               cm.i64(max(n // max(int(pred.shape[0]), 1), 1) if pred.ndim else 1)), s)
    if n == 0:
        loss = cm.empty((), _loss_dtype(pred.dtype), s)
        cm.memset(loss, 0, s)
        return loss, dpred
    return _finish(elem, n, n, pred.dtype, s), dpred


def binary_crossentropy(pred: Any, target: Any, *, from_logits: bool = False, label_smoothing: float = 0.0,
                        grad_scale: Any = 1.0, sample_weight: Any = None, stream: Any = None) -> "tuple[Any, Any]":
    """Binary cross-entropy averaged over every element (targets smoothed toward 0.5 by ls/2)."""
    return _elementwise(0 if from_logits else 1, pred, target, float(label_smoothing), grad_scale,
                        "binary_crossentropy", sample_weight, stream)


def mean_squared_error(pred: Any, target: Any, *, grad_scale: Any = 1.0, sample_weight: Any = None,
                       stream: Any = None) -> "tuple[Any, Any]":
    """mean((pred - target)^2) and its gradient 2 (pred - target) / size * grad_scale (times the weights)."""
    return _elementwise(2, pred, target, 0.0, grad_scale, "mean_squared_error", sample_weight, stream)
