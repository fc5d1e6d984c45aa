"""dnnbind's fused built-in losses (the cross-entropies, MSE) and KL divergence and MAE: classes whose
default reduction takes one fused kernel (``kernels.softmax_cross_entropy`` and friends), and their
per-sample functions in ``keras.ops`` for every other reduction."""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import _validate, backend, kernels, ops
from ..autodiff.tensor import Tensor
from ..ops import _core as ops_core
from .loss import Loss, squeeze_or_expand_to_same_rank

def _float_labels(y: np.ndarray, what: str) -> np.ndarray:
    if y.dtype.kind not in "fiub":
        raise TypeError(f"{what}: labels must be numeric, got dtype {y.dtype}")
    return np.ascontiguousarray(y, dtype=np.float32)


def _check_rows(y: np.ndarray, output_shape: tuple[int, ...], what: str) -> np.ndarray:
    """Labels of the output's shape; one trailing axis of 1 more or less is accepted, as Keras's losses
    squeeze or expand it (``(N,)`` labels of a ``(N, 1)`` output, ``(N, 28, 28)`` of ``(N, 28, 28, 1)``)."""
    want = tuple(output_shape)
    if tuple(y.shape[1:]) == want:
        return y
    # Keras's squeeze_or_expand_to_same_rank: one trailing axis of 1 more or less on either side
    if want and want[-1] == 1 and tuple(y.shape[1:]) == want[:-1]:
        return y.reshape(y.shape + (1,))
    if y.ndim >= 2 and y.shape[-1] == 1 and tuple(y.shape[1:-1]) == want:
        return y.reshape(y.shape[:-1])
    raise ValueError(
        f"{what}: labels must have shape (batch, {', '.join(map(str, want))}) like the model output, "
        f"got {tuple(y.shape)}"
    )


class SparseCategoricalCrossentropy(Loss):
    """Cross-entropy with integer class labels ``(N,)`` (or ``(N, 1)``) in ``[0, classes)``; for outputs
    ``(N, ..., classes)`` (a sequence of distributions) labels ``(N, ...)``, one loss per position."""

    fuses_softmax = True
    _per_row = True

    def __init__(self, from_logits: bool = False, ignore_class: int | None = None,
                 reduction: Any = "sum_over_batch_size", axis: int = -1, name: str | None = None,
                 dtype: Any = None) -> None:
        super().__init__(name, reduction, dtype)
        if axis != -1:
            raise NotImplementedError("SparseCategoricalCrossentropy: only axis=-1 is supported")
        if ignore_class is not None:
            ignore_class = _validate.integer(ignore_class, "ignore_class", "SparseCategoricalCrossentropy")
        self.from_logits = bool(from_logits)
        self.ignore_class = ignore_class
        self.axis = axis

    def _has_fused_kernel(self) -> bool:
        return self.ignore_class is None and super()._has_fused_kernel()

    def prepare_labels(self, y, output_shape, owner=""):
        what = f"{owner}loss '{self.name}'"
        y = np.asarray(y)
        positions = tuple(int(d) for d in output_shape[:-1])
        if y.ndim == 2 + len(positions) and y.shape[-1] == 1:
            y = y.reshape(y.shape[:-1])
        if len(output_shape) < 1:
            raise ValueError(f"{what}: needs a model output of shape (batch, ..., classes), got (batch,)")
        if tuple(y.shape[1:]) != positions:
            want = ", ".join(["batch", *map(str, positions)])
            raise ValueError(
                f"{what}: labels must be integer class indices of shape ({want}{',' if not positions else ''}), "
                f"got shape {tuple(y.shape)}"
                + ("; for one-hot labels use loss='categorical_crossentropy'" if y.ndim == 2 + len(positions)
                   else "")
            )
        if y.dtype.kind == "f" or y.dtype == _validate.BFLOAT16:
            if not np.all(np.isfinite(y)) or np.any(y != np.round(y)):
                raise ValueError(f"{what}: labels must be integer class indices, got non-integer values")
        elif y.dtype.kind not in "iub":
            raise TypeError(f"{what}: labels must be integer class indices, got dtype {y.dtype}")
        classes = output_shape[-1]
        if y.size and (y.min() < 0 or y.max() >= classes):
            raise ValueError(
                f"{what}: labels must be in [0, {classes}) for a model with {classes} outputs, got values in "
                f"[{int(y.min())}, {int(y.max())}]"
            )
        return np.ascontiguousarray(y, dtype=np.int32)

    def compute(self, y_pred, y_true, *, logits=False, grad_scale=1.0, sample_weight=None):
        if logits or self.from_logits:
            return kernels.softmax_cross_entropy(y_pred, y_true, grad_scale=grad_scale, sample_weight=sample_weight)
        return kernels.crossentropy_from_probs(y_pred, y_true, grad_scale=grad_scale, sample_weight=sample_weight)

    def get_config(self):
        return {**super().get_config(), "from_logits": self.from_logits, "ignore_class": self.ignore_class}


