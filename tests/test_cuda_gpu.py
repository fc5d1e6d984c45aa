"""dnnbind.cuda on a real GPU: memory, transfers, streams/events, OOM, interop, graphs, ownership."""

from __future__ import annotations

import gc

import ml_dtypes
import numpy as np
import pytest

from dnnbind import cuda
from dnnbind.cuda import kernel as kmod
from dnnbind.cuda._util import rt
from dnnbind.errors import DeviceOutOfMemoryError

pytestmark = pytest.mark.gpu

BF16 = np.dtype(ml_dtypes.bfloat16)
ALL_DTYPES = [np.float64, np.float32, np.float16, BF16, np.int8, np.uint8, np.int32, np.int64, np.bool_]

KERNELS = r"""
extern "C" __global__ void add_one(float* x, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] += 1.0f;
}
extern "C" __global__ void spin(long long cycles, float* out) {
    long long start = clock64();
    while (clock64() - start < cycles) { }
    if (threadIdx.x == 0 && blockIdx.x == 0) out[0] = 42.0f;
}
"""


def sample(rng, shape, dtype):
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return rng.random(shape) > 0.5
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return rng.integers(max(info.min, -100), min(info.max, 100), size=shape, endpoint=True).astype(dtype)
    return (rng.standard_normal(shape) * 3 + 1).astype(dtype)


def test_device_attributes():
    dev = cuda.Device(0)
    assert cuda.device_count() >= 1 and dev is cuda.get_device(0)
    assert dev.name and dev.compute_capability >= (5, 0) and dev.arch.startswith("sm_")
    assert dev.total_memory > 2**30 and 0 < dev.free_memory <= dev.total_memory
    assert dev.multiprocessor_count > 0
    with cuda.Device(0):
        assert cuda.current_device_index() == 0
    free, total = cuda.memory_info()
    assert total == dev.total_memory and 0 < free <= total


def test_alloc_and_free():
    a = cuda.alloc(1 << 20)
    assert a.ptr != 0 and a.nbytes == 1 << 20 and not a.captured
    a.close()
    a.close()  # idempotent
    z = cuda.alloc(0)
    assert z.ptr == 0 and z.nbytes == 0
    e = cuda.empty((0, 5), np.float32)
    assert e.ptr == 0 and e.to_host().shape == (0, 5)


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=lambda d: np.dtype(d).name)
def test_round_trip_every_dtype(rng, dtype):
    host = sample(rng, (7, 13), dtype)
    dev = cuda.to_device(host)
    assert dev.dtype == np.dtype(dtype) and dev.shape == host.shape and dev.strides == host.strides
    out = dev.to_host()
    assert out.dtype == host.dtype
    np.testing.assert_array_equal(out.view(np.uint8), host.view(np.uint8))  # bitwise


@pytest.mark.parametrize("dtype", [np.float32, BF16, np.int64], ids=lambda d: np.dtype(d).name)
def test_round_trip_non_contiguous_inputs(rng, dtype):
    base = sample(rng, (9, 8, 6), dtype)
    for view in (base[::2], base.transpose(2, 0, 1), base[:, ::-1, 1:5], np.asfortranarray(base)):
        assert not view.flags.c_contiguous or view is base
        dev = cuda.to_device(view)
        assert dev.is_contiguous and dev.shape == view.shape
        np.testing.assert_array_equal(dev.to_host().view(np.uint8), np.ascontiguousarray(view).view(np.uint8))


def test_copy_from_host_is_async_but_safe(rng):
    host = rng.standard_normal((256, 1024)).astype(np.float32)
    expected = host.copy()
    dev = cuda.empty(host.shape, np.float32).fill_bytes(0xFF)
    dev.copy_from_host(host)
    host[:] = -1.0  # the staging buffer was filled before copy_from_host returned
    np.testing.assert_array_equal(dev.to_host(), expected)


