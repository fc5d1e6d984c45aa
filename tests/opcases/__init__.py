"""Test cases of every registered ``keras.ops`` op, one module per family (``elementwise.py``, ...).

Each family module defines ``CASES``: a list of :class:`Case`. ``tests/test_ops_registry.py`` collects
them all and checks, for every op in ``dnnbind.ops._core.REGISTRY``:

* that it has at least one case (a new op without cases fails CI);
* its NumPy-backend forward against ``ref`` (a NumPy function of the case's NumPy arguments), when given;
* for a differentiable op, its tape gradient against central finite differences in float64;
* against real Keras 3 (JAX backend, in a subprocess; values and ``jax.grad`` gradients) when the
  case is ``keras=True`` (the default) and Keras runs in CI;
* on the GPU, per dtype, against the NumPy backend (``tests/test_ops_registry_gpu.py``).

Arguments are specs, made into data per test: :func:`A` (a random array, never all zero), plain
Python values, or :func:`I` (a random integer array).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

import numpy as np


@dataclasses.dataclass(frozen=True)
class A:
    """A random float array spec: uniform in [low, high) (``positive`` shifts away from 0)."""

    shape: tuple
    low: float = -1.0
    high: float = 1.0
    dtype: str = "float64"

    def make(self, rng: np.random.Generator, dtype: "str | None" = None) -> np.ndarray:
        x = rng.uniform(self.low, self.high, size=self.shape).astype(dtype or self.dtype)
        if x.size and not np.any(x):
            x.flat[0] = 1
        return x


@dataclasses.dataclass(frozen=True)
class I:  # noqa: E742 (a short name for case tables)
    """A random integer array spec in [low, high)."""

    shape: tuple
    low: int = 0
    high: int = 5
    dtype: str = "int32"

    def make(self, rng: np.random.Generator, dtype: "str | None" = None) -> np.ndarray:
        x = rng.integers(self.low, self.high, size=self.shape).astype(self.dtype)
        if x.size and not np.any(x) and self.high > 1:
            x.flat[0] = 1
        return x


@dataclasses.dataclass(frozen=True)
class B:
    """A random bool array spec (about half true, never all false)."""

    shape: tuple

    def make(self, rng: np.random.Generator, dtype: "str | None" = None) -> np.ndarray:
        x = rng.random(self.shape) < 0.5
        if x.size and not x.any():
            x.flat[0] = True
        return x


@dataclasses.dataclass
class Case:
    """One call of ``op``: ``args``/``kwargs`` (specs or values), ``grad``: the positions of the arguments
    to differentiate (float specs; empty for a non-differentiable call), ``ref``: a NumPy reference
    ``ref(*args, **kwargs)`` on the NumPy data (None: no NumPy reference for this case), ``keras``:
    compare with real Keras 3, ``gpu_dtypes``: the float dtypes the GPU test runs the case in,
    ``tol``: the finite-difference relative tolerance, ``name``: a label for the test id."""

    op: str
    args: tuple = ()
    kwargs: dict = dataclasses.field(default_factory=dict)
    grad: tuple = ()
    ref: "Callable | None" = None
    keras: bool = True
    gpu_dtypes: tuple = ("float32", "float16", "bfloat16", "float64")
    tol: float = 1e-6
    name: str = ""
    keras_kwargs: "dict | None" = None  # what to pass Keras instead of kwargs (dnnbind-only extensions)

    @property
    def label(self) -> str:
        return f"{self.op}-{self.name}" if self.name else self.op

    def make(self, rng: np.random.Generator, dtype: "str | None" = None) -> tuple[list, dict]:
        """The NumPy arguments (float specs in ``dtype`` when given)."""
        def build(v: Any) -> Any:
            if isinstance(v, A):
                return v.make(rng, dtype)
            if isinstance(v, (I, B)):
                return v.make(rng)
            if isinstance(v, list):
                return [build(i) for i in v]
            if isinstance(v, tuple) and any(isinstance(i, (A, I, B)) for i in v):
                return tuple(build(i) for i in v)
            return v
        return [build(a) for a in self.args], {k: build(v) for k, v in self.kwargs.items()}


def all_cases() -> list[Case]:
    """Every family's cases."""
    import importlib
    import pkgutil

    out: list[Case] = []
    for info in pkgutil.iter_modules(__path__):
        module = importlib.import_module(f"{__name__}.{info.name}")
        out.extend(getattr(module, "CASES", []))
    return out
