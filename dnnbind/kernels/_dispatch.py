"""Shared plumbing of the public ops: backend routing, argument checks, ``out=`` handling.

Every public op calls :func:`route` once, after validating its arguments. It
returns the CUDA implementation module when the first array is a
:class:`dnnbind.cuda.DeviceArray`, or ``None`` for the NumPy reference. The
NumPy case is checked first with a plain ``type(...) is ndarray`` test because
it runs on every call of the CPU backend, and it never imports the CUDA room.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

import numpy as np

from .. import backend as _backend
from .._validate import BFLOAT16
from ..backend import is_device_array

__all__ = [
    "route",
    "as_array",
    "check_float",
    "check_same_dtype",
    "compute_dtype",
    "to_compute",
    "finish",
    "check_out",
    "scalar",
    "BFLOAT16",
    "FLOAT_DTYPES",
]

_ndarray = np.ndarray
FLOAT_DTYPES = (np.dtype(np.float16), BFLOAT16, np.dtype(np.float32), np.dtype(np.float64))
_LOW_PRECISION = (np.dtype(np.float16), BFLOAT16)
_F32 = np.dtype(np.float32)
_F64 = np.dtype(np.float64)
_cuda_modules: dict[str, ModuleType] = {}


def _kind(x: Any) -> str:
    return "DeviceArray" if is_device_array(x) else type(x).__name__


def _cuda_module(family: str) -> ModuleType:
    module = _cuda_modules.get(family)
    if module is None:
        module = importlib.import_module(f"dnnbind.kernels._cuda.{family}")
        _cuda_modules[family] = module
    return module


def route(op: str, family: str, **arrays: Any) -> "ModuleType | None":
    """Pick the implementation from the first array; refuse a mix of devices.

    ``arrays`` are the op's array arguments by name, the primary one first
    (``None`` entries are ignored). Returns ``dnnbind.kernels._cuda.<family>`` when
    the primary is a DeviceArray and ``None`` when it is a NumPy array.
    """
    # Fast paths by exact type: every argument a DeviceArray (or None), or every one a
    # NumPy array (or None). Anything else takes the general path below, which also
    # builds the error messages.
    first = next(iter(arrays.values()))
    if type(first) is _ndarray:
        for value in arrays.values():
            if value is not None and type(value) is not _ndarray:
                break
        else:
            return None
    else:
        cls = _backend._device_array_type
        if cls is not None and type(first) is cls:
            for value in arrays.values():
                if value is not None and type(value) is not cls:
                    break
            else:
                module = _cuda_modules.get(family)
                return module if module is not None else _cuda_module(family)
    return _route_general(op, family, arrays)


def _refuse_tensors(op: str, arrays: "dict[str, Any]") -> None:
    for name, value in arrays.items():
        if hasattr(value, "_node") and hasattr(value, "data"):
            raise TypeError(f"kernels.{op} takes raw arrays (numpy.ndarray or DeviceArray), {name} got a dnnbind.Tensor: "
                            f"use dnnbind.ops (differentiable, on tensors) or pass the tensor's .data to the primitive")


def _route_general(op: str, family: str, arrays: "dict[str, Any]") -> "ModuleType | None":
    _refuse_tensors(op, arrays)
    it = iter(arrays.items())
    first_name, first = next(it)
    if type(first) is _ndarray:
        for name, value in it:
            if value is not None and type(value) is not _ndarray and is_device_array(value):
                raise TypeError(
                    f"{op}: {first_name} is a numpy.ndarray but {name} is a DeviceArray; put both on the "
                    "same device (dnnbind.backend.asarray(...) or DeviceArray.to_host())"
                )
        return None
    if is_device_array(first):
        for name, value in it:
            if value is not None and not is_device_array(value) and hasattr(value, "shape"):
                raise TypeError(
                    f"{op}: {first_name} is a DeviceArray but {name} is a {type(value).__name__}; put both "
                    "on the same device (dnnbind.backend.asarray(...) or DeviceArray.to_host())"
                )
        return _cuda_module(family)
    for name, value in it:
        if value is not None and type(value) is not _ndarray and is_device_array(value):
            raise TypeError(f"{op}: {first_name} is a {_kind(first)} but {name} is a DeviceArray")
    return None


def as_array(x: Any) -> Any:
    """NumPy arrays and DeviceArrays pass through; anything else becomes a NumPy array (a dnnbind.Tensor is
    refused: the primitives are not differentiable, and a silent host copy would hide that)."""
    t = type(x)
    if t is _ndarray or t is _backend._device_array_type or is_device_array(x):
        return x
    if hasattr(x, "_node") and hasattr(x, "data"):
        _refuse_tensors("primitive", {"x": x})
    return np.asarray(x)


def check_float(op: str, name: str, x: Any) -> None:
    if x.dtype not in FLOAT_DTYPES:
        raise TypeError(
            f"{op}: {name} must be float16, bfloat16, float32 or float64, got {x.dtype}"
        )


def check_same_dtype(op: str, a_name: str, a: Any, b_name: str, b: Any) -> None:
    if a.dtype != b.dtype:
        raise TypeError(f"{op}: {b_name} has dtype {b.dtype} but {a_name} has dtype {a.dtype}; they must match")


def param_dtype(dtype: np.dtype) -> np.dtype:
    """The dtype of the float parameters, statistics, masks and losses an op keeps for data of ``dtype``:
    float64 for float64 data, float32 for every other (float16/bfloat16 keep theirs in float32)."""
    return _F64 if dtype == _F64 else _F32


def compute_dtype(dtype: np.dtype) -> np.dtype:
    """float16/bfloat16 compute in float32 on the CPU; float32/float64 compute as they are."""
    return _F32 if dtype in _LOW_PRECISION else dtype


def to_compute(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float32) if x.dtype in _LOW_PRECISION else x


def check_out(op: str, out: Any, shape: "tuple[int, ...]", dtype: np.dtype) -> None:
    """``out=`` must have exactly the result's shape and dtype, and be writeable."""
    if out is None:
        return
    if tuple(out.shape) != tuple(shape) or out.dtype != dtype:
        raise ValueError(
            f"{op}: out has shape {tuple(out.shape)} and dtype {out.dtype}, expected shape "
            f"{tuple(shape)} and dtype {np.dtype(dtype)}"
        )
    if isinstance(out, np.ndarray) and not out.flags.writeable:
        raise ValueError(f"{op}: out (shape {tuple(out.shape)}, {out.dtype}) is read-only (flags.writeable is False: a "
                         "view of read-only memory, or np.broadcast_to); pass a writeable array, e.g. out.copy(), or "
                         "out=None")


def finish(result: np.ndarray, out: "np.ndarray | None", dtype: np.dtype) -> np.ndarray:
    """Return ``result`` as ``dtype``, written into ``out`` when one was given."""
    if out is not None:
        if out is not result:
            np.copyto(out, result, casting="unsafe")
        return out
    if result.dtype != dtype:
        return result.astype(dtype)
    return result


def scalar(value: Any, op: str, name: str) -> float:
    """A Python number or 0-d array (NumPy) as a float."""
    try:
        return float(np.asarray(value))
    except (TypeError, ValueError):
        raise TypeError(f"{op}: {name} must be a number or a 0-d array, got {value!r}") from None
