"""The optimizers written in the numeric engine (Adagrad, Adadelta, Adamax, Nadam, Lion, Lamb, Ftrl, Adafactor, ScheduleFreeAdamW): several steps
on the same weights and gradients as real Keras 3 (NumPy backend, one subprocess), with weight decay and each
clipping mode; skipped steps, state, config and bad arguments."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest

import dnnbind as keras
from dnnbind import optimizers

STEPS = 4
# (class, constructor arguments): every rule with its defaults, then with non-default hyper-parameters,
# weight decay, a schedule-free learning rate and each clipping mode
CASES = [
    ("Adagrad", {}), ("Adagrad", {"learning_rate": 0.1, "initial_accumulator_value": 0.5, "epsilon": 1e-3,
                                  "weight_decay": 0.1}),
    ("Adadelta", {"learning_rate": 0.5}), ("Adadelta", {"learning_rate": 1.0, "rho": 0.8, "clipnorm": 0.3}),
    ("Adamax", {}), ("Adamax", {"learning_rate": 0.05, "beta_1": 0.5, "beta_2": 0.9, "global_clipnorm": 0.5}),
    ("Nadam", {}), ("Nadam", {"learning_rate": 0.02, "beta_1": 0.7, "epsilon": 1e-4, "clipvalue": 0.2}),
    ("Lion", {}), ("Lion", {"learning_rate": 0.01, "beta_1": 0.5, "beta_2": 0.9, "weight_decay": 0.2}),
    ("Lamb", {}), ("Lamb", {"learning_rate": 0.02, "beta_1": 0.8, "clipnorm": 1.0}),
    ("Adafactor", {}), ("Adafactor", {"learning_rate": 0.5, "beta_2_decay": -0.5, "clip_threshold": 0.5,
                                      "relative_step": False, "epsilon_2": 0.01}),
    ("ScheduleFreeAdamW", {}), ("ScheduleFreeAdamW", {"learning_rate": 0.01, "beta_1": 0.8, "warmup_steps": 3,
                                                      "weight_decay": 0.05}),
    ("Ftrl", {"learning_rate": 0.05}), ("Ftrl", {"learning_rate": 0.1, "learning_rate_power": -0.7, "l1_regularization_strength": 0.01,
                            "l2_regularization_strength": 0.02, "l2_shrinkage_regularization_strength": 0.03,
                            "beta": 0.1}),
]


def _weights_and_grads():
    rng = np.random.default_rng(3)
    weights = [rng.normal(size=(3, 4)), rng.normal(size=(4,))]
    grads = [[rng.normal(size=w.shape) * (1 + s) for w in weights] for s in range(STEPS)]
    return weights, grads


_KERAS_SCRIPT = """
import json, sys, numpy as np, keras
sys.path.insert(0, sys.argv[1])
from test_optimizers_more import CASES, _weights_and_grads
weights, grads = _weights_and_grads()
out = []
for name, kwargs in CASES:
    opt = getattr(keras.optimizers, name)(**kwargs)
    variables = [keras.Variable(w.astype("float32")) for w in weights]
    for step in grads:
        opt.apply([g.astype("float32") for g in step], variables)
    out.append([np.asarray(v.value).tolist() for v in variables])
s = keras.optimizers.schedules
schedules = [s.PolynomialDecay(0.1, 10, 0.01, 2.0), s.PolynomialDecay(0.1, 7, 0.0, 0.5, cycle=True),
             s.InverseTimeDecay(0.3, 4, 0.7), s.InverseTimeDecay(0.3, 4, 0.7, staircase=True),
             s.CosineDecayRestarts(0.2, 5, 2.0, 0.7, 0.05), s.CosineDecayRestarts(0.2, 3, 1.0, 0.9)]
