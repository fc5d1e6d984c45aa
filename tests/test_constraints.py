"""``dnnbind.constraints`` (keras.constraints): values and configs against real Keras 3 (NumPy backend),
the gradient of the constrained value against float64 finite differences, the norms they promise, and
get/serialize/deserialize."""

from __future__ import annotations

import numpy as np
import pytest

import dnnbind
from dnnbind import backend, constraints, ops
from dnnbind.autodiff import GradientTape, Variable
from keras_aux import CONSTRAINT_CASES, reference, weight_input
from testutil import numerical_grad

KERAS_NAMES = ("Constraint", "MaxNorm", "MinMaxNorm", "NonNeg", "UnitNorm", "deserialize", "get", "max_norm",
               "min_max_norm", "non_neg", "serialize", "unit_norm")  # keras.constraints in Keras 3.15.1

IDS = [c[0] for c in CONSTRAINT_CASES]


@pytest.fixture(autouse=True)
def _cpu(cpu):
    yield


def test_every_keras_constraint_name_exists():
    missing = [n for n in KERAS_NAMES if not hasattr(constraints, n)]
    assert not missing, f"keras.constraints names missing from dnnbind.constraints: {missing}"
    assert dnnbind.constraints.max_norm is constraints.MaxNorm


@pytest.mark.parametrize("label,cls,kwargs", CONSTRAINT_CASES, ids=IDS)
def test_values_and_configs_match_real_keras(label, cls, kwargs):
    status, configs, values = reference()
    assert status[f"con/{label}"] == "ok", status[f"con/{label}"]
    con = getattr(constraints, cls)(**kwargs)
    for bits in ("32", "64"):  # Keras's NumPy backend computes its float64 case in float32
        w = weight_input(f"float{bits}")
        got = con(Variable(w))
        assert str(ops.dtype(got)) == f"float{bits}" and tuple(got.shape) == w.shape
        np.testing.assert_allclose(np.asarray(got), values[f"con/{label}/{bits}"], rtol=2e-6, atol=1e-7, err_msg=label)
    assert not np.allclose(np.asarray(con(weight_input())), weight_input())  # the cases all change the weight
    assert constraints.serialize(con) == configs[f"con/{label}"]
    again = constraints.deserialize(configs[f"con/{label}"])
    assert type(again) is type(con) and again.get_config() == con.get_config()


@pytest.mark.parametrize("label,cls,kwargs", CONSTRAINT_CASES, ids=IDS)
def test_gradient_matches_finite_differences(label, cls, kwargs):
    con = getattr(constraints, cls)(**kwargs)
    w = weight_input("float64")
    r = np.random.default_rng(3).normal(size=w.shape)
    t = ops.convert_to_tensor(w)
    with GradientTape() as tape:
        tape.watch(t)
        loss = ops.sum(ops.multiply(con(t), r))
    (grad,) = tape.gradient(loss, [t])
    numeric = numerical_grad(lambda: float(np.sum(np.asarray(con(w)) * r)), w)
    np.testing.assert_allclose(np.asarray(grad), numeric, rtol=1e-6, atol=1e-8, err_msg=label)


def test_the_norms_they_promise():
    w = weight_input("float64") * 3.0
    eps = backend.epsilon()
    norms = lambda a, axis: np.sqrt(np.sum(np.square(a), axis=axis))  # noqa: E731
    assert np.all(norms(np.asarray(constraints.MaxNorm(1.5)(w)), 0) <= 1.5 + 1e-9)
    np.testing.assert_allclose(norms(np.asarray(constraints.UnitNorm(axis=1)(w)), 1), 1.0, rtol=1e-6)
    got = norms(np.asarray(constraints.MinMaxNorm(2.0, 2.5)(w)), 0)
    assert np.all((got >= 2.0 - 1e-6) & (got <= 2.5 + 1e-6))
    small = np.full((3, 2), 0.1)  # under max_value: unchanged up to the epsilon in the division
    np.testing.assert_allclose(np.asarray(constraints.MaxNorm(2.0)(small)), small * (np.sqrt(0.03) / (eps + np.sqrt(0.03))))
    assert np.asarray(constraints.NonNeg()(w)).min() == 0.0
    assert constraints.Constraint()(w) is w


def test_get_serialize_and_custom_constraints():
    assert constraints.get(None) is None
    assert isinstance(constraints.get("non_neg"), constraints.NonNeg)
    assert isinstance(constraints.get("UnitNorm"), constraints.UnitNorm)
    assert isinstance(constraints.get(constraints.MaxNorm), constraints.MaxNorm)
    assert constraints.get({"class_name": "MaxNorm", "config": {"max_value": 4, "axis": 1}}).get_config() == \
        {"max_value": 4, "axis": 1}
    with pytest.raises(ValueError, match="Could not interpret constraint"):
        constraints.get("no_such_constraint")

    class Clip(constraints.Constraint):
        def __init__(self, limit=1.0):
            self.limit = limit

        def __call__(self, w):
            return ops.clip(w, -self.limit, self.limit)

        def get_config(self):
            return {"limit": self.limit}

    config = constraints.serialize(Clip(0.5))
    assert config["registered_name"] == "Clip" and config["config"] == {"limit": 0.5}
    assert constraints.deserialize(config, custom_objects={"Clip": Clip}).limit == 0.5
    with pytest.raises(TypeError, match="custom_objects"):
        constraints.deserialize(config)
