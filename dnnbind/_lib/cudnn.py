"""ctypes binding to cuDNN's legacy (v7-style) API, declared from cudnn_{graph,ops,cnn,adv}_v9.h (the RNN API
from cudnn_adv_v9.h: libcudnn exports it and loads libcudnn_adv on first use).

Two ways to call a function, both checked:

* ``cudnn.cudnnSetTensor4dDescriptor(desc, fmt, dtype, n, c, h, w)``: the module
  attribute is a wrapper that raises :class:`dnnbind.errors.CudnnError` on a
  non-success status (built on first access, then a plain module global);
* ``cudnn.call("cudnnConvolutionForward", *args, context={"x": shape, ...})``:
  the same, and the context (shapes, strides, algorithm) goes into the error.

``raw(name)`` returns the bare ctypes function (it returns the status) for the
rare caller that wants to inspect a status itself. Every declared function is in
:data:`SIGNATURES`; argtypes are set once when the library is loaded.

Pointer arguments are ``c_void_p``: pass Python ints (device pointers, handles,
descriptors) or ``ctypes.byref(...)`` of host scalars. Output arguments of type
``int *`` / ``size_t *`` / ``double *`` take ``ctypes.byref(c_int())`` etc.
"""

from __future__ import annotations

import ctypes
from enum import IntEnum
from typing import Any, Mapping

from ..errors import CudnnError
from ._binding import Binding

__all__ = [
    "SIGNATURES",
    "call",
    "check",
    "raw",
    "library",
    "version",
    "cudart_version",
    "error_string",
    "last_error_string",
    "status_name",
    "ConvolutionFwdAlgoPerf",
    "ConvolutionBwdDataAlgoPerf",
    "ConvolutionBwdFilterAlgoPerf",
    "Status",
    "DataType",
    "MathType",
    "NanPropagation",
    "TensorFormat",
    "ReduceTensorOp",
    "ActivationMode",
    "ConvolutionMode",
    "ReorderType",
    "Determinism",
    "IndicesType",
    "ReduceTensorIndices",
    "OpTensorOp",
    "PoolingMode",
    "SoftmaxAlgorithm",
    "SoftmaxMode",
    "BatchNormMode",
    "BatchNormOps",
    "ConvolutionFwdAlgo",
    "ConvolutionBwdDataAlgo",
    "ConvolutionBwdFilterAlgo",
    "RNNAlgo",
    "ForwardMode",
    "RNNMode",
    "RNNBiasMode",
    "DirectionMode",
    "RNNInputMode",
    "RNNDataLayout",
    "WgradMode",
    "RNN_PADDED_IO_DISABLED",
    "RNN_PADDED_IO_ENABLED",
]

# ---------------------------------------------------------------------------------------------
# Enums (values copied from the cuDNN 9 headers; member names drop the common C prefix, so
# CUDNN_DATA_FLOAT is DataType.FLOAT and CUDNN_STATUS_BAD_PARAM is Status.BAD_PARAM).
# ---------------------------------------------------------------------------------------------


