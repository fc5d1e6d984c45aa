"""Fused scaled-dot-product attention, forward and backward: cuDNN's flash-attention engines on CUDA
(:mod:`dnnbind.cudnn.attention`), and a NumPy reference of the same signature.

Arrays are Keras's layout, ``q`` ``(B, S_q, H, D)``, ``k`` ``(B, S_kv, H, D)``, ``v`` ``(B, S_kv, H, D_v)``
(``layout="BSHD"``), or ``(B, H, S, D)`` with ``layout="BHSD"``; ``o`` has ``q``'s layout and ``D_v``.
``stats`` is float32 ``(B, H, S_q, 1)``, the log-sum-exp of each row of the scaled, masked scores:
the forward returns it and the backward takes it (the flash-attention form: nothing of size
``S_q × S_kv`` is kept). ``bias`` (optional) is an additive ``(B or 1, H or 1, S_q, S_kv)`` array of the
data dtype; ``causal`` keeps source ``s <= t`` for target ``t``. Data is float16 or bfloat16 on CUDA
(the engines' dtypes); the reference also takes float32/float64. Scores and softmax are float32
(float64 for float64 data).

:func:`sdpa_supported` says whether CUDA runs a configuration (dtype, head dims, and whether cuDNN
built its plan: a refusal is remembered per configuration). Callers with a composed fallback ask it
first; the ops layer does.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .._validate import normalize_dtype
from ._dispatch import as_array, check_float, check_out, finish, route

__all__ = ["sdpa_forward", "sdpa_backward", "sdpa_supported"]

_LAYOUTS = ("BSHD", "BHSD")


def _bhsd(x: np.ndarray, layout: str) -> np.ndarray:
    return np.swapaxes(x, 1, 2) if layout == "BSHD" else x


def _from_bhsd(x: np.ndarray, layout: str) -> np.ndarray:
    return np.ascontiguousarray(np.swapaxes(x, 1, 2) if layout == "BSHD" else x)


def _geometry(op: str, q: Any, k: Any, v: Any, bias: Any, layout: str) -> tuple:
    if layout not in _LAYOUTS:
        raise ValueError(f"{op}: layout must be one of {_LAYOUTS}, got {layout!r}")
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_float(op, name, t)
        if t.ndim != 4:
            raise ValueError(f"{op}: {name} must be 4-d ({'(B, S, H, D)' if layout == 'BSHD' else '(B, H, S, D)'}),"
                             f" got shape {tuple(t.shape)}")
        if t.dtype != q.dtype:
            raise TypeError(f"{op}: q, k and v must have one dtype, got q {q.dtype}, {name} {t.dtype}")
    ax_s, ax_h = (1, 2) if layout == "BSHD" else (2, 1)
    b, sq, h, d = int(q.shape[0]), int(q.shape[ax_s]), int(q.shape[ax_h]), int(q.shape[3])
    skv = int(k.shape[ax_s])
    if (int(k.shape[0]), int(k.shape[ax_h]), int(k.shape[3])) != (b, h, d):
        raise ValueError(f"{op}: k must match q in batch, heads and head dim: q {tuple(q.shape)}, k {tuple(k.shape)}"
                         f" ({layout})")
    if (int(v.shape[0]), int(v.shape[ax_s]), int(v.shape[ax_h])) != (b, skv, h):
        raise ValueError(f"{op}: v must match k in batch, sequence and heads: k {tuple(k.shape)}, v {tuple(v.shape)}"
                         f" ({layout})")
    dv = int(v.shape[3])
    if bias is not None:
        bs = tuple(int(s) for s in bias.shape)
        if len(bs) != 4 or bs[2:] != (sq, skv) or bs[0] not in (1, b) or bs[1] not in (1, h):
            raise ValueError(f"{op}: bias must be (1 or {b}, 1 or {h}, {sq}, {skv}), got {bs}")
        if bias.dtype != q.dtype:
            raise TypeError(f"{op}: bias must have q's dtype {q.dtype}, got {bias.dtype}")
    return b, h, sq, skv, d, dv


def _scale(op: str, scale: Any, d: int) -> float:
    if scale is None:
        return 1.0 / math.sqrt(d)
    try:
        value = float(scale)
    except (TypeError, ValueError):
        raise TypeError(f"{op}: scale must be a number, got {scale!r}") from None
    if not math.isfinite(value):
        raise ValueError(f"{op}: scale must be finite, got {scale!r}")
    return value


def _compute(dtype: np.dtype) -> np.dtype:
    return np.dtype(np.float64) if dtype == np.float64 else np.dtype(np.float32)


def _np_scores(q, k, bias, scale, causal, cdt) -> np.ndarray:
    s = np.einsum("bhqd,bhkd->bhqk", q.astype(cdt), k.astype(cdt)) * cdt.type(scale)
    if bias is not None:
        s = s + bias.astype(cdt)
    if causal:
        sq, skv = s.shape[-2:]
        keep = np.arange(sq)[:, None] >= np.arange(skv)[None, :]
        s = np.where(keep, s, -np.inf)
    return s


def sdpa_forward(q: Any, k: Any, v: Any, *, scale: Any = None, causal: bool = False, bias: Any = None,
                 layout: str = "BSHD", out: Any = None, stats_out: Any = None,
                 stream: Any = None) -> "tuple[Any, Any]":
    """``(o, stats)`` of ``softmax(q kᵀ · scale + bias, causal) v`` (``scale`` default ``1/sqrt(D)``).
    ``out`` / ``stats_out`` receive them when given.

    CUDA: ``_cuda.attention.sdpa_forward(q, k, v, cfg, bias=bias, out=out, stats_out=stats_out,
    stream=stream)``: one fused cuDNN plan; raises ``GraphNotSupportedError`` for what cuDNN does not
    build (see :func:`sdpa_supported`).
    """
    op = "sdpa_forward"
    q, k, v = as_array(q), as_array(k), as_array(v)
    bias = None if bias is None else as_array(bias)
    b, h, sq, skv, d, dv = _geometry(op, q, k, v, bias, layout)
    sc = _scale(op, scale, d)
    check_out(op, out, (b, sq, h, dv) if layout == "BSHD" else (b, h, sq, dv), q.dtype)
    check_out(op, stats_out, (b, h, sq, 1), np.dtype(np.float64 if q.dtype == np.float64 else np.float32))
    cuda = route(op, "attention", q=q, k=k, v=v, bias=bias, out=out, stats_out=stats_out)
    if cuda is not None:
        return cuda.sdpa_forward(q, k, v, cuda.config(b, h, sq, skv, d, dv, q.dtype, causal, sc, bias, layout),
                                 bias=bias, out=out, stats_out=stats_out, stream=stream)
    cdt = _compute(q.dtype)
    s = _np_scores(_bhsd(q, layout), _bhsd(k, layout), bias, sc, bool(causal), cdt)
    m = s.max(axis=-1, keepdims=True)
    e = np.exp(s - m)
    z = e.sum(axis=-1, keepdims=True)
    stats = (m + np.log(z)).astype(np.float32 if cdt == np.float32 else cdt)
    p = (e / z).astype(q.dtype).astype(cdt)  # P is rounded to the data dtype before the second matmul, as on CUDA
    o = np.einsum("bhqk,bhkd->bhqd", p, _bhsd(v, layout).astype(cdt))
    return finish(_from_bhsd(o.astype(q.dtype), layout), out, q.dtype), finish(stats, stats_out, stats.dtype)


def sdpa_backward(do: Any, q: Any, k: Any, v: Any, o: Any, stats: Any, *, scale: Any = None, causal: bool = False,
                  bias: Any = None, layout: str = "BSHD", dq_out: Any = None, dk_out: Any = None,
                  dv_out: Any = None, stream: Any = None) -> "tuple[Any, Any, Any]":
    """``(dq, dk, dv)`` of :func:`sdpa_forward` for the output gradient ``do`` (``o``'s shape), from the
    forward's ``o`` and ``stats``; ``dq_out``/``dk_out``/``dv_out`` receive them when given. ``bias`` gets
    no gradient."""
    op = "sdpa_backward"
    do, q, k, v, o, stats = (as_array(a) for a in (do, q, k, v, o, stats))
    bias = None if bias is None else as_array(bias)
    b, h, sq, skv, d, dv = _geometry(op, q, k, v, bias, layout)
    want_o = (b, sq, h, dv) if layout == "BSHD" else (b, h, sq, dv)
    for name, t in (("do", do), ("o", o)):
        if tuple(t.shape) != want_o or t.dtype != q.dtype:
            raise ValueError(f"{op}: {name} must be {want_o} {q.dtype}, got {tuple(t.shape)} {t.dtype}")
    cdt = _compute(q.dtype)
    sdt = np.dtype(np.float32) if cdt == np.float32 else cdt
    if tuple(stats.shape) != (b, h, sq, 1) or stats.dtype != sdt:
        raise ValueError(f"{op}: stats must be {(b, h, sq, 1)} {sdt}, got {tuple(stats.shape)} {stats.dtype}")
    sc = _scale(op, scale, d)
    for name, t, like in (("dq_out", dq_out, q), ("dk_out", dk_out, k), ("dv_out", dv_out, v)):
        check_out(f"{op} {name}", t, tuple(like.shape), q.dtype)
    cuda = route(op, "attention", do=do, q=q, k=k, v=v, o=o, stats=stats, bias=bias, dq_out=dq_out,
                 dk_out=dk_out, dv_out=dv_out)
    if cuda is not None:
        return cuda.sdpa_backward(do, q, k, v, o, stats,
                                  cuda.config(b, h, sq, skv, d, dv, q.dtype, causal, sc, bias, layout),
                                  bias=bias, dq_out=dq_out, dk_out=dk_out, dv_out=dv_out, stream=stream)
    qb, kb, vb = (_bhsd(t, layout).astype(cdt) for t in (q, k, v))
    dob, ob = _bhsd(do, layout).astype(cdt), _bhsd(o, layout).astype(cdt)
    p = np.exp(_np_scores(qb, kb, bias, sc, bool(causal), cdt) - stats.astype(cdt))
    dvb = np.einsum("bhqk,bhqd->bhkd", p, dob)
    dp = np.einsum("bhqd,bhkd->bhqk", dob, vb)
    ds = p * (dp - (dob * ob).sum(axis=-1, keepdims=True)) * cdt.type(sc)
    dqb = np.einsum("bhqk,bhkd->bhqd", ds, kb)
    dkb = np.einsum("bhqk,bhqd->bhkd", ds, qb)
    return tuple(finish(_from_bhsd(t.astype(q.dtype), layout), o_, q.dtype)
                 for t, o_ in ((dqb, dq_out), (dkb, dk_out), (dvb, dv_out)))


def sdpa_supported(q: Any, k: Any, v: Any, *, causal: bool = False, bias: Any = None, layout: str = "BSHD",
                   scale: Any = None) -> bool:
    """Whether :func:`sdpa_forward`/:func:`sdpa_backward` run this configuration: always on NumPy; on CUDA
    when the data is float16/bfloat16 with head dims that are multiples of 8 up to 256 and cuDNN builds
    both plans (tried once per configuration; a refusal is remembered, no error escapes)."""
    op = "sdpa_supported"
    q, k, v = as_array(q), as_array(k), as_array(v)
    bias = None if bias is None else as_array(bias)
    b, h, sq, skv, d, dv = _geometry(op, q, k, v, bias, layout)
    cuda = route(op, "attention", q=q, k=k, v=v, bias=bias)
    if cuda is None:
        return True
    if normalize_dtype(q.dtype) not in cuda.DTYPES or d % 8 or dv % 8 or d > 256 or dv > 256:
        return False
    return cuda.supported(cuda.config(b, h, sq, skv, d, dv, q.dtype, causal, _scale(op, scale, d), bias, layout))
