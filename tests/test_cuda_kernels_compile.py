"""CPU checks of the CUDA implementations (no GPU needed).

* every NVRTC source of dnnbind/kernels/_cuda compiles for sm_90 and exports every kernel name
  the Python side launches;
* cuDNN descriptors built by the ops (tensor, filter, convolution, pooling) read back as set
  (cuDNN's descriptor functions work without a GPU);
* the explicit-padding geometry of asymmetric convolutions agrees with cuDNN's own output-size
  rule on the padded input, and with the NumPy reference's shape;
* algorithm-cache keys change with everything that changes the choice;
* host-side helpers: average-pooling exclude-padding map, reduction axis merging, dtype maps.
"""

from __future__ import annotations

import ctypes
import itertools

import numpy as np
import pytest

from dnnbind import cudnn
from dnnbind._lib import cudnn as C
from dnnbind.cudnn import algo
from dnnbind.kernels import config
from dnnbind.kernels._cuda import _common as cm
from dnnbind.kernels._params import ConvParams, PoolParams, resolve_padding

FLOATS = ("f32", "f64", "f16", "bf16")
ALL = FLOATS + ("i32", "i64", "u8", "i8", "bool")


def _expected_kernels() -> dict[str, list[str]]:
    from dnnbind.kernels._cuda.activation import KERNEL_KINDS

    act = [f"act_{d}_{k}_{t}" for d in ("fwd", "bwd") for k in KERNEL_KINDS for t in FLOATS]
    layout = [f"{k}_{t}" for k in ("pad2d", "crop2d", "scale_hw", "bias_add", "bias_add_f32bias", "channel_sum",
                                   "channel_sum_rows", "channel_sum_partials", "channel_sum_last", "broadcast_hw",
                                   "maxpool2d_fwd_nhwc", "maxpool2d_bwd_nhwc")
              for t in FLOATS]
    elem = [f"{k}_{t}" for k in ("binary", "scale", "axpy", "reduce_rows", "reduce_mid", "argmax", "all_finite",
                                 "random_crop_flip") for t in FLOATS]
    elem += [f"{k}_{t}_{i}" for k in ("accuracy_count", "top_k_count") for t in FLOATS for i in ("i32", "i64")]
    elem += [f"cast_{a}_{b}" for a, b in itertools.product(ALL, ALL)]
    elem += [f"cast_many_{a}_{b}" for a, b in itertools.product(FLOATS, FLOATS)]
    elem += [f"fill_{t}" for t in ALL]
    elem += [f"take_rows_{w}_{i}" for w in ("w4", "b1") for i in ("i32", "i64")]
    losses = [f"{k}_{t}_{lab}" for k in ("softmax_xent", "probs_xent") for t in FLOATS for lab in ("i32", "i64", "dense")]
    losses += [f"elementwise_loss_{t}" for t in FLOATS] + ["sum_to_scalar_f32", "sum_to_scalar_f64"]
    optim = [f"{k}_{p}_{g}" for k in ("sgd", "adam", "rmsprop") for p in ("f32", "f64", "f16") for g in FLOATS]
    optim += ["advance_step", "tensor_sumsq", "clip_factors"] + [f"grad_sumsq_{g}" for g in FLOATS]
    merging = [f"{k}_{t}" for k in ("extremum", "extremum_bwd") for t in FLOATS]
    merging += [f"copy_rows_u{u}" for u in (1, 2, 4, 8)]
    reshaping = [f"upsample_{i}_{d}_{t}" for i in ("nearest", "bilinear") for d in ("fwd", "bwd") for t in FLOATS]
    reshaping += [f"transpose_u{u}" for u in (1, 2, 4, 8)]
    preprocessing = [f"channel_affine_{t}" for t in FLOATS]
    layernorm = [f"layernorm_{k}_{t}" for k in ("fwd", "bwd_dx", "bwd_params_rows", "bwd_params_final") for t in FLOATS]
    spatial_dropout = ["spatial_dropout_mask_f32", "spatial_dropout_mask_f64"] + [f"channel_scale_{t}" for t in FLOATS]
    q_types = ("f32", "f16", "bf16")
    quant = [f"{k}_{t}" for k in ("quant_rows_int8", "quant_static_int8", "abs_max", "quant_fp8", "fp8_epilogue",
                                  "dequant_int8", "dequant_fp8", "dequant_int4", "int4_gemm") for t in q_types]
    quant += [f"int8_epilogue_{t}_{a}" for t in q_types for a in ("i32", "f32")]
    quant += ["fp8_scales", "int8_to_f32", "fp8_to_f32"]
    timing = ["hold_stream"]
    batchnorm = [f"{k}_{t}" for k in ("bn_infer_channels_last", "bn_apply_sums_channels_last",
                                      "bn_apply_sums_channels_last_vec", "bn_dx_coefficients",
                                      "bn_dx_coefficients_vec") for t in q_types]
    return {"timing.cu": timing, "batchnorm.cu": batchnorm, "quant.cu": quant, "activation.cu": act, "layout.cu": layout, "elementwise.cu": elem, "losses.cu": losses,
            "optim.cu": optim, "merging.cu": merging, "reshaping.cu": reshaping, "preprocessing.cu": preprocessing,
            "layernorm.cu": layernorm, "spatial_dropout.cu": spatial_dropout}


