"""Find and load the CUDA libraries dnnbind binds to: cuDNN, cuBLAS, cuBLASLt, NVRTC, NCCL.

Search order, per library:

1. the override variable (``DNNBIND_CUDNN_PATH``, ``DNNBIND_CUBLAS_PATH``,
   ``DNNBIND_CUBLASLT_PATH``, ``DNNBIND_NVRTC_PATH``, ``DNNBIND_NCCL_PATH``): a file, or a directory
   holding the library;
2. ``cuda.pathfinder.load_nvidia_dynamic_lib``, which covers the pip cu12/cu13
   wheels, conda, ``CUDA_HOME``/``CUDA_PATH`` and the system loader.

Nothing is loaded at import time: :func:`load_library` loads on first use and
caches the result, so ``import dnnbind`` works on machines without CUDA.
"""

from __future__ import annotations

import ctypes
import glob
import os
import sys
import threading
from dataclasses import dataclass

from ..errors import LibraryNotFoundError

__all__ = [
    "LIBRARIES",
    "LibraryInfo",
    "load_library",
    "library_info",
    "clear_cache",
    "override_variable",
]

# RTLD_GLOBAL: libcudnn.so.9 dlopens its sub-libraries (libcudnn_ops, _cnn, _graph,
# _engines_*) at run time, and those resolve symbols against what is already loaded.
_DLOPEN_MODE = (os.RTLD_NOW | os.RTLD_GLOBAL) if sys.platform != "win32" else 0


@dataclass(frozen=True)
class _Spec:
    name: str  # the pathfinder name
    variable: str  # the override environment variable
    file_globs: tuple[str, ...]  # what to look for inside an override directory
    pip_fix: str  # the command that installs it
    siblings: tuple[str, ...] = ()  # libraries to preload from the same directory


_SPECS: dict[str, _Spec] = {
    "cudnn": _Spec(
        "cudnn", "DNNBIND_CUDNN_PATH", ("libcudnn.so.9", "libcudnn.so.*", "libcudnn.so", "cudnn64_9.dll"),
        'pip install "dnnbind[cu12]"  (or: pip install nvidia-cudnn-cu12; for CUDA 13: '
        'pip install "dnnbind[cu13]" / nvidia-cudnn-cu13)',
        # libcudnn_graph is what every other cuDNN sub-library links against; loading it
        # globally first makes an override directory behave like the wheel layout.
        siblings=("libcudnn_graph.so.9",),
    ),
    "cublas": _Spec(
        "cublas", "DNNBIND_CUBLAS_PATH", ("libcublas.so.1[0-9]", "libcublas.so.*", "libcublas.so", "cublas64_*.dll"),
        'pip install "dnnbind[cu12]"  (or: pip install nvidia-cublas-cu12; for CUDA 13: '
        'pip install "dnnbind[cu13]" / nvidia-cublas)',
        # libcublas needs libcublasLt; an override dir normally holds both.
        siblings=("libcublasLt.so.1[0-9]",),
    ),
    "cublasLt": _Spec(
        "cublasLt", "DNNBIND_CUBLASLT_PATH",
        ("libcublasLt.so.1[0-9]", "libcublasLt.so.*", "libcublasLt.so", "cublasLt64_*.dll"),
        'pip install "dnnbind[cu12]"  (or: pip install nvidia-cublas-cu12; for CUDA 13: '
        'pip install "dnnbind[cu13]" / nvidia-cublas)',
    ),
    "nvrtc": _Spec(
        "nvrtc", "DNNBIND_NVRTC_PATH", ("libnvrtc.so.1[0-9]", "libnvrtc.so.*", "libnvrtc.so", "nvrtc64_*.dll"),
        'pip install "dnnbind[cu12]"  (or: pip install nvidia-cuda-nvrtc-cu12; for CUDA 13: '
        'pip install "dnnbind[cu13]" / nvidia-cuda-nvrtc)',
    ),
    # only data-parallel training needs it (dnnbind.distribution); not part of the cu12/cu13 extras
    "nccl": _Spec(
        "nccl", "DNNBIND_NCCL_PATH", ("libnccl.so.2", "libnccl.so.*", "libnccl.so"),
        'pip install "dnnbind[nccl]"  (or: pip install nvidia-nccl-cu12; for CUDA 13: nvidia-nccl-cu13)',
    ),
}

