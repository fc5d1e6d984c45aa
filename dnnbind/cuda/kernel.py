"""Custom CUDA kernels compiled at run time with NVRTC.

``Kernel(source, name)`` compiles CUDA C++ (C++17) for the device's architecture
(``sm_90`` on an H200) and launches it with ``kernel(grid, block, args, stream=...)``.
Compiled cubins are cached in memory and on disk (``$DNNBIND_CACHE_DIR`` or
``~/.cache/dnnbind/kernels``), keyed by the SHA-256 of the source, the options,
the architecture, the NVRTC version and the header directory; files are written
atomically (temporary file + rename), so concurrent processes never read half a file.

``cuda_fp16.h`` / ``cuda_bf16.h`` are found through ``cuda.pathfinder`` (the NVRTC /
CUDA runtime include directories of the pip wheels, conda or the CUDA toolkit) and
passed with ``--include-path``; :func:`fp16_headers_available` says whether they were
found. Code that must work without them should treat bf16/fp16 as ``unsigned short``
bit patterns.

Modules load lazily, once per device, into the runtime's primary context
(``cuModuleLoadData``), so kernels and runtime calls share one context. Each loaded module
is a :class:`dnnbind._lib.OwnedPointer` of its own (the library's ownership policy), held by
the kernel: it is unloaded by :meth:`Kernel.close` or when the kernel is collected.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import operator
import os
import re
import tempfile
import threading
from functools import lru_cache
from typing import Any, Iterable, Sequence

import numpy as np

from .._lib import OwnedPointer
from ..errors import NvrtcError
from ._util import check, check_driver, driver, rt
from .array import DeviceArray
from .device import CudaDevice, _DeviceGuard, _index_of
from .stream import Stream as _Stream
from .stream import as_stream as _as_stream

_drv_module = None


def _driver():
    """``cuda.bindings.driver``, imported once (the launch path asks for it on every call)."""
    global _drv_module
    if _drv_module is None:
        _drv_module = driver()
    return _drv_module

__all__ = ["Kernel", "Pointer", "compile_kernel", "nvrtc_version", "fp16_headers_available", "cache_dir"]

_ARCH_RE = re.compile(r"^(sm|compute)_\d{2,3}[af]?$")


class Pointer:
    """A raw device address passed as a kernel argument (``void*``)."""

    __slots__ = ("value",)

    def __init__(self, value: int) -> None:
        self.value = int(value)

    def __repr__(self) -> str:
        return f"Pointer(0x{self.value:x})"


def _nvrtc():
    from cuda.bindings import nvrtc

    return nvrtc


def _nvrtc_check(result: tuple, function: str, log: str = "") -> Any:
    err = result[0]
    if err:
        nvrtc = _nvrtc()
        try:
            text = nvrtc.nvrtcGetErrorString(err)[1].decode()
        except Exception:
            text = ""
        raise NvrtcError(int(err), getattr(err, "name", f"nvrtcResult {int(err)}"), function,
                         "" if log else text, log=log)
    return result[1] if len(result) == 2 else (None if len(result) == 1 else result[1:])


@lru_cache(maxsize=None)
def nvrtc_version() -> tuple[int, int]:
    """NVRTC's (major, minor)."""
    major, minor = _nvrtc_check(_nvrtc().nvrtcVersion(), "nvrtcVersion")
    return int(major), int(minor)


@lru_cache(maxsize=None)
def _header_dir() -> str | None:
    """A directory holding cuda_fp16.h / cuda_bf16.h, or None."""
    candidates = []
    env = os.environ.get("DNNBIND_CUDA_INCLUDE")
    if env:
        candidates.append(env)
    try:
        import cuda.pathfinder as pf

        for lib in ("nvrtc", "cudart"):
            try:
                found = pf.find_nvidia_header_directory(lib)
            except Exception:
                found = None
            if found:
                candidates.append(found)
    except ImportError:  # pragma: no cover
        pass
    for directory in candidates:
        if os.path.isfile(os.path.join(directory, "cuda_fp16.h")) and \
                os.path.isfile(os.path.join(directory, "cuda_bf16.h")):
            return os.path.abspath(directory)
    return None


