"""The cuBLAS handle: owned, bound to a stream, with its own workspace so calls stay graph-capturable."""

from __future__ import annotations

import ctypes
from typing import Any

from .. import cuda
from .._lib import OwnedPointer, device_index, no_device_message
from .._lib import cublas as B
from ..errors import NoDeviceError

__all__ = ["Handle", "get_handle", "workspace_size"]

_MATH = {
    "default": B.Math.DEFAULT_MATH,
    "pedantic": B.Math.PEDANTIC_MATH,
    "tf32": B.Math.TF32_TENSOR_OP_MATH,
}


def workspace_size(compute_capability: tuple[int, int]) -> int:
    """Workspace bytes cuBLAS recommends: 32 MiB on Hopper (sm_90) and newer, 4 MiB before."""
    return (32 if compute_capability[0] >= 9 else 4) * 2**20


def _raw_stream(stream: Any) -> int:
    """The raw ``cudaStream_t`` for an int, None (0: legacy default), or anything dnnbind.cuda.as_stream takes."""
    if stream is None:
        return 0
    if isinstance(stream, int) and not isinstance(stream, bool):
        return stream
    return int(cuda.as_stream(stream).handle)


class Handle(OwnedPointer):
    """An owned ``cublasHandle_t`` with a user workspace, host pointer mode and a math mode.

    cuBLAS otherwise allocates its workspace on first use, which breaks CUDA-graph
    capture; setting one up front (``cublasSetWorkspace``, from :func:`dnnbind.cuda.alloc`)
    keeps every call capturable.

    Parameters
    ----------
    device:
        Device index or :class:`dnnbind.cuda.CudaDevice`; ``None``: the current device.
    stream:
        A :class:`dnnbind.cuda.Stream`, a raw ``cudaStream_t`` int or ``None`` (legacy default).
    math:
        ``"default"`` (the GemmEx compute type decides), ``"pedantic"`` or ``"tf32"``.
    workspace_bytes:
        Workspace size; default from :func:`workspace_size` for the device. 0: no user workspace.

    Raises
    ------
    dnnbind.errors.NoDeviceError
        No usable GPU. Never a crash.
    """

    def __init__(self, device: Any = None, stream: Any = None, math: str = "default",
                 workspace_bytes: int | None = None) -> None:
        if math not in _MATH:
            raise ValueError(f"cublas.Handle: math must be one of {sorted(_MATH)}, got {math!r}")
        if workspace_bytes is not None and (not isinstance(workspace_bytes, int) or workspace_bytes < 0):
            raise ValueError(f"cublas.Handle: workspace_bytes must be an int >= 0, got {workspace_bytes!r}")
        index = device_index(device)
        self._stream_ref: Any = None
        self._stream = 0
        self.workspace: Any = None
        out = ctypes.c_void_p()
        create = B.raw("cublasCreate_v2")
        if index is None:
            status = create(ctypes.byref(out))
        else:
            with cuda.CudaDevice(index):
                status = create(ctypes.byref(out))
        if status:
            err = B.error(status, "cublasCreate_v2")
            if status == B.Status.NOT_INITIALIZED or not cuda.is_available():
                reason = "" if cuda.is_available() else cuda.unavailable_reason()
                raise NoDeviceError(no_device_message("cuBLAS", err.status_name, reason)) from err
            raise err
        self._adopt(int(out.value), B.raw("cublasDestroy_v2"))
        self._device = index if index is not None else cuda.current_device_index()
        if workspace_bytes is None:
            workspace_bytes = workspace_size(cuda.CudaDevice(self._device).compute_capability)
        self._workspace_bytes = workspace_bytes
        B.cublasSetPointerMode_v2(self.handle, B.PointerMode.HOST)
        B.cublasSetMathMode(self.handle, _MATH[math])
        self.set_stream(stream)

    @property
    def device(self) -> int:
        return self._device

    @property
    def stream(self) -> int:
        """The raw ``cudaStream_t`` the handle's work goes to."""
        return self._stream

    def set_stream(self, stream: Any) -> None:
        """Bind to ``stream`` (Stream, raw int or None) and re-attach the workspace.

        ``cublasSetStream`` resets the workspace to cuBLAS's own pool, so it is set again here.
        """
        raw = _raw_stream(stream)
        B.call("cublasSetStream_v2", self.handle, raw, context={"stream": hex(raw)})
        self._stream = raw
        self._stream_ref = None if isinstance(stream, int) else stream
        if self._workspace_bytes:
            if self.workspace is None:
                self.workspace = cuda.alloc(self._workspace_bytes, stream=stream, what="cuBLAS workspace")
                # The allocation is stream-ordered; wait for it once so the handle may run on (or
                # later move to) any stream without racing the allocation. Not a hot path.
                self.workspace.stream.synchronize()
            B.call("cublasSetWorkspace_v2", self.handle, int(self.workspace.ptr), self._workspace_bytes,
                   context={"workspace_bytes": self._workspace_bytes})

    @property
    def math(self) -> str:
        """The current ``cublasMath_t`` as a name (``"default"``, ``"pedantic"``, ``"tf32"``)."""
        out = ctypes.c_int()
        B.cublasGetMathMode(self.handle, ctypes.byref(out))
        for name, value in _MATH.items():
            if value == out.value:
                return name
        return str(out.value)

    def set_math(self, math: str) -> None:
        if math not in _MATH:
            raise ValueError(f"cublas.Handle.set_math: math must be one of {sorted(_MATH)}, got {math!r}")
        B.cublasSetMathMode(self.handle, _MATH[math])

    def close(self) -> None:
        """Destroy the handle, then drop its workspace (idempotent; the library's ownership policy:
        during a CUDA graph capture both wait for its end, in that order)."""
        super().close()
        self.workspace = None

    def _check_destroy(self, status: int) -> None:
        B.check(status, "cublasDestroy_v2")

    def __repr__(self) -> str:
        if self.closed:
            return "<cublas.Handle closed>"
        return (f"<cublas.Handle {self.handle:#x} device={self._device} stream={self._stream:#x} "
                f"workspace={self._workspace_bytes} B>")


def _create(index: int, stream: Any) -> Handle:
    return Handle(device=index, stream=stream)


_cache = cuda.stream.PerStreamCache("cuBLAS", _create)


def get_handle(stream: Any = None, device: Any = None) -> Handle:
    """A cached :class:`Handle` for (device, stream); ``stream=None``: :func:`dnnbind.cuda.current_stream`."""
    return _cache.get(stream, device)
