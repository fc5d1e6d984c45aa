"""Owned cuDNN descriptors: tensor, filter, convolution, pooling, activation, dropout, op-tensor, reduce.

Shapes follow the array's own axis order for its layout (as in DESIGN.md):

* ``TensorDescriptor((N, C, H, W), dt, "NCHW")`` and ``TensorDescriptor((N, H, W, C), dt, "NHWC")``;
* ``FilterDescriptor((K, C/g, R, S), dt, "NCHW")`` and ``FilterDescriptor((K, R, S, C/g), dt, "NHWC")``.

cuDNN itself always speaks (N, C, spatial...) order; the conversion happens here, and
``get()`` converts back, so ``get()`` returns what was passed in. Strides are in
**elements** (cuDNN's unit), in the same axis order as the shape.

Arguments are validated in Python before any C call (``ValueError``/``TypeError`` that
name the descriptor and the bad value); a failed set call raises
:class:`dnnbind.errors.CudnnError` carrying the shapes and strides.
"""

from __future__ import annotations

import ctypes
import math
from dataclasses import dataclass
from typing import Any, Hashable, Sequence

import numpy as np

from .. import cuda
from .._lib import OwnedPointer
from .._lib import cudnn as C
from .._validate import normalize_dtype
from ..errors import CudnnError
from .._cache import LRUCache
from ._handle import Handle, require_handle

__all__ = [
    "data_type",
    "dtype_of",
    "TensorDescriptor",
    "FilterDescriptor",
    "ConvolutionDescriptor",
    "PoolingDescriptor",
    "ActivationDescriptor",
    "DropoutDescriptor",
    "OpTensorDescriptor",
    "ReduceTensorDescriptor",
    "TensorInfo",
    "FilterInfo",
    "ConvolutionInfo",
    "PoolingInfo",
    "ActivationInfo",
    "DropoutInfo",
    "OpTensorInfo",
    "ReduceTensorInfo",
]

_MAX_DIMS = 8  # CUDNN_DIM_MAX
_INT_MAX = 2**31 - 1

# ---------------------------------------------------------------------------------------------
# dtypes
# ---------------------------------------------------------------------------------------------

_DTYPE_TO_CUDNN = {
    "float32": C.DataType.FLOAT,
    "float64": C.DataType.DOUBLE,
    "float16": C.DataType.HALF,
    "bfloat16": C.DataType.BFLOAT16,
    "int8": C.DataType.INT8,
    "int32": C.DataType.INT32,
    "uint8": C.DataType.UINT8,
}
_CUDNN_TO_NAME = {v: k for k, v in _DTYPE_TO_CUDNN.items()}
_CUDNN_OF_DTYPE = {normalize_dtype(name): value for name, value in _DTYPE_TO_CUDNN.items()}
_SUPPORTED = frozenset(_CUDNN_OF_DTYPE)


def data_type(dtype: Any, what: str = "cuDNN") -> C.DataType:
    """The ``cudnnDataType_t`` for a NumPy dtype, type or name (``"bfloat16"`` = ml_dtypes.bfloat16)."""
    if isinstance(dtype, C.DataType):
        return dtype
    return _CUDNN_OF_DTYPE[normalize_dtype(dtype, what, _SUPPORTED)]


def dtype_of(value: int) -> np.dtype:
    """The NumPy dtype of a ``cudnnDataType_t`` value (bfloat16 is ml_dtypes.bfloat16)."""
    try:
        name = _CUDNN_TO_NAME[C.DataType(value)]
    except (KeyError, ValueError):
        raise ValueError(f"cudnnDataType_t {value} has no NumPy dtype in dnnbind") from None
    return normalize_dtype(name, "cuDNN")


# ---------------------------------------------------------------------------------------------
# validation helpers
# ---------------------------------------------------------------------------------------------


def _ints(values: Any, what: str, name: str, *, minimum: int, length: int | None = None) -> tuple[int, ...]:
    if isinstance(values, (int, np.integer)) and length is not None:
        values = (values,) * length
    try:
        out = tuple(values)
    except TypeError:
        raise TypeError(f"{what}: {name} must be a sequence of ints, got {values!r}") from None
    for v in out:
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
            raise TypeError(f"{what}: {name} must hold ints, got {values!r}")
        if v < minimum or v > _INT_MAX:
            raise ValueError(f"{what}: {name} must be >= {minimum} (and fit in int32), got {tuple(values)!r}")
    out = tuple(int(v) for v in out)
    if length is not None and len(out) != length:
        raise ValueError(f"{what}: {name} needs {length} values, got {len(out)}: {out!r}")
    return out


def _spatial_rank(what: str, **values: Any) -> int:
    """The number of spatial axes of ``values`` (ints, or sequences of ints, all of one length: the
    first sequence sets it; all ints mean 2-d); a value of another type is a TypeError naming it."""
    rank = None
    for name, value in values.items():
        if value is None or (isinstance(value, (int, np.integer)) and not isinstance(value, bool)):
            continue
        if isinstance(value, (str, bytes, bool)) or not hasattr(value, "__len__"):
            raise TypeError(f"{what}: {name} must be an int or a sequence of ints (one per spatial axis), got "
                            f"{value!r} ({type(value).__name__})")
        rank = len(value) if rank is None else rank
    return 2 if rank is None else rank


def _layout(layout: str, what: str) -> str:
    if not isinstance(layout, str) or layout.upper() not in ("NCHW", "NHWC"):
        raise ValueError(f"{what}: layout must be 'NCHW' or 'NHWC', got {layout!r}")
    return layout.upper()


