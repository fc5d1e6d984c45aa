"""``keras.config``: the global settings of Keras 3.15.1, every public name.

* ``floatx`` / ``epsilon`` / ``image_data_format`` and their setters, and ``backend()``: those of
  :mod:`dnnbind.backend` (``keras.backend`` has the same functions).
* ``dtype_policy`` / ``set_dtype_policy``: the global :mod:`dnnbind.mixed_precision` policy.
* ``max_epochs`` / ``max_steps_per_epoch`` (read from ``KERAS_MAX_EPOCHS`` / ``KERAS_MAX_STEPS_PER_EPOCH``
  at import, as Keras does) and their setters: caps for ``fit`` (Keras applies them in its trainer).
* switches kept as state, as Keras keeps them: interactive logging (progress bars on stdout),
  traceback filtering, flash attention (None: "when available", Keras's default), unsafe
  deserialization. ``keras.backend.clear_session()`` returns them to their defaults, as in Keras.
* ``is_nnx_enabled()`` is False (Flax NNX is a JAX-backend feature) and ``set_backend`` accepts only
  ``"dnnbind"``: dnnbind is its own backend (choose a device with ``dnnbind.set_default_device``).
"""

from __future__ import annotations

import os
from typing import Any

from . import backend as _backend
from . import mixed_precision
from .backend import (backend, epsilon, floatx, image_data_format, set_epsilon, set_floatx,  # noqa: F401
                      set_image_data_format)

__all__ = [
    "backend", "disable_flash_attention", "disable_interactive_logging", "disable_traceback_filtering",
    "dtype_policy", "enable_flash_attention", "enable_interactive_logging", "enable_traceback_filtering",
    "enable_unsafe_deserialization", "epsilon", "floatx", "image_data_format", "is_flash_attention_enabled",
    "is_interactive_logging_enabled", "is_nnx_enabled", "is_traceback_filtering_enabled", "max_epochs",
    "max_steps_per_epoch", "set_backend", "set_dtype_policy", "set_epsilon", "set_floatx",
    "set_image_data_format", "set_max_epochs", "set_max_steps_per_epoch",
]

_DEFAULTS = {"interactive_logging": True, "traceback_filtering": True, "flash_attention": None, "safe_mode": None}
_state: dict[str, Any] = dict(_DEFAULTS)


def _env_int(name: str) -> "int | None":
    value = os.environ.get(name)
    return int(value) if value else None


_max_epochs: "int | None" = _env_int("KERAS_MAX_EPOCHS")
_max_steps_per_epoch: "int | None" = _env_int("KERAS_MAX_STEPS_PER_EPOCH")


def _reset() -> None:
    _state.clear()
    _state.update(_DEFAULTS)


_backend.on_clear_session(_reset)


# ----- dtype policy -------------------------------------------------------------------------------------
def dtype_policy() -> mixed_precision.Policy:
    """The global dtype policy (``keras.config.dtype_policy``; ``mixed_precision.global_policy``)."""
    return mixed_precision.global_policy()


def set_dtype_policy(policy: "str | mixed_precision.Policy") -> None:
    """Set the global dtype policy: ``"float32"``, ``"mixed_float16"``, ``"mixed_bfloat16"``... or a
    ``DTypePolicy`` (``keras.config.set_dtype_policy``; ``mixed_precision.set_global_policy``)."""
    if not isinstance(policy, (str, mixed_precision.Policy)):
        raise ValueError("Invalid `policy` argument. Expected the string name of a policy (such as "
                         f"'mixed_float16') or a `DTypePolicy` instance. Received: policy={policy!r} "
                         f"(of type {type(policy)})")
    mixed_precision.set_global_policy(policy)


# ----- fit caps -----------------------------------------------------------------------------------------
def max_epochs() -> "int | None":
    """The most epochs ``fit`` runs, whatever its ``epochs`` (None: no cap; ``keras.config.max_epochs``)."""
    return _max_epochs


def set_max_epochs(max_epochs: "int | None") -> None:
    """Cap the epochs of every ``fit`` (None removes the cap), e.g. for quick runs of a whole script."""
    global _max_epochs
    _max_epochs = max_epochs


def max_steps_per_epoch() -> "int | None":
    """The most steps one epoch of ``fit`` runs (None: no cap; ``keras.config.max_steps_per_epoch``)."""
    return _max_steps_per_epoch


def set_max_steps_per_epoch(max_steps_per_epoch: "int | None") -> None:
    """Cap the steps of every epoch of ``fit`` (None removes the cap)."""
    global _max_steps_per_epoch
    _max_steps_per_epoch = max_steps_per_epoch


# ----- switches -----------------------------------------------------------------------------------------
def enable_interactive_logging() -> None:
    """Progress bars and logs go to stdout (the default)."""
    _state["interactive_logging"] = True


def disable_interactive_logging() -> None:
    """Progress output goes to Python's ``logging`` instead of stdout (Keras's absl logging)."""
    _state["interactive_logging"] = False


def is_interactive_logging_enabled() -> bool:
    return _state["interactive_logging"]


def enable_traceback_filtering() -> None:
    """Keras's traceback filtering switch (on by default). dnnbind raises its errors from short call
    stacks and filters nothing; the switch is kept for scripts that set and read it."""
    _state["traceback_filtering"] = True


def disable_traceback_filtering() -> None:
    """See :func:`enable_traceback_filtering`."""
    _state["traceback_filtering"] = False


def is_traceback_filtering_enabled() -> bool:
    return _state["traceback_filtering"]


def enable_flash_attention() -> None:
    """Let attention layers use a flash-attention kernel where one applies (Keras stores None: "when
    available", its default)."""
    _state["flash_attention"] = None


def disable_flash_attention() -> None:
    """Keep attention layers on the plain computation."""
    _state["flash_attention"] = False


def is_flash_attention_enabled() -> "bool | None":
    """None (the default: used when available) or False (disabled), as Keras returns."""
    return _state["flash_attention"]


def enable_unsafe_deserialization() -> None:
    """Allow loading what can run arbitrary code (Keras's ``lambda`` layers and functions). dnnbind loads
    no such objects; the switch is kept for scripts that set it (see :func:`in_safe_mode`)."""
    _state["safe_mode"] = False


def in_safe_mode() -> "bool | None":
    """False after :func:`enable_unsafe_deserialization`, else None (safe by default), as Keras's
    ``serialization_lib.in_safe_mode``."""
    return _state["safe_mode"]


def is_nnx_enabled() -> bool:
    """False: Flax NNX integration belongs to Keras's JAX backend."""
    return False


def set_backend(backend: str) -> None:
    """Keras switches its backend framework here; dnnbind is its own backend, so only ``"dnnbind"`` is
    accepted (a no-op). Choose CPU or GPU with ``dnnbind.set_default_device``."""
    if backend != "dnnbind":
        raise ValueError(f"set_backend({backend!r}): dnnbind is its own Keras backend and cannot switch to another; "
                         "choose a device with dnnbind.set_default_device('cpu' | 'cuda')")
