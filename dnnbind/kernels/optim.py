"""Fused optimizer updates, in place over lists of tensors (Keras 3 formulas).

Shared arguments:

* ``params``/``grads``/state lists are parallel (one entry per variable, same shapes;
  state and parameters share a dtype, gradients may be of lower precision).
* ``lr`` and ``step`` may be Python numbers or 0-d arrays (so a captured CUDA graph
  reads the current value on replay).
* ``weight_decay`` is decoupled (Keras 3 / AdamW): ``p -= lr * weight_decay * p`` before the step.
* ``grad_scale``: the gradients are divided by it first (mixed-precision loss scaling).
* ``skip``: a 0-d int flag; nonzero means no parameter or state changes (an overflowed step).
  The step count is the caller's: :func:`advance_step` advances it under the same flag, so a
  skipped step leaves it, and with it Adam's next bias correction, unchanged.
* Gradient clipping, as Keras 3's optimizer arguments (applied to the gradients after the
  ``grad_scale`` division, before the update; at most one of them acts, in this order):
  ``clipnorm`` rescales each gradient tensor whose L2 norm exceeds it
  (``g * clipnorm / max(||g||, clipnorm)``); ``global_clipnorm`` rescales every gradient by
  ``global_clipnorm / max(||[g_1, ..., g_n]||, global_clipnorm)`` (NaN for every gradient when
  that norm is not finite, as ``clip_by_global_norm``); ``clipvalue`` clamps each element to
  ``[-clipvalue, clipvalue]`` (NaN stays NaN). ``clipnorm`` and ``global_clipnorm`` together are
  refused, as Keras refuses them. On CUDA the norms are reduced and the factors computed on the
  device (deterministic fixed-order sums, no host read), so a captured step stays capturable.
* ``tables``: an :class:`UpdateTables` the caller keeps across calls (an Optimizer keeps one), where
  the CUDA implementation keeps the device pointer tables it launches with; None: the tables are
  kept with ``params[0]`` and dropped when that array dies (so pass your own when ``params[0]`` is
  a view made for the call). Ignored by NumPy.
"""

from __future__ import annotations

import math
import numbers
import operator
from collections import OrderedDict
from typing import Any, NamedTuple, Sequence

import numpy as np

from .. import _validate
from ._dispatch import FLOAT_DTYPES, as_array, route, scalar

__all__ = ["sgd_update", "adam_update", "rmsprop_update", "advance_step", "GradientClipping", "UpdateTables",
           "PreparedUpdate"]


class UpdateTables:
    """The device pointer tables of the fused CUDA updates, kept by their owner across calls.

    Each CUDA update launch reads, per (parameter dtype, gradient dtype) group, a small int64
    table in device memory: every tensor's parameter, gradient and state addresses and its size
    (element count). Making one uploads it from pinned host memory. Whoever updates the same arrays
    step after step (each :class:`dnnbind.optimizers.Optimizer` holds one) passes one
    ``UpdateTables`` as ``tables=``, so each table is uploaded once.

    A table is looked up by the addresses and sizes it holds, so a hit is right whatever lives at
    those addresses now. At most ``max_entries`` tables are kept, the least recently used dropped
    first. While the stream is being captured into a CUDA graph nothing is looked up or kept: the
    captured update makes its own table, graph memory that dies inside the captured step (the
    graph re-uploads it from its own pinned bytes at every replay), so no graph ever addresses a
    table this object may drop. The NumPy implementation ignores it.
    """

    def __init__(self, max_entries: int = 64) -> None:
        self.max_entries = _validate.positive_int(max_entries, "max_entries", "UpdateTables")
        self._entries: "OrderedDict[tuple, Any]" = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"UpdateTables({len(self._entries)} of at most {self.max_entries} tables)"

    def clear(self) -> None:
        """Drop every kept table (freed stream-ordered, after the updates queued with them)."""
        self._entries.clear()

    # Used by dnnbind.kernels._cuda.optim; ``key`` is (device, the table's addresses and sizes).
    def _get(self, key: tuple) -> Any:
        entry = self._entries.get(key)
        if entry is not None:
            self._entries.move_to_end(key)
        return entry

    def _put(self, key: tuple, entry: Any) -> None:
        self._entries[key] = entry
        self._entries.move_to_end(key)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)