LIBRARIES: tuple[str, ...] = tuple(_SPECS)


@dataclass(frozen=True)
class LibraryInfo:
    """Where a library was loaded from.

    Attributes
    ----------
    name:
        ``"cudnn"``, ``"cublas"``, ``"cublasLt"``, ``"nvrtc"`` or ``"nccl"``.
    path:
        Absolute path of the loaded file (``None`` only when the system loader
        had it already and could not say where from).
    found_via:
        ``"override:DNNBIND_CUDNN_PATH"`` or cuda.pathfinder's ``found_via``
        (``"site-packages"``, ``"conda"``, ``"CUDA_PATH"``, ``"system-search"``...).
    version:
        The library's version: an int for cuDNN (``91900`` = 9.19.0) and cuBLAS /
        cuBLASLt (``120904`` = 12.9.4) and NCCL (``23203`` = 2.32.3), a ``"major.minor"`` string for NVRTC;
        ``None`` when the query failed.
    """

    name: str
    path: str | None
    found_via: str
    version: int | str | None


_lock = threading.RLock()
_loaded: dict[str, tuple[ctypes.CDLL, str | None, str]] = {}
_info: dict[str, LibraryInfo] = {}


def _pathfinder_load(name: str):
    """cuda.pathfinder's loader; a module attribute so tests can replace it."""
    from cuda.pathfinder import load_nvidia_dynamic_lib

    return load_nvidia_dynamic_lib(name)


def override_variable(name: str) -> str:
    """The environment variable that overrides where library ``name`` comes from."""
    return _spec(name).variable


def _spec(name: str) -> _Spec:
    try:
        return _SPECS[name]
    except KeyError:
        raise ValueError(f"unknown CUDA library {name!r}; dnnbind loads one of {sorted(_SPECS)}") from None


def _resolve_override(spec: _Spec, value: str) -> str:
    """Turn the override variable's value into a file path, or raise naming what was checked."""
    path = os.path.expanduser(value)
    if os.path.isfile(path):
        return os.path.abspath(path)
    if os.path.isdir(path):
        for pattern in spec.file_globs:
            hits = sorted(glob.glob(os.path.join(path, pattern)))
            if hits:
                return os.path.abspath(hits[-1])
        raise LibraryNotFoundError(
            f"cannot load the {spec.name} library: {spec.variable}={value!r} is a directory, but it holds "
            f"no file matching {list(spec.file_globs)}.\n"
            f"Point {spec.variable} at the library file or its directory, or unset it to search the "
            f"usual places. To install it: {spec.pip_fix}"
        )
    raise LibraryNotFoundError(
        f"cannot load the {spec.name} library: {spec.variable}={value!r} does not exist "
        f"(neither a file nor a directory).\n"
        f"Fix the path, or unset {spec.variable} to search the pip wheels, conda, CUDA_HOME and the "
        f"system. To install it: {spec.pip_fix}"
    )


def _load_override(spec: _Spec, value: str) -> tuple[ctypes.CDLL, str, str]:
    path = _resolve_override(spec, value)
    directory = os.path.dirname(path)
    for pattern in spec.siblings:
        for sibling in sorted(glob.glob(os.path.join(directory, pattern)))[-1:]:
            try:
                ctypes.CDLL(sibling, mode=_DLOPEN_MODE)
            except OSError:
                # A broken sibling shows up as a clear error when the main library loads or
                # when cuDNN dlopens it; preloading is only a convenience.
                pass
    try:
        lib = ctypes.CDLL(path, mode=_DLOPEN_MODE)
    except OSError as exc:
        raise LibraryNotFoundError(
            f"cannot load the {spec.name} library from {path!r} ({spec.variable}={value!r}): {exc}\n"
            f"Check that the file is a {spec.name} shared library for this platform, or unset "
            f"{spec.variable}. To install it: {spec.pip_fix}"
        ) from exc
    return lib, path, f"override:{spec.variable}"


