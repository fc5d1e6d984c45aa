"""The bounded reader (dnnbind/_bounded.py) under every format: zip, gzip and tar bombs refused with
the process's peak memory measured in a subprocess, deep JSON, HDF5 shape bombs, too many zip
entries, and limits raised by argument and by environment."""

from __future__ import annotations

import gzip
import io
import json
import os
import struct
import subprocess
import sys
import tarfile
import zipfile
import zlib

import numpy as np
import pytest

import dnnbind as keras
from dnnbind import layers, saving
from dnnbind._bounded import BoundedReader, ReadLimits, json_depth
from dnnbind.errors import ReadLimitError

pytestmark = pytest.mark.usefixtures("cpu")  # the NumPy backend (conftest.py)

MiB = 1 << 20


def _zeros_deflate(mebibytes: int) -> bytes:
    """A raw DEFLATE stream of ``mebibytes`` MiB of zeros in about 1 KB per MiB, made without
    compressing them all: one fully flushed block (no reference before it) repeated, then the end."""
    block = zlib.compressobj(9, zlib.DEFLATED, -15)
    one = block.compress(b"\0" * MiB) + block.flush(zlib.Z_FULL_FLUSH)
    end = zlib.compressobj(9, zlib.DEFLATED, -15)
    return one * mebibytes + end.compress(b"") + end.flush()


def _zip(path, members) -> None:
    """A zip written by hand: ``members`` is ``[(name, data, declared size, deflated?)]`` (sizes and CRC
    as given, so a header can lie; a bomb's CRC is never reached)."""
    out, central = bytearray(), bytearray()
    for name, data, size, deflated in members:
        method, crc, raw = (8, 0, data) if deflated else (0, zlib.crc32(data), data)
        offset, encoded = len(out), name.encode()
        out += struct.pack("<IHHHHHIIIHH", 0x04034B50, 20, 0, method, 0, 0x21, crc, len(raw), size, len(encoded), 0)
        out += encoded + raw
        central += struct.pack("<IHHHHHHIIIHHHHHII", 0x02014B50, 20, 20, 0, method, 0, 0x21, crc, len(raw), size,
                               len(encoded), 0, 0, 0, 0, 0, offset) + encoded
    start = len(out)
    out += central + struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, len(members), len(members), len(central), start, 0)
    path.write_bytes(bytes(out))


def _gzip_of(raw_deflate: bytes, prefix: bytes = b"") -> bytes:
    """A gzip file whose deflate stream is ``prefix`` (deflated here) then ``raw_deflate``'s content."""
    head = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff"
    if prefix:
        c = zlib.compressobj(9, zlib.DEFLATED, -15)
        raw_deflate = c.compress(prefix) + c.flush(zlib.Z_FULL_FLUSH) + raw_deflate
    return head + raw_deflate + struct.pack("<II", 0, 0)  # CRC and size: never reached


def _small_keras_file(path) -> None:
    model = keras.Sequential([keras.Input((4,)), layers.Dense(3)])
    model.save(path)


# Run in a child: the bomb is loaded after the imports, and the child reports its peak resident set
# (VmHWM) before and after, so the parent can bound what the refusal cost.
_CHILD = r"""
import json, sys
import dnnbind as keras
from dnnbind import saving
from dnnbind.datasets import cifar10, mnist
from dnnbind.errors import ReadLimitError

keras.set_default_device("cpu")


def peak_kib():
    with open("/proc/self/status") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("VmHWM:"))


cases = json.loads(sys.argv[1])
model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
calls = {"load_model": lambda p: keras.load_model(p), "load_weights": model.load_weights,
         "load_idx": mnist.load_idx, "mnist_npz": lambda p: mnist.load_data(path=p),
         "cifar10": lambda p: cifar10.load_data(data_dir=p)}
base = peak_kib()
out = {"base_kib": base, "errors": []}
for call, path in cases:
    try:
        calls[call](path)
        out["errors"].append([call, None, None])
    except Exception as exc:  # the parent asserts on the type and the words
        out["errors"].append([call, type(exc).__name__, str(exc)])
out["peak_kib"] = peak_kib()
print(json.dumps(out))
"""


