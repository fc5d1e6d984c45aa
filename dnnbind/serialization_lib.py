"""``keras.saving.serialize_keras_object`` / ``deserialize_keras_object``: any configurable object as Keras 3's
dict ``{"module", "class_name", "config", "registered_name"}``, and back.

* dnnbind's own classes are written under their Keras names (``"module": "keras.layers"``, ``"keras.optimizers"``,
  ``"keras.losses"``, ...); a layer's config as Keras writes it (its dtype policy and initializers as Keras
  objects, :mod:`dnnbind.keras_format`), a model as its ``config.json``;
* the user's classes with their module and registered name (``register_keras_serializable``): reading them
  goes through the registry, the current ``CustomObjectScope`` and ``custom_objects``;
* plain values as they are; tuples, bytes, slices, ``...`` and NumPy arrays in Keras's tagged forms
  (``__tuple__`` is not one: a tuple stays a tuple, as Keras returns it).

Nothing here runs code from a config: a ``__lambda__`` entry (Keras's marshalled bytecode) is refused.
"""

from __future__ import annotations

import importlib
import types
from typing import Any

import numpy as np

from . import _keras_objects, keras_format, optimizers
from .layers.base import Layer

__all__ = ["serialize_keras_object", "deserialize_keras_object"]

_PLAIN = (str, int, float, bool)

# Keras's public namespace (the second part of a "keras.<ns>..." module) -> the dnnbind module holding its classes
_NAMESPACES = {
    "layers": "dnnbind.layers", "optimizers": "dnnbind.optimizers", "losses": "dnnbind.losses",
    "metrics": "dnnbind.metrics", "initializers": "dnnbind.initializers", "regularizers": "dnnbind.regularizers",
    "constraints": "dnnbind.constraints", "activations": "dnnbind.activations", "models": "dnnbind.models",
    "callbacks": "dnnbind.callbacks", "dtype_policies": "dnnbind.mixed_precision",
    "mixed_precision": "dnnbind.mixed_precision", "quantizers": "dnnbind.quantizers",
}
# dnnbind module prefix -> Keras's public module written for its classes
_PUBLIC_MODULES = (
    ("dnnbind.layers", "keras.layers"), ("dnnbind.optimizers", "keras.optimizers"),
    ("dnnbind.losses", "keras.losses"), ("dnnbind.metrics", "keras.metrics"),
    ("dnnbind.initializers", "keras.initializers"), ("dnnbind.regularizers", "keras.regularizers"),
    ("dnnbind.constraints", "keras.constraints"), ("dnnbind.callbacks", "keras.callbacks"),
    ("dnnbind.mixed_precision", "keras"), ("dnnbind.quantizers", "keras.quantizers"),
)
_MODEL_CLASSES = ("Sequential", "Functional", "Model")


def _public_module(cls: type) -> "str | None":
    module = cls.__module__
    for prefix, public in _PUBLIC_MODULES:
        if module == prefix or module.startswith(prefix + "."):
            if issubclass(cls, optimizers.LearningRateSchedule):
                return "keras.optimizers.schedules"
            return public
    return None


def _is_model(obj: Any) -> bool:
    return hasattr(obj, "_direct_layers") or type(obj).__name__ in _MODEL_CLASSES and hasattr(obj, "layers")


def _serialize_dict(obj: dict) -> dict:
    return {key: serialize_keras_object(value) for key, value in obj.items()}


