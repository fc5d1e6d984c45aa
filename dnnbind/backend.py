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

It is also ``keras.backend``: the Keras settings (``floatx``, ``epsilon``, ``image_data_format``,
``backend()``), Keras's dtype rules (``standardize_dtype``, ``result_type``, ``is_float_dtype``,
``is_int_dtype``; :mod:`dnnbind.ops` uses these), ``is_keras_tensor``, ``get_uid`` and ``clear_session``.

A shared leaf below :mod:`dnnbind.kernels`: it imports :mod:`dnnbind.cuda` only inside the functions
that need a GPU, because ``import dnnbind`` (which imports this module) must not load
cuda.bindings for a NumPy-only user, and must work where it is broken. Beyond that it imports only
:mod:`dnnbind._validate`, :mod:`dnnbind.errors` and :mod:`dnnbind.mixed_precision` (leaves): the rooms
above that keep global state ``clear_session`` resets register with :func:`on_clear_session`.
"""

from __future__ import annotations

import functools
import gc
import os
import sys
from typing import Any, Callable

import numpy as np

from . import mixed_precision
from ._validate import BFLOAT16, normalize_dtype
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


class device_scope:
    """``keras.device(device_name)``: a context manager under which arrays and models are made on
    ``device_name`` (``"cpu"``, ``"cuda"``, ``"gpu:0"``, ...): the default device is set on entry and
    restored on exit (also on an exception), so scopes nest."""

    def __init__(self, device_name: "str | Device") -> None:
        name = device_name
        if isinstance(name, str) and name.lower().startswith("gpu"):
            name = "cuda" + name[3:]
        self.device = resolve_device(name)
        self._saved: "list[Device | None]" = []

    def __enter__(self) -> Device:
        self._saved.append(_default)
        set_default_device(self.device)
        return self.device

    def __exit__(self, *exc: Any) -> None:
        global _default
        _default = self._saved.pop()


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
    """The device an array lives on (one Device object per device: nothing changes a Device)."""
    if is_device_array(x):
        index = x.device.index
        device = _cuda_devices.get(index)
        if device is None:
            device = _cuda_devices[index] = Device(f"cuda:{index}")
        return device
    return _CPU


_CPU = Device("cpu")
_cuda_devices: "dict[int, Device]" = {}


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
                                "for a conversion on the device: use dnnbind.ops.cast(x, dtype) (a tensor) or "
                                "dnnbind.kernels.cast(x, dtype) (a DeviceArray)")
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
    data_format = str(data_format).lower()  # as Keras
    if data_format not in ("channels_last", "channels_first"):
        raise ValueError(f"set_image_data_format: data_format must be 'channels_last' or 'channels_first', got "
                         f"{data_format!r}")
    _image_data_format = str(data_format)


def backend() -> str:
    """The name of the backend (``keras.config.backend``): ``"dnnbind"``."""
    return "dnnbind"


__all__ += ["floatx", "set_floatx", "epsilon", "set_epsilon", "image_data_format", "set_image_data_format",
            "backend"]


# ----- Keras's dtype rules (keras.backend: standardize_dtype, result_type, is_float_dtype, is_int_dtype) ------
# Pure dtype logic, kept in this leaf so that keras.backend needs no room above it; dnnbind.ops uses them.
def standardize_dtype(dtype: Any) -> str:
    """A dtype as Keras names it (``"float32"``, ``"bfloat16"``, ``"int32"``, ``"bool"``...)."""
    if dtype is None:
        return floatx()
    if dtype is int:
        return "int32"
    if dtype is float:
        return floatx()
    if dtype is bool:
        return "bool"
    if isinstance(dtype, str):
        if dtype in ("bfloat16", "bf16"):
            return "bfloat16"
        if dtype == "float":
            return floatx()
        if dtype == "int":
            return "int32"
    if hasattr(dtype, "dtype") and not isinstance(dtype, (type, np.dtype)):
        dtype = dtype.dtype
    try:
        dt = np.dtype(dtype)
    except TypeError:
        raise ValueError(f"invalid dtype {dtype!r}") from None
    if dt == BFLOAT16:
        return "bfloat16"
    return dt.name


_lattice = {
    "bool": ["int"], "uint8": ["int16", "uint16"], "uint16": ["int32", "uint32"], "uint32": ["int64", "uint64"],
    "uint64": ["float"], "int": ["uint8", "int8", "complex64"], "int8": ["int16"], "int16": ["int32"],
    "int32": ["int64"], "int64": ["float"], "float": ["bfloat16", "float16"], "bfloat16": ["float32"],
    "float16": ["float32"], "float32": ["float64", "complex64"], "float64": ["complex128"],
    "complex64": ["complex128"], "complex128": [],
}


def _upper_bounds() -> dict[str, set]:
    ub = {n: {n} for n in _lattice}
    changed = True
    while changed:
        changed = False
        for n in _lattice:
            new = set().union(*(set(_lattice[b]) for b in ub[n])) | ub[n]
            if new != ub[n]:
                ub[n], changed = new, True
    return ub


_UB = _upper_bounds()


@functools.lru_cache(maxsize=1024)
def _lub(nodes: frozenset) -> str:
    bounds = [_UB[n] for n in nodes]
    cub = set.intersection(*bounds)
    lub = (cub & set(nodes)) or {c for c in cub if cub.issubset(_UB[c])}
    if len(lub) != 1:
        raise ValueError(f"dtypes {sorted(nodes)} have no implicit promotion path; cast the inputs explicitly")
    return lub.pop()


def _weak_kind(name: str) -> str:
    if name == "bool":
        return "bool"
    if "complex" in name:
        return "complex64"
    return "float" if ("float" in name) else "int"


@functools.lru_cache(maxsize=4096)
def _result_type_key(key: tuple, default_float: str) -> str:
    names = [k[0] for k in key]
    weak = [k[1] for k in key]
    if len(key) == 1:
        out, out_weak = names[0], weak[0]
    elif len(set(names)) == 1 and not all(weak):
        out, out_weak = names[0], False
    elif all(weak):
        out, out_weak = _lub(frozenset(names)), True
    else:
        out = _lub(frozenset(_weak_kind(n) if w else n for n, w in zip(names, weak)))
        out_weak = out in ("int", "float")
    out_weak = out != "bool" and out_weak
    if out_weak or out in ("int", "float"):
        kind = out[:1] if out != "bfloat16" else "f"
        if kind == "b":
            return "bool"
        if kind == "i":
            return "int32"
        if kind == "u":
            return "uint32"
        if kind == "c":
            return "complex64"
        return default_float
    return out


def _dtype_key(value: Any) -> tuple:
    if value is None:
        return (floatx(), True)
    if isinstance(value, np.generic):  # a NumPy scalar (np.float64 is a float subclass) is strongly typed
        return (standardize_dtype(value.dtype), False)
    if isinstance(value, bool):
        return ("bool", True)
    if isinstance(value, int):
        return ("int32", True)
    if isinstance(value, float):
        return ("float32", True)
    if isinstance(value, complex):
        return ("complex64", True)
    if value is int:
        return ("int32", True)
    if value is float:
        return ("float32", True)
    if value is bool:
        return ("bool", True)
    if hasattr(value, "dtype") and not isinstance(value, (type, str)):  # tensors, variables, arrays
        return (standardize_dtype(value.dtype), False)
    return (standardize_dtype(value), False)


def result_type(*values: Any) -> str:
    """Keras's ``result_type`` (``keras.backend.result_type``) of tensors, arrays, dtypes and Python numbers
    (weak: ``result_type("float16", 1.0) == "float16"``), keeping 64-bit types (DESIGN, "dtypes"); no
    argument: the floatx."""
    if not values:
        return floatx()
    return _result_type_key(tuple(_dtype_key(v) for v in values), floatx())


def is_float_dtype(dtype: Any) -> bool:
    """Whether ``dtype`` is a float type (``keras.backend.is_float_dtype``: float16/32/64, bfloat16)."""
    return standardize_dtype(dtype).startswith(("float", "bfloat"))


def is_int_dtype(dtype: Any) -> bool:
    """Whether ``dtype`` is a signed or unsigned integer type (``keras.backend.is_int_dtype``)."""
    return standardize_dtype(dtype).startswith(("int", "uint"))


def is_keras_tensor(x: Any) -> bool:
    """Whether ``x`` is a symbolic tensor (``keras.Input`` and what layers make from it): an object with
    a ``_keras_history``, the mark ``dnnbind.layers.base.KerasTensor`` carries and the ops dispatch on."""
    return hasattr(x, "_keras_history")


# ----- Keras's global state: object names (keras.backend.get_uid) and clear_session --------------------------
#: prefix -> how many objects took it (Keras's ``object_name_uids``): layer names ("dense", "dense_1", ...)
#: and seed generator names come from here, and :func:`get_uid` counts on the same table, as in Keras.
object_name_uids: dict[str, int] = {}
_session_resets: list[Callable[[], None]] = []


def uniquify(prefix: str) -> str:
    """The next name for ``prefix``, as Keras names objects: ``prefix``, then ``prefix_1``, ``prefix_2``..."""
    count = object_name_uids.get(prefix, 0)
    object_name_uids[prefix] = count + 1
    return prefix if count == 0 else f"{prefix}_{count}"


def get_uid(prefix: str = "") -> int:
    """``keras.backend.get_uid``: one more object took ``prefix``; returns how many have (1 for the first)."""
    object_name_uids[prefix] = object_name_uids.get(prefix, 0) + 1
    return object_name_uids[prefix]


def on_clear_session(reset: Callable[[], None]) -> Callable[[], None]:
    """Register ``reset`` to run in :func:`clear_session`: how a room above this leaf (``random``'s global
    seed generator, ``config``'s switches) forgets its global state without this module importing it."""
    if reset not in _session_resets:
        _session_resets.append(reset)
    return reset


def clear_session(free_memory: bool = True) -> None:
    """``keras.backend.clear_session``: forget the global state Keras keeps, as Keras 3 does.

    Object names start again (the next ``Dense`` is ``dense``), :func:`get_uid` counts from 0, the global
    dtype policy is the floatx's again, and the rooms that registered with :func:`on_clear_session` reset:
    ``keras.random``'s global seed generator is made anew on its next use (from
    ``dnnbind.utils.draw_seed``), and ``keras.config``'s interactive-logging, traceback-filtering,
    flash-attention and unsafe-deserialization switches return to their defaults. ``floatx``,
    ``epsilon``, ``image_data_format`` and ``max_epochs`` are settings and stay, as in Keras.
    ``free_memory``: run Python's garbage collector afterwards.
    """
    object_name_uids.clear()
    mixed_precision.set_global_policy(floatx())
    for reset in list(_session_resets):
        reset()
    if free_memory:
        gc.collect()


__all__ += ["standardize_dtype", "result_type", "is_float_dtype", "is_int_dtype", "is_keras_tensor", "get_uid",
            "clear_session"]