def test_bombs_are_refused_while_read_within_100_mb(tmp_path):
    """A 1.5 GiB config.json in 1.5 MB (the issue's file), a weights member built the same way, a gzip
    IDX file, a tar.gz data set member and an npz member: each refused with ReadLimitError naming the
    member and max_ratio, while the child's peak memory stays within 100 MB of its baseline."""
    bomb = _zeros_deflate(1536)
    config_bomb, weights_bomb = tmp_path / "config_bomb.keras", tmp_path / "weights_bomb.keras"
    _zip(config_bomb, [("metadata.json", b"{}", 2, False), ("config.json", bomb, 1536 * MiB, True)])
    _small_keras_file(tmp_path / "ok.keras")
    with zipfile.ZipFile(tmp_path / "ok.keras") as zf:
        config = zf.read("config.json")
    _zip(weights_bomb, [("config.json", config, len(config), False),
                        ("model.weights.h5", bomb, 1536 * MiB, True)])
    # a header that lies (declares 1 KiB): zipfile stops there and the CRC refuses the member
    liar = tmp_path / "liar.keras"
    _zip(liar, [("metadata.json", b"{}", 2, False), ("config.json", bomb, 1024, True)])
    # a gzip stream has no trustworthy size: the ratio is checked on every chunk
    idx_bomb = tmp_path / "train-images-idx3-ubyte.gz"
    idx_bomb.write_bytes(_gzip_of(_zeros_deflate(1536), prefix=b"\0\0\x08\x01" + struct.pack(">I", 1 << 30)))
    # a tar member's declared size is real bytes of the stream: the same per-chunk check
    header = tarfile.TarInfo(f"{keras.datasets.cifar10.MEMBER_DIR}/data_batch_1.bin")
    header.size = 1536 * MiB
    cifar_dir = tmp_path / "cifar"
    cifar_dir.mkdir()
    (cifar_dir / "cifar-10-binary.tar.gz").write_bytes(_gzip_of(_zeros_deflate(1536),
                                                                prefix=header.tobuf(format=tarfile.USTAR_FORMAT)))
    npz_bomb = tmp_path / "mnist.npz"
    _zip(npz_bomb, [(f"{k}.npy", bomb, 1536 * MiB, True) for k in ("x_train", "y_train", "x_test", "y_test")])
    cases = [("load_model", str(config_bomb)), ("load_model", str(weights_bomb)), ("load_weights", str(weights_bomb)),
             ("load_model", str(liar)), ("load_idx", str(idx_bomb)), ("cifar10", str(cifar_dir)),
             ("mnist_npz", str(npz_bomb))]
    env = {k: v for k, v in os.environ.items() if not k.startswith("DNNBIND_READ_")}
    done = subprocess.run([sys.executable, "-c", _CHILD, json.dumps(cases)], capture_output=True, text=True,
                          timeout=120, env={**env, "DNNBIND_DEVICE": "cpu"})
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    errors = report["errors"]
    for (call, path), (_, kind, message) in zip(cases, errors):
        if path == str(liar):
            assert kind == "SavingError" and "corrupt" in message, (call, kind, message)
            continue
        assert kind == "ReadLimitError", (call, path, kind, message)
        assert "max_ratio=100" in message and "DNNBIND_READ_MAX_RATIO" in message, message
    assert "config.json expands 1," in errors[0][2] and "1,610,612,736" in errors[0][2]
    assert "model.weights.h5" in errors[1][2] and "model.weights.h5" in errors[2][2]
    assert "train-images-idx3-ubyte.gz" in errors[4][2] and "cifar-10-binary.tar.gz" in errors[5][2]
    assert "x_train.npy" in errors[6][2]
    grown_mb = (report["peak_kib"] - report["base_kib"]) / 1024
    assert grown_mb < 100, f"the refusals raised the peak resident set by {grown_mb:.0f} MB"


