"""IMDB movie-review sentiment (``keras.datasets.imdb``): 25,000 + 25,000 reviews as lists of word ids, label 0/1.

Keras's ``imdb.npz`` stores the reviews as a ragged object array (a pickle stream); dnnbind decodes that stream
without unpickling (:mod:`dnnbind.datasets._ragged`), then shuffles, shifts and cuts the ids exactly as Keras."""

from __future__ import annotations

import json
import os

import numpy as np

from .._bounded import BoundedReader, ReadLimits
from ._tabular import local_or_fetched
from ._text import cut_vocabulary, object_array, read_ragged_npz, remove_long, shift
from .download import RemoteFile

__all__ = ["load_data", "get_word_index", "ARCHIVE", "WORD_INDEX"]

ARCHIVE = RemoteFile("imdb.npz", sha256="69664113be75683a8fe16e3ed0ab59fda8886cb3cd7ada244f7d9544e4676b9f")
WORD_INDEX = RemoteFile("imdb_word_index.json", md5="bfafd718b763782e994055a2d397834f")


def load_data(path: str = "imdb.npz", num_words: "int | None" = None, skip_top: int = 0,
              maxlen: "int | None" = None, seed: int = 113, start_char: "int | None" = 1,
              oov_char: "int | None" = 2, index_from: int = 3, *, data_dir: "str | os.PathLike | None" = None,
              limits: "ReadLimits | dict | None" = None, **kwargs):
    """``(x_train, y_train), (x_test, y_test)`` as Keras: x object arrays of lists of word ids (``start_char``
    first, ids shifted by ``index_from``, ids outside ``[skip_top, num_words)`` replaced by ``oov_char`` or
    dropped), y int labels. ``data_dir``: a directory holding ``imdb.npz`` (no download); ``path`` is Keras's
    cache name and is ignored."""
    if kwargs:
        raise TypeError(f"Unrecognized keyword arguments: {sorted(kwargs)}")
    file = local_or_fetched(ARCHIVE, "imdb", "IMDB", data_dir)
    x_train, labels_train, x_test, labels_test = read_ragged_npz(file, ("x_train", "y_train", "x_test", "y_test"),
                                                                 limits)
    rng = np.random.RandomState(seed)
    indices = np.arange(len(x_train))
    rng.shuffle(indices)
    x_train, labels_train = x_train[indices], labels_train[indices]
    indices = np.arange(len(x_test))
    rng.shuffle(indices)
    x_test, labels_test = x_test[indices], labels_test[indices]
    x_train, x_test = shift(x_train, start_char, index_from), shift(x_test, start_char, index_from)
    if maxlen:
        x_train, labels_train = remove_long(maxlen, x_train, labels_train)
        x_test, labels_test = remove_long(maxlen, x_test, labels_test)
        if not x_train or not x_test:
            raise ValueError(f"After filtering for sequences shorter than maxlen={maxlen}, no sequence was kept. "
                             "Increase maxlen.")
    xs = cut_vocabulary(x_train + x_test, num_words, skip_top, oov_char)
    labels = np.concatenate([labels_train, labels_test])
    idx = len(x_train)
    return (object_array(xs[:idx]), labels[:idx]), (object_array(xs[idx:]), labels[idx:])


def get_word_index(path: str = "imdb_word_index.json", *, data_dir: "str | os.PathLike | None" = None) -> dict:
    """``{word: id}`` (before the ``index_from`` shift), as Keras."""
    file = local_or_fetched(WORD_INDEX, "imdb", "IMDB word index", data_dir)
    reader = BoundedReader()
    return reader.json(reader.read_file(file, str(file)), str(file))
