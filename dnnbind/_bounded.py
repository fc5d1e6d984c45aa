"""Bounded reads of untrusted files: the one reader every format goes through (model zips, checkpoint
directories, safetensors and HDF5 weights, the data sets' gzip, tar and npz files).

A file may claim anything, so every byte it makes the process hold is counted while it is read, and
the read stops at the first limit passed, before the bytes are kept:

* ``max_bytes``: one file or archive member, decompressed (default: the machine's physical memory);
* ``max_total_bytes``: everything one load reads, members and files together (default: the same);
* ``max_ratio``: decompressed over stored bytes of a member or stream (default 100, Keras 3's
  ``_ZIP_MEMBER_MAX_EXPANSION``; dnnbind and Keras store zip members uncompressed, ratio 1, and
  DEFLATE reaches about 1032). Up to :data:`RATIO_FLOOR` (1 MiB) a member may expand more: small
  configs compress well;
* ``max_json_bytes`` (64 MiB) and ``max_json_depth`` (128 levels of ``[``/``{``): checked on the bytes
  before ``json.loads`` recurses;
* zip archives: at most :data:`MAX_ZIP_MEMBERS` entries (read from the end record before the central
  directory is parsed), members stored or deflated only (bzip2 and LZMA decompress without an output
  bound in :mod:`zipfile`).

Every limit can be raised for a file you trust: an argument (``ReadLimits(max_ratio=1000)`` given as
``limits=`` to ``load_model``, ``Model.load_weights``, ``saving.load_weights`` or the data sets'
``load_data``) or the environment (``DNNBIND_READ_MAX_BYTES``,
``DNNBIND_READ_MAX_TOTAL_BYTES``, ``DNNBIND_READ_MAX_RATIO``, ``DNNBIND_READ_MAX_JSON_BYTES``,
``DNNBIND_READ_MAX_JSON_DEPTH``; ``inf`` lifts the ratio), in that order of precedence. Going over one
raises :class:`dnnbind.errors.ReadLimitError` naming the file, the limit and both spellings.

A shared leaf: the standard library, NumPy and :mod:`dnnbind.errors` only.
"""

from __future__ import annotations

import dataclasses
import io
import json
import math
import os
import re
import struct
import zipfile
import zlib
from typing import Any, BinaryIO, Mapping

import numpy as np

from .errors import ReadLimitError

__all__ = ["ReadLimits", "BoundedReader", "RATIO_FLOOR", "MAX_ZIP_MEMBERS", "physical_memory"]

_MiB = 1 << 20
RATIO_FLOOR = _MiB
MAX_ZIP_MEMBERS = 4096
_CHUNK = _MiB
_DEFAULTS = {"max_ratio": 100.0, "max_json_bytes": 64 * _MiB, "max_json_depth": 128}
_ENV = {"max_bytes": "DNNBIND_READ_MAX_BYTES", "max_total_bytes": "DNNBIND_READ_MAX_TOTAL_BYTES",
        "max_ratio": "DNNBIND_READ_MAX_RATIO", "max_json_bytes": "DNNBIND_READ_MAX_JSON_BYTES",
        "max_json_depth": "DNNBIND_READ_MAX_JSON_DEPTH"}