def test_deep_json_is_refused_with_the_limit_named(tmp_path):
    deep = b"[" * 100_000 + b"]" * 100_000  # json.loads: RecursionError
    zpath = tmp_path / "deep.dnnbind"
    _zip(zpath, [("config.json", deep, len(deep), False), ("model.safetensors", b"", 0, False)])
    with pytest.raises(ReadLimitError, match=r"deep\.dnnbind: config\.json nests JSON arrays/objects .* levels deep, "
                                             r"more than the read limit max_json_depth=128.*DNNBIND_READ_MAX_JSON_DEPTH"):
        keras.load_model(zpath)
    # a checkpoint directory's manifest too
    ckpt = tmp_path / "ckpt"
    keras.Sequential([keras.Input((4,)), layers.Dense(3)]).save(ckpt)
    (ckpt / "manifest.json").write_bytes(b'{"files": ' + b"{\"a\": " * 300 + b"1" + b"}" * 300 + b"}")
    with pytest.raises(ReadLimitError, match=r"manifest\.json nests JSON .* max_json_depth=128"):
        keras.load_model(ckpt)
    # brackets inside strings are text, escaped quotes included
    assert json_depth(b'{"a": "[[[[\\"[[[", "b": [1, [2]]}', 10) == 3
    assert json_depth(b"[]" * 1000, 10) == 1


def test_read_limits_can_be_raised_by_argument_or_environment(tmp_path, monkeypatch):
    """A model zip recompressed with DEFLATE holds zero weights that compress ~1000:1: refused by
    default (the message says how to raise it), loaded with the limit raised either way."""
    model = keras.Sequential([keras.Input((512,)), layers.Dense(2048, kernel_initializer="zeros"), layers.Dense(2)])
    model.save(tmp_path / "plain.dnnbind")
    packed = tmp_path / "packed.dnnbind"
    with zipfile.ZipFile(tmp_path / "plain.dnnbind") as src, zipfile.ZipFile(packed, "w", zipfile.ZIP_DEFLATED) as dst:
        for name in src.namelist():
            dst.writestr(name, src.read(name))
    with pytest.raises(ReadLimitError, match=r"packed\.dnnbind: model\.safetensors expands .* max_ratio=100.*"
                                             r"ReadLimits\(max_ratio=\.\.\.\)"):
        keras.load_model(packed)
    loaded = keras.load_model(packed, limits=saving.ReadLimits(max_ratio=float("inf")))
    np.testing.assert_array_equal(loaded.get_weights()[2], model.get_weights()[2])
    saving.load_weights(loaded, packed, limits={"max_ratio": 10_000})
    monkeypatch.setenv("DNNBIND_READ_MAX_RATIO", "inf")
    keras.load_model(packed)
    loaded.load_weights(packed)  # Model.load_weights reads the environment too
    # the other limits, lowered by the environment: named in the error
    monkeypatch.setenv("DNNBIND_READ_MAX_BYTES", "4096")
    with pytest.raises(ReadLimitError, match=r"model\.safetensors is [\d,]+ bytes .* max_bytes=4,096.*"
                                             "DNNBIND_READ_MAX_BYTES"):
        keras.load_model(tmp_path / "plain.dnnbind")
    monkeypatch.delenv("DNNBIND_READ_MAX_BYTES")
    monkeypatch.setenv("DNNBIND_READ_MAX_TOTAL_BYTES", str(2 * MiB))
    with pytest.raises(ReadLimitError, match="brings this load to .* max_total_bytes=2,097,152"):
        keras.load_model(tmp_path / "plain.dnnbind")
    monkeypatch.setenv("DNNBIND_READ_MAX_TOTAL_BYTES", "lots")
    with pytest.raises(ValueError, match="environment variable DNNBIND_READ_MAX_TOTAL_BYTES must be an int >= 1, "
                                         "got 'lots'"):
        keras.load_model(tmp_path / "plain.dnnbind")
    with pytest.raises(ValueError, match=r"unknown field\(s\) \['max_size'\]"):
        BoundedReader({"max_size": 1})
    with pytest.raises(ValueError, match=r"ReadLimits\(max_json_depth=\.\.\.\) must be an int >= 1, got 0"):
        ReadLimits(max_json_depth=0).resolved({})