class Status(IntEnum):
    """``cudnnStatus_t``."""

    SUCCESS = 0
    NOT_INITIALIZED = 1001
    SUBLIBRARY_VERSION_MISMATCH = 1002
    SERIALIZATION_VERSION_MISMATCH = 1003
    DEPRECATED = 1004
    LICENSE_ERROR = 1005
    RUNTIME_IN_PROGRESS = 1006
    RUNTIME_FP_OVERFLOW = 1007
    SUBLIBRARY_LOADING_FAILED = 1008
    BAD_PARAM = 2000
    BAD_PARAM_NULL_POINTER = 2002
    BAD_PARAM_MISALIGNED_POINTER = 2003
    BAD_PARAM_NOT_FINALIZED = 2004
    BAD_PARAM_OUT_OF_BOUND = 2005
    BAD_PARAM_SIZE_INSUFFICIENT = 2006
    BAD_PARAM_STREAM_MISMATCH = 2007
    BAD_PARAM_SHAPE_MISMATCH = 2008
    BAD_PARAM_DUPLICATED_ENTRIES = 2009
    BAD_PARAM_ATTRIBUTE_TYPE = 2010
    BAD_PARAM_CUDA_GRAPH_MISMATCH = 2011
    BAD_PARAM_DESCRIPTOR_TYPE = 2012
    NOT_SUPPORTED = 3000
    NOT_SUPPORTED_GRAPH_PATTERN = 3001
    NOT_SUPPORTED_SHAPE = 3002
    NOT_SUPPORTED_DATA_TYPE = 3003
    NOT_SUPPORTED_LAYOUT = 3004
    NOT_SUPPORTED_INCOMPATIBLE_CUDA_DRIVER = 3005
    NOT_SUPPORTED_INCOMPATIBLE_CUDART = 3006
    NOT_SUPPORTED_ARCH_MISMATCH = 3007
    NOT_SUPPORTED_RUNTIME_PREREQUISITE_MISSING = 3008
    NOT_SUPPORTED_SUBLIBRARY_UNAVAILABLE = 3009
    NOT_SUPPORTED_SHARED_MEMORY_INSUFFICIENT = 3010
    NOT_SUPPORTED_PADDING = 3011
    NOT_SUPPORTED_BAD_LAUNCH_PARAM = 3012
    NOT_SUPPORTED_CUDA_GRAPH_NATIVE_API = 3013
    NOT_SUPPORTED_INVALID_DYNAMIC_SHAPE = 3014
    INTERNAL_ERROR = 4000
    INTERNAL_ERROR_COMPILATION_FAILED = 4001
    INTERNAL_ERROR_UNEXPECTED_VALUE = 4002
    INTERNAL_ERROR_HOST_ALLOCATION_FAILED = 4003
    INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED = 4004
    INTERNAL_ERROR_BAD_LAUNCH_PARAM = 4005
    INTERNAL_ERROR_TEXTURE_CREATION_FAILED = 4006
    EXECUTION_FAILED = 5000
    EXECUTION_FAILED_CUDA_DRIVER = 5001
    EXECUTION_FAILED_CUBLAS = 5002
    EXECUTION_FAILED_CUDART = 5003
    EXECUTION_FAILED_CURAND = 5004
    ALLOC_FAILED = 4003
    INVALID_VALUE = 2001
    ARCH_MISMATCH = 3007
    MAPPING_ERROR = 4006
    RUNTIME_PREREQUISITE_MISSING = 3008
    VERSION_MISMATCH = 1002


class DataType(IntEnum):
    """``cudnnDataType_t``."""

    FLOAT = 0
    DOUBLE = 1
    HALF = 2
    INT8 = 3
    INT32 = 4
    INT8x4 = 5
    UINT8 = 6
    UINT8x4 = 7
    INT8x32 = 8
    BFLOAT16 = 9
    INT64 = 10
    BOOLEAN = 11
    FP8_E4M3 = 12
    FP8_E5M2 = 13
    FAST_FLOAT_FOR_FP8 = 14
    FP8_E8M0 = 15
    FP4_E2M1 = 16
    INT4 = 17
    UINT4 = 18
    UINT32 = 19
    COMPLEX_FP32 = 20
    COMPLEX_FP64 = 21
    BYTE_BOOLEAN = 22
    FP8_E5M3 = 23


class MathType(IntEnum):
    """``cudnnMathType_t``."""

    DEFAULT_MATH = 0
    TENSOR_OP_MATH = 1
    TENSOR_OP_MATH_ALLOW_CONVERSION = 2
    FMA_MATH = 3


class NanPropagation(IntEnum):
    """``cudnnNanPropagation_t``."""

    NOT_PROPAGATE_NAN = 0
    PROPAGATE_NAN = 1


class TensorFormat(IntEnum):
    """``cudnnTensorFormat_t``."""

    NCHW = 0
    NHWC = 1
    NCHW_VECT_C = 2


class ReduceTensorOp(IntEnum):
    """``cudnnReduceTensorOp_t``."""

    ADD = 0
    MUL = 1
    MIN = 2
    MAX = 3
    AMAX = 4
    AVG = 5
    NORM1 = 6
    NORM2 = 7
    MUL_NO_ZEROS = 8


class ActivationMode(IntEnum):
    """``cudnnActivationMode_t``."""

    SIGMOID = 0
    RELU = 1
    TANH = 2
    CLIPPED_RELU = 3
    ELU = 4
    IDENTITY = 5
    SWISH = 6


class ConvolutionMode(IntEnum):
    """``cudnnConvolutionMode_t``."""

    CONVOLUTION = 0
    CROSS_CORRELATION = 1


