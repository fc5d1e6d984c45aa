"""dnnbind.cuda without a GPU: the probe, argument validation, views and the DLPack ABI."""

from __future__ import annotations

import ctypes
import gc
import types

import ml_dtypes
import numpy as np
import pytest

from dnnbind import cuda
from dnnbind.cuda import device as devmod
from dnnbind.cuda import _dlpack, interop
from dnnbind.cuda.array import DeviceArray
from dnnbind.errors import NoDeviceError

no_gpu = pytest.mark.skipif(cuda.is_available(), reason="checks the behaviour without a GPU")
BF16 = np.dtype(ml_dtypes.bfloat16)


def fake(shape, dtype=np.float32, ptr=0x10000, strides=None, stream=None):
    """A DeviceArray over a made-up address: exercises pure-Python paths, never dereferenced."""
    return DeviceArray(object(), shape, dtype, ptr, strides=strides, device_index=0, stream=stream)


# --------------------------------------------------------------------------- availability

@no_gpu
def test_unavailable_is_reported_without_raising():
    assert cuda.is_available() is False
    assert cuda.device_count() == 0
    reason = cuda.unavailable_reason()
    assert "cudaGetDeviceCount" in reason and "Traceback" not in reason and "\n" not in reason


@no_gpu
def test_gpu_calls_raise_no_device_error():
    with pytest.raises(NoDeviceError, match="doctor"):
        cuda.current_device_index()
    with pytest.raises(NoDeviceError):
        cuda.Device(0)
    with pytest.raises(NoDeviceError):
        cuda.empty((2, 3))
    with pytest.raises(NoDeviceError):
        cuda.to_device(np.ones(3, np.float32))


def test_probe_maps_no_libcuda_to_false(monkeypatch):
    from cuda.pathfinder import DynamicLibNotFoundError

    def boom():
        raise DynamicLibNotFoundError('"cuda" is an NVIDIA driver library')

    monkeypatch.setattr(devmod.rt, "cudaGetDeviceCount", boom)
    count, reason = devmod._run_probe()
    assert count == 0 and reason.startswith("no NVIDIA driver found")


def test_probe_maps_no_device(monkeypatch):
    monkeypatch.setattr(devmod.rt, "cudaGetDeviceCount",
                        lambda: (devmod.rt.cudaError_t.cudaErrorNoDevice, 0))
    count, reason = devmod._run_probe()
    assert count == 0 and reason == "no CUDA-capable GPU found (cudaGetDeviceCount: cudaErrorNoDevice)"


def test_probe_without_cuda_bindings(monkeypatch):
    monkeypatch.setattr(devmod, "rt", None)
    monkeypatch.setattr(devmod, "IMPORT_ERROR", ImportError("No module named 'cuda.bindings'"))
    count, reason = devmod._run_probe()
    assert count == 0 and "cuda-bindings cannot be imported" in reason


# --------------------------------------------------------------------------- validation

@pytest.mark.parametrize("shape", [(2, -1), -3, (1, -2, 3)])
def test_negative_dims_rejected_before_any_cuda_call(shape):
    with pytest.raises(ValueError, match="negative dimension"):
        cuda.empty(shape, np.float32)


@pytest.mark.parametrize("shape", [(2.0, 3), "ab", (None,), (True, 2)])
def test_non_integer_shapes_rejected(shape):
    with pytest.raises(TypeError, match="shape"):
        cuda.zeros(shape)


@pytest.mark.parametrize("dtype", [np.complex64, np.int16, np.uint32, "U3", object])
def test_unsupported_dtypes_rejected(dtype):
    with pytest.raises(TypeError, match="supported"):
        cuda.empty((2, 2), dtype)


def test_to_device_rejects_unsupported_host_arrays_before_cuda():
    with pytest.raises(TypeError, match="complex128"):
        cuda.to_device(np.ones(3, np.complex128))
    with pytest.raises(TypeError, match="to_device"):
        cuda.to_device(np.array(["a", "b"]))


