"""Argument checks shared by the Keras entry points (``Sequential.compile/fit/evaluate/predict/...``),
the layer constructors and ``build``, and the Python-level hyper-parameters of ``kernels.optim``.

Every check runs before any C call or allocation and raises with one message form::

    <owner>: <name> must be <what>, got <actual>

``owner`` says who was called, e.g. ``"Sequential 'net': fit"`` or ``"Dense 'dense_1'"``. A value
of the wrong type raises :class:`ArgumentTypeError`, which is both a ``TypeError`` and a
``ValueError`` (Keras 3 raises ``ValueError`` for, say, ``Dense(2.5)``; Python code expects
``TypeError``); a value of the right type out of range raises ``ValueError``.

A shared leaf, like :mod:`dnnbind.errors`: it imports nothing else from dnnbind, so every room
(``cuda``, ``cudnn``, ``cublas``, ``ops``, ``layers``, ``models``) may use it. It holds the one dtype
normaliser, :func:`normalize_dtype`, for the same reason.
"""

from __future__ import annotations

import math
import numbers
import os
from typing import Any, Iterable, Sequence

import ml_dtypes
import numpy as np

from .errors import AllocationTooLargeError

__all__ = [
    "ArgumentTypeError", "integer", "positive_int", "non_negative_int", "optional_positive_int", "boolean",
    "number", "one_of", "shape", "int_pair", "instances", "finite_array", "check_allocation", "human_bytes",
    "BFLOAT16", "normalize_dtype",
]

BFLOAT16 = np.dtype(ml_dtypes.bfloat16)


class ArgumentTypeError(TypeError, ValueError):
    """An argument of the wrong type (an int expected, a float given...): a ``TypeError`` that
    ``except ValueError`` (Keras 3's type for these) also catches."""


def _describe(value: Any) -> str:
    text = repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{type(value).__name__} {text}" if not isinstance(value, (str, type(None))) else text


def integer(value: Any, name: str, owner: str, *, minimum: int | None = None) -> int:
    """``value`` as an int: a Python or NumPy integer (not a bool, not a float such as 2.0 or 2.7),
    at least ``minimum`` when given."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (numbers.Integral, np.integer)):
        raise ArgumentTypeError(f"{owner}: {name} must be an int, got {_describe(value)}")
    value = int(value)
    if minimum is not None and value < minimum:
        what = "a positive int" if minimum == 1 else f"an int >= {minimum}"
        raise ValueError(f"{owner}: {name} must be {what}, got {value}")
    return value


def positive_int(value: Any, name: str, owner: str) -> int:
    """An int >= 1 (batch sizes, units, filters...)."""
    return integer(value, name, owner, minimum=1)


def non_negative_int(value: Any, name: str, owner: str) -> int:
    """An int >= 0 (epochs, initial_epoch, seeds...)."""
    return integer(value, name, owner, minimum=0)


def optional_positive_int(value: Any, name: str, owner: str, default: Any = None) -> Any:
    """``default`` for None, else :func:`positive_int`."""
    return default if value is None else positive_int(value, name, owner)


def boolean(value: Any, name: str, owner: str) -> bool:
    """A bool (Python or NumPy); ints 0 and 1 pass too, as Keras code often writes them."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (numbers.Integral, np.integer)) and int(value) in (0, 1):
        return bool(value)
    raise ArgumentTypeError(f"{owner}: {name} must be True or False, got {_describe(value)}")


def number(value: Any, name: str, owner: str, *, low: float | None = None, high: float | None = None,
           low_open: bool = False, high_open: bool = False) -> float:
    """A finite real number (Python or NumPy scalar, not a bool) in the given range, as a float.

    ``low``/``high`` bound it (inclusive unless ``low_open``/``high_open``); the message writes the
    range in interval notation: ``validation_split must be in [0, 1), got 1.0``.
    """
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (numbers.Real, np.integer, np.floating)):
        raise ArgumentTypeError(f"{owner}: {name} must be a number, got {_describe(value)}")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{owner}: {name} must be a finite number, got {value}")
    below = low is not None and (value <= low if low_open else value < low)
    above = high is not None and (value >= high if high_open else value > high)
    if below or above:
        if low is not None and high is not None:
            what = f"in {'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
        elif low is not None:
            what = f"{'>' if low_open else '>='} {low:g}"
        else:
            what = f"{'<' if high_open else '<='} {high:g}"
        raise ValueError(f"{owner}: {name} must be {what}, got {value:g}")
    return value


