"""NumPy references of the merge, reshaping and preprocessing ops: forward against direct loops or
known values, backward against finite differences (float64), argument checks."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

from dnnbind import kernels
from testutil import numerical_grad, random, rel_error

FD_TOL = 1e-7
BF16 = np.dtype(ml_dtypes.bfloat16)


def fd_check(forward, backward, x, rng, tol=FD_TOL):
    """d(sum(forward() * w))/dx by finite differences against backward(w)."""
    w = random(rng, np.shape(forward()))
    numeric = numerical_grad(lambda: float(np.sum(forward() * w)), x)
    err = rel_error(backward(w), numeric)
    assert err < tol, f"backward vs finite differences: relative error {err:.2e}"


# ------------------------------------------------------------------------------------ merging

@pytest.mark.parametrize("op, ufunc", [(kernels.maximum, np.maximum), (kernels.minimum, np.minimum)])
def test_extremum_forward_and_nan(rng, op, ufunc):
    a, b = random(rng, (3, 4)), random(rng, (3, 4))
    a[0, 0] = np.nan
    b[1, 1] = np.nan
    y = op(a, b)
    assert np.array_equal(y, ufunc(a, b), equal_nan=True)
    assert np.isnan(y[0, 0]) and np.isnan(y[1, 1])


@pytest.mark.parametrize("op", [kernels.maximum, kernels.minimum])
def test_extremum_backward_matches_finite_differences(rng, op):
    xs = [random(rng, (2, 3, 5)) for _ in range(3)]

    def forward():
        y = op(xs[0], xs[1])
        return op(y, xs[2])

    for i in range(3):
        fd_check(forward, lambda w, i=i: kernels.extremum_backward(w, xs, forward())[i], xs[i], rng)


def test_extremum_backward_gives_ties_to_the_first_input():
    a = np.array([1.0, 2.0, 3.0, 5.0])
    b = np.array([1.0, 4.0, 3.0, 0.0])
    c = np.array([1.0, 4.0, 2.0, 5.0])
    y = kernels.maximum(kernels.maximum(a, b), c)
    dy = np.array([10.0, 20.0, 30.0, 40.0])
    da, db, dc = kernels.extremum_backward(dy, [a, b, c], y)
    np.testing.assert_array_equal(da, [10, 0, 30, 40])
    np.testing.assert_array_equal(db, [0, 20, 0, 0])
    np.testing.assert_array_equal(dc, [0, 0, 0, 0])
    assert np.array_equal(da + db + dc, dy)  # every element's gradient goes somewhere, once


@pytest.mark.parametrize("axis", [0, 1, 2, -1])
def test_concatenate_and_its_backward(rng, axis):
    shapes = [(2, 3, 4), (2, 3, 4)]
    sizes = [1, 3, 2]
    parts = []
    for s in sizes:
        shape = list(shapes[0])
        shape[axis] = s
        parts.append(random(rng, tuple(shape)))
    y = kernels.concatenate(parts, axis=axis)
    np.testing.assert_array_equal(y, np.concatenate(parts, axis=axis))
    pieces = kernels.concatenate_backward(y, sizes, axis=axis)
    for p, q in zip(pieces, parts):
        assert p.flags.c_contiguous
        np.testing.assert_array_equal(p, q)


def test_merging_ops_refuse_bad_input(rng):
    a = random(rng, (2, 3))
    with pytest.raises(ValueError, match="maximum: a has shape"):
        kernels.maximum(a, random(rng, (3, 2)))
    with pytest.raises(TypeError, match="minimum: a must be float"):
        kernels.minimum(a.astype(np.int32), a.astype(np.int32))
    with pytest.raises(ValueError, match="may differ only along axis 1"):
        kernels.concatenate([a, random(rng, (3, 3))], axis=1)
    with pytest.raises(ValueError, match="out of range"):
        kernels.concatenate([a, a], axis=2)
    with pytest.raises(ValueError, match="add up to"):
        kernels.concatenate_backward(a, [1, 1], axis=1)
    with pytest.raises(ValueError, match=r"inputs\[1\] has shape"):
        kernels.extremum_backward(a, [a, a[:1]], a)


# ---------------------------------------------------------------------------------- reshaping

@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_pad_and_crop_are_each_others_backward(rng, layout):
    x = random(rng, (2, 3, 5, 4) if layout == "NCHW" else (2, 5, 4, 3))
    amounts = (1, 2, 0, 3)
    y = kernels.pad2d(x, amounts, layout=layout)
    hw = (slice(1, 6), slice(0, 4))
    inner = (slice(None), slice(None)) + hw if layout == "NCHW" else (slice(None),) + hw
    np.testing.assert_array_equal(y[inner], x)
    assert y.shape == ((2, 3, 8, 7) if layout == "NCHW" else (2, 8, 7, 3))
    assert np.count_nonzero(y) == np.count_nonzero(x)  # the rest is zeros
    np.testing.assert_array_equal(kernels.crop2d(y, amounts, layout=layout), x)
    fd_check(lambda: kernels.pad2d(x, amounts, layout=layout), lambda w: kernels.crop2d(w, amounts, layout=layout), x, rng)
    fd_check(lambda: kernels.crop2d(x, (1, 0, 2, 1), layout=layout),
             lambda w: kernels.pad2d(w, (1, 0, 2, 1), layout=layout), x, rng)


def test_pad_value_and_out(rng):
    x = random(rng, (1, 1, 2, 2))
    out = np.full((1, 1, 3, 4), np.nan)
    r = kernels.pad2d(x, (0, 1, 1, 1), value=-2.0, out=out)
    assert r is out
    np.testing.assert_array_equal(out[0, 0], [[-2, x[0, 0, 0, 0], x[0, 0, 0, 1], -2],
                                              [-2, x[0, 0, 1, 0], x[0, 0, 1, 1], -2], [-2, -2, -2, -2]])


def test_upsample_bilinear_known_values():
    # tf.image.resize / jax.image.resize / torch interpolate(align_corners=False) of [1, 2] to 4
    x = np.array([1.0, 2.0]).reshape(1, 1, 1, 2)
    y = kernels.upsample2d_forward(x, size=(1, 2), interpolation="bilinear")
    np.testing.assert_allclose(y.reshape(-1), [1.0, 1.25, 1.75, 2.0])
    x3 = np.array([0.0, 3.0, 6.0]).reshape(1, 1, 3, 1)
    y3 = kernels.upsample2d_forward(x3, size=(3, 1), interpolation="bilinear")
    np.testing.assert_allclose(y3.reshape(-1), [0, 0, 1, 2, 3, 4, 5, 6, 6])


def naive_bilinear_nchw(x, sh, sw):
    """TensorFlow's half-pixel bilinear resize written per pixel (compute_interpolation_weights)."""
    n, c, h, w = x.shape

    def taps(o, s, size):
        src = (o + 0.5) / s - 0.5
        lower = max(math.floor(src), 0)
        upper = min(math.ceil(src), size - 1)
        return lower, upper, src - math.floor(src)

    y = np.zeros((n, c, h * sh, w * sw))
    for oh in range(h * sh):
        t, b, fy = taps(oh, sh, h)
        for ow in range(w * sw):
            le, ri, fx = taps(ow, sw, w)
            top = x[:, :, t, le] + (x[:, :, t, ri] - x[:, :, t, le]) * fx
            bottom = x[:, :, b, le] + (x[:, :, b, ri] - x[:, :, b, le]) * fx
            y[:, :, oh, ow] = top + (bottom - top) * fy
    return y


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("size", [(2, 2), (3, 2), (1, 4)])
@pytest.mark.parametrize("interpolation", ["nearest", "bilinear"])
def test_upsample_forward_and_backward(rng, layout, size, interpolation):
    x_nchw = random(rng, (2, 2, 3, 4))
    if interpolation == "nearest":
        want = x_nchw.repeat(size[0], axis=2).repeat(size[1], axis=3)
    else:
        want = naive_bilinear_nchw(x_nchw, *size)
    x = x_nchw if layout == "NCHW" else x_nchw.transpose(0, 2, 3, 1).copy()
    kw = dict(size=size, interpolation=interpolation, layout=layout)
    y = kernels.upsample2d_forward(x, **kw)
    got = y if layout == "NCHW" else y.transpose(0, 3, 1, 2)
    assert rel_error(got, want) < 1e-12
    fd_check(lambda: kernels.upsample2d_forward(x, **kw), lambda w: kernels.upsample2d_backward(w, x.shape, **kw), x, rng)


