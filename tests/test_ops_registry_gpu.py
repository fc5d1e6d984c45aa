"""Every registered ``keras.ops`` op on the GPU, per dtype, against the NumPy backend (the cases live in
``tests/opcases/``; ``test_ops_registry.py`` checks the NumPy side against references, finite
differences and real Keras 3).

For each case and each of its ``gpu_dtypes``: the float arguments are drawn in float64 and rounded to
the dtype; the NumPy backend computes the reference in float64 from those rounded values, the GPU
computes in the dtype. Before the GPU call the memory pool is filled with NaN (0xFF bytes), so an
output element the op never writes cannot pass. Float outputs are compared by relative error
(``testutil.TOLERANCE`` of the dtype, relative to the norm of the reference), integer and bool
outputs exactly, and shapes always. For a differentiable case the tape gradient of
``sum(output * r)`` on the GPU is compared with the NumPy backend's the same way. An op with no
device implementation (the linalg decompositions, which raise ``NotImplementedError``) is skipped
with that reason. ``$DNNBIND_ERRLOG`` collects the errors (tests/gpu_errlog.py).

    python3 -m pytest -q -n 8 tests/test_ops_registry_gpu.py
"""

from __future__ import annotations

import zlib

import ml_dtypes
import numpy as np
import pytest

import dnnbind
from dnnbind import cuda, ops
from dnnbind.autodiff import GradientTape
from dnnbind.kernels import config
from dnnbind.ops._core import REGISTRY
from gpu_errlog import record
from opcases import Case, all_cases
from testutil import TOLERANCE, rel_error

pytestmark = pytest.mark.gpu

_DT = {"float32": np.dtype(np.float32), "float16": np.dtype(np.float16),
       "bfloat16": np.dtype(ml_dtypes.bfloat16), "float64": np.dtype(np.float64)}
# gradients pass through one more rounding of each intermediate: twice the forward tolerance
_GRAD_FACTOR = 2.0

CASES = [c for c in all_cases() if c.gpu_dtypes]


def _ids(cases):
    seen: dict = {}
    out = []
    for c in cases:
        k = c.label
        seen[k] = seen.get(k, 0) + 1
        out.append(k if seen[k] == 1 else f"{k}-{seen[k]}")
    return out


_LABELS = _ids(CASES)
PARAMS = [pytest.param(case, dtype, id=f"{label}-{dtype}")
          for case, label in zip(CASES, _LABELS) for dtype in case.gpu_dtypes]


@pytest.fixture(scope="module", autouse=True)
def _compiled():
    """The numeric kernels into the disk cache in parallel first (NVRTC one by one would dominate)."""
    from dnnbind.kernels._cuda import numeric as dn

    dn.precompile()


def _map(v, fn):
    if isinstance(v, np.ndarray):
        return fn(v)
    if isinstance(v, list):
        return [_map(i, fn) for i in v]
    if isinstance(v, tuple):
        return tuple(_map(i, fn) for i in v)
    if isinstance(v, dict):
        return {k: _map(i, fn) for k, i in v.items()}
    return v


def _is_float(dtype) -> bool:
    return np.dtype(dtype).kind == "f" or np.dtype(dtype) == _DT["bfloat16"]  # (bfloat16's kind is "V")


def _rounded(v, dtype):
    """Float arrays rounded to ``dtype`` (kept in ``dtype``)."""
    return _map(v, lambda a: a.astype(dtype) if _is_float(a.dtype) else a)


def _wide(v):
    return _map(v, lambda a: a.astype(np.float64) if _is_float(a.dtype) else a)


def _poison_pool(nbytes: int = 64 << 20) -> None:
    """Fill freed pool memory with NaN: allocate, fill with 0xFF, free (stream-ordered, so the op's
    outputs are carved from the poisoned blocks)."""
    blocks = [cuda.empty((nbytes >> k,), np.uint8).fill_bytes(0xFF) for k in range(0, 12, 2)]
    del blocks


