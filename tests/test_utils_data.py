"""``keras.utils`` data helpers: pad_sequences and normalize (against real Keras), pack/unpack, split_dataset,
timeseries_dataset_from_array (against a NumPy reference of Keras's windows), Config, get_source_inputs, the image
helpers without Pillow, and get_file against a local HTTP server (hashes, cache, extraction, offline error)."""

from __future__ import annotations

import functools
import hashlib
import http.server
import importlib.util
import io
import json
import os
import subprocess
import sys
import tarfile
import threading
import zipfile

import numpy as np
import pytest

import dnnbind as keras
from dnnbind import utils
from dnnbind.datasets import DownloadError

PAD_CASES = [
    ([[1, 2, 3], [4], [], [5, 6]], {}),
    ([[1, 2, 3], [4], [5, 6]], {"maxlen": 2}),
    ([[1, 2, 3], [4], [5, 6]], {"maxlen": 2, "padding": "post", "truncating": "post", "value": -1}),
    ([[1, 2, 3], [4]], {"maxlen": 4, "padding": "post", "dtype": "float32", "value": 0.5}),
    ([[[1, 2], [3, 4]], [[5, 6]]], {}),
]

_KERAS_SCRIPT = """
import json, sys, numpy as np, keras
cases = json.loads(sys.argv[1])
pads = [np.asarray(keras.utils.pad_sequences(seqs, **kw)).tolist() for seqs, kw in cases]
x = np.array([[3.0, 4.0, 0.0], [0.0, 0.0, 0.0], [1.0, -2.0, 2.0]])
norms = [keras.utils.normalize(x).tolist(), keras.utils.normalize(x, axis=0, order=1).tolist()]
print(json.dumps({"pad": pads, "normalize": norms}))
"""


@pytest.fixture(scope="module")
def keras_results(tmp_path_factory):
    if importlib.util.find_spec("keras") is None:
        pytest.skip("needs Keras installed (test extra)")
    work = tmp_path_factory.mktemp("keras_utils")
    env = {k: v for k, v in os.environ.items() if k not in ("KERAS_HOME", "KERAS_BACKEND")}
    env.update(KERAS_HOME=str(work), KERAS_BACKEND="numpy")
    proc = subprocess.run([sys.executable, "-c", _KERAS_SCRIPT, json.dumps(PAD_CASES)], capture_output=True,
                          text=True, timeout=180, env=env, cwd=str(work))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("index", range(len(PAD_CASES)))
def test_pad_sequences_matches_keras(keras_results, index):
    seqs, kwargs = PAD_CASES[index]
    got = keras.preprocessing.sequence.pad_sequences(seqs, **kwargs)
    want = np.asarray(keras_results["pad"][index])
    assert got.shape == want.shape and np.array_equal(got, want)
    assert got.dtype == np.dtype(kwargs.get("dtype", "int32"))


def test_pad_sequences_errors():
    assert utils.pad_sequences([[1, 2], [3]], maxlen=0).shape == (2, 0)  # (Keras 3.15.1 fails here)
    with pytest.raises(ValueError, match="non-iterable"):
        utils.pad_sequences([[1], 2])
    with pytest.raises(ValueError, match='Padding type "middle" not understood'):
        utils.pad_sequences([[1]], padding="middle")
    with pytest.raises(ValueError, match="is not compatible with `value`"):
        utils.pad_sequences([[1]], value="x")
    with pytest.raises(ValueError, match="Shape of sample"):
        utils.pad_sequences([[[1, 2]], [[1, 2, 3]]])