class ReorderType(IntEnum):
    """``cudnnReorderType_t``."""

    DEFAULT_REORDER = 0
    NO_REORDER = 1


class Determinism(IntEnum):
    """``cudnnDeterminism_t``."""

    NON_DETERMINISTIC = 0
    DETERMINISTIC = 1


class IndicesType(IntEnum):
    """``cudnnIndicesType_t``."""

    # The C names start with a digit after CUDNN_ (CUDNN_32BIT_INDICES...).
    INDICES_32BIT = 0
    INDICES_64BIT = 1
    INDICES_16BIT = 2
    INDICES_8BIT = 3


class ReduceTensorIndices(IntEnum):
    """``cudnnReduceTensorIndices_t``."""

    NO_INDICES = 0
    FLATTENED_INDICES = 1


class OpTensorOp(IntEnum):
    """``cudnnOpTensorOp_t``."""

    ADD = 0
    MUL = 1
    MIN = 2
    MAX = 3
    SQRT = 4
    NOT = 5


class PoolingMode(IntEnum):
    """``cudnnPoolingMode_t``."""

    MAX = 0
    AVERAGE_COUNT_INCLUDE_PADDING = 1
    AVERAGE_COUNT_EXCLUDE_PADDING = 2
    MAX_DETERMINISTIC = 3


class SoftmaxAlgorithm(IntEnum):
    """``cudnnSoftmaxAlgorithm_t``."""

    FAST = 0
    ACCURATE = 1
    LOG = 2


class SoftmaxMode(IntEnum):
    """``cudnnSoftmaxMode_t``."""

    INSTANCE = 0
    CHANNEL = 1


class BatchNormMode(IntEnum):
    """``cudnnBatchNormMode_t``."""

    PER_ACTIVATION = 0
    SPATIAL = 1
    SPATIAL_PERSISTENT = 2


class BatchNormOps(IntEnum):
    """``cudnnBatchNormOps_t``."""

    BN = 0
    BN_ACTIVATION = 1
    BN_ADD_ACTIVATION = 2


class ConvolutionFwdAlgo(IntEnum):
    """``cudnnConvolutionFwdAlgo_t``."""

    IMPLICIT_GEMM = 0
    IMPLICIT_PRECOMP_GEMM = 1
    GEMM = 2
    DIRECT = 3
    FFT = 4
    FFT_TILING = 5
    WINOGRAD = 6
    WINOGRAD_NONFUSED = 7
    COUNT = 8


class ConvolutionBwdDataAlgo(IntEnum):
    """``cudnnConvolutionBwdDataAlgo_t``."""

    ALGO_0 = 0
    ALGO_1 = 1
    ALGO_FFT = 2
    ALGO_FFT_TILING = 3
    ALGO_WINOGRAD = 4
    ALGO_WINOGRAD_NONFUSED = 5
    ALGO_COUNT = 6


class ConvolutionBwdFilterAlgo(IntEnum):
    """``cudnnConvolutionBwdFilterAlgo_t``."""

    ALGO_0 = 0
    ALGO_1 = 1
    ALGO_FFT = 2
    ALGO_3 = 3
    ALGO_WINOGRAD = 4
    ALGO_WINOGRAD_NONFUSED = 5
    ALGO_FFT_TILING = 6
    ALGO_COUNT = 7


# ----- the RNN API (cudnn_adv_v9.h) -----------------------------------------------------------


class RNNAlgo(IntEnum):
    """``cudnnRNNAlgo_t``."""

    STANDARD = 0
    PERSIST_STATIC = 1
    PERSIST_DYNAMIC = 2
    PERSIST_STATIC_SMALL_H = 3


class ForwardMode(IntEnum):
    """``cudnnForwardMode_t``."""

    INFERENCE = 0
    TRAINING = 1


class RNNMode(IntEnum):
    """``cudnnRNNMode_t`` (C names CUDNN_RNN_RELU, CUDNN_RNN_TANH, CUDNN_LSTM, CUDNN_GRU)."""

    RNN_RELU = 0
    RNN_TANH = 1
    LSTM = 2
    GRU = 3


class RNNBiasMode(IntEnum):
    """``cudnnRNNBiasMode_t`` (C names CUDNN_RNN_*)."""

    NO_BIAS = 0
    SINGLE_INP_BIAS = 1
    DOUBLE_BIAS = 2
    SINGLE_REC_BIAS = 3


