"""Fused attention kernels: dnnbind's cuDNN flash attention (``kernels.sdpa_forward``/``sdpa_backward``)
against PyTorch's ``F.scaled_dot_product_attention`` on its cuDNN and FlashAttention backends.

Each configuration (batch, heads, sequence, head dim, causal; bfloat16, q/k/v ``(B, S, H, D)`` for dnnbind
and ``(B, H, S, D)`` for torch, both contiguous) is timed after ``--warmup`` calls as the mean of ``--reps``
back-to-back calls between two CUDA events. TFLOP/s counts ``4 B H S² D`` forward (two products; half with
a causal mask) and 2.5 times that backward (five products), as FlashAttention's and cudnn-frontend's
benchmarks count. torch's backward is ``torch.autograd.grad`` of a retained forward (the backward kernel
alone, as dnnbind's).

    python benchmarks/sdpa.py --json sdpa.json
    python benchmarks/sdpa.py --configs 4,16,4096,128,0 --reps 10
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np

DEFAULT = ["4,16,1024,64,0", "4,16,1024,64,1", "4,16,4096,128,0", "4,16,4096,128,1", "2,16,8192,128,0",
           "2,16,8192,128,1", "8,16,2048,64,0"]


def _time(sync_record, fn, warmup: int, reps: int) -> float:
    for _ in range(warmup):
        fn()
    return sync_record(fn, reps)


def run_dnnbind(b, h, s, d, causal, warmup, reps) -> dict:
    import ml_dtypes

    from dnnbind import cuda, kernels

    rng = np.random.default_rng(0)
    bf16 = np.dtype(ml_dtypes.bfloat16)
    q, k, v, do = (cuda.to_device(rng.uniform(-1, 1, (b, s, h, d)).astype(bf16)) for _ in range(4))
    stream = cuda.current_stream()
    if not kernels.sdpa_supported(q, k, v, causal=causal):
        return {"error": "cuDNN refused the configuration"}
    o, st = kernels.sdpa_forward(q, k, v, causal=causal)

    def timed(fn, n):
        e0, e1 = cuda.Event(), cuda.Event()
        e0.record(stream)
        for _ in range(n):
            fn()
        e1.record(stream)
        e1.synchronize()
        return e0.elapsed_time(e1) / n

    fwd = _time(timed, lambda: kernels.sdpa_forward(q, k, v, causal=causal), warmup, reps)
    bwd = _time(timed, lambda: kernels.sdpa_backward(do, q, k, v, o, st, causal=causal), warmup, reps)
    return {"fwd_ms": fwd, "bwd_ms": bwd}


def run_torch(torch, backend, b, h, s, d, causal, warmup, reps) -> dict:
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    be = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}[backend]
    q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    do = torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16)

    def timed(fn, n):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        for _ in range(n):
            fn()
        e1.record()
        e1.synchronize()
        return e0.elapsed_time(e1) / n

    try:
        with sdpa_kernel([be]):
            o = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
            fwd = _time(timed, lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal), warmup, reps)
            bwd = _time(timed, lambda: torch.autograd.grad(o, (q, k, v), do, retain_graph=True), warmup, reps)
    except RuntimeError as err:
        return {"error": str(err).splitlines()[0][:160]}
    return {"fwd_ms": fwd, "bwd_ms": bwd}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--configs", nargs="+", default=DEFAULT, help="batch,heads,seq,head_dim,causal(0/1)")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--no-torch", action="store_true")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    from dnnbind import cuda

    if not cuda.is_available():
        print(f"benchmarks/sdpa.py needs a GPU: {cuda.unavailable_reason()}", file=sys.stderr)
        return 2
    torch = None
    if not args.no_torch:
        try:
            import torch  # noqa: F811 - optional
        except ImportError:
            torch = None
    rows = []
    print("| B,H,S,D | causal | dnnbind fwd / bwd TFLOP/s | torch cuDNN fwd / bwd | torch flash fwd / bwd |")
    print("|---|---|---|---|---|")
    for spec in args.configs:
        b, h, s, d, c = (int(x) for x in spec.split(","))
        causal = bool(c)
        flops = 4 * b * h * s * s * d * (0.5 if causal else 1.0)
        row = {"config": [b, h, s, d, causal], "dnnbind": run_dnnbind(b, h, s, d, causal, args.warmup, args.reps)}
        if torch is not None:
            for be in ("cudnn", "flash"):
                row[f"torch_{be}"] = run_torch(torch, be, b, h, s, d, causal, args.warmup, args.reps)
        cells = []
        for key in ("dnnbind", "torch_cudnn", "torch_flash"):
            r = row.get(key)
            if r is None or "error" in r:
                cells.append("-" if r is None else f"n/a ({r['error']})")
                continue
            r["fwd_tflops"] = flops / r["fwd_ms"] / 1e9
            r["bwd_tflops"] = 2.5 * flops / r["bwd_ms"] / 1e9
            cells.append(f"{r['fwd_tflops']:.0f} / {r['bwd_tflops']:.0f}")
        print(f"| {b},{h},{s},{d} | {'yes' if causal else 'no'} | " + " | ".join(cells) + " |", flush=True)
        rows.append(row)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
