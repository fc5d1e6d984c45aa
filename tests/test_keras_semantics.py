"""Places where dnnbind once computed something other than Keras 3: each checked against real Keras 3
(JAX backend, CPU, one subprocess for the module) or against Keras's documented value.

The Keras side runs ``_KERAS_SCRIPT`` once; it reads the shared inputs from ``inputs.npz`` and writes
its results to ``keras.json`` (plain lists and numbers, no pickle).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import dnnbind as keras


def _inputs() -> dict:
    rng = np.random.default_rng(20261202)
    return {
        "tob_x": rng.normal(size=(3, 8, 4)).astype(np.float32),
        "tob_y": rng.normal(size=(3, 8, 1)).astype(np.float32),
        "tob_k": rng.normal(size=(4, 1)).astype(np.float32),
        "tob_b": rng.normal(size=(1,)).astype(np.float32),
    }


_KERAS_SCRIPT = r'''
import json, sys
import numpy as np
import keras
work = sys.argv[1]
inp = dict(np.load(work + "/inputs.npz"))
out = {}

# 1. train_on_batch / test_on_batch: the metrics are reset at each call
m = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
m.compile(keras.optimizers.SGD(0.1), "mse", metrics=["mae"])
m.set_weights([inp["tob_k"], inp["tob_b"]])
out["train_on_batch"] = [m.train_on_batch(inp["tob_x"][i], inp["tob_y"][i]) for i in range(3)]
out["test_on_batch"] = [m.test_on_batch(inp["tob_x"][i], inp["tob_y"][i]) for i in range(3)]

with open(work + "/keras.json", "w") as f:
    json.dump(out, f)
'''


@pytest.fixture(scope="module")
def ref(tmp_path_factory):
    if importlib.util.find_spec("keras") is None or importlib.util.find_spec("jax") is None:
        pytest.skip("real Keras 3 with JAX is not installed (test extra)")
    work = tmp_path_factory.mktemp("keras_semantics")
    np.savez(work / "inputs.npz", **_inputs())
    env = {k: v for k, v in os.environ.items() if k != "KERAS_HOME"}
    env.update(KERAS_HOME=str(work / "kh"), KERAS_BACKEND="jax", JAX_PLATFORMS="cpu")
    proc = subprocess.run([sys.executable, "-c", _KERAS_SCRIPT, str(work)], capture_output=True, text=True,
                          env=env, timeout=300)
    assert proc.returncode == 0, f"the Keras side failed:\n{proc.stderr[-4000:]}"
    with open(work / "keras.json") as f:
        return json.load(f)


@pytest.fixture
def inp():
    return _inputs()


def test_train_and_test_on_batch_return_this_batchs_values(cpu, ref, inp):
    """Keras 3 resets the metrics at each train_on_batch/test_on_batch: each returns that batch's loss and
    metrics, not the running mean over the earlier calls."""
    m = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    m.compile(keras.optimizers.SGD(0.1), "mse", metrics=["mae"])
    m.set_weights([inp["tob_k"], inp["tob_b"]])
    train = [m.train_on_batch(inp["tob_x"][i], inp["tob_y"][i]) for i in range(3)]
    test = [m.test_on_batch(inp["tob_x"][i], inp["tob_y"][i]) for i in range(3)]
    np.testing.assert_allclose(train, ref["train_on_batch"], rtol=1e-5)
    np.testing.assert_allclose(test, ref["test_on_batch"], rtol=1e-5)
    # as a dict: this batch's loss, the MSE of the outputs before the update
    x, y = inp["tob_x"][0], inp["tob_y"][0]
    before = float(np.mean((m.predict(x, verbose=0) - y) ** 2))
    d = m.train_on_batch(x, y, return_dict=True)
    assert sorted(d) == ["loss", "mae"] and d["loss"] == pytest.approx(before, rel=1e-5)
