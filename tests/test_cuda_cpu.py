"""dnnbind.cuda without a GPU: the probe, argument validation, views, the DLPack ABI and ownership."""

from __future__ import annotations

import ctypes
import gc
import subprocess
import sys
import textwrap
import types

import ml_dtypes
import numpy as np
import pytest

from dnnbind import _lib, cuda
from dnnbind.cuda import device as devmod
from dnnbind.cuda import _dlpack, interop
from dnnbind.cuda import graph as gmod
from dnnbind.cuda import kernel as kmod
from dnnbind.cuda import memory as mmod
from dnnbind.cuda import stream as smod
from dnnbind.cuda.array import DeviceArray
from dnnbind.errors import CudaError, NoDeviceError

no_gpu = pytest.mark.skipif(cuda.is_available(), reason="checks the behaviour without a GPU")
BF16 = np.dtype(ml_dtypes.bfloat16)
SAXPY_SRC = r"""
extern "C" __global__ void saxpy(float a, const float* x, float* y, long long n) {
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}
"""


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


@pytest.mark.parametrize("dtype", [np.complex64, np.float128 if hasattr(np, "float128") else np.clongdouble,
                                   "datetime64[s]", "U3", object])
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
    assert names == {"float64", "float32", "float16", "bfloat16", "int8", "uint8", "int16", "uint16", "int32", "uint32",
                     "int64", "uint64", "bool"}


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


# --------------------------------------------------------------------------- ownership (fake handles)
# One record and one policy for every owned C pointer (dnnbind._lib.OwnedPointer). The destroy
# functions are counted, never run for real: every pointer here is made up.

class _Counted(_lib.OwnedPointer):
    def __init__(self, ptr, destroyed, owned=True):
        self._adopt(ptr, destroyed.append, owned=owned)


def test_owned_pointer_close_is_idempotent_and_borrowed_is_never_destroyed():
    destroyed = []
    owner = _Counted(0x10, destroyed)
    assert owner.handle == 0x10 and owner.owned and not owner.closed
    owner.close()
    owner.close()
    assert destroyed == [0x10] and owner.closed
    with pytest.raises(ValueError, match="_Counted is closed"):
        owner.handle
    borrowed = _Counted(0x20, destroyed, owned=False)
    assert not borrowed.owned
    borrowed.close()
    del borrowed
    assert destroyed == [0x10]


def test_owned_pointer_is_destroyed_once_when_collected_and_never_at_exit():
    destroyed = []
    owner = _Counted(0x30, destroyed)
    finalizer = owner._finalizer
    assert finalizer.alive and finalizer.atexit is False  # the exit policy: nothing at exit
    del owner  # no cycle through the record: reference counting is enough
    assert destroyed == [0x30] and not finalizer.alive
    closed = _Counted(0x40, destroyed)
    closed.close()
    del closed
    assert destroyed == [0x30, 0x40]  # close() then collection: still once


