"""Imbalanced classification: credit card fraud detection

Source: keras-io examples/structured_data/imbalanced_classification.py

Changes:
- Data: a seeded NumPy stand-in of the Kaggle ``creditcard.csv`` arrays (30 float32 features, uint8 targets
  of shape (N, 1), about 3% positives whose features are shifted: learnable) instead of reading the CSV
  file; the validation split, class counts, class weights and normalisation follow the example.
- Sizes: 3000 samples instead of 284807; 6 epochs instead of 30 (batch size 2048 as published).
  ``verbose=0`` instead of 2; ``model.summary()`` is left out.
- The checkpoints are written in pytest's temporary directory (the test changes into it).

Known difference (not a code change): dnnbind's compiled metrics ignore sample weights, so under
``class_weight`` the *training* counts (``fn``, ``tp``...) are unweighted where Keras 3 weights them; the
validation metrics (no weights) mean the same in both.
"""

import numpy as np
import pytest

import dnnbind as keras

SOURCE = "examples/structured_data/imbalanced_classification.py"
UNCHANGED = True


@pytest.fixture(autouse=True)
def _cpu(cpu):
    yield


def _creditcard_like(rng, n=3000, n_features=30, fraud_rate=0.03):
    targets = (rng.uniform(size=(n, 1)) < fraud_rate).astype("uint8")
    features = rng.normal(size=(n, n_features)) * rng.uniform(0.5, 3.0, n_features) + rng.normal(0, 5, n_features)
    features[targets[:, 0] == 1, :8] += 2.5 * rng.uniform(0.5, 3.0, 8)
    return np.array(features, dtype="float32"), targets


@pytest.mark.filterwarnings("ignore:save. the .keras file:UserWarning")
def test_imbalanced_classification(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rng = np.random.default_rng(4)
    keras.utils.set_random_seed(4)
    features, targets = _creditcard_like(rng)

    num_val_samples = int(len(features) * 0.2)
    train_features = features[:-num_val_samples]
    train_targets = targets[:-num_val_samples]
    val_features = features[-num_val_samples:]
    val_targets = targets[-num_val_samples:]

    counts = np.bincount(train_targets[:, 0])

    weight_for_0 = 1.0 / counts[0]
    weight_for_1 = 1.0 / counts[1]

    mean = np.mean(train_features, axis=0)
    train_features -= mean
    val_features -= mean
    std = np.std(train_features, axis=0)
    train_features /= std
    val_features /= std

    model = keras.Sequential(
        [
            keras.Input(shape=train_features.shape[1:]),
            keras.layers.Dense(256, activation="relu"),
            keras.layers.Dense(256, activation="relu"),
            keras.layers.Dropout(0.3),
            keras.layers.Dense(256, activation="relu"),
            keras.layers.Dropout(0.3),
            keras.layers.Dense(1, activation="sigmoid"),
        ]
    )

    metrics = [
        keras.metrics.FalseNegatives(name="fn"),
        keras.metrics.FalsePositives(name="fp"),
        keras.metrics.TrueNegatives(name="tn"),
        keras.metrics.TruePositives(name="tp"),
        keras.metrics.Precision(name="precision"),
        keras.metrics.Recall(name="recall"),
    ]

    model.compile(
        optimizer=keras.optimizers.Adam(1e-2), loss="binary_crossentropy", metrics=metrics
    )

    callbacks = [keras.callbacks.ModelCheckpoint("fraud_model_at_epoch_{epoch}.keras")]
    class_weight = {0: weight_for_0, 1: weight_for_1}

    epochs = 6
    history = model.fit(
        train_features,
        train_targets,
        batch_size=2048,
        epochs=epochs,
        verbose=0,
        callbacks=callbacks,
        validation_data=(val_features, val_targets),
        class_weight=class_weight,
    )

    h = history.history
    assert np.all(np.isfinite(h["loss"])) and h["loss"][-1] < h["loss"][0]
    # the four counts of the validation confusion matrix cover every validation sample
    val_counts = [h[f"val_{k}"][-1] for k in ("tp", "fp", "tn", "fn")]
    assert sum(val_counts) == pytest.approx(num_val_samples)
    assert h["val_tp"][-1] + h["val_fn"][-1] == pytest.approx(int(val_targets.sum()))
    # with the class weights, the rare class is found
    assert h["val_recall"][-1] > 0.7 and h["val_precision"][-1] > 0.1
    assert sorted(p.name for p in tmp_path.glob("*.keras")) == sorted(
        f"fraud_model_at_epoch_{e}.keras" for e in range(1, epochs + 1))
    probs = model.predict(val_features, verbose=0)
    assert probs.shape == (num_val_samples, 1)
    tp = int(((probs[:, 0] > 0.5) & (val_targets[:, 0] == 1)).sum())
    assert tp == pytest.approx(h["val_tp"][-1])