@pytest.mark.parametrize("filename", sorted(_expected_kernels()))
def test_nvrtc_sources_compile_for_sm90_and_export_every_kernel(filename):
    from dnnbind.cuda.kernel import compile_kernel

    cubin = compile_kernel(cm.source(filename), arch="sm_90", options=cm.KERNEL_OPTIONS)
    assert cubin[:4] == b"\x7fELF"
    missing = [name for name in _expected_kernels()[filename] if name.encode() + b"\x00" not in cubin]
    assert not missing, f"{filename} does not export {missing[:10]}"


def test_compile_error_in_a_kernel_source_carries_the_log():
    from dnnbind.cuda.kernel import compile_kernel
    from dnnbind.errors import NvrtcError

    bad = cm.source("activation.cu") + '\nextern "C" __global__ void broken(float* x) { x[0] = undefined_name; }\n'
    with pytest.raises(NvrtcError) as info:
        compile_kernel(bad, arch="sm_90", options=cm.KERNEL_OPTIONS)
    assert "undefined_name" in str(info.value)


# ------------------------------------------------------------------------------ descriptors

def _tensor_readback(handle: int) -> tuple[int, tuple, tuple]:
    dtype, nb = ctypes.c_int(), ctypes.c_int()
    dims, strides = (ctypes.c_int * 8)(), (ctypes.c_int * 8)()
    C.cudnnGetTensorNdDescriptor(handle, 8, ctypes.byref(dtype), ctypes.byref(nb), dims, strides)
    return dtype.value, tuple(dims[: nb.value]), tuple(strides[: nb.value])


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("dtype, code", [(np.float32, 0), (np.float16, 2), (cm.BF16, 9), (np.float64, 1)])
def test_conv_geometry_descriptors_read_back_dims_and_layout_strides(layout, dtype, code):
    """The ops describe tensors with the public dnnbind.cudnn descriptors, shared through their caches."""
    from dnnbind.kernels._cuda import conv

    params = ConvParams(stride=(1, 1), pad=(0, 0, 0, 0), dilation=(1, 1), groups=1)
    x_shape = (3, 5, 7, 9) if layout == "NCHW" else (3, 7, 9, 5)
    w_shape = (8, 5, 3, 2) if layout == "NCHW" else (8, 3, 2, 5)
    g = conv._geometry(x_shape, w_shape, params, layout, np.dtype(dtype))
    assert conv._geometry(x_shape, w_shape, params, layout, np.dtype(dtype)) is g  # cached, not rebuilt
    got_dtype, got_dims, got_strides = _tensor_readback(g.x_desc.handle)
    assert got_dtype == code and got_dims == (3, 5, 7, 9)
    want = (315, 63, 9, 1) if layout == "NCHW" else (315, 1, 45, 5)
    assert got_strides == want
    vals = [ctypes.c_int() for _ in range(6)]
    C.cudnnGetFilter4dDescriptor(g.w_desc.handle, *[ctypes.byref(v) for v in vals])
    assert [v.value for v in vals] == [code, int(C.TensorFormat[layout]), 8, 5, 3, 2]  # (K, C, R, S) always
    # A descriptor of the same arguments made elsewhere is the same object (one cache per class).
    assert cudnn.TensorDescriptor.cached(x_shape, np.dtype(dtype), layout) is g.x_desc


