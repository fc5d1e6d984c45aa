"""The host fast paths (cached lookups, prebuilt kernel argument plans, memos) keep the semantics
of the general paths they shortcut. CPU only: the device calls are faked where needed."""

from __future__ import annotations

import ctypes

import ml_dtypes
import numpy as np
import pytest

from dnnbind import backend, cuda
from dnnbind._validate import normalize_dtype
from dnnbind.cuda import array as amod
from dnnbind.cuda import kernel as kmod
from dnnbind.cuda import memory as mmod
from dnnbind.cuda.stream import Stream
from dnnbind.kernels import _dispatch
from dnnbind.kernels import conv as conv_ops

SAXPY = r"""
extern "C" __global__ void saxpy(float a, const float* x, float* y, long long n, int flag, double d) {
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i < n && flag) y[i] = a * x[i] + y[i] + (float)d;
}
"""


def _fake_stream(handle: int = 0x5000, device: int = 0) -> Stream:
    s = object.__new__(Stream)
    s._handle, s._device, s._owned, s._finalizer = handle, device, False, None
    return s


def _fake_array(shape=(4, 3), dtype=np.float32, ptr=0x7000) -> "cuda.DeviceArray":
    dt = np.dtype(dtype)
    return cuda.DeviceArray(None, shape, dt, ptr, device_index=0, stream=_fake_stream())


def test_is_device_array_and_as_array():
    x = _fake_array()
    assert backend.is_device_array(x) and not backend.is_device_array(np.zeros(2))
    assert not backend.is_device_array(np.float32(1)) and not backend.is_device_array([1.0])

    class Sub(cuda.DeviceArray):
        __slots__ = ()

    sub = Sub(None, (2,), np.float32, 0x10, device_index=0, stream=None)
    assert backend.is_device_array(sub)
    assert _dispatch.as_array(x) is x
    assert isinstance(_dispatch.as_array([1.0, 2.0]), np.ndarray)


def test_route_fast_paths_and_mixed_devices():
    x, w = _fake_array(), _fake_array((3,))
    h = np.zeros((4, 3), np.float32)
    assert _dispatch.route("op", "conv", x=x, w=w, out=None).__name__ == "dnnbind.kernels._cuda.conv"
    assert _dispatch.route("op", "conv", x=h, w=h, out=None) is None
    with pytest.raises(TypeError, match="x is a DeviceArray but w is a ndarray"):
        _dispatch.route("op", "conv", x=x, w=h)
    with pytest.raises(TypeError, match="x is a numpy.ndarray but w is a DeviceArray"):
        _dispatch.route("op", "conv", x=h, w=x)
    assert _dispatch.route("op", "conv", x=x, alpha=2.0).__name__ == "dnnbind.kernels._cuda.conv"


def test_normalize_shape_and_dtype_fast_paths_keep_their_errors():
    assert amod.normalize_shape((2, 3)) == (2, 3)
    assert amod.normalize_shape((np.int64(2), 3)) == (2, 3)
    assert type(amod.normalize_shape((np.int64(2), 3))[0]) is int
    for bad in ((2, -1), (2, True), (2.0, 3)):
        with pytest.raises((TypeError, ValueError)):
            amod.normalize_shape(bad)
    gpu = frozenset(amod.SUPPORTED_DTYPES)
    for spelling in ("float32", np.float32, np.dtype(np.float32), "float32"):  # twice: the cached hit
        assert normalize_dtype(spelling, "DeviceArray", gpu) == np.dtype(np.float32)
    assert normalize_dtype(np.dtype(np.float32), "DeviceArray", gpu) is np.dtype(np.float32)
    assert normalize_dtype("bf16") == normalize_dtype("bfloat16") == np.dtype(ml_dtypes.bfloat16)
    for _ in range(2):  # the second time from the cache of parsed spellings: still refused
        with pytest.raises(TypeError, match="DeviceArray: dtype complex64 is not supported"):
            normalize_dtype(np.complex64, "DeviceArray", gpu)
        with pytest.raises(TypeError, match="not supported"):
            normalize_dtype(">f4", "DeviceArray", gpu)
    with pytest.raises(TypeError, match="'nope' is not a dtype"):
        normalize_dtype("nope", "DeviceArray", gpu)