def test_views_share_memory(rng):
    host = rng.standard_normal((6, 4)).astype(np.float32)
    dev = cuda.to_device(host)
    np.testing.assert_array_equal(dev[2:5].to_host(), host[2:5])
    np.testing.assert_array_equal(dev[-1].to_host(), host[-1])
    np.testing.assert_array_equal(dev.reshape(3, 8).to_host(), host.reshape(3, 8))
    np.testing.assert_array_equal(dev.view(np.int32).to_host(), host.view(np.int32))
    dev[1:3].fill_bytes(0xFF)
    got = dev.to_host()
    assert np.isnan(got[1:3]).all() and np.array_equal(got[[0, 3, 4, 5]], host[[0, 3, 4, 5]])
    out = np.empty((6, 4), np.float32)
    assert dev.to_host(out=out) is out


def test_memory_survives_the_last_view_only(rng):
    host = rng.standard_normal(1000).astype(np.float32)
    dev = cuda.to_device(host)
    tail = dev[500:]
    del dev
    gc.collect()
    np.testing.assert_array_equal(tail.to_host(), host[500:])


def test_zeros_fill_and_to():
    z = cuda.zeros((3, 5), np.float16)
    assert not z.to_host().any()
    p = cuda.empty((3,), np.float32).fill_bytes(0xFF)
    assert np.isnan(p.to_host()).all()
    assert z.to("cuda:0") is z and z.to("cuda") is z
    np.testing.assert_array_equal(z.to("cpu"), np.zeros((3, 5), np.float16))
    with pytest.raises(TypeError, match="to_host"):
        np.asarray(z)


def test_default_and_current_stream():
    s0 = cuda.default_stream()
    assert s0 is cuda.default_stream(0) and s0.handle not in (0, 1, 2)
    assert cuda.current_stream() is s0
    s = cuda.Stream()
    with s:
        assert cuda.current_stream() is s
        x = cuda.empty(4, np.float32)
        assert x.stream is s
    assert cuda.current_stream() is s0
    borrowed = cuda.Stream.from_handle(s.handle)
    borrowed.close()  # forgets, never destroys
    s.synchronize()
    s.close()
    s.close()


def test_stream_event_ordering_and_timing():
    k = cuda.Kernel(KERNELS, "spin")
    producer, consumer = cuda.Stream(), cuda.Stream()
    out = cuda.zeros(1, np.float32, stream=producer)
    start, end = cuda.Event(), cuda.Event()
    start.record(producer)
    k(1, 1, (np.int64(50_000_000), out), stream=producer)  # ~25 ms on a 2 GHz clock
    end.record(producer)
    consumer.wait_event(end)
    copy = cuda.empty(1, np.float32, stream=consumer)
    copy.copy_from(out, stream=consumer)  # must see the kernel's write thanks to the event
    assert copy.to_host(stream=consumer)[0] == 42.0
    assert end.query() and producer.query()
    ms = start.elapsed_time(end)
    assert 1.0 < ms < 10_000.0


def test_out_of_memory_is_a_memory_error_and_the_pool_recovers(rng):
    with pytest.raises(DeviceOutOfMemoryError) as info:
        cuda.empty((2**50,), np.uint8)  # 1 PiB
    err = info.value
    assert isinstance(err, MemoryError)
    assert err.requested == 2**50 and err.total == cuda.Device(0).total_memory
    assert "1,125,899,906,842,624 bytes" in str(err) and "empty_cache" in str(err)
    host = rng.standard_normal(1000).astype(np.float32)
    np.testing.assert_array_equal(cuda.to_device(host).to_host(), host)


def test_ten_thousand_alloc_free_cycles_do_not_grow_the_pool():
    s = cuda.default_stream()
    for _ in range(10):
        cuda.alloc(1 << 20, s).close()
    s.synchronize()
    before = cuda.pool_stats()
    for i in range(10_000):
        cuda.alloc((1 << 20) + (i % 7) * 256, s).close()
    s.synchronize()
    after = cuda.pool_stats()
    assert after["used"] == before["used"]
    assert after["reserved"] <= before["reserved"] + (4 << 20)


