"""ctypes binding to cuDNN's graph (backend) API, declared from cudnn_graph_v9.h.

The backend API is a handful of functions over opaque descriptors
(``cudnnBackendDescriptor_t``): create one of a :class:`DescriptorType`, set its
attributes (:class:`AttributeName`, each value array typed by an :class:`AttributeType`),
finalize it, read attributes back, execute a finalized plan with a variant pack.
Everything else is enums. The functions live in libcudnn itself (libcudnn_graph), so this
module shares :mod:`dnnbind._lib.cudnn`'s library, its :class:`~dnnbind.errors.CudnnError`
(with ``cudnnGetLastErrorString``) and its status names.

Calling, as in :mod:`.cudnn`: ``cudnn_graph.cudnnBackendFinalize(desc)`` raises on a bad
status; ``cudnn_graph.call(name, *args, context=...)`` carries context into the error.

Enum members are the header's names without the common prefix
(``CUDNN_ATTR_TENSOR_UNIQUE_ID`` is ``AttributeName.TENSOR_UNIQUE_ID``,
``CUDNN_POINTWISE_RELU_FWD`` is ``PointwiseMode.RELU_FWD``). Only what dnnbind uses is
declared; ``tests/test_cudnn_graph.py`` checks every member against the header text. Every
member used exists since cuDNN 9.0 (the header's ``@since``), so the binding works with any
cuDNN 9 (9.19 on the test GPU); ``cudnnBackendPopulateCudaGraph``/``UpdateCudaGraph``
need 9.5 and are looked up only when called.
"""

from __future__ import annotations

import ctypes
from enum import IntEnum
from typing import Any

from . import cudnn as _cudnn
from ._binding import Binding
from .cudnn import ConvolutionMode, DataType, NanPropagation, ReduceTensorOp

__all__ = [
    "SIGNATURES",
    "call",
    "raw",
    "library",
    "DescriptorType",
    "AttributeName",
    "AttributeType",
    "PointwiseMode",
    "ResampleMode",
    "PaddingMode",
    "GenStatsMode",
    "BnFinalizeStatsMode",
    "HeurMode",
    "NormMode",
    "NormFwdPhase",
    "BehaviorNote",
    "NumericalNote",
    "ATTRIBUTE_CTYPE",
    "Fraction",
    "OPTIONAL_SIGNATURES",
    "optional",
    # re-exported from .cudnn: the backend API takes these legacy enums as attribute values
    "DataType",
    "ConvolutionMode",
    "NanPropagation",
    "ReduceTensorOp",
]


class DescriptorType(IntEnum):
    """``cudnnBackendDescriptorType_t`` (``CUDNN_BACKEND_<name>_DESCRIPTOR``)."""

    POINTWISE = 0
    CONVOLUTION = 1
    ENGINE = 2
    ENGINECFG = 3
    ENGINEHEUR = 4
    EXECUTION_PLAN = 5
    OPERATION_CONVOLUTION_FORWARD = 10
    OPERATION_CONVOLUTION_BACKWARD_FILTER = 11
    OPERATION_CONVOLUTION_BACKWARD_DATA = 12
    OPERATION_POINTWISE = 13
    OPERATION_GEN_STATS = 14
    OPERATIONGRAPH = 15
    VARIANT_PACK = 16
    TENSOR = 17
    MATMUL = 18
    OPERATION_MATMUL = 19
    OPERATION_BN_FINALIZE_STATISTICS = 20
    REDUCTION = 21
    OPERATION_REDUCTION = 22
    OPERATION_BN_BWD_WEIGHTS = 23
    RESAMPLE = 24
    OPERATION_RESAMPLE_FWD = 25
    OPERATION_RESAMPLE_BWD = 26
    OPERATION_NORM_FORWARD = 29
    OPERATION_NORM_BACKWARD = 30
    OPERATION_RESHAPE = 31


