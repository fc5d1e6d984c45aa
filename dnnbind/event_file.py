"""TensorBoard event files, written without TensorFlow: TFRecord framing and a hand-encoded ``Event`` protobuf.

A file is a sequence of records, each ``uint64 length`` (little-endian), ``uint32 masked_crc32c(length bytes)``,
the payload, ``uint32 masked_crc32c(payload)``; masked as TensorFlow masks it (``((crc >> 15) | (crc << 17)) +
0xa282ead8``). The payloads are ``tensorflow.Event`` messages: the first carries ``file_version = "brain.Event:2"``,
the others a ``Summary`` of scalar values (``Summary.Value{tag, simple_value}``), which TensorBoard's scalar
dashboard reads. :func:`read_events` decodes such a file back (checking every CRC), for tests and tools.
Standard library only.
"""

from __future__ import annotations

import os
import socket
import struct
import time
from typing import Any, Iterator

__all__ = ["EventFileWriter", "crc32c", "masked_crc32c", "read_records", "read_events"]


def _crc32c_table() -> list[int]:
    table = []
    for i in range(256):
        crc = i
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
        table.append(crc)
    return table


_TABLE = _crc32c_table()


def crc32c(data: bytes) -> int:
    """CRC-32C (Castagnoli), as TFRecord uses it."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc = _TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def masked_crc32c(data: bytes) -> int:
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


# ----- protobuf wire format (the few field kinds an Event needs) ---------------------------------------
def _varint(value: int) -> bytes:
    value &= (1 << 64) - 1  # int64 fields: two's complement
    out = bytearray()
    while True:
        bits = value & 0x7F
        value >>= 7
        if value:
            out.append(bits | 0x80)
        else:
            out.append(bits)
            return bytes(out)


def _key(field: int, wire: int) -> bytes:
    return _varint((field << 3) | wire)


def _bytes_field(field: int, payload: bytes) -> bytes:
    return _key(field, 2) + _varint(len(payload)) + payload


def _scalar_value(tag: str, value: float) -> bytes:
    # Summary.Value: tag = 1 (string), simple_value = 2 (float)
    return _bytes_field(1, tag.encode("utf-8")) + _key(2, 5) + struct.pack("<f", float(value))


def encode_event(wall_time: float, step: int = 0, *, file_version: "str | None" = None,
                 scalars: "dict[str, float] | None" = None) -> bytes:
    """An ``Event``: wall_time = 1 (double), step = 2 (int64), file_version = 3 (string), summary = 5 (message)."""
    out = _key(1, 1) + struct.pack("<d", float(wall_time))
    if step:
        out += _key(2, 0) + _varint(int(step))
    if file_version is not None:
        out += _bytes_field(3, file_version.encode("utf-8"))
    if scalars:
        summary = b"".join(_bytes_field(1, _scalar_value(tag, v)) for tag, v in scalars.items())
        out += _bytes_field(5, summary)
    return out


def _record(payload: bytes) -> bytes:
    header = struct.pack("<Q", len(payload))
    return header + struct.pack("<I", masked_crc32c(header)) + payload + struct.pack("<I", masked_crc32c(payload))


class EventFileWriter:
    """Appends scalar events to ``<log_dir>/events.out.tfevents.<time>.<host>.<pid>.v2`` (made on first use),
    flushed after every write so TensorBoard sees them while training runs."""

    def __init__(self, log_dir: "str | os.PathLike") -> None:
        self.log_dir = os.fspath(log_dir)
        self.path: "str | None" = None
        self._file = None

    def _open(self) -> None:
        os.makedirs(self.log_dir, exist_ok=True)
        name = f"events.out.tfevents.{int(time.time())}.{socket.gethostname()}.{os.getpid()}.v2"
        self.path = os.path.join(self.log_dir, name)
        self._file = open(self.path, "ab")
        self._file.write(_record(encode_event(time.time(), file_version="brain.Event:2")))

    def add_scalars(self, scalars: "dict[str, float]", step: int) -> None:
        if self._file is None:
            self._open()
        self._file.write(_record(encode_event(time.time(), step, scalars=scalars)))
        self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def read_records(path: "str | os.PathLike") -> Iterator[bytes]:
    """The payloads of a TFRecord file; ValueError on a bad CRC or a truncated record."""
    with open(path, "rb") as f:
        while True:
            header = f.read(8)
            if not header:
                return
            if len(header) < 8:
                raise ValueError(f"{path}: truncated record header")
            (crc,) = struct.unpack("<I", f.read(4))
            if crc != masked_crc32c(header):
                raise ValueError(f"{path}: bad length CRC")
            (length,) = struct.unpack("<Q", header)
            payload = f.read(length)
            (crc,) = struct.unpack("<I", f.read(4))
            if len(payload) != length or crc != masked_crc32c(payload):
                raise ValueError(f"{path}: bad payload CRC or truncated payload")
            yield payload


def _fields(data: bytes) -> Iterator[tuple[int, int, Any]]:
    i = 0
    while i < len(data):
        key, i = _read_varint(data, i)
        field, wire = key >> 3, key & 7
        if wire == 0:
            value, i = _read_varint(data, i)
        elif wire == 1:
            value, i = data[i:i + 8], i + 8
        elif wire == 5:
            value, i = data[i:i + 4], i + 4
        elif wire == 2:
            n, i = _read_varint(data, i)
            value, i = data[i:i + n], i + n
        else:
            raise ValueError(f"unsupported protobuf wire type {wire}")
        yield field, wire, value


def _read_varint(data: bytes, i: int) -> tuple[int, int]:
    shift = value = 0
    while True:
        byte = data[i]
        i += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, i
        shift += 7


def read_events(path: "str | os.PathLike") -> list[dict]:
    """Every event of a file as ``{"wall_time", "step", "file_version"?, "scalars"?: {tag: value}}``."""
    events = []
    for payload in read_records(path):
        event: dict = {"step": 0}
        for field, _, value in _fields(payload):
            if field == 1:
                event["wall_time"] = struct.unpack("<d", value)[0]
            elif field == 2:
                event["step"] = value
            elif field == 3:
                event["file_version"] = value.decode("utf-8")
            elif field == 5:
                scalars = {}
                for f2, _, v in _fields(value):
                    if f2 == 1:
                        tag, simple = None, None
                        for f3, _, v3 in _fields(v):
                            if f3 == 1:
                                tag = v3.decode("utf-8")
                            elif f3 == 2:
                                simple = struct.unpack("<f", v3)[0]
                        scalars[tag] = simple
                event["scalars"] = scalars
        events.append(event)
    return events
