"""Streams and events.

The library never uses the legacy NULL stream: each device gets one
library-created non-blocking stream (:func:`default_stream`), so work can be
captured into CUDA graphs and does not serialise against other libraries.
``with stream:`` makes a stream current for the calling thread;
:func:`current_stream` is what every op uses when ``stream=None``.

Streams and events are :class:`dnnbind._lib.OwnedPointer` objects: the library's one
ownership record and policy (idempotent ``close()``, collection through a finalizer on an
inner record, nothing destroyed from interpreter exit on, destroys wait for a running
capture to end). Borrowed handles (``Stream.from_handle(h)``) are never destroyed.
"""

from __future__ import annotations

import threading
from typing import Any

from .._lib import OwnedPointer, device_index, no_device_message
from ..errors import DnnbindError, NoDeviceError
from ._util import check, rt
from .device import CudaDevice, _DeviceGuard, _index_of, current_device_index, is_available, unavailable_reason

__all__ = ["Stream", "Event", "default_stream", "current_stream", "as_stream"]


# Looked up at call time (not bound at creation), so a test can count the destroys.
def _destroy_stream(handle: int) -> tuple:
    return rt.cudaStreamDestroy(handle)


def _destroy_event(handle: int) -> tuple:
    return rt.cudaEventDestroy(handle)


class Stream(OwnedPointer):
    """A CUDA stream on one device.

    Parameters
    ----------
    device:
        Index, :class:`CudaDevice` or ``"cuda:N"``; ``None`` is the current device.
    non_blocking:
        ``True`` (default) creates it with ``cudaStreamNonBlocking``, so it never
        synchronises with the legacy NULL stream.
    """

    # Every launch and op reads _handle and _device (after a `type(s) is Stream` check), so they
    # stay plain slots; the OwnedPointer record, which they copy, is the owner of the handle.
    __slots__ = ("_handle", "_device")

    def __init__(self, device: Any = None, *, non_blocking: bool = True) -> None:
        index = _index_of(device)
        flags = rt.cudaStreamNonBlocking if non_blocking else rt.cudaStreamDefault
        with _DeviceGuard(index):
            handle = check(rt.cudaStreamCreateWithFlags(flags), "cudaStreamCreateWithFlags", device=index)
        self._handle = int(handle)
        self._device = index
        self._adopt(self._handle, _destroy_stream)

    @classmethod
    def from_handle(cls, handle: int, *, owned: bool = False, device: Any = None) -> "Stream":
        """Wrap a raw ``cudaStream_t`` (an int). A borrowed handle (``owned=False``) is never destroyed.

        ``device`` defaults to the stream's own device (``cudaStreamGetDevice`` where the
        runtime has it, else the current device).
        """
        self = object.__new__(cls)
        self._handle = int(handle)
        if device is None:
            index = None
            getter = getattr(rt, "cudaStreamGetDevice", None)
            if getter is not None and self._handle not in (0, 1, 2):
                try:
                    index = int(check(getter(self._handle), "cudaStreamGetDevice"))
                except Exception:
                    index = None
            self._device = current_device_index() if index is None else index
        else:
            self._device = _index_of(device)
        self._adopt(self._handle, _destroy_stream, owned=bool(owned))
        return self

    @property
    def handle(self) -> int:
        """The raw ``cudaStream_t`` as an int. Raises ``ValueError`` once closed."""
        record = self._record
        if record is not None and record.ptr:
            return self._handle
        raise ValueError(f"Stream 0x{self._handle:x} is closed")

    @property
    def device(self) -> CudaDevice:
        return CudaDevice(self._device)

    @property
    def device_index(self) -> int:
        return self._device

    def synchronize(self) -> None:
        """Block the host until all work queued on this stream has finished."""
        check(rt.cudaStreamSynchronize(self._handle), "cudaStreamSynchronize")

    def query(self) -> bool:
        """True when all queued work has finished (never blocks)."""
        err = rt.cudaStreamQuery(self._handle)[0]
        if err == rt.cudaError_t.cudaErrorNotReady:
            return False
        check((err,), "cudaStreamQuery")
        return True

    def wait_event(self, event: "Event") -> None:
        """Make future work on this stream wait for ``event`` (no host blocking)."""
        check(rt.cudaStreamWaitEvent(self._handle, event.handle, 0), "cudaStreamWaitEvent")

    def wait_stream(self, other: "Stream") -> None:
        """Make future work on this stream wait for all work queued on ``other`` so far."""
        if other.handle == self._handle:
            return
        event = Event(timing=False, device=other._device)
        event.record(other)
        self.wait_event(event)

    def record(self, event: "Event | None" = None) -> "Event":
        """Record ``event`` (a new timing event when ``None``) on this stream and return it."""
        if event is None:
            event = Event(device=self._device)
        event.record(self)
        return event

    def is_capturing(self) -> bool:
        """True while this stream is being captured into a CUDA graph."""
        status = check(rt.cudaStreamIsCapturing(self._handle), "cudaStreamIsCapturing")
        return status != rt.cudaStreamCaptureStatus.cudaStreamCaptureStatusNone

    def close(self) -> None:
        """Destroy the stream (idempotent; a borrowed stream is only forgotten).

        Work already queued still completes (``cudaStreamDestroy`` semantics). ``handle`` raises
        afterwards; a failed destroy raises :class:`~dnnbind.errors.CudaError`.
        """
        super().close()

    def _check_destroy(self, result: tuple) -> None:
        check(result, "cudaStreamDestroy")

    def __enter__(self) -> "Stream":
        """Make this stream current for the calling thread (it is not closed on exit)."""
        _stack().append(self)
        return self

    def __exit__(self, *exc: Any) -> None:
        stack = _stack()
        if stack and stack[-1] is self:
            stack.pop()

    def __cuda_stream__(self) -> tuple[int, int]:
        """The CUDA stream protocol (version 0, handle), as cuda.core and others read it."""
        return (0, self._handle)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Stream) and other._handle == self._handle

    def __hash__(self) -> int:
        return hash(self._handle)

    def __repr__(self) -> str:
        kind = "owned" if self.owned else "borrowed"
        state = ", closed" if self.closed else ""
        return f"Stream(0x{self._handle:x}, device=cuda:{self._device}, {kind}{state})"


