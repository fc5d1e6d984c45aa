"""``keras.ops.dot_product_attention``: scaled dot-product attention with Keras's (``jax.nn``'s) semantics
(``(batch, time, heads, depth)`` layout, grouped-query heads, additive ``bias``, boolean ``mask`` and
``is_causal`` broadcast over ``(batch, heads, target, source)``), composed from ``matmul`` (cuBLAS, batched
over the key/value heads with the query groups broadcast) and the softmax kernel.

:func:`fused_attention` runs cuDNN's fused flash attention (``kernels.sdpa_forward``/``sdpa_backward``) where
it applies (float16/bfloat16 on the device, see its docstring) and returns None elsewhere, for the composed path.
"""

from __future__ import annotations

import math
from typing import Any

import ml_dtypes
import numpy as np

from .. import kernels
from ..autodiff.engine import recording
from ..autodiff.tensor import Tensor
from ..kernels import numeric as N
from ._activations import softmax_last
from ._core import is_float, keras_op, make, np_dtype, result_type, tensors
from ._elementwise import add, logical_and, multiply, subtract, where
from ._nn_common import op, to_dtype

__all__ = ["dot_product_attention", "fused_attention"]


_FUSED_DTYPES = (np.dtype(np.float16), ml_dtypes.bfloat16)
_MASK_FILL = -0.7 * float(np.finfo(np.float32).max)  # Keras's masked logit


def _contiguous(t: Tensor) -> bool:
    return getattr(t.data, "is_contiguous", True)


def fused_attention(query: Tensor, key: Tensor, value: Tensor, bias: "Tensor | None", mask: "Tensor | None",
                    scale: float, is_causal: bool) -> "Tensor | None":
    """cuDNN's fused flash attention (``kernels.sdpa_forward``/``sdpa_backward``: one recorded node, the
    softmax statistics saved instead of the probabilities), where it applies; else None (the composed
    path runs). Arguments are converted (one float dtype; ``bias``/``mask`` 4-d).

    It applies on device arrays of float16/bfloat16 with as many key/value heads as query heads, head dims
    that are multiples of 8 up to 256, a ``bias`` that needs no gradient, and a ``mask`` only in bfloat16
    (it becomes an additive bias of 0 / Keras's masked logit ``-0.7 * float32 max``, which float16 cannot
    hold), when cuDNN builds the plans. A row masked completely (every source masked) attends uniformly,
    as Keras's; under ``is_causal`` as well it attends uniformly over the causal sources only."""
    from .. import backend as _b

    if not _b.is_device_array(query.data) or np.dtype(query.dtype) not in _FUSED_DTYPES:
        return None
    heads, kv_heads = int(query.shape[2]), int(key.shape[2])
    if heads != kv_heads or not all(_contiguous(t) for t in (query, key, value)):
        return None
    if bias is not None and (getattr(bias, "_node", None) is not None or not _contiguous(bias)):
        return None
    if mask is not None and np.dtype(query.dtype) != ml_dtypes.bfloat16:
        return None
    b, t_len, s_len = int(query.shape[0]), int(query.shape[1]), int(key.shape[1])
    add_bias = bias
    if mask is not None:
        fill = where(mask, 0.0, _MASK_FILL)
        add_bias = to_dtype(fill if add_bias is None else add(add_bias, fill), query.dtype)
    if add_bias is not None:
        bshape = tuple(int(s) for s in add_bias.shape)
        full = (bshape[0], bshape[1], t_len, s_len)
        if bshape != full:
            add_bias = op("broadcast_to")(add_bias, full)
        if not _contiguous(add_bias) or getattr(add_bias.data, "strides", None) is not None and \
                not add_bias.data.is_contiguous:
            return None
        if full[0] not in (1, b) or full[1] not in (1, heads):
            return None
    raw_bias = None if add_bias is None else add_bias.data
    if not kernels.sdpa_supported(query.data, key.data, value.data, causal=is_causal, bias=raw_bias, scale=scale):
        return None
    o, stats = kernels.sdpa_forward(query.data, key.data, value.data, scale=scale, causal=is_causal, bias=raw_bias)

    def backward(node: Any, g: Tensor) -> tuple:
        need = node.needs_input_grad
        if recording():  # an outer tape records the backward: write it in ops, differentiable again
            dq, dk, dv = _composed_grads(query, key, value, bias, mask, scale, is_causal, g)
        else:
            gd = g.data if g.dtype == query.dtype else op("cast")(g, query.dtype).data
            if not getattr(gd, "is_contiguous", True):
                gd = op("copy")(Tensor(gd)).data
            dqr, dkr, dvr = kernels.sdpa_backward(gd, query.data, key.data, value.data, o, stats, scale=scale,
                                                  causal=is_causal, bias=raw_bias)
            dq, dk, dv = Tensor(dqr), Tensor(dkr), Tensor(dvr)
        return (dq if need[0] else None, dk if need[1] else None, dv if need[2] else None)

    return make(o, (query, key, value), backward, "dot_product_attention")


