"""Callbacks, the progress bar (tty and not), History and its plot."""

from __future__ import annotations

import csv
import io
import math
import os
import sys

import numpy as np
import pytest

import dnnbind
import dnnbind as keras
from dnnbind import callbacks, layers


@pytest.fixture(autouse=True)
def _cpu():
    dnnbind.set_default_device("cpu")
    yield
    dnnbind.set_default_device(None)


def small(rng, lr=0.05, n=64):
    x = rng.normal(size=(n, 4)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int64)
    model = keras.Sequential([keras.Input((4,)), layers.Dense(2, activation="softmax")])
    model.compile(keras.optimizers.SGD(lr), "sparse_categorical_crossentropy", metrics=["accuracy"])
    return model, x, y


class Recorder(callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.events = []

    def on_train_begin(self, logs=None):
        self.events.append("train_begin")

    def on_epoch_begin(self, epoch, logs=None):
        self.events.append(f"epoch_begin{epoch}")

    def on_train_batch_end(self, batch, logs=None):
        self.events.append(f"batch{batch}")

    def on_epoch_end(self, epoch, logs=None):
        self.events.append(f"epoch_end{epoch}:{sorted(logs)}")

    def on_train_end(self, logs=None):
        self.events.append("train_end")


def test_hook_order_and_initial_epoch(rng):
    model, x, y = small(rng, n=20)
    rec = Recorder()
    h = model.fit(x, y, batch_size=10, epochs=3, initial_epoch=1, callbacks=[rec], verbose=0)
    assert rec.model is model
    assert rec.events == ["train_begin", "epoch_begin1", "batch0", "batch1", "epoch_end1:['accuracy', 'loss']",
                          "epoch_begin2", "batch0", "batch1", "epoch_end2:['accuracy', 'loss']", "train_end"]
    assert h.epoch == [1, 2]


def test_batch_logs_are_lazy_and_correct(rng):
    model, x, y = small(rng, n=16)
    seen = []
    model.fit(x, y, batch_size=16, epochs=1, verbose=0, shuffle=False,
              callbacks=[callbacks.LambdaCallback(on_train_batch_end=lambda b, logs: seen.append(logs["loss"]))])
    assert len(seen) == 1 and math.isfinite(seen[0])
    logs = callbacks.LazyLogs({"a": lambda: 1.5})
    assert dict(logs) == {"a": 1.5} and "a" in logs and len(logs) == 1


def test_early_stopping_restores_best_weights(rng):
    model, x, y = small(rng)
    seq = iter([1.0, 0.5, 0.7, 0.8, 0.9, 0.95])
    snapshots = []

    class FakeVal(callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            logs["val_loss"] = next(seq)
            snapshots.append(self.model.get_weights())

    es = callbacks.EarlyStopping(monitor="val_loss", patience=2, restore_best_weights=True)
    h = model.fit(x, y, epochs=6, callbacks=[FakeVal(), es], verbose=0)
    assert h.epoch == [0, 1, 2, 3]
    assert es.stopped_epoch == 3 and es.best_epoch == 1 and model.stop_training
    for got, want in zip(model.get_weights(), snapshots[1]):
        assert np.array_equal(got, want)


def test_early_stopping_modes_min_delta_baseline():
    es = callbacks.EarlyStopping(monitor="val_accuracy", min_delta=0.1)
    assert es.mode == "max"
    es.on_train_begin()
    assert es._improved(0.5, None) and not es._improved(0.55, 0.5) and es._improved(0.61, 0.5)

    class M:
        stop_training = False

        def get_weights(self):
            return []

    for baseline, stops in [(0.1, True), (None, False)]:
        es2 = callbacks.EarlyStopping(monitor="loss", baseline=baseline, patience=2)
        es2.set_model(M())
        es2.on_train_begin()
        es2.on_epoch_end(0, {"loss": 0.5})
        es2.on_epoch_end(1, {"loss": 0.4})  # improves, but short of the baseline: the wait is not reset
        es2.on_epoch_end(2, {"loss": 0.45})
        assert es2.model.stop_training == stops
        es2.model.stop_training = False


def test_model_checkpoint_files(rng, tmp_path):
    model, x, y = small(rng)
    seq = iter([0.9, 0.5, 0.7])

    class FakeVal(callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            logs["val_loss"] = next(seq)

    path = str(tmp_path / "w-{epoch:02d}-{val_loss:.2f}.safetensors")
    ck = callbacks.ModelCheckpoint(path, save_best_only=True, save_weights_only=True)
    model.fit(x, y, epochs=3, callbacks=[FakeVal(), ck], verbose=0)
    assert sorted(os.listdir(tmp_path)) == ["w-01-0.90.safetensors", "w-02-0.50.safetensors"]
    full = callbacks.ModelCheckpoint(str(tmp_path / "m{epoch}.dnnbind"), monitor="loss")
    model.fit(x, y, epochs=2, callbacks=[full], verbose=0)
    loaded = keras.load_model(tmp_path / "m2.dnnbind")
    assert np.allclose(loaded.predict(x, verbose=0), model.predict(x, verbose=0))


def test_csv_logger(rng, tmp_path):
    model, x, y = small(rng)
    path = tmp_path / "log.csv"
    h = model.fit(x, y, epochs=2, validation_split=0.25, callbacks=[callbacks.CSVLogger(path)], verbose=0)
    rows = list(csv.DictReader(open(path)))
    assert list(rows[0]) == ["epoch", "accuracy", "loss", "val_accuracy", "val_loss"]
    assert [r["epoch"] for r in rows] == ["0", "1"]
    assert float(rows[1]["loss"]) == pytest.approx(h.history["loss"][1])
    model.fit(x, y, epochs=1, callbacks=[callbacks.CSVLogger(path, separator=";", append=True)], verbose=0)
    text = open(path).read().splitlines()
    assert len(text) == 4 and text[3].startswith("0;")


def test_learning_rate_scheduler_and_reduce_on_plateau(rng):
    model, x, y = small(rng)
    lrs = []
    sched = callbacks.LearningRateScheduler(lambda epoch, lr: 0.1 * (0.5 ** epoch))
    h = model.fit(x, y, epochs=3, verbose=0, callbacks=[
        sched, callbacks.LambdaCallback(on_epoch_begin=lambda e, logs: lrs.append(model.optimizer.learning_rate))])
    assert lrs == pytest.approx([0.1, 0.05, 0.025])
    assert h.history["learning_rate"] == pytest.approx([0.1, 0.05, 0.025])
    one_arg = callbacks.LearningRateScheduler(lambda epoch: 0.2)
    model.fit(x, y, epochs=1, verbose=0, callbacks=[one_arg])
    assert model.optimizer.learning_rate == pytest.approx(0.2)

    model.optimizer.learning_rate = 1.0
    seq = iter([1.0, 1.0, 1.0, 1.0, 0.5, 0.5, 0.5])

    class FakeVal(callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            logs["val_loss"] = next(seq)

    rop = callbacks.ReduceLROnPlateau(factor=0.5, patience=2, min_lr=0.3, cooldown=1)
    seen = []
    model.fit(x, y, epochs=7, verbose=0, callbacks=[FakeVal(), rop, callbacks.LambdaCallback(
        on_epoch_end=lambda e, logs: seen.append(model.optimizer.learning_rate))])
    # epochs 1,2 stall -> 0.5 at epoch 2; cooldown epoch 3; epoch 4 improves; 5, 6 stall -> max(0.25, 0.3)
    assert seen == pytest.approx([1.0, 1.0, 0.5, 0.5, 0.5, 0.5, 0.3])


def test_terminate_on_nan(rng):
    model, x, y = small(rng, lr=1e30)
    # finite data (fit refuses NaN/inf in x) whose logits overflow float32: both are inf, softmax NaN
    model.set_weights([np.ones((4, 2), np.float32), np.zeros(2, np.float32)])
    x[5] = 3e38
    term = callbacks.TerminateOnNaN()
    with pytest.warns(RuntimeWarning, match="the loss is"), np.errstate(all="ignore"):
        h = model.fit(x, y, batch_size=8, epochs=3, callbacks=[term], verbose=0, shuffle=False)
    assert model.stop_training and len(h.epoch) == 1
    assert not math.isfinite(h.history["loss"][0])


class FakeTTY(io.StringIO):
    def isatty(self):
        return True


def test_progbar_tty_and_plain():
    tty = FakeTTY()
    bar = callbacks.Progbar(10, verbose=1, stream=tty, interval=0.0)
    for i in range(1, 10):
        bar.update(i, {"loss": 0.5})
    bar.update(10, {"loss": 0.25, "accuracy": 0.95})
    out = tty.getvalue()
    assert out.count("\r") == 10
    assert " 5/10 [==============>...............] - ETA: " in out
    assert "loss: 0.5000" in out
    last = out.split("\r")[-1]
    assert last.startswith("10/10 [==============================] - ")
    assert "step - loss: 0.2500 - accuracy: 0.9500" in last and last.endswith("\n")

    plain = io.StringIO()
    bar = callbacks.Progbar(10, verbose=1, stream=plain, interval=0.0)
    for i in range(1, 11):
        bar.update(i, {"loss": 0.5})
    assert "\r" not in plain.getvalue() and plain.getvalue().count("\n") == 1
    two = io.StringIO()
    bar = callbacks.Progbar(4, verbose=2, stream=two)
    bar.update(4, {"loss": 1e-5})
    line = two.getvalue()
    assert line.startswith("4/4 - ") and "/step - loss: 1.0000e-05" in line and "[" not in line


def test_fit_output_per_verbose(rng, capsys, monkeypatch):
    model, x, y = small(rng)
    model.fit(x, y, epochs=2, verbose=2, validation_split=0.25)
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "Epoch 1/2" and out[2] == "Epoch 2/2" and len(out) == 4
    assert out[1].startswith("2/2 - ") and " - loss: " in out[1] and " - val_loss: " in out[1]
    tty = FakeTTY()
    monkeypatch.setattr(sys, "stdout", tty)
    model.fit(x, y, epochs=1, batch_size=8)  # verbose="auto" on a tty -> bar
    assert "\r8/8 [==============================]" in tty.getvalue()
    model.fit(x, y, epochs=1, verbose=0)
    assert capsys.readouterr().out == ""


def test_history_plot(rng, tmp_path):
    pytest.importorskip("matplotlib")
    model, x, y = small(rng)
    h = model.fit(x, y, epochs=2, validation_split=0.25, verbose=0)
    path = h.plot(tmp_path / "curves.png")
    with open(path, "rb") as fh:
        assert fh.read(8) == b"\x89PNG\r\n\x1a\n"


def test_history_plot_without_matplotlib(rng, tmp_path, monkeypatch):
    import builtins

    real_import = builtins.__import__

    def fake_import(name, *args, **kwargs):
        if name == "matplotlib" or name.startswith("matplotlib."):
            raise ImportError("No module named 'matplotlib'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", fake_import)
    h = callbacks.History()
    h.history = {"loss": [1.0, 0.5]}
    with pytest.raises(ImportError, match=r'pip install "dnnbind\[plot\]"') as info:
        h.plot(tmp_path / "x.png")
    assert isinstance(info.value, dnnbind.DnnbindError)
    assert not os.listdir(tmp_path)
