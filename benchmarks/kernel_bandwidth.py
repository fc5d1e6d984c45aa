"""Achieved memory bandwidth of dnnbind's hand-written kernels against what the GPU reaches.

Baselines, measured in the same run:

* ``memcpy``: a device-to-device ``cudaMemcpyAsync`` of ``--copy-gib`` GiB (default 1);
* ``copy kernel``: a grid-stride copy with 16-byte loads and stores over the same buffers.

Kernels, at the sizes of ``benchmarks/train_step.py``'s models (parameter lists and activation
shapes from its ``layer_shapes``), in float32 and bfloat16:

* ``adam`` / ``sgd``: one ``kernels.adam_update`` / ``kernels.sgd_update`` (momentum 0.9) over all of a
  model's trainable parameters, as an Optimizer calls it (its ``UpdateTables`` kept). Parameters
  and slots are float32 in both precisions (mixed precision keeps float32 masters); gradients
  are float32 (the layers cast them to the variable dtype) or, for the "bf16" row, bfloat16.
  Bytes: parameters, gradients and slots read, parameters and slots written;
* ``bias_backward``: the NHWC output gradient of every conv with a bias, and the dense
  layer's (batch, units); bytes: dy read, db written;
* ``maxpool_backward``: every max-pooling's NHWC input; bytes: x, y, dy read, dx written;
* ``maxpool_forward``: every max-pooling's NHWC input, dnnbind's kernel and (``cudnn`` rows,
  ``pooling.MAXPOOL_NHWC_KERNELS = False``) cuDNN's; bytes: x read, y written;
* ``activation forward`` / ``backward`` (relu, gelu): the model's largest activation input, the
  kernels and, for relu, (``cudnn`` rows, ``activation.CUDNN_ACTIVATIONS = True``) cuDNN's;
  bytes: x read and y written; dy and x read and dx written (cuDNN's backward also reads y: its
  rows count the kernels' bytes);
* ``cast``: each model's parameters float32 -> bfloat16 (the per-step weight casts) and the
  largest activation bfloat16 <-> float32; bytes: source read, result written.

GB/s is bytes read + written over the time. Method: a spin kernel holds the GPU while the host
queues ``--calls`` calls, so they run back to back without host gaps; the time per call is the
CUDA-event time over them divided by their number; the table shows the median of ``--trials``.

    python benchmarks/kernel_bandwidth.py
    python benchmarks/kernel_bandwidth.py --models airbench94 --json bandwidth.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

import ml_dtypes
import numpy as np

# train_step.py is a sibling script, not a package module: its model specs are the sizes here.
sys.path.insert(0, str(Path(__file__).resolve().parent))
import train_step  # noqa: E402

BF16 = np.dtype(ml_dtypes.bfloat16)
F32 = np.dtype(np.float32)

_SOURCE = r"""
extern "C" __global__ void copy16(const uint4* src, uint4* dst, long long n) {
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        dst[i] = src[i];
}
// Holds the GPU for `cycles` clock cycles (one thread), so the host can queue work behind it.
extern "C" __global__ void spin(long long cycles) {
    const long long start = clock64();
    while (clock64() - start < cycles) {
    }
}
"""


class Timer:
    """GPU time per call of back-to-back launches (the host hidden behind a spin kernel)."""

    def __init__(self, calls: int, trials: int) -> None:
        from dnnbind import cuda

        self.cuda, self.calls, self.trials = cuda, calls, trials
        self.stream = cuda.current_stream()
        self.spin = cuda.Kernel(_SOURCE, "spin")
        self.copy = cuda.Kernel(_SOURCE, "copy16")
        self.spin_cycles = 20_000_000  # ~10 ms at 2 GHz; doubled whenever the host fell behind
        self.sm_count = cuda.get_device().multiprocessor_count

    def per_call_ms(self, fn: Callable[[], Any]) -> float:
        cuda, s = self.cuda, self.stream
        for _ in range(3):  # warm-up: compiles kernels, fills caches and pointer tables
            fn()
        s.synchronize()
        times = []
        while len(times) < self.trials:
            self.spin((1, 1, 1), (1, 1, 1), (np.int64(self.spin_cycles),), stream=s)
            held = cuda.Event(timing=False)
            held.record(s)
            start, end = cuda.Event(), cuda.Event()
            start.record(s)
            for _ in range(self.calls):
                fn()
            end.record(s)
            if held.query():  # the spin ended before the host had queued every call: host gaps
                s.synchronize()
                self.spin_cycles *= 2
                continue
            end.synchronize()
            times.append(start.elapsed_time(end) / self.calls)
        return statistics.median(times)


def _device(shape: tuple, dtype: np.dtype, rng: np.random.Generator):
    from dnnbind import cuda

    return cuda.to_device(rng.uniform(-1, 1, size=shape).astype(np.float32).astype(dtype))


def baselines(timer: Timer, gib: float) -> list[dict]:
    from dnnbind import cuda

    nbytes = int(gib * (1 << 30)) // 16 * 16
    src = cuda.empty((nbytes,), np.uint8)
    dst = cuda.empty((nbytes,), np.uint8)
    src.fill_bytes(1)
    rows = []
    ms = timer.per_call_ms(lambda: dst.copy_from(src, stream=timer.stream))
    rows.append({"kernel": "memcpy (cudaMemcpyAsync D2D)", "model": "-", "dtype": "-", "size": f"{gib:g} GiB",
                 "bytes": 2 * nbytes, "ms": ms})
    n = nbytes // 16
    grid = (timer.sm_count * 8, 1, 1)
    ms = timer.per_call_ms(lambda: timer.copy(grid, (256, 1, 1), (src, dst, np.int64(n)), stream=timer.stream))
    rows.append({"kernel": "copy kernel (16-byte)", "model": "-", "dtype": "-", "size": f"{gib:g} GiB",
                 "bytes": 2 * nbytes, "ms": ms})
    return rows


@contextlib.contextmanager
def _switch(module: Any, name: str, value: bool):
    """A module-level path switch set for the timing, restored after."""
    old = getattr(module, name)
    setattr(module, name, value)
    try:
        yield
    finally:
        setattr(module, name, old)


def model_rows(name: str, timer: Timer, rng: np.random.Generator) -> list[dict]:
    from dnnbind import cuda, kernels
    from dnnbind.kernels._cuda import activation, pooling

    layers = train_step.layer_shapes(name)
    shapes = [p for rec in layers for p in rec["params"]]
    count = int(sum(np.prod(p) for p in shapes))
    rows = []

    def add(kernel: str, dtype: str, size: str, nbytes: int, fn: Callable[[], Any]) -> None:
        rows.append({"kernel": kernel, "model": name, "dtype": dtype, "size": size, "bytes": int(nbytes),
                     "ms": timer.per_call_ms(fn)})

    params = [_device(p, F32, rng) for p in shapes]
    m = [_device(p, F32, rng) for p in shapes]
    v = [cuda.zeros(p, F32) for p in shapes]  # second moments must be >= 0
    step = np.int64(1)
    for gdtype, label in ((F32, "fp32"), (BF16, "bf16 grads")):
        grads = [_device(p, gdtype, rng) for p in shapes]
        gbytes = count * gdtype.itemsize
        tables = kernels.UpdateTables()
        add("adam", label, f"{len(shapes)} tensors, {count} params", count * 4 * 6 + gbytes,
            lambda: kernels.adam_update(params, grads, m, v, lr=1e-9, step=step, tables=tables, stream=timer.stream))
        add("sgd momentum", label, f"{len(shapes)} tensors, {count} params", count * 4 * 4 + gbytes,
            lambda: kernels.sgd_update(params, grads, m, lr=1e-9, momentum=0.9, tables=tables, stream=timer.stream))
    for dtype, label in ((F32, "fp32"), (BF16, "bf16")):
        for rec in layers:
            if rec["kind"] in ("conv", "dense") and rec.get("bias"):
                dy = _device(rec["output"], dtype, rng)
                n_out = rec["output"][-1]
                add("bias_backward", label, "x".join(map(str, rec["output"])),
                    dy.nbytes + n_out * dtype.itemsize,
                    lambda dy=dy: kernels.bias_backward(dy, layout="NHWC", stream=timer.stream))
            if rec["kind"] == "maxpool":
                k = rec["window"]
                x = _device(rec["input"], dtype, rng)
                y = kernels.pool2d_forward(x, mode="max", window=k, layout="NHWC", stream=timer.stream)
                dy = _device(tuple(y.shape), dtype, rng)
                for cudnn in (False, True):
                    with _switch(pooling, "MAXPOOL_NHWC_KERNELS", not cudnn):
                        add(f"maxpool_forward {k}x{k}" + (" (cudnn)" if cudnn else ""), label,
                            "x".join(map(str, rec["input"])), x.nbytes + y.nbytes,
                            lambda x=x, y=y, k=k: kernels.pool2d_forward(x, mode="max", window=k, layout="NHWC", out=y,
                                                                     stream=timer.stream))
                add(f"maxpool_backward {k}x{k}", label, "x".join(map(str, rec["input"])),
                    2 * x.nbytes + 2 * y.nbytes,
                    lambda x=x, y=y, dy=dy, k=k: kernels.pool2d_backward(dy, x, y, mode="max", window=k, layout="NHWC",
                                                                     stream=timer.stream))
        # The largest activation input of the model (its first block's), each kind on it.
        acts = [rec["input"] for rec in layers if rec["kind"] in ("relu", "gelu")]
        if acts:
            shape = max(acts, key=lambda s: int(np.prod(s)))
            x = _device(shape, dtype, rng)
            dy = _device(shape, dtype, rng)
            y = kernels.empty_like(x)
            size = "x".join(map(str, shape))
            for kind in ("relu", "gelu"):
                for cudnn in (False, True) if kind == "relu" else (False,):
                    tag = f"activation {kind} " + "{}" + (" (cudnn)" if cudnn else "")
                    with _switch(activation, "CUDNN_ACTIVATIONS", cudnn):
                        add(tag.format("forward"), label, size, 2 * x.nbytes,
                            lambda x=x, y=y, kind=kind: kernels.activation_forward(x, kind, out=y, stream=timer.stream))
                        add(tag.format("backward"), label, size, 3 * x.nbytes,
                            lambda x=x, dy=dy, kind=kind: kernels.activation_backward(dy, x, x, kind,
                                                                                  stream=timer.stream))
    add("cast params fp32->bf16, one launch per tensor", "fp32->bf16", f"{len(shapes)} tensors, {count} params",
        count * 6, lambda: [kernels.cast(p, BF16, stream=timer.stream) for p in params])
    # what a mixed-precision train step runs: every weight copy in one launch (the table made once)
    cast_all = kernels.elementwise.CastMany(params, BF16)
    add("cast params fp32->bf16, cast_many (one launch)", "fp32->bf16", f"{len(shapes)} tensors, {count} params",
        count * 6, lambda: cast_all(stream=timer.stream))
    biggest = max((rec["output"] for rec in layers if len(rec["output"]) == 4), key=lambda s: int(np.prod(s)))
    act = _device(biggest, BF16, rng)
    act32 = kernels.cast(act, F32)
    add("cast activation", "bf16->fp32", "x".join(map(str, biggest)), act.size * 6,
        lambda: kernels.cast(act, F32, stream=timer.stream))
    add("cast activation", "fp32->bf16", "x".join(map(str, biggest)), act.size * 6,
        lambda: kernels.cast(act32, BF16, stream=timer.stream))
    return rows


def main(argv: "list[str] | None" = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=list(train_step.MODELS), choices=list(train_step.MODELS))
    parser.add_argument("--calls", type=int, default=20, help="calls queued back to back per trial")
    parser.add_argument("--trials", type=int, default=5, help="trials per kernel; the table shows the median")
    parser.add_argument("--copy-gib", type=float, default=1.0, help="size of the memcpy / copy-kernel baselines")
    parser.add_argument("--json", default=None, help="also write the results to this JSON file")
    args = parser.parse_args(argv)

    from dnnbind import cuda

    if not cuda.is_available():
        print(f"benchmarks/kernel_bandwidth.py needs a GPU: {cuda.unavailable_reason()}", file=sys.stderr)
        return 2
    import dnnbind

    dnnbind.set_default_device("cuda")
    timer = Timer(args.calls, args.trials)
    rng = np.random.default_rng(0)
    rows = baselines(timer, args.copy_gib)
    for name in args.models:
        rows += model_rows(name, timer, rng)
    memcpy_gbs = rows[0]["bytes"] / (rows[0]["ms"] * 1e-3) / 1e9
    for row in rows:
        row["gb_s"] = row["bytes"] / (row["ms"] * 1e-3) / 1e9
        row["share_of_memcpy"] = row["gb_s"] / memcpy_gbs
    device = cuda.get_device()
    print(f"{device.name}: memcpy {memcpy_gbs:.0f} GB/s (read + written); medians of {args.trials} trials "
          f"of {args.calls} back-to-back calls")
    print()
    print("| kernel | model | dtype | size | MB moved | us | GB/s | % of memcpy |")
    print("|---|---|---|---|---|---|---|---|")
    for row in rows:
        print(f"| {row['kernel']} | {row['model']} | {row['dtype']} | {row['size']} | {row['bytes'] / 1e6:.2f} | "
              f"{row['ms'] * 1e3:.1f} | {row['gb_s']:.0f} | {100 * row['share_of_memcpy']:.0f}% |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": device.name, "time": time.strftime("%Y-%m-%d %H:%M:%S"), "calls": args.calls,
                       "trials": args.trials, "memcpy_gb_s": memcpy_gbs, "rows": rows}, f, indent=2)
        print(f"results written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
