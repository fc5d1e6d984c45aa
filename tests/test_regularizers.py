"""``dnnbind.regularizers`` (keras.regularizers): values (float32 and float64) and configs against real
Keras 3 (NumPy backend), gradients to a variable against float64 finite differences, get/serialize/
deserialize, and Keras's argument errors."""

from __future__ import annotations

import numpy as np
import pytest

import dnnbind
from dnnbind import ops, regularizers
from dnnbind.autodiff import GradientTape, Variable
from keras_aux import REGULARIZER_CASES, reference, weight_input
from testutil import numerical_grad

KERAS_NAMES = ("L1", "L1L2", "L2", "OrthogonalRegularizer", "Regularizer", "deserialize", "get", "l1", "l1_l2", "l2",
               "orthogonal_regularizer", "serialize")  # keras.regularizers in Keras 3.15.1

IDS = [c[0] for c in REGULARIZER_CASES]


@pytest.fixture(autouse=True)
def _cpu(cpu):
    yield


def test_every_keras_regularizer_name_exists():
    missing = [n for n in KERAS_NAMES if not hasattr(regularizers, n)]
    assert not missing, f"keras.regularizers names missing from dnnbind.regularizers: {missing}"
    assert dnnbind.regularizers.l1_l2 is regularizers.L1L2 and dnnbind.Regularizer is regularizers.Regularizer


@pytest.mark.parametrize("label,cls,kwargs", REGULARIZER_CASES, ids=IDS)
def test_values_and_configs_match_real_keras(label, cls, kwargs):
    status, configs, values = reference()
    assert status[f"reg/{label}"] == "ok", status[f"reg/{label}"]
    reg = getattr(regularizers, cls)(**kwargs)
    for bits in ("32", "64"):
        want = values[f"reg/{label}/{bits}"]
        got = reg(Variable(weight_input(f"float{bits}")))
        assert tuple(got.shape) == () and str(ops.dtype(got)) == f"float{bits}"
        # float64: exact to rounding (which checks that L1's factor is float32, as in Keras), except where
        # Keras's NumPy backend narrows a float64 matmul to float32 (the orthogonal regularizer; DESIGN, dtypes)
        tol = 2e-6 if bits == "32" or cls == "OrthogonalRegularizer" else 1e-13
        np.testing.assert_allclose(np.asarray(got), want, rtol=tol, err_msg=label)
    assert regularizers.serialize(reg) == configs[f"reg/{label}"]
    again = regularizers.deserialize(configs[f"reg/{label}"])
    assert type(again) is type(reg) and again.get_config() == reg.get_config()
    assert regularizers.get(configs[f"reg/{label}"]).get_config() == reg.get_config()


@pytest.mark.parametrize("label,cls,kwargs", REGULARIZER_CASES, ids=IDS)
def test_gradient_reaches_the_variable(label, cls, kwargs):
    reg = getattr(regularizers, cls)(**kwargs)
    w = weight_input("float64")
    v = Variable(w.copy())
    with GradientTape() as tape:
        loss = reg(v)
    (grad,) = tape.gradient(loss, [v])
    numeric = numerical_grad(lambda: float(np.asarray(reg(w))), w)
    got = np.zeros_like(w) if grad is None else np.asarray(grad)
    np.testing.assert_allclose(got, numeric, rtol=1e-6, atol=1e-9, err_msg=label)
    if cls != "L1L2" or kwargs:
        assert np.abs(numeric).max() > 1e-4  # never compare zero gradients


def test_get_names_classes_and_none():
    assert regularizers.get(None) is None
    assert isinstance(regularizers.get("l2"), regularizers.L2) and regularizers.get("l2").l2 == 0.01
    assert isinstance(regularizers.get("L1L2"), regularizers.L1L2)
    assert isinstance(regularizers.get(regularizers.L1), regularizers.L1)
    assert isinstance(regularizers.get("orthogonal_regularizer"), regularizers.OrthogonalRegularizer)
    reg = regularizers.L2(0.3)
    assert regularizers.get(reg) is reg
    assert regularizers.get({"class_name": "L2", "config": {"l2": 0.5}}).l2 == 0.5
    assert regularizers.deserialize("l1").get_config() == {"l1": float(np.float32(0.01))}
    assert regularizers.Regularizer()(np.ones(3)) == 0.0
    with pytest.raises(NotImplementedError):
        regularizers.Regularizer().get_config()


def test_custom_regularizers_need_custom_objects():
    class Scaled(regularizers.Regularizer):
        def __init__(self, k=1.0):
            self.k = k

        def __call__(self, x):
            return ops.multiply(ops.sum(x), self.k)

        def get_config(self):
            return {"k": self.k}

    config = regularizers.serialize(Scaled(2.0))
    assert config == {"module": None, "class_name": "Scaled", "config": {"k": 2.0}, "registered_name": "Scaled"}
    assert regularizers.deserialize(config, custom_objects={"Scaled": Scaled}).k == 2.0
    with pytest.raises(TypeError, match="custom_objects"):
        regularizers.deserialize(config)


@pytest.mark.parametrize("make,match", [
    (lambda: regularizers.L2(-1), "non-negative"), (lambda: regularizers.L1(float("nan")), "non-negative"),
    (lambda: regularizers.L1L2(l1="x"), "non-negative"), (lambda: regularizers.OrthogonalRegularizer(mode="x"), "mode"),
    (lambda: regularizers.OrthogonalRegularizer()(np.ones((2, 2, 2))), "rank 2"),
    (lambda: regularizers.get("no_such_regularizer"), "Could not interpret"),
])
def test_keras_argument_errors(make, match):
    with pytest.raises(ValueError, match=match):
        make()
