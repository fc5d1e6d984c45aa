"""Event classification for payment card fraud detection

Source: keras-io examples/timeseries/event_classification_for_payment_card_fraud_detection.py

Changes:
- Data: the Temporian feature engineering over the downloaded transactions (moving sums and counts per
  terminal, lagged fraud counts and rates, calendar hour and day of week, z-normalised over time) is replaced
  by seeded NumPy stand-ins of its output: the same 14 lower-case feature names, float32 columns of shape
  (N, 1) (one per ``keras.Input(shape=(1,))``), int32 labels; fraud shifts the fraud-history features
  (learnable). The ``tf.data`` pipelines become dicts of arrays: the training set is drawn at the published
  80% / 20% legitimate / fraudulent ratio (what ``rejection_resample`` produces), validation and test keep
  a 2% fraud rate; ``batch_size = 32`` as published.
- Sizes: 1600 training / 400 validation / 800 test transactions (1 epoch, the default, as published).
  ``verbose=0``. The ROC plot (scikit-learn) is replaced by an assertion on the AUC.

Known difference (not a code change): dnnbind's ``keras.metrics.Accuracy()`` is Keras's ``"accuracy"``
string (binary accuracy for this 1-wide output), where Keras 3's class compares ``y_true == y_pred`` exactly
(about 0 for sigmoid outputs); the test does not assert on it.
"""

import numpy as np
import pytest

import dnnbind as keras

SOURCE = "examples/timeseries/event_classification_for_payment_card_fraud_detection.py"
UNCHANGED = True


@pytest.fixture(autouse=True)
def _cpu(cpu):
    yield


input_feature_names = (
    [f"sum_transactions_{n}_days" for n in (7, 14, 28)]
    + [f"count_transactions_{n}_days" for n in (7, 14, 28)]
    + [f"count_fraud_transactions_{n}_days" for n in (7, 14, 28)]
    + [f"rate_fraud_transactions_{n}_days" for n in (7, 14, 28)]
    + ["calendar_hour", "calendar_day_of_week"]
)


def _transactions(rng, n, fraud_rate):
    labels = (rng.uniform(size=n) < fraud_rate).astype(np.int32)
    features = {}
    for name in input_feature_names:
        col = rng.normal(size=n)
        if "fraud" in name:
            col = col + 1.5 * labels
        features[name] = col.astype(np.float32).reshape(n, 1)
    return features, labels


def _rank_auc(labels, scores):
    pos, neg = scores[labels == 1], scores[labels == 0]
    return float((pos[:, None] > neg[None, :]).mean() + 0.5 * (pos[:, None] == neg[None, :]).mean())


def test_event_classification_for_payment_card_fraud_detection():
    rng = np.random.default_rng(7)
    keras.utils.set_random_seed(7)
    target_rate = 0.2
    batch_size = 32
    train_x, train_y = _transactions(rng, 1600, target_rate)
    valid_x, valid_y = _transactions(rng, 400, 0.02)
    test_x, test_y = _transactions(rng, 800, 0.02)
    valid_y[:4] = 1  # at least a few frauds in the small validation set
    test_y[:8] = 1
    for name in input_feature_names:
        if "fraud" in name:
            valid_x[name][:4] += 1.5
            test_x[name][:8] += 1.5

    inputs = [keras.Input(shape=(1,), name=name) for name in input_feature_names]
    x = keras.layers.concatenate(inputs)
    x = keras.layers.Dense(32, activation="sigmoid")(x)
    x = keras.layers.Dense(16, activation="sigmoid")(x)
    x = keras.layers.Dense(1, activation="sigmoid")(x)
    model = keras.Model(inputs=inputs, outputs=x)

    model.compile(
        optimizer=keras.optimizers.Adam(0.01),
        loss=keras.losses.BinaryCrossentropy(),
        metrics=[keras.metrics.Accuracy(), keras.metrics.AUC()],
    )
    history = model.fit(train_x, train_y, batch_size=batch_size, validation_data=(valid_x, valid_y), verbose=0)

    test_loss, _, test_auc = model.evaluate(test_x, test_y, batch_size=batch_size, verbose=0)

    predictions = model.predict(test_x, verbose=0)
    predictions = np.nan_to_num(predictions, nan=0)

    labels = test_y

    h = history.history
    assert set(h) == {"loss", "accuracy", "auc", "val_loss", "val_accuracy", "val_auc"}
    assert len(h["loss"]) == 1 and np.isfinite(h["loss"][0]) and np.isfinite(test_loss)
    assert h["auc"][0] > 0.7 and test_auc > 0.8  # chance is 0.5
    assert predictions.shape == (800, 1)
    # the 200-threshold AUC of the metric is close to the exact (rank) AUC of the predictions
    assert test_auc == pytest.approx(_rank_auc(labels, predictions[:, 0]), abs=0.02)