def _composed_grads(q: Tensor, k: Tensor, v: Tensor, bias: "Tensor | None", mask: "Tensor | None", scale: float,
                    is_causal: bool, g: Tensor) -> tuple:
    """``(dq, dk, dv)`` of attention with as many key/value heads as query heads, written in ops (so an outer
    tape records them: higher-order gradients), computed in float32 and returned in ``q``'s dtype."""
    einsum, sum_ = op("einsum"), op("sum")
    f32 = np.dtype(np.float32)
    qc, kc, vc, gc = (to_dtype(t, f32) for t in (q, k, v, g))
    logits = multiply(einsum("btnh,bsnh->bnts", qc, kc), scale)
    if bias is not None:
        logits = add(logits, to_dtype(bias, f32))
    t_len, s_len = int(q.shape[1]), int(k.shape[1])
    keep = mask
    if is_causal:
        rows = N.iota(t_len, 0, 1, np.int32, device=q.device).reshape(t_len, 1)
        cols = N.iota(s_len, 0, 1, np.int32, device=q.device).reshape(1, s_len)
        causal = Tensor(N.binary("greater_equal", rows, cols).reshape(1, 1, t_len, s_len))
        keep = causal if keep is None else logical_and(keep, causal)
    if keep is not None:
        logits = where(keep, logits, _MASK_FILL)
    p = softmax_last(logits, False)
    dv = einsum("bnts,btnh->bsnh", p, gc)
    dp = einsum("btnh,bsnh->bnts", gc, vc)
    ds = multiply(multiply(p, subtract(dp, sum_(multiply(dp, p), axis=-1, keepdims=True))), scale)
    dq = einsum("bnts,bsnh->btnh", ds, kc)
    dk = einsum("bnts,btnh->bsnh", ds, qc)
    return to_dtype(dq, q.dtype), to_dtype(dk, k.dtype), to_dtype(dv, v.dtype)


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
    masked row attends uniformly, as Keras). ``flash_attention=True`` needs the fused path (cuDNN's flash attention,
    see :func:`fused_attention`; an error where it does not apply); ``attn_logits_soft_cap`` is refused as Keras refuses it off TPUs."""
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
    if flash_attention is None:
        from .. import config as _config

        if _config.is_flash_attention_enabled() is False:  # keras.config.disable_flash_attention()
            flash_attention = False
    if flash_attention is not False:
        fused = fused_attention(q, k, v, bias_t, mask_t, scale, bool(is_causal))
        if fused is not None:
            return fused
        if flash_attention:
            raise ValueError(f"{owner}: flash_attention=True needs cuDNN's fused attention, which does not apply "
                             f"here (it needs float16/bfloat16 device arrays, as many key/value heads as query "
                             f"heads, head dims that are multiples of 8 up to 256, and a bias without a "
                             f"gradient; got {q.dtype} query {tuple(q.shape)}, key {tuple(k.shape)}); pass "
                             "flash_attention=None or False")
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