class DirectionMode(IntEnum):
    """``cudnnDirectionMode_t``."""

    UNIDIRECTIONAL = 0
    BIDIRECTIONAL = 1


class RNNInputMode(IntEnum):
    """``cudnnRNNInputMode_t``."""

    LINEAR_INPUT = 0
    SKIP_INPUT = 1


class RNNDataLayout(IntEnum):
    """``cudnnRNNDataLayout_t`` (C names CUDNN_RNN_DATA_LAYOUT_*)."""

    SEQ_MAJOR_UNPACKED = 0
    SEQ_MAJOR_PACKED = 1
    BATCH_MAJOR_UNPACKED = 2


class WgradMode(IntEnum):
    """``cudnnWgradMode_t`` (C names CUDNN_WGRAD_MODE_*)."""

    ADD = 0
    SET = 1


# auxFlags of cudnnSetRNNDescriptor_v8
RNN_PADDED_IO_DISABLED = 0
RNN_PADDED_IO_ENABLED = 1 << 0


# ---------------------------------------------------------------------------------------------
# Structures
# ---------------------------------------------------------------------------------------------


class _AlgoPerf(ctypes.Structure):
    """Layout shared by cudnnConvolution{Fwd,BwdData,BwdFilter}AlgoPerf_t."""

    _fields_ = [
        ("algo", ctypes.c_int),
        ("status", ctypes.c_int),
        ("time", ctypes.c_float),  # milliseconds
        ("memory", ctypes.c_size_t),  # workspace bytes
        ("determinism", ctypes.c_int),
        ("mathType", ctypes.c_int),
        ("reserved", ctypes.c_int * 3),
    ]

    _algo_enum: type[IntEnum] | None = None  # set by each concrete struct

    def __repr__(self) -> str:
        try:
            algo = self._algo_enum(self.algo).name  # type: ignore[misc]
        except (TypeError, ValueError):
            algo = str(self.algo)
        return (
            f"{type(self).__name__}(algo={algo}, status={status_name(self.status)}, "
            f"time={self.time:.4g} ms, memory={self.memory} B, "
            f"determinism={Determinism(self.determinism).name}, math={MathType(self.mathType).name})"
        )


class ConvolutionFwdAlgoPerf(_AlgoPerf):
    """``cudnnConvolutionFwdAlgoPerf_t``."""

    _algo_enum = ConvolutionFwdAlgo


class ConvolutionBwdDataAlgoPerf(_AlgoPerf):
    """``cudnnConvolutionBwdDataAlgoPerf_t``."""

    _algo_enum = ConvolutionBwdDataAlgo


class ConvolutionBwdFilterAlgoPerf(_AlgoPerf):
    """``cudnnConvolutionBwdFilterAlgoPerf_t``."""

    _algo_enum = ConvolutionBwdFilterAlgo


# ---------------------------------------------------------------------------------------------
# Signatures of the status-returning functions (argtypes; restype is cudnnStatus_t = int).
# P: pointer / handle / descriptor (c_void_p); I: int or enum; U64: unsigned long long;
# Z: size_t; D: double; F: float; pX: pointer to X.
# ---------------------------------------------------------------------------------------------
P = ctypes.c_void_p
I = ctypes.c_int  # noqa: E741 - the one-letter codes keep the table below readable
U64 = ctypes.c_ulonglong
Z = ctypes.c_size_t
D = ctypes.c_double
F = ctypes.c_float
pP = ctypes.POINTER(ctypes.c_void_p)
pI = ctypes.POINTER(ctypes.c_int)
pZ = ctypes.POINTER(ctypes.c_size_t)
pD = ctypes.POINTER(ctypes.c_double)
pF = ctypes.POINTER(ctypes.c_float)
pU64 = ctypes.POINTER(ctypes.c_ulonglong)
I32 = ctypes.c_int32
U32 = ctypes.c_uint32
pI32 = ctypes.POINTER(ctypes.c_int32)
pU32 = ctypes.POINTER(ctypes.c_uint32)
_pFwdPerf = ctypes.POINTER(ConvolutionFwdAlgoPerf)
_pBwdDataPerf = ctypes.POINTER(ConvolutionBwdDataAlgoPerf)
_pBwdFilterPerf = ctypes.POINTER(ConvolutionBwdFilterAlgoPerf)

