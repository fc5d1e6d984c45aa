"""The Metric base and dnnbind's device-accumulated metrics (Keras 3's ``keras/src/metrics/metric.py``,
``reduction_metrics.py`` and the accuracies and confusion counts that have kernels).

A metric keeps a running total in a 0-d float32 array on the predictions' device (updated in
place by ``kernels.axpy``) and a host-side sample count (known without asking the device). Nothing
is read back until :meth:`Metric.result` is called (the progress bar, the end of an epoch). Where a
user's ``train_step`` reads ``result()`` inside the step (a CUDA graph replays it with no Python),
the trainer has the metric keep its count on the device as well (:meth:`Metric._count_on_device`).
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from .. import _validate, backend, kernels
from ..losses import core as _losses
from ..losses import loss as _loss_base
from .. import ops as _ops
from ..autodiff.tensor import Tensor
from ..autodiff.variable import Variable
from . import accuracy as _acc

__all__ = [
    "Metric",
    "Mean",
    "Accuracy",
    "accuracy",
    "SparseCategoricalAccuracy",
    "CategoricalAccuracy",
    "BinaryAccuracy",
    "TopKCategoricalAccuracy",
    "SparseTopKCategoricalAccuracy",
    "TruePositives",
    "FalsePositives",
    "TrueNegatives",
    "FalseNegatives",
    "Precision",
    "Recall",
    "MeanSquaredError",
    "MeanAbsoluteError",
    "MeanMetricWrapper",
    "KLDivergence",
    "kl_divergence",
    "AUC",
    "Sum",
]

_F32 = np.dtype(np.float32)


def _raw(value: Any) -> Any:
    """A tensor's array (dnnbind's metrics accumulate raw arrays with kernels); anything else as it is."""
    return value.data if isinstance(value, Tensor) else value


def _takes_tensors(update: Any) -> Any:
    """``update_state`` of one of dnnbind's metrics, taking tensors too (unwrapped to their arrays)."""
    def wrapper(self, *args: Any, **kwargs: Any) -> Any:
        return update(self, *[_raw(a) for a in args], **{k: _raw(v) for k, v in kwargs.items()})
    wrapper.__doc__ = update.__doc__
    wrapper.__name__ = update.__name__
    wrapper.__module__ = update.__module__
    return wrapper


