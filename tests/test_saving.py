"""Saving and loading: safetensors weights, whole models (zip and directory), optimizer resume,
atomic writes, and the errors for corrupt or mismatched files."""

from __future__ import annotations

import json
import os
import zipfile

import numpy as np
import pytest

import dnnbind as keras
from dnnbind import layers, saving


pytestmark = pytest.mark.usefixtures("cpu")  # the NumPy backend (conftest.py)


def convnet(seed=0):
    init = keras.initializers.GlorotUniform
    return keras.Sequential([
        keras.Input((6, 6, 2)),
        layers.Conv2D(4, 3, padding="same", activation="relu", kernel_initializer=init(seed), name="conv2d"),
        layers.BatchNormalization(name="batch_normalization"),
        layers.MaxPooling2D(),
        layers.Flatten(),
        layers.Dropout(0.2),
        layers.Dense(3, activation="softmax", kernel_initializer=init(seed + 1), name="dense"),
    ])


@pytest.fixture
def trained(rng):
    x = rng.normal(size=(32, 6, 6, 2)).astype(np.float32)
    y = rng.integers(0, 3, 32)
    model = convnet()
    model.compile(keras.optimizers.Adam(0.01), "sparse_categorical_crossentropy", metrics=["accuracy"])
    model.fit(x, y, epochs=2, batch_size=8, verbose=0)
    return model, x, y


def test_weights_round_trip_keyed_by_position(trained, tmp_path):
    model, x, _ = trained
    path = tmp_path / "w.safetensors"
    model.save_weights(path)
    from safetensors.numpy import load_file

    tensors = load_file(str(path))
    # Keras 3's keys: layers in model order under their class's snake-case name, weights numbered
    assert set(tensors) == {"layers/conv2d/vars/0", "layers/conv2d/vars/1", *(f"layers/batch_normalization/vars/{i}"
                                                                              for i in range(4)),
                            "layers/dense/vars/0", "layers/dense/vars/1"}
    assert tensors["layers/conv2d/vars/0"].shape == (3, 3, 2, 4)  # Keras layout
    np.testing.assert_array_equal(tensors["layers/batch_normalization/vars/3"], model.layers[1].get_weights()[3])
    other = convnet(seed=7)
    assert not np.allclose(other.predict(x, verbose=0), model.predict(x, verbose=0))
    other.load_weights(path)
    assert np.array_equal(other.predict(x, verbose=0), model.predict(x, verbose=0))


def test_weights_keyed_by_layer_name_are_still_read(trained, tmp_path):
    """Files of dnnbind 0.1 (``conv2d/kernel``) load by name."""
    model, x, _ = trained
    from safetensors.numpy import save_file

    path = tmp_path / "old.safetensors"
    save_file({w.path: w.numpy() for layer in model.layers for w in layer._weights}, str(path))
    other = convnet(seed=7)
    other.load_weights(path)
    assert np.array_equal(other.predict(x, verbose=0), model.predict(x, verbose=0))


@pytest.mark.parametrize("name", ["model.dnnbind", "model.keras", "model_dir"])
def test_full_model_round_trip(trained, tmp_path, name):
    model, x, y = trained
    path = tmp_path / name
    if name.endswith("keras"):
        pytest.importorskip("h5py", reason="the Keras format needs h5py: pip install 'dnnbind[keras]'")
        with pytest.warns(UserWarning, match="holds no optimizer state"):
            model.save(path)
        with zipfile.ZipFile(path) as zf:
            assert set(zf.namelist()) == {"metadata.json", "config.json", "model.weights.h5"}
    else:
        model.save(path)
    if name.endswith("dnnbind"):
        with zipfile.ZipFile(path) as zf:
            assert set(zf.namelist()) == {"config.json", "model.safetensors", "optimizer.safetensors"}
            assert not any(n.endswith((".pkl", ".pickle")) for n in zf.namelist())
    elif name.endswith("dir"):
        manifest = json.loads((path / "manifest.json").read_text())
        parts = manifest["files"]
        assert sorted(parts) == ["config.json", "model.safetensors", "optimizer.safetensors"]
        assert sorted(os.listdir(path)) == sorted(["manifest.json", *(e["file"] for e in parts.values())])
        assert parts["model.safetensors"]["size"] == (path / parts["model.safetensors"]["file"]).stat().st_size
    loaded = keras.load_model(path)
    assert [type(layer).__name__ for layer in loaded.layers] == [type(layer).__name__ for layer in model.layers]
    assert [layer.name for layer in loaded.layers] == [layer.name for layer in model.layers]
    assert np.array_equal(loaded.predict(x, verbose=0), model.predict(x, verbose=0))
    assert loaded.evaluate(x, y, verbose=0) == pytest.approx(model.evaluate(x, y, verbose=0))
    assert type(loaded.optimizer) is type(model.optimizer)


