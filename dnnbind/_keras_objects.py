"""Keras 3's serialized form of configurable objects (``keras.saving.serialize_keras_object``), shared by
``keras.regularizers``, ``keras.constraints`` and ``keras.activations``.

A built-in object serializes as ``{"module": "keras.<namespace>", "class_name": ..., "config": ...,
"registered_name": None}``, one of the user's classes with ``"module": None`` and ``"registered_name"``
its class name, as Keras writes them; reading accepts those, the bare ``{"class_name", "config"}`` form
and a name. A shared leaf (standard library only).
"""

from __future__ import annotations

import inspect
from typing import Any


def serialize_object(obj: Any, builtin_module: str) -> dict:
    """``obj``'s Keras dict; ``builtin_module`` (``"keras.regularizers"``) for the classes dnnbind defines."""
    cls = type(obj)
    builtin = cls.__module__.startswith("dnnbind.")
    return {"module": builtin_module if builtin else None, "class_name": cls.__name__, "config": obj.get_config(),
            "registered_name": None if builtin else cls.__name__}


def deserialize_object(config: Any, module_objects: dict, custom_objects: "dict | None", kind: str) -> Any:
    """The object a Keras dict (or a bare name) describes: a name looked up in ``custom_objects`` first,
    then in ``module_objects`` (a class is instantiated with its defaults); a dict's class made with
    ``from_config(config["config"])``."""
    custom = custom_objects or {}
    if isinstance(config, str):
        obj = custom.get(config, module_objects.get(config))
        if obj is None:
            raise ValueError(f"Unknown {kind} {config!r}; known: {', '.join(sorted(module_objects))} (pass "
                             f"custom_objects={{name: class}} for your own)")
        return obj() if inspect.isclass(obj) else obj
    if not isinstance(config, dict) or not isinstance(config.get("class_name"), str):
        raise ValueError(f"Could not interpret serialized {kind}: {config!r} (expected a name or a dict with "
                         "'class_name' and 'config')")
    class_name = config["class_name"]
    registered = config.get("registered_name") or class_name
    module = config.get("module")
    cls = custom.get(registered, custom.get(class_name))
    builtin = str(module).startswith(("keras", "dnnbind")) or module is None and config.get("registered_name") is None
    if cls is None and builtin:
        cls = module_objects.get(class_name)
    if cls is None:
        raise TypeError(f"Cannot deserialize object of type `{class_name}`. If `{class_name}` is a custom class, "
                        f"pass it as custom_objects={{'{registered}': {class_name}}}")
    inner = config.get("config") or {}
    if hasattr(cls, "from_config"):
        return cls.from_config(inner)
    return cls(**inner)


def get_object(identifier: Any, module_objects: dict, kind: str) -> Any:
    """Keras's ``get`` of regularizers and constraints: None for None, an object from a name or a dict, a
    class instantiated with its defaults, any other callable as it is."""
    if identifier is None:
        return None
    if isinstance(identifier, dict):
        obj = deserialize_object(identifier, module_objects, None, kind)
    elif isinstance(identifier, str):
        obj = module_objects.get(identifier)
    else:
        obj = identifier
    if callable(obj):
        return obj() if inspect.isclass(obj) else obj
    raise ValueError(f"Could not interpret {kind} identifier: {identifier}")
