"""``kernels.conv2d_batchnorm_forward_training`` and ``kernels.batchnorm_relu_conv2d_backward`` on the GPU (issue 9).

The fused paths (forward: one cuDNN graph of the convolution with the batch-norm statistics in its
epilogue, genstats, then the normalising kernel; backward: one graph of the data gradient, the relu's
backward and the batch-norm weight gradients, then the dx kernel) against the unfused GPU ops and the
NumPy reference per precision; the forward's record through the batch norm's backward; the measured
choice (which must leave the running statistics alone); the two kernels alone; and Sequential training
through the fused paths, eager and captured, against training with fusion off."""

from __future__ import annotations

import numpy as np
import pytest

import dnnbind as keras
from dnnbind import cuda, layers, kernels
from dnnbind.kernels import config
from dnnbind.kernels._cuda import batchnorm as bn
from dnnbind.kernels._cuda import conv_bn, conv_graph
from dnnbind.kernels._cuda.activation import activation_backward
from gpu_errlog import BF16, PRECISIONS, check, dev, host, poisoned, quantize
from test_kernels_batchnorm import relu_safe_beta
from testutil import fit_on_gpu, rel_error, random

pytestmark = pytest.mark.gpu

# (x (N, H, W, C), w (K, R, S, C), conv keywords, fused path expected on cuDNN 9.19 / H200 in fp16, bf16, tf32)
CASES = [
    pytest.param((16, 8, 8, 64), (64, 3, 3, 64), dict(padding=1), True, id="3x3-c64-k64"),
    pytest.param((8, 12, 12, 32), (32, 3, 3, 32), dict(padding=1), True, id="3x3-c32-k32"),
    # "same" with stride 2 on an even size: pad2d first, then the graph on the padded x
    pytest.param((4, 10, 10, 16), (32, 3, 3, 16), dict(padding="same", stride=2), False, id="3x3-s2-asym-c16"),
]


@pytest.fixture
def forced():
    """Every genstats key takes its plan unmeasured, in every dtype (the choice would keep bf16/TF32 off it)."""
    conv_graph.clear_cache()
    conv_graph.FORCE_GRAPH = True
    try:
        yield
    finally:
        conv_graph.FORCE_GRAPH = False
        conv_graph.clear_cache()


def _inputs(rng, x_shape, w_shape, conv, dtype, activation):
    """x, w rounded to dtype; float32 parameters; with the relu, beta puts every pre-activation of the
    float64 reference well away from relu's kink, so rounding cannot flip a mask."""
    x, w = quantize(random(rng, x_shape), dtype), quantize(random(rng, w_shape, low=-0.3, high=0.3), dtype)
    k = w_shape[0]
    gamma = random(rng, (k,), low=0.5, high=1.5).astype(np.float32)
    beta = random(rng, (k,), low=-0.3, high=0.3).astype(np.float32)
    if activation == "relu":
        y64 = kernels.conv2d_forward(x, w, layout="NHWC", **conv)
        beta, margin = relu_safe_beta(y64, gamma.astype(np.float64), (0, 1, 2), epsilon=1e-3, layout="NHWC")
        assert margin > 2e-2, margin
        beta = beta.astype(np.float32)
    rm, rv = random(rng, (k,)).astype(np.float32), random(rng, (k,), low=0.5, high=2).astype(np.float32)
    return x, w, gamma, beta, rm, rv


