"""cuDNN descriptors against the real libcudnn (no GPU needed): set/get round trips, output dims, validation."""

from __future__ import annotations

import gc
import itertools
import re
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import dnnbind.cublas as cb
import dnnbind.cudnn as cd
from dnnbind import cuda
from dnnbind._lib import cudnn as C
from dnnbind._lib import loader
from dnnbind.errors import NoDeviceError

DTYPES = ["float32", "float16", "bfloat16", "float64", "int8", "int32", "uint8"]


def _gpu_available() -> bool:
    return cuda.is_available()  # never raises: False, with a reason, without a driver or a GPU


def packed(shape):
    return tuple(int(np.prod(shape[i + 1:])) for i in range(len(shape)))


# ------------------------------------------------------------------------------------ tensor


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_tensor_4d_round_trip(dtype, layout):
    shape = (2, 3, 5, 7)
    desc = cd.TensorDescriptor(shape, dtype, layout)
    info = desc.get()
    assert info.shape == shape and info.layout == layout
    assert info.dtype == cd.dtype_of(cd.data_type(dtype)) == (np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16"
                                                              else np.dtype(dtype))
    assert info.strides == packed(shape)  # packed in the array's own axis order
    assert desc.size_in_bytes() == int(np.prod(shape)) * info.dtype.itemsize
    assert repr(desc) == f"TensorDescriptor({info})"


def test_tensor_4d_strided_nhwc_view():
    # A channel slice of an NHWC (2, 4, 4, 8) array: shape (2, 4, 4, 3), strides of the parent.
    desc = cd.TensorDescriptor((2, 4, 4, 3), np.float32, "NHWC", strides=(128, 32, 8, 1))
    assert desc.get().strides == (128, 32, 8, 1)
    assert desc.get().shape == (2, 4, 4, 3)


@pytest.mark.parametrize("shape,layout", [((2, 3, 4), "NCHW"), ((2, 3, 4, 5, 6), "NCHW"),
                                          ((2, 4, 5, 6, 3), "NHWC"), ((1, 2, 2, 2, 2, 2, 2, 3), "NCHW")])
def test_tensor_nd_round_trip(shape, layout):
    desc = cd.TensorDescriptor(shape, "float16", layout)
    info = desc.get()
    assert (info.shape, info.strides, info.layout) == (shape, packed(shape), layout)


def test_tensor_nd_custom_strides():
    strides = (100, 20, 4, 1)[:3]
    desc = cd.TensorDescriptor((2, 5, 4), "float32", strides=strides)
    assert desc.get().strides == strides


def test_tensor_for_array_uses_element_strides():
    a = np.zeros((2, 3, 4, 10), np.float32)[..., :5]
    desc = cd.TensorDescriptor.for_array(a)
    assert desc.get().shape == (2, 3, 4, 5) and desc.get().strides == (120, 40, 10, 1)
    assert cd.TensorDescriptor.for_array(np.zeros((1, 2, 3, 4), np.float16)) is \
        cd.TensorDescriptor.cached((1, 2, 3, 4), np.dtype(np.float16), "NCHW")


@pytest.mark.parametrize("kwargs,exc,needle", [
    (dict(shape=(2, 0, 3, 3), dtype="float32"), ValueError, "shape must be >= 1"),
    (dict(shape=(2, 3), dtype="float32"), ValueError, "3 to 8 dims"),
    (dict(shape=(1,) * 9, dtype="float32"), ValueError, "3 to 8 dims"),
    (dict(shape=(2, 3, 4, 4), dtype="complex64"), TypeError, "complex64 is not supported"),
    (dict(shape=(2, 3, 4, 4), dtype="int64"), TypeError, "int64 is not supported"),
    (dict(shape=(2, 3, 4, 4), dtype="float32", layout="CHWN"), ValueError, "layout must be"),
    (dict(shape=(2, 3, 4, 4), dtype="float32", strides=(1, 2, 3)), ValueError, "must match the rank"),
    (dict(shape=(2, 3, 4, 4), dtype="float32", strides=(48, 16, 4, 0)), ValueError, "strides must be >= 1"),
    (dict(shape=(2, 3.0, 4, 4), dtype="float32"), TypeError, "must hold ints"),
])
def test_tensor_validation(kwargs, exc, needle):
    with pytest.raises(exc, match="TensorDescriptor") as info:
        cd.TensorDescriptor(**kwargs)
    assert needle in str(info.value)