def _to_cudnn_order(values: tuple[int, ...], layout: str) -> tuple[int, ...]:
    """(N, spatial..., C) -> (N, C, spatial...) for channels-last; unchanged otherwise."""
    if layout == "NHWC":
        return (values[0], values[-1], *values[1:-1])
    return values


def _from_cudnn_order(values: tuple[int, ...], layout: str) -> tuple[int, ...]:
    if layout == "NHWC":
        return (values[0], *values[2:], values[1])
    return values


def _packed_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, acc = [], 1
    for d in reversed(shape):
        strides.append(acc)
        acc *= d
    return tuple(reversed(strides))


def _int_array(values: Sequence[int]) -> ctypes.Array:
    return (ctypes.c_int * len(values))(*values)


_NAN = {False: C.NanPropagation.NOT_PROPAGATE_NAN, True: C.NanPropagation.PROPAGATE_NAN}


def _nan(value: Any, what: str) -> C.NanPropagation:
    if isinstance(value, C.NanPropagation):
        return value
    if not isinstance(value, bool):
        raise TypeError(f"{what}: nan_propagation must be a bool, got {value!r}")
    return _NAN[value]


def _enum_arg(value: Any, names: dict[str, Any], enum: type, what: str, name: str) -> Any:
    if isinstance(value, enum):
        return value
    if isinstance(value, str) and value.lower() in names:
        return names[value.lower()]
    raise ValueError(f"{what}: {name} must be one of {sorted(names)} (or a {enum.__name__}), got {value!r}")


def _require(obj: Any, cls: type, what: str, name: str) -> None:
    """A TypeError before any C call when ``obj`` is not a ``cls`` (a raw pointer int, most often)."""
    if not isinstance(obj, cls):
        raise TypeError(f"{what}: {name} must be a dnnbind.cudnn.{cls.__name__}, got {type(obj).__name__} {obj!r}")


def _name_of(value: int, names: dict[str, Any]) -> str:
    for key, member in names.items():
        if member == value:
            return key
    return str(value)


# ---------------------------------------------------------------------------------------------
# the descriptor base
# ---------------------------------------------------------------------------------------------


class _Descriptor(OwnedPointer):
    """Create/destroy plumbing, a bounded ``cached`` factory, and repr via ``get()``."""

    _create_fn = ""
    _destroy_fn = ""
    _cache: LRUCache
    CACHE_SIZE = 512
    """Keys each class's :meth:`cached` keeps (one descriptor reached by two spellings of its
    arguments, e.g. ``np.float32`` and ``"float32"``, counts twice)."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls._cache = LRUCache(cls.CACHE_SIZE, cls.__name__)

    def _create(self) -> int:
        out = ctypes.c_void_p()
        getattr(C, self._create_fn)(ctypes.byref(out))
        self._adopt(out.value, C.raw(self._destroy_fn))
        return int(out.value)

    def _set(self, function: str, *args: Any, context: dict[str, Any]) -> None:
        try:
            C.call(function, self.handle, *args, context=context)
        except CudnnError:
            self.close()
            raise

    def _check_destroy(self, status: int) -> None:
        C.check(status, self._destroy_fn)

    @classmethod
    def cached(cls, *args: Any, **kwargs: Any):
        """A shared descriptor for these arguments, from a bounded cache per class
        (:data:`CACHE_SIZE` keys; see :class:`dnnbind.cudnn.LRUCache`).

        Descriptors are immutable once built, so ops reuse one per shape instead of creating
        and destroying descriptors on every call. A hit is one dict lookup on the arguments as
        given (no lock); a miss normalises them (lists to tuples, dtypes to names), so every
        spelling of the same arguments shares one descriptor. An evicted descriptor stays valid
        for whoever still holds it. Do not ``close()`` a cached one (it would be rebuilt).
        """
        key = (args, tuple(kwargs.items())) if kwargs else args
        try:
            desc = cls._cache.get(key)
        except TypeError:  # an unhashable argument (a list): only the normalised key finds it
            key, desc = None, None
        if desc is not None and desc._record.ptr:
            return desc
        canonical = _key(args, kwargs)
        desc = cls._cache.get(canonical)
        if desc is None or desc.closed:
            desc = cls._cache.put(canonical, cls(*args, **kwargs))
        if key is not None:
            # Also under the arguments as given, even when they compare equal to the normalised
            # ones: np.dtype("float32") == "float32", but the two hash differently.
            cls._cache.put(key, desc)
        return desc

    @classmethod
    def clear_cache(cls) -> None:
        """Drop every cached descriptor of this class (each is destroyed when its last user lets go)."""
        cls._cache.clear()

    def get(self) -> Any:  # pragma: no cover - every subclass overrides
        raise NotImplementedError

    def __repr__(self) -> str:
        if self.closed:
            return f"<{type(self).__name__} closed>"
        return f"{type(self).__name__}({self.get()})"


def _norm(value: Any) -> Hashable:
    """One argument as a cache-key part: lists become tuples, dtypes (and dtype types) their names."""
    kind = type(value)
    if kind is tuple or kind is int or kind is str or kind is float or value is None:
        return value
    if kind is list:
        return tuple(value)
    if isinstance(value, np.dtype):
        return value.name
    if isinstance(value, type) and issubclass(value, np.generic):
        return np.dtype(value).name
    return value


def _key(args: tuple, kwargs: dict) -> Hashable:
    """The normalised key of descriptor arguments (what a cache miss looks up)."""
    key = tuple([_norm(v) for v in args])
    if kwargs:
        key += (tuple(sorted((k, _norm(v)) for k, v in kwargs.items())),)
    return key


# ---------------------------------------------------------------------------------------------
# tensor
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TensorInfo:
    """What a :class:`TensorDescriptor` holds, in the layout's axis order. Strides in elements."""

    shape: tuple[int, ...]
    dtype: np.dtype
    layout: str
    strides: tuple[int, ...]

    def __str__(self) -> str:
        return f"shape={self.shape}, dtype={self.dtype.name}, layout={self.layout!r}, strides={self.strides}"


