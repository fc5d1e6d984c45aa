"""Scaled dot-product attention on cuDNN's fused flash-attention engines, as backend-API graphs.

cuDNN runs attention as one fused kernel when an operation graph has the pattern its attention
engines recognise: ``matmul(Q, Kᵀ) → × scale → (+ bias) → (causal select) → softmax → matmul(·, V)``
forward, and the matching backward graph. This module builds those graphs with
:class:`dnnbind.cudnn.graph.Graph` node by node (the composite form that cudnn-frontend's
``sdpa``/``sdpa_backward`` emit for every cuDNN 9; the single-node ``OPERATION_SDPA_FWD`` of cuDNN
≥ 9.13 has no causal mask or bias before 9.21, so it is not used) and caches one finalized plan per
configuration::

    from dnnbind.cudnn import attention as A
    cfg = A.SDPAConfig(batch=4, heads=8, s_q=1024, s_kv=1024, d_qk=64, d_v=64, dtype="bfloat16",
                       causal=True, scale=0.125)
    fwd = A.forward_plan(cfg)                      # finalized once per configuration, then cached
    fwd.execute({"q": q, "k": k, "v": v, "o": o, "stats": stats}, workspace=ws)

**Layout.** ``q`` is ``(B, S_q, H, D)`` and ``k``/``v`` ``(B, S_kv, H, D)`` in memory (Keras's
``dot_product_attention`` layout, "BSHD"), or ``(B, H, S, D)`` with ``layout="BHSD"``; the graphs
address them through strides, so neither layout is copied. ``o`` has ``q``'s layout (``D_v`` wide).
``stats`` is float32 ``(B, H, S_q, 1)``: each row's log-sum-exp of the scaled, masked scores, saved by
the forward for the backward. An additive ``bias`` is ``(B or 1, H or 1, S_q, S_kv)`` of the data
dtype, packed; its gradient is not computed (a mask or a constant bias).

**Backward** takes ``do`` (``o``'s layout), ``q, k, v, o, stats`` (and ``bias``) and writes
``dq, dk, dv`` (their inputs' layouts). It needs two float32 scratch tensors besides the plan's
workspace, ``softmax_sum`` ``(B, H, S_q, 1)`` and ``dq_accum`` ``(B, H, S_q, D)``: bind them too
(:func:`backward_scratch_bytes` gives their sizes).

**Support.** float16 and bfloat16 data (float32 compute), head dims up to 256 in multiples of 8, on
GPUs that have the engines (sm80 and later). Anything else raises ``GraphNotSupportedError`` when the
plan is built, which :mod:`dnnbind.kernels` turns into its cuBLAS + softmax path. Grouped-query heads
(``kv_heads < heads``) are not built here.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._cache import LRUCache
from .._validate import ArgumentTypeError, normalize_dtype
from .graph import Graph, Plan

__all__ = ["SDPAConfig", "forward_graph", "backward_graph", "forward_plan", "backward_plan",
           "backward_scratch_bytes", "DTYPES", "LAYOUTS"]

DTYPES = (np.dtype(np.float16), normalize_dtype("bfloat16"))
LAYOUTS = ("BSHD", "BHSD")
_NEG_INF = float("-inf")
PLAN_CACHE_SIZE = 256


@dataclass(frozen=True)
class SDPAConfig:
    """Everything that shapes one attention plan (its cache key)."""

    batch: int
    heads: int
    s_q: int
    s_kv: int
    d_qk: int
    d_v: int
    dtype: Any
    causal: bool = False
    scale: float = 1.0
    bias_shape: "tuple[int, int, int, int] | None" = None
    layout: str = "BSHD"

    def __post_init__(self) -> None:
        what = "SDPAConfig"
        for name in ("batch", "heads", "s_q", "s_kv", "d_qk", "d_v"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
                raise ArgumentTypeError(f"{what}: {name} must be a positive int, got {v!r}")
            object.__setattr__(self, name, int(v))
        dt = normalize_dtype(self.dtype, f"{what}: dtype")
        if dt not in DTYPES:
            raise ValueError(f"{what}: dtype must be float16 or bfloat16 (cuDNN's fused attention), got {dt}")
        object.__setattr__(self, "dtype", dt)
        if self.layout not in LAYOUTS:
            raise ValueError(f"{what}: layout must be one of {LAYOUTS}, got {self.layout!r}")
        try:
            scale = float(self.scale)
        except (TypeError, ValueError):
            raise ArgumentTypeError(f"{what}: scale must be a number, got {self.scale!r}") from None
        if not np.isfinite(scale):
            raise ValueError(f"{what}: scale must be finite, got {self.scale!r}")
        object.__setattr__(self, "scale", scale)
        object.__setattr__(self, "causal", bool(self.causal))
        if self.bias_shape is not None:
            bs = tuple(int(s) for s in self.bias_shape)
            want = (self.batch, self.heads, self.s_q, self.s_kv)
            if len(bs) != 4 or bs[2:] != want[2:] or bs[0] not in (1, self.batch) or bs[1] not in (1, self.heads):
                raise ValueError(f"{what}: bias_shape must be (1 or {self.batch}, 1 or {self.heads}, {self.s_q}, "
                                 f"{self.s_kv}), got {self.bias_shape!r}")
            object.__setattr__(self, "bias_shape", bs)

    def strides(self, seq: int, width: int) -> tuple[int, int, int, int]:
        """Element strides, in (B, H, S, D) order, of a q/k/v/o-like tensor in this config's layout."""
        h = self.heads
        if self.layout == "BSHD":
            return (seq * h * width, width, h * width, 1)
        return (h * seq * width, seq * width, width, 1)


