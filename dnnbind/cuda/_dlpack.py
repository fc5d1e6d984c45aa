"""The DLPack ABI (``dlpack.h``'s structs, capsule names and dtype codes) and the export of a device
array as a DLPack capsule.

Below :mod:`.array` (whose ``__dlpack__`` calls :func:`export`) and :mod:`.interop` (which parses
capsules into DeviceArrays): it knows a device array only by its attributes (``ptr``, ``shape``,
``strides`` in bytes, ``itemsize``, ``dtype``, ``device_index``, ``stream``).
"""

from __future__ import annotations

import ctypes
import threading
from typing import Any

import numpy as np

from .._validate import BFLOAT16
from ._util import check, rt
from .stream import Event, as_stream

__all__ = ["export", "dl_dtype", "DLDevice", "DLDataType", "DLTensor", "DLManagedTensor", "DLPackVersion",
           "DLManagedTensorVersioned", "kDLCPU", "kDLCUDA", "kDLCUDAHost", "kDLCUDAManaged"]

kDLCPU, kDLCUDA, kDLCUDAHost, kDLCUDAManaged = 1, 2, 3, 13
kDLInt, kDLUInt, kDLFloat, kDLBfloat, kDLBool = 0, 1, 2, 4, 6
_READ_ONLY = 1


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


_DeleterFn = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", _DeleterFn)]


class DLPackVersion(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class DLManagedTensorVersioned(ctypes.Structure):
    _fields_ = [
        ("version", DLPackVersion),
        ("manager_ctx", ctypes.c_void_p),
        ("deleter", _DeleterFn),
        ("flags", ctypes.c_uint64),
        ("dl_tensor", DLTensor),
    ]


# Capsule names must outlive every capsule: module-level bytes are never freed.
NAME = b"dltensor"
NAME_VERSIONED = b"dltensor_versioned"
USED_NAME = b"used_dltensor"
USED_NAME_VERSIONED = b"used_dltensor_versioned"

pyapi = ctypes.pythonapi
_CapsuleDestructor = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
pyapi.PyCapsule_New.restype = ctypes.py_object
pyapi.PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, _CapsuleDestructor]
pyapi.PyCapsule_IsValid.restype = ctypes.c_int
pyapi.PyCapsule_IsValid.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
pyapi.PyCapsule_GetPointer.restype = ctypes.c_void_p
pyapi.PyCapsule_GetPointer.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
pyapi.PyCapsule_SetName.restype = ctypes.c_int
pyapi.PyCapsule_SetName.argtypes = [ctypes.py_object, ctypes.c_char_p]

# ------------------------------------------------------------------------------------ dtypes

def dl_dtype(dt: np.dtype) -> tuple[int, int]:
    """(DLDataTypeCode, bits) of a NumPy dtype."""
    if dt == BFLOAT16:
        return kDLBfloat, 16
    if dt == np.bool_:
        return kDLBool, 8
    code = {"f": kDLFloat, "i": kDLInt, "u": kDLUInt}[dt.kind]
    return code, dt.itemsize * 8


# ------------------------------------------------------------------------------------ export

_exports: dict[int, tuple] = {}  # address of the managed struct -> what must stay alive
_exports_lock = threading.Lock()


def _release_export(address: int) -> None:
    with _exports_lock:
        _exports.pop(address, None)


@_DeleterFn
def _deleter(address):  # called by the consumer when it is done with the tensor
    if address:
        _release_export(address)


@_CapsuleDestructor
def _capsule_destructor(capsule):
    # Only an unconsumed capsule still carries our name; a consumer renamed it and owns it.
    try:
        for name in (NAME, NAME_VERSIONED):
            if pyapi.PyCapsule_IsValid(capsule, name):
                _release_export(pyapi.PyCapsule_GetPointer(capsule, name))
                return
    except Exception:  # never raise out of a destructor
        pass


def _consumer_handle(stream: Any) -> int | None:
    """Raw handle of the consumer's stream per the DLPack CUDA rules (None: no sync wanted)."""
    if stream is None or stream == 0:
        return 1  # legacy default stream (cudaStreamLegacy)
    if stream == -1:
        return None
    if isinstance(stream, int):
        return stream
    return as_stream(stream).handle


def export(array: Any, stream: Any = None, max_version: "tuple[int, int] | None" = None) -> Any:
    """A DLPack capsule of a device array (``DeviceArray.__dlpack__`` checks the array and the target
    device, and makes the copy when one is asked for): the consumer's ``stream`` waits on the
    array's stream with an event; the capsule keeps ``array`` alive until the consumer's deleter runs
    (or the unconsumed capsule dies)."""
    consumer = _consumer_handle(stream)
    producer = array.stream
    if consumer is not None and producer is not None and consumer != producer.handle:
        event = Event(timing=False, device=array.device_index).record(producer)
        check(rt.cudaStreamWaitEvent(consumer, event.handle, 0), "cudaStreamWaitEvent")

    ndim = array.ndim
    shape = (ctypes.c_int64 * max(ndim, 1))(*array.shape)
    strides = (ctypes.c_int64 * max(ndim, 1))(*(s // array.itemsize for s in array.strides))
    versioned = max_version is not None and tuple(max_version)[0] >= 1
    managed = DLManagedTensorVersioned() if versioned else DLManagedTensor()
    tensor = managed.dl_tensor
    tensor.data = array.ptr or None
    tensor.device = DLDevice(kDLCUDA, array.device_index)
    tensor.ndim = ndim
    code, bits = dl_dtype(array.dtype)
    tensor.dtype = DLDataType(code, bits, 1)
    tensor.shape = ctypes.cast(shape, ctypes.POINTER(ctypes.c_int64))
    tensor.strides = ctypes.cast(strides, ctypes.POINTER(ctypes.c_int64))
    tensor.byte_offset = 0
    managed.deleter = _deleter
    if versioned:
        managed.version = DLPackVersion(1, 0)
        managed.flags = 0
    address = ctypes.addressof(managed)
    managed.manager_ctx = address
    with _exports_lock:
        _exports[address] = (array, managed, shape, strides)
    return pyapi.PyCapsule_New(address, NAME_VERSIONED if versioned else NAME, _capsule_destructor)
