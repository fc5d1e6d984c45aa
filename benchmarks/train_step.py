"""Time one training step (forward + backward + Adam) of three CNNs: dnnbind against PyTorch's
eager step, its whole step captured in a CUDA graph, and (opt-in) ``torch.compile``.

Models (the same layer list builds both the dnnbind and the torch version):

* ``mnist_cnn``  — the Keras mnist_convnet, input 28x28x1, batch 128;
* ``vgg_cifar``  — VGG-style CIFAR net, [conv3x3-BN-ReLU]x2 -> maxpool with 64/128/256
  channels, then a linear layer; input 32x32x3, batch 256;
* ``airbench94`` — the airbench94 network (Keller Jordan's CIFAR-10 speedrun): a 2x2 conv
  to 24 channels + GELU, then three blocks (64, 256, 256 channels) of
  conv3x3 -> maxpool2 -> BN -> GELU -> conv3x3 -> BN -> GELU, then maxpool3, flatten and a
  linear layer to 10 classes; batch 1024.

Contenders, each timed in every one of ``--rounds`` alternating rounds (in this order, so drift
hits all alike; the table shows medians over rounds):

* dnnbind graph: ``model.train_on_batch`` with the default ``jit_compile="auto"`` (the step
  replayed as a CUDA graph);
* dnnbind eager: ``jit_compile=False`` (every op launched from Python);
* torch eager: ``zero_grad``, forward, ``cross_entropy``, ``backward``, ``Adam.step``
  (channels_last, ``torch.autocast(bfloat16)`` for bf16, ``cudnn.benchmark = True``);
* torch graph: that whole step captured in one ``torch.cuda.CUDAGraph`` with capturable Adam
  (as ``functional_step.py``);
* torch compile (``--compile`` only: max-autotune compiles for minutes): the loss function
  under ``torch.compile(mode="max-autotune")`` with fused Adam; compile time is excluded (it
  happens in the first round's warm-up, bounded by ``--compile-timeout``); a failure or timeout
  reads "n/a" with its reason.

Method: the batch is generated once and uploaded before timing, so there are no host
transfers in the timed loop. After ``--warmup`` steps, each of ``--steps`` steps is
bracketed by CUDA events on the stream the framework computes on; each contender's number is
the median ms/step. Peak device memory (``dnnbind.cuda.pool_stats`` high-water mark /
``torch.cuda.max_memory_allocated``) is taken in the first round, from before the warm-up.
Effective TFLOP/s counts the model's FLOPs analytically (convolutions and dense layers: forward
2 x MACs, backward 2 x forward, so 6 x MACs a step) over the step time; the share of the dense
bf16 peak divides it by what an 8192^3 bfloat16 GEMM (cuBLAS through ``dnnbind.kernels.matmul``)
reaches in the same run. torch is optional (``--no-torch`` or not installed: its columns read
"-"). Defaults: ``--steps 50 --warmup 10 --rounds 3``, both precisions (``float32``,
``mixed_bfloat16``), every model; ``--torch-nchw`` runs torch in NCHW instead of channels_last;
``--heuristic`` has dnnbind pick cuDNN algorithms by heuristics instead of measuring them once
per shape.

    python benchmarks/train_step.py --json results.json
    python benchmarks/train_step.py --models mnist_cnn --precisions float32 --steps 20 --rounds 1
    python benchmarks/train_step.py --compile          # adds torch.compile (several minutes)
"""

from __future__ import annotations

import argparse
import gc
import json
import signal
import statistics
import sys
import time
from typing import Any, Callable

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


