"""``keras.ops.linalg``: factorisations, inverses, solves, determinants, norms and ``jvp``, with the
VJPs JAX gives them (the reference of Keras's numerics), written in ops so they differentiate again.

The factorisations (``cholesky``, ``lu_factor``, ``qr``, ``svd``, ``eigh``, ``eig``, ``inv``, ``solve``,
``solve_triangular`` and what builds on them) are :mod:`dnnbind.kernels.linalg` primitives: LAPACK
through NumPy on the CPU backend; on a GPU they raise ``NotImplementedError`` naming the op (no
cuSOLVER binding yet, and no hidden host copy). What composes from matmuls, elementwise ops and
reductions runs on both: ``norm`` (every vector order; the Frobenius, 1 and inf matrix norms),
``det`` of 1x1 to 3x3 matrices (JAX's explicit formulas) and ``jvp``.

As JAX does, ``cholesky`` and ``eigh`` symmetrize their input (``(x + x.T) / 2``) first, so their
gradients are symmetric; results are floats (ints and bool become floatx); 64-bit types stay 64-bit.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np

from .. import backend
from .._validate import BFLOAT16
from ..autodiff.engine import stop_recording
from ..autodiff.tape import GradientTape, _flatten as _tree_flatten  # the tapes' own (nested list/tuple/dict)
from ..autodiff.tensor import Tensor
from ..kernels import linalg as LA
from ..kernels import numeric as N
from . import _core
from ._core import is_float, keras_op, make, needs_grad, tensors
from ._creation import tril, triu
from ._elementwise import (abs as _abs, add, cast, divide, greater, greater_equal, logical_and, multiply,
                           negative, not_equal, power, sqrt, subtract, where)
from ._indexing import take_along_axis
from ._matmul import matmul
from ._reductions import max as _max, min as _min, sum as _sum
from ._shape import concatenate, expand_dims, moveaxis, reshape, squeeze, swapaxes

__all__ = ["cholesky", "cholesky_inverse", "det", "eig", "eigh", "inv", "jvp", "lstsq", "lu_factor", "matrix_rank",
           "norm", "pinv", "qr", "solve", "solve_triangular", "svd"]


# ---------------------------------------------------------------------------------------- helpers
def _mT(x: Tensor) -> Tensor:
    """The matrices of ``x`` transposed (its last two axes swapped)."""
    return swapaxes(x, -1, -2)


def _float(t: Tensor) -> Tensor:
    """``t`` as a float tensor (JAX's ``promote_dtypes_inexact``: ints and bool become floatx)."""
    return t if is_float(t.dtype) else cast(t, _core.floatx())


def _floats(*ts: Tensor) -> list:
    """Tensors in one float dtype: Keras's promotion of theirs, ints and bool made floatx."""
    dt = _core.np_dtype(_core.result_type(*ts))
    if not is_float(dt):
        dt = _core.floatx()
    return [t if t.dtype == dt else cast(t, dt) for t in ts]


def _matrix(op: str, name: str, t: Tensor, *, square: bool = False) -> None:
    if t.ndim < 2:
        raise ValueError(f"{op}: {name} must have rank >= 2 (a matrix or a batch of matrices), got shape {t.shape}")
    if square and t.shape[-1] != t.shape[-2]:
        raise ValueError(f"{op}: {name} must be square in its last two axes, got shape {t.shape}")


def _host_only(op: str, *ts: Tensor) -> None:
    """Refuse device tensors for an op built on LAPACK, before any kernel runs."""
    if any(backend.is_device_array(t.data) for t in ts):
        raise NotImplementedError(
            f"{op}: dense linear algebra has no CUDA implementation yet (dnnbind binds no cuSOLVER); compute it on "
            "the CPU backend: dnnbind.set_default_device('cpu') and NumPy inputs, or tensor.numpy() first")


def _const(host: np.ndarray, like: Tensor) -> Tensor:
    """A host constant in ``like``'s dtype, on ``like``'s device."""
    return _core.tensor(np.ascontiguousarray(np.asarray(host).astype(like.dtype)), like.data)


def _eye_like(n: int, like: Tensor) -> Tensor:
    return _const(np.eye(n), like)


def _diag_embed(d: Tensor) -> Tensor:
    """Square matrices with ``d`` (``(..., K)``) on their diagonals."""
    return multiply(expand_dims(d, -1), _eye_like(d.shape[-1], d))


def _zeros_like(t: Tensor) -> Tensor:
    return _core.filled(0.0, t.shape, t.dtype, t.device)


def _rmul_inv_t(y: Tensor, r: Tensor, lower: bool) -> Tensor:
    """``y @ inv(r).T`` for triangular ``r`` (``inv(r) @ y.T``, transposed)."""
    return _mT(_triangular_solve(r, _mT(y), lower))


# ------------------------------------------------------------------------------ triangular solves
def _triangular_solve(a: Tensor, b: Tensor, lower: bool) -> Tensor:
    """``inv(tri(a)) @ b`` for ``b`` of shape ``(..., M, K)`` (batch axes broadcast), differentiable in both."""
    out = LA.triangular_solve(a.data, b.data, lower=lower)
    a_shape, b_shape = tuple(a.shape), tuple(b.shape)

    def backward(node: Any, g: Tensor) -> tuple:
        x = node.output(0)
        gb = _triangular_solve(_mT(a), g, not lower)  # inv(a).T @ g
        ga = None
        if node.needs_input_grad[0]:
            ga = negative(matmul(gb, _mT(x)))
            ga = _core.unbroadcast(tril(ga) if lower else triu(ga), a_shape)
        return ga, _core.unbroadcast(gb, b_shape)

    return make(out, (a, b), backward, "solve_triangular", keep_outputs=True)


def _check_rhs(op: str, a: Tensor, b: Tensor) -> None:
    """Keras's ``_assert_a_b_compat``: ``b`` is ``(..., M)`` or ``(..., M, K)`` against ``a`` ``(..., M, M)``."""
    if b.ndim < 1:
        raise ValueError(f"{op}: b must have rank >= 1, got a scalar")
    if a.ndim == b.ndim and a.shape[-2] != b.shape[-2]:
        raise ValueError(f"{op}: incompatible shapes: a.shape[-2] must equal b.shape[-2], got a.shape={a.shape}, "
                         f"b.shape={b.shape}")
    if a.ndim == b.ndim + 1 and a.shape[-1] != b.shape[-1]:
        raise ValueError(f"{op}: incompatible shapes: a.shape[-1] must equal b.shape[-1], got a.shape={a.shape}, "
                         f"b.shape={b.shape}")


@keras_op(family="linalg")
def solve_triangular(a: Any, b: Any, lower: bool = False) -> Tensor:
    """``keras.ops.solve_triangular``: ``x`` with ``a @ x = b``, reading only the lower (``lower=True``)
    or upper triangle of ``a``. ``b`` of rank ``a.ndim - 1`` is a (batch of) vector(s), as SciPy's."""
    ta, tb = tensors(a, b)
    _matrix("solve_triangular", "a", ta, square=True)
    _check_rhs("solve_triangular", ta, tb)
    _host_only("solve_triangular", ta, tb)
    ta, tb = _floats(ta, tb)
    vector = ta.ndim == tb.ndim + 1
    x = _triangular_solve(ta, expand_dims(tb, -1) if vector else tb, bool(lower))
    return squeeze(x, -1) if vector else x


# ----------------------------------------------------------------------------------------- cholesky
def _symmetrize(t: Tensor) -> Tensor:
    return multiply(add(t, _mT(t)), 0.5)


def _cholesky_lower(s: Tensor) -> Tensor:
    """The lower Cholesky factor of symmetric ``s`` (JAX's VJP: ``L^-T phi(L^T g) L^-1``, ``phi`` the
    lower triangle with its diagonal halved; the symmetrisation before makes it symmetric)."""
    out = LA.cholesky(s.data)

    def backward(node: Any, g: Tensor) -> tuple:
        low = node.output(0)
        n = low.shape[-1]
        phi = multiply(tril(matmul(_mT(low), g)), _const(np.tri(n) - 0.5 * np.eye(n), low))
        left = _triangular_solve(_mT(low), phi, False)  # L^-T phi
        return (_rmul_inv_t(left, _mT(low), False),)  # (L^-T phi) L^-1

    return make(out, (s,), backward, "cholesky", keep_outputs=True)


@keras_op(family="linalg")
def cholesky(x: Any, upper: bool = False) -> Tensor:
    """``keras.ops.cholesky``: the lower (or, ``upper=True``, upper) Cholesky factor of symmetric
    positive-definite matrices. A matrix that is not positive definite raises ``LinAlgError`` (a
    ``ValueError``), as Keras's backends do."""
    (t,) = tensors(x)
    _matrix("cholesky", "x", t, square=True)
    _host_only("cholesky", t)
    low = _cholesky_lower(_symmetrize(_float(t)))
    return _mT(low) if upper else low


@keras_op(family="linalg")
def cholesky_inverse(x: Any, upper: bool = False) -> Tensor:
    """``keras.ops.cholesky_inverse``: ``inv(A)`` from ``x``, the Cholesky factor of ``A`` (lower, or
    upper with ``upper=True``): ``inv(L).T @ inv(L)``, as Keras computes it (batched matrices are
    transposed in their last two axes)."""
    (t,) = tensors(x)
    _matrix("cholesky_inverse", "x", t, square=True)
    _host_only("cholesky_inverse", t)
    t = _float(t)
    inv_chol = _triangular_solve(t, _eye_like(t.shape[-1], t), not upper)
    return matmul(inv_chol, _mT(inv_chol)) if upper else matmul(_mT(inv_chol), inv_chol)


# ---------------------------------------------------------------------------------- inverse, solve
@keras_op(family="linalg")
def inv(x: Any) -> Tensor:
    """``keras.ops.inv``: the inverse of square matrices (a singular one raises ``LinAlgError``)."""
    (t,) = tensors(x)
    _matrix("inv", "x", t, square=True)
    _host_only("inv", t)
    t = _float(t)
    out = LA.inv(t.data)

    def backward(node: Any, g: Tensor) -> tuple:
        xi = _mT(node.output(0))
        return (negative(matmul(xi, matmul(g, xi))),)

    return make(out, (t,), backward, "inv", keep_outputs=True)


def _solve(a: Tensor, b: Tensor) -> Tensor:
    out = LA.solve(a.data, b.data)
    a_shape, b_shape = tuple(a.shape), tuple(b.shape)

    def backward(node: Any, g: Tensor) -> tuple:
        gb = _solve(_mT(a), g)
        ga = None
        if node.needs_input_grad[0]:
            ga = _core.unbroadcast(negative(matmul(gb, _mT(node.output(0)))), a_shape)
        return ga, _core.unbroadcast(gb, b_shape)

    return make(out, (a, b), backward, "solve", keep_outputs=True)


@keras_op(family="linalg")
def solve(a: Any, b: Any) -> Tensor:
    """``keras.ops.solve``: ``x`` with ``a @ x = b``. As JAX (and NumPy 2), ``b`` is a vector only when
    it is 1-d; otherwise ``(..., M, K)``."""
    ta, tb = tensors(a, b)
    _matrix("solve", "a", ta, square=True)
    _check_rhs("solve", ta, tb)
    if tb.ndim > 1 and ta.ndim == tb.ndim + 1 and ta.shape[-1] != tb.shape[-2]:
        raise ValueError(f"solve: b of shape {tb.shape} is not (..., M, K) for a of shape {ta.shape}: a batch of "
                         "vectors is written b[..., None] (and the result squeezed), as in JAX and NumPy 2")
    _host_only("solve", ta, tb)
    ta, tb = _floats(ta, tb)
    if tb.ndim == 1:
        return squeeze(_solve(ta, expand_dims(tb, -1)), -1)
    return _solve(ta, tb)


# ------------------------------------------------------------------------------------ determinants
def _det_small(t: Tensor) -> Tensor:
    """JAX's explicit 1x1, 2x2 and 3x3 determinants (compose: they run on every backend)."""
    a = lambda i, j: t[..., i, j]  # noqa: E731
    n = t.shape[-1]
    if n == 1:
        return a(0, 0)
    if n == 2:
        return subtract(multiply(a(0, 0), a(1, 1)), multiply(a(0, 1), a(1, 0)))
    terms = [((0, 0), (1, 1), (2, 2)), ((0, 1), (1, 2), (2, 0)), ((0, 2), (1, 0), (2, 1))]
    minus = [((0, 2), (1, 1), (2, 0)), ((0, 0), (1, 2), (2, 1)), ((0, 1), (1, 0), (2, 2))]
    prod = lambda ijs: multiply(multiply(a(*ijs[0]), a(*ijs[1])), a(*ijs[2]))  # noqa: E731
    out = add(add(prod(terms[0]), prod(terms[1])), prod(terms[2]))
    for ijs in minus:
        out = subtract(out, prod(ijs))
    return out


@keras_op(family="linalg")
def det(x: Any) -> Tensor:
    """``keras.ops.det``: determinants of square matrices. 1x1 to 3x3 by JAX's explicit formulas (any
    backend); larger by LU on the CPU, with the VJP ``g * det(x) * inv(x).T`` (NaN at an exactly
    singular matrix, where JAX's cofactor rule stays finite)."""
    (t,) = tensors(x)
    _matrix("det", "x", t, square=True)
    t = _float(t)
    n = t.shape[-1]
    if n == 0:
        return Tensor(N.full(t.shape[:-2], 1, t.dtype, device=t.device))
    if n <= 3:
        return _det_small(t)
    _host_only("det", t)
    out = LA.det(t.data)

    def backward(node: Any, g: Tensor) -> tuple:
        scale = expand_dims(multiply(g, node.output(0)), (-1, -2))
        return (multiply(scale, _mT(inv(t))),)

    return make(out, (t,), backward, "det", keep_outputs=True)


# --------------------------------------------------------------------------------------------- LU
@keras_op(family="linalg")
def lu_factor(x: Any) -> tuple:
    """``keras.ops.lu_factor``: ``(lu, pivots)`` of the LU factorisation with partial pivoting, as SciPy's
    (``pivots`` int32: row ``i`` was interchanged with row ``pivots[i]``); matrices may be rectangular.
    Differentiable in ``lu`` (JAX's rule: De Hoog, Anderssen and Lukas)."""
    (t,) = tensors(x)
    _matrix("lu_factor", "x", t)
    _host_only("lu_factor", t)
    t = _float(t)
    lu_raw, piv_raw, perm_raw = LA.lu_factor(t.data)
    m, n = t.shape[-2:]
    k = min(m, n)
    inverse_perm = np.argsort(perm_raw, axis=-1).astype(np.int32)  # host: perm_raw is a host array here

    def backward(node: Any, g_lu: "Tensor | None", g_piv: Any) -> tuple:
        if g_lu is None:
            return (None,)
        lu = node.output(0)
        low = tril(lu[..., :, :k], -1)
        if m > k:
            low = concatenate([low, _const(np.zeros(low.shape[:-1] + (m - k,)), lu)], axis=-1)
        low = add(low, _eye_like(m, lu))
        up = triu(lu[..., :k, :])
        if n > k:
            up = concatenate([up, _const(np.zeros(up.shape[:-2] + (n - k, n)), lu)], axis=-2)
            up = add(up, _const(np.diag((np.arange(n) >= k).astype(np.float64)), lu))
        g_lau = add(tril(matmul(_mT(low), g_lu), -1), triu(matmul(g_lu, _mT(up))))
        g_x = _rmul_inv_t(_triangular_solve(_mT(low), g_lau, False), up, False)  # L^-T g U^-T
        rows = _core.tensor(inverse_perm.reshape(inverse_perm.shape + (1,)), g_x.data)
        return (take_along_axis(g_x, rows, axis=-2),)

    lu, piv = make((lu_raw, piv_raw), (t,), backward, "lu_factor", keep_outputs=True, multiple=True)
    return lu, piv


# --------------------------------------------------------------------------------------------- QR
def _qr_thin_vjp(q: Tensor, r: Tensor, gq: Tensor, gr: Tensor) -> Tensor:
    """The cotangent of ``x`` (``(..., M, N)``, ``M >= N``) from those of its thin ``q``, ``r``: the
    transpose of JAX's ``_thin_qr_jvp``: ``(gq + q copyltu(M)) r^-T``, ``M = r gr^T - gq^T q``."""
    m_ = subtract(matmul(_mT(q), gq), matmul(gr, _mT(r)))
    n_ = subtract(tril(subtract(m_, _mT(m_)), -1), m_)
    return _rmul_inv_t(add(gq, matmul(q, n_)), r, False)


@keras_op(family="linalg")
def qr(x: Any, mode: str = "reduced") -> tuple:
    """``keras.ops.qr``: ``(q, r)`` (Householder, as LAPACK: JAX's and NumPy's signs). ``mode``:
    ``"reduced"`` or ``"complete"``. Differentiable in every case JAX's is (tall, square, wide,
    complete)."""
    if mode not in ("reduced", "complete"):
        raise ValueError(f"qr: mode must be one of {{'reduced', 'complete'}}, got mode={mode!r}")
    (t,) = tensors(x)
    _matrix("qr", "x", t)
    _host_only("qr", t)
    t = _float(t)
    q_raw, r_raw = LA.qr(t.data, mode=mode)
    m, n = t.shape[-2:]

    def backward(node: Any, gq: "Tensor | None", gr: "Tensor | None") -> tuple:
        q, r = node.output(0), node.output(1)
        gq = _zeros_like(q) if gq is None else gq
        gr = _zeros_like(r) if gr is None else gr
        if m < n:  # x = [x1 | x2], r = [r1 | r2]: x1 = q r1 is square, r2 = q^T x2 (JAX's wide case)
            x2, gr2 = t[..., :, m:], gr[..., :, m:]
            g_x1 = _qr_thin_vjp(q, r[..., :, :m], add(gq, matmul(x2, _mT(gr2))), gr[..., :, :m])
            return (concatenate([g_x1, matmul(q, gr2)], axis=-1),)
        if mode == "complete" and m > n:  # q = [q_mn | q_mp] (arXiv:2409.13374, eqs. 32-33, transposed)
            q_mn, q_mp = q[..., :, :n], q[..., :, n:]
            gq_mn, gq_mp = gq[..., :, :n], gq[..., :, n:]
            q_nn, q_pn = q_mn[..., :n, :], q_mn[..., n:, :]
            z = _mT(_solve(_mT(subtract(q_nn, _eye_like(n, q))), _mT(q_pn)))  # q_pn (q_nn - I)^-1
            ae = matmul(_mT(gq_mp), add(q_mn, matmul(q_mp, z)))
            gq_eff = add(add(gq_mn, matmul(gq_mp, z)), concatenate([matmul(_mT(z), ae), negative(ae)], axis=-2))
            return (_qr_thin_vjp(q_mn, r[..., :n, :], gq_eff, gr[..., :n, :]),)
        return (_qr_thin_vjp(q, r, gq, gr),)

    q, r = make((q_raw, r_raw), (t,), backward, "qr", keep_outputs=True, multiple=True)
    return q, r


# -------------------------------------------------------------------------------------------- SVD
def _svd(t: Tensor, full_matrices: bool) -> tuple:
    """``(u, s, vh)`` of ``t`` recorded with the VJP that transposes JAX's ``_svd_jvp_rule``."""
    u_raw, s_raw, vh_raw = LA.svd(t.data, full_matrices=full_matrices, compute_uv=True)
    m, n = t.shape[-2:]
    k = min(m, n)

    def backward(node: Any, gu: "Tensor | None", gs: "Tensor | None", gvh: "Tensor | None") -> tuple:
        u, s, vh = node.output(0), node.output(1), node.output(2)
        if full_matrices and m != n:
            if gu is not None or gvh is not None:
                raise NotImplementedError(
                    "svd: the gradient through u and v with full_matrices=True is not implemented for non-square "
                    f"matrices (shape {t.shape}), as in JAX; use full_matrices=False")
            u, vh = u[..., :, :k], vh[..., :k, :]
        v = _mT(vh)
        s_row, s_col = expand_dims(s, -2), expand_dims(s, -1)  # [i, j] = s_j and s_i
        eye = _eye_like(k, s)
        f = subtract(divide(1.0, add(multiply(add(s_row, s_col), subtract(s_row, s_col)), eye)), eye)
        gsm = _diag_embed(gs) if gs is not None else _core.filled(0.0, tuple(s.shape) + (k,), s.dtype, s.device)
        if gu is not None:
            j = multiply(f, matmul(_mT(u), gu))
            gsm = add(gsm, multiply(add(j, _mT(j)), s_row))
        gv = _mT(gvh) if gvh is not None else None
        if gv is not None:
            kk = multiply(f, matmul(_mT(v), gv))
            gsm = add(gsm, multiply(s_col, add(kk, _mT(kk))))
        ga = matmul(u, matmul(gsm, vh))
        if gu is not None and m > n:  # (I - u u^T) gu s^-1 vh
            ga = add(ga, matmul(divide(subtract(gu, matmul(u, matmul(_mT(u), gu))), s_row), vh))
        if gv is not None and n > m:  # u s^-1 ((I - v v^T) gv)^T
            ga = add(ga, matmul(u, _mT(divide(subtract(gv, matmul(v, matmul(_mT(v), gv))), s_row))))
        return (ga,)

    return make((u_raw, s_raw, vh_raw), (t,), backward, "svd", keep_outputs=True, multiple=True)


def _singular_values(t: Tensor) -> Tensor:
    """The singular values (descending), differentiable: through the full ``_svd`` when recording."""
    if needs_grad(t):
        return _svd(t, False)[1]
    return Tensor(LA.svd(t.data, full_matrices=False, compute_uv=False))


@keras_op(family="linalg")
def svd(x: Any, full_matrices: bool = True, compute_uv: bool = True) -> Any:
    """``keras.ops.svd``: ``(u, s, vh)`` with ``x = u @ diag(s) @ vh`` (``s`` descending), or ``s`` alone
    (``compute_uv=False``). Gradients as JAX's: through ``u``/``vh`` with ``full_matrices=True`` only for
    square matrices (``NotImplementedError`` otherwise, as in JAX); distinct singular values."""
    (t,) = tensors(x)
    _matrix("svd", "x", t)
    _host_only("svd", t)
    t = _float(t)
    if not compute_uv:
        return _singular_values(t)
    return _svd(t, bool(full_matrices))


# ------------------------------------------------------------------------------------ eigenvectors
def _eigh_sym(s: Tensor) -> tuple:
    """Eigenvalues (ascending) and eigenvectors of symmetric ``s``; JAX's rule: ``x_bar = v (diag(w_bar)
    + F * (v^T v_bar)) v^T``, ``F[i, j] = 1 / (w_j - w_i)`` off the diagonal."""
    w_raw, v_raw = LA.eigh(s.data)

    def backward(node: Any, gw: "Tensor | None", gv: "Tensor | None") -> tuple:
        w, v = node.output(0), node.output(1)
        inner = _diag_embed(gw) if gw is not None else None
        if gv is not None:
            eye = _eye_like(w.shape[-1], w)
            f = subtract(divide(1.0, add(eye, subtract(expand_dims(w, -2), expand_dims(w, -1)))), eye)
            term = multiply(f, matmul(_mT(v), gv))
            inner = term if inner is None else add(inner, term)
        return (matmul(v, matmul(inner, _mT(v))),)

    return make((w_raw, v_raw), (s,), backward, "eigh", keep_outputs=True, multiple=True)


@keras_op(family="linalg")
def eigh(x: Any) -> tuple:
    """``keras.ops.eigh``: ``(w, v)`` of symmetric matrices (``w`` ascending, ``v``'s columns orthonormal),
    computed from ``(x + x.T) / 2`` as JAX does (so the gradient is symmetric)."""
    (t,) = tensors(x)
    _matrix("eigh", "x", t, square=True)
    _host_only("eigh", t)
    return _eigh_sym(_symmetrize(_float(t)))


@keras_op(family="linalg", differentiable=False)
def eig(x: Any) -> tuple:
    """``keras.ops.eig``: ``(w, v)`` of general square matrices, complex (complex64, or complex128 for
    float64 input) as JAX returns them; the CPU backend only. Not differentiable: JAX does not
    differentiate eigenvectors of ``eig``, and dnnbind has no complex autodiff."""
    (t,) = tensors(x)
    _matrix("eig", "x", t, square=True)
    _host_only("eig", t)
    w, v = LA.eig(_float(t).data)
    return Tensor(w), Tensor(v)


# ------------------------------------------------------------------------- least squares, pinv, rank
def _eps(dtype: np.dtype) -> float:
    """Machine epsilon of a float dtype (bfloat16's is 2**-7)."""
    return 2.0 ** -7 if dtype == BFLOAT16 else float(np.finfo(dtype).eps)


def _per_matrix(value: Any, like: Tensor) -> Any:
    """A threshold per matrix (a number, or an array of the batch shape) ready to compare with ``like``'s
    ``(..., K)`` singular values."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    (t,) = tensors(value)
    return expand_dims(t, -1) if t.ndim else t


@keras_op(family="linalg")
def lstsq(a: Any, b: Any, rcond: Any = None) -> Tensor:
    """``keras.ops.lstsq``: the minimum-norm least-squares ``x`` of ``a @ x = b`` (``a``: ``(M, N)``, ``b``:
    ``(M,)`` or ``(M, K)``), by JAX's SVD algorithm: singular values below ``rcond * s_max`` (default
    ``eps * max(M, N)``; negative: ``eps``) are dropped. Differentiable through the SVD."""
    ta, tb = tensors(a, b)
    if ta.ndim != 2:
        raise ValueError(f"lstsq: a must have rank 2, got shape {ta.shape}")
    if tb.ndim not in (1, 2):
        raise ValueError(f"lstsq: b must have rank 1 or 2, got shape {tb.shape}")
    if tb.shape[0] != ta.shape[0]:
        raise ValueError(f"lstsq: b.shape[0] must equal a.shape[0], got a.shape={ta.shape}, b.shape={tb.shape}")
    _host_only("lstsq", ta, tb)
    ta, tb = _floats(ta, tb)
    m, n = ta.shape
    bm = expand_dims(tb, -1) if tb.ndim == 1 else tb
    if ta.size == 0:
        x = Tensor(N.full((n, bm.shape[1]), 0, ta.dtype, device=ta.device))
    else:
        eps = _eps(ta.dtype)
        if rcond is None:
            rc: Any = eps * max(m, n)
        elif isinstance(rcond, (int, float)):
            rc = eps if rcond < 0 else float(rcond)
        else:
            (rct,) = tensors(rcond)
            rc = where(_core.REGISTRY["less"]["fn"](rct, 0), eps, rct)
        u, s, vh = _svd(ta, False)
        mask = logical_and(greater(s, 0.0), greater_equal(s, multiply(rc, s[0])))
        s_inv = expand_dims(where(mask, divide(1.0, where(mask, s, 1.0)), 0.0), -1)
        x = matmul(_mT(vh), multiply(s_inv, matmul(_mT(u), bm)))
    return reshape(x, (n,)) if tb.ndim == 1 else x


@keras_op(family="linalg", differentiable=False)
def matrix_rank(x: Any, tol: Any = None) -> Tensor:
    """``keras.ops.matrix_rank``: int32 counts of singular values above ``tol`` (an absolute threshold;
    default ``s_max * max(M, N) * eps``, JAX's)."""
    (t,) = tensors(x)
    _matrix("matrix_rank", "x", t)
    _host_only("matrix_rank", t)
    t = _float(t)
    s = _singular_values(t)
    if tol is None:
        threshold: Any = multiply(_max(s, axis=-1, keepdims=True), float(max(t.shape[-2:])) * _eps(t.dtype))
    else:
        threshold = _per_matrix(tol, s)
    return _sum(greater(s, threshold), axis=-1)


@keras_op(family="linalg")
def pinv(x: Any, rcond: Any = None) -> Tensor:
    """``keras.ops.pinv``: the Moore-Penrose pseudo-inverse by SVD (singular values up to ``rcond *
    s_max`` dropped; default ``10 * max(M, N) * eps``, JAX's), with JAX's custom JVP transposed (Golub
    and Pereyra: defined where the rank is locally constant, also for repeated singular values)."""
    (t,) = tensors(x)
    _matrix("pinv", "x", t)
    _host_only("pinv", t)
    t = _float(t)
    m, n = t.shape[-2:]
    if m == 0 or n == 0:
        return Tensor(N.full(tuple(t.shape[:-2]) + (n, m), 0, t.dtype, device=t.device))
    rtol = 10.0 * max(m, n) * _eps(t.dtype) if rcond is None else rcond
    with stop_recording():
        u, s, vh = _svd(t, False)
        cutoff = multiply(_per_matrix(rtol, s), s[..., 0:1])
        s = where(greater(s, cutoff), s, math.inf)
        p = matmul(_mT(vh), divide(_mT(u), expand_dims(s, -1)))

    def backward(node: Any, g: Tensor) -> tuple:
        pm = node.output(0)  # (n, m)
        pt, gt = _mT(pm), _mT(g)
        term = negative(matmul(pt, matmul(g, pt)))
        t2 = matmul(gt, matmul(pm, pt))  # g^T p p^T
        term = add(term, subtract(t2, matmul(t, matmul(pm, t2))))  # (I - a p) g^T p p^T
        t3 = matmul(matmul(pt, pm), gt)  # p^T p g^T
        return (add(term, subtract(t3, matmul(matmul(t3, pm), t))),)  # + p^T p g^T (I - p a)

    return make(p.data, (t,), backward, "pinv", keep_outputs=True)


# -------------------------------------------------------------------------------------------- norm
def _norm_axes(axis: Any, ndim: int) -> tuple:
    items = (axis,) if isinstance(axis, (int, np.integer)) else tuple(axis)
    out = []
    for a in items:
        if not isinstance(a, (int, np.integer)) or isinstance(a, bool):
            raise TypeError(f"norm: axis must be an int or a tuple of ints, got {axis!r}")
        if not -ndim <= int(a) < ndim:
            raise ValueError(f"norm: axis {int(a)} is out of bounds for a tensor of rank {ndim}")
        out.append(int(a) % ndim)
    if len(set(out)) != len(out):
        raise ValueError(f"norm: axis {axis!r} repeats an axis")
    return tuple(out)


def _vector_norm(x: Tensor, ord: Any, axes: tuple, keepdims: bool) -> Tensor:  # noqa: A002 (Keras's name)
    if ord is None or ord == 2:
        return sqrt(_sum(multiply(x, x), axis=axes, keepdims=keepdims))
    if ord == math.inf:
        return _max(_abs(x), axis=axes, keepdims=keepdims)
    if ord == -math.inf:
        return _min(_abs(x), axis=axes, keepdims=keepdims)
    if ord == 0:
        return _sum(cast(not_equal(x, 0.0), x.dtype), axis=axes, keepdims=keepdims)
    if ord == 1:
        return _sum(_abs(x), axis=axes, keepdims=keepdims)
    if isinstance(ord, str):
        raise ValueError(f"norm: invalid ord {ord!r} for a vector norm (use an int, a float or +-inf)")
    p = float(ord)
    return power(_sum(power(_abs(x), p), axis=axes, keepdims=keepdims), 1.0 / p)


def _matrix_norm(x: Tensor, ord: Any, axes: tuple, keepdims: bool) -> Tensor:  # noqa: A002
    row, col = axes
    if ord is None or ord == "fro":
        return sqrt(_sum(multiply(x, x), axis=axes, keepdims=keepdims))
    if ord in (1, -1, math.inf, -math.inf):
        first, second = (row, col) if ord in (1, -1) else (col, row)
        pick = _max if ord in (1, math.inf) else _min
        if not keepdims and second > first:
            second -= 1
        return pick(_sum(_abs(x), axis=first, keepdims=keepdims), axis=second, keepdims=keepdims)
    if ord in ("nuc", 2, -2):
        _host_only(f"norm(ord={ord!r}) of a matrix (singular values)", x)
        s = _singular_values(moveaxis(x, axes, (-2, -1)))
        y = _max(s, axis=-1) if ord == 2 else _min(s, axis=-1) if ord == -2 else _sum(s, axis=-1)
        return expand_dims(y, axes) if keepdims else y
    raise ValueError(f"norm: invalid ord {ord!r} for a matrix norm; expected one of None, 'fro', 'nuc', inf, -inf, "
                     "1, -1, 2, -2")


@keras_op(family="linalg")
def norm(x: Any, ord: Any = None, axis: Any = None, keepdims: bool = False) -> Tensor:  # noqa: A002
    """``keras.ops.norm``: vector norms over one axis (``ord`` None/2, inf, -inf, 0, 1, any p), matrix
    norms over two (None/"fro", "nuc", inf, -inf, 1, -1, 2, -2). ``axis=None``: with ``ord=None`` the
    2-norm of all elements; otherwise a 1-d tensor's vector norm or a 2-d tensor's matrix norm.
    Composed of ops (every backend), except the singular-value norms ("nuc", 2, -2: CPU). ints and bool
    become floatx."""
    if isinstance(ord, str) and ord not in ("fro", "nuc"):
        raise ValueError(f"norm: invalid ord {ord!r}; the string orders are 'fro' and 'nuc'")
    (t,) = tensors(x)
    t = _float(t)
    if axis is None:
        if ord is None:
            return sqrt(_sum(multiply(t, t), keepdims=keepdims))
        axes = tuple(range(t.ndim))
    else:
        axes = _norm_axes(axis, t.ndim)
    if len(axes) == 1:
        return _vector_norm(t, ord, axes, keepdims)
    if len(axes) == 2:
        return _matrix_norm(t, ord, axes, keepdims)
    raise ValueError(f"norm: improper number of axes {axes}: give one axis for a vector norm or two for a matrix norm")


# --------------------------------------------------------------------------------------------- jvp
def _source(t: Tensor) -> Tensor:
    """A primal as a tensor a tape can differentiate to, without attaching a leaf to the caller's tensor."""
    return Tensor(t.data) if t._node is None else t


@keras_op(family="linalg")
def jvp(fun: Callable, primals: Any, tangents: Any, has_aux: bool = False) -> tuple:
    """``keras.ops.jvp``: ``(fun(*primals), J @ tangents)`` (and ``aux`` when ``has_aux``), forward-mode
    by reverse mode twice: the VJP ``u -> J^T u`` is recorded (VJPs are ops, linear in ``u``) and
    differentiated w.r.t. ``u`` along the tangents. ``primals``/``tangents``: tuples or lists of
    (nested) arguments of the same structure, shapes and dtypes. Differentiable again, on any backend
    (a hand-fused, once-differentiable VJP on the path raises naming its op)."""
    if not isinstance(primals, (tuple, list)) or not isinstance(tangents, (tuple, list)):
        raise TypeError(f"jvp: primals and tangents must be tuples or lists of arguments, got "
                        f"{type(primals).__name__} and {type(tangents).__name__}")
    p_flat, rebuild = _tree_flatten(list(primals))
    t_flat, _ = _tree_flatten(list(tangents))
    if len(p_flat) != len(t_flat) or len(primals) != len(tangents):
        raise ValueError(f"jvp: tangents must have the structure of primals ({len(p_flat)} leaves), got "
                         f"{len(t_flat)} leaves")
    converted = _core.tensors(*p_flat, *t_flat)  # tangents given as host data follow device primals
    sources = [_source(p) for p in converted[:len(p_flat)]]
    directions = converted[len(p_flat):]
    for i, (p, d) in enumerate(zip(sources, directions)):
        if tuple(p.shape) != tuple(d.shape) or p.dtype != d.dtype:
            raise ValueError(f"jvp: tangent {i} must match its primal's shape and dtype ({p.shape}, {p.dtype}), "
                             f"got {d.shape}, {d.dtype}")
    with GradientTape() as inner:
        for p in sources:
            if is_float(p.dtype):
                inner.watch(p)
        result = fun(*rebuild(sources))
    out, aux = (result[0], result[1]) if has_aux else (result, None)
    o_flat, o_rebuild = _tree_flatten(out)
    outs = [_core.convert_to_tensor(o) for o in o_flat]
    floats = [i for i, o in enumerate(outs) if is_float(o.dtype)]
    cotangents = [Tensor(N.full(outs[i].shape, 0, outs[i].dtype, device=outs[i].device)) for i in floats]
    wanted = [i for i, p in enumerate(sources) if is_float(p.dtype)]
    with GradientTape() as outer:
        for u in cotangents:
            outer.watch(u)
        grads = inner.gradient([outs[i] for i in floats], [sources[i] for i in wanted],
                               output_gradients=cotangents) if floats and wanted else []
        total = None
        for i, g in zip(wanted, grads):
            if g is not None:
                term = _sum(multiply(g, directions[i]))
                total = term if total is None else add(total, term)
    tangents_out = outer.gradient(total, cotangents) if total is not None else [None] * len(floats)
    result_t = [_zeros_like(o) if not is_float(o.dtype) else None for o in outs]
    for i, g in zip(floats, tangents_out):
        result_t[i] = _zeros_like(outs[i]) if g is None else g
    primal_out, tangent_out = o_rebuild(outs), o_rebuild(result_t)
    return (primal_out, tangent_out, aux) if has_aux else (primal_out, tangent_out)
