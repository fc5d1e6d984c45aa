"""Public cuDNN objects: the handle and the descriptors, for ops and for pipelines of your own.

Everything here is owned (idempotent ``close()``, context manager, ``weakref.finalize``
cleanup) and imports without a GPU; the descriptors even work without one. The raw 1:1
binding is :mod:`dnnbind._lib.cudnn`.
"""

from __future__ import annotations

from .._lib.cudnn import cudart_version, version
from . import _descriptors
from ._descriptors import *  # noqa: F401,F403  (the descriptors and their records; see its __all__)
from ._handle import Handle, get_handle

__all__ = ["Handle", "get_handle", "version", "cudart_version", *_descriptors.__all__]
