"""GPU discovery and selection.

:func:`is_available` probes once (``cudaGetDeviceCount``) and caches the answer,
so asking is cheap and never raises: a machine with no driver, no GPU or a
broken cuda-bindings install simply reports ``False`` and says why in
:func:`unavailable_reason`.
"""

from __future__ import annotations

import threading
from typing import Any

from ..errors import NoDeviceError
from ._util import IMPORT_ERROR, check, check_driver, driver, error_name, rt

__all__ = [
    "is_available",
    "unavailable_reason",
    "device_count",
    "current_device_index",
    "CudaDevice",
    "Device",
    "get_device",
]

_probe_lock = threading.Lock()
_probe: "tuple[int, str] | None" = None  # (device count, reason when 0)

_REASONS = {
    "cudaErrorInsufficientDriver": "no NVIDIA driver found, or it is too old for this CUDA runtime",
    "cudaErrorNoDevice": "no CUDA-capable GPU found",
    "cudaErrorInitializationError": "the CUDA driver failed to initialise",
    "cudaErrorSystemDriverMismatch": "the NVIDIA kernel module and user-space driver versions differ",
    "cudaErrorCompatNotSupportedOnDevice": "the CUDA forward-compatibility package does not support this GPU",
}


def _run_probe() -> tuple[int, str]:
    if rt is None:
        return 0, f"cuda-bindings cannot be imported ({type(IMPORT_ERROR).__name__}: {IMPORT_ERROR})"
    try:
        err, count = rt.cudaGetDeviceCount()
    except Exception as exc:  # a DynamicLibNotFoundError (no libcuda) or similar
        return 0, f"no NVIDIA driver found ({type(exc).__name__}: {str(exc).strip()})"
    if err:
        name, _ = error_name(err)
        # cudaGetDeviceCount's error is not sticky, but clear it so later calls start clean.
        try:
            rt.cudaGetLastError()
        except Exception:
            pass
        why = _REASONS.get(name, "CUDA is not usable")
        return 0, f"{why} (cudaGetDeviceCount: {name})"
    if count == 0:
        return 0, "no CUDA-capable GPU found (cudaGetDeviceCount: 0 devices)"
    return int(count), ""


def _probed() -> tuple[int, str]:
    global _probe
    if _probe is None:
        with _probe_lock:
            if _probe is None:
                _probe = _run_probe()
    return _probe


def is_available() -> bool:
    """True when at least one CUDA GPU is usable. Never raises; the result is cached."""
    return _probed()[0] > 0


def unavailable_reason() -> str:
    """One line saying why CUDA is unusable (empty when it is available)."""
    return _probed()[1]


def device_count() -> int:
    """Number of usable CUDA devices (0 when CUDA is unavailable)."""
    return _probed()[0]


def _require() -> None:
    if not is_available():
        raise NoDeviceError(
            f"no usable CUDA GPU: {unavailable_reason()}. Run `python -m dnnbind doctor` for a "
            "diagnosis, or use the CPU (NumPy) backend."
        )


def current_device_index() -> int:
    """The calling thread's current CUDA device (``cudaGetDevice``)."""
    probe = _probe
    if probe is not None and probe[0] == 1:
        # One visible device: it is always the current one (cudaSetDevice accepts no other
        # index), so the runtime call every allocation used to make is skipped.
        return 0
    _require()
    return int(check(rt.cudaGetDevice(), "cudaGetDevice"))


def _index_of(device: Any) -> int:
    """Normalise None / int / Device / "cuda:N" / objects with ``.index`` to a device index."""
    if device is None:
        return current_device_index()
    if isinstance(device, CudaDevice):
        return device.index
    if isinstance(device, bool):
        raise TypeError(f"device must be an int, a Device or 'cuda:N', got {device!r}")
    if isinstance(device, int):
        index = device
    elif isinstance(device, str):
        text = device.strip().lower()
        if text in ("cuda", "gpu"):
            return current_device_index()
        head, _, number = text.partition(":")
        if head not in ("cuda", "gpu") or not number.isdigit():
            raise ValueError(f"invalid CUDA device {device!r}; use 'cuda' or 'cuda:N'")
        index = int(number)
    elif getattr(device, "index", None) is not None or getattr(device, "type", None) == "cuda":
        return current_device_index() if device.index is None else int(device.index)
    else:
        raise TypeError(f"device must be an int, a Device or 'cuda:N', got {device!r}")
    _require()
    if not 0 <= index < device_count():
        raise NoDeviceError(f"CUDA device {index} does not exist; {device_count()} device(s) found")
    return index


