"""Batch normalization on cuDNN.

Paths (the module switches below choose; benchmarks/bn_bench.py flips them):

* **Channels-last training** — ``spatial`` on 4-d NHWC x, and 2-d ``(N, C)`` x, of float32,
  float16 or bfloat16 — runs ``cudnnBatchNormalizationForwardTrainingEx`` /
  ``cudnnBatchNormalizationBackwardEx`` with CUDNN_BATCHNORM_SPATIAL_PERSISTENT and
  CUDNN_BATCHNORM_OPS_BN, as PyTorch does for channels_last training. The legacy
  CUDNN_BATCHNORM_SPATIAL kernels walk NHWC one channel at a time and were ~4x slower than
  the whole PyTorch step on the H200. PyTorch's limits are kept: N <= 880801 and fewer than
  2**31 - 1 elements, else the legacy path. A 2-d (N, C) x is the NHWC tensor (N, C, 1, 1)
  (same memory). Caveat (cuDNN, PyTorch): PERSISTENT reduces with scaled integer atomics
  and may lose accuracy or overflow for extreme value ranges; PyTorch accepts that for
  channels_last, and so do we (``USE_PERSISTENT_NHWC = False`` turns it off).
* **Channels-last inference** (NHWC spatial, 2-d) of float32/float16/bfloat16: one NVRTC
  kernel ``y = x * scale[c] + shift[c]`` (batchnorm.cu), coalesced in NHWC.
* Everything else (NCHW, ``per_activation``, float64) — the legacy
  ``cudnnBatchNormalization{ForwardTraining,ForwardInference,Backward}``:

  * ``spatial`` on 4-d x: x described as (N, C, H, W) in its layout, parameters (1, C, 1, 1),
    CUDNN_BATCHNORM_SPATIAL;
  * ``per_activation`` on 4-d x: x described as (N, F, 1, 1) with F = C*H*W features in
    memory order and CUDNN_BATCHNORM_PER_ACTIVATION (layout-independent);
  * 2-d (N, C) (when not on the Ex path): (N, C, 1, 1) NCHW, ``BN2D_PATH`` picks SPATIAL or
    PER_ACTIVATION (the same numbers for H = W = 1).

**Reserve space.** The Ex forward may ask for a reserve buffer that its backward must get
back. It travels in the :class:`~dnnbind.kernels.BatchNormSaved` the forward returns
(``saved.reserve``, with ``saved.path == "cudnn_persistent"`` and the x shape and dtype it was
made for) and is freed, stream-ordered, when that record dies (a layer drops it after its
backward, so under CUDA-graph capture it dies inside the captured step). The backward uses it
when it matches x; when cuDNN wants a reserve and the record has none that matches (built by
hand, from another path, another shape or dtype), the backward takes the legacy SPATIAL path,
which needs only the saved mean and 1/std (identical semantics), so results stay correct.
When cuDNN's reserve size is 0 nothing is kept.

Running statistics follow Keras: cuDNN's exponentialAverageFactor is ``1 - momentum``
(running = momentum * running + (1 - momentum) * batch). cuDNN feeds the running variance the
unbiased batch variance (``var * n / (n - 1)``, n the values per statistic); Keras feeds it the
biased one, so every training call is followed by one correction from a copy of the old running
variance (:func:`_biased_running_var`: ``(n - 1) / n * cudnn_result + momentum / n * old``, which is
exactly ``momentum * old + (1 - momentum) * biased_var``; three stream-ordered kernels on C values).
The saved statistics are the batch mean and 1/sqrt(var + eps). Parameters and statistics
are float32 (float64 for float64 x; float32 parameters with float64 x are widened for the
call). bfloat16 x goes straight into the Ex path (``BF16_DIRECT``; cuDNN's docs do not
say whether the legacy/Ex BN API takes bf16, and PyTorch keeps bf16 off cuDNN BN). If cuDNN
refuses an Ex call (NOT_SUPPORTED / BAD_PARAM), that (device, shape, dtype) is remembered in
``_ex_refused`` and falls back, with one warning: bfloat16 to float32 copies (which then use
the Ex path as float32), float32/float16 to the legacy path. On the legacy path bfloat16
always runs through float32 copies (the legacy API is not documented for bf16).

**Fused relu** (``activation="relu"``; ``FUSE_ACTIVATION``). 4-d NHWC training on the Ex path with
C a multiple of 4 (the channel counts TensorFlow and nnabla fuse for) runs one
``cudnnBatchNormalizationForwardTrainingEx`` with CUDNN_BATCHNORM_OPS_BN_ACTIVATION and a relu
activation descriptor, and one ``cudnnBatchNormalizationBackwardEx`` likewise, which takes ``dy``
w.r.t. the activated output, the activated ``y``, beta and the forward's reserve (cuDNN may keep the
relu mask there: the sizes are queried with the same bnOps and descriptor, and cached apart from the
plain ones). The record's ``path`` is ``"cudnn_persistent_relu"``; its reserve serves only that
backward. A record of ``conv_bn.py``'s genstats path (``"cudnn_genstats"``: statistics from a
convolution's epilogue, beta kept) takes the fused backward too where cuDNN needs no reserve for the
shape (:func:`fused_backward_takes_genstats`; on an H200 it needed none for every shape measured).
Everywhere else (2-d, NCHW, float64, other channel counts, a refusal remembered in
``_ex_refused`` under (device, shape, dtype, "relu")) the forward runs the plain batch norm, then
the relu in place on y, and the backward the relu backward (from y), then the plain backward. A
refusal of the fused call is logged once (debug, ``dnnbind.kernels.batchnorm``): the numbers are the same.
"""

