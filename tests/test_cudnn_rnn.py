"""cuDNN's RNN API: the ctypes declarations against the shipped header, the RNN and RNN data descriptors against
the real libcudnn (setting and reading back need no GPU), and, on a GPU, the packed weight space."""

from __future__ import annotations

import ctypes
import re
from pathlib import Path

import numpy as np
import pytest

import dnnbind.cudnn as cd
from dnnbind._lib import cudnn as C

RNN_FUNCTIONS = ["cudnnCreateRNNDescriptor", "cudnnDestroyRNNDescriptor", "cudnnSetRNNDescriptor_v8",
                 "cudnnGetRNNDescriptor_v8", "cudnnBuildRNNDynamic", "cudnnGetRNNTempSpaceSizes",
                 "cudnnGetRNNWeightSpaceSize", "cudnnGetRNNWeightParams", "cudnnCreateRNNDataDescriptor",
                 "cudnnDestroyRNNDataDescriptor", "cudnnSetRNNDataDescriptor", "cudnnGetRNNDataDescriptor",
                 "cudnnRNNForward", "cudnnRNNBackwardData_v8", "cudnnRNNBackwardWeights_v8"]
_OPAQUE = ("cudnnHandle_t", "cudnnRNNDescriptor_t", "cudnnRNNDataDescriptor_t", "cudnnTensorDescriptor_t",
           "cudnnDropoutDescriptor_t")


def _adv_header() -> Path:
    import nvidia.cudnn

    for base in nvidia.cudnn.__path__:
        path = Path(base) / "include" / "cudnn_adv_v9.h"
        if path.exists():
            return path
    pytest.skip("the cuDNN wheel's headers (nvidia/cudnn/include/cudnn_adv_v9.h) are not installed")


def _kind_of_c(arg: str) -> str:
    arg = arg.strip()
    if "*" in arg or "[" in arg or any(arg.startswith(t) or f" {t} " in f" {arg} " for t in _OPAQUE):
        return "pointer"
    if arg.startswith("size_t"):
        return "size_t"
    if arg.startswith("uint32_t"):
        return "uint32"
    return "int"  # int, int32_t and the enums


def _kind_of_ctypes(t) -> str:
    if t is ctypes.c_void_p or (isinstance(t, type) and issubclass(t, ctypes._Pointer)):
        return "pointer"
    if t is ctypes.c_size_t:
        return "size_t"
    if t is ctypes.c_uint32:
        return "uint32"
    assert t in (ctypes.c_int, ctypes.c_int32), t
    return "int"


def test_rnn_declarations_match_the_shipped_header():
    text = _adv_header().read_text()
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    for name in RNN_FUNCTIONS:
        match = re.search(rf"cudnnStatus_t\s+CUDNNWINAPI\s+{name}\s*\(([^;]*?)\)\s*;", text)
        assert match, name
        c_args = [a for a in match.group(1).split(",") if a.strip()]
        declared = C.SIGNATURES[name]
        assert len(declared) == len(c_args), name
        assert [_kind_of_ctypes(t) for t in declared] == [_kind_of_c(a) for a in c_args], name


def test_rnn_enum_values_match_the_shipped_header():
    text = _adv_header().read_text()

    def value(c_name: str) -> int:
        return int(re.search(rf"\b{c_name}\s*=\s*(\d+)", text).group(1))

    for member in C.RNNMode:
        assert value("CUDNN_" + member.name) == member
    for enum, prefix in ((C.RNNAlgo, "CUDNN_RNN_ALGO_"), (C.ForwardMode, "CUDNN_FWD_MODE_"),
                         (C.RNNBiasMode, "CUDNN_RNN_"), (C.DirectionMode, "CUDNN_"), (C.RNNInputMode, "CUDNN_"),
                         (C.RNNDataLayout, "CUDNN_RNN_DATA_LAYOUT_"), (C.WgradMode, "CUDNN_WGRAD_MODE_")):
        for member in enum:
            assert value(prefix + member.name) == member, (enum.__name__, member.name)
    assert "#define CUDNN_RNN_PADDED_IO_ENABLED (1U << 0)" in text


# ----- descriptors (no GPU needed) ------------------------------------------------------------------------
@pytest.mark.parametrize("cell", ["lstm", "gru", "tanh", "relu"])
@pytest.mark.parametrize("dtype, precision", [("float32", "float32"), ("float64", "float64"), ("float16", "float32"),
                                              ("float16", "float16"), ("bfloat16", "float32")])
