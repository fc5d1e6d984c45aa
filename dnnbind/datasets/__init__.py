"""Data sets with the Keras ``load_data()`` interface: :mod:`.mnist`, :mod:`.cifar10`, :mod:`.cifar100`,
:mod:`.fashion_mnist`, :mod:`.boston_housing`, :mod:`.california_housing`, :mod:`.imdb` and :mod:`.reuters`.

Downloads are verified against published checksums and cached atomically in
``$DNNBIND_DATA`` or ``~/.cache/dnnbind`` (see :mod:`.download`); every loader
also reads local files (``data_dir=``). No pickle is used anywhere. Offline, MNIST falls back
to its published test set, shipped in ``mnist-t10k/`` (see :func:`.mnist.load_embedded`).
"""

from __future__ import annotations

from . import boston_housing, california_housing, cifar10, cifar100, fashion_mnist, imdb, mnist, reuters
from .download import ChecksumError, DatasetError, DatasetFormatError, DownloadError, cache_dir

__all__ = ["mnist", "cifar10", "cifar100", "fashion_mnist", "boston_housing", "california_housing", "imdb", "reuters",
           "cache_dir", "DatasetError", "DownloadError", "ChecksumError",
           "DatasetFormatError"]