def test_conv_params_memo_still_rejects_bool_and_float_arguments():
    args = dict(stride=1, padding=1, dilation=1, groups=1, layout="NCHW")
    first = conv_ops.conv_params("op", (2, 4, 8, 8), (6, 4, 3, 3), **args)
    assert conv_ops.conv_params("op", (2, 4, 8, 8), (6, 4, 3, 3), **args) is first  # memo hit
    with pytest.raises(ValueError, match="groups"):
        conv_ops.conv_params("op", (2, 4, 8, 8), (6, 4, 3, 3), **{**args, "groups": True})
    with pytest.raises(TypeError, match="stride"):
        conv_ops.conv_params("op", (2, 4, 8, 8), (6, 4, 3, 3), **{**args, "stride": True})
    with pytest.raises(ValueError, match="channels"):
        conv_ops.conv_params("op", (2, 5, 8, 8), (6, 4, 3, 3), **args)


def test_allocation_is_freed_exactly_once(monkeypatch):
    freed = []
    monkeypatch.setattr(mmod, "_free", lambda record: freed.append(record.ptr))
    rec = mmod._AllocRecord(0x1000, 64, _fake_stream(), 0, 0)
    a = mmod.Allocation(rec)
    a.close()
    a.close()
    del a
    assert freed == [0x1000]
    b = mmod.Allocation(mmod._AllocRecord(0x2000, 64, _fake_stream(), 0, 0))
    view = amod.DeviceArray(b, (16,), np.float32, b.ptr, device_index=0, stream=None)
    del b
    assert freed == [0x1000]  # the view keeps it alive
    del view
    assert freed == [0x1000, 0x2000]


def test_alloc_formats_what_only_on_failure(monkeypatch):
    monkeypatch.setattr(mmod, "_pools", {0: object()})
    monkeypatch.setattr(mmod, "_capture_id", lambda handle: 0)
    err = mmod.rt.cudaError_t.cudaErrorMemoryAllocation
    monkeypatch.setattr(mmod.rt, "cudaMallocAsync", lambda n, h: (err, 0))
    monkeypatch.setattr(mmod.rt, "cudaGetLastError", lambda: (mmod.rt.cudaError_t.cudaSuccess,))
    with pytest.raises(MemoryError, match=r"an array of shape \(2, 3\) float32"):
        mmod.alloc(24, _fake_stream(), what=("an array of shape {} {}", (2, 3), np.dtype(np.float32)))


def _params(address: int, sizes) -> list[bytes]:
    table = (ctypes.c_void_p * len(sizes)).from_address(address)
    return [ctypes.string_at(table[i], size) for i, size in enumerate(sizes)]


