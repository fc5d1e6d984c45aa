"""Cases of the linalg family (``dnnbind/ops/_linalg.py``): NumPy/SciPy references, finite-difference
gradients and real Keras 3 (JAX). ``eig`` (complex, eigenvectors up to a phase) and ``jvp`` (a
callable argument) are compared with Keras in ``tests/test_ops_linalg.py``."""

import dataclasses

import numpy as np
import scipy.linalg as sl

from . import A, Case


@dataclasses.dataclass(frozen=True)
class SPD(A):
    """Symmetric positive-definite matrices ``x @ x.T + n I``."""

    def make(self, rng, dtype=None):
        x = super().make(rng, "float64")
        n = self.shape[-1]
        return (x @ np.swapaxes(x, -1, -2) + n * np.eye(n)).astype(dtype or self.dtype)


@dataclasses.dataclass(frozen=True)
class Shifted(A):
    """Well-conditioned square matrices ``x + n I``."""

    def make(self, rng, dtype=None):
        x = super().make(rng, "float64")
        return (x + self.shape[-1] * np.eye(self.shape[-1])).astype(dtype or self.dtype)


@dataclasses.dataclass(frozen=True)
class Factor(A):
    """Triangular Cholesky factors (positive diagonal ``>= 1``): lower, or upper when ``upper``."""

    upper: bool = False

    def make(self, rng, dtype=None):
        x = super().make(rng, "float64")
        n = self.shape[-1]
        low = np.tril(x, -1) + np.eye(n) * (1.0 + 0.25 * np.arange(n))
        return np.ascontiguousarray(np.swapaxes(low, -1, -2) if self.upper else low).astype(dtype or self.dtype)


@dataclasses.dataclass(frozen=True)
class LowRank(A):
    """``(..., M, N)`` matrices of rank ``rank``."""

    rank: int = 2

    def make(self, rng, dtype=None):
        left = rng.uniform(-1, 1, self.shape[:-1] + (self.rank,))
        right = rng.uniform(-1, 1, self.shape[:-2] + (self.rank, self.shape[-1]))
        return (left @ right).astype(dtype or self.dtype)


def _sym(x):
    return (x + np.swapaxes(x, -1, -2)) / 2


def _batched(fn, signature):
    return np.vectorize(fn, signature=signature)


_lu = _batched(lambda a: sl.lu_factor(a)[0], "(m,n)->(m,n)")
_piv = _batched(lambda a: sl.lu_factor(a)[1].astype(np.int32), "(m,n)->(k)")
_EPS = np.finfo(np.float64).eps

