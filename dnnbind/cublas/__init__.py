"""Public cuBLAS objects: an owned handle with a workspace (graph-capturable) and GEMM helpers, and
cuBLASLt's low-precision (FP8, int8) "TN" matmuls with a plan cache.

Imports without a GPU; creating a handle without one raises :class:`dnnbind.errors.NoDeviceError`.
The raw 1:1 bindings are :mod:`dnnbind._lib.cublas` and :mod:`dnnbind._lib.cublaslt`.
"""

from __future__ import annotations

from .._lib.cublas import version
from ._gemm import compute_type, cuda_data_type, gemm, gemm_strided_batched
from ._handle import Handle, get_handle, workspace_size
from ._lt import (
    LtHandle,
    LtNotSupportedError,
    MatmulDesc,
    MatmulPreference,
    MatrixLayout,
    check_tn_alignment,
    get_lt_handle,
    matmul_tn,
    tn_supported,
)

__all__ = [
    "Handle",
    "get_handle",
    "gemm",
    "gemm_strided_batched",
    "compute_type",
    "cuda_data_type",
    "workspace_size",
    "version",
    "LtHandle",
    "LtNotSupportedError",
    "MatmulDesc",
    "MatrixLayout",
    "MatmulPreference",
    "get_lt_handle",
    "matmul_tn",
    "check_tn_alignment",
    "tn_supported",
]