from __future__ import annotations

import ctypes
import dataclasses
import logging
from typing import Any

import numpy as np

from ... import cudnn
from ..._lib import cudnn as C
from ..batchnorm import BatchNormSaved
from . import _common as cm
from .activation import _act_desc, activation_backward, activation_forward
from .elementwise import axpy, cast, copy, scale

__all__ = ["batchnorm_forward_training", "batchnorm_forward_inference", "batchnorm_backward",
           "USE_PERSISTENT_NHWC", "BN2D_PATH", "BF16_DIRECT", "INFERENCE_KERNEL", "FUSE_ACTIVATION"]

_log = logging.getLogger("dnnbind.kernels.batchnorm")

# ------------------------------------------------------------------------------ switches
USE_PERSISTENT_NHWC: bool = True
"""Channels-last training (NHWC spatial, and 2-d when ``BN2D_PATH == "persistent"``) through the
*Ex API with CUDNN_BATCHNORM_SPATIAL_PERSISTENT. False: the legacy SPATIAL path everywhere."""

BN2D_PATH: str = "persistent"
"""2-d (N, C) training: ``"persistent"`` (Ex API, (N, C, 1, 1) as NHWC; needs
USE_PERSISTENT_NHWC), ``"per_activation"`` or ``"spatial"`` (legacy API, (N, C, 1, 1) NCHW)."""

BF16_DIRECT: bool = True
"""bfloat16 x straight into the Ex path (False: through float32 copies, as the legacy path)."""

INFERENCE_KERNEL: bool = True
"""Channels-last inference through the NVRTC kernel (False: cudnnBatchNormalizationForwardInference)."""

FUSE_ACTIVATION: bool = True
"""``activation="relu"`` on the fused *Ex calls (CUDNN_BATCHNORM_OPS_BN_ACTIVATION) where they apply
(False: the batch norm and the relu as separate calls everywhere)."""


def _switches() -> tuple:
    return (USE_PERSISTENT_NHWC, BN2D_PATH, BF16_DIRECT, INFERENCE_KERNEL, FUSE_ACTIVATION)


# They choose which kernels a step launches: a captured step graph must be keyed by them.
cm.config().register_switches(__name__, _switches)

_PERSISTENT = C.BatchNormMode.SPATIAL_PERSISTENT
_OPS_BN = C.BatchNormOps.BN
_OPS_BN_RELU = C.BatchNormOps.BN_ACTIVATION
# PyTorch's cuDNN batch-norm limits (Normalization.cpp: N for spatial training; 32-bit indexing).
_MAX_N_TRAINING = 880801
_MAX_ELEMENTS = 2**31 - 1
# cudnnStatus_t values that mean "this configuration is not available" (bf16 fallback).
_REFUSALS = (C.Status.BAD_PARAM, C.Status.NOT_SUPPORTED)


# ------------------------------------------------------------------------------ geometry

def _param_dtype(x: Any):
    return cm.F64 if x.dtype == cm.F64 else cm.F32


