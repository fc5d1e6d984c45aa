"""Losses with Keras 3 names: differentiable tensors on the tape, with fused kernels for the built-ins.

``loss(y_true, y_pred, sample_weight=None)`` returns a 0-d tensor (Keras 3's ``Loss.__call__``): a
subclass's ``call(y_true, y_pred)`` gives per-sample losses written in ``keras.ops`` and the base class
reduces them (``reduction``: ``"sum_over_batch_size"`` (default), ``"sum"``, ``"mean"``,
``"mean_with_sample_weight"``, ``"none"``/None; ``sample_weight`` multiplies first), exactly as Keras's
``reduce_weighted_values``. dnnbind's built-in losses with the default reduction take one fused kernel
instead (``kernels.softmax_cross_entropy`` and friends compute the loss and its gradient in one pass):
the node they record keeps that gradient, so the backward costs nothing when the seed is one, or one
scale when it is a number. A final softmax with a ``from_logits=False`` cross-entropy is fused by the
model: the loss then sees the logits.
"""

from __future__ import annotations

import re
from typing import Any, Callable

import numpy as np

from . import _validate, backend, kernels, ops
from .autodiff.engine import FilledTensor
from .autodiff.tensor import Tensor
from .ops import _core as ops_core

__all__ = [
    "Loss",
    "LossFunctionWrapper",
    "SparseCategoricalCrossentropy",
    "CategoricalCrossentropy",
    "BinaryCrossentropy",
    "MeanSquaredError",
    "KLDivergence",
    "sparse_categorical_crossentropy",
    "categorical_crossentropy",
    "binary_crossentropy",
    "mean_squared_error",
    "mse",
    "mean_absolute_error",
    "mae",
    "kl_divergence",
    "get",
    "serialize",
    "deserialize",
    "reduce_weighted_values",
]

_REDUCTIONS = ("sum_over_batch_size", "sum", None, "none", "mean", "mean_with_sample_weight")


def _raw(x: Any) -> Any:
    return x.data if isinstance(x, Tensor) else x


def kernel_loss(value: Any, dpred: Any, y_pred: Tensor, name: str) -> Tensor:
    """A loss computed by a fused kernel (``value``, and ``dpred`` its gradient w.r.t. ``y_pred`` for a seed of
    one) as a tensor recorded with that gradient: the VJP returns ``dpred`` itself for a seed of one, scaled
    for any other seed."""
    grad = Tensor(dpred)

    def vjp(node: Any, g: Tensor) -> tuple:
        if isinstance(g, FilledTensor) and g.value == 1:
            out = grad
        else:
            out = ops.multiply(grad, ops.cast(g, grad.dtype))
        if out.dtype != y_pred.dtype:
            out = ops.cast(out, y_pred.dtype)
        return (out,)

    return ops_core.make(value, (y_pred,), vjp, name, once_differentiable=True)


def squeeze_or_expand_to_same_rank(x1: Tensor, x2: Tensor, expand_rank_1: bool = True) -> tuple:
    """Keras's rule: squeeze or expand the last axis when the ranks differ by exactly one."""
    r1, r2 = len(x1.shape), len(x2.shape)
    if r1 == r2:
        return x1, x2
    if r1 == r2 + 1 and x1.shape[-1] == 1:
        if r2 == 1 and expand_rank_1:
            x2 = ops.expand_dims(x2, -1)
        else:
            x1 = ops.squeeze(x1, -1)
    if r2 == r1 + 1 and x2.shape[-1] == 1:
        if r1 == 1 and expand_rank_1:
            x1 = ops.expand_dims(x1, -1)
        else:
            x2 = ops.squeeze(x2, -1)
    return x1, x2


def _reduce_values(values: Tensor, sample_weight: Any, reduction: Any) -> Tensor:
    if reduction is None or reduction == "none" or tuple(values.shape) in ((), (0,)):
        return values
    loss = ops.sum(values)
    if reduction in ("sum_over_batch_size", "mean", "mean_with_sample_weight"):
        if reduction == "mean_with_sample_weight" and sample_weight is not None:
            divisor = ops.cast(ops.sum(sample_weight), loss.dtype)
            loss = ops.where(ops.equal(divisor, 0), 0.0, ops.divide(loss, ops.where(ops.equal(divisor, 0), 1.0,
                                                                                   divisor)))
        else:
            n = int(np.prod(values.shape))
            loss = ops.divide(loss, float(n)) if n else loss
    return loss