@pytest.mark.parametrize("math, name", [(C.MathType.DEFAULT_MATH, "default"), (C.MathType.TENSOR_OP_MATH, "tensor_op"),
                                        (C.MathType.FMA_MATH, "fma")])
def test_algorithm_descriptor_carries_padding_stride_dilation_groups_math(math, name):
    key = algo.ConvKey("forward", 0, (1, 4, 8, 8), (4, 1, 3, 3), (1, 4, 4, 3), "float32", "NCHW", (1, 2), (2, 3),
                       (1, 2), 4, C.MathType.DEFAULT_MATH, None, False, False)
    info = algo.conv_desc(key, math).get()
    assert (info.pad, info.stride, info.dilation, info.groups) == ((1, 2), (2, 3), (1, 2), 4)
    assert (info.mode, info.compute_dtype, info.math) == ("cross_correlation", np.dtype(np.float32), name)
    assert algo.conv_desc(key, math) is algo.conv_desc(key, int(math))


def test_pooling_plan_descriptor_reads_back():
    from dnnbind.kernels._cuda import pooling

    params = PoolParams(mode="avg", window=(3, 2), stride=(2, 1), pad=(1, 1, 0, 0))
    plan = pooling._plan((2, 4, 9, 9), params, "NCHW", np.float32)
    vals = [ctypes.c_int() for _ in range(8)]
    C.cudnnGetPooling2dDescriptor(plan.pool_desc.handle, *[ctypes.byref(v) for v in vals])
    # AVERAGE_COUNT_EXCLUDE_PADDING, PROPAGATE_NAN, window, pad, stride
    assert [v.value for v in vals] == [2, 1, 3, 2, 1, 0, 2, 1]


# ------------------------------------------------------------------------- conv geometry

CASES = [
    # x (NCHW), w (KCRS), stride, padding, dilation, groups
    ((2, 3, 7, 7), (4, 3, 3, 3), (2, 2), "same", (1, 1), 1),
    ((1, 4, 8, 6), (4, 1, 2, 2), (2, 2), "same", (1, 1), 4),
    ((2, 6, 9, 10), (6, 3, 3, 2), (3, 2), "same", (2, 1), 2),
    ((2, 3, 5, 5), (2, 3, 1, 1), (1, 1), "valid", (1, 1), 1),
    ((1, 2, 6, 7), (3, 2, 3, 3), (1, 1), (0, 1, 2, 0), (1, 1), 1),
    ((1, 2, 6, 7), (3, 2, 3, 3), (1, 2), 1, (1, 1), 1),
]


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("x_shape, w_shape, stride, padding, dilation, groups", CASES)
def test_conv_geometry_matches_cudnn_output_dims_and_reference(layout, x_shape, w_shape, stride, padding, dilation,
                                                               groups):
    from dnnbind.kernels import conv as public
    from dnnbind.kernels._cuda import conv

    pad = resolve_padding(padding, x_shape[2:], w_shape[2:], stride, dilation)
    params = ConvParams(stride=stride, pad=pad, dilation=dilation, groups=groups)
    n, c, h, w = x_shape
    k, cg, r, s = w_shape
    xs = x_shape if layout == "NCHW" else (n, h, w, c)
    ws = w_shape if layout == "NCHW" else (k, r, s, cg)
    g = conv._geometry(xs, ws, params, layout, cm.F32)
    assert (g.explicit is None) == params.symmetric
    cdesc = cudnn.ConvolutionDescriptor.cached(g.desc_pad, stride, dilation, groups)
    assert cdesc.forward_output_dim(g.x_desc, g.w_desc) == g.layout_shape(g.y_dims)
    # The public op's output shape (NumPy reference geometry) is what the CUDA path allocates.
    _, y_shape = public.conv_params("test", xs, ws, stride=stride, padding=padding, dilation=dilation, groups=groups,
                                    layout=layout)
    assert g.layout_shape(g.y_dims) == tuple(y_shape)
    if g.explicit is not None:
        t, b, l, r_ = pad
        assert g.xp_dims == (n, c, h + t + b, w + l + r_) and g.desc_pad == (0, 0)


