"""Plumbing shared by the CUDA implementations of the ops.

* streams and library handles (``stream=None`` is the current stream; the cuDNN and
  cuBLAS handles come from the per-(device, stream) caches of :mod:`dnnbind.cudnn` /
  :mod:`dnnbind.cublas`);
* host scalars (alpha/beta) of the right C type for a data type;
* output allocation on the call's stream (stream-ordered pool: no cudaMalloc, capturable);
* NVRTC kernels from the ``*.cu`` sources next to this file, compiled once per device.

cuDNN itself (descriptors, the algorithm choice, the workspace) is :mod:`dnnbind.cudnn`'s.

Nothing here touches the GPU at import time.
"""

from __future__ import annotations

import ctypes
import threading
import warnings
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ..._validate import BFLOAT16
from ...backend import is_device_array
from ...cublas import get_handle as _cublas_get_handle
from ...cuda import Kernel
from ...cuda._util import check, rt
from ...cuda.array import DeviceArray, _empty_on
from ...cuda.device import CudaDevice, current_device_index
from ...cuda.kernel import Pointer
from ...cuda.stream import Stream, as_stream
from ...cudnn import Handle
from ...cudnn import get_handle as _cudnn_get_handle
from ...errors import CudnnError, DeviceOutOfMemoryError
from .. import config as _config

__all__ = [
    "BF16", "F16", "F32", "F64", "FLOAT_DTYPES",
    "stream_of", "cudnn_handle", "cublas_handle", "suffix", "ONE", "ZERO",
    "nchw_dims", "empty", "output", "kernel", "launch",
    "launch_rows", "memset", "memcpy", "config", "size_of", "ptr",
]

F32 = np.dtype(np.float32)
F64 = np.dtype(np.float64)
F16 = np.dtype(np.float16)
BF16 = BFLOAT16
FLOAT_DTYPES = (F32, F64, F16, BF16)

# Kernel name suffixes, as in prelude.cuh / elementwise.cu.
_SUFFIX = {F32: "f32", F64: "f64", F16: "f16", BF16: "bf16", np.dtype(np.int32): "i32",
           np.dtype(np.int64): "i64", np.dtype(np.uint8): "u8", np.dtype(np.int8): "i8",
           np.dtype(np.bool_): "bool", np.dtype(np.int16): "i16", np.dtype(np.uint16): "u16",
           np.dtype(np.uint32): "u32", np.dtype(np.uint64): "u64"}


def config():
    """``dnnbind.kernels.config``."""
    return _config


# ------------------------------------------------------------------------ streams and handles
# This room is imported only when an op runs on a DeviceArray (kernels._dispatch imports it by name),
# so it imports the CUDA rooms at its top: importing dnnbind.kernels alone still never touches them.


stream_of = as_stream
"""The :class:`dnnbind.cuda.Stream` for ``stream=`` (None: the current stream): ``cuda.as_stream`` itself,
whose hot paths (a Stream; None inside or outside a ``with stream:``) come first, one frame per op."""


def cudnn_handle(stream) -> Handle:
    """The :class:`dnnbind.cudnn.Handle` bound to ``stream`` (cached per device and stream by dnnbind.cudnn)."""
    return _cudnn_get_handle(stream)


def cublas_handle(stream) -> int:
    """Raw cublasHandle_t bound to ``stream`` (workspace set, so graph-capturable)."""
    return _cublas_get_handle(stream).handle


def suffix(dtype: np.dtype) -> str:
    hit = _SUFFIX.get(dtype) if isinstance(dtype, np.dtype) else None
    if hit is not None:
        return hit
    try:
        return _SUFFIX[np.dtype(dtype)]
    except KeyError:
        raise TypeError(f"no dnnbind kernel handles dtype {np.dtype(dtype)}") from None


def size_of(shape: Sequence[int]) -> int:
    n = 1
    for s in shape:
        n *= int(s)
    return n


def ptr(array: Any) -> int:
    """Device pointer of a DeviceArray (0 for None)."""
    return 0 if array is None else int(array.ptr)


