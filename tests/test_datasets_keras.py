"""The Keras data sets beyond MNIST/CIFAR-10: each loader against real Keras's own loader on the same file (a small
file in Keras's format, made here; Keras's download is replaced by that path in its subprocess), the ragged-array
reader refusing what is not word-id lists, and the offline error naming the URL and where to put the file."""

from __future__ import annotations

import gzip
import importlib.util
import io
import json
import os
import pickle
import socket
import subprocess
import sys
import tarfile
import zipfile

import numpy as np
import pytest

from dnnbind.datasets import (DatasetFormatError, DownloadError, _tabular, boston_housing, california_housing,
                              cifar100, fashion_mnist, imdb, reuters)


def _ragged(rng, n, vocab=60):
    out = np.empty(n, dtype=object)
    for i in range(n):
        out[i] = [int(v) for v in rng.integers(1, vocab, size=int(rng.integers(1, 12)))]
    return out


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """Small files in Keras's formats (the ragged ones through np.savez, which pickles object arrays: this is
    how Keras's own files were written; dnnbind only reads them, without unpickling)."""
    d = tmp_path_factory.mktemp("keras_files")
    rng = np.random.default_rng(0)
    np.savez(d / "imdb.npz", x_train=_ragged(rng, 30), y_train=rng.integers(0, 2, 30),
             x_test=_ragged(rng, 20), y_test=rng.integers(0, 2, 20))
    np.savez(d / "reuters.npz", x=_ragged(rng, 40), y=rng.integers(0, 46, 40))
    np.savez(d / "boston_housing.npz", x=rng.normal(size=(50, 13)), y=rng.normal(size=50))
    np.savez(d / "california_housing.npz", x=rng.normal(size=(700, 8)).astype("float32"),
             y=rng.normal(size=700).astype("float32"))
    return d


