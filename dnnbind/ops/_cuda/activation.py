"""Pointwise activations: cuDNN for relu, sigmoid, tanh, elu, clipped_relu and swish;
NVRTC kernels (``activation.cu``) for gelu, gelu_tanh, leaky_relu, softplus and linear.

Any shape: the array is described to cuDNN as (1, size, 1, 1). float16/bfloat16 compute
in float32 inside cuDNN and inside the kernels.
"""

from __future__ import annotations

from typing import Any

from . import _common as cm

__all__ = ["activation_forward", "activation_backward", "CUDNN_KINDS", "KERNEL_KINDS"]

# cudnnActivationMode_t
CUDNN_KINDS = {"sigmoid": 0, "relu": 1, "tanh": 2, "clipped_relu": 3, "elu": 4, "swish": 6}
# `kind` numbers of activation.cu
KERNEL_KINDS = {"gelu": 0, "gelu_tanh": 1, "leaky_relu": 2, "softplus": 3, "linear": 4, "clipped_relu": 5}
_DEFAULT_ALPHA = {"elu": 1.0, "clipped_relu": 6.0, "leaky_relu": 0.2}
_act_descs: dict = {}


def _act_desc(kind: str, alpha: "float | None") -> int:
    mode = CUDNN_KINDS[kind]
    coef = float(_DEFAULT_ALPHA.get(kind, 0.0) if alpha is None else alpha)

    def setup(handle: int) -> None:
        # PROPAGATE_NAN: a NaN input gives a NaN output, as NumPy's reference does.
        cm.cudnn_call("cudnnSetActivationDescriptor", handle, mode, 1, coef, kind=kind, coef=coef)
        if kind == "swish":
            cm.cudnn_call("cudnnSetActivationDescriptorSwishBeta", handle, 1.0, kind=kind)

    return cm.cached_descriptor(_act_descs, (mode, coef), "cudnnCreateActivationDescriptor",
                                "cudnnDestroyActivationDescriptor", setup)


def _uses_cudnn(kind: str, dtype: Any) -> bool:
    # cuDNN's bfloat16 clipped-relu backward disagreed with the reference on the H200
    # (cuDNN 9.19); the NVRTC kernel computes it exactly.
    return kind in CUDNN_KINDS and not (kind == "clipped_relu" and cm.suffix(dtype) == "bf16")


def _flat_desc(x: Any) -> int:
    return cm.tensor_desc((1, max(int(x.size), 1), 1, 1), x.dtype)


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
        desc = _flat_desc(x)
        try:
            cm.cudnn_call("cudnnActivationForward", cm.cudnn_handle(s), _act_desc(kind, alpha),
                          cm.ONE.of(x.dtype), desc, x.ptr, cm.ZERO.of(x.dtype), desc, y.ptr)
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
        desc = _flat_desc(dy)
        try:
            cm.cudnn_call("cudnnActivationBackward", cm.cudnn_handle(s), _act_desc(kind, alpha),
                          cm.ONE.of(dy.dtype), desc, y.ptr, desc, dy.ptr, desc, x.ptr, cm.ZERO.of(dy.dtype),
                          desc, dx.ptr)
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
