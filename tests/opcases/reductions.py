"""Cases of the reductions family (``dnnbind/ops/_reductions.py``)."""

import numpy as np

from . import A, B, Case, I

X = A((3, 4, 5))

CASES = [
    Case("sum", (X,), grad=(0,), ref=np.sum),
    Case("sum", (X,), {"axis": (0, 2), "keepdims": True}, grad=(0,), ref=lambda x, axis, keepdims: np.sum(
        x, axis=axis, keepdims=keepdims), name="axes"),
    Case("sum", (I((3, 4)),), {"axis": 1}, name="int", ref=lambda x, axis: np.sum(x, axis=axis)),
    Case("mean", (X,), {"axis": 1}, grad=(0,), ref=lambda x, axis: np.mean(x, axis=axis)),
    Case("mean", (I((3, 4)),), name="int", ref=lambda x: np.mean(x).astype(np.float32)),
    Case("max", (X,), {"axis": -1}, grad=(0,), ref=lambda x, axis: np.max(x, axis=axis)),
    Case("min", (X,), {"axis": (0, 1)}, grad=(0,), ref=lambda x, axis: np.min(x, axis=axis)),
    Case("amax", (X,), {"axis": 0}, grad=(0,), ref=lambda x, axis: np.max(x, axis=axis)),
    Case("amin", (X,), {"axis": 0}, grad=(0,), ref=lambda x, axis: np.min(x, axis=axis)),
    Case("prod", (A((3, 4), 0.5, 1.5),), {"axis": 1}, grad=(0,), ref=lambda x, axis: np.prod(x, axis=axis)),
    Case("any", (B((3, 4)),), {"axis": 0}, ref=lambda x, axis: np.any(x, axis=axis)),
    Case("all", (B((3, 4)),), {"axis": 1}, ref=lambda x, axis: np.all(x, axis=axis)),
    Case("argmax", (X,), {"axis": 1}, ref=lambda x, axis: np.argmax(x, axis=axis).astype(np.int32)),
    Case("argmin", (X,), ref=lambda x: np.argmin(x).astype(np.int32)),
    Case("var", (X,), {"axis": 2}, grad=(0,), ref=lambda x, axis: np.var(x, axis=axis)),
    Case("std", (X,), {"axis": 2}, grad=(0,), ref=lambda x, axis: np.std(x, axis=axis)),
    Case("logsumexp", (X,), {"axis": 1}, grad=(0,), ref=lambda x, axis: np.log(np.sum(np.exp(x), axis=axis))),
    Case("cumsum", (X,), {"axis": 1}, grad=(0,), ref=lambda x, axis: np.cumsum(x, axis=axis)),
    Case("cumprod", (A((3, 5), 0.5, 1.5),), {"axis": 1}, grad=(0,), ref=lambda x, axis: np.cumprod(x, axis=axis)),
    Case("count_nonzero", (I((3, 4), 0, 3),), {"axis": 1}, ref=lambda x, axis: np.count_nonzero(x, axis=axis)),
]
