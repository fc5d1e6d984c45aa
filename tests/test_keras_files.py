"""Keras 3 file formats: ``.keras`` and ``.weights.h5`` read and written, checked against real Keras 3
(NumPy backend, in a subprocess) both ways; weights keyed by position; the errors for what cannot be
read or written."""

from __future__ import annotations

import importlib.util
import io
import json
import os
import subprocess
import sys
import zipfile

import numpy as np
import pytest

import dnnbind
import dnnbind as keras
from dnnbind import layers, saving

h5py = pytest.importorskip("h5py", reason="the Keras formats need h5py: pip install 'dnnbind[keras]'")

_MISSING_FOR_KERAS = [name for name in ("keras", "jax", "scipy") if importlib.util.find_spec(name) is None]
needs_keras = pytest.mark.skipif(bool(_MISSING_FOR_KERAS), reason=f"real Keras 3 on its NumPy backend needs "
                                 f"{', '.join(_MISSING_FOR_KERAS)} (pip install -e '.[test]')")


pytestmark = pytest.mark.usefixtures("cpu")  # the NumPy backend (conftest.py)


# ----- the models, in both libraries ----------------------------------------------------------------
# One source for both: dnnbind and Keras 3 share the API, so each side runs this text with its own
# ``keras`` and ``layers`` (the Keras side in a subprocess, on its NumPy backend).
_MODELS = r"""
def cnn(keras, layers):
    return keras.Sequential([
        keras.Input((8, 8, 3)),
        layers.Conv2D(4, 3, padding="same", activation="relu"),
        layers.BatchNormalization(),
        layers.MaxPooling2D(),
        layers.Conv2D(6, 3, strides=1, padding="valid", activation="tanh"),
        layers.AveragePooling2D(pool_size=1),
        layers.Flatten(),
        layers.Dropout(0.25),
        layers.Dense(7, activation="relu"),
        layers.Dense(5, activation="softmax"),
    ])


def gap(keras, layers):  # global pooling and the activation layers
    return keras.Sequential([
        keras.Input((6, 6, 2)),
        layers.Conv2D(3, 3, padding="same"),
        layers.LeakyReLU(negative_slope=0.1),
        layers.BatchNormalization(center=False),
        layers.Activation("swish"),
        layers.GlobalAveragePooling2D(),
        layers.ELU(alpha=0.7),
        layers.Dense(4, use_bias=False),
        layers.ReLU(max_value=6.0),
        layers.Softmax(),
    ])


def fun(keras, layers):  # a graph: two branches merged by Add and Concatenate
    inputs = keras.Input((6, 6, 2))
    a = layers.Conv2D(3, 3, padding="same", activation="relu")(inputs)
    b = layers.Conv2D(3, 1)(inputs)
    merged = layers.Concatenate()([layers.Add()([a, b]), a])
    pooled = layers.GlobalAveragePooling2D()(layers.BatchNormalization()(merged))
    return keras.Model(inputs, layers.Dense(4, activation="softmax")(pooled))


BUILDERS = {"cnn": cnn, "gap": gap, "fun": fun}
"""
_built: dict = {}
exec(_MODELS, _built)  # noqa: S102 - the test's own source text, above
_SHAPES = {"cnn": (8, 8, 3), "gap": (6, 6, 2), "fun": (6, 6, 2)}


def build(name):
    """The dnnbind model ``name`` of :data:`_MODELS`."""
    return _built["BUILDERS"][name](keras, layers)


