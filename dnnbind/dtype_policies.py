"""``keras.dtype_policies``: ``DTypePolicy`` / ``FloatDTypePolicy`` (dnnbind's :class:`dnnbind.mixed_precision.Policy`),
``DTypePolicyMap``, ``get``, ``serialize``, ``deserialize``.

dnnbind has float policies only (``float32``, ``float16``, ``bfloat16``, ``float64``, ``mixed_float16``,
``mixed_bfloat16``); Keras's quantized policies (``int8_from_float32``, ...) are refused by name (dnnbind
quantizes through :mod:`dnnbind.quantizers` and ``Model.quantize`` instead). A leaf over
:mod:`dnnbind.mixed_precision`.
"""

from __future__ import annotations

import re
from collections.abc import MutableMapping
from typing import Any

from . import _keras_objects
from .mixed_precision import Policy, global_policy

__all__ = ["DTypePolicy", "FloatDTypePolicy", "DTypePolicyMap", "get", "serialize", "deserialize"]

DTypePolicy = Policy
FloatDTypePolicy = Policy


def get(identifier: Any) -> Policy:
    """A policy from a name, a policy, or a serialized dict (None: the global policy)."""
    if identifier is None:
        return global_policy()
    if isinstance(identifier, (Policy, DTypePolicyMap)):
        return identifier
    if isinstance(identifier, dict):
        return deserialize(identifier)
    if isinstance(identifier, str):
        try:
            return Policy(identifier)
        except ValueError:
            raise ValueError(f"Cannot interpret `dtype` argument. Expected a string or an instance of DTypePolicy. "
                             f"Received: dtype={identifier!r} (dnnbind has the float policies float32, float16, "
                             "bfloat16, float64, mixed_float16, mixed_bfloat16)") from None
    raise ValueError(f"Cannot interpret `dtype` argument. Expected a string or an instance of DTypePolicy. "
                     f"Received: dtype={identifier!r}")


def serialize(dtype_policy: Any) -> dict:
    """Keras's dict of a policy: ``{"module": "keras", "class_name": "DTypePolicy", "config": {"name": ...}, ...}``."""
    if isinstance(dtype_policy, DTypePolicyMap):
        return {"module": "keras.dtype_policies", "class_name": "DTypePolicyMap",
                "config": dtype_policy.get_config(), "registered_name": None}
    if not isinstance(dtype_policy, Policy):
        raise TypeError(f"dtype_policies.serialize: expected a DTypePolicy, got {type(dtype_policy).__name__}")
    return {"module": "keras", "class_name": "DTypePolicy", "config": {"name": dtype_policy.name},
            "registered_name": None}


def deserialize(config: Any, custom_objects: "dict | None" = None) -> Any:
    """A policy (or ``DTypePolicyMap``) from :func:`serialize`'s dict or a name."""
    if isinstance(config, str):
        return get(config)
    if not isinstance(config, dict) or not isinstance(config.get("class_name"), str):
        raise TypeError(f"dtype_policies.deserialize: expected a dict with 'class_name' and 'config', got {config!r}")
    class_name, inner = config["class_name"], config.get("config") or {}
    user = _keras_objects.find_custom_class(class_name, config.get("registered_name"), custom_objects) \
        if config.get("registered_name") else None
    if user is not None:
        return user.from_config(inner)
    if class_name == "DTypePolicyMap":
        return DTypePolicyMap.from_config(inner)
    if class_name in ("DTypePolicy", "FloatDTypePolicy", "Policy"):
        return get(inner.get("name"))
    raise ValueError(f"dtype_policies.deserialize: dtype policy {class_name!r} is not supported (dnnbind has float "
                     "policies only: DTypePolicy, FloatDTypePolicy, DTypePolicyMap)")


class DTypePolicyMap(MutableMapping):
    """Keras's map from layer paths to policies: an exact path first, else the one key that ``re.fullmatch``es
    the path (two matching patterns: ValueError), else ``default_policy`` (None: the global policy)."""

    def __init__(self, default_policy: Any = None, policy_map: "dict | None" = None) -> None:
        if isinstance(default_policy, DTypePolicyMap):
            raise ValueError("`default_policy` cannot be a `DTypePolicyMap`.")
        if policy_map is not None and not isinstance(policy_map, dict):
            raise TypeError(f"If specified, `policy_map` must be a dict. Received: policy_map={policy_map} of type "
                            f"{type(policy_map)}")
        self._default_policy_arg = default_policy
        self._default_policy = get(default_policy) if default_policy is not None else None
        self._policy_map = {k: get(v) for k, v in (policy_map or {}).items()}

    @property
    def default_policy(self) -> Policy:
        return self._default_policy if self._default_policy is not None else global_policy()

    @property
    def name(self) -> str:
        return f"map_{self.default_policy.name}"

    @property
    def compute_dtype(self) -> str:
        return self.default_policy.compute_dtype

    @property
    def variable_dtype(self) -> str:
        return self.default_policy.variable_dtype

    def __getitem__(self, key: str) -> Policy:
        if key in self._policy_map:
            return self._policy_map[key]
        matches = [k for k in self._policy_map if re.fullmatch(k, key)]
        if len(matches) > 1:
            raise ValueError(f"Path '{key}' matches multiple dtype policy specification keys: {matches}. Please make "
                             "sure each path only matches at most one dtype policy specification key in the "
                             "DTypePolicyMap.")
        return self._policy_map[matches[0]] if matches else self.default_policy

    def __setitem__(self, key: str, policy: Any) -> None:
        if key in self._policy_map:
            raise ValueError(f"{key} already exist in the DTypePolicyMap with value {self._policy_map[key]}. Please "
                             "make sure to not use duplicated keys.")
        self._policy_map[key] = get(policy)

    def __delitem__(self, key: str) -> None:
        del self._policy_map[key]

    def __contains__(self, key: object) -> bool:
        return key in self._policy_map

    def __iter__(self):
        return iter(self._policy_map)

    def __len__(self) -> int:
        return len(self._policy_map)

    def __repr__(self) -> str:
        return f"<DTypePolicyMap at {hex(id(self))}>"

    def get_config(self) -> dict:
        default = self._default_policy_arg
        if isinstance(default, Policy):
            default = serialize(default)
        return {"default_policy": default, "policy_map": {k: serialize(v) for k, v in self._policy_map.items()}}

    @classmethod
    def from_config(cls, config: dict, custom_objects: "dict | None" = None) -> "DTypePolicyMap":
        config = dict(config)
        default = config.get("default_policy")
        if isinstance(default, dict):
            default = deserialize(default, custom_objects)
        policy_map = {k: deserialize(v, custom_objects) for k, v in (config.get("policy_map") or {}).items()}
        return cls(default, policy_map)
