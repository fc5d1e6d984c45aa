"""Layer normalization on NVRTC kernels (``layernorm.cu``); no cuDNN call, no host synchronisation.

Forward and the data gradient run one block per row (``rows`` = product of the leading axes).
The parameter gradients are column sums over all rows, taken in two passes (row blocks into a
float32/float64 partial buffer, then the partials in block order), so they are deterministic;
the partial buffer is allocated on the call's stream and dies with the call, so the op may be
captured into a CUDA graph (nothing it allocates outlives it but its outputs).
"""

from __future__ import annotations

from typing import Any

from . import _common as cm

__all__ = ["layernorm_forward", "layernorm_backward"]

_SOURCE = "layernorm.cu"


def _block_for(cols: int) -> int:
    """Threads per row block: a multiple of 32 (block_sum), at most 256, no idle warps for short rows."""
    return max(32, min(256, -(-cols // 32) * 32))


def _param_dtype(dtype) -> Any:
    return cm.F64 if dtype == cm.F64 else cm.F32


def layernorm_forward(x: Any, gamma: Any, beta: Any, *, epsilon: float, norm_ndim: int, rows: int, cols: int,
                      out: Any = None, stream: Any = None) -> "tuple[Any, Any, Any]":
    """``(y, mean, inv_std)``; statistics of shape ``x.shape[:-norm_ndim]``."""
    s = cm.stream_of(stream)
    y = cm.output(out, x.shape, x.dtype, s)
    stats_shape = tuple(int(d) for d in x.shape[:x.ndim - norm_ndim])
    pdt = _param_dtype(x.dtype)
    mean = cm.empty(stats_shape, pdt, s)
    inv_std = cm.empty(stats_shape, pdt, s)
    cm.launch_rows(_SOURCE, f"layernorm_fwd_{cm.suffix(x.dtype)}", rows,
                   (cm.p(x), cm.p(y), cm.p(gamma), cm.p(beta), cm.p(mean), cm.p(inv_std), cm.i64(rows),
                    cm.i64(cols), cm.f64(epsilon)), s, block=_block_for(cols))
    return y, mean, inv_std


def layernorm_backward(dy: Any, x: Any, gamma: Any, mean: Any, inv_std: Any, *, norm_ndim: int, rows: int,
                       cols: int, param_grads: bool = True, out: Any = None, dgamma_out: Any = None,
                       dbeta_out: Any = None, stream: Any = None) -> "tuple[Any, Any, Any]":
    """``(dx, dgamma, dbeta)`` (the last two None without ``param_grads``)."""
    s = cm.stream_of(stream)
    sfx = cm.suffix(x.dtype)
    dx = cm.output(out, x.shape, x.dtype, s)
    cm.launch_rows(_SOURCE, f"layernorm_bwd_dx_{sfx}", rows,
                   (cm.p(dy), cm.p(x), cm.p(gamma), cm.p(mean), cm.p(inv_std), cm.p(dx), cm.i64(rows),
                    cm.i64(cols)), s, block=_block_for(cols))
    if not param_grads:
        return dx, None, None
    pdt = _param_dtype(x.dtype)
    pshape = tuple(int(d) for d in x.shape[x.ndim - norm_ndim:])
    dgamma = cm.output(dgamma_out, pshape, pdt, s)
    dbeta = cm.output(dbeta_out, pshape, pdt, s)
    # At most 1024 row blocks of >= 64 rows: a few partial rows to fold, enough blocks to fill the GPU.
    rows_per_block = max(64, -(-rows // 1024))
    blocks = -(-rows // rows_per_block)
    partial_g = cm.empty((max(blocks, 1), cols), pdt, s)
    partial_b = cm.empty((max(blocks, 1), cols), pdt, s)
    cm.launch_rows(_SOURCE, f"layernorm_bwd_params_rows_{sfx}", blocks,
                   (cm.p(dy), cm.p(x), cm.p(mean), cm.p(inv_std), cm.p(partial_g), cm.p(partial_b), cm.i64(rows),
                    cm.i64(cols), cm.i64(rows_per_block)), s, block=256)
    cm.launch(_SOURCE, f"layernorm_bwd_params_final_{sfx}", cols,
              (cm.p(partial_g), cm.p(partial_b), cm.p(dgamma), cm.p(dbeta), cm.i64(blocks), cm.i64(cols)), s)
    return dx, dgamma, dbeta

