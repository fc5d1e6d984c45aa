"""Small utilities with Keras names: ``to_categorical``, ``set_random_seed``."""

from __future__ import annotations

import numpy as np

__all__ = ["to_categorical", "set_random_seed"]


def to_categorical(y, num_classes: int | None = None, dtype="float32") -> np.ndarray:
    """One-hot encode integer class labels (any shape; a trailing axis of 1 is dropped, as Keras).

    >>> to_categorical([0, 2], 3)
    array([[1., 0., 0.],
           [0., 0., 1.]], dtype=float32)
    """
    y = np.asarray(y)
    if y.dtype.kind not in "iub":
        if y.dtype.kind == "f" and np.all(np.isfinite(y)) and np.all(y == np.round(y)):
            y = y.astype(np.int64)
        else:
            raise ValueError(f"to_categorical: labels must be integers, got dtype {y.dtype}")
    y = y.astype(np.int64)
    if y.ndim > 1 and y.shape[-1] == 1:
        y = y.reshape(y.shape[:-1])
    if y.size and y.min() < 0:
        raise ValueError(f"to_categorical: labels must be >= 0, got {int(y.min())}")
    if num_classes is None:
        num_classes = int(y.max()) + 1 if y.size else 0
    elif y.size and int(y.max()) >= num_classes:
        raise ValueError(f"to_categorical: label {int(y.max())} is out of range for num_classes={num_classes}")
    out = np.zeros(y.shape + (num_classes,), dtype=dtype)
    flat = out.reshape(-1, num_classes)
    flat[np.arange(y.size), y.reshape(-1)] = 1
    return out


def set_random_seed(seed: int) -> None:
    """Seed NumPy's global generator (used when a layer or fit is given no seed)."""
    np.random.seed(seed)
