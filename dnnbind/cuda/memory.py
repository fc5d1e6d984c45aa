"""Stream-ordered device memory and pinned host staging buffers.

Device memory comes from each device's default memory pool through
``cudaMallocAsync``/``cudaFreeAsync``. The pool's release threshold is set to
the maximum, so freed memory stays in the pool and is reused instead of being
returned to the driver at every synchronisation; :func:`empty_cache` gives it
back explicitly.

CUDA-graph safety. Every :class:`Allocation` remembers whether it was made
while its stream was capturing:

* made outside a capture, dying while that stream captures: the free is
  *deferred* until the capture ends (a ``cudaFreeAsync`` would otherwise be
  captured into the graph and free the memory at every replay);
* made inside a capture, dying while the same capture is still running: freed
  inside the capture (the graph gets a matching free node);
* made inside a capture, dying after it ended: not freed by us, the graph owns
  it (graphs are instantiated with ``cudaGraphInstantiateFlagAutoFreeOnLaunch``).

Pinned host buffers are :class:`dnnbind._lib.OwnedPointer` objects, like every other owned C
pointer; this module installs the ownership record's capture gate (:func:`capture_in_progress`,
:func:`defer_until_capture_ends`), so that no destroy runs while a capture is in progress.
:class:`Allocation` is the one owner outside that record (see its notes).
"""

from __future__ import annotations

import atexit
import ctypes
import threading
from typing import Any

import numpy as np

from .._lib import OwnedPointer, set_capture_gate
from ..errors import DeviceOutOfMemoryError
from ._util import check, rt
from .device import CudaDevice, _DeviceGuard, _index_of
from .stream import Event, Stream, as_stream, default_stream

__all__ = [
    "Allocation",
    "alloc",
    "memory_info",
    "empty_cache",
    "pool_stats",
    "PinnedBuffer",
    "pinned_buffer",
]

_UINT64_MAX = 2**64 - 1
_pools: dict[int, Any] = {}
_pools_lock = threading.Lock()


def _pool(index: int):
    """The device's default pool, with the release threshold raised once."""
    pool = _pools.get(index)
    if pool is None:
        with _pools_lock:
            pool = _pools.get(index)
            if pool is None:
                from cuda.bindings import driver as drv

                pool = check(rt.cudaDeviceGetDefaultMemPool(index), "cudaDeviceGetDefaultMemPool", device=index)
                check(rt.cudaMemPoolSetAttribute(pool, rt.cudaMemPoolAttr.cudaMemPoolAttrReleaseThreshold,
                                                 drv.cuuint64_t(_UINT64_MAX)),
                      "cudaMemPoolSetAttribute", attribute="cudaMemPoolAttrReleaseThreshold")
                _pools[index] = pool
    return pool


# The enum member itself (compared as cuda-bindings returns it, in 12.x and 13.x alike).
_CAPTURE_NONE = rt.cudaStreamCaptureStatus.cudaStreamCaptureStatusNone if rt is not None else 0


def _capture_id(stream_handle: int) -> int:
    """0 when the stream is not capturing, else a non-zero id of the running capture."""
    # The runtime is asked every time, on purpose: a capture begun by someone else (torch,
    # CuPy, raw cudaStreamBeginCapture on a borrowed stream) must be seen as well, and an
    # allocation mis-classified here would be freed into or out of the wrong graph.
    # cudaStreamIsCapturing is the cheap question (no check() call or enum comparison on the
    # common path); the id is only needed while capturing.
    result = rt.cudaStreamIsCapturing(stream_handle)
    if not result[0] and result[1] == _CAPTURE_NONE:
        return 0
    status = check(result, "cudaStreamIsCapturing")
    if status == rt.cudaStreamCaptureStatus.cudaStreamCaptureStatusNone:
        return 0
    result = rt.cudaStreamGetCaptureInfo(stream_handle)
    status = check(result[:2], "cudaStreamGetCaptureInfo")
    if status == rt.cudaStreamCaptureStatus.cudaStreamCaptureStatusNone:
        return 0
    if status == rt.cudaStreamCaptureStatus.cudaStreamCaptureStatusInvalidated:
        return -1
    # (err, status, id, ...) in cuda-bindings 12 and 13 alike; keep the id non-zero.
    return int(result[2]) if len(result) > 2 and int(result[2]) else -2


