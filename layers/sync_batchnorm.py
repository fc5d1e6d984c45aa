"""Synchronised batch normalization: batch statistics over every rank's batch (torch's SyncBatchNorm).

The training forward and backward of ``BatchNormalization(synchronized=True)`` (alias
``SyncBatchNormalization``) under a data-parallel distribution, composed from public ``dnnbind.kernels``
(per-channel sums ``bias_backward``, the per-channel affine maps ``bias_add``/``normalize``/
``rescale``, elementwise ops) and one all-reduce each way; they run on NumPy and CUDA alike.

Forward, per channel, with ``N = n * world_size`` rows (``n`` this rank's rows times the spatial
size; every rank must feed a batch of the same size, as ``fit`` under ``DataParallel`` does)::

    s1, s2 = sum(x - K), sum((x - K)**2)         # this rank's; K = the moving mean, shared by all ranks
    all-reduce (sum) [s1, s2]
    mean = K + s1 / N;  var = s2 / N - (s1 / N)**2  (biased, clamped at 0; it feeds moving_variance too, as Keras)
    xhat = (x - mean) / sqrt(var + epsilon);  y = gamma * xhat + beta

The shift ``K`` (any value the ranks share, the moving mean being close to the batch mean) keeps
the sum of squares from cancelling when the mean is large against the spread. Backward::

    all-reduce (sum) [sum(dy), sum(dy * xhat)]  -> their means over the N rows: mdy, mdyx
    dx = gamma / sqrt(var + epsilon) * (dy - mdy - xhat * mdyx)
    dgamma, dbeta = this rank's sum(dy * xhat), sum(dy)

``dgamma``/``dbeta`` stay this rank's: the distribution averages them with every other gradient,
which gives the gradient of the mean of the ranks' losses. ``dx`` is exactly that loss's gradient
times ``world_size`` on each rank, as for every layer under data parallelism. With one rank both
directions are batch normalization's. Arithmetic runs in float32 (float64 for float64 data).
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from dnnbind import kernels

__all__ = ["sync_batchnorm_forward", "sync_batchnorm_backward"]

_F32 = np.dtype(np.float32)
_F64 = np.dtype(np.float64)


def _compute_dtype(dtype: np.dtype) -> np.dtype:
    return _F64 if dtype == _F64 else _F32


def _as(x: Any, dtype: np.dtype) -> Any:
    return x if x.dtype == dtype else kernels.cast(x, dtype)


def _per_channel(p: Any, x: Any, layout: str) -> Any:
    """``p`` (C,) laid out to broadcast over ``x``'s channel axis (``(C, 1, 1)`` for 4-d NCHW)."""
    return p.reshape(int(p.shape[0]), 1, 1) if x.ndim == 4 and layout == "NCHW" else p


def _filled(like: Any, value: float) -> Any:
    # made in the step and dropped with it: nothing allocated while capturing outlives the capture
    return kernels.fill(kernels.empty_like(like), value)


def sync_batchnorm_forward(x: Any, gamma: Any, beta: Any, running_mean: Any, running_var: Any, *, momentum: float,
                           epsilon: float, layout: str, world_size: int,
                           all_reduce: Callable[[list], None]) -> tuple[Any, Any, Any]:
    """Normalise ``x`` with the statistics of every rank's batch; update the running statistics.

    Parameters
    ----------
    x:
        ``(N, C)``, or 4-d ``NHWC``/``NCHW`` (``layout``), float.
    gamma, beta, running_mean, running_var:
        ``(C,)`` float32 (the running ones are updated in place:
        ``running = momentum * running + (1 - momentum) * batch``, biased batch variance: Keras).
    world_size:
        How many ranks take part (each with a batch the size of ``x``).
    all_reduce:
        Sums a list of ``(C,)`` arrays over the ranks, in place.

    Returns
    -------
    ``(y, xhat, scale)``: ``y`` like ``x``; ``xhat`` the normalised ``x`` and ``scale`` the per-channel
    ``gamma / sqrt(var + epsilon)``, both in the compute dtype, for :func:`sync_batchnorm_backward`.
    """
    cd = _compute_dtype(x.dtype)
    channels = int(running_mean.shape[0])
    count = int(x.size) // channels * int(world_size)
    xc = _as(x, cd)
    shift = _as(running_mean, cd)
    centred = kernels.bias_add(xc, kernels.scale(shift, -1.0), layout=layout)
    sums = [kernels.bias_backward(centred, layout=layout),
            kernels.bias_backward(kernels.multiply(centred, centred), layout=layout)]
    del centred
    all_reduce(sums)
    mean_shifted = kernels.scale(sums[0], 1.0 / count)
    mean = kernels.add(shift, mean_shifted)
    var = kernels.subtract(kernels.scale(sums[1], 1.0 / count), kernels.multiply(mean_shifted, mean_shifted))
    var = kernels.maximum(var, _filled(var, 0.0))  # rounding may leave a constant channel's variance below 0
    var_eps = kernels.add(var, _filled(var, epsilon))
    xhat = kernels.normalize(xc, _per_channel(mean, xc, layout), _per_channel(var_eps, xc, layout), epsilon=0.0)
    y = kernels.rescale(xhat, _per_channel(_as(gamma, cd), xc, layout), _per_channel(_as(beta, cd), xc, layout))
    scale = kernels.normalize_backward(_as(gamma, cd), var_eps, epsilon=0.0)
    for running, batch in ((running_mean, mean), (running_var, var)):
        kernels.scale(running, momentum, out=running)
        kernels.axpy(1.0 - momentum, _as(batch, running.dtype), running)
    return _as(y, x.dtype), xhat, scale


def sync_batchnorm_backward(dy: Any, xhat: Any, scale: Any, *, layout: str, world_size: int,
                            all_reduce: Callable[[list], None]) -> tuple[Any, Any, Any]:
    """Gradients of :func:`sync_batchnorm_forward`: ``(dx, dgamma, dbeta)``.

    ``xhat``, ``scale``: what the forward returned. ``dx`` is like ``dy``; ``dgamma``/``dbeta`` are
    ``(C,)`` in the compute dtype (float32, float64 for float64 data), this rank's sums.
    """
    cd = xhat.dtype
    channels = int(scale.shape[0])
    count = int(dy.size) // channels * int(world_size)
    g = _as(dy, cd)
    dbeta = kernels.bias_backward(g, layout=layout)
    dgamma = kernels.bias_backward(kernels.multiply(g, xhat), layout=layout)
    totals = [kernels.copy(dbeta), kernels.copy(dgamma)]  # the all-reduce is in place; the parameter gradients stay local
    all_reduce(totals)
    mean_dy = kernels.scale(totals[0], 1.0 / count)
    mean_dy_xhat = kernels.scale(totals[1], 1.0 / count)
    projected = kernels.rescale(xhat, _per_channel(mean_dy_xhat, g, layout), _per_channel(mean_dy, g, layout))
    dx = kernels.rescale(kernels.subtract(g, projected), _per_channel(scale, g, layout))
    return _as(dx, dy.dtype), dgamma, dbeta
