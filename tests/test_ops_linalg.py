"""Linear algebra ops (``dnnbind/ops/_linalg.py``, ``dnnbind/kernels/linalg.py``) beyond the registry
cases: ``jvp`` and ``eig`` against real Keras 3 (through tests/keras_callables.py), errors naming the op,
the refusal on the CUDA backend before any kernel (and what composes there instead), dtype rules,
second derivatives against finite differences, and the numerically delicate cases (repeated singular
values for ``pinv``, rank-deficient ``lstsq``)."""

from __future__ import annotations

import types

import numpy as np
import pytest

import dnnbind
from dnnbind import ops
from dnnbind.autodiff import GradientTape
from dnnbind.autodiff.tensor import Tensor
from dnnbind.kernels import _dispatch
from dnnbind.kernels import linalg as LA
from dnnbind.ops import _linalg

import keras_callables


pytestmark = pytest.mark.usefixtures("cpu")  # conftest: the NumPy backend, then the default back


rng = np.random.default_rng(7)


# --------------------------------------------------------------------------------- against Keras
@pytest.mark.parametrize("name", ["jvp", "jvp_inv", "jvp_pytree_aux"])
def test_jvp_matches_real_keras(name):
    keras_callables.compare(name)


def test_eig_matches_real_keras_up_to_the_eigenvectors_phase():
    status, theirs = keras_callables.results()
    assert status["eig"] == "ok", status["eig"]
    w, v = keras_callables.compare("eig")  # shapes and complex64 dtypes
    w, v = np.asarray(w), np.asarray(v)
    kw, kv = theirs["eig/value/0"], theirs["eig/value/1"]
    np.testing.assert_allclose(w, kw, rtol=1e-5, atol=1e-6)
    phase = np.sum(np.conj(kv) * v, axis=0)  # unit vectors: v = phase * kv column by column
    np.testing.assert_allclose(np.abs(phase), 1.0, rtol=1e-5)
    np.testing.assert_allclose(v, kv * phase, rtol=1e-4, atol=1e-5)


# --------------------------------------------------------------------------------------- eig
@pytest.mark.parametrize("dtype, complex_dtype", [("float32", np.complex64), ("float64", np.complex128),
                                                  ("int32", np.complex64)])
def test_eig_is_complex_and_decomposes(dtype, complex_dtype):
    a = np.array([[0.0, -2.0, 0.5], [2.0, 0.0, 1.0], [0.3, -0.4, 1.0]]).astype(dtype)
    w, v = ops.eig(a)
    assert w.dtype == complex_dtype and v.dtype == complex_dtype and w.shape == (3,) and v.shape == (3, 3)
    w, v = np.asarray(w), np.asarray(v)
    np.testing.assert_allclose(a.astype(np.float64) @ v, v * w, atol=1e-5)
    assert np.iscomplex(w).any()  # a rotation-like block: complex eigenvalues even for a real matrix
    assert dnnbind.ops.REGISTRY["eig"]["differentiable"] is False


# ------------------------------------------------------------------------------------ errors
@pytest.mark.parametrize("op, args, match", [
    ("inv", (np.ones((2, 3)),), "inv: x must be square in its last two axes, got shape \\(2, 3\\)"),
    ("det", (np.ones(3),), "det: x must have rank >= 2"),
    ("cholesky", (np.ones((3, 2)),), "cholesky: x must be square"),
    ("eigh", (np.ones((2, 3)),), "eigh: x must be square"),
    ("svd", (np.ones(4),), "svd: x must have rank >= 2"),
    ("solve", (np.eye(3), np.ones((2, 1))), "solve: incompatible shapes: a.shape\\[-2\\] must equal b.shape\\[-2\\]"),
    ("solve", (np.ones((2, 3, 3)), np.ones((2, 3))), "is not \\(..., M, K\\).*b\\[..., None\\]"),
    ("solve_triangular", (np.eye(3), np.ones(4)), "solve_triangular: incompatible shapes: a.shape\\[-1\\]"),
    ("lstsq", (np.ones((2, 3, 3)), np.ones(3)), "lstsq: a must have rank 2"),
    ("lstsq", (np.ones((3, 2)), np.ones(4)), "lstsq: b.shape\\[0\\] must equal a.shape\\[0\\]"),
    ("qr", (np.ones((3, 3)), "full"), "qr: mode must be one of"),
    ("norm", (np.ones(3), "foo"), "norm: invalid ord 'foo'"),
    ("norm", (np.ones(3), "fro", 0), "invalid ord 'fro' for a vector norm"),
    ("norm", (np.ones((3, 3)), 3, (0, 1)), "invalid ord 3 for a matrix norm"),
    ("norm", (np.ones((2, 3, 3)), None, (0, 1, 2)), "improper number of axes"),
    ("norm", (np.ones((2, 3, 3)), 1), "improper number of axes"),
    ("norm", (np.ones((3, 3)), None, (0, 0)), "repeats an axis"),
])
def test_bad_input_is_refused_naming_the_op(op, args, match):
    with pytest.raises(ValueError, match=match):
        ops.REGISTRY[op]["fn"](*args)


