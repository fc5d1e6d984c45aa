"""Zero-copy exchange with other GPU libraries: CUDA Array Interface v3 and DLPack.

Export: ``DeviceArray.__cuda_array_interface__`` and ``DeviceArray.__dlpack__`` (a
``"dltensor"`` capsule, or ``"dltensor_versioned"`` when the consumer asks for
``max_version >= (1, 0)``; :mod:`._dlpack` holds the ABI and the export). The capsule's
manager context keeps the array alive until the consumer calls the deleter (or the
unconsumed capsule dies).

Import: :func:`from_dlpack` prefers ``__cuda_array_interface__`` when the object
offers one, and otherwise parses the DLPack capsule with ctypes; either way the
result keeps the producer alive. Stream semantics follow both protocols: the
exporter makes the consumer's stream wait on its own with an event, never by
blocking the host.
"""

from __future__ import annotations

import ctypes
import datetime
from typing import Any

import numpy as np

from .._lib import OwnedPointer
from .._validate import BFLOAT16, normalize_dtype
from ._dlpack import (NAME, NAME_VERSIONED, USED_NAME, USED_NAME_VERSIONED, DLManagedTensor,
                      DLManagedTensorVersioned, kDLBfloat, kDLBool, kDLCUDA, kDLCUDAManaged, kDLFloat, kDLInt,
                      kDLUInt, pyapi)
from ._util import check, rt
from .array import SUPPORTED_DTYPES, DeviceArray
from .device import current_device_index
from .stream import Event, Stream, current_stream

__all__ = ["from_dlpack", "from_cuda_array_interface"]

_SUPPORTED = frozenset(SUPPORTED_DTYPES)
# PyCapsule_CheckExact is a C macro; datetime's C-API capsule gives us the type instead.
_CAPSULE_TYPE = type(datetime.datetime_CAPI)


def _np_dtype(code: int, bits: int, lanes: int) -> np.dtype:
    if lanes != 1:
        raise TypeError(f"from_dlpack: vector dtypes (lanes={lanes}) are not supported")
    if code == kDLBfloat and bits == 16:
        return BFLOAT16
    if code == kDLBool and bits == 8:
        return np.dtype(np.bool_)
    kind = {kDLFloat: "f", kDLInt: "i", kDLUInt: "u"}.get(code)
    if kind is None or bits % 8:
        raise TypeError(f"from_dlpack: DLPack dtype (code={code}, bits={bits}) is not supported")
    return normalize_dtype(np.dtype(f"{kind}{bits // 8}"), "from_dlpack", _SUPPORTED)


# ------------------------------------------------------------------------------------ import

class _DLPackOwner(OwnedPointer):
    """Holds an imported DLPack tensor (the address of its managed-tensor struct) and the producer.

    The producer's deleter runs once, when the last view dies (the library's ownership policy:
    not from interpreter exit on, and after the end of a capture in progress); a tensor without
    a deleter is borrowed.
    """

    def __init__(self, producer: Any, address: int, deleter: Any) -> None:
        self.producer = producer
        self._adopt(address, deleter, owned=deleter is not None)


def _device_of_pointer(ptr: int) -> int:
    if not ptr:
        return current_device_index()
    attrs = check(rt.cudaPointerGetAttributes(ptr), "cudaPointerGetAttributes")
    if attrs.type not in (rt.cudaMemoryType.cudaMemoryTypeDevice, rt.cudaMemoryType.cudaMemoryTypeManaged):
        raise TypeError(f"from_cuda_array_interface: pointer 0x{ptr:x} is not device memory "
                        f"({getattr(attrs.type, 'name', attrs.type)}); use to_device() for host data")
    return int(attrs.device)


def from_cuda_array_interface(obj: Any) -> DeviceArray:
    """Wrap an object exposing ``__cuda_array_interface__`` (v2/v3) without copying.

    The result keeps ``obj`` alive. When the interface names a stream, the current stream
    waits on it with an event (no host blocking), as CAI v3 asks of consumers.
    """
    cai = obj if isinstance(obj, dict) else obj.__cuda_array_interface__
    if cai.get("mask") is not None:
        raise ValueError("from_cuda_array_interface: masked arrays are not supported")
    shape = tuple(int(d) for d in cai["shape"])
    dtype = normalize_dtype(np.dtype(cai["typestr"]), "from_cuda_array_interface", _SUPPORTED)
    ptr, _readonly = cai["data"]
    ptr = int(ptr or 0)
    strides = cai.get("strides")
    index = _device_of_pointer(ptr)
    s = current_stream(index)
    theirs = cai.get("stream") if cai.get("version", 0) >= 3 else None
    if theirs is not None and int(theirs) != s.handle:
        event = Event(timing=False, device=index).record(Stream.from_handle(int(theirs), device=index))
        s.wait_event(event)
    return DeviceArray(obj, shape, dtype, ptr, strides=None if strides is None else tuple(strides),
                       device_index=index, stream=s)


