"""Pointwise activations: cuDNN for relu, sigmoid, tanh, elu, clipped_relu and swish;
NVRTC kernels (``activation.cu``) for gelu, gelu_tanh, leaky_relu, softplus and linear.

Any shape: the array is described to cuDNN as (1, size, 1, 1). float16/bfloat16 compute
in float32 inside cuDNN and inside the kernels.
"""

from __future__ import annotations

from typing import Any

from ... import cudnn
from ..._lib import cudnn as C
from . import _common as cm

__all__ = ["activation_forward", "activation_backward", "CUDNN_KINDS", "KERNEL_KINDS"]

CUDNN_KINDS = {"sigmoid": C.ActivationMode.SIGMOID, "relu": C.ActivationMode.RELU, "tanh": C.ActivationMode.TANH,
               "clipped_relu": C.ActivationMode.CLIPPED_RELU, "elu": C.ActivationMode.ELU,
               "swish": C.ActivationMode.SWISH}
# `kind` numbers of activation.cu
KERNEL_KINDS = {"gelu": 0, "gelu_tanh": 1, "leaky_relu": 2, "softplus": 3, "linear": 4, "clipped_relu": 5}
_DEFAULT_ALPHA = {"elu": 1.0, "clipped_relu": 6.0, "leaky_relu": 0.2}


def _act_desc(kind: str, alpha: "float | None") -> cudnn.ActivationDescriptor:
    coef = _DEFAULT_ALPHA.get(kind, 0.0) if alpha is None else alpha
    # PROPAGATE_NAN: a NaN input gives a NaN output, as NumPy's reference does (swish: beta 1).
    return cudnn.ActivationDescriptor.cached(CUDNN_KINDS[kind], float(coef), None, True)


def _uses_cudnn(kind: str, dtype: Any) -> bool:
    # cuDNN's bfloat16 clipped-relu backward disagreed with the reference on the H200
    # (cuDNN 9.19); the NVRTC kernel computes it exactly.
    return kind in CUDNN_KINDS and not (kind == "clipped_relu" and cm.suffix(dtype) == "bf16")


def _flat_desc(x: Any) -> cudnn.TensorDescriptor:
    """Any shape as (1, size, 1, 1): pointwise work does not care about the shape."""
    return cudnn.TensorDescriptor.cached((1, x.size, 1, 1), x.dtype)


def _context(function: str, kind: str, x: Any) -> dict:
    return {"function": function, "kind": kind, "shape": tuple(x.shape), "dtype": str(x.dtype)}


def activation_forward(x: Any, kind: str, *, alpha: "float | None" = None, out: Any = None,
                       stream: Any = None) -> Any:
    """``y = f(x)``; ``out`` may be ``x`` (in place)."""
    s = cm.stream_of(stream)
    y = cm.output(out, x.shape, x.dtype, s)
    if x.size == 0:
        return y
    if _uses_cudnn(kind, x.dtype):
        # Held in locals for the call: a cache may evict them meanwhile (another thread).
        handle, act, flat = cm.cudnn_handle(s), _act_desc(kind, alpha), _flat_desc(x)
        desc = flat.handle
        try:
            C.cudnnActivationForward(handle.handle, act.handle, cm.ONE.of(x.dtype), desc, x.ptr, cm.ZERO.of(x.dtype),
                                     desc, y.ptr)
        except cm.CudnnError as exc:
            exc.add_context(**_context("cudnnActivationForward", kind, x))
            raise
        return y
    if kind == "linear":
        cm.memcpy(y, x, s)
        return y
    cm.launch("activation.cu", f"act_fwd_{cm.suffix(x.dtype)}", x.size,
              (cm.p(x), cm.p(y), cm.i64(x.size), cm.i32(KERNEL_KINDS[kind]),
               cm.f64(_DEFAULT_ALPHA.get(kind, 0.0) if alpha is None else alpha)), s)
    return y


def activation_backward(dy: Any, x: Any, y: Any, kind: str, *, alpha: "float | None" = None,
                        stream: Any = None) -> Any:
    """``dx = dy * f'(x)`` (cuDNN reads y, dy and x; the kernels read dy and x)."""
    s = cm.stream_of(stream)
    dx = cm.empty(dy.shape, dy.dtype, s)
    if dy.size == 0:
        return dx
    if _uses_cudnn(kind, dy.dtype):
        handle, act, flat = cm.cudnn_handle(s), _act_desc(kind, alpha), _flat_desc(dy)
        desc = flat.handle
        try:
            C.cudnnActivationBackward(handle.handle, act.handle, cm.ONE.of(dy.dtype), desc, y.ptr, desc, dy.ptr, desc,
                                      x.ptr, cm.ZERO.of(dy.dtype), desc, dx.ptr)
        except cm.CudnnError as exc:
            exc.add_context(**_context("cudnnActivationBackward", kind, dy))
            raise
        return dx
    if kind == "linear":
        cm.memcpy(dx, dy, s)
        return dx
    cm.launch("activation.cu", f"act_bwd_{cm.suffix(dy.dtype)}", dy.size,
              (cm.p(dy), cm.p(x), cm.p(dx), cm.i64(dy.size), cm.i32(KERNEL_KINDS[kind]),
               cm.f64(_DEFAULT_ALPHA.get(kind, 0.0) if alpha is None else alpha)), s)
    return dx