class _AllocRecord:
    """What the finalizer needs: no reference back to the Allocation (no cycles)."""

    __slots__ = ("ptr", "nbytes", "stream", "device", "capture_id")

    def __init__(self, ptr: int, nbytes: int, stream: Stream, device: int, capture_id: int) -> None:
        self.ptr = ptr
        self.nbytes = nbytes
        self.stream = stream  # a strong reference: the stream outlives its allocations
        self.device = device
        self.capture_id = capture_id


# Allocations made inside a capture begun by dnnbind.cuda.capture(), by capture id, with what they
# were for: at the end of the capture, those not freed inside it are the graph's outstanding
# allocations (Graph.outstanding_allocations). Only captures register here, so the eager hot
# path pays one dict lookup on a capture id that is 0.
_capture_allocs: "dict[int, list[tuple[_AllocRecord, Any]]]" = {}


def track_capture(capture_id: int) -> None:
    """Start recording the allocations made in capture ``capture_id``."""
    _capture_allocs[capture_id] = []


def untrack_capture(capture_id: int) -> "list[tuple[int, str]]":
    """Stop recording ``capture_id``; ``[(bytes, what), ...]`` of its allocations still not freed."""
    made = _capture_allocs.pop(capture_id, [])
    left = []
    for record, what in made:
        if record.ptr:
            if isinstance(what, tuple):
                what = what[0].format(*what[1:])
            left.append((record.nbytes, str(what) or "an allocation"))
    return left


# Re-entrant: a free may run from a garbage collection triggered while this thread holds it.
_deferred_lock = threading.RLock()
_deferred: list[_AllocRecord] = []


# Captures begun through dnnbind.cuda.capture() and not yet ended, in any thread. While one
# runs, frees that are not part of it wait: cudaFree/cudaFreeHost synchronise the device, and
# a stream-ordered free of memory the capture did not allocate would invalidate it.
_captures_in_progress = 0


def capture_began() -> None:
    global _captures_in_progress
    with _deferred_lock:
        _captures_in_progress += 1


def capture_ended() -> None:
    global _captures_in_progress
    with _deferred_lock:
        _captures_in_progress -= 1


def capture_in_progress() -> bool:
    """Whether a capture begun through dnnbind.cuda.capture() is running, in any thread."""
    return _captures_in_progress > 0


_deferred_calls: list = []


def defer_until_capture_ends(fn: Any, *args: Any) -> None:
    """Call ``fn(*args)`` once no capture is in progress (cleanup that a capture would refuse)."""
    with _deferred_lock:
        _deferred_calls.append((fn, args))


# Every OwnedPointer destroy (streams, events, graphs, modules, pinned buffers, library handles)
# waits through these while a capture runs; the calls run at the capture's end (flush below).
set_capture_gate(capture_in_progress, defer_until_capture_ends)


def _free(record: _AllocRecord) -> None:
    """Return ``record``'s memory to the pool, honouring graph capture (see module doc).

    ``Allocation.__del__`` inlines the common case (no capture anywhere, an eager allocation, its
    stream open and not capturing) and comes here for every other one."""
    if record.ptr == 0:
        return
    try:
        stream = record.stream
        if _captures_in_progress and (stream.closed or not record.capture_id):
            with _deferred_lock:
                _deferred.append(record)
            return
        if stream.closed:
            # Its stream is gone: free synchronously, ordered after everything on the device.
            with _DeviceGuard(record.device):
                rt.cudaFree(record.ptr)
            record.ptr = 0
            return
        now = _capture_id(stream.handle)
        if record.capture_id:
            if now == record.capture_id:
                rt.cudaFreeAsync(record.ptr, stream.handle)  # captured free node in the same graph
            # else: the graph owns the memory (AutoFreeOnLaunch); never free it ourselves.
            record.ptr = 0
            return
        if now:
            with _deferred_lock:
                _deferred.append(record)
            return
        rt.cudaFreeAsync(record.ptr, stream.handle)
        record.ptr = 0
    except Exception:  # interpreter exit, or the context is already torn down
        pass