def fp16_headers_available() -> bool:
    """True when ``#include <cuda_fp16.h>`` / ``<cuda_bf16.h>`` will compile."""
    return _header_dir() is not None


def cache_dir() -> str:
    """Where compiled kernels are stored: ``$DNNBIND_CACHE_DIR`` or ``~/.cache/dnnbind/kernels``."""
    env = os.environ.get("DNNBIND_CACHE_DIR")
    if env:
        return os.path.expanduser(env)
    return os.path.join(os.path.expanduser("~"), ".cache", "dnnbind", "kernels")


def _check_arch(arch: str) -> str:
    if not isinstance(arch, str) or not _ARCH_RE.match(arch):
        raise ValueError(f"compile_kernel: arch must look like 'sm_90' (or 'compute_90'), got {arch!r}")
    return arch


def _normalize_options(options: Iterable[str]) -> tuple[str, ...]:
    if isinstance(options, (str, bytes)):
        raise TypeError("compile_kernel: options must be a sequence of strings, not one string")
    opts = tuple(options)
    for o in opts:
        if not isinstance(o, str):
            raise TypeError(f"compile_kernel: every option must be a str, got {o!r}")
    return opts


_memory_cache: dict[str, tuple[bytes, dict[str, str]]] = {}
_cache_lock = threading.Lock()
stats = {"compiled": 0, "memory_hits": 0, "disk_hits": 0}


def _write_atomic(path: str, data: bytes) -> None:
    directory = os.path.dirname(path)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _compile(source: str, arch: str, options: tuple[str, ...],
             name_expressions: tuple[str, ...]) -> tuple[bytes, dict[str, str]]:
    """(cubin, {name expression: lowered name}), from the caches or NVRTC."""
    header = _header_dir()
    version = nvrtc_version()
    key_material = json.dumps([source, arch, list(options), list(name_expressions), list(version), header])
    key = hashlib.sha256(key_material.encode()).hexdigest()
    hit = _memory_cache.get(key)
    if hit is not None:
        stats["memory_hits"] += 1
        return hit
    directory = cache_dir()
    cubin_path = os.path.join(directory, key + ".cubin")
    names_path = os.path.join(directory, key + ".json")
    try:
        with open(cubin_path, "rb") as f:
            cubin = f.read()
        names: dict[str, str] = {}
        if name_expressions:
            with open(names_path, encoding="utf-8") as f:
                names = json.load(f)
        if cubin and all(e in names for e in name_expressions):
            stats["disk_hits"] += 1
            with _cache_lock:
                _memory_cache[key] = (cubin, names)
            return cubin, names
    except (OSError, ValueError):
        pass  # a miss or a damaged entry: compile again

    cubin, names = _run_nvrtc(source, arch, options, name_expressions, header)
    stats["compiled"] += 1
    with _cache_lock:
        _memory_cache[key] = (cubin, names)
    try:
        os.makedirs(directory, exist_ok=True)
        if name_expressions:  # names first: a cubin without its names file is never read as a hit
            _write_atomic(names_path, json.dumps(names).encode())
        _write_atomic(cubin_path, cubin)
    except OSError:
        pass  # a read-only cache directory only costs recompilation
    return cubin, names


