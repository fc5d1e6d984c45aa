"""Real Keras 3 (JAX backend) results for the ops whose arguments are Python callables (control flow,
``jvp``) and for ``eig`` (complex, eigenvectors up to a phase): the registry harness sends its cases to
Keras as JSON, which cannot carry a function.

The cases are Python source (:data:`SOURCE`): each defines ``NAME = (fn, inputs, grad)`` in ``CASES``, where
``fn`` uses ``ops`` (``keras.ops`` in the subprocess, ``dnnbind.ops`` here), ``inputs`` names arrays of
:data:`INPUTS` and ``grad`` the input positions to differentiate (``jax.grad`` there, a GradientTape
here) through ``sum(leaf * r)`` over the output's float leaves (JAX's leaf order: dicts by sorted
key). One subprocess serves every test module in a session (:func:`results` is cached).
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import tempfile
import zlib

import numpy as np

SOURCE = r'''
def _lin(a, b):
    return [a[0] * b[0], a[1] * b[0] + b[1]]


CASES = {
    # control flow
    "cond_true": (lambda x: ops.cond(ops.sum(x) > -100.0, lambda: ops.sin(x) * x, lambda: x), ["v"], [0]),
    "cond_false": (lambda x: ops.cond(ops.sum(x) > 100.0, lambda: x, lambda: ops.exp(x) * 2.0), ["v"], [0]),
    "switch": (lambda x, y: ops.switch(1, [lambda a, b: a + b, lambda a, b: a * ops.sin(b)], x, y), ["v", "w"],
               [0, 1]),
    "switch_clamped": (lambda x: ops.switch(-4, [lambda a: ops.exp(a), lambda a: a * a], x), ["v"], [0]),
    "scan": (lambda c, xs: ops.scan(lambda c, x: (c * 0.9 + ops.sin(x), {"p": c * x, "q": x + 1.0}), c, xs),
             ["v", "seq"], [0, 1]),
    "scan_reverse_pytree": (lambda c, xs: ops.scan(lambda c, x: ((c[0] + x[0], c[1] * 0.5 + x[1]), c[0] * x[1]),
                                                   (c, c * 2.0), (xs, xs * xs), reverse=True, unroll=3),
                            ["v", "seq"], [0, 1]),
    "scan_length": (lambda c: ops.scan(lambda c, x: (c * 1.1 + 0.5, ops.tanh(c)), c, None, length=4), ["v"], [0]),
    "fori_loop": (lambda v: ops.fori_loop(1, 5, lambda i, s: (s[0] * 1.2 + i, s[1] + s[0] * s[0]), (v, v)), ["v"],
                  [0]),
    "while_loop": (lambda a, b: ops.while_loop(lambda x, y: ops.sum(x) < 20.0, lambda x, y: (x * 2.0, y + x), (a, b)),
                   ["pos", "w"], []),
    "while_loop_max": (lambda a: ops.while_loop(lambda x: ops.sum(x) < 1e9, lambda x: x * 3.0, a,
                                                maximum_iterations=2), ["pos"], []),
    "map": (lambda xs: ops.map(lambda x: {"s": ops.sum(x * x), "t": ops.cos(x)}, xs), ["seq"], [0]),
    "vectorized_map": (lambda xs, ys: ops.vectorized_map(lambda e: e[0] * ops.exp(e[1]), (xs, ys)), ["seq", "seq2"],
                       [0, 1]),
    "associative_scan": (lambda xs: ops.associative_scan(lambda a, b: a * b, xs), ["seq"], [0]),
    "associative_scan_pytree": (lambda a, b: ops.associative_scan(_lin, [a, b], reverse=True, axis=1),
                                ["long", "long2"], [0, 1]),
    # linalg
    "jvp": (lambda x, t: ops.jvp(ops.sin, (x,), (t,)), ["v", "w"], [0, 1]),
    "jvp_inv": (lambda a, t: ops.jvp(lambda m: ops.inv(m), (a,), (t,)), ["mat", "tmat"], [0, 1]),
    "jvp_pytree_aux": (lambda x, y, t, u: ops.jvp(lambda d: ({"a": d["x"] * d["y"], "b": ops.exp(d["x"])}, d["y"]),
                                                  ({"x": x, "y": y},), ({"x": t, "y": u},), has_aux=True),
                       ["v", "w", "v2", "w2"], [0, 2]),
    "eig": (lambda a: ops.eig(a), ["mat"], []),
}
'''

_rng = np.random.default_rng(2024)
INPUTS = {
    "v": _rng.uniform(-1, 1, (3,)), "w": _rng.uniform(-1, 1, (3,)), "v2": _rng.uniform(-1, 1, (3,)),
    "w2": _rng.uniform(-1, 1, (3,)), "pos": _rng.uniform(0.5, 1.0, (3,)), "seq": _rng.uniform(-1, 1, (5, 3)),
    "seq2": _rng.uniform(-1, 1, (5, 3)), "long": _rng.uniform(-1, 1, (2, 6)), "long2": _rng.uniform(-1, 1, (2, 6)),
    "mat": _rng.uniform(-1, 1, (3, 3)) + 3 * np.eye(3), "tmat": _rng.uniform(-1, 1, (3, 3)),
}
INPUTS = {k: v.astype(np.float32) for k, v in INPUTS.items()}


def leaves(tree):
    """Array leaves in JAX's order (dicts by sorted key; None is an empty subtree)."""
    if tree is None:
        return []
    if isinstance(tree, dict):
        return [leaf for k in sorted(tree) for leaf in leaves(tree[k])]
    if isinstance(tree, (list, tuple)):
        return [leaf for v in tree for leaf in leaves(v)]
    return [tree]


