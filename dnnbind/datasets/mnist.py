"""MNIST handwritten digits, read from the original IDX files.

``load_data()`` returns ``(x_train, y_train), (x_test, y_test)`` exactly as
``keras.datasets.mnist.load_data()``: images ``uint8`` of shape ``(60000, 28, 28)``
and ``(10000, 28, 28)``, labels ``uint8`` of shape ``(N,)``.

Without arguments the four gzipped IDX files are downloaded (verified against
their published MD5s) into ``$DNNBIND_DATA/mnist`` or ``~/.cache/dnnbind/mnist``
and read from there afterwards. ``data_dir=`` reads them from a directory of your
own instead (gzipped or not). Nothing here uses pickle.

Offline, ``load_data()`` falls back to the 10,000 MNIST test digits shipped inside the package
(``dnnbind/datasets/mnist-t10k/``, the published files, CC BY-SA 3.0, see the README there):
it trains on the first 8,000 and tests on the last 2,000 (:func:`load_embedded`) and says so in
one line on stderr. ``fallback=False`` raises the download error instead.

``$DNNBIND_MNIST_MIRRORS`` (comma-separated base URLs) replaces :data:`MIRRORS`, e.g. to use a
local mirror, or an unreachable one to try the offline path.
"""

from __future__ import annotations

import io
import os
import sys
import zipfile
import zlib
from pathlib import Path

import numpy as np

from .._bounded import BoundedReader, ReadLimits
from .download import ChecksumError, DatasetFormatError, DownloadError, RemoteFile, fetch_all, file_digest

__all__ = ["load_data", "load_subset", "load_idx", "load_embedded", "FILES", "MIRRORS", "find_files",
           "EMBEDDED_DIR", "EMBEDDED_SPLIT"]

DEFAULT_MIRRORS = (
    "https://ossci-datasets.s3.amazonaws.com/mnist/",
    "https://storage.googleapis.com/cvdf-datasets/mnist/",
    "https://yann.lecun.com/exdb/mnist/",
)


def _mirrors_from_env() -> list[str]:
    value = os.environ.get("DNNBIND_MNIST_MIRRORS", "")
    return [m.strip() if m.strip().endswith("/") else m.strip() + "/" for m in value.split(",") if m.strip()]


# Base URLs, tried in order. The files and their MD5s are the ones Yann LeCun published
# (the same list torchvision verifies against).
MIRRORS: list[str] = _mirrors_from_env() or list(DEFAULT_MIRRORS)

# The published t10k-* files, shipped in the package (see the README there).
EMBEDDED_DIR = Path(__file__).resolve().parent / "mnist-t10k"
EMBEDDED_SPLIT = 8000  # the embedded fallback trains on test digits [0, 8000) and tests on [8000, 10000)
# Offline, a mirror that does not answer costs this many seconds before the fallback is used.
_FALLBACK_TIMEOUT = 15.0

FILES: dict[str, RemoteFile] = {
    "train_images": RemoteFile("train-images-idx3-ubyte.gz", md5="f68b3c2dcbeaaa9fbdd348bbdeb94873"),
    "train_labels": RemoteFile("train-labels-idx1-ubyte.gz", md5="d53e105ee54ea40749a09fcbcd1e9432"),
    "test_images": RemoteFile("t10k-images-idx3-ubyte.gz", md5="9fb629c4189551a2d022fa330f9573f3"),
    "test_labels": RemoteFile("t10k-labels-idx1-ubyte.gz", md5="ec29112dd5afa0611ce80d1b7f02629c"),
}

_PREFIX = {"train": "train", "test": "t10k"}

# IDX type byte -> big-endian NumPy dtype (http://yann.lecun.com/exdb/mnist/, "THE IDX FILE FORMAT").
_IDX_DTYPES = {
    0x08: np.dtype("u1"),
    0x09: np.dtype("i1"),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}


