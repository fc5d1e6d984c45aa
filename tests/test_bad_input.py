"""Bad input: each case is a clear Python error naming the model/layer and what was expected."""

from __future__ import annotations

import numpy as np
import pytest

import dnnbind
import dnnbind as keras
from dnnbind import layers


pytestmark = pytest.mark.usefixtures("cpu")  # the NumPy backend (conftest.py)


@pytest.fixture
def model():
    m = keras.Sequential([keras.Input((4, 4, 1)), layers.Conv2D(2, 3, name="conv_a"), layers.Flatten(),
                          layers.Dense(3, activation="softmax", name="out")], name="net")
    m.compile("adam", "sparse_categorical_crossentropy", metrics=["accuracy"])
    return m


def test_input_shape_mismatch(model):
    with pytest.raises(ValueError, match=r"'net'.*'conv_a' \(Conv2D\).*\(batch, 4, 4, 1\), got \(2, 4, 4\)"):
        model.fit(np.zeros((2, 4, 4)), np.zeros(2), verbose=0)
    with pytest.raises(ValueError, match=r"expects input of shape \(batch, 4, 4, 1\), got \(2, 5, 5, 1\)"):
        model.predict(np.zeros((2, 5, 5, 1)), verbose=0)


def test_wrong_dtype(model):
    with pytest.raises(TypeError, match="numeric input data.*dtype <U1"):
        model.fit(np.full((2, 4, 4, 1), "a"), np.zeros(2), verbose=0)
    with pytest.raises(TypeError, match="numeric input data.*object"):
        model.predict(np.array([None, None], dtype=object), verbose=0)
    with pytest.raises(TypeError, match="labels must be integer class indices, got dtype <U"):
        model.fit(np.zeros((2, 4, 4, 1)), np.array(["a", "b"]), verbose=0)


def test_labels_out_of_range_or_wrong_shape(model):
    x = np.zeros((3, 4, 4, 1))
    with pytest.raises(ValueError, match=r"labels must be in \[0, 3\).*\[0, 3\]"):
        model.fit(x, np.array([0, 1, 3]), verbose=0)
    with pytest.raises(ValueError, match=r"labels must be in \[0, 3\).*\[-1, 1\]"):
        model.evaluate(x, np.array([0, 1, -1]), verbose=0)
    with pytest.raises(ValueError, match=r"shape \(batch,\), got shape \(3, 2\)"):
        model.fit(x, np.zeros((3, 2)), verbose=0)
    with pytest.raises(ValueError, match="non-integer"):
        model.fit(x, np.array([0.5, 1, 2]), verbose=0)


def test_length_mismatch(model):
    with pytest.raises(ValueError, match="3 input samples but 2 targets"):
        model.fit(np.zeros((3, 4, 4, 1)), np.zeros(2), verbose=0)


def test_fit_before_compile():
    m = keras.Sequential([keras.Input((2,)), layers.Dense(1)], name="raw")
    with pytest.raises(dnnbind.DnnbindError, match=r"'raw'.*compile\(optimizer, loss, metrics\) before fit\(\)"):
        m.fit(np.zeros((2, 2)), np.zeros(2))
    with pytest.raises(dnnbind.DnnbindError, match="before evaluate"):
        m.evaluate(np.zeros((2, 2)), np.zeros(2))
    assert m.predict(np.ones((2, 2)), verbose=0).shape == (2, 1)  # predict needs no compile


def test_unknown_names():
    m = keras.Sequential([keras.Input((2,)), layers.Dense(1)])
    with pytest.raises(ValueError, match="unknown loss 'crossentropy'; known losses: .*mse"):
        m.compile("adam", "crossentropy")
    with pytest.raises(ValueError, match="unknown optimizer 'adamax'; known optimizers: adam"):
        m.compile("adamax", "mse")
    with pytest.raises(ValueError, match="unknown metric 'precision'; known metrics: acc, accuracy"):
        m.compile("adam", "mse", metrics=["precision"])
    m.compile("adam")  # Keras 3: a loss may come from add_loss or a custom train_step
    with pytest.raises(ValueError, match="[Nn]o loss to compute. Provide a `loss` argument in `compile\\(\\)`"):
        m.fit(np.ones((4, 2), np.float32), np.ones((4, 1), np.float32), verbose=0)


def test_set_weights_wrong_shapes(model):
    ws = model.get_weights()
    with pytest.raises(ValueError, match=r"layer 'conv_a' \(Conv2D\): weight 'kernel' expects shape \(3, 3, 1, 2\)"):
        model.set_weights([np.zeros((2, 1, 3, 3))] + ws[1:])
    with pytest.raises(ValueError, match="expects 4 arrays, got 3"):
        model.set_weights(ws[:3])
    with pytest.raises(ValueError, match=r"layer 'out' \(Dense\): weight 'bias' expects shape \(3,\)"):
        model.layers[-1].set_weights([ws[2], np.zeros(4)])
    # nothing was changed by the failed calls
    for a, b in zip(model.get_weights(), ws):
        assert np.array_equal(a, b)


def test_bad_layer_arguments():
    with pytest.raises(ValueError, match="Conv2D.*filters must be a positive int"):
        layers.Conv2D(0, 3)
    with pytest.raises(ValueError, match="padding must be 'valid' or 'same'"):
        layers.Conv2D(2, 3, padding="full")
    with pytest.raises(ValueError, match="data_format must be"):
        layers.MaxPooling2D(data_format="NHWC")
    with pytest.raises(ValueError, match="Dropout.*rate must be in"):
        layers.Dropout(1.5)
    with pytest.raises(TypeError, match="unexpected keyword argument"):
        layers.Dense(2, unit=3)
    with pytest.raises(ValueError, match=r"Conv2D 'c'.*input 2x2 is too small"):
        keras.Sequential([keras.Input((2, 2, 1)), layers.Conv2D(1, 3, name="c")])
    with pytest.raises(ValueError, match="4-d inputs"):
        keras.Sequential([keras.Input((5,)), layers.Conv2D(1, 3)])


def test_nan_loss_is_reported():
    # finite data whose loss overflows float32 (NaN/inf in x itself are refused before training)
    m = keras.Sequential([keras.Input((2,)), layers.Dense(1, kernel_initializer="ones")])
    m.compile("sgd", "mse")
    with pytest.warns(RuntimeWarning, match="epoch 1: the loss is inf"):
        m.fit(np.full((4, 2), 1e20, np.float32), np.zeros(4), verbose=0)


def test_step_counts_are_honoured_not_ignored(model):
    x, y = np.arange(64, dtype=np.float32).reshape(4, 4, 4, 1) / 64, np.array([0, 1, 2, 0])
    assert model.predict(x, batch_size=2, steps=1, verbose=0).shape[0] == 2
    assert model.evaluate(x, y, batch_size=2, steps=1, verbose=0) == pytest.approx(
        model.evaluate(x[:2], y[:2], verbose=0), rel=1e-6)
    history = model.fit(x, y, batch_size=2, steps_per_epoch=1, validation_data=(x, y), validation_steps=1,
                        verbose=0)
    assert {"loss", "val_loss"} <= set(history.history) and len(history.history["loss"]) == 1
