"""Batch normalization on cuDNN's BatchNormalization{ForwardTraining,ForwardInference,Backward}.

Geometry:

* ``spatial`` on 4-d x: x described as (N, C, H, W) in its layout, parameters (1, C, 1, 1),
  CUDNN_BATCHNORM_SPATIAL;
* ``per_activation`` on 4-d x: the parameters have the shape of one sample in x's own memory
  order, so x is described as (N, F, 1, 1) with F = C*H*W features in memory order and
  CUDNN_BATCHNORM_PER_ACTIVATION normalises each of them over N (layout-independent);
* 2-d (N, C): (N, C, 1, 1), both modes are the same.

Running statistics follow Keras: cuDNN's exponentialAverageFactor is ``1 - momentum``
(running = momentum * running + (1 - momentum) * batch, with the unbiased batch variance).
The saved statistics are the batch mean and 1/sqrt(var + eps). Parameters and statistics
are float32 (float64 for float64 x; float32 parameters with float64 x are widened for the
call). bfloat16 x runs through float32 copies (the legacy BN API is not documented for bf16).
"""

from __future__ import annotations

from typing import Any

from . import _common as cm

__all__ = ["batchnorm_forward_training", "batchnorm_forward_inference", "batchnorm_backward"]

_PER_ACTIVATION, _SPATIAL = 0, 1


def _descs(x: Any, mode: str, layout: str, param_dtype) -> "tuple[int, int, int]":
    """(cudnn mode, x descriptor, parameter descriptor)."""
    shape = tuple(int(v) for v in x.shape)
    if x.ndim == 2:
        dims, lay, cmode = (shape[0], shape[1], 1, 1), "NCHW", _SPATIAL
    elif mode == "per_activation":
        dims, lay, cmode = (shape[0], cm.size_of(shape[1:]), 1, 1), "NCHW", _PER_ACTIVATION
    else:
        dims, lay, cmode = cm.nchw_dims(shape, layout), layout, _SPATIAL
    return cmode, cm.tensor_desc(dims, x.dtype, lay), cm.tensor_desc((1, dims[1], 1, 1), param_dtype, "NCHW")


def _param_dtype(x: Any):
    return cm.F64 if x.dtype == cm.F64 else cm.F32


def _as(a: Any, dtype, s) -> Any:
    from .elementwise import cast

    return a if a is None or a.dtype == dtype else cast(a, dtype, stream=s)


def _context(function: str, x: Any, mode: str, layout: str, epsilon: float) -> dict:
    return {"function": function, "x shape": tuple(x.shape), "dtype": str(x.dtype), "mode": mode,
            "layout": layout, "epsilon": epsilon}


def batchnorm_forward_training(x: Any, gamma: Any, beta: Any, running_mean: Any, running_var: Any, *,
                               momentum: float = 0.99, epsilon: float = 1e-3, mode: str = "spatial",
                               layout: str = "NCHW", out: Any = None, stream: Any = None) -> "tuple[Any, Any, Any]":
    """(y, save_mean, save_inv_std); updates running_mean/running_var in place."""
    s = cm.stream_of(stream)
    if x.dtype == cm.BF16:
        from .elementwise import cast

        y32, mean, inv = batchnorm_forward_training(cast(x, cm.F32, stream=s), gamma, beta, running_mean, running_var,
                                                    momentum=momentum, epsilon=epsilon, mode=mode, layout=layout,
                                                    stream=s)
        return cast(y32, cm.BF16, out=out, stream=s), mean, inv
    pdt = _param_dtype(x)
    y = cm.output(out, x.shape, x.dtype, s)
    cmode, xd, pd = _descs(x, mode, layout, pdt)
    g, b = _as(gamma, pdt, s), _as(beta, pdt, s)
    rm, rv = _as(running_mean, pdt, s), _as(running_var, pdt, s)
    pshape = tuple(gamma.shape)
    save_mean, save_inv = cm.empty(pshape, pdt, s), cm.empty(pshape, pdt, s)
    try:
        cm.cudnn_call("cudnnBatchNormalizationForwardTraining", cm.cudnn_handle(s), cmode, cm.ONE.of(x.dtype),
                      cm.ZERO.of(x.dtype), xd, x.ptr, xd, y.ptr, pd, g.ptr, b.ptr, 1.0 - float(momentum), rm.ptr,
                      rv.ptr, float(epsilon), save_mean.ptr, save_inv.ptr)
    except cm.CudnnError as exc:
        exc.add_context(**_context("cudnnBatchNormalizationForwardTraining", x, mode, layout, epsilon))
        raise
    if rm is not running_mean:  # widened float32 running statistics: write them back
        from .elementwise import cast

        cast(rm, running_mean.dtype, out=running_mean, stream=s)
        cast(rv, running_var.dtype, out=running_var, stream=s)
    return y, save_mean, save_inv