class AttributeName(IntEnum):
    """``cudnnBackendAttributeName_t`` (``CUDNN_ATTR_<name>``); only the attributes dnnbind sets or reads."""

    POINTWISE_MODE = 0
    POINTWISE_MATH_PREC = 1
    POINTWISE_NAN_PROPAGATION = 2
    POINTWISE_RELU_LOWER_CLIP = 3
    POINTWISE_RELU_UPPER_CLIP = 4
    POINTWISE_RELU_LOWER_CLIP_SLOPE = 5
    POINTWISE_ELU_ALPHA = 6
    POINTWISE_SOFTPLUS_BETA = 7
    POINTWISE_SWISH_BETA = 8
    POINTWISE_AXIS = 9

    CONVOLUTION_COMP_TYPE = 100
    CONVOLUTION_CONV_MODE = 101
    CONVOLUTION_DILATIONS = 102
    CONVOLUTION_FILTER_STRIDES = 103
    CONVOLUTION_POST_PADDINGS = 104
    CONVOLUTION_PRE_PADDINGS = 105
    CONVOLUTION_SPATIAL_DIMS = 106

    ENGINEHEUR_MODE = 200
    ENGINEHEUR_OPERATION_GRAPH = 201
    ENGINEHEUR_RESULTS = 202

    ENGINECFG_ENGINE = 300
    ENGINECFG_WORKSPACE_SIZE = 303

    EXECUTION_PLAN_HANDLE = 400
    EXECUTION_PLAN_ENGINE_CONFIG = 401
    EXECUTION_PLAN_WORKSPACE_SIZE = 402
    EXECUTION_PLAN_JSON_REPRESENTATION = 405

    OPERATION_CONVOLUTION_FORWARD_ALPHA = 700
    OPERATION_CONVOLUTION_FORWARD_BETA = 701
    OPERATION_CONVOLUTION_FORWARD_CONV_DESC = 702
    OPERATION_CONVOLUTION_FORWARD_W = 703
    OPERATION_CONVOLUTION_FORWARD_X = 704
    OPERATION_CONVOLUTION_FORWARD_Y = 705
    OPERATION_CONVOLUTION_BWD_DATA_ALPHA = 706
    OPERATION_CONVOLUTION_BWD_DATA_BETA = 707
    OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC = 708
    OPERATION_CONVOLUTION_BWD_DATA_W = 709
    OPERATION_CONVOLUTION_BWD_DATA_DX = 710
    OPERATION_CONVOLUTION_BWD_DATA_DY = 711
    OPERATION_CONVOLUTION_BWD_FILTER_ALPHA = 712
    OPERATION_CONVOLUTION_BWD_FILTER_BETA = 713
    OPERATION_CONVOLUTION_BWD_FILTER_CONV_DESC = 714
    OPERATION_CONVOLUTION_BWD_FILTER_DW = 715
    OPERATION_CONVOLUTION_BWD_FILTER_X = 716
    OPERATION_CONVOLUTION_BWD_FILTER_DY = 717

    OPERATION_POINTWISE_PW_DESCRIPTOR = 750
    OPERATION_POINTWISE_XDESC = 751
    OPERATION_POINTWISE_BDESC = 752
    OPERATION_POINTWISE_YDESC = 753
    OPERATION_POINTWISE_ALPHA1 = 754
    OPERATION_POINTWISE_ALPHA2 = 755
    OPERATION_POINTWISE_DXDESC = 756
    OPERATION_POINTWISE_DYDESC = 757
    OPERATION_POINTWISE_TDESC = 758

    OPERATION_GENSTATS_MODE = 770
    OPERATION_GENSTATS_MATH_PREC = 771
    OPERATION_GENSTATS_XDESC = 772
    OPERATION_GENSTATS_SUMDESC = 773
    OPERATION_GENSTATS_SQSUMDESC = 774

    OPERATION_BN_FINALIZE_STATS_MODE = 780
    OPERATION_BN_FINALIZE_MATH_PREC = 781
    OPERATION_BN_FINALIZE_Y_SUM_DESC = 782
    OPERATION_BN_FINALIZE_Y_SQ_SUM_DESC = 783
    OPERATION_BN_FINALIZE_SCALE_DESC = 784
    OPERATION_BN_FINALIZE_BIAS_DESC = 785
    OPERATION_BN_FINALIZE_PREV_RUNNING_MEAN_DESC = 786
    OPERATION_BN_FINALIZE_PREV_RUNNING_VAR_DESC = 787
    OPERATION_BN_FINALIZE_UPDATED_RUNNING_MEAN_DESC = 788
    OPERATION_BN_FINALIZE_UPDATED_RUNNING_VAR_DESC = 789
    OPERATION_BN_FINALIZE_SAVED_MEAN_DESC = 790
    OPERATION_BN_FINALIZE_SAVED_INV_STD_DESC = 791
    OPERATION_BN_FINALIZE_EQ_SCALE_DESC = 792
    OPERATION_BN_FINALIZE_EQ_BIAS_DESC = 793
    OPERATION_BN_FINALIZE_ACCUM_COUNT_DESC = 794
    OPERATION_BN_FINALIZE_EPSILON_DESC = 795
    OPERATION_BN_FINALIZE_EXP_AVERATE_FACTOR_DESC = 796  # sic: the header's spelling

    OPERATIONGRAPH_HANDLE = 800
    OPERATIONGRAPH_OPS = 801
    OPERATIONGRAPH_ENGINE_GLOBAL_COUNT = 802

    TENSOR_BYTE_ALIGNMENT = 900
    TENSOR_DATA_TYPE = 901
    TENSOR_DIMENSIONS = 902
    TENSOR_STRIDES = 903
    TENSOR_UNIQUE_ID = 906
    TENSOR_IS_VIRTUAL = 907
    TENSOR_IS_BY_VALUE = 908

    VARIANT_PACK_UNIQUE_IDS = 1000
    VARIANT_PACK_DATA_POINTERS = 1001
    VARIANT_PACK_WORKSPACE = 1003

    ENGINE_OPERATION_GRAPH = 1300
    ENGINE_GLOBAL_INDEX = 1301
    ENGINE_NUMERICAL_NOTE = 1303
    ENGINE_BEHAVIOR_NOTE = 1305

    MATMUL_COMP_TYPE = 1500
    OPERATION_MATMUL_ADESC = 1520
    OPERATION_MATMUL_BDESC = 1521
    OPERATION_MATMUL_CDESC = 1522
    OPERATION_MATMUL_DESC = 1523

    REDUCTION_OPERATOR = 1600
    REDUCTION_COMP_TYPE = 1601
    OPERATION_REDUCTION_XDESC = 1610
    OPERATION_REDUCTION_YDESC = 1611
    OPERATION_REDUCTION_DESC = 1612

    OPERATION_BN_BWD_WEIGHTS_MATH_PREC = 1620
    OPERATION_BN_BWD_WEIGHTS_MEAN_DESC = 1621
    OPERATION_BN_BWD_WEIGHTS_INVSTD_DESC = 1622
    OPERATION_BN_BWD_WEIGHTS_BN_SCALE_DESC = 1623
    OPERATION_BN_BWD_WEIGHTS_X_DESC = 1624
    OPERATION_BN_BWD_WEIGHTS_DY_DESC = 1625
    OPERATION_BN_BWD_WEIGHTS_DBN_SCALE_DESC = 1626
    OPERATION_BN_BWD_WEIGHTS_DBN_BIAS_DESC = 1627
    OPERATION_BN_BWD_WEIGHTS_EQ_DY_SCALE_DESC = 1628
    OPERATION_BN_BWD_WEIGHTS_EQ_X_SCALE_DESC = 1629
    OPERATION_BN_BWD_WEIGHTS_EQ_BIAS = 1630

    RESAMPLE_MODE = 1700
    RESAMPLE_COMP_TYPE = 1701
    RESAMPLE_SPATIAL_DIMS = 1702
    RESAMPLE_POST_PADDINGS = 1703
    RESAMPLE_PRE_PADDINGS = 1704
    RESAMPLE_STRIDES = 1705
    RESAMPLE_WINDOW_DIMS = 1706
    RESAMPLE_NAN_PROPAGATION = 1707
    RESAMPLE_PADDING_MODE = 1708
    OPERATION_RESAMPLE_FWD_XDESC = 1710
    OPERATION_RESAMPLE_FWD_YDESC = 1711
    OPERATION_RESAMPLE_FWD_IDXDESC = 1712
    OPERATION_RESAMPLE_FWD_DESC = 1716
    OPERATION_RESAMPLE_BWD_DXDESC = 1720
    OPERATION_RESAMPLE_BWD_DYDESC = 1721
    OPERATION_RESAMPLE_BWD_IDXDESC = 1722
    OPERATION_RESAMPLE_BWD_DESC = 1725
    OPERATION_RESAMPLE_BWD_XDESC = 1726
    OPERATION_RESAMPLE_BWD_YDESC = 1727

    OPERATION_NORM_FWD_MODE = 2000
    OPERATION_NORM_FWD_PHASE = 2001
    OPERATION_NORM_FWD_XDESC = 2002
    OPERATION_NORM_FWD_MEAN_DESC = 2003
    OPERATION_NORM_FWD_INV_VARIANCE_DESC = 2004
    OPERATION_NORM_FWD_SCALE_DESC = 2005
    OPERATION_NORM_FWD_BIAS_DESC = 2006
    OPERATION_NORM_FWD_EPSILON_DESC = 2007
    OPERATION_NORM_FWD_EXP_AVG_FACTOR_DESC = 2008
    OPERATION_NORM_FWD_INPUT_RUNNING_MEAN_DESC = 2009
    OPERATION_NORM_FWD_INPUT_RUNNING_VAR_DESC = 2010
    OPERATION_NORM_FWD_OUTPUT_RUNNING_MEAN_DESC = 2011
    OPERATION_NORM_FWD_OUTPUT_RUNNING_VAR_DESC = 2012
    OPERATION_NORM_FWD_YDESC = 2013

    OPERATION_NORM_BWD_MODE = 2100
    OPERATION_NORM_BWD_XDESC = 2101
    OPERATION_NORM_BWD_MEAN_DESC = 2102
    OPERATION_NORM_BWD_INV_VARIANCE_DESC = 2103
    OPERATION_NORM_BWD_DYDESC = 2104
    OPERATION_NORM_BWD_SCALE_DESC = 2105
    OPERATION_NORM_BWD_EPSILON_DESC = 2106
    OPERATION_NORM_BWD_DSCALE_DESC = 2107
    OPERATION_NORM_BWD_DBIAS_DESC = 2108
    OPERATION_NORM_BWD_DXDESC = 2109

    OPERATION_RESHAPE_XDESC = 2200
    OPERATION_RESHAPE_YDESC = 2201


