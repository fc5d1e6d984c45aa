"""What the registry harness cannot see of keras.ops numpy part A (``dnnbind/ops/_products.py``, ``_joins.py``,
``_windows.py``, ``_sorting.py``): bad-input errors, special values, the host-read rule, ``vectorize``, the
partition property of ``argpartition``, higher-order gradients. The ``searchsorted`` primitive several of
them use has its own tests (``tests/test_kernels_search.py``)."""

from __future__ import annotations

import numpy as np
import pytest

import dnnbind
from dnnbind import backend, ops
from dnnbind.autodiff import GradientTape


@pytest.fixture(autouse=True)
def _cpu():
    dnnbind.set_default_device("cpu")
    yield
    dnnbind.set_default_device(None)


RNG = np.random.default_rng(7)
X = RNG.normal(size=(3, 4, 5))
M = RNG.normal(size=(4, 5))


# ----------------------------------------------------------------------------------- host reads
@pytest.fixture
def no_host_reads(monkeypatch):
    """Every device-to-host read of a tensor's values goes through backend.to_numpy: make it fail."""
    def refuse(*args, **kwargs):
        raise AssertionError("an op read a tensor's values on the host")

    monkeypatch.setattr(backend, "to_numpy", refuse)


_STAYS_ON_DEVICE = [
    # products
    lambda: ops.einsum("bij,bjk->bik", X, np.swapaxes(X, 1, 2)),
    lambda: ops.einsum("ii->i", np.ascontiguousarray(M[:, :4])),
    lambda: ops.tensordot(X, X, axes=([1, 2], [1, 2])),
    lambda: ops.kron(M, M), lambda: ops.cross(X[..., :3].copy(), X[..., 1:4].copy()),
    # joins
    lambda: ops.roll(X, 3, 1), lambda: ops.repeat(X, 2, 1), lambda: ops.repeat(M, [1, 2, 0, 1], 0),
    lambda: ops.tile(M, (2, 2)), lambda: ops.rot90(X, 1, (1, 2)), lambda: ops.diag(M[0], 2),
    lambda: ops.trace(X, 1, 1, 2), lambda: ops.select([M > 0], [M]), lambda: ops.saturate_cast(M * 300, "uint8"),
    lambda: ops.unravel_index(np.arange(6), (2, 3)), lambda: ops.rearrange(X, "a b c -> c (a b)"),
    lambda: ops.array_split(X, 2, 2), lambda: ops.unstack(X, axis=2), lambda: ops.meshgrid(M[0], M[1]),
    lambda: ops.view(M, "int32"),
    # windows
    lambda: ops.linspace(M[0], M[1], 5), lambda: ops.geomspace(1.0, 8.0, 4), lambda: ops.vander(M[0]),
    lambda: ops.hamming(5), lambda: ops.kaiser(5, 3.0),
    # sorting
    lambda: ops.sort(X, 1), lambda: ops.argsort(X), lambda: ops.argpartition(M, 2),
    lambda: ops.top_k(M, 3), lambda: ops.in_top_k(np.array([0, 1, 2, 3]), M, 2),
    lambda: ops.searchsorted(np.sort(M[0]), M), lambda: ops.digitize(M, np.sort(M[0])),
    lambda: ops.isin(M, M[0]), lambda: ops.histogram(M[0], 4),
]


@pytest.mark.parametrize("call", _STAYS_ON_DEVICE, ids=[str(i) for i in range(len(_STAYS_ON_DEVICE))])
def test_ops_whose_shapes_do_not_depend_on_the_data_never_read_the_host(no_host_reads, call):
    call()


def test_the_data_dependent_ops_read_the_host(no_host_reads):
    for call in (lambda: ops.unique(np.array([1, 2, 2])),
                 lambda: ops.bincount(np.array([0, 2])),
                 lambda: ops.repeat(M, ops.convert_to_tensor(np.array([1, 2, 0, 1])), 0)):
        with pytest.raises(AssertionError, match="host"):
            call()


# ------------------------------------------------------------------------------------- products
def test_einsum_rejects_bad_subscripts():
    with pytest.raises(ValueError, match="At most one '->'"):
        ops.einsum("i->i->i", np.ones(3))
    with pytest.raises(ValueError, match="Number of operands"):
        ops.einsum("i,i", np.ones(3))
    with pytest.raises(ValueError, match="label 'j' has size 3 in one operand and 4"):
        ops.einsum("ij,jk", np.ones((2, 3)), np.ones((4, 5)))
    with pytest.raises(ValueError, match="names 2 axes but its operand has rank 3"):
        ops.einsum("ij", np.ones((2, 3, 4)))
    with pytest.raises(ValueError, match="invalid subscript character '1'"):
        ops.einsum("i1", np.ones((2, 3)))
    with pytest.raises(ValueError, match="output label 'k' does not appear"):
        ops.einsum("ij->k", np.ones((2, 3)))


