"""Real Keras 3 (its NumPy backend, in one subprocess per pytest run) as the reference of
``tests/test_activations.py``, ``test_regularizers.py``, ``test_constraints.py`` and ``test_random.py``.

The cases live here so that one subprocess computes every reference: activation values and
serialized names, regularizer and constraint values and configs (float32 and float64 inputs), and
large samples of Keras's random distributions (Keras's RNG draws other bits than dnnbind's, so the
random tests compare distributions, not numbers). :func:`reference` runs the subprocess on first use
and caches its results; it skips the calling test when Keras is not installed.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import pytest

# ----- inputs -----------------------------------------------------------------------------------------------
#: points where an activation has a kink (relu thresholds, clip bounds, shrink thresholds, max_value): the
#: inputs keep away from them so that finite differences see a smooth function
KINKS = (-3.0, -2.0, -1.0, -0.5, 0.0, 0.5, 1.0, 2.0, 3.0)


def activation_input(dtype: str = "float32") -> np.ndarray:
    rng = np.random.default_rng(11)
    x = rng.uniform(-2.9, 2.9, size=(4, 6))
    for k in KINKS:
        near = np.abs(x - k) < 0.03
        x[near] = k + 0.07
    return x.astype(dtype)


def peaked_input(dtype: str = "float32") -> np.ndarray:
    """Rows with one entry far above the others: sparsemax's support has one element (where Keras 3.15.1's
    sparsemax is right, see ``dnnbind.activations.sparsemax``)."""
    x = activation_input("float64") * 0.2
    x[np.arange(4), [1, 3, 0, 5]] += 2.0
    return x.astype(dtype)


def activation_case_input(name: str, kwargs: dict, dtype: str = "float32") -> np.ndarray:
    """The input of an activation case (sparsemax: one peak per slice along its axis)."""
    if name == "sparsemax":
        return peaked_input(dtype).T.copy() if kwargs.get("axis") == 0 else peaked_input(dtype)
    return activation_input(dtype)


def weight_input(dtype: str = "float32") -> np.ndarray:
    rng = np.random.default_rng(12)
    return (rng.normal(size=(5, 4)) * 0.9 + 0.1).astype(dtype)


# ----- cases ------------------------------------------------------------------------------------------------
#: (label, activation name, keyword arguments)
ACTIVATION_CASES = [
    ("relu", "relu", {}), ("relu-slope", "relu", {"negative_slope": 0.1}), ("relu-max", "relu", {"max_value": 2.0}),
    ("relu-max6", "relu", {"max_value": 6}), ("relu-threshold", "relu", {"threshold": 0.5}),
    ("relu-all", "relu", {"negative_slope": 0.1, "max_value": 2.0, "threshold": 0.5}),
    ("relu-slope-threshold", "relu", {"negative_slope": 0.2, "threshold": -0.5}),
    ("leaky_relu", "leaky_relu", {}), ("leaky_relu-0.3", "leaky_relu", {"negative_slope": 0.3}),
    ("relu6", "relu6", {}), ("softmax", "softmax", {}), ("softmax-axis0", "softmax", {"axis": 0}),
    ("softmax-both", "softmax", {"axis": (0, 1)}), ("log_softmax", "log_softmax", {}),
    ("log_softmax-axis0", "log_softmax", {"axis": 0}), ("elu", "elu", {}), ("elu-0.5", "elu", {"alpha": 0.5}),
    ("selu", "selu", {}), ("softplus", "softplus", {}), ("softsign", "softsign", {}),
    ("soft_shrink", "soft_shrink", {}), ("soft_shrink-1", "soft_shrink", {"threshold": 1.0}),
    ("sparse_plus", "sparse_plus", {}), ("silu", "silu", {}), ("swish", "swish", {}),
    ("squareplus", "squareplus", {}), ("squareplus-2", "squareplus", {"b": 2}), ("gelu", "gelu", {}),
    ("gelu-tanh", "gelu", {"approximate": True}), ("celu", "celu", {}), ("celu-0.5", "celu", {"alpha": 0.5}),
    ("glu", "glu", {}), ("glu-axis0", "glu", {"axis": 0}), ("tanh", "tanh", {}), ("tanh_shrink", "tanh_shrink", {}),
    ("hard_tanh", "hard_tanh", {}), ("hard_shrink", "hard_shrink", {}),
    ("hard_shrink-1", "hard_shrink", {"threshold": 1.0}),
    ("threshold", "threshold", {"threshold": 0.5, "default_value": -1.0}), ("sigmoid", "sigmoid", {}),
    ("sparse_sigmoid", "sparse_sigmoid", {}), ("exponential", "exponential", {}),
    ("hard_sigmoid", "hard_sigmoid", {}), ("hard_silu", "hard_silu", {}), ("hard_swish", "hard_swish", {}),
    ("linear", "linear", {}), ("mish", "mish", {}), ("log_sigmoid", "log_sigmoid", {}),
    ("sparsemax", "sparsemax", {}), ("sparsemax-axis0", "sparsemax", {"axis": 0}),
]

#: (label, class name, constructor arguments)
REGULARIZER_CASES = [
    ("L1", "L1", {}), ("L1-0.3", "L1", {"l1": 0.3}), ("L2", "L2", {}), ("L2-0.05", "L2", {"l2": 0.05}),
    ("L1L2", "L1L2", {}), ("L1L2-both", "L1L2", {"l1": 0.01, "l2": 0.02}), ("L1L2-none", "L1L2", {"l1": None, "l2": 0.1}),
    ("Orthogonal", "OrthogonalRegularizer", {}),
    ("Orthogonal-columns", "OrthogonalRegularizer", {"factor": 0.1, "mode": "columns"}),
]

CONSTRAINT_CASES = [
    ("MaxNorm", "MaxNorm", {}), ("MaxNorm-1.5-axis1", "MaxNorm", {"max_value": 1.5, "axis": 1}),
    ("MaxNorm-all", "MaxNorm", {"max_value": 3, "axis": [0, 1]}), ("MinMaxNorm", "MinMaxNorm", {}),
    ("MinMaxNorm-rate", "MinMaxNorm", {"min_value": 0.5, "max_value": 1.5, "rate": 0.7, "axis": 1}),
    ("NonNeg", "NonNeg", {}), ("UnitNorm", "UnitNorm", {}), ("UnitNorm-axis1", "UnitNorm", {"axis": 1}),
]

#: (label, keras.random function, keyword arguments without shape/seed); each drawn with shape (SAMPLES,)
RANDOM_SAMPLES = 40_000
RANDOM_CASES = [
    ("uniform", "uniform", {"minval": -1.0, "maxval": 3.0}), ("normal", "normal", {"mean": 1.0, "stddev": 2.0}),
    ("truncated_normal", "truncated_normal", {"mean": -1.0, "stddev": 0.5}),
    ("gamma-0.4", "gamma", {"alpha": 0.4}), ("gamma-3", "gamma", {"alpha": 3.0}),
    ("beta", "beta", {"alpha": 2.0, "beta": 0.7}), ("binomial-small", "binomial", {"counts": 30, "probabilities": 0.1}),
    ("binomial-large", "binomial", {"counts": 200, "probabilities": 0.65}),
    ("randint", "randint", {"minval": -3, "maxval": 9}),
]

_SCRIPT = r"""
import json, sys
import numpy as np
import keras
work = sys.argv[1]
spec = json.load(open(f"{work}/spec.json"))
data = dict(np.load(f"{work}/inputs.npz"))
out, status, configs = {}, {}, {}