def test_empty_cache_returns_memory():
    x = cuda.empty((64 << 20,), np.uint8)
    del x
    cuda.empty_cache()
    assert cuda.pool_stats()["reserved"] <= cuda.pool_stats()["used"] + (32 << 20)


def test_graph_capture_and_replay(rng):
    k = cuda.Kernel(KERNELS, "add_one")
    s = cuda.Stream()
    host = rng.standard_normal(1000).astype(np.float32)
    x = cuda.to_device(host, stream=s)
    s.synchronize()
    with cuda.capture(s) as graph:
        k(4, 256, (x, np.int32(1000)))  # current stream inside capture is s
    np.testing.assert_array_equal(x.to_host(stream=s), host)  # capture does not execute
    for _ in range(3):
        graph.launch(s)
    np.testing.assert_allclose(x.to_host(stream=s), host + 3, rtol=1e-6)
    graph.close()


def test_allocation_dropped_during_capture_is_freed_after_it():
    s = cuda.Stream()
    base = cuda.pool_stats()["used"]
    victim = cuda.empty((1 << 20,), np.uint8, stream=s)
    k = cuda.Kernel(KERNELS, "add_one")
    y = cuda.zeros(16, np.float32, stream=s)
    with cuda.capture(s) as graph:
        del victim  # made outside: the free must not be captured
        gc.collect()
        tmp = cuda.empty(16, np.float32)  # made inside: the graph owns it
        assert tmp.base.captured
        k(1, 16, (y, np.int32(16)))
    s.synchronize()
    assert cuda.pool_stats()["used"] < base + (1 << 20)  # the victim went back after the capture
    graph.launch(s)
    graph.launch(s)
    np.testing.assert_array_equal(y.to_host(stream=s), np.full(16, 2, np.float32))
    del tmp
    graph.close()


def test_torch_interop_both_ways(rng):
    torch = pytest.importorskip("torch")
    t = torch.arange(12, dtype=torch.float32, device="cuda").reshape(3, 4) + 1
    # torch exports float32 through __cuda_array_interface__ without a "stream" entry, which leaves the
    # synchronisation to the user: its kernels must be done before another stream reads t (under
    # compute-sanitizer, which slows them down, the read otherwise saw zeros)
    torch.cuda.synchronize()
    d = cuda.from_dlpack(t)
    assert d.ptr == t.data_ptr() and d.shape == (3, 4)
    np.testing.assert_array_equal(d.to_host(), t.cpu().numpy())
    d[0].fill_bytes(0)  # zero-copy: torch sees the write
    torch.cuda.synchronize()
    assert t[0].abs().sum().item() == 0 and t[1].sum().item() != 0

    b = torch.randn(5, 3, device="cuda").to(torch.bfloat16)  # no CAI for bf16: DLPack path
    db = cuda.from_dlpack(b)
    assert db.dtype == BF16
    np.testing.assert_array_equal(db.to_host().view(np.uint16), b.view(torch.int16).cpu().numpy().view(np.uint16))

    host = rng.standard_normal((4, 6)).astype(np.float32)
    x = cuda.to_device(host)
    tx = torch.from_dlpack(x)
    assert tx.data_ptr() == x.ptr and tx.is_cuda
    np.testing.assert_array_equal(tx.cpu().numpy(), host)
    tc = torch.as_tensor(x, device="cuda")  # __cuda_array_interface__
    assert tc.data_ptr() == x.ptr
    xb = cuda.to_device(host.astype(BF16))
    assert torch.from_dlpack(xb).dtype == torch.bfloat16
    tt = torch.randn(4, 6, device="cuda").t()  # non-contiguous producer
    dt = cuda.from_dlpack(tt)
    assert not dt.is_contiguous and dt.strides == (4, 24)


