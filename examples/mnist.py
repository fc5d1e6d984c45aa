"""Train the Keras ``mnist_convnet`` model on MNIST with dnnbind.

The model and recipe are those of the Keras example (Adam, batch 128, 15 epochs,
categorical cross-entropy on one-hot labels); only the imports differ.

Run it with no flags: ``python examples/mnist.py``.

Data:

* no ``--data-dir``: the four MNIST files are downloaded once (MD5-verified) into
  ``$DNNBIND_DATA`` or ``~/.cache/dnnbind/mnist`` (the standard 60,000 / 10,000 split);
  without a network, it trains on the MNIST test digits shipped inside dnnbind instead
  (the first 8,000 for training, the last 2,000 for testing; one line says so);
* ``--data-dir DIR`` with all four IDX files (``train-*`` and ``t10k-*``, gzipped or
  not): the standard 60,000 / 10,000 split;
* ``--data-dir DIR`` holding only the 10,000 test digits (``t10k-*``): the
  *test-set split* mode, switched on automatically: train on the first 8,000
  digits and test on the last 2,000 (``--split N`` changes 8,000; ``--split`` also
  forces this mode when the training files are present).

Prints the final test accuracy (``test accuracy: 0.9871``) and exits with status
0, or 1 when ``--min-accuracy`` is given and not reached.

    python examples/mnist.py
    python examples/mnist.py --data-dir ~/mnist --epochs 15 --device cuda --precision mixed_bfloat16
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

import dnnbind as keras
from dnnbind import layers
from dnnbind.datasets import mnist

NUM_CLASSES = 10
INPUT_SHAPE = (28, 28, 1)
DEFAULT_SPLIT = mnist.EMBEDDED_SPLIT  # the split load_data falls back to offline


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=15)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto (default)")
    parser.add_argument("--data-dir", default=None,
                        help="directory with the MNIST IDX files; default: download into the cache, or "
                             "offline the 10,000 test digits shipped with dnnbind (8,000 train / 2,000 test)")
    parser.add_argument("--split", type=int, default=None, metavar="N",
                        help="use only the 10k test digits: train on the first N, test on the rest "
                             f"(automatic, N={DEFAULT_SPLIT}, when --data-dir holds only t10k-* files)")
    parser.add_argument("--precision", default="float32",
                        choices=["float32", "mixed_bfloat16", "mixed_float16"])
    parser.add_argument("--limit", type=int, default=None, metavar="N",
                        help="use at most N training and N test images (quick runs)")
    parser.add_argument("--validation-split", type=float, default=0.0)
    parser.add_argument("--seed", type=int, default=1337)
    parser.add_argument("--verbose", type=int, default=2, choices=[0, 1, 2])
    parser.add_argument("--min-accuracy", type=float, default=None,
                        help="exit with status 1 when the test accuracy is below this")
    return parser.parse_args(argv)


def load(args: argparse.Namespace):
    """Return (x_train, y_train), (x_test, y_test), description of the split."""
    split = args.split
    if args.data_dir is not None and split is None and mnist.find_files(args.data_dir, "train") is None \
            and mnist.find_files(args.data_dir, "test") is not None:
        split = DEFAULT_SPLIT
    if split is None:
        train, test = mnist.load_data(data_dir=args.data_dir)
        if args.data_dir is None and len(train[0]) + len(test[0]) == 10000:
            # the download failed and load_data fell back to the digits shipped with dnnbind
            return train, test, (f"MNIST test digits shipped with dnnbind (offline): first {len(train[0])} for "
                                 f"training, last {len(test[0])} for testing")
        return train, test, "standard train / test split"
    x, y = mnist.load_subset("test", data_dir=args.data_dir)
    if not 0 < split < len(x):
        raise SystemExit(f"--split {split}: must be between 1 and {len(x) - 1}")
    return (x[:split], y[:split]), (x[split:], y[split:]), \
        f"MNIST test digits only: first {split} for training, last {len(x) - split} for testing"


def build_model() -> "keras.Sequential":
    return keras.Sequential([
        keras.Input(shape=INPUT_SHAPE),
        layers.Conv2D(32, kernel_size=(3, 3), activation="relu"),
        layers.MaxPooling2D(pool_size=(2, 2)),
        layers.Conv2D(64, kernel_size=(3, 3), activation="relu"),
        layers.MaxPooling2D(pool_size=(2, 2)),
        layers.Flatten(),
        layers.Dropout(0.5),
        layers.Dense(NUM_CLASSES, activation="softmax"),
    ])


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.device != "auto":
        keras.set_default_device(args.device)
    keras.mixed_precision.set_global_policy(args.precision)
    keras.utils.set_random_seed(args.seed)

    (x_train, y_train), (x_test, y_test), description = load(args)
    if args.limit is not None:
        x_train, y_train = x_train[:args.limit], y_train[:args.limit]
        x_test, y_test = x_test[:args.limit], y_test[:args.limit]
    print(f"data: {description}; {len(x_train)} train, {len(x_test)} test")

    # Scale images to [0, 1] and add the channel axis, as the Keras example does.
    x_train = np.expand_dims(x_train.astype("float32") / 255, -1)
    x_test = np.expand_dims(x_test.astype("float32") / 255, -1)
    y_train = keras.utils.to_categorical(y_train, NUM_CLASSES)
    y_test = keras.utils.to_categorical(y_test, NUM_CLASSES)

    model = build_model()
    model.summary()
    model.compile(loss="categorical_crossentropy", optimizer="adam", metrics=["accuracy"])

    start = time.perf_counter()
    model.fit(x_train, y_train, batch_size=args.batch_size, epochs=args.epochs,
              validation_split=args.validation_split, verbose=args.verbose)
    train_seconds = time.perf_counter() - start

    loss, accuracy = model.evaluate(x_test, y_test, batch_size=max(args.batch_size, 256), verbose=0)
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