class CategoricalCrossentropy(Loss):
    """Cross-entropy with one-hot (or soft) labels ``(N, classes)`` (``(N, ..., classes)`` for outputs with
    more axes: one loss per position); optional label smoothing."""

    fuses_softmax = True
    _per_row = True

    def __init__(self, from_logits: bool = False, label_smoothing: float = 0.0, axis: int = -1,
                 reduction: Any = "sum_over_batch_size", name: str | None = None, dtype: Any = None) -> None:
        super().__init__(name, reduction, dtype)
        if isinstance(axis, bool) or not isinstance(axis, int):
            raise ValueError(f"CategoricalCrossentropy: `axis` must be of type `int`, got axis={axis!r}")
        self.axis = axis
        # the fused kernels and the model's softmax fusion work on the last axis
        self.fuses_softmax = axis == -1
        if not 0.0 <= label_smoothing <= 1.0:
            raise ValueError(f"CategoricalCrossentropy: label_smoothing must be in [0, 1], got {label_smoothing}")
        self.from_logits = bool(from_logits)
        self.label_smoothing = float(label_smoothing)

    def prepare_labels(self, y, output_shape, owner=""):
        what = f"{owner}loss '{self.name}'"
        y = np.asarray(y)
        if y.ndim == 1 and len(output_shape) == 1 and output_shape[0] > 1:
            raise ValueError(
                f"{what}: labels must be one-hot of shape (batch, {output_shape[0]}), got integer-like shape "
                f"{tuple(y.shape)}; use loss='sparse_categorical_crossentropy' or dnnbind.utils.to_categorical"
            )
        return _check_rows(_float_labels(y, what), output_shape, what)

    def _has_fused_kernel(self) -> bool:
        return self.axis == -1 and super()._has_fused_kernel()

    def compute(self, y_pred, y_true, *, logits=False, grad_scale=1.0, sample_weight=None):
        if logits or self.from_logits:
            return kernels.softmax_cross_entropy(y_pred, y_true, label_smoothing=self.label_smoothing,
                                             grad_scale=grad_scale, sample_weight=sample_weight)
        return kernels.crossentropy_from_probs(y_pred, y_true, label_smoothing=self.label_smoothing,
                                           grad_scale=grad_scale, sample_weight=sample_weight)

    def get_config(self):
        return {**super().get_config(), "from_logits": self.from_logits, "label_smoothing": self.label_smoothing,
                "axis": self.axis}


class BinaryCrossentropy(Loss):
    """Binary cross-entropy on probabilities (or logits with ``from_logits=True``); targets are usually in
    [0, 1], but any float is taken, as Keras (``-t log p - (1 - t) log(1 - p)`` as written)."""

    def __init__(self, from_logits: bool = False, label_smoothing: float = 0.0, axis: int = -1,
                 reduction: Any = "sum_over_batch_size", name: str | None = None, dtype: Any = None) -> None:
        super().__init__(name, reduction, dtype)
        if isinstance(axis, bool) or not isinstance(axis, int):
            raise ValueError(f"BinaryCrossentropy: `axis` must be of type `int`, got axis={axis!r}")
        self.axis = axis  # the fused kernel's mean over every element is the mean over `axis` then the rest
        if not 0.0 <= label_smoothing <= 1.0:
            raise ValueError(f"BinaryCrossentropy: label_smoothing must be in [0, 1], got {label_smoothing}")
        self.from_logits = bool(from_logits)
        self.label_smoothing = float(label_smoothing)

    def prepare_labels(self, y, output_shape, owner=""):
        what = f"{owner}loss '{self.name}'"
        # no range check: Keras takes any float target (noisy GAN labels such as 1 + 0.05 * U(0, 1)), and the
        # cross-entropy formula and its gradient hold for them
        return _check_rows(_float_labels(np.asarray(y), what), output_shape, what)

    def compute(self, y_pred, y_true, *, logits=False, grad_scale=1.0, sample_weight=None):
        return kernels.binary_crossentropy(y_pred, y_true, from_logits=self.from_logits or logits,
                                       label_smoothing=self.label_smoothing, grad_scale=grad_scale,
                                       sample_weight=sample_weight)

    def get_config(self):
        return {**super().get_config(), "from_logits": self.from_logits, "label_smoothing": self.label_smoothing,
                "axis": self.axis}


