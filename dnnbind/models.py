"""``Sequential``: a stack of layers with Keras 3's compile / fit / evaluate / predict.

Training runs the layers' forward and backward by hand (no autograd): forward through every
layer, the loss returns its gradient, backward through the layers in reverse, then one fused
optimizer update. A final softmax with a ``from_logits=False`` cross-entropy is fused into
``ops.softmax_cross_entropy`` on the logits (the softmax's backward is never run).

Devices: arrays given to ``fit`` are NumPy. On CUDA a dataset that fits comfortably in device
memory is uploaded once and batched on the device (``ops.take`` with a permutation uploaded once
per epoch); a larger one is streamed, copying the next batch on a second stream while the current
step runs. No step waits for the host: loss and metrics accumulate in device scalars that are read
when the progress bar draws and at the end of an epoch.

CUDA graphs (``compile(jit_compile="auto")``, the default): on CUDA each step kind and batch shape
runs eagerly once, is captured the second time and replayed from then on, so a step costs one
graph launch of host time (see :mod:`dnnbind._step_graphs`).
"""

from __future__ import annotations

import math
import os
import sys
import warnings
from typing import Any, Iterator, Sequence

import numpy as np

from . import backend, callbacks as callbacks_module, losses as losses_module, metrics as metrics_module, ops
from . import _validate
from . import optimizers as optimizers_module
from . import saving as saving_module
from ._step_graphs import StepGraphs
from .backend import Device
from .errors import DnnbindError
from .layers.base import InputLayer, Layer, deserialize, unique_name
from .mixed_precision import global_policy
from .utils import draw_seed

__all__ = ["Sequential", "Model"]

_F32 = np.dtype(np.float32)


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


def _warn_no_graphs(model: Any) -> None:
    warnings.warn(f"Sequential '{model.name}': jit_compile=True has no effect on {model.device} (CUDA graphs "
                  "need the CUDA backend); steps run eagerly", UserWarning, stacklevel=3)


class _LossScale:
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
        finite = ops.cast(ops.all_finite(grads), _F32)
        return ops.cast(ops.subtract(self._one, finite), np.int32), finite

    def update(self, finite: Any) -> None:
        """After the (possibly skipped) update: halve the scale on a non-finite step, count finite steps."""
        factor = ops.add(ops.scale(finite, 0.5), self._half)       # 1.0 (finite) or 0.5
        ops.multiply(self.scale, factor, out=self.scale)
        ops.axpy(1.0, self._one, self.good_steps)
        ops.multiply(self.good_steps, finite, out=self.good_steps)  # reset on a non-finite step

    def maybe_grow(self) -> bool:
        """After a step: every ``growth_steps`` steps read the finite-step counter (synchronising) and
        double the scale when they were all finite. Returns whether it synchronised."""
        self._steps += 1
        if self._steps % self.growth_steps:
            return False
        if float(backend.to_numpy(self.good_steps)) >= self.growth_steps:
            ops.scale(self.scale, 2.0, out=self.scale)
            ops.fill(self.good_steps, 0.0)
        return True