class Metric:
    """Base class (Keras 3's ``keras.metrics.Metric``): ``update_state(...)``, ``result()``, ``reset_state()``.

    dnnbind's own metrics keep a device total and a host count (``result()`` is a 0-d float32 tensor: total /
    count, computed on the device). A user's metric creates its state with :meth:`add_variable` (or
    ``add_weight``), updates it in ``keras.ops`` (``self.total.assign_add(...)``) and returns a tensor from
    ``result``; ``reset_state`` sets every variable back to its initial value."""

    def __init__(self, name: str | None = None, dtype: Any = None) -> None:
        self.name = name or _CLASS_TO_NAME.get(type(self).__name__, _snake(type(self).__name__))
        self._total = None
        self._host_count = 0.0
        self._count_dev = None  # the count on the device too (0-d float32), once _count_on_device is asked
        self._count_wanted = False
        self._one = None
        self._device = None
        self._weight_count = None  # the weights a weighted update counted, on the device (0-d float32)
        self._dtype = dtype
        self._variables: list = []
        self._initial: list = []

    # ----- Keras's variable API for user metrics ---------------------------------------------------
    def add_variable(self, shape: Any = (), initializer: Any = "zeros", dtype: Any = None, aggregation: str = "sum",
                     name: "str | None" = None) -> Any:
        """A state variable of the metric (Keras 3's ``Metric.add_variable``), on the default device."""
        v = Variable(initializer, shape=tuple(shape) if shape is not None else (), dtype=dtype or "float32",
                     trainable=False, aggregation=aggregation,
                     name=name or f"{self.name}_variable_{len(self._variables)}")
        self._variables.append(v)
        self._initial.append(np.asarray(v.numpy()))
        return v

    add_weight = add_variable

    @property
    def variables(self) -> list:
        return list(self._variables)

    @property
    def dtype(self) -> str:
        return self._dtype or "float32"

    @property
    def _count(self) -> float:
        """The samples (weights) seen: a host number; a change is mirrored on the device in device-count mode."""
        return self._host_count

    @_count.setter
    def _count(self, value: float) -> None:
        delta = float(value) - self._host_count
        self._host_count = float(value)
        if delta and self._count_dev is not None:
            kernels.axpy(delta, self._one, self._count_dev)

    def _count_on_device(self) -> None:
        """Keep the count on the device as well (made with the total, outside any capture: the trainer asks
        before the warm-up step), so :meth:`result` inside a captured step reads the replay's count."""
        self._count_wanted = True
        if self._total is not None and self._count_dev is None:
            self._make_device_count(backend.device_of(self._total))

    def _make_device_count(self, dev: Any) -> None:
        self._count_dev = backend.asarray(np.full((), self._host_count, _F32), device=dev)
        self._one = backend.asarray(np.ones((), _F32), device=dev)

    def _accumulator(self, like: Any) -> Any:
        dev = backend.device_of(like)
        if self._total is None or self._device != dev:
            self._total = backend.asarray(np.zeros((), _F32), device=dev)
            self._device = dev
            self._count_dev = None
            self._weight_count = None
            if self._count_wanted and backend.is_device_array(self._total):
                self._make_device_count(dev)
        return self._total

    def _add(self, value: Any, like: Any, weight: float = 1.0) -> None:
        """total += weight * value, on the device."""
        value, like = _raw(value), _raw(like)
        acc = self._accumulator(like)
        if value.dtype != _F32:
            value = kernels.cast(value, _F32)
        if tuple(value.shape) != ():
            value = value.reshape()
        kernels.axpy(float(weight), value, acc)

    def _add_weighted(self, values_sum: Any, weights_sum: Any) -> None:
        """total += ``values_sum`` and the weighted count += ``weights_sum`` (0-d arrays), both on the device:
        the count of a weighted update is never read back to the host."""
        values_sum, weights_sum = _raw(values_sum), _raw(weights_sum)
        self._add(values_sum, values_sum)
        if self._weight_count is None:
            self._weight_count = backend.asarray(np.zeros((), _F32), device=backend.device_of(self._total))
        if weights_sum.dtype != _F32:
            weights_sum = kernels.cast(weights_sum, _F32)
        kernels.axpy(1.0, weights_sum.reshape(()) if tuple(weights_sum.shape) != () else weights_sum,
                     self._weight_count)

    def _weighted_update(self, values: Any, sample_weight: Any) -> None:
        """Keras 3's ``Mean.update_state`` of per-sample ``values`` (``reduce_to_samplewise_values``): the values
        reduced to one mean per sample (over the axes past the weights' rank, then past the batch axis); with
        weights, the total gains ``sum(per-sample mean of values * weights)`` and the (device) count the
        per-sample means of the weights, else the count gains the number of samples."""
        mask = getattr(values, "_keras_mask", None)  # e.g. an ignore_class cross-entropy's
        values = _ops.cast(_ops.convert_to_tensor(values), "float32")
        if sample_weight is None:  # Keras applies the values' mask to weights only
            if values.ndim > 1:
                values = _ops.mean(values, axis=tuple(range(1, values.ndim)))
            self._add(_ops.sum(values), values)
            self._count += float(values.shape[0]) if values.ndim >= 1 else 1.0
            return
        w = _ops.cast(_ops.convert_to_tensor(sample_weight), "float32")
        if mask is not None:
            m = _ops.cast(mask, "float32")
            m, w = _loss_base.squeeze_or_expand_to_same_rank(m, w)
            w = _ops.multiply(w, m)
        values, w = _loss_base.squeeze_or_expand_to_same_rank(values, w)
        if values.ndim > w.ndim:
            values = _ops.mean(values, axis=tuple(range(w.ndim, values.ndim)))
        w = _ops.broadcast_to(w, tuple(values.shape))
        values = values * w
        if w.ndim > 1:
            w = _ops.mean(w, axis=tuple(range(1, w.ndim)))
        if values.ndim > 1:
            values = _ops.mean(values, axis=tuple(range(1, values.ndim)))
        self._add_weighted(_ops.sum(values), _ops.sum(w))

    def reset_state(self) -> None:
        if self._total is not None:
            kernels.fill(self._total, 0.0)
        if self._weight_count is not None:
            kernels.fill(self._weight_count, 0.0)
        if self._count_dev is not None:
            kernels.fill(self._count_dev, 0.0)
        self._host_count = 0.0
        for v, init in zip(self._variables, self._initial):
            v.assign(init)

    def result(self) -> Any:
        """The metric so far: a 0-d float32 tensor, computed on the device (no host read until one is asked
        for: ``float(m.result())``)."""
        if self._weight_count is not None:  # weighted updates: total / (weights + unweighted samples)
            from .. import ops

            count = Tensor(self._weight_count)
            if self._count_dev is not None:
                count = ops.add(count, Tensor(self._count_dev))
            elif self._count:
                count = ops.add(count, float(self._count))
            return ops.divide_no_nan(Tensor(self._total), count)
        if self._count_dev is not None:  # total / count on the device (0 while the count is 0)
            from .. import ops

            return ops.divide_no_nan(Tensor(self._total), Tensor(self._count_dev))
        if self._count == 0 or self._total is None:
            return Tensor(np.zeros((), _F32)) if self._total is None else Tensor(kernels.scale(self._total, 0.0))
        return Tensor(kernels.scale(self._total, 1.0 / self._count))

    def update_state(self, y_true: Any, y_pred: Any) -> None:
        raise NotImplementedError

    def get_config(self) -> dict:
        return {"name": self.name}

    def __repr__(self) -> str:
        return f"<{type(self).__name__} name={self.name}>"