def test_normalize_matches_keras_and_differentiates(keras_results):
    x = np.array([[3.0, 4.0, 0.0], [0.0, 0.0, 0.0], [1.0, -2.0, 2.0]])
    np.testing.assert_allclose(utils.normalize(x), keras_results["normalize"][0], rtol=1e-12)
    np.testing.assert_allclose(utils.normalize(x, axis=0, order=1), keras_results["normalize"][1], rtol=1e-12)
    t = keras.Variable(np.array([[3.0, 4.0]], "float32"))
    with keras.GradientTape() as tape:
        out = keras.ops.sum(utils.normalize(t) * np.array([[1.0, 0.0]], "float32"))
    grad = keras.ops.convert_to_numpy(tape.gradient(out, t))
    # d(x0/|x|)/dx = (|x|^2 - x0 x) / |x|^3
    np.testing.assert_allclose(grad, [[16 / 125, -12 / 125]], rtol=1e-5)


def test_pack_and_unpack():
    x, y, w = np.ones(2), np.zeros(2), np.full(2, 0.5)
    assert utils.pack_x_y_sample_weight(x) is x
    assert utils.pack_x_y_sample_weight((x,)) == ((x,),)
    assert utils.pack_x_y_sample_weight(x, y) == (x, y) and utils.pack_x_y_sample_weight(x, y, w) == (x, y, w)
    assert utils.unpack_x_y_sample_weight(x) == (x, None, None)
    assert utils.unpack_x_y_sample_weight([x, y]) == (x, y, None)
    assert utils.unpack_x_y_sample_weight((x, y, w)) == (x, y, w)
    with pytest.raises(ValueError, match="Data is expected to be in format"):
        utils.unpack_x_y_sample_weight((x, y, w, w))


def test_split_dataset():
    x, y = np.arange(10).reshape(10, 1), np.arange(10) * 2
    (lx, ly), (rx, ry) = utils.split_dataset((x, y), left_size=0.8)
    assert lx.shape == (8, 1) and np.array_equal(ly, y[:8]) and np.array_equal(rx[:, 0], [8, 9])
    left, right = utils.split_dataset(list(range(5)), right_size=2, shuffle=True, seed=3)
    assert len(left) == 3 and len(right) == 2 and sorted(left + right) == list(range(5)) and left != [0, 1, 2]
    d_left, d_right = utils.split_dataset({"a": x, "b": y}, left_size=3)
    assert d_left["a"].shape == (3, 1) and d_right["b"].shape == (7,)
    with pytest.raises(ValueError, match="left_size must be"):
        utils.split_dataset(x, left_size=1.5)
    with pytest.raises(TypeError, match="either `left_size` or `right_size`"):
        utils.split_dataset(x)
    with pytest.raises(ValueError, match="same length"):
        utils.split_dataset((x, y[:3]), left_size=1)


@pytest.mark.parametrize("kwargs", [
    {"sequence_length": 3}, {"sequence_length": 4, "sequence_stride": 2, "sampling_rate": 2, "batch_size": 3},
    {"sequence_length": 2, "start_index": 3, "end_index": 15, "batch_size": 4},
    {"sequence_length": 3, "batch_size": None}, {"sequence_length": 5, "shuffle": True, "seed": 7, "batch_size": 2},
])
def test_timeseries_windows_match_the_keras_definition(kwargs):
    data = np.arange(20 * 2).reshape(20, 2).astype("float32")
    targets = np.arange(20) * 10
    ds = utils.timeseries_dataset_from_array(data, targets, **kwargs)
    length, stride, rate = kwargs["sequence_length"], kwargs.get("sequence_stride", 1), kwargs.get("sampling_rate", 1)
    start, end = kwargs.get("start_index") or 0, kwargs.get("end_index") or 20
    n = min(end - start - (length - 1) * rate, len(targets))
    starts = np.arange(0, n, stride)
    if kwargs.get("shuffle"):
        np.random.RandomState(kwargs["seed"]).shuffle(starts)
    want_x = np.stack([data[start:end][s + np.arange(length) * rate] for s in starts])
    want_y = targets[start:end][starts]
    batches = list(ds)
    if kwargs.get("batch_size", 128) is None:
        got_x, got_y = np.stack([b[0] for b in batches]), np.array([b[1] for b in batches])
    else:
        assert all(len(b[0]) <= kwargs.get("batch_size", 128) for b in batches)
        got_x, got_y = np.concatenate([b[0] for b in batches]), np.concatenate([b[1] for b in batches])
    np.testing.assert_array_equal(got_x, want_x)
    np.testing.assert_array_equal(got_y, want_y)