def run(key, fn):
    try:
        fn()
        status[key] = "ok"
    except Exception as exc:
        status[key] = f"{type(exc).__name__}: {str(exc)[:300]}"

for label, name, kwargs in spec["activations"]:
    x = data[f"act/{label}"]
    kwargs = {k: tuple(v) if isinstance(v, list) else v for k, v in kwargs.items()}
    def act(label=label, name=name, kwargs=kwargs, x=x):
        fn = keras.activations.get(name)
        out[f"act/{label}"] = np.asarray(fn(x, **kwargs))
        configs[f"act/{label}"] = keras.activations.serialize(fn)
    run(f"act/{label}", act)

for group, module in (("reg", keras.regularizers), ("con", keras.constraints)):
    for label, cls, kwargs in spec[group]:
        def obj(label=label, cls=cls, kwargs=kwargs, group=group, module=module):
            o = getattr(module, cls)(**kwargs)
            # regularizers on variables, as layers apply them (Keras's normalize has a NumPy-array path whose
            # axis=0 is read as -1, which breaks OrthogonalRegularizer(mode="columns") on plain arrays);
            # constraints on arrays (Keras's NumPy backend reads a float64 variable as float32)
            for bits, w in (("32", data["w"]), ("64", data["w64"])):
                arg = keras.Variable(w, dtype=w.dtype.name) if group == "reg" else w
                out[f"{group}/{label}/{bits}"] = np.asarray(o(arg))
            configs[f"{group}/{label}"] = module.serialize(o)
        run(f"{group}/{label}", obj)

