"""The Trainer (a mixin of ``Model``): compile, the steps, Keras 3's step API, fit / evaluate / predict.

Training runs the layers' forward and backward on one tape: the model's forward (a layer chain for
``Sequential``, the recorded tape for functional and subclassed models), the losses, the gradients,
then one fused optimizer update. A final softmax with a ``from_logits=False`` cross-entropy is fused
into ``kernels.softmax_cross_entropy`` on the logits (the softmax's backward is never run) wherever
the model can skip it (``_fusable_outputs``).

No step waits for the host: loss and metrics accumulate in device scalars that are read when the
progress bar draws and at the end of an epoch. CUDA graphs (``compile(jit_compile="auto")``, the
default): on CUDA each step kind and batch shape runs eagerly once, is captured the second time and
replayed from then on (see :mod:`.step_graphs`).

This class composes the rooms of ``dnnbind.trainers`` (Keras 3's ``keras/src/trainers`` lines):

* :mod:`.compile_utils`: ``compile``'s arguments resolved per output, and the compile config;
* :mod:`.loops`: the epoch loops of ``fit``/``evaluate``/``predict`` and the callbacks they drive;
* :mod:`.feeds`: user data checked against the model, in step form (the feeds, ``*_on_batch``'s batches);
* :mod:`.precision`: the loss scale and the compute-dtype weight copies of mixed precision;
* :mod:`.step_graphs`: the steps captured as CUDA graphs and replayed;
* :mod:`.data_adapters`: arrays, generators and PyDatasets turned into batches on the device.

What the trainer needs from a model, and what the step graphs need from the trainer, is written down
once in :mod:`.protocol` (``tests/test_trainer_protocol.py`` checks it against the code).

Inside a step, inputs and targets are *packed*: one array for a one-input (one-output) model, a
tuple otherwise (that is what the step-graph cache keys and buffers). A weighted batch appends one
float32 sample-weight array per output with a loss to the targets (:func:`.feeds.step_targets`).
"""

from __future__ import annotations

import inspect
import warnings
from typing import Any, Sequence

import numpy as np

from .. import _validate, backend, kernels, ops
from .. import callbacks as callbacks_module
from .. import distribution as distribution_module
from .. import metrics as metrics_module
from ..errors import DnnbindError
from ..autodiff import GradientTape
from ..autodiff import engine as autodiff_engine
from ..autodiff.tensor import Tensor
from ..layers.base import losses_added, release_pending_state
from ..ops import _core as ops_core
from ..mixed_precision import global_policy
from . import compile_utils, feeds, loops
from .compile_utils import NoLoss, check_jit_compile
from .data_adapters import unpack_x_y_sample_weight
from .feeds import pack, unpack
from .precision import LossScale, end_precast, grads_in_compute_dtype, precast_weights, to_float32
from .step_graphs import StepGraphs

__all__ = ["Trainer"]

_F32 = np.dtype(np.float32)
_F64 = np.dtype(np.float64)


def _as_float(value: Any) -> Any:
    """A log value (a tensor, a raw array, a number) as a Python float (a host read); a result of several
    values (``F1Score(average=None)``, ``Precision(thresholds=[...])``) stays a NumPy array, as Keras 3's
    ``pythonify_logs`` leaves what ``float`` cannot take."""
    if isinstance(value, Tensor):
        value = value.data
    if backend.is_device_array(value):
        value = backend.to_numpy(value)
    if np.size(value) > 1:
        return np.array(value)
    return float(np.asarray(value).reshape(-1)[0]) if np.size(value) else 0.0


def _batch_of(x: Any) -> int:
    first = x[0] if isinstance(x, (list, tuple)) else (next(iter(x.values())) if isinstance(x, dict) else x)
    return int(first.shape[0]) if hasattr(first, "shape") and len(first.shape) else 1


