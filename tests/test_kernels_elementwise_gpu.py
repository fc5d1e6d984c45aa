"""CUDA elementwise ops, reductions, counts, casts, gathers and augmentation vs NumPy."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from dnnbind import kernels
from gpu_errlog import BF16, DTYPES, check, dev, dev_offset, host, poisoned, quantize
from testutil import random

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("label, dtype", DTYPES)
@pytest.mark.parametrize("op", ["add", "subtract", "multiply"])
def test_binary(rng, label, dtype, op):
    a, b = quantize(random(rng, (5, 77)), dtype), quantize(random(rng, (5, 77)), dtype)
    got = getattr(kernels, op)(dev(a, dtype), dev(b, dtype), out=poisoned(a.shape, dtype))
    check(op, label, got, getattr(kernels, op)(a, b), tol=1e-7 if label == "float32" else None)


@pytest.mark.parametrize("label, dtype", DTYPES)
def test_scale_and_axpy_with_host_and_device_alpha(rng, label, dtype):
    x, y = quantize(random(rng, (1000,)), dtype), quantize(random(rng, (1000,)), dtype)
    check("scale", label, kernels.scale(dev(x, dtype), 0.25), x * 0.25)
    alpha = dev(np.asarray(-1.5, dtype=np.float32))
    check("scale", label, kernels.scale(dev(x, dtype), alpha), x * -1.5, "device alpha")
    yd = dev(y, dtype)
    kernels.axpy(alpha, dev(x, dtype), yd)
    check("axpy", label, yd, y - 1.5 * x)


@pytest.mark.parametrize("label, dtype", DTYPES)
@pytest.mark.parametrize("axis", [None, 0, 1, 2, (0, 2), (1, 2), (0, 1, 2)])
@pytest.mark.parametrize("keepdims", [False, True])
@pytest.mark.parametrize("op", ["sum", "mean"])
def test_reductions(rng, label, dtype, axis, keepdims, op):
    x = quantize(random(rng, (4, 33, 5)), dtype)
    ref = getattr(kernels, op)(x, axis=axis, keepdims=keepdims)
    got = getattr(kernels, op)(dev(x, dtype), axis=axis, keepdims=keepdims)
    assert tuple(got.shape) == tuple(np.shape(ref))
    check(op, label, got, ref, f"axis={axis} keepdims={keepdims}", tol=1e-6 if label == "float32" else None)


@pytest.mark.parametrize("label, dtype", DTYPES)
def test_argmax_accuracy_top_k(rng, label, dtype):
    scores = quantize(random(rng, (300, 37)), dtype)
    labels = rng.integers(0, 37, size=300)
    labels[:50] = np.argmax(scores[:50], axis=1)  # make sure there are hits
    sd = dev(scores, dtype)
    for axis in (0, 1):
        assert np.array_equal(host(kernels.argmax(sd, axis=axis)), np.argmax(scores, axis=axis))
    for lab in (labels.astype(np.int32), labels.astype(np.int64), np.eye(37)[labels].astype(np.float32)):
        got = kernels.accuracy_count(sd, dev(lab))
        assert got.dtype == np.int64 and int(host(got)) == int(kernels.accuracy_count(scores, lab))
        for k in (1, 3, 10):
            assert int(host(kernels.top_k_count(sd, dev(lab), k))) == int(kernels.top_k_count(scores, lab, k))


NAMES = [np.float32, np.float64, np.float16, BF16, np.int32, np.int64, np.uint8, np.int8, np.bool_]


@pytest.mark.parametrize("src, dst", list(itertools.product(NAMES, NAMES)))
def test_cast_every_pair(rng, src, dst):
    x = rng.uniform(0, 100, size=(257,)).round(1)
    x[:3] = [0, 1, 100]
    xs = x.astype(src)
    got = kernels.cast(dev(xs), dst, out=poisoned(x.shape, np.dtype(dst)))
    assert np.array_equal(np.asarray(got.to_host()).astype(np.float64), xs.astype(dst).astype(np.float64))


@pytest.mark.parametrize("src, dst", [(np.float32, BF16), (BF16, np.float32), (np.float32, np.float16),
                                      (np.float64, np.float32), (np.uint8, np.float32), (np.float32, np.int64),
                                      (np.int8, np.bool_)])
@pytest.mark.parametrize("n, src_offset, out_offset", [(1 << 20, 0, 0), ((1 << 20) + 13, 0, 0), (1003, 1, 0),
                                                       (1003, 0, 3), (5, 0, 0)])
def test_cast_vector_path_tails_and_misaligned_arrays(rng, src, dst, n, src_offset, out_offset):
    """Vectorised casts (16-byte accesses, then the n % VW tail) and the scalar path taken when
    either array starts off a vector boundary (an item past it)."""
    x = rng.uniform(0, 100, size=(n,)).round(1)
    x[:3] = [0, 1, 100]
    xs = x.astype(src)
    out = dev_offset(np.full(n, 255.0).astype(dst), out_offset)  # outside the data's range: unwritten shows
    got = kernels.cast(dev_offset(xs, src_offset), dst, out=out)
    assert got.ptr == out.ptr
    assert np.array_equal(np.asarray(got.to_host()).astype(np.float64), xs.astype(dst).astype(np.float64))


@pytest.mark.parametrize("dtype", NAMES)
def test_fill_zeros_copy(dtype):
    x = poisoned((11, 3), np.dtype(dtype))
    kernels.fill(x, 7)
    assert np.all(np.asarray(x.to_host()).astype(np.float64) == float(np.asarray(7).astype(dtype)))
    assert np.all(np.asarray(kernels.zeros_like(x).to_host()).astype(np.float64) == 0)
    c = kernels.copy(x, out=poisoned((11, 3), np.dtype(dtype)))
    assert np.array_equal(c.to_host(), x.to_host())


@pytest.mark.parametrize("shape, dtype", [((50, 3, 4), np.float32), ((50,), np.float16), ((50, 3), np.uint8)])
@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
def test_take_rows(rng, shape, dtype, index_dtype):
    x = (rng.uniform(0, 50, size=shape)).astype(dtype)
    idx = rng.integers(-50, 50, size=17).astype(index_dtype)
    ref = np.take(x, idx, axis=0)
    assert np.array_equal(kernels.take(dev(x), dev(idx)).to_host(), ref)
    assert np.array_equal(kernels.take(dev(x), idx).to_host(), ref)  # host indices


def test_all_finite(rng):
    arrays = [random(rng, (100,)).astype(np.float32), random(rng, (7, 3)).astype(np.float16),
              np.arange(5, dtype=np.int32)]
    devs = [dev(a) for a in arrays]
    assert int(host(kernels.all_finite(devs))) == 1
    for bad, dtype in ((np.inf, np.float32), (np.nan, np.float16), (-np.inf, BF16)):
        a = random(rng, (64,)).astype(dtype)
        a[37] = bad
        assert int(host(kernels.all_finite(devs + [dev(a)]))) == 0


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("flip", [True, False])
def test_random_crop_flip_gives_a_valid_crop_per_sample(rng, layout, flip):
    n, c, h, w, p = 6, 3, 8, 7, 2
    x = random(rng, (n, c, h, w), low=0.5, high=1.5).astype(np.float32)
    xl = x if layout == "NCHW" else x.transpose(0, 2, 3, 1)
    got = host(kernels.random_crop_flip(dev(np.ascontiguousarray(xl)), padding=p, flip=flip, layout=layout, seed=5))
    got = got if layout == "NCHW" else got.transpose(0, 3, 1, 2)
    xp = np.pad(x, ((0, 0), (0, 0), (p, p), (p, p)))
    for i in range(n):
        candidates = [xp[i, :, oy:oy + h, ox:ox + w] for oy in range(2 * p + 1) for ox in range(2 * p + 1)]
        if flip:
            candidates += [cand[:, :, ::-1] for cand in candidates]
        assert any(np.array_equal(got[i], cand) for cand in candidates), f"sample {i} is no crop/flip of the input"
    again = host(kernels.random_crop_flip(dev(np.ascontiguousarray(xl)), padding=p, flip=flip, layout=layout, seed=5))
    assert np.array_equal(again if layout == "NCHW" else again.transpose(0, 3, 1, 2), got)  # same seed, same crops


FLOAT_NAMES = [np.float32, np.float64, np.float16, BF16]


def _poison_pool(nbytes):
    """Leave a freed block of 0xFF bytes in the stream's pool, where the next allocation of that size
    lands: outputs a cast_many launch leaves unwritten then read as NaN, not as stale zeros."""
    from dnnbind.cuda import empty

    empty((nbytes,), np.uint8).fill_bytes(0xFF)


@pytest.mark.parametrize("src, dst", list(itertools.product(FLOAT_NAMES, FLOAT_NAMES)))
def test_cast_many_every_float_pair_tails_chunks_and_misaligned_sources(rng, src, dst):
    """One launch for arrays that take the vector path, a tail, several chunks (2**17 + 5 items:
    chunks of 1024 and more) and the scalar path (a source one item off its vector boundary)."""
    sizes = [(257,), (3, 5), (1 << 17) + 5, (0,), (7, 1, 3), (1003,)]
    xs_host = []
    for shape in sizes:
        x = rng.uniform(-100, 100, size=shape).round(2)
        if x.size:
            x.flat[0] = 1.5
        xs_host.append(x.astype(src))
    xs = [dev(x) for x in xs_host[:-1]] + [dev_offset(xs_host[-1], 1)]
    tables = kernels.UpdateTables()
    _poison_pool(sum(-(-x.size * np.dtype(dst).itemsize // 256) * 256 for x in xs_host))
    got = kernels.cast_many(xs, dst, tables=tables)
    for g, x in zip(got, xs_host):
        # each output at a 256-byte boundary of the one allocation
        assert g.dtype == np.dtype(dst) and g.shape == x.shape and (g.ptr - got[0].ptr) % 256 == 0
        expected = kernels.cast(x, dst)  # the NumPy reference of the one-tensor cast
        assert np.array_equal(np.asarray(g.to_host()).view(np.uint8), expected.view(np.uint8))
    assert len(tables) == 1


def test_cast_many_reuses_its_table_and_reads_current_values(rng):
    xs_host = [rng.normal(size=(33,)).astype(np.float32), rng.normal(size=(4, 4)).astype(np.float32)]
    xs = [dev(x) for x in xs_host]
    tables = kernels.UpdateTables()
    kernels.cast_many(xs, BF16, tables=tables)
    xs[0].copy_from_host(xs_host[0] * 3)
    got = kernels.cast_many(xs, BF16, tables=tables)
    assert len(tables) == 1  # looked up by the same addresses and shapes
    assert np.array_equal(np.asarray(got[0].to_host()), (xs_host[0] * 3).astype(BF16))
    prepared = kernels.elementwise.CastMany(xs, np.float16)
    xs[1].copy_from_host(xs_host[1] + 1)
    got = prepared()
    assert prepared._entry is not None and len(tables) == 1  # the prepared one keeps its own
    assert np.array_equal(np.asarray(got[1].to_host()), (xs_host[1] + 1).astype(np.float16))


def test_cast_many_in_a_captured_graph_keeps_nothing_and_replays(rng):
    from dnnbind import cuda

    xs_host = [rng.normal(size=(300,)).astype(np.float32), rng.normal(size=(2, 9)).astype(np.float32)]
    xs = [dev(x) for x in xs_host]
    out = [cuda.empty(x.shape, BF16) for x in xs_host]
    tables = kernels.UpdateTables()
    prepared = kernels.elementwise.CastMany(xs, BF16)
    kernels.copy(kernels.cast_many(xs, BF16)[0], out=out[0])  # warm-up: kernels compiled and loaded before capturing
    stream = cuda.Stream()
    cuda.default_stream().synchronize()
    with cuda.capture(stream) as graph:
        copies = kernels.cast_many(xs, BF16, tables=tables, stream=stream) + prepared(stream=stream)
        for src, dst in zip(copies, out + out):
            kernels.copy(src, out=dst, stream=stream)
        del copies, src, dst  # nothing made in the capture may outlive it
    # the tables were made inside the capture and died in it: nothing kept, nothing outstanding
    assert len(tables) == 0 and prepared._entry is None and not graph.outstanding_allocations
    xs[0].copy_from_host(xs_host[0] - 2)
    xs[1].copy_from_host(xs_host[1] * 2)
    cuda.default_stream().synchronize()
    graph.launch(stream)
    stream.synchronize()
    assert np.array_equal(np.asarray(out[0].to_host()), (xs_host[0] - 2).astype(BF16))
    assert np.array_equal(np.asarray(out[1].to_host()), (xs_host[1] * 2).astype(BF16))