def layer_shapes(name: str) -> list[dict]:
    """Walk the model's spec: per layer its kind, input and output shapes (batch first, NHWC),
    trainable parameter shapes (Keras layouts), multiply-accumulates of its forward pass, and
    for max-pooling the window. Used for the FLOP count here and by kernel_bandwidth.py."""
    batch = MODELS[name]["batch"]
    shape: tuple = (batch,) + tuple(MODELS[name]["input"])
    out = []
    for kind, *args in MODELS[name]["spec"]:
        rec: dict[str, Any] = {"kind": kind, "input": shape, "params": [], "macs": 0}
        if kind == "conv":
            filters, k, padding, bias = args
            n, h, w, c = shape
            if padding == "valid":
                h, w = h - k + 1, w - k + 1
            shape = (n, h, w, filters)
            rec["params"] = [(k, k, c, filters)] + ([(filters,)] if bias else [])
            rec["macs"] = n * h * w * filters * k * k * c
            rec["bias"] = bias
        elif kind == "bn":
            rec["params"] = [(shape[-1],), (shape[-1],)]  # gamma, beta (the moving statistics are not trained)
        elif kind == "maxpool":
            k = args[0]
            n, h, w, c = shape
            shape = (n, h // k, w // k, c)
            rec["window"] = k
        elif kind == "flatten":
            shape = (shape[0], int(np.prod(shape[1:])))
        elif kind == "dense":
            units, bias = args
            rec["params"] = [(shape[-1], units)] + ([(units,)] if bias else [])
            rec["macs"] = shape[0] * shape[-1] * units
            rec["bias"] = bias
            shape = (shape[0], units)
        rec["output"] = shape
        out.append(rec)
    return out


def step_flops(name: str) -> int:
    """FLOPs of one training step: convolutions and dense layers, forward 2 x MACs and backward
    twice that (data and weight gradients); elementwise work, BN and pooling are not counted."""
    return 6 * sum(rec["macs"] for rec in layer_shapes(name))


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


class TorchSetup:
    """One torch model, optimizer and device batch for a (model, precision) row."""

    def __init__(self, torch, name: str, precision: str, channels_last: bool, **adam: Any) -> None:
        self.torch = torch
        fmt = torch.channels_last if channels_last else torch.contiguous_format
        self.model = build_torch(name, torch).cuda().to(memory_format=fmt)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=1e-3, eps=1e-7, **adam)
        x, y = make_batch(name, MODELS[name]["batch"])
        self.x = torch.from_numpy(x).permute(0, 3, 1, 2).contiguous(memory_format=fmt).cuda()
        self.y = torch.from_numpy(y).long().cuda()
        self.autocast = lambda: torch.autocast("cuda", dtype=torch.bfloat16, enabled=precision == "mixed_bfloat16")

    def loss(self):
        with self.autocast():
            return self.torch.nn.functional.cross_entropy(self.model(self.x), self.y)


def capture_torch_step(torch, step: Callable[[], None]):
    """``step`` captured in a ``torch.cuda.CUDAGraph`` after three warm-up calls on a side stream (as
    torch's CUDA-graph documentation does); returns the graph (replay it with ``graph.replay()``)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    return graph


def time_torch_steps(torch, step: Callable[[], None], steps: int, warmup: int) -> float:
    """Median ms of ``steps`` calls of ``step``, each bracketed by CUDA events, after ``warmup`` calls."""
    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    events = [torch.cuda.Event(enable_timing=True) for _ in range(steps + 1)]
    events[0].record()
    for i in range(steps):
        step()
        events[i + 1].record()
    events[-1].synchronize()
    return statistics.median(events[i].elapsed_time(events[i + 1]) for i in range(steps))


def time_torch_eager(torch, name: str, precision: str, steps: int, warmup: int, channels_last: bool) -> dict:
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    t = TorchSetup(torch, name, precision, channels_last)

    def step():
        t.optimizer.zero_grad(set_to_none=True)
        t.loss().backward()
        t.optimizer.step()

    ms = time_torch_steps(torch, step, steps, warmup)
    return {"ms_per_step": ms, "peak_bytes": torch.cuda.max_memory_allocated()}


def time_torch_graph(torch, name: str, precision: str, steps: int, warmup: int, channels_last: bool) -> dict:
    """The whole step (zero_grad, forward, loss, backward, capturable Adam) in one CUDAGraph."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    t = TorchSetup(torch, name, precision, channels_last, capturable=True)

    def step():
        t.optimizer.zero_grad(set_to_none=False)  # the graph keeps writing into the same .grad tensors
        t.loss().backward()
        t.optimizer.step()

    graph = capture_torch_step(torch, step)
    ms = time_torch_steps(torch, graph.replay, steps, warmup)
    peak = torch.cuda.max_memory_allocated()
    del graph
    return {"ms_per_step": ms, "peak_bytes": peak}


