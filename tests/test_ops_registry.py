"""Every registered ``keras.ops`` op, checked automatically (the cases live in ``tests/opcases/``):

* it has a case;
* its forward matches its NumPy reference;
* its tape gradient matches central finite differences in float64;
* forward values and gradients match real Keras 3 (JAX backend, in one subprocess for all cases).

A new op without a case, or with a wrong VJP, fails here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import dnnbind
from dnnbind import ops
from dnnbind.autodiff import GradientTape
from dnnbind.ops._core import REGISTRY

from opcases import Case, all_cases

CASES = all_cases()


def _ids(cases):
    seen: dict = {}
    out = []
    for c in cases:
        k = c.label
        seen[k] = seen.get(k, 0) + 1
        out.append(k if seen[k] == 1 else f"{k}-{seen[k]}")
    return out


@pytest.fixture(autouse=True)
def _cpu():
    dnnbind.set_default_device("cpu")
    yield
    dnnbind.set_default_device(None)


def _call(case: Case, args, kwargs):
    return REGISTRY[case.op]["fn"](*args, **kwargs)


def _host(value):
    if isinstance(value, (list, tuple)):
        return [_host(v) for v in value]
    return np.asarray(value)


def test_every_registered_op_has_a_case():
    covered = {c.op for c in CASES}
    missing = sorted(set(REGISTRY) - covered)
    assert not missing, f"ops without a test case in tests/opcases/: {missing}"
    unknown = sorted(covered - set(REGISTRY))
    assert not unknown, f"cases of ops that are not registered: {unknown}"


def test_every_differentiable_op_has_a_gradient_case():
    with_grad = {c.op for c in CASES if c.grad}
    missing = sorted(name for name, info in REGISTRY.items() if info["differentiable"] and name not in with_grad)
    assert not missing, f"differentiable ops without a gradient case: {missing}"


@pytest.mark.parametrize("case", [c for c in CASES if c.ref is not None], ids=_ids([c for c in CASES
                                                                                      if c.ref is not None]))
def test_forward_matches_the_numpy_reference(case):
    rng = np.random.default_rng(0)
    args, kwargs = case.make(rng)
    got = _call(case, args, kwargs)
    want = case.ref(*args, **kwargs)
    got_h, want_h = _host(got), _host(want)
    if isinstance(want_h, list):
        assert len(got_h) == len(want_h)
        pairs = list(zip(got_h, want_h))
    else:
        pairs = [(got_h, want_h)]
    for g, w in pairs:
        w = np.asarray(w)
        assert g.shape == w.shape, f"{case.label}: shape {g.shape} != {w.shape}"
        if w.dtype.kind in "biu":
            np.testing.assert_array_equal(g, w)
        else:
            np.testing.assert_allclose(g.astype(np.float64), w.astype(np.float64), rtol=1e-6, atol=1e-9,
                                       err_msg=case.label)


def _scalar_loss(out, r):
    outs = out if isinstance(out, (list, tuple)) else [out]
    total = None
    for o, ri in zip(outs, r):
        if ri is None:
            continue
        term = ops.sum(ops.multiply(o, ri))
        total = term if total is None else ops.add(total, term)
    return total


def _weights_for(out, rng):
    outs = out if isinstance(out, (list, tuple)) else [out]
    return [rng.normal(size=np.shape(o)) if np.asarray(o).dtype.kind == "f" else None for o in outs]


@pytest.mark.parametrize("case", [c for c in CASES if c.grad], ids=_ids([c for c in CASES if c.grad]))
def test_gradient_matches_finite_differences(case):
    rng = np.random.default_rng(1)
    args, kwargs = case.make(rng, "float64")
    base = _call(case, args, kwargs)
    r = _weights_for(base, rng)
    tensors = list(args)
    watched, targets = [], []  # tensors to differentiate, and the NumPy arrays they stand for
    for i in case.grad:
        if isinstance(args[i], list):  # a list argument (concatenate, stack): each element
            tensors[i] = [ops.convert_to_tensor(a) for a in args[i]]
            watched += tensors[i]
            targets += [(f"{i}.{j}", a) for j, a in enumerate(args[i])]
        else:
            tensors[i] = ops.convert_to_tensor(args[i])
            watched.append(tensors[i])
            targets.append((str(i), args[i]))
    with GradientTape() as tape:
        for t in watched:
            tape.watch(t)
        loss = _scalar_loss(_call(case, tensors, kwargs), r)
    grads = tape.gradient(loss, watched)

    def f():
        return float(np.asarray(_scalar_loss(_call(case, args, kwargs), r)))

    for (i, x), g in zip(targets, grads):
        assert x.dtype == np.float64, f"{case.label}: argument {i} must be a float spec to differentiate"
        num = np.zeros_like(x)
        flat, nflat = x.reshape(-1), num.reshape(-1)
        eps = 1e-6
        for k in range(flat.size):
            old = flat[k]
            flat[k] = old + eps
            plus = f()
            flat[k] = old - eps
            minus = f()
            flat[k] = old
            nflat[k] = (plus - minus) / (2 * eps)
        got = np.zeros_like(x) if g is None else np.asarray(g, dtype=np.float64)
        assert got.shape == x.shape, f"{case.label}: gradient shape {got.shape} != argument shape {x.shape}"
        scale = max(1.0, float(np.abs(num).max()))
        err = float(np.abs(got - num).max()) / scale
        assert err <= max(case.tol, 1e-6), f"{case.label}: argument {i}: gradient error {err:.2e}\n{got}\n{num}"


# ----------------------------------------------------------------------------------- real Keras 3
_KERAS_SCRIPT = r"""
import json, sys
import numpy as np
import jax, jax.numpy as jnp
import keras
work = sys.argv[1]
spec = json.load(open(f"{work}/cases.json"))
data = dict(np.load(f"{work}/args.npz"))
out = {}
def build(v):
    if isinstance(v, dict) and "__array__" in v:
        return jnp.asarray(data[v["__array__"]])
    if isinstance(v, dict) and "__list__" in v:
        return [build(i) for i in v["__list__"]]
    if isinstance(v, dict) and "__tuple__" in v:
        return tuple(build(i) for i in v["__tuple__"])
    return v