print(json.dumps({"steps": out, "schedules": [[float(c(t)) for t in range(0, 40, 3)] for c in schedules]}))
"""


@pytest.fixture(scope="module")
def keras_results(tmp_path_factory):
    if importlib.util.find_spec("keras") is None:
        pytest.skip("needs Keras installed (test extra)")
    work = tmp_path_factory.mktemp("keras_opt")
    env = {k: v for k, v in os.environ.items() if k not in ("KERAS_HOME", "KERAS_BACKEND")}
    env.update(KERAS_HOME=str(work), KERAS_BACKEND="numpy")
    proc = subprocess.run([sys.executable, "-c", _KERAS_SCRIPT, os.path.dirname(__file__)], capture_output=True,
                          text=True, timeout=180, env=env, cwd=str(work))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _run(name, kwargs, dtype="float32"):
    weights, grads = _weights_and_grads()
    opt = getattr(optimizers, name)(**kwargs)
    variables = [keras.Variable(w.astype(dtype)) for w in weights]
    for step in grads:
        opt.apply([g.astype(dtype) for g in step], variables)
    return opt, [keras.ops.convert_to_numpy(v) for v in variables]


@pytest.mark.parametrize("index", range(len(CASES)), ids=[f"{n}-{i}" for i, (n, _) in enumerate(CASES)])
def test_steps_match_keras(keras_results, index):
    name, kwargs = CASES[index]
    opt, got = _run(name, kwargs)
    start, _ = _weights_and_grads()
    for g, want, w0 in zip(got, keras_results["steps"][index], start):
        want = np.asarray(want)
        assert np.max(np.abs(want - w0)) > 1e-4  # the steps moved the weights
        np.testing.assert_allclose(g, want, rtol=2e-5, atol=2e-6)
    assert opt.iterations == STEPS


@pytest.mark.parametrize("name", ["Adagrad", "Nadam", "Ftrl", "Lamb"])
def test_float64_agrees_with_float32(name):
    _, a = _run(name, {"learning_rate": 0.05})
    _, b = _run(name, {"learning_rate": 0.05}, dtype="float64")
    for x, y in zip(a, b):
        assert y.dtype == np.float64
        np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-5)


def test_a_skipped_step_changes_nothing_and_counts_nothing():
    weights, grads = _weights_and_grads()
    opt = optimizers.Nadam(0.1)
    params = [w.astype("float32") for w in weights]
    opt._apply_raw(params, [g.astype("float32") for g in grads[0]])
    state = {k: v.copy() for k, v in opt.get_state().items()}
    before = [p.copy() for p in params]
    opt._apply_raw(params, [g.astype("float32") for g in grads[1]], skip=np.array(1, np.int32))
    assert all(np.array_equal(p, b) for p, b in zip(params, before))
    after = opt.get_state()
    assert all(np.array_equal(after[k], state[k]) for k in state) and opt.iterations == 1
    opt._apply_raw(params, [g.astype("float32") for g in grads[1]], skip=np.array(0, np.int32))
    assert not np.array_equal(params[0], before[0]) and opt.iterations == 2


def test_state_round_trip_continues_identically():
    weights, grads = _weights_and_grads()
    a = optimizers.Nadam(0.05)
    pa = [w.astype("float32") for w in weights]
    for step in grads[:2]:
        a._apply_raw(pa, [g.astype("float32") for g in step])
    b = optimizers.Nadam(0.05)
    pb = [p.copy() for p in pa]
    b.set_state(a.get_state(), pb)
    for step in grads[2:]:
        a._apply_raw(pa, [g.astype("float32") for g in step])
        b._apply_raw(pb, [g.astype("float32") for g in step])
    for x, y in zip(pa, pb):
        np.testing.assert_array_equal(x, y)
    assert "u_product" in a.get_state() and a.get_state()["0/momentum"].shape == (3, 4)


@pytest.mark.parametrize("name", ["adagrad", "adadelta", "adamax", "nadam", "lion", "lamb", "ftrl", "adafactor", "schedulefreeadamw"])
def test_get_config_round_trip(name):
    opt = optimizers.get(name)
    assert type(opt).__name__.lower() == name
    again = optimizers.deserialize(optimizers.serialize(opt))
    assert type(again) is type(opt) and again.get_config() == opt.get_config()


def test_bad_arguments_name_the_optimizer_and_value():
    with pytest.raises(ValueError, match="beta_1"):
        optimizers.Lion(beta_1=0.0)
    with pytest.raises(ValueError, match="learning_rate_power"):
        optimizers.Ftrl(learning_rate_power=0.5)
    with pytest.raises(ValueError, match="initial_accumulator_value"):
        optimizers.Ftrl(initial_accumulator_value=-1)
    with pytest.raises(ValueError, match="Adamax: beta_2"):
        optimizers.Adamax(beta_2=1.5)
    with pytest.raises(ValueError, match="rho"):
        optimizers.Adadelta(rho=2)
    with pytest.raises(TypeError, match="unexpected keyword"):
        optimizers.Adagrad(momentum=0.9)


def test_a_model_trains_with_each_new_optimizer():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 3)).astype("float32")
    y = (x @ np.array([[1.0], [-2.0], [0.5]], "float32")).astype("float32")
    for opt in (optimizers.Adagrad(0.3), optimizers.Nadam(0.05), optimizers.Lion(0.05), optimizers.Lamb(0.05),
                optimizers.LossScaleOptimizer(optimizers.Adam(0.05))):
        keras.utils.set_random_seed(1)
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
        model.compile(optimizer=opt, loss="mse")
        first = model.evaluate(x, y, verbose=0)
        model.fit(x, y, epochs=5, batch_size=16, verbose=0)
        assert model.evaluate(x, y, verbose=0) < 0.7 * first, type(opt).__name__


def test_schedules_match_keras_formulas():
    s = optimizers.schedules
    p = s.PolynomialDecay(0.1, 10, end_learning_rate=0.01, power=2.0)
    assert p(0) == pytest.approx(0.1) and p(5) == pytest.approx(0.09 * 0.25 + 0.01) and p(20) == pytest.approx(0.01)
    c = s.PolynomialDecay(0.1, 10, end_learning_rate=0.0, cycle=True)
    assert c(15) == pytest.approx(0.1 * (1 - 15 / 20)) and c(0) == pytest.approx(0.1)
    i = s.InverseTimeDecay(1.0, 10, 0.5)
    assert i(10) == pytest.approx(1 / 1.5) and s.InverseTimeDecay(1.0, 10, 0.5, staircase=True)(15) == pytest.approx(1 / 1.5)
    r = s.CosineDecayRestarts(1.0, 10, t_mul=2.0, m_mul=0.5, alpha=0.1)
    assert r(0) == pytest.approx(1.0) and r(5) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert r(10) == pytest.approx(0.1 + 0.9 * 0.5)  # the first restart: peak times m_mul
    assert r(20) == pytest.approx(0.1 + 0.9 * 0.5 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    flat = s.CosineDecayRestarts(1.0, 4, t_mul=1.0)
    assert flat(2) == pytest.approx(0.5) and flat(6) == pytest.approx(0.5)
    for sched in (p, c, i, r):
        again = s.deserialize(s.serialize(sched))
        assert type(again) is type(sched) and again.get_config() == sched.get_config()
    with pytest.raises(ValueError, match="decay_steps"):
        s.PolynomialDecay(0.1, 0)
    with pytest.raises(ValueError, match="first_decay_steps"):
        s.CosineDecayRestarts(0.1, 0)


def test_schedules_match_keras_numbers(keras_results):
    want = keras_results["schedules"]
    s = optimizers.schedules
    mine = [s.PolynomialDecay(0.1, 10, 0.01, 2.0), s.PolynomialDecay(0.1, 7, 0.0, 0.5, cycle=True),
            s.InverseTimeDecay(0.3, 4, 0.7), s.InverseTimeDecay(0.3, 4, 0.7, staircase=True),
            s.CosineDecayRestarts(0.2, 5, 2.0, 0.7, 0.05), s.CosineDecayRestarts(0.2, 3, 1.0, 0.9)]
    got = [[m(t) for t in range(0, 40, 3)] for m in mine]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)


def test_loss_scale_optimizer_in_a_custom_step():
    weights, grads = _weights_and_grads()
    inner = optimizers.SGD(0.1)
    lso = optimizers.LossScaleOptimizer(inner, initial_scale=8.0, dynamic_growth_steps=2)
    variables = [keras.Variable(w.astype("float32")) for w in weights]
    reference = [w.astype("float32") for w in weights]
    for step in grads[:3]:
        lso.scale_loss(keras.ops.convert_to_tensor(np.float32(1.0)))
        scale = float(keras.ops.convert_to_numpy(lso.scale))
        lso.apply([(g * scale).astype("float32") for g in step], variables)
        reference = [r - np.float32(0.1) * g.astype("float32") for r, g in zip(reference, step)]
    for v, r in zip(variables, reference):
        np.testing.assert_allclose(keras.ops.convert_to_numpy(v), r, rtol=1e-5, atol=1e-6)
    assert lso.iterations == inner.iterations == 3
    assert float(keras.ops.convert_to_numpy(lso.scale)) == 16.0  # doubled after two finite steps
    before = [keras.ops.convert_to_numpy(v).copy() for v in variables]
    bad = [np.full(w.shape, np.inf, "float32") for w in weights]
    lso.apply(bad, variables)  # skipped: nothing moves, the count stays, the scale halves
    assert all(np.array_equal(keras.ops.convert_to_numpy(v), b) for v, b in zip(variables, before))
    assert lso.iterations == 3 and float(keras.ops.convert_to_numpy(lso.scale)) == 8.0
    assert lso.learning_rate == pytest.approx(0.1)
    again = optimizers.LossScaleOptimizer.from_config(lso.get_config())
    assert isinstance(again.inner_optimizer, optimizers.SGD) and again.initial_scale == 8.0
    with pytest.raises(TypeError, match="inner_optimizer must be a dnnbind optimizer"):
        optimizers.LossScaleOptimizer("adam")
    with pytest.raises(ImportError, match="not supported in Keras 3"):
        optimizers.legacy.Adam()
