"""CategoryEncoding, Discretization and Hashing: against real Keras 3 (JAX backend, in a subprocess) where Keras
runs them without TensorFlow (CategoryEncoding, Discretization with adapt); Hashing against the bins of Keras's
own documentation and tests (Keras computes them with TensorFlow) and FarmHash Fingerprint64 values of the C
library (pyfarmhash) at every length class of the algorithm; SipHash-2-4 against its reference vector."""

from __future__ import annotations

import importlib.util
import json
import os
import struct
import subprocess
import sys

import numpy as np
import pytest

from dnnbind import layers
from dnnbind.layers._fingerprint import fingerprint64, siphash64


@pytest.fixture(autouse=True)
def _cpu(cpu):
    yield


# ----- the hashes -------------------------------------------------------------------------------------------
# (pyfarmhash 0.5.1's fingerprint64, the C FarmHash library's: lengths 0, 1-3, 4-7, 8-16, 17-32, 33-64, > 64)
FARMHASH = [(b"", 0x9AE16A3B2F90404F), (b"a", 0xB3454265B6DF75E3), (b"abcd", 0x1A5502DE4A1F8101),
            (b"hello world!", 0x3F87E91E111FCF64), (b"x" * 17, 0x9CE745A1F3812FA5), (b"y" * 33, 0x777F79E52D060EFE),
            (b"The quick brown fox jumps over the lazy dog", 0xABBE83F33B1B5134),
            (bytes(range(65)), 0xC6A3282C3E793DBE), (bytes(range(200)), 0x74C7FCC26D66FB3)]


@pytest.mark.parametrize("data,expected", FARMHASH, ids=[str(len(d)) for d, _ in FARMHASH])
def test_fingerprint64_matches_farmhash(data, expected):
    assert fingerprint64(data) == expected


def test_siphash_reference_vector():
    key = struct.unpack("<QQ", bytes(range(16)))
    assert siphash64(key, bytes(range(15))) == 0xA129CA6149BE45E5  # the SipHash paper's test vector (15 bytes)
    assert siphash64(key, b"") == 0x726FDB47DD0E0E31


NAMES = [["omar"], ["stringer"], ["marlo"], ["wire"], ["skywalker"]]
LETTERS = [["A"], ["B"], ["C"], ["D"], ["E"]]


@pytest.mark.parametrize("kwargs,inputs,expected", [
    ({"num_bins": 3}, LETTERS, [1, 0, 1, 1, 2]),
    ({"num_bins": 3, "mask_value": ""}, [["A"], ["B"], [""], ["C"], ["D"]], [1, 1, 0, 2, 2]),
    ({"num_bins": 3, "salt": [133, 137]}, LETTERS, [1, 2, 1, 0, 2]),
    ({"num_bins": 3, "salt": 133}, LETTERS, [0, 0, 2, 1, 0]),
    ({"num_bins": 1}, LETTERS, [0, 0, 0, 0, 0]),
    ({"num_bins": 2}, NAMES, [0, 0, 1, 0, 0]),
    ({"num_bins": 3, "mask_value": ""}, NAMES, [1, 1, 2, 1, 1]),
    ({"num_bins": 3, "mask_value": "omar"}, NAMES, [0, 1, 2, 1, 1]),
    ({"num_bins": 3}, np.array([[0], [1], [2], [3], [4]]), [1, 0, 1, 0, 2]),
    ({"num_bins": 2, "salt": [133, 137]}, NAMES, [0, 1, 0, 1, 0]),
    ({"num_bins": 2, "salt": [211, 137]}, NAMES, [1, 0, 1, 0, 1]),
    ({"num_bins": 3, "salt": [133, 137]}, np.array([[0], [1], [2], [3], [4]]), [1, 1, 2, 0, 1]),
])
def test_hashing_gives_keras_bins(kwargs, inputs, expected):
    out = layers.Hashing(**kwargs)(inputs)
    assert out.dtype == np.int64
    np.testing.assert_array_equal(np.asarray(out), np.array(expected).reshape(-1, 1))


def test_hashing_flat_lists_encodings_and_config():
    layer = layers.Hashing(num_bins=2)
    np.testing.assert_array_equal(np.asarray(layer(["omar", "stringer", "marlo", "wire", "skywalker"])),
                                  [0, 0, 1, 0, 0])
    one_hot = np.asarray(layers.Hashing(3, output_mode="one_hot")(LETTERS))
    np.testing.assert_array_equal(one_hot, np.eye(3, dtype=np.float32)[[1, 0, 1, 1, 2]])
    multi = np.asarray(layers.Hashing(3, output_mode="multi_hot")([["A", "E"], ["B", "C"]]))
    np.testing.assert_array_equal(multi, [[0, 1, 1], [1, 1, 0]])
    layer = layers.Hashing(4, salt=7, mask_value="x", name="h")
    config = layer.get_config()
    assert config["salt"] == [7, 7] and config["mask_value"] == "x"
    again = layers.Hashing.from_config(json.loads(json.dumps(config)))
    np.testing.assert_array_equal(np.asarray(again(NAMES)), np.asarray(layer(NAMES)))
    assert layer.compute_output_shape((None, 1)) == (None, 1)