_KERAS_SCRIPT = _MODELS + r"""
import os
import sys

import numpy as np
import keras
from keras import layers

work = sys.argv[1]
rng = np.random.default_rng(20240611)


def randomize(model):
    # every weight random, BN's moving variance positive, so that no layer is an identity
    for layer in model.layers:
        values = [rng.normal(0.0, 0.5, size=w.shape) for w in layer.weights]
        values = [np.abs(v) + 0.5 if "variance" in w.path else v for v, w in zip(values, layer.weights)]
        layer.set_weights([v.astype(np.float32) for v in values])


for name, make in BUILDERS.items():
    x = np.load(os.path.join(work, f"x_{name}.npy"))
    # 1. Keras writes: a .keras file (compiled) and a .weights.h5 file
    model = make(keras, layers)
    randomize(model)
    model.compile(keras.optimizers.Adam(0.003), "sparse_categorical_crossentropy", metrics=["accuracy"])
    model.save(os.path.join(work, f"keras_{name}.keras"))
    model.save_weights(os.path.join(work, f"keras_{name}.weights.h5"))
    np.save(os.path.join(work, f"keras_{name}_pred.npy"), model.predict(x, verbose=0))
    # 2. Keras reads what dnnbind wrote: load_model, and load_weights into a model of its own
    loaded = keras.saving.load_model(os.path.join(work, f"dnnbind_{name}.keras"))
    np.save(os.path.join(work, f"dnnbind_{name}_keras_model_pred.npy"), loaded.predict(x, verbose=0))
    with open(os.path.join(work, f"dnnbind_{name}_keras_info.txt"), "w") as fh:
        fh.write(" ".join([type(loaded.optimizer).__name__ if loaded.optimizer is not None else "None",
                           *[layer.name for layer in loaded.layers]]))
    fresh = make(keras, layers)
    fresh.load_weights(os.path.join(work, f"dnnbind_{name}.weights.h5"))
    np.save(os.path.join(work, f"dnnbind_{name}_keras_weights_pred.npy"), fresh.predict(x, verbose=0))
print("keras side done")
"""


def _randomize(model, rng):
    for layer in model.layers:
        values = [rng.normal(0.0, 0.5, size=w.shape) for w in layer._weights]
        values = [np.abs(v) + 0.5 if w.name == "moving_variance" else v for v, w in zip(values, layer._weights)]
        layer.set_weights([v.astype(np.float32) for v in values])


@pytest.fixture(scope="module")
def exchanged(tmp_path_factory):
    """dnnbind writes its files, then one Keras subprocess writes its own and reads dnnbind's."""
    if _MISSING_FOR_KERAS:
        pytest.skip(f"real Keras 3 needs {', '.join(_MISSING_FOR_KERAS)}")
    dnnbind.set_default_device("cpu")
    work = tmp_path_factory.mktemp("keras_exchange")
    rng = np.random.default_rng(7)
    ours = {}
    for name, shape in _SHAPES.items():
        x = rng.normal(size=(6, *shape)).astype(np.float32)
        np.save(work / f"x_{name}.npy", x)
        model = build(name)
        _randomize(model, rng)
        model.compile(keras.optimizers.Adam(0.002), "sparse_categorical_crossentropy", metrics=["accuracy"])
        model.save(work / f"dnnbind_{name}.keras")
        model.save_weights(work / f"dnnbind_{name}.weights.h5")
        ours[name] = (model, x, model.predict(x, verbose=0))
    env = {k: v for k, v in os.environ.items() if k != "KERAS_HOME"}
    env["KERAS_HOME"] = str(work / "keras_home")  # Keras writes a keras.json there on import
    env["KERAS_BACKEND"] = "numpy"
    proc = subprocess.run([sys.executable, "-c", _KERAS_SCRIPT, str(work)], capture_output=True, text=True,
                          env=env, timeout=300)
    assert proc.returncode == 0, f"the Keras side failed:\n{proc.stdout}\n{proc.stderr[-4000:]}"
    dnnbind.set_default_device(None)
    return work, ours


def _close(actual, expected):
    assert actual.shape == expected.shape
    assert np.isfinite(actual).all() and np.abs(expected).max() > 1e-3  # never compare all-zero outputs
    np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-5)