def _call(case: Case, args, kwargs):
    return REGISTRY[case.op]["fn"](*args, **kwargs)


def _outs(value):
    return list(value) if isinstance(value, (list, tuple)) else [value]


def _host(v) -> np.ndarray:
    return np.asarray(v)


def _pairs(a: np.ndarray) -> np.ndarray:
    """A complex array as (real, imaginary) pairs on a last axis: compared like any float array."""
    return np.stack([a.real, a.imag], -1) if a.dtype.kind == "c" else a


def _rel(g, w, mask) -> float:
    return rel_error(g[mask], w[mask]) if mask.any() else 0.0


def _compare(case, label, dtype, what, got, want, factor=1.0, same_dtype=None):
    """``got`` (GPU, in ``dtype``) against ``want`` (NumPy backend, float64 from the same rounded inputs)
    and ``same_dtype`` (NumPy backend in ``dtype`` itself, None when it could not run).

    Integer and bool results, and results whose shape depends on the dtype (``view``), equal the
    same-dtype result. A NaN or infinity on the GPU must be one of a reference (an overflow in float16
    is right). Finite values are within the dtype's tolerance of ``want``, relative to its norm, or no
    worse than 4x the same-dtype result's own error: an op ill-conditioned in the dtype (a sum that
    cancels) cannot be more accurate there on any backend."""
    where = f"{label} [{dtype}] {what}"
    if not hasattr(got, "shape") and not isinstance(got, (int, float, bool, np.generic)):
        ref = same_dtype if same_dtype is not None else want
        assert str(got) == str(ref), f"{where}: {got!r}, NumPy backend {ref!r}"
        return
    g, w = _pairs(_host(got)), _pairs(_host(want))
    o = None if same_dtype is None else _pairs(_host(same_dtype))
    if g.dtype.kind in "biu" or (o is not None and o.shape != w.shape):
        ref = o if o is not None else w
        assert g.shape == ref.shape, f"{where}: shape {g.shape}, NumPy backend {ref.shape}"
        if g.dtype.kind in "biu":
            np.testing.assert_array_equal(g, ref, err_msg=where)
            return
        w, o = ref, None
    assert g.shape == w.shape, f"{where}: shape {g.shape}, NumPy backend {w.shape}"
    g, w = g.astype(np.float64), w.astype(np.float64)
    o = None if o is None else o.astype(np.float64)

    def same_special(ref):
        return (np.isnan(g) & np.isnan(ref)) | (np.isinf(g) & (g == ref))

    ok = np.isfinite(g) | same_special(w) | (False if o is None else same_special(o))
    assert ok.all(), f"{where}: NaN/inf where the NumPy backend has none\n{g}\n{w}"
    lost = np.isfinite(g) & ~np.isfinite(w) & (True if o is None else ~np.isfinite(o))
    assert not lost.any(), f"{where}: finite where the NumPy backend has NaN/inf\n{g}\n{w}"
    both = np.isfinite(g) & np.isfinite(w)
    with np.errstate(over="ignore", invalid="ignore"):
        err = _rel(g, w, both)
        out_dtype = str(_host(got).dtype)  # an op may compute in another dtype (ints -> float32): the coarser
        tol = max(TOLERANCE[dtype], TOLERANCE.get(out_dtype, 0.0)) * factor
        if o is not None:
            own = _rel(o, w, np.isfinite(o) & np.isfinite(w))
            if np.isfinite(own):
                tol = max(tol, 4 * own)
            if not np.isfinite(err):  # values near float64's max (nan_to_num's default): the dtype's own result
                err = _rel(g, o, np.isfinite(g) & np.isfinite(o))
    record(case.op, dtype, err, f"{label} {what}")
    assert err <= tol, f"{where}: relative error {err:.3e} > {tol:.1e}"


def _weights(outs, rng, dtype):
    return [rng.normal(size=np.shape(o)).astype(dtype) if _is_float(np.asarray(o).dtype) else None for o in outs]


