"""Mixed precision inside the steps: the dynamic loss scale, the compute-dtype weight copies, float32 outputs.

The policies themselves live in :mod:`dnnbind.mixed_precision`; this module is what a train, test or
predict step does with them (docs/DESIGN.md, "The train step's own per-step work"):

* :class:`LossScale`: mixed_float16's loss scale on the device, with Keras's LossScaleOptimizer rules;
* :func:`precast_weights` / :func:`end_precast`: before the forward of every step, every weight a layer
  casts to its compute dtype is cast by one multi-tensor launch per (source, target) dtype pair, and
  the copies are dropped when the step ends;
* :func:`grads_in_compute_dtype`: whether the precast layers may leave their weight gradients in the
  compute dtype for the optimizer's fused update;
* :func:`to_float32`: an output or loss in float32 (float64 stays).

The functions take the model (a :class:`~dnnbind.trainers.trainer.Trainer`) as their first argument;
the trainer calls them once per step, as it called its own methods before.
"""

from __future__ import annotations

import operator
from typing import Any

import numpy as np

from .. import backend, kernels
from ..backend import Device
from ..kernels._dispatch import FLOAT_DTYPES
from ..layers.base import applied_twice, cast_generation

__all__ = ["LossScale", "precast_groups", "precast_weights", "end_precast", "grads_in_compute_dtype",
           "to_float32"]

_F32 = np.dtype(np.float32)
_F64 = np.dtype(np.float64)


def to_float32(out: Any) -> Any:
    return out if out.dtype == _F32 or out.dtype == _F64 else kernels.cast(out, _F32)


class LossScale:
    """Dynamic loss scaling state on the device (mixed_float16), with Keras's LossScaleOptimizer rules.

    ``scale`` multiplies the loss gradient; the optimizer divides the gradients by it
    (``grad_scale=``). A step whose gradients are not all finite is skipped on the device (the
    parameters, the optimizer's slots and its step count stay as they were: ``skip=`` flag) and
    halves the scale. The finite-step counter is read back once every ``growth_steps`` steps (the
    only host synchronisation) to double the scale after ``growth_steps`` finite steps in a row.
    """

    def __init__(self, device: Device, initial: float = 2.0**15, growth_steps: int = 2000) -> None:
        up = lambda v: backend.asarray(np.array(v, _F32), device=device)  # noqa: E731
        self.scale = up(initial)
        self.good_steps = up(0.0)
        self._one, self._half = up(1.0), up(0.5)
        self.growth_steps = int(growth_steps)
        self._steps = 0

    def check(self, grads: list) -> tuple[Any, Any]:
        """``(skip, finite)`` 0-d flags for this step's gradients: ``skip`` int32 (1 when not all finite,
        as the optimizer ops take it), ``finite`` float32 (1.0 or 0.0, for the scale arithmetic)."""
        finite = kernels.cast(kernels.all_finite(grads), _F32)
        return kernels.cast(kernels.subtract(self._one, finite), np.int32), finite

    def update(self, finite: Any) -> None:
        """After the (possibly skipped) update: halve the scale on a non-finite step, count finite steps."""
        factor = kernels.add(kernels.scale(finite, 0.5), self._half)       # 1.0 (finite) or 0.5
        kernels.multiply(self.scale, factor, out=self.scale)
        kernels.axpy(1.0, self._one, self.good_steps)
        kernels.multiply(self.good_steps, finite, out=self.good_steps)  # reset on a non-finite step

    def maybe_grow(self) -> bool:
        """After a step: every ``growth_steps`` steps read the finite-step counter (synchronising) and
        double the scale when they were all finite. Returns whether it synchronised."""
        self._steps += 1
        if self._steps % self.growth_steps:
            return False
        if float(backend.to_numpy(self.good_steps)) >= self.growth_steps:
            kernels.scale(self.scale, 2.0, out=self.scale)
            kernels.fill(self.good_steps, 0.0)
        return True

    def after_step(self, optimizer: Any) -> None:
        """After a train step (``fit``, ``train_on_batch``): the growth check; when it synchronised, the
        optimizer's update count is confirmed from the device too (it skips overflowed steps there), at
        no extra wait."""
        if self.maybe_grow() and optimizer is not None:
            optimizer._confirm_iterations()