class AttributeType(IntEnum):
    """``cudnnBackendAttributeType_t`` (``CUDNN_TYPE_<name>``): how an attribute's value array is typed."""

    HANDLE = 0
    DATA_TYPE = 1
    BOOLEAN = 2
    INT64 = 3
    FLOAT = 4
    DOUBLE = 5
    VOID_PTR = 6
    CONVOLUTION_MODE = 7
    HEUR_MODE = 8
    KNOB_TYPE = 9
    NAN_PROPOGATION = 10  # sic: the header's spelling
    NUMERICAL_NOTE = 11
    LAYOUT_TYPE = 12
    ATTRIB_NAME = 13
    POINTWISE_MODE = 14
    BACKEND_DESCRIPTOR = 15
    GENSTATS_MODE = 16
    BN_FINALIZE_STATS_MODE = 17
    REDUCTION_OPERATOR_TYPE = 18
    BEHAVIOR_NOTE = 19
    TENSOR_REORDERING_MODE = 20
    RESAMPLE_MODE = 21
    PADDING_MODE = 22
    INT32 = 23
    CHAR = 24
    SIGNAL_MODE = 25
    FRACTION = 26
    NORM_MODE = 27
    NORM_FWD_PHASE = 28


class PointwiseMode(IntEnum):
    """``cudnnPointwiseMode_t`` (``CUDNN_POINTWISE_<name>``)."""

    ADD = 0
    MUL = 1
    MIN = 2
    MAX = 3
    SQRT = 4
    ADD_SQUARE = 5
    DIV = 6
    SUB = 9
    ABS = 10
    EXP = 13
    LOG = 15
    NEG = 16
    RSQRT = 17
    IDENTITY = 21
    RECIPROCAL = 22
    RELU_FWD = 100
    TANH_FWD = 101
    SIGMOID_FWD = 102
    ELU_FWD = 103
    GELU_FWD = 104
    SOFTPLUS_FWD = 105
    SWISH_FWD = 106
    GELU_APPROX_TANH_FWD = 107
    RELU_BWD = 200
    TANH_BWD = 201
    SIGMOID_BWD = 202
    ELU_BWD = 203
    GELU_BWD = 204
    SOFTPLUS_BWD = 205
    SWISH_BWD = 206
    GELU_APPROX_TANH_BWD = 207
    CMP_EQ = 300
    CMP_NEQ = 301
    CMP_GT = 302
    CMP_GE = 303
    CMP_LT = 304
    CMP_LE = 305
    LOGICAL_AND = 400
    GEN_INDEX = 501
    BINARY_SELECT = 601