def _float_labels(y_true: Any) -> bool:
    """Integer class labels given as floats (Keras takes them): the kernels read float labels as one-hot, so
    these take the function path."""
    return getattr(y_true, "dtype", None) is not None and np.dtype(y_true.dtype).kind == "f"


class Mean(Metric):
    """Weighted running mean of values (the model uses it for the loss: value = batch mean loss)."""

    def update_state(self, value: Any, sample_weight: Any = None) -> None:  # type: ignore[override]
        """A 0-d value (the trainer's batch loss) counted ``sample_weight`` times (a host number, default 1),
        or per-sample values, unweighted or with per-sample weights (Keras's ``Mean``; weights are counted
        on the device)."""
        scalar_weight = sample_weight is None or isinstance(sample_weight, (int, float, np.integer, np.floating))
        if scalar_weight and tuple(np.shape(_raw(value))) == ():
            weight = 1.0 if sample_weight is None else float(sample_weight)
            self._add(value, value, weight)
            self._count += weight
        else:
            self._weighted_update(value, sample_weight)


class SparseCategoricalAccuracy(Metric):
    """Fraction of samples whose arg-max score is the integer label."""

    label_kind = "sparse"

    def update_state(self, y_true, y_pred, sample_weight=None):
        if sample_weight is not None or _float_labels(y_true):
            return self._weighted_update(_acc.sparse_categorical_accuracy(y_true, y_pred), sample_weight)
        self._add(kernels.accuracy_count(y_pred, y_true), y_pred)
        self._count += int(y_pred.shape[0])


class CategoricalAccuracy(Metric):
    """Fraction of samples whose arg-max score is the arg-max of the one-hot label."""

    label_kind = "categorical"

    def update_state(self, y_true, y_pred, sample_weight=None):
        if sample_weight is not None:
            return self._weighted_update(_acc.categorical_accuracy(y_true, y_pred), sample_weight)
        self._add(kernels.accuracy_count(y_pred, y_true), y_pred)
        self._count += int(y_pred.shape[0])


