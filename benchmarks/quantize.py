"""Low-bit inference (``model.quantize``): accuracy on MNIST, and speed and memory of a large MLP.

Part 1, accuracy: the Keras ``mnist_convnet`` of ``examples/mnist.py`` is trained briefly in float32
(``--epochs``, default 2; data as that example: ``--data-dir``, or the download, or the test digits shipped
with dnnbind), then copied and quantized in each mode (``int8``, ``float8``, ``int4``); the table gives the
test accuracy, its drop from float32 in points, and the weights' bytes. ``--calibrate N`` calibrates
int8/float8 activation scales on N training images instead of computing them per batch.
``--no-accuracy`` skips this part; ``--limit N`` keeps at most N training and N test images. The issue's
goals: a drop of at most 0.3 points for int8 and float8, 1 point for int4.

Part 2, speed (CUDA only; ``--no-mlp`` skips it): three ``Dense(--width, relu)`` layers at
batch ``--batch`` (both 4096 by default): the model with bfloat16 weights (the baseline), the
``mixed_bfloat16`` one, and quantized copies of the latter (float8, int8, int4 with its two paths:
``dequantize`` = weight to bf16 then cuBLAS, ``fused`` = one NVRTC kernel). Each forward
(``model(x)`` on a device batch) is captured once in a CUDA graph after ``--warmup`` eager calls, then
``--iters`` replays (defaults 3 and 20) are each bracketed by CUDA events; the table gives the median ms,
the speed-up over bf16 and the weight bytes. The goal: FP8 >= 1.6x bf16.

    python benchmarks/quantize.py                       # both parts
    python benchmarks/quantize.py --data-dir ~/mnist --epochs 3 --calibrate 2048 --json quant.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import warnings

import numpy as np

import dnnbind as keras
from dnnbind import backend, layers

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
import mnist as mnist_example  # noqa: E402 - examples/ is not a package

MODES = ("int8", "float8", "int4")


def weight_bytes(model) -> int:
    return int(sum(w.value.nbytes for w in model.weights))


def accuracy_table(args) -> list[dict]:
    example_args = argparse.Namespace(data_dir=args.data_dir, split=None)
    (x_train, y_train), (x_test, y_test), what = mnist_example.load(example_args)
    if args.limit:
        x_train, y_train, x_test, y_test = x_train[:args.limit], y_train[:args.limit], x_test[:args.limit], \
            y_test[:args.limit]
    x_train = x_train.astype(np.float32)[..., None] / 255.0
    x_test = x_test.astype(np.float32)[..., None] / 255.0
    print(f"MNIST: {what}; {len(x_train)} train, {len(x_test)} test images, {args.epochs} epoch(s)")
    keras.utils.set_random_seed(0)
    model = mnist_example.build_model()
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    model.fit(x_train, y_train, batch_size=128, epochs=args.epochs, verbose=0)
    path = os.path.join(args.workdir, "quantize_bench_float.safetensors")
    model.save_weights(path)
    rows = [{"mode": "float32", "accuracy": float(model.evaluate(x_test, y_test, verbose=0)[1]),
             "weight_bytes": weight_bytes(model)}]
    for mode in MODES:
        copy = mnist_example.build_model()
        copy.compile(loss="sparse_categorical_crossentropy", metrics=["accuracy"])
        copy.load_weights(path)
        calibration = x_train[:args.calibrate] if args.calibrate and mode != "int4" else None
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # conv layers: weight-only, said once per run below
            copy.quantize(mode, calibration_data=calibration)
        rows.append({"mode": mode, "accuracy": float(copy.evaluate(x_test, y_test, verbose=0)[1]),
                     "weight_bytes": weight_bytes(copy),
                     "quantized_layers": [f"{layer.name}:{layer.quantization_mode}" for layer in copy._quantized_layers()]})
    base = rows[0]["accuracy"]
    print(f"{'mode':<10}{'accuracy':>10}{'drop (pt)':>11}{'weights':>12}")
    for r in rows:
        r["drop_points"] = round(100 * (base - r["accuracy"]), 3)
        print(f"{r['mode']:<10}{r['accuracy']:>10.4f}{r['drop_points']:>11.2f}{r['weight_bytes']:>12,}")
    print("(Conv2D layers keep a float convolution on their dequantized int8/float8 kernel; int4 leaves them float)")
    return rows


def _time_forward(model, x, warmup: int, iters: int) -> float:
    from dnnbind import cuda

    stream = cuda.Stream()
    with stream:
        for _ in range(warmup):
            model(x)
        stream.synchronize()
        with cuda.capture(stream) as graph:
            y = model(x)
            del y  # nothing made in the capture outlives it
        times = []
        for _ in range(iters):
            start, end = cuda.Event(), cuda.Event()
            start.record(stream)
            graph.launch(stream)
            end.record(stream)
            end.synchronize()
            times.append(start.elapsed_time(end))
    graph.close()
    return statistics.median(times)


def mlp_table(args) -> list[dict]:
    from dnnbind.kernels._cuda import quant as cuda_quant

    width, batch = args.width, args.batch

    def build(policy: str):
        keras.mixed_precision.set_global_policy(policy)
        try:
            keras.utils.set_random_seed(0)
            m = keras.Sequential([layers.Input((width,))] + [layers.Dense(width, activation="relu")
                                                               for _ in range(3)])
        finally:
            keras.mixed_precision.set_global_policy("float32")
        m.to("cuda")
        return m

    weights = build("float32").get_weights()
    rng = np.random.default_rng(0)
    x = backend.asarray(rng.standard_normal((batch, width)).astype(np.float32), device="cuda")
    calibration = rng.standard_normal((512, width)).astype(np.float32)
    # (label, policy, mode, int4 path, calibrated): the baseline is the model with bfloat16 weights (the
    # "bfloat16" policy); "mixed_bfloat16" keeps float32 weights and casts them to bf16 on every call
    variants = [("bf16", "bfloat16", None, None, False),
                ("mixed_bfloat16", "mixed_bfloat16", None, None, False),
                ("float8", "mixed_bfloat16", "float8", None, False),
                ("float8 (calibrated)", "mixed_bfloat16", "float8", None, True),
                ("int8", "mixed_bfloat16", "int8", None, False),
                ("int8 (calibrated)", "mixed_bfloat16", "int8", None, True),
                ("int4 (dequantize)", "mixed_bfloat16", "int4", "dequantize", False),
                ("int4 (fused)", "mixed_bfloat16", "int4", "fused", False)]
    rows, base = [], None
    for label, policy, mode, path, calibrated in variants:
        model = build(policy)
        model.set_weights(weights)
        if mode is not None:
            model.quantize(mode, calibration_data=calibration if calibrated else None)
        saved_path = cuda_quant.INT4_PATH
        if path is not None:
            cuda_quant.INT4_PATH = path
        try:
            ms = _time_forward(model, x, args.warmup, args.iters)
        finally:
            cuda_quant.INT4_PATH = saved_path
        base = ms if base is None else base
        rows.append({"variant": label, "ms": ms, "speedup_vs_bf16": base / ms,
                     "weight_bytes": weight_bytes(model)})
    print(f"\nMLP 3 x Dense({width}, relu) at batch {batch}, forward as a CUDA graph (median of {args.iters}); "
          "quantized models from mixed_bfloat16")
    print(f"{'variant':<22}{'ms':>9}{'x bf16':>9}{'weights':>15}{'x smaller':>11}")
    for r in rows:
        print(f"{r['variant']:<22}{r['ms']:>9.3f}{r['speedup_vs_bf16']:>9.2f}{r['weight_bytes']:>15,}"
              f"{rows[0]['weight_bytes'] / r['weight_bytes']:>11.2f}")
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--limit", type=int, default=None, help="at most N training and N test images")
    parser.add_argument("--calibrate", type=int, default=0, metavar="N",
                        help="calibrate int8/float8 activation scales on N training images (default: per batch)")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--no-accuracy", action="store_true")
    parser.add_argument("--no-mlp", action="store_true")
    parser.add_argument("--width", type=int, default=4096)
    parser.add_argument("--batch", type=int, default=4096)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--workdir", default=os.environ.get("TMPDIR", "/tmp"))
    parser.add_argument("--json", default=None, help="write the tables here")
    args = parser.parse_args(argv)
    if args.device != "auto":
        keras.set_default_device(args.device)
    result: dict = {}
    if not args.no_accuracy:
        result["mnist"] = accuracy_table(args)
    if not args.no_mlp:
        if backend.default_device().is_cuda:
            result["mlp"] = mlp_table(args)
        else:
            print("MLP speed: skipped (needs CUDA)")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(result, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