def load_idx(path: str | os.PathLike, *, limits: "ReadLimits | dict | None" = None) -> np.ndarray:
    """Read one IDX file (gzipped or not; detected from its first bytes, not its name), decompressed
    within the read limits (``limits``, else the ``DNNBIND_READ_*`` environment: see
    :class:`dnnbind.saving.ReadLimits`).

    Returns:
        A native-endian array with the dtype and dimensions the header declares.

    Raises:
        DatasetFormatError: bad magic number, unknown type code, or a data size that
            does not match the declared dimensions.
        ReadLimitError: the file, or its decompression, passes the read limits.
    """
    path = Path(path)
    try:
        raw = BoundedReader(limits).gunzip_file(path)
    except (zlib.error, EOFError) as exc:
        raise DatasetFormatError(f"{path}: corrupt gzip data ({exc})") from exc
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0:
        raise DatasetFormatError(
            f"{path}: not an IDX file (the magic number must start with two zero bytes, "
            f"got {raw[:4].hex() or 'an empty file'})")
    type_code, ndim = raw[2], raw[3]
    if type_code not in _IDX_DTYPES:
        raise DatasetFormatError(
            f"{path}: unknown IDX type code 0x{type_code:02x} "
            f"(expected one of {', '.join(f'0x{c:02x}' for c in _IDX_DTYPES)})")
    if ndim == 0:
        raise DatasetFormatError(f"{path}: IDX header declares 0 dimensions")
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise DatasetFormatError(f"{path}: truncated IDX header ({len(raw)} bytes, need {header})")
    dims = tuple(int(d) for d in np.frombuffer(raw, dtype=">u4", count=ndim, offset=4))
    dtype = _IDX_DTYPES[type_code]
    expected = int(np.prod(dims, dtype=np.int64)) * dtype.itemsize
    actual = len(raw) - header
    if actual != expected:
        raise DatasetFormatError(
            f"{path}: IDX header declares shape {dims} of {dtype.name} ({expected} data bytes) "
            f"but the file holds {actual} data bytes")
    data = np.frombuffer(raw, dtype=dtype, offset=header).reshape(dims)
    return data.astype(dtype.newbyteorder("="), copy=True)


def _candidates(directory: Path, gz_name: str) -> list[Path]:
    plain = gz_name[:-3]
    # Some mirrors spell the files "t10k-images.idx3-ubyte".
    dotted = plain.replace("-idx", ".idx")
    return [directory / n for n in (gz_name, plain, dotted + ".gz", dotted)]


def find_files(data_dir: str | os.PathLike, subset: str) -> tuple[Path, Path] | None:
    """The (images, labels) IDX paths of ``subset`` ("train" or "test") in ``data_dir``, or None."""
    if subset not in _PREFIX:
        raise ValueError(f"mnist subset must be 'train' or 'test', got {subset!r}")
    directory = Path(data_dir)
    found = []
    for kind in ("images", "labels"):
        spec = FILES[f"{subset}_{kind}"]
        hit = next((p for p in _candidates(directory, spec.filename) if p.is_file()), None)
        if hit is None:
            return None
        found.append(hit)
    return found[0], found[1]


def _read_pair(images_path: Path, labels_path: Path,
               limits: "ReadLimits | dict | None" = None) -> tuple[np.ndarray, np.ndarray]:
    images = load_idx(images_path, limits=limits)
    labels = load_idx(labels_path, limits=limits)
    if images.dtype != np.uint8 or images.ndim != 3 or images.shape[1:] != (28, 28):
        raise DatasetFormatError(
            f"{images_path}: expected uint8 images of shape (N, 28, 28), "
            f"got {images.dtype.name} {images.shape}")
    if labels.dtype != np.uint8 or labels.ndim != 1:
        raise DatasetFormatError(
            f"{labels_path}: expected uint8 labels of shape (N,), got {labels.dtype.name} {labels.shape}")
    if len(images) != len(labels):
        raise DatasetFormatError(
            f"{images_path} holds {len(images)} images but {labels_path} holds {len(labels)} labels")
    if labels.size and labels.max() > 9:
        raise DatasetFormatError(f"{labels_path}: label {int(labels.max())} is outside 0..9")
    return images, labels