def _descs(x: Any, mode: str, layout: str,
           param_dtype) -> "tuple[C.BatchNormMode, cudnn.TensorDescriptor, cudnn.TensorDescriptor]":
    """Legacy path: (cudnn mode, x descriptor, parameter descriptor)."""
    shape = tuple(int(v) for v in x.shape)
    if x.ndim == 2:
        cmode = C.BatchNormMode.PER_ACTIVATION if BN2D_PATH == "per_activation" else C.BatchNormMode.SPATIAL
        x_shape, lay, channels = (shape[0], shape[1], 1, 1), "NCHW", shape[1]
    elif mode == "per_activation":
        features = cm.size_of(shape[1:])
        x_shape, lay, channels = (shape[0], features, 1, 1), "NCHW", features
        cmode = C.BatchNormMode.PER_ACTIVATION
    else:
        x_shape, lay, cmode = shape, layout, C.BatchNormMode.SPATIAL
        channels = cm.nchw_dims(shape, layout)[1]
    return (cmode, cudnn.TensorDescriptor.cached(x_shape, x.dtype, lay),
            cudnn.TensorDescriptor.cached((1, channels, 1, 1), param_dtype))


def _channels_last(x: Any, mode: str, layout: str) -> bool:
    """x's channel axis is the fastest one and the statistics are per channel."""
    return x.ndim == 2 or (x.ndim == 4 and mode == "spatial" and layout == "NHWC")


def _nhwc_dims(x: Any) -> "tuple[int, int, int, int]":
    if x.ndim == 2:
        return (int(x.shape[0]), int(x.shape[1]), 1, 1)
    n, h, w, c = x.shape  # a DeviceArray's shape is a tuple of ints
    return (n, c, h, w)


def _ex_eligible(x: Any, mode: str, layout: str) -> bool:
    """Whether training for x takes the Ex / SPATIAL_PERSISTENT path (dtype aside from bf16 policy)."""
    if not USE_PERSISTENT_NHWC or x.dtype not in (cm.F32, cm.F16, cm.BF16):
        return False
    if not _channels_last(x, mode, layout) or (x.ndim == 2 and BN2D_PATH != "persistent"):
        return False
    return 0 < int(x.shape[0]) <= _MAX_N_TRAINING and x.size < _MAX_ELEMENTS


def _ex_descs(x: Any) -> "tuple[cudnn.TensorDescriptor, cudnn.TensorDescriptor]":
    """(x descriptor as packed NHWC, float32 parameter descriptor (1, C, 1, 1))."""
    n, c, h, w = _nhwc_dims(x)
    return (cudnn.TensorDescriptor.cached((n, h, w, c), x.dtype, "NHWC"),
            cudnn.TensorDescriptor.cached((1, c, 1, 1), cm.F32))


# Workspace / reserve sizes by (device, x as packed NHWC (N, C, H, W), x dtype): the queries are
# host calls that would otherwise run on every step. Keyed by what the descriptors describe, not
# by their handles: a handle is an address, which a destroyed descriptor may pass on.
SIZE_CACHE_SIZE = 256
_fwd_sizes = cudnn.LRUCache(SIZE_CACHE_SIZE, "batchnorm Ex forward sizes")
_bwd_sizes = cudnn.LRUCache(SIZE_CACHE_SIZE, "batchnorm Ex backward workspace sizes")


def _size_key(device: int, x: Any, fused: bool = False) -> tuple:
    """The plain calls' key; the fused calls' sizes (another bnOps, an activation) end in "relu"."""
    key = (device, _nhwc_dims(x), x.dtype)
    return key + ("relu",) if fused else key


def _relu_desc() -> cudnn.ActivationDescriptor:
    # the descriptor kernels.activation_forward uses for relu (NaN propagated): one cached object
    return _act_desc("relu", None)


def _forward_sizes(handle: int, key: tuple, xd: int, pd: int, act: int = 0) -> "tuple[int, int]":
    """(workspace, reserve) bytes of the Ex training forward; ``xd``/``pd`` are raw descriptors,
    ``act`` the raw relu descriptor of the fused call (0: the plain CUDNN_BATCHNORM_OPS_BN call)."""
    sizes = _fwd_sizes.get(key)
    if sizes is None:
        ws, reserve = ctypes.c_size_t(0), ctypes.c_size_t(0)
        if act:
            # x, z (NULL: no add), y, scale/bias, the relu
            C.cudnnGetBatchNormalizationForwardTrainingExWorkspaceSize(handle, _PERSISTENT, _OPS_BN_RELU, xd, None,
                                                                       xd, pd, act, ctypes.byref(ws))
            C.cudnnGetBatchNormalizationTrainingExReserveSpaceSize(handle, _PERSISTENT, _OPS_BN_RELU, act, xd,
                                                                   ctypes.byref(reserve))
        else:
            # x, z (unused with OPS_BN; as PyTorch), y, scale/bias, no activation
            C.cudnnGetBatchNormalizationForwardTrainingExWorkspaceSize(handle, _PERSISTENT, _OPS_BN, xd, xd, xd, pd,
                                                                       None, ctypes.byref(ws))
            C.cudnnGetBatchNormalizationTrainingExReserveSpaceSize(handle, _PERSISTENT, _OPS_BN, None, xd,
                                                                   ctypes.byref(reserve))
        sizes = _fwd_sizes.put(key, (int(ws.value), int(reserve.value)))
    return sizes


