"""Low-bit inference on the GPU: NVRTC quantizers and epilogues (``quant.cu``) around cuBLASLt GEMMs.

* int8: activations quantized by ``quant_rows_int8`` (one block per row) or ``quant_static_int8``; then
  ``cublasLtMatmul`` in the "TN" layout with ``CUBLAS_COMPUTE_32I`` (exact int32 sums) and the
  ``int8_epilogue`` kernel (``acc / (sx * sw) + bias``, then the relu when asked, in float32). Shapes cuBLASLt's int8 kernels refuse (``in`` not a
  multiple of 16, ``out`` not of 4) take a float32 GEMM of the integer values instead (exact while
  ``in * 127**2 < 2**24``, i.e. ``in`` < 1040) and the same epilogue.
* float8: ``abs_max`` (atomicMax on float bits) and ``fp8_scales`` compute the activation scales on the
  device (each scale in an allocation of its own: cuBLASLt reads the dequantize one), ``quant_fp8`` writes
  E4M3 bytes (``cvt.rn.satfinite`` on sm_89+), then ``cublasLtMatmul`` with ``A/B_SCALE_POINTER`` set to
  the weight's and the activation's dequantize scales and the bias (and a relu) in its epilogue (bf16/fp16
  outputs, when cuBLASLt takes that setting; else, and for float32 outputs with a bias, ``bias_add`` and
  the relu after). Before sm_89, for ``out % 16`` or ``in % 16`` != 0, or when cuBLASLt refuses every
  setting (a RuntimeWarning, once), the E4M3 values are widened to float32 for a cuBLAS GEMM and
  ``fp8_epilogue`` scales (and applies the relu).
* int4 (weight-only): ``INT4_PATH = "dequantize"`` (default) writes the weight in the input dtype
  (``dequant_int4``) for a cuBLAS GEMM; ``"fused"`` runs ``int4_gemm``, one NVRTC kernel that dequantizes
  tiles in shared memory (no weight-sized temporary; slower at large batches). ``benchmarks/quantize.py``
  measures both. The switch is part of ``kernels.config.capture_key()``.

Nothing here reads a device value on the host: the activation scales stay on the device, so the ops
may be captured into a CUDA graph (temporaries die with the call).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ...cublas import get_handle as _cublas_handle
from ...cublas import matmul_tn, tn_supported
from ...cublas import LtNotSupportedError
from ...cuda.device import CudaDevice
from . import _common as cm
from .activation import activation_forward
from .conv import bias_add
from .dense import _gemm

__all__ = ["int8_dense_forward", "float8_dense_forward", "int4_dense_forward", "dequantize_weight",
           "quantize_int8", "quantize_float8", "abs_max", "INT4_PATH", "lt_path"]

_SOURCE = "quant.cu"
_I8 = np.dtype(np.int8)
_U8 = np.dtype(np.uint8)
_I32 = np.dtype(np.int32)

#: int4 GEMM: "dequantize" (dequantize to the input dtype, then cuBLAS) or "fused" (one NVRTC kernel)
INT4_PATH = "dequantize"
_INT4_PATHS = ("dequantize", "fused")

cm.config().register_switches(__name__, lambda: (INT4_PATH,))

_capabilities: dict[int, tuple[int, int]] = {}


def _capability(device: int) -> "tuple[int, int]":
    cc = _capabilities.get(device)
    if cc is None:
        cc = _capabilities[device] = tuple(CudaDevice(device).compute_capability)
    return cc


# (device, kind, rows, out, in, dtype[, epilogue steps asked]) cuBLASLt refused: the float path runs them
_LT_REFUSED: set = set()


_lt_paths: "dict[tuple, bool]" = {}  # lt_path's answers: one per layer geometry, asked on every call


def lt_path(kind: str, out_features: int, in_features: int, dtype: Any, device: int) -> bool:
    """Whether a ``kind`` ("int8"/"float8") dense layer of these sizes runs on cuBLASLt on ``device``."""
    key = (kind, out_features, in_features, dtype, device)
    hit = _lt_paths.get(key)
    if hit is None:
        d_dtype = _I32 if kind == "int8" else np.dtype(dtype)
        hit = _lt_paths[key] = tn_supported(kind, out_features, in_features, d_dtype, _capability(device))
    return hit


def _lt_matmul(kind: str, key: tuple, *args: Any, **kwargs: Any) -> "tuple[str, ...] | None":
    """``matmul_tn(kind, ...)``: the epilogue steps it left to the caller (see ``matmul_tn``), or None (and a
    warning, once) when cuBLASLt runs none of the settings tried; nothing was queued then, so the caller's
    float path may run instead."""
    if key in _LT_REFUSED:
        return None
    try:
        return matmul_tn(kind, *args, **kwargs)
    except LtNotSupportedError as exc:
        _LT_REFUSED.add(key)
        cm.warn_once(("quant-lt", key), f"{kind} dense (rows, out, in) = {key[2:5]}: cuBLASLt refused it "
                     f"({exc.context.get('tried')}); using the float32 GEMM of the widened values instead")
        return None


def _workspace(s) -> "tuple[int, int]":
    h = _cublas_handle(s)
    ws = h.workspace
    return (int(ws.ptr), int(ws.nbytes)) if ws is not None else (0, 0)


def _bias_ptr(bias: Any) -> Any:
    return cm.p(bias) if bias is not None else cm.p(0)


def _threads(n: int, dtype: Any, vec: bool) -> int:
    """Items to launch a flat kernel over: one per vector (rounded up: n < VW still launches, for the scalar
    tail) or one per element."""
    return -(-int(n) // cm.vector_width(dtype)) if vec else int(n)


# ----------------------------------------------------------------------------- quantizers

def _quantize_int8(x: Any, scale: Any, s) -> "tuple[Any, Any, int]":
    rows, cols = int(x.shape[0]), int(x.shape[1])
    q = cm.empty((rows, cols), _I8, s)
    sfx = cm.suffix(x.dtype)
    if scale is None:
        sx = cm.empty((rows,), cm.F32, s)
        # whole vectors per row: every row starts aligned when x and q do
        vec = cols % cm.vector_width(x.dtype) == 0 and cm.aligned16(x, q)
        cm.launch_rows(_SOURCE, f"quant_rows_int8_{sfx}", rows, (cm.p(x), cm.p(q), cm.p(sx), cm.i64(rows),
                                                                cm.i64(cols), cm.i32(int(vec))), s, block=256)
        return q, sx, 1
    vec = cm.aligned16(x, q)
    cm.launch(_SOURCE, f"quant_static_int8_{sfx}", _threads(rows * cols, x.dtype, vec),
              (cm.p(x), cm.p(q), cm.p(scale), cm.i64(rows * cols), cm.i32(int(vec))), s)
    return q, scale, 0


def quantize_int8(x: Any, *, scale: Any = None, stream: Any = None) -> "tuple[Any, Any]":
    s = cm.stream_of(stream)
    q, sx, _ = _quantize_int8(x, scale, s)
    return q, sx


def _abs_max_bits(x: Any, s) -> Any:
    # int32 holds the kernel's unsigned float bits: those of |x| (NaN included) stay below 2**31
    out = cm.empty((1,), _I32, s)
    cm.memset(out, 0, s)
    n = cm.size_of(x.shape)
    vec = cm.aligned16(x)
    cm.launch(_SOURCE, f"abs_max_{cm.suffix(x.dtype)}", _threads(n, x.dtype, vec),
              (cm.p(x), cm.p(out), cm.i64(n), cm.i32(int(vec))), s)
    return out


def abs_max(x: Any, *, stream: Any = None) -> Any:
    s = cm.stream_of(stream)
    return _abs_max_bits(x, s).view(cm.F32)


def _float8_scales(x: Any, scale: Any, s, quant_out: Any, dequant_out: Any) -> None:
    """Write the quantize scale to ``quant_out`` and the dequantize scale to ``dequant_out`` (float32 pointers)."""
    # the amax buffer dies with this call: freed on the stream, after fp8_scales read it
    args = (cm.p(_abs_max_bits(x, s)), cm.p(0)) if scale is None else (cm.p(0), cm.p(scale))
    cm.kernel(_SOURCE, "fp8_scales", s.device_index)((1, 1, 1), (32, 1, 1), args + (quant_out, dequant_out), stream=s)


def _quantize_float8_bytes(x: Any, quant_scale: Any, s) -> Any:
    q = cm.empty(tuple(int(d) for d in x.shape), _U8, s)
    n = cm.size_of(x.shape)
    vec = cm.aligned16(x, q)
    cm.launch(_SOURCE, f"quant_fp8_{cm.suffix(x.dtype)}", _threads(n, x.dtype, vec),
              (cm.p(x), cm.p(q), quant_scale, cm.i64(n), cm.i32(int(vec))), s)
    return q


def quantize_float8(x: Any, *, scale: Any = None, stream: Any = None) -> "tuple[Any, Any]":
    s = cm.stream_of(stream)
    scales = cm.empty((2,), cm.F32, s)
    _float8_scales(x, scale, s, cm.p(scales), cm.p(int(scales.ptr) + 4))
    return _quantize_float8_bytes(x, cm.p(scales), s), scales


def _widen(kernel_name: str, a: Any, s) -> Any:
    out = cm.empty(tuple(int(d) for d in a.shape), cm.F32, s)
    n = cm.size_of(a.shape)
    cm.launch(_SOURCE, kernel_name, n, (cm.p(a), cm.p(out), cm.i64(n)), s)
    return out


# ----------------------------------------------------------------------------- dense layers

def int8_dense_forward(x: Any, kernel: Any, kernel_scale: Any, bias: Any = None, *, input_scale: Any = None,
                       activation: "str | None" = None, out: Any = None, stream: Any = None) -> Any:
    s = cm.stream_of(stream)
    rows, k = int(x.shape[0]), int(x.shape[1])
    n = int(kernel.shape[0])
    y = cm.output(out, (rows, n), x.dtype, s)
    if rows == 0:
        return y
    q, sx, per_row = _quantize_int8(x, input_scale, s)
    acc = None
    if lt_path("int8", n, k, x.dtype, s.device_index):
        acc = cm.empty((rows, n), _I32, s)
        ws, ws_bytes = _workspace(s)
        if _lt_matmul("int8", (s.device_index, "int8", rows, n, k, x.dtype.str), n, rows, k, int(kernel.ptr),
                      int(q.ptr), int(acc.ptr), d_dtype=_I32, stream=s, workspace=ws, workspace_bytes=ws_bytes) is None:
            acc = None
        acc_sfx = "i32"
    if acc is None:
        acc = cm.empty((rows, n), cm.F32, s)
        _gemm(s, _widen("int8_to_f32", q, s), _widen("int8_to_f32", kernel, s), acc, rows, n, k, False, True)
        acc_sfx = "f32"
    vec = n % cm.vector_width(x.dtype) == 0 and cm.aligned16(acc, kernel_scale, bias, y)
    cm.launch(_SOURCE, f"int8_epilogue_{cm.suffix(x.dtype)}_{acc_sfx}", _threads(rows * n, x.dtype, vec),
              (cm.p(acc), cm.p(sx), cm.i64(per_row), cm.p(kernel_scale), _bias_ptr(bias), cm.p(y), cm.i64(rows),
               cm.i64(n), cm.i32(int(activation == "relu")), cm.i32(int(vec))), s)
    return y


def float8_dense_forward(x: Any, kernel: Any, kernel_scale: Any, bias: Any = None, *, input_scale: Any = None,
                         activation: "str | None" = None, out: Any = None, stream: Any = None) -> Any:
    s = cm.stream_of(stream)
    rows, k = int(x.shape[0]), int(x.shape[1])
    n = int(kernel.shape[0])
    y = cm.output(out, (rows, n), x.dtype, s)
    if rows == 0:
        return y
    # one allocation per scale: the dequantize scale is cuBLASLt's B_SCALE_POINTER and keeps the pool's
    # alignment (the second float of a pair, 4 bytes in, was refused with CUBLAS_STATUS_NOT_SUPPORTED)
    quant_scale, x_dequant = cm.empty((1,), cm.F32, s), cm.empty((1,), cm.F32, s)
    _float8_scales(x, input_scale, s, cm.p(quant_scale), cm.p(x_dequant))
    qx = _quantize_float8_bytes(x, cm.p(quant_scale), s)
    relu = activation == "relu"
    if lt_path("float8", n, k, x.dtype, s.device_index):
        wanted = (("bias",) if bias is not None else ()) + (("relu",) if relu else ())
        # the FP8 bias epilogue takes a bias of D's type for bf16/fp16 D; float32 D (bias type an exception
        # in the header, refused by PyTorch's _scaled_mm) adds it after, and then the relu, which follows it
        asked = () if bias is not None and x.dtype == cm.F32 else wanted
        ws, ws_bytes = _workspace(s)
        left = _lt_matmul("float8", (s.device_index, "float8", rows, n, k, x.dtype.str, asked), n, rows, k,
                          int(kernel.ptr), int(qx.ptr), int(y.ptr), d_dtype=x.dtype, stream=s, workspace=ws,
                          workspace_bytes=ws_bytes, a_scale=int(kernel_scale.ptr), b_scale=int(x_dequant.ptr),
                          bias=int(bias.ptr) if "bias" in asked else 0,
                          bias_dtype=x.dtype if "bias" in asked else None, relu="relu" in asked)
        if left is not None:
            # cuBLASLt did a head of `asked`, itself a head of `wanted`: the rest runs here, in order
            for step in wanted[len(asked) - len(left):]:
                if step == "bias":
                    bias_add(y, bias, layout="NHWC", out=y, stream=s)
                else:
                    activation_forward(y, "relu", out=y, stream=s)
            return y
    acc = cm.empty((rows, n), cm.F32, s)
    _gemm(s, _widen("fp8_to_f32", qx, s), _widen("fp8_to_f32", kernel, s), acc, rows, n, k, False, True)
    vec = n % cm.vector_width(x.dtype) == 0 and cm.aligned16(acc, bias, y)
    cm.launch(_SOURCE, f"fp8_epilogue_{cm.suffix(x.dtype)}", _threads(rows * n, x.dtype, vec),
              (cm.p(acc), cm.p(x_dequant), cm.p(kernel_scale), _bias_ptr(bias), cm.p(y), cm.i64(rows),
               cm.i64(n), cm.i32(int(relu)), cm.i32(int(vec))), s)
    return y


def dequantize_weight(kernel: Any, kernel_scale: Any, *, mode: str, dtype: Any, in_features: int,
                      group_size: Any = None, out: Any = None, stream: Any = None) -> Any:
    s = cm.stream_of(stream)
    n, k = int(kernel.shape[0]), int(in_features)
    w = cm.output(out, (n, k), dtype, s)
    sfx = cm.suffix(w.dtype)
    if mode == "int8":
        cm.launch(_SOURCE, f"dequant_int8_{sfx}", n * k, (cm.p(kernel), cm.p(kernel_scale), cm.p(w), cm.i64(n),
                                                          cm.i64(k)), s)
    elif mode == "float8":
        cm.launch(_SOURCE, f"dequant_fp8_{sfx}", n * k, (cm.p(kernel), cm.p(kernel_scale), cm.p(w), cm.i64(n * k)), s)
    else:
        kp, group, vw = int(kernel.shape[1]), int(group_size), cm.vector_width(w.dtype)
        vec = k % vw == 0 and kp * 2 == k and group > 0 and group % vw == 0 and cm.aligned16(kernel, w)
        cm.launch(_SOURCE, f"dequant_int4_{sfx}", n * k // (vw if vec else 1),
                  (cm.p(kernel), cm.p(kernel_scale), cm.p(w), cm.i64(n), cm.i64(k), cm.i64(kp),
                   cm.i64(int(kernel_scale.shape[1])), cm.i64(group), cm.i32(int(vec))), s)
    return w


def int4_dense_forward(x: Any, kernel: Any, kernel_scale: Any, bias: Any = None, *, in_features: int,
                       group_size: int, out: Any = None, stream: Any = None) -> Any:
    if INT4_PATH not in _INT4_PATHS:
        raise ValueError(f"dnnbind.kernels._cuda.quant.INT4_PATH must be one of {_INT4_PATHS}, got {INT4_PATH!r}")
    s = cm.stream_of(stream)
    rows, k = int(x.shape[0]), int(in_features)
    n = int(kernel.shape[0])
    y = cm.output(out, (rows, n), x.dtype, s)
    if rows == 0:
        return y
    if INT4_PATH == "fused":
        grid = (-(-n // 64), -(-rows // 64), 1)
        cm.kernel(_SOURCE, f"int4_gemm_{cm.suffix(x.dtype)}", s.device_index)(
            grid, (256, 1, 1),
            (cm.p(x), cm.p(kernel), cm.p(kernel_scale), _bias_ptr(bias), cm.p(y), cm.i64(rows), cm.i64(n), cm.i64(k),
             cm.i64(int(kernel.shape[1])), cm.i64(int(kernel_scale.shape[1])), cm.i64(group_size)), stream=s)
        return y
    w = dequantize_weight(kernel, kernel_scale, mode="int4", dtype=x.dtype, in_features=k, group_size=group_size,
                          stream=s)
    _gemm(s, x, w, y, rows, n, k, False, True)
    if bias is not None:
        bias_add(y, bias, layout="NHWC", out=y, stream=s)
    return y
