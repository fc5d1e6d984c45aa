"""Keras 3's serialized form of configurable objects (``keras.saving.serialize_keras_object``), shared by
``keras.regularizers``, ``keras.constraints`` and ``keras.activations``.

A built-in object serializes as ``{"module": "keras.<namespace>", "class_name": ..., "config": ...,
"registered_name": None}``, one of the user's classes with ``"module": None`` and ``"registered_name"``
its class name, as Keras writes them; reading accepts those, the bare ``{"class_name", "config"}`` form
and a name. A shared leaf (standard library only).

It also holds Keras's registry of the user's objects (``keras.saving.register_keras_serializable``,
``get_custom_objects``, ``CustomObjectScope``, ``get_registered_name``/``get_registered_object``), which
every deserialization in dnnbind consults: a name is looked up in the innermost ``CustomObjectScope``
(per thread, as Keras's global state), then in the global dictionary, then in the call's
``custom_objects``, then in the built-in objects.
"""

from __future__ import annotations

import inspect
import threading
from typing import Any

#: ``registered name -> object`` (``"package>Name"`` for the decorated ones; anything the user adds)
GLOBAL_CUSTOM_OBJECTS: dict[str, Any] = {}
#: ``object -> registered name``
GLOBAL_CUSTOM_NAMES: dict[Any, str] = {}
_scope = threading.local()


def _scope_objects() -> dict:
    return getattr(_scope, "objects", None) or {}


class CustomObjectScope:
    """``with CustomObjectScope({"MyLayer": MyLayer}):`` makes those objects known to every
    deserialization inside the block (``load_model``, ``from_config``, ``deserialize_keras_object``,
    ``keras.layers.deserialize`` through a model, ...). The scope replaces the enclosing one, as in Keras."""

    def __init__(self, custom_objects: "dict | None" = None, *more: dict) -> None:
        objects = dict(custom_objects or {})
        for extra in more:  # Keras 2 took several dicts
            objects.update(extra or {})
        for key in objects:
            if not isinstance(key, str):
                raise TypeError(f"CustomObjectScope: custom_objects must map names (str) to objects, got the key "
                                f"{key!r} ({type(key).__name__})")
        self.custom_objects = objects
        self.backup: "dict | None" = None

    def __enter__(self) -> "CustomObjectScope":
        self.backup = dict(_scope_objects())
        _scope.objects = dict(self.custom_objects)
        return self

    def __exit__(self, *exc: Any) -> None:
        _scope.objects = dict(self.backup or {})


custom_object_scope = CustomObjectScope


def get_custom_objects() -> dict:
    """The live global dictionary of registered objects (a scope's objects are not in it), as in Keras."""
    return GLOBAL_CUSTOM_OBJECTS


def register_keras_serializable(package: str = "Custom", name: "str | None" = None):
    """Class or function decorator: register it under ``"package>name"`` (``name`` defaults to its
    ``__name__``), so that saved configs name it and loading finds it without ``custom_objects``. A class
    must have ``get_config``."""
    if not isinstance(package, str) or (name is not None and not isinstance(name, str)):
        raise TypeError(f"register_keras_serializable: package and name must be strings, got package={package!r}, "
                        f"name={name!r}")

    def decorator(arg: Any) -> Any:
        class_name = name if name is not None else arg.__name__
        registered_name = f"{package}>{class_name}"
        if inspect.isclass(arg) and not hasattr(arg, "get_config"):
            raise ValueError("Cannot register a class that does not have a get_config() method.")
        GLOBAL_CUSTOM_OBJECTS[registered_name] = arg
        GLOBAL_CUSTOM_NAMES[arg] = registered_name
        return arg

    return decorator


def get_registered_name(obj: Any) -> str:
    """The name ``obj`` was registered under, else its ``__name__``."""
    try:
        if obj in GLOBAL_CUSTOM_NAMES:
            return GLOBAL_CUSTOM_NAMES[obj]
    except TypeError:  # an unhashable object is never registered
        pass
    return obj.__name__


def get_registered_object(name: str, custom_objects: "dict | None" = None,
                          module_objects: "dict | None" = None) -> Any:
    """The object known as ``name``: in the current ``CustomObjectScope``, the global registry,
    ``custom_objects``, then ``module_objects``; None when none has it (Keras's order)."""
    scope = _scope_objects()
    if name in scope:
        return scope[name]
    if name in GLOBAL_CUSTOM_OBJECTS:
        return GLOBAL_CUSTOM_OBJECTS[name]
    if custom_objects and name in custom_objects:
        return custom_objects[name]
    if module_objects and name in module_objects:
        return module_objects[name]
    return None


def find_custom_class(class_name: str, registered_name: "str | None" = None,
                      custom_objects: "dict | None" = None) -> Any:
    """The user's object for a serialized entry: by its registered name, then by its class name, through
    :func:`get_registered_object`. None when unknown (the caller then tries its built-in classes)."""
    for key in (registered_name, class_name):
        if key:
            found = get_registered_object(key, custom_objects)
            if found is not None:
                return found
    return None


def serialize_object(obj: Any, builtin_module: str) -> dict:
    """``obj``'s Keras dict; ``builtin_module`` (``"keras.regularizers"``) for the classes dnnbind defines."""
    cls = type(obj)
    builtin = cls.__module__.startswith("dnnbind.")
    return {"module": builtin_module if builtin else None, "class_name": cls.__name__, "config": obj.get_config(),
            "registered_name": None if builtin else get_registered_name(cls)}


def deserialize_object(config: Any, module_objects: dict, custom_objects: "dict | None", kind: str) -> Any:
    """The object a Keras dict (or a bare name) describes: a name looked up in ``custom_objects`` first,
    then in ``module_objects`` (a class is instantiated with its defaults); a dict's class made with
    ``from_config(config["config"])``."""
    custom = custom_objects or {}
    if isinstance(config, str):
        obj = get_registered_object(config, custom, module_objects)
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
    cls = find_custom_class(class_name, config.get("registered_name"), custom)
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
