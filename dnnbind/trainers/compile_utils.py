"""``compile``'s arguments resolved per output, and the compile config that round-trips them.

Keras 3 keeps the same job in ``keras/src/trainers/compile_utils.py``. Here it is all that happens
before ``Trainer.compile`` sets anything on the model: every argument resolved (a failure leaves the
model as it was, compiled or not), then handed over as one :class:`CompileArguments`. The trainer keeps
the resolved losses, weights and metrics as plain lists on the model (``_losses``, ``_loss_weights``,
``_output_metrics``, ``_metrics``): the steps read them every batch, with no container in between.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from .. import _validate
from .. import losses as losses_module
from .. import metrics as metrics_module
from .. import optimizers as optimizers_module

__all__ = ["NoLoss", "CompileArguments", "check_jit_compile", "per_output", "metric_spec", "resolve",
           "compile_arguments"]


class NoLoss:
    """An output's "loss" when ``compile`` got none (a custom ``train_step`` computes its own): its targets
    still travel to the step, as given (floats in float32)."""

    name = "no_loss"
    fuses_softmax = False

    def prepare_labels(self, y: np.ndarray, output_shape: Any, owner: str = "") -> np.ndarray:
        arr = np.asarray(y)
        return np.ascontiguousarray(arr, dtype=np.float32) if arr.dtype.kind == "f" else np.ascontiguousarray(arr)


class CompileArguments(NamedTuple):
    """``compile``'s resolved arguments, per output in the model's output order."""

    optimizer: Any
    losses: list         # a loss object, NoLoss, or None (that output has no loss)
    loss_weights: list   # floats
    loss: Any            # what ``model.loss`` shows: one loss, or a list/dict shaped as given
    output_metrics: list  # one list of Metric objects per output (names prefixed with several outputs)
    metrics: list        # output_metrics flattened
    config: dict         # get_compile_config()'s dict


def check_jit_compile(value: Any, what: str) -> Any:
    if isinstance(value, str) and value == "auto":
        return "auto"
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    raise ValueError(f"{what}: jit_compile must be 'auto', True or False, got {value!r}")


def per_output(value: Any, names: list[str], what: str, owner: str, allow_none: bool) -> list:
    """A compile argument given once, as a list (one per output) or a dict (by output name), per output."""
    if isinstance(value, dict):
        unknown = sorted(set(value) - set(names))
        if unknown:
            raise ValueError(f"{owner}: {what} has keys {unknown} that are not output names {names}")
        if not allow_none and any(n not in value for n in names):
            raise ValueError(f"{owner}: {what} must have an entry for every output {names}, got {sorted(value)}")
        return [value.get(n) for n in names]
    if isinstance(value, (list, tuple)):
        if len(value) != len(names):
            raise ValueError(f"{owner}: {what} is a list of {len(value)} but the model has {len(names)} "
                             f"output(s) {names}; give one per output, or a dict keyed by output name")
        return list(value)
    return [value] * len(names)


def metric_spec(metrics: Any, names: list[str], owner: str) -> list[list]:
    """One list of metric identifiers per output."""
    if metrics is None:
        return [[] for _ in names]
    if isinstance(metrics, (str, metrics_module.Metric)):
        metrics = [metrics]
    if isinstance(metrics, dict):
        groups = per_output(metrics, names, "metrics", owner, allow_none=True)
        return [[] if g is None else (list(g) if isinstance(g, (list, tuple)) else [g]) for g in groups]
    if not isinstance(metrics, (list, tuple)):
        raise _validate.ArgumentTypeError(f"{owner}: metrics must be a list of metric names, Metric "
                                          f"instances or functions, got {type(metrics).__name__}")
    if len(names) > 1 and metrics and all(isinstance(g, (list, tuple)) or g is None for g in metrics):
        groups = per_output(list(metrics), names, "metrics", owner, allow_none=True)
        return [[] if g is None else list(g) for g in groups]
    return [list(metrics) for _ in names]


def _metric(identifier: Any) -> Any:
    """A metric object from ``compile``'s identifier; a plain function ``fn(y_true, y_pred)`` becomes a
    :class:`~dnnbind.metrics.MeanMetricWrapper` named after it (Keras 3's ``compile_utils.get_metric``)."""
    if callable(identifier) and not isinstance(identifier, (type, metrics_module.Metric)):
        return metrics_module.MeanMetricWrapper(identifier, name=getattr(identifier, "__name__", None))
    return metrics_module.compile_metric(identifier)  # "accuracy": picked from the shapes, as Keras's compile


def _serialize_losses(loss: Any, resolved: list, names: list[str]) -> Any:
    ser = [None if entry is None or isinstance(entry, NoLoss) else losses_module.serialize(entry)
           for entry in resolved]
    if len(names) == 1:
        return ser[0]
    if isinstance(loss, dict):
        return dict(zip(names, ser))
    return ser


def _serialize_metrics(metrics: Any, spec: list[list], objects: list[list], names: list[str]) -> Any:
    def one(identifier: Any, obj: Any) -> Any:
        return identifier if isinstance(identifier, str) else metrics_module.serialize(obj)

    if len(names) == 1:
        return [one(i, o) for i, o in zip(spec[0], objects[0])]
    return {n: [one(i, o) for i, o in zip(s, objs)] for n, s, objs in zip(names, spec, objects)}


def resolve(optimizer: Any, loss: Any, metrics: Any, loss_weights: Any, names: list[str],
            owner: str, weighted_metrics: Any = None) -> CompileArguments:
    """Every argument of ``compile`` resolved for a model with outputs ``names`` (see
    ``Trainer.compile``); raises before anything is set on the model.

    ``weighted_metrics`` (as ``metrics``) are metric objects marked ``_weighted`` (the steps give them the
    batch's sample weights), after the plain ones in each output's list; one whose name a plain metric
    already has is renamed ``weighted_<name>``, as Keras 3."""
    multi = len(names) > 1
    loss_list = [None] * len(names) if loss is None else per_output(loss, names, "loss", owner, allow_none=True)
    no_loss = all(entry is None for entry in loss_list)
    weights = [1.0] * len(names) if loss_weights is None else per_output(loss_weights, names, "loss_weights",
                                                                         owner, allow_none=True)
    weights = [1.0 if w is None else float(_validate.number(w, "loss_weights", owner, low=0.0)) for w in weights]
    spec = metric_spec(metrics, names, owner)
    if weighted_metrics is not None and not isinstance(weighted_metrics, (list, tuple, dict)):
        raise TypeError(f"{owner}: Expected `weighted_metrics` argument to be a list, tuple, or dict. Received "
                        f"instead: weighted_metrics={weighted_metrics!r} of type {type(weighted_metrics)}")
    weighted_spec = metric_spec(weighted_metrics, names, owner) if weighted_metrics else [[] for _ in names]
    optimizer = optimizers_module.get(optimizer)
    resolved = [NoLoss() if no_loss else None if entry is None else losses_module.get(entry)
                for entry in loss_list]
    output_metrics = [[_metric(m) for m in group] for group in spec]
    plain_counts = [len(group) for group in output_metrics]
    for group, wgroup in zip(output_metrics, weighted_spec):
        taken = {m.name for m in group}
        for identifier in wgroup:
            m = _metric(identifier)
            if any(m is other for other in group):  # the same object in both lists: a second one for the weights
                m = (metrics_module.MeanMetricWrapper(m._fn, name=m.name, **m._fn_kwargs)
                     if type(m) is metrics_module.MeanMetricWrapper else metrics_module.get(metrics_module.serialize(m)))
            m._weighted = True
            if m.name in taken:
                m.name = f"weighted_{m.name}"
            taken.add(m.name)
            group.append(m)
    if multi:
        # one object per output: a metric instance given once is copied for the other outputs
        seen: set = set()
        for i, group in enumerate(output_metrics):
            for j, m in enumerate(group):
                if id(m) in seen:
                    group[j] = m = (metrics_module.MeanMetricWrapper(m._fn, name=m.name, **m._fn_kwargs)
                                    if type(m) is metrics_module.MeanMetricWrapper
                                    else metrics_module.get(metrics_module.serialize(m)))
                seen.add(id(m))
                m.name = f"{names[i]}_{m.name}"
    flat_metrics = [m for group in output_metrics for m in group]
    metric_names = [m.name for m in flat_metrics]
    if len(set(metric_names)) != len(metric_names):
        raise ValueError(f"{owner}: metric names must be unique, got {metric_names}")
    config = {
        "optimizer": optimizers_module.serialize(optimizer),
        "loss": _serialize_losses(loss, resolved, names),
        "metrics": _serialize_metrics(metrics, spec, [g[:n] for g, n in zip(output_metrics, plain_counts)], names),
        "weighted_metrics": None if not weighted_metrics else _serialize_metrics(
            weighted_metrics, weighted_spec, [g[n:] for g, n in zip(output_metrics, plain_counts)], names),
        "loss_weights": loss_weights if loss_weights is None or isinstance(loss_weights, (dict, list))
        else float(loss_weights),
    }
    shown = resolved[0] if not multi else (dict(zip(names, resolved)) if isinstance(loss, dict) else list(resolved))
    return CompileArguments(optimizer, resolved, weights, shown, output_metrics, flat_metrics, config)


def compile_arguments(config: dict) -> dict:
    """``compile``'s keyword arguments from :meth:`Trainer.get_compile_config`'s dict (a saved model's
    settings): the optimizer, loss(es) and metrics deserialised."""
    loss = config.get("loss")
    # a dict with "class_name" is one serialised loss; any other dict is keyed by output name
    keyed = isinstance(loss, dict) and "class_name" not in loss
    loss = ({k: None if v is None else losses_module.get(v) for k, v in loss.items()} if keyed
            else [None if v is None else losses_module.get(v) for v in loss] if isinstance(loss, list)
            else losses_module.get(loss))
    def read_metrics(metrics: Any, weighted: bool) -> Any:
        metrics = ({k: [metrics_module.compile_metric(m) for m in v] for k, v in metrics.items()}
                   if isinstance(metrics, dict) else [metrics_module.compile_metric(m) for m in metrics])
        for key, group in (metrics.items() if isinstance(metrics, dict) else [(None, metrics)]):
            for m in group:
                if key is not None and m.name.startswith(f"{key}_"):  # saved names carry the output prefix
                    m.name = m.name[len(key) + 1:]
                if weighted and m.name.startswith("weighted_"):  # and the weighted_ compile gave them
                    m.name = m.name[len("weighted_"):]
        return metrics

    metrics = read_metrics(config.get("metrics") or [], False)
    weighted = config.get("weighted_metrics")
    return {"optimizer": optimizers_module.get(config["optimizer"]), "loss": loss, "metrics": metrics,
            "loss_weights": config.get("loss_weights"),
            "weighted_metrics": None if not weighted else read_metrics(weighted, True)}