def _backward_workspace(handle: int, key: tuple, xd: int, pd: int, act: int = 0) -> int:
    size = _bwd_sizes.get(key)
    if size is None:
        out = ctypes.c_size_t(0)
        # Argument order: xDesc, yDesc, dyDesc, dzDesc, dxDesc, dBnScaleBiasDesc, activationDesc
        # (yDesc as PyTorch passes it; with CUDNN_BATCHNORM_OPS_BN it is not read, with
        # BN_ACTIVATION it describes the activated y the backward reads).
        C.cudnnGetBatchNormalizationBackwardExWorkspaceSize(handle, _PERSISTENT, _OPS_BN_RELU if act else _OPS_BN, xd,
                                                            xd, xd, None, xd, pd, act or None, ctypes.byref(out))
        size = _bwd_sizes.put(key, int(out.value))
    return size


# ------------------------------------------------------------------------ saved state

# BatchNormSaved.path values of this module: the *Ex call (plain, or with the fused relu), the legacy API;
# and of conv_bn.py: statistics from a convolution's genstats epilogue (with the relu: beta kept, for the
# fused backward, which takes the record when cuDNN needs no reserve for the shape)
PERSISTENT, FUSED, LEGACY, GENSTATS = "cudnn_persistent", "cudnn_persistent_relu", "cudnn", "cudnn_genstats"


def fused_backward_takes_genstats(x: Any, s: Any) -> bool:
    """Whether the fused batch-norm + relu backward (one *Ex call) can take a ``GENSTATS`` record (with beta)
    for NHWC ``x``: the fused path applies and cuDNN needs no reserve for it (a record made without the Ex
    forward has none). Else that backward runs the relu's backward apart."""
    if not _use_fused(x, "spatial", "NHWC"):
        return False
    x_desc, p_desc = _ex_descs(x)
    return _forward_sizes(cm.cudnn_handle(s).handle, _size_key(s.device_index, x, True), x_desc.handle,
                          p_desc.handle, _relu_desc().handle)[1] == 0


def _reserve_for(saved: BatchNormSaved, x: Any, nbytes: int, path: str = PERSISTENT) -> Any:
    """The forward's reserve in ``saved`` when the ``path`` call made it for this x and it holds
    ``nbytes``, else None (a fused call's reserve never serves the plain backward, nor the reverse)."""
    reserve = saved.reserve
    if (reserve is None or saved.path != path or saved.x_shape != tuple(x.shape)
            or saved.x_dtype != x.dtype or reserve.nbytes < nbytes):
        return None
    return reserve


# ---------------------------------------------------------------------------- helpers

def _as(a: Any, dtype, s) -> Any:
    return a if a is None or a.dtype == dtype else cast(a, dtype, stream=s)


def _cast(a: Any, dtype, s, out: Any = None) -> Any:
    return cast(a, dtype, out=out, stream=s)


def _context(function: str, x: Any, mode: str, layout: str, epsilon: float) -> dict:
    return {"function": function, "x shape": tuple(x.shape), "dtype": str(x.dtype), "mode": mode,
            "layout": layout, "epsilon": epsilon}


# (device, x shape, x dtype) that cuDNN refused on the Ex path (NOT_SUPPORTED / BAD_PARAM).
_ex_refused: set[tuple] = set()


def _use_ex(x: Any, mode: str, layout: str) -> bool:
    if not _ex_eligible(x, mode, layout) or (x.dtype == cm.BF16 and not BF16_DIRECT):
        return False
    return (x.device_index, tuple(x.shape), str(x.dtype)) not in _ex_refused


def _use_fused(x: Any, mode: str, layout: str) -> bool:
    """Whether training with the relu takes the fused *Ex calls (else the unfused ops)."""
    if not FUSE_ACTIVATION or x.ndim != 4 or int(x.shape[3]) % 4 or not _use_ex(x, mode, layout):
        return False
    return (x.device_index, tuple(x.shape), str(x.dtype), "relu") not in _ex_refused


