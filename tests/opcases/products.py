"""Cases of the products family (``dnnbind/ops/_products.py``): einsum, tensordot, dot, inner, vdot, outer,
kron, cross."""

import numpy as np

from . import A, Case, I


def _pad3(v, axis=-1):
    """2-vectors with a zero z component (NumPy 2 deprecates 2-vectors in np.cross)."""
    v = np.moveaxis(v, axis, -1)
    return np.concatenate([v, np.zeros(v.shape[:-1] + (3 - v.shape[-1],))], -1) if v.shape[-1] == 2 else v


def _einsum(sub, *shapes, name=""):
    return Case("einsum", (sub,) + tuple(A(s) for s in shapes), grad=tuple(range(1, len(shapes) + 1)),
                ref=lambda s, *xs: np.einsum(s, *xs), name=name or sub)


CASES = [
    # Keras's own einsum subscripts (ops/numpy_test.py), each contraction a batched matmul
    _einsum("ij,jk->ik", (2, 3), (3, 4)),
    _einsum("ij,jk->ikj", (2, 3), (3, 4)),
    _einsum("ii", (3, 3), name="trace"),
    _einsum("ii->i", (3, 3), name="diagonal"),
    _einsum("iij->j", (3, 3, 2), name="partial_trace"),
    _einsum("ijk,jkl->li", (2, 3, 4), (3, 4, 5)),
    _einsum("ijk,lkj->il", (2, 3, 4), (5, 4, 3)),
    _einsum("ijk,ikj->i", (2, 3, 4), (2, 4, 3)),
    _einsum("...,...j->...j", (2, 3, 4), (2, 3, 4, 5), name="ellipsis"),
    _einsum("i...,...j->i...j", (2, 3, 4), (3, 4, 5), name="ellipsis_mid"),
    _einsum("i...,...j", (2, 3, 4), (3, 4, 5), name="implicit_ellipsis"),
    _einsum("i...,j...k->...ijk", (2, 3), (4, 3, 5), name="ellipsis_out"),
    _einsum("i...,...j,...k", (1, 3, 4), (3, 4, 5), (3, 4, 2), name="three"),
    _einsum("mij,ijk,...", (1, 1, 1), (1, 1, 4), (3, 2), name="broadcast_ones"),
    _einsum("ij,kj", (2, 1), (3, 4), name="size_one"),
    _einsum("bij,bjk->bik", (1, 2, 3), (4, 3, 5), name="batch_broadcast"),
    _einsum("abcd,aecd->aceb", (2, 3, 4, 5), (2, 3, 4, 5), name="attention"),
    _einsum("abcde,afce->acdbf", (2, 3, 4, 2, 3), (2, 2, 4, 3), name="five"),
    _einsum("a,b->ab", (3,), (4,), name="outer"),
    _einsum("ab,b->a", (3, 4), (4,), name="matvec"),
    Case("einsum", (",ij", 5, A((2, 3))), grad=(2,), ref=lambda s, a, b: np.einsum(s, a, b), name="scalar"),
    Case("einsum", ("ij,jk", I((2, 3), -3, 3, "int8"), I((3, 4), -3, 3, "int8")), name="int8",
         ref=lambda s, a, b: np.einsum(s, a.astype(np.int32), b.astype(np.int32))),
    Case("tensordot", (A((2, 3, 4)), A((3, 4, 5))), grad=(0, 1), ref=np.tensordot),
    Case("tensordot", (A((2, 3, 4)), A((5, 2, 3))), {"axes": ([0, 1], [1, 2])}, grad=(0, 1), name="pairs",
         ref=lambda a, b, axes: np.tensordot(a, b, axes)),
    Case("tensordot", (A((2, 3)), A((4,))), {"axes": 0}, grad=(0, 1), name="outer",
         ref=lambda a, b, axes: np.tensordot(a, b, axes)),
    Case("tensordot", (I((2, 3)), I((3, 2))), {"axes": 1}, name="int", ref=lambda a, b, axes: np.tensordot(a, b, axes)),
    Case("dot", (A((2, 3, 4)), A((5, 4, 6))), grad=(0, 1), ref=np.dot),
    Case("dot", (A((4,)), A((4,))), grad=(0, 1), ref=np.dot, name="vectors"),
    Case("dot", (A((3, 4)), A((4,))), grad=(0, 1), ref=np.dot, name="matvec"),
    Case("dot", (A((4,)), A((4, 2))), grad=(0, 1), ref=np.dot, name="vecmat"),
    Case("dot", (A((3, 4)), 2.5), grad=(0,), ref=np.dot, name="scalar"),
    Case("dot", (I((3, 4)), A((4, 2))), grad=(1,), ref=np.dot, name="int_float"),
    Case("inner", (A((2, 3)), A((4, 3))), grad=(0, 1), ref=np.inner),
    Case("inner", (A((3,)), A((2, 2, 3))), grad=(0, 1), ref=np.inner, name="vector"),
    Case("vdot", (A((2, 3)), A((3, 2))), grad=(0, 1), ref=np.vdot),
    Case("outer", (A((3,)), A((2, 2))), grad=(0, 1), ref=np.outer),
    Case("outer", (I((3,)), I((2,))), ref=np.outer, name="int"),
    Case("kron", (A((2, 3)), A((2, 2))), grad=(0, 1), ref=np.kron),
    Case("kron", (A((3,)), A((2, 1, 2))), grad=(0, 1), ref=np.kron, name="ranks"),
    Case("kron", (I((2, 2)), I((2, 3))), ref=np.kron, name="int"),
    Case("cross", (A((4, 3)), A((4, 3))), grad=(0, 1), ref=np.cross),
    Case("cross", (A((3, 4)), A((4, 3))), {"axisa": 0}, grad=(0, 1), name="axisa",
         ref=lambda a, b, axisa: np.cross(a, b, axisa=axisa)),
    Case("cross", (A((2, 3)), A((2, 3))), {"axis": 0}, grad=(0, 1), name="axis",
         ref=lambda a, b, axis: a[0] * b[1] - a[1] * b[0]),
    Case("cross", (A((4, 2)), A((4, 3))), {"axisc": 0}, grad=(0, 1), name="mixed",
         ref=lambda a, b, axisc: np.cross(_pad3(a), b, axisc=axisc)),
    Case("cross", (A((4, 2)), A((2,))), grad=(0, 1), name="two", ref=lambda a, b: a[..., 0] * b[1] - a[..., 1] * b[0]),
]