def reduce_weighted_values(values: Any, sample_weight: Any = None, mask: Any = None,
                           reduction: Any = "sum_over_batch_size", dtype: Any = None) -> Tensor:
    """Keras's ``reduce_weighted_values``: per-sample ``values`` times ``sample_weight`` (and a mask's
    weights), reduced by ``reduction``."""
    values = ops.convert_to_tensor(values, dtype=dtype)
    if sample_weight is not None:
        sample_weight = ops.convert_to_tensor(sample_weight, dtype=values.dtype)
    if mask is not None:
        mask = ops.convert_to_tensor(mask)
        if reduction in ("mean", "sum_over_batch_size"):
            total = float(np.prod(mask.shape))
            valid = ops.sum(ops.cast(mask, values.dtype))
            weight = ops.where(ops.equal(valid, 0), 0.0, ops.divide(total, ops.where(ops.equal(valid, 0), 1.0, valid)))
            float_mask = ops.where(ops.cast(mask, "bool"), weight, 0.0)
        else:
            float_mask = ops.cast(mask, values.dtype)
        if sample_weight is not None:
            float_mask, sample_weight = squeeze_or_expand_to_same_rank(float_mask, sample_weight)
            sample_weight = ops.multiply(sample_weight, float_mask)
        else:
            sample_weight = float_mask
    if sample_weight is not None:
        sample_weight = ops.cast(sample_weight, values.dtype)
        values, sample_weight = squeeze_or_expand_to_same_rank(values, sample_weight)
        values = ops.multiply(values, sample_weight)
    return _reduce_values(values, sample_weight, reduction)


