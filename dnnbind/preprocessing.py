"""``keras.preprocessing`` and its ``image`` and ``sequence`` sub-namespaces, as Keras 3 re-exports them
(:mod:`dnnbind.data_utils`, :mod:`dnnbind.image_utils`, :mod:`dnnbind.directory_datasets`)."""

from __future__ import annotations

import types

from . import data_utils, image_utils
from .directory_datasets import image_dataset_from_directory, text_dataset_from_directory

__all__ = ["image", "sequence", "image_dataset_from_directory", "text_dataset_from_directory",
           "timeseries_dataset_from_array"]

timeseries_dataset_from_array = data_utils.timeseries_dataset_from_array


image = types.SimpleNamespace(array_to_img=image_utils.array_to_img, img_to_array=image_utils.img_to_array,
                              load_img=image_utils.load_img, save_img=image_utils.save_img,
                              smart_resize=image_utils.smart_resize)
sequence = types.SimpleNamespace(pad_sequences=data_utils.pad_sequences)