def _check_tables(op: str, tables: Any) -> None:
    if tables is not None and not isinstance(tables, UpdateTables):
        raise TypeError(f"{op}: tables must be a dnnbind.kernels.UpdateTables or None, got {type(tables).__name__}")


def _hyper(value: Any, name: str, op: str, **bounds: Any) -> float:
    """A float hyper-parameter (a number or a 0-d NumPy array): finite and within ``bounds``
    (:func:`dnnbind._validate.number`'s keywords), checked before anything runs."""
    if isinstance(value, np.ndarray) and value.ndim == 0:
        value = value.item()
    return _validate.number(value, name, op, **bounds)


def _check_number(value: Any, name: str, op: str, **bounds: Any) -> None:
    """``lr``/``step``/``grad_scale``: checked when given as a Python or NumPy number; arrays (0-d,
    possibly on the device, read again on every CUDA-graph replay) are left as they are."""
    if isinstance(value, (numbers.Real, np.generic)):
        _validate.number(value, name, op, **bounds)


def _as_list(value: Any) -> list:
    if value is None:
        return []
    if hasattr(value, "shape"):
        return [value]
    return list(value)


def _check_lists(op: str, params: list, **lists: "list | None") -> None:
    if not params:
        raise ValueError(f"{op}: params is empty")
    # One pass without indices first (every step of every model comes here); only a list that
    # fails it goes through the loops below, which name the entry.
    for p in params:
        if p.dtype.kind != "f":
            break
    else:
        for name, items in lists.items():
            if items is None:
                continue
            if len(items) != len(params):
                break
            same_dtype = name != "grads"
            for p, a in zip(params, items):
                if a is None or a.shape != p.shape or (same_dtype and a.dtype != p.dtype):
                    break
            else:
                continue
            break
        else:
            return
    for i, p in enumerate(params):
        if p.dtype.kind != "f":
            raise TypeError(f"{op}: params[{i}] must be float32 or float64, got {p.dtype}")
    for name, items in lists.items():
        if items is None:
            continue
        if len(items) != len(params):
            raise ValueError(f"{op}: {name} has {len(items)} entries but params has {len(params)}")
        for i, (p, a) in enumerate(zip(params, items)):
            if a is None:
                raise ValueError(f"{op}: {name}[{i}] is None")
            if tuple(a.shape) != tuple(p.shape):
                raise ValueError(f"{op}: {name}[{i}] has shape {tuple(a.shape)} but params[{i}] has {tuple(p.shape)}")
            if name != "grads" and a.dtype != p.dtype:
                raise TypeError(f"{op}: {name}[{i}] has dtype {a.dtype} but params[{i}] has {p.dtype}")


class GradientClipping(NamedTuple):
    """The clipping that acts (Keras 3 precedence): ``mode`` is None, ``"norm"``, ``"global_norm"``
    or ``"value"``; ``value`` the threshold (an L2 norm, or the bound of ``|g|``)."""

    mode: "str | None" = None
    value: float = 0.0


def _clipping(op: str, clipnorm: Any, global_clipnorm: Any, clipvalue: Any) -> GradientClipping:
    """Validate the three clipping arguments and resolve which one acts."""
    checked = {}
    for name, value in (("clipnorm", clipnorm), ("global_clipnorm", global_clipnorm), ("clipvalue", clipvalue)):
        checked[name] = None if value is None else _hyper(value, name, op, low=0.0, low_open=True)
    if checked["clipnorm"] is not None and checked["global_clipnorm"] is not None:
        raise ValueError(f"{op}: only one of clipnorm and global_clipnorm can be set, got "
                         f"clipnorm={checked['clipnorm']:g}, global_clipnorm={checked['global_clipnorm']:g}")
    # Keras 3's _clip_gradients: the first one set wins, the others are ignored
    for name, mode in (("clipnorm", "norm"), ("global_clipnorm", "global_norm"), ("clipvalue", "value")):
        if checked[name] is not None:
            return GradientClipping(mode, checked[name])
    return GradientClipping()