class Loss:
    """Base class (Keras 3's ``keras.losses.Loss``): ``Loss(name=None, reduction="sum_over_batch_size",
    dtype=None)``; subclasses implement ``call(y_true, y_pred)`` (per-sample losses in ``keras.ops``)."""

    #: whether a model may fuse a final softmax into this loss (cross-entropies over classes)
    fuses_softmax = False
    #: whether the fused kernel is per row of the last axis, so (N, ..., C) outputs flatten to rows
    _per_row = False

    def __init__(self, name: str | None = None, reduction: Any = "sum_over_batch_size", dtype: Any = None) -> None:
        if reduction == "auto":
            reduction = "sum_over_batch_size"
        if reduction not in _REDUCTIONS:
            raise ValueError(f"{type(self).__name__}: invalid value for argument `reduction`: expected one of "
                             f"{set(_REDUCTIONS)}, got reduction={reduction!r}")
        self.name = name or _CLASS_TO_NAME.get(type(self).__name__, _snake(type(self).__name__))
        self.reduction = reduction
        self._dtype = ops_core.standardize_dtype(dtype) if dtype is not None else backend.floatx()

    @property
    def dtype(self) -> str:
        return self._dtype

    # ----- labels -----------------------------------------------------------------------------
    def prepare_labels(self, y: np.ndarray, output_shape: tuple[int, ...], owner: str = "") -> np.ndarray:
        """Check host labels against the model output ``(batch, *output_shape)`` and convert their dtype.
        A user's loss takes its labels as given (float or int arrays)."""
        return np.asarray(y)

    def compute(self, y_pred: Any, y_true: Any, *, logits: bool = False, grad_scale: Any = 1.0,
                sample_weight: Any = None):
        """``(loss, dloss/dy_pred)`` on raw arrays, by a fused kernel (dnnbind's built-in losses)."""
        raise NotImplementedError

    def _has_fused_kernel(self) -> bool:
        """Whether :meth:`_fused` applies: one of dnnbind's built-in losses with the default reduction."""
        return type(self).compute is not Loss.compute and self.reduction == "sum_over_batch_size"

    def _fused(self, y_true: Any, y_pred: Any, sample_weight: Any, logits: bool = False,
               data32: Any = None) -> "Tensor | None":
        """The fused-kernel loss as a recorded tensor, or None where the kernel does not apply (a user's loss,
        a reduction other than the default). ``data32``: ``y_pred``'s values already cast to float32 (a
        trainer's low-precision output): the loss is computed on them and its gradient reaches ``y_pred`` cast
        back to its dtype, the cast and the loss one recorded node."""
        if not self._has_fused_kernel():
            return None
        if not isinstance(y_pred, Tensor):
            y_pred = ops.convert_to_tensor(y_pred)
        if data32 is None and not ops_core.is_float(y_pred.dtype):
            y_pred = ops.cast(y_pred, self._dtype)
        sw = _raw(sample_weight) if sample_weight is not None else None
        if sw is not None and not hasattr(sw, "shape"):
            sw = np.asarray(sw, np.float32)
        y_raw = _raw(ops.convert_to_tensor(y_true) if not hasattr(y_true, "shape") else y_true)
        if backend.is_device_array(y_pred.data) and isinstance(y_raw, np.ndarray):
            y_raw = backend.asarray(self.prepare_labels(y_raw, tuple(y_pred.shape[1:])), device=y_pred.device)
            if sw is not None and isinstance(sw, np.ndarray):
                sw = backend.asarray(sw.astype(np.float32), device=y_pred.device)
        elif isinstance(y_raw, np.ndarray):
            y_raw = self.prepare_labels(y_raw, tuple(y_pred.shape[1:]))
        if y_pred.ndim > 2 and self._per_row:
            # a sequence (or image) of class distributions, (N, ..., C): the row kernels see (N * ..., C), one
            # row per position, and sample weights repeat over the positions. The kernels divide by the row
            # count, which is Keras's sum_over_batch_size of the (N, ...) per-position losses.
            c = int(y_pred.shape[-1])
            rows = int(np.prod(y_pred.shape[:-1]))
            per = rows // max(int(y_pred.shape[0]), 1)
            y_pred = ops.reshape(y_pred, (rows, c))
            if data32 is not None:
                data32 = data32.reshape(rows, c)
            y_raw = y_raw.reshape((rows,) if int(np.prod(y_raw.shape)) == rows else (rows, c))  # sparse or dense
            if sw is not None:
                sw = ops.repeat(ops.reshape(ops.convert_to_tensor(sw), (-1,)), per).data if per > 1 else sw
        value, dpred = self.compute(y_pred.data if data32 is None else data32, y_raw, logits=logits, sample_weight=sw)
        return kernel_loss(value, dpred, y_pred, self.name)

    def __call__(self, y_true: Any, y_pred: Any, sample_weight: Any = None) -> Tensor:
        """The reduced loss, a 0-d tensor (differentiable)."""
        fused = self._fused(y_true, y_pred, sample_weight, logits=bool(getattr(self, "from_logits", False)))
        if fused is not None:
            return fused
        y_pred = ops.convert_to_tensor(y_pred, dtype=self._dtype)
        y_true = ops.convert_to_tensor(y_true, dtype=self._dtype)
        losses = self.call(y_true, y_pred)
        mask = getattr(y_pred, "_keras_mask", None)
        return reduce_weighted_values(losses, sample_weight=sample_weight, mask=mask, reduction=self.reduction,
                                      dtype=self._dtype)

    def call(self, y_true: Any, y_pred: Any) -> Tensor:
        raise NotImplementedError(f"{type(self).__name__}: a Loss subclass defines call(y_true, y_pred)")

    def get_config(self) -> dict:
        return {"name": self.name, "reduction": self.reduction}

    @classmethod
    def from_config(cls, config: dict) -> "Loss":
        return cls(**config)


def _snake(name: str) -> str:
    name = re.sub(r"(.)([A-Z][a-z]+)", r"\1_\2", name)
    return re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", name).lower()


