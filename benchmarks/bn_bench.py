"""Batch-norm micro-benchmark: dnnbind's legacy cuDNN path vs the channels-last fast path vs torch.

For each shape and dtype it times, with CUDA events (``dnnbind.cuda.Event`` /
``torch.cuda.Event``), in ms per iteration:

* training: ``batchnorm_forward_training`` + ``batchnorm_backward`` (one iteration = both);
* inference: ``batchnorm_forward_inference``.

dnnbind paths are picked by flipping the switches of ``dnnbind.kernels._cuda.batchnorm``:

* 4-d NHWC: ``legacy`` (CUDNN_BATCHNORM_SPATIAL, legacy API) vs ``persistent`` (*Ex API,
  CUDNN_BATCHNORM_SPATIAL_PERSISTENT); inference ``cudnn`` vs ``kernel`` (NVRTC);
* 2-d (N, C): ``spatial`` / ``per_activation`` (legacy API on (N, C, 1, 1) NCHW) vs
  ``persistent`` (Ex API, (N, C, 1, 1) as NHWC) — the fastest should be ``BN2D_PATH``'s default.

Each dnnbind row is measured eagerly (host overhead included, as a training step sees it)
and replayed from a CUDA graph of ``--iters`` iterations (GPU time only; "n/a" if capture
failed). torch runs ``F.batch_norm`` on channels_last tensors (fp32 parameters) and
``torch.autograd.grad``, eagerly. The footer prints cuDNN's Ex workspace/reserve sizes and
the (device, shape, dtype) cuDNN refused on the persistent path (those ran the fallback: bf16
through float32 copies, fp32/fp16 on the legacy path).

    python benchmarks/bn_bench.py
    python benchmarks/bn_bench.py --dtypes float32 --iters 50 --json bn.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from typing import Any, Callable, Iterator

import numpy as np

SHAPES_4D = [(256, 32, 32, 64), (256, 16, 16, 128), (1024, 16, 16, 256)]
SHAPES_2D = [(256, 512), (1024, 4096)]
TRAIN_PATHS_4D = {
    "legacy": {"USE_PERSISTENT_NHWC": False},
    "persistent": {"USE_PERSISTENT_NHWC": True},
}
TRAIN_PATHS_2D = {
    "spatial": {"USE_PERSISTENT_NHWC": False, "BN2D_PATH": "spatial"},
    "per_activation": {"USE_PERSISTENT_NHWC": False, "BN2D_PATH": "per_activation"},
    "persistent": {"USE_PERSISTENT_NHWC": True, "BN2D_PATH": "persistent"},
}
INFER_PATHS = {"cudnn": {"INFERENCE_KERNEL": False}, "kernel": {"INFERENCE_KERNEL": True}}


@contextlib.contextmanager
def switches(**values: Any) -> Iterator[None]:
    from dnnbind.kernels._cuda import batchnorm as bn

    old = {k: getattr(bn, k) for k in values}
    try:
        for k, v in values.items():
            setattr(bn, k, v)
        yield
    finally:
        for k, v in old.items():
            setattr(bn, k, v)


def time_dnnbind(fn: Callable[[], None], stream: Any, warmup: int, iters: int) -> "tuple[float, float | None, str]":
    """(eager ms/iter, graph-replay ms/iter or None, capture error)."""
    from dnnbind import cuda

    for _ in range(warmup):  # handles, descriptors, workspace growth, kernels: before timing/capture
        fn()
    stream.synchronize()
    start, end = cuda.Event(), cuda.Event()
    start.record(stream)
    for _ in range(iters):
        fn()
    end.record(stream)
    end.synchronize()
    eager = start.elapsed_time(end) / iters
    try:
        with cuda.capture(stream) as graph:
            for _ in range(iters):
                fn()
        graph.launch(stream)  # first replay uploads the graph
        stream.synchronize()
        start.record(stream)
        graph.launch(stream)
        end.record(stream)
        end.synchronize()
        replay = start.elapsed_time(end) / iters
        graph.close()
        return eager, replay, ""
    except Exception as exc:  # noqa: BLE001 - reported in the table, the eager number stands
        stream.synchronize()
        return eager, None, f"{type(exc).__name__}: {exc}"[:200]


def time_torch(fn: Callable[[], None], torch, warmup: int, iters: int) -> float:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / iters


def dnnbind_rows(shape: tuple, dtype_name: str, warmup: int, iters: int) -> list[dict]:
    import ml_dtypes

    from dnnbind import cuda, kernels

    dtype = np.dtype(ml_dtypes.bfloat16) if dtype_name == "bfloat16" else np.dtype(dtype_name)
    rng = np.random.default_rng(0)
    c = shape[-1]
    stream = cuda.current_stream()
    x = cuda.to_device(rng.uniform(-1, 2, size=shape).astype(dtype), stream=stream)
    dy = cuda.to_device(rng.uniform(-1, 1, size=shape).astype(dtype), stream=stream)
    gamma = cuda.to_device(rng.uniform(0.5, 1.5, size=c).astype(np.float32), stream=stream)
    beta = cuda.to_device(rng.uniform(-1, 1, size=c).astype(np.float32), stream=stream)
    rm = cuda.to_device(np.zeros(c, np.float32), stream=stream)
    rv = cuda.to_device(np.ones(c, np.float32), stream=stream)
    layout = "NHWC" if len(shape) == 4 else "NCHW"

    def train() -> None:
        _, saved = kernels.batchnorm_forward_training(x, gamma, beta, rm, rv, momentum=0.99, epsilon=1e-3,
                                                  layout=layout, stream=stream)
        kernels.batchnorm_backward(dy, x, gamma, saved, epsilon=1e-3, layout=layout, stream=stream)

    def infer() -> None:
        kernels.batchnorm_forward_inference(x, gamma, beta, rm, rv, epsilon=1e-3, layout=layout, stream=stream)

    rows = []
    paths = TRAIN_PATHS_4D if len(shape) == 4 else TRAIN_PATHS_2D
    for what, fn, table in (("train", train, paths), ("infer", infer, INFER_PATHS)):
        for path, values in table.items():
            with switches(**values):
                eager, replay, err = time_dnnbind(fn, stream, warmup, iters)
            rows.append({"shape": shape, "dtype": dtype_name, "what": what, "impl": f"dnnbind:{path}",
                         "eager_ms": eager, "graph_ms": replay, "error": err})
    return rows


def torch_rows(shape: tuple, dtype_name: str, warmup: int, iters: int) -> list[dict]:
    try:
        import torch
    except ImportError:
        return []
    if not torch.cuda.is_available():
        return []
    tdtype = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}[dtype_name]
    F = torch.nn.functional
    if len(shape) == 4:
        n, h, w, c = shape
        make = lambda: torch.randn(n, c, h, w, device="cuda", dtype=tdtype).to(  # noqa: E731
            memory_format=torch.channels_last)
    else:
        c = shape[1]
        make = lambda: torch.randn(*shape, device="cuda", dtype=tdtype)  # noqa: E731
    x, dy = make().requires_grad_(True), make()
    weight = torch.rand(c, device="cuda").add_(0.5).requires_grad_(True)
    bias = torch.randn(c, device="cuda").requires_grad_(True)
    rm, rv = torch.zeros(c, device="cuda"), torch.ones(c, device="cuda")

    def train() -> None:
        y = F.batch_norm(x, rm, rv, weight, bias, training=True, momentum=0.01, eps=1e-3)
        torch.autograd.grad(y, (x, weight, bias), dy)

    def infer() -> None:
        with torch.no_grad():
            F.batch_norm(x, rm, rv, weight, bias, training=False, eps=1e-3)

    return [{"shape": shape, "dtype": dtype_name, "what": what, "impl": "torch:channels_last",
             "eager_ms": time_torch(fn, torch, warmup, iters), "graph_ms": None, "error": ""}
            for what, fn in (("train", train), ("infer", infer))]


def _fmt(v: "float | None") -> str:
    return "n/a" if v is None else f"{v:8.4f}"


def main(argv: "list[str] | None" = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"],
                        choices=["float32", "float16", "bfloat16"])
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--no-2d", action="store_true", help="skip the 2-d (N, C) shapes")
    parser.add_argument("--no-torch", action="store_true")
    parser.add_argument("--json", help="write all rows to this file")
    args = parser.parse_args(argv)

    from dnnbind import cuda
    from dnnbind._lib import cudnn as C
    from dnnbind.kernels._cuda import batchnorm as bn

    if not cuda.is_available():
        print(f"bn_bench: no GPU ({cuda.unavailable_reason()})", file=sys.stderr)
        return 1
    print(f"device: {cuda.get_device().name}, cuDNN {C.version()}")
    shapes = SHAPES_4D + ([] if args.no_2d else SHAPES_2D)
    rows: list[dict] = []
    print(f"{'shape':>22} {'dtype':>9} {'what':>5} {'impl':>26} {'eager ms':>9} {'graph ms':>9}")
    for shape in shapes:
        for dtype_name in args.dtypes:
            new = dnnbind_rows(shape, dtype_name, args.warmup, args.iters)
            if not args.no_torch:
                new += torch_rows(shape, dtype_name, args.warmup, args.iters)
            for r in new:
                print(f"{str(r['shape']):>22} {r['dtype']:>9} {r['what']:>5} {r['impl']:>26} "
                      f"{_fmt(r['eager_ms'])} {_fmt(r['graph_ms'])}" + (f"  [{r['error']}]" if r["error"] else ""))
            rows += new
            cuda.empty_cache()
    print("\nEx sizes (device, x desc, param desc) -> (workspace, reserve) bytes:")
    for key, sizes in bn._fwd_sizes.items():
        print(f"  {key} -> {sizes}")
    print(f"refused by cuDNN on the persistent path (fell back): {sorted(bn._ex_refused) or 'none'}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "ex_sizes": {str(k): v for k, v in bn._fwd_sizes.items()},
                       "ex_refused": [list(k) for k in bn._ex_refused]}, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