class BinaryAccuracy(Metric):
    """Fraction of elements where ``(y_pred > threshold) == (y_true > 0.5)``."""

    label_kind = "binary"

    def __init__(self, name: str | None = None, dtype: Any = None, threshold: float = 0.5) -> None:
        super().__init__(name, dtype)
        self.threshold = float(threshold)

    def _two_column(self, v: Any, threshold: float) -> Any:
        """``(M, 2)`` rows ``[threshold, v]`` from ``v`` ``(M, 1)``, by one tiny GEMM on ``v``'s device:
        their arg-max is 1 exactly when ``v > threshold`` (ties go to column 0, as ``>`` wants)."""
        key = (str(backend.device_of(v)), str(v.dtype), threshold)
        consts = self._consts.get(key) if hasattr(self, "_consts") else None
        if consts is None:
            self._consts = getattr(self, "_consts", {})
            dev = backend.device_of(v)
            w = backend.asarray(np.array([[0.0, 1.0]], dtype=v.dtype), device=dev)
            b = backend.asarray(np.array([threshold, 0.0], dtype=v.dtype), device=dev)
            consts = self._consts[key] = (w, b)
        return kernels.dense_forward(v, consts[0], consts[1])

    def update_state(self, y_true, y_pred, sample_weight=None):
        if sample_weight is not None:
            return self._weighted_update(_acc.binary_accuracy(y_true, y_pred, self.threshold), sample_weight)
        m = int(np.prod(y_pred.shape))
        if y_true.dtype != y_pred.dtype:
            y_true = kernels.cast(y_true, y_pred.dtype)
        scores = self._two_column(y_pred.reshape(m, 1), self.threshold)
        labels = self._two_column(y_true.reshape(m, 1), 0.5)  # one-hot-like rows: arg-max = (y > 0.5)
        self._add(kernels.accuracy_count(scores, labels), y_pred)
        self._count += m

    def get_config(self):
        return {**super().get_config(), "threshold": self.threshold}


class TopKCategoricalAccuracy(Metric):
    """Fraction of samples whose one-hot label is among the ``k`` highest scores."""

    label_kind = "categorical"

    def __init__(self, k: int = 5, name: str | None = None, dtype: Any = None) -> None:
        super().__init__(name, dtype)
        self.k = int(k)

    def update_state(self, y_true, y_pred, sample_weight=None):
        if sample_weight is not None:
            return self._weighted_update(_acc.top_k_categorical_accuracy(y_true, y_pred, self.k), sample_weight)
        self._add(kernels.top_k_count(y_pred, y_true, self.k), y_pred)
        self._count += int(y_pred.shape[0])

    def get_config(self):
        return {**super().get_config(), "k": self.k}


class SparseTopKCategoricalAccuracy(TopKCategoricalAccuracy):
    """Fraction of samples whose integer label is among the ``k`` highest scores."""

    label_kind = "sparse"

    def __init__(self, k: int = 5, name: str | None = None, dtype: Any = None, from_sorted_ids: bool = False) -> None:
        super().__init__(k, name, dtype)
        self.from_sorted_ids = bool(from_sorted_ids)

    def update_state(self, y_true, y_pred, sample_weight=None):
        if sample_weight is not None or self.from_sorted_ids or _float_labels(y_true):
            return self._weighted_update(_acc.sparse_top_k_categorical_accuracy(
                y_true, y_pred, self.k, self.from_sorted_ids), sample_weight)
        self._add(kernels.top_k_count(y_pred, y_true, self.k), y_pred)
        self._count += int(y_pred.shape[0])


class MeanMetricWrapper(Metric):
    """The (weighted) mean of a stateless function's values (Keras 3's ``keras.metrics.MeanMetricWrapper``).

    ``fn(y_true, y_pred, **kwargs)`` is written in ``keras.ops`` and gets tensors; its values are reduced to
    one mean per sample and averaged over samples (a batch's single number counts once), weighted as Keras
    weights them. ``compile(metrics=[fn])`` wraps a plain function in one, named after it."""

    _fn: Any = None  # dnnbind's own wrappers (MeanSquaredError...) set the function on the class

    def __init__(self, fn: Any = None, name: str | None = None, dtype: Any = None, **kwargs: Any) -> None:
        fn = type(self)._fn if fn is None else fn
        if fn is None or not callable(fn):
            raise _validate.ArgumentTypeError(
                f"{type(self).__name__}: fn must be a function fn(y_true, y_pred) returning the values to average, "
                f"got {type(fn).__name__}")
        super().__init__(name=name, dtype=dtype)
        self._fn = fn
        self._fn_kwargs = dict(kwargs)

    def update_state(self, y_true: Any, y_pred: Any, sample_weight: Any = None) -> None:
        """The function's values averaged as Keras 3's ``Mean`` (:meth:`Metric._weighted_update`)."""
        y_true = y_true if isinstance(y_true, Tensor) else _ops.convert_to_tensor(y_true)
        y_pred = y_pred if isinstance(y_pred, Tensor) else _ops.convert_to_tensor(y_pred)
        mask = y_pred._keras_mask  # Keras: the predictions' mask weights the samples
        if mask is not None:
            m = _ops.cast(mask, "float32")
            if sample_weight is None:
                sample_weight = m
            else:
                m, w = _loss_base.squeeze_or_expand_to_same_rank(m, _ops.cast(_ops.convert_to_tensor(sample_weight),
                                                                             "float32"))
                sample_weight = _ops.multiply(w, m)
        self._weighted_update(self._fn(y_true, y_pred, **self._fn_kwargs), sample_weight)

    def get_config(self) -> dict:
        config = super().get_config()
        if type(self) is MeanMetricWrapper:
            config = {**config, "fn": getattr(self._fn, "__name__", repr(self._fn)), **self._fn_kwargs}
        return config


