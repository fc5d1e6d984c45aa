"""The binding layer: find and load the CUDA libraries, declare their C functions with ctypes.

* :mod:`.loader`: ``load_library("cudnn" | "cublas" | "cublasLt" | "nvrtc")``, ``library_info``.
* :mod:`.cudnn`, :mod:`.cublas`: 1:1 declarations, IntEnum enums, one status check each.

Nothing is loaded at import time. This module also holds :class:`OwnedPointer`, the
ownership primitive that the public handle and descriptor classes build on.
"""

from __future__ import annotations

import weakref
from typing import Any, Callable

__all__ = ["OwnedPointer", "no_device_message", "device_index"]


class _Record:
    """The raw pointer, kept apart from its owner so the finalizer holds no reference to the owner."""

    __slots__ = ("ptr",)

    def __init__(self, ptr: int) -> None:
        self.ptr = ptr


def _release(record: _Record, destroy: Callable[[int], Any]) -> None:
    # Runs when the owner is garbage-collected. Errors cannot be raised from here, and a
    # failed destroy only leaks one small C object, so the status is ignored on purpose.
    ptr, record.ptr = record.ptr, 0
    if ptr:
        try:
            destroy(ptr)
        except Exception:  # pragma: no cover - nothing sensible to do during collection
            pass


class OwnedPointer:
    """Base of objects that own (or borrow) one raw C pointer: handles and descriptors.

    Subclasses call :meth:`_adopt` once the C object exists. An owned pointer is
    destroyed by :meth:`close` (idempotent, raises on a failed destroy) or, failing
    that, by a ``weakref.finalize`` on a small inner record: no reference cycle
    through the owner. The finalizer does not run at interpreter exit (the process
    teardown frees everything, and the CUDA driver may already be gone). A borrowed
    pointer is never destroyed.
    """

    _record: _Record | None = None
    _finalizer: weakref.finalize | None = None
    _destroy: Callable[[int], int] | None = None

    def _adopt(self, ptr: int, destroy: Callable[[int], int], owned: bool = True) -> None:
        self._record = _Record(int(ptr))
        self._destroy = destroy
        if owned:
            self._finalizer = weakref.finalize(self, _release, self._record, destroy)
            self._finalizer.atexit = False

    @property
    def handle(self) -> int:
        """The raw C pointer as an int (for ctypes calls). Raises ``ValueError`` once closed."""
        record = self._record
        if record is None or not record.ptr:
            raise ValueError(f"{type(self).__name__} is closed (or was never created)")
        return record.ptr

    @property
    def closed(self) -> bool:
        """True once :meth:`close` ran (or construction failed)."""
        return self._record is None or not self._record.ptr

    @property
    def owned(self) -> bool:
        """False for a borrowed pointer, which :meth:`close` never destroys."""
        return self._finalizer is not None

    def close(self) -> None:
        """Destroy the C object now (once; later calls do nothing). Borrowed pointers are only dropped."""
        record = self._record
        if record is None or not record.ptr:
            return
        finalizer = self._finalizer
        ptr, record.ptr = record.ptr, 0
        if finalizer is not None and finalizer.detach() is not None and self._destroy is not None:
            self._check_destroy(self._destroy(ptr))

    def _check_destroy(self, status: int) -> None:
        """Raise for a failed destroy; subclasses map the status to their library's error."""

    def __enter__(self):
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_CPU_ADVICE = (
    "To run on the CPU, use the NumPy backend: pass NumPy arrays to dnnbind.ops, or call "
    "dnnbind.set_default_device('cpu') (or set DNNBIND_DEVICE=cpu). "
    "`python -m dnnbind doctor` shows what is missing."
)


def no_device_message(library: str, detail: str, reason: str = "") -> str:
    """The NoDeviceError text shared by cuDNN and cuBLAS handles."""
    msg = f"no CUDA device found: {library} reported {detail!r}"
    if reason:
        msg += f" ({reason})"
    return f"{msg}. {_CPU_ADVICE}"


def device_index(device: Any) -> int | None:
    """The index of a device given as an int or a dnnbind.cuda.Device (None stays None)."""
    if device is None:
        return None
    index = getattr(device, "index", device)
    if not isinstance(index, int) or index < 0:
        raise ValueError(f"device must be a non-negative int or a dnnbind.cuda.Device, got {device!r}")
    return index
