"""``keras.initializers``' remaining names: the function-style aliases, ``Identity`` and ``STFT`` (numbers against
real Keras 3 on its NumPy backend, in one subprocess), ``deserialize``."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import dnnbind as keras
from dnnbind import initializers, saving

KERAS_NAMES = ["Constant", "GlorotNormal", "GlorotUniform", "HeNormal", "HeUniform", "Identity",
               "IdentityInitializer", "Initializer", "LecunNormal", "LecunUniform", "Ones", "Orthogonal",
               "OrthogonalInitializer", "RandomNormal", "RandomUniform", "STFT", "STFTInitializer", "TruncatedNormal",
               "VarianceScaling", "Zeros", "constant", "deserialize", "get", "glorot_normal", "glorot_uniform",
               "he_normal", "he_uniform", "identity", "lecun_normal", "lecun_uniform", "ones", "orthogonal",
               "random_normal", "random_uniform", "serialize", "stft", "truncated_normal", "variance_scaling", "zeros"]

# (constructor arguments, shape) of the deterministic initializers compared with Keras
CASES = [
    ("Identity", {}, (3, 3)), ("Identity", {"gain": 2.5}, (3, 5)), ("Identity", {"gain": -1.0}, (4, 2)),
    ("STFT", {}, (8, 1, 5)), ("STFT", {"side": "imag"}, (8, 2, 5)),
    ("STFT", {"window": "hamming", "scaling": "spectrum", "periodic": True}, (16, 1, 9)),
    ("STFT", {"side": "imag", "window": "blackman", "scaling": None}, (6, 1, 4)),
    ("STFT", {"window": None}, (5, 1, 3)), ("STFT", {"window": "boxcar", "periodic": True}, (7, 1, 4)),
    ("STFT", {"window": "bartlett"}, (9, 1, 5)),
]

_KERAS_SCRIPT = """
import json, sys, numpy as np, keras
cases = json.loads(sys.argv[1])
out = [np.asarray(getattr(keras.initializers, name)(**kw)(tuple(shape), dtype="float64")).tolist()
       for name, kw, shape in cases]
aliases = sorted(n for n in dir(keras.initializers) if n.islower() and isinstance(getattr(keras.initializers, n), type))
print(json.dumps({"values": out, "aliases": aliases}))
"""


@pytest.fixture(scope="module")
def keras_reference(tmp_path_factory):
    if importlib.util.find_spec("keras") is None or importlib.util.find_spec("scipy") is None:
        pytest.skip("needs Keras (and scipy, for its windows) installed")
    work = tmp_path_factory.mktemp("keras_init")
    env = {k: v for k, v in os.environ.items() if k not in ("KERAS_HOME", "KERAS_BACKEND")}
    env.update(KERAS_HOME=str(work), KERAS_BACKEND="numpy")
    proc = subprocess.run([sys.executable, "-c", _KERAS_SCRIPT, json.dumps(CASES)], capture_output=True, text=True,
                          timeout=180, env=env, cwd=str(work))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("index", range(len(CASES)))
def test_identity_and_stft_match_keras(keras_reference, index):
    name, kwargs, shape = CASES[index]
    got = getattr(initializers, name)(**kwargs)(shape, dtype="float64")
    want = np.asarray(keras_reference["values"][index])
    assert np.any(want != 0) and got.shape == shape
    # Keras makes STFT kernels of (frame_length, 1, bins) whatever the channels; dnnbind fills the shape asked
    # for. Keras takes pi from a float32 arccos(-1): agreement to float32 rounding
    np.testing.assert_allclose(got, np.broadcast_to(want, shape), rtol=1e-6, atol=1e-6)


def test_function_style_names_are_the_classes_as_in_keras(keras_reference):
    assert sorted(n for n in KERAS_NAMES if n.islower() and isinstance(getattr(initializers, n), type)) == \
        keras_reference["aliases"]
    assert all(hasattr(keras.initializers, n) for n in KERAS_NAMES)
    assert initializers.glorot_uniform is initializers.GlorotUniform and initializers.stft is initializers.STFT
    assert initializers.IdentityInitializer is initializers.Identity


def test_get_serialize_deserialize():
    for name in ("identity", "stft", "Identity", "STFT"):
        assert isinstance(initializers.get(name), (initializers.Identity, initializers.STFT))
    init = initializers.deserialize(initializers.serialize(initializers.Identity(gain=3.0)))
    assert isinstance(init, initializers.Identity) and init.gain == 3.0
    keras_style = {"module": "keras.initializers", "class_name": "STFT",
                   "config": {"side": "imag", "window": "hamming", "periodic": True, "scaling": None},
                   "registered_name": None}
    stft = initializers.deserialize(keras_style)
    assert stft.side == "imag" and stft.window == "hamming" and stft.periodic is True
    assert isinstance(initializers.deserialize("he_normal"), initializers.HeNormal)

    class Halves(initializers.Initializer):
        def __call__(self, shape, dtype="float32"):
            return np.full(shape, 0.5, dtype)

        def get_config(self):
            return {}

    saving.register_keras_serializable("tests")(Halves)
    try:
        made = initializers.deserialize({"module": __name__, "class_name": "Halves", "config": {},
                                         "registered_name": "tests>Halves"})
        assert np.all(made((2,)) == 0.5)
        assert np.all(initializers.deserialize("H", custom_objects={"H": Halves})((1,)) == 0.5)
    finally:
        saving.get_custom_objects().pop("tests>Halves")


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match=r"only be used for 2D matrices. Received: shape=\(2, 2, 2\) of rank 3"):
        initializers.Identity()((2, 2, 2))
    with pytest.raises(ValueError, match="side should be 'real' or 'imag'"):
        initializers.STFT(side="both")
    with pytest.raises(ValueError, match="window 'kaiser' is not supported"):
        initializers.STFT(window="kaiser")
    with pytest.raises(ValueError, match="Scaling is invalid"):
        initializers.STFT(scaling="power")
    with pytest.raises(ValueError, match="window shape"):
        initializers.STFT(window=np.ones(3))((4, 1, 3))