def flush_deferred_frees() -> int:
    """Free allocations whose free was deferred by a capture that has ended; returns the count."""
    if _deferred_calls and not _captures_in_progress:
        with _deferred_lock:
            calls = list(_deferred_calls)
            _deferred_calls.clear()
        for fn, args in calls:
            fn(*args)
    if not _deferred or _captures_in_progress:
        return 0
    with _deferred_lock:
        pending = list(_deferred)
        _deferred.clear()
    done = 0
    for record in pending:
        before = record.ptr
        _free(record)
        done += record.ptr == 0 and before != 0
    return done


_exiting = False  # set at interpreter exit: the process teardown releases the pools


def _at_exit() -> None:
    global _exiting
    _exiting = True


atexit.register(_at_exit)


class Allocation:
    """Owned device memory from the stream-ordered pool.

    Attributes: ``ptr`` (int), ``nbytes``, ``device`` (index), ``stream`` (the
    :class:`Stream` it was allocated on and will be freed on), ``captured`` (made
    during graph capture). ``close()`` frees it (idempotent); otherwise it is freed
    when garbage collected.
    """

    # Freed by __del__ rather than the library's OwnedPointer record (weakref.finalize): a
    # finalize object per allocation costs host time on the hot path of every op (registry
    # insert and removal: measured 1.2 µs to make and drop one such owner against 0.3 µs with
    # __del__). It follows the same policy: the record holds no reference back (no cycle is
    # needed to reach it), __del__ runs for objects in collected cycles too (PEP 442),
    # ``_live`` makes close() + __del__ free at most once, _free swallows errors and defers
    # across captures (module docs), and from interpreter exit on (atexit) __del__ frees
    # nothing: module teardown may already have cleared what it would call, and the process
    # teardown releases the pool anyway.
    __slots__ = ("_record", "_live", "__weakref__")

    def __init__(self, record: _AllocRecord) -> None:
        self._record = record
        self._live = True

    def __del__(self) -> None:
        try:
            if self._live and not _exiting:
                self._live = False
                record = self._record
                # _free's common case, inlined (every array an op makes and drops comes here, and
                # _free's property and helper calls cost more host time than the free itself): no
                # capture anywhere, an eager allocation, its stream open and not capturing.
                ptr = record.ptr
                if ptr and not _captures_in_progress and not record.capture_id:
                    stream = record.stream
                    owner = stream._record
                    if owner is not None and owner.ptr:
                        handle = stream._handle
                        result = rt.cudaStreamIsCapturing(handle)
                        if not result[0] and result[1] == _CAPTURE_NONE:
                            rt.cudaFreeAsync(ptr, handle)
                            record.ptr = 0
                            return
                _free(record)
        except Exception:  # pragma: no cover - interpreter teardown
            pass

    @property
    def ptr(self) -> int:
        return self._record.ptr

    @property
    def nbytes(self) -> int:
        return self._record.nbytes

    @property
    def device(self) -> int:
        return self._record.device

    @property
    def stream(self) -> Stream:
        return self._record.stream

    @property
    def captured(self) -> bool:
        return self._record.capture_id != 0

    def close(self) -> None:
        """Free now (stream-ordered on ``stream``); idempotent."""
        if self._live:
            self._live = False
            _free(self._record)

    def __repr__(self) -> str:
        return (f"Allocation(ptr=0x{self._record.ptr:x}, nbytes={self._record.nbytes}, "
                f"device=cuda:{self._record.device})")