class TensorDescriptor(_Descriptor):
    """``cudnnTensorDescriptor_t``: a 4-d NCHW/NHWC tensor, or an N-d (3..8) strided one.

    Parameters
    ----------
    shape:
        Sizes in the layout's axis order: (N, C, H, W) for NCHW, (N, H, W, C) for NHWC;
        for N-d, (N, C, D, H, W) / (N, D, H, W, C).
    dtype:
        float32, float16, bfloat16, float64, int8, int32 or uint8 (NumPy dtype or name).
    layout:
        ``"NCHW"`` or ``"NHWC"``.
    strides:
        Optional strides in elements, same axis order as ``shape``; default packed.
    """

    _create_fn = "cudnnCreateTensorDescriptor"
    _destroy_fn = "cudnnDestroyTensorDescriptor"

    def __init__(self, shape: Sequence[int], dtype: Any, layout: str = "NCHW",
                 strides: Sequence[int] | None = None) -> None:
        what = "TensorDescriptor"
        shape_t = _ints(shape, what, "shape", minimum=1)
        if not 3 <= len(shape_t) <= _MAX_DIMS:
            raise ValueError(
                f"{what}: shape must have 3 to {_MAX_DIMS} dims (pad 1-d/2-d tensors with trailing 1s), "
                f"got {len(shape_t)}: {shape_t}"
            )
        if int(np.prod(shape_t, dtype=np.int64)) > _INT_MAX:
            raise ValueError(f"{what}: shape {shape_t} has more than 2**31-1 elements, the limit of cuDNN's "
                             "tensor descriptors; split the batch")
        layout = _layout(layout, what)
        dt = data_type(dtype, what)
        strides_t = None
        if strides is not None:
            strides_t = _ints(strides, what, "strides", minimum=1)
            if len(strides_t) != len(shape_t):
                raise ValueError(f"{what}: strides {strides_t} must match the rank of shape {shape_t}")
        self._layout = layout
        self._rank = len(shape_t)
        dims = _to_cudnn_order(shape_t, layout)
        context = {"shape": shape_t, "layout": layout, "dtype": _CUDNN_TO_NAME[dt], "strides": strides_t}
        self._create()
        if len(dims) == 4 and strides_t is None:
            self._set("cudnnSetTensor4dDescriptor", C.TensorFormat[layout], dt, *dims, context=context)
            return
        if strides_t is None:
            strides_t = _packed_strides(shape_t)
        cstrides = _to_cudnn_order(strides_t, layout)
        if len(dims) == 4:
            self._set("cudnnSetTensor4dDescriptorEx", dt, *dims, *cstrides, context=context)
        else:
            self._set("cudnnSetTensorNdDescriptor", dt, len(dims), _int_array(dims), _int_array(cstrides),
                      context=context)

    @classmethod
    def for_array(cls, array: Any, layout: str = "NCHW") -> "TensorDescriptor":
        """A (cached) descriptor for an array with ``.shape``, ``.dtype``, ``.strides`` (bytes)."""
        itemsize = np.dtype(array.dtype).itemsize
        byte_strides = tuple(array.strides)
        if any(s % itemsize for s in byte_strides):
            raise ValueError(f"TensorDescriptor.for_array: strides {byte_strides} are not multiples of {itemsize}")
        strides = tuple(s // itemsize for s in byte_strides)
        shape = tuple(array.shape)
        if strides == _packed_strides(shape):
            return cls.cached(shape, np.dtype(array.dtype), layout)
        return cls.cached(shape, np.dtype(array.dtype), layout, strides)

    @property
    def layout(self) -> str:
        return self._layout

    def get(self) -> TensorInfo:
        """Read the descriptor back from cuDNN."""
        if self._rank == 4:
            vals = [ctypes.c_int() for _ in range(9)]
            C.cudnnGetTensor4dDescriptor(self.handle, *(ctypes.byref(v) for v in vals))
            dt, n, c, h, w, sn, sc, sh, sw = (v.value for v in vals)
            dims, strides = (n, c, h, w), (sn, sc, sh, sw)
        else:
            dt_c, nb = ctypes.c_int(), ctypes.c_int()
            dims_a, strides_a = (ctypes.c_int * _MAX_DIMS)(), (ctypes.c_int * _MAX_DIMS)()
            C.cudnnGetTensorNdDescriptor(self.handle, _MAX_DIMS, ctypes.byref(dt_c), ctypes.byref(nb), dims_a,
                                         strides_a)
            dt = dt_c.value
            dims, strides = tuple(dims_a[: nb.value]), tuple(strides_a[: nb.value])
        return TensorInfo(
            shape=_from_cudnn_order(tuple(dims), self._layout),
            dtype=dtype_of(dt),
            layout=self._layout,
            strides=_from_cudnn_order(tuple(strides), self._layout),
        )

    def size_in_bytes(self) -> int:
        """``cudnnGetTensorSizeInBytes``: bytes spanned by the tensor, strides included."""
        out = ctypes.c_size_t()
        C.cudnnGetTensorSizeInBytes(self.handle, ctypes.byref(out))
        return int(out.value)


# ---------------------------------------------------------------------------------------------
# filter
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FilterInfo:
    """What a :class:`FilterDescriptor` holds, in the layout's axis order."""

    shape: tuple[int, ...]
    dtype: np.dtype
    layout: str

    def __str__(self) -> str:
        return f"shape={self.shape}, dtype={self.dtype.name}, layout={self.layout!r}"


class FilterDescriptor(_Descriptor):
    """``cudnnFilterDescriptor_t``: (K, C/g, R, S) for NCHW, (K, R, S, C/g) for NHWC; N-d alike."""

    _create_fn = "cudnnCreateFilterDescriptor"
    _destroy_fn = "cudnnDestroyFilterDescriptor"

    def __init__(self, shape: Sequence[int], dtype: Any, layout: str = "NCHW") -> None:
        what = "FilterDescriptor"
        shape_t = _ints(shape, what, "shape", minimum=1)
        if not 3 <= len(shape_t) <= _MAX_DIMS:
            raise ValueError(f"{what}: shape must have 3 to {_MAX_DIMS} dims (K, C, spatial...), got {shape_t}")
        layout = _layout(layout, what)
        dt = data_type(dtype, what)
        self._layout = layout
        self._rank = len(shape_t)
        dims = _to_cudnn_order(shape_t, layout)
        context = {"shape": shape_t, "layout": layout, "dtype": _CUDNN_TO_NAME[dt]}
        self._create()
        if len(dims) == 4:
            self._set("cudnnSetFilter4dDescriptor", dt, C.TensorFormat[layout], *dims, context=context)
        else:
            self._set("cudnnSetFilterNdDescriptor", dt, C.TensorFormat[layout], len(dims), _int_array(dims),
                      context=context)

    @property
    def layout(self) -> str:
        return self._layout

    def get(self) -> FilterInfo:
        dt, fmt, nb = ctypes.c_int(), ctypes.c_int(), ctypes.c_int()
        dims_a = (ctypes.c_int * _MAX_DIMS)()
        C.cudnnGetFilterNdDescriptor(self.handle, _MAX_DIMS, ctypes.byref(dt), ctypes.byref(fmt), ctypes.byref(nb),
                                     dims_a)
        layout = C.TensorFormat(fmt.value).name
        return FilterInfo(shape=_from_cudnn_order(tuple(dims_a[: nb.value]), layout), dtype=dtype_of(dt.value),
                          layout=layout)

    def size_in_bytes(self) -> int:
        out = ctypes.c_size_t()
        C.cudnnGetFilterSizeInBytes(self.handle, ctypes.byref(out))
        return int(out.value)


# ---------------------------------------------------------------------------------------------
# convolution
# ---------------------------------------------------------------------------------------------

_MATH = {
    "default": C.MathType.DEFAULT_MATH,
    "tensor_op": C.MathType.TENSOR_OP_MATH,
    "tensor_op_allow_conversion": C.MathType.TENSOR_OP_MATH_ALLOW_CONVERSION,
    "fma": C.MathType.FMA_MATH,
}
_CONV_MODE = {"cross_correlation": C.ConvolutionMode.CROSS_CORRELATION, "convolution": C.ConvolutionMode.CONVOLUTION}


@dataclass(frozen=True)
class ConvolutionInfo:
    """What a :class:`ConvolutionDescriptor` holds."""

    pad: tuple[int, ...]
    stride: tuple[int, ...]
    dilation: tuple[int, ...]
    groups: int
    compute_dtype: np.dtype
    math: str
    mode: str

    def __str__(self) -> str:
        return (f"pad={self.pad}, stride={self.stride}, dilation={self.dilation}, groups={self.groups}, "
                f"compute_dtype={self.compute_dtype.name}, math={self.math!r}, mode={self.mode!r}")


class ConvolutionDescriptor(_Descriptor):
    """``cudnnConvolutionDescriptor_t`` for a 2-d (or N-d) convolution.

    Parameters
    ----------
    pad, stride, dilation:
        Per spatial axis (an int applies to all; all ints means 2-d); padding is symmetric
        in cuDNN. The number of spatial axes comes from the first sequence given.
    groups:
        Group count (``cudnnSetConvolutionGroupCount``).
    compute_dtype:
        Accumulation type: float32 (also for fp16/bf16 data), float64, int32...
    math:
        ``"tensor_op"``, ``"tensor_op_allow_conversion"`` (lets fp32 use TF32/fp16 tensor
        cores), ``"default"`` or ``"fma"`` (no tensor cores: exact fp32).
    mode:
        ``"cross_correlation"`` (what deep learning calls convolution) or ``"convolution"``.
    """

    _create_fn = "cudnnCreateConvolutionDescriptor"
    _destroy_fn = "cudnnDestroyConvolutionDescriptor"

    def __init__(self, pad: Any = 0, stride: Any = 1, dilation: Any = 1, groups: int = 1,
                 compute_dtype: Any = "float32", math: Any = "tensor_op", mode: Any = "cross_correlation") -> None:
        what = "ConvolutionDescriptor"
        rank = _spatial_rank(what, pad=pad, stride=stride, dilation=dilation)
        if not 1 <= rank <= _MAX_DIMS - 2:
            raise ValueError(f"{what}: 1 to {_MAX_DIMS - 2} spatial dims supported, got {rank}")
        pad_t = _ints(pad, what, "pad", minimum=0, length=rank)
        stride_t = _ints(stride, what, "stride", minimum=1, length=rank)
        dilation_t = _ints(dilation, what, "dilation", minimum=1, length=rank)
        (groups_v,) = _ints((groups,), what, "groups", minimum=1)
        compute = data_type(compute_dtype, what)
        math_v = _enum_arg(math, _MATH, C.MathType, what, "math")
        mode_v = _enum_arg(mode, _CONV_MODE, C.ConvolutionMode, what, "mode")
        self._rank = rank
        context = {"pad": pad_t, "stride": stride_t, "dilation": dilation_t, "groups": groups_v,
                   "compute_dtype": _CUDNN_TO_NAME[compute], "math": _name_of(math_v, _MATH)}
        self._create()
        if rank == 2:
            self._set("cudnnSetConvolution2dDescriptor", *pad_t, *stride_t, *dilation_t, mode_v, compute,
                      context=context)
        else:
            self._set("cudnnSetConvolutionNdDescriptor", rank, _int_array(pad_t), _int_array(stride_t),
                      _int_array(dilation_t), mode_v, compute, context=context)
        self._set("cudnnSetConvolutionGroupCount", groups_v, context=context)
        self._set("cudnnSetConvolutionMathType", math_v, context=context)

    def get(self) -> ConvolutionInfo:
        h = self.handle
        if self._rank == 2:
            vals = [ctypes.c_int() for _ in range(8)]
            C.cudnnGetConvolution2dDescriptor(h, *(ctypes.byref(v) for v in vals))
            ph, pw, sh, sw, dh, dw, mode, compute = (v.value for v in vals)
            pad, stride, dilation = (ph, pw), (sh, sw), (dh, dw)
        else:
            n = ctypes.c_int()
            pa, sa, da = ((ctypes.c_int * self._rank)() for _ in range(3))
            mode_c, compute_c = ctypes.c_int(), ctypes.c_int()
            C.cudnnGetConvolutionNdDescriptor(h, self._rank, ctypes.byref(n), pa, sa, da, ctypes.byref(mode_c),
                                              ctypes.byref(compute_c))
            pad, stride, dilation = tuple(pa), tuple(sa), tuple(da)
            mode, compute = mode_c.value, compute_c.value
        groups, math = ctypes.c_int(), ctypes.c_int()
        C.cudnnGetConvolutionGroupCount(h, ctypes.byref(groups))
        C.cudnnGetConvolutionMathType(h, ctypes.byref(math))
        return ConvolutionInfo(pad=pad, stride=stride, dilation=dilation, groups=groups.value,
                               compute_dtype=dtype_of(compute), math=_name_of(math.value, _MATH),
                               mode=_name_of(mode, _CONV_MODE))

    def _check_window_fits(self, x_desc: TensorDescriptor, w_desc: FilterDescriptor) -> None:
        """cuDNN answers BAD_PARAM, without saying why, for a (dilated) kernel larger than the padded input:
        say it with the shapes first."""
        x, w, conv = x_desc.get(), w_desc.get(), self.get()
        x_spatial = _to_cudnn_order(tuple(x.shape), x_desc.layout)[2:]
        w_spatial = _to_cudnn_order(tuple(w.shape), w.layout)[2:]
        for axis, (size, k, p, d) in enumerate(zip(x_spatial, w_spatial, conv.pad, conv.dilation)):
            window = (k - 1) * d + 1
            if window > size + 2 * p:
                raise ValueError(
                    f"ConvolutionDescriptor.forward_output_dim: the kernel spans {window} along spatial axis {axis} "
                    f"(size {k}, dilation {d}) but the input is {size} + 2 x {p} padding = {size + 2 * p} there: the "
                    f"output would be empty (x {tuple(x.shape)} {x_desc.layout}, w {tuple(w.shape)} {w.layout}, pad "
                    f"{conv.pad}, dilation {conv.dilation}); pad more, or use a smaller kernel or dilation")

    def forward_output_dim(self, x_desc: TensorDescriptor, w_desc: FilterDescriptor) -> tuple[int, ...]:
        """Output shape of the forward convolution, in ``x_desc``'s layout order.

        ``cudnnGetConvolution2dForwardOutputDim`` (Nd for other ranks); works without a GPU.
        """
        _require(x_desc, TensorDescriptor, "ConvolutionDescriptor.forward_output_dim", "x_desc")
        _require(w_desc, FilterDescriptor, "ConvolutionDescriptor.forward_output_dim", "w_desc")
        if x_desc._rank != self._rank + 2 or w_desc._rank != self._rank + 2:
            raise ValueError(
                f"ConvolutionDescriptor.forward_output_dim: a {self._rank}-d convolution needs "
                f"{self._rank + 2}-d x and w descriptors, got x {x_desc.get().shape} and w {w_desc.get().shape}"
            )
        self._check_window_fits(x_desc, w_desc)
        context = {"x": x_desc, "w": w_desc, "conv": self}
        if self._rank == 2:
            out = [ctypes.c_int() for _ in range(4)]
            C.call("cudnnGetConvolution2dForwardOutputDim", self.handle, x_desc.handle, w_desc.handle,
                   *(ctypes.byref(v) for v in out), context=context)
            dims = tuple(v.value for v in out)
        else:
            arr = (ctypes.c_int * (self._rank + 2))()
            C.call("cudnnGetConvolutionNdForwardOutputDim", self.handle, x_desc.handle, w_desc.handle,
                   self._rank + 2, arr, context=context)
            dims = tuple(arr)
        return _from_cudnn_order(dims, x_desc.layout)


# ---------------------------------------------------------------------------------------------
# pooling
# ---------------------------------------------------------------------------------------------

_POOL_MODE = {
    "max": C.PoolingMode.MAX,
    "max_deterministic": C.PoolingMode.MAX_DETERMINISTIC,
    "avg": C.PoolingMode.AVERAGE_COUNT_EXCLUDE_PADDING,
    "avg_include_pad": C.PoolingMode.AVERAGE_COUNT_INCLUDE_PADDING,
}


@dataclass(frozen=True)
class PoolingInfo:
    """What a :class:`PoolingDescriptor` holds."""

    mode: str
    window: tuple[int, ...]
    pad: tuple[int, ...]
    stride: tuple[int, ...]
    nan_propagation: bool

    def __str__(self) -> str:
        return (f"mode={self.mode!r}, window={self.window}, pad={self.pad}, stride={self.stride}, "
                f"nan_propagation={self.nan_propagation}")


class PoolingDescriptor(_Descriptor):
    """``cudnnPoolingDescriptor_t``.

    ``mode``: ``"max"``, ``"max_deterministic"``, ``"avg"`` (padding excluded from the
    count) or ``"avg_include_pad"``. ``window``, ``pad``, ``stride`` per spatial axis.
    """

    _create_fn = "cudnnCreatePoolingDescriptor"
    _destroy_fn = "cudnnDestroyPoolingDescriptor"

    def __init__(self, mode: Any = "max", window: Any = 2, pad: Any = 0, stride: Any = None,
                 nan_propagation: bool = False) -> None:
        what = "PoolingDescriptor"
        mode_v = _enum_arg(mode, _POOL_MODE, C.PoolingMode, what, "mode")
        rank = _spatial_rank(what, window=window, pad=pad, stride=stride)
        window_t = _ints(window, what, "window", minimum=1, length=rank)
        pad_t = _ints(pad, what, "pad", minimum=0, length=rank)
        stride_t = window_t if stride is None else _ints(stride, what, "stride", minimum=1, length=rank)
        for p, w in zip(pad_t, window_t):
            if p >= w:
                raise ValueError(f"{what}: padding {pad_t} must be smaller than the window {window_t}")
        nan = _nan(nan_propagation, what)
        self._rank = rank
        context = {"mode": _name_of(mode_v, _POOL_MODE), "window": window_t, "pad": pad_t, "stride": stride_t}
        self._create()
        if rank == 2:
            self._set("cudnnSetPooling2dDescriptor", mode_v, nan, *window_t, *pad_t, *stride_t, context=context)
        else:
            self._set("cudnnSetPoolingNdDescriptor", mode_v, nan, rank, _int_array(window_t), _int_array(pad_t),
                      _int_array(stride_t), context=context)

    def get(self) -> PoolingInfo:
        mode, nan, nb = ctypes.c_int(), ctypes.c_int(), ctypes.c_int()
        wa, pa, sa = ((ctypes.c_int * self._rank)() for _ in range(3))
        C.cudnnGetPoolingNdDescriptor(self.handle, self._rank, ctypes.byref(mode), ctypes.byref(nan),
                                      ctypes.byref(nb), wa, pa, sa)
        return PoolingInfo(mode=_name_of(mode.value, _POOL_MODE), window=tuple(wa), pad=tuple(pa), stride=tuple(sa),
                           nan_propagation=bool(nan.value))

    def forward_output_dim(self, x_desc: TensorDescriptor) -> tuple[int, ...]:
        """Output shape of pooling ``x_desc``, in ``x_desc``'s layout order (works without a GPU)."""
        _require(x_desc, TensorDescriptor, "PoolingDescriptor.forward_output_dim", "x_desc")
        if x_desc._rank != self._rank + 2:
            raise ValueError(f"PoolingDescriptor.forward_output_dim: a {self._rank}-d pooling needs a "
                             f"{self._rank + 2}-d x descriptor, got {x_desc.get().shape}")
        arr = (ctypes.c_int * x_desc._rank)()
        C.call("cudnnGetPoolingNdForwardOutputDim", self.handle, x_desc.handle, x_desc._rank, arr,
               context={"x": x_desc, "pooling": self})
        return _from_cudnn_order(tuple(arr), x_desc.layout)


# ---------------------------------------------------------------------------------------------
# activation
# ---------------------------------------------------------------------------------------------

_ACTIVATION = {
    "sigmoid": C.ActivationMode.SIGMOID,
    "relu": C.ActivationMode.RELU,
    "tanh": C.ActivationMode.TANH,
    "clipped_relu": C.ActivationMode.CLIPPED_RELU,
    "elu": C.ActivationMode.ELU,
    "identity": C.ActivationMode.IDENTITY,
    "swish": C.ActivationMode.SWISH,
}


@dataclass(frozen=True)
class ActivationInfo:
    """What an :class:`ActivationDescriptor` holds (``swish_beta`` only for swish)."""

    mode: str
    coef: float
    nan_propagation: bool
    swish_beta: float | None

    def __str__(self) -> str:
        beta = f", swish_beta={self.swish_beta}" if self.swish_beta is not None else ""
        return f"mode={self.mode!r}, coef={self.coef}, nan_propagation={self.nan_propagation}{beta}"


class ActivationDescriptor(_Descriptor):
    """``cudnnActivationDescriptor_t``.

    ``mode``: sigmoid, relu, tanh, clipped_relu (``coef`` = ceiling), elu (``coef`` = alpha),
    identity, swish (``swish_beta``: x * sigmoid(beta * x), default 1).
    """

    _create_fn = "cudnnCreateActivationDescriptor"
    _destroy_fn = "cudnnDestroyActivationDescriptor"

    def __init__(self, mode: Any = "relu", coef: float = 0.0, swish_beta: float | None = None,
                 nan_propagation: bool = False) -> None:
        what = "ActivationDescriptor"
        mode_v = _enum_arg(mode, _ACTIVATION, C.ActivationMode, what, "mode")
        if isinstance(coef, bool) or not isinstance(coef, (int, float, np.floating, np.integer)):
            raise TypeError(f"{what}: coef must be a number, got {coef!r}")
        if not math.isfinite(coef):
            raise ValueError(f"{what}: coef must be a finite number (clipped_relu's ceiling, elu's alpha), got {coef!r}")
        if mode_v == C.ActivationMode.CLIPPED_RELU and coef <= 0:
            raise ValueError(f"{what}: clipped_relu needs a positive ceiling coef, got {coef!r}")
        if swish_beta is not None and (isinstance(swish_beta, bool) or not isinstance(
                swish_beta, (int, float, np.floating, np.integer)) or not math.isfinite(swish_beta)):
            raise ValueError(f"{what}: swish_beta must be a finite number, got {swish_beta!r}")
        if swish_beta is not None and mode_v != C.ActivationMode.SWISH:
            raise ValueError(f"{what}: swish_beta only applies to mode 'swish', got mode {mode!r}")
        nan = _nan(nan_propagation, what)
        self._swish = mode_v == C.ActivationMode.SWISH
        context = {"mode": _name_of(mode_v, _ACTIVATION), "coef": coef, "swish_beta": swish_beta}
        self._create()
        self._set("cudnnSetActivationDescriptor", mode_v, nan, float(coef), context=context)
        if self._swish:
            self._set("cudnnSetActivationDescriptorSwishBeta", 1.0 if swish_beta is None else float(swish_beta),
                      context=context)

    def get(self) -> ActivationInfo:
        mode, nan, coef = ctypes.c_int(), ctypes.c_int(), ctypes.c_double()
        C.cudnnGetActivationDescriptor(self.handle, ctypes.byref(mode), ctypes.byref(nan), ctypes.byref(coef))
        beta = None
        if self._swish:
            b = ctypes.c_double()
            C.cudnnGetActivationDescriptorSwishBeta(self.handle, ctypes.byref(b))
            beta = b.value
        return ActivationInfo(mode=_name_of(mode.value, _ACTIVATION), coef=coef.value,
                              nan_propagation=bool(nan.value), swish_beta=beta)


# ---------------------------------------------------------------------------------------------
# op-tensor and reduce-tensor
# ---------------------------------------------------------------------------------------------

_OP_TENSOR = {op.name.lower(): op for op in C.OpTensorOp}
_REDUCE = {op.name.lower(): op for op in C.ReduceTensorOp}
_INDICES_TYPE = {"int32": C.IndicesType.INDICES_32BIT, "int64": C.IndicesType.INDICES_64BIT,
                 "int16": C.IndicesType.INDICES_16BIT, "int8": C.IndicesType.INDICES_8BIT}


@dataclass(frozen=True)
class OpTensorInfo:
    """What an :class:`OpTensorDescriptor` holds."""

    op: str
    compute_dtype: np.dtype
    nan_propagation: bool

    def __str__(self) -> str:
        return f"op={self.op!r}, compute_dtype={self.compute_dtype.name}, nan_propagation={self.nan_propagation}"


class OpTensorDescriptor(_Descriptor):
    """``cudnnOpTensorDescriptor_t`` for ``cudnnOpTensor``: op in add, mul, min, max, sqrt, not."""

    _create_fn = "cudnnCreateOpTensorDescriptor"
    _destroy_fn = "cudnnDestroyOpTensorDescriptor"

    def __init__(self, op: Any = "add", compute_dtype: Any = "float32", nan_propagation: bool = False) -> None:
        what = "OpTensorDescriptor"
        op_v = _enum_arg(op, _OP_TENSOR, C.OpTensorOp, what, "op")
        compute = data_type(compute_dtype, what)
        nan = _nan(nan_propagation, what)
        self._create()
        self._set("cudnnSetOpTensorDescriptor", op_v, compute, nan,
                  context={"op": op_v.name.lower(), "compute_dtype": _CUDNN_TO_NAME[compute]})

    def get(self) -> OpTensorInfo:
        op, compute, nan = ctypes.c_int(), ctypes.c_int(), ctypes.c_int()
        C.cudnnGetOpTensorDescriptor(self.handle, ctypes.byref(op), ctypes.byref(compute), ctypes.byref(nan))
        return OpTensorInfo(op=C.OpTensorOp(op.value).name.lower(), compute_dtype=dtype_of(compute.value),
                            nan_propagation=bool(nan.value))


@dataclass(frozen=True)
class ReduceTensorInfo:
    """What a :class:`ReduceTensorDescriptor` holds."""

    op: str
    compute_dtype: np.dtype
    nan_propagation: bool
    indices: bool
    indices_type: str

    def __str__(self) -> str:
        return (f"op={self.op!r}, compute_dtype={self.compute_dtype.name}, nan_propagation={self.nan_propagation}, "
                f"indices={self.indices}, indices_type={self.indices_type!r}")


class ReduceTensorDescriptor(_Descriptor):
    """``cudnnReduceTensorDescriptor_t`` for ``cudnnReduceTensor``.

    ``op``: add, mul, min, max, amax, avg, norm1, norm2, mul_no_zeros. ``indices=True``
    asks for flattened argmin/argmax indices (min/max/amax only) of ``indices_type``.
    """

    _create_fn = "cudnnCreateReduceTensorDescriptor"
    _destroy_fn = "cudnnDestroyReduceTensorDescriptor"

    def __init__(self, op: Any = "add", compute_dtype: Any = "float32", nan_propagation: bool = False,
                 indices: bool = False, indices_type: str = "int32") -> None:
        what = "ReduceTensorDescriptor"
        op_v = _enum_arg(op, _REDUCE, C.ReduceTensorOp, what, "op")
        compute = data_type(compute_dtype, what)
        nan = _nan(nan_propagation, what)
        if not isinstance(indices, bool):
            raise TypeError(f"{what}: indices must be a bool, got {indices!r}")
        if indices and op_v not in (C.ReduceTensorOp.MIN, C.ReduceTensorOp.MAX, C.ReduceTensorOp.AMAX):
            raise ValueError(f"{what}: indices are only produced for min, max and amax, not {op!r}")
        itype = _enum_arg(indices_type, _INDICES_TYPE, C.IndicesType, what, "indices_type")
        flag = C.ReduceTensorIndices.FLATTENED_INDICES if indices else C.ReduceTensorIndices.NO_INDICES
        self._create()
        self._set("cudnnSetReduceTensorDescriptor", op_v, compute, nan, flag, itype,
                  context={"op": op_v.name.lower(), "compute_dtype": _CUDNN_TO_NAME[compute], "indices": indices})

    def get(self) -> ReduceTensorInfo:
        vals = [ctypes.c_int() for _ in range(5)]
        C.cudnnGetReduceTensorDescriptor(self.handle, *(ctypes.byref(v) for v in vals))
        op, compute, nan, flag, itype = (v.value for v in vals)
        return ReduceTensorInfo(op=C.ReduceTensorOp(op).name.lower(), compute_dtype=dtype_of(compute),
                                nan_propagation=bool(nan), indices=flag == C.ReduceTensorIndices.FLATTENED_INDICES,
                                indices_type=_name_of(itype, _INDICES_TYPE))


# ---------------------------------------------------------------------------------------------
# dropout
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DropoutInfo:
    """What a :class:`DropoutDescriptor` holds (``states`` is the device pointer of the RNG states)."""

    rate: float
    seed: int
    states: int

    def __str__(self) -> str:
        return f"rate={self.rate}, seed={self.seed}, states={self.states:#x}"


class DropoutDescriptor(_Descriptor):
    """``cudnnDropoutDescriptor_t`` with its RNG state buffer (needs a GPU).

    Parameters
    ----------
    handle:
        The :class:`dnnbind.cudnn.Handle`; the states are initialised by a kernel on its stream.
        A bare int is refused (TypeError): wrap a raw ``cudnnHandle_t`` with
        :meth:`Handle.borrow <dnnbind.cudnn.Handle.borrow>`.
    rate:
        Probability of dropping an element, in [0, 1).
    seed:
        RNG seed (unsigned 64-bit).
    states:
        An existing states buffer (``.ptr``, ``.nbytes``; e.g. another descriptor's
        :attr:`states`) to restore instead of re-initialising (``cudnnRestoreDropoutDescriptor``).
        By default one is allocated with :func:`dnnbind.cuda.alloc` and owned here.
    """

    _create_fn = "cudnnCreateDropoutDescriptor"
    _destroy_fn = "cudnnDestroyDropoutDescriptor"

    def __init__(self, handle: Handle, rate: float, seed: int = 0, states: Any = None) -> None:
        what = "DropoutDescriptor"
        if isinstance(rate, bool) or not isinstance(rate, (int, float, np.floating)) or not 0.0 <= rate < 1.0:
            raise ValueError(f"{what}: rate must be a float in [0, 1), got {rate!r}")
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or not 0 <= seed < 2**64:
            raise ValueError(f"{what}: seed must be an int in [0, 2**64), got {seed!r}")
        raw_handle = require_handle(handle, what).handle
        size = self.states_size(handle)
        restore = states is not None
        if restore:
            if getattr(states, "nbytes", 0) < size:
                raise ValueError(f"{what}: states buffer holds {getattr(states, 'nbytes', None)} bytes, cuDNN needs "
                                 f"{size}")
        else:
            # Allocated on the handle's stream: the initialising kernel runs there, in order.
            states = cuda.alloc(size, stream=getattr(handle, "bound_stream", None), what="cuDNN dropout states")
        self._handle = handle  # the states were initialised on its stream; keep it alive with them
        self.states = states
        self.rate = float(rate)
        self.seed = int(seed)
        context = {"rate": rate, "seed": seed, "states_bytes": size, "restore": restore}
        self._create()
        fn = "cudnnRestoreDropoutDescriptor" if restore else "cudnnSetDropoutDescriptor"
        self._set(fn, raw_handle, ctypes.c_float(rate), int(states.ptr), size, ctypes.c_ulonglong(seed),
                  context=context)

    @staticmethod
    def states_size(handle: Handle) -> int:
        """Bytes of RNG state cuDNN needs for ``handle`` (a :class:`Handle`; ``cudnnDropoutGetStatesSize``)."""
        raw_handle = require_handle(handle, "DropoutDescriptor.states_size").handle
        out = ctypes.c_size_t()
        C.cudnnDropoutGetStatesSize(raw_handle, ctypes.byref(out))
        return int(out.value)

    @staticmethod
    def reserve_space_size(x_desc: TensorDescriptor) -> int:
        """Bytes of reserve space (the mask) for dropout over ``x_desc``; works without a GPU."""
        _require(x_desc, TensorDescriptor, "DropoutDescriptor.reserve_space_size", "x_desc")
        out = ctypes.c_size_t()
        C.call("cudnnDropoutGetReserveSpaceSize", x_desc.handle, ctypes.byref(out), context={"x": x_desc})
        return int(out.value)

    @classmethod
    def cached(cls, *args: Any, **kwargs: Any):
        raise TypeError("DropoutDescriptor owns RNG state and cannot be shared through cached()")

    def get(self) -> DropoutInfo:
        raw_handle = self._handle.handle
        rate, states, seed = ctypes.c_float(), ctypes.c_void_p(), ctypes.c_ulonglong()
        C.cudnnGetDropoutDescriptor(self.handle, raw_handle, ctypes.byref(rate), ctypes.byref(states),
                                    ctypes.byref(seed))
        return DropoutInfo(rate=float(rate.value), seed=int(seed.value), states=int(states.value or 0))
