"""The grow-only cuDNN workspace: one scratch buffer per stream, for every op that asks cuDNN for one.

A buffer belongs to one :class:`dnnbind.cuda.Stream` object. Streams hash by their raw handle,
and a raw handle is reused once its stream is destroyed, so a hit also checks that the entry
was made for this very object: a new stream that inherits a closed one's handle gets a buffer of
its own, never the old stream's (which was allocated, and is freed, stream-ordered on the old
one). Streams wrapped from a borrowed raw handle (``Stream.from_handle``, what ``as_stream`` makes
of an int or a torch stream, one wrapper per call) share the buffer of that handle: dnnbind
cannot see when such a stream ends, its owner can (:func:`release_workspaces`). The buffer of a
closed stream is dropped by the next growth of any workspace.

The buffer holds its stream (an allocation is freed on the stream it was made on), so a stream
that ran a cuDNN op with a workspace lives until it is closed or :func:`release_workspaces` runs.
No buffer of a live stream is ever dropped behind a caller's back: another thread may be between
taking its pointer and queueing the call that uses it.
"""

from __future__ import annotations

import threading
from typing import Any

from .. import _validate
from ..cuda.memory import Allocation, alloc
from ..cuda.stream import Stream, as_stream

__all__ = ["workspace", "workspace_buffer", "release_workspaces"]

GRANULE = 1 << 20
"""Buffers grow in whole MiB, so slightly larger requests do not reallocate."""


class _Scratch:
    __slots__ = ("stream", "allocation", "ptr", "nbytes")

    def __init__(self, stream: Stream, allocation: Allocation) -> None:
        self.stream = stream
        self.allocation = allocation
        self.ptr = allocation.ptr
        self.nbytes = allocation.nbytes


_lock = threading.Lock()
_buffers: "dict[Stream, _Scratch]" = {}


def _matches(entry: _Scratch, stream: Stream) -> bool:
    return entry.stream is stream or (not entry.stream.owned and not stream.owned and not entry.stream.closed)


def workspace(stream: Any, nbytes: int) -> int:
    """Device pointer to at least ``nbytes`` of scratch for work queued on ``stream`` (0 for 0 bytes).

    ``stream``: a :class:`dnnbind.cuda.Stream` (or anything ``as_stream`` takes). Grows by allocating the larger buffer first and
    then dropping the old one (freed stream-ordered, after the work already queued on this stream
    that uses it). The pointer is valid for work queued on ``stream`` until the next larger
    request for it. Raises :class:`dnnbind.errors.DeviceOutOfMemoryError` when the pool cannot
    grow; the old buffer stays in place and usable.
    """
    if type(nbytes) is not int:
        nbytes = _validate.integer(nbytes, "nbytes", "cudnn.workspace")
    if nbytes <= 0:
        return 0
    if type(stream) is not Stream:
        stream = as_stream(stream)
    entry = _buffers.get(stream)
    if entry is not None and entry.nbytes >= nbytes and entry.stream is stream:
        return entry.ptr
    return _grow(stream, nbytes)


def _grow(stream: Stream, nbytes: int) -> int:
    with _lock:
        entry = _buffers.get(stream)
        if entry is not None and entry.nbytes >= nbytes and _matches(entry, stream):
            return entry.ptr
        size = -(-nbytes // GRANULE) * GRANULE
        allocation = alloc(size, stream, what="the cuDNN workspace")
        for key in [key for key, old in _buffers.items() if old.stream.closed]:
            del _buffers[key]
        # Pop first: an equal key (a closed stream with the same handle) would otherwise stay the
        # dict's key object.
        _buffers.pop(stream, None)
        _buffers[stream] = _Scratch(stream, allocation)
        return allocation.ptr


def workspace_buffer(stream: Any = None) -> "Allocation | None":
    """The workspace allocation now held for ``stream`` (None: the current stream), or None.

    Work captured into a CUDA graph addresses this buffer; a graph keeps a reference to it, so a
    later growth (which drops the buffer from here) never frees memory the graph replays.
    """
    s = stream if type(stream) is Stream else as_stream(stream)
    entry = _buffers.get(s)
    return entry.allocation if entry is not None and _matches(entry, s) else None


def release_workspaces() -> None:
    """Drop every workspace (freed stream-ordered once nothing else holds it): tests, a workspace
    grown during a graph capture (graph memory from then on), or to give the memory back."""
    with _lock:
        _buffers.clear()