_MeanMetricWrapper = MeanMetricWrapper  # the name the subclasses below were written with


class MeanSquaredError(MeanMetricWrapper):
    """The mean of ``mean((y_true - y_pred)**2, axis=-1)`` (``keras.metrics.MeanSquaredError``; ``"mse"``)."""
    _fn = staticmethod(_losses.mean_squared_error)

    def __init__(self, name: str | None = None, dtype: Any = None) -> None:
        super().__init__(name=name, dtype=dtype)


class MeanAbsoluteError(MeanMetricWrapper):
    """The mean of ``mean(|y_true - y_pred|, axis=-1)`` (``keras.metrics.MeanAbsoluteError``; ``"mae"``)."""
    _fn = staticmethod(_losses.mean_absolute_error)

    def __init__(self, name: str | None = None, dtype: Any = None) -> None:
        super().__init__(name=name, dtype=dtype)


class KLDivergence(MeanMetricWrapper):
    """The mean of ``kl_divergence(y_true, y_pred)`` per sample (``keras.metrics.KLDivergence``)."""
    _fn = staticmethod(_losses.kl_divergence)

    def __init__(self, name: str | None = "kl_divergence", dtype: Any = None) -> None:
        super().__init__(name=name, dtype=dtype)


accuracy = _acc.accuracy


class Accuracy(_MeanMetricWrapper):
    """How often ``y_pred`` equals ``y_true`` exactly (``keras.metrics.Accuracy``): the (weighted) mean over
    samples of :func:`accuracy`'s per-sample mean. Not the ``"accuracy"`` string of ``compile``, which picks a
    binary, categorical or sparse accuracy from the shapes."""
    _fn = staticmethod(accuracy)

    def __init__(self, name: "str | None" = None, dtype: Any = None) -> None:
        super().__init__(name=name or "accuracy", dtype=dtype)


class _AutoAccuracy(Metric):
    """``compile(metrics=["accuracy"])`` (or ``"acc"``): sparse, categorical or binary, chosen from the label
    and output shapes (Keras 3's ``compile_utils.get_metric``; the class :class:`Accuracy` is exact equality).

    As Keras: a 1-wide output is binary; labels of lower rank than the output, or a 1-wide label for a
    wider output, are sparse; otherwise categorical.
    """

    def __init__(self, name: str | None = None) -> None:
        super().__init__(name or "accuracy")
        self._impl: Metric | None = None

    def resolve(self, label_shape: tuple[int, ...], output_shape: tuple[int, ...]) -> Metric:
        """Pick the concrete metric for ``(batch, *label_shape)`` labels and ``(batch, *output_shape)`` outputs."""
        out_last = output_shape[-1] if output_shape else 1
        label_last = label_shape[-1] if label_shape else 1
        if out_last == 1:
            impl: Metric = BinaryAccuracy(self.name)
        elif len(label_shape) < len(output_shape) or (label_last == 1 and out_last > 1):
            impl = SparseCategoricalAccuracy(self.name)
        else:
            impl = CategoricalAccuracy(self.name)
        self._impl = impl
        return impl

    def update_state(self, y_true, y_pred, sample_weight=None):
        if self._impl is None:
            self.resolve(tuple(y_true.shape[1:]), tuple(y_pred.shape[1:]))
        if sample_weight is None:
            self._impl.update_state(y_true, y_pred)
        else:
            self._impl.update_state(y_true, y_pred, sample_weight=sample_weight)

    def result(self):
        return super().result() if self._impl is None else self._impl.result()

    def reset_state(self):
        if self._impl is not None:
            self._impl.reset_state()


