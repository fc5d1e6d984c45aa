"""Helpers of the GPU op tests: device copies, NaN-poisoned outputs, per-dtype tolerances, and
the worst-relative-error log.

When ``$DNNBIND_ERRLOG`` names a file, every comparison appends one JSON line
``{"op": ..., "dtype": ..., "rel_error": ..., "case": ...}`` to it; the H200 run collects the
worst error per (op, dtype) from there.
"""

from __future__ import annotations

import json
import os

import ml_dtypes
import numpy as np
import pytest

from testutil import TOLERANCE, rel_error

BF16 = np.dtype(ml_dtypes.bfloat16)

# (label, dtype, config overrides): fp32 strict, fp32 with TF32, fp16, bf16.
PRECISIONS = [
    pytest.param("float32", np.dtype(np.float32), {"allow_tf32": False}, id="fp32"),
    pytest.param("tf32", np.dtype(np.float32), {"allow_tf32": True}, id="tf32"),
    pytest.param("float16", np.dtype(np.float16), {}, id="fp16"),
    pytest.param("bfloat16", BF16, {}, id="bf16"),
]
# For ops without a TF32 path (elementwise, kernels): the three storage dtypes.
DTYPES = [
    pytest.param("float32", np.dtype(np.float32), id="fp32"),
    pytest.param("float16", np.dtype(np.float16), id="fp16"),
    pytest.param("bfloat16", BF16, id="bf16"),
]


def dev(x, dtype=None):
    """A DeviceArray copy of host ``x`` (cast to ``dtype`` first when given)."""
    from dnnbind.cuda import to_device

    a = np.asarray(x if dtype is None else np.asarray(x).astype(dtype))  # 0-d stays 0-d
    return to_device(a)


def dev_offset(x, items: int, dtype=None):
    """Like :func:`dev`, but the copy starts ``items`` elements past its (16-byte aligned)
    allocation: a view whose address breaks vector alignment for ``items`` not a multiple of
    16 bytes' worth, so kernels must take their scalar paths."""
    a = np.asarray(x if dtype is None else np.asarray(x).astype(dtype))
    flat = np.concatenate([np.zeros(items, a.dtype), a.reshape(-1)])
    return dev(flat)[items:].reshape(*a.shape)


def poisoned(shape, dtype):
    """An output buffer full of NaN (0xFF bytes), so unwritten elements cannot pass."""
    from dnnbind.cuda import empty

    return empty(tuple(shape), dtype).fill_bytes(0xFF)


def host(a) -> np.ndarray:
    return np.asarray(a.to_host()).astype(np.float64)


def quantize(x, dtype) -> np.ndarray:
    """``x`` rounded to ``dtype`` and back to float64: the exact inputs the GPU sees."""
    return np.asarray(x).astype(dtype).astype(np.float64)


def record(op: str, label: str, err: float, case: str = "") -> None:
    path = os.environ.get("DNNBIND_ERRLOG")
    if not path:
        return
    with open(path, "a") as f:
        f.write(json.dumps({"op": op, "dtype": label, "rel_error": err, "case": case}) + "\n")


def check(op: str, label: str, actual, expected, case: str = "", tol: "float | None" = None) -> float:
    """Assert rel_error(actual, expected) <= the tolerance of ``label``; log the error."""
    a = host(actual) if hasattr(actual, "to_host") else np.asarray(actual, dtype=np.float64)
    err = rel_error(a, np.asarray(expected, dtype=np.float64))
    record(op, label, err, case)
    limit = TOLERANCE[label] if tol is None else tol
    assert err <= limit, f"{op} [{label}] {case}: relative error {err:.3e} > {limit:.1e}"
    return err