def _host_grads(params: list, grads: list, inv_scale: "float | None", clip: GradientClipping) -> list:
    """The gradients as the update uses them: in the parameters' dtype, divided by the loss scale,
    then clipped. Never writes into the caller's gradient arrays."""
    out = [_grad(g, p.dtype, inv_scale) for p, g in zip(params, grads)]
    if clip.mode is None:
        return out
    if clip.mode == "value":
        return [np.clip(g, -clip.value, clip.value) for g in out]
    sumsq = [float(np.sum(np.square(g, dtype=np.float64))) for g in out]
    if clip.mode == "norm":
        # clip / max(norm, clip); a NaN norm gives a NaN factor (np.maximum propagates it, as Keras)
        factors = [clip.value / max(math.sqrt(s), clip.value) if s == s else s for s in sumsq]
    else:
        total = math.fsum(sumsq)
        # a non-finite global norm poisons every gradient, as Keras's clip_by_global_norm
        norm = math.sqrt(total) if math.isfinite(total) else float("nan")
        factor = clip.value / norm if norm > clip.value else (1.0 if norm == norm else norm)
        factors = [factor] * len(out)
    with np.errstate(invalid="ignore"):  # inf * 0 -> NaN is the intended result for a non-finite norm
        return [g * g.dtype.type(f) for g, f in zip(out, factors)]


def _route(op: str, params: list, grads: list, *states: list) -> Any:
    arrays = {"params[0]": params[0], "grads[0]": grads[0]}
    for k, st in enumerate(states):
        if st:
            arrays[f"state{k}[0]"] = st[0]
    return route(op, "optim", **arrays)


def _skipped(skip: Any) -> bool:
    return skip is not None and int(np.asarray(skip)) != 0


def _grad(g: np.ndarray, dtype: np.dtype, inv_scale: "float | None") -> np.ndarray:
    g = g.astype(dtype, copy=inv_scale is not None)
    if inv_scale is not None:
        g *= inv_scale
    return g


def _inv_scale(op: str, grad_scale: Any) -> "float | None":
    if grad_scale is None:
        return None
    s = scalar(grad_scale, op, "grad_scale")
    if s == 0:
        raise ValueError(f"{op}: grad_scale must be nonzero")
    return 1.0 / s


def sgd_update(
    params: Sequence[Any],
    grads: Sequence[Any],
    velocities: "Sequence[Any] | None",
    *,
    lr: Any,
    momentum: float = 0.0,
    nesterov: bool = False,
    weight_decay: float = 0.0,
    grad_scale: Any = None,
    skip: Any = None,
    clipnorm: "float | None" = None,
    global_clipnorm: "float | None" = None,
    clipvalue: "float | None" = None,
    tables: "UpdateTables | None" = None,
    stream: Any = None,
) -> None:
    """SGD (Keras 3): with momentum ``v = momentum * v - lr * g``; ``p += v`` or, with
    nesterov, ``p += momentum * v - lr * g``; without momentum ``p -= lr * g``
    (``velocities`` may then be None).

    CUDA: ``_cuda.optim.sgd_update(params, grads, velocities, lr=lr, momentum=momentum, nesterov=nesterov,
    weight_decay=weight_decay, grad_scale=grad_scale, skip=skip, clip=clip, tables=tables, stream=stream)``
    with lists (``velocities`` None or a list), ``momentum``/``weight_decay`` floats and ``clip`` a
    :class:`GradientClipping`.
    """
    impl, args, kw = _sgd_checked(params, grads, velocities, lr=lr, momentum=momentum, nesterov=nesterov,
                                  weight_decay=weight_decay, grad_scale=grad_scale, clipnorm=clipnorm,
                                  global_clipnorm=global_clipnorm, clipvalue=clipvalue, tables=tables)
    if impl is not None:
        return impl.sgd_update(*args, **kw, skip=skip, stream=stream)
    return _sgd_numpy(*args, **kw, skip=skip)