def serialize_keras_object(obj: Any) -> Any:
    """``obj`` as Keras 3 serializes it (see the module docstring); the inverse of
    :func:`deserialize_keras_object`."""
    if obj is None or isinstance(obj, _PLAIN):
        return obj
    if isinstance(obj, (list, tuple)):
        items = [serialize_keras_object(x) for x in obj]
        return tuple(items) if isinstance(obj, tuple) else items
    if isinstance(obj, dict):
        return _serialize_dict(obj)
    if isinstance(obj, bytes):
        return {"class_name": "__bytes__", "config": {"value": obj.decode("utf-8")}}
    if isinstance(obj, slice):
        return {"class_name": "__slice__", "config": {"start": serialize_keras_object(obj.start),
                                                      "stop": serialize_keras_object(obj.stop),
                                                      "step": serialize_keras_object(obj.step)}}
    if obj is Ellipsis:
        return {"class_name": "__ellipsis__", "config": {}}
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray) or hasattr(obj, "__array__") and hasattr(obj, "dtype") and hasattr(obj, "shape") \
            and not hasattr(obj, "get_config"):
        value = np.asarray(obj)
        if value.ndim == 0:
            return value.item()
        # Keras writes a backend tensor (which a NumPy array is on its NumPy backend) as __tensor__
        return {"class_name": "__tensor__", "config": {"value": value.tolist(), "dtype": str(value.dtype)}}
    if isinstance(obj, types.FunctionType):
        if obj.__name__ == "<lambda>":
            raise ValueError("serialize_keras_object: a lambda cannot be serialized by dnnbind (it would need "
                             "Keras's marshalled bytecode, which dnnbind never loads); use a named function and "
                             "register it with @keras.saving.register_keras_serializable()")
        if obj.__module__.startswith("dnnbind."):
            from . import activations  # (deferred: only functions need it)
            name = activations.serialize(obj)
            if isinstance(name, str):
                return {"module": "keras.activations", "class_name": "function", "config": name,
                        "registered_name": name}
            return name
        name = _keras_objects.get_registered_name(obj)
        return {"module": obj.__module__, "class_name": "function", "config": name, "registered_name": name}
    if _is_model(obj) and type(obj).__module__.startswith("dnnbind."):
        return keras_format.model_config_with_compile(obj)
    if not hasattr(obj, "get_config"):
        raise TypeError(f"Cannot serialize object {obj!r} of type {type(obj)}. To be serializable, a class must "
                        "implement the `get_config()` method.")
    inner = obj.get_config()
    if not isinstance(inner, dict):
        raise TypeError(f"The `get_config()` method of {obj!r} should return a dict. It returned: {inner!r}")
    cls = type(obj)
    public = _public_module(cls)
    if isinstance(obj, Layer):
        custom = None if public is not None else {cls.__name__: cls}
        config = keras_format._layer_to_keras({"class_name": cls.__name__, "config": inner},
                                              "serialize_keras_object", custom)
        if getattr(obj, "built", False) and getattr(obj, "input_shape", None) is not None:
            config["build_config"] = {"input_shape": [None, *obj.input_shape]}
        return config
    if public is not None:
        return {"module": public, "class_name": cls.__name__, "config": _serialize_dict(inner),
                "registered_name": None}
    return {"module": cls.__module__, "class_name": cls.__name__, "config": _serialize_dict(inner),
            "registered_name": _keras_objects.get_registered_name(cls)}


def _builtin_class(module: "str | None", class_name: str) -> Any:
    """dnnbind's class for a Keras module and class name, or None."""
    candidates = []
    if isinstance(module, str) and module.startswith("keras"):
        parts = [p for p in module.split(".")[1:] if p != "src"]
        if parts and parts[0] == "optimizers" and "schedules" in parts:
            candidates = ["dnnbind.optimizers.schedules"]
        elif parts and parts[0] in _NAMESPACES:
            candidates = [_NAMESPACES[parts[0]]]
        else:  # "keras": the models and dtype policies
            candidates = ["dnnbind.models", "dnnbind.mixed_precision"]
    elif module is None:  # Keras 2 style {"class_name", "config"}: any namespace
        candidates = list(dict.fromkeys(_NAMESPACES.values()))
    for name in candidates:
        if name == "dnnbind.optimizers.schedules":
            found = getattr(optimizers.schedules, class_name, None)
        else:
            found = getattr(importlib.import_module(name), class_name, None)
        if isinstance(found, type):
            return found
    return None