def test_lapack_failures_name_the_op():
    with pytest.raises(np.linalg.LinAlgError, match="cholesky: the matrix is not positive definite"):
        ops.cholesky(np.array([[1.0, 2.0], [2.0, 1.0]]))
    with pytest.raises(ValueError, match="inv: the matrix is singular"):  # LinAlgError is a ValueError
        ops.inv(np.ones((3, 3)))
    with pytest.raises(np.linalg.LinAlgError, match="solve: the matrix a is singular"):
        ops.solve(np.zeros((2, 2)), np.ones((2, 1)))
    with pytest.raises(TypeError, match="triangular_solve: a must be a float array"):
        LA.triangular_solve(np.eye(2, dtype=np.int32), np.ones((2, 1)), lower=True)


def test_jvp_checks_its_structures():
    with pytest.raises(TypeError, match="jvp: primals and tangents must be tuples or lists"):
        ops.jvp(ops.sin, np.ones(2), np.ones(2))
    with pytest.raises(ValueError, match="tangents must have the structure of primals"):
        ops.jvp(lambda a, b: a * b, (np.ones(2), np.ones(2)), (np.ones(2),))
    with pytest.raises(ValueError, match="tangent 0 must match its primal's shape and dtype"):
        ops.jvp(ops.sin, (np.ones(2),), (np.ones(3),))


def test_svd_gradient_with_full_matrices_of_a_rectangle_is_refused_as_in_jax():
    x = ops.convert_to_tensor(rng.normal(size=(4, 2)))
    with GradientTape() as tape:
        tape.watch(x)
        u, s, vh = ops.svd(x)
        loss = ops.sum(u)
    with pytest.raises(NotImplementedError, match="svd: the gradient through u and v with full_matrices=True"):
        tape.gradient(loss, x)
    with GradientTape() as tape:  # only s: fine
        tape.watch(x)
        loss = ops.sum(ops.svd(x)[1])
    u, s, vh = np.linalg.svd(np.asarray(x), full_matrices=False)
    np.testing.assert_allclose(np.asarray(tape.gradient(loss, x)), u @ vh, rtol=1e-10)


# ---------------------------------------------------------------------------------- devices
class _FakeDeviceArray:
    def __init__(self, shape, dtype=np.float32):
        self.shape, self.dtype = tuple(shape), np.dtype(dtype)
        self.ndim, self.size = len(self.shape), int(np.prod(self.shape))


@pytest.mark.parametrize("op, args", [("inv", ((3, 3),)), ("cholesky", ((3, 3),)), ("svd", ((3, 2),)),
                                      ("qr", ((3, 2),)), ("eigh", ((2, 2),)), ("eig", ((2, 2),)),
                                      ("lu_factor", ((3, 3),)), ("det", ((4, 4),)), ("pinv", ((3, 2),)),
                                      ("matrix_rank", ((3, 2),)), ("solve", ((3, 3), (3, 1))),
                                      ("solve_triangular", ((3, 3), (3, 1))), ("cholesky_inverse", ((3, 3),)),
                                      ("lstsq", ((3, 2), (3,)))])
def test_lapack_ops_refuse_device_tensors_before_any_kernel(monkeypatch, op, args):
    monkeypatch.setattr(_linalg, "backend", types.SimpleNamespace(
        is_device_array=lambda x: isinstance(x, _FakeDeviceArray)))
    for name in LA.__all__:  # nothing may reach a kernel first
        monkeypatch.setattr(LA, name, lambda *a, **k: pytest.fail("a kernel ran before the device check"))
    tensors = [Tensor(_FakeDeviceArray(shape)) for shape in args]
    with pytest.raises(NotImplementedError, match=f"{op}: dense linear algebra has no CUDA implementation yet.*"
                                                  "CPU backend"):
        ops.REGISTRY[op]["fn"](*tensors)