def test_all_documented_dtypes_are_supported():
    names = {str(d) for d in cuda.SUPPORTED_DTYPES}
    assert names == {"float64", "float32", "float16", "bfloat16", "int8", "uint8", "int32", "int64", "bool"}


# --------------------------------------------------------------------------- DeviceArray views

def test_attributes_and_repr():
    x = fake((4, 3, 2), BF16)
    assert x.shape == (4, 3, 2) and x.dtype == BF16 and x.itemsize == 2
    assert x.strides == (12, 4, 2) and x.nbytes == 48 and x.size == 24 and x.ndim == 3
    assert x.is_contiguous and len(x) == 4
    assert repr(x) == "DeviceArray(shape=(4, 3, 2), dtype=bfloat16, device=cuda:0)"


def test_axis0_slicing_and_integer_index_are_views():
    x = fake((5, 3), np.float32, ptr=0x1000)
    y = x[1:4]
    assert y.shape == (3, 3) and y.ptr == 0x1000 + 12 and y.base is x.base and y.is_contiguous
    z = x[-1]
    assert z.shape == (3,) and z.ptr == 0x1000 + 48
    assert x[3:1].shape == (0, 3)
    assert x[(2,)].ptr == 0x1000 + 24
    with pytest.raises(IndexError, match="out of bounds"):
        x[5]
    with pytest.raises(IndexError, match="step 1"):
        x[::2]
    with pytest.raises(TypeError, match="take"):
        x[[0, 1]]
    with pytest.raises(IndexError):
        fake((), np.float32)[0]


def test_reshape_and_view():
    x = fake((4, 6), np.float32, ptr=0x2000)
    r = x.reshape(2, -1, 3)
    assert r.shape == (2, 4, 3) and r.ptr == 0x2000 and r.strides == (48, 12, 4)
    assert x.reshape((24,)).shape == (24,)
    with pytest.raises(ValueError, match="cannot reshape"):
        x.reshape(5, 5)
    with pytest.raises(ValueError, match="one -1"):
        x.reshape(-1, -1)
    v = x.view(np.uint8)
    assert v.shape == (4, 24) and v.dtype == np.uint8
    assert x.view(np.int32).shape == (4, 6)
    assert x.view(np.float64).shape == (4, 3)
    with pytest.raises(ValueError, match="multiple"):
        fake((3,), np.uint8).view(np.float32)


def test_non_contiguous_arrays_refuse_contiguous_only_operations():
    x = fake((3, 4), np.float32, strides=(4, 12))  # a transposed (Fortran-order) view
    assert not x.is_contiguous
    assert "strides=(4, 12)" in repr(x)
    with pytest.raises(ValueError, match="C-contiguous"):
        x.reshape(12)
    with pytest.raises(ValueError, match="C-contiguous"):
        x.to_host()
    with pytest.raises(ValueError, match="C-contiguous"):
        x.fill_zero()
    assert fake((3, 1), np.float32, strides=(4, 999)).is_contiguous  # size-1 axes may have any stride


def test_no_silent_host_conversion():
    x = fake((2, 2))
    with pytest.raises(TypeError, match="to_host"):
        np.asarray(x)
    with pytest.raises(TypeError, match="to_host"):
        np.add(np.ones((2, 2)), x)
    with pytest.raises(TypeError, match="truth value"):
        bool(x)
    with pytest.raises(TypeError, match="0-d"):
        len(fake(()))


def test_host_copy_validation_happens_before_cuda():
    x = fake((2, 3), np.float32)
    with pytest.raises(ValueError, match=r"\(3, 2\)"):
        x.copy_from_host(np.ones((3, 2), np.float32))
    with pytest.raises(TypeError, match="cannot cast"):
        x.copy_from_host(np.ones((2, 3), np.complex64))
    with pytest.raises(ValueError, match="out has shape"):
        x.to_host(out=np.empty((3, 2), np.float32))
    with pytest.raises(ValueError, match="0..255"):
        x.fill_bytes(256)