def _is_capsule(obj: Any) -> bool:
    return type(obj) is _CAPSULE_TYPE


def from_dlpack(obj: Any) -> DeviceArray:
    """Wrap a device array from torch, CuPy, JAX... (or a raw DLPack capsule) without copying.

    ``__cuda_array_interface__`` is used when present and describable (torch's bfloat16 is not,
    then DLPack is used). Host (CPU) arrays are refused: use :func:`to_device` for those.
    """
    if isinstance(obj, DeviceArray):
        return obj
    if not _is_capsule(obj) and hasattr(type(obj), "__cuda_array_interface__"):
        try:
            return from_cuda_array_interface(obj)
        except (TypeError, ValueError, AttributeError, KeyError, RuntimeError):
            # e.g. torch refuses CAI for bfloat16 or for tensors that require grad
            if not hasattr(obj, "__dlpack__"):
                raise
    if _is_capsule(obj):
        capsule, producer, s = obj, None, None
    else:
        if not hasattr(obj, "__dlpack__"):
            raise TypeError(f"from_dlpack: {type(obj).__name__} supports neither __dlpack__ nor "
                            "__cuda_array_interface__")
        device_type, device_id = obj.__dlpack_device__()
        if int(device_type) not in (kDLCUDA, kDLCUDAManaged):
            raise TypeError(f"from_dlpack: the array is on DLPack device type {int(device_type)}, not a CUDA "
                            "GPU; copy host data with dnnbind.to_device()")
        s = current_stream(int(device_id))
        try:
            capsule = obj.__dlpack__(stream=s.handle, max_version=(1, 0))
        except TypeError:  # producers that predate DLPack 1.0 keyword arguments
            capsule = obj.__dlpack__(stream=s.handle)
        producer = obj
    return _from_capsule(capsule, producer, s)


def _from_capsule(capsule: Any, producer: Any, stream: Any) -> DeviceArray:
    raw = ctypes.c_void_p(id(capsule))
    if pyapi.PyCapsule_IsValid(raw, NAME_VERSIONED):
        address = pyapi.PyCapsule_GetPointer(raw, NAME_VERSIONED)
        managed = DLManagedTensorVersioned.from_address(address)
        if managed.version.major > 1:
            raise BufferError(f"from_dlpack: DLPack {managed.version.major}.{managed.version.minor} is newer "
                              "than the 1.x this library understands")
        used = USED_NAME_VERSIONED
    elif pyapi.PyCapsule_IsValid(raw, NAME):
        address = pyapi.PyCapsule_GetPointer(raw, NAME)
        managed = DLManagedTensor.from_address(address)
        used = USED_NAME
    else:
        raise ValueError("from_dlpack: not a DLPack capsule, or one that was already consumed")
    tensor = managed.dl_tensor
    if tensor.device.device_type not in (kDLCUDA, kDLCUDAManaged):
        raise TypeError(f"from_dlpack: tensor is on DLPack device type {tensor.device.device_type}, not a "
                        "CUDA GPU; copy host data with dnnbind.to_device()")
    dtype = _np_dtype(tensor.dtype.code, tensor.dtype.bits, tensor.dtype.lanes)
    ndim = tensor.ndim
    shape = tuple(int(tensor.shape[i]) for i in range(ndim))
    strides = None
    if tensor.strides:
        strides = tuple(int(tensor.strides[i]) * dtype.itemsize for i in range(ndim))
    ptr = (tensor.data or 0) + int(tensor.byte_offset)
    index = int(tensor.device.device_id)
    deleter = managed.deleter if ctypes.cast(managed.deleter, ctypes.c_void_p).value else None
    # From here on the tensor is ours: rename so the capsule's destructor leaves it alone.
    pyapi.PyCapsule_SetName(capsule, used)
    owner = _DLPackOwner(producer, address, deleter)
    s = stream if stream is not None else current_stream(index)
    return DeviceArray(owner, shape, dtype, ptr, strides=strides, device_index=index, stream=s)
