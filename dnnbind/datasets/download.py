"""Verified, atomic downloads into the dnnbind data cache.

Files are fetched from a list of mirrors (the first that answers with the right
bytes wins), hashed while they stream, and only moved into the cache with
``os.replace`` once their published checksum matches. A failed, interrupted or
corrupt download therefore never leaves a file under its final name; the
temporary ``.part`` file is removed on every error path.

The cache is ``$DNNBIND_DATA`` when set, else ``~/.cache/dnnbind``; each data
set has its own sub-directory (``mnist/``, ``cifar10/``).
"""

from __future__ import annotations

import hashlib
import os
import sys
import tempfile
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

from ..errors import DnnbindError

__all__ = [
    "DatasetError",
    "DownloadError",
    "ChecksumError",
    "DatasetFormatError",
    "RemoteFile",
    "cache_dir",
    "file_digest",
    "fetch",
    "fetch_all",
]

_CHUNK = 1 << 20  # bytes per read: large enough to be fast, small enough to stay responsive
DEFAULT_TIMEOUT = 60.0  # seconds without data before a mirror counts as unreachable


class DatasetError(DnnbindError):
    """Base class of the data-set errors."""


class DownloadError(DatasetError, OSError):
    """No mirror delivered a file (offline, HTTP error, interrupted transfer).

    ``reasons``: one ``"<url>: <what went wrong>"`` per attempt, in order (empty when raised
    elsewhere).
    """

    reasons: tuple = ()


class ChecksumError(DownloadError):
    """A downloaded or cached file does not match its published checksum."""


class DatasetFormatError(DatasetError, ValueError):
    """A local or downloaded file is not in the expected format."""


@dataclass(frozen=True)
class RemoteFile:
    """One file of a data set and its published checksum (hex digest).

    At least one of ``md5`` / ``sha256`` must be given; when both are, both are checked.
    """

    filename: str
    md5: str | None = None
    sha256: str | None = None

    def __post_init__(self) -> None:
        if not (self.md5 or self.sha256):
            raise ValueError(f"RemoteFile {self.filename!r} needs a published md5 or sha256")

    def checksum_text(self) -> str:
        parts = []
        if self.sha256:
            parts.append(f"sha256 {self.sha256}")
        if self.md5:
            parts.append(f"md5 {self.md5}")
        return ", ".join(parts)


def cache_dir(subdir: str | None = None, *, create: bool = True) -> Path:
    """The data cache directory: ``$DNNBIND_DATA`` or ``~/.cache/dnnbind`` (plus ``subdir``)."""
    root = os.environ.get("DNNBIND_DATA")
    base = Path(root).expanduser() if root else Path.home() / ".cache" / "dnnbind"
    path = base / subdir if subdir else base
    if create:
        path.mkdir(parents=True, exist_ok=True)
    return path


class _Hashers:
    def __init__(self, spec: RemoteFile) -> None:
        self.spec = spec
        self.md5 = hashlib.md5(usedforsecurity=False) if spec.md5 else None
        self.sha256 = hashlib.sha256() if spec.sha256 else None

    def update(self, data: bytes) -> None:
        if self.md5 is not None:
            self.md5.update(data)
        if self.sha256 is not None:
            self.sha256.update(data)

    def mismatch(self) -> str | None:
        """A description of the first mismatching digest, or None when all match."""
        for name, hasher, expected in (("sha256", self.sha256, self.spec.sha256),
                                       ("md5", self.md5, self.spec.md5)):
            if hasher is not None and hasher.hexdigest() != expected.lower():
                return f"{name} is {hasher.hexdigest()}, expected {expected.lower()}"
        return None


def file_digest(path: str | os.PathLike, spec: RemoteFile) -> str | None:
    """Check a local file against ``spec``: None when it matches, else what differs."""
    hashers = _Hashers(spec)
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            hashers.update(chunk)
    return hashers.mismatch()


