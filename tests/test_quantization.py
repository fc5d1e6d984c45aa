"""Low-bit inference on the NumPy backend: the quantizers against their definitions, the quantized ops
and layers against float within stated bounds, model.quantize (calibration, predict/evaluate, summary,
save/load round trips, errors). The GPU side is tests/test_quantization_gpu.py."""

from __future__ import annotations

import ctypes
import re
import threading
import time
import types
import warnings

import ml_dtypes
import numpy as np
import pytest

import dnnbind
from dnnbind import layers, kernels
from dnnbind import quantizers as Q
from dnnbind._lib import cublaslt as L
from dnnbind.cublas import _lt
from dnnbind.errors import CublasError
from dnnbind.saving_lib import SavingError

pytestmark = pytest.mark.filterwarnings("ignore:.*no GPU.*")

E4M3 = ml_dtypes.float8_e4m3fn


# ----------------------------------------------------------------------------- quantizers
def test_abs_max_quantize_scale_rounding_and_saturation(rng):
    x = rng.standard_normal((5, 33)).astype(np.float32)
    q, scale = Q.abs_max_quantize(x, axis=1)
    amax = np.max(np.abs(x), axis=1, keepdims=True)
    np.testing.assert_array_equal(scale, np.float32(127) / (amax + np.float32(1e-7)))
    assert q.dtype == np.int8 and scale.dtype == np.float32
    np.testing.assert_array_equal(q, np.clip(np.rint(x * scale), -127, 127))
    # each row's largest magnitude lands on +-127, nothing on -128
    np.testing.assert_array_equal(np.max(np.abs(q.astype(np.int32)), axis=1), 127)
    assert q.min() >= -127


def test_int8_static_scale_rounds_half_to_even_and_saturates():
    x = np.array([[0.25, 0.75, -1.25, 100.0, -100.0, 1.75]], np.float32)
    q, scale = kernels.quantize_int8(x, scale=np.array([2.0], np.float32))
    # 0.5 -> 0, 1.5 -> 2, -2.5 -> -2 (ties to even), 200 -> 127, -200 -> -127, 3.5 -> 4
    np.testing.assert_array_equal(q, [[0, 2, -2, 127, -127, 4]])
    assert scale[0] == 2.0


def test_int8_dynamic_scales_are_per_row(rng):
    x = (rng.standard_normal((4, 20)) * np.array([[0.1], [1.0], [10.0], [100.0]])).astype(np.float32)
    q, scale = kernels.quantize_int8(x)
    assert scale.shape == (4,)
    np.testing.assert_array_equal(scale, np.float32(127) / (np.max(np.abs(x), axis=1) + np.float32(1e-7)))
    np.testing.assert_array_equal(q, np.clip(np.rint(x * scale[:, None]), -127, 127).astype(np.int8))


def test_pack_int4_matches_keras_example_and_round_trips(rng):
    arr = np.array([[-3, 7], [2, -8], [1, 0]], np.int8)
    packed, shape, n = Q.pack_int4(arr, axis=0)
    assert shape == (2, 2) and n == 3
    np.testing.assert_array_equal(packed.view(np.int8), [[45, -121], [1, 0]])  # keras.quantizers.pack_int4
    np.testing.assert_array_equal(Q.unpack_int4(packed, n, axis=0), arr)
    q = rng.integers(-8, 8, size=(7, 9)).astype(np.int8)
    for axis in (0, 1):
        p, _, length = Q.pack_int4(q, axis=axis)
        assert p.shape[axis] == (q.shape[axis] + 1) // 2
        np.testing.assert_array_equal(Q.unpack_int4(p, length, axis=axis), q)
    with pytest.raises(ValueError, match=r"\[-8, 7\]"):
        Q.pack_int4(np.array([8], np.int8))


def test_grouped_int4_scales_cover_groups_along_the_input_axis(rng):
    w = rng.standard_normal((6, 300)).astype(np.float32)  # 300 = 2 groups of 128 and one of 44
    q, scale = Q.abs_max_quantize_grouped(w, 128)
    assert q.shape == (6, 300) and scale.shape == (6, 3)
    for g, (lo, hi) in enumerate([(0, 128), (128, 256), (256, 300)]):
        amax = np.max(np.abs(w[:, lo:hi]), axis=1)
        np.testing.assert_array_equal(scale[:, g], np.float32(7) / (amax + np.float32(1e-7)))
        np.testing.assert_array_equal(q[:, lo:hi], np.clip(np.rint(w[:, lo:hi] * scale[:, g:g + 1]), -8, 7))
    assert q.min() >= -8 and q.max() <= 7
    deq = Q.dequantize_grouped(q, scale, 128)
    # abs-max rounding error: at most half a step, step = amax / 7
    step = np.repeat(1.0 / scale, 128, axis=1)[:, :300]
    assert np.all(np.abs(deq - w) <= 0.5 * step + 1e-6)


def test_float8_scale_rounding_and_saturation():
    qs, ds = Q.compute_float8_scale(896.0)
    assert (qs, ds) == (np.float32(0.5), np.float32(2.0))
    assert Q.compute_float8_scale(0.0) == (1.0, 1.0) and Q.compute_float8_scale(np.inf) == (1.0, 1.0)
    x = np.array([1.0625, 1.1875, 1000.0, -1000.0, 0.0009765625, 3.0], np.float32)
    q = Q.quantize_float8(x, 1.0).astype(np.float32)
    # ties to even on the 0.125 grid of [1, 2); saturation to +-448; 2^-10 is half of the smallest
    # subnormal 2^-9: a tie, to even (0)
    np.testing.assert_array_equal(q, [1.0, 1.25, 448.0, -448.0, 0.0, 3.0])
    bits = Q.float8_to_bits(Q.quantize_float8(x, 1.0))
    assert bits.dtype == np.uint8
    np.testing.assert_array_equal(Q.float8_from_bits(bits).astype(np.float32), q)