def _load_pathfinder(spec: _Spec) -> tuple[ctypes.CDLL, str | None, str]:
    try:
        loaded = _pathfinder_load(spec.name)
    except Exception as exc:  # DynamicLibNotFoundError, or pathfinder missing altogether
        cuda_home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
        conda = os.environ.get("CONDA_PREFIX")
        raise LibraryNotFoundError(
            f"cannot find the {spec.name} library. Looked in:\n"
            f"  - {spec.variable}: not set\n"
            f"  - cuda.pathfinder.load_nvidia_dynamic_lib({spec.name!r}): already-loaded libraries, "
            f"the NVIDIA pip wheels in site-packages, conda "
            f"(CONDA_PREFIX={conda or 'not set'}), CUDA_HOME/CUDA_PATH ({cuda_home or 'not set'}), "
            f"and the system loader (LD_LIBRARY_PATH, ldconfig). It said: "
            f"{type(exc).__name__}: {str(exc).strip()}\n"
            f"Fix: {spec.pip_fix}, or set {spec.variable} to the library file or its directory."
        ) from exc
    if loaded.abs_path:
        lib = ctypes.CDLL(loaded.abs_path, mode=_DLOPEN_MODE)
    else:
        # Already in the process under a name the loader could not map back to a path:
        # reuse its handle (pathfinder documents the handle as never to be closed).
        lib = ctypes.CDLL(spec.name, handle=loaded._handle_uint)
    return lib, loaded.abs_path, loaded.found_via


def load_library(name: str) -> ctypes.CDLL:
    """Load (once) and return library ``name``: ``"cudnn"``, ``"cublas"``, ``"cublasLt"``, ``"nvrtc"``, ``"nccl"``.

    Raises
    ------
    ValueError
        ``name`` is not one of those five.
    dnnbind.errors.LibraryNotFoundError
        The library is nowhere to be found; the message lists where it looked and the
        pip command that installs it.
    """
    hit = _loaded.get(name)
    if hit is not None:
        return hit[0]
    spec = _spec(name)
    with _lock:
        hit = _loaded.get(name)
        if hit is None:
            value = os.environ.get(spec.variable)
            hit = _load_override(spec, value) if value else _load_pathfinder(spec)
            _loaded[name] = hit
    return hit[0]


def _query_version(name: str, lib: ctypes.CDLL) -> int | str | None:
    try:
        if name == "cudnn":
            lib.cudnnGetVersion.restype = ctypes.c_size_t
            lib.cudnnGetVersion.argtypes = []
            return int(lib.cudnnGetVersion())
        if name == "cublasLt":
            lib.cublasLtGetVersion.restype = ctypes.c_size_t
            lib.cublasLtGetVersion.argtypes = []
            return int(lib.cublasLtGetVersion())
        if name == "cublas":
            # cublasGetProperty needs no handle (cublasGetVersion_v2 does, and a GPU with it).
            fn = lib.cublasGetProperty
            fn.restype = ctypes.c_int
            fn.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_int)]
            parts = []
            for prop in (0, 1, 2):  # MAJOR_VERSION, MINOR_VERSION, PATCH_LEVEL (library_types.h)
                value = ctypes.c_int()
                if fn(prop, ctypes.byref(value)) != 0:
                    return None
                parts.append(value.value)
            return parts[0] * 10000 + parts[1] * 100 + parts[2]
        if name == "nccl":
            # ncclGetVersion needs no GPU and no communicator
            fn = lib.ncclGetVersion
            fn.restype = ctypes.c_int
            fn.argtypes = [ctypes.POINTER(ctypes.c_int)]
            value = ctypes.c_int()
            return int(value.value) if fn(ctypes.byref(value)) == 0 else None
        if name == "nvrtc":
            fn = lib.nvrtcVersion
            fn.restype = ctypes.c_int
            fn.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_int)]
            major, minor = ctypes.c_int(), ctypes.c_int()
            if fn(ctypes.byref(major), ctypes.byref(minor)) != 0:
                return None
            return f"{major.value}.{minor.value}"
    except AttributeError:
        return None
    return None


def library_info(name: str) -> LibraryInfo:
    """Load library ``name`` if needed and say where it came from and which version it is."""
    info = _info.get(name)
    if info is not None:
        return info
    lib = load_library(name)
    _, path, found_via = _loaded[name]
    info = LibraryInfo(name=name, path=path, found_via=found_via, version=_query_version(name, lib))
    _info[name] = info
    return info


def clear_cache() -> None:
    """Forget what was loaded, so the next call searches again (for tests).

    The shared objects stay mapped in the process: unloading a CUDA library that
    others may still use is never safe.
    """
    with _lock:
        _loaded.clear()
        _info.clear()