def one_of(value: Any, name: str, owner: str, allowed: Sequence[Any]) -> Any:
    """``value`` if it equals one of ``allowed`` (compared by type too: ``1.0`` is not ``1``)."""
    for option in allowed:
        same_kind = isinstance(value, str) == isinstance(option, str)
        if same_kind and type(value) is not float and value == option:
            return value
    names = ", ".join(repr(a) for a in allowed)
    raise ValueError(f"{owner}: {name} must be one of {names}, got {_describe(value)}")


def shape(value: Any, name: str, owner: str, *, allow_none: bool = False) -> tuple[int, ...]:
    """A sample shape (no batch axis): an int or a sequence of positive ints; every dimension known, unless
    ``allow_none`` (a variable-length axis of a layer written in ``keras.ops``, which reads its shapes at call
    time)."""
    if isinstance(value, (numbers.Integral, np.integer)) and not isinstance(value, (bool, np.bool_)):
        value = (value,)
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise ArgumentTypeError(f"{owner}: {name} must be a tuple of ints such as (28, 28, 1), got "
                                f"{_describe(value)}")
    dims = tuple(value)
    for i, d in enumerate(dims):
        if d is None:
            if allow_none:
                continue
            raise ValueError(f"{owner}: every dimension of {name} must be known, got {dims} (None at index {i}); "
                             "dnnbind needs fixed shapes and the batch axis is left out")
        if isinstance(d, (bool, np.bool_)) or not isinstance(d, (numbers.Integral, np.integer)):
            raise ArgumentTypeError(f"{owner}: {name} must hold ints, got {dims} ({_describe(d)} at index {i})")
        if d < 1:
            raise ValueError(f"{owner}: every dimension of {name} must be >= 1, got {dims} ({int(d)} at index {i})")
    return tuple(None if d is None else int(d) for d in dims)


def int_pair(value: Any, name: str, owner: str, *, minimum: int = 1) -> tuple[int, int]:
    """An int or a pair of ints (kernel sizes, strides...), each at least ``minimum``."""
    items = (value, value) if not isinstance(value, (list, tuple)) else tuple(value)
    if len(items) != 2:
        raise ValueError(f"{owner}: {name} must be an int or a pair of ints (height, width), got {value!r}")
    for v in items:
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, (numbers.Integral, np.integer)):
            raise ArgumentTypeError(f"{owner}: {name} must be an int or a pair of ints, got {_describe(value)}")
        if v < minimum:
            raise ValueError(f"{owner}: {name} must be >= {minimum}, got {value!r}")
    return int(items[0]), int(items[1])


def instances(value: Any, cls: type, name: str, owner: str) -> list:
    """None, one ``cls`` instance, or a list/tuple of them, as a list."""
    if value is None:
        return []
    if isinstance(value, cls):
        return [value]
    if not isinstance(value, (list, tuple)):
        raise ArgumentTypeError(f"{owner}: {name} must be a list of {cls.__name__} instances, got "
                                f"{_describe(value)}")
    for i, item in enumerate(value):
        if not isinstance(item, cls):
            hint = " (pass an instance, not the class)" if isinstance(item, type) and issubclass(item, cls) else ""
            raise ArgumentTypeError(f"{owner}: {name}[{i}] must be a {cls.__module__}.{cls.__name__} instance, "
                                    f"got {_describe(item)}{hint}")
    return list(value)


_CHUNK_ELEMENTS = 1 << 22  # bounds the temporary mask of finite_array to 4 MB


