"""``keras.models.clone_model`` (Keras 3's signature and rules) on the NumPy backend: new layers with fresh
weights, the structure kept (shared layers stay shared, nested models), ``clone_function``,
``call_function``, ``input_tensors``, ``recursive``, the compile settings, and the errors."""

from __future__ import annotations

import numpy as np
import pytest

import dnnbind as keras
from dnnbind import layers

pytestmark = pytest.mark.usefixtures("cpu")


def _weights_differ(a, b):
    return any(not np.allclose(x, y) for x, y in zip(a.get_weights(), b.get_weights()) if x.size > 1)


def test_sequential_clone_has_fresh_weights_and_the_same_structure():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,), name="in"), layers.Dense(5, activation="relu", name="d1"),
                              layers.Dropout(0.2), layers.Dense(3, name="d2")], name="seq")
    model.compile(optimizer="adam", loss="mse", metrics=["mae"])
    clone = keras.models.clone_model(model)
    assert isinstance(clone, keras.Sequential) and clone.name == "seq"
    assert [type(layer).__name__ for layer in clone.layers] == ["Dense", "Dropout", "Dense"]
    assert [layer.name for layer in clone.layers] == [layer.name for layer in model.layers]
    assert all(c is not o for c, o in zip(clone.layers, model.layers))
    assert clone.input_shape == (None, 4) and clone.output_shape == (None, 3)
    assert _weights_differ(clone, model)  # freshly initialised, not copied
    assert clone.layers[0].get_config() == model.layers[0].get_config()
    assert clone.compiled and clone.optimizer is not model.optimizer
    assert clone.get_compile_config()["loss"] == model.get_compile_config()["loss"]
    assert [m.name for m in clone.metrics] == [m.name for m in model.metrics]
    x = np.random.default_rng(0).normal(size=(6, 4)).astype("float32")
    clone.set_weights(model.get_weights())
    np.testing.assert_allclose(clone.predict(x, verbose=0), model.predict(x, verbose=0), rtol=1e-6)
    clone.fit(x, np.zeros((6, 3), "float32"), epochs=1, verbose=0)  # training the clone leaves the model alone
    assert _weights_differ(clone, model)


def test_functional_clone_keeps_shared_layers_and_nested_models():
    keras.utils.set_random_seed(1)
    tower_in = keras.Input((6,))
    tower = keras.Model(tower_in, layers.Dense(4, activation="tanh")(tower_in), name="tower")
    a, b = keras.Input((6,), name="a"), keras.Input((6,), name="b")
    shared = layers.Dense(6, name="shared")
    ta, tb = tower(shared(a)), tower(shared(b))
    out = layers.Dense(1, name="head")(layers.concatenate([ta, tb]))
    model = keras.Model([a, b], out, name="siamese")
    clone = keras.models.clone_model(model)
    assert clone.name == "siamese" and [t.name for t in clone.inputs] == ["a", "b"]
    assert [layer.name for layer in clone.layers] == [layer.name for layer in model.layers]
    assert clone.count_params() == model.count_params()
    # one clone per layer: the shared Dense and the tower are each applied twice in the clone too
    cloned_shared = clone.get_layer("shared")
    assert cloned_shared is not shared and len(cloned_shared._inbound_nodes) == 2
    assert clone.get_layer("tower") is not tower and len(clone.get_layer("tower").trainable_weights) == 2
    assert _weights_differ(clone, model)
    rng = np.random.default_rng(0)
    xa, xb = rng.normal(size=(3, 6)).astype("float32"), rng.normal(size=(3, 6)).astype("float32")
    clone.set_weights(model.get_weights())
    np.testing.assert_allclose(clone.predict([xa, xb], verbose=0), model.predict([xa, xb], verbose=0), rtol=1e-6)
    # recursive: the nested model is cloned by clone_model (a functional model again, its layers new)
    deep = keras.models.clone_model(model, recursive=True)
    assert isinstance(deep.get_layer("tower"), keras.Model) and deep.get_layer("tower") is not tower


def test_clone_function_call_function_and_input_tensors():
    keras.utils.set_random_seed(2)
    inp = keras.Input((5,))
    model = keras.Model(inp, layers.Dense(2, name="out")(layers.Dense(4, name="hidden")(inp)))
    same = keras.models.clone_model(model, clone_function=lambda layer: layer)  # reuse the layers
    assert same.get_layer("hidden") is model.get_layer("hidden")
    seen = []

    def call_function(layer, *args, **kwargs):
        seen.append(layer.name)
        out = layer(*args, **kwargs)
        return layers.Dropout(0.5)(out) if layer.name == "hidden" else out

    wrapped = keras.models.clone_model(model, call_function=call_function)
    assert seen == ["hidden", "out"]
    assert [type(layer).__name__ for layer in wrapped.layers] == ["InputLayer", "Dense", "Dropout", "Dense"]
    given = keras.Input((5,), name="given")
    on_given = keras.models.clone_model(model, input_tensors=given)
    assert on_given.inputs[0] is given

    def renamed(layer):
        config = layer.get_config()
        config["name"] = "c_" + config["name"]
        return layer.__class__.from_config(config)

    assert [layer.name for layer in keras.models.clone_model(model, clone_function=renamed).layers[1:]] == [
        "c_hidden", "c_out"]


def test_clone_model_errors():
    inp = keras.Input((3,))
    model = keras.Model(inp, layers.Dense(1)(inp))
    seq = keras.Sequential([keras.Input((3,)), layers.Dense(1)])
    with pytest.raises(ValueError, match="`call_function` argument is not supported with Sequential"):
        keras.models.clone_model(seq, call_function=lambda layer, *a, **k: layer(*a, **k))
    with pytest.raises(ValueError, match="unexpected keyword argument"):
        keras.models.clone_model(model, share_weights=True)
    with pytest.raises(ValueError, match="to be a callable"):
        keras.models.clone_model(model, clone_function="copy")
    with pytest.raises(ValueError, match="structure of model.input"):
        keras.models.clone_model(model, input_tensors=[keras.Input((3,)), keras.Input((3,))])
    with pytest.raises(ValueError, match="must be KerasTensors"):
        keras.models.clone_model(model, input_tensors=np.zeros((1, 3)))
    with pytest.raises(TypeError, match="expected a keras Model"):
        keras.models.clone_model(layers.Dense(2))

    class Sub(keras.Model):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.d = layers.Dense(2)

        def call(self, x):
            return self.d(x)

    sub = Sub(name="sub")
    with pytest.raises(ValueError, match="only supported for Sequential models or Functional models"):
        keras.models.clone_model(sub, clone_function=lambda layer: layer)
    again = keras.models.clone_model(sub)  # type(model).from_config(model.get_config())
    assert type(again) is Sub and again.name == "sub" and again is not sub