@needs_keras
@pytest.mark.parametrize("name", sorted(_SHAPES))
def test_a_model_saved_by_keras_loads_with_identical_predictions(exchanged, name):
    work, ours = exchanged
    _, x, _ = ours[name]
    expected = np.load(work / f"keras_{name}_pred.npy")
    model = keras.load_model(work / f"keras_{name}.keras")
    assert [type(layer).__name__ for layer in model.layers] == [type(layer).__name__ for layer in ours[name][0].layers]
    _close(model.predict(x, verbose=0), expected)
    # the compile config came along: Adam(0.003) and the loss
    assert type(model.optimizer).__name__ == "Adam"
    assert model.optimizer.get_config()["learning_rate"] == pytest.approx(0.003)
    assert type(model.loss).__name__ == "SparseCategoricalCrossentropy"


@needs_keras
@pytest.mark.parametrize("name", sorted(_SHAPES))
def test_keras_weights_load_into_a_model_with_other_automatic_names(exchanged, name):
    work, ours = exchanged
    _, x, _ = ours[name]
    expected = np.load(work / f"keras_{name}_pred.npy")
    model = build(name)  # built after others in this process: conv2d_5, dense_9... unlike the file's
    assert any(layer.name not in ("conv2d", "dense", "batch_normalization") for layer in model.layers)
    model.load_weights(work / f"keras_{name}.weights.h5")
    _close(model.predict(x, verbose=0), expected)
    # a .keras file is a weights source too, as in Keras
    other = build(name)
    other.load_weights(work / f"keras_{name}.keras")
    _close(other.predict(x, verbose=0), expected)


@needs_keras
@pytest.mark.parametrize("name", sorted(_SHAPES))
def test_files_saved_by_dnnbind_load_in_keras_with_identical_predictions(exchanged, name):
    work, ours = exchanged
    _, _, expected = ours[name]
    _close(np.load(work / f"dnnbind_{name}_keras_model_pred.npy"), expected)
    _close(np.load(work / f"dnnbind_{name}_keras_weights_pred.npy"), expected)
    info = (work / f"dnnbind_{name}_keras_info.txt").read_text().split()
    assert info[0] == "Adam"  # Keras compiled it from the translated compile config
    assert info[1:] == [layer.name for layer in ours[name][0].layers]


# ----- the files dnnbind writes -----------------------------------------------------------------------
def test_keras_file_layout(tmp_path, rng):
    model = build("cnn")
    _randomize(model, rng)
    model.save(tmp_path / "m.keras")
    with zipfile.ZipFile(tmp_path / "m.keras") as zf:
        assert zf.namelist() == ["metadata.json", "config.json", "model.weights.h5"]
        config = json.loads(zf.read("config.json"))
        metadata = json.loads(zf.read("metadata.json"))
        weights = zf.read("model.weights.h5")
    assert metadata["keras_version"].startswith("3.")
    assert config["module"] == "keras" and config["class_name"] == "Sequential"
    entries = config["config"]["layers"]
    assert [e["class_name"] for e in entries] == ["InputLayer", "Conv2D", "BatchNormalization", "MaxPooling2D",
                                                  "Conv2D", "AveragePooling2D", "Flatten", "Dropout", "Dense", "Dense"]
    assert entries[0]["config"]["batch_shape"] == [None, 8, 8, 3]
    conv = entries[1]
    assert conv["module"] == "keras.layers" and conv["registered_name"] is None
    assert conv["config"]["dtype"] == {"module": "keras", "class_name": "DTypePolicy", "config": {"name": "float32"},
                                       "registered_name": None}
    assert conv["config"]["kernel_initializer"]["class_name"] == "GlorotUniform"
    assert conv["config"]["kernel_initializer"]["module"] == "keras.initializers"
    assert conv["build_config"] == {"input_shape": [None, 8, 8, 3]}
    with h5py.File(io.BytesIO(weights), "r") as f:
        assert f["vars"].attrs["name"] == model.name
        conv1, conv2 = model.layers[0], model.layers[3]
        assert f["layers/conv2d/vars"].attrs["name"] == conv1.name
        np.testing.assert_array_equal(f["layers/conv2d/vars/0"][()], conv1.get_weights()[0])
        np.testing.assert_array_equal(f["layers/conv2d_1/vars/1"][()], conv2.get_weights()[1])
        bn = model.layers[1].get_weights()
        for i in range(4):  # gamma, beta, moving_mean, moving_variance, one to one
            np.testing.assert_array_equal(f[f"layers/batch_normalization/vars/{i}"][()], bn[i])
        assert "layers/max_pooling2d/vars" in f and len(f["layers/max_pooling2d/vars"]) == 0
        assert sorted(f["layers/dense_1/vars"]) == ["0", "1"]


