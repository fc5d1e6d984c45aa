"""Low-bit inference ops: int8, float8 (E4M3) and int4 dense layers, and the quantizers they run on.

Quantized weights use the "TN" layout cuBLASLt's int8 and FP8 kernels need: ``(out, in)`` row-major
(the reduction axis contiguous), one row per output channel, which is also a convolution's internal
KRSC/KCRS kernel flattened to ``(filters, kh * kw * in)``. The definitions (scales, rounding,
saturation) are :mod:`dnnbind.quantizers`'; each op's NumPy implementation below is the reference the
CUDA one (``kernels._cuda.quant``) is tested against.

* ``int8_dense_forward``: ``x`` quantized per row (``input_scale=None``: dynamic abs-max, one scale per
  row) or per tensor (``input_scale``: a calibrated ``(1,)`` float32 quantize scale); int8 x int8 products
  summed exactly in int32; ``y = acc / (x_scale * kernel_scale) (+ bias)`` in float32.
* ``float8_dense_forward``: ``x`` to E4M3 with one dequantize scale per tensor (dynamic: ``max|x| / 448``;
  or the calibrated ``input_scale``), E4M3 products summed in float32, ``y = acc * x_scale * kernel_scale
  (+ bias)``.
* ``int4_dense_forward``: weight-only; the weight is dequantized (``q / scale`` per group) and ``x``
  multiplies it at the input's precision.

Inputs are float16, bfloat16 or float32 ``(rows, in)``; the output has the input's dtype. The ops are
inference-only: they have no backward.

``activation`` (int8 and float8: ``None``/``"linear"`` or ``"relu"``) is applied after the bias, on the
float32 value before its rounding to the output dtype, as the fused GPU epilogues do (cuBLASLt's
``RELU_BIAS``, the ``int8_epilogue`` kernel); the NumPy references do the same. For relu the order does
not change a value (rounding is monotonic and keeps 0), so the fused op equals ``activation=None``
followed by a separate relu (up to the sign of a zero). Other activations are left to the caller (Dense
applies them after the op): cuBLASLt's GELU epilogue is not dnnbind's ``gelu`` (exact erf), and the
header does not say which GELU it computes.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import quantizers as Q
from .._validate import normalize_dtype
from ._dispatch import BFLOAT16, as_array, check_out, finish, route, to_compute

__all__ = [
    "int8_dense_forward", "float8_dense_forward", "int4_dense_forward", "dequantize_weight",
    "quantize_int8", "quantize_float8", "abs_max", "FUSED_ACTIVATIONS",
]

_INPUT_DTYPES = (np.dtype(np.float16), BFLOAT16, np.dtype(np.float32))
_I8 = np.dtype(np.int8)
_U8 = np.dtype(np.uint8)
_F32 = np.dtype(np.float32)


def _check_x(op: str, x: Any) -> None:
    if x.dtype not in _INPUT_DTYPES:
        raise TypeError(f"{op}: x must be float16, bfloat16 or float32, got {x.dtype}")
    if x.ndim != 2:
        raise ValueError(f"{op}: x must be 2-d (rows, in), got shape {tuple(x.shape)}")


def _check(op: str, name: str, a: Any, dtype: np.dtype, shape: "tuple[int, ...]") -> None:
    if a.dtype != dtype or tuple(a.shape) != tuple(shape):
        raise ValueError(f"{op}: {name} must be {dtype} of shape {tuple(shape)}, got {a.dtype} of shape "
                         f"{tuple(a.shape)}")


def _check_bias(op: str, x: Any, bias: Any, n: int) -> Any:
    if bias is None:
        return None
    bias = as_array(bias)
    _check(op, "bias", bias, x.dtype, (n,))
    return bias


def _check_input_scale(op: str, input_scale: Any) -> Any:
    if input_scale is None:
        return None
    input_scale = as_array(input_scale)
    _check(op, "input_scale", input_scale, _F32, (1,))
    return input_scale


#: activations the int8/float8 dense ops apply themselves (fused into their epilogue on the GPU)
FUSED_ACTIVATIONS = ("relu",)


def _check_activation(op: str, activation: Any) -> "str | None":
    """``None`` (also for "linear") or one of :data:`FUSED_ACTIVATIONS`."""
    if activation is None or activation == "linear":
        return None
    if activation not in FUSED_ACTIVATIONS:
        raise ValueError(f"{op}: activation must be None, 'linear' or one of {FUSED_ACTIVATIONS}, got {activation!r} "
                         "(apply other activations after the op)")
    return activation


def _activate_np(y: np.ndarray, activation: "str | None") -> np.ndarray:
    """The fused activation on the float32 (or float64) value, before the rounding to the output dtype."""
    if activation == "relu":
        return np.where(y < 0, y.dtype.type(0), y)  # NaN stays NaN, as the kernels' (v < 0 ? 0 : v)
    return y


def _quantized_dense_args(op: str, x: Any, kernel: Any, kernel_scale: Any, bias: Any, input_scale: Any, out: Any,
                          mode: str) -> "tuple[Any, ...]":
    """The checked arguments of ``int8_dense_forward`` / ``float8_dense_forward``: ``x`` (rows, in); the int8
    or E4M3-byte ``(out, in)`` kernel with its float32 scale (``(out,)`` int8, ``(1,)`` float8); ``bias``;
    ``input_scale``; ``out``."""
    x = as_array(x)
    _check_x(op, x)
    kernel, kernel_scale = as_array(kernel), as_array(kernel_scale)
    want = _I8 if mode == "int8" else _U8
    if kernel.dtype != want or kernel.ndim != 2:
        what = "int8" if mode == "int8" else "uint8 (the bytes of E4M3 values)"
        raise ValueError(f"{op}: kernel must be a 2-d {what} (out, in) array, got {kernel.dtype} of shape "
                         f"{tuple(kernel.shape)}")
    n, k = int(kernel.shape[0]), int(kernel.shape[1])
    if int(x.shape[1]) != k:
        raise ValueError(f"{op}: x has {x.shape[1]} features but kernel (out, in) = {tuple(kernel.shape)} expects {k}")
    _check(op, "kernel_scale", kernel_scale, _F32, (n,) if mode == "int8" else (1,))
    bias = _check_bias(op, x, bias, n)
    input_scale = _check_input_scale(op, input_scale)
    check_out(op, out, (int(x.shape[0]), n), x.dtype)
    return x, kernel, kernel_scale, bias, input_scale


# ----------------------------------------------------------------------------- quantizers (ops)

def quantize_int8(x: Any, *, scale: Any = None, stream: Any = None) -> "tuple[Any, Any]":
    """``(q int8 (rows, in), scale float32)``: per-row abs-max (``scale=None``; scale ``(rows,)``) or the given
    ``(1,)`` quantize scale (returned as is)."""
    op = "quantize_int8"
    x = as_array(x)
    _check_x(op, x)
    scale = _check_input_scale(op, scale)
    impl = route(op, "quant", x=x, scale=scale)
    if impl is not None:
        return impl.quantize_int8(x, scale=scale, stream=stream)
    return _quantize_int8_np(x, scale)


def _quantize_int8_np(x: np.ndarray, scale: "np.ndarray | None") -> "tuple[np.ndarray, np.ndarray]":
    xf = x.astype(np.float32)
    if scale is None:
        q, s = Q.abs_max_quantize(xf, axis=1)
        return q, s.reshape(-1)
    return Q.quantize_int(xf, scale[0]), scale


def quantize_float8(x: Any, *, scale: Any = None, stream: Any = None) -> "tuple[Any, Any]":
    """``(q, scales)``: ``q`` the E4M3 bytes (uint8, shape of ``x``); ``scales`` float32 ``(2,)`` =
    (quantize scale, dequantize scale), from ``max|x|`` (``scale=None``) or from the given ``(1,)``
    dequantize scale ``d`` as ``(1 / d, d)``."""
    op = "quantize_float8"
    x = as_array(x)
    _check_x(op, x)
    scale = _check_input_scale(op, scale)
    impl = route(op, "quant", x=x, scale=scale)
    if impl is not None:
        return impl.quantize_float8(x, scale=scale, stream=stream)
    return _quantize_float8_np(x, scale)


def _float8_scales_np(x: np.ndarray, scale: "np.ndarray | None") -> np.ndarray:
    if scale is None:
        qs, ds = Q.compute_float8_scale(np.max(np.abs(x.astype(np.float32))) if x.size else 0.0)
    else:
        ds = np.float32(scale[0])
        qs = np.float32(1.0) / ds
    return np.array([qs, ds], np.float32)


def _quantize_float8_np(x: np.ndarray, scale: "np.ndarray | None") -> "tuple[np.ndarray, np.ndarray]":
    scales = _float8_scales_np(x, scale)
    return Q.float8_to_bits(Q.quantize_float8(x, scales[0])), scales


def abs_max(x: Any, *, stream: Any = None) -> Any:
    """``max|x|`` over the whole array as a ``(1,)`` float32 array (on the device for a DeviceArray; NaN
    propagates on NumPy and counts as the largest value on CUDA)."""
    op = "abs_max"
    x = as_array(x)
    if x.dtype not in _INPUT_DTYPES:
        raise TypeError(f"{op}: x must be float16, bfloat16 or float32, got {x.dtype}")
    impl = route(op, "quant", x=x)
    if impl is not None:
        return impl.abs_max(x, stream=stream)
    return np.array([np.max(np.abs(x.astype(np.float32))) if x.size else 0.0], np.float32)


# ----------------------------------------------------------------------------- dense layers

def int8_dense_forward(x: Any, kernel: Any, kernel_scale: Any, bias: Any = None, *, input_scale: Any = None,
                       activation: "str | None" = None, out: Any = None, stream: Any = None) -> Any:
    """``activation(x (rows, in) @ dequant(kernel (out, in) int8).T (+ bias))`` with int8 activations (see the
    module).

    ``kernel_scale``: float32 ``(out,)``, ``127 / max|w|`` per output channel; ``input_scale``: None
    (dynamic, per row) or a calibrated float32 ``(1,)`` quantize scale; ``activation``: None, "linear" or
    "relu" (on the float32 value, before the rounding to ``x``'s dtype).
    """
    op = "int8_dense_forward"
    x, kernel, kernel_scale, bias, input_scale = _quantized_dense_args(op, x, kernel, kernel_scale, bias, input_scale,
                                                                       out, "int8")
    activation = _check_activation(op, activation)
    impl = route(op, "quant", x=x, kernel=kernel, kernel_scale=kernel_scale, bias=bias, input_scale=input_scale,
                 out=out)
    if impl is not None:
        return impl.int8_dense_forward(x, kernel, kernel_scale, bias, input_scale=input_scale, activation=activation,
                                       out=out, stream=stream)
    q, sx = _quantize_int8_np(x, input_scale)
    # float64 products and sums of integers below 2**53 are exact: the int32 accumulator, through BLAS
    acc = (q.astype(np.float64) @ kernel.astype(np.float64).T).astype(np.float32)
    sx = sx.reshape(-1, 1) if input_scale is None else sx.reshape(1, 1)
    y = acc / (sx * kernel_scale.reshape(1, -1))
    if bias is not None:
        y = y + to_compute(bias)
    return finish(_activate_np(y, activation), out, x.dtype)


def float8_dense_forward(x: Any, kernel: Any, kernel_scale: Any, bias: Any = None, *, input_scale: Any = None,
                         activation: "str | None" = None, out: Any = None, stream: Any = None) -> Any:
    """``activation(x (rows, in) @ dequant(kernel (out, in) E4M3 bytes).T (+ bias))`` with E4M3 activations.

    ``kernel_scale``: float32 ``(1,)`` dequantize scale (``max|w| / 448``); ``input_scale``: None (dynamic,
    ``max|x| / 448``) or a calibrated float32 ``(1,)`` dequantize scale; ``activation``: None, "linear" or
    "relu" (after the bias, before the rounding to ``x``'s dtype: cuBLASLt's RELU_BIAS epilogue).
    """
    op = "float8_dense_forward"
    x, kernel, kernel_scale, bias, input_scale = _quantized_dense_args(op, x, kernel, kernel_scale, bias, input_scale,
                                                                       out, "float8")
    activation = _check_activation(op, activation)
    impl = route(op, "quant", x=x, kernel=kernel, kernel_scale=kernel_scale, bias=bias, input_scale=input_scale,
                 out=out)
    if impl is not None:
        return impl.float8_dense_forward(x, kernel, kernel_scale, bias, input_scale=input_scale,
                                         activation=activation, out=out, stream=stream)
    qx, scales = _quantize_float8_np(x, input_scale)
    acc = Q.float8_from_bits(qx).astype(np.float64) @ Q.float8_from_bits(kernel).astype(np.float64).T
    y = acc * (np.float64(scales[1]) * np.float64(kernel_scale[0]))
    if bias is not None:
        y = y + to_compute(bias)
    return finish(_activate_np(y.astype(np.float32), activation), out, x.dtype)


def _int4_weight(op: str, kernel: Any, kernel_scale: Any, in_features: Any, group_size: Any) -> "tuple":
    kernel, kernel_scale = as_array(kernel), as_array(kernel_scale)
    if isinstance(in_features, bool) or not isinstance(in_features, int) or in_features < 1:
        raise ValueError(f"{op}: in_features must be a positive int, got {in_features!r}")
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 2 or group_size % 2:
        raise ValueError(f"{op}: group_size must be an even int >= 2, got {group_size!r}")
    if kernel.dtype != _U8 or kernel.ndim != 2 or int(kernel.shape[1]) != -(-in_features // 2):
        raise ValueError(f"{op}: kernel must be uint8 (out, ceil(in / 2)) = (out, {-(-in_features // 2)}) packed "
                         f"int4, got {kernel.dtype} of shape {tuple(kernel.shape)}")
    n = int(kernel.shape[0])
    _check(op, "kernel_scale", kernel_scale, _F32, (n, -(-in_features // group_size)))
    return kernel, kernel_scale, n


def dequantize_weight(kernel: Any, kernel_scale: Any, *, mode: str, dtype: Any, in_features: Any = None,
                      group_size: Any = None, out: Any = None, stream: Any = None) -> Any:
    """A quantized ``(out, in)`` weight back in ``dtype`` (float16, bfloat16 or float32), float32 arithmetic:

    * ``"int8"``: ``q / kernel_scale[out]`` (``kernel`` int8, ``kernel_scale`` ``(out,)``);
    * ``"float8"``: ``e4m3(q) * kernel_scale[0]`` (``kernel`` the E4M3 bytes, ``kernel_scale`` ``(1,)``);
    * ``"int4"``: ``q / kernel_scale[out, in // group_size]`` (``kernel`` packed uint8 ``(out, ceil(in / 2))``,
      ``in_features`` and ``group_size`` required).
    """
    op = "dequantize_weight"
    Q.check_mode(mode, op)
    dtype = normalize_dtype(dtype, f"{op}: dtype")
    if dtype not in _INPUT_DTYPES:
        raise TypeError(f"{op}: dtype must be float16, bfloat16 or float32, got {dtype}")
    kernel, kernel_scale = as_array(kernel), as_array(kernel_scale)
    if mode == "int4":
        kernel, kernel_scale, n = _int4_weight(op, kernel, kernel_scale, in_features, group_size)
        k = in_features
    else:
        want = _I8 if mode == "int8" else _U8
        if kernel.dtype != want or kernel.ndim != 2:
            raise ValueError(f"{op}: a {mode} kernel must be 2-d {want} (out, in), got {kernel.dtype} of shape "
                             f"{tuple(kernel.shape)}")
        n, k = int(kernel.shape[0]), int(kernel.shape[1])
        _check(op, "kernel_scale", kernel_scale, _F32, (n,) if mode == "int8" else (1,))
    check_out(op, out, (n, k), dtype)
    impl = route(op, "quant", kernel=kernel, kernel_scale=kernel_scale, out=out)
    if impl is not None:
        return impl.dequantize_weight(kernel, kernel_scale, mode=mode, dtype=dtype, in_features=k,
                                      group_size=group_size, out=out, stream=stream)
    return finish(_dequantize_np(kernel, kernel_scale, mode, k, group_size), out, dtype)


def _dequantize_np(kernel: np.ndarray, kernel_scale: np.ndarray, mode: str, k: int, group_size: Any) -> np.ndarray:
    if mode == "int8":
        return kernel.astype(np.float32) / kernel_scale.reshape(-1, 1)
    if mode == "float8":
        return Q.float8_from_bits(kernel).astype(np.float32) * kernel_scale[0]
    return Q.dequantize_grouped(Q.unpack_int4(kernel, k, axis=1), kernel_scale, group_size)


def int4_dense_forward(x: Any, kernel: Any, kernel_scale: Any, bias: Any = None, *, in_features: int,
                       group_size: int = Q.DEFAULT_INT4_GROUP_SIZE, out: Any = None, stream: Any = None) -> Any:
    """``x (rows, in) @ dequant(kernel).T (+ bias)`` with a packed int4 ``(out, ceil(in / 2))`` weight and
    float32 ``(out, ceil(in / group_size))`` scales; ``x`` is not quantized. CUDA: dequantize to ``x``'s dtype
    then cuBLAS, or one fused NVRTC kernel (``kernels._cuda.quant.INT4_PATH``)."""
    op = "int4_dense_forward"
    x = as_array(x)
    _check_x(op, x)
    kernel, kernel_scale, n = _int4_weight(op, kernel, kernel_scale, in_features, group_size)
    if int(x.shape[1]) != in_features:
        raise ValueError(f"{op}: x has {x.shape[1]} features, in_features is {in_features}")
    bias = _check_bias(op, x, bias, n)
    check_out(op, out, (int(x.shape[0]), n), x.dtype)
    impl = route(op, "quant", x=x, kernel=kernel, kernel_scale=kernel_scale, bias=bias, out=out)
    if impl is not None:
        return impl.int4_dense_forward(x, kernel, kernel_scale, bias, in_features=in_features,
                                       group_size=group_size, out=out, stream=stream)
    w = _dequantize_np(kernel, kernel_scale, "int4", in_features, group_size)
    y = to_compute(x) @ w.T
    if bias is not None:
        y = y + to_compute(bias)
    return finish(y, out, x.dtype)