def _capturing() -> bool:
    from ..cuda import current_stream  # deferred: only reached with device arrays (cuda.bindings loaded)

    return current_stream().is_capturing()


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
        ``<output>_<metric>``, and each output's loss ``<output>_loss``. ``weighted_metrics`` (the same
        forms) are updated with the batch's ``sample_weight`` (Keras 3); one whose name a plain metric
        already has is logged as ``weighted_<name>``.

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
        jit_compile = check_jit_compile(jit_compile, "compile")
        run_eagerly = _validate.boolean(run_eagerly, "run_eagerly", owner)
        _validate.positive_int(steps_per_execution, "steps_per_execution", owner)
        auto_scale_loss = _validate.boolean(auto_scale_loss, "auto_scale_loss", owner)
        self._guess_output_structure(loss)
        names = list(self.output_names)
        args = compile_utils.resolve(optimizer, loss, metrics, loss_weights, names, owner, weighted_metrics)
        policy = global_policy()
        loss_scale = LossScale(self.device) if (auto_scale_loss and policy.needs_loss_scaling
                                                and self.device.is_cuda) else None
        if run_eagerly and jit_compile is True:
            warnings.warn(f"{self._owner}: run_eagerly=True and jit_compile=True cannot both hold; "
                          "disabling jit_compile (as Keras does)", UserWarning, stacklevel=2)
            jit_compile = False
        # everything resolved: from here on nothing raises
        self._drop_graphs()  # new optimizer, loss, metrics and loss scale: every graph is stale
        self.optimizer = args.optimizer
        self._losses, self._loss_weights = args.losses, args.loss_weights
        self.loss = args.loss
        self._output_metrics, self._metrics = args.output_metrics, args.metrics
        self._loss_tracker = metrics_module.Mean(name="loss")
        self._output_loss_trackers = ([metrics_module.Mean(name=f"{n}_loss") if entry is not None else None
                                       for n, entry in zip(names, args.losses)] if len(names) > 1 else [])
        self._loss_scale = loss_scale
        self._compile_config = args.config
        self.run_eagerly = run_eagerly
        self._jit_compile = jit_compile
        self._step_graphs._warned.clear()
        if jit_compile is True and not self.device.is_cuda:
            self._warn_no_graphs()
        self.compiled = True

    def get_compile_config(self) -> "dict | None":
        """The compile arguments as JSON-able values (Keras 3), or None when not compiled."""
        return self._compile_config if self.compiled else None

    def compile_from_config(self, config: dict) -> None:
        """``compile`` from :meth:`get_compile_config`'s dict (a saved model's settings)."""
        if not isinstance(config, dict):
            raise TypeError(f"{self._owner}: compile_from_config needs a dict, got {type(config).__name__}")
        self.compile(**compile_utils.compile_arguments(config))

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
        value = check_jit_compile(value, "jit_compile")
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
            return None if got is None else (unpack(got[0]), unpack(got[1]))

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

    # ----- which steps a subclass overrides ------------------------------------------------
    def _targets_optional(self) -> bool:
        """Whether a step can do without targets: a custom ``train_step``/``test_step``, or no compiled loss
        (the loss comes from ``add_loss``)."""
        return (type(self).train_step is not Trainer.train_step or type(self).test_step is not Trainer.test_step
                or all(isinstance(loss, NoLoss) for loss in self._losses))

    def _call_optional(self) -> bool:
        """A model with a custom ``train_step`` may have no ``call`` (keras.io's GANs): nothing to build."""
        return type(self).train_step is not Trainer.train_step and getattr(type(self), "call", None) is \
            getattr(self._model_base(), "call", None)

    def _model_base(self) -> type:
        for cls in type(self).__mro__:
            if cls.__name__ == "Model" and cls.__module__.startswith("dnnbind."):
                return cls
        return type(self)

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
        float32 sample-weight array per such output (:func:`.feeds.step_targets`). The loss tracker is
        weighted by the batch size (Keras 3); metrics are not weighted, the ``weighted_metrics`` are."""
        fused = self._fused_outputs()
        outs = self._run_forward(xs, training=training, logits=fused)
        n = int(xs[0].shape[0])
        total = None
        n_targets = sum(loss is not None for loss in self._losses)
        ys = list(ys or ())  # fit(x) without targets: a model whose loss comes from add_loss only
        targets = iter(ys[:n_targets])
        weights = iter(ys[n_targets:]) if len(ys) > n_targets else None
        multi = len(outs) > 1
        for i, (out, loss) in enumerate(zip(outs, self._losses)):
            if loss is None:
                continue
            y = next(targets, None)
            sw = None if weights is None else next(weights)
            if isinstance(loss, NoLoss):
                continue
            value = None
            if out.dtype == _F32 or out.dtype == _F64:
                out32 = out
                value = loss._fused(y, out, sw, logits=fused[i])
            elif loss._has_fused_kernel() and ops_core.is_float(out.dtype):
                # the float32 copy the loss reads: its cast folds into the loss's recorded node (the gradient
                # goes back to the output cast to its dtype), and the metrics read it as it is
                out32 = Tensor(kernels.cast(out.data, _F32))
                value = loss._fused(y, out, sw, logits=fused[i], data32=out32.data)
            else:
                out32 = ops.cast(out, _F32)
            if value is None:
                value = loss(y, out32, sample_weight=sw)
            if multi:
                self._output_loss_trackers[i].update_state(value.data, n)
            weight = self._loss_weights[i]
            weighted = value if weight == 1.0 else ops.multiply(value, weight)
            total = weighted if total is None else ops.add(total, weighted)
            probs = None
            for m in self._output_metrics[i]:
                if fused[i] and getattr(m, "label_kind", None) not in ("sparse", "categorical") and not (
                        isinstance(m, metrics_module._AutoAccuracy)):
                    # the output holds the logits of a fused softmax: a metric other than an arg-max accuracy
                    # reads the probabilities (computed once, off the tape)
                    if probs is None:
                        probs = ops.softmax(Tensor(out32.data), axis=-1)
                    self._update_metric(m, y, probs, sw)
                else:
                    self._update_metric(m, y, out32, sw)
        extra = self.losses if self._may_have_losses() else ()
        if extra:
            more = extra[0] if len(extra) == 1 else ops.sum(ops.stack([ops.cast(e, _F32) for e in extra]))
            total = more if total is None else ops.add(total, ops.cast(more, total.dtype))
        if total is None:
            raise ValueError(f"{self._owner}: no loss to compute. Provide a `loss` argument in `compile()`.")
        self._loss_tracker.update_state(total.data if total.dtype == _F32 else kernels.cast(total.data, _F32), n)
        return total

    def _may_have_losses(self) -> bool:
        """Whether :attr:`losses` may give anything this step: weight or activity regularizers anywhere
        (known from the structure), or an ``add_loss`` that a model or layer with a ``call`` of its own made
        (read per step from those few, not by walking every layer)."""
        memo = getattr(self, "_memo", None)
        if memo is None:
            return True
        static, dynamic = memo("loss_sources", self._loss_sources)
        return static or any(holder.__dict__.get("_own_losses") for holder in dynamic)

    def _loss_sources(self) -> "tuple[bool, list]":
        """``(regularized, holders)``: whether a weight or activity regularizer exists anywhere, and the
        models and layers that may ``add_loss`` in a step (this model, nested models, layers with a
        ``call`` of their own). Kept while the structure stays (``Model._memo``)."""
        holders: list = [self]
        stack = [self]
        regularized = any(w.regularizer is not None for w in self._own_variables())
        while stack:
            for inner in stack.pop()._direct_layers():
                if hasattr(inner, "_direct_layers") and all(inner is not h for h in holders):  # a nested model
                    holders.append(inner)
                    stack.append(inner)
                    regularized = regularized or any(w.regularizer is not None for w in inner._own_variables())
        for layer in self._flat_layers():
            if layer.activity_regularizer is not None or any(
                    w.regularizer is not None for w in layer._weights + layer._tracked_variables()):
                regularized = True
            if not layer._is_legacy():
                holders.append(layer)
        return regularized, holders

    @staticmethod
    def _update_metric(m: Any, y: Any, out: Tensor, sample_weight: Any = None) -> None:
        """dnnbind's own metrics accumulate raw arrays with kernels; a user's metric gets tensors. A metric of
        ``weighted_metrics`` gets the batch's sample weights too (when there are any)."""
        weights = {"sample_weight": sample_weight} if sample_weight is not None and getattr(m, "_weighted", False) \
            else {}
        if type(m).update_state.__module__.startswith(metrics_module.__name__):
            m.update_state(y, out.data, **weights)
        else:
            m.update_state(y if not isinstance(y, np.ndarray) and not backend.is_device_array(y)
                           else Tensor(y), out, **weights)

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

    def _has_custom_train_step(self) -> bool:
        """A subclass's own ``train_step``, or its own ``compute_loss`` (which Keras 3's built-in
        ``train_step`` calls: the fused built-in step would not), runs through :meth:`train_step`."""
        return type(self).train_step is not Trainer.train_step or self._has_custom_loss()

    def _has_custom_test_step(self) -> bool:
        return type(self).test_step is not Trainer.test_step or self._has_custom_loss()

    def _has_custom_loss(self) -> bool:
        return type(self).compute_loss is not Trainer.compute_loss

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
            touched = precast_weights(self, layers)
            if self._has_custom_train_step():
                self._count_metrics_on_device()
                self._keep_logs(self.train_step(self._step_data(x, y)), "train")
            else:
                self._builtin_train_step(unpack(x), unpack(y), touched)
        finally:
            # drop what the forward kept for backwards that did not run, and the add_loss tensors: nothing
            # allocated inside the step outlives it (graph capture)
            release_pending_state()
            if losses_added() != added:
                self._clear_losses()
            end_precast(touched)

    def _builtin_train_step(self, xs: list, ys: list, touched: list) -> None:
        replica = self.__dict__.get("_replica")
        reducer = None
        params: list = []
        grads: list = []
        try:
            with GradientTape() as tape:
                total = self._loss_and_metrics(xs, ys, training=True)
            if touched and grads_in_compute_dtype(self, replica):
                for layer in touched:
                    layer.__dict__["_keep_grad_dtype"] = True  # (a plain private field: no tracking __setattr__)
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
            on_leaf = None if reducer is None else reducer.weight_done
            found = autodiff_engine.gradient([total], [seed_t], variables, tape=tape, on_leaf=on_leaf, raw=True)
            params = [w.value for w in variables]
            if not self.optimizer.built:
                for w in variables:
                    w._relayout_ok = False  # the slots about to be made follow the stored layout
            # a weight no loss reaches (an output without a loss) gets a zero gradient
            grads = [kernels.zeros_like(w.value) if g is None else g for w, g in zip(variables, found)]
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
            c = w.constraint  # (a Variable's class default: None)
            if c is not None:
                w.assign(c(w))

    # ----- the Keras 3 step API (override train_step/test_step/predict_step in a subclass) ----------
    def _step_data(self, x: Any, y: Any) -> Any:
        """What a user's ``train_step``/``test_step`` receives: ``(x, y)`` or ``(x, y, sample_weight)`` as
        tensors (a list for several inputs or outputs), or ``x`` alone without targets."""
        xs = [Tensor(a) for a in unpack(x)]
        xt = xs[0] if len(xs) == 1 else xs
        if y is None:
            return xt
        ys = [None if a is None else Tensor(a) for a in unpack(y)]
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
            if loss is None or isinstance(loss, NoLoss) or i >= len(targets):
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
                w_i = sample_weight[i] if isinstance(sample_weight, (list, tuple)) else sample_weight
                for m in group:
                    self._update_metric(m, y_i, out, w_i)
        return self.get_metrics_result()

    def get_metrics_result(self) -> dict:
        """Every metric's current result, by name (Keras 3)."""
        return {m.name: m.result() for m in self.metrics}

    @property
    def metrics(self) -> list:
        """The loss tracker and the compiled metrics, then the metrics of the layers (Keras 3)."""
        return self._all_metrics()

    def _test_step(self, x: Any, y: Any) -> None:
        touched = precast_weights(self, self._flat_layers())
        added = losses_added()
        try:
            if self._has_custom_test_step():
                self._count_metrics_on_device()
                self._keep_logs(self.test_step(self._step_data(x, y)), "test")
            else:
                self._loss_and_metrics(unpack(x), unpack(y), training=False)
        finally:
            if losses_added() != added:
                self._clear_losses()
            end_precast(touched)

    def _predict_step(self, x: Any) -> Any:
        touched = precast_weights(self, self._flat_layers())
        added = losses_added()
        try:
            if type(self).predict_step is not Trainer.predict_step:
                out = self.predict_step(self._step_data(x, None))
                outs = list(out) if isinstance(out, (list, tuple)) else [out]
            else:
                outs = self._run_forward(unpack(x), training=False, logits=[False] * len(self.output_names))
        finally:
            if losses_added() != added:
                self._clear_losses()
            end_precast(touched)
        return pack([to_float32(o.data if isinstance(o, Tensor) else o) for o in outs])

    # ----- fit / evaluate / predict (the loops: dnnbind.trainers.loops) -------------------------
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
        over batches; ``metrics`` are not weighted, ``weighted_metrics`` are (Keras 3).

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
        return loops.fit(self, x, y, batch_size, epochs, verbose, callbacks, validation_split, validation_data,
                         shuffle, class_weight, sample_weight, initial_epoch, steps_per_epoch, validation_steps,
                         validation_batch_size, validation_freq, seed)

    def evaluate(self, x: Any = None, y: Any = None, batch_size: int | None = None, verbose: Any = "auto",
                 sample_weight: Any = None, steps: int | None = None, callbacks: Sequence[Any] | None = None,
                 return_dict: bool = False):
        """Loss (and metrics) on ``x``/``y``: a float, ``[loss, *metrics]``, or a dict with ``return_dict``.

        ``x`` may be arrays (with ``y``, or a tuple ``(x, y[, sample_weight])``), a generator or a
        PyDataset, as in :meth:`fit`; ``steps`` limits the batches read (None: all of them).
        ``sample_weight`` weighs each sample's loss (Keras 3: ``sum_i w_i l_i / batch_size`` per
        batch). Empty data, and ``x`` (or float ``y``) holding NaN or inf, are refused (as ``fit``).
        """
        return loops.evaluate(self, x, y, batch_size, verbose, sample_weight, steps, callbacks, return_dict)

    def predict(self, x: Any, batch_size: int | None = None, verbose: Any = "auto", steps: int | None = None,
                callbacks: Sequence[Any] | None = None) -> Any:
        """Model outputs for ``x`` as NumPy (float32): one array, or a list for several outputs.

        ``x``: arrays, a generator or a PyDataset (batches ``x``, ``(x,)``, ``(x, y)`` or ``(x, y,
        sample_weight)``: only ``x`` is read), as in :meth:`fit`; ``steps`` limits the batches read.
        As Keras, NaN or inf in ``x`` are accepted (they give NaN outputs); zero samples give an
        empty result.
        """
        return loops.predict(self, x, batch_size, verbose, steps, callbacks)

    # ----- one batch ----------------------------------------------------------------------------
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
        class_weight = feeds.check_class_weight(self, class_weight, owner)
        if y is None:
            raise ValueError(f"{self._owner}: train_on_batch needs targets y")
        replica = self._replica_for(owner)
        xb, yb = feeds.device_batch(self, x, y, "train_on_batch", sample_weight, class_weight)
        # each rank passes its own batch (as with DDP); gradients are averaged over the ranks
        self._join_replicas(replica, always=False)
        self.reset_metrics()
        self._step("train", xb, yb)
        if replica is not None:
            replica.after_step()
        if self._loss_scale is not None:
            self._loss_scale.after_step(self.optimizer)
        return self._batch_result(return_dict)

    def test_on_batch(self, x: Any, y: Any = None, sample_weight: Any = None, return_dict: bool = False):
        """Loss (and metrics) of one batch without updating weights (the metrics are reset first, as Keras 3)."""
        self._require_compiled("test_on_batch")
        return_dict = _validate.boolean(return_dict, "return_dict", f"{self._owner}: test_on_batch")
        if y is None:
            raise ValueError(f"{self._owner}: test_on_batch needs targets y")
        xb, yb = feeds.device_batch(self, x, y, "test_on_batch", sample_weight)
        self.reset_metrics()
        self._step("test", xb, yb)
        return self._batch_result(return_dict)

    def predict_on_batch(self, x: Any) -> Any:
        """Outputs for one batch, as NumPy (a list for several outputs)."""
        xb, _ = feeds.device_batch(self, x, None, "predict_on_batch")
        outs = unpack(self._step("predict", xb))
        host = [backend.to_numpy(o) for o in outs]
        return host[0] if len(host) == 1 else host
