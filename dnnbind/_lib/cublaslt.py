"""ctypes binding to cuBLASLt (``libcublasLt``), declared from cublasLt.h of the cu12 wheel (cuBLAS 12.9).

Same shape as :mod:`dnnbind._lib.cublas`: module attributes named after the C function are checked
wrappers raising :class:`dnnbind.errors.CublasError` (cuBLASLt returns ``cublasStatus_t``);
``call(name, *args, context=...)`` adds call context; ``raw(name)`` is the bare function. Only what the
matmul path uses is declared: handles, matmul/layout/preference descriptors and their attributes, the
heuristic query and ``cublasLtMatmul``.
"""

from __future__ import annotations

import ctypes
from enum import IntEnum
from typing import Any

from . import cublas as _cublas
from ._binding import Binding

__all__ = [
    "SIGNATURES", "call", "raw", "make_error", "library", "version", "MatmulDescAttribute", "MatrixLayoutAttribute",
    "PreferenceAttribute", "Epilogue", "Order", "PointerMode", "HeuristicResult", "ALGO_BYTES",
]


class MatmulDescAttribute(IntEnum):
    """``cublasLtMatmulDescAttributes_t`` (the ones used; value types in the comments, from the header)."""

    COMPUTE_TYPE = 0  # int32_t (cublasComputeType_t)
    SCALE_TYPE = 1  # int32_t (cudaDataType)
    POINTER_MODE = 2  # int32_t
    TRANSA = 3  # int32_t (cublasOperation_t)
    TRANSB = 4  # int32_t
    EPILOGUE = 7  # uint32_t
    BIAS_POINTER = 8  # const void*
    A_SCALE_POINTER = 17  # const void* (device, float for FP8)
    B_SCALE_POINTER = 18
    C_SCALE_POINTER = 19
    D_SCALE_POINTER = 20
    AMAX_D_POINTER = 21
    FAST_ACCUM = 25  # int8_t
    BIAS_DATA_TYPE = 26  # int32_t (cudaDataType)


class MatrixLayoutAttribute(IntEnum):
    """``cublasLtMatrixLayoutAttribute_t``."""

    TYPE = 0
    ORDER = 1  # int32_t (cublasLtOrder_t)
    ROWS = 2  # uint64_t
    COLS = 3  # uint64_t
    LD = 4  # int64_t
    BATCH_COUNT = 5


class PreferenceAttribute(IntEnum):
    """``cublasLtMatmulPreferenceAttributes_t``."""

    SEARCH_MODE = 0
    MAX_WORKSPACE_BYTES = 1  # uint64_t
    MIN_ALIGNMENT_A_BYTES = 5  # uint32_t
    MIN_ALIGNMENT_B_BYTES = 6
    MIN_ALIGNMENT_C_BYTES = 7
    MIN_ALIGNMENT_D_BYTES = 8


class Epilogue(IntEnum):
    """``cublasLtEpilogue_t`` (the ones used). The header: RELU is ``x := max(x, 0)``; RELU_BIAS = RELU | BIAS
    "appl[ies] Bias and then ReLu"."""

    DEFAULT = 1
    RELU = 2
    BIAS = 4
    RELU_BIAS = 6


class Order(IntEnum):
    """``cublasLtOrder_t``."""

    COL = 0
    ROW = 1
    COL32 = 2


class PointerMode(IntEnum):
    """``cublasLtPointerMode_t`` (HOST/DEVICE equal cuBLAS's)."""

    HOST = 0
    DEVICE = 1


ALGO_BYTES = 64  # cublasLtMatmulAlgo_t: uint64_t data[8]


class HeuristicResult(ctypes.Structure):
    """``cublasLtMatmulHeuristicResult_t``."""

    _fields_ = [
        ("algo", ctypes.c_uint64 * 8),
        ("workspaceSize", ctypes.c_size_t),
        ("state", ctypes.c_int),
        ("wavesCount", ctypes.c_float),
        ("reserved", ctypes.c_int * 4),
    ]


P = ctypes.c_void_p
I = ctypes.c_int  # noqa: E741 - matches the other binding tables
I64 = ctypes.c_int64
U64 = ctypes.c_uint64
Z = ctypes.c_size_t
pP = ctypes.POINTER(ctypes.c_void_p)
pI = ctypes.POINTER(ctypes.c_int)
pZ = ctypes.POINTER(ctypes.c_size_t)

SIGNATURES: dict[str, tuple[Any, ...]] = {
    "cublasLtCreate": (pP,),
    "cublasLtDestroy": (P,),
    # matmulDesc*, computeType, scaleType
    "cublasLtMatmulDescCreate": (pP, I, I),
    "cublasLtMatmulDescDestroy": (P,),
    # desc, attr, buf, sizeInBytes
    "cublasLtMatmulDescSetAttribute": (P, I, P, Z),
    # desc, attr, buf, sizeInBytes, sizeWritten*
    "cublasLtMatmulDescGetAttribute": (P, I, P, Z, pZ),
    # layout*, type, rows, cols, ld
    "cublasLtMatrixLayoutCreate": (pP, I, U64, U64, I64),
    "cublasLtMatrixLayoutDestroy": (P,),
    "cublasLtMatrixLayoutSetAttribute": (P, I, P, Z),
    "cublasLtMatrixLayoutGetAttribute": (P, I, P, Z, pZ),
    "cublasLtMatmulPreferenceCreate": (pP,),
    "cublasLtMatmulPreferenceDestroy": (P,),
    "cublasLtMatmulPreferenceSetAttribute": (P, I, P, Z),
    # handle, desc, Adesc, Bdesc, Cdesc, Ddesc, preference, requestedAlgoCount, results[], returnAlgoCount*
    "cublasLtMatmulAlgoGetHeuristic": (P, P, P, P, P, P, P, I, P, pI),
    # handle, desc, alpha, A, Adesc, B, Bdesc, beta, C, Cdesc, D, Ddesc, algo*, workspace, workspaceSize, stream
    "cublasLtMatmul": (P, P, P, P, P, P, P, P, P, P, P, P, P, P, Z, P),
}

_PLAIN_SIGNATURES: dict[str, tuple[tuple[Any, ...], Any]] = {
    "cublasLtGetVersion": ((), ctypes.c_size_t),
}


def version() -> int:
    """cuBLASLt's version (``cublasLtGetVersion``: major*10000 + minor*100 + patch); needs no GPU."""
    return int(library().cublasLtGetVersion())


# cuBLASLt reports cublasStatus_t: cuBLAS's names, sentences and hints apply as they are
_binding = Binding("cublasLt", SIGNATURES, _PLAIN_SIGNATURES, _cublas.error)
library = _binding.library
raw = _binding.raw
call = _binding.call
make_error = _binding.make_error  # (status, function, context) -> CublasError, for callers that check raw statuses

__getattr__, __dir__ = _binding.module_hooks(globals())
