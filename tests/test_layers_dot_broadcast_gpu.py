"""``layers.Dot`` and the merge layers' broadcasting on CUDA: forward and input gradients against the float64
NumPy layers, and a functional model using both (the attention-MIL and PointNet patterns) trained with
the default (graph-captured) CUDA steps matching the NumPy backend."""

from __future__ import annotations

import numpy as np
import pytest

import dnnbind
import dnnbind as keras
from dnnbind import layers, mixed_precision, ops
from dnnbind.autodiff import GradientTape
from dnnbind.kernels import config
from gpu_errlog import check, dev
from testutil import random

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def _reset():
    yield
    dnnbind.set_default_device(None)
    mixed_precision.set_global_policy("float32")


MERGES = [("Multiply", [(3, 1), (3, 6)]), ("Add", [(2, 3), (2, 4, 3)]), ("Subtract", [(2, 4, 1), (2, 1, 5)]),
          ("Average", [(2, 1, 3), (2, 4, 3), (2, 4, 1)]), ("Maximum", [(3, 4), (3, 1)]),
          ("Minimum", [(2, 5), (2, 3, 5)])]


@pytest.mark.parametrize("cls, shapes", MERGES, ids=[m[0] for m in MERGES])
def test_broadcast_merge_on_cuda_matches_numpy(rng, cls, shapes):
    xs = [random(rng, s) for s in shapes]
    dnnbind.set_default_device("cpu")
    ref = getattr(layers, cls)()
    ref.dtype_policy = mixed_precision.Policy("float64")
    y_ref = ref.forward(xs, training=True)
    dy = random(rng, y_ref.shape)
    grads_ref = ref.backward(dy)
    dnnbind.set_default_device("cuda")
    layer = getattr(layers, cls)()
    y = layer.forward([dev(x, np.float32) for x in xs], training=True)
    grads = layer.backward(dev(dy, np.float32))
    check(f"layer.{cls}.broadcast.forward", "float32", y, y_ref, cls)
    for i, (g, g_ref) in enumerate(zip(grads, grads_ref)):
        assert tuple(g.shape) == shapes[i]
        check(f"layer.{cls}.broadcast.dx{i}", "float32", g, g_ref, cls)


@pytest.mark.parametrize("kwargs, s0, s1", [({"axes": (2, 1)}, (2, 7, 3), (2, 3, 3)),
                                            ({"axes": 1, "normalize": True}, (4, 6), (4, 6)),
                                            ({"axes": (1, 2)}, (2, 4), (2, 3, 4))])
def test_dot_on_cuda_matches_numpy(rng, kwargs, s0, s1):
    a, b = random(rng, s0), random(rng, s1)

    def run(x0, x1):
        t0, t1 = ops.convert_to_tensor(x0), ops.convert_to_tensor(x1)
        with GradientTape() as tape:
            tape.watch(t0)
            tape.watch(t1)
            y = layers.Dot(**kwargs)([t0, t1])
            total = ops.sum(ops.square(y))
        return y, tape.gradient(total, [t0, t1])

    dnnbind.set_default_device("cpu")
    y_ref, g_ref = run(a, b)
    dnnbind.set_default_device("cuda")
    with config.override(allow_tf32=False):
        y, g = run(dev(a, np.float32), dev(b, np.float32))
    check("layer.Dot.forward", "float32", y.data, np.asarray(y_ref), "dot")
    for i in range(2):
        check(f"layer.Dot.dx{i}", "float32", g[i].data, np.asarray(g_ref[i]), "dot")


def _model():
    a, b = keras.Input((4, 3)), keras.Input((1,))
    t = layers.Reshape((3, 3))(layers.Dense(9)(layers.Flatten()(a)))
    x = layers.Flatten()(layers.Dot(axes=(2, 1))([a, t]))
    x = layers.multiply([layers.Dense(1, activation="sigmoid")(b), x])
    return keras.Model([a, b], layers.Dense(2, activation="softmax")(x))


def test_dot_and_broadcast_merge_model_trains_on_cuda_like_numpy(rng):
    xa = rng.normal(size=(32, 4, 3)).astype(np.float32)
    xb = rng.normal(size=(32, 1)).astype(np.float32)
    y = (xa.sum((1, 2)) > 0).astype(np.int32)
    results = {}
    for device in ("cpu", "cuda"):
        dnnbind.set_default_device(device)
        keras.utils.set_random_seed(0)
        model = _model()
        model.compile(optimizer=keras.optimizers.SGD(0.05), loss="sparse_categorical_crossentropy")
        with config.override(allow_tf32=False):
            hist = model.fit([xa, xb], y, batch_size=8, epochs=2, shuffle=False, verbose=0)
        results[device] = (hist.history["loss"], [np.asarray(w) for w in model.get_weights()])
    np.testing.assert_allclose(results["cuda"][0], results["cpu"][0], rtol=1e-4)
    for w_gpu, w_cpu in zip(results["cuda"][1], results["cpu"][1]):
        np.testing.assert_allclose(w_gpu, w_cpu, rtol=1e-4, atol=1e-5)