def _sgd_checked(params, grads, velocities, *, lr, momentum=0.0, nesterov=False, weight_decay=0.0, grad_scale=None,
                 clipnorm=None, global_clipnorm=None, clipvalue=None, tables=None) -> tuple:
    """sgd_update's checks: (implementation module or None, lists, keyword arguments of the update)."""
    op = "sgd_update"
    _check_number(lr, "lr", op, low=0.0)
    _check_number(grad_scale, "grad_scale", op, low=0.0, low_open=True)
    momentum = _hyper(momentum, "momentum", op, low=0.0, high=1.0)  # Keras 3's range
    weight_decay = _hyper(weight_decay, "weight_decay", op, low=0.0)
    nesterov = _validate.boolean(nesterov, "nesterov", op)
    params, grads = [as_array(p) for p in _as_list(params)], [as_array(g) for g in _as_list(grads)]
    velocities = [as_array(v) for v in _as_list(velocities)] or None
    if momentum and velocities is None:
        raise ValueError(f"{op}: momentum={momentum} needs velocities")
    clip = _clipping(op, clipnorm, global_clipnorm, clipvalue)
    _check_tables(op, tables)
    _check_lists(op, params, grads=grads, velocities=velocities)
    impl = _route(op, params, grads, velocities or [])
    return impl, (params, grads, velocities), dict(lr=lr, momentum=momentum, nesterov=nesterov,
                                                   weight_decay=weight_decay, grad_scale=grad_scale, clip=clip,
                                                   tables=tables)


def _sgd_numpy(params, grads, velocities, *, lr, momentum, nesterov, weight_decay, grad_scale, clip, tables,
               skip) -> None:
    op = "sgd_update"
    if _skipped(skip):
        return None
    lr_f = scalar(lr, op, "lr")
    host_grads = _host_grads(params, grads, _inv_scale(op, grad_scale), clip)
    for i, (p, g) in enumerate(zip(params, host_grads)):
        if weight_decay:
            p -= (lr_f * weight_decay) * p
        if momentum:
            v = velocities[i]
            v *= momentum
            v -= lr_f * g
            if nesterov:
                p += momentum * v - lr_f * g
            else:
                p += v
        else:
            p -= lr_f * g
    return None


def adam_update(
    params: Sequence[Any],
    grads: Sequence[Any],
    m: Sequence[Any],
    v: Sequence[Any],
    *,
    lr: Any,
    step: Any,
    beta1: float = 0.9,
    beta2: float = 0.999,
    epsilon: float = 1e-7,
    weight_decay: float = 0.0,
    amsgrad: bool = False,
    vhat: "Sequence[Any] | None" = None,
    grad_scale: Any = None,
    skip: Any = None,
    clipnorm: "float | None" = None,
    global_clipnorm: "float | None" = None,
    clipvalue: "float | None" = None,
    tables: "UpdateTables | None" = None,
    stream: Any = None,
) -> None:
    """Adam / AdamW (Keras 3). ``step`` is the 1-based number of this update (Keras ``iterations + 1``):

    ``m += (g - m)(1 - b1)``, ``v += (g^2 - v)(1 - b2)``,
    ``lr_t = lr * sqrt(1 - b2^step) / (1 - b1^step)``, ``p -= lr_t * m / (sqrt(v) + eps)``.
    With ``amsgrad``, ``vhat = max(vhat, v)`` replaces ``v`` in the last formula.

    CUDA: ``_cuda.optim.adam_update(params, grads, m, v, lr=lr, step=step, beta1=beta1, beta2=beta2,
    epsilon=epsilon, weight_decay=weight_decay, amsgrad=amsgrad, vhat=vhat, grad_scale=grad_scale,
    skip=skip, clip=clip, tables=tables, stream=stream)`` with lists and float hyper-parameters.
    """
    impl, args, kw = _adam_checked(params, grads, m, v, lr=lr, step=step, beta1=beta1, beta2=beta2,
                                   epsilon=epsilon, weight_decay=weight_decay, amsgrad=amsgrad, vhat=vhat,
                                   grad_scale=grad_scale, clipnorm=clipnorm, global_clipnorm=global_clipnorm,
                                   clipvalue=clipvalue, tables=tables)
    if impl is not None:
        return impl.adam_update(*args, **kw, skip=skip, stream=stream)
    return _adam_numpy(*args, **kw, skip=skip)