def test_cupy_interop_both_ways(rng):
    cp = pytest.importorskip("cupy")
    a = cp.arange(10, dtype=cp.int32) + 3
    d = cuda.from_dlpack(a)
    assert d.ptr == a.data.ptr
    np.testing.assert_array_equal(d.to_host(), cp.asnumpy(a))
    host = rng.standard_normal(7).astype(np.float64)
    x = cuda.to_device(host)
    c1 = cp.asarray(x)  # __cuda_array_interface__
    c2 = cp.from_dlpack(x)
    assert c1.data.ptr == x.ptr == c2.data.ptr
    np.testing.assert_array_equal(cp.asnumpy(c2), host)
    d2 = cuda.from_cuda_array_interface(c1)
    np.testing.assert_array_equal(d2.to_host(), host)


@pytest.mark.gpu
def test_constant_uploaded_during_capture_is_replayed(rng):
    s = cuda.Stream()
    host = rng.standard_normal(1000).astype(np.float32)
    out = cuda.empty(host.shape, np.float32, stream=s)
    s.synchronize()
    with cuda.capture(s) as graph:
        c = cuda.constant(host, stream=s)  # no cudaHostAlloc possible here: the graph's arena serves it
        out.copy_from(c, stream=s)
    del c
    for _ in range(2):
        out.fill_bytes(0xFF, stream=s)
        graph.launch(s)
        np.testing.assert_array_equal(out.to_host(s), host)


def test_backend_asarray_moves_but_never_casts_a_device_array():
    from dnnbind import backend

    host = np.arange(1, 7, dtype=np.float32).reshape(2, 3)
    x = cuda.to_device(host)
    assert backend.asarray(x, "cuda:0") is x
    assert backend.asarray(x, "cuda:0", dtype="float32") is x  # same dtype: nothing to do
    with pytest.raises(TypeError, match=r"dtype float32.*dnnbind\.ops\.cast"):
        backend.asarray(x, "cuda:0", dtype="float16")
    y = backend.asarray(host, "cuda:0", dtype="float16")  # host data converts before the copy
    assert y.dtype == np.float16 and np.array_equal(y.to_host(), host.astype(np.float16))
    dev = cuda.CudaDevice(0)
    assert dev is cuda.Device(0) and x.device is dev and str(dev) == "cuda:0"


# ------------------------------------------------------------------------------- ownership
# Every owned C pointer is a dnnbind._lib.OwnedPointer. The destroy functions are wrapped to record
# the pointers they were given (and then really called), so the tests count destroys, per pointer.

def _record_calls(monkeypatch, owner, name, arg=0):
    real = getattr(owner, name)
    calls = []

    def recording(*args):
        calls.append(int(args[arg]))
        return real(*args)

    monkeypatch.setattr(owner, name, recording)
    return calls


@pytest.fixture
def destroys(monkeypatch):
    gc.collect()  # owners left by earlier tests die now, before the recording starts
    return {
        "stream": _record_calls(monkeypatch, rt, "cudaStreamDestroy"),
        "event": _record_calls(monkeypatch, rt, "cudaEventDestroy"),
        "graph": _record_calls(monkeypatch, rt, "cudaGraphDestroy"),
        "exec": _record_calls(monkeypatch, rt, "cudaGraphExecDestroy"),
        "module": _record_calls(monkeypatch, kmod, "_unload_module", arg=1),
    }


def test_stream_and_event_close_once_and_are_destroyed_when_collected(destroys):
    s, e = cuda.Stream(), cuda.Event()
    h, eh = s.handle, e.handle
    s.close()
    s.close()
    e.close()
    e.close()
    assert destroys["stream"] == [h] and destroys["event"] == [eh]
    assert s.closed and e.closed
    with pytest.raises(ValueError, match="closed"):
        s.handle
    s2, e2 = cuda.Stream(), cuda.Event()
    h2, eh2 = s2.handle, e2.handle
    del s2, e2  # no cycle: reference counting destroys them
    assert destroys["stream"] == [h, h2] and destroys["event"] == [eh, eh2]


