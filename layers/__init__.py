"""Keras-style layers (``dnnbind.layers``), computing through :mod:`dnnbind.kernels` on NumPy or CUDA.

Names, arguments and defaults follow Keras 3; ``get_weights``/``set_weights`` use Keras layouts.
"""

from .base import ActivationFn, Layer, Weight, deserialize, get_layer_class, register
from .graph import Input, InputLayer, KerasTensor, OpLayer
from .attention import AdditiveAttention, Attention, GroupedQueryAttention, GroupQueryAttention, MultiHeadAttention
from .conv import (
    Conv1D,
    Conv1DTranspose,
    Conv2D,
    Conv2DTranspose,
    Conv3DTranspose,
    Convolution1D,
    Convolution1DTranspose,
    Convolution2D,
    Convolution2DTranspose,
    Convolution3DTranspose,
    DepthwiseConv2D,
    SeparableConv2D,
    SeparableConvolution2D,
)
from .core import ELU, Activation, Dense, Dropout, Flatten, Lambda, LeakyReLU, ReLU, Softmax
from .einsum_dense import EinsumDense
from .embedding import Embedding
from .masking import Masking
from .merging import (Add, Average, Concatenate, Dot, Maximum, Minimum, Multiply, Subtract, add, average,
                      concatenate, dot, maximum, minimum, multiply, subtract)
from .normalization import BatchNormalization, LayerNormalization, RMSNormalization, SyncBatchNormalization
from .pooling import (
    AveragePooling2D,
    AvgPool2D,
    GlobalAveragePooling1D,
    GlobalAveragePooling2D,
    GlobalAvgPool1D,
    GlobalAvgPool2D,
    GlobalMaxPool1D,
    GlobalMaxPool2D,
    GlobalMaxPooling1D,
    GlobalMaxPooling2D,
    MaxPool2D,
    MaxPooling2D,
)
from .image_preprocessing import (CenterCrop, RandomBrightness, RandomContrast, RandomCrop, RandomFlip, RandomRotation,
                                  RandomTranslation, RandomZoom, Resizing)
from .preprocessing import Normalization, Rescaling
from .regularization import SpatialDropout2D
from .rnn import (GRU, LSTM, RNN, Bidirectional, GRUCell, LSTMCell, SimpleRNN, SimpleRNNCell, StackedRNNCells,
                  TimeDistributed)
from .reshaping import Cropping2D, Identity, Permute, Reshape, UpSampling2D, ZeroPadding2D

__all__ = [
    "Layer", "Weight", "Input", "InputLayer", "KerasTensor", "OpLayer", "ActivationFn", "register", "deserialize", "get_layer_class",
    "Conv2D", "Convolution2D", "Dense", "Dropout", "Flatten", "Activation", "ReLU", "Softmax", "LeakyReLU", "ELU",
    "BatchNormalization", "SyncBatchNormalization", "MaxPooling2D", "MaxPool2D", "AveragePooling2D", "AvgPool2D",
    "GlobalAveragePooling2D", "GlobalAvgPool2D",
    "DepthwiseConv2D", "SeparableConv2D", "SeparableConvolution2D", "Conv1D", "Convolution1D", "LayerNormalization",
    "GlobalMaxPooling2D", "GlobalMaxPool2D", "GlobalMaxPooling1D", "GlobalMaxPool1D", "GlobalAveragePooling1D",
    "GlobalAvgPool1D", "SpatialDropout2D",
    "Add", "Subtract", "Multiply", "Average", "Maximum", "Minimum", "Concatenate", "Dot", "Lambda",
    "add", "subtract", "multiply", "average", "maximum", "minimum", "concatenate", "dot",
    "Embedding", "Conv1DTranspose", "Conv2DTranspose", "Conv3DTranspose", "Convolution1DTranspose",
    "Convolution2DTranspose", "Convolution3DTranspose",
    "EinsumDense", "MultiHeadAttention", "GroupedQueryAttention", "GroupQueryAttention", "Attention",
    "AdditiveAttention", "RMSNormalization",
    "Reshape", "Permute", "Identity", "ZeroPadding2D", "Cropping2D", "UpSampling2D", "Rescaling", "Normalization",
    "RandomFlip", "RandomRotation", "RandomZoom", "RandomTranslation", "RandomCrop", "RandomContrast",
    "RandomBrightness", "Resizing", "CenterCrop",
    "Masking", "RNN", "SimpleRNN", "LSTM", "GRU", "SimpleRNNCell", "LSTMCell", "GRUCell", "StackedRNNCells",
    "Bidirectional", "TimeDistributed",
]
