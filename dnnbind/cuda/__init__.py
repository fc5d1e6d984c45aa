"""CUDA runtime objects on ``cuda.bindings``: devices, streams/events, the memory pool,
``DeviceArray``, interop (CUDA Array Interface, DLPack), graph capture and NVRTC kernels.

Importing this package never touches the GPU; :func:`is_available` says whether one is usable.
"""

from __future__ import annotations

from .array import SUPPORTED_DTYPES, DeviceArray, constant, empty, to_device, zeros
from .device import (
    CudaDevice,
    Device,
    current_device_index,
    device_count,
    get_device,
    is_available,
    unavailable_reason,
)
from .graph import Graph, capture
from .interop import from_cuda_array_interface, from_dlpack
from .kernel import Kernel, Pointer, compile_kernel
from .memory import Allocation, PinnedBuffer, alloc, empty_cache, memory_info, pool_stats
from .stream import Event, Stream, as_stream, current_stream, default_stream

__all__ = [
    "is_available",
    "unavailable_reason",
    "device_count",
    "current_device_index",
    "CudaDevice",
    "Device",
    "get_device",
    "Stream",
    "Event",
    "default_stream",
    "current_stream",
    "as_stream",
    "Allocation",
    "PinnedBuffer",
    "alloc",
    "memory_info",
    "empty_cache",
    "pool_stats",
    "DeviceArray",
    "SUPPORTED_DTYPES",
    "empty",
    "zeros",
    "to_device",
    "constant",
    "from_dlpack",
    "from_cuda_array_interface",
    "Graph",
    "capture",
    "Kernel",
    "Pointer",
    "compile_kernel",
]
