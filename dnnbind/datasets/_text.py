"""What ``imdb.load_data`` and ``reuters.load_data`` share: the ragged ``.npz`` read without pickle
(:mod:`._ragged`), Keras's word-id shifting, ``maxlen`` filtering and vocabulary cut."""

from __future__ import annotations

import zipfile
import zlib
from pathlib import Path

import numpy as np

from .._bounded import BoundedReader, ReadLimits
from ._ragged import ragged_int_lists
from .download import DatasetFormatError

__all__ = ["read_ragged_npz", "shift", "remove_long", "cut_vocabulary", "object_array"]


def read_ragged_npz(path: Path, names: "tuple[str, ...]", limits: "ReadLimits | dict | None") -> list[np.ndarray]:
    try:
        with BoundedReader(limits).open_zip(path) as zf:
            missing = [k for k in names if f"{k}.npy" not in zf.infos]
            if missing:
                raise DatasetFormatError(f"{path}: missing arrays {missing}")
            return [ragged_int_lists(zf.read(f"{k}.npy"), f"{path}: {k}.npy") for k in names]
    except (zipfile.BadZipFile, zlib.error, EOFError) as exc:
        raise DatasetFormatError(f"{path}: not a readable .npz (zip) file ({exc})") from None


def shift(xs, start_char, index_from) -> list:
    if start_char is not None:
        return [[start_char] + [w + index_from for w in x] for x in xs]
    if index_from:
        return [[w + index_from for w in x] for x in xs]
    return [list(x) for x in xs]


def remove_long(maxlen, xs, labels) -> tuple[list, list]:
    kept = [(x, y) for x, y in zip(xs, labels) if len(x) < maxlen]
    return [x for x, _ in kept], [y for _, y in kept]


def cut_vocabulary(xs, num_words, skip_top, oov_char) -> list:
    if not num_words:
        num_words = max(max(x) for x in xs if x)
    if oov_char is not None:
        return [[w if skip_top <= w < num_words else oov_char for w in x] for x in xs]
    return [[w for w in x if skip_top <= w < num_words] for x in xs]


def object_array(lists: list) -> np.ndarray:
    out = np.empty(len(lists), dtype=object)
    for i, x in enumerate(lists):
        out[i] = x
    return out