# The kernels' vector paths: 16-byte loads and stores.
def vector_width(dtype: Any) -> int:
    """Elements of ``dtype`` per 16-byte access."""
    return 16 // np.dtype(dtype).itemsize


def aligned16(*arrays: Any) -> bool:
    """Whether every array (None skipped) starts on a 16-byte boundary: the vector paths' condition."""
    bits = 0
    for a in arrays:
        if a is not None:
            bits |= int(a.ptr)
    return bits % 16 == 0


# --------------------------------------------------------------------------------- scalars

class _Scalars:
    """alpha/beta host scalars: cuDNN wants double for double data and float otherwise.

    They are read when the call is made (host pointer mode), so module-level constants are
    safe, also under CUDA-graph capture (the values are baked into the graph).
    """

    def __init__(self, value: float) -> None:
        self.f = ctypes.c_float(value)
        self.d = ctypes.c_double(value)
        self.f_ref = ctypes.byref(self.f)
        self.d_ref = ctypes.byref(self.d)

    def of(self, dtype: np.dtype):
        return self.d_ref if dtype == F64 else self.f_ref


ONE = _Scalars(1.0)
ZERO = _Scalars(0.0)


# ------------------------------------------------------------------------------- shapes

def nchw_dims(shape: Sequence[int], layout: str) -> tuple[int, int, int, int]:
    """(N, C, H, W) of a 4-d shape stored in ``layout``."""
    if layout == "NCHW":
        return tuple(int(v) for v in shape)  # type: ignore[return-value]
    n, h, w, c = (int(v) for v in shape)
    return (n, c, h, w)


# ------------------------------------------------------------------------------- memory

def empty(shape: Sequence[int], dtype: Any, stream) -> Any:
    """A new DeviceArray on ``stream`` (a :class:`Stream`, as :func:`stream_of` returns it;
    stream-ordered pool allocation). ``shape`` and ``dtype`` come from the op's own arrays, so
    the allocation fast path skips re-checking them (``cuda.array._empty_on``)."""
    if type(shape) is not tuple:
        shape = tuple(int(s) for s in shape)
    return _empty_on(shape, dtype, stream if type(stream) is Stream else as_stream(stream))


def output(out: Any, shape: Sequence[int], dtype: Any, stream) -> Any:
    """``out`` when given (the public op checked its shape/dtype), else a new array."""
    if out is not None:
        return out
    if type(shape) is not tuple:
        shape = tuple(int(s) for s in shape)
    return _empty_on(shape, dtype, stream if type(stream) is Stream else as_stream(stream))


def memset(array: Any, byte: int, stream) -> None:
    n = array.nbytes
    if n:
        result = rt.cudaMemsetAsync(array.ptr, int(byte), n, stream.handle)
        if result[0]:  # the error context is built only when raising
            check(result, "cudaMemsetAsync", nbytes=n)


def memcpy(dst: Any, src: Any, stream, nbytes: "int | None" = None) -> None:
    """Device-to-device copy on ``stream`` (stream-ordered, capturable)."""
    n = src.nbytes if nbytes is None else nbytes
    if n and dst.ptr != src.ptr:
        result = rt.cudaMemcpyAsync(dst.ptr, src.ptr, n, rt.cudaMemcpyKind.cudaMemcpyDeviceToDevice, stream.handle)
        if result[0]:
            check(result, "cudaMemcpyAsync", nbytes=n)


# ------------------------------------------------------------------------------- kernels

_SOURCE_DIR = Path(__file__).resolve().parent
_sources: dict[str, str] = {}
_kernels: dict[tuple[str, str, int], Any] = {}
_kernel_lock = threading.Lock()
_sm_counts: dict[int, int] = {}
KERNEL_OPTIONS = ("-std=c++17",)


def source(filename: str) -> str:
    """prelude.cuh followed by ``filename`` (a .cu file next to this module)."""
    text = _sources.get(filename)
    if text is None:
        prelude = (_SOURCE_DIR / "prelude.cuh").read_text()
        text = prelude + "\n#line 1 \"" + filename + "\"\n" + (_SOURCE_DIR / filename).read_text()
        _sources[filename] = text
    return text


