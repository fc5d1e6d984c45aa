"""Models written entirely in ``keras.ops`` against the same models built from dnnbind's layers: the
training step of each, graph-replayed and eager, and the ratio ops / layers.

The goal (issue: user-written ops models): on the H200, a model whose layers are all user-written in
ops runs its graph step within 1.2x of the same model built from dnnbind's layers.

Models (each built twice, (a) from ``dnnbind.layers`` and (b) from the ``Ops*`` layers below, small
``keras.layers.Layer`` subclasses whose ``build`` makes the weights with ``add_weight`` and whose
``call`` uses only ``keras.ops``):

* ``mlp`` — input 784, Dense 512 relu, Dense 512 relu, Dense 10 (logits); batch 256;
* ``cnn`` — Keras's mnist_convnet without dropout, NHWC: input 28x28x1, conv3x3 32 relu, maxpool 2,
  conv3x3 64 relu, maxpool 2, flatten, Dense 10 (logits); batch 128.

Both compile with ``Adam(1e-3)`` and ``SparseCategoricalCrossentropy(from_logits=True)``. (b) gets (a)'s
initial weights (``set_weights``), so both compute the same function: before any timing, every
contender's first ``train_on_batch`` loss must match the layer model's to ``rtol`` (1e-4 in float32,
2e-2 in mixed_bfloat16; ``--rtol`` sets another), and the next two steps' losses (after Adam updates:
the gradients agree too; on a GPU the graph contenders' captured step and first replay) to 10x that; a
mismatch fails the row. A graph contender whose timed steps were not all replayed (a failed capture
falls back to eager) fails too.

Contenders, each timed in every one of ``--rounds`` alternating rounds (the table shows medians over
rounds): ``model.train_on_batch`` with ``jit_compile="auto"`` (graph: the step replayed as a CUDA
graph) and with ``jit_compile=False`` (eager), for (a) and (b). On a GPU, after ``--warmup`` steps each
of ``--steps`` steps is bracketed by CUDA events on the current stream (the median ms/step); on the
NumPy backend (``--device cpu``, a smoke test: there is no graph replay there, so "graph" runs the same
eager step) host ``perf_counter`` brackets each step. The batch is generated and put on the device once,
before timing. Graph ratios above 1.2 are flagged.

``--fake`` (no GPU needed) replaces the CUDA runtime/driver, cuDNN and cuBLAS calls by no-op fakes
(``host_path.py``'s) and reports host µs per eager step, the Python cost of each path; the loss check
is skipped there (the fake device computes nothing). ``--profile`` cProfiles (a)'s and (b)'s eager
steps (``--profile-steps``, default 50) and prints the top ``--top`` entries of each.

    python benchmarks/ops_models.py --json ops_models.json          # four rows on a GPU
    python benchmarks/ops_models.py --device cpu --steps 3 --warmup 1 --rounds 1   # smoke test
    python benchmarks/ops_models.py --fake --models mlp --precisions float32 --profile
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import statistics
import sys
import time
from typing import Any

import numpy as np

import dnnbind as keras
from dnnbind import layers, ops

# train_step.py's helpers (scripts beside each other, as host_path.py imports them)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_step import _fmt, _median_ms, _mib, _reset_pool_high_water_mark  # noqa: E402


# ------------------------------------------------------------------ the user-written ops layers

class OpsDense(keras.layers.Layer):
    """``x @ kernel + bias``, then relu if asked."""

    def __init__(self, units: int, relu: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.units, self.relu = units, relu

    def build(self, input_shape):
        self.kernel = self.add_weight(shape=(input_shape[-1], self.units), initializer="glorot_uniform",
                                      name="kernel")
        self.bias = self.add_weight(shape=(self.units,), initializer="zeros", name="bias")

    def call(self, x):
        y = ops.matmul(x, self.kernel) + self.bias
        return ops.relu(y) if self.relu else y


class OpsConv2D(keras.layers.Layer):
    """A "valid", stride-1 NHWC convolution + bias, then relu if asked."""

    def __init__(self, filters: int, kernel_size: int, relu: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.filters, self.kernel_size, self.relu = filters, kernel_size, relu

    def build(self, input_shape):
        k = self.kernel_size
        self.kernel = self.add_weight(shape=(k, k, input_shape[-1], self.filters),
                                      initializer="glorot_uniform", name="kernel")
        self.bias = self.add_weight(shape=(self.filters,), initializer="zeros", name="bias")

    def call(self, x):
        y = ops.conv(x, self.kernel, strides=1, padding="valid") + self.bias
        return ops.relu(y) if self.relu else y


class OpsMaxPool2D(keras.layers.Layer):
    """Non-overlapping ``pool`` x ``pool`` max pooling (NHWC)."""

    def __init__(self, pool: int = 2, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.pool = pool

    def call(self, x):
        return ops.max_pool(x, self.pool, strides=self.pool, padding="valid")


class OpsFlatten(keras.layers.Layer):
    """``(N, ...) -> (N, prod(...))``."""

    def call(self, x):
        return ops.reshape(x, (x.shape[0], math.prod(x.shape[1:])))


# ------------------------------------------------------------------ the models

MODELS: dict[str, dict[str, Any]] = {
    "mlp": {"input": (784,), "batch": 256},
    "cnn": {"input": (28, 28, 1), "batch": 128},
}


def build_model(name: str, kind: str, jit_compile: Any = "auto"):
    """``kind`` "layers" (dnnbind's layers) or "ops" (the Ops* layers above), compiled."""
    if kind == "layers":
        dense, conv, pool, flatten = (
            lambda units, relu=False: layers.Dense(units, activation="relu" if relu else None),
            lambda filters, k, relu: layers.Conv2D(filters, k, activation="relu" if relu else None),
            layers.MaxPooling2D, layers.Flatten)
    elif kind == "ops":
        dense, conv, pool, flatten = OpsDense, OpsConv2D, OpsMaxPool2D, OpsFlatten
    else:
        raise ValueError(f"build_model: kind must be 'layers' or 'ops', got {kind!r}")
    if name == "mlp":
        stack = [dense(512, relu=True), dense(512, relu=True), dense(10)]
    elif name == "cnn":
        stack = [conv(32, 3, relu=True), pool(2), conv(64, 3, relu=True), pool(2), flatten(), dense(10)]
    else:
        raise ValueError(f"build_model: name must be one of {list(MODELS)}, got {name!r}")
    model = keras.Sequential([keras.Input(MODELS[name]["input"])] + stack, name=f"{name}_{kind}")
    model.compile(optimizer=keras.optimizers.Adam(learning_rate=1e-3),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), jit_compile=jit_compile)
    return model


