"""The Keras ``.npz`` data sets of plain arrays (``boston_housing``, ``california_housing``): fetched once through
:mod:`.download` (sha256 as Keras publishes it), read member by member within the read limits with every header
checked (:func:`dnnbind.datasets.mnist._npy_array`; object arrays refused), shuffled and split as Keras does."""

from __future__ import annotations

import os
import zipfile
import zlib
from pathlib import Path

import numpy as np

from .._bounded import BoundedReader, ReadLimits
from .download import DatasetFormatError, RemoteFile, fetch_all
from .mnist import _npy_array

KERAS_MIRRORS = ["https://storage.googleapis.com/tensorflow/tf-keras-datasets/"]


def read_npz(path: Path, names: "tuple[str, ...]", limits: "ReadLimits | dict | None" = None) -> list[np.ndarray]:
    """The arrays ``names`` of an ``.npz`` file (plain dtypes only)."""
    try:
        with BoundedReader(limits).open_zip(path) as zf:
            missing = [k for k in names if f"{k}.npy" not in zf.infos]
            if missing:
                found = sorted(n[:-4] for n in zf.infos if n.endswith(".npy"))
                raise DatasetFormatError(f"{path}: missing arrays {missing} (found {found})")
            return [_npy_array(zf.read(f"{k}.npy"), f"{path}: {k}.npy") for k in names]
    except (zipfile.BadZipFile, zlib.error, EOFError) as exc:
        raise DatasetFormatError(f"{path}: not a readable .npz (zip) file ({exc})") from None


def local_or_fetched(spec: RemoteFile, subdir: str, dataset: str, data_dir: "str | os.PathLike | None") -> Path:
    """``data_dir/<file>`` when given (it must exist), else the cached, verified download."""
    if data_dir is not None:
        path = Path(data_dir) / spec.filename
        if not path.is_file():
            raise FileNotFoundError(f"{dataset}: {path} does not exist (data_dir= must hold {spec.filename}, "
                                    f"{spec.checksum_text()})")
        return path
    return fetch_all([spec], KERAS_MIRRORS, subdir, dataset=dataset)[0]


def shuffled_split(x: np.ndarray, y: np.ndarray, test_split: float, seed: int):
    """Keras's split: a ``RandomState(seed)`` permutation, then the first ``1 - test_split`` for training."""
    if not 0 <= test_split < 1:
        raise ValueError(f"Invalid `test_split` argument: {test_split}. It must be between 0 and 1 (exclusive of 1).")
    indices = np.arange(len(x))
    np.random.RandomState(seed).shuffle(indices)
    x, y = x[indices], y[indices]
    cut = int(len(x) * (1 - test_split))
    return (np.array(x[:cut]), np.array(y[:cut])), (np.array(x[cut:]), np.array(y[cut:]))