def test_weights_are_keyed_by_position_whatever_the_names(tmp_path, rng):
    """The issue: identical models built in one process have different automatic names."""
    first, second = build("cnn"), build("cnn")
    assert first.layers[0].name != second.layers[0].name
    _randomize(first, rng)
    x = rng.normal(size=(3, 8, 8, 3)).astype(np.float32)
    for path in (tmp_path / "w.weights.h5", tmp_path / "w.safetensors"):
        target = build("cnn")
        target.load_weights(_saved(first, path))
        for a, b in zip(target.get_weights(), first.get_weights()):
            np.testing.assert_array_equal(a, b)
        _close(target.predict(x, verbose=0), first.predict(x, verbose=0))


def _saved(model, path):
    model.save_weights(path)
    return path


def test_a_frozen_layer_keeps_keras_variable_order(tmp_path, rng):
    """Keras numbers a layer's variables by how they were created, not by the layer's trainable flag."""
    model = build("cnn")
    _randomize(model, rng)
    model.layers[1].trainable = False  # BN: its weights are all non-trainable now, the order stays
    model.save_weights(tmp_path / "w.weights.h5")
    with h5py.File(tmp_path / "w.weights.h5", "r") as f:
        np.testing.assert_array_equal(f["layers/batch_normalization/vars/0"][()], model.layers[1].get_weights()[0])


def test_bfloat16_weights_round_trip_tagged_as_keras_does(tmp_path, rng):
    model = keras.Sequential([keras.Input((5,)), layers.Dense(3, dtype="bfloat16"), layers.Dense(2)])
    values = [rng.normal(size=w.shape).astype(np.float32) for w in model.weights]
    model.set_weights(values)
    model.save_weights(tmp_path / "w.weights.h5")
    with h5py.File(tmp_path / "w.weights.h5", "r") as f:
        assert f["layers/dense/vars/0"].attrs["dtype"] == "bfloat16"
    other = keras.Sequential([keras.Input((5,)), layers.Dense(3, dtype="bfloat16"), layers.Dense(2)])
    other.load_weights(tmp_path / "w.weights.h5")
    for a, b in zip(other.get_weights(), model.get_weights()):
        assert a.dtype == b.dtype and np.array_equal(a.astype(np.float32), b.astype(np.float32))
    # a float32 model reads the bfloat16 values exactly
    wide = keras.Sequential([keras.Input((5,)), layers.Dense(3), layers.Dense(2)])
    wide.load_weights(tmp_path / "w.weights.h5")
    assert np.array_equal(wide.get_weights()[0], model.get_weights()[0].astype(np.float32))


def test_keras_saves_are_atomic(tmp_path, rng, monkeypatch):
    model = build("cnn")
    model.save(tmp_path / "m.keras")
    model.save_weights(tmp_path / "w.weights.h5")
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}

    def boom(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)
    _randomize(model, rng)
    with pytest.raises(OSError, match="disk full"):
        model.save(tmp_path / "m.keras")
    with pytest.raises(OSError, match="disk full"):
        model.save_weights(tmp_path / "w.weights.h5")
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


