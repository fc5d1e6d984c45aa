"""ctypes binding to the cuBLAS v2 API (``_v2`` symbols), declared from cublas_api.h.

Same shape as :mod:`dnnbind._lib.cudnn`: module attributes named after the C
function (``cublas.cublasGemmEx(...)``) are checked wrappers that raise
:class:`dnnbind.errors.CublasError`; ``call(name, *args, context=...)`` adds call
context to the error; ``raw(name)`` is the bare function. The v2 functions are
exported under their C symbol names (``cublasSgemm_v2``), which is what the
``cublas_v2.h`` macros resolve ``cublasSgemm`` to.
"""

from __future__ import annotations

import ctypes
from enum import IntEnum
from typing import Any, Mapping

from ..errors import CublasError
from ._binding import Binding

__all__ = [
    "SIGNATURES",
    "call",
    "check",
    "raw",
    "library",
    "version",
    "status_name",
    "status_string",
    "Status",
    "Operation",
    "PointerMode",
    "Math",
    "ComputeType",
    "GemmAlgo",
    "DataType",
]


class Status(IntEnum):
    """``cublasStatus_t``."""

    SUCCESS = 0
    NOT_INITIALIZED = 1
    ALLOC_FAILED = 3
    INVALID_VALUE = 7
    ARCH_MISMATCH = 8
    MAPPING_ERROR = 11
    EXECUTION_FAILED = 13
    INTERNAL_ERROR = 14
    NOT_SUPPORTED = 15
    LICENSE_ERROR = 16


class Operation(IntEnum):
    """``cublasOperation_t``."""

    N = 0
    T = 1
    C = 2


class PointerMode(IntEnum):
    """``cublasPointerMode_t``: where alpha/beta live."""

    HOST = 0
    DEVICE = 1


class Math(IntEnum):
    """``cublasMath_t`` (flags may be OR-ed with DISALLOW_REDUCED_PRECISION_REDUCTION)."""

    DEFAULT_MATH = 0
    TENSOR_OP_MATH = 1  # deprecated in cuBLAS
    PEDANTIC_MATH = 2
    TF32_TENSOR_OP_MATH = 3
    FP32_EMULATED_BF16X9_MATH = 4
    MATH_DISALLOW_REDUCED_PRECISION_REDUCTION = 16


class ComputeType(IntEnum):
    """``cublasComputeType_t``."""

    COMPUTE_16F = 64
    COMPUTE_16F_PEDANTIC = 65
    COMPUTE_32F = 68
    COMPUTE_32F_PEDANTIC = 69
    COMPUTE_32F_FAST_16F = 74
    COMPUTE_32F_FAST_16BF = 75
    COMPUTE_32F_FAST_TF32 = 77
    COMPUTE_32F_EMULATED_16BFX9 = 78
    COMPUTE_64F = 70
    COMPUTE_64F_PEDANTIC = 71
    COMPUTE_32I = 72
    COMPUTE_32I_PEDANTIC = 73


class GemmAlgo(IntEnum):
    """``cublasGemmAlgo_t`` (only the two that matter on sm_80+; the numbered ones are ignored there)."""

    DEFAULT = -1
    DEFAULT_TENSOR_OP = 99


class DataType(IntEnum):
    """``cudaDataType_t`` from library_types.h (real types)."""

    R_16F = 2
    R_16BF = 14
    R_32F = 0
    R_64F = 1
    R_8I = 3
    R_8U = 8
    R_32I = 10
    R_32U = 12
    R_64I = 24
    R_8F_E4M3 = 28
    R_8F_E5M2 = 29


P = ctypes.c_void_p
I = ctypes.c_int  # noqa: E741 - matches the table in _lib/cudnn.py
I64 = ctypes.c_longlong
Z = ctypes.c_size_t
pP = ctypes.POINTER(ctypes.c_void_p)
pI = ctypes.POINTER(ctypes.c_int)

