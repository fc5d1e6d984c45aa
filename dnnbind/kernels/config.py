"""Global switches of the ops (read by the CUDA implementations; the NumPy backend ignores them).

``allow_tf32``
    fp32 convolutions and GEMMs may use TF32 tensor-op math (about 1e-3 relative error).
``deterministic``
    only deterministic cuDNN algorithms, so repeated runs are bitwise equal.
``benchmark``
    run ``cudnnFind*AlgorithmEx`` once per shape key instead of the ``_v7`` heuristics.
``workspace_limit``
    the most workspace bytes an algorithm may use (``None``: no cap).
``fused_graphs``
    let ops run cuDNN graph-API plans where one builds (``kernels/_cuda/fused.py``: conv + bias +
    activation; ``kernels/_cuda/conv_graph.py``: the plain convolutions; ``kernels/_cuda/conv_bn.py``: conv +
    batch-norm statistics, and the backward of conv(relu(batch norm))); False keeps the legacy calls only.
``fuse_layers``
    let a layer chain (``models/chain.py``: a ``Sequential``'s or a functional model's runs of dnnbind's layers)
    fuse adjacent layers in training forwards: a ``BatchNormalization`` followed
    by a plain relu (``Activation("relu")`` / ``ReLU()``) runs as one batch-norm op with
    ``activation="relu"`` (on CUDA's channels-last path one cuDNN call each way); a plain ``Conv2D``
    (no bias, linear) followed by a ``BatchNormalization`` runs as ``conv2d_batchnorm_forward_training``,
    and such a convolution after a batch norm + relu runs its backward through them as
    ``batchnorm_relu_conv2d_backward``. The same numbers as unfused (NumPy: bitwise; CUDA: within the
    dtype's rounding, except that the conv + batch-norm graph path takes the variance as E[y^2] - mean^2
    from float32 sums, as cuDNN's bn_finalize does, which loses digits when a channel's |mean| is many
    times its standard deviation); False runs every layer on its own.

Read them as module attributes (``config.allow_tf32``) or with :func:`get`; change them
by assignment or temporarily with ``with config.override(allow_tf32=False): ...``.

:func:`capture_key` is everything that changes which kernels a step launches: these settings
and the module switches that implementations register with :func:`register_switches` (batch
norm's path switches). Captured step graphs are keyed by it, so flipping any of them captures
anew instead of replaying a stale graph.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from typing import Any, Callable, Iterator

__all__ = ["allow_tf32", "deterministic", "benchmark", "workspace_limit", "fused_graphs", "fuse_layers", "get",
           "override", "capture_key", "register_switches"]

allow_tf32: bool = True
deterministic: bool = False
benchmark: bool = False
workspace_limit: "int | None" = None
fused_graphs: bool = True
fuse_layers: bool = True

_NAMES = ("allow_tf32", "deterministic", "benchmark", "workspace_limit", "fused_graphs", "fuse_layers")
_lock = threading.RLock()
_module = sys.modules[__name__]


_switches: "dict[str, Callable[[], tuple]]" = {}


def register_switches(owner: str, snapshot: "Callable[[], tuple]") -> None:
    """Make ``snapshot()`` (a hashable tuple of ``owner``'s module switches) part of :func:`capture_key`."""
    _switches[owner] = snapshot


def capture_key() -> tuple:
    """The settings and registered switches, as one hashable tuple (cheap: read before every step)."""
    key = (allow_tf32, deterministic, benchmark, workspace_limit, fused_graphs, fuse_layers)
    if _switches:
        key += tuple((owner, snapshot()) for owner, snapshot in _switches.items())
    return key


def _check(name: str, value: Any) -> Any:
    if name not in _NAMES:
        raise AttributeError(f"dnnbind.kernels.config has no setting {name!r}; settings: {', '.join(_NAMES)}")
    if name == "workspace_limit":
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
            raise ValueError(f"workspace_limit must be None or a number of bytes >= 0, got {value!r}")
        return value
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, got {value!r}")
    return value


def get(name: "str | None" = None) -> Any:
    """One setting by name, or all of them as a dict."""
    if name is None:
        return {key: getattr(_module, key) for key in _NAMES}
    if name not in _NAMES:
        raise AttributeError(f"dnnbind.kernels.config has no setting {name!r}; settings: {', '.join(_NAMES)}")
    return getattr(_module, name)


@contextlib.contextmanager
def override(**settings: Any) -> Iterator[None]:
    """Change settings inside a ``with`` block and restore the previous values on exit.

    The settings are process-wide (cuDNN algorithm choice is per process), so
    an override in one thread is seen by the others while it lasts.
    """
    checked = {name: _check(name, value) for name, value in settings.items()}
    with _lock:
        saved = {name: getattr(_module, name) for name in checked}
        for name, value in checked.items():
            setattr(_module, name, value)
    try:
        yield
    finally:
        with _lock:
            for name, value in saved.items():
                setattr(_module, name, value)