def test_dequantize_weight_follows_each_definition(rng):
    w = rng.standard_normal((8, 40)).astype(np.float32)
    q8, s8 = Q.abs_max_quantize(w, axis=1)
    got = kernels.dequantize_weight(q8, s8.reshape(-1), mode="int8", dtype=np.float32)
    np.testing.assert_array_equal(got, q8.astype(np.float32) / s8)
    qs, ds = Q.compute_float8_scale(np.max(np.abs(w)))
    qf = Q.float8_to_bits(Q.quantize_float8(w, qs))
    got = kernels.dequantize_weight(qf, np.array([ds], np.float32), mode="float8", dtype=np.float32)
    np.testing.assert_array_equal(got, Q.float8_from_bits(qf).astype(np.float32) * ds)
    q4, s4 = Q.abs_max_quantize_grouped(w, 16)
    p4 = Q.pack_int4(q4, axis=1)[0]
    got = kernels.dequantize_weight(p4, s4, mode="int4", dtype=ml_dtypes.bfloat16, in_features=40, group_size=16)
    assert got.dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(got, Q.dequantize_grouped(q4, s4, 16).astype(ml_dtypes.bfloat16))


# ----------------------------------------------------------------------------- ops
def _layer_weights(rng, n=24, k=64):
    w = (rng.standard_normal((n, k)) / np.sqrt(k)).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32) * 0.1
    x = rng.standard_normal((10, k)).astype(np.float32)
    return x, w, b, x @ w.T + b


def _rel(a, b):
    return float(np.max(np.abs(np.asarray(a, np.float64) - b)) / np.max(np.abs(b)))


def test_int8_dense_forward_is_the_exact_integer_product(rng):
    x, w, b, ref = _layer_weights(rng)
    qw, sw = Q.abs_max_quantize(w, axis=1)
    sw = sw.reshape(-1)
    y = kernels.int8_dense_forward(x, qw, sw, b)
    qx, sx = Q.abs_max_quantize(x, axis=1)
    acc = qx.astype(np.int64) @ qw.astype(np.int64).T
    np.testing.assert_array_equal(y, acc.astype(np.float32) / (sx * sw[None, :]) + b)
    assert _rel(y, ref) < 0.02
    # a calibrated scale quantizes the whole tensor with one scale
    s = np.array([127.0 / np.max(np.abs(x))], np.float32)
    ys = kernels.int8_dense_forward(x, qw, sw, b, input_scale=s)
    qs = np.clip(np.rint(x * s[0]), -127, 127)
    np.testing.assert_array_equal(ys, (qs @ qw.T.astype(np.float64)).astype(np.float32) / (s[0] * sw) + b)
    assert _rel(ys, ref) < 0.03


def test_float8_and_int4_dense_forward_within_bounds(rng):
    x, w, b, ref = _layer_weights(rng, k=256)
    qs, ds = Q.compute_float8_scale(np.max(np.abs(w)))
    qw = Q.float8_to_bits(Q.quantize_float8(w, qs))
    y8 = kernels.float8_dense_forward(x, qw, np.array([ds], np.float32), b)
    assert 0 < _rel(y8, ref) < 0.08
    # exactly the definition: x to E4M3 with its own per-tensor scale (quantizers.py, tested above), float64
    # sums of the E4M3 products, times both dequantize scales, + bias, to float32
    w8 = Q.float8_from_bits(qw).astype(np.float64)
    for input_scale in (None, np.array([2.0 * np.max(np.abs(x)) / 448], np.float32)):
        xq, xd = Q.compute_float8_scale(np.max(np.abs(x))) if input_scale is None else (
            np.float32(1) / input_scale[0], input_scale[0])
        acc = Q.quantize_float8(x, xq).astype(np.float64) @ w8.T
        want = (acc * (np.float64(xd) * np.float64(ds)) + b).astype(np.float32)
        got = kernels.float8_dense_forward(x, qw, np.array([ds], np.float32), b, input_scale=input_scale)
        np.testing.assert_array_equal(got, want)
    q4, s4 = Q.abs_max_quantize_grouped(w, 128)
    y4 = kernels.int4_dense_forward(x, Q.pack_int4(q4, axis=1)[0], s4, b, in_features=256, group_size=128)
    np.testing.assert_allclose(y4, x @ Q.dequantize_grouped(q4, s4, 128).T + b, rtol=1e-5, atol=1e-5)
    assert 0 < _rel(y4, ref) < 0.15


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16])
def test_quantized_ops_keep_the_input_dtype(rng, dtype):
    x, w, b, ref = _layer_weights(rng)
    qw, sw = Q.abs_max_quantize(w, axis=1)
    y = kernels.int8_dense_forward(x.astype(dtype), qw, sw.reshape(-1), b.astype(dtype))
    assert y.dtype == np.dtype(dtype)
    assert _rel(y.astype(np.float32), ref) < 0.03


def test_quantized_ops_refuse_bad_arguments(rng):
    x, w, b, _ = _layer_weights(rng)
    qw, sw = Q.abs_max_quantize(w, axis=1)
    with pytest.raises(ValueError, match="kernel must be a 2-d int8"):
        kernels.int8_dense_forward(x, w, sw.reshape(-1))
    with pytest.raises(ValueError, match="features"):
        kernels.int8_dense_forward(x[:, :10], qw, sw.reshape(-1))
    with pytest.raises(ValueError, match="kernel_scale must be float32"):
        kernels.int8_dense_forward(x, qw, sw)
    with pytest.raises(TypeError, match="float16, bfloat16 or float32"):
        kernels.int8_dense_forward(x.astype(np.float64), qw, sw.reshape(-1))
    with pytest.raises(ValueError, match="input_scale"):
        kernels.float8_dense_forward(x, qw.view(np.uint8), np.ones(1, np.float32), input_scale=np.ones(2, np.float32))
    with pytest.raises(ValueError, match="group_size"):
        kernels.int4_dense_forward(x, np.zeros((24, 32), np.uint8), np.ones((24, 1), np.float32), in_features=64,
                               group_size=3)


