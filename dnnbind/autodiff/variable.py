"""``dnnbind.Variable`` (``keras.Variable``): a named, mutable array that gradients flow to.

``value`` is the raw array the kernels use (on the variable's device, possibly in an internal layout
chosen for speed: a convolution kernel is stored KRSC); ``numpy()``/``assign()`` speak the Keras layout
(``shape``). In ``keras.ops`` a variable reads as a :class:`~dnnbind.autodiff.Tensor` of its Keras
layout (``_to_keras`` applied with tensor operations, so the read is differentiable), cast to the
compute dtype inside a layer whose policy asks for it (``autocast``). While a tape records, a read of a
trainable variable is a :class:`~dnnbind.autodiff.engine.Leaf` edge: its gradient is what
``tape.gradient(loss, [variable])`` returns.

Writes (``assign``, ``assign_add``, ``assign_sub``) go into the existing buffer, so its address stays
valid for optimizer state and captured CUDA graphs.
"""

from __future__ import annotations

import itertools
from typing import Any, Callable

import numpy as np

from .. import _validate, backend
from .. import initializers, kernels
from .engine import Leaf, hooks, stop_recording

__all__ = ["Variable"]

_auto_names = itertools.count()
_trainable_changes = [0]  # bumped by every trainable assignment: models keep weight lists until it moves


def trainable_changes() -> int:
    return _trainable_changes[0]


# Bumped whenever a layer starts casting one of its weights to a compute dtype (next() on a count is
# atomic): trainers precast those weights once per step and rebuild their list when this moved.
_cast_counter = itertools.count(1)
_cast_generation = [0]


def note_new_cast() -> None:
    _cast_generation[0] = next(_cast_counter)


def cast_generation() -> int:
    """Changes whenever some layer starts casting a weight (``Layer._compute_weight``, or an ops read
    under autocast)."""
    return _cast_generation[0]


