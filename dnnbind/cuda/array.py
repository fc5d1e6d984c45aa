"""``DeviceArray``: an n-d array in GPU memory, and the explicit host <-> device transfers.

Nothing here converts to the host silently: ``np.asarray(device_array)`` raises;
``to_host()`` / ``numpy()`` are the transfers, and they synchronise only the
stream they copy on. Host-to-device copies go through pinned staging buffers and
are asynchronous (the staging buffer is recycled once an event recorded after
the copy has completed).

A ``DeviceArray`` is a view (pointer, shape, byte strides, dtype) over a base
that owns the memory: an :class:`~dnnbind.cuda.memory.Allocation`, or the
producer object of a foreign array (torch, CuPy, JAX). Views share the base, so
the memory is freed when the last view dies.
"""

from __future__ import annotations

import ctypes
import math
import operator
from typing import Any, Iterable

import numpy as np

from .._validate import BFLOAT16, normalize_dtype
from . import _dlpack
from ._util import check, rt
from .device import CudaDevice, _index_of
from .graph import upload_slot
from .memory import PinnedBuffer, _alloc_on, alloc, pinned_buffer, release_pinned
from .stream import Event, as_stream, current_stream
from .stream import Stream as _Stream

__all__ = [
    "DeviceArray",
    "SUPPORTED_DTYPES",
    "normalize_shape",
    "empty",
    "zeros",
    "to_device",
]

SUPPORTED_DTYPES: tuple[np.dtype, ...] = (
    np.dtype(np.float64), np.dtype(np.float32), np.dtype(np.float16), BFLOAT16,
    np.dtype(np.int8), np.dtype(np.uint8), np.dtype(np.int16), np.dtype(np.uint16), np.dtype(np.int32),
    np.dtype(np.uint32), np.dtype(np.int64), np.dtype(np.uint64), np.dtype(np.bool_),
)
_SUPPORTED = frozenset(SUPPORTED_DTYPES)


def normalize_shape(shape: Any, what: str = "DeviceArray") -> tuple[int, ...]:
    """``shape`` (an int or a sequence of ints >= 0) as a tuple, or ``ValueError``/``TypeError``."""
    if type(shape) is tuple:  # hot path: already a tuple of Python ints >= 0
        for d in shape:
            if type(d) is not int or d < 0:
                break
        else:
            return shape
    if isinstance(shape, (int, np.integer)) and not isinstance(shape, bool):
        shape = (shape,)
    try:
        dims = tuple(shape)
    except TypeError:
        raise TypeError(f"{what}: shape must be an int or a tuple of ints, got {shape!r}") from None
    out = []
    for d in dims:
        if isinstance(d, bool) or not isinstance(d, (int, np.integer)):
            raise TypeError(f"{what}: shape must contain ints, got {shape!r}")
        if d < 0:
            raise ValueError(f"{what}: negative dimension in shape {tuple(int(x) for x in dims)}")
        out.append(int(d))
    return tuple(out)


def _c_strides(shape: tuple[int, ...], itemsize: int) -> tuple[int, ...]:
    strides, acc = [], itemsize
    for d in reversed(shape):
        strides.append(acc)
        acc *= max(d, 1)
    return tuple(reversed(strides))


