"""Boston housing prices (``keras.datasets.boston_housing``): 506 samples of 13 features, as Keras splits them."""

from __future__ import annotations

import os

from .._bounded import ReadLimits
from ._tabular import local_or_fetched, read_npz, shuffled_split
from .download import RemoteFile

__all__ = ["load_data", "ARCHIVE"]

ARCHIVE = RemoteFile("boston_housing.npz", sha256="f553886a1f8d56431e820c5b82552d9d95cfcb96d1e678153f8839538947dff5")


def load_data(path: str = "boston_housing.npz", test_split: float = 0.2, seed: int = 113, *,
              data_dir: "str | os.PathLike | None" = None, limits: "ReadLimits | dict | None" = None):
    """``(x_train, y_train), (x_test, y_test)`` (float64 ``(N, 13)`` and ``(N,)``), shuffled by ``seed`` and split at
    ``1 - test_split`` as Keras does. ``data_dir``: a directory holding ``boston_housing.npz`` (no download);
    ``path`` is Keras's cache name and is ignored (dnnbind caches under ``$DNNBIND_DATA/boston_housing``)."""
    if not 0 <= test_split < 1:
        raise ValueError(f"Invalid `test_split` argument: {test_split}. It must be between 0 and 1 (exclusive of 1).")
    file = local_or_fetched(ARCHIVE, "boston_housing", "Boston housing", data_dir)
    x, y = read_npz(file, ("x", "y"), limits)
    return shuffled_split(x, y, test_split, seed)