def test_resume_with_optimizer_state(trained, tmp_path):
    model, x, y = trained
    model.save(tmp_path / "m.dnnbind")
    loaded = keras.load_model(tmp_path / "m.dnnbind")
    assert loaded.optimizer.iterations == model.optimizer.iterations == 8
    xb, yb = x[:8], y[:8]
    # dropout makes training random: compare one step with dropout off in both models
    for m in (model, loaded):
        m.layers[4].rate = 0.0
    model.train_on_batch(xb, yb)
    loaded.train_on_batch(xb, yb)
    for a, b in zip(model.get_weights(), loaded.get_weights()):
        assert np.allclose(a, b, rtol=1e-6, atol=1e-7)
    # without the state, Adam restarts (step 1) and the weights differ
    model.save(tmp_path / "no_opt.dnnbind", include_optimizer=False)
    fresh = keras.load_model(tmp_path / "no_opt.dnnbind")
    assert fresh.optimizer.iterations == 0


def test_atomic_write_leaves_nothing_on_failure(trained, tmp_path, monkeypatch):
    model, _, _ = trained
    target = tmp_path / "m.dnnbind"
    model.save(target)
    before = target.read_bytes()
    directory = tmp_path / "d"
    model.save(directory)
    files_before = {p.name: p.read_bytes() for p in directory.iterdir()}

    def boom(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError, match="disk full"):
        model.save(target)
    with pytest.raises(OSError, match="disk full"):
        model.save_weights(tmp_path / "w.safetensors")
    with pytest.raises(OSError, match="disk full"):
        model.save(directory)
    assert sorted(os.listdir(tmp_path)) == ["d", "m.dnnbind"]
    assert target.read_bytes() == before
    assert {p.name: p.read_bytes() for p in directory.iterdir()} == files_before


def test_corrupt_files_give_clear_errors(trained, tmp_path):
    model, _, _ = trained
    bad = tmp_path / "bad.dnnbind"
    bad.write_bytes(b"this is not a zip")
    with pytest.raises(saving.SavingError, match="not a dnnbind model file"):
        keras.load_model(bad)
    w = tmp_path / "w.safetensors"
    model.save_weights(w)
    w.write_bytes(w.read_bytes()[:50])
    with pytest.raises(saving.SavingError, match="not a valid safetensors file"):
        model.load_weights(w)
    with pytest.raises(FileNotFoundError):
        keras.load_model(tmp_path / "missing.dnnbind")
    d = tmp_path / "d"
    model.save(d)
    parts = json.loads((d / "manifest.json").read_text())["files"]
    (d / parts["model.safetensors"]["file"]).unlink()
    with pytest.raises(saving.SavingError, match="is missing but manifest.json lists it as model.safetensors"):
        keras.load_model(d)
    # the first directory layout (plain names, no manifest) is still read, and its errors stay clear
    legacy = tmp_path / "legacy"
    model.save(tmp_path / "m.dnnbind")
    with zipfile.ZipFile(tmp_path / "m.dnnbind") as zf:
        zf.extractall(legacy)
    assert np.array_equal(keras.load_model(legacy).get_weights()[0], model.get_weights()[0])
    (legacy / "config.json").write_text("{nope")
    with pytest.raises(saving.SavingError, match="config.json is corrupt"):
        keras.load_model(legacy)
    with pytest.raises(saving.SavingError, match="has no manifest.json"):
        keras.load_model(tmp_path)


def test_mismatched_weights_name_the_layer(trained, tmp_path, rng):
    model, _, _ = trained
    w = tmp_path / "w.safetensors"
    model.save_weights(w)
    wider = keras.Sequential([keras.Input((6, 6, 2)), layers.Conv2D(5, 3, padding="same", name="wide")])
    with pytest.raises(saving.SavingError, match="'layers/conv2d/vars/0' has shape \\(3, 3, 2, 4\\) but weight "
                                                 "'kernel' of layer 'wide' \\(Conv2D\\) needs \\(3, 3, 2, 5\\)"):
        wider.load_weights(w)
    two_dense = keras.Sequential([keras.Input((3, 3, 4)), layers.Flatten(), layers.Dense(3), layers.Dense(2, name="d2")])
    with pytest.raises(saving.SavingError, match="no tensor 'layers/dense_1/vars/0' for weight 'kernel' of layer "
                                                 "'d2' \\(Dense\\): the model does not match"):
        two_dense.load_weights(w)
    no_bias = keras.Sequential([keras.Input((6, 6, 2)), layers.Conv2D(4, 3, padding="same", use_bias=False)])
    with pytest.raises(saving.SavingError, match="layer '.*' \\(Conv2D\\) at 'layers/conv2d' has 1 weight\\(s\\) "
                                                 "but the file holds more \\('layers/conv2d/vars/1'\\)"):
        no_bias.load_weights(w)


def test_config_json_is_plain_json(trained, tmp_path):
    model, _, _ = trained
    model.save(tmp_path / "d")
    manifest = json.loads((tmp_path / "d" / "manifest.json").read_text())
    config = json.loads((tmp_path / "d" / manifest["files"]["config.json"]["file"]).read_text())
    assert config["class_name"] == "Sequential"
    assert config["compile_config"]["loss"]["class_name"] == "SparseCategoricalCrossentropy"
    assert [layer["class_name"] for layer in config["config"]["layers"]][:2] == ["InputLayer", "Conv2D"]
