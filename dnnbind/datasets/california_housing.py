"""California housing prices (``keras.datasets.california_housing``): 20,640 samples of 8 features."""

from __future__ import annotations

import os

from .._bounded import ReadLimits
from ._tabular import local_or_fetched, read_npz, shuffled_split
from .download import RemoteFile

__all__ = ["load_data", "ARCHIVE"]

ARCHIVE = RemoteFile("california_housing.npz",
                     sha256="1a2e3a52e0398de6463aebe6f4a8da34fb21fbb6b934cf88c3425e766f2a1a6f")


def load_data(version: str = "large", path: str = "california_housing.npz", test_split: float = 0.2, seed: int = 113,
              *, data_dir: "str | os.PathLike | None" = None, limits: "ReadLimits | dict | None" = None):
    """``(x_train, y_train), (x_test, y_test)`` as Keras: ``version="small"`` keeps the first 600 samples, then a
    ``RandomState(seed)`` shuffle and a split at ``1 - test_split``. ``data_dir``: a directory holding
    ``california_housing.npz`` (no download); ``path`` is Keras's cache name and is ignored."""
    if version not in ("small", "large"):
        raise ValueError(f"Argument `version` must be one of 'small', 'large'. Received: version={version}")
    if not 0 <= test_split < 1:
        raise ValueError(f"Invalid `test_split` argument: {test_split}. It must be between 0 and 1 (exclusive of 1).")
    file = local_or_fetched(ARCHIVE, "california_housing", "California housing", data_dir)
    x, y = read_npz(file, ("x", "y"), limits)
    if version == "small":
        x, y = x[:600], y[:600]
    return shuffled_split(x, y, test_split, seed)