@pytest.mark.parametrize("make,match", [
    (lambda: layers.Hashing(0), r"num_bins"),
    (lambda: layers.Hashing(3, salt="s"), r"salt"),
    (lambda: layers.Hashing(3, output_mode="bins"), r"output_mode"),
    (lambda: layers.Hashing(1, mask_value=""), r"at least 2 with a mask_value"),
    (lambda: layers.CategoryEncoding(), r"num_tokens must be set"),
    (lambda: layers.Discretization(), r"either `num_bins` or `bin_boundaries`"),
    (lambda: layers.Discretization([0.0], num_bins=2), r"Both `num_bins` and `bin_boundaries`"),
    (lambda: layers.Discretization([1.0, 0.0]), r"sorted"),
])
def test_bad_arguments(make, match):
    with pytest.raises((ValueError, TypeError), match=match):
        make()


def test_bad_inputs_name_the_layer():
    with pytest.raises(TypeError, match=r"Hashing 'h': inputs must be strings or integers"):
        layers.Hashing(3, name="h")(np.array([[0.5]]))
    with pytest.raises(ValueError, match=r"CategoryEncoding 'c': input ids must be in \[0, num_tokens=3\)"):
        layers.CategoryEncoding(3, name="c")(np.array([[0, 3]]))
    with pytest.raises(ValueError, match=r"call `adapt\(dataset\)`"):
        layers.Discretization(num_bins=3)(np.array([1.0]))


# ----- CategoryEncoding and Discretization against Keras ----------------------------------------------------
CASES = [
    ("CategoryEncoding", {"num_tokens": 5, "output_mode": "multi_hot"}, [[0, 1, 1], [4, 3, 3]], None),
    ("CategoryEncoding", {"num_tokens": 5, "output_mode": "count"}, [[0, 1, 1], [4, 3, 3]], None),
    ("CategoryEncoding", {"num_tokens": 4, "output_mode": "one_hot"}, [[0], [3], [2]], None),
    ("CategoryEncoding", {"num_tokens": 4, "output_mode": "one_hot"}, [[0, 1], [3, 2]], None),
    ("CategoryEncoding", {"num_tokens": 4, "output_mode": "multi_hot"}, [1, 3], None),
    ("Discretization", {"bin_boundaries": [0.0, 1.0, 2.0]}, [[-1.5, 1.0, 0.5], [2.0, 3.0, 0.0]], None),
    ("Discretization", {"bin_boundaries": [0.0, 1.0], "output_mode": "one_hot"}, [[-1.0], [0.5], [7.0]], None),
    ("Discretization", {"bin_boundaries": [0.0, 1.0], "output_mode": "count"}, [[-1.0, 0.5, 0.7], [3, 3, 3]],
     None),
    ("Discretization", {"num_bins": 4, "epsilon": 0.01}, [[0.3, 20.0, 55.5, 80.0, 99.0]], "uniform"),
    ("Discretization", {"num_bins": 5, "epsilon": 0.05}, [[-2.0, -0.3, 0.0, 0.4, 1.7]], "normal"),
]

_SCRIPT = r"""
import json, sys
import numpy as np
import keras
work = sys.argv[1]
cases = json.load(open(f"{work}/cases.json"))
out = {}
for i, (cls, kwargs, x, adapt) in enumerate(cases):
    layer = getattr(keras.layers, cls)(**kwargs)
    if adapt is not None:
        # (what Keras's adapt does for an array; its adapt itself asks TensorFlow whether data is a tf.data set)
        layer.reset_state()
        layer.update_state(np.load(f"{work}/adapt{i}.npy"))
        layer.finalize_state()
        out[f"{i}/boundaries"] = np.asarray(layer.bin_boundaries)
    y = layer(np.asarray(x))
    out[f"{i}/y"] = np.asarray(y)
    out[f"{i}/dtype"] = np.array(str(np.asarray(y).dtype))
    out[f"{i}/config"] = np.array(json.dumps({k: v for k, v in layer.get_config().items() if k != "dtype"}))
np.savez(f"{work}/out.npz", **out)
"""


def _adapt_data(kind: str) -> np.ndarray:
    rng = np.random.default_rng(0)
    return (rng.uniform(0, 100, size=(500, 2)) if kind == "uniform" else rng.normal(size=(300, 3))).astype("float32")


