"""dnnbind.datasets: IDX / CIFAR-10 binary parsers and the verified download path.

Files are generated here in the real formats; a loopback HTTP server serves them so
that the real urllib download code runs (mirror fallback, checksum mismatch,
interrupted transfer, cache hit). Nothing reads ../shared or the internet.
"""

from __future__ import annotations

import gzip
import hashlib
import http.server
import io
import struct
import tarfile
import threading

import numpy as np
import pytest

from dnnbind.datasets import cifar10, download, mnist
from dnnbind.datasets.download import ChecksumError, DatasetFormatError, DownloadError, RemoteFile


# ---------------------------------------------------------------- file makers (real formats)

def idx_bytes(array: np.ndarray, type_code: int = 0x08) -> bytes:
    header = bytes([0, 0, type_code, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    big = array.astype(array.dtype.newbyteorder(">"))
    return header + big.tobytes()


def mnist_files(rng, n_train: int = 30, n_test: int = 12) -> dict[str, bytes]:
    """The four gzipped IDX files with random pixels and labels (never all zero)."""
    out = {}
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        images = rng.integers(1, 256, size=(n, 28, 28), dtype=np.uint8)
        labels = (np.arange(n) % 10).astype(np.uint8)
        rng.shuffle(labels)
        out[f"{prefix}-images-idx3-ubyte.gz"] = gzip.compress(idx_bytes(images))
        out[f"{prefix}-labels-idx1-ubyte.gz"] = gzip.compress(idx_bytes(labels))
    return out


def cifar_records(rng, n: int) -> tuple[bytes, np.ndarray, np.ndarray]:
    images_chw = rng.integers(0, 256, size=(n, 3, 32, 32), dtype=np.uint8)
    labels = rng.integers(0, 10, size=n, dtype=np.uint8)
    blob = b"".join(bytes([labels[i]]) + images_chw[i].tobytes() for i in range(n))
    return blob, images_chw.transpose(0, 2, 3, 1), labels.reshape(-1, 1)


def cifar_archive(rng, per_batch: int = 4) -> tuple[bytes, dict[str, tuple[np.ndarray, np.ndarray]]]:
    buf = io.BytesIO()
    expected = {}
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name in (*cifar10.TRAIN_FILES, cifar10.TEST_FILE):
            blob, images, labels = cifar_records(rng, per_batch)
            expected[name] = (images, labels)
            info = tarfile.TarInfo(f"{cifar10.MEMBER_DIR}/{name}")
            info.size = len(blob)
            tar.addfile(info, io.BytesIO(blob))
        meta = b"airplane\nautomobile\n"
        info = tarfile.TarInfo(f"{cifar10.MEMBER_DIR}/batches.meta.txt")
        info.size = len(meta)
        tar.addfile(info, io.BytesIO(meta))
    return buf.getvalue(), expected


def md5(data: bytes) -> str:
    return hashlib.md5(data).hexdigest()


# ---------------------------------------------------------------- loopback server

class _Server:
    """Serves ``routes[path] = bytes``; ``truncate[path] = n`` sends n bytes, then closes."""

    def __init__(self) -> None:
        self.routes: dict[str, bytes] = {}
        self.truncate: dict[str, int] = {}
        self.hits: list[str] = []
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 - http.server API
                owner.hits.append(self.path)
                body = owner.routes.get(self.path)
                if body is None:
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                cut = owner.truncate.get(self.path)
                self.wfile.write(body if cut is None else body[:cut])
                if cut is not None:
                    self.close_connection = True

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                       daemon=True)
        self.thread.start()
        self.base = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=5)


@pytest.fixture
def server():
    srv = _Server()
    yield srv
    srv.close()


