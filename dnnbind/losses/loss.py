"""The Loss base (Keras 3's ``keras/src/losses/loss.py``): the reductions, Keras's rank rule, the recorded
node of a fused kernel's loss, and the two wrappers of a per-sample function (``LossFunctionWrapper``, and
:class:`FunctionLoss` for the built-in classes)."""

from __future__ import annotations

import re
from typing import Any, Callable

import numpy as np

from .. import backend, ops
from ..autodiff.engine import FilledTensor
from ..autodiff.tensor import Tensor
from ..ops import _core as ops_core

#: class name -> registered name, filled by the package (``Loss(name=None)`` takes it)
_CLASS_TO_NAME: dict = {}

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
        in_mask = getattr(y_pred, "_keras_mask", None)
        losses = self.call(y_true, y_pred)
        out_mask = getattr(losses, "_keras_mask", None) if isinstance(losses, Tensor) else None
        if in_mask is not None and out_mask is not None:
            mask = ops.logical_and(in_mask, out_mask)
        else:
            mask = in_mask if in_mask is not None else out_mask
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



def pair(y_true: Any, y_pred: Any) -> tuple:
    """``(y_true, y_pred)`` as tensors, ``y_pred`` floating (floatx for integers), ``y_true`` in its dtype."""
    y_pred = ops.convert_to_tensor(y_pred)
    if not ops_core.is_float(y_pred.dtype):
        y_pred = ops.cast(y_pred, backend.floatx())
    y_true = ops.cast(ops.convert_to_tensor(y_true), y_pred.dtype)
    return y_true, y_pred


class FunctionLoss(Loss):
    """A :class:`Loss` whose ``call`` is the class's per-sample function ``_fn(y_true, y_pred, **kwargs)``;
    the keyword arguments become attributes, and the ones named in ``_config`` go into the config."""

    _fn: Any = None
    _config: tuple = ()

    def __init__(self, reduction: Any = "sum_over_batch_size", name: "str | None" = None, dtype: Any = None,
                 **kwargs: Any) -> None:
        super().__init__(name=name, reduction=reduction, dtype=dtype)
        self._fn_kwargs = kwargs
        for key, value in kwargs.items():
            setattr(self, key, value)

    def call(self, y_true: Any, y_pred: Any) -> Tensor:
        return type(self)._fn(y_true, y_pred, **self._fn_kwargs)

    def get_config(self) -> dict:
        return {**super().get_config(), **{key: getattr(self, key) for key in self._config}}
