"""The Layer contract (Keras 3), layer variables, and the activations shared by layers.

A layer is called on tensors (:class:`dnnbind.Tensor`, NumPy arrays, GPU arrays) or on symbolic
tensors (``keras.Input`` and what layers made from it: :mod:`.graph`).

* **A layer written by a user** defines ``__init__``, ``build(input_shape)`` (``add_weight``), ``call``
  (in ``keras.ops``: it receives tensors and returns tensors) and ``get_config``. It trains with no
  backward written: every op records on the tape (:mod:`dnnbind.autodiff`).
* **dnnbind's own layers** keep their hand-written, fused forward and backward (``forward(x, training)``,
  ``backward(dy, need_dx)`` on raw arrays, state kept on ``self``): a call of one records ONE node whose
  VJP is that backward (a custom VJP: :meth:`Layer._legacy_apply`), so they run at the speed they
  always had and compose with user code on one tape. Their weight gradients leave the VJP as its
  results: ``layer.grads`` is only the scratch the backward fills inside it.

Shapes given to a user's ``build`` and to ``compute_output_shape`` are Keras shapes *with* the batch
axis (``(None, 28, 28, 1)``). dnnbind's own layers build from shapes without it (``_ensure_built`` strips
it); they accept a leading ``None`` too.

Weights live on the layer's device in an internal layout chosen for speed; ``get_weights`` /
``set_weights`` / ``Variable.assign`` always speak Keras layouts.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import math
import re
import threading
import weakref
from typing import Any, Callable, Sequence

import numpy as np

from dnnbind import _validate, backend, kernels
from dnnbind import activations as _activations
from dnnbind import constraints as _constraints
from dnnbind import initializers as _init
from dnnbind import regularizers as _regularizers
from dnnbind import ops as _ops
from dnnbind.autodiff import engine as _engine
from dnnbind.autodiff.tensor import Tensor
from dnnbind.autodiff import variable as _variable_module
from dnnbind.autodiff.variable import Variable
from dnnbind.autodiff.variable import cast_generation
from dnnbind.autodiff.variable import note_new_cast as _note_new_cast
from dnnbind.backend import Device
from dnnbind.mixed_precision import Policy, global_policy
from dnnbind.ops import _core as _ops_core

from . import _state_guard
from .input_spec import InputSpec, assert_input_compatibility

__all__ = ["Layer", "Weight", "ActivationFn", "register", "deserialize", "get_layer_class", "is_symbolic",
           "unique_name", "split_batch", "cast_generation", "release_pending_state", "pending_mark", "applied_twice"]

_name_counts: dict[str, int] = backend.object_name_uids  # Keras's one table of object names (clear_session)
_REGISTRY: dict[str, type] = {}


def register(cls: type) -> type:
    """Class decorator: make a layer class known to :func:`deserialize` (and ``load_model``)."""
    _REGISTRY[cls.__name__] = cls
    return cls


def get_layer_class(class_name: str) -> type:
    if class_name not in _REGISTRY:
        raise ValueError(f"unknown layer class {class_name!r}; known: {', '.join(sorted(_REGISTRY))}")
    return _REGISTRY[class_name]


def deserialize(config: dict) -> "Layer":
    """A layer from ``{"class_name": ..., "config": {...}}``."""
    return get_layer_class(config["class_name"]).from_config(config["config"])


def _snake_case(name: str) -> str:
    """``keras.src.utils.naming.to_snake_case``: ``MaxPooling2D`` -> ``max_pooling2d``."""
    name = re.sub(r"\W+", "", name)
    name = re.sub(r"(.)([A-Z][a-z]+)", r"\1_\2", name)
    return re.sub(r"([a-z])([A-Z])", r"\1_\2", name).lower()


def unique_name(base: str) -> str:
    """Keras naming: the first ``dense``, then ``dense_1``, ``dense_2``..."""
    return backend.uniquify(base)


def split_batch(shape: Sequence[Any]) -> "tuple[bool, tuple[int | None, ...]]":
    """``(had_batch_axis, shape_without_it)`` for a shape that may start with Keras's ``None``. Other axes
    may be None too (a variable length: ``Input(shape=(None,))``); they stay None."""
    shape = tuple(shape)
    if shape and shape[0] is None:
        return True, tuple(None if s is None else int(s) for s in shape[1:])
    return False, tuple(None if s is None else int(s) for s in shape)


def _fits(shape: Sequence[Any], built: Sequence[Any]) -> bool:
    """A (sample) shape against the one a layer was built for, whose None axes take any size."""
    shape, built = tuple(shape), tuple(built)
    return len(shape) == len(built) and all(b is None or a == b for a, b in zip(shape, built))


def _is_symbolic_value(value: Any) -> bool:
    return hasattr(value, "_keras_history")


def is_symbolic(x: Any) -> bool:
    """Whether ``x`` is a symbolic tensor, or a (nested) list/tuple/dict holding one."""
    if _is_symbolic_value(x):
        return True
    if isinstance(x, (list, tuple)):
        return any(is_symbolic(v) for v in x)
    if isinstance(x, dict):
        return any(is_symbolic(v) for v in x.values())
    return False


class Weight(Variable):
    """One layer variable (a :class:`dnnbind.Variable` owned by a layer).

    ``value`` is the array the kernels use (on the layer's device, internal layout);
    ``numpy()`` / ``assign()`` convert from and to the Keras layout and ``shape``
    is the Keras shape. ``path`` (``"conv2d/kernel"``) names it in saved files.
    """

    def __init__(self, layer: "Layer", name: str, keras_shape: tuple[int, ...], value: Any, trainable: bool,
                 to_internal: Callable[[np.ndarray], np.ndarray] | None = None,
                 to_keras: Callable[[np.ndarray], np.ndarray] | None = None, *, autocast: bool = True,
                 regularizer: Any = None, constraint: Any = None) -> None:
        self.layer = layer
        self.name = name
        self.shape = tuple(keras_shape)
        self.value = value
        self.trainable = trainable
        self.autocast = autocast
        self.aggregation = "none"
        self.synchronization = "auto"
        self._to_internal = to_internal
        self._to_keras = to_keras
        self.regularizer = regularizer
        self.constraint = constraint
        self._leaf = None

    @property
    def path(self) -> str:
        return f"{self.layer.name}/{self.name}"

    def checked(self, array: Any) -> np.ndarray:
        """``array`` as NumPy once it passes :meth:`assign`'s checks (numeric dtype, Keras shape); changes nothing."""
        arr = np.asarray(array)
        if arr.dtype.kind not in "fiub" and arr.dtype != _validate.BFLOAT16:
            raise TypeError(f"layer '{self.layer.name}': weight '{self.name}' must be numeric, got dtype {arr.dtype}")
        if tuple(arr.shape) != self.shape:
            raise ValueError(
                f"layer '{self.layer.name}' ({type(self.layer).__name__}): weight '{self.name}' expects shape "
                f"{self.shape}, got {tuple(arr.shape)}")
        return arr

    def _owner(self) -> str:
        return f"layer '{self.layer.name}' ({type(self.layer).__name__})"

    def __repr__(self) -> str:
        return f"<Weight path={self.path} shape={self.shape} dtype={self.dtype}>"


def _is_array(x: Any) -> bool:
    return isinstance(x, np.ndarray) or backend.is_device_array(x)


# (device is CUDA, policy compute dtype name) -> the dtype a layer computes in
_EFFECTIVE_DTYPES: "dict[tuple[bool, str], np.dtype]" = {}

# cast_generation / _note_new_cast (imported above from the variables' room, where the ops room bumps it
# too): bumped whenever a layer casts a weight it had not cast (to that dtype) before, its own layers in
# _compute_weight, a user's layer where ops read a variable under autocast; trainers keep the list of
# weights they precast and rebuild it when this moved.


# ----- a version of every model structure: bumped when a layer or variable is tracked or untracked, a weight
# is made, or a trainable flag changes, so that models can keep their flattened layer and weight lists ------
_structure = [0]


def structure_version() -> int:
    return _structure[0] + _variable_module._trainable_changes[0]  # (+ trainable_changes(), read in place)


def _bump_structure() -> None:
    _structure[0] += 1


_NO_WATCH = contextlib.nullcontext()

# ----- the call context: training propagates from an outer call to the calls inside it ---------------
_ctx = threading.local()


@contextlib.contextmanager
def symbolic_trace():
    """While a symbolic call runs ``call`` on stand-in zeros (``graph.output_spec``): a layer built inside it
    gets shapes whose batch axis is None, as Keras 3's symbolic build gives (a user's ``build`` that builds
    a sublayer from ``input_shape`` sees ``(None, 28, 28, 1)``, not the stand-in batch)."""
    _ctx.tracing = getattr(_ctx, "tracing", 0) + 1
    try:
        yield
    finally:
        _ctx.tracing -= 1


def _none_batch(shape: Any) -> Any:
    if isinstance(shape, tuple):
        return (None, *shape[1:]) if shape else shape
    if isinstance(shape, list):
        return [_none_batch(s) for s in shape]
    if isinstance(shape, dict):
        return {k: _none_batch(v) for k, v in shape.items()}
    return shape


def _context_training() -> "bool | None":
    stack = getattr(_ctx, "training", None)
    return stack[-1] if stack else None


def _context_depth() -> int:
    stack = getattr(_ctx, "training", None)
    return len(stack) if stack else 0


class _CallContext:
    __slots__ = ("training",)

    def __init__(self, training: "bool | None") -> None:
        self.training = training

    def __enter__(self) -> None:
        stack = getattr(_ctx, "training", None)
        if stack is None:
            stack = _ctx.training = []
        stack.append(self.training)

    def __exit__(self, *exc: Any) -> None:
        _ctx.training.pop()


# ----- state of dnnbind's own layers kept for a backward that may never run --------------------------
def _pending() -> list:
    pending = getattr(_ctx, "pending", None)
    if pending is None:
        pending = _ctx.pending = []
    return pending


def _drop_new_arrays(layer: Any, before: tuple[dict, dict]) -> None:
    """Put back the attributes a forward pointed at new arrays (on the layer and its ActivationFns)."""
    state, nested = before
    for key, value in list(layer.__dict__.items()):
        if _is_array(value) and state.get(key) is not value:
            setattr(layer, key, state.get(key))
    for key, attrs in nested.items():
        holder = layer.__dict__.get(key)
        if holder is None:
            continue
        for name, value in list(holder.__dict__.items()):
            if _is_array(value) and attrs.get(name) is not value:
                setattr(holder, name, attrs.get(name))


def pending_mark() -> int:
    """Where the list of kept states stands now (:func:`release_pending_state` of a later mark's range)."""
    return len(_pending())


def release_pending_state(since: "int | None" = None, until: "int | None" = None) -> None:
    """Drop the arrays dnnbind's own layers kept for backwards that did not run (their output took no
    gradient, or a step failed half-way): every training step calls this when it ends, so nothing
    allocated in a (captured) step outlives it. ``since``/``until``: only what was kept between those
    :func:`pending_mark` s (a forward of its own among others)."""
    pending = getattr(_ctx, "pending", None)
    if not pending:
        return
    if since is None and until is None:  # a training step's end: everything
        _ctx.pending = []
        for entry in reversed(pending):
            if entry is not None:
                layer, before, saved = entry
                if not saved["done"]:
                    _drop_new_arrays(layer, before)
                saved["state"] = None
        return
    start = 0 if since is None else min(int(since), len(pending))
    end = len(pending) if until is None else min(int(until), len(pending))
    mine = pending[start:end]
    _ctx.pending = pending[:start] + [None] * len(mine) + pending[end:] if until is not None else pending[:start]
    if until is not None and all(p is None for p in _ctx.pending):
        _ctx.pending = []
    mine = [m for m in mine if m is not None]
    for layer, before, saved in reversed(mine):
        if not saved["done"]:
            _drop_new_arrays(layer, before)
        saved["state"] = None


_LOSSES_ADDED = [0]


def losses_added() -> int:
    """How many ``add_loss`` calls there have been (a trainer compares it around a step: a step that added
    none need not walk the layers to drop them)."""
    return _LOSSES_ADDED[0]


def applied_twice() -> bool:
    """Whether the recorded forward of this step applied one of dnnbind's own layers more than once (its
    weight gradients are then summed by the engine, which the trainer wants in the weights' dtype)."""
    pending = getattr(_ctx, "pending", None)
    if not pending:
        return False
    applied = [entry[0] for entry in pending if entry is not None]
    return len(set(map(id, applied))) != len(applied)


def _trainable_edge(w: Variable, tapes: "list | None" = None) -> "tuple | None":
    """The edge of a weight read by one of dnnbind's own layers while recording: to its leaf when a tape
    watches it (noting the access), else None. ``tapes``: the active tapes, when the caller has them."""
    watched = False
    for tape in _engine.active_tapes() if tapes is None else tapes:
        if tape.watches(w):
            tape._note_access(w)
            watched = True
    return (w._leaf_node(), 0) if watched else None


def _trainable_edges(weights: Sequence[Variable]) -> tuple:
    """``tuple(_trainable_edge(w) for w in weights)`` for trainable ``weights`` (read from ``trainable_weights``
    now), the active tapes looked up once."""
    tapes = _engine.active_tapes()
    if len(tapes) == 1:  # the common case (one training step's tape): one call for the whole batch
        return tapes[0]._read_edges(weights, all_trainable=True)
    return tuple(_trainable_edge(w, tapes) for w in weights)


class Layer:
    """Base class of all layers (Keras 3's contract; see the module docstring).

    ``Layer(trainable=True, name=None, dtype=None, autocast=True, activity_regularizer=None)``.
    Subclasses implement ``build(input_shape)`` (create weights with :meth:`add_weight`), ``call(inputs,
    training=None, mask=None, ...)``, ``compute_output_shape`` (optional: otherwise it is found by running
    ``call`` on zeros), ``get_config``. Layers, variables and lists/dicts of them assigned as attributes are
    tracked: their weights are this layer's, their ``losses`` too.

    dnnbind's own layers implement ``forward``/``backward`` instead of ``call`` (see the module docstring).
    Multi-input layers of dnnbind (``Add``, ``Concatenate``...) set ``multi_input = True``: ``forward`` takes a
    list of arrays, ``backward`` returns one gradient per input.
    """

    #: True for dnnbind layers called on a list of inputs (see the class docstring)
    multi_input = False
    #: dnnbind's own layers whose forward is the same in training and inference (they run their training
    #: forward, which keeps what backward needs, when a tape needs their gradient in an inference call)
    _training_free = True
    # Set by a trainer for the length of one step (class defaults: no step running). _precast:
    # {Weight: its compute-dtype copy}; _keep_grad_dtype: leave weight gradients in the compute dtype.
    _precast: "dict | None" = None
    _keep_grad_dtype = False
    # {Weight: reads of its precast copy by keras.ops this step} (ops/_core._autocast_read), in the instance
    # __dict__ only while a step runs
    _precast_reads: "dict | None" = None
    # {Weight: compute dtype} of the weights _compute_weight has cast (what a trainer precasts);
    # replaced, never mutated
    _cast_weights: dict = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """A user's ``build`` marks the layer built when it returns, called directly or from the first
        ``__call__`` (Keras 3's build wrapper): ``layer.build(shape); layer(x)`` builds once."""
        super().__init_subclass__(**kwargs)
        build = cls.__dict__.get("build")
        if build is None or getattr(build, "_marks_built", False) or cls.__module__.startswith("dnnbind."):
            return

        @functools.wraps(build)
        def built_build(self, *args: Any, **kw: Any) -> Any:
            out = build(self, *args, **kw)
            self.built = True
            return out

        built_build._marks_built = True  # type: ignore[attr-defined]
        cls.build = built_build

    def __init__(self, name: str | None = None, trainable: bool = True, dtype: Any = None,
                 input_shape: Sequence[int] | None = None, autocast: bool = True,
                 activity_regularizer: Any = None, **kwargs: Any) -> None:
        object.__setattr__(self, "_tracked", self.__dict__.get("_tracked", {}))
        batch_input_shape = kwargs.pop("batch_input_shape", None)
        input_dim = kwargs.pop("input_dim", None)
        # Keras's per-weight penalties and constraints (kernel_regularizer, bias_constraint, gamma_regularizer,
        # depthwise_regularizer...): attached to the weight of that name when it is made (_add_weight)
        policies = {k: kwargs.pop(k) for k in [k for k in kwargs if k.endswith(("_regularizer", "_constraint"))
                                                and k != "activity_regularizer"]}
        kwargs.pop("batch_size", None) if type(self).__name__ != "InputLayer" else None
        if kwargs:
            raise TypeError(f"{type(self).__name__}: unexpected keyword argument(s) {', '.join(sorted(kwargs))}")
        if name is not None and not isinstance(name, str):
            raise _validate.ArgumentTypeError(f"{type(self).__name__}: name must be a str, got {name!r}")
        self.name = name if name is not None else unique_name(_snake_case(type(self).__name__))
        owner = f"{type(self).__name__} '{self.name}'"
        self.__dict__["_trainable"] = _validate.boolean(trainable, "trainable", owner)
        self.autocast = _validate.boolean(autocast, "autocast", owner)
        if isinstance(dtype, Policy):
            self.dtype_policy = dtype
        elif dtype is None:
            self.dtype_policy = global_policy()
        else:
            name_ = dtype.get("config", {}).get("name") if isinstance(dtype, dict) else dtype
            self.dtype_policy = Policy(str(np.dtype(name_)) if not isinstance(name_, str) else name_)
        if batch_input_shape is not None:
            input_shape = _validate.shape(tuple(batch_input_shape)[1:], "batch_input_shape[1:]", owner)
        if input_dim is not None and input_shape is None:
            input_shape = (int(input_dim),)
        self._declared_input_shape = None if input_shape is None else _validate.shape(input_shape, "input_shape",
                                                                                      owner)
        self.built = False
        # (through __dict__: a model defines these as properties)
        self.__dict__["input_shape"] = None
        self.__dict__["output_shape"] = None
        self._weights: list[Weight] = []
        self.grads: dict[str, Any] = {}
        self._device: Device | None = None
        self._inbound_nodes: list = []
        self._own_losses: list = []
        self.activity_regularizer = None
        if activity_regularizer is not None:
            self.activity_regularizer = _regularizer(activity_regularizer)
        self._weight_policies: dict = {}
        self._set_weight_policies(**policies)
        self.supports_masking = False

    # ----- attribute tracking -------------------------------------------------------------------
    # A private name is never tracked. dnnbind's own layers write the fields their forward keeps for backward
    # (``_x``, ``_w``...) through ``self.__dict__``: a Python __setattr__ call per field per step adds up.
    def __setattr__(self, name: str, value: Any) -> None:
        if name[0] == "_":  # the hot path: private names are never tracked (see below)
            object.__setattr__(self, name, value)
            return
        d = self.__dict__
        tracked = d.get("_tracked")
        if name == "grads" or not isinstance(value, _TRACKABLE_TYPES):
            if tracked and name in tracked:
                del tracked[name]
                _bump_structure()
            object.__setattr__(self, name, value)
            return
        if tracked is None:
            tracked = {}
            object.__setattr__(self, "_tracked", tracked)
        if _trackable(value, self):
            tracked[name] = value
            _bump_structure()
        elif name in tracked:
            del tracked[name]
            _bump_structure()
        object.__setattr__(self, name, value)

    def __delattr__(self, name: str) -> None:
        if self.__dict__.get("_tracked", {}).pop(name, None) is not None:
            _bump_structure()
        object.__delattr__(self, name)

    def _tracked_values(self) -> list:
        """The current values of the tracked attributes (read from the instance: a state restored through
        ``__dict__`` is what counts)."""
        tracked = self.__dict__.get("_tracked")
        if not tracked:
            return []
        d = self.__dict__
        return [d[name] for name in tracked if name in d and _trackable(d[name], self)]

    def _sublayers(self) -> list["Layer"]:
        """The layers tracked as attributes (lists and dicts flattened), in assignment order, each once."""
        values = self._tracked_values()
        if not values:
            return []
        out: list = []
        for value in values:
            for v in _flatten_tracked(value):
                if isinstance(v, Layer) and v is not self and not any(v is o for o in out):
                    out.append(v)
        return out

    def _tracked_variables(self) -> list[Variable]:
        """Variables assigned as attributes that are not this layer's weights (``self.v = keras.Variable(...)``)."""
        values = self._tracked_values()
        if not values:
            return []
        own = {id(w) for w in self._weights}
        out: list = []
        for value in values:
            for v in _flatten_tracked(value):
                if isinstance(v, Variable) and id(v) not in own and not any(v is o for o in out):
                    out.append(v)
        return out

    @property
    def trainable(self) -> bool:
        return self.__dict__.get("_trainable", True)

    @trainable.setter
    def trainable(self, value: bool) -> None:
        """Keras 3: setting ``trainable`` sets it on every layer inside (a frozen model freezes its layers)."""
        value = bool(value)
        self.__dict__["_trainable"] = value
        _bump_structure()
        for layer in self._inner_layers():
            layer.trainable = value

    def _inner_layers(self) -> list:
        """The layers ``trainable`` propagates to (tracked sublayers; a model's own layers)."""
        return self._sublayers()

    # ----- device and dtypes ---------------------------------------------------------------
    @property
    def device(self) -> Device:
        if self._device is None:
            self._device = backend.default_device()
        return self._device

    def to(self, device: "str | Device") -> "Layer":
        """Move the weights (and every sublayer's) to ``device`` (explicit copies through the host)."""
        dev = backend.resolve_device(device)
        for layer in self._sublayers():
            layer.to(dev)
        if self._device is not None and dev == self._device:
            return self
        for w in self._weights + self._tracked_variables():
            host = backend.to_numpy(w.value)
            w.value = backend.asarray(host, device=dev)
        self._device = dev
        self.grads = {}
        self._on_device_change()
        return self

    def _on_device_change(self) -> None:
        """Hook for layers holding device state other than weights (dropout states...)."""

    @property
    def compute_dtype(self) -> str:
        return self.dtype_policy.compute_dtype

    @property
    def variable_dtype(self) -> str:
        return self.dtype_policy.variable_dtype

    @property
    def dtype(self) -> str:
        return self.variable_dtype

    def _effective_compute_dtype(self) -> np.dtype:
        """What the layer really computes in: the policy's dtype on a GPU, float32 on NumPy."""
        # memoised per (device kind, policy dtype): asked for every input and weight of every step
        key = (self.device.is_cuda, self.dtype_policy.compute_dtype)
        dt = _EFFECTIVE_DTYPES.get(key)
        if dt is None:
            if not key[0] and key[1] in ("float16", "bfloat16"):
                dt = np.dtype("float32")
            else:
                dt = _validate.normalize_dtype(key[1])
            _EFFECTIVE_DTYPES[key] = dt
        return dt

    def _cast_input(self, x: Any) -> Any:
        """Inputs are cast to the compute dtype (ints become floats, as Keras)."""
        want = self._effective_compute_dtype()
        if x.dtype != want:
            return kernels.cast(x, want)
        return x

    def _compute_weight(self, w: Weight) -> Any:
        """The weight in the compute dtype (a per-step cast from the float32 master copy).

        Inside a model's step the trainer has usually made every such copy already, with one
        multi-tensor cast before the forward (``_precast``: Weight -> copy, dropped when the step
        ends, so a copy never outlives the weights it was made from); otherwise this casts now
        and remembers that ``w`` is cast to that dtype, so that the next step's cast covers it."""
        want = self._effective_compute_dtype()
        if w.value.dtype != want:
            pre = self._precast
            if pre is not None:
                hit = pre.get(w)
                if hit is not None and hit.dtype == want:
                    return hit
            if self._cast_weights.get(w) != want:
                # copy-on-write: a trainer may be reading the dict (another thread's step)
                self._cast_weights = {**self._cast_weights, w: want}
                _note_new_cast()
            return kernels.cast(w.value, want)
        return w.value

    def _to_variable_dtype(self, g: Any, w: Weight) -> Any:
        """A weight gradient in the weight's dtype; unchanged while ``_keep_grad_dtype`` is set (a
        trainer step whose optimizer reads low-precision gradients itself: the update kernels
        convert each element exactly as this cast would, so the result is the same bits)."""
        if g.dtype != w.value.dtype and not self._keep_grad_dtype:
            return kernels.cast(g, w.value.dtype)
        return g

    # ----- weights --------------------------------------------------------------------------
    def _set_weight_policies(self, **arguments: Any) -> None:
        """Keep ``<weight>_regularizer`` / ``<weight>_constraint`` arguments (resolved, checked now)."""
        for key, value in arguments.items():
            if value is None:
                self._weight_policies.pop(key, None)
                continue
            self._weight_policies[key] = _regularizer(value) if key.endswith("_regularizer") else _constraint(value)

    def _policy_for(self, weight_name: str, kind: str) -> Any:
        """The regularizer or constraint (``kind``) the arguments give the weight ``weight_name``
        (``kernel_regularizer`` for ``kernel``, ``depthwise_regularizer`` for ``depthwise_kernel``)."""
        policies = self.__dict__.get("_weight_policies")
        if not policies:
            return None
        hit = policies.get(f"{weight_name}_{kind}")
        if hit is None and weight_name.endswith("_kernel"):
            hit = policies.get(f"{weight_name[:-len('_kernel')]}_{kind}")
        if hit is None and weight_name == "kernel":  # DepthwiseConv2D's kernel takes depthwise_regularizer
            hit = policies.get(f"depthwise_{kind}")
        return hit

    def add_weight(self, shape: Sequence[int] | None = None, initializer: Any = None, dtype: Any = None,
                   trainable: bool = True, autocast: bool = True, regularizer: Any = None, constraint: Any = None,
                   aggregation: str = "none", overwrite_with_gradient: bool = False,
                   name: str | None = None) -> Weight:
        """Keras 3's ``add_weight``: a variable of ``shape`` made by ``initializer`` (default
        ``"glorot_uniform"`` for floats, ``"zeros"`` otherwise), trainable or not, with an optional
        ``regularizer`` (its loss joins :attr:`losses`) and ``constraint`` (applied after each optimizer
        update)."""
        owner = f"{type(self).__name__} '{self.name}': add_weight"
        shape = () if shape is None else tuple(int(s) for s in shape)
        vdtype = _validate.normalize_dtype(dtype or self.variable_dtype, f"{owner}: dtype")
        if initializer is None:
            initializer = "glorot_uniform" if vdtype.kind == "f" or vdtype == _validate.BFLOAT16 else "zeros"
        if name is None:
            taken = {w.name for w in self._weights}
            name = "variable"
            k = 1
            while name in taken:
                name, k = f"variable_{k}", k + 1
        if overwrite_with_gradient:
            raise NotImplementedError(f"{owner}: overwrite_with_gradient=True (FP8 training scales) is not supported")
        w = self._add_weight(name, shape, initializer, trainable=trainable, dtype=vdtype)
        w._relayout_ok = True  # until an optimizer or a tape sees it (Variable.relayout: keras.ops.conv's kernels)
        w.autocast = bool(autocast)
        w.aggregation = aggregation
        if regularizer is not None:
            w.regularizer = _regularizer(regularizer)
        if constraint is not None:
            w.constraint = _constraint(constraint)
        return w

    add_variable = add_weight

    def _add_weight(self, name: str, shape: Sequence[int], initializer: Any = "zeros", trainable: bool = True,
                    to_internal: Callable | None = None, to_keras: Callable | None = None,
                    dtype: Any = None) -> Weight:
        """Create a weight from a Keras-layout initial value (dnnbind's layers: positional, with the
        internal layout's transforms)."""
        shape = tuple(int(s) for s in shape)
        vdtype = _validate.normalize_dtype(dtype or self.variable_dtype)
        self._check_weight_size(name, shape, vdtype)
        init = _init.get(initializer)
        host = np.asarray(init(shape, dtype=vdtype), dtype=vdtype)
        internal = np.asarray(to_internal(host) if to_internal else host, order="C")  # (ascontiguousarray makes 0-d 1-d)
        w = Weight(self, name, shape, backend.asarray(internal, device=self.device), trainable, to_internal, to_keras)
        w.regularizer = self._policy_for(name, "regularizer")
        w.constraint = self._policy_for(name, "constraint")
        self._weights.append(w)
        _bump_structure()
        _state_guard.note_weight(w)
        return w

    def _check_weight_size(self, name: str, shape: tuple[int, ...], dtype: np.dtype) -> None:
        """Refuse a weight that cannot fit (host memory for its initial value; device memory on CUDA)
        before anything is allocated, naming the layer, the shape and the bytes."""
        nbytes = math.prod(shape) * np.dtype(dtype).itemsize  # Python ints: no overflow
        total = None
        if self.device.is_cuda and nbytes > 2**30:
            # deferred: dnnbind.cuda loads cuda.bindings, needed only for large weights on CUDA
            from dnnbind import cuda

            total = cuda.CudaDevice(self.device.index).total_memory
        _validate.check_allocation(nbytes, f"weight '{name}' of shape {shape} ({np.dtype(dtype)})",
                                   f"{type(self).__name__} '{self.name}'", device_total=total,
                                   device=str(self.device))

    def _all_variables(self) -> list:
        """This layer's weights, then its tracked variables, then every sublayer's (each once)."""
        sub = self._sublayers()
        if not sub and not self.__dict__.get("_tracked"):
            return list(self._weights)
        out = list(self._weights) + self._tracked_variables()
        seen = {id(w) for w in out}
        for layer in sub:
            for w in layer._all_variables():
                if id(w) not in seen:
                    seen.add(id(w))
                    out.append(w)
        return out

    @property
    def weights(self) -> list[Weight]:
        """Trainable weights first, then the non-trainable ones (Keras order)."""
        return self.trainable_weights + self.non_trainable_weights

    @property
    def trainable_weights(self) -> list[Weight]:
        if not self.trainable:
            return []
        if not self.__dict__.get("_tracked"):
            return [w for w in self._weights if w.trainable]
        out = [w for w in self._weights + self._tracked_variables() if w.trainable]
        seen = {id(w) for w in out}
        for layer in self._sublayers():
            for w in layer.trainable_weights:
                if id(w) not in seen:
                    seen.add(id(w))
                    out.append(w)
        return out

    @property
    def non_trainable_weights(self) -> list[Weight]:
        if not self.trainable:
            return self._all_variables()
        trainable = {id(w) for w in self.trainable_weights}
        return [w for w in self._all_variables() if id(w) not in trainable]

    # Keras 3 names the same lists "variables"
    variables = property(lambda self: self._all_variables())
    trainable_variables = property(lambda self: self.trainable_weights)
    non_trainable_variables = property(lambda self: self.non_trainable_weights)

    def get_weights(self) -> list[np.ndarray]:
        """Host copies in Keras layouts and Keras order (creation order: e.g. kernel, bias)."""
        return [w.numpy() for w in self._all_variables()]

    def set_weights(self, weights: Sequence[Any]) -> None:
        """Set from Keras-layout arrays; the count, every shape and dtype are checked before anything changes."""
        if not self.built:
            raise ValueError(f"layer '{self.name}' is not built yet; call it on data or build it first")
        weights = list(weights)
        targets = self._all_variables()
        if len(weights) != len(targets):
            raise ValueError(
                f"layer '{self.name}' ({type(self).__name__}) expects {len(targets)} weight arrays "
                f"{[w.shape for w in targets]}, got {len(weights)}"
            )
        arrays = [w.checked(arr) for w, arr in zip(targets, weights)]
        for w, arr in zip(targets, arrays):
            w.assign(arr)

    def count_params(self) -> int:
        return int(sum(int(np.prod(w.shape)) for w in self._all_variables()))

    # ----- losses -------------------------------------------------------------------------
    def add_loss(self, loss: Any) -> None:
        """Keras's ``add_loss``: a scalar tensor (or a zero-argument callable returning one) added to the
        training loss; cleared at the start of each outermost call."""
        self._own_losses.append(loss)
        _LOSSES_ADDED[0] += 1

    def _clear_losses(self) -> None:
        self.__dict__["_own_losses"] = []
        for layer in self._sublayers():
            layer._clear_losses()

    @property
    def losses(self) -> list:
        """Keras 3's order: the losses added by ``add_loss`` and the activity regularizers in the last call
        (this layer's, then its sublayers'), then the regularization losses of :attr:`trainable_weights`
        (computed now, so they are differentiable under a tape)."""
        return self._added_losses() + [w.regularizer(w) for w in self.trainable_weights if w.regularizer is not None]

    def _added_losses(self) -> list:
        """The ``add_loss`` losses of the last call: this layer's, then its sublayers' (depth first)."""
        out = [item() if callable(item) and not isinstance(item, Tensor) else item
               for item in self.__dict__.get("_own_losses", [])]
        for layer in self._sublayers():
            out.extend(layer._added_losses())
        return out

    def _has_losses(self) -> bool:
        """Whether :attr:`losses` would give anything (cheap: nothing is computed)."""
        if self.__dict__.get("_own_losses") or self.activity_regularizer is not None:
            return True
        if self._tracked_variables() and any(w.regularizer is not None for w in self._tracked_variables()):
            return True
        if any(w.regularizer is not None for w in self._weights):
            return True
        return any(layer._has_losses() for layer in self._sublayers())

    # ----- build / call ---------------------------------------------------------------------
    def build(self, input_shape: Sequence[int]) -> None:
        """Create the weights for inputs of ``input_shape``."""
        self._set_built(input_shape)

    def _strip_batch(self, input_shape: Any) -> Any:
        """The shape(s) without a leading None: a tuple, or a list of tuples for a multi-input layer."""
        if self.multi_input:
            if not isinstance(input_shape, (list, tuple)) or not all(isinstance(s, (list, tuple))
                                                                     for s in input_shape):
                raise ValueError(f"{type(self).__name__} '{self.name}' takes a list of inputs; expected a list of "
                                 f"shapes, got {input_shape!r}")
            return [split_batch(s)[1] for s in input_shape]
        return split_batch(input_shape)[1]

    def _set_built(self, input_shape: Any) -> None:
        shape = self._strip_batch(input_shape) if input_shape is not None else None
        self.input_shape = shape
        if shape is not None and self._is_legacy():
            out = self._output_shape(shape)
            self.output_shape = tuple(out)
        self.built = True

    @classmethod
    def _is_legacy(cls) -> bool:
        """dnnbind's own kind of layer: a hand-written ``forward``/``backward`` and no ``call`` of its own."""
        legacy = cls.__dict__.get("_legacy_kind")
        if legacy is None:
            legacy = cls.forward is not Layer.forward and cls.call is Layer.call
            type.__setattr__(cls, "_legacy_kind", legacy)
        return legacy

    @classmethod
    def _builds_keras_shapes(cls) -> bool:
        """A ``build`` written against Keras's contract (shapes with the batch axis): a user's layer."""
        value = cls.__dict__.get("_keras_build_kind")
        if value is None:
            module = getattr(cls.build, "__module__", "") or ""
            value = not (module.startswith("dnnbind.") or module == "dnnbind")
            type.__setattr__(cls, "_keras_build_kind", value)
        return value

    def _ensure_built(self, input_shape: Any) -> None:
        """Build dnnbind's kind of layer for ``input_shape`` (no batch axis; a list for multi-input layers)."""
        shape = self._strip_batch(input_shape)
        if not self.built:
            owner = f"{type(self).__name__} '{self.name}'"
            for s in (shape if self.multi_input else [shape]):
                _validate.shape(s, "input shape", owner, allow_none=True)
            variable = any(d is None for s in (shape if self.multi_input else [shape]) for d in s)
            before = list(self._weights)
            try:
                if self._builds_keras_shapes() or variable:
                    # with the batch axis: a sample shape that starts with None (a variable length) is not
                    # read as batched (``split_batch`` strips one leading None)
                    self.build([(None, *s) for s in shape] if self.multi_input else (None, *shape))
                else:
                    self.build(shape)
                if self.input_shape is None and self.output_shape is None and self._is_legacy():
                    out_shape = tuple(self._output_shape(shape))
                else:
                    out_shape = None
            except TypeError as err:
                self._weights = before  # a failed build leaves no half-made weights behind
                if not variable:
                    raise
                raise ValueError(f"{owner}: needs every dimension of its input shape known, got (batch, "
                                 f"{', '.join(map(str, shape))}) ({err}); give the Input a fixed size on that "
                                 "axis (pad or crop the data to one length)") from None
            except BaseException:
                self._weights = before
                raise
            if not self.built:  # a subclass build that forgot the base call
                self._set_built(shape)
            if self.input_shape is None:
                self.input_shape = shape
                if out_shape is not None:
                    self.output_shape = out_shape
        elif self.multi_input:
            if self.input_shape is not None and (len(shape) != len(self.input_shape) or not all(
                    _fits(a, b) for a, b in zip(shape, self.input_shape))):
                raise ValueError(f"layer '{self.name}' ({type(self).__name__}) was built for inputs of shapes "
                                 f"{[(None, *s) for s in self.input_shape]}, got {[(None, *s) for s in shape]}")
        elif (self.input_shape is not None and tuple(shape) != tuple(self.input_shape) and self._is_legacy()
              and tuple(shape) == tuple(self.input_shape)[1:] and not self.__dict__.get("_called")):
            # built by hand with a Keras shape that has the batch axis (``layer.build(x.shape)``): what
            # Keras's build always means; the weights depend on the trailing axes only
            self.input_shape = tuple(shape)
            self.output_shape = tuple(self._output_shape(tuple(shape)))
        elif self.input_shape is not None and not _fits(shape, self.input_shape) and self._is_legacy():
            raise ValueError(
                f"layer '{self.name}' ({type(self).__name__}) expects inputs of shape (batch, "
                f"{', '.join(map(str, self.input_shape))}), got (batch, {', '.join(map(str, shape))})"
            )
        self.__dict__["_called"] = True  # the shape is settled (see the batch-axis case above)

    def _build_from_call(self, args: tuple, kwargs: dict) -> None:
        """Build a user's layer on its first call (Keras's ``_maybe_build``): ``build`` gets the shape of the
        first argument (with the batch axis), or, when its parameters are named ``<argument>_shape``, those."""
        if self.built:
            return
        owner = f"{type(self).__name__} '{self.name}'"
        cls = type(self)
        if cls.build is Layer.build:
            self.built = True
            return
        params = [p for p in inspect.signature(self.build).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        names = list(inspect.signature(self.call).parameters)
        shapes: list = []
        if len(params) <= 1:
            shapes = [_shape_structure(args[0] if args else next(iter(kwargs.values())))]
        else:
            bound = dict(zip(names, args))
            bound.update(kwargs)
            for p in params:
                arg = p.name[:-len("_shape")] if p.name.endswith("_shape") else None
                if arg in bound and bound[arg] is not None:
                    shapes.append(_shape_structure(bound[arg]))
                elif p.default is not p.empty:
                    break
                else:
                    raise ValueError(f"{owner}: build({', '.join(p.name for p in params)}) takes shapes named after "
                                     f"call's arguments ({', '.join(names)}); no argument '{arg}'")
        if getattr(_ctx, "tracing", 0):
            shapes = [_none_batch(s) for s in shapes]
        before = list(self._weights)
        try:
            self.build(*shapes)
        except BaseException:
            self._weights = before
            raise
        self.built = True
        if (not isinstance(getattr(type(self), "input_shape", None), property) and self.input_shape is None
                and shapes and isinstance(shapes[0], tuple)):
            self.input_shape = tuple(shapes[0][1:])

    def _output_shape(self, input_shape: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(input_shape)

    def compute_output_shape(self, input_shape: Sequence[Any]) -> Any:
        """Output shape for ``input_shape`` (Keras: with the batch axis; a leading ``None`` is kept, and a
        shape without it is taken as a sample shape). A user's layer that does not override this gets it by
        running ``call`` on zeros (:func:`.graph.output_spec`)."""
        if not self._is_legacy():
            spec = _graph_hooks.output_spec(self, (_graph_hooks.spec_from_shape(input_shape),), {})
            return _graph_hooks.shape_structure(spec)
        if self.multi_input:
            had_batch = bool(input_shape) and bool(input_shape[0]) and input_shape[0][0] is None
            out = tuple(self._output_shape(self._strip_batch(input_shape)))
            return (None, *out) if had_batch else out
        had_batch, shape = split_batch(input_shape)
        out = tuple(self._output_shape(shape))
        return (None, *out) if had_batch else out

    @property
    def input(self) -> Any:
        """Keras 3's ``Layer.input``: the symbolic input of the layer's first call in a functional graph (a
        list when that call took several)."""
        nodes = self.__dict__.get("_inbound_nodes")
        if not nodes:
            raise AttributeError(f"{type(self).__name__} '{self.name}' has never been called on symbolic inputs "
                                 "(keras.Input), so it has no input tensor")
        tensors = nodes[0].input_tensors
        return tensors[0] if len(tensors) == 1 else list(tensors)

    @property
    def output(self) -> Any:
        """Keras 3's ``Layer.output``: the symbolic output of the layer's first call in a functional graph (a
        list when that call gave several, as ``MILAttentionLayer``'s list of scores). A Sequential model's
        layers have one once the model's ``inputs``/``outputs`` were read."""
        if "_explicit_output" in self.__dict__:
            return self.__dict__["_explicit_output"]
        nodes = self.__dict__.get("_inbound_nodes")
        if not nodes:
            raise AttributeError(f"{type(self).__name__} '{self.name}' has never been called on symbolic inputs "
                                 "(keras.Input), so it has no output tensor")
        tensors = nodes[0].output_tensors
        return tensors[0] if len(tensors) == 1 else list(tensors)

    @output.setter
    def output(self, value: Any) -> None:
        self.__dict__["_explicit_output"] = value

    def compute_mask(self, inputs: Any, previous_mask: Any = None) -> Any:
        """Keras's mask propagation: layers that ``supports_masking`` pass the mask on, others drop it."""
        return previous_mask if self.supports_masking else None

    def forward(self, x: Any, training: bool = False) -> Any:
        raise NotImplementedError

    def backward(self, dy: Any, need_dx: bool = True) -> Any:
        """Gradient w.r.t. the last forward's input; fills ``self.grads`` (``need_dx=False`` may skip dx)."""
        raise NotImplementedError

    @property
    def has_final_softmax(self) -> bool:
        """True when the layer ends in a softmax over the last axis (the model may fuse it with the loss)."""
        return False

    def forward_logits(self, x: Any, training: bool = False) -> Any:
        """Forward without the final softmax (only when :attr:`has_final_softmax`); backward then takes
        the gradient w.r.t. these logits."""
        raise NotImplementedError(f"layer '{self.name}' has no final softmax to skip")

    def call(self, inputs: Any, training: Any = None, **kwargs: Any) -> Any:
        """The forward of a layer (Keras 3): override it, in ``keras.ops``. dnnbind's own layers run their
        hand-written forward here (so ``super().call(x)`` works in a subclass)."""
        if type(self).forward is not Layer.forward:
            return self._legacy_apply(inputs, bool(training) if training is not None else False)
        raise NotImplementedError(f"{type(self).__name__} '{self.name}' does not define call(inputs, ...)")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Call the layer (Keras 3): on symbolic tensors, record a node of the functional graph and return
        symbolic outputs (nothing is computed); on tensors/arrays, build on first use and compute.

        ``training``: explicit, else the enclosing call's (a model's ``training=True`` reaches every layer
        it calls), else the default of ``call``'s signature. While a tape records, the call is recorded."""
        if not args and "inputs" not in kwargs:
            raise TypeError(f"{type(self).__name__} '{self.name}': called without inputs")
        if not args:
            args = (kwargs.pop("inputs"),)
        if any(is_symbolic(a) for a in args) or any(is_symbolic(v) for v in kwargs.values()):
            return _graph_hooks.symbolic_call(self, args, kwargs)
        owner = f"{type(self).__name__} '{self.name}'"
        training = kwargs.pop("training", None)
        if training is not None and not isinstance(training, (bool, np.bool_)) and not hasattr(training, "dtype"):
            training = _validate.boolean(training, "training", f"{owner}: __call__")
        if training is None:
            training = _context_training()
        if self._is_legacy():
            inputs = args[0]
            if self.multi_input:
                if not isinstance(inputs, (list, tuple)) or not inputs:
                    raise _validate.ArgumentTypeError(f"{owner} takes a list of inputs, got {type(inputs).__name__}")
            elif isinstance(inputs, (list, tuple)) and len(args) == 1 and not _is_array(inputs):
                if len(inputs) == 1:
                    inputs = inputs[0]
                else:
                    raise _validate.ArgumentTypeError(f"{owner} takes one input, got a list of {len(inputs)}")
            kwargs.pop("mask", None)
            if kwargs or len(args) > 1:
                raise TypeError(f"{owner}: unexpected call arguments {sorted(kwargs) or len(args) - 1}")
            return self._legacy_apply(inputs, bool(training) if training is not None else False)
        return self._keras_call(args, kwargs, training)

    def _keras_call(self, args: tuple, kwargs: dict, training: Any) -> Any:
        """A call of a layer that defines ``call`` (a user's layer, a model)."""
        outermost = _context_depth() == 0
        if outermost:
            self._clear_losses()
        args = tuple(self._convert_inputs(a) for a in args)
        kwargs = {k: self._convert_inputs(v) if k != "mask" else v for k, v in kwargs.items()}
        spec = self.__dict__.get("input_spec")
        if spec is not None and args and isinstance(spec, (InputSpec, list, tuple)):
            assert_input_compatibility(spec, args[0], self.name)  # a layer's own input_spec (Keras's check)
        if not self.built:
            self._build_from_call(args, kwargs)
        call_params = self._call_parameters()
        if "training" in call_params or call_params.get("**"):
            if training is not None:
                kwargs["training"] = training
        mask = kwargs.get("mask")
        if mask is None and "mask" in call_params and args:
            found = getattr(args[0], "_keras_mask", None) if isinstance(args[0], Tensor) else None
            if found is not None:
                kwargs["mask"] = found
        elif "mask" not in call_params:
            kwargs.pop("mask", None)
        mixed = self.dtype_policy.compute_dtype != self.dtype_policy.variable_dtype and self.autocast
        # from its second call on, a layer's call may not create or assign state (_state_guard)
        with _state_guard.CallWatch(self, structure_version) if outermost else _NO_WATCH, _CallContext(training):
            if mixed:
                with _ops_core.autocast_scope(self._effective_compute_dtype()):
                    outputs = self.call(*args, **kwargs)
            else:
                outputs = self.call(*args, **kwargs)
        if self.activity_regularizer is not None:  # in every call, as Keras 3 (evaluate's loss has it too)
            for o in _flatten_tracked(outputs):
                if isinstance(o, Tensor):
                    self.add_loss(_ops.divide(self.activity_regularizer(o), float(o.shape[0]) if o.ndim else 1.0))
        return outputs

    def _call_parameters(self) -> dict:
        cls = type(self)
        params = cls.__dict__.get("_call_params_memo")
        if params is None:
            sig = inspect.signature(cls.call)
            params = {name: p for name, p in sig.parameters.items() if name != "self"}
            params["**"] = any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values())
            type.__setattr__(cls, "_call_params_memo", params)
        return params

    def _convert_inputs(self, value: Any) -> Any:
        """Arrays (and nested lists/tuples/dicts of them) as tensors on this layer's device; float inputs in
        the compute dtype (Keras's autocast of inputs)."""
        if isinstance(value, (list, tuple)):
            return type(value)(self._convert_inputs(v) for v in value)
        if isinstance(value, dict):
            return {k: self._convert_inputs(v) for k, v in value.items()}
        if isinstance(value, Tensor):
            t = value
        elif isinstance(value, np.ndarray):
            if not value.flags.c_contiguous:  # a strided view (x[:, 0]): the kernels take C-contiguous arrays
                value = np.array(value, order="C")
            t = Tensor(backend.asarray(value, device=self.device) if self.device.is_cuda else value)
        elif backend.is_device_array(value):
            t = Tensor(value)
        else:
            return value
        if self.autocast and _ops_core.is_float(t.dtype):
            want = self._effective_compute_dtype()
            if t.dtype != want:
                t = _ops.cast(t, want)
        return t

    def _post_activation(self) -> "Callable | None":
        """An activation applied in ``keras.ops`` after the hand-written forward (one with no kernel of its
        own: see :class:`ActivationFn`), or None."""
        return None

    # ----- dnnbind's own layers: one recorded node per call ------------------------------------------
    def _raw_input(self, x: Any) -> "tuple[Any, Tensor | None]":
        """``(raw array, the tensor it came from or None)`` for one input of a hand-written forward."""
        if isinstance(x, Tensor):
            return x.data, x
        if isinstance(x, Variable):
            t = _ops.convert_to_tensor(x)
            return t.data, t
        if not _is_array(x):
            x = np.asarray(x)
        if isinstance(x, np.ndarray) and self.device.is_cuda:
            x = backend.asarray(x, device=self.device)
        return x, None

    def _legacy_apply(self, inputs: Any, training: bool, logits: bool = False) -> Any:
        """Run the hand-written forward on ``inputs`` (then its ``keras.ops`` activation, if it has one, and its
        activity regularizer's loss, in every call as Keras 3)."""
        out = self._legacy_node(inputs, training, logits)
        post = self._post_activation()
        if post is not None and not logits:
            out = post(out)
        if self.activity_regularizer is not None:
            n = float(out.shape[0]) if out.ndim else 1.0
            self.add_loss(_ops.divide(self.activity_regularizer(out), n))
        return out

    def _legacy_node(self, inputs: Any, training: bool, logits: bool = False) -> Any:
        """Run the hand-written forward on ``inputs``; while a tape records and something needs a gradient,
        record one node whose VJP is the hand-written backward (state per application, as a shared layer
        needs: the previous application's state is snapshot before this forward overwrites it)."""
        items = list(inputs) if self.multi_input else [inputs]
        raws, tensors = [], []
        for x in items:
            r, t = self._raw_input(x)
            if r.ndim < 1:
                raise ValueError(f"layer '{self.name}' expects a batch of inputs, got a scalar")
            raws.append(r)
            tensors.append(t)
        shapes = [tuple(r.shape[1:]) for r in raws]
        self._ensure_built(shapes if self.multi_input else shapes[0])
        arg = raws if self.multi_input else raws[0]
        if not _engine.recording():
            out = self.forward_logits(arg, training=training) if logits else self.forward(arg, training=training)
            return out if isinstance(out, Tensor) else Tensor(out)
        weights = self.trainable_weights if self.trainable else []
        in_edges = tuple(None if t is None else _ops_core.edge(t) for t in tensors)
        w_edges = _trainable_edges(weights)
        if all(e is None for e in in_edges) and all(e is None for e in w_edges):
            out = self.forward_logits(arg, training=training) if logits else self.forward(arg, training=training)
            return Tensor(out)
        before = self._call_state()
        previous = self.__dict__.get("_last_saved")
        if previous is not None and not previous["done"]:
            # what the previous application left: restored for its backward (less the marker, which is
            # ``previous`` itself: kept in it, the snapshot would make a reference cycle)
            state, nested = before
            previous["state"] = ({k: v for k, v in state.items() if k != "_last_saved"}, nested)
        run_training = training or self._training_free
        out = self.forward_logits(arg, training=run_training) if logits else self.forward(arg, training=run_training)
        saved = {"state": None, "done": False}
        object.__setattr__(self, "_last_saved", saved)
        _pending().append((self, before, saved))
        n_in = len(items)
        multi = self.multi_input

        def vjp(node: Any, dy: Tensor) -> tuple:
            if saved["state"] is not None:
                self._restore_call_state(saved["state"])
            need_dx = any(node.needs_input_grad[:n_in])
            self.grads = {}
            dx = self.backward(dy.data, need_dx=need_dx)
            grads, self.grads = self.grads, {}
            saved["done"] = True
            dxs = list(dx) if multi and dx is not None else [dx] * (1 if not multi else n_in)
            if not need_dx:
                dxs = [None] * n_in
            return tuple(dxs) + tuple(grads.get(w.name) for w in weights)

        return _engine.record(out, in_edges + w_edges, vjp, f"{type(self).__name__} '{self.name}'",
                              once_differentiable=True)

    # ----- per-application state (shared layers) --------------------------------------------
    def _call_state(self) -> tuple[dict, dict]:
        """What a forward left on ``self`` (and on its :class:`ActivationFn` attributes) for backward:
        a shallow snapshot that :meth:`_restore_call_state` puts back before that application's backward."""
        d = self.__dict__
        # One C-level copy (this runs per layer per training step, so no more calls than needed); ``grads`` and
        # ``_last_saved`` are in it but never restored (see _restore_call_state).
        state = d.copy()
        # (the number of attributes, the names of the ActivationFn ones): found again when the count changes
        keys = state["_activation_keys"] if "_activation_keys" in state else None
        if keys is None or keys[0] != len(state):
            found = tuple(k for k, v in state.items() if isinstance(v, ActivationFn))
            keys = (len(state) + ("_activation_keys" not in state), found)  # (as the next copy will count)
            d["_activation_keys"] = state["_activation_keys"] = keys
        nested: dict = {}
        for key in keys[1]:
            fn = state[key] if key in state else None
            # (a linear ActivationFn keeps nothing: its state never changes)
            if (fn.__class__ is ActivationFn or isinstance(fn, ActivationFn)) and fn.kind is not None:
                nested[key] = fn.__dict__.copy()
        return state, nested

    def _restore_call_state(self, saved: tuple[dict, dict]) -> None:
        state, nested = saved
        d = self.__dict__
        # the gradients being filled and the marker of the latest application stay as they are
        kept = {key: d[key] for key in ("grads", "_last_saved") if key in d}
        d.update(state)
        d.update(kept)
        for key, attrs in nested.items():
            state[key].__dict__.update(attrs)

    # ----- config -------------------------------------------------------------------------
    def get_config(self) -> dict:
        config = {"name": self.name, "trainable": self.trainable, "dtype": self.dtype_policy.name}
        if self._declared_input_shape is not None:
            config["input_shape"] = list(self._declared_input_shape)
        for key, value in self.__dict__.get("_weight_policies", {}).items():
            config[key] = (_regularizers.serialize(value) if key.endswith("_regularizer")
                           else _constraints.serialize(value))
        if self.activity_regularizer is not None:
            config["activity_regularizer"] = _regularizers.serialize(self.activity_regularizer)
        return config

    @classmethod
    def from_config(cls, config: dict) -> "Layer":
        return cls(**config)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} name={self.name}, built={self.built}>"