@pytest.fixture
def cache(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    monkeypatch.setenv("DNNBIND_DATA", str(root))
    return root


def leftovers(directory) -> list[str]:
    return sorted(p.name for p in directory.iterdir()) if directory.exists() else []


def serve_mnist(server, monkeypatch, files, *, prefix="/m/", extra_mirrors=()):
    for name, data in files.items():
        server.routes[prefix + name] = data
    specs = {}
    for key, spec in mnist.FILES.items():
        specs[key] = RemoteFile(spec.filename, md5=md5(files[spec.filename]))
    monkeypatch.setattr(mnist, "FILES", specs)
    monkeypatch.setattr(mnist, "MIRRORS", [*extra_mirrors, server.base + prefix])


# ---------------------------------------------------------------- IDX parser

def test_load_idx_roundtrip_all_types(tmp_path, rng):
    cases = [
        (0x08, rng.integers(1, 256, (3, 4, 5), dtype=np.uint8)),
        (0x09, rng.integers(-128, 128, (7,), dtype=np.int8)),
        (0x0B, rng.integers(-3000, 3000, (2, 3), dtype=np.int16)),
        (0x0C, rng.integers(-10**6, 10**6, (4, 2), dtype=np.int32)),
        (0x0D, rng.standard_normal((2, 2, 2)).astype(np.float32)),
        (0x0E, rng.standard_normal((3,))),
    ]
    for i, (code, arr) in enumerate(cases):
        raw = idx_bytes(arr, code)
        plain = tmp_path / f"a{i}.idx"
        plain.write_bytes(raw)
        packed = tmp_path / f"a{i}.idx.gz"
        packed.write_bytes(gzip.compress(raw))
        for path in (plain, packed):
            out = mnist.load_idx(path)
            assert out.dtype == arr.dtype and out.dtype.isnative
            np.testing.assert_array_equal(out, arr)


@pytest.mark.parametrize("raw, match", [
    (b"\x01\x00\x08\x01\x00\x00\x00\x01\x05", "magic number"),
    (b"\x00\x00\x07\x01\x00\x00\x00\x01\x05", "unknown IDX type code 0x07"),
    (b"\x00\x00\x08\x03\x00\x00", "truncated IDX header"),
    (b"\x00\x00\x08\x01\x00\x00\x00\x05\x01\x02", r"shape \(5,\).*5 data bytes.*holds 2"),
    (b"", "empty file"),
])
def test_load_idx_rejects_bad_files(tmp_path, raw, match):
    path = tmp_path / "bad.idx"
    path.write_bytes(raw)
    with pytest.raises(DatasetFormatError, match=match):
        mnist.load_idx(path)


def test_load_idx_corrupt_gzip(tmp_path):
    path = tmp_path / "bad.gz"
    path.write_bytes(gzip.compress(idx_bytes(np.ones(100, np.uint8)))[:30])
    with pytest.raises(DatasetFormatError, match="corrupt gzip"):
        mnist.load_idx(path)


# ---------------------------------------------------------------- local MNIST directories

def test_mnist_load_data_from_dir_gz_and_plain(tmp_path, rng):
    files = mnist_files(rng)
    for name, data in files.items():
        # half gzipped, half plain: both spellings are found
        if name.startswith("train"):
            (tmp_path / name).write_bytes(data)
        else:
            (tmp_path / name[:-3]).write_bytes(gzip.decompress(data))
    (x_train, y_train), (x_test, y_test) = mnist.load_data(data_dir=tmp_path)
    assert x_train.shape == (30, 28, 28) and x_train.dtype == np.uint8
    assert y_train.shape == (30,) and y_train.dtype == np.uint8
    assert x_test.shape == (12, 28, 28) and y_test.shape == (12,)
    np.testing.assert_array_equal(x_train, mnist.load_idx(tmp_path / "train-images-idx3-ubyte.gz"))
    np.testing.assert_array_equal(
        y_test, np.frombuffer(gzip.decompress(files["t10k-labels-idx1-ubyte.gz"])[8:], np.uint8))
    # path= pointing at the directory is the same thing
    (x2, _), _ = mnist.load_data(path=tmp_path)
    np.testing.assert_array_equal(x2, x_train)


def test_mnist_test_only_directory(tmp_path, rng):
    files = mnist_files(rng)
    for name in ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"):
        (tmp_path / name).write_bytes(files[name])
    with pytest.raises(FileNotFoundError, match="only the test files"):
        mnist.load_data(data_dir=tmp_path)
    x, y = mnist.load_subset("test", data_dir=tmp_path)
    assert x.shape == (12, 28, 28) and y.shape == (12,)
    with pytest.raises(FileNotFoundError, match="train-images-idx3-ubyte.gz and train-labels"):
        mnist.load_subset("train", data_dir=tmp_path)


def test_mnist_rejects_inconsistent_files(tmp_path, rng):
    files = mnist_files(rng)
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    (tmp_path / "t10k-labels-idx1-ubyte.gz").write_bytes(gzip.compress(idx_bytes(np.arange(5, dtype=np.uint8))))
    with pytest.raises(DatasetFormatError, match="12 images but .* 5 labels"):
        mnist.load_subset("test", data_dir=tmp_path)
    (tmp_path / "t10k-labels-idx1-ubyte.gz").write_bytes(
        gzip.compress(idx_bytes(np.full(12, 11, dtype=np.uint8))))
    with pytest.raises(DatasetFormatError, match="label 11 is outside"):
        mnist.load_subset("test", data_dir=tmp_path)
    (tmp_path / "t10k-images-idx3-ubyte.gz").write_bytes(
        gzip.compress(idx_bytes(np.ones((12, 27, 28), dtype=np.uint8))))
    with pytest.raises(DatasetFormatError, match=r"\(N, 28, 28\)"):
        mnist.load_subset("test", data_dir=tmp_path)


def test_mnist_npz_path_without_pickle(tmp_path, rng):
    arrays = {"x_train": rng.integers(0, 256, (4, 28, 28), dtype=np.uint8),
              "y_train": np.arange(4, dtype=np.uint8),
              "x_test": rng.integers(0, 256, (2, 28, 28), dtype=np.uint8),
              "y_test": np.arange(2, dtype=np.uint8)}
    np.savez(tmp_path / "mnist.npz", **arrays)
    (x, y), (xt, yt) = mnist.load_data(path=tmp_path / "mnist.npz")
    np.testing.assert_array_equal(x, arrays["x_train"])
    np.testing.assert_array_equal(yt, arrays["y_test"])
    np.savez(tmp_path / "evil.npz", x_train=np.array([{"a": 1}], dtype=object),
             y_train=arrays["y_train"], x_test=arrays["x_test"], y_test=arrays["y_test"])
    with pytest.raises(ValueError, match="pickle"):
        mnist.load_data(path=tmp_path / "evil.npz")


# ---------------------------------------------------------------- CIFAR-10 binary

def test_cifar_parse_records_chw_to_hwc(rng):
    blob, images, labels = cifar_records(rng, 3)
    x, y = cifar10.parse_records(blob)
    assert x.shape == (3, 32, 32, 3) and x.dtype == np.uint8
    assert y.shape == (3, 1) and y.dtype == np.uint8
    np.testing.assert_array_equal(x, images)
    np.testing.assert_array_equal(y, labels)
    # the red plane comes first in a record: pixel (0, 0) red is byte 1
    assert x[0, 0, 0, 0] == blob[1] and x[0, 0, 0, 1] == blob[1 + 1024] and x[0, 0, 1, 0] == blob[2]
    with pytest.raises(DatasetFormatError, match="whole number of 3073-byte"):
        cifar10.parse_records(blob[:-1])
    with pytest.raises(DatasetFormatError, match="label 200"):
        cifar10.parse_records(bytes([200]) + blob[1:])


def test_cifar_load_data_from_archive_and_directories(tmp_path, rng):
    archive, expected = cifar_archive(rng)
    (tmp_path / "cifar-10-binary.tar.gz").write_bytes(archive)
    (x_train, y_train), (x_test, y_test) = cifar10.load_data(data_dir=tmp_path)
    assert x_train.shape == (20, 32, 32, 3) and y_train.shape == (20, 1)
    np.testing.assert_array_equal(x_train[4:8], expected["data_batch_2.bin"][0])
    np.testing.assert_array_equal(y_test, expected["test_batch.bin"][1])
    # the extracted folder reads the same
    extracted = tmp_path / "x"
    with tarfile.open(tmp_path / "cifar-10-binary.tar.gz") as tar:
        tar.extractall(extracted, filter="data")
    (x2, y2), (xt2, yt2) = cifar10.load_data(data_dir=extracted)
    np.testing.assert_array_equal(x2, x_train)
    np.testing.assert_array_equal(yt2, y_test)
    with pytest.raises(FileNotFoundError, match="cifar-10-binary.tar.gz"):
        cifar10.load_data(data_dir=tmp_path / "x" / "nothing-here")


def test_cifar_archive_missing_member(tmp_path, rng):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        blob, _, _ = cifar_records(rng, 2)
        info = tarfile.TarInfo(f"{cifar10.MEMBER_DIR}/data_batch_1.bin")
        info.size = len(blob)
        tar.addfile(info, io.BytesIO(blob))
    (tmp_path / "cifar-10-binary.tar.gz").write_bytes(buf.getvalue())
    with pytest.raises(DatasetFormatError, match="lacks .*data_batch_2.bin"):
        cifar10.load_data(data_dir=tmp_path)


# ---------------------------------------------------------------- download path

def test_mnist_download_then_cache_hit(server, cache, monkeypatch, rng):
    files = mnist_files(rng)
    serve_mnist(server, monkeypatch, files)
    (x_train, y_train), (x_test, y_test) = mnist.load_data()
    assert x_train.shape == (30, 28, 28) and y_test.shape == (12,)
    assert len(server.hits) == 4
    assert leftovers(cache / "mnist") == sorted(files)
    for name, data in files.items():
        assert (cache / "mnist" / name).read_bytes() == data
    (x2, _), _ = mnist.load_data()
    np.testing.assert_array_equal(x2, x_train)
    assert len(server.hits) == 4, "second load must come from the cache"


def test_mirror_404_falls_back(server, cache, monkeypatch, rng):
    files = mnist_files(rng)
    serve_mnist(server, monkeypatch, files, prefix="/good/", extra_mirrors=[server.base + "/missing/"])
    mnist.load_data()
    assert sum(h.startswith("/missing/") for h in server.hits) == 4
    assert sum(h.startswith("/good/") for h in server.hits) == 4
    assert leftovers(cache / "mnist") == sorted(files)


def test_unreachable_mirror_falls_back(server, cache, monkeypatch, rng):
    # a port nothing listens on: connection refused, then the next mirror
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}/"
    files = mnist_files(rng)
    serve_mnist(server, monkeypatch, files, extra_mirrors=[dead])
    (x, _), _ = mnist.load_data()
    assert x.shape == (30, 28, 28)