SIGNATURES: dict[str, tuple[Any, ...]] = {
    "cudnnGetProperty": (I, pI),
    "cudnnCreate": (pP,),
    "cudnnDestroy": (P,),
    "cudnnSetStream": (P, P),
    "cudnnGetStream": (P, pP),
    "cudnnCreateTensorDescriptor": (pP,),
    "cudnnSetTensor4dDescriptor": (P, I, I, I, I, I, I),
    "cudnnSetTensor4dDescriptorEx": (P, I, I, I, I, I, I, I, I, I),
    "cudnnGetTensor4dDescriptor": (P, pI, pI, pI, pI, pI, pI, pI, pI, pI),
    "cudnnSetTensorNdDescriptor": (P, I, I, pI, pI),
    "cudnnSetTensorNdDescriptorEx": (P, I, I, I, pI),
    "cudnnGetTensorNdDescriptor": (P, I, pI, pI, pI, pI),
    "cudnnGetTensorSizeInBytes": (P, pZ),
    "cudnnDestroyTensorDescriptor": (P,),
    "cudnnTransformTensor": (P, P, P, P, P, P, P),
    "cudnnAddTensor": (P, P, P, P, P, P, P),
    "cudnnCreateOpTensorDescriptor": (pP,),
    "cudnnSetOpTensorDescriptor": (P, I, I, I),
    "cudnnGetOpTensorDescriptor": (P, pI, pI, pI),
    "cudnnDestroyOpTensorDescriptor": (P,),
    "cudnnOpTensor": (P, P, P, P, P, P, P, P, P, P, P),
    "cudnnCreateReduceTensorDescriptor": (pP,),
    "cudnnSetReduceTensorDescriptor": (P, I, I, I, I, I),
    "cudnnGetReduceTensorDescriptor": (P, pI, pI, pI, pI, pI),
    "cudnnDestroyReduceTensorDescriptor": (P,),
    "cudnnGetReductionIndicesSize": (P, P, P, P, pZ),
    "cudnnGetReductionWorkspaceSize": (P, P, P, P, pZ),
    "cudnnReduceTensor": (P, P, P, Z, P, Z, P, P, P, P, P, P),
    "cudnnSetTensor": (P, P, P, P),
    "cudnnScaleTensor": (P, P, P, P),
    "cudnnCreateFilterDescriptor": (pP,),
    "cudnnSetFilter4dDescriptor": (P, I, I, I, I, I, I),
    "cudnnGetFilter4dDescriptor": (P, pI, pI, pI, pI, pI, pI),
    "cudnnSetFilterNdDescriptor": (P, I, I, I, pI),
    "cudnnGetFilterNdDescriptor": (P, I, pI, pI, pI, pI),
    "cudnnGetFilterSizeInBytes": (P, pZ),
    "cudnnDestroyFilterDescriptor": (P,),
    "cudnnSoftmaxForward": (P, I, I, P, P, P, P, P, P),
    "cudnnSoftmaxBackward": (P, I, I, P, P, P, P, P, P, P, P),
    "cudnnCreatePoolingDescriptor": (pP,),
    "cudnnSetPooling2dDescriptor": (P, I, I, I, I, I, I, I, I),
    "cudnnGetPooling2dDescriptor": (P, pI, pI, pI, pI, pI, pI, pI, pI),
    "cudnnSetPoolingNdDescriptor": (P, I, I, I, pI, pI, pI),
    "cudnnGetPoolingNdDescriptor": (P, I, pI, pI, pI, pI, pI, pI),
    "cudnnGetPoolingNdForwardOutputDim": (P, P, I, pI),
    "cudnnGetPooling2dForwardOutputDim": (P, P, pI, pI, pI, pI),
    "cudnnDestroyPoolingDescriptor": (P,),
    "cudnnPoolingForward": (P, P, P, P, P, P, P, P),
    "cudnnPoolingBackward": (P, P, P, P, P, P, P, P, P, P, P, P),
    "cudnnCreateActivationDescriptor": (pP,),
    "cudnnSetActivationDescriptor": (P, I, I, D),
    "cudnnGetActivationDescriptor": (P, pI, pI, pD),
    "cudnnSetActivationDescriptorSwishBeta": (P, D),
    "cudnnGetActivationDescriptorSwishBeta": (P, pD),
    "cudnnDestroyActivationDescriptor": (P,),
    "cudnnActivationForward": (P, P, P, P, P, P, P, P),
    "cudnnActivationBackward": (P, P, P, P, P, P, P, P, P, P, P, P),
    "cudnnDeriveBNTensorDescriptor": (P, P, I),
    "cudnnBatchNormalizationForwardInference": (P, I, P, P, P, P, P, P, P, P, P, P, P, D),
    "cudnnBatchNormalizationForwardTraining": (P, I, P, P, P, P, P, P, P, P, P, D, P, P, D, P, P),
    "cudnnBatchNormalizationBackward": (P, I, P, P, P, P, P, P, P, P, P, P, P, P, P, P, D, P, P),
    "cudnnGetBatchNormalizationForwardTrainingExWorkspaceSize": (P, I, I, P, P, P, P, P, pZ),
    "cudnnGetBatchNormalizationBackwardExWorkspaceSize": (P, I, I, P, P, P, P, P, P, P, pZ),
    "cudnnGetBatchNormalizationTrainingExReserveSpaceSize": (P, I, I, P, P, pZ),
    "cudnnBatchNormalizationForwardTrainingEx": (P, I, I, P, P, P, P, P, P, P, P, P, P, P, D, P, P, D, P, P, P, P, Z, P, Z),
    "cudnnBatchNormalizationBackwardEx": (P, I, I, P, P, P, P, P, P, P, P, P, P, P, P, P, P, P, P, P, P, P, D, P, P, P, P, Z, P, Z),
    "cudnnCreateDropoutDescriptor": (pP,),
    "cudnnDestroyDropoutDescriptor": (P,),
    "cudnnDropoutGetStatesSize": (P, pZ),
    "cudnnDropoutGetReserveSpaceSize": (P, pZ),
    "cudnnSetDropoutDescriptor": (P, P, F, P, Z, U64),
    "cudnnRestoreDropoutDescriptor": (P, P, F, P, Z, U64),
    "cudnnGetDropoutDescriptor": (P, P, pF, P, pU64),
    "cudnnDropoutForward": (P, P, P, P, P, P, P, Z),
    "cudnnDropoutBackward": (P, P, P, P, P, P, P, Z),
    "cudnnCreateConvolutionDescriptor": (pP,),
    "cudnnDestroyConvolutionDescriptor": (P,),
    "cudnnSetConvolutionMathType": (P, I),
    "cudnnGetConvolutionMathType": (P, pI),
    "cudnnSetConvolutionGroupCount": (P, I),
    "cudnnGetConvolutionGroupCount": (P, pI),
    "cudnnSetConvolutionReorderType": (P, I),
    "cudnnGetConvolutionReorderType": (P, pI),
    "cudnnSetConvolution2dDescriptor": (P, I, I, I, I, I, I, I, I),
    "cudnnGetConvolution2dDescriptor": (P, pI, pI, pI, pI, pI, pI, pI, pI),
    "cudnnSetConvolutionNdDescriptor": (P, I, pI, pI, pI, I, I),
    "cudnnGetConvolutionNdDescriptor": (P, I, pI, pI, pI, pI, pI, pI),
    "cudnnGetConvolution2dForwardOutputDim": (P, P, P, pI, pI, pI, pI),
    "cudnnGetConvolutionNdForwardOutputDim": (P, P, P, I, pI),
    "cudnnGetConvolutionForwardAlgorithmMaxCount": (P, pI),
    "cudnnGetConvolutionForwardAlgorithm_v7": (P, P, P, P, P, I, pI, _pFwdPerf),
    "cudnnFindConvolutionForwardAlgorithm": (P, P, P, P, P, I, pI, _pFwdPerf),
    "cudnnFindConvolutionForwardAlgorithmEx": (P, P, P, P, P, P, P, P, I, pI, _pFwdPerf, P, Z),
    "cudnnGetConvolutionForwardWorkspaceSize": (P, P, P, P, P, I, pZ),
    "cudnnConvolutionForward": (P, P, P, P, P, P, P, I, P, Z, P, P, P),
    "cudnnConvolutionBiasActivationForward": (P, P, P, P, P, P, P, I, P, Z, P, P, P, P, P, P, P, P),
    "cudnnGetConvolutionBackwardDataAlgorithmMaxCount": (P, pI),
    "cudnnFindConvolutionBackwardDataAlgorithm": (P, P, P, P, P, I, pI, _pBwdDataPerf),
    "cudnnFindConvolutionBackwardDataAlgorithmEx": (P, P, P, P, P, P, P, P, I, pI, _pBwdDataPerf, P, Z),
    "cudnnGetConvolutionBackwardDataAlgorithm_v7": (P, P, P, P, P, I, pI, _pBwdDataPerf),
    "cudnnGetConvolutionBackwardDataWorkspaceSize": (P, P, P, P, P, I, pZ),
    "cudnnConvolutionBackwardData": (P, P, P, P, P, P, P, I, P, Z, P, P, P),
    "cudnnGetConvolutionBackwardFilterAlgorithmMaxCount": (P, pI),
    "cudnnFindConvolutionBackwardFilterAlgorithm": (P, P, P, P, P, I, pI, _pBwdFilterPerf),
    "cudnnFindConvolutionBackwardFilterAlgorithmEx": (P, P, P, P, P, P, P, P, I, pI, _pBwdFilterPerf, P, Z),
    "cudnnGetConvolutionBackwardFilterAlgorithm_v7": (P, P, P, P, P, I, pI, _pBwdFilterPerf),
    "cudnnGetConvolutionBackwardFilterWorkspaceSize": (P, P, P, P, P, I, pZ),
    "cudnnConvolutionBackwardFilter": (P, P, P, P, P, P, P, I, P, Z, P, P, P),
    "cudnnConvolutionBackwardBias": (P, P, P, P, P, P, P),
    # ----- the RNN API (cudnn_adv_v9.h); enums are I, int32_t I32, uint32_t U32 -----
    "cudnnCreateRNNDescriptor": (pP,),
    "cudnnDestroyRNNDescriptor": (P,),
    # (rnnDesc, algo, cellMode, biasMode, dirMode, inputMode, dataType, mathPrec, mathType, inputSize,
    #  hiddenSize, projSize, numLayers, dropoutDesc, auxFlags)
    "cudnnSetRNNDescriptor_v8": (P, I, I, I, I, I, I, I, I, I32, I32, I32, I32, P, U32),
    "cudnnGetRNNDescriptor_v8": (P, pI, pI, pI, pI, pI, pI, pI, pI, pI32, pI32, pI32, pI32, pP, pU32),
    "cudnnBuildRNNDynamic": (P, P, I),
    # (handle, rnnDesc, fwdMode, xDesc, workSpaceSize*, reserveSpaceSize*)
    "cudnnGetRNNTempSpaceSizes": (P, P, I, P, pZ, pZ),
    "cudnnGetRNNWeightSpaceSize": (P, P, pZ),
    # (handle, rnnDesc, pseudoLayer, weightSpaceSize, weightSpace, linLayerID, mDesc, mAddr*, bDesc, bAddr*)
    "cudnnGetRNNWeightParams": (P, P, I32, Z, P, I32, P, pP, P, pP),
    "cudnnCreateRNNDataDescriptor": (pP,),
    "cudnnDestroyRNNDataDescriptor": (P,),
    # (rnnDataDesc, dataType, layout, maxSeqLength, batchSize, vectorSize, seqLengthArray, paddingFill)
    "cudnnSetRNNDataDescriptor": (P, I, I, I, I, I, pI, P),
    # (rnnDataDesc, dataType*, layout*, maxSeqLength*, batchSize*, vectorSize*, arrayLengthRequested,
    #  seqLengthArray, paddingFill)
    "cudnnGetRNNDataDescriptor": (P, pI, pI, pI, pI, pI, I, pI, P),
    # (handle, rnnDesc, fwdMode, devSeqLengths, xDesc, x, yDesc, y, hDesc, hx, hy, cDesc, cx, cy,
    #  weightSpaceSize, weightSpace, workSpaceSize, workSpace, reserveSpaceSize, reserveSpace)
    "cudnnRNNForward": (P, P, I, P, P, P, P, P, P, P, P, P, P, P, Z, P, Z, P, Z, P),
    # (handle, rnnDesc, devSeqLengths, yDesc, y, dy, xDesc, dx, hDesc, hx, dhy, dhx, cDesc, cx, dcy, dcx,
    #  weightSpaceSize, weightSpace, workSpaceSize, workSpace, reserveSpaceSize, reserveSpace)
    "cudnnRNNBackwardData_v8": (P, P, P, P, P, P, P, P, P, P, P, P, P, P, P, P, Z, P, Z, P, Z, P),
    # (handle, rnnDesc, addGrad, devSeqLengths, xDesc, x, hDesc, hx, yDesc, y, weightSpaceSize, dweightSpace,
    #  workSpaceSize, workSpace, reserveSpaceSize, reserveSpace)
    "cudnnRNNBackwardWeights_v8": (P, P, I, P, P, P, P, P, P, P, Z, P, Z, P, Z, P),
}