def test_einsum_sums_ellipsis_axes_missing_from_an_explicit_output_as_jax_does():
    np.testing.assert_allclose(ops.einsum("...i->i", M), M.sum(0))


def test_einsum_int8_accumulates_in_int32():
    a = np.full((2, 64), 100, np.int8)
    out = ops.einsum("ij,kj->ik", a, a)
    assert out.dtype == np.int32 and int(np.asarray(out)[0, 0]) == 64 * 100 * 100


def _second_order(subscripts: str, f_grad_sum) -> None:
    """d/dA sum(d/dA sum(einsum(subscripts, A, A)^2)) against finite differences of ``f_grad_sum``."""
    a = ops.convert_to_tensor(M)
    with GradientTape() as outer:
        outer.watch(a)
        with GradientTape() as inner:
            inner.watch(a)
            y = ops.sum(ops.square(ops.einsum(subscripts, a, a)))
        gsum = ops.sum(inner.gradient(y, a))
    h = np.asarray(outer.gradient(gsum, a))
    num = np.zeros_like(M)
    for i in np.ndindex(M.shape):
        d = np.zeros_like(M)
        d[i] = 1e-6
        num[i] = (f_grad_sum(M + d) - f_grad_sum(M - d)) / 2e-6
    np.testing.assert_allclose(h, num, rtol=1e-5, atol=1e-6)


def test_einsum_second_order_gradient():
    # y = sum((A * A)^2) = sum(A^4): dy/dA = 4 A^3 (the broadcast-multiply path)
    _second_order("ij,ij->ij", lambda m: float(np.sum(4 * m ** 3)))


def test_einsum_second_order_gradient_through_matmul():
    # y = ||A A^T||_F^2: dy/dA = 4 A A^T A
    _second_order("ij,kj->ik", lambda m: float(np.sum(4 * m @ m.T @ m)))


def test_einsum_contracts_each_pair_with_one_matmul(monkeypatch):
    from dnnbind.kernels import numeric

    calls = []
    real = numeric.matmul
    monkeypatch.setattr(numeric, "matmul", lambda a, b, **kw: calls.append((a.shape, b.shape)) or real(a, b, **kw))
    a, b, c = RNG.normal(size=(2, 3)), RNG.normal(size=(3, 4)), RNG.normal(size=(4, 5))
    np.testing.assert_allclose(np.asarray(ops.einsum("ij,jk,kl->il", a, b, c)), a @ b @ c)
    assert calls == [((2, 3), (3, 4)), ((2, 4), (4, 5))]


def test_products_check_shapes():
    with pytest.raises(ValueError, match="not aligned"):
        ops.dot(np.ones((2, 3)), np.ones((4, 2)))
    with pytest.raises(ValueError, match="`inner` requires the last dimension"):
        ops.inner(np.ones((2, 3)), np.ones((2, 4)))
    with pytest.raises(ValueError, match="Shape mismatch"):
        ops.tensordot(np.ones((2, 3)), np.ones((4, 2)), axes=([1], [0]))
    with pytest.raises(ValueError, match="same number of elements"):
        ops.vdot(np.ones(3), np.ones(4))
    with pytest.raises(ValueError, match="2 or 3 components"):
        ops.cross(np.ones((2, 4)), np.ones((2, 3)))


# ---------------------------------------------------------------------------------------- joins
def test_split_errors_match_keras():
    with pytest.raises(TypeError, match="indices_or_sections` must be of type `int`"):
        ops.array_split(X, [1, 2])
    with pytest.raises(ValueError, match="must be a positive integer"):
        ops.array_split(X, 0)
    with pytest.raises(ValueError, match="equal division"):
        ops.hsplit(X, 3)
    with pytest.raises(ValueError, match="at least 2 dimensions"):
        ops.vsplit(np.ones(4), 2)
    with pytest.raises(ValueError, match="at least 3 dimensions"):
        ops.dsplit(M, 1)
    with pytest.raises(ValueError, match="num=2 does not match the size 3"):
        ops.unstack(X, num=2)


