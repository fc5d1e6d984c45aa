"""``keras.utils.get_file``: download a file once into a cache, check its hash, optionally extract it.

As Keras 3: the cache is ``cache_dir`` (default ``$KERAS_HOME``, else ``~/.keras``; ``/tmp/.keras`` when that is
not writable) joined with ``cache_subdir``; a cached file whose hash does not match is downloaded again; an
archive is extracted into ``<name>_extracted`` (or ``<name>``) and that directory is returned. Unlike Keras,
the download streams into a temporary ``.part`` file that is hashed as it arrives and renamed only once
complete and verified (a failed or corrupt download never sits under the final name), extraction refuses
members that would land outside the target directory, and a failed download raises
:class:`dnnbind.datasets.DownloadError` naming the URL and the path to put a manually downloaded copy at.
Standard library only.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import sys
import tarfile
import tempfile
import urllib.error
import urllib.parse
import urllib.request
import zipfile
from pathlib import Path
from typing import Any

from .datasets.download import ChecksumError, DownloadError

__all__ = ["get_file", "validate_file", "hash_file", "extract_archive"]

_CHUNK = 1 << 20


def _keras_home() -> str:
    return os.environ.get("KERAS_HOME") or os.path.join(os.path.expanduser("~"), ".keras")


def _resolve_hasher(algorithm: str, file_hash: "str | None" = None) -> str:
    if algorithm == "sha256":
        return "sha256"
    if algorithm == "auto" and file_hash is not None and len(file_hash) == 64:
        return "sha256"
    if algorithm in ("auto", "md5"):
        return "md5"
    raise ValueError(f"get_file: hash_algorithm must be 'md5', 'sha256' or 'auto', got {algorithm!r}")


def hash_file(fpath: "str | os.PathLike", algorithm: str = "sha256", chunk_size: int = 65535) -> str:
    """The hex digest of a file (``"sha256"`` or ``"md5"``)."""
    hasher = hashlib.new(_resolve_hasher(algorithm))
    with open(fpath, "rb") as f:
        for chunk in iter(lambda: f.read(chunk_size), b""):
            hasher.update(chunk)
    return hasher.hexdigest()


def validate_file(fpath: "str | os.PathLike", file_hash: str, algorithm: str = "auto",
                  chunk_size: int = 65535) -> bool:
    """Whether the file's hash is ``file_hash`` (``algorithm`` "auto": sha256 for a 64-digit hash, else md5)."""
    return hash_file(fpath, _resolve_hasher(algorithm, file_hash), chunk_size) == str(file_hash)


def _inside(root: Path, name: str) -> bool:
    target = (root / name).resolve()
    return target == root or root in target.parents


def extract_archive(file_path: "str | os.PathLike", path: "str | os.PathLike" = ".",
                    archive_format: Any = "auto") -> bool:
    """Extract a tar (``.tar``, ``.tar.gz``, ``.tar.bz2``) or zip archive into ``path``; False when
    ``file_path`` is neither of ``archive_format`` ("auto": both). Members that would be written outside
    ``path`` (absolute names, ``..``, links pointing out) are refused with ValueError before anything is written."""
    if archive_format is None:
        return False
    formats = ["tar", "zip"] if archive_format == "auto" else \
        [archive_format] if isinstance(archive_format, str) else list(archive_format)
    root = Path(path).resolve()
    for kind in formats:
        if kind == "tar" and tarfile.is_tarfile(file_path):
            with tarfile.open(file_path) as archive:
                for member in archive.getmembers():
                    if not _inside(root, member.name) or (member.issym() or member.islnk()) and \
                            not _inside(root, os.path.join(os.path.dirname(member.name), member.linkname)):
                        raise ValueError(f"extract_archive: {file_path}: member {member.name!r} would be written "
                                         f"outside {root}")
                os.makedirs(root, exist_ok=True)
                if hasattr(tarfile, "data_filter"):
                    archive.extractall(root, filter="data")
                else:  # (Python < 3.11.4: the members were checked above)
                    archive.extractall(root)
            return True
        if kind == "zip" and zipfile.is_zipfile(file_path):
            with zipfile.ZipFile(file_path) as archive:
                for name in archive.namelist():
                    if not _inside(root, name):
                        raise ValueError(f"extract_archive: {file_path}: member {name!r} would be written outside "
                                         f"{root}")
                archive.extractall(root)
            return True
        if kind not in ("tar", "zip"):
            raise NotImplementedError(kind)
    return False