# ------------------------------------------------------------------------------------ filter


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "float64", "int8"])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_filter_round_trip(dtype, layout):
    shape = (8, 3, 5, 2) if layout == "NCHW" else (8, 5, 2, 3)
    desc = cd.FilterDescriptor(shape, dtype, layout)
    info = desc.get()
    expected = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(dtype)  # not via data_type()
    assert (info.shape, info.layout, info.dtype) == (shape, layout, expected)
    assert desc.size_in_bytes() == int(np.prod(shape)) * info.dtype.itemsize


def test_filter_3d_round_trip():
    desc = cd.FilterDescriptor((4, 2, 3, 3, 3), "float32", "NHWC")
    assert desc.get().shape == (4, 2, 3, 3, 3) and desc.get().layout == "NHWC"


def test_filter_validation():
    with pytest.raises(ValueError, match=r"FilterDescriptor: shape must be >= 1.*\(4, -1, 3, 3\)"):
        cd.FilterDescriptor((4, -1, 3, 3), "float32")
    with pytest.raises(TypeError, match="FilterDescriptor: dtype bool"):
        cd.FilterDescriptor((4, 1, 3, 3), bool)


# ------------------------------------------------------------------------------------ convolution


@pytest.mark.parametrize("math", ["tensor_op", "default", "tensor_op_allow_conversion", "fma"])
@pytest.mark.parametrize("compute", ["float32", "float64", "float16", "int32"])
def test_convolution_round_trip(math, compute):
    desc = cd.ConvolutionDescriptor(pad=(2, 1), stride=(1, 3), dilation=(2, 1), groups=3,
                                    compute_dtype=compute, math=math)
    info = desc.get()
    assert (info.pad, info.stride, info.dilation, info.groups) == ((2, 1), (1, 3), (2, 1), 3)
    assert (info.compute_dtype, info.math, info.mode) == (np.dtype(compute), math, "cross_correlation")
    assert "groups=3" in repr(desc)


def test_convolution_3d_and_mode_round_trip():
    desc = cd.ConvolutionDescriptor(pad=(1, 0, 2), stride=(1, 2, 1), dilation=1, mode="convolution")
    info = desc.get()
    assert (info.pad, info.stride, info.dilation, info.mode) == ((1, 0, 2), (1, 2, 1), (1, 1, 1), "convolution")


def _conv_out(size, pad, stride, dilation, k):
    return (size + 2 * pad - dilation * (k - 1) - 1) // stride + 1


CONV_CASES = list(itertools.product(
    [(9, 11)],  # H, W
    [(0, 0), (1, 2), (3, 3)],  # pad
    [(1, 1), (2, 3)],  # stride
    [(1, 1), (2, 1)],  # dilation
    [1, 2, 3],  # groups
))


