"""Intersection-over-union metrics with Keras 3 names (``iou_metrics.py``): a ``(num_classes, num_classes)``
confusion matrix (rows: labels, columns: predictions) in a device variable, accumulated by one small matmul of
one-hot rows per update; no host read."""

from __future__ import annotations

import warnings
from typing import Any

from .. import _validate, backend, ops
from .metric import Metric

__all__ = ["IoU", "BinaryIoU", "MeanIoU", "OneHotIoU", "OneHotMeanIoU"]


class _IoUBase(Metric):
    def __init__(self, num_classes: int, name: "str | None" = None, dtype: Any = None, ignore_class: Any = None,
                 sparse_y_true: bool = True, sparse_y_pred: bool = True, axis: int = -1) -> None:
        super().__init__(name=name, dtype=dtype or "int32")
        owner = f"{type(self).__name__} '{self.name}'"
        self.num_classes = _validate.integer(num_classes, "num_classes", owner, minimum=1)
        self.ignore_class = None if ignore_class is None else _validate.integer(ignore_class, "ignore_class", owner)
        self.sparse_y_true = bool(sparse_y_true)
        self.sparse_y_pred = bool(sparse_y_pred)
        self.axis = axis
        # float32 on the device whatever ``dtype`` says: an integer dtype truncates the weights, as Keras's
        self.total_cm = self.add_variable((self.num_classes, self.num_classes), "zeros", dtype="float32",
                                          name="total_confusion_matrix")

    def _integer_weights(self) -> bool:
        return "int" in str(self.dtype)

    def update_state(self, y_true: Any, y_pred: Any, sample_weight: Any = None) -> None:
        y_true, y_pred = ops.convert_to_tensor(y_true), ops.convert_to_tensor(y_pred)
        if not self.sparse_y_true:
            y_true = ops.argmax(y_true, axis=self.axis)
        if not self.sparse_y_pred:
            y_pred = ops.argmax(y_pred, axis=self.axis)
        y_true = ops.reshape(ops.cast(y_true, "int32"), (-1,))
        y_pred = ops.reshape(ops.cast(y_pred, "int32"), (-1,))
        if sample_weight is None:
            w = ops.ones(tuple(y_true.shape), "float32")
        else:
            w = ops.convert_to_tensor(sample_weight)
            if self._integer_weights():
                if "float" in str(w.dtype):
                    warnings.warn("You are passing weight as `float`, but dtype is `int`. This may result in an "
                                  "incorrect weight due to type casting Consider using integer weights.", stacklevel=2)
                w = ops.cast(w, "int32")
            w = ops.cast(w, "float32")
            if w.ndim > 1:
                w = ops.reshape(w, (-1,))
            w = ops.broadcast_to(w, tuple(y_true.shape))
        n = self.num_classes
        valid = ops.logical_and(ops.logical_and(ops.greater_equal(y_true, 0), ops.less(y_true, n)),
                                ops.logical_and(ops.greater_equal(y_pred, 0), ops.less(y_pred, n)))
        if self.ignore_class is not None:
            valid = ops.logical_and(valid, ops.not_equal(y_true, self.ignore_class))
        w = ops.where(valid, w, 0.0)
        rows = ops.multiply(ops.one_hot(ops.where(valid, y_true, 0), n, dtype="float32"), ops.expand_dims(w, 1))
        cols = ops.one_hot(ops.where(valid, y_pred, 0), n, dtype="float32")
        self.total_cm.assign_add(ops.matmul(ops.transpose(rows), cols))

    def reset_state(self) -> None:
        self.total_cm.assign(ops.zeros((self.num_classes, self.num_classes), "float32"))


class IoU(_IoUBase):
    """The mean IoU over ``target_class_ids`` (``keras.metrics.IoU``): ``tp / (tp + fp + fn)`` per class from the
    accumulated confusion matrix, classes never seen left out of the mean."""

    def __init__(self, num_classes: int, target_class_ids: Any, name: "str | None" = None, dtype: Any = None,
                 ignore_class: Any = None, sparse_y_true: bool = True, sparse_y_pred: bool = True,
                 axis: int = -1) -> None:
        super().__init__(num_classes=num_classes, name=name, dtype=dtype, ignore_class=ignore_class,
                         sparse_y_true=sparse_y_true, sparse_y_pred=sparse_y_pred, axis=axis)
        ids = list(target_class_ids)
        if not ids or max(ids) >= num_classes or min(ids) < 0:
            raise ValueError(f"{type(self).__name__} '{self.name}': Target class id {max(ids) if ids else None} is "
                             f"out of range, which is [0, {num_classes}).")
        self.target_class_ids = ids

    def result(self) -> Any:
        cm = ops.convert_to_tensor(self.total_cm)
        sum_over_row, sum_over_col = ops.sum(cm, axis=0), ops.sum(cm, axis=1)
        tp = ops.diagonal(cm)
        denominator = ops.subtract(ops.add(sum_over_row, sum_over_col), tp)
        ids = ops.convert_to_tensor(self.target_class_ids, dtype="int32")
        tp, denominator = ops.take(tp, ids), ops.take(denominator, ids)
        valid = ops.greater(denominator, 1e-9)
        iou = ops.where(valid, ops.divide(tp, ops.add(denominator, backend.epsilon())), 0.0)
        return ops.divide(ops.sum(iou), ops.add(ops.sum(ops.cast(valid, "float32")), backend.epsilon()))

    def get_config(self) -> dict:
        return {"name": self.name, "dtype": self.dtype, "num_classes": self.num_classes,
                "target_class_ids": self.target_class_ids, "ignore_class": self.ignore_class,
                "sparse_y_true": self.sparse_y_true, "sparse_y_pred": self.sparse_y_pred, "axis": self.axis}


