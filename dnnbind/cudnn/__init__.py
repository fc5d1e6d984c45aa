"""Public cuDNN objects: the handle and the descriptors, for ops and for pipelines of your own.

Everything here is owned (idempotent ``close()``, context manager, ``weakref.finalize``
cleanup) and imports without a GPU; the descriptors even work without one. The raw 1:1
binding is :mod:`dnnbind._lib.cudnn`.
"""

from __future__ import annotations

from .._lib.cudnn import cudart_version, version
from ._descriptors import (
    ActivationDescriptor,
    ActivationInfo,
    ConvolutionDescriptor,
    ConvolutionInfo,
    DropoutDescriptor,
    DropoutInfo,
    FilterDescriptor,
    FilterInfo,
    OpTensorDescriptor,
    OpTensorInfo,
    PoolingDescriptor,
    PoolingInfo,
    ReduceTensorDescriptor,
    ReduceTensorInfo,
    TensorDescriptor,
    TensorInfo,
    data_type,
    dtype_of,
)
from ._handle import Handle, get_handle

__all__ = [
    "Handle",
    "get_handle",
    "version",
    "cudart_version",
    "data_type",
    "dtype_of",
    "TensorDescriptor",
    "FilterDescriptor",
    "ConvolutionDescriptor",
    "PoolingDescriptor",
    "ActivationDescriptor",
    "DropoutDescriptor",
    "OpTensorDescriptor",
    "ReduceTensorDescriptor",
    "TensorInfo",
    "FilterInfo",
    "ConvolutionInfo",
    "PoolingInfo",
    "ActivationInfo",
    "DropoutInfo",
    "OpTensorInfo",
    "ReduceTensorInfo",
]