def test_split_pieces_share_one_node_whose_vjp_concatenates():
    t = ops.convert_to_tensor(X)
    with GradientTape() as tape:
        tape.watch(t)
        pieces = ops.unstack(t, axis=1)
        loss = ops.add(ops.sum(ops.multiply(pieces[0], 2.0)), ops.sum(pieces[3]))
    g = np.asarray(tape.gradient(loss, t))
    want = np.zeros_like(X)
    want[:, 0] = 2.0
    want[:, 3] = 1.0
    np.testing.assert_array_equal(g, want)
    assert len({id(p._node) for p in pieces}) == 1


def test_rot90_and_flips_check_ranks_and_axes():
    with pytest.raises(ValueError, match="at least 2 dimensions"):
        ops.rot90(np.ones(3))
    with pytest.raises(ValueError, match="Invalid axes"):
        ops.rot90(M, axes=(1, 1))
    with pytest.raises(ValueError, match="Invalid axes"):
        ops.rot90(M, axes=(1, -1))
    with pytest.raises(ValueError, match="2 or more dimensions"):
        ops.fliplr(np.ones(3))


def test_repeat_and_tile_errors():
    with pytest.raises(ValueError, match="should be compatible"):
        ops.repeat(M, [1, 2], axis=0)
    with pytest.raises(ValueError, match="non-negative"):
        ops.repeat(M, [1, -1, 1, 1], axis=0)
    with pytest.raises(ValueError, match="non-negative"):
        ops.tile(M, -1)


def test_diagonals_errors():
    with pytest.raises(ValueError, match="1-D or 2-D"):
        ops.diag(X)
    with pytest.raises(ValueError, match="cannot be the same"):
        ops.diagonal(X, 0, 1, -2)
    with pytest.raises(ValueError, match="must be different"):
        ops.trace(X, 0, 0, -3)


def test_diag_of_a_vector_is_differentiable_twice():
    v = ops.convert_to_tensor(M[0])
    with GradientTape() as outer:
        outer.watch(v)
        with GradientTape() as inner:
            inner.watch(v)
            y = ops.sum(ops.square(ops.diag(v, 1)))
        g = inner.gradient(y, v)
        z = ops.sum(ops.multiply(g, g))
    np.testing.assert_allclose(np.asarray(g), 2 * M[0])
    np.testing.assert_allclose(np.asarray(outer.gradient(z, v)), 8 * M[0])


def test_rearrange_errors():
    with pytest.raises(ValueError, match="names 2 axes"):
        ops.rearrange(X, "a b -> b a")
    with pytest.raises(ValueError, match="must be the input axes"):
        ops.rearrange(X, "a b c -> a b")
    with pytest.raises(ValueError, match="does not split"):
        ops.rearrange(X, "(a1 a) b c -> a a1 b c", a1=2)
    with pytest.raises(ValueError, match="cannot infer"):
        ops.rearrange(np.ones((4, 6)), "(a b) c -> a b c")


def test_select_errors_match_keras():
    with pytest.raises(ValueError, match="must be lists"):
        ops.select(M > 0, [M])
    with pytest.raises(ValueError, match="must not be empty"):
        ops.select([], [])
    with pytest.raises(ValueError, match="length equal"):
        ops.select([M > 0, M < 0], [M])


def test_view_reinterprets_bits_and_checks_sizes():
    x = np.array([1.0, -2.0], np.float32)
    np.testing.assert_array_equal(np.asarray(ops.view(x, "int32")), x.view(np.int32))
    with pytest.raises(ValueError, match="scalar"):
        ops.view(np.float32(1.0), "int16")
    with pytest.raises(ValueError, match="not divisible by the new itemsize"):
        ops.view(np.ones(3, np.int8), "int16")
    assert ops.view(x).dtype == np.float32


def test_saturate_cast_saturates_special_values():
    got = np.asarray(ops.saturate_cast(np.array([3e9, -3e9, np.inf, -np.inf, np.nan, 2.5], np.float32), "int32"))
    np.testing.assert_array_equal(got, [2**31 - 1, -2**31, 2**31 - 1, -2**31, 0, 2])
    got = np.asarray(ops.saturate_cast(np.array([np.inf, -1e6, 7.0]), "float16"))
    np.testing.assert_array_equal(got, np.array([65504, -65504, 7], np.float16))
    got = np.asarray(ops.saturate_cast(np.array([-5, 300, 7], np.int64), "uint8"))
    np.testing.assert_array_equal(got, [0, 255, 7])
    assert ops.saturate_cast(np.array([True]), "float32").dtype == np.float32


