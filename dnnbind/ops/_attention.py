"""``keras.ops.dot_product_attention``: scaled dot-product attention with Keras's (``jax.nn``'s) semantics
(``(batch, time, heads, depth)`` layout, grouped-query heads, additive ``bias``, boolean ``mask`` and
``is_causal`` broadcast over ``(batch, heads, target, source)``), composed from ``matmul`` (cuBLAS, batched
over the key/value heads with the query groups broadcast) and the softmax kernel.

:func:`fused_attention` is the seam for cuDNN's fused SDPA (flash attention, a separate issue): it gets
the converted arguments first and returns the output for what it supports, or None for the composed path.
"""

from __future__ import annotations

import math
from typing import Any

import ml_dtypes
import numpy as np

from ..autodiff.tensor import Tensor
from ..kernels import numeric as N
from ._activations import softmax_last
from ._core import is_float, keras_op, np_dtype, result_type, tensors
from ._elementwise import add, logical_and, multiply, where
from ._nn_common import op, to_dtype

__all__ = ["dot_product_attention", "fused_attention"]


def fused_attention(query: Tensor, key: Tensor, value: Tensor, bias: "Tensor | None", mask: "Tensor | None",
                    scale: float, is_causal: bool) -> "Tensor | None":
    """cuDNN's fused scaled-dot-product attention, where it applies: the attention output, or None (the
    composed path runs). Arguments are converted (one float dtype; ``bias``/``mask`` 4-d). Not implemented
    yet: always None."""
    return None


def _four_d(t: Tensor) -> Tensor:
    """``jax.nn``'s ``_ensure_4d``: leading axes added."""
    return t if t.ndim >= 4 else op("reshape")(t, (1,) * (4 - t.ndim) + tuple(t.shape))


def _check_heads(name: str, t: Tensor, heads: int) -> None:
    if t.ndim != 4:
        raise ValueError(f"dot_product_attention: `{name}` must have at most 4 dimensions, got shape {tuple(t.shape)}")
    if t.shape[1] not in (1, heads):
        raise ValueError(f"dot_product_attention: Expected `{name}` to have shape (B, 1, T, S) or (B, N, T, S) with "
                         f"N={heads} but got {tuple(t.shape)}.")


@keras_op(family="nn")
def dot_product_attention(query: Any, key: Any, value: Any, bias: Any = None, mask: Any = None, scale: Any = None,
                          is_causal: bool = False, flash_attention: Any = None,
                          attn_logits_soft_cap: Any = None) -> Tensor:
    """``keras.ops.dot_product_attention``: ``softmax(q k^T * scale + bias, masked) v`` per head.

    ``query`` ``(B, T, N, H)``, ``key``/``value`` ``(B, S, K, H)`` with ``N`` a multiple of ``K`` (query head
    ``n`` attends with key/value head ``n // (N / K)``); ``scale`` defaults to ``1 / sqrt(H)``; ``mask``
    (True: attend) and ``bias`` broadcast to ``(B, N, T, S)``; ``is_causal``: target ``t`` attends to sources
    ``s <= t``. Logits and the softmax are at least float32; masked logits are ``-0.7 * float32 max`` (a fully
    masked row attends uniformly, as Keras). ``flash_attention=True`` needs the fused path (not available
    yet: an error); ``attn_logits_soft_cap`` is refused as Keras refuses it off TPUs."""
    owner = "dot_product_attention"
    if attn_logits_soft_cap is not None:
        raise ValueError(f"{owner}: attn_logits_soft_cap is only supported for JAX on TPU (Keras). Set "
                         "attn_logits_soft_cap=None.")
    given = [a for a in (query, key, value, bias) if a is not None]
    ts = tensors(*given)
    q, k, v = ts[:3]
    if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
        raise ValueError(f"{owner}: `dot_product_attention` only supports 4D inputs. Received: query.shape="
                         f"{tuple(q.shape)}, key.shape={tuple(k.shape)}, value.shape={tuple(v.shape)}.")
    dt = np_dtype(result_type(q, k, v))
    if not is_float(dt):
        raise TypeError(f"{owner}: query, key and value must be float tensors, got {q.dtype}, {k.dtype}, {v.dtype}")
    q, k, v = to_dtype(q, dt), to_dtype(k, dt), to_dtype(v, dt)
    b, t_len, heads, depth = (int(s) for s in q.shape)
    kb, s_len, kv_heads, kdepth = (int(s) for s in k.shape)
    if kb != b or kdepth != depth or tuple(v.shape[:3]) != (kb, s_len, kv_heads):
        raise ValueError(f"{owner}: key must be (B, S, K, H) and value (B, S, K, H_v) for query (B, T, N, H); got "
                         f"query {tuple(q.shape)}, key {tuple(k.shape)}, value {tuple(v.shape)}")
    if heads % kv_heads:
        raise ValueError(f"{owner}: The number of query heads must be a multiple of key/value heads, but got "
                         f"{heads} vs {kv_heads}")
    bias_t = None if bias is None else _four_d(to_dtype(ts[3], dt))
    mask_t = None
    if mask is not None:
        (mask_t,) = tensors(mask)
        mask_t = _four_d(mask_t if mask_t.dtype.kind == "b" else op("not_equal")(mask_t, 0))
    for name, t in (("bias", bias_t), ("mask", mask_t)):
        if t is not None:
            _check_heads(name, t, heads)
    scale = 1.0 / math.sqrt(depth) if scale is None else float(scale)
    if flash_attention is not False:
        fused = fused_attention(q, k, v, bias_t, mask_t, scale, bool(is_causal))
        if fused is not None:
            return fused
        if flash_attention:
            raise NotImplementedError(f"{owner}: flash_attention=True needs cuDNN's fused attention, which dnnbind "
                                      "does not provide yet; pass flash_attention=None or False")
    return _composed(q, k, v, bias_t, mask_t, scale, bool(is_causal))


