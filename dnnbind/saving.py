"""Saving and loading models and weights (``keras.saving``): the public entry points.

* ``save_weights(model, path)`` / ``load_weights(model, path)``: safetensors, or Keras 3's
  ``.weights.h5``;
* ``save_model(model, path)`` / ``load_model(path)``: ``.keras`` (Keras 3's model file), ``.dnnbind``
  (dnnbind's zip, with the optimizer state) or a checkpoint directory;
* ``atomic_write`` / ``remove_stale_temporaries``: the crash-safe writing every save uses;
* ``register_keras_serializable``, ``CustomObjectScope`` / ``custom_object_scope``, ``get_custom_objects``,
  ``get_registered_name`` / ``get_registered_object``: Keras's registry of the user's classes, which
  ``load_model`` (``.keras`` and dnnbind's files) and every ``deserialize`` consult;
  ``serialize_keras_object`` / ``deserialize_keras_object``: Keras's object dicts (:mod:`dnnbind.serialization_lib`);
* ``ReadLimits`` / ``ReadLimitError``: how much an untrusted file may make a load read (sizes,
  compression ratio, JSON depth), as ``limits=`` of ``load_model``/``load_weights`` (and
  ``Model.load_weights``, the data sets' ``load_data``) or the
  ``DNNBIND_READ_*`` environment (:mod:`dnnbind._bounded`).

The formats, their checks and their crash safety are described in :mod:`dnnbind.saving_lib`. This
module is the face above :mod:`dnnbind.models`: ``load_model`` lives there (it builds models), and
the model classes call :mod:`dnnbind.saving_lib`, which knows no model class.
"""

from __future__ import annotations

from ._files import atomic_write, remove_stale_temporaries
from ._keras_objects import (CustomObjectScope, custom_object_scope, get_custom_objects, get_registered_name,
                             get_registered_object, register_keras_serializable)
from .serialization_lib import deserialize_keras_object, serialize_keras_object
from .models import load_model, model_from_config
from .saving_lib import (ReadLimitError, ReadLimits, SavingError, check_weight_budget, load_weights, save_model,
                         save_weights)

__all__ = ["save_weights", "load_weights", "save_model", "load_model", "model_from_config", "atomic_write",
           "SavingError", "ReadLimits", "ReadLimitError", "remove_stale_temporaries", "check_weight_budget",
           "CustomObjectScope", "custom_object_scope", "get_custom_objects", "get_registered_name",
           "get_registered_object", "register_keras_serializable", "serialize_keras_object",
           "deserialize_keras_object"]