@pytest.mark.parametrize("activation", [None, "relu"])
@pytest.mark.parametrize("x_shape, w_shape, conv, fused_expected", CASES)
@pytest.mark.parametrize("label, dtype, overrides", PRECISIONS)
def test_fused_path_matches_the_unfused_gpu_ops_and_the_reference(rng, forced, monkeypatch, label, dtype, overrides,
                                                                  x_shape, w_shape, conv, fused_expected, activation):
    x, w, gamma, beta, rm, rv = _inputs(rng, x_shape, w_shape, conv, dtype, activation)
    out_shape = kernels.conv2d_output_shape(x_shape, w_shape, layout="NHWC", **conv)
    kw = dict(momentum=0.9, epsilon=1e-3, activation=activation, layout="NHWC")
    xd, wd, gd, bd = dev(x, dtype), dev(w, dtype), dev(gamma), dev(beta)
    rm_f, rv_f, rm_u, rv_u = dev(rm), dev(rv), dev(rm), dev(rv)
    with config.override(**overrides):
        before = conv_graph.stats()["forward_genstats"]["graph"]
        y, out, saved = kernels.conv2d_batchnorm_forward_training(xd, wd, gd, bd, rm_f, rv_f,
                                                              out=poisoned(out_shape, dtype), **kw, **conv)
        fused = conv_graph.stats()["forward_genstats"]["graph"] - before
        # the unfused GPU ops: the convolution, then the batch norm's own training call
        y_u = kernels.conv2d_forward(xd, wd, layout="NHWC", out=poisoned(out_shape, dtype), **conv)
        out_u, saved_u = kernels.batchnorm_forward_training(y_u, gd, bd, rm_u, rv_u, out=poisoned(out_shape, dtype),
                                                        **kw)
    case = f"{x_shape} {w_shape} {conv} {activation} path {saved.path}"
    choices = [c for k, c in conv_graph.cache_info().items() if k.direction == "forward_genstats"]
    assert len(choices) == 1, choices
    if label == "float32":
        # strict float32: cuDNN 9.19 has no engine for it; the refusal is remembered and the legacy path ran
        assert fused == 0 and saved.path != conv_bn.GENSTATS and choices[0].source == "refused", (case, choices)
    elif fused_expected:
        assert fused == 1 and saved.path == conv_bn.GENSTATS and choices[0].source == "forced", (case, choices)
    assert (saved.path == conv_bn.GENSTATS) == (fused == 1), case
    check("conv_bn_vs_unfused.y", label, y, host(y_u), case)
    check("conv_bn_vs_unfused.out", label, out, host(out_u), case)
    for name, a, b in (("running_mean", rm_f, rm_u), ("running_var", rv_f, rv_u), ("save_mean", saved.mean,
                                                                                       saved_u.mean),
                       ("save_inv_std", saved.inv_std, saved_u.inv_std)):
        check(f"conv_bn_vs_unfused.{name}", label, a, host(b), case)
    # the float64 reference of the same (rounded) inputs
    p64 = [a.astype(np.float64) for a in (gamma, beta, rm, rv)]
    y_ref, out_ref, saved_ref = kernels.conv2d_batchnorm_forward_training(x, w, *p64, **kw, **conv)
    check("conv2d_batchnorm_forward_training.y", label, y, y_ref, case)
    check("conv2d_batchnorm_forward_training.out", label, out, out_ref, case)
    check("conv2d_batchnorm_forward_training.running_mean", label, rm_f, p64[2], case)
    check("conv2d_batchnorm_forward_training.running_var", label, rv_f, p64[3], case)
    if activation == "relu":
        assert np.all(host(out) >= 0) and np.any(host(out) == 0), case
    # the record serves the batch norm's backward (dy w.r.t. the relu'd output with the relu)
    dy = quantize(random(rng, out_shape), dtype)
    bkw = dict(epsilon=1e-3, activation=activation, layout="NHWC")
    relu_apart = []
    monkeypatch.setattr(bn, "activation_backward", lambda *a, **k: relu_apart.append(1) or activation_backward(*a, **k))
    got = kernels.batchnorm_backward(dev(dy, dtype), y, gd, saved, y=out if activation else None, **bkw)
    monkeypatch.undo()
    if activation == "relu" and saved.path == conv_bn.GENSTATS:
        # the record (with beta) went to the fused batch-norm + relu backward: no relu pass apart
        assert saved.beta is not None and bn.fused_backward_takes_genstats(y, cuda.current_stream()), case
        assert relu_apart == [], case
    unfused = kernels.batchnorm_backward(dev(dy, dtype), y_u, gd, saved_u, y=out_u if activation else None, **bkw)
    ref = kernels.batchnorm_backward(dy, y_ref, p64[0], saved_ref, y=out_ref if activation else None, **bkw)
    for name, a, u, r in zip(("dx", "dgamma", "dbeta"), got, unfused, ref):
        check(f"conv_bn_backward_vs_unfused.{name}", label, a, host(u), case)
        check(f"conv_bn_backward.{name}", label, a, r, case)