def test_timeseries_feeds_fit_and_checks_arguments():
    data = np.random.default_rng(0).normal(size=(50, 1)).astype("float32")
    ds = utils.timeseries_dataset_from_array(data, data[:, 0] * 2, sequence_length=4, batch_size=8)
    only_x = utils.timeseries_dataset_from_array(data, None, sequence_length=4, batch_size=8)
    assert only_x[0].shape == (8, 4, 1)
    model = keras.Sequential([keras.Input((4, 1)), keras.layers.Flatten(), keras.layers.Dense(1)])
    model.compile(optimizer="adam", loss="mse")
    history = model.fit(ds, epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"][0])
    with pytest.raises(ValueError, match="sampling_rate"):
        utils.timeseries_dataset_from_array(data, None, 3, sampling_rate=0)
    with pytest.raises(ValueError, match="end_index"):
        utils.timeseries_dataset_from_array(data, None, 3, end_index=100)


def test_config():
    c = utils.Config(lr=0.1, layers=[2, 3])
    c.extra = 1
    assert c.lr == 0.1 and c["layers"] == [2, 3] and c.extra == 1 and "lr" in c and len(c) == 3
    assert json.loads(c.to_json()) == {"lr": 0.1, "layers": [2, 3], "extra": 1}
    c.freeze()
    with pytest.raises(ValueError, match="frozen"):
        c.lr = 2
    with pytest.raises(AttributeError, match="Unknown attribute: 'missing'"):
        c.missing


def test_get_source_inputs():
    a, b = keras.Input((3,)), keras.Input((2,))
    out = keras.layers.Concatenate()([keras.layers.Dense(2)(a), keras.layers.Dense(2)(b), keras.layers.Dense(2)(a)])
    sources = utils.get_source_inputs(out)
    assert len(sources) == 2 and sources[0] is a and sources[1] is b
    assert utils.get_source_inputs(a)[0] is a


@pytest.mark.skipif(importlib.util.find_spec("PIL") is not None, reason="Pillow is installed")
def test_image_helpers_without_pillow_say_what_to_install():
    with pytest.raises(ImportError, match=r"load_img needs Pillow.*pip install 'dnnbind\[images\]'"):
        utils.load_img("x.png")
    with pytest.raises(ImportError, match="array_to_img needs Pillow"):
        keras.preprocessing.image.array_to_img(np.zeros((2, 2, 3)))


def test_img_to_array_layouts():
    img = np.arange(12).reshape(2, 2, 3)
    assert utils.img_to_array(img).shape == (2, 2, 3)
    assert utils.img_to_array(img, data_format="channels_first").shape == (3, 2, 2)
    assert utils.img_to_array(img[..., 0]).shape == (2, 2, 1)
    with pytest.raises(ValueError, match="Unsupported image shape"):
        utils.img_to_array(np.zeros(3))


# ----- get_file ------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("served")
    (root / "data.bin").write_bytes(b"dnnbind get_file payload " * 100)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        payload = b"inside the archive"
        info = tarfile.TarInfo("folder/inner.txt")
        info.size = len(payload)
        tar.addfile(info, io.BytesIO(payload))
    (root / "pack.tar.gz").write_bytes(buf.getvalue())
    with zipfile.ZipFile(root / "evil.zip", "w") as zf:
        zf.writestr("../escape.txt", "no")
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    handler.log_message = lambda *a, **k: None
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", root
    httpd.shutdown()


def test_get_file_downloads_verifies_and_caches(server, tmp_path):
    url, root = server
    data = (root / "data.bin").read_bytes()
    sha, md5 = hashlib.sha256(data).hexdigest(), hashlib.md5(data).hexdigest()
    path = utils.get_file(origin=f"{url}/data.bin", file_hash=sha, cache_dir=tmp_path)
    assert path == str(tmp_path / "datasets" / "data.bin") and open(path, "rb").read() == data
    mtime = os.stat(path).st_mtime_ns
    assert utils.get_file("data.bin", f"{url}/data.bin", md5_hash=md5, cache_dir=tmp_path) == path
    assert os.stat(path).st_mtime_ns == mtime  # served from the cache
    with open(path, "wb") as f:
        f.write(b"corrupted")
    utils.get_file("data.bin", f"{url}/data.bin", file_hash=sha, cache_dir=tmp_path)  # re-downloaded
    assert open(path, "rb").read() == data
    with pytest.raises(DownloadError, match="hash"):
        utils.get_file("other.bin", f"{url}/data.bin", file_hash="0" * 64, cache_dir=tmp_path)
    assert not any(p.name.startswith("other.bin") for p in (tmp_path / "datasets").iterdir())


def test_get_file_extracts_safely(server, tmp_path):
    url, _ = server
    folder = utils.get_file("pack.tar.gz", f"{url}/pack.tar.gz", extract=True, cache_dir=tmp_path)
    assert folder == str(tmp_path / "datasets" / "pack_extracted")
    assert open(os.path.join(folder, "folder", "inner.txt")).read() == "inside the archive"
    with pytest.raises(ValueError, match="outside"):
        utils.get_file("evil.zip", f"{url}/evil.zip", extract=True, cache_dir=tmp_path)
    assert not (tmp_path / "datasets" / "escape.txt").exists()


def test_get_file_offline_names_the_url_and_where_to_put_the_file(tmp_path):
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens there once closed
    with pytest.raises(DownloadError, match=rf"could not download http://127.0.0.1:{port}/x.npz .*place it at "
                                            rf"{tmp_path}/datasets/x.npz"):
        utils.get_file(origin=f"http://127.0.0.1:{port}/x.npz", cache_dir=tmp_path, timeout=5)
    with pytest.raises(ValueError, match="origin"):
        utils.get_file("x")
    with pytest.raises(ValueError, match="Paths are no longer accepted"):
        utils.get_file("a/b", "http://x/y")


def test_every_keras_utils_name_is_reachable():
    names = ["Config", "CustomObjectScope", "Progbar", "PyDataset", "Sequence", "array_to_img", "clear_session",
             "custom_object_scope", "deserialize_keras_object", "disable_interactive_logging",
             "enable_interactive_logging", "get_custom_objects", "get_file", "get_registered_name",
             "get_registered_object", "get_source_inputs", "img_to_array", "is_interactive_logging_enabled",
             "is_keras_tensor", "load_img", "normalize", "pack_x_y_sample_weight", "pad_sequences",
             "register_keras_serializable", "save_img", "serialize_keras_object", "set_random_seed", "split_dataset",
             "standardize_dtype", "timeseries_dataset_from_array", "to_categorical", "unpack_x_y_sample_weight",
             "image_dataset_from_directory", "text_dataset_from_directory", "audio_dataset_from_directory",
             "model_to_dot", "plot_model"]
    assert [n for n in names if not hasattr(keras.utils, n)] == []
    assert utils.clear_session is keras.backend.clear_session
    assert [n for n in ("image", "sequence", "timeseries_dataset_from_array") if not hasattr(keras.preprocessing, n)] == []


# ----- *_dataset_from_directory ------------------------------------------------------------------------------
def _tree(root, files):
    for rel, content in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)