def test_borrowed_stream_is_never_destroyed(destroys, rng):
    owner = cuda.Stream()
    borrowed = cuda.Stream.from_handle(owner.handle)
    assert not borrowed.owned and borrowed.device_index == owner.device_index
    borrowed.close()
    del borrowed
    collected = cuda.as_stream(owner.handle)  # a raw handle is wrapped as a borrowed Stream
    assert collected is not owner and collected == owner and not collected.owned
    del collected
    assert destroys["stream"] == []
    host = rng.standard_normal(256).astype(np.float32)
    x = cuda.to_device(host, stream=owner)  # the owner's stream still works
    np.testing.assert_array_equal(x.to_host(stream=owner), host)
    del x
    h = owner.handle
    owner.close()
    assert destroys["stream"] == [h]


def test_graph_close_once_and_collection_destroy_graph_and_executable(destroys):
    k = cuda.Kernel(KERNELS, "add_one")
    s = cuda.Stream()
    x = cuda.zeros(64, np.float32, stream=s)
    s.synchronize()
    with cuda.capture(s) as g:
        k(1, 64, (x, np.int32(64)))
    g.launch(s)
    graph, graph_exec = g._graph.handle, g._exec.handle
    s.synchronize()
    g.close()
    g.close()
    assert destroys["graph"] == [graph] and destroys["exec"] == [graph_exec] and not g.captured
    with pytest.raises(RuntimeError, match="closed"):
        g.launch(s)
    with cuda.capture(s) as g2:
        k(1, 64, (x, np.int32(64)))
    g2.launch(s)
    graph2, exec2 = g2._graph.handle, g2._exec.handle
    s.synchronize()
    del g2
    assert destroys["graph"] == [graph, graph2] and destroys["exec"] == [graph_exec, exec2]
    np.testing.assert_array_equal(x.to_host(stream=s), np.full(64, 2, np.float32))  # two replays


def test_kernel_close_once_and_collection_unload_its_module(destroys):
    s = cuda.Stream()
    x = cuda.zeros(16, np.float32, stream=s)
    k = cuda.Kernel(KERNELS, "add_one")
    k(1, 16, (x, np.int32(16)), stream=s)
    module = k._modules[s.device_index][0].handle
    s.synchronize()
    k.close()
    k.close()
    assert destroys["module"] == [module] and not k._modules
    k(1, 16, (x, np.int32(16)), stream=s)  # a launch after close() loads the module again
    module2 = k._modules[s.device_index][0].handle
    s.synchronize()
    del k
    assert destroys["module"] == [module, module2]
    np.testing.assert_array_equal(x.to_host(stream=s), np.full(16, 2, np.float32))


def test_destroys_requested_during_a_capture_wait_for_its_end(destroys):
    s = cuda.Stream()
    y = cuda.zeros(16, np.float32, stream=s)
    k, spare = cuda.Kernel(KERNELS, "add_one"), cuda.Kernel(KERNELS, "add_one")
    k(1, 16, (y, np.int32(16)), stream=s)
    spare(1, 16, (y, np.int32(16)), stream=s)
    dropped, closed, event = cuda.Stream(), cuda.Stream(), cuda.Event()
    expected = {"stream": [dropped.handle, closed.handle], "event": [event.handle],
                "module": [spare._modules[s.device_index][0].handle]}
    s.synchronize()
    with cuda.capture(s) as g:
        del dropped, event, spare  # collected inside the capture
        closed.close()
        assert closed.closed
        k(1, 16, (y, np.int32(16)))
        assert all(destroys[kind] == [] for kind in expected)  # nothing destroyed yet
    for kind, pointers in expected.items():
        assert sorted(destroys[kind]) == sorted(pointers), kind
    g.launch(s)  # the capture was not invalidated
    np.testing.assert_array_equal(y.to_host(stream=s), np.full(16, 3, np.float32))
    g.close()
