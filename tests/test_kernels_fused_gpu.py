"""The fused conv + bias + activation graph (kernels/_cuda/fused.py) against the unfused path and NumPy,
its per-shape choice, its capture into a CUDA graph and a model trained with it on and off."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import dnnbind
import dnnbind as keras
from dnnbind import cuda, layers, mixed_precision, kernels
from dnnbind.kernels import config
from dnnbind.kernels._cuda import fused
from gpu_errlog import BF16, PRECISIONS, check, dev, host, poisoned, quantize
from testutil import random, rel_error

pytestmark = pytest.mark.gpu

# (x (N, H, W, C), filters, kernel, stride, padding): channels 1/3/32/64; 3x3 same, 2x2 valid, stride 2
# (same on an even size: asymmetric padding, done by pad2d before the graph)
CASES = [
    pytest.param((2, 12, 12, 32), 64, 3, 1, "same", id="3x3-same-c32"),
    pytest.param((2, 10, 10, 64), 32, 2, 1, "valid", id="2x2-valid-c64"),
    pytest.param((2, 10, 10, 32), 32, 3, 2, "same", id="3x3-s2-same-asym-c32"),
    pytest.param((4, 14, 14, 64), 64, 3, 2, "valid", id="3x3-s2-valid-c64"),
    pytest.param((2, 11, 11, 3), 32, 3, 1, "same", id="3x3-same-c3"),
    pytest.param((2, 8, 8, 1), 32, 3, 1, "valid", id="3x3-valid-c1"),
]


def _data(rng, x_shape, filters, kernel, dtype):
    x = quantize(random(rng, x_shape), dtype)
    w = quantize(random(rng, (filters, kernel, kernel, x_shape[3])), dtype)
    b = quantize(random(rng, (filters,)), dtype)
    return x, w, b


def _run(x, w, b, dtype, **kw):
    ref_shape = kernels.conv2d_output_shape(x.shape, w.shape, stride=kw["stride"], padding=kw["padding"], layout="NHWC")
    return kernels.conv2d_bias_activation_forward(dev(x, dtype), dev(w, dtype), dev(b, dtype),
                                              out=poisoned(ref_shape, dtype), layout="NHWC", **kw)


@pytest.mark.parametrize("label, dtype, overrides", PRECISIONS)
@pytest.mark.parametrize("activation", ["relu", "linear"])
@pytest.mark.parametrize("x_shape, filters, kernel, stride, padding", CASES)
def test_fused_matches_unfused_and_numpy(rng, label, dtype, overrides, activation, x_shape, filters, kernel, stride,
                                         padding):
    """Whatever path each shape takes (graph, or the legacy fallback where cuDNN refuses the graph: C = 1
    or 3), fused_graphs on and off both match the float64 reference and each other."""
    x, w, b = _data(rng, x_shape, filters, kernel, dtype)
    kw = dict(activation=activation, stride=stride, padding=padding)
    case = f"{activation} x{x_shape} k{kernel} s{stride} {padding}"
    ref = kernels.conv2d_bias_activation_forward(x, w, b, layout="NHWC", **kw)
    with config.override(**overrides):
        on = _run(x, w, b, dtype, **kw)
        with config.override(fused_graphs=False):
            off = _run(x, w, b, dtype, **kw)
    check("conv2d_bias_activation_forward[fused_graphs]", label, on, ref, case)
    check("conv2d_bias_activation_forward[legacy]", label, off, ref, case)
    check("conv2d_bias_activation_forward[fused vs legacy]", label, on, host(off), case)


def _choice_for(x_shape, dtype, benchmark=False):
    hits = [(k, c) for k, c in fused.cache_info().items()
            if k.x_shape == x_shape and k.dtype == dtype and k.benchmark == benchmark]
    assert len(hits) == 1, hits
    return hits[0]


@pytest.mark.parametrize("dtype", [BF16, np.dtype(np.float16)], ids=["bf16", "fp16"])
def test_graph_path_is_taken_for_nhwc_3x3_c32(rng, dtype):
    """No silent fallback: bf16/fp16 NHWC 3x3 C=32 runs the graph plan (cuDNN 9.19 on H200 builds it)."""
    x, w, b = _data(rng, (8, 16, 16, 32), 32, 3, dtype)
    kw = dict(activation="relu", stride=1, padding="same")
    before = fused.stats()["graph"]
    with config.override(benchmark=False):
        y = _run(x, w, b, dtype, **kw)
        y2 = _run(x, w, b, dtype, **kw)
    key, choice = _choice_for((8, 16, 16, 32), dtype)
    assert choice.path == "graph" and choice.source == "heuristic", choice
    assert key.activation == "relu" and key.pad == (1, 1)
    assert fused.stats()["graph"] - before == 2
    label = "bfloat16" if dtype == BF16 else "float16"
    check("conv2d_bias_activation_forward[graph]", label, y, kernels.conv2d_bias_activation_forward(x, w, b, layout="NHWC",
                                                                                                  **kw))
    assert np.array_equal(host(y), host(y2))


def test_benchmark_choice_is_made_once_per_shape(rng):
    dtype = BF16
    kw = dict(activation="relu", stride=1, padding="same")
    with config.override(benchmark=True):
        for shape in ((4, 12, 12, 32), (6, 12, 12, 32)):
            x, w, b = _data(rng, shape, 64, 3, dtype)
            ref = kernels.conv2d_bias_activation_forward(x, w, b, layout="NHWC", **kw)
            decided = fused.stats()["decided"]
            for _ in range(3):
                check("conv2d_bias_activation_forward[benchmark]", "bfloat16", _run(x, w, b, dtype, **kw), ref)
            assert fused.stats()["decided"] - decided == 1
            key, choice = _choice_for(shape, dtype, benchmark=True)
            assert choice.source == "benchmark" and choice.graph_ms > 0 and choice.legacy_ms > 0, choice
            # the decision rule: a plan within GRAPH_MARGIN (2%) of the legacy time is a tie the plan wins
            assert choice.path == ("graph" if choice.graph_ms <= choice.legacy_ms * fused.GRAPH_MARGIN else "legacy")


def test_plan_execution_is_captured_and_replays_with_new_inputs(rng):
    dtype = BF16
    x, w, b = _data(rng, (4, 12, 12, 32), 32, 3, dtype)
    x2 = quantize(random(rng, x.shape), dtype)
    kw = dict(activation="relu", stride=1, padding="same", layout="NHWC")
    stream = cuda.Stream()
    xd, wd, bd = (cuda.to_device(np.asarray(a).astype(dtype), stream=stream) for a in (x, w, b))
    y = cuda.empty((4, 12, 12, 32), dtype, stream=stream).fill_bytes(0xFF, stream=stream)
    kernels.conv2d_bias_activation_forward(xd, wd, bd, out=y, stream=stream, **kw)  # eager: builds and decides
    stream.synchronize()
    before = fused.stats()
    with cuda.capture(stream) as graph:
        kernels.conv2d_bias_activation_forward(xd, wd, bd, out=y, stream=stream, **kw)
    after = fused.stats()
    assert after["graph"] - before["graph"] == 1 and after["undecided_in_capture"] == before["undecided_in_capture"]
    assert not graph.outstanding_allocations
    xd.copy_from_host(np.asarray(x2).astype(dtype), stream=stream)
    y.fill_bytes(0xFF, stream=stream)  # poison again: the replay must write every element
    graph.launch(stream)
    stream.synchronize()
    check("conv2d_bias_activation_forward[captured graph]", "bfloat16", y,
          kernels.conv2d_bias_activation_forward(x2, w, b, **kw))
    graph.close()


@pytest.fixture
def _bf16_policy():
    mixed_precision.set_global_policy("mixed_bfloat16")
    yield
    mixed_precision.set_global_policy("float32")
    dnnbind.set_default_device(None)


def _mnist_like(weights=None):
    dnnbind.set_default_device("cuda")
    init = keras.initializers.GlorotUniform
    model = keras.Sequential([
        keras.Input((16, 16, 1)),
        layers.Conv2D(32, 3, padding="same", activation="relu", kernel_initializer=init(1)),   # C=1
        layers.Conv2D(32, 3, padding="same", activation="relu", kernel_initializer=init(2)),   # C=32: graph
        layers.MaxPooling2D(),
        layers.Conv2D(64, 3, padding="valid", activation="relu", kernel_initializer=init(3)),  # C=32 -> 64
        layers.Flatten(),
        layers.Dense(10, activation="softmax", kernel_initializer=init(4)),
    ])
    if weights is not None:
        model.set_weights(weights)
    model.compile(keras.optimizers.SGD(0.05), "sparse_categorical_crossentropy", jit_compile="auto")
    return model


def test_mnist_like_training_same_with_fused_graphs_on_and_off(_bf16_policy):
    """Three steps (eager warm-up, capture, replay) under mixed_bfloat16: the captured step runs the plans,
    and the fused run is no further from a float32 run than the unfused one (bf16 rounding differs between
    them: the fused graph rounds once after conv + bias + relu, the unfused path after each)."""
    rng = np.random.default_rng(0)
    x = rng.uniform(0, 1, (96, 16, 16, 1)).astype(np.float32)
    y = rng.integers(0, 10, 96)
    w0 = _mnist_like().get_weights()
    runs = {}
    for on in (True, False):
        with config.override(fused_graphs=on), warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            model = _mnist_like(w0)
            before = fused.stats()["graph"]
            hist = model.fit(x, y, batch_size=32, epochs=1, shuffle=False, verbose=0)
            graph_calls = fused.stats()["graph"] - before
        assert not [m for m in caught if "captur" in str(m.message)], [str(m.message) for m in caught]
        stats = model._step_graphs.stats
        assert stats["captures"] == 1 and stats["replays"] == 1 and stats["failures"] == 0, stats
        # on: the C=32 "same" convolution takes the graph in the warm-up and in the capture (the replay runs
        # no Python), as may the others; off: never
        assert graph_calls >= 2 if on else graph_calls == 0, graph_calls
        if on:
            assert _choice_for((32, 16, 16, 32), BF16)[1].path == "graph"
        runs[on] = (hist.history["loss"], model.get_weights())
    mixed_precision.set_global_policy("float32")
    with config.override(fused_graphs=False, allow_tf32=False):
        model = _mnist_like(w0)
        model.fit(x, y, batch_size=32, epochs=1, shuffle=False, verbose=0)
        w_ref = model.get_weights()
    (loss_on, w_on), (loss_off, w_off) = runs[True], runs[False]
    assert np.allclose(loss_on, loss_off, rtol=2e-2), (loss_on, loss_off)
    for a, b, ref, start in zip(w_on, w_off, w_ref, w0):
        # the updates (not the weights, dominated by their start): fused within 1.5x (+ a bf16 ulp's worth)
        # of the unfused run's distance to float32
        err_on, err_off = rel_error(a - start, ref - start), rel_error(b - start, ref - start)
        assert err_on <= 1.5 * err_off + 1e-2, (err_on, err_off)
        assert err_on < 0.5, err_on  # sanity: bf16 over three SGD steps measured up to 0.21 (a bias)
