"""``keras.preprocessing`` and its ``image`` and ``sequence`` sub-namespaces, as Keras 3 re-exports them
(:mod:`dnnbind.data_utils`, :mod:`dnnbind.image_utils`). ``image_dataset_from_directory`` and
``text_dataset_from_directory`` are not in dnnbind yet (Keras returns tf.data pipelines); the names raise
``NotImplementedError`` saying so."""

from __future__ import annotations

import types
from typing import Any

from . import data_utils, image_utils

__all__ = ["image", "sequence", "image_dataset_from_directory", "text_dataset_from_directory",
           "timeseries_dataset_from_array"]

timeseries_dataset_from_array = data_utils.timeseries_dataset_from_array


def image_dataset_from_directory(*args: Any, **kwargs: Any) -> Any:
    """Not in dnnbind yet: Keras builds a ``tf.data`` pipeline here. Read the files with ``keras.utils.load_img``
    / ``img_to_array`` into arrays (or a ``keras.utils.PyDataset``) instead."""
    raise NotImplementedError("image_dataset_from_directory is not in dnnbind yet (Keras returns a tf.data "
                              "pipeline); load the images with keras.utils.load_img and img_to_array into arrays or "
                              "a keras.utils.PyDataset")


def text_dataset_from_directory(*args: Any, **kwargs: Any) -> Any:
    """Not in dnnbind yet: Keras builds a ``tf.data`` pipeline here."""
    raise NotImplementedError("text_dataset_from_directory is not in dnnbind yet (Keras returns a tf.data "
                              "pipeline); read the files into a list of strings and labels instead")


image = types.SimpleNamespace(array_to_img=image_utils.array_to_img, img_to_array=image_utils.img_to_array,
                              load_img=image_utils.load_img, save_img=image_utils.save_img,
                              smart_resize=image_utils.smart_resize)
sequence = types.SimpleNamespace(pad_sequences=data_utils.pad_sequences)