@pytest.mark.parametrize("dtype", [np.dtype(np.float16), BF16], ids=["fp16", "bf16"])
def test_the_measured_choice_times_both_jobs_on_scratch_statistics(rng, dtype):
    x_shape, w_shape, conv = (16, 8, 8, 64), (64, 3, 3, 64), dict(padding=1)
    x, w, gamma, beta, rm, rv = _inputs(rng, x_shape, w_shape, conv, dtype, "relu")
    conv_graph.clear_cache()
    rm_d, rv_d = dev(rm), dev(rv)
    try:
        with config.override(benchmark=True):
            y, out, saved = kernels.conv2d_batchnorm_forward_training(dev(x, dtype), dev(w, dtype), dev(gamma), dev(beta),
                                                                  rm_d, rv_d, momentum=0.9, activation="relu",
                                                                  padding=1, layout="NHWC")
        (key, choice), = [(k, c) for k, c in conv_graph.cache_info().items() if k.direction == "forward_genstats"]
    finally:
        conv_graph.clear_cache()
    assert key.benchmark and choice.source in ("benchmark", "refused"), choice
    if choice.source == "benchmark":
        labels = [label for label, _ in choice.timings]
        assert labels[-1] == "legacy" and all(ms > 0 for _, ms in choice.timings), choice
        assert choice.path == ("graph" if choice.graph_ms <= choice.legacy_ms * 1.02 else "legacy"), choice
        assert (saved.path == conv_bn.GENSTATS) == (choice.path == "graph"), (saved, choice)
    # the timed runs of both paths (a dozen) left the running statistics at exactly one update
    p64 = [a.astype(np.float64) for a in (gamma, beta, rm, rv)]
    _, out_ref, _ = kernels.conv2d_batchnorm_forward_training(x, w, *p64, momentum=0.9, activation="relu", padding=1,
                                                          layout="NHWC")
    label = "float16" if dtype == np.float16 else "bfloat16"
    check("conv_bn[benchmark].running_mean", label, rm_d, p64[2])
    check("conv_bn[benchmark].running_var", label, rv_d, p64[3])
    check("conv_bn[benchmark].out", label, out, out_ref)


def _model(device):
    keras.utils.set_random_seed(7)
    m = keras.Sequential([
        keras.Input((8, 8, 16)),
        layers.Conv2D(32, 3, padding="same", use_bias=False), layers.BatchNormalization(), layers.ReLU(),
        layers.Conv2D(32, 3, padding="same", use_bias=False), layers.BatchNormalization(momentum=0.9),
        layers.GlobalAveragePooling2D(), layers.Dense(3, activation="softmax"),
    ])
    m.to(device)
    return m


def _fit(fuse: bool, policy: str, jit_compile):
    rng = np.random.default_rng(1)
    x = rng.normal(size=(48, 8, 8, 16)).astype(np.float32)
    y = (x[..., 0].mean(axis=(1, 2)) > 0).astype(np.int64) + (x[..., 1].mean(axis=(1, 2)) > 0.1)
    return fit_on_gpu(_model, x, y, policy, jit_compile, fuse_layers=fuse)


@pytest.mark.parametrize("jit_compile", [False, "auto"], ids=["eager", "graph"])
@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
def test_sequential_training_through_the_fused_path_equals_training_without_fusion(forced, policy, jit_compile):
    before = conv_graph.stats()["forward_genstats"]["graph"]
    back_before = conv_graph.stats()["backward_data_drelu_dbn"]["graph"]
    start, fused = _fit(True, policy, jit_compile)
    # 2 convolutions x the steps run from Python: 3 eagerly; a warm-up and a capture (then replays) when captured
    steps = 3 if jit_compile is False else 2
    assert conv_graph.stats()["forward_genstats"]["graph"] - before >= 2 * steps, conv_graph.stats()
    # the second convolution's backward through the first batch norm: float16 has the engine, bfloat16 none
    back = conv_graph.stats()["backward_data_drelu_dbn"]["graph"] - back_before
    assert back >= steps if policy == "mixed_float16" else back == 0, conv_graph.stats()
    before = conv_graph.stats()["forward_genstats"]["graph"]
    start_plain, plain = _fit(False, policy, jit_compile)
    assert conv_graph.stats()["forward_genstats"]["graph"] == before
    for i, (w0, w0_plain, wf, wp) in enumerate(zip(start, start_plain, fused, plain)):
        assert np.array_equal(w0, w0_plain)
        assert not np.array_equal(wf, w0), i
        # what three SGD steps changed, within the 16-bit tolerance (the two paths round y and sum apart)
        assert rel_error(wf.astype(np.float64) - w0, wp.astype(np.float64) - w0) < 2e-2, (policy, i)


