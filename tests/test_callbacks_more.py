"""TensorBoard (event files decoded back, CRCs checked; TensorBoard's own reader when installed), RemoteMonitor
against a local HTTP server, BackupAndRestore resuming an interrupted fit exactly, SwapEMAWeights refusing."""

from __future__ import annotations

import glob
import http.server
import importlib.util
import json
import os
import threading
import urllib.parse

import numpy as np
import pytest

import dnnbind as keras
from dnnbind import callbacks, event_file


def _data(n=64):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, 3)).astype("float32")
    return x, (x @ np.array([[1.0], [-2.0], [0.5]], "float32")).astype("float32")


def _model(seed=1):
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4, activation="relu"), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse", metrics=["mae"])
    return model


def test_crc32c_known_values():
    assert event_file.crc32c(b"") == 0
    assert event_file.crc32c(b"123456789") == 0xE3069283  # the standard CRC-32C check value
    assert event_file.crc32c(bytes(32)) == 0x8A9136AA  # RFC 3720 test vector


def test_tensorboard_writes_scalar_events(tmp_path):
    x, y = _data()
    model = _model()
    tb = callbacks.TensorBoard(log_dir=tmp_path, update_freq=2)
    history = model.fit(x, y, batch_size=16, epochs=3, validation_split=0.25, callbacks=[tb], verbose=0)
    (train_file,) = glob.glob(str(tmp_path / "train" / "events.out.tfevents.*"))
    (val_file,) = glob.glob(str(tmp_path / "validation" / "events.out.tfevents.*"))
    train = event_file.read_events(train_file)
    assert train[0]["file_version"] == "brain.Event:2"
    epochs = [e for e in train if "epoch_loss" in e.get("scalars", {})]
    assert [e["step"] for e in epochs] == [0, 1, 2]
    np.testing.assert_allclose([e["scalars"]["epoch_loss"] for e in epochs], history.history["loss"], rtol=1e-6)
    np.testing.assert_allclose([e["scalars"]["epoch_mae"] for e in epochs], history.history["mae"], rtol=1e-6)
    assert epochs[0]["scalars"]["epoch_learning_rate"] == pytest.approx(0.01)
    batches = [e for e in train if "batch_loss" in e.get("scalars", {})]
    assert [e["step"] for e in batches] == [2, 4, 6, 8]  # 48 training samples: 3 batches of 16 per epoch
    val = event_file.read_events(val_file)
    val_epochs = [e for e in val if "epoch_loss" in e.get("scalars", {})]
    np.testing.assert_allclose([e["scalars"]["epoch_loss"] for e in val_epochs], history.history["val_loss"], rtol=1e-6)
    assert any("evaluation_loss_vs_iterations" in e.get("scalars", {}) for e in val)
    # a flipped byte is caught by the CRC
    data = bytearray(open(train_file, "rb").read())
    data[-6] ^= 0xFF
    bad = tmp_path / "bad.tfevents"
    bad.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="CRC"):
        event_file.read_events(bad)


@pytest.mark.skipif(importlib.util.find_spec("tensorboard") is None, reason="tensorboard is not installed")
def test_tensorboard_reads_the_files(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    x, y = _data()
    _model().fit(x, y, epochs=2, callbacks=[callbacks.TensorBoard(tmp_path)], verbose=0)
    acc = EventAccumulator(str(tmp_path / "train"))
    acc.Reload()
    assert [s.step for s in acc.Scalars("epoch_loss")] == [0, 1]


def test_tensorboard_arguments():
    with pytest.raises(ValueError, match="update_freq"):
        callbacks.TensorBoard(update_freq=0)
    with pytest.warns(UserWarning, match="scalars only; histogram_freq ignored"):
        callbacks.TensorBoard(histogram_freq=1)


class _Collector(http.server.BaseHTTPRequestHandler):
    received: list = []

    def do_POST(self):  # noqa: N802 - http.server's name
        body = self.rfile.read(int(self.headers["Content-Length"]))
        type(self).received.append((self.path, self.headers["Content-Type"], self.headers.get("X-Run"), body))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def collector():
    _Collector.received = []
    httpd = http.server.HTTPServer(("127.0.0.1", 0), _Collector)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", _Collector.received
    httpd.shutdown()


def test_remote_monitor_posts_each_epoch(collector):
    root, received = collector
    x, y = _data()
    model = _model()
    history = model.fit(x, y, epochs=2, verbose=0, callbacks=[
        callbacks.RemoteMonitor(root=root, headers={"X-Run": "7"}),
        callbacks.RemoteMonitor(root=root, path="/json/", send_as_json=True)])
    forms = [r for r in received if r[0] == "/publish/epoch/end/"]
    jsons = [r for r in received if r[0] == "/json/"]
    assert len(forms) == len(jsons) == 2 and forms[0][2] == "7"
    assert forms[0][1] == "application/x-www-form-urlencoded" and jsons[0][1] == "application/json"
    sent = json.loads(urllib.parse.parse_qs(forms[1][3].decode())["data"][0])
    assert sent["epoch"] == 1 and sent["loss"] == pytest.approx(history.history["loss"][1])
    assert json.loads(jsons[0][3])["mae"] == pytest.approx(history.history["mae"][0])


def test_remote_monitor_warns_when_unreachable():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    x, y = _data(16)
    with pytest.warns(UserWarning, match="Could not reach RemoteMonitor root server"):
        _model().fit(x, y, epochs=1, verbose=0, callbacks=[callbacks.RemoteMonitor(root=f"http://127.0.0.1:{port}",
                                                                                   timeout=5)])


class _Interrupt(callbacks.Callback):
    def __init__(self, at_epoch):
        super().__init__()
        self.at_epoch = at_epoch

    def on_epoch_begin(self, epoch, logs=None):
        if epoch == self.at_epoch:
            raise RuntimeError("interrupted")


def test_backup_and_restore_resumes_an_interrupted_fit_exactly(tmp_path):
    x, y = _data()
    reference = _model()
    reference.fit(x, y, batch_size=16, epochs=4, shuffle=False, verbose=0)
    model = _model()
    backup = callbacks.BackupAndRestore(tmp_path / "backup")
    with pytest.raises(RuntimeError, match="interrupted"):
        model.fit(x, y, batch_size=16, epochs=4, shuffle=False, verbose=0, callbacks=[backup, _Interrupt(2)])
    assert json.load(open(tmp_path / "backup" / "latest" / "training.json"))["epoch"] == 1
    fresh = _model(seed=9)  # other initial weights: everything comes from the backup
    seen = []
    history = fresh.fit(x, y, batch_size=16, epochs=4, shuffle=False, verbose=0,
                        callbacks=[callbacks.BackupAndRestore(tmp_path / "backup"),
                                   callbacks.LambdaCallback(on_epoch_begin=lambda e, logs=None: seen.append(e))])
    assert seen == [2, 3] and len(history.history["loss"]) == 2
    for a, b in zip(fresh.get_weights(), reference.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
    assert fresh.optimizer.iterations == reference.optimizer.iterations == 16
    assert not (tmp_path / "backup").exists()  # a finished fit deletes it


def test_backup_arguments_and_swap_ema():
    with pytest.raises(ValueError, match="save_freq"):
        callbacks.BackupAndRestore("x", save_freq=0)
    x, y = _data(16)
    with pytest.raises(ValueError, match="SwapEMAWeights must be used when `use_ema=True`"):
        _model().fit(x, y, epochs=1, verbose=0, callbacks=[callbacks.SwapEMAWeights()])