class Sequential:
    """A linear stack of layers (``keras.Sequential``).

    ``Sequential([Input((28, 28, 1)), Conv2D(32, 3, activation="relu"), ...])``; then ``compile``,
    ``fit``, ``evaluate``, ``predict``. Input shapes exclude the batch axis and are channels_last
    by default.
    """

    def __init__(self, layers: Sequence[Layer] | None = None, name: str | None = None, trainable: bool = True) -> None:
        self.name = name if name is not None else unique_name("sequential")
        self._layers: list[Layer] = []
        self._input_layer: InputLayer | None = None
        self.built = False
        self.trainable = trainable
        self.optimizer = None
        self.loss = None
        self.compiled = False
        self.stop_training = False
        self.history = None
        self._device: Device | None = None
        self._metrics: list = []
        self._compile_config: dict | None = None
        self._loss_scale: _LossScale | None = None
        self._output_shape: tuple[int, ...] | None = None
        self._jit_compile: Any = "auto"
        self.run_eagerly = False
        self._step_graphs = StepGraphs()
        for layer in layers or []:
            self.add(layer)

    # ----- structure --------------------------------------------------------------------------
    @property
    def layers(self) -> list[Layer]:
        """The layers (the Input is not one, as in Keras 3)."""
        return list(self._layers)

    def add(self, layer: Layer) -> None:
        """Append a layer (an ``Input`` only as the first element)."""
        if isinstance(layer, InputLayer):
            if self._layers or self._input_layer is not None:
                raise ValueError(f"Sequential '{self.name}': an Input can only be the first element of the model")
            self._input_layer = layer
        elif isinstance(layer, Layer):
            if any(existing is layer for existing in self._layers):
                raise ValueError(f"Sequential '{self.name}': layer '{layer.name}' was already added")
            self._layers.append(layer)
        else:
            raise TypeError(f"Sequential.add expects a dnnbind layer, got {type(layer).__name__}")
        was_built = self.built
        self.built = False
        if self._declared_input_shape() is not None:
            try:
                self.build()
            except BaseException:
                # a layer that cannot be built on this model is not added (Keras 3 does the same)
                if isinstance(layer, InputLayer):
                    self._input_layer = None
                else:
                    self._layers.pop()
                self.built = was_built
                raise

    def pop(self) -> Layer:
        """Remove and return the last layer."""
        if not self._layers:
            raise IndexError(f"Sequential '{self.name}' has no layers to pop")
        layer = self._layers.pop()
        self.built = False
        if self._layers and self._declared_input_shape() is not None:
            self.build()
        return layer

    def _declared_input_shape(self) -> tuple[int, ...] | None:
        if self._input_layer is not None:
            return self._input_layer.input_shape
        if self._layers and self._layers[0]._declared_input_shape is not None:
            return self._layers[0]._declared_input_shape
        if self._layers and self._layers[0].built:
            return self._layers[0].input_shape
        return None

    @property
    def input_shape(self) -> tuple:
        shape = self._declared_input_shape()
        return None if shape is None else (None, *shape)

    @property
    def output_shape(self) -> tuple:
        if not self.built:
            raise ValueError(f"Sequential '{self.name}' is not built yet")
        return (None, *self._output_shape)

    def build(self, input_shape: Sequence[Any] | None = None) -> None:
        """Build every layer for inputs of ``input_shape`` (no batch axis; a leading None is fine)."""
        if input_shape is None:
            input_shape = self._declared_input_shape()
            if input_shape is None:
                raise ValueError(f"Sequential '{self.name}': the input shape is unknown; start the model with "
                                 "keras.Input(shape=...) or call it on data")
        if isinstance(input_shape, (list, tuple)) and input_shape and input_shape[0] is None:
            input_shape = input_shape[1:]
        input_shape = shape = _validate.shape(input_shape, "input_shape", f"Sequential '{self.name}': build")
        self._drop_graphs()  # (re)building may create new weight arrays
        dev = self.device
        for layer in self._layers:
            if layer._device is None:
                layer._device = dev
            elif layer._device != dev:
                layer.to(dev)
            layer._ensure_built(shape)
            shape = tuple(layer.output_shape)
        self._built_input_shape = input_shape
        self._output_shape = shape
        self.built = True

    # ----- device -----------------------------------------------------------------------------
    @property
    def device(self) -> Device:
        if self._device is None:
            self._device = backend.default_device()
        return self._device

    def to(self, device: "str | Device") -> "Sequential":
        """Move weights and optimizer state to ``device`` (``"cpu"``, ``"cuda"``, ``"cuda:1"``)."""
        dev = backend.resolve_device(device)
        self._drop_graphs()  # they address the old device's buffers
        for layer in self._layers:
            layer.to(dev)
        if self.optimizer is not None:
            self.optimizer.to(dev)
        for m in self._all_metrics():
            m._total = None
        if self._loss_scale is not None:
            self._loss_scale = _LossScale(dev)
        self._device = dev
        return self

    # ----- weights ----------------------------------------------------------------------------
    @property
    def weights(self):
        return [w for layer in self._layers for w in layer._weights]

    @property
    def trainable_weights(self):
        return [w for layer in self._layers for w in layer.trainable_weights] if self.trainable else []

    @property
    def non_trainable_weights(self):
        if not self.trainable:
            return self.weights
        return [w for layer in self._layers for w in layer.non_trainable_weights]

    def get_weights(self) -> list[np.ndarray]:
        """Every layer's weights in Keras layouts, layer by layer."""
        return [arr for layer in self._layers for arr in layer.get_weights()]

    def set_weights(self, weights: Sequence[Any]) -> None:
        """Set every layer's weights (the list :meth:`get_weights` returns). The count and every array's
        shape and dtype are checked before the first is written, so a failed call changes no weight."""
        self._require_built("set_weights")
        weights = list(weights)
        targets = self.weights
        if len(weights) != len(targets):
            raise ValueError(f"Sequential '{self.name}': set_weights expects {len(targets)} arrays, got {len(weights)} "
                             "(one per array of get_weights)")
        arrays = [w.checked(arr) for w, arr in zip(targets, weights)]
        for w, arr in zip(targets, arrays):
            w.assign(arr)

    def count_params(self) -> int:
        self._require_built("count_params")
        return sum(layer.count_params() for layer in self._layers)

    def _require_built(self, what: str) -> None:
        if not self.built:
            if self._declared_input_shape() is not None:
                self.build()
            else:
                raise ValueError(f"Sequential '{self.name}': {what} needs a built model; give it an Input "
                                 "(keras.Input(shape=...)) or call fit/predict on data first")

    # ----- summary ----------------------------------------------------------------------------
    def summary(self, line_length: int | None = None, positions: Any = None, print_fn=None,
                expand_nested: bool = False, show_trainable: bool = False) -> None:
        """Print a Keras-style table: ``Layer (type) | Output Shape | Param #`` and the totals."""
        names = [f"{layer.name} ({type(layer).__name__})" for layer in self._layers]
        shapes = [str((None, *layer.output_shape)).replace(",)", ")") if layer.built else "(unbuilt)"
                  for layer in self._layers]
        c1 = max([29, *(len(n) + 2 for n in names)])
        c2 = max([26, *(len(s) + 2 for s in shapes)])
        width = max(line_length or 65, c1 + c2 + 12)
        cols = [c1, c1 + c2, width]
        out = print_fn or print

        def row(fields):
            line = ""
            for i, field in enumerate(fields):
                line = (line + " " + str(field))[: cols[i]].ljust(cols[i])
            return line.rstrip()

        out(f'Model: "{self.name}"')
        out("_" * width)
        out(row(["Layer (type)", "Output Shape", "Param #"]))
        out("=" * width)
        for i, layer in enumerate(self._layers):
            out(row([names[i], shapes[i], f"{layer.count_params():,}"]))
            if i != len(self._layers) - 1:
                out("")
        out("=" * width)
        trainable = sum(int(np.prod(w.shape)) for w in self.trainable_weights)
        total = sum(int(np.prod(w.shape)) for w in self.weights)
        nbytes = lambda ws: sum(int(np.prod(w.shape)) * w.value.dtype.itemsize for w in ws)  # noqa: E731
        human = _validate.human_bytes
        out(f"Total params: {total:,} ({human(nbytes(self.weights))})")
        out(f"Trainable params: {trainable:,} ({human(nbytes(self.trainable_weights))})")
        out(f"Non-trainable params: {total - trainable:,} ({human(nbytes(self.non_trainable_weights))})")
        out("_" * width)

    # ----- compile ----------------------------------------------------------------------------
    def compile(self, optimizer: Any = "rmsprop", loss: Any = None, metrics: Sequence[Any] | None = None,
                loss_weights: Any = None, weighted_metrics: Any = None, run_eagerly: bool = False,
                steps_per_execution: int = 1, jit_compile: Any = "auto", auto_scale_loss: bool = True) -> None:
        """Choose the optimizer, the loss and the metrics (names or objects).

        ``jit_compile`` (Keras's argument): on CUDA, ``"auto"`` (default) or ``True`` run the train,
        test and predict steps as CUDA graphs (the first step of each batch shape runs eagerly, the
        second is captured, later ones replay it); ``False`` runs every step eagerly. On the NumPy
        backend steps always run eagerly (``True`` warns). ``run_eagerly=True`` also means eager.
        ``steps_per_execution`` is accepted and has no effect: a replayed CUDA graph already costs
        one launch per step.

        All or nothing: every argument is resolved first, and a failure (an unknown metric after a
        good optimizer...) leaves the model as it was, compiled or not.
        """
        owner = f"Sequential '{self.name}': compile"
        if loss is None:
            raise ValueError(f"{owner} needs a loss, e.g. loss='sparse_categorical_crossentropy'")
        jit_compile = _check_jit_compile(jit_compile, "compile")
        run_eagerly = _validate.boolean(run_eagerly, "run_eagerly", owner)
        _validate.positive_int(steps_per_execution, "steps_per_execution", owner)
        auto_scale_loss = _validate.boolean(auto_scale_loss, "auto_scale_loss", owner)
        if loss_weights is not None or weighted_metrics is not None:
            raise NotImplementedError("compile: loss_weights and weighted_metrics are not supported")
        if isinstance(metrics, (str, metrics_module.Metric)):
            metrics = [metrics]
        if metrics is not None and not isinstance(metrics, (list, tuple)):
            raise _validate.ArgumentTypeError(f"{owner}: metrics must be a list of metric names or Metric "
                                              f"instances, got {type(metrics).__name__}")
        optimizer = optimizers_module.get(optimizer)
        loss = losses_module.get(loss)
        metric_objects = [metrics_module.get(m) for m in (metrics or [])]
        names = [m.name for m in metric_objects]
        if len(set(names)) != len(names):
            raise ValueError(f"{owner}: metric names must be unique, got {names}")
        compile_config = {
            "optimizer": optimizers_module.serialize(optimizer),
            "loss": losses_module.serialize(loss),
            "metrics": [m if isinstance(m, str) else metrics_module.serialize(m) for m in (metrics or [])],
        }
        policy = global_policy()
        loss_scale = _LossScale(self.device) if (auto_scale_loss and policy.needs_loss_scaling
                                                 and self.device.is_cuda) else None
        if run_eagerly and jit_compile is True:
            warnings.warn(f"Sequential '{self.name}': run_eagerly=True and jit_compile=True cannot both hold; "
                          "disabling jit_compile (as Keras does)", UserWarning, stacklevel=2)
            jit_compile = False
        # everything resolved: from here on nothing raises
        self._drop_graphs()  # new optimizer, loss, metrics and loss scale: every graph is stale
        self.optimizer, self.loss, self._metrics = optimizer, loss, metric_objects
        self._loss_tracker = metrics_module.Mean(name="loss")
        self._loss_scale = loss_scale
        self._compile_config = compile_config
        self.run_eagerly = run_eagerly
        self._jit_compile = jit_compile
        self._step_graphs._warned.clear()
        if jit_compile is True and not self.device.is_cuda:
            _warn_no_graphs(self)
        self.compiled = True

    # ----- CUDA graphs ------------------------------------------------------------------------
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
            _warn_no_graphs(self)

    def _graphs_enabled(self) -> bool:
        """Whether steps may run as CUDA graphs now (compiled, jit on, not run_eagerly, on CUDA)."""
        return (self._jit_compile is not False and not self.run_eagerly and self.compiled
                and self._step_graphs.backend.available(self.device))

    def _drop_graphs(self) -> None:
        """Forget every captured step (after the work using them finished)."""
        graphs = getattr(self, "_step_graphs", None)
        if graphs is not None:
            graphs.clear()

    def _graph_signature(self) -> tuple:
        """Everything whose change makes captured graphs stale (read before every graph step, so it is
        kept to identities and flags): trainable flags and dtype policies, the weight arrays, the
        optimizer and its state version (bumped whenever its slots are reallocated), the loss scale."""
        opt = self.optimizer
        return (self.trainable, id(opt), getattr(opt, "_state_version", 0), id(self._loss_scale),
                tuple([(layer.trainable, layer.dtype_policy.name) for layer in self._layers]),
                tuple([id(w.value) for layer in self._layers for w in layer._weights]))

    def _host_counters(self) -> list[tuple[Any, str]]:
        """``(object, attribute)`` of the host-side numbers a step advances in Python: each metric's
        sample count and the optimizer's update count (a graph replay advances them by hand)."""
        pairs = []
        for m in self._all_metrics():
            pairs.append((m, "_count"))
            impl = getattr(m, "_impl", None)  # Accuracy counts in the concrete metric it resolved to
            if impl is not None:
                pairs.append((impl, "_count"))
        if self.optimizer is not None:
            # the update count's host estimate (``iterations`` itself may read the device)
            pairs += [(self.optimizer, "_iterations"), (self.optimizer, "_unconfirmed")]
        return pairs

    def _graph_refs(self) -> list:
        """The persistent objects a captured step addresses, kept alive as long as its graph."""
        refs: list = [self.optimizer, self._loss_scale, *self._all_metrics()]
        for layer in self._layers:
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

    def _eager_step(self, kind: str, x: Any, y: Any) -> Any:
        if kind == "train":
            self._train_step(x, y)
            return None
        if kind == "test":
            self._test_step(x, y)
            return None
        return self._predict_step(x)

    def _step(self, kind: str, x: Any, y: Any = None, graph: bool = True) -> Any:
        """One ``kind`` step: through the graph cache when graphs are on (and ``graph``), else eagerly."""
        if graph and self._graphs_enabled():
            return self._step_graphs.run(self, kind, x, y)
        return self._eager_step(kind, x, y)

    def _static_inputs(self, kind: str):
        """For :meth:`_batches`: ``(n, x_dev, y_dev) -> (static_x, static_y) | None``."""
        graphs = self._step_graphs

        def into(n: int, x_dev: Any, y_dev: Any):
            return graphs.static_inputs(self, kind, (n, *x_dev.shape[1:]), x_dev.dtype,
                                        None if y_dev is None else (n, *y_dev.shape[1:]),
                                        None if y_dev is None else y_dev.dtype)

        return into if self._graphs_enabled() else None

    @property
    def metrics_names(self) -> list[str]:
        return ["loss", *[m.name for m in self._metrics]]

    def _all_metrics(self) -> list:
        tracker = getattr(self, "_loss_tracker", None)
        return ([tracker] if tracker is not None else []) + list(self._metrics)

    def reset_metrics(self) -> None:
        for m in self._all_metrics():
            m.reset_state()

    def _require_compiled(self, what: str) -> None:
        if not self.compiled:
            raise DnnbindError(f"Sequential '{self.name}': you must call compile(optimizer, loss, metrics) "
                               f"before {what}()")

    def _require_layers(self, what: str) -> None:
        if not self._layers:
            raise ValueError(f"Sequential '{self.name}': {what} needs a model with at least one layer; add "
                             "layers first (Sequential([Input(...), Dense(...)]) or model.add(...))")

    # ----- data checks ------------------------------------------------------------------------
    def _check_x(self, x: Any, what: str, *, finite: bool = True, allow_empty: bool = False) -> np.ndarray:
        """``x`` as a float32 host array of the model's input shape (building the model from it if
        needed). ``finite``: refuse NaN/inf (training and evaluation; predict accepts them, as Keras);
        ``allow_empty``: accept zero samples (predict returns an empty result)."""
        self._require_layers(what)
        if backend.is_device_array(x):
            raise TypeError(f"Sequential '{self.name}': {what} takes NumPy arrays; got a DeviceArray "
                            "(use predict_on_batch/train_on_batch for device data)")
        if isinstance(x, (list, tuple)) and x and hasattr(x[0], "shape") and np.ndim(x[0]) > 0 and len(x) == 1:
            x = x[0]
        arr = np.asarray(x)
        if arr.dtype.kind not in "fiub":
            raise TypeError(f"Sequential '{self.name}': {what} expects numeric input data (floats or ints), got "
                            f"dtype {arr.dtype}")
        if arr.ndim < 1:
            raise ValueError(f"Sequential '{self.name}': {what} expects a batch of samples, got a scalar")
        if len(arr) == 0 and not allow_empty:
            raise ValueError(f"Sequential '{self.name}': {what} got no samples (x has shape {tuple(arr.shape)})")
        if arr.dtype != _F32:
            arr = arr.astype(_F32)  # ints/bools/float64 are cast to float32, as Keras does
        sample = tuple(arr.shape[1:])
        expected = self._built_input_shape if self.built else self._declared_input_shape()
        if expected is not None and sample != tuple(expected):
            first = self._layers[0] if self._layers else None
            who = f" (first layer '{first.name}' ({type(first).__name__}))" if first else ""
            raise ValueError(
                f"Sequential '{self.name}'{who}: {what} expects input of shape (batch, "
                f"{', '.join(map(str, expected))}), "
                f"got {tuple(arr.shape)}"
            )
        if not self.built:
            self.build(sample)
        if finite:
            # after the cast: float64 values beyond float32's range have become inf
            harm = "the loss and the weights" if what.startswith(("fit", "train")) else "the loss"
            _validate.finite_array(arr, "x", f"Sequential '{self.name}': {what}",
                                   hint=f"they would make {harm} NaN; clean or impute the data first (predict "
                                        "accepts them)")
        return arr

    def _check_xy(self, x: Any, y: Any, what: str) -> tuple[np.ndarray, np.ndarray]:
        """``(x, y)`` checked for training or evaluation: finite, same length, labels in the loss's form."""
        if y is None:
            raise ValueError(f"Sequential '{self.name}': {what} needs targets y")
        x = self._check_x(x, what)
        y = np.asarray(y)
        if y.ndim < 1 or len(y) != len(x):
            raise ValueError(f"Sequential '{self.name}': {what} got {len(x)} input samples but "
                             f"{len(y) if y.ndim else 'a scalar'} targets; x and y must have the same length")
        y = self.loss.prepare_labels(y, self._output_shape, owner=f"Sequential '{self.name}': ")
        _validate.finite_array(y, "y", f"Sequential '{self.name}': {what}", hint="clean the targets first")
        return x, y

    # ----- the steps --------------------------------------------------------------------------
    def _fused(self) -> bool:
        last = self._layers[-1]
        return (self.loss is not None and self.loss.fuses_softmax and not getattr(self.loss, "from_logits", False)
                and last.has_final_softmax)

    def _forward(self, x: Any, training: bool, logits: bool = False) -> Any:
        for layer in self._layers[:-1]:
            x = layer.forward(x, training=training)
        last = self._layers[-1]
        return last.forward_logits(x, training=training) if logits else last.forward(x, training=training)

    def _backward(self, dy: Any) -> None:
        for i in range(len(self._layers) - 1, -1, -1):
            dy = self._layers[i].backward(dy, need_dx=i > 0)

    def _params_and_grads(self) -> tuple[list, list]:
        params, grads = [], []
        if not self.trainable:
            return params, grads
        for layer in self._layers:
            for w in layer.trainable_weights:
                params.append(w.value)
                grads.append(layer.grads[w.name])
        return params, grads

    def _loss_and_metrics(self, x: Any, y: Any, training: bool) -> Any:
        """Forward, loss (accumulated), metrics (accumulated); returns the output gradient."""
        fused = self._fused()
        out = self._forward(x, training=training, logits=fused)
        out32 = out if out.dtype == _F32 or out.dtype == np.float64 else ops.cast(out, _F32)
        grad_scale = self._loss_scale.scale if (training and self._loss_scale is not None) else 1.0
        loss, dout = self.loss.compute(out32, y, logits=fused, grad_scale=grad_scale)
        self._loss_tracker.update_state(loss, int(x.shape[0]))
        for m in self._metrics:
            m.update_state(y, out32)
        if dout.dtype != out.dtype:
            dout = ops.cast(dout, out.dtype)
        return dout

    def _train_step(self, x: Any, y: Any) -> None:
        """One training step on device/host arrays ``x``, ``y`` (prepared labels). Never waits for the host.

        Everything it touches is persistent (weights, optimizer slots, lr/step scalars, metric
        accumulators), so the step can be captured into a CUDA graph and replayed.
        """
        dout = self._loss_and_metrics(x, y, training=True)
        self._backward(dout)
        params, grads = self._params_and_grads()
        # drop the gradient references: nothing allocated inside the step outlives it (graph capture)
        for layer in self._layers:
            layer.grads = {}
        if not params:
            return
        if self._loss_scale is not None:
            skip, finite = self._loss_scale.check(grads)
            # the update divides by this step's scale, so the scale changes only afterwards
            self.optimizer.apply(params, grads, grad_scale=self._loss_scale.scale, skip=skip)
            self._loss_scale.update(finite)
        else:
            self.optimizer.apply(params, grads)

    def _after_loss_scaled_step(self) -> None:
        """The loss scale's growth check; when it synchronised, the optimizer's update count is
        confirmed from the device too (it skips overflowed steps there), at no extra wait."""
        if self._loss_scale.maybe_grow() and self.optimizer is not None:
            self.optimizer._confirm_iterations()

    def _test_step(self, x: Any, y: Any) -> None:
        fused = self._fused()
        out = self._forward(x, training=False, logits=fused)
        out32 = out if out.dtype in (_F32, np.dtype(np.float64)) else ops.cast(out, _F32)
        loss, _ = self.loss.compute(out32, y, logits=fused)
        self._loss_tracker.update_state(loss, int(x.shape[0]))
        for m in self._metrics:
            m.update_state(y, out32)

    def _predict_step(self, x: Any) -> Any:
        out = self._forward(x, training=False)
        return out if out.dtype in (_F32, np.dtype(np.float64)) else ops.cast(out, _F32)

    def _logs(self, prefix: str = "") -> dict[str, float]:
        return {prefix + m.name: m.result() for m in self._all_metrics()}

    def _lazy_logs(self) -> callbacks_module.LazyLogs:
        return callbacks_module.LazyLogs({m.name: m.result for m in self._all_metrics()})

    # ----- batching ---------------------------------------------------------------------------
    def _batches(self, x: np.ndarray, y: np.ndarray | None, batch_size: int, shuffle: bool,
                 rng: np.random.Generator, device_data: dict | None,
                 into: Any = None) -> Iterator[tuple[Any, Any]]:
        """Batches ``(x, y)``. ``into(n, x_dev, y_dev)`` may name static buffers (a graph step's
        inputs) for a device-resident shuffled batch of ``n`` rows: the rows are gathered straight
        into them, saving an allocation and a copy per step."""
        n = len(x)
        order = rng.permutation(n) if shuffle else None
        dev = self.device
        if not dev.is_cuda:
            for start in range(0, n, batch_size):
                if order is None:
                    sl = slice(start, start + batch_size)
                    yield x[sl], (None if y is None else y[sl])
                else:
                    idx = order[start:start + batch_size]
                    yield x[idx], (None if y is None else y[idx])
            return
        if device_data is not None:
            x_dev, y_dev = device_data["x"], device_data["y"]
            # one upload of the permutation per epoch; batches are gathered on the device
            order_dev = None if order is None else backend.asarray(order.astype(np.int64), device=dev)
            for start in range(0, n, batch_size):
                stop = min(start + batch_size, n)
                if order_dev is None:
                    yield x_dev[start:stop], (None if y_dev is None else y_dev[start:stop])
                else:
                    idx = order_dev[start:stop]
                    dst = into(stop - start, x_dev, y_dev) if into is not None else None
                    if dst is not None:
                        yield (ops.take(x_dev, idx, out=dst[0]),
                               None if y_dev is None else ops.take(y_dev, idx, out=dst[1]))
                    else:
                        yield ops.take(x_dev, idx), (None if y_dev is None else ops.take(y_dev, idx))
            return
        yield from self._streamed_batches(x, y, batch_size, order)

    def _streamed_batches(self, x, y, batch_size, order) -> Iterator[tuple[Any, Any]]:
        """Batches copied on a side stream: batch k+1's copy overlaps step k."""
        from . import cuda

        main = cuda.current_stream()
        side = cuda.Stream()
        n = len(x)
        starts = list(range(0, n, batch_size))

        def upload(start):
            sel = slice(start, start + batch_size) if order is None else order[start:start + batch_size]
            hx = x[sel]
            hy = None if y is None else y[sel]
            # allocate on the main stream (so frees are ordered after the steps that use the data),
            # copy on the side stream once the allocation is ready
            bx = cuda.empty(hx.shape, hx.dtype, stream=main)
            by = None if hy is None else cuda.empty(hy.shape, hy.dtype, stream=main)
            side.wait_stream(main)
            bx.copy_from_host(hx, stream=side)
            if by is not None:
                by.copy_from_host(hy, stream=side)
            return bx, by, side.record()

        pending = upload(starts[0]) if starts else None
        for k in range(len(starts)):
            bx, by, ready = pending
            main.wait_event(ready)
            if k + 1 < len(starts):
                pending = upload(starts[k + 1])
            yield bx, by

    def _device_dataset(self, x: np.ndarray, y: np.ndarray | None) -> dict | None:
        """Upload the whole dataset when it uses under half the free device memory (else None: stream)."""
        dev = self.device
        if not dev.is_cuda:
            return None
        from . import cuda

        free, _ = cuda.memory_info(dev.index)
        nbytes = x.nbytes + (0 if y is None else y.nbytes)
        if nbytes >= 0.5 * free:
            return None
        return {"x": backend.asarray(x, device=dev), "y": None if y is None else backend.asarray(y, device=dev)}

    def _to_device_batch(self, x: Any, y: Any = None):
        dev = self.device
        xb = backend.asarray(x, device=dev) if dev.is_cuda else x
        yb = None if y is None else (backend.asarray(y, device=dev) if dev.is_cuda else y)
        return xb, yb

    # ----- fit / evaluate / predict -----------------------------------------------------------
    def fit(self, x: Any = None, y: Any = None, batch_size: int | None = None, epochs: int = 1,
            verbose: Any = "auto", callbacks: Sequence[Any] | None = None, validation_split: float = 0.0,
            validation_data: Any = None, shuffle: bool = True, class_weight: Any = None, sample_weight: Any = None,
            initial_epoch: int = 0, steps_per_epoch: int | None = None, validation_steps: int | None = None,
            validation_batch_size: int | None = None, validation_freq: int = 1, seed: int | None = None):
        """Train for ``epochs`` epochs on NumPy ``x``/``y``; returns a :class:`~dnnbind.callbacks.History`.

        ``validation_split`` holds out the *last* fraction of the samples (before shuffling), as Keras.
        ``shuffle`` reorders the training samples every epoch from a generator seeded by ``seed``, or
        when None by a seed drawn from dnnbind's seed generator (:func:`dnnbind.utils.set_random_seed`).
        ``epochs`` is the index of the last epoch (training runs epochs ``initial_epoch .. epochs - 1``).

        Every argument is checked before anything runs; ``x`` (and float ``y``) holding NaN or inf
        is refused with the count and the first bad sample.
        """
        owner = f"Sequential '{self.name}': fit"
        self._require_compiled("fit")
        self._require_layers("fit")
        batch_size = _validate.optional_positive_int(batch_size, "batch_size", owner, default=32)
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
        _validate.optional_positive_int(steps_per_epoch, "steps_per_epoch", owner)
        _validate.optional_positive_int(validation_steps, "validation_steps", owner)
        validation_batch_size = _validate.optional_positive_int(validation_batch_size, "validation_batch_size",
                                                                owner)
        validation_freq = _validate.positive_int(validation_freq, "validation_freq", owner)
        if seed is not None:
            _validate.non_negative_int(seed, "seed", owner)
        if class_weight is not None or sample_weight is not None:
            raise NotImplementedError("fit: class_weight and sample_weight are not supported")
        if steps_per_epoch is not None or validation_steps is not None:
            raise NotImplementedError("fit: steps_per_epoch and validation_steps are not supported (arrays are "
                                      "consumed whole)")
        if validation_data is not None:
            if not isinstance(validation_data, (tuple, list)) or len(validation_data) not in (2, 3):
                got = (f"a {type(validation_data).__name__} of {len(validation_data)}"
                       if isinstance(validation_data, (tuple, list)) else type(validation_data).__name__)
                raise ValueError(f"{owner}: validation_data must be a tuple (x_val, y_val), got {got}")
            if len(validation_data) == 3 and validation_data[2] is not None:
                raise NotImplementedError("fit: validation sample weights (a third element of validation_data) "
                                          "are not supported")
        x, y = self._check_xy(x, y, "fit")
        val = None
        if validation_data is not None:
            val = self._check_xy(validation_data[0], validation_data[1], "fit (validation_data)")
        elif validation_split:
            split = int(len(x) * (1.0 - validation_split))
            if split == 0 or split == len(x):
                raise ValueError(f"{owner}: validation_split={validation_split} leaves no training or no validation "
                                 f"samples out of {len(x)}")
            val = (x[split:], y[split:])
            x, y = x[:split], y[:split]

        steps = math.ceil(len(x) / batch_size)
        history = callbacks_module.History()
        if verbose and not any(isinstance(c, callbacks_module.ProgbarLogger) for c in cb_list):
            cb_list.append(callbacks_module.ProgbarLogger(verbose))
        cbs = callbacks_module.CallbackList([*cb_list, history], model=self,
                                            params={"verbose": verbose, "epochs": epochs, "steps": steps})
        # History must record what the callbacks add (learning_rate) before the bar prints it
        progbars = [c for c in cbs.callbacks if isinstance(c, callbacks_module.ProgbarLogger)]
        cbs.callbacks = [c for c in cbs.callbacks if c not in progbars] + progbars
        self.history = history
        self.stop_training = False
        # seed=None: one seed per fit call from dnnbind's seed generator (utils.set_random_seed fixes it)
        rng = np.random.default_rng(draw_seed() if seed is None else seed)
        device_data = self._device_dataset(x, y)
        val_device = self._device_dataset(*val) if val is not None else None

        cbs.on_train_begin()
        for epoch in range(initial_epoch, epochs):
            self.reset_metrics()
            cbs.on_epoch_begin(epoch)
            batches = self._batches(x, y, batch_size, shuffle, rng, device_data, self._static_inputs("train"))
            for step, (xb, yb) in enumerate(batches):
                cbs.on_train_batch_begin(step)
                # the last, smaller batch of an epoch runs eagerly rather than holding a graph of its own
                self._step("train", xb, yb, graph=int(xb.shape[0]) == batch_size)
                if self._loss_scale is not None:
                    self._after_loss_scaled_step()
                cbs.on_train_batch_end(step, self._lazy_logs())
                if self.stop_training:
                    break
            logs = self._logs()
            if not math.isfinite(logs["loss"]):
                warnings.warn(f"Sequential '{self.name}': epoch {epoch + 1}: the loss is {logs['loss']} "
                              "(NaN or inf); lower the learning rate or check the data "
                              "(callbacks.TerminateOnNaN stops training on it)", RuntimeWarning, stacklevel=2)
            if val is not None and (epoch + 1) % validation_freq == 0:
                vbs = validation_batch_size or batch_size
                self._run_test(val[0], val[1], vbs, val_device)
                logs.update(self._logs(prefix="val_"))
            cbs.on_epoch_end(epoch, logs)
            if self.stop_training:
                break
        cbs.on_train_end()
        return history

    def _run_test(self, x, y, batch_size, device_data=None, cbs=None) -> None:
        self.reset_metrics()
        for step, (xb, yb) in enumerate(self._batches(x, y, batch_size, False, np.random.default_rng(0),
                                                      device_data)):
            if cbs is not None:
                cbs.on_test_batch_begin(step)
            self._step("test", xb, yb, graph=int(xb.shape[0]) == batch_size)
            if cbs is not None:
                cbs.on_test_batch_end(step, self._lazy_logs())

    def evaluate(self, x: Any = None, y: Any = None, batch_size: int | None = None, verbose: Any = "auto",
                 sample_weight: Any = None, steps: int | None = None, callbacks: Sequence[Any] | None = None,
                 return_dict: bool = False):
        """Loss (and metrics) on ``x``/``y``: a float, ``[loss, *metrics]``, or a dict with ``return_dict``.

        Empty data, and ``x`` (or float ``y``) holding NaN or inf, are refused (as ``fit``).
        """
        owner = f"Sequential '{self.name}': evaluate"
        self._require_compiled("evaluate")
        self._require_layers("evaluate")
        batch_size = _validate.optional_positive_int(batch_size, "batch_size", owner, default=32)
        verbose = _resolve_verbose(verbose, owner)
        _validate.optional_positive_int(steps, "steps", owner)
        cb_list = _validate.instances(callbacks, callbacks_module.Callback, "callbacks", owner)
        return_dict = _validate.boolean(return_dict, "return_dict", owner)
        if sample_weight is not None:
            raise NotImplementedError("evaluate: sample_weight is not supported")
        if steps is not None:
            raise NotImplementedError("evaluate: steps is not supported (arrays are consumed whole)")
        x, y = self._check_xy(x, y, "evaluate")
        cbs = callbacks_module.CallbackList(cb_list, model=self,
                                            params={"verbose": verbose, "steps": math.ceil(len(x) / batch_size)})
        cbs.on_test_begin()
        bar = callbacks_module.Progbar(math.ceil(len(x) / batch_size), verbose=verbose)
        self._run_test(x, y, batch_size, self._device_dataset(x, y), cbs)
        logs = self._logs()
        bar.update(bar.target, logs)
        cbs.on_test_end(logs)
        if return_dict:
            return logs
        values = [logs[name] for name in self.metrics_names]
        return values[0] if len(values) == 1 else values

    def predict(self, x: Any, batch_size: int | None = None, verbose: Any = "auto", steps: int | None = None,
                callbacks: Sequence[Any] | None = None) -> np.ndarray:
        """Model outputs for ``x`` as a NumPy array (float32).

        As Keras, NaN or inf in ``x`` are accepted (they give NaN outputs); zero samples give an
        empty result.
        """
        owner = f"Sequential '{self.name}': predict"
        self._require_layers("predict")
        batch_size = _validate.optional_positive_int(batch_size, "batch_size", owner, default=32)
        verbose = _resolve_verbose(verbose, owner)
        _validate.optional_positive_int(steps, "steps", owner)
        cb_list = _validate.instances(callbacks, callbacks_module.Callback, "callbacks", owner)
        if steps is not None:
            raise NotImplementedError("predict: steps is not supported (arrays are consumed whole)")
        x = self._check_x(x, "predict", finite=False, allow_empty=True)
        cbs = callbacks_module.CallbackList(cb_list, model=self)
        cbs.on_predict_begin()
        bar = callbacks_module.Progbar(math.ceil(len(x) / batch_size), verbose=verbose) if verbose else None
        outputs = []
        for step, (xb, _) in enumerate(self._batches(x, None, batch_size, False, np.random.default_rng(0),
                                                     self._device_dataset(x, None))):
            cbs.on_predict_batch_begin(step)
            outputs.append(self._step("predict", xb, graph=int(xb.shape[0]) == batch_size))
            cbs.on_predict_batch_end(step, {})
        # read back after everything is queued, so the device never idles waiting for the host
        host = [backend.to_numpy(o) for o in outputs]
        result = np.concatenate(host, axis=0) if host else np.zeros((0, *self._output_shape), _F32)
        if bar is not None:
            bar.update(len(outputs), {})
        cbs.on_predict_end()
        return result

    def __call__(self, x: Any, training: bool = False) -> Any:
        """Eager forward on a batch (NumPy in, NumPy out; DeviceArray in, DeviceArray out)."""
        if training is not None:  # None: inference, as Keras
            training = _validate.boolean(training, "training", f"Sequential '{self.name}': __call__")
        if backend.is_device_array(x):
            x, _ = self._device_batch(x, None, "__call__")
            return self._forward(x, training=training)
        return self.predict_on_batch(x)

    def _batch_result(self, return_dict: bool):
        if return_dict:
            # lazy: each value is read from the device only when looked up
            return self._lazy_logs()
        values = [m.result() for m in self._all_metrics()]
        return values[0] if len(values) == 1 else values

    def _device_batch(self, x: Any, y: Any, what: str):
        """Accept DeviceArrays (already on this model's device) as they are: only shapes are checked,
        labels must already be in the loss's form (int32 class indices or float rows)."""
        if not backend.is_device_array(x):
            if y is None:  # predicting: NaN/inf pass, as in predict
                return self._to_device_batch(self._check_x(x, what, finite=False))[0], None
            return self._to_device_batch(*self._check_xy(x, y, what))
        self._require_layers(what)
        if x.ndim < 1 or int(x.shape[0]) == 0:
            raise ValueError(f"Sequential '{self.name}': {what} got no samples (x has shape {tuple(x.shape)})")
        if backend.device_of(x) != self.device:
            raise ValueError(f"Sequential '{self.name}': {what} got data on {backend.device_of(x)} but the model "
                             f"is on {self.device}; move one of them (model.to(...) or backend.asarray)")
        if not self.built:
            self.build(tuple(x.shape[1:]))
        if tuple(x.shape[1:]) != tuple(self._built_input_shape):
            raise ValueError(f"Sequential '{self.name}' expects input of shape (batch, "
                             f"{', '.join(map(str, self._built_input_shape))}), got {tuple(x.shape)}")
        if x.dtype.kind != "f":
            x = ops.cast(x, _F32)
        if y is not None:
            if not backend.is_device_array(y):
                y = self.loss.prepare_labels(np.asarray(y), self._output_shape, owner=f"Sequential '{self.name}': ")
                _validate.finite_array(y, "y", f"Sequential '{self.name}': {what}", hint="clean the targets first")
                y = backend.asarray(y, device=self.device)
            elif int(y.shape[0]) != int(x.shape[0]):
                raise ValueError(f"Sequential '{self.name}': {what} got {x.shape[0]} input samples but "
                                 f"{y.shape[0]} targets")
        return x, y

    def train_on_batch(self, x: Any, y: Any = None, sample_weight: Any = None, class_weight: Any = None,
                       return_dict: bool = False):
        """One update on one batch (NumPy, or DeviceArrays on the model's device).

        As Keras 3, the returned loss/metrics are running averages since the last
        :meth:`reset_metrics` (or ``fit``/``evaluate``); ``return_dict=True`` returns a lazy mapping
        whose values are read from the device only when looked up (no per-step synchronisation).
        """
        self._require_compiled("train_on_batch")
        return_dict = _validate.boolean(return_dict, "return_dict", f"Sequential '{self.name}': train_on_batch")
        if sample_weight is not None or class_weight is not None:
            raise NotImplementedError("train_on_batch: sample_weight and class_weight are not supported")
        if y is None:
            raise ValueError(f"Sequential '{self.name}': train_on_batch needs targets y")
        xb, yb = self._device_batch(x, y, "train_on_batch")
        self._step("train", xb, yb)
        if self._loss_scale is not None:
            self._after_loss_scaled_step()
        return self._batch_result(return_dict)

    def test_on_batch(self, x: Any, y: Any = None, sample_weight: Any = None, return_dict: bool = False):
        """Loss (and metrics) of one batch without updating weights (running averages, as Keras 3)."""
        self._require_compiled("test_on_batch")
        return_dict = _validate.boolean(return_dict, "return_dict", f"Sequential '{self.name}': test_on_batch")
        if sample_weight is not None:
            raise NotImplementedError("test_on_batch: sample_weight is not supported")
        if y is None:
            raise ValueError(f"Sequential '{self.name}': test_on_batch needs targets y")
        xb, yb = self._device_batch(x, y, "test_on_batch")
        self._step("test", xb, yb)
        return self._batch_result(return_dict)

    def predict_on_batch(self, x: Any) -> np.ndarray:
        """Outputs for one batch, as NumPy."""
        xb, _ = self._device_batch(x, None, "predict_on_batch")
        return backend.to_numpy(self._step("predict", xb))

    # ----- config and saving ------------------------------------------------------------------
    def get_config(self) -> dict:
        layers = []
        if self._input_layer is not None:
            layers.append({"class_name": "InputLayer", "config": self._input_layer.get_config()})
        layers += [{"class_name": type(layer).__name__, "config": layer.get_config()} for layer in self._layers]
        config = {"name": self.name, "trainable": self.trainable, "layers": layers}
        if self.built:
            config["build_input_shape"] = list(self._built_input_shape)
        return config

    @classmethod
    def from_config(cls, config: dict, *, max_weight_bytes: int | None = None) -> "Sequential":
        """A model from :meth:`get_config`'s dict, which may come from an untrusted file: the layers'
        constructors check their arguments, and the weights are sized from the config before any is
        created (``AllocationTooLargeError`` past ``max_weight_bytes``, default the physical memory)."""
        if not isinstance(config, dict):
            raise TypeError(f"Sequential.from_config: config must be a dict, got {type(config).__name__}")
        owner = f"Sequential.from_config ('{config.get('name')}')"
        layer_configs = config.get("layers")
        if not isinstance(layer_configs, list):
            raise TypeError(f"{owner}: 'layers' must be a list, got {type(layer_configs).__name__}")
        for i, entry in enumerate(layer_configs):
            if not (isinstance(entry, dict) and isinstance(entry.get("class_name"), str)
                    and isinstance(entry.get("config"), dict)):
                raise TypeError(f"{owner}: layers[{i}] must be {{'class_name': str, 'config': dict}}, "
                                f"got {str(entry)[:120]}")
        build_shape = config.get("build_input_shape")
        if build_shape is not None:
            build_shape = _validate.shape(build_shape[1:] if isinstance(build_shape, list) and build_shape
                                          and build_shape[0] is None else build_shape, "build_input_shape", owner)
        layers = [deserialize(entry) for entry in layer_configs]  # constructors allocate nothing
        model = cls(name=config.get("name"), trainable=config.get("trainable", True))
        input_shape = layers[0].input_shape if layers and isinstance(layers[0], InputLayer) else None
        if input_shape is None and layers:
            input_shape = layers[0]._declared_input_shape
        if input_shape is None:
            input_shape = build_shape
        if input_shape is not None:
            saving_module.check_weight_budget(layers, input_shape, f"Sequential '{model.name}'", max_weight_bytes)
        for layer in layers:
            model.add(layer)
        if not model.built and build_shape is not None:
            model.build(build_shape)
        return model

    def save_weights(self, filepath: "str | os.PathLike", overwrite: bool = True) -> None:
        """Weights to a safetensors file, named ``"<layer>/<weight>"`` (Keras layouts)."""
        saving_module.save_weights(self, filepath, overwrite=overwrite)

    def load_weights(self, filepath: "str | os.PathLike") -> None:
        """Weights from :meth:`save_weights`' file; all are checked (names, shapes, float dtypes) before
        any is written, so a failed call changes no weight. Unused tensors are named in a warning."""
        saving_module.load_weights(self, filepath)

    def save(self, filepath: "str | os.PathLike", overwrite: bool = True, include_optimizer: bool = True) -> None:
        """The whole model (config, weights, compile config, optimizer state): a ``.dnnbind`` zip or a directory."""
        saving_module.save_model(self, filepath, overwrite=overwrite, include_optimizer=include_optimizer)

    def __repr__(self) -> str:
        return f"<Sequential name={self.name}, layers={len(self._layers)}, built={self.built}>"


Model = Sequential