class _Timeout(Exception):
    pass


class TorchCompiled:
    """``torch.compile(mode="max-autotune")`` of the loss function (forward + cross-entropy; the
    backward is compiled by AOTAutograd) with fused Adam, compiled once per row and timed in every
    round. ``error`` holds why it is "n/a" (a compile failure or ``timeout_s`` passing)."""

    def __init__(self, torch, name: str, precision: str, channels_last: bool, timeout_s: float) -> None:
        self.torch, self.error, self.compile_s, self.peak_bytes = torch, None, None, None
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        t = self.setup = TorchSetup(torch, name, precision, channels_last, fused=True)
        compiled = torch.compile(t.loss, mode="max-autotune")
        mark = getattr(getattr(torch, "compiler", None), "cudagraph_mark_step_begin", None)

        def step():
            if mark is not None:
                mark()  # a new iteration for the cudagraph trees max-autotune uses
            t.optimizer.zero_grad(set_to_none=True)
            compiled().backward()
            t.optimizer.step()

        self.step = step

        def expire(signum, frame):
            raise _Timeout(f"compiling took more than {timeout_s:.0f} s")

        start = time.perf_counter()
        previous = signal.signal(signal.SIGALRM, expire)
        signal.alarm(max(1, int(timeout_s)))
        try:
            for _ in range(3):  # compiles (and autotunes) on the first calls
                step()
            torch.cuda.synchronize()
        except Exception as exc:  # report and go on: the other contenders still run
            self.error = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:200]
        finally:
            signal.alarm(0)
            signal.signal(signal.SIGALRM, previous)
        self.compile_s = time.perf_counter() - start

    def time(self, steps: int, warmup: int) -> "dict | None":
        if self.error is not None:
            return None
        ms = time_torch_steps(self.torch, self.step, steps, warmup)
        if self.peak_bytes is None:
            self.peak_bytes = self.torch.cuda.max_memory_allocated()
        return {"ms_per_step": ms, "peak_bytes": self.peak_bytes, "compile_s": self.compile_s}


# ---------------------------------------------------------------- the bf16 peak

def bf16_gemm_tflops(n: int = 8192, reps: int = 20) -> float:
    """TFLOP/s of an n x n x n bfloat16 GEMM (cuBLAS through dnnbind.kernels.matmul), the median of
    ``reps`` CUDA-event-timed calls after a warm-up: the dense bf16 peak this GPU reaches."""
    import ml_dtypes

    from dnnbind import cuda, kernels

    rng = np.random.default_rng(0)
    a = cuda.to_device(rng.standard_normal((n, n), dtype=np.float32).astype(ml_dtypes.bfloat16))
    b = cuda.to_device(rng.standard_normal((n, n), dtype=np.float32).astype(ml_dtypes.bfloat16))
    c = cuda.empty((n, n), a.dtype)
    stream = cuda.current_stream()
    for _ in range(3):
        kernels.matmul(a, b, out=c, stream=stream)
    events = [cuda.Event() for _ in range(reps + 1)]
    events[0].record(stream)
    for i in range(reps):
        kernels.matmul(a, b, out=c, stream=stream)
        events[i + 1].record(stream)
    events[-1].synchronize()
    ms = statistics.median(events[i].elapsed_time(events[i + 1]) for i in range(reps))
    return 2.0 * n ** 3 / (ms * 1e-3) / 1e12


# ---------------------------------------------------------------- main

CONTENDERS = ("dnnbind", "dnnbind_eager", "torch_eager", "torch_graph", "torch_compile")


