"""Keras-style layers (``dnnbind.layers``), computing through :mod:`dnnbind.ops` on NumPy or CUDA.

Names, arguments and defaults follow Keras 3; ``get_weights``/``set_weights`` use Keras layouts.
"""

from .base import ActivationFn, Input, InputLayer, Layer, Weight, deserialize, get_layer_class, register
from .conv import Conv2D, Convolution2D
from .core import ELU, Activation, Dense, Dropout, Flatten, LeakyReLU, ReLU, Softmax
from .normalization import BatchNormalization
from .pooling import (
    AveragePooling2D,
    AvgPool2D,
    GlobalAveragePooling2D,
    GlobalAvgPool2D,
    MaxPool2D,
    MaxPooling2D,
)

__all__ = [
    "Layer", "Weight", "Input", "InputLayer", "ActivationFn", "register", "deserialize", "get_layer_class",
    "Conv2D", "Convolution2D", "Dense", "Dropout", "Flatten", "Activation", "ReLU", "Softmax", "LeakyReLU", "ELU",
    "BatchNormalization", "MaxPooling2D", "MaxPool2D", "AveragePooling2D", "AvgPool2D",
    "GlobalAveragePooling2D", "GlobalAvgPool2D",
]
