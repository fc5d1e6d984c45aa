"""The CUDA side of :mod:`dnnbind.kernels.search` (NVRTC kernels of ``search.cu``): one launch on the
call's stream, nothing synchronises. The public function checked the arguments."""

from __future__ import annotations

from typing import Any

from . import _common as cm

__all__ = ["searchsorted"]

_FILE = "search.cu"


def searchsorted(sorted_sequence: Any, values: Any, *, side: str, dtype: Any, out: Any = None,
                 stream: Any = None) -> Any:
    """See :func:`dnnbind.kernels.search.searchsorted` (``values`` contiguous, of the sequence's dtype)."""
    s = cm.stream_of(stream)
    res = cm.output(out, tuple(values.shape), dtype, s)
    n = int(values.size)
    cm.launch(_FILE, f"searchsorted_{cm.suffix(values.dtype)}_{cm.suffix(dtype)}", n,
              (cm.p(sorted_sequence), cm.p(values), cm.p(res), cm.i64(int(sorted_sequence.shape[0])), cm.i64(n),
               cm.i32(side == "right")), s)
    return res
