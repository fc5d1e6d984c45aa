"""ctypes declarations for NCCL (``libnccl.so.2``), taken from ``nvidia/nccl/include/nccl.h`` of the
``nvidia-nccl-cu12`` 2.32.3 wheel.

Why ctypes and not NVIDIA's ``nccl4py``: nccl4py 0.6.0 (checked with ``pip download nccl4py``)
requires ``cuda-core~=1.0`` (whose ``cu12`` extra pins ``cuda-bindings[all]==12.*`` and
``cuda-toolkit==12.*``), and its ``cu12``/``cu13`` extras add ``nvidia-cutlass-dsl~=4.6`` and one
``cuda-bindings`` major each; its wheels are per CPython version and its objects are cuda.core
streams and buffers rather than dnnbind's. dnnbind runs on cuda-bindings 12 *and* 13 from one
install and needs only a dozen host entry points that have kept their ABI since NCCL 2.10, so it
declares them here and finds ``libnccl`` with cuda-pathfinder (``nvidia-nccl-cu12`` / ``-cu13``
wheels, conda, the system), ``DNNBIND_NCCL_PATH`` overriding, as for cuDNN.

Only functions whose signature is stable across NCCL 2.10 .. 2.32 are declared (no
``ncclConfig_t``, whose layout grows with every release). ``ncclAvg`` needs NCCL >= 2.10 and
``ncclBfloat16`` CUDA >= 11 builds: both hold for every wheel on PyPI.
"""

from __future__ import annotations

import ctypes
import enum
from typing import Any, Mapping

from ..errors import NcclError
from ._binding import Binding

__all__ = ["Result", "RedOp", "DataType", "UniqueId", "UNIQUE_ID_BYTES", "SIGNATURES", "library", "raw", "call",
           "error", "check", "dtype_of", "version", "status_name"]

UNIQUE_ID_BYTES = 128  # NCCL_UNIQUE_ID_BYTES


class UniqueId(ctypes.Structure):
    """``ncclUniqueId``: 128 opaque bytes, passed *by value* to ``ncclCommInitRank``."""

    _fields_ = [("internal", ctypes.c_char * UNIQUE_ID_BYTES)]

    def to_bytes(self) -> bytes:
        return ctypes.string_at(ctypes.addressof(self), UNIQUE_ID_BYTES)

    @classmethod
    def from_bytes(cls, data: bytes) -> "UniqueId":
        if len(data) != UNIQUE_ID_BYTES:
            raise ValueError(f"an NCCL unique id is {UNIQUE_ID_BYTES} bytes, got {len(data)}")
        uid = cls()
        ctypes.memmove(ctypes.addressof(uid), data, UNIQUE_ID_BYTES)
        return uid


class Result(enum.IntEnum):
    """``ncclResult_t``."""

    SUCCESS = 0
    UNHANDLED_CUDA_ERROR = 1
    SYSTEM_ERROR = 2
    INTERNAL_ERROR = 3
    INVALID_ARGUMENT = 4
    INVALID_USAGE = 5
    REMOTE_ERROR = 6
    IN_PROGRESS = 7
    TIMEOUT = 8


_RESULT_NAMES = {
    0: "ncclSuccess", 1: "ncclUnhandledCudaError", 2: "ncclSystemError", 3: "ncclInternalError",
    4: "ncclInvalidArgument", 5: "ncclInvalidUsage", 6: "ncclRemoteError", 7: "ncclInProgress",
    8: "ncclTimeout",
}


class RedOp(enum.IntEnum):
    """``ncclRedOp_t`` (the built-in ones)."""

    SUM = 0
    PROD = 1
    MAX = 2
    MIN = 3
    AVG = 4


class DataType(enum.IntEnum):
    """``ncclDataType_t``."""

    INT8 = 0
    UINT8 = 1
    INT32 = 2
    UINT32 = 3
    INT64 = 4
    UINT64 = 5
    FLOAT16 = 6
    FLOAT32 = 7
    FLOAT64 = 8
    BFLOAT16 = 9


_p = ctypes.c_void_p
_int_p = ctypes.POINTER(ctypes.c_int)
_size = ctypes.c_size_t