_VALUE = operator.attrgetter("value")
_POLICY = operator.attrgetter("dtype_policy")


def precast_groups(model: Any, layers: list) -> list:
    """``[([(layer, weight)], kernels.elementwise.CastMany)]``: the weights the layers cast to their
    compute dtype (``Layer._cast_weights``), grouped by (source, target) dtype. Kept on the model
    while the layer list, every layer's cast set (``layers.base.cast_generation``), dtype policy and
    weight array stay the same: made once, checked per step by identity."""
    gen = cast_generation()
    kept = model.__dict__.get("_precast_kept")
    # (compared by C-level maps: this runs every step)
    if kept is not None and kept[0] == gen and kept[1] == layers and all(
            map(operator.is_, map(_VALUE, kept[6]), kept[4])) and all(map(operator.is_, map(_POLICY, layers), kept[5])):
        return kept[2]
    policies = [layer.dtype_policy for layer in layers]
    groups: dict = {}
    for layer in layers:
        cast = layer._cast_weights
        if not cast:
            continue
        want = layer._effective_compute_dtype()
        owned = set(map(id, layer._weights))
        for w, dt in cast.items():
            value = w.value
            # a stale entry (policy or device changed, weight dropped) is simply not precast
            if dt == want and value.dtype != dt and id(w) in owned and value.dtype in FLOAT_DTYPES:
                groups.setdefault((value.dtype, dt), ([], []))
                groups[(value.dtype, dt)][0].append((layer, w))
                groups[(value.dtype, dt)][1].append(value)
    # CastMany: checked here, once; it keeps its device table while it holds the arrays
    out = [(entries, kernels.elementwise.CastMany(values, dt)) for (_, dt), (entries, values) in groups.items()]
    pairs = [e for entries, _ in out for e in entries]
    model._precast_kept = (gen, list(layers), out, pairs, [w.value for _, w in pairs], policies, [w for _, w in pairs])
    return out


def precast_weights(model: Any, layers: list) -> list:
    """Every compute-dtype weight copy of this step, made by one multi-tensor cast per dtype pair
    before the forward (instead of one launch per weight inside it); ``Layer._compute_weight``
    returns them. Returns the layers given copies: :func:`end_precast` drops them when the step
    ends, so no copy outlives its step (a captured step frees them inside the graph) or reads
    weights the optimizer has since updated."""
    groups = precast_groups(model, layers)
    if not groups:
        return []
    made: dict = {}
    for entries, cast in groups:
        for (layer, w), copy in zip(entries, cast()):
            made.setdefault(id(layer), (layer, {}))[1][w] = copy
    # handed out only once every cast was queued: a failed one leaves no layer holding copies
    # (through __dict__: plain private fields, set on every layer each step, need no tracking __setattr__)
    for layer, pre in made.values():
        layer.__dict__["_precast"] = pre
    return [layer for layer, _ in made.values()]


def end_precast(touched: list) -> None:
    for layer in touched:
        d = layer.__dict__
        d["_precast"] = None
        d["_keep_grad_dtype"] = False
        # ops reads of the copies this step (ops/_core._autocast_read), kept in the layer's __dict__ while a step
        # runs (outside the trainer protocol: the ops room writes it)
        d.pop("_precast_reads", None)


def grads_in_compute_dtype(model: Any, replica: Any) -> bool:
    """Whether layers may leave their weight gradients in the compute dtype this step: the
    optimizer's fused update reads them (bitwise as if they had been cast first), nobody else
    does (a distribution all-reduces float32 gradients), and no layer was applied twice (the engine
    sums such a layer's gradients, in the weight's dtype)."""
    opt = model.optimizer
    return replica is None and opt is not None and opt._reads_compute_grads() and not applied_twice()
