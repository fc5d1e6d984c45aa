#!/usr/bin/env python3
"""Evidence for compute-sanitizer initcheck's reports on memory written by cuDNN/cuBLAS kernels.

initcheck reports "Uninitialized __global__ memory read" in kernels that read the output of a
cuDNN convolution or a cuBLAS GEMM (dnnbind's casts, cuDNN's pooling, batch norm and
op-tensor kernels). For each producer below this script shows two things:

1. under initcheck (a child process per producer), the number of reports raised when one of
   dnnbind's own elementwise kernels (``kernels.scale``) reads the producer's output;
2. without the sanitizer, that the producer writes every element: its output buffer is filled
   with NaN bytes first, and afterwards holds no NaN and matches the NumPy reference.

Producers that write through the Hopper tensor-memory accelerator (bulk asynchronous stores from
the tensor-core kernels cuDNN and cuBLAS pick for float32/TF32, float16 and bfloat16) are flagged
although they wrote every element: initcheck does not see those stores. The float64 convolution
(no tensor cores) and dnnbind's own kernel are the controls: their outputs are not flagged.

    python tools/initcheck_evidence.py            # table (needs a GPU and compute-sanitizer)
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sanitize import find_compute_sanitizer  # noqa: E402

PRODUCERS = ("conv_fwd_f32", "conv_fwd_bf16", "conv_wgrad_bf16", "conv_fwd_f64", "dense_f32", "dense_bf16",
             "own_kernel_f32")


def _inputs(producer: str):
    import ml_dtypes

    from dnnbind import cuda

    rng = np.random.default_rng(0)
    dtype = {"f32": np.float32, "f64": np.float64, "bf16": ml_dtypes.bfloat16}[producer.rsplit("_", 1)[1]]
    if producer.startswith("conv"):
        x = rng.standard_normal((32, 16, 16, 32)).astype(dtype)
        w = (rng.standard_normal((64, 3, 3, 32)) * 0.1).astype(dtype)
    elif producer.startswith("dense"):
        x = rng.standard_normal((256, 512)).astype(dtype)
        w = (rng.standard_normal((512, 384)) * 0.05).astype(dtype)
    else:
        x = rng.standard_normal((4096,)).astype(dtype)
        w = None
    return x, w, cuda.to_device(x), None if w is None else cuda.to_device(w)


def _produce(producer: str, xd, wd, poison: bool):
    from dnnbind import cuda, kernels

    if producer.startswith("conv_fwd"):
        shape = (xd.shape[0], 16, 16, 64)
    elif producer == "conv_wgrad_bf16":
        shape = (64, 3, 3, 32)
    elif producer.startswith("dense"):
        shape = (xd.shape[0], wd.shape[1])
    else:
        shape = xd.shape
    out = cuda.empty(shape, xd.dtype)
    if poison:
        out.fill_bytes(0xFF)  # NaN in every float format
    if producer.startswith("conv_fwd"):
        kernels.conv2d_forward(xd, wd, padding=1, layout="NHWC", out=out)
    elif producer == "conv_wgrad_bf16":
        dy = kernels.conv2d_forward(xd, wd, padding=1, layout="NHWC")
        res = kernels.conv2d_backward_filter(xd, dy, tuple(wd.shape), padding=1, layout="NHWC")
        kernels.copy(res, out=out)  # a device-to-device memcpy: initcheck propagates its state
    elif producer.startswith("dense"):
        kernels.dense_forward(xd, wd, out=out)
    else:
        kernels.scale(xd, 2.0, out=out)
    return out


def child(producer: str) -> None:
    from dnnbind import cuda, kernels

    x, w, xd, wd = _inputs(producer)
    out = _produce(producer, xd, wd, poison=False)
    kernels.scale(out, 1.0)  # dnnbind's own kernel reads every element the producer wrote
    cuda.current_stream().synchronize()


def check_written(producer: str) -> "tuple[int, float]":
    """(NaN elements left in the poisoned output, relative error against NumPy)."""
    from dnnbind import kernels

    x, w, xd, wd = _inputs(producer)
    out = _produce(producer, xd, wd, poison=True).numpy().astype(np.float64)
    x64 = x.astype(np.float64)
    w64 = None if w is None else w.astype(np.float64)
    if producer.startswith("conv_fwd"):
        ref = kernels.conv2d_forward(x64, w64, padding=1, layout="NHWC")
    elif producer == "conv_wgrad_bf16":
        dy = kernels.conv2d_forward(x64, w64, padding=1, layout="NHWC")
        ref = kernels.conv2d_backward_filter(x64, dy, w64.shape, padding=1, layout="NHWC")
    elif producer.startswith("dense"):
        ref = x64 @ w64
    else:
        ref = 2.0 * x64
    nans = int(np.isnan(out).sum())
    err = float(np.linalg.norm(np.nan_to_num(out) - ref) / np.linalg.norm(ref))
    return nans, err


def main() -> int:
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        child(sys.argv[2])
        return 0
    sanitizer = find_compute_sanitizer()
    if sanitizer is None:
        print("compute-sanitizer not found", file=sys.stderr)
        return 2
    rows = ["| producer | initcheck reports when dnnbind's kernel reads its output | NaN left in the "
            "NaN-filled output | rel. error vs NumPy |", "|---|---|---|---|"]
    for producer in PRODUCERS:
        proc = subprocess.run([sanitizer, "--tool", "initcheck", "--report-api-errors", "no", "--print-limit", "1",
                               sys.executable, __file__, "--child", producer],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
        found = re.findall(r"ERROR SUMMARY: (\d+) error", proc.stdout)
        reports = found[-1] if found else "no summary: " + proc.stdout[-300:].replace("\n", " ")
        nans, err = check_written(producer)
        rows.append(f"| {producer} | {reports} | {nans} | {err:.1e} |")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
