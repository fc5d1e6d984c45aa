"""CUDA layer normalization and spatial dropout vs the NumPy reference: per dtype with NaN-poisoned
outputs, bitwise determinism, and capture into a CUDA graph (nothing allocated in the capture
outlives it; replays recompute from the current inputs / draw fresh masks)."""

from __future__ import annotations

import numpy as np
import pytest

from dnnbind import cuda, kernels
from gpu_errlog import BF16, DTYPES, check, dev, host, poisoned, quantize
from testutil import random

pytestmark = pytest.mark.gpu

LN_DTYPES = DTYPES + [pytest.param("float64", np.dtype(np.float64), id="fp64")]
# (shape, norm_ndim): short and long rows (one block strides over > 256 columns), rows past one
# parameter-gradient block (>= 64 rows per block, so 700 rows make 11 partial rows).
LN_CASES = [((6, 37), 1), ((4, 5, 300), 1), ((2, 3, 4, 8), 3), ((3, 1030), 1), ((700, 24), 1), ((9, 2, 40), 2)]


def _pdt(dtype):
    return np.dtype(np.float64) if dtype == np.float64 else np.dtype(np.float32)


@pytest.mark.parametrize("label, dtype", LN_DTYPES)
@pytest.mark.parametrize("shape, k", LN_CASES)
@pytest.mark.parametrize("affine", [True, False])
def test_layernorm_matches_numpy(rng, label, dtype, shape, k, affine):
    pshape = shape[len(shape) - k:]
    stats_shape = shape[:len(shape) - k]
    pdt = _pdt(dtype)
    x = quantize(random(rng, shape, low=-2, high=3), dtype)
    dy = quantize(random(rng, shape), dtype)
    gamma = random(rng, pshape, low=0.5, high=1.5).astype(pdt) if affine else None
    beta = random(rng, pshape).astype(pdt) if affine else None
    g64 = None if gamma is None else gamma.astype(np.float64)
    b64 = None if beta is None else beta.astype(np.float64)
    y_ref, mean_ref, inv_ref = kernels.layernorm_forward(x, g64, b64, epsilon=1e-3, norm_ndim=k)
    dx_ref, dg_ref, db_ref = kernels.layernorm_backward(dy, x, g64, mean_ref, inv_ref, norm_ndim=k)
    gd = None if gamma is None else dev(gamma)
    bd = None if beta is None else dev(beta)
    xd, dyd = dev(x, dtype), dev(dy, dtype)
    y, mean, inv = kernels.layernorm_forward(xd, gd, bd, epsilon=1e-3, norm_ndim=k, out=poisoned(shape, dtype))
    assert mean.dtype == pdt and tuple(mean.shape) == stats_shape and tuple(inv.shape) == stats_shape
    case = f"x{shape} k={k} affine={affine}"
    check("layernorm_forward", label, y, y_ref, case)
    check("layernorm_forward.mean", label, mean, mean_ref, case)
    check("layernorm_forward.inv_std", label, inv, inv_ref, case)
    dx, dg, db = kernels.layernorm_backward(dyd, xd, gd, mean, inv, norm_ndim=k, out=poisoned(shape, dtype),
                                        dgamma_out=poisoned(pshape, pdt), dbeta_out=poisoned(pshape, pdt))
    check("layernorm_backward.dx", label, dx, dx_ref, case)
    check("layernorm_backward.dgamma", label, dg, dg_ref, case)
    check("layernorm_backward.dbeta", label, db, db_ref, case)
    dx2, dg2, db2 = kernels.layernorm_backward(dyd, xd, gd, mean, inv, norm_ndim=k, param_grads=False,
                                           out=poisoned(shape, dtype))
    assert dg2 is None and db2 is None and np.array_equal(host(dx2), host(dx))


def test_layernorm_is_deterministic(rng):
    x = random(rng, (5000, 64)).astype(np.float32)
    dy = random(rng, (5000, 64)).astype(np.float32)
    gamma = random(rng, (64,), low=0.5, high=1.5).astype(np.float32)
    xd, dyd, gd = dev(x), dev(dy), dev(gamma)
    runs = []
    for _ in range(2):
        y, mean, inv = kernels.layernorm_forward(xd, gd, None)
        runs.append([host(a) for a in (y, mean, inv, *kernels.layernorm_backward(dyd, xd, gd, mean, inv))])
    for a, b in zip(*runs):
        assert np.array_equal(a, b)


