"""The training loop shared by every model kind: compile / fit / evaluate / predict and the steps.

Training runs the layers' forward and backward by hand (no autograd): the model's forward (a layer
chain for ``Sequential``, the recorded tape for functional and subclassed models), the losses return
their gradients, the model's backward, then one fused optimizer update. A final softmax with a
``from_logits=False`` cross-entropy is fused into ``kernels.softmax_cross_entropy`` on the logits (the
softmax's backward is never run) wherever the model can skip it (:meth:`_fusable_outputs`).

No step waits for the host: loss and metrics accumulate in device scalars that are read when the
progress bar draws and at the end of an epoch. CUDA graphs (``compile(jit_compile="auto")``, the
default): on CUDA each step kind and batch shape runs eagerly once, is captured the second time and
replayed from then on (see :mod:`dnnbind._step_graphs`).

What the trainer needs from a model (``dnnbind.models.Model`` provides it):

* ``name``, ``device``, ``built``, ``_flat_layers()`` (the layers holding weights, model order);
* ``_input_names()``, ``output_names``, ``_expected_input_shapes()`` (sample shapes or None),
  ``_output_shapes()``, ``_build_for(shapes)``, ``_require_layers(what)``, ``_input_hint()``;
* ``_run_forward(xs, training, logits) -> outputs`` and ``_run_backward(douts, on_grads=None)``
  (lists, model order; ``logits[i]``: output ``i`` skips its final softmax; ``on_grads(layer)``,
  when given, is called once a layer's weight gradients are final, for the distributed gradient
  all-reduce to overlap backward), ``_fusable_outputs()``.

Inside a step, inputs and targets are *packed*: one array for a one-input (one-output) model, a
tuple otherwise (that is what the step-graph cache keys and buffers). A weighted batch appends one
float32 sample-weight array per output with a loss to the targets (:meth:`Trainer._step_targets`).
"""

from __future__ import annotations

import math
import operator
import sys
import warnings
from typing import Any, Sequence

import numpy as np

import inspect

from .. import _validate, backend, kernels, ops
from .. import callbacks as callbacks_module
from .. import distribution as distribution_module
from .. import losses as losses_module
from .. import metrics as metrics_module
from .. import optimizers as optimizers_module
from .._step_graphs import StepGraphs
from ..backend import Device
from ..errors import DnnbindError
from ..autodiff import GradientTape
from ..autodiff import engine as autodiff_engine
from ..autodiff.tensor import Tensor
from ..layers.base import applied_twice, cast_generation, losses_added, release_pending_state
from ..ops import _core as ops_core
from ..mixed_precision import global_policy
from ..kernels._dispatch import FLOAT_DTYPES
from ..utils import draw_seed
from .data_adapters import (ArrayDataAdapter, EpochIterator, GeneratorDataAdapter, PyDatasetAdapter,
                            class_weight_to_sample_weights, data_kind, flatten_structure, unpack_x_y_sample_weight)

__all__ = ["Trainer", "LossScale"]

_F32 = np.dtype(np.float32)
_F64 = np.dtype(np.float64)


def _is_tty(stream) -> bool:
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty and isatty())
    except ValueError:  # closed stream
        return False


def _resolve_verbose(verbose: Any, owner: str, stream=None) -> int:
    if isinstance(verbose, str) and verbose == "auto":
        return 1 if _is_tty(stream if stream is not None else sys.stdout) else 2
    if isinstance(verbose, (bool, np.bool_)):
        return int(verbose)
    return int(_validate.one_of(verbose, "verbose", owner, ("auto", 0, 1, 2)))


def _check_jit_compile(value: Any, what: str) -> Any:
    if isinstance(value, str) and value == "auto":
        return "auto"
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    raise ValueError(f"{what}: jit_compile must be 'auto', True or False, got {value!r}")


def _pack(arrays: "list | None") -> Any:
    if arrays is None:
        return None
    return arrays[0] if len(arrays) == 1 else tuple(arrays)


def _unpack(packed: Any) -> "list | None":
    if packed is None:
        return None
    return list(packed) if isinstance(packed, tuple) else [packed]


_KIND_WORDS = {"generator": "a generator or iterator", "py_dataset": "a PyDataset"}


def _is_weight_vector(value: Any) -> bool:
    """A plain list/tuple of numbers (one weight per sample), not one entry per output."""
    return isinstance(value, (list, tuple)) and bool(value) and all(
        isinstance(v, (int, float, np.number)) and not isinstance(v, bool) for v in value)


def _refuse_both_weights(class_weight: Any, sample_weight: Any, owner: str) -> None:
    if class_weight is not None and sample_weight is not None:
        raise ValueError(f"{owner}: class_weight and sample_weight cannot both be given (as Keras); multiply the "
                         "class weights into sample_weight")


class _NoLoss:
    """An output's "loss" when ``compile`` got none (a custom ``train_step`` computes its own): its targets
    still travel to the step, as given (floats in float32)."""

    name = "no_loss"
    fuses_softmax = False

    def prepare_labels(self, y: np.ndarray, output_shape: Any, owner: str = "") -> np.ndarray:
        arr = np.asarray(y)
        return np.ascontiguousarray(arr, dtype=np.float32) if arr.dtype.kind == "f" else np.ascontiguousarray(arr)


def _as_float(value: Any) -> float:
    """A log value (a tensor, a raw 0-d array, a number) as a Python float (a host read)."""
    if isinstance(value, Tensor):
        value = value.data
    if backend.is_device_array(value):
        value = backend.to_numpy(value)
    return float(np.asarray(value).reshape(-1)[0]) if np.size(value) else 0.0


def _batch_of(x: Any) -> int:
    first = x[0] if isinstance(x, (list, tuple)) else (next(iter(x.values())) if isinstance(x, dict) else x)
    return int(first.shape[0]) if hasattr(first, "shape") and len(first.shape) else 1


def _capturing() -> bool:
    from ..cuda import current_stream  # deferred: only reached with device arrays (cuda.bindings loaded)

    return current_stream().is_capturing()


def _to_f32(out: Any) -> Any:
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


def _per_output(value: Any, names: list[str], what: str, owner: str, allow_none: bool) -> list:
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


