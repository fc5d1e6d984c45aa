"""Helpers shared by the tests: tolerances, relative error, finite differences, poisoning."""

from __future__ import annotations

from typing import Callable

import numpy as np

# Relative-error tolerances, by the precision the op computed in.
TOLERANCE = {
    "float64": 1e-9,
    "float32": 1e-5,   # fp32 with TF32 off: far under 1e-4
    "tf32": 2e-3,      # fp32 inputs, TF32 tensor-op math
    "float16": 1e-2,
    "bfloat16": 2e-2,
}

POISON = float("nan")


def rel_error(actual, expected) -> float:
    """||actual - expected|| / ||expected|| in float64 (inf when actual has NaN)."""
    a = np.asarray(actual, dtype=np.float64)
    e = np.asarray(expected, dtype=np.float64)
    assert a.shape == e.shape, f"shape {a.shape} != expected {e.shape}"
    if not np.all(np.isfinite(a)):
        return float("inf")
    denom = np.linalg.norm(e.ravel())
    return float(np.linalg.norm((a - e).ravel()) / (denom if denom > 0 else 1.0))


def assert_close(actual, expected, tol: float, what: str = "") -> None:
    err = rel_error(actual, expected)
    assert err <= tol, f"{what} relative error {err:.3e} > {tol:.1e}"


def numerical_grad(f: Callable[[], float], x: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """Central finite differences of the scalar ``f()`` w.r.t. ``x`` (modified in place, restored)."""
    grad = np.zeros_like(x, dtype=np.float64)
    flat = x.reshape(-1)
    g = grad.reshape(-1)
    for i in range(flat.size):
        old = flat[i]
        flat[i] = old + eps
        plus = f()
        flat[i] = old - eps
        minus = f()
        flat[i] = old
        g[i] = (plus - minus) / (2 * eps)
    return grad


def random(rng: np.random.Generator, shape, dtype=np.float64, low=-1.0, high=1.0) -> np.ndarray:
    """Uniform random data that is never all zero."""
    x = rng.uniform(low, high, size=shape).astype(dtype)
    if x.size and not np.any(x):
        x.flat[0] = 1
    return x


class FakeStream:
    """A stand-in for dnnbind.cuda.Stream in CPU tests of the per-shape path choices: device 0, and a
    capture flag the test sets."""

    device_index = 0

    def __init__(self):
        self.capturing = False

    def is_capturing(self):
        return self.capturing


def layer_grad_check(layer, x: np.ndarray, tol: float = 1e-6, seed: int = 0) -> None:
    """A float64 layer's analytic dx and weight gradients vs central differences of ``sum(y * r)``."""
    rng = np.random.default_rng(seed)
    y = layer.forward(x, training=True)
    r = rng.normal(size=y.shape)
    dx = layer.backward(r)
    grads = {k: np.array(v) for k, v in layer.grads.items()}

    def f():
        return float((layer.forward(x, training=False) * r).sum())

    assert rel_error(dx, numerical_grad(f, x)) < tol
    assert set(grads) == {w.name for w in layer.trainable_weights}
    for w in layer.trainable_weights:
        assert rel_error(grads[w.name], numerical_grad(f, w.value)) < tol, w.name


def fit_on_gpu(build, x, y, policy: str, jit_compile, **config) -> "tuple[list, list]":
    """Build a model with ``build(device)`` under the dtype ``policy`` on the GPU, fit it on (x, y) for one
    epoch of 16-sample batches (SGD with momentum) with ``kernels.config.override(**config)``, and return the
    weights before and after. A captured step (``jit_compile="auto"``) must capture and replay, with no
    "could not be captured" warning. The float32 policy is restored."""
    import warnings

    import dnnbind as keras
    from dnnbind import mixed_precision, kernels

    mixed_precision.set_global_policy(policy)
    try:
        model = build(keras.Device("cuda"))
        start = [w.copy() for w in model.get_weights()]
        model.compile(keras.optimizers.SGD(0.05, momentum=0.9), "sparse_categorical_crossentropy",
                      jit_compile=jit_compile)
        with kernels.config.override(**config), warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            model.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0)
    finally:
        mixed_precision.set_global_policy("float32")
    assert not [w for w in caught if "could not be captured" in str(w.message)], [str(w.message) for w in caught]
    if jit_compile == "auto":
        stats = model._step_graphs.stats
        assert stats["captures"] >= 1 and stats["replays"] >= 1 and stats["failures"] == 0, stats
    return start, model.get_weights()


class TapedStep:
    """A model's training forward recorded on a tape, and its backward from given output gradients: what a
    train step does, without the loss and the optimizer (the op-level engine's view of the old
    ``_run_forward`` / ``_run_backward`` pair). ``backward`` returns ``{(layer name, weight name): grad}``."""

    def __init__(self, model, xs, logits=None):
        from dnnbind.autodiff import GradientTape
        from dnnbind.layers.base import pending_mark

        self.model = model
        self.mark = pending_mark()
        self.tape = GradientTape()
        with self.tape:
            self.outs = model._run_forward(list(xs), training=True,
                                           logits=list(logits) if logits is not None else [False] * len(xs))
        self.out = self.outs[0]
        self.until = pending_mark()

    def backward(self, douts, on_leaf=None):
        from dnnbind.autodiff import engine
        from dnnbind.layers.base import release_pending_state
        from dnnbind.ops import convert_to_tensor

        variables = self.model.trainable_weights
        seeds = [convert_to_tensor(d) for d in douts]
        try:
            grads = engine.gradient(self.outs, seeds, variables, tape=self.tape, on_leaf=on_leaf)
        finally:
            release_pending_state(self.mark, self.until)
        return {(w.layer.name, w.name): (None if g is None else np.asarray(g)) for w, g in zip(variables, grads)}


def bar_digits(n: int, rng: np.random.Generator) -> "tuple[np.ndarray, np.ndarray]":
    """MNIST-shaped stand-ins for the keras.io ports, ``(uint8 images (n, 28, 28), uint8 labels (n,))``: each
    class 0..9 draws its own horizontal and vertical bar (scaled by a random brightness), plus noise."""
    templates = np.zeros((10, 28, 28), np.float32)
    for k in range(10):
        templates[k, 2 + 2 * k: 5 + 2 * k, 3:25] = 1.0
        templates[k, 3:25, 2 + 2 * k: 5 + 2 * k] = 1.0
    labels = rng.integers(0, 10, n).astype(np.uint8)
    x = templates[labels] * rng.uniform(0.7, 1.0, (n, 1, 1)) + rng.uniform(0, 0.2, (n, 28, 28))
    return (np.clip(x, 0, 1) * 255).astype(np.uint8), labels