class _ConfusionMatrixMetric(Metric):
    """Counts of the confusion matrix at one or more thresholds (Keras 3's ``metrics_utils``
    ``update_confusion_matrix_variables``): a prediction is positive where ``y_pred > threshold``, a
    label where ``y_true != 0``; ``sample_weight`` (broadcast to ``y_pred``'s shape) weights each element.
    The state is one float32 variable per count, of shape ``(len(thresholds),)``, updated in ``keras.ops``.
    ``thresholds`` None means 0.5; a float gives a scalar result, a list one result per threshold."""

    _kinds: tuple = ()

    def __init__(self, thresholds: Any = None, name: "str | None" = None, dtype: Any = None) -> None:
        super().__init__(name=name, dtype=dtype)
        owner = f"{type(self).__name__} '{self.name}'"
        self.init_thresholds = thresholds
        values = [0.5] if thresholds is None else (list(thresholds) if isinstance(thresholds, (list, tuple))
                                                   else [thresholds])
        if not values:
            raise ValueError(f"{owner}: thresholds must not be empty")
        for t in values:
            _validate.number(t, "thresholds", owner, low=0.0, high=1.0)
        self._scalar = not isinstance(thresholds, (list, tuple))
        self._set_thresholds([float(t) for t in values])

    def _set_thresholds(self, values: list) -> None:
        self.thresholds = values
        self._counts = {kind: self.add_variable((len(values),), "zeros", dtype="float32", name=kind)
                        for kind in self._kinds}

    def update_state(self, y_true: Any, y_pred: Any, sample_weight: Any = None) -> None:
        y_pred = _ops.cast(_ops.convert_to_tensor(y_pred), "float32")
        y_true = _ops.convert_to_tensor(y_true)
        if tuple(y_true.shape) != tuple(y_pred.shape) and y_true.size == y_pred.size:
            y_true = _ops.reshape(y_true, tuple(y_pred.shape))  # (N,) labels for (N, 1) predictions
        if tuple(y_true.shape) != tuple(y_pred.shape):
            raise ValueError(f"{type(self).__name__} '{self.name}': y_true of shape {tuple(y_true.shape)} does not "
                             f"match y_pred of shape {tuple(y_pred.shape)}")
        label = _ops.reshape(_ops.cast(_ops.not_equal(y_true, 0), "float32"), (-1, 1))
        pred = _ops.cast(_ops.greater(_ops.reshape(y_pred, (-1, 1)),
                                      _ops.convert_to_tensor(np.array([self.thresholds], np.float32))), "float32")
        if sample_weight is None:
            weight = _ops.ones_like(label)
        else:
            w = _ops.cast(_ops.convert_to_tensor(sample_weight), "float32")
            w = _ops.reshape(w, tuple(w.shape) + (1,) * (y_pred.ndim - w.ndim))
            weight = _ops.reshape(_ops.broadcast_to(w, tuple(y_pred.shape)), (-1, 1))
        cells = {"tp": label * pred, "fp": (1.0 - label) * pred, "tn": (1.0 - label) * (1.0 - pred),
                 "fn": label * (1.0 - pred)}
        for kind, variable in self._counts.items():
            variable.assign_add(_ops.sum(cells[kind] * weight, axis=0))

    def _value(self, kind: str) -> Any:
        return _ops.convert_to_tensor(self._counts[kind])

    def _finish(self, value: Any) -> Any:
        return value[0] if self._scalar else value

    def get_config(self) -> dict:
        return {**super().get_config(), "thresholds": self.init_thresholds}


class _Count(_ConfusionMatrixMetric):
    def result(self) -> Any:
        return self._finish(self._value(self._kinds[0]))


class TruePositives(_Count):
    """The (weighted) number of true positives (Keras 3's ``keras.metrics.TruePositives``)."""
    _kinds = ("tp",)


