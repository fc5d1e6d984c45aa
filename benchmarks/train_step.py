"""Time one training step (forward + backward + Adam) of three CNNs in dnnbind and PyTorch eager.

Models (the same layer list builds both the dnnbind and the torch version):

* ``mnist_cnn``  — the Keras mnist_convnet, input 28x28x1, batch 128;
* ``vgg_cifar``  — VGG-style CIFAR net, [conv3x3-BN-ReLU]x2 -> maxpool with 64/128/256
  channels, then a linear layer; input 32x32x3, batch 256;
* ``airbench94`` — the airbench94 network (Keller Jordan's CIFAR-10 speedrun): a 2x2 conv
  to 24 channels + GELU, then three blocks (64, 256, 256 channels) of
  conv3x3 -> maxpool2 -> BN -> GELU -> conv3x3 -> BN -> GELU, then maxpool3, flatten and a
  linear layer to 10 classes; batch 1024.

Method: the batch is generated once and uploaded before timing, so there are no host
transfers in the timed loop. After ``--warmup`` steps, each of ``--steps`` steps is
bracketed by CUDA events (``dnnbind.cuda.Event`` / ``torch.cuda.Event``) on the stream
the framework computes on; the table shows the median ms/step and the peak device memory
(``dnnbind.cuda.pool_stats`` / ``torch.cuda.max_memory_allocated``), in float32 and in
mixed bfloat16. dnnbind runs ``model.train_on_batch`` on device-resident arrays, twice: with
its default ``jit_compile="auto"`` (the step replayed as a CUDA graph: "graph ms") and with
``jit_compile=False`` (every op launched from Python: "eager ms"); torch runs
``zero_grad``, forward, ``cross_entropy``, ``backward`` and ``Adam.step`` (under
``torch.autocast`` for bf16; channels_last memory format). torch is optional.

    python benchmarks/train_step.py --json results.json
    python benchmarks/train_step.py --models mnist_cnn --precisions float32 --steps 20
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any

import numpy as np

# ---------------------------------------------------------------- model specs
# ("conv", filters, kernel, padding, use_bias) | ("bn",) | ("relu",) | ("gelu",) | ("maxpool", k)
# | ("flatten",) | ("dropout", rate) | ("dense", units, use_bias)

def _vgg() -> list[tuple]:
    spec: list[tuple] = []
    for width in (64, 128, 256):
        spec += [("conv", width, 3, "same", False), ("bn",), ("relu",),
                 ("conv", width, 3, "same", False), ("bn",), ("relu",), ("maxpool", 2)]
    return spec + [("flatten",), ("dense", 10, True)]


def _airbench() -> list[tuple]:
    spec: list[tuple] = [("conv", 24, 2, "valid", True), ("gelu",)]
    for width in (64, 256, 256):
        spec += [("conv", width, 3, "same", False), ("maxpool", 2), ("bn",), ("gelu",),
                 ("conv", width, 3, "same", False), ("bn",), ("gelu",)]
    return spec + [("maxpool", 3), ("flatten",), ("dense", 10, False)]


MODELS: dict[str, dict[str, Any]] = {
    "mnist_cnn": {"input": (28, 28, 1), "batch": 128, "spec": [
        ("conv", 32, 3, "valid", True), ("relu",), ("maxpool", 2),
        ("conv", 64, 3, "valid", True), ("relu",), ("maxpool", 2),
        ("flatten",), ("dropout", 0.5), ("dense", 10, True)]},
    "vgg_cifar": {"input": (32, 32, 3), "batch": 256, "spec": _vgg()},
    "airbench94": {"input": (32, 32, 3), "batch": 1024, "spec": _airbench()},
}


def make_batch(name: str, batch: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    h, w, c = MODELS[name]["input"]
    x = rng.standard_normal((batch, h, w, c)).astype(np.float32)
    y = rng.integers(0, 10, batch).astype(np.int32)
    return x, y


# ---------------------------------------------------------------- dnnbind

def build_dnnbind(name: str, jit_compile: Any = "auto"):
    import dnnbind
    from dnnbind import layers

    model = dnnbind.Sequential([dnnbind.Input(MODELS[name]["input"])], name=name)
    for kind, *args in MODELS[name]["spec"]:
        if kind == "conv":
            filters, kernel, padding, bias = args
            model.add(layers.Conv2D(filters, kernel, padding=padding, use_bias=bias))
        elif kind == "bn":
            model.add(layers.BatchNormalization())
        elif kind in ("relu", "gelu"):
            model.add(layers.Activation(kind))
        elif kind == "maxpool":
            model.add(layers.MaxPooling2D(args[0]))
        elif kind == "flatten":
            model.add(layers.Flatten())
        elif kind == "dropout":
            model.add(layers.Dropout(args[0]))
        elif kind == "dense":
            # The softmax is fused with the cross-entropy by dnnbind (torch takes logits).
            model.add(layers.Dense(args[0], use_bias=args[1], activation="softmax"))
    model.compile(optimizer=dnnbind.optimizers.Adam(learning_rate=1e-3),
                  loss="sparse_categorical_crossentropy", jit_compile=jit_compile)
    return model


def _reset_pool_high_water_mark() -> bool:
    """Zero the pool's used-memory high-water mark so each model reports its own peak."""
    from cuda.bindings import driver, runtime

    from dnnbind import cuda

    err, pool = runtime.cudaDeviceGetMemPool(cuda.current_device_index())
    if err != runtime.cudaError_t.cudaSuccess:
        return False
    (err,) = runtime.cudaMemPoolSetAttribute(pool, runtime.cudaMemPoolAttr.cudaMemPoolAttrUsedMemHigh,
                                             driver.cuuint64_t(0))
    return err == runtime.cudaError_t.cudaSuccess