@pytest.mark.parametrize("hw,pad,stride,dilation,groups", CONV_CASES)
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_conv_forward_output_dim_matches_formula(hw, pad, stride, dilation, groups, layout):
    n, c, k, r, s = 2, 6, 4 * groups, 3, 2
    h, w = hw
    x_shape = (n, c, h, w) if layout == "NCHW" else (n, h, w, c)
    w_shape = (k, c // groups, r, s) if layout == "NCHW" else (k, r, s, c // groups)
    x = cd.TensorDescriptor.cached(x_shape, "float32", layout)
    f = cd.FilterDescriptor.cached(w_shape, "float32", layout)
    conv = cd.ConvolutionDescriptor.cached(pad, stride, dilation, groups)
    ho = _conv_out(h, pad[0], stride[0], dilation[0], r)
    wo = _conv_out(w, pad[1], stride[1], dilation[1], s)
    expected = (n, k, ho, wo) if layout == "NCHW" else (n, ho, wo, k)
    assert conv.forward_output_dim(x, f) == expected


def test_conv_3d_forward_output_dim():
    x = cd.TensorDescriptor((2, 3, 7, 8, 9), "float32")
    f = cd.FilterDescriptor((5, 3, 3, 2, 3), "float32")
    conv = cd.ConvolutionDescriptor(pad=(1, 0, 2), stride=(2, 1, 3), dilation=(1, 2, 1))
    assert conv.forward_output_dim(x, f) == (2, 5, _conv_out(7, 1, 2, 1, 3), _conv_out(8, 0, 1, 2, 2),
                                             _conv_out(9, 2, 3, 1, 3))


def test_conv_rank_mismatch_and_validation():
    conv = cd.ConvolutionDescriptor(pad=1)
    with pytest.raises(ValueError, match="2-d convolution needs 4-d x and w"):
        conv.forward_output_dim(cd.TensorDescriptor((1, 2, 3, 4, 5), "float32"), cd.FilterDescriptor((1, 2, 3, 3),
                                                                                                     "float32"))
    for kwargs, needle in [(dict(pad=-1), "pad must be >= 0"), (dict(stride=(1, 0)), "stride must be >= 1"),
                           (dict(dilation=0), "dilation must be >= 1"), (dict(groups=0), "groups must be >= 1"),
                           (dict(math="tf32"), "math must be one of"), (dict(pad=(1, 1), stride=(1, 1, 1)),
                                                                        "stride needs 2 values")]:
        with pytest.raises(ValueError, match="ConvolutionDescriptor") as info:
            cd.ConvolutionDescriptor(**kwargs)
        assert needle in str(info.value)


# ------------------------------------------------------------------------------------ pooling


@pytest.mark.parametrize("mode", ["max", "max_deterministic", "avg", "avg_include_pad"])
@pytest.mark.parametrize("nan", [False, True])
def test_pooling_round_trip(mode, nan):
    desc = cd.PoolingDescriptor(mode, window=(3, 2), pad=(1, 0), stride=(2, 1), nan_propagation=nan)
    info = desc.get()
    assert (info.mode, info.window, info.pad, info.stride, info.nan_propagation) == (mode, (3, 2), (1, 0), (2, 1),
                                                                                      nan)


@pytest.mark.parametrize("window,pad,stride", [((2, 2), (0, 0), None), ((3, 3), (1, 1), (2, 2)),
                                               ((3, 2), (1, 0), (1, 2))])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_pooling_output_dim(window, pad, stride, layout):
    n, c, h, w = 2, 3, 9, 8
    x = cd.TensorDescriptor((n, c, h, w) if layout == "NCHW" else (n, h, w, c), "float32", layout)
    desc = cd.PoolingDescriptor("max", window, pad, stride)
    s = stride or window
    ho, wo = ((h + 2 * pad[0] - window[0]) // s[0] + 1, (w + 2 * pad[1] - window[1]) // s[1] + 1)
    assert desc.forward_output_dim(x) == ((n, c, ho, wo) if layout == "NCHW" else (n, ho, wo, c))


def test_pooling_3d_and_validation():
    desc = cd.PoolingDescriptor("avg", window=(2, 2, 2))
    assert desc.get().stride == (2, 2, 2)
    assert desc.forward_output_dim(cd.TensorDescriptor((1, 2, 4, 6, 8), "float32")) == (1, 2, 2, 3, 4)
    with pytest.raises(ValueError, match="PoolingDescriptor: mode must be one of"):
        cd.PoolingDescriptor("median")
    with pytest.raises(ValueError, match="padding .* must be smaller than the window"):
        cd.PoolingDescriptor("max", window=2, pad=2)


# ------------------------------------------------------------------------------------ activation


@pytest.mark.parametrize("mode,coef", [("relu", 0.0), ("sigmoid", 0.0), ("tanh", 0.0), ("clipped_relu", 6.0),
                                       ("elu", 0.5), ("identity", 0.0)])
def test_activation_round_trip(mode, coef):
    info = cd.ActivationDescriptor(mode, coef).get()
    assert (info.mode, info.coef, info.nan_propagation, info.swish_beta) == (mode, coef, False, None)


def test_activation_swish_beta_round_trip():
    assert cd.ActivationDescriptor("swish", swish_beta=1.702).get().swish_beta == pytest.approx(1.702)
    assert cd.ActivationDescriptor("swish").get().swish_beta == 1.0
    with pytest.raises(ValueError, match="swish_beta only applies"):
        cd.ActivationDescriptor("relu", swish_beta=2.0)
    with pytest.raises(ValueError, match="ActivationDescriptor: mode must be one of"):
        cd.ActivationDescriptor("gelu")


# ------------------------------------------------------------------------------------ op/reduce tensor


@pytest.mark.parametrize("op", ["add", "mul", "min", "max", "sqrt", "not"])
def test_op_tensor_round_trip(op):
    info = cd.OpTensorDescriptor(op, "float64", nan_propagation=True).get()
    assert (info.op, info.compute_dtype, info.nan_propagation) == (op, np.dtype("float64"), True)


@pytest.mark.parametrize("op", ["add", "mul", "min", "max", "amax", "avg", "norm1", "norm2", "mul_no_zeros"])
def test_reduce_tensor_round_trip(op):
    indices = op in ("min", "max", "amax")
    info = cd.ReduceTensorDescriptor(op, indices=indices, indices_type="int32").get()
    assert (info.op, info.indices, info.indices_type, info.compute_dtype) == (op, indices, "int32",
                                                                              np.dtype("float32"))
    with pytest.raises(ValueError, match="only produced for min, max and amax"):
        cd.ReduceTensorDescriptor("add", indices=True)


# ------------------------------------------------------------------------------------ dropout (sizes only)


def test_dropout_reserve_space_size_without_gpu():
    x = cd.TensorDescriptor((4, 3, 8, 8), "float32")
    size = cd.DropoutDescriptor.reserve_space_size(x)
    elements = 4 * 3 * 8 * 8
    assert elements // 8 <= size <= elements * 4  # a mask bit per element at least, no more than a float each
    # cuDNN sizes the mask per element: twice the batch, twice the reserve (a constant would not do)
    assert cd.DropoutDescriptor.reserve_space_size(cd.TensorDescriptor((8, 3, 8, 8), "float32")) == 2 * size
    with pytest.raises(TypeError, match="cannot be shared"):
        cd.DropoutDescriptor.cached(None, 0.5)


def test_dropout_validation_before_any_call():
    with pytest.raises(ValueError, match=r"DropoutDescriptor: rate must be a float in \[0, 1\)"):
        cd.DropoutDescriptor(0, 1.0, 1)
    with pytest.raises(ValueError, match="DropoutDescriptor: seed"):
        cd.DropoutDescriptor(0, 0.5, -1)


# ------------------------------------------------------------------------------------ ownership and caching


def test_close_is_idempotent_and_blocks_use():
    desc = cd.TensorDescriptor((1, 2, 3, 4), "float32")
    assert not desc.closed and desc.owned
    with desc:
        pass
    assert desc.closed
    desc.close()
    assert repr(desc) == "<TensorDescriptor closed>"
    with pytest.raises(ValueError, match="TensorDescriptor is closed"):
        desc.get()


def test_finalizer_destroys_without_owner_and_without_cycles():
    desc = cd.ActivationDescriptor("relu")
    record, finalizer = desc._record, desc._finalizer
    assert record.ptr and finalizer.alive
    del desc  # no cycle: plain refcounting must be enough, no gc.collect()
    assert not finalizer.alive and record.ptr == 0


def test_cached_is_bounded_and_keeps_what_is_used(monkeypatch):
    monkeypatch.setattr(cd.ActivationDescriptor, "_cache", cd.LRUCache(4, "test"))
    first = cd.ActivationDescriptor.cached("elu", 0.1)
    assert cd.ActivationDescriptor.cached("elu", 0.1) is first
    assert cd.ActivationDescriptor.cached(mode="elu", coef=0.2) is not first
    for coef in (0.3, 0.4, 0.5, 0.6, 0.7):
        cd.ActivationDescriptor.cached("elu", coef)
        assert cd.ActivationDescriptor.cached("elu", 0.1) is first  # used all along: never evicted
        assert len(cd.ActivationDescriptor._cache) <= 4
    for coef in (0.8, 0.9, 1.0, 1.1):  # 0.1 unused for maxsize inserts: evicted
        cd.ActivationDescriptor.cached("elu", coef)
    assert cd.ActivationDescriptor.cached("elu", 0.1) is not first  # rebuilt
    assert first.get().coef == 0.1  # an evicted descriptor stays valid while someone holds it


def test_cached_hit_takes_no_lock(monkeypatch):
    a = cd.TensorDescriptor.cached((1, 2, 3, 5), np.dtype(np.float32), "NHWC")

    class NoLock:
        def __enter__(self):
            raise AssertionError("a cache hit took the lock")

        def __exit__(self, *exc):
            return False

    monkeypatch.setattr(cd.TensorDescriptor._cache, "_lock", NoLock())
    assert cd.TensorDescriptor.cached((1, 2, 3, 5), np.dtype(np.float32), "NHWC") is a


def test_cached_rebuilds_a_closed_descriptor():
    a = cd.PoolingDescriptor.cached("avg", 3, 1, 2)
    a.close()
    b = cd.PoolingDescriptor.cached("avg", 3, 1, 2)
    assert b is not a and not b.closed and b.get().window == (3, 3)


def test_lru_cache_two_generations():
    cache = cd.LRUCache(4, "test")
    for key in "ab":
        cache.put(key, key.upper())
    assert len(cache) == 2 and cache.get("a") == "A" and "b" in cache
    cache.put("c", "C")  # recent {a, b} is full (maxsize // 2): it ages, c starts a new one
    assert cache.get("a") == "A"  # a hit in the older generation moves it back
    cache.put("d", "D")  # ages {c, a}: b, unused since, is dropped
    assert cache.get("b") is None and cache.get("missing", 7) == 7
    assert sorted(k for k, _ in cache.items()) == ["a", "c", "d"] and len(cache) <= 4
    with pytest.raises(ValueError, match="None cannot be cached"):
        cache.put("e", None)
    with pytest.raises(ValueError, match="maxsize must be an int >= 2"):
        cd.LRUCache(1)
    cache.clear()
    assert len(cache) == 0 and cache.get("a") is None


def test_cached_keys_normalise_dtypes():
    a = cd.TensorDescriptor.cached([1, 2, 3, 4], np.float32)
    assert cd.TensorDescriptor.cached((1, 2, 3, 4), np.dtype("float32")) is a


def _header_version() -> int | None:
    """CUDNN_MAJOR * 10000 + CUDNN_MINOR * 100 + CUDNN_PATCHLEVEL from cudnn_version.h of the wheel whose
    libcudnn is the one loaded, or None (no wheel, or a libcudnn from elsewhere)."""
    try:
        import nvidia.cudnn as pkg  # only to find the wheel's include directory
    except ImportError:
        return None
    loaded = loader.library_info("cudnn").path
    for base in pkg.__path__:
        header = Path(base) / "include" / "cudnn_version.h"
        if header.exists() and loaded and Path(loaded).resolve().is_relative_to(Path(base).resolve()):
            text = header.read_text()
            major, minor, patch = (int(re.search(rf"#define CUDNN_{n}\s+(\d+)", text).group(1))
                                   for n in ("MAJOR", "MINOR", "PATCHLEVEL"))
            return major * 10000 + minor * 100 + patch
    return None


def test_versions():
    assert cd.version() == C.version() >= 90000
    header = _header_version()
    if header is not None:  # the library loaded is the one whose headers the wheel ships
        assert cd.version() == header
    assert cd.cudart_version() >= 12000


# ------------------------------------------------------------------------------------ no GPU


@pytest.mark.skipif(_gpu_available(), reason="checks the no-GPU error; this machine has a GPU")
def test_handle_without_gpu_raises_no_device_error():
    with pytest.raises(NoDeviceError) as info:
        cd.Handle()
    msg = str(info.value)
    assert msg.startswith("no CUDA device found: cuDNN reported 'cudaGetDeviceCount(&count) != cudaSuccess'")
    assert "NumPy backend" in msg and "set_default_device('cpu')" in msg
    assert "CUDNN_STATUS_NOT_INITIALIZED" in msg


@pytest.mark.skipif(_gpu_available(), reason="checks the no-GPU error; this machine has a GPU")
def test_get_handle_without_gpu_raises_no_device_error():
    with pytest.raises(NoDeviceError, match="no CUDA device found"):
        cd.get_handle()


@pytest.mark.skipif(_gpu_available(), reason="checks the no-GPU error; this machine has a GPU")
def test_cublas_handle_without_gpu_raises_no_device_error():
    with pytest.raises(NoDeviceError, match="no CUDA device found: cuBLAS reported 'CUBLAS_STATUS_NOT_INITIALIZED'"):
        cb.Handle()
    with pytest.raises(NoDeviceError):
        cb.get_handle()


def test_borrowed_handle_is_never_destroyed(monkeypatch):
    calls = []
    monkeypatch.setattr(C, "raw", lambda name: (lambda *a: calls.append(name) or 0))
    monkeypatch.setattr(C, "cudnnGetStream", lambda h, out: None, raising=False)
    handle = cd.Handle.from_handle(0x1234, owned=False, device=0)
    assert not handle.owned and handle.handle == 0x1234 and handle.stream == 0
    handle.close()
    del handle
    gc.collect()
    assert "cudnnDestroy" not in calls
    owned = cd.Handle.from_handle(0x5678, owned=True, device=0)
    owned.close()
    owned.close()
    assert calls.count("cudnnDestroy") == 1


# ------------------------------------------------------------------------------------ workspace (allocation faked)


@pytest.fixture
def fake_workspace(monkeypatch):
    """dnnbind.cudnn's workspace with a pretend device 0 and a fake pool: returns the allocation log."""
    import dnnbind.cuda.device as dev
    from dnnbind.cudnn import _workspace

    monkeypatch.setattr(dev, "_probe", (1, ""))
    made = []

    class FakeAllocation:
        def __init__(self, nbytes, stream, what=""):
            self.ptr, self.nbytes, self.stream = 0x10000 * (len(made) + 1), nbytes, stream
            made.append(self)

    monkeypatch.setattr(_workspace, "alloc", FakeAllocation)
    monkeypatch.setattr(_workspace, "_buffers", {})
    return made


def _fake_stream(handle, owned):
    from dnnbind.cuda.stream import Stream

    stream = Stream.from_handle(handle, owned=False, device=0)
    if owned:  # as if dnnbind had made it; closing it destroys nothing here
        stream._adopt(handle, lambda ptr: (0,))  # cudaStreamDestroy's (cudaSuccess,)
    return stream


def test_workspace_grows_in_mib_per_stream_and_is_released(fake_workspace):
    a, b = _fake_stream(0xA0, True), _fake_stream(0xB0, True)
    ptr = cd.workspace(a, 100)
    assert ptr and fake_workspace[-1].nbytes == 1 << 20 and cd.workspace(a, 1 << 20) == ptr  # within the MiB
    assert cd.workspace(a, 0) == 0 and len(fake_workspace) == 1
    assert cd.workspace(b, 10) != ptr and len(fake_workspace) == 2  # one buffer per stream
    grown = cd.workspace(a, (1 << 20) + 1)
    assert grown != ptr and fake_workspace[-1].nbytes == 2 << 20 and cd.workspace_buffer(a) is fake_workspace[-1]
    cd.release_workspaces()
    assert cd.workspace_buffer(a) is None and cd.workspace_buffer(b) is None


@pytest.mark.parametrize("nbytes, message", [
    (1.5, "cudnn.workspace: nbytes must be an int, got float 1.5"),
    ("64", "cudnn.workspace: nbytes must be an int, got '64'"),
    (True, "cudnn.workspace: nbytes must be an int, got bool True"),
])
def test_workspace_names_a_bad_size_before_allocating(fake_workspace, nbytes, message):
    a = _fake_stream(0xA0, True)
    with pytest.raises(TypeError, match=re.escape(message)):
        cd.workspace(a, nbytes)
    assert fake_workspace == [] and cd.workspace_buffer(a) is None
    assert cd.workspace(a, np.int64(100)) and fake_workspace[-1].nbytes == 1 << 20  # NumPy ints are sizes too


def test_workspace_of_a_closed_stream_never_reaches_a_new_stream_with_its_handle(fake_workspace):
    old = _fake_stream(0xC0, True)
    old_ptr = cd.workspace(old, 4096)
    old.close()
    new = _fake_stream(0xC0, True)  # the runtime handed the same handle to a new stream
    assert new == old  # streams compare by handle: the cache must check the object itself
    assert cd.workspace_buffer(new) is None
    new_ptr = cd.workspace(new, 4096)
    assert new_ptr != old_ptr and fake_workspace[-1].stream is new
    from dnnbind.cudnn import _workspace

    assert list(_workspace._buffers) == [new] and next(iter(_workspace._buffers)) is new  # the closed one pruned


def test_borrowed_wrappers_of_one_handle_share_its_workspace(fake_workspace):
    ptr = cd.workspace(_fake_stream(0xD0, False), 4096)
    assert cd.workspace(_fake_stream(0xD0, False), 4096) == ptr and len(fake_workspace) == 1
    owned = _fake_stream(0xD0, True)  # an owned stream never takes a borrowed wrapper's buffer
    assert cd.workspace(owned, 4096) != ptr