def _loss(outs, r):
    total = None
    for o, ri in zip(outs, r):
        if ri is None:
            continue
        term = ops.sum(ops.multiply(o, ri))
        total = term if total is None else ops.add(total, term)
    return total


def _grads(case, args, kwargs, r):
    """The tape gradients of sum(out * r) with respect to the case's ``grad`` arguments (each element of a
    list argument), with their argument labels."""
    tensors = list(args)
    watched, names = [], []
    for i in case.grad:
        if isinstance(args[i], list):  # a list argument (concatenate, stack): each element
            tensors[i] = [ops.convert_to_tensor(a) for a in args[i]]
            watched += tensors[i]
            names += [f"{i}.{j}" for j in range(len(args[i]))]
        else:
            tensors[i] = ops.convert_to_tensor(args[i])
            watched.append(tensors[i])
            names.append(str(i))
    with GradientTape() as tape:
        for t in watched:
            tape.watch(t)
        loss = _loss(_outs(_call(case, tensors, kwargs)), r)
    grads = tape.gradient(loss, watched)
    return [(n, np.zeros(t.shape) if g is None else _host(g)) for n, t, g in zip(names, watched, grads)]


def _cast_weights(r64, outs):
    return [None if ri is None or o is None else ri.astype(_host(o).dtype) for ri, o in zip(r64, outs)]


@pytest.mark.parametrize("case,dtype", PARAMS)
def test_gpu_matches_the_numpy_backend(case, dtype):
    label = f"{case.label}"
    dt = _DT[dtype]
    rng = np.random.default_rng(zlib.crc32(f"{label}-{dtype}".encode()))
    args64, kwargs64 = case.make(rng, "float64")
    args, kwargs = _rounded(args64, dt), _rounded(kwargs64, dt)
    ref_args, ref_kwargs = _wide(args), _wide(kwargs)

    dnnbind.set_default_device("cpu")
    try:
        want = _outs(_call(case, ref_args, ref_kwargs))
        try:  # the same in the dtype itself: how well-conditioned the case is there
            own = _outs(_call(case, args, kwargs))
        except Exception:
            own = [None] * len(want)
        r64 = [None if ri is None else ri.astype(dt).astype(np.float64) for ri in _weights(want, rng, np.float64)]
        want_grads = own_grads = None
        if case.grad:
            want_grads = _grads(case, ref_args, ref_kwargs, r64)
            try:
                own_grads = _grads(case, args, kwargs, _cast_weights(r64, own))
            except Exception:
                own_grads = None
    finally:
        dnnbind.set_default_device(None)

    dnnbind.set_default_device("cuda")
    tf32 = config.override(allow_tf32=False)  # float32 means float32 here (TF32 is tested per kernel)
    tf32.__enter__()
    try:
        _poison_pool()
        try:
            got = _outs(_call(case, args, kwargs))
        except NotImplementedError as exc:
            pytest.skip(f"no device implementation: {exc}")
        assert len(got) == len(want), f"{label} [{dtype}]: {len(got)} outputs, NumPy backend {len(want)}"
        for j, (g, w) in enumerate(zip(got, want)):
            o = own[j] if j < len(own) else None
            if isinstance(g, (list, tuple)):
                for k, (gi, wi) in enumerate(zip(g, w)):
                    _compare(case, label, dtype, f"output {j}.{k}", gi, wi,
                             same_dtype=None if o is None else o[k])
            else:
                _compare(case, label, dtype, f"output {j}", g, w, same_dtype=o)
        if want_grads is not None:
            _poison_pool()
            got_grads = _grads(case, args, kwargs, _cast_weights(r64, got))
            for k, ((name, g), (_, w)) in enumerate(zip(got_grads, want_grads)):
                o = None if own_grads is None else own_grads[k][1]
                _compare(case, label, dtype, f"gradient of argument {name}", g, w, factor=_GRAD_FACTOR,
                         same_dtype=o)
    finally:
        tf32.__exit__(None, None, None)
        dnnbind.set_default_device(None)
