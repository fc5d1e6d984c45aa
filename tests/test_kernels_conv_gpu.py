"""CUDA conv ops vs the NumPy reference (float64 on the same rounded inputs)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from dnnbind import kernels
from dnnbind.kernels import config
from cases import CONV_CASES
from gpu_errlog import PRECISIONS, check, dev, dev_offset, host, poisoned, quantize
from testutil import random

pytestmark = pytest.mark.gpu



def _to_layout(a, layout, kind):
    if layout == "NCHW":
        return a
    return a.transpose(0, 2, 3, 1)  # x/dy NCHW -> NHWC, w KCRS -> KRSC


def _data(rng, x_shape, w_shape, stride, padding, dilation, groups, layout, dtype):
    x = _to_layout(random(rng, x_shape), layout, "x")
    w = _to_layout(random(rng, w_shape), layout, "w")
    y_shape = kernels.conv2d_output_shape(x.shape, w.shape, stride=stride, padding=padding, dilation=dilation,
                                      groups=groups, layout=layout)
    dy = random(rng, y_shape)
    return quantize(x, dtype), quantize(w, dtype), quantize(dy, dtype)


@pytest.mark.parametrize("label, dtype, overrides", PRECISIONS)
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("x_shape, w_shape, stride, padding, dilation, groups", CONV_CASES)
def test_conv_forward_backward_match_numpy(rng, label, dtype, overrides, layout, x_shape, w_shape, stride, padding,
                                           dilation, groups):
    x, w, dy = _data(rng, x_shape, w_shape, stride, padding, dilation, groups, layout, dtype)
    kw = dict(stride=stride, padding=padding, dilation=dilation, groups=groups, layout=layout)
    case = f"{layout} x{x.shape} w{w.shape} s{stride} p{padding} d{dilation} g{groups}"
    y_ref = kernels.conv2d_forward(x, w, **kw)
    dx_ref = kernels.conv2d_backward_data(dy, w, x.shape, **kw)
    dw_ref = kernels.conv2d_backward_filter(x, dy, w.shape, **kw)
    xd, wd, dyd = dev(x, dtype), dev(w, dtype), dev(dy, dtype)
    with config.override(**overrides):
        y = kernels.conv2d_forward(xd, wd, out=poisoned(y_ref.shape, dtype), **kw)
        dx = kernels.conv2d_backward_data(dyd, wd, x.shape, out=poisoned(x.shape, dtype), **kw)
        dw = kernels.conv2d_backward_filter(xd, dyd, w.shape, out=poisoned(w.shape, dtype), **kw)
    check("conv2d_forward", label, y, y_ref, case)
    check("conv2d_backward_data", label, dx, dx_ref, case)
    check("conv2d_backward_filter", label, dw, dw_ref, case)


@pytest.mark.parametrize("label, dtype, overrides", PRECISIONS[:1] + PRECISIONS[2:])
@pytest.mark.parametrize("layout, shape", [("NCHW", (2, 5, 3, 4)), ("NHWC", (2, 3, 4, 5)), ("NCHW", (7, 5)),
                                           # channels-last with >= 256 rows: the two-pass row-block sums
                                           ("NHWC", (16, 9, 11, 24)), ("NHWC", (8, 13, 7, 70)), ("NCHW", (3001, 33))])
def test_bias_add_and_bias_backward(rng, label, dtype, overrides, layout, shape):
    y = quantize(random(rng, shape), dtype)
    c = shape[1] if (len(shape) == 4 and layout == "NCHW") else shape[-1]
    b = quantize(random(rng, (c,)), dtype)
    ref = kernels.bias_add(y, b, layout=layout)
    got = kernels.bias_add(dev(y, dtype), dev(b, dtype), layout=layout, out=poisoned(shape, dtype))
    check("bias_add", label, got, ref)
    check("bias_backward", label, kernels.bias_backward(dev(y, dtype), layout=layout), kernels.bias_backward(y, layout=layout))
    yd = dev(y, dtype)
    kernels.bias_add(yd, dev(b, dtype), layout=layout, out=yd)  # in place
    check("bias_add", label, yd, ref, "in place")


@pytest.mark.parametrize("label, dtype, overrides", PRECISIONS[:1] + PRECISIONS[2:])
@pytest.mark.parametrize("shape", [
    (300, 24), (7, 5), (16, 9, 11, 24),   # one launch (<= 256 rows); two: 6 (f32) / 3 (bf16) vectors of C
    (130, 32, 33, 8),                     # 137280 rows: 512 row blocks of 269 rows
    (64, 9, 9, 1032),                     # C over 256 vectors: two column tiles (f32), one (16-bit)
    (40, 13, 13, 7), (3, 5, 5, 2048)])    # odd C: scalar; large C
@pytest.mark.parametrize("offset", [0, 1])
def test_bias_backward_channels_last_vectors_tails_and_misaligned_input(rng, label, dtype, overrides, shape,
                                                                       offset):
    """Channels-last bias gradients (column sums) against the reference, with dy one item past a
    16-byte boundary for offset 1; two calls give the same bits."""
    y = quantize(random(rng, shape), dtype)
    yd = dev_offset(y, offset, dtype)
    got = kernels.bias_backward(yd, layout="NHWC")
    check("bias_backward", label, got, kernels.bias_backward(y, layout="NHWC"), f"{shape} offset {offset}")
    assert np.array_equal(np.asarray(got.to_host()), np.asarray(kernels.bias_backward(yd, layout="NHWC").to_host()))


@pytest.mark.parametrize("label, dtype, overrides", PRECISIONS)
@pytest.mark.parametrize("activation", ["relu", "linear", "gelu"])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_fused_conv_bias_activation(rng, label, dtype, overrides, activation, layout):
    x, w, _ = _data(rng, (2, 3, 9, 9), (4, 3, 3, 3), 2, "same", 1, 1, layout, dtype)
    b = quantize(random(rng, (4,)), dtype)
    kw = dict(activation=activation, stride=2, padding="same", layout=layout)
    ref = kernels.conv2d_bias_activation_forward(x, w, b, **kw)
    with config.override(**overrides):
        got = kernels.conv2d_bias_activation_forward(dev(x, dtype), dev(w, dtype), dev(b, dtype),
                                                 out=poisoned(ref.shape, dtype), **kw)
    check("conv2d_bias_activation_forward", label, got, ref, f"{activation} {layout}")


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_deterministic_mode_gives_bitwise_equal_backward(rng, layout):
    x, w, dy = _data(rng, (8, 16, 14, 14), (32, 16, 3, 3), 1, 1, 1, 1, layout, np.float32)
    kw = dict(stride=1, padding=1, layout=layout)
    xd, wd, dyd = dev(x, np.float32), dev(w, np.float32), dev(dy, np.float32)
    with config.override(deterministic=True):
        runs = [(host(kernels.conv2d_backward_filter(xd, dyd, w.shape, **kw)),
                 host(kernels.conv2d_backward_data(dyd, wd, x.shape, **kw))) for _ in range(3)]
    for dw, dx in runs[1:]:
        assert np.array_equal(dw, runs[0][0]) and np.array_equal(dx, runs[0][1])
    from dnnbind.cudnn import algo

    chosen = [c for k, c in algo.cache_info().items() if k.deterministic and k.x_dims[0] == 8]
    assert chosen and all(c.deterministic for c in chosen)


def test_benchmark_mode_runs_and_matches(rng):
    x, w, dy = _data(rng, (4, 8, 12, 12), (16, 8, 3, 3), 1, 1, 1, 1, "NCHW", np.float32)
    kw = dict(stride=1, padding=1)
    with config.override(benchmark=True, allow_tf32=False):
        y = kernels.conv2d_forward(dev(x, np.float32), dev(w, np.float32), **kw)
        dw = kernels.conv2d_backward_filter(dev(x, np.float32), dev(dy, np.float32), w.shape, **kw)
        dx = kernels.conv2d_backward_data(dev(dy, np.float32), dev(w, np.float32), x.shape, **kw)
    from dnnbind.cudnn import algo

    assert any(k.benchmark and c.source == "benchmark" for k, c in algo.cache_info().items())
    check("conv2d_forward", "float32", y, kernels.conv2d_forward(x, w, **kw), "benchmark")
    check("conv2d_backward_filter", "float32", dw, kernels.conv2d_backward_filter(x, dy, w.shape, **kw), "benchmark")
    check("conv2d_backward_data", "float32", dx, kernels.conv2d_backward_data(dy, w, x.shape, **kw), "benchmark")


def test_workspace_limit_zero_picks_algorithms_without_workspace(rng):
    x, w, _ = _data(rng, (4, 8, 12, 12), (16, 8, 5, 5), 1, 2, 1, 1, "NCHW", np.float32)
    with config.override(workspace_limit=0, allow_tf32=False):
        y = kernels.conv2d_forward(dev(x, np.float32), dev(w, np.float32), stride=1, padding=2)
    from dnnbind.cudnn import algo

    assert all(c.workspace == 0 for k, c in algo.cache_info().items() if k.workspace_limit == 0)
    check("conv2d_forward", "float32", y, kernels.conv2d_forward(x, w, stride=1, padding=2), "workspace_limit=0")


def test_workspace_out_of_memory_falls_back_with_a_warning(rng, monkeypatch):
    from dnnbind.cudnn import algo
    from dnnbind.errors import DeviceOutOfMemoryError

    x, w, _ = _data(rng, (4, 16, 20, 20), (32, 16, 5, 5), 1, 2, 1, 1, "NCHW", np.float32)
    real = algo.workspace

    def starved(stream, nbytes):
        if nbytes > 0:
            raise DeviceOutOfMemoryError(nbytes, 0, 0, 0, "the cuDNN workspace (test)")
        return real(stream, nbytes)

    monkeypatch.setattr(algo, "workspace", starved)  # what the algorithm choice asks for scratch
    algo.clear_cache()
    with config.override(allow_tf32=False, workspace_limit=None, benchmark=False, deterministic=False):
        # Force a choice that needs workspace first, as heuristics would on a big conv.
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            y = kernels.conv2d_forward(dev(x, np.float32), dev(w, np.float32), stride=1, padding=2)
    chosen = [c for k, c in algo.cache_info().items() if k.x_dims == (4, 16, 20, 20)]
    assert chosen and all(c.workspace == 0 for c in chosen)
    if any(c.source == "fallback" for c in chosen):
        assert any("falling back" in str(m.message) for m in caught)
    check("conv2d_forward", "float32", y, kernels.conv2d_forward(x, w, stride=1, padding=2), "workspace OOM fallback")


def test_failing_cudnn_call_raises_cudnn_error_with_context(rng):
    from dnnbind.errors import CudnnError
    from dnnbind.kernels._cuda import conv as cuda_conv
    from dnnbind.kernels._params import ConvParams

    # groups=2 with 3 input channels: invalid, and only cuDNN gets to see it here (the public op
    # would refuse it first).
    x = dev(random(rng, (1, 3, 5, 5)), np.float32)
    w = dev(random(rng, (2, 1, 3, 3)), np.float32)
    params = ConvParams(stride=(1, 1), pad=(1, 1, 1, 1), dilation=(1, 1), groups=2)
    with pytest.raises(CudnnError) as info:
        cuda_conv.conv2d_forward(x, w, params=params, layout="NCHW")
    text = str(info.value)
    assert "CUDNN_STATUS" in text and "(1, 3, 5, 5)" in text and "NCHW" in text and "float32" in text


def test_conv_matches_torch(rng):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch without CUDA")
    x = random(rng, (2, 4, 9, 9)).astype(np.float32)
    w = random(rng, (6, 2, 3, 3)).astype(np.float32)
    with config.override(allow_tf32=False):
        y = host(kernels.conv2d_forward(dev(x), dev(w), stride=2, padding=1, groups=2))
    torch.backends.cudnn.allow_tf32 = False
    ref = torch.nn.functional.conv2d(torch.from_numpy(x).cuda(), torch.from_numpy(w).cuda(), stride=2, padding=1,
                                     groups=2).cpu().numpy()
    check("conv2d_forward", "float32", y, ref, "torch")


@pytest.mark.parametrize("label, dtype, overrides", PRECISIONS[:1] + PRECISIONS[2:])
@pytest.mark.parametrize("shape", [(300, 24), (7, 5), (33, 2048), (3, 4, 5, 16), (9, 12)])
@pytest.mark.parametrize("f32_bias", [False, True])
def test_bias_add_channels_last_vector_path_matches_scalar_bitwise(rng, label, dtype, overrides, shape, f32_bias):
    """Channels-last bias_add: the 16-byte path (aligned, C a multiple of 16 bytes' worth) against float64
    and bit for bit against the scalar path (y one item past a 16-byte boundary); C = 5, 12 (bf16/fp16)
    always take the scalar path. A float32 bias goes through the CUDA op (the public op takes y's dtype)."""
    from dnnbind.kernels._cuda import conv as cuda_conv

    y = quantize(random(rng, shape), dtype)
    b_dtype = np.dtype(np.float32) if f32_bias else dtype
    b = quantize(random(rng, (shape[-1],)), b_dtype)
    ref = y + b
    outs = []
    for offset in (0, 1):
        got = cuda_conv.bias_add(dev_offset(y, offset, dtype), dev(b, b_dtype), layout="NHWC",
                                 out=poisoned(shape, dtype))
        check("bias_add", label, got, ref, f"channels-last {shape} offset {offset} f32 bias {f32_bias}")
        outs.append(np.asarray(got.to_host()).view(np.uint8))
    assert np.array_equal(outs[0], outs[1]), f"{shape}: vector and scalar bias_add differ"
    yd = dev(y, dtype)
    cuda_conv.bias_add(yd, dev(b, b_dtype), layout="NHWC", out=yd)  # in place, vector path where it fits
    assert np.array_equal(np.asarray(yd.to_host()).view(np.uint8), outs[0])