@pytest.mark.parametrize("dtype", [np.float32, np.float16, ml_dtypes.bfloat16])
def test_fused_relu_references_apply_relu_on_float32_before_the_output_rounding(rng, dtype):
    x, w, b, _ = _layer_weights(rng, k=256)
    x, b = x.astype(dtype), b.astype(dtype)
    qw, sw = Q.abs_max_quantize(w, axis=1)
    sw = sw.reshape(-1)
    # int8: y = relu(acc / (sx * sw) + bias) in float32, then the rounding to dtype
    qx, sx = Q.abs_max_quantize(x.astype(np.float32), axis=1)
    acc = (qx.astype(np.int64) @ qw.astype(np.int64).T).astype(np.float32)
    y32 = acc / (sx * sw[None, :]) + b.astype(np.float32)
    got = kernels.int8_dense_forward(x, qw, sw, b, activation="relu")
    assert got.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(got, np.maximum(y32, np.float32(0)).astype(dtype))
    assert 0.2 < np.mean(got.astype(np.float32) == 0) < 0.8  # relu really cut
    # relu commutes with the monotonic rounding: equal to the unfused op followed by relu
    plain = kernels.int8_dense_forward(x, qw, sw, b, activation=None)
    np.testing.assert_array_equal(got, kernels.activation_forward(plain, "relu"))
    np.testing.assert_array_equal(kernels.int8_dense_forward(x, qw, sw, b, activation="linear"), plain)
    # float8: float64 sums of the E4M3 products, scaled, + bias, to float32, relu, then the rounding
    qs, ds = Q.compute_float8_scale(np.max(np.abs(w)))
    q8 = Q.float8_to_bits(Q.quantize_float8(w, qs))
    s8 = np.array([ds], np.float32)
    fx, xs = kernels.quantize_float8(x)
    acc8 = Q.float8_from_bits(fx).astype(np.float64) @ Q.float8_from_bits(q8).astype(np.float64).T
    y8 = (acc8 * (np.float64(xs[1]) * np.float64(ds)) + b.astype(np.float32)).astype(np.float32)
    got8 = kernels.float8_dense_forward(x, q8, s8, b, activation="relu")
    np.testing.assert_array_equal(got8, np.maximum(y8, np.float32(0)).astype(dtype))
    np.testing.assert_array_equal(got8, kernels.activation_forward(kernels.float8_dense_forward(x, q8, s8, b), "relu"))


def test_fused_activation_keeps_nan_and_refuses_what_it_cannot_fuse(rng):
    x, w, b, _ = _layer_weights(rng)
    qw, sw = Q.abs_max_quantize(w, axis=1)
    nan_bias = b.copy()
    nan_bias[3] = np.nan
    y = kernels.int8_dense_forward(x, qw, sw.reshape(-1), nan_bias, activation="relu")
    assert np.all(np.isnan(y[:, 3])) and np.all(np.isfinite(np.delete(y, 3, axis=1)))
    for bad in ("gelu", "softmax", "ReLU", 1):
        with pytest.raises(ValueError, match=r"int8_dense_forward: activation must be None, 'linear' or one of"):
            kernels.int8_dense_forward(x, qw, sw.reshape(-1), b, activation=bad)
    with pytest.raises(ValueError, match=r"float8_dense_forward: activation"):
        kernels.float8_dense_forward(x, qw.view(np.uint8), np.ones(1, np.float32), activation="gelu")


@pytest.mark.parametrize("mode", ["int8", "float8", "int4"])
@pytest.mark.parametrize("activation", ["relu", "gelu", "softmax"])
def test_quantized_dense_activation_fused_or_applied_after_gives_the_same(rng, mode, activation, monkeypatch):
    """Dense passes relu to the int8/float8 op (and does not apply it again); other activations and int4 keep
    the separate activation. Either way the output is activation(quantized z)."""
    x = rng.standard_normal((6, 3, 48)).astype(np.float32)
    d = layers.Dense(32, activation=activation)
    d(x)
    linear = layers.Dense(32)
    linear(x)
    linear.set_weights(d.get_weights())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        d.quantize(mode, group_size=16)
        linear.quantize(mode, group_size=16)
    seen = []
    for name in ("int8_dense_forward", "float8_dense_forward"):
        real = getattr(kernels, name)
        monkeypatch.setattr(kernels, name, lambda *a, _real=real, **k: seen.append(k.get("activation")) or _real(*a, **k))
    got = d(x)
    z = linear(x).data
    assert got.shape == (6, 3, 32)
    ref = kernels.activation_forward(z, activation) if activation != "softmax" else kernels.softmax_forward(z)
    np.testing.assert_array_equal(got, ref)
    fused = mode != "int4" and activation == "relu"
    if mode != "int4":
        assert seen == [("relu" if fused else None), None]
    if fused:
        assert d._fused_activation() == "relu" and 0.2 < np.mean(got == 0) < 0.8
    else:
        assert d._fused_activation() is None
    np.testing.assert_array_equal(d.forward_logits(x), z)  # the pre-activation values, fused or not


# ----------------------------------------------------------------------------- layers and models
def _mnist_like(rng, n=256):
    x = rng.standard_normal((n, 8, 8, 1)).astype(np.float32)
    y = rng.integers(0, 10, size=n)
    return x, y


def _model():
    return dnnbind.Sequential([
        layers.Input((8, 8, 1)), layers.Conv2D(8, 3, activation="relu"), layers.Flatten(),
        layers.Dense(64, activation="relu"), layers.Dense(10, activation="softmax"),
    ])


def _trained(rng):
    dnnbind.utils.set_random_seed(3)
    m = _model()
    m.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    x, y = _mnist_like(rng)
    m.fit(x, y, epochs=2, batch_size=64, verbose=0)
    return m, x, y


@pytest.mark.parametrize("mode, bound", [("int8", 0.03), ("float8", 0.12), ("int4", 0.25)])
def test_model_quantize_predicts_close_to_float_and_evaluates(rng, mode, bound):
    m, x, y = _trained(rng)
    ref = m.predict(x, verbose=0)
    ref_loss = m.evaluate(x, y, verbose=0)[0]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        m.quantize(mode, group_size=32)
    conv, dense, dense_1 = m.layers[0], m.layers[2], m.layers[3]
    assert dense.quantization_mode == mode and dense_1.quantization_mode == mode
    if mode == "int4":
        assert conv.quantization_mode is None
        assert any("has no int4 path" in str(w.message) for w in caught)
    else:
        assert conv.quantization_mode == mode
        assert any("dequantized kernel" in str(w.message) for w in caught)
    got = m.predict(x, verbose=0)
    assert got.shape == ref.shape and np.all(np.isfinite(got))
    assert _rel(got, ref) < bound
    assert np.mean(np.argmax(got, 1) == np.argmax(ref, 1)) > (0.97 if mode == "int8" else 0.9)
    loss, acc = m.evaluate(x, y, verbose=0)
    assert abs(loss - ref_loss) < 0.1 * ref_loss + 0.05 and 0 <= acc <= 1
    assert all(getattr(w.layer, "quantization_mode", None) is None for w in m.trainable_weights)