def test_hdf5_shape_bombs_and_crowded_zips_are_refused(tmp_path):
    h5py = pytest.importorskip("h5py")
    model = keras.Sequential([keras.Input((4,)), layers.Dense(3)])
    path = tmp_path / "bomb.weights.h5"
    with h5py.File(path, "w") as f:  # 4 GiB declared, nothing stored: a chunked dataset never written
        f.create_dataset("layers/dense/vars/0", shape=(1 << 30,), dtype="f4", chunks=(1 << 16,), compression="gzip")
    with pytest.raises(ReadLimitError, match=r"bomb\.weights\.h5: dataset 'layers/dense/vars/0' .*(max_ratio|max_bytes)"):
        model.load_weights(path)
    crowded = tmp_path / "crowded.keras"
    _zip(crowded, [(f"assets/{i}", b"", 0, False) for i in range(5000)])
    with pytest.raises(ReadLimitError, match=r"crowded\.keras declares 5,000 zip entries, more than the 4,096"):
        keras.load_model(crowded)


def test_streams_and_members_read_within_the_limits_are_intact(tmp_path, rng):
    payload = rng.integers(0, 256, 3 * MiB, dtype=np.uint8).tobytes()
    multi = tmp_path / "two.gz"
    multi.write_bytes(gzip.compress(payload) + gzip.compress(b"second member"))
    assert BoundedReader().gunzip_file(multi) == payload + b"second member"
    with pytest.raises(zlib.error, match="truncated"):
        (tmp_path / "cut.gz").write_bytes(gzip.compress(payload)[:-100])
        BoundedReader().gunzip_file(tmp_path / "cut.gz")
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("a.bin", payload)
    (tmp_path / "a.zip").write_bytes(buf.getvalue())
    reader = BoundedReader()
    with reader.open_zip(tmp_path / "a.zip") as zf:
        assert zf.read("a.bin") == payload
    assert reader.total == len(payload)
    with pytest.raises(ReadLimitError, match="compressed with method 12"), \
            BoundedReader().open_zip(_bzip2_zip(tmp_path)) as zf:
        zf.read("a.bin")


def _bzip2_zip(tmp_path):
    path = tmp_path / "b.zip"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_BZIP2) as zf:
        zf.writestr("a.bin", b"x" * 100)
    return path


def test_a_datasets_npz_header_must_match_its_bytes(tmp_path):
    arr = np.arange(12, dtype=np.uint8)
    member = io.BytesIO()
    np.save(member, arr)
    raw = member.getvalue()
    fake = io.BytesIO()  # the header declares 10 GB; 12 bytes follow (np.load would allocate 10 GB first)
    np.lib.format.write_array_header_1_0(fake, {"descr": "|u1", "fortran_order": False, "shape": (9999999999,)})
    lying = fake.getvalue() + arr.tobytes()
    _zip(tmp_path / "mnist.npz", [(f"{k}.npy", lying if k == "x_train" else raw, len(raw), False)
                                  for k in ("x_train", "y_train", "x_test", "y_test")])
    with pytest.raises(keras.datasets.DatasetFormatError,
                       match=r"x_train\.npy: its header declares shape \(9999999999,\) .* but it holds 12 data bytes"):
        keras.datasets.mnist.load_data(path=tmp_path / "mnist.npz")


def _idx_gz(path, shape, type_byte=0x08) -> None:
    """An IDX file of zeros (MNIST's layout), gzipped: zeros compress about 1000:1."""
    head = struct.pack(">HBB", 0, type_byte, len(shape)) + b"".join(struct.pack(">I", d) for d in shape)
    path.write_bytes(gzip.compress(head + bytes(int(np.prod(shape))), 9))