def _adam_checked(params, grads, m, v, *, lr, step, beta1=0.9, beta2=0.999, epsilon=1e-7, weight_decay=0.0,
                  amsgrad=False, vhat=None, grad_scale=None, clipnorm=None, global_clipnorm=None, clipvalue=None,
                  tables=None) -> tuple:
    """adam_update's checks: (implementation module or None, lists, keyword arguments of the update)."""
    op = "adam_update"
    _check_number(lr, "lr", op, low=0.0)
    _check_number(step, "step", op, low=1.0)
    _check_number(grad_scale, "grad_scale", op, low=0.0, low_open=True)
    beta1 = _hyper(beta1, "beta1", op, low=0.0, high=1.0, high_open=True)
    beta2 = _hyper(beta2, "beta2", op, low=0.0, high=1.0, high_open=True)
    epsilon = _hyper(epsilon, "epsilon", op, low=0.0)
    weight_decay = _hyper(weight_decay, "weight_decay", op, low=0.0)
    amsgrad = _validate.boolean(amsgrad, "amsgrad", op)
    params, grads = [as_array(p) for p in _as_list(params)], [as_array(g) for g in _as_list(grads)]
    m, v = [as_array(a) for a in _as_list(m)], [as_array(a) for a in _as_list(v)]
    vhat = [as_array(a) for a in _as_list(vhat)] or None
    if amsgrad and vhat is None:
        raise ValueError(f"{op}: amsgrad=True needs vhat (one zero-initialised tensor per parameter)")
    clip = _clipping(op, clipnorm, global_clipnorm, clipvalue)
    _check_tables(op, tables)
    _check_lists(op, params, grads=grads, m=m, v=v, vhat=vhat)
    impl = _route(op, params, grads, m, v)
    return impl, (params, grads, m, v), dict(lr=lr, step=step, beta1=beta1, beta2=beta2, epsilon=epsilon,
                                             weight_decay=weight_decay, amsgrad=amsgrad, vhat=vhat,
                                             grad_scale=grad_scale, clip=clip, tables=tables)


def _adam_numpy(params, grads, m, v, *, lr, step, beta1, beta2, epsilon, weight_decay, amsgrad, vhat, grad_scale,
                clip, tables, skip) -> None:
    op = "adam_update"
    if _skipped(skip):
        return None
    lr_f = scalar(lr, op, "lr")
    t = scalar(step, op, "step")
    if t < 1:
        raise ValueError(f"{op}: step must be >= 1 (the 1-based update count), got {t}")
    lr_t = lr_f * math.sqrt(1.0 - beta2 ** t) / (1.0 - beta1 ** t)
    host_grads = _host_grads(params, grads, _inv_scale(op, grad_scale), clip)
    for i, (p, g) in enumerate(zip(params, host_grads)):
        if weight_decay:
            p -= (lr_f * weight_decay) * p
        mi, vi = m[i], v[i]
        mi += (g - mi) * (1.0 - beta1)
        vi += (g * g - vi) * (1.0 - beta2)
        denom = vi
        if amsgrad:
            np.maximum(vhat[i], vi, out=vhat[i])
            denom = vhat[i]
        denom = np.sqrt(denom)
        denom += epsilon
        p -= lr_t * mi / denom
    return None