def alloc(nbytes: int, stream: Any = None, *, what: "str | tuple" = "") -> Allocation:
    """Allocate ``nbytes`` (may be 0: ``ptr`` is then 0) on ``stream``'s device, stream-ordered.

    ``what`` names the allocation in the out-of-memory error: a string, or a tuple
    ``(format, *args)`` formatted only when the error is raised (no formatting per call).

    Raises
    ------
    DeviceOutOfMemoryError
        The pool could not grow; the pool keeps working afterwards.
    """
    if type(nbytes) is not int:
        if isinstance(nbytes, bool) or not isinstance(nbytes, (int, np.integer)):
            raise TypeError(f"alloc: nbytes must be an int, got {type(nbytes).__name__}")
        nbytes = int(nbytes)
    if nbytes < 0:
        raise ValueError(f"alloc: nbytes must be >= 0, got {nbytes}")
    return _alloc_on(nbytes, stream if type(stream) is Stream else as_stream(stream), what)


def _alloc_on(nbytes: int, s: Stream, what: "str | tuple") -> Allocation:
    """:func:`alloc` for arguments already known good (``nbytes`` an int >= 0, ``s`` a
    :class:`Stream`): what the ops' output allocation calls, without re-checking them."""
    if _deferred:
        flush_deferred_frees()
    index = s._device
    if not nbytes:
        return Allocation(_AllocRecord(0, 0, s, index, 0))
    if index not in _pools:
        _pool(index)
    handle = s._handle
    # _capture_id's cheap question, inlined (the common answer: not capturing).
    result = rt.cudaStreamIsCapturing(handle)
    capture_id = 0 if not result[0] and result[1] == _CAPTURE_NONE else _capture_id(handle)
    err, ptr = rt.cudaMallocAsync(nbytes, handle)
    if err:
        if isinstance(what, tuple):  # ("format {} {}", args...): formatted only now
            what = what[0].format(*what[1:])
        if err == rt.cudaError_t.cudaErrorMemoryAllocation:
            rt.cudaGetLastError()  # not sticky, but clear it so later error checks start clean
            try:
                free, total = CudaDevice(index).mem_get_info()
            except Exception:
                free = total = None
            raise DeviceOutOfMemoryError(nbytes, free, total, index, what)
        check((err,), "cudaMallocAsync", nbytes=nbytes, device=index)
    record = _AllocRecord(int(ptr), nbytes, s, index, capture_id)
    if capture_id:
        made = _capture_allocs.get(capture_id)
        if made is not None:
            made.append((record, what))
    return Allocation(record)


def memory_info(device: Any = None) -> tuple[int, int]:
    """(free, total) bytes on ``device`` as the driver sees them (pool reserves count as used)."""
    return CudaDevice(device).mem_get_info()


def pool_stats(device: Any = None) -> dict:
    """The device pool's counters in bytes: ``used``/``reserved`` now and their high-water marks."""
    index = _index_of(device)
    pool = _pool(index)
    attrs = {
        "used": rt.cudaMemPoolAttr.cudaMemPoolAttrUsedMemCurrent,
        "reserved": rt.cudaMemPoolAttr.cudaMemPoolAttrReservedMemCurrent,
        "used_high": rt.cudaMemPoolAttr.cudaMemPoolAttrUsedMemHigh,
        "reserved_high": rt.cudaMemPoolAttr.cudaMemPoolAttrReservedMemHigh,
    }
    return {key: int(check(rt.cudaMemPoolGetAttribute(pool, attr), "cudaMemPoolGetAttribute"))
            for key, attr in attrs.items()}


def empty_cache(device: Any = None) -> None:
    """Give cached pool memory back to the driver (all devices with a pool when ``None``).

    Synchronises the device first (explicit call, never done implicitly), so that
    pending stream-ordered frees have landed; also drops idle pinned staging buffers.
    """
    flush_deferred_frees()
    indices = list(_pools) if device is None else [_index_of(device)]
    for index in indices:
        pool = _pool(index)
        with _DeviceGuard(index):
            check(rt.cudaDeviceSynchronize(), "cudaDeviceSynchronize", device=index)
            check(rt.cudaMemPoolTrimTo(pool, 0), "cudaMemPoolTrimTo", device=index)
    _pinned.trim()


# ---------------------------------------------------------------------------------------------
# Pinned host memory