class FalsePositives(_Count):
    """The (weighted) number of false positives (``keras.metrics.FalsePositives``)."""
    _kinds = ("fp",)


class TrueNegatives(_Count):
    """The (weighted) number of true negatives (``keras.metrics.TrueNegatives``)."""
    _kinds = ("tn",)


class FalseNegatives(_Count):
    """The (weighted) number of false negatives (``keras.metrics.FalseNegatives``)."""
    _kinds = ("fn",)


class _Ratio(_ConfusionMatrixMetric):
    def __init__(self, thresholds: Any = None, top_k: Any = None, class_id: Any = None, name: "str | None" = None,
                 dtype: Any = None) -> None:
        if top_k is not None or class_id is not None:
            raise NotImplementedError(f"{type(self).__name__}: top_k and class_id are not supported (binary "
                                      "predictions with thresholds only)")
        super().__init__(thresholds=thresholds, name=name, dtype=dtype)

    def result(self) -> Any:
        tp, other = self._value("tp"), self._value(self._kinds[1])
        return self._finish(_ops.divide_no_nan(tp, tp + other))

    def get_config(self) -> dict:
        return {**super().get_config(), "top_k": None, "class_id": None}


class Precision(_Ratio):
    """``tp / (tp + fp)`` (0 while nothing was predicted positive) (``keras.metrics.Precision``)."""
    _kinds = ("tp", "fp")


class Recall(_Ratio):
    """``tp / (tp + fn)`` (0 while no label was positive) (``keras.metrics.Recall``)."""
    _kinds = ("tp", "fn")


class AUC(_ConfusionMatrixMetric):
    """Keras 3's ``keras.metrics.AUC``: the area under the ROC (or precision-recall) curve, from the confusion
    counts at ``num_thresholds`` thresholds (``(i + 1) / (num_thresholds - 1)``, or the sorted ``thresholds``
    given, plus ``-epsilon`` and ``1 + epsilon``), summed as Keras does (``summation_method``
    ``"interpolation"``: trapezoids, and for PR Davis & Goadrich's interpolation; ``"minoring"`` /
    ``"majoring"``: the lower / upper Riemann sums). ``from_logits=True`` applies a sigmoid first.
    ``multi_label=True``, ``num_labels``, ``label_weights`` and the ``"PRGAIN"`` curve are not supported."""

    _kinds = ("tp", "fp", "tn", "fn")

    def __init__(self, num_thresholds: int = 200, curve: str = "ROC", summation_method: str = "interpolation",
                 name: "str | None" = None, dtype: Any = None, thresholds: Any = None, multi_label: bool = False,
                 num_labels: Any = None, label_weights: Any = None, from_logits: bool = False) -> None:
        owner = f"AUC '{name or 'auc'}'"
        if multi_label or num_labels is not None or label_weights is not None:
            raise NotImplementedError(f"{owner}: multi_label, num_labels and label_weights are not supported")
        if str(curve).upper() not in ("ROC", "PR"):
            raise ValueError(f"{owner}: curve must be 'ROC' or 'PR', got {curve!r}")
        if str(summation_method).lower() not in ("interpolation", "minoring", "majoring"):
            raise ValueError(f"{owner}: summation_method must be 'interpolation', 'minoring' or 'majoring', "
                             f"got {summation_method!r}")
        if thresholds is not None:
            inner = sorted(float(t) for t in thresholds)
            for t in inner:
                _validate.number(t, "thresholds", owner, low=0.0, high=1.0)
        else:
            num_thresholds = _validate.integer(num_thresholds, "num_thresholds", owner, minimum=2)
            inner = [(i + 1) * 1.0 / (num_thresholds - 1) for i in range(num_thresholds - 2)]
        eps = backend.epsilon()
        Metric.__init__(self, name=name, dtype=dtype)
        self._scalar = False
        self._set_thresholds([0.0 - eps, *inner, 1.0 + eps])
        self.num_thresholds = len(self.thresholds)
        self.init_thresholds = None if thresholds is None else list(inner)
        self.curve = str(curve).upper()
        self.summation_method = str(summation_method).lower()
        self.from_logits = bool(from_logits)
        self.multi_label = False

    def update_state(self, y_true: Any, y_pred: Any, sample_weight: Any = None) -> None:
        if self.from_logits:
            y_pred = _ops.sigmoid(_ops.convert_to_tensor(y_pred))
        super().update_state(y_true, y_pred, sample_weight)

    def _interpolate_pr_auc(self, tp: Any, fp: Any, fn: Any) -> Any:
        n = self.num_thresholds
        dtp = tp[: n - 1] - tp[1:]
        p = tp + fp
        dp = p[: n - 1] - p[1:]
        prec_slope = _ops.divide_no_nan(dtp, _ops.maximum(dp, 0.0))
        intercept = tp[1:] - prec_slope * p[1:]
        safe_p_ratio = _ops.where(_ops.logical_and(p[: n - 1] > 0, p[1:] > 0),
                                  _ops.divide_no_nan(p[: n - 1], _ops.maximum(p[1:], 0.0)), _ops.ones_like(p[1:]))
        increment = _ops.divide_no_nan(prec_slope * (dtp + intercept * _ops.log(safe_p_ratio)),
                                       _ops.maximum(tp[1:] + fn[1:], 0.0))
        return _ops.sum(increment)

    def result(self) -> Any:
        tp, fp, tn, fn = (self._value(k) for k in self._kinds)
        if self.curve == "PR" and self.summation_method == "interpolation":
            return self._interpolate_pr_auc(tp, fp, fn)
        recall = _ops.divide_no_nan(tp, tp + fn)
        if self.curve == "ROC":
            x, y = _ops.divide_no_nan(fp, fp + tn), recall
        else:
            x, y = recall, _ops.divide_no_nan(tp, tp + fp)
        n = self.num_thresholds
        if self.summation_method == "interpolation":
            heights = (y[: n - 1] + y[1:]) / 2.0
        elif self.summation_method == "minoring":
            heights = _ops.minimum(y[: n - 1], y[1:])
        else:
            heights = _ops.maximum(y[: n - 1], y[1:])
        return _ops.sum((x[: n - 1] - x[1:]) * heights)

    def get_config(self) -> dict:
        return {"name": self.name, "num_thresholds": self.num_thresholds, "curve": self.curve,
                "summation_method": self.summation_method, "multi_label": False, "num_labels": None,
                "label_weights": None, "thresholds": self.init_thresholds, "from_logits": self.from_logits}