def _trackable(value: Any, owner: Any) -> bool:
    if isinstance(value, (Layer, Variable)):
        return value is not owner
    if isinstance(value, (list, tuple)) and value:
        return all(_trackable(v, owner) for v in value)
    if isinstance(value, dict) and value:
        return all(_trackable(v, owner) for v in value.values())
    return False


def _flatten_tracked(value: Any) -> list:
    if isinstance(value, (list, tuple)):
        return [x for v in value for x in _flatten_tracked(v)]
    if isinstance(value, dict):
        return [x for v in value.values() for x in _flatten_tracked(v)]
    return [value]


def _shape_structure(value: Any) -> Any:
    """The Keras shape (with the batch axis) of a tensor, or the structure of shapes of a structure."""
    if isinstance(value, (list, tuple)):
        return [_shape_structure(v) for v in value]
    if isinstance(value, dict):
        return {k: _shape_structure(v) for k, v in value.items()}
    if hasattr(value, "shape"):
        return tuple(value.shape)
    return None


def _regularizer(value: Any) -> Any:
    """A regularizer from a name, a Keras config dict, an instance or a callable (``regularizers.get``)."""
    return _regularizers.get(value)


def _constraint(value: Any) -> Any:
    """A constraint from a name, a Keras config dict, an instance or a callable (``constraints.get``)."""
    return _constraints.get(value)