# Looked up at call time (not bound at creation), so a test can count the frees. cudaFreeHost
# synchronises the device: during a capture the ownership record makes it wait for the end.
def _free_host(ptr: int) -> tuple:
    return rt.cudaFreeHost(ptr)


class PinnedBuffer(OwnedPointer):
    """Page-locked host memory (``cudaHostAlloc``), for asynchronous copies.

    ``ptr`` is its host address (``ValueError`` once closed); ``array(dtype, shape)`` views it
    as a NumPy array. ``close()`` frees it (idempotent), otherwise it is freed when collected.
    """

    __slots__ = ("nbytes",)

    def __init__(self, nbytes: int) -> None:
        nbytes = max(int(nbytes), 1)
        err, ptr = rt.cudaHostAlloc(nbytes, rt.cudaHostAllocPortable)
        if err:
            if err == rt.cudaError_t.cudaErrorMemoryAllocation:
                rt.cudaGetLastError()
                raise MemoryError(f"cudaHostAlloc: could not pin {nbytes:,} bytes of host memory")
            check((err,), "cudaHostAlloc", nbytes=nbytes)
        self.nbytes = nbytes
        self._adopt(int(ptr), _free_host)

    @property
    def ptr(self) -> int:
        return self.handle

    def array(self, dtype: Any, shape: tuple[int, ...]) -> np.ndarray:
        """A NumPy view of the first ``prod(shape) * itemsize`` bytes (valid while self lives)."""
        dtype = np.dtype(dtype)
        count = int(np.prod(shape, dtype=np.int64))
        if count * dtype.itemsize > self.nbytes:
            raise ValueError("PinnedBuffer.array: view larger than the buffer")
        raw = (ctypes.c_char * self.nbytes).from_address(self.ptr)
        return np.frombuffer(raw, dtype=dtype, count=count).reshape(shape)

    def _check_destroy(self, result: tuple) -> None:
        check(result, "cudaFreeHost")


class _PinnedPool:
    """Recycles staging buffers: a buffer goes back with the event of its last copy and is
    reused only once that event has completed, so an in-flight copy is never overwritten."""

    def __init__(self, cache_limit: int = 256 * 2**20) -> None:
        self._lock = threading.Lock()
        self._idle: list[tuple[PinnedBuffer, Event | None]] = []
        self._cache_limit = cache_limit

    @staticmethod
    def _size_class(nbytes: int) -> int:
        return max(1 << 16, 1 << (max(int(nbytes), 1) - 1).bit_length())

    def acquire(self, nbytes: int) -> PinnedBuffer:
        with self._lock:
            for i, (buf, event) in enumerate(self._idle):
                if buf.nbytes >= nbytes and buf.nbytes <= 4 * self._size_class(nbytes) and (
                        event is None or event.query()):
                    del self._idle[i]
                    return buf
        return PinnedBuffer(self._size_class(nbytes))

    def release(self, buf: PinnedBuffer, event: Event | None = None) -> None:
        with self._lock:
            self._idle.append((buf, event))
            total = sum(b.nbytes for b, _ in self._idle)
            if total > self._cache_limit:
                # Drop completed buffers, oldest first, until under the limit.
                keep = []
                for b, e in self._idle:
                    if total > self._cache_limit and (e is None or e.query()):
                        total -= b.nbytes
                        b.close()
                    else:
                        keep.append((b, e))
                self._idle = keep

    def trim(self) -> None:
        with self._lock:
            keep = []
            for b, e in self._idle:
                if e is None or e.query():
                    b.close()
                else:
                    keep.append((b, e))
            self._idle = keep


_pinned = _PinnedPool()


def pinned_buffer(nbytes: int) -> PinnedBuffer:
    """A staging buffer from the recycling pool (give it back with ``release_pinned``)."""
    return _pinned.acquire(nbytes)


def release_pinned(buf: PinnedBuffer, event: Event | None = None) -> None:
    """Return a staging buffer; it is reused only after ``event`` (its last copy) completes."""
    _pinned.release(buf, event)
