"""Choose where computation runs: the CUDA backend (cuDNN/cuBLAS) or the NumPy backend.

The choice is made once, in this order: an explicit argument, then
:func:`set_default_device`, then the ``DNNBIND_DEVICE`` environment variable,
then what is available (the first GPU when one is usable, else the CPU).

Devices are spelled as in PyTorch: ``"cpu"``, ``"cuda"`` (the current GPU) and
``"cuda:N"``. On the CPU, arrays are NumPy arrays; on a GPU they are
:class:`dnnbind.cuda.DeviceArray`. Nothing here converts between the two
silently: :func:`asarray` and :func:`to_numpy` are the explicit transfers.

:class:`Device` (``dnnbind.Device``) says where computation runs; the GPU itself, with its
properties, is :class:`dnnbind.cuda.CudaDevice`.

A shared leaf below :mod:`dnnbind.kernels`: it imports :mod:`dnnbind.cuda` only inside the functions
that need a GPU, because ``import dnnbind`` (which imports this module) must not load
cuda.bindings for a NumPy-only user, and must work where it is broken.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import numpy as np

from ._validate import normalize_dtype
from .errors import DnnbindError, NoDeviceError

__all__ = [
    "Device",
    "resolve_device",
    "default_device",
    "set_default_device",
    "device_of",
    "is_device_array",
    "asarray",
    "to_numpy",
]

_default: "Device | None" = None
_announced = False


class Device:
    """A compute device: ``Device("cpu")`` or ``Device("cuda:0")``."""

    __slots__ = ("type", "index")

    def __init__(self, spec: "str | Device" = "cpu") -> None:
        if isinstance(spec, Device):
            self.type, self.index = spec.type, spec.index
            return
        if not isinstance(spec, str):
            raise TypeError(f"device must be a string like 'cpu', 'cuda' or 'cuda:1', got {spec!r}")
        text = spec.strip().lower()
        if text in ("cpu", "numpy"):
            self.type, self.index = "cpu", None
        elif text in ("cuda", "gpu"):
            self.type, self.index = "cuda", None
        elif text.startswith(("cuda:", "gpu:")):
            _, _, number = text.partition(":")
            if not number.isdigit():
                raise ValueError(f"invalid device {spec!r}: the index after 'cuda:' must be a number")
            self.type, self.index = "cuda", int(number)
        else:
            raise ValueError(f"unknown device {spec!r}; use 'cpu', 'cuda' or 'cuda:N'")

    @property
    def is_cuda(self) -> bool:
        return self.type == "cuda"

    def __eq__(self, other: object) -> bool:
        if isinstance(other, str):
            try:
                other = Device(other)
            except (TypeError, ValueError):
                return False
        return isinstance(other, Device) and (self.type, self.index) == (other.type, other.index)

    def __hash__(self) -> int:
        return hash((self.type, self.index))

    def __str__(self) -> str:
        return self.type if self.index is None else f"{self.type}:{self.index}"

    def __repr__(self) -> str:
        return f"Device('{self}')"


def _cuda_available() -> bool:
    try:
        from . import cuda  # deferred: see the module docstring
    except Exception:  # cuda-bindings missing or broken: the CPU backend still works
        return False
    return cuda.is_available()


def _announce_cpu(reason: str) -> None:
    global _announced
    if not _announced:
        _announced = True
        print(f"dnnbind: {reason}, using the CPU (NumPy) backend", file=sys.stderr)


def _check_cuda(device: Device) -> Device:
    from . import cuda  # deferred: see the module docstring

    if not cuda.is_available():
        raise NoDeviceError(
            f"device '{device}' was requested but no usable CUDA GPU was found "
            f"({cuda.unavailable_reason()}). Run `python -m dnnbind doctor` for a diagnosis, "
            "or use device='cpu'."
        )
    index = cuda.current_device_index() if device.index is None else device.index
    count = cuda.device_count()
    if index >= count:
        raise NoDeviceError(f"device '{device}' was requested but only {count} CUDA device(s) exist")
    return Device(f"cuda:{index}")


def resolve_device(device: "str | Device | None" = None) -> Device:
    """Return the concrete device for ``device`` (``None`` means the default)."""
    if device is None:
        return default_device()
    dev = Device(device)
    return _check_cuda(dev) if dev.is_cuda else dev


def default_device() -> Device:
    """The device used when none is given (see the module docstring for the order)."""
    global _default
    if _default is not None:
        return _default
    env = os.environ.get("DNNBIND_DEVICE", "").strip()
    if env:
        _default = resolve_device(env)
    elif _cuda_available():
        _default = resolve_device("cuda")
    else:
        from . import cuda  # deferred: see the module docstring

        _announce_cpu(f"no GPU ({cuda.unavailable_reason()})")
        _default = Device("cpu")
    return _default


def set_default_device(device: "str | Device | None") -> Device | None:
    """Set the default device (``None`` forgets the choice and re-detects)."""
    global _default
    _default = None if device is None else resolve_device(device)
    return _default


_device_array_type: "type | None" = None  # dnnbind.cuda.DeviceArray, imported on first need


def _load_device_array_type() -> type:
    global _device_array_type
    from .cuda.array import DeviceArray  # deferred: see the module docstring

    _device_array_type = DeviceArray
    return DeviceArray


def is_device_array(x: Any) -> bool:
    """True for a :class:`dnnbind.cuda.DeviceArray` (without importing CUDA for NumPy input)."""
    # Hot path of every op: the class is looked up once (an import statement inside the
    # function cost ~1 µs per call), and the exact-type test answers the common case.
    cls = _device_array_type
    if cls is None:
        if isinstance(x, (np.ndarray, np.generic)):
            return False
        cls = _load_device_array_type()
    return type(x) is cls or isinstance(x, cls)


def device_of(x: Any) -> Device:
    """The device an array lives on."""
    if is_device_array(x):
        return Device(f"cuda:{x.device.index}")
    return Device("cpu")


def asarray(x: Any, device: "str | Device | None" = None, dtype: Any = None, stream: Any = None):
    """Put ``x`` on ``device`` (an explicit host-to-device transfer when it is a GPU).

    ``dtype`` converts host data before the transfer. A DeviceArray is never converted here (that
    is an op on the device): one of another dtype raises a TypeError that names
    :func:`dnnbind.kernels.cast`.
    """
    dev = resolve_device(device)
    if dev.is_cuda:
        from .cuda import to_device  # deferred: see the module docstring

        if is_device_array(x):
            if dtype is not None and normalize_dtype(dtype, "backend.asarray") != x.dtype:
                raise TypeError(f"backend.asarray: x is a DeviceArray of dtype {x.dtype}, and dtype={dtype!r} asks "
                                "for a conversion on the device: use dnnbind.kernels.cast(x, dtype)")
            if x.device.index != dev.index:
                return x.to(str(dev))
            return x
        arr = np.asarray(x, dtype=dtype)
        return to_device(arr, stream=stream, device=dev.index)
    if is_device_array(x):
        raise DnnbindError(
            "refusing to move a DeviceArray to the CPU implicitly; call .to_host() (or .numpy()) "
            "to copy it explicitly"
        )
    return np.asarray(x, dtype=dtype)


def to_numpy(x: Any, stream: Any = None) -> np.ndarray:
    """Explicit device-to-host copy (NumPy input is returned as it is)."""
    if is_device_array(x):
        return x.to_host(stream=stream)
    return np.asarray(x)


# ----- Keras's backend configuration (keras.config / keras.backend) -----------------------------------
_floatx = "float32"
_epsilon = 1e-7
_image_data_format = "channels_last"


def floatx() -> str:
    """The default float dtype of new tensors and variables (``keras.config.floatx``)."""
    return _floatx


def set_floatx(value: str) -> None:
    """Set the default float dtype: ``"float16"``, ``"bfloat16"``, ``"float32"`` or ``"float64"``."""
    global _floatx
    if value not in ("float16", "bfloat16", "float32", "float64"):
        raise ValueError(f"set_floatx: unknown floatx {value!r}; expected one of 'float16', 'bfloat16', "
                         "'float32', 'float64'")
    _floatx = str(value)


def epsilon() -> float:
    """The fuzz factor used in numeric expressions (``keras.config.epsilon``, 1e-7)."""
    return _epsilon


def set_epsilon(value: float) -> None:
    global _epsilon
    _epsilon = float(value)


def image_data_format() -> str:
    """``"channels_last"`` (the default) or ``"channels_first"`` (``keras.config.image_data_format``)."""
    return _image_data_format


def set_image_data_format(data_format: str) -> None:
    global _image_data_format
    if data_format not in ("channels_last", "channels_first"):
        raise ValueError(f"set_image_data_format: data_format must be 'channels_last' or 'channels_first', got "
                         f"{data_format!r}")
    _image_data_format = str(data_format)


def backend() -> str:
    """The name of the backend (``keras.config.backend``): ``"dnnbind"``."""
    return "dnnbind"


__all__ += ["floatx", "set_floatx", "epsilon", "set_epsilon", "image_data_format", "set_image_data_format",
            "backend"]