def batchnorm_forward_inference(x: Any, gamma: Any, beta: Any, running_mean: Any, running_var: Any, *,
                                epsilon: float = 1e-3, mode: str = "spatial", layout: str = "NCHW", out: Any = None,
                                stream: Any = None) -> Any:
    """y = gamma * (x - running_mean) / sqrt(running_var + eps) + beta."""
    s = cm.stream_of(stream)
    if x.dtype == cm.BF16:
        from .elementwise import cast

        y32 = batchnorm_forward_inference(cast(x, cm.F32, stream=s), gamma, beta, running_mean, running_var,
                                          epsilon=epsilon, mode=mode, layout=layout, stream=s)
        return cast(y32, cm.BF16, out=out, stream=s)
    pdt = _param_dtype(x)
    y = cm.output(out, x.shape, x.dtype, s)
    cmode, xd, pd = _descs(x, mode, layout, pdt)
    g, b, rm, rv = (_as(a, pdt, s) for a in (gamma, beta, running_mean, running_var))
    try:
        cm.cudnn_call("cudnnBatchNormalizationForwardInference", cm.cudnn_handle(s), cmode, cm.ONE.of(x.dtype),
                      cm.ZERO.of(x.dtype), xd, x.ptr, xd, y.ptr, pd, g.ptr, b.ptr, rm.ptr, rv.ptr, float(epsilon))
    except cm.CudnnError as exc:
        exc.add_context(**_context("cudnnBatchNormalizationForwardInference", x, mode, layout, epsilon))
        raise
    return y


def batchnorm_backward(dy: Any, x: Any, gamma: Any, save_mean: Any, save_inv_std: Any, *, epsilon: float = 1e-3,
                       mode: str = "spatial", layout: str = "NCHW", stream: Any = None) -> "tuple[Any, Any, Any]":
    """(dx, dgamma, dbeta); dgamma/dbeta are overwritten (beta for the parameter gradients is 0)."""
    s = cm.stream_of(stream)
    if x.dtype == cm.BF16:
        from .elementwise import cast

        dx32, dg, db = batchnorm_backward(cast(dy, cm.F32, stream=s), cast(x, cm.F32, stream=s), gamma, save_mean,
                                          save_inv_std, epsilon=epsilon, mode=mode, layout=layout, stream=s)
        return cast(dx32, cm.BF16, stream=s), dg, db
    pdt = _param_dtype(x)
    cmode, xd, pd = _descs(x, mode, layout, pdt)
    g, sm, si = (_as(a, pdt, s) for a in (gamma, save_mean, save_inv_std))
    dx = cm.empty(x.shape, x.dtype, s)
    dgamma, dbeta = cm.empty(tuple(gamma.shape), pdt, s), cm.empty(tuple(gamma.shape), pdt, s)
    one, zero = cm.ONE.of(x.dtype), cm.ZERO.of(x.dtype)
    try:
        cm.cudnn_call("cudnnBatchNormalizationBackward", cm.cudnn_handle(s), cmode, one, zero, one, zero, xd, x.ptr,
                      xd, dy.ptr, xd, dx.ptr, pd, g.ptr, dgamma.ptr, dbeta.ptr, float(epsilon), sm.ptr, si.ptr)
    except cm.CudnnError as exc:
        exc.add_context(**_context("cudnnBatchNormalizationBackward", x, mode, layout, epsilon))
        raise
    if gamma.dtype != pdt:
        from .elementwise import cast

        dgamma, dbeta = cast(dgamma, gamma.dtype, stream=s), cast(dbeta, gamma.dtype, stream=s)
    return dx, dgamma, dbeta
