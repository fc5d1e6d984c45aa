"""The trainer<->model protocol, written down once.

``Trainer`` is a mixin of :class:`dnnbind.models.Model`; these ``typing.Protocol`` classes list every
attribute one side reads or calls on the other, each with its contract in one line:

* :class:`TrainedModel`: what ``dnnbind.trainers`` (``trainer.py``, ``loops.py``, ``feeds.py``,
  ``precision.py``) needs from a model. ``Model`` provides it; ``Sequential`` and ``Functional``
  override the structural half. Three members are hooks with a do-nothing default in ``Trainer``
  that the model kinds override (``_guess_input_structure``, ``_guess_output_structure``,
  ``_discard_forward``).
* :class:`TrainedLayer`: what the steps read and write on each of ``_flat_layers()`` (and on the
  model itself, which is a layer: its own weights and regularizers are loss sources too).
* :class:`GraphStepped`: what :class:`~dnnbind.trainers.step_graphs.StepGraphs` calls on the model;
  ``Trainer`` provides it.
* :class:`TrainerHooks`: the other direction, what ``dnnbind.models`` calls or reads on the trainer.

Nothing imports this module at run time: the protocols are documentation that a test keeps true
(``tests/test_trainer_protocol.py`` collects every ``self.<name>``/``model.<name>`` the rooms use
and compares the sets with these classes, and checks that the model kinds provide them). The
optimizer's and the metrics' internals the steps use (``Optimizer._apply_raw``, ``Metric._total``...)
belong to those families and are not listed here.
"""

from __future__ import annotations

from typing import Any, Callable, Protocol, Sequence

__all__ = ["TrainedLayer", "TrainedModel", "GraphStepped", "TrainerHooks"]


class TrainedLayer(Protocol):
    """A layer as the steps see it (``Layer`` provides every member)."""

    #: whether its weights are trained (part of the graph signature)
    trainable: bool
    #: its dtype policy (the graph signature holds its name; the precast groups its identity)
    dtype_policy: Any
    #: a regularizer of its output, or None (a loss source when set)
    activity_regularizer: Any
    #: its own weights (Variables, creation order): what a step updates and a graph addresses
    _weights: list
    #: ``{Variable: compute dtype}`` of the weights its forward casts, replaced (never mutated) on change
    _cast_weights: dict
    #: the step's compute-dtype copies ``{Variable: array}`` (set by the trainer before the forward), or None
    _precast: Any
    #: while True, a weight gradient in the compute dtype is left as it is (set for precast layers)
    _keep_grad_dtype: bool

    def _tracked_variables(self) -> list:
        """Variables assigned as attributes that are not in ``_weights`` (owners of trainable weights)."""

    def _effective_compute_dtype(self) -> Any:
        """What it really computes in: the policy's dtype on a GPU, float32 on NumPy (precast copies' dtype)."""

    def _is_legacy(self) -> bool:
        """dnnbind's own kind of layer: hand-written forward/backward, no ``call`` of its own (no ``add_loss``)."""