_KERAS_SCRIPT = r"""
import json, sys, numpy as np
d = sys.argv[1]
import keras
from keras.src.datasets import imdb, reuters, boston_housing, california_housing
for m in (imdb, reuters, boston_housing, california_housing):
    m.get_file = lambda fname=None, origin=None, **k: d + "/" + origin.rsplit("/", 1)[1]
def flat(split):
    (a, b), (c, e) = split
    conv = lambda x: [list(map(int, s)) for s in x] if x.dtype == object else np.asarray(x).tolist()
    return [conv(a), conv(b), conv(c), conv(e)]
out = {
  "imdb": flat(imdb.load_data()), "imdb_cut": flat(imdb.load_data(num_words=30, skip_top=3, maxlen=9, seed=5)),
  "imdb_nooov": flat(imdb.load_data(num_words=20, oov_char=None, start_char=None, index_from=0)),
  "reuters": flat(reuters.load_data()), "reuters_cut": flat(reuters.load_data(num_words=25, test_split=0.3)),
  "boston": flat(boston_housing.load_data()), "boston_split": flat(boston_housing.load_data(test_split=0.5, seed=1)),
  "california": flat(california_housing.load_data()),
  "california_small": flat(california_housing.load_data(version="small", test_split=0.1)),
}
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def keras_results(files, tmp_path_factory):
    if importlib.util.find_spec("keras") is None:
        pytest.skip("needs Keras installed (test extra)")
    work = tmp_path_factory.mktemp("keras_ds")
    env = {k: v for k, v in os.environ.items() if k not in ("KERAS_HOME", "KERAS_BACKEND")}
    env.update(KERAS_HOME=str(work), KERAS_BACKEND="numpy")
    proc = subprocess.run([sys.executable, "-c", _KERAS_SCRIPT, str(files)], capture_output=True, text=True,
                          timeout=180, env=env, cwd=str(work))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _flat(split):
    (a, b), (c, e) = split
    conv = lambda x: [list(map(int, s)) for s in x] if x.dtype == object else np.asarray(x).tolist()  # noqa: E731
    return [conv(a), conv(b), conv(c), conv(e)]


@pytest.mark.parametrize("key, load", [
    ("imdb", lambda d: imdb.load_data(data_dir=d)),
    ("imdb_cut", lambda d: imdb.load_data(num_words=30, skip_top=3, maxlen=9, seed=5, data_dir=d)),
    ("imdb_nooov", lambda d: imdb.load_data(num_words=20, oov_char=None, start_char=None, index_from=0, data_dir=d)),
    ("reuters", lambda d: reuters.load_data(data_dir=d)),
    ("reuters_cut", lambda d: reuters.load_data(num_words=25, test_split=0.3, data_dir=d)),
    ("boston", lambda d: boston_housing.load_data(data_dir=d)),
    ("boston_split", lambda d: boston_housing.load_data(test_split=0.5, seed=1, data_dir=d)),
    ("california", lambda d: california_housing.load_data(data_dir=d)),
    ("california_small", lambda d: california_housing.load_data(version="small", test_split=0.1, data_dir=d)),
])
def test_loaders_match_keras(files, keras_results, key, load):
    got = _flat(load(files))
    want = keras_results[key]
    assert len(got[0]) == len(want[0]) > 0
    assert got == want  # word-id lists, labels and (float64/float32 as JSON, exactly) features


def test_the_ragged_reader_refuses_anything_else(tmp_path):
    class Evil:
        def __reduce__(self):
            return (os.system, ("echo hacked",))

    buf = io.BytesIO()
    np.lib.format.write_array(buf, np.array([Evil()], dtype=object), allow_pickle=True)
    with zipfile.ZipFile(tmp_path / "imdb.npz", "w") as zf:
        for k in ("x_train", "x_test"):
            zf.writestr(f"{k}.npy", buf.getvalue())
        for k in ("y_train", "y_test"):
            b = io.BytesIO()
            np.lib.format.write_array(b, np.zeros(1, np.int64))
            zf.writestr(f"{k}.npy", b.getvalue())
    with pytest.raises(DatasetFormatError, match="names posix.system|names nt.system|refused"):
        imdb.load_data(data_dir=tmp_path)
    nested = io.BytesIO()
    np.lib.format.write_array(nested, np.array([[1.5, "a"]], dtype=object), allow_pickle=True)
    with zipfile.ZipFile(tmp_path / "reuters.npz", "w") as zf:
        zf.writestr("x.npy", nested.getvalue())
        zf.writestr("y.npy", nested.getvalue())
    with pytest.raises(DatasetFormatError, match="refused"):
        reuters.load_data(data_dir=tmp_path)


def test_cifar100_binary_records(tmp_path):
    rng = np.random.default_rng(1)
    train = rng.integers(0, 256, size=(7, 2 + 3072), dtype=np.uint8)
    test = rng.integers(0, 256, size=(3, 2 + 3072), dtype=np.uint8)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, arr in (("train.bin", train), ("test.bin", test)):
            info = tarfile.TarInfo(f"cifar-100-binary/{name}")
            info.size = arr.nbytes
            tar.addfile(info, io.BytesIO(arr.tobytes()))
    (tmp_path / "cifar-100-binary.tar.gz").write_bytes(buf.getvalue())
    (x, y), (xt, yt) = cifar100.load_data(data_dir=tmp_path)
    assert x.shape == (7, 32, 32, 3) and x.dtype == np.uint8 and y.shape == (7, 1) and y.dtype == np.int64
    assert np.array_equal(y[:, 0], train[:, 1]) and xt.shape == (3, 32, 32, 3)
    # the red channel of the first image is the first 1024 pixel bytes, row-major
    assert np.array_equal(x[0, :, :, 0], train[0, 2:1026].reshape(32, 32))
    (_, yc), _ = cifar100.load_data("coarse", data_dir=tmp_path)
    assert np.array_equal(yc[:, 0], train[:, 0])
    with pytest.raises(ValueError, match="label_mode"):
        cifar100.load_data("medium", data_dir=tmp_path)


def _idx(arr: np.ndarray) -> bytes:
    header = bytes([0, 0, 0x08, arr.ndim]) + b"".join(int(s).to_bytes(4, "big") for s in arr.shape)
    return gzip.compress(header + arr.tobytes())


def test_fashion_mnist_reads_idx_files(tmp_path):
    rng = np.random.default_rng(2)
    arrays = {"train_images": rng.integers(0, 256, (5, 28, 28), dtype=np.uint8),
              "train_labels": rng.integers(0, 10, 5, dtype=np.uint8),
              "test_images": rng.integers(0, 256, (2, 28, 28), dtype=np.uint8),
              "test_labels": rng.integers(0, 10, 2, dtype=np.uint8)}
    for key, arr in arrays.items():
        (tmp_path / fashion_mnist.FILES[key].filename).write_bytes(_idx(arr))
    (x, y), (xt, yt) = fashion_mnist.load_data(data_dir=tmp_path)
    assert np.array_equal(x, arrays["train_images"]) and np.array_equal(yt, arrays["test_labels"])


def test_offline_error_names_the_url_and_the_manual_path(tmp_path, monkeypatch):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setattr(_tabular, "KERAS_MIRRORS", [f"http://127.0.0.1:{port}/"])
    monkeypatch.setenv("DNNBIND_DATA", str(tmp_path))
    with pytest.raises(DownloadError) as info:
        boston_housing.load_data()
    message = str(info.value)
    assert f"http://127.0.0.1:{port}/boston_housing.npz" in message
    assert str(tmp_path / "boston_housing") in message and "sha256 f553886a" in message
    with pytest.raises(FileNotFoundError, match="data_dir= must hold imdb.npz"):
        imdb.load_data(data_dir=tmp_path)
