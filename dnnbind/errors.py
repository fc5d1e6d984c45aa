"""One exception hierarchy for the whole library.

Every error a user can see derives from :class:`DnnbindError`. Errors that come
from a C library carry the library's status name, the function that failed,
the library's own words (``cudnnGetLastErrorString`` and friends) and whatever
context the caller attached (shapes, strides, algorithm, ...). A status code
without words is a bug.
"""

from __future__ import annotations

from typing import Any, Mapping

__all__ = [
    "DnnbindError",
    "LibraryStatusError",
    "CudaError",
    "CudnnError",
    "CublasError",
    "NvrtcError",
    "NcclError",
    "DistributedError",
    "DeviceOutOfMemoryError",
    "AllocationTooLargeError",
    "ReadLimitError",
    "NoDeviceError",
    "LibraryNotFoundError",
    "format_context",
]


class DnnbindError(Exception):
    """Base class of every error raised by dnnbind."""


def format_context(context: Mapping[str, Any] | None) -> str:
    """Render call context (shapes, strides, algorithm...) as ``key=value`` lines."""
    if not context:
        return ""
    return "\n".join(f"  {key}: {value}" for key, value in context.items())


class LibraryStatusError(DnnbindError):
    """A C library returned a non-success status.

    Attributes
    ----------
    status:
        The integer status code.
    status_name:
        The enum name of the status (for example ``CUDNN_STATUS_BAD_PARAM``).
    function:
        The C function that returned it.
    detail:
        The library's own explanation, when it offers one.
    context:
        Caller-supplied context: shapes, strides, dtypes, algorithm.
    """

    library = "library"

    def __init__(
        self,
        status: int,
        status_name: str,
        function: str,
        detail: str = "",
        context: Mapping[str, Any] | None = None,
        hint: str = "",
    ) -> None:
        self.status = int(status)
        self.status_name = status_name
        self.function = function
        self.detail = detail
        self.context = dict(context or {})
        self.hint = hint
        super().__init__(self._message())

    def _message(self) -> str:
        lines = [f"{self.function} failed with {self.status_name} ({self.status})"]
        if self.detail:
            lines[0] += f": {self.detail}"
        ctx = format_context(self.context)
        if ctx:
            lines.append("call context:\n" + ctx)
        if self.hint:
            lines.append(self.hint)
        return "\n".join(lines)

    def add_context(self, **context: Any) -> "LibraryStatusError":
        """Attach more context (as CuPy's ``add_info`` did) and refresh the message."""
        self.context.update(context)
        self.args = (self._message(),)
        return self


class CudaError(LibraryStatusError):
    """A CUDA runtime or driver call failed."""

    library = "CUDA"


class CudnnError(LibraryStatusError):
    """A cuDNN call failed."""

    library = "cuDNN"


class CublasError(LibraryStatusError):
    """A cuBLAS or cuBLASLt call failed."""

    library = "cuBLAS"


class NvrtcError(LibraryStatusError):
    """NVRTC failed; ``log`` holds the compiler's log when compilation failed."""

    library = "NVRTC"

    def __init__(self, status: int, status_name: str, function: str, detail: str = "",
                 context: Mapping[str, Any] | None = None, hint: str = "", log: str = "") -> None:
        self.log = log
        if log and not detail:
            detail = "compilation failed"
        super().__init__(status, status_name, function, detail, context, hint)

    def _message(self) -> str:
        msg = super()._message()
        if getattr(self, "log", ""):
            msg += "\nNVRTC log:\n" + self.log.rstrip()
        return msg


class NcclError(LibraryStatusError):
    """An NCCL call failed (``ncclGetErrorString`` and ``ncclGetLastError`` in the message)."""

    library = "NCCL"


class DistributedError(DnnbindError):
    """Data-parallel training failed across processes: a rank that never joined, a rank that died
    or hung (the message names it), a collective that timed out and was aborted."""


class DeviceOutOfMemoryError(DnnbindError, MemoryError):
    """A device allocation failed for lack of memory.

    The message states the bytes requested, the free and total device memory,
    and what to do about it.
    """

    def __init__(self, requested: int, free: int | None, total: int | None,
                 device: int = 0, what: str = "") -> None:
        self.requested = int(requested)
        self.free = free
        self.total = total
        self.device = device
        super().__init__(self._message(what))

    def _message(self, what: str) -> str:
        def mib(n: int | None) -> str:
            return "unknown" if n is None else f"{n / 2**20:,.1f} MiB"

        subject = f" for {what}" if what else ""
        return (
            f"out of device memory on cuda:{self.device}: could not allocate "
            f"{self.requested:,} bytes ({mib(self.requested)}){subject}; "
            f"free {mib(self.free)} of {mib(self.total)} total. "
            "Try a smaller batch size, free arrays you no longer need, or call "
            "dnnbind.cuda.empty_cache() to return cached pool memory to the driver."
        )


class AllocationTooLargeError(DnnbindError, MemoryError):
    """An allocation refused before it was tried, because it cannot fit (a layer built with
    ``Dense(2**40)``...). The message names the layer, the shape, the bytes and what to do."""


class ReadLimitError(DnnbindError, ValueError):
    """An untrusted file, archive member or message is larger, more compressed or more deeply nested
    than the read limits allow (:class:`dnnbind.saving.ReadLimits`). Raised while reading, before the
    bytes are held; the message names the file, the limit, the amount and how to raise the limit."""


class NoDeviceError(DnnbindError):
    """No usable CUDA device (no GPU, no driver, or a driver too old)."""


class LibraryNotFoundError(DnnbindError, OSError):
    """A CUDA library (libcudnn, libcublas, libnvrtc...) could not be found or loaded."""