def _refuse(x: Any, exc: "cm.CudnnError", fused: bool = False) -> bool:
    """cuDNN refused x on the Ex path: remember it and fall back (True), or re-raise (False).

    bfloat16 falls back to float32 copies (which take the Ex path as float32), float32 and
    float16 to the legacy SPATIAL path. A warning names the shape once. A refused fused call
    (``fused``) falls back to the plain calls and the separate relu: one debug line, no warning
    (the numbers are the same; the model asked for no fusion, the library chose it).
    """
    if exc.status not in _REFUSALS:
        return False
    if fused:
        _ex_refused.add((x.device_index, tuple(x.shape), str(x.dtype), "relu"))
        _log.debug("batchnorm: cuDNN refused the fused relu for %s x of shape %s (%s: %s); running the batch norm "
                   "and the relu apart for it", x.dtype, tuple(x.shape), exc.status_name, exc.detail)
        return True
    _ex_refused.add((x.device_index, tuple(x.shape), str(x.dtype)))
    fallback = "float32 copies" if x.dtype == cm.BF16 else "the legacy CUDNN_BATCHNORM_SPATIAL path"
    cm.warn_once(("bn-ex", tuple(x.shape), str(x.dtype)),
                 f"batchnorm: cuDNN refused {x.dtype} x of shape {tuple(x.shape)} on the SPATIAL_PERSISTENT "
                 f"path ({exc.status_name}: {exc.detail}); using {fallback} for it")
    return True


# ------------------------------------------------------------------------ training forward

def _forward_training_ex(x: Any, g: Any, b: Any, rm: Any, rv: Any, momentum: float, epsilon: float, y: Any,
                         s: Any, mode: str, layout: str, fused: bool = False) -> BatchNormSaved:
    """Ex / SPATIAL_PERSISTENT training forward into ``y`` (``fused``: with the relu, one
    CUDNN_BATCHNORM_OPS_BN_ACTIVATION call); returns the saved state (with the reserve)."""
    x_desc, p_desc = _ex_descs(x)  # held for the calls: a cache may evict them meanwhile
    act_desc = _relu_desc() if fused else None
    handle_obj = cm.cudnn_handle(s)
    handle, xd, pd = handle_obj.handle, x_desc.handle, p_desc.handle
    act = act_desc.handle if fused else 0
    ws_size, reserve_size = _forward_sizes(handle, _size_key(s.device_index, x, fused), xd, pd, act)
    pshape = tuple(g.shape)
    save_mean, save_inv = cm.empty(pshape, cm.F32, s), cm.empty(pshape, cm.F32, s)
    reserve = cm.empty((reserve_size,), np.uint8, s) if reserve_size else None
    ws = cudnn.workspace(s, ws_size)
    try:
        C.cudnnBatchNormalizationForwardTrainingEx(
            handle, _PERSISTENT, _OPS_BN_RELU if fused else _OPS_BN, cm.ONE.of(x.dtype), cm.ZERO.of(x.dtype), xd,
            x.ptr, None, None, xd, y.ptr, pd, g.ptr, b.ptr, 1.0 - float(momentum), rm.ptr, rv.ptr, float(epsilon),
            save_mean.ptr, save_inv.ptr, act or None, ws or None, ws_size, cm.ptr(reserve) or None, reserve_size)
    except cm.CudnnError as exc:
        exc.add_context(**_context("cudnnBatchNormalizationForwardTrainingEx", x, mode, layout, epsilon),
                        workspace=ws_size, reserve=reserve_size, bn_ops="BN_ACTIVATION (relu)" if fused else "BN")
        raise
    if fused:
        return BatchNormSaved(save_mean, save_inv, reserve=reserve, path=FUSED, x_shape=tuple(x.shape),
                              x_dtype=x.dtype, activation="relu", beta=b)
    return BatchNormSaved(save_mean, save_inv, reserve=reserve, path=PERSISTENT, x_shape=tuple(x.shape),
                          x_dtype=x.dtype)


