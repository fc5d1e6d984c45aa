"""``keras.legacy``: Keras 3 keeps only ``keras.legacy.saving`` (``serialize_keras_object`` /
``deserialize_keras_object``, Keras 2's names); ``keras.utils.legacy`` is the same namespace. In dnnbind both
are the one implementation of :mod:`dnnbind.serialization_lib`."""

from __future__ import annotations

import types

from .serialization_lib import deserialize_keras_object, serialize_keras_object

__all__ = ["saving"]

saving = types.SimpleNamespace(serialize_keras_object=serialize_keras_object,
                               deserialize_keras_object=deserialize_keras_object)