def test_quantized_dense_weights_use_keras_layouts(rng):
    d = layers.Dense(6)
    x = rng.standard_normal((3, 20)).astype(np.float32)
    d(x)
    kernel = d.get_weights()[0]
    d.quantize("int8")
    names = [w.name for w in d.weights]
    assert names == ["kernel", "bias", "kernel_scale", "input_scale"]
    q, bias, scale, input_scale = d.get_weights()
    assert q.shape == (20, 6) and q.dtype == np.int8 and scale.shape == (6,) and input_scale[0] == 0
    q_ref, s_ref = Q.abs_max_quantize(kernel, axis=0)  # Keras: per output channel, along the input axis
    np.testing.assert_array_equal(q, q_ref)
    np.testing.assert_array_equal(scale, s_ref.reshape(-1))
    d4 = layers.Dense(6)
    d4(x)
    d4.set_weights([kernel, bias])
    d4.quantize("int4", group_size=8)
    packed, _, scale4 = d4.get_weights()
    assert packed.shape == (10, 6) and packed.dtype == np.uint8 and scale4.shape == (3, 6)
    q4, s4 = Q.abs_max_quantize_grouped(kernel.T, 8)
    np.testing.assert_array_equal(Q.unpack_int4(packed, 20, axis=0), q4.T)
    np.testing.assert_array_equal(scale4, s4.T)


def test_calibration_sets_static_input_scales(rng):
    m, x, _ = _trained(rng)
    flatten_out = x[:100].reshape(100, -1)
    conv_out = m.layers[0](x[:100])
    dense_in = conv_out.reshape(100, -1)
    amax = float(np.max(np.abs(dense_in)))
    del flatten_out
    m.quantize("int8", calibration_data=x[:100], batch_size=50)
    dense = m.layers[2]
    assert dense._input_scale_static
    np.testing.assert_allclose(dense.input_scale.numpy()[0], np.float32(127) / np.float32(amax + 1e-7), rtol=1e-6)
    got = m.predict(x, verbose=0)
    assert np.all(np.isfinite(got))
    m8, _, _ = _trained(rng)
    m8.quantize("float8", calibration_data=(x[:100],), calibration_steps=1, batch_size=100)
    np.testing.assert_allclose(m8.layers[2].input_scale.numpy()[0], np.float32(amax) / np.float32(448), rtol=1e-2)
    with pytest.raises(ValueError, match="int4 quantizes weights only"):
        _model().quantize("int4", calibration_data=x)


def test_a_quantize_that_fails_leaves_no_calibration_behind_for_the_next_one(rng, monkeypatch):
    m, x, _ = _trained(rng)
    first = m.layers[0]  # the Conv2D, quantized first

    def fail(*args, **kwargs):
        raise RuntimeError("out of memory")

    monkeypatch.setattr(first, "quantize", fail, raising=False)
    with pytest.raises(RuntimeError, match="out of memory"):
        m.quantize("int8", calibration_data=x[:100], batch_size=50)
    assert all("_calibrated_amax" not in layer.__dict__ for layer in m.layers)
    assert all(getattr(layer, "quantization_mode", None) is None for layer in m.layers)
    monkeypatch.delattr(first, "quantize")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m.quantize("int8")  # no calibration data: dynamic per-row scales, not the failed call's amax
    dense = m.layers[2]
    assert dense.quantization_mode == "int8" and not dense._input_scale_static
    assert dense.input_scale.numpy()[0] == 0


def _dense_model(rng):
    dnnbind.utils.set_random_seed(5)
    m = dnnbind.Sequential([layers.Input((8,)), layers.Dense(16, activation="relu"), layers.Dense(4)])
    x = rng.standard_normal((64, 8)).astype(np.float32)
    m.predict(x, verbose=0)
    return m, x


@pytest.mark.parametrize("mode", ["int8", "float8"])
@pytest.mark.parametrize("case, data, message", [
    ("empty", np.zeros((0, 8), np.float32), r"calibration_data holds no samples"),
    ("zeros", np.zeros((32, 8), np.float32), r"degenerate activation scales for Dense 'dense(_\d+)?' \(max\|x\| = 0\.0 over "
                                             r"32 rows: int8 scale 1\.27e\+09\)"),
    ("nan", np.full((4, 8), np.nan, np.float32), r"degenerate activation scales for Dense .*max\|x\| = nan"),
])
def test_degenerate_calibration_is_refused_and_changes_nothing(rng, mode, case, data, message):
    """The issue's case: an empty or all-zero calibration set gave scales of 1.27e9 and predictions that
    agreed with the float model 0-12% of the time. It is refused before any layer changes, saying what
    to do; quantize() without calibration data then works, with dynamic scales."""
    m, x = _dense_model(rng)
    ref = m.predict(x, verbose=0)
    before = [w.copy() for w in m.get_weights()]
    with pytest.raises(ValueError, match=message) as raised:
        m.quantize(mode, calibration_data=data)
    assert "quantize without calibration_data" in str(raised.value)
    assert [getattr(layer, "quantization_mode", None) for layer in m.layers] == [None, None]
    assert all("_calibrated_amax" not in layer.__dict__ for layer in m.layers)
    for a, b in zip(m.get_weights(), before):
        np.testing.assert_array_equal(a, b)
    m.quantize(mode)
    assert not m.layers[0]._input_scale_static
    agree = np.mean(np.argmax(m.predict(x, verbose=0), 1) == np.argmax(ref, 1))
    assert agree > 0.9, agree