@pytest.mark.parametrize("channels, offset", [(64, 0), (12, 0), (64, 3)], ids=["vec", "c12", "misaligned"])
@pytest.mark.parametrize("label, dtype", [("float32", np.dtype(np.float32)), ("float16", np.dtype(np.float16)),
                                          ("bfloat16", BF16)])
@pytest.mark.parametrize("relu", [False, True])
def test_normalising_kernel_matches_numpy(rng, label, dtype, channels, offset, relu):
    """batchnorm.cu's bn_apply_sums kernels (16-byte packs; one element per step when C or an address
    does not allow them) from given sums, into a poisoned output, and the statistics they write."""
    from gpu_errlog import dev_offset

    n_rows, count = 300, 300
    y = quantize(random(rng, (n_rows, channels), low=-2, high=3), dtype)
    sums, squares = y.sum(0), (y * y).sum(0)
    gamma = random(rng, (channels,), low=0.5, high=1.5).astype(np.float32)
    beta = random(rng, (channels,), low=-0.5, high=0.5).astype(np.float32)
    rm, rv = random(rng, (channels,)).astype(np.float32), random(rng, (channels,), low=0.5, high=2).astype(np.float32)
    yd = dev_offset(y, offset, dtype) if offset else dev(y, dtype)
    out = poisoned(y.shape, dtype)
    mean_d, inv_d, rm_d, rv_d = poisoned((channels,), np.float32), poisoned((channels,), np.float32), dev(rm), dev(rv)
    s = cuda.current_stream()
    conv_bn._apply(yd, out, dev(sums.astype(np.float32)), dev(squares.astype(np.float32)), dev(gamma), dev(beta),
                   rm_d, rv_d, mean_d, inv_d, count, 1e-3, 0.9, relu, s)
    mean, var = y.mean(0), y.var(0)
    inv = 1 / np.sqrt(var + 1e-3)
    ref = (y - mean) * inv * gamma + beta
    if relu:
        ref = np.maximum(ref, 0)
        assert np.any(ref == 0)
    case = f"C={channels} offset={offset} relu={relu}"
    check("bn_apply_sums.out", label, out, ref, case)
    check("bn_apply_sums.save_mean", label, mean_d, mean, case, tol=1e-5)
    check("bn_apply_sums.save_inv_std", label, inv_d, inv, case, tol=1e-4)
    check("bn_apply_sums.running_mean", label, rm_d, 0.9 * rm + 0.1 * mean, case, tol=1e-5)
    check("bn_apply_sums.running_var", label, rv_d, 0.9 * rv + 0.1 * var, case, tol=1e-4)


BACKWARD_CASES = [  # (x (N, H, W, C): the batch norm's input, w (K, R, S, C), conv keywords, fp16 fused expected)
    pytest.param((16, 8, 8, 64), (64, 3, 3, 64), dict(padding=1), True, id="3x3-c64-k64"),
    pytest.param((8, 12, 12, 32), (32, 3, 3, 32), dict(padding=1), True, id="3x3-c32-k32"),
    pytest.param((4, 10, 10, 16), (32, 3, 3, 16), dict(padding=1, stride=2), False, id="3x3-s2-c16"),
]