def test_nothing_is_destroyed_from_interpreter_exit_on():
    # A module global and a member of a reference cycle are both alive when the interpreter exits.
    script = textwrap.dedent("""
        import gc, sys
        from dnnbind._lib import OwnedPointer

        class Owner(OwnedPointer):
            def __init__(self, ptr):
                self._adopt(ptr, lambda p: sys.stdout.write(f"destroyed {p:#x}\\n"))

        kept = Owner(0x1)
        cycle = Owner(0x2)
        cycle.me = cycle
        Owner(0x3)  # collected at once: destroyed
        gc.disable()
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout == "destroyed 0x3\n"


def test_destroys_wait_for_a_capture_in_progress():
    destroyed = []
    by_gc, by_close = _Counted(0x50, destroyed), _Counted(0x60, destroyed)
    mmod.capture_began()  # what dnnbind.cuda.capture() does around the capture
    try:
        assert mmod.capture_in_progress()
        del by_gc
        by_close.close()
        assert by_close.closed and destroyed == []  # closed at once, destroyed later
        mmod.flush_deferred_frees()
        assert destroyed == []  # still capturing
    finally:
        mmod.capture_ended()
    mmod.flush_deferred_frees()
    assert sorted(destroyed) == [0x50, 0x60]


def test_stream_owns_its_handle_through_the_record(monkeypatch):
    monkeypatch.setattr(devmod, "_probe", (1, ""))  # one (pretend) device, so device=0 is valid
    destroyed = []
    monkeypatch.setattr(smod.rt, "cudaStreamDestroy",
                        lambda h: destroyed.append(h) or (smod.rt.cudaError_t.cudaSuccess,))
    owned = cuda.Stream.from_handle(0x5000, owned=True, device=0)
    assert type(owned) is cuda.Stream and owned._handle == 0x5000 and owned._device == 0  # the hot reads
    assert owned.handle == 0x5000 and owned.owned and "owned" in repr(owned)
    key = hash(owned)
    owned.close()
    owned.close()
    assert destroyed == [0x5000] and owned.closed and "closed" in repr(owned)
    assert hash(owned) == key and owned._handle == 0x5000  # cache keys stay stable
    with pytest.raises(ValueError, match="Stream 0x5000 is closed"):
        owned.handle
    borrowed = cuda.Stream.from_handle(0x6000, device=0)
    assert not borrowed.owned and "borrowed" in repr(borrowed)
    borrowed.close()
    del borrowed
    collected = cuda.Stream.from_handle(0x7000, owned=True, device=0)
    del collected
    assert destroyed == [0x5000, 0x7000]


def test_stream_close_raises_a_failed_destroy(monkeypatch):
    monkeypatch.setattr(devmod, "_probe", (1, ""))
    err = smod.rt.cudaError_t.cudaErrorInvalidResourceHandle
    monkeypatch.setattr(smod.rt, "cudaStreamDestroy", lambda h: (err,))
    s = cuda.Stream.from_handle(0x5100, owned=True, device=0)
    with pytest.raises(CudaError, match="cudaStreamDestroy"):
        s.close()
    assert s.closed
    s.close()  # once: not retried


def test_graph_owns_its_graph_and_executable_one_record_each(monkeypatch):
    destroyed = []
    ok = (gmod.rt.cudaError_t.cudaSuccess,)
    monkeypatch.setattr(gmod.rt, "cudaGraphDestroy", lambda p: destroyed.append(("graph", p)) or ok)
    monkeypatch.setattr(gmod.rt, "cudaGraphExecDestroy", lambda p: destroyed.append(("exec", p)) or ok)
    g = cuda.Graph()
    assert not g.captured and repr(g) == "Graph(empty)"
    g.close()  # nothing to destroy yet
    g._graph = gmod._GraphPart(0x900, gmod._destroy_graph, "cudaGraphDestroy")
    g._exec = gmod._GraphPart(0x901, gmod._destroy_exec, "cudaGraphExecDestroy")
    assert g.captured and repr(g) == "Graph(instantiated)"
    g.close()
    g.close()
    assert destroyed == [("exec", 0x901), ("graph", 0x900)] and repr(g) == "Graph(closed)"
    with pytest.raises(RuntimeError, match="closed"):
        g.launch()
    g2 = cuda.Graph()
    g2._graph = gmod._GraphPart(0x902, gmod._destroy_graph, "cudaGraphDestroy")
    mmod.capture_began()
    try:
        del g2  # collected during a capture: the destroy waits for its end
        assert len(destroyed) == 2
    finally:
        mmod.capture_ended()
    mmod.flush_deferred_frees()
    assert destroyed[2:] == [("graph", 0x902)]


def test_kernel_owns_one_module_record_per_device(monkeypatch):
    unloaded = []
    ok = (kmod._driver().CUresult.CUDA_SUCCESS,)
    monkeypatch.setattr(kmod, "_unload_module", lambda device, module: unloaded.append((device, module)) or ok)
    k = kmod.Kernel(SAXPY_SRC, "saxpy", arch="sm_90")  # compile-only: no GPU needed
    k._modules[0] = (kmod._Module(0xA0, 0), "func0", None)
    k._modules[1] = (kmod._Module(0xA1, 1), "func1", None)
    k.close()
    k.close()
    assert sorted(unloaded) == [(0, 0xA0), (1, 0xA1)] and not k._modules
    k._modules[0] = (kmod._Module(0xA2, 0), "func0", None)  # loaded again by a later launch
    del k
    assert unloaded[-1] == (0, 0xA2) and len(unloaded) == 3


def test_pinned_buffer_is_an_owned_pointer(monkeypatch):
    freed = []
    success = mmod.rt.cudaError_t.cudaSuccess
    monkeypatch.setattr(mmod.rt, "cudaHostAlloc", lambda n, flags: (success, 0xB000))
    monkeypatch.setattr(mmod.rt, "cudaFreeHost", lambda p: freed.append(p) or (success,))
    buf = mmod.PinnedBuffer(64)
    assert buf.ptr == 0xB000 and buf.nbytes == 64
    buf.close()
    buf.close()
    assert freed == [0xB000]
    with pytest.raises(ValueError, match="closed"):
        buf.ptr
    mmod.capture_began()
    try:
        during = mmod.PinnedBuffer(64)
        del during  # cudaFreeHost synchronises: it waits for the capture's end
        assert freed == [0xB000]
    finally:
        mmod.capture_ended()
    mmod.flush_deferred_frees()
    assert freed == [0xB000, 0xB000]


def test_dlpack_owner_runs_the_deleter_once_and_borrows_without_one():
    deleted = []
    owner = interop._DLPackOwner("producer", 0xC000, deleted.append)
    assert owner.owned and owner.producer == "producer"
    del owner
    assert deleted == [0xC000]
    assert not interop._DLPackOwner(None, 0xC100, None).owned


def test_handle_cache_never_returns_a_closed_streams_handle(monkeypatch):
    # CUDA reuses a destroyed stream's handle: a new stream with the same raw handle must get a
    # library handle of its own, while wrappers of a live stream share one
    monkeypatch.setattr(devmod, "_probe", (1, ""))
    monkeypatch.setattr(smod, "is_available", lambda: True)
    monkeypatch.setattr(smod.Stream, "is_capturing", lambda self: False)
    monkeypatch.setattr(smod.rt, "cudaStreamDestroy", lambda h: (smod.rt.cudaError_t.cudaSuccess,))

    class _Handle:
        closed = False

        def __init__(self, stream):
            self.stream = stream

    made = []
    cache = smod.PerStreamCache("test", lambda index, stream: made.append(_Handle(stream)) or made[-1])
    first = cuda.Stream.from_handle(0x5200, owned=True, device=0)
    h1 = cache.get(first)
    assert cache.get(first) is h1 and len(made) == 1  # hot path
    assert cache.get(cuda.Stream.from_handle(0x5200, device=0)) is h1  # a borrowed wrapper of the live stream
    first.close()
    second = cuda.Stream.from_handle(0x5200, owned=True, device=0)  # the same raw handle, reused
    h2 = cache.get(second)
    assert h2 is not h1 and h2.stream is second and len(made) == 2
    assert cache.get(second) is h2
