"""The examples run end to end on the CPU backend, on tiny generated data in the real file formats.

Each example runs in a subprocess (fresh global state: default device, precision policy),
with ``DNNBIND_DATA`` pointing into a temporary directory so nothing is downloaded.
The generated digits/images are learnable (the class decides where a bright block sits),
so the accuracy line must also show that training learned something.
"""

from __future__ import annotations

import gzip
import io
import os
import re
import struct
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
ACCURACY = re.compile(r"^test accuracy: ([0-9.]+)$", re.MULTILINE)


def launch(name: str, *args: str, tmp_path: Path, device: str = "cpu",
           timeout: float = 300, env: dict | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, DNNBIND_DATA=str(tmp_path / "cache"), DNNBIND_DEVICE=device,
               PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""), **(env or {}))
    return subprocess.run([sys.executable, str(EXAMPLES / name), *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=timeout)


def run_example(name: str, *args: str, tmp_path: Path, device: str = "cpu",
                env: dict | None = None) -> tuple[str, float | None]:
    """Run an example that must succeed; return its output and the accuracy it printed."""
    proc = launch(name, *args, tmp_path=tmp_path, device=device, env=env)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{name} exited with {proc.returncode}:\n{output[-4000:]}"
    match = ACCURACY.search(proc.stdout)
    return output, (float(match.group(1)) if match else None)


def _idx(array: np.ndarray) -> bytes:
    return bytes([0, 0, 0x08, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape) + array.tobytes()


def learnable_digits(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """28x28 uint8 images: noise plus a bright 6x6 block whose position encodes the label."""
    rng = np.random.default_rng(seed)
    labels = (np.arange(n) % 10).astype(np.uint8)
    rng.shuffle(labels)
    images = rng.integers(0, 60, size=(n, 28, 28)).astype(np.uint8)
    for i, label in enumerate(labels):
        r, c = divmod(int(label), 5)
        images[i, 2 + 12 * r: 8 + 12 * r, 1 + 5 * c: 7 + 5 * c] = 250
    return images, labels


def write_mnist(directory: Path, prefixes=("train", "t10k"), n=(160, 60)) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for seed, (prefix, count) in enumerate(zip(prefixes, n)):
        images, labels = learnable_digits(count, seed)
        (directory / f"{prefix}-images-idx3-ubyte.gz").write_bytes(gzip.compress(_idx(images)))
        (directory / f"{prefix}-labels-idx1-ubyte.gz").write_bytes(gzip.compress(_idx(labels)))


def test_mnist_example_full_split(tmp_path):
    write_mnist(tmp_path / "mnist")
    out, accuracy = run_example("mnist.py", "--data-dir", str(tmp_path / "mnist"), "--epochs", "3",
                                "--batch-size", "16", "--device", "cpu", "--limit", "160",
                                tmp_path=tmp_path)
    assert "standard train / test split; 160 train, 60 test" in out
    assert accuracy is not None, out
    # 10 classes: chance is 0.1; the block position is easy to learn in 3 epochs
    assert accuracy >= 0.5, out


def offline() -> dict:
    """The MNIST mirrors at a port nothing listens on: a machine without network access."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return {"DNNBIND_MNIST_MIRRORS": f"http://127.0.0.1:{s.getsockname()[1]}/"}


OFFLINE_NOTICE = ("using the MNIST test set shipped with dnnbind: training on its first 8,000 digits, "
                  "testing on the last 2,000")


def test_mnist_example_offline_trains_on_the_embedded_digits(tmp_path):
    # the defaults but one epoch (15 take a minute or two on a CPU; the GPU test below runs them all)
    out, accuracy = run_example("mnist.py", "--epochs", "1", tmp_path=tmp_path, env=offline())
    assert OFFLINE_NOTICE in out
    assert "shipped with dnnbind (offline): first 8000 for training, last 2000 for testing; 8000 train, 2000 test" \
        in out
    assert accuracy is not None and accuracy >= 0.8, out  # real digits, 10 classes: chance is 0.1
    assert not (tmp_path / "cache" / "mnist").exists() or not os.listdir(tmp_path / "cache" / "mnist")


@pytest.mark.gpu
def test_mnist_example_needs_no_flags_gpu(tmp_path):
    """``python examples/mnist.py`` exactly as the README says, offline: 15 epochs on the GPU."""
    out, accuracy = run_example("mnist.py", tmp_path=tmp_path, device="cuda", env=offline())
    assert OFFLINE_NOTICE in out
    assert "Epoch 15/15" in out
    assert accuracy is not None and accuracy >= 0.97, out


def test_mnist_example_test_only_directory_splits(tmp_path):
    write_mnist(tmp_path / "t10k", prefixes=("t10k",), n=(120,))
    out, accuracy = run_example("mnist.py", "--data-dir", str(tmp_path / "t10k"), "--epochs", "5",
                                "--batch-size", "32", "--split", "100", "--device", "cpu",
                                tmp_path=tmp_path)
    assert "first 100 for training, last 20 for testing; 100 train, 20 test" in out
    assert accuracy is not None, out
    assert accuracy >= 0.5, out  # 10 classes: chance is 0.1 (0.75 seen with the default seed)


def test_mnist_example_min_accuracy_fails(tmp_path):
    write_mnist(tmp_path / "mnist", n=(32, 16))
    proc = launch("mnist.py", "--data-dir", str(tmp_path / "mnist"), "--epochs", "1", "--batch-size", "16",
                  "--device", "cpu", "--min-accuracy", "1.01", tmp_path=tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "below --min-accuracy" in proc.stderr


def _cifar_archive(path: Path, per_batch: int, seed: int = 0) -> None:
    """CIFAR-10's binary archive layout; the images are learnable: noise, one channel brighter and a
    bright stripe whose rows both depend on the label."""
    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name in [f"data_batch_{i}.bin" for i in range(1, 6)] + ["test_batch.bin"]:
            labels = rng.integers(0, 10, per_batch).astype(np.uint8)
            images = rng.normal(110, 40, (per_batch, 3, 32, 32))
            for i, k in enumerate(labels):
                images[i, k % 3] += 50
                images[i, :, 3 * k + 1: 3 * k + 3, :] += 70
            images = np.clip(images, 0, 255).astype(np.uint8)
            blob = b"".join(bytes([labels[i]]) + images[i].tobytes() for i in range(per_batch))
            info = tarfile.TarInfo(f"cifar-10-batches-bin/{name}")
            info.size = len(blob)
            tar.addfile(info, io.BytesIO(blob))
    path.write_bytes(buf.getvalue())


def test_cifar10_example_synthetic(tmp_path):
    out, accuracy = run_example("cifar10.py", "--synthetic", "--limit", "800", "--epochs", "3",
                                "--batch-size", "32", "--base-width", "8", "--device", "cpu",
                                tmp_path=tmp_path)
    assert "data: 800 train, 200 test images on cpu" in out
    assert re.search(r"epoch 3/3 - .*loss: [0-9.]+", out), out
    assert accuracy is not None, out
    # 10 classes: chance is 0.1; 0.92 with the default seed, 0.55 the lowest of seeds 0-2
    assert accuracy >= 0.4, out


def test_cifar10_example_reads_binary_archive(tmp_path):
    (tmp_path / "cifar").mkdir()
    _cifar_archive(tmp_path / "cifar" / "cifar-10-binary.tar.gz", per_batch=160)
    out, accuracy = run_example("cifar10.py", "--data-dir", str(tmp_path / "cifar"), "--epochs", "3",
                                "--batch-size", "32", "--base-width", "8", "--device", "cpu",
                                tmp_path=tmp_path)
    assert "data: 800 train, 160 test images on cpu" in out
    assert accuracy is not None, out
    assert accuracy >= 0.4, out  # learnable images, 10 classes: chance is 0.1


def test_custom_pipeline_cpu(tmp_path):
    out, _ = run_example("custom_pipeline.py", "--device", "cpu", tmp_path=tmp_path)
    assert "planned: x (8, 3, 16, 16) * w (16, 3, 3, 3) -> conv (8, 16, 16, 16) -> pool (8, 16, 8, 8)" in out
    assert "skipped the GPU pipeline" in out
    assert "custom pipeline: OK (cpu)" in out


@pytest.mark.gpu
def test_custom_pipeline_gpu(tmp_path):
    out, _ = run_example("custom_pipeline.py", "--device", "cuda", tmp_path=tmp_path, device="cuda")
    assert "custom pipeline: OK (gpu matches numpy)" in out


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["float32", "mixed_bfloat16"])
def test_mnist_example_gpu(tmp_path, precision):
    write_mnist(tmp_path / "mnist")
    out, accuracy = run_example("mnist.py", "--data-dir", str(tmp_path / "mnist"), "--epochs", "3",
                                "--batch-size", "16", "--device", "cuda", "--precision", precision,
                                tmp_path=tmp_path, device="cuda")
    assert accuracy is not None and accuracy >= 0.5, out


@pytest.mark.gpu
def test_cifar10_example_gpu_device_augmentation(tmp_path):
    # Device-resident data set, kernels.take + kernels.random_crop_flip on DeviceArrays, train_on_batch.
    out, accuracy = run_example("cifar10.py", "--synthetic", "--limit", "1024", "--epochs", "4",
                                "--batch-size", "64", "--base-width", "16", "--device", "cuda",
                                tmp_path=tmp_path, device="cuda")
    assert "images on cuda" in out
    assert accuracy is not None, out
    # 10 classes: chance is 0.1; the same run on the CPU reaches 0.48-0.89 over seeds 0-3
    assert accuracy >= 0.3, out


def test_attention_example_cpu(tmp_path):
    out, _ = run_example("attention.py", tmp_path=tmp_path)
    assert "sdpa_forward: bmm1 -> attn_scale -> gen_row_index" in out and "bound by name: q(2, 4, 256, 64)" in out
    assert "attention example: OK (cpu)" in out


@pytest.mark.gpu
def test_attention_example_gpu(tmp_path):
    out, _ = run_example("attention.py", tmp_path=tmp_path, device="cuda")
    assert "attention example: OK (gpu matches numpy)" in out
