"""Dense layers and matmul on cuBLAS (``cublasGemmEx`` through :func:`dnnbind.cublas.gemm`).

Arrays are row-major; cuBLAS is column-major. A row-major (r, c) buffer *is* the
column-major (c, r) matrix, its transpose, so ``C = op(A) @ op(B)`` is computed as
``C^T = op(B)^T @ op(A)^T`` with the operands swapped and no copies:

* ``y = x @ w``  (x (M, K), w (K, N)):  gemm(N, N, m=N, n=M, k=K, A=w, lda=N, B=x, ldb=K, C=y, ldc=N)

Compute: float32 data uses CUBLAS_COMPUTE_32F_FAST_TF32 when ``config.allow_tf32`` and
CUBLAS_COMPUTE_32F otherwise; float16/bfloat16 use CUBLAS_COMPUTE_32F (float32
accumulation); float64 uses CUBLAS_COMPUTE_64F. The bias add is the ``bias_add`` kernel.
"""

from __future__ import annotations

from typing import Any

from ..._lib.cublas import Operation
from ...cublas import gemm as _cublas_gemm
from . import _common as cm
from .conv import bias_add
from .elementwise import scale

__all__ = ["dense_forward", "dense_backward_input", "dense_backward_weight", "matmul"]


def _compute(dtype) -> str:
    if dtype == cm.F32:
        return "tf32" if cm.config().allow_tf32 else "float32"
    if dtype == cm.F64:
        return "float64"
    return "float32"


_OP_N = Operation.N
_OP_T = Operation.T


def _gemm(stream, a: Any, b: Any, c: Any, m: int, n: int, k: int, transpose_a: bool, transpose_b: bool,
          alpha: float = 1.0, beta: float = 0.0) -> None:
    """Row-major ``c (m, n) = alpha * op(a) @ op(b) + beta * c`` with ``op(a)`` (m, k) and ``op(b)`` (k, n).

    ``a`` is stored (m, k), or (k, m) when ``transpose_a``; ``b`` is (k, n) or (n, k).
    """
    if m == 0 or n == 0:
        return
    lda = m if transpose_a else k  # row length of a's buffer
    ldb = k if transpose_b else n
    # Column-major view: C^T (n, m) = op(b)^T (n, k) @ op(a)^T (k, m).
    op_b = _OP_T if transpose_b else _OP_N
    op_a = _OP_T if transpose_a else _OP_N
    _cublas_gemm(cm.cublas_handle(stream), op_b, op_a, n, m, k, alpha, b.ptr, ldb, a.ptr, lda, beta, c.ptr, n,
         a_dtype=b.dtype, b_dtype=a.dtype, c_dtype=c.dtype, compute=_compute(a.dtype))


def _rows(x: Any) -> int:
    return cm.size_of(x.shape[:-1])


def dense_forward(x: Any, w: Any, b: Any = None, *, out: Any = None, stream: Any = None) -> Any:
    """``y = x @ w (+ b)``: x (..., in), w (in, out), b (out,) -> (..., out)."""
    s = cm.stream_of(stream)
    k, n = int(w.shape[0]), int(w.shape[1])
    m = _rows(x)
    y = cm.output(out, tuple(x.shape[:-1]) + (n,), x.dtype, s)
    if k == 0:
        cm.memset(y, 0, s)
    else:
        _gemm(s, x, w, y, m, n, k, False, False)
    if b is not None:
        bias_add(y, b, layout="NHWC", out=y, stream=s)  # channel axis = last axis
    return y


def dense_backward_input(dy: Any, w: Any, *, out: Any = None, stream: Any = None) -> Any:
    """``dx = dy @ w.T``: dy (..., out) -> (..., in)."""
    s = cm.stream_of(stream)
    k_in, n_out = int(w.shape[0]), int(w.shape[1])
    dx = cm.output(out, tuple(dy.shape[:-1]) + (k_in,), dy.dtype, s)
    if n_out == 0:
        cm.memset(dx, 0, s)
        return dx
    _gemm(s, dy, w, dx, _rows(dy), k_in, n_out, False, True)
    return dx


def dense_backward_weight(x: Any, dy: Any, *, out: Any = None, stream: Any = None) -> Any:
    """``dw = x.T @ dy`` summed over all leading axes: (in, out)."""
    s = cm.stream_of(stream)
    k_in, n_out = int(x.shape[-1]), int(dy.shape[-1])
    rows = _rows(x)
    dw = cm.output(out, (k_in, n_out), x.dtype, s)
    if rows == 0:
        cm.memset(dw, 0, s)
        return dw
    _gemm(s, x, dy, dw, k_in, n_out, rows, True, False)
    return dw


def matmul(a: Any, b: Any, *, transpose_a: bool = False, transpose_b: bool = False, alpha: float = 1.0,
           beta: float = 0.0, out: Any = None, stream: Any = None) -> Any:
    """``alpha * op(a) @ op(b) + beta * out`` for 2-d a, b (``out`` is read when beta != 0)."""
    s = cm.stream_of(stream)
    m, k = (int(a.shape[1]), int(a.shape[0])) if transpose_a else (int(a.shape[0]), int(a.shape[1]))
    n = int(b.shape[0]) if transpose_b else int(b.shape[1])
    c = cm.output(out, (m, n), a.dtype, s)
    if k == 0:
        if beta == 0.0:
            cm.memset(c, 0, s)
        else:
            scale(c, beta, out=c, stream=s)
        return c
    _gemm(s, a, b, c, m, n, k, transpose_a, transpose_b, float(alpha), float(beta))
    return c