class Trainer:
    """compile / fit / evaluate / predict / ``*_on_batch`` and the steps (a mixin of ``Model``)."""

    def _init_trainer(self) -> None:
        self.optimizer = None
        self.loss = None
        self.compiled = False
        self.stop_training = False
        self.history = None
        self._metrics: list = []
        self._output_metrics: list[list] = []
        self._losses: list = []
        self._loss_weights: list[float] = []
        self._output_loss_trackers: list = []
        self._compile_config: dict | None = None
        self._compile_args: dict | None = None
        self._loss_scale: LossScale | None = None
        self._jit_compile: Any = "auto"
        self.run_eagerly = False
        self._step_graphs = StepGraphs()
        self._replica = None  # dnnbind.distribution's hook while a distribution is set

    @property
    def _owner(self) -> str:
        return f"{type(self).__name__} '{self.name}'"

    def _guess_input_structure(self, x: Any) -> None:
        """Hook: a model that learns its number of inputs from the data (subclassed) looks at ``x``."""

    def _guess_output_structure(self, loss: Any) -> None:
        """Hook: a model that learns its number of outputs late (subclassed) looks at ``compile``'s loss."""

    def _discard_forward(self) -> None:
        """Drop what a training forward kept for a backward that will not run."""
        release_pending_state()

    # ----- compile ----------------------------------------------------------------------------
    def compile(self, optimizer: Any = "rmsprop", loss: Any = None, metrics: Any = None,
                loss_weights: Any = None, weighted_metrics: Any = None, run_eagerly: bool = False,
                steps_per_execution: int = 1, jit_compile: Any = "auto", auto_scale_loss: bool = True) -> None:
        """Choose the optimizer, the loss(es) and the metrics (names or objects).

        Several outputs (Keras): ``loss`` is one loss for every output, a list (one per output) or a
        dict keyed by output name (None: that output has no loss); ``loss_weights`` likewise (floats,
        default 1); the total loss is the weighted sum. ``metrics`` is a list applied to every output,
        a list of lists (one per output) or a dict by output name; their logs are named
        ``<output>_<metric>``, and each output's loss ``<output>_loss``.

        ``jit_compile`` (Keras's argument): on CUDA, ``"auto"`` (default) or ``True`` run the train,
        test and predict steps as CUDA graphs (the first step of each batch shape runs eagerly, the
        second is captured, later ones replay it); ``False`` runs every step eagerly. On the NumPy
        backend steps always run eagerly (``True`` warns). ``run_eagerly=True`` also means eager.
        ``steps_per_execution`` is accepted and has no effect: a replayed CUDA graph already costs
        one launch per step.

        All or nothing: every argument is resolved first, and a failure (an unknown metric after a
        good optimizer...) leaves the model as it was, compiled or not.
        """
        owner = f"{self._owner}: compile"
        jit_compile = _check_jit_compile(jit_compile, "compile")
        run_eagerly = _validate.boolean(run_eagerly, "run_eagerly", owner)
        _validate.positive_int(steps_per_execution, "steps_per_execution", owner)
        auto_scale_loss = _validate.boolean(auto_scale_loss, "auto_scale_loss", owner)
        if weighted_metrics is not None:
            raise NotImplementedError("compile: weighted_metrics is not supported")
        self._guess_output_structure(loss)
        names = list(self.output_names)
        multi = len(names) > 1
        loss_list = [None] * len(names) if loss is None else _per_output(loss, names, "loss", owner, allow_none=True)
        no_loss = all(entry is None for entry in loss_list)
        weights = [1.0] * len(names) if loss_weights is None else _per_output(loss_weights, names, "loss_weights",
                                                                             owner, allow_none=True)
        weights = [1.0 if w is None else float(_validate.number(w, "loss_weights", owner, low=0.0)) for w in weights]
        metric_spec = self._metric_spec(metrics, names, owner)
        optimizer = optimizers_module.get(optimizer)
        resolved = [_NoLoss() if no_loss else None if entry is None else losses_module.get(entry)
                    for entry in loss_list]
        output_metrics = [[metrics_module.get(m) for m in spec] for spec in metric_spec]
        if multi:
            # one object per output: a metric instance given once is copied for the other outputs
            seen: set = set()
            for i, group in enumerate(output_metrics):
                for j, m in enumerate(group):
                    if id(m) in seen:
                        group[j] = m = metrics_module.get(metrics_module.serialize(m))
                    seen.add(id(m))
                    m.name = f"{names[i]}_{m.name}"
        flat_metrics = [m for group in output_metrics for m in group]
        metric_names = [m.name for m in flat_metrics]
        if len(set(metric_names)) != len(metric_names):
            raise ValueError(f"{owner}: metric names must be unique, got {metric_names}")
        compile_config = {
            "optimizer": optimizers_module.serialize(optimizer),
            "loss": self._serialize_structure(loss, resolved, names),
            "metrics": self._serialize_metrics(metrics, metric_spec, output_metrics, names),
            "loss_weights": loss_weights if loss_weights is None or isinstance(loss_weights, (dict, list))
            else float(loss_weights),
        }
        policy = global_policy()
        loss_scale = LossScale(self.device) if (auto_scale_loss and policy.needs_loss_scaling
                                                and self.device.is_cuda) else None
        if run_eagerly and jit_compile is True:
            warnings.warn(f"{self._owner}: run_eagerly=True and jit_compile=True cannot both hold; "
                          "disabling jit_compile (as Keras does)", UserWarning, stacklevel=2)
            jit_compile = False
        # everything resolved: from here on nothing raises
        self._drop_graphs()  # new optimizer, loss, metrics and loss scale: every graph is stale
        self.optimizer = optimizer
        self._losses, self._loss_weights = resolved, weights
        self.loss = resolved[0] if not multi else (
            dict(zip(names, resolved)) if isinstance(loss, dict) else list(resolved))
        self._output_metrics, self._metrics = output_metrics, flat_metrics
        self._loss_tracker = metrics_module.Mean(name="loss")
        self._output_loss_trackers = ([metrics_module.Mean(name=f"{n}_loss") if entry is not None else None
                                       for n, entry in zip(names, resolved)] if multi else [])
        self._loss_scale = loss_scale
        self._compile_config = compile_config
        self.run_eagerly = run_eagerly
        self._jit_compile = jit_compile
        self._step_graphs._warned.clear()
        if jit_compile is True and not self.device.is_cuda:
            self._warn_no_graphs()
        self.compiled = True

    @staticmethod
    def _metric_spec(metrics: Any, names: list[str], owner: str) -> list[list]:
        """One list of metric identifiers per output."""
        if metrics is None:
            return [[] for _ in names]
        if isinstance(metrics, (str, metrics_module.Metric)):
            metrics = [metrics]
        if isinstance(metrics, dict):
            groups = _per_output(metrics, names, "metrics", owner, allow_none=True)
            return [[] if g is None else (list(g) if isinstance(g, (list, tuple)) else [g]) for g in groups]
        if not isinstance(metrics, (list, tuple)):
            raise _validate.ArgumentTypeError(f"{owner}: metrics must be a list of metric names or Metric "
                                              f"instances, got {type(metrics).__name__}")
        if len(names) > 1 and metrics and all(isinstance(g, (list, tuple)) or g is None for g in metrics):
            groups = _per_output(list(metrics), names, "metrics", owner, allow_none=True)
            return [[] if g is None else list(g) for g in groups]
        return [list(metrics) for _ in names]

    @staticmethod
    def _serialize_structure(loss: Any, resolved: list, names: list[str]) -> Any:
        ser = [None if entry is None or isinstance(entry, _NoLoss) else losses_module.serialize(entry)
               for entry in resolved]
        if len(names) == 1:
            return ser[0]
        if isinstance(loss, dict):
            return dict(zip(names, ser))
        return ser

    @staticmethod
    def _serialize_metrics(metrics: Any, spec: list[list], objects: list[list], names: list[str]) -> Any:
        def one(identifier: Any, obj: Any) -> Any:
            return identifier if isinstance(identifier, str) else metrics_module.serialize(obj)

        if len(names) == 1:
            return [one(i, o) for i, o in zip(spec[0], objects[0])]
        return {n: [one(i, o) for i, o in zip(s, objs)] for n, s, objs in zip(names, spec, objects)}

    def get_compile_config(self) -> "dict | None":
        """The compile arguments as JSON-able values (Keras 3), or None when not compiled."""
        return self._compile_config if self.compiled else None

    def compile_from_config(self, config: dict) -> None:
        """``compile`` from :meth:`get_compile_config`'s dict (a saved model's settings)."""
        if not isinstance(config, dict):
            raise TypeError(f"{self._owner}: compile_from_config needs a dict, got {type(config).__name__}")
        loss = config.get("loss")
        # a dict with "class_name" is one serialised loss; any other dict is keyed by output name
        per_output = isinstance(loss, dict) and "class_name" not in loss
        loss = ({k: None if v is None else losses_module.get(v) for k, v in loss.items()} if per_output
                else [None if v is None else losses_module.get(v) for v in loss] if isinstance(loss, list)
                else losses_module.get(loss))
        metrics = config.get("metrics") or []
        metrics = ({k: [metrics_module.get(m) for m in v] for k, v in metrics.items()} if isinstance(metrics, dict)
                   else [metrics_module.get(m) for m in metrics])
        if isinstance(metrics, dict):
            # saved names carry the output prefix; compile adds it again
            for key, group in metrics.items():
                for m in group:
                    if m.name.startswith(f"{key}_"):
                        m.name = m.name[len(key) + 1:]
        self.compile(optimizer=optimizers_module.get(config["optimizer"]), loss=loss, metrics=metrics,
                     loss_weights=config.get("loss_weights"))

    # ----- CUDA graphs ------------------------------------------------------------------------
    def _warn_no_graphs(self) -> None:
        warnings.warn(f"{self._owner}: jit_compile=True has no effect on {self.device} (CUDA graphs "
                      "need the CUDA backend); steps run eagerly", UserWarning, stacklevel=3)

    @property
    def jit_compile(self) -> Any:
        """``"auto"``, ``True`` or ``False`` (see :meth:`compile`); setting it drops captured graphs."""
        return self._jit_compile

    @jit_compile.setter
    def jit_compile(self, value: Any) -> None:
        value = _check_jit_compile(value, "jit_compile")
        self._drop_graphs()
        self._jit_compile = value
        if value is True and not self.device.is_cuda:
            self._warn_no_graphs()

    def _graphs_enabled(self) -> bool:
        """Whether steps may run as CUDA graphs now (compiled, jit on, not run_eagerly, on CUDA)."""
        return (self._jit_compile is not False and not self.run_eagerly and self.compiled
                and self._step_graphs.backend.available(self.device))

    def _drop_graphs(self) -> None:
        """Forget every captured step (after the work using them finished)."""
        graphs = self.__dict__.get("_step_graphs")
        if graphs is not None:
            graphs.clear()

    def _graph_signature(self) -> tuple:
        """Everything whose change makes captured graphs stale (read before every graph step, so it is
        kept to identities and flags): trainable flags and dtype policies, the weight arrays, the
        optimizer and its state version (bumped whenever its slots are reallocated), the loss scale."""
        opt = self.optimizer
        layers = self._flat_layers()
        # the replica: a train step captured with (or without) its gradient all-reduces
        return (self.trainable, id(opt), getattr(opt, "_state_version", 0), id(self._loss_scale),
                id(self.__dict__.get("_replica")),
                tuple([(layer.trainable, layer.dtype_policy.name) for layer in layers]),
                tuple([id(w.value) for layer in layers for w in layer._weights]))

    def _host_counters(self) -> list[tuple[Any, str]]:
        """``(object, attribute)`` of the host-side numbers a step advances in Python: each metric's
        sample count and the optimizer's update count (a graph replay advances them by hand)."""
        pairs = []
        seen: set = set()
        for m in list(self._all_metrics()) + list(self.metrics):
            if id(m) in seen:
                continue
            seen.add(id(m))
            pairs.append((m, "_host_count"))
            impl = getattr(m, "_impl", None)  # Accuracy counts in the concrete metric it resolved to
            if impl is not None:
                pairs.append((impl, "_host_count"))
        if self.optimizer is not None:
            # the update count's host estimate (``iterations`` itself may read the device)
            pairs += [(self.optimizer, "_iterations"), (self.optimizer, "_unconfirmed")]
        return pairs

    def _graph_refs(self) -> list:
        """The persistent objects a captured step addresses, kept alive as long as its graph."""
        refs: list = [self.optimizer, self._loss_scale, *self._all_metrics()]
        for layer in self._flat_layers():
            refs.append(layer)
            refs.extend(w.value for w in layer._weights)
            refs.extend(vars(layer).values())  # dropout states, BatchNorm constants...
        opt = self.optimizer
        if opt is not None:
            refs.extend([opt._lr_array, opt._step_array])
            refs.extend(a for slots in opt._slots for a in slots.values())
        for m in self._all_metrics():
            refs.append(m._total)
            impl = getattr(m, "_impl", None)
            if impl is not None:
                refs.append(impl._total)
        if self._loss_scale is not None:
            refs.extend(vars(self._loss_scale).values())
        return refs

    def _before_launch(self, kind: str, stream: Any) -> None:
        """Host-to-device work a graph step needs first (not capturable): the learning rate, if it changed."""
        if kind == "train" and self.optimizer is not None and self.optimizer.built:
            self.optimizer._sync_lr(stream)
        by_kind = self.__dict__.get("_custom_logs_by_kind")
        if by_kind and kind in by_kind:
            # a replay runs no Python: the logs it writes are in the buffers its capture kept
            self.__dict__["_custom_logs"] = by_kind[kind]

    def _eager_step(self, kind: str, x: Any, y: Any) -> Any:
        if kind == "train":
            self._train_step(x, y)
            return None
        if kind == "test":
            self._test_step(x, y)
            return None
        return self._predict_step(x)

    def _step(self, kind: str, x: Any, y: Any = None, graph: bool = True) -> Any:
        """One ``kind`` step on packed ``x``/``y``: through the graph cache when graphs are on (and
        ``graph``), else eagerly."""
        if graph and self._graphs_enabled():
            return self._step_graphs.run(self, kind, x, y)
        return self._eager_step(kind, x, y)

    def _static_inputs(self, kind: str):
        """For the data adapter: ``(n, xs_dev, ys_dev) -> (static_xs, static_ys) | None`` (lists)."""
        graphs = self._step_graphs

        def spec(arrays: "list | None", n: int):
            if arrays is None:
                return None, None
            shapes = [(n, *a.shape[1:]) for a in arrays]
            dtypes = [a.dtype for a in arrays]
            return (shapes[0], dtypes[0]) if len(arrays) == 1 else (tuple(shapes), tuple(dtypes))

        def into(n: int, xs_dev: list, ys_dev: "list | None"):
            xs, xd = spec(xs_dev, n)
            ys, yd = spec(ys_dev, n)
            got = graphs.static_inputs(self, kind, xs, xd, ys, yd)
            return None if got is None else (_unpack(got[0]), _unpack(got[1]))

        return into if self._graphs_enabled() else None

    # ----- data parallelism (dnnbind.distribution) --------------------------------------------
    def _replica_for(self, owner: str) -> Any:
        """The set distribution's hook (checked against this model: the NumPy backend refuses it), or None."""
        dist = distribution_module.distribution()
        if dist is None:
            return None
        replica = dist.replica()
        replica.check_model(self, owner)
        return replica

    def _join_replicas(self, replica: Any, always: bool) -> None:
        """Train under ``replica`` from now on; rank 0's weights and optimizer state go to every rank
        (``always``, or when the distribution changed) once the model is built."""
        changed = self.__dict__.get("_replica") is not replica
        if changed:  # (an attribute set on a Model goes through its tracking __setattr__: every step)
            self._replica = replica
        if replica is not None and (always or changed) and self.built:
            replica.broadcast_state(self)

    def _distributed_args(self, replica: Any, kinds: list, batch_size: int, owner: str) -> int:
        """Refuse what cannot be sharded; the batch each replica reads for the global ``batch_size``."""
        for kind in kinds:
            replica.check_generator(kind, owner)
        return replica.per_replica_batch(batch_size, owner)

    # ----- metrics ----------------------------------------------------------------------------
    @property
    def metrics_names(self) -> list[str]:
        return [m.name for m in self._all_metrics()]

    def _all_metrics(self) -> list:
        tracker = self.__dict__.get("_loss_tracker")
        head = [tracker] if tracker is not None else []
        return head + [t for t in self._output_loss_trackers if t is not None] + list(self._metrics)

    def reset_metrics(self) -> None:
        """Reset every metric (``self.metrics``: a subclass that overrides the property resets its own)."""
        seen: set = set()
        for m in list(self._all_metrics()) + list(self.metrics):
            if id(m) not in seen:
                seen.add(id(m))
                m.reset_state()
        self.__dict__["_custom_logs"] = None

    def _log_sources(self) -> dict:
        """Name -> a zero-argument function giving the value (read from the device only when called): the
        dict a user's ``train_step``/``test_step`` returned, else every metric's result."""
        custom = self.__dict__.get("_custom_logs")
        if custom is not None:
            return {k: (lambda v=v: _as_float(v)) for k, v in custom.items()}
        return {m.name: (lambda m=m: _as_float(m.result())) for m in self._all_metrics()}

    def _logs(self, prefix: str = "") -> dict[str, float]:
        return {prefix + k: fn() for k, fn in self._log_sources().items()}

    def _lazy_logs(self) -> callbacks_module.LazyLogs:
        return callbacks_module.LazyLogs(self._log_sources())

    def _require_compiled(self, what: str) -> None:
        if not self.compiled:
            raise DnnbindError(f"{self._owner}: you must call compile(optimizer, loss, metrics) before {what}()")

    # ----- data checks ------------------------------------------------------------------------
    def _check_x(self, x: Any, what: str, *, finite: bool = True, allow_empty: bool = False) -> list[np.ndarray]:
        """``x`` as float32 host arrays of the model's input shapes, one per input (building the model
        from them if needed). ``finite``: refuse NaN/inf (training and evaluation; predict accepts
        them, as Keras); ``allow_empty``: accept zero samples (predict returns an empty result)."""
        if not self._call_optional():
            self._require_layers(what)
        owner = self._owner
        if backend.is_device_array(x):
            raise TypeError(f"{owner}: {what} takes NumPy arrays; got a DeviceArray "
                            "(use predict_on_batch/train_on_batch for device data)")
        self._guess_input_structure(x)
        items = flatten_structure(x, self._input_names(), f"{owner}: {what}", "x")
        arrays = []
        for item in items:
            if backend.is_device_array(item):
                raise TypeError(f"{owner}: {what} takes NumPy arrays; got a DeviceArray "
                                "(use predict_on_batch/train_on_batch for device data)")
            arr = np.asarray(item)
            if arr.dtype.kind not in "fiub":
                raise TypeError(f"{owner}: {what} expects numeric input data (floats or ints), got dtype {arr.dtype}")
            if arr.ndim < 1:
                raise ValueError(f"{owner}: {what} expects a batch of samples, got a scalar")
            if arr.dtype != _F32:
                arr = arr.astype(_F32)  # ints/bools/float64 are cast to float32, as Keras does
            arrays.append(arr)
        counts = {len(a) for a in arrays}
        if len(counts) > 1:
            raise ValueError(f"{owner}: {what} got inputs with different numbers of samples "
                             f"{[len(a) for a in arrays]}; every input needs one row per sample")
        if len(arrays[0]) == 0 and not allow_empty:
            raise ValueError(f"{owner}: {what} got no samples (x has shape {tuple(arrays[0].shape)})")
        samples = [tuple(a.shape[1:]) for a in arrays]
        expected = self._expected_input_shapes()
        if expected is not None and samples != [tuple(e) for e in expected]:
            if len(arrays) == 1:
                raise ValueError(f"{owner}{self._input_hint()}: {what} expects input of shape (batch, "
                                 f"{', '.join(map(str, expected[0]))}), got {tuple(arrays[0].shape)}")
            raise ValueError(f"{owner}: {what} expects inputs of shapes {[(None, *e) for e in expected]} "
                             f"({', '.join(self._input_names())}), got {[tuple(a.shape) for a in arrays]}")
        if not self.built and not self._call_optional():
            self._build_for(samples)
        if finite:
            # after the cast: float64 values beyond float32's range have become inf
            harm = "the loss and the weights" if what.startswith(("fit", "train")) else "the loss"
            for name, arr in zip(self._input_names(), arrays):
                _validate.finite_array(arr, "x" if len(arrays) == 1 else f"x['{name}']", f"{owner}: {what}",
                                       hint=f"they would make {harm} NaN; clean or impute the data first "
                                            "(predict accepts them)")
        return arrays

    def _check_y(self, y: Any, n: int, what: str) -> list[np.ndarray]:
        """Targets of the outputs that have a loss, in the losses' label forms (one per output)."""
        items = flatten_structure(y, list(self.output_names), f"{self._owner}: {what}", "y")
        return [None if loss is None else self._check_y_one(i, item, n, what)
                for i, (item, loss) in enumerate(zip(items, self._losses))]

    def _targets_optional(self) -> bool:
        """Whether a step can do without targets: a custom ``train_step``/``test_step``, or no compiled loss
        (the loss comes from ``add_loss``)."""
        return (type(self).train_step is not Trainer.train_step or type(self).test_step is not Trainer.test_step
                or all(isinstance(loss, _NoLoss) for loss in self._losses))

    def _call_optional(self) -> bool:
        """A model with a custom ``train_step`` may have no ``call`` (keras.io's GANs): nothing to build."""
        return type(self).train_step is not Trainer.train_step and getattr(type(self), "call", None) is \
            getattr(self._model_base(), "call", None)

    def _model_base(self) -> type:
        for cls in type(self).__mro__:
            if cls.__name__ == "Model" and cls.__module__.startswith("dnnbind."):
                return cls
        return type(self)

    def _check_xy(self, x: Any, y: Any, what: str) -> tuple[list, "list | None"]:
        """``(xs, ys)`` checked for training or evaluation: finite, same length, labels in the losses' forms."""
        if y is None:
            if self._targets_optional():
                return self._check_x(x, what), None
            raise ValueError(f"{self._owner}: {what} needs targets y")
        xs = self._check_x(x, what)
        return xs, self._check_y(y, len(xs[0]), what)

    # ----- the steps --------------------------------------------------------------------------
    def _fused_outputs(self) -> list[bool]:
        """Per output: the final softmax is skipped and fused into a cross-entropy on the logits."""
        fusable = self._fusable_outputs()
        return [bool(f and loss is not None and loss.fuses_softmax and not getattr(loss, "from_logits", False))
                for f, loss in zip(fusable, self._losses)]

    def _fused(self) -> bool:
        """Whether any output's softmax is fused into its cross-entropy."""
        return any(self._fused_outputs())

    def _loss_and_metrics(self, xs: list, ys: list, training: bool) -> "Tensor | None":
        """Forward, losses (accumulated in the trackers), metrics (accumulated); returns the total loss as
        a tensor (recorded on the active tape when training).

        ``ys``: the targets of the outputs with a loss, then, for a weighted batch, one ``(N,)``
        float32 sample-weight array per such output (:meth:`_step_targets`). The loss tracker is
        weighted by the batch size (Keras 3); metrics are not weighted."""
        fused = self._fused_outputs()
        outs = self._run_forward(xs, training=training, logits=fused)
        n = int(xs[0].shape[0])
        total = None
        ys = list(ys or ())  # fit(x) without targets: a model whose loss comes from add_loss only
        n_targets = sum(loss is not None for loss in self._losses)
        targets = iter(ys[:n_targets])
        weights = iter(ys[n_targets:]) if len(ys) > n_targets else None
        multi = len(outs) > 1
        for i, (out, loss) in enumerate(zip(outs, self._losses)):
            if loss is None:
                continue
            y = next(targets, None)
            sw = None if weights is None else next(weights)
            if isinstance(loss, _NoLoss):
                continue
            out32 = out if out.dtype == _F32 or out.dtype == _F64 else ops.cast(out, _F32)
            value = loss._fused(y, out32, sw, logits=fused[i])
            if value is None:
                value = loss(y, out32, sample_weight=sw)
            if multi:
                self._output_loss_trackers[i].update_state(value.data, n)
            weight = self._loss_weights[i]
            weighted = value if weight == 1.0 else ops.multiply(value, weight)
            total = weighted if total is None else ops.add(total, weighted)
            for m in self._output_metrics[i]:
                self._update_metric(m, y, out32)
        extra = self.losses if self._may_have_losses() else ()
        if extra:
            more = extra[0] if len(extra) == 1 else ops.sum(ops.stack([ops.cast(e, _F32) for e in extra]))
            total = more if total is None else ops.add(total, ops.cast(more, total.dtype))
        if total is None:
            raise ValueError(f"{self._owner}: no loss to compute. Provide a `loss` argument in `compile()`.")
        self._loss_tracker.update_state(total.data if total.dtype == _F32 else kernels.cast(total.data, _F32), n)
        return total

    def _may_have_losses(self) -> bool:
        """Whether :attr:`losses` may give anything this step: weight or activity regularizers anywhere, or a
        layer or model with a ``call`` of its own (it may ``add_loss``). Kept while the structure stays."""
        memo = getattr(self, "_memo", None)
        if memo is None:
            return True
        sources = memo("loss_sources", lambda: [layer for layer in [self, *self._flat_layers()]
                                                if not layer._is_legacy() or layer.activity_regularizer is not None
                                                or any(w.regularizer is not None for w in layer._weights)])
        return bool(sources) and self._has_losses()

    @staticmethod
    def _update_metric(m: Any, y: Any, out: Tensor) -> None:
        """dnnbind's own metrics accumulate raw arrays with kernels; a user's metric gets tensors."""
        if type(m).update_state.__module__ == metrics_module.__name__:
            m.update_state(y, out.data)
        else:
            m.update_state(y if not isinstance(y, np.ndarray) and not backend.is_device_array(y)
                           else Tensor(y), out)

    def _trainable_slots(self) -> list:
        """``(layer, weight)`` of every trainable weight, in parameter (model) order (kept while the model's
        structure stays the same)."""
        memo = getattr(self, "_memo", None)
        if memo is not None:
            return list(memo("slots", self._make_trainable_slots))
        return self._make_trainable_slots()

    def _make_trainable_slots(self) -> list:
        if not self.trainable:
            return []
        owners = {}
        for layer in self._flat_layers():
            for w in layer._weights + layer._tracked_variables():
                owners.setdefault(id(w), layer)
        return [(owners.get(id(w), self), w) for w in self.trainable_weights]

    # ----- compute-dtype weight copies (mixed precision) -----------------------------------------
    def _precast_groups(self, layers: list) -> list:
        """``[([(layer, weight)], kernels.elementwise.CastMany)]``: the weights the layers cast to their
        compute dtype (``Layer._cast_weights``), grouped by (source, target) dtype. Kept while the
        layer list, every layer's cast set (``layers.base.cast_generation``), dtype policy and weight
        array stay the same: made once, checked per step by identity."""
        gen = cast_generation()
        kept = self.__dict__.get("_precast_kept")
        policies = [layer.dtype_policy for layer in layers]
        if kept is not None and kept[0] == gen and kept[1] == layers and all(
                map(operator.is_, [w.value for _, w in kept[3]], kept[4])) and all(map(operator.is_, policies, kept[5])):
            return kept[2]
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
        self._precast_kept = (gen, list(layers), out, pairs, [w.value for _, w in pairs], policies)
        return out

    def _precast_weights(self, layers: list) -> list:
        """Every compute-dtype weight copy of this step, made by one multi-tensor cast per dtype pair
        before the forward (instead of one launch per weight inside it); ``Layer._compute_weight``
        returns them. Returns the layers given copies: :meth:`_end_precast` drops them when the step
        ends, so no copy outlives its step (a captured step frees them inside the graph) or reads
        weights the optimizer has since updated."""
        groups = self._precast_groups(layers)
        if not groups:
            return []
        made: dict = {}
        for entries, cast in groups:
            for (layer, w), copy in zip(entries, cast()):
                made.setdefault(id(layer), (layer, {}))[1][w] = copy
        # handed out only once every cast was queued: a failed one leaves no layer holding copies
        for layer, pre in made.values():
            layer._precast = pre
        return [layer for layer, _ in made.values()]

    @staticmethod
    def _end_precast(touched: list) -> None:
        for layer in touched:
            layer._precast = None
            layer._keep_grad_dtype = False

    def _grads_in_compute_dtype(self, replica: Any) -> bool:
        """Whether layers may leave their weight gradients in the compute dtype this step: the
        optimizer's fused update reads them (bitwise as if they had been cast first), nobody else
        does (a distribution all-reduces float32 gradients), and no layer was applied twice (the engine
        sums such a layer's gradients, in the weight's dtype)."""
        opt = self.optimizer
        return replica is None and opt is not None and opt._reads_compute_grads() and not applied_twice()

    def _has_custom_train_step(self) -> bool:
        return type(self).train_step is not Trainer.train_step

    def _train_step(self, x: Any, y: Any) -> None:
        """One training step on packed device/host arrays ``x``, ``y`` (prepared labels). Never waits
        for the host.

        Everything it touches is persistent (weights, optimizer slots, lr/step scalars, metric
        accumulators), so the step can be captured into a CUDA graph and replayed.
        """
        layers = self._flat_layers()
        touched = []
        added = losses_added()
        try:
            touched = self._precast_weights(layers)
            if self._has_custom_train_step():
                self._count_metrics_on_device()
                self._keep_logs(self.train_step(self._step_data(x, y)), "train")
            else:
                self._builtin_train_step(_unpack(x), _unpack(y), touched)
        finally:
            # drop what the forward kept for backwards that did not run, and the add_loss tensors: nothing
            # allocated inside the step outlives it (graph capture)
            release_pending_state()
            if losses_added() != added:
                self._clear_losses()
            self._end_precast(touched)

    def _builtin_train_step(self, xs: list, ys: list, touched: list) -> None:
        replica = self.__dict__.get("_replica")
        reducer = None
        params: list = []
        grads: list = []
        try:
            with GradientTape() as tape:
                total = self._loss_and_metrics(xs, ys, training=True)
            if touched and self._grads_in_compute_dtype(replica):
                for layer in touched:
                    layer._keep_grad_dtype = True
            slots = self._trainable_slots()  # after the forward: a subclassed model may build layers in it
            if not slots:
                return
            variables = [w for _, w in slots]
            # a distribution all-reduces the gradients bucket by bucket while backward runs (each weight is
            # reported as soon as its gradient is final), all before the finiteness check: every rank skips alike
            reducer = None if replica is None else replica.gradient_reducer(slots)
            seed = self._loss_scale.scale if self._loss_scale is not None else None
            seed_t = ops_core.ones_like_seed(total) if seed is None else ops.convert_to_tensor(
                seed if backend.is_device_array(seed) or isinstance(seed, np.ndarray) else np.float32(seed))
            if seed is not None and tuple(seed_t.shape) != tuple(total.shape):
                seed_t = ops.broadcast_to(ops.cast(seed_t, total.dtype), total.shape)
            on_leaf = None if reducer is None else (lambda w, g: reducer.weight_done(w, g.data))
            found = autodiff_engine.gradient([total], [seed_t], variables, tape=tape, on_leaf=on_leaf)
            params = [w.value for w in variables]
            # a weight no loss reaches (an output without a loss) gets a zero gradient
            grads = [kernels.zeros_like(w.value) if g is None else g.data for w, g in zip(variables, found)]
            del found, total, tape
            if reducer is not None:
                reducer.finish(grads)  # the last buckets; the compute stream then waits for all of them
        finally:
            if reducer is not None:
                reducer.close()  # joins the communication stream back on every path (a capture must end joined)
        if not params:
            return
        if self._loss_scale is not None:
            skip, finite = self._loss_scale.check(grads)
            # the update divides by this step's scale, so the scale changes only afterwards
            self.optimizer._apply_raw(params, grads, grad_scale=self._loss_scale.scale, skip=skip)
            self._loss_scale.update(finite)
        else:
            self.optimizer._apply_raw(params, grads)
        self._apply_constraints(variables)

    def _apply_constraints(self, variables: list) -> None:
        for w in variables:
            c = getattr(w, "constraint", None)
            if c is not None:
                w.assign(c(w))

    # ----- the Keras 3 step API (override train_step/test_step/predict_step in a subclass) ----------
    def _step_data(self, x: Any, y: Any) -> Any:
        """What a user's ``train_step``/``test_step`` receives: ``(x, y)`` or ``(x, y, sample_weight)`` as
        tensors (a list for several inputs or outputs), or ``x`` alone without targets."""
        xs = [Tensor(a) for a in _unpack(x)]
        xt = xs[0] if len(xs) == 1 else xs
        if y is None:
            return xt
        ys = [None if a is None else Tensor(a) for a in _unpack(y)]
        n_targets = sum(loss is not None for loss in self._losses) or len(ys)
        targets, weights = ys[:n_targets], ys[n_targets:]
        yt = targets[0] if len(targets) == 1 else targets
        if weights:
            return (xt, yt, weights[0] if len(weights) == 1 else weights)
        return (xt, yt)

    def _count_metrics_on_device(self) -> None:
        """A user's step reads ``m.result()`` inside the step: the metrics keep their sample counts on the
        device too, so a replayed step's result divides by the count of that replay (not the one its
        capture saw)."""
        for m in list(self._all_metrics()) + list(self.metrics):
            for metric in (m, getattr(m, "_impl", None)):
                if metric is not None and hasattr(metric, "_count_on_device"):
                    metric._count_on_device()

    def _keep_logs(self, logs: Any, kind: str) -> None:
        """A user's ``kind`` step returned ``logs`` (a dict of tensors or numbers): copied into persistent
        buffers of that kind (so a captured step's values outlive it, and a validation step's do not
        overwrite the training step's), read when the progress bar or History asks."""
        by_kind = self.__dict__.setdefault("_custom_logs_by_kind", {})
        if logs is None:
            self._custom_logs = None
            by_kind.pop(kind, None)
            return
        if not isinstance(logs, dict):
            raise TypeError(f"{self._owner}: train_step/test_step must return a dict of metric values (Keras), got "
                            f"{type(logs).__name__}")
        buffers = self.__dict__.setdefault("_custom_log_buffers", {})
        kept = buffers.setdefault(kind, {})
        out = {}
        for name, value in logs.items():
            raw = value.data if isinstance(value, Tensor) else value
            if isinstance(raw, (np.ndarray,)) or backend.is_device_array(raw):
                buf = kept.get(name)
                if buf is None or tuple(buf.shape) != tuple(raw.shape) or buf.dtype != raw.dtype or \
                        backend.device_of(buf) != backend.device_of(raw):
                    buf = kernels.copy(raw)
                    if backend.is_device_array(raw) and _capturing():
                        raise RuntimeError("a step's log buffer cannot be made inside a capture")
                else:
                    kernels.copy(raw, out=buf)
                kept[name] = buf
                out[name] = buf
            else:
                out[name] = value
        self._custom_logs = out
        by_kind[kind] = out

    def train_step(self, data: Any) -> dict:
        """One training step on ``data`` (``(x, y)`` or ``(x, y, sample_weight)``), Keras 3's ``train_step``:
        forward and loss under a :class:`~dnnbind.GradientTape`, gradients, ``optimizer.apply``, metrics.
        Override it in a subclass for a custom step (GANs, distillation...); a custom step with static shapes
        is captured as one CUDA graph like the built-in one."""
        x, y, sample_weight = unpack_x_y_sample_weight(data)
        with GradientTape() as tape:
            y_pred = self(x, training=True)
            loss = self._compute_loss_dispatch(x, y, y_pred, sample_weight, True)
        self._loss_tracker.update_state(ops.cast(loss, _F32).data, _batch_of(x))
        trainable = self.trainable_variables
        if trainable:
            scaled = loss if self._loss_scale is None else ops.multiply(loss, Tensor(self._loss_scale.scale))
            grads = tape.gradient(scaled, trainable)
            self.optimizer.apply(grads, trainable)
        return self.compute_metrics(x, y, y_pred, sample_weight)

    def test_step(self, data: Any) -> dict:
        """One evaluation step (Keras 3's ``test_step``)."""
        x, y, sample_weight = unpack_x_y_sample_weight(data)
        y_pred = self(x, training=False)
        loss = self._compute_loss_dispatch(x, y, y_pred, sample_weight, False)
        self._loss_tracker.update_state(ops.cast(loss, _F32).data, _batch_of(x))
        return self.compute_metrics(x, y, y_pred, sample_weight)

    def predict_step(self, data: Any) -> Any:
        """One prediction step (Keras 3's ``predict_step``): ``self(x, training=False)``."""
        x, _, _ = unpack_x_y_sample_weight(data)
        return self(x, training=False)

    def _compute_loss_dispatch(self, x, y, y_pred, sample_weight, training):
        params = inspect.signature(self.compute_loss).parameters
        if "training" in params:
            return self.compute_loss(x=x, y=y, y_pred=y_pred, sample_weight=sample_weight, training=training)
        return self.compute_loss(x=x, y=y, y_pred=y_pred, sample_weight=sample_weight)

    def compute_loss(self, x: Any = None, y: Any = None, y_pred: Any = None, sample_weight: Any = None,
                     training: bool = True) -> Tensor:
        """Keras 3's ``compute_loss``: the compiled losses of ``y_pred`` against ``y`` (weighted by
        ``loss_weights``) plus the model's ``losses`` (``add_loss``, weight regularizers), as one tensor."""
        outs = list(y_pred) if isinstance(y_pred, (list, tuple)) else (
            list(y_pred.values()) if isinstance(y_pred, dict) else [y_pred])
        targets = list(y) if isinstance(y, (list, tuple)) and len(outs) > 1 else [y]
        weights = list(sample_weight) if isinstance(sample_weight, (list, tuple)) and len(outs) > 1 else \
            [sample_weight] * len(outs)
        total = None
        for i, (out, loss) in enumerate(zip(outs, self._losses)):
            if loss is None or isinstance(loss, _NoLoss) or i >= len(targets):
                continue
            value = loss(targets[i], out, sample_weight=weights[i] if i < len(weights) else None)
            weight = self._loss_weights[i]
            value = value if weight == 1.0 else ops.multiply(value, weight)
            total = value if total is None else ops.add(total, value)
        for extra in self.losses:
            total = extra if total is None else ops.add(total, ops.cast(extra, total.dtype))
        if total is None:
            raise ValueError("No loss to compute. Provide a `loss` argument in `compile()`.")
        return total

    def compute_metrics(self, x: Any, y: Any, y_pred: Any, sample_weight: Any = None) -> dict:
        """Keras 3's ``compute_metrics``: update the compiled metrics, return every metric's result."""
        outs = list(y_pred) if isinstance(y_pred, (list, tuple)) else [y_pred]
        targets = list(y) if isinstance(y, (list, tuple)) and len(outs) > 1 else [y]
        for i, group in enumerate(self._output_metrics):
            if i < len(outs) and i < len(targets):
                out = outs[i] if isinstance(outs[i], Tensor) else ops.convert_to_tensor(outs[i])
                y_i = targets[i].data if isinstance(targets[i], Tensor) else targets[i]
                for m in group:
                    self._update_metric(m, y_i, out)
        return self.get_metrics_result()

    def get_metrics_result(self) -> dict:
        """Every metric's current result, by name (Keras 3)."""
        return {m.name: m.result() for m in self.metrics}

    @property
    def metrics(self) -> list:
        """The loss tracker and the compiled metrics, then the metrics of the layers (Keras 3)."""
        return self._all_metrics()

    def _after_loss_scaled_step(self) -> None:
        """The loss scale's growth check; when it synchronised, the optimizer's update count is
        confirmed from the device too (it skips overflowed steps there), at no extra wait."""
        if self._loss_scale.maybe_grow() and self.optimizer is not None:
            self.optimizer._confirm_iterations()

    def _test_step(self, x: Any, y: Any) -> None:
        touched = self._precast_weights(self._flat_layers())
        added = losses_added()
        try:
            if type(self).test_step is not Trainer.test_step:
                self._count_metrics_on_device()
                self._keep_logs(self.test_step(self._step_data(x, y)), "test")
            else:
                self._loss_and_metrics(_unpack(x), _unpack(y), training=False)
        finally:
            if losses_added() != added:
                self._clear_losses()
            self._end_precast(touched)

    def _predict_step(self, x: Any) -> Any:
        touched = self._precast_weights(self._flat_layers())
        added = losses_added()
        try:
            if type(self).predict_step is not Trainer.predict_step:
                out = self.predict_step(self._step_data(x, None))
                outs = list(out) if isinstance(out, (list, tuple)) else [out]
            else:
                outs = self._run_forward(_unpack(x), training=False, logits=[False] * len(self.output_names))
        finally:
            if losses_added() != added:
                self._clear_losses()
            self._end_precast(touched)
        return _pack([_to_f32(o.data if isinstance(o, Tensor) else o) for o in outs])

    # ----- batching ---------------------------------------------------------------------------
    def _device_batch(self, x: Any, y: Any, what: str, sample_weight: Any = None,
                      class_weight: "dict | None" = None) -> tuple[Any, Any]:
        """Packed ``(x, y)`` on the model's device for a ``*_on_batch`` call (``y`` with the sample
        weights appended, see :meth:`_step_targets`). DeviceArrays (already on this model's device)
        are taken as they are: only shapes are checked, labels must already be in the loss's form
        (int32 class indices or float rows); ``class_weight`` needs host labels."""
        owner = self._owner
        self._guess_input_structure(x)
        items = flatten_structure(x, self._input_names(), f"{owner}: {what}", "x")
        if not any(backend.is_device_array(i) for i in items):
            if y is None:  # predicting: NaN/inf pass, as in predict
                return self._upload(self._check_x(x, what, finite=False)), None
            xs, ys = self._check_xy(x, y, what)
            ws = self._check_sample_weight(sample_weight, len(xs[0]), ys, what, class_weight)
            return self._upload(xs), self._upload(self._step_targets(ys, ws))
        if class_weight is not None:
            raise TypeError(f"{owner}: {what}: class_weight needs host (NumPy) labels to read the classes from; "
                            "pass sample_weight instead with device data")
        self._require_layers(what)
        for arr in items:
            if not backend.is_device_array(arr):
                raise TypeError(f"{owner}: {what} got a mix of DeviceArrays and host arrays as inputs")
            if arr.ndim < 1 or int(arr.shape[0]) == 0:
                raise ValueError(f"{owner}: {what} got no samples (x has shape {tuple(arr.shape)})")
            if backend.device_of(arr) != self.device:
                raise ValueError(f"{owner}: {what} got data on {backend.device_of(arr)} but the model "
                                 f"is on {self.device}; move one of them (model.to(...) or backend.asarray)")
        if not self.built:
            self._build_for([tuple(a.shape[1:]) for a in items])
        expected = self._expected_input_shapes()
        for arr, shape in zip(items, expected):
            if tuple(arr.shape[1:]) != tuple(shape):
                raise ValueError(f"{owner} expects input of shape (batch, {', '.join(map(str, shape))}), "
                                 f"got {tuple(arr.shape)}")
        items = [a if a.dtype.kind == "f" else kernels.cast(a, _F32) for a in items]
        n = int(items[0].shape[0])
        if y is None:
            return _pack(items), None
        ys = flatten_structure(y, list(self.output_names), f"{owner}: {what}", "y")
        out = []
        for i, (t, loss) in enumerate(zip(ys, self._losses)):
            if loss is None:
                continue
            if not backend.is_device_array(t):
                t = self._check_y_one(i, t, n, what)
                t = backend.asarray(t, device=self.device)
            elif int(t.shape[0]) != n:
                raise ValueError(f"{owner}: {what} got {n} input samples but {t.shape[0]} targets")
            out.append(t)
        if sample_weight is not None:
            out += self._device_weights(sample_weight, n, what)
        return _pack(items), _pack(out)

    def _device_weights(self, sample_weight: Any, n: int, what: str) -> list:
        """Sample weights for a device batch: ``(n,)`` float32 on the model's device, one per output
        with a loss (host arrays are checked as in ``fit``; DeviceArrays only by shape, no read-back)."""
        names = list(self.output_names)
        has_loss = [loss is not None for loss in self._losses]
        host = not any(backend.is_device_array(v) for v in (
            sample_weight.values() if isinstance(sample_weight, dict) else
            sample_weight if isinstance(sample_weight, (list, tuple)) else [sample_weight]))
        if host:
            ws = self._check_sample_weight(sample_weight, n, [True if h else None for h in has_loss], what)
            return [backend.asarray(w, device=self.device) for w, h in zip(ws, has_loss) if h]
        items = (flatten_structure(sample_weight, names, f"{self._owner}: {what}", "sample_weight")
                 if isinstance(sample_weight, (list, tuple, dict)) else [sample_weight] * len(names))
        out = []
        for item, h in zip(items, has_loss):
            if not h:
                continue
            if not backend.is_device_array(item) or tuple(item.shape) not in ((n,), (n, 1)):
                got = tuple(item.shape) if hasattr(item, "shape") else type(item).__name__
                raise ValueError(f"{self._owner}: {what}: sample_weight must be DeviceArrays of shape ({n},) or "
                                 f"({n}, 1) on {self.device} (one weight per sample), got {got}")
            if backend.device_of(item) != self.device:
                raise ValueError(f"{self._owner}: {what} got sample_weight on {backend.device_of(item)} but the "
                                 f"model is on {self.device}")
            item = item.reshape(n) if item.ndim == 2 else item
            out.append(item if item.dtype == _F32 else kernels.cast(item, _F32))
        return out

    def _check_y_one(self, i: int, y: Any, n: int, what: str) -> np.ndarray:
        """Output ``i``'s host targets for ``n`` samples, in its loss's label form."""
        owner = self._owner
        names = list(self.output_names)
        arr = np.asarray(y)
        if arr.ndim < 1 or len(arr) != n:
            raise ValueError(f"{owner}: {what} got {n} input samples but "
                             f"{len(arr) if arr.ndim else 'a scalar'} targets"
                             f"{'' if len(names) == 1 else f' for output {names[i]!r}'}; x and y must have the "
                             "same length")
        who = f"{owner}: " if len(names) == 1 else f"{owner}: output '{names[i]}': "
        loss = self._losses[i]
        # no compiled loss: the targets go to the custom step as given, so the output shape is not needed (a
        # GAN with no call() has none)
        shape = None if isinstance(loss, _NoLoss) else self._output_shapes()[i]
        arr = loss.prepare_labels(arr, shape, owner=who)
        _validate.finite_array(arr, "y" if len(names) == 1 else f"y['{names[i]}']", f"{owner}: {what}",
                               hint="clean the targets first")
        return arr

    def _upload(self, arrays: "list | None") -> Any:
        """Packed host arrays on the model's device (NumPy stays as it is)."""
        if arrays is None:
            return None
        dev = self.device
        return _pack([backend.asarray(a, device=dev) if dev.is_cuda else a for a in arrays])

    # ----- fit / evaluate / predict -----------------------------------------------------------
    def fit(self, x: Any = None, y: Any = None, batch_size: int | None = None, epochs: int = 1,
            verbose: Any = "auto", callbacks: Sequence[Any] | None = None, validation_split: float = 0.0,
            validation_data: Any = None, shuffle: bool = True, class_weight: Any = None, sample_weight: Any = None,
            initial_epoch: int = 0, steps_per_epoch: int | None = None, validation_steps: int | None = None,
            validation_batch_size: int | None = None, validation_freq: int = 1, seed: int | None = None):
        """Train for ``epochs`` epochs; returns a :class:`~dnnbind.callbacks.History`.

        ``x`` is one of (Keras 3):

        * NumPy arrays with targets ``y``: one array for a one-input (one-output) model; for several,
          a list in the model's order or a dict keyed by input (output) name. A tuple
          ``(x, y)`` or ``(x, y, sample_weight)`` passed as ``x`` (with ``y=None``) is unpacked.
        * a Python generator or iterator yielding batches ``(x, y)`` or ``(x, y, sample_weight)``
          (``y``/``sample_weight`` must then not be passed). Without ``steps_per_epoch`` the first
          epoch runs until it is exhausted; a later epoch then finds it empty and training stops
          with a warning, as Keras ("Your input ran out of data").
        * a :class:`dnnbind.utils.PyDataset` (``keras.utils.PyDataset``): ``len()`` batches per
          epoch, visited in a new random order per epoch when ``shuffle``; ``on_epoch_end`` after
          each epoch; ``workers > 1`` fetches batches on threads.

        ``steps_per_epoch``: batches per epoch; the pass over the data continues across epochs
        (arrays and PyDatasets restart once used up). A batch smaller than the first (the last of
        a pass) runs eagerly, never as a CUDA graph of its own.

        ``sample_weight`` (arrays only; generators yield it as the third element): per-sample
        weights ``(N,)`` or ``(N, 1)``; several outputs take one array for all, or a list/dict with
        one per output. ``class_weight``: ``{class index: weight}`` for a one-output model, turned
        into per-sample weights from the labels (cannot be combined with ``sample_weight``). A
        weighted loss is ``sum_i w_i l_i / batch_size`` (Keras 3's ``sum_over_batch_size``: divided
        by the batch size, not by the sum of the weights); the logged ``loss`` is that value averaged
        over batches; ``metrics`` are not weighted (Keras 3 weights only ``weighted_metrics``).

        ``validation_data``: ``(x_val, y_val)``, ``(x_val, y_val, sample_weight_val)``, a generator or
        a PyDataset, read ``validation_steps`` batches per validation (None: all).
        ``validation_split`` (arrays only) holds out the *last* fraction of the samples (before
        shuffling), as Keras. ``shuffle`` reorders the training samples every epoch from a generator
        seeded by ``seed``, or when None by a seed drawn from dnnbind's seed generator
        (:func:`dnnbind.utils.set_random_seed`). ``epochs`` is the index of the last epoch (training
        runs epochs ``initial_epoch .. epochs - 1``). Validation calls the callbacks'
        ``on_test_begin``/``on_test_end`` (and batch hooks), as Keras 3.

        Every argument is checked before anything runs; ``x`` (and float ``y``) holding NaN or inf
        is refused with the count and the first bad sample (for generators, batch by batch).

        Under :func:`dnnbind.distribution.set_distribution` (one process per GPU) ``batch_size`` is
        the global batch, the data is sharded over the ranks, gradients are averaged in the step and
        the History is global (see :mod:`dnnbind.distribution.data_parallel`).
        """
        owner = f"{self._owner}: fit"
        self._require_compiled("fit")
        if not self._call_optional():
            self._require_layers("fit")
        batch_size = _validate.optional_positive_int(batch_size, "batch_size", owner)
        epochs = _validate.non_negative_int(epochs, "epochs", owner)
        initial_epoch = _validate.non_negative_int(initial_epoch, "initial_epoch", owner)
        if initial_epoch > epochs:
            raise ValueError(f"{owner}: initial_epoch={initial_epoch} is past epochs={epochs}; epochs is the index "
                             "of the last epoch, not a count (fit(epochs=initial_epoch + n) trains n more)")
        verbose = _resolve_verbose(verbose, owner)
        cb_list = _validate.instances(callbacks, callbacks_module.Callback, "callbacks", owner)
        validation_split = _validate.number(validation_split, "validation_split", owner, low=0.0, high=1.0,
                                            high_open=True)
        shuffle = _validate.boolean(shuffle, "shuffle", owner)
        steps_per_epoch = _validate.optional_positive_int(steps_per_epoch, "steps_per_epoch", owner)
        validation_steps = _validate.optional_positive_int(validation_steps, "validation_steps", owner)
        validation_batch_size = _validate.optional_positive_int(validation_batch_size, "validation_batch_size",
                                                                owner)
        validation_freq = _validate.positive_int(validation_freq, "validation_freq", owner)
        if seed is not None:
            _validate.non_negative_int(seed, "seed", owner)
        class_weight = self._check_class_weight(class_weight, owner)
        _refuse_both_weights(class_weight, sample_weight, owner)
        kind = data_kind(x)
        if kind != "arrays":
            if validation_split:
                raise ValueError(f"{owner}: validation_split is only supported for NumPy arrays, not for "
                                 f"{_KIND_WORDS[kind]}; pass validation_data instead")
            self._check_batch_size_unused(batch_size, kind, owner)
        if validation_data is not None and data_kind(validation_data) == "arrays":
            if not isinstance(validation_data, (tuple, list)) or len(validation_data) not in (2, 3):
                got = (f"a {type(validation_data).__name__} of {len(validation_data)}"
                       if isinstance(validation_data, (tuple, list)) else type(validation_data).__name__)
                raise ValueError(f"{owner}: validation_data must be a tuple (x_val, y_val), got {got} (also accepted: "
                                 "(x_val, y_val, sample_weight_val), a generator, a PyDataset)")
        batch_size = batch_size or 32
        replica = self._replica_for(owner)
        shard = None
        if replica is not None:
            batch_size = self._distributed_args(replica, [kind] + ([data_kind(validation_data)] if validation_data
                                                                  is not None else []), batch_size, owner)
            if validation_batch_size is not None:
                validation_batch_size = replica.per_replica_batch(validation_batch_size, owner, "validation_batch_size")
            shard = replica.shard
            if not replica.is_writer:  # rank 0 alone draws the bar and writes files
                verbose = 0
                cb_list = replica.writer_callbacks(cb_list)

        val_arrays = None
        if kind == "arrays":
            x, y, sample_weight = self._split_tuple_x(x, y, sample_weight, targets=True)
            _refuse_both_weights(class_weight, sample_weight, owner)  # a weight inside the (x, y, w) tuple
            xs, ys = self._check_xy(x, y, "fit")
            n = len(xs[0])
            ws = self._check_sample_weight(sample_weight, n, ys, "fit")
            if validation_split and validation_data is None:
                split = int(n * (1.0 - validation_split))
                if split == 0 or split == n:
                    raise ValueError(f"{owner}: validation_split={validation_split} leaves no training or no "
                                     f"validation samples out of {n}")
                cut = lambda arrays, part: None if arrays is None else [  # noqa: E731
                    None if a is None else (a[:split] if part == 0 else a[split:]) for a in arrays]
                val_arrays = (cut(xs, 1), cut(ys, 1), cut(ws, 1))
                xs, ys, ws = cut(xs, 0), cut(ys, 0), cut(ws, 0)
            if class_weight is not None:
                ws = self._check_sample_weight(None, len(xs[0]), ys, "fit", class_weight)
            train_feed = self._array_feed(xs, ys, ws, batch_size, shuffle, steps_per_epoch, shard)
        else:
            train_feed = self._source_feed(x, y, sample_weight, kind, "fit", targets=True, shuffle=shuffle,
                                           steps=steps_per_epoch, class_weight=class_weight, shard=shard)
        val_feed = None
        if validation_data is not None:
            val_feed = self._eval_feed(validation_data, None, None, "fit (validation_data)",
                                       validation_batch_size or batch_size, validation_steps, unpack=True, shard=shard)
        elif val_arrays is not None:
            val_feed = self._array_feed(*val_arrays, validation_batch_size or batch_size, False, validation_steps,
                                        shard)

        history = callbacks_module.History()
        cbs = self._callback_list([*cb_list, history], verbose, train_feed.steps_per_epoch, epochs=epochs)
        # History must record what the callbacks add (learning_rate) before the bar prints it
        progbars = [c for c in cbs.callbacks if isinstance(c, callbacks_module.ProgbarLogger)]
        cbs.callbacks = [c for c in cbs.callbacks if c not in progbars] + progbars
        self.history = history
        self.stop_training = False
        if replica is not None:
            seed = replica.agree_seed(seed)  # every rank shuffles alike: rank 0's seed
        # seed=None: one seed per fit call from dnnbind's seed generator (utils.set_random_seed fixes it)
        rng = np.random.default_rng(draw_seed() if seed is None else seed)
        joined = False
        try:
            cbs.on_train_begin()
            for epoch in range(initial_epoch, epochs):
                self.reset_metrics()
                cbs.on_epoch_begin(epoch)
                ran = 0
                for step, (xb, yb) in enumerate(train_feed.epoch(rng, self._static_inputs("train"))):
                    cbs.on_train_batch_begin(step)
                    if not joined:  # here the model is built, also when a PyDataset's first batch built it
                        self._join_replicas(replica, always=True)
                        joined = True
                    # a batch smaller than the pass's first (its last) runs eagerly rather than holding
                    # a graph of its own
                    self._step("train", _pack(xb), _pack(yb), graph=train_feed.full(xb))
                    if replica is not None:
                        replica.after_step()
                    if self._loss_scale is not None:
                        self._after_loss_scaled_step()
                    ran += 1
                    cbs.on_train_batch_end(step, self._lazy_logs())
                    if self.stop_training:
                        break
                train_feed.on_epoch_end()
                if ran == 0:
                    if train_feed.ran_out:
                        break  # the warning said so; an epoch without a step has nothing to log
                    raise ValueError(f"{owner}: x gave no batches (an empty generator or PyDataset)")
                if replica is not None:
                    replica.reduce_metrics(self._all_metrics())  # every rank's History is global
                logs = self._logs()
                if "loss" in logs and not math.isfinite(logs["loss"]):
                    warnings.warn(f"{self._owner}: epoch {epoch + 1}: the loss is {logs['loss']} "
                                  "(NaN or inf); lower the learning rate or check the data "
                                  "(callbacks.TerminateOnNaN stops training on it)", RuntimeWarning, stacklevel=2)
                if val_feed is not None and (epoch + 1) % validation_freq == 0:
                    cbs.on_test_begin()
                    if self._run_test(val_feed, cbs):
                        val_logs = self._logs(prefix="val_")
                        cbs.on_test_end(self._logs())
                        logs.update(val_logs)
                    else:
                        cbs.on_test_end({})
                cbs.on_epoch_end(epoch, logs)
                if self.stop_training or train_feed.ran_out:
                    break
            cbs.on_train_end()
        except BaseException as exc:
            if replica is not None:
                replica.report_failure(exc)  # the other ranks stop with this message, not a timeout
            raise
        finally:
            train_feed.close()
            if val_feed is not None:
                val_feed.close()
        return history

    def _callback_list(self, cb_list: list, verbose: int, steps: "int | None", **params: Any):
        """The callbacks of a fit/evaluate/predict call, with Keras's ProgbarLogger added when ``verbose``."""
        if verbose and not any(isinstance(c, callbacks_module.ProgbarLogger) for c in cb_list):
            cb_list = [*cb_list, callbacks_module.ProgbarLogger(verbose)]
        return callbacks_module.CallbackList(cb_list, model=self, params={"verbose": verbose, "steps": steps, **params})

    def _run_test(self, feed: EpochIterator, cbs=None) -> int:
        """One epoch of ``feed`` through test steps (metrics reset first); returns the batches run."""
        self.reset_metrics()
        ran = 0
        for step, (xb, yb) in enumerate(feed.epoch(np.random.default_rng(0))):
            if cbs is not None:
                cbs.on_test_batch_begin(step)
            self._step("test", _pack(xb), _pack(yb), graph=feed.full(xb))
            ran += 1
            if cbs is not None:
                cbs.on_test_batch_end(step, self._lazy_logs())
        feed.on_epoch_end()
        replica = self.__dict__.get("_replica")
        if replica is not None and ran:
            replica.reduce_metrics(self._all_metrics())
        return ran

    def evaluate(self, x: Any = None, y: Any = None, batch_size: int | None = None, verbose: Any = "auto",
                 sample_weight: Any = None, steps: int | None = None, callbacks: Sequence[Any] | None = None,
                 return_dict: bool = False):
        """Loss (and metrics) on ``x``/``y``: a float, ``[loss, *metrics]``, or a dict with ``return_dict``.

        ``x`` may be arrays (with ``y``, or a tuple ``(x, y[, sample_weight])``), a generator or a
        PyDataset, as in :meth:`fit`; ``steps`` limits the batches read (None: all of them).
        ``sample_weight`` weighs each sample's loss (Keras 3: ``sum_i w_i l_i / batch_size`` per
        batch). Empty data, and ``x`` (or float ``y``) holding NaN or inf, are refused (as ``fit``).
        """
        owner = f"{self._owner}: evaluate"
        self._require_compiled("evaluate")
        self._require_layers("evaluate")
        batch_size = _validate.optional_positive_int(batch_size, "batch_size", owner)
        verbose = _resolve_verbose(verbose, owner)
        steps = _validate.optional_positive_int(steps, "steps", owner)
        cb_list = _validate.instances(callbacks, callbacks_module.Callback, "callbacks", owner)
        return_dict = _validate.boolean(return_dict, "return_dict", owner)
        kind = data_kind(x)
        if kind != "arrays":
            self._check_batch_size_unused(batch_size, kind, owner)
        replica = self._replica_for(owner)
        batch_size = batch_size or 32
        if replica is not None:
            batch_size = self._distributed_args(replica, [kind], batch_size, owner)
            verbose = verbose if replica.is_writer else 0
            cb_list = replica.writer_callbacks(cb_list)
        feed = self._eval_feed(x, y, sample_weight, "evaluate", batch_size, steps, unpack=False,
                               shard=None if replica is None else replica.shard)
        self._join_replicas(replica, always=False)
        try:
            cbs = self._callback_list(cb_list, verbose, feed.steps_per_epoch)
            cbs.on_test_begin()
            ran = self._run_test(feed, cbs)
        finally:
            feed.close()
        if ran == 0:
            raise ValueError(f"{owner}: x gave no batches (an empty or exhausted generator or PyDataset)")
        logs = self._logs()
        cbs.on_test_end(logs)
        if return_dict:
            return logs
        values = [logs[name] for name in self.metrics_names]
        return values[0] if len(values) == 1 else values

    def predict(self, x: Any, batch_size: int | None = None, verbose: Any = "auto", steps: int | None = None,
                callbacks: Sequence[Any] | None = None) -> Any:
        """Model outputs for ``x`` as NumPy (float32): one array, or a list for several outputs.

        ``x``: arrays, a generator or a PyDataset (batches ``x``, ``(x,)``, ``(x, y)`` or ``(x, y,
        sample_weight)``: only ``x`` is read), as in :meth:`fit`; ``steps`` limits the batches read.
        As Keras, NaN or inf in ``x`` are accepted (they give NaN outputs); zero samples give an
        empty result.
        """
        owner = f"{self._owner}: predict"
        self._require_layers("predict")
        batch_size = _validate.optional_positive_int(batch_size, "batch_size", owner)
        verbose = _resolve_verbose(verbose, owner)
        steps = _validate.optional_positive_int(steps, "steps", owner)
        cb_list = _validate.instances(callbacks, callbacks_module.Callback, "callbacks", owner)
        kind = data_kind(x)
        if kind == "arrays":
            x, _, _ = self._split_tuple_x(x, None, None, targets=False)
            xs = self._check_x(x, "predict", finite=False, allow_empty=True)
            feed = EpochIterator(ArrayDataAdapter(xs, None, batch_size or 32, shuffle=False, device=self.device), steps)
        else:
            self._check_batch_size_unused(batch_size, kind, owner)
            feed = self._source_feed(x, None, None, kind, "predict", targets=False, shuffle=False, steps=steps)
        cbs = self._callback_list(cb_list, verbose, feed.steps_per_epoch)
        cbs.on_predict_begin()
        outputs = []
        try:
            for step, (xb, _) in enumerate(feed.epoch(np.random.default_rng(0))):
                cbs.on_predict_batch_begin(step)
                outputs.append(_unpack(self._step("predict", _pack(xb), graph=feed.full(xb))))
                cbs.on_predict_batch_end(step, {})
            feed.on_epoch_end()
        finally:
            feed.close()
        # read back after everything is queued, so the device never idles waiting for the host
        results = []
        for i, shape in enumerate(self._output_shapes()):
            host = [backend.to_numpy(o[i]) for o in outputs]
            results.append(np.concatenate(host, axis=0) if host else np.zeros((0, *shape), _F32))
        cbs.on_predict_end()
        return results[0] if len(results) == 1 else results

    # ----- data feeds -------------------------------------------------------------------------
    def _split_tuple_x(self, x: Any, y: Any, sample_weight: Any, targets: bool) -> tuple[Any, Any, Any]:
        """A tuple ``(x, y)`` / ``(x, y, sample_weight)`` passed as ``x`` unpacked (Keras 3's rule for
        one batch). Training/evaluation: whenever ``y`` is None. Predict: when the tuple's length is
        not the model's number of inputs (a tuple of one array per input stays the inputs)."""
        if y is not None or sample_weight is not None or not isinstance(x, tuple) or len(x) not in (2, 3):
            return x, y, sample_weight
        if not targets:
            self._guess_input_structure(x)
            if len(x) == len(self._input_names()):
                return x, y, sample_weight
        return unpack_x_y_sample_weight(x)

    def _check_batch_size_unused(self, batch_size: Any, kind: str, owner: str) -> None:
        # Keras 3 ignores it silently; a script that passes it still runs, but is told
        if batch_size is not None:
            warnings.warn(f"{owner}: batch_size={batch_size} is ignored when x is {_KIND_WORDS[kind]}: its "
                          "batches already have their size", UserWarning, stacklevel=3)

    def _array_feed(self, xs: list, ys: "list | None", ws: "list | None", batch_size: int, shuffle: bool,
                    steps: "int | None", shard: "tuple[int, int] | None" = None) -> EpochIterator:
        targets = None if ys is None else self._step_targets(ys, ws)
        return EpochIterator(ArrayDataAdapter(xs, targets, batch_size, shuffle=shuffle, device=self.device,
                                              shard=shard), steps)

    def _source_feed(self, x: Any, y: Any, sample_weight: Any, kind: str, what: str, *, targets: bool,
                     shuffle: bool, steps: "int | None", class_weight: "dict | None" = None,
                     shard: "tuple[int, int] | None" = None) -> EpochIterator:
        """A feed over a generator or PyDataset whose batches are checked one by one (:meth:`_prepare_batch`)."""
        owner = f"{self._owner}: {what}"
        for name, value, part in (("y", y, "the targets"), ("sample_weight", sample_weight, "the sample weights")):
            if value is not None:
                raise ValueError(f"{owner}: when x is {_KIND_WORDS[kind]}, {name} must not be passed; {part} "
                                 f"come from the batches it yields ((x, y) or (x, y, sample_weight))")

        def prepare(raw: Any) -> tuple[list, "list | None"]:
            return self._prepare_batch(raw, what, targets, class_weight)

        if kind == "py_dataset":
            adapter: Any = PyDatasetAdapter(x, prepare, shuffle=shuffle, device=self.device, owner=owner, shard=shard)
        else:
            adapter = GeneratorDataAdapter(x, prepare, device=self.device)
        return EpochIterator(adapter, steps)

    def _eval_feed(self, x: Any, y: Any, sample_weight: Any, what: str, batch_size: int, steps: "int | None",
                   unpack: bool, shard: "tuple[int, int] | None" = None) -> EpochIterator:
        """The feed of an evaluation (``evaluate``, or ``fit``'s ``validation_data`` when ``unpack``)."""
        kind = data_kind(x)
        if kind != "arrays":
            return self._source_feed(x, y, sample_weight, kind, what, targets=True, shuffle=False, steps=steps,
                                     shard=shard)
        if unpack:
            x, y, sample_weight = unpack_x_y_sample_weight(tuple(x))
        else:
            x, y, sample_weight = self._split_tuple_x(x, y, sample_weight, targets=True)
        xs, ys = self._check_xy(x, y, what)
        ws = self._check_sample_weight(sample_weight, len(xs[0]), ys, what)
        return self._array_feed(xs, ys, ws, batch_size, False, steps, shard)

    def _prepare_batch(self, raw: Any, what: str, targets: bool, class_weight: "dict | None"
                       ) -> tuple[list, "list | None"]:
        """One batch of a generator or PyDataset, checked as ``fit``/``evaluate``/``predict`` check
        arrays, in step form: ``(xs, targets + sample weights)`` host arrays."""
        x, y, sample_weight = unpack_x_y_sample_weight(raw)
        if not targets:
            return self._check_x(x, what, finite=False), None
        if y is None:
            raise ValueError(f"{self._owner}: {what} got a batch without targets; a generator or PyDataset for "
                             "training or evaluation must yield (x, y) or (x, y, sample_weight)")
        xs, ys = self._check_xy(x, y, what)
        ws = self._check_sample_weight(sample_weight, len(xs[0]), ys, what, class_weight)
        return xs, self._step_targets(ys, ws)

    def _check_class_weight(self, class_weight: Any, owner: str) -> "dict | None":
        if class_weight is None:
            return None
        if not isinstance(class_weight, dict):
            raise _validate.ArgumentTypeError(f"{owner}: class_weight must be a dict {{class index: weight}}, got "
                                              f"{type(class_weight).__name__}")
        out = {}
        for key, weight in class_weight.items():
            if isinstance(key, (bool, np.bool_)) or not isinstance(key, (int, np.integer)) or key < 0:
                raise ValueError(f"{owner}: class_weight keys must be class indices (ints >= 0), got {key!r}")
            out[int(key)] = _validate.number(weight, f"class_weight[{int(key)}]", owner)
        names = list(self.output_names)
        if len(names) > 1:
            raise ValueError(f"{owner}: class_weight is only supported for models with a single output (this one "
                             f"has {names}); give sample_weight with one array per output instead")
        return out

    def _check_sample_weight(self, sample_weight: Any, n: int, ys: list, what: str,
                             class_weight: "dict | None" = None) -> "list | None":
        """Per-sample weights ``(n,)`` float32, one per output (None for an output without a loss), or
        None. One array weighs every output (Keras 3); a list/dict gives one per output (None: ones).
        ``class_weight`` (already checked) turns the one output's labels ``ys[0]`` into weights."""
        owner = f"{self._owner}: {what}"
        if class_weight is not None:
            _refuse_both_weights(class_weight, sample_weight, owner)
            return [class_weight_to_sample_weights(ys[0], class_weight)]
        if sample_weight is None:
            return None
        names = list(self.output_names)
        if len(names) == 1 or isinstance(sample_weight, (list, tuple, dict)) and not _is_weight_vector(sample_weight):
            items = flatten_structure(sample_weight, names, owner, "sample_weight")
        else:
            items = [sample_weight] * len(names)
        out = []
        for name, item, target in zip(names, items, ys):
            if target is None:
                out.append(None)
                continue
            if item is None:
                out.append(np.ones(n, _F32))
                continue
            w = np.asarray(item)
            where = "sample_weight" if len(names) == 1 else f"sample_weight['{name}']"
            if w.dtype.kind not in "fiub":
                raise TypeError(f"{owner}: {where} must be numbers, got dtype {w.dtype}")
            if w.shape not in ((n,), (n, 1)):
                raise ValueError(f"{owner}: {where} must have shape ({n},) or ({n}, 1), one weight per sample, "
                                 f"got {w.shape}")
            w = np.ascontiguousarray(w.reshape(n), dtype=_F32)
            _validate.finite_array(w, where, owner, hint="give every sample a finite weight")
            out.append(w)
        return out

    @staticmethod
    def _step_targets(ys: "list | None", ws: "list | None") -> "list | None":
        """What a step takes as ``y``: the targets of the outputs with a loss, then (when weighted) one
        weight array per such output, so graph steps upload the weights into static buffers too."""
        if ys is None:
            return None
        present = [t for t in ys if t is not None]
        if ws is None:
            return present
        return present + [w for w, t in zip(ws, ys) if t is not None]

    def _batch_result(self, return_dict: bool):
        if return_dict:
            # lazy: each value is read from the device only when looked up
            return self._lazy_logs()
        values = list(self._logs().values())
        return values[0] if len(values) == 1 else values

    def train_on_batch(self, x: Any, y: Any = None, sample_weight: Any = None, class_weight: Any = None,
                       return_dict: bool = False):
        """One update on one batch (NumPy, or DeviceArrays on the model's device).

        ``sample_weight``: ``(N,)`` per-sample weights (a list/dict for several outputs; DeviceArrays
        with device data); ``class_weight``: ``{class: weight}`` read from host labels. The loss is
        ``sum_i w_i l_i / N`` (Keras 3), as in :meth:`fit`.

        As Keras 3, the metrics are reset first, so the returned loss/metrics are this batch's;
        ``return_dict=True`` returns a lazy mapping whose values are read from the device only when looked
        up (no per-step synchronisation).
        """
        self._require_compiled("train_on_batch")
        owner = f"{self._owner}: train_on_batch"
        return_dict = _validate.boolean(return_dict, "return_dict", owner)
        class_weight = self._check_class_weight(class_weight, owner)
        if y is None:
            raise ValueError(f"{self._owner}: train_on_batch needs targets y")
        replica = self._replica_for(owner)
        xb, yb = self._device_batch(x, y, "train_on_batch", sample_weight, class_weight)
        # each rank passes its own batch (as with DDP); gradients are averaged over the ranks
        self._join_replicas(replica, always=False)
        self.reset_metrics()
        self._step("train", xb, yb)
        if replica is not None:
            replica.after_step()
        if self._loss_scale is not None:
            self._after_loss_scaled_step()
        return self._batch_result(return_dict)

    def test_on_batch(self, x: Any, y: Any = None, sample_weight: Any = None, return_dict: bool = False):
        """Loss (and metrics) of one batch without updating weights (the metrics are reset first, as Keras 3)."""
        self._require_compiled("test_on_batch")
        return_dict = _validate.boolean(return_dict, "return_dict", f"{self._owner}: test_on_batch")
        if y is None:
            raise ValueError(f"{self._owner}: test_on_batch needs targets y")
        xb, yb = self._device_batch(x, y, "test_on_batch", sample_weight)
        self.reset_metrics()
        self._step("test", xb, yb)
        return self._batch_result(return_dict)

    def predict_on_batch(self, x: Any) -> Any:
        """Outputs for one batch, as NumPy (a list for several outputs)."""
        xb, _ = self._device_batch(x, None, "predict_on_batch")
        outs = _unpack(self._step("predict", xb))
        host = [backend.to_numpy(o) for o in outs]
        return host[0] if len(host) == 1 else host
