"""Dense linear algebra primitives on (batches of) matrices: Cholesky, LU, QR, SVD, symmetric and
general eigendecompositions, inverses, determinants and linear solves.

Each function takes raw arrays whose last two axes are the matrices (every leading axis is a batch
axis; ``solve`` and ``triangular_solve`` broadcast them as ``numpy.matmul`` does), validates them and
routes on the first array like every kernel (``_dispatch.route``). The NumPy reference is LAPACK
through ``numpy.linalg``, except the LU factorisation with partial pivoting and the triangular solve,
which ``numpy.linalg`` does not expose and which are written here (SciPy is not a dependency).

float16 and bfloat16 are computed in float32 and rounded back (LAPACK has no half precision);
float32 and float64 in themselves. The caller (``dnnbind.ops``) converts integer inputs first.

The device side (:mod:`dnnbind.kernels._cuda.linalg`) has no cuSOLVER binding yet: each function
raises ``NotImplementedError`` naming the operation (never a silent host copy).

Failures LAPACK reports (a matrix that is not positive definite for ``cholesky``, a singular one for
``inv``/``solve``, an SVD or eigensolver that did not converge) raise ``numpy.linalg.LinAlgError``
(a ``ValueError``) naming the operation, as Keras's NumPy backend does.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._validate import BFLOAT16
from ._dispatch import as_array, route

__all__ = ["cholesky", "triangular_solve", "lu_factor", "inv", "solve", "det", "eigh", "eig", "svd", "qr"]

_F32 = np.dtype(np.float32)
_F64 = np.dtype(np.float64)
_LOW = (np.dtype(np.float16), BFLOAT16)


def _matrix(op: str, name: str, x: Any, *, square: bool = False) -> Any:
    x = as_array(x)
    if x.ndim < 2:
        raise ValueError(f"{op}: {name} must have rank >= 2 (a matrix or a batch of matrices), got shape "
                         f"{tuple(x.shape)}")
    if square and x.shape[-1] != x.shape[-2]:
        raise ValueError(f"{op}: {name} must be square in its last two axes, got shape {tuple(x.shape)}")
    if not (x.dtype.kind == "f" or x.dtype == BFLOAT16):
        raise TypeError(f"{op}: {name} must be a float array (float16, bfloat16, float32 or float64), got dtype "
                        f"{x.dtype}; cast it first")
    return x


def _system(op: str, a: Any, b: Any) -> "tuple[Any, Any]":
    """A linear system's square ``a`` (``(..., M, M)``) and right-hand sides ``b`` (``(..., M, K)``), checked."""
    a = _matrix(op, "a", a, square=True)
    b = _matrix(op, "b", b)
    if b.shape[-2] != a.shape[-1]:
        raise ValueError(f"{op}: b must have {a.shape[-1]} rows (a is {tuple(a.shape)}), got shape {tuple(b.shape)}")
    if a.dtype != b.dtype:
        raise TypeError(f"{op}: a and b must have one dtype, got {a.dtype} and {b.dtype}")
    return a, b


def _work(x: np.ndarray) -> np.ndarray:
    """``x`` in the type LAPACK computes it in."""
    return x.astype(_F32) if x.dtype in _LOW else x