def test_set_weights_and_load_weights_on_a_quantized_layer_check_dtypes_and_ranges(rng, tmp_path):
    """set_weights used to take a float32 kernel and truncate it into the int8 one."""
    m, x = _dense_model(rng)
    float_kernel = m.layers[0].get_weights()[0]
    m.quantize("int8", calibration_data=x)
    m.save_weights(tmp_path / "q.safetensors")
    good = m.get_weights()
    ref = m.predict(x, verbose=0)
    cases = [
        (0, float_kernel, TypeError, r"layer 'dense(_\d+)?' \(Dense, quantized 'int8'\): weight 'kernel' holds int8 values "
                                     r"in \[-127, 127\].*got dtype float32: a float array would be truncated"),
        (0, np.full_like(good[0], -128), ValueError, r"weight 'kernel' holds int8 values in \[-127, 127\].*got values "
                                                     r"in \[-128, -128\]"),
        (2, np.zeros_like(good[2]), ValueError, r"weight 'kernel_scale' holds finite scales > 0, got \[0\. 0\. 0\. 0\.\]"),
        (3, np.array([np.inf], np.float32), ValueError, r"weight 'input_scale' holds a finite scale >= 0"),
    ]
    for index, value, error, message in cases:
        weights = list(good)
        weights[index] = value
        with pytest.raises(error, match=message):
            m.set_weights(weights)
        for a, b in zip(m.get_weights(), good):  # nothing was written
            np.testing.assert_array_equal(a, b)
    # the same checks on a file, before the first weight is assigned
    from safetensors.numpy import load_file, save_file

    tensors = load_file(str(tmp_path / "q.safetensors"))
    kernel_key = next(k for k, v in tensors.items() if v.dtype == np.int8)
    save_file({**tensors, kernel_key: np.full_like(tensors[kernel_key], -128)}, str(tmp_path / "bad.safetensors"))
    with pytest.raises(SavingError, match=rf"bad\.safetensors: tensor '{kernel_key}': .* got values in \[-128, -128\]"):
        m.load_weights(tmp_path / "bad.safetensors")
    np.testing.assert_array_equal(m.predict(x, verbose=0), ref)
    m8, _ = _dense_model(rng)
    m8.quantize("float8")
    weights = m8.get_weights()
    weights[0] = np.full_like(weights[0], 0x7F)  # E4M3's NaN byte
    with pytest.raises(ValueError, match="none of them NaN"):
        m8.set_weights(weights)


@pytest.mark.parametrize("mode", ["int8", "float8", "int4"])
def test_a_layer_whose_quantization_fails_part_way_is_left_as_it_was(rng, monkeypatch, mode):
    layer = layers.Dense(32, activation="relu")
    layer.build((None, 256))
    kernel, bias = layer.kernel, layer.bias
    weights, values = list(layer.weights), [w.numpy().copy() for w in layer.weights]
    made = layer._quantized_weight

    def fail_on_scale(name, *args, **kwargs):
        if name == "kernel_scale":
            raise MemoryError("out of memory on cuda:0")  # after the kernel was replaced
        return made(name, *args, **kwargs)

    monkeypatch.setattr(layer, "_quantized_weight", fail_on_scale)
    with pytest.raises(MemoryError, match="out of memory"):
        layer.quantize(mode)
    assert layer.kernel is kernel and layer.bias is bias and bias.trainable
    assert "kernel_scale" not in layer.__dict__ and getattr(layer, "quantization_mode", None) is None
    assert list(layer.weights) == weights
    assert all(np.array_equal(w.numpy(), v) for w, v in zip(layer.weights, values))
    monkeypatch.undo()
    layer.quantize(mode)  # and it can still be quantized
    assert layer.quantization_mode == mode


@pytest.mark.parametrize("mode", ["int8", "float8", "int4"])
def test_save_and_load_round_trip_quantized_weights_and_scales(rng, tmp_path, mode):
    m, x, _ = _trained(rng)
    calibration = x[:64] if mode != "int4" else None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m.quantize(mode, calibration_data=calibration, group_size=32)
    ref = m.predict(x, verbose=0)
    m.save_weights(tmp_path / "q.safetensors")
    m.save(tmp_path / "q.dnnbind")

    other = _model()
    other.build((None, 8, 8, 1))
    with pytest.raises(SavingError, match=r"quantized model: call model\.quantize\(mode\)"):
        other.load_weights(tmp_path / "q.safetensors")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        other.quantize(mode, group_size=32)
    other.load_weights(tmp_path / "q.safetensors")
    np.testing.assert_array_equal(other.predict(x, verbose=0), ref)
    for a, b in zip(other.get_weights(), m.get_weights()):
        assert a.dtype == b.dtype
        np.testing.assert_array_equal(a, b)

    loaded = dnnbind.load_model(tmp_path / "q.dnnbind")
    assert [getattr(layer, "quantization_mode", None) for layer in loaded.layers] == \
        [getattr(layer, "quantization_mode", None) for layer in m.layers]
    np.testing.assert_array_equal(loaded.predict(x, verbose=0), ref)


def test_loading_float_weights_into_a_quantized_model_says_what_to_do(rng, tmp_path):
    m, x, _ = _trained(rng)
    m.save_weights(tmp_path / "f.safetensors")
    m.layers[2].quantize("int8")
    with pytest.raises(SavingError, match=r"quantized \('int8'\).*holds a float model"):
        m.load_weights(tmp_path / "f.safetensors")


def test_summary_shows_modes_and_memory_saved(rng):
    m, _, _ = _trained(rng)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m.quantize("int4", group_size=32)
    lines = []
    m.summary(print_fn=lines.append)
    text = "\n".join(lines)
    assert "dense (Dense, int4)" in text or re.search(r"\(Dense, int4\)", text)
    assert "(Conv2D)" in text
    match = re.search(r"Quantized layers: 2 \(int4\): weights (.+) instead of (.+) \(saved (.+)\)", text)
    assert match, text
    now, before = m.layers[2].quantized_bytes()
    # 288 x 64 float32 kernel + bias -> 4 bits per weight, float32 bias and one scale per 32 inputs
    assert before == (288 * 64 + 64) * 4 and now == 144 * 64 + 64 * 4 + 9 * 64 * 4


