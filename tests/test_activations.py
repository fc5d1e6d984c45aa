"""``dnnbind.activations`` (keras.activations): every name's values against real Keras 3 (NumPy backend),
its tape gradient against float64 finite differences, the composites behind the op-backed ones, and
``get`` / ``serialize`` / ``deserialize`` against Keras's."""

from __future__ import annotations

import math

import numpy as np
import pytest

import dnnbind
from dnnbind import activations, ops
from dnnbind.autodiff import GradientTape, Variable
from dnnbind.ops import _core
from keras_aux import ACTIVATION_CASES, activation_case_input, activation_input, reference
from testutil import numerical_grad

KERAS_NAMES = ("celu", "deserialize", "elu", "exponential", "gelu", "get", "glu", "hard_shrink", "hard_sigmoid",
               "hard_silu", "hard_swish", "hard_tanh", "leaky_relu", "linear", "log_sigmoid", "log_softmax", "mish",
               "relu", "relu6", "selu", "serialize", "sigmoid", "silu", "soft_shrink", "softmax", "softplus",
               "softsign", "sparse_plus", "sparse_sigmoid", "sparsemax", "squareplus", "swish", "tanh", "tanh_shrink",
               "threshold")  # keras.activations in Keras 3.15.1 (tools/keras_api_names.py activations)


@pytest.fixture(autouse=True)
def _cpu(cpu):
    yield


def _kwargs(kwargs: dict) -> dict:
    return {k: tuple(v) if isinstance(v, list) else v for k, v in kwargs.items()}


def _implementations(name: str) -> list:
    fn = activations.get(name)
    return [fn] + ([fn.composite] if hasattr(fn, "composite") else [])


def test_every_keras_activation_name_exists():
    missing = [n for n in KERAS_NAMES if not hasattr(activations, n)]
    assert not missing, f"keras.activations names missing from dnnbind.activations: {missing}"
    assert dnnbind.activations is activations
    assert activations.swish is activations.silu and activations.hard_swish is activations.hard_silu


@pytest.mark.parametrize("label,name,kwargs", ACTIVATION_CASES, ids=[c[0] for c in ACTIVATION_CASES])
def test_values_match_real_keras(label, name, kwargs):
    status, _, values = reference()
    assert status[f"act/{label}"] == "ok", status[f"act/{label}"]
    want = values[f"act/{label}"]
    x = activation_case_input(name, kwargs, "float32")
    for fn in _implementations(name):
        got = fn(x, **_kwargs(kwargs))
        got = np.asarray(got)
        assert got.shape == want.shape and got.dtype == np.float32, (label, got.shape, got.dtype)
        np.testing.assert_allclose(got, want, rtol=2e-6, atol=2e-6, err_msg=f"{label} ({fn.__qualname__})")


@pytest.mark.parametrize("label,name,kwargs", ACTIVATION_CASES, ids=[c[0] for c in ACTIVATION_CASES])
def test_gradient_matches_finite_differences(label, name, kwargs):
    x = activation_case_input(name, kwargs, "float64")
    kwargs = _kwargs(kwargs)
    r = np.random.default_rng(5).normal(size=np.shape(activations.get(name)(x, **kwargs)))
    for fn in _implementations(name):
        t = ops.convert_to_tensor(x)
        with GradientTape() as tape:
            tape.watch(t)
            loss = ops.sum(ops.multiply(fn(t, **kwargs), r))
        (grad,) = tape.gradient(loss, [t])
        assert str(ops.dtype(fn(t, **kwargs))) == "float64"
        numeric = numerical_grad(lambda: float(np.sum(np.asarray(fn(x, **kwargs)) * r)), x)
        got = np.zeros_like(x) if grad is None else np.asarray(grad, dtype=np.float64)
        np.testing.assert_allclose(got, numeric, rtol=1e-6, atol=1e-7, err_msg=f"{label} ({fn.__qualname__})")