class ResampleMode(IntEnum):
    """``cudnnResampleMode_t`` (``CUDNN_RESAMPLE_<name>``); AVGPOOL is AVGPOOL_INCLUDE_PADDING."""

    NEAREST = 0
    BILINEAR = 1
    AVGPOOL_INCLUDE_PADDING = 2
    MAXPOOL = 3
    AVGPOOL_EXCLUDE_PADDING = 4


class PaddingMode(IntEnum):
    """``cudnnPaddingMode_t`` (``CUDNN_<name>``)."""

    ZERO_PAD = 0
    NEG_INF_PAD = 1
    EDGE_VAL_PAD = 2


class GenStatsMode(IntEnum):
    """``cudnnGenStatsMode_t`` (``CUDNN_GENSTATS_<name>``)."""

    SUM_SQSUM = 0


class BnFinalizeStatsMode(IntEnum):
    """``cudnnBnFinalizeStatsMode_t`` (``CUDNN_BN_FINALIZE_STATISTICS_<name>``)."""

    TRAINING = 0
    INFERENCE = 1


class HeurMode(IntEnum):
    """``cudnnBackendHeurMode_t`` (``CUDNN_HEUR_MODE_<name>``)."""

    INSTANT = 0
    B = 1
    FALLBACK = 2
    A = 3