class TrainedModel(TrainedLayer, Protocol):
    """What ``dnnbind.trainers`` needs from a model (``dnnbind.models.Model`` provides it)."""

    #: the model's name (in every error message and warning)
    name: str
    #: where its weights live and its steps run (``backend.Device``)
    device: Any
    #: whether its weights exist (``feeds`` builds it from the first data otherwise)
    built: bool
    #: the output names, model order: loss/metric keys, ``<output>_loss`` logs
    output_names: list
    #: the ``add_loss`` and regularization losses, computed now (differentiable under a tape)
    losses: list
    #: every trainable weight, parameter order (what the optimizer updates)
    trainable_weights: list
    #: the same, for Keras 3's ``train_step`` (``tape.gradient(loss, trainable_variables)``)
    trainable_variables: list

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """``self(x, training=...)``: the forward of Keras 3's ``train_step``/``test_step``/``predict_step``."""

    def _flat_layers(self) -> list:
        """Every layer holding weights or state a step uses, nested models flattened, each once, model order."""

    def _memo(self, key: str, make: Callable[[], Any]) -> Any:
        """``make()`` kept until the structure version moves (the per-step lists: trainable slots, loss sources)."""

    def _input_names(self) -> list:
        """The input names, model order (keys of a dict ``x``; error messages)."""

    def _expected_input_shapes(self) -> "list | None":
        """Per input, the sample shape (no batch axis) data must have, or None before the model is built."""

    def _input_dtypes(self) -> list:
        """Per input, the NumPy dtype data is converted to (the ``Input``'s), or None (float32)."""

    def _output_shapes(self) -> list:
        """Per output, the sample shape (labels are prepared against it; an empty ``predict`` returns it)."""

    def _input_hint(self) -> str:
        """Text appended to the model's name in a shape error (Sequential: its first layer), or ``""``."""

    def _require_layers(self, what: str) -> None:
        """Raise, naming ``what`` (``"fit"``...), when the model has nothing to run (no layers, no ``call``)."""

    def _build_for(self, shapes: list) -> None:
        """Build the model for these per-input sample shapes (its weights made; captured graphs dropped)."""

    def _run_forward(self, xs: list, training: bool, logits: Sequence[bool]) -> list:
        """The forward of a built-in step on arrays ``xs`` (model order): the outputs, as tensors;
        ``logits[i]``: output ``i`` skips its final softmax (fused into the loss)."""

    def _fusable_outputs(self) -> list:
        """Per output: whether its final softmax can be skipped (produced by one layer, read by nothing else)."""

    def _own_variables(self) -> list:
        """The variables the model itself tracks (not its layers'): their regularizers are loss sources.
        (The loss-source walk also descends into nested models through their ``_direct_layers()`` and reads
        ``_own_losses`` from each holder's ``__dict__``.)"""

    def _clear_losses(self) -> None:
        """Drop the ``add_loss`` tensors of the model and its layers (at the end of every step)."""

    def _guess_input_structure(self, x: Any) -> None:
        """Hook (Trainer: nothing): before a subclassed model is built, learn its number of inputs from ``x``."""

    def _guess_output_structure(self, loss: Any) -> None:
        """Hook (Trainer: nothing): before a subclassed model is built, learn its number of outputs from the loss."""

    def _discard_forward(self) -> None:
        """Hook (Trainer: release the pending layer state): drop what a forward kept for a backward not run."""


class GraphStepped(Protocol):
    """What :class:`~dnnbind.trainers.step_graphs.StepGraphs` calls on the model (``Trainer`` provides it)."""

    #: the model's name (in the capture-failure warning)
    name: str

    def _graphs_enabled(self) -> bool:
        """Whether steps may run as CUDA graphs now (compiled, jit on, not run_eagerly, on CUDA)."""

    def _graph_signature(self) -> tuple:
        """Identities and flags whose change makes every captured graph stale (read before every step)."""

    def _host_counters(self) -> list:
        """``(object, attribute)`` of the host-side numbers a step advances in Python (a replay advances them)."""

    def _graph_refs(self) -> list:
        """The persistent objects a captured step addresses, kept alive as long as its graph."""

    def _before_launch(self, kind: str, stream: Any) -> None:
        """The host-to-device work a replay needs first (the learning rate if it changed, custom log buffers)."""

    def _eager_step(self, kind: str, x: Any, y: Any) -> Any:
        """Run one ``kind`` step eagerly on packed ``x``/``y`` (warm-up, capture, fallback); predict's outputs."""

    def _discard_forward(self) -> None:
        """Drop what a forward kept for a backward that did not run (after a failed capture)."""

    def _flat_layers(self) -> list:
        """The layers whose ``grads`` a failed capture clears."""


class TrainerHooks(Protocol):
    """What ``dnnbind.models`` calls or reads on the trainer (``Trainer`` provides it)."""

    #: whether ``compile`` ran (a subclassed model checks its outputs against the compiled losses)
    compiled: bool
    #: the compiled optimizer, or None (``Model.to`` moves its slots)
    optimizer: Any
    #: the ``LossScale`` under mixed_float16 on CUDA, or None (``Model.to`` remakes it on the new device)
    _loss_scale: Any
    #: ``"auto"``, True or False (``Model.quantize``'s calibration turns graphs off while it reads back)
    _jit_compile: Any

    @property
    def _owner(self) -> str:
        """``"<class> '<name>'"``, how every message names the model."""

    def _init_trainer(self) -> None:
        """The trainer's state, uncompiled (called once by ``Model.__init__``)."""

    def _drop_graphs(self) -> None:
        """Forget every captured step (``build``, ``to``, ``quantize``: weight arrays were replaced)."""

    def _all_metrics(self) -> list:
        """The loss tracker(s) and the compiled metrics (``Model.to`` drops their device totals)."""
