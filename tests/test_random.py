"""``dnnbind.random`` (keras.random): seeding (ints, SeedGenerator streams, the global generator and
set_random_seed), draws bit for bit against ``kernels.numeric.philox_uint32``, distributions against
Keras's definitions (moments and ranges on large samples) and against real Keras's samples (a
two-sample Kolmogorov-Smirnov test: the bits differ, the distributions must not), dtypes,
gradients and errors."""

from __future__ import annotations

import math

import numpy as np
import pytest

import dnnbind
from dnnbind import backend, ops, utils
from dnnbind import random as R
from dnnbind.autodiff import GradientTape
from dnnbind.kernels.numeric import philox_uint32
from keras_aux import RANDOM_CASES, RANDOM_SAMPLES, reference

KERAS_NAMES = ("SeedGenerator", "beta", "binomial", "categorical", "dropout", "gamma", "normal", "randint", "shuffle",
               "truncated_normal", "uniform")  # keras.random in Keras 3.15.1

N = 100_000  # samples for the moment checks: standard errors near 0.3% of a standard deviation


@pytest.fixture(autouse=True)
def _cpu(cpu):
    yield


def _np(t):
    return np.asarray(t)


def _words(seed, n, counter=0):
    return philox_uint32(R._key_of(seed), counter, n)


def _uniform01(words):
    return (words >> np.uint32(8)).astype(np.float32) * np.float32(2.0 ** -24)


def test_every_keras_random_name_exists():
    missing = [n for n in KERAS_NAMES if not hasattr(R, n)]
    assert not missing, f"keras.random names missing from dnnbind.random: {missing}"
    assert dnnbind.random is R


# ----- seeds ---------------------------------------------------------------------------------------------------
def test_an_int_seed_repeats_and_seeds_differ():
    a, b, c = (_np(R.normal((64,), seed=s)) for s in (5, 5, 6))
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)


def test_a_seed_generator_advances_by_one_stride_per_call():
    gen = R.SeedGenerator(9)
    first = _np(R.uniform((10,), seed=gen))
    np.testing.assert_array_equal(first, _np(R.uniform((10,), seed=9)))  # Keras: SeedGenerator(s)'s first == seed=s
    assert int(gen.counter) == R.BLOCKS_PER_CALL
    second = _np(R.uniform((10,), seed=gen))
    assert not np.array_equal(first, second)
    np.testing.assert_array_equal(second, _uniform01(_words(9, 10, R.BLOCKS_PER_CALL)))
    R.gamma((7,), 0.5, seed=gen)  # several internal draws still move the counter by exactly one stride
    R.binomial((7,), 40, 0.5, seed=gen)
    assert int(gen.counter) == 4 * R.BLOCKS_PER_CALL
    twin = R.SeedGenerator(9)
    np.testing.assert_array_equal(_np(R.uniform((10,), seed=twin)), first)
    key, counter = twin.next()
    assert key == twin.key and int(_np(counter)) == R.BLOCKS_PER_CALL and int(twin.counter) == 2 * R.BLOCKS_PER_CALL
    assert gen.counter.dtype == np.uint64 and gen.counter.shape == () and gen.device == backend.Device("cpu")


def test_seed_generator_names_and_config():
    backend.clear_session()
    a, b = R.SeedGenerator(1), R.SeedGenerator()
    assert (a.name, b.name) == ("seed_generator", "seed_generator_1")
    assert b.get_config() == {"seed": None, "name": "seed_generator_1"}
    c = R.SeedGenerator.from_config(a.get_config())
    np.testing.assert_array_equal(_np(R.normal((4,), seed=c)), _np(R.normal((4,), seed=1)))


def test_set_random_seed_makes_unseeded_draws_reproducible():
    utils.set_random_seed(123)
    a = [_np(R.normal((8,))) for _ in range(3)]
    utils.set_random_seed(123)
    b = [_np(R.normal((8,))) for _ in range(3)]
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)
    assert not np.array_equal(a[0], a[1])  # the global generator advances
    utils.set_random_seed(124)
    assert not np.array_equal(_np(R.normal((8,))), a[0])


def test_set_random_seed_still_seeds_numpy_and_the_seed_stream_and_counts_itself():
    utils.set_random_seed(5)
    epoch, first = utils.seed_epoch(), (np.random.rand(), utils.draw_seed())
    utils.set_random_seed(5)
    assert (np.random.rand(), utils.draw_seed()) == first and utils.seed_epoch() == epoch + 1


def test_clear_session_makes_a_new_global_generator():
    first = R.global_seed_generator()
    assert R.global_seed_generator() is first
    backend.clear_session()
    assert R.global_seed_generator() is not first


@pytest.mark.parametrize("bad", ["7", 1.5, [1, 2], np.zeros(2)])
def test_seed_must_be_an_int_a_generator_or_none(bad):
    with pytest.raises(ValueError, match="seed"):
        R.uniform((2,), seed=bad)