def _prod(shape: Iterable[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


class DeviceArray:
    """An n-d array in device memory.

    Build one with :func:`empty`, :func:`zeros`, :func:`to_device`, :func:`from_dlpack` or
    :func:`from_cuda_array_interface`; the constructor is internal.

    Attributes
    ----------
    shape, dtype, strides (bytes, NumPy convention), nbytes, size, ndim, itemsize,
    device (:class:`CudaDevice`), ptr (int), is_contiguous, stream (the :class:`Stream` it was
    allocated on; copies without an explicit stream run there).
    """

    __slots__ = ("_ptr", "_shape", "_ndim", "_size", "_dtype", "_strides", "_base", "_device_index", "_stream",
                 "_closed", "__weakref__")

    # NumPy must not treat a DeviceArray as a scalar or sequence in mixed expressions.
    __array_priority__ = 1000

    def __init__(self, base: Any, shape: tuple[int, ...], dtype: Any, ptr: int, *,
                 strides: tuple[int, ...] | None = None, device_index: int, stream: Any) -> None:
        self._base = base
        self._shape = normalize_shape(shape)
        self._ndim = len(self._shape)
        self._size = math.prod(self._shape)
        self._dtype = normalize_dtype(dtype, "DeviceArray", _SUPPORTED)
        self._ptr = int(ptr)
        self._strides = (_c_strides(self._shape, self._dtype.itemsize) if strides is None
                         else tuple(int(s) for s in strides))
        if len(self._strides) != len(self._shape):
            raise ValueError(f"DeviceArray: strides {self._strides} do not match shape {self._shape}")
        self._device_index = int(device_index)
        self._stream = stream
        self._closed = False

    @classmethod
    def _make(cls, base: Any, shape: tuple[int, ...], dtype: np.dtype, ptr: int, strides: tuple[int, ...],
              device_index: int, stream: Any, size: "int | None" = None,
              ndim: "int | None" = None) -> "DeviceArray":
        """Internal constructor for already-normalised fields (a tuple of ints ``shape``, a
        supported ``np.dtype``, int ``ptr``/``device_index``, byte ``strides`` of the same
        length; ``size`` and ``ndim`` of ``shape`` when the caller knows them): skips the checks
        of ``__init__``, which the hot paths (``empty``, views) do not need."""
        self = object.__new__(cls)
        self._base = base
        self._shape = shape
        self._ndim = len(shape) if ndim is None else ndim
        self._size = math.prod(shape) if size is None else size
        self._dtype = dtype
        self._ptr = ptr
        self._strides = strides
        self._device_index = device_index
        self._stream = stream
        self._closed = False
        return self

    # ----------------------------------------------------------------- attributes
    # Read-only properties whose getter is a C attrgetter, not a def: the ops read shape, dtype and
    # ptr hundreds of times per training step, and a Python getter frame costs several times more.
    shape = property(operator.attrgetter("_shape"), doc="The shape, a tuple of ints.")
    dtype = property(operator.attrgetter("_dtype"), doc="The element type, an np.dtype.")
    strides = property(operator.attrgetter("_strides"), doc="Byte strides (NumPy convention).")
    ndim = property(operator.attrgetter("_ndim"), doc="The number of dimensions, len(shape).")
    size = property(operator.attrgetter("_size"), doc="The number of elements, the product of shape.")

    @property
    def itemsize(self) -> int:
        return self._dtype.itemsize

    @property
    def nbytes(self) -> int:
        return self.size * self._dtype.itemsize

    ptr = property(operator.attrgetter("_ptr"), doc="Device address of element 0 (0 for an empty array).")

    @property
    def device(self) -> CudaDevice:
        return CudaDevice(self._device_index)

    @property
    def device_index(self) -> int:
        return self._device_index

    @property
    def stream(self):
        return self._stream

    @property
    def base(self) -> Any:
        """What keeps the memory alive (an Allocation or a foreign producer)."""
        return self._base

    @property
    def is_contiguous(self) -> bool:
        """C-contiguous (dimensions of size 1 may have any stride)."""
        if self.size == 0:
            return True
        expected = self._dtype.itemsize
        for d, s in zip(reversed(self._shape), reversed(self._strides)):
            if d != 1 and s != expected:
                return False
            expected *= d
        return True

    @property
    def closed(self) -> bool:
        return self._closed

    def _require_open(self, what: str) -> None:
        if self._closed:
            raise ValueError(f"DeviceArray.{what}: the array was closed")

    def _require_contiguous(self, what: str) -> None:
        if not self.is_contiguous:
            raise ValueError(
                f"DeviceArray.{what}: needs a C-contiguous array, got shape {self._shape} with byte "
                f"strides {self._strides}; make a contiguous copy first (dnnbind.kernels.copy)")

    # ----------------------------------------------------------------- views
    def _view(self, shape: tuple[int, ...], strides: tuple[int, ...], ptr: int,
              dtype: np.dtype | None = None) -> "DeviceArray":
        self._require_open("view")
        # Callers pass a tuple of ints, matching byte strides and a normalised dtype.
        return DeviceArray._make(self._base, tuple(shape), self._dtype if dtype is None else dtype, int(ptr),
                                 tuple(strides), self._device_index, self._stream)

    def __getitem__(self, key: Any) -> "DeviceArray":
        self._require_open("__getitem__")
        if isinstance(key, tuple) and len(key) == 1:
            key = key[0]
        if self.ndim == 0:
            raise IndexError("DeviceArray: a 0-d array cannot be indexed; use to_host()")
        n = self._shape[0]
        if isinstance(key, slice):
            start, stop, step = key.indices(n)
            if step != 1:
                raise IndexError("DeviceArray supports x[i:j] with step 1 only; use dnnbind.kernels.take "
                                 "for strided or fancy selection")
            length = max(stop - start, 0)
            ptr = self._ptr + start * self._strides[0] if length else self._ptr
            return self._view((length,) + self._shape[1:], self._strides, ptr)
        try:
            index = operator.index(key)
        except TypeError:
            raise TypeError(f"DeviceArray indices must be an int or a slice along axis 0, got "
                            f"{type(key).__name__}; use dnnbind.kernels.take for fancy indexing") from None
        if index < 0:
            index += n
        if not 0 <= index < n:
            raise IndexError(f"DeviceArray index {key} is out of bounds for axis 0 with size {n}")
        return self._view(self._shape[1:], self._strides[1:], self._ptr + index * self._strides[0])

    def reshape(self, *shape: Any) -> "DeviceArray":
        """A view with a new shape (one dimension may be -1); the array must be contiguous."""
        if len(shape) == 1 and not isinstance(shape[0], (int, np.integer)):
            shape = tuple(shape[0])
        dims = [int(operator.index(d)) for d in shape]
        if dims.count(-1) > 1:
            raise ValueError(f"DeviceArray.reshape: at most one -1 allowed, got {tuple(dims)}")
        if any(d < -1 for d in dims):
            raise ValueError(f"DeviceArray.reshape: negative dimension in {tuple(dims)}")
        if -1 in dims:
            known = _prod(d for d in dims if d != -1)
            if known == 0 or self.size % known:
                raise ValueError(f"DeviceArray.reshape: cannot reshape {self._shape} into {tuple(dims)}")
            dims[dims.index(-1)] = self.size // known
        new = tuple(dims)
        if _prod(new) != self.size:
            raise ValueError(f"DeviceArray.reshape: cannot reshape size {self.size} {self._shape} "
                             f"into {new}")
        self._require_contiguous("reshape")
        return self._view(new, _c_strides(new, self._dtype.itemsize), self._ptr)

    def view(self, dtype: Any) -> "DeviceArray":
        """Reinterpret the bytes as ``dtype`` (contiguous; the last axis scales with the itemsize)."""
        dt = normalize_dtype(dtype, "DeviceArray.view", _SUPPORTED)
        if dt.itemsize == self._dtype.itemsize:
            return self._view(self._shape, self._strides, self._ptr, dt)
        self._require_contiguous("view")
        if self.ndim == 0 or (self._shape[-1] * self._dtype.itemsize) % dt.itemsize:
            raise ValueError(f"DeviceArray.view: cannot view shape {self._shape} {self._dtype} as {dt}: "
                             "the last axis' bytes are not a multiple of the new itemsize")
        last = self._shape[-1] * self._dtype.itemsize // dt.itemsize
        shape = self._shape[:-1] + (last,)
        return self._view(shape, _c_strides(shape, dt.itemsize), self._ptr, dt)

    # ----------------------------------------------------------------- transfers
    def _copy_stream(self, stream: Any):
        return self._stream if stream is None and self._stream is not None else as_stream(stream)

    def to_host(self, stream: Any = None, out: np.ndarray | None = None) -> np.ndarray:
        """Copy to a NumPy array (through a pinned staging buffer) and synchronise ``stream`` only.

        ``stream`` defaults to the array's own stream. ``out``: a C-contiguous, writable
        NumPy array of the same shape and dtype to copy into.
        """
        self._require_open("to_host")
        self._require_contiguous("to_host")
        if out is None:
            out = np.empty(self._shape, self._dtype)
        else:
            if not isinstance(out, np.ndarray):
                raise TypeError(f"DeviceArray.to_host: out must be a NumPy array, got {type(out).__name__}")
            if out.shape != self._shape or out.dtype != self._dtype:
                raise ValueError(f"DeviceArray.to_host: out has shape {out.shape} {out.dtype}, expected "
                                 f"{self._shape} {self._dtype}")
            if not out.flags.writeable:
                raise ValueError("DeviceArray.to_host: out is read-only")
        n = self.nbytes
        if n == 0:
            return out
        s = self._copy_stream(stream)
        if s.is_capturing():
            raise RuntimeError("DeviceArray.to_host: cannot copy to the host while the stream is being "
                               "captured into a CUDA graph (it would have to synchronise)")
        buf = pinned_buffer(n)
        try:
            check(rt.cudaMemcpyAsync(buf.ptr, self._ptr, n, rt.cudaMemcpyKind.cudaMemcpyDeviceToHost,
                                     s.handle), "cudaMemcpyAsync", direction="device->host", nbytes=n)
            s.synchronize()
            np.copyto(out, buf.array(self._dtype, self._shape))
        finally:
            release_pinned(buf)
        return out

    def numpy(self, stream: Any = None) -> np.ndarray:
        """Same as :meth:`to_host`."""
        return self.to_host(stream)

    def copy_from_host(self, array: Any, stream: Any = None) -> "DeviceArray":
        """Copy a host array (any layout; same shape; dtype castable ``same_kind``) into this one.

        Asynchronous on ``stream`` (default: the array's stream): the data is first copied into
        a pinned staging buffer, so ``array`` may be modified as soon as this returns.
        """
        self._require_open("copy_from_host")
        self._require_contiguous("copy_from_host")
        src = np.asarray(array)
        if src.shape != self._shape:
            raise ValueError(f"DeviceArray.copy_from_host: host array has shape {src.shape}, expected "
                             f"{self._shape}")
        if not np.can_cast(src.dtype, self._dtype, casting="same_kind"):
            raise TypeError(f"DeviceArray.copy_from_host: cannot cast {src.dtype} to {self._dtype} "
                            "(same_kind casting); convert it first")
        n = self.nbytes
        if n == 0:
            return self
        s = self._copy_stream(stream)
        if s.is_capturing():
            raise RuntimeError("DeviceArray.copy_from_host: host-to-device copies cannot be captured into a "
                               "CUDA graph (the staging buffer would be baked into it); copy before capture")
        buf = pinned_buffer(n)
        try:
            np.copyto(buf.array(self._dtype, self._shape), src, casting="same_kind")
            check(rt.cudaMemcpyAsync(self._ptr, buf.ptr, n, rt.cudaMemcpyKind.cudaMemcpyHostToDevice,
                                     s.handle), "cudaMemcpyAsync", direction="host->device", nbytes=n)
            event = Event(timing=False, device=self._device_index).record(s)
        except BaseException:
            release_pinned(buf)
            raise
        release_pinned(buf, event)
        return self

    def copy_from(self, other: "DeviceArray", stream: Any = None) -> "DeviceArray":
        """Device-to-device copy of a same-shape, same-dtype contiguous array (any device)."""
        self._require_open("copy_from")
        if not isinstance(other, DeviceArray):
            raise TypeError(f"DeviceArray.copy_from: expected a DeviceArray, got {type(other).__name__}")
        if other.shape != self._shape or other.dtype != self._dtype:
            raise ValueError(f"DeviceArray.copy_from: source is {other.shape} {other.dtype}, expected "
                             f"{self._shape} {self._dtype}")
        self._require_contiguous("copy_from")
        other._require_contiguous("copy_from")
        s = self._copy_stream(stream)
        if other.stream is not None and other.stream != s:
            s.wait_stream(other.stream)
        if self.nbytes:
            check(rt.cudaMemcpyAsync(self._ptr, other.ptr, self.nbytes, rt.cudaMemcpyKind.cudaMemcpyDefault,
                                     s.handle), "cudaMemcpyAsync", direction="device->device")
        return self

    def to(self, device: Any, stream: Any = None) -> "DeviceArray | np.ndarray":
        """``"cpu"``: :meth:`to_host`; ``"cuda"``/``"cuda:N"``: this array (same device) or a copy."""
        text = str(device).strip().lower() if not isinstance(device, int) else f"cuda:{device}"
        if text in ("cpu", "numpy"):
            return self.to_host(stream)
        index = _index_of(device)
        if index == self._device_index:
            return self
        dst = empty(self._shape, self._dtype, stream=stream if stream is not None else current_stream(index))
        return dst.copy_from(self)

    def fill_bytes(self, value: int, stream: Any = None) -> "DeviceArray":
        """Set every byte to ``value`` (0..255) with ``cudaMemsetAsync``; 0xFF poisons floats with NaN."""
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not 0 <= value <= 255:
            raise ValueError(f"DeviceArray.fill_bytes: value must be an int in 0..255, got {value!r}")
        self._require_open("fill_bytes")
        self._require_contiguous("fill_bytes")
        if self.nbytes:
            s = self._copy_stream(stream)
            check(rt.cudaMemsetAsync(self._ptr, int(value), self.nbytes, s.handle), "cudaMemsetAsync",
                  nbytes=self.nbytes)
        return self

    def fill_zero(self, stream: Any = None) -> "DeviceArray":
        """Set to zero (all bytes 0) asynchronously."""
        return self.fill_bytes(0, stream)

    def close(self) -> None:
        """Drop this view's reference to the memory (idempotent).

        The memory returns to the pool (``cudaFreeAsync`` on its stream) when no other
        view of it is alive; a closed array cannot be used any more.
        """
        self._base = None
        self._ptr = 0
        self._closed = True

    # ----------------------------------------------------------------- interop
    @property
    def __cuda_array_interface__(self) -> dict:
        """CUDA Array Interface v3; ``stream`` is the array's stream (consumers wait on it)."""
        self._require_open("__cuda_array_interface__")
        return {
            "shape": self._shape,
            "typestr": self._dtype.str,
            "descr": [("", self._dtype.str)],
            "data": (self._ptr, False),
            "strides": None if self.is_contiguous else self._strides,
            "version": 3,
            "stream": self._stream.handle if self._stream is not None else None,
        }

    def __dlpack__(self, stream: Any = None, max_version: tuple[int, int] | None = None,
                   dl_device: tuple[int, int] | None = None, copy: bool | None = None) -> Any:
        """Export as a DLPack capsule (DLPack 1.0 semantics; the capsule keeps the exported array alive).

        ``stream``: the consumer's stream (``None``/0: the legacy default stream, -1: no ordering);
        it waits on this array's stream with an event. ``copy=True`` exports a copy.
        """
        self._require_open("__dlpack__")
        if dl_device is not None and tuple(dl_device) != (_dlpack.kDLCUDA, self._device_index):
            raise BufferError(f"__dlpack__: cannot export to device {tuple(dl_device)}; the array is on "
                              f"(kDLCUDA, {self._device_index}); copy it explicitly (to_host / to)")
        source = empty(self._shape, self._dtype, stream=self._stream).copy_from(self) if copy else self
        return _dlpack.export(source, stream, max_version)

    def __dlpack_device__(self) -> tuple[int, int]:
        """(kDLCUDA = 2, device index)."""
        return (_dlpack.kDLCUDA, self._device_index)

    # ----------------------------------------------------------------- Python protocol
    def __len__(self) -> int:
        if not self._shape:
            raise TypeError("len() of a 0-d DeviceArray")
        return self._shape[0]

    def __bool__(self) -> bool:
        raise TypeError("the truth value of a DeviceArray is not defined on the host; copy it with "
                        ".to_host() first")

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        raise TypeError(
            "refusing to convert a DeviceArray to a NumPy array implicitly (it lives on "
            f"cuda:{self._device_index}); call .to_host() or .numpy() to copy it explicitly")

    def __iter__(self):
        for i in range(len(self)):
            yield self[i]

    def __repr__(self) -> str:
        extra = "" if self.is_contiguous else f", strides={self._strides}"
        state = ", closed" if self.closed else ""
        return (f"DeviceArray(shape={self._shape}, dtype={self._dtype}{extra}, "
                f"device=cuda:{self._device_index}{state})")


# --------------------------------------------------------------------------------- factories

def _placement(stream: Any, device: Any, what: str):
    """(stream, device index) from the caller's ``stream`` / ``device`` arguments."""
    if stream is not None:
        s = stream if type(stream) is _Stream else as_stream(stream)
        if device is None:
            return s, s.device_index
        if device is not None and _index_of(device) != s.device_index:
            raise ValueError(f"{what}: stream is on cuda:{s.device_index} but device={device!r} was given")
        return s, s.device_index
    s = current_stream(device)
    return s, s.device_index


# (shape, dtype) as a caller spelled them -> (shape, dtype, byte strides, nbytes), normalised and
# checked once. Ops allocate their outputs with a handful of shapes over and over; re-validating
# and re-deriving the C-contiguous layout every time was a third of an allocation's host time.
# The shape and dtype stored in the value are what the array gets, so an entry found through a
# spelling that compares equal to the canonical one (np.int64 dims) still yields Python ints and
# an np.dtype. Only the internal _empty_on looks spellings up unnormalised; the public empty()
# normalises first, because spellings it must refuse can compare equal (True == 1, 2.0 == 2).
# Bounded: cleared when full (it holds only small tuples). A dict get/set is atomic, so threads
# need no lock (two threads may both fill an entry, with equal values). Nothing in it refers to a
# stream, a device or memory, so a hit can never hand out something that was closed.
_layouts: "dict[tuple, tuple[tuple[int, ...], np.dtype, tuple[int, ...], int, int, int]]" = {}
_LAYOUTS_MAX = 4096


def _layout(shape: Any, dtype: Any,
            what: str = "empty") -> "tuple[tuple[int, ...], np.dtype, tuple[int, ...], int, int, int]":
    """``(shape, dtype, strides, nbytes, size, ndim)`` of a new C-contiguous array; ValueError/TypeError
    naming ``what`` for a bad shape or an unsupported dtype."""
    try:
        key = (shape, dtype)
        hit = _layouts.get(key)
    except TypeError:  # an unhashable spelling (a list shape): checked, never memoised
        key = hit = None
    if hit is not None:
        return hit
    shp = normalize_shape(shape, what)
    dt = normalize_dtype(dtype, what, _SUPPORTED)
    hit = (shp, dt, _c_strides(shp, dt.itemsize), _prod(shp) * dt.itemsize, _prod(shp), len(shp))
    if key is not None:
        if len(_layouts) >= _LAYOUTS_MAX:
            _layouts.clear()
        _layouts[key] = hit
    return hit


def _empty_on(shape: "tuple[int, ...]", dtype: np.dtype, stream: _Stream) -> DeviceArray:
    """:func:`empty` for the ops' outputs: ``stream`` already a :class:`Stream`, ``shape`` a tuple
    and ``dtype`` a dtype the caller derived from arrays it holds (they are still checked the first
    time each spelling is seen, by :func:`_layout`)."""
    hit = _layouts.get((shape, dtype))
    if hit is None:
        hit = _layout(shape, dtype)
    shape, dtype, strides, nbytes, size, ndim = hit
    # ``what`` is only formatted when the allocation fails (a tuple, not an f-string per call).
    allocation = _alloc_on(nbytes, stream, ("an array of shape {} {}", shape, dtype))
    return DeviceArray._make(allocation, shape, dtype, allocation._record.ptr, strides, stream._device, stream,
                             size, ndim)


def empty(shape: Any, dtype: Any = np.float32, stream: Any = None, device: Any = None) -> DeviceArray:
    """An uninitialised array, allocated stream-ordered on ``stream`` (default: the current stream)."""
    # Normalised before the memo is asked: a spelling equal to a valid one (True == 1, 2.0 == 2)
    # must still be refused here.
    shape = normalize_shape(shape, "empty")
    dt = normalize_dtype(dtype, "empty", _SUPPORTED)
    hit = _layouts.get((shape, dt))
    shape, dt, strides, nbytes, size, ndim = hit if hit is not None else _layout(shape, dt)
    s, index = _placement(stream, device, "empty")
    allocation = _alloc_on(nbytes, s, ("an array of shape {} {}", shape, dt))
    return DeviceArray._make(allocation, shape, dt, allocation._record.ptr, strides, index, s, size, ndim)


def constant(array: Any, stream: Any = None, device: Any = None) -> DeviceArray:
    """Upload host data that will not change (pointer tables, index maps) and keep its source.

    Unlike :func:`to_device`, the pinned source buffer lives as long as the result, so this may
    run while ``stream`` is being captured into a CUDA graph: the copy becomes a graph node that
    re-reads the same pinned bytes on every replay.
    """
    src = np.asarray(array)
    dt = normalize_dtype(src.dtype, "constant", _SUPPORTED)
    s, index = _placement(stream, device, "constant")
    allocation = alloc(src.nbytes, s, what=f"a constant of shape {src.shape} {dt}")
    if s.is_capturing():  # cudaHostAlloc is refused now: take pinned bytes the graph owns
        pinned, address = None, upload_slot(s, src.nbytes)
    else:
        pinned = PinnedBuffer(src.nbytes)
        address = pinned.ptr
    if src.nbytes:
        raw = (ctypes.c_char * src.nbytes).from_address(address)
        np.copyto(np.frombuffer(raw, dtype=dt, count=src.size).reshape(src.shape), src)
        check(rt.cudaMemcpyAsync(allocation.ptr, address, src.nbytes, rt.cudaMemcpyKind.cudaMemcpyHostToDevice,
                                 s.handle), "cudaMemcpyAsync", direction="host->device", nbytes=src.nbytes)
    return DeviceArray((allocation, pinned), src.shape, dt, allocation.ptr, device_index=index, stream=s)


def zeros(shape: Any, dtype: Any = np.float32, stream: Any = None, device: Any = None) -> DeviceArray:
    """An array of zeros (``cudaMemsetAsync``)."""
    return empty(shape, dtype, stream, device).fill_zero()


def to_device(array: Any, stream: Any = None, device: Any = None, dtype: Any = None) -> DeviceArray:
    """Copy a host array to the GPU asynchronously (pinned staging) and return the new DeviceArray.

    Non-contiguous input is fine (it is gathered while filling the staging buffer).
    ``dtype`` converts on the host first (``same_kind``); by default the input's dtype is kept,
    and it must be one of ``SUPPORTED_DTYPES``. A DeviceArray input is moved with ``.to()``.
    """
    if isinstance(array, DeviceArray):
        if device is None:
            return array
        return array.to(device if not isinstance(device, int) else f"cuda:{device}", stream)
    src = np.asarray(array)
    dt = normalize_dtype(src.dtype if dtype is None else dtype, "to_device", _SUPPORTED)
    out = empty(src.shape, dt, stream, device)
    return out.copy_from_host(src, out.stream)