def test_rnn_descriptor_round_trip(cell, dtype, precision):
    desc = cd.RNNDescriptor(cell, 7, 5, num_layers=2, bidirectional=True, dtype=dtype, math_precision=precision,
                            math_type="tensor_op", bias="single_input")
    info = desc.get()
    assert (info.cell, info.input_size, info.hidden_size, info.proj_size, info.num_layers) == (cell, 7, 5, 5, 2)
    assert info.bidirectional and info.bias == "single_input" and info.math_type == "tensor_op"
    assert info.dtype.name == dtype and info.math_precision.name == precision
    assert info.algo == "standard" and info.input_mode == "linear" and info.padded_io
    assert desc.linear_layers == {"lstm": 8, "gru": 6}.get(cell, 2) and desc.pseudo_layers == 4
    assert repr(desc) == f"RNNDescriptor({info})"


def test_rnn_descriptor_options():
    info = cd.RNNDescriptor("lstm", 6, 6, proj_size=4, input_mode="skip", padded_io=False, bias="none").get()
    assert (info.proj_size, info.input_mode, info.padded_io, info.bias) == (4, "skip", False, "none")
    assert cd.RNNDescriptor("gru", 6, 8, algo="persist_static").get().algo == "persist_static"
    a = cd.RNNDescriptor.cached("gru", 4, 3, dtype=np.float32)
    assert cd.RNNDescriptor.cached("gru", 4, 3, dtype="float32") is a
    assert cd.RNNDescriptor.cached("gru", 4, 3, dtype="float64") is not a
    desc = cd.RNNDescriptor("gru", 4, 3)
    desc.close()
    desc.close()  # idempotent
    assert desc.closed


@pytest.fixture
def no_c_calls(monkeypatch):
    """Fail if a descriptor reaches cuDNN: bad arguments must be refused before any C call."""
    def refuse(*args, **kwargs):
        raise AssertionError("a C call was made before the arguments were checked")

    for name in ("cudnnCreateRNNDescriptor", "cudnnCreateRNNDataDescriptor"):
        monkeypatch.setattr(C, name, refuse, raising=False)
    monkeypatch.setattr(C, "call", refuse)


@pytest.mark.parametrize("kwargs, error, match", [
    ({"cell": "gru2"}, ValueError, r"RNNDescriptor: cell must be one of"),
    ({"input_size": 0}, ValueError, r"RNNDescriptor: input_size must be in \[1"),
    ({"hidden_size": 3.0}, TypeError, r"RNNDescriptor: hidden_size must be an int"),
    ({"num_layers": 2**31}, ValueError, r"num_layers must be in"),
    ({"bidirectional": 1}, TypeError, r"bidirectional must be a bool"),
    ({"dtype": "int8"}, ValueError, r"RNN API takes float32, float64, float16 or bfloat16"),
    ({"dtype": "float32", "math_precision": "float16"}, ValueError, r"math_precision float16 is not valid for float32"),
    ({"math_type": "fast"}, ValueError, r"math_type must be one of"),
    ({"bias": "both"}, ValueError, r"bias must be one of"),
    ({"algo": "fastest"}, ValueError, r"algo must be one of"),
    ({"proj_size": 4}, ValueError, r"proj_size must be at most hidden_size=3"),
    ({"cell": "gru", "proj_size": 2}, ValueError, r"only for 'lstm'"),
    ({"input_mode": "skip"}, ValueError, r"'skip' needs input_size == hidden_size"),
    ({"dropout": 12345}, TypeError, r"dropout must be a dnnbind.cudnn.DropoutDescriptor"),
])
def test_rnn_descriptor_refuses_bad_arguments_before_any_c_call(no_c_calls, kwargs, error, match):
    args = {"cell": "lstm", "input_size": 4, "hidden_size": 3, **kwargs}
    with pytest.raises(error, match=match):
        cd.RNNDescriptor(args.pop("cell"), args.pop("input_size"), args.pop("hidden_size"), **args)


@pytest.mark.parametrize("layout, shape", [("batch_major_unpacked", (3, 6, 4)), ("seq_major_unpacked", (6, 3, 4)),
                                           ("seq_major_packed", (6, 3, 4))])
@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "bfloat16"])
def test_rnn_data_descriptor_round_trip(layout, shape, dtype):
    desc = cd.RNNDataDescriptor(dtype, layout, 6, 3, 4, seq_lengths=np.array([6, 4, 1]), padding_fill=-2.5)
    info = desc.get()
    assert (info.layout, info.max_seq_length, info.batch_size, info.vector_size) == (layout, 6, 3, 4)
    assert info.seq_lengths == (6, 4, 1) == desc.seq_lengths and info.dtype.name == dtype
    assert info.padding_fill == -2.5 and desc.shape == shape


