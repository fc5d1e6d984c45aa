"""Cases of the joins family (``dnnbind/ops/_joins.py``): joins, splits, flips and rotations, roll, repeat,
tile, meshgrid, rearrange, diagonals, select, view, saturate_cast, unravel_index, vectorize."""

import numpy as np

from . import A, B, Case, I

X = A((3, 4, 5))
M = A((4, 5))


def _rearrange_ref(pattern):
    return {
        "b h w c -> b c h w": lambda x: np.transpose(x, (0, 3, 1, 2)),
        "b h w c -> (b h) w c": lambda x: x.reshape(-1, *x.shape[2:]),
        "b (h1 h) (w1 w) c -> (b h1 w1) h w c": lambda x: x.reshape(x.shape[0], 2, x.shape[1] // 2, 2,
                                                                     x.shape[2] // 2, x.shape[3]).transpose(
            0, 1, 3, 2, 4, 5).reshape(-1, x.shape[1] // 2, x.shape[2] // 2, x.shape[3]),
    }[pattern]


CASES = [
    Case("append", (X, A((3, 4, 2))), {"axis": 2}, grad=(0, 1), ref=lambda a, b, axis: np.append(a, b, axis=axis)),
    Case("append", (M, A((3,))), grad=(0, 1), ref=np.append, name="flat"),
    Case("append", (I((2, 3)), A((1, 3))), {"axis": 0}, grad=(1,), name="promote",
         ref=lambda a, b, axis: np.append(a, b, axis=axis)),
    Case("hstack", ([M, A((4, 2))],), grad=(0,), ref=np.hstack),
    Case("hstack", ([A((3,)), A((2,))],), grad=(0,), ref=np.hstack, name="1d"),
    Case("vstack", ([M, A((2, 5))],), grad=(0,), ref=np.vstack),
    Case("vstack", ([A((3,)), A((3,))],), grad=(0,), ref=np.vstack, name="1d"),
    Case("dstack", ([M, A((4, 5, 2))],), grad=(0,), ref=np.dstack),
    Case("dstack", ([A((3,)), A((3,))],), grad=(0,), ref=np.dstack, name="1d"),
    Case("dstack", ([I((2, 2)), A((2, 2))],), ref=np.dstack, name="promote"),
    Case("array_split", (A((7, 3)), 3), grad=(0,), ref=np.array_split),
    Case("array_split", (X, 2), {"axis": -1}, grad=(0,), name="axis",
         ref=lambda x, k, axis: np.array_split(x, k, axis=axis)),
    Case("hsplit", (X, 2), grad=(0,), ref=np.hsplit),
    Case("hsplit", (A((6,)), [1, 4]), grad=(0,), ref=np.hsplit, name="1d_indices"),
    # NumPy's cut indices, unsorted or negative; Keras's JAX backend refuses both (it does not normalise them)
    Case("hsplit", (X, [3, 1]), grad=(0,), ref=np.hsplit, name="unsorted", keras=False),
    Case("vsplit", (A((6, 3)), 3), grad=(0,), ref=np.vsplit),
    Case("vsplit", (A((6, 3)), [2, -1]), grad=(0,), ref=np.vsplit, name="negative", keras=False),
    Case("dsplit", (X, [2]), grad=(0,), ref=np.dsplit),
    Case("unstack", (X,), grad=(0,), ref=lambda x: list(x)),
    Case("unstack", (X,), {"axis": -1}, grad=(0,), name="last", ref=lambda x, axis: list(np.moveaxis(x, axis, 0))),
    Case("unstack", (A((3,)),), {"num": 3}, grad=(0,), name="num", ref=lambda x, num: list(x)),
    Case("fliplr", (X,), grad=(0,), ref=np.fliplr),
    Case("flipud", (A((4,)),), grad=(0,), ref=np.flipud),
    Case("rot90", (M,), grad=(0,), ref=np.rot90),
    Case("rot90", (X, 2), grad=(0,), ref=np.rot90, name="k2"),
    Case("rot90", (X, -1, (2, 0)), grad=(0,), ref=np.rot90, name="k3_axes"),
    Case("rot90", (I((3, 4)), 4), ref=np.rot90, name="k4"),
    Case("roll", (X, 2), grad=(0,), ref=np.roll),
    Case("roll", (X, (1, -2)), {"axis": (0, 2)}, grad=(0,), name="axes",
         ref=lambda x, s, axis: np.roll(x, s, axis=axis)),
    Case("roll", (I((3, 4)), -5), {"axis": 1}, name="int", ref=lambda x, s, axis: np.roll(x, s, axis=axis)),
    Case("repeat", (X, 2), {"axis": 1}, grad=(0,), ref=lambda x, r, axis: np.repeat(x, r, axis=axis)),
    Case("repeat", (M, 3), grad=(0,), ref=np.repeat, name="flat"),
    Case("repeat", (M, np.array([1, 0, 2, 1], np.int32)), {"axis": 0}, grad=(0,), name="per_element",
         ref=lambda x, r, axis: np.repeat(x, r, axis=axis)),
    Case("repeat", (I((2, 3)), 0), {"axis": 1}, name="zero", ref=lambda x, r, axis: np.repeat(x, r, axis=axis)),
    Case("tile", (M, (2, 1, 3)), grad=(0,), ref=np.tile),
    Case("tile", (X, 2), grad=(0,), ref=np.tile, name="int"),
    Case("tile", (B((2, 3)), (2, 2)), ref=np.tile, name="bool"),
    Case("meshgrid", (A((3,)), A((4,)), A((2,))), grad=(0, 1, 2), ref=np.meshgrid),
    Case("meshgrid", (A((3,)), A((4,))), {"indexing": "ij"}, grad=(0, 1), name="ij",
         ref=lambda a, b, indexing: np.meshgrid(a, b, indexing=indexing)),
    Case("meshgrid", (I((3,)), A((2,))), grad=(1,), ref=np.meshgrid, name="dtypes"),
    Case("rearrange", (A((2, 3, 4, 5)), "b h w c -> b c h w"), grad=(0,),
         ref=lambda x, p: _rearrange_ref(p)(x)),
    Case("rearrange", (A((2, 3, 4, 5)), "b h w c -> (b h) w c"), grad=(0,), name="merge",
         ref=lambda x, p: _rearrange_ref(p)(x)),
    Case("rearrange", (A((2, 4, 6, 3)), "b (h1 h) (w1 w) c -> (b h1 w1) h w c"), {"h1": 2, "w1": 2}, grad=(0,),
         name="split", ref=lambda x, p, h1, w1: _rearrange_ref(p)(x)),
    Case("diag", (M,), grad=(0,), ref=np.diag),
    Case("diag", (M, -2), grad=(0,), ref=np.diag, name="below"),
    Case("diag", (A((3,)), 1), grad=(0,), ref=np.diag, name="build"),
    Case("diag", (I((3,)), -2), ref=np.diag, name="build_int"),
    Case("diagflat", (A((2, 2)), 1), grad=(0,), ref=np.diagflat),
    Case("diagflat", (A((3,)),), grad=(0,), ref=np.diagflat, name="1d"),
    Case("diagonal", (X,), grad=(0,), ref=np.diagonal),
    Case("diagonal", (X, 1, 2, 0), grad=(0,), ref=np.diagonal, name="axes"),
    Case("diagonal", (X, -2, -1, 1), grad=(0,), ref=np.diagonal, name="negative"),
    Case("diagonal", (M, 7), grad=(0,), ref=np.diagonal, name="empty"),
    Case("trace", (X,), grad=(0,), ref=np.trace),
    Case("trace", (X, 1, 1, 2), grad=(0,), ref=np.trace, name="axes"),
    Case("trace", (I((3, 3), -3, 3, "int8"),), name="int8", ref=lambda x: np.trace(x).astype(np.int32)),
    Case("trace", (B((3, 3)),), name="bool", ref=lambda x: np.trace(x).astype(np.int32)),
    Case("select", ([B((3, 4)), B((3, 4))], [A((3, 4)), A((3, 4))]), grad=(1,), ref=np.select),
    Case("select", ([B((3, 4)), B((4,))], [A((3, 4)), A((1, 4))], -1.5), grad=(1,), name="broadcast",
         ref=np.select),
    Case("select", ([B((5,))], [I((5,))], 7), name="int", ref=np.select),
    Case("view", (I((3, 4)), "float32"), ref=lambda x, d: x.view(d)),
    Case("view", (A((3, 4)), "int16"), ref=lambda x, d: x.view(d), name="smaller"),
    Case("view", (I((3, 4)), "uint8"), ref=lambda x, d: x.view(d), name="bytes"),
    Case("saturate_cast", (A((3, 4), -400, 400), "uint8"), ref=lambda x, d: np.clip(x, 0, 255).astype(d)),
    Case("saturate_cast", (A((3, 4), -300, 300), "int8"), ref=lambda x, d: np.clip(x, -128, 127).astype(d),
         name="int8"),
    Case("saturate_cast", (I((3, 4), -300, 300), "uint8"), ref=lambda x, d: np.clip(x, 0, 255).astype(d), name="int"),
    Case("saturate_cast", (X, "float32"), grad=(0,), tol=2e-2, name="float",
         ref=lambda x, d: x.astype(d)),
    Case("unravel_index", (I((7,), 0, 24), (2, 3, 4)), ref=lambda i, s: list(np.unravel_index(i, s))),
    Case("unravel_index", (I((2, 3), 0, 6), (6,)), ref=lambda i, s: list(np.unravel_index(i, s)), name="1d"),
    Case("unravel_index", (np.array([-1, 30, 5], np.int32), (2, 3)), name="clipped",
         ref=lambda i, s: [np.array([1, 1, 1]), np.array([2, 2, 2])]),
    # vectorize returns a function: its behaviour is tested in tests/test_ops_numpy_a.py
    Case("vectorize", (np.sin,), keras=False, gpu_dtypes=()),  # returns a function
]
