"""Models (``keras.models``): ``Model`` (functional or subclassed), ``Functional``, ``Sequential``,
and ``load_model`` / ``save_model`` / ``model_from_config``.

Rooms: :mod:`.model` (the base class and subclassing), :mod:`.functional`, :mod:`.sequential`,
:mod:`.cloning` (``clone_model``);
the training loop is :class:`dnnbind.trainers.trainer.Trainer` (its rooms: :mod:`dnnbind.trainers`)
and the data feeding :mod:`dnnbind.trainers.data_adapters`.
"""

from __future__ import annotations

import json
import os
from typing import Any

from .. import _keras_objects, keras_format, saving_lib
from ..saving_lib import save_model
from ..trainers.precision import LossScale as _LossScale
from .cloning import clone_model
from .functional import Functional
from .model import Model
from .sequential import Sequential

__all__ = ["Model", "Functional", "Sequential", "load_model", "save_model", "model_from_config", "model_from_json",
           "clone_model"]

_MODEL_CLASSES = {"Sequential": Sequential, "Functional": Functional, "Model": Functional}


def model_from_config(config: dict, custom_objects: "dict | None" = None, *,
                      max_weight_bytes: int | None = None) -> Model:
    """A model from ``{"class_name": "Sequential" | "Functional", "config": {...}}`` (what a saved model's
    config holds). Subclassed models cannot be rebuilt from a config: their layers are made by code.
    ``custom_objects`` (``{name: class}``) makes the user's layer classes known, as a ``CustomObjectScope``."""
    if custom_objects is not None:
        if not isinstance(custom_objects, dict):
            raise TypeError(f"model_from_config: custom_objects must be a dict of names to classes, got "
                            f"{type(custom_objects).__name__}")
        with _keras_objects.CustomObjectScope({**_keras_objects._scope_objects(), **custom_objects}):
            return model_from_config(config, max_weight_bytes=max_weight_bytes)
    if not isinstance(config, dict) or not isinstance(config.get("class_name"), str):
        raise TypeError(f"model_from_config: expected {{'class_name': str, 'config': dict}}, got {str(config)[:120]}")
    cls = _MODEL_CLASSES.get(config["class_name"])
    if cls is None:
        raise ValueError(f"model_from_config: unsupported model class {config['class_name']!r}; known: "
                         f"{', '.join(sorted(_MODEL_CLASSES))} (a subclassed model is rebuilt by its own code, then "
                         "load_weights)")
    return cls.from_config(config.get("config"), max_weight_bytes=max_weight_bytes)


def model_from_json(json_string: str, custom_objects: "dict | None" = None) -> Model:
    """A model (unbuilt weights: fresh ones) from ``Model.to_json``'s string or a Keras 3 model's JSON config
    (``config.json``); ``custom_objects`` for the user's layer classes, as a ``CustomObjectScope``."""
    if not isinstance(json_string, (str, bytes)):
        raise TypeError(f"model_from_json: expected a JSON string, got {type(json_string).__name__}")
    try:
        config = json.loads(json_string)
    except ValueError as exc:
        raise ValueError(f"model_from_json: not valid JSON ({exc})") from None
    if custom_objects is not None and not isinstance(custom_objects, dict):
        raise TypeError(f"model_from_json: custom_objects must be a dict, got {type(custom_objects).__name__}")
    with _keras_objects.CustomObjectScope({**_keras_objects._scope_objects(), **(custom_objects or {})}):
        class_name, model_config = keras_format.model_from_keras(config)
        model = model_from_config({"class_name": class_name, "config": model_config})
        compile_config = config.get("compile_config") if isinstance(config, dict) else None
        if compile_config:
            model.compile_from_config(keras_format.compile_config_from_keras(compile_config))
    return model


def load_model(filepath: "str | os.PathLike", custom_objects: "dict | None" = None, compile: bool = True,
               safe_mode: bool = True, *, max_weight_bytes: int | None = None,
               limits: "saving_lib.ReadLimits | dict | None" = None) -> Any:
    """Rebuild a model saved by ``model.save`` or by Keras 3: architecture, weights, compile settings and
    (dnnbind's own formats) optimizer state. Also ``dnnbind.saving.load_model`` and ``dnnbind.load_model``.

    The file's kind is read from its contents (a ``.keras`` zip, a ``.dnnbind`` zip or a checkpoint
    directory); everything is checked before it is used, the weights' total size against
    ``max_weight_bytes`` (default: the machine's physical memory) before any is allocated
    (:func:`dnnbind.saving_lib.load_model` says how), and every file is read within ``limits``
    (:class:`dnnbind.saving.ReadLimits`; default: the ``DNNBIND_READ_*`` environment, else the built-in
    limits). Raises :class:`dnnbind.saving.SavingError` (or ``ReadLimitError``, ``AllocationTooLargeError``).

    ``custom_objects`` (``{registered or class name: class}``) makes the user's layer classes known while
    loading, as ``with CustomObjectScope(custom_objects)``; classes decorated with
    ``keras.saving.register_keras_serializable`` are found without it. ``safe_mode`` is Keras's argument:
    dnnbind never deserializes code (a lambda), so both values load the same files.
    """
    if custom_objects is not None and not isinstance(custom_objects, dict):
        raise TypeError(f"load_model: custom_objects must be a dict of names to classes, got "
                        f"{type(custom_objects).__name__}")
    if not isinstance(safe_mode, bool):
        raise TypeError(f"load_model: safe_mode must be a bool, got {type(safe_mode).__name__}")
    if custom_objects:
        with _keras_objects.CustomObjectScope({**_keras_objects._scope_objects(), **custom_objects}):
            return saving_lib.load_model(filepath, model_from_config, compile, max_weight_bytes=max_weight_bytes,
                                         limits=limits)
    return saving_lib.load_model(filepath, model_from_config, compile, max_weight_bytes=max_weight_bytes,
                                 limits=limits)