for _cls in (Mean, SparseCategoricalAccuracy, CategoricalAccuracy, BinaryAccuracy, TopKCategoricalAccuracy,
             SparseTopKCategoricalAccuracy, _AutoAccuracy):
    if "update_state" in _cls.__dict__:
        _cls.update_state = _takes_tensors(_cls.__dict__["update_state"])


#: class name -> registered name, filled by the package (``Metric(name=None)`` takes it)
_CLASS_TO_NAME: dict = {"Mean": "mean"}


def _snake(name: str) -> str:
    name = re.sub(r"(.)([A-Z][a-z]+)", r"\1_\2", name)
    return re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", name).lower()


kl_divergence = _losses.kl_divergence


class Sum(Metric):
    """The (weighted) sum of values (Keras 3's ``keras.metrics.Sum``): per-sample values are summed over their
    trailing axes, times ``sample_weight``, into one device variable."""

    def __init__(self, name: str = "sum", dtype: Any = None) -> None:
        super().__init__(name=name, dtype=dtype)
        self.total = self.add_variable((), "zeros", dtype="float32", name="total")

    def update_state(self, values: Any, sample_weight: Any = None) -> None:  # type: ignore[override]
        values = _ops.cast(_ops.convert_to_tensor(values), "float32")
        if sample_weight is not None:
            w = _ops.cast(_ops.convert_to_tensor(sample_weight), "float32")
            values, w = _loss_base.squeeze_or_expand_to_same_rank(values, w)
            if values.ndim > w.ndim:
                values = _ops.sum(values, axis=tuple(range(w.ndim, values.ndim)))
            values = values * _ops.broadcast_to(w, tuple(values.shape))
        self.total.assign_add(_ops.sum(values))

    def result(self) -> Any:
        return _ops.convert_to_tensor(self.total)

    def get_config(self) -> dict:
        return {"name": self.name, "dtype": self.dtype}
