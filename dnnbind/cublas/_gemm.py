"""Thin, validated wrappers over cublasGemmEx and cublasGemmStridedBatchedEx (column-major)."""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np

from .._lib import cublas as CB
from .._validate import normalize_dtype
from ._handle import get_handle

__all__ = ["gemm", "gemm_strided_batched", "cuda_data_type", "compute_type"]

_DATA_TYPES = {
    "float32": CB.DataType.R_32F,
    "float64": CB.DataType.R_64F,
    "float16": CB.DataType.R_16F,
    "bfloat16": CB.DataType.R_16BF,
    "int8": CB.DataType.R_8I,
    "int32": CB.DataType.R_32I,
}

# compute name -> (cublasComputeType_t, ctypes type of alpha/beta)
_COMPUTE = {
    "float32": (CB.ComputeType.COMPUTE_32F, ctypes.c_float),
    "float32_pedantic": (CB.ComputeType.COMPUTE_32F_PEDANTIC, ctypes.c_float),
    "tf32": (CB.ComputeType.COMPUTE_32F_FAST_TF32, ctypes.c_float),
    "float16": (CB.ComputeType.COMPUTE_16F, ctypes.c_uint16),  # alpha/beta are __half bits
    "float64": (CB.ComputeType.COMPUTE_64F, ctypes.c_double),
    "int32": (CB.ComputeType.COMPUTE_32I, ctypes.c_int32),
}

# (A, B, C) dtypes each compute type accepts (cublasGemmEx documentation's table, real types).
_SUPPORTED = {
    "float16": {("float16", "float16", "float16")},
    "float32": {
        ("float32", "float32", "float32"),
        ("float16", "float16", "float16"), ("float16", "float16", "float32"),
        ("bfloat16", "bfloat16", "bfloat16"), ("bfloat16", "bfloat16", "float32"),
        ("int8", "int8", "float32"),
    },
    "tf32": {("float32", "float32", "float32")},
    "float64": {("float64", "float64", "float64")},
    "int32": {("int8", "int8", "int32")},
}
_SUPPORTED["float32_pedantic"] = _SUPPORTED["float32"]


_ACCEPTED_DTYPES = frozenset(normalize_dtype(name) for name in _DATA_TYPES)


def _dtype_name(dtype: Any, what: str) -> str:
    return normalize_dtype(dtype, what, _ACCEPTED_DTYPES).name


def cuda_data_type(dtype: Any) -> CB.DataType:
    """The ``cudaDataType_t`` for a NumPy dtype or name (bfloat16 = ml_dtypes.bfloat16)."""
    return _DATA_TYPES[_dtype_name(dtype, "cuda_data_type")]


def compute_type(compute: str) -> CB.ComputeType:
    """The ``cublasComputeType_t`` for ``"float32"``, ``"tf32"``, ``"float16"``, ``"float64"``, ``"int32"``."""
    try:
        return _COMPUTE[compute][0]
    except KeyError:
        raise ValueError(f"compute must be one of {sorted(_COMPUTE)}, got {compute!r}") from None


def _op(trans: Any, what: str, name: str) -> CB.Operation:
    if isinstance(trans, CB.Operation):
        return trans
    if isinstance(trans, bool):
        return CB.Operation.T if trans else CB.Operation.N
    if isinstance(trans, str) and trans.upper() in ("N", "T"):
        return CB.Operation[trans.upper()]
    raise ValueError(f"{what}: {name} must be a bool, 'N' or 'T', got {trans!r}")


def _ptr(x: Any, what: str, name: str) -> int:
    if isinstance(x, int):
        return x
    ptr = getattr(x, "ptr", None)
    if ptr is None:
        raise TypeError(f"{what}: {name} must be a device array (with .ptr) or a raw device pointer int, got "
                        f"{type(x).__name__}")
    return int(ptr)


def _scalar(value: Any, ctype: Any, what: str, name: str) -> Any:
    if isinstance(value, (bool, complex)) or not isinstance(value, (int, float, np.number)):
        raise TypeError(f"{what}: {name} must be a real host scalar, got {value!r}")
    if ctype is ctypes.c_uint16:
        return ctypes.c_uint16(int(np.float16(value).view(np.uint16)))
    if ctype is ctypes.c_int32:
        return ctypes.c_int32(int(value))
    return ctype(float(value))