class Event(OwnedPointer):
    """A CUDA event.

    ``timing=True`` (default) allows :meth:`elapsed_time`; ``timing=False`` creates a
    lighter event (``cudaEventDisableTiming``) for pure ordering.
    """

    __slots__ = ("_device",)

    def __init__(self, *, timing: bool = True, device: Any = None) -> None:
        index = _index_of(device)
        flags = rt.cudaEventDefault if timing else rt.cudaEventDisableTiming
        with _DeviceGuard(index):
            handle = check(rt.cudaEventCreateWithFlags(flags), "cudaEventCreateWithFlags", device=index)
        self._device = index
        self._adopt(int(handle), _destroy_event)

    def record(self, stream: "Stream | None" = None) -> "Event":
        """Record on ``stream`` (the current stream when ``None``); returns self."""
        s = as_stream(stream)
        check(rt.cudaEventRecord(self.handle, s.handle), "cudaEventRecord")
        return self

    def synchronize(self) -> None:
        """Block the host until the recorded work has finished."""
        check(rt.cudaEventSynchronize(self.handle), "cudaEventSynchronize")

    def query(self) -> bool:
        """True when the recorded work has finished (never blocks)."""
        err = rt.cudaEventQuery(self.handle)[0]
        if err == rt.cudaError_t.cudaErrorNotReady:
            return False
        check((err,), "cudaEventQuery")
        return True

    def elapsed_time(self, end: "Event") -> float:
        """Milliseconds between this event and ``end`` (both recorded, ``end`` completed)."""
        return float(check(rt.cudaEventElapsedTime(self.handle, end.handle), "cudaEventElapsedTime"))

    def _check_destroy(self, result: tuple) -> None:
        check(result, "cudaEventDestroy")

    def __repr__(self) -> str:
        if self.closed:
            return f"Event(closed, device=cuda:{self._device})"
        return f"Event(0x{self.handle:x}, device=cuda:{self._device})"


_local = threading.local()
_defaults: dict[int, Stream] = {}
_defaults_lock = threading.Lock()


def _stack() -> list:
    stack = getattr(_local, "stack", None)
    if stack is None:
        stack = _local.stack = []
    return stack


def default_stream(device: Any = None) -> Stream:
    """The library's stream for ``device``: one non-blocking stream per device, created once."""
    index = current_device_index() if device is None else _index_of(device)
    stream = _defaults.get(index)
    if stream is None:
        with _defaults_lock:
            stream = _defaults.get(index)
            if stream is None:
                stream = _defaults[index] = Stream(index)
    return stream


