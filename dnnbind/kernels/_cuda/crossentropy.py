"""Per-row categorical cross-entropy on the device: ``losses.cu``'s fused row kernels.

``softmax_xent_*`` and ``probs_xent_*`` (see :mod:`dnnbind.kernels._cuda.losses`) write each row's loss
into a float64 buffer and the gradient scaled by ``grad_scale / N``. Launched here with
``grad_scale = N`` (so the scale is exactly 1: the same float32 value divided by itself), no label
smoothing and no sample weights, they give each row's loss and the gradient of that row's own loss;
the buffer is then cast to the predictions' dtype (one small launch). No reduction, no synchronisation.
"""

from __future__ import annotations

from typing import Any

from . import _common as cm
from .elementwise import cast
from .losses import CLIP_EPSILON, _FILE, _labels

__all__ = ["softmax_cross_entropy_rows", "crossentropy_from_probs_rows", "KERNELS"]

#: the losses.cu kernel families launched here (name prefixes; ``tests/test_kernels_crossentropy.py``
#: checks their parameter lists against the arguments passed)
KERNELS = ("softmax_xent", "probs_xent")


def _rows(kernel: str, pred: Any, labels: Any, extra: tuple, stream: Any) -> "tuple[Any, Any]":
    s = cm.stream_of(stream)
    n, c = int(pred.shape[0]), int(pred.shape[1])
    lab, kind = _labels(labels, pred, s)
    grad = cm.empty(pred.shape, pred.dtype, s)
    rows = cm.empty((max(n, 1),), cm.F64, s)
    cm.launch_rows(_FILE, f"{kernel}_{cm.suffix(pred.dtype)}_{kind}", n,
                   _arguments(pred, lab, grad, rows, n, c, extra), s)
    if n == 0:
        return cm.empty((0,), pred.dtype, s), grad
    return cast(rows, pred.dtype, stream=s), grad


def _arguments(pred: Any, labels: Any, grad: Any, rows: Any, n: int, c: int, extra: tuple) -> tuple:
    """The row kernels' arguments: (pred, labels, grad, row losses, N, C, label smoothing 0, grad_scale N,
    no grad_scale pointer, the kernel's extra scalars, no sample weights)."""
    return (cm.p(pred), cm.p(labels), cm.p(grad), cm.p(rows), cm.i64(n), cm.i64(c), cm.f32(0.0),
            cm.f32(float(max(n, 1))), cm.p(None)) + extra + (cm.p(None),)


def softmax_cross_entropy_rows(logits: Any, labels: Any, *, stream: Any = None) -> "tuple[Any, Any]":
    """(per-row loss (N,), dlogits = softmax * sum(t) - t), both in logits' dtype."""
    return _rows("softmax_xent", logits, labels, (), stream)


def crossentropy_from_probs_rows(probs: Any, labels: Any, *, stream: Any = None) -> "tuple[Any, Any]":
    """(per-row loss (N,), gradient w.r.t. the unnormalised rows), Keras's renormalise-and-clip rule."""
    return _rows("probs_xent", probs, labels, (cm.f32(CLIP_EPSILON),), stream)