def test_unravel_index_checks_arguments():
    with pytest.raises(TypeError, match="integers"):
        ops.unravel_index(np.array([1.0]), (2, 3))
    with pytest.raises(ValueError, match="positive"):
        ops.unravel_index(np.array([1]), (2, 0))


# ------------------------------------------------------------------------------------ vectorize
def test_vectorize_maps_a_python_function_over_elements():
    f = ops.vectorize(lambda a, b: ops.where(ops.greater(a, b), ops.subtract(a, b), ops.add(a, b)))
    got = f(M, M[0])
    want = np.where(M > M[0], M - M[0], M + M[0])
    np.testing.assert_allclose(np.asarray(got), want)


def test_vectorize_with_a_signature_excluded_arguments_and_two_outputs():
    def stats(v, scale, shift=0.0):
        return ops.multiply(ops.sum(v), scale), ops.add(ops.max(v), shift)

    f = ops.vectorize(stats, excluded={1, "shift"}, signature="(n)->(),()")
    total, peak = f(X, 2.0, shift=1.0)
    np.testing.assert_allclose(np.asarray(total), 2 * X.sum(-1))
    np.testing.assert_allclose(np.asarray(peak), X.max(-1) + 1)


def test_vectorize_is_differentiable_and_checks_signatures():
    f = ops.vectorize(lambda a, b: ops.sum(ops.multiply(a, b)), signature="(n),(n)->()")
    t = ops.convert_to_tensor(M)
    with GradientTape() as tape:
        tape.watch(t)
        y = ops.sum(f(t, M[1]))
    np.testing.assert_allclose(np.asarray(tape.gradient(y, t)), np.broadcast_to(M[1], M.shape))
    with pytest.raises(ValueError, match="core dimension 'n' is 5 in one argument and 4"):
        f(M, np.ones(4))
    with pytest.raises(ValueError, match="not a valid gufunc signature"):
        ops.vectorize(np.sin, signature="(n")
    with pytest.raises(ValueError, match="Expected argument `pyfunc` to be a callable"):
        ops.vectorize(3)


# -------------------------------------------------------------------------------------- sorting
def test_argpartition_partitions():
    x = RNG.normal(size=(5, 9))
    for kth in (0, 4, 8, -1):
        idx = np.asarray(ops.argpartition(x, kth))
        assert idx.dtype == np.int32
        part = np.take_along_axis(x, idx, -1)
        k = kth % 9
        np.testing.assert_array_equal(part[:, k], np.sort(x, -1)[:, k])
        assert (part[:, :k] <= part[:, k:k + 1]).all() and (part[:, k + 1:] >= part[:, k:k + 1]).all()
        assert all(sorted(r) == list(range(9)) for r in idx)
    with pytest.raises(ValueError, match="kth must be an integer"):
        ops.argpartition(x, 1.5)
    with pytest.raises(ValueError, match="out of range"):
        ops.argpartition(x, 9)


def test_sort_orders_nan_last_and_top_k_checks_k():
    x = np.array([3.0, np.nan, -1.0, 2.0])
    np.testing.assert_array_equal(np.asarray(ops.sort(x)), [-1.0, 2.0, 3.0, np.nan])
    np.testing.assert_array_equal(np.asarray(ops.argsort(x)), [2, 3, 0, 1])
    with pytest.raises(ValueError, match=r"k must be an int in \[0, 4\]"):
        ops.top_k(x, 5)
    assert ops.argsort(np.float32(2.0)).shape == (1,)


def test_top_k_gradient_ignores_the_unchosen_entries():
    t = ops.convert_to_tensor(M)
    with GradientTape() as tape:
        tape.watch(t)
        values, indices = ops.top_k(t, 2)
        y = ops.sum(values)
    g = np.asarray(tape.gradient(y, t))
    want = np.zeros_like(M)
    np.put_along_axis(want, np.asarray(indices).astype(np.int64), 1.0, -1)
    np.testing.assert_array_equal(g, want)


def test_in_top_k_counts_ties_and_nan_ranks_last():
    pred = np.array([[1.0, 2.0, 2.0], [np.nan, 0.0, 1.0]], np.float32)
    np.testing.assert_array_equal(np.asarray(ops.in_top_k(np.array([1, 0]), pred, 1)), [True, False])
    with pytest.raises(ValueError, match="shape of predictions without its last axis"):
        ops.in_top_k(np.array([0, 1, 2]), pred, 1)


