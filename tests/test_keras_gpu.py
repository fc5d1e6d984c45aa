"""The Keras-like API on CUDA: agreement with the NumPy backend, mixed precision, CUDA-graph capture
of a training step, device moves and cross-device saving. Skipped without a usable GPU."""

from __future__ import annotations

import numpy as np
import pytest

import dnnbind
import dnnbind as keras
from dnnbind import layers, mixed_precision, kernels
from testutil import rel_error

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def _reset():
    yield
    dnnbind.set_default_device(None)
    mixed_precision.set_global_policy("float32")


def make_model(device, weights=None, dropout=False, seed=0):
    dnnbind.set_default_device(device)
    init = keras.initializers.GlorotUniform
    model = keras.Sequential([
        keras.Input((8, 8, 3)),
        layers.Conv2D(6, 3, padding="same", activation="relu", kernel_initializer=init(seed)),
        layers.MaxPooling2D(),
        layers.BatchNormalization(),
        layers.Conv2D(8, 3, strides=2, padding="same", kernel_initializer=init(seed + 1)),
        layers.Activation("gelu"),
        layers.GlobalAveragePooling2D(),
        *([layers.Dropout(0.3, seed=1)] if dropout else []),
        layers.Dense(5, activation="softmax", kernel_initializer=init(seed + 2)),
    ])
    if weights is not None:
        model.set_weights(weights)
    return model


def data(n=64, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 8, 8, 3)).astype(np.float32)
    y = rng.integers(0, 5, n)
    return x, y


def test_cuda_matches_numpy_training():
    x, y = data()
    cpu = make_model("cpu")
    w0 = cpu.get_weights()
    gpu = make_model("cuda", w0)
    assert gpu.device.is_cuda and dnnbind.backend.is_device_array(gpu.layers[0].kernel.value)
    with kernels.config.override(allow_tf32=False):
        for m in (cpu, gpu):
            m.compile(keras.optimizers.SGD(0.05, momentum=0.9), "sparse_categorical_crossentropy",
                      metrics=["accuracy"])
        hc = cpu.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0)
        hg = gpu.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0)
        assert np.allclose(hc.history["loss"], hg.history["loss"], rtol=1e-4)
        assert hc.history["accuracy"] == hg.history["accuracy"]
        for a, b in zip(cpu.get_weights(), gpu.get_weights()):
            assert rel_error(b, a) < 1e-4
        pc, pg = cpu.predict(x, verbose=0), gpu.predict(x, verbose=0)
        assert isinstance(pg, np.ndarray) and rel_error(pg, pc) < 1e-4


def test_streamed_batches_match_device_resident(monkeypatch):
    x, y = data()
    a = make_model("cuda")
    b = make_model("cuda", a.get_weights())
    for m in (a, b):
        m.compile(keras.optimizers.Adam(1e-3), "sparse_categorical_crossentropy")
    ha = a.fit(x, y, batch_size=16, epochs=2, verbose=0, seed=3)
    from dnnbind.trainers.data_adapters import ArrayDataAdapter

    # the whole-dataset upload is refused, so the batches are streamed through the prefetcher
    monkeypatch.setattr(ArrayDataAdapter, "_upload_if_small", lambda self: None)
    hb = b.fit(x, y, batch_size=16, epochs=2, verbose=0, seed=3)
    assert np.allclose(ha.history["loss"], hb.history["loss"], rtol=1e-5)
    for wa, wb in zip(a.get_weights(), b.get_weights()):
        assert rel_error(wb, wa) < 1e-5


def test_mixed_bfloat16_trains():
    mixed_precision.set_global_policy("mixed_bfloat16")
    x, y = data(128)
    model = make_model("cuda", dropout=True)
    assert model.layers[0].kernel.value.dtype == np.float32
    model.compile(keras.optimizers.Adam(3e-3), "sparse_categorical_crossentropy", metrics=["accuracy"])
    h = model.fit(x, y, batch_size=32, epochs=6, verbose=0)
    assert np.all(np.isfinite(h.history["loss"])) and h.history["loss"][-1] < h.history["loss"][0]
    assert model.predict(x, verbose=0).dtype == np.float32


def test_mixed_float16_loss_scaling_skips_non_finite_steps():
    mixed_precision.set_global_policy("mixed_float16")
    x, y = data(32)
    model = make_model("cuda")
    model.compile(keras.optimizers.SGD(0.01), "sparse_categorical_crossentropy")
    assert model._loss_scale is not None
    model.train_on_batch(x, y)
    assert float(model._loss_scale.scale.numpy()) == 2.0**15
    before = model.get_weights()
    bad = x.copy()
    bad[0, 0, 0, 0] = 1e35  # finite in float32 (NaN/inf in x are refused), inf in float16
    model.train_on_batch(bad, y)
    assert float(model._loss_scale.scale.numpy()) == 2.0**14
    for a, b in zip(before, model.get_weights()):
        if a.ndim > 1:  # moving statistics may move; trainable kernels must not
            assert np.array_equal(a, b)


def test_graph_captured_step_matches_eager():
    from dnnbind import cuda

    x, y = data(16)
    eager = make_model("cuda")
    graphed = make_model("cuda", eager.get_weights())
    for m in (eager, graphed):
        m.compile(keras.optimizers.SGD(0.05, momentum=0.9), "sparse_categorical_crossentropy",
                  metrics=["accuracy"])
    xd = dnnbind.backend.asarray(x)
    yd = dnnbind.backend.asarray(y.astype(np.int32))
    stream = cuda.Stream()
    cuda.default_stream().synchronize()
    with stream:
        # The warm-up step builds optimizer slots, metric accumulators, algorithm choices and the
        # stream's cuDNN/cuBLAS handles, none of which may be created during capture.
        for m in (eager, graphed):
            m._train_step(xd, yd)
        with cuda.capture(stream) as graph:
            graphed._train_step(xd, yd)
        for _ in range(3):
            graph.launch(stream)
            eager._train_step(xd, yd)
    stream.synchronize()
    for a, b in zip(eager.get_weights(), graphed.get_weights()):
        assert rel_error(b, a) < 1e-5


def test_to_cpu_and_back_and_save_on_gpu_load_on_cpu(tmp_path):
    x, _ = data(8)
    model = make_model("cuda")
    p_gpu = model.predict(x, verbose=0)
    model.to("cpu")
    assert not dnnbind.backend.is_device_array(model.layers[0].kernel.value)
    assert rel_error(model.predict(x, verbose=0), p_gpu) < 1e-4
    model.to("cuda")
    assert dnnbind.backend.is_device_array(model.layers[0].kernel.value)
    assert rel_error(model.predict(x, verbose=0), p_gpu) < 1e-6
    model.compile("adam", "sparse_categorical_crossentropy")
    model.save(tmp_path / "m.dnnbind")
    dnnbind.set_default_device("cpu")
    loaded = keras.load_model(tmp_path / "m.dnnbind")
    assert not loaded.device.is_cuda
    assert rel_error(loaded.predict(x, verbose=0), p_gpu) < 1e-4