def test_upsample_low_precision_computes_in_float32(rng):
    x = random(rng, (1, 2, 3, 3)).astype(BF16)
    y = kernels.upsample2d_forward(x, size=2, interpolation="bilinear")
    ref = kernels.upsample2d_forward(x.astype(np.float64), size=2, interpolation="bilinear")
    assert y.dtype == BF16 and rel_error(y.astype(np.float64), ref) < 1e-2


@pytest.mark.parametrize("shape, axes", [((2, 3, 4), (0, 2, 1)), ((2, 3, 4, 5), (0, 3, 1, 2)), ((4, 1, 3), (2, 1, 0)),
                                         ((2, 3), (0, 1))])
def test_transpose_and_its_inverse(rng, shape, axes):
    x = random(rng, shape)
    y = kernels.transpose(x, axes)
    assert y.flags.c_contiguous
    np.testing.assert_array_equal(y, np.transpose(x, axes))
    inverse = tuple(np.argsort(axes))
    np.testing.assert_array_equal(kernels.transpose(y, inverse), x)


def test_transpose_plan_merges_and_drops_axes():
    from dnnbind.kernels._cuda.reshaping import _transpose_plan

    # (N, H, W, C) -> (N, C, H, W): H and W stay neighbours and merge
    assert _transpose_plan((2, 3, 4, 5), (0, 3, 1, 2)) == ([2, 5, 12], [60, 1, 5])
    # size-1 axes vanish; the identity order collapses to one axis
    assert _transpose_plan((2, 1, 3), (1, 0, 2)) == ([6], [1])
    assert _transpose_plan((2, 3, 4), (2, 1, 0)) == ([4, 3, 2], [1, 4, 12])


