"""``Model``: the base of every model kind, and the subclassing API.

* ``Model(inputs, outputs)`` builds a functional model (it returns a
  :class:`~dnnbind.models.functional.Functional`, as Keras 3).
* ``class MyModel(Model)`` with ``__init__`` creating layers as attributes and
  ``call(inputs, training=False)`` composing them (layers and ``keras.ops``): a subclassed model. Layers,
  models, variables and lists/dicts of them assigned as attributes are tracked, so ``weights``,
  ``summary``, ``save_weights`` see them; the model builds on its first call (or ``build(input_shape)``,
  which calls it once on a batch of one). Training records every op of ``call`` on the tape
  (:mod:`dnnbind.autodiff`): any computation is differentiated, layers or not.

A model is a :class:`~dnnbind.layers.Layer` (as in Keras 3): it can be called inside another model,
symbolically too, its weights shared. The training loop lives in
:class:`dnnbind.trainers.trainer.Trainer` (what it needs from a model: :mod:`dnnbind.trainers.protocol`);
this module holds what does not depend on the model's structure (weights, devices, summary, saving)
and the subclassed forward.
"""

from __future__ import annotations

import inspect
import json
import os
import re
import warnings
from typing import Any, Callable, Sequence

import numpy as np

from .. import _keras_objects, _validate, backend, keras_format
from .. import quantizers as Q
from .. import saving_lib
from ..autodiff.tensor import Tensor
from ..backend import Device
from ..layers.base import Layer, _snake_case, deserialize, is_symbolic, structure_version, unique_name
from ..layers.core import _QuantizableMixin, check_calibration
from ..layers.graph import InputLayer, KerasTensor
from ..trainers.precision import LossScale
from ..trainers.trainer import Trainer
from . import _summary

__all__ = ["Model"]


def deserialize_layer(entry: dict, custom_objects: "dict | None" = None) -> Layer:
    """A layer from a model config's entry ``{"class_name", "config"[, "registered_name"]}``: the user's class
    when the ``CustomObjectScope``, the registry (``register_keras_serializable``) or ``custom_objects``
    knows its registered or class name, else dnnbind's own."""
    user_class = _keras_objects.find_custom_class(entry["class_name"], entry.get("registered_name"), custom_objects)
    if user_class is not None:
        if not (isinstance(user_class, type) and issubclass(user_class, Layer)):
            raise TypeError(f"layer '{entry['class_name']}': the custom object registered for it is "
                            f"{user_class!r}, not a Layer class")
        return user_class.from_config(entry["config"])
    try:
        return deserialize(entry)
    except ValueError:
        # dnnbind's own files name a user's class by its class name only: a registered class of that name
        for obj in list(_keras_objects._scope_objects().values()) + list(_keras_objects.GLOBAL_CUSTOM_OBJECTS.values()):
            if isinstance(obj, type) and issubclass(obj, Layer) and obj.__name__ == entry["class_name"]:
                return obj.from_config(entry["config"])
        raise


def _is_functional_call(args: tuple, kwargs: dict) -> bool:
    if "inputs" in kwargs and "outputs" in kwargs:
        return True
    return len(args) >= 2 or (len(args) == 1 and "outputs" in kwargs)


def _functional_class() -> type:
    from .functional import Functional  # deferred: functional.py subclasses this module's Model (DESIGN.md)

    return Functional


def _inject_functional(cls: type, functional: type) -> type:
    """Keras 3's ``inject_functional_model_class``: a subclass of Model whose ``__init__`` calls
    ``super().__init__(inputs, outputs)`` ("functional subclassing") gets Functional in place of Model in its
    bases, so it is a Functional model with the subclass's own methods."""
    if cls is Model:
        return functional
    if not issubclass(cls, Model) or issubclass(cls, functional):
        return cls
    cls.__bases__ = tuple(_inject_functional(base, functional) for base in cls.__bases__)
    for memo in ("_legacy_kind", "_keras_build_kind", "_call_params_memo"):  # per-class caches of the old bases
        if memo in cls.__dict__:
            delattr(cls, memo)
    return cls