def test_seed_generator_errors():
    with pytest.raises(ValueError, match="integer"):
        R.SeedGenerator(seed=1.5)
    with pytest.raises(ValueError, match="Unrecognized keyword"):
        R.SeedGenerator(seed=1, shape=3)
    R.SeedGenerator(seed=1, backend="numpy")  # Keras's custom-backend keyword is accepted


# ----- bit for bit against Philox ------------------------------------------------------------------------------
def test_uniform_is_the_philox_words_bit_for_bit():
    n = 1003  # not a multiple of the 4 words of a block
    np.testing.assert_array_equal(_np(R.uniform((17, 59), seed=42)).reshape(-1), _uniform01(_words(42, n)))
    u = _uniform01(_words(42, n))
    want = u * (np.float32(5.0) - np.float32(-2.0)) + np.float32(-2.0)
    np.testing.assert_array_equal(_np(R.uniform((n,), -2.0, 5.0, seed=42)), want)


def test_randint_dropout_shuffle_and_categorical_follow_the_words():
    words = _words(3, 50).astype(np.uint64)
    want = ((words * np.uint64(12)) >> np.uint64(32)).astype(np.int64) - 4
    np.testing.assert_array_equal(_np(R.randint((50,), -4, 8, seed=3)), want.astype(np.int32))

    x = np.arange(1, 41, dtype=np.float32).reshape(5, 8)
    keep = _uniform01(_words(3, 40)).reshape(5, 8) < np.float32(0.75)
    np.testing.assert_array_equal(_np(R.dropout(x, 0.25, seed=3)), np.where(keep, x / np.float32(0.75), 0))

    hi = _words(3, 40).astype(np.uint64)
    lo = philox_uint32(R._key_of(3), 10, 40).astype(np.uint64)  # the second draw starts at block ceil(40 / 4)
    order = np.argsort(((hi << np.uint64(32)) | lo).reshape(5, 8), axis=1, kind="stable")
    np.testing.assert_array_equal(_np(R.shuffle(x, axis=1, seed=3)), np.take_along_axis(x, order, axis=1))

    logits = np.log(np.array([[0.2, 0.3, 0.5], [0.9, 0.05, 0.05]], np.float32))
    u = _uniform01(_words(3, 2 * 4 * 3)).reshape(2, 4, 3)
    gumbel = -np.log(-np.log(u))
    np.testing.assert_array_equal(_np(R.categorical(logits, 4, seed=3)), np.argmax(logits[:, None, :] + gumbel, -1))


# ----- distributions against Keras's definitions -------------------------------------------------------------------
def _moments(x, mean, var, what, tol=0.02):
    x = np.asarray(x, np.float64)
    sd = math.sqrt(var)
    assert abs(x.mean() - mean) <= tol * sd + 5 * sd / math.sqrt(x.size), f"{what}: mean {x.mean()} vs {mean}"
    assert abs(x.var() - var) <= 0.03 * var, f"{what}: variance {x.var()} vs {var}"


def test_uniform_normal_truncated_normal():
    u = _np(R.uniform((N,), -1.0, 3.0, seed=1))
    assert u.min() >= -1.0 and u.max() < 3.0
    _moments(u, 1.0, 16 / 12, "uniform")
    _moments(_np(R.normal((N,), 1.0, 2.0, seed=1)), 1.0, 4.0, "normal")
    t = _np(R.truncated_normal((N,), -1.0, 0.5, seed=1))
    assert t.min() >= -2.0 and t.max() <= 0.0  # within two standard deviations
    phi2 = math.exp(-2.0) / math.sqrt(2 * math.pi)
    _moments(t, -1.0, 0.25 * (1 - 4 * phi2 / math.erf(math.sqrt(2.0))), "truncated_normal")


