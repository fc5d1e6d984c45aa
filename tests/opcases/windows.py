"""Cases of the windows family (``dnnbind/ops/_windows.py``): linspace, logspace, geomspace, vander, and the
window functions."""

import numpy as np

from . import A, Case, I

CASES = [
    Case("linspace", (0.0, 1.0, 7), ref=lambda a, b, n: np.linspace(a, b, n, dtype=np.float32)),
    Case("linspace", (A((3,)), A((3,), 2, 3), 5), grad=(0, 1), name="tensors", ref=np.linspace),
    Case("linspace", (A((2, 1)), A((3,), 2, 3), 4), {"axis": -1, "endpoint": False}, grad=(0, 1), name="axis",
         ref=lambda a, b, n, axis, endpoint: np.linspace(a, b, n, axis=axis, endpoint=endpoint)),
    Case("linspace", (A((3,)), A((3,), 2, 3), 4), {"retstep": True}, grad=(0, 1), name="retstep",
         ref=lambda a, b, n, retstep: list(np.linspace(a, b, n, retstep=True))),
    Case("linspace", (0, 10, 4), {"dtype": "int32"}, name="int",
         ref=lambda a, b, n, dtype: np.floor(np.linspace(a, b, n)).astype(dtype)),
    Case("linspace", (2.0, 3.0, 1), name="one", ref=lambda a, b, n: np.linspace(a, b, n, dtype=np.float32)),
    Case("linspace", (2.0, 3.0, 0), name="none", ref=lambda a, b, n: np.linspace(a, b, n, dtype=np.float32)),
    Case("logspace", (0.0, 2.0, 5), ref=lambda a, b, n: np.logspace(a, b, n, dtype=np.float32)),
    Case("logspace", (A((3,)), A((3,), 1, 2), 4), {"base": 2.0}, grad=(0, 1), name="base",
         ref=lambda a, b, n, base: np.logspace(a, b, n, base=base)),
    Case("geomspace", (1.0, 1000.0, 4), ref=lambda a, b, n: np.geomspace(a, b, n, dtype=np.float32)),
    Case("geomspace", (A((3,), 0.5, 2), A((3,), 3, 5), 5), {"axis": 1}, grad=(0, 1), name="tensors",
         ref=lambda a, b, n, axis: np.geomspace(a, b, n, axis=axis)),
    Case("geomspace", (-2.0, -32.0, 5), {"endpoint": False}, name="negative",
         ref=lambda a, b, n, endpoint: np.geomspace(a, b, n, endpoint=endpoint, dtype=np.float32)),
    Case("vander", (A((4,)),), grad=(0,), ref=np.vander),
    Case("vander", (A((3,)), 5, True), grad=(0,), ref=np.vander, name="increasing"),
    Case("vander", (I((3,), -3, 3),), ref=np.vander, name="int"),
    Case("bartlett", (7,), ref=lambda m: np.bartlett(m).astype(np.float32)),
    Case("bartlett", (1,), ref=lambda m: np.bartlett(m).astype(np.float32), name="one"),
    Case("blackman", (8,), ref=lambda m: np.blackman(m).astype(np.float32)),
    Case("hamming", (6,), ref=lambda m: np.hamming(m).astype(np.float32)),
    Case("hamming", (np.array(5, np.int32),), ref=lambda m: np.hamming(int(m)).astype(np.float32), name="tensor"),
    Case("hanning", (9,), ref=lambda m: np.hanning(m).astype(np.float32)),
    Case("hanning", (0,), ref=lambda m: np.hanning(m).astype(np.float32), name="empty"),
    Case("kaiser", (7, 14.0), ref=lambda m, b: np.kaiser(m, b).astype(np.float32)),
    Case("kaiser", (4, 0.5), ref=lambda m, b: np.kaiser(m, b).astype(np.float32), name="small_beta"),
]
