"""Losses with Keras 3 names, computed by ``dnnbind.kernels`` (value and gradient in one call).

Every loss returns the mean over the batch (Keras's ``"sum_over_batch_size"``) as a 0-d float32
array (float64 for float64 predictions) on the predictions' device, together with the gradient w.r.t. the predictions (already
divided by the batch size). With ``sample_weight`` (one weight per sample, shape ``(N,)``) the
value is ``sum_i w_i l_i / N`` exactly as Keras 3 reduces it: divided by the batch size, not by
the sum of the weights. A final softmax with ``from_logits=False`` crossentropy is fused by
the model: the loss then sees the logits.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import kernels

__all__ = [
    "Loss",
    "SparseCategoricalCrossentropy",
    "CategoricalCrossentropy",
    "BinaryCrossentropy",
    "MeanSquaredError",
    "sparse_categorical_crossentropy",
    "categorical_crossentropy",
    "binary_crossentropy",
    "mean_squared_error",
    "mse",
    "get",
    "serialize",
]


class Loss:
    """Base class. ``compute(y_pred, y_true, logits=False, grad_scale=1.0, sample_weight=None) -> (loss, dy_pred)``."""

    #: whether a model may fuse a final softmax into this loss (cross-entropies over classes)
    fuses_softmax = False

    def __init__(self, name: str | None = None, reduction: str = "sum_over_batch_size") -> None:
        if reduction not in ("sum_over_batch_size", "auto", None):
            raise NotImplementedError(f"{type(self).__name__}: only reduction='sum_over_batch_size' is supported")
        self.name = name or _CLASS_TO_NAME.get(type(self).__name__, type(self).__name__)
        self.reduction = "sum_over_batch_size"

    # ----- labels -----------------------------------------------------------------------------
    def prepare_labels(self, y: np.ndarray, output_shape: tuple[int, ...], owner: str = "") -> np.ndarray:
        """Check host labels against the model output ``(batch, *output_shape)`` and convert their dtype.

        Raises a ValueError/TypeError naming the loss and what was expected.
        """
        raise NotImplementedError

    def compute(self, y_pred: Any, y_true: Any, *, logits: bool = False, grad_scale: Any = 1.0,
                sample_weight: Any = None):
        raise NotImplementedError

    def __call__(self, y_true: Any, y_pred: Any, sample_weight: Any = None) -> Any:
        """Keras-style standalone call: the (weighted) mean loss (a 0-d array on the inputs' device)."""
        from_logits = getattr(self, "from_logits", False)
        y_true = np.asarray(y_true) if isinstance(y_true, (list, tuple)) else y_true
        y_pred = np.asarray(y_pred, dtype=np.float32) if isinstance(y_pred, (list, tuple)) else y_pred
        if isinstance(sample_weight, (list, tuple)):
            sample_weight = np.asarray(sample_weight, dtype=np.float32)
        loss, _ = self.compute(y_pred, y_true, logits=from_logits, sample_weight=sample_weight)
        return loss

    def get_config(self) -> dict:
        return {"name": self.name}

    @classmethod
    def from_config(cls, config: dict) -> "Loss":
        return cls(**config)


def _float_labels(y: np.ndarray, what: str) -> np.ndarray:
    if y.dtype.kind not in "fiub":
        raise TypeError(f"{what}: labels must be numeric, got dtype {y.dtype}")
    return np.ascontiguousarray(y, dtype=np.float32)


def _check_rows(y: np.ndarray, output_shape: tuple[int, ...], what: str) -> np.ndarray:
    """Labels of the output's shape; ``(N,)`` is accepted for a ``(N, 1)`` output."""
    want = tuple(output_shape)
    if tuple(y.shape[1:]) == want:
        return y
    if want == (1,) and y.ndim == 1:
        return y.reshape(-1, 1)
    raise ValueError(
        f"{what}: labels must have shape (batch, {', '.join(map(str, want))}) like the model output, "
        f"got {tuple(y.shape)}"
    )


class SparseCategoricalCrossentropy(Loss):
    """Cross-entropy with integer class labels ``(N,)`` (or ``(N, 1)``) in ``[0, classes)``."""

    fuses_softmax = True

    def __init__(self, from_logits: bool = False, ignore_class: int | None = None, name: str | None = None,
                 reduction: str = "sum_over_batch_size") -> None:
        super().__init__(name, reduction)
        if ignore_class is not None:
            raise NotImplementedError("SparseCategoricalCrossentropy: ignore_class is not supported")
        self.from_logits = bool(from_logits)

    def prepare_labels(self, y, output_shape, owner=""):
        what = f"{owner}loss '{self.name}'"
        y = np.asarray(y)
        if y.ndim == 2 and y.shape[1] == 1:
            y = y.reshape(-1)
        if len(output_shape) != 1:
            raise ValueError(f"{what}: needs a model output of shape (batch, classes), got (batch, "
                             f"{', '.join(map(str, output_shape))})")
        if y.ndim != 1:
            raise ValueError(
                f"{what}: labels must be integer class indices of shape (batch,), got shape {tuple(y.shape)}"
                + ("; for one-hot labels use loss='categorical_crossentropy'" if y.ndim == 2 else "")
            )
        if y.dtype.kind == "f":
            if not np.all(np.isfinite(y)) or np.any(y != np.round(y)):
                raise ValueError(f"{what}: labels must be integer class indices, got non-integer values")
        elif y.dtype.kind not in "iub":
            raise TypeError(f"{what}: labels must be integer class indices, got dtype {y.dtype}")
        classes = output_shape[0]
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
    """Cross-entropy with one-hot (or soft) labels ``(N, classes)``; optional label smoothing."""

    fuses_softmax = True

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
    """Binary cross-entropy on probabilities (or logits with ``from_logits=True``), targets in [0, 1]."""

    def __init__(self, from_logits: bool = False, label_smoothing: float = 0.0, name: str | None = None,
                 reduction: str = "sum_over_batch_size") -> None:
        super().__init__(name, reduction)
        if not 0.0 <= label_smoothing <= 1.0:
            raise ValueError(f"BinaryCrossentropy: label_smoothing must be in [0, 1], got {label_smoothing}")
        self.from_logits = bool(from_logits)
        self.label_smoothing = float(label_smoothing)

    def prepare_labels(self, y, output_shape, owner=""):
        what = f"{owner}loss '{self.name}'"
        y = _check_rows(_float_labels(np.asarray(y), what), output_shape, what)
        if y.size and (y.min() < 0 or y.max() > 1):
            raise ValueError(f"{what}: targets must be in [0, 1], got values in [{y.min()}, {y.max()}]")
        return y

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


_BY_NAME: dict[str, type] = {
    "sparse_categorical_crossentropy": SparseCategoricalCrossentropy,
    "categorical_crossentropy": CategoricalCrossentropy,
    "binary_crossentropy": BinaryCrossentropy,
    "mean_squared_error": MeanSquaredError,
}
_ALIASES = {"mse": "mean_squared_error", "scce": "sparse_categorical_crossentropy",
            "cce": "categorical_crossentropy", "bce": "binary_crossentropy"}
_CLASS_TO_NAME = {cls.__name__: name for name, cls in _BY_NAME.items()}


def _functional(name: str):
    def loss_fn(y_true, y_pred, from_logits: bool = False, **kwargs):
        cls = _BY_NAME[name]
        obj = cls(from_logits=from_logits, **kwargs) if name != "mean_squared_error" else cls()
        return obj(y_true, y_pred)

    loss_fn.__name__ = name
    loss_fn.__doc__ = f"Functional form of :class:`{_BY_NAME[name].__name__}` (mean over the batch)."
    return loss_fn


sparse_categorical_crossentropy = _functional("sparse_categorical_crossentropy")
categorical_crossentropy = _functional("categorical_crossentropy")
binary_crossentropy = _functional("binary_crossentropy")
mean_squared_error = _functional("mean_squared_error")
mse = mean_squared_error


def known_names() -> list[str]:
    return sorted([*_BY_NAME, *_ALIASES])


def get(identifier: Any) -> Loss:
    """A :class:`Loss` from a name (``"sparse_categorical_crossentropy"``, ``"mse"``), a class name,
    a config dict, an instance, or one of this module's functions."""
    if isinstance(identifier, Loss):
        return identifier
    if isinstance(identifier, type) and issubclass(identifier, Loss):
        return identifier()
    if callable(identifier) and getattr(identifier, "__name__", None) in _BY_NAME:
        return _BY_NAME[identifier.__name__]()
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