def time_dnnbind(name: str, precision: str, steps: int, warmup: int, jit_compile: Any = "auto") -> dict:
    import dnnbind
    from dnnbind import backend, cuda

    dnnbind.mixed_precision.set_global_policy(precision)
    try:
        model = build_dnnbind(name, jit_compile)
        device = backend.default_device()
        x, y = make_batch(name, MODELS[name]["batch"])
        xd, yd = backend.asarray(x, device), backend.asarray(y, device)
        stream = cuda.current_stream()
        stream.synchronize()
        peak_reset = _reset_pool_high_water_mark()
        for _ in range(warmup):
            model.train_on_batch(xd, yd, return_dict=True)  # lazy logs: no host sync per step
        stream.synchronize()
        events = [cuda.Event() for _ in range(steps + 1)]
        events[0].record(stream)
        for i in range(steps):
            model.train_on_batch(xd, yd, return_dict=True)  # lazy logs: no host sync per step
            events[i + 1].record(stream)
        events[-1].synchronize()
        times = [events[i].elapsed_time(events[i + 1]) for i in range(steps)]
        stats = cuda.pool_stats()
        # "used_high": the most bytes the pool had handed out at once (since the reset above).
        return {"ms_per_step": statistics.median(times), "peak_bytes": stats.get("used_high"),
                "peak_reset": peak_reset, "pool_stats": stats}
    finally:
        dnnbind.mixed_precision.set_global_policy("float32")


# ---------------------------------------------------------------- torch

def build_torch(name: str, torch):
    nn = torch.nn
    h, w, c = MODELS[name]["input"]
    modules: list = []
    channels, size = c, (h, w)
    for kind, *args in MODELS[name]["spec"]:
        if kind == "conv":
            filters, kernel, padding, bias = args
            modules.append(nn.Conv2d(channels, filters, kernel, padding=padding, bias=bias))
            if padding == "valid":
                size = (size[0] - kernel + 1, size[1] - kernel + 1)
            channels = filters
        elif kind == "bn":
            modules.append(nn.BatchNorm2d(channels, eps=1e-3, momentum=0.01))
        elif kind == "relu":
            modules.append(nn.ReLU())
        elif kind == "gelu":
            modules.append(nn.GELU())
        elif kind == "maxpool":
            modules.append(nn.MaxPool2d(args[0]))
            size = (size[0] // args[0], size[1] // args[0])
        elif kind == "flatten":
            # Keras flattens NHWC; the order does not matter for timing.
            modules.append(nn.Flatten())
            channels = channels * size[0] * size[1]
        elif kind == "dropout":
            modules.append(nn.Dropout(args[0]))
        elif kind == "dense":
            modules.append(nn.Linear(channels, args[0], bias=args[1]))
    return nn.Sequential(*modules)


def time_torch(name: str, precision: str, steps: int, warmup: int, channels_last: bool) -> dict:
    import torch

    device = torch.device("cuda")
    model = build_torch(name, torch).to(device)
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    model = model.to(memory_format=fmt)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, eps=1e-7)
    x, y = make_batch(name, MODELS[name]["batch"])
    xd = torch.from_numpy(x).permute(0, 3, 1, 2).contiguous(memory_format=fmt).to(device)
    yd = torch.from_numpy(y).long().to(device)
    autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=precision == "mixed_bfloat16")

    def step():
        optimizer.zero_grad(set_to_none=True)
        with autocast:
            loss = torch.nn.functional.cross_entropy(model(xd), yd)
        loss.backward()
        optimizer.step()

    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    events = [torch.cuda.Event(enable_timing=True) for _ in range(steps + 1)]
    events[0].record()
    for i in range(steps):
        step()
        events[i + 1].record()
    events[-1].synchronize()
    times = [events[i].elapsed_time(events[i + 1]) for i in range(steps)]
    return {"ms_per_step": statistics.median(times), "peak_bytes": torch.cuda.max_memory_allocated()}