status = {}
for key, case in spec.items():
    try:
        fn = getattr(keras.ops, case["op"], None) or getattr(keras.ops.image, case["op"])  # image ops: only there
        args = [build(a) for a in case["args"]]
        kwargs = {k: build(v) for k, v in case["kwargs"].items()}
        res = fn(*args, **kwargs)
        outs = res if isinstance(res, (list, tuple)) else [res]
        for j, o in enumerate(outs):
            out[f"{key}/value/{j}"] = np.asarray(o)
        if case["grad"]:
            r = [data[f"{key}/r/{j}"] if f"{key}/r/{j}" in data else None for j in range(len(outs))]
            def loss(*gargs):
                a = list(args)
                for i, g in zip(case["grad"], gargs):
                    a[i] = g
                res = fn(*a, **kwargs)
                outs = res if isinstance(res, (list, tuple)) else [res]
                return sum(jnp.sum(o * ri) for o, ri in zip(outs, r) if ri is not None)
            grads = jax.grad(loss, argnums=tuple(range(len(case["grad"]))))(*[args[i] for i in case["grad"]])
            for i, g in zip(case["grad"], grads):
                out[f"{key}/grad/{i}"] = np.asarray(g)
        status[key] = "ok"
    except Exception as exc:
        status[key] = f"{type(exc).__name__}: {str(exc)[:300]}"