def test_checksum_mismatch_leaves_nothing(server, cache, monkeypatch, rng):
    archive, _ = cifar_archive(rng)
    server.routes["/c/cifar-10-binary.tar.gz"] = archive
    monkeypatch.setattr(cifar10, "MIRRORS", [server.base + "/c/"])
    monkeypatch.setattr(cifar10, "ARCHIVE", RemoteFile("cifar-10-binary.tar.gz", md5="0" * 32))
    with pytest.raises(ChecksumError) as info:
        cifar10.load_data()
    assert f"md5 is {md5(archive)}, expected {'0' * 32}" in str(info.value)
    assert leftovers(cache / "cifar10") == []
    # with the right checksum the same server works, and the archive is cached
    monkeypatch.setattr(cifar10, "ARCHIVE", RemoteFile("cifar-10-binary.tar.gz", md5=md5(archive)))
    (x, y), (xt, yt) = cifar10.load_data()
    assert x.shape == (20, 32, 32, 3) and yt.shape == (4, 1)
    assert leftovers(cache / "cifar10") == ["cifar-10-binary.tar.gz"]


def test_sha256_is_checked_too(server, cache, rng):
    data = b"payload " * 100
    server.routes["/s/f.bin"] = data
    spec = RemoteFile("f.bin", md5=md5(data), sha256="ab" * 32)
    with pytest.raises(ChecksumError, match="sha256 is"):
        download.fetch(spec, [server.base + "/s/"], "t")
    assert leftovers(cache / "t") == []
    good = RemoteFile("f.bin", sha256=hashlib.sha256(data).hexdigest())
    assert download.fetch(good, [server.base + "/s/"], "t").read_bytes() == data