def _biased_running_var(running_var: Any, old: Any, count: int, momentum: float, s: Any) -> None:
    """Turn cuDNN's update of ``running_var`` (fed the unbiased batch variance) into Keras's (the biased one).

    cuDNN wrote ``new = m * old + (1 - m) * var * n / (n - 1)``; Keras wants ``m * old + (1 - m) * var``,
    which is ``(n - 1) / n * new + m / n * old`` (no division by ``1 - m``, no cancellation: both terms are
    non-negative). For ``n == 1`` the biased variance is 0 and the result ``m * old``."""
    momentum = float(momentum)
    if count > 1:
        scale(running_var, (count - 1) / count, out=running_var, stream=s)
        axpy(momentum / count, old, running_var, stream=s)
    else:
        scale(old, momentum, out=running_var, stream=s)


def batchnorm_forward_training(x: Any, gamma: Any, beta: Any, running_mean: Any, running_var: Any, *,
                               momentum: float = 0.99, epsilon: float = 1e-3, mode: str = "spatial",
                               layout: str = "NCHW", activation: "str | None" = None, out: Any = None,
                               stream: Any = None) -> "tuple[Any, BatchNormSaved]":
    """(y, saved); updates running_mean/running_var in place (Keras: the biased batch variance feeds
    running_var). ``activation="relu"``: y = relu(bn(x))."""
    s = cm.stream_of(stream)
    old = copy(running_var, stream=s)
    result = _forward_training_cudnn(x, gamma, beta, running_mean, running_var, momentum=momentum,
                                     epsilon=epsilon, mode=mode, layout=layout, activation=activation, out=out,
                                     stream=s)
    _biased_running_var(running_var, old, int(x.size) // int(np.prod(gamma.shape)), momentum, s)
    return result


def _forward_training_cudnn(x: Any, gamma: Any, beta: Any, running_mean: Any, running_var: Any, *,
                            momentum: float, epsilon: float, mode: str, layout: str,
                            activation: "str | None" = None, out: Any = None,
                            stream: Any = None) -> "tuple[Any, BatchNormSaved]":
    """The cuDNN training call(s) of :func:`batchnorm_forward_training`: running_var as cuDNN updates it
    (with the unbiased batch variance)."""
    s = cm.stream_of(stream)
    if activation is not None:
        if _use_fused(x, mode, layout):
            y = cm.output(out, x.shape, x.dtype, s)
            try:
                saved = _forward_training_ex(x, gamma, beta, running_mean, running_var, momentum, epsilon, y, s, mode,
                                             layout, fused=True)
            except cm.CudnnError as exc:
                if not _refuse(x, exc, fused=True):
                    raise
            else:
                return y, saved
        y, saved = _forward_training_cudnn(x, gamma, beta, running_mean, running_var, momentum=momentum,
                                           epsilon=epsilon, mode=mode, layout=layout, out=out, stream=s)
        activation_forward(y, "relu", out=y, stream=s)
        return y, dataclasses.replace(saved, activation=activation)
    kw = dict(momentum=momentum, epsilon=epsilon, mode=mode, layout=layout)
    if _use_ex(x, mode, layout):
        y = cm.output(out, x.shape, x.dtype, s)
        try:
            saved = _forward_training_ex(x, gamma, beta, running_mean, running_var, momentum, epsilon, y, s, mode,
                                         layout)
        except cm.CudnnError as exc:
            if not _refuse(x, exc):
                raise
        else:
            return y, saved
    if x.dtype == cm.BF16:
        # saved describes the float32 copy it was made for: the backward runs on float32 copies too
        y32, saved = _forward_training_cudnn(_cast(x, cm.F32, s), gamma, beta, running_mean, running_var,
                                             stream=s, **kw)
        return _cast(y32, cm.BF16, s, out=out), saved
    pdt = _param_dtype(x)
    y = cm.output(out, x.shape, x.dtype, s)
    cmode, x_desc, p_desc = _descs(x, mode, layout, pdt)
    handle, xd, pd = cm.cudnn_handle(s), x_desc.handle, p_desc.handle
    g, b = _as(gamma, pdt, s), _as(beta, pdt, s)
    rm, rv = _as(running_mean, pdt, s), _as(running_var, pdt, s)
    pshape = tuple(gamma.shape)
    save_mean, save_inv = cm.empty(pshape, pdt, s), cm.empty(pshape, pdt, s)
    try:
        C.cudnnBatchNormalizationForwardTraining(handle.handle, cmode, cm.ONE.of(x.dtype), cm.ZERO.of(x.dtype), xd,
                                                 x.ptr, xd, y.ptr, pd, g.ptr, b.ptr, 1.0 - float(momentum), rm.ptr,
                                                 rv.ptr, float(epsilon), save_mean.ptr, save_inv.ptr)
    except cm.CudnnError as exc:
        exc.add_context(**_context("cudnnBatchNormalizationForwardTraining", x, mode, layout, epsilon))
        raise
    if rm is not running_mean:  # widened float32 running statistics: write them back
        _cast(rm, running_mean.dtype, s, out=running_mean)
        _cast(rv, running_var.dtype, s, out=running_var)
    return y, BatchNormSaved(save_mean, save_inv, path=LEGACY, x_shape=tuple(x.shape), x_dtype=x.dtype)


# ---------------------------------------------------------------------- inference forward

def batchnorm_forward_inference(x: Any, gamma: Any, beta: Any, running_mean: Any, running_var: Any, *,
                                epsilon: float = 1e-3, mode: str = "spatial", layout: str = "NCHW", out: Any = None,
                                stream: Any = None) -> Any:
    """y = gamma * (x - running_mean) / sqrt(running_var + eps) + beta."""
    s = cm.stream_of(stream)
    if INFERENCE_KERNEL and _channels_last(x, mode, layout) and x.dtype in (cm.F32, cm.F16, cm.BF16):
        y = cm.output(out, x.shape, x.dtype, s)
        channels = int(x.shape[-1])
        cm.launch("batchnorm.cu", f"bn_infer_channels_last_{cm.suffix(x.dtype)}", x.size,
                  (cm.p(x), cm.p(y), cm.p(gamma), cm.p(beta), cm.p(running_mean), cm.p(running_var),
                   cm.i64(x.size), cm.i64(channels), cm.f32(epsilon)), s)
        return y
    if x.dtype == cm.BF16:
        y32 = batchnorm_forward_inference(_cast(x, cm.F32, s), gamma, beta, running_mean, running_var,
                                          epsilon=epsilon, mode=mode, layout=layout, stream=s)
        return _cast(y32, cm.BF16, s, out=out)
    pdt = _param_dtype(x)
    y = cm.output(out, x.shape, x.dtype, s)
    cmode, x_desc, p_desc = _descs(x, mode, layout, pdt)
    handle, xd, pd = cm.cudnn_handle(s), x_desc.handle, p_desc.handle
    g, b, rm, rv = (_as(a, pdt, s) for a in (gamma, beta, running_mean, running_var))
    try:
        C.cudnnBatchNormalizationForwardInference(handle.handle, cmode, cm.ONE.of(x.dtype), cm.ZERO.of(x.dtype), xd,
                                                  x.ptr, xd, y.ptr, pd, g.ptr, b.ptr, rm.ptr, rv.ptr, float(epsilon))
    except cm.CudnnError as exc:
        exc.add_context(**_context("cudnnBatchNormalizationForwardInference", x, mode, layout, epsilon))
        raise
    return y


# --------------------------------------------------------------------------- backward

def _backward_ex(dy: Any, x: Any, gamma: Any, saved: BatchNormSaved, epsilon: float, s: Any,
                 mode: str, layout: str, y: Any = None) -> "tuple[Any, Any, Any] | None":
    """Ex / SPATIAL_PERSISTENT backward, or None when cuDNN needs a reserve that ``saved`` lacks.

    ``y`` given: the fused relu backward (CUDNN_BATCHNORM_OPS_BN_ACTIVATION), ``dy`` w.r.t. the
    activated ``y``; it needs a record of the fused forward (its reserve and beta)."""
    fused = y is not None
    if fused and saved.beta is None:
        return None
    x_desc, p_desc = _ex_descs(x)  # held for the calls: a cache may evict them meanwhile
    act_desc = _relu_desc() if fused else None
    handle_obj = cm.cudnn_handle(s)
    handle, xd, pd = handle_obj.handle, x_desc.handle, p_desc.handle
    act = act_desc.handle if fused else 0
    key = _size_key(s.device_index, x, fused)
    _, reserve_size = _forward_sizes(handle, key, xd, pd, act)
    reserve = _reserve_for(saved, x, reserve_size, FUSED if fused else PERSISTENT) if reserve_size else None
    if reserve_size and reserve is None:
        return None
    save_mean, save_inv = saved.mean, saved.inv_std
    ws_size = _backward_workspace(handle, key, xd, pd, act)
    dx = cm.empty(x.shape, x.dtype, s)
    pshape = tuple(gamma.shape)
    dgamma, dbeta = cm.empty(pshape, cm.F32, s), cm.empty(pshape, cm.F32, s)
    one, zero = cm.ONE.of(x.dtype), cm.ZERO.of(x.dtype)
    ws = cudnn.workspace(s, ws_size)
    reserve_ptr = cm.ptr(reserve) if reserve is not None else 0
    try:
        if fused:
            C.cudnnBatchNormalizationBackwardEx(
                handle, _PERSISTENT, _OPS_BN_RELU, one, zero, one, zero, xd, x.ptr, xd, y.ptr, xd, dy.ptr, None, None,
                xd, dx.ptr, pd, gamma.ptr, saved.beta.ptr, dgamma.ptr, dbeta.ptr, float(epsilon), save_mean.ptr,
                save_inv.ptr, act, ws or None, ws_size, reserve_ptr or None, reserve_size)
        else:
            C.cudnnBatchNormalizationBackwardEx(
                handle, _PERSISTENT, _OPS_BN, one, zero, one, zero, xd, x.ptr, None, None, xd, dy.ptr, None, None, xd,
                dx.ptr, pd, gamma.ptr, None, dgamma.ptr, dbeta.ptr, float(epsilon), save_mean.ptr, save_inv.ptr, None,
                ws or None, ws_size, reserve_ptr or None, reserve_size)
    except cm.CudnnError as exc:
        exc.add_context(**_context("cudnnBatchNormalizationBackwardEx", x, mode, layout, epsilon),
                        workspace=ws_size, reserve=reserve_size, bn_ops="BN_ACTIVATION (relu)" if fused else "BN")
        raise
    return dx, dgamma, dbeta


def batchnorm_backward(dy: Any, x: Any, gamma: Any, saved: BatchNormSaved, *, epsilon: float = 1e-3,
                       mode: str = "spatial", layout: str = "NCHW", activation: "str | None" = None, y: Any = None,
                       stream: Any = None) -> "tuple[Any, Any, Any]":
    """(dx, dgamma, dbeta) from the forward's ``saved``; dgamma/dbeta are overwritten (beta for the
    parameter gradients is 0). ``activation="relu"``: ``dy`` w.r.t. the activated output ``y``."""
    s = cm.stream_of(stream)
    if activation is not None:
        if saved.path in (FUSED, GENSTATS) and _use_fused(x, mode, layout):
            try:
                result = _backward_ex(dy, x, gamma, saved, epsilon, s, mode, layout, y=y)
            except cm.CudnnError as exc:
                if not _refuse(x, exc, fused=True):
                    raise
            else:
                if result is not None:
                    return result
        # relu's backward from its output alone: y > 0 exactly where its input was
        dy = activation_backward(dy, y, y, "relu", stream=s)
    if _use_ex(x, mode, layout):
        try:
            result = _backward_ex(dy, x, gamma, saved, epsilon, s, mode, layout)
        except cm.CudnnError as exc:
            if not _refuse(x, exc):
                raise
        else:
            if result is not None:
                return result
    if x.dtype == cm.BF16:
        dx32, dg, db = batchnorm_backward(_cast(dy, cm.F32, s), _cast(x, cm.F32, s), gamma, saved,
                                          epsilon=epsilon, mode=mode, layout=layout, stream=s)
        return _cast(dx32, cm.BF16, s), dg, db
    pdt = _param_dtype(x)
    cmode, x_desc, p_desc = _descs(x, mode, layout, pdt)
    handle, xd, pd = cm.cudnn_handle(s), x_desc.handle, p_desc.handle
    g, sm, si = (_as(a, pdt, s) for a in (gamma, saved.mean, saved.inv_std))
    dx = cm.empty(x.shape, x.dtype, s)
    dgamma, dbeta = cm.empty(tuple(gamma.shape), pdt, s), cm.empty(tuple(gamma.shape), pdt, s)
    one, zero = cm.ONE.of(x.dtype), cm.ZERO.of(x.dtype)
    try:
        C.cudnnBatchNormalizationBackward(handle.handle, cmode, one, zero, one, zero, xd, x.ptr, xd, dy.ptr, xd, dx.ptr,
                                          pd, g.ptr, dgamma.ptr, dbeta.ptr, float(epsilon), sm.ptr, si.ptr)
    except cm.CudnnError as exc:
        exc.add_context(**_context("cudnnBatchNormalizationBackward", x, mode, layout, epsilon))
        raise
    if gamma.dtype != pdt:
        dgamma, dbeta = _cast(dgamma, gamma.dtype, s), _cast(dbeta, gamma.dtype, s)
    return dx, dgamma, dbeta
