"""CIFAR-100 (``keras.datasets.cifar100``), read from the **binary** version of the data set (never the pickle
one Keras reads): each record is a coarse label byte, a fine label byte and 3072 pixel bytes (CHW), transposed
here to HWC. Labels are int64 ``(N, 1)``, as Keras returns them."""

from __future__ import annotations

import os
import tarfile
from pathlib import Path

import numpy as np

from .._bounded import BoundedReader, ReadLimits
from .download import DatasetFormatError, RemoteFile, fetch_all

__all__ = ["load_data", "parse_records", "ARCHIVE", "MIRRORS"]

MIRRORS = ["https://www.cs.toronto.edu/~kriz/", "http://www.cs.toronto.edu/~kriz/"]
# MD5 as published on https://www.cs.toronto.edu/~kriz/cifar.html
ARCHIVE = RemoteFile("cifar-100-binary.tar.gz", md5="03b5dce01913d631647c71ecec9e9cb8")
MEMBER_DIR = "cifar-100-binary"
_RECORD = 2 + 3 * 32 * 32


def parse_records(data: bytes, label_mode: str = "fine", source: str = "<bytes>") -> tuple[np.ndarray, np.ndarray]:
    """Images uint8 ``(N, 32, 32, 3)`` and int64 labels ``(N, 1)`` from CIFAR-100 binary records."""
    if len(data) % _RECORD:
        raise DatasetFormatError(f"{source}: {len(data)} bytes is not a whole number of {_RECORD}-byte records")
    records = np.frombuffer(data, np.uint8).reshape(-1, _RECORD)
    labels = records[:, 0 if label_mode == "coarse" else 1].astype(np.int64).reshape(-1, 1)
    images = records[:, 2:].reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1).copy()
    return images, labels


def _blobs(data_dir: "Path | None", limits) -> dict[str, bytes]:
    names = ("train.bin", "test.bin")
    if data_dir is not None:
        for folder in (data_dir, data_dir / MEMBER_DIR):
            if all((folder / n).is_file() for n in names):
                reader = BoundedReader(limits)
                return {n: reader.read_file(folder / n, f"{folder / n}") for n in names}
        if (data_dir / ARCHIVE.filename).is_file():
            archive = data_dir / ARCHIVE.filename
        else:
            raise FileNotFoundError(f"CIFAR-100: {data_dir} holds neither {ARCHIVE.filename} nor train.bin/test.bin")
    else:
        archive = fetch_all([ARCHIVE], MIRRORS, "cifar100", dataset="CIFAR-100")[0]
    out = {}
    try:
        with tarfile.open(archive, "r:gz") as tar:
            for n in names:
                member = tar.getmember(f"{MEMBER_DIR}/{n}")
                if not member.isfile() or member.size > 200 * 1024 * 1024:
                    raise DatasetFormatError(f"{archive}: {member.name} is not a plausible CIFAR-100 batch")
                out[n] = tar.extractfile(member).read()
    except (tarfile.TarError, KeyError, EOFError, OSError) as exc:
        raise DatasetFormatError(f"{archive}: not a readable CIFAR-100 binary archive ({exc})") from None
    return out


def load_data(label_mode: str = "fine", *, data_dir: "str | os.PathLike | None" = None,
              limits: "ReadLimits | dict | None" = None):
    """``(x_train, y_train), (x_test, y_test)``: uint8 images ``(50000, 32, 32, 3)`` / ``(10000, 32, 32, 3)`` and
    int64 labels ``(N, 1)`` of the 100 fine (or 20 ``"coarse"``) classes. ``data_dir``: a directory holding the
    archive or its ``train.bin`` / ``test.bin`` (no download)."""
    if label_mode not in ("fine", "coarse"):
        raise ValueError(f'`label_mode` must be one of `"fine"`, `"coarse"`. Received: label_mode={label_mode}.')
    blobs = _blobs(None if data_dir is None else Path(data_dir), limits)
    return (parse_records(blobs["train.bin"], label_mode, "train.bin"),
            parse_records(blobs["test.bin"], label_mode, "test.bin"))