def rmsprop_update(
    params: Sequence[Any],
    grads: Sequence[Any],
    avg_sq: Sequence[Any],
    *,
    lr: Any,
    rho: float = 0.9,
    momentum: float = 0.0,
    epsilon: float = 1e-7,
    centered: bool = False,
    mom: "Sequence[Any] | None" = None,
    avg: "Sequence[Any] | None" = None,
    weight_decay: float = 0.0,
    grad_scale: Any = None,
    skip: Any = None,
    clipnorm: "float | None" = None,
    global_clipnorm: "float | None" = None,
    clipvalue: "float | None" = None,
    tables: "UpdateTables | None" = None,
    stream: Any = None,
) -> None:
    """RMSprop (Keras 3): ``avg_sq = rho * avg_sq + (1 - rho) g^2``; centered also keeps
    ``avg = rho * avg + (1 - rho) g`` and uses ``avg_sq - avg^2``; ``inc = lr * g / sqrt(denominator + eps)``
    (epsilon inside the root, as Keras); with momentum ``mom = momentum * mom + inc; p -= mom``,
    else ``p -= inc``.

    CUDA: ``_cuda.optim.rmsprop_update(params, grads, avg_sq, lr=lr, rho=rho, momentum=momentum,
    epsilon=epsilon, centered=centered, mom=mom, avg=avg, weight_decay=weight_decay,
    grad_scale=grad_scale, skip=skip, clip=clip, tables=tables, stream=stream)``.
    """
    impl, args, kw = _rmsprop_checked(params, grads, avg_sq, lr=lr, rho=rho, momentum=momentum, epsilon=epsilon,
                                      centered=centered, mom=mom, avg=avg, weight_decay=weight_decay,
                                      grad_scale=grad_scale, clipnorm=clipnorm, global_clipnorm=global_clipnorm,
                                      clipvalue=clipvalue, tables=tables)
    if impl is not None:
        return impl.rmsprop_update(*args, **kw, skip=skip, stream=stream)
    return _rmsprop_numpy(*args, **kw, skip=skip)


def _rmsprop_checked(params, grads, avg_sq, *, lr, rho=0.9, momentum=0.0, epsilon=1e-7, centered=False, mom=None,
                     avg=None, weight_decay=0.0, grad_scale=None, clipnorm=None, global_clipnorm=None, clipvalue=None,
                     tables=None) -> tuple:
    """rmsprop_update's checks: (implementation module or None, lists, keyword arguments of the update)."""
    op = "rmsprop_update"
    _check_number(lr, "lr", op, low=0.0)
    _check_number(grad_scale, "grad_scale", op, low=0.0, low_open=True)
    rho = _hyper(rho, "rho", op, low=0.0, high=1.0)
    momentum = _hyper(momentum, "momentum", op, low=0.0, high=1.0)
    epsilon = _hyper(epsilon, "epsilon", op, low=0.0)
    weight_decay = _hyper(weight_decay, "weight_decay", op, low=0.0)
    centered = _validate.boolean(centered, "centered", op)
    params, grads = [as_array(p) for p in _as_list(params)], [as_array(g) for g in _as_list(grads)]
    avg_sq = [as_array(a) for a in _as_list(avg_sq)]
    mom = [as_array(a) for a in _as_list(mom)] or None
    avg = [as_array(a) for a in _as_list(avg)] or None
    if momentum and mom is None:
        raise ValueError(f"{op}: momentum={momentum} needs mom (one zero-initialised tensor per parameter)")
    if centered and avg is None:
        raise ValueError(f"{op}: centered=True needs avg (one zero-initialised tensor per parameter)")
    clip = _clipping(op, clipnorm, global_clipnorm, clipvalue)
    _check_tables(op, tables)
    _check_lists(op, params, grads=grads, avg_sq=avg_sq, mom=mom if momentum else None, avg=avg if centered else None)
    impl = _route(op, params, grads, avg_sq)
    return impl, (params, grads, avg_sq), dict(lr=lr, rho=rho, momentum=momentum, epsilon=epsilon,
                                               centered=centered, mom=mom, avg=avg, weight_decay=weight_decay,
                                               grad_scale=grad_scale, clip=clip, tables=tables)