def _median_ms(values: list) -> "float | None":
    ms = [v["ms_per_step"] for v in values if v]
    return statistics.median(ms) if ms else None


def _fmt(value: "float | None", spec: str = ".3f") -> str:
    return "-" if value is None else format(value, spec)


def _mib(n: "int | None") -> str:
    return "-" if n is None else f"{n / 2**20:.0f}"


def run_row(name: str, precision: str, args: argparse.Namespace, torch, peak_tflops: float) -> dict:
    row: dict[str, Any] = {"model": name, "batch": MODELS[name]["batch"], "precision": precision,
                           "flops_per_step": step_flops(name), "rounds": {c: [] for c in CONTENDERS}}
    channels_last = not args.torch_nchw
    compiled: list = []  # made in the first round's turn, kept for the later rounds

    def time_compiled() -> "dict | None":
        if not compiled:
            try:
                compiled.append(TorchCompiled(torch, name, precision, channels_last, args.compile_timeout))
                row["torch_compile_error"], row["torch_compile_s"] = compiled[0].error, compiled[0].compile_s
            except Exception as exc:
                compiled.append(None)
                row["torch_compile_error"] = f"{type(exc).__name__}: {exc}"[:200]
        return None if compiled[0] is None else compiled[0].time(args.steps, args.warmup)

    for _ in range(args.rounds):
        timers: list[tuple[str, Callable[[], "dict | None"]]] = [
            ("dnnbind", lambda: time_dnnbind(name, precision, args.steps, args.warmup)),
            ("dnnbind_eager", lambda: time_dnnbind(name, precision, args.steps, args.warmup, jit_compile=False))]
        if torch is not None:
            timers += [
                ("torch_eager", lambda: time_torch_eager(torch, name, precision, args.steps, args.warmup,
                                                         channels_last)),
                ("torch_graph", lambda: time_torch_graph(torch, name, precision, args.steps, args.warmup,
                                                         channels_last))]
            if args.compile:
                timers.append(("torch_compile", time_compiled))
        for contender, timer in timers:
            try:
                result = timer()
            except Exception as exc:  # report and go on: one failing contender must not hide the others
                row[f"{contender}_error"] = f"{type(exc).__name__}: {exc}"
                result = None
            row["rounds"][contender].append(result)
            gc.collect()
            if torch is not None:
                torch.cuda.empty_cache()
    ms = {c: _median_ms(row["rounds"][c]) for c in CONTENDERS}
    row["ms"] = ms
    # peaks from the first round: later rounds run beside the compiled model's held memory
    row["peak_bytes"] = {c: (row["rounds"][c][0] or {}).get("peak_bytes") if row["rounds"][c] else None
                         for c in CONTENDERS}
    row["tflops"] = {c: row["flops_per_step"] / (v * 1e-3) / 1e12 if v else None for c, v in ms.items()}
    row["speedup_vs_torch_graph"] = ms["torch_graph"] / ms["dnnbind"] if ms["torch_graph"] and ms["dnnbind"] else None
    row["eager_vs_torch_eager"] = (ms["torch_eager"] / ms["dnnbind_eager"]
                                   if ms["torch_eager"] and ms["dnnbind_eager"] else None)
    row["share_of_bf16_peak"] = row["tflops"]["dnnbind"] / peak_tflops if row["tflops"]["dnnbind"] else None
    return row


HEADER = ("| model | precision | dnnbind graph ms | dnnbind eager ms | torch eager ms | torch graph ms | "
          "torch compile ms | speedup vs torch graph | vs torch eager (eager/eager) | TFLOP/s | % of bf16 peak | "
          "peak MiB dnnbind / torch eager / torch graph |")