def test_interrupted_download_leaves_nothing(server, cache, monkeypatch, rng):
    files = mnist_files(rng)
    serve_mnist(server, monkeypatch, files)
    server.truncate["/m/train-images-idx3-ubyte.gz"] = 100
    with pytest.raises(DownloadError) as info:
        mnist.load_data(fallback=False)
    text = str(info.value)
    assert "interrupted download" in text or "IncompleteRead" in text
    assert not isinstance(info.value, ChecksumError)
    # the complete files are kept (verified), the interrupted one left nothing, not even a .part
    assert "train-images-idx3-ubyte.gz" not in leftovers(cache / "mnist")
    assert not [n for n in leftovers(cache / "mnist") if n.endswith(".part")]
    del server.truncate["/m/train-images-idx3-ubyte.gz"]
    mnist.load_data()
    assert leftovers(cache / "mnist") == sorted(files)


def test_corrupt_cached_file_is_replaced(server, cache, monkeypatch, rng):
    files = mnist_files(rng)
    serve_mnist(server, monkeypatch, files)
    mnist.load_data()
    victim = cache / "mnist" / "t10k-labels-idx1-ubyte.gz"
    victim.write_bytes(b"garbage")
    (_, _), (_, y_test) = mnist.load_data()
    assert victim.read_bytes() == files["t10k-labels-idx1-ubyte.gz"]
    assert y_test.shape == (12,)


