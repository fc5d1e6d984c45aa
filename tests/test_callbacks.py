"""Callbacks, the progress bar (tty and not), History and its plot."""

from __future__ import annotations

import csv
import io
import math
import os
import re
import sys

import numpy as np
import pytest

import dnnbind
import dnnbind as keras
from dnnbind import callbacks, layers


pytestmark = pytest.mark.usefixtures("cpu")  # the NumPy backend (conftest.py)


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


def test_model_checkpoint_every_n_batches(rng, tmp_path):
    # regression: save_freq=<int> (keras.io's training guide saves every 100 batches) raised
    # NotImplementedError; Keras saves after every save_freq-th training batch, the logs in the name
    model, x, y = small(rng)  # 64 samples in batches of 16: 4 batches per epoch
    ck = callbacks.ModelCheckpoint(str(tmp_path / "m-{epoch}-{batch}-{loss:.2f}.weights.h5"), save_freq=3,
                                   save_weights_only=True)
    model.fit(x, y, epochs=2, batch_size=16, callbacks=[ck], verbose=0)
    names = sorted(os.listdir(tmp_path))
    assert [n.split("-")[:3] for n in names] == [["m", "1", "2"], ["m", "2", "1"]]  # batches 3 and 6
    for bad in (0, -2, 2.5, True, "batch"):
        with pytest.raises(ValueError, match="save_freq must be 'epoch' or a positive int"):
            callbacks.ModelCheckpoint(str(tmp_path / "x.keras"), save_freq=bad)


def test_on_batch_hooks_are_the_training_batch_hooks(rng):
    # regression: a callback overriding on_batch_end (Keras's older name, keras.io's LossHistory) was never
    # called; Keras's default on_train_batch_begin/end call on_batch_begin/end
    model, x, y = small(rng)

    class LossHistory(callbacks.Callback):
        def on_train_begin(self, logs):
            self.per_batch_losses, self.begun = [], 0

        def on_batch_begin(self, batch, logs):
            self.begun += 1

        def on_batch_end(self, batch, logs):
            self.per_batch_losses.append(logs.get("loss"))

    history = LossHistory()
    model.fit(x, y, epochs=1, batch_size=16, callbacks=[history], verbose=0)
    assert history.begun == 4 and len(history.per_batch_losses) == 4
    assert all(np.isfinite(float(v)) for v in history.per_batch_losses)


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


ANSI = re.compile(r"\x1b\[[0-9;]*m")
BAR = "\u2501"


class FakeClock:
    """Drives ``callbacks._clock``: each call returns the current time; ``tick`` advances it."""

    def __init__(self, start=100.0):
        self.now = start

    def __call__(self):
        return self.now

    def tick(self, seconds):
        self.now += seconds


@pytest.fixture
def clock(monkeypatch):
    c = FakeClock()
    monkeypatch.setattr(callbacks, "_clock", c)
    return c


def drive(bar, clock, steps, values, first=0.5, per=0.003):
    """Steps of ``per`` seconds after a slow first one (compilation): Keras's timing leaves it out."""
    for i in range(1, steps + 1):
        clock.tick(first if i == 1 else per)
        bar.update(i, values)


def test_progbar_live_line_is_keras3(clock):
    tty = FakeTTY()
    bar = callbacks.Progbar(469, verbose=1, stream=tty, interval=0.0)
    drive(bar, clock, 12, {"accuracy": 0.91, "loss": 0.29})
    frames = tty.getvalue().split("\r")[1:]
    assert len(frames) == 12 and not tty.getvalue().endswith("\n")
    # 11 steps of 3 ms after the first: 3ms/step, ETA 457 * 3 ms = 1.37 s
    assert ANSI.sub("", frames[-1]) == f" 12/469 {BAR * 20} 1s 3ms/step - accuracy: 0.9100 - loss: 0.2900"
    assert frames[-1].startswith("\x1b[1m 12/469\x1b[0m \x1b[37m" + BAR * 20)  # bold counter, grey bar
    clock.tick(0.003 * 457 - 0.003)
    for i in range(13, 470):
        bar.update(i, {"accuracy": 0.95, "loss": 0.125})
    last = tty.getvalue().split("\r")[-1]
    assert last.endswith("\n")
    # finished: the elapsed seconds replace the ETA, the bar is all green
    assert ANSI.sub("", last) == f"469/469 {BAR * 20} 2s 3ms/step - accuracy: 0.9500 - loss: 0.1250\n"
    assert "\x1b[32m" + BAR * 20 + "\x1b[0m" in last


def test_progbar_half_way_and_slow_steps(clock):
    tty = FakeTTY()
    bar = callbacks.Progbar(10, verbose=1, stream=tty, interval=0.0)
    drive(bar, clock, 5, {"loss": 2e-4}, first=100.0, per=100.0)
    frame = tty.getvalue().split("\r")[-1]
    assert "\x1b[32m" + BAR * 10 + "\x1b[0m\x1b[37m" + BAR * 10 in frame  # 5/10: half green
    # the ETA shrank from 10:00 to 8:20: one trailing space clears the previous, longer line
    assert ANSI.sub("", frame) == f" 5/10 {BAR * 20} 8:20 100s/step - loss: 2.0000e-04 "