def test_text_dataset_from_directory_indexes_as_keras(tmp_path):
    _tree(tmp_path, {"pos/b.txt": "good movie", "pos/a.txt": "great", "neg/z.txt": "bad", "neg/sub/y.txt": "awful",
                     "neg/ignored.md": "not a text file"})
    ds = utils.text_dataset_from_directory(tmp_path, batch_size=2, shuffle=False, verbose=False)
    assert ds.class_names == ["neg", "pos"] and len(ds) == 2
    assert [os.path.relpath(p, tmp_path) for p in ds.file_paths] == ["neg/sub/y.txt", "neg/z.txt", "pos/a.txt",
                                                                     "pos/b.txt"]
    texts, labels = ds[0]
    assert list(texts) == ["awful", "bad"] and labels.dtype == np.int32 and list(labels) == [0, 0]
    cat = utils.text_dataset_from_directory(tmp_path, label_mode="categorical", max_length=4, shuffle=False,
                                            verbose=False)
    texts, labels = cat[0]
    assert list(texts) == ["awfu", "bad", "grea", "good"] and labels.tolist() == [[1, 0], [1, 0], [0, 1], [0, 1]]
    train, val = utils.text_dataset_from_directory(tmp_path, validation_split=0.25, subset="both", seed=3,
                                                   verbose=False)
    assert len(train.file_paths) == 3 and len(val.file_paths) == 1
    assert sorted(train.file_paths + val.file_paths) == sorted(ds.file_paths)
    shuffled = utils.text_dataset_from_directory(tmp_path, seed=3, validation_split=0.25, subset="training",
                                                 verbose=False)
    assert shuffled.file_paths == train.file_paths  # one shuffle for both subsets, fixed by the seed
    with pytest.raises(ValueError, match="class_names"):
        utils.text_dataset_from_directory(tmp_path, class_names=["pos"], verbose=False)
    with pytest.raises(ValueError, match="`subset` must be"):
        utils.text_dataset_from_directory(tmp_path, validation_split=0.2, verbose=False)
    with pytest.raises(ValueError, match="exactly 2 class_names"):
        _tree(tmp_path, {"third/c.txt": "x"})
        utils.text_dataset_from_directory(tmp_path, label_mode="binary", verbose=False)


