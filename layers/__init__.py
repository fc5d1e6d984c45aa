"""Keras-style layers (``dnnbind.layers``), computing through :mod:`dnnbind.kernels` on NumPy or CUDA.

Names, arguments and defaults follow Keras 3; ``get_weights``/``set_weights`` use Keras layouts.
"""

from .base import ActivationFn, Layer, Weight, deserialize, get_layer_class, register
from .graph import Input, InputLayer, KerasTensor, OpLayer
from .attention import AdditiveAttention, Attention, GroupedQueryAttention, GroupQueryAttention, MultiHeadAttention
from .conv_lstm import ConvLSTM1D, ConvLSTM2D, ConvLSTM3D
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
    Conv3D,
    Convolution3D,
    DepthwiseConv1D,
    DepthwiseConv2D,
    SeparableConv1D,
    SeparableConvolution1D,
    SeparableConv2D,
    SeparableConvolution2D,
)
from .core import ELU, Activation, Dense, Dropout, Flatten, Lambda, LeakyReLU, PReLU, ReLU, Softmax
from .einsum_dense import EinsumDense
from .embedding import Embedding, ReversibleEmbedding
from .masking import Masking
from .merging import (Add, Average, Concatenate, Dot, Maximum, Minimum, Multiply, Subtract, add, average,
                      concatenate, dot, maximum, minimum, multiply, subtract)
from .normalization import (BatchNormalization, GroupNormalization, LayerNormalization, RMSNormalization,
                            SyncBatchNormalization, UnitNormalization)
from .pooling import (
    AdaptiveAveragePooling1D,
    AdaptiveAveragePooling2D,
    AdaptiveAveragePooling3D,
    AdaptiveMaxPooling1D,
    AdaptiveMaxPooling2D,
    AdaptiveMaxPooling3D,
    AveragePooling1D,
    AveragePooling3D,
    AvgPool1D,
    AvgPool3D,
    GlobalAveragePooling3D,
    GlobalAvgPool3D,
    GlobalMaxPool3D,
    GlobalMaxPooling3D,
    MaxPool1D,
    MaxPool3D,
    MaxPooling1D,
    MaxPooling3D,
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
from .image_augmentation import (AutoContrast, CutMix, Equalization, MixUp, Pipeline, RandomColorDegeneration, RandomColorJitter,
                                 RandomErasing, RandomGaussianBlur, RandomGrayscale, RandomHue, RandomInvert, RandomSaturation,
                                 RandomPerspective, RandomSharpness, RandomShear, Solarization)
from .audio_preprocessing import MelSpectrogram, STFTSpectrogram
from .image_augmentation2 import AugMix, RandAugment, RandomElasticTransform, RandomPosterization
from .feature_preprocessing import CategoryEncoding, Discretization, HashedCrossing, Hashing
from .lookup import IntegerLookup, StringLookup, TextVectorization
from .regularization import (ActivityRegularization, AlphaDropout, GaussianDropout, GaussianNoise, SpatialDropout1D,
                             SpatialDropout2D, SpatialDropout3D)
from .rnn import (GRU, LSTM, RNN, Bidirectional, GRUCell, LSTMCell, SimpleRNN, SimpleRNNCell, StackedRNNCells,
                  TimeDistributed)
from .wrapper import InputSpec, SpectralNormalization, Wrapper, serialize
from .reshaping import (Cropping1D, Cropping2D, Cropping3D, Identity, Permute, RepeatVector, Reshape, UpSampling1D,
                        UpSampling2D, UpSampling3D, ZeroPadding1D, ZeroPadding2D, ZeroPadding3D)

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
    "PReLU", "Conv3D", "Convolution3D", "DepthwiseConv1D", "SeparableConv1D", "SeparableConvolution1D",
    "GroupNormalization", "UnitNormalization",
    "MaxPooling1D", "MaxPool1D", "AveragePooling1D", "AvgPool1D", "MaxPooling3D", "MaxPool3D", "AveragePooling3D",
    "AvgPool3D", "GlobalMaxPooling3D", "GlobalMaxPool3D", "GlobalAveragePooling3D", "GlobalAvgPool3D",
    "AdaptiveMaxPooling1D", "AdaptiveMaxPooling2D", "AdaptiveMaxPooling3D", "AdaptiveAveragePooling1D",
    "AdaptiveAveragePooling2D", "AdaptiveAveragePooling3D",
    "ActivityRegularization", "AlphaDropout", "GaussianDropout", "GaussianNoise", "SpatialDropout1D",
    "SpatialDropout3D",
    "ZeroPadding1D", "ZeroPadding3D", "Cropping1D", "Cropping3D", "UpSampling1D", "UpSampling3D", "RepeatVector",
    "ReversibleEmbedding", "Wrapper", "SpectralNormalization", "InputSpec", "serialize",
    "CategoryEncoding", "Discretization", "Hashing", "HashedCrossing",
    "StringLookup", "IntegerLookup", "TextVectorization",
    "ConvLSTM1D", "ConvLSTM2D", "ConvLSTM3D",
    "AutoContrast", "Solarization", "RandomInvert", "RandomGrayscale", "Pipeline", "RandomColorDegeneration",
    "RandomSaturation", "RandomSharpness", "RandomHue", "RandomGaussianBlur", "MixUp", "RandomColorJitter",
    "RandomShear", "RandomPerspective", "CutMix", "Equalization", "RandomErasing", "RandomPosterization", "RandomElasticTransform",
    "STFTSpectrogram", "MelSpectrogram", "AugMix", "RandAugment",
]