def test_tensor_parameters_broadcast():
    lo, hi = np.array([0.0, 10.0], np.float32), np.array([1.0, 20.0], np.float32)
    u = _np(R.uniform((N // 10, 2), lo, hi, seed=2))
    assert np.all(u >= lo) and np.all(u < hi)
    z = _np(R.normal((N // 10, 2), mean=np.array([-5.0, 5.0]), stddev=np.array([1.0, 0.1]), seed=2))
    np.testing.assert_allclose(z.mean(0), [-5.0, 5.0], atol=0.05)
    np.testing.assert_allclose(z.std(0), [1.0, 0.1], rtol=0.05)
    k = _np(R.randint((N // 10, 2), np.array([0, 100]), np.array([3, 105]), seed=2))
    assert set(np.unique(k[:, 0])) == {0, 1, 2} and set(np.unique(k[:, 1])) == set(range(100, 105))


def test_randint_is_uniform_over_its_range():
    k = _np(R.randint((N,), -3, 9, seed=4))
    assert k.dtype == np.int32 and k.min() == -3 and k.max() == 8
    counts = np.bincount(k + 3, minlength=12)
    assert np.all(np.abs(counts - N / 12) < 5 * math.sqrt(N / 12))
    wide = _np(R.randint((1000,), 0, 2**40, dtype="int64", seed=4))
    assert wide.dtype == np.int64 and wide.min() >= 0 and wide.max() < 2**40 and wide.max() > 2**39


def test_categorical_frequencies_follow_the_softmax():
    p = np.array([[0.1, 0.2, 0.7], [0.5, 0.5, 0.0]])
    logits = np.log(np.where(p > 0, p, 1e-30)).astype(np.float32)
    logits[1, 2] = -np.inf
    s = _np(R.categorical(logits, 20_000, seed=5))
    assert s.shape == (2, 20_000) and s.dtype == np.int32
    for row in range(2):
        np.testing.assert_allclose(np.bincount(s[row], minlength=3) / 20_000, p[row], atol=0.015)
    assert str(ops.dtype(R.categorical(logits, 3, dtype="int64", seed=5))) == "int64"


def test_dropout_keeps_the_expected_fraction_and_scales():
    x = np.ones((400, 250), np.float32)
    y = _np(R.dropout(x, 0.3, seed=6))
    assert set(np.unique(y)) == {0.0, np.float32(1 / 0.7)}
    assert abs((y > 0).mean() - 0.7) < 0.005
    z = _np(R.dropout(x, 0.5, noise_shape=(None, 1), seed=6))
    assert np.all((z == z[:, :1]))  # one draw per row, broadcast over the columns
    np.testing.assert_array_equal(_np(R.dropout(x, 0.0, seed=6)), x)
    np.testing.assert_array_equal(_np(R.dropout(x, 1.0, seed=6)), 0 * x)


def test_shuffle_permutes_each_line_independently_and_uniformly():
    x = np.tile(np.arange(8), (20_000, 1)).T.astype(np.float32)  # (8, 20000): every column 0..7
    y = _np(R.shuffle(x, axis=0, seed=7))
    np.testing.assert_array_equal(np.sort(y, axis=0), x)
    assert len({tuple(c) for c in y.T[:200]}) > 150  # columns shuffled independently
    position_of_zero = np.argmax(y == 0, axis=0)
    assert np.all(np.abs(np.bincount(position_of_zero, minlength=8) - 2500) < 5 * math.sqrt(2500))


@pytest.mark.parametrize("alpha", [0.3, 1.0, 2.5, 10.0])
def test_gamma_moments(alpha):
    g = _np(R.gamma((N,), alpha, seed=8))
    assert g.min() >= 0 and np.isfinite(g).all()
    _moments(g, alpha, alpha, f"gamma({alpha})")


def test_gamma_with_a_tensor_alpha():
    alpha = np.array([0.5, 4.0])
    g = _np(R.gamma((N // 4, 2), alpha, seed=9))
    np.testing.assert_allclose(g.mean(0), alpha, rtol=0.03)
    assert np.isnan(_np(R.gamma((3,), np.array([-1.0, 1.0, 2.0]), seed=1))[0])


@pytest.mark.parametrize("a,b", [(2.0, 3.0), (0.5, 0.5), (0.05, 0.2)])
def test_beta_moments(a, b):
    x = _np(R.beta((N,), a, b, seed=10))
    assert x.min() >= 0 and x.max() <= 1 and np.isfinite(x).all()
    _moments(x, a / (a + b), a * b / ((a + b) ** 2 * (a + b + 1)), f"beta({a}, {b})")


@pytest.mark.parametrize("n,p", [(20, 0.2), (5, 0.5), (100, 0.3), (1000, 0.8), (40, 0.97), (7, 0.0), (7, 1.0)])
def test_binomial_moments(n, p):
    x = _np(R.binomial((N,), n, p, seed=11))
    assert np.all(x == np.round(x)) and x.min() >= 0 and x.max() <= n
    if 0 < p < 1:
        _moments(x, n * p, n * p * (1 - p), f"binomial({n}, {p})")
    else:
        assert np.all(x == n * p)


def test_binomial_with_tensor_parameters():
    counts, probs = np.array([10.0, 60.0, 3.0]), np.array([0.5, 0.25, 0.9])
    x = _np(R.binomial((N // 4, 3), counts, probs, seed=12))
    np.testing.assert_allclose(x.mean(0), counts * probs, rtol=0.02)
    bad = _np(R.binomial((3,), np.array([-1.0, 4.0, 4.0]), np.array([0.5, 1.5, 0.5]), seed=1))
    assert np.isnan(bad[:2]).all() and not np.isnan(bad[2])


# ----- against real Keras's samples --------------------------------------------------------------------------------
@pytest.mark.parametrize("label,fn,kwargs", RANDOM_CASES, ids=[c[0] for c in RANDOM_CASES])
def test_distributions_match_real_keras(label, fn, kwargs):
    stats = pytest.importorskip("scipy.stats")
    status, _, values = reference()
    assert status[f"rnd/{label}"] == "ok", status[f"rnd/{label}"]
    theirs = values[f"rnd/{label}"]
    ours = _np(getattr(R, fn)((RANDOM_SAMPLES,), seed=7, **kwargs))
    assert ours.dtype == theirs.dtype, (ours.dtype, theirs.dtype)
    # two samples of one distribution: the KS statistic exceeds 1.95 * sqrt(2 / n) with probability 1e-3
    # (conservative for the discrete ones)
    result = stats.ks_2samp(ours, theirs)
    assert result.statistic < 1.95 * math.sqrt(2 / RANDOM_SAMPLES), (label, result)


# ----- dtypes, gradients, errors ---------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
def test_float_dtypes(dtype):
    for draw in (lambda: R.uniform((5000,), dtype=dtype, seed=1), lambda: R.normal((5,), dtype=dtype, seed=1),
                 lambda: R.truncated_normal((5,), dtype=dtype, seed=1), lambda: R.gamma((5,), 2.0, dtype=dtype, seed=1),
                 lambda: R.beta((5,), 2.0, 2.0, dtype=dtype, seed=1),
                 lambda: R.binomial((5,), 10, 0.5, dtype=dtype, seed=1)):
        assert str(ops.dtype(draw())) == dtype
    u = _np(R.uniform((20_000,), dtype=dtype, seed=1)).astype(np.float64)
    assert u.max() < 1.0  # rounding to 16 bits would reach maxval; the draw stays below it


def test_default_dtype_is_floatx():
    assert str(ops.dtype(R.normal((2,), seed=1))) == "float32"
    backend.set_floatx("float64")
    try:
        assert str(ops.dtype(R.uniform((2,), seed=1))) == "float64"
    finally:
        backend.set_floatx("float32")
    for dtype in ("int8", "uint8", "int64"):
        assert str(ops.dtype(R.randint((3,), 0, 5, dtype=dtype, seed=1))) == dtype


def test_dropout_and_shuffle_are_differentiable():
    x = np.linspace(-1, 1, 24).reshape(4, 6)
    r = np.random.default_rng(0).normal(size=x.shape)
    t = ops.convert_to_tensor(x)
    with GradientTape(persistent=True) as tape:
        tape.watch(t)
        d = R.dropout(t, 0.4, seed=2)
        s = R.shuffle(t, axis=1, seed=2)
        loss_d, loss_s = ops.sum(ops.multiply(d, r)), ops.sum(ops.multiply(s, r))
    mask = _np(d) != 0
    np.testing.assert_allclose(_np(tape.gradient(loss_d, t)), np.where(mask, r / 0.6, 0), rtol=1e-12)
    # x's rows increase, so s[i, j] = x[i, rank of s[i, j]]; x[i, k] went to where argsort(s[i]) puts k
    np.testing.assert_allclose(_np(tape.gradient(loss_s, t)), np.take_along_axis(r, np.argsort(_np(s), axis=1), axis=1))


@pytest.mark.parametrize("call,error,match", [
    (lambda: R.uniform((2,), dtype="int32"), ValueError, "floating point"),
    (lambda: R.normal((2,), dtype="bool"), ValueError, "floating point"),
    (lambda: R.randint((2,), 0, 5, dtype="float32"), ValueError, "integer"),
    (lambda: R.randint((2,), 5, 5), ValueError, "greater than"),
    (lambda: R.randint((2,), 0, 300, dtype="uint8"), ValueError, "does not fit"),
    (lambda: R.categorical(np.zeros(3), 2), ValueError, "2-D"),
    (lambda: R.dropout(np.ones(3), 1.5), ValueError, "rate"),
    (lambda: R.dropout(np.ones((2, 3)), 0.5, noise_shape=(2,)), ValueError, "rank"),
    (lambda: R.shuffle(np.ones(()), seed=1), ValueError, "rank"),
    (lambda: R.shuffle(np.ones(3), axis=1, seed=1), ValueError, "axis"),
    (lambda: R.gamma((2,), 0.0), ValueError, "alpha"),
    (lambda: R.beta((2,), 1.0, -1.0), ValueError, "beta"),
    (lambda: R.binomial((2,), 5, 1.5), ValueError, "probabilities"),
    (lambda: R.binomial((2,), -5, 0.5), ValueError, "counts"),
    (lambda: R.normal((2, -1)), ValueError, "negative"),
])
def test_errors(call, error, match):
    with pytest.raises(error, match=match):
        call()
