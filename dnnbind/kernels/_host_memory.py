"""Keep the NumPy backend's large temporaries from being handed back to the kernel between steps.

A training step of the NumPy backend allocates and frees tens of arrays of 1-20 MB
(im2col columns, activations, their gradients). With glibc's default settings the
freed top of the heap is returned to the kernel as soon as it exceeds twice the
largest recent allocation, so the next step takes every page again as a fresh,
zero-filled page fault: on a 2-core machine that was 20-25 ms of a 55 ms mnist_cnn
step. Raising the mmap threshold (to glibc's maximum, 32 MiB) and the trim threshold
(256 MiB) lets those blocks be reused from the heap instead.

This changes a process-wide allocator setting, so it is done once, only when the
NumPy backend first runs a convolution or a pooling, only under glibc, and not when
the user already chose (``MALLOC_MMAP_THRESHOLD_``, ``MALLOC_TRIM_THRESHOLD_`` or
``GLIBC_TUNABLES`` in the environment) or opted out (``DNNBIND_MALLOC_TUNING=0``).
The cost is that up to 256 MiB of freed heap stays mapped to the process.
"""

from __future__ import annotations

import ctypes
import os
import sys

__all__ = ["tune_malloc_once"]

_M_TRIM_THRESHOLD = -1  # malloc.h
_M_MMAP_THRESHOLD = -3
_MMAP_THRESHOLD = 32 << 20  # glibc's upper limit for M_MMAP_THRESHOLD on 64-bit
_TRIM_THRESHOLD = 256 << 20

_done = False


def _user_chose() -> bool:
    env = os.environ
    if env.get("DNNBIND_MALLOC_TUNING", "1").strip().lower() in ("0", "false", "no", "off"):
        return True
    return any(name in env for name in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "GLIBC_TUNABLES"))


def tune_malloc_once() -> None:
    """Apply the settings above the first time it is called (a no-op afterwards and off glibc)."""
    global _done
    if _done:
        return
    _done = True
    if not sys.platform.startswith("linux") or _user_chose():
        return
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version  # glibc only: musl's mallopt ignores these parameters
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD)
    mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD)
