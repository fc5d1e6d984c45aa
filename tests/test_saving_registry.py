"""``keras.saving``'s registry (``register_keras_serializable``, ``CustomObjectScope``, ``get_registered_*``) and
``serialize_keras_object`` / ``deserialize_keras_object``: as Keras 3 behaves, and wired into dnnbind's files, so a
user's registered layer round-trips through ``.keras`` (both ways with real Keras) and ``.dnnbind`` files."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

import dnnbind as keras
from dnnbind import _keras_objects, layers, ops, saving

needs_keras = pytest.mark.skipif(importlib.util.find_spec("keras") is None or importlib.util.find_spec("h5py") is None,
                                 reason="needs Keras and h5py installed (test extra)")


@pytest.fixture(autouse=True)
def clean_registry():
    before = dict(_keras_objects.GLOBAL_CUSTOM_OBJECTS), dict(_keras_objects.GLOBAL_CUSTOM_NAMES)
    yield
    _keras_objects.GLOBAL_CUSTOM_OBJECTS.clear()
    _keras_objects.GLOBAL_CUSTOM_OBJECTS.update(before[0])
    _keras_objects.GLOBAL_CUSTOM_NAMES.clear()
    _keras_objects.GLOBAL_CUSTOM_NAMES.update(before[1])


class Scale(layers.Layer):
    """Multiplies by a trainable vector (created in build) and adds a constant from its config."""

    def __init__(self, offset=0.0, **kwargs):
        super().__init__(**kwargs)
        self.offset = offset

    def build(self, input_shape):
        self.w = self.add_weight(shape=(input_shape[-1],), initializer="ones", name="w")

    def call(self, x):
        return x * self.w + self.offset

    def get_config(self):
        return {**super().get_config(), "offset": self.offset}


def test_registration_names_and_lookups_as_keras():
    registered = saving.register_keras_serializable("my_pkg")(Scale)
    assert registered is Scale
    assert saving.get_registered_name(Scale) == "my_pkg>Scale"
    assert saving.get_registered_object("my_pkg>Scale") is Scale
    assert saving.get_custom_objects()["my_pkg>Scale"] is Scale
    assert saving.get_registered_name(layers.Dense) == "Dense"
    assert saving.get_registered_object("nothing") is None
    assert saving.get_registered_object("x", custom_objects={"x": 1}) == 1
    assert saving.get_registered_object("y", module_objects={"y": 2}) == 2
    keras.utils.register_keras_serializable(name="Other")(Scale)
    assert saving.get_registered_name(Scale) == "Custom>Other"
    with pytest.raises(ValueError, match="does not have a get_config"):
        saving.register_keras_serializable()(type("NoConfig", (), {}))
    with pytest.raises(TypeError, match="package and name must be strings"):
        saving.register_keras_serializable(3)


def test_custom_object_scope_nests_replaces_and_is_per_thread():
    assert saving.get_registered_object("a") is None
    with keras.utils.custom_object_scope({"a": 1}) as scope:
        assert isinstance(scope, saving.CustomObjectScope)
        assert saving.get_registered_object("a") == 1
        with saving.CustomObjectScope({"b": 2}):
            assert saving.get_registered_object("b") == 2 and saving.get_registered_object("a") is None
        assert saving.get_registered_object("a") == 1
        seen = []
        thread = threading.Thread(target=lambda: seen.append(saving.get_registered_object("a")))
        thread.start()
        thread.join()
        assert seen == [None]
    assert saving.get_registered_object("a") is None
    with pytest.raises(TypeError, match="must map names"):
        saving.CustomObjectScope({1: Scale})


def _model(seed=0):
    rng = np.random.default_rng(seed)
    model = keras.Sequential([keras.Input((3,)), Scale(offset=0.5, name="scale"), layers.Dense(2, name="d")])
    model.layers[0].w.assign(rng.normal(size=3).astype("float32"))
    return model


@pytest.mark.parametrize("suffix", [".keras", ".dnnbind"])
def test_a_registered_custom_layer_round_trips_through_files(tmp_path, suffix):
    saving.register_keras_serializable("my_pkg")(Scale)
    model = _model()
    x = np.random.default_rng(1).normal(size=(4, 3)).astype("float32")
    path = tmp_path / f"m{suffix}"
    model.save(path)
    loaded = keras.load_model(path)
    assert type(loaded.layers[0]) is Scale and loaded.layers[0].offset == 0.5
    np.testing.assert_allclose(ops.convert_to_numpy(loaded(x)), ops.convert_to_numpy(model(x)), rtol=1e-6)


def test_an_unregistered_custom_layer_needs_custom_objects(tmp_path):
    model = _model()
    path = tmp_path / "m.keras"
    model.save(path)
    with pytest.raises(saving.SavingError, match=r"'Scale' .* is a custom layer that is not registered.*"
                                                 r"custom_objects=\{'Scale': Scale\}"):
        keras.load_model(path)
    x = np.ones((2, 3), "float32")
    for loaded in (keras.load_model(path, custom_objects={"Scale": Scale}),
                   keras.saving.load_model(path, {"Scale": Scale}, compile=False)):
        np.testing.assert_allclose(ops.convert_to_numpy(loaded(x)), ops.convert_to_numpy(model(x)), rtol=1e-6)
    with saving.custom_object_scope({"Scale": Scale}):
        keras.load_model(path)
    config = {"class_name": "Sequential", "config": model.get_config()}
    assert type(keras.models.model_from_config(config, custom_objects={"Scale": Scale}).layers[0]) is Scale
    with pytest.raises(TypeError, match="custom_objects must be a dict"):
        keras.load_model(path, ["Scale"])


def test_serialize_and_deserialize_objects():
    s, d = saving.serialize_keras_object, saving.deserialize_keras_object
    assert s(None) is None and s(3) == 3 and s((1, [2])) == (1, [2])
    assert s(b"ab") == {"class_name": "__bytes__", "config": {"value": "ab"}} and d(s(b"ab")) == b"ab"
    assert d(s(slice(1, None, 2))) == slice(1, None, 2) and d(s(Ellipsis)) is Ellipsis
    arr = np.arange(6, dtype="float32").reshape(2, 3)
    back = d(s(arr))
    assert back.dtype == np.float32 and np.array_equal(back, arr)
    adam = s(keras.optimizers.Adam(0.25, beta_1=0.8))
    assert adam["module"] == "keras.optimizers" and adam["class_name"] == "Adam" and adam["registered_name"] is None
    opt = d(adam)
    assert isinstance(opt, keras.optimizers.Adam) and opt.beta_1 == 0.8 and opt.learning_rate == 0.25
    assert d(s(keras.initializers.GlorotUniform(seed=3))).seed == 3
    dense = d(s(layers.Dense(4, activation="relu", name="dd")))
    assert isinstance(dense, layers.Dense) and dense.units == 4 and dense.name == "dd"
    assert d(s(keras.activations.relu)) is keras.activations.relu
    saving.register_keras_serializable("my_pkg")(Scale)
    entry = s(Scale(offset=2.0))
    assert entry["registered_name"] == "my_pkg>Scale" and entry["module"] == __name__
    assert d(entry).offset == 2.0
    with pytest.raises(TypeError, match="Could not locate class 'Nope'"):
        d({"module": "elsewhere", "class_name": "Nope", "config": {}, "registered_name": "x>Nope"})
    with pytest.raises(ValueError, match="never loads code"):
        d({"class_name": "__lambda__", "config": {"value": "AAAA"}})
    with pytest.raises(ValueError, match="lambda cannot be serialized"):
        s(lambda x: x)


_KERAS_SIDE = textwrap.dedent("""
    import sys, numpy as np, keras
    work = sys.argv[1]

    @keras.saving.register_keras_serializable("my_pkg")
    class Scale(keras.layers.Layer):
        def __init__(self, offset=0.0, **kwargs):
            super().__init__(**kwargs)
            self.offset = offset
        def build(self, input_shape):
            self.w = self.add_weight(shape=(input_shape[-1],), initializer="ones", name="w")
        def call(self, x):
            return x * self.w + self.offset
        def get_config(self):
            return {**super().get_config(), "offset": self.offset}

    x = np.linspace(-1, 1, 12, dtype="float32").reshape(4, 3)
    theirs = keras.Sequential([keras.Input((3,)), Scale(offset=0.25, name="scale"), keras.layers.Dense(2, name="d")])
    theirs.layers[0].w.assign(np.array([0.5, -2.0, 3.0], "float32"))
    theirs.save(work + "/keras_made.keras")
    np.save(work + "/keras_made.npy", np.asarray(theirs.predict(x, verbose=0)))
    ours = keras.saving.load_model(work + "/dnnbind_made.keras")
    assert type(ours.layers[0]) is Scale, type(ours.layers[0])
    np.save(work + "/dnnbind_made_in_keras.npy", np.asarray(ours.predict(x, verbose=0)))