def test_an_older_dnnbind_keras_file_still_loads(tmp_path, rng):
    """dnnbind 0.1 wrote its own zip (safetensors) under .keras names; it is told apart by its contents."""
    model = build("cnn")
    _randomize(model, rng)
    model.save(tmp_path / "m.dnnbind")
    os.replace(tmp_path / "m.dnnbind", tmp_path / "old.keras")
    loaded = keras.load_model(tmp_path / "old.keras")
    for a, b in zip(loaded.get_weights(), model.get_weights()):
        np.testing.assert_array_equal(a, b)
    other = build("cnn")
    other.load_weights(tmp_path / "old.keras")
    np.testing.assert_array_equal(other.get_weights()[0], model.get_weights()[0])
    # and a safetensors file that an older dnnbind wrote under a .weights.h5 name
    from safetensors.numpy import save_file

    saved = model.get_weights()
    save_file({w.path: w.numpy() for layer in model.layers for w in layer._weights}, str(tmp_path / "x.weights.h5"))
    _randomize(model, rng)
    model.load_weights(tmp_path / "x.weights.h5")  # keyed by the names, so into the model that wrote it
    for a, b in zip(model.get_weights(), saved):
        np.testing.assert_array_equal(a, b)


# ----- names that promise a format, and files that cannot be read ------------------------------------
def test_names_that_promise_another_format_are_refused(tmp_path):
    model = build("cnn")
    with pytest.raises(saving.SavingError, match="legacy Keras 2 HDF5 format, which dnnbind does not write"):
        model.save_weights(tmp_path / "w.h5")
    with pytest.raises(saving.SavingError, match="legacy Keras 2 HDF5 format"):
        model.save(tmp_path / "m.hdf5")
    with pytest.raises(saving.SavingError, match="names a whole Keras model; use model.save"):
        model.save_weights(tmp_path / "w.keras")
    with pytest.raises(saving.SavingError, match="names a weights file; use model.save_weights"):
        model.save(tmp_path / "m.weights.h5")
    assert os.listdir(tmp_path) == []
    model.save_weights(tmp_path / "w.weights.h5")
    with pytest.raises(saving.SavingError, match="is an HDF5 file: a legacy Keras 2 model .* or a weights file"):
        keras.load_model(tmp_path / "w.weights.h5")


def test_a_legacy_keras_2_file_is_refused_clearly(tmp_path):
    path = tmp_path / "old.h5"
    with h5py.File(path, "w") as f:
        f.attrs["layer_names"] = [b"dense"]
        f.attrs["keras_version"] = "2.15.0"
        f.create_group("dense").create_dataset("dense/kernel:0", data=np.ones((4, 3), np.float32))
    model = keras.Sequential([keras.Input((4,)), layers.Dense(3)])
    with pytest.raises(saving.SavingError, match="legacy Keras 2 HDF5 file, which dnnbind does not read"):
        model.load_weights(path)


def _h5_weights(path, tensors, link=None):
    with h5py.File(path, "w") as f:
        for key, value in tensors.items():
            f[key] = value
        if link is not None:
            link(f)


@pytest.mark.parametrize("tensors, link, message", [
    ({"layers/dense/vars/0": np.ones((4, 2), np.float32), "layers/dense/vars/1": np.ones(3, np.float32)}, None,
     r"'layers/dense/vars/0' has shape \(4, 2\) but weight 'kernel' of layer 'd' \(Dense\) needs \(4, 3\)"),
    ({"layers/dense/vars/0": np.ones((4, 3), np.int32), "layers/dense/vars/1": np.ones(3, np.float32)}, None,
     r"'layers/dense/vars/0' has dtype int32 but weight 'kernel' of layer 'd' \(Dense\) needs a float tensor"),
    ({"layers/dense/vars/0": np.ones((4, 3), np.float32)}, None,
     r"has no tensor 'layers/dense/vars/1' for weight 'bias' of layer 'd' \(Dense\)"),
    ({"layers/dense/vars/0": np.ones((4, 3), np.float32), "layers/dense/vars/1": np.ones(3, np.float32),
      "layers/dense/vars/2": np.ones(3, np.float32)}, None,
     r"layer 'd' \(Dense\) at 'layers/dense' has 2 weight\(s\) but the file holds more \('layers/dense/vars/2'\)"),
    ({"layers/dense/vars/0": np.ones((4, 3), np.float32)},
     lambda f: f["layers/dense/vars"].__setitem__("1", h5py.SoftLink("/layers/dense/vars/0")),
     "'layers/dense/vars/1' is a SoftLink; refusing to follow links"),
    ({"layers/dense/vars/0": np.ones((4, 3), np.float32)},
     lambda f: f["layers/dense/vars"].__setitem__("1", h5py.ExternalLink("/etc/passwd", "/x")),
     "'layers/dense/vars/1' is a ExternalLink; refusing to follow links"),
    ({"vars/0": np.ones(1, np.float32)}, None, "has no 'layers' group: it is not a Keras 3 weights file"),
])
def test_bad_weights_files_change_nothing(tmp_path, tensors, link, message):
    model = keras.Sequential([keras.Input((4,)), layers.Dense(3, name="d")])
    before = model.get_weights()
    path = tmp_path / "bad.weights.h5"
    _h5_weights(path, tensors, link)
    with pytest.raises(saving.SavingError, match=message):
        model.load_weights(path)
    for a, b in zip(model.get_weights(), before):
        np.testing.assert_array_equal(a, b)


