"""The device side of :mod:`dnnbind.kernels.linalg`: not available yet.

Dense factorisations need cuSOLVER (``potrf``, ``getrf``, ``geqrf``, ``gesvd``, ``syevd``, ``geev``),
which dnnbind does not bind yet. Each function raises ``NotImplementedError`` naming the operation
instead of copying the matrices to the host behind the caller's back (a hidden synchronisation).
The ``keras.ops`` that compose from matmuls, elementwise ops and reductions (``norm`` of vectors and
its Frobenius, 1 and inf matrix norms, ``det`` of 1x1 to 3x3 matrices, ``jvp``) do run on the device.
"""

from __future__ import annotations

from typing import Any, Callable

__all__ = ["cholesky", "triangular_solve", "lu_factor", "inv", "solve", "det", "eigh", "eig", "svd", "qr"]


def _unsupported(op: str) -> Callable[..., Any]:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(
            f"{op}: dense linear algebra has no CUDA implementation yet (dnnbind binds no cuSOLVER); compute it on "
            "the CPU backend: dnnbind.set_default_device('cpu') and NumPy inputs, or tensor.numpy() first")

    refuse.__name__ = refuse.__qualname__ = op
    return refuse


cholesky = _unsupported("cholesky")
triangular_solve = _unsupported("triangular_solve")
lu_factor = _unsupported("lu_factor")
inv = _unsupported("inv")
solve = _unsupported("solve")
det = _unsupported("det")
eigh = _unsupported("eigh")
eig = _unsupported("eig")
svd = _unsupported("svd")
qr = _unsupported("qr")
