"""Reuters newswire topics (``keras.datasets.reuters``): 11,228 newswires as lists of word ids, 46 topics.

Keras's ``reuters.npz`` holds a ragged object array (a pickle stream); dnnbind decodes it without unpickling
(:mod:`dnnbind.datasets._ragged`), then shuffles, shifts, cuts and splits exactly as Keras."""

from __future__ import annotations

import os

import numpy as np

from .._bounded import BoundedReader, ReadLimits
from ._tabular import local_or_fetched
from ._text import cut_vocabulary, object_array, read_ragged_npz, remove_long, shift
from .download import RemoteFile

__all__ = ["load_data", "get_word_index", "ARCHIVE", "WORD_INDEX"]

ARCHIVE = RemoteFile("reuters.npz", sha256="d6586e694ee56d7a4e65172e12b3e987c03096cb01eab99753921ef915959916")
WORD_INDEX = RemoteFile("reuters_word_index.json", md5="4d44cc38712099c9e383dc6e5f11a921")


def load_data(path: str = "reuters.npz", num_words: "int | None" = None, skip_top: int = 0,
              maxlen: "int | None" = None, test_split: float = 0.2, seed: int = 113,
              start_char: "int | None" = 1, oov_char: "int | None" = 2, index_from: int = 3, *,
              data_dir: "str | os.PathLike | None" = None, limits: "ReadLimits | dict | None" = None):
    """``(x_train, y_train), (x_test, y_test)`` as Keras (see :func:`dnnbind.datasets.imdb.load_data` for the id
    arguments); the first ``1 - test_split`` of the shuffled newswires are for training. ``data_dir``: a
    directory holding ``reuters.npz`` (no download)."""
    file = local_or_fetched(ARCHIVE, "reuters", "Reuters", data_dir)
    xs, labels = read_ragged_npz(file, ("x", "y"), limits)
    rng = np.random.RandomState(seed)
    indices = np.arange(len(xs))
    rng.shuffle(indices)
    xs, labels = xs[indices], labels[indices]
    xs = shift(xs, start_char, index_from)
    if maxlen:
        xs, labels = remove_long(maxlen, xs, labels)
    xs = cut_vocabulary(xs, num_words, skip_top, oov_char)
    idx = int(len(xs) * (1 - test_split))
    return ((object_array(xs[:idx]), np.array(labels[:idx])), (object_array(xs[idx:]), np.array(labels[idx:])))


def get_word_index(path: str = "reuters_word_index.json", *, data_dir: "str | os.PathLike | None" = None) -> dict:
    """``{word: id}`` (before the ``index_from`` shift), as Keras."""
    file = local_or_fetched(WORD_INDEX, "reuters", "Reuters word index", data_dir)
    reader = BoundedReader()
    return reader.json(reader.read_file(file, str(file)), str(file))