class _DeviceGuard:
    """Make ``index`` current for a block and restore the previous device (no-op if equal)."""

    __slots__ = ("index", "previous")

    def __init__(self, index: int) -> None:
        self.index = index
        self.previous = -1

    def __enter__(self) -> int:
        prev = int(check(rt.cudaGetDevice(), "cudaGetDevice"))
        if prev != self.index:
            check(rt.cudaSetDevice(self.index), "cudaSetDevice", device=self.index)
            self.previous = prev
        return self.index

    def __exit__(self, *exc: Any) -> None:
        if self.previous >= 0:
            check(rt.cudaSetDevice(self.previous), "cudaSetDevice", device=self.previous)
            self.previous = -1


class CudaDevice:
    """A physical CUDA GPU: its properties, and making it current.

    Public spelling ``dnnbind.cuda.Device`` (an alias). Not :class:`dnnbind.backend.Device`, which names
    where computation runs (``"cpu"`` or ``"cuda:N"``) and is what models and layers take.

    ``CudaDevice()`` is the current device; ``CudaDevice(1)`` or ``CudaDevice("cuda:1")`` a given one.
    ``with CudaDevice(1):`` makes it current for the block and restores the previous one.
    Attributes are read from the driver on first access (``cudaDeviceGetAttribute``).
    """

    _cache: dict[int, "CudaDevice"] = {}

    def __new__(cls, index: Any = None) -> "CudaDevice":
        idx = _index_of(index)
        dev = cls._cache.get(idx)
        if dev is None:
            dev = super().__new__(cls)
            dev._index = idx
            dev._name = None
            dev._cc = None
            dev._total = None
            dev._sms = None
            dev._stack = []
            cls._cache[idx] = dev
        return dev

    @property
    def index(self) -> int:
        return self._index

    def _attr(self, attr: Any) -> int:
        return int(check(rt.cudaDeviceGetAttribute(attr, self._index), "cudaDeviceGetAttribute",
                         attribute=getattr(attr, "name", attr), device=self._index))

    @property
    def name(self) -> str:
        """Marketing name, e.g. ``"NVIDIA H200"``."""
        if self._name is None:
            drv = driver()
            check_driver(drv.cuInit(0), "cuInit")
            handle = check_driver(drv.cuDeviceGet(self._index), "cuDeviceGet")
            raw = check_driver(drv.cuDeviceGetName(256, handle), "cuDeviceGetName")
            self._name = raw.split(b"\0", 1)[0].decode(errors="replace")
        return self._name

    @property
    def compute_capability(self) -> tuple[int, int]:
        """(major, minor), e.g. ``(9, 0)`` for Hopper."""
        if self._cc is None:
            self._cc = (self._attr(rt.cudaDeviceAttr.cudaDevAttrComputeCapabilityMajor),
                        self._attr(rt.cudaDeviceAttr.cudaDevAttrComputeCapabilityMinor))
        return self._cc

    @property
    def arch(self) -> str:
        """NVRTC architecture name, e.g. ``"sm_90"``."""
        major, minor = self.compute_capability
        return f"sm_{major}{minor}"

    @property
    def multiprocessor_count(self) -> int:
        """Number of streaming multiprocessors."""
        if self._sms is None:
            self._sms = self._attr(rt.cudaDeviceAttr.cudaDevAttrMultiProcessorCount)
        return self._sms

    def mem_get_info(self) -> tuple[int, int]:
        """(free, total) device memory in bytes (``cudaMemGetInfo``)."""
        with _DeviceGuard(self._index):
            free, total = check(rt.cudaMemGetInfo(), "cudaMemGetInfo", device=self._index)
        return int(free), int(total)

    @property
    def total_memory(self) -> int:
        """Total device memory in bytes."""
        if self._total is None:
            self._total = self.mem_get_info()[1]
        return self._total

    @property
    def free_memory(self) -> int:
        """Free device memory in bytes, as the driver sees it now (pool reserves count as used)."""
        return self.mem_get_info()[0]

    def use(self) -> "CudaDevice":
        """Make this the calling thread's current device."""
        check(rt.cudaSetDevice(self._index), "cudaSetDevice", device=self._index)
        return self

    def synchronize(self) -> None:
        """Wait for all work on this device (every stream). Explicit; never called implicitly."""
        with _DeviceGuard(self._index):
            check(rt.cudaDeviceSynchronize(), "cudaDeviceSynchronize", device=self._index)

    def __enter__(self) -> "CudaDevice":
        self._stack.append(current_device_index())
        self.use()
        return self

    def __exit__(self, *exc: Any) -> None:
        previous = self._stack.pop()
        check(rt.cudaSetDevice(previous), "cudaSetDevice", device=previous)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CudaDevice) and other._index == self._index

    def __hash__(self) -> int:
        return hash(("cuda", self._index))

    def __str__(self) -> str:
        return f"cuda:{self._index}"

    def __repr__(self) -> str:
        return f"CudaDevice(cuda:{self._index})"


# the public spelling (cuda.core and CuPy call theirs Device too)
Device = CudaDevice


def get_device(index: Any = None) -> CudaDevice:
    """The :class:`CudaDevice` for ``index`` (``None``: the current device)."""
    return CudaDevice(index)