@pytest.mark.parametrize("known_sizes", [True, False])
def test_launch_plan_packs_the_same_bytes_as_the_general_path(monkeypatch, known_sizes):
    k = kmod.Kernel(SAXPY, "saxpy", arch="sm_90")  # compile-only: no GPU needed
    sizes = (4, 8, 8, 8, 4, 8)
    k._modules[0] = (None, "func", sizes if known_sizes else None)
    launches = []
    drv = kmod._driver()

    def fake_launch(func, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
        launches.append(((gx, gy, gz), (bx, by, bz), shared, stream, _params(params, sizes)))
        return (drv.CUresult.CUDA_SUCCESS,)

    monkeypatch.setattr(drv, "cuLaunchKernel", fake_launch)
    s = _fake_stream()
    x = _fake_array(ptr=0xABC0)
    # NumPy scalars and pointers: the prebuilt plan; then a plan-less call (a Python float).
    args_plan = (np.float32(2.5), x, kmod.Pointer(0xDEF0), np.int64(-7), np.int32(1), np.float64(0.25))
    for _ in range(2):  # the second call refills the cached plan
        k((3,), (128,), args_plan, stream=s)
    assert (k._plans[(0, tuple(map(type, args_plan)))] is not None)
    expected = [np.float32(2.5).tobytes(), (0xABC0).to_bytes(8, "little"), (0xDEF0).to_bytes(8, "little"),
                np.int64(-7).tobytes(), np.int32(1).tobytes(), np.float64(0.25).tobytes()]
    assert launches[0] == ((3, 1, 1), (128, 1, 1), 0, 0x5000, expected)
    assert launches[1] == launches[0]
    k((3,), (128,), (np.float32(2.5), None, x, np.int64(5), np.int32(0), np.float64(1.0)), stream=s)
    assert launches[-1][4][1] == bytes(8) and launches[-1][4][3] == np.int64(5).tobytes()
    if known_sizes:
        general = (2.5, x, kmod.Pointer(0xDEF0), -7, 1, 0.25)  # Python scalars: sized by the signature
        k((3,), (128,), general, stream=s)
        assert launches[-1][4] == expected
        with pytest.raises(TypeError, match="exact type"):  # a wrong-size NumPy scalar still fails clearly
            k((3,), (128,), (np.float64(2.5),) + args_plan[1:], stream=s)
    with pytest.raises(ValueError, match="1024 threads"):
        k((3,), (2048,), args_plan, stream=s)


def test_conv_key_memo_follows_the_config():
    from dnnbind._lib import cudnn as C
    from dnnbind.cudnn import algo
    from dnnbind.kernels import config
    from dnnbind.kernels._cuda import conv as cconv
    from dnnbind.kernels._params import ConvParams

    params = ConvParams(stride=(1, 1), pad=(1, 1, 1, 1), dilation=(1, 1), groups=1)
    try:
        g = cconv._geometry((2, 4, 8, 8), (6, 4, 3, 3), params, "NCHW", np.float32)
    except Exception as exc:  # cuDNN's descriptor calls need the library, not a GPU
        pytest.skip(f"cuDNN not loadable: {exc}")
    k1 = g.key("forward", 0)
    assert g.key("forward", 0) is k1 and hash(k1) == hash(algo.ConvKey(**{
        f: getattr(k1, f) for f in k1.__dataclass_fields__}))
    with config.override(allow_tf32=False):
        k2 = g.key("forward", 0)
    assert k2 != k1 and k2.math == C.MathType.FMA_MATH
    with config.override(deterministic=True):
        assert g.key("forward", 0).deterministic
    assert g.key("forward", 0) is k1


class _RecordingKernel:
    def __init__(self, name: str, launches: list) -> None:
        self.name, self.launches = name, launches

    def __call__(self, grid, block, args, *, stream=None):
        self.launches.append((self.name, grid, block, tuple(int(a.ptr) if hasattr(a, "ptr") else a.item()
                                                              for a in args)))


def test_cast_plan_memo_is_keyed_by_both_dtypes_and_keeps_the_grid(monkeypatch):
    from dnnbind._validate import BFLOAT16
    from dnnbind.kernels._cuda import _common as cm
    from dnnbind.kernels._cuda import elementwise as ew

    launches: list = []
    monkeypatch.setattr(ew, "_cast_plans", {})
    monkeypatch.setattr(cm, "kernel", lambda f, name, device: _RecordingKernel(name, launches))
    monkeypatch.setattr(cm, "_sm_count", lambda device: 10)  # grid cap 320 blocks
    s = _fake_stream()
    x = cuda.DeviceArray(None, (1000, 100), np.float32, 0x10000, device_index=0, stream=s)
    for dt, ptr in ((BFLOAT16, 0x20000), (np.dtype(np.float16), 0x30000), (BFLOAT16, 0x40004)):
        out = cuda.DeviceArray(None, x.shape, dt, ptr, device_index=0, stream=s)
        assert ew.cast(x, dt, out=out, stream=s) is out
    n = 100_000
    # vectorised: 4 items per access (16 bytes of float32), 98 blocks; 0x40004 is not 8-byte
    # aligned: one item per thread, 391 blocks capped at 320
    assert launches == [
        ("cast_f32_bf16", (98, 1, 1), (256, 1, 1), (0x10000, 0x20000, n, 1)),
        ("cast_f32_f16", (98, 1, 1), (256, 1, 1), (0x10000, 0x30000, n, 1)),
        ("cast_f32_bf16", (320, 1, 1), (256, 1, 1), (0x10000, 0x40004, n, 0)),
    ]
    assert set(ew._cast_plans) == {(np.dtype(np.float32), BFLOAT16, 0), (np.dtype(np.float32), np.dtype(np.float16), 0)}
    # the public op still refuses bad input before any launch, after good calls
    with pytest.raises(TypeError, match="cast"):
        __import__("dnnbind").kernels.cast(x, np.complex64, stream=s)
    with pytest.raises(ValueError, match="out has shape"):
        __import__("dnnbind").kernels.cast(x, BFLOAT16, out=cuda.DeviceArray(None, (10,), BFLOAT16, 0x50000,
                                                                             device_index=0, stream=s), stream=s)
    assert len(launches) == 3


def test_optimizer_table_key_follows_addresses_and_sizes(monkeypatch):
    from dnnbind.kernels import UpdateTables
    from dnnbind.kernels._cuda import optim

    uploads = []

    def fake_constant(host, stream=None):
        uploads.append(host.copy())
        return len(uploads)

    monkeypatch.setattr(amod, "constant", fake_constant)

    class NotCapturing:
        device_index = 0

        def is_capturing(self):
            return False

    s, tables = NotCapturing(), UpdateTables()
    p = [_fake_array((4, 3), ptr=0x1000), _fake_array((5,), ptr=0x2000)]
    g = [_fake_array((4, 3), ptr=0x3000), _fake_array((5,), ptr=0x4000)]
    m = [_fake_array((4, 3), ptr=0x5000), _fake_array((5,), ptr=0x6000)]
    first = optim._table(p, g, [m, None, None], s, tables)
    assert optim._table(p, g, [m, None, None], s, tables) == first and len(uploads) == 1
    g2 = [g[0], _fake_array((5,), ptr=0x4400)]  # a gradient at another address: a new table
    second = optim._table(p, g2, [m, None, None], s, tables)
    assert second != first and len(uploads) == 2
    row = uploads[1][optim.TABLE_COLS: optim.TABLE_COLS + 6]
    assert list(row) == [0x2000, 0x4400, 0x6000, 0, 0, 5]
    assert optim._table(p, g, [m, None, None], s, tables) == first and len(uploads) == 2


def test_pool_params_memo_still_rejects_bool_and_float_arguments():
    from dnnbind.kernels import pooling as pool_ops

    args = dict(mode="max", window=2, stride=None, padding="valid", layout="NHWC")
    first = pool_ops.pool_params("op", (2, 8, 8, 3), **args)
    assert first[1] == (2, 4, 4, 3)
    assert pool_ops.pool_params("other_op", (2, 8, 8, 3), **args) is first  # memo hit
    with pytest.raises(TypeError, match="window"):
        pool_ops.pool_params("op", (2, 8, 8, 3), **{**args, "window": True})
    with pytest.raises(TypeError, match="window"):
        pool_ops.pool_params("op", (2, 8, 8, 3), **{**args, "window": 2.0})  # hashes like 2
    with pytest.raises(ValueError, match="empty"):
        pool_ops.pool_params("op", (2, 1, 8, 3), **args)


def test_optimizer_list_check_fast_path_keeps_the_messages():
    from dnnbind.kernels import optim as optim_ops

    p = [np.zeros((2, 3), np.float32), np.zeros(4, np.float32)]
    optim_ops._check_lists("op", p, grads=[np.zeros((2, 3), np.float16), np.zeros(4, np.float32)],
                           m=[np.zeros((2, 3), np.float32), np.zeros(4, np.float32)], vhat=None)
    with pytest.raises(ValueError, match=r"m\[1\] has shape \(5,\) but params\[1\] has \(4,\)"):
        optim_ops._check_lists("op", p, m=[np.zeros((2, 3), np.float32), np.zeros(5, np.float32)])
    with pytest.raises(TypeError, match=r"v\[0\] has dtype float64"):
        optim_ops._check_lists("op", p, v=[np.zeros((2, 3)), np.zeros(4, np.float32)])
    with pytest.raises(ValueError, match=r"grads\[0\] is None"):
        optim_ops._check_lists("op", p, grads=[None, np.zeros(4, np.float32)])
    with pytest.raises(ValueError, match="grads has 1 entries"):
        optim_ops._check_lists("op", p, grads=[np.zeros((2, 3), np.float32)])
    with pytest.raises(TypeError, match=r"params\[0\] must be float32"):
        optim_ops._check_lists("op", [np.zeros(2, np.int32)], grads=[np.zeros(2, np.int32)])


class _FakeRuntime:
    """cudaMallocAsync / cudaFreeAsync / cudaStreamIsCapturing that record what they were asked."""

    def __init__(self, monkeypatch, capturing: bool = False) -> None:
        rt = mmod.rt
        self.malloc, self.free = [], []
        self.next_ptr = 0x10000
        none = rt.cudaStreamCaptureStatus.cudaStreamCaptureStatusNone
        self.status = rt.cudaStreamCaptureStatus.cudaStreamCaptureStatusActive if capturing else none
        monkeypatch.setattr(mmod, "_pools", {0: object()})
        monkeypatch.setattr(rt, "cudaMallocAsync", self._malloc)
        monkeypatch.setattr(rt, "cudaFreeAsync", lambda ptr, h: self.free.append((int(ptr), h)) or
                            (rt.cudaError_t.cudaSuccess,))
        monkeypatch.setattr(rt, "cudaStreamIsCapturing", lambda h: (rt.cudaError_t.cudaSuccess, self.status))
        monkeypatch.setattr(rt, "cudaStreamGetCaptureInfo", lambda h: (rt.cudaError_t.cudaSuccess, self.status, 7))

    def _malloc(self, nbytes, handle):
        self.malloc.append((int(nbytes), handle))
        ptr, self.next_ptr = self.next_ptr, self.next_ptr + 0x10000
        return mmod.rt.cudaError_t.cudaSuccess, ptr


def _open_stream(handle: int = 0x5000) -> Stream:
    """A borrowed Stream object that reads as open (its record holds the handle), made without a GPU."""
    s = object.__new__(Stream)
    s._handle, s._device = handle, 0
    s._adopt(handle, lambda h: None, owned=False)
    return s


def test_empty_fast_path_gives_the_checked_layout_and_frees_once(monkeypatch):
    fake = _FakeRuntime(monkeypatch)
    monkeypatch.setattr(amod, "_layouts", {})
    s = _open_stream()
    bf16 = np.dtype(ml_dtypes.bfloat16)
    cases = [((32, 16, 16, 8), np.dtype(np.float32)), ((3, 5), bf16), ((7, 0, 2), np.dtype(np.float64)), ((), bf16)]
    for shape, dt in cases:
        for _ in range(2):  # the first call fills the memo, the second is a hit
            a = amod._empty_on(shape, dt, s)
            ref = np.empty(shape, dt)
            # NumPy's strides, except that a zero-size array keeps the nonzero strides it always had
            strides = ref.strides if ref.size else amod._c_strides(shape, dt.itemsize)
            assert (a.shape, a.dtype, a.strides, a.nbytes) == (shape, dt, strides, ref.nbytes)
            assert (a.size, a.ndim) == (ref.size, ref.ndim)  # kept at construction, from the layout memo
            flat = a.reshape(ref.size)  # a view (_make without the memo's size and ndim)
            assert (flat.shape, flat.size, flat.ndim) == ((ref.size,), ref.size, 1)
            assert a.stream is s and a.device_index == 0 and a.ptr == (fake.next_ptr - 0x10000 if ref.nbytes else 0)
            b = cuda.empty(shape, dt, stream=s)  # the public path shares the memo after its checks
            assert (b.shape, b.dtype, b.strides, b.nbytes) == (a.shape, a.dtype, a.strides, a.nbytes)
            assert (b.size, b.ndim) == (ref.size, ref.ndim)
            del a, b, flat
    sized = [n for n, _ in fake.malloc]
    assert sized == [32 * 16 * 16 * 8 * 4] * 4 + [30] * 4 + [2] * 4  # zero-byte arrays allocate nothing
    assert sorted(p for p, _ in fake.free) == sorted(0x10000 * (i + 1) for i in range(len(fake.malloc)))
    # a spelling equal to a memoised shape: the internal path gets the canonical Python ints
    c = amod._empty_on((np.int64(3), np.int64(5)), bf16, s)
    assert c.shape == (3, 5) and all(type(d) is int for d in c.shape)


def test_public_empty_still_refuses_spellings_equal_to_memoised_ones(monkeypatch):
    _FakeRuntime(monkeypatch)
    s = _open_stream()
    cuda.empty((1, 2), np.float32, stream=s)
    cuda.empty(2, np.float32, stream=s)
    for bad, err in (((True, 2), TypeError), ((1.0, 2), TypeError), ((1, -2), ValueError), (True, TypeError),
                     ([1, 2.0], TypeError)):
        with pytest.raises(err, match="empty"):
            cuda.empty(bad, np.float32, stream=s)
    for _ in range(2):
        with pytest.raises(TypeError, match="empty: dtype complex64 is not supported"):
            cuda.empty((1, 2), np.complex64, stream=s)
    assert cuda.empty([1, 2], "float32", stream=s).shape == (1, 2)  # unhashable spelling: checked, not memoised


def test_layout_memo_is_bounded(monkeypatch):
    monkeypatch.setattr(amod, "_layouts", {})
    monkeypatch.setattr(amod, "_LAYOUTS_MAX", 4)
    f32 = np.dtype(np.float32)
    for n in range(1, 10):
        assert amod._layout((n, 3), f32) == ((n, 3), f32, (12, 4), 12 * n, 3 * n, 2)  # ..., nbytes, size, ndim
        assert len(amod._layouts) <= 4


def test_free_fast_path_defers_while_the_stream_captures(monkeypatch):
    fake = _FakeRuntime(monkeypatch)
    monkeypatch.setattr(mmod, "_deferred", [])
    s = _open_stream()
    a = amod._empty_on((4,), np.dtype(np.float32), s)
    ptr = a.ptr
    fake.status = mmod.rt.cudaStreamCaptureStatus.cudaStreamCaptureStatusActive  # someone else captures s
    del a
    assert fake.free == [] and [r.ptr for r in mmod._deferred] == [ptr]  # not freed into their graph
    fake.status = mmod.rt.cudaStreamCaptureStatus.cudaStreamCaptureStatusNone
    assert mmod.flush_deferred_frees() == 1 and fake.free == [(ptr, 0x5000)]
    closed = _open_stream(0x6000)
    b = amod._empty_on((4,), np.dtype(np.float32), closed)
    closed.close()  # its stream is gone: the slow path frees synchronously, never on the dead handle
    synced = []
    monkeypatch.setattr(mmod.rt, "cudaFree", lambda p: synced.append(int(p)))
    monkeypatch.setattr(mmod, "_DeviceGuard", lambda index: __import__("contextlib").nullcontext())
    bptr = b.ptr
    del b
    assert synced == [bptr] and fake.free == [(ptr, 0x5000)]


def test_stream_of_none_is_as_stream_none(monkeypatch):
    from dnnbind.cuda import device as dmod
    from dnnbind.cuda import stream as smod
    from dnnbind.kernels._cuda import _common as cm

    default, inner = _open_stream(0x7000), _open_stream(0x8000)
    monkeypatch.setattr(dmod, "_probe", (1, ""))
    monkeypatch.setattr(smod, "_defaults", {0: default})
    assert cm.stream_of(None) is smod.as_stream(None) is default
    with inner:
        assert cm.stream_of(None) is smod.as_stream(None) is inner
    assert cm.stream_of(inner) is inner and cm.stream_of(None) is default


def test_bias_backward_plan_memo_launches_as_computed(monkeypatch):
    from dnnbind._validate import BFLOAT16
    from dnnbind.kernels._cuda import _common as cm
    from dnnbind.kernels._cuda import colsum
    from dnnbind.kernels._cuda import conv as cconv

    launches: list = []
    ptrs = iter(range(0x900000, 0xA00000, 0x1000))
    monkeypatch.setattr(colsum, "_plans", {})
    monkeypatch.setattr(cm, "_kernels", {})
    monkeypatch.setattr(cm, "kernel", lambda f, name, device: _RecordingKernel(name, launches))
    monkeypatch.setattr(cm, "empty", lambda shape, dt, stream: cuda.DeviceArray(
        None, shape, dt, next(ptrs), device_index=0, stream=stream))
    s = _fake_stream()
    f32 = np.dtype(np.float32)
    cases = [
        # NHWC, 32 rows: one launch, 4-wide vectors (8 lanes)
        ((2, 4, 4, 32), f32, "NHWC", 0x10000, [("channel_sum_last_f32", (1, 1, 1), (32, 32, 8, 1, 1.0))]),
        # not 16-byte aligned: scalar loads, 32 lanes
        ((2, 4, 4, 32), f32, "NHWC", 0x10008, [("channel_sum_last_f32", (1, 1, 1), (32, 32, 32, 0, 1.0))]),
        # 1024 rows of bf16: 4 row blocks of float32 partial sums, then their sum
        ((4, 16, 16, 48), BFLOAT16, "NHWC", 0x20000, [("channel_sum_rows_bf16", (4, 1, 1), (1024, 48, 256, 8, 1)),
                                                      ("channel_sum_partials_bf16", (1, 1, 1), (4, 48, 16, 1, 1.0))]),
        # NCHW: one block per channel
        ((2, 8, 4, 4), f32, "NCHW", 0x30000, [("channel_sum_f32", (8, 1, 1), (2, 8, 16, 1.0))]),
    ]
    for shape, dt, layout, ptr, expected in cases:
        for _ in range(2):  # the second call runs from the memo
            del launches[:]
            dy = cuda.DeviceArray(None, shape, dt, ptr, device_index=0, stream=s)
            db = cconv.bias_backward(dy, layout=layout, stream=s)
            assert db.shape == (shape[-1] if layout == "NHWC" else shape[1],) and db.dtype == dt
            got = [(name, grid, args[2:] if name != "channel_sum_partials_bf16" else args[2:]) for name, grid, _, args
                   in launches]
            assert [(n, g, a) for n, g, a in got] == expected
            assert launches[0][3][0] == ptr and launches[-1][3][1] == db.ptr
    assert len(colsum._plans) == 4  # keyed by shape, layout, dtype, alignment and device


def test_optimizer_groups_fast_path_matches_the_general_grouping():
    from dnnbind._validate import BFLOAT16
    from dnnbind.kernels._cuda import optim

    f32 = np.float32
    p = [_fake_array((4, 3), f32, 0x1000), _fake_array((5,), f32, 0x2000)]
    g = [_fake_array((4, 3), f32, 0x3000), _fake_array((5,), f32, 0x4000)]
    m = [_fake_array((4, 3), f32, 0x5000), _fake_array((5,), f32, 0x6000)]
    one = optim._groups(p, g, [m, None])
    assert list(one) == [("f32", "f32")]
    ps, gs, sts = one[("f32", "f32")]
    assert ps == p and gs == g and sts == [m, None]
    g_mixed = [g[0], _fake_array((5,), BFLOAT16, 0x4000)]
    two = optim._groups(p, g_mixed, [m, None])
    assert list(two) == [("f32", "f32"), ("f32", "bf16")]
    assert two[("f32", "bf16")] == ([p[1]], [g_mixed[1]], [[m[1]], None])
    with pytest.raises(TypeError, match=r"params\[0\] has dtype int32"):
        optim._groups([_fake_array((2,), np.int32)], [g[0]], [None])


def test_kernel_launch_dims_memo_takes_unhashable_spellings(monkeypatch):
    k = kmod.Kernel(SAXPY, "saxpy", arch="sm_90")
    k._modules[0] = (None, "func", (4, 8, 8, 8, 4, 8))
    drv = kmod._driver()
    dims = []
    monkeypatch.setattr(drv, "cuLaunchKernel", lambda f, gx, gy, gz, bx, by, bz, *rest: dims.append(
        ((gx, gy, gz), (bx, by, bz))) or (drv.CUresult.CUDA_SUCCESS,))
    args = (np.float32(1), _fake_array(), None, np.int64(3), np.int32(1), np.float64(0))
    for grid, block in (([5, 2], [64]), ((5, 2), (64,)), ((5, 2), (64,))):
        k(grid, block, args, stream=_fake_stream())
    assert dims == [((5, 2, 1), (64, 1, 1))] * 3
    with pytest.raises(ValueError, match="1024 threads"):
        k([1], [32, 64], args, stream=_fake_stream())


def test_cast_many_table_offsets_vector_flags_and_keeping(monkeypatch):
    """The multi-tensor cast's pointer table (what elementwise.cu's cast_chunks reads), where it is
    kept (the caller's tables, or the prepared CastMany's own), and that a capture keeps nothing."""
    from dnnbind import kernels
    from dnnbind.kernels._cuda import elementwise as cew

    uploads = []

    class Table:  # what constant() would return: a device array of the uploaded table, on its stream
        device_index = 0

        def __init__(self, n, stream):
            self.n, self.stream = n, stream

    monkeypatch.setattr(amod, "constant", lambda host, stream=None: (uploads.append(host.copy()),
                                                                     Table(len(uploads), stream))[1])

    class FakeStream:
        device_index = _device = 0
        capturing = False

        def __init__(self, handle=0x77):
            self._handle = handle

        def is_capturing(self):
            return self.capturing

    s = FakeStream()
    xs = [_fake_array((3, 5), ptr=0x10000), _fake_array((3000,), ptr=0x20004), _fake_array((0,), ptr=0x30000)]
    entry = cew._cast_entry(xs, np.dtype(ml_dtypes.bfloat16), s, kernels.UpdateTables(), None)
    table, plan = entry
    assert table.n == 1 and plan.kernel == "cast_many_f32_bf16" and plan.chunk == 1024
    rows = uploads[0][:cew._CAST_COLS * 3].reshape(3, cew._CAST_COLS)
    # source, byte offset (256-byte steps), size, first chunk, vectorised (0x20004: off 16 bytes)
    assert rows.tolist() == [[0x10000, 0, 15, 0, 1], [0x20004, 256, 3000, 1, 0], [0x30000, 256 + 6144, 0, 4, 1]]
    assert uploads[0][cew._CAST_COLS * 3:].tolist() == [0, 0, 1, 0, 1, 1024, 1, 2048]  # (tensor, start)
    assert plan.nchunks == 4 and plan.nbytes == 256 + 6144
    assert [(v[0], v[3]) for v in plan.views] == [((3, 5), 0), ((3000,), 256), ((0,), 6400)]
    tables = kernels.UpdateTables()
    first = cew._cast_entry(xs, np.dtype(np.float16), s, tables, None)
    assert cew._cast_entry(xs, np.dtype(np.float16), s, tables, None) is first and len(uploads) == 2
    moved = [xs[0], _fake_array((3000,), ptr=0x20010), xs[2]]  # another address: another table
    assert cew._cast_entry(moved, np.dtype(np.float16), s, tables, None) is not first and len(tables) == 2

    class Owner:
        _entry = None

    owner = Owner()
    kept = cew._cast_entry(xs, np.dtype(np.float16), s, tables, owner)
    assert owner._entry is kept and cew._cast_entry(xs, np.dtype(np.float16), s, tables, owner) is kept
    # a table is read only on the stream it was uploaded (and will be freed) on
    other = FakeStream(0x88)
    assert cew._cast_entry(xs, np.dtype(np.float16), other, tables, None) is not first and len(tables) == 3
    elsewhere = cew._cast_entry(xs, np.dtype(np.float16), other, tables, owner)
    assert elsewhere is not kept and owner._entry is elsewhere and elsewhere[0].stream is other
    kept = cew._cast_entry(xs, np.dtype(np.float16), s, tables, owner)
    assert kept[0].stream is s and owner._entry is kept
    count = len(uploads)
    s.capturing = True  # a captured launch makes its own table and keeps none
    fresh = cew._cast_entry(xs, np.dtype(np.float16), s, tables, owner)
    assert fresh is not kept and owner._entry is kept and len(tables) == 3 and len(uploads) == count + 1


def test_prepared_update_checks_gradients_every_call_and_changes_nothing_on_bad_ones():
    from dnnbind import kernels

    p = [np.ones((2, 3), np.float32), np.ones(4, np.float32)]
    m, v = [np.zeros_like(a) for a in p], [np.zeros_like(a) for a in p]
    prepared = kernels.optim.PreparedUpdate("adam", p, m, v, beta1=0.9, beta2=0.999, epsilon=1e-7, weight_decay=0.0,
                                        amsgrad=False, vhat=None, tables=None)
    before = [a.copy() for a in p + m + v]
    for bad, words in (([np.ones((3, 2), np.float32), np.ones(4, np.float32)], r"grads\[0\] has shape \(3, 2\)"),
                       ([np.ones((2, 3), np.float32)], "grads has 1 entries but params has 2"),
                       ([np.ones((2, 3), np.int32), np.ones(4, np.float32)], "every gradient must be a float")):
        with pytest.raises((ValueError, TypeError), match=words):
            prepared(bad, lr=0.1, step=1)
    with pytest.raises(ValueError, match="step must be >= 1"):
        prepared([np.ones((2, 3), np.float32), np.ones(4, np.float32)], lr=0.1, step=0)
    assert all(np.array_equal(a, b) for a, b in zip(p + m + v, before))
    g = [np.full((2, 3), 0.5, np.float32), np.full(4, -0.25, np.float32)]
    prepared(g, lr=0.1, step=1)
    q, mq, vq = [np.ones((2, 3), np.float32), np.ones(4, np.float32)], [np.zeros_like(a) for a in p], \
        [np.zeros_like(a) for a in p]
    kernels.adam_update(q, g, mq, vq, lr=0.1, step=1)
    assert all(np.array_equal(a, b) for a, b in zip(p + m + v, q + mq + vq)) and not np.array_equal(p[0], before[0])
    assert prepared.matches(p, m, v, beta1=0.9, beta2=0.999, epsilon=1e-7, weight_decay=0.0, amsgrad=False,
                            vhat=None, tables=None)
    assert not prepared.matches(p, m, v, beta1=0.8, beta2=0.999, epsilon=1e-7, weight_decay=0.0, amsgrad=False,
                                vhat=None, tables=None)
    assert not prepared.matches(p, [m[0], m[1].copy()], v, beta1=0.9, beta2=0.999, epsilon=1e-7, weight_decay=0.0,
                                amsgrad=False, vhat=None, tables=None)
    with pytest.raises(ValueError, match=r"beta1 must be in \[0, 1\)"):
        kernels.optim.PreparedUpdate("adam", p, m, v, beta1=1.0, beta2=0.999, epsilon=1e-7, weight_decay=0.0,
                                 amsgrad=False, vhat=None, tables=None)


def test_optimizer_prepares_again_when_a_hyper_parameter_or_the_slots_change():
    import dnnbind

    opt = dnnbind.optimizers.SGD(0.1, momentum=0.9)
    p, g = [np.ones(3, np.float32)], [np.full(3, 0.5, np.float32)]
    opt._apply_raw(p, g)
    first = opt._prepared
    opt._apply_raw(p, g)
    assert opt._prepared is first
    opt.momentum = 0.5  # set by the user: checked and baked in again
    opt._apply_raw(p, g)
    assert opt._prepared is not first and opt._prepared._kw["momentum"] == 0.5
    second = opt._prepared
    opt.set_state(opt.get_state(), p)  # new slot arrays
    assert opt._prepared is None
    opt._apply_raw(p, g)
    assert opt._prepared is not second