def cases(ops_module) -> dict:
    """The cases with ``ops`` bound to ``ops_module``."""
    namespace = {"ops": ops_module}
    exec(SOURCE, namespace)  # noqa: S102 (our own test source)
    return namespace["CASES"]


def weights(name: str, outputs: list) -> list:
    """The loss weights of a case's output leaves (None for non-float ones)."""
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    return [rng.normal(size=np.shape(o)).astype(np.float32) if np.asarray(o).dtype.kind == "f" else None
            for o in outputs]


_SCRIPT = r"""
import json, sys
import numpy as np, jax, jax.numpy as jnp, keras
sys.path.insert(0, sys.argv[2])
import keras_callables as kc
work = sys.argv[1]
r = dict(np.load(f"{work}/weights.npz"))
out, status = {}, {}
for name, (fn, names, grad) in kc.cases(keras.ops).items():
    try:
        args = [jnp.asarray(kc.INPUTS[n]) for n in names]
        for j, leaf in enumerate(kc.leaves(jax.jit(fn)(*args))):  # one compilation per case, not per op
            out[f"{name}/value/{j}"] = np.asarray(leaf)
        if grad:
            def loss(*g):
                a = list(args)
                for i, v in zip(grad, g):
                    a[i] = v
                return sum(jnp.sum(leaf * r[f"{name}/{j}"]) for j, leaf in enumerate(kc.leaves(fn(*a)))
                           if f"{name}/{j}" in r)
            grads = jax.jit(jax.grad(loss, argnums=tuple(range(len(grad)))))(*[args[i] for i in grad])
            for i, g in zip(grad, grads):
                out[f"{name}/grad/{i}"] = np.asarray(g)
        status[name] = "ok"
    except Exception as exc:
        status[name] = f"{type(exc).__name__}: {str(exc)[:300]}"
np.savez(f"{work}/out.npz", **out)
json.dump(status, open(f"{work}/status.json", "w"))
"""


@functools.lru_cache(maxsize=1)
def results() -> "tuple[dict, dict]":
    """``(status, arrays)`` from real Keras on JAX: ``arrays["<case>/value/<j>"]`` and
    ``["<case>/grad/<i>"]``. Skips the calling test when Keras or JAX is not installed."""
    import importlib.util

    import pytest

    if any(importlib.util.find_spec(m) is None for m in ("keras", "jax")):
        pytest.skip("real Keras 3 with JAX is not installed (test extra)")
    import dnnbind.ops as ops

    with tempfile.TemporaryDirectory() as work:
        r = {}
        for name, (fn, names, grad) in cases(ops).items():
            if grad:
                for j, w in enumerate(weights(name, leaves(fn(*[INPUTS[n] for n in names])))):
                    if w is not None:
                        r[f"{name}/{j}"] = w
        np.savez(os.path.join(work, "weights.npz"), **r)
        env = {k: v for k, v in os.environ.items() if k != "KERAS_HOME"}
        env.update(KERAS_HOME=os.path.join(work, "keras_home"), KERAS_BACKEND="jax", JAX_PLATFORMS="cpu")
        proc = subprocess.run([sys.executable, "-c", _SCRIPT, work, os.path.dirname(os.path.abspath(__file__))],
                              capture_output=True, text=True, env=env, timeout=600)
        assert proc.returncode == 0, f"the Keras side failed:\n{proc.stderr[-4000:]}"
        with open(os.path.join(work, "status.json")) as f:
            status = json.load(f)
        return status, dict(np.load(os.path.join(work, "out.npz")))


def compare(name: str, rtol: float = 1e-4, atol: float = 1e-5) -> list:
    """Check the dnnbind values and gradients of case ``name`` against Keras's; returns dnnbind's leaves."""
    import dnnbind.ops as ops
    from dnnbind.autodiff import GradientTape

    status, theirs = results()
    assert status[name] == "ok", f"{name}: Keras failed: {status[name]}"
    fn, names, grad = cases(ops)[name]
    args = [ops.convert_to_tensor(INPUTS[n]) for n in names]
    with GradientTape() as tape:
        for i in grad:
            tape.watch(args[i])
        outs = leaves(fn(*args))
        total = None
        for j, (o, w) in enumerate(zip(outs, weights(name, outs))):
            if w is not None:
                term = ops.sum(ops.multiply(o, w))
                total = term if total is None else ops.add(total, term)
    for j, o in enumerate(outs):
        want = theirs[f"{name}/value/{j}"]
        got = np.asarray(o)
        assert got.shape == want.shape and got.dtype == want.dtype, \
            f"{name}: output {j} is {got.shape} {got.dtype}, Keras {want.shape} {want.dtype}"
        if name != "eig":
            np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, err_msg=f"{name}: output {j}")
    if grad:
        grads = tape.gradient(total, [args[i] for i in grad])
        for i, g in zip(grad, grads):
            want = theirs[f"{name}/grad/{i}"]
            got = np.zeros_like(want) if g is None else np.asarray(g)
            np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, err_msg=f"{name}: gradient of input {i}")
    return outs