def test_training_a_quantized_model_raises_and_changes_nothing(rng):
    m, x, y = _trained(rng)
    m.quantize("int8", filters=["dense.*"])
    assert m.layers[0].quantization_mode is None
    before = [w.copy() for w in m.get_weights()]
    with pytest.raises(ValueError, match=r"quantized for inference only"):
        m.fit(x, y, epochs=1, verbose=0)
    with pytest.raises(ValueError, match=r"quantized for inference only"):
        m.train_on_batch(x[:8], y[:8])
    for a, b in zip(m.get_weights(), before):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(ValueError, match="runs inference only"):
        m.layers[2](rng.standard_normal((4, 288)).astype(np.float32), training=True)


def test_quantize_refuses_bad_requests_before_changing_anything(rng):
    m, x, _ = _trained(rng)
    with pytest.raises(ValueError, match="mode must be one of 'int8', 'float8', 'int4'"):
        m.quantize("int2")
    with pytest.raises(ValueError, match="group_size must be an even int"):
        m.quantize("int4", group_size=7)
    with pytest.raises(ValueError, match="matched none"):
        m.quantize("int8", filters="nothing")
    assert all(getattr(layer, "quantization_mode", None) is None for layer in m.layers)
    with pytest.raises(ValueError, match="needs a built model"):
        dnnbind.Sequential([layers.Dense(3)]).quantize("int8")
    with pytest.raises(NotImplementedError, match="not supported by Conv2D"):
        m.layers[0].quantize("int4")
    m.quantize("int8")
    with pytest.raises(ValueError, match="already quantized"):
        m.quantize("int8")
    with pytest.raises(TypeError, match="float64"):
        d = layers.Dense(3, dtype="float64")
        d(np.ones((2, 4)))
        d.quantize("int8")


# ----------------------------------------------------------------------------- cuBLASLt plan making (no GPU)
# The descriptors are host objects: cuBLASLt creates them without a GPU. The heuristic and the matmul
# are replaced by fakes that answer with chosen statuses, to check the order in which settings and
# algorithms are tried, what the plan records, and the error when nothing runs.
class _FakeLt:
    _EPILOGUES = {int(L.Epilogue.BIAS): "bias", int(L.Epilogue.RELU_BIAS): "relu-bias", int(L.Epilogue.RELU): "relu"}

    def __init__(self, heuristic, matmul):
        # setting -> (status, n algos); [statuses by algo], or setting -> [statuses by algo] (default [0])
        self.heuristic, self.matmul = heuristic, matmul
        self.calls: "list[tuple[str, int]]" = []
        self.settings: "list[str]" = []  # the epilogue of each heuristic query, in order

    def raw(self, real_raw, name):
        if name == "cublasLtMatmulAlgoGetHeuristic":
            def heuristic(handle, desc, a, b, c, d, pref, requested, results, count):
                epilogue = ctypes.c_uint32()
                written = ctypes.c_size_t()
                L.call("cublasLtMatmulDescGetAttribute", desc, int(L.MatmulDescAttribute.EPILOGUE),
                       ctypes.byref(epilogue), 4, ctypes.byref(written))
                setting = self._EPILOGUES.get(epilogue.value, "plain")
                self.settings.append(setting)
                status, n = self.heuristic[setting]
                out = (L.HeuristicResult * requested).from_address(results)
                for i in range(min(n, requested)):
                    out[i].algo[0], out[i].state = 100 + i, 0
                count._obj.value = min(n, requested)
                return status
            return heuristic
        if name == "cublasLtMatmul":
            def matmul(*args):
                algo = ctypes.c_uint64.from_address(args[12]).value - 100
                self.calls.append(("matmul", algo))
                statuses = self.matmul.get(self.settings[-1], [0]) if isinstance(self.matmul, dict) else self.matmul
                return statuses[algo] if algo < len(statuses) else 0
            return matmul
        return real_raw(name)


@pytest.fixture
def fake_lt(monkeypatch):
    def install(heuristic, matmul):
        fake = _FakeLt(heuristic, matmul)
        real_raw = L.raw
        monkeypatch.setattr(L, "raw", lambda name: fake.raw(real_raw, name))
        monkeypatch.setattr(_lt, "_plans", _lt.LRUCache(_lt.PLAN_CACHE_SIZE, "test"))
        monkeypatch.setattr(_lt, "get_lt_handle", lambda device: types.SimpleNamespace(handle=0))
        return fake
    return install


_STREAM = types.SimpleNamespace(device_index=0, handle=0)
_FP8_CALL = dict(d_dtype=ml_dtypes.bfloat16, stream=_STREAM, workspace=0, workspace_bytes=0, a_scale=0x7000,
                 b_scale=0x7100)


def test_lt_plan_falls_back_from_the_bias_epilogue_and_records_the_setting(fake_lt):
    fake = fake_lt({"bias": (15, 0), "plain": (0, 2)}, [0])
    left = _lt.matmul_tn("float8", 64, 40, 256, 0x1000, 0x2000, 0x3000, bias=0x4000,
                         bias_dtype=ml_dtypes.bfloat16, **_FP8_CALL)
    assert left == ("bias",)  # the caller adds the bias
    (plan,) = _lt.lt_plans()
    assert "float8 m=64 n=40 k=256 D=bfloat16 bias=bfloat16 setting=bias-after algo=1/2" in repr(plan)
    assert fake.calls == [("matmul", 0)]


def test_lt_plan_tries_the_next_algorithm_when_cublasLtMatmul_refuses_and_caches_it(fake_lt):
    fake = fake_lt({"bias": (0, 3), "plain": (0, 3)}, [15, 0])
    kw = dict(bias=0x4000, bias_dtype=ml_dtypes.bfloat16, **_FP8_CALL)
    assert _lt.matmul_tn("float8", 64, 40, 256, 0x1000, 0x2000, 0x3000, **kw) == ()
    assert "setting=bias-epilogue algo=2/3" in repr(_lt.lt_plans()[0])
    # the next call runs the algorithm that worked, straight away
    assert _lt.matmul_tn("float8", 64, 40, 256, 0x5000, 0x6000, 0x8000, **kw) == ()
    assert fake.calls == [("matmul", 0), ("matmul", 1), ("matmul", 1)]


