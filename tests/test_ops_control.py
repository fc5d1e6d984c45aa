"""Control flow ops (``dnnbind/ops/_control.py``): real Keras 3 on JAX for values and gradients (through
tests/keras_callables.py: the functions cannot travel as JSON), then the semantics the registry cases do
not reach: carry checks, host-read predicates, clamping, zero-length loops, the log-depth associative
scan, gradients through closures and variables, and higher-order gradients through loops."""

from __future__ import annotations

import numpy as np
import pytest

from dnnbind import ops
from dnnbind.autodiff import GradientTape, Variable

import keras_callables

CONTROL = ["cond_true", "cond_false", "switch", "switch_clamped", "scan", "scan_reverse_pytree", "scan_length",
           "fori_loop", "while_loop", "while_loop_max", "map", "vectorized_map", "associative_scan",
           "associative_scan_pytree"]


pytestmark = pytest.mark.usefixtures("cpu")  # conftest: the NumPy backend, then the default back


@pytest.mark.parametrize("name", CONTROL)
def test_matches_real_keras(name):
    keras_callables.compare(name)


# ---------------------------------------------------------------------------------------- scan
def test_scan_carry_must_keep_shape_and_dtype():
    xs = np.ones((3, 2), np.float32)
    with pytest.raises(TypeError, match="scan: the carry must keep its shapes"):
        ops.scan(lambda c, x: (ops.concatenate([c, x]), x), np.zeros(2, np.float32), xs)
    with pytest.raises(TypeError, match="scan: the carry must keep its dtypes"):
        ops.scan(lambda c, x: (ops.cast(c, "float64") + x, x), np.zeros(2, np.float32), xs)
    with pytest.raises(TypeError, match="scan: the carry must keep its structure"):
        ops.scan(lambda c, x: ((c, c), x), np.zeros(2, np.float32), xs)
    # a carry that started as a Python number is weakly typed (JAX's rule): it may become float
    carry, _ = ops.scan(lambda c, x: (c + ops.sum(x), x), 0, xs)
    assert float(carry) == 6.0


def test_scan_arguments_are_checked():
    f = lambda c, x: (c, x)  # noqa: E731
    with pytest.raises(ValueError, match="no xs to scan over and no length"):
        ops.scan(f, 0.0)
    with pytest.raises(ValueError, match="length=4 does not match the leading size 3"):
        ops.scan(f, 0.0, np.zeros(3), length=4)
    with pytest.raises(ValueError, match="different leading sizes"):
        ops.scan(f, 0.0, [np.zeros(3), np.zeros(4)])
    for unroll in (0, -2, 1.5, "2"):
        with pytest.raises(ValueError, match="unroll must be a positive integer or a bool"):
            ops.scan(f, 0.0, np.zeros(3), unroll=unroll)
    with pytest.raises(TypeError, match="f must return a pair"):
        ops.scan(lambda c, x: c, 0.0, np.zeros(3))
    with pytest.raises(TypeError, match="scan: f must be a callable"):
        ops.scan(None, 0.0, np.zeros(3))


def test_scan_order_none_outputs_and_empty_loops():
    xs = np.arange(1.0, 5.0)
    carry, ys = ops.scan(lambda c, x: (c * 10 + x, c), np.array(0.0), xs, reverse=True, unroll=True)
    assert float(carry) == 4321.0
    np.testing.assert_array_equal(np.asarray(ys), [432.0, 43.0, 4.0, 0.0])  # ys stay in xs's order
    carry, ys = ops.scan(lambda c, x: (c + 1, None), 0, length=3)
    assert int(carry) == 3 and ys is None
    carry, ys = ops.scan(lambda c, x: (c + x, {"a": x * 2, "b": ops.stack([x, x])}), np.zeros(2), np.zeros((0, 2)))
    assert np.asarray(carry).shape == (2,) and ys["a"].shape == (0, 2) and ys["b"].shape == (0, 2, 2)


def test_scan_records_every_iteration_and_differentiates_twice():
    """An RNN-like scan over a Variable's weight: first and second derivatives against NumPy."""
    w = Variable(np.array([0.7]))
    xs = np.array([[0.3], [-1.2], [0.8], [0.5]])

    def run():
        return ops.scan(lambda h, x: (ops.tanh(h * w + x), h), np.array([0.1]), xs)[0]

    def h_of(wv):
        h = 0.1
        for x in xs[:, 0]:
            h = np.tanh(h * wv + x)
        return h

    with GradientTape() as outer:
        with GradientTape() as inner:
            h = run()
        g = inner.gradient(h, w)
    gg = outer.gradient(g, w)
    eps = 1e-5
    np.testing.assert_allclose(float(h), h_of(0.7), rtol=1e-12)
    np.testing.assert_allclose(float(g), (h_of(0.7 + eps) - h_of(0.7 - eps)) / (2 * eps), rtol=1e-7)
    num2 = (h_of(0.7 + eps) - 2 * h_of(0.7) + h_of(0.7 - eps)) / eps ** 2
    np.testing.assert_allclose(float(gg), num2, rtol=1e-4)