class LossFunctionWrapper(Loss):
    """A loss from a function ``fn(y_true, y_pred, **kwargs)`` returning per-sample losses (Keras's)."""

    def __init__(self, fn: Callable, reduction: Any = "sum_over_batch_size", name: str | None = None,
                 dtype: Any = None, **kwargs: Any) -> None:
        super().__init__(name=name or getattr(fn, "__name__", "loss"), reduction=reduction, dtype=dtype)
        self.fn = fn
        self._fn_kwargs = kwargs

    def call(self, y_true: Any, y_pred: Any) -> Tensor:
        return self.fn(y_true, y_pred, **self._fn_kwargs)

    def get_config(self) -> dict:
        return {**super().get_config(), "fn": getattr(self.fn, "__name__", str(self.fn)), **self._fn_kwargs}


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

    def __init__(self, from_logits: bool = False, ignore_class: int | None = None, name: str | None = None,
                 reduction: str = "sum_over_batch_size") -> None:
        super().__init__(name, reduction)
        if ignore_class is not None:
            raise NotImplementedError("SparseCategoricalCrossentropy: ignore_class is not supported")
        self.from_logits = bool(from_logits)

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
        return {**super().get_config(), "from_logits": self.from_logits}


class CategoricalCrossentropy(Loss):
    """Cross-entropy with one-hot (or soft) labels ``(N, classes)`` (``(N, ..., classes)`` for outputs with
    more axes: one loss per position); optional label smoothing."""

    fuses_softmax = True
    _per_row = True

    def __init__(self, from_logits: bool = False, label_smoothing: float = 0.0, axis: int = -1,
                 name: str | None = None, reduction: str = "sum_over_batch_size") -> None:
        super().__init__(name, reduction)
        if axis != -1:
            raise NotImplementedError("CategoricalCrossentropy: only axis=-1 is supported")
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

    def compute(self, y_pred, y_true, *, logits=False, grad_scale=1.0, sample_weight=None):
        if logits or self.from_logits:
            return kernels.softmax_cross_entropy(y_pred, y_true, label_smoothing=self.label_smoothing,
                                             grad_scale=grad_scale, sample_weight=sample_weight)
        return kernels.crossentropy_from_probs(y_pred, y_true, label_smoothing=self.label_smoothing,
                                           grad_scale=grad_scale, sample_weight=sample_weight)

    def get_config(self):
        return {**super().get_config(), "from_logits": self.from_logits, "label_smoothing": self.label_smoothing}


class BinaryCrossentropy(Loss):
    """Binary cross-entropy on probabilities (or logits with ``from_logits=True``); targets are usually in
    [0, 1], but any float is taken, as Keras (``-t log p - (1 - t) log(1 - p)`` as written)."""

    def __init__(self, from_logits: bool = False, label_smoothing: float = 0.0, name: str | None = None,
                 reduction: str = "sum_over_batch_size") -> None:
        super().__init__(name, reduction)
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
        return {**super().get_config(), "from_logits": self.from_logits, "label_smoothing": self.label_smoothing}


class MeanSquaredError(Loss):
    """Mean of ``(y_pred - y_true)**2`` over all elements."""

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
    """Keras's ``sparse_categorical_crossentropy``: per-sample losses (integer labels)."""
    y_pred = ops.convert_to_tensor(y_pred)
    labels = ops.cast(ops.convert_to_tensor(y_true), "int32")
    if labels.ndim == y_pred.ndim and labels.shape[-1] == 1:
        labels = ops.squeeze(labels, -1)
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
        n = float(y_pred.shape[-1])
        y_true = ops.add(ops.multiply(y_true, 1.0 - label_smoothing), label_smoothing / n)
    if from_logits:
        logp = ops.subtract(y_pred, ops.logsumexp(y_pred, axis=-1, keepdims=True))
    else:
        probs = ops.divide(y_pred, ops.sum(y_pred, axis=-1, keepdims=True))
        logp = ops.log(_probs_clip(probs))
    return ops.negative(ops.sum(ops.multiply(y_true, logp), axis=-1))


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


