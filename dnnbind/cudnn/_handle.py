"""The cuDNN handle: one per (device, stream), owned, with a no-GPU error that says what to do."""

from __future__ import annotations

import ctypes
from typing import Any

from .. import cuda
from .._lib import OwnedPointer, device_index, no_device_message
from .._lib import cudnn as C
from .._validate import ArgumentTypeError
from ..errors import NoDeviceError

__all__ = ["Handle", "get_handle", "require_handle"]


def _raw_stream(stream: Any) -> int:
    """The raw ``cudaStream_t`` for an int, None (0: legacy default), or anything dnnbind.cuda.as_stream takes."""
    if stream is None:
        return 0
    if isinstance(stream, int) and not isinstance(stream, bool):
        return stream
    return int(cuda.as_stream(stream).handle)


def _unavailable_reason() -> str:
    """Why dnnbind.cuda sees no GPU ('' when it sees one)."""
    return "" if cuda.is_available() else cuda.unavailable_reason()


class Handle(OwnedPointer):
    """An owned ``cudnnHandle_t`` bound to one device and one stream.

    Parameters
    ----------
    device:
        Device index or :class:`dnnbind.cuda.CudaDevice`; ``None`` uses the current device.
    stream:
        A :class:`dnnbind.cuda.Stream`, a raw ``cudaStream_t`` int, or ``None`` to keep
        cuDNN's default (the legacy default stream). :func:`get_handle` binds the
        current dnnbind stream instead.

    Raises
    ------
    dnnbind.errors.NoDeviceError
        No usable GPU (no driver, no device). Never a crash.
    """

    def __init__(self, device: Any = None, stream: Any = None) -> None:
        index = device_index(device)
        self._stream_ref: Any = None
        self._stream = 0
        ptr = self._create(index)
        self._adopt(ptr, C.raw("cudnnDestroy"))
        self._device = index
        if stream is not None:
            self.set_stream(stream)

    @staticmethod
    def _create(index: int | None) -> int:
        out = ctypes.c_void_p()
        create = C.raw("cudnnCreate")
        if index is None:
            status = create(ctypes.byref(out))
        else:
            with cuda.CudaDevice(index):
                status = create(ctypes.byref(out))
        if status:
            err = C.error(status, "cudnnCreate", {"device": "current" if index is None else index})
            reason = _unavailable_reason()
            if "cudaGetDeviceCount" in err.detail or reason:
                raise NoDeviceError(
                    no_device_message("cuDNN", err.detail or err.status_name, reason)
                    + f" [cudnnCreate returned {err.status_name}]"
                ) from err
            raise err
        return int(out.value)

    @classmethod
    def from_handle(cls, ptr: int, owned: bool = False, device: int | None = None) -> "Handle":
        """Wrap an existing ``cudnnHandle_t`` (from another library). Borrowed ones are never destroyed.

        The caller vouches that ``ptr`` is a live ``cudnnHandle_t``: it is passed to cuDNN as it is
        (``cudnnGetStream`` here), and no library can tell a stale or made-up pointer from a real one.
        """
        if isinstance(ptr, bool) or not isinstance(ptr, int):
            raise ArgumentTypeError(f"Handle.from_handle needs a cudnnHandle_t as an int, got "
                                    f"{type(ptr).__name__} {ptr!r}")
        if ptr <= 0:
            raise ValueError(f"Handle.from_handle needs a non-null cudnnHandle_t int, got {ptr!r}")
        self = cls.__new__(cls)
        self._stream_ref = None
        self._adopt(ptr, C.raw("cudnnDestroy"), owned=owned)
        self._device = device_index(device)
        out = ctypes.c_void_p()
        C.cudnnGetStream(ptr, ctypes.byref(out))
        self._stream = int(out.value or 0)
        return self

    @classmethod
    def borrow(cls, ptr: int, device: int | None = None) -> "Handle":
        """A :class:`Handle` for a ``cudnnHandle_t`` created elsewhere (another library's), never
        destroyed by dnnbind: ``Handle.from_handle(ptr, owned=False)``. This is the one way to hand a
        raw handle int to the descriptors and ops, which refuse bare ints."""
        return cls.from_handle(ptr, owned=False, device=device)

    @property
    def device(self) -> int:
        """Index of the device this handle was created on."""
        if self._device is None:
            self._device = cuda.current_device_index()
        return self._device

    @property
    def stream(self) -> int:
        """The raw ``cudaStream_t`` the handle's work goes to (0: the legacy default stream)."""
        return self._stream

    @property
    def bound_stream(self) -> Any:
        """What was passed to :meth:`set_stream` (a Stream, a raw int) or None."""
        return self._stream_ref if self._stream_ref is not None else (self._stream or None)

    def set_stream(self, stream: Any) -> None:
        """Bind the handle to ``stream`` (dnnbind Stream, raw int, or None for the legacy default)."""
        raw = _raw_stream(stream)
        C.call("cudnnSetStream", self.handle, raw, context={"stream": hex(raw)})
        self._stream = raw
        # Keep the Stream object alive while work may still be queued on it through this handle.
        self._stream_ref = None if isinstance(stream, int) else stream

    def _check_destroy(self, status: int) -> None:
        C.check(status, "cudnnDestroy")

    def __repr__(self) -> str:
        if self.closed:
            return "<cudnn.Handle closed>"
        device = self._device if self._device is not None else "current"
        kind = "owned" if self.owned else "borrowed"
        return f"<cudnn.Handle {self.handle:#x} device={device} stream={self._stream:#x} {kind}>"


def require_handle(handle: Any, what: str) -> Handle:
    """``handle`` if it is a :class:`Handle`; a bare int (a raw ``cudnnHandle_t``, or any number) or
    anything else raises a TypeError before cuDNN sees it (a wrong pointer would crash the process)."""
    if isinstance(handle, Handle):
        return handle
    if isinstance(handle, int) and not isinstance(handle, bool):
        raise TypeError(f"{what}: handle must be a dnnbind.cudnn.Handle, got the bare int {handle:#x}. dnnbind "
                        "cannot check a raw pointer, and cuDNN crashes on a wrong one; to use a cudnnHandle_t made "
                        "elsewhere, borrow it explicitly: dnnbind.cudnn.Handle.borrow(raw) (never destroyed here)")
    raise TypeError(f"{what}: handle must be a dnnbind.cudnn.Handle (cudnn.Handle() or cudnn.get_handle()), got "
                    f"{type(handle).__name__}")


def _create(index: int, stream: Any) -> Handle:
    return Handle(device=index, stream=stream)


_cache = cuda.stream.PerStreamCache("cuDNN", _create)


def get_handle(stream: Any = None, device: Any = None) -> Handle:
    """A cached :class:`Handle` for (device, stream); created on first use.

    ``stream=None`` means :func:`dnnbind.cuda.current_stream`. ``device=None`` means the
    stream's device (or the current device for a raw stream int).
    """
    return _cache.get(stream, device)