def _sparsemax_reference(z: np.ndarray) -> np.ndarray:
    """Martins & Astudillo (2016), Algorithm 1, per row."""
    out = np.empty_like(z)
    for i, row in enumerate(z):
        s = np.sort(row)[::-1]
        cumulative = np.cumsum(s)
        k = np.arange(1, len(s) + 1)
        support = 1 + k * s > cumulative
        kz = k[support][-1]
        tau = (cumulative[kz - 1] - 1) / kz
        out[i] = np.maximum(row - tau, 0)
    return out


def test_sparsemax_is_the_simplex_projection_where_keras_3_15_is_not():
    x = np.array([[0.0, 0.5, 1.0], [0.1, 0.2, 0.3], [2.0, -1.0, 0.5]])
    got = np.asarray(activations.sparsemax(x))
    np.testing.assert_allclose(got, _sparsemax_reference(x), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(got.sum(axis=-1), 1.0, rtol=1e-12)
    np.testing.assert_allclose(got[0], [0.0, 0.25, 0.75], atol=1e-12)  # Keras 3.15.1 gives [0, 0, 0.25]


def test_activations_keep_float_dtypes_and_take_variables():
    x = activation_input("float32")
    for dtype in ("float16", "bfloat16", "float64"):
        y = activations.gelu(ops.cast(x, dtype))
        assert str(ops.dtype(y)) == dtype
    v = Variable(x.astype(np.float64))
    with GradientTape() as tape:
        loss = ops.sum(activations.elu(v))
    (g,) = tape.gradient(loss, [v])
    np.testing.assert_allclose(np.asarray(g), np.where(x >= 0, 1.0, np.exp(x.astype(np.float64))), rtol=1e-12)
    assert str(ops.dtype(activations.relu(np.arange(3)))) == "float32"  # ints compute in floatx


def test_glu_refuses_an_odd_axis():
    with pytest.raises(ValueError, match="divisible by 2"):
        activations.glu(np.ones((3, 5), np.float32))


def test_a_registered_op_takes_over_with_the_activation_defaults(monkeypatch):
    calls = []

    def fake_gelu(x, approximate=True):
        calls.append(approximate)
        return activations.gelu.composite(x, approximate)

    monkeypatch.setitem(_core.REGISTRY, "gelu", {"fn": fake_gelu, "differentiable": True, "family": "nn"})
    x = activation_input()
    np.testing.assert_allclose(np.asarray(activations.gelu(x)), np.asarray(activations.gelu.composite(x)))
    activations.gelu(x, approximate=True)
    assert calls == [False, True]  # activations.gelu is exact by default, whatever the op's default


# ----- get / serialize / deserialize ------------------------------------------------------------------------
@pytest.mark.parametrize("label,name,kwargs", ACTIVATION_CASES[:1] + [c for c in ACTIVATION_CASES if not c[2]],
                         ids=["relu-0"] + [c[0] for c in ACTIVATION_CASES if not c[2]])
def test_serialize_matches_keras_and_round_trips(label, name, kwargs):
    _, configs, _ = reference()
    fn = activations.get(name)
    assert activations.serialize(fn) == configs[f"act/{label}"]
    assert activations.deserialize(configs[f"act/{label}"]) is fn
    assert activations.deserialize({"module": "keras.activations", "class_name": "function",
                                    "config": configs[f"act/{label}"], "registered_name": None}) is fn


def test_get_and_custom_functions():
    assert activations.get(None) is activations.linear
    assert activations.get("swish") is activations.silu
    assert activations.get(math.tanh) is math.tanh

    def double(x):
        return ops.multiply(x, 2.0)

    config = activations.serialize(double)
    assert config == {"module": "builtins", "class_name": "function", "config": "double", "registered_name": "function"}
    assert activations.deserialize(config, custom_objects={"double": double}) is double
    assert activations.deserialize("double", custom_objects={"double": double}) is double
    with pytest.raises(ValueError, match="Could not interpret activation"):
        activations.get("no_such_activation")
    with pytest.raises(ValueError, match="Unknown activation"):
        activations.deserialize("double")