def _run_nvrtc(source: str, arch: str, options: tuple[str, ...], name_expressions: tuple[str, ...],
               header: str | None) -> tuple[bytes, dict[str, str]]:
    nvrtc = _nvrtc()
    prog = _nvrtc_check(nvrtc.nvrtcCreateProgram(source.encode(), b"dnnbind_kernel.cu", 0, [], []),
                        "nvrtcCreateProgram")
    try:
        for expr in name_expressions:
            _nvrtc_check(nvrtc.nvrtcAddNameExpression(prog, expr.encode()), "nvrtcAddNameExpression")
        opts = [f"--gpu-architecture={arch}", "-std=c++17"]
        if header:
            opts.append(f"--include-path={header}")
        opts.extend(options)
        encoded = [o.encode() for o in opts]
        result = nvrtc.nvrtcCompileProgram(prog, len(encoded), encoded)
        if result[0]:
            size = _nvrtc_check(nvrtc.nvrtcGetProgramLogSize(prog), "nvrtcGetProgramLogSize")
            log = b" " * size
            nvrtc.nvrtcGetProgramLog(prog, log)
            err = NvrtcError(int(result[0]), getattr(result[0], "name", str(result[0])), "nvrtcCompileProgram",
                             log=log.rstrip(b"\0").decode(errors="replace"),
                             context={"arch": arch, "options": " ".join(opts)})
            raise err
        if arch.startswith("compute_"):
            size = _nvrtc_check(nvrtc.nvrtcGetPTXSize(prog), "nvrtcGetPTXSize")
            image = b" " * size
            _nvrtc_check(nvrtc.nvrtcGetPTX(prog, image), "nvrtcGetPTX")
        else:
            size = _nvrtc_check(nvrtc.nvrtcGetCUBINSize(prog), "nvrtcGetCUBINSize")
            image = b" " * size
            _nvrtc_check(nvrtc.nvrtcGetCUBIN(prog, image), "nvrtcGetCUBIN")
        names = {}
        for expr in name_expressions:
            lowered = _nvrtc_check(nvrtc.nvrtcGetLoweredName(prog, expr.encode()), "nvrtcGetLoweredName")
            names[expr] = lowered.decode() if isinstance(lowered, bytes) else str(lowered)
        return bytes(image), names
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


def compile_kernel(source: str, name: str | None = None, *, arch: str, options: Sequence[str] = (),
                   name_expressions: Sequence[str] | None = None) -> bytes:
    """Compile ``source`` for ``arch`` (e.g. ``"sm_90"``) and return the cubin (PTX for ``compute_XY``).

    Works without a GPU. ``name`` is only checked to be a string (the symbol is resolved at load).
    Raises :class:`~dnnbind.errors.NvrtcError` carrying NVRTC's log when compilation fails.
    """
    if not isinstance(source, str):
        raise TypeError(f"compile_kernel: source must be a str, got {type(source).__name__}")
    if name is not None and not isinstance(name, str):
        raise TypeError(f"compile_kernel: name must be a str, got {type(name).__name__}")
    exprs = tuple(name_expressions or ())
    return _compile(source, _check_arch(arch), _normalize_options(options), exprs)[0]


# ------------------------------------------------------------------------------------------ Kernel

def _unload_module(device: int, module: int) -> tuple:
    # cuModuleUnload acts on the current context: make the module's device (its primary
    # context) current for the call.
    with _DeviceGuard(device):
        return _driver().cuModuleUnload(module)


class _Module(OwnedPointer):
    """One ``CUmodule`` loaded on one device, owned by a :class:`Kernel`."""

    def __init__(self, module: Any, device: int) -> None:
        self.device = device
        self._adopt(int(module), lambda ptr: _unload_module(device, ptr))

    def _check_destroy(self, result: tuple) -> None:
        check_driver(result, "cuModuleUnload", device=self.device)


def _dims(value: Any, what: str) -> tuple[int, int, int]:
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        dims = (int(value),)
    else:
        try:
            dims = tuple(int(v) for v in value)
        except TypeError:
            raise TypeError(f"Kernel launch: {what} must be an int or a tuple of up to 3 ints, "
                            f"got {value!r}") from None
    if not 1 <= len(dims) <= 3 or any(d < 1 for d in dims):
        raise ValueError(f"Kernel launch: {what} must have 1 to 3 positive sizes, got {value!r}")
    return dims + (1,) * (3 - len(dims))


_INT_CT = {4: ctypes.c_int32, 8: ctypes.c_int64, 2: ctypes.c_int16, 1: ctypes.c_int8}
_FLOAT_CT = {4: ctypes.c_float, 8: ctypes.c_double}

_launch_dims_ok: "dict[tuple, tuple]" = {}  # (grid, block) as given -> validated 3-d dims


def _launch_dims(name: str, grid: Any, block: Any) -> "tuple[tuple[int, int, int], tuple[int, int, int]]":
    """Validated (grid, block); a dict hit for shapes seen before (hashable ones)."""
    try:
        key = (grid, block)
        hit = _launch_dims_ok.get(key)
    except TypeError:  # a list or another unhashable spelling
        key = hit = None
    if hit is not None:
        return hit
    g = _dims(grid, "grid")
    b = _dims(block, "block")
    if b[0] * b[1] * b[2] > 1024:
        raise ValueError(f"Kernel {name!r}: block {b} has more than 1024 threads")
    if key is not None:
        if len(_launch_dims_ok) >= 4096:  # grids follow the data sizes; keep the memo bounded
            _launch_dims_ok.clear()
        _launch_dims_ok[key] = (g, b)
    return g, b


