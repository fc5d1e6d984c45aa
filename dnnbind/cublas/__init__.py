"""Public cuBLAS objects: an owned handle with a workspace (graph-capturable) and GEMM helpers.

Imports without a GPU; creating a handle without one raises :class:`dnnbind.errors.NoDeviceError`.
The raw 1:1 binding is :mod:`dnnbind._lib.cublas`.
"""

from __future__ import annotations

from .._lib.cublas import version
from ._gemm import compute_type, cuda_data_type, gemm, gemm_strided_batched
from ._handle import Handle, get_handle, workspace_size

__all__ = [
    "Handle",
    "get_handle",
    "gemm",
    "gemm_strided_batched",
    "compute_type",
    "cuda_data_type",
    "workspace_size",
    "version",
]