CASES = [
    Case("cholesky", (SPD((4, 4)),), grad=(0,), ref=lambda x: np.linalg.cholesky(_sym(x))),
    Case("cholesky", (SPD((2, 3, 3)),), {"upper": True}, grad=(0,), name="upper_batched",
         ref=lambda x, upper: np.swapaxes(np.linalg.cholesky(_sym(x)), -1, -2)),
    Case("cholesky_inverse", (Factor((4, 4)),), grad=(0,), ref=lambda x: np.linalg.inv(x @ x.T)),
    Case("cholesky_inverse", (Factor((3, 3), upper=True),), {"upper": True}, grad=(0,), name="upper",
         ref=lambda x, upper: np.linalg.inv(x.T @ x)),
    Case("det", (Shifted((2, 5, 5)),), grad=(0,), ref=np.linalg.det, name="lu"),
    Case("det", (A((2, 3, 3)),), grad=(0,), ref=np.linalg.det, name="3x3"),
    Case("det", (A((2, 2)),), grad=(0,), ref=np.linalg.det, name="2x2"),
    Case("det", (A((3, 1, 1)),), grad=(0,), ref=np.linalg.det, name="1x1"),
    Case("eig", (A((4, 4)),), keras=False),  # complex; checked in test_ops_linalg.py
    Case("eigh", (A((4, 4)),), grad=(0,), ref=lambda x: list(np.linalg.eigh(_sym(x)))),
    Case("eigh", (SPD((2, 3, 3)),), grad=(0,), ref=lambda x: list(np.linalg.eigh(_sym(x))), name="batched"),
    Case("inv", (Shifted((2, 4, 4)),), grad=(0,), ref=np.linalg.inv),
    Case("solve", (Shifted((4, 4)), A((4, 2))), grad=(0, 1), ref=np.linalg.solve),
    Case("solve", (Shifted((2, 3, 3)), A((3,))), grad=(0, 1), ref=np.linalg.solve, name="vector"),
    Case("solve_triangular", (Shifted((4, 4)), A((4, 2))), grad=(0, 1),
         ref=lambda a, b: sl.solve_triangular(a, b, lower=False)),
    Case("solve_triangular", (Shifted((2, 4, 4)), A((2, 4))), {"lower": True}, grad=(0, 1), name="lower_vectors",
         ref=lambda a, b, lower: np.stack([sl.solve_triangular(a[i], b[i], lower=True) for i in range(2)])),
    Case("lu_factor", (Shifted((4, 4)),), grad=(0,), ref=lambda x: [_lu(x), _piv(x)]),
    Case("lu_factor", (A((2, 5, 3)),), grad=(0,), ref=lambda x: [_lu(x), _piv(x)], name="tall"),
    Case("lu_factor", (A((3, 5)),), grad=(0,), ref=lambda x: [_lu(x), _piv(x)], name="wide"),
    Case("qr", (A((5, 3)),), grad=(0,), ref=lambda x: list(np.linalg.qr(x))),
    Case("qr", (A((2, 4, 4)),), {"mode": "complete"}, grad=(0,), name="complete_square",
         ref=lambda x, mode: list(np.linalg.qr(x, mode=mode))),
    Case("qr", (A((5, 3)),), {"mode": "complete"}, grad=(0,), name="complete_tall",
         ref=lambda x, mode: list(np.linalg.qr(x, mode=mode))),
    Case("qr", (A((3, 5)),), grad=(0,), name="wide", ref=lambda x: list(np.linalg.qr(x))),
    Case("svd", (A((5, 3)),), {"full_matrices": False}, grad=(0,), name="reduced",
         ref=lambda x, full_matrices: list(np.linalg.svd(x, full_matrices=False))),
    Case("svd", (A((2, 3, 4)),), {"full_matrices": False}, grad=(0,), name="wide",
         ref=lambda x, full_matrices: list(np.linalg.svd(x, full_matrices=False))),
    Case("svd", (A((4, 4)),), grad=(0,), name="full_square", ref=lambda x: list(np.linalg.svd(x))),
    Case("svd", (A((5, 3)),), name="full", ref=lambda x: list(np.linalg.svd(x))),
    Case("svd", (A((2, 5, 3)),), {"compute_uv": False}, grad=(0,), name="values",
         ref=lambda x, compute_uv: np.linalg.svd(x, compute_uv=False)),
    Case("lstsq", (A((5, 3)), A((5, 2))), grad=(0, 1), ref=lambda a, b: np.linalg.lstsq(a, b, rcond=None)[0]),
    Case("lstsq", (A((3, 4)), A((3,))), grad=(0, 1), name="under_vector",
         ref=lambda a, b: np.linalg.lstsq(a, b, rcond=None)[0]),
    Case("matrix_rank", (LowRank((2, 4, 5)),), ref=lambda x: np.linalg.matrix_rank(x).astype(np.int32)),
    Case("matrix_rank", (A((4, 3)),), {"tol": 0.5}, name="tol",
         ref=lambda x, tol: np.linalg.matrix_rank(x, tol=tol).astype(np.int32)),
    Case("pinv", (A((5, 3)),), grad=(0,), ref=lambda x: np.linalg.pinv(x, rcond=10 * 5 * _EPS)),
    Case("pinv", (A((2, 3, 4)),), grad=(0,), name="wide", ref=lambda x: np.linalg.pinv(x, rcond=10 * 4 * _EPS)),
    Case("norm", (A((3, 4)),), grad=(0,), ref=np.linalg.norm),
    Case("norm", (A((2, 3, 4)),), {"axis": -1, "keepdims": True}, grad=(0,), name="vector_keepdims",
         ref=lambda x, axis, keepdims: np.linalg.norm(x, axis=axis, keepdims=keepdims)),
    *[Case("norm", (A((3, 5)),), {"ord": o, "axis": 1}, grad=(0,), name=f"vector_{o}",
           ref=lambda x, ord, axis: np.linalg.norm(x, ord=ord, axis=axis)) for o in (1, 2, 3, 0.5, -1, 0)],
    Case("norm", (A((3, 5)),), {"ord": float("inf"), "axis": 0}, grad=(0,), name="vector_inf",
         ref=lambda x, ord, axis: np.linalg.norm(x, ord=ord, axis=axis)),
    Case("norm", (A((3, 5)),), {"ord": -float("inf"), "axis": 0}, grad=(0,), name="vector_-inf",
         ref=lambda x, ord, axis: np.linalg.norm(x, ord=ord, axis=axis)),
    Case("norm", (A((5,)),), {"ord": 3}, grad=(0,), name="vector_axis_none",
         ref=lambda x, ord: np.linalg.norm(x, ord=ord)),
    *[Case("norm", (A((3, 4, 5)),), {"ord": o, "axis": (2, 0)}, grad=(0,), name=f"matrix_{o}",
           ref=lambda x, ord, axis: np.linalg.norm(x, ord=ord, axis=axis))
      for o in ("fro", "nuc", 1, -1, 2, -2, float("inf"), -float("inf"))],
    Case("norm", (A((3, 4, 5)),), {"ord": 1, "axis": (0, 2), "keepdims": True}, grad=(0,), name="matrix_keepdims",
         ref=lambda x, ord, axis, keepdims: np.linalg.norm(x, ord=ord, axis=axis, keepdims=keepdims)),
    Case("norm", (A((3, 4)),), {"ord": "nuc"}, grad=(0,), name="matrix_axis_none",
         ref=lambda x, ord: np.linalg.norm(x, ord=ord)),
    # jvp takes a function: this case differentiates through the double VJP (the tangents w.r.t. primals
    # and tangents); values and gradients against Keras are in test_ops_linalg.py
    Case("jvp", ((lambda x, y: x * y + x * x * 0.5), [A((3,)), A((3,))], [A((3,)), A((3,))]), grad=(1, 2),
         keras=False, ref=lambda f, p, t: [p[0] * p[1] + p[0] * p[0] * 0.5, t[0] * p[1] + p[0] * t[1] + p[0] * t[0]]),
]

# Real Keras compiles every case on JAX (about a second each), so it checks one or two cases per op;
# the others are checked against NumPy/SciPy and finite differences.
_KERAS = {"cholesky-upper_batched", "cholesky_inverse", "det-lu", "det-3x3", "eigh-batched", "inv", "solve",
          "solve_triangular-lower_vectors", "lu_factor-tall", "qr-complete_tall", "svd-reduced", "svd-values",
          "lstsq", "matrix_rank", "pinv", "norm", "norm-vector_3", "norm-matrix_nuc", "norm-matrix_1"}
CASES = [dataclasses.replace(c, keras=c.keras and c.label in _KERAS) for c in CASES]