def _rmsprop_numpy(params, grads, avg_sq, *, lr, rho, momentum, epsilon, centered, mom, avg, weight_decay,
                   grad_scale, clip, tables, skip) -> None:
    op = "rmsprop_update"
    if _skipped(skip):
        return None
    lr_f = scalar(lr, op, "lr")
    host_grads = _host_grads(params, grads, _inv_scale(op, grad_scale), clip)
    for i, (p, g) in enumerate(zip(params, host_grads)):
        if weight_decay:
            p -= (lr_f * weight_decay) * p
        s = avg_sq[i]
        s *= rho
        s += (1.0 - rho) * g * g
        if centered:
            a = avg[i]
            a *= rho
            a += (1.0 - rho) * g
            denom = s - a * a
        else:
            denom = s.copy()
        denom += epsilon
        inc = lr_f * g / np.sqrt(denom)
        if momentum:
            mo = mom[i]
            mo *= momentum
            mo += inc
            p -= mo
        else:
            p -= inc
    return None


_CHECKED = {"sgd": (_sgd_checked, _sgd_numpy, "sgd_update"), "adam": (_adam_checked, _adam_numpy, "adam_update"),
            "rmsprop": (_rmsprop_checked, _rmsprop_numpy, "rmsprop_update")}


class PreparedUpdate:
    """One of the fused updates with its parameter and state lists and hyper-parameters checked once,
    for a caller that updates the same arrays step after step (each ``Optimizer``).

    ``PreparedUpdate("sgd" | "adam" | "rmsprop", params, *states, **hyper)`` runs the public op's
    checks, with the parameters standing in for the gradients (``states`` and ``hyper`` as that op
    takes them: ``velocities``; ``m, v``; ``avg_sq``; every keyword but ``grads``, ``lr``, ``step``,
    ``grad_scale``, ``skip`` and ``stream``). ``prepared(grads, lr=, step=, grad_scale=, skip=,
    stream=)`` then checks only what may change per call, in one pass: the gradients (one per
    parameter, its shape, a float dtype, on the parameters' backend and device) and, when given as
    numbers, ``lr``/``step``/``grad_scale``. The checks of anything that changes otherwise are the
    caller's to redo by preparing again (an Optimizer does when its slots, hyper-parameters or
    parameter arrays change: :meth:`matches`). The CUDA implementation also keeps, with this object,
    the gradient-dtype grouping and the part of each pointer table's key the gradients do not change.
    """

    def __init__(self, kind: str, params: Sequence[Any], *states: Any, **hyper: Any) -> None:
        checked, self._numpy, self._op = _CHECKED[kind]
        self.kind = kind
        extra = {"lr": 0.0, "grad_scale": None}
        if kind == "adam":
            extra["step"] = 1
        self._impl, args, kw = checked(params, params, *states, **extra, **hyper)
        for name in extra:
            del kw[name]
        self._args, self._kw = args, kw
        self._given = (list(params), *[None if st is None else list(st) for st in states],
                       {k: list(v) if isinstance(v, (list, tuple)) else v for k, v in hyper.items()})
        params = args[0]
        self._shapes = [p.shape for p in params]
        self._type = type(params[0])
        self._device = getattr(params[0], "device_index", None)
        self._impl_fn = None if self._impl is None else getattr(self._impl, self._op)
        # kept by the CUDA implementation (kernels._cuda.optim): {gradient dtypes: grouping}
        self._groupings: dict = {}

    def matches(self, params: Sequence[Any], *states: Any, **hyper: Any) -> bool:
        """Whether this was prepared for these very arrays (by identity; lists of arrays among
        ``hyper`` too) and equal hyper-parameters."""
        given = self._given
        kept_hyper = given[-1]
        if len(states) + 2 != len(given) or hyper.keys() != kept_hyper.keys():
            return False
        for name, value in hyper.items():
            kept = kept_hyper[name]
            if isinstance(value, (list, tuple)):
                if not _same_arrays(value, kept):
                    return False
            elif value is not kept and (isinstance(kept, (list, tuple)) or value != kept):
                return False
        return _same_arrays(params, given[0]) and all(map(_same_arrays, states, given[1:-1]))

    def _check_grads(self, grads: list) -> None:
        ok = (len(grads) == len(self._shapes) and list(map(_shape_of, grads)) == self._shapes
              and set(map(type, grads)) == {self._type} and set(map(_dtype_of, grads)) <= _FLOAT_SET)
        if ok and self._device is not None:
            ok = set(map(_device_of, grads)) == {self._device}
        if not ok:
            # the full check names the first bad gradient (and raises); a device mismatch it cannot
            # see is reported here
            _check_lists(self._op, self._args[0], grads=[as_array(g) for g in grads])
            raise TypeError(f"{self._op}: every gradient must be a float {self._type.__name__} like the "
                            f"parameters" + ("" if self._device is None else f", on their device ({self._device})"))

    def __call__(self, grads: Sequence[Any], *, lr: Any, step: Any = None, grad_scale: Any = None, skip: Any = None,
                 stream: Any = None) -> None:
        op = self._op
        grads = list(grads)
        self._check_grads(grads)
        _check_number(lr, "lr", op, low=0.0)
        _check_number(grad_scale, "grad_scale", op, low=0.0, low_open=True)
        kw = dict(self._kw, lr=lr, grad_scale=grad_scale)
        if self.kind == "adam":
            _check_number(step, "step", op, low=1.0)
            kw["step"] = step
        args = (self._args[0], grads, *self._args[2:])
        if self._impl_fn is None:
            return self._numpy(*args, **kw, skip=skip)
        return self._impl_fn(*args, **kw, skip=skip, stream=stream, prepared=self)


