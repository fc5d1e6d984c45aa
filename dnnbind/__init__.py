"""dnnbind: Pythonic bindings to NVIDIA cuDNN and cuBLAS, and a Keras-like training API.

``import dnnbind`` never touches a CUDA library: the binding layer loads them
lazily, so the package imports (and the NumPy backend works) on any machine.

Four ways in:

* ``dnnbind.Sequential`` / ``dnnbind.Model`` (functional or subclassed) / ``dnnbind.layers``: the
  Keras-like API.
* ``dnnbind.ops`` (``keras.ops``), ``dnnbind.GradientTape``, custom ``Layer`` s and ``train_step``:
  differentiable code of your own on the one op-level tape (:mod:`dnnbind.autodiff`).
* ``dnnbind.kernels``: forward and backward primitives with one signature for a
  :class:`dnnbind.cuda.DeviceArray` (cuDNN/cuBLAS) and a NumPy array (``dnnbind.ops.<name>`` before;
  those names warn for one release).
* ``dnnbind.cuda`` / ``dnnbind.cudnn`` / ``dnnbind.cublas``: the owned runtime
  objects, handles and descriptors, for pipelines of your own.
"""

from __future__ import annotations

import importlib
from typing import Any

from .backend import Device, default_device, set_default_device
from .errors import (
    AllocationTooLargeError,
    CublasError,
    CudaError,
    CudnnError,
    DeviceOutOfMemoryError,
    DnnbindError,
    LibraryNotFoundError,
    NoDeviceError,
    NvrtcError,
)

__version__ = "0.1.0"

_SUBMODULES = {
    "cuda", "cudnn", "cublas", "ops", "layers", "optimizers", "losses", "metrics",
    "callbacks", "utils", "datasets", "mixed_precision", "initializers", "models", "tree", "preprocessing",
    "dtype_policies", "legacy",
    "saving", "backend", "errors", "trainers", "kernels", "autodiff",
    "random", "activations", "regularizers", "constraints", "config", "distribution", "quantizers",
}

# name -> (module, attribute)
_LAZY = {
    "to_device": ("dnnbind.cuda", "to_device"),
    "from_dlpack": ("dnnbind.cuda", "from_dlpack"),
    "from_cuda_array_interface": ("dnnbind.cuda", "from_cuda_array_interface"),
    "DeviceArray": ("dnnbind.cuda", "DeviceArray"),
    "Sequential": ("dnnbind.models", "Sequential"),
    "Model": ("dnnbind.models", "Model"),
    "Functional": ("dnnbind.models", "Functional"),
    "Input": ("dnnbind.layers", "Input"),
    "KerasTensor": ("dnnbind.layers.graph", "KerasTensor"),
    "Layer": ("dnnbind.layers", "Layer"),
    "Tensor": ("dnnbind.autodiff", "Tensor"),
    "Variable": ("dnnbind.autodiff", "Variable"),
    "GradientTape": ("dnnbind.autodiff", "GradientTape"),
    "load_model": ("dnnbind.models", "load_model"),
    "save_model": ("dnnbind.models", "save_model"),
    "doctor": ("dnnbind.doctor", "doctor"),
    "Regularizer": ("dnnbind.regularizers", "Regularizer"),
    "Loss": ("dnnbind.losses", "Loss"),
    "Metric": ("dnnbind.metrics", "Metric"),
    "Optimizer": ("dnnbind.optimizers", "Optimizer"),
    "Initializer": ("dnnbind.initializers", "Initializer"),
    "InputSpec": ("dnnbind.layers", "InputSpec"),
    "DTypePolicy": ("dnnbind.dtype_policies", "DTypePolicy"),
    "FloatDTypePolicy": ("dnnbind.dtype_policies", "FloatDTypePolicy"),
    "device": ("dnnbind.backend", "device_scope"),
}


def version() -> str:
    """``keras.version()``: dnnbind's version string."""
    return __version__

__all__ = [
    "__version__",
    "version",
    "Device",
    "default_device",
    "set_default_device",
    "DnnbindError",
    "CudaError",
    "CudnnError",
    "CublasError",
    "NvrtcError",
    "DeviceOutOfMemoryError",
    "AllocationTooLargeError",
    "NoDeviceError",
    "LibraryNotFoundError",
    *sorted(_LAZY),
    *sorted(_SUBMODULES),
]


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        return importlib.import_module(f"dnnbind.{name}")
    if name in _LAZY:
        module, attr = _LAZY[name]
        value = getattr(importlib.import_module(module), attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'dnnbind' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
