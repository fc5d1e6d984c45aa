"""Regression Model on Boston Housing Dataset

Source: keras-io examples/structured_data/regression_boston_housing.py

Changes:
- Data: a seeded NumPy stand-in of ``keras.datasets.boston_housing.load_data(test_split=0.3, seed=42)``:
  354 training / 152 test samples of 13 unscaled features (the real columns' rough ranges) and prices in
  thousands (a hidden linear rule plus noise, clipped to 5-50 as the real targets are).
- Sizes and training as published (batch size 32, up to 100 epochs with EarlyStopping(patience=10),
  validation_split=0.3); ``model.summary()`` and the plots (matplotlib) are left out; evaluate's
  ``verbose=2`` becomes 0.
"""

import numpy as np
import pytest

import dnnbind as keras
from dnnbind import layers

SOURCE = "examples/structured_data/regression_boston_housing.py"
UNCHANGED = True


@pytest.fixture(autouse=True)
def _cpu(cpu):
    yield


def _boston_like(rng, n):
    lows = np.array([0.0, 0, 0.5, 0, 0.4, 3.5, 3, 1, 1, 190, 12, 0.3, 1.7])
    highs = np.array([90.0, 100, 28, 1, 0.9, 8.8, 100, 12, 24, 710, 22, 397, 38])
    x = lows + (highs - lows) * rng.uniform(size=(n, 13))
    x[:, 3] = (x[:, 3] > 0.93).astype(float)  # the river dummy
    z = (x - lows) / (highs - lows)
    y = 22 - 10 * (z[:, 12] - 0.5) * 2 - 8 * (z[:, 9] - 0.5) * 2 + 3 * (z[:, 11] - 0.5) + rng.normal(0, 1.5, n)
    return x, np.clip(y, 5, 50)


def test_regression_boston_housing():
    rng = np.random.default_rng(42)
    keras.utils.set_random_seed(42)
    (x_train, y_train), (x_test, y_test) = _boston_like(rng, 354), _boston_like(rng, 152)

    def build_model():
        model = keras.Sequential(
            [
                # input_shape is number of features
                layers.Dense(32, activation="relu", input_shape=[x_train.shape[1]]),
                layers.Dense(32, activation="relu"),
                layers.Dense(1),
            ]
        )

        # The loss function is mean squared error
        # The metrics is Mean Absolute Error and Mean Squared Error
        model.compile(loss="mse", optimizer="adam", metrics=["mae", "mse"])
        return model

    model = build_model()

    # Use early stopping to break the training if the val_loss doesn't changed in 10 epochs
    early_stop = keras.callbacks.EarlyStopping(monitor="val_loss", patience=10)

    history = model.fit(
        x_train,
        y_train,
        batch_size=32,
        epochs=100,
        verbose=0,
        validation_split=0.3,
        callbacks=[early_stop],
    )

    # Test Loss
    loss, mae, mse = model.evaluate(x_test, y_test, verbose=0)

    prediction = model.predict(x_test).flatten()

    error = prediction - y_test

    h = history.history
    assert set(h) == {"loss", "mae", "mse", "val_loss", "val_mae", "val_mse"}
    assert np.all(np.isfinite(h["loss"])) and h["loss"][-1] < 0.2 * h["loss"][0]
    np.testing.assert_allclose(h["mse"], h["loss"], rtol=1e-5)  # no regularizer: the loss is the mse
    # EarlyStopping stopped it when val_loss stalled, or all 100 epochs ran
    best = int(np.argmin(h["val_loss"]))
    assert len(h["loss"]) == 100 or len(h["loss"]) == best + 11
    assert prediction.shape == (152,)
    np.testing.assert_allclose(mse, np.mean(error ** 2), rtol=1e-4)
    np.testing.assert_allclose(mae, np.mean(np.abs(error)), rtol=1e-4)
    # better than predicting the mean price (the inputs are unscaled, as published, so it learns slowly)
    assert mae < 0.9 * np.mean(np.abs(y_test - y_train.mean()))