def test_the_device_side_of_the_kernels_refuses_naming_the_primitive(monkeypatch):
    monkeypatch.setattr(_dispatch, "is_device_array", lambda x: isinstance(x, _FakeDeviceArray))
    monkeypatch.setattr(_dispatch, "_cuda_modules", {})
    with pytest.raises(NotImplementedError, match="svd: dense linear algebra has no CUDA implementation"):
        LA.svd(_FakeDeviceArray((3, 2)))
    with pytest.raises(NotImplementedError, match="triangular_solve: dense linear"):
        LA.triangular_solve(_FakeDeviceArray((3, 3)), _FakeDeviceArray((3, 1)), lower=True)


@pytest.mark.parametrize("call", [
    lambda: ops.norm(rng.normal(size=(3, 4)), ord=3, axis=1),
    lambda: ops.norm(rng.normal(size=(3, 4)), ord="fro"),
    lambda: ops.norm(rng.normal(size=(3, 4)), ord=-np.inf, axis=(1, 0)),
    lambda: ops.det(rng.normal(size=(2, 3, 3))),
    lambda: ops.jvp(lambda x: ops.exp(x) * x, (rng.normal(size=3),), (rng.normal(size=3),)),
])
def test_composed_ops_need_no_lapack_kernel_and_no_host_read(monkeypatch, call):
    """What runs on the CUDA backend: no kernels.linalg call and no read of a tensor on the host."""
    for name in LA.__all__:
        monkeypatch.setattr(LA, name, lambda *a, **k: pytest.fail("a LAPACK kernel ran"))
    for method in ("numpy", "__array__", "item", "__bool__", "__float__", "__int__", "__index__"):
        monkeypatch.setattr(Tensor, method, lambda *a, **k: pytest.fail(f"a host read ({method})"))
    call()


# ------------------------------------------------------------------------------------ dtypes
@pytest.mark.parametrize("dtype, want", [("int32", "float32"), ("float64", "float64"), ("float16", "float16"),
                                         ("bfloat16", "bfloat16")])
def test_results_are_floats_in_keras_promotion(dtype, want):
    a = (np.eye(3) * 2 + np.triu(np.ones((3, 3)), 1)).astype(dtype)
    for op in (ops.inv, ops.det, lambda x: ops.solve(x, x), lambda x: ops.norm(x, "nuc"), ops.pinv,
               lambda x: ops.svd(x)[1], lambda x: ops.qr(x)[1], lambda x: ops.lu_factor(x)[0]):
        assert ops.dtype(op(a)) == want
    assert ops.dtype(ops.matrix_rank(a)) == "int32"
    np.testing.assert_allclose(np.asarray(ops.inv(a)).astype(np.float64),
                               np.linalg.inv(a.astype(np.float64)), rtol=2e-2 if "16" in dtype else 1e-6)


# --------------------------------------------------------------------- second derivatives
def _hvp(f, x, v):
    xt = ops.convert_to_tensor(x)
    with GradientTape() as outer:
        outer.watch(xt)
        with GradientTape() as inner:
            inner.watch(xt)
            y = f(xt)
        s = ops.sum(ops.multiply(inner.gradient(y, xt), v))
    return np.asarray(outer.gradient(s, xt))


def _grad(f, x):
    xt = ops.convert_to_tensor(x)
    with GradientTape() as tape:
        tape.watch(xt)
        y = f(xt)
    return np.asarray(tape.gradient(y, xt))


_A = rng.normal(size=(3, 3)) + 3 * np.eye(3)
_SPD = _A @ _A.T


@pytest.mark.parametrize("name, f, x", [
    ("inv", lambda x: ops.sum(ops.sin(ops.inv(x))), _A),
    ("cholesky", lambda x: ops.sum(ops.sin(ops.cholesky(x))), _SPD),
    ("det", lambda x: ops.det(x), rng.normal(size=(4, 4))),
    ("svd", lambda x: ops.sum(ops.sin(ops.svd(x, full_matrices=False)[0])), rng.normal(size=(4, 3))),
    ("eigh", lambda x: ops.sum(ops.sin(ops.eigh(x)[1])), _SPD),
    ("qr", lambda x: ops.sum(ops.sin(ops.qr(x, mode="complete")[0])), rng.normal(size=(4, 2))),
    ("lu_factor", lambda x: ops.sum(ops.sin(ops.lu_factor(x)[0])), _A),
    ("pinv", lambda x: ops.sum(ops.sin(ops.pinv(x))), rng.normal(size=(2, 4))),
    ("solve_triangular", lambda x: ops.sum(ops.sin(ops.solve_triangular(x, _A, lower=True))), _A),
    ("norm_nuc", lambda x: ops.norm(x, "nuc"), rng.normal(size=(3, 4))),
])
def test_second_derivatives_match_finite_differences(name, f, x):
    v = rng.normal(size=x.shape)
    eps = 1e-5
    num = (_grad(f, x + eps * v) - _grad(f, x - eps * v)) / (2 * eps)
    np.testing.assert_allclose(_hvp(f, x, v), num, rtol=1e-5, atol=1e-6 * np.abs(num).max(), err_msg=name)


