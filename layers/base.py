"""The Layer contract, layer variables, activations shared by layers, and Input.

A layer computes only through :mod:`dnnbind.kernels`, so the same code runs on
NumPy arrays (CPU backend) and on :class:`dnnbind.cuda.DeviceArray` (cuDNN /
cuBLAS). Weights live on the layer's device in an internal layout chosen for
speed; ``get_weights``/``set_weights`` always speak Keras layouts.

Shapes given to :meth:`Layer.build` and :meth:`Layer.compute_output_shape` are
Keras shapes *without* the batch axis (DESIGN.md). A leading ``None`` (Keras's
batch placeholder, as in ``(None, 28, 28, 1)``) is accepted and kept.
"""

from __future__ import annotations

import itertools
import math
import re
from typing import Any, Callable, Sequence

import numpy as np

from dnnbind import _validate, backend, kernels
from dnnbind import initializers as _init
from dnnbind.backend import Device
from dnnbind.mixed_precision import Policy, global_policy

from .tape import active_tape

__all__ = ["Layer", "Weight", "InputLayer", "Input", "KerasTensor", "Node", "ActivationFn", "register", "deserialize",
           "get_layer_class", "is_symbolic"]

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


def split_batch(shape: Sequence[Any]) -> tuple[bool, tuple[int, ...]]:
    """``(had_batch_axis, shape_without_it)`` for a shape that may start with Keras's ``None``."""
    shape = tuple(shape)
    if shape and shape[0] is None:
        return True, tuple(int(s) for s in shape[1:])
    return False, tuple(int(s) for s in shape)


class Weight:
    """One layer variable.

    ``value`` is the array the ops use (on the layer's device, internal layout);
    ``numpy()`` / ``assign()`` convert from and to the Keras layout and ``shape``
    is the Keras shape. ``path`` (``"conv2d/kernel"``) names it in saved files.
    """

    def __init__(self, layer: "Layer", name: str, keras_shape: tuple[int, ...], value: Any, trainable: bool,
                 to_internal: Callable[[np.ndarray], np.ndarray] | None = None,
                 to_keras: Callable[[np.ndarray], np.ndarray] | None = None) -> None:
        self.layer = layer
        self.name = name
        self.shape = tuple(keras_shape)
        self.value = value
        self.trainable = trainable
        self._to_internal = to_internal or (lambda a: a)
        self._to_keras = to_keras or (lambda a: a)

    @property
    def path(self) -> str:
        return f"{self.layer.name}/{self.name}"

    @property
    def dtype(self) -> np.dtype:
        return self.value.dtype

    def numpy(self) -> np.ndarray:
        """A host copy in the Keras layout (an explicit device-to-host transfer on a GPU)."""
        # always a copy: on NumPy the value itself would otherwise leak out and change under training
        return np.array(self._to_keras(backend.to_numpy(self.value)), order="C", copy=True)

    def checked(self, array: Any) -> np.ndarray:
        """``array`` as NumPy once it passes :meth:`assign`'s checks (numeric dtype, Keras shape); changes nothing."""
        arr = np.asarray(array)
        if arr.dtype.kind not in "fiub" and arr.dtype != _validate.BFLOAT16:
            raise TypeError(f"layer '{self.layer.name}': weight '{self.name}' must be numeric, got dtype {arr.dtype}")
        if tuple(arr.shape) != self.shape:
            raise ValueError(
                f"layer '{self.layer.name}' ({type(self.layer).__name__}): weight '{self.name}' expects shape "
                f"{self.shape}, got {tuple(arr.shape)}"
            )
        return arr

    def assign(self, array: Any) -> None:
        """Set from a Keras-layout array, checking its dtype and shape (the error names the layer)."""
        arr = self.checked(array)
        internal = np.ascontiguousarray(self._to_internal(arr.astype(self.value.dtype, copy=False)))
        # Write into the existing buffer: its address stays valid for optimizer state and captured graphs.
        if backend.is_device_array(self.value):
            self.value.copy_from_host(internal)
        elif isinstance(self.value, np.ndarray):
            self.value[...] = internal
        else:
            self.value = backend.asarray(internal, device=self.layer.device)

    def __repr__(self) -> str:
        return f"<Weight path={self.path} shape={self.shape} dtype={self.dtype}>"


def _is_array(x: Any) -> bool:
    return isinstance(x, np.ndarray) or backend.is_device_array(x)


