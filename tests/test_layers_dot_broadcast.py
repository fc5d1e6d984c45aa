"""``layers.Dot`` / ``layers.dot`` and the merge layers' Keras 3 broadcasting, on the NumPy backend: outputs and
output shapes against real Keras 3 (its NumPy backend, one subprocess), gradients against float64 finite
differences, configs and the errors on bad input."""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import pytest

import dnnbind as keras
from dnnbind import layers, mixed_precision, ops
from dnnbind.autodiff import GradientTape
from testutil import numerical_grad, random, rel_error

pytestmark = pytest.mark.usefixtures("cpu")

#: (label, kwargs of Dot, shape of input 0, shape of input 1), batch axis included
DOT_CASES = [
    ("vec_axes1", {"axes": 1}, (3, 6), (3, 6)),
    ("vec_neg", {"axes": -1}, (3, 6), (3, 6)),
    ("mat_2_1", {"axes": (2, 1)}, (2, 5, 3), (2, 3, 3)),
    ("mat_1_2", {"axes": (1, 2)}, (2, 3, 5), (2, 10, 3)),
    ("vec_mat", {"axes": (1, 2)}, (2, 4), (2, 3, 4)),
    ("mat_vec", {"axes": (2, 1)}, (2, 3, 4), (2, 4)),
    ("rank4", {"axes": (3, 1)}, (2, 2, 3, 4), (2, 4, 5)),
    ("neg_pair", {"axes": [-1, -2]}, (2, 3, 4), (2, 4, 2)),
    ("normalize", {"axes": 1, "normalize": True}, (3, 5), (3, 5)),
    ("normalize3", {"axes": (2, 2), "normalize": True}, (2, 3, 4), (2, 5, 4)),
]

#: (label, merge class, shapes), batch axis included: size-1 axes and lower ranks broadcast
MERGE_CASES = [
    ("mul_col", "Multiply", [(3, 1), (3, 6)]),
    ("add_rank", "Add", [(2, 3), (2, 4, 3)]),
    ("sub_both", "Subtract", [(2, 4, 1), (2, 1, 5)]),
    ("avg_three", "Average", [(2, 1, 3), (2, 4, 3), (2, 4, 1)]),
    ("max_col", "Maximum", [(3, 4), (3, 1)]),
    ("min_rank", "Minimum", [(2, 5), (2, 3, 5)]),
    ("mul_three", "Multiply", [(2, 3, 1), (2, 1, 4), (2, 3, 4)]),
]

# Keras's NumPy backend (a quick start) gives the outputs and shapes; the gradients are checked against float64
# finite differences of those same outputs below
_SCRIPT = r"""
import json, sys
import numpy as np
import keras
work = sys.argv[1]
cases = json.load(open(f"{work}/cases.json"))
data = dict(np.load(f"{work}/in.npz"))
out = {}
for label, kwargs, s0, s1 in cases["dot"]:
    layer = keras.layers.Dot(**kwargs)
    out[f"{label}/shape"] = np.array([-1 if d is None else d for d in layer.compute_output_shape([tuple(s0), tuple(s1)])])
    out[f"{label}/y"] = np.asarray(layer([data[f"{label}/x0"], data[f"{label}/x1"]]))
for label, cls, shapes in cases["merge"]:
    layer = getattr(keras.layers, cls)()
    out[f"{label}/shape"] = np.array([-1 if d is None else d for d in layer.compute_output_shape([tuple(s) for s in shapes])])
    out[f"{label}/y"] = np.asarray(layer([data[f"{label}/x{i}"] for i in range(len(shapes))]))
np.savez(f"{work}/out.npz", **out)
"""


def _inputs() -> dict:
    rng = np.random.default_rng(5)
    arrays = {}
    for label, kwargs, s0, s1 in DOT_CASES:
        arrays[f"{label}/x0"] = rng.normal(size=s0).astype(np.float32)
        arrays[f"{label}/x1"] = rng.normal(size=s1).astype(np.float32)
    for label, cls, shapes in MERGE_CASES:
        for i, s in enumerate(shapes):
            arrays[f"{label}/x{i}"] = rng.normal(size=s).astype(np.float32)
    return arrays


def _output_shape(layer, shapes):
    return tuple(layer.compute_output_shape([(None, *s[1:]) for s in shapes]))[1:]