def _download_one(url: str, spec: RemoteFile, dest: Path, timeout: float, quiet: bool) -> None:
    """Stream ``url`` into a temp file next to ``dest``, verify it, then rename it into place."""
    fd, tmp_name = tempfile.mkstemp(prefix=f".{spec.filename}.", suffix=".part", dir=dest.parent)
    tmp = Path(tmp_name)
    try:
        hashers = _Hashers(spec)
        received = 0
        request = urllib.request.Request(url, headers={"User-Agent": "dnnbind-datasets"})
        with os.fdopen(fd, "wb") as out, urllib.request.urlopen(request, timeout=timeout) as resp:
            length = resp.headers.get("Content-Length")
            expected = int(length) if length and length.isdigit() else None
            if not quiet:
                size = f" ({expected / 1e6:.1f} MB)" if expected else ""
                print(f"dnnbind: downloading {url}{size} -> {dest}", file=sys.stderr)
            while chunk := resp.read(_CHUNK):
                out.write(chunk)
                hashers.update(chunk)
                received += len(chunk)
        if expected is not None and received != expected:
            raise DownloadError(
                f"{url}: interrupted download, received {received} of {expected} bytes")
        problem = hashers.mismatch()
        if problem is not None:
            raise ChecksumError(
                f"{url}: checksum mismatch for {spec.filename}: {problem} "
                f"({received} bytes received); the file was discarded")
        os.replace(tmp, dest)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def fetch(spec: RemoteFile, mirrors: Sequence[str], subdir: str, *,
          timeout: float = DEFAULT_TIMEOUT, quiet: bool = False) -> Path:
    """Return the cached, verified path of ``spec``, downloading it first if needed.

    ``mirrors`` are base URLs (ending in ``/``); ``spec.filename`` is appended to each.
    A cached file whose checksum no longer matches is deleted and fetched again.

    Raises:
        ChecksumError: every mirror that answered sent bytes with the wrong checksum.
        DownloadError: no mirror could be reached or every transfer failed.
    """
    return fetch_all([spec], mirrors, subdir, timeout=timeout, quiet=quiet)[0]


def fetch_all(specs: Iterable[RemoteFile], mirrors: Sequence[str], subdir: str, *,
              dataset: str | None = None, timeout: float = DEFAULT_TIMEOUT,
              quiet: bool = False, fail_fast: bool = False) -> list[Path]:
    """:func:`fetch` for several files; on failure the error lists every missing file.

    ``fail_fast``: stop at the first file no mirror delivered instead of trying the others (a
    caller with a fallback need not wait for every mirror of every file when offline).
    """
    specs = list(specs)
    reasons: list[str] = []
    directory = cache_dir(subdir)
    paths: list[Path] = []
    failures: list[str] = []
    checksum_only = True
    for spec in specs:
        dest = directory / spec.filename
        if dest.is_file():
            problem = file_digest(dest, spec)
            if problem is None:
                paths.append(dest)
                continue
            # A file damaged after it was verified (disk, manual edit): replace it.
            print(f"dnnbind: cached {dest} is corrupt ({problem}); downloading it again",
                  file=sys.stderr)
            dest.unlink()
        errors = []
        for base in mirrors:
            url = base + spec.filename
            try:
                _download_one(url, spec, dest, timeout, quiet)
            except DownloadError as exc:  # ours: the message already names the URL
                checksum_only = checksum_only and isinstance(exc, ChecksumError)
                errors.append(str(exc))
                continue
            except (urllib.error.URLError, OSError, ValueError) as exc:
                checksum_only = False
                reason = getattr(exc, "reason", None) or exc
                errors.append(f"{url}: {reason}")
                continue
            except Exception as exc:  # http.client.HTTPException (IncompleteRead, BadStatusLine)
                checksum_only = False
                errors.append(f"{url}: interrupted download ({type(exc).__name__}: {exc})")
                continue
            break
        else:
            failures.append(spec.filename)
            failures.extend("    " + e for e in errors)
            reasons.extend(errors)
            if fail_fast:
                break
            continue
        paths.append(dest)
    if failures:
        name = dataset or subdir
        wanted = "\n".join(
            f"  {spec.filename}  ({spec.checksum_text()})\n"
            + "\n".join(f"      {base}{spec.filename}" for base in mirrors)
            for spec in specs if not (directory / spec.filename).is_file())
        message = (
            f"could not download the {name} data set.\n"
            + "\n".join(failures)
            + f"\nTo work offline, download these files on a machine with internet access and "
            f"put them, unchanged, into {directory} (set DNNBIND_DATA to move the cache), "
            f"or into any directory you then pass as data_dir=:\n{wanted}")
        error = (ChecksumError if checksum_only else DownloadError)(message)
        error.reasons = tuple(reasons)
        raise error
    return paths
