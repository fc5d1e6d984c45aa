"""Achieved memory bandwidth of the numeric engine (``dnnbind.kernels.numeric`` on CUDA) against a
device-to-device memcpy on the same GPU.

Cases, in float32 and bfloat16 (``--gib`` GiB per full-size buffer, default 1):

* ``unary exp`` / ``unary negative``: contiguous, 16-byte vector path; bytes: x read, y written;
* ``unary exp, odd offset``: the same through a view one element past the allocation (scalar path);
* ``binary add``: contiguous a + b; bytes: a, b read, c written;
* ``binary add, row broadcast`` (M, N) + (N,) and ``column broadcast`` (M, N) + (M, 1): the strided kernel
  over merged axes; bytes: the big operand read, c written (the small one is counted once);
* ``reduce sum rows`` (M, N) over axis 1, ``reduce sum columns`` over axis 0, ``reduce sum all``; bytes: x
  read, the result written;
* ``strided_copy transpose`` of a square matrix (the shared-memory tiled kernel); bytes: read + written;
* ``cumsum rows``: (M, N) along axis 1; bytes: read + written.

Timing is ``kernel_bandwidth.py``'s: a spin kernel holds the GPU while ``--calls`` calls are queued, CUDA
events around them, the median of ``--trials``; every call writes into a preallocated ``out=``.

    python benchmarks/numeric_bandwidth.py
    python benchmarks/numeric_bandwidth.py --gib 0.5 --json numeric_bandwidth.json
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import ml_dtypes
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from kernel_bandwidth import Timer, baselines  # noqa: E402  (a sibling script: its timer and memcpy baseline)

BF16 = np.dtype(ml_dtypes.bfloat16)
F32 = np.dtype(np.float32)


def numeric_rows(timer: Timer, gib: float, dtype: np.dtype, rng: np.random.Generator) -> "list[dict]":
    from dnnbind import cuda
    from dnnbind.kernels import numeric as nm

    s = timer.stream
    label = "fp32" if dtype == F32 else "bf16"
    n = int(gib * (1 << 30)) // dtype.itemsize // 4096 * 4096
    cols = 4096
    rows_ = n // cols
    side = int(math.isqrt(n)) // 32 * 32
    out = []

    def add(kernel: str, size: str, nbytes: int, fn) -> None:
        out.append({"kernel": kernel, "dtype": label, "size": size, "bytes": int(nbytes), "ms": timer.per_call_ms(fn)})

    def upload(shape):
        return cuda.to_device(rng.uniform(-1, 1, size=shape).astype(np.float32).astype(dtype), stream=s)

    a, b = upload((n,)), upload((n,))
    c = cuda.empty((n,), dtype, stream=s)
    item = dtype.itemsize
    size = f"{n} elements"
    for op in ("exp", "negative"):
        add(f"unary {op}", size, 2 * n * item, lambda op=op: nm.unary(op, a, out=c, stream=s))
    odd = a[1:]
    c_odd = c[1:]
    add("unary exp, odd offset", f"{n - 1} elements", 2 * (n - 1) * item,
        lambda: nm.unary("exp", odd, out=c_odd, stream=s))
    add("binary add", size, 3 * n * item, lambda: nm.binary("add", a, b, out=c, stream=s))
    m2 = a.reshape(rows_, cols)
    c2 = c.reshape(rows_, cols)
    row = upload((cols,))
    col = upload((rows_, 1))
    add("binary add, row broadcast", f"({rows_}, {cols}) + ({cols},)", (2 * n + cols) * item,
        lambda: nm.binary("add", m2, row, out=c2, stream=s))
    add("binary add, column broadcast", f"({rows_}, {cols}) + ({rows_}, 1)", (2 * n + rows_) * item,
        lambda: nm.binary("add", m2, col, out=c2, stream=s))
    r_rows = cuda.empty((rows_,), dtype, stream=s)
    r_cols = cuda.empty((cols,), dtype, stream=s)
    r_all = cuda.empty((), dtype, stream=s)
    add("reduce sum rows", f"({rows_}, {cols}) axis 1", (n + rows_) * item,
        lambda: nm.reduce("sum", m2, (1,), out=r_rows, stream=s))
    add("reduce sum columns", f"({rows_}, {cols}) axis 0", (n + cols) * item,
        lambda: nm.reduce("sum", m2, (0,), out=r_cols, stream=s))
    add("reduce sum all", size, n * item, lambda: nm.reduce("sum", a, (0,), out=r_all, stream=s))
    sq = a[: side * side]
    t = c[: side * side].reshape(side, side)
    add("strided_copy transpose", f"({side}, {side})", 2 * side * side * item,
        lambda: nm.strided_copy(sq, (side, side), (1, side), out=t, stream=s))
    add("cumsum rows", f"({rows_}, {cols}) axis 1", 2 * n * item,
        lambda: nm.cumulative("cumsum", m2, 1, out=c2, stream=s))
    return out


def main(argv: "list[str] | None" = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gib", type=float, default=1.0, help="GiB per full-size buffer")
    parser.add_argument("--calls", type=int, default=10, help="calls queued back to back per trial")
    parser.add_argument("--trials", type=int, default=5, help="trials per case; the table shows the median")
    parser.add_argument("--json", default=None, help="also write the results to this JSON file")
    args = parser.parse_args(argv)

    from dnnbind import cuda

    if not cuda.is_available():
        print(f"benchmarks/numeric_bandwidth.py needs a GPU: {cuda.unavailable_reason()}", file=sys.stderr)
        return 2
    timer = Timer(args.calls, args.trials)
    rng = np.random.default_rng(0)
    base = baselines(timer, args.gib)
    memcpy_gbs = base[0]["bytes"] / (base[0]["ms"] * 1e-3) / 1e9
    rows = []
    for dtype in (F32, BF16):
        rows += numeric_rows(timer, args.gib, dtype, rng)
    device = cuda.get_device()
    print(f"{device.name}: memcpy {memcpy_gbs:.0f} GB/s (read + written); medians of {args.trials} trials of "
          f"{args.calls} back-to-back calls")
    print()
    print("| case | dtype | size | MB moved | us | GB/s | % of memcpy |")
    print("|---|---|---|---|---|---|---|")
    for row in base + rows:
        row["gb_s"] = row["bytes"] / (row["ms"] * 1e-3) / 1e9
        row["share_of_memcpy"] = row["gb_s"] / memcpy_gbs
        print(f"| {row['kernel']} | {row['dtype']} | {row['size']} | {row['bytes'] / 1e6:.1f} | "
              f"{row['ms'] * 1e3:.1f} | {row['gb_s']:.0f} | {100 * row['share_of_memcpy']:.0f}% |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": device.name, "time": time.strftime("%Y-%m-%d %H:%M:%S"), "gib": args.gib,
                       "memcpy_gb_s": memcpy_gbs, "rows": base + rows}, f, indent=2)
        print(f"results written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