# ----------------------------------------------------------------------------------- branches
def test_cond_reads_a_scalar_predicate_and_differentiates_the_branch_taken():
    x = ops.convert_to_tensor(np.array([1.0, -2.0]))
    with GradientTape() as tape:
        tape.watch(x)
        y = ops.cond(ops.sum(x) < 0, lambda: ops.sum(x * x), lambda: ops.sum(x))
    np.testing.assert_allclose(np.asarray(tape.gradient(y, x)), [2.0, -4.0])
    assert ops.cond(np.bool_(False), lambda: 1, lambda: 2) == 2
    with pytest.raises(ValueError, match="cond: the predicate must be a scalar"):
        ops.cond(np.array([True, False]), lambda: 1, lambda: 2)
    with pytest.raises(TypeError, match="cond: true_fn must be a callable"):
        ops.cond(True, 1, lambda: 2)


def test_switch_clamps_the_index_and_checks_it():
    branches = [lambda: "first", lambda: "second", lambda: "third"]
    assert ops.switch(-5, branches) == "first" and ops.switch(7, branches) == "third"
    assert ops.switch(ops.convert_to_tensor(1), branches) == "second"
    with pytest.raises(TypeError, match="switch: index must be an integer scalar"):
        ops.switch(ops.convert_to_tensor(1.0), branches)
    with pytest.raises(ValueError, match="switch: branches must hold at least one function"):
        ops.switch(0, [])


# --------------------------------------------------------------------------------------- loops
def test_while_loop_tuples_limits_and_checks():
    out = ops.while_loop(lambda i, s: i < 5, lambda i, s: (i + 1, s + i), [0, 0])
    assert isinstance(out, tuple) and (int(out[0]), int(out[1])) == (5, 10)
    assert int(ops.while_loop(lambda i: i < 10, lambda i: i + 1, 0, maximum_iterations=4)) == 4
    with pytest.raises(TypeError, match="while_loop: body must return 2 loop variable"):
        ops.while_loop(lambda i, s: i < 5, lambda i, s: i + 1, (0, 0))
    with pytest.raises(TypeError, match="while_loop: the loop variables must keep its shapes"):
        ops.while_loop(lambda x: ops.sum(x) < 10, lambda x: ops.concatenate([x, x]), np.ones(1))


def test_fori_loop_bounds_may_be_tensors():
    out = ops.fori_loop(ops.convert_to_tensor(2), ops.convert_to_tensor(5), lambda i, v: v * i, np.array(1.0))
    assert float(out) == 2.0 * 3.0 * 4.0
    with pytest.raises(TypeError, match="fori_loop: upper must be an integer scalar"):
        ops.fori_loop(0, 2.5, lambda i, v: v, 0.0)


def test_map_and_vectorized_map_keep_the_structure():
    xs = {"a": np.arange(6.0).reshape(3, 2), "b": np.ones(3)}
    ys = ops.vectorized_map(lambda e: {"s": ops.sum(e["a"]) + e["b"], "t": (e["a"], e["b"] * 2)}, xs)
    np.testing.assert_array_equal(np.asarray(ys["s"]), [2.0, 6.0, 10.0])
    assert ys["t"][0].shape == (3, 2) and ys["t"][1].shape == (3,)
    ys = ops.map(lambda x: x[0] + x[1], (np.ones((4, 2)), np.arange(8.0).reshape(4, 2)))
    np.testing.assert_array_equal(np.asarray(ys), np.arange(8.0).reshape(4, 2) + 1)
    with pytest.raises(TypeError, match="every iteration must return outputs of one structure"):
        ops.map(lambda x: (x,) if float(ops.sum(x)) > 0 else [x], np.array([[1.0], [-1.0]]))


# ---------------------------------------------------------------------------- associative scan
@pytest.mark.parametrize("n", [1, 2, 3, 5, 8, 9, 16])
def test_associative_scan_matches_sequential_scans(n):
    x = np.random.default_rng(n).uniform(0.5, 1.5, (n, 3))
    np.testing.assert_allclose(np.asarray(ops.associative_scan(lambda a, b: a + b, x)), np.cumsum(x, 0), rtol=1e-12)
    np.testing.assert_allclose(np.asarray(ops.associative_scan(lambda a, b: a * b, x, reverse=True)),
                               np.cumprod(x[::-1], 0)[::-1], rtol=1e-12)
    np.testing.assert_array_equal(np.asarray(ops.associative_scan(ops.maximum, np.ascontiguousarray(x.T), axis=1)),
                                  np.maximum.accumulate(x.T, axis=1))


def test_associative_scan_is_log_depth_and_checks_lengths():
    calls = []

    def add(a, b):
        calls.append(tuple(a.shape))
        return a + b

    ops.associative_scan(add, np.ones(64))
    assert len(calls) <= 2 * 6, calls  # about 2 log2(n) combines, on halving slices
    with pytest.raises(ValueError, match="one length along axis 0"):
        ops.associative_scan(lambda a, b: a, [np.ones(3), np.ones(4)])
    with pytest.raises(ValueError, match="f must return the structure and shapes of its inputs"):
        ops.associative_scan(lambda a, b: ops.sum(a + b), np.ones(4))