class BinaryIoU(IoU):
    """IoU of binary labels and scores thresholded at ``threshold`` (``y_pred >= threshold`` is class 1)
    (``keras.metrics.BinaryIoU``)."""

    def __init__(self, target_class_ids: Any = (0, 1), threshold: float = 0.5, name: "str | None" = None,
                 dtype: Any = None) -> None:
        super().__init__(num_classes=2, target_class_ids=target_class_ids, name=name, dtype=dtype)
        self.threshold = _validate.number(threshold, "threshold", f"BinaryIoU '{self.name}'")

    def update_state(self, y_true: Any, y_pred: Any, sample_weight: Any = None) -> None:
        y_pred = ops.cast(ops.greater_equal(ops.cast(ops.convert_to_tensor(y_pred), "float32"), self.threshold),
                          "int32")
        super().update_state(y_true, y_pred, sample_weight)

    def get_config(self) -> dict:
        return {"target_class_ids": self.target_class_ids, "threshold": self.threshold, "name": self.name,
                "dtype": self.dtype}


class MeanIoU(IoU):
    """The mean IoU over all ``num_classes`` classes (``keras.metrics.MeanIoU``)."""

    def __init__(self, num_classes: int, name: "str | None" = None, dtype: Any = None, ignore_class: Any = None,
                 sparse_y_true: bool = True, sparse_y_pred: bool = True, axis: int = -1) -> None:
        super().__init__(num_classes=num_classes, target_class_ids=list(range(num_classes)), name=name, dtype=dtype,
                         ignore_class=ignore_class, sparse_y_true=sparse_y_true, sparse_y_pred=sparse_y_pred,
                         axis=axis)

    def get_config(self) -> dict:
        return {"num_classes": self.num_classes, "name": self.name, "dtype": self.dtype,
                "ignore_class": self.ignore_class, "sparse_y_true": self.sparse_y_true,
                "sparse_y_pred": self.sparse_y_pred, "axis": self.axis}


class OneHotIoU(IoU):
    """:class:`IoU` of one-hot labels (and, unless ``sparse_y_pred``, scores) (``keras.metrics.OneHotIoU``)."""

    def __init__(self, num_classes: int, target_class_ids: Any, name: "str | None" = None, dtype: Any = None,
                 ignore_class: Any = None, sparse_y_pred: bool = False, axis: int = -1) -> None:
        super().__init__(num_classes=num_classes, target_class_ids=target_class_ids, name=name, dtype=dtype,
                         ignore_class=ignore_class, sparse_y_true=False, sparse_y_pred=sparse_y_pred, axis=axis)

    def get_config(self) -> dict:
        return {"num_classes": self.num_classes, "target_class_ids": self.target_class_ids, "name": self.name,
                "dtype": self.dtype, "ignore_class": self.ignore_class, "sparse_y_pred": self.sparse_y_pred,
                "axis": self.axis}


class OneHotMeanIoU(MeanIoU):
    """:class:`MeanIoU` of one-hot labels (and, unless ``sparse_y_pred``, scores) (``keras.metrics.OneHotMeanIoU``)."""

    def __init__(self, num_classes: int, name: "str | None" = None, dtype: Any = None, ignore_class: Any = None,
                 sparse_y_pred: bool = False, axis: int = -1) -> None:
        super().__init__(num_classes=num_classes, name=name, dtype=dtype, ignore_class=ignore_class,
                         sparse_y_true=False, sparse_y_pred=sparse_y_pred, axis=axis)

    def get_config(self) -> dict:
        return {"num_classes": self.num_classes, "name": self.name, "dtype": self.dtype,
                "ignore_class": self.ignore_class, "sparse_y_pred": self.sparse_y_pred, "axis": self.axis}