# Functions that do not return a status.
_PLAIN_SIGNATURES: dict[str, tuple[tuple[Any, ...], Any]] = {
    "cudnnGetVersion": ((), ctypes.c_size_t),
    "cudnnGetCudartVersion": ((), ctypes.c_size_t),
    "cudnnGetErrorString": ((ctypes.c_int,), ctypes.c_char_p),
    "cudnnGetLastErrorString": ((ctypes.c_char_p, ctypes.c_size_t), None),
}

# ---------------------------------------------------------------------------------------------
# Loading and checking
# ---------------------------------------------------------------------------------------------

_MESSAGE_BYTES = 4096


def version() -> int:
    """cuDNN's version as an int: major*10000 + minor*100 + patch (``91900`` for 9.19.0)."""
    return int(library().cudnnGetVersion())


def cudart_version() -> int:
    """The CUDA runtime version cuDNN was built against (``12090`` for 12.9)."""
    return int(library().cudnnGetCudartVersion())


def error_string(status: int) -> str:
    """cuDNN's name for a status (``cudnnGetErrorString``)."""
    text = library().cudnnGetErrorString(int(status))
    return text.decode(errors="replace") if text else ""


def last_error_string() -> str:
    """cuDNN's explanation of the last error on this thread (``cudnnGetLastErrorString``)."""
    buf = ctypes.create_string_buffer(_MESSAGE_BYTES)
    library().cudnnGetLastErrorString(buf, _MESSAGE_BYTES)
    return buf.value.decode(errors="replace").strip()


