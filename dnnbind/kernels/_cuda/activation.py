"""Pointwise activations on NVRTC kernels (``activation.cu``), one per (direction, kind, dtype),
with 16-byte accesses when every array is 16-byte aligned; ``linear`` is a device copy.

``CUDNN_ACTIVATIONS = True`` sends relu, sigmoid, tanh, elu, clipped_relu and swish to
cudnnActivationForward/Backward instead (the route before issue 9, kept for comparison; the array is
described to cuDNN as (1, size, 1, 1)). float16/bfloat16 compute in float32 either way.
"""

from __future__ import annotations

from typing import Any

from ... import cudnn
from ..._lib import cudnn as C
from . import _common as cm

__all__ = ["activation_forward", "activation_backward", "CUDNN_ACTIVATIONS", "CUDNN_KINDS", "KERNEL_KINDS"]

CUDNN_ACTIVATIONS: bool = False
"""True: the kinds cuDNN offers (``CUDNN_KINDS``) run as cudnnActivationForward/Backward. On an H200 its
op_generic_tensor_kernel moved ~2.5 TB/s for relu, where the kernels here stream at memory bandwidth."""
# The switch changes the kernels a step captures: a captured step is keyed by it.
cm.config().register_switches(__name__, lambda: (CUDNN_ACTIVATIONS,))

CUDNN_KINDS = {"sigmoid": C.ActivationMode.SIGMOID, "relu": C.ActivationMode.RELU, "tanh": C.ActivationMode.TANH,
               "clipped_relu": C.ActivationMode.CLIPPED_RELU, "elu": C.ActivationMode.ELU,
               "swish": C.ActivationMode.SWISH}
# The kinds with kernels act_{fwd,bwd}_<kind>_<dtype> in activation.cu: every kind but linear (a copy).
KERNEL_KINDS = ("relu", "sigmoid", "tanh", "elu", "clipped_relu", "swish", "gelu", "gelu_tanh", "leaky_relu",
                "softplus")
_DEFAULT_ALPHA = {"elu": 1.0, "clipped_relu": 6.0, "leaky_relu": 0.2}
# What a backward kernel reads besides dy when not x alone (activation.cu's ActReads; the reference's column).
_BACKWARD_READS = {"sigmoid": "y", "tanh": "y", "elu": "xy"}
_names: dict = {}  # (direction, kind, dtype) -> kernel name, so a call formats no string


def _act_desc(kind: str, alpha: "float | None") -> cudnn.ActivationDescriptor:
    coef = _DEFAULT_ALPHA.get(kind, 0.0) if alpha is None else alpha
    # PROPAGATE_NAN: a NaN input gives a NaN output, as NumPy's reference does (swish: beta 1).
    return cudnn.ActivationDescriptor.cached(CUDNN_KINDS[kind], float(coef), None, True)


def _uses_cudnn(kind: str, dtype: Any) -> bool:
    # cuDNN's bfloat16 clipped-relu backward disagreed with the reference on the H200
    # (cuDNN 9.19); the NVRTC kernel computes it exactly.
    return (CUDNN_ACTIVATIONS and kind in CUDNN_KINDS
            and not (kind == "clipped_relu" and cm.suffix(dtype) == "bf16"))


def _kernel(direction: str, kind: str, dtype: Any) -> str:
    key = (direction, kind, dtype)
    name = _names.get(key)
    if name is None:
        name = _names[key] = f"act_{direction}_{kind}_{cm.suffix(dtype)}"
    return name


def _launch(name: str, arrays: tuple, accessed: tuple, n: int, alpha: float, s: Any) -> None:
    """``arrays`` in the kernel's order; 16-byte accesses when every array in ``accessed`` (those the
    kernel reads or writes) is 16-byte aligned: the kernel then does n // VW vectors and the last
    n % VW elements one by one."""
    vw = cm.vector_width(arrays[0].dtype)
    vec = cm.aligned16(*accessed)
    cm.launch("activation.cu", name, max(n // vw, 1) if vec else n,
              tuple(map(cm.p, arrays)) + (cm.i64(n), cm.f64(alpha), cm.i32(vec)), s)


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
    _launch(_kernel("fwd", kind, x.dtype), (x, y), (x, y), int(x.size),
            _DEFAULT_ALPHA.get(kind, 0.0) if alpha is None else alpha, s)
    return y


def activation_backward(dy: Any, x: Any, y: Any, kind: str, *, alpha: "float | None" = None,
                        stream: Any = None) -> Any:
    """``dx = dy * f'(x)`` (cuDNN reads y, dy and x; the kernels read dy and, as the NumPy reference, y for
    sigmoid and tanh, x and y for elu, x for the rest)."""
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
    reads = _BACKWARD_READS.get(kind, "x")
    accessed = (dy, x, dx) if reads == "x" else (dy, y, dx) if reads == "y" else (dy, x, y, dx)
    _launch(_kernel("bwd", kind, dy.dtype), (dy, x, y, dx), accessed, int(dy.size),
            _DEFAULT_ALPHA.get(kind, 0.0) if alpha is None else alpha, s)
    return dx