# ----- symbolic tensors (the functional API) -------------------------------------------------------
class KerasTensor:
    """A symbolic tensor (Keras's ``KerasTensor``): a shape with the batch axis (``None`` unless
    ``Input(batch_size=...)``), a dtype and the layer application that produced it
    (``_keras_history = (layer, node_index, tensor_index)``). It has no value: layers called on it
    record a :class:`Node` and return a new one; ``Model(inputs, outputs)`` turns the recorded graph
    into a model that runs on data."""

    def __init__(self, shape: Sequence[Any], dtype: Any = "float32", layer: "Layer | None" = None,
                 node_index: int = 0, tensor_index: int = 0, name: str | None = None) -> None:
        self.shape = tuple(None if s is None else int(s) for s in shape)
        self.dtype = str(np.dtype(dtype)) if not isinstance(dtype, str) else dtype
        self._keras_history = (layer, node_index, tensor_index)
        self.name = name if name is not None else (layer.name if layer is not None else "keras_tensor")

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def node(self) -> "Node":
        layer, node_index, _ = self._keras_history
        return layer._inbound_nodes[node_index]

    def __array__(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError(f"KerasTensor '{self.name}' {self.shape} is symbolic and has no value: build "
                        "keras.Model(inputs, outputs) from it and call the model on data; computations on "
                        "symbolic tensors must be layers (e.g. layers.Add()([a, b]) rather than a + b)")

    def __repr__(self) -> str:
        return f"<KerasTensor shape={self.shape}, dtype={self.dtype}, name={self.name}>"


class Node:
    """One application of a layer to symbolic tensors: ``layer``, ``input_tensors`` (in call order;
    a multi-input layer's list), ``output_tensors`` (one). Appended to ``layer._inbound_nodes``."""

    def __init__(self, layer: "Layer", input_tensors: Sequence[KerasTensor], output_shape: Sequence[Any],
                 dtype: Any) -> None:
        self.layer = layer
        self.input_tensors = list(input_tensors)
        self.index = len(layer._inbound_nodes)
        layer._inbound_nodes.append(self)
        self.output_tensors = [KerasTensor(output_shape, dtype, layer=layer, node_index=self.index,
                                           name=layer.name if self.index == 0 else f"{layer.name}_{self.index}")]

    @property
    def parent_nodes(self) -> list["Node"]:
        return [t.node for t in self.input_tensors]


def is_symbolic(x: Any) -> bool:
    """Whether ``x`` is a KerasTensor, or a non-empty list/tuple of them."""
    if isinstance(x, KerasTensor):
        return True
    return isinstance(x, (list, tuple)) and bool(x) and all(isinstance(t, KerasTensor) for t in x)


# (device is CUDA, policy compute dtype name) -> the dtype a layer computes in
_EFFECTIVE_DTYPES: "dict[tuple[bool, str], np.dtype]" = {}

# Bumped whenever a layer casts a weight it had not cast (to that dtype) before: trainers keep
# the list of weights they precast and rebuild it when this moved. next() on a count is atomic.
_cast_counter = itertools.count(1)
_cast_generation = [0]


def _note_new_cast() -> None:
    _cast_generation[0] = next(_cast_counter)


def cast_generation() -> int:
    """Changes whenever some layer starts casting a weight (see ``Layer._compute_weight``)."""
    return _cast_generation[0]


class Layer:
    """Base class of all layers (Keras 3 contract).

    Subclasses implement ``build(input_shape)`` (create weights with
    :meth:`add_weight`), ``forward(x, training)``, ``backward(dy) -> dx``
    (filling ``self.grads`` for each trainable weight, in variable dtype),
    ``compute_output_shape`` and ``get_config``.

    Multi-input layers (``Add``, ``Concatenate``...) set ``multi_input = True``: ``forward`` takes a
    list of arrays, ``backward`` returns one gradient per input (a list, same order; None entries
    allowed with ``need_dx=False``), and ``build``/``compute_output_shape``/``_output_shape`` take a
    list of shapes. A layer keeps what its backward needs on ``self`` (or on an
    :class:`ActivationFn` attribute): models applying it several times save and restore that state
    per application (:meth:`_call_state`).
    """

    #: True for layers called on a list of inputs (see the class docstring)
    multi_input = False
    # Set by a trainer for the length of one step (class defaults: no step running). _precast:
    # {Weight: its compute-dtype copy}; _keep_grad_dtype: leave weight gradients in the compute dtype.
    _precast: "dict | None" = None
    _keep_grad_dtype = False
    # {Weight: compute dtype} of the weights _compute_weight has cast (what a trainer precasts);
    # replaced, never mutated
    _cast_weights: dict = {}

    def __init__(self, name: str | None = None, trainable: bool = True, dtype: Any = None,
                 input_shape: Sequence[int] | None = None, **kwargs: Any) -> None:
        batch_input_shape = kwargs.pop("batch_input_shape", None)
        if kwargs:
            raise TypeError(f"{type(self).__name__}: unexpected keyword argument(s) {', '.join(sorted(kwargs))}")
        if name is not None and not isinstance(name, str):
            raise _validate.ArgumentTypeError(f"{type(self).__name__}: name must be a str, got {name!r}")
        self.name = name if name is not None else unique_name(_snake_case(type(self).__name__))
        owner = f"{type(self).__name__} '{self.name}'"
        self.trainable = _validate.boolean(trainable, "trainable", owner)
        if isinstance(dtype, Policy):
            self.dtype_policy = dtype
        elif dtype is None:
            self.dtype_policy = global_policy()
        else:
            self.dtype_policy = Policy(str(np.dtype(dtype)) if not isinstance(dtype, str) else dtype)
        if batch_input_shape is not None:
            input_shape = _validate.shape(tuple(batch_input_shape)[1:], "batch_input_shape[1:]", owner)
        self._declared_input_shape = None if input_shape is None else _validate.shape(input_shape, "input_shape",
                                                                                      owner)
        self.built = False
        self.input_shape: tuple[int, ...] | None = None
        self.output_shape: tuple[int, ...] | None = None
        self._weights: list[Weight] = []
        self.grads: dict[str, Any] = {}
        self._device: Device | None = None
        self._inbound_nodes: list[Node] = []

    # ----- device and dtypes ---------------------------------------------------------------
    @property
    def device(self) -> Device:
        if self._device is None:
            self._device = backend.default_device()
        return self._device

    def to(self, device: "str | Device") -> "Layer":
        """Move the weights to ``device`` (explicit copies through the host)."""
        dev = backend.resolve_device(device)
        if self._device is not None and dev == self._device:
            return self
        for w in self._weights:
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
    def add_weight(self, name: str, shape: Sequence[int], initializer: Any = "zeros", trainable: bool = True,
                   to_internal: Callable | None = None, to_keras: Callable | None = None,
                   dtype: Any = None) -> Weight:
        """Create a weight from a Keras-layout initial value; returns the :class:`Weight`."""
        shape = tuple(int(s) for s in shape)
        vdtype = _validate.normalize_dtype(dtype or self.variable_dtype)
        self._check_weight_size(name, shape, vdtype)
        init = _init.get(initializer)
        host = np.asarray(init(shape, dtype=vdtype), dtype=vdtype)
        internal = np.ascontiguousarray(to_internal(host) if to_internal else host)
        w = Weight(self, name, shape, backend.asarray(internal, device=self.device), trainable, to_internal, to_keras)
        self._weights.append(w)
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

    @property
    def weights(self) -> list[Weight]:
        """Trainable weights first, then the non-trainable ones (Keras order)."""
        return self.trainable_weights + self.non_trainable_weights

    @property
    def trainable_weights(self) -> list[Weight]:
        if not self.trainable:
            return []
        return [w for w in self._weights if w.trainable]

    @property
    def non_trainable_weights(self) -> list[Weight]:
        if not self.trainable:
            return list(self._weights)
        return [w for w in self._weights if not w.trainable]

    def get_weights(self) -> list[np.ndarray]:
        """Host copies in Keras layouts and Keras order (creation order: e.g. kernel, bias)."""
        return [w.numpy() for w in self._weights]

    def set_weights(self, weights: Sequence[Any]) -> None:
        """Set from Keras-layout arrays; the count, every shape and dtype are checked before anything changes."""
        if not self.built:
            raise ValueError(f"layer '{self.name}' is not built yet; call it on data or build it first")
        weights = list(weights)
        if len(weights) != len(self._weights):
            raise ValueError(
                f"layer '{self.name}' ({type(self).__name__}) expects {len(self._weights)} weight arrays "
                f"{[w.shape for w in self._weights]}, got {len(weights)}"
            )
        arrays = [w.checked(arr) for w, arr in zip(self._weights, weights)]
        for w, arr in zip(self._weights, arrays):
            w.assign(arr)

    def count_params(self) -> int:
        return int(sum(int(np.prod(w.shape)) for w in self._weights))

    # ----- build / call ---------------------------------------------------------------------
    def build(self, input_shape: Sequence[int]) -> None:
        """Create the weights for inputs of ``input_shape`` (no batch axis)."""
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
        shape = self._strip_batch(input_shape)
        self.input_shape = shape
        out = self._output_shape(shape)
        self.output_shape = tuple(out)
        self.built = True

    def _ensure_built(self, input_shape: Any) -> None:
        shape = self._strip_batch(input_shape)
        if not self.built:
            owner = f"{type(self).__name__} '{self.name}'"
            for s in (shape if self.multi_input else [shape]):
                _validate.shape(s, "input shape", owner)
            before = list(self._weights)
            try:
                self.build(shape)
            except BaseException:
                self._weights = before  # a failed build leaves no half-made weights behind
                raise
            if not self.built:  # a subclass build that forgot the base call
                self._set_built(shape)
        elif self.multi_input:
            if [tuple(s) for s in shape] != [tuple(s) for s in self.input_shape]:
                raise ValueError(f"layer '{self.name}' ({type(self).__name__}) was built for inputs of shapes "
                                 f"{[(None, *s) for s in self.input_shape]}, got {[(None, *s) for s in shape]}")
        elif tuple(shape) != tuple(self.input_shape):
            raise ValueError(
                f"layer '{self.name}' ({type(self).__name__}) expects inputs of shape (batch, "
                f"{', '.join(map(str, self.input_shape))}), got (batch, {', '.join(map(str, shape))})"
            )

    def _output_shape(self, input_shape: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(input_shape)

    def compute_output_shape(self, input_shape: Sequence[Any]) -> tuple:
        """Output shape for ``input_shape`` (no batch axis; a leading ``None`` is kept). A multi-input
        layer takes a list of shapes (the batch axis is kept when the first has it)."""
        if self.multi_input:
            had_batch = bool(input_shape) and bool(input_shape[0]) and input_shape[0][0] is None
            out = tuple(self._output_shape(self._strip_batch(input_shape)))
            return (None, *out) if had_batch else out
        had_batch, shape = split_batch(input_shape)
        out = tuple(self._output_shape(shape))
        return (None, *out) if had_batch else out

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

    def __call__(self, x: Any, training: bool | None = None) -> Any:
        """Call the layer (a multi-input layer on a list).

        * On :class:`KerasTensor` s (from ``keras.Input``): builds the layer for their shapes, records a
          :class:`Node` and returns a new KerasTensor (the functional API); nothing is computed.
        * On arrays (NumPy or DeviceArray): builds the layer on first use and computes eagerly. Inside a
          model's training step (an active :class:`~dnnbind.layers.tape.Tape`) the application is
          recorded for the backward pass; ``training=None`` then means the step's mode (else False).
        """
        owner = f"{type(self).__name__} '{self.name}'"
        if self.multi_input:
            if not isinstance(x, (list, tuple)) or not x:
                raise _validate.ArgumentTypeError(f"{owner} takes a list of inputs, got {type(x).__name__}")
            items = list(x)
        else:
            if isinstance(x, (list, tuple)) and x and all(isinstance(t, KerasTensor) for t in x):
                raise _validate.ArgumentTypeError(f"{owner} takes one input, got a list of {len(x)}")
            items = [x]
        if training is not None:
            training = _validate.boolean(training, "training", f"{owner}: __call__")
        kinds = {isinstance(t, KerasTensor) for t in items}
        if kinds == {True}:
            return self._symbolic_call(items)
        if True in kinds:
            raise _validate.ArgumentTypeError(f"{owner}: inputs mix symbolic tensors (keras.Input) and arrays")
        arrays = []
        for t in items:
            if not _is_array(t):
                t = np.asarray(t)
            if isinstance(t, np.ndarray) and self.device.is_cuda:
                t = backend.asarray(t, device=self.device)
            if t.ndim < 1:
                raise ValueError(f"layer '{self.name}' expects a batch of inputs, got a scalar")
            arrays.append(t)
        shapes = [tuple(t.shape[1:]) for t in arrays]
        self._ensure_built(shapes if self.multi_input else shapes[0])
        inputs = arrays if self.multi_input else arrays[0]
        tape = active_tape()
        if tape is not None:
            return tape.run(self, inputs, training)
        return self.forward(inputs, training=bool(training))

    def _symbolic_call(self, tensors: list[KerasTensor]) -> KerasTensor:
        shapes = [t.shape for t in tensors]
        for t in tensors:
            if t.ndim < 1:
                raise ValueError(f"layer '{self.name}' expects a batch of inputs, got a symbolic scalar")
        self._ensure_built(shapes if self.multi_input else shapes[0])
        out_shape = self.compute_output_shape(shapes if self.multi_input else shapes[0])
        batch = tensors[0].shape[0]
        out_shape = (batch, *tuple(out_shape)[1:])
        node = Node(self, tensors, out_shape, self._effective_compute_dtype_name())
        return node.output_tensors[0]

    def _effective_compute_dtype_name(self) -> str:
        return str(np.dtype(_validate.normalize_dtype(self.compute_dtype)))

    # ----- per-application state (shared layers) --------------------------------------------
    def _call_state(self) -> tuple[dict, dict]:
        """What a forward left on ``self`` (and on its :class:`ActivationFn` attributes) for backward:
        a shallow snapshot that :meth:`_restore_call_state` puts back before that application's backward."""
        state = {k: v for k, v in self.__dict__.items() if k != "grads"}
        nested = {k: dict(v.__dict__) for k, v in state.items() if isinstance(v, ActivationFn)}
        return state, nested

    def _restore_call_state(self, saved: tuple[dict, dict]) -> None:
        state, nested = saved
        self.__dict__.update(state)
        for key, attrs in nested.items():
            state[key].__dict__.update(attrs)

    # ----- config -------------------------------------------------------------------------
    def get_config(self) -> dict:
        config = {"name": self.name, "trainable": self.trainable, "dtype": self.dtype_policy.name}
        if self._declared_input_shape is not None:
            config["input_shape"] = list(self._declared_input_shape)
        return config

    @classmethod
    def from_config(cls, config: dict) -> "Layer":
        return cls(**config)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} name={self.name}, built={self.built}>"


@register
class InputLayer(Layer):
    """Declares the input shape of a model (Keras ``keras.Input``); computes nothing."""

    def __init__(self, shape: Sequence[int] | None = None, batch_size: int | None = None, dtype: Any = None,
                 name: str | None = None, **kwargs: Any) -> None:
        if shape is None:
            shape = kwargs.pop("input_shape", None)
        if shape is None:
            raise ValueError("Input: `shape` is required, e.g. Input(shape=(28, 28, 1))")
        shape = _validate.shape(shape, "shape", "Input")
        batch_size = _validate.optional_positive_int(batch_size, "batch_size", "Input")
        super().__init__(name=name if name is not None else unique_name("input_layer"), dtype=None, **kwargs)
        self.batch_size = batch_size
        self.input_dtype = "float32" if dtype is None else str(np.dtype(dtype))
        self._set_built(shape)
        node = Node(self, [], (batch_size, *shape), self.input_dtype)
        self.output = node.output_tensors[0]

    @property
    def shape(self) -> tuple:
        """Keras reports the batch axis too: ``(None, 28, 28, 1)``."""
        return (self.batch_size, *self.input_shape)

    def forward(self, x, training=False):
        return x

    def backward(self, dy, need_dx=True):
        return dy

    def get_config(self) -> dict:
        return {"shape": list(self.input_shape), "batch_size": self.batch_size, "dtype": self.input_dtype,
                "name": self.name}


def Input(shape: Sequence[int] | None = None, batch_size: int | None = None, dtype: Any = None,
          name: str | None = None) -> KerasTensor:
    """``keras.Input``: a symbolic tensor of ``shape`` (no batch axis; channels_last images are
    ``(H, W, C)``), the start of a functional model (``Model(inputs, outputs)``) or the first element
    of a ``Sequential``. Its ``shape`` has the batch axis: ``(None, *shape)``."""
    return InputLayer(shape=shape, batch_size=batch_size, dtype=dtype, name=name).output


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

    def __init__(self, identifier: "str | None", alpha: float | None = None, owner: str = "") -> None:
        key = "linear" if identifier is None else str(identifier).lower()
        if key not in _ACTIVATIONS:
            raise ValueError(
                f"{owner + ': ' if owner else ''}unknown activation {identifier!r}; known: "
                f"{', '.join(activation_names())}"
            )
        self.name = key
        self.kind, default_alpha = _ACTIVATIONS[key]
        self.alpha = default_alpha if alpha is None else float(alpha)
        self._x = self._y = None

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