def status_name(status: int) -> str:
    """``CUDNN_STATUS_BAD_PARAM`` for 2000, and so on; falls back to cudnnGetErrorString."""
    try:
        return "CUDNN_STATUS_" + Status(status).name
    except ValueError:
        name = error_string(status)
        return name or f"CUDNN_STATUS_UNKNOWN_{int(status)}"


_HINTS = {
    Status.NOT_SUPPORTED: "cuDNN does not support this configuration (shape, layout, dtype or "
    "algorithm); try another layout, dtype or algorithm, or the NumPy backend.",
    Status.INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED: "cuDNN could not allocate device memory; try a "
    "smaller batch or dnnbind.cuda.empty_cache().",
    Status.NOT_SUPPORTED_ARCH_MISMATCH: "this cuDNN build does not support the GPU's architecture; "
    "run `python -m dnnbind doctor`.",
    Status.SUBLIBRARY_LOADING_FAILED: "a cuDNN sub-library (libcudnn_ops/_cnn/_engines_*) failed to "
    "load; check that all of them sit next to libcudnn (pip install --force-reinstall nvidia-cudnn-cu12).",
}


def error(status: int, function: str, context: Mapping[str, Any] | None = None) -> CudnnError:
    """Build the :class:`CudnnError` for a failed call (reads cudnnGetLastErrorString now)."""
    return CudnnError(
        int(status),
        status_name(status),
        function,
        detail=last_error_string(),
        context=context,
        hint=_HINTS.get(status, ""),  # type: ignore[call-overload]
    )


def check(status: int, function: str, **context: Any) -> None:
    """Raise :class:`CudnnError` when ``status`` is not CUDNN_STATUS_SUCCESS."""
    if status:
        raise error(status, function, context)


_binding = Binding("cudnn", SIGNATURES, _PLAIN_SIGNATURES, error)
library = _binding.library
raw = _binding.raw
call = _binding.call
# library(), raw(name) and call(name, *args, context=None) (raises CudnnError carrying the context)
# are the shared Binding methods; module attributes named after C functions are checked wrappers.


__getattr__, __dir__ = _binding.module_hooks(globals())