class NormMode(IntEnum):
    """``cudnnBackendNormMode_t`` (``CUDNN_<name>``)."""

    LAYER_NORM = 0
    INSTANCE_NORM = 1
    BATCH_NORM = 2
    GROUP_NORM = 3
    RMS_NORM = 4


class NormFwdPhase(IntEnum):
    """``cudnnBackendNormFwdPhase_t`` (``CUDNN_NORM_FWD_<name>``)."""

    INFERENCE = 0
    TRAINING = 1


class BehaviorNote(IntEnum):
    """``cudnnBackendBehaviorNote_t`` (``CUDNN_BEHAVIOR_NOTE_<name>``)."""

    RUNTIME_COMPILATION = 0
    REQUIRES_FILTER_INT8x32_REORDER = 1
    REQUIRES_BIAS_INT8x32_REORDER = 2
    SUPPORTS_CUDA_GRAPH_NATIVE_API = 3


class NumericalNote(IntEnum):
    """``cudnnBackendNumericalNote_t`` (``CUDNN_NUMERICAL_NOTE_<name>``)."""

    TENSOR_CORE = 0
    DOWN_CONVERT_INPUTS = 1
    REDUCED_PRECISION_REDUCTION = 2
    FFT = 3
    NONDETERMINISTIC = 4
    WINOGRAD = 5
    WINOGRAD_TILE_4x4 = 6
    WINOGRAD_TILE_6x6 = 7
    WINOGRAD_TILE_13x13 = 8