def load_subset(subset: str, data_dir: str | os.PathLike | None = None, *,
                limits: "ReadLimits | dict | None" = None) -> tuple[np.ndarray, np.ndarray]:
    """Load only ``"train"`` or ``"test"`` as ``(images, labels)``.

    With ``data_dir`` the files are read from there (useful when, say, only the
    ``t10k-*`` test files are at hand); without it they come from the cache,
    downloading them if needed. ``limits``: as :func:`load_data`'s.
    """
    if subset not in _PREFIX:
        raise ValueError(f"mnist subset must be 'train' or 'test', got {subset!r}")
    if data_dir is not None:
        pair = find_files(data_dir, subset)
        if pair is None:
            names = " and ".join(FILES[f"{subset}_{k}"].filename for k in ("images", "labels"))
            raise FileNotFoundError(
                f"mnist: {names} (gzipped or not) not found in {Path(data_dir).resolve()}")
        return _read_pair(*pair, limits=limits)
    specs = [FILES[f"{subset}_images"], FILES[f"{subset}_labels"]]
    images_path, labels_path = fetch_all(specs, MIRRORS, "mnist", dataset="MNIST")
    return _read_pair(images_path, labels_path, limits=limits)


def _npy_array(data: bytes, what: str) -> np.ndarray:
    """One ``.npy`` member: its header's shape and dtype checked against the bytes it holds before an
    array is made (``np.load`` allocates what the header declares first); object arrays (pickle) refused."""
    f = io.BytesIO(data)
    try:
        version = np.lib.format.read_magic(f)
        read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, fortran_order, dtype = read_header(f)
    except ValueError as exc:
        raise DatasetFormatError(f"{what}: not a NumPy .npy array ({exc})") from None
    if dtype.hasobject:
        raise DatasetFormatError(f"{what} holds Python objects, which only pickle can load (allow_pickle=False); "
                                 "dnnbind never unpickles: save plain arrays")
    count = int(np.prod(shape, dtype=object))
    if count * dtype.itemsize != len(data) - f.tell():
        raise DatasetFormatError(f"{what}: its header declares shape {shape} of {dtype} ({count * dtype.itemsize:,} "
                                 f"bytes) but it holds {len(data) - f.tell():,} data bytes")
    array = np.frombuffer(data, dtype, count, offset=f.tell())
    return array.reshape(shape, order="F" if fortran_order else "C")


def _load_npz(path: Path, limits: "ReadLimits | dict | None" = None):
    # Keras's mnist.npz holds plain arrays: each member is read within the limits, its header checked
    names = ("x_train", "y_train", "x_test", "y_test")
    try:
        with BoundedReader(limits).open_zip(path) as zf:
            missing = [k for k in names if f"{k}.npy" not in zf.infos]
            if missing:
                found = sorted(n[:-4] for n in zf.infos if n.endswith(".npy"))
                raise DatasetFormatError(f"{path}: missing arrays {missing} (found {found})")
            arrays = [_npy_array(zf.read(f"{k}.npy"), f"{path}: {k}.npy") for k in names]
    except (zipfile.BadZipFile, zlib.error, EOFError) as exc:
        raise DatasetFormatError(f"{path}: not a readable .npz (zip) file ({exc})") from None
    return (arrays[0], arrays[1]), (arrays[2], arrays[3])


def load_embedded(split: int = EMBEDDED_SPLIT):
    """The MNIST test digits shipped with dnnbind, split for training: ``(x_train, y_train),
    (x_test, y_test)`` = the first ``split`` digits and the remaining ``10000 - split``.

    The two files are checked against the published MD5s first (a damaged installation raises
    :class:`~dnnbind.datasets.ChecksumError` naming the file). Images uint8 (N, 28, 28), labels
    uint8 (N,), as :func:`load_data`.
    """
    if isinstance(split, bool) or not isinstance(split, (int, np.integer)) or not 0 < split < 10000:
        raise ValueError(f"mnist.load_embedded: split must be an int in [1, 9999], got {split!r}")
    paths = []
    for key in ("test_images", "test_labels"):
        spec = FILES[key]
        path = EMBEDDED_DIR / spec.filename
        if not path.is_file():
            raise FileNotFoundError(f"mnist: the embedded {path} is missing; reinstall dnnbind "
                                    "(it is package data of dnnbind.datasets)")
        problem = file_digest(path, spec)
        if problem is not None:
            raise ChecksumError(f"mnist: the embedded {path} is damaged ({problem}); reinstall dnnbind")
        paths.append(path)
    images, labels = _read_pair(*paths)
    return (images[:split], labels[:split]), (images[split:], labels[split:])