def test_algorithm_key_covers_every_setting_that_changes_the_choice():
    from dnnbind.kernels._cuda import conv

    params = ConvParams(stride=(1, 1), pad=(1, 1, 1, 1), dilation=(1, 1), groups=1)
    g = conv._geometry((2, 3, 8, 8), (4, 3, 3, 3), params, "NCHW", cm.F32)
    with config.override(allow_tf32=True, deterministic=False, benchmark=False, workspace_limit=None):
        base = g.key("forward", 0)
        assert base.math == 0  # CUDNN_DEFAULT_MATH: TF32 allowed
        assert g.key("forward", 0) == base
    with config.override(allow_tf32=False):
        assert g.key("forward", 0).math == 3  # CUDNN_FMA_MATH: strict fp32
    with config.override(deterministic=True):
        assert g.key("forward", 0) != base
    with config.override(benchmark=True):
        assert g.key("forward", 0) != base
    with config.override(workspace_limit=1 << 20):
        assert g.key("forward", 0).workspace_limit == 1 << 20
    assert g.key("backward_filter", 0) != base and g.key("forward", 1) != base
    g16 = conv._geometry((2, 3, 8, 8), (4, 3, 3, 3), params, "NCHW", cm.F16)
    assert g16.key("forward", 0).math == 1  # tensor-op math for fp16
    gnhwc = conv._geometry((2, 8, 8, 3), (4, 3, 3, 3), params, "NHWC", cm.F32)
    assert gnhwc.key("forward", 0) != base


def test_strict_fp32_refuses_tensor_op_algorithms():
    from dnnbind.kernels._cuda import conv

    M = C.MathType
    params = ConvParams(stride=(1, 1), pad=(0, 0, 0, 0), dilation=(1, 1), groups=1)
    g = conv._geometry((1, 1, 4, 4), (1, 1, 3, 3), params, "NCHW", cm.F32)
    with config.override(allow_tf32=False):
        key = g.key("forward", 0)
    assert key.math is M.FMA_MATH
    assert not algo.is_acceptable(M.TENSOR_OP_MATH, key)
    assert not algo.is_acceptable(M.TENSOR_OP_MATH_ALLOW_CONVERSION, key)
    assert algo.is_acceptable(M.DEFAULT_MATH, key) and algo.exec_math(M.DEFAULT_MATH, key) is M.FMA_MATH
    with config.override(allow_tf32=True):
        key = g.key("forward", 0)
    assert algo.is_acceptable(M.TENSOR_OP_MATH, key) and algo.exec_math(1, key) is M.TENSOR_OP_MATH


# ------------------------------------------------------------------------------ host helpers

@pytest.mark.parametrize("x_hw, window, stride, padding", [
    ((7, 7), (2, 2), (2, 2), "same"), ((6, 5), (3, 3), (2, 2), "same"), ((5, 8), (3, 2), (1, 3), "same"),
])
def test_exclude_padding_map_matches_the_reference_average(x_hw, window, stride, padding):
    from dnnbind.kernels import pool2d_forward
    from dnnbind.kernels._cuda.pooling import exclude_pad_map

    pad = resolve_padding(padding, x_hw, window, stride)
    params = PoolParams(mode="avg", window=window, stride=stride, pad=pad)
    m = exclude_pad_map(x_hw, params)
    rng = np.random.default_rng(0)
    x = rng.uniform(0.5, 1.5, size=(1, 1) + tuple(x_hw))
    avg_ex = pool2d_forward(x, mode="avg", window=window, stride=stride, padding=padding)
    avg_in = pool2d_forward(x, mode="avg_include_pad", window=window, stride=stride, padding=padding)
    np.testing.assert_allclose(avg_in[0, 0] * m, avg_ex[0, 0], rtol=1e-6)


def test_reduction_axis_runs_merge():
    from dnnbind.kernels._cuda.elementwise import _merge_runs

    assert _merge_runs((2, 3, 4, 5), (1, 2)) == ((2, 12, 5), (1,))
    assert _merge_runs((2, 3, 4, 5), (0, 3)) == ((2, 12, 5), (0, 2))
    assert _merge_runs((2, 3, 4, 5), (0, 2)) == ((2, 3, 4, 5), (0, 2))
    assert _merge_runs((2, 3), (0, 1)) == ((6,), (0,))


