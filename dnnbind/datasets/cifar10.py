"""CIFAR-10, read from the **binary** version of the data set (never the pickle one).

``load_data()`` returns ``(x_train, y_train), (x_test, y_test)`` exactly as
``keras.datasets.cifar10.load_data()``: images ``uint8`` ``(50000, 32, 32, 3)``
and ``(10000, 32, 32, 3)`` (channels_last), labels ``uint8`` of shape ``(N, 1)``.

Each record of a ``*.bin`` file is 1 label byte followed by 3072 pixel bytes:
the 1024 red, then green, then blue values of a 32x32 image in row-major order
(CHW), which is transposed here to HWC.

Without arguments ``cifar-10-binary.tar.gz`` is downloaded once (MD5-verified)
into ``$DNNBIND_DATA/cifar10`` or ``~/.cache/dnnbind/cifar10``; the batches are
read straight from the archive, nothing is extracted to disk.
"""

from __future__ import annotations

import os
import tarfile
import zlib
from pathlib import Path

import numpy as np

from .._bounded import BoundedReader, ReadLimits
from .download import DatasetFormatError, RemoteFile, fetch_all

__all__ = ["load_data", "parse_records", "ARCHIVE", "MIRRORS", "TRAIN_FILES", "TEST_FILE", "CLASS_NAMES"]

MIRRORS: list[str] = [
    "https://www.cs.toronto.edu/~kriz/",
    "http://www.cs.toronto.edu/~kriz/",
]

# MD5 as published on https://www.cs.toronto.edu/~kriz/cifar.html
ARCHIVE = RemoteFile("cifar-10-binary.tar.gz", md5="c32a1d4ab5d03f1284b67883e8d87530")
MEMBER_DIR = "cifar-10-batches-bin"
TRAIN_FILES = tuple(f"data_batch_{i}.bin" for i in range(1, 6))
TEST_FILE = "test_batch.bin"
CLASS_NAMES = ("airplane", "automobile", "bird", "cat", "deer",
               "dog", "frog", "horse", "ship", "truck")

_RECORD = 1 + 3 * 32 * 32


def parse_records(data: bytes, source: str = "<bytes>") -> tuple[np.ndarray, np.ndarray]:
    """Parse CIFAR-10 binary records into (uint8 images (N, 32, 32, 3), uint8 labels (N, 1))."""
    if len(data) == 0 or len(data) % _RECORD:
        raise DatasetFormatError(
            f"{source}: {len(data)} bytes is not a whole number of {_RECORD}-byte CIFAR-10 records")
    records = np.frombuffer(data, dtype=np.uint8).reshape(-1, _RECORD)
    labels = records[:, :1].copy()
    if labels.max() > 9:
        raise DatasetFormatError(f"{source}: label {int(labels.max())} is outside 0..9")
    images = records[:, 1:].reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1).copy()
    return images, labels


def _read_archive(path: Path, limits: "ReadLimits | dict | None" = None) -> dict[str, bytes]:
    """The batches, read in one pass of the gzip stream (decompressed within the read limits, each
    member's declared size checked before it is read)."""
    wanted = {f"{MEMBER_DIR}/{name}": name for name in (*TRAIN_FILES, TEST_FILE)}
    found: dict[str, bytes] = {}
    reader = BoundedReader(limits)
    try:
        with open(path, "rb") as raw, reader.inflating(raw, str(path)) as stream, \
                tarfile.open(fileobj=stream, mode="r|") as tar:
            for member in tar:
                name = wanted.get(member.name)
                if name is None:
                    continue
                if not member.isfile():
                    raise DatasetFormatError(f"{path}: {member.name} is not a regular file")
                reader.check_size(member.size, f"{path}: {member.name}")
                found[name] = tar.extractfile(member).read()
    except (tarfile.TarError, OSError, EOFError, zlib.error) as exc:
        raise DatasetFormatError(f"{path}: cannot read the archive ({exc})") from exc
    missing = sorted(set(wanted.values()) - set(found))
    if missing:
        raise DatasetFormatError(f"{path}: archive lacks {', '.join(MEMBER_DIR + '/' + m for m in missing)}")
    return found


def _read_directory(directory: Path, limits: "ReadLimits | dict | None" = None) -> dict[str, bytes]:
    for base in (directory / MEMBER_DIR, directory):
        if all((base / n).is_file() for n in (*TRAIN_FILES, TEST_FILE)):
            reader = BoundedReader(limits)
            return {n: reader.read_file(base / n) for n in (*TRAIN_FILES, TEST_FILE)}
    archive = directory / ARCHIVE.filename
    if archive.is_file():
        return _read_archive(archive, limits)
    raise FileNotFoundError(
        f"cifar10: {directory.resolve()} holds neither {ARCHIVE.filename}, nor the files "
        f"{', '.join(TRAIN_FILES)}, {TEST_FILE} (directly or in {MEMBER_DIR}/). Download "
        f"{MIRRORS[0]}{ARCHIVE.filename} (the binary version, md5 {ARCHIVE.md5}).")


def load_data(data_dir: str | os.PathLike | None = None, *, limits: "ReadLimits | dict | None" = None):
    """Load CIFAR-10 as ``(x_train, y_train), (x_test, y_test)``, as Keras does.

    Args:
        data_dir: a directory holding ``cifar-10-binary.tar.gz``, or its extracted
            ``cifar-10-batches-bin/`` folder, or the six ``.bin`` files themselves.
            Without it the archive is downloaded once into the cache.
        limits: how much the files may make this process read (:class:`dnnbind.saving.ReadLimits`
            or a dict of its fields; default: the ``DNNBIND_READ_*`` environment, else the
            built-in limits: see :mod:`dnnbind._bounded`); over them, ``ReadLimitError``.

    Returns:
        uint8 images (N, 32, 32, 3) channels_last, uint8 labels (N, 1).
    """
    if data_dir is not None:
        blobs = _read_directory(Path(data_dir), limits)
        source = str(Path(data_dir))
    else:
        archive = fetch_all([ARCHIVE], MIRRORS, "cifar10", dataset="CIFAR-10")[0]
        blobs = _read_archive(archive, limits)
        source = str(archive)
    parts = [parse_records(blobs[n], f"{source}:{n}") for n in TRAIN_FILES]
    x_train = np.concatenate([p[0] for p in parts])
    y_train = np.concatenate([p[1] for p in parts])
    x_test, y_test = parse_records(blobs[TEST_FILE], f"{source}:{TEST_FILE}")
    return (x_train, y_train), (x_test, y_test)