def initial_weights(name: str, seed: int = 0) -> list[np.ndarray]:
    """The layer model's initial weights, drawn once per row; every contender starts from them."""
    keras.utils.set_random_seed(seed)
    return [np.asarray(w) for w in build_model(name, "layers").get_weights()]


def make_batch(name: str, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    batch = MODELS[name]["batch"]
    x = rng.standard_normal((batch,) + MODELS[name]["input"]).astype(np.float32)
    y = rng.integers(0, 10, batch).astype(np.int32)
    return x, y


CONTENDERS = ("layers_graph", "ops_graph", "layers_eager", "ops_eager")
RTOL = {"float32": 1e-4, "mixed_bfloat16": 2e-2}


def _setup(name: str, contender: str, weights: list) -> tuple:
    """The contender's model with ``weights`` and the device batch."""
    from dnnbind import backend

    kind, mode = contender.split("_")
    model = build_model(name, kind, jit_compile="auto" if mode == "graph" else False)
    model.set_weights(weights)
    device = backend.default_device()
    x, y = make_batch(name)
    return model, backend.asarray(x, device), backend.asarray(y, device)


def first_losses(name: str, contender: str, weights: list) -> list[float]:
    """The losses of the contender's first three steps from ``weights`` (read back: host syncs). With
    ``jit_compile="auto"`` on a GPU these are the eager warm-up, the captured step and a replay."""
    model, xd, yd = _setup(name, contender, weights)
    return [float(model.train_on_batch(xd, yd)) for _ in range(3)]


def check_losses(losses: dict, precision: str, rtol: "float | None" = None) -> None:
    """Every contender's first loss within ``rtol`` (default RTOL[precision]) of layers_graph's, its later
    ones within 10 x that (after Adam updates: the gradients agree too)."""
    rtol = RTOL[precision] if rtol is None else rtol
    ref = losses["layers_graph"]
    for contender, got in losses.items():
        for step, (g, r) in enumerate(zip(got, ref), 1):
            tol = rtol if step == 1 else 10 * rtol
            if not abs(g - r) <= tol * abs(r):
                raise AssertionError(
                    f"ops_models: {contender} step {step} loss {g!r} differs from layers_graph's {r!r} by more "
                    f"than rtol {tol:g} ({precision}): the two models do not compute the same function")


def time_contender(name: str, contender: str, weights: list, steps: int, warmup: int, on_gpu: bool) -> dict:
    """Median ms/step of ``steps`` train_on_batch calls after ``warmup``; CUDA events on a GPU."""
    model, xd, yd = _setup(name, contender, weights)
    if not on_gpu:
        for _ in range(warmup):
            model.train_on_batch(xd, yd, return_dict=True)
        times = []
        for _ in range(steps):
            start = time.perf_counter()
            model.train_on_batch(xd, yd, return_dict=True)
            times.append((time.perf_counter() - start) * 1e3)
        return {"ms_per_step": statistics.median(times), "peak_bytes": None}
    from dnnbind import cuda

    stream = cuda.current_stream()
    stream.synchronize()
    peak_reset = _reset_pool_high_water_mark()
    for _ in range(warmup):
        model.train_on_batch(xd, yd, return_dict=True)  # lazy logs: no host sync per step
    stream.synchronize()
    replays_before = model._step_graphs.stats["replays"]
    events = [cuda.Event() for _ in range(steps + 1)]
    events[0].record(stream)
    for i in range(steps):
        model.train_on_batch(xd, yd, return_dict=True)
        events[i + 1].record(stream)
    events[-1].synchronize()
    times = [events[i].elapsed_time(events[i + 1]) for i in range(steps)]
    graph_stats = dict(model._step_graphs.stats)
    replayed = graph_stats["replays"] - replays_before
    if contender.endswith("_graph") and replayed != steps:
        # a failed capture falls back to eager (with a warning): its numbers would not be a graph step's
        raise RuntimeError(f"{contender}: {replayed} of the {steps} timed steps were CUDA-graph replays (the "
                           f"first two steps warm up and capture: --warmup 2 or more; stats {graph_stats})")
    return {"ms_per_step": statistics.median(times), "peak_bytes": cuda.pool_stats().get("used_high"),
            "peak_reset": peak_reset, "graph_stats": graph_stats}


def run_row(name: str, precision: str, args: argparse.Namespace, on_gpu: bool) -> dict:
    row: dict[str, Any] = {"model": name, "batch": MODELS[name]["batch"], "precision": precision,
                           "rounds": {c: [] for c in CONTENDERS}}
    keras.mixed_precision.set_global_policy(precision)
    try:
        weights = initial_weights(name)
        try:
            row["first_losses"] = {c: first_losses(name, c, weights) for c in CONTENDERS}
            check_losses(row["first_losses"], precision, args.rtol)
        except Exception as exc:  # an unequal or failing model: no timing, the row reports why
            row["error"] = f"{type(exc).__name__}: {exc}"
            return row
        for _ in range(args.rounds):
            for contender in CONTENDERS:
                try:
                    result = time_contender(name, contender, weights, args.steps, args.warmup, on_gpu)
                except Exception as exc:  # report and go on: one failing contender must not hide the others
                    row[f"{contender}_error"] = f"{type(exc).__name__}: {exc}"
                    result = None
                row["rounds"][contender].append(result)
                gc.collect()
    finally:
        keras.mixed_precision.set_global_policy("float32")
    ms = row["ms"] = {c: _median_ms(row["rounds"][c]) for c in CONTENDERS}
    row["peak_bytes"] = {c: (row["rounds"][c][0] or {}).get("peak_bytes") for c in CONTENDERS}
    for mode in ("graph", "eager"):
        a, b = ms[f"layers_{mode}"], ms[f"ops_{mode}"]
        row[f"{mode}_ratio"] = b / a if a and b else None
    row["graph_over_goal"] = row["graph_ratio"] is not None and row["graph_ratio"] > GOAL
    return row


GOAL = 1.2  # the bound on the graph ratio ops / layers

HEADER = ("| model | precision | layers graph ms | ops graph ms | graph ratio ops/layers | layers eager ms | "
          "ops eager ms | eager ratio ops/layers | peak MiB layers / ops (graph) |")


def format_row(row: dict) -> str:
    prec = "bf16" if row["precision"] == "mixed_bfloat16" else "fp32"
    if "ms" not in row:
        return f"| {row['model']} b{row['batch']} | {prec} | failed: see below |" + " |" * 7
    ms, peak = row["ms"], row["peak_bytes"]

    def ratio(v):
        return "-" if v is None else f"{v:.2f}x"

    graph = ratio(row["graph_ratio"]) + (f" **over {GOAL}x**" if row["graph_over_goal"] else "")
    return (f"| {row['model']} b{row['batch']} | {prec} | {_fmt(ms['layers_graph'])} | {_fmt(ms['ops_graph'])} | "
            f"{graph} | {_fmt(ms['layers_eager'])} | {_fmt(ms['ops_eager'])} | {ratio(row['eager_ratio'])} | "
            f"{_mib(peak['layers_graph'])} / {_mib(peak['ops_graph'])} |")


# ------------------------------------------------------------------ host time (--fake, --profile)

def host_rows(args: argparse.Namespace) -> int:
    """Host µs per eager step of (a) and (b) (``--fake``: Python cost only), or their cProfiles."""
    import cProfile
    import pstats

    print(f"{'eager train step':<32}  host µs/step (median of {args.rounds} x {args.steps} steps)")
    print("-" * 58)
    for name in args.models:
        for precision in args.precisions:
            keras.mixed_precision.set_global_policy(precision)
            try:
                weights = initial_weights(name)
                for kind in ("layers", "ops"):
                    model, xd, yd = _setup(name, f"{kind}_eager", weights)

                    def step():
                        model.train_on_batch(xd, yd, return_dict=True)

                    for _ in range(max(args.warmup, 1)):
                        step()
                    if args.profile:
                        prof = cProfile.Profile()
                        prof.enable()
                        for _ in range(args.profile_steps):
                            step()
                        prof.disable()
                        print(f"\n{name} {kind} {precision} ({args.profile_steps} eager steps)")
                        pstats.Stats(prof).sort_stats(args.sort).print_stats(args.top)
                        continue
                    per_round = []
                    for _ in range(args.rounds):
                        start = time.perf_counter()
                        for _ in range(args.steps):
                            step()
                        per_round.append((time.perf_counter() - start) / args.steps * 1e6)
                    print(f"{f'{name} {kind} {precision}':<32}  {statistics.median(per_round):10.1f}", flush=True)
            finally:
                keras.mixed_precision.set_global_policy("float32")
    return 0


# ------------------------------------------------------------------ main

def main(argv: "list[str] | None" = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--precisions", nargs="+", default=["float32", "mixed_bfloat16"],
                        choices=["float32", "mixed_bfloat16"])
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds; the table shows medians")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                        help="cpu: the NumPy backend with host timers (a smoke test)")
    parser.add_argument("--heuristic", action="store_true",
                        help="pick cuDNN algorithms by heuristics (default: measure them once per shape)")
    parser.add_argument("--fake", action="store_true",
                        help="no GPU needed: fake the device calls, report host µs per eager step")
    parser.add_argument("--profile", action="store_true", help="cProfile the eager steps of both models")
    parser.add_argument("--profile-steps", type=int, default=50)
    parser.add_argument("--top", type=int, default=30, help="entries of each --profile list")
    parser.add_argument("--sort", default="tottime", help="pstats sort key of --profile")
    parser.add_argument("--rtol", type=float, default=None,
                        help="relative tolerance of the first-step loss check (default 1e-4 in float32, 2e-2 in "
                             "mixed_bfloat16; the later steps get 10x)")
    parser.add_argument("--json", default=None, help="also write the results to this JSON file")
    args = parser.parse_args(argv)
    if args.rtol is not None and not args.rtol > 0:
        parser.error(f"--rtol must be > 0, got {args.rtol}")
    if args.rounds < 1 or args.steps < 1 or args.warmup < 0 or args.profile_steps < 1:
        parser.error("--rounds, --steps and --profile-steps must be >= 1, --warmup >= 0")
    if args.device == "cuda" and not args.fake and not args.profile and args.warmup < 2:
        parser.error("--warmup must be >= 2 on a GPU: the first step warms up, the second captures the graph")
    if args.fake:
        from host_path import install_fakes

        install_fakes()
    from dnnbind import cuda

    if args.device == "cuda" or args.fake:
        if not cuda.is_available():
            print(f"benchmarks/ops_models.py needs a GPU (or --device cpu, or --fake): "
                  f"{cuda.unavailable_reason()}", file=sys.stderr)
            return 2
        keras.set_default_device("cuda")
        keras.kernels.config.benchmark = not args.heuristic and not args.fake
    else:
        keras.set_default_device("cpu")
    if args.fake or args.profile:
        where = "fake device calls (Python-side cost only)" if args.fake else f"device {args.device}"
        print(f"ops-written vs layer models, eager host time; {where}; Python {sys.version.split()[0]}")
        return host_rows(args)

    on_gpu = args.device == "cuda"
    where = cuda.get_device().name if on_gpu else "NumPy backend (CPU, host timers; no graph replay)"
    results: dict[str, Any] = {
        "device": where, "cudnn": keras.cudnn.version() if on_gpu else None, "steps": args.steps,
        "warmup": args.warmup, "rounds": args.rounds, "cudnn_benchmark_mode": on_gpu and not args.heuristic,
        "goal_graph_ratio": GOAL, "time": time.strftime("%Y-%m-%d %H:%M:%S"), "rows": []}
    print(f"{where}; medians of {args.rounds} alternating rounds of {args.steps} steps after {args.warmup} "
          f"warm-up steps; ratio = ops model / layer model")
    print()
    print(HEADER)
    print("|" + "---|" * 9)
    failed = False
    for name in args.models:
        for precision in args.precisions:
            row = run_row(name, precision, args, on_gpu)
            failed = failed or any(k.endswith("error") for k in row)
            results["rows"].append(row)
            print(format_row(row), flush=True)
    for row in results["rows"]:
        for key in [k for k in row if k.endswith("error")]:
            print(f"{row['model']} {row['precision']} {key}: {row[key]}")
        if row.get("graph_over_goal"):
            print(f"FLAG: {row['model']} {row['precision']}: the ops model's graph step is "
                  f"{row['graph_ratio']:.2f}x the layer model's (goal: within {GOAL}x)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
        print(f"results written to {args.json}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