#: status-returning functions (restype ncclResult_t = int): argtypes as in nccl.h
SIGNATURES: dict[str, tuple[Any, ...]] = {
    "ncclGetVersion": (_int_p,),
    "ncclGetUniqueId": (ctypes.POINTER(UniqueId),),
    # (ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank)
    "ncclCommInitRank": (ctypes.POINTER(_p), ctypes.c_int, UniqueId, ctypes.c_int),
    "ncclCommFinalize": (_p,),
    "ncclCommDestroy": (_p,),
    "ncclCommAbort": (_p,),
    "ncclCommGetAsyncError": (_p, _int_p),
    "ncclCommCount": (_p, _int_p),
    "ncclCommCuDevice": (_p, _int_p),
    "ncclCommUserRank": (_p, _int_p),
    # (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t)
    "ncclAllReduce": (_p, _p, _size, ctypes.c_int, ctypes.c_int, _p, _p),
    # (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t, int root, ncclComm_t, cudaStream_t)
    "ncclBroadcast": (_p, _p, _size, ctypes.c_int, ctypes.c_int, _p, _p),
    # (const void* sendbuff, void* recvbuff, size_t sendcount, ncclDataType_t, ncclComm_t, cudaStream_t)
    "ncclAllGather": (_p, _p, _size, ctypes.c_int, _p, _p),
    # (const void* sendbuff, void* recvbuff, size_t recvcount, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t)
    "ncclReduceScatter": (_p, _p, _size, ctypes.c_int, ctypes.c_int, _p, _p),
    "ncclGroupStart": (),
    "ncclGroupEnd": (),
}

_PLAIN: dict[str, tuple[tuple[Any, ...], Any]] = {
    "ncclGetErrorString": ((ctypes.c_int,), ctypes.c_char_p),
    "ncclGetLastError": ((_p,), ctypes.c_char_p),
}


def status_name(status: int) -> str:
    """``ncclInvalidUsage`` for 5."""
    return _RESULT_NAMES.get(int(status), f"ncclResult_{int(status)}")


_HINTS = {
    Result.UNHANDLED_CUDA_ERROR: "a CUDA call inside NCCL failed: check the device (out of memory?) and "
                                 "that every rank uses a different GPU (LOCAL_RANK).",
    Result.SYSTEM_ERROR: "a system call failed (sockets, shared memory): check the network interfaces "
                         "(NCCL_SOCKET_IFNAME) and /dev/shm; NCCL_DEBUG=WARN shows more.",
    Result.REMOTE_ERROR: "another rank failed or went away: look at the other ranks' errors.",
    Result.INVALID_USAGE: "the ranks disagree (sizes, dtypes, order of collectives) or an argument is wrong; "
                          "NCCL_DEBUG=WARN shows more.",
}


def error(status: int, function: str, context: "Mapping[str, Any] | None" = None) -> NcclError:
    """The :class:`NcclError` for a failed call: NCCL's status string and its last error message."""
    detail = ""
    try:
        lib = library()
        text = lib.ncclGetErrorString(int(status))
        detail = text.decode(errors="replace") if text else ""
        last = lib.ncclGetLastError(None)
        if last:
            last_text = last.decode(errors="replace").strip()
            if last_text and last_text not in detail:
                detail = f"{detail}; last error: {last_text}" if detail else last_text
    except Exception:  # the library itself is broken: the status name still says what failed
        pass
    try:
        hint = _HINTS.get(Result(int(status)), "")
    except ValueError:
        hint = ""
    return NcclError(int(status), status_name(status), function, detail=detail, context=context, hint=hint)


def check(status: int, function: str, **context: Any) -> None:
    """Raise :class:`NcclError` when ``status`` is not ncclSuccess."""
    if status:
        raise error(status, function, context)


_binding = Binding("nccl", SIGNATURES, _PLAIN, error)
library = _binding.library
raw = _binding.raw
call = _binding.call

_DTYPES = {"int8": DataType.INT8, "uint8": DataType.UINT8, "bool": DataType.UINT8, "int32": DataType.INT32,
           "uint32": DataType.UINT32, "int64": DataType.INT64, "uint64": DataType.UINT64,
           "float16": DataType.FLOAT16, "float32": DataType.FLOAT32, "float64": DataType.FLOAT64,
           "bfloat16": DataType.BFLOAT16}


def dtype_of(dtype: Any) -> DataType:
    """The ``ncclDataType_t`` of a NumPy dtype (``ml_dtypes.bfloat16`` included); ValueError otherwise."""
    import numpy as np

    name = np.dtype(dtype).name
    try:
        return _DTYPES[name]
    except KeyError:
        raise ValueError(f"NCCL has no data type for {name}; supported: {sorted(_DTYPES)}") from None


def version() -> int:
    """The loaded library's version code (``23203`` = 2.32.3)."""
    value = ctypes.c_int()
    call("ncclGetVersion", ctypes.byref(value))
    return int(value.value)


__getattr__, __dir__ = _binding.module_hooks(globals())
