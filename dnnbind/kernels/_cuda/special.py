"""Special functions on NVRTC kernels (``special.cu``): the device side of :mod:`dnnbind.kernels.special`.
One grid-stride launch per call on the call's stream; nothing synchronises."""

from __future__ import annotations

from typing import Any

from . import _common as cm
from .elementwise import cast

__all__ = ["special"]

_FILE = "special.cu"
KERNELS = ("bessel_i1", "sinc")


def special(op: str, x: Any, *, dtype: Any, out: Any = None, stream: Any = None) -> Any:
    """``op`` of every element of contiguous ``x`` (a float DeviceArray) as ``dtype`` (a float dtype)."""
    s = cm.stream_of(stream)
    src = x if x.dtype == dtype else cast(x, dtype, stream=s)
    res = cm.output(out, x.shape, dtype, s)
    n = int(x.size)
    cm.launch(_FILE, f"{op}_{cm.suffix(dtype)}", n, (cm.p(src), cm.p(res), cm.i64(n)), s)
    return res