_TRACKABLE_TYPES = (Layer, Variable, list, tuple, dict)


class _GraphHooks:
    """Functions of ``.graph`` (above this file) that a Layer call needs, installed when it is imported."""

    symbolic_call: Callable = None  # type: ignore[assignment]
    output_spec: Callable = None  # type: ignore[assignment]
    spec_from_shape: Callable = None  # type: ignore[assignment]
    shape_structure: Callable = None  # type: ignore[assignment]


_graph_hooks = _GraphHooks()


# ----- activations -------------------------------------------------------------------------------
# Keras activation name -> (ops kind, alpha). "softmax"/"log_softmax" use kernels.softmax_* instead.
_ACTIVATIONS: dict[str, tuple[str | None, float | None]] = {
    "linear": (None, None),
    "relu": ("relu", None),
    "relu6": ("clipped_relu", 6.0),
    "sigmoid": ("sigmoid", None),
    "tanh": ("tanh", None),
    "elu": ("elu", 1.0),
    "gelu": ("gelu", None),
    "gelu_tanh": ("gelu_tanh", None),
    "swish": ("swish", None),
    "silu": ("swish", None),
    "leaky_relu": ("leaky_relu", 0.2),
    "softplus": ("softplus", None),
    "softmax": ("softmax", None),
    "log_softmax": ("log_softmax", None),
}