def test_progbar_redraws_at_most_every_interval_and_clears_longer_lines(clock):
    tty = FakeTTY()
    bar = callbacks.Progbar(100, verbose=1, stream=tty, interval=0.05)
    for i in range(1, 51):
        clock.tick(0.01)
        bar.update(i, {"loss": 1.0, "accuracy": 0.5} if i < 10 else {"loss": 1.0})
    assert tty.getvalue().count("\r") == 10  # 0.5 s at one draw per 0.05 s
    frames = [ANSI.sub("", f) for f in tty.getvalue().split("\r")[1:]]
    shrunk = [b for a, b in zip(frames, frames[1:]) if len(b.rstrip()) < len(a.rstrip())]
    assert len(shrunk) == 1 and "accuracy" not in shrunk[0]
    for a, b in zip(frames, frames[1:]):
        assert len(b) >= len(a.rstrip())  # every redraw covers what the previous one wrote


def test_progbar_written_to_a_file_gives_one_final_line(clock):
    plain = io.StringIO()
    bar = callbacks.Progbar(4, verbose=1, stream=plain, interval=0.0)
    calls = []
    drive(bar, clock, 4, lambda: calls.append(1) or {"loss": 0.5})
    assert plain.getvalue() == f"4/4 {BAR * 20} 1s 3ms/step - loss: 0.5000\n"
    assert len(calls) == 1  # the values were read once, for the line written


def test_progbar_verbose_2_and_unknown_target(clock):
    two = io.StringIO()
    bar = callbacks.Progbar(469, verbose=2, stream=two)
    drive(bar, clock, 469, [("accuracy", 0.91), ("loss", 1e-5)], first=0.4, per=0.02)
    assert two.getvalue() == "469/469 - 10s - 20ms/step - accuracy: 0.9100 - loss: 1.0000e-05\n"
    tty = FakeTTY()
    bar = callbacks.Progbar(None, verbose=1, stream=tty, interval=0.0)
    drive(bar, clock, 37, {}, first=0.5, per=0.5)
    assert ANSI.sub("", tty.getvalue().split("\r")[-1]) == "     37/Unknown 18s 500ms/step"
    silent = io.StringIO()
    drive(callbacks.Progbar(3, verbose=0, stream=silent), clock, 3, {"loss": 1.0})
    assert silent.getvalue() == ""


def test_progbar_falls_back_to_ascii_where_the_encoding_cannot_write_the_bar(clock):
    raw = io.BytesIO()
    out = io.TextIOWrapper(raw, encoding="ascii")
    drive(callbacks.Progbar(2, verbose=1, stream=out), clock, 2, {"loss": 0.5})
    out.flush()
    assert raw.getvalue().decode() == f"2/2 {'=' * 20} 1s 3ms/step - loss: 0.5000\n"


def _logger_lines(verbose, epochs, steps, stream, clock, val=True):
    """Drive a ProgbarLogger through fit's hooks (validation calls the test hooks, as fit does)."""
    logger = callbacks.ProgbarLogger(stream=stream)
    logger.set_params({"verbose": verbose, "epochs": epochs, "steps": steps})
    logger.on_train_begin()
    for epoch in range(epochs):
        logger.on_epoch_begin(epoch)
        for step in range(steps):
            clock.tick(0.5 if step == 0 else 0.003)
            logger.on_train_batch_end(step, {"loss": 0.5, "accuracy": 0.75})
        if val:
            logger.on_test_begin()
            logger.on_test_batch_end(0, {"loss": 9.0})
            logger.on_test_end({"loss": 9.0})
        logger.on_epoch_end(epoch, {"loss": 0.5, "accuracy": 0.75, "val_loss": 0.25, "val_accuracy": 0.875,
                                    "learning_rate": 0.001})
    logger.on_train_end()
    return logger


def test_progbar_logger_fit_lines_in_keras3_order(clock):
    out = io.StringIO()
    _logger_lines(2, 2, 3, out, clock)
    # verbose=2 never draws per batch, so its time per step includes the first one, as Keras's;
    # 0.001 is not above 1e-3: scientific notation, as Keras
    line = ("3/3 - 1s - 169ms/step - accuracy: 0.7500 - loss: 0.5000 - val_accuracy: 0.8750 - val_loss: 0.2500 "
            "- learning_rate: 1.0000e-03")
    assert out.getvalue().splitlines() == ["Epoch 1/2", line, "Epoch 2/2", line]
    single = io.StringIO()
    _logger_lines(1, 1, 2, single, clock, val=False)  # one epoch: no "Epoch 1/1" header, as Keras 3
    assert single.getvalue() == f"2/2 {BAR * 20} 1s 3ms/step - accuracy: 0.7500 - loss: 0.5000 - val_accuracy: " \
                                "0.8750 - val_loss: 0.2500 - learning_rate: 1.0000e-03\n"
    quiet = io.StringIO()
    _logger_lines(0, 2, 2, quiet, clock)
    assert quiet.getvalue() == ""


