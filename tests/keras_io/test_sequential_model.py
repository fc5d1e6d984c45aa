"""The Sequential model

Source: keras-io guides/sequential_model.py (Keras 3 text: guides/keras_core/sequential_model.py)

Changes:
- None to the guide's code (run section by section); the values it prints (``len(model.layers)``, the
  number of weights, the summaries' output shapes) are asserted instead.
- "Feature extraction with a Sequential model" is skipped: it needs ``Sequential.inputs`` and the
  ``.output`` of the layers of a Sequential (Keras 3 builds a functional graph inside every Sequential
  given an ``Input``); dnnbind's Sequential runs its layers directly and has neither.
- The first transfer-learning blueprint (shown in the guide as a code block, not run there) is run on
  seeded random data without ``load_weights(...)`` (no pre-trained file), and ``keras.Input(shape=(784))``
  is written ``shape=(784,)``; the second (Xception from ``keras.applications``) is left out: dnnbind has no
  ``keras.applications``.
"""

import numpy as np
import pytest

import dnnbind as keras
from dnnbind import layers
from dnnbind import ops

SOURCE = "guides/sequential_model.py"
UNCHANGED = False
CHANGES = ("the feature-extraction section cannot run: dnnbind's Sequential has no .inputs and its layers no .output "
           "(Keras 3 keeps a functional graph inside a Sequential built from an Input); the rest runs as published")


@pytest.fixture(autouse=True)
def _cpu(cpu):
    yield


def _summary(model):
    lines = []
    model.summary(print_fn=lines.append)
    return "\n".join(lines)


def test_when_to_use_a_sequential_model():
    # Define Sequential model with 3 layers
    model = keras.Sequential(
        [
            layers.Dense(2, activation="relu", name="layer1"),
            layers.Dense(3, activation="relu", name="layer2"),
            layers.Dense(4, name="layer3"),
        ]
    )
    # Call model on a test input
    x = ops.ones((3, 3))
    y = model(x)
    assert y.shape == (3, 4)

    # Create 3 layers
    layer1 = layers.Dense(2, activation="relu", name="layer1")
    layer2 = layers.Dense(3, activation="relu", name="layer2")
    layer3 = layers.Dense(4, name="layer3")

    # Call layers on a test input
    x = ops.ones((3, 3))
    y = layer3(layer2(layer1(x)))
    assert y.shape == (3, 4)

    # the same computation: the model with the three layers' weights gives the same output
    model.set_weights(layer1.get_weights() + layer2.get_weights() + layer3.get_weights())
    np.testing.assert_allclose(np.asarray(model(x)), np.asarray(y), rtol=1e-6)


def test_creating_a_sequential_model():
    model = keras.Sequential(
        [
            layers.Dense(2, activation="relu"),
            layers.Dense(3, activation="relu"),
            layers.Dense(4),
        ]
    )
    assert len(model.layers) == 3

    model = keras.Sequential()
    model.add(layers.Dense(2, activation="relu"))
    model.add(layers.Dense(3, activation="relu"))
    model.add(layers.Dense(4))

    model.pop()
    print(len(model.layers))  # 2
    assert len(model.layers) == 2

    model = keras.Sequential(name="my_sequential")
    model.add(layers.Dense(2, activation="relu", name="layer1"))
    model.add(layers.Dense(3, activation="relu", name="layer2"))
    model.add(layers.Dense(4, name="layer3"))
    assert model.name == "my_sequential" and [l.name for l in model.layers] == ["layer1", "layer2", "layer3"]


def test_specifying_the_input_shape_in_advance():
    layer = layers.Dense(3)
    assert layer.weights == []  # Empty

    # Call layer on a test input
    x = ops.ones((1, 4))
    y = layer(x)
    assert [tuple(w.shape) for w in layer.weights] == [(4, 3), (3,)]  # Now it has weights

    model = keras.Sequential(
        [
            layers.Dense(2, activation="relu"),
            layers.Dense(3, activation="relu"),
            layers.Dense(4),
        ]
    )  # No weights at this stage!

    # At this point, you can't do this:
    # model.weights
    # You also can't do this:
    # model.summary()
    assert not model.built

    # Call the model on a test input
    x = ops.ones((1, 4))
    y = model(x)
    print("Number of weights after calling the model:", len(model.weights))  # 6
    assert len(model.weights) == 6

    model.summary()

    model = keras.Sequential()
    model.add(keras.Input(shape=(4,)))
    model.add(layers.Dense(2, activation="relu"))

    text = _summary(model)
    assert "(None, 2)" in text and "10" in text
    assert len(model.layers) == 1  # the Input is not a layer of the model