def _same_arrays(a: "Sequence[Any] | None", b: "Sequence[Any] | None") -> bool:
    """Both None, or lists of the same arrays (by identity) in the same order."""
    if a is None or b is None:
        return a is b
    return isinstance(b, (list, tuple)) and len(a) == len(b) and all(map(operator.is_, a, b))


_shape_of = operator.attrgetter("shape")
_dtype_of = operator.attrgetter("dtype")
_device_of = operator.attrgetter("device_index")
_FLOAT_SET = frozenset(FLOAT_DTYPES)


_STEP_DTYPES = (np.dtype(np.float32), np.dtype(np.int32), np.dtype(np.int64))


def advance_step(step: Any, *, skip: Any = None, stream: Any = None) -> None:
    """``step += 1`` in place, unless ``skip`` is nonzero: the count of applied updates.

    ``step`` is a one-element float32/int32/int64 array (what :func:`adam_update` takes as its
    1-based ``step`` after this call); ``skip`` is None, a number or a 0-d int32 flag. On CUDA the
    kernel reads the flag on the device (one thread, no host read), so a captured CUDA graph and a
    step skipped for overflowed gradients stay right.

    CUDA: ``_cuda.optim.advance_step(step, skip=skip, stream=stream)``.
    """
    op = "advance_step"
    if not hasattr(step, "shape"):
        raise TypeError(f"{op}: step must be an array (it is advanced in place), got {type(step).__name__}")
    step = as_array(step)
    if step.size != 1 or np.dtype(step.dtype) not in _STEP_DTYPES:
        raise TypeError(f"{op}: step must be a one-element float32, int32 or int64 array, got {step.dtype} "
                        f"{tuple(step.shape)}")
    impl = route(op, "optim", step=step)
    if impl is not None:
        return impl.advance_step(step, skip=skip, stream=stream)
    if not _skipped(skip):
        step += 1
    return None