def _input(g: Graph, cfg: SDPAConfig, name: str, seq: int, width: int, *, transposed: bool = False):
    dims = (cfg.batch, cfg.heads, seq, width)
    st = cfg.strides(seq, width)
    if transposed:  # the (B, H, D, S) view of the same memory: the matmul's Kᵀ / Vᵀ
        dims = (dims[0], dims[1], dims[3], dims[2])
        st = (st[0], st[1], st[3], st[2])
    return g.tensor(name, dims, layout="NCHW", strides=st)


def _scores(g: Graph, cfg: SDPAConfig, q, kt, bias, *, stats=None):
    """``S = (Q Kᵀ) · scale (+ bias)``, causally masked; minus ``stats`` when given (the backward's ``S - lse``)."""
    s = g.matmul(q, kt, name="bmm1")
    s = g.mul(s, g.scalar(cfg.scale, "float32", like=s), name="attn_scale")
    if bias is not None:
        s = g.add(s, bias, name="bias_add")
    if stats is not None:
        s = g.sub(s, stats, name="sub_stats")
    if cfg.causal:
        row = g.pointwise("gen_index", s, axis=2, dtype="int32", name="gen_row_index")
        col = g.pointwise("gen_index", s, axis=3, dtype="int32", name="gen_col_index")
        keep = g.pointwise("cmp_ge", row, col, dtype="bool", compute_dtype="bool", name="row_ge_col")
        s = g.pointwise("binary_select", s, g.scalar(_NEG_INF, "float32", like=s), t=keep, name="causal_select")
    return s


def _bias(g: Graph, cfg: SDPAConfig):
    if cfg.bias_shape is None:
        return None
    return g.tensor("bias", cfg.bias_shape, layout="NCHW")


def forward_graph(cfg: SDPAConfig) -> Graph:
    """The forward graph: binds ``q, k, v`` (and ``bias``) → ``o`` and float32 ``stats``."""
    g = Graph(io_dtype=cfg.dtype, compute_dtype="float32", layout="NCHW", name="sdpa_forward")
    q = _input(g, cfg, "q", cfg.s_q, cfg.d_qk)
    kt = _input(g, cfg, "k", cfg.s_kv, cfg.d_qk, transposed=True)
    v = _input(g, cfg, "v", cfg.s_kv, cfg.d_v)
    s = _scores(g, cfg, q, kt, _bias(g, cfg))
    m = g.reduction(s, [3], "max", name="row_max")
    e = g.pointwise("exp", g.sub(s, m, name="sub_max"), name="exp")
    z = g.reduction(e, [3], "add", name="row_sum")
    g.add(m, g.pointwise("log", z, name="log"), name="lse").output("stats", dtype="float32")
    p = g.pointwise("div", e, z, dtype=cfg.dtype, name="softmax")
    o = g.matmul(p, v, name="bmm2")
    o.dim_strides = cfg.strides(cfg.s_q, cfg.d_v)
    o.output("o")
    return g