def kernel(filename: str, name: str, device: int):
    """The compiled ``extern "C"`` kernel ``name`` of ``filename`` for ``device`` (cached)."""
    key = (filename, name, device)
    k = _kernels.get(key)
    if k is not None:
        return k
    with _kernel_lock:
        k = _kernels.get(key)
        if k is None:
            k = Kernel(source(filename), name, options=KERNEL_OPTIONS, device=device)
            _kernels[key] = k
    return k


def _sm_count(device: int) -> int:
    n = _sm_counts.get(device)
    if n is None:
        n = _sm_counts[device] = int(CudaDevice(device).multiprocessor_count)
    return n


BLOCK = 256


def launch(filename: str, name: str, n: int, args: Sequence[Any], stream, *, block: int = BLOCK) -> None:
    """Launch a grid-stride kernel over ``n`` items on ``stream``.

    ``args`` are pointers (:func:`p`) and NumPy scalars of the parameters' exact C types
    (:data:`i64`, :data:`i32`, :data:`f32`, :data:`f64`, :data:`u64`), in the kernel's order. The grid is capped at 32 blocks per SM: the loops stride.
    """
    if n <= 0:
        return
    device = stream._device
    # kernel() and _sm_count() hits inlined: this runs for most launches of every step
    k = _kernels.get((filename, name, device))
    if k is None:
        k = kernel(filename, name, device)
    sms = _sm_counts.get(device)
    if sms is None:
        sms = _sm_count(device)
    grid = max(1, min(-(-int(n) // block), sms * 32))
    k((grid, 1, 1), (block, 1, 1), args if type(args) is tuple else tuple(args), stream=stream)


def launch_rows(filename: str, name: str, rows: int, args: Sequence[Any], stream, *,
                block: int = BLOCK, max_grid: int = 65535) -> None:
    """Launch a kernel that takes one block per row (rows beyond the grid are strided)."""
    if rows <= 0:
        return
    device = stream._device
    k = _kernels.get((filename, name, device))
    if k is None:
        k = kernel(filename, name, device)
    k((max(1, min(int(rows), max_grid)), 1, 1), (block, 1, 1), args if type(args) is tuple else tuple(args),
      stream=stream)


# Kernel argument helpers: NumPy scalars carry their exact C type; pointers are
# dnnbind.cuda.Pointer (what dnnbind.cuda.Kernel packs as void*).
def p(array_or_ptr: Any):
    """A pointer kernel argument: a DeviceArray passes as itself (the kernel packs its pointer,
    with no Pointer object made per call); ints, None and other objects with ``.ptr`` become a
    :class:`dnnbind.cuda.Pointer`."""
    if type(array_or_ptr) is DeviceArray:
        return array_or_ptr
    value = array_or_ptr if isinstance(array_or_ptr, int) else ptr(array_or_ptr)
    return Pointer(int(value))


i64 = np.int64
i32 = np.int32
f32 = np.float32
f64 = np.float64
u64 = np.uint64


def warn_once(key: Any, message: str, _seen: set = set()) -> None:  # noqa: B006 - process-wide memo
    if key in _seen:
        return
    _seen.add(key)
    warnings.warn(message, RuntimeWarning, stacklevel=3)


def device_scalar_ptr(value: Any, op: str, name: str) -> "tuple[float, int]":
    """(host value, device pointer) for a number or a 0-d float32 DeviceArray.

    A device scalar is read by the kernel at run time (so a captured graph sees the
    current value on replay); a Python number is baked in.
    """
    if value is None:
        return 0.0, 0
    if is_device_array(value):
        if value.size != 1 or np.dtype(value.dtype) != F32:
            raise TypeError(f"{op}: {name} as a device array must be one float32 element, got shape "
                            f"{tuple(value.shape)} {value.dtype}")
        return 0.0, int(value.ptr)
    try:
        return float(value), 0
    except (TypeError, ValueError):
        raise TypeError(f"{op}: {name} must be a number or a 0-d float32 DeviceArray, got {value!r}") from None


__all__ += ["source", "p", "i64", "i32", "f32", "f64", "u64",
            "warn_once", "device_scalar_ptr", "BLOCK", "CudnnError", "DeviceOutOfMemoryError"]
