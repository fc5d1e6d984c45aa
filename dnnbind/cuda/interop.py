"""Zero-copy exchange with other GPU libraries: CUDA Array Interface v3 and DLPack.

Export: ``DeviceArray.__cuda_array_interface__`` and ``DeviceArray.__dlpack__`` (a
``"dltensor"`` capsule, or ``"dltensor_versioned"`` when the consumer asks for
``max_version >= (1, 0)``). The capsule's manager context keeps the array alive
until the consumer calls the deleter (or the unconsumed capsule dies).

Import: :func:`from_dlpack` prefers ``__cuda_array_interface__`` when the object
offers one, and otherwise parses the DLPack capsule with ctypes; either way the
result keeps the producer alive. Stream semantics follow both protocols: the
exporter makes the consumer's stream wait on its own with an event, never by
blocking the host.
"""

from __future__ import annotations

import ctypes
import threading
import weakref
from typing import Any

import numpy as np

from ._util import check, rt
from .array import _BF16, DeviceArray, normalize_dtype

__all__ = ["to_dlpack", "from_dlpack", "from_cuda_array_interface"]

kDLCPU, kDLCUDA, kDLCUDAHost, kDLCUDAManaged = 1, 2, 3, 13
_kDLInt, _kDLUInt, _kDLFloat, _kDLBfloat, _kDLBool = 0, 1, 2, 4, 6
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
_NAME = b"dltensor"
_NAME_V = b"dltensor_versioned"
_USED = b"used_dltensor"
_USED_V = b"used_dltensor_versioned"

_api = ctypes.pythonapi
_CapsuleDestructor = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_api.PyCapsule_New.restype = ctypes.py_object
_api.PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, _CapsuleDestructor]
_api.PyCapsule_IsValid.restype = ctypes.c_int
_api.PyCapsule_IsValid.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
_api.PyCapsule_GetPointer.restype = ctypes.c_void_p
_api.PyCapsule_GetPointer.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
_api.PyCapsule_SetName.restype = ctypes.c_int
_api.PyCapsule_SetName.argtypes = [ctypes.py_object, ctypes.c_char_p]
# PyCapsule_CheckExact is a C macro; datetime's C-API capsule gives us the type instead.
_CAPSULE_TYPE = type(__import__("datetime").datetime_CAPI)

# ------------------------------------------------------------------------------------ dtypes

def _dl_dtype(dt: np.dtype) -> tuple[int, int]:
    if _BF16 is not None and dt == _BF16:
        return _kDLBfloat, 16
    if dt == np.bool_:
        return _kDLBool, 8
    code = {"f": _kDLFloat, "i": _kDLInt, "u": _kDLUInt}[dt.kind]
    return code, dt.itemsize * 8


def _np_dtype(code: int, bits: int, lanes: int) -> np.dtype:
    if lanes != 1:
        raise TypeError(f"from_dlpack: vector dtypes (lanes={lanes}) are not supported")
    if code == _kDLBfloat and bits == 16 and _BF16 is not None:
        return _BF16
    if code == _kDLBool and bits == 8:
        return np.dtype(np.bool_)
    kind = {_kDLFloat: "f", _kDLInt: "i", _kDLUInt: "u"}.get(code)
    if kind is None or bits % 8:
        raise TypeError(f"from_dlpack: DLPack dtype (code={code}, bits={bits}) is not supported")
    return normalize_dtype(np.dtype(f"{kind}{bits // 8}"), "from_dlpack")


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
        for name in (_NAME, _NAME_V):
            if _api.PyCapsule_IsValid(capsule, name):
                _release_export(_api.PyCapsule_GetPointer(capsule, name))
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
    from .stream import as_stream

    return as_stream(stream).handle


def to_dlpack(array: DeviceArray, stream: Any = None, max_version: tuple[int, int] | None = None,
              dl_device: tuple[int, int] | None = None, copy: bool | None = None) -> Any:
    """Export ``array`` as a DLPack capsule (the ``__dlpack__`` protocol, DLPack 1.0 semantics)."""
    array._require_open("__dlpack__")
    if dl_device is not None and tuple(dl_device) != (kDLCUDA, array.device_index):
        raise BufferError(f"__dlpack__: cannot export to device {tuple(dl_device)}; the array is on "
                          f"(kDLCUDA, {array.device_index}); copy it explicitly (to_host / to)")
    if copy:
        from .array import empty

        array = empty(array.shape, array.dtype, stream=array.stream).copy_from(array)
    consumer = _consumer_handle(stream)
    producer = array.stream
    if consumer is not None and producer is not None and consumer != producer.handle:
        from .stream import Event

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
    code, bits = _dl_dtype(array.dtype)
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
    return _api.PyCapsule_New(address, _NAME_V if versioned else _NAME, _capsule_destructor)


# ------------------------------------------------------------------------------------ import

class _DLPackOwner:
    """Holds an imported DLPack tensor; calls the producer's deleter when the last view dies."""

    __slots__ = ("producer", "_finalizer", "__weakref__")

    def __init__(self, producer: Any, address: int, deleter: Any) -> None:
        self.producer = producer
        self._finalizer = weakref.finalize(self, _call_deleter, deleter, address) if deleter else None


def _call_deleter(deleter: Any, address: int) -> None:
    try:
        deleter(address)
    except Exception:
        pass


def _device_of_pointer(ptr: int) -> int:
    from .device import current_device_index

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
    from .stream import Event, Stream, current_stream

    cai = obj if isinstance(obj, dict) else obj.__cuda_array_interface__
    if cai.get("mask") is not None:
        raise ValueError("from_cuda_array_interface: masked arrays are not supported")
    shape = tuple(int(d) for d in cai["shape"])
    dtype = normalize_dtype(np.dtype(cai["typestr"]), "from_cuda_array_interface")
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
    from .stream import current_stream

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
    from .stream import current_stream

    raw = ctypes.c_void_p(id(capsule))
    if _api.PyCapsule_IsValid(raw, _NAME_V):
        address = _api.PyCapsule_GetPointer(raw, _NAME_V)
        managed = DLManagedTensorVersioned.from_address(address)
        if managed.version.major > 1:
            raise BufferError(f"from_dlpack: DLPack {managed.version.major}.{managed.version.minor} is newer "
                              "than the 1.x this library understands")
        used = _USED_V
    elif _api.PyCapsule_IsValid(raw, _NAME):
        address = _api.PyCapsule_GetPointer(raw, _NAME)
        managed = DLManagedTensor.from_address(address)
        used = _USED
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
    _api.PyCapsule_SetName(capsule, used)
    owner = _DLPackOwner(producer, address, deleter)
    s = stream if stream is not None else current_stream(index)
    return DeviceArray(owner, shape, dtype, ptr, strides=strides, device_index=index, stream=s)