# ------------------------------------------------------------------------------- numerics
def test_pinv_gradient_at_repeated_singular_values():
    """Golub and Pereyra's rule stays finite where the SVD's 1 / (s_i^2 - s_j^2) would not."""
    q, _ = np.linalg.qr(rng.normal(size=(4, 3)))
    x = 2.0 * q  # three equal singular values
    v = rng.normal(size=(3, 4))
    f = lambda t: ops.sum(ops.multiply(ops.pinv(t), v))  # noqa: E731
    g = _grad(f, x)
    eps = 1e-6
    num = np.zeros_like(x)
    for idx in np.ndindex(*x.shape):
        d = np.zeros_like(x)
        d[idx] = eps
        num[idx] = (np.sum(np.linalg.pinv(x + d) * v) - np.sum(np.linalg.pinv(x - d) * v)) / (2 * eps)
    assert np.isfinite(g).all()
    np.testing.assert_allclose(g, num, rtol=1e-6, atol=1e-8)


def test_lstsq_gives_the_minimum_norm_solution_and_honours_rcond():
    a = np.array([[1.0, 2.0, 3.0], [2.0, 4.0, 6.0], [1.0, 0.0, 1.0], [0.0, 1.0, 1.0]])  # rank 2
    b = rng.normal(size=(4, 2))
    x = np.asarray(ops.lstsq(a, b))
    np.testing.assert_allclose(x, np.linalg.pinv(a) @ b, rtol=1e-10)
    np.testing.assert_allclose(x, np.linalg.lstsq(a, b, rcond=None)[0], rtol=1e-10)
    s = np.linalg.svd(a, compute_uv=False)
    cut = np.asarray(ops.lstsq(a, b, rcond=s[1] / s[0] * 1.01))  # drops the second singular value too
    u, _, vh = np.linalg.svd(a, full_matrices=False)
    np.testing.assert_allclose(cut, np.outer(vh[0], u[:, 0] @ b) / s[0], rtol=1e-10)
    np.testing.assert_allclose(np.asarray(ops.lstsq(a, b, rcond=-1.0)), x, rtol=1e-10)  # negative: eps


def test_matrix_rank_tolerances():
    x = np.stack([np.diag([1.0, 1e-3, 0.0]), np.diag([1.0, 0.5, 0.25])])
    np.testing.assert_array_equal(np.asarray(ops.matrix_rank(x)), [2, 3])
    np.testing.assert_array_equal(np.asarray(ops.matrix_rank(x, tol=0.1)), [1, 3])
    np.testing.assert_array_equal(np.asarray(ops.matrix_rank(x, tol=np.array([1e-4, 0.3]))), [2, 2])


def test_det_small_and_large_agree_with_lapack_and_empty_is_one():
    for n in (1, 2, 3, 5):
        x = rng.normal(size=(2, n, n))
        np.testing.assert_allclose(np.asarray(ops.det(x)), np.linalg.det(x), rtol=1e-12)
    assert np.asarray(ops.det(np.zeros((3, 0, 0)))).tolist() == [1.0, 1.0, 1.0]


def test_solve_triangular_reads_only_its_triangle_and_broadcasts_batches():
    a = rng.normal(size=(2, 1, 4, 4)) + 4 * np.eye(4)
    b = rng.normal(size=(1, 3, 4, 2))  # rank a.ndim: matrices (rank a.ndim - 1 would be vectors)
    x = np.asarray(ops.solve_triangular(a, b, lower=True))
    assert x.shape == (2, 3, 4, 2)
    np.testing.assert_allclose(np.tril(a) @ x, np.broadcast_to(b, (2, 3, 4, 2)), atol=1e-12)
    np.testing.assert_allclose(np.asarray(ops.solve_triangular(np.tril(a), b, lower=True)), x, rtol=1e-14)