def format_row(row: dict) -> str:
    ms, peak = row["ms"], row["peak_bytes"]
    compile_ms = _fmt(ms["torch_compile"])
    if row.get("torch_compile_error"):
        compile_ms = f"n/a ({row['torch_compile_error']})"
    share = row["share_of_bf16_peak"]
    ratio = (lambda v: "-" if v is None else f"{v:.2f}x")
    return (f"| {row['model']} b{row['batch']} | {'bf16' if row['precision'] == 'mixed_bfloat16' else 'fp32'} | "
            f"{_fmt(ms['dnnbind'])} | {_fmt(ms['dnnbind_eager'])} | {_fmt(ms['torch_eager'])} | "
            f"{_fmt(ms['torch_graph'])} | {compile_ms} | {ratio(row['speedup_vs_torch_graph'])} | "
            f"{ratio(row['eager_vs_torch_eager'])} | {_fmt(row['tflops']['dnnbind'], '.1f')} | "
            f"{'-' if share is None else f'{100 * share:.1f}%'} | "
            f"{_mib(peak['dnnbind'])} / {_mib(peak['torch_eager'])} / {_mib(peak['torch_graph'])} |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--precisions", nargs="+", default=["float32", "mixed_bfloat16"],
                        choices=["float32", "mixed_bfloat16"])
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds; the table shows medians")
    parser.add_argument("--no-torch", action="store_true")
    parser.add_argument("--compile", action="store_true",
                        help='also time torch.compile(mode="max-autotune") (compiling takes minutes per row)')
    parser.add_argument("--compile-timeout", type=float, default=600.0,
                        help="seconds one row's compilation may take before it reads n/a")
    parser.add_argument("--torch-nchw", action="store_true", help="torch in NCHW instead of channels_last")
    parser.add_argument("--heuristic", action="store_true",
                        help="dnnbind picks cuDNN algorithms by heuristics (default: measures them once per "
                             "shape, as torch.backends.cudnn.benchmark=True does for torch)")
    parser.add_argument("--json", default=None, help="also write the results to this JSON file")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.steps < 1 or args.warmup < 0:
        parser.error("--rounds and --steps must be >= 1, --warmup >= 0")

    from dnnbind import cuda

    if not cuda.is_available():
        print(f"benchmarks/train_step.py needs a GPU: {cuda.unavailable_reason()}", file=sys.stderr)
        return 2
    import dnnbind

    dnnbind.set_default_device("cuda")
    dnnbind.kernels.config.benchmark = not args.heuristic
    torch = None
    if not args.no_torch:
        try:
            import torch  # noqa: F811 - optional: the script runs without it
            if not torch.cuda.is_available():
                torch = None
        except ImportError:
            torch = None
    if torch is None:
        print("torch (with CUDA) is not available: dnnbind numbers only")
    else:
        torch.backends.cudnn.benchmark = True

    device = cuda.get_device()
    peak_tflops = bf16_gemm_tflops()
    results: dict[str, Any] = {
        "device": device.name, "cudnn": dnnbind.cudnn.version(),
        "torch": None if torch is None else torch.__version__,
        "steps": args.steps, "warmup": args.warmup, "rounds": args.rounds, "compile": args.compile,
        "time": time.strftime("%Y-%m-%d %H:%M:%S"), "cudnn_benchmark_mode": not args.heuristic,
        "bf16_gemm_8192_tflops": peak_tflops, "rows": []}
    print(f"{device.name}, cuDNN {results['cudnn']}, torch {results['torch']}; 8192^3 bf16 GEMM: "
          f"{peak_tflops:.0f} TFLOP/s; medians of {args.rounds} alternating rounds of {args.steps} steps"
          + ("" if args.compile else "; torch.compile: pass --compile"))
    print()
    print(HEADER)
    print("|" + "---|" * 12)
    failed = False
    for name in args.models:
        for precision in args.precisions:
            row = run_row(name, precision, args, torch, peak_tflops)
            failed = failed or any(row.get(f"{c}_error") for c in ("dnnbind", "dnnbind_eager"))
            results["rows"].append(row)
            print(format_row(row), flush=True)
    for row in results["rows"]:
        for key in [k for k in row if k.endswith("_error") and row[k]]:
            print(f"{row['model']} {row['precision']} {key}: {row[key]}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
        print(f"results written to {args.json}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