for label, fn, kwargs in spec["random"]:
    def draw(label=label, fn=fn, kwargs=kwargs):
        extra = {"dtype": "float32"} if fn != "randint" else {}
        out[f"rnd/{label}"] = np.asarray(getattr(keras.random, fn)((spec["samples"],), seed=7, **kwargs, **extra))
    run(f"rnd/{label}", draw)

np.savez(f"{work}/out.npz", **out)
json.dump({"status": status, "configs": configs}, open(f"{work}/out.json", "w"))
"""


def keras_api_names():
    """``tools/keras_api_names.py`` as a module (it reads an installed Keras's API files)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "tools" / "keras_api_names.py"
    spec = importlib.util.spec_from_file_location("keras_api_names", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def keras_available() -> bool:
    import importlib.util

    return all(importlib.util.find_spec(m) is not None for m in ("keras", "jax"))


@functools.lru_cache(maxsize=1)
def _run() -> "tuple[dict, dict, dict] | str":
    if not keras_available():
        return "real Keras 3 (with jax, its NumPy backend's dependency) is not installed (test extra)"
    work = tempfile.mkdtemp(prefix="dnnbind_keras_aux_")
    spec = {"activations": ACTIVATION_CASES, "reg": REGULARIZER_CASES, "con": CONSTRAINT_CASES,
            "random": RANDOM_CASES, "samples": RANDOM_SAMPLES}
    with open(os.path.join(work, "spec.json"), "w") as f:
        json.dump(spec, f)
    inputs = {f"act/{label}": activation_case_input(name, kwargs) for label, name, kwargs in ACTIVATION_CASES}
    np.savez(os.path.join(work, "inputs.npz"), w=weight_input(), w64=weight_input("float64"), **inputs)
    env = {k: v for k, v in os.environ.items() if k not in ("KERAS_HOME", "KERAS_BACKEND")}
    env.update(KERAS_HOME=os.path.join(work, "keras_home"), KERAS_BACKEND="numpy", JAX_PLATFORMS="cpu")
    proc = subprocess.run([sys.executable, "-c", _SCRIPT, work], capture_output=True, text=True, env=env, timeout=600)
    if proc.returncode != 0:
        raise AssertionError(f"the Keras side failed:\n{proc.stderr[-4000:]}")
    meta = json.load(open(os.path.join(work, "out.json")))
    return meta["status"], meta["configs"], dict(np.load(os.path.join(work, "out.npz")))


def reference() -> "tuple[dict, dict, dict]":
    """``(status, configs, values)`` from real Keras, keyed ``act/<label>``, ``reg/<label>[/32|/64]``,
    ``con/<label>[/32|/64]``, ``rnd/<label>``; skips the test when Keras is missing."""
    result = _run()
    if isinstance(result, str):
        pytest.skip(result)
    return result