def test_lt_refusing_everything_names_the_matmul_and_what_each_attempt_answered(fake_lt):
    fake_lt({"bias": (7, 0), "plain": (0, 1)}, [15])
    with pytest.raises(_lt.LtNotSupportedError) as info:
        _lt.matmul_tn("float8", 64, 40, 256, 0x1000, 0x2000, 0x3000, bias=0x4000, bias_dtype=ml_dtypes.bfloat16,
                      **_FP8_CALL)
    assert isinstance(info.value, CublasError)
    msg = str(info.value)
    assert "float8 m=64 n=40 k=256 D=bfloat16" in msg
    assert "bias-epilogue: cublasLtMatmulAlgoGetHeuristic CUBLAS_STATUS_INVALID_VALUE" in msg
    assert "bias-after: cublasLtMatmul CUBLAS_STATUS_NOT_SUPPORTED with algorithm 1 of 1" in msg
    assert _lt.lt_plans() == []  # nothing cached: a later call tries again


def test_lt_relu_bias_epilogue_is_tried_first_and_recorded(fake_lt):
    fake = fake_lt({"relu-bias": (0, 2), "bias": (0, 1), "plain": (0, 1)}, [0])
    kw = dict(bias=0x4000, bias_dtype=ml_dtypes.bfloat16, **_FP8_CALL)
    assert _lt.matmul_tn("float8", 64, 40, 256, 0x1000, 0x2000, 0x3000, relu=True, **kw) == ()
    (plan,) = _lt.lt_plans()
    assert "float8 m=64 n=40 k=256 D=bfloat16 bias=bfloat16 relu setting=relu-bias-epilogue algo=1/2" in repr(plan)
    assert plan.fused == ("bias", "relu") and plan.fused_bias
    assert plan.desc.get_int32(L.MatmulDescAttribute.EPILOGUE) == int(L.Epilogue.RELU_BIAS) == 6
    # the same matmul without the relu is another plan (the key holds the relu)
    assert _lt.matmul_tn("float8", 64, 40, 256, 0x1000, 0x2000, 0x3000, **kw) == ()
    assert sorted(p.setting for p in _lt.lt_plans()) == ["bias-epilogue", "relu-bias-epilogue"]
    assert fake.settings == ["relu-bias", "bias"]


@pytest.mark.parametrize("heuristic, matmul, setting, left", [
    ({"relu-bias": (15, 0)}, {}, "bias-epilogue", ("relu",)),  # the heuristic refuses: relu left to the caller
    ({}, {"relu-bias": [15]}, "bias-epilogue", ("relu",)),  # cublasLtMatmul refuses the relu-bias algorithm
    ({"relu-bias": (7, 0), "bias": (15, 0)}, {}, "bias-after", ("bias", "relu")),
])
def test_lt_relu_settings_fall_back_in_order_leaving_the_rest_to_the_caller(fake_lt, heuristic, matmul, setting,
                                                                           left):
    fake = fake_lt({"relu-bias": (0, 1), "bias": (0, 1), "plain": (0, 1), **heuristic}, matmul)
    got = _lt.matmul_tn("float8", 64, 40, 256, 0x1000, 0x2000, 0x3000, bias=0x4000, bias_dtype=ml_dtypes.bfloat16,
                        relu=True, **_FP8_CALL)
    assert got == left
    (plan,) = _lt.lt_plans()
    assert f"relu setting={setting} " in repr(plan)
    assert fake.settings[0] == "relu-bias"


def test_lt_relu_without_bias_tries_the_relu_epilogue_then_plain(fake_lt):
    fake = fake_lt({"relu": (15, 0), "plain": (0, 1)}, [0])
    assert _lt.matmul_tn("float8", 64, 40, 256, 0x1000, 0x2000, 0x3000, relu=True, **_FP8_CALL) == ("relu",)
    assert "D=bfloat16 relu setting=plain algo=1/1" in repr(_lt.lt_plans()[0])
    assert fake.settings == ["relu", "plain"]
    fake_lt({"relu": (0, 1), "plain": (0, 1)}, [0])
    assert _lt.matmul_tn("float8", 64, 40, 256, 0x1000, 0x2000, 0x3000, relu=True, **_FP8_CALL) == ()
    assert "setting=relu-epilogue" in repr(_lt.lt_plans()[0])


def test_lt_relu_refused_everywhere_lists_every_setting(fake_lt):
    fake_lt({"relu-bias": (15, 0), "bias": (7, 0), "plain": (0, 0)}, [0])
    with pytest.raises(_lt.LtNotSupportedError) as info:
        _lt.matmul_tn("float8", 64, 40, 256, 0x1000, 0x2000, 0x3000, bias=0x4000, bias_dtype=ml_dtypes.bfloat16,
                      relu=True, **_FP8_CALL)
    tried = info.value.context["tried"]
    assert tried.index("relu-bias-epilogue: cublasLtMatmulAlgoGetHeuristic CUBLAS_STATUS_NOT_SUPPORTED") \
        < tried.index("bias-epilogue: cublasLtMatmulAlgoGetHeuristic CUBLAS_STATUS_INVALID_VALUE") \
        < tried.index("bias-after: cublasLtMatmulAlgoGetHeuristic no algorithm")
    assert info.value.context["relu"] is True


def test_lt_relu_is_refused_for_int8_and_must_be_a_bool(fake_lt):
    fake = fake_lt({"plain": (0, 1)}, [0])
    with pytest.raises(ValueError, match="relu epilogue is for float8 only"):
        _lt.matmul_tn("int8", 64, 40, 256, 0x1000, 0x2000, 0x3000, d_dtype=np.int32, stream=_STREAM, workspace=0,
                      workspace_bytes=0, relu=True)
    with pytest.raises(TypeError, match="relu must be a bool"):
        _lt.matmul_tn("float8", 64, 40, 256, 0x1000, 0x2000, 0x3000, relu="relu", **_FP8_CALL)
    assert fake.settings == [] and fake.calls == []