def test_layernorm_captured_in_a_graph_replays_with_new_inputs(rng):
    shape, pshape = (64, 96), (96,)
    x0, x1 = random(rng, shape).astype(np.float32), random(rng, shape, low=-3, high=1).astype(np.float32)
    dy = random(rng, shape).astype(np.float32)
    gamma = random(rng, pshape, low=0.5, high=1.5).astype(np.float32)
    beta = random(rng, pshape).astype(np.float32)
    stream = cuda.Stream()
    put = lambda a: cuda.to_device(a, stream=stream)  # noqa: E731
    xd, dyd, gd, bd = put(x0), put(dy), put(gamma), put(beta)
    y, dx = cuda.empty(shape, np.float32, stream=stream), cuda.empty(shape, np.float32, stream=stream)
    dg, db = cuda.empty(pshape, np.float32, stream=stream), cuda.empty(pshape, np.float32, stream=stream)

    def step():
        _, mean, inv = kernels.layernorm_forward(xd, gd, bd, out=y, stream=stream)
        kernels.layernorm_backward(dyd, xd, gd, mean, inv, out=dx, dgamma_out=dg, dbeta_out=db, stream=stream)

    step()  # warm-up: kernels compiled and loaded outside the capture
    stream.synchronize()
    with cuda.capture(stream) as graph:
        step()
    assert list(graph.outstanding_allocations) == []
    for x in (x0, x1):
        xd.copy_from_host(x, stream=stream)
        for out in (y, dx, dg, db):
            out.fill_bytes(0xFF, stream=stream)
        graph.launch(stream)
        stream.synchronize()
        x64, g64, b64 = x.astype(np.float64), gamma.astype(np.float64), beta.astype(np.float64)
        y_ref, mean_ref, inv_ref = kernels.layernorm_forward(x64, g64, b64)
        dx_ref, dg_ref, db_ref = kernels.layernorm_backward(dy.astype(np.float64), x64, g64, mean_ref, inv_ref)
        for name, got, ref in (("y", y, y_ref), ("dx", dx, dx_ref), ("dgamma", dg, dg_ref), ("dbeta", db, db_ref)):
            check(f"graph_capture.layernorm.{name}", "float32", got, ref)
    graph.close()


# ------------------------------------------------------------------------------ spatial dropout

@pytest.mark.parametrize("label, dtype", LN_DTYPES)
@pytest.mark.parametrize("layout", ["NHWC", "NCHW"])
def test_spatial_dropout_masks_whole_channels(rng, label, dtype, layout):
    shape = (32, 5, 6, 64) if layout == "NHWC" else (32, 64, 5, 6)
    x = random(rng, shape, low=0.5, high=1.5).astype(dtype)
    state = kernels.DropoutState(0.3, seed=5)
    y, reserve = kernels.spatial_dropout_forward(dev(x), state, layout=layout, out=poisoned(shape, dtype))
    assert tuple(reserve.shape) == (32, 64) and reserve.dtype == _pdt(dtype)
    mask = host(reserve)
    assert set(np.unique(mask)) <= {0.0, float(np.asarray(1 / 0.7, _pdt(dtype)))}
    assert abs(np.mean(mask == 0) - 0.3) < 0.06  # 2048 draws
    full = mask[:, :, None, None] if layout == "NCHW" else mask[:, None, None, :]
    ref = x.astype(np.float64) * full
    check("spatial_dropout_forward", label, y, ref)
    dy = random(rng, shape).astype(dtype)
    dx = kernels.spatial_dropout_backward(dev(dy), reserve, layout=layout, out=poisoned(shape, dtype))
    check("spatial_dropout_backward", label, dx, dy.astype(np.float64) * full)
    _, reserve2 = kernels.spatial_dropout_forward(dev(x), state, layout=layout)
    assert not np.array_equal(host(reserve2), mask), "the second forward reused the mask"
    # the same seed draws the same masks from a fresh state
    _, again = kernels.spatial_dropout_forward(dev(x), kernels.DropoutState(0.3, seed=5), layout=layout)
    assert np.array_equal(host(again), mask)


def test_spatial_dropout_rate_zero_copies(rng):
    x = random(rng, (2, 3, 3, 4)).astype(np.float32)
    y, reserve = kernels.spatial_dropout_forward(dev(x), kernels.DropoutState(0.0, seed=1), out=poisoned(x.shape, np.float32))
    assert reserve is None and np.array_equal(host(y), x.astype(np.float64))
    dx = kernels.spatial_dropout_backward(dev(x), None, out=poisoned(x.shape, np.float32))
    assert np.array_equal(host(dx), x.astype(np.float64))


def test_spatial_dropout_in_a_graph_draws_fresh_masks(rng):
    x = random(rng, (16, 4, 4, 32), low=0.5, high=1.5).astype(np.float32)
    stream = cuda.Stream()
    xd = cuda.to_device(x, stream=stream)
    y = cuda.empty(x.shape, np.float32, stream=stream)
    dx = cuda.empty(x.shape, np.float32, stream=stream)
    state = kernels.DropoutState(0.5, seed=11)

    def step():
        _, reserve = kernels.spatial_dropout_forward(xd, state, out=y, stream=stream)
        kernels.spatial_dropout_backward(xd, reserve, out=dx, stream=stream)

    step()  # warm-up: the draw counter and the kernels are made outside the capture
    stream.synchronize()
    with cuda.capture(stream) as graph:
        step()
    assert list(graph.outstanding_allocations) == []
    masks = []
    for _ in range(3):
        graph.launch(stream)
        stream.synchronize()
        ratio = host(y) / x
        assert np.allclose(ratio, ratio[:, :1, :1, :]) and np.array_equal(host(dx), host(y))
        masks.append(ratio[:, 0, 0, :] != 0)
    assert abs(masks[0].mean() - 0.5) < 0.1
    assert not np.array_equal(masks[0], masks[1]) and not np.array_equal(masks[1], masks[2])
    graph.close()