class MeanSquaredError(Loss):
    """Mean of ``(y_pred - y_true)**2`` over all elements."""

    def __init__(self, reduction: Any = "sum_over_batch_size", name: str | None = "mean_squared_error",
                 dtype: Any = None) -> None:
        super().__init__(name=name, reduction=reduction, dtype=dtype)

    def prepare_labels(self, y, output_shape, owner=""):
        what = f"{owner}loss '{self.name}'"
        return _check_rows(_float_labels(np.asarray(y), what), output_shape, what)

    def compute(self, y_pred, y_true, *, logits=False, grad_scale=1.0, sample_weight=None):
        return kernels.mean_squared_error(y_pred, y_true, grad_scale=grad_scale, sample_weight=sample_weight)


class KLDivergence(Loss):
    """Kullback-Leibler divergence ``sum(y_true * log(y_true / y_pred), axis=-1)`` per sample (Keras 3's
    ``keras.losses.KLDivergence``): both arguments are probability distributions over the last axis, clipped
    to ``[epsilon, 1]`` first (``keras.backend.epsilon()``), so a zero of either gives a finite loss."""

    def __init__(self, reduction: Any = "sum_over_batch_size", name: str | None = "kl_divergence",
                 dtype: Any = None) -> None:
        super().__init__(name=name, reduction=reduction, dtype=dtype)


def _probs_clip(p: Tensor) -> Tensor:
    eps = backend.epsilon()
    return ops.clip(p, eps, 1.0 - eps)


def _sparse_ce(y_true: Any, y_pred: Any, from_logits: bool = False, ignore_class: Any = None, axis: int = -1) -> Tensor:
    """Keras's ``sparse_categorical_crossentropy``: per-sample losses (integer labels). With ``ignore_class``
    those samples give 0 and a mask (``_keras_mask``) that the reduction honours, as Keras's."""
    y_pred = ops.convert_to_tensor(y_pred)
    labels = ops.cast(ops.convert_to_tensor(y_true), "int32")
    if labels.ndim == y_pred.ndim and labels.shape[-1] == 1:
        labels = ops.squeeze(labels, -1)
    if ignore_class is not None:
        valid = ops.not_equal(labels, int(ignore_class))
        per = _sparse_ce(ops.multiply(labels, ops.cast(valid, "int32")), y_pred, from_logits)
        per = ops.where(valid, per, ops.zeros_like(per))
        per._keras_mask = valid
        return per
    if from_logits:
        logp = ops.subtract(y_pred, ops.logsumexp(y_pred, axis=-1, keepdims=True))
    else:
        probs = ops.divide(y_pred, ops.sum(y_pred, axis=-1, keepdims=True))
        logp = ops.log(_probs_clip(probs))
    picked = ops.take_along_axis(logp, ops.expand_dims(labels, -1), axis=-1)
    return ops.negative(ops.squeeze(picked, -1))


def _categorical_ce(y_true: Any, y_pred: Any, from_logits: bool = False, label_smoothing: float = 0.0,
                    axis: int = -1) -> Tensor:
    """Keras's ``categorical_crossentropy``: per-sample losses (one-hot or soft labels)."""
    y_pred = ops.convert_to_tensor(y_pred)
    y_true = ops.cast(ops.convert_to_tensor(y_true), y_pred.dtype)
    if label_smoothing:
        n = float(y_pred.shape[-1])  # Keras 3.15 smooths over the last axis's size whatever `axis` is
        y_true = ops.add(ops.multiply(y_true, 1.0 - label_smoothing), label_smoothing / n)
    if from_logits:
        logp = ops.subtract(y_pred, ops.logsumexp(y_pred, axis=axis, keepdims=True))
    else:
        probs = ops.divide(y_pred, ops.sum(y_pred, axis=axis, keepdims=True))
        logp = ops.log(_probs_clip(probs))
    return ops.negative(ops.sum(ops.multiply(y_true, logp), axis=axis))