def finite_array(array: np.ndarray, name: str, owner: str, hint: str = "") -> None:
    """Refuse a host array holding NaN or inf: the message gives the count and the first bad sample
    (index along axis 0). Integer arrays pass at once; float ones are scanned in row chunks."""
    if (array.dtype.kind not in "fc" and array.dtype != BFLOAT16) or array.size == 0:
        return
    rows = array.reshape(len(array), -1) if array.ndim > 1 else array.reshape(-1, 1)
    step = max(1, _CHUNK_ELEMENTS // max(1, rows.shape[1]))
    count, first = 0, None
    for start in range(0, len(rows), step):
        bad = ~np.isfinite(rows[start:start + step])
        n = int(np.count_nonzero(bad))
        if n:
            if first is None:
                first = start + int(np.argmax(bad.any(axis=1)))
            count += n
    if count:
        raise ValueError(f"{owner}: {name} holds {count} non-finite value{'s' if count != 1 else ''} (NaN or inf), "
                         f"the first in sample {first}{'; ' + hint if hint else ''}")


def _available_host_bytes() -> int | None:
    """MemAvailable + SwapFree from /proc/meminfo (Linux), else the physical memory; None if unknown."""
    try:
        with open("/proc/meminfo") as f:
            info = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in f if line.split()[1:]}
        if "MemAvailable" in info:
            return info["MemAvailable"] + info.get("SwapFree", 0)
    except (OSError, ValueError, IndexError):
        pass
    try:
        return int(os.sysconf("SC_PHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return None


def check_allocation(nbytes: int, what: str, owner: str, *, device_total: int | None = None,
                     device: str = "") -> None:
    """Refuse, before trying, an allocation that cannot fit: more than the host's available memory
    (initial values are made on the host on every backend), or more than ``device_total`` bytes."""
    limits = [("host", _available_host_bytes())]
    if device_total is not None:
        limits.append((device or "the device", device_total))
    for where, limit in limits:
        if limit is not None and nbytes > limit:
            raise AllocationTooLargeError(
                f"{owner}: {what} needs {nbytes:,} bytes ({human_bytes(nbytes)}), more than the {human_bytes(limit)} "
                f"{'available on the host' if where == 'host' else f'of memory {where} has'}; "
                "use fewer units/filters or a smaller input (e.g. pool or stride before a Dense layer)")


def human_bytes(n: float) -> str:
    """``1536`` -> ``"1.50 KB"`` (powers of 1024, Keras's summary style)."""
    if n < 1024:
        return f"{n:.2f} B"
    for unit in ("KB", "MB", "GB", "TB"):
        n /= 1024.0
        if n < 1024:
            return f"{n:.2f} {unit}"
    return f"{n:.2f} PB"


_parsed_dtypes: "dict[Any, np.dtype]" = {}  # a spelling callers passed (np.float32, "float32", a dtype) -> dtype


def normalize_dtype(dtype: Any, owner: str = "dtype", supported: "frozenset[np.dtype] | None" = None) -> np.dtype:
    """``dtype`` as a NumPy dtype: a dtype, a scalar type, or a name (``"bfloat16"``/``"bf16"`` is
    ml_dtypes' bfloat16). Raises ``TypeError`` naming ``owner`` for what is not a dtype, or for a
    dtype outside ``supported`` (the dtypes the caller's library accepts) when one is given.

    The one dtype normaliser of the library: DeviceArray, the ops, the cuDNN descriptors, cuBLAS
    gemm and the dtype policies all spell dtypes through it.
    """
    # Hot path (every DeviceArray allocation): a dict hit on a spelling already parsed once. Only
    # str, type and dtype spellings are stored (bool/int keys would alias: True == 1), and the dict
    # stays small (a handful of spellings per dtype).
    try:
        dt = _parsed_dtypes.get(dtype)
    except TypeError:  # an unhashable spelling
        dt = None
    if dt is None:
        dt = _parse_dtype(dtype, owner, supported)
        if isinstance(dtype, (str, type, np.dtype)) and len(_parsed_dtypes) < 256:
            _parsed_dtypes[dtype] = dt
    if supported is not None and dt not in supported:
        raise TypeError(f"{owner}: dtype {dt} is not supported; supported: {_dtype_names(supported)}")
    return dt


def _parse_dtype(dtype: Any, owner: str, supported: "frozenset[np.dtype] | None") -> np.dtype:
    if isinstance(dtype, str) and dtype.lower() in ("bfloat16", "bf16"):
        return BFLOAT16
    try:
        return np.dtype(dtype)
    except TypeError:
        names = f"; supported: {_dtype_names(supported)}" if supported is not None else ""
        raise TypeError(f"{owner}: {dtype!r} is not a dtype{names}") from None


def _dtype_names(dtypes: "frozenset[np.dtype]") -> str:
    return ", ".join(sorted(d.name for d in dtypes))