def test_offline_error_says_what_to_put_where(cache, monkeypatch):
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}/mnist/"
    monkeypatch.setattr(mnist, "MIRRORS", [dead])
    with pytest.raises(DownloadError) as info:
        mnist.load_data(fallback=False)
    text = str(info.value)
    assert "could not download the MNIST data set" in text
    assert str(cache / "mnist") in text
    assert "DNNBIND_DATA" in text and "data_dir=" in text
    for spec in mnist.FILES.values():
        assert spec.filename in text
        assert spec.md5 in text
        assert dead + spec.filename in text
    assert leftovers(cache / "mnist") == []


def test_cache_dir_default_and_env(tmp_path, monkeypatch):
    monkeypatch.delenv("DNNBIND_DATA", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert download.cache_dir("mnist", create=False) == tmp_path / ".cache" / "dnnbind" / "mnist"
    monkeypatch.setenv("DNNBIND_DATA", str(tmp_path / "d"))
    assert download.cache_dir("x") == tmp_path / "d" / "x" and (tmp_path / "d" / "x").is_dir()


def test_remote_file_needs_a_checksum():
    with pytest.raises(ValueError, match="md5 or sha256"):
        RemoteFile("x.bin")


def test_published_checksums_are_the_real_ones():
    # Guards against an accidental edit: these are the digests the data set authors published.
    assert mnist.FILES["train_images"].md5 == "f68b3c2dcbeaaa9fbdd348bbdeb94873"
    assert mnist.FILES["test_labels"].md5 == "ec29112dd5afa0611ce80d1b7f02629c"
    assert cifar10.ARCHIVE.md5 == "c32a1d4ab5d03f1284b67883e8d87530"
    assert all(m.endswith("/") for m in mnist.MIRRORS + cifar10.MIRRORS)


# ---------------------------------------------------------------- the embedded test set (offline fallback)

LABEL_COUNTS = [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]  # the published per-digit counts


def test_embedded_files_are_the_published_ones():
    for key in ("test_images", "test_labels"):
        spec = mnist.FILES[key]
        path = mnist.EMBEDDED_DIR / spec.filename
        assert download.file_digest(path, spec) is None, f"{path} differs from the published {spec.md5}"
    assert (mnist.EMBEDDED_DIR / "README.md").read_text().count("CC BY-SA 3.0") >= 1


def test_load_embedded_splits_the_test_set():
    (x, y), (xt, yt) = mnist.load_embedded()
    assert x.shape == (8000, 28, 28) and xt.shape == (2000, 28, 28) and x.dtype == np.uint8
    assert y.shape == (8000,) and yt.shape == (2000,) and y.dtype == np.uint8
    assert np.bincount(np.concatenate([y, yt]), minlength=10).tolist() == LABEL_COUNTS
    assert y[:10].tolist() == [7, 2, 1, 0, 4, 1, 4, 9, 5, 9]  # the first test digits, as everyone knows them
    assert 0 < x.mean() < 255 and x.max() == 255
    (x2, _), (xt2, _) = mnist.load_embedded(9000)
    assert len(x2) == 9000 and len(xt2) == 1000 and np.array_equal(x2[:8000], x)
    for bad in (0, 10000, 2.5, True):
        with pytest.raises(ValueError, match="split must be an int in \\[1, 9999\\]"):
            mnist.load_embedded(bad)


def test_damaged_embedded_copy_is_refused(tmp_path, monkeypatch):
    for spec in (mnist.FILES["test_images"], mnist.FILES["test_labels"]):
        (tmp_path / spec.filename).write_bytes((mnist.EMBEDDED_DIR / spec.filename).read_bytes())
    victim = tmp_path / "t10k-labels-idx1-ubyte.gz"
    victim.write_bytes(victim.read_bytes()[:-1] + b"x")
    monkeypatch.setattr(mnist, "EMBEDDED_DIR", tmp_path)
    with pytest.raises(ChecksumError, match="t10k-labels-idx1-ubyte.gz is damaged .*reinstall dnnbind"):
        mnist.load_embedded()
    victim.unlink()
    with pytest.raises(FileNotFoundError, match="embedded .* is missing"):
        mnist.load_embedded()


def test_load_data_falls_back_to_the_embedded_set_offline(server, cache, monkeypatch, capsys):
    # two mirrors that answer 404: the fallback gives up after the first file (every mirror once)
    monkeypatch.setattr(mnist, "MIRRORS", [server.base + "/a/", server.base + "/b/"])
    (x, y), (xt, yt) = mnist.load_data()
    assert server.hits == ["/a/train-images-idx3-ubyte.gz", "/b/train-images-idx3-ubyte.gz"]
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("dnnbind: could not download MNIST (" + server.base + "/a/train-images-idx3-ubyte.gz")
    assert "training on its first 8,000 digits, testing on the last 2,000" in err[0]
    (ex, ey), (ext, eyt) = mnist.load_embedded()
    assert np.array_equal(x, ex) and np.array_equal(yt, eyt) and x.shape == (8000, 28, 28)
    assert leftovers(cache / "mnist") == []
    with pytest.raises(DownloadError):
        mnist.load_data(fallback=False)


def test_load_data_uses_the_full_set_when_the_download_works(server, cache, monkeypatch, rng, capsys):
    files = mnist_files(rng)
    serve_mnist(server, monkeypatch, files)
    (x, _), (xt, _) = mnist.load_data()
    assert x.shape == (30, 28, 28) and xt.shape == (12, 28, 28)
    assert "could not download" not in capsys.readouterr().err


def test_mirrors_from_the_environment(monkeypatch):
    monkeypatch.setenv("DNNBIND_MNIST_MIRRORS", " http://127.0.0.1:1/m , https://example.invalid/x/ ,")
    assert mnist._mirrors_from_env() == ["http://127.0.0.1:1/m/", "https://example.invalid/x/"]
    monkeypatch.delenv("DNNBIND_MNIST_MIRRORS")
    assert mnist._mirrors_from_env() == []
    assert list(mnist.DEFAULT_MIRRORS)[0].startswith("https://")


def test_package_data_ships_the_embedded_files():
    """A normal ``pip install`` copies what pyproject's package-data names: it must name both files."""
    import fnmatch
    from pathlib import Path

    tomllib = pytest.importorskip("tomllib")  # Python 3.11+

    root = Path(mnist.__file__).resolve().parents[2]
    config = tomllib.loads((root / "pyproject.toml").read_text())
    patterns = config["tool"]["setuptools"]["package-data"]["dnnbind.datasets"]
    package = Path(mnist.__file__).resolve().parent
    shipped = {str(p.relative_to(package)) for p in package.rglob("*") if p.is_file()
               and any(fnmatch.fnmatch(str(p.relative_to(package)), pat) for pat in patterns)}
    rel = str(mnist.EMBEDDED_DIR.relative_to(package))
    assert {f"{rel}/t10k-images-idx3-ubyte.gz", f"{rel}/t10k-labels-idx1-ubyte.gz", f"{rel}/README.md"} <= shipped


def test_the_license_file_is_apache_2_and_mnist_keeps_its_note():
    """pyproject declares Apache-2.0: LICENSE holds that licence's full text; the bundled MNIST files carry
    their own licence note, packaged with them."""
    import hashlib
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    text = (root / "LICENSE").read_text()
    # the text apache.org publishes (https://www.apache.org/licenses/LICENSE-2.0.txt), byte for byte
    assert hashlib.md5(text.encode()).hexdigest() == "3b83ef96387f14655fc854ddc3c6bd57"
    assert "TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION" in text and "END OF TERMS AND CONDITIONS" in text
    pyproject = (root / "pyproject.toml").read_text()
    assert re.search(r'^license = \{ text = "Apache-2.0" \}$', pyproject, re.M)
    note = (root / "dnnbind" / "datasets" / "mnist-t10k" / "README.md").read_text()
    assert "CC BY-SA 3.0" in note and "LeCun" in note
    assert '"mnist-t10k/README.md"' in pyproject