def test_model_load_weights_and_the_data_sets_take_limits_by_argument_and_environment(tmp_path, monkeypatch):
    """Every reader of untrusted files takes ``limits=`` (a ReadLimits or a dict) and the environment:
    Model.load_weights (Keras's load_weights(filepath, ...) plus the keyword), MNIST's IDX files and
    CIFAR-10's archive, each refused by default (zeros compress far past the ratio) and read with the
    limit raised either way."""
    model = keras.Sequential([keras.Input((512,)), layers.Dense(2048, kernel_initializer="zeros"), layers.Dense(2)])
    model.save(tmp_path / "plain.dnnbind")
    packed = tmp_path / "packed.dnnbind"
    with zipfile.ZipFile(tmp_path / "plain.dnnbind") as src, zipfile.ZipFile(packed, "w", zipfile.ZIP_DEFLATED) as dst:
        for name in src.namelist():
            dst.writestr(name, src.read(name))
    with pytest.raises(ReadLimitError, match="max_ratio=100"):
        model.load_weights(packed)
    model.load_weights(packed, limits=saving.ReadLimits(max_ratio=float("inf")))
    model.load_weights(packed, limits={"max_ratio": 10_000})
    with pytest.raises(ReadLimitError, match=r"model\.safetensors is [\d,]+ bytes .* max_bytes=4,096"):
        model.load_weights(tmp_path / "plain.dnnbind", limits={"max_bytes": 4096})
    with pytest.raises(TypeError, match="limits must be a dnnbind.saving.ReadLimits"):
        model.load_weights(packed, limits=100)

    mnist, cifar10 = keras.datasets.mnist, keras.datasets.cifar10
    for prefix, n in (("train", 2000), ("t10k", 2000)):
        _idx_gz(tmp_path / f"{prefix}-images-idx3-ubyte.gz", (n, 28, 28))
        _idx_gz(tmp_path / f"{prefix}-labels-idx1-ubyte.gz", (n,))
    with pytest.raises(ReadLimitError, match=r"t10k-images-idx3-ubyte\.gz expands .* max_ratio=100"):
        mnist.load_subset("test", data_dir=tmp_path)
    (x_train, _), (x_test, y_test) = mnist.load_data(data_dir=tmp_path, limits={"max_ratio": float("inf")})
    assert x_train.shape == x_test.shape == (2000, 28, 28) and y_test.shape == (2000,)
    assert mnist.load_subset("test", data_dir=tmp_path, limits=ReadLimits(max_ratio=1e6))[0].shape == (2000, 28, 28)
    assert mnist.load_idx(tmp_path / "t10k-labels-idx1-ubyte.gz", limits={"max_bytes": 4096}).shape == (2000,)

    records = bytes(cifar10._RECORD * 400)  # 1.2 MB of zeros per batch
    archive = tmp_path / "cifar" / cifar10.ARCHIVE.filename
    archive.parent.mkdir()
    with tarfile.open(archive, "w:gz") as tar:
        for name in (*cifar10.TRAIN_FILES, cifar10.TEST_FILE):
            info = tarfile.TarInfo(f"{cifar10.MEMBER_DIR}/{name}")
            info.size = len(records)
            tar.addfile(info, io.BytesIO(records))
    with pytest.raises(ReadLimitError, match=r"cifar-10-binary\.tar\.gz expands .* max_ratio=100"):
        cifar10.load_data(data_dir=archive.parent)
    (x_train, _), (x_test, _) = cifar10.load_data(data_dir=archive.parent, limits={"max_ratio": float("inf")})
    assert x_train.shape == (2000, 32, 32, 3) and x_test.shape == (400, 32, 32, 3)
    with pytest.raises(ReadLimitError, match=r"max_total_bytes=2,097,152"):
        cifar10.load_data(data_dir=archive.parent, limits={"max_ratio": float("inf"), "max_total_bytes": 2 * MiB})

    monkeypatch.setenv("DNNBIND_READ_MAX_RATIO", "inf")  # the environment reaches every one of them
    model.load_weights(packed)
    assert mnist.load_data(data_dir=tmp_path)[0][0].shape == (2000, 28, 28)
    assert cifar10.load_data(data_dir=archive.parent)[1][0].shape == (400, 32, 32, 3)
    monkeypatch.setenv("DNNBIND_READ_MAX_BYTES", "4096")
    with pytest.raises(ReadLimitError, match="max_bytes=4,096.*DNNBIND_READ_MAX_BYTES"):
        mnist.load_subset("test", data_dir=tmp_path)
    with pytest.raises(ReadLimitError, match="max_bytes=4,096.*DNNBIND_READ_MAX_BYTES"):
        cifar10.load_data(data_dir=archive.parent)
    # an argument wins over the environment
    assert cifar10.load_data(data_dir=archive.parent, limits={"max_bytes": 10 * MiB})[1][0].shape == (400, 32, 32, 3)