def test_lt_other_failures_are_errors_not_refusals(fake_lt):
    fake_lt({"plain": (0, 1)}, [13])  # CUBLAS_STATUS_EXECUTION_FAILED
    with pytest.raises(CublasError, match="cublasLtMatmul") as info:
        _lt.matmul_tn("float8", 64, 40, 256, 0x1000, 0x2000, 0x3000, **_FP8_CALL)
    assert not isinstance(info.value, _lt.LtNotSupportedError)


def test_lt_shape_rules_are_checked_before_any_call():
    assert _lt._alignment(0x1000) == 256 and _lt._alignment(0x1010) == 16 and _lt._alignment(0x1004) == 4
    with pytest.raises(ValueError, match="m=40 .*multiple of 16"):  # FP8: out features % 16
        _lt.check_tn_alignment("float8", 40, 7, 64, np.float32, {})
    with pytest.raises(ValueError, match="B at 0x1008 is not 16-byte aligned"):
        _lt.check_tn_alignment("float8", 64, 7, 64, np.float32, {"A": 0x1000, "B": 0x1008})
    _lt.check_tn_alignment("float8", 64, 37, 64, np.float32, {"A": 0x1000, "B": 0x1010})  # rows need not align
    assert _lt.tn_supported("float8", 4096, 4096, np.float16, (9, 0))
    assert _lt.tn_supported("float8", 128, 784, np.float32, (9, 0))
    assert not _lt.tn_supported("float8", 40, 64, np.float32, (9, 0))  # int8 would take it (40 * 4 % 16 == 0)
    assert _lt.tn_supported("int8", 40, 64, np.int32, (9, 0))
    assert not _lt.tn_supported("float8", 128, 784, np.float32, (8, 6))


def test_lt_cached_plan_launches_with_its_own_callers_pointers_under_threads(fake_lt, monkeypatch):
    # A cached plan's descriptor carries the scale and bias pointers of the call: without the plan's lock a
    # second thread could overwrite them between the first thread's set and its launch.
    fake_lt({"bias": (0, 1), "plain": (0, 1)}, [0])
    kw = dict(bias=0x4000, bias_dtype=ml_dtypes.bfloat16, **_FP8_CALL)
    _lt.matmul_tn("float8", 64, 40, 256, 0x1000, 0x2000, 0x3000, **kw)  # makes and caches the plan
    seen = []

    def run(handle, plan, algo, kind, a, b, d, workspace, workspace_bytes, stream):
        time.sleep(0.002)  # lets the other thread run between the pointer sets and the launch
        got = (plan.desc.get_pointer(L.MatmulDescAttribute.A_SCALE_POINTER),
               plan.desc.get_pointer(L.MatmulDescAttribute.B_SCALE_POINTER),
               plan.desc.get_pointer(L.MatmulDescAttribute.BIAS_POINTER))
        seen.append((a, got))
        return 0

    monkeypatch.setattr(_lt, "_run", run)

    def caller(base):
        for _ in range(20):
            _lt.matmul_tn("float8", 64, 40, 256, base, 0x2000, 0x3000, d_dtype=ml_dtypes.bfloat16, stream=_STREAM,
                          workspace=0, workspace_bytes=0, a_scale=base + 0x100, b_scale=base + 0x200,
                          bias=base + 0x300, bias_dtype=ml_dtypes.bfloat16)

    threads = [threading.Thread(target=caller, args=(base,)) for base in (0x10000, 0x20000)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(seen) == 40
    for a, got in seen:
        assert got == (a + 0x100, a + 0x200, a + 0x300)


@pytest.mark.parametrize("change, error, message", [
    (dict(m=64.0), TypeError, "matmul_tn: m must be an int, got float 64.0"),
    (dict(k=True), TypeError, "matmul_tn: k must be an int, got bool True"),
    (dict(d_dtype="nope"), TypeError, "matmul_tn: d_dtype: 'nope' is not a dtype"),
    (dict(a_scale=0), ValueError, r"a_scale and b_scale must be device pointers .* a_scale=0x0, b_scale=0x7100"),
    (dict(bias=0x4000), ValueError, "bias_dtype .* is required when a bias is given"),
    (dict(bias=0x4000, bias_dtype=np.float64), ValueError, "bias_dtype must be float32, float16 or bfloat16 .* "
                                                            "got float64"),
    (dict(bias=0x4000, bias_dtype=np.int8), ValueError, "got int8"),
])
def test_lt_bad_arguments_are_named_before_any_cublaslt_call(fake_lt, change, error, message):
    fake = fake_lt({"plain": (0, 1), "bias": (0, 1)}, [0])
    args = dict(m=64, n=40, k=256, **_FP8_CALL)
    args.update(change)
    m, n, k = args.pop("m"), args.pop("n"), args.pop("k")
    with pytest.raises(error, match=message):
        _lt.matmul_tn("float8", m, n, k, 0x1000, 0x2000, 0x3000, **args)
    assert fake.settings == [] and fake.calls == [] and _lt.lt_plans() == []


def test_dequantize_weight_spells_dtypes_through_the_one_normaliser_and_names_bad_ones():
    rng = np.random.default_rng(3)
    w = rng.standard_normal((4, 6)).astype(np.float32)
    q, s = Q.abs_max_quantize(w, axis=1)
    got = kernels.dequantize_weight(q, s.reshape(-1), mode="int8", dtype="bf16")  # ml_dtypes' bfloat16, as everywhere
    assert got.dtype == ml_dtypes.bfloat16
    np.testing.assert_allclose(got.astype(np.float32), w, atol=np.abs(w).max() / 127 + 1e-2)
    with pytest.raises(TypeError, match="dequantize_weight: dtype: 'nope' is not a dtype"):
        kernels.dequantize_weight(q, s.reshape(-1), mode="int8", dtype="nope")
    packed = Q.pack_int4(np.zeros((4, 2), np.int8), axis=1)[0]
    with pytest.raises(ValueError, match="in_features must be a positive int, got True"):
        kernels.dequantize_weight(packed, np.ones((4, 1), np.float32), mode="int4", dtype=np.float32, in_features=True,
                              group_size=2)
