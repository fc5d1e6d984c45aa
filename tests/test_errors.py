"""Status -> exception mapping for cuDNN and cuBLAS, with the message text, against the real libraries."""

from __future__ import annotations

import ctypes

import pytest

import dnnbind.cudnn as cd
from dnnbind._lib import cublas as CB
from dnnbind._lib import cudnn as C
from dnnbind.errors import CublasError, CudnnError, DnnbindError, LibraryStatusError


@pytest.fixture
def raw_tensor_desc():
    out = ctypes.c_void_p()
    C.cudnnCreateTensorDescriptor(ctypes.byref(out))
    yield out.value
    C.cudnnDestroyTensorDescriptor(out.value)


def test_every_status_value_matches_cudnn_names():
    # The enum was copied from the headers; cuDNN's own names prove the values right.
    for status in C.Status:
        assert C.error_string(status) == "CUDNN_STATUS_" + status.name
        assert C.status_name(status) == "CUDNN_STATUS_" + status.name


def test_every_cublas_status_value_matches_cublas_names():
    for status in CB.Status:
        assert CB.status_name(status) == "CUBLAS_STATUS_" + status.name
        assert CB.status_string(status)  # a sentence, never empty


def test_bad_param_through_checked_wrapper(raw_tensor_desc):
    with pytest.raises(CudnnError) as info:
        C.cudnnSetTensor4dDescriptor(raw_tensor_desc, C.TensorFormat.NCHW, C.DataType.FLOAT, 2, 0, 4, 4)
    err = info.value
    assert err.status == C.Status.BAD_PARAM == 2000
    assert err.status_name == "CUDNN_STATUS_BAD_PARAM"
    assert err.function == "cudnnSetTensor4dDescriptor"
    assert err.detail, "cudnnGetLastErrorString said nothing"
    assert "<= 0" in err.detail  # cuDNN names the failed check on the dims
    msg = str(err)
    assert msg.startswith("cudnnSetTensor4dDescriptor failed with CUDNN_STATUS_BAD_PARAM (2000): ")
    assert err.detail in msg
    assert isinstance(err, LibraryStatusError) and isinstance(err, DnnbindError)


def test_call_attaches_context_and_add_context_refreshes(raw_tensor_desc):
    with pytest.raises(CudnnError) as info:
        C.call("cudnnSetTensor4dDescriptor", raw_tensor_desc, 0, 0, -1, 3, 4, 4,
               context={"shape": (-1, 3, 4, 4), "strides": None})
    err = info.value
    assert "shape: (-1, 3, 4, 4)" in str(err) and "strides: None" in str(err)
    err.add_context(algo="IMPLICIT_GEMM")
    assert "algo: IMPLICIT_GEMM" in str(err) and "shape: (-1, 3, 4, 4)" in str(err)


def test_check_and_unknown_status():
    C.check(0, "cudnnWhatever")  # success: nothing
    with pytest.raises(CudnnError, match=r"cudnnFoo failed with CUDNN_STATUS_NOT_SUPPORTED \(3000\)") as info:
        C.check(3000, "cudnnFoo", shapes=((1, 2, 3, 4),))
    assert "shapes: ((1, 2, 3, 4),)" in str(info.value)
    assert "does not support this configuration" in str(info.value)  # the hint
    assert "UNKNOWN" in C.status_name(1234567)  # cuDNN's own word for codes it does not know


def test_descriptor_set_failure_carries_shape_and_closes():
    # Channels 5 != groups 2 * filter channels 2: only cuDNN checks this, and the error must
    # carry the descriptors' shapes.
    conv = cd.ConvolutionDescriptor(pad=1, groups=2)
    x = cd.TensorDescriptor((2, 5, 6, 6), "float32")
    w = cd.FilterDescriptor((4, 2, 3, 3), "float32")
    with pytest.raises(CudnnError) as info:
        conv.forward_output_dim(x, w)
    err = info.value
    assert err.function == "cudnnGetConvolution2dForwardOutputDim"
    assert err.status_name.startswith("CUDNN_STATUS_BAD_PARAM")
    assert "groupCount" in err.detail
    assert "shape=(2, 5, 6, 6)" in str(err) and "shape=(4, 2, 3, 3)" in str(err) and "groups=2" in str(err)


def test_python_validation_comes_before_the_c_call():
    with pytest.raises(ValueError, match=r"TensorDescriptor: shape must be >= 1.*\(2, -3, 4, 4\)"):
        cd.TensorDescriptor((2, -3, 4, 4), "float32")
    with pytest.raises(ValueError, match="more than 2\\*\\*31-1 elements"):
        cd.TensorDescriptor((2**20, 2**12, 1, 1), "float32")


def test_cublas_error_message():
    with pytest.raises(CublasError) as info:
        CB.check(CB.Status.INVALID_VALUE, "cublasGemmEx", m=3, n=0)
    err = info.value
    assert err.status_name == "CUBLAS_STATUS_INVALID_VALUE" and err.status == 7
    assert str(err).startswith("cublasGemmEx failed with CUBLAS_STATUS_INVALID_VALUE (7): ")
    assert err.detail == CB.status_string(7) and "m: 3" in str(err)


def test_raw_returns_status_and_unknown_names_fail(raw_tensor_desc):
    status = C.raw("cudnnSetTensor4dDescriptor")(raw_tensor_desc, 0, 0, 0, 1, 1, 1)
    assert status == C.Status.BAD_PARAM
    with pytest.raises(AttributeError, match="does not declare"):
        C.raw("cudnnNoSuchFunction")
    with pytest.raises(AttributeError):
        C.cudnnNoSuchFunction  # noqa: B018


def test_signatures_resolve_in_the_library():
    lib = C.library()
    for name in C.SIGNATURES:
        assert getattr(lib, name).argtypes is not None, name
    lib = CB.library()
    for name in CB.SIGNATURES:
        assert getattr(lib, name).argtypes is not None, name
