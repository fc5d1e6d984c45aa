"""Public ops: forward and backward, one signature for NumPy arrays and DeviceArrays.

Each op validates its arguments, normalises its parameters, then runs the CUDA
implementation (``dnnbind.kernels._cuda.<family>``, cuDNN/cuBLAS/NVRTC on a stream) when
its first array is a :class:`dnnbind.cuda.DeviceArray`, or the NumPy reference
(the CPU backend) when it is a NumPy array. Mixing the two is an error.

Global switches (TF32, determinism, cuDNN benchmark mode, workspace cap) live in
:mod:`dnnbind.kernels.config`.
"""

from __future__ import annotations

from . import config
from ._params import ConvParams, PoolParams, resolve_padding
from .activation import ACTIVATIONS, activation_backward, activation_forward
from .batchnorm import BatchNormSaved, batchnorm_backward, batchnorm_forward_inference, batchnorm_forward_training
from .conv import (
    bias_add,
    bias_backward,
    conv2d_backward_data,
    conv2d_backward_filter,
    conv2d_bias_activation_forward,
    conv2d_batchnorm_forward_training,
    batchnorm_relu_conv2d_backward,
    conv2d_forward,
    conv2d_output_shape,
)
from .dense import dense_backward_input, dense_backward_weight, dense_forward, matmul
from .dropout import DropoutState, dropout_backward, dropout_forward
from .elementwise import (
    accuracy_count,
    add,
    all_finite,
    argmax,
    axpy,
    cast,
    cast_many,
    copy,
    empty_like,
    fill,
    mean,
    multiply,
    random_crop_flip,
    scale,
    subtract,
    sum,
    take,
    top_k_count,
    zeros_like,
)
from .attention import sdpa_backward, sdpa_forward, sdpa_supported
from .layernorm import layernorm_backward, layernorm_forward
from .merging import concatenate, concatenate_backward, extremum_backward, maximum, minimum
from .preprocessing import normalize, normalize_backward, rescale
from .rnn import (RNNSaved, RNNWeightLayout, pack_keras_weights, rnn_backward, rnn_forward, rnn_weight_layout,
                  unpack_keras_weights)
from .reshaping import crop2d, pad2d, transpose, upsample2d_backward, upsample2d_forward
from .losses import binary_crossentropy, crossentropy_from_probs, mean_squared_error, softmax_cross_entropy
from .optim import UpdateTables, adam_update, advance_step, rmsprop_update, sgd_update
from .quantize import (
    abs_max,
    dequantize_weight,
    float8_dense_forward,
    int4_dense_forward,
    int8_dense_forward,
    quantize_float8,
    quantize_int8,
)
from .pooling import global_avg_pool2d_backward, global_avg_pool2d_forward, pool2d_backward, pool2d_forward
from .softmax import softmax_backward, softmax_forward
from .spatial_dropout import spatial_dropout_backward, spatial_dropout_forward

__all__ = [
    # fused attention (cuDNN's flash-attention engines; NumPy twin)
    "sdpa_forward", "sdpa_backward", "sdpa_supported",
    # rnn (cuDNN's RNN API; NumPy twin)
    "rnn_forward", "rnn_backward", "rnn_weight_layout", "pack_keras_weights", "unpack_keras_weights",
    "RNNWeightLayout", "RNNSaved",
    "config", "ConvParams", "PoolParams", "resolve_padding", "ACTIVATIONS",
    # conv
    "conv2d_forward", "conv2d_backward_data", "conv2d_backward_filter", "conv2d_output_shape",
    "bias_add", "bias_backward", "conv2d_bias_activation_forward",
    "conv2d_batchnorm_forward_training", "batchnorm_relu_conv2d_backward",
    # pooling
    "pool2d_forward", "pool2d_backward", "global_avg_pool2d_forward", "global_avg_pool2d_backward",
    # activation, batchnorm, softmax, losses, dropout, dense
    "activation_forward", "activation_backward",
    "BatchNormSaved", "batchnorm_forward_training", "batchnorm_forward_inference", "batchnorm_backward",
    "softmax_forward", "softmax_backward",
    "softmax_cross_entropy", "crossentropy_from_probs", "binary_crossentropy", "mean_squared_error",
    "DropoutState", "dropout_forward", "dropout_backward",
    "layernorm_forward", "layernorm_backward", "spatial_dropout_forward", "spatial_dropout_backward",
    "dense_forward", "dense_backward_input", "dense_backward_weight", "matmul",
    # elementwise
    "add", "subtract", "multiply", "scale", "axpy", "sum", "mean", "argmax", "accuracy_count",
    "top_k_count", "cast", "cast_many", "fill", "zeros_like", "empty_like", "copy", "take", "all_finite",
    "random_crop_flip",
    # merging, reshaping, preprocessing
    "maximum", "minimum", "extremum_backward", "concatenate", "concatenate_backward",
    "pad2d", "crop2d", "upsample2d_forward", "upsample2d_backward", "transpose",
    "rescale", "normalize", "normalize_backward",
    # optimizers
    "sgd_update", "adam_update", "rmsprop_update", "advance_step", "UpdateTables",
    # low-bit inference (quantize.py)
    "int8_dense_forward", "float8_dense_forward", "int4_dense_forward", "dequantize_weight", "quantize_int8",
    "quantize_float8", "abs_max",
]