def test_progbar_logger_live_bar_reads_batch_logs_only_when_drawing(clock):
    reads = []
    logs = callbacks.LazyLogs({"loss": lambda: reads.append("loss") or 0.5})
    plain = io.StringIO()
    logger = callbacks.ProgbarLogger(1, stream=plain)
    logger.set_params({"verbose": 1, "epochs": 1, "steps": 50})
    logger.on_train_begin()
    logger.on_epoch_begin(0)
    for step in range(50):
        logger.on_train_batch_end(step, logs)
    assert reads == []  # not a terminal: no live bar, the device is never read per batch
    tty = FakeTTY()
    logger = callbacks.ProgbarLogger(stream=tty)
    logger.set_params({"verbose": "auto", "epochs": 1, "steps": 50})
    logger.on_epoch_begin(0)
    for step in range(50):
        clock.tick(0.01)
        logs = callbacks.LazyLogs({"loss": lambda: reads.append("loss") or 0.5})
        logger.on_train_batch_end(step, logs)
    assert len(reads) == 10  # one read per redraw (0.5 s, one per 0.05 s), not one per batch
    assert "loss: 0.5000" in tty.getvalue()


def test_progbar_logger_evaluate_and_predict(clock):
    out = io.StringIO()
    logger = callbacks.ProgbarLogger(stream=out)
    logger.set_params({"verbose": 2, "steps": 4})
    logger.on_test_begin()
    for step in range(4):
        clock.tick(0.01)
        logger.on_test_batch_end(step, {"loss": 1.0})
    logger.on_test_end({"loss": 0.75, "accuracy": 0.5})
    assert out.getvalue() == "4/4 - 0s - 10ms/step - accuracy: 0.5000 - loss: 0.7500\n"
    out = io.StringIO()
    logger = callbacks.ProgbarLogger(stream=out)
    logger.set_params({"verbose": 1, "steps": None})  # unknown length: the count seen becomes the target
    logger.on_predict_begin()
    for step in range(3):
        clock.tick(0.01)
        logger.on_predict_batch_end(step, {"outputs": np.ones(3)})
    logger.on_predict_end()
    assert out.getvalue() == f"3/3 {BAR * 20} 0s 10ms/step\n"


def test_fit_output_per_verbose(rng, capsys, monkeypatch):
    keras.utils.set_random_seed(0)  # the initial weights: not whatever earlier tests left in the generator
    model, x, y = small(rng)
    model.fit(x, y, epochs=2, verbose=2, validation_split=0.25)
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "Epoch 1/2" and out[2] == "Epoch 2/2" and len(out) == 4
    value = r"(?:\d+\.\d{4}|\d\.\d{4}e[+-]\d\d)"  # Keras: 4 decimals, scientific below 1e-3 (0 -> 0.0000e+00)
    assert re.fullmatch(rf"2/2 - \d+s - \d+[mu]?s/step - accuracy: {value} - loss: {value} - "
                        rf"val_accuracy: {value} - val_loss: {value}", out[1]), out[1]
    tty = FakeTTY()
    monkeypatch.setattr(sys, "stdout", tty)
    model.fit(x, y, epochs=1, batch_size=8)  # verbose="auto" on a tty -> live bar, no "Epoch 1/1"
    text = ANSI.sub("", tty.getvalue())
    assert not text.startswith("Epoch") and f"\r8/8 {BAR * 20} " in text and text.endswith("\n")
    model.fit(x, y, epochs=1, verbose=0)
    assert capsys.readouterr().out == ""


def test_evaluate_and_predict_output_is_one_progbar_logger(rng, capsys):
    keras.utils.set_random_seed(0)
    model, x, y = small(rng)
    value = r"(?:\d+\.\d{4}|\d\.\d{4}e[+-]\d\d)"
    line = rf"\d+/\d+ - \d+s - \d+[mu]?s/step - accuracy: {value} - loss: {value}"
    model.evaluate(x, y, verbose=2)
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 1 and re.fullmatch(line, out[0]), out
    # a ProgbarLogger passed in is the bar: one line, not a second bar beside it
    model.evaluate(x, y, verbose=2, callbacks=[callbacks.ProgbarLogger()])
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 1 and re.fullmatch(line, out[0]), out
    model.predict(x, verbose=2)
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 1 and re.fullmatch(r"\d+/\d+ - \d+s - \d+[mu]?s/step", out[0]), out
    model.evaluate(x, y, verbose=0), model.predict(x, verbose=0)
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