def _wav(samples: np.ndarray, rate: int = 8000) -> bytes:
    import wave
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(samples.shape[1])
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes((samples * 32767).astype("<i2").tobytes())
    return buf.getvalue()


def test_audio_dataset_from_directory_reads_wav(tmp_path):
    a = np.linspace(-0.5, 0.5, 10).reshape(10, 1)
    b = np.linspace(0.25, -0.25, 6).reshape(6, 1)
    _tree(tmp_path, {"cat/a.wav": _wav(a), "dog/b.wav": _wav(b)})
    ds = utils.audio_dataset_from_directory(tmp_path, batch_size=2, shuffle=False, verbose=False)
    audio, labels = ds[0]
    assert audio.shape == (2, 10, 1) and list(labels) == [0, 1]
    np.testing.assert_allclose(audio[0, :, 0], a[:, 0], atol=1e-4)
    np.testing.assert_allclose(audio[1, :6, 0], b[:, 0], atol=1e-4)
    assert np.all(audio[1, 6:] == 0)
    cut = utils.audio_dataset_from_directory(tmp_path, output_sequence_length=4, shuffle=False, verbose=False)
    assert cut[0][0].shape == (2, 4, 1)
    with pytest.raises(ValueError, match="not sampling_rate=16000"):
        utils.audio_dataset_from_directory(tmp_path, sampling_rate=16000, verbose=False)[0]
    with pytest.raises(ValueError, match="ragged=True is not supported"):
        utils.audio_dataset_from_directory(tmp_path, ragged=True)


@pytest.mark.skipif(importlib.util.find_spec("PIL") is not None, reason="Pillow is installed")
def test_image_dataset_without_pillow_says_what_to_install(tmp_path):
    with pytest.raises(ImportError, match="image_dataset_from_directory needs Pillow"):
        keras.preprocessing.image_dataset_from_directory(tmp_path)
