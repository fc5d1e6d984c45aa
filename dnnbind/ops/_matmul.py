"""Matrix products of ``keras.ops``: ``matmul`` (cuBLAS on the device, batched, broadcasting), ``dot``,
``outer``, ``inner``, ``vdot``, ``tensordot`` and ``einsum`` on top of it."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..autodiff.tensor import Tensor
from ..kernels import numeric as N
from . import _core
from ._core import is_float, keras_op, make, np_dtype, result_type, tensors, unbroadcast

__all__ = ["matmul"]


@keras_op
def matmul(x1: Any, x2: Any) -> Tensor:
    """``keras.ops.matmul``: NumPy's ``matmul`` (batch axes broadcast; 1-d operands promoted). ints and
    bool multiply in int32 (Keras's rule), float16/bfloat16 accumulate in float32."""
    a, b = tensors(x1, x2)
    dt = np_dtype(result_type(a, b))
    if dt.kind == "b" or (dt.kind in "iu" and dt.itemsize < 4):
        dt = np.dtype(np.int32)
    cast = _core.REGISTRY["cast"]["fn"]
    if a.dtype != dt:
        a = cast(a, dt)
    if b.dtype != dt:
        b = cast(b, dt)
    out = N.matmul(a.data, b.data, dtype=dt)
    if not is_float(dt):
        return Tensor(out)
    a_shape, b_shape = tuple(a.shape), tuple(b.shape)

    def backward(node: Any, g: Tensor) -> tuple:
        reshape = _core.REGISTRY["reshape"]["fn"]
        need = node.needs_input_grad
        av = reshape(a, (1,) + a_shape) if len(a_shape) == 1 else a
        bv = reshape(b, b_shape + (1,)) if len(b_shape) == 1 else b
        gv = g
        if len(a_shape) == 1 and len(b_shape) == 1:
            gv = reshape(g, (1, 1))
        elif len(a_shape) == 1:
            gv = reshape(g, tuple(g.shape[:-1]) + (1, g.shape[-1]))
        elif len(b_shape) == 1:
            gv = reshape(g, tuple(g.shape) + (1,))
        ga = gb = None
        if need[0]:
            ga = _matmul_t(gv, bv, transpose_b=True)
            ga = unbroadcast(ga, (1,) + a_shape if len(a_shape) == 1 else a_shape)
            ga = reshape(ga, a_shape)
        if need[1]:
            gb = _matmul_t(av, gv, transpose_a=True)
            gb = unbroadcast(gb, b_shape + (1,) if len(b_shape) == 1 else b_shape)
            gb = reshape(gb, b_shape)
        return ga, gb

    return make(out, (a, b), backward, "matmul")


def _matmul_t(a: Tensor, b: Tensor, transpose_a: bool = False, transpose_b: bool = False) -> Tensor:
    """``matmul`` with the last two axes of an operand transposed (no copy on the device: cuBLAS's op flags),
    differentiable."""
    out = N.matmul(a.data, b.data, transpose_a=transpose_a, transpose_b=transpose_b, dtype=a.dtype)

    def backward(node: Any, g: Tensor) -> tuple:
        ga = gb = None
        if node.needs_input_grad[0]:
            ga = _matmul_t(b, g, transpose_a=transpose_b, transpose_b=True) if transpose_a else \
                _matmul_t(g, b, transpose_b=not transpose_b)
            ga = unbroadcast(ga, tuple(a.shape))
        if node.needs_input_grad[1]:
            gb = _matmul_t(g, a, transpose_a=True, transpose_b=transpose_a) if transpose_b else \
                _matmul_t(a, g, transpose_a=not transpose_a)
            gb = unbroadcast(gb, tuple(b.shape))
        return ga, gb

    return make(out, (a, b), backward, "matmul")
