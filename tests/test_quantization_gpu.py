"""Low-bit inference on the GPU vs the NumPy reference (kernels/quantize.py), outputs poisoned (NaN) first.

* the quantizers (int8 per row and static, E4M3 bytes and scales, max|x|) agree with NumPy exactly;
* cuBLASLt: the int8 GEMM is exact against NumPy's int32 product, the FP8 GEMM (A/B scale pointers, bias
  epilogue) within an elementwise bound (FP8_ACCUMULATION) of float64 on the E4M3 values (ml_dtypes);
* each quantized dense op, on cuBLASLt shapes (which must take the real FP8 GEMM: a cached plan) and on the
  fallback ones, and the int4 paths (dequantize + cuBLAS, fused kernel) agree with NumPy per dtype; the
  weight dequantizers exactly;
* a quantized model predicts on CUDA (graph replay) as on NumPy.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import dnnbind
from dnnbind import cuda, layers, kernels
from dnnbind import quantizers as Q
from dnnbind.cublas._lt import LtNotSupportedError, lt_plans
from dnnbind.kernels._cuda import quant as cuda_quant
from dnnbind.kernels import config
from gpu_errlog import BF16, check, dev, dev_offset, poisoned, record

pytestmark = pytest.mark.gpu

DTYPES = [pytest.param(np.dtype(np.float32), id="fp32"), pytest.param(np.dtype(np.float16), id="fp16"),
          pytest.param(BF16, id="bf16")]
# the int8 path is exact up to the output rounding; float8/int4 add accumulation-order differences
EXACT_TOL = {np.dtype(np.float32): 1e-6, np.dtype(np.float16): 1e-3, BF16: 4e-3}
GEMM_TOL = {np.dtype(np.float32): 2e-5, np.dtype(np.float16): 2e-3, BF16: 1e-2}
# Unit roundoff of each output dtype (float32 2**-24, float16 2**-11, bfloat16 2**-8).
UNIT_ROUNDOFF = {np.dtype(np.float32): 2.0 ** -24, np.dtype(np.float16): 2.0 ** -11, BF16: 2.0 ** -8}
# FP8 GEMM accumulation error, relative to sum_i |a_i| |b_i| (scales applied). The products of E4M3
# values are exact, but the tensor cores do not keep float32 sums throughout: cuBLASLt's header on
# CUBLASLT_MATMUL_DESC_FAST_ACCUM (kept 0) says intermediate results are "periodically promoted to a
# higher precision", and Hopper's FP8 MMA keeps "around 14 bits" between promotions (DeepSeek-V3 report,
# 3.3.2), i.e. a unit roundoff near 2**-13 per partial sum. 2**-11 allows four such roundings of the
# whole |a||b| sum. The float32 bound k * 2**-23 * sum|a||b| (2**-15 at k = 256) is below what H200
# measured (1.4e-4 normwise at k = 256, about 2**-16 of sum|a||b| in RMS, so a few times that at the
# worst element). Anything really wrong (a scale, a transpose, a missing bias) is off by O(|ref|), i.e.
# about sum|a||b| / sqrt(k) >> 2**-11 sum|a||b|.
FP8_ACCUMULATION = 2.0 ** -11


def _assert_fp8_gemm_bound(op, got, ref, abs_products, d_dtype, case, extra=0.0):
    """|got - ref| <= FP8_ACCUMULATION * sum|a||b| + 3 u(D) (|ref| + extra) elementwise; the normwise
    error goes to the log."""
    g = np.asarray(got.to_host(), dtype=np.float64) if hasattr(got, "to_host") else np.asarray(got, np.float64)
    ref = np.asarray(ref, np.float64)
    assert np.all(np.isfinite(g)), f"{op} {case}: non-finite outputs (unwritten NaN poison?)"
    bound = FP8_ACCUMULATION * abs_products + 3.0 * UNIT_ROUNDOFF[np.dtype(d_dtype)] * (np.abs(ref) + extra)
    err = np.abs(g - ref)
    record(op, _label(d_dtype), float(np.linalg.norm(g - ref) / np.linalg.norm(ref)), case)
    worst = np.unravel_index(np.argmax(err / bound), err.shape)
    assert np.all(err <= bound), (f"{op} [{_label(d_dtype)}] {case}: |error| {err[worst]:.3e} > bound "
                                  f"{bound[worst]:.3e} at {worst} (sum|a||b| {abs_products[worst]:.3e})")


def _lt_plan_for(kind, m, n, k, d_dtype):
    """The cached cuBLASLt plan of this matmul (its repr names the setting and algorithm), or None."""
    label = f"{kind} m={m} n={n} k={k} D={np.dtype(d_dtype)}"
    return next((p for p in lt_plans() if f" {label} " in repr(p) or f" {label}>" in repr(p)), None)


def _host(a) -> np.ndarray:
    return np.asarray(a.to_host())


def _x(rng, shape, dtype):
    return (rng.standard_normal(shape) * 2.0).astype(dtype)


def _label(dtype) -> str:
    return {np.dtype(np.float32): "float32", np.dtype(np.float16): "float16"}.get(np.dtype(dtype), "bfloat16")


# ----------------------------------------------------------------------------- quantizers
@pytest.mark.parametrize("dtype", DTYPES)
def test_int8_quantizers_match_numpy_exactly(rng, dtype):
    x = _x(rng, (37, 300), dtype)
    q, s = kernels.quantize_int8(dev(x))
    q_ref, s_ref = kernels.quantize_int8(x)
    np.testing.assert_array_equal(_host(s), s_ref)
    np.testing.assert_array_equal(_host(q), q_ref)
    scale = np.array([40.0], np.float32)  # saturates the tails, ties at multiples of 1/80
    q, _ = kernels.quantize_int8(dev(x), scale=dev(scale))
    np.testing.assert_array_equal(_host(q), kernels.quantize_int8(x, scale=scale)[0])


@pytest.mark.parametrize("dtype", DTYPES)
def test_float8_quantizer_and_abs_max_match_numpy_exactly(rng, dtype):
    x = _x(rng, (19, 64), dtype)
    x[0, :8] = np.array([1.0625, 1.1875, -2.5, 1000.0, -1000.0, 0.0009765625, 0.0, 3.0], np.float32).astype(dtype)
    np.testing.assert_array_equal(_host(kernels.abs_max(dev(x))), kernels.abs_max(x))
    q, scales = kernels.quantize_float8(dev(x))
    q_ref, scales_ref = kernels.quantize_float8(x)
    np.testing.assert_array_equal(_host(scales), scales_ref)
    np.testing.assert_array_equal(_host(q), q_ref)
    one = np.array([1.0], np.float32)  # no scaling: ties to even and saturation at 448 as ml_dtypes
    q, _ = kernels.quantize_float8(dev(x), scale=dev(one))
    np.testing.assert_array_equal(_host(q), kernels.quantize_float8(x, scale=one)[0])


# ----------------------------------------------------------------------------- cuBLASLt
def _workspace():
    from dnnbind import cublas, cuda

    s = cuda.current_stream()
    h = cublas.get_handle(s)
    return s, int(h.workspace.ptr), int(h.workspace.nbytes)


def test_cublaslt_int8_gemm_is_exact(rng):
    from dnnbind import cublas

    m, n, k = 48, 37, 96  # D (m, n) = A(k, m)^T B(k, n): out 48, rows 37, in 96
    a = rng.integers(-127, 128, size=(m, k)).astype(np.int8)  # row-major (m, k) is column-major (k, m)
    b = rng.integers(-127, 128, size=(n, k)).astype(np.int8)
    d = poisoned((n, m), np.int32)
    s, ws, ws_bytes = _workspace()
    da, db = dev(a), dev(b)
    cublas.matmul_tn("int8", m, n, k, int(da.ptr), int(db.ptr), int(d.ptr), d_dtype=np.int32, stream=s,
                     workspace=ws, workspace_bytes=ws_bytes)
    np.testing.assert_array_equal(_host(d), b.astype(np.int32) @ a.astype(np.int32).T)


@pytest.mark.parametrize("d_dtype", DTYPES)
def test_cublaslt_fp8_gemm_with_scale_pointers_matches_float64(rng, d_dtype):
    from dnnbind import cublas, cuda

    if cuda.CudaDevice().compute_capability < (8, 9):
        pytest.skip("FP8 GEMMs need sm_89+")
    m, n, k = 64, 40, 256
    a = Q.float8_to_bits(Q.quantize_float8(rng.standard_normal((m, k)), 64.0))
    b = Q.float8_to_bits(Q.quantize_float8(rng.standard_normal((n, k)), 64.0))
    sa, sb = np.array([0.015625], np.float32), np.array([0.03125], np.float32)
    # fp16/bf16 D: a bias of D's type through the epilogue (or added by the caller when refused)
    bias = None if np.dtype(d_dtype) == np.float32 else (rng.standard_normal(m) * 3.0).astype(d_dtype)
    d = poisoned((n, m), d_dtype)
    s, ws, ws_bytes = _workspace()
    da, db, dsa, dsb = dev(a), dev(b), dev(sa), dev(sb)
    dbias = None if bias is None else dev(bias)
    left = cublas.matmul_tn("float8", m, n, k, int(da.ptr), int(db.ptr), int(d.ptr), d_dtype=d_dtype, stream=s,
                            workspace=ws, workspace_bytes=ws_bytes, a_scale=int(dsa.ptr), b_scale=int(dsb.ptr),
                            bias=0 if dbias is None else int(dbias.ptr), bias_dtype=None if bias is None else d_dtype)
    fused = "bias" not in left
    fa, fb = Q.float8_from_bits(a).astype(np.float64), Q.float8_from_bits(b).astype(np.float64)
    scale = float(sa[0]) * float(sb[0])
    ref = (fb @ fa.T) * scale
    if bias is not None and fused:
        ref = ref + bias.astype(np.float64)
    plan = _lt_plan_for("float8", m, n, k, d_dtype)
    assert plan is not None and (bias is None or plan.fused_bias == fused), plan
    print(plan)  # which setting and algorithm cuBLASLt took
    _assert_fp8_gemm_bound("cublaslt_fp8", d, ref, (np.abs(fb) @ np.abs(fa).T) * scale, d_dtype,
                           f"m{m} n{n} k{k} {plan!r}", extra=0.0 if bias is None else np.abs(bias.astype(np.float64)))


def test_cublaslt_refuses_misaligned_shapes_before_calling():
    from dnnbind import cublas, cuda

    s = cuda.current_stream()
    with pytest.raises(ValueError, match="multiple of 16"):
        cublas.matmul_tn("float8", 64, 8, 40, 0, 0, 0, d_dtype=BF16, stream=s, workspace=0, workspace_bytes=0)


# ----------------------------------------------------------------------------- dense ops
def _weights(rng, n, k):
    w = (rng.standard_normal((n, k)) / np.sqrt(k)).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32) * 0.1
    return w, b


# (rows, in, out): cuBLASLt shapes, and fallback shapes (in % 16 != 0, out % 8 != 0)
SHAPES = [(37, 64, 32), (128, 784, 128), (33, 40, 10), (5, 784, 10)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows, k, n", SHAPES)
@pytest.mark.parametrize("static", [False, True])
@pytest.mark.parametrize("bias", [True, False])
def test_int8_dense_matches_numpy(rng, dtype, rows, k, n, static, bias):
    w, b = _weights(rng, n, k)
    qw, sw = Q.abs_max_quantize(w, axis=1)
    sw = sw.reshape(-1)
    x = _x(rng, (rows, k), dtype)
    bb = b.astype(dtype) if bias else None
    scale = np.array([127.0 / float(np.max(np.abs(x.astype(np.float32))))], np.float32) if static else None
    ref = kernels.int8_dense_forward(x, qw, sw, bb, input_scale=scale)
    got = kernels.int8_dense_forward(dev(x), dev(qw), dev(sw), None if bb is None else dev(bb),
                                 input_scale=None if scale is None else dev(scale), out=poisoned((rows, n), dtype))
    check("int8_dense_forward", _label(dtype), got, ref.astype(np.float64), f"{rows}x{k}->{n} static={static}",
          tol=EXACT_TOL[np.dtype(dtype)])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows, k, n", SHAPES)
@pytest.mark.parametrize("static", [False, True])
def test_float8_dense_matches_numpy(rng, dtype, rows, k, n, static):
    w, b = _weights(rng, n, k)
    qs, ds = Q.compute_float8_scale(np.max(np.abs(w)))
    qw, sw = Q.float8_to_bits(Q.quantize_float8(w, qs)), np.array([ds], np.float32)
    x = _x(rng, (rows, k), dtype)
    bb = b.astype(dtype)
    scale = np.array([float(np.max(np.abs(x.astype(np.float32)))) / 448.0], np.float32) if static else None
    ref = kernels.float8_dense_forward(x, qw, sw, bb, input_scale=scale)
    with config.override(allow_tf32=False):
        got = kernels.float8_dense_forward(dev(x), dev(qw), dev(sw), dev(bb),
                                       input_scale=None if scale is None else dev(scale),
                                       out=poisoned((rows, n), dtype))
    qx, x_scales = kernels.quantize_float8(x, scale=scale)  # the GPU's E4M3 activations (tested equal above)
    fx, fw = Q.float8_from_bits(qx).astype(np.float64), Q.float8_from_bits(qw).astype(np.float64)
    abs_products = (np.abs(fx) @ np.abs(fw).T) * (float(x_scales[1]) * float(sw[0]))
    lt = cuda_quant.lt_path("float8", n, k, dtype, 0)
    plan = _lt_plan_for("float8", n, rows, k, dtype) if lt else None
    if lt:  # these shapes must take the real FP8 GEMM, not the widened fallback
        assert plan is not None, f"{rows}x{k}->{n} {dtype}: no cuBLASLt plan (refused: {cuda_quant._LT_REFUSED})"
        print(plan)
    _assert_fp8_gemm_bound("float8_dense_forward", got, ref.astype(np.float64), abs_products, dtype,
                           f"{rows}x{k}->{n} static={static} {plan!r}", extra=np.abs(bb.astype(np.float64)))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("path", ["dequantize", "fused"])
@pytest.mark.parametrize("rows, k, n, group", [(37, 256, 32, 128), (70, 300, 10, 64), (3, 784, 130, 128)])
def test_int4_dense_paths_match_numpy(rng, monkeypatch, dtype, path, rows, k, n, group):
    from dnnbind.kernels._cuda import quant

    monkeypatch.setattr(quant, "INT4_PATH", path)
    w, b = _weights(rng, n, k)
    q4, s4 = Q.abs_max_quantize_grouped(w, group)
    packed = Q.pack_int4(q4, axis=1)[0]
    x = _x(rng, (rows, k), dtype)
    bb = b.astype(dtype)
    ref = kernels.int4_dense_forward(x, packed, s4, bb, in_features=k, group_size=group)
    with config.override(allow_tf32=False):
        got = kernels.int4_dense_forward(dev(x), dev(packed), dev(s4), dev(bb), in_features=k, group_size=group,
                                     out=poisoned((rows, n), dtype))
    # the dequantize path rounds the weight to the input dtype before the GEMM
    tol = GEMM_TOL[np.dtype(dtype)] * (2 if path == "dequantize" else 1)
    check("int4_dense_forward", _label(dtype), got, ref.astype(np.float64), f"{path} {rows}x{k}->{n} g{group}",
          tol=tol)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode", ["int8", "float8", "int4"])
def test_dequantize_weight_matches_numpy_exactly(rng, dtype, mode):
    w = rng.standard_normal((24, 90)).astype(np.float32)
    if mode == "int8":
        q, s = Q.abs_max_quantize(w, axis=1)
        s, extra = s.reshape(-1), {}
    elif mode == "float8":
        qs, ds = Q.compute_float8_scale(np.max(np.abs(w)))
        q, s, extra = Q.float8_to_bits(Q.quantize_float8(w, qs)), np.array([ds], np.float32), {}
    else:
        q4, s = Q.abs_max_quantize_grouped(w, 32)
        q, extra = Q.pack_int4(q4, axis=1)[0], {"in_features": 90, "group_size": 32}
    ref = kernels.dequantize_weight(q, s, mode=mode, dtype=dtype, **extra)
    got = kernels.dequantize_weight(dev(q), dev(s), mode=mode, dtype=dtype, out=poisoned((24, 90), dtype), **extra)
    np.testing.assert_array_equal(_host(got).astype(np.float32), ref.astype(np.float32))


# ----------------------------------------------------------------------------- models
@pytest.mark.parametrize("mode", ["int8", "float8", "int4"])
def test_quantized_model_predicts_on_cuda_as_on_numpy(rng, mode):
    dnnbind.utils.set_random_seed(5)
    model = dnnbind.Sequential([layers.Input((8, 8, 4)), layers.Conv2D(16, 3, activation="relu"), layers.Flatten(),
                                layers.Dense(128, activation="relu"), layers.Dense(10, activation="softmax")])
    model.to("cuda")
    x = rng.standard_normal((256, 8, 8, 4)).astype(np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        model.quantize(mode, calibration_data=x[:64] if mode != "int4" else None, group_size=64)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # a step that cannot be captured warns
        with config.override(allow_tf32=False):
            got = [model.predict(x, batch_size=64, verbose=0) for _ in range(3)]  # eager, captured, replayed
    if mode == "float8" and cuda.CudaDevice().compute_capability >= (8, 9):
        # Dense(128) on the 576 flattened features takes the real FP8 GEMM (Dense(10): out % 16, widened)
        assert _lt_plan_for("float8", 128, 64, 576, np.float32) is not None
    model.to("cpu")
    ref = model.predict(x, batch_size=64, verbose=0)
    # int8/float8 quantize activations: a last-bit difference of the float conv (cuDNN vs NumPy) may move
    # an activation across a rounding boundary now and then; int4 quantizes weights only
    tol = 1e-4 if mode == "int4" else 1e-2
    for g in got:
        check("quantized_model_predict", "float32", g, ref.astype(np.float64), mode, tol=tol)
        assert np.mean(np.argmax(g, 1) == np.argmax(ref, 1)) > 0.98


# ----------------------------------------------------------------------------- diagnostics
def test_cublaslt_fp8_scale_pointer_4_bytes_in_runs_or_is_refused_cleanly(rng):
    """The first dense FP8 path passed the activation scale 4 bytes into a pair (CUBLAS_STATUS_NOT_SUPPORTED
    on H200): cuBLASLt either computes the right thing with such a pointer, or matmul_tn refuses it with
    LtNotSupportedError and writes nothing. Either way is fine; anything else is a bug. Last in the file:
    it hands cuBLASLt an odd pointer."""
    from dnnbind import cublas

    if cuda.CudaDevice().compute_capability < (8, 9):
        pytest.skip("FP8 GEMMs need sm_89+")
    m, n, k = 32, 24, 96  # a shape no other test caches a plan for
    a = Q.float8_to_bits(Q.quantize_float8(rng.standard_normal((m, k)), 64.0))
    b = Q.float8_to_bits(Q.quantize_float8(rng.standard_normal((n, k)), 64.0))
    scales = np.array([0.015625, 0.03125], np.float32)
    d = poisoned((n, m), np.float32)
    s, ws, ws_bytes = _workspace()
    da, db, ds = dev(a), dev(b), dev(scales)
    try:
        cublas.matmul_tn("float8", m, n, k, int(da.ptr), int(db.ptr), int(d.ptr), d_dtype=np.float32, stream=s,
                         workspace=ws, workspace_bytes=ws_bytes, a_scale=int(ds.ptr), b_scale=int(ds.ptr) + 4)
    except LtNotSupportedError as exc:
        print("refused:", exc.context.get("tried"))
        assert np.all(np.isnan(_host(d))), "a refused matmul wrote into D"
        return
    fa, fb = Q.float8_from_bits(a).astype(np.float64), Q.float8_from_bits(b).astype(np.float64)
    scale = float(scales[0]) * float(scales[1])
    print("ran:", _lt_plan_for("float8", m, n, k, np.float32))
    _assert_fp8_gemm_bound("cublaslt_fp8_scale_at_4", d, (fb @ fa.T) * scale, (np.abs(fb) @ np.abs(fa).T) * scale,
                           np.float32, f"m{m} n{n} k{k}")


# ----------------------------------------------------------------------------- vector paths
def _bits(a) -> np.ndarray:
    return np.asarray(a.to_host() if hasattr(a, "to_host") else a).view(np.uint8)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(33, 41), (64, 256), (5, 3)])
@pytest.mark.parametrize("offset", [0, 1])
def test_static_quantizers_vector_path_tails_and_misaligned_input_exact(rng, dtype, shape, offset):
    """quant_static_int8 / quant_fp8 with 16-byte loads (offset 0; sizes with and without a tail) and the
    scalar path (x one item past a 16-byte boundary) equal NumPy bit for bit."""
    x = _x(rng, shape, dtype)
    x.flat[:4] = np.array([0.0125, -0.0375, 1000.0, -3.0], np.float32).astype(dtype)  # ties at 1/80, saturation
    scale = np.array([40.0], np.float32)
    q, _ = kernels.quantize_int8(dev_offset(x, offset), scale=dev(scale))
    np.testing.assert_array_equal(_host(q), kernels.quantize_int8(x, scale=scale)[0])
    fscale = np.array([0.5], np.float32)  # quantize scale 2, exact
    q, _ = kernels.quantize_float8(dev_offset(x, offset), scale=dev(fscale))
    np.testing.assert_array_equal(_host(q), kernels.quantize_float8(x, scale=fscale)[0])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows, k, n", [(37, 64, 32), (33, 41, 40), (6, 48, 20)])
@pytest.mark.parametrize("bias", [True, False])
def test_int8_epilogue_vector_path_matches_scalar_bitwise(rng, dtype, rows, k, n, bias):
    """The int8 dense forward with every array aligned (vector epilogue where n allows) equals, bit for bit,
    the run whose kernel scale and output start one item past a 16-byte boundary (scalar epilogue), and
    NumPy within EXACT_TOL."""
    w, b = _weights(rng, n, k)
    qw, sw = Q.abs_max_quantize(w, axis=1)
    sw = sw.reshape(-1)
    x = _x(rng, (rows, k), dtype)
    bb = b.astype(dtype) if bias else None
    scale = np.array([127.0 / float(np.max(np.abs(x.astype(np.float32))))], np.float32)
    ref = kernels.int8_dense_forward(x, qw, sw, bb, input_scale=scale)
    outs = []
    for offset in (0, 1):
        nan = np.full((rows, n), np.nan, np.float32).astype(dtype)
        got = kernels.int8_dense_forward(dev_offset(x, offset), dev(qw), dev_offset(sw, offset),
                                     None if bb is None else dev_offset(bb, offset), input_scale=dev(scale),
                                     out=dev_offset(nan, offset))
        check("int8_dense_forward", _label(dtype), got, ref.astype(np.float64),
              f"{rows}x{k}->{n} offset {offset}", tol=EXACT_TOL[np.dtype(dtype)])
        outs.append(_bits(got))
    assert np.array_equal(outs[0], outs[1]), f"{rows}x{k}->{n}: vector and scalar epilogues differ"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows, k, group", [(24, 256, 32), (7, 264, 8), (5, 96, 4), (3, 90, 30)])
@pytest.mark.parametrize("offset", [0, 1])
def test_dequant_int4_vector_path_tails_and_misaligned_exact(rng, dtype, rows, k, group, offset):
    """dequant_int4 with 16-byte stores (k and group multiples of 16 bytes' worth, aligned) and its scalar
    path (group 4 for 16-bit types, odd k, or the packed weight / output one item off a 16-byte boundary)
    equal NumPy bit for bit."""
    w = rng.standard_normal((rows, k)).astype(np.float32)
    q4, s = Q.abs_max_quantize_grouped(w, group)
    q = Q.pack_int4(q4, axis=1)[0]
    extra = {"in_features": k, "group_size": group}
    ref = kernels.dequantize_weight(q, s, mode="int4", dtype=dtype, **extra)
    nan = np.full((rows, k), np.nan, np.float32).astype(dtype)
    got = kernels.dequantize_weight(dev_offset(q, offset), dev(s), mode="int4", dtype=dtype,
                                out=dev_offset(nan, offset), **extra)
    np.testing.assert_array_equal(_host(got).astype(np.float32), ref.astype(np.float32))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(33, 41), (64, 256), (5, 3), (1, 3)])
@pytest.mark.parametrize("offset", [0, 1])
def test_abs_max_and_per_row_int8_vector_paths_tails_and_misaligned_exact(rng, dtype, shape, offset):
    """abs_max and quant_rows_int8 with 16-byte loads (offset 0; (64, 256): whole vectors; others: tails, or
    n below one vector) and their scalar paths (offset 1) equal NumPy bit for bit; each row's largest
    magnitude sits in its last column, the last vector or the tail."""
    x = _x(rng, shape, dtype)
    x[:, -1] = (np.where(np.arange(shape[0]) % 2, -1.0, 1.0) * 50.0).astype(dtype)
    np.testing.assert_array_equal(_host(kernels.abs_max(dev_offset(x, offset))), kernels.abs_max(x))
    q, s = kernels.quantize_int8(dev_offset(x, offset))
    q_ref, s_ref = kernels.quantize_int8(x)
    np.testing.assert_array_equal(_host(s), s_ref)
    np.testing.assert_array_equal(_host(q), q_ref)


# ----------------------------------------------------------------------------- fused activation
# cuBLASLt shapes (int8 and FP8), the FP8/int8 fallbacks (in % 16 != 0) with out % VW == 0 (vector epilogue)
# and not (scalar)
FUSED_SHAPES = [(37, 64, 32), (128, 784, 128), (33, 40, 10), (33, 40, 24)]


def _relu_fraction(a) -> float:
    return float(np.mean(_host(a).astype(np.float32) == 0))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows, k, n", FUSED_SHAPES)
@pytest.mark.parametrize("static", [False, True])
@pytest.mark.parametrize("bias", [True, False])
def test_int8_dense_fused_relu_matches_numpy_and_the_unfused_path(rng, dtype, rows, k, n, static, bias):
    """activation="relu" in int8_epilogue: NumPy within EXACT_TOL, and the same values as activation=None
    followed by kernels.activation_forward(relu) (relu commutes with the output rounding)."""
    w, b = _weights(rng, n, k)
    qw, sw = Q.abs_max_quantize(w, axis=1)
    sw = sw.reshape(-1)
    x = _x(rng, (rows, k), dtype)
    bb = b.astype(dtype) if bias else None
    scale = np.array([127.0 / float(np.max(np.abs(x.astype(np.float32))))], np.float32) if static else None
    ref = kernels.int8_dense_forward(x, qw, sw, bb, input_scale=scale, activation="relu")
    args = (dev(x), dev(qw), dev(sw), None if bb is None else dev(bb))
    kw = {"input_scale": None if scale is None else dev(scale)}
    got = kernels.int8_dense_forward(*args, activation="relu", out=poisoned((rows, n), dtype), **kw)
    case = f"relu {rows}x{k}->{n} static={static} bias={bias}"
    check("int8_dense_forward", _label(dtype), got, ref.astype(np.float64), case, tol=EXACT_TOL[np.dtype(dtype)])
    plain = kernels.int8_dense_forward(*args, out=poisoned((rows, n), dtype), **kw)
    unfused = kernels.activation_forward(plain, "relu")
    np.testing.assert_array_equal(_host(got).astype(np.float32), _host(unfused).astype(np.float32))
    assert 0.2 < _relu_fraction(got) < 0.8, case


def _fp8_relu_case(rng, rows, k, n, dtype, bias):
    """A float8 layer with a calibrated input scale: (x, E4M3 kernel bytes, kernel scale, bias or None, input
    scale, sum|a||b| per output with the scales applied: the FP8 bound's measure)."""
    w, b = _weights(rng, n, k)
    qs, ds = Q.compute_float8_scale(np.max(np.abs(w)))
    qw, sw = Q.float8_to_bits(Q.quantize_float8(w, qs)), np.array([ds], np.float32)
    x = _x(rng, (rows, k), dtype)
    bb = b.astype(dtype) if bias else None
    scale = np.array([float(np.max(np.abs(x.astype(np.float32)))) / 448.0], np.float32)
    qx, x_scales = kernels.quantize_float8(x, scale=scale)
    fx, fw = Q.float8_from_bits(qx).astype(np.float64), Q.float8_from_bits(qw).astype(np.float64)
    abs_products = (np.abs(fx) @ np.abs(fw).T) * (float(x_scales[1]) * float(sw[0]))
    return x, qw, sw, bb, scale, abs_products


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows, k, n", FUSED_SHAPES)
@pytest.mark.parametrize("bias", [True, False])
def test_float8_dense_fused_relu_matches_numpy_and_the_unfused_path(rng, dtype, rows, k, n, bias):
    """activation="relu" (cuBLASLt RELU_BIAS / RELU epilogue, or bias_add + relu after, or fp8_epilogue):
    within the FP8 accumulation bound of NumPy, and of activation=None followed by a relu (twice the bound:
    the two GEMMs may take different algorithms)."""
    x, qw, sw, bb, scale, abs_products = _fp8_relu_case(rng, rows, k, n, dtype, bias)
    ref = kernels.float8_dense_forward(x, qw, sw, bb, input_scale=scale, activation="relu").astype(np.float64)
    ref_plain = kernels.float8_dense_forward(x, qw, sw, bb, input_scale=scale).astype(np.float64)
    args = (dev(x), dev(qw), dev(sw), None if bb is None else dev(bb))
    with config.override(allow_tf32=False):
        got = kernels.float8_dense_forward(*args, input_scale=dev(scale), activation="relu",
                                       out=poisoned((rows, n), dtype))
        plain = kernels.float8_dense_forward(*args, input_scale=dev(scale), out=poisoned((rows, n), dtype))
    # the bound of the values before the relu (relu is 1-Lipschitz)
    extra = np.abs(ref_plain) + (0.0 if bb is None else np.abs(bb.astype(np.float64)))
    lt = cuda_quant.lt_path("float8", n, k, dtype, 0)
    plan = next((p for p in lt_plans() if f" float8 m={n} n={rows} k={k} D={np.dtype(dtype)}" in repr(p)
                 and " relu setting=" in repr(p)), None)
    fused_asked = lt and (bb is None or np.dtype(dtype) != np.float32)
    if fused_asked:  # the relu went to cuBLASLt (whatever setting it took)
        assert plan is not None, f"{rows}x{k}->{n} {dtype}: no relu plan (refused: {cuda_quant._LT_REFUSED})"
    print(plan)
    case = f"relu {rows}x{k}->{n} bias={bias} {plan!r}"
    _assert_fp8_gemm_bound("float8_dense_forward(relu)", got, ref, abs_products, dtype, case, extra=extra)
    unfused = np.maximum(np.asarray(_host(plain), np.float64), 0.0)
    _assert_fp8_gemm_bound("float8_dense_forward(relu) vs unfused", got, unfused, 2.0 * abs_products, dtype, case,
                           extra=2.0 * extra)
    assert 0.2 < _relu_fraction(got) < 0.8, case


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bias", [True, False])
def test_fp8_fallback_epilogue_vector_path_matches_scalar_bitwise(rng, dtype, bias):
    """in % 16 != 0: the widened float32 GEMM and fp8_epilogue (relu on). Aligned output (vector epilogue:
    out % VW == 0) and output/bias one item off a 16-byte boundary (scalar) give the same bits, within the
    FP8 bound of NumPy."""
    rows, k, n = 33, 40, 24
    x, qw, sw, bb, scale, abs_products = _fp8_relu_case(rng, rows, k, n, dtype, bias)
    ref = kernels.float8_dense_forward(x, qw, sw, bb, input_scale=scale, activation="relu").astype(np.float64)
    extra = np.abs(kernels.float8_dense_forward(x, qw, sw, bb, input_scale=scale).astype(np.float64))
    outs = []
    for offset in (0, 1):
        nan = np.full((rows, n), np.nan, np.float32).astype(dtype)
        with config.override(allow_tf32=False):
            got = kernels.float8_dense_forward(dev(x), dev(qw), dev(sw), None if bb is None else dev_offset(bb, offset),
                                           input_scale=dev(scale), activation="relu", out=dev_offset(nan, offset))
        _assert_fp8_gemm_bound("fp8_epilogue(relu)", got, ref, abs_products, dtype, f"offset {offset}", extra=extra)
        outs.append(_bits(got))
    assert np.array_equal(outs[0], outs[1]), "vector and scalar fp8 epilogues differ"


def test_float8_dense_relu_takes_the_relu_bias_epilogue_on_a_4096_layer(rng):
    """A 4096-wide bf16 layer (the issue's MLP) runs bias and relu in cuBLASLt's epilogue (RELU_BIAS),
    within the FP8 bound of NumPy."""
    if cuda.CudaDevice().compute_capability < (8, 9):
        pytest.skip("FP8 GEMMs need sm_89+")
    rows, k, n = 256, 4096, 4096
    x, qw, sw, bb, scale, abs_products = _fp8_relu_case(rng, rows, k, n, BF16, True)
    got = kernels.float8_dense_forward(dev(x), dev(qw), dev(sw), dev(bb), input_scale=dev(scale), activation="relu",
                                   out=poisoned((rows, n), BF16))
    plans = [p for p in lt_plans() if f" float8 m={n} n={rows} k={k} D=bfloat16 bias=bfloat16 relu " in repr(p)]
    assert len(plans) == 1 and plans[0].setting == "relu-bias-epilogue", (plans, cuda_quant._LT_REFUSED)
    print(plans[0])
    ref_plain = kernels.float8_dense_forward(x, qw, sw, bb, input_scale=scale).astype(np.float64)
    ref = np.maximum(ref_plain, 0.0)
    _assert_fp8_gemm_bound("float8_dense_forward(relu) 4096", got, ref, abs_products, BF16, repr(plans[0]),
                           extra=np.abs(ref_plain) + np.abs(bb.astype(np.float64)))
    assert 0.2 < _relu_fraction(got) < 0.8


@pytest.mark.parametrize("mode", ["int8", "float8"])
@pytest.mark.parametrize("policy", ["float32", "mixed_bfloat16"])
def test_quantized_relu_mlp_predicts_on_cuda_as_on_numpy(rng, mode, policy):
    """An MLP of Dense(relu) layers, quantized and calibrated: the relu runs in the quantized op (for float8
    bf16, in cuBLASLt's epilogue); predict (eager, captured, replayed) matches the NumPy backend."""
    dnnbind.mixed_precision.set_global_policy(policy)
    try:
        dnnbind.utils.set_random_seed(7)
        model = dnnbind.Sequential([layers.Input((256,)), layers.Dense(256, activation="relu"),
                                    layers.Dense(256, activation="relu"), layers.Dense(32)])
    finally:
        dnnbind.mixed_precision.set_global_policy("float32")
    model.to("cuda")
    x = rng.standard_normal((256, 256)).astype(np.float32)
    model.quantize(mode, calibration_data=x[:64])
    assert [layer._fused_activation() for layer in model.layers] == ["relu", "relu", None]
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # a step that cannot be captured warns
        with config.override(allow_tf32=False):
            got = [model.predict(x, batch_size=64, verbose=0) for _ in range(3)]  # eager, captured, replayed
    if mode == "float8" and policy == "mixed_bfloat16" and cuda.CudaDevice().compute_capability >= (8, 9):
        plan = next((p for p in lt_plans() if " float8 m=256 n=64 k=256 D=bfloat16 bias=bfloat16 relu " in repr(p)),
                    None)
        assert plan is not None, cuda_quant._LT_REFUSED
        print(plan)
    model.to("cpu")
    ref = model.predict(x, batch_size=64, verbose=0)
    # float8: the GPU's accumulation order may move a value across an output or next-layer rounding boundary.
    # mixed_bfloat16: the GPU rounds every layer's output to bf16 before quantizing it again (the NumPy
    # backend keeps float32), so a value near a quantization boundary moves one int8/E4M3 step; over three
    # layers that measured 1.7e-2 (int8) and 3.7e-2 (float8) on the H200
    tol = {("int8", "float32"): 1e-4, ("int8", "mixed_bfloat16"): 3e-2,
           ("float8", "float32"): 2e-2, ("float8", "mixed_bfloat16"): 6e-2}[(mode, policy)]
    for g in got:
        check("quantized_relu_mlp_predict", "float32", np.asarray(g, np.float64), np.asarray(ref, np.float64),
              f"{mode} {policy}", tol=tol)