class Fraction(ctypes.Structure):
    """``cudnnFraction_t``: ``numerator / denominator`` (resample windows, strides and paddings)."""

    _fields_ = [("numerator", ctypes.c_int64), ("denominator", ctypes.c_int64)]


# The C element type of each attribute type dnnbind sets or reads: enums are C ints (4 bytes),
# descriptors and handles pointers, BOOLEAN a C bool (1 byte, cudnn_frontend passes `bool`).
ATTRIBUTE_CTYPE: dict[AttributeType, Any] = {
    AttributeType.HANDLE: ctypes.c_void_p,
    AttributeType.DATA_TYPE: ctypes.c_int,
    AttributeType.BOOLEAN: ctypes.c_bool,
    AttributeType.INT64: ctypes.c_int64,
    AttributeType.FLOAT: ctypes.c_float,
    AttributeType.DOUBLE: ctypes.c_double,
    AttributeType.VOID_PTR: ctypes.c_void_p,
    AttributeType.CONVOLUTION_MODE: ctypes.c_int,
    AttributeType.HEUR_MODE: ctypes.c_int,
    AttributeType.NAN_PROPOGATION: ctypes.c_int,
    AttributeType.NUMERICAL_NOTE: ctypes.c_int,
    AttributeType.POINTWISE_MODE: ctypes.c_int,
    AttributeType.BACKEND_DESCRIPTOR: ctypes.c_void_p,
    AttributeType.GENSTATS_MODE: ctypes.c_int,
    AttributeType.BN_FINALIZE_STATS_MODE: ctypes.c_int,
    AttributeType.REDUCTION_OPERATOR_TYPE: ctypes.c_int,
    AttributeType.BEHAVIOR_NOTE: ctypes.c_int,
    AttributeType.RESAMPLE_MODE: ctypes.c_int,
    AttributeType.PADDING_MODE: ctypes.c_int,
    AttributeType.INT32: ctypes.c_int32,
    AttributeType.CHAR: ctypes.c_char,
    AttributeType.FRACTION: Fraction,
    AttributeType.NORM_MODE: ctypes.c_int,
    AttributeType.NORM_FWD_PHASE: ctypes.c_int,
}

P = ctypes.c_void_p
I = ctypes.c_int  # noqa: E741 - the one-letter codes keep the table readable, as in .cudnn
I64 = ctypes.c_int64
pP = ctypes.POINTER(ctypes.c_void_p)
pI64 = ctypes.POINTER(ctypes.c_int64)

SIGNATURES: dict[str, tuple[Any, ...]] = {
    "cudnnBackendCreateDescriptor": (I, pP),
    "cudnnBackendDestroyDescriptor": (P,),
    "cudnnBackendFinalize": (P,),
    "cudnnBackendSetAttribute": (P, I, I, I64, P),
    "cudnnBackendGetAttribute": (P, I, I, I64, pI64, P),
    "cudnnBackendExecute": (P, P, P),
}

# Since cuDNN 9.5 (the header's @since); declared apart so that an older libcudnn still loads the rest.
OPTIONAL_SIGNATURES: dict[str, tuple[Any, ...]] = {
    "cudnnBackendPopulateCudaGraph": (P, P, P, P),
    "cudnnBackendUpdateCudaGraph": (P, P, P, P),
}

_binding = Binding("cudnn", SIGNATURES, {}, _cudnn.error)
library = _binding.library
raw = _binding.raw
call = _binding.call


def optional(name: str) -> Any:
    """The ctypes function ``name`` from :data:`OPTIONAL_SIGNATURES`, or None when this libcudnn lacks it."""
    argtypes = OPTIONAL_SIGNATURES[name]
    fn = getattr(library(), name, None)
    if fn is None:
        return None
    fn.argtypes = list(argtypes)
    fn.restype = ctypes.c_int
    return fn


__getattr__, __dir__ = _binding.module_hooks(globals())