def deserialize_keras_object(config: Any, custom_objects: "dict | None" = None, safe_mode: bool = True,
                             **kwargs: Any) -> Any:
    """The object a Keras 3 serialized config describes (see the module docstring).

    A user's class is found, as Keras finds it, in the current ``CustomObjectScope``, the registry and
    ``custom_objects``; dnnbind's classes by their Keras module. ``safe_mode`` is Keras's argument: dnnbind
    never loads code, so a ``__lambda__`` entry is refused either way. Raises ``TypeError`` for a class it
    cannot locate, naming it and how to register it."""
    if custom_objects is not None and not isinstance(custom_objects, dict):
        raise TypeError(f"deserialize_keras_object: custom_objects must be a dict, got {type(custom_objects).__name__}")
    custom = custom_objects or {}
    if config is None or isinstance(config, (int, float, bool)):
        return config
    if isinstance(config, str):
        found = _keras_objects.get_registered_object(config, custom)
        return config if found is None else found
    if isinstance(config, (list, tuple)):
        items = [deserialize_keras_object(x, custom_objects, safe_mode) for x in config]
        return tuple(items) if isinstance(config, tuple) else items
    if not isinstance(config, dict):
        raise TypeError(f"Could not parse config: {config!r}")
    if "class_name" not in config or "config" not in config:
        return {key: deserialize_keras_object(value, custom_objects, safe_mode) for key, value in config.items()}
    class_name, inner = config["class_name"], config["config"]
    module, registered = config.get("module"), config.get("registered_name")
    if class_name in ("__tensor__", "__numpy__"):
        return np.asarray(inner["value"], dtype=inner["dtype"])
    if class_name == "__bytes__":
        return inner["value"].encode("utf-8")
    if class_name == "__ellipsis__":
        return Ellipsis
    if class_name == "__slice__":
        return slice(*(deserialize_keras_object(inner.get(k), custom_objects, safe_mode)
                       for k in ("start", "stop", "step")))
    if class_name == "__lambda__":
        raise ValueError("deserialize_keras_object: the config holds a Python lambda (marshalled bytecode); "
                         "dnnbind never loads code from a config. Rewrite it as a named, registered function.")
    if class_name == "function":
        fn = _keras_objects.get_registered_object(registered or inner, custom) if isinstance(inner, str) else None
        if fn is None and isinstance(inner, str):
            from . import activations  # (deferred: only functions need it)
            fn = activations.ALL_OBJECTS_DICT.get(inner)
        if fn is None:
            raise TypeError(f"Could not locate function '{inner}'. Make sure custom classes and functions are "
                            "decorated with `@keras.saving.register_keras_serializable()`. Full object config: "
                            f"{config}")
        return fn
    with _keras_objects.CustomObjectScope({**_keras_objects._scope_objects(), **custom}):
        if class_name in _MODEL_CLASSES and isinstance(inner, dict) and "layers" in inner and \
                not keras_format._is_custom_entry(config):
            from .models import model_from_config  # (deferred: models sit above this module)
            name, model_config = keras_format.model_from_keras(config)
            return model_from_config({"class_name": name, "config": model_config})
        is_custom = keras_format._is_custom_entry(config)
        cls = _keras_objects.find_custom_class(class_name, registered) if is_custom or module is None else None
        if cls is None and not is_custom:
            cls = _builtin_class(module, class_name)
        if isinstance(cls, type) and issubclass(cls, Layer):
            from .models.model import deserialize_layer  # (deferred: models sit above this module)
            entry = keras_format._layer_from_keras(config, "deserialize_keras_object")
            layer = deserialize_layer(entry)
            shape = (config.get("build_config") or {}).get("input_shape")
            if shape is not None and not layer.built:
                layer.build(tuple(shape))
            return layer
        if cls is None:
            raise TypeError(f"Could not locate class '{class_name}'. Make sure custom classes and functions are "
                            "decorated with `@keras.saving.register_keras_serializable()`. If they are already "
                            "decorated, make sure they are all imported so that the decorator is run before "
                            f"trying to load them. Full object config: {config}")
        if not hasattr(cls, "from_config"):
            raise TypeError(f"Unable to reconstruct an instance of '{class_name}' because the class is missing a "
                            f"`from_config()` method. Full object config: {config}")
        return cls.from_config(inner)