def _download(origin: str, target: str, file_hash: "str | None", algorithm: str, timeout: float) -> None:
    directory = os.path.dirname(target)
    hasher = hashlib.new(algorithm) if file_hash is not None else None
    fd, part = tempfile.mkstemp(prefix=os.path.basename(target) + ".", suffix=".part", dir=directory)
    try:
        with os.fdopen(fd, "wb") as out:
            with urllib.request.urlopen(origin, timeout=timeout) as response:
                for chunk in iter(lambda: response.read(_CHUNK), b""):
                    out.write(chunk)
                    if hasher is not None:
                        hasher.update(chunk)
        if hasher is not None and hasher.hexdigest() != str(file_hash):
            raise ChecksumError(f"get_file: {origin}: incomplete or corrupted file: the {algorithm} hash "
                                f"{hasher.hexdigest()} does not match the provided value {file_hash}")
        os.replace(part, target)
    except (urllib.error.URLError, OSError, ValueError) as exc:
        with contextlib.suppress(OSError):
            os.remove(part)
        if isinstance(exc, ChecksumError):
            raise
        reason = exc.reason if isinstance(exc, urllib.error.URLError) and not isinstance(exc, urllib.error.HTTPError) \
            else exc
        error = DownloadError(f"get_file: could not download {origin} ({reason}). If this machine is offline, "
                              f"download the file elsewhere and place it at {target}")
        error.reasons = (f"{origin}: {reason}",)
        raise error from None
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(part)
        raise


def get_file(fname: "str | None" = None, origin: "str | None" = None, untar: bool = False,
             md5_hash: "str | None" = None, file_hash: "str | None" = None, cache_subdir: str = "datasets",
             hash_algorithm: str = "auto", extract: bool = False, archive_format: Any = "auto",
             cache_dir: "str | os.PathLike | None" = None, force_download: bool = False, *,
             timeout: float = 60.0) -> str:
    """Keras's ``get_file``: the local path of ``origin`` (a URL; ``file://`` works) downloaded into
    ``cache_dir/cache_subdir/fname`` unless a copy with the right hash (``file_hash``: sha256 or md5,
    ``hash_algorithm`` "auto" tells them apart by length; ``md5_hash`` is the older spelling) is there already.
    With ``extract`` (or ``untar``) the archive is extracted and the extraction directory returned.
    ``timeout``: seconds without data before the download counts as failed (dnnbind's addition)."""
    if origin is None:
        raise ValueError('Please specify the "origin" argument (URL of the file to download).')
    if cache_dir is None:
        cache_dir = _keras_home()
    if md5_hash is not None and file_hash is None:
        file_hash, hash_algorithm = md5_hash, "md5"
    algorithm = _resolve_hasher(hash_algorithm, file_hash)
    datadir_base = os.path.expanduser(str(cache_dir))
    with contextlib.suppress(OSError):
        os.makedirs(datadir_base, exist_ok=True)
    if not os.access(datadir_base, os.W_OK):
        datadir_base = os.path.join("/tmp" if os.path.isdir("/tmp") else tempfile.gettempdir(), ".keras")
    datadir = os.path.join(datadir_base, cache_subdir)
    os.makedirs(datadir, exist_ok=True)
    provided = fname
    fname = os.fspath(fname) if fname is not None else None
    if not fname:
        fname = os.path.basename(urllib.parse.urlsplit(origin).path)
        if not fname:
            raise ValueError(f"Can't parse the file name from the origin provided: '{origin}'.Please specify the "
                             "`fname` argument.")
    elif os.sep in fname:
        raise ValueError("Paths are no longer accepted as the `fname` argument. To specify the file's parent "
                         f"directory, use the `cache_dir` argument. Received: fname={fname}")
    if extract or untar:
        if provided and "." in fname:
            download_target = os.path.join(datadir, fname)
            fname = fname[: fname.find(".")]
            extraction_dir = os.path.join(datadir, f"{fname}_extracted")
        else:
            extraction_dir = os.path.join(datadir, fname)
            download_target = os.path.join(datadir, f"{fname}_archive")
    else:
        download_target = os.path.join(datadir, fname)
    download = force_download or not os.path.exists(download_target)
    if not download and file_hash is not None and not validate_file(download_target, file_hash, algorithm):
        print(f"A local file was found, but it seems to be incomplete or outdated because the {algorithm} file "
              f"hash does not match the original value of {file_hash} so we will re-download the data.",
              file=sys.stderr)
        download = True
    if download:
        print(f"Downloading data from {origin}", file=sys.stderr)
        _download(origin, download_target, file_hash, algorithm, timeout)
    if extract or untar:
        if untar:
            archive_format = "tar"
        if os.path.isdir(extraction_dir) and download:
            shutil.rmtree(extraction_dir)
        if not extract_archive(download_target, extraction_dir, archive_format):
            import warnings  # (deferred: only this case warns)
            warnings.warn("Could not extract archive.", stacklevel=2)
        return extraction_dir
    return download_target
