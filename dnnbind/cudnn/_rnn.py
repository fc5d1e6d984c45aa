"""Owned descriptors of cuDNN's RNN API (cudnn_adv_v9.h): :class:`RNNDescriptor` and :class:`RNNDataDescriptor`.

Setting and reading them back needs no GPU; what needs a handle (the weight space size and layout, the work and
reserve space sizes, ``cudnnBuildRNNDynamic``) takes a :class:`dnnbind.cudnn.Handle`. Arguments are checked in
Python before any C call (``ValueError``/``TypeError`` naming the descriptor and the value); a failed C call
raises :class:`dnnbind.errors.CudnnError` carrying the arguments.

cuDNN's packed weight space holds, per pseudo-layer (layer * directions + direction), one matrix and one bias
per *linear layer*: ``gates`` input matrices ``(hidden, input)`` then ``gates`` recurrent matrices ``(hidden,
hidden)`` (LSTM linear layers 0-3 are i, f, c(g), o on the input, 4-7 the same on the recurrence; GRU 0-2 are
r, z, h on the input, 3-5 on the recurrence; a plain RNN 0 and 1). :meth:`RNNDescriptor.weight_params` says
where each lies (offsets in elements from the start of the weight space).
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from .._lib import cudnn as C
from ._descriptors import _Descriptor, _CUDNN_TO_NAME, _enum_arg, _name_of, _require, data_type, dtype_of
from ._descriptors import DropoutDescriptor
from ._handle import Handle, require_handle

__all__ = ["RNNDescriptor", "RNNDataDescriptor", "RNNInfo", "RNNDataInfo", "RNNWeightParam"]

_INT32_MAX = 2**31 - 1

_CELLS = {"relu": C.RNNMode.RNN_RELU, "tanh": C.RNNMode.RNN_TANH, "lstm": C.RNNMode.LSTM, "gru": C.RNNMode.GRU}
#: linear layers per pseudo-layer (input and recurrent matrices of every gate)
_LINEAR_LAYERS = {C.RNNMode.RNN_RELU: 2, C.RNNMode.RNN_TANH: 2, C.RNNMode.LSTM: 8, C.RNNMode.GRU: 6}
_BIAS = {"none": C.RNNBiasMode.NO_BIAS, "single_input": C.RNNBiasMode.SINGLE_INP_BIAS,
         "double": C.RNNBiasMode.DOUBLE_BIAS, "single_recurrent": C.RNNBiasMode.SINGLE_REC_BIAS}
_ALGO = {"standard": C.RNNAlgo.STANDARD, "persist_static": C.RNNAlgo.PERSIST_STATIC,
         "persist_dynamic": C.RNNAlgo.PERSIST_DYNAMIC, "persist_static_small_h": C.RNNAlgo.PERSIST_STATIC_SMALL_H}
_INPUT_MODE = {"linear": C.RNNInputMode.LINEAR_INPUT, "skip": C.RNNInputMode.SKIP_INPUT}
_MATH = {"default": C.MathType.DEFAULT_MATH, "tensor_op": C.MathType.TENSOR_OP_MATH,
         "tensor_op_allow_conversion": C.MathType.TENSOR_OP_MATH_ALLOW_CONVERSION, "fma": C.MathType.FMA_MATH}
_LAYOUT = {"seq_major_unpacked": C.RNNDataLayout.SEQ_MAJOR_UNPACKED,
           "seq_major_packed": C.RNNDataLayout.SEQ_MAJOR_PACKED,
           "batch_major_unpacked": C.RNNDataLayout.BATCH_MAJOR_UNPACKED}
# data type -> the math precisions cuDNN computes it in (the first is the default)
_MATH_PRECISIONS = {C.DataType.FLOAT: (C.DataType.FLOAT,), C.DataType.DOUBLE: (C.DataType.DOUBLE,),
                    C.DataType.HALF: (C.DataType.FLOAT, C.DataType.HALF), C.DataType.BFLOAT16: (C.DataType.FLOAT,)}


def _size(value: Any, what: str, name: str, *, minimum: int = 1) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{what}: {name} must be an int, got {value!r}")
    if not minimum <= int(value) <= _INT32_MAX:
        raise ValueError(f"{what}: {name} must be in [{minimum}, 2**31 - 1], got {value!r}")
    return int(value)


def _rnn_data_type(dtype: Any, what: str) -> C.DataType:
    value = data_type(dtype, what)
    if value not in _MATH_PRECISIONS:
        raise ValueError(f"{what}: the RNN API takes float32, float64, float16 or bfloat16 data, got "
                         f"{_CUDNN_TO_NAME.get(value, value)}")
    return value


@dataclass(frozen=True)
class RNNInfo:
    """What an :class:`RNNDescriptor` holds (``cudnnGetRNNDescriptor_v8``)."""

    algo: str
    cell: str
    bias: str
    bidirectional: bool
    input_mode: str
    dtype: np.dtype
    math_precision: np.dtype
    math_type: str
    input_size: int
    hidden_size: int
    proj_size: int
    num_layers: int
    padded_io: bool

    def __str__(self) -> str:
        return (f"cell={self.cell!r}, input_size={self.input_size}, hidden_size={self.hidden_size}, "
                f"proj_size={self.proj_size}, num_layers={self.num_layers}, bidirectional={self.bidirectional}, "
                f"bias={self.bias!r}, dtype={self.dtype.name}, math_precision={self.math_precision.name}, "
                f"math_type={self.math_type!r}, algo={self.algo!r}, input_mode={self.input_mode!r}, "
                f"padded_io={self.padded_io}")


@dataclass(frozen=True)
class RNNWeightParam:
    """Where one linear layer's matrix and bias lie in the weight space: offsets in elements from its start
    and shapes (cuDNN's: matrix ``(rows, columns)`` row-major, bias ``(rows,)``). ``None`` where the bias mode
    has no such bias."""

    matrix_offset: int
    matrix_shape: tuple[int, ...]
    bias_offset: "int | None"
    bias_shape: "tuple[int, ...] | None"


class RNNDescriptor(_Descriptor):
    """``cudnnRNNDescriptor_t`` (``cudnnSetRNNDescriptor_v8``).

    Parameters
    ----------
    cell:
        ``"lstm"``, ``"gru"``, ``"tanh"`` or ``"relu"`` (a plain RNN with that activation).
    input_size, hidden_size:
        Features of the input vectors and of the hidden state.
    num_layers:
        Stacked layers (1 for one Keras layer).
    bidirectional:
        Both directions in one call (outputs concatenated on the feature axis).
    dtype:
        Data and weight type: float32, float64, float16 or bfloat16.
    math_precision:
        The compute type: the data type for float32 and float64, float32 (default) or float16 for
        float16, float32 for bfloat16.
    math_type:
        ``"default"``, ``"tensor_op"``, ``"tensor_op_allow_conversion"`` or ``"fma"``.
    bias:
        ``"double"`` (an input and a recurrent bias per gate: Keras GRU ``reset_after=True``), ``"single_input"``,
        ``"single_recurrent"`` or ``"none"``.
    algo:
        ``"standard"``, ``"persist_static"``, ``"persist_dynamic"`` (needs :meth:`build_dynamic`) or
        ``"persist_static_small_h"``.
    proj_size:
        The LSTM's recurrent projection size (None: no projection, cuDNN's ``projSize = hidden_size``).
    input_mode:
        ``"linear"`` (an input matrix) or ``"skip"`` (input_size must equal hidden_size).
    padded_io:
        ``CUDNN_RNN_PADDED_IO_ENABLED``: unpacked (padded) data layouts may be used.
    dropout:
        A :class:`DropoutDescriptor` for dropout between stacked layers, or None (no dropout).
    """

    _create_fn = "cudnnCreateRNNDescriptor"
    _destroy_fn = "cudnnDestroyRNNDescriptor"

    def __init__(self, cell: Any, input_size: int, hidden_size: int, *, num_layers: int = 1,
                 bidirectional: bool = False, dtype: Any = "float32", math_precision: Any = None,
                 math_type: Any = "default", bias: Any = "double", algo: Any = "standard",
                 proj_size: "int | None" = None, input_mode: Any = "linear", padded_io: bool = True,
                 dropout: "DropoutDescriptor | None" = None) -> None:
        what = "RNNDescriptor"
        cell_v = _enum_arg(cell, _CELLS, C.RNNMode, what, "cell")
        input_size = _size(input_size, what, "input_size")
        hidden_size = _size(hidden_size, what, "hidden_size")
        num_layers = _size(num_layers, what, "num_layers")
        for name, value in (("bidirectional", bidirectional), ("padded_io", padded_io)):
            if not isinstance(value, (bool, np.bool_)):
                raise TypeError(f"{what}: {name} must be a bool, got {value!r}")
        data = _rnn_data_type(dtype, what)
        allowed = _MATH_PRECISIONS[data]
        precision = allowed[0] if math_precision is None else data_type(math_precision, what)
        if precision not in allowed:
            raise ValueError(f"{what}: math_precision {_CUDNN_TO_NAME.get(precision)} is not valid for "
                             f"{_CUDNN_TO_NAME[data]} data; use one of {[_CUDNN_TO_NAME[p] for p in allowed]}")
        math_v = _enum_arg(math_type, _MATH, C.MathType, what, "math_type")
        bias_v = _enum_arg(bias, _BIAS, C.RNNBiasMode, what, "bias")
        algo_v = _enum_arg(algo, _ALGO, C.RNNAlgo, what, "algo")
        input_v = _enum_arg(input_mode, _INPUT_MODE, C.RNNInputMode, what, "input_mode")
        if input_v == C.RNNInputMode.SKIP_INPUT and input_size != hidden_size:
            raise ValueError(f"{what}: input_mode 'skip' needs input_size == hidden_size, got {input_size} and "
                             f"{hidden_size}")
        if proj_size is None:
            proj = hidden_size
        else:
            proj = _size(proj_size, what, "proj_size")
            if cell_v != C.RNNMode.LSTM and proj != hidden_size:
                raise ValueError(f"{what}: proj_size (a recurrent projection) is only for 'lstm', got cell {cell!r}")
            if proj > hidden_size:
                raise ValueError(f"{what}: proj_size must be at most hidden_size={hidden_size}, got {proj}")
        if dropout is not None:
            _require(dropout, DropoutDescriptor, what, "dropout")
        self._dropout = dropout  # cuDNN keeps the pointer: the descriptor must outlive this one
        self.cell = _name_of(cell_v, _CELLS)
        self.bidirectional = bool(bidirectional)
        self.num_layers = num_layers
        self.dtype = dtype_of(data)
        context = {"cell": self.cell, "input_size": input_size, "hidden_size": hidden_size, "proj_size": proj,
                   "num_layers": num_layers, "bidirectional": self.bidirectional, "dtype": self.dtype.name,
                   "math_precision": _CUDNN_TO_NAME[precision], "bias": _name_of(bias_v, _BIAS),
                   "algo": _name_of(algo_v, _ALGO)}
        self._create()
        self._set("cudnnSetRNNDescriptor_v8", algo_v, cell_v, bias_v,
                  C.DirectionMode.BIDIRECTIONAL if bidirectional else C.DirectionMode.UNIDIRECTIONAL, input_v,
                  data, precision, math_v, input_size, hidden_size, proj, num_layers,
                  None if dropout is None else dropout.handle,
                  C.RNN_PADDED_IO_ENABLED if padded_io else C.RNN_PADDED_IO_DISABLED, context=context)
        self._context = context

    @classmethod
    def cached(cls, *args: Any, **kwargs: Any):
        if kwargs.get("dropout") is not None:
            raise TypeError("RNNDescriptor with a dropout descriptor (RNG state) cannot be shared through cached()")
        return super().cached(*args, **kwargs)

    @property
    def directions(self) -> int:
        return 2 if self.bidirectional else 1

    @property
    def linear_layers(self) -> int:
        """Linear layers (matrix + bias pairs) per pseudo-layer: 8 for an LSTM, 6 for a GRU, 2 otherwise."""
        return _LINEAR_LAYERS[_CELLS[self.cell]]

    @property
    def pseudo_layers(self) -> int:
        return self.num_layers * self.directions

    def get(self) -> RNNInfo:
        ints = [ctypes.c_int() for _ in range(8)]
        sizes = [ctypes.c_int32() for _ in range(4)]
        dropout, aux = ctypes.c_void_p(), ctypes.c_uint32()
        C.cudnnGetRNNDescriptor_v8(self.handle, *(ctypes.byref(v) for v in ints + sizes), ctypes.byref(dropout),
                                   ctypes.byref(aux))
        algo, cell, bias, direction, input_mode, data, precision, math = (v.value for v in ints)
        input_size, hidden, proj, layers = (v.value for v in sizes)
        return RNNInfo(algo=_name_of(algo, _ALGO), cell=_name_of(cell, _CELLS), bias=_name_of(bias, _BIAS),
                       bidirectional=direction == C.DirectionMode.BIDIRECTIONAL,
                       input_mode=_name_of(input_mode, _INPUT_MODE), dtype=dtype_of(data),
                       math_precision=dtype_of(precision), math_type=_name_of(math, _MATH), input_size=input_size,
                       hidden_size=hidden, proj_size=proj, num_layers=layers,
                       padded_io=bool(aux.value & C.RNN_PADDED_IO_ENABLED))

    # ----- what needs a handle ------------------------------------------------------------------------
    def weight_space_size(self, handle: Handle) -> int:
        """Bytes of the packed weight space (``cudnnGetRNNWeightSpaceSize``)."""
        raw = require_handle(handle, "RNNDescriptor.weight_space_size").handle
        out = ctypes.c_size_t()
        C.call("cudnnGetRNNWeightSpaceSize", raw, self.handle, ctypes.byref(out), context=self._context)
        return int(out.value)

    def temp_space_sizes(self, handle: Handle, x_desc: "RNNDataDescriptor", training: bool) -> tuple[int, int]:
        """``(workspace bytes, reserve space bytes)`` for a forward on ``x_desc`` (reserve: training only)."""
        what = "RNNDescriptor.temp_space_sizes"
        raw = require_handle(handle, what).handle
        _require(x_desc, RNNDataDescriptor, what, "x_desc")
        if not isinstance(training, (bool, np.bool_)):
            raise TypeError(f"{what}: training must be a bool, got {training!r}")
        work, reserve = ctypes.c_size_t(), ctypes.c_size_t()
        mode = C.ForwardMode.TRAINING if training else C.ForwardMode.INFERENCE
        C.call("cudnnGetRNNTempSpaceSizes", raw, self.handle, mode, x_desc.handle, ctypes.byref(work),
               ctypes.byref(reserve), context={**self._context, "x": x_desc, "training": bool(training)})
        return int(work.value), int(reserve.value)

    def build_dynamic(self, handle: Handle, mini_batch: int) -> None:
        """``cudnnBuildRNNDynamic``: compile the ``persist_dynamic`` kernels for ``mini_batch``."""
        what = "RNNDescriptor.build_dynamic"
        raw = require_handle(handle, what).handle
        mini_batch = _size(mini_batch, what, "mini_batch")
        C.call("cudnnBuildRNNDynamic", raw, self.handle, mini_batch, context={**self._context, "mini_batch": mini_batch})

    def weight_params(self, handle: Handle, pseudo_layer: int, linear_layer: int, weight_space: Any = None,
                      weight_space_size: "int | None" = None) -> RNNWeightParam:
        """Where linear layer ``linear_layer`` of ``pseudo_layer`` lies in a weight space
        (``cudnnGetRNNWeightParams``). ``weight_space``: its buffer (``.ptr``, ``.nbytes``) or None (the
        layout does not depend on the address: offsets are computed from a base of 0)."""
        what = "RNNDescriptor.weight_params"
        raw = require_handle(handle, what).handle
        pseudo_layer = _size(pseudo_layer, what, "pseudo_layer", minimum=0)
        linear_layer = _size(linear_layer, what, "linear_layer", minimum=0)
        if pseudo_layer >= self.pseudo_layers:
            raise ValueError(f"{what}: pseudo_layer must be in [0, {self.pseudo_layers}) (num_layers * directions), "
                             f"got {pseudo_layer}")
        if linear_layer >= self.linear_layers:
            raise ValueError(f"{what}: linear_layer must be in [0, {self.linear_layers}) for cell {self.cell!r}, got "
                             f"{linear_layer}")
        size = self.weight_space_size(handle) if weight_space_size is None else int(weight_space_size)
        base = 0 if weight_space is None else int(weight_space.ptr)
        if weight_space is not None and getattr(weight_space, "nbytes", size) < size:
            raise ValueError(f"{what}: the weight space holds {weight_space.nbytes} bytes, cuDNN needs {size}")
        m_desc, b_desc = _bare_tensor_descriptor(), _bare_tensor_descriptor()
        try:
            m_addr, b_addr = ctypes.c_void_p(), ctypes.c_void_p()
            C.call("cudnnGetRNNWeightParams", raw, self.handle, pseudo_layer, size, base or None, linear_layer,
                   m_desc, ctypes.byref(m_addr), b_desc, ctypes.byref(b_addr),
                   context={**self._context, "pseudo_layer": pseudo_layer, "linear_layer": linear_layer})
            item = self.dtype.itemsize
            m_shape = _tensor_dims(m_desc)
            matrix_offset = ((m_addr.value or 0) - base) // item
            if b_addr.value:
                bias_offset, b_shape = (b_addr.value - base) // item, _tensor_dims(b_desc)
            else:
                bias_offset, b_shape = None, None
        finally:
            C.raw("cudnnDestroyTensorDescriptor")(m_desc)
            C.raw("cudnnDestroyTensorDescriptor")(b_desc)
        return RNNWeightParam(matrix_offset, _matrix_shape(m_shape), bias_offset,
                              None if b_shape is None else (int(np.prod(b_shape)),))


def _bare_tensor_descriptor() -> int:
    out = ctypes.c_void_p()
    C.cudnnCreateTensorDescriptor(ctypes.byref(out))
    return int(out.value)


def _tensor_dims(desc: int) -> tuple[int, ...]:
    """The dims of a tensor descriptor cuDNN filled (``cudnnGetTensorNdDescriptor``)."""
    dtype, nb = ctypes.c_int(), ctypes.c_int()
    dims, strides = (ctypes.c_int * 8)(), (ctypes.c_int * 8)()
    C.cudnnGetTensorNdDescriptor(desc, 8, ctypes.byref(dtype), ctypes.byref(nb), dims, strides)
    return tuple(int(dims[i]) for i in range(nb.value))


def _matrix_shape(dims: tuple[int, ...]) -> tuple[int, ...]:
    """cuDNN describes a weight matrix as a 3-d tensor (``(1, rows, columns)``): its 2-d shape, unit axes dropped."""
    dims = tuple(dims)
    while len(dims) > 2 and 1 in (dims[0], dims[-1]):
        dims = dims[1:] if dims[0] == 1 else dims[:-1]
    return dims


@dataclass(frozen=True)
class RNNDataInfo:
    """What an :class:`RNNDataDescriptor` holds (``cudnnGetRNNDataDescriptor``)."""

    dtype: np.dtype
    layout: str
    max_seq_length: int
    batch_size: int
    vector_size: int
    seq_lengths: tuple[int, ...]
    padding_fill: float

    def __str__(self) -> str:
        return (f"dtype={self.dtype.name}, layout={self.layout!r}, max_seq_length={self.max_seq_length}, "
                f"batch_size={self.batch_size}, vector_size={self.vector_size}, seq_lengths={self.seq_lengths}, "
                f"padding_fill={self.padding_fill}")


def _fill(value: float, dtype: np.dtype) -> Any:
    """The padding fill as cuDNN reads it: one element of the data type (2 bytes for float16/bfloat16)."""
    return ctypes.create_string_buffer(np.asarray(value, dtype=dtype).tobytes(), 8)


class RNNDataDescriptor(_Descriptor):
    """``cudnnRNNDataDescriptor_t`` (``cudnnSetRNNDataDescriptor``): a batch of sequences.

    ``layout``: ``"batch_major_unpacked"`` (Keras's ``(batch, time, features)``), ``"seq_major_unpacked"``
    (``(time, batch, features)``) or ``"seq_major_packed"`` (lengths non-increasing, no padding).
    ``seq_lengths``: one length per sequence, each in [0, max_seq_length] (None: all ``max_seq_length``; 0: a
    sequence of padding only, a fully masked Keras row).
    ``padding_fill``: what cuDNN writes into the padded outputs (unpacked layouts). The host copy of the
    lengths is :attr:`seq_lengths`; ``cudnnRNNForward`` also wants them on the device (int32)."""

    _create_fn = "cudnnCreateRNNDataDescriptor"
    _destroy_fn = "cudnnDestroyRNNDataDescriptor"

    def __init__(self, dtype: Any, layout: Any, max_seq_length: int, batch_size: int, vector_size: int,
                 seq_lengths: "Sequence[int] | None" = None, padding_fill: float = 0.0) -> None:
        what = "RNNDataDescriptor"
        data = _rnn_data_type(dtype, what)
        layout_v = _enum_arg(layout, _LAYOUT, C.RNNDataLayout, what, "layout")
        max_seq_length = _size(max_seq_length, what, "max_seq_length")
        batch_size = _size(batch_size, what, "batch_size")
        vector_size = _size(vector_size, what, "vector_size")
        if seq_lengths is None:
            lengths = (max_seq_length,) * batch_size
        else:
            if isinstance(seq_lengths, (str, bytes)) or not hasattr(seq_lengths, "__len__"):
                raise TypeError(f"{what}: seq_lengths must be a sequence of ints, got {seq_lengths!r}")
            lengths = tuple(_size(v, what, "seq_lengths[i]", minimum=0) for v in seq_lengths)
            if len(lengths) != batch_size:
                raise ValueError(f"{what}: seq_lengths must hold batch_size={batch_size} lengths, got {len(lengths)}")
            if max(lengths) > max_seq_length:
                raise ValueError(f"{what}: every seq_lengths entry must be at most max_seq_length={max_seq_length}, "
                                 f"got {max(lengths)}")
        if layout_v == C.RNNDataLayout.SEQ_MAJOR_PACKED and any(a < b for a, b in zip(lengths, lengths[1:])):
            raise ValueError(f"{what}: the packed layout needs non-increasing seq_lengths, got {lengths}")
        if isinstance(padding_fill, (bool, np.bool_)) or not isinstance(padding_fill, (int, float, np.floating,
                                                                                       np.integer)):
            raise TypeError(f"{what}: padding_fill must be a number, got {padding_fill!r}")
        self.dtype = dtype_of(data)
        self.layout = _name_of(layout_v, _LAYOUT)
        self.max_seq_length, self.batch_size, self.vector_size = max_seq_length, batch_size, vector_size
        self.seq_lengths = lengths
        self._lengths = (ctypes.c_int * batch_size)(*lengths)
        self._fill = _fill(float(padding_fill), self.dtype)
        context = {"dtype": self.dtype.name, "layout": self.layout, "max_seq_length": max_seq_length,
                   "batch_size": batch_size, "vector_size": vector_size}
        self._create()
        self._set("cudnnSetRNNDataDescriptor", data, layout_v, max_seq_length, batch_size, vector_size,
                  self._lengths, self._fill, context=context)

    @property
    def shape(self) -> tuple[int, int, int]:
        """The array shape this describes: ``(batch, time, vector)`` batch-major, ``(time, batch, vector)``
        sequence-major (packed: the buffer holds only ``sum(seq_lengths)`` vectors)."""
        if self.layout == "batch_major_unpacked":
            return (self.batch_size, self.max_seq_length, self.vector_size)
        return (self.max_seq_length, self.batch_size, self.vector_size)

    def get(self) -> RNNDataInfo:
        ints = [ctypes.c_int() for _ in range(5)]
        lengths = (ctypes.c_int * self.batch_size)()
        fill = ctypes.create_string_buffer(8)
        C.cudnnGetRNNDataDescriptor(self.handle, *(ctypes.byref(v) for v in ints), self.batch_size, lengths, fill)
        data, layout, max_len, batch, vector = (v.value for v in ints)
        return RNNDataInfo(dtype=dtype_of(data), layout=_name_of(layout, _LAYOUT), max_seq_length=max_len,
                           batch_size=batch, vector_size=vector, seq_lengths=tuple(lengths[:batch]),
                           padding_fill=float(np.frombuffer(fill.raw[:self.dtype.itemsize], self.dtype)[0]))
