"""Train a VGG-style network with BatchNorm on CIFAR-10, augmenting on the device.

Network: three stages of ``[Conv2D 3x3 -> BatchNormalization -> ReLU] x 2 -> MaxPooling2D``
with 64, 128 and 256 channels (``--base-width`` scales them), then Flatten and a
Dense softmax over the 10 classes. Optimizer: Adam.

The training set is uploaded to the device once. Every step gathers its batch
with ``dnnbind.kernels.take`` and augments it there with
``dnnbind.kernels.random_crop_flip`` (random 32x32 crop of the 4-pixel zero-padded
image and a random horizontal flip), then calls ``model.train_on_batch``; no
images cross the host-device bus during an epoch. On the CPU backend the same
code runs on NumPy arrays.

Data: ``--data-dir`` (a directory with ``cifar-10-binary.tar.gz`` or its extracted
``cifar-10-batches-bin/``), else the archive is downloaded once into the cache;
``--synthetic`` makes a small learnable stand-in without any download.

    python examples/cifar10.py --epochs 10 --device cuda --precision mixed_bfloat16
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

import dnnbind as keras
from dnnbind import backend, layers, kernels
from dnnbind.datasets import cifar10

NUM_CLASSES = 10
# Per-channel statistics of the CIFAR-10 training set (RGB, pixel values in [0, 1]).
MEAN = np.array([0.4914, 0.4822, 0.4465], dtype=np.float32)
STD = np.array([0.2470, 0.2435, 0.2616], dtype=np.float32)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--learning-rate", type=float, default=2e-3)
    parser.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto (default)")
    parser.add_argument("--data-dir", default=None,
                        help="directory with cifar-10-binary.tar.gz (or cifar-10-batches-bin/)")
    parser.add_argument("--synthetic", action="store_true",
                        help="train on generated class-dependent images (no download)")
    parser.add_argument("--precision", default="float32",
                        choices=["float32", "mixed_bfloat16", "mixed_float16"])
    parser.add_argument("--limit", type=int, default=None, metavar="N",
                        help="use at most N training and N test images (quick runs)")
    parser.add_argument("--base-width", type=int, default=64,
                        help="channels of the first stage; later stages use 2x and 4x")
    parser.add_argument("--no-augment", action="store_true")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--min-accuracy", type=float, default=None,
                        help="exit with status 1 when the test accuracy is below this")
    return parser.parse_args(argv)


def synthetic_data(n_train: int, n_test: int, seed: int):
    """uint8 images whose colour and a bright stripe depend on the label (learnable, not trivial)."""
    rng = np.random.default_rng(seed)

    def make(n):
        labels = rng.integers(0, NUM_CLASSES, size=(n, 1), dtype=np.uint8)
        images = rng.normal(110, 40, size=(n, 32, 32, 3))
        k = labels[:, 0]
        images[np.arange(n), :, :, k % 3] += 50
        rows = 3 * k + 1
        for i in range(n):
            images[i, rows[i]:rows[i] + 2, :, :] += 70
        return np.clip(images, 0, 255).astype(np.uint8), labels

    return make(n_train), make(n_test)


def build_model(base_width: int) -> "keras.Sequential":
    model = keras.Sequential([keras.Input(shape=(32, 32, 3))], name="vgg_bn")
    for width in (base_width, 2 * base_width, 4 * base_width):
        for _ in range(2):
            model.add(layers.Conv2D(width, 3, padding="same", use_bias=False,
                                    kernel_initializer="he_normal"))
            model.add(layers.BatchNormalization())
            model.add(layers.ReLU())
        model.add(layers.MaxPooling2D(2))
    model.add(layers.Flatten())
    model.add(layers.Dense(NUM_CLASSES, activation="softmax"))
    return model


def normalize(images: np.ndarray) -> np.ndarray:
    return ((images.astype(np.float32) / 255.0 - MEAN) / STD).astype(np.float32)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.device != "auto":
        keras.set_default_device(args.device)
    device = backend.default_device()
    keras.mixed_precision.set_global_policy(args.precision)
    keras.utils.set_random_seed(args.seed)

    if args.synthetic:
        n = args.limit or 2000
        (x_train, y_train), (x_test, y_test) = synthetic_data(n, max(n // 4, 1), args.seed)
    else:
        (x_train, y_train), (x_test, y_test) = cifar10.load_data(data_dir=args.data_dir)
    if args.limit is not None:
        x_train, y_train = x_train[:args.limit], y_train[:args.limit]
        x_test, y_test = x_test[:args.limit], y_test[:args.limit]
    print(f"data: {len(x_train)} train, {len(x_test)} test images on {device}")

    # One upload for the whole training set; labels as int32 class indices (N,).
    x_dev = backend.asarray(normalize(x_train), device)
    y_dev = backend.asarray(y_train.reshape(-1).astype(np.int32), device)

    model = build_model(args.base_width)
    model.summary()
    model.compile(optimizer=keras.optimizers.Adam(learning_rate=args.learning_rate),
                  loss="sparse_categorical_crossentropy", metrics=["accuracy"])

    rng = np.random.default_rng(args.seed)
    n = len(x_train)
    steps = -(-n // args.batch_size)
    start = time.perf_counter()
    for epoch in range(args.epochs):
        epoch_start = time.perf_counter()
        # One small index upload per epoch; batches are gathered on the device.
        order = backend.asarray(rng.permutation(n).astype(np.int64), device)
        for step in range(steps):
            index = order[step * args.batch_size:(step + 1) * args.batch_size]
            xb = kernels.take(x_dev, index)
            yb = kernels.take(y_dev, index)
            if not args.no_augment:
                xb = kernels.random_crop_flip(xb, padding=4, layout="NHWC",
                                          seed=int(rng.integers(0, 2**31 - 1)))
            logs = model.train_on_batch(xb, yb, return_dict=True)
        # Reading the running metrics back is the only host synchronisation of the epoch.
        summary = " - ".join(f"{k}: {float(v):.4f}" for k, v in logs.items())
        print(f"epoch {epoch + 1}/{args.epochs} - {time.perf_counter() - epoch_start:.1f}s - {summary}")
    train_seconds = time.perf_counter() - start

    loss, accuracy = model.evaluate(normalize(x_test), y_test.reshape(-1).astype(np.int32),
                                    batch_size=max(args.batch_size, 256), verbose=0)
    print(f"training time: {train_seconds:.1f} s ({args.epochs} epochs, precision {args.precision})")
    print(f"test loss: {loss:.4f}")
    print(f"test accuracy: {accuracy:.4f}")
    if not np.isfinite(loss):
        print("error: the test loss is not finite", file=sys.stderr)
        return 1
    if args.min_accuracy is not None and accuracy < args.min_accuracy:
        print(f"error: test accuracy {accuracy:.4f} is below --min-accuracy {args.min_accuracy}",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