def _composed(q: Tensor, k: Tensor, v: Tensor, bias: "Tensor | None", mask: "Tensor | None", scale: float,
              is_causal: bool) -> Tensor:
    reshape, transpose, matmul = op("reshape"), op("transpose"), op("matmul")
    b, t_len, heads, depth = (int(s) for s in q.shape)
    s_len, kv_heads, v_depth = int(k.shape[1]), int(k.shape[2]), int(v.shape[3])
    groups = heads // kv_heads
    logits_dt = np_dtype(result_type(q.dtype, "float32"))
    qc, kc = to_dtype(q, logits_dt), to_dtype(k, logits_dt)
    q5 = transpose(reshape(qc, (b, t_len, kv_heads, groups, depth)), (0, 2, 3, 1, 4))  # (B, K, G, T, H)
    k5 = reshape(transpose(kc, (0, 2, 3, 1)), (b, kv_heads, 1, depth, s_len))         # (B, K, 1, H, S)
    logits = multiply(reshape(matmul(q5, k5), (b, heads, t_len, s_len)), scale)
    if bias is not None:
        logits = to_dtype(add(logits, bias), logits_dt)
    keep = mask
    if is_causal:
        rows = N.iota(t_len, 0, 1, np.int32, device=q.device).reshape(t_len, 1)
        cols = N.iota(s_len, 0, 1, np.int32, device=q.device).reshape(1, s_len)
        causal = Tensor(N.binary("greater_equal", rows, cols).reshape(1, 1, t_len, s_len))
        keep = causal if keep is None else logical_and(keep, causal)
    if keep is not None:
        big = min(float(ml_dtypes.finfo(logits_dt).max), float(np.finfo(np.float32).max))
        logits = where(keep, logits, -0.7 * big)
    probs = softmax_last(to_dtype(logits, np_dtype(result_type(logits_dt, "float32"))), False)
    probs = reshape(to_dtype(probs, k.dtype), (b, kv_heads, groups, t_len, s_len))
    v5 = reshape(transpose(v, (0, 2, 1, 3)), (b, kv_heads, 1, s_len, v_depth))           # (B, K, 1, S, Hv)
    out = transpose(matmul(probs, v5), (0, 3, 1, 2, 4))                                   # (B, T, K, G, Hv)
    return reshape(out, (b, t_len, heads, v_depth))