@pytest.mark.parametrize("x_shape, w_shape, conv, fused_expected", BACKWARD_CASES)
@pytest.mark.parametrize("label, dtype, overrides", PRECISIONS)
def test_fused_backward_matches_the_unfused_gpu_ops_and_the_reference(rng, forced, label, dtype, overrides, x_shape,
                                                                      w_shape, conv, fused_expected):
    c = x_shape[3]
    x = quantize(random(rng, x_shape, low=-2, high=3), dtype)
    gamma = random(rng, (c,), low=0.5, high=1.5).astype(np.float32)
    beta, margin = relu_safe_beta(x, gamma.astype(np.float64), (0, 1, 2), epsilon=1e-3, layout="NHWC")
    # the masks come from x itself (exact in every dtype) in float32 or float64: far finer than this margin
    assert margin > 1e-3, margin
    beta = beta.astype(np.float32)
    w = quantize(random(rng, w_shape, low=-0.3, high=0.3), dtype)
    dy_shape = kernels.conv2d_output_shape(x_shape, w_shape, layout="NHWC", **conv)
    dy = quantize(random(rng, dy_shape), dtype)
    kw = dict(epsilon=1e-3, layout="NHWC")
    xd, wd, dyd, gd, bd = dev(x, dtype), dev(w, dtype), dev(dy, dtype), dev(gamma), dev(beta)
    zeros, ones = np.zeros(c, np.float32), np.ones(c, np.float32)
    with config.override(**overrides):
        y, saved = kernels.batchnorm_forward_training(xd, gd, bd, dev(zeros), dev(ones), activation="relu", **kw)
        before = conv_graph.stats()["backward_data_drelu_dbn"]["graph"]
        got = kernels.batchnorm_relu_conv2d_backward(dyd, wd, xd, y, gd, bd, saved, **kw, **conv)
        fused = conv_graph.stats()["backward_data_drelu_dbn"]["graph"] - before
        dconv = kernels.conv2d_backward_data(dyd, wd, x_shape, layout="NHWC", out=poisoned(x_shape, dtype), **conv)
        unfused = kernels.batchnorm_backward(dconv, xd, gd, saved, activation="relu", y=y, **kw)
    (choice,) = [ch for k, ch in conv_graph.cache_info().items() if k.direction == "backward_data_drelu_dbn"]
    case = f"{x_shape} {w_shape} {conv} choice {choice.source}"
    if label != "float16":
        # cuDNN 9.19 has the DgradDreluBNBwdWeight engine for float16 only: the refusal is remembered
        assert fused == 0 and choice.source == "refused", (case, choice)
    elif fused_expected:
        assert fused == 1 and choice.source == "forced", (case, choice)
    y_ref, saved_ref = kernels.batchnorm_forward_training(x, gamma.astype(np.float64), beta.astype(np.float64),
                                                      zeros.astype(np.float64), ones.astype(np.float64),
                                                      activation="relu", **kw)
    ref = kernels.batchnorm_relu_conv2d_backward(dy, w, x, y_ref, gamma.astype(np.float64), beta.astype(np.float64),
                                             saved_ref, **kw, **conv)
    for name, a, u, r in zip(("dx", "dgamma", "dbeta"), got, unfused, ref):
        assert np.any(r != 0), name
        check(f"batchnorm_relu_conv2d_backward_vs_unfused.{name}", label, a, host(u), case)
        check(f"batchnorm_relu_conv2d_backward.{name}", label, a, r, case)


@pytest.mark.parametrize("channels, offset", [(64, 0), (12, 0), (64, 3)], ids=["vec", "c12", "misaligned"])
@pytest.mark.parametrize("label, dtype", [("float32", np.dtype(np.float32)), ("float16", np.dtype(np.float16)),
                                          ("bfloat16", BF16)])
def test_dx_kernel_matches_numpy(rng, label, dtype, channels, offset):
    """batchnorm.cu's bn_dx_coefficients kernels: dx = eq_dy * dz + eq_x * x + eq_b, into a poisoned output."""
    from gpu_errlog import dev_offset

    dz, x = (quantize(random(rng, (200, channels)), dtype) for _ in range(2))
    eq = [random(rng, (channels,)).astype(np.float32) for _ in range(3)]
    put = (lambda a: dev_offset(a, offset, dtype)) if offset else (lambda a: dev(a, dtype))
    dx = poisoned(x.shape, dtype)
    conv_bn._dx(put(dz), put(x), dx, *(dev(e) for e in eq), cuda.current_stream())
    check("bn_dx_coefficients", label, dx, eq[0] * dz + eq[1] * x + eq[2], f"C={channels} offset={offset}")
