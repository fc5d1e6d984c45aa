"""The binding layer: find and load the CUDA libraries, declare their C functions with ctypes.

* :mod:`.loader`: ``load_library("cudnn" | "cublas" | "cublasLt" | "nvrtc")``, ``library_info``.
* :mod:`.cudnn`, :mod:`.cublas`: 1:1 declarations, IntEnum enums, one status check each.

Nothing is loaded at import time. This module also holds :class:`OwnedPointer`, the one
ownership record of the library.

Ownership
---------
Every Python object that owns (or borrows) a raw C pointer is an :class:`OwnedPointer`, one
per pointer: cuDNN and cuBLAS handles and descriptors, CUDA streams and events, pinned host
buffers, imported DLPack tensors; an object that owns several C objects holds one
OwnedPointer for each (``cuda.Graph``: the graph and its executable; ``cuda.Kernel``: one
loaded module per device). One policy covers them all:

* ``close()`` destroys now, once: later calls do nothing, and a failed destroy raises the
  library's error. A borrowed pointer (``owned=False``) is only forgotten, never destroyed.
* An owned pointer that was not closed is destroyed when its owner is garbage-collected, by a
  ``weakref.finalize`` on a small inner record (the pointer and its destroy function) that
  holds no reference to the owner: no cycle, no resurrection. Errors are swallowed there
  (nothing can raise from a collection; a failed destroy leaks one C object).
* From interpreter exit on, nothing is destroyed: the finalizers are not run at exit
  (``atexit=False``, and ``weakref`` runs none after its exit hook), because the process
  teardown releases the CUDA context with everything in it, while a destroy called then may
  reach a runtime or a library that is already half torn down.
* A destroy requested while a graph capture begun by ``dnnbind.cuda.capture()`` is in
  progress, in any thread (by ``close()`` or by a collection), waits until that capture ends
  (``closed`` is True at once). Several destroys are refused during a capture or synchronise
  the device (``cudaGraphExecDestroy``, ``cudaStreamDestroy``, ``cuModuleUnload``,
  ``cudaFreeHost``, ``cublasDestroy``), and such a call invalidates the capture; one rule for
  every destroy is simpler to trust than a list of the safe ones.
  ``dnnbind.cuda.memory`` installs the test and the waiting list with :func:`set_capture_gate`
  (this room cannot import it); until then every destroy runs at once.

The one exception is device memory: ``cuda.Allocation`` frees through ``__del__`` with the
stream-ordered rules of :mod:`dnnbind.cuda.memory` (deferred across captures, nothing freed
from exit on), because a ``weakref.finalize`` per allocation costs about 1 µs more host time
per array made and dropped (measured: 1.2 µs with finalize against 0.3 µs with ``__del__``),
on the hot path of every op.
"""

from __future__ import annotations

import weakref
from typing import Any, Callable

__all__ = ["OwnedPointer", "set_capture_gate", "no_device_message", "device_index"]


class _Record:
    """The raw pointer and its destroy function, kept apart from the owner: the finalizer holds
    this, so it never keeps the owner alive."""

    __slots__ = ("ptr", "destroy")

    def __init__(self, ptr: int, destroy: Callable[[int], Any]) -> None:
        self.ptr = ptr
        self.destroy = destroy


# (capture_in_progress, defer(fn, *args)), installed by dnnbind.cuda.memory; None: no capture can run.
_capture_gate: "tuple[Callable[[], bool], Callable[..., None]] | None" = None


def set_capture_gate(in_progress: Callable[[], bool], defer: Callable[..., None]) -> None:
    """Make destroys wait while ``in_progress()`` is true, through ``defer(fn, *args)``, which
    must call ``fn(*args)`` once no capture is in progress (see the module's Ownership notes)."""
    global _capture_gate
    _capture_gate = (in_progress, defer)


def _destroy_quietly(destroy: Callable[[int], Any], ptr: int) -> None:
    # Runs from a collection or after a capture: nothing can raise from there, and a failed
    # destroy only leaks one C object, so the status is ignored on purpose.
    try:
        destroy(ptr)
    except Exception:  # pragma: no cover - nothing sensible to do during collection
        pass


def _waits_for_capture(destroy: Callable[[int], Any], ptr: int) -> bool:
    """True when a capture is in progress; ``destroy(ptr)`` then runs once it has ended."""
    gate = _capture_gate
    if gate is not None and gate[0]():
        gate[1](_destroy_quietly, destroy, ptr)
        return True
    return False


def _release(record: _Record) -> None:
    """The finalizer: runs when the owner is garbage-collected (never at interpreter exit)."""
    ptr, record.ptr = record.ptr, 0
    if ptr and not _waits_for_capture(record.destroy, ptr):
        _destroy_quietly(record.destroy, ptr)


class OwnedPointer:
    """Base of objects that own (or borrow) one raw C pointer; the policy is in the module docs.

    Subclasses call :meth:`_adopt` once the C object exists, and map a failed destroy to their
    library's error in :meth:`_check_destroy`. Classes on a hot path may keep the raw pointer
    in a plain attribute as well (``cuda.Stream._handle``): the record stays the owner.
    """

    _record: _Record | None = None
    _finalizer: weakref.finalize | None = None

    def _adopt(self, ptr: int, destroy: Callable[[int], Any], owned: bool = True) -> None:
        """Take ``ptr``; ``destroy(ptr)`` releases it (its result goes to :meth:`_check_destroy`)."""
        self._record = record = _Record(int(ptr), destroy)
        if owned:
            finalizer = self._finalizer = weakref.finalize(self, _release, record)
            finalizer.atexit = False
        else:
            self._finalizer = None

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
        """Destroy the C object now (once; later calls do nothing). Borrowed pointers are only dropped.

        During a capture begun by ``dnnbind.cuda.capture()`` the destroy waits for its end.
        """
        record = self._record
        if record is None or not record.ptr:
            return
        ptr, record.ptr = record.ptr, 0
        finalizer = self._finalizer
        if finalizer is None or finalizer.detach() is None:
            return  # borrowed
        if not _waits_for_capture(record.destroy, ptr):
            self._check_destroy(record.destroy(ptr))

    def _check_destroy(self, status: Any) -> None:
        """Raise for a failed destroy; subclasses map the status to their library's error."""

    def __enter__(self):
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_CPU_ADVICE = (
    "To run on the CPU, use the NumPy backend: pass NumPy arrays to dnnbind.kernels, or call "
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