class Variable:
    """A variable (Keras 3's ``keras.Variable``).

    ``Variable(initializer, shape=None, dtype=None, trainable=True, autocast=True, aggregation="none",
    synchronization="auto", name=None)``: ``initializer`` is an array-like initial value, or an
    initializer (a name or a callable taking ``shape``, ``dtype``) with ``shape`` given."""

    # the layer-owned subclass (layers.base.Weight) fills these in its own constructor
    _to_internal: "Callable | None" = None
    _to_keras: "Callable | None" = None
    # A layer's add_weight sets _relayout_ok: until an optimizer or a tape has seen the variable, an op
    # that prefers another layout may move its storage there once (see relayout). _keras_perm: when the
    # Keras layout is a transpose of the internal one, its axes (reads register the view for peepholes).
    _relayout_ok: bool = False
    _keras_perm: "tuple | None" = None
    regularizer: Any = None
    constraint: Any = None

    def __init__(self, initializer: Any = None, shape: Any = None, dtype: Any = None, trainable: bool = True,
                 autocast: bool = True, aggregation: str = "none", synchronization: str = "auto",
                 name: "str | None" = None, device: Any = None) -> None:
        owner = "Variable"
        if name is not None and not isinstance(name, str):
            raise _validate.ArgumentTypeError(f"{owner}: name must be a str, got {name!r}")
        self.name = name if name is not None else f"variable_{next(_auto_names)}"
        self.trainable = _validate.boolean(trainable, "trainable", owner)
        self.autocast = _validate.boolean(autocast, "autocast", owner)
        self.aggregation = aggregation
        self.synchronization = synchronization
        value = self._initial_value(initializer, shape, dtype, owner)
        self.shape = tuple(int(s) for s in value.shape)
        self.value = value if backend.is_device_array(value) else backend.asarray(
            value if value.flags.c_contiguous else np.array(value, order="C"), device=device)
        self._leaf: "Leaf | None" = None

    @staticmethod
    def _initial_value(initializer: Any, shape: Any, dtype: Any, owner: str) -> Any:
        if callable(initializer) or isinstance(initializer, str):
            if shape is None:
                raise ValueError(f"{owner}: an initializer needs shape=, e.g. Variable('zeros', shape=(3,))")
            shape = tuple(int(s) for s in shape)
            dt = _validate.normalize_dtype(dtype or "float32", f"{owner}: dtype")
            return np.asarray(initializers.get(initializer)(shape, dtype=dt), dtype=dt)
        if initializer is None:
            raise ValueError(f"{owner}: needs an initial value or an initializer")
        raw = getattr(initializer, "data", initializer) if hasattr(initializer, "_node") else initializer
        if backend.is_device_array(raw):
            value = raw if dtype is None else kernels.cast(raw, _validate.normalize_dtype(dtype))
            return kernels.copy(value) if value is raw else value
        arr = np.asarray(raw)
        if dtype is not None:
            arr = arr.astype(_validate.normalize_dtype(dtype, f"{owner}: dtype"))
        elif arr.dtype == np.float64 and not isinstance(raw, np.ndarray):
            arr = arr.astype(np.float32)  # a Python float list: floatx, as Keras
        if shape is not None and tuple(arr.shape) != tuple(int(s) for s in shape):
            raise ValueError(f"{owner}: the initial value has shape {tuple(arr.shape)}, but shape={tuple(shape)}")
        return arr

    # ----- facts ----------------------------------------------------------------------------------
    @property
    def trainable(self) -> bool:
        return self.__dict__.get("_trainable", True)

    @trainable.setter
    def trainable(self, value: bool) -> None:
        self.__dict__["_trainable"] = bool(value)
        _trainable_changes[0] += 1

    @property
    def path(self) -> str:
        return self.name

    @property
    def dtype(self) -> np.dtype:
        return self.value.dtype

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def device(self) -> "backend.Device":
        return backend.device_of(self.value)

    def _leaf_node(self) -> Leaf:
        leaf = self._leaf
        if leaf is None:
            leaf = self._leaf = Leaf(self)
        return leaf

    # ----- host copies and writes ------------------------------------------------------------------
    def numpy(self) -> np.ndarray:
        """A host copy in the Keras layout (an explicit device-to-host transfer on a GPU)."""
        host = backend.to_numpy(self.value)
        if self._to_keras is not None:
            host = self._to_keras(host)
        return np.array(host, order="C", copy=True)

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        host = self.numpy()
        return host if dtype is None else host.astype(dtype)

    def checked(self, array: Any) -> np.ndarray:
        """``array`` as NumPy once it passes :meth:`assign`'s checks (numeric dtype, Keras shape); changes
        nothing."""
        arr = np.asarray(array)
        if arr.dtype.kind not in "fiub" and arr.dtype != _validate.BFLOAT16:
            raise TypeError(f"{self._owner()}: weight '{self.name}' must be numeric, got dtype {arr.dtype}")
        if tuple(arr.shape) != self.shape:
            raise ValueError(f"{self._owner()}: weight '{self.name}' expects shape {self.shape}, got "
                             f"{tuple(arr.shape)}")
        return arr

    def _owner(self) -> str:
        return f"Variable '{self.name}'"

    def assign(self, value: Any) -> "Variable":
        """Set from a Keras-layout value (a NumPy array, a Tensor or a DeviceArray of ``shape``), written
        into the existing buffer. A device value is copied on the device (stream-ordered, no wait)."""
        raw = getattr(value, "data", None) if hasattr(value, "_node") else value
        if raw is None:
            raw = value
        if isinstance(raw, Variable):
            raw = raw.value if raw._to_keras is None else raw.numpy()
        if hasattr(raw, "shape") and tuple(raw.shape) != self.shape and int(np.prod(raw.shape)) == 1 and \
                int(np.prod(self.shape)) == 1:
            raw = raw.reshape(*self.shape) if self.shape else raw.reshape(())
        if backend.is_device_array(raw) and backend.is_device_array(self.value):
            if tuple(raw.shape) != self.shape:
                raise ValueError(f"{self._owner()}: weight '{self.name}' expects shape {self.shape}, got "
                                 f"{tuple(raw.shape)}")
            if self._to_internal is not None:
                raw = self._internal_from_tensor(raw)
            if raw.dtype != self.value.dtype:
                raw = kernels.cast(raw, self.value.dtype)
            kernels.copy(raw.reshape(*self.value.shape), out=self.value)
            return self
        if backend.is_device_array(raw):
            raw = backend.to_numpy(raw)
        arr = self.checked(raw)
        internal = np.asarray(self._to_internal(arr.astype(self.value.dtype, copy=False))
                              if self._to_internal is not None else arr.astype(self.value.dtype), order="C")
        if backend.is_device_array(self.value):
            self.value.copy_from_host(internal)
        elif isinstance(self.value, np.ndarray):
            self.value[...] = internal
        else:
            self.value = backend.asarray(internal, device=self.device)
        return self

    def relayout(self, to_internal_perm: tuple) -> None:
        """Store the value transposed by ``to_internal_perm`` from now on (``value`` becomes that array;
        ``shape``, ``numpy()``, ``assign()`` and reads in ops keep speaking the Keras layout).

        ``keras.ops.conv`` calls it for a layer's fresh kernel, so the step convolves the stored filter
        with no transpose each way: allowed once, while ``_relayout_ok`` (no optimizer slot, captured
        graph or tape read holds the old array yet)."""
        if self._to_internal is not None or not self._relayout_ok:
            raise RuntimeError(f"{self._owner()}: variable '{self.name}' cannot change its layout now")
        perm = tuple(int(a) for a in to_internal_perm)
        back = tuple(perm.index(i) for i in range(len(perm)))
        ops = hooks.ops
        with stop_recording():
            moved = ops.convert_to_tensor(ops.transpose(ops.convert_to_tensor(self.value), perm)).data
        if isinstance(moved, np.ndarray):
            moved = np.ascontiguousarray(moved)
        self.value = moved
        self._to_internal = lambda a: a.transpose(*perm)
        self._to_keras = lambda a: a.transpose(*back)
        self._keras_perm = back
        self._relayout_ok = False

    def _internal_from_tensor(self, raw: Any) -> Any:
        """A Keras-layout device array in the internal layout (the internal transform written with array
        methods, applied on tensors)."""
        ops = hooks.ops
        return ops.convert_to_tensor(self._to_internal(ops.convert_to_tensor(raw))).data

    def assign_add(self, value: Any) -> "Variable":
        ops = hooks.ops
        return self.assign(ops.add(ops.convert_to_tensor(self), value))

    def assign_sub(self, value: Any) -> "Variable":
        ops = hooks.ops
        return self.assign(ops.subtract(ops.convert_to_tensor(self), value))

    def __repr__(self) -> str:
        return f"<Variable path={self.path}, shape={self.shape}, dtype={self.dtype.name}>"

    __hash__ = object.__hash__

    def __reduce__(self) -> Any:
        raise TypeError("dnnbind variables are not picklable; use model.save() or numpy()")