def _fallback_notice(error: DownloadError) -> str:
    reason = error.reasons[0] if error.reasons else str(error).splitlines()[0]
    return (f"dnnbind: could not download MNIST ({reason}); using the MNIST test set shipped with dnnbind: "
            f"training on its first {EMBEDDED_SPLIT:,} digits, testing on the last {10000 - EMBEDDED_SPLIT:,}")


def load_data(path: str | os.PathLike | None = None, data_dir: str | os.PathLike | None = None, *,
              fallback: bool = True, limits: "ReadLimits | dict | None" = None):
    """Load MNIST as ``(x_train, y_train), (x_test, y_test)``, as Keras does.

    Args:
        path: optional local source: a directory holding the four IDX files, or a
            Keras-style ``mnist.npz`` (read with ``allow_pickle=False``).
        data_dir: a directory holding the four IDX files (``train-images-idx3-ubyte``,
            ``train-labels-idx1-ubyte``, ``t10k-images-idx3-ubyte``,
            ``t10k-labels-idx1-ubyte``, each optionally ``.gz``).
        fallback: when the download fails (no network), print one line to stderr and return
            :func:`load_embedded` (8,000 training and 2,000 test digits from the shipped MNIST
            test set) instead of raising :class:`~dnnbind.datasets.DownloadError`.
        limits: how much each file may make this process read (:class:`dnnbind.saving.ReadLimits`
            or a dict of its fields; default: the ``DNNBIND_READ_*`` environment, else the
            built-in limits: see :mod:`dnnbind._bounded`); over them, ``ReadLimitError``.

    Without ``path``/``data_dir``, the files are downloaded once into the cache (see module docs).

    Returns:
        ``(x_train, y_train), (x_test, y_test)``: uint8 images (N, 28, 28), uint8 labels (N,):
        60,000 / 10,000 normally, 8,000 / 2,000 after the offline fallback.
    """
    if path is not None and data_dir is not None:
        raise ValueError("mnist.load_data: pass either path= or data_dir=, not both")
    if path is not None:
        path = Path(path)
        if path.is_dir():
            data_dir = path
        elif path.suffix == ".npz" and path.is_file():
            return _load_npz(path, limits)
        else:
            raise FileNotFoundError(
                f"mnist.load_data: path={str(path)!r} is neither a directory of IDX files "
                "nor an existing .npz file")
    if data_dir is not None:
        directory = Path(data_dir)
        if find_files(directory, "train") is None and find_files(directory, "test") is not None:
            raise FileNotFoundError(
                f"mnist.load_data: {directory.resolve()} holds only the test files (t10k-*). "
                "Put train-images-idx3-ubyte.gz and train-labels-idx1-ubyte.gz there too, or "
                "use mnist.load_subset('test', data_dir=...) and split it yourself "
                "(examples/mnist.py does this automatically).")
        return load_subset("train", directory, limits=limits), load_subset("test", directory, limits=limits)
    specs = [FILES[k] for k in ("train_images", "train_labels", "test_images", "test_labels")]
    if not fallback:
        # All four at once, so that an offline error lists every file that is missing.
        paths = fetch_all(specs, MIRRORS, "mnist", dataset="MNIST")
        return _read_pair(paths[0], paths[1], limits), _read_pair(paths[2], paths[3], limits)
    try:
        paths = fetch_all(specs, MIRRORS, "mnist", dataset="MNIST", timeout=_FALLBACK_TIMEOUT, fail_fast=True)
    except DownloadError as exc:
        print(_fallback_notice(exc), file=sys.stderr)
        return load_embedded()
    return _read_pair(paths[0], paths[1], limits), _read_pair(paths[2], paths[3], limits)
