"""Shared test set-up: the `gpu` marker skips (with the reason) when no usable GPU exists."""

from __future__ import annotations

import os

# One BLAS thread per test process, set before NumPy loads OpenBLAS (it reads these once, at load): with
# pytest-xdist's one worker per core, a multi-threaded BLAS in every worker only oversubscribes the cores.
# A value already in the environment wins.
for _name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"):
    os.environ.setdefault(_name, "1")

import numpy as np  # noqa: E402 - after the thread settings above
import pytest


def _gpu_reason() -> str | None:
    try:
        from dnnbind import cuda
    except Exception as exc:  # pragma: no cover - import problems are reported by other tests
        return f"dnnbind.cuda cannot be imported: {exc}"
    if cuda.is_available():
        return None
    return f"needs an NVIDIA GPU: {cuda.unavailable_reason()}"


def pytest_collection_modifyitems(config, items):
    if not any("gpu" in item.keywords for item in items):
        return
    reason = _gpu_reason()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=reason)
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def rng():
    """A seeded generator; tests draw fresh random (never all-zero) data from it."""
    return np.random.default_rng(1234)


@pytest.fixture
def cpu():
    """The NumPy backend for the test, then the default device and the float32 policy back."""
    import dnnbind
    from dnnbind import mixed_precision

    dnnbind.set_default_device("cpu")
    yield
    dnnbind.set_default_device(None)
    mixed_precision.set_global_policy("float32")
