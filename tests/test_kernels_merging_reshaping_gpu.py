"""CUDA merge, reshaping and preprocessing ops and layers vs the NumPy references, per dtype, outputs
poisoned with NaN first; the layers in CUDA-graph-replayed Sequential and functional training."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import dnnbind
import dnnbind as keras
from dnnbind import _validate, layers, mixed_precision, kernels
from gpu_errlog import BF16, DTYPES, check, dev, poisoned, quantize
from test_layers_merging_reshaping import merge_model
from testutil import random, rel_error

pytestmark = pytest.mark.gpu

FLOATS = DTYPES + [pytest.param("float64", np.dtype(np.float64), id="fp64")]


@pytest.fixture(autouse=True)
def _reset():
    yield
    dnnbind.set_default_device(None)
    mixed_precision.set_global_policy("float32")


# ------------------------------------------------------------------------------------ merging

@pytest.mark.parametrize("label, dtype", FLOATS)
@pytest.mark.parametrize("name", ["maximum", "minimum"])
def test_extremum_forward_backward(rng, label, dtype, name):
    shape = (3, 5, 7)
    xs = [quantize(random(rng, shape), dtype) for _ in range(3)]
    xs[1][0, 0, :3] = xs[0][0, 0, :3]  # ties: the gradient goes to input 0
    xs[2][1, 1, :2] = xs[1][1, 1, :2]
    op = getattr(kernels, name)
    y_ref = op(op(xs[0], xs[1]), xs[2])
    dy = quantize(random(rng, shape), dtype)
    grads_ref = kernels.extremum_backward(dy, xs, y_ref)
    xd = [dev(x, dtype) for x in xs]
    y = op(xd[0], xd[1], out=poisoned(shape, dtype))
    op(y, xd[2], out=y)
    check(name, label, y, y_ref, tol=0.0)  # a selection: exact
    grads = kernels.extremum_backward(dev(dy, dtype), xd, y)
    for i, (g, r) in enumerate(zip(grads, grads_ref)):
        check("extremum_backward", label, g, r, f"input {i}", tol=0.0)


@pytest.mark.parametrize("label, dtype", FLOATS)
@pytest.mark.parametrize("axis", [0, 1, 2, -1])
def test_concatenate_and_backward(rng, label, dtype, axis):
    sizes = (1, 2, 4)  # odd byte widths: the row copies fall back to narrower units
    parts = []
    for size in sizes:
        s = [2, 3, 5]
        s[axis] = size
        parts.append(quantize(random(rng, tuple(s)), dtype))
    y_ref = kernels.concatenate(parts, axis=axis)
    y = kernels.concatenate([dev(p, dtype) for p in parts], axis=axis, out=poisoned(y_ref.shape, dtype))
    check("concatenate", label, y, y_ref, f"axis {axis}", tol=0.0)
    pieces = kernels.concatenate_backward(dev(y_ref, dtype), sizes, axis=axis)
    for i, (p, r) in enumerate(zip(pieces, parts)):
        assert tuple(p.shape) == r.shape
        check("concatenate_backward", label, p, r, f"axis {axis} piece {i}", tol=0.0)


def test_concatenate_of_a_misaligned_view(rng):
    # a row view of a float16 (3, 3) array starts 6 bytes in: only 2-byte copies are aligned
    base = quantize(random(rng, (3, 3)), np.float16)
    other = quantize(random(rng, (2, 3)), np.float16)
    view = dev(base, np.float16)[1:2]
    y = kernels.concatenate([view, dev(other, np.float16)], axis=0, out=poisoned((3, 3), np.float16))
    check("concatenate", "float16", y, np.concatenate([base[1:2], other]), "view", tol=0.0)


# ---------------------------------------------------------------------------------- reshaping

@pytest.mark.parametrize("label, dtype", FLOATS)
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_pad_and_crop(rng, label, dtype, layout):
    x = quantize(random(rng, (2, 3, 5, 4) if layout == "NCHW" else (2, 5, 4, 3)), dtype)
    for amounts, value in (((1, 2, 0, 3), 0.0), ((0, 1, 2, 0), -1.5)):
        y_ref = kernels.pad2d(x, amounts, value=value, layout=layout)
        y = kernels.pad2d(dev(x, dtype), amounts, value=value, layout=layout, out=poisoned(y_ref.shape, dtype))
        check("pad2d", label, y, y_ref, f"{layout} {amounts}", tol=0.0)
    crop = (2, 0, 1, 1)
    c_ref = kernels.crop2d(x, crop, layout=layout)
    c = kernels.crop2d(dev(x, dtype), crop, layout=layout, out=poisoned(c_ref.shape, dtype))
    check("crop2d", label, c, c_ref, layout, tol=0.0)


@pytest.mark.parametrize("label, dtype", FLOATS)
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("interpolation", ["nearest", "bilinear"])
@pytest.mark.parametrize("size", [(2, 2), (3, 1), (1, 4)])
def test_upsample_forward_backward(rng, label, dtype, layout, interpolation, size):
    x = quantize(random(rng, (2, 3, 5, 4) if layout == "NCHW" else (2, 5, 4, 3)), dtype)
    kw = dict(size=size, interpolation=interpolation, layout=layout)
    y_ref = kernels.upsample2d_forward(x, **kw)
    y = kernels.upsample2d_forward(dev(x, dtype), out=poisoned(y_ref.shape, dtype), **kw)
    dy = quantize(random(rng, y_ref.shape), dtype)
    dx_ref = kernels.upsample2d_backward(dy, x.shape, **kw)
    dx = kernels.upsample2d_backward(dev(dy, dtype), x.shape, **kw)
    case = f"{interpolation} {layout} {size}"
    check("upsample2d_forward", label, y, y_ref, case, tol=0.0 if interpolation == "nearest" else None)
    check("upsample2d_backward", label, dx, dx_ref, case)


@pytest.mark.parametrize("dtype", [np.float32, np.float16, BF16, np.float64, np.int8, np.int64, np.bool_],
                         ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("shape, axes", [((2, 3, 4, 5), (0, 3, 1, 2)), ((2, 3, 4, 5), (0, 2, 3, 1)),
                                         ((3, 1, 4), (2, 1, 0)), ((2, 3, 4), (0, 1, 2)),
                                         ((2, 3, 2, 3, 2), (4, 2, 0, 3, 1))])
def test_transpose_is_bit_exact(rng, dtype, shape, axes):
    x = (rng.integers(0, 2, size=shape) > 0 if np.dtype(dtype) == np.bool_
         else rng.integers(-50, 50, size=shape)).astype(dtype)
    if np.dtype(dtype).kind == "f" or np.dtype(dtype) == BF16:
        x = random(rng, shape).astype(dtype)
    ref = np.ascontiguousarray(np.transpose(x, axes))
    y = kernels.transpose(dev(x), axes, out=poisoned(ref.shape, np.dtype(dtype)))
    got = np.ascontiguousarray(y.to_host())
    assert got.shape == ref.shape and got.view(np.uint8).tobytes() == ref.view(np.uint8).tobytes()


# ------------------------------------------------------------------------------ preprocessing

@pytest.mark.parametrize("label, dtype", FLOATS)
@pytest.mark.parametrize("p_shape", [(), (3,), (1, 4, 1, 1), (4, 5, 1)])
@pytest.mark.parametrize("param_dtype", ["matched", "float64"])
def test_rescale_and_normalize(rng, label, dtype, p_shape, param_dtype):
    x = quantize(random(rng, (2, 4, 5, 3)), dtype)
    pd = np.float64 if param_dtype == "float64" or dtype == np.float64 else np.float32
    a = random(rng, p_shape).astype(pd)
    b = random(rng, p_shape, low=0.1, high=2.0).astype(pd)
    ad, bd, xd = dev(a), dev(b), dev(x, dtype)
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    case = f"params {p_shape} {np.dtype(pd).name}"
    y = kernels.rescale(xd, ad, bd, out=poisoned(x.shape, dtype))
    check("rescale", label, y, kernels.rescale(x, a64, b64), case)
    check("rescale", label, kernels.rescale(xd, ad), kernels.rescale(x, a64), case + " no offset")
    for invert in (False, True):
        y = kernels.normalize(xd, ad, bd, invert=invert, out=poisoned(x.shape, dtype))
        check("normalize", label, y, kernels.normalize(x, a64, b64, invert=invert), f"{case} invert={invert}")
        dx = kernels.normalize_backward(xd, bd, invert=invert)
        check("normalize_backward", label, dx, kernels.normalize_backward(x, b64, invert=invert),
              f"{case} invert={invert}")


# ------------------------------------------------------------------------------------- layers

def _layer_cases():
    return [
        ("add", lambda: layers.Add(), 3), ("subtract", lambda: layers.Subtract(), 2),
        ("multiply", lambda: layers.Multiply(), 3), ("average", lambda: layers.Average(), 2),
        ("maximum", lambda: layers.Maximum(), 3), ("minimum", lambda: layers.Minimum(), 2),
        ("concatenate", lambda: layers.Concatenate(axis=2), 2),
        ("reshape", lambda: layers.Reshape((-1, 3)), 1), ("permute", lambda: layers.Permute((3, 1, 2)), 1),
        ("zero_padding", lambda: layers.ZeroPadding2D(((1, 0), (2, 1))), 1),
        ("cropping", lambda: layers.Cropping2D(((1, 0), (0, 2))), 1),
        ("upsampling_nearest", lambda: layers.UpSampling2D((2, 3)), 1),
        ("upsampling_bilinear", lambda: layers.UpSampling2D(2, interpolation="bilinear",
                                                            data_format="channels_first"), 1),
        ("rescaling", lambda: layers.Rescaling([0.5, 2.0, -1.0], offset=0.25), 1),
        ("normalization", lambda: layers.Normalization(axis=(1, 2)), 1),
        ("normalization_invert", lambda: layers.Normalization(invert=True), 1),
        ("normalization_given", lambda: layers.Normalization(mean=[1.0, -1.0, 0.5], variance=[2.0, 0.5, 1.0]), 1),
    ]


@pytest.mark.parametrize("policy, label", [("float32", "float32"), ("mixed_float16", "float16"),
                                           ("mixed_bfloat16", "bfloat16")])
@pytest.mark.parametrize("name, make, n_inputs", _layer_cases(), ids=[c[0] for c in _layer_cases()])
def test_layer_on_cuda_matches_numpy(rng, policy, label, name, make, n_inputs):
    mixed_precision.set_global_policy(policy)
    dnnbind.set_default_device("cpu")
    xs = [quantize(random(rng, (2, 4, 6, 3)), BF16).astype(np.float32) for _ in range(n_inputs)]
    layer = make()
    if isinstance(layer, layers.Normalization) and layer.input_mean is None:
        layer.adapt(random(rng, (16, 4, 6, 3), low=-1.0, high=3.0))
    arg = xs if layer.multi_input else xs[0]
    layer(arg)  # builds it
    y_ref = layer.forward(arg, training=True)
    dy = quantize(random(rng, y_ref.shape), BF16).astype(np.float32)
    g_ref = layer.backward(dy)
    layer.to("cuda")
    xd = [dev(x) for x in xs]
    y = layer(xd if layer.multi_input else xd[0], training=True)
    assert isinstance(y, dnnbind.Tensor) and dnnbind.backend.is_device_array(y.data)  # a layer gives tensors
    if not isinstance(layer, (layers.Reshape, layers.Permute)):  # these two move data as it is
        assert y.dtype == _validate.normalize_dtype(layer.compute_dtype)
    g = layer.backward(dev(dy, y.dtype))
    check(f"layer.{name}.forward", label, y, y_ref)
    for i, (a, b) in enumerate(zip(g if layer.multi_input else [g], g_ref if layer.multi_input else [g_ref])):
        check(f"layer.{name}.backward", label, a, b, f"input {i}")


# ------------------------------------------------------------------- models, graph-replayed

def _sequential(weights=None):
    model = keras.Sequential([
        keras.Input((6, 6, 2)),
        layers.Rescaling(1 / 255.0),
        layers.Normalization(),
        layers.ZeroPadding2D(1),
        layers.Conv2D(4, 3, activation="relu", kernel_initializer=keras.initializers.GlorotUniform(1)),
        layers.UpSampling2D(2, interpolation="bilinear"),
        layers.Cropping2D(((1, 1), (2, 2))),
        layers.Permute((2, 1, 3)),
        layers.Reshape((-1,)),
        layers.Identity(),
        layers.Dense(3, activation="softmax", kernel_initializer=keras.initializers.GlorotUniform(2)),
    ])
    if weights is not None:
        model.set_weights(weights)
    return model


def _functional(weights=None):
    model = merge_model()
    if weights is not None:
        model.set_weights(weights)
    return model


def _fit_both(make, x, y, prepare=None):
    dnnbind.set_default_device("cpu")
    cpu = make()
    if prepare is not None:
        prepare(cpu)
    dnnbind.set_default_device("cuda")
    gpu = make(cpu.get_weights())
    results = []
    with kernels.config.override(allow_tf32=False), warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # a "could not be captured" fallback fails the test
        for m in (cpu, gpu):
            m.compile(keras.optimizers.SGD(0.05, momentum=0.9), "sparse_categorical_crossentropy")
            h = m.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)
            results.append((h.history["loss"], m.predict(x, verbose=0), m.get_weights()))
    (lc, pc, wc), (lg, pg, wg) = results
    stats = gpu._step_graphs.stats
    assert gpu.device.is_cuda and stats["failures"] == 0 and stats["captures"] >= 1 and stats["replays"] >= 1
    assert np.allclose(lc, lg, rtol=1e-4)
    assert rel_error(pg, pc) < 1e-4
    for a, b in zip(wc, wg):
        assert rel_error(b, a) < 1e-4


def test_sequential_with_reshaping_and_preprocessing_layers_replays_like_numpy(rng):
    x = rng.integers(0, 256, size=(32, 6, 6, 2)).astype(np.float32)
    y = rng.integers(0, 3, size=32)
    _fit_both(_sequential, x, y, prepare=lambda m: m.layers[1].adapt(x / 255.0))


def test_functional_model_with_merge_layers_replays_like_numpy(rng):
    xa, xb = rng.normal(size=(32, 5)).astype(np.float32), rng.normal(size=(32, 5)).astype(np.float32)
    y = rng.integers(0, 3, size=32)
    _fit_both(_functional, [xa, xb], y)