def backward_graph(cfg: SDPAConfig) -> Graph:
    """The backward graph: binds ``do, q, k, v, o, stats`` (and ``bias``) and the float32 scratch
    ``softmax_sum``/``dq_accum`` → ``dq, dk, dv``."""
    g = Graph(io_dtype=cfg.dtype, compute_dtype="float32", layout="NCHW", name="sdpa_backward")
    b, h, sq, skv = cfg.batch, cfg.heads, cfg.s_q, cfg.s_kv
    q = _input(g, cfg, "q", sq, cfg.d_qk)
    kt = _input(g, cfg, "k", skv, cfg.d_qk, transposed=True)
    vt = _input(g, cfg, "v", skv, cfg.d_v, transposed=True)
    o = _input(g, cfg, "o", sq, cfg.d_v)
    do = _input(g, cfg, "do", sq, cfg.d_v)
    stats = g.tensor("stats", (b, h, sq, 1), dtype="float32", layout="NCHW")
    bias = _bias(g, cfg)
    # softmax_sum = rowsum(dO * O), kept in memory (scratch) for the dS chain
    t = g.mul(do, o, name="mul_do_o")
    rs = g.reduction(t, [3], "add", name="reduce_do_o")
    softmax_sum = g.mul(rs, g.scalar(1.0, "float32", like=rs), name="scale_softmax_sum")
    softmax_sum.output("softmax_sum", dtype="float32")
    # P = exp(S - lse); dV = Pᵀ dO
    p = g.pointwise("exp", _scores(g, cfg, q, kt, bias, stats=stats), name="exp_s")
    pt = g.reshape(p, (b, h, skv, sq), (h * sq * skv, sq * skv, 1, skv), dtype=cfg.dtype, name="reshape_p")
    dv = g.matmul(pt, do, name="matmul_pt_do")
    dv.dim_strides = cfg.strides(skv, cfg.d_v)
    dv.output("dv")
    # dS = P ∘ (dO Vᵀ - softmax_sum) · scale
    dp = g.matmul(do, vt, name="matmul_do_vt")
    ds = g.mul(g.sub(dp, softmax_sum, name="sub_dp_softmax_sum"), p, name="mul_dp_p")
    ds = g.mul(ds, g.scalar(cfg.scale, "float32", like=ds), name="mul_ds_attn_scale")
    # dK = dSᵀ Q
    dst = g.reshape(ds, (b, h, skv, sq), (h * sq * skv, sq * skv, 1, skv), dtype=cfg.dtype, name="reshape_ds")
    dk = g.matmul(dst, q, name="matmul_dst_q")
    dk.dim_strides = cfg.strides(skv, cfg.d_qk)
    dk.output("dk")
    # dQ = dS K, accumulated in float32 scratch, then written in the data dtype
    kst = cfg.strides(skv, cfg.d_qk)
    k = g.reshape(kt, (b, h, skv, cfg.d_qk), kst, dtype=cfg.dtype, name="reshape_k")
    dq_accum = g.matmul(ds, k, name="matmul_ds_k")
    dq_accum.output("dq_accum", dtype="float32")
    dq = g.pointwise("identity", dq_accum, name="identity_dq")
    dq.dim_strides = cfg.strides(sq, cfg.d_qk)
    dq.output("dq")
    return g


def backward_scratch_bytes(cfg: SDPAConfig) -> "tuple[int, int]":
    """Bytes of the backward's float32 scratch: ``(softmax_sum, dq_accum)``."""
    rows = cfg.batch * cfg.heads * cfg.s_q
    return rows * 4, rows * cfg.d_qk * 4


_lock = threading.Lock()
_plans: "LRUCache" = LRUCache(PLAN_CACHE_SIZE, "cuDNN attention plans")


def _plan(direction: str, cfg: SDPAConfig, handle: Any) -> Plan:
    key = (direction, cfg, None if handle is None else getattr(handle, "device", None))
    with _lock:
        plan = _plans.get(key)
    if plan is None:
        graph = forward_graph(cfg) if direction == "forward" else backward_graph(cfg)
        plan = graph.build(handle, heuristics=("A", "B", "fallback"))
        with _lock:
            _plans.put(key, plan)
    return plan


def forward_plan(cfg: SDPAConfig, handle: Any = None) -> Plan:
    """The finalized forward :class:`~dnnbind.cudnn.graph.Plan` of ``cfg`` (built once, then cached)."""
    return _plan("forward", cfg, handle)


def backward_plan(cfg: SDPAConfig, handle: Any = None) -> Plan:
    """The finalized backward :class:`~dnnbind.cudnn.graph.Plan` of ``cfg`` (built once, then cached)."""
    return _plan("backward", cfg, handle)