def physical_memory() -> int | None:
    """Physical memory of this machine in bytes (None where the OS does not say)."""
    try:
        return int(os.sysconf("SC_PHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return None


@dataclasses.dataclass(frozen=True)
class ReadLimits:
    """What one load of an untrusted file may make the process read (see the module docstring).

    A field left None takes its ``DNNBIND_READ_*`` environment variable, else the default:
    ``max_bytes`` and ``max_total_bytes`` the machine's physical memory, ``max_ratio`` 100,
    ``max_json_bytes`` 64 MiB, ``max_json_depth`` 128.
    """

    max_bytes: int | None = None
    max_total_bytes: int | None = None
    max_ratio: float | None = None
    max_json_bytes: int | None = None
    max_json_depth: int | None = None

    def resolved(self, env: Mapping[str, str] | None = None) -> "ReadLimits":
        """Every field set: this one's, else the environment's, else the default; each checked."""
        env = os.environ if env is None else env
        values = {}
        for field in dataclasses.fields(self):
            name, value, source = field.name, getattr(self, field.name), f"ReadLimits({field.name}=...)"
            if value is None and env.get(_ENV[name], "").strip():
                value, source = env[_ENV[name]].strip(), f"environment variable {_ENV[name]}"
            if value is None:
                value = _DEFAULTS.get(name, physical_memory() or 1 << 62)
            values[name] = _checked_limit(name, value, source)
        return ReadLimits(**values)


def _checked_limit(name: str, value: Any, source: str) -> "int | float":
    if isinstance(value, str):
        try:
            value = float(value) if name == "max_ratio" else int(value)
        except ValueError:
            pass
    if isinstance(value, bool):
        ok = False
    elif name == "max_ratio":
        ok = isinstance(value, (int, float, np.integer, np.floating)) and value >= 1  # NaN fails too
    else:
        ok = isinstance(value, (int, np.integer)) and value >= 1
    if not ok:
        kind = "a number >= 1 (inf lifts it)" if name == "max_ratio" else "an int >= 1"
        raise ValueError(f"read limits: {source} must be {kind}, got {value!r}")
    return float(value) if name == "max_ratio" else int(value)


def _raise_hint(name: str) -> str:
    return (f"if you trust the file, raise the limit: limits=dnnbind.saving.ReadLimits({name}=...) "
            f"or the environment variable {_ENV[name]}")


# A JSON string (escapes included) and anything that is not a bracket, for the depth scan
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)
_NOT_BRACKET = re.compile(rb"[^\[\]{}]+")
_OPENERS = np.zeros(256, np.int8)
_OPENERS[[ord("["), ord("{")]] = 1
_OPENERS[[ord("]"), ord("}")]] = -1


def json_depth(data: bytes, limit: int) -> int:
    """The deepest nesting of ``[``/``{`` in JSON ``data`` (strings skipped), stopping early once it
    passes ``limit``. Linear in the size, in C and NumPy: ``json.loads`` itself recurses per level."""
    brackets = np.frombuffer(_NOT_BRACKET.sub(b"", _JSON_STRING.sub(b"", data)), np.uint8)
    depth = deepest = 0
    for start in range(0, brackets.size, 8 * _MiB):
        run = np.cumsum(_OPENERS[brackets[start:start + 8 * _MiB]], dtype=np.int64) + depth
        deepest = max(deepest, int(run.max()))
        if deepest > limit:
            break
        depth = int(run[-1])
    return deepest


class BoundedReader:
    """One load's reads of untrusted files, within :class:`ReadLimits` (``limits``: a ReadLimits, a dict
    of its fields or None). ``total`` counts every byte read so far against ``max_total_bytes``."""

    def __init__(self, limits: "ReadLimits | Mapping[str, Any] | None" = None) -> None:
        if limits is None:
            limits = ReadLimits()
        elif isinstance(limits, Mapping):
            unknown = sorted(set(limits) - set(_ENV))
            if unknown:
                raise ValueError(f"read limits: unknown field(s) {unknown}; known: {', '.join(_ENV)}")
            limits = ReadLimits(**limits)
        elif not isinstance(limits, ReadLimits):
            raise TypeError(f"limits must be a dnnbind.saving.ReadLimits, a dict of its fields or None, "
                            f"got {type(limits).__name__}")
        self.limits = limits.resolved()
        self.total = 0

    # ----- the checks ---------------------------------------------------------------------------
    def check_size(self, nbytes: int, what: str) -> None:
        """``nbytes`` (declared or seen) of one file or member against ``max_bytes``, and against what is
        left of ``max_total_bytes``."""
        if nbytes > self.limits.max_bytes:
            raise ReadLimitError(f"{what} is {nbytes:,} bytes (decompressed) or more, more than the read limit "
                                 f"max_bytes={self.limits.max_bytes:,}; refusing to read it; {_raise_hint('max_bytes')}")
        if self.total + nbytes > self.limits.max_total_bytes:
            raise ReadLimitError(f"{what}: reading it brings this load to {self.total + nbytes:,} bytes or more, more "
                                 f"than the read limit max_total_bytes={self.limits.max_total_bytes:,}; refusing to "
                                 f"read it; {_raise_hint('max_total_bytes')}")

    def check_expansion(self, nbytes: int, stored: int, what: str) -> None:
        """``nbytes`` decompressed from ``stored`` bytes against ``max_ratio`` (above :data:`RATIO_FLOOR`)."""
        if nbytes > RATIO_FLOOR and nbytes > self.limits.max_ratio * stored:
            raise ReadLimitError(
                f"{what} expands {stored:,} stored bytes to {nbytes:,} or more (ratio {nbytes / max(stored, 1):,.0f}), "
                f"more than the read limit max_ratio={self.limits.max_ratio:g}: a decompression bomb, or a file "
                f"compressed far better than dnnbind and Keras write them; refusing to read it; "
                f"{_raise_hint('max_ratio')}")

    def _take(self, nbytes: int, item_bytes: int, what: str) -> None:
        """Count ``nbytes`` more read of an item now ``item_bytes`` long, the limits checked first."""
        if item_bytes > self.limits.max_bytes:
            self.check_size(item_bytes, what)
        self.check_size(nbytes, what)
        self.total += nbytes

    # ----- plain files ------------------------------------------------------------------------------
    def read_file(self, path: "str | os.PathLike", what: str | None = None) -> bytes:
        """The bytes of a file, its size checked before any is read (and at most that size read)."""
        what = what or os.fspath(path)
        with open(path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            self.check_size(size, what)
            data = fh.read(size + 1)
            self.total += len(data)
        if len(data) != size:  # grown or shrunk while read: another writer
            raise ReadLimitError(f"{what} changed size while it was read ({size:,} then {len(data):,} bytes); "
                                 "refusing it")
        return data

    # ----- JSON ---------------------------------------------------------------------------------------
    def json(self, data: bytes, what: str) -> Any:
        """Parse JSON ``data`` after checking its size and nesting; UnicodeDecodeError and
        JSONDecodeError pass through for the caller to word."""
        if len(data) > self.limits.max_json_bytes:
            raise ReadLimitError(f"{what} is {len(data):,} bytes of JSON, more than the read limit max_json_bytes="
                                 f"{self.limits.max_json_bytes:,}; refusing to parse it; {_raise_hint('max_json_bytes')}")
        depth = json_depth(data, self.limits.max_json_depth)
        if depth > self.limits.max_json_depth:
            raise ReadLimitError(f"{what} nests JSON arrays/objects {depth:,} or more levels deep, more than the read "
                                 f"limit max_json_depth={self.limits.max_json_depth}; refusing to parse it; "
                                 f"{_raise_hint('max_json_depth')}")
        try:
            return json.loads(data.decode("utf-8"))
        except RecursionError:  # a raised max_json_depth beyond Python's recursion limit
            raise ReadLimitError(f"{what}: JSON nested {depth} levels deep is deeper than Python's parser can go "
                                 "(sys.getrecursionlimit()); lower max_json_depth or raise the recursion "
                                 "limit") from None

    # ----- zip archives -------------------------------------------------------------------------------
    def open_zip(self, path: "str | os.PathLike") -> "BoundedZip":
        """A zip archive whose members :meth:`BoundedZip.read` reads within the limits. Raises
        ``zipfile.BadZipFile`` (and OSError) for what is not a readable zip, as :mod:`zipfile` does."""
        return BoundedZip(self, os.fspath(path))

    # ----- compressed streams -------------------------------------------------------------------------
    def inflating(self, raw: BinaryIO, what: str) -> io.BufferedReader:
        """A readable stream of the gzip (or zlib) data in ``raw``, decompressed chunk by chunk with the
        ratio, size and total checked after every chunk (gzip's declared size is only a trailer)."""
        return io.BufferedReader(_Inflating(self, raw, what), buffer_size=_CHUNK)

    def gunzip_file(self, path: "str | os.PathLike", what: str | None = None) -> bytes:
        """A file's bytes, decompressed when it starts with gzip's magic (whatever its name)."""
        what = what or os.fspath(path)
        with open(path, "rb") as fh:
            head = fh.read(2)
            fh.seek(0)
            if head != b"\x1f\x8b":
                return self.read_file(path, what)
            chunks = []
            with self.inflating(fh, what) as stream:
                while chunk := stream.read(_CHUNK):
                    chunks.append(chunk)
        return b"".join(chunks)


class _Inflating(io.RawIOBase):
    """zlib's streaming decompression (gzip or zlib headers, several gzip members) within a reader."""

    def __init__(self, reader: BoundedReader, raw: BinaryIO, what: str) -> None:
        self._reader, self._raw, self._what = reader, raw, what
        self._inflate = zlib.decompressobj(wbits=47)  # 32 + 15: a gzip or zlib header
        self._pending = b""
        self._stored = self._produced = 0
        self._done = False

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while not self._done:
            if not self._pending:
                self._pending = self._raw.read(64 * 1024)
                self._stored += len(self._pending)
                if not self._pending:
                    if not self._inflate.eof:
                        raise zlib.error(f"{self._what}: the compressed stream ends early (truncated)")
                    self._done = True
                    break
            if self._inflate.eof:  # another gzip member follows the one that ended
                self._inflate = zlib.decompressobj(wbits=47)
            out = self._inflate.decompress(self._pending, len(buffer))
            self._pending = self._inflate.unconsumed_tail or self._inflate.unused_data
            if out:
                self._produced += len(out)
                self._reader.check_expansion(self._produced, self._stored, self._what)
                self._reader._take(len(out), self._produced, self._what)
                buffer[:len(out)] = out
                return len(out)
        return 0


def _zip_entry_count(fh: BinaryIO) -> int | None:
    """Entries declared by a zip's end-of-central-directory record (zip64's when it has one), None
    when none is found (zipfile then refuses the file itself)."""
    fh.seek(0, os.SEEK_END)
    size = fh.tell()
    fh.seek(max(0, size - (22 + 65535)))
    tail = fh.read()
    at = tail.rfind(b"PK\x05\x06")
    if at < 0 or len(tail) - at < 22:
        return None
    count = struct.unpack("<H", tail[at + 10:at + 12])[0]
    locator = at - 20
    if count == 0xFFFF and locator >= 0 and tail[locator:locator + 4] == b"PK\x06\x07":
        offset = struct.unpack("<Q", tail[locator + 8:locator + 16])[0]
        fh.seek(offset)
        record = fh.read(56)
        if record[:4] == b"PK\x06\x06" and len(record) == 56:
            count = struct.unpack("<Q", record[32:40])[0]
    return count


class BoundedZip:
    """A zip archive opened for bounded reads (a context manager; ``infos`` by member name)."""

    def __init__(self, reader: BoundedReader, path: str) -> None:
        self._reader, self.path = reader, path
        with open(path, "rb") as fh:
            count = _zip_entry_count(fh)
        if count is not None and count > MAX_ZIP_MEMBERS:
            raise ReadLimitError(f"{path} declares {count:,} zip entries, more than the {MAX_ZIP_MEMBERS:,} a model or "
                                 "data file may hold; refusing to parse its directory")
        self._zf = zipfile.ZipFile(path)
        self.infos = {info.filename: info for info in self._zf.infolist()}

    def __enter__(self) -> "BoundedZip":
        return self

    def __exit__(self, *exc: Any) -> None:
        self._zf.close()

    def read(self, name: str) -> bytes:
        """One member's bytes: its declared size and ratio checked first, then, while it is read, its
        actual size against the declared one (zipfile also stops there) and the ratio against the
        bytes stored; zipfile checks the CRC-32 at the end."""
        info = self.infos[name]
        what = f"{self.path}: {name}"
        if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
            raise ReadLimitError(f"{what} is compressed with method {info.compress_type} (not stored or deflated); "
                                 "dnnbind reads only those two, whose decompression it can bound")
        self._reader.check_size(info.file_size, what)
        self._reader.check_expansion(info.file_size, info.compress_size, what)
        chunks, seen = [], 0
        with self._zf.open(info) as member:
            while chunk := member.read(_CHUNK):
                seen += len(chunk)
                if seen > info.file_size:
                    raise ReadLimitError(f"{what} holds more than the {info.file_size:,} bytes its header declares; "
                                         "refusing it (corrupt or crafted)")
                self._reader.check_expansion(seen, info.compress_size, what)
                self._reader._take(len(chunk), seen, what)
                chunks.append(chunk)
        return b"".join(chunks)


def declared_nbytes(shape: Any, itemsize: int) -> int:
    """Bytes of an array of ``shape`` (as Python ints: no overflow)."""
    return math.prod(int(d) for d in shape) * int(itemsize)