# attrgetter, not a def: called for every pointer argument of every launch, and a C getter
# costs a fraction of a Python frame.
_pointer_value = operator.attrgetter("value")


def _null(arg: Any) -> int:
    return 0


# Argument types packed through a prebuilt plan: type -> (ctypes type, value getter or None
# for "assign the argument itself"). NumPy scalars keep their exact C type (ctypes converts
# through __index__/__float__, exactly); Python int/float/bool, float16/bfloat16 scalars and
# foreign arrays take the general path (their C type depends on the parameter size or needs
# a bit cast).
_PLAN_TYPES: "dict[type, tuple[Any, Any]]" = {
    Pointer: (ctypes.c_void_p, _pointer_value),
    type(None): (ctypes.c_void_p, _null),
    np.int64: (ctypes.c_int64, None),
    np.int32: (ctypes.c_int32, None),
    np.int16: (ctypes.c_int16, None),
    np.int8: (ctypes.c_int8, None),
    np.uint64: (ctypes.c_uint64, None),
    np.uint32: (ctypes.c_uint32, None),
    np.uint16: (ctypes.c_uint16, None),
    np.uint8: (ctypes.c_uint8, None),
    np.float64: (ctypes.c_double, None),
    np.float32: (ctypes.c_float, None),
    np.bool_: (ctypes.c_bool, None),
}


_device_array_ptr = operator.attrgetter("_ptr")
_NO_PLAN_YET = object()


class _LaunchPlan:
    """Argument storage for one (device, argument types) signature of a kernel, built once.

    ``values`` are ctypes objects of the parameters' C types and ``params`` the ``void*``
    array pointing at them (what cuLaunchKernel's kernelParams wants). A launch refills
    ``values`` in place, under the kernel's lock (the driver copies the parameters during
    cuLaunchKernel, so the storage is free again as soon as the call returns).
    """

    __slots__ = ("values", "getters", "params", "address")

    def __init__(self, ctypes_types: "Sequence[Any]", getters: "Sequence[Any]") -> None:
        self.values = tuple(ct() for ct in ctypes_types)
        self.getters = tuple(getters)
        n = len(self.values)
        self.params = (ctypes.c_void_p * max(n, 1))(*[ctypes.addressof(v) for v in self.values])
        self.address = ctypes.addressof(self.params) if n else 0