def test_rnn_data_descriptor_defaults_and_empty_sequences():
    info = cd.RNNDataDescriptor("float32", "batch_major_unpacked", 5, 2, 3).get()
    assert info.seq_lengths == (5, 5) and info.padding_fill == 0.0
    assert cd.RNNDataDescriptor("float32", "batch_major_unpacked", 5, 3, 3, seq_lengths=[5, 0, 2]).get().seq_lengths \
        == (5, 0, 2)  # a fully padded sequence (a Keras row masked everywhere)


@pytest.mark.parametrize("kwargs, error, match", [
    ({"dtype": "int32"}, ValueError, r"RNNDataDescriptor: the RNN API takes"),
    ({"layout": "NTC"}, ValueError, r"RNNDataDescriptor: layout must be one of"),
    ({"max_seq_length": 0}, ValueError, r"max_seq_length must be in \[1"),
    ({"batch_size": -1}, ValueError, r"batch_size must be in \[1"),
    ({"seq_lengths": [5, 3]}, ValueError, r"must hold batch_size=3 lengths, got 2"),
    ({"seq_lengths": [5, 7, 1]}, ValueError, r"at most max_seq_length=6, got 7"),
    ({"seq_lengths": [5, -1, 1]}, ValueError, r"seq_lengths\[i\] must be in \[0"),
    ({"seq_lengths": [5, 2.0, 1]}, TypeError, r"seq_lengths\[i\] must be an int"),
    ({"seq_lengths": "abc"}, TypeError, r"seq_lengths must be a sequence of ints"),
    ({"layout": "seq_major_packed", "seq_lengths": [1, 3, 2]}, ValueError, r"packed layout needs non-increasing"),
    ({"padding_fill": "0"}, TypeError, r"padding_fill must be a number"),
])
def test_rnn_data_descriptor_refuses_bad_arguments_before_any_c_call(no_c_calls, kwargs, error, match):
    args = {"dtype": "float32", "layout": "batch_major_unpacked", "max_seq_length": 6, "batch_size": 3,
            "vector_size": 4, **kwargs}
    with pytest.raises(error, match=match):
        cd.RNNDataDescriptor(**args)


def test_handle_methods_refuse_a_raw_pointer():
    desc = cd.RNNDescriptor("lstm", 4, 3)
    x = cd.RNNDataDescriptor("float32", "batch_major_unpacked", 5, 2, 4)
    with pytest.raises(TypeError, match=r"RNNDescriptor.weight_space_size.*Handle"):
        desc.weight_space_size(12345)
    with pytest.raises(TypeError, match=r"RNNDescriptor.temp_space_sizes.*Handle"):
        desc.temp_space_sizes(0, x, True)


# ----- the weight space (a GPU: cudnnCreate needs one) ---------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("cell, gates", [("lstm", 4), ("gru", 3), ("tanh", 1)])
@pytest.mark.parametrize("bidirectional", [False, True])
def test_gpu_weight_space_layout(cell, gates, bidirectional):
    handle = cd.get_handle()
    n_in, hidden = 5, 3
    desc = cd.RNNDescriptor(cell, n_in, hidden, bidirectional=bidirectional)
    per_direction = gates * hidden * (n_in + hidden) + 2 * gates * hidden
    size = desc.weight_space_size(handle)
    assert size == per_direction * desc.directions * 4
    from dnnbind import cuda

    space = cuda.empty((size // 4,), np.float32)
    covered = np.zeros(size // 4, bool)
    for pseudo in range(desc.pseudo_layers):
        for lin in range(desc.linear_layers):
            p = desc.weight_params(handle, pseudo, lin, space)
            assert p.matrix_shape == (hidden, n_in if lin < gates else hidden)
            assert p.bias_shape == (hidden,)
            for offset, count in ((p.matrix_offset, int(np.prod(p.matrix_shape))), (p.bias_offset, hidden)):
                assert not covered[offset:offset + count].any()
                covered[offset:offset + count] = True
    assert covered.all()
    with pytest.raises(ValueError, match=r"linear_layer must be in \[0, "):
        desc.weight_params(handle, 0, desc.linear_layers, space)
    x = cd.RNNDataDescriptor("float32", "batch_major_unpacked", 7, 4, n_in, seq_lengths=[7, 5, 2, 1])
    work, reserve = desc.temp_space_sizes(handle, x, training=True)
    assert work > 0 and reserve > 0
    assert desc.temp_space_sizes(handle, x, training=False)[1] == 0