def _binary_ce(y_true: Any, y_pred: Any, from_logits: bool = False, label_smoothing: float = 0.0,
               axis: int = -1) -> Tensor:
    """Keras's ``binary_crossentropy``: the mean over the last axis of the elementwise cross-entropy."""
    y_pred = ops.convert_to_tensor(y_pred)
    y_true = ops.cast(ops.convert_to_tensor(y_true), y_pred.dtype)
    if label_smoothing:
        y_true = ops.add(ops.multiply(y_true, 1.0 - label_smoothing), 0.5 * label_smoothing)
    if from_logits:
        # max(x, 0) - x * z + log(1 + exp(-|x|))
        per = ops.add(ops.subtract(ops.maximum(y_pred, 0.0), ops.multiply(y_pred, y_true)),
                      ops.log1p(ops.exp(ops.negative(ops.absolute(y_pred)))))
    else:
        p = _probs_clip(y_pred)
        per = ops.negative(ops.add(ops.multiply(y_true, ops.log(p)),
                                   ops.multiply(ops.subtract(1.0, y_true), ops.log(ops.subtract(1.0, p)))))
    return ops.mean(per, axis=axis)


def _mse(y_true: Any, y_pred: Any) -> Tensor:
    """Keras's ``mean_squared_error``: the mean over the last axis."""
    y_pred = ops.convert_to_tensor(y_pred)
    y_true = ops.cast(ops.convert_to_tensor(y_true), y_pred.dtype)
    y_true, y_pred = squeeze_or_expand_to_same_rank(y_true, y_pred)  # (N,) labels of (N, 1) outputs, as Keras
    return ops.mean(ops.square(ops.subtract(y_pred, y_true)), axis=-1)


def _kl_divergence(y_true: Any, y_pred: Any) -> Tensor:
    """Keras's ``kl_divergence``: ``sum(y_true * log(y_true / y_pred), axis=-1)``, both clipped to
    ``[epsilon, 1]``; per-sample values of shape ``y_pred.shape[:-1]``."""
    y_pred = ops.convert_to_tensor(y_pred)
    if not ops_core.is_float(y_pred.dtype):
        y_pred = ops.cast(y_pred, backend.floatx())
    y_true = ops.cast(ops.convert_to_tensor(y_true), y_pred.dtype)
    eps = backend.epsilon()
    y_true = ops.clip(y_true, eps, 1.0)
    y_pred = ops.clip(y_pred, eps, 1.0)
    return ops.sum(ops.multiply(y_true, ops.log(ops.divide(y_true, y_pred))), axis=-1)


def _mae(y_true: Any, y_pred: Any) -> Tensor:
    """Keras's ``mean_absolute_error``: the mean of ``|y_true - y_pred|`` over the last axis."""
    y_pred = ops.convert_to_tensor(y_pred)
    y_true = ops.cast(ops.convert_to_tensor(y_true), y_pred.dtype)
    y_true, y_pred = squeeze_or_expand_to_same_rank(y_true, y_pred)
    return ops.mean(ops.absolute(ops.subtract(y_true, y_pred)), axis=-1)


SparseCategoricalCrossentropy.call = lambda self, y_true, y_pred: _sparse_ce(y_true, y_pred, self.from_logits,
                                                                            self.ignore_class)
CategoricalCrossentropy.call = lambda self, y_true, y_pred: _categorical_ce(y_true, y_pred, self.from_logits,
                                                                            self.label_smoothing, self.axis)
BinaryCrossentropy.call = lambda self, y_true, y_pred: _binary_ce(y_true, y_pred, self.from_logits,
                                                                  self.label_smoothing, self.axis)
MeanSquaredError.call = lambda self, y_true, y_pred: _mse(y_true, y_pred)
KLDivergence.call = lambda self, y_true, y_pred: _kl_divergence(y_true, y_pred)

sparse_categorical_crossentropy = _sparse_ce
sparse_categorical_crossentropy.__name__ = "sparse_categorical_crossentropy"
categorical_crossentropy = _categorical_ce
categorical_crossentropy.__name__ = "categorical_crossentropy"
binary_crossentropy = _binary_ce
binary_crossentropy.__name__ = "binary_crossentropy"
mean_squared_error = _mse
mean_squared_error.__name__ = "mean_squared_error"
mean_absolute_error = _mae
mean_absolute_error.__name__ = "mean_absolute_error"
kl_divergence = _kl_divergence
kl_divergence.__name__ = "kl_divergence"