def activation_names() -> list[str]:
    return sorted(_ACTIVATIONS)


class ActivationFn:
    """A Keras activation by name, run through ``kernels.activation_*`` / ``kernels.softmax_*``.

    Keeps what its backward needs from the last forward.
    """

    def __init__(self, identifier: Any, alpha: float | None = None, owner: str = "") -> None:
        #: a Keras activation with no kernel of dnnbind's (``"selu"``, ``"mish"``, a user's function): the layer
        #: applies it with ``keras.ops`` after its hand-written forward (recorded on the tape)
        self.post: "Callable | None" = None
        if callable(identifier) and not isinstance(identifier, str):
            name = getattr(identifier, "__name__", None)
            if name in _ACTIVATIONS and _activations.ALL_OBJECTS_DICT.get(name) is identifier:
                identifier = name  # keras.activations.relu given as a function: its kernel path
            else:
                self.post = identifier
                identifier = None
        elif isinstance(identifier, dict):
            self.post = _activations.get(identifier)
            identifier = None
        key = "linear" if identifier is None else str(identifier).lower()
        if key not in _ACTIVATIONS:
            fn = _activations.ALL_OBJECTS_DICT.get(key)
            if fn is None:
                raise ValueError(
                    f"{owner + ': ' if owner else ''}unknown activation {identifier!r}; known: "
                    f"{', '.join(sorted(set(activation_names()) | set(_activations.ALL_OBJECTS_DICT)))}")
            self.post = fn
            key = "linear"
        self.name = key
        self.kind, default_alpha = _ACTIVATIONS[key]
        self.alpha = default_alpha if alpha is None else float(alpha)
        self._x = self._y = None

    @property
    def config(self) -> Any:
        """What a layer's config holds for this activation: its Keras name, or ``activations.serialize``'s."""
        return self.name if self.post is None else _activations.serialize(self.post)

    @property
    def is_identity(self) -> bool:
        return self.kind is None

    @property
    def is_softmax(self) -> bool:
        return self.kind == "softmax"

    def forward(self, x: Any, training: bool = False) -> Any:
        if self.kind is None:
            return x
        if self.kind in ("softmax", "log_softmax"):
            y = kernels.softmax_forward(x, log=self.kind == "log_softmax")
        else:
            y = kernels.activation_forward(x, self.kind, alpha=self.alpha)
        if training:
            self._x, self._y = x, y
        return y

    def remember(self, x: Any, y: Any) -> None:
        """Keep what :meth:`backward` needs when the forward ran fused into another op."""
        if self.kind is not None:
            self._x, self._y = x, y

    def backward(self, dy: Any) -> Any:
        if self.kind is None:
            return dy
        if self._y is None:
            raise RuntimeError("activation backward called without a training forward")
        if self.kind in ("softmax", "log_softmax"):
            dx = kernels.softmax_backward(dy, self._y, log=self.kind == "log_softmax")
        else:
            dx = kernels.activation_backward(dy, self._x, self._y, self.kind, alpha=self.alpha)
        self._x = self._y = None
        return dx