def _back(value: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """A LAPACK result as a C-contiguous array of ``dtype``."""
    return np.ascontiguousarray(value.astype(dtype, copy=False))


def _lapack(op: str, what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
    try:
        with np.errstate(all="ignore"):
            return fn(*args, **kwargs)
    except np.linalg.LinAlgError as exc:
        raise np.linalg.LinAlgError(f"{op}: {what} ({exc})") from None


def _square(op: str, x: Any, failure: str, fn: Any, stream: Any) -> Any:
    """A LAPACK function of each square matrix with one result of ``x``'s dtype (``cholesky``, ``inv``, ``det``)."""
    x = _matrix(op, "x", x, square=True)
    impl = route(op, "linalg", x=x)
    if impl is not None:
        return getattr(impl, op)(x, stream=stream)
    return _back(np.asarray(_lapack(op, failure, fn, _work(x))), x.dtype)


def cholesky(x: Any, *, stream: Any = None) -> Any:
    """The lower Cholesky factor ``L`` of each symmetric positive-definite matrix (``x = L @ L.T``); only
    the lower triangle of ``x`` is read."""
    return _square("cholesky", x, "the matrix is not positive definite", np.linalg.cholesky, stream)


def triangular_solve(a: Any, b: Any, *, lower: bool, stream: Any = None) -> Any:
    """``x`` with ``a @ x = b`` for triangular ``a`` (``(..., M, M)``: only its lower triangle when
    ``lower``, else its upper one, is read, as BLAS ``trsm`` does) and ``b`` of shape ``(..., M, K)``;
    batch axes broadcast. Forward or back substitution: a zero on the diagonal gives inf/NaN, as trsm."""
    op = "triangular_solve"
    a, b = _system(op, a, b)
    impl = route(op, "linalg", a=a, b=b)
    if impl is not None:
        return impl.triangular_solve(a, b, lower=bool(lower), stream=stream)
    batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    n, k = a.shape[-1], b.shape[-1]
    aa = np.broadcast_to(_work(a), batch + (n, n))
    x = np.array(np.broadcast_to(_work(b), batch + (n, k)))
    rows = range(n) if lower else range(n - 1, -1, -1)
    with np.errstate(all="ignore"):
        for i in rows:
            done = slice(0, i) if lower else slice(i + 1, n)
            rest = x[..., i:i + 1, :] - aa[..., i:i + 1, done] @ x[..., done, :]
            x[..., i:i + 1, :] = rest / aa[..., i:i + 1, i:i + 1]
    return _back(x, a.dtype)


def lu_factor(x: Any, *, stream: Any = None) -> "tuple[Any, Any, Any]":
    """The LU factorisation with partial pivoting of each ``(M, N)`` matrix, as LAPACK ``getrf`` and
    SciPy's ``lu_factor``: ``(lu, pivots, permutation)`` where ``lu`` packs the unit lower factor
    (strictly below the diagonal) and the upper one, ``pivots`` (int32, ``(..., min(M, N))``) says row
    ``i`` was interchanged with row ``pivots[i]``, and ``permutation`` (int32, ``(..., M)``) is the
    resulting row order: ``x[..., permutation, :] = L @ U``. A zero pivot column is left unscaled."""
    op = "lu_factor"
    x = _matrix(op, "x", x)
    impl = route(op, "linalg", x=x)
    if impl is not None:
        return impl.lu_factor(x, stream=stream)
    m, n = x.shape[-2:]
    k = min(m, n)
    batch = x.shape[:-2]
    lu = np.array(_work(x), order="C").reshape((-1, m, n))
    count = lu.shape[0]
    pivots = np.zeros((count, k), np.int32)
    perm = np.tile(np.arange(m, dtype=np.int32), (count, 1))
    rows = np.arange(count)
    with np.errstate(all="ignore"):
        for j in range(k):
            p = j + np.argmax(np.abs(lu[:, j:, j]), axis=1)
            pivots[:, j] = p
            lu[rows, j], lu[rows, p] = lu[rows, p].copy(), lu[rows, j].copy()
            perm[rows, j], perm[rows, p] = perm[rows, p].copy(), perm[rows, j].copy()
            d = lu[:, j, j]
            nonzero = (d != 0)[:, None]
            lu[:, j + 1:, j] = np.where(nonzero, lu[:, j + 1:, j] / np.where(nonzero[:, 0], d, 1)[:, None],
                                        lu[:, j + 1:, j])
            lu[:, j + 1:, j + 1:] -= lu[:, j + 1:, j:j + 1] * lu[:, j:j + 1, j + 1:]
    return (_back(lu.reshape(batch + (m, n)), x.dtype), pivots.reshape(batch + (k,)),
            perm.reshape(batch + (m,)))


def inv(x: Any, *, stream: Any = None) -> Any:
    """The inverse of each square matrix."""
    return _square("inv", x, "the matrix is singular", np.linalg.inv, stream)


def solve(a: Any, b: Any, *, stream: Any = None) -> Any:
    """``x`` with ``a @ x = b`` (``a``: ``(..., M, M)``, ``b``: ``(..., M, K)``; batch axes broadcast)."""
    op = "solve"
    a, b = _system(op, a, b)
    impl = route(op, "linalg", a=a, b=b)
    if impl is not None:
        return impl.solve(a, b, stream=stream)
    wa, wb = _work(a), _work(b)
    batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    wa = np.broadcast_to(wa, batch + a.shape[-2:])
    wb = np.broadcast_to(wb, batch + b.shape[-2:])
    return _back(_lapack(op, "the matrix a is singular", np.linalg.solve, wa, wb), a.dtype)


def det(x: Any, *, stream: Any = None) -> Any:
    """The determinant of each square matrix (LAPACK's LU, as ``numpy.linalg.det``)."""
    return _square("det", x, "LAPACK failed", np.linalg.det, stream)


def eigh(x: Any, *, stream: Any = None) -> "tuple[Any, Any]":
    """``(w, v)``: the eigenvalues (ascending) and orthonormal eigenvectors (columns) of each symmetric
    matrix; only its lower triangle is read."""
    op = "eigh"
    x = _matrix(op, "x", x, square=True)
    impl = route(op, "linalg", x=x)
    if impl is not None:
        return impl.eigh(x, stream=stream)
    w, v = _lapack(op, "the eigensolver did not converge", np.linalg.eigh, _work(x))
    return _back(w, x.dtype), _back(v, x.dtype)


def eig(x: Any, *, stream: Any = None) -> "tuple[Any, Any]":
    """``(w, v)``: the eigenvalues and unit eigenvectors (columns) of each general square matrix, always
    complex (complex64 for float32 and narrower, complex128 for float64), as JAX returns them."""
    op = "eig"
    x = _matrix(op, "x", x, square=True)
    impl = route(op, "linalg", x=x)
    if impl is not None:
        return impl.eig(x, stream=stream)
    w, v = _lapack(op, "the eigensolver did not converge", np.linalg.eig, _work(x))
    ct = np.dtype(np.complex128) if x.dtype == _F64 else np.dtype(np.complex64)
    return _back(w, ct), _back(v, ct)


def svd(x: Any, *, full_matrices: bool = True, compute_uv: bool = True, stream: Any = None) -> Any:
    """``(u, s, vh)`` with ``x = u @ diag(s) @ vh`` (``s`` descending; ``u``/``vh`` square when
    ``full_matrices``, else ``(..., M, K)``/``(..., K, N)``, ``K = min(M, N)``), or ``s`` alone."""
    op = "svd"
    x = _matrix(op, "x", x)
    impl = route(op, "linalg", x=x)
    if impl is not None:
        return impl.svd(x, full_matrices=bool(full_matrices), compute_uv=bool(compute_uv), stream=stream)
    res = _lapack(op, "the SVD did not converge", np.linalg.svd, _work(x), full_matrices=bool(full_matrices),
                  compute_uv=bool(compute_uv))
    if not compute_uv:
        return _back(res, x.dtype)
    return tuple(_back(r, x.dtype) for r in res)


def qr(x: Any, *, mode: str = "reduced", stream: Any = None) -> "tuple[Any, Any]":
    """``(q, r)`` with ``x = q @ r`` (Householder, LAPACK ``geqrf``/``orgqr``): ``mode="reduced"`` gives
    ``(..., M, K)`` and ``(..., K, N)``, ``"complete"`` ``(..., M, M)`` and ``(..., M, N)``."""
    op = "qr"
    if mode not in ("reduced", "complete"):
        raise ValueError(f"{op}: mode must be 'reduced' or 'complete', got {mode!r}")
    x = _matrix(op, "x", x)
    impl = route(op, "linalg", x=x)
    if impl is not None:
        return impl.qr(x, mode=mode, stream=stream)
    q, r = _lapack(op, "LAPACK failed", np.linalg.qr, _work(x), mode=mode)
    return _back(q, x.dtype), _back(r, x.dtype)