def test_reshaping_ops_refuse_bad_input(rng):
    x = random(rng, (1, 2, 4, 4))
    with pytest.raises(ValueError, match="pad2d: padding must be 4 ints >= 0"):
        kernels.pad2d(x, (1, 1, -1, 0))
    with pytest.raises(ValueError, match="crop2d: cropping .* leaves nothing"):
        kernels.crop2d(x, (2, 2, 0, 0))
    with pytest.raises(ValueError, match="must be 4-d"):
        kernels.pad2d(x[0], (1, 1, 1, 1))
    with pytest.raises(ValueError, match="interpolation must be one of"):
        kernels.upsample2d_forward(x, interpolation="bicubic")
    with pytest.raises(ValueError, match="size must be"):
        kernels.upsample2d_forward(x, size=0)
    with pytest.raises(ValueError, match="upsampled by"):
        kernels.upsample2d_backward(x, (1, 2, 3, 3), size=2)
    with pytest.raises(ValueError, match="permutation"):
        kernels.transpose(x, (0, 1, 1, 2))


# ------------------------------------------------------------------------------ preprocessing

def test_channel_run_shapes():
    from dnnbind.kernels.preprocessing import channel_run

    assert channel_run("t", "p", (2, 4, 5, 3), (3,)) == (3, 1)
    assert channel_run("t", "p", (2, 4, 5, 3), (1, 4, 5, 1)) == (20, 3)
    assert channel_run("t", "p", (2, 4, 5, 3), ()) == (1, 1)
    assert channel_run("t", "p", (2, 4, 5, 3), (4, 1, 1)) == (4, 15)
    with pytest.raises(ValueError, match="neighbours"):
        channel_run("t", "p", (2, 4, 5, 3), (4, 1, 3))
    with pytest.raises(ValueError, match="does not broadcast"):
        channel_run("t", "p", (2, 4, 5, 3), (2,))


@pytest.mark.parametrize("p_shape", [(), (3,), (1, 4, 1, 1), (4, 5, 1)])
def test_rescale_and_normalize_match_numpy_broadcasting(rng, p_shape):
    x = random(rng, (2, 4, 5, 3))
    a, b = random(rng, p_shape), random(rng, p_shape, low=0.1, high=2.0)
    np.testing.assert_allclose(kernels.rescale(x, a, b), x * a + b, rtol=1e-12)
    np.testing.assert_allclose(kernels.rescale(x, a), x * a, rtol=1e-12)
    sd = np.maximum(np.sqrt(b), 1e-7)
    np.testing.assert_allclose(kernels.normalize(x, a, b), (x - a) / sd, rtol=1e-12)
    np.testing.assert_allclose(kernels.normalize(x, a, b, invert=True), a + x * sd, rtol=1e-12)
    for invert in (False, True):
        fd_check(lambda: kernels.normalize(x, a, b, invert=invert),
                 lambda w: kernels.normalize_backward(w, b, invert=invert), x, rng)
    fd_check(lambda: kernels.rescale(x, a, b), lambda w: kernels.rescale(w, a), x, rng)


def test_normalize_floors_the_standard_deviation():
    x = np.array([[1.0, 2.0]])
    y = kernels.normalize(x, np.zeros(2), np.array([0.0, 4.0]))
    np.testing.assert_allclose(y, [[1e7, 1.0]])


def test_preprocessing_ops_refuse_bad_input(rng):
    x = random(rng, (2, 3))
    with pytest.raises(ValueError, match="offset has shape"):
        kernels.rescale(x, random(rng, (3,)), random(rng, ()))
    with pytest.raises(TypeError, match="normalize: variance must be float"):
        kernels.normalize(x, np.zeros(3), np.ones(3, dtype=np.int64))
    with pytest.raises(ValueError, match="epsilon must be >= 0"):
        kernels.normalize(x, np.zeros(3), np.ones(3), epsilon=-1.0)
