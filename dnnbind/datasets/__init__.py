"""Data sets with the Keras ``load_data()`` interface: :mod:`.mnist` and :mod:`.cifar10`.

Downloads are verified against published checksums and cached atomically in
``$DNNBIND_DATA`` or ``~/.cache/dnnbind`` (see :mod:`.download`); every loader
also reads local files (``data_dir=``). No pickle is used anywhere. Offline, MNIST falls back
to its published test set, shipped in ``mnist-t10k/`` (see :func:`.mnist.load_embedded`).
"""

from __future__ import annotations

from . import cifar10, mnist
from .download import ChecksumError, DatasetError, DatasetFormatError, DownloadError, cache_dir

__all__ = ["mnist", "cifar10", "cache_dir", "DatasetError", "DownloadError", "ChecksumError",
           "DatasetFormatError"]