def test_dtype_tables():
    assert [cm.suffix(d) for d in (cm.F32, cm.F64, cm.F16, cm.BF16)] == list(FLOATS)
    assert [cudnn.data_type(d) for d in (cm.F32, cm.F64, cm.F16, cm.BF16)] == [0, 1, 2, 9]
    with pytest.raises(TypeError):
        cudnn.data_type(np.complex64)
    assert cm.ONE.of(cm.F64)._obj.value == 1.0 and isinstance(cm.ONE.of(cm.F32)._obj, ctypes.c_float)


def test_activation_kernels_cover_every_kind_and_cudnn_is_opt_in():
    from dnnbind.kernels._cuda import activation
    from dnnbind.kernels.activation import ACTIVATIONS

    # every kind has its own kernels but linear, which is a device copy
    assert set(activation.KERNEL_KINDS) == set(ACTIVATIONS) - {"linear"}
    assert set(activation.CUDNN_KINDS) <= set(activation.KERNEL_KINDS)
    # the kernels by default; cuDNN only behind the module switch, and never for bfloat16 clipped_relu
    assert activation.CUDNN_ACTIVATIONS is False
    assert not any(activation._uses_cudnn(k, d) for k in ACTIVATIONS for d in cm.FLOAT_DTYPES)
    try:
        activation.CUDNN_ACTIVATIONS = True
        assert activation._uses_cudnn("relu", cm.BF16) and not activation._uses_cudnn("gelu", cm.F32)
        assert not activation._uses_cudnn("clipped_relu", cm.BF16) and activation._uses_cudnn("clipped_relu", cm.F16)
    finally:
        activation.CUDNN_ACTIVATIONS = False
    assert activation._kernel("bwd", "gelu_tanh", cm.BF16) == "act_bwd_gelu_tanh_bf16"


def test_activation_kernel_sources_agree_with_the_host_on_what_each_backward_reads():
    """activation.cu's ActReads and the host's alignment check name the same arrays per kind."""
    import re

    text = cm.source("activation.cu")
    reads_y = re.search(r"y = (K == ACT_\w+(?: \|\| K == ACT_\w+)*)", text).group(1)
    not_x = re.search(r"x = (K != ACT_\w+(?: && K != ACT_\w+)*)", text).group(1)
    kinds_y = {m.lower() for m in re.findall(r"ACT_(\w+)", reads_y)}
    kinds_no_x = {m.lower() for m in re.findall(r"ACT_(\w+)", not_x)}
    from dnnbind.kernels._cuda.activation import _BACKWARD_READS

    assert kinds_y == {k for k, v in _BACKWARD_READS.items() if "y" in v}
    assert kinds_no_x == {k for k, v in _BACKWARD_READS.items() if "x" not in v}


def test_maxpool_kernel_eligibility():
    from dnnbind.kernels._cuda import pooling

    plain = PoolParams(mode="max", window=(2, 2), stride=(2, 2), pad=(0, 0, 0, 0))
    assert pooling._own_maxpool(plain, "NHWC") and not pooling._own_maxpool(plain, "NCHW")
    assert not pooling._own_maxpool(PoolParams(mode="avg", window=(2, 2), stride=(2, 2), pad=(0, 0, 0, 0)), "NHWC")
    assert not pooling._own_maxpool(PoolParams(mode="max", window=(3, 3), stride=(2, 2), pad=(0, 0, 0, 0)), "NHWC")
    assert not pooling._own_maxpool(PoolParams(mode="max", window=(2, 2), stride=(2, 2), pad=(0, 1, 0, 1)), "NHWC")
    try:
        pooling.MAXPOOL_NHWC_KERNELS = False
        assert not pooling._own_maxpool(plain, "NHWC")
    finally:
        pooling.MAXPOOL_NHWC_KERNELS = True


def test_quant_kernels_compile_without_the_sm89_fp8_conversion():
    """Before sm_89 quant.cu converts to E4M3 in software (no cvt.e4m3x2): that branch must compile too."""
    from dnnbind.cuda.kernel import compile_kernel

    cubin = compile_kernel(cm.source("quant.cu"), arch="sm_80", options=cm.KERNEL_OPTIONS)
    assert b"quant_fp8_bf16\x00" in cubin
