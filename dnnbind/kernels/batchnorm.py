"""Batch normalization: training forward (with running statistics), inference forward, backward.

Modes:

* ``"spatial"``: one statistic per channel, over N, H and W (Keras BatchNormalization
  on a conv output). Parameters have shape ``(C,)``.
* ``"per_activation"``: one statistic per feature, over N only. Parameters have
  the shape of one sample, ``x.shape[1:]``.

A 2-d ``(N, C)`` input is normalised per column in either mode (parameters ``(C,)``;
``layout`` is ignored).

``gamma``, ``beta``, the running statistics and the saved statistics are float32
(float64 when ``x`` is float64), whatever ``x``'s dtype. Running statistics follow
Keras: ``running = momentum * running + (1 - momentum) * batch`` (cuDNN's exponential
factor is ``1 - momentum``); the batch variance used there is the biased one, the one the
normalisation uses (Keras 3; cuDNN and PyTorch feed the unbiased one, and the CUDA path corrects
cuDNN's update to Keras's).

What the backward needs travels with the op: the training forward returns ``(y, saved)``, a
:class:`BatchNormSaved` (the saved statistics and, on CUDA's SPATIAL_PERSISTENT path, cuDNN's
reserve space), and :func:`batchnorm_backward` takes it back. No table on the side.

Fused activation: ``batchnorm_forward_training(..., activation="relu")`` returns ``relu(bn(x))``
(one cuDNN call with CUDNN_BATCHNORM_OPS_BN_ACTIVATION on CUDA's channels-last path, else the
batch norm then the relu in place), and ``batchnorm_backward(dy, ..., activation="relu", y=y)``
takes ``dy`` w.r.t. that activated output and ``y`` itself (its mask ``y > 0`` is relu's
derivative). Every path gives the unfused ops' numbers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ._dispatch import as_array, check_float, check_out, finish, param_dtype, route, to_compute
from ._params import check_layout
from .activation import _backward as _activation_backward
from .activation import _forward as _activation_forward

__all__ = ["BN_MODES", "BN_ACTIVATIONS", "BatchNormSaved", "batchnorm_forward_training",
           "batchnorm_forward_inference", "batchnorm_backward"]

BN_MODES = ("spatial", "per_activation")
BN_ACTIVATIONS = (None, "relu")  # what the training forward may apply to its output


@dataclass(frozen=True, eq=False)
class BatchNormSaved:
    """What :func:`batchnorm_backward` needs from one :func:`batchnorm_forward_training` call.

    Made by the training forward; build one by hand (``BatchNormSaved(mean, inv_std)``) only to
    run a backward from statistics you computed yourself (no reserve: CUDA then takes the path
    that needs only the statistics, with the same numbers).

    Attributes
    ----------
    mean:
        Batch mean, parameter shape, float32 (float64 for float64 ``x``), on ``x``'s device.
    inv_std:
        ``1 / sqrt(biased_var + epsilon)``, same shape, dtype and device as ``mean``.
    reserve:
        CUDA only: the uint8 reserve-space DeviceArray that
        ``cudnnBatchNormalizationForwardTrainingEx`` (CUDNN_BATCHNORM_SPATIAL_PERSISTENT) filled
        for its backward; None on every other path. It is freed with this record.
    path:
        The implementation that produced it: ``"numpy"``, ``"cudnn_persistent"`` (the *Ex API,
        SPATIAL_PERSISTENT), ``"cudnn"`` (the legacy API), or None when built by hand.
    x_shape, x_dtype:
        Shape and dtype of the ``x`` that was normalised (for bfloat16 ``x`` run through float32
        copies on CUDA, float32): a reserve is only valid for the same ``x``. None when built by hand.
    activation:
        The activation the forward applied to its output (None or ``"relu"``); a backward given
        another one is refused (a record built by hand, ``path`` None, accepts either).
    beta:
        CUDA ``"cudnn_persistent_relu"`` path only: the beta the forward read, which
        ``cudnnBatchNormalizationBackwardEx`` takes with CUDNN_BATCHNORM_OPS_BN_ACTIVATION; else None.
    """

    mean: Any
    inv_std: Any
    reserve: Any = None
    path: "str | None" = None
    x_shape: "tuple[int, ...] | None" = None
    x_dtype: Any = None
    activation: "str | None" = None
    beta: Any = None

    def __repr__(self) -> str:
        reserve = "None" if self.reserve is None else f"{int(self.reserve.nbytes)} bytes"
        mean = np.asarray(self.mean) if not hasattr(self.mean, "shape") else self.mean
        activation = "" if self.activation is None else f", activation={self.activation!r}"
        return (f"BatchNormSaved(path={self.path!r}, x_shape={self.x_shape}, mean={tuple(mean.shape)} "
                f"{mean.dtype}, reserve={reserve}{activation})")


def _geometry(op: str, x: Any, mode: str, layout: str) -> "tuple[str, str, tuple[int, ...], tuple[int, ...]]":
    """Validate; return (mode, layout, reduction axes, parameter shape)."""
    mode = str(mode).lower()
    if mode not in BN_MODES:
        raise ValueError(f"{op}: mode must be 'spatial' or 'per_activation', got {mode!r}")
    layout = check_layout(layout)
    check_float(op, "x", x)
    if x.ndim == 2:
        return mode, layout, (0,), (x.shape[1],)
    if x.ndim != 4:
        raise ValueError(f"{op}: x must be 2-d (N, C) or 4-d, got shape {tuple(x.shape)}")
    if mode == "per_activation":
        return mode, layout, (0,), tuple(x.shape[1:])
    if layout == "NCHW":
        return mode, layout, (0, 2, 3), (x.shape[1],)
    return mode, layout, (0, 1, 2), (x.shape[3],)


def _check_activation(op: str, activation: Any) -> "str | None":
    if activation is None or (type(activation) is str and activation in BN_ACTIVATIONS):
        return activation
    raise ValueError(f"{op}: activation must be None or 'relu', got {activation!r}")


def _check_params(op: str, x: Any, shape: tuple[int, ...], *, source: "str | None" = None, **params: Any) -> None:
    """``source`` names what the parameter shape comes from (default: x and its shape)."""
    want = param_dtype(x.dtype)
    for name, p in params.items():
        if p is None:
            raise ValueError(f"{op}: {name} is required")
        if tuple(p.shape) != shape:
            raise ValueError(f"{op}: {name} has shape {tuple(p.shape)}, expected {shape} for "
                             f"{source or f'x of shape {tuple(x.shape)}'}")
        if p.dtype != want and not (p.dtype == np.float32 and want == np.float64):
            raise TypeError(f"{op}: {name} must be {want} for x of dtype {x.dtype}, got {p.dtype}")


def _check_momentum_epsilon(op: str, momentum: Any, epsilon: Any) -> "tuple[float, float]":
    momentum, epsilon = float(momentum), float(epsilon)
    if not 0.0 <= momentum <= 1.0:
        raise ValueError(f"{op}: momentum must be in [0, 1], got {momentum}")
    if epsilon <= 0:
        raise ValueError(f"{op}: epsilon must be > 0, got {epsilon}")
    return momentum, epsilon


def _broadcast(p: np.ndarray, x: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
    """View a parameter so that it broadcasts against ``x`` (reduced axes become 1)."""
    shape = [1 if i in axes else d for i, d in enumerate(x.shape)]
    return p.reshape(shape)


def batchnorm_forward_training(
    x: Any,
    gamma: Any,
    beta: Any,
    running_mean: Any,
    running_var: Any,
    *,
    momentum: float = 0.99,
    epsilon: float = 1e-3,
    mode: str = "spatial",
    layout: str = "NCHW",
    activation: "str | None" = None,
    out: Any = None,
    stream: Any = None,
) -> "tuple[Any, BatchNormSaved]":
    """Normalise with the batch statistics; update the running statistics in place.

    Returns ``(y, saved)``: ``y`` like ``x``; ``saved`` a :class:`BatchNormSaved` holding the
    batch mean and ``1 / sqrt(biased_var + epsilon)`` (parameter shape, float32) and whatever
    else the backward needs (on CUDA possibly cuDNN's reserve space); pass it to
    :func:`batchnorm_backward`.

    ``activation="relu"``: ``y = relu(bn(x))`` (the same numbers as the batch norm followed by
    ``activation_forward(y, "relu")``); pass ``y`` and the same ``activation`` to the backward.

    CUDA: ``_cuda.batchnorm.batchnorm_forward_training(x, gamma, beta, running_mean, running_var,
    momentum=momentum, epsilon=epsilon, mode=mode, layout=layout, activation=activation, out=out,
    stream=stream)`` (floats; ``mode`` lower case, ``layout`` upper case), which returns the same pair.
    """
    op = "batchnorm_forward_training"
    activation = _check_activation(op, activation)
    x = as_array(x)
    gamma, beta, running_mean, running_var = map(as_array, (gamma, beta, running_mean, running_var))
    mode, layout, axes, pshape = _geometry(op, x, mode, layout)
    _check_params(op, x, pshape, gamma=gamma, beta=beta, running_mean=running_mean, running_var=running_var)
    momentum, epsilon = _check_momentum_epsilon(op, momentum, epsilon)
    check_out(op, out, x.shape, x.dtype)
    impl = route(op, "batchnorm", x=x, gamma=gamma, beta=beta, running_mean=running_mean,
                 running_var=running_var, out=out)
    if impl is not None:
        return impl.batchnorm_forward_training(
            x, gamma, beta, running_mean, running_var, momentum=momentum, epsilon=epsilon, mode=mode,
            layout=layout, activation=activation, out=out, stream=stream,
        )
    xc = to_compute(x)
    count = x.size // int(np.prod(pshape))
    mean = xc.mean(axis=axes)
    centered = xc - _broadcast(mean, xc, axes)
    var = np.square(centered).mean(axis=axes)
    inv_std = 1.0 / np.sqrt(var + epsilon)
    scale = _broadcast(to_compute(gamma) * inv_std, xc, axes)
    centered *= scale
    centered += _broadcast(to_compute(beta), xc, axes)
    if activation is not None:
        # relu commutes with the final rounding, so this equals the separate activation_forward
        _activation_forward(centered, "relu", None, centered)
    running_mean *= momentum
    running_mean += (1 - momentum) * mean
    running_var *= momentum
    running_var += (1 - momentum) * var
    sdt = param_dtype(x.dtype)
    saved = BatchNormSaved(mean.astype(sdt, copy=False), inv_std.astype(sdt, copy=False), path="numpy",
                           x_shape=tuple(x.shape), x_dtype=x.dtype, activation=activation)
    return finish(centered, out, x.dtype), saved


def batchnorm_forward_inference(
    x: Any,
    gamma: Any,
    beta: Any,
    running_mean: Any,
    running_var: Any,
    *,
    epsilon: float = 1e-3,
    mode: str = "spatial",
    layout: str = "NCHW",
    out: Any = None,
    stream: Any = None,
) -> Any:
    """``y = gamma * (x - running_mean) / sqrt(running_var + epsilon) + beta``.

    CUDA: ``_cuda.batchnorm.batchnorm_forward_inference(x, gamma, beta, running_mean, running_var,
    epsilon=epsilon, mode=mode, layout=layout, out=out, stream=stream)``.
    """
    op = "batchnorm_forward_inference"
    x = as_array(x)
    gamma, beta, running_mean, running_var = map(as_array, (gamma, beta, running_mean, running_var))
    mode, layout, axes, pshape = _geometry(op, x, mode, layout)
    _check_params(op, x, pshape, gamma=gamma, beta=beta, running_mean=running_mean, running_var=running_var)
    epsilon = float(epsilon)
    if epsilon <= 0:
        raise ValueError(f"{op}: epsilon must be > 0, got {epsilon}")
    check_out(op, out, x.shape, x.dtype)
    impl = route(op, "batchnorm", x=x, gamma=gamma, beta=beta, running_mean=running_mean,
                 running_var=running_var, out=out)
    if impl is not None:
        return impl.batchnorm_forward_inference(
            x, gamma, beta, running_mean, running_var, epsilon=epsilon, mode=mode, layout=layout, out=out,
            stream=stream,
        )
    xc = to_compute(x)
    cdt = xc.dtype
    scale = (gamma / np.sqrt(running_var.astype(np.float64) + epsilon)).astype(cdt)
    shift = (beta - running_mean * scale).astype(cdt)
    y = xc * _broadcast(scale, xc, axes)
    y += _broadcast(shift, xc, axes)
    return finish(y, out, x.dtype)


def batchnorm_backward(
    dy: Any,
    x: Any,
    gamma: Any,
    saved: BatchNormSaved,
    *,
    epsilon: float = 1e-3,
    mode: str = "spatial",
    layout: str = "NCHW",
    activation: "str | None" = None,
    y: Any = None,
    stream: Any = None,
) -> tuple[Any, Any, Any]:
    """Gradients of :func:`batchnorm_forward_training`: ``(dx, dgamma, dbeta)``.

    ``saved`` is the :class:`BatchNormSaved` that forward returned for this ``x``; ``epsilon``
    must be the forward's (cuDNN checks it; the NumPy reference does not need it).

    ``activation="relu"`` (the forward's): ``dy`` is the gradient w.r.t. the activated output
    and ``y`` (required then, like ``x``) that output; the result equals
    ``activation_backward(dy, y, y, "relu")`` followed by the plain backward.

    CUDA: ``_cuda.batchnorm.batchnorm_backward(dy, x, gamma, saved, epsilon=epsilon, mode=mode,
    layout=layout, activation=activation, y=y, stream=stream)``.
    """
    op = "batchnorm_backward"
    activation = _check_activation(op, activation)
    if not isinstance(saved, BatchNormSaved):
        raise TypeError(
            f"{op}: saved must be the BatchNormSaved returned by batchnorm_forward_training, got "
            f"{type(saved).__name__} (statistics computed elsewhere: pass BatchNormSaved(mean, inv_std))"
        )
    dy, x, gamma = map(as_array, (dy, x, gamma))
    save_mean, save_inv_std = as_array(saved.mean), as_array(saved.inv_std)
    mode, layout, axes, pshape = _geometry(op, x, mode, layout)
    if tuple(dy.shape) != tuple(x.shape) or dy.dtype != x.dtype:
        raise ValueError(
            f"{op}: dy has shape {tuple(dy.shape)} and dtype {dy.dtype}, expected x's {tuple(x.shape)}, {x.dtype}"
        )
    if saved.x_shape is not None and tuple(saved.x_shape) != tuple(x.shape):
        raise ValueError(
            f"{op}: saved comes from a forward on x of shape {tuple(saved.x_shape)}, got x of shape {tuple(x.shape)}"
        )
    _check_params(op, x, pshape, gamma=gamma, **{"saved.mean": save_mean, "saved.inv_std": save_inv_std})
    if saved.path is not None and saved.activation != activation:
        raise ValueError(
            f"{op}: saved comes from a forward with activation={saved.activation!r}, got activation={activation!r} "
            "(pass the forward's activation, and y with it)"
        )
    if activation is None and y is not None:
        raise ValueError(f"{op}: y is only read with activation='relu'; got y with activation=None")
    if activation is not None:
        if y is None:
            raise ValueError(f"{op}: activation={activation!r} needs y, the forward's activated output")
        y = as_array(y)
        if tuple(y.shape) != tuple(x.shape) or y.dtype != x.dtype:
            raise ValueError(
                f"{op}: y has shape {tuple(y.shape)} and dtype {y.dtype}, expected x's {tuple(x.shape)}, {x.dtype}"
            )
    epsilon = float(epsilon)
    impl = route(op, "batchnorm", dy=dy, x=x, gamma=gamma, y=y,
                 **{"saved.mean": save_mean, "saved.inv_std": save_inv_std})
    if impl is not None:
        return impl.batchnorm_backward(dy, x, gamma, saved, epsilon=epsilon, mode=mode, layout=layout,
                                       activation=activation, y=y, stream=stream)
    g, xc = to_compute(dy), to_compute(x)
    if activation is not None:
        # relu's derivative as a mask of its output (y > 0 exactly where bn(x) > 0)
        g = _activation_backward(g, y, y, "relu", None)
    cdt = xc.dtype
    count = x.size // int(np.prod(pshape))
    inv_std = save_inv_std.astype(cdt, copy=False)
    xhat = (xc - _broadcast(save_mean.astype(cdt, copy=False), xc, axes)) * _broadcast(inv_std, xc, axes)
    dbeta = g.sum(axis=axes)
    dgamma = (g * xhat).sum(axis=axes)
    # dx = gamma * inv_std / m * (m * dy - sum(dy) - xhat * sum(dy * xhat))
    xhat *= _broadcast(dgamma / count, xc, axes)
    dx = g - _broadcast(dbeta / count, xc, axes)
    dx -= xhat
    dx *= _broadcast(gamma.astype(cdt, copy=False) * inv_std, xc, axes)
    pdt = param_dtype(x.dtype)
    return finish(dx, None, x.dtype), dgamma.astype(pdt, copy=False), dbeta.astype(pdt, copy=False)