def test_a_common_debugging_workflow():
    model = keras.Sequential()
    model.add(keras.Input(shape=(250, 250, 3)))  # 250x250 RGB images
    model.add(layers.Conv2D(32, 5, strides=2, activation="relu"))
    model.add(layers.Conv2D(32, 3, activation="relu"))
    model.add(layers.MaxPooling2D(3))

    # Can you guess what the current output shape is at this point? Probably not.
    # Let's just print it:
    assert "(None, 40, 40, 32)" in _summary(model)

    # The answer was: (40, 40, 32), so we can keep downsampling...

    model.add(layers.Conv2D(32, 3, activation="relu"))
    model.add(layers.Conv2D(32, 3, activation="relu"))
    model.add(layers.MaxPooling2D(3))
    model.add(layers.Conv2D(32, 3, activation="relu"))
    model.add(layers.Conv2D(32, 3, activation="relu"))
    model.add(layers.MaxPooling2D(2))

    # And now?
    assert "(None, 4, 4, 32)" in _summary(model)

    # Now that we have 4x4 feature maps, time to apply global max pooling.
    model.add(layers.GlobalMaxPooling2D())

    # Finally, we add a classification layer.
    model.add(layers.Dense(10))
    assert model.output_shape == (None, 10)


@pytest.mark.skipif(not hasattr(keras.Sequential, "inputs"),
                    reason="dnnbind gap: Sequential.inputs and the .output of a Sequential's layers")
def test_feature_extraction_with_a_sequential_model():
    initial_model = keras.Sequential(
        [
            keras.Input(shape=(250, 250, 3)),
            layers.Conv2D(32, 5, strides=2, activation="relu"),
            layers.Conv2D(32, 3, activation="relu"),
            layers.Conv2D(32, 3, activation="relu"),
        ]
    )
    feature_extractor = keras.Model(
        inputs=initial_model.inputs,
        outputs=[layer.output for layer in initial_model.layers],
    )

    # Call feature extractor on test input.
    x = ops.ones((1, 250, 250, 3))
    features = feature_extractor(x)
    assert [tuple(f.shape) for f in features] == [(1, 123, 123, 32), (1, 121, 121, 32), (1, 119, 119, 32)]
    np.testing.assert_allclose(np.asarray(features[-1]), np.asarray(initial_model(x)), rtol=1e-5, atol=1e-6)

    initial_model = keras.Sequential(
        [
            keras.Input(shape=(250, 250, 3)),
            layers.Conv2D(32, 5, strides=2, activation="relu"),
            layers.Conv2D(32, 3, activation="relu", name="my_intermediate_layer"),
            layers.Conv2D(32, 3, activation="relu"),
        ]
    )
    feature_extractor = keras.Model(
        inputs=initial_model.inputs,
        outputs=initial_model.get_layer(name="my_intermediate_layer").output,
    )
    # Call feature extractor on test input.
    x = ops.ones((1, 250, 250, 3))
    features = feature_extractor(x)
    assert tuple(features.shape) == (1, 121, 121, 32)


def test_transfer_learning_with_a_sequential_model():
    rng = np.random.default_rng(0)
    model = keras.Sequential([
        keras.Input(shape=(784,)),
        layers.Dense(32, activation='relu'),
        layers.Dense(32, activation='relu'),
        layers.Dense(32, activation='relu'),
        layers.Dense(10),
    ])

    # Freeze all layers except the last one.
    for layer in model.layers[:-1]:
        layer.trainable = False

    frozen = [w.numpy().copy() for layer in model.layers[:-1] for w in layer.weights]
    last = [w.numpy().copy() for w in model.layers[-1].weights]
    # Recompile and train (this will only update the weights of the last layer).
    model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    x = rng.random((64, 784)).astype("float32")
    y = rng.integers(0, 10, 64)
    history = model.fit(x, y, epochs=3, batch_size=16, verbose=0)
    loss = history.history["loss"]
    assert np.all(np.isfinite(loss)) and loss[-1] < loss[0]
    assert len(model.trainable_weights) == 2
    for before, w in zip(frozen, [w for layer in model.layers[:-1] for w in layer.weights]):
        np.testing.assert_array_equal(before, w.numpy())
    assert all(not np.array_equal(b, w.numpy()) for b, w in zip(last, model.layers[-1].weights))
