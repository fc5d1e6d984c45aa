"""Special functions that :mod:`dnnbind.kernels.numeric`'s ``UNARY`` table lacks, on either backend.

:func:`special` applies one name of :data:`SPECIAL` elementwise. The NumPy code here is the reference;
``dnnbind.kernels._cuda.special`` (``special.cu``) implements the same signature with one NVRTC kernel
per dtype on the call's stream. Conventions are numeric's: float16/bfloat16 compute in float32, every
other float type in itself; results are new C-contiguous arrays of ``dtype`` (default ``x.dtype``).

* ``bessel_i1``: the modified Bessel function of the first kind of order one, ``I1(x)`` (odd in ``x``),
  by the Cephes Chebyshev expansions on ``[0, 8]`` and ``(8, inf)`` (S. L. Moshier, Cephes Math Library
  2.8; relative error about 2e-15 in float64). It is the derivative of ``i0``.
* ``sinc``: ``sin(pi x) / (pi x)``, 1 at 0 (NumPy's normalised sinc).
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from .._validate import BFLOAT16, normalize_dtype
from ._dispatch import check_out, route

__all__ = ["SPECIAL", "special", "I1_CHEBYSHEV_SMALL", "I1_CHEBYSHEV_LARGE"]

_LOW = (np.dtype(np.float16), BFLOAT16)
_F32 = np.dtype(np.float32)

#: Cephes ``i1.c``: Chebyshev coefficients of ``exp(-x) I1(x) / x`` on [0, 8] (highest degree first)
I1_CHEBYSHEV_SMALL = (
    2.77791411276104639959e-18, -2.11142121435816608115e-17, 1.55363195773620046921e-16,
    -1.10559694773538630805e-15, 7.60068429473540693410e-15, -5.04218550472791168711e-14,
    3.22379336594557470981e-13, -1.98397439776494371520e-12, 1.17361862988909016308e-11,
    -6.66348972350202774223e-11, 3.62559028155211703701e-10, -1.88724975172282928790e-09,
    9.38153738649577178388e-09, -4.44505912879632808065e-08, 2.00329475355213526229e-07,
    -8.56872026469545474066e-07, 3.47025130813767847674e-06, -1.32731636560394358279e-05,
    4.78156510755005422638e-05, -1.61760815825896745588e-04, 5.12285956168575772895e-04,
    -1.51357245063125314899e-03, 4.15642294431288815669e-03, -1.05640848946261981558e-02,
    2.47264490306265168283e-02, -5.29459812080949914269e-02, 1.02643658689847095384e-01,
    -1.76416518357834055153e-01, 2.52587186443633654823e-01,
)

#: Cephes ``i1.c``: Chebyshev coefficients of ``exp(-x) sqrt(x) I1(x)`` on (8, inf), in ``32/x - 2``
I1_CHEBYSHEV_LARGE = (
    7.51729631084210481353e-18, 4.41434832307170791151e-18, -4.65030536848935832153e-17,
    -3.20952592199342395980e-17, 2.96262899764595013876e-16, 3.30820231092092828324e-16,
    -1.88035477551078244854e-15, -3.81440307243700780478e-15, 1.04202769841288027642e-14,
    4.27244001671195135429e-14, -2.10154184277266431302e-14, -4.08355111109219731823e-13,
    -7.19855177624590851209e-13, 2.03562854414708950722e-12, 1.41258074366137813316e-11,
    3.25260358301548823856e-11, -1.89749581235054123450e-11, -5.58974346219658380687e-10,
    -3.83538038596423702205e-09, -2.63146884688951950684e-08, -2.51223623787020892529e-07,
    -3.88256480887769039346e-06, -1.10588938762623716291e-04, -9.76109749136146840777e-03,
    7.78576235018280120474e-01,
)


def _chbevl(y: np.ndarray, coefficients: tuple) -> np.ndarray:
    """Cephes ``chbevl``: the Chebyshev series at ``y`` (in [-2, 2]; coefficients highest degree first)."""
    b0 = np.full_like(y, coefficients[0])
    b1 = np.zeros_like(y)
    b2 = b1
    for c in coefficients[1:]:  # a fixed number of whole-array steps, not a loop over elements
        b2, b1 = b1, b0
        b0 = y * b1 - b2 + c
    return 0.5 * (b0 - b2)


def _bessel_i1(x: np.ndarray) -> np.ndarray:
    z = np.abs(x)
    small = np.minimum(z, 8.0)
    large = np.maximum(z, 8.0)
    with np.errstate(over="ignore", invalid="ignore"):
        near = _chbevl(small / 2.0 - 2.0, I1_CHEBYSHEV_SMALL) * small * np.exp(small)
        far = np.exp(large) * _chbevl(32.0 / large - 2.0, I1_CHEBYSHEV_LARGE) / np.sqrt(large)
        out = np.where(z <= 8.0, near, far)
    return np.where(x < 0, -out, out)


def _sinc(x: np.ndarray) -> np.ndarray:
    return np.sinc(x)


#: name -> NumPy function on the compute-type array
SPECIAL: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "bessel_i1": _bessel_i1,
    "sinc": _sinc,
}


def special(op: str, x: Any, *, dtype: Any = None, out: Any = None, stream: Any = None) -> Any:
    """``op`` (a name of :data:`SPECIAL`) of every element of the float array ``x``, as ``dtype``
    (a float dtype; default ``x.dtype``)."""
    fn = SPECIAL.get(op)
    if fn is None:
        raise ValueError(f"special: unknown op {op!r}; known: {', '.join(sorted(SPECIAL))}")
    if not hasattr(x, "shape") or not hasattr(x, "dtype"):
        x = np.asarray(x)
    dt = normalize_dtype(dtype, f"{op}: dtype") if dtype is not None else x.dtype
    for name, d in (("x", x.dtype), ("dtype", dt)):
        if not (d.kind == "f" or d == BFLOAT16):
            raise TypeError(f"{op}: {name} must be a float dtype (float16, bfloat16, float32, float64), got {d}")
    check_out(op, out, tuple(x.shape), dt)
    impl = route(op, "special", x=x, out=out)
    if impl is not None:
        return impl.special(op, x, dtype=dt, out=out, stream=stream)
    src = x.astype(_F32) if x.dtype in _LOW else x
    if dt not in _LOW and src.dtype != dt:
        src = src.astype(dt)
    with np.errstate(all="ignore"):
        res = np.asarray(fn(src)).astype(dt)  # (astype: a new C-contiguous array, 0-d stays 0-d)
    if out is not None:
        np.copyto(out, res)
        return out
    return res

