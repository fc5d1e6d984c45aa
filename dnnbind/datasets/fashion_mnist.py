"""Fashion-MNIST (``keras.datasets.fashion_mnist``): 28x28 uint8 images of 10 clothing classes, in MNIST's IDX
format, read with :func:`dnnbind.datasets.mnist.load_idx` (no pickle)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from .._bounded import ReadLimits
from .download import DatasetFormatError, RemoteFile, fetch_all
from .mnist import load_idx

__all__ = ["load_data", "FILES", "MIRRORS", "CLASS_NAMES"]

MIRRORS = ["https://storage.googleapis.com/tensorflow/tf-keras-datasets/",
           "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/"]
# MD5 as published in the Fashion-MNIST README (github.com/zalandoresearch/fashion-mnist)
FILES = {
    "train_images": RemoteFile("train-images-idx3-ubyte.gz", md5="8d4fb7e6c68d591d4c3dfef9ec88bf0d"),
    "train_labels": RemoteFile("train-labels-idx1-ubyte.gz", md5="25c81989df183df01b3e8a0aad5dffbe"),
    "test_images": RemoteFile("t10k-images-idx3-ubyte.gz", md5="bef4ecab320f06d8554ea6380940ec79"),
    "test_labels": RemoteFile("t10k-labels-idx1-ubyte.gz", md5="bb300cfdad3c16e7a12a480ee83cd310"),
}
CLASS_NAMES = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag",
               "Ankle boot")


def _pair(images_path: Path, labels_path: Path, limits) -> tuple[np.ndarray, np.ndarray]:
    images, labels = load_idx(images_path, limits=limits), load_idx(labels_path, limits=limits)
    if images.dtype != np.uint8 or images.ndim != 3 or images.shape[1:] != (28, 28):
        raise DatasetFormatError(f"{images_path}: expected uint8 images of shape (N, 28, 28), got "
                                 f"{images.dtype.name} {images.shape}")
    if labels.dtype != np.uint8 or labels.shape != (len(images),):
        raise DatasetFormatError(f"{labels_path}: expected {len(images)} uint8 labels, got {labels.dtype.name} "
                                 f"{labels.shape}")
    return images, labels


def load_data(*, data_dir: "str | os.PathLike | None" = None, limits: "ReadLimits | dict | None" = None):
    """``(x_train, y_train), (x_test, y_test)``: uint8 ``(60000, 28, 28)`` / ``(60000,)`` and ``(10000, 28, 28)``
    / ``(10000,)``, as Keras. ``data_dir``: a directory holding the four ``.gz`` files (no download)."""
    order = ("train_images", "train_labels", "test_images", "test_labels")
    if data_dir is not None:
        paths = [Path(data_dir) / FILES[k].filename for k in order]
        missing = [str(p) for p in paths if not p.is_file()]
        if missing:
            raise FileNotFoundError(f"Fashion-MNIST: missing {', '.join(missing)}")
    else:
        paths = fetch_all([FILES[k] for k in order], MIRRORS, "fashion_mnist", dataset="Fashion-MNIST")
    return _pair(paths[0], paths[1], limits), _pair(paths[2], paths[3], limits)
