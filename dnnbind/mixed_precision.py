"""Mixed precision policies, as ``keras.mixed_precision``.

A policy names the dtype layers compute in and the dtype their variables are
stored in. ``"mixed_bfloat16"`` and ``"mixed_float16"`` compute in 16 bits on
Tensor Cores while keeping float32 master weights (and float32 BatchNorm
statistics and final logits/loss); ``"mixed_float16"`` also turns on dynamic
loss scaling in ``Sequential.compile`` (Keras's LossScaleOptimizer rules: initial scale 2**15,
halved and the step skipped on non-finite gradients, doubled after 2000 finite steps; the
bookkeeping lives in ``dnnbind.models`` and stays on the device). On the NumPy backend layers compute in
float32 whatever the policy says (NumPy has no fast 16-bit math).
"""

from __future__ import annotations

__all__ = ["Policy", "set_global_policy", "global_policy", "DTypePolicy", "dtype_policy", "set_dtype_policy",
           "LossScaleOptimizer"]

_KNOWN = {
    "float32": ("float32", "float32"),
    "float16": ("float16", "float16"),
    "bfloat16": ("bfloat16", "bfloat16"),
    "float64": ("float64", "float64"),
    "mixed_float16": ("float16", "float32"),
    "mixed_bfloat16": ("bfloat16", "float32"),
}


class Policy:
    """A dtype policy: ``Policy("mixed_bfloat16").compute_dtype == "bfloat16"``."""

    def __init__(self, name: "str | Policy" = "float32") -> None:
        if isinstance(name, Policy):
            name = name.name
        if name not in _KNOWN:
            raise ValueError(f"unknown dtype policy {name!r}; known: {', '.join(_KNOWN)}")
        self.name = name
        self.compute_dtype, self.variable_dtype = _KNOWN[name]

    @property
    def is_mixed(self) -> bool:
        return self.compute_dtype != self.variable_dtype

    @property
    def needs_loss_scaling(self) -> bool:
        return self.compute_dtype == "float16"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Policy) and other.name == self.name

    def __hash__(self) -> int:
        return hash(self.name)

    def __repr__(self) -> str:
        return f'<DTypePolicy "{self.name}">'

    def get_config(self) -> dict:
        return {"name": self.name}


DTypePolicy = Policy

_global = Policy("float32")


def set_global_policy(policy: "str | Policy") -> None:
    """Set the policy that layers created from now on use."""
    global _global
    _global = Policy(policy)


def global_policy() -> Policy:
    return _global


def dtype_policy() -> Policy:
    """The global dtype policy (Keras's ``mixed_precision.dtype_policy``, also ``keras.config.dtype_policy``)."""
    return _global


def set_dtype_policy(policy: "str | Policy") -> None:
    """Set the global dtype policy (Keras's ``mixed_precision.set_dtype_policy``)."""
    if not isinstance(policy, (str, Policy)):
        raise ValueError("Invalid `policy` argument. Expected the string name of a policy (such as 'mixed_float16') "
                         f"or a `DTypePolicy` instance. Received: policy={policy!r} (of type {type(policy)})")
    set_global_policy(policy)


def __getattr__(name: str):
    # keras.mixed_precision.LossScaleOptimizer is dnnbind.optimizers.LossScaleOptimizer. This module is a leaf
    # that the layers import, so the optimizers (above it) are looked up by name on first use, not imported
    # here; dnnbind.optimizers never imports this module back.
    if name == "LossScaleOptimizer":
        import importlib
        return importlib.import_module("dnnbind.optimizers").LossScaleOptimizer
    raise AttributeError(f"module 'dnnbind.mixed_precision' has no attribute {name!r}")