class Kernel:
    """A ``__global__`` function compiled with NVRTC.

    Parameters
    ----------
    source:
        CUDA C++ source. Give kernels ``extern "C"`` linkage, or list template
        instantiations / C++ names in ``name_expressions``.
    name:
        The kernel's name (or one of ``name_expressions``).
    options:
        Extra NVRTC options (``-std=c++17`` and the architecture are always set).
    device:
        Whose architecture to compile for (default: current device).
    arch:
        Compile for this architecture (``"sm_90"``) instead; allows compile-only use without a GPU.

    Launch with ``kernel(grid, block, args, shared_mem=0, stream=None)``. ``args`` items may be
    a DeviceArray (its pointer), a :class:`Pointer`, ``None`` (null pointer), a NumPy scalar
    (passed as its exact C type), or a Python int/float/bool whose size is taken from the
    kernel's signature (``cuFuncGetParamInfo``; 4 bytes: int32/float, 8: int64/double).
    """

    def __init__(self, source: str, name: str, *, options: Sequence[str] = (),
                 name_expressions: Sequence[str] | None = None, device: Any = None,
                 arch: str | None = None) -> None:
        if not isinstance(source, str):
            raise TypeError(f"Kernel: source must be a str, got {type(source).__name__}")
        if not isinstance(name, str) or not name:
            raise TypeError(f"Kernel: name must be a non-empty str, got {name!r}")
        self.name = name
        self.options = _normalize_options(options)
        exprs = tuple(name_expressions or ())
        if arch is None:
            arch = CudaDevice(device).arch
        self.arch = _check_arch(arch)
        self._image, self._names = _compile(source, self.arch, self.options, exprs)
        self.symbol = self._names.get(name, name)
        # device -> (module, function, parameter sizes)
        self._modules: "dict[int, tuple[_Module, Any, tuple[int, ...] | None]]" = {}
        self._lock = threading.Lock()
        self._plans: "dict[tuple, _LaunchPlan | None]" = {}  # (device, arg types) -> plan (None: general path)
        self._launch_lock = threading.Lock()

    @property
    def cubin(self) -> bytes:
        """The compiled image (a cubin, or PTX for ``compute_XY``)."""
        return self._image

    def _load(self, index: int) -> tuple:
        entry = self._modules.get(index)
        if entry is not None:
            return entry
        with self._lock:
            entry = self._modules.get(index)
            if entry is not None:
                return entry
            dev = CudaDevice(index)
            if self.arch.startswith("sm_") and self.arch.rstrip("af") != dev.arch:
                raise RuntimeError(f"Kernel {self.name!r} was compiled for {self.arch} but cuda:{index} is "
                                   f"{dev.arch}; create it with device={index}")
            drv = driver()
            with _DeviceGuard(index):
                # cudaSetDevice makes the runtime's primary context current (CUDA 12+),
                # so the module lives in the same context as every runtime call.
                check(rt.cudaSetDevice(index), "cudaSetDevice", device=index)
                # Owned at once, so a failing cuModuleGetFunction cannot leak the module.
                module = _Module(check_driver(drv.cuModuleLoadData(self._image), "cuModuleLoadData",
                                              kernel=self.name), index)
                func = check_driver(drv.cuModuleGetFunction(module.handle, self.symbol.encode()),
                                    "cuModuleGetFunction", kernel=self.symbol)
            entry = (module, func, self._param_sizes(func))
            self._modules[index] = entry
            return entry

    @staticmethod
    def _param_sizes(func: Any) -> tuple[int, ...] | None:
        drv = driver()
        getter = getattr(drv, "cuFuncGetParamInfo", None)
        if getter is None:
            return None
        sizes = []
        for i in range(4096):
            try:
                result = getter(func, i)
            except Exception:
                return None
            if result[0]:
                if result[0] == drv.CUresult.CUDA_ERROR_INVALID_VALUE:
                    break  # past the last parameter
                return None  # driver too old for the query
            sizes.append(int(result[2]))
        return tuple(sizes)

    def param_sizes(self, device: Any = None) -> tuple[int, ...] | None:
        """Byte size of each kernel parameter on ``device`` (None when the driver cannot say)."""
        return self._load(_index_of(device))[2]

    def _plan(self, index: int, types: tuple, sizes: "tuple[int, ...] | None") -> "_LaunchPlan | None":
        """The prebuilt plan for these argument types, or None when they need the general path."""
        key = (index, types)
        if key in self._plans:
            return self._plans[key]
        plan = None
        entries = [(ctypes.c_void_p, _device_array_ptr) if t is DeviceArray else _PLAN_TYPES.get(t)
                   for t in types]
        if all(e is not None for e in entries) and (
                sizes is None or all(ctypes.sizeof(e[0]) == size for e, size in zip(entries, sizes))):
            plan = _LaunchPlan([e[0] for e in entries], [e[1] for e in entries])
        # A size mismatch also goes to the general path, which raises the descriptive TypeError.
        if len(self._plans) < 256:
            self._plans[key] = plan
        return plan

    def _pack(self, i: int, arg: Any, size: int | None):
        if isinstance(arg, DeviceArray):
            value = ctypes.c_void_p(arg.ptr)
        elif isinstance(arg, Pointer):
            value = ctypes.c_void_p(arg.value)
        elif arg is None:
            value = ctypes.c_void_p(0)
        elif isinstance(arg, np.generic):
            raw = arg.tobytes()
            value = (ctypes.c_char * len(raw)).from_buffer_copy(raw)
        elif isinstance(arg, bool):
            value = ctypes.c_bool(arg)
        elif isinstance(arg, int):
            ct = _INT_CT.get(size) if size is not None else None
            if ct is None:
                raise TypeError(self._scalar_hint(i, arg, size))
            bound = 1 << (8 * size - 1)
            if not -bound <= arg < 2 * bound:
                raise OverflowError(f"Kernel {self.name!r}: argument {i} = {arg} does not fit {size * 8} bits")
            value = ct(arg if arg < bound else arg - 2 * bound)
        elif isinstance(arg, float):
            ct = _FLOAT_CT.get(size) if size is not None else None
            if ct is None:
                raise TypeError(self._scalar_hint(i, arg, size))
            value = ct(arg)
        elif hasattr(arg, "__cuda_array_interface__"):
            value = ctypes.c_void_p(int(arg.__cuda_array_interface__["data"][0]))
        else:
            raise TypeError(f"Kernel {self.name!r}: argument {i} has unsupported type {type(arg).__name__}; "
                            "pass a DeviceArray, a dnnbind.cuda.Pointer, a NumPy scalar or an int/float")
        if size is not None and ctypes.sizeof(value) != size:
            raise TypeError(f"Kernel {self.name!r}: argument {i} is {ctypes.sizeof(value)} bytes "
                            f"({type(arg).__name__}) but the kernel parameter is {size} bytes; pass a "
                            "NumPy scalar of the exact type (np.int32, np.float32, ...)")
        return value

    def _scalar_hint(self, i: int, arg: Any, size: int | None) -> str:
        known = "the driver cannot report parameter sizes" if size is None else f"the parameter is {size} bytes"
        return (f"Kernel {self.name!r}: cannot tell the C type of Python {type(arg).__name__} argument {i} "
                f"({known}); pass a NumPy scalar such as np.int32({arg!r}) or np.float32({arg!r})")

    def __call__(self, grid: Any, block: Any, args: Sequence[Any] = (), *, shared_mem: int = 0,
                 stream: Any = None) -> None:
        """Launch on ``stream`` (default: the current stream); asynchronous."""
        try:  # _launch_dims' memo hit, inlined (a list spelling is unhashable: the full check)
            g, b = _launch_dims_ok[(grid, block)]
        except (KeyError, TypeError):
            g, b = _launch_dims(self.name, grid, block)
        if type(args) is not tuple and not isinstance(args, (tuple, list)):
            raise TypeError(f"Kernel {self.name!r}: args must be a tuple or list, got {type(args).__name__}")
        s = stream if type(stream) is _Stream else _as_stream(stream)
        index = s._device
        entry = self._modules.get(index)
        module, func, sizes = entry if entry is not None else self._load(index)
        if sizes is not None and len(sizes) != len(args):
            raise TypeError(f"Kernel {self.name!r} takes {len(sizes)} arguments, got {len(args)}")
        if type(shared_mem) is not int:
            shared_mem = int(shared_mem)
        launch = (_drv_module or _driver()).cuLaunchKernel
        types = tuple(map(type, args))
        plan = self._plans.get((index, types), _NO_PLAN_YET)
        if plan is _NO_PLAN_YET:
            plan = self._plan(index, types, sizes)
        if plan is not None:
            with self._launch_lock:
                for value, get, arg in zip(plan.values, plan.getters, args):
                    value.value = arg if get is None else get(arg)
                result = launch(func, g[0], g[1], g[2], b[0], b[1], b[2], shared_mem, s._handle, plan.address, 0)
        else:
            values = [self._pack(i, a, None if sizes is None else sizes[i]) for i, a in enumerate(args)]
            n = len(values)
            pointers = (ctypes.c_void_p * max(n, 1))(*[ctypes.addressof(v) for v in values])
            result = launch(func, g[0], g[1], g[2], b[0], b[1], b[2], shared_mem, s._handle,
                            ctypes.addressof(pointers) if n else 0, 0)
        if result[0]:  # the error context is built only when raising
            check_driver(result, "cuLaunchKernel", kernel=self.name, grid=g, block=b, shared_mem=shared_mem)

    launch = __call__

    def close(self) -> None:
        """Unload the per-device modules (idempotent). A later launch loads its device's module again."""
        with self._lock:
            entries = list(self._modules.values())
            self._modules.clear()
        for module, _func, _sizes in entries:
            module.close()

    def __repr__(self) -> str:
        return f"Kernel({self.name!r}, arch={self.arch})"