SparseCategoricalCrossentropy.call = lambda self, y_true, y_pred: _sparse_ce(y_true, y_pred, self.from_logits)
CategoricalCrossentropy.call = lambda self, y_true, y_pred: _categorical_ce(y_true, y_pred, self.from_logits,
                                                                            self.label_smoothing)
BinaryCrossentropy.call = lambda self, y_true, y_pred: _binary_ce(y_true, y_pred, self.from_logits,
                                                                  self.label_smoothing)
MeanSquaredError.call = lambda self, y_true, y_pred: _mse(y_true, y_pred)
KLDivergence.call = lambda self, y_true, y_pred: _kl_divergence(y_true, y_pred)

_BY_NAME: dict[str, type] = {
    "sparse_categorical_crossentropy": SparseCategoricalCrossentropy,
    "categorical_crossentropy": CategoricalCrossentropy,
    "binary_crossentropy": BinaryCrossentropy,
    "mean_squared_error": MeanSquaredError,
    "kl_divergence": KLDivergence,
}
_ALIASES = {"mse": "mean_squared_error", "scce": "sparse_categorical_crossentropy",
            "cce": "categorical_crossentropy", "bce": "binary_crossentropy",
            "kld": "kl_divergence", "kullback_leibler_divergence": "kl_divergence"}
_CLASS_TO_NAME = {cls.__name__: name for name, cls in _BY_NAME.items()}

sparse_categorical_crossentropy = _sparse_ce
sparse_categorical_crossentropy.__name__ = "sparse_categorical_crossentropy"
categorical_crossentropy = _categorical_ce
categorical_crossentropy.__name__ = "categorical_crossentropy"
binary_crossentropy = _binary_ce
binary_crossentropy.__name__ = "binary_crossentropy"
mean_squared_error = _mse
mean_squared_error.__name__ = "mean_squared_error"
mse = mean_squared_error
mean_absolute_error = _mae
mean_absolute_error.__name__ = "mean_absolute_error"
mae = mean_absolute_error
kl_divergence = _kl_divergence
kl_divergence.__name__ = "kl_divergence"
_FUNCTIONS = {"sparse_categorical_crossentropy": sparse_categorical_crossentropy,
              "categorical_crossentropy": categorical_crossentropy, "binary_crossentropy": binary_crossentropy,
              "mean_squared_error": mean_squared_error, "kl_divergence": kl_divergence}


def known_names() -> list[str]:
    return sorted([*_BY_NAME, *_ALIASES])


def get(identifier: Any) -> Loss:
    """A :class:`Loss` from a name (``"sparse_categorical_crossentropy"``, ``"mse"``), a class name,
    a config dict, an instance, or one of this module's functions."""
    if isinstance(identifier, Loss):
        return identifier
    if isinstance(identifier, type) and issubclass(identifier, Loss):
        return identifier()
    if callable(identifier) and any(identifier is f for f in _FUNCTIONS.values()):
        return _BY_NAME[identifier.__name__]()
    if callable(identifier) and not isinstance(identifier, (str, dict)):
        return LossFunctionWrapper(identifier)
    if isinstance(identifier, dict):
        cls_name = identifier.get("class_name")
        name = _CLASS_TO_NAME.get(cls_name)
        if name is None:
            raise ValueError(f"unknown loss class {cls_name!r}; known: {', '.join(sorted(_CLASS_TO_NAME))}")
        return _BY_NAME[name].from_config(identifier.get("config", {}))
    if isinstance(identifier, str):
        key = identifier.strip()
        name = _CLASS_TO_NAME.get(key) or _ALIASES.get(key.lower(), key.lower())
        if name in _BY_NAME:
            return _BY_NAME[name]()
        raise ValueError(f"unknown loss {identifier!r}; known losses: {', '.join(known_names())}")
    raise TypeError(f"cannot interpret {identifier!r} as a loss; use a name such as "
                    "'sparse_categorical_crossentropy' or a dnnbind.losses.Loss")


def serialize(loss: Loss) -> dict:
    return {"class_name": type(loss).__name__, "config": loss.get_config()}


def deserialize(config: dict) -> Loss:
    return get(config)