def test_searchsorted_and_digitize_check_arguments():
    with pytest.raises(ValueError, match="only supports 1-D sorted sequences"):
        ops.searchsorted(M, M[0])
    with pytest.raises(ValueError, match="side must be"):
        ops.searchsorted(M[0], 1.0, side="middle")
    with pytest.raises(ValueError, match="must be a 1D array"):
        ops.digitize(M, M)
    np.testing.assert_array_equal(np.asarray(ops.digitize(np.array([1.0, 2.0]), np.zeros(0))), [0, 0])


def test_histogram_edge_cases():
    counts, edges = ops.histogram(np.full(4, 2.0, np.float32), bins=2)
    np.testing.assert_array_equal(np.asarray(counts), [0, 4])
    np.testing.assert_allclose(np.asarray(edges), [1.5, 2.0, 2.5])
    counts, _ = ops.histogram(np.array([-5.0, 0.0, 1.0, 9.0, np.nan]), bins=2, range=(0, 1))
    np.testing.assert_array_equal(np.asarray(counts), [1, 1])
    with pytest.raises(TypeError, match="`bins` must be of type `int`"):
        ops.histogram(M[0], bins=2.0)
    with pytest.raises(ValueError, match="must be a tuple of two elements"):
        ops.histogram(M[0], range=[0, 1])
    with pytest.raises(ValueError, match="must be greater than the first"):
        ops.histogram(M[0], range=(1, 0))
    with pytest.raises(ValueError, match="1-dimensional"):
        ops.histogram(M)


def test_bincount_rejects_what_it_cannot_count():
    with pytest.raises(ValueError, match="non-negative integers"):
        ops.bincount(np.array([1, -1]))
    with pytest.raises(TypeError, match="integer tensor"):
        ops.bincount(np.array([1.0]))
    with pytest.raises(ValueError, match="sparse"):
        ops.bincount(np.array([1]), sparse=True)
    with pytest.raises(ValueError, match="shape of x"):
        ops.bincount(np.array([1, 2]), weights=np.ones(3))
    np.testing.assert_array_equal(np.asarray(ops.bincount(np.zeros(0, np.int32), minlength=3)), [0, 0, 0])
    np.testing.assert_array_equal(np.asarray(ops.bincount(np.array([True, False, True]))), [1, 2])


def test_unique_keeps_every_nan_and_handles_empty_inputs():
    vals, counts = ops.unique(np.array([np.nan, 1.0, np.nan, 1.0]), return_counts=True)
    np.testing.assert_array_equal(np.asarray(vals), [1.0, np.nan, np.nan])
    np.testing.assert_array_equal(np.asarray(counts), [2, 1, 1])
    assert ops.unique(np.zeros(0, np.int32)).shape == (0,)
    np.testing.assert_array_equal(np.asarray(ops.unique(np.zeros(0, np.int32), size=2, fill_value=9)), [9, 9])
    with pytest.raises(ValueError, match="fill_value must be given"):
        ops.unique(np.zeros(0, np.int32), size=2)
    np.testing.assert_array_equal(np.asarray(ops.unique(np.array([5, 3, 5, 1]), size=2)), [1, 3])


# ------------------------------------------------------------------------------------- windows
def test_windows_and_sequences_check_arguments():
    with pytest.raises(TypeError, match="window length"):
        ops.hamming(np.array([3, 4]))
    with pytest.raises(ValueError, match="non-negative"):
        ops.linspace(0.0, 1.0, -1)
    with pytest.raises(ValueError, match="must not be zero"):
        ops.geomspace(0.0, 1.0, 3)
    with pytest.raises(ValueError, match="1-dimensional"):
        ops.vander(M)
    with pytest.raises(TypeError, match="`N` must be of type `int`"):
        ops.vander(M[0], 2.0)
    with pytest.raises(TypeError, match="`increasing` must be of type `bool`"):
        ops.vander(M[0], increasing=1)


def test_vander_gradient_is_finite_at_zero():
    t = ops.convert_to_tensor(np.array([0.0, 1.0, 2.0]))
    with GradientTape() as tape:
        tape.watch(t)
        y = ops.sum(ops.vander(t, 3))
    # d/dx (x^2 + x + 1) = 2x + 1
    np.testing.assert_array_equal(np.asarray(tape.gradient(y, t)), [1.0, 3.0, 5.0])


def test_linspace_hits_both_endpoints_exactly_and_retstep():
    out, step = ops.linspace(0.1, 0.7, 13, retstep=True)
    host = np.asarray(out)
    assert host[0] == np.float32(0.1) and host[-1] == np.float32(0.7)
    np.testing.assert_allclose(float(step), 0.05, rtol=1e-6)
    assert np.isnan(float(ops.linspace(1.0, 2.0, 1, retstep=True)[1]))