def test_truncated_keras_files_are_refused(tmp_path):
    model = keras.Sequential([keras.Input((4,)), layers.Dense(3, name="d")])
    model.save_weights(tmp_path / "w.weights.h5")
    data = (tmp_path / "w.weights.h5").read_bytes()
    (tmp_path / "w.weights.h5").write_bytes(data[: len(data) // 2])
    with pytest.raises(saving.SavingError, match="is not a valid HDF5 file"):
        model.load_weights(tmp_path / "w.weights.h5")
    model.save(tmp_path / "m.keras")
    data = (tmp_path / "m.keras").read_bytes()
    (tmp_path / "m.keras").write_bytes(data[:-40])
    with pytest.raises(saving.SavingError, match="not a dnnbind model file .* nor a Keras 3 .keras file"):
        keras.load_model(tmp_path / "m.keras")


def _keras_zip(path, config, weights_from=None):
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("metadata.json", json.dumps({"keras_version": "3.15.1"}))
        zf.writestr("config.json", json.dumps(config))
        if weights_from is not None:
            with zipfile.ZipFile(weights_from) as src:
                zf.writestr("model.weights.h5", src.read("model.weights.h5"))


def _config_of(path):
    with zipfile.ZipFile(path) as zf:
        return json.loads(zf.read("config.json"))


@pytest.mark.parametrize("change, message", [
    (lambda c: c["layers"][1]["config"].update(quantization_config={"class_name": "Int8QuantizationConfig"}),
     r"layers\[1\] \(Dense 'd'\): quantization_config=.* is not supported by dnnbind \(only None\)"),
    (lambda c: c["layers"][1].update(class_name="MaxNumBoundingBoxes"),
     r"layers\[1\]: Keras layer 'MaxNumBoundingBoxes' is not supported by dnnbind"),
    (lambda c: c["layers"][1].update(module="my_package", registered_name="Custom>Dense"),
     r"layers\[1\]: 'Dense' \(module 'my_package', registered_name 'Custom>Dense'\) is a custom layer that is "
     r"not registered: decorate its class with @keras.saving.register_keras_serializable\(\), or load with "
     r"custom_objects=\{'Custom>Dense': Dense\}"),
    (lambda c: c["layers"][1]["config"].update(dtype={"module": "keras", "class_name": "DTypePolicy",
                                                      "config": {"name": "int8_from_float32"}}),
     r"Dense 'd'\): dtype policy 'int8_from_float32' is not supported"),
    (lambda c: c["layers"][1]["config"].update(units=-2), r"Dense 'd': units must be a positive int, got -2"),
    (lambda c: c["layers"][0]["config"].update(batch_shape=[None, 2**40]), r"needs .* bytes"),
])
def test_keras_configs_dnnbind_cannot_honour_are_refused(tmp_path, change, message):
    model = keras.Sequential([keras.Input((4,)), layers.Dense(3, name="d")])
    model.save(tmp_path / "m.keras")
    config = _config_of(tmp_path / "m.keras")
    change(config["config"])
    _keras_zip(tmp_path / "bad.keras", config, tmp_path / "m.keras")
    with pytest.raises((saving.SavingError, MemoryError), match=message):
        keras.load_model(tmp_path / "bad.keras")


def test_a_compile_config_dnnbind_lacks_loads_the_model_uncompiled(tmp_path):
    model = keras.Sequential([keras.Input((4,)), layers.Dense(3, name="d")])
    model.save(tmp_path / "m.keras")
    config = _config_of(tmp_path / "m.keras")
    config["compile_config"] = {"optimizer": {"module": "keras.optimizers", "class_name": "Muon",
                                              "config": {"learning_rate": 0.01}, "registered_name": None},
                                "loss": "mse", "metrics": None}
    _keras_zip(tmp_path / "muon.keras", config, tmp_path / "m.keras")
    with pytest.warns(UserWarning, match="loaded uncompiled; its Keras compile config cannot be reproduced"):
        loaded = keras.load_model(tmp_path / "muon.keras")
    assert not loaded.compiled
    np.testing.assert_array_equal(loaded.get_weights()[0], model.get_weights()[0])


def test_without_h5py_the_error_says_what_to_install(tmp_path, monkeypatch):
    model = keras.Sequential([keras.Input((4,)), layers.Dense(3)])
    monkeypatch.setitem(sys.modules, "h5py", None)
    with pytest.raises(ImportError, match=r"needs h5py .* pip install 'dnnbind\[keras\]'"):
        model.save(tmp_path / "m.keras")
    with pytest.raises(ImportError, match=r"pip install 'dnnbind\[keras\]'"):
        model.save_weights(tmp_path / "w.weights.h5")
    assert os.listdir(tmp_path) == []
    model.save_weights(tmp_path / "w.safetensors")  # the native format needs nothing more


def test_a_functional_model_with_two_inputs_and_named_outputs_round_trips(tmp_path, rng):
    p, q = keras.Input((4,), name="p"), keras.Input((4,), name="q")
    hidden = layers.Dense(3, activation="tanh")(layers.Add()([p, q]))
    model = keras.Model([p, q], {"out": layers.Dense(2)(hidden)})
    _randomize(model, rng)
    model.save(tmp_path / "two.keras")
    config = _config_of(tmp_path / "two.keras")
    assert config["class_name"] == "Functional" and config["registered_name"] == "Functional"
    assert config["config"]["input_layers"] == [["p", 0, 0], ["q", 0, 0]]  # Keras's forms: a list, a dict
    assert list(config["config"]["output_layers"]) == ["out"]
    add = next(e for e in config["config"]["layers"] if e["class_name"] == "Add")
    assert [t["config"]["keras_history"][0] for t in add["inbound_nodes"][0]["args"][0]] == ["p", "q"]
    loaded = keras.load_model(tmp_path / "two.keras")
    xs = [rng.normal(size=(5, 4)).astype(np.float32) for _ in range(2)]
    expected, actual = model.predict(xs, verbose=0), loaded.predict(xs, verbose=0)
    expected, actual = (r["out"] if isinstance(r, dict) else r for r in (expected, actual))
    _close(actual, expected)


def test_a_subclassed_model_is_refused_by_whole_model_formats(tmp_path):
    class Tiny(keras.Model):
        def __init__(self):
            super().__init__()
            self.dense = layers.Dense(2)

        def call(self, x):
            return self.dense(x)

    model = Tiny()
    model(np.ones((1, 3), np.float32))
    for name in ("m.keras", "m.dnnbind"):
        with pytest.raises(saving.SavingError, match="is subclassed"):
            model.save(tmp_path / name)
    assert os.listdir(tmp_path) == []
    model.save_weights(tmp_path / "w.weights.h5")  # weights are positional: a new instance reads them
    other = Tiny()
    other(np.ones((1, 3), np.float32))
    other.load_weights(tmp_path / "w.weights.h5")
    np.testing.assert_array_equal(other.get_weights()[0], model.get_weights()[0])