@functools.lru_cache(maxsize=1)
def _keras_results() -> "dict | str":
    if importlib.util.find_spec("keras") is None:
        return "real Keras 3 is not installed (test extra)"
    work = tempfile.mkdtemp(prefix="dnnbind_dot_")
    arrays = _inputs()
    np.savez(os.path.join(work, "in.npz"), **arrays)
    with open(os.path.join(work, "cases.json"), "w") as f:
        json.dump({"dot": [[lb, kw, list(a), list(b)] for lb, kw, a, b in DOT_CASES],
                   "merge": [[lb, cls, [list(s) for s in shapes]] for lb, cls, shapes in MERGE_CASES]}, f)
    env = {k: v for k, v in os.environ.items() if k != "KERAS_HOME"}
    env.update(KERAS_HOME=os.path.join(work, "kh"), KERAS_BACKEND="numpy")
    proc = subprocess.run([sys.executable, "-c", _SCRIPT, work], capture_output=True, text=True, env=env, timeout=300)
    if proc.returncode != 0:
        raise AssertionError(f"the Keras side failed:\n{proc.stderr[-4000:]}")
    return {**dict(np.load(os.path.join(work, "out.npz"))), **{f"in:{k}": v for k, v in arrays.items()}}


@pytest.mark.parametrize("label,kwargs,s0,s1", DOT_CASES, ids=[c[0] for c in DOT_CASES])
def test_dot_matches_keras(label, kwargs, s0, s1):
    theirs = _keras_results()
    if isinstance(theirs, str):
        pytest.skip(theirs)
    layer = layers.Dot(**kwargs)
    assert _output_shape(layer, [s0, s1]) == tuple(theirs[f"{label}/shape"])[1:]
    y = np.asarray(layer([theirs[f"in:{label}/x0"], theirs[f"in:{label}/x1"]]))
    np.testing.assert_allclose(y, theirs[f"{label}/y"], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("label,cls,shapes", MERGE_CASES, ids=[c[0] for c in MERGE_CASES])
def test_merge_broadcasting_matches_keras(label, cls, shapes):
    theirs = _keras_results()
    if isinstance(theirs, str):
        pytest.skip(theirs)
    layer = getattr(layers, cls)()
    assert _output_shape(layer, shapes) == tuple(theirs[f"{label}/shape"])[1:]
    y = np.asarray(layer([theirs[f"in:{label}/x{i}"] for i in range(len(shapes))]))
    np.testing.assert_allclose(y, theirs[f"{label}/y"], rtol=1e-6, atol=1e-6)


def test_dot_numpy_reference():
    rng = np.random.default_rng(1)
    a, b = rng.normal(size=(2, 3, 5)), rng.normal(size=(2, 10, 3))
    np.testing.assert_allclose(layers.Dot(axes=(1, 2))([a, b]), np.einsum("bij,bki->bjk", a, b), rtol=1e-5)
    u, v = rng.normal(size=(4, 6)), rng.normal(size=(4, 6))
    cos = np.sum(u * v, 1) / np.linalg.norm(u, axis=1) / np.linalg.norm(v, axis=1)
    np.testing.assert_allclose(layers.dot([u, v], axes=1, normalize=True), cos[:, None], rtol=1e-5)
    # the PointNet use: points (b, n, k) times a transform (b, k, k)
    p, t = rng.normal(size=(2, 7, 3)), rng.normal(size=(2, 3, 3))
    np.testing.assert_allclose(layers.Dot(axes=(2, 1))([p, t]), p @ t, rtol=1e-5)


def _f64_grads(fn, xs, g):
    ts = [ops.convert_to_tensor(x) for x in xs]
    with GradientTape() as tape:
        for t in ts:
            tape.watch(t)
        total = ops.sum(ops.multiply(fn(ts), g))
    return [np.asarray(d) for d in tape.gradient(total, ts)]


@pytest.mark.parametrize("label,kwargs,s0,s1", DOT_CASES, ids=[c[0] for c in DOT_CASES])
def test_dot_gradient_finite_differences(label, kwargs, s0, s1):
    rng = np.random.default_rng(2)
    layer = layers.Dot(**kwargs)
    layer.dtype_policy = mixed_precision.Policy("float64")
    xs = [rng.normal(size=s0), rng.normal(size=s1)]
    g = rng.normal(size=(s0[0],) + _output_shape(layer, [s0, s1]))
    grads = _f64_grads(layer, xs, g)
    for i, x in enumerate(xs):
        numeric = numerical_grad(lambda: float(np.sum(np.asarray(layer(xs)) * g)), x)
        assert rel_error(grads[i], numeric) < 1e-7, f"input {i}"


@pytest.mark.parametrize("label,cls,shapes", MERGE_CASES, ids=[c[0] for c in MERGE_CASES])
def test_merge_broadcast_backward_finite_differences(label, cls, shapes):
    rng = np.random.default_rng(3)
    layer = getattr(layers, cls)()
    layer.dtype_policy = mixed_precision.Policy("float64")
    xs = [random(rng, s) for s in shapes]
    y = layer.forward(xs, training=True)
    w = random(rng, y.shape)
    grads = layer.backward(w)
    assert [g.shape for g in grads] == [tuple(s) for s in shapes]
    assert len({id(g) for g in grads}) == len(grads)  # distinct arrays (callers accumulate in place)
    for i, x in enumerate(xs):
        numeric = numerical_grad(lambda: float(np.sum(layer.forward(xs, training=False) * w)), x)
        assert rel_error(grads[i], numeric) < 1e-7, f"{label}: input {i}"


def test_broadcast_merge_in_a_functional_model_trains():
    """The attention-MIL pattern: a (batch, 1) weight times a (batch, 64) embedding, trained end to end."""
    keras.utils.set_random_seed(0)
    a, b = keras.Input((1,)), keras.Input((8,))
    out = layers.Dense(1)(layers.multiply([layers.Dense(1)(a), b]))
    assert out.shape == (None, 1)
    model = keras.Model([a, b], out)
    model.compile(optimizer="adam", loss="mse")
    rng = np.random.default_rng(0)
    xa, xb = rng.normal(size=(32, 1)).astype("float32"), rng.normal(size=(32, 8)).astype("float32")
    y = (xa * xb).sum(1, keepdims=True)
    hist = model.fit([xa, xb], y, epochs=5, batch_size=8, verbose=0).history["loss"]
    assert hist[-1] < hist[0]


def test_dot_config_and_errors():
    layer = layers.Dot(axes=(2, 1), normalize=True, name="d")
    config = layer.get_config()
    assert config["axes"] == (2, 1) and config["normalize"] is True and config["name"] == "d"
    again = layers.Dot.from_config(config)
    assert again.get_config() == config
    assert layers.deserialize({"class_name": "Dot", "config": config}).axes == (2, 1)
    with pytest.raises(TypeError, match="invalid type for argument `axes`"):
        layers.Dot(axes="1")
    with pytest.raises(ValueError, match="should contain two elements"):
        layers.Dot(axes=(1, 2, 3))
    with pytest.raises(ValueError, match="list elements should be integers"):
        layers.Dot(axes=(1, 1.5))
    with pytest.raises(ValueError, match=r"incompatible input shapes: axis values 3 \(at axis 1\) != 4"):
        layers.Dot(axes=1)([np.ones((2, 3)), np.ones((2, 4))])
    with pytest.raises(ValueError, match="over axis 0"):
        layers.Dot(axes=0)([np.ones((2, 3)), np.ones((2, 3))])
    with pytest.raises(ValueError, match="list of 2 inputs"):
        layers.Dot(axes=1)([keras.Input((3,))] * 3)
    with pytest.raises(ValueError, match="out of range"):
        layers.Dot(axes=(3, 1))([np.ones((2, 3)), np.ones((2, 3))])
    with pytest.raises(ValueError, match="rank < 2"):
        layers.Dot(axes=-1)([np.ones((3,)), np.ones((3,))])


def test_merge_broadcast_errors_before_any_kernel():
    with pytest.raises(ValueError, match=r"Multiply 'm': inputs have incompatible shapes: input 0 is \(batch, 3\) "
                                         r"and input 1 \(batch, 2\)"):
        layers.Multiply(name="m")([np.ones((2, 3)), np.ones((2, 2))])
    with pytest.raises(ValueError, match="different batch sizes"):
        layers.Add()([np.ones((2, 1)), np.ones((3, 4))])
    with pytest.raises(ValueError, match="incompatible shapes"):
        layers.add([keras.Input((4, 3)), keras.Input((2, 3))])