def test_closed_array_refuses_use():
    x = fake((2, 3))
    x.close()
    x.close()  # idempotent
    assert x.closed and "closed" in repr(x)
    with pytest.raises(ValueError, match="closed"):
        x[0]
    with pytest.raises(ValueError, match="closed"):
        x.__cuda_array_interface__


def test_cuda_array_interface_v3():
    stream = types.SimpleNamespace(handle=0xABC)
    x = fake((2, 3), np.float16, ptr=0x4000, stream=stream)
    cai = x.__cuda_array_interface__
    assert cai["version"] == 3 and cai["shape"] == (2, 3) and cai["typestr"] == "<f2"
    assert cai["data"] == (0x4000, False) and cai["strides"] is None and cai["stream"] == 0xABC
    t = fake((3, 2), np.float32, strides=(4, 12), stream=stream).__cuda_array_interface__
    assert t["strides"] == (4, 12)
    assert x.__dlpack_device__() == (2, 0)


# --------------------------------------------------------------------------- DLPack ABI

@pytest.mark.parametrize("max_version", [None, (1, 0)])
@pytest.mark.parametrize("dtype,strides", [(np.float32, None), (BF16, None), (np.bool_, None),
                                           (np.int64, (8, 24))])
def test_dlpack_capsule_round_trip(dtype, strides, max_version):
    src = fake((3, 2), dtype, ptr=0x8000, strides=strides)
    capsule = src.__dlpack__(stream=-1, max_version=max_version)
    assert len(_dlpack._exports) >= 1
    stand_in = types.SimpleNamespace(handle=5, device_index=0)
    out = interop._from_capsule(capsule, None, stand_in)
    assert out.ptr == 0x8000 and out.shape == (3, 2) and out.dtype == np.dtype(dtype)
    assert out.strides == src.strides
    with pytest.raises(ValueError, match="already consumed"):
        interop._from_capsule(capsule, None, stand_in)
    key = [k for k, v in _dlpack._exports.items() if v[0] is src]
    assert len(key) == 1
    del out
    gc.collect()
    assert not [k for k, v in _dlpack._exports.items() if v[0] is src]  # deleter ran


def test_unconsumed_capsule_releases_the_array():
    src = fake((4,), np.float32)
    capsule = src.__dlpack__(stream=-1)
    assert any(v[0] is src for v in _dlpack._exports.values())
    del capsule
    gc.collect()
    assert not any(v[0] is src for v in _dlpack._exports.values())


def test_dlpack_refuses_other_devices_and_host_producers():
    with pytest.raises(BufferError, match="cannot export"):
        fake((2,)).__dlpack__(stream=-1, dl_device=(1, 0))
    with pytest.raises(TypeError, match="to_device"):
        cuda.from_dlpack(np.ones(3, np.float32))
    with pytest.raises(TypeError, match="neither"):
        cuda.from_dlpack(object())


def test_dlpack_struct_layout_matches_the_header():
    # dlpack.h: DLTensor is 48 bytes on LP64; DLManagedTensorVersioned puts dl_tensor at 32.
    assert ctypes.sizeof(_dlpack.DLTensor) == 48
    assert ctypes.sizeof(_dlpack.DLManagedTensor) == 64
    assert _dlpack.DLManagedTensorVersioned.dl_tensor.offset == 32


def test_the_gpu_class_and_the_placement_class_have_different_names():
    from dnnbind import backend

    assert cuda.Device is cuda.CudaDevice and cuda.CudaDevice.__name__ == "CudaDevice"  # the public alias
    assert backend.Device is not cuda.CudaDevice and backend.Device.__name__ == "Device"
    assert str(backend.Device("gpu:1")) == "cuda:1"