def _check_dims(what: str, transa: CB.Operation, transb: CB.Operation, m: int, n: int, k: int, lda: int, ldb: int,
                ldc: int) -> None:
    for name, v in (("m", m), ("n", n), ("k", k)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0 or v > 2**31 - 1:
            raise ValueError(f"{what}: {name} must be an int in [0, 2**31), got {v!r}")
    # Column-major: op(A) is m x k, so A is m x k (N) or k x m (T); lda >= rows of A.
    a_rows = m if transa == CB.Operation.N else k
    b_rows = k if transb == CB.Operation.N else n
    for name, ld, rows in (("lda", lda, a_rows), ("ldb", ldb, b_rows), ("ldc", ldc, m)):
        if isinstance(ld, bool) or not isinstance(ld, (int, np.integer)) or ld < max(1, rows):
            raise ValueError(f"{what}: {name} must be >= max(1, {rows}) for m={m}, n={n}, k={k} "
                             f"(transa={transa.name}, transb={transb.name}), got {ld!r}")


_types_memo: dict = {}


def _types(what: str, a_dtype: Any, b_dtype: Any, c_dtype: Any, compute: str) -> tuple[int, int, int, int, Any]:
    # Memo of accepted combinations (dtype -> name conversions cost ~1 µs each per call).
    # Only NumPy dtype objects and strs are memoised: they hash and compare by value.
    key = None
    if all(isinstance(d, (np.dtype, str)) for d in (a_dtype, b_dtype, c_dtype)) and isinstance(compute, str):
        key = (a_dtype, b_dtype, c_dtype, compute)
        hit = _types_memo.get(key)
        if hit is not None:
            return hit
    result = _types_checked(what, a_dtype, b_dtype, c_dtype, compute)
    if key is not None and len(_types_memo) < 1024:
        _types_memo[key] = result
    return result


def _types_checked(what: str, a_dtype: Any, b_dtype: Any, c_dtype: Any,
                   compute: str) -> tuple[int, int, int, int, Any]:
    names = (_dtype_name(a_dtype, what), _dtype_name(b_dtype, what), _dtype_name(c_dtype, what))
    if compute not in _COMPUTE:
        raise ValueError(f"{what}: compute must be one of {sorted(_COMPUTE)}, got {compute!r}")
    if names not in _SUPPORTED[compute]:
        raise TypeError(f"{what}: A/B/C dtypes {names} are not supported with compute={compute!r}; supported: "
                        f"{sorted(_SUPPORTED[compute])}")
    ctype, scalar = _COMPUTE[compute]
    return _DATA_TYPES[names[0]], _DATA_TYPES[names[1]], _DATA_TYPES[names[2]], ctype, scalar


def _raw_handle(handle: Any) -> int:
    if handle is None:
        return get_handle().handle
    return handle if isinstance(handle, int) else handle.handle


def gemm(handle: Any, transa: Any, transb: Any, m: int, n: int, k: int, alpha: float, A: Any, lda: int, B: Any,
         ldb: int, beta: float, C: Any, ldc: int, *, a_dtype: Any, b_dtype: Any, c_dtype: Any,
         compute: str = "float32", algo: CB.GemmAlgo = CB.GemmAlgo.DEFAULT) -> None:
    """``C = alpha * op(A) @ op(B) + beta * C`` with ``cublasGemmEx``, in **column-major** order.

    For row-major NumPy-style arrays, compute ``C^T = op(B)^T op(A)^T``: swap A and B and
    m and n. ``A``, ``B``, ``C`` are device arrays (``.ptr``) or raw pointers; ``alpha``
    and ``beta`` are host scalars converted to the compute type's scalar (float for
    float32/tf32, half for float16, double for float64). ``compute="tf32"`` uses
    CUBLAS_COMPUTE_32F_FAST_TF32. Runs on ``handle``'s stream (``None``: the cached handle
    of the current stream); nothing is synchronised.
    """
    what = "cublas.gemm"
    op_a, op_b = _op(transa, what, "transa"), _op(transb, what, "transb")
    _check_dims(what, op_a, op_b, m, n, k, lda, ldb, ldc)
    ta, tb, tc, ctype, scalar = _types(what, a_dtype, b_dtype, c_dtype, compute)
    a_s, b_s = _scalar(alpha, scalar, what, "alpha"), _scalar(beta, scalar, what, "beta")
    CB.call("cublasGemmEx", _raw_handle(handle), op_a, op_b, m, n, k, ctypes.byref(a_s), _ptr(A, what, "A"), ta,
           lda, _ptr(B, what, "B"), tb, ldb, ctypes.byref(b_s), _ptr(C, what, "C"), tc, ldc, ctype, int(algo),
           context=lambda: {"m,n,k": (m, n, k), "trans": (op_a.name, op_b.name), "ld": (lda, ldb, ldc),
                            "dtypes": (ta.name, tb.name, tc.name), "compute": compute})


def gemm_strided_batched(handle: Any, transa: Any, transb: Any, m: int, n: int, k: int, alpha: float, A: Any,
                         lda: int, stride_a: int, B: Any, ldb: int, stride_b: int, beta: float, C: Any, ldc: int,
                         stride_c: int, batch_count: int, *, a_dtype: Any, b_dtype: Any, c_dtype: Any,
                         compute: str = "float32", algo: CB.GemmAlgo = CB.GemmAlgo.DEFAULT) -> None:
    """Batched :func:`gemm` (``cublasGemmStridedBatchedEx``); strides are in elements between matrices."""
    what = "cublas.gemm_strided_batched"
    op_a, op_b = _op(transa, what, "transa"), _op(transb, what, "transb")
    _check_dims(what, op_a, op_b, m, n, k, lda, ldb, ldc)
    for name, v in (("stride_a", stride_a), ("stride_b", stride_b), ("stride_c", stride_c),
                    ("batch_count", batch_count)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0:
            raise ValueError(f"{what}: {name} must be an int >= 0, got {v!r}")
    ta, tb, tc, ctype, scalar = _types(what, a_dtype, b_dtype, c_dtype, compute)
    a_s, b_s = _scalar(alpha, scalar, what, "alpha"), _scalar(beta, scalar, what, "beta")
    CB.call("cublasGemmStridedBatchedEx", _raw_handle(handle), op_a, op_b, m, n, k, ctypes.byref(a_s),
           _ptr(A, what, "A"), ta, lda, stride_a, _ptr(B, what, "B"), tb, ldb, stride_b, ctypes.byref(b_s),
           _ptr(C, what, "C"), tc, ldc, stride_c, batch_count, ctype, int(algo),
           context={"m,n,k": (m, n, k), "batch": batch_count, "trans": (op_a.name, op_b.name),
                    "ld": (lda, ldb, ldc), "strides": (stride_a, stride_b, stride_c),
                    "dtypes": (ta.name, tb.name, tc.name), "compute": compute})
