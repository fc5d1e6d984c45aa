"""Fused attention on CUDA: one cuDNN flash-attention plan each way (:mod:`dnnbind.cudnn.attention`).

cuDNN calls: ``cudnnBackendExecute`` of the cached forward/backward plans, on the call's stream, with
the stream's grow-only cuDNN workspace. Outputs and the backward's float32 scratch
(``softmax_sum``, ``dq_accum``) come from the stream-ordered pool and the scratch dies with the call,
so both ops can be captured into a CUDA graph once their plans exist (the eager warm-up builds them).
No host synchronisation.
"""

from __future__ import annotations

import threading
from typing import Any

from ...cudnn import attention as A
from ...cudnn import workspace
from ...cudnn.graph import GraphNotSupportedError
from ...errors import CudnnError
from . import _common as cm

__all__ = ["config", "supported", "sdpa_forward", "sdpa_backward", "DTYPES"]

DTYPES = A.DTYPES
_lock = threading.Lock()
_refused: "dict[tuple, str]" = {}


def config(b: int, h: int, sq: int, skv: int, d: int, dv: int, dtype: Any, causal: bool, scale: float, bias: Any,
           layout: str) -> A.SDPAConfig:
    return A.SDPAConfig(b, h, sq, skv, d, dv, dtype, bool(causal), scale,
                        None if bias is None else tuple(int(s) for s in bias.shape), layout)


def supported(cfg: A.SDPAConfig, stream: Any = None) -> bool:
    """Whether cuDNN builds both plans of ``cfg`` (a refusal is remembered; other errors propagate)."""
    s = cm.stream_of(stream)
    handle = cm.cudnn_handle(s)
    key = (cfg, handle.device)
    if key in _refused:
        return False
    try:
        A.forward_plan(cfg, handle)
        A.backward_plan(cfg, handle)
    except GraphNotSupportedError as err:
        with _lock:
            _refused[key] = str(err)
        return False
    except CudnnError as err:
        if 3000 <= err.status < 4000:  # CUDNN_STATUS_NOT_SUPPORTED_*: a finalize refused it
            with _lock:
                _refused[key] = str(err)
            return False
        raise
    return True


def refusals() -> "dict[tuple, str]":
    """The configurations cuDNN refused, with why (for ``doctor`` and tests)."""
    return dict(_refused)


def _shape(cfg: A.SDPAConfig, seq: int, width: int) -> tuple:
    return (cfg.batch, seq, cfg.heads, width) if cfg.layout == "BSHD" else (cfg.batch, cfg.heads, seq, width)


def sdpa_forward(q: Any, k: Any, v: Any, cfg: A.SDPAConfig, *, bias: Any = None, out: Any = None,
                 stats_out: Any = None, stream: Any = None) -> tuple:
    s = cm.stream_of(stream)
    handle = cm.cudnn_handle(s)
    plan = A.forward_plan(cfg, handle)
    o = cm.output(out, _shape(cfg, cfg.s_q, cfg.d_v), q.dtype, s)
    stats = cm.output(stats_out, (cfg.batch, cfg.heads, cfg.s_q, 1), cm.F32, s)
    tensors = {"q": q.ptr, "k": k.ptr, "v": v.ptr, "o": o.ptr, "stats": stats.ptr}
    if bias is not None:
        tensors["bias"] = bias.ptr
    plan.execute(tensors, workspace(s, plan.workspace_size), handle=handle)
    return o, stats


def sdpa_backward(do: Any, q: Any, k: Any, v: Any, o: Any, stats: Any, cfg: A.SDPAConfig, *, bias: Any = None,
                  dq_out: Any = None, dk_out: Any = None, dv_out: Any = None, stream: Any = None) -> tuple:
    s = cm.stream_of(stream)
    handle = cm.cudnn_handle(s)
    plan = A.backward_plan(cfg, handle)
    dq = cm.output(dq_out, tuple(q.shape), q.dtype, s)
    dk = cm.output(dk_out, tuple(k.shape), k.dtype, s)
    dv = cm.output(dv_out, tuple(v.shape), v.dtype, s)
    softmax_sum = cm.empty((cfg.batch, cfg.heads, cfg.s_q, 1), cm.F32, s)
    dq_accum = cm.empty((cfg.batch, cfg.heads, cfg.s_q, cfg.d_qk), cm.F32, s)
    tensors = {"q": q.ptr, "k": k.ptr, "v": v.ptr, "o": o.ptr, "do": do.ptr, "stats": stats.ptr,
               "softmax_sum": softmax_sum.ptr, "dq_accum": dq_accum.ptr, "dq": dq.ptr, "dk": dk.ptr, "dv": dv.ptr}
    if bias is not None:
        tensors["bias"] = bias.ptr
    plan.execute(tensors, workspace(s, plan.workspace_size), handle=handle)
    return dq, dk, dv