# Status-returning functions: argtypes. Scalars passed by pointer (alpha, beta, results)
# are P: pass ctypes.byref(c_float(...)) or a device pointer in device pointer mode.
SIGNATURES: dict[str, tuple[Any, ...]] = {
    "cublasCreate_v2": (pP,),
    "cublasDestroy_v2": (P,),
    "cublasGetVersion_v2": (P, pI),
    "cublasGetProperty": (I, pI),
    "cublasSetStream_v2": (P, P),
    "cublasGetStream_v2": (P, pP),
    "cublasSetWorkspace_v2": (P, P, Z),
    "cublasSetMathMode": (P, I),
    "cublasGetMathMode": (P, pI),
    "cublasSetPointerMode_v2": (P, I),
    "cublasGetPointerMode_v2": (P, pI),
    # handle, transa, transb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc
    "cublasSgemm_v2": (P, I, I, I, I, I, P, P, I, P, I, P, P, I),
    # handle, transa, transb, m, n, k, alpha, A, Atype, lda, B, Btype, ldb, beta, C, Ctype, ldc, compute, algo
    "cublasGemmEx": (P, I, I, I, I, I, P, P, I, I, P, I, I, P, P, I, I, I, I),
    # as GemmEx with strideA/B/C (long long) after each ld, and batchCount before computeType
    "cublasGemmStridedBatchedEx": (P, I, I, I, I, I, P, P, I, I, I64, P, I, I, I64, P, P, I, I, I64, I, I, I),
    # handle, transa, transb, m, n, alpha, A, lda, beta, B, ldb, C, ldc
    "cublasSgeam": (P, I, I, I, I, P, P, I, P, P, I, P, I),
    # handle, n, alpha, x, incx, y, incy
    "cublasSaxpy_v2": (P, I, P, P, I, P, I),
    # handle, n, alpha, x, incx
    "cublasSscal_v2": (P, I, P, P, I),
    # handle, n, x, incx, y, incy, result
    "cublasSdot_v2": (P, I, P, I, P, I, P),
}

_PLAIN_SIGNATURES: dict[str, tuple[tuple[Any, ...], Any]] = {
    "cublasGetStatusName": ((I,), ctypes.c_char_p),
    "cublasGetStatusString": ((I,), ctypes.c_char_p),
}

def version() -> int:
    """cuBLAS version as major*10000 + minor*100 + patch (no handle, so no GPU, needed)."""
    parts = []
    for prop in (0, 1, 2):  # MAJOR_VERSION, MINOR_VERSION, PATCH_LEVEL
        value = ctypes.c_int()
        call("cublasGetProperty", prop, ctypes.byref(value))
        parts.append(value.value)
    return parts[0] * 10000 + parts[1] * 100 + parts[2]


def status_name(status: int) -> str:
    """``CUBLAS_STATUS_INVALID_VALUE`` for 7 (``cublasGetStatusName``)."""
    text = library().cublasGetStatusName(int(status))
    if text:
        return text.decode(errors="replace")
    try:
        return "CUBLAS_STATUS_" + Status(status).name
    except ValueError:
        return f"CUBLAS_STATUS_UNKNOWN_{int(status)}"


def status_string(status: int) -> str:
    """cuBLAS's sentence for a status (``cublasGetStatusString``)."""
    text = library().cublasGetStatusString(int(status))
    return text.decode(errors="replace") if text else ""


_HINTS = {
    Status.NOT_INITIALIZED: "cuBLAS could not initialise: is there a usable GPU? `python -m dnnbind doctor` checks.",
    Status.ALLOC_FAILED: "cuBLAS could not allocate memory; try a smaller batch or dnnbind.cuda.empty_cache().",
    Status.ARCH_MISMATCH: "this cuBLAS build does not support the GPU or the requested dtype/compute type on it.",
    Status.NOT_SUPPORTED: "this dtype / compute-type combination is not supported by cuBLAS.",
}


def error(status: int, function: str, context: Mapping[str, Any] | None = None) -> CublasError:
    """Build the :class:`CublasError` for a failed call."""
    return CublasError(int(status), status_name(status), function, detail=status_string(status),
                       context=context, hint=_HINTS.get(status, ""))  # type: ignore[call-overload]


def check(status: int, function: str, **context: Any) -> None:
    """Raise :class:`CublasError` when ``status`` is not CUBLAS_STATUS_SUCCESS."""
    if status:
        raise error(status, function, context)


_binding = Binding("cublas", SIGNATURES, _PLAIN_SIGNATURES, error)
library = _binding.library
raw = _binding.raw
call = _binding.call
# library(), raw(name) and call(name, *args, context=None) (raises CublasError carrying the context)
# are the shared Binding methods; module attributes named after C functions are checked wrappers.


__getattr__, __dir__ = _binding.module_hooks(globals())