class Model(Trainer, Layer):
    """A model: ``Model(inputs, outputs)`` (functional) or a subclass with ``call`` (see the module).

    ``compile``, ``fit``, ``evaluate``, ``predict``, ``*_on_batch``, ``train_step`` come from the trainer;
    ``weights``, ``get_weights``/``set_weights``, ``summary``, ``save``/``save_weights``/
    ``load_weights``, ``to(device)`` from here.
    """

    def __new__(cls, *args: Any, **kwargs: Any) -> "Model":
        if cls is Model and _is_functional_call(args, kwargs):
            # Keras 3: Model(inputs, outputs) is a Functional model
            functional = _functional_class()
            return functional.__new__(functional)
        return super().__new__(cls)

    def __init__(self, *args: Any, name: str | None = None, trainable: bool = True, dtype: Any = None,
                 **kwargs: Any) -> None:
        if (args or kwargs) and _is_functional_call(args, kwargs):
            # a subclass calling super().__init__(inputs=..., outputs=...): it becomes a Functional (Keras 3)
            functional = _functional_class()
            _inject_functional(type(self), functional)
            functional.__init__(self, *args, name=name, trainable=trainable, **kwargs)
            return
        if args or kwargs:
            raise TypeError(f"{type(self).__name__}: unexpected arguments {list(args) + sorted(kwargs)}; a "
                            "functional model takes Model(inputs, outputs), a subclassed one only name/trainable")
        self._init_model(name, trainable, dtype)

    def _init_model(self, name: str | None, trainable: bool, dtype: Any = None) -> None:
        if name is not None and not isinstance(name, str):
            raise _validate.ArgumentTypeError(f"{type(self).__name__}: name must be a str, got {name!r}")
        Layer.__init__(self, name=name if name is not None else unique_name(_snake_case(type(self).__name__)),
                       trainable=trainable, dtype=dtype)
        self._built_input_shapes: list[tuple] | None = None
        self._built_output_shapes: list[tuple] | None = None
        self._single_input = True
        self._init_trainer()

    @property
    def layers(self) -> list:
        """The layers (and nested models) assigned as attributes, in assignment order."""
        return self._sublayers()

    def _direct_layers(self) -> list:
        """The layers this model applies directly (subclassed: the tracked ones)."""
        return self._sublayers()

    def _inner_layers(self) -> list:
        return self.__dict__.get("_layers") or self.__dict__.get("_graph_layers") or self._sublayers()

    def _memo(self, key: str, make: Any) -> Any:
        """``make()``, kept until the structure version moves (layers or variables tracked, weights made,
        trainable flags set: see ``layers.base.structure_version``). A step asks for these every time."""
        version = structure_version()
        d = self.__dict__
        memo = d["_structure_memo"] if "_structure_memo" in d else None
        if memo is None or memo[0] != version:
            memo = d["_structure_memo"] = (version, {})
        kept = memo[1]
        hit = kept[key] if key in kept else None
        if hit is None:
            hit = kept[key] = make()
        return hit

    def _flat_layers(self) -> list[Layer]:
        """Every layer holding weights or state a step uses, nested models and layers flattened, each once."""
        return list(self._memo("flat", self._make_flat_layers))

    def _make_flat_layers(self) -> list[Layer]:
        out: list[Layer] = []
        seen: set[int] = set()

        def visit(layer: Any) -> None:
            if isinstance(layer, Model):
                for inner in layer._direct_layers():
                    visit(inner)
                return
            if id(layer) in seen or isinstance(layer, InputLayer):
                return
            seen.add(id(layer))
            out.append(layer)
            for inner in layer._sublayers():
                visit(inner)

        for item in self._direct_layers():
            visit(item)
        return out

    @property
    def losses(self) -> list:
        """Keras 3's ``model.losses``: the ``add_loss`` and activity-regularizer losses of the last call (the
        model's, then each layer's), then the regularization losses of :attr:`trainable_weights`, computed
        now (differentiable under a tape; after ``fit`` those are the current weights' penalties)."""
        return self._added_losses() + [w.regularizer(w) for w in self.trainable_weights if w.regularizer is not None]

    def _added_losses(self) -> list:
        out = [item() if callable(item) and not isinstance(item, Tensor) else item
               for item in self.__dict__.get("_own_losses", [])]
        seen: set = set()
        for layer in self._direct_layers():
            if id(layer) not in seen and not isinstance(layer, InputLayer):
                seen.add(id(layer))
                out.extend(layer._added_losses())
        return out

    def _clear_losses(self) -> None:
        self.__dict__["_own_losses"] = []
        for layer in self._direct_layers():
            layer._clear_losses()

    def _has_losses(self) -> bool:
        if self.__dict__.get("_own_losses") or any(w.regularizer is not None for w in self._own_variables()):
            return True
        return any(layer._has_losses() for layer in self._direct_layers() if not isinstance(layer, InputLayer))

    def get_layer(self, name: str | None = None, index: int | None = None) -> Any:
        """A layer by name or by index in :attr:`layers` (Keras)."""
        layers = self.layers
        if index is not None:
            if not isinstance(index, int) or not -len(layers) <= index < len(layers):
                raise ValueError(f"{self._owner}: get_layer index {index!r} is out of range for {len(layers)} layers")
            return layers[index]
        for layer in layers:
            if layer.name == name:
                return layer
        raise ValueError(f"{self._owner}: no layer named {name!r}; layers: {[layer.name for layer in layers]}")

    # ----- shapes and build (subclassed models; Functional/Sequential override) --------------
    def _input_names(self) -> list[str]:
        shapes = self._built_input_shapes
        n = len(shapes) if shapes is not None else self.__dict__.get("_guessed_input_count", 1)
        return ["input"] if n == 1 else [f"input_{i + 1}" for i in range(n)]

    def _guess_input_structure(self, x: Any) -> None:
        """Before a subclassed model is built, a list/tuple of several arrays means several inputs."""
        if self._built_input_shapes is None:
            several = isinstance(x, (list, tuple)) and len(x) > 1 and all(
                hasattr(v, "shape") and np.ndim(v) > 0 for v in x)
            object.__setattr__(self, "_guessed_input_count", len(x) if several else 1)

    @property
    def output_names(self) -> list[str]:
        shapes = self._built_output_shapes
        n = len(shapes) if shapes is not None else self.__dict__.get("_guessed_output_count", 1)
        return ["output"] if n == 1 else [f"output_{i + 1}" for i in range(n)]

    def _guess_output_structure(self, loss: Any) -> None:
        """Before a subclassed model is built, ``compile``'s list of losses tells its number of outputs
        (checked against what ``call`` returns when the model builds)."""
        if self._built_output_shapes is None and type(self).call is not Model.call:
            n = len(loss) if isinstance(loss, (list, tuple)) else (len(loss) if isinstance(loss, dict) else 1)
            object.__setattr__(self, "_guessed_output_count", max(1, n))

    def _expected_input_shapes(self) -> "list[tuple] | None":
        return self._built_input_shapes

    def _input_dtypes(self) -> "list[np.dtype | None]":
        """The dtype each input is fed as (Keras 3: the ``Input``'s dtype); None where the model has no
        ``Input`` (a subclassed model: fed float32)."""
        return [None] * len(self._input_names())

    def _output_shapes(self) -> list[tuple]:
        self._require_built("the output shape")
        return list(self._built_output_shapes)

    def _input_hint(self) -> str:
        return ""

    def _require_layers(self, what: str) -> None:
        if type(self).call is Model.call:
            raise NotImplementedError(f"{self._owner}: {what} needs a model: subclass Model and define "
                                      "call(inputs, training=False), or build one with Model(inputs, outputs)")

    def _require_built(self, what: str) -> None:
        if not self.built:
            raise ValueError(f"{self._owner}: {what} needs a built model; call it on data, fit it, or "
                             "build(input_shape) first")

    @property
    def input_shape(self) -> Any:
        shapes = self._expected_input_shapes()
        if shapes is None:
            return None
        out = [(None, *s) for s in shapes]
        return out[0] if len(out) == 1 else out

    @property
    def output_shape(self) -> Any:
        out = [(None, *s) for s in self._output_shapes()]
        return out[0] if len(out) == 1 else out

    def build(self, input_shape: Any = None) -> None:
        """Build a subclassed model for inputs of ``input_shape`` (no batch axis, or a leading None; a
        list of shapes for several inputs): ``call`` runs once, in inference mode, on a batch of one."""
        if input_shape is None:
            raise ValueError(f"{self._owner}: build needs input_shape, e.g. build((None, 28, 28, 1))")
        shapes = input_shape if (isinstance(input_shape, list) and input_shape
                                 and isinstance(input_shape[0], (list, tuple))) else [input_shape]
        owner = f"{self._owner}: build"
        clean = []
        for s in shapes:
            s = tuple(s)
            if s and s[0] is None:
                s = s[1:]
            clean.append(_validate.shape(s, "input_shape", owner))
        self._build_for(clean, single=not (isinstance(input_shape, list) and len(shapes) > 1))

    def _build_for(self, shapes: list[tuple], single: bool | None = None) -> None:
        self._drop_graphs()  # building creates weight arrays
        dev = self.device
        for layer in self._flat_layers():
            if layer._device is None:
                layer._device = dev
        zeros = [backend.asarray(np.zeros((1, *s), np.float32), device=dev) for s in shapes]
        self._single_input = len(shapes) == 1 if single is None else single
        self.built = True  # (Layer.__call__ must not try the Keras-style build of a model)
        try:
            outs = self._call_outputs(zeros, training=False)
        except BaseException:
            self.built = False
            raise
        if self.compiled and len(outs) != len(self.output_names):
            self.built = False
            raise ValueError(f"{self._owner}: call returned {len(outs)} output(s), but compile was given losses "
                             f"for {len(self.output_names)}; compile again with one loss per output")
        self._built_input_shapes = [tuple(s) for s in shapes]
        self._built_output_shapes = [tuple(o.shape[1:]) for o in outs]

    def _build_from_call(self, args: tuple, kwargs: dict) -> None:
        """A subclassed model called before it was built: it builds from the call (Keras)."""
        first = args[0] if args else next(iter(kwargs.values()))
        items = list(first) if isinstance(first, (list, tuple)) else [first]
        shapes = [tuple(t.shape[1:]) for t in items if hasattr(t, "shape")]
        if type(self).build is not Model.build and type(self).__module__.split(".")[0] != "dnnbind":
            Layer._build_from_call(self, args, kwargs)  # a user's build(input_shape), Keras's shapes
        self.built = True
        self._single_input = not isinstance(first, (list, tuple))
        if self._built_input_shapes is None and shapes and all(None not in s for s in shapes):
            self._built_input_shapes = shapes

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Call the model (a layer call: see :meth:`Layer.__call__`); a subclassed model learns its output
        shapes from its first call on data."""
        out = Layer.__call__(self, *args, **kwargs)
        if self._built_output_shapes is None and not is_symbolic(out):
            flat = list(out) if isinstance(out, (list, tuple)) else list(out.values()) if isinstance(out, dict) \
                else [out]
            if all(isinstance(o, Tensor) for o in flat):
                self._built_output_shapes = [tuple(o.shape[1:]) for o in flat]
        return out

    # ----- the subclassed forward --------------------------------------------------------------
    def call(self, inputs: Any, training: bool = False) -> Any:
        """The forward of a subclassed model (override it): compose layers and ops on ``inputs``."""
        raise NotImplementedError(f"{self._owner}: subclass Model and define call(inputs, training=False), or "
                                  "build a functional model with Model(inputs, outputs)")

    def _call_outputs(self, xs: list, training: bool) -> list:
        """Run the model on raw arrays or tensors ``xs`` (model input order); its outputs as a list."""
        inputs = xs[0] if self._single_input else list(xs)
        out = self(inputs, training=training)
        outs = list(out) if isinstance(out, (list, tuple)) else list(out.values()) if isinstance(out, dict) else [out]
        for o in outs:
            if not isinstance(o, Tensor):
                raise TypeError(f"{self._owner}: call must return a tensor or a list of tensors, got "
                                f"{type(o).__name__}")
        if self._built_output_shapes is None:
            self._built_output_shapes = [tuple(o.shape[1:]) for o in outs]
        return outs

    def _fusable_outputs(self) -> list[bool]:
        # call() is opaque: whether an output ends in a skippable softmax is unknown
        return [False] * len(self.output_names)

    def _run_forward(self, xs: list, training: bool, logits: Sequence[bool]) -> list:
        """The forward of a step: the outputs (tensors, recorded when a tape is active)."""
        return self._call_outputs(xs, training=training)

    # ----- devices ------------------------------------------------------------------------------
    @property
    def device(self) -> Device:
        if self._device is None:
            self._device = backend.default_device()
        return self._device

    def to(self, device: "str | Device") -> "Model":
        """Move weights and optimizer state to ``device`` (``"cpu"``, ``"cuda"``, ``"cuda:1"``)."""
        dev = backend.resolve_device(device)
        self._drop_graphs()  # they address the old device's buffers
        for layer in self._flat_layers():
            layer.to(dev)
        for w in self._weights:
            w.value = backend.asarray(backend.to_numpy(w.value), device=dev)
        if self.optimizer is not None:
            self.optimizer.to(dev)
        for m in self._all_metrics():
            m._total = None
        if self._loss_scale is not None:
            self._loss_scale = LossScale(dev)
        self._device = dev
        return self

    # ----- weights ----------------------------------------------------------------------------
    def _own_variables(self) -> list:
        """Variables created on the model itself (``self.add_weight`` / ``self.v = keras.Variable``)."""
        return list(self._weights) + self._tracked_variables()

    @property
    def weights(self):
        return list(self._memo("weights", self._make_weights))

    def _make_weights(self) -> list:
        out = self._own_variables()
        for layer in self._flat_layers():
            out += layer._weights + layer._tracked_variables()
        return out

    @property
    def trainable_weights(self):
        return list(self._memo("trainable", self._make_trainable_weights))

    def _make_trainable_weights(self) -> list:
        if not self.trainable:
            return []
        out = [w for w in self._own_variables() if w.trainable]
        frozen = self._frozen_layers()
        for layer in self._flat_layers():
            if id(layer) not in frozen:
                out += [w for w in layer._weights + layer._tracked_variables() if w.trainable]
        return out

    def _frozen_layers(self) -> set:
        """Ids of the layers that do not train: ``trainable=False`` on them or on any layer or model
        holding them (a frozen sub-model freezes every layer inside it)."""
        out: set = set()

        def visit(item: Any, frozen: bool) -> None:
            frozen = frozen or not item.trainable
            if isinstance(item, Model):
                for inner in item._direct_layers():
                    visit(inner, frozen)
                return
            if frozen:
                out.add(id(item))
            for inner in item._sublayers():
                visit(inner, frozen)

        for item in self._direct_layers():
            visit(item, False)
        return out

    @property
    def non_trainable_weights(self):
        if not self.trainable:
            return self.weights
        trainable = {id(w) for w in self.trainable_weights}
        return [w for w in self.weights if id(w) not in trainable]

    variables = property(lambda self: self.weights)
    trainable_variables = property(lambda self: self.trainable_weights)
    non_trainable_variables = property(lambda self: self.non_trainable_weights)

    def get_weights(self) -> list[np.ndarray]:
        """Every layer's weights in Keras layouts, layer by layer."""
        return [w.numpy() for w in self.weights]

    def set_weights(self, weights: Sequence[Any]) -> None:
        """Set every layer's weights (the list :meth:`get_weights` returns). The count and every array's
        shape and dtype are checked before the first is written, so a failed call changes no weight."""
        self._require_built("set_weights")
        weights = list(weights)
        targets = self.weights
        if len(weights) != len(targets):
            raise ValueError(f"{self._owner}: set_weights expects {len(targets)} arrays, got {len(weights)} "
                             "(one per array of get_weights)")
        arrays = [w.checked(arr) for w, arr in zip(targets, weights)]
        for w, arr in zip(targets, arrays):
            w.assign(arr)

    def count_params(self) -> int:
        self._require_built("count_params")
        return sum(int(np.prod(w.shape)) for w in self.weights)

    # ----- quantization (inference) ------------------------------------------------------------
    def quantize(self, mode: str, *, calibration_data: Any = None, calibration_steps: int | None = None,
                 batch_size: int | None = None, group_size: int = Q.DEFAULT_INT4_GROUP_SIZE,
                 filters: "str | Sequence[str] | Callable[[Layer], bool] | None" = None) -> None:
        """Quantize the model for inference (Keras 3's ``Model.quantize``): ``"int8"``, ``"float8"`` or
        ``"int4"`` (definitions in :mod:`dnnbind.quantizers`).

        * Dense: int8 (per output channel weight scales; activations per row, computed each call) and
          float8 (E4M3, per-tensor scales) quantize weights and activations; int4 is weight-only, packed
          two per byte with one scale per ``group_size`` inputs (128, as Keras).
        * Conv2D: int8 and float8 store the kernel quantized (per output channel / per tensor scales) and
          convolve in the compute dtype on the dequantized kernel (a warning says so); int4 leaves it float.
        * Other layers stay as they are.

        ``calibration_data`` (int8/float8): inputs as :meth:`predict` takes them (arrays, a generator, a
        PyDataset; ``calibration_steps`` batches at most, ``batch_size`` rows each): the float model runs on
        them first and each quantized layer's activations get one static scale from the largest
        ``max|x|`` seen, instead of a scale per call. ``filters``: which layers to quantize (a callable
        taking the layer, a regular expression or a list of them matched against layer names).

        The model then predicts and evaluates (and saves and loads, its scales with it) but cannot train:
        ``fit``/``train_on_batch`` raise. Every argument is checked, and every chosen layer, before the first
        changes.
        """
        owner = f"{self._owner}: quantize"
        mode = Q.check_mode(mode, owner)
        self._require_built("quantize")
        calibration_steps = _validate.optional_positive_int(calibration_steps, "calibration_steps", owner)
        batch_size = _validate.optional_positive_int(batch_size, "batch_size", owner)
        if calibration_data is not None and mode == "int4":
            raise ValueError(f"{owner}: int4 quantizes weights only, calibration_data has nothing to calibrate")
        keep = _layer_filter(filters, owner)
        chosen = [layer for layer in self._flat_layers() if isinstance(layer, _QuantizableMixin) and keep(layer)]
        targets, left = [], []
        for layer in chosen:
            if mode in layer._quantize_modes:
                layer._check_quantizable(mode, group_size)
                targets.append(layer)
            elif layer._quantize_modes:
                left.append(layer)
        if not targets:
            raise ValueError(f"{owner}: no layer to quantize in {mode!r} (Dense layers quantize in every mode, Conv2D "
                             "in int8 and float8)" + (f"; filters={filters!r} matched none" if filters else ""))
        calibrated = [t for t in targets if t._quantizes_inputs]
        if calibration_data is not None:
            self._calibrate(calibrated, calibration_data, calibration_steps, batch_size)
        try:
            if calibration_data is not None:
                check_calibration(calibrated, owner)  # before the first layer changes
            for layer in targets:
                amax = layer.__dict__.pop("_calibrated_amax", None)
                layer.quantize(mode, group_size=group_size)
                if amax is not None:
                    layer.set_input_scale(amax)
        finally:
            # a layer that failed leaves the later ones' amax behind: a later quantize() without calibration
            # data must not pick it up
            for layer in targets:
                layer.__dict__.pop("_calibrated_amax", None)
        self._drop_graphs()  # they address the float weights
        if self.optimizer is not None and self.optimizer.built:
            # its slots follow the float weights that are gone (training is refused from now on)
            self.optimizer.build([w.value for w in self.trainable_weights])
        for layer in left:
            warnings.warn(f"{owner}: {type(layer).__name__} '{layer.name}' has no {mode} path and stays in "
                          f"{layer.compute_dtype}", UserWarning, stacklevel=2)
        weight_only = [t.name for t in targets if not t._quantizes_inputs]
        if weight_only:
            warnings.warn(f"{owner}: {', '.join(weight_only)} store their kernels in {mode} but convolve in the compute "
                          "dtype on the dequantized kernel (a memory saving; no int8/FP8 convolution kernel is used)",
                          UserWarning, stacklevel=2)

    def _calibrate(self, layers: list, data: Any, steps: "int | None", batch_size: "int | None") -> None:
        """Run the float model over ``data`` eagerly, each of ``layers`` recording the largest ``max|x|`` of
        its input; leaves ``_calibrated_amax`` on each."""
        saved_jit = self._jit_compile
        for layer in layers:
            layer._calibration_amax, layer._calibration_rows = 0.0, 0
        try:
            self._jit_compile = False  # the layers read max|x| back to the host, which a graph cannot
            self.predict(data, batch_size=batch_size, steps=steps, verbose=0)
            for layer in layers:
                layer._calibrated_amax = layer._calibration_amax
        finally:
            self._jit_compile = saved_jit
            for layer in layers:
                layer._calibration_amax = None

    def _quantized_layers(self) -> list:
        return [layer for layer in self._flat_layers() if getattr(layer, "quantization_mode", None) is not None]

    def _refuse_quantized_training(self, what: str) -> None:
        quantized = self._quantized_layers()
        if quantized:
            names = ", ".join(f"'{layer.name}' ({layer.quantization_mode})" for layer in quantized)
            raise ValueError(f"{self._owner}: {what} trains the model, but layer(s) {names} are quantized for inference "
                             "only; train the float model, then call quantize()")

    def fit(self, *args: Any, **kwargs: Any) -> Any:
        self._refuse_quantized_training("fit")
        return super().fit(*args, **kwargs)

    def train_on_batch(self, *args: Any, **kwargs: Any) -> Any:
        self._refuse_quantized_training("train_on_batch")
        return super().train_on_batch(*args, **kwargs)

    fit.__doc__ = Trainer.fit.__doc__
    train_on_batch.__doc__ = Trainer.train_on_batch.__doc__

    # ----- summary ----------------------------------------------------------------------------
    def _summary_rows(self) -> list[tuple]:
        """``(name (type), output shape, params, connected to or None, layer)`` per row, as Keras 3 shows
        them (an unbuilt layer: ``?`` and ``0 (unbuilt)``); a quantized layer's type carries its mode
        (``dense (Dense, int8)``)."""
        rows = []
        for layer in self.layers:
            mode = getattr(layer, "quantization_mode", None)
            kind = type(layer).__name__ + (f", {mode}" if mode else "")
            if not layer.built:
                rows.append((f"{layer.name} ({kind})", "?", "0 (unbuilt)", None, layer))
                continue
            if isinstance(layer, Model):
                shape = str(layer.output_shape)
            else:
                out = layer.output_shape if layer.output_shape is not None else self._layer_output_shape(layer)
                shape = "?" if out is None else str((None, *out)).replace(",)", ")")
            rows.append((f"{layer.name} ({kind})", shape, f"{layer.count_params():,}", None, layer))
        return rows

    def _summary_is_sequential(self) -> bool:
        """Keras's ``sequential_like``: the three-column table without "Connected to"."""
        return True

    def _layer_output_shape(self, layer: Layer) -> "tuple | None":
        """The sample output shape of ``layer`` in this model when the layer keeps none itself (a layer
        that defines ``call``); None where the model does not know it."""
        return None

    def summary(self, line_length: int | None = None, positions: Any = None, print_fn=None,
                expand_nested: bool = False, show_trainable: bool = False) -> None:
        """Print Keras 3's table: ``Layer (type) | Output Shape | Param #`` (``| Connected to`` for a
        functional model that is not a chain; ``| Trainable`` with ``show_trainable``), box-drawn as Keras
        prints it without a terminal (no colour), then the total, trainable, non-trainable and (once the
        optimizer has its variables) optimizer parameter counts with their sizes. ``line_length``: the
        table's width (default 88, or 108 with "Connected to"; at most the terminal's width - 4);
        ``positions``: the columns' right edges as fractions of it; ``expand_nested``: the layers of nested
        models too (prefixed ``└``). ``print_fn`` gets the whole text in one call (Keras 3); default:
        stdout."""
        owner = f"{self._owner}: summary"
        expand_nested = _validate.boolean(expand_nested, "expand_nested", owner)
        show_trainable = _validate.boolean(show_trainable, "show_trainable", owner)
        if line_length is not None:
            line_length = _validate.integer(line_length, "line_length", owner, minimum=1)
        connected = not self._summary_is_sequential()

        def with_nested(rows, level):
            out = []
            for name, shape, params, links, layer in rows:
                prefix = "   " * level + "└ " if level else ""
                out.append((prefix + name, shape, params, links if not level else "-", layer))
                if expand_nested and isinstance(layer, Model) and layer.built:
                    out.extend(with_nested(layer._summary_rows(), level + 1))
            return out

        rows = with_nested(self._summary_rows(), 0)
        extra = []
        quantized = self._quantized_layers()
        if quantized:
            human = _validate.human_bytes
            now = before = 0
            for layer in quantized:
                a, b = layer.quantized_bytes()
                now, before = now + a, before + b
            modes = ", ".join(sorted({layer.quantization_mode for layer in quantized}))
            extra.append(f" Quantized layers: {len(quantized)} ({modes}): weights {human(now)} instead of "
                         f"{human(before)} (saved {human(before - now)})")
        _summary.emit(_summary.format_summary(self, rows, connected, line_length, positions, show_trainable, extra),
                      print_fn)

    # ----- config and saving ------------------------------------------------------------------
    def get_config(self) -> dict:
        """A subclassed model's config: its name and trainable flag (its layers are made by ``__init__``)."""
        return {"name": self.name, "trainable": self.trainable}

    @classmethod
    def from_config(cls, config: dict, custom_objects: "dict | None" = None, **kwargs: Any) -> "Model":
        """``cls(**config)``; a functional model's config (``layers``, ``input_layers``, ``output_layers``)
        is rebuilt as a graph, as Keras 3's ``Model.from_config`` does."""
        if isinstance(config, dict) and {"layers", "input_layers", "output_layers"} <= set(config):
            from .functional import Functional  # deferred: functional.py subclasses this module's Model

            return Functional.from_config(config, custom_objects=custom_objects, **kwargs)
        return cls(**config)

    def to_json(self, **kwargs: Any) -> str:
        """The model's architecture as JSON, as Keras 3 writes it (the ``config.json`` of a ``.keras`` file, with
        the compile config when compiled); ``kwargs`` go to ``json.dumps``. Rebuild it with
        ``keras.models.model_from_json``. A subclassed model has no such config: ValueError."""
        return json.dumps(keras_format.model_config_with_compile(self), **kwargs)

    def save_weights(self, filepath: "str | os.PathLike", overwrite: bool = True) -> None:
        """The weights to a file (see :func:`dnnbind.saving.save_weights`)."""
        saving_lib.save_weights(self, filepath, overwrite=overwrite)

    def load_weights(self, filepath: "str | os.PathLike", *,
                     limits: "saving_lib.ReadLimits | dict | None" = None) -> None:
        """Weights from :meth:`save_weights`' file; all are checked (names, shapes, float dtypes) before
        any is written, so a failed call changes no weight. Unused tensors are named in a warning.
        ``limits``: how much the file may make this process read (:class:`dnnbind.saving.ReadLimits`, or a
        dict of its fields; default: the ``DNNBIND_READ_*`` environment, else the built-in limits), as
        :func:`dnnbind.saving.load_weights` and ``load_model`` take it."""
        saving_lib.load_weights(self, filepath, limits=limits)

    def save(self, filepath: "str | os.PathLike", overwrite: bool = True, include_optimizer: bool = True) -> None:
        """The whole model (config, weights, compile config, optimizer state); see :func:`dnnbind.saving.save_model`."""
        saving_lib.save_model(self, filepath, overwrite=overwrite, include_optimizer=include_optimizer)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} name={self.name}, layers={len(self.layers)}, built={self.built}>"


def _layer_filter(filters: Any, owner: str) -> "Callable[[Layer], bool]":
    """``filters`` of :meth:`Model.quantize` as a predicate on layers."""
    if filters is None:
        return lambda layer: True
    if callable(filters):
        return lambda layer: bool(filters(layer))
    patterns = [filters] if isinstance(filters, str) else list(filters) if isinstance(filters, (list, tuple)) else None
    if not patterns or not all(isinstance(p, str) for p in patterns):
        raise _validate.ArgumentTypeError(f"{owner}: filters must be None, a callable, a regular expression or a list of "
                                          f"them, got {filters!r}")
    try:
        compiled = [re.compile(p) for p in patterns]
    except re.error as exc:
        raise ValueError(f"{owner}: filters holds an invalid regular expression: {exc}") from None
    return lambda layer: any(c.fullmatch(layer.name) for c in compiled)


# KerasTensor is re-exported for `isinstance` checks next to Model (keras.KerasTensor)
__all__ += ["KerasTensor"]
