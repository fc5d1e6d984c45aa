"""``keras.ops.nn``: the neural-network family, one namespace over its modules (``_activations``,
``_conv``, ``_pool``, ``_norm``, ``_losses_ops``, ``_attention``), plus the small ops that belong to none
of them: ``multi_hot``, ``psnr``, ``depth_to_space`` and ``space_to_depth``.

(``relu``, ``sigmoid``, ``tanh``, ``softplus``, ``silu``/``swish`` live in ``_elementwise`` and ``one_hot``
in ``_indexing``: they are ``keras.ops`` names too.)
"""

from __future__ import annotations

import math
from typing import Any

from ..autodiff.tensor import Tensor
from . import _activations, _losses_ops, _norm
from ._activations import *  # noqa: F401,F403
from ._attention import dot_product_attention  # noqa: F401
from ._conv import conv, conv_transpose, depthwise_conv, fold, separable_conv, unfold  # noqa: F401
from ._core import keras_op, np_dtype, standardize_dtype, tensors
from ._elementwise import log10, multiply, square, subtract
from ._losses_ops import *  # noqa: F401,F403
from ._nn_common import data_format as _standardize_format
from ._nn_common import op, to_dtype
from ._norm import *  # noqa: F401,F403
from ._pool import adaptive_average_pool, adaptive_max_pool, average_pool, max_pool  # noqa: F401
from ._reductions import max as _max
from ._reductions import mean as _mean

__all__ = (list(_activations.__all__) + ["dot_product_attention"]
           + ["conv", "conv_transpose", "depthwise_conv", "separable_conv", "unfold", "fold"]
           + list(_losses_ops.__all__) + list(_norm.__all__)
           + ["max_pool", "average_pool", "adaptive_max_pool", "adaptive_average_pool"]
           + ["multi_hot", "psnr", "depth_to_space", "space_to_depth"])


@keras_op(family="nn", differentiable=False)
def multi_hot(inputs: Any, num_classes: Any = None, axis: int = -1, dtype: Any = None, sparse: bool = False,
              **kwargs: Any) -> Tensor:
    """``keras.ops.multi_hot``: 1 at every class an input row holds (``(batch, num_classes)`` from ``(batch,
    n)`` integers; 1-d inputs give one row). ``num_tokens`` is accepted for ``num_classes``, as Keras."""
    if num_classes is None and "num_tokens" in kwargs:
        num_classes = kwargs.pop("num_tokens")
    if kwargs:
        raise TypeError(f"multi_hot: unexpected keyword arguments {sorted(kwargs)}")
    if num_classes is None:
        raise ValueError("multi_hot: Argument `num_classes` must be specified.")
    if sparse:
        raise ValueError("multi_hot: dnnbind has no sparse tensors (sparse=True)")
    (t,) = tensors(inputs)
    dt = np_dtype(standardize_dtype(dtype))
    hot = op("one_hot")(op("cast")(t, "int32") if t.dtype.kind != "i" or t.dtype.itemsize != 4 else t,
                        int(num_classes), axis=axis, dtype=dt)
    return _max(hot, axis=1 if t.ndim > 1 else 0)


@keras_op(family="nn")
def psnr(x1: Any, x2: Any, max_val: Any) -> Tensor:
    """``keras.ops.psnr``: the peak signal-to-noise ratio ``20 log10(max_val) - 10 log10(mean((x1 - x2)**2))``
    (a scalar, over every element)."""
    a, b = tensors(x1, x2)
    if tuple(a.shape) != tuple(b.shape):
        raise ValueError(f"psnr: Input shapes {tuple(a.shape)} and {tuple(b.shape)} must match for PSNR calculation. ")
    mse = _mean(square(subtract(a, b)))
    if isinstance(max_val, (int, float)) and not isinstance(max_val, bool):
        peak: Any = 20.0 * math.log10(float(max_val))
    else:
        (m,) = tensors(max_val)
        peak = multiply(log10(to_dtype(m, b.dtype)), 20.0)
    return subtract(peak, multiply(log10(mse), 10.0))


def _block_input(owner: str, x: Any, block_size: Any, data_format: Any) -> tuple:
    """(tensor, block size, channels_last, (n, h, w, c)) of a depth_to_space/space_to_depth call."""
    (t,) = tensors(x)
    if isinstance(block_size, bool) or not isinstance(block_size, int):
        raise TypeError(f"{owner}: block_size must be an int, got {block_size!r}")
    if block_size < 2:
        raise ValueError(f"{owner}: `block_size` must be at least 2. Received: block_size={block_size}")
    if t.ndim != 4:
        raise ValueError(f"{owner}: `{owner}` requires a 4D input tensor. Received: x.shape={tuple(t.shape)}")
    last = _standardize_format(data_format, owner) == "channels_last"
    dims = tuple(int(s) for s in t.shape)
    return t, int(block_size), last, (dims if last else (dims[0], dims[2], dims[3], dims[1]))


@keras_op(family="nn")
def depth_to_space(x: Any, block_size: int, data_format: Any = "channels_last") -> Tensor:
    """``keras.ops.depth_to_space`` (pixel shuffle): ``(N, H, W, C)`` to ``(N, H*b, W*b, C/b**2)`` (channels
    ``(bh, bw, c)``-major, as TensorFlow), or the NCHW equivalent."""
    owner = "depth_to_space"
    t, bs, last, (n, h, w, c) = _block_input(owner, x, block_size, data_format)
    reshape, transpose = op("reshape"), op("transpose")
    if c % (bs * bs):
        raise ValueError(f"{owner}: The number of channels ({c}) must be divisible by block_size**2 ({bs * bs}).")
    nc = c // (bs * bs)
    if last:
        y = transpose(reshape(t, (n, h, w, bs, bs, nc)), (0, 1, 3, 2, 4, 5))
        return reshape(y, (n, h * bs, w * bs, nc))
    y = transpose(reshape(t, (n, nc, bs, bs, h, w)), (0, 1, 4, 2, 5, 3))
    return reshape(y, (n, nc, h * bs, w * bs))


@keras_op(family="nn")
def space_to_depth(x: Any, block_size: int, data_format: Any = "channels_last") -> Tensor:
    """``keras.ops.space_to_depth`` (pixel unshuffle): the inverse of :func:`depth_to_space`."""
    owner = "space_to_depth"
    t, bs, last, (n, h, w, c) = _block_input(owner, x, block_size, data_format)
    reshape, transpose = op("reshape"), op("transpose")
    if h % bs:
        raise ValueError(f"{owner}: Height ({h}) must be divisible by block_size ({bs}).")
    if w % bs:
        raise ValueError(f"{owner}: Width ({w}) must be divisible by block_size ({bs}).")
    if last:
        y = transpose(reshape(t, (n, h // bs, bs, w // bs, bs, c)), (0, 1, 3, 2, 4, 5))
        return reshape(y, (n, h // bs, w // bs, c * bs * bs))
    y = transpose(reshape(t, (n, c, h // bs, bs, w // bs, bs)), (0, 1, 3, 5, 2, 4))
    return reshape(y, (n, c * bs * bs, h // bs, w // bs))