def current_stream(device: Any = None) -> Stream:
    """The innermost ``with stream:`` of this thread (on ``device`` if given), else :func:`default_stream`."""
    stack = getattr(_local, "stack", None)
    if stack:
        if device is None:
            return stack[-1]
        index = _index_of(device)
        for stream in reversed(stack):
            if stream._device == index:
                return stream
        return default_stream(index)
    return default_stream(device)


def as_stream(stream: Any = None) -> Stream:
    """Normalise what callers pass as ``stream=``: None, a :class:`Stream`, a raw handle,
    or any object with ``__cuda_stream__`` (cuda.core, recent CuPy) or ``.cuda_stream`` (torch)."""
    if type(stream) is Stream:  # hot path first
        return stream
    if stream is None:
        stack = getattr(_local, "stack", None)
        if stack:
            return stack[-1]
        stream = _defaults.get(current_device_index())
        return stream if stream is not None else default_stream()
    if isinstance(stream, Stream):
        return stream
    if isinstance(stream, bool):
        raise TypeError(f"stream must be a dnnbind.cuda.Stream, a raw handle or None, got {stream!r}")
    if isinstance(stream, int):
        return Stream.from_handle(stream)
    proto = getattr(stream, "__cuda_stream__", None)
    if proto is not None:
        return Stream.from_handle(int(proto()[1]))
    raw = getattr(stream, "cuda_stream", None)  # torch.cuda.Stream
    if raw is None:
        raw = getattr(stream, "ptr", None)  # cupy.cuda.Stream
    if isinstance(raw, int):
        return Stream.from_handle(raw)
    raise TypeError(f"stream must be a dnnbind.cuda.Stream, a raw handle or None, got {type(stream).__name__}")


class PerStreamCache:
    """A bounded LRU of library handles (cuDNN's, cuBLAS's) keyed by (device, stream).

    ``factory(index, stream)`` creates a handle. Creating one allocates device memory, which a
    stream under graph capture forbids, so asking for a missing handle on a capturing stream is
    a clear error that asks for a warm-up step instead of an allocation failure deep in the
    library.

    The lookup key is (device, raw stream handle), because a live CUDA stream's handle names it
    uniquely and any wrapper of it (a :class:`Stream`, a borrowed torch/CuPy stream) must find the
    same handle. Each entry also keeps the :class:`Stream` it was made for, and an entry whose
    stream was closed is never returned: CUDA reuses a destroyed stream's handle for new
    streams, which must get a handle of their own (bound to them), not the dead stream's.
    """

    def __init__(self, library: str, factory: Any, size: int = 32) -> None:
        self._library = library
        self._factory = factory
        self._size = size  # handles cost device memory; evicted ones die with their last user
        self._lock = threading.Lock()
        self._cache: "dict[tuple[int, int], tuple[Stream, Any]]" = {}

    def get(self, stream: Any = None, device: Any = None) -> Any:
        if device is None and self._cache:
            # Hot path (every cuDNN/cuBLAS call): the handle for this stream exists and is already
            # the most recently used entry, so the LRU order needs no update and no lock.
            s = stream if type(stream) is Stream else as_stream(stream)
            key = (s._device, s._handle)
            cache = self._cache
            entry = cache.get(key)
            if entry is not None and (entry[0] is s or not entry[0].closed) and not entry[1].closed:
                try:
                    if next(reversed(cache)) == key:
                        return entry[1]
                except (StopIteration, RuntimeError):  # emptied or resized by another thread
                    pass
        return self._get(stream, device)

    def _get(self, stream: Any, device: Any) -> Any:
        if not is_available():
            raise NoDeviceError(no_device_message(self._library, "no usable GPU", unavailable_reason()))
        stream = as_stream(stream)  # None: the current stream; also raw ints, torch/CuPy streams
        index = device_index(device)
        if index is None:
            index = stream.device_index
        key = (index, stream.handle)
        with self._lock:
            entry = self._cache.pop(key, None)
            handle = None
            if entry is not None and not entry[0].closed and not entry[1].closed:
                handle = entry[1]
            else:
                if stream.is_capturing():
                    raise DnnbindError(
                        f"cannot create a {self._library} handle for stream {stream.handle:#x} while it is "
                        "being captured into a CUDA graph (creating one allocates device memory). Run the "
                        "same work once on this stream before capturing it (a warm-up step).")
                handle = self._factory(index, stream)
                entry = (stream, handle)
            self._cache[key] = entry  # re-inserted last: dicts keep insertion order, so this is LRU
            while len(self._cache) > self._size:
                self._cache.pop(next(iter(self._cache)))
        return handle

    def clear(self) -> None:
        with self._lock:
            self._cache.clear()