# ---------------------------------------------------------------- main

def _mib(n: int | None) -> str:
    return "-" if n is None else f"{n / 2**20:.0f} MiB"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--precisions", nargs="+", default=["float32", "mixed_bfloat16"],
                        choices=["float32", "mixed_bfloat16"])
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--no-torch", action="store_true")
    parser.add_argument("--torch-nchw", action="store_true", help="torch in NCHW instead of channels_last")
    parser.add_argument("--heuristic", action="store_true",
                        help="dnnbind picks cuDNN algorithms by heuristics (default: measures them once per "
                             "shape, as torch.backends.cudnn.benchmark=True does for torch)")
    parser.add_argument("--json", default=None, help="also write the results to this JSON file")
    args = parser.parse_args(argv)

    from dnnbind import cuda

    if not cuda.is_available():
        print(f"benchmarks/train_step.py needs a GPU: {cuda.unavailable_reason()}", file=sys.stderr)
        return 2
    import dnnbind

    dnnbind.set_default_device("cuda")
    dnnbind.ops.config.benchmark = not args.heuristic
    torch = None
    if not args.no_torch:
        try:
            import torch  # noqa: F811
            if not torch.cuda.is_available():
                torch = None
        except ImportError:
            torch = None
    if torch is None:
        print("torch (with CUDA) is not available: dnnbind numbers only")
    else:
        torch.backends.cudnn.benchmark = True

    device = cuda.get_device()
    results: dict[str, Any] = {
        "device": device.name, "cudnn": dnnbind.cudnn.version(),
        "torch": None if torch is None else torch.__version__,
        "steps": args.steps, "warmup": args.warmup, "time": time.strftime("%Y-%m-%d %H:%M:%S"),
        "cudnn_benchmark_mode": not args.heuristic, "rows": []}
    header = f"{'model':<11} {'batch':>5} {'precision':<15} {'graph ms':>9} {'eager ms':>9} {'torch ms':>9} " \
             f"{'ratio':>6} {'eager/torch':>11} {'dnnbind peak':>13} {'torch peak':>11}"
    print(f"{device.name}, cuDNN {results['cudnn']}, torch {results['torch']}")
    print(header)
    print("-" * len(header))
    failed = False
    for name in args.models:
        for precision in args.precisions:
            row: dict[str, Any] = {"model": name, "batch": MODELS[name]["batch"], "precision": precision}
            try:
                row["dnnbind"] = time_dnnbind(name, precision, args.steps, args.warmup)
                row["dnnbind_eager"] = time_dnnbind(name, precision, args.steps, args.warmup, jit_compile=False)
            except Exception as exc:  # report and go on: one failing model must not hide the others
                failed = True
                row["dnnbind_error"] = f"{type(exc).__name__}: {exc}"
            if torch is not None:
                try:
                    row["torch"] = time_torch(name, precision, args.steps, args.warmup, not args.torch_nchw)
                except Exception as exc:
                    row["torch_error"] = f"{type(exc).__name__}: {exc}"
            d, e, t = row.get("dnnbind"), row.get("dnnbind_eager"), row.get("torch")
            ratio = d["ms_per_step"] / t["ms_per_step"] if d and t else None
            eager_ratio = e["ms_per_step"] / t["ms_per_step"] if e and t else None
            row["ratio"], row["eager_ratio"] = ratio, eager_ratio
            results["rows"].append(row)
            nan = float("nan")
            print(f"{name:<11} {row['batch']:>5} {precision:<15} "
                  f"{d['ms_per_step'] if d else nan:>9.2f} {e['ms_per_step'] if e else nan:>9.2f} "
                  f"{t['ms_per_step'] if t else nan:>9.2f} {ratio if ratio else nan:>6.2f} "
                  f"{eager_ratio if eager_ratio else nan:>11.2f} {_mib(d and d['peak_bytes']):>13} "
                  f"{_mib(t and t['peak_bytes']):>11}")
            for key in ("dnnbind_error", "torch_error"):
                if key in row:
                    print(f"    {key}: {row[key]}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
        print(f"results written to {args.json}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