""")


@needs_keras
def test_a_registered_custom_layer_crosses_to_and_from_keras(tmp_path):
    saving.register_keras_serializable("my_pkg")(Scale)
    x = np.linspace(-1, 1, 12, dtype="float32").reshape(4, 3)
    _model(seed=5).save(tmp_path / "dnnbind_made.keras")
    env = {k: v for k, v in os.environ.items() if k not in ("KERAS_HOME", "KERAS_BACKEND")}
    env.update(KERAS_HOME=str(tmp_path / "kh"), KERAS_BACKEND="numpy")
    proc = subprocess.run([sys.executable, "-c", _KERAS_SIDE, str(tmp_path)], capture_output=True, text=True,
                          timeout=180, env=env, cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    loaded = keras.load_model(tmp_path / "keras_made.keras")
    assert type(loaded.layers[0]) is Scale and loaded.layers[0].offset == 0.25
    np.testing.assert_allclose(ops.convert_to_numpy(loaded(x)), np.load(tmp_path / "keras_made.npy"), rtol=1e-5,
                               atol=1e-6)
    ours = keras.load_model(tmp_path / "dnnbind_made.keras")
    np.testing.assert_allclose(np.load(tmp_path / "dnnbind_made_in_keras.npy"), ops.convert_to_numpy(ours(x)),
                               rtol=1e-5, atol=1e-6)