np.savez(f"{work}/keras_out.npz", **out)
json.dump(status, open(f"{work}/keras_status.json", "w"))
"""


def _keras_available() -> bool:
    try:
        import importlib.util

        return all(importlib.util.find_spec(m) is not None for m in ("keras", "jax"))
    except Exception:
        return False


_KERAS_CASES = [c for c in CASES if c.keras]


@pytest.fixture(scope="module")
def keras_results(tmp_path_factory):
    if not _keras_available():
        pytest.skip("real Keras 3 with JAX is not installed (test extra)")
    work = tmp_path_factory.mktemp("keras_ops")
    spec, arrays, ours = {}, {}, {}
    for n, (case, label) in enumerate(zip(_KERAS_CASES, _ids(_KERAS_CASES))):
        rng = np.random.default_rng(100 + n)
        args, kwargs = case.make(rng, "float32")

        def encode(v, path):
            if isinstance(v, np.ndarray):
                arrays[path] = v
                return {"__array__": path}
            if isinstance(v, list):
                return {"__list__": [encode(i, f"{path}.{j}") for j, i in enumerate(v)]}
            if isinstance(v, tuple):
                return {"__tuple__": [encode(i, f"{path}.{j}") for j, i in enumerate(v)]}
            if isinstance(v, np.generic):
                return v.item()
            return v

        kw = case.keras_kwargs if case.keras_kwargs is not None else kwargs
        spec[label] = {"op": case.op, "args": [encode(a, f"{label}/a{i}") for i, a in enumerate(args)],
                       "kwargs": {k: encode(v, f"{label}/k{k}") for k, v in kw.items()}, "grad": list(case.grad)}
        try:
            value = _call(case, args, kwargs)
        except Exception as exc:  # reported by the comparison test
            ours[label] = exc
            continue
        r = _weights_for(value, rng)
        for j, ri in enumerate(r):
            if ri is not None:
                arrays[f"{label}/r/{j}"] = ri.astype(np.float32)
        ours[label] = (args, kwargs, value, [None if ri is None else ri.astype(np.float32) for ri in r])
    with open(work / "cases.json", "w") as f:
        json.dump(spec, f)
    np.savez(work / "args.npz", **arrays)
    env = {k: v for k, v in os.environ.items() if k != "KERAS_HOME"}
    env.update(KERAS_HOME=str(work / "keras_home"), KERAS_BACKEND="jax", JAX_PLATFORMS="cpu")
    proc = subprocess.run([sys.executable, "-c", _KERAS_SCRIPT, str(work)], capture_output=True, text=True,
                          env=env, timeout=600)
    assert proc.returncode == 0, f"the Keras side failed:\n{proc.stderr[-4000:]}"
    status = json.load(open(work / "keras_status.json"))
    return status, dict(np.load(work / "keras_out.npz")), ours


_KERAS_CASES = [c for c in _KERAS_CASES if not any(isinstance(c.args[i], list) for i in c.grad)] + [
    Case(c.op, c.args, c.kwargs, (), c.ref, c.keras, c.gpu_dtypes, c.tol, c.name, c.keras_kwargs)
    for c in _KERAS_CASES if any(isinstance(c.args[i], list) for i in c.grad)]  # list arguments: values only


@pytest.mark.parametrize("label", _ids(_KERAS_CASES))
def test_matches_real_keras(keras_results, label):
    status, theirs, ours = keras_results
    case = _KERAS_CASES[_ids(_KERAS_CASES).index(label)]
    mine = ours[label]
    if status[label] != "ok":
        if isinstance(mine, Exception):
            return  # both refuse (Keras's own error is in status)
        pytest.fail(f"{label}: Keras refused ({status[label]}) but dnnbind computed a value")
    if isinstance(mine, Exception):
        pytest.fail(f"{label}: Keras computed a value but dnnbind raised {type(mine).__name__}: {mine}")
    args, kwargs, value, r = mine
    outs = value if isinstance(value, (list, tuple)) else [value]
    for j, o in enumerate(outs):
        want = theirs[f"{label}/value/{j}"]
        got = np.asarray(o)
        assert got.shape == want.shape, f"{label}: output {j} shape {got.shape}, Keras {want.shape}"
        assert str(ops.dtype(o)) == str(want.dtype) or want.dtype == np.float32 and got.dtype == np.float32, \
            f"{label}: output {j} dtype {ops.dtype(o)}, Keras {want.dtype}"
        if want.dtype.kind in "biu":
            np.testing.assert_array_equal(got, want, err_msg=label)
        else:
            np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=2e-5, atol=2e-6,
                                       err_msg=label)
    if case.grad:
        tensors = list(args)
        watched = [ops.convert_to_tensor(args[i]) for i in case.grad]
        for i, t in zip(case.grad, watched):
            tensors[i] = t
        with GradientTape() as tape:
            for t in watched:
                tape.watch(t)
            loss = _scalar_loss(_call(case, tensors, kwargs), r)
        grads = tape.gradient(loss, watched)
        for i, g in zip(case.grad, grads):
            want = theirs[f"{label}/grad/{i}"]
            got = np.zeros(want.shape) if g is None else np.asarray(g, dtype=np.float64)
            np.testing.assert_allclose(got, want.astype(np.float64), rtol=1e-4, atol=1e-5,
                                       err_msg=f"{label}: gradient of argument {i}")
