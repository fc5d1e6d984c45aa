"""Cases of the sorting family (``dnnbind/ops/_sorting.py``): sorts, top-k, searches, counting, unique."""

import numpy as np

from . import A, B, Case, I

X = A((3, 4, 5))
SORTED = np.linspace(-1.0, 1.0, 7).astype(np.float32)


def _argpartition_jax(x, kth, axis=-1):
    """JAX's order: the kth + 1 smallest in increasing order, then the others in index order."""
    xm = np.moveaxis(x, axis, -1)
    n = xm.shape[-1]
    k = kth % n
    order = np.argsort(xm, -1, kind="stable")
    rank = np.argsort(order, -1, kind="stable")
    rest = np.argsort(rank <= k, -1, kind="stable")
    out = np.concatenate([order[..., :k + 1], rest[..., :n - k - 1]], -1)
    return np.moveaxis(out, -1, axis).astype(np.int32)


def _top_k(x, k):
    idx = np.argsort(-x, -1, kind="stable")[..., :k]
    return [np.take_along_axis(x, idx, -1), idx.astype(np.int32)]


def _in_top_k(t, p, k):
    at = np.take_along_axis(p, t[:, None], -1)
    return 1 + np.sum(p > at, -1) <= k


def _histogram(x, bins=10, range=None):  # noqa: A002
    counts, edges = np.histogram(x, bins, range)
    dt = x.dtype if x.dtype.kind == "f" else np.float32
    return [counts.astype(dt), edges.astype(dt)]


def _unique(x, **kw):
    out = np.unique(x, **kw)
    return [o.astype(np.int32) if i else o for i, o in enumerate(out)] if isinstance(out, tuple) else out


CASES = [
    Case("sort", (X,), grad=(0,), ref=np.sort),
    Case("sort", (X,), {"axis": 0}, grad=(0,), name="axis0", ref=lambda x, axis: np.sort(x, axis=axis)),
    Case("sort", (X,), {"axis": None}, grad=(0,), name="flat", ref=lambda x, axis: np.sort(x, axis=axis)),
    Case("sort", (I((3, 6), -9, 9),), name="int", ref=np.sort),
    Case("sort", (B((7,)),), name="bool", ref=np.sort),
    Case("argsort", (X,), ref=lambda x: np.argsort(x, kind="stable").astype(np.int32)),
    Case("argsort", (X,), {"axis": 1}, name="axis", ref=lambda x, axis: np.argsort(x, axis, kind="stable")),
    Case("argsort", (I((4, 5), 0, 3),), {"axis": None}, name="flat_ties",
         ref=lambda x, axis: np.argsort(x, axis, kind="stable")),
    Case("argpartition", (A((3, 8)), 3), ref=_argpartition_jax),
    Case("argpartition", (A((6, 3)), -2, 0), ref=_argpartition_jax, name="axis0"),
    Case("argpartition", (I((10,), 0, 4), 0), ref=_argpartition_jax, name="ties"),
    Case("top_k", (A((3, 6)), 2), grad=(0,), ref=_top_k),
    Case("top_k", (X, 5), grad=(0,), ref=_top_k, name="all"),
    Case("top_k", (I((2, 7), 0, 4), 3), ref=_top_k, name="int_ties"),
    Case("in_top_k", (I((4,), 0, 6), A((4, 6)), 2), ref=_in_top_k),
    Case("in_top_k", (np.array([0, 1, 2], np.int32), np.array([[1, 2, 2], [3, 3, 3], [0, 5, 1]], np.float32), 1),
         ref=_in_top_k, name="ties"),
    Case("searchsorted", (SORTED, A((3, 4), -1.2, 1.2)), ref=np.searchsorted),
    Case("searchsorted", (SORTED, SORTED), {"side": "right"}, name="right_equal",
         ref=lambda s, v, side: np.searchsorted(s, v, side=side)),
    Case("searchsorted", (np.array([1, 3, 3, 5], np.int32), I((6,), 0, 7)), name="int", ref=np.searchsorted),
    Case("digitize", (A((3, 4), -1.2, 1.2), SORTED), ref=np.digitize),
    Case("digitize", (A((3, 4), -1.2, 1.2), SORTED[::-1].copy()), ref=np.digitize, name="decreasing"),
    Case("digitize", (I((8,), 0, 6), np.array([1, 2, 4], np.int32)), ref=np.digitize, name="int"),
    Case("isin", (I((3, 4), 0, 8), I((5,), 0, 8)), ref=np.isin),
    Case("isin", (I((3, 4), 0, 8), I((2, 2), 0, 8)), {"invert": True}, name="invert",
         ref=lambda a, b, invert: np.isin(a, b, invert=invert)),
    Case("isin", (A((6,)), A((3,))), name="float_absent", ref=np.isin),
    Case("histogram", (A((20,)),), grad=(0,), ref=_histogram),
    Case("histogram", (A((20,)), 4, (-0.5, 0.5)), ref=_histogram, name="range"),
    Case("histogram", (I((12,), 0, 6), 3), ref=_histogram, name="int"),
    Case("bincount", (I((8,), 0, 6),), ref=lambda x: np.bincount(x).astype(np.int32)),
    Case("bincount", (I((8,), 0, 6), A((8,))), grad=(1,), ref=np.bincount, name="weights"),
    Case("bincount", (I((8,), 0, 3),), {"minlength": 6}, name="minlength",
         ref=lambda x, minlength: np.bincount(x, minlength=minlength)),
    Case("bincount", (np.array([[0, 1, 2], [2, 2, 0]], np.int32),), name="2d",
         ref=lambda x: [np.bincount(r) for r in x]),
    # rows whose maxima differ share one length (Keras fails: its rows would have different lengths)
    Case("bincount", (np.array([[0, 1, 1], [2, 2, 0]], np.int32),), name="2d_ragged", keras=False,
         ref=lambda x: [np.bincount(r, minlength=3) for r in x]),
    Case("unique", (I((10,), 0, 5),), ref=np.unique),
    Case("unique", (I((3, 4), 0, 5),), {"return_index": True, "return_inverse": True, "return_counts": True},
         name="all", ref=lambda x, **kw: _unique(x, **kw)),
    Case("unique", (np.array([[3, 1], [1, 2], [3, 1]], np.int32),), {"axis": 0, "return_inverse": True,
                                                                     "return_counts": True},
         name="axis", ref=lambda x, **kw: _unique(x, **kw)),
    Case("unique", (np.array([3, 1, 1, 2], np.int32),), {"size": 5, "return_index": True, "return_counts": True},
         name="size", ref=lambda x, **kw: [np.array([1, 2, 3, 1, 1]), np.array([1, 3, 0, 1, 1]),
                                           np.array([2, 1, 1, 0, 0])]),
    Case("unique", (np.array([3.0, 1.0, 1.0], np.float32),), {"size": 4, "fill_value": -1.0}, name="fill",
         ref=lambda x, **kw: np.array([1.0, 3.0, -1.0, -1.0], np.float32)),
]