def test_category_encoding_and_discretization_match_keras(tmp_path):
    if importlib.util.find_spec("keras") is None or importlib.util.find_spec("jax") is None:
        pytest.skip("real Keras 3 with JAX is not installed (test extra)")
    with open(tmp_path / "cases.json", "w") as f:
        json.dump(CASES, f)
    for i, case in enumerate(CASES):
        if case[3] is not None:
            np.save(tmp_path / f"adapt{i}.npy", _adapt_data(case[3]))
    env = {k: v for k, v in os.environ.items() if k != "KERAS_HOME"}
    env.update(KERAS_HOME=str(tmp_path / "kh"), KERAS_BACKEND="jax", JAX_PLATFORMS="cpu")
    proc = subprocess.run([sys.executable, "-c", _SCRIPT, str(tmp_path)], capture_output=True, text=True, env=env,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    theirs = dict(np.load(tmp_path / "out.npz"))
    for i, (cls, kwargs, x, adapt) in enumerate(CASES):
        layer = getattr(layers, cls)(**kwargs)
        if adapt is not None:
            layer.adapt(_adapt_data(adapt))
            np.testing.assert_allclose(layer.bin_boundaries, theirs[f"{i}/boundaries"], rtol=1e-6,
                                       err_msg=f"case {i}")
        y = np.asarray(layer(np.asarray(x)))
        np.testing.assert_array_equal(y, theirs[f"{i}/y"], err_msg=f"case {i}: {cls} {kwargs}")
        assert str(y.dtype) == str(theirs[f"{i}/dtype"]), f"case {i}"
        assert tuple(layer.compute_output_shape(np.asarray(x).shape)) == y.shape, f"case {i}"
        ours = {k: v for k, v in layer.get_config().items() if k != "dtype"}
        keras_config = json.loads(str(theirs[f"{i}/config"]))
        for key in ("trainable",):
            ours.pop(key, None)
            keras_config.pop(key, None)
        ours.pop("name"), keras_config.pop("name")
        assert ours == keras_config, f"case {i}"
        again = getattr(layers, cls).from_config(layer.get_config())
        np.testing.assert_array_equal(np.asarray(again(np.asarray(x))), y)


def test_count_weights():
    layer = layers.CategoryEncoding(3, output_mode="count")
    out = np.asarray(layer(np.array([[0, 1, 1], [2, 2, 0]]), count_weights=np.array([[0.5, 1.0, 2.0], [1, 1, 4.0]])))
    np.testing.assert_allclose(out, [[0.5, 3.0, 0.0], [4.0, 0.0, 2.0]])


# ----- HashedCrossing (Keras's documented bins; Keras computes them with TensorFlow) ------------------------
def test_hashed_crossing_gives_keras_bins():
    feat1 = np.array(["A", "B", "A", "B", "A"])
    feat2 = np.array([101, 101, 101, 102, 102])
    out = layers.HashedCrossing(num_bins=5)((feat1, feat2))
    assert out.dtype == np.int64
    np.testing.assert_array_equal(np.asarray(out), [1, 4, 1, 1, 3])
    one_hot = np.asarray(layers.HashedCrossing(num_bins=5, output_mode="one_hot")((feat1, feat2)))
    np.testing.assert_array_equal(one_hot, np.eye(5, dtype=np.float32)[[1, 4, 1, 1, 3]])
    column = np.asarray(layers.HashedCrossing(num_bins=5)((feat1[:, None], feat2[:, None])))
    np.testing.assert_array_equal(column, [[1], [4], [1], [1], [3]])
    scalar = layers.HashedCrossing(num_bins=5)((np.array("B"), np.array(101)))
    assert np.asarray(scalar).shape == () and int(np.asarray(scalar)) == 4
    # crossing is ordered, and a third feature changes the bins
    swapped = np.asarray(layers.HashedCrossing(num_bins=1000)((feat2, feat1)))
    straight = np.asarray(layers.HashedCrossing(num_bins=1000)((feat1, feat2)))
    assert not np.array_equal(swapped, straight)
    assert layers.HashedCrossing(2, dtype="int32")((np.array([1]), np.array([1]))).dtype == np.int32


def test_hashed_crossing_errors_and_config():
    layer = layers.HashedCrossing(10, name="x")
    with pytest.raises(ValueError, match=r"HashedCrossing 'x': `HashedCrossing` should be called on a list"):
        layer(np.array(1))
    with pytest.raises(ValueError, match=r"at least two inputs"):
        layer([np.array(1)])
    with pytest.raises(ValueError, match=r"should have shape"):
        layer((np.array([[1, 2]]), np.array([[1, 2]])))
    with pytest.raises(TypeError, match=r"strings or integers"):
        layer((np.array([1.5]), np.array([1.0])))
    config = layer.get_config()
    assert config == {"num_bins": 10, "output_mode": "int", "sparse": False, "name": "x", "dtype": "int64"}
    assert layers.HashedCrossing.from_config(config).get_config() == config
